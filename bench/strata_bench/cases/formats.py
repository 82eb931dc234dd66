"""The `formats` case: one disk history as a native strata disk, as the
VMDK chains strata exports and serves (vmfsSparse, seSparse), and as a
qcow2 backing chain under qemu-nbd."""
import os

from ..chains import measure_rw, on_overlay, qcow_history, slice_mib, strata_history
from ..common import ratio, smoke
from ..servers import Strata, VmdkServe


def case_formats(work, q):
    """The seeds' format comparison on one machine and one client: the same
    disk history (fill, then N snapshots each overwriting a slice) as a
    native strata disk, as VMDK chains strata exports and serves as they are
    (vmfsSparse 512 B grains, seSparse 4 KiB grains), and as a qcow2 backing
    chain under qemu-nbd. 4k random read/write IOPS at each depth."""
    size = smoke("64M", "256M" if q else "1G")
    rt = smoke(1, 2 if q else 5)
    depths = [0, 2] if q else [0, 1, 2, 4, 8, 12]
    maxd = depths[-1]
    sl = slice_mib(size, maxd)
    res = {"params": {"size": size, "runtime_s": rt, "depths": depths, "slice_mib": sl,
                      "workload": "fio 4k randread then randwrite, iodepth 16, time-based"},
           "native": {}, "vmfsSparse": {}, "seSparse": {}, "qcow2": {}}
    s = Strata(os.path.join(work, "strata")).start()
    exports = os.path.join(work, "exports")
    os.makedirs(exports, exist_ok=True)
    try:
        s.cli("create", "d", "--size", size)
        for n in strata_history(s, "d", size, maxd):
            if n not in depths:
                continue
            # Export before measuring: the measurement writes to the disk.
            s.cli("snapshot", "create", "d", f"x{n}")
            for sub in ("vmfsSparse", "seSparse"):
                s.cli("export", f"d@x{n}", os.path.join(exports, f"{sub}-{n}.vmdk"),
                      "--chain", "--subformat", sub)
            res["native"][n] = measure_rw(s.uri("d"), rt)
            s.cli("snapshot", "revert", "d", f"x{n}")
            s.cli("snapshot", "delete", "d", f"x{n}")
    finally:
        s.stop()
    print("   native + exports done", flush=True)
    for sub in ("vmfsSparse", "seSparse"):
        for n in depths:
            first = os.path.join(exports, f"{sub}-{n}.vmdk")
            # export --chain names the links N.vmdk, N-000001.vmdk, ...; the
            # chain through d@xN has n+? links: serve the last one.
            stem = first[:-5]
            links = sorted(f for f in os.listdir(exports) if f.startswith(os.path.basename(stem) + "-0"))
            links = [f for f in links if not f.endswith(("-delta.vmdk", "-sesparse.vmdk", "-flat.vmdk"))]
            top = os.path.join(exports, links[-1]) if links else first
            v = VmdkServe(os.path.join(work, sub), top)
            os.makedirs(v.work, exist_ok=True)
            v.start()
            try:
                res[sub][n] = dict(measure_rw(v.uri(), rt), links=len(links) + 1)
            finally:
                v.stop()
        print(f"   {sub} done", flush=True)
    d = os.path.join(work, "qcow2")
    os.makedirs(d, exist_ok=True)
    sock = os.path.join(d, "q.sock")
    for n, chain in qcow_history(d, sock, size, maxd):
        if n in depths:
            res["qcow2"][n] = on_overlay(d, chain[-1], sock, lambda uri: measure_rw(uri, rt))
    print("   qcow2 done", flush=True)
    res["relative_to_depth0"] = {
        k: {n: ratio(res[k][n]["randread_iops"], res[k][depths[0]]["randread_iops"]) for n in depths}
        for k in ("native", "vmfsSparse", "seSparse", "qcow2")}
    return res
