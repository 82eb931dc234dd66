#!/usr/bin/env python3
"""strata benchmarks against qemu-nbd, driven by the same fio in the same run.

Every figure is a ratio against a peer measured minutes apart on the same
machine, never an absolute threshold. Usage:

    bench/bench.py [--quick] [--out bench/results.json] [--only CASE,...]

Cases (issue #2 targets in brackets):
  depth       4k randread, data spread over 32 snapshot levels vs none  [>= 0.95]
              and qcow2 with a 12-deep backing chain vs qcow2 alone (the peer's cost)
  randwrite   4k randwrite on an empty thin disk vs qemu-nbd raw sparse [>= 1.0]
  randread    4k randread on a full disk vs qemu-nbd raw                [>= 0.95]
  seqwrite    512k sequential write, empty thin vs qemu-nbd raw         [>= 0.9]
  snaptime    snapshot create / linked clone / snapshot delete time at two data sizes
  rss         server RSS after writing and reading a large disk         [<= 256 MiB at 64 GiB]
  bigread     64k and 1M sequential reads of a half-written disk vs qemu-nbd raw
  ckpt        4k randwrite latency percentiles while checkpoints run (small
              metadata cache), with the number of checkpoints, vs qemu-nbd raw
  zeroing     seed 001's zeroing phase: 4k first-write IOPS and nb/tbz over time for
              thin / zeroedthick / eagerzeroedthick vs raw sparse / falloc / full under
              qemu-nbd; eagerzeroedthick create time vs the device's direct write rate
  zerodetect  4k randwrite of random data, zero detection on vs off      [>= 0.97]
  spacework   64k randwrite while convert fills (-> eagerzeroedthick) or scans
              (-> thin, punchzero) another disk, vs nothing running     [>= 0.8]
  reclaim     64k randwrite to an empty thin disk while a removed 2 GiB disk
              is reclaimed vs the same with nothing reclaiming            [>= 0.8]
              (same server, same run), and how long the reclaim took
  stats       4k randread with per-disk statistics recording vs paused  [>= 0.98]
              (one fio run, recording flipped every 2 s; plus the in-process
              cost of recording one command and its share of server CPU per I/O)

  multihost   issue 12: a disk on an object-store datastore (SeaweedFS on loopback)
              vs the same disk local: warm 4k randread [>= 0.9], 4k randwrite with a
              FLUSH every 64 writes (FLUSH latency percentiles), 512k seqwrite, and a
              cold start (cache deleted): time to first byte and to 90% of warm IOPS

  move        issue 13: strata move of a served, full disk (2 GiB; quick 256 MiB) to
              another local datastore, idle and under 4k random writes: time loaded vs
              idle, the switch's pause and the longest write latency during the move vs
              without, client IOPS during the move vs without [>= 0.7]

  claims      issue 25: create-only writes of one key by 2, 8 and 32 racers at once
              (hosts racing to claim a disk), SeaweedFS on loopback: p50/p99/max ms

Paper suites (figures, no targets; each cell also measured on the peer):
  matrix      SEsparse Iometer matrix: 4k/64k/512k x seq/rand x read/write on
              thin, zeroedthick, eagerzeroedthick and delta disks, empty and
              full, vs qemu-nbd raw (and qcow2 in full mode)
  chain       4k randread/randwrite vs snapshot depth 0..N (quick 4, full 32),
              then after deleting snapshots oldest first; vs a qcow2 backing chain
  clone       strata clone --full time vs the source's snapshot count, vs
              qemu-img convert -O qcow2 of a chain of the same depth
  fragmentation  issue 10 / seed 004: fragments of a sequentially written disk and
              of one overwritten at random after snapshots; cold sequential and
              copy-like reads with latency/seek histograms before and after defrag
              vs the sequential disk [>= 0.9]; client writes during defrag [>= 0.8];
              placement vs arrival order: fragments after random first writes,
              overwrites, a diverging clone, k disks growing together
              (fragmentation.svg)
  vdi         seed 000 figure 10: seSparse linked clones of a golden image made by a
              TCG guest, each desktop (a guest) installs and uninstalls files and
              trims; then online vmdk shrink of all clones: space per clone
              before/after, 4k randwrite IOPS and server CPU before, during and
              after the shrink; every clone fsck-clean with its files after

Besides --out (JSON), every run writes results.md and SVG plots (chain.svg,
clone.svg, matrix.svg) next to it; --render JSON redraws them from a file.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from statistics import median

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATA = os.environ.get("STRATA", os.path.join(ROOT, "target/release/strata"))


def sh(*args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        # Say what the tool said: a bare exit status hides ENOSPC and friends.
        raise RuntimeError(f"{' '.join(map(str, args))} exited {r.returncode}:\n"
                           f"{(r.stderr or r.stdout)[-2000:]}")
    return r.stdout


def wait_path(p, timeout=30, proc=None):
    """Waits for path P; with PROC, fails as soon as that process exits."""
    t = time.time()
    while not os.path.exists(p):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{p} did not appear: {' '.join(proc.args)} exited {proc.returncode}")
        if time.time() - t > timeout:
            raise RuntimeError(f"{p} did not appear")
        time.sleep(0.02)


class Strata:
    def __init__(self, work, cache="128M", serve_args=()):
        # No background free-space consolidation: it would move data in
        # the middle of a measurement (cases that want it ask for it).
        self.serve_args = list(serve_args)
        if "--free-space-policy" not in self.serve_args:
            self.serve_args += ["--free-space-policy", "off"]
        self.ds = os.path.join(work, "ds")
        self.sock = os.path.join(work, "strata.sock")
        self.cache = cache
        self.proc = None
        if not os.path.exists(os.path.join(self.ds, "strata.super")):
            self.cli("init")

    def cli(self, *args):
        return sh(STRATA, "--datastore", self.ds, "--metadata-cache", self.cache, *args)

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        self.proc = subprocess.Popen(
            [STRATA, "--datastore", self.ds, "--metadata-cache", self.cache, "serve", "--nbd-unix", self.sock]
            + self.serve_args,
            stdout=subprocess.DEVNULL,
        )
        wait_path(self.sock, proc=self.proc)
        wait_path(os.path.join(self.ds, "control.sock"), proc=self.proc)
        return self

    def stop(self):
        if self.proc:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait()
            self.proc = None

    def uri(self, name):
        return f"nbd+unix:///{name}?socket={self.sock}"

    def cpu_seconds(self):
        """User + system CPU time of the server so far (exited threads included)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_peak_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0


