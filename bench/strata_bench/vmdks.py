"""Fresh disks of the seed-000 series, served and removed on demand: strata
thin disks, linked clones of one base, empty SEsparse and VMFSsparse
deltas over that base's export (strata's own drivers, and QEMU's for
VMFSsparse), a sparse raw file and a qcow2 overlay under qemu-nbd. Used by
the paper_matrix and tera cases."""
import json
import os
import random
import re
import shutil
import time

from .common import sh, size_bytes
from .fio import fill
from .servers import QemuNbd, Strata, VmdkServe

SERIES = ["thin", "native_delta", "seSparse", "vmfsSparse", "qemu_raw", "qemu_vmfsSparse"]


class Fresh:
    """One strata datastore holding `base` (BASE_TYPE, filled when FILLED,
    then snapshot `s`: linked clones hang off base@s) and the export of
    base's live head, unchanged since `s`: a flat file plus an empty delta
    per VMDK subformat, copied for each fresh delta."""

    def __init__(self, work, size, base_type, filled):
        self.work, self.size, self.n = work, size, 0
        self.s = Strata(os.path.join(work, "strata")).start()
        self.s.cli("create", "base", "--size", size, "--type", base_type)
        if filled:
            fill(self.s.uri("base"), size)
        self.s.cli("snapshot", "create", "base", "s")
        self.exports = os.path.join(work, "exports")
        os.makedirs(self.exports, exist_ok=True)
        self.delta = {}
        for sub in ("vmfsSparse", "seSparse"):
            self.s.cli("export", "base", os.path.join(self.exports, f"{sub}.vmdk"), "--chain",
                       "--subformat", sub)
            desc = os.path.join(self.exports, f"{sub}-000001.vmdk")
            with open(desc) as f:
                text = f.read()
            extent = re.search(r'^RW \d+ \w+ "([^"]+)"', text, re.M).group(1)
            self.delta[sub] = (text, extent)
        self.raw_base = None

    def _vmdk(self, sub):
        """A new empty delta of SUB over the shared flat base: its descriptor."""
        self.n += 1
        text, extent = self.delta[sub]
        name = f"{sub}-c{self.n}"
        ext = f"{name}-{extent.rsplit('-', 1)[1]}"
        shutil.copyfile(os.path.join(self.exports, extent), os.path.join(self.exports, ext))
        path = os.path.join(self.exports, f"{name}.vmdk")
        with open(path, "w") as f:
            f.write(re.sub(r"(?m)^CID=\w+", f"CID={random.getrandbits(32):08x}",
                           text.replace(f'"{extent}"', f'"{ext}"')))
        return path, os.path.join(self.exports, ext)

    def _reclaimed(self):
        """Waits until removed disks are reclaimed (their space going back
        to the pool disturbs the next measurement)."""
        for _ in range(6000):
            if not json.loads(self.s.cli("status", "--json"))["reclaiming"]:
                return
            time.sleep(0.01)
        raise RuntimeError("strata status: still reclaiming after 60 s")

    def open(self, series, count, filled=False):
        """COUNT fresh disks of SERIES, FILLED (1M writes) or empty: (their
        NBD URIs, a function that stops their servers and removes them).
        QEMU's VMFSsparse deltas are filled by strata's driver (the same
        files; QEMU writes new grains at a few MiB/s here) and then served
        by qemu-nbd."""
        uris, close = self._open(series, count, filled)
        if filled and series != "qemu_vmfsSparse":
            for u in uris:
                fill(u, self.size)
        return uris, close

    def _open(self, series, count, filled):
        self.n += 1
        tag = f"d{self.n}"
        if series in ("thin", "native_delta"):
            names = [f"{tag}_{i}" for i in range(count)]
            for x in names:
                if series == "thin":
                    self.s.cli("create", x, "--size", self.size)
                else:
                    self.s.cli("clone", "base@s", x)

            def close():
                for x in names:
                    self.s.cli("rm", x)
                self._reclaimed()
            return [self.s.uri(x) for x in names], close
        files = []
        if series in ("seSparse", "vmfsSparse"):
            made = [self._vmdk(series) for _ in range(count)]
            files = [f for pair in made for f in pair]
            d = os.path.join(self.work, tag)
            os.makedirs(d, exist_ok=True)
            v = VmdkServe(d, {f"v{i}": p for i, (p, _) in enumerate(made)}).start()
            servers = [v]
            uris = [v.uri(f"v{i}") for i in range(count)]
        else:
            servers = []
            for i in range(count):
                d = os.path.join(self.work, f"{tag}_{i}")
                os.makedirs(d, exist_ok=True)
                if series == "qemu_raw":
                    img, fmt = os.path.join(d, "disk.raw"), "raw"
                    with open(img, "wb") as fh:
                        fh.truncate(size_bytes(self.size))
                    files.append(img)
                elif series == "qemu_vmfsSparse":
                    img, ext = self._vmdk("vmfsSparse")
                    fmt = "vmdk"
                    files += [img, ext]
                    if filled:
                        v = VmdkServe(d, img).start()
                        try:
                            fill(v.uri(), self.size)
                        finally:
                            v.stop()
                elif series == "qemu_qcow2":
                    if self.raw_base is None:
                        self.raw_base = os.path.join(self.work, "base.raw")
                        with open(self.raw_base, "wb") as fh:
                            fh.truncate(size_bytes(self.size))
                    img, fmt = os.path.join(d, "top.qcow2"), "qcow2"
                    sh("qemu-img", "create", "-q", "-f", "qcow2", "-b", self.raw_base, "-F", "raw", img)
                    files.append(img)
                else:
                    raise ValueError(f"no series {series}")
                servers.append(QemuNbd(img, fmt, os.path.join(d, "q.sock")).start())
            uris = [q.uri() for q in servers]

        def close():
            for x in servers:
                x.stop()
            for f in files:
                os.unlink(f)
        return uris, close

    def stop(self):
        self.s.stop()
