"""The `crypto` case (issue 63): what encryption at rest costs. One
server serves two disks of one datastore, `plain` and `enc` (AES-256-XTS,
unlocked at start), over NBD (fio's nbd engine) and vhost-user-blk (the
userspace frontend of the `vhost` case); the same jobs run on both, in
passes that alternate plain and encrypted, and each figure is the median
of the passes' ratios. Beside it: the cipher alone on one core (the
crate's `xts_speed` example), snapshot and linked-clone times of both
disks, and a shallow rekey of the encrypted disk with 100 snapshots,
timed, with the pool checked unchanged by it."""
import hashlib
import json
import os
import time
from statistics import median

from ..common import example, ratio, sh, smoke, wait_path
from ..fio import fill, fio
from ..servers import Strata, drive_vhost, vhost_harness

JOBS = (("randread_4k", "randread", 4096, 16), ("randwrite_4k", "randwrite", 4096, 16),
        ("seqread_1m", "read", 1 << 20, 8), ("seqwrite_1m", "write", 1 << 20, 8))
TARGETS = {"randread_4k": 0.95, "randwrite_4k": 0.90, "seqread_1m": 0.85, "seqwrite_1m": 0.80}


def _key(work):
    path = os.path.join(work, "enc.key")
    with open(path, "wb") as f:
        f.write(os.urandom(32))
    os.chmod(path, 0o600)
    return path


def _cipher():
    """The cipher alone: GB/s on 4 KiB buffers, one core."""
    out = sh("taskset", "-c", "0", example("strata-crypt", "xts_speed"), str(smoke(0.2, 2)))
    return json.loads(out.strip().splitlines()[-1])


def _timed(f, n):
    """Median milliseconds of N calls of F."""
    ts = []
    for i in range(n):
        t = time.monotonic()
        f(i)
        ts.append((time.monotonic() - t) * 1000)
    return round(median(ts), 2)


def _sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _transports(s, socks, harness, rt):
    """For each transport, a function (disk, rw, bs, depth) -> IOPS."""
    def nbd(disk, rw, bs, depth):
        return fio(s.uri(disk), rw, str(bs), iodepth=depth, runtime=rt,
                   extra=["--cpus_allowed=0"])["iops"]

    def vhost(disk, rw, bs, depth):
        return drive_vhost(harness, socks[disk], rw, bs, depth, rt)["iops"]

    return {"nbd": nbd, "vhost": vhost}


def _pairs(run, passes):
    """Each job on both disks, alternated, PASSES times: the per-pass
    ratios' median and the medians of each side."""
    out = {}
    for tag, rw, bs, depth in JOBS:
        plain, enc = [], []
        for p in range(passes):
            # Which disk goes first alternates too.
            order = ("plain", "enc") if p % 2 == 0 else ("enc", "plain")
            got = {d: run(d, rw, bs, depth) for d in order}
            plain.append(got["plain"])
            enc.append(got["enc"])
        out[tag] = {"plain_iops": round(median(plain)), "enc_iops": round(median(enc)),
                    "ratio": ratio(median(e / max(p, 1e-9) for e, p in zip(enc, plain)), 1),
                    "target": f">= {TARGETS[tag]}"}
    return out


def case_crypto(work, q):
    size = smoke("64M", "1G")
    rt = smoke(1, 4 if q else 8)
    passes = smoke(1, 3 if q else 5)
    key = _key(work)
    socks = {d: os.path.join(work, f"{d}.vhost") for d in ("plain", "enc")}
    s = Strata(os.path.join(work, "s"), serve_args=[
        "--vhost-user-blk", f"plain={socks['plain']}", "--vhost-user-blk", f"enc={socks['enc']}",
        "--vhost-queues", "1", "--unlock", f"enc={key}"])
    s.cli("create", "plain", "--size", size)
    s.cli("create", "enc", "--size", size, "--encrypt", "--key-file", key)
    out = {"params": {"size": size, "runtime_s": rt, "passes": passes,
                      "cipher": "aes-xts-plain64, 512-byte sectors",
                      "cpus": "fio and the vhost frontend on CPU 0, the server on CPU 1"}}
    out["cipher_4k_one_core"] = dict(_cipher(), target=">= 2 GB/s")
    harness = vhost_harness()
    s.start()
    try:
        sh("taskset", "-pac", "1", str(s.proc.pid))
        for d in socks.values():
            wait_path(d)
        for d in ("plain", "enc"):
            fill(s.uri(d), size)
        for name, run in _transports(s, socks, harness, rt).items():
            out[name] = _pairs(run, passes)
        n = smoke(3, 10)
        for d in ("plain", "enc"):
            out[f"snapshot_ms_{d}"] = _timed(
                lambda i, d=d: s.cli("snapshot", "create", f"{d}@t{i}"), n)
            out[f"clone_ms_{d}"] = _timed(
                lambda i, d=d: s.cli("clone", f"{d}@t{i}", f"{d}-c{i}"), n)
        for i in range(100 - n):
            s.cli("snapshot", "create", f"enc@r{i}")
        s.cli("snapshot", "create", "enc@last")
    finally:
        s.stop()
    # Offline, so nothing else writes the pool meanwhile; an offline
    # command first, so what the server's stop left (reclaiming, the
    # closing checkpoint's map nodes) is done before the pool is hashed.
    snaps = len(json.loads(s.cli("snapshot", "list", "enc", "--json")))
    s.cli("check")
    pool = os.path.join(s.ds, "pool.data")
    before = _sha(pool)
    new = os.path.join(work, "enc2.key")
    with open(new, "wb") as f:
        f.write(os.urandom(32))
    os.chmod(new, 0o600)
    t = time.monotonic()
    s.cli("rekey", "enc", "--key-file", key, "--new-key-file", new)
    out["rekey_shallow"] = {"snapshots": snaps, "ms": round((time.monotonic() - t) * 1000, 1),
                            "pool_unchanged": _sha(pool) == before, "target": "< 1000 ms"}
    return out