class QemuNbd:
    def __init__(self, path, fmt, sock, cache="writeback", aio=None):
        self.path, self.fmt, self.sock = path, fmt, sock
        self.cache, self.aio = cache, aio
        self.proc = None

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        aio = [f"--aio={self.aio}"] if self.aio else []
        self.proc = subprocess.Popen(
            ["qemu-nbd", "-f", self.fmt, "-k", self.sock, "-x", "disk", "--discard=unmap",
             f"--cache={self.cache}", *aio, "-e", "8", "-t", self.path],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_path(self.sock)
        return self

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
            self.proc = None

    def uri(self, _name="disk"):
        return f"nbd+unix:///disk?socket={self.sock}"


def fio(uri, rw, bs, iodepth=16, runtime=None, size=None, extra=()):
    args = ["fio", "--name=b", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
            f"--iodepth={iodepth}", "--output-format=json", "--group_reporting"]
    if runtime:
        args += [f"--runtime={runtime}", "--time_based"]
    if size:
        args += [f"--size={size}"]
    args += list(extra)
    out = sh(*args)
    j = json.loads(out[out.index("{"):])
    job = j["jobs"][0]
    side = job["read"] if "read" in rw or rw == "randread" else job["write"]
    return {"iops": side["iops"], "bw_mib": side["bw_bytes"] / 2**20, "ios": side["total_ios"]}


def fio_file(path, rw, bs, runtime, iodepth=16):
    """fio on a file with libaio and O_DIRECT (the FUSE export), pinned to CPU 0."""
    out = sh("fio", "--name=b", f"--filename={path}", "--ioengine=libaio", "--direct=1",
             f"--rw={rw}", f"--bs={bs}", f"--iodepth={iodepth}", f"--runtime={runtime}",
             "--time_based", "--cpus_allowed=0", "--output-format=json", "--group_reporting")
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["read"] if "read" in rw else job["write"]
    return {"iops": side["iops"], "bw_mib": side["bw_bytes"] / 2**20, "ios": side["total_ios"]}


def fill(uri, size):
    fio(uri, "write", "1M", iodepth=8, size=size, extra=["--end_fsync=1"])


def ratio(a, b):
    return round(a / b, 3) if b else None


def case_depth(work, q):
    size_gib = 1 if q else 4
    size = f"{size_gib}G"
    rt = 8 if q else 20
    levels = 32
    res = {}
    s = Strata(os.path.join(work, "depth")).start()
    try:
        s.cli("create", "flat", "--size", size)
        s.cli("create", "deep", "--size", size)
        fill(s.uri("flat"), size)
        chunk = size_gib * 1024 // levels
        for i in range(levels):
            fio(s.uri("deep"), "write", "1M", iodepth=8, size=f"{chunk}M",
                extra=[f"--offset={i * chunk}M", "--end_fsync=1"])
            s.cli("snapshot", "create", "deep", f"s{i}")
        # Alternate the two and average, so warm-up and noise hit both alike.
        runs = {"flat": [], "deep": []}
        for _ in range(2):
            for name in ("flat", "deep"):
                runs[name].append(fio(s.uri(name), "randread", "4k", runtime=rt // 2)["iops"])
        flat = {"iops": sum(runs["flat"]) / 2}
        deep = {"iops": sum(runs["deep"]) / 2}
    finally:
        s.stop()
    res["strata_32_snapshots_vs_none"] = {"none_iops": flat["iops"], "deep_iops": deep["iops"],
                                          "ratio": ratio(deep["iops"], flat["iops"]), "target": ">= 0.95"}
    # The peer: qcow2 with a 12-deep backing chain, same data spread.
    d = os.path.join(work, "qcow")
    os.makedirs(d, exist_ok=True)
    base = os.path.join(d, "flat.qcow2")
    sh("qemu-img", "create", "-f", "qcow2", base, size)
    qn = QemuNbd(base, "qcow2", os.path.join(d, "q.sock")).start()
    try:
        fill(qn.uri(), size)
        qflat = fio(qn.uri(), "randread", "4k", runtime=rt)
    finally:
        qn.stop()
    depth = 12
    prev = os.path.join(d, "c0.qcow2")
    sh("qemu-img", "create", "-f", "qcow2", prev, size)
    chunk = size_gib * 1024 // (depth + 1)
    for i in range(depth + 1):
        if i > 0:
            nxt = os.path.join(d, f"c{i}.qcow2")
            sh("qemu-img", "create", "-f", "qcow2", "-b", prev, "-F", "qcow2", nxt)
            prev = nxt
        qn = QemuNbd(prev, "qcow2", os.path.join(d, "q.sock")).start()
        try:
            fio(qn.uri(), "write", "1M", iodepth=8, size=f"{chunk}M", extra=[f"--offset={i * chunk}M"])
        finally:
            qn.stop()
    qn = QemuNbd(prev, "qcow2", os.path.join(d, "q.sock")).start()
    try:
        qdeep = fio(qn.uri(), "randread", "4k", runtime=rt,
                    extra=[f"--size={chunk * (depth + 1)}M"])
    finally:
        qn.stop()
    res["qcow2_12_chain_vs_none"] = {"none_iops": qflat["iops"], "deep_iops": qdeep["iops"],
                                     "ratio": ratio(qdeep["iops"], qflat["iops"])}
    res["strata_deep_vs_qcow2_deep"] = {"ratio": ratio(deep["iops"], qdeep["iops"])}
    return res


def peer_raw(work, name, size):
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    f = os.path.join(d, "disk.raw")
    with open(f, "wb") as fh:
        fh.truncate(_bytes(size))
    return QemuNbd(f, "raw", os.path.join(d, "q.sock"))


def _bytes(s):
    n, u = int(s[:-1]), s[-1]
    return n << {"K": 10, "M": 20, "G": 30}[u]


def case_simple(work, q, rw, bs, full, target, iodepth=16):
    size = "1G" if q else "4G"
    rt = 8 if q else 20
    tag = f"{rw}_{bs}"
    s = Strata(os.path.join(work, "s_" + tag)).start()
    try:
        s.cli("create", "d", "--size", size)
        if full:
            fill(s.uri("d"), size)
        # Writes to an empty disk: one pass over it (first writes only).
        extra = [] if full else ["--size=" + size]
        mine = fio(s.uri("d"), rw, bs, iodepth=iodepth, runtime=None if extra else rt,
                   extra=extra)
    finally:
        s.stop()
    qn = peer_raw(work, "q_" + tag, size).start()
    try:
        if full:
            fill(qn.uri(), size)
        peer = fio(qn.uri(), rw, bs, iodepth=iodepth, runtime=None if extra else rt, extra=extra)
    finally:
        qn.stop()
    return {f"strata_vs_qemu_nbd_raw": {"strata_iops": mine["iops"], "qemu_iops": peer["iops"],
                                        "strata_mib_s": round(mine["bw_mib"], 1),
                                        "qemu_mib_s": round(peer["bw_mib"], 1),
                                        "ratio": ratio(mine["iops"], peer["iops"]), "target": target}}


def timed(f):
    t = time.perf_counter()
    f()
    return round((time.perf_counter() - t) * 1000, 2)


def case_snaptime(work, q):
    sizes = [1, 2] if q else [1, 8]
    out = {}
    s = Strata(os.path.join(work, "snaptime")).start()
    try:
        # The CLI's own start-up and round trip, to read the figures against.
        out["cli_round_trip_ms"] = min(timed(lambda: s.cli("status")) for _ in range(5))
        for g in sizes:
            name = f"d{g}"
            s.cli("create", name, "--size", f"{g}G")
            fill(s.uri(name), f"{g}G")
            out[f"{g}GiB"] = {
                "snapshot_create_ms": timed(lambda: s.cli("snapshot", "create", name, "s")),
                "linked_clone_ms": timed(lambda: s.cli("clone", f"{name}@s", f"{name}c")),
                "snapshot_delete_ms": timed(lambda: s.cli("snapshot", "delete", name, "s")),
            }
            # Consolidation: a snapshot whose every grain was overwritten since.
            s.cli("snapshot", "create", name, "u")
            fill(s.uri(name), f"{g}G")
            out[f"{g}GiB"]["delete_unique_snapshot_ms"] = timed(lambda: s.cli("snapshot", "delete", name, "u"))
            t = time.perf_counter()
            while json.loads(s.cli("status", "--json"))["reclaiming"]:
                time.sleep(0.05)
            out[f"{g}GiB"]["background_reclaim_s"] = round(time.perf_counter() - t, 2)
    finally:
        s.stop()
    return out


def case_rss(work, q):
    size = "8G" if q else "64G"
    s = Strata(os.path.join(work, "rss")).start()
    try:
        s.cli("create", "big", "--size", size)
        fill(s.uri("big"), size)
        fio(s.uri("big"), "randread", "4k", runtime=5 if q else 20)
        peak = s.rss_peak_kib()
    finally:
        s.stop()
    return {"disk": size, "rss_peak_mib": round(peak / 1024, 1), "target": "<= 256 MiB at 64G"}


def fio_lat(uri, rw, bs, iodepth, runtime, size):
    """fio with completion-latency percentiles (microseconds)."""
    args = ["fio", "--name=b", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
            f"--iodepth={iodepth}", "--output-format=json", "--group_reporting",
            f"--runtime={runtime}", "--time_based", f"--size={size}",
            "--randrepeat=0", "--percentile_list=50:99:99.9:99.99"]
    out = sh(*args)
    j = json.loads(out[out.index("{"):])
    side = j["jobs"][0]["write" if "write" in rw else "read"]
    pct = side["clat_ns"]["percentile"]
    us = lambda k: round(pct[k] / 1000, 1)
    return {"iops": round(side["iops"]), "p50_us": us("50.000000"), "p99_us": us("99.000000"),
            "p99_9_us": us("99.900000"), "p99_99_us": us("99.990000"),
            "max_us": round(side["clat_ns"]["max"] / 1000, 1)}


def case_bigread(work, q):
    """Large reads (issue 8 item 2: a read is one pass over the map): 64 KiB
    and 1 MiB sequential reads of a disk whose first half is written and
    second half is a hole, vs qemu-nbd raw with the same layout. Compare
    builds with STRATA=/path/to/strata."""
    size = "1G" if q else "4G"
    half = f"{_bytes(size) // 2 >> 20}M"
    rt = 8 if q else 20
    out = {"disk": size, "written": half}
    s = Strata(os.path.join(work, "bigread")).start()
    try:
        s.cli("create", "d", "--size", size)
        fill(s.uri("d"), half)
        for bs in ("64k", "1M"):
            out[f"strata_{bs}"] = fio(s.uri("d"), "read", bs, iodepth=8, runtime=rt)
    finally:
        s.stop()
    qn = peer_raw(work, "q_bigread", size).start()
    try:
        fill(qn.uri(), half)
        for bs in ("64k", "1M"):
            out[f"qemu_{bs}"] = fio(qn.uri(), "read", bs, iodepth=8, runtime=rt)
    finally:
        qn.stop()
    for bs in ("64k", "1M"):
        out[f"ratio_{bs}"] = ratio(out[f"strata_{bs}"]["iops"], out[f"qemu_{bs}"]["iops"])
    return out


def case_ckpt(work, q):
    """4k random-write latency while checkpoints run (issue 8 item 5).

    A small metadata cache (16 MiB) and random writes over a large thin disk
    dirty map and count pages fast, so checkpoints come every second or so;
    fio reports completion-latency percentiles, and `strata status` how
    many checkpoints ran during the job. The peer (qemu-nbd raw) runs the
    same job: its tail is what a block device without metadata costs.
    Compare builds with STRATA=/path/to/strata (before/after figures are in
    docs/PERFORMANCE.md)."""
    size = "4G" if q else "16G"
    rt = 10 if q else 40
    s = Strata(os.path.join(work, "ckpt"), cache="16M").start()
    try:
        s.cli("create", "d", "--size", size)
        before = json.loads(s.cli("status", "--json"))
        mine = fio_lat(s.uri("d"), "randwrite", "4k", 4, rt, size)
        after = json.loads(s.cli("status", "--json"))
    finally:
        s.stop()
    ran = after.get("checkpoints", 0) - before.get("checkpoints", 0) if "checkpoints" in after else None
    qn = peer_raw(work, "q_ckpt", size).start()
    try:
        peer = fio_lat(qn.uri(), "randwrite", "4k", 4, rt, size)
    finally:
        qn.stop()
    return {"disk": size, "runtime_s": rt, "checkpoints_during_job": ran, "strata": mine,
            "qemu_nbd_raw": peer, "p99_ratio": ratio(mine["p99_us"], peer["p99_us"]),
            "p99_9_ratio": ratio(mine["p99_9_us"], peer["p99_9_us"])}


def _dir_bytes(d):
    return sum(os.stat(os.path.join(d, f)).st_blocks * 512 for f in os.listdir(d)
               if os.path.isfile(os.path.join(d, f)))


def case_zeroing(work, q):
    """Seed 001's zeroing phase (issue 9): IOPS and nb/tbz over time while a
    new disk of each type is first written with 4k random writes, vs a raw
    image of the matching preallocation under qemu-nbd (thin ~ sparse,
    zeroedthick ~ falloc: unwritten extents, eagerzeroedthick ~ full: written
    zeros); and eagerzeroedthick creation time at several sizes against the
    device's sequential direct-write rate (the limit), with qemu-img create
    -o preallocation=full as the peer."""
    size = "2G" if q else "8G"
    windows, win_s = (8, 2) if q else (15, 4)
    out = {"params": {"size": size, "windows": windows, "window_s": win_s,
                      "workload": "4k randwrite iodepth 16"}}
    peers = {"thin": "off", "zeroedthick": "falloc", "eagerzeroedthick": "full"}
    for typ, prealloc in peers.items():
        s = Strata(os.path.join(work, "zeroing_" + typ)).start()
        series = []
        try:
            t = time.perf_counter()
            s.cli("create", "d", "--size", size, "--type", typ)
            create_s = round(time.perf_counter() - t, 2)
            for w in range(windows):
                r = fio(s.uri("d"), "randwrite", "4k", runtime=win_s, size=size,
                        extra=["--randrepeat=0"])
                i = json.loads(s.cli("info", "d", "--json"))
                series.append({"t_s": (w + 1) * win_s, "iops": round(r["iops"]), "nb": i["nb"],
                               "tbz": i["tbz"], "allocated_mib": i["allocated_bytes"] >> 20})
        finally:
            s.stop()
        d = os.path.join(work, "zeroing_q_" + typ)
        os.makedirs(d, exist_ok=True)
        f = os.path.join(d, "disk.raw")
        t = time.perf_counter()
        sh("qemu-img", "create", "-f", "raw", "-o", f"preallocation={prealloc}", f, size)
        peer_create_s = round(time.perf_counter() - t, 2)
        qn = QemuNbd(f, "raw", os.path.join(d, "q.sock")).start()
        peer = []
        try:
            for w in range(windows):
                r = fio(qn.uri(), "randwrite", "4k", runtime=win_s, size=size, extra=["--randrepeat=0"])
                peer.append({"t_s": (w + 1) * win_s, "iops": round(r["iops"])})
        finally:
            qn.stop()
            os.unlink(f)
        out[typ] = {"create_s": create_s, "windows": series,
                    f"qemu_raw_{prealloc}": {"create_s": peer_create_s, "windows": peer},
                    "first_window_ratio": ratio(series[0]["iops"], peer[0]["iops"]),
                    "last_window_ratio": ratio(series[-1]["iops"], peer[-1]["iops"])}
    # Eager creation against the device's sequential write rate.
    sizes = [1, 4] if q else [1, 4, 16]
    probe = os.path.join(work, "ddprobe")
    r = subprocess.run(["dd", "if=/dev/zero", f"of={probe}", "bs=1M", "count=1024",
                        "oflag=direct", "conv=fsync"], capture_output=True, text=True)
    m = [l for l in r.stderr.splitlines() if "copied" in l]
    t = float(m[-1].split(",")[-2].split()[0]) if m else None
    os.unlink(probe)
    dev_mib_s = round(1024 / t, 1) if t else None
    out["device_seq_direct_write_mib_s"] = dev_mib_s
    eager = {}
    s = Strata(os.path.join(work, "zeroing_create")).start()
    try:
        for g in sizes:
            t = time.perf_counter()
            s.cli("create", f"e{g}", "--size", f"{g}G", "--type", "eagerzeroedthick")
            took = time.perf_counter() - t
            s.cli("rm", f"e{g}")
            d = os.path.join(work, "zeroing_qcreate")
            os.makedirs(d, exist_ok=True)
            f = os.path.join(d, "e.raw")
            t = time.perf_counter()
            sh("qemu-img", "create", "-f", "raw", "-o", "preallocation=full", f, f"{g}G")
            sh("sync", f)
            qtook = time.perf_counter() - t
            os.unlink(f)
            eager[f"{g}GiB"] = {"strata_s": round(took, 2), "qemu_img_full_s": round(qtook, 2),
                                "device_limit_s": round(g * 1024 / dev_mib_s, 2) if dev_mib_s else None,
                                "strata_vs_limit": ratio(took, g * 1024 / dev_mib_s) if dev_mib_s else None}
    finally:
        s.stop()
    out["eager_create"] = eager
    return out


def case_zerodetect(work, q):
    """The cost of zero detection on writes that are not zeros (issue 9:
    >= 0.97): 4k random writes of random data to a thin disk, detection on
    vs off, alternating servers in the same run, median of the pairs."""
    size = "1G" if q else "4G"
    pairs, rt = (3, 6) if q else (5, 15)
    res = {"on": [], "off": []}
    for i in range(pairs):
        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
            d = os.path.join(work, f"zd_{mode}")
            shutil.rmtree(d, ignore_errors=True)
            s = Strata(d, serve_args=["--detect-zeroes", mode]).start()
            try:
                s.cli("create", "d", "--size", size)
                r = fio(s.uri("d"), "randwrite", "4k", runtime=rt, size=size,
                        extra=["--refill_buffers", "--randrepeat=0"])
                res[mode].append(round(r["iops"]))
            finally:
                s.stop()
    on, off = median(res["on"]), median(res["off"])
    return {"size": size, "runtime_s": rt, "iops_on": res["on"], "iops_off": res["off"],
            "ratio_on_vs_off": ratio(on, off), "target": ">= 0.97"}


def case_stats(work, q):
    """The throughput cost of per-disk statistics (issue #3: <= 2%).

    One long fio run (4k randread, iodepth 16) against one server, cut into
    blocks of two 2-second phases. In two blocks of three, one phase records
    and the other is paused (`strata stats d --resume/--pause`), in random
    order; in the third, both record: an A/A control that shows how far the
    method itself reads from 1.0 in the same run. fio logs IOPS per 250 ms
    window with wall-clock timestamps; windows inside a phase (not within
    150 ms of its start) count for it. The figure is the median over blocks
    of (mean IOPS recording / mean IOPS paused); the control's median is
    reported beside it. Random order keeps periodic work (writeback, the
    checkpointer) from lining up with one side. Paused, the wrapper loads one
    flag and forwards. With two or more CPUs the server runs on one and fio
    on another, so their threads do not trade places.

    Also measured: what recording one command costs in-process (the
    record_cost example), and that cost as a share of the server's CPU
    time per I/O over the same run.
    """
    size = smoke("256M", "1G" if q else "4G")
    total = smoke(12, 30 if q else 300)
    phase = 2.0
    rng = random.Random(2026)
    window_ms, margin_ms = 250, 150
    s = Strata(os.path.join(work, "st")).start()
    ncpu = os.cpu_count() or 1
    fio_pin = []
    if ncpu >= 2:
        os.sched_setaffinity(s.proc.pid, {ncpu - 1})
        for t in os.listdir(f"/proc/{s.proc.pid}/task"):
            os.sched_setaffinity(int(t), {ncpu - 1})
        fio_pin = ["taskset", "-c", "0"]
    log = os.path.join(work, "iops")
    flips = []
    try:
        s.cli("create", "d", "--size", size)
        fill(s.uri("d"), size)
        os.sync()
        fio(s.uri("d"), "randread", "4k", runtime=3)  # warm the caches
        s.cli("stats", "d", "--reset", "--resume")
        cpu0 = s.cpu_seconds()
        proc = subprocess.Popen(
            fio_pin + ["fio", "--name=b", "--ioengine=nbd", f"--uri={s.uri('d')}", "--rw=randread",
                       "--bs=4k", "--iodepth=16", "--output-format=json", f"--runtime={total}",
                       "--time_based", f"--write_iops_log={log}", f"--log_avg_msec={window_ms}",
                       "--log_unix_epoch=1"],
            stdout=subprocess.PIPE, text=True)
        # Each flip: (time, records?, block, kind); kind "ab" or "aa".
        block = 0
        while proc.poll() is None:
            kind = "aa" if block % 3 == 2 else "ab"
            modes = [True, False] if kind == "ab" else [True, True]
            rng.shuffle(modes)
            for on in modes:
                if proc.poll() is not None:
                    break
                s.cli("stats", "d", "--resume" if on else "--pause")
                flips.append((time.time() * 1000, on, block, kind))
                time.sleep(phase)
            block += 1
        out = proc.stdout.read()
        cpu = s.cpu_seconds() - cpu0
        if proc.returncode != 0:
            raise RuntimeError(f"fio failed: {out[-2000:]}")
        total_ios = json.loads(out[out.index("{"):])["jobs"][0]["read"]["total_ios"]
        recorded = json.loads(s.cli("stats", "d", "--json"))["d"]["read"]["commands"]
    finally:
        s.stop()
    # Recording phases count, paused ones do not: strictly between.
    if not 0 < recorded < total_ios:
        raise RuntimeError(f"recorded {recorded} of fio's {total_ios} reads")

    # Windows -> phases. fio stamps a window with its end.
    phases = [[] for _ in flips]
    with open(f"{log}_iops.1.log") as f:
        for line in f:
            end_ms, iops = (int(x) for x in line.split(",")[:2])
            start_ms = end_ms - window_ms
            for i, flip in enumerate(flips):
                nxt = flips[i + 1][0] if i + 1 < len(flips) else float("inf")
                if flip[0] + margin_ms <= start_ms and end_ms <= nxt:
                    phases[i].append(iops)
    blocks = {}
    for w, (_, on, b, kind) in zip(phases, flips):
        if w:
            blocks.setdefault((b, kind), []).append((sum(w) / len(w), on))
    ratios, control = [], []
    for (_, kind), ph in blocks.items():
        if len(ph) != 2:
            continue
        if kind == "ab":
            rec = [m for m, on in ph if on][0]
            paused = [m for m, on in ph if not on][0]
            ratios.append(rec / paused)
        else:
            control.append(ph[0][0] / ph[1][0])
    if not ratios or not control:
        raise RuntimeError("no complete blocks in fio's log")

    on_w = [x for w, f in zip(phases, flips) if f[1] and f[3] == "ab" for x in w]
    off_w = [x for w, f in zip(phases, flips) if not f[1] for x in w]
    cost = json.loads(sh("cargo", "run", "--release", "-q", "-p", "strata-stats",
                         "--example", "record_cost", "--", "--json", cwd=ROOT))
    cpu_ns_per_io = cpu / total_ios * 1e9
    quart = sorted(ratios)
    return {
        "fio_seconds": total, "phase_s": phase, "blocks": len(ratios),
        "control_blocks": len(control),
        "iops_recording_median_window": round(median(on_w)),
        "iops_paused_median_window": round(median(off_w)),
        "ratio": round(median(ratios), 3),
        "ratio_quartiles": [round(quart[len(quart) // 4], 3), round(quart[(3 * len(quart)) // 4], 3)],
        "control_ratio_aa": round(median(control), 3),
        "record_ns_per_command": cost["ns_per_command_1_thread"],
        "record_ns_per_command_2_threads": cost["ns_per_command_2_threads"],
        "server_cpu_ns_per_io": round(cpu_ns_per_io),
        "record_cpu_share": round(cost["ns_per_command_1_thread"] / cpu_ns_per_io, 4),
        "target": "ratio >= 0.98 (median over blocks, IOPS recording / paused)",
    }


# ---------------------------------------------------------------------------
# Paper suites: the SEsparse Iometer matrix, snapshot-chain depth, full clones.
# ---------------------------------------------------------------------------

MATRIX_TYPES = ["thin", "zeroedthick", "eagerzeroedthick", "delta"]
FIO_RW = {("seq", "read"): "read", ("seq", "write"): "write",
          ("rand", "read"): "randread", ("rand", "write"): "randwrite"}


def matrix_cells(q):
    """Cell names, e.g. '4k_rand_read', in table order."""
    bss = ["4k", "512k"] if q else ["4k", "64k", "512k"]
    return [f"{bs}_{pat}_{op}" for bs in bss for pat in ("seq", "rand") for op in ("read", "write")]


def run_cell(uri, cell, rt):
    bs, pat, op = cell.split("_")
    r = fio(uri, FIO_RW[(pat, op)], bs, iodepth=8 if bs == "512k" else 16, runtime=rt)
    return {"iops": round(r["iops"], 1), "mib_s": round(r["bw_mib"], 1)}


def _mkdisk(s, name, typ, size):
    """A strata disk of one of MATRIX_TYPES; 'delta' is a filled thin disk after a snapshot."""
    if typ == "delta":
        s.cli("create", name, "--size", size, "--type", "thin")
        fill(s.uri(name), size)
        s.cli("snapshot", "create", name, "base")
    else:
        s.cli("create", name, "--size", size, "--type", typ)


def matrix_strata(work, q, size, rt, cells):
    out = {}
    reads = [c for c in cells if c.endswith("_read")]
    writes = [c for c in cells if c.endswith("_write")]
    s = Strata(os.path.join(work, "strata")).start()
    try:
        n = 0
        for typ in MATRIX_TYPES:
            out[typ] = {"empty": {}, "full": {}}
            # Empty: reads on one fresh disk, each write cell on its own fresh disk.
            n += 1
            _mkdisk(s, f"m{n}", typ, size)
            for c in reads:
                out[typ]["empty"][c] = run_cell(s.uri(f"m{n}"), c, rt)
            s.cli("rm", f"m{n}")
            for c in writes:
                n += 1
                _mkdisk(s, f"m{n}", typ, size)
                out[typ]["empty"][c] = run_cell(s.uri(f"m{n}"), c, rt)
                s.cli("rm", f"m{n}")
            # Full: filled first (for delta: the delta itself filled too).
            n += 1
            _mkdisk(s, f"m{n}", typ, size)
            fill(s.uri(f"m{n}"), size)
            for c in cells:
                out[typ]["full"][c] = run_cell(s.uri(f"m{n}"), c, rt)
            s.cli("rm", f"m{n}")
            print(f"   strata {typ} done", flush=True)
    finally:
        s.stop()
    return out


def matrix_peer(work, fmt, size, rt, cells):
    d = os.path.join(work, fmt)
    os.makedirs(d, exist_ok=True)
    img = os.path.join(d, "disk." + fmt)
    sock = os.path.join(d, "q.sock")

    def fresh():
        if os.path.exists(img):
            os.unlink(img)
        if fmt == "raw":
            with open(img, "wb") as fh:
                fh.truncate(_bytes(size))
        else:
            sh("qemu-img", "create", "-f", fmt, img, size)
        return QemuNbd(img, fmt, sock).start()

    out = {"empty": {}, "full": {}}
    for c in cells:
        qn = fresh()
        try:
            out["empty"][c] = run_cell(qn.uri(), c, rt)
        finally:
            qn.stop()
    qn = fresh()
    try:
        fill(qn.uri(), size)
        for c in cells:
            out["full"][c] = run_cell(qn.uri(), c, rt)
    finally:
        qn.stop()
        os.unlink(img)
    print(f"   qemu-nbd {fmt} done", flush=True)
    return out


def case_matrix(work, q):
    size = smoke("64M", "256M" if q else "2G")
    rt = smoke(1, 2 if q else 10)
    cells = matrix_cells(q)
    peers = ["raw"] if q else ["raw", "qcow2"]
    res = {"params": {"size": size, "runtime_s": rt, "cells": cells, "types": MATRIX_TYPES,
                      "peers": peers, "iodepth": "16 (512k: 8)"}}
    res["strata"] = matrix_strata(work, q, size, rt, cells)
    res["peers"] = {p: matrix_peer(work, p, size, rt, cells) for p in peers}
    # Ratio of each strata cell to the same cell/state on each peer (IOPS).
    res["ratios"] = {p: {typ: {st: {c: ratio(res["strata"][typ][st][c]["iops"],
                                           res["peers"][p][st][c]["iops"]) for c in cells}
                               for st in ("empty", "full")} for typ in MATRIX_TYPES}
                     for p in peers}
    return res


def _measure_rw(uri, rt):
    r = fio(uri, "randread", "4k", runtime=rt)["iops"]
    w = fio(uri, "randwrite", "4k", runtime=rt)["iops"]
    return {"randread_iops": round(r, 1), "randwrite_iops": round(w, 1)}


def _fio_write_slice(uri, off_mib, len_mib):
    fio(uri, "write", "1M", iodepth=8, size=f"{len_mib}M", extra=[f"--offset={off_mib}M"])


def _qcow_chain_step(d, prev, i, size):
    """Create overlay c{i} on prev (or a fresh base if prev is None); returns its path."""
    nxt = os.path.join(d, f"c{i}.qcow2")
    if prev is None:
        sh("qemu-img", "create", "-f", "qcow2", nxt, size)
    else:
        sh("qemu-img", "create", "-f", "qcow2", "-b", prev, "-F", "qcow2", nxt)
    return nxt


CHAIN_MAX = None  # --chain-max
SMOKE = False  # --smoke


def smoke(value, otherwise):
    """`value` in a --smoke run (each case at its smallest size and
    shortest run: proof that it still produces every figure, as `make test`
    needs, not a measurement), else `otherwise`."""
    return value if SMOKE else otherwise


def chain_depths(q):
    d = list(range(5)) if q else list(range(13)) + [16, 20, 24, 28, 32]
    if CHAIN_MAX is not None:
        d = [x for x in d if x <= CHAIN_MAX]
    return d


def case_chain(work, q):
    size = smoke("64M", "256M" if q else "2G")
    rt = smoke(1, 2 if q else 5)
    depths = chain_depths(q)
    maxd = depths[-1]
    size_mib = _bytes(size) >> 20
    sl = max(1, size_mib // max(maxd, 1))

    def slice_off(n):
        return ((n - 1) * sl) % size_mib

    res = {"params": {"size": size, "runtime_s": rt, "depths": depths, "slice_mib": sl,
                      "workload": "fio 4k randread then randwrite, iodepth 16, time-based"}}
    # strata: one disk, snapshots on top of it.
    grow, shrink = {}, {}
    s = Strata(os.path.join(work, "strata")).start()
    try:
        s.cli("create", "d", "--size", size)
        fill(s.uri("d"), size)
        grow[0] = _measure_rw(s.uri("d"), rt)
        for n in range(1, maxd + 1):
            s.cli("snapshot", "create", "d", f"s{n}")
            _fio_write_slice(s.uri("d"), slice_off(n), sl)
            if n in depths:
                grow[n] = _measure_rw(s.uri("d"), rt)
        print("   strata growing done", flush=True)
        for n in range(1, maxd + 1):
            ms = timed(lambda: s.cli("snapshot", "delete", "d", f"s{n}"))
            left = maxd - n
            if left in depths:
                shrink[left] = dict(_measure_rw(s.uri("d"), rt), delete_ms=ms)
        print("   strata deleting done", flush=True)
    finally:
        s.stop()
    res["strata"] = {"growing": grow, "after_delete": shrink}
    # qcow2: a backing chain of the same depth, the same slices overwritten.
    d = os.path.join(work, "qcow2")
    os.makedirs(d, exist_ok=True)
    sock = os.path.join(d, "q.sock")
    qgrow, qshrink = {}, {}
    chain = [_qcow_chain_step(d, None, 0, size)]
    qn = QemuNbd(chain[-1], "qcow2", sock).start()
    try:
        fill(qn.uri(), size)
        qgrow[0] = _measure_rw(qn.uri(), rt)
    finally:
        qn.stop()
    for n in range(1, maxd + 1):
        chain.append(_qcow_chain_step(d, chain[-1], n, size))
        qn = QemuNbd(chain[-1], "qcow2", sock).start()
        try:
            _fio_write_slice(qn.uri(), slice_off(n), sl)
            if n in depths:
                qgrow[n] = _measure_rw(qn.uri(), rt)
        finally:
            qn.stop()
    print("   qcow2 growing done", flush=True)
    # Deleting the oldest snapshot of a qcow2 chain = committing the first
    # overlay into the base and rebasing the next overlay onto the base
    # (what blockcommit does offline); its time is recorded as delete_ms.
    for n in range(1, maxd + 1):
        base, victim = chain[0], chain[1]
        nxt = chain[2] if len(chain) > 2 else None

        def delete():
            sh("qemu-img", "commit", "-f", "qcow2", "-d", victim)
            if nxt:
                sh("qemu-img", "rebase", "-u", "-f", "qcow2", "-b", base, "-F", "qcow2", nxt)
        ms = timed(delete)
        os.unlink(victim)
        chain.pop(1)
        left = maxd - n
        if left in depths:
            qn = QemuNbd(chain[-1], "qcow2", sock).start()
            try:
                qshrink[left] = dict(_measure_rw(qn.uri(), rt), delete_ms=ms)
            finally:
                qn.stop()
    print("   qcow2 deleting done", flush=True)
    res["qcow2"] = {"growing": qgrow, "after_delete": qshrink}
    return res


def case_clone(work, q):
    size = smoke("64M", "256M" if q else "1G")
    counts = [0, 2, 4] if q else list(range(13))
    maxk = counts[-1]
    size_mib = _bytes(size) >> 20
    sl = max(1, size_mib // max(maxk, 1))
    res = {"params": {"size": size, "snapshot_counts": counts, "slice_mib": sl,
                      "strata": "strata clone --full SRC NEW (thin), wall time of the CLI",
                      "qcow2": "qemu-img convert -O qcow2 TOP new.qcow2"}}
    st = {}
    s = Strata(os.path.join(work, "strata")).start()
    try:
        s.cli("create", "src", "--size", size)
        fill(s.uri("src"), size)
        for k in range(maxk + 1):
            if k > 0:
                s.cli("snapshot", "create", "src", f"s{k}")
                _fio_write_slice(s.uri("src"), ((k - 1) * sl) % size_mib, sl)
            if k in counts:
                st[k] = round(timed(lambda: s.cli("clone", "--full", "src", f"c{k}")) / 1000, 3)
                s.cli("rm", f"c{k}")
    finally:
        s.stop()
    d = os.path.join(work, "qcow2")
    os.makedirs(d, exist_ok=True)
    sock = os.path.join(d, "q.sock")
    qc = {}
    chain = [_qcow_chain_step(d, None, 0, size)]
    for k in range(maxk + 1):
        if k > 0:
            chain.append(_qcow_chain_step(d, chain[-1], k, size))
        qn = QemuNbd(chain[-1], "qcow2", sock).start()
        try:
            if k == 0:
                fill(qn.uri(), size)
            else:
                _fio_write_slice(qn.uri(), ((k - 1) * sl) % size_mib, sl)
        finally:
            qn.stop()
        if k in counts:
            out = os.path.join(d, "out.qcow2")
            qc[k] = round(timed(lambda: sh("qemu-img", "convert", "-O", "qcow2", chain[-1], out)) / 1000, 3)
            os.unlink(out)
    res["strata_s"] = st
    res["qcow2_s"] = qc
    res["ratio_qcow2_over_strata"] = {k: ratio(qc[k], st[k]) for k in counts}
    return res


def _fio_iops_log(uri, rw, bs, iodepth, runtime, size, logdir, tag):
    """fio as `fio()`, plus IOPS per 250 ms: [(t_seconds_from_fio_start, iops)]."""
    prefix = os.path.join(logdir, tag)
    r = fio(uri, rw, bs, iodepth=iodepth, runtime=runtime, size=size,
            extra=["--randrepeat=0", f"--write_iops_log={prefix}", "--log_avg_msec=250"])
    samples = []
    with open(f"{prefix}_iops.1.log") as f:
        for line in f:
            parts = [x.strip() for x in line.split(",")]
            if len(parts) >= 2:
                samples.append((int(parts[0]) / 1000.0, int(parts[1])))
    return r, samples


def _window_iops(samples, t_from, t_to):
    xs = [v for t, v in samples if t_from < t <= t_to + 0.25]
    return round(sum(xs) / len(xs)) if xs else None


def _busy_trial(s, k, tag, rt, size, logs, start, finished):
    """One trial of client writes beside background work: fio 64 KiB random
    writes (iodepth 16) on an empty thin disk with nothing running, then
    `start()` and at once the same job on another empty thin disk, while a
    thread polls `finished()` to time the work. `busy_iops_window` counts
    the part of the busy job the work lasted (fio's 250 ms IOPS log),
    against the same span from the start of the idle job (like with like:
    both spans hold fio's start-up and the host's first writeback, which
    on this VM runs at 5-15k IOPS for a second or more before 30k), and,
    strictly, against the idle job's median 250 ms sample. The host's page
    cache is written out and dropped before each job."""
    import threading
    for n in (f"idle{k}", f"busy{k}"):
        s.cli("create", n, "--size", size)
    # Like with like: each job starts with the host's page cache written
    # out and dropped. Without it the busy job, run second, paid for the
    # idle job's data on its own: with nothing running beside it, a 2 GiB
    # busy job ran at 0.23x the idle one (this VM's page cache growing into
    # memory it had not touched yet: 49% of the server's time in the
    # kernel's copy into the cache); with both dropped, 0.95x.
    _drop_caches()
    idle, idle_s = _fio_iops_log(s.uri(f"idle{k}"), "randwrite", "64k", 16, rt, size, logs,
                                 f"{tag}idle{k}")
    _drop_caches()
    cpu0 = s.cpu_seconds()
    t0 = time.perf_counter()
    start()
    done = {}

    def watch():
        while not finished():
            time.sleep(0.1)
        done["s"] = round(time.perf_counter() - t0, 2)
    th = threading.Thread(target=watch, daemon=True)
    th.start()
    t_fio = time.perf_counter() - t0
    busy, busy_s = _fio_iops_log(s.uri(f"busy{k}"), "randwrite", "64k", 16, rt, size, logs,
                                 f"{tag}busy{k}")
    cpu = s.cpu_seconds() - cpu0
    th.join(timeout=600)
    win = max(0.5, min(rt, done.get("s", rt) - t_fio))
    for n in (f"idle{k}", f"busy{k}"):
        s.cli("rm", n)
    return {"work_s": done.get("s"), "idle_iops": round(idle["iops"]),
            "busy_iops": round(busy["iops"]),
            "idle_iops_median": round(median(v for _, v in idle_s)),
            "idle_iops_window": _window_iops(idle_s, 0, win),
            "busy_iops_window": _window_iops(busy_s, 0, win),
            "server_cpu_s_busy_job": round(cpu, 2),
            "load_avg": round(os.getloadavg()[0], 2)}


def _job_trial(s, k, tag, rt, size, logs, *args):
    """`_busy_trial` with `strata ARGS --detach` as the work, finished when
    its job is no longer listed as running."""
    job = {}

    def finished():
        jobs = json.loads(s.cli("jobs", "--json"))
        state = next((j for j in jobs if j["id"] == job["id"]), {"state": "done"})["state"]
        return state in ("done", "failed", "cancelled")
    return _busy_trial(s, k, tag, rt, size, logs,
                       lambda: job.update(json.loads(s.cli(*args, "--detach", "--json"))), finished)


def _busy_summary(runs, work):
    """Medians over trials of `_busy_trial`; `work` names the background
    work in the keys (`{work}_s`, `ratio_during_{work}`)."""
    for r in runs:
        r[f"{work}_s"] = r.pop("work_s")
    med = lambda key: median(r[key] or 0 for r in runs)
    return {"trials": runs, f"{work}_s": med(f"{work}_s"),
            "idle_iops": med("idle_iops"), "busy_iops": med("busy_iops"),
            "ratio_whole_job": ratio(med("busy_iops"), med("idle_iops")),
            f"ratio_during_{work}": ratio(med("busy_iops_window"), med("idle_iops_window")),
            f"ratio_during_{work}_vs_idle_median": ratio(med("busy_iops_window"),
                                                         med("idle_iops_median")),
            "load_avg": med("load_avg"),
            "target": f">= 0.8 (during_{work}: the same span of the idle job)"}


def case_reclaim(work, q):
    """Client writes while a removed disk is reclaimed (issue 9 item 6).

    Each trial writes a disk of `data` by 4k random writes (every grain
    once, as the matrix's write cells leave it, so its pool grains are
    scattered) and flushes it; then `_busy_trial` with the removal of that
    disk as the background work, finished when `status` shows nothing
    reclaiming (a reclaim of 2 GiB takes about a second). Medians over the
    trials; the machine's load average is recorded with them."""
    data = smoke("256M", "1G" if q else "2G")
    size, rt = "4G", smoke(2, 4)
    trials = smoke(1, 2 if q else 3)
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    runs = []
    s = Strata(os.path.join(work, "reclaim")).start()
    reclaiming = lambda: json.loads(s.cli("status", "--json"))["reclaiming"]
    try:
        for k in range(trials):
            s.cli("create", "big", "--size", data)
            fio(s.uri("big"), "randwrite", "4k", size=data, extra=["--end_fsync=1"])
            # Nothing left to reclaim from the previous trial.
            while reclaiming():
                time.sleep(0.1)
            runs.append(_busy_trial(s, k, "", rt, size, logs, lambda: s.cli("rm", "big"),
                                    lambda: not reclaiming()))
    finally:
        s.stop()
    return {"removed_disk": data, "job": f"64k randwrite iodepth 16, {rt} s, empty thin {size}",
            **_busy_summary(runs, "reclaim")}


def case_spacework(work, q):
    """Client writes while convert runs on another disk (issue 9 item 6): the
    eager fill (thin -> eagerzeroedthick: zeros written for real) and the
    zero scan (eagerzeroedthick -> thin: punchzero over every grain), each
    started with --detach as a server job and finished when `strata jobs`
    says so; `_busy_trial` with medians over the trials."""
    bg = "2G" if q else "4G"
    size, rt = "4G", 6
    trials = 2 if q else 3
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    out = {"background_disk": bg, "job": f"64k randwrite iodepth 16, {rt} s, empty thin {size}"}
    s = Strata(os.path.join(work, "spacework")).start()

    def ended(job_id):
        j = next((j for j in json.loads(s.cli("jobs", "--json")) if j["id"] == job_id), None)
        return j is None or j["state"] in ("done", "failed", "cancelled")
    try:
        for phase, frm, to in (("fill", "thin", "eagerzeroedthick"),
                               ("scan", "eagerzeroedthick", "thin")):
            runs = []
            for k in range(trials):
                s.cli("create", "bg", "--size", bg, "--type", frm)
                job = {}
                start = lambda: job.update(json.loads(
                    s.cli("convert", "bg", "--type", to, "--detach", "--json")))
                runs.append(_busy_trial(s, k, phase, rt, size, logs, start,
                                        lambda: ended(job["id"])))
                s.cli("rm", "bg")
            out[phase] = {"convert_to": to, **_busy_summary(runs, "convert")}
    finally:
        s.stop()
    return out


class VmdkServe:
    """`strata serve --vmdk` of VMDK chains, without a datastore: one file
    (export "disk") or {export name: file}, all from one server process."""

    def __init__(self, work, path):
        self.work = work
        self.files = path if isinstance(path, dict) else {"disk": path}
        self.sock = os.path.join(work, "vmdk.sock")
        self.proc = None

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        args = [STRATA, "--datastore", os.path.join(self.work, "no-datastore"), "serve",
                "--nbd-unix", self.sock, "--no-stats"]
        for name, path in self.files.items():
            args += ["--vmdk", f"{name}={path}"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        wait_path(self.sock, proc=self.proc)
        return self

    def stop(self):
        if self.proc:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait()
            self.proc = None

    def uri(self, name="disk"):
        return f"nbd+unix:///{name}?socket={self.sock}"


def case_formats(work, q):
    """The seeds' format comparison on one machine and one client: the same
    disk history (fill, then N snapshots each overwriting a slice) as a
    native strata disk, as VMDK chains strata exports and serves as they are
    (vmfsSparse 512 B grains, seSparse 4 KiB grains), and as a qcow2 backing
    chain under qemu-nbd. 4k random read/write IOPS at each depth."""
    size = smoke("64M", "256M" if q else "1G")
    rt = smoke(1, 2 if q else 5)
    depths = [0, 2] if q else [0, 1, 2, 4, 8, 12]
    maxd = depths[-1]
    size_mib = _bytes(size) >> 20
    sl = max(1, size_mib // max(maxd, 1))
    res = {"params": {"size": size, "runtime_s": rt, "depths": depths, "slice_mib": sl,
                      "workload": "fio 4k randread then randwrite, iodepth 16, time-based"},
           "native": {}, "vmfsSparse": {}, "seSparse": {}, "qcow2": {}}
    s = Strata(os.path.join(work, "strata")).start()
    exports = os.path.join(work, "exports")
    os.makedirs(exports, exist_ok=True)
    try:
        s.cli("create", "d", "--size", size)
        fill(s.uri("d"), size)
        for n in range(0, maxd + 1):
            if n > 0:
                s.cli("snapshot", "create", "d", f"s{n}")
                _fio_write_slice(s.uri("d"), ((n - 1) * sl) % size_mib, sl)
            if n not in depths:
                continue
            # Export before measuring: the measurement writes to the disk.
            s.cli("snapshot", "create", "d", f"x{n}")
            for sub in ("vmfsSparse", "seSparse"):
                s.cli("export", f"d@x{n}", os.path.join(exports, f"{sub}-{n}.vmdk"),
                      "--chain", "--subformat", sub)
            res["native"][n] = _measure_rw(s.uri("d"), rt)
            s.cli("snapshot", "revert", "d", f"x{n}")
            s.cli("snapshot", "delete", "d", f"x{n}")
    finally:
        s.stop()
    print("   native + exports done", flush=True)
    for sub in ("vmfsSparse", "seSparse"):
        for n in depths:
            first = os.path.join(exports, f"{sub}-{n}.vmdk")
            # export --chain names the links N.vmdk, N-000001.vmdk, ...; the
            # chain through d@xN has n+? links: serve the last one.
            stem = first[:-5]
            links = sorted(f for f in os.listdir(exports) if f.startswith(os.path.basename(stem) + "-0"))
            links = [f for f in links if not f.endswith(("-delta.vmdk", "-sesparse.vmdk", "-flat.vmdk"))]
            top = os.path.join(exports, links[-1]) if links else first
            v = VmdkServe(os.path.join(work, sub), top)
            os.makedirs(v.work, exist_ok=True)
            v.start()
            try:
                res[sub][n] = dict(_measure_rw(v.uri(), rt), links=len(links) + 1)
            finally:
                v.stop()
        print(f"   {sub} done", flush=True)
    d = os.path.join(work, "qcow2")
    os.makedirs(d, exist_ok=True)
    sock = os.path.join(d, "q.sock")
    chain = [_qcow_chain_step(d, None, 0, size)]
    for n in range(0, maxd + 1):
        if n > 0:
            chain.append(_qcow_chain_step(d, chain[-1], n, size))
        qn = QemuNbd(chain[-1], "qcow2", sock).start()
        try:
            if n == 0:
                fill(qn.uri(), size)
            else:
                _fio_write_slice(qn.uri(), ((n - 1) * sl) % size_mib, sl)
            if n in depths:
                # Measure on a throwaway overlay so the chain stays as built.
                qn.stop()
                m = os.path.join(d, "measure.qcow2")
                sh("qemu-img", "create", "-f", "qcow2", "-b", chain[-1], "-F", "qcow2", m)
                qm = QemuNbd(m, "qcow2", sock).start()
                try:
                    res["qcow2"][n] = _measure_rw(qm.uri(), rt)
                finally:
                    qm.stop()
                    os.unlink(m)
        finally:
            qn.stop()
    print("   qcow2 done", flush=True)
    res["relative_to_depth0"] = {
        k: {n: ratio(res[k][n]["randread_iops"], res[k][depths[0]]["randread_iops"]) for n in depths}
        for k in ("native", "vmfsSparse", "seSparse", "qcow2")}
    return res


GUEST_DIR = os.path.join(ROOT, "target", "guest")


def guest_image():
    """(kernel, initramfs) of the test guest (scripts/guest), built or reused
    in target/guest as the guest test does."""
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts/guest/build-initramfs.sh"), GUEST_DIR],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"the guest image could not be built (exit {r.returncode}; "
                           f"scripts/install-deps.sh installs what it needs):\n{r.stderr[-2000:]}")
    with open(os.path.join(GUEST_DIR, "kernel")) as f:
        return f.read().strip(), os.path.join(GUEST_DIR, "initramfs.cpio.gz")


def boot_guest(img, sock, export, test, log, timeout=900, **params):
    """Boots the TCG guest (scripts/guest/init) with /dev/vda = NBD export
    EXPORT on Unix socket SOCK and `strata.test=TEST strata.K=V...`, waits
    for its power-off and returns its STRATA-GUEST-* lines as
    {marker: [rest of line]}; raises with the console unless it printed
    `STRATA-GUEST-OK TEST` and no FAIL line."""
    cmdline = " ".join(["console=ttyS0 panic=-1 loglevel=4", f"strata.test={test}"]
                       + [f"strata.{k}={v}" for k, v in params.items()])
    drive = f"file=nbd:unix:{sock}:exportname={export},format=raw,if=virtio,cache=none,discard=unmap"
    t0 = time.time()
    p = subprocess.Popen(["qemu-system-x86_64", "-accel", "tcg", "-m", "256", "-smp", "1",
                          "-display", "none", "-monitor", "none", "-no-reboot",
                          "-serial", f"file:{log}", "-kernel", img[0], "-initrd", img[1],
                          "-append", cmdline, "-drive", drive],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    with open(log, errors="replace") as f:
        console = f.read()
    lines = {}
    for line in console.splitlines():
        i = line.find("STRATA-GUEST-")
        if i >= 0:
            marker, _, rest = line[i + len("STRATA-GUEST-"):].partition(" ")
            lines.setdefault(marker, []).append(rest.strip())
    if test not in lines.get("OK", []) or lines.get("FAIL") or p.returncode != 0:
        raise RuntimeError(f"guest {test} on {export} failed (qemu exit {p.returncode}, "
                           f"{time.time() - t0:.0f} s): {lines.get('FAIL')}\n{err[-1000:]}\n"
                           f"--- console ---\n{console[-4000:]}")
    lines["boot_s"] = round(time.time() - t0, 1)
    return lines


def _guest_sums(lines):
    return dict(reversed(l.split(None, 1)) for l in lines.get("SUM", []))


def _allocated(path):
    return os.stat(path).st_blocks * 512


def _fio_multi(uris, rw, bs, iodepth, runtime, logprefix, extra=()):
    """One fio with a job per URI (same options): the desktops' clients side
    by side. Returns (IOPS of all jobs, I/Os of all jobs, [(t, IOPS of all
    jobs)] per 250 ms from fio's start)."""
    args = ["fio", "--ioengine=nbd", f"--rw={rw}", f"--bs={bs}", f"--iodepth={iodepth}",
            "--output-format=json", "--group_reporting", f"--runtime={runtime}", "--time_based",
            "--randrepeat=0", f"--write_iops_log={logprefix}", "--log_avg_msec=250"] + list(extra)
    for i, u in enumerate(uris):
        args += [f"--name=j{i}", f"--uri={u}"]
    out = sh(*args)
    j = json.loads(out[out.index("{"):])
    side = j["jobs"][0]["write" if "write" in rw else "read"]
    buckets = {}
    for i in range(1, len(uris) + 1):
        with open(f"{logprefix}_iops.{i}.log") as f:
            for line in f:
                parts = [x.strip() for x in line.split(",")]
                if len(parts) >= 2:
                    b = round(int(parts[0]) / 250)
                    buckets[b] = buckets.get(b, 0) + int(parts[1])
    return side["iops"], side["total_ios"], sorted((b / 4, v) for b, v in buckets.items())


def case_vdi(work, q):
    """Seed 000's VDI experiment (figure 10: wipe-shrink of linked clones,
    its CPU cost, the space it gives back). A golden desktop is made by a
    TCG guest (scripts/guest/init `vdigolden`: ext4 over the first part of
    the disk, "OS" files), snapshotted in strata and exported as a flat base
    plus an empty seSparse delta; each linked clone is a copy of that delta
    on the shared base, all served by one `strata serve --vmdk`. A round
    (the seed's iteration): each desktop boots (`vdiuse`), writes a user
    file, installs an application (files written, synced), uninstalls it
    and runs fstrim (the guest's side of the wipe: NBD TRIM to SEsparse
    unmap); then client I/O (fio 4k randwrite iodepth 16, one job per
    desktop, on the raw region past each file system) before, during and
    after `strata vmdk shrink` of all clones at once (one batch, default
    pacing): IOPS and server CPU in each window, space given back per
    clone. Medians over the rounds. Last, every clone boots again
    (`verify`: fsck, checksums equal to what the desktop wrote) and
    qemu-img check passes."""
    clones = 2 if q else 4
    size_mib = 256 if q else 1024
    fs_mib = size_mib * 3 // 4
    base_mib, app_mib, n_rounds = (16, 48, 1) if q else (64, 160, 3)
    rt = smoke(1, 3 if q else 8)
    live_mib = size_mib - fs_mib
    res = {"params": {"clones": clones, "disk_mib": size_mib, "fs_mib": fs_mib, "golden_files_mib": base_mib,
                      "app_mib": app_mib, "rounds": n_rounds, "client_region_mib": live_mib,
                      "runtime_s": rt,
                      "client": "fio 4k randwrite iodepth 16 per clone, on the region past its file system"}}
    img = guest_image()
    logs = os.path.join(work, "console")
    os.makedirs(logs, exist_ok=True)
    s = Strata(os.path.join(work, "strata")).start()
    exports = os.path.join(work, "exports")
    os.makedirs(exports, exist_ok=True)
    try:
        s.cli("create", "golden", "--size", f"{size_mib}M")
        g = boot_guest(img, s.sock, "golden", "vdigolden", os.path.join(logs, "golden.log"),
                       fsmib=fs_mib, basemib=base_mib)
        res["golden_boot_s"] = g["boot_s"]
        s.cli("snapshot", "create", "golden", "g")
        s.cli("export", "golden", os.path.join(exports, "vdi.vmdk"), "--chain", "--subformat", "seSparse")
    finally:
        s.stop()
    # Linked clones: one empty delta per desktop on the one base (the
    # descriptor names its own extent and keeps the parent's CID).
    with open(os.path.join(exports, "vdi-000001.vmdk")) as f:
        desc = f.read()
    files, deltas = {}, {}
    for k in range(clones):
        name = f"desktop{k}"
        shutil.copyfile(os.path.join(exports, "vdi-000001-sesparse.vmdk"),
                        os.path.join(exports, f"{name}-sesparse.vmdk"))
        with open(os.path.join(exports, f"{name}.vmdk"), "w") as f:
            f.write(re.sub(r"(?m)^CID=\w+", f"CID={random.getrandbits(32):08x}",
                           desc.replace('"vdi-000001-sesparse.vmdk"', f'"{name}-sesparse.vmdk"')))
        files[name] = os.path.join(exports, f"{name}.vmdk")
        deltas[name] = os.path.join(exports, f"{name}-sesparse.vmdk")
    os.unlink(os.path.join(exports, "vdi-000001.vmdk"))
    os.unlink(os.path.join(exports, "vdi-000001-sesparse.vmdk"))
    v = VmdkServe(work, files).start()
    uris = [v.uri(n) for n in files]
    region = [f"--offset={fs_mib}M", f"--size={live_mib}M"]
    sums = {}

    def window(name, shrink, before=None):
        """fio on every clone for `rt` s; with `shrink`, `strata vmdk shrink`
        of every clone starts with it (one batch). The shrink figures count
        only while it ran (fio's 250 ms IOPS log, CPU read when the last
        shrink ended) when it ended first."""
        import threading
        pid = v.proc.pid
        c0, t0 = cpu_of(pid), time.perf_counter()
        procs = [subprocess.Popen([STRATA, "vmdk", "shrink", f, "--json"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
                 for f in files.values()] if shrink else []
        done = {"outs": []}

        def watch():
            done["outs"] = [p.communicate() for p in procs]
            done["t"], done["cpu"] = time.perf_counter() - t0, cpu_of(pid) - c0
        th = threading.Thread(target=watch, daemon=True)
        th.start()
        t_fio = time.perf_counter() - t0
        iops, ios, samples = _fio_multi(uris, "randwrite", "4k", 16, rt, os.path.join(logs, name), region)
        cpu, wall = cpu_of(pid) - c0, time.perf_counter() - t0
        out = {"iops": round(iops), "server_cpu_pct": round(100 * cpu / wall, 1),
               "server_cpu_us_per_io": round(1e6 * cpu / ios, 2)}
        th.join(timeout=900)
        if not procs:
            return out
        for p, (o, e) in zip(procs, done["outs"]):
            if p.returncode != 0:
                raise RuntimeError(f"vmdk shrink exited {p.returncode}: {e}")
        out["reports"] = [json.loads(o)[0] for o, _ in done["outs"]]
        out["shrink_s"] = round(done["t"], 2)
        out["shrink_outlasted_fio"] = done["t"] > wall
        if done["t"] < wall:
            out["iops_while_shrinking"] = _window_iops(samples, 0, max(0.25, done["t"] - t_fio))
            out["server_cpu_pct_while_shrinking"] = round(100 * done["cpu"] / done["t"], 1)
        else:
            out["iops_while_shrinking"] = out["iops"]
            out["server_cpu_pct_while_shrinking"] = out["server_cpu_pct"]
        # The shrink's own CPU: what the window used beyond its client I/Os
        # at the before-window's cost per I/O.
        out["shrink_cpu_s_estimate"] = round(max(0.0, cpu - ios * before["server_cpu_us_per_io"] / 1e6), 2)
        return out

    try:
        rounds = []
        for r in range(n_rounds):
            rd = {"desktop_boot_s": [], "fstrim": []}
            for k, name in enumerate(files):
                u = boot_guest(img, v.sock, name, "vdiuse", os.path.join(logs, f"{name}-{r}.log"),
                               appmib=app_mib, iters=1, id=k)
                sums[name] = _guest_sums(u)
                rd["desktop_boot_s"].append(u["boot_s"])
                rd["fstrim"] += u.get("FSTRIM", [])
            if r == 0:
                # The clients' region written once (every window overwrites)
                # and a warm-up, so the first window does not pay for either.
                for u in uris:
                    fio(u, "write", "1M", iodepth=8, extra=region + ["--end_fsync=1"])
                _fio_multi(uris, "randwrite", "4k", 16, 1, os.path.join(logs, "warm"), region)
            rd["allocated_before"] = sum(_allocated(d) for d in deltas.values())
            rd["before_shrink"] = window(f"before{r}", False)
            rd["during_shrink"] = window(f"during{r}", True, rd["before_shrink"])
            rd["after_shrink"] = window(f"after{r}", False)
            rd["allocated_after"] = sum(_allocated(d) for d in deltas.values())
            rd["reclaimed_mib_per_clone"] = round(
                (rd["allocated_before"] - rd["allocated_after"]) / clones / 2**20, 1)
            before, after = rd["before_shrink"]["iops"], rd["after_shrink"]["iops"]
            during = rd["during_shrink"]["iops_while_shrinking"]
            rd["ratio_during_vs_before"] = ratio(during, before)
            rd["ratio_during_vs_before_after_mean"] = ratio(during, (before + after) / 2)
            rd["ratio_after_vs_before"] = ratio(after, before)
            rounds.append(rd)
            print(f"   round {r}: reclaimed {rd['reclaimed_mib_per_clone']} MiB per clone, "
                  f"IOPS before/during/after {before}/{during}/{after}", flush=True)
        res["rounds"] = rounds
        med = lambda f: median(f(rd) for rd in rounds)
        res["reclaimed_mib_per_clone"] = med(lambda rd: rd["reclaimed_mib_per_clone"])
        res["delta_mib_per_clone_after"] = round(sum(_allocated(d) for d in deltas.values()) / clones / 2**20, 1)
        for key in ("ratio_during_vs_before", "ratio_during_vs_before_after_mean", "ratio_after_vs_before"):
            res[key] = med(lambda rd: rd[key])
        res["shrink_s"] = med(lambda rd: rd["during_shrink"]["shrink_s"])
        res["server_cpu_pct"] = {w: med(lambda rd: rd[f"{w}_shrink"]["server_cpu_pct"])
                                 for w in ("before", "during", "after")}
        res["shrink_cpu_s_estimate"] = med(lambda rd: rd["during_shrink"]["shrink_cpu_s_estimate"])
        # Every desktop still boots to the files it wrote, fsck-clean.
        for name in files:
            c = boot_guest(img, v.sock, name, "verify", os.path.join(logs, f"{name}-verify.log"))
            got = _guest_sums(c)
            if got != sums[name]:
                raise RuntimeError(f"{name}: files after the shrink differ: {got} != {sums[name]}")
        res["verified"] = "every clone fsck-clean with the files it wrote (guest), qemu-img check clean"
    finally:
        v.stop()
    for f in files.values():
        sh("qemu-img", "check", "-f", "vmdk", f)
    return res


def _drop_caches():
    """Cold host page cache (the datastore's files); the server's metadata
    cache stays, as it would on a running host."""
    subprocess.run(["sync"])
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _hist(st, name, side="all"):
    """{bucket label: count} of one histogram of `strata stats --json`."""
    h = st[name].get(side) or st[name]["all"]
    return {b["label"]: b["count"] for b in h["buckets"] if b["count"]}


def _placement_layouts(work, placement, size, ks):
    """Fragments per disk left by the allocator's placement (`serve
    --placement`), in a datastore of its own: random 4k first writes (fio
    iodepth 16), a disk overwritten over a quarter of its grains in random
    order after a snapshot, a linked clone diverging over an eighth, and k
    disks growing together (one fio, 64k sequential, iodepth 4 each)."""
    s = Strata(os.path.join(work, f"placement-{placement}"),
               serve_args=["--placement", placement]).start()
    frag = lambda d: json.loads(s.cli("info", d, "--json"))["fragments"]
    each = f"{max(16, (_bytes(size) >> 20) // max(ks))}M"
    quarter = f"{_bytes(size) >> 22}M"
    r = {}
    try:
        s.cli("create", "rand", "--size", size)
        fio(s.uri("rand"), "randwrite", "4k", size=size, extra=["--randrepeat=0"])
        r["random_first_writes"] = frag("rand")
        s.cli("snapshot", "create", "rand", "s")
        s.cli("clone", "rand@s", "c")
        fio(s.uri("rand"), "randwrite", "4k", size=size, extra=["--randrepeat=0", f"--io_size={quarter}"])
        fio(s.uri("c"), "randwrite", "4k", size=size,
            extra=["--randrepeat=0", f"--io_size={_bytes(size) >> 23}M"])
        r["overwritten_quarter_after_snapshot"] = frag("rand")
        r["clone_diverged_eighth"] = frag("c")
        growing = {}
        for k in ks:
            names = [f"g{k}_{i}" for i in range(k)]
            for n in names:
                s.cli("create", n, "--size", each)
            args = ["fio", "--ioengine=nbd", "--rw=write", "--bs=64k", "--iodepth=4",
                    f"--size={each}", "--output-format=terse"]
            for i, n in enumerate(names):
                args += [f"--name=j{i}", f"--uri={s.uri(n)}"]
            sh(*args)
            growing[k] = round(sum(frag(n) for n in names) / k, 1)
            for n in names:
                s.cli("rm", n)
        r["growing_together"] = {"disk_size": each, "per_disk": growing}
    finally:
        s.stop()
    return r


def case_fragmentation(work, q):
    """Issue 10 / seed 004 (guest defragmentation) and seed 001 figure 6
    (thin disks growing together), with strata's own layout figures and
    histograms. In one datastore: `seq` written sequentially, and `frag`
    written by 4k random writes (every grain once), then snapshotted and
    overwritten at random over half its grains in eight rounds, a snapshot
    before each (the snapshots deleted after): placement (FORMAT.md §10.5)
    lays out one version's random writes, so fragments come from copies on
    write. Fragments of each (`info`), then a cold-cache sequential read
    (1M, iodepth 4) and a copy-like read (64k, iodepth 1) of `frag` and
    `seq` (median MiB/s of three passes in full mode, each cold, the two
    disks' passes in turn so that drift hits both alike), with
    `strata stats` latency and seek-distance histograms; then
    `strata defrag frag` as a job while fio writes 64k random to another
    disk (vs the same job idle: `_busy_trial`), and the reads of `frag`
    again, beside `seq` read again; then free space made by overwriting half of `frag` after a
    snapshot that is then deleted, and `defrag --free-space` beside the
    same client writes (three trials in full mode, each with its own free
    space). The histograms are the client's view (virtual LBAs): seek
    distances do not change with the layout underneath, latencies do.
    Last, the allocator's placement against arrival order, each in a
    datastore of its own: fragments after random first writes, overwrites
    after a snapshot, a diverging clone, and per disk vs the number of disks
    growing together (fragmentation.svg)."""
    size = "256M" if q else "2G"
    rt = 4 if q else 8
    ks = [1, 2, 4] if q else [1, 2, 4, 8]
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    s = Strata(os.path.join(work, "frag")).start()
    frag = lambda d: json.loads(s.cli("info", d, "--json"))["fragments"]
    out = {"params": {"size": size, "runtime_s": rt, "disks_growing_together": ks,
                      "cold": "host page cache dropped before each read"}}

    def reads(disks):
        # Cold reads on this VM's disk vary run to run by up to 2x, and
        # drift over a run: the disks are read pass by pass in turn (seq,
        # frag, seq, frag, ...), each pass after a cache drop, and each
        # disk's figure is the median of its passes (three in full mode),
        # so a ratio compares reads made at the same time.
        r = {d: {} for d in disks}
        for tag, bs, depth in (("seqread_1m", "1M", 4), ("copy_64k", "64k", 1)):
            passes = {d: [] for d in disks}
            for d in disks:
                s.cli("stats", d, "--reset")
            for _ in range(1 if q else 3):
                for d in disks:
                    out["cold_cache"] = _drop_caches()
                    # One pass over the disk, not time-based: a second pass
                    # would be served from the page cache the first one filled.
                    passes[d].append(fio(s.uri(d), "read", bs, iodepth=depth, size=size))
            for d in disks:
                st = json.loads(s.cli("stats", d, "--json"))[d]
                p = passes[d]
                r[d][tag] = {"mib_s": round(median(x["bw_mib"] for x in p), 1),
                             "mib_s_passes": [round(x["bw_mib"], 1) for x in p],
                             "iops": round(median(x["iops"] for x in p)),
                             "latency_us": _hist(st, "latency", "read"),
                             "seek_distance": _hist(st, "seek_distance", "read")}
        return r
    try:
        s.cli("create", "seq", "--size", size)
        s.cli("create", "frag", "--size", size)
        fill(s.uri("seq"), size)
        fio(s.uri("frag"), "randwrite", "4k", size=size, extra=["--randrepeat=0"])
        out["fragments"] = {"seq": frag("seq"), "frag_random_first_writes": frag("frag")}
        rounds = 8
        for i in range(rounds):
            s.cli("snapshot", "create", "frag", f"r{i}")
            fio(s.uri("frag"), "randwrite", "4k", size=size,
                extra=["--randrepeat=0", f"--randseed={i + 1}",
                       f"--io_size={_bytes(size) // (2 * rounds) >> 20}M"])
        for i in range(rounds):
            s.cli("snapshot", "delete", "frag", f"r{i}")
        out["fragments"]["frag"] = frag("frag")
        before = reads(["seq", "frag"])
        out["seq"], out["frag_before"] = before["seq"], before["frag"]
        trial = _job_trial(s, 0, "defrag", rt, size, logs, "defrag", "frag")
        out["client_writes_during_defrag"] = _busy_summary([trial], "defrag")
        out["fragments"]["frag_after_defrag"] = frag("frag")
        after = reads(["seq", "frag"])
        out["seq_beside_after"], out["frag_after"] = after["seq"], after["frag"]
        # Free space to consolidate: half of `frag` overwritten at random
        # after a snapshot, which is then deleted (its grains come free in
        # runs too short to punch), then `defrag --free-space` as a job
        # beside the same client writes.
        # Each trial makes its own free space first.
        runs = []
        for k in range(1 if q else 3):
            s.cli("snapshot", "create", "frag", "fs")
            fio(s.uri("frag"), "randwrite", "4k", size=size,
                extra=["--randrepeat=0", f"--randseed={100 + k}",
                       f"--io_size={_bytes(size) >> 21}M"])
            s.cli("snapshot", "delete", "frag", "fs")
            if not k:
                out["before_consolidation"] = {
                    key: v for key, v in json.loads(s.cli("status", "--json")).items()
                    if key in ("used_bytes", "pool_bytes", "pool_file_bytes")}
            runs.append(_job_trial(s, 1 + k, "consolidate", rt, size, logs, "defrag",
                                   "--free-space"))
        out["client_writes_during_consolidation"] = _busy_summary(runs, "consolidation")
        for tag in ("seqread_1m", "copy_64k"):
            out[f"ratio_{tag}_fragmented_vs_seq"] = ratio(out["frag_before"][tag]["mib_s"],
                                                          out["seq"][tag]["mib_s"])
            out[f"ratio_{tag}_defragmented_vs_seq"] = ratio(
                out["frag_after"][tag]["mib_s"], out["seq_beside_after"][tag]["mib_s"])
        out["target"] = (">= 0.9 (defragmented vs seq), client writes during defrag and "
                         "consolidation >= 0.8")
        out["status"] = {k: v for k, v in json.loads(s.cli("status", "--json")).items()
                         if k in ("used_bytes", "pool_bytes", "pool_file_bytes", "free_extents",
                                  "free_extent_histogram")}
    finally:
        s.stop()
    out["placement"] = {p: _placement_layouts(work, p, size, ks) for p in ("arrival", "regions")}
    return out


def case_vhost(work, q):
    """Issue 11: vhost-user-blk, strata against qemu-storage-daemon's
    vhost-user-blk export of a raw file (aio=threads, host page cache:
    cache.direct=off, like strata's default), both driven by the same
    userspace frontend (crates/vhost/examples/vhost_bench.rs: memfd guest
    memory, one queue, requests kept at the queue depth, completions
    waited for on the call eventfd as a guest does). The frontend runs on
    CPU 0, each backend on CPU 1 (taskset), so the figures compare the
    backends' work per request, not contention. Each disk is written full
    first, so reads read data. Server CPU per I/O from /proc. strata over
    NBD (fio's nbd engine) and over FUSE (fio, libaio, O_DIRECT on the
    export's file), same CPU split, are printed beside it for reference. Workloads: 4k random read and write at QD 16, 512k
    sequential read and write at QD 16 (strata's pass and qsd's
    alternate, the median of three in full mode)."""
    size = smoke("256M", "1G")
    rt = smoke(1, 4 if q else 8)
    passes = 1 if q else 3
    sh("cargo", "build", "--release", "-q", "-p", "strata-vhost", "--example", "vhost_bench",
       cwd=ROOT)
    harness = os.path.join(ROOT, "target/release/examples/vhost_bench")
    vsock = os.path.join(work, "strata.vhost")
    qsock = os.path.join(work, "qsd.vhost")
    raw = os.path.join(work, "raw.img")
    mnt = os.path.join(work, "fuse")
    s = Strata(os.path.join(work, "strata"),
               serve_args=["--vhost-user-blk", f"d={vsock}", "--vhost-queues", "1",
                           "--fuse", mnt])
    s.cli("create", "d", "--size", size)
    s.start()
    qsd = None
    out = {"params": {"size": size, "runtime_s": rt, "passes": passes, "queues": 1,
                      "cpus": "frontend/fio on CPU 0, backend on CPU 1",
                      "qsd": "driver=file, cache.direct=off, aio=threads"}}
    try:
        sh("taskset", "-pac", "1", str(s.proc.pid))
        wait_path(vsock)
        fill(s.uri("d"), size)
        sh("dd", "if=/dev/urandom", f"of={raw}", "bs=1M", "count=1024", "conv=fsync",
           "status=none")
        qsd = subprocess.Popen(
            ["taskset", "-c", "1", "qemu-storage-daemon",
             "--blockdev", f"driver=file,node-name=f,filename={raw},cache.direct=off,aio=threads",
             "--export", f"type=vhost-user-blk,id=e,node-name=f,addr.type=unix,"
                         f"addr.path={qsock},writable=on,num-queues=1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_path(qsock)

        def drive(sock, rw, bs):
            o = sh("taskset", "-c", "0", harness, sock, rw, str(bs), "16", str(rt))
            return json.loads(o.strip().splitlines()[-1])

        for tag, rw, bs in (("randread_4k", "randread", 4096), ("randwrite_4k", "randwrite", 4096),
                            ("seqread_512k", "read", 524288), ("seqwrite_512k", "write", 524288)):
            runs = {"strata": [], "qsd": [], "strata_nbd": [], "strata_fuse": []}
            for _ in range(passes):
                for who, pid, sock in (("strata", s.proc.pid, vsock), ("qsd", qsd.pid, qsock)):
                    c0 = cpu_of(pid)
                    r = drive(sock, rw, bs)
                    r["server_cpu_us_per_io"] = round((cpu_of(pid) - c0) / max(r["ops"], 1) * 1e6, 2)
                    runs[who].append(r)
                c0 = s.cpu_seconds()
                x = fio(s.uri("d"), rw, "4k" if bs == 4096 else "512k", iodepth=16, runtime=rt,
                        extra=["--cpus_allowed=0"])
                runs["strata_nbd"].append({
                    "iops": x["iops"], "errors": 0,
                    "server_cpu_us_per_io": round((s.cpu_seconds() - c0) / max(x["ios"], 1) * 1e6, 2)})
                c0 = s.cpu_seconds()
                x = fio_file(os.path.join(mnt, "d"), rw, "4k" if bs == 4096 else "512k", rt)
                runs["strata_fuse"].append({
                    "iops": x["iops"], "errors": 0,
                    "server_cpu_us_per_io": round((s.cpu_seconds() - c0) / max(x["ios"], 1) * 1e6, 2)})
            row = {}
            for who, rs in runs.items():
                assert all(r["errors"] == 0 for r in rs), f"{who} {tag}: requests failed"
                row[who] = {"iops": round(median(r["iops"] for r in rs)),
                            "iops_passes": [round(r["iops"]) for r in rs],
                            "server_cpu_us_per_io": median(r["server_cpu_us_per_io"] for r in rs)}
            row["ratio_strata_vs_qsd"] = ratio(row["strata"]["iops"], row["qsd"]["iops"])
            row["ratio_strata_nbd_vs_vhost"] = ratio(row["strata_nbd"]["iops"], row["strata"]["iops"])
            row["ratio_strata_fuse_vs_nbd"] = ratio(row["strata_fuse"]["iops"],
                                                    row["strata_nbd"]["iops"])
            out[tag] = row
        out["target"] = ("4k random >= 1.0x qsd raw; 512k sequential >= 0.9x qsd raw "
                         "(same frontend, one queue, QD 16)")
    finally:
        if qsd:
            qsd.terminate()
            qsd.wait()
        s.stop()
    return out


def cpu_of(pid):
    """User + system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def case_cachenone(work, q):
    """Issue 11, item 5: `serve --cache none` (the pool with O_DIRECT)
    against qemu-nbd --cache=none on a raw file, with QEMU's two usual
    aio modes (threads, its default, and native, what libvirt pairs with
    cache=none). fio's nbd engine, QD 16, one connection. Each pass, for
    each server in turn (the order alternates): a durable 512k sequential
    write of a fresh disk (end_fsync), then the server is stopped, the
    host's caches dropped and the server started again, and a 4k random
    read of the now full disk runs cold (strata's metadata cache starts
    empty too). Median of the passes."""
    size = smoke("256M", "1G" if q else "2G")
    rt = smoke(2, 5 if q else 10)
    passes = 1 if q else 3
    who_all = ("strata", "qemu_threads", "qemu_native")
    runs = {w: {"write": [], "read": []} for w in who_all}
    cold = True
    for p in range(passes):
        order = who_all if p % 2 == 0 else tuple(reversed(who_all))
        for who in order:
            d = os.path.join(work, f"{who}_{p}")
            if who == "strata":
                srv = Strata(d, serve_args=["--cache", "none"])
                srv.cli("create", "d", "--size", size)
                uri = srv.uri("d")
            else:
                os.makedirs(d, exist_ok=True)
                f = os.path.join(d, "disk.raw")
                with open(f, "wb") as fh:
                    fh.truncate(_bytes(size))
                srv = QemuNbd(f, "raw", os.path.join(d, "q.sock"), cache="none",
                              aio=who.split("_")[1])
                uri = srv.uri()
            try:
                srv.start()
                w = fio(uri, "write", "512k", iodepth=16, size=size, extra=["--end_fsync=1"])
                runs[who]["write"].append(w["bw_mib"])
                srv.stop()
                cold = _drop_caches() and cold
                srv.start()
                r = fio(uri, "randread", "4k", iodepth=16, runtime=rt, size=size)
                runs[who]["read"].append(r["iops"])
            finally:
                srv.stop()
                shutil.rmtree(d, ignore_errors=True)
    out = {"params": {"size": size, "runtime_s": rt, "passes": passes, "iodepth": 16,
                      "caches_dropped": cold,
                      "qemu": "qemu-nbd -f raw --cache=none --aio=threads|native"}}
    for who in who_all:
        out[who] = {"randread_4k_cold_iops": median(runs[who]["read"]),
                    "randread_4k_iops_passes": runs[who]["read"],
                    "seqwrite_512k_durable_mib_s": round(median(runs[who]["write"]), 1),
                    "seqwrite_512k_mib_s_passes": [round(x, 1) for x in runs[who]["write"]]}
    for peer in ("qemu_threads", "qemu_native"):
        out[f"ratio_randread_vs_{peer}"] = ratio(out["strata"]["randread_4k_cold_iops"],
                                                 out[peer]["randread_4k_cold_iops"])
        out[f"ratio_seqwrite_vs_{peer}"] = ratio(out["strata"]["seqwrite_512k_durable_mib_s"],
                                                 out[peer]["seqwrite_512k_durable_mib_s"])
    out["vhost"] = _cachenone_vhost(work, q, size, rt, passes)
    out["target"] = ("cold 4k random read >= 0.95x and durable 512k sequential write >= 0.95x "
                     "qemu-nbd cache=none on a raw file (NBD) and qsd cache.direct=on (vhost)")
    return out


def _cachenone_vhost(work, q, size, rt, passes):
    """The vhost-user-blk half of `cachenone`: strata `serve --cache none`
    against qemu-storage-daemon exporting a raw file with
    cache.direct=on (aio=threads and aio=native), the same frontend
    harness as the `vhost` case (one queue, QD 16; harness on CPU 0,
    backends on CPU 1). Both disks are written full first; then, with
    the host's caches dropped before each run, a 4k random read and a
    512k sequential write that ends with a FLUSH (counted in its time)."""
    sh("cargo", "build", "--release", "-q", "-p", "strata-vhost", "--example", "vhost_bench",
       cwd=ROOT)
    harness = os.path.join(ROOT, "target/release/examples/vhost_bench")
    d = os.path.join(work, "vhost")
    os.makedirs(d, exist_ok=True)
    vsock = os.path.join(d, "strata.vhost")
    raw = os.path.join(d, "raw.img")
    s = Strata(os.path.join(d, "strata"),
               serve_args=["--cache", "none", "--vhost-user-blk", f"d={vsock}",
                           "--vhost-queues", "1"])
    s.cli("create", "d", "--size", size)
    s.start()
    qsds = {}
    try:
        sh("taskset", "-pac", "1", str(s.proc.pid))
        wait_path(vsock)
        fill(s.uri("d"), size)
        sh("dd", "if=/dev/urandom", f"of={raw}", "bs=1M", f"count={_bytes(size) >> 20}",
           "conv=fsync", "status=none")
        for aio in ("threads", "native"):
            sock = os.path.join(d, f"qsd_{aio}.vhost")
            qsds[aio] = (subprocess.Popen(
                ["taskset", "-c", "1", "qemu-storage-daemon",
                 "--blockdev", f"driver=file,node-name=f,filename={raw},cache.direct=on,aio={aio},locking=off",
                 "--export", f"type=vhost-user-blk,id=e,node-name=f,addr.type=unix,"
                             f"addr.path={sock},writable=on,num-queues=1"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), sock)
            wait_path(sock)
        # One qsd at a time holds the file open for writing; both are
        # started, and the raw file's writes from either are the same bytes.
        who_all = {"strata": (s.proc.pid, vsock),
                   "qsd_threads": (qsds["threads"][0].pid, qsds["threads"][1]),
                   "qsd_native": (qsds["native"][0].pid, qsds["native"][1])}
        out = {"params": {"cpus": "harness on CPU 0, backend on CPU 1", "queues": 1, "iodepth": 16,
                          "qsd": "driver=file, cache.direct=on, aio=threads|native"}}
        for tag, rw, bs, extra in (("randread_4k_cold", "randread", 4096, []),
                                   ("seqwrite_512k_durable", "write", 524288, ["flush"])):
            runs = {w: [] for w in who_all}
            for p in range(passes):
                order = list(who_all) if p % 2 == 0 else list(reversed(list(who_all)))
                for who in order:
                    pid, sock = who_all[who]
                    _drop_caches()
                    c0 = cpu_of(pid)
                    o = sh("taskset", "-c", "0", harness, sock, rw, str(bs), "16", str(rt), *extra)
                    r = json.loads(o.strip().splitlines()[-1])
                    assert r["errors"] == 0, f"{who} {tag}: requests failed"
                    r["server_cpu_us_per_io"] = round((cpu_of(pid) - c0) / max(r["ops"], 1) * 1e6, 2)
                    runs[who].append(r)
            row = {w: {"iops": round(median(r["iops"] for r in rs)),
                       "iops_passes": [round(r["iops"]) for r in rs],
                       "mib_s": round(median(r["mib_s"] for r in rs), 1),
                       "server_cpu_us_per_io": median(r["server_cpu_us_per_io"] for r in rs)}
                   for w, rs in runs.items()}
            for peer in ("qsd_threads", "qsd_native"):
                row[f"ratio_vs_{peer}"] = ratio(row["strata"]["iops"], row[peer]["iops"])
            out[tag] = row
        return out
    finally:
        for proc, _ in qsds.values():
            proc.terminate()
            proc.wait()
        s.stop()


def case_claims(work, q):
    """Issue 25: create-only writes under contention, as hosts racing to
    claim one disk send them (each claim is a create-only PUT of the next
    manifest). Per racer count (2, 8, 32), rounds of that many threads
    creating one fresh key at the same instant (the create_race example of
    strata-objstore, SeaweedFS on loopback): p50/p99/max latency over
    every create, the winners' and the losers' apart, and the errors."""
    rounds = smoke(2, 10 if q else 20)
    sh("cargo", "build", "--release", "-q", "-p", "strata-objstore", "--features", "testing",
       "--example", "create_race", cwd=ROOT)
    weed, endpoint = start_seaweedfs(work)
    try:
        env = dict(os.environ, STRATA_RACE_URL=f"s3://strata-bench/claims-{random.randrange(1 << 32):08x}")
        out = subprocess.run([os.path.join(ROOT, "target/release/examples/create_race"), str(rounds),
                              "2", "8", "32"], env=env, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(f"create_race failed: {out.stderr[-2000:]}")
        rows = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        weed.terminate()
        weed.wait()
    res = {"params": {"rounds": rounds, "store": f"SeaweedFS on loopback ({endpoint})"}}
    for r in rows:
        res[f"racers_{r['racers']}"] = r
    return res


CASES = {
    "depth": lambda w, q: case_depth(w, q),
    "randwrite": lambda w, q: case_simple(w, q, "randwrite", "4k", False, ">= 1.0"),
    "randread": lambda w, q: case_simple(w, q, "randread", "4k", True, ">= 0.95"),
    "seqwrite": lambda w, q: case_simple(w, q, "write", "512k", False, ">= 0.9", iodepth=8),
    "snaptime": lambda w, q: case_snaptime(w, q),
    "rss": lambda w, q: case_rss(w, q),
    "stats": lambda w, q: case_stats(w, q),
    "ckpt": lambda w, q: case_ckpt(w, q),
    "reclaim": lambda w, q: case_reclaim(w, q),
    "spacework": lambda w, q: case_spacework(w, q),
    "bigread": lambda w, q: case_bigread(w, q),
    "zeroing": lambda w, q: case_zeroing(w, q),
    "zerodetect": lambda w, q: case_zerodetect(w, q),
    "matrix": lambda w, q: case_matrix(w, q),
    "chain": lambda w, q: case_chain(w, q),
    "clone": lambda w, q: case_clone(w, q),
    "formats": lambda w, q: case_formats(w, q),
    "vdi": lambda w, q: case_vdi(w, q),
    "fragmentation": lambda w, q: case_fragmentation(w, q),
    "vhost": lambda w, q: case_vhost(w, q),
    "cachenone": lambda w, q: case_cachenone(w, q),
    "multihost": lambda w, q: case_multihost(w, q),
    "move": lambda w, q: case_move(w, q),
    "claims": lambda w, q: case_claims(w, q),
}


# ---------------------------------------------------------------------------
# Storage vMotion (issue 13): a served disk moves under a write load.
# ---------------------------------------------------------------------------

def _fio_load(uri, size, logprefix, runtime, rate_iops=None):
    """4k random writes (iodepth 16, optionally at a fixed rate) as a
    Popen, logging every completion (its time and latency)."""
    rate = [f"--rate_iops={rate_iops}"] if rate_iops else []
    return subprocess.Popen(
        ["fio", "--name=load", "--ioengine=nbd", f"--uri={uri}", "--rw=randwrite", "--bs=4k",
         "--iodepth=16", f"--size={size}", f"--runtime={runtime}", "--time_based",
         "--randrepeat=0", "--output-format=json", f"--write_lat_log={logprefix}"] + rate,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _fio_completions(prefix):
    """[(t_s, clat_ms)] of every write of a `_fio_load` run."""
    out = []
    with open(f"{prefix}_clat.1.log") as f:
        for line in f:
            parts = line.split(",", 2)
            if len(parts) >= 2:
                out.append((int(parts[0]) / 1000.0, int(parts[1]) / 1e6))
    return out


def _window(done, t_from, t_to):
    """(IOPS, longest latency in ms, p99 in ms) of the completions in
    (t_from, t_to]."""
    xs = sorted(ms for t, ms in done if t_from < t <= t_to)
    span = t_to - t_from
    p99 = round(xs[int(len(xs) * 0.99)], 2) if xs else 0
    return (round(len(xs) / span) if span > 0 else None), round(xs[-1] if xs else 0, 2), p99


def _loaded_move(s, size, logs, tag, base_rt, to, rate_iops=None):
    """The load alone for base_rt s, then the same load with a move to `to`
    starting 2 s in (fio stops 1 s after it ends): the move's report and
    the load's IOPS / p100 / p99 without and during the move."""
    _drop_caches()
    p = _fio_load(s.uri("d"), size, os.path.join(logs, f"{tag}base"), base_rt, rate_iops)
    p.communicate()
    # Past fio's first second (start-up), like the loaded run's window.
    base = _window(_fio_completions(os.path.join(logs, f"{tag}base")), 1.0, base_rt)
    _drop_caches()
    t0 = time.perf_counter()
    p = _fio_load(s.uri("d"), size, os.path.join(logs, f"{tag}move"), 900, rate_iops)
    time.sleep(2)
    t_from = time.perf_counter() - t0
    moved = json.loads(s.cli("move", "d", "--to", to, "--json"))
    t_to = time.perf_counter() - t0
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    p.communicate()
    # fio's clock starts a little after Popen: the window is its move.
    during = _window(_fio_completions(os.path.join(logs, f"{tag}move")), t_from, t_to)
    return moved, base, during


def case_move(work, q):
    """Issue 13: `strata move` of a served, full disk to another local
    datastore (same file system), idle and under 4k random writes (fio
    nbd, iodepth 16). Figures: the move's time under load vs idle; the
    longest client write latency while it ran (p100: the switch's pause
    is in it) and the server's own switch_ms, vs the longest latency of the
    same load without a move; client IOPS during the move vs the same load
    without one [>= 0.7]. Host page cache dropped before each run."""
    size = smoke("64M", "256M" if q else "2G")
    base_rt = smoke(3, 5 if q else 15)
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    s = Strata(os.path.join(work, "home")).start()
    dest = os.path.join(work, "dest")
    sh(STRATA, "--datastore", dest, "init")
    out = {"params": {"size": size, "load": "fio nbd 4k randwrite iodepth 16",
                      "target": "another local datastore on the same file system"}}
    try:
        s.cli("create", "d", "--size", size)
        fill(s.uri("d"), size)
        idle = []
        for to in (dest, s.ds):
            _drop_caches()
            idle.append(json.loads(s.cli("move", "d", "--to", to, "--json")))
        moved, base, during = _loaded_move(s, size, logs, "full", base_rt, dest)
        out.update({
            "idle_move_s": [round(r["seconds"], 2) for r in idle],
            "idle_switch_ms": [round(r["switch_ms"], 2) for r in idle],
            "loaded_move_s": round(moved["seconds"], 2),
            "loaded_vs_idle": ratio(moved["seconds"], median(r["seconds"] for r in idle)),
            "loaded_passes": moved["passes"], "loaded_mirrored": moved["mirrored"],
            "loaded_copied_mib": round(moved["copied_bytes"] / 2**20),
            "switch_ms": round(moved["switch_ms"], 2),
            "iops_without_move": base[0], "iops_during_move": during[0],
            "ratio_during_move": ratio(during[0], base[0]),
            "p100_write_ms_without_move": base[1], "p100_write_ms_during_move": during[1],
            "p99_write_ms_without_move": base[2], "p99_write_ms_during_move": during[2],
            "target": ">= 0.7 (IOPS during the move vs the same load without)",
        })
        # A VM's load rather than all the machine can do: 4k random
        # writes at a fixed rate, moved back home.
        rate = 5000
        moved, base, during = _loaded_move(s, size, logs, "paced", base_rt, s.ds, rate)
        out["paced"] = {
            "rate_iops": rate, "move_s": round(moved["seconds"], 2),
            "passes": moved["passes"], "mirrored": moved["mirrored"],
            "switch_ms": round(moved["switch_ms"], 2),
            "iops_without_move": base[0], "iops_during_move": during[0],
            "ratio_during_move": ratio(during[0], base[0]),
            "p100_write_ms_without_move": base[1], "p100_write_ms_during_move": during[1],
            "p99_write_ms_without_move": base[2], "p99_write_ms_during_move": during[2],
        }
    finally:
        s.stop()
    return out


# ---------------------------------------------------------------------------
# Object-store datastores (issue 12): SeaweedFS on loopback.
# ---------------------------------------------------------------------------

S3_KEY, S3_SECRET = "strata-bench", "strata-bench-secret"


def _free_port_base():
    import socket
    for _ in range(100):
        base = random.randint(20000, 55000)
        ok = True
        for p in range(base, base + 4):
            with socket.socket() as so:
                try:
                    so.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        # SeaweedFS also listens on port + 10000 (gRPC).
        for p in range(base + 10000, base + 10004):
            with socket.socket() as so:
                try:
                    so.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        if ok and base + 10004 < 65535:
            return base
    raise RuntimeError("no free ports for SeaweedFS")


def start_seaweedfs(work):
    """`weed server` with S3 on loopback (as the tests run it); returns
    (process, endpoint) and sets the AWS_* variables for strata."""
    weed = shutil.which("weed")
    if not weed:
        raise RuntimeError("SeaweedFS ('weed') is not installed: run scripts/install-deps.sh")
    d = os.path.join(work, "seaweedfs")
    os.makedirs(os.path.join(d, "data"), exist_ok=True)
    cfg = os.path.join(d, "s3.json")
    with open(cfg, "w") as f:
        json.dump({"identities": [{"name": "strata", "credentials": [
            {"accessKey": S3_KEY, "secretKey": S3_SECRET}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
    base = _free_port_base()
    log = open(os.path.join(d, "weed.log"), "w")
    proc = subprocess.Popen(
        [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={d}/data",
         f"-master.port={base}", f"-volume.port={base + 1}", "-filer", f"-filer.port={base + 2}",
         "-s3", f"-s3.port={base + 3}", f"-s3.config={cfg}", "-s3.port.iceberg=0",
         "-s3.port.lance=0", "-master.volumeSizeLimitMB=256", "-volume.max=0"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{base + 3}"
    os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": S3_KEY,
                       "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_REGION": "us-east-1"})
    return proc, endpoint


class SharedStrata(Strata):
    """`strata serve` of a directory attached to an object-store datastore
    (started, stopped and addressed as a local one)."""

    def __init__(self, work, url, attach=False):
        self.ds = work
        self.sock = work + ".sock"
        self.cache = "128M"
        self.serve_args = []
        self.proc = None
        t0 = time.time()
        while True:
            r = subprocess.run([STRATA, "--datastore", self.ds, "attach" if attach else "init",
                                "--object-store", url], capture_output=True, text=True)
            if r.returncode == 0:
                break
            # The gateway answers before the filer behind it is ready.
            if time.time() - t0 > 60:
                raise RuntimeError(f"strata init --object-store {url}: {r.stderr}")
            time.sleep(0.5)


def fio_flush_every(uri, bs, n, runtime, size):
    """4k random writes with a FLUSH every N writes: IOPS and the FLUSH
    latency percentiles (ms)."""
    out = sh("fio", "--name=b", "--ioengine=nbd", f"--uri={uri}", "--rw=randwrite", f"--bs={bs}",
             "--iodepth=16", f"--fsync={n}", f"--runtime={runtime}", "--time_based",
             f"--size={size}", "--randrepeat=0", "--output-format=json", "--group_reporting",
             "--percentile_list=50:90:99:99.9")
    job = json.loads(out[out.index("{"):])["jobs"][0]
    sync = job.get("sync", {})
    lat = sync.get("lat_ns", {})
    pct = lat.get("percentile", {})
    ms = lambda k: round(pct[k] / 1e6, 2) if k in pct else None
    return {"iops": round(job["write"]["iops"]), "flushes": sync.get("total_ios"),
            "flush_p50_ms": ms("50.000000"), "flush_p90_ms": ms("90.000000"),
            "flush_p99_ms": ms("99.000000"), "flush_max_ms": round(lat.get("max", 0) / 1e6, 2)}


def _first_read_ms(uri):
    t = time.perf_counter()
    sh("qemu-io", "-r", "-f", "raw", "-c", "read 0 4k", uri)
    return round((time.perf_counter() - t) * 1000, 1)


def case_multihost(work, q):
    """Issue 12: a disk of an object-store datastore (SeaweedFS on
    loopback, one host) against the same disk in a local datastore, same
    fio, same run. Warm 4k random read (the local segment cache holds what
    the owner wrote) [>= 0.9]; 4k random write with a FLUSH every 64 writes
    (each FLUSH uploads a segment and commits a manifest: its latency
    percentiles); 512k sequential write with a FLUSH at the end; a cold start
    (server restarted with its cache deleted, host page cache dropped):
    time to the first byte, IOPS per 250 ms until it reaches 90% of the
    warm figure."""
    size = smoke("64M", "256M" if q else "1G")
    rt = smoke(2, 5 if q else 15)
    weed, endpoint = start_seaweedfs(work)
    out = {"params": {"size": size, "runtime_s": rt, "store": f"SeaweedFS on loopback ({endpoint})",
                      "client": "fio nbd engine, iodepth 16"}}
    try:
        local = Strata(os.path.join(work, "local")).start()
        try:
            local.cli("create", "d", "--size", size)
            lw = fio(local.uri("d"), "write", "512k", iodepth=16, size=size,
                     extra=["--end_fsync=1"])
            lr = fio(local.uri("d"), "randread", "4k", runtime=rt, size=size)
            lf = fio_flush_every(local.uri("d"), "4k", 64, rt, size)
        finally:
            local.stop()
        url = f"s3://strata-bench/multihost-{random.randrange(1 << 32):08x}"
        sh_ = SharedStrata(os.path.join(work, "host-a"), url)
        sh_.cli("create", "d", "--size", size)
        sh_.start()
        try:
            t = time.perf_counter()
            sw = fio(sh_.uri("d"), "write", "512k", iodepth=16, size=size,
                     extra=["--end_fsync=1"])
            fill_s = time.perf_counter() - t
            sr = fio(sh_.uri("d"), "randread", "4k", runtime=rt, size=size)
            sf = fio_flush_every(sh_.uri("d"), "4k", 64, rt, size)
        finally:
            sh_.stop()
        out["seq_write_512k"] = {"local_mib_s": round(lw["bw_mib"], 1),
                                 "shared_mib_s": round(sw["bw_mib"], 1),
                                 "ratio": ratio(sw["bw_mib"], lw["bw_mib"]),
                                 "shared_fill_s": round(fill_s, 1)}
        out["rand_read_4k_warm"] = {"local_iops": round(lr["iops"]), "shared_iops": round(sr["iops"]),
                                    "ratio": ratio(sr["iops"], lr["iops"]), "target": ">= 0.9"}
        out["rand_write_4k_flush64"] = {"local": lf, "shared": sf,
                                        "ratio": ratio(sf["iops"], lf["iops"])}
        # Cold start: the local directory's cache deleted (another host's view).
        shutil.rmtree(os.path.join(sh_.ds, "cache"), ignore_errors=True)
        _drop_caches()
        sh_.start()
        try:
            first = _first_read_ms(sh_.uri("d"))
            again = _first_read_ms(sh_.uri("d"))
            logs = os.path.join(work, "coldlogs")
            os.makedirs(logs, exist_ok=True)
            cr, samples = _fio_iops_log(sh_.uri("d"), "randread", "4k", 16, rt * 2, size, logs,
                                        "cold")
        finally:
            sh_.stop()
        warm = sr["iops"]
        full_at = next((t for t, v in samples if v >= 0.9 * warm), None)
        out["cold_start"] = {"first_read_ms": first, "warm_read_ms": again,
                             "seconds_to_90pct_of_warm": full_at,
                             "cold_run_iops": round(cr["iops"]), "warm_iops": round(warm),
                             "iops_per_250ms_first_8": [v for _, v in samples[:8]]}
    finally:
        weed.terminate()
        weed.wait()
    return out


# ---------------------------------------------------------------------------
# Reports: results.md (one table per case) and SVG plots next to results.json.
# ---------------------------------------------------------------------------

def _n(v, nd=0):
    if v is None:
        return "—"
    if isinstance(v, (int, float)):
        return f"{v:,.{nd}f}"
    return str(v)


def _flat(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _md_generic(name, data):
    rows = ["| key | value |", "|---|---|"]
    rows += [f"| {k} | {v} |" for k, v in _flat(data)]
    return rows


def _md_matrix(m):
    cells, peers = m["params"]["cells"], m["params"]["peers"]
    p = m["params"]
    out = [f"Disk {p['size']}, {p['runtime_s']} s per cell, iodepth {p['iodepth']}. "
           f"IOPS (MiB/s); ratio = strata IOPS / qemu-nbd {peers[0]} IOPS for the same cell and state."]
    types = m["params"]["types"]
    for st in ("empty", "full"):
        out += ["", f"**{st}** disks — cells: IOPS (MiB/s) ×ratio", "",
                "| cell | " + " | ".join(f"strata {t}" for t in types)
                + " | " + " | ".join(f"qemu-nbd {p}" for p in peers) + " |",
                "|---|" + "---|" * (len(types) + len(peers))]
        for c in cells:
            row = []
            for typ in types:
                v = m["strata"][typ][st][c]
                row.append(f"{_n(v['iops'])} ({_n(v['mib_s'], 1)}) ×{_n(m['ratios'][peers[0]][typ][st][c], 2)}")
            for peer in peers:
                v = m["peers"][peer][st][c]
                row.append(f"{_n(v['iops'])} ({_n(v['mib_s'], 1)})")
            out.append(f"| {c.replace('_', ' ')} | " + " | ".join(row) + " |")
    return out


def _md_chain(c):
    p = c["params"]
    out = [f"Disk {p['size']}, {p['slice_mib']} MiB overwritten after each snapshot, "
           f"{p['workload']}, {p['runtime_s']} s each.", "",
           "Growing: N snapshots (strata) / N overlays above the base (qcow2).", "",
           "| N | strata randread | qcow2 randread | ratio | strata randwrite | qcow2 randwrite | ratio |",
           "|---|---|---|---|---|---|---|"]
    for k in sorted(c["strata"]["growing"], key=int):
        a, b = c["strata"]["growing"][k], c["qcow2"]["growing"].get(k, {})
        out.append(f"| {k} | {_n(a['randread_iops'])} | {_n(b.get('randread_iops'))} | "
                   f"{_n(ratio(a['randread_iops'], b.get('randread_iops') or 0), 2)} | "
                   f"{_n(a['randwrite_iops'])} | {_n(b.get('randwrite_iops'))} | "
                   f"{_n(ratio(a['randwrite_iops'], b.get('randwrite_iops') or 0), 2)} |")
    out += ["", "After deleting the oldest snapshots one by one (N left). qcow2 delete = "
            "`qemu-img commit` of the first overlay into the base + `qemu-img rebase -u` of the next.", "",
            "| N left | strata delete ms | strata randread | strata randwrite | qcow2 delete ms | qcow2 randread | qcow2 randwrite |",
            "|---|---|---|---|---|---|---|"]
    for k in sorted(c["strata"]["after_delete"], key=int, reverse=True):
        a, b = c["strata"]["after_delete"][k], c["qcow2"]["after_delete"].get(k, {})
        out.append(f"| {k} | {_n(a['delete_ms'], 1)} | {_n(a['randread_iops'])} | {_n(a['randwrite_iops'])} | "
                   f"{_n(b.get('delete_ms'), 1)} | {_n(b.get('randread_iops'))} | {_n(b.get('randwrite_iops'))} |")
    return out


def _md_clone(c):
    p = c["params"]
    out = [f"Source {p['size']}, filled; {p['slice_mib']} MiB overwritten after each snapshot. "
           f"strata: `{p['strata']}`; qcow2: `{p['qcow2']}`.", "",
           "| snapshots | strata s | qcow2 s | qcow2 / strata |", "|---|---|---|---|"]
    for k in sorted(c["strata_s"], key=int):
        out.append(f"| {k} | {_n(c['strata_s'][k], 3)} | {_n(c['qcow2_s'].get(k), 3)} | "
                   f"{_n(c['ratio_qcow2_over_strata'].get(k), 2)} |")
    return out


def _md_formats(c):
    p = c["params"]
    kinds = ("native", "vmfsSparse", "seSparse", "qcow2")
    out = [f"Disk {p['size']}, filled, then N snapshots each overwriting {p['slice_mib']} MiB; "
           f"{p['workload']}, {p['runtime_s']} s each. native = strata disk with N snapshots; "
           "vmfsSparse/seSparse = `strata export --chain` of that history served by `strata serve --vmdk` "
           "(flat base + N+1 deltas); qcow2 = backing chain of N overlays under qemu-nbd (+1 throwaway overlay).", "",
           "| N | " + " | ".join(f"{k} randread" for k in kinds) + " | " + " | ".join(f"{k} randwrite" for k in kinds) + " |",
           "|---|" + "---|" * (2 * len(kinds))]
    for n in sorted(c["native"], key=int):
        row = [_n(c[k].get(n, c[k].get(str(n), {})).get("randread_iops")) for k in kinds]
        row += [_n(c[k].get(n, c[k].get(str(n), {})).get("randwrite_iops")) for k in kinds]
        out.append(f"| {n} | " + " | ".join(row) + " |")
    out += ["", "randread relative to the same kind at N = 0:", "",
            "| N | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    rel = c["relative_to_depth0"]
    for n in sorted(c["native"], key=int):
        out.append(f"| {n} | " + " | ".join(_n(rel[k].get(n, rel[k].get(str(n))), 2) for k in kinds) + " |")
    return out


def write_markdown(results, path):
    lines = [f"# strata bench results ({'quick' if results.get('quick') else 'full'} mode)", "",
             f"Machine: {results['machine']['cpus']} CPUs, `{results['machine']['uname']}`", ""]
    special = {"matrix": _md_matrix, "chain": _md_chain, "clone": _md_clone, "formats": _md_formats}
    for name, data in results["cases"].items():
        lines += [f"## {name}", ""]
        lines += special.get(name, lambda d: _md_generic(name, d))(data)
        lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_plots(results, outdir):
    import plot
    cases, made = results["cases"], []
    mode = "quick" if results.get("quick") else "full"
    if "chain" in cases:
        c = cases["chain"]

        def pts(side, phase, key):
            d = c[side][phase]
            return [(int(k), d[k][key]) for k in sorted(d, key=int)]
        panels = []
        for phase, xl in (("growing", "snapshots / backing-chain depth N"),
                          ("after_delete", "snapshots left after deleting oldest first")):
            for key, lab in (("randread_iops", "4k random read"), ("randwrite_iops", "4k random write")):
                panels.append({"title": f"{lab} — {phase.replace('_', ' ')}", "xlabel": xl,
                               "ylabel": "IOPS", "series": [
                                   {"name": "strata", "points": pts("strata", phase, key), "color": plot.PALETTE[0]},
                                   {"name": "qemu-nbd qcow2 chain", "points": pts("qcow2", phase, key),
                                    "color": plot.PALETTE[1], "dash": "6,3"}]})
        plot.line_chart(os.path.join(outdir, "chain.svg"),
                        f"IOPS vs snapshot depth ({c['params']['size']} disk, {mode} mode)", panels)
        made.append("chain.svg")
    if "clone" in cases:
        c = cases["clone"]
        series = [{"name": "strata clone --full", "points": [(int(k), v) for k, v in sorted(c["strata_s"].items(), key=lambda x: int(x[0]))]},
                  {"name": "qemu-img convert -O qcow2 (chain top)", "dash": "6,3",
                   "points": [(int(k), v) for k, v in sorted(c["qcow2_s"].items(), key=lambda x: int(x[0]))]}]
        plot.line_chart(os.path.join(outdir, "clone.svg"),
                        f"Full-clone time vs snapshot count ({c['params']['size']} source, {mode} mode)",
                        [{"title": "wall time of the copy", "xlabel": "snapshots / chain depth of the source",
                          "ylabel": "seconds", "series": series, "xticks": sorted(int(k) for k in c["strata_s"])}],
                        cols=1, pw=640, ph=380)
        made.append("clone.svg")
    if "matrix" in cases:
        m = cases["matrix"]
        cells, peer = m["params"]["cells"], m["params"]["peers"][0]
        rows, grid = [], []
        for typ in m["params"]["types"]:
            for st in ("empty", "full"):
                rows.append(f"{typ} {st}")
                grid.append([m["ratios"][peer][typ][st][c] for c in cells])
        cols = [f"{c.split('_')[0]} {c.split('_')[1]}\n{c.split('_')[2]}" for c in cells]
        plot.heat_table(os.path.join(outdir, "matrix.svg"),
                        f"strata IOPS / qemu-nbd {peer} IOPS, per cell ({m['params']['size']}, {mode} mode)",
                        rows, cols, grid,
                        note="green: strata faster; red: slower. Rows: strata disk type and state; "
                             f"the peer is a {peer} image in the same state.")
        made.append("matrix.svg")
    if "fragmentation" in cases:
        pl = cases["fragmentation"]["placement"]
        ks = sorted(pl["regions"]["growing_together"]["per_disk"], key=int)
        series = [{"name": f"placement: {p}", "color": plot.PALETTE[i],
                   "points": [(int(k), pl[p]["growing_together"]["per_disk"][k]) for k in ks]}
                  for i, p in enumerate(("arrival", "regions"))]
        plot.line_chart(os.path.join(outdir, "fragmentation.svg"),
                        f"Fragments per disk vs disks growing together ({mode} mode)",
                        [{"title": "64k sequential writes at iodepth 4, all disks at once",
                          "xlabel": "disks written together",
                          "ylabel": "fragments per disk", "series": series, "xticks": [int(k) for k in ks]}],
                        cols=1, pw=640, ph=380)
        made.append("fragmentation.svg")
    if "zeroing" in cases:
        z = cases["zeroing"]
        panels = []
        for i, typ in enumerate(("thin", "zeroedthick", "eagerzeroedthick")):
            if typ not in z:
                continue
            d = z[typ]
            peer_key = next(k for k in d if k.startswith("qemu_raw_"))
            panels.append({"title": f"{typ}: 4k first writes", "xlabel": "seconds", "ylabel": "IOPS",
                           "series": [
                               {"name": f"strata {typ}", "color": plot.PALETTE[0],
                                "points": [(w["t_s"], w["iops"]) for w in d["windows"]]},
                               {"name": peer_key.replace("_", " "), "color": plot.PALETTE[1], "dash": "6,3",
                                "points": [(w["t_s"], w["iops"]) for w in d[peer_key]["windows"]]}]})
        size_mib = _bytes(z["params"]["size"]) >> 20
        panels.append({"title": "grains written at least once (strata)", "xlabel": "seconds",
                       "ylabel": "% of the disk", "series": [
                           {"name": typ, "color": plot.PALETTE[i], "dash": plot.DASHES[i % len(plot.DASHES)],
                            "points": [(x["t_s"], round(100 * x["allocated_mib"] / size_mib, 1))
                                       for x in z[typ]["windows"]]}
                           for i, typ in enumerate(("thin", "zeroedthick")) if typ in z]})
        plot.line_chart(os.path.join(outdir, "zeroing.svg"),
                        f"The zeroing phase ({z['params']['size']} disks, {mode} mode)", panels)
        made.append("zeroing.svg")
    if "formats" in cases:
        f = cases["formats"]
        kinds = [("native", "strata native"), ("vmfsSparse", "VMFSsparse chain"),
                 ("seSparse", "SEsparse chain"), ("qcow2", "qcow2 chain (qemu-nbd)")]
        panels = []
        for key, lab in (("randread_iops", "4k random read"), ("randwrite_iops", "4k random write")):
            series = []
            for i, (k, name) in enumerate(kinds):
                d = f[k]
                series.append({"name": name, "color": plot.PALETTE[i], "dash": plot.DASHES[i % len(plot.DASHES)],
                               "points": [(int(n), d[n][key]) for n in sorted(d, key=int)]})
            panels.append({"title": lab, "xlabel": "snapshots / delta links above the base",
                           "ylabel": "IOPS", "series": series})
        plot.line_chart(os.path.join(outdir, "formats.svg"),
                        f"Same history, four formats ({f['params']['size']} disk, {mode} mode)", panels,
                        cols=1, pw=900, ph=320)
        made.append("formats.svg")
    return made


def render(results, out_json):
    outdir = os.path.dirname(os.path.abspath(out_json))
    results = json.loads(json.dumps(results))  # integer keys become strings, as on disk
    write_markdown(results, os.path.join(outdir, "results.md"))
    made = write_plots(results, outdir)
    print(f"report: {os.path.join(outdir, 'results.md')} " + " ".join(made))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, short runs (a few minutes)")
    ap.add_argument("--smoke", action="store_true",
                    help="--quick at each case's smallest size and shortest run: checks that every "
                         "figure is still produced (make test), measures nothing worth keeping")
    ap.add_argument("--only", help="comma-separated cases (an existing --out file of the same kind keeps its other cases): " + ",".join(CASES))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results.json"))
    ap.add_argument("--workdir", help="where to put datastores and images (default: a temp dir)")
    ap.add_argument("--render", metavar="JSON",
                    help="only rewrite results.md and the SVGs next to JSON from its contents")
    ap.add_argument("--chain-max", type=int, help="chain: stop at this depth (default quick 4, full 32)")
    a = ap.parse_args()
    global CHAIN_MAX, SMOKE
    CHAIN_MAX = a.chain_max
    SMOKE = a.smoke
    a.quick = a.quick or a.smoke
    if a.render:
        with open(a.render) as f:
            render(json.load(f), a.render)
        return
    for tool in ("fio", "qemu-nbd", "qemu-img"):
        if not shutil.which(tool):
            sys.exit(f"bench: {tool} is missing (run scripts/install-deps.sh)")
    if not os.path.exists(STRATA):
        sys.exit(f"bench: {STRATA} not built (make build)")
    cases = a.only.split(",") if a.only else list(CASES)
    # Fail now, not after an hour of measuring, if the results cannot be written.
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    work = a.workdir or tempfile.mkdtemp(prefix="strata-bench-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    results = {"machine": {"cpus": os.cpu_count(), "uname": " ".join(os.uname())},
               "quick": a.quick, "smoke": a.smoke, "case_s": {}, "cases": {}}
    try:
        for c in cases:
            print(f"== {c}", flush=True)
            case_dir = os.path.join(work, c)
            os.makedirs(case_dir, exist_ok=True)
            t_case = time.time()
            try:
                results["cases"][c] = CASES[c](case_dir, a.quick)
                results["case_s"][c] = round(time.time() - t_case, 1)
            finally:
                # Each case's images go before the next: the full run needs
                # 64 GiB for the RSS case alone.
                shutil.rmtree(case_dir, ignore_errors=True)
            print(json.dumps(results["cases"][c], indent=2), flush=True)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    if a.only and os.path.exists(a.out):
        # A run of some cases updates those cases in the file and keeps the
        # others (from a run of the same kind: quick or full).
        with open(a.out) as f:
            before = json.load(f)
        if before.get("quick") == a.quick and before.get("smoke", False) == a.smoke:
            before["cases"].update(results["cases"])
            before.setdefault("case_s", {}).update(results["case_s"])
            before["machine"] = results["machine"]
            results = before
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"results in {a.out}")
    render(results, a.out)


if __name__ == "__main__":
    main()
