"""The `firstwrite` case (issue 59, item 1, "measure first, in one
place"): what strata's disks pay for being written the first time, against
rewrites of the same range and against the peers (qemu-nbd on raw files,
fio straight on a file), in one run: several disks at once (teragen,
randfill), the number of disks (scaling), each provisioning type
(kinds), and a filled disk beside a growing one (neighbour)."""
import json
import os
import resource
import shutil
from statistics import median

from ..common import cpu_of, drop_caches, prealloc_raw, ratio, sh, size_bytes, smoke
from ..fio import fill, fill_file, span
from ..servers import QemuNbd, Strata

# The two shapes of a pass (fio options). fio's random map (on by
# default) makes the random pass cover every block exactly once.
SHAPES = {
    "seq": ["--rw=write", "--bs=512k", "--iodepth=16"],
    "rand": ["--rw=randwrite", "--bs=64k", "--iodepth=16", "--randrepeat=0"],
}
# Each provisioning type and the raw file that matches it: no space
# (sparse), space reserved (fallocated: unwritten extents), zeros written.
KINDS = (("thin", "sparse"), ("zeroedthick", "falloc"), ("eagerzeroedthick", "full"))
STAT_KEYS = ("first_mib_s", "rewrite_mib_s", "ratio", "cpu_s_per_gib_first",
             "cpu_s_per_gib_rewrite", "cpu_ratio")
GIB = 1 << 30
MIB = 1 << 20


def _cfg(kind, var, cache, shape, n, size, name=None, serve=()):
    """One configuration: KIND strata (VAR a provisioning type), qemu
    (qemu-nbd on a raw file, VAR sparse / falloc / full) or limit (fio on
    the raw file itself); CACHE wb or none; N disks of SIZE at once;
    SERVE: more `strata serve` options."""
    return {"name": name or f"{kind}_{var}_{cache}", "kind": kind, "var": var, "cache": cache,
            "shape": shape, "n": n, "size": size, "serve": list(serve)}


# Strata as it was before readied space (FORMAT.md §7.1): the "before"
# series of the same run.
NOREADY = ["--ready-ahead", "0"]


def _mib(b):
    return f"{b // MIB}M"


def _per(total, n):
    """TOTAL bytes shared by N disks, in whole MiB each."""
    return total // n // MIB * MIB


def _dirty_limit():
    """The host's dirty-page limit in bytes, and where it came from."""
    with open("/proc/sys/vm/dirty_bytes") as f:
        db = int(f.read())
    if db:
        return db, "vm.dirty_bytes"
    with open("/proc/sys/vm/dirty_ratio") as f:
        pct = int(f.read())
    avail = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    return avail * pct // 100, f"vm.dirty_ratio {pct}% of MemAvailable"


def _fio(opts, jobs, group=True):
    """One fio process: OPTS for every job, then a job per entry of JOBS
    (its own options: a URI or a file); the JSON jobs (one with
    GROUP, fio's --group_reporting: the aggregate)."""
    args = ["fio", "--output-format=json", *opts] + (["--group_reporting"] if group else [])
    for i, j in enumerate(jobs):
        args += [f"--name=j{i}", *j]
    out = sh(*args)
    return json.loads(out[out.index("{"):])["jobs"]


def _children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _pass(opts, jobs, pids, expect, fixed=0.0):
    """A pass: every disk written once, all at once, flushed at the end
    (end_fsync, counted in fio's run time). The aggregate MiB/s and the
    CPU seconds the servers PIDS spent on it; without servers (the limit),
    fio's own (its threads and io_uring's workers, where the kernel does
    the file system's work) less FIXED, what a fio of one block costs:
    None when nothing is left above that (too small to measure)."""
    c0 = sum(cpu_of(p) for p in pids) if pids else _children_cpu()
    w = _fio(opts + ["--end_fsync=1"], jobs)[0]["write"]
    cpu = sum(cpu_of(p) for p in pids) - c0 if pids else _children_cpu() - c0 - fixed
    if w["io_bytes"] != expect:
        raise RuntimeError(f"firstwrite: fio wrote {w['io_bytes']} bytes, not {expect}")
    return w["bw_bytes"] / MIB, (cpu if cpu > 0 else None)


