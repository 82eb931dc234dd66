"""The `tera` case (make paper, seed 000 figure 6): the I/O phases of
TeraGen, TeraSort and TeraValidate as fio jobs on several disks at once,
the elapsed time of each phase, on strata thin disks, linked clones of an
empty base, strata's SEsparse and VMFSsparse deltas, and qemu-nbd on raw
files, VMFSsparse deltas and qcow2 overlays."""
import time
from statistics import median

from ..common import drop_caches, repeats, sh, size_bytes, smoke
from ..vmdks import SERIES, Fresh

PHASES = ["teragen", "terasort", "teravalidate"]


def _jobs(g):
    """Phase -> [(job name, fio options)] for one disk, G MiB of data each:
    TeraGen writes it (512k sequential); TeraSort reads two thirds of it
    while writing as much again into unwritten space (40 % of the bytes
    read, 60 % written); TeraValidate reads the sorted output with a small
    writer (its report) beside."""
    seq = ["--bs=512k", "--iodepth=8"]
    return {
        "teragen": [("gen", ["--rw=write", *seq, "--offset=0", f"--size={g}M", "--end_fsync=1"])],
        "terasort": [("in", ["--rw=read", *seq, "--offset=0", f"--size={2 * g // 3}M"]),
                     ("out", ["--rw=write", *seq, f"--offset={g}M", f"--size={g}M", "--end_fsync=1"])],
        "teravalidate": [("check", ["--rw=read", *seq, f"--offset={g}M", f"--size={g}M"]),
                         ("report", ["--rw=write", "--bs=64k", "--iodepth=1", f"--offset={2 * g}M",
                                     f"--size={max(1, g // 24)}M", "--end_fsync=1"])],
    }


def _bytes(g):
    """MiB each phase moves per disk."""
    return {"teragen": g, "terasort": 2 * g // 3 + g, "teravalidate": g + max(1, g // 24)}


def _phase(uris, jobs):
    """One fio, every job of the phase on every disk at once (one NBD
    connection each); the wall time in seconds."""
    args = ["fio", "--ioengine=nbd", "--output-format=terse"]
    for i, u in enumerate(uris):
        for name, opts in jobs:
            args += [f"--name={name}{i}", f"--uri={u}", *opts]
    t = time.perf_counter()
    sh(*args)
    return time.perf_counter() - t


def case_tera(work, q):
    """Seed 000 figure 6 (Hadoop on 6 VMs x 3 VMDKs, never run before here):
    DISKS disks per series at once, one fio process per phase with its
    jobs on every disk (one NBD connection each: TeraSort and TeraValidate
    run a reader and a writer per disk), the phase's wall time end to end
    with the host page cache dropped before it (writers flush at their
    end, so the data is durable). Each repetition on fresh disks; the
    median over repetitions. Series: vmdks.SERIES but QEMU's VMFSsparse,
    plus qemu-nbd on a qcow2 overlay over an empty raw base. The deltas
    (strata linked clones, the VMDK deltas of its export) hang off an
    empty thin base (a sparse flat file), as the paper's sparse disks
    hung off a thin one."""
    disks = smoke(1, 2 if q else 3)
    reps = repeats(3)
    g = smoke(32, 256 if q else 768)
    size = smoke("128M", "1G" if q else "2G")
    if 2 * g + g // 24 > size_bytes(size) >> 20:
        raise ValueError("tera: the regions do not fit the disk")
    # Not QEMU's VMFSsparse: it writes new grains at about 2 MiB/s here
    # (64 MiB of 1M first writes took 33 s), hours for the full run;
    # paper_matrix has it, and strata's VMFSsparse driver serves the same
    # files.
    series = [x for x in SERIES if x != "qemu_vmfsSparse"] + ["qemu_qcow2"]
    jobs = _jobs(g)
    res = {"params": {"disks": disks, "region": f"{g}M", "disk": size, "repetitions": reps,
                      "series": series, "phases": PHASES,
                      "jobs": {ph: "; ".join(" ".join(o) for _, o in js) for ph, js in jobs.items()}},
           "runs": {}, "elapsed_s": {}, "mib_s": {}}
    fr = Fresh(work, size, "thin", filled=False)
    try:
        for s in series:
            runs = []
            for _ in range(reps):
                uris, close = fr.open(s, disks)
                try:
                    run = {}
                    for ph in PHASES:
                        fr.settle()
                        drop_caches()
                        run[ph] = round(_phase(uris, jobs[ph]), 3)
                    runs.append(run)
                finally:
                    close()
            res["runs"][s] = runs
            res["elapsed_s"][s] = {ph: median(r[ph] for r in runs) for ph in PHASES}
            res["mib_s"][s] = {ph: round(disks * _bytes(g)[ph] / res["elapsed_s"][s][ph], 1)
                               for ph in PHASES}
            print(f"   {s}: " + ", ".join(f"{ph} {res['elapsed_s'][s][ph]:.2f} s" for ph in PHASES),
                  flush=True)
    finally:
        fr.stop()
    return res
