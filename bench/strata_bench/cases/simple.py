"""The `randwrite`, `randread` and `seqwrite` cases: one fio job on strata
vs the same job on qemu-nbd raw (writes to an empty disk, reads of a full
one)."""
import os

from ..common import ratio
from ..fio import fill, fio
from ..servers import Strata, peer_raw


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
    return {"strata_vs_qemu_nbd_raw": {"strata_iops": mine["iops"], "qemu_iops": peer["iops"],
                                        "strata_mib_s": round(mine["bw_mib"], 1),
                                        "qemu_mib_s": round(peer["bw_mib"], 1),
                                        "ratio": ratio(mine["iops"], peer["iops"]), "target": target}}
