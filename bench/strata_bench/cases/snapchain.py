"""The `snapchain` case (make paper, seed 002): six workloads of the
snapshot paper vs snapshot depth, on one disk history kept as a native
strata disk, as the VMDK chains strata exports and serves, and as a qcow2
backing chain under qemu-nbd; then the 16k mixed job after each delete.
Depth 0 is a disk with no snapshot at all; depth n has exactly n, and the
benchmark writes into the newest level, as the paper's VMs did. Every
cell runs REPEATS times, the workloads taking turns (so a drift of the
machine spreads over all of them): the median, and the runs beside it as
KEY_runs."""
import json
import os
import shutil

from ..chains import qcow_delete_oldest, qcow_history, slice_mib, strata_history
from ..common import ratio, repeats, sh, size_bytes, smoke, sync_host, timed, with_runs
from ..servers import QemuNbd, Strata, VmdkServe

REPEATS = 3


def workloads(size):
    """name -> fio job options (after the global ones): 4 jobs, each its own
    NBD connection, iodepth 32 each (128 in flight: the paper's fio had
    `-iodepth=32 -numjobs=4`, and fio's iodepth is per job); the
    sequential ones start each job at its own quarter of the disk."""
    quarter = f"{size_bytes(size) >> 22}M"
    seq = [f"--size={quarter}", f"--offset_increment={quarter}"]
    four = ["--numjobs=4", "--iodepth=32", "--group_reporting"]
    return {
        "randrw_4k": ["--name=w", "--rw=randrw", "--bs=4k", *four],
        "readwrite_4k": ["--name=w", "--rw=readwrite", "--bs=4k", *four, *seq],
        "mixed_16k": ["--name=w", "--rw=randrw", "--percentage_random=50", "--bs=16k", *four],
        "read_512k": ["--name=w", "--rw=read", "--bs=512k", *four, *seq],
        "write_512k": ["--name=w", "--rw=write", "--bs=512k", *four, *seq],
        # HammerDB's analog: 70/30 8k random data I/O over three quarters of
        # the disk beside a log written 4k at a time with a flush after each
        # write over the last quarter (the page judges the data job: the
        # log's writes/s rise when the data job slows).
        "oltp": ["--name=data", "--rw=randrw", "--rwmixread=70", "--bs=8k", "--iodepth=32",
                 f"--size={3 * (size_bytes(size) >> 22)}M",
                 "--name=log", "--rw=write", "--bs=4k", "--iodepth=1", "--fsync=1",
                 f"--offset={3 * (size_bytes(size) >> 22)}M", f"--size={quarter}"],
        # Table 5's Redis (appendonly) as its worker node's disk saw it
        # (Table 4): 220 writes/s of about 45 KB (the append-only file,
        # flushed once a second) and 150 reads/s of about 33 KB, paced;
        # what a snapshot could change is their latency.
        "redis": ["--name=aof", "--rw=write", "--bs=48k", "--rate_iops=220", "--iodepth=1",
                  "--fsync=220", f"--offset={3 * (size_bytes(size) >> 22)}M", f"--size={quarter}",
                  "--name=rdb", "--rw=randread", "--bs=32k", "--rate_iops=150", "--iodepth=1",
                  f"--size={3 * (size_bytes(size) >> 22)}M"],
    }


def _run(uri, name, args, rt):
    """One workload: both sides' IOPS (the jobs of a name summed)."""
    # --smoke (rt 0): a few MiB per job instead of whole seconds.
    span = ["--time_based", f"--runtime={rt}"] if rt else ["--io_size=2M"]
    out = sh("fio", "--ioengine=nbd", f"--uri={uri}", "--output-format=json", *span,
             "--randrepeat=0", *args)
    jobs = json.loads(out[out.index("{"):])["jobs"]
    if name == "oltp":
        data = next(j for j in jobs if j["jobname"] == "data")
        log = next(j for j in jobs if j["jobname"] == "log")
        lw = round(log["write"]["iops"], 1)
        return {"log_writes_s": lw, "data_iops": round(data["read"]["iops"] + data["write"]["iops"], 1),
                "iops": lw}
    if name == "redis":
        ios = [(j[d]["total_ios"], j[d]["lat_ns"]["mean"]) for j in jobs for d in ("read", "write")
               if j[d]["total_ios"]]
        n = sum(k for k, _ in ios)
        if not n:
            raise RuntimeError(f"snapchain: redis did no I/O on {uri}")
        return {"lat_ms": round(sum(k * m for k, m in ios) / n / 1e6, 4),
                "iops": round(sum(j[d]["iops"] for j in jobs for d in ("read", "write")), 1)}
    r = sum(j["read"]["iops"] for j in jobs)
    w = sum(j["write"]["iops"] for j in jobs)
    if r + w <= 0:
        raise RuntimeError(f"snapchain: {name} did no I/O on {uri}")
    return {"read_iops": round(r, 1), "write_iops": round(w, 1), "iops": round(r + w, 1)}


def _measure(uri, wl, rt, only=None):
    """Each workload REPEATS times, the workloads taking turns, each run
    after the host has written back what came before (the fill, the
    exports, the last run's writes): a cell never shares the device with
    an earlier one's writeback. Per workload: the median of each figure
    and its runs as KEY_runs."""
    runs = {}
    for _ in range(repeats(REPEATS)):
        for n, a in wl.items():
            if only is None or n in only:
                sync_host()
                runs.setdefault(n, []).append(_run(uri, n, a, rt))
    return {n: with_runs(rs, 4) for n, rs in runs.items()}


