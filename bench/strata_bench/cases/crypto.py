"""The `crypto` case (issue 63): what encryption at rest costs. One
server serves two disks of one datastore, `plain` and `enc` (AES-256-XTS,
unlocked at start), over NBD (fio's nbd engine) and vhost-user-blk (the
userspace frontend of the `vhost` case); the same jobs run on both, in
passes that alternate plain and encrypted, and each figure is the median
of the passes' ratios. Beside it: the cipher alone on one core (the
crate's `xts_speed` example), snapshot and linked-clone times of both
disks, a deep rekey of the encrypted disk online while fio reads it at
random (its rate, the clients' IOPS against the same job just before,
and the datastore's growth in use, polled), and a shallow rekey of the encrypted
disk with 100 snapshots, timed, with the pool checked unchanged by it;
and the same pairs on an object-store datastore (SeaweedFS on loopback),
where grains are encrypted as they enter a segment (FORMAT.md §16.7),
with a deep rekey there under fio's reads (§16.7: the pass copies)."""
import hashlib
import json
import os
import threading
import time
from statistics import median

from ..common import drop_caches, example, ratio, sh, size_bytes, smoke, wait_path
from ..fio import fill, fio
from ..seaweedfs import ObjectStoreStrata, start_seaweedfs, stop_seaweedfs
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
    """The cipher alone: GB/s on 4 KiB and 1 MiB buffers, one core, the
    engine strata uses and (where that is its own) aws-lc's beside it."""
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


def _used(s):
    return json.loads(s.cli("status", "--json"))["used_bytes"]


