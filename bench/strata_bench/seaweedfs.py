"""SeaweedFS on loopback (issue 12), the object store of the multihost,
claims, crypto and space cases, started as the tests start it; a strata
host of an object-store datastore; and the store's own ceiling."""
import atexit
import json
import os
import random
import shutil
import socket
import subprocess
import time

from .common import STRATA, example
from .servers import Strata

S3_KEY, S3_SECRET = "strata-bench", "strata-bench-secret"


def _free_port_base():
    # Below the kernel's ephemeral ports (32768 and up: any outgoing
    # connection may take one between this check and weed's bind) and
    # apart from the tests' SeaweedFS (crates/s3/src/testing.rs: bases
    # 10000-16000 and their gRPC twins 20000-26000), which run beside the
    # benchmark smoke under `make test`.
    for _ in range(100):
        base = random.randint(16010, 19990)
        ok = True
        for p in range(base, base + 4):
            with socket.socket() as so:
                try:
                    so.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        # SeaweedFS also listens on port + 10000 (gRPC).
        for p in range(base + 10000, base + 10004):
            with socket.socket() as so:
                try:
                    so.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        if ok and base + 10004 < 65535:
            return base
    raise RuntimeError("no free ports for SeaweedFS")


def _remove_grpc_sockets(base):
    """`weed server` leaves a Unix socket per gRPC service (each on its
    port + 10000) in the temporary directory; no flag moves them."""
    tmp = os.environ.get("TMPDIR", "/tmp")
    for i, kind in enumerate(["master", "volume", "filer", "s3"]):
        try:
            os.remove(os.path.join(tmp, f"seaweedfs-{kind}-grpc-{base + i + 10000}.sock"))
        except OSError:
            pass


def start_seaweedfs(work):
    """`weed server` with S3 on loopback (as the tests run it); returns
    (process, endpoint) and sets the AWS_* variables for strata."""
    weed = shutil.which("weed")
    if not weed:
        raise RuntimeError("SeaweedFS ('weed') is not installed: run scripts/install-deps.sh")
    d = os.path.join(work, "seaweedfs")
    os.makedirs(os.path.join(d, "data"), exist_ok=True)
    cfg = os.path.join(d, "s3.json")
    with open(cfg, "w") as f:
        json.dump({"identities": [{"name": "strata", "credentials": [
            {"accessKey": S3_KEY, "secretKey": S3_SECRET}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
    base = _free_port_base()
    log = open(os.path.join(d, "weed.log"), "w")
    proc = subprocess.Popen(
        [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={d}/data",
         f"-master.port={base}", f"-volume.port={base + 1}", "-filer", f"-filer.port={base + 2}",
         "-s3", f"-s3.port={base + 3}", f"-s3.config={cfg}", "-s3.port.iceberg=0",
         "-s3.port.lance=0", f"-filer.localSocket={d}/filer.sock", f"-s3.localSocket={d}/s3.sock",
         "-master.volumeSizeLimitMB=256", "-volume.max=0"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    # The callers stop the server; its sockets go when the bench ends.
    atexit.register(_remove_grpc_sockets, base)
    endpoint = f"http://127.0.0.1:{base + 3}"
    os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": S3_KEY,
                       "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_REGION": "us-east-1"})
    return proc, endpoint


def stop_seaweedfs(proc, grace=20):
    """Stop a server `start_seaweedfs` started: SIGTERM, then SIGKILL if it
    has not exited within `grace` seconds. (`weed server` can hang in its
    shutdown: its filer stops while the master keeps retrying to reach it,
    so a bare terminate-and-wait never returned; the tests' harness kills it
    for the same reason.)"""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# Segment uploads a commit keeps in flight (crates/objstore: the upload
# pipeline's depth), the depth the raw PUT ceiling is measured at.
UPLOAD_DEPTH = 2


class ObjectStoreStrata(Strata):
    """`strata serve` of a directory attached to an object-store datastore
    (started, stopped and addressed as a local one)."""

    def __init__(self, work, url, attach=False):
        self.ds = work
        self.sock = work + ".sock"
        self.cache = "128M"
        self.serve_args = []
        self.proc = None
        t0 = time.time()
        while True:
            r = subprocess.run([STRATA, "--datastore", self.ds, "attach" if attach else "init",
                                "--object-store", url], capture_output=True, text=True)
            if r.returncode == 0:
                break
            # The gateway answers before the filer behind it is ready.
            if time.time() - t0 > 60:
                raise RuntimeError(f"strata init --object-store {url}: {r.stderr}")
            time.sleep(0.5)


def store_ceiling(seconds, depth):
    """What the same SeaweedFS takes without strata (the store_ceiling
    example of strata-s3, against the endpoint in AWS_ENDPOINT_URL):
    8 MiB PUTs and GETs with `depth` in flight, and one create-only PUT of
    256 KiB / 16 KiB at a time."""
    ceiling = example("strata-s3", "store_ceiling", ["testing"])
    env = dict(os.environ,
               STRATA_CEILING_URL=f"s3://strata-bench/ceiling-{random.randrange(1 << 32):08x}")
    out = subprocess.run([ceiling, str(seconds),
                          str(depth), "8"], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"store_ceiling failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
