"""What the chain, clone and formats cases share: a disk history of slices
overwritten after each snapshot (on strata) or in each new overlay of a
qcow2 backing chain (the peer), and the 4k random read/write pair measured
at a depth."""
import os

from .common import sh
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
