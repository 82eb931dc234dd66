"""The `stats` case: the throughput cost of per-disk statistics, recording
vs paused within one fio run [>= 0.98]."""
import json
import os
import random
import subprocess
import time
from statistics import median

from ..common import example, sh, smoke, sync_host
from ..fio import fill, fio
from ..servers import Strata


def case_stats(work, q):
    """The throughput cost of per-disk statistics (issue #3: <= 2%).

    One long fio run (4k randread, iodepth 16) against one server, cut into
    blocks of two 2-second phases. In two blocks of three, one phase records
    and the other is paused (`strata stats d --resume/--pause`), in random
    order; in the third, both record: an A/A control that shows how far the
    method itself reads from 1.0 in the same run. fio logs IOPS per 250 ms
    window with wall-clock timestamps; windows inside a phase (not within
    150 ms of its start) count for it. The figure is the median over blocks
    of (mean IOPS recording / mean IOPS paused); the control's median is
    reported beside it. Random order keeps periodic work (writeback, the
    checkpointer) from lining up with one side. Paused, the wrapper loads one
    flag and forwards. With two or more CPUs the server runs on one and fio
    on another, so their threads do not trade places.

    Also measured: what recording one command costs in-process (the
    record_cost example), and that cost as a share of the server's CPU
    time per I/O over the same run.
    """
    size = smoke("256M", "1G" if q else "4G")
    total = smoke(12, 30 if q else 300)
    phase = 2.0
    rng = random.Random(2026)
    window_ms, margin_ms = 250, 150
    s = Strata(os.path.join(work, "st")).start()
    ncpu = os.cpu_count() or 1
    fio_pin = []
    if ncpu >= 2:
        os.sched_setaffinity(s.proc.pid, {ncpu - 1})
        for t in os.listdir(f"/proc/{s.proc.pid}/task"):
            os.sched_setaffinity(int(t), {ncpu - 1})
        fio_pin = ["taskset", "-c", "0"]
    log = os.path.join(work, "iops")
    flips = []
    try:
        s.cli("create", "d", "--size", size)
        fill(s.uri("d"), size)
        sync_host()
        fio(s.uri("d"), "randread", "4k", runtime=3)  # warm the caches
        s.cli("stats", "d", "--reset", "--resume")
        cpu0 = s.cpu_seconds()
        proc = subprocess.Popen(
            fio_pin + ["fio", "--name=b", "--ioengine=nbd", f"--uri={s.uri('d')}", "--rw=randread",
                       "--bs=4k", "--iodepth=16", "--output-format=json", f"--runtime={total}",
                       "--time_based", f"--write_iops_log={log}", f"--log_avg_msec={window_ms}",
                       "--log_unix_epoch=1"],
            stdout=subprocess.PIPE, text=True)
        # Each flip: (time, records?, block, kind); kind "ab" or "aa".
        block = 0
        while proc.poll() is None:
            kind = "aa" if block % 3 == 2 else "ab"
            modes = [True, False] if kind == "ab" else [True, True]
            rng.shuffle(modes)
            for on in modes:
                if proc.poll() is not None:
                    break
                s.cli("stats", "d", "--resume" if on else "--pause")
                flips.append((time.time() * 1000, on, block, kind))
                time.sleep(phase)
            block += 1
        out = proc.stdout.read()
        cpu = s.cpu_seconds() - cpu0
        if proc.returncode != 0:
            raise RuntimeError(f"fio failed: {out[-2000:]}")
        total_ios = json.loads(out[out.index("{"):])["jobs"][0]["read"]["total_ios"]
        recorded = json.loads(s.cli("stats", "d", "--json"))["d"]["read"]["commands"]
    finally:
        s.stop()
    # Recording phases count, paused ones do not: strictly between.
    if not 0 < recorded < total_ios:
        raise RuntimeError(f"recorded {recorded} of fio's {total_ios} reads")

    # Windows -> phases. fio stamps a window with its end.
    phases = [[] for _ in flips]
    with open(f"{log}_iops.1.log") as f:
        for line in f:
            end_ms, iops = (int(x) for x in line.split(",")[:2])
            start_ms = end_ms - window_ms
            for i, flip in enumerate(flips):
                nxt = flips[i + 1][0] if i + 1 < len(flips) else float("inf")
                if flip[0] + margin_ms <= start_ms and end_ms <= nxt:
                    phases[i].append(iops)
    blocks = {}
    for w, (_, on, b, kind) in zip(phases, flips):
        if w:
            blocks.setdefault((b, kind), []).append((sum(w) / len(w), on))
    ratios, control = [], []
    for (_, kind), ph in blocks.items():
        if len(ph) != 2:
            continue
        if kind == "ab":
            rec = [m for m, on in ph if on][0]
            paused = [m for m, on in ph if not on][0]
            ratios.append(rec / paused)
        else:
            control.append(ph[0][0] / ph[1][0])
    if not ratios or not control:
        raise RuntimeError("no complete blocks in fio's log")

    on_w = [x for w, f in zip(phases, flips) if f[1] and f[3] == "ab" for x in w]
    off_w = [x for w, f in zip(phases, flips) if not f[1] for x in w]
    cost = json.loads(sh(example("strata-stats", "record_cost"), "--json"))
    cpu_ns_per_io = cpu / total_ios * 1e9
    quart = sorted(ratios)
    return {
        "fio_seconds": total, "phase_s": phase, "blocks": len(ratios),
        "control_blocks": len(control),
        "iops_recording_median_window": round(median(on_w)),
        "iops_paused_median_window": round(median(off_w)),
        "ratio": round(median(ratios), 3),
        "ratio_quartiles": [round(quart[len(quart) // 4], 3), round(quart[(3 * len(quart)) // 4], 3)],
        "control_ratio_aa": round(median(control), 3),
        "record_ns_per_command": cost["ns_per_command_1_thread"],
        "record_ns_per_command_2_threads": cost["ns_per_command_2_threads"],
        "server_cpu_ns_per_io": round(cpu_ns_per_io),
        "record_cpu_share": round(cost["ns_per_command_1_thread"] / cpu_ns_per_io, 4),
        "target": "ratio >= 0.98 (median over blocks, IOPS recording / paused)",
    }
