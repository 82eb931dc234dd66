"""The `paper_matrix` case (make paper, seed 000 figures 1-4): the SEsparse
paper's Iometer matrix at all its I/O sizes, first writes to empty disks
and reads and writes of full ones, at 16 ("local") and 32 ("SAN") I/Os in
flight, on strata thin disks, linked clones, strata's SEsparse and
VMFSsparse deltas, and qemu-nbd on a raw file and on a VMFSsparse delta."""

import time

from ..common import repeats, smoke, sync_host, with_runs
from ..fio import fio
from ..vmdks import SERIES, Fresh

FIO_RW = {("seq", "read"): "read", ("seq", "write"): "write",
          ("rand", "read"): "randread", ("rand", "write"): "randwrite"}


def _cell(uri, cell, qd, rt, size=None):
    """One cell: time-based for RT s, or with SIZE a bounded pass over a
    fresh disk capped at RT s (every I/O a first write; random ones each
    block once)."""
    bs, pat, op = cell.split("_")
    ms = f"{round(rt * 1000)}ms"
    if size:
        r = fio(uri, FIO_RW[(pat, op)], bs, iodepth=qd, size=size,
                extra=[f"--runtime={ms}", "--randrepeat=0"])
    else:
        r = fio(uri, FIO_RW[(pat, op)], bs, iodepth=qd, runtime=ms, extra=["--randrepeat=0"])
    if r["ios"] <= 0:
        raise RuntimeError(f"paper_matrix: {cell} did no I/O on {uri}")
    return {"iops": round(r["iops"], 1), "mib_s": round(r["bw_mib"], 1)}


# Every cell runs this many times; a size list of the paper's Table 2.
REPEATS = 3
SIZES = ["4k", "8k", "16k", "32k", "64k", "128k", "256k", "512k"]


def case_paper_matrix(work, q):
    """Seed 000's Table 2 cells at iodepth 16 ("local") and 32 ("san"),
    all eight sizes on both, one fio job, every cell REPEATS times after a
    sync (the host writes back the last cell's data first). Empty disks:
    sequential and random writes, each run on a fresh disk (a round's
    disks made and served at once), bounded to one pass over it (capped at
    the cell's run time, random offsets each once), so every write is a
    first write. Full disks: filled once per series with 1M writes
    through its own server, then REPEATS rounds over sequential and
    random reads and writes of both depths, time-based. The deltas hang
    off an eager-zeroed thick parent, as in the paper: strata's linked
    clones off an eagerzeroedthick disk filled and snapshotted, the VMDK
    deltas copies of the empty delta of its export (over a fully written
    flat file). Before every run the datastore is left to finish
    reclaiming removed disks (`strata status --json`: reclaiming 0).
    QEMU's VMFSsparse deltas are filled through strata's driver (the same
    files), as QEMU writes new grains at about 2 MiB/s."""
    size = smoke("32M", "256M" if q else "512M")
    # --smoke caps each cell at 0.3 s (QEMU's VMFSsparse is that slow).
    rt = smoke(0.3, 0.5)
    local = smoke(["4k", "512k"], ["4k", "64k", "512k"] if q else SIZES)
    san = smoke(["4k"], ["4k", "64k", "512k"] if q else SIZES)
    reps = repeats(REPEATS)
    qd = {"local": 16, "san": 32}
    res = {"params": {"disk": size, "runtime_s": rt, "local_sizes": local, "san_sizes": san, "qd": qd,
                      "series": SERIES, "repeats": reps}}
    beds = {"local": local, "san": san}
    for bed in beds:
        res[bed] = {x: {"empty": {}, "full": {}} for x in SERIES}
    fr = Fresh(work, size, "eagerzeroedthick", filled=True)
    try:
        for s in SERIES:
            t = time.perf_counter()
            runs = {}
            empty = [(bed, f"{b}_{p}_write") for bed, sizes in beds.items()
                     for b in sizes for p in ("seq", "rand")]
            for _ in range(reps):
                # A fresh disk per run; a round's disks made and served at
                # once (one server start per round, not per run).
                uris, close = fr.open(s, len(empty))
                try:
                    for (bed, c), uri in zip(empty, uris):
                        fr.settle()
                        sync_host()
                        runs.setdefault((bed, "empty", c), []).append(
                            _cell(uri, c, qd[bed], rt, size=size))
                finally:
                    close()
            # One fill per series; both beds' cells on it, round after round.
            uris, close = fr.open(s, 1, filled=True)
            try:
                for _ in range(reps):
                    for bed, sizes in beds.items():
                        for c in [f"{b}_{p}_{o}" for b in sizes for p in ("seq", "rand")
                                  for o in ("read", "write")]:
                            fr.settle()
                            sync_host()
                            # --smoke: one bounded pass, not whole seconds.
                            runs.setdefault((bed, "full", c), []).append(
                                _cell(uris[0], c, qd[bed], rt, size=smoke(size, None)))
            finally:
                close()
            for (bed, state, c), rs in runs.items():
                res[bed][s][state][c] = with_runs(rs, 1)
            print(f"   {s} done ({time.perf_counter() - t:.0f} s)", flush=True)
    finally:
        fr.stop()
    return res
