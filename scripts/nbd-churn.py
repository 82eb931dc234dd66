#!/usr/bin/env python3
"""Open and close many NBD connections against a running server and print
its resident memory and thread count as they go: a server that keeps
memory per connection shows it here as steady growth.

    scripts/nbd-churn.py SOCKET PID COUNT [MODE] [EXPORT]

SOCKET is the server's NBD Unix socket, PID its process (read from /proc).
MODE says how far each connection goes:
  close  connect and hang up at once
  half   read the greeting, send the client flags, hang up
  full   (default) NBD_OPT_GO on EXPORT (default 'd'), one 4 KiB read,
         NBD_CMD_DISC
Ten lines are printed, one per tenth of COUNT: connections so far,
resident KiB, threads, connections a second.
"""
import socket
import struct
import sys
import time

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REQUEST = 0x25609513
OPT_GO = 7
REP_ACK = 1
CMD_READ, CMD_DISC = 0, 2
FIXED_NEWSTYLE_NO_ZEROES = 3


def usage():
    sys.exit(__doc__.strip())


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "Threads"):
                out[key] = int(rest.split()[0])
    return out


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"the server hung up after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def one(path, mode, export):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        if mode == "close":
            return
        magic, _opt, _flags = struct.unpack(">QQH", recv_exact(s, 18))
        if magic != NBDMAGIC:
            raise ValueError(f"not an NBD server (magic {magic:#x})")
        s.sendall(struct.pack(">I", FIXED_NEWSTYLE_NO_ZEROES))
        if mode == "half":
            return
        name = export.encode()
        data = struct.pack(">I", len(name)) + name + struct.pack(">H", 0)
        s.sendall(struct.pack(">QII", IHAVEOPT, OPT_GO, len(data)) + data)
        while True:
            _m, _o, typ, length = struct.unpack(">QIII", recv_exact(s, 20))
            recv_exact(s, length)
            if typ == REP_ACK:
                break
            if typ & 0x80000000:
                raise ValueError(f"NBD_OPT_GO on '{export}' refused (reply {typ:#x})")
        s.sendall(struct.pack(">IHHQQI", REQUEST, 0, CMD_READ, 1, 0, 4096))
        _m, err, _h = struct.unpack(">IIQ", recv_exact(s, 16))
        if err:
            raise ValueError(f"read failed with NBD error {err}")
        recv_exact(s, 4096)
        s.sendall(struct.pack(">IHHQQI", REQUEST, 0, CMD_DISC, 2, 0, 0))
    finally:
        s.close()


def main():
    if len(sys.argv) not in (4, 5, 6):
        usage()
    path, pid, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else "full"
    export = sys.argv[5] if len(sys.argv) > 5 else "d"
    if mode not in ("close", "half", "full") or count < 10:
        usage()
    st = status(pid)
    print(f"start: rss {st['VmRSS']} KiB, {st['Threads']} threads", flush=True)
    t = time.time()
    for i in range(1, count + 1):
        one(path, mode, export)
        if i % (count // 10) == 0:
            time.sleep(0.2)  # let the last connection's threads exit
            st = status(pid)
            rate = i / (time.time() - t)
            print(
                f"{i}: rss {st['VmRSS']} KiB, {st['Threads']} threads, {rate:.0f}/s",
                flush=True,
            )


if __name__ == "__main__":
    main()
