"""The `queues` case (issue 29, item 3): how throughput grows with the
queues of a vhost-user-blk export and the connections of an NBD export,
against qemu-storage-daemon and qemu-nbd given the same counts."""
import os
import shutil
from statistics import median

from ..common import cpu_of, drop_caches, random_raw, ratio, sh, smoke, wait_path
from ..fio import fill, fio
from ..servers import QemuNbd, Strata, drive_vhost, qsd_vhost, vhost_harness

COUNTS = (1, 2, 4)


def case_queues(work, q):
    """4k cold random reads at QD 16 per queue (per connection), with 1, 2
    and 4 of them, `--cache none` against QEMU's cache=none aio=native
    peers on a raw file of the same size (both written full first; the
    host's caches dropped before each run; median of the passes, the
    order of the servers alternating).

    vhost-user-blk: strata `serve --vhost-queues 4` and qsd
    `num-queues=4` (in its main loop, and in an iothread with QEMU's
    adaptive polling); the frontend harness (`vhost_bench ... queues=N`)
    sets up N of them and drives them all from one thread (one vCPU's
    worth), pinned to CPU 0, the backends to CPU 1.
    NBD: fio's nbd engine with N jobs, each its own connection (qemu-nbd
    -e 8 shares the export), not pinned.

    Per count: IOPS, server CPU per read, the ratio to the peer, and the
    gain over one queue (IOPS at N / IOPS at 1). On this 2-core machine
    added queues add no CPU: what grows is what one queue's path leaves
    unused (device depth, batching), and what a queue costs shows."""
    size = smoke("256M", "1G" if q else "2G")
    rt = smoke(2, 5 if q else 8)
    passes = 1 if q else 3
    return {"params": {"size": size, "runtime_s": rt, "passes": passes,
                       "iodepth_per_queue": 16, "counts": list(COUNTS),
                       "strata": "serve --cache none (--aio io_uring)",
                       "peers": "qsd / qemu-nbd, cache.direct=on / --cache=none, aio=native"},
            "vhost": _vhost(work, size, rt, passes),
            "nbd": _nbd(work, size, rt, passes)}


def _summary(runs, *peers):
    """Per count: medians, ratio to each of `peers`, gain over count 1."""
    out = {}
    for n in COUNTS:
        row = {}
        for who, by_n in runs.items():
            rs = by_n[n]
            row[who] = {"iops": round(median(r["iops"] for r in rs)),
                        "iops_passes": [round(r["iops"]) for r in rs],
                        "server_cpu_us_per_io": median(r["cpu"] for r in rs)}
        for peer in peers:
            row["ratio_vs_" + peer] = ratio(row["strata"]["iops"], row[peer]["iops"])
        out[str(n)] = row
    for who in runs:
        one = out["1"][who]["iops"]
        for n in COUNTS:
            out[str(n)][who]["gain_over_1"] = ratio(out[str(n)][who]["iops"], one)
    return out


def _alternating(who_all, passes, run):
    """Every count for every side, `passes` times, the sides' order
    alternating and the host's caches dropped before each run. `who_all`
    maps a side to (server pid, address); `run(address, n)` is one run at
    count n: (its result, the requests it made). Each result gets the
    server's CPU per request as "cpu". The results, by side and count."""
    runs = {w: {n: [] for n in COUNTS} for w in who_all}
    for p in range(passes):
        for n in COUNTS:
            order = list(who_all) if p % 2 == 0 else list(reversed(list(who_all)))
            for who in order:
                pid, addr = who_all[who]
                drop_caches()
                c0 = cpu_of(pid)
                r, requests = run(addr, n)
                r["cpu"] = round((cpu_of(pid) - c0) / max(requests, 1) * 1e6, 2)
                runs[who][n].append(r)
    return runs


def _vhost(work, size, rt, passes):
    harness = vhost_harness()
    d = os.path.join(work, "queues_vhost")
    os.makedirs(d, exist_ok=True)
    vsock = os.path.join(d, "strata.vhost")
    qsock = os.path.join(d, "qsd.vhost")
    raw = os.path.join(d, "raw.img")
    s = Strata(os.path.join(d, "strata"),
               serve_args=["--cache", "none", "--vhost-user-blk", f"d={vsock}",
                           "--vhost-queues", str(max(COUNTS))])
    s.cli("create", "d", "--size", size)
    s.start()
    qsd = qsdi = None
    try:
        sh("taskset", "-pac", "1", str(s.proc.pid))
        wait_path(vsock)
        fill(s.uri("d"), size)
        random_raw(raw, size)
        qsd = qsd_vhost(raw, qsock, "cache.direct=on,aio=native,locking=off", max(COUNTS))
        isock = os.path.join(d, "qsd_iothread.vhost")
        qsdi = qsd_vhost(raw, isock, "cache.direct=on,aio=native,locking=off", max(COUNTS),
                         iothread=True)
        who_all = {"strata": (s.proc.pid, vsock), "qsd_native": (qsd.pid, qsock),
                   "qsd_native_iothread": (qsdi.pid, isock)}

        def run(sock, n):
            r = drive_vhost(harness, sock, "randread", 4096, 16, rt, f"queues={n}")
            assert r["errors"] == 0, f"{sock}, {n} queues: requests failed"
            return r, r["ops"]

        return _summary(_alternating(who_all, passes, run), "qsd_native", "qsd_native_iothread")
    finally:
        for p in (qsd, qsdi):
            if p is not None:
                p.terminate()
                p.wait()
        s.stop()
        shutil.rmtree(d, ignore_errors=True)


def _nbd(work, size, rt, passes):
    d = os.path.join(work, "queues_nbd")
    os.makedirs(d, exist_ok=True)
    raw = os.path.join(d, "raw.img")
    s = Strata(os.path.join(d, "strata"), serve_args=["--cache", "none"])
    s.cli("create", "d", "--size", size)
    s.start()
    qn = None
    try:
        fill(s.uri("d"), size)
        random_raw(raw, size)
        qn = QemuNbd(raw, "raw", os.path.join(d, "q.sock"), cache="none", aio="native").start()
        who_all = {"strata": (s.proc.pid, s.uri("d")), "qemu_native": (qn.proc.pid, qn.uri())}

        def run(uri, n):
            r = fio(uri, "randread", "4k", iodepth=16, runtime=rt, size=size,
                    extra=[f"--numjobs={n}"])
            return r, r["ios"]

        return _summary(_alternating(who_all, passes, run), "qemu_native")
    finally:
        if qn is not None:
            qn.stop()
        s.stop()
        shutil.rmtree(d, ignore_errors=True)
