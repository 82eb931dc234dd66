"""Seed 000 (SEsparse): the Iometer matrix (figures 1-4), Hadoop (figure
6) and VDI with wipe-shrink (figures 8-10). Each figure function writes
its plot and returns (what the paper measured, strata's Markdown lines,
the verdict); verdicts come from bench/strata_bench/rules.py."""
import math
import os
from statistics import median

from . import plot, rules
from .paperlib import LABEL, _g, _kib, _nq, _q, _series, _table
from .rules import Q, gmean, qmedian

# --- the Iometer matrix (figures 1-4) ---------------------------------------------------


def _matrix(res, qd, state, path, title):
    """One of figures 1-4: a panel per (pattern, op), MiB/s vs I/O size,
    a series per disk kind; the table's cells are IOPS."""
    m = _g(res, "paper_matrix")
    sizes = _g(m, "params", f"{qd}_sizes")
    names = [s for s in _g(m, "params", "series") if s in m[qd]]
    ops = ["write"] if state == "empty" else ["read", "write"]
    xl = {math.log2(_kib(b)): b for b in sizes}
    panels, lines = [], []
    p = _g(m, "params")
    lines += [f"Disks of {p['disk']}, {p['runtime_s']} s per cell (the paper: 300 s), iodepth "
              f"{_g(p, 'qd', qd)}, {len(sizes)} sizes. "
              + ("First writes: one pass over the empty disk's cells (each written once); "
                 if state == "empty" else "The disks were filled with random data first; ")
              + "the plot is in MiB/s, the tables in IOPS."]
    for op in ops:
        for pat in ("seq", "rand"):
            ser = []
            for i, s in enumerate(names):
                cells = _g(m, qd, s, state)
                pts = [(math.log2(_kib(b)), _q(cells, f"{b}_{pat}_{op}", "mib_s").m) for b in sizes
                       if f"{b}_{pat}_{op}" in cells]
                if pts:
                    ser.append(_series(i, LABEL.get(s, s), pts))
            panels.append({"title": f"{pat} {op}", "xlabel": "I/O size", "ylabel": "MiB/s",
                           "series": ser, "xlabels": xl})
            rows = []
            for b in sizes:
                rows.append([b] + [_nq(_q(_g(m, qd, s, state), f"{b}_{pat}_{op}", "iops"))
                                   if f"{b}_{pat}_{op}" in _g(m, qd, s, state) else "–"
                                   for s in names])
            lines += ["", f"{pat} {op}, IOPS at iodepth {_g(m, 'params', 'qd', qd)}:", ""]
            lines += _table(["size"] + [LABEL.get(s, s) for s in names], rows)
    plot.line_chart(path, title, panels, cols=2, pw=560, ph=380)
    return m, sizes, lines


def _cell(m, qd, s, state, cell):
    return _q(_g(m, qd, s, state), cell, "iops")


def _mx_first_writes(m, qd, sizes):
    """Geometric means over sizes of random writes: strata thin's first
    writes / its rewrites; the same for qemu-nbd's sparse raw file (what
    the host's page cache and file system cost a first write); the first
    over the second (thin's own first-write cost, the host's taken out:
    both sides run the same bounded-pass / timed-rewrite shape); and
    SEsparse / VMFSsparse first writes."""
    def gm(a, sa, b, sb):
        return gmean([_cell(m, qd, a, sa, f"{x}_rand_write") / _cell(m, qd, b, sb, f"{x}_rand_write")
                      for x in sizes])
    fw, fw_raw = gm("thin", "empty", "thin", "full"), gm("qemu_raw", "empty", "qemu_raw", "full")
    return fw, fw_raw, fw / fw_raw, gm("seSparse", "empty", "vmfsSparse", "empty")


