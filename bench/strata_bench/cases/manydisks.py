"""The `manydisks` case (issue 29, item 5): 64 disks served by one strata
server, each driven at QD 4 by its own client, against 64 qemu-nbd
processes each serving one raw file."""
import json
import os
import shutil
from statistics import median

from ..common import cpu_of, proc_status_kib, ratio, sh, smoke
from ..servers import QemuNbd, Strata

DISKS = 64
IODEPTH = 4


def _fio_many(uris, rw, bs, runtime=None, size=None, jobfile=None):
    """One fio run with a job per URI (each its own NBD connection, QD 4),
    reported as one group: IOPS, and completion-latency percentiles over
    every request of every job."""
    lines = ["[global]", "ioengine=nbd", f"rw={rw}", f"bs={bs}", f"iodepth={IODEPTH}",
             "group_reporting=1"]
    if runtime:
        lines += [f"runtime={runtime}", "time_based=1"]
    if size:
        lines += [f"size={size}"]
    for i, u in enumerate(uris):
        lines += [f"[d{i}]", f"uri={u}"]
    with open(jobfile, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = sh("fio", "--output-format=json", jobfile)
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["read"] if "read" in rw else job["write"]
    pct = side["clat_ns"].get("percentile", {})
    return {"iops": side["iops"],
            "p50_us": round(pct.get("50.000000", 0) / 1e3, 1),
            "p99_us": round(pct.get("99.000000", 0) / 1e3, 1),
            "p99_9_us": round(pct.get("99.900000", 0) / 1e3, 1)}


def case_manydisks(work, q):
    """64 thin disks of one datastore behind one `strata serve` (the
    default writeback cache), against 64 `qemu-nbd` processes (writeback,
    aio=threads, their defaults) each on a raw file of the same size.
    Each disk is written full first (1M sequential writes from all 64 at
    once), then 64 clients (fio's nbd engine, one job and one connection
    per disk, QD 4 each: 256 requests in flight) run a 4k random read and
    a 4k random write, one after the other. Reported: aggregate IOPS, p50,
    p99 and p99.9 completion latency over all requests, server CPU per
    request, and the memory held: strata's resident set against the sum
    of the 64 qemu-nbd processes'. Median of the passes; the order of the
    two sides alternates."""
    size = smoke("16M", "32M" if q else "64M")
    rt = smoke(2, 5 if q else 10)
    passes = 1 if q else 5
    runs = {"strata": {"randread": [], "randwrite": []},
            "qemu_nbd": {"randread": [], "randwrite": []}}
    mem = {"strata": [], "qemu_nbd": []}
    for p in range(passes):
        order = ("strata", "qemu_nbd") if p % 2 == 0 else ("qemu_nbd", "strata")
        for who in order:
            d = os.path.join(work, f"{who}_{p}")
            os.makedirs(d, exist_ok=True)
            jobfile = os.path.join(d, "jobs.fio")
            procs = []
            try:
                if who == "strata":
                    s = Strata(os.path.join(d, "s"))
                    for i in range(DISKS):
                        s.cli("create", f"d{i}", "--size", size)
                    s.start()
                    procs.append(s)
                    uris = [s.uri(f"d{i}") for i in range(DISKS)]
                    pids = [s.proc.pid]
                else:
                    uris, pids = [], []
                    for i in range(DISKS):
                        f = os.path.join(d, f"d{i}.raw")
                        sh("truncate", "-s", size, f)
                        qn = QemuNbd(f, "raw", os.path.join(d, f"q{i}.sock")).start()
                        procs.append(qn)
                        uris.append(qn.uri())
                        pids.append(qn.proc.pid)
                _fio_many(uris, "write", "1M", size=size, jobfile=jobfile)
                for rw in ("randread", "randwrite"):
                    c0 = sum(cpu_of(x) for x in pids)
                    r = _fio_many(uris, rw, "4k", runtime=rt, size=size, jobfile=jobfile)
                    r["server_cpu_us_per_io"] = round(
                        (sum(cpu_of(x) for x in pids) - c0) / max(r["iops"] * rt, 1) * 1e6, 2)
                    runs[who][rw].append(r)
                mem[who].append(sum(proc_status_kib(x, "VmRSS") for x in pids))
            finally:
                for x in procs:
                    x.stop()
                shutil.rmtree(d, ignore_errors=True)
    out = {"params": {"disks": DISKS, "iodepth_per_disk": IODEPTH, "disk_size": size,
                      "runtime_s": rt, "passes": passes, "cache": "writeback (both)",
                      "qemu": "one qemu-nbd -f raw --cache=writeback per disk"}}
    for who in runs:
        out[who] = {"rss_kib": round(median(mem[who]))}
        for rw, rs in runs[who].items():
            out[who][rw] = {k: median(r[k] for r in rs) for k in rs[0]}
            out[who][rw]["iops_passes"] = [round(r["iops"]) for r in rs]
    for rw in ("randread", "randwrite"):
        out[f"ratio_{rw}_iops"] = ratio(out["strata"][rw]["iops"], out["qemu_nbd"][rw]["iops"])
        out[f"ratio_{rw}_p99"] = ratio(out["strata"][rw]["p99_us"], out["qemu_nbd"][rw]["p99_us"])
    out["ratio_rss"] = ratio(out["strata"]["rss_kib"], out["qemu_nbd"]["rss_kib"])
    out["target"] = ">= 1.0x the IOPS of 64 qemu-nbd processes, p99 no worse"
    return out
