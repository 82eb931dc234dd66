"""Fresh disks of the seed-000 series, served and removed on demand: strata
thin disks, linked clones of one base, empty SEsparse and VMFSsparse
deltas over that base's export (strata's own drivers, and QEMU's for
VMFSsparse), a sparse raw file and a qcow2 overlay under qemu-nbd. Used by
the paper_matrix and tera cases.

`empty_deltas` is the VMDK side alone: a disk exported once per subformat
(`strata export DISK --chain`, its live head unchanged since its last
snapshot, gives a flat base and an empty delta), then a factory of
independent linked clones, each a copy of the empty delta whose
descriptor names its own extent under a fresh CID, all on the one base."""
import os
import random
import re

from .common import sh, size_bytes
from .fio import fill
from .servers import QemuNbd, Strata, VmdkServe

SERIES = ["thin", "native_delta", "seSparse", "vmfsSparse", "qemu_raw", "qemu_vmfsSparse"]
SUBFORMATS = ("vmfsSparse", "seSparse")
_EXTENT = re.compile(r'(?m)^RW \d+ \w+ "([^"]+)"')


def delta_files(desc):
    """The files of one VMDK link: its descriptor DESC and the extent(s) it
    names (not its parent's)."""
    with open(desc) as f:
        names = _EXTENT.findall(f.read())
    if not names:
        raise RuntimeError(f"{desc}: no extent line")
    return [desc] + [os.path.join(os.path.dirname(desc), n) for n in names]


def empty_deltas(strata, disk, outdir):
    """Export DISK of the running STRATA server once per subformat into
    OUTDIR (DISK's live head must be unchanged since its last snapshot, so
    the chain's top is an empty delta over a flat base); returns
    `fresh(subformat, tag)`: the descriptor of a new empty delta TAG.vmdk
    over that subformat's shared base, its extent named TAG-<the suffix
    export gave the delta's extent: delta.vmdk, sesparse.vmdk>."""
    os.makedirs(outdir, exist_ok=True)
    empty = {}
    for sub in SUBFORMATS:
        strata.cli("export", disk, os.path.join(outdir, f"{sub}.vmdk"), "--chain", "--subformat", sub)
        desc = os.path.join(outdir, f"{sub}-000001.vmdk")
        if not os.path.exists(desc):
            raise RuntimeError(f"export of {disk} as {sub}: no delta {desc} (was the head changed "
                               "since its last snapshot?)")
        with open(desc) as f:
            text = f.read()
        extent = _EXTENT.search(text).group(1)
        empty[sub] = (text, extent, extent.rsplit("-", 1)[1])

    def fresh(sub, tag):
        text, extent, suffix = empty[sub]
        ext = f"{tag}-{suffix}"
        # As sparse as export wrote it.
        sh("cp", "--sparse=always", os.path.join(outdir, extent), os.path.join(outdir, ext))
        path = os.path.join(outdir, f"{tag}.vmdk")
        with open(path, "w") as f:
            f.write(re.sub(r"(?m)^CID=\w+", f"CID={random.getrandbits(32):08x}",
                           text.replace(f'"{extent}"', f'"{ext}"')))
        return path
    return fresh


class Fresh:
    """One strata datastore holding `base` (BASE_TYPE, filled with 1M
    writes when FILLED, then snapshot `s`: linked clones hang off base@s)
    and the VMDK export of base's live head (`empty_deltas`); `open` makes
    fresh disks of a series and serves them."""

    def __init__(self, work, size, base_type, filled):
        self.work, self.size, self.n = work, size, 0
        self.s = Strata(os.path.join(work, "strata")).start()
        try:
            self.s.cli("create", "base", "--size", size, "--type", base_type)
            if filled:
                fill(self.s.uri("base"), size)
            self.s.cli("snapshot", "create", "base", "s")
            self.exports = os.path.join(work, "exports")
            self.vmdk = empty_deltas(self.s, "base", self.exports)
        except Exception:
            self.s.stop()
            raise
        self.raw_base = None

    def settle(self):
        """The datastore's `Strata.settle`."""
        self.s.settle()

    def open(self, series, count, filled=False):
        """COUNT fresh disks of SERIES, FILLED (1M writes) or empty: (their
        NBD URIs, a function that stops their servers, removes them and
        waits for the datastore to settle). QEMU's VMFSsparse deltas are
        filled by strata's driver (the same files: QEMU writes new grains
        at about 2 MiB/s here, minutes per GiB) and then served by
        qemu-nbd."""
        uris, close = self._open(series, count, filled)
        if filled and series != "qemu_vmfsSparse":
            try:
                for u in uris:
                    fill(u, self.size)
            except Exception:
                close()
                raise
        self.settle()
        return uris, close

    def _open(self, series, count, filled):
        self.n += 1
        tag = f"d{self.n}"
        if series in ("thin", "native_delta"):
            names = [f"{tag}_{i}" for i in range(count)]
            for x in names:
                if series == "thin":
                    self.s.cli("create", x, "--size", self.size, "--type", "thin")
                else:
                    self.s.cli("clone", "base@s", x)

            def close():
                for x in names:
                    self.s.cli("rm", x)
                self.settle()
            return [self.s.uri(x) for x in names], close
        files, servers = [], []

        def close():
            for x in servers:
                x.stop()
            for f in files:
                os.unlink(f)

        try:
            if series in ("seSparse", "vmfsSparse"):
                descs = [self.vmdk(series, f"{tag}_{i}") for i in range(count)]
                for p in descs:
                    files += delta_files(p)
                d = os.path.join(self.work, tag)
                os.makedirs(d, exist_ok=True)
                servers.append(VmdkServe(d, {f"v{i}": p for i, p in enumerate(descs)}).start())
                return [servers[0].uri(f"v{i}") for i in range(count)], close
            for i in range(count):
                d = os.path.join(self.work, f"{tag}_{i}")
                os.makedirs(d, exist_ok=True)
                if series == "qemu_raw":
                    img, fmt = os.path.join(d, "disk.raw"), "raw"
                    with open(img, "wb") as fh:
                        fh.truncate(size_bytes(self.size))
                    files.append(img)
                elif series == "qemu_vmfsSparse":
                    img, fmt = self.vmdk("vmfsSparse", f"{tag}_{i}"), "vmdk"
                    files += delta_files(img)
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
        except Exception:
            close()
            raise
        return [q.uri() for q in servers], close

    def stop(self):
        self.s.stop()
        if self.raw_base and os.path.exists(self.raw_base):
            os.unlink(self.raw_base)