def verdict_empty(m, qd, sizes):
    fw, fw_raw, own, sv = _mx_first_writes(m, qd, sizes)
    # The cause is zeroing before a first write: removed when thin's first
    # writes cost it no more against its rewrites than a raw file's cost
    # the raw file (which zeroes nothing). The paper gives no thin figure.
    cls = rules.cost(own, None)
    rank = rules.ranking(sv, 2.0)
    return (f"{cls}; SEsparse over VMFSsparse {rank}. strata thin's random first writes run at "
            f"{fw.fmt()} its own rewrites of the same cells (geometric mean over {len(sizes)} sizes), "
            f"a sparse raw file's under qemu-nbd at {fw_raw.fmt()} (the host's page cache and file "
            f"system; VMFS thin also zeroes each 1 MB block first), so thin's own first-write cost is "
            f"{own.fmt()} (both sides measured alike: a bounded first pass against timed rewrites of "
            f"the full disk, so that difference of shape cancels). strata's SEsparse driver runs random first writes at {sv.fmt()} its "
            f"VMFSsparse driver (the paper: \"about 2x\").")


def verdict_full(m, qd, sizes, gap_expected):
    cells = [f"{b}_{p}_{o}" for b in sizes for p in ("seq", "rand") for o in ("read", "write")]
    delta = gmean([_cell(m, qd, "native_delta", "full", c) / _cell(m, qd, "thin", "full", c)
                   for c in cells])
    rnd = [c for c in cells if "_rand_" in c]
    se = gmean([_cell(m, qd, "seSparse", "full", c) / _cell(m, qd, "thin", "full", c) for c in rnd])
    vm = gmean([_cell(m, qd, "vmfsSparse", "full", c) / _cell(m, qd, "thin", "full", c) for c in rnd])
    cls = rules.cost(delta, None)
    if gap_expected:
        # Local bed: the paper finds sparse metadata costs random I/O.
        ok = rules.difference(se) == "lower" and rules.difference(vm) == "lower"
        order = ("reproduce" if ok else "do not reproduce") + " the paper's cost of sparse metadata"
    else:
        # SAN bed: the paper calls the gap to thin "minimal".
        ok = rules.no_effect(se) == rules.REPRODUCES and rules.no_effect(vm) == rules.REPRODUCES
        order = ("reproduce" if ok else "do not reproduce") + " the paper's \"minimal\" gap"
    rank = rules.ranking(se / vm, 1.0)
    return (f"{cls} for native disks; the VMDK formats {order}. A full linked clone runs at {delta.fmt()} "
            f"a full thin disk over all {len(cells)} cells (one map per version: no metadata walk "
            f"that thin does not do). SEsparse runs random cells at {se.fmt()} thin, VMFSsparse at "
            f"{vm.fmt()}; SEsparse ahead of VMFSsparse (the paper's order): {rank}.")


def _matrix_fig(res, path, qd, state, title, paper):
    """Figures 1-4: the matrix of one bed (QD) and STATE, and its verdict.
    The paper expects sparse metadata to cost random I/O on full disks on
    the local bed; on the SAN it calls the gap to thin "minimal"."""
    m, sizes, lines = _matrix(res, qd, state, path, title)
    verdict = (verdict_empty(m, qd, sizes) if state == "empty"
               else verdict_full(m, qd, sizes, gap_expected=qd == "local"))
    return paper, lines, verdict


def fig_000_1(res, path):
    return _matrix_fig(
        res, path, "local", "empty", "000 F1: first writes to empty disks, iodepth 16",
        "Iometer, 1 worker, 16 outstanding I/Os, 300 s, on empty disks, sequential and random "
        "writes at 4 KB to 512 KB. SEsparse leads, except that VMFSsparse is ahead at 512 KB random "
        "and thin at 4 KB sequential; thin's random writes are the lowest, because VMFS \"allocates "
        "blocks at a 1MB granularity\" and zeroes each block first. SEsparse random writes are "
        "\"about 2x\" VMFSsparse's (executive summary).")


