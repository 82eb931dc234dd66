"""Seed 001 (vStorage thin provisioning): over-commit, zeroing phases,
scaling, fragments, a thick disk beside a growing thin one, file copies,
nb/tbz. Each figure function writes its plot and returns (the paper,
strata's lines, the verdict); verdicts come from rules.py."""
import json

from . import plot, rules
from .paperlib import _g, _keys_int, _nq, _q, _series, _table
from .rules import Q


def fig_001_1(res, path):
    o = _g(res, "thinprov", "overcommit")
    cap = _g(o, "capacity_bytes")
    disks = _g(o, "disks")
    prov = sum(d["size_bytes"] for d in disks)
    used = sum(d["allocated_bytes"] for d in disks)
    reserved = _g(o, "status", "reserved_bytes")
    alarms = _g(o, "alarms")
    plot.bar_chart(path, "001 F1: over-commitment", "MiB", ["capacity", "provisioned", "allocated"],
                   ["datastore"], [[cap / 2**20], [prov / 2**20], [used / 2**20]])
    lines = _table(["disk", "type", "size MiB", "written MiB", "allocated MiB"],
                   [[d["name"], d["type"], f"{d['size_bytes'] / 2**20:,.0f}",
                     f"{d['written_bytes'] / 2**20:,.0f}", f"{d['allocated_bytes'] / 2**20:,.0f}"]
                    for d in disks])
    lines += ["", "`strata status --json` after the writes: " + ", ".join(
        f"{k} {v}" for k, v in _g(o, "status").items()),
        "", f"Alarms (`strata alarm list --json`): `{json.dumps(alarms)}`"]
    paper = ("A 100 GB datastore holds one thick disk of 20 GB and two thin disks using 20 and 40 GB: "
             "\"140GB\" provisioned on \"100GB\" (the paper's diagram; no measurement).")
    cls, failed = rules.function([
        ("more provisioned than the capacity", prov > cap),
        ("less allocated than the capacity", used < cap),
        ("the thick disk's reservation accounted", reserved > 0),
        ("an alarm raised", any(a.get("state") not in (None, "ok") for a in alarms)),
    ])
    verdict = (f"{cls}: {prov / 2**20:.0f} MiB provisioned on a {cap / 2**20:.0f} MiB datastore "
               f"({prov / cap:.0%}), {used / 2**20:.0f} MiB allocated, {reserved / 2**20:.0f} MiB "
               "reserved for the thick disk at creation, thin disks accounted as they grow, and the "
               "usage and over-commit alarms raised on it"
               + (f"; failed: {', '.join(failed)}" if failed else "") + ".")
    return paper, lines, verdict