def _fio_fixed(opts, d, n):
    """The CPU seconds of a fio with OPTS writing one block to each of N
    scratch files: its start, set-up and exit, which a server's CPU does
    not carry and the limit's must not either."""
    bs = next(o for o in opts if o.startswith("--bs="))[5:]
    files = [_raw(d, f"fixed{i}", size_bytes(bs.upper()), "sparse") for i in range(n)]
    c0 = _children_cpu()
    _fio(opts + [f"--size={bs}", "--end_fsync=1"], [[f"--filename={f}"] for f in files])
    for f in files:
        os.unlink(f)
    return _children_cpu() - c0


def _raw(d, i, size, how):
    """A raw file of SIZE bytes: sparse, fallocated, or written with zeros."""
    f = os.path.join(d, f"d{i}.raw")
    prealloc_raw(f, size, {"sparse": "off"}.get(how, how))
    return f


def _round(c, d):
    """One round of config C in the fresh directory D: its disks made and
    served, the page cache dropped, the first pass, dropped again, the
    rewrite pass. Every server stops and D goes, whatever happens."""
    n, size = c["n"], c["size"]
    servers, pids = [], []
    os.makedirs(d, exist_ok=True)
    try:
        if c["kind"] == "strata":
            s = Strata(d, serve_args=(["--cache", "none"] if c["cache"] == "none" else [])
                       + c["serve"])
            for i in range(n):
                s.cli("create", f"d{i}", "--size", _mib(size), "--type", c["var"])
            servers.append(s)
            s.start()
            opts, pids = ["--ioengine=nbd"], [s.proc.pid]
            jobs = [[f"--uri={s.uri(f'd{i}')}"] for i in range(n)]
        else:
            files = [_raw(d, i, size, c["var"]) for i in range(n)]
            if c["kind"] == "qemu":
                for i, f in enumerate(files):
                    how = {"cache": "none", "aio": "native"} if c["cache"] == "none" else {}
                    qn = QemuNbd(f, "raw", os.path.join(d, f"q{i}.sock"), **how)
                    servers.append(qn)
                    qn.start()
                opts, jobs = ["--ioengine=nbd"], [[f"--uri={q.uri()}"] for q in servers]
                pids = [q.proc.pid for q in servers]
            else:
                opts = ["--ioengine=io_uring", f"--direct={int(c['cache'] == 'none')}"]
                jobs = [[f"--filename={f}"] for f in files]
        opts += SHAPES[c["shape"]]
        fixed = 0.0 if pids else _fio_fixed(opts, d, n)
        opts += [f"--size={_mib(size)}"]
        gib = n * size / GIB
        out = {}
        for p in ("first", "rewrite"):
            drop_caches()
            bw, cpu = _pass(opts, jobs, pids, n * size, fixed)
            out[f"{p}_mib_s"] = round(bw, 1)
            out[f"cpu_s_per_gib_{p}"] = round(cpu / gib, 4) if cpu is not None else None
        out["ratio"] = _ratio(out["first_mib_s"], out["rewrite_mib_s"])
        out["cpu_ratio"] = _ratio(out["cpu_s_per_gib_first"], out["cpu_s_per_gib_rewrite"])
        return out
    finally:
        for x in servers:
            x.stop()
        shutil.rmtree(d, ignore_errors=True)


def _ratio(a, b):
    """common.ratio, None where A is missing too."""
    return ratio(a, b) if a is not None else None


def _spread(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"median": None, "min": None, "max": None}
    return {"median": round(median(xs), 4), "min": min(xs), "max": max(xs)}


