"""An NBD client whose WRITE payloads arrive in pieces, with pauses:
the server must not wait for bytes the client has not sent (tls.rs,
a_write_payload_that_trickles_in_is_served_over_tls_and_plain).

    nbd_trickle.py HOST PORT EXPORT CA_CERT|-   (-: no TLS)

Exits 0 after writing and reading back every pattern; anything else is
a failure, with what happened on stderr. Every socket wait is bounded
(20 s), so a server that waits for ever fails the test, not hangs it."""
import socket
import ssl
import struct
import sys
import time

host, port, export, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4]
OPT_MAGIC, REQ_MAGIC, SIMPLE_MAGIC = 0x49484156454F5054, 0x25609513, 0x67446698


def recv(s, n):
    b = b""
    while len(b) < n:
        chunk = s.recv(n - len(b))
        if not chunk:
            sys.exit(f"the server closed the connection ({len(b)} of {n} bytes)")
        b += chunk
    return b


def option(s, opt, data):
    s.sendall(struct.pack(">QII", OPT_MAGIC, opt, len(data)) + data)


def opt_reply(s):
    _, opt, ty, n = struct.unpack(">QIII", recv(s, 20))
    return ty, recv(s, n)


s = socket.create_connection((host, port), timeout=20)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
hello = recv(s, 18)
assert hello[:8] == b"NBDMAGIC", hello
s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
if ca != "-":
    option(s, 5, b"")  # STARTTLS
    ty, _ = opt_reply(s)
    assert ty == 1, f"STARTTLS answered {ty:#x}"
    ctx = ssl.create_default_context(cafile=ca)
    s = ctx.wrap_socket(s, server_hostname="localhost")
option(s, 7, struct.pack(">I", len(export)) + export + struct.pack(">H", 0))  # GO
while True:
    ty, data = opt_reply(s)
    if ty == 1:
        break
    assert ty == 3, f"GO answered {ty:#x}: {data!r}"


def reply(s, cookie):
    magic, err, got = struct.unpack(">IIQ", recv(s, 16))
    assert magic == SIMPLE_MAGIC and got == cookie, (magic, got, cookie)
    assert err == 0, f"request {cookie} failed: errno {err}"


def pattern(seed, n):
    return bytes((seed * 131 + i * 7 + (i >> 9)) & 0xFF for i in range(n))


# (payload length, the pieces it is sent in: bytes, then a pause)
plans = [
    (640 << 10, [100 << 10, 3, 200 << 10, 1, (64 << 10) + 5]),
    (256 << 10, [1]),  # the header and one byte, then the rest later
    (1 << 20, [(1 << 20) - 1]),  # all but the last byte
    (96 << 10, [4096] * 8),
]
offset = 0
for i, (n, pieces) in enumerate(plans):
    data = pattern(i + 1, n)
    cookie = i + 1
    s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, 1, cookie, offset, n))
    at = 0
    for p in pieces:
        s.sendall(data[at:at + p])
        at += p
        time.sleep(0.15)
    s.sendall(data[at:])
    reply(s, cookie)
    # A small request right after: the reader waits for the first byte again.
    s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, 0, 100 + i, offset, 512))
    reply(s, 100 + i)
    assert recv(s, 512) == data[:512], f"write {i}: first sector differs"
    s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, 0, 200 + i, offset, n))
    reply(s, 200 + i)
    assert recv(s, n) == data, f"write {i}: read back differs"
    offset += n
s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, 2, 999, 0, 0))  # DISC
print("ok")
