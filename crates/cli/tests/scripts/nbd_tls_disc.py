"""An NBD client that ends its session over TLS with DISC, and checks the
server ends the TLS session (close_notify) before the connection, as the
protocol requires (nbd_protocol.rs,
disc_over_tls_ends_the_tls_session_before_the_connection).

    nbd_tls_disc.py SOCKET EXPORT CA_CERT

SOCKET is the server's Unix socket. Exits 0 and prints "ok" when, after
DISC, the server's close_notify arrives and then the end of the
connection; anything else is a failure, with what happened on stderr.
Every socket wait is bounded (20 s)."""
import socket
import ssl
import struct
import sys

path, export, ca = sys.argv[1], sys.argv[2].encode(), sys.argv[3]
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
    _, _, ty, n = struct.unpack(">QIII", recv(s, 20))
    return ty, recv(s, n)


s = socket.socket(socket.AF_UNIX)
s.settimeout(20)
s.connect(path)
assert recv(s, 18)[:8] == b"NBDMAGIC"
s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
option(s, 5, b"")  # STARTTLS
ty, _ = opt_reply(s)
assert ty == 1, f"STARTTLS answered {ty:#x}"
ctx = ssl.create_default_context(cafile=ca)
# Without suppress_ragged_eofs=False an end without close_notify would
# read as a clean one.
s = ctx.wrap_socket(s, server_hostname="localhost", suppress_ragged_eofs=False)
option(s, 7, struct.pack(">I", len(export)) + export + struct.pack(">H", 0))  # GO
while True:
    ty, data = opt_reply(s)
    if ty == 1:
        break
    assert ty == 3, f"GO answered {ty:#x}: {data!r}"
# One WRITE answered, so the session is in use, then DISC.
s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, 1, 7, 0, 512) + b"\x5a" * 512)
magic, err, cookie = struct.unpack(">IIQ", recv(s, 16))
assert (magic, err, cookie) == (SIMPLE_MAGIC, 0, 7), (magic, err, cookie)
s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, 2, 8, 0, 0))
try:
    rest = s.recv(64)
except ssl.SSLEOFError as e:
    sys.exit(f"after DISC the connection ended without close_notify: {e}")
except OSError as e:
    sys.exit(f"after DISC: {e!r}")
if rest:
    sys.exit(f"after DISC the server sent {rest!r}")
print("ok")
