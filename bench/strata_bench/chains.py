"""What the chain, clone and formats cases share: a disk history of slices
overwritten after each snapshot (on strata) or in each new overlay of a
qcow2 backing chain (the peer), and the 4k random read/write pair measured
at a depth."""
import os

from .common import sh, timed
from .fio import fio


def measure_rw(uri, rt):
    r = fio(uri, "randread", "4k", runtime=rt)["iops"]
    w = fio(uri, "randwrite", "4k", runtime=rt)["iops"]
    return {"randread_iops": round(r, 1), "randwrite_iops": round(w, 1)}


def fio_write_slice(uri, off_mib, len_mib):
    fio(uri, "write", "1M", iodepth=8, size=f"{len_mib}M", extra=[f"--offset={off_mib}M"])


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
