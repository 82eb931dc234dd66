"""The `spacework` case: client writes while convert fills or scans
another disk, vs nothing running [>= 0.8]."""
import json
import os

from ..busy import busy_summary, busy_trial
from ..servers import Strata


def case_spacework(work, q):
    """Client writes while convert runs on another disk (issue 9 item 6): the
    eager fill (thin -> eagerzeroedthick: zeros written for real) and the
    zero scan (eagerzeroedthick -> thin: punchzero over every grain), each
    started with --detach as a server job and finished when `strata jobs`
    says so; `busy_trial` with medians over the trials."""
    bg = "2G" if q else "4G"
    size, rt = "4G", 6
    trials = 2 if q else 3
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    out = {"background_disk": bg, "job": f"64k randwrite iodepth 16, {rt} s, empty thin {size}"}
    s = Strata(os.path.join(work, "spacework")).start()

    def ended(job_id):
        j = next((j for j in json.loads(s.cli("jobs", "--json")) if j["id"] == job_id), None)
        return j is None or j["state"] in ("done", "failed", "cancelled")
    try:
        for phase, frm, to in (("fill", "thin", "eagerzeroedthick"),
                               ("scan", "eagerzeroedthick", "thin")):
            runs = []
            for k in range(trials):
                s.cli("create", "bg", "--size", bg, "--type", frm)
                job = {}
                start = lambda: job.update(json.loads(
                    s.cli("convert", "bg", "--type", to, "--detach", "--json")))
                runs.append(busy_trial(s, k, phase, rt, size, logs, start,
                                       lambda: ended(job["id"])))
                s.cli("rm", "bg")
            out[phase] = {"convert_to": to, **busy_summary(runs, "convert")}
    finally:
        s.stop()
    return out
