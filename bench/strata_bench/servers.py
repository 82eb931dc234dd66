"""The servers the cases measure: strata serving a datastore over NBD
(`Strata`), `strata serve --vmdk` of VMDK chains (`VmdkServe`), the peer,
qemu-nbd (`QemuNbd`; `peer_raw` for a sparse raw image), and for
vhost-user-blk, qemu-storage-daemon (`qsd_vhost`) and the frontend that
drives either (`vhost_harness`, `drive_vhost`)."""
import json
import os
import signal
import subprocess
import time

from .common import (STRATA, cpu_of, example, proc_status_kib, sh, size_bytes, wait_path,
                     wait_port)


class Strata:
    def __init__(self, work, cache="128M", serve_args=()):
        # No background free-space consolidation: it would move data in
        # the middle of a measurement (cases that want it ask for it).
        self.serve_args = list(serve_args)
        if "--free-space-policy" not in self.serve_args:
            self.serve_args += ["--free-space-policy", "off"]
        self.ds = os.path.join(work, "ds")
        self.sock = os.path.join(work, "strata.sock")
        self.cache = cache
        self.proc = None
        if not os.path.exists(os.path.join(self.ds, "strata.super")):
            self.cli("init")

    def cli(self, *args):
        return sh(STRATA, "--datastore", self.ds, "--metadata-cache", self.cache, *args)

    def start(self, env=None):
        """Serve (with `env` as the server's environment, if given)."""
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        self.proc = subprocess.Popen(
            [STRATA, "--datastore", self.ds, "--metadata-cache", self.cache, "serve", "--nbd-unix", self.sock]
            + self.serve_args,
            stdout=subprocess.DEVNULL, env=env,
        )
        wait_path(self.sock, proc=self.proc)
        wait_path(os.path.join(self.ds, "control.sock"), proc=self.proc)
        return self

    def stop(self):
        if self.proc:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait()
            self.proc = None

    def uri(self, name):
        return f"nbd+unix:///{name}?socket={self.sock}"

    def settle(self):
        """Waits until the datastore reclaims nothing (removed disks' space
        going back to the pool disturbs a measurement): polled every 10 ms,
        at most 60 s."""
        t = time.monotonic()
        while json.loads(self.cli("status", "--json"))["reclaiming"]:
            if time.monotonic() - t > 60:
                raise RuntimeError("strata status: still reclaiming after 60 s")
            time.sleep(0.01)

    def cpu_seconds(self):
        """User + system CPU time of the server so far (exited threads included)."""
        return cpu_of(self.proc.pid)

    def rss_peak_kib(self):
        return proc_status_kib(self.proc.pid, "VmHWM")


class QemuNbd:
    """qemu-nbd serving PATH as export "disk" on the Unix socket SOCK, or,
    with PORT, on loopback TCP; EXTRA goes before the other options
    (e.g. a TLS credentials object)."""

    def __init__(self, path, fmt, sock=None, cache="writeback", aio=None, port=None, extra=()):
        self.path, self.fmt, self.sock, self.port = path, fmt, sock, port
        self.cache, self.aio, self.extra = cache, aio, list(extra)
        self.proc = None

    def start(self):
        if self.port is None:
            if os.path.exists(self.sock):
                os.unlink(self.sock)
            where = ["-k", self.sock]
        else:
            where = ["-b", "127.0.0.1", "-p", str(self.port)]
        aio = [f"--aio={self.aio}"] if self.aio else []
        self.proc = subprocess.Popen(
            ["qemu-nbd", *self.extra, "-f", self.fmt, *where, "-x", "disk", "--discard=unmap",
             f"--cache={self.cache}", *aio, "-e", "8", "-t", self.path],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        if self.port is None:
            wait_path(self.sock, proc=self.proc)
        else:
            wait_port(self.port, self.proc)
        return self

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
            self.proc = None

    def uri(self, _name="disk"):
        return f"nbd+unix:///disk?socket={self.sock}"


def peer_raw(work, name, size, **kw):
    """qemu-nbd on a sparse raw file of SIZE (KW: QemuNbd's port, extra)."""
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    f = os.path.join(d, "disk.raw")
    with open(f, "wb") as fh:
        fh.truncate(size_bytes(size))
    return QemuNbd(f, "raw", os.path.join(d, "q.sock"), **kw)


class VmdkServe:
    """`strata serve --vmdk` of VMDK chains, without a datastore: one file
    (export "disk") or {export name: file}, all from one server process."""

    def __init__(self, work, path):
        self.work = work
        self.files = path if isinstance(path, dict) else {"disk": path}
        self.sock = os.path.join(work, "vmdk.sock")
        self.proc = None

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        args = [STRATA, "--datastore", os.path.join(self.work, "no-datastore"), "serve",
                "--nbd-unix", self.sock, "--no-stats"]
        for name, path in self.files.items():
            args += ["--vmdk", f"{name}={path}"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        wait_path(self.sock, proc=self.proc)
        return self

    def stop(self):
        if self.proc:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait()
            self.proc = None

    def uri(self, name="disk"):
        return f"nbd+unix:///{name}?socket={self.sock}"


def vhost_harness():
    """Build the vhost-user-blk load generator
    (crates/vhost/examples/vhost_bench.rs); its path."""
    return example("strata-vhost", "vhost_bench")


def drive_vhost(harness, sock, rw, bs, iodepth, runtime, *extra):
    """One run of the harness on CPU 0 against the backend on SOCK (EXTRA:
    its `flush`, `queues=N`): its JSON line."""
    o = sh("taskset", "-c", "0", harness, sock, rw, str(bs), str(iodepth), str(runtime), *extra)
    return json.loads(o.strip().splitlines()[-1])


def qsd_vhost(raw, sock, file_opts, queues=1, iothread=False):
    """qemu-storage-daemon on CPU 1 exporting the raw file RAW as
    vhost-user-blk on SOCK, its file node opened with FILE_OPTS (e.g.
    "cache.direct=on,aio=native"); with IOTHREAD the export runs in an
    iothread (QEMU's adaptive polling, poll-max-ns 32768 by default)
    instead of the main loop. Returned once the socket is there."""
    io = ["--object", "iothread,id=io0"] if iothread else []
    proc = subprocess.Popen(
        ["taskset", "-c", "1", "qemu-storage-daemon", *io,
         "--blockdev", f"driver=file,node-name=f,filename={raw},{file_opts}",
         "--export", f"type=vhost-user-blk,id=e,node-name=f,addr.type=unix,addr.path={sock},"
                     f"writable=on,num-queues={queues}" + (",iothread=io0" if iothread else "")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_path(sock, proc=proc)
    except Exception:
        proc.kill()
        proc.wait()
        raise
    return proc