def _group(work, gname, cfgs, rounds):
    """Every config of the group once per round, in the order given
    (strata and peers interleaved) and in reverse the next round; the
    median, min and max of each figure, and the rounds."""
    runs = {c["name"]: [] for c in cfgs}
    order = list(enumerate(cfgs))
    for r in range(rounds):
        for ci, c in (order if r % 2 == 0 else order[::-1]):
            # Short names: a datastore's control socket path must fit in
            # sun_path (108 bytes) under CI's temporary directories.
            x = _round(c, os.path.join(work, gname, f"{ci}_{r}"))
            runs[c["name"]].append(x)
            print(f"   {gname} round {r + 1} {c['name']}: first {x['first_mib_s']} MiB/s, "
                  f"rewrite {x['rewrite_mib_s']} MiB/s ({x['ratio']}), CPU "
                  f"{x['cpu_s_per_gib_first']} / {x['cpu_s_per_gib_rewrite']} s/GiB", flush=True)
    out = {}
    for c in cfgs:
        rs = runs[c["name"]]
        out[c["name"]] = {"kind": c["kind"], "type": c["var"], "cache": c["cache"],
                          "shape": c["shape"], "disks": c["n"], "per_disk": _mib(c["size"]),
                          **{k: _spread([x[k] for x in rs]) for k in STAT_KEYS},
                          "rounds": {k: [x[k] for x in rs] for k in STAT_KEYS}}
        o = out[c["name"]]
        print(f"   {gname} {c['name']} (median of {len(rs)}): first {o['first_mib_s']['median']} "
              f"MiB/s, rewrite {o['rewrite_mib_s']['median']} MiB/s, ratio {o['ratio']['median']}, "
              f"CPU ratio {o['cpu_ratio']['median']}", flush=True)
    return out


def _med(cfgs, name, key):
    return cfgs[name][key]["median"]


def _vs(cfgs, a, b, key="first_mib_s"):
    """A's median KEY over B's (None where either is missing)."""
    return _ratio(_med(cfgs, a, key), _med(cfgs, b, key))


def _fw(cfgs, a):
    """A's first / rewrite: the median of each round's pair (the two
    passes of one round run back to back, so drift over the run cancels
    within a pair; a ratio of medians would pair passes of different
    rounds)."""
    return cfgs[a]["ratio"]["median"]


def _teragen(n, size, caches):
    """Strata thin and zeroedthick against qemu-nbd on sparse and
    fallocated raw files, interleaved, writeback then none."""
    out = []
    for cache in caches:
        out += [_cfg("strata", "thin", cache, "seq", n, size),
                _cfg("qemu", "sparse", cache, "seq", n, size),
                _cfg("strata", "thin", cache, "seq", n, size, name=f"strata_thin_noready_{cache}",
                     serve=NOREADY),
                _cfg("strata", "zeroedthick", cache, "seq", n, size),
                _cfg("qemu", "falloc", cache, "seq", n, size)]
    return out


def _teragen_ratios(c):
    r = {}
    for cache in ("wb", "none"):
        r[f"thin_vs_qemu_sparse_first_{cache}"] = _vs(c, f"strata_thin_{cache}", f"qemu_sparse_{cache}")
        r[f"zeroedthick_vs_qemu_falloc_first_{cache}"] = _vs(c, f"strata_zeroedthick_{cache}",
                                                            f"qemu_falloc_{cache}")
        r[f"thin_first_over_rewrite_{cache}"] = _fw(c, f"strata_thin_{cache}")
        r[f"thin_noready_first_over_rewrite_{cache}"] = _fw(c, f"strata_thin_noready_{cache}")
        r[f"thin_noready_vs_qemu_sparse_first_{cache}"] = _vs(c, f"strata_thin_noready_{cache}",
                                                              f"qemu_sparse_{cache}")
        r[f"zeroedthick_first_over_rewrite_{cache}"] = _fw(c, f"strata_zeroedthick_{cache}")
    return r


def _neighbour_setup(d, who, thick, thin, cache, stop):
    """The two disks of a neighbour round in D, the thick one filled: fio's
    target options for each. WHO strata (served, `--cache none` when CACHE
    is "none"; STOP[0] set to stop it) or limit (two files of the same file
    system, written with io_uring, O_DIRECT when CACHE is "none"; the thin
    one sparse) or limit_onefile (both in one file, the thin disk's range
    after the thick one's, as strata's disks share `pool.data`)."""
    if who.startswith("limit"):
        os.makedirs(d, exist_ok=True)
        io = ["--ioengine=io_uring", f"--direct={int(cache == 'none')}"]
        a = os.path.join(d, "thick")
        fill_file(a, _mib(thick), direct=cache == "none")
        if who == "limit_onefile":
            sh("truncate", "-s", str(thick + thin), a)
            return [*io, f"--filename={a}"], [*io, f"--filename={a}", f"--offset={thick}"]
        b = os.path.join(d, "thin")
        sh("truncate", "-s", str(thin), b)
        return [*io, f"--filename={a}"], [*io, f"--filename={b}"]
    s = Strata(d, serve_args=["--cache", "none"] if cache == "none" else [])
    s.cli("create", "thick", "--size", _mib(thick), "--type", "zeroedthick")
    s.cli("create", "thin", "--size", _mib(thin), "--type", "thin")
    s.start()
    stop[0] = s.stop
    fill(s.uri("thick"), _mib(thick))
    return ["--ioengine=nbd", f"--uri={s.uri('thick')}"], ["--ioengine=nbd", f"--uri={s.uri('thin')}"]