def _deep_rekey(s, new, rt, disk="enc", local=True):
    """`rekey --deep` of `disk` through the server while fio reads it at
    random: the pass's time and rate, the clients' IOPS during it against
    the same job just before, and (`local`) the datastore's largest
    growth in use (polled every 100 ms). On an object store the pass
    copies every grain (FORMAT.md §16.7) and GC frees the old ones."""
    info = json.loads(s.cli("info", disk, "--json"))
    # An object store's disk says what it maps as its referenced bytes.
    mapped = info.get("allocated_bytes", info.get("size_bytes"))
    before = fio(s.uri(disk), "randread", "4k", iodepth=16, runtime=rt,
                 extra=["--cpus_allowed=0"])["iops"]
    base = _used(s) if local else 0
    peak = [base]
    done = threading.Event()

    def poll():
        while local and not done.is_set():
            peak[0] = max(peak[0], _used(s))
            time.sleep(0.1)

    during = {}

    def reads():
        during.update(fio(s.uri(disk), "randread", "4k", iodepth=16, runtime=rt,
                          extra=["--cpus_allowed=0"]))

    threads = [threading.Thread(target=poll), threading.Thread(target=reads)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    s.cli("rekey", disk, "--deep", "--new-key-file", new)
    secs = time.monotonic() - t0
    done.set()
    for t in threads:
        t.join()
    out = {"mapped_bytes": mapped, "seconds": round(secs, 2),
           "mb_per_s": round(mapped / secs / 1e6, 1),
           "randread_iops_before": round(before), "randread_iops_during": round(during["iops"]),
           "ratio_during": ratio(during["iops"] / max(before, 1e-9), 1),
           "note": "the pass rests while clients are busy (as defrag); fio's "
                   "runtime may end before the pass"}
    if local:
        out.update({"used_growth_peak_mib": round((peak[0] - base) / 2**20, 1),
                    "used_after_minus_before_mib": round((_used(s) - base) / 2**20, 1),
                    "growth_bound_mib": 64})
    return out


def _timed_once(f):
    t = time.monotonic()
    f()
    return time.monotonic() - t


def _luks_rates(s, work, key, size):
    """MB/s of `export --format luks` and of importing that image, against
    a plain disk's VMDK export and import in the same run (the other image
    format strata writes and reads), and QEMU's luks driver reading the
    image (`qemu-img convert` to raw)."""
    luks, raw, back = (os.path.join(work, n) for n in ("enc.luks", "plain.vmdk", "q.raw"))
    mb = size / 1e6
    out = {}
    try:
        out["export_luks"] = _timed_once(
            lambda: s.cli("export", "enc", luks, "--format", "luks", "--key-file", key))
        out["export_vmdk"] = _timed_once(lambda: s.cli("export", "plain", raw))
        out["import_luks"] = _timed_once(
            lambda: s.cli("import", luks, "enc-back", "--key-file", key))
        out["import_vmdk"] = _timed_once(lambda: s.cli("import", raw, "plain-back"))
        out["qemu_img_luks_to_raw"] = _timed_once(lambda: sh(
            "qemu-img", "convert", "--object", f"secret,id=sec0,file={key}", "--image-opts",
            f"driver=luks,key-secret=sec0,file.filename={luks}", "-O", "raw", back))
    finally:
        for f in (luks, raw, back):
            if os.path.exists(f):
                os.remove(f)
    rates = {k: round(mb / v, 1) for k, v in out.items()}
    rates["luks_vs_vmdk_export"] = ratio(rates["export_luks"], rates["export_vmdk"])
    rates["luks_vs_vmdk_import"] = ratio(rates["import_luks"], rates["import_vmdk"])
    rates["unit"] = "MB/s of the disk's size, one run each, page cache warm"
    return rates


def _served_pairs(s, tag, key, size, rt, passes, cold=False, then=None):
    """Create disks `plain-TAG` and `enc-TAG` in the datastore of `s`
    (not started), serve them with the encrypted one unlocked (the server
    on CPU 1), fill both, and run the pairs over NBD with fio on CPU 0;
    `cold`: the host's caches dropped before each job (as root); `then`:
    called with `s` before the server stops, its answer kept as `then`."""
    s.cli("create", f"plain-{tag}", "--size", size)
    s.cli("create", f"enc-{tag}", "--size", size, "--encrypt", "--key-file", key)
    s.serve_args = s.serve_args + ["--unlock", f"enc-{tag}={key}"]
    s.start()
    try:
        sh("taskset", "-pac", "1", str(s.proc.pid))
        for d in (f"plain-{tag}", f"enc-{tag}"):
            fill(s.uri(d), size)

        def nbd(disk, rw, bs, depth):
            if cold:
                drop_caches()
            return fio(s.uri(f"{disk}-{tag}"), rw, str(bs), iodepth=depth, runtime=rt,
                       extra=["--cpus_allowed=0"])["iops"]

        out = _pairs(nbd, passes)
        if then:
            out["then"] = then(s)
        return out
    finally:
        s.stop()


def _direct(work, key, size, rt, passes):
    """The same pairs with the server on `--cache none` (O_DIRECT): reads
    come from the device and writes go to it, as at users' scale where a
    datastore is larger than the host's page cache. Two new disks, filled
    first (the first ones have snapshots and a rekey behind them), caches
    dropped before each job. NBD only."""
    s = Strata(os.path.join(work, "s"), serve_args=["--cache", "none"])
    return _served_pairs(s, "d", key, size, rt, passes, cold=True)


def _objstore(work, key, rt, passes):
    """The pairs on an object-store datastore (SeaweedFS on loopback, the
    server's segment cache warm): grains are encrypted as a segment is
    sealed and decrypted as they leave one (FORMAT.md §16.7). 256 MiB
    disks, NBD only; fio on CPU 0, the server on CPU 1 (SeaweedFS
    unpinned)."""
    size = smoke("32M", "256M")
    weed, _ = start_seaweedfs(work)
    try:
        url = f"s3://strata-bench/crypto-{os.urandom(4).hex()}"
        s = ObjectStoreStrata(os.path.join(work, "o"), url)
        new = os.path.join(work, "enc-o-deep.key")
        with open(new, "wb") as f:
            f.write(os.urandom(32))
        os.chmod(new, 0o600)
        out = _served_pairs(s, "o", key, size, rt, passes,
                            then=lambda s: _deep_rekey(s, new, rt, "enc-o", local=False))
    finally:
        stop_seaweedfs(weed)
    out["rekey_deep"] = out.pop("then")
    out["params"] = {"size": size, "store": "SeaweedFS on loopback"}
    return out


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
    out["cipher_4k_one_core"] = dict(
        _cipher(), target=">= 2 GB/s",
        peer="aws_lc_*: aws-lc's XTS (one sector per call) on the same core in the same run; 1m_*: 1 MiB buffers")
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
        # Text (hex): QEMU's luks driver takes UTF-8 secrets only, and the
        # LUKS export below opens with this key.
        deep_key = os.path.join(work, "enc-deep.key")
        with open(deep_key, "w") as f:
            f.write(os.urandom(32).hex())
        os.chmod(deep_key, 0o600)
        out["rekey_deep"] = _deep_rekey(s, deep_key, rt)
        key = deep_key
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
    out["nbd_direct"] = _direct(work, key, size, rt, passes)
    out["nbd_objstore"] = _objstore(work, key, rt, passes)
    # Offline, so nothing else writes the pool meanwhile; an offline
    # command first, so what the server's stop left (reclaiming, the
    # closing checkpoint's map nodes) is done before the pool is hashed.
    out["luks"] = _luks_rates(s, work, key, size_bytes(size))
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