def fig_001_3(res, path):
    z = _g(res, "thinprov", "zerophase")
    kinds = [k for k in z if k != "by_size"]
    plot.bar_chart(path, "001 F3: 64k sequential writes, first pass vs second pass", "MiB/s", kinds,
                   ["pass 1 (zeroing phase)", "pass 2 (post-zeroing)"],
                   [[_q(z, k, "pass1_mib_s").m, _q(z, k, "pass2_mib_s").m] for k in kinds],
                   errors=[[(_q(z, k, p).lo, _q(z, k, p).hi) for p in ("pass1_mib_s", "pass2_mib_s")]
                           for k in kinds])
    prm = _g(res, "thinprov", "params")
    lines = [f"One pass of 64k sequential writes over a fresh {prm['zerophase_disk']} disk, then a "
             f"second, {prm.get('zerophase_repeats', 1)} times per kind, the kinds taking turns (the "
             "paper: 2-minute runs on a 12 GB disk).", ""]
    lines += _table(["disk", "pass 1 MiB/s", "pass 2 MiB/s", "pass 1 / pass 2"],
                    [[k, _nq(_q(z, k, "pass1_mib_s"), 1), _nq(_q(z, k, "pass2_mib_s"), 1),
                      _ratio(z, k).fmt()] for k in kinds])
    by = z.get("by_size", {})
    if by:
        bks = list(next(iter(by.values())))
        lines += ["", "Other write sizes, pass 1 / pass 2:", ""]
        lines += _table(["write size"] + bks, [[bs] + [_ratio(by[bs], k).fmt() for k in bks] for bs in by])
    paper = ("64 KB sequential writes (\"1K through 512K\" trend the same): \"around 180 MBps\" for thin "
             "and thick disks after zeroing, \"around 60 MBps\" while blocks are zeroed: a first write "
             "runs at ≈0.33× a rewrite, on thin and zeroedthick alike.")
    host = _ratio(z, "qemu_raw_off") if "qemu_raw_off" in z else Q(1)
    own = {k: _ratio(z, k) / host for k in ("thin", "zeroedthick", "eagerzeroedthick")}
    cls = rules.cost(own["thin"], 60 / 180)
    vs_ezt = {k: rules.difference(own[k] / own["eagerzeroedthick"]) for k in ("thin", "zeroedthick")}
    sizes = ""
    if by and all("thin" in by[bs] and "qemu_raw_off" in by[bs] for bs in by):
        sizes = (" At other sizes thin's own cost is "
                 + ", ".join(f"{(_ratio(by[bs], 'thin') / _ratio(by[bs], 'qemu_raw_off')).fmt()} at {bs}"
                             for bs in by) + ".")
    verdict = (f"{cls}: strata thin's first pass runs at {_ratio(z, 'thin').fmt()} its second "
               f"(paper ≈0.33×), a sparse raw file's under qemu-nbd at {host.fmt()}, so thin's own "
               f"first-write cost, the host's taken out, is {own['thin'].fmt()}; zeroedthick "
               f"{own['zeroedthick'].fmt()} and eagerzeroedthick, which has nothing left to zero, "
               f"{own['eagerzeroedthick'].fmt()}. "
               + ("The kinds differ: " if any(d != "level" for d in vs_ezt.values())
                  else "The kinds are level: ")
               + ", ".join(f"{k} {rules.word(d, 'ahead of', 'behind', 'level with')} eagerzeroedthick"
                           for k, d in vs_ezt.items()) + "." + sizes)
    return paper, lines, verdict


def _ratio(z, k):
    """A kind's first pass over its second: from each run's own pair when
    the case kept them (ratio_runs), else from the two medians."""
    if "ratio_runs" in _g(z, k):
        return _q(z, k, "ratio")
    return _q(z, k, "pass1_mib_s") / _q(z, k, "pass2_mib_s")


def fig_001_4(res, path):
    sc = _g(res, "thinprov", "scaling")
    types = list(sc)
    panels = []
    for ph, lab in (("pass1_mib_s", "first writes"), ("pass2_mib_s", "rewrites")):
        panels.append({"title": lab, "xlabel": "disks written at once", "ylabel": "MiB/s (all disks)",
                       "series": [_series(i, t, [(int(n), _q(sc, t, n, ph).m) for n in _keys_int(sc[t])])
                                  for i, t in enumerate(types)],
                       "xticks": [int(n) for n in _keys_int(sc[types[0]])]})
    plot.line_chart(path, "001 F4: aggregate 64k sequential writes vs disks", panels)
    ns = _keys_int(sc[types[0]])
    p = _g(res, "thinprov", "params")
    lines = [f"Each disk {p['scaling_disk']}, written by its own NBD client (the paper: one VM per "
             "host on up to 16 hosts); MiB/s over all disks.", ""]
    lines += _table(["disks"] + [f"{t} {k}" for t in types for k in ("pass 1", "pass 2")],
                    [[n] + [_nq(_q(sc, t, n, k), 1) for t in types for k in ("pass1_mib_s", "pass2_mib_s")]
                     for n in ns])
    paper = ("1 to 16 ESX hosts, a VM each, on one shared LUN: thin and thick disks show \"similar "
             "throughput\" in both the zeroing and post-zeroing phases, and no effect of SCSI "
             "reservation conflicts as hosts were added; the conclusion: \"improved throughput as "
             "more hosts were added\".")
    per_n = [(n, _q(sc, "thin", n, "pass1_mib_s") / _q(sc, "zeroedthick", n, "pass1_mib_s")) for n in ns]
    differ = [(n, r) for n, r in per_n if rules.no_effect(r) != rules.REPRODUCES]
    cls = rules.REPRODUCES if not differ else rules.NOT_REPRODUCED
    top = ns[-1]
    host = sc.get("host", {}).get(top)
    hostfw = (f" The file system's own: the same jobs on {top} sparse files, through its page "
              "cache with no server between, write first at "
              f"{host['pass1_mib_s'] / host['pass2_mib_s']:.2f}× their rewrites; strata thin's "
              f"first writes at {top} disks reach {sc['thin'][top]['pass1_mib_s'] / host['pass1_mib_s']:.2f}× "
              "the files'."
              if host else "")
    grow = _q(sc, "thin", top, "pass1_mib_s") / _q(sc, "thin", ns[0], "pass1_mib_s")
    verdict = (f"{cls}: thin's first writes against zeroedthick's, by number of disks: "
               + ", ".join(f"{n}: {r.fmt()}" for n, r in per_n)
               + (f"; they differ at {', '.join(str(n) for n, _ in differ)} disks" if differ
                  else "; level at every count")
               + f". The aggregate of thin's first writes at {top} disks is {grow.fmt()} that at "
               f"{ns[0]} ({rules.word(rules.difference(grow), 'grows', 'falls', 'level')}: one server "
               "on 2 CPUs, where the paper added hosts)." + hostfw + " Hosts are NBD clients of one "
               "server here; real multi-host writers exist only on object-store datastores.")
    return paper, lines, verdict


