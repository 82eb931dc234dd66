"""The `space` case's compression part (issue 64 item 3, `strata
compress`, docs/FORMAT.md §18): guest images built by the case, packed by
strata and by qemu-img in the same run, then served packed and raw.

- `images`: a debootstrapped Debian 12 (minbase and a few packages, in an
  ext4 file system made reproducibly: fixed UUID, hash seed and time) and
  a text-heavy one (ext4 of this host's /usr/include, Python and Perl
  libraries). For each: `qemu-img convert -c -O qcow2 -o
  compression_type=zstd` against `strata import` + `strata compress
  --codec zstd`, the datastore's whole use (map included) against the
  qcow2 file: the packed size ratio [>= 0.9 of qcow2's], and LZ4's for
  the record.
- `reads`: 4 KiB random reads (fio, QD16) of the Debian files as a tar
  stream repeated to 1 GiB (data from end to end: the ext4 image is mostly
  free space, whose reads are of holes) as three disks of one datastore,
  raw, packed with LZ4 (the default) and with zstd, and qemu-nbd serving
  the zstd qcow2, in two regimes, each server like the others: `device`
  (strata `--cache none --aio native`, qemu-nbd `--cache=none
  --aio=native`: every read from the device) and `cached` (writeback, the
  disks read whole first: every read from the page cache, the servers'
  CPU per read); windows rotated and repeated (raw and LZ4 back to back),
  medians, and each server's CPU per read; LZ4 against raw [>= 0.85].
- `writes`: 4 KiB random writes (QD16, the disk's first quarter) and 512
  KiB sequential writes (the rest) to the LZ4-packed disk against the raw
  one, each trial on a region of the disk no trial wrote before (a write
  to a packed grain takes a new raw grain; one to a raw grain of its own
  goes in place) [>= 0.95, >= 0.90].
- `object_store`: the same disk written with 512 KiB sequential writes
  (nbdcopy) to an object-store datastore (SeaweedFS on loopback) served
  with `--store-compress lz4` (the default) and `off`: the image's bytes
  per second against the store's raw PUT ceiling measured in the same run
  [lz4 >= 1.0], the bytes kept in the store, and 4 KiB random reads of the
  packed disk against the raw one from the warm segment cache.

A --smoke run builds small images of the repository's own files instead
(no mirror needed) and runs every step once, briefly."""
import json
import os
import random
import shutil
import subprocess
import time
from statistics import median

from .common import ROOT, cpu_of, drop_caches, ratio, sh, size_bytes, smoke
from .fio import fio
from .seaweedfs import (UPLOAD_DEPTH, ObjectStoreStrata, start_seaweedfs, stop_seaweedfs,
                        store_ceiling)
from .servers import QemuNbd, Strata

# The Debian image's packages beyond minbase: what a small server guest
# has (an init, an SSH server, Python and Perl).
EXTRA_PACKAGES = "systemd,systemd-sysv,openssh-server,python3,perl,iproute2,less,vim-tiny"
MIRROR = "http://deb.debian.org/debian"
# The reads' and writes' disk: large enough that a sequential window of
# the writes lasts more than a blink.
FULL_BYTES = 1 << 30
# Fixed so that the same files make the same image.
FS_UUID = "5e1f0000-0000-4000-8000-000000000064"
HASH_SEED = "5e1f0000-0000-4000-8000-0000000000a5"
FAKE_TIME = "1764547200"  # 2025-12-01


def _mkfs(tree, img, size):
    """An ext4 image of SIZE holding TREE's files, the same bytes for the
    same files."""
    env = dict(os.environ, E2FSPROGS_FAKE_TIME=FAKE_TIME)
    sh("mkfs.ext4", "-q", "-F", "-d", tree, "-U", FS_UUID, "-E",
       f"hash_seed={HASH_SEED},root_owner=0:0", "-L", "strata-bench", img, size, env=env)


def _debian_tree(work):
    """A debootstrapped bookworm (cached in WORK across the case's runs):
    its path and what it is."""
    root = os.path.join(work, "debian-rootfs")
    done = os.path.join(work, "debian-rootfs.done")
    if not os.path.exists(done):
        shutil.rmtree(root, ignore_errors=True)
        sh("debootstrap", "--variant=minbase", f"--include={EXTRA_PACKAGES}", "bookworm",
           root, MIRROR)
        # Logs and caches differ from run to run; the image is the system.
        for d in ("var/cache/apt/archives", "var/log", "var/lib/apt/lists"):
            p = os.path.join(root, d)
            if os.path.isdir(p):
                for name in os.listdir(p):
                    q = os.path.join(p, name)
                    if os.path.isfile(q):
                        os.unlink(q)
        open(done, "w").close()
    n = len(os.listdir(os.path.join(root, "var/lib/dpkg/info")))
    return root, f"debootstrap --variant=minbase --include={EXTRA_PACKAGES} bookworm ({n} dpkg files)"


