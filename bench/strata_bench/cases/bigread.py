"""The `bigread` case: 64k and 1M sequential reads of a half-written disk
vs qemu-nbd raw."""
import os

from ..common import ratio, size_bytes
from ..fio import fill, fio
from ..servers import Strata, peer_raw


def case_bigread(work, q):
    """Large reads (issue 8 item 2: a read is one pass over the map): 64 KiB
    and 1 MiB sequential reads of a disk whose first half is written and
    second half is a hole, vs qemu-nbd raw with the same layout. Compare
    builds with STRATA=/path/to/strata."""
    size = "1G" if q else "4G"
    half = f"{size_bytes(size) // 2 >> 20}M"
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
