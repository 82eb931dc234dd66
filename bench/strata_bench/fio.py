"""fio as the cases run it, over NBD (fio's nbd engine): one job's IOPS,
bandwidth and I/O count, a disk filled by sequential writes, and IOPS per
250 ms from fio's log."""
import json
import os

from . import common
from .common import sh


def span(runtime):
    """fio's --runtime value for RUNTIME (seconds, or a string fio reads
    such as "300ms"). Under --smoke a quarter of it, at least 500 ms and
    never more than asked. A smoke run proves that a case still produces
    every figure; its time-based fio runs were most of its CPU (while one
    runs, fio and the server keep both cores of this machine busy), and
    two of fio's 250 ms IOPS samples are all any case reads from so
    short a run. Runs that must outlast what they time (stats' phases,
    move's base load, groupsnap's cuts) keep their own --runtime."""
    if not common.SMOKE:
        return str(runtime)
    ms = float(runtime[:-2]) if str(runtime).endswith("ms") else float(runtime) * 1000
    return f"{round(min(ms, max(500, ms / 4)))}ms"


def _run(args, rw, runtime, size, extra):
    """Run fio with `args` and the options every job shares; its one job's
    IOPS, bandwidth and I/O count, on the side `rw` does."""
    args = args + ["--output-format=json", "--group_reporting"]
    if runtime:
        args += [f"--runtime={span(runtime)}", "--time_based"]
    if size:
        args += [f"--size={size}"]
    args += list(extra)
    out = sh(*args)
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["read"] if "read" in rw else job["write"]
    return {"iops": side["iops"], "bw_mib": side["bw_bytes"] / 2**20, "ios": side["total_ios"]}


def fio(uri, rw, bs, iodepth=16, runtime=None, size=None, extra=()):
    return _run(["fio", "--name=b", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}",
                 f"--bs={bs}", f"--iodepth={iodepth}"], rw, runtime, size, extra)


def fio_file(path, rw, bs, iodepth=16, runtime=None, size=None, direct=True, extra=(),
             engine="io_uring", cpu=None):
    """fio on a file. Straight on a file of the same file system, with
    io_uring, it is the device's limit that a server's figures are held
    against (issue 29); on a FUSE export's file it is a client. `direct`
    opens it O_DIRECT (a server under `--cache none` does; without it the
    host page cache serves); `cpu` pins fio to that CPU."""
    args = ["fio", "--name=f", f"--ioengine={engine}", f"--filename={path}", f"--rw={rw}",
            f"--bs={bs}", f"--iodepth={iodepth}", f"--direct={int(direct)}"]
    if cpu is not None:
        args += [f"--cpus_allowed={cpu}"]
    return _run(args, rw, runtime, size, extra)


def fill(uri, size):
    fio(uri, "write", "1M", iodepth=8, size=size, extra=["--end_fsync=1"])


def fill_file(path, size, direct=False):
    """`fill` for a file of the host's file system (the peers' and limits'
    side of a case), created at SIZE if it is not there."""
    fio_file(path, "write", "1M", iodepth=8, size=size, direct=direct, extra=["--end_fsync=1"])


def fio_iops_log(uri, rw, bs, iodepth, runtime, size, logdir, tag):
    """fio as `fio()`, plus IOPS per 250 ms: [(t_seconds_from_fio_start, iops)]."""
    prefix = os.path.join(logdir, tag)
    r = fio(uri, rw, bs, iodepth=iodepth, runtime=runtime, size=size,
            extra=["--randrepeat=0", f"--write_iops_log={prefix}", "--log_avg_msec=250"])
    return r, fio_log(f"{prefix}_iops.1.log")


def fio_log(path, per=None):
    """The entries of a fio log file (`--write_iops_log`, `--write_lat_log`):
    [(t in seconds from fio's start, value)], the value divided by PER
    when given (1e6: a latency in ns as ms)."""
    out = []
    with open(path) as f:
        for line in f:
            parts = line.split(",", 2)
            if len(parts) >= 2:
                v = int(parts[1])
                out.append((int(parts[0]) / 1000.0, v / per if per else v))
    return out


def window_iops(samples, t_from, t_to):
    """Mean IOPS of fio's 250 ms samples in (t_from, t_to]. fio logs no
    sample for an interval in which nothing completed, so a job whose first
    sample comes after the window stalled through it: 0, not unknown. None
    only when fio logged nothing at all."""
    xs = [v for t, v in samples if t_from < t <= t_to + 0.25]
    if xs:
        return round(sum(xs) / len(xs))
    return 0 if any(t > t_to for t, _ in samples) else None
