"""The `cachenone` case (issue 11, item 5): `serve --cache none` vs QEMU's
cache=none peers, over NBD (qemu-nbd) and vhost-user-blk
(qemu-storage-daemon)."""
import os
import shutil
from functools import partial
from statistics import median

from ..common import cpu_of, drop_caches, random_raw, ratio, sh, size_bytes, smoke, wait_path
from ..fio import fill, fio, fio_file
from ..servers import QemuNbd, Strata, drive_vhost, qsd_vhost, vhost_harness


def case_cachenone(work, q):
    """Issue 11, item 5: `serve --cache none` (the pool with O_DIRECT)
    against qemu-nbd --cache=none on a raw file, with QEMU's two usual
    aio modes (threads, its default, and native, what libvirt pairs with
    cache=none). fio's nbd engine, QD 16, one connection. Each pass, for
    each server in turn (the order alternates): a durable 512k sequential
    write of a fresh disk (end_fsync), then the server is stopped, the
    host's caches dropped and the server started again, and a 4k random
    read of the now full disk runs cold (strata's metadata cache starts
    empty too). Between the two, a 4k random overwrite of the full disk
    (QD 16, ending with an fsync): strata's writes in place, through the
    ring under `--aio io_uring`. Median of the passes.

    The limit (issue 29) runs in the same passes: fio with io_uring and
    O_DIRECT straight on a raw file in the same file system, the same
    jobs, the same dropped caches and final fsync. So does strata with
    `--aio io_uring` (its READs through a ring per connection;
    `strata_uring`), beside `--aio threads` (`strata`, a thread each),
    and with `--aio native` (a Linux native AIO context per connection;
    `strata_native`)."""
    size = smoke("256M", "1G" if q else "2G")
    rt = smoke(2, 5 if q else 10)
    passes = 1 if q else 3
    who_all = ("strata", "strata_uring", "strata_native", "qemu_threads", "qemu_native", "limit")
    runs = {w: {"write": [], "read": [], "overwrite": []} for w in who_all}
    cold = True
    for p in range(passes):
        order = who_all if p % 2 == 0 else tuple(reversed(who_all))
        for who in order:
            d = os.path.join(work, f"{who}_{p}")
            srv = None  # the limit has none: fio opens the raw file itself
            if who.startswith("strata"):
                aio = {"strata_uring": "io_uring", "strata_native": "native"}.get(who, "threads")
                srv = Strata(d, serve_args=["--cache", "none", "--aio", aio])
                srv.cli("create", "d", "--size", size)
                job = partial(fio, srv.uri("d"))
            else:
                os.makedirs(d, exist_ok=True)
                f = os.path.join(d, "disk.raw")
                with open(f, "wb") as fh:
                    fh.truncate(size_bytes(size))
                if who == "limit":
                    job = partial(fio_file, f)
                else:
                    srv = QemuNbd(f, "raw", os.path.join(d, "q.sock"), cache="none",
                                  aio=who.split("_")[1])
                    job = partial(fio, srv.uri())
            try:
                if srv is not None:
                    srv.start()
                w = job("write", "512k", iodepth=16, size=size, extra=["--end_fsync=1"])
                runs[who]["write"].append(w["bw_mib"])
                o = job("randwrite", "4k", iodepth=16, runtime=rt, size=size,
                        extra=["--end_fsync=1"])
                runs[who]["overwrite"].append(o["iops"])
                if srv is not None:
                    srv.stop()
                cold = drop_caches() and cold
                if srv is not None:
                    srv.start()
                r = job("randread", "4k", iodepth=16, runtime=rt, size=size)
                runs[who]["read"].append(r["iops"])
            finally:
                if srv is not None:
                    srv.stop()
                shutil.rmtree(d, ignore_errors=True)
    out = {"params": {"size": size, "runtime_s": rt, "passes": passes, "iodepth": 16,
                      "caches_dropped": cold,
                      "qemu": "qemu-nbd -f raw --cache=none --aio=threads|native",
                      "limit": "fio --ioengine=io_uring --direct=1 on a raw file, same jobs"}}
    for who in who_all:
        out[who] = {"randread_4k_cold_iops": median(runs[who]["read"]),
                    "randread_4k_iops_passes": runs[who]["read"],
                    "seqwrite_512k_durable_mib_s": round(median(runs[who]["write"]), 1),
                    "seqwrite_512k_mib_s_passes": [round(x, 1) for x in runs[who]["write"]],
                    "randwrite_4k_overwrite_iops": median(runs[who]["overwrite"]),
                    "randwrite_4k_overwrite_iops_passes": runs[who]["overwrite"]}
    for peer in ("qemu_threads", "qemu_native", "limit"):
        for mine, tag in (("strata", ""), ("strata_uring", "uring_"),
                          ("strata_native", "native_")):
            out[f"ratio_{tag}randread_vs_{peer}"] = ratio(
                out[mine]["randread_4k_cold_iops"], out[peer]["randread_4k_cold_iops"])
            out[f"ratio_{tag}seqwrite_vs_{peer}"] = ratio(
                out[mine]["seqwrite_512k_durable_mib_s"], out[peer]["seqwrite_512k_durable_mib_s"])
            out[f"ratio_{tag}overwrite_vs_{peer}"] = ratio(
                out[mine]["randwrite_4k_overwrite_iops"], out[peer]["randwrite_4k_overwrite_iops"])
    # Five passes there: its cells are ratios to the limit, whose passes
    # spread most.
    out["vhost"] = _cachenone_vhost(work, q, size, rt, 1 if q else 5)
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
    512k sequential write that ends with a FLUSH (counted in its time).
    qsd runs aio=native twice: in its main loop, and with the export in
    an iothread, whose adaptive polling is QEMU's answer to the wake-ups
    strata's `--vhost-poll-us` saves.
    The limit: fio with io_uring and O_DIRECT on the raw file, on CPU 0
    as the harness, the same block size and depth (its write ends with an
    fsync), taking its turn in each pass among the servers. Five passes
    (one in quick mode). strata runs twice: with its default `--aio io_uring` (reads
    through a ring per queue; `strata`) and with `--aio threads`
    (`strata_threads`), each its own server and disk."""
    harness = vhost_harness()
    d = os.path.join(work, "vhost")
    os.makedirs(d, exist_ok=True)
    vsock = os.path.join(d, "strata.vhost")
    raw = os.path.join(d, "raw.img")
    tsock = os.path.join(d, "strata_threads.vhost")
    s = Strata(os.path.join(d, "strata"),
               serve_args=["--cache", "none", "--vhost-user-blk", f"d={vsock}",
                           "--vhost-queues", "1"])
    st = Strata(os.path.join(d, "strata_threads"),
                serve_args=["--cache", "none", "--aio", "threads", "--vhost-user-blk",
                            f"d={tsock}", "--vhost-queues", "1"])
    qsds = {}
    started = []
    try:
        for srv, sock in ((s, vsock), (st, tsock)):
            srv.cli("create", "d", "--size", size)
            srv.start()
            started.append(srv)
            sh("taskset", "-pac", "1", str(srv.proc.pid))
            wait_path(sock)
            fill(srv.uri("d"), size)
        random_raw(raw, size)
        for name, aio, iothread in (("qsd_threads", "threads", False),
                                    ("qsd_native", "native", False),
                                    ("qsd_native_iothread", "native", True)):
            sock = os.path.join(d, f"{name}.vhost")
            qsds[name] = (qsd_vhost(raw, sock, f"cache.direct=on,aio={aio},locking=off",
                                    iothread=iothread), sock)
        # One qsd at a time holds the file open for writing; all are
        # started, and the raw file's writes from any are the same bytes.
        who_all = {"strata": (s.proc.pid, vsock),
                   "strata_threads": (st.proc.pid, tsock),
                   **{name: (proc.pid, sock) for name, (proc, sock) in qsds.items()}}
        out = {"params": {"cpus": "harness on CPU 0, backend on CPU 1", "queues": 1, "iodepth": 16,
                          "qsd": "driver=file, cache.direct=on, aio=threads|native; "
                                 "native_iothread: the export in an iothread (its adaptive "
                                 "polling, poll-max-ns 32768)",
                          "strata": "serve --cache none, default --vhost-poll-us 32"}}
        for tag, rw, bs, extra in (("randread_4k_cold", "randread", 4096, []),
                                   ("seqwrite_512k_durable", "write", 524288, ["flush"])):
            runs = {w: [] for w in who_all}
            lim = []
            # The limit takes its turn in each pass like any server, so a
            # drift of the device's speed over the run (its 512k writes
            # varied by half between passes) falls on every side alike.
            everyone = [*who_all, "limit"]
            for p in range(passes):
                order = everyone if p % 2 == 0 else list(reversed(everyone))
                for who in order:
                    if who == "limit":
                        drop_caches()
                        lim.append(fio_file(raw, rw, bs, iodepth=16, runtime=rt,
                                            extra=["--end_fsync=1"] if extra else [], cpu=0))
                        continue
                    pid, sock = who_all[who]
                    drop_caches()
                    c0 = cpu_of(pid)
                    r = drive_vhost(harness, sock, rw, bs, 16, rt, *extra)
                    assert r["errors"] == 0, f"{who} {tag}: requests failed"
                    r["server_cpu_us_per_io"] = round((cpu_of(pid) - c0) / max(r["ops"], 1) * 1e6, 2)
                    runs[who].append(r)
            row = {w: {"iops": round(median(r["iops"] for r in rs)),
                       "iops_passes": [round(r["iops"]) for r in rs],
                       "mib_s": round(median(r["mib_s"] for r in rs), 1),
                       "server_cpu_us_per_io": median(r["server_cpu_us_per_io"] for r in rs)}
                   for w, rs in runs.items()}
            row["limit"] = {"iops": round(median(r["iops"] for r in lim)),
                            "iops_passes": [round(r["iops"]) for r in lim],
                            "mib_s": round(median(r["bw_mib"] for r in lim), 1)}
            for peer in ("qsd_threads", "qsd_native", "qsd_native_iothread", "limit"):
                row[f"ratio_vs_{peer}"] = ratio(row["strata"]["iops"], row[peer]["iops"])
            row["ratio_threads_vs_qsd_native"] = ratio(row["strata_threads"]["iops"],
                                                       row["qsd_native"]["iops"])
            out[tag] = row
        return out
    finally:
        for proc, _ in qsds.values():
            proc.terminate()
            proc.wait()
        for srv in started:
            srv.stop()
