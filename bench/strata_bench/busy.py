"""Client writes beside background work, as the reclaim, spacework and
fragmentation cases measure them: one trial runs the same fio job with
nothing running and beside the work (`busy_trial`; `job_trial` for a
server job), and `busy_summary` takes the medians over trials."""
import json
import os
import threading
import time
from statistics import median

from .common import drop_caches, ratio
from .fio import fio_iops_log, window_iops


def busy_trial(s, k, tag, rt, size, logs, start, finished):
    """One trial of client writes beside background work: fio 64 KiB random
    writes (iodepth 16) on an empty thin disk with nothing running, then
    `start()` and at once the same job on another empty thin disk, while a
    thread polls `finished()` to time the work. `busy_iops_window` counts
    the part of the busy job the work lasted (fio's 250 ms IOPS log),
    against the same span from the start of the idle job (like with like:
    both spans hold fio's start-up and the host's first writeback, which
    on this VM runs at 5-15k IOPS for a second or more before 30k), and,
    strictly, against the idle job's median 250 ms sample. The host's page
    cache is written out and dropped before each job."""
    for n in (f"idle{k}", f"busy{k}"):
        s.cli("create", n, "--size", size)
    # Like with like: each job starts with the host's page cache written
    # out and dropped. Without it the busy job, run second, paid for the
    # idle job's data on its own: with nothing running beside it, a 2 GiB
    # busy job ran at 0.23x the idle one (this VM's page cache growing into
    # memory it had not touched yet: 49% of the server's time in the
    # kernel's copy into the cache); with both dropped, 0.95x.
    drop_caches()
    idle, idle_s = fio_iops_log(s.uri(f"idle{k}"), "randwrite", "64k", 16, rt, size, logs,
                                f"{tag}idle{k}")
    drop_caches()
    cpu0 = s.cpu_seconds()
    t0 = time.perf_counter()
    start()
    done = {}

    def watch():
        while not finished():
            time.sleep(0.1)
        done["s"] = round(time.perf_counter() - t0, 2)
    th = threading.Thread(target=watch, daemon=True)
    th.start()
    t_fio = time.perf_counter() - t0
    busy, busy_s = fio_iops_log(s.uri(f"busy{k}"), "randwrite", "64k", 16, rt, size, logs,
                                f"{tag}busy{k}")
    cpu = s.cpu_seconds() - cpu0
    th.join(timeout=600)
    win = max(0.5, min(rt, done.get("s", rt) - t_fio))
    for n in (f"idle{k}", f"busy{k}"):
        s.cli("rm", n)
    return {"work_s": done.get("s"), "idle_iops": round(idle["iops"]),
            "busy_iops": round(busy["iops"]),
            "idle_iops_median": round(median(v for _, v in idle_s)),
            "idle_iops_window": window_iops(idle_s, 0, win),
            "busy_iops_window": window_iops(busy_s, 0, win),
            "server_cpu_s_busy_job": round(cpu, 2),
            "load_avg": round(os.getloadavg()[0], 2)}


def job_trial(s, k, tag, rt, size, logs, *args):
    """`busy_trial` with `strata ARGS --detach` as the work, finished when
    its job is no longer listed as running."""
    job = {}

    def finished():
        jobs = json.loads(s.cli("jobs", "--json"))
        state = next((j for j in jobs if j["id"] == job["id"]), {"state": "done"})["state"]
        return state in ("done", "failed", "cancelled")
    return busy_trial(s, k, tag, rt, size, logs,
                      lambda: job.update(json.loads(s.cli(*args, "--detach", "--json"))), finished)


def busy_summary(runs, work):
    """Medians over trials of `busy_trial`; `work` names the background
    work in the keys (`{work}_s`, `ratio_during_{work}`)."""
    for r in runs:
        r[f"{work}_s"] = r.pop("work_s")
    med = lambda key: median(r[key] or 0 for r in runs)
    return {"trials": runs, f"{work}_s": med(f"{work}_s"),
            "idle_iops": med("idle_iops"), "busy_iops": med("busy_iops"),
            "ratio_whole_job": ratio(med("busy_iops"), med("idle_iops")),
            f"ratio_during_{work}": ratio(med("busy_iops_window"), med("idle_iops_window")),
            f"ratio_during_{work}_vs_idle_median": ratio(med("busy_iops_window"),
                                                         med("idle_iops_median")),
            "load_avg": med("load_avg"),
            "target": f">= 0.8 (during_{work}: the same span of the idle job)"}