def _like_for_like(rows):
    """The rows of the disk size most rows share (fragments are compared
    only between disks of one size)."""
    by = {}
    for r in rows:
        by.setdefault(r.get("disk"), []).append(r)
    return max(by.values(), key=len)


def fig_001_6(res, path):
    fg = _g(res, "thinprov", "fraggrow")
    panels = []
    for key, lab in (("randwrite_64k_iops", "64k random writes (IOPS)"),
                     ("seqread_1m_cold_mib_s", "cold 1M sequential read (MiB/s)")):
        ser = []
        for i, (pl, pts) in enumerate(fg.items()):
            xs = sorted((p["fragments"], _q(p, key).m) for p in _like_for_like(pts))
            ser.append(_series(i, f"placement {pl}", xs))
        panels.append({"title": lab, "xlabel": "fragments of the disk", "ylabel": lab.split("(")[1][:-1],
                       "series": ser})
    plot.line_chart(path, "001 F6: throughput vs fragments (disks of one size)", panels)
    rows = [[pl, p["growth"], p["k"], p.get("disk", ""), f"{p['fragments']:,}",
             _nq(_q(p, "randwrite_64k_iops")), _nq(_q(p, "seqread_1m_cold_mib_s"), 1)]
            for pl, pts in fg.items() for p in pts]
    prm = _g(res, "thinprov", "params", "fraggrow")
    lines = [f"Disks grown to full by different workloads, alone or {prm['disks_together']} growing "
             f"together in {prm['total']}; then {prm['runtime_s']} s of 64k random writes and a cold "
             "1M sequential read. The plot and the verdict compare disks of one size only.", ""]
    lines += _table(["placement", "grown by", "disks growing together", "disk", "fragments",
                     "64k randwrite IOPS", "cold 1M read MiB/s"], rows)
    paper = ("64 KB random writes on a 12 GB thin disk grown by different workloads (1 KB random "
             "writes gave the most: \"12,288 fragments\" on 1 MB blocks): the number of fragments has "
             "\"very little effect\" on throughput.")

    def spread(pts):
        same = _like_for_like(pts)
        lo = min(same, key=lambda p: p["fragments"])
        hi = max(same, key=lambda p: p["fragments"])
        return (lo["fragments"], hi["fragments"], hi.get("disk"),
                _q(hi, "randwrite_64k_iops") / _q(lo, "randwrite_64k_iops"),
                _q(hi, "seqread_1m_cold_mib_s") / _q(lo, "seqread_1m_cold_mib_s"))
    rl, rf, rd, rw, rr = spread(_g(fg, "regions"))
    al, af, ad, aw, ar = spread(_g(fg, "arrival"))
    ok = rules.no_effect(rw) == rules.REPRODUCES and rules.no_effect(rr) == rules.REPRODUCES
    cls = rules.REPRODUCES if ok else rules.NOT_REPRODUCED
    verdict = (f"{cls} with the default placement (regions): among its {rd} disks, the most fragmented "
               f"({rf:,} fragments, against {rl:,}) runs 64k random writes at {rw.fmt()} and cold "
               f"sequential reads at {rr.fmt()} the least fragmented's. Placing grains in arrival "
               f"order instead ({ad} disks, {al:,} to {af:,} fragments): {aw.fmt()} and {ar.fmt()}"
               + ("; there the fragments cost (a 64k write over scattered grains is many writes), "
                  "which is why placement is not arrival order"
                  if rules.difference(aw) == "lower" or rules.difference(ar) == "lower" else "")
               + ". `strata defrag` repairs a disk laid out before (004 below).")
    return paper, lines, verdict


