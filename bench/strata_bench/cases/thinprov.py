"""The `thinprov` case (make paper, seed 001): the thin-provisioning
study's experiments at this machine's scale: over-commitment, the zeroing
phase against the post-zeroing phase (with nb/tbz), scaling over disks
written at once, a thick disk beside a growing thin one, file copies, and
throughput against the number of fragments."""
import json
import os
import re

from ..common import (STRATA, drop_caches, prealloc_raw, ratio, repeats, sh, size_bytes, smoke,
                      sync_host, with_runs)
from ..fio import fill, fill_file, fio
from ..servers import QemuNbd, Strata

TYPES = ("thin", "zeroedthick", "eagerzeroedthick")


def _target(t):
    """fio's options for one target: an NBD URI, or a file of the
    datastore's file system written through the host's page cache
    (io_uring, buffered: the host's own cost of the same writes, which
    bounds what any server on that file system can do)."""
    if t.startswith("nbd"):
        return ["--ioengine=nbd", f"--uri={t}"]
    return ["--ioengine=io_uring", "--direct=0", f"--filename={t}"]


def _fio_jobs(targets, opts, per_job=None):
    """One fio with a job per target (an NBD URI or a file; OPTS global;
    PER_JOB(i) -> that job's own options); its JSON jobs and the seconds
    the slowest job ran, as fio counts them (from its start to the end of
    its end_fsync, without fio's own start-up and the NBD connections,
    which would weigh on short runs)."""
    args = ["fio", "--output-format=json", *opts]
    for i, t in enumerate(targets):
        args += [f"--name=j{i}", *_target(t), *(per_job(i) if per_job else [])]
    out = sh(*args)
    jobs = json.loads(out[out.index("{"):])["jobs"]
    took = max(j["job_runtime"] for j in jobs) / 1000
    if len(jobs) != len(targets) or took <= 0:
        raise RuntimeError(f"fio reported {len(jobs)} jobs of {len(targets)}, {took} s")
    return jobs, took


