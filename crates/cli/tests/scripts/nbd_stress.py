"""A deep-queue NBD client on libnbd that checks every byte it reads
(nbd_stress.rs): reads, writes, flushes, trims, write-zeroes and
block-status queries of written and never-written data, submitted in
batches of up to DEPTH commands, then refilled as they complete.

    nbd_stress.py URI SIZE SECONDS DEPTH[,DEPTH...]

Each depth gets an equal share of SECONDS. Two commands in flight never
touch the same 4 KiB block, so every read has one right answer (a
trimmed block may read as zeros or as what it held). Prints one line of
counts and exits 0; a wrong byte, a failed command or a stall (nothing
completed for STALL_S seconds) exits 1 saying what and where."""
import os
import random
import struct
import sys
import time

import nbd

BLOCK = 4096
MAX_BLOCKS = 16
STALL_S = 20

uri, size, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
depths = [int(d) for d in sys.argv[4].split(",")]
rng = random.Random(int.from_bytes(os.urandom(8), "little"))
nblocks = size // BLOCK

h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
# A TLS URI names the directory of the CA's certificate.
h.set_uri_allow_local_file(True)
h.connect_uri(uri)
if h.get_size() < size:
    sys.exit(f"the export holds {h.get_size()} bytes, fewer than {size}")

# What the disk holds now (all zeros on a new disk): read once, so a
# run on a disk that earlier ones wrote checks as well.
model = bytearray()
for at in range(0, size, 4 << 20):
    model += h.pread(min(4 << 20, size - at), at)
# Blocks trimmed since last written: they may read as zeros too.
trimmed = set()
busy = set()
inflight = {}
counts = {k: 0 for k in ("read", "write", "flush", "trim", "zero", "status")}
seq = 0


def fail(msg):
    print(f"FAIL {msg} (counts {counts})", file=sys.stderr)
    sys.exit(1)


def pattern(first, n, tag):
    """n blocks from block `first`: each starts with its own offset and
    the writing command's number, so a block landing in the wrong place
    or an old one read back is told apart."""
    out = bytearray()
    for b in range(first, first + n):
        out += struct.pack(">QQ", b * BLOCK, tag) + bytes([tag & 0xFF]) * (BLOCK - 16)
    return out


def pick():
    """A free run of 1..MAX_BLOCKS blocks, or None."""
    n = rng.randint(1, MAX_BLOCKS)
    first = rng.randrange(0, nblocks - n + 1)
    run = range(first, first + n)
    if any(b in busy for b in run):
        return None
    return first, n


def check_read(first, n, got):
    for i, b in enumerate(range(first, first + n)):
        at = b * BLOCK
        blk = got[i * BLOCK:(i + 1) * BLOCK]
        want = model[at:at + BLOCK]
        if blk == want:
            continue
        if b in trimmed and blk == bytes(BLOCK):
            continue
        head = struct.unpack(">QQ", blk[:16])
        fail(f"read of block {b} (offset {at}) returned data written for offset "
             f"{head[0]} by command {head[1]}; expected offset {at} command "
             f"{struct.unpack('>QQ', want[:16])[1]}")


def issue():
    """Start one command; False if none could start (blocks all busy)."""
    global seq
    seq += 1
    r = rng.random()
    if r < 0.04:
        c = h.aio_flush()
        inflight[c] = ("flush", None, 0, 0)
        return True
    got = pick()
    if got is None:
        return False
    first, n = got
    off, ln = first * BLOCK, n * BLOCK
    if r < 0.50:
        buf = nbd.Buffer(ln)
        c = h.aio_pread(buf, off)
        inflight[c] = ("read", buf, first, n)
    elif r < 0.85:
        data = pattern(first, n, seq)
        buf = nbd.Buffer.from_bytearray(data)
        c = h.aio_pwrite(buf, off)
        inflight[c] = ("write", (buf, data), first, n)
    elif r < 0.91:
        c = h.aio_trim(ln, off)
        inflight[c] = ("trim", None, first, n)
    elif r < 0.96:
        c = h.aio_zero(ln, off)
        inflight[c] = ("zero", None, first, n)
    else:
        c = h.aio_block_status(ln, off, lambda *a: 0)
        inflight[c] = ("status", None, first, n)
    busy.update(range(first, first + n))
    return True


def retire(c):
    kind, what, first, n = inflight.pop(c)
    try:
        h.aio_command_completed(c)
    except nbd.Error as e:
        fail(f"{kind} of {n} blocks at offset {first * BLOCK}: {e}")
    counts[kind] += 1
    run = range(first, first + n)
    at, ln = first * BLOCK, n * BLOCK
    if kind == "read":
        check_read(first, n, what.to_bytearray())
    elif kind == "write":
        model[at:at + ln] = what[1]
        trimmed.difference_update(run)
    elif kind == "trim":
        trimmed.update(run)
    elif kind == "zero":
        model[at:at + ln] = bytes(ln)
        trimmed.difference_update(run)
    busy.difference_update(run)


def drain(until):
    """Poll until at most `until` commands are in flight."""
    last = time.monotonic()
    while len(inflight) > until:
        h.poll(1000)
        done = False
        while inflight:
            c = h.aio_peek_command_completed()
            if c == 0 or c not in inflight:
                break
            retire(c)
            done = True
        now = time.monotonic()
        if done:
            last = now
        elif now - last > STALL_S:
            kinds = sorted({v[0] for v in inflight.values()})
            fail(f"stalled: nothing of {len(inflight)} commands in flight ({kinds}) "
                 f"completed for {STALL_S} s at depth {depth}")


for depth in depths:
    end = time.monotonic() + seconds / len(depths)
    while time.monotonic() < end:
        # A batch: the queue filled to `depth` with commands sent back to
        # back, then half of them (at least one) waited for.
        misses = 0
        while len(inflight) < depth and misses < 8:
            if not issue():
                misses += 1
        if inflight:
            drain(min(depth // 2, len(inflight) - 1))
    drain(0)

# Everything written reads back after a flush, one command at a time.
h.flush()
for first in range(0, nblocks, MAX_BLOCKS):
    n = min(MAX_BLOCKS, nblocks - first)
    check_read(first, n, h.pread(n * BLOCK, first * BLOCK))
h.shutdown()
print(" ".join(f"{k}={v}" for k, v in counts.items()))