def _neighbour(work, rounds, thick, thin, t, cache="wb", who="strata"):
    """A filled zeroedthick disk rewritten at random (64k, QD 16) for T s:
    (a) alone, (b) beside a thin disk's first writes (512k sequential,
    QD 16, started together in one fio, stopped after T s), (c) beside
    rewrites of what (b) wrote (time based, T s). Rounds alternate
    a, b, c and b, c, a; each round a fresh datastore, served with
    `--cache none` when CACHE is "none". WHO limit or limit_onefile: the
    same on two files or in one (`_neighbour_setup`), the host's own cost
    of new data to a neighbour."""
    runs = {k: [] for k in ("alone", "beside_first", "beside_rewrite")}
    group = ("neighbour" if cache == "wb" else f"neighbour_{cache}") + ("" if who == "strata" else f"_{who}")
    for r in range(rounds):
        d = os.path.join(work, group, str(r))
        stop = [None]
        try:
            ta, tb = _neighbour_setup(d, who, thick, thin, cache, stop)
            tj = [*ta, *SHAPES["rand"], f"--size={_mib(thick)}", "--time_based", f"--runtime={span(t)}"]
            written = [0]

            def alone():
                drop_caches()
                j = _fio([], [tj], group=False)
                return {"thick_mib_s": j[0]["write"]["bw_bytes"] / MIB}

            def beside_first():
                drop_caches()
                j = _fio([], [tj, [*tb, *SHAPES["seq"], f"--size={_mib(thin)}", f"--runtime={span(t)}"]],
                         group=False)
                w = j[1]["write"]
                written[0] = w["io_bytes"] // MIB * MIB
                return {"thick_mib_s": j[0]["write"]["bw_bytes"] / MIB, "thin_mib_s": w["bw_bytes"] / MIB,
                        "thin_written_mib": w["io_bytes"] / MIB, "thin_ran_s": j[1]["job_runtime"] / 1000}

            def beside_rewrite():
                drop_caches()
                if written[0] < MIB:
                    raise RuntimeError("firstwrite: the thin disk got no first writes to rewrite")
                j = _fio([], [tj, [*tb, *SHAPES["seq"], f"--size={_mib(written[0])}", "--time_based",
                                   f"--runtime={span(t)}"]], group=False)
                return {"thick_mib_s": j[0]["write"]["bw_bytes"] / MIB,
                        "thin_mib_s": j[1]["write"]["bw_bytes"] / MIB}

            steps = [("alone", alone), ("beside_first", beside_first), ("beside_rewrite", beside_rewrite)]
            for name, f in (steps if r % 2 == 0 else steps[1:] + steps[:1]):
                x = {k: round(v, 2) for k, v in f().items()}
                runs[name].append(x)
                print(f"   {group} round {r + 1} {name}: thick {x['thick_mib_s']} MiB/s"
                      + (f", thin {x['thin_mib_s']} MiB/s" if "thin_mib_s" in x else ""), flush=True)
        finally:
            if stop[0]:
                stop[0]()
            shutil.rmtree(d, ignore_errors=True)
    out = {"thick": _mib(thick), "thin_disk": _mib(thin), "runtime_s": t, "cache": cache, "who": who,
           "thick_job": "64k randwrite QD 16, time based", "thin_job": "512k sequential write QD 16",
           "configs": {}}
    for k, rs in runs.items():
        out["configs"][k] = {m: _spread([x[m] for x in rs]) for m in rs[0]}
        out["configs"][k]["rounds"] = {m: [x[m] for x in rs] for m in rs[0]}
    th = {k: out["configs"][k]["thick_mib_s"]["median"] for k in runs}
    out["ratios"] = {"b_over_a": ratio(th["beside_first"], th["alone"]),
                     "b_over_c": ratio(th["beside_first"], th["beside_rewrite"])}
    print(f"   {group}: thick alone {th['alone']}, beside first writes {th['beside_first']}, "
          f"beside rewrites {th['beside_rewrite']} MiB/s (b/a {out['ratios']['b_over_a']}, "
          f"b/c {out['ratios']['b_over_c']})", flush=True)
    return out


