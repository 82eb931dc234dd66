"""What the chain, clone, formats and snapchain cases share: a disk
history of slices overwritten after each snapshot (on strata) or in each
new overlay of a qcow2 backing chain (the peer), measurements on a
throwaway overlay, and the 4k random read/write pair measured at a
depth."""
import os

from .common import sh, size_bytes, timed
from .fio import fill, fio
from .servers import QemuNbd


def measure_rw(uri, rt):
    r = fio(uri, "randread", "4k", runtime=rt)["iops"]
    w = fio(uri, "randwrite", "4k", runtime=rt)["iops"]
    return {"randread_iops": round(r, 1), "randwrite_iops": round(w, 1)}


def fio_write_slice(uri, off_mib, len_mib):
    fio(uri, "write", "1M", iodepth=8, size=f"{len_mib}M", extra=[f"--offset={off_mib}M"])


def slice_mib(size, depth):
    """The MiB overwritten after each snapshot of a history DEPTH deep on a
    disk of SIZE (the slices together cover the disk once)."""
    return max(1, (size_bytes(size) >> 20) // max(depth, 1))


def slice_off(size, depth, n):
    """Where step N's slice starts, in MiB."""
    return ((n - 1) * slice_mib(size, depth)) % (size_bytes(size) >> 20)


def strata_history(s, disk, size, depth):
    """Builds the history on DISK (of SIZE, already created) of the running
    strata server S: filled with 1M writes, then for each step n = 1 ..
    DEPTH a snapshot s{n} and the next slice overwritten. Yields n after
    each step (0: filled), so the caller measures at the depths it wants."""
    fill(s.uri(disk), size)
    yield 0
    for n in range(1, depth + 1):
        s.cli("snapshot", "create", disk, f"s{n}")
        fio_write_slice(s.uri(disk), slice_off(size, depth, n), slice_mib(size, depth))
        yield n


def qcow_history(d, sock, size, depth):
    """The same history as a qcow2 backing chain in directory D: a base c0
    filled, then for each step an overlay c{n} with the next slice written,
    each through qemu-nbd on SOCK, stopped before yielding. Yields (n,
    chain): the chain's paths, base first (one list, grown in place)."""
    chain = [qcow_chain_step(d, None, 0, size)]
    for n in range(depth + 1):
        if n > 0:
            chain.append(qcow_chain_step(d, chain[-1], n, size))
        qn = QemuNbd(chain[-1], "qcow2", sock).start()
        try:
            if n == 0:
                fill(qn.uri(), size)
            else:
                fio_write_slice(qn.uri(), slice_off(size, depth, n), slice_mib(size, depth))
        finally:
            qn.stop()
        yield n, chain


def on_overlay(d, top, sock, measure):
    """MEASURE(uri) on a throwaway qcow2 overlay over TOP in D, served on
    SOCK, so the chain stays as built; its result."""
    m = os.path.join(d, "measure.qcow2")
    sh("qemu-img", "create", "-f", "qcow2", "-b", top, "-F", "qcow2", m)
    qm = QemuNbd(m, "qcow2", sock).start()
    try:
        return measure(qm.uri())
    finally:
        qm.stop()
        os.unlink(m)


def qcow_chain_step(d, prev, i, size):
    """Create overlay c{i} on prev (or a fresh base if prev is None); returns its path."""
    nxt = os.path.join(d, f"c{i}.qcow2")
    if prev is None:
        sh("qemu-img", "create", "-f", "qcow2", nxt, size)
    else:
        sh("qemu-img", "create", "-f", "qcow2", "-b", prev, "-F", "qcow2", nxt)
    return nxt


def qcow_delete_oldest(chain):
    """Deletes the oldest snapshot of a qcow2 backing CHAIN (paths, base
    first): commits the first overlay into the base and rebases the next
    onto the base (what blockcommit does offline), removes the overlay
    from the list and the disk; the milliseconds the two qemu-img calls
    took."""
    base, victim = chain[0], chain[1]
    nxt = chain[2] if len(chain) > 2 else None

    def delete():
        sh("qemu-img", "commit", "-f", "qcow2", "-d", victim)
        if nxt:
            sh("qemu-img", "rebase", "-u", "-f", "qcow2", "-b", base, "-F", "qcow2", nxt)
    ms = timed(delete)
    os.unlink(victim)
    chain.pop(1)
    return ms