def _tree_of(work, name, sources):
    """A copy of the host's SOURCES (those present) under WORK/NAME."""
    tree = os.path.join(work, name)
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    for s in sources:
        if os.path.isdir(s):
            shutil.copytree(s, os.path.join(tree, s.strip("/").replace("/", "_")), symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def _tar(tree, img, at_least=0):
    """A disk every grain of which is data: TREE's files as one tar stream
    (reproducible: sorted, fixed owners and times), repeated until it
    holds AT_LEAST bytes, padded to whole MiB."""
    sh("tar", "-C", tree, "--sort=name", "--owner=0", "--group=0", "--numeric-owner",
       f"--mtime=@{FAKE_TIME}", "-cf", img, ".")
    with open(img, "rb") as f:
        one = f.read()
    with open(img, "ab") as f:
        while f.tell() < at_least:
            f.write(one)
    with open(img, "r+b") as f:
        f.truncate(-(-os.path.getsize(img) // (1 << 20)) << 20)


def _images(work):
    """[(name, raw image path, what it is)], and the disk the reads and
    writes run on: the Debian files as a tar stream, repeated to
    FULL_BYTES (the ext4 image is mostly free space, whose reads would be
    of holes)."""
    out = []
    full = os.path.join(work, "full.raw")
    if smoke(True, False):
        # The repository's own files: on every machine that runs it, and
        # no special files to trip the copy.
        tree = _tree_of(work, "docs-tree", [os.path.join(ROOT, "docs"), os.path.join(ROOT, "bench")])
        img = os.path.join(work, "debian.raw")
        _mkfs(tree, img, "32M")
        out.append(("debian", img, "ext4 of the repository's docs/ and bench/ (--smoke)"))
        _tar(tree, full)
        shutil.rmtree(tree)
        tree = _tree_of(work, "text-tree", [os.path.join(ROOT, "crates")])
        img = os.path.join(work, "text.raw")
        _mkfs(tree, img, "64M")
        out.append(("text", img, "ext4 of the repository's crates/ (--smoke)"))
        shutil.rmtree(tree)
        return out, (full, "tar of the repository's docs/ and bench/ (--smoke)")
    root, what = _debian_tree(work)
    img = os.path.join(work, "debian.raw")
    _mkfs(root, img, "2G")
    out.append(("debian", img, f"2 GiB ext4 of {what}"))
    _tar(root, full, at_least=FULL_BYTES)
    srcs = ["/usr/include", "/usr/lib/python3.11", "/usr/share/perl"]
    tree = _tree_of(work, "text-tree", srcs)
    img = os.path.join(work, "text.raw")
    _mkfs(tree, img, "512M")
    out.append(("text", img, f"512 MiB ext4 of this host's {', '.join(srcs)}"))
    shutil.rmtree(tree)
    return out, (full, f"tar of the same {what}, repeated to {FULL_BYTES >> 30} GiB")


def _used(s):
    return json.loads(s.cli("status", "--json"))["used_bytes"]


def _timed_json(s, *args):
    t = time.perf_counter()
    out = json.loads(s.cli(*args, "--json"))
    return out, round(time.perf_counter() - t, 2)


def _sizes(work, name, img):
    """One image packed by qemu-img (zstd qcow2) and by strata (zstd, then
    LZ4, as separate disks of one datastore); the Strata datastore with
    both, and the qcow2's path."""
    qcow2 = os.path.join(work, f"{name}.qcow2")
    t = time.perf_counter()
    sh("qemu-img", "convert", "-c", "-f", "raw", "-O", "qcow2", "-o", "compression_type=zstd",
       img, qcow2)
    qemu_s = round(time.perf_counter() - t, 2)
    # The image's data (what qemu-img map says is data and not zeros).
    extents = json.loads(sh("qemu-img", "map", "-f", "raw", "--output=json", img))
    data = sum(e["length"] for e in extents if e["data"] and not e.get("zero"))
    s = Strata(os.path.join(work, f"space-{name}"))
    empty = _used(s)
    s.cli("import", img, "zstd")
    raw_use = _used(s) - empty
    zr, zstd_s = _timed_json(s, "compress", "--codec", "zstd", "zstd")
    zstd_use = _used(s) - empty
    before = _used(s)
    s.cli("import", img, "lz4")
    _, lz4_s = _timed_json(s, "compress", "lz4")
    lz4_use = _used(s) - before
    qcow2_bytes = os.path.getsize(qcow2)
    out = {
        "data_bytes": data,
        "qcow2_zstd_bytes": qcow2_bytes, "qcow2_zstd_x": ratio(data, qcow2_bytes),
        "qemu_img_s": qemu_s,
        "strata_raw_use_bytes": raw_use,
        "strata_zstd_use_bytes": zstd_use, "strata_zstd_x": ratio(data, zstd_use),
        "strata_zstd_pass_s": zstd_s, "zstd_pairs_bytes": zr["pair_bytes"],
        "zstd_quads_bytes": zr.get("quad_bytes", 0),
        "strata_lz4_use_bytes": lz4_use, "strata_lz4_x": ratio(data, lz4_use),
        "strata_lz4_pass_s": lz4_s,
        "zstd_vs_qcow2": ratio(qcow2_bytes, zstd_use), "target": ">= 0.9",
        "lz4_vs_qcow2": ratio(qcow2_bytes, lz4_use),
    }
    return out, s, qcow2


def _rotated(trials, names, window):
    """WINDOW(name) for each name in each trial, the order rotated from
    trial to trial: {name: [values]}. A tuple among NAMES is a pair
    measured back to back (its order swapped every other trial), so drift
    of the machine between windows weighs little on its ratio."""
    got = {n: [] for u in names for n in (u if isinstance(u, tuple) else (u,))}
    for k in range(trials):
        for u in names[k % len(names):] + names[:k % len(names)]:
            pair = u if isinstance(u, tuple) else (u,)
            for n in (pair[::-1] if k % 2 else pair):
                got[n].append(window(n))
    return got


def _paired(got):
    """The median of each trial's LZ4 window against the raw one beside
    it, in GOT ({"lz4": [...], "raw": [...]})."""
    return ratio(median(a / b for a, b in zip(got["lz4"], got["raw"])), 1)


# The reads' two regimes, like with like: strata's serve options and
# qemu-nbd's cache and aio modes.
READ_REGIMES = {
    # Every read from the device (O_DIRECT): what a host whose disks
    # outgrow its page cache sees, and what libvirt pairs with raw files.
    "device": (["--cache", "none", "--aio", "native"], {"cache": "none", "aio": "native"}),
    # Every read from the page cache (the disks read whole first): the
    # servers' CPU per read, nothing else.
    "cached": ([], {"cache": "writeback"}),
}


def _reads(s, img, qcow2, rt, trials):
    """4k random reads of the image raw, packed with LZ4 and with zstd, and
    of qemu-nbd serving the zstd qcow2 (`_sizes` made all but raw), in
    each of READ_REGIMES: IOPS, and each server's CPU per read (what the
    machine's drift between windows moves least)."""
    s.cli("import", img, "raw")
    size = os.path.getsize(img)
    base = list(s.serve_args)
    qemu_nbd = "qemu-nbd qcow2 zstd"
    names = [("raw", "lz4"), "zstd", qemu_nbd]
    out = {"job": f"fio 4k randread iodepth 16, {rt} s per window, the whole disk, "
                  "servers rotated (raw and LZ4 back to back), medians",
           "target": ">= 0.85 (lz4 against raw)"}
    for regime, (opts, qemu) in READ_REGIMES.items():
        s.serve_args = base + opts
        q = QemuNbd(qcow2, "qcow2", os.path.join(os.path.dirname(qcow2), "q.sock"), **qemu)
        s.start()
        q.start()
        try:
            def uri(n):
                return q.uri() if n == qemu_nbd else s.uri(n)
            if regime == "cached":
                drop_caches()
                for n in ("raw", "lz4", "zstd", qemu_nbd):
                    fio(uri(n), "read", "1M", iodepth=4, size=size)

            def window(n):
                if regime == "device":
                    drop_caches()
                pid = q.proc.pid if n == qemu_nbd else s.proc.pid
                c = cpu_of(pid)
                r = fio(uri(n), "randread", "4k", iodepth=16, runtime=rt, size=size)
                return round(r["iops"]), round((cpu_of(pid) - c) * 1e6 / max(r["ios"], 1), 2)
            got = _rotated(trials, names, window)
        finally:
            q.stop()
            s.stop()
            s.serve_args = base
        iops = {n: [w[0] for w in v] for n, v in got.items()}
        cpu = {n: [w[1] for w in v] for n, v in got.items()}
        med = {n: median(v) for n, v in iops.items()}
        out[regime] = {
            "strata": " ".join(["serve", *opts]) if opts else "serve (--cache writeback)",
            "qemu_nbd": " ".join(f"--{k}={v}" for k, v in qemu.items()),
            "iops": iops, "median_iops": med,
            "lz4_vs_raw": ratio(med["lz4"], med["raw"]),
            "lz4_vs_raw_paired": _paired(iops),
            "zstd_vs_raw": ratio(med["zstd"], med["raw"]),
            "zstd_vs_qemu_nbd_qcow2": ratio(med["zstd"], med[qemu_nbd]),
            "server_cpu_us_per_read": {n: median(v) for n, v in cpu.items()},
        }
    return out


def _writes(s, img, rt, trials):
    """Writes to the LZ4-packed disk against the raw one, each window on a
    region no window wrote before: 4k random (QD16) on the disk's first
    quarter (a few seconds make every grain of a region raw: it measures
    the steady state, the first write of each grain included) and 512k
    sequential, one pass each, on the rest (each grain written once: the
    redirect out of its packed fragment against an overwrite in place)."""
    size = os.path.getsize(img)
    # Two windows (raw, lz4) per kind per trial: a region per trial, disk
    # and kind. A sequential window is a fraction of a second whose speed
    # varies with the page cache's writeback: more of them.
    mib = 1 << 20
    seq_trials = smoke(trials, 2 * trials + 1)
    rand_region = max(mib, size // 4 // trials // mib * mib)
    seq_region = (size - trials * rand_region) // seq_trials // mib * mib
    s.start()
    try:
        out = {}
        for kind, rw, bs, first, region, n_trials in (
                ("random_4k", "randwrite", "4k", 0, rand_region, trials),
                ("sequential_512k", "write", "512k", trials * rand_region, seq_region, seq_trials)):
            got = {"raw": [], "lz4": []}
            cpu = {"raw": [], "lz4": []}
            for k in range(n_trials):
                at = first + k * region
                for n in (("raw", "lz4") if k % 2 == 0 else ("lz4", "raw")):
                    drop_caches()
                    c = cpu_of(s.proc.pid)
                    r = fio(s.uri(n), rw, bs, iodepth=16, size=region, extra=[f"--offset={at}"],
                            runtime=rt if rw == "randwrite" else None)
                    got[n].append(round(r["bw_mib"], 1))
                    gib = max(r["ios"], 1) * size_bytes(bs.upper()) / (1 << 30)
                    cpu[n].append(round((cpu_of(s.proc.pid) - c) / gib, 3))
            out[kind] = {"region_mib": region >> 20, "mib_s": got,
                         "lz4_vs_raw": ratio(median(got["lz4"]), median(got["raw"])),
                         "lz4_vs_raw_paired": _paired(got),
                         # The server's CPU seconds per GiB written: what the
                         # redirect costs strata, apart from the page cache's
                         # and the host's allocation of new pages.
                         "server_cpu_s_per_gib": {n: median(v) for n, v in cpu.items()},
                         "target": ">= 0.95" if kind == "random_4k" else ">= 0.90"}
    finally:
        s.stop()
    out["job"] = (f"fio iodepth 16, a region per window (random: {rt} s; "
                  "sequential: one pass), writes acknowledged (no flush), pairs alternated")
    return out


def _warm(path):
    """Reads PATH once, so that a window reads its source from memory."""
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def _store_write(h, name, img):
    """One window: a new disk NAME on host H written with IMG's bytes by
    nbdcopy (512 KiB requests, 16 in flight, one connection, a FLUSH at
    the end: every segment uploaded and committed before it returns); MiB
    of IMG per second."""
    size = os.path.getsize(img)
    h.cli("create", name, "--size", str(size))
    _warm(img)
    h.start()
    try:
        t = time.perf_counter()
        sh("nbdcopy", "-C", "1", "-R", "16", "--request-size=524288", "-S", "0", "--flush",
           img, h.uri(name))
        secs = time.perf_counter() - t
    finally:
        h.stop()
    return round(size / secs / (1 << 20), 1)


def _object_store(work, img, q, rt, trials):
    """Compress-at-seal (docs/FORMAT.md §18.6): IMG written as 512 KiB
    sequential writes to disks of an object-store datastore (SeaweedFS on
    loopback) served with `--store-compress lz4` (the default) and `off`,
    windows alternated, each a new disk; the bytes of IMG per second
    against the store's raw 8 MiB PUT ceiling measured in the same run
    [lz4 >= 1.0], the bytes each disk keeps in the store, and 4 KiB random
    reads of a packed disk against a raw one from the hosts' warm segment
    caches (page cache dropped)."""
    size = os.path.getsize(img)
    # The store's files and the hosts' directories (a few GiB each at
    # full size) in a directory of their own, new for the run and gone
    # after it (WORK is kept across runs for the Debian tree).
    top = os.path.join(work, "object-store")
    shutil.rmtree(top, ignore_errors=True)
    weed, endpoint = start_seaweedfs(top)
    try:
        ceiling = store_ceiling(smoke(1, 3 if q else 5), UPLOAD_DEPTH)
        tag = f"{random.randrange(1 << 32):08x}"
        hosts, written = {}, {}
        for mode in ("lz4", "off"):
            h = ObjectStoreStrata(os.path.join(top, f"host-{mode}"),
                                  f"s3://strata-bench/space-{mode}-{tag}")
            h.serve_args = ["--store-compress", mode]
            hosts[mode], written[mode] = h, []

        def write(n):
            name = f"w{len(written[n])}"
            written[n].append(name)
            return _store_write(hosts[n], name, img)
        mib_s = _rotated(trials + 1, ["lz4", "off"], write)
        # What each disk keeps in the store (its grains and map).
        kept = {}
        for n, h in hosts.items():
            gc = json.loads(h.cli("gc", "--dry-run", "--json"))
            per = [d["referenced_bytes"] for d in gc["disks"]]
            kept[n] = {"disk_bytes": round(median(per)), "store_bytes": gc["stored_bytes"]}

        def read(n):
            h = hosts[n]
            h.start()
            try:
                drop_caches()
                return round(fio(h.uri("w0"), "randread", "4k", iodepth=16, runtime=rt,
                                 size=size)["iops"])
            finally:
                h.stop()
        iops = _rotated(trials, ["lz4", "off"], read)
    finally:
        stop_seaweedfs(weed)
        shutil.rmtree(top, ignore_errors=True)
    put = ceiling["put_mib_s"]
    lz4, off = median(mib_s["lz4"]), median(mib_s["off"])
    return {
        "store": f"SeaweedFS on loopback ({endpoint})",
        "job": ("nbdcopy of the reads' disk to a new disk per window (512 KiB requests, 16 in "
                "flight, one connection, FLUSH at the end), pairs alternated"),
        "ceiling_put_mib_s": put, "ceiling": f"8 MiB PUTs, {UPLOAD_DEPTH} in flight",
        "write_mib_s": mib_s,
        "lz4_vs_ceiling": ratio(lz4, put), "target": ">= 1.0",
        "off_vs_ceiling": ratio(off, put), "lz4_vs_off": ratio(lz4, off),
        "kept": kept,
        "kept_lz4_vs_off": ratio(kept["lz4"]["disk_bytes"], kept["off"]["disk_bytes"]),
        "read_4k_iops": iops,
        "read_lz4_vs_off": ratio(median(iops["lz4"]), median(iops["off"])),
        "read_job": f"fio 4k randread iodepth 16, {rt} s, segment cache warm, page cache dropped",
    }


def packing(work, q):
    rt = smoke(1, 4 if q else 6)
    trials = smoke(1, 2 if q else 3)
    out = {}
    images, (full, what) = _images(work)
    for name, img, it in images:
        r, _, qcow2 = _sizes(work, name, img)
        out[name] = {"image": it, **r}
        os.unlink(img)
        os.unlink(qcow2)
    # Reads and writes: a disk that is data from end to end.
    r, s, qcow2 = _sizes(work, "full", full)
    out["full"] = {"image": what, **r}
    out["reads"] = _reads(s, full, qcow2, rt, trials)
    out["writes"] = _writes(s, full, rt, trials)
    os.unlink(qcow2)
    out["object_store"] = _object_store(work, full, q, rt, trials)
    os.unlink(full)
    return out
