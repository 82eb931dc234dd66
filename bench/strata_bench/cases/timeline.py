"""The `timeline` case (make paper, seed 003): 32k random writes at a fixed
2,000 IOPS on a fresh disk of each kind, every completion's latency per
second beside the disk's allocated share, from empty until allocated
(strata's thin, zeroedthick and eagerzeroedthick against raw images of
the matching preallocation under qemu-nbd), across a snapshot created and
deleted mid-run, and with the host page cache out of the way."""
import json
import os
import shutil
import subprocess
import threading
import time

from ..common import drop_caches, sh, smoke
from ..fio import fio_log
from ..servers import QemuNbd, Strata

RATE_IOPS = 2000
BS = "32k"
IODEPTH = 4


def _target(uri):
    """fio's options for URI: an NBD URI, or file:PATH (a file written with
    O_DIRECT through libaio: the device without any server between)."""
    if uri.startswith("file:"):
        return ["--ioengine=libaio", "--direct=1", f"--filename={uri[5:]}"]
    return ["--ioengine=nbd", f"--uri={uri}"]


def _fio_paced(uri, size, runtime, prefix):
    """fio over NBD (or on a file, _target): 32k random writes at
    RATE_IOPS (norandommap, so writes repeat at random and the unwritten
    share decays), every completion logged in `{prefix}_lat.1.log`; a
    Popen (JSON on stdout)."""
    return subprocess.Popen(
        ["fio", "--name=timeline", *_target(uri), "--rw=randwrite",
         f"--bs={BS}", f"--rate_iops={RATE_IOPS}", f"--iodepth={IODEPTH}", "--norandommap",
         "--randrepeat=0", "--time_based", f"--runtime={runtime}", f"--size={size}",
         f"--write_lat_log={prefix}", "--output-format=json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _pct(sorted_xs, q):
    return sorted_xs[min(len(sorted_xs) - 1, int(len(sorted_xs) * q))]


def _mean_ms(done, t_from, t_to, what):
    xs = [ms for t, ms in done if t_from <= t < t_to]
    if not xs:
        raise RuntimeError(f"no write completed in {what} ({t_from:.2f}-{t_to:.2f} s)")
    return round(sum(xs) / len(xs), 4)


class _Poller(threading.Thread):
    """Calls `sample()` (the allocated share, %) at t0 + 0, 1, 2, ... s
    until stopped: [(t_s from t0, pct)]."""

    def __init__(self, sample, t0):
        super().__init__(daemon=True)
        self.sample, self.t0 = sample, t0
        self.points, self.error = [], None
        self.halt = threading.Event()

    def run(self):
        k = 0
        try:
            while True:
                self.points.append((time.time() - self.t0, self.sample()))
                k += 1
                if self.halt.wait(max(0.0, self.t0 + k - time.time())):
                    return
        except Exception as e:  # raised again by the caller
            self.error = e


def _run(uri, size, runtime, prefix, sample, events=()):
    """One paced run on a fresh disk: fio for `runtime` s, the allocated
    share polled each second, and `events` [(at_s, name, fn)] run at those
    times from fio's start. The kind's entry (per_second and the summary),
    and {name: (actual start s, CLI ms)} of the events."""
    t0 = time.time()
    p = _fio_paced(uri, size, runtime, prefix)
    # fio's log clock starts with its first write, some 250 ms after the
    # Popen; its nbd engine says "connected to NBD server" within a
    # millisecond of that write: the common time axis starts there.
    # fio on a file prints nothing before its JSON, and a line read here
    # would leave the rest of it in a buffer communicate() does not see.
    first = p.stdout.readline() if not uri.startswith("file:") else ""
    if "connected" in first:
        t0 = time.time()
    poll = _Poller(sample, t0)
    poll.start()
    happened = {}
    try:
        for at, name, fn in events:
            time.sleep(max(0.0, t0 + at - time.time()))
            start = time.time()
            c = time.perf_counter()
            fn()
            happened[name] = (round(start - t0, 3), round((time.perf_counter() - c) * 1000, 2))
        out, err = p.communicate()
        out = first + out
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        poll.halt.set()
        poll.join()
    if p.returncode != 0:
        raise RuntimeError(f"fio exited {p.returncode}: {err[-2000:]}")
    if poll.error is not None:
        raise RuntimeError(f"polling the allocation failed: {poll.error}")
    poll.points.append((time.time() - t0, sample()))
    fio_iops = json.loads(out[out.index("{"):])["jobs"][0]["write"]["iops"]
    done = fio_log(f"{prefix}_lat.1.log", 1e6)
    if not done:
        raise RuntimeError(f"{prefix}_lat.1.log has no completions")
    bins = [[] for _ in range(runtime)]
    for t, ms in done:
        # Second t covers [t-1, t) of fio's clock; the few that complete as
        # fio stops go to the last.
        bins[min(runtime - 1, int(t))].append(ms)
    per_second = []
    for i, xs in enumerate(bins):
        if not xs:
            raise RuntimeError(f"no write completed in second {i + 1} of {prefix}")
        xs.sort()
        at = min(poll.points, key=lambda pt: abs(pt[0] - (i + 1)))
        per_second.append({"t": i + 1, "iops": len(xs), "mean_ms": round(sum(xs) / len(xs), 4),
                           "p50_ms": round(_pct(xs, 0.5), 4), "p99_ms": round(_pct(xs, 0.99), 4),
                           "allocated_pct": round(at[1], 2)})
    full = next((x["t"] for x in per_second if x["allocated_pct"] >= 99), None)
    everything = sorted(ms for _, ms in done)
    entry = {"per_second": per_second,
             "first_second_mean_ms": per_second[0]["mean_ms"],
             "steady_mean_ms": _mean_ms(done, runtime * 2 / 3, float("inf"), "the last third"),
             "allocated_full_at_s": full,
             "p99_ms": round(_pct(everything, 0.99), 4),
             "iops": round(fio_iops, 1)}
    for name, (at, _) in happened.items():
        entry[f"around_{name}_mean_ms"] = _mean_ms(done, at, at + 2, f"the 2 s after {name}")
    return entry, happened


def _strata_kind(d, typ, size, runtime, logs, tag, serve_args=(), snap_at=None):
    """A fresh strata datastore with one disk `d` of provisioning `typ`,
    served (with `serve_args`), measured; with snap_at (S1, S2), snapshot
    `s` is created at S1 and deleted at S2."""
    s = Strata(d, serve_args=list(serve_args))
    s.cli("create", "d", "--size", size, "--type", typ)
    drop_caches()
    s.start()
    try:
        def sample():
            i = json.loads(s.cli("info", "d", "--json"))
            return 100.0 * i["allocated_bytes"] / i["size_bytes"]
        events = []
        if snap_at:
            events = [(snap_at[0], "create", lambda: s.cli("snapshot", "create", "d", "s")),
                      (snap_at[1], "delete", lambda: s.cli("snapshot", "delete", "d", "s"))]
        entry, happened = _run(s.uri("d"), size, runtime, os.path.join(logs, tag), sample, events)
    finally:
        s.stop()
        shutil.rmtree(d, ignore_errors=True)
    if snap_at:
        for name in ("create", "delete"):
            if name not in happened:
                raise RuntimeError(f"snapshot {name} did not run in {tag}")
        entry["events"] = {"snapshot_create_s": happened["create"][0],
                           "snapshot_delete_s": happened["delete"][0],
                           "create_cli_ms": happened["create"][1],
                           "delete_cli_ms": happened["delete"][1]}
    return entry


def _qemu_kind(d, prealloc, size, runtime, logs, tag, cache="writeback", aio=None):
    """A raw file made by qemu-img create -o preallocation=`prealloc`,
    served by qemu-nbd, measured; the allocated share is its st_blocks."""
    os.makedirs(d, exist_ok=True)
    f = os.path.join(d, "disk.raw")
    sh("qemu-img", "create", "-f", "raw", "-o", f"preallocation={prealloc}", f, size)
    sh("sync", f)
    drop_caches()
    total = os.stat(f).st_size
    qn = QemuNbd(f, "raw", os.path.join(d, "q.sock"), cache=cache, aio=aio).start()
    try:
        entry, _ = _run(qn.uri(), size, runtime, os.path.join(logs, tag),
                        lambda: 100.0 * os.stat(f).st_blocks * 512 / total)
    finally:
        qn.stop()
        shutil.rmtree(d, ignore_errors=True)
    return entry


def _file_kind(d, size, runtime, logs, tag):
    """The RDM analog: fio straight on a fully written file of the same
    file system, O_DIRECT, no server between."""
    os.makedirs(d, exist_ok=True)
    f = os.path.join(d, "device.raw")
    sh("qemu-img", "create", "-q", "-f", "raw", "-o", "preallocation=full", f, size)
    drop_caches()
    try:
        entry, _ = _run(f"file:{f}", size, runtime, os.path.join(logs, tag), lambda: 100.0)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return entry


def case_timeline(work, q):
    """Seed 003 (thin VVols vs thin VMDKs; VDBench 100 % writes of 32 KB at a
    fixed 2,000 IOPS on a raw disk): write latency over time from a fresh
    disk until it is allocated. fio over NBD, `--rw=randwrite --bs=32k
    --rate_iops=2000 --iodepth=4 --norandommap --randrepeat=0 --time_based`,
    every completion logged (`--write_lat_log`, total latency); per second
    of fio's run (its clock, from its first write, when its nbd engine
    reports the connection): completions, mean / p50 / p99 latency, and
    the allocated share, polled each second on the same axis (`strata info --json` allocated_bytes for
    strata, st_blocks of the raw file for qemu-nbd). With norandommap the
    unwritten share decays as e^(-t/T0), T0 = grains / 2000. Kinds, a fresh
    disk each (host page cache dropped before each run): strata thin,
    zeroedthick, eagerzeroedthick; qemu-nbd on raw files of
    preallocation=off / falloc / full (thin VMDK / zeroedthick / RDM-EZT
    analogs); strata thin and eagerzeroedthick with `snapshot create` at S1
    and `snapshot delete` at S2 (actual times and CLI wall time recorded;
    mean latency over the 2 s after each); the RDM analog, fio with
    O_DIRECT straight on a fully written file (`file_direct`, no server);
    and, not in --smoke, strata thin and eagerzeroedthick under `--cache
    none` vs qemu-nbd cache=none aio=native on a sparse raw file (O_DIRECT:
    the host file system's first-write cost is real I/O, as on ESXi, which
    has no host page cache).
    Summary per kind: first second's mean, the last third's mean
    (steady_mean_ms), the first second at >= 99 % allocated (null if
    never), whole-run p99 and achieved IOPS. Full: 256M disks, 30 s,
    S1/S2 = 10/20 s; quick 128M, 15 s, 5/10 s; smoke 32M, 4 s, 1/2 s."""
    size = smoke("32M", "128M" if q else "256M")
    runtime = smoke(4, 15 if q else 30)
    snap_at = smoke((1, 2), (5, 10) if q else (10, 20))
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    kinds = {}

    def strata(name, typ, **kw):
        kinds[name] = _strata_kind(os.path.join(work, name), typ, size, runtime, logs, name, **kw)

    def qemu(name, prealloc, **kw):
        kinds[name] = _qemu_kind(os.path.join(work, name), prealloc, size, runtime, logs, name, **kw)

    for typ in ("thin", "zeroedthick", "eagerzeroedthick"):
        strata(typ, typ)
    for prealloc in ("off", "falloc", "full"):
        qemu(f"qemu_raw_{prealloc}", prealloc)
    strata("thin_snapshot", "thin", snap_at=snap_at)
    strata("eagerzeroedthick_snapshot", "eagerzeroedthick", snap_at=snap_at)
    kinds["file_direct"] = _file_kind(os.path.join(work, "file_direct"), size, runtime, logs,
                                      "file_direct")
    if smoke(False, True):
        strata("thin_cachenone", "thin", serve_args=["--cache", "none"])
        strata("eagerzeroedthick_cachenone", "eagerzeroedthick", serve_args=["--cache", "none"])
        qemu("qemu_raw_off_cachenone", "off", cache="none", aio="native")
    return {"params": {"disk": size, "runtime_s": runtime, "rate_iops": RATE_IOPS, "bs": BS,
                       "iodepth": IODEPTH, "kinds": list(kinds),
                       "snapshot_at_s": snap_at[0], "delete_at_s": snap_at[1]},
            "kinds": kinds}
