"""The `depth` case: 4k random reads of data spread over 32 snapshot levels
vs the same data with none [>= 0.95], and the peer's cost of depth: qcow2
with a 12-deep backing chain vs qcow2 alone."""
import os

from ..common import ratio, sh
from ..fio import fill, fio
from ..servers import QemuNbd, Strata


def case_depth(work, q):
    size_gib = 1 if q else 4
    size = f"{size_gib}G"
    rt = 8 if q else 20
    levels = 32
    res = {}
    s = Strata(os.path.join(work, "depth")).start()
    try:
        s.cli("create", "flat", "--size", size)
        s.cli("create", "deep", "--size", size)
        fill(s.uri("flat"), size)
        chunk = size_gib * 1024 // levels
        for i in range(levels):
            fio(s.uri("deep"), "write", "1M", iodepth=8, size=f"{chunk}M",
                extra=[f"--offset={i * chunk}M", "--end_fsync=1"])
            s.cli("snapshot", "create", "deep", f"s{i}")
        # Alternate the two and average, so warm-up and noise hit both alike.
        runs = {"flat": [], "deep": []}
        for _ in range(2):
            for name in ("flat", "deep"):
                runs[name].append(fio(s.uri(name), "randread", "4k", runtime=rt // 2)["iops"])
        flat = {"iops": sum(runs["flat"]) / 2}
        deep = {"iops": sum(runs["deep"]) / 2}
    finally:
        s.stop()
    res["strata_32_snapshots_vs_none"] = {"none_iops": flat["iops"], "deep_iops": deep["iops"],
                                          "ratio": ratio(deep["iops"], flat["iops"]), "target": ">= 0.95"}
    # The peer: qcow2 with a 12-deep backing chain, same data spread.
    d = os.path.join(work, "qcow")
    os.makedirs(d, exist_ok=True)
    base = os.path.join(d, "flat.qcow2")
    sh("qemu-img", "create", "-f", "qcow2", base, size)
    qn = QemuNbd(base, "qcow2", os.path.join(d, "q.sock")).start()
    try:
        fill(qn.uri(), size)
        qflat = fio(qn.uri(), "randread", "4k", runtime=rt)
    finally:
        qn.stop()
    depth = 12
    prev = os.path.join(d, "c0.qcow2")
    sh("qemu-img", "create", "-f", "qcow2", prev, size)
    chunk = size_gib * 1024 // (depth + 1)
    for i in range(depth + 1):
        if i > 0:
            nxt = os.path.join(d, f"c{i}.qcow2")
            sh("qemu-img", "create", "-f", "qcow2", "-b", prev, "-F", "qcow2", nxt)
            prev = nxt
        qn = QemuNbd(prev, "qcow2", os.path.join(d, "q.sock")).start()
        try:
            fio(qn.uri(), "write", "1M", iodepth=8, size=f"{chunk}M", extra=[f"--offset={i * chunk}M"])
        finally:
            qn.stop()
    qn = QemuNbd(prev, "qcow2", os.path.join(d, "q.sock")).start()
    try:
        qdeep = fio(qn.uri(), "randread", "4k", runtime=rt,
                    extra=[f"--size={chunk * (depth + 1)}M"])
    finally:
        qn.stop()
    res["qcow2_12_chain_vs_none"] = {"none_iops": qflat["iops"], "deep_iops": qdeep["iops"],
                                     "ratio": ratio(qdeep["iops"], qflat["iops"])}
    res["strata_deep_vs_qcow2_deep"] = {"ratio": ratio(deep["iops"], qdeep["iops"])}
    return res