def _pass(uri, size, halves=False, info=None, bs="64k"):
    """Sequential writes of BS (64k) over the whole disk (iodepth 16,
    flushed at the end): MiB/s of fio's run time; with HALVES, in two runs
    with INFO() called between them (nb/tbz half-way)."""
    mib = size_bytes(size) >> 20
    parts = [(0, mib // 2), (mib // 2, mib - mib // 2)] if halves else [(0, mib)]
    took, mid = 0.0, None
    for k, (off, n) in enumerate(parts):
        _, t = _fio_jobs([uri], ["--rw=write", f"--bs={bs}", "--iodepth=16", f"--offset={off}M",
                                 f"--size={n}M", "--end_fsync=1"])
        took += t
        if k == 0 and halves and info:
            mid = info()
    return round(mib / took, 1), mid


def _overcommit(work, cap):
    ds = os.path.join(work, "ds")
    sh(STRATA, "--datastore", ds, "init", "--capacity", cap)
    s = Strata(work).start()
    try:
        c = size_bytes(cap)
        m = c >> 20
        # (name, type, MiB, MiB written): the seed's 100 GB datastore / 100.
        plan = [("thick", "zeroedthick", m // 5, 0), ("thin1", "thin", 2 * m // 5, m // 5),
                ("thin2", "thin", 4 * m // 5, 2 * m // 5)]
        for name, typ, size, written in plan:
            s.cli("create", name, "--size", f"{size}M", "--type", typ)
            if written:
                fill(s.uri(name), f"{written}M")
        disks = []
        for name, typ, size, written in plan:
            i = json.loads(s.cli("info", name, "--json"))
            disks.append({"name": name, "type": typ, "size_bytes": i["size_bytes"],
                          "written_bytes": written << 20, "allocated_bytes": i["allocated_bytes"]})
        st = json.loads(s.cli("status", "--json"))
        keep = ("capacity_bytes", "provisioned_bytes", "used_bytes", "reserved_bytes", "free_bytes",
                "used_percent", "overcommit_percent")
        return {"capacity_bytes": c, "disks": disks, "status": {k: st[k] for k in keep},
                "alarms": json.loads(s.cli("alarm", "list", "--json"))}
    finally:
        s.stop()


def _nb_unit(s):
    """The block nb and tbz count in, as `strata info` prints it ("1 MiB")."""
    m = re.search(r"nb / tbz:.*\((.+?) blocks\)", s.cli("info", "d"))
    if not m:
        raise RuntimeError("strata info does not say the unit of nb/tbz")
    return m.group(1)


# Each zerophase cell runs this many times on a fresh disk, the kinds
# taking turns; the other write sizes (the seed: "the same" trend from 1K
# through 512K) for thin against eagerzeroedthick and a sparse raw file.
REPEATS = 3
SIZE_KINDS = ("thin", "eagerzeroedthick", "qemu_raw_off")


def _zero_strata(work, typ, size, bs, with_nb):
    """Two passes of BS over a fresh disk of TYPE (nb/tbz around the first
    when WITH_NB)."""
    s = Strata(os.path.join(work, typ)).start()
    try:
        s.cli("create", "d", "--size", size, "--type", typ)

        def info():
            i = json.loads(s.cli("info", "d", "--json"))
            return {"nb": i["nb"], "tbz": i["tbz"]}
        before = info() if with_nb else None
        p1, mid = _pass(s.uri("d"), size, halves=with_nb, info=info, bs=bs)
        out = {"pass1_mib_s": p1}
        if with_nb:
            out["nb_tbz"] = {"before": before, "mid": mid, "after": info()}
            out["nb_unit"] = _nb_unit(s)
        out["pass2_mib_s"], _ = _pass(s.uri("d"), size, bs=bs)
        return out
    finally:
        s.stop()
        sh("rm", "-rf", os.path.join(work, typ))


def _zero_raw(work, pre, size, bs):
    """Two passes of BS over a fresh raw file of preallocation PRE under
    qemu-nbd."""
    d = os.path.join(work, "raw_" + pre)
    os.makedirs(d, exist_ok=True)
    f = os.path.join(d, "disk.raw")
    prealloc_raw(f, size, pre)
    sync_host()
    drop_caches()
    qn = QemuNbd(f, "raw", os.path.join(d, "q.sock")).start()
    try:
        p1, _ = _pass(qn.uri(), size, bs=bs)
        p2, _ = _pass(qn.uri(), size, bs=bs)
    finally:
        qn.stop()
        os.unlink(f)
    return {"pass1_mib_s": p1, "pass2_mib_s": p2}


def _zero_runs(runs):
    """A kind's runs -> their medians with the runs beside them, the ratio
    from each run's own two passes, nb/tbz of the first run."""
    return with_runs([dict(r, ratio=ratio(r["pass1_mib_s"], r["pass2_mib_s"])) for r in runs])


def _zerophase(work, size, sizes):
    """Figure 3's 64k passes on every kind, then the other SIZES on
    SIZE_KINDS (a "by_size" entry: {bs: {kind: ...}}); every cell
    REPEATS times on a fresh disk, the kinds taking turns."""
    runs, by = {}, {}
    kinds = [(typ, lambda t=typ, bs="64k", nb=False: _zero_strata(work, t, size, bs, nb))
             for typ in TYPES]
    kinds += [(f"qemu_raw_{pre}", lambda p=pre, bs="64k", nb=False: _zero_raw(work, p, size, bs))
              for pre in ("off", "falloc", "full")]
    for r in range(repeats(REPEATS)):
        for name, f in kinds:
            runs.setdefault(name, []).append(f(nb=r == 0) if name in TYPES else f())
        for bs in sizes:
            for name, f in kinds:
                if name in SIZE_KINDS:
                    by.setdefault(bs, {}).setdefault(name, []).append(f(bs=bs))
    out = {name: _zero_runs(rs) for name, rs in runs.items()}
    out["by_size"] = {bs: {name: _zero_runs(rs) for name, rs in d.items()} for bs, d in by.items()}
    return out


def _scaling_passes(targets, n, each):
    r = {}
    for p in ("pass1_mib_s", "pass2_mib_s"):
        _, t = _fio_jobs(targets, ["--rw=write", "--bs=64k", "--iodepth=4", f"--size={each}",
                                   "--end_fsync=1"])
        r[p] = round(n * (size_bytes(each) >> 20) / t, 1)
    return r


def _scaling(work, ns, each):
    """Per kind and count: REPEATS pairs of passes, each on fresh disks
    (files for the host), the counts taking turns."""
    out = {"thin": {}, "zeroedthick": {}, "host": {}}
    runs = {}
    d = os.path.join(work, "host")
    os.makedirs(d, exist_ok=True)
    servers = {typ: Strata(os.path.join(work, typ)).start() for typ in ("thin", "zeroedthick")}
    try:
        for r in range(repeats(REPEATS)):
            for n in ns:
                for typ, s in servers.items():
                    names = [f"s{n}_{r}_{i}" for i in range(n)]
                    for x in names:
                        s.cli("create", x, "--size", each, "--type", typ)
                    runs.setdefault((typ, n), []).append(
                        _scaling_passes([s.uri(x) for x in names], n, each))
                    for x in names:
                        s.cli("rm", x)
                # The host: the same jobs on sparse files of the same file system.
                files = [os.path.join(d, f"s{n}_{i}") for i in range(n)]
                for f in files:
                    sh("truncate", "-s", each, f)
                runs.setdefault(("host", n), []).append(_scaling_passes(files, n, each))
                for f in files:
                    os.unlink(f)
    finally:
        for s in servers.values():
            s.stop()
    for (who, n), rs in runs.items():
        out[who][n] = with_runs(rs)
    return out


def _coexist_runs(a, b, size, grow, rt, b_at=()):
    """Targets A (filled, SIZE) and B (empty, GROW; B_AT: fio options that
    place it, when it shares A's file): A's 64k writes alone, beside B's
    first writes, and beside B rewriting what it just wrote."""
    opts = ["--rw=write", "--bs=64k", "--iodepth=16"]
    alone, _ = _fio_jobs([a], opts + ["--time_based", f"--runtime={rt}", f"--size={size}"])
    both, _ = _fio_jobs([a, b], opts + [f"--runtime={rt}"],
                        lambda i: ["--time_based", f"--size={size}"] if i == 0 else [f"--size={grow}", *b_at])
    a1 = alone[0]["write"]["bw_bytes"] / 2**20
    a2, bw = both[0]["write"]["bw_bytes"] / 2**20, both[1]["write"]["bw_bytes"] / 2**20
    # The same pair again with B rewriting what it just wrote: the
    # device shared alike, nothing allocated. What A loses beside B's
    # first writes beyond this is what B's allocation costs it.
    b_mib = max(1, both[1]["write"]["io_bytes"] >> 20)
    again, _ = _fio_jobs([a, b], opts + [f"--runtime={rt}", "--time_based"],
                         lambda i: [f"--size={size}"] if i == 0 else [f"--size={b_mib}M", *b_at])
    a3 = again[0]["write"]["bw_bytes"] / 2**20
    return {"alone_mib_s": round(a1, 1), "beside_growth_mib_s": round(a2, 1), "ratio": ratio(a2, a1),
            "b_first_write_mib_s": round(bw, 1),
            "beside_rewrites_mib_s": round(a3, 1), "ratio_vs_rewrites": ratio(a2, a3),
            "b_rewrite_mib_s": round(again[1]["write"]["bw_bytes"] / 2**20, 1),
            "b_written_mib": round(both[1]["write"]["io_bytes"] / 2**20),
            "b_disk_mib": size_bytes(grow) >> 20}


def _coexist(work, size, grow, rt):
    """REPEATS rounds of the three runs on strata, the host's two files and
    its one file, taking turns; the thin side fresh in every run."""
    runs = {}
    s = Strata(work).start()
    try:
        s.cli("create", "a", "--size", size, "--type", "eagerzeroedthick")
        fill(s.uri("a"), size)
        for r in range(repeats(REPEATS)):
            s.cli("create", f"b{r}", "--size", grow)
            runs.setdefault("strata", []).append(
                _coexist_runs(s.uri("a"), s.uri(f"b{r}"), size, grow, rt))
            s.cli("rm", f"b{r}")
            # The host: a written file beside a sparse one, and both in one
            # file (as strata's disks share pool.data), the same jobs, so
            # the page shows what the file system's own allocation costs a
            # neighbour.
            for key, one in (("host", False), ("host_onefile", True)):
                a, b = os.path.join(work, key + "_a"), os.path.join(work, key + "_b")
                fill_file(a, size)
                if one:
                    sh("truncate", "-s", str(size_bytes(size) + size_bytes(grow)), a)
                else:
                    sh("truncate", "-s", grow, b)
                sync_host()
                drop_caches()
                runs.setdefault(key, []).append(
                    _coexist_runs(a, a if one else b, size, grow, rt,
                                  [f"--offset={size_bytes(size)}"] if one else []))
                sh("rm", "-f", a, b)
    finally:
        s.stop()
    out = with_runs(runs["strata"])
    for key in ("host", "host_onefile"):
        out[key] = with_runs(runs[key])
    return out


def _filecopy(work, clients, each):
    out = {}
    step = size_bytes(each) // 8 >> 20
    s = Strata(work).start()
    try:
        for state in ("thin_first", "thin_rewrite", "zeroedthick", "eagerzeroedthick"):
            typ = "thin" if state.startswith("thin") else state
            names = [f"{typ}{i}" for i in range(clients)]
            if state != "thin_rewrite":
                for x in names:
                    s.cli("create", x, "--size", each, "--type", typ)
            its = []
            for it in range(8):
                _, t = _fio_jobs([s.uri(x) for x in names],
                                 ["--rw=write", "--bs=1M", "--iodepth=4", f"--size={step}M",
                                  f"--offset={it * step}M", "--end_fsync=1"])
                its.append(round(t, 3))
            out[state] = {"mean_s": round(sum(its) / len(its), 3), "iterations_s": its}
            if state != "thin_first":
                for x in names:
                    s.cli("rm", x)
    finally:
        s.stop()
    return out


def _fraggrow(work, total, floor, ks, rt):
    out = {}
    growths = {"1m_seq": ["--rw=write", "--bs=1M"], "64k_rand": ["--rw=randwrite", "--bs=64k"],
               "4k_rand": ["--rw=randwrite", "--bs=4k"]}
    for pl in ("arrival", "regions"):
        s = Strata(os.path.join(work, pl), serve_args=["--placement", pl]).start()
        pts = []
        try:
            plan = [(g, 1) for g in growths] + [("4k_rand", k) for k in ks if k != 1]
            for n, (g, k) in enumerate(plan):
                size = f"{max(size_bytes(floor), size_bytes(total) // k) >> 20}M"
                names = [f"g{n}_{i}" for i in range(k)]
                for x in names:
                    s.cli("create", x, "--size", size)
                _fio_jobs([s.uri(x) for x in names],
                          growths[g] + ["--iodepth=16", f"--size={size}", "--randrepeat=0"])
                frag = json.loads(s.cli("info", names[0], "--json"))["fragments"]
                # REPEATS of each measurement (random overwrites of mapped
                # grains do not move them: the layout stays).
                runs = []
                for _ in range(repeats(REPEATS)):
                    sync_host()
                    w = fio(s.uri(names[0]), "randwrite", "64k", runtime=rt, extra=["--randrepeat=0"])
                    drop_caches()
                    r = fio(s.uri(names[0]), "read", "1M", iodepth=4, size=size)
                    runs.append({"randwrite_64k_iops": round(w["iops"], 1),
                                 "seqread_1m_cold_mib_s": round(r["bw_mib"], 1)})
                pts.append({"growth": g, "k": k, "disk": size, "fragments": frag, **with_runs(runs)})
                for x in names:
                    s.cli("rm", x)
        finally:
            s.stop()
        out[pl] = pts
    return out


def case_thinprov(work, q):
    """Seed 001 at this machine's scale, each part in a datastore of its own.

    overcommit (figure 1): `init --capacity C`, a zeroedthick disk of C/5
    and thin disks of 2C/5 and 4C/5 with C/5 and 2C/5 written (about half
    of each); `status` and the alarms.

    zerophase (figures 3, 10-11, table 2): 64k sequential writes (iodepth
    16, flushed) over a fresh disk of each type, twice: the first pass is
    the zeroing phase, the second the post-zeroing phase (MiB/s of fio's
    run time, end_fsync included), nb/tbz before, half-way through and
    after the first pass; raw files of each preallocation under qemu-nbd as
    peers; each REPEATS times, the kinds taking turns; then the same at
    other write sizes (by_size) for thin, eagerzeroedthick and the sparse
    raw file.

    scaling (figure 4): N disks written at once by one fio (a job each,
    64k, iodepth 4), two passes, aggregate MiB/s; the same jobs on N
    sparse files of the datastore's file system (host); REPEATS times on
    fresh disks, the counts taking turns.

    coexist (figure 7): 64k writes to a filled eagerzeroedthick disk alone,
    then beside first writes to a large empty thin disk, then beside that
    disk rewriting what it wrote (the device shared alike, nothing
    allocated), for the same time each (fio's bandwidths); the same three
    runs on a written file beside a sparse one (host) and on the two in
    one file, the thin one's range after the thick one's (host_onefile);
    REPEATS rounds, the three setups taking turns.

    filecopy (figure 9): clients each copying 1/8 of its own disk per
    iteration (1M writes, flushed), 8 iterations (the slowest client's fio
    run time each), in four states of the disks: thin fresh, thin written
    once, zeroedthick, eagerzeroedthick.

    fraggrow (figure 6): disks grown by 1M sequential, 64k random and 4k
    random writes, and k disks grown together by 4k random writes, under
    both placements; then one disk's fragments, and REPEATS times its 64k
    random write IOPS and a cold 1M sequential read."""
    cap = smoke("256M", "1G")
    zsize = smoke("32M", "256M" if q else "1G")
    zsizes = smoke(["4k"], ["4k", "512k"] if q else ["4k", "16k", "256k", "512k"])
    ns = smoke([1, 2], [1, 4] if q else [1, 2, 4, 8, 16])
    each = smoke("16M", "64M" if q else "256M")
    rt = smoke(1, 4 if q else 8)
    frt = smoke(1, 3)
    grow = smoke("256M", "4G" if q else "8G")
    clients = smoke(2, 2 if q else 4)
    fc = smoke("32M", "256M" if q else "512M")
    ks = smoke([1, 2], [1, 4] if q else [1, 4, 16])
    total, floor = smoke(("32M", "16M"), ("256M", "32M") if q else ("1G", "64M"))
    res = {"params": {"overcommit_capacity": cap, "zerophase_disk": zsize, "zerophase_sizes": zsizes,
                      "zerophase_repeats": repeats(REPEATS), "scaling_disks": ns,
                      "scaling_disk": each, "coexist": {"thick": zsize, "thin": grow, "runtime_s": rt},
                      "filecopy": {"clients": clients, "disk": fc, "iterations": 8},
                      "fraggrow": {"disks_together": ks, "total": total, "min_disk": floor, "runtime_s": frt}}}
    parts = [("overcommit", lambda d: _overcommit(d, cap)), ("zerophase", lambda d: _zerophase(d, zsize, zsizes)),
             ("scaling", lambda d: _scaling(d, ns, each)), ("coexist", lambda d: _coexist(d, zsize, grow, rt)),
             ("filecopy", lambda d: _filecopy(d, clients, fc)),
             ("fraggrow", lambda d: _fraggrow(d, total, floor, ks, frt))]
    for name, f in parts:
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        res[name] = f(d)
        sh("rm", "-rf", d)
        print(f"   {name} done", flush=True)
    return res