def _export(s, path, sub, chain=True):
    """`strata export --chain` of d's live head as SUB links: the flat
    base, a delta per later snapshot and the head's delta on top, the link
    a VM would write into (n snapshots: n deltas over the base, as a VMFS
    VM's). Without CHAIN (a disk with no snapshot): one monolithicFlat
    file. Returns the descriptor to open (the last "open" line)."""
    if chain:
        out = s.cli("export", "d", path, "--chain", "--subformat", sub)
    else:
        out = s.cli("export", "d", path, "--subformat", "monolithicFlat")
    return _open_line(out)


def _open_line(out):
    tops = [ln.split(None, 1)[1].strip() for ln in out.splitlines() if ln.startswith("open ")]
    if not tops or not os.path.exists(tops[-1]):
        raise RuntimeError(f"snapchain: no top link in the output of export: {out!r}")
    return tops[-1]


def case_snapchain(work, q):
    """Seed 002's workloads at snapshot depths 0..12: 4k random and
    sequential read/write (figures 1, 2), 16k half-random read/write
    (5, 6), 512k sequential reads and writes (7, 8) and an OLTP analog of
    HammerDB (4), each 4 fio jobs at iodepth 32, time-based, and table 5's
    Redis as its disk I/O (paced appends and reads, their latency). The history:
    the disk filled, then each snapshot followed by a slice overwritten in
    1M writes. At depth n (n snapshots; 0: none) every format is measured
    as a VM would be, the benchmark writing into the newest level: native,
    on the live disk; vmfsSparse and seSparse, `strata export --chain` of
    the live head (at depth 0 one monolithicFlat file) served by `strata
    serve --vmdk` (a copy, removed after); qcow2, the chain's top under
    qemu-nbd (at depth 0 the base alone). Then, on the native disk and the
    qcow2 chain, snapshots deleted oldest first (qcow2: commit of the
    first overlay and rebase of the next), the 16k job after each delete
    that leaves a measured depth, with the delete's time."""
    size = smoke("64M", "256M" if q else "1G")
    rt = smoke(0, 1)
    depths = smoke([0, 1], [0, 1, 2, 4] if q else [0, 1, 2, 4, 8, 12])
    maxd = depths[-1]
    sl = slice_mib(size, maxd)
    wl = workloads(size)
    fmts = ["native", "vmfsSparse", "seSparse", "qcow2"]
    res = {"params": {"disk": size, "runtime_s": rt, "depths": depths, "slice_mib": sl,
                      "formats": fmts, "repeats": repeats(REPEATS), "baseline": "with no snapshot",
                      "workloads": {n: " ".join(a) for n, a in wl.items()}}}
    for f in fmts:
        res[f] = {"growing": {}}
    s = Strata(os.path.join(work, "strata")).start()
    try:
        s.cli("create", "d", "--size", size)
        for n in strata_history(s, "d", size, maxd):
            if n not in depths:
                continue
            # Export before measuring: the measurement writes to the disk.
            # Each depth's chains are measured and removed before the next
            # (a full-size flat base each).
            for sub in ("vmfsSparse", "seSparse"):
                res[sub]["growing"][n] = _on_vmdk(s, work, sub, wl, rt, chain=n > 0)
            res["native"]["growing"][n] = _measure(s.uri("d"), wl, rt)
        print("   native, vmfsSparse, seSparse growing done", flush=True)
        shrink = {}
        for n in range(1, maxd + 1):
            ms = timed(lambda: s.cli("snapshot", "delete", "d", f"s{n}"))
            if maxd - n in depths:
                shrink[maxd - n] = dict(_measure(s.uri("d"), wl, rt, only=("mixed_16k",)),
                                        delete_ms=ms)
        res["native"]["after_delete"] = shrink
        print("   native deleting done", flush=True)
    finally:
        s.stop()
    shutil.rmtree(s.ds, ignore_errors=True)
    d = os.path.join(work, "qcow2")
    os.makedirs(d, exist_ok=True)
    sock = os.path.join(d, "q.sock")
    for n, chain in qcow_history(d, sock, size, maxd):
        if n in depths:
            res["qcow2"]["growing"][n] = _on_qcow2(chain[-1], sock, wl, rt)
    shrink = {}
    for n in range(1, maxd + 1):
        ms = qcow_delete_oldest(chain)
        if maxd - n in depths:
            shrink[maxd - n] = dict(_on_qcow2(chain[-1], sock, wl, rt, only=("mixed_16k",)),
                                    delete_ms=ms)
    res["qcow2"]["after_delete"] = shrink
    shutil.rmtree(d, ignore_errors=True)
    print("   qcow2 done", flush=True)
    d0, d1 = depths[0], depths[1]
    res["loss_at_1"] = {f: {w: round(1 - ratio(res[f]["growing"][d1][w]["iops"],
                                               res[f]["growing"][d0][w]["iops"]), 3) for w in wl}
                        for f in fmts}
    return res


def _on_qcow2(top, sock, wl, rt, only=None):
    """The workloads on the chain's top `top` under qemu-nbd, writing into it."""
    qn = QemuNbd(top, "qcow2", sock).start()
    try:
        return _measure(qn.uri(), wl, rt, only)
    finally:
        qn.stop()


def _on_vmdk(s, work, sub, wl, rt, chain=True):
    """The workloads on `strata serve --vmdk` of d's history exported as a
    SUB chain (without CHAIN: one flat file); the files removed after."""
    exports = os.path.join(work, f"export-{sub}")
    os.makedirs(exports)
    try:
        v = VmdkServe(exports, _export(s, os.path.join(exports, "d.vmdk"), sub, chain)).start()
        try:
            return _measure(v.uri(), wl, rt)
        finally:
            v.stop()
    finally:
        shutil.rmtree(exports, ignore_errors=True)
