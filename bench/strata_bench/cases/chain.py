"""The `chain` case (paper suite): 4k random read and write vs snapshot
depth, then after deleting snapshots oldest first, vs a qcow2 backing chain
of the same depth."""
import os

from .. import common
from ..chains import (fio_write_slice, measure_rw, qcow_chain_step, qcow_delete_oldest, slice_mib,
                      slice_off, strata_history)
from ..common import smoke, timed
from ..fio import fill
from ..servers import QemuNbd, Strata


def chain_depths(q):
    d = list(range(5)) if q else list(range(13)) + [16, 20, 24, 28, 32]
    if common.CHAIN_MAX is not None:
        d = [x for x in d if x <= common.CHAIN_MAX]
    return d


def case_chain(work, q):
    size = smoke("64M", "256M" if q else "2G")
    rt = smoke(1, 2 if q else 5)
    depths = chain_depths(q)
    maxd = depths[-1]
    sl = slice_mib(size, maxd)
    res = {"params": {"size": size, "runtime_s": rt, "depths": depths, "slice_mib": sl,
                      "workload": "fio 4k randread then randwrite, iodepth 16, time-based"}}
    # strata: one disk, snapshots on top of it.
    grow, shrink = {}, {}
    s = Strata(os.path.join(work, "strata")).start()
    try:
        s.cli("create", "d", "--size", size)
        for n in strata_history(s, "d", size, maxd):
            if n in depths:
                grow[n] = measure_rw(s.uri("d"), rt)
        print("   strata growing done", flush=True)
        for n in range(1, maxd + 1):
            ms = timed(lambda: s.cli("snapshot", "delete", "d", f"s{n}"))
            left = maxd - n
            if left in depths:
                shrink[left] = dict(measure_rw(s.uri("d"), rt), delete_ms=ms)
        print("   strata deleting done", flush=True)
    finally:
        s.stop()
    res["strata"] = {"growing": grow, "after_delete": shrink}
    # qcow2: a backing chain of the same depth, the same slices overwritten.
    d = os.path.join(work, "qcow2")
    os.makedirs(d, exist_ok=True)
    sock = os.path.join(d, "q.sock")
    qgrow, qshrink = {}, {}
    chain = [qcow_chain_step(d, None, 0, size)]
    qn = QemuNbd(chain[-1], "qcow2", sock).start()
    try:
        fill(qn.uri(), size)
        qgrow[0] = measure_rw(qn.uri(), rt)
    finally:
        qn.stop()
    for n in range(1, maxd + 1):
        chain.append(qcow_chain_step(d, chain[-1], n, size))
        qn = QemuNbd(chain[-1], "qcow2", sock).start()
        try:
            fio_write_slice(qn.uri(), slice_off(size, maxd, n), sl)
            if n in depths:
                qgrow[n] = measure_rw(qn.uri(), rt)
        finally:
            qn.stop()
    print("   qcow2 growing done", flush=True)
    # Deleting the oldest snapshot of a qcow2 chain (chains.qcow_delete_oldest);
    # its time is recorded as delete_ms.
    for n in range(1, maxd + 1):
        ms = qcow_delete_oldest(chain)
        left = maxd - n
        if left in depths:
            qn = QemuNbd(chain[-1], "qcow2", sock).start()
            try:
                qshrink[left] = dict(measure_rw(qn.uri(), rt), delete_ms=ms)
            finally:
                qn.stop()
    print("   qcow2 deleting done", flush=True)
    res["qcow2"] = {"growing": qgrow, "after_delete": qshrink}
    return res
