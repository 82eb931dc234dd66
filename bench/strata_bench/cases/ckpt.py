"""The `ckpt` case: 4k random-write latency percentiles while checkpoints
run (small metadata cache), vs qemu-nbd raw."""
import json
import os

from ..common import ratio, sh
from ..servers import Strata, peer_raw


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
