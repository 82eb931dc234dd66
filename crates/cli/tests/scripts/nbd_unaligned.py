"""libnbd against strata's block-size rules (nbd_unaligned.rs).

    nbd_unaligned.py URI SIZE free SECONDS
    nbd_unaligned.py URI SIZE strict

free: two connections that did not ask for block sizes (so the spec's
default minimum of 1 byte holds) keep up to 64 reads, writes, trims
and write-zeroes each in flight at any byte offset and length. Commands
in flight never share a byte but often share a 512-byte sector, where
a read-modify-write that lost another's bytes would show; every read
is checked against a model.
strict: a connection that asked for block sizes is told a minimum of
512, and a misaligned read or write sent anyway fails with EINVAL while
the connection goes on.

Prints "ok ..." and exits 0; anything else exits 1 saying what."""
import errno
import os
import random
import sys
import time

import nbd

uri, size, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = random.Random(int.from_bytes(os.urandom(8), "little"))


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr)
    sys.exit(1)


def connect(ask):
    h = nbd.NBD()
    h.set_request_block_size(ask)
    # Let misaligned requests through to the server.
    h.set_strict_mode(0)
    h.connect_uri(uri)
    return h


if mode == "strict":
    h = connect(True)
    if h.get_block_size(nbd.SIZE_MINIMUM) != 512:
        fail(f"minimum block size {h.get_block_size(nbd.SIZE_MINIMUM)}, not 512")
    h.pwrite(b"\x11" * 1024, 0)
    for what, call in [("read", lambda: h.pread(3, 1)),
                       ("write", lambda: h.pwrite(b"x" * 7, 513))]:
        try:
            call()
        except nbd.Error as e:
            if e.errnum != errno.EINVAL:
                fail(f"misaligned {what}: {e}, not EINVAL")
        else:
            fail(f"a misaligned {what} of a client that agreed to 512 was served")
    if h.pread(1024, 0) != b"\x11" * 1024:
        fail("the refused write changed the disk")
    h.shutdown()
    print("ok strict")
    sys.exit(0)

seconds = float(sys.argv[4])
handles = [connect(False), connect(False)]
for h in handles:
    if h.get_block_size(nbd.SIZE_MINIMUM) != 1:
        fail(f"a client that did not ask was told a minimum of "
             f"{h.get_block_size(nbd.SIZE_MINIMUM)}, not the default 1")
model = bytearray(handles[0].pread(size, 0))
# Bytes trimmed since last written: they may read as zeros too.
trimmed = bytearray(size)
busy = bytearray(size)
inflight = [{}, {}]
counts = {"read": 0, "write": 0, "trim": 0, "zero": 0}
seq = 0


def issue(i):
    global seq
    h = handles[i]
    if rng.random() < 0.3:
        # Whole 4 KiB blocks, which go through the ring where there is
        # one, beside read-modify-writes of their neighbours' sectors.
        ln = 4096 * rng.randint(1, 4)
        off = 4096 * rng.randrange(0, (size - ln) // 4096)
    else:
        ln = rng.choice([1, 2, 3, 100, 511, 512, 513, 1000, 4095, 4097, 9000])
        off = rng.randrange(0, size - ln)
    if any(busy[off:off + ln]):
        return False
    seq += 1
    r = rng.random()
    if r < 0.45:
        buf = nbd.Buffer(ln)
        c = h.aio_pread(buf, off)
        inflight[i][c] = ("read", buf, off, ln)
    elif r < 0.85:
        data = bytearray((seq + k) % 251 + 1 for k in range(ln))
        buf = nbd.Buffer.from_bytearray(data)
        c = h.aio_pwrite(buf, off, flags=nbd.CMD_FLAG_FUA if r > 0.8 else 0)
        inflight[i][c] = ("write", (buf, data), off, ln)
    elif r < 0.92:
        c = h.aio_trim(ln, off)
        inflight[i][c] = ("trim", None, off, ln)
    else:
        c = h.aio_zero(ln, off)
        inflight[i][c] = ("zero", None, off, ln)
    busy[off:off + ln] = b"\x01" * ln
    return True


def retire(i, c):
    kind, what, off, ln = inflight[i].pop(c)
    try:
        handles[i].aio_command_completed(c)
    except nbd.Error as e:
        fail(f"{kind} of {ln} bytes at {off} on connection {i}: {e}")
    counts[kind] += 1
    end = off + ln
    if kind == "read":
        got = what.to_bytearray()
        for k in range(ln):
            b = got[k]
            if b != model[off + k] and not (trimmed[off + k] and b == 0):
                fail(f"byte {off + k} read {b}, expected {model[off + k]} "
                     f"(a read of {ln} at {off}; {counts})")
    elif kind == "write":
        model[off:end] = what[1]
        trimmed[off:end] = bytes(ln)
    elif kind == "trim":
        trimmed[off:end] = b"\x01" * ln
    else:
        model[off:end] = bytes(ln)
        trimmed[off:end] = bytes(ln)
    busy[off:end] = bytes(ln)


end = time.monotonic() + seconds
last = time.monotonic()
while time.monotonic() < end or any(inflight):
    for i, h in enumerate(handles):
        misses = 0
        while time.monotonic() < end and len(inflight[i]) < 64 and misses < 8:
            misses += not issue(i)
        if inflight[i]:
            h.poll(10)
            while inflight[i]:
                c = h.aio_peek_command_completed()
                if c == 0 or c not in inflight[i]:
                    break
                retire(i, c)
                last = time.monotonic()
    if time.monotonic() - last > 20:
        fail(f"stalled with {[len(f) for f in inflight]} commands in flight")

for h in handles:
    h.flush()
got = handles[1].pread(size, 0)
for k in range(size):
    if got[k] != model[k] and not (trimmed[k] and got[k] == 0):
        fail(f"after the run, byte {k} reads {got[k]}, expected {model[k]}")
for h in handles:
    h.shutdown()
print("ok free", " ".join(f"{k}={v}" for k, v in counts.items()))
