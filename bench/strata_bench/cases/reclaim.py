"""The `reclaim` case: client writes while a removed disk is reclaimed, vs
the same writes with nothing reclaiming [>= 0.8]."""
import json
import os
import time

from ..busy import busy_summary, busy_trial
from ..common import smoke
from ..fio import fio
from ..servers import Strata


def case_reclaim(work, q):
    """Client writes while a removed disk is reclaimed (issue 9 item 6).

    Each trial writes a disk of `data` by 4k random writes (every grain
    once, as the matrix's write cells leave it, so its pool grains are
    scattered) and flushes it; then `busy_trial` with the removal of that
    disk as the background work, finished when `status` shows nothing
    reclaiming (a reclaim of 2 GiB takes about a second). Medians over the
    trials; the machine's load average is recorded with them."""
    data = smoke("256M", "1G" if q else "2G")
    size, rt = "4G", smoke(2, 4)
    trials = smoke(1, 2 if q else 3)
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    runs = []
    s = Strata(os.path.join(work, "reclaim")).start()
    reclaiming = lambda: json.loads(s.cli("status", "--json"))["reclaiming"]
    try:
        for k in range(trials):
            s.cli("create", "big", "--size", data)
            fio(s.uri("big"), "randwrite", "4k", size=data, extra=["--end_fsync=1"])
            # Nothing left to reclaim from the previous trial.
            while reclaiming():
                time.sleep(0.1)
            runs.append(busy_trial(s, k, "", rt, size, logs, lambda: s.cli("rm", "big"),
                                   lambda: not reclaiming()))
    finally:
        s.stop()
    return {"removed_disk": data, "job": f"64k randwrite iodepth 16, {rt} s, empty thin {size}",
            **busy_summary(runs, "reclaim")}
