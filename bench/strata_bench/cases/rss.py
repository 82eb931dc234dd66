"""The `rss` case: the server's peak RSS after writing and reading a large
disk [<= 256 MiB at 64 GiB]."""
import os

from ..fio import fill, fio
from ..servers import Strata


def case_rss(work, q):
    size = "8G" if q else "64G"
    s = Strata(os.path.join(work, "rss")).start()
    try:
        s.cli("create", "big", "--size", size)
        fill(s.uri("big"), size)
        fio(s.uri("big"), "randread", "4k", runtime=5 if q else 20)
        peak = s.rss_peak_kib()
    finally:
        s.stop()
    return {"disk": size, "rss_peak_mib": round(peak / 1024, 1), "target": "<= 256 MiB at 64G"}
