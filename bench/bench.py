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
  stats       4k randread with per-disk statistics on vs --no-stats     [>= 0.98]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATA = os.environ.get("STRATA", os.path.join(ROOT, "target/release/strata"))


def sh(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


def wait_path(p, timeout=30):
    t = time.time()
    while not os.path.exists(p):
        if time.time() - t > timeout:
            raise RuntimeError(f"{p} did not appear")
        time.sleep(0.02)


class Strata:
    def __init__(self, work, cache="128M", serve_args=()):
        self.serve_args = list(serve_args)
        self.ds = os.path.join(work, "ds")
        self.sock = os.path.join(work, "strata.sock")
        self.cache = cache
        self.proc = None
        if not os.path.exists(os.path.join(self.ds, "strata.super")):
            self.cli("init")

    def cli(self, *args):
        return sh(STRATA, "--datastore", self.ds, "--cache", self.cache, *args)

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        self.proc = subprocess.Popen(
            [STRATA, "--datastore", self.ds, "--cache", self.cache, "serve", "--nbd-unix", self.sock]
            + self.serve_args,
            stdout=subprocess.DEVNULL,
        )
        wait_path(self.sock)
        wait_path(os.path.join(self.ds, "control.sock"))
        return self

    def stop(self):
        if self.proc:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait()
            self.proc = None

    def uri(self, name):
        return f"nbd+unix:///{name}?socket={self.sock}"

    def rss_peak_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0


class QemuNbd:
    def __init__(self, path, fmt, sock):
        self.path, self.fmt, self.sock = path, fmt, sock
        self.proc = None

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        self.proc = subprocess.Popen(
            ["qemu-nbd", "-f", self.fmt, "-k", self.sock, "-x", "disk", "--discard=unmap",
             "--cache=writeback", "-e", "8", "-t", self.path],
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
    return {"iops": side["iops"], "bw_mib": side["bw_bytes"] / 2**20}


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


def case_stats(work, q):
    """Throughput with per-disk statistics on and off (issue #3: <= 2% cost)."""
    size = "1G" if q else "4G"
    rt = 6 if q else 15
    on, off = [], []
    s = Strata(os.path.join(work, "st"))
    s.start()
    try:
        s.cli("create", "d", "--size", size)
        fill(s.uri("d"), size)
    finally:
        s.stop()
    # Alternate on/off three times and compare medians: run-to-run noise on
    # a shared 2-core machine is larger than the effect being measured.
    for _ in range(3):
        for args, acc in (([], on), (["--no-stats"], off)):
            s.serve_args = args
            s.start()
            try:
                acc.append(fio(s.uri("d"), "randread", "4k", runtime=rt)["iops"])
            finally:
                s.stop()
    a, b = sorted(on)[1], sorted(off)[1]
    return {"randread_4k_stats_on_iops": round(a), "stats_off_iops": round(b),
            "runs_on": [round(x) for x in on], "runs_off": [round(x) for x in off],
            "ratio": ratio(a, b), "target": ">= 0.98"}


CASES = {
    "depth": lambda w, q: case_depth(w, q),
    "randwrite": lambda w, q: case_simple(w, q, "randwrite", "4k", False, ">= 1.0"),
    "randread": lambda w, q: case_simple(w, q, "randread", "4k", True, ">= 0.95"),
    "seqwrite": lambda w, q: case_simple(w, q, "write", "512k", False, ">= 0.9", iodepth=8),
    "snaptime": lambda w, q: case_snaptime(w, q),
    "rss": lambda w, q: case_rss(w, q),
    "stats": lambda w, q: case_stats(w, q),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, short runs (a few minutes)")
    ap.add_argument("--only", help="comma-separated cases: " + ",".join(CASES))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results.json"))
    ap.add_argument("--workdir", help="where to put datastores and images (default: a temp dir)")
    a = ap.parse_args()
    for tool in ("fio", "qemu-nbd", "qemu-img"):
        if not shutil.which(tool):
            sys.exit(f"bench: {tool} is missing (run scripts/install-deps.sh)")
    if not os.path.exists(STRATA):
        sys.exit(f"bench: {STRATA} not built (make build)")
    cases = a.only.split(",") if a.only else list(CASES)
    work = a.workdir or tempfile.mkdtemp(prefix="strata-bench-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    results = {"machine": {"cpus": os.cpu_count(), "uname": " ".join(os.uname())},
               "quick": a.quick, "cases": {}}
    try:
        for c in cases:
            print(f"== {c}", flush=True)
            case_dir = os.path.join(work, c)
            os.makedirs(case_dir, exist_ok=True)
            try:
                results["cases"][c] = CASES[c](case_dir, a.quick)
            finally:
                # Each case's images go before the next: the full run needs
                # 64 GiB for the RSS case alone.
                shutil.rmtree(case_dir, ignore_errors=True)
            print(json.dumps(results["cases"][c], indent=2), flush=True)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"results in {a.out}")


if __name__ == "__main__":
    main()
