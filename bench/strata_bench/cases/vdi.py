"""The `vdi` case (paper suite): seed 000's VDI experiment, seSparse linked
clones of a golden image used by TCG guests, then online `strata vmdk
shrink` of all clones under client I/O."""
import json
import os
import random
import re
import shutil
import subprocess
import threading
import time
from statistics import median

from ..common import STRATA, cpu_of, ratio, sh, smoke
from ..fio import fio, window_iops
from ..guest import boot_guest, guest_image
from ..servers import Strata, VmdkServe


def _guest_sums(lines):
    return dict(reversed(l.split(None, 1)) for l in lines.get("SUM", []))


def _allocated(path):
    return os.stat(path).st_blocks * 512


def _fio_multi(uris, rw, bs, iodepth, runtime, logprefix, extra=()):
    """One fio with a job per URI (same options): the desktops' clients side
    by side. Returns (IOPS of all jobs, I/Os of all jobs, [(t, IOPS of all
    jobs)] per 250 ms from fio's start, {"mean_us", "p99_us"}: completion
    latency over all jobs)."""
    args = ["fio", "--ioengine=nbd", f"--rw={rw}", f"--bs={bs}", f"--iodepth={iodepth}",
            "--output-format=json", "--group_reporting", f"--runtime={runtime}", "--time_based",
            "--randrepeat=0", f"--write_iops_log={logprefix}", "--log_avg_msec=250"] + list(extra)
    for i, u in enumerate(uris):
        args += [f"--name=j{i}", f"--uri={u}"]
    out = sh(*args)
    j = json.loads(out[out.index("{"):])
    side = j["jobs"][0]["write" if "write" in rw else "read"]
    clat = side["clat_ns"]
    lat = {"mean_us": round(clat["mean"] / 1000, 1),
           "p99_us": round(clat.get("percentile", {}).get("99.000000", 0) / 1000, 1)}
    buckets = {}
    for i in range(1, len(uris) + 1):
        with open(f"{logprefix}_iops.{i}.log") as f:
            for line in f:
                parts = [x.strip() for x in line.split(",")]
                if len(parts) >= 2:
                    b = round(int(parts[0]) / 250)
                    buckets[b] = buckets.get(b, 0) + int(parts[1])
    return side["iops"], side["total_ios"], sorted((b / 4, v) for b, v in buckets.items()), lat


# The desktops' client load, paced as the paper's View Planner paced its
# users: 4k random writes at this rate per clone (a fifth or less of what
# the clones take closed-loop here), so the shrink's cost shows as latency
# and CPU, not as the clients' lost throughput.
PACED_IOPS = 10000