def _coexist_host(two, one):
    """The verdict's sentence on the host's own figures: TWO files, ONE file."""
    t = (f" The file system's own: a written file beside a sparse one keeps {two.fmt()} what it "
         "keeps beside that file's rewrites")
    if one is None:
        return t + "."
    d = rules.difference(one / two)
    return (t + f", and {one.fmt()} when the two share one file, as strata's disks share its pool "
            "file (buffered writes to one file take its lock in turn, and new data makes them slow). "
            + ("What one file allows bounds strata here; files per disk would lift the bound."
               if d == "lower" else "One file costs no more than two here."))


def fig_001_7(res, path):
    c = _g(res, "thinprov", "coexist")
    plot.bar_chart(path, "001 F7: a thick disk's writes beside a growing thin disk", "MiB/s",
                   ["thick alone", "beside thin's first writes", "beside thin's rewrites"],
                   ["eagerzeroedthick"],
                   [[_q(c, "alone_mib_s").m], [_q(c, "beside_growth_mib_s").m],
                    [_q(c, "beside_rewrites_mib_s").m]])
    rows = [("strata", c)] + [(who, c[k]) for k, who in (("host", "host, two files"),
                                                          ("host_onefile", "host, one file"))
                              if k in c]
    lines = _table(["", "thick alone", "beside first writes", "beside rewrites", "thin's first writes",
                    "thin's rewrites"],
                   [[who] + [_nq(_q(x, k), 1) for k in ("alone_mib_s", "beside_growth_mib_s",
                                                        "beside_rewrites_mib_s", "b_first_write_mib_s",
                                                        "b_rewrite_mib_s")] for who, x in rows])
    p = _g(res, "thinprov", "params", "coexist")
    lines += ["", f"MiB/s, 64k writes at iodepth 16 each, {p['runtime_s']} s; a {p['thick']} thick disk "
              f"beside an {p['thin']} thin one; host: the same jobs on a written file beside a sparse "
              "one in the datastore's file system, through its page cache, and on the two in one file "
              "(strata's disks share one pool file)."]
    paper = ("A thick disk's throughput next to a thin disk in its zeroing phase: \"only slightly "
             "impacted\".")

    def alloc(x):
        return _q(x, "beside_growth_mib_s") / _q(x, "beside_rewrites_mib_s")
    a = alloc(c)
    cls = rules.no_effect(a)
    verdict = (f"{cls}: beside the thin disk's first writes the thick disk keeps "
               f"{(_q(c, 'beside_growth_mib_s') / _q(c, 'alone_mib_s')).fmt()} its throughput alone, "
               f"and {a.fmt()} what it keeps beside the same disk rewriting (the device shared alike, "
               "nothing allocated): "
               + ("the thin disk's allocation itself costs its neighbour little; sharing the device "
                  "costs the rest." if cls == rules.REPRODUCES else
                  "the thin disk's allocation costs its neighbour more than sharing the device does.")
               + (_coexist_host(alloc(c["host"]), alloc(c["host_onefile"]) if "host_onefile" in c else None)
                  if "host" in c else ""))
    return paper, lines, verdict


