"""The `space` case (issue 64): what `strata dedup` frees and what it
costs. One image of random bytes imported as ten separate disks; then

- `copies`: the pass run offline (its own process, so its memory is its
  own: peak RSS from wait4, with a 16 MiB metadata cache, beside `strata
  status` as the process's floor and `dedup --estimate`), pool use after
  it against one copy's [<= 1.1x], its memory [<= 64 MiB] and its read
  rate; then the image imported once more with `--base d0`: the share
  of its grains written [<= 1%] and its time against a plain import;
- `reads_during`: the ten copies imported again and served; 4k random
  reads (fio, iodepth 16, cold cache) of one of them while the pass runs
  as a server job, against the same job paused: windows alternated
  (busy first in even trials, idle first in odd ones) and repeated, the
  medians compared [>= 0.9];
- `clones`: a golden image with twenty linked clones that each write the
  same 256 MiB at the same offsets (qemu-img over NBD); the pool's growth
  after `strata dedup`, against 256 MiB [<= 1.1x];
- `packing`: `strata compress` on guest images the case builds, against
  qemu-img's zstd qcow2, and reads and writes of packed disks
  (strata_bench/packing.py)."""
import json
import os
import subprocess
import time
from statistics import median

from ..common import STRATA, drop_caches, random_raw, ratio, smoke
from ..fio import fio
from ..packing import packing
from ..servers import Strata


def _measured(args):
    """Run ARGS alone: (stdout, wall seconds, peak RSS in KiB of that
    process, from wait4)."""
    t = time.perf_counter()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{args} exited {p.returncode}")
    return out.decode(), round(time.perf_counter() - t, 2), ru.ru_maxrss


def _used(s):
    return json.loads(s.cli("status", "--json"))["used_bytes"]


def _import_copies(s, img, names):
    for n in names:
        s.cli("import", img, n)


def _copies(s, img, n):
    """The pass offline over N copies: pool use against one copy, memory,
    time."""
    # The smallest sensible metadata cache: the engine's pages (shared by
    # everything, bounded by this budget) then weigh little beside what
    # the pass holds itself.
    base = [STRATA, "--datastore", s.ds, "--metadata-cache", "16M"]
    t = time.perf_counter()
    _import_copies(s, img, ["d0"])
    import_s = time.perf_counter() - t
    one = _used(s)
    _import_copies(s, img, [f"d{i}" for i in range(1, n)])
    before = _used(s)
    _, _, floor_kib = _measured(base + ["status", "--json"])
    drop_caches()
    est, est_s, est_kib = _measured(base + ["dedup", "--estimate", "--json"])
    drop_caches()
    out, secs, kib = _measured(base + ["dedup", "--json"])
    r = json.loads(out)
    after = _used(s)
    # The same image imported once more onto d0 (`import --base`): what it
    # writes, and its time against the plain import of d0.
    drop_caches()
    t = time.perf_counter()
    onto = json.loads(s.cli("import", img, "onto", "--base", "d0", "--json"))["base"]
    onto_s = time.perf_counter() - t
    onto_used = _used(s) - after
    s.cli("rm", "onto")
    return {
        "copies": n, "one_copy_used_bytes": one, "used_bytes_before": before,
        "used_bytes_after": after, "freed_bytes": r["freed_bytes"],
        "estimate_same_offset_bytes": json.loads(est)["same_offset_bytes"],
        "pool_use_vs_one_copy": ratio(after, one), "target_pool_use": "<= 1.1",
        "pass_s": secs, "pass_read_gb_s": round(r["read_bytes"] / secs / 1e9, 2),
        "pass_rss_peak_mib": round(kib / 1024, 1),
        "pass_rss_above_floor_mib": round((kib - floor_kib) / 1024, 1),
        "target_rss": "<= 64 (above the floor: what `strata status` peaks at, code and libraries)",
        "estimate_s": est_s, "estimate_rss_peak_mib": round(est_kib / 1024, 1),
        "status_rss_peak_mib": round(floor_kib / 1024, 1), "metadata_cache": "16M",
        "import_base_written_share": round(onto["written_bytes"] / max(1, one), 4),
        "target_import_base": "<= 0.01", "import_base_used_bytes": onto_used,
        "import_base_s": round(onto_s, 2), "import_s": round(import_s, 2),
    }


def _job_state(s, job_id):
    j = next((j for j in json.loads(s.cli("jobs", "--json")) if j["id"] == job_id), None)
    return j["state"] if j else "done"


