"""The `zeroing` case: seed 001's zeroing phase per disk type vs raw images
of the matching preallocation under qemu-nbd, and eagerzeroedthick creation
time vs the device's direct write rate."""
import json
import os
import subprocess
import time

from ..common import prealloc_raw, ratio, sh
from ..fio import fio
from ..servers import QemuNbd, Strata


def case_zeroing(work, q):
    """Seed 001's zeroing phase (issue 9): IOPS and nb/tbz over time while a
    new disk of each type is first written with 4k random writes, vs a raw
    image of the matching preallocation under qemu-nbd (thin ~ sparse,
    zeroedthick ~ falloc: unwritten extents, eagerzeroedthick ~ full: written
    zeros); and eagerzeroedthick creation time at several sizes against the
    device's sequential direct-write rate (the limit), with qemu-img create
    -o preallocation=full as the peer."""
    size = "2G" if q else "8G"
    windows, win_s = (8, 2) if q else (15, 4)
    out = {"params": {"size": size, "windows": windows, "window_s": win_s,
                      "workload": "4k randwrite iodepth 16"}}
    peers = {"thin": "off", "zeroedthick": "falloc", "eagerzeroedthick": "full"}
    for typ, prealloc in peers.items():
        s = Strata(os.path.join(work, "zeroing_" + typ)).start()
        series = []
        try:
            t = time.perf_counter()
            s.cli("create", "d", "--size", size, "--type", typ)
            create_s = round(time.perf_counter() - t, 2)
            for w in range(windows):
                r = fio(s.uri("d"), "randwrite", "4k", runtime=win_s, size=size,
                        extra=["--randrepeat=0"])
                i = json.loads(s.cli("info", "d", "--json"))
                series.append({"t_s": (w + 1) * win_s, "iops": round(r["iops"]), "nb": i["nb"],
                               "tbz": i["tbz"], "allocated_mib": i["allocated_bytes"] >> 20})
        finally:
            s.stop()
        d = os.path.join(work, "zeroing_q_" + typ)
        os.makedirs(d, exist_ok=True)
        f = os.path.join(d, "disk.raw")
        t = time.perf_counter()
        prealloc_raw(f, size, prealloc)
        peer_create_s = round(time.perf_counter() - t, 2)
        qn = QemuNbd(f, "raw", os.path.join(d, "q.sock")).start()
        peer = []
        try:
            for w in range(windows):
                r = fio(qn.uri(), "randwrite", "4k", runtime=win_s, size=size, extra=["--randrepeat=0"])
                peer.append({"t_s": (w + 1) * win_s, "iops": round(r["iops"])})
        finally:
            qn.stop()
            os.unlink(f)
        out[typ] = {"create_s": create_s, "windows": series,
                    f"qemu_raw_{prealloc}": {"create_s": peer_create_s, "windows": peer},
                    "first_window_ratio": ratio(series[0]["iops"], peer[0]["iops"]),
                    "last_window_ratio": ratio(series[-1]["iops"], peer[-1]["iops"])}
    # Eager creation against the device's sequential write rate.
    sizes = [1, 4] if q else [1, 4, 16]
    probe = os.path.join(work, "ddprobe")
    r = subprocess.run(["dd", "if=/dev/zero", f"of={probe}", "bs=1M", "count=1024",
                        "oflag=direct", "conv=fsync"], capture_output=True, text=True)
    m = [l for l in r.stderr.splitlines() if "copied" in l]
    t = float(m[-1].split(",")[-2].split()[0]) if m else None
    os.unlink(probe)
    dev_mib_s = round(1024 / t, 1) if t else None
    out["device_seq_direct_write_mib_s"] = dev_mib_s
    eager = {}
    s = Strata(os.path.join(work, "zeroing_create")).start()
    try:
        for g in sizes:
            t = time.perf_counter()
            s.cli("create", f"e{g}", "--size", f"{g}G", "--type", "eagerzeroedthick")
            took = time.perf_counter() - t
            s.cli("rm", f"e{g}")
            d = os.path.join(work, "zeroing_qcreate")
            os.makedirs(d, exist_ok=True)
            f = os.path.join(d, "e.raw")
            t = time.perf_counter()
            prealloc_raw(f, f"{g}G", "full")
            sh("sync", f)
            qtook = time.perf_counter() - t
            os.unlink(f)
            eager[f"{g}GiB"] = {"strata_s": round(took, 2), "qemu_img_full_s": round(qtook, 2),
                                "device_limit_s": round(g * 1024 / dev_mib_s, 2) if dev_mib_s else None,
                                "strata_vs_limit": ratio(took, g * 1024 / dev_mib_s) if dev_mib_s else None}
    finally:
        s.stop()
    out["eager_create"] = eager
    return out