def _target(value, op, y):
    met = value is not None and (value >= y if op == ">=" else value <= y)
    return {"value": value, "target": y, "op": op, "met": met}


def case_firstwrite(work, q):
    """Issue 59, item 1: the first-write penalty, measured in one run.

    A pass is one fio process (nbd engine, a job per disk, all disks at
    once, --group_reporting, --end_fsync=1, so the flush is in the time)
    writing each whole disk once; its figure is fio's aggregate MiB/s.
    For each config and round: fresh disks (a new datastore, or new raw
    files), the host page cache dropped, the first pass, dropped again,
    the rewrite pass (the same job). Beside each pass, the server's CPU
    seconds (strata's one process, or the sum over the qemu-nbd
    processes; for the limit, fio's own less what a fio of one block
    costs) per GiB written. Shapes: seq (512k sequential, QD 16) and
    rand (64k random, QD 16, randrepeat=0: fio's random map covers every
    block once).

    Peers: qemu-nbd (one process and socket per file) on raw files that
    are sparse (truncate), fallocated, or written with zeros beforehand
    (full), with cache=writeback (wb) or cache=none,aio=native (none,
    matching strata's `--cache none`); the limit: fio with io_uring
    straight on a sparse or fallocated file, direct=0 (wb) or 1 (none).

    Groups: teragen (3 disks of BIG/3, seq, thin (also with
    `--ready-ahead 0`: the series before readied space) and zeroedthick vs
    sparse and falloc raw, wb and none), teragen_cached (the same at 768
    MiB in all: what the page cache absorbs), randfill (16 disks of
    MID/16, rand, wb), scaling (strata thin, seq, 1, 4 and 16 disks
    sharing MID), kinds (1 disk of MID, seq and rand, every provisioning
    type and peer, wb and none; MID/2 each), neighbour (a filled zeroedthick disk
    rewritten at random beside a thin disk's first writes, vs alone and
    vs beside its rewrites; T s each, no flush at the end, the cache
    dropped before each; the thin disk large enough that its first
    writes last the T s; wb and none; the limit's own on two files, wb
    and none, and in one file, wb).

    Rounds: every config of a group once per round, strata and peers
    interleaved, the next round in reverse order. Each figure: median,
    min and max over the rounds (the rounds under "rounds"). A first /
    rewrite target (MiB/s or CPU) is the median of each round's pair,
    the others are ratios of medians. BIG = max(2 x the dirty-page limit, 3 GiB),
    capped at 80 % of the free space of WORK; MID = 2 GiB. --quick:
    BIG 1.5 GiB, MID 1 GiB, 3 rounds, 5 s; full: 5 rounds, 15 s."""
    dirty, dirty_src = _dirty_limit()
    st = os.statvfs(work)
    free = st.f_bavail * st.f_frsize
    budget = free * 8 // 10
    want_big = max(2 * dirty, 3 * GIB)
    big = smoke(96 * MIB, 1536 * MIB if q else min(want_big, budget))
    mid = smoke(64 * MIB, GIB if q else 2 * GIB)
    if 2 * mid > budget or big < 3 * 16 * MIB:
        raise RuntimeError(f"firstwrite: {free >> 20} MiB free in {work} is too little")
    cached = smoke(48 * MIB, 768 * MIB)
    # One disk per config and 32 configs: half of MID keeps a full run
    # within the hour (each round writes every config twice).
    kinds_size = smoke(64 * MIB, mid // 2)
    rand_disks = smoke(4, 16)
    counts = smoke([1, 2, 4], [1, 4, 16])
    rounds = smoke(1, 3 if q else 5)
    t = smoke(1, 5 if q else 15)
    thick = smoke(32 * MIB, mid)
    # Big enough that its first writes run the whole T s; it takes on the
    # disk only what T s of writes put there.
    thin = smoke(256 * MIB, max(mid, min(budget - thick, 64 * GIB)))

    res = {"params": {
        "rounds": rounds, "runtime_s": t, "shapes": {k: " ".join(v) for k, v in SHAPES.items()},
        "pass": "fio --ioengine=nbd, a job per disk, all at once, --group_reporting, --end_fsync=1",
        "dirty_limit_bytes": dirty, "dirty_limit_source": dirty_src, "free_bytes": free,
        "big": _mib(big), "big_wanted": _mib(want_big), "big_capped": big < want_big and not q,
        "mid": _mib(mid), "cached_total": _mib(cached), "kinds_size": _mib(kinds_size),
        "randfill_disks": rand_disks, "scaling_disks": counts,
        "cpu": "server process CPU (cpu_of) per GiB written; limit: fio's own less a "
               "one-block fio's (its start and exit), null when nothing is left",
        "peers": "qemu-nbd -f raw, one per file; wb: cache=writeback; none: cache=none aio=native",
        "page_cache_dropped": drop_caches(),
    }}

    tg = _group(work, "teragen", _teragen(3, _per(big, 3), ("wb", "none")), rounds)
    res["teragen"] = {"disks": 3, "per_disk": _mib(_per(big, 3)), "shape": "seq", "configs": tg,
                      "ratios": _teragen_ratios(tg)}
    tc = _group(work, "teragen_cached", _teragen(3, _per(cached, 3), ("wb", "none")), rounds)
    res["teragen_cached"] = {"disks": 3, "per_disk": _mib(_per(cached, 3)), "shape": "seq",
                             "configs": tc, "ratios": _teragen_ratios(tc)}

    rs = _per(mid, rand_disks)
    rf = _group(work, "randfill", [
        _cfg("strata", "thin", "wb", "rand", rand_disks, rs),
        _cfg("strata", "thin", "wb", "rand", rand_disks, rs, name="strata_thin_noready_wb",
             serve=NOREADY),
        _cfg("qemu", "sparse", "wb", "rand", rand_disks, rs),
        _cfg("strata", "zeroedthick", "wb", "rand", rand_disks, rs),
        _cfg("qemu", "falloc", "wb", "rand", rand_disks, rs)], rounds)
    res["randfill"] = {"disks": rand_disks, "per_disk": _mib(rs), "shape": "rand", "configs": rf,
                       "ratios": {
                           "thin_first_over_rewrite": _fw(rf, "strata_thin_wb"),
                           "thin_noready_first_over_rewrite": _fw(rf, "strata_thin_noready_wb"),
                           "zeroedthick_first_over_rewrite": _fw(rf, "strata_zeroedthick_wb"),
                           "thin_vs_qemu_sparse_first": _vs(rf, "strata_thin_wb", "qemu_sparse_wb"),
                           "zeroedthick_vs_qemu_falloc_first": _vs(rf, "strata_zeroedthick_wb",
                                                                   "qemu_falloc_wb"),
                           "thin_vs_qemu_sparse_rewrite": _vs(rf, "strata_thin_wb", "qemu_sparse_wb",
                                                              "rewrite_mib_s")}}

    sc = _group(work, "scaling", [_cfg("strata", "thin", "wb", "seq", n, _per(mid, n), name=f"disks_{n}")
                                  for n in counts], rounds)
    lo, hi = f"disks_{counts[0]}", f"disks_{counts[-1]}"
    res["scaling"] = {"disks": counts, "total": _mib(mid), "shape": "seq", "configs": sc, "ratios": {
        "aggN_over_agg1_first": _vs(sc, hi, lo), "aggN_over_agg1_rewrite": _vs(sc, hi, lo, "rewrite_mib_s"),
        "firstN_over_rewriteN": _fw(sc, hi), "N": counts[-1]}}

    kc = []
    for shape in ("seq", "rand"):
        for cache in ("wb", "none"):
            for typ, raw in KINDS:
                kc.append(_cfg("strata", typ, cache, shape, 1, kinds_size,
                               name=f"{shape}_strata_{typ}_{cache}"))
                kc.append(_cfg("qemu", raw, cache, shape, 1, kinds_size, name=f"{shape}_qemu_{raw}_{cache}"))
                if raw != "full":
                    kc.append(_cfg("limit", raw, cache, shape, 1, kinds_size,
                                   name=f"{shape}_limit_{raw}_{cache}"))
    kd = _group(work, "kinds", kc, rounds)
    kr = {}
    for shape in ("seq", "rand"):
        for cache in ("wb", "none"):
            for typ, raw in KINDS:
                me = f"{shape}_strata_{typ}_{cache}"
                kr[f"{me}_cpu_first_over_rewrite"] = kd[me]["cpu_ratio"]["median"]
                kr[f"{me}_first_over_rewrite"] = _fw(kd, me)
                kr[f"{me}_vs_qemu_{raw}_first"] = _vs(kd, me, f"{shape}_qemu_{raw}_{cache}")
                lim = f"limit_{'sparse' if raw == 'sparse' else 'falloc'}_{cache}"
                kr[f"{me}_vs_{lim}_first"] = _vs(kd, me, f"{shape}_{lim}")
    res["kinds"] = {"disks": 1, "per_disk": _mib(kinds_size), "shapes": ["seq", "rand"], "configs": kd,
                    "ratios": kr}

    res["neighbour"] = _neighbour(work, rounds, thick, thin, t)
    # Under writeback the rewrite pass (c) rewrites what the page cache
    # still holds, and the first-write stream's page-cache cost falls on
    # every writer (PERFORMANCE.md, "First writes"); under `--cache none`
    # neither side goes through the page cache.
    res["neighbour_none"] = _neighbour(work, rounds, thick, thin, t, "none")
    # The host's own: the same three runs on two files (a server with a
    # file per disk) and in one file (strata's disks share pool.data, and
    # buffered writes to one file take its inode lock in turn): the
    # bounds on b/c on this file system (PERFORMANCE.md, "First writes").
    res["neighbour_limit"] = _neighbour(work, rounds, thick, thin, t, who="limit")
    res["neighbour_limit_onefile"] = _neighbour(work, rounds, thick, thin, t, who="limit_onefile")
    res["neighbour_none_limit"] = _neighbour(work, rounds, thick, thin, t, "none", "limit")

    T = {}
    for cache in ("wb", "none"):
        T[f"teragen_thin_vs_qemu_sparse_{cache}"] = _target(
            res["teragen"]["ratios"][f"thin_vs_qemu_sparse_first_{cache}"], ">=", 1.0)
        T[f"teragen_thin_first_over_rewrite_{cache}"] = _target(
            res["teragen"]["ratios"][f"thin_first_over_rewrite_{cache}"], ">=", 0.85)
    r = res["randfill"]["ratios"]
    T["randfill_thin_first_over_rewrite"] = _target(r["thin_first_over_rewrite"], ">=", 0.85)
    T["randfill_zeroedthick_first_over_rewrite"] = _target(r["zeroedthick_first_over_rewrite"], ">=", 0.9)
    T["randfill_thin_vs_qemu_sparse"] = _target(r["thin_vs_qemu_sparse_first"], ">=", 1.0)
    T["randfill_zeroedthick_vs_qemu_falloc"] = _target(r["zeroedthick_vs_qemu_falloc_first"], ">=", 1.0)
    r = res["scaling"]["ratios"]
    T["scaling_aggN_over_agg1"] = _target(r["aggN_over_agg1_first"], ">=", 0.9)
    T["scaling_firstN_over_rewriteN"] = _target(r["firstN_over_rewriteN"], ">=", 0.8)
    T["neighbour_b_over_c"] = _target(res["neighbour"]["ratios"]["b_over_c"], ">=", 0.8)
    T["neighbour_none_b_over_c"] = _target(res["neighbour_none"]["ratios"]["b_over_c"], ">=", 0.8)
    for k, v in kr.items():
        if k.endswith("_cpu_first_over_rewrite"):
            T["kinds_" + k] = _target(v, "<=", 1.3)
    res["targets"] = T
    met = sum(x["met"] for x in T.values())
    print(f"   targets met: {met} of {len(T)}" + (" (smoke: sizes too small to mean anything)"
                                                  if smoke(True, False) else ""), flush=True)
    for k, x in T.items():
        print(f"     {k}: {x['value']} {x['op']} {x['target']}: {'met' if x['met'] else 'NOT met'}",
              flush=True)
    return res
