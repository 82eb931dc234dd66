"""The `backup` case (issue 26): what an incremental backup of a big thin
disk costs when 1% of it changed since the last one."""
import json
import os
import statistics
import subprocess
import time

from ..common import drop_caches, sh, smoke
from ..servers import Strata

# libnbd's Python binding is Debian's: nbdsh must run Debian's python3.
NBDSH_ENV = dict(os.environ, PATH="/usr/bin:/bin:" + os.environ.get("PATH", ""))

# Read the dirty extents of CTX on URI (what a pull-mode backup copies),
# at most LIMIT bytes of them, against as many bytes in one sequential run
# from offset 0 of the same export (written in full: data on both sides);
# host caches dropped before each read (COLD=1). Each read is a backup
# client's session of its own: connect, ask BLOCK_STATUS over the whole
# export, read. Prints JSON: the bytes read, the dirty bytes and runs in
# all, and the seconds of each read.
READ = r"""
import json, os, time
uri, ctx = os.environ["URI"], os.environ["CTX"]
limit, cold = int(os.environ["LIMIT"]), os.environ.get("COLD") == "1"
def drop():
    if cold:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
def connect():
    h = nbd.NBD()
    h.add_meta_context(ctx)
    h.connect_uri(uri)
    size = h.get_size()
    runs, pos = [], 0
    while pos < size:
        got = []
        def cb(name, offset, entries, err):
            if name == ctx:
                got.extend(zip(entries[0::2], entries[1::2]))
            return 0
        h.block_status(min(size - pos, 1 << 30), pos, cb)
        for length, flags in got:
            if flags & 1:
                runs.append((pos, length))
            pos += length
    return h, runs
h, runs = connect()
h.shutdown()
# Requests of 1 MiB on both sides (the pieces written are 1 MiB): the
# ratio is what scattering costs, not a request size.
CHUNK = 1 << 20
dirty_total = sum(length for _, length in runs)
pieces = []
for off, length in runs:
    at = off
    while at < off + length:
        n = min(off + length - at, CHUNK)
        pieces.append((at, n))
        at += n
# At most LIMIT bytes of them; the sequential run reads as many.
kept, total = [], 0
for at, n in pieces:
    if total + n > limit:
        break
    kept.append((at, n))
    total += n
seq = [(at, min(CHUNK, total - at)) for at in range(0, total, CHUNK)]
def read(reqs, depth):
    h, _ = connect()
    drop()
    t = time.perf_counter()
    if depth == 1:
        for at, n in reqs:
            h.pread(n, at)
    else:
        # Up to `depth` requests in flight, as nbdcopy keeps them.
        i, cookies = 0, set()
        while i < len(reqs) or cookies:
            while i < len(reqs) and len(cookies) < depth:
                at, n = reqs[i]
                cookies.add(h.aio_pread(nbd.Buffer(n), at))
                i += 1
            h.poll(-1)
            for c in list(cookies):
                if h.aio_command_completed(c):
                    cookies.discard(c)
    took = time.perf_counter() - t
    h.shutdown()
    return took
# Each kind once, the sequential ones first when SEQ_FIRST=1 (the caller
# alternates: this machine's disk slows down as a run goes on).
kinds = [("dirty", kept, 1), ("seq", seq, 1), ("dirty4", kept, 4), ("seq4", seq, 4)]
if os.environ.get("SEQ_FIRST") == "1":
    kinds = [kinds[1], kinds[0], kinds[3], kinds[2]]
times = {kind: read(reqs, depth) for kind, reqs, depth in kinds}
print(json.dumps({"bytes": total, "extents": len(runs), "dirty_bytes": dirty_total,
                  "seconds": times}))
"""


