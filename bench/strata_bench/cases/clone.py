"""The `clone` case (paper suite): `strata clone --full` time vs the
source's snapshot count, vs `qemu-img convert -O qcow2` of a chain of the
same depth. Each copy runs REPEATS times, after the host has written back
what came before (the source's fill, the last copy): the median goes in
strata_s / qcow2_s, every run in "<count>_runs" beside it."""
import os
from statistics import median

from ..chains import qcow_history, slice_mib, strata_history
from ..common import ratio, repeats, sh, smoke, sync_host, timed
from ..servers import Strata


REPEATS = 3


def _timed_runs(copy, remove):
    """The seconds of REPEATS copies, each after a sync, each removed after."""
    runs = []
    for _ in range(repeats(REPEATS)):
        sync_host()
        runs.append(round(timed(copy) / 1000, 3))
        remove()
    return runs


def _put(d, k, runs):
    d[k] = median(runs)
    d[f"{k}_runs"] = runs


def case_clone(work, q):
    size = smoke("64M", "256M" if q else "1G")
    counts = [0, 2, 4] if q else list(range(13))
    maxk = counts[-1]
    sl = slice_mib(size, maxk)
    res = {"params": {"size": size, "snapshot_counts": counts, "slice_mib": sl,
                      "strata": "strata clone --full SRC NEW (thin), wall time of the CLI",
                      "qcow2": "qemu-img convert -t writeback -O qcow2 TOP new.qcow2 (flushed at "
                               "the end, as strata's clone is; convert's default cache, unsafe, "
                               "is not)",
                      "repeats": repeats(REPEATS)}}
    st = {}
    s = Strata(os.path.join(work, "strata")).start()
    try:
        s.cli("create", "src", "--size", size)
        for k in strata_history(s, "src", size, maxk):
            if k in counts:
                _put(st, k, _timed_runs(lambda: s.cli("clone", "--full", "src", f"c{k}"),
                                        lambda: s.cli("rm", f"c{k}")))
    finally:
        s.stop()
    d = os.path.join(work, "qcow2")
    os.makedirs(d, exist_ok=True)
    sock = os.path.join(d, "q.sock")
    qc = {}
    for k, chain in qcow_history(d, sock, size, maxk):
        if k in counts:
            out = os.path.join(d, "out.qcow2")
            _put(qc, k, _timed_runs(lambda: sh("qemu-img", "convert", "-t", "writeback", "-O", "qcow2",
                                                     chain[-1], out),
                                    lambda: os.unlink(out)))
    res["strata_s"] = st
    res["qcow2_s"] = qc
    res["ratio_qcow2_over_strata"] = {k: ratio(qc[k], st[k]) for k in counts}
    return res
