"""The `tls` case (issue 28): NBD over TLS, strata against qemu-nbd with
the same x509 credentials (openssl-made, QEMU's directory layout), each
over TCP on loopback, fio's nbd engine (libnbd, GnuTLS) as the client;
and strata without TLS, for what TLS itself costs. Both servers write
through the host page cache (strata's datastore, qemu-nbd's raw file);
neither asks for client certificates."""
import os

from ..common import free_port, ratio, sh, smoke
from ..fio import fill, fio
from ..servers import Strata, peer_raw


def _creds(work):
    """A CA, a server certificate for localhost, and the clients' view
    of them (the CA only): (server dir, client dir)."""
    srv, cli = os.path.join(work, "srv"), os.path.join(work, "home", ".pki", "libnbd")
    os.makedirs(srv, exist_ok=True)
    os.makedirs(cli, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    sh("openssl", "req", "-x509", *ec, "-keyout", f"{work}/ca-key.pem", "-out",
       f"{srv}/ca-cert.pem", "-days", "30", "-subj", "/CN=bench CA")
    sh("openssl", "req", *ec, "-keyout", f"{srv}/server-key.pem", "-out", f"{work}/s.csr",
       "-subj", "/CN=localhost")
    with open(f"{work}/ext", "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    sh("openssl", "x509", "-req", "-in", f"{work}/s.csr", "-CA", f"{srv}/ca-cert.pem", "-CAkey",
       f"{work}/ca-key.pem", "-CAcreateserial", "-out", f"{srv}/server-cert.pem", "-days", "30",
       "-extfile", f"{work}/ext")
    sh("cp", f"{srv}/ca-cert.pem", f"{cli}/ca-cert.pem")
    return srv, os.path.join(work, "home")


def case_tls(work, q):
    size = smoke("64M", "1G" if q else "2G")
    rt = smoke(2, 8 if q else 15)
    srv, home = _creds(work)
    # libnbd finds the CA in $HOME/.pki/libnbd (fio cannot pass a
    # certificates directory in its URI).
    env_home = os.environ.get("HOME")
    os.environ["HOME"] = home
    jobs = [("randread", "4k"), ("read", "1M"), ("write", "512k")]
    out = {"params": {"size": size, "runtime_s": rt, "iodepth": 16}}
    try:
        s = Strata(os.path.join(work, "s"))
        s.cli("create", "d", "--size", size)
        port = free_port()
        s.serve_args += ["--nbd-tcp", f"127.0.0.1:{port}", "--tls-creds", srv, "--tls", "allow"]
        s.start()
        try:
            fill(f"nbds://localhost:{port}/d", size)
            mine = {f"{rw}_{bs}": fio(f"nbds://localhost:{port}/d", rw, bs, runtime=rt, size=size)
                    for rw, bs in jobs}
            plain = {f"{rw}_{bs}": fio(f"nbd://127.0.0.1:{port}/d", rw, bs, runtime=rt, size=size)
                     for rw, bs in jobs}
        finally:
            s.stop()
        qn = peer_raw(work, "q", size, port=free_port(), extra=[
            "--object", f"tls-creds-x509,id=tls0,endpoint=server,dir={srv},verify-peer=off",
            "--tls-creds", "tls0"]).start()
        quri = f"nbds://localhost:{qn.port}/disk"
        try:
            fill(quri, size)
            peer = {f"{rw}_{bs}": fio(quri, rw, bs, runtime=rt, size=size) for rw, bs in jobs}
        finally:
            qn.stop()
    finally:
        if env_home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = env_home
    for k in mine:
        out[k] = {"strata_tls_iops": round(mine[k]["iops"]), "qemu_nbd_tls_iops": round(peer[k]["iops"]),
                  "strata_plain_iops": round(plain[k]["iops"]),
                  "strata_tls_mib_s": round(mine[k]["bw_mib"], 1),
                  "qemu_nbd_tls_mib_s": round(peer[k]["bw_mib"], 1),
                  "ratio_to_qemu_nbd_tls": ratio(mine[k]["iops"], peer[k]["iops"]),
                  "tls_over_plain": ratio(mine[k]["iops"], plain[k]["iops"]),
                  "target": ">= 1.0 qemu-nbd with TLS"}
    return out