def case_backup(work, q):
    """A thin disk written in full at its start (the sequential read's
    region) and sparsely elsewhere, snapshot s1; then 1% of its size
    rewritten in 1 MiB pieces scattered over it, snapshot s2. Measured with
    the server running: `strata diff vm@s2 --from s1 --totals` (the walk
    skips what s1 and s2 share: the cost follows the 1%, not the size),
    `nbdinfo --map=qemu:dirty-bitmap:s1` over the whole snapshot export,
    and, with libnbd as a backup client does, the throughput of reading
    the dirty extents against reading as many bytes in one sequential run
    of the same export (target >= 0.9x): at most the sequential region's
    size of them, so both reads are of data, with the host page cache
    dropped before each (as a backup reads a snapshot not in the cache)."""
    size_g = smoke(4, 64 if q else 1024)
    changed = size_g * (1 << 30) // 100
    base = min(changed, 2 << 30)
    rounds = smoke(1, 5)
    cold = drop_caches()
    s = Strata(os.path.join(work, "backup")).start()
    # The read-ahead window of the "on" rounds (strata's default unless set).
    ra = os.environ.get("STRATA_BENCH_READ_AHEAD")
    on_args = s.serve_args + (["--nbd-read-ahead", ra] if ra else [])
    off_args = s.serve_args + ["--nbd-read-ahead", "0"]
    try:
        s.cli("create", "vm", "--size", f"{size_g}G")
        uri = s.uri("vm")
        # The sequential region, then s1.
        sh("fio", "--name=b", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1M",
           "--iodepth=8", f"--size={base}", "--output-format=terse")
        s.cli("snapshot", "create", "vm", "s1")
        # 1% of the size in 1 MiB pieces at random offsets over the disk.
        t = time.perf_counter()
        sh("fio", "--name=b", "--ioengine=nbd", f"--uri={uri}", "--rw=randwrite", "--bs=1M",
           "--iodepth=8", f"--size={size_g}G", f"--io_size={changed}", "--randrepeat=0",
           "--output-format=terse")
        write_s = time.perf_counter() - t
        s.cli("snapshot", "create", "vm", "s2")
        t = time.perf_counter()
        d = json.loads(s.cli("diff", "vm@s2", "--from", "s1", "--totals", "--json"))
        diff_s = time.perf_counter() - t
        snap = s.uri("vm@s2")
        t = time.perf_counter()
        m = subprocess.run(["nbdinfo", "--map=qemu:dirty-bitmap:s1", snap], check=True,
                           capture_output=True, text=True).stdout
        map_s = time.perf_counter() - t
        dirty_lines = sum(1 for l in m.splitlines() if l.split()[2:3] == ["1"])
        def reads(seq_first):
            return json.loads(sh("nbdsh", "-c", READ, env=dict(
                NBDSH_ENV, URI=snap, CTX="qemu:dirty-bitmap:s1", LIMIT=str(base >> 20 << 20),
                COLD="1" if cold else "0", SEQ_FIRST="1" if seq_first else "0")))
        # Rounds of the same reads with strata's read-ahead along the dirty
        # ranges on and off (the server restarted with --nbd-read-ahead 0;
        # the host's own read-ahead serves the sequential run either way),
        # in alternating orders, as this machine's disk moves a lot from one
        # read to the next; the figures are medians.
        s.stop()
        secs = {"on": {}, "off": {}}
        for r in range(rounds):
            for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                s.serve_args = on_args if mode == "on" else off_args
                s.start()
                try:
                    got = reads(seq_first=r % 2 == 1)
                finally:
                    s.stop()
                for kind, sec in got["seconds"].items():
                    secs[mode].setdefault(kind, []).append(sec)
                if mode == "on":
                    on = got
    finally:
        s.stop()
    med = {k: statistics.median(v) for k, v in secs["on"].items()}
    med_off = {k: statistics.median(v) for k, v in secs["off"].items()}
    # Dirty against sequential within each session (the same moment of
    # the disk), the median of those.
    paired = lambda mode, a, b: round(statistics.median(
        x / y for x, y in zip(secs[mode][a], secs[mode][b])), 3)
    total = on["bytes"]
    mib = lambda sec: round(total / sec / (1 << 20), 1) if sec else None
    spread = lambda v: [mib(x) for x in v]
    return {
        "disk": f"{size_g}G", "changed_bytes": changed, "write_s": round(write_s, 2),
        "diff": {"seconds": round(diff_s, 3), "data_bytes": d["data_bytes"],
                 "zero_bytes": d["zero_bytes"], "target": "<= 1 s (the CLI's run included)"},
        "nbd_map": {"seconds": round(map_s, 3), "dirty_runs": dirty_lines},
        "incremental_read": {
            "bytes": total, "dirty_bytes": on["dirty_bytes"], "extents": on["extents"],
            "host_cache": "dropped before each read" if cold else "warm",
            "rounds": rounds,
            "figures": "MiB/s: medians of the rounds; ratios: medians of each round's",
            "dirty_mib_s": mib(med["dirty"]), "sequential_mib_s": mib(med["seq"]),
            "ratio": paired("on", "seq", "dirty"), "target": ">= 0.9",
            "each_round": {"dirty": spread(secs["on"]["dirty"]),
                           "sequential": spread(secs["on"]["seq"])},
            "four_in_flight": {"dirty_mib_s": mib(med["dirty4"]), "sequential_mib_s": mib(med["seq4"]),
                               "ratio": paired("on", "seq4", "dirty4")},
            "read_ahead_off": {"dirty_mib_s": mib(med_off["dirty"]),
                               "sequential_mib_s": mib(med_off["seq"]),
                               "ratio": paired("off", "seq", "dirty"),
                               "four_in_flight_ratio": paired("off", "seq4", "dirty4")},
        },
    }