def fig_000_2(res, path):
    return _matrix_fig(
        res, path, "local", "full", "000 F2: full disks, reads and writes, iodepth 16",
        "The same cells on disks pre-filled with random data, reads and writes. Thin beats both "
        "sparse formats on random I/O, which needs their extra metadata; thin and SEsparse are "
        "level on sequential I/O; SEsparse beats VMFSsparse on random I/O and on sequential "
        "writes (VMFSsparse writes synchronously). The paper gives no numbers for this figure.")


def fig_000_3(res, path):
    return _matrix_fig(
        res, path, "san", "empty", "000 F3: first writes to empty disks, iodepth 32 (SAN analog)",
        "Figure 1 on a SAN (EMC VNX 5700, RAID 5 over 5 FC drives) at 32 outstanding I/Os: "
        "\"very similar\" to the local disk; thin is worst on random writes; SEsparse is "
        "\"significantly better\" than VMFSsparse. This machine has one virtio disk: the analog is "
        "the same cells at iodepth 32.")


def fig_000_4(res, path):
    return _matrix_fig(
        res, path, "san", "full", "000 F4: full disks, reads and writes, iodepth 32 (SAN analog)",
        "Figure 2 on the SAN: SEsparse \"performs on par with or better than\" VMFSsparse, and the "
        "gap between thin and the sparse formats is \"minimal\" (many spindles absorb the "
        "metadata seeks).")


# --- Hadoop (figure 6) -------------------------------------------------------------------

# The paper's ranking of SEsparse against VMFSsparse per phase, as
# (which is ahead, by what factor of elapsed time).
TERA_PAPER = {"teragen": ("vmfsSparse", 1.4), "terasort": ("vmfsSparse", 1.05),
              "teravalidate": ("seSparse", 1.43)}


def fig_000_6(res, path):
    t = _g(res, "tera")
    p = _g(t, "params")
    names, phases = _g(p, "series"), _g(p, "phases")
    runs = t.get("runs", {})

    def el(s, ph):
        if s in runs:
            return Q.of([_g(r, ph) for r in runs[s]])
        return Q.of(_g(t, "elapsed_s", s, ph))
    vals = [[el(s, ph).m for s in names] for ph in phases]
    plot.bar_chart(path, f"000 F6: TeraGen / TeraSort / TeraValidate, {p['disks']} disks × "
                   f"{p['region']} (lower is better)", "seconds", phases,
                   [LABEL.get(s, s) for s in names], vals,
                   errors=[[(el(s, ph).lo, el(s, ph).hi) for s in names] for ph in phases],
                   note=f"median of {p['repetitions']} runs; bars: min-max")
    lines = [f"{p['disks']} disks at once per series, {p['region']} of data each, median "
             f"(min–max) of {p['repetitions']} runs, page cache dropped before each phase. Jobs: "
             + "; ".join(f"{ph}: {p['jobs'][ph]}" for ph in phases) + ".", ""]
    lines += _table(["series"] + [f"{ph} s" for ph in phases] + [f"{ph} MiB/s" for ph in phases],
                    [[LABEL.get(s, s)] + [_nq(el(s, ph), 2) for ph in phases]
                     + [_nq(_q(t, "mib_s", s, ph)) for ph in phases] for s in names])
    paper = ("Hadoop on 6 VMs × 3 VMDKs, 500 GB, mean of 3 runs, elapsed time per application. "
             "TeraGen (mostly 512 KB sequential writes to empty disks): VMFSsparse best; thin pays for "
             "zeroing; SEsparse \"approximately 40%\" below VMFSsparse. TeraSort (60 % writes to "
             "unallocated regions, 40 % reads): thin best, VMFSsparse ahead of SEsparse by "
             "\"approximately 5%\". TeraValidate (reads): thin best, SEsparse ahead of VMFSsparse by "
             "\"43%\".")
    # Times: what thin keeps of the raw file's speed is raw time / thin time.
    thin_keep = [el("qemu_raw", ph) / el("thin", ph) for ph in phases]
    clone_keep = gmean([el("thin", ph) / el("native_delta", ph) for ph in phases])
    ranks = []
    for ph in phases:
        ahead, factor = TERA_PAPER[ph]
        behind = "seSparse" if ahead == "vmfsSparse" else "vmfsSparse"
        ranks.append((ph, rules.ranking(el(behind, ph) / el(ahead, ph), factor), ahead))
    agree = sum(1 for _, r, _ in ranks if r in (rules.REPRODUCES, rules.IN_PART))
    cls = rules.cost(gmean([thin_keep[0], clone_keep]), None)
    verdict = (f"{cls} for native disks; the paper's order of SEsparse and VMFSsparse holds in "
               f"{agree} of {len(phases)} phases. strata thin runs at "
               f"{', '.join(k.fmt() for k in thin_keep)} the speed of qemu-nbd on a sparse raw file "
               f"for {', '.join(phases)} (by time), and a linked clone of an empty base at "
               f"{clone_keep.fmt()} thin's speed (geometric mean). By phase, the paper's leader ahead: "
               + "; ".join(f"{ph}: {LABEL[a]} {r}" for ph, r, a in ranks) + ".")
    return paper, lines, verdict


