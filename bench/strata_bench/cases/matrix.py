"""The `matrix` case (paper suite): the SEsparse Iometer matrix, 4k/64k/512k
x seq/rand x read/write on thin, zeroedthick, eagerzeroedthick and delta
disks, empty and full, vs qemu-nbd raw (and qcow2 in full mode)."""
import os

from ..common import ratio, sh, size_bytes, smoke
from ..fio import fill, fio
from ..servers import QemuNbd, Strata


MATRIX_TYPES = ["thin", "zeroedthick", "eagerzeroedthick", "delta"]
FIO_RW = {("seq", "read"): "read", ("seq", "write"): "write",
          ("rand", "read"): "randread", ("rand", "write"): "randwrite"}


def matrix_cells(q):
    """Cell names, e.g. '4k_rand_read', in table order."""
    bss = ["4k", "512k"] if q else ["4k", "64k", "512k"]
    return [f"{bs}_{pat}_{op}" for bs in bss for pat in ("seq", "rand") for op in ("read", "write")]


def run_cell(uri, cell, rt):
    bs, pat, op = cell.split("_")
    r = fio(uri, FIO_RW[(pat, op)], bs, iodepth=8 if bs == "512k" else 16, runtime=rt)
    return {"iops": round(r["iops"], 1), "mib_s": round(r["bw_mib"], 1)}


def _mkdisk(s, name, typ, size):
    """A strata disk of one of MATRIX_TYPES; 'delta' is a filled thin disk after a snapshot."""
    if typ == "delta":
        s.cli("create", name, "--size", size, "--type", "thin")
        fill(s.uri(name), size)
        s.cli("snapshot", "create", name, "base")
    else:
        s.cli("create", name, "--size", size, "--type", typ)


def matrix_strata(work, q, size, rt, cells):
    out = {}
    reads = [c for c in cells if c.endswith("_read")]
    writes = [c for c in cells if c.endswith("_write")]
    s = Strata(os.path.join(work, "strata")).start()
    try:
        n = 0
        for typ in MATRIX_TYPES:
            out[typ] = {"empty": {}, "full": {}}
            # Empty: reads on one fresh disk, each write cell on its own fresh disk.
            n += 1
            _mkdisk(s, f"m{n}", typ, size)
            for c in reads:
                out[typ]["empty"][c] = run_cell(s.uri(f"m{n}"), c, rt)
            s.cli("rm", f"m{n}")
            for c in writes:
                n += 1
                _mkdisk(s, f"m{n}", typ, size)
                out[typ]["empty"][c] = run_cell(s.uri(f"m{n}"), c, rt)
                s.cli("rm", f"m{n}")
            # Full: filled first (for delta: the delta itself filled too).
            n += 1
            _mkdisk(s, f"m{n}", typ, size)
            fill(s.uri(f"m{n}"), size)
            for c in cells:
                out[typ]["full"][c] = run_cell(s.uri(f"m{n}"), c, rt)
            s.cli("rm", f"m{n}")
            print(f"   strata {typ} done", flush=True)
    finally:
        s.stop()
    return out


def matrix_peer(work, fmt, size, rt, cells):
    d = os.path.join(work, fmt)
    os.makedirs(d, exist_ok=True)
    img = os.path.join(d, "disk." + fmt)
    sock = os.path.join(d, "q.sock")

    def fresh():
        if os.path.exists(img):
            os.unlink(img)
        if fmt == "raw":
            with open(img, "wb") as fh:
                fh.truncate(size_bytes(size))
        else:
            sh("qemu-img", "create", "-f", fmt, img, size)
        return QemuNbd(img, fmt, sock).start()

    out = {"empty": {}, "full": {}}
    for c in cells:
        qn = fresh()
        try:
            out["empty"][c] = run_cell(qn.uri(), c, rt)
        finally:
            qn.stop()
    qn = fresh()
    try:
        fill(qn.uri(), size)
        for c in cells:
            out["full"][c] = run_cell(qn.uri(), c, rt)
    finally:
        qn.stop()
        os.unlink(img)
    print(f"   qemu-nbd {fmt} done", flush=True)
    return out


def case_matrix(work, q):
    size = smoke("64M", "256M" if q else "2G")
    rt = smoke(1, 2 if q else 10)
    cells = matrix_cells(q)
    peers = ["raw"] if q else ["raw", "qcow2"]
    res = {"params": {"size": size, "runtime_s": rt, "cells": cells, "types": MATRIX_TYPES,
                      "peers": peers, "iodepth": "16 (512k: 8)"}}
    res["strata"] = matrix_strata(work, q, size, rt, cells)
    res["peers"] = {p: matrix_peer(work, p, size, rt, cells) for p in peers}
    # Ratio of each strata cell to the same cell/state on each peer (IOPS).
    res["ratios"] = {p: {typ: {st: {c: ratio(res["strata"][typ][st][c]["iops"],
                                           res["peers"][p][st][c]["iops"]) for c in cells}
                               for st in ("empty", "full")} for typ in MATRIX_TYPES}
                     for p in peers}
    return res
