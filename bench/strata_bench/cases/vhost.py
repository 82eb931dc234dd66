"""The `vhost` case (issue 11): strata's vhost-user-blk export vs
qemu-storage-daemon's, driven by the same userspace frontend, with strata
over NBD and FUSE beside it."""
import os
from statistics import median

from ..common import cpu_of, random_raw, ratio, sh, smoke, wait_path
from ..fio import fill, fio, fio_file
from ..servers import Strata, drive_vhost, qsd_vhost, vhost_harness


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
    export's file), same CPU split, are printed beside it for reference.
    Workloads: 4k random read and write at QD 16, 512k sequential read
    and write at QD 16 (strata's pass and qsd's alternate, the median of
    three in full mode)."""
    size = smoke("256M", "1G")
    rt = smoke(1, 4 if q else 8)
    passes = 1 if q else 3
    harness = vhost_harness()
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
        random_raw(raw, "1G")
        qsd = qsd_vhost(raw, qsock, "cache.direct=off,aio=threads")

        def drive(sock, rw, bs):
            return drive_vhost(harness, sock, rw, bs, 16, rt)

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
                x = fio_file(os.path.join(mnt, "d"), rw, bs, runtime=rt, engine="libaio", cpu=0)
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