# --- VDI (figures 8-10) ------------------------------------------------------------------

def _vdi(res):
    v = _g(res, "vdi")
    return v, _g(v, "params"), _g(v, "rounds")


def fig_000_8(res, path):
    v, p, rounds = _vdi(res)
    boots = [_g(rd, "desktop_boot_s") for rd in rounds]
    plot.bar_chart(path, "000 F8: desktop boot time per round (CPU-bound in a TCG guest)", "seconds",
                   [f"round {i}" + (" (no shrink yet)" if i == 0 else f" (after {i})")
                    for i in range(len(rounds))],
                   [f"desktop {k}" for k in range(p["clones"])], boots)
    lines = [f"{p['clones']} SEsparse linked clones of one golden image ({p['disk_mib']} MiB disks), "
             f"{p['rounds']} rounds; each round every desktop boots (TCG guest), writes, installs and "
             f"uninstalls {p['app_mib']} MiB and trims; then all clones are shrunk online. A desktop's "
             "boot is CPU-bound work in the guest, the analog of Group A.", ""]
    lines += _table(["round", "boot s per desktop", "median"],
                    [[i, ", ".join(f"{b:.1f}" for b in bs), f"{median(bs):.1f}"]
                     for i, bs in enumerate(boots)])
    paper = ("View Planner, 40 linked clones (Windows 7), latency of CPU-sensitive operations (Group A) "
             "for VMFSsparse and for SEsparse before, during and after wipe-shrink: the SEsparse "
             "increase before wipe-shrink is \"not statistically significant\".")
    if len(boots) > 1:
        ch = qmedian([Q.of(b) for b in boots[1:]]) / Q.of(boots[0])
        cls = rules.no_effect(ch)
        verdict = (f"{cls}: boots after shrinks take {ch.fmt()} the first round's (median per round, "
                   "range over the desktops): CPU-bound work does not see the disk format or the "
                   "shrink.")
    else:
        verdict = (f"{rules.NOISE}: one round ({median(boots[0]):.1f} s per boot) has no boot after "
                   "a shrink to compare; the full run has three.")
    return paper, lines, verdict


