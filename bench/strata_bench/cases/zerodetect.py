"""The `zerodetect` case: 4k random writes of random data, zero detection
on vs off [>= 0.97]."""
import os
import shutil
from statistics import median

from ..common import ratio
from ..fio import fio
from ..servers import Strata


def case_zerodetect(work, q):
    """The cost of zero detection on writes that are not zeros (issue 9:
    >= 0.97): 4k random writes of random data to a thin disk, detection on
    vs off, alternating servers in the same run, median of the pairs."""
    size = "1G" if q else "4G"
    pairs, rt = (3, 6) if q else (5, 15)
    res = {"on": [], "off": []}
    for i in range(pairs):
        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
            d = os.path.join(work, f"zd_{mode}")
            shutil.rmtree(d, ignore_errors=True)
            s = Strata(d, serve_args=["--detect-zeroes", mode]).start()
            try:
                s.cli("create", "d", "--size", size)
                r = fio(s.uri("d"), "randwrite", "4k", runtime=rt, size=size,
                        extra=["--refill_buffers", "--randrepeat=0"])
                res[mode].append(round(r["iops"]))
            finally:
                s.stop()
    on, off = median(res["on"]), median(res["off"])
    return {"size": size, "runtime_s": rt, "iops_on": res["on"], "iops_off": res["off"],
            "ratio_on_vs_off": ratio(on, off), "target": ">= 0.97"}
