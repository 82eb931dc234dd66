"""The `tls` case (issue 28): NBD over TLS, strata against qemu-nbd with
the same x509 credentials (openssl-made, QEMU's directory layout), each
over TCP on loopback, fio's nbd engine (libnbd, GnuTLS) as the client;
and strata without TLS, for what TLS itself costs. Both servers write
through the host page cache (strata's datastore, qemu-nbd's raw file);
neither asks for client certificates."""
import os
from statistics import median

from ..common import cpu_of, free_port, ratio, sh, smoke, sync_host
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


def paired(mine, theirs):
    """The median of pass-by-pass IOPS ratios."""
    return ratio(median(a["iops"] / b["iops"] for a, b in zip(mine, theirs)), 1)


def case_tls(work, q):
    """Each job runs on strata with TLS, qemu-nbd with TLS and strata
    without, one after the other, in passes (five in a full run). The
    ratio is the median of the passes' ratios: a pass's runs are
    neighbours in time, so a slow spell of the machine lands on both sides
    of one ratio (the same job's figures moved by 40% from one pass to the
    next on this two-core VM, for both servers at once). fio runs on CPU 0
    and each server on CPU 1 (taskset): unpinned, where the scheduler put
    fio's encrypting thread against the server's decrypting one decided
    the figure (one 512k write job measured 0.68x and 1.5x qemu-nbd in two
    runs). Dirty pages are synced before each run, so one server's
    writeback does not land in another's run. Server CPU per GiB moved is
    taken from /proc."""
    size = smoke("64M", "1G" if q else "2G")
    rt = smoke(2, 5 if q else 8)
    passes = smoke(1, 3 if q else 5)
    srv, home = _creds(work)
    # libnbd finds the CA in $HOME/.pki/libnbd (fio cannot pass a
    # certificates directory in its URI).
    env_home = os.environ.get("HOME")
    os.environ["HOME"] = home
    jobs = [("randread", "4k"), ("read", "1M"), ("write", "512k")]
    out = {"params": {"size": size, "runtime_s": rt, "iodepth": 16, "passes": passes,
                      "cpus": "fio on CPU 0, each server on CPU 1"}}
    s = Strata(os.path.join(work, "s"))
    s.cli("create", "d", "--size", size)
    port = free_port()
    s.serve_args += ["--nbd-tcp", f"127.0.0.1:{port}", "--tls-creds", srv, "--tls", "allow"]
    qn = peer_raw(work, "q", size, port=free_port(), extra=[
        "--object", f"tls-creds-x509,id=tls0,endpoint=server,dir={srv},verify-peer=off",
        "--tls-creds", "tls0"])
    try:
        s.start()
        sh("taskset", "-pac", "1", str(s.proc.pid))
        qn.start()
        sh("taskset", "-pac", "1", str(qn.proc.pid))
        peers = {"strata_tls": (f"nbds://localhost:{port}/d", s.proc.pid),
                 "qemu_nbd_tls": (f"nbds://localhost:{qn.port}/disk", qn.proc.pid),
                 "strata_plain": (f"nbd://127.0.0.1:{port}/d", s.proc.pid)}
        fill(peers["strata_tls"][0], size)
        fill(peers["qemu_nbd_tls"][0], size)
        for rw, bs in jobs:
            runs = {who: [] for who in peers}
            for _ in range(passes):
                for who, (uri, pid) in peers.items():
                    sync_host()
                    c0 = cpu_of(pid)
                    r = fio(uri, rw, bs, runtime=rt, size=size, extra=["--cpus_allowed=0"])
                    r["cpu_s_per_gib"] = (cpu_of(pid) - c0) / max(r["bw_mib"] * rt / 1024, 1e-9)
                    runs[who].append(r)
            med = {who: {k: median(x[k] for x in rs) for k in ("iops", "bw_mib", "cpu_s_per_gib")}
                   for who, rs in runs.items()}
            mine, peer, plain = med["strata_tls"], med["qemu_nbd_tls"], med["strata_plain"]
            out[f"{rw}_{bs}"] = {
                "strata_tls_iops": round(mine["iops"]), "qemu_nbd_tls_iops": round(peer["iops"]),
                "strata_plain_iops": round(plain["iops"]),
                "strata_tls_mib_s": round(mine["bw_mib"], 1),
                "qemu_nbd_tls_mib_s": round(peer["bw_mib"], 1),
                "strata_tls_passes_mib_s": [round(x["bw_mib"], 1) for x in runs["strata_tls"]],
                "qemu_nbd_tls_passes_mib_s": [round(x["bw_mib"], 1) for x in runs["qemu_nbd_tls"]],
                "strata_tls_cpu_s_per_gib": round(mine["cpu_s_per_gib"], 3),
                "qemu_nbd_tls_cpu_s_per_gib": round(peer["cpu_s_per_gib"], 3),
                "ratio_to_qemu_nbd_tls": paired(runs["strata_tls"], runs["qemu_nbd_tls"]),
                "tls_over_plain": paired(runs["strata_tls"], runs["strata_plain"]),
                "target": ">= 1.0 qemu-nbd with TLS"}
    finally:
        s.stop()
        qn.stop()
        if env_home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = env_home
    return out