def fig_001_9(res, path):
    f = _g(res, "thinprov", "filecopy")
    states = list(f)
    it = {s: Q.of(_g(f, s, "iterations_s")) for s in states}
    plot.bar_chart(path, "001 F9: time per copy iteration", "seconds", states, ["median per iteration"],
                   [[it[s].m] for s in states], errors=[[(it[s].lo, it[s].hi)] for s in states],
                   note="bars: min-max over iterations")
    p = _g(res, "thinprov", "params", "filecopy")
    lines = [f"{p['clients']} clients, each copying {p['iterations']} times into its own "
             f"{p['disk']} disk (the paper: 16 VMs, about 290 MB per iteration until full).", ""]
    lines += _table(["disk state", "median s (min–max)", "iterations s"],
                    [[s, _nq(it[s], 3), ", ".join(f"{x:.2f}" for x in f[s]["iterations_s"])]
                     for s in states])
    paper = ("16 VMs on 2 hosts copy \"about 290MB\" per iteration to their own disk until it is full: "
             "thin (zeroing) against zeroed thick, and thin (post-zeroing) against eager zeroed thick: "
             "\"virtually no performance overhead\".")
    pairs = [("thin_first", "zeroedthick"), ("thin_rewrite", "eagerzeroedthick")]
    # Iteration i of one state against iteration i of the other: the same
    # fill level, so the slowdown as the disk and the page cache fill is
    # not taken for noise; the range is over the iterations' ratios.
    rs = [(a, b, Q.of([tb / ta for ta, tb in zip(f[a]["iterations_s"], f[b]["iterations_s"])]))
          for a, b in pairs if a in f and b in f]
    ok = all(rules.no_effect(r) == rules.REPRODUCES or rules.difference(r) == "higher" for _, _, r in rs)
    cls = rules.REPRODUCES if ok else rules.NOT_REPRODUCED
    verdict = (f"{cls}: by the paper's pairings (speed, iteration by iteration): "
               + "; ".join(f"{a.replace('_', ' ')} runs at {r.fmt()} {b}'s" for a, b, r in rs)
               + " (median and range over the iterations).")
    return paper, lines, verdict


def fig_001_10(res, path):
    z = _g(res, "thinprov", "zerophase")
    kinds = [k for k in ("thin", "zeroedthick", "eagerzeroedthick") if k in z]
    panels = []
    for key in ("nb", "tbz"):
        panels.append({"title": key, "xlabel": "0 before, 1 half-way through pass 1, 2 after",
                       "ylabel": "blocks",
                       "series": [_series(i, k, [(j, _g(z, k, "nb_tbz", ph, key))
                                                 for j, ph in enumerate(("before", "mid", "after"))])
                                  for i, k in enumerate(kinds)], "xticks": [0, 1, 2]})
    plot.line_chart(path, "001 F10-11, T2: nb and tbz through the first pass", panels)
    lines = _table(["disk", "before nb / tbz", "half-way nb / tbz", "after nb / tbz"],
                   [[k] + [f"{_g(z, k, 'nb_tbz', ph, 'nb')} / {_g(z, k, 'nb_tbz', ph, 'tbz')}"
                           for ph in ("before", "mid", "after")] for k in kinds])
    unit = z["thin"].get("nb_unit")
    if unit:
        lines += ["", f"Blocks of {unit}."]
    paper = ("`vmkfstools -D` on a 12 GB disk of 1 MB blocks: zeroedthick \"tbz = 12288 to 0, nb = "
             "12288\" while it is zeroed, thin \"tbz = 0, nb = 0 to 12288\"; both end at nb 12288, "
             "tbz 0.")
    t, zt = z["thin"]["nb_tbz"], z["zeroedthick"]["nb_tbz"]
    cls, failed = rules.function([
        ("thin's nb grows", t["before"]["nb"] < t["mid"]["nb"] < t["after"]["nb"]),
        ("thin's tbz stays 0", all(t[ph]["tbz"] == 0 for ph in t)),
        ("zeroedthick's tbz falls to 0", zt["before"]["tbz"] > zt["mid"]["tbz"] > zt["after"]["tbz"] == 0),
        ("zeroedthick's nb is whole from the start", zt["before"]["nb"] == zt["after"]["nb"]),
    ])
    verdict = (f"{cls}: thin nb {t['before']['nb']} → {t['mid']['nb']} → {t['after']['nb']} with tbz 0; "
               f"zeroedthick tbz {zt['before']['tbz']} → {zt['mid']['tbz']} → {zt['after']['tbz']} with "
               f"nb {zt['after']['nb']}"
               + (f"; failed: {', '.join(failed)}" if failed else "")
               + ". A grain still to be zeroed reads as zeros until written; what the first writes "
               "cost is figure 3's.")
    return paper, lines, verdict