def _wait_state(s, job_id, states, limit=60):
    t = time.monotonic()
    while (st := _job_state(s, job_id)) not in states:
        if time.monotonic() - t > limit:
            raise RuntimeError(f"job {job_id}: {st}, not {states} after {limit} s")
        time.sleep(0.05)
    return st


def _reads_during(s, n, size, rt, trials):
    """4k random reads of d0 with the pass running and paused, alternated;
    the pass is cancelled after the last window (the `copies` part times a
    whole one). A --smoke run's copies are too small for the pass to
    outlast its windows at full speed: there it runs at --rate 64M."""
    s.start()
    try:
        rate = smoke(["--rate", "64M"], [])
        job = json.loads(s.cli("dedup", "--detach", "--json", *rate))["id"]
        _wait_state(s, job, ("running",))
        s.cli("jobs", "pause", str(job))
        _wait_state(s, job, ("paused",))
        windows = []
        for k in range(trials):
            for busy in ((True, False) if k % 2 == 0 else (False, True)):
                if busy and _job_state(s, job) == "paused":
                    s.cli("jobs", "resume", str(job))
                drop_caches()
                r = fio(s.uri("d0"), "randread", "4k", iodepth=16, runtime=rt, size=size)
                state = _job_state(s, job)
                if busy and state == "running":
                    s.cli("jobs", "pause", str(job))
                    _wait_state(s, job, ("paused",))
                windows.append({"trial": k, "pass": "running" if busy else "paused",
                                "iops": round(r["iops"]),
                                "pass_still_running": state == "running" if busy else None})
        progress = next(j for j in json.loads(s.cli("jobs", "--json")) if j["id"] == job)
        if _job_state(s, job) != "done":
            s.cli("jobs", "cancel", str(job))
            _wait_state(s, job, ("cancelled", "done"))
    finally:
        s.stop()
    busy = [w["iops"] for w in windows if w["pass"] == "running" and w["pass_still_running"]]
    idle = [w["iops"] for w in windows if w["pass"] == "paused"]
    return {
        "copies": n, "job": f"fio 4k randread iodepth 16, {rt} s per window, cold cache, on d0",
        "windows": windows, "busy_windows_during_pass": len(busy),
        "iops_pass_running": median(busy) if busy else None, "iops_pass_paused": median(idle),
        "ratio": ratio(median(busy), median(idle)) if busy else None,
        "target": ">= 0.9", "pass_done_at_last_window": [progress.get("done"), progress.get("total")],
    }


def _clones(s, img, work, n, upd):
    """A golden image with N linked clones that each write the same UPD
    bytes (random, one file) at the same offsets through qemu-img over
    NBD; the pool's growth after the writes and after `strata dedup`,
    against UPD's size [<= 1.1x]."""
    s.cli("import", img, "golden")
    s.cli("snapshot", "create", "golden", "base")
    for i in range(n):
        s.cli("clone", "golden@base", f"c{i}")
    update = os.path.join(work, "update.raw")
    random_raw(update, upd)
    before = _used(s)
    s.start()
    try:
        t = time.perf_counter()
        for i in range(n):
            subprocess.run(["qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", update,
                            s.uri(f"c{i}")], check=True, stdout=subprocess.DEVNULL)
        write_s = time.perf_counter() - t
    finally:
        s.stop()
    written = _used(s)
    r = json.loads(s.cli("dedup", "--json"))
    after = _used(s)
    upd_bytes = os.path.getsize(update)
    os.unlink(update)
    return {
        "clones": n, "written_per_clone_bytes": upd_bytes, "write_s": round(write_s, 2),
        "growth_after_writes_bytes": written - before, "growth_after_pass_bytes": after - before,
        "growth_vs_one_write": ratio(after - before, upd_bytes), "target": "<= 1.1",
        "freed_bytes": r["freed_bytes"],
    }


def case_space(work, q):
    size = smoke("32M", "512M" if q else "2G")
    n = 10
    rt = smoke(1, 4 if q else 6)
    trials = smoke(1, 2 if q else 3)
    img = os.path.join(work, "image.raw")
    random_raw(img, size)
    s = Strata(os.path.join(work, "space"))
    out = {"image": f"{size} of random bytes"}
    out["copies"] = _copies(s, img, n)
    for i in range(1, n):
        s.cli("rm", f"d{i}")
    s.settle()
    _import_copies(s, img, [f"d{i}" for i in range(1, n)])
    out["reads_during"] = _reads_during(s, n, size, rt, trials)
    for i in range(n):
        s.cli("rm", f"d{i}")
    s.settle()
    out["clones"] = _clones(s, img, work, smoke(4, 20), smoke("8M", "64M" if q else "256M"))
    os.unlink(img)
    out["packing"] = packing(work, q)
    return out