def fig_000_9(res, path):
    v, p, rounds = _vdi(res)
    wins = ("before_shrink", "during_shrink", "after_shrink")
    lat = [[_g(rd, w, "latency", "mean_us") for w in wins] for rd in rounds]
    plot.bar_chart(path, "000 F9: clients' 4k write latency around the online shrink (paced)",
                   "mean latency (µs)", [f"round {i}" for i in range(len(rounds))],
                   ["before", "during", "after"], lat)
    rate = p["paced_iops_per_clone"]
    lines = [f"Client: {p['client']}, paced at {rate:,} IOPS per clone ({p['runtime_s']} s per "
             "window, all clones at once); the same clients closed-loop first give the clones' "
             "capacity.", ""]
    lines += _table(["round", "capacity IOPS", "paced IOPS before / during / after",
                     "mean µs before / during / after", "p99 µs during", "shrink s"],
                    [[i, f"{_g(rd, 'saturated', 'iops'):,.0f}",
                      " / ".join(f"{_g(rd, w, 'iops'):,.0f}" for w in wins),
                      " / ".join(f"{x:,.0f}" for x in lat[i]),
                      f"{_g(rd, 'during_shrink', 'latency', 'p99_us'):,.0f}",
                      f"{_g(rd, 'during_shrink', 'shrink_s'):.2f}"]
                     for i, rd in enumerate(rounds)])
    keep = Q.of([b / d for b, d, _ in lat])
    after = Q.of([b / a for b, _, a in lat])
    rate_kept = Q.of([_g(rd, "during_shrink", "iops") / _g(rd, "before_shrink", "iops")
                      for rd in rounds])
    paper = ("Storage-sensitive operations (Group B): \"some increase in latency during wipe-shrink "
             "and improvements after\".")
    dip = rules.cost(keep, None)
    gain = rules.ranking(after, 1.0)
    verdict = (f"{dip} (latency during the shrink); the gain after, {gain}. Under the paced load "
               f"the clients' mean latency is {(Q(1) / keep).fmt()} its level before the shrink while "
               f"the shrink runs and {(Q(1) / after).fmt()} after it (median and range over "
               f"rounds), at {rate_kept.fmt()} their paced rate; a shrunk SEsparse delta is no faster to "
               "write, so no gain after is expected.")
    return paper, lines, verdict


def fig_000_10(res, path):
    v, p, rounds = _vdi(res)
    cpu = _g(v, "server_cpu_pct")
    plot.bar_chart(path, "000 F10: server CPU around the shrink (paced clients)", "% of one core",
                   ["before", "during", "after"], ["strata serve"],
                   [[cpu["before"]], [cpu["during"]], [cpu["after"]]],
                   note=f"space given back: {_g(v, 'reclaimed_mib_per_clone')} MiB per clone "
                        f"of {p['app_mib']} MiB uninstalled")
    ncpu = os.cpu_count()
    own = Q.of([_g(rd, "during_shrink", "shrink_cpu_pct_of_one_core") / ncpu / 100 for rd in rounds])
    lines = _table(["window", "server CPU % of one core"],
                   [[w, f"{cpu[w]:.1f}"] for w in ("before", "during", "after")])
    lines += ["", f"Space given back per clone and round: {_g(v, 'reclaimed_mib_per_clone'):.1f} MiB of "
              f"the {p['app_mib']} MiB each desktop installed and removed. The clients are paced "
              f"({p['paced_iops_per_clone']:,} IOPS per clone), as the paper's were, so the "
              "server's CPU while the shrink runs, less its CPU under the same load before, is "
              f"the shrink's own: {own.fmt(1, '')} of the host's {ncpu} cores, as a fraction "
              "(median and range over rounds)."]
    paper = ("Host CPU during wipe-shrink: a \"10% CPU cost\"; \"around 600MB per VM\" given back "
             "after \"130MB per iteration\" was uninstalled.")
    back = _g(v, "reclaimed_mib_per_clone") / p["app_mib"]
    cls, failed = rules.function([("every uninstalled MiB back (at least 90 %)", back >= 0.9)])
    cost = rules.difference(own / Q(0.10))
    verdict = (f"{cls}: {back:.0%} of the uninstalled space comes back from every clone"
               + (f" (failed: {', '.join(failed)})" if failed else "")
               + f"; the shrink's own CPU is {own.m:.1%} of the host ({own.lo:.1%}–{own.hi:.1%}), "
               + rules.word(cost, "more than", "less than", "level with")
               + " the paper's 10 %.")
    return paper, lines, verdict