def case_vdi(work, q):
    """Seed 000's VDI experiment (figure 10: wipe-shrink of linked clones,
    its CPU cost, the space it gives back). A golden desktop is made by a
    TCG guest (scripts/guest/init `vdigolden`: ext4 over the first part of
    the disk, "OS" files), snapshotted in strata and exported as a flat base
    plus an empty seSparse delta; each linked clone is a copy of that delta
    on the shared base, all served by one `strata serve --vmdk`. A round
    (the seed's iteration): each desktop boots (`vdiuse`), writes a user
    file, installs an application (files written, synced), uninstalls it
    and runs fstrim (the guest's side of the wipe: NBD TRIM to SEsparse
    unmap); then client I/O (fio 4k randwrite iodepth 16, one job per
    desktop, on the raw region past each file system), once closed-loop
    (the clones' capacity) and then paced at PACED_IOPS per clone before,
    during and after `strata vmdk shrink` of all clones at once (one batch,
    default pacing): IOPS, completion latency and server CPU in each
    window (the shrink's own CPU: the server's while it ran less the same
    paced load's before), space given back per clone. Medians over the rounds. Last, every clone boots again
    (`verify`: fsck, checksums equal to what the desktop wrote) and
    qemu-img check passes."""
    clones = 2 if q else 4
    size_mib = 256 if q else 1024
    fs_mib = size_mib * 3 // 4
    base_mib, app_mib, n_rounds = (16, 48, 1) if q else (64, 160, 3)
    rt = smoke(1, 3 if q else 8)
    live_mib = size_mib - fs_mib
    res = {"params": {"clones": clones, "disk_mib": size_mib, "fs_mib": fs_mib, "golden_files_mib": base_mib,
                      "app_mib": app_mib, "rounds": n_rounds, "client_region_mib": live_mib,
                      "runtime_s": rt,
                      "client": "fio 4k randwrite iodepth 16 per clone, on the region past its file system",
                      "paced_iops_per_clone": PACED_IOPS}}
    img = guest_image()
    logs = os.path.join(work, "console")
    os.makedirs(logs, exist_ok=True)
    s = Strata(os.path.join(work, "strata")).start()
    exports = os.path.join(work, "exports")
    os.makedirs(exports, exist_ok=True)
    try:
        s.cli("create", "golden", "--size", f"{size_mib}M")
        g = boot_guest(img, s.sock, "golden", "vdigolden", os.path.join(logs, "golden.log"),
                       fsmib=fs_mib, basemib=base_mib)
        res["golden_boot_s"] = g["boot_s"]
        s.cli("snapshot", "create", "golden", "g")
        s.cli("export", "golden", os.path.join(exports, "vdi.vmdk"), "--chain", "--subformat", "seSparse")
    finally:
        s.stop()
    # Linked clones: one empty delta per desktop on the one base (the
    # descriptor names its own extent and keeps the parent's CID).
    with open(os.path.join(exports, "vdi-000001.vmdk")) as f:
        desc = f.read()
    files, deltas = {}, {}
    for k in range(clones):
        name = f"desktop{k}"
        shutil.copyfile(os.path.join(exports, "vdi-000001-sesparse.vmdk"),
                        os.path.join(exports, f"{name}-sesparse.vmdk"))
        with open(os.path.join(exports, f"{name}.vmdk"), "w") as f:
            f.write(re.sub(r"(?m)^CID=\w+", f"CID={random.getrandbits(32):08x}",
                           desc.replace('"vdi-000001-sesparse.vmdk"', f'"{name}-sesparse.vmdk"')))
        files[name] = os.path.join(exports, f"{name}.vmdk")
        deltas[name] = os.path.join(exports, f"{name}-sesparse.vmdk")
    os.unlink(os.path.join(exports, "vdi-000001.vmdk"))
    os.unlink(os.path.join(exports, "vdi-000001-sesparse.vmdk"))
    v = VmdkServe(work, files).start()
    uris = [v.uri(n) for n in files]
    region = [f"--offset={fs_mib}M", f"--size={live_mib}M"]
    sums = {}

    def window(name, shrink, before=None, paced=True):
        """fio on every clone for `rt` s, PACED at PACED_IOPS per clone (or
        as fast as it goes); with `shrink`, `strata vmdk shrink` of every
        clone starts with it (one batch). The shrink figures count only
        while it ran (fio's 250 ms IOPS log, CPU read when the last shrink
        ended) when it ended first."""
        pid = v.proc.pid
        c0, t0 = cpu_of(pid), time.perf_counter()
        procs = [subprocess.Popen([STRATA, "vmdk", "shrink", f, "--json"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
                 for f in files.values()] if shrink else []
        done = {"outs": []}

        def watch():
            done["outs"] = [p.communicate() for p in procs]
            done["t"], done["cpu"] = time.perf_counter() - t0, cpu_of(pid) - c0
        th = threading.Thread(target=watch, daemon=True)
        th.start()
        t_fio = time.perf_counter() - t0
        iops, ios, samples, lat = _fio_multi(uris, "randwrite", "4k", 16, rt,
                                             os.path.join(logs, name),
                                             region + ([f"--rate_iops={PACED_IOPS}"] if paced else []))
        cpu, wall = cpu_of(pid) - c0, time.perf_counter() - t0
        out = {"iops": round(iops), "server_cpu_pct": round(100 * cpu / wall, 1),
               "server_cpu_us_per_io": round(1e6 * cpu / ios, 2), "latency": lat}
        th.join(timeout=900)
        if not procs:
            return out
        for p, (o, e) in zip(procs, done["outs"]):
            if p.returncode != 0:
                raise RuntimeError(f"vmdk shrink exited {p.returncode}: {e}")
        out["reports"] = [json.loads(o)[0] for o, _ in done["outs"]]
        out["shrink_s"] = round(done["t"], 2)
        out["shrink_outlasted_fio"] = done["t"] > wall
        if done["t"] < wall:
            out["iops_while_shrinking"] = window_iops(samples, 0, max(0.25, done["t"] - t_fio))
            out["server_cpu_pct_while_shrinking"] = round(100 * done["cpu"] / done["t"], 1)
        else:
            out["iops_while_shrinking"] = out["iops"]
            out["server_cpu_pct_while_shrinking"] = out["server_cpu_pct"]
        # The shrink's own CPU: what the server used while it ran beyond
        # the same paced load's CPU before it.
        out["shrink_cpu_pct_of_one_core"] = round(
            max(0.0, out["server_cpu_pct_while_shrinking"] - before["server_cpu_pct"]), 1)
        return out

    try:
        rounds = []
        for r in range(n_rounds):
            rd = {"desktop_boot_s": [], "fstrim": []}
            for k, name in enumerate(files):
                u = boot_guest(img, v.sock, name, "vdiuse", os.path.join(logs, f"{name}-{r}.log"),
                               appmib=app_mib, iters=1, id=k)
                sums[name] = _guest_sums(u)
                rd["desktop_boot_s"].append(u["boot_s"])
                rd["fstrim"] += u.get("FSTRIM", [])
            if r == 0:
                # The clients' region written once (every window overwrites)
                # and a warm-up, so the first window does not pay for either.
                for u in uris:
                    fio(u, "write", "1M", iodepth=8, extra=region + ["--end_fsync=1"])
                _fio_multi(uris, "randwrite", "4k", 16, 1, os.path.join(logs, "warm"), region)
            rd["allocated_before"] = sum(_allocated(d) for d in deltas.values())
            rd["saturated"] = window(f"saturated{r}", False, paced=False)
            rd["before_shrink"] = window(f"before{r}", False)
            rd["during_shrink"] = window(f"during{r}", True, rd["before_shrink"])
            rd["after_shrink"] = window(f"after{r}", False)
            rd["allocated_after"] = sum(_allocated(d) for d in deltas.values())
            rd["reclaimed_mib_per_clone"] = round(
                (rd["allocated_before"] - rd["allocated_after"]) / clones / 2**20, 1)
            before, after = rd["before_shrink"]["iops"], rd["after_shrink"]["iops"]
            during = rd["during_shrink"]["iops_while_shrinking"]
            rd["ratio_during_vs_before"] = ratio(during, before)
            rd["ratio_during_vs_before_after_mean"] = ratio(during, (before + after) / 2)
            rd["ratio_after_vs_before"] = ratio(after, before)
            rounds.append(rd)
            print(f"   round {r}: reclaimed {rd['reclaimed_mib_per_clone']} MiB per clone, "
                  f"IOPS before/during/after {before}/{during}/{after}", flush=True)
        res["rounds"] = rounds
        med = lambda f: median(f(rd) for rd in rounds)
        res["reclaimed_mib_per_clone"] = med(lambda rd: rd["reclaimed_mib_per_clone"])
        res["delta_mib_per_clone_after"] = round(sum(_allocated(d) for d in deltas.values()) / clones / 2**20, 1)
        for key in ("ratio_during_vs_before", "ratio_during_vs_before_after_mean", "ratio_after_vs_before"):
            res[key] = med(lambda rd: rd[key])
        res["shrink_s"] = med(lambda rd: rd["during_shrink"]["shrink_s"])
        res["server_cpu_pct"] = {w: med(lambda rd: rd[f"{w}_shrink"]["server_cpu_pct"])
                                 for w in ("before", "during", "after")}
        res["shrink_cpu_pct_of_one_core"] = med(lambda rd: rd["during_shrink"]["shrink_cpu_pct_of_one_core"])
        # Every desktop still boots to the files it wrote, fsck-clean.
        for name in files:
            c = boot_guest(img, v.sock, name, "verify", os.path.join(logs, f"{name}-verify.log"))
            got = _guest_sums(c)
            if got != sums[name]:
                raise RuntimeError(f"{name}: files after the shrink differ: {got} != {sums[name]}")
        res["verified"] = "every clone fsck-clean with the files it wrote (guest), qemu-img check clean"
    finally:
        v.stop()
    for f in files.values():
        sh("qemu-img", "check", "-f", "vmdk", f)
    return res
