"""The `move` case (issue 13, Storage vMotion): a served disk moves to
another local datastore, idle and under a write load."""
import json
import os
import signal
import subprocess
import time
from statistics import median

from ..common import STRATA, drop_caches, ratio, sh, smoke
from ..fio import fill, fio_log
from ..servers import Strata


def _fio_load(uri, size, logprefix, runtime, rate_iops=None):
    """4k random writes (iodepth 16, optionally at a fixed rate) as a
    Popen, logging every completion (its time and latency)."""
    rate = [f"--rate_iops={rate_iops}"] if rate_iops else []
    return subprocess.Popen(
        ["fio", "--name=load", "--ioengine=nbd", f"--uri={uri}", "--rw=randwrite", "--bs=4k",
         "--iodepth=16", f"--size={size}", f"--runtime={runtime}", "--time_based",
         "--randrepeat=0", "--output-format=json", f"--write_lat_log={logprefix}"] + rate,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _window(done, t_from, t_to):
    """(IOPS, longest latency in ms, p99 in ms) of the completions in
    (t_from, t_to]."""
    xs = sorted(ms for t, ms in done if t_from < t <= t_to)
    span = t_to - t_from
    p99 = round(xs[int(len(xs) * 0.99)], 2) if xs else 0
    return (round(len(xs) / span) if span > 0 else None), round(xs[-1] if xs else 0, 2), p99


def _loaded_move(s, size, logs, tag, base_rt, to, rate_iops=None):
    """The load alone for base_rt s, then the same load with a move to `to`
    starting 2 s in (fio stops 1 s after it ends): the move's report and
    the load's IOPS / p100 / p99 without and during the move."""
    drop_caches()
    p = _fio_load(s.uri("d"), size, os.path.join(logs, f"{tag}base"), base_rt, rate_iops)
    p.communicate()
    # Past fio's first second (start-up), like the loaded run's window.
    base = _window(fio_log(os.path.join(logs, f"{tag}base_clat.1.log"), 1e6), 1.0, base_rt)
    drop_caches()
    t0 = time.perf_counter()
    p = _fio_load(s.uri("d"), size, os.path.join(logs, f"{tag}move"), 900, rate_iops)
    time.sleep(2)
    t_from = time.perf_counter() - t0
    moved = json.loads(s.cli("move", "d", "--to", to, "--json"))
    t_to = time.perf_counter() - t0
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    p.communicate()
    # fio's clock starts a little after Popen: the window is its move.
    during = _window(fio_log(os.path.join(logs, f"{tag}move_clat.1.log"), 1e6), t_from, t_to)
    return moved, base, during


def case_move(work, q):
    """Issue 13: `strata move` of a served, full disk to another local
    datastore (same file system), idle and under 4k random writes (fio
    nbd, iodepth 16). Figures: the move's time under load vs idle; the
    longest client write latency while it ran (p100: the switch's pause
    is in it) and the server's own switch_ms, vs the longest latency of the
    same load without a move; client IOPS during the move vs the same load
    without one [>= 0.7]. Host page cache dropped before each run."""
    size = smoke("64M", "256M" if q else "2G")
    base_rt = smoke(3, 5 if q else 15)
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    s = Strata(os.path.join(work, "home")).start()
    dest = os.path.join(work, "dest")
    sh(STRATA, "--datastore", dest, "init")
    out = {"params": {"size": size, "load": "fio nbd 4k randwrite iodepth 16",
                      "target": "another local datastore on the same file system"}}
    try:
        s.cli("create", "d", "--size", size)
        fill(s.uri("d"), size)
        idle = []
        for to in (dest, s.ds):
            drop_caches()
            idle.append(json.loads(s.cli("move", "d", "--to", to, "--json")))
        moved, base, during = _loaded_move(s, size, logs, "full", base_rt, dest)
        out.update({
            "idle_move_s": [round(r["seconds"], 2) for r in idle],
            "idle_switch_ms": [round(r["switch_ms"], 2) for r in idle],
            "loaded_move_s": round(moved["seconds"], 2),
            "loaded_vs_idle": ratio(moved["seconds"], median(r["seconds"] for r in idle)),
            "loaded_passes": moved["passes"], "loaded_mirrored": moved["mirrored"],
            "loaded_copied_mib": round(moved["copied_bytes"] / 2**20),
            "switch_ms": round(moved["switch_ms"], 2),
            "iops_without_move": base[0], "iops_during_move": during[0],
            "ratio_during_move": ratio(during[0], base[0]),
            "p100_write_ms_without_move": base[1], "p100_write_ms_during_move": during[1],
            "p99_write_ms_without_move": base[2], "p99_write_ms_during_move": during[2],
            "target": ">= 0.7 (IOPS during the move vs the same load without)",
        })
        # A VM's load rather than all the machine can do: 4k random
        # writes at a fixed rate, moved back home.
        rate = 5000
        moved, base, during = _loaded_move(s, size, logs, "paced", base_rt, s.ds, rate)
        out["paced"] = {
            "rate_iops": rate, "move_s": round(moved["seconds"], 2),
            "passes": moved["passes"], "mirrored": moved["mirrored"],
            "switch_ms": round(moved["switch_ms"], 2),
            "iops_without_move": base[0], "iops_during_move": during[0],
            "ratio_during_move": ratio(during[0], base[0]),
            "p100_write_ms_without_move": base[1], "p100_write_ms_during_move": during[1],
            "p99_write_ms_without_move": base[2], "p99_write_ms_during_move": during[2],
        }
    finally:
        s.stop()
    return out
