"""What every case uses: the repository's paths and the strata binary,
subprocess helpers, sizes and ratios, the host's page cache, and the
run-wide options that main() sets from --smoke and --chain-max."""
import os
import socket
import subprocess
import time
from statistics import median

# The repository (this file is bench/strata_bench/common.py).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Where `cargo build --release` (run from ROOT) puts what it builds: under
# $CARGO_TARGET_DIR when that is set, as cargo does.
RELEASE = os.path.join(ROOT, os.environ.get("CARGO_TARGET_DIR", "target"), "release")
STRATA = os.environ.get("STRATA", os.path.join(RELEASE, "strata"))
# The examples a few cases drive (store_ceiling, create_race, vhost_bench,
# record_cost), already built: `make test` (scripts/run-tests.py) builds
# every target before it runs the smoke, and names each example's
# executable here (NAME=PATH, separated by ':'), so that the smoke does not
# compile them again in release mode (minutes on a fresh clone, on the
# suite's longest path). Unset, they are built with `cargo build
# --release`, as `make bench` and `make paper` measure them.
EXAMPLES = dict(e.split("=", 1) for e in os.environ.get("STRATA_BENCH_EXAMPLES", "").split(os.pathsep)
                if "=" in e)


def example(package, name, features=()):
    """The path of example NAME of PACKAGE (built with FEATURES): the one
    $STRATA_BENCH_EXAMPLES names, else a release build."""
    if os.path.isfile(EXAMPLES.get(name, "")):
        return EXAMPLES[name]
    feat = ["--features", ",".join(features)] if features else []
    sh("cargo", "build", "--release", "-q", "-p", package, *feat, "--example", name, cwd=ROOT)
    return os.path.join(RELEASE, "examples", name)


def sh(*args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        # Say what the tool said: a bare exit status hides ENOSPC and friends.
        raise RuntimeError(f"{' '.join(map(str, args))} exited {r.returncode}:\n"
                           f"{(r.stderr or r.stdout)[-2000:]}")
    return r.stdout


def wait_path(p, timeout=30, proc=None):
    """Waits for path P; with PROC, fails as soon as that process exits."""
    t = time.time()
    while not os.path.exists(p):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{p} did not appear: {' '.join(proc.args)} exited {proc.returncode}")
        if time.time() - t > timeout:
            raise RuntimeError(f"{p} did not appear")
        time.sleep(0.02)


def free_port():
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout=30):
    """Waits until something accepts on loopback PORT; fails as soon as
    PROC exits."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{' '.join(proc.args)} exited {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


def ratio(a, b):
    return round(a / b, 3) if b else None


def size_bytes(s):
    """Bytes in a size written as fio and qemu-img take it: '64M', '4G' (K, M, G)."""
    n, u = int(s[:-1]), s[-1]
    return n << {"K": 10, "M": 20, "G": 30}[u]


def timed(f):
    t = time.perf_counter()
    f()
    return round((time.perf_counter() - t) * 1000, 2)


def cpu_of(pid):
    """User + system CPU seconds of process `pid` so far, all its threads
    (those gone too), to the nanosecond: Linux's CPU clock of another
    process (clock_getcpuclockid's id, `~pid << 3 | 2`). /proc/PID/stat
    counts in clock ticks (10 ms), and a quick pass of a fast server
    spends less than one: its CPU read as 0, and a figure as missing.
    The ticks only when the clock cannot be read."""
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_status_kib(pid, field):
    """A KiB figure of /proc/PID/status (`VmRSS`, `VmHWM`), 0 if absent."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def random_raw(path, size):
    """A raw file of `size` ('2G', as size_bytes takes it) of random bytes,
    on the disk (synced), for a peer to serve."""
    sh("dd", "if=/dev/urandom", f"of={path}", "bs=1M", f"count={size_bytes(size) >> 20}",
       "conv=fsync", "status=none")


def prealloc_raw(path, size, prealloc):
    """A raw file of `size` (bytes, or '2G' as qemu-img takes it) with
    qemu-img's `preallocation` PREALLOC: off (sparse), falloc (allocated,
    unwritten) or full (written with zeros)."""
    sh("qemu-img", "create", "-q", "-f", "raw", "-o", f"preallocation={prealloc}", path, str(size))


def sync_host():
    """Write the host's dirty pages back before a timed run, so that the
    last run's write-back is not charged to it; nothing under --smoke (as
    drop_caches: in `make test` it would wait for the other lanes' writes)."""
    if not SMOKE:
        os.sync()


def drop_caches():
    """Cold host page cache (the datastore's files); the server's metadata
    cache stays, as it would on a running host. False when not dropped:
    not root, or --smoke, whose figures mean nothing and which `make test`
    runs beside the other tests (each drop would sync their writes and
    take their cached files, a few hundred times per smoke)."""
    if SMOKE:
        return False
    sync_host()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


# Run-wide options, set by main() before any case runs.
CHAIN_MAX = None  # --chain-max
SMOKE = False  # --smoke
QUICK = False  # --quick (and --smoke)


def with_runs(runs, nd=None):
    """Runs of one cell (dicts of the same keys) -> the median of each
    number, rounded to ND places when given, with the runs beside it as
    KEY_runs (what the paper's figures read as a median and its range);
    any other value as the first run has it."""
    out = {}
    for k, v in runs[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            vals = [r[k] for r in runs]
            m = median(vals)
            out[k], out[f"{k}_runs"] = (m if nd is None else round(m, nd)), vals
        else:
            out[k] = v
    return out


def smoke(value, otherwise):
    """`value` in a --smoke run (each case at its smallest size and
    shortest run: proof that it still produces every figure, as `make test`
    needs, not a measurement), else `otherwise`."""
    return value if SMOKE else otherwise


def bucket_edge(label):
    """A `strata stats` histogram bucket's edge ('<=15000' -> 15000.0,
    '>100000' -> 100000.0) and whether it is the overflow bucket above it."""
    return float(label.lstrip("<=>")), label.startswith(">")


def slower_than(hist, us):
    """Commands of a latency histogram ({bucket label: count}) in buckets
    wholly above US microseconds: '<=E' buckets past the one US closes,
    and the overflow bucket from US up."""
    return sum(v for lab, v in hist.items()
               if bucket_edge(lab)[0] > us or (bucket_edge(lab)[1] and bucket_edge(lab)[0] >= us))


def repeats(n):
    """How many times a cell runs: N in a full run, once under --quick
    (minutes for the whole paper; its figures carry no spread)."""
    return 1 if QUICK else n
