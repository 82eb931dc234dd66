"""The `groupsnap` case (issue 26): what a consistency-group snapshot of 2,
8 and 32 disks costs the clients writing to them, against QEMU's own
multi-disk cut (a QMP `transaction` of `blockdev-snapshot-sync` on
qemu-storage-daemon's qcow2 nodes, the primitive libvirt's atomic
disk-only snapshots use)."""
import json
import os
import socket
import subprocess
import threading
import time
from statistics import median

from ..common import ratio, sh, smoke, wait_path
from ..servers import Strata

PERIOD_S = 0.2  # a group snapshot every 200 ms while fio writes
WRITERS = 4     # fio jobs (one disk each), whatever the group's size


def fio_lat(uris, runtime):
    """fio randwrite 4k, iodepth 4, one job per URI: (p99, p99.9, max)
    completion latency in µs over all jobs, and I/Os done."""
    args = ["fio", "--ioengine=nbd", "--rw=randwrite", "--bs=4k", "--iodepth=4",
            "--size=64M", "--time_based", f"--runtime={runtime}", "--randrepeat=0",
            "--output-format=json", "--group_reporting", "--percentile_list=50:99:99.9"]
    for i, u in enumerate(uris):
        args += [f"--name=w{i}", f"--uri={u}"]
    out = sh(*args)
    w = json.loads(out[out.index("{"):])["jobs"][0]["write"]
    p = w["clat_ns"]["percentile"]
    us = lambda ns: round(ns / 1000)
    return {"p50_us": us(p["50.000000"]), "p99_us": us(p["99.000000"]),
            "p99_9_us": us(p["99.900000"]), "max_us": us(w["clat_ns"]["max"]),
            "ios": w["total_ios"], "errors": 0}


def under_fio(uris, runtime, cut):
    """fio on `uris` while `cut()` runs every PERIOD_S (None: no cuts);
    returns fio's figures and the cuts' results."""
    res, cuts, stop = {}, [], threading.Event()

    def run():
        res.update(fio_lat(uris, runtime))
        stop.set()

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)  # fio connected and writing
    while cut and not stop.is_set():
        cuts.append(cut())
        stop.wait(PERIOD_S)
    t.join()
    return res, cuts


class Qmp:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.f = self.s.makefile("rw")
        json.loads(self.f.readline())  # greeting
        self.cmd("qmp_capabilities")

    def cmd(self, name, **args):
        self.f.write(json.dumps({"execute": name, "arguments": args}) + "\n")
        self.f.flush()
        while True:
            r = json.loads(self.f.readline())
            if "return" in r:
                return r["return"]
            if "error" in r:
                raise RuntimeError(f"{name}: {r['error']}")


def strata_run(work, n, runtime):
    s = Strata(os.path.join(work, f"strata{n}")).start()
    try:
        disks = [f"d{i:02}" for i in range(n)]
        for d in disks:
            s.cli("create", d, "--size", "64M")
        s.cli("group", "create", "g", *disks)
        uris = [s.uri(d) for d in disks[:WRITERS]]
        base, _ = under_fio(uris, runtime, None)
        k = [0]

        def cut():
            k[0] += 1
            t = time.perf_counter()
            r = json.loads(s.cli("group", "snapshot", "g", f"s{k[0]}", "--json"))
            return (time.perf_counter() - t, r["pause_us"])

        loaded, cuts = under_fio(uris, runtime, cut)
    finally:
        s.stop()
    pauses = sorted(p for _, p in cuts)
    return base, loaded, {
        "group_snapshots": len(cuts),
        "command_ms_p50": round(median(c for c, _ in cuts) * 1000, 1),
        "pause_us_p50": pauses[len(pauses) // 2],
        "pause_us_max": pauses[-1],
    }


def qsd_run(work, n, runtime):
    d = os.path.join(work, f"qsd{n}")
    os.makedirs(d, exist_ok=True)
    sock, qmp_path = os.path.join(d, "nbd.sock"), os.path.join(d, "qmp.sock")
    args = ["qemu-storage-daemon", "--nbd-server", f"addr.type=unix,addr.path={sock}",
            "--chardev", f"socket,id=qmp,path={qmp_path},server=on,wait=off",
            "--monitor", "chardev=qmp"]
    for i in range(n):
        img = os.path.join(d, f"d{i:02}.qcow2")
        sh("qemu-img", "create", "-q", "-f", "qcow2", img, "64M")
        args += ["--blockdev", f"driver=file,node-name=f{i},filename={img}",
                 "--blockdev", f"driver=qcow2,node-name=q{i},file=f{i}",
                 "--export", f"type=nbd,id=e{i},node-name=q{i},name=d{i:02},writable=on"]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_path(sock, proc=p)
        wait_path(qmp_path, proc=p)
        qmp = Qmp(qmp_path)
        uris = [f"nbd+unix:///d{i:02}?socket={sock}" for i in range(min(n, WRITERS))]
        base, _ = under_fio(uris, runtime, None)
        k = [0]

        def cut():
            # One transaction: every drive drained, flushed and pivoted to
            # a new overlay, as libvirt's --atomic disk-only snapshot.
            k[0] += 1
            actions = [{"type": "blockdev-snapshot-sync",
                        "data": {"node-name": f"q{i}" if k[0] == 1 else f"o{i}-{k[0] - 1}",
                                 "snapshot-file": os.path.join(d, f"d{i:02}-{k[0]}.qcow2"),
                                 "snapshot-node-name": f"o{i}-{k[0]}", "format": "qcow2"}}
                       for i in range(n)]
            t = time.perf_counter()
            qmp.cmd("transaction", actions=actions)
            return (time.perf_counter() - t, None)

        loaded, cuts = under_fio(uris, runtime, cut)
    finally:
        p.terminate()
        p.wait()
    return base, loaded, {"group_snapshots": len(cuts),
                          "command_ms_p50": round(median(c for c, _ in cuts) * 1000, 1)}


def case_groupsnap(work, q):
    """For groups of 2, 8 and 32 disks: fio randwrite 4k (iodepth 4 on each
    of up to 4 member disks) alone, then with a group snapshot every
    200 ms; the clients' p99, p99.9 and max completion latency in both
    runs, how long strata held I/O (pause_us, as the command reports it)
    and the command's time. The peer takes the same cuts on
    qemu-storage-daemon (qcow2 nodes over NBD): a QMP transaction of
    blockdev-snapshot-sync, QEMU's atomic multi-disk snapshot. Same cache
    mode on both sides (host page cache), no flush asked by fio."""
    runtime = smoke(3, 10)
    out = {"params": {"fio": "randwrite 4k, iodepth 4 per disk, host page cache",
                      "writers": WRITERS, "period_ms": int(PERIOD_S * 1000), "runtime_s": runtime}}
    for n in smoke((2, 8), (2, 8, 32)):
        sb, sl, sc = strata_run(work, n, runtime)
        qb, ql, qc = qsd_run(work, n, runtime)
        out[f"{n}_disks"] = {
            "strata": {"without": sb, "with": sl, **sc},
            "qsd_transaction": {"without": qb, "with": ql, **qc},
            "p99_9_added_us": {"strata": sl["p99_9_us"] - sb["p99_9_us"],
                               "qsd": ql["p99_9_us"] - qb["p99_9_us"]},
            "p99_9_ratio_qsd_over_strata": ratio(ql["p99_9_us"], sl["p99_9_us"]),
            "max_ratio_qsd_over_strata": ratio(ql["max_us"], sl["max_us"]),
        }
    return out
