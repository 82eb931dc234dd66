"""Seed 003 (thin VVols vs thin VMDKs: latency over time at 2,000 IOPS)
and seed 004 (defragmentation measured with vscsiStats). Each figure
function writes its plot and returns (the paper, strata's lines, the
verdict); verdicts come from rules.py."""
from . import plot, rules
from .common import bucket_edge, slower_than
from .paperlib import _g, _nq, _q, _series, _table
from .rules import Q


def fig_003(res, path):
    t = _g(res, "timeline")
    p = _g(t, "params")
    kinds = _g(p, "kinds")
    panels = []
    for k in kinds:
        d = _g(t, "kinds", k)
        ps = _g(d, "per_second")
        ser = [_series(0, "mean ms", [(x["t"], x["mean_ms"]) for x in ps]),
               _series(1, "p99 ms", [(x["t"], x["p99_ms"]) for x in ps]),
               _series(2, "allocated %", [(x["t"], x["allocated_pct"]) for x in ps], axis=2)]
        title = k.replace("_", " ")
        if "events" in d:
            title += f" (snapshot {d['events']['snapshot_create_s']:.0f} s, delete " \
                     f"{d['events']['snapshot_delete_s']:.0f} s)"
        panels.append({"title": title, "xlabel": "seconds", "ylabel": "latency ms", "series": ser,
                       "y2label": "allocated %", "y2max": 100})
    plot.line_chart(path, f"003: {p['bs']} writes at {p['rate_iops']} IOPS, latency per second",
                    panels, cols=2, pw=560, ph=340)
    lines = [f"fio `--rw=randwrite --bs={p['bs']} --rate_iops={p['rate_iops']} --iodepth={p['iodepth']} "
             f"--norandommap`, {p['runtime_s']} s on a {p['disk']} disk of each kind, every completion "
             "logged; allocation polled each second. `_cachenone` kinds are served with `--cache none` "
             "(O_DIRECT, as ESXi has no host page cache); the others through the page cache; "
             "`file_direct` is fio with O_DIRECT straight on a fully written file of the same file "
             "system (the paper's physical RDM: the device with nothing between). The "
             "steady range is over the per-second means of the last third.", ""]

    def steady(k):
        ps = _g(t, "kinds", k, "per_second")
        tail = [x["mean_ms"] for x in ps[len(ps) * 2 // 3:]]
        return Q(_g(t, "kinds", k, "steady_mean_ms"), min(tail), max(tail), len(tail)) if tail else \
            _q(t, "kinds", k, "steady_mean_ms")
    lines += _table(["kind", "IOPS", "first second mean ms", "steady mean ms (range)", "p99 ms",
                     "allocated ≥ 99 % at s", "around snapshot create / delete ms"],
                    [[k, f"{t['kinds'][k]['iops']:,.0f}", f"{t['kinds'][k]['first_second_mean_ms']:.3f}",
                      _nq(steady(k), 3), f"{t['kinds'][k]['p99_ms']:.3f}",
                      t["kinds"][k]["allocated_full_at_s"],
                      (f"{t['kinds'][k]['around_create_mean_ms']:.3f} / {t['kinds'][k]['around_delete_mean_ms']:.3f}"
                       if "around_create_mean_ms" in t["kinds"][k] else "")] for k in kinds])
    paper = ("VDBench, 100 % writes of 32 KB at a fixed 2,000 IOPS on a disk without a file system. "
             "RDM: \"consistently .5 ms\"; eager-zeroed thick VMDK \".5 ms latency throughout\"; thin "
             "VMDK \"starts off at 1.5 ms\" and settles to .5 ms as the disk is allocated; thin VVol "
             "\".5 ms throughout\".")
    k = t["kinds"]
    # Like for like: ESXi has no host page cache, so the O_DIRECT kinds
    # judge when they ran; what thin keeps is its steady latency over its
    # first second's (the paper's thin VMDK ≈0.33×, thin VVol 1×).
    thin = "thin_cachenone" if "thin_cachenone" in k else "thin"
    keep = steady(thin) / Q(k[thin]["first_second_mean_ms"])
    cls = rules.cost(keep, 0.5 / 1.5)
    peer = next((x for x in ("qemu_raw_off_cachenone", "qemu_raw_off") if x in k), None)
    pk = steady(peer) / Q(k[peer]["first_second_mean_ms"]) if peer else None
    dev = ("file_direct" in k and steady("file_direct"))
    ezt = next((x for x in ("eagerzeroedthick_cachenone", "eagerzeroedthick") if x in k), None)
    snap = k.get("thin_snapshot")
    sd = (rules.difference(Q(snap["around_delete_mean_ms"]) / steady("thin_snapshot")) if snap else None)
    verdict = (f"{cls}: strata {thin.replace('_', ' ')}'s first second runs at {keep.fmt()} the speed "
               f"of its allocated steady state (latency inverted; paper: thin VMDK ≈0.33×, thin VVol 1×)"
               + (f"; {peer.replace('_', ' ')} (a sparse file under qemu-nbd) {pk.fmt()}" if pk else "")
               + (f"; against the device without strata (fio with O_DIRECT on a written file, the "
                  f"RDM analog, {dev.m:.3f} ms steady), the first second runs at "
                  f"{(dev / Q(k[thin]['first_second_mean_ms'])).fmt()} and {ezt.replace('_', ' ')}'s "
                  f"steady state at {(dev / steady(ezt)).fmt()}" if dev and ezt else "")
               + (f"; in page-cache mode strata thin {(steady('thin') / Q(k['thin']['first_second_mean_ms'])).fmt()}"
                  if thin != "thin" else "")
               + (f"; a snapshot deleted mid-run: {snap['around_delete_mean_ms']:.3f} ms around the "
                  f"delete, {rules.word(sd, 'above', 'below', 'level with')} the "
                  f"{snap['steady_mean_ms']:.3f} ms steady state" if snap else "")
               + f". Latencies here are {steady(thin).m:.2f} ms against the paper's 0.5 ms: a page "
               "cache or a local SSD, not an array over Fibre Channel.")
    return paper, lines, verdict


# --- seed 004 -----------------------------------------------------------------------------

def _frag(res):
    return _g(res, "fragmentation")


def fig_004_t1(res, path):
    f = _frag(res)
    fr = _g(f, "fragments")
    keys = [("seq", "written sequentially"), ("frag", "fragmented (snapshots + random overwrites)"),
            ("frag_after_defrag", "after strata defrag")]
    plot.bar_chart(path, "004 T1-2: fragments of the disk's layout", "fragments",
                   [lab.split(" (")[0] for _, lab in keys], ["fragments"], [[_g(fr, k)] for k, _ in keys])
    lines = [f"A {_g(f, 'params', 'size')} disk (the paper: 50 GB guest volumes); fragments of the "
             "disk's layout in the pool file (extents of consecutive grains), counted by strata.", ""]
    lines += _table(["disk", "fragments"], [[lab, f"{_g(fr, k):,}"] for k, lab in keys])
    busy = []
    for key, what, span in (("client_writes_during_defrag", "`strata defrag`", "defrag"),
                            ("client_writes_during_consolidation", "`strata defrag --free-space` "
                             "(free-space consolidation, the paper's other half)", "consolidation")):
        if key in f:
            t = _g(f, key, "trials")
            ratios = [x["busy_iops_window"] / x["idle_iops_window"] for x in t
                      if x["busy_iops_window"] is not None and x["idle_iops_window"]]
            keep = Q.of(ratios).fmt() if ratios else "no measure (fio logged nothing)"
            busy.append(f"during {what} a client's 4k random writes keep {keep} of their "
                        f"rate on the idle disk over the same span ({len(t)} trials; the job took "
                        f"{_g(f, key, span + '_s'):.1f} s)")
    if busy:
        lines += ["", "Writes beside the work: " + "; ".join(busy) + ". The paper measured its "
                  "installs after the defragmentation, not during it."]
    paper = ("NTFS inside the guest, before → after the software installs (Tables 1 and 2): fragmented "
             "disk \"29.9%\" → \"28.7%\" file fragmentation, 378723 → 428174 excess file fragments; "
             "PerfectDisk-defragmented disk \"0%\" → \"0.2%\", 3 → 1869.")
    a, b, s = fr["frag"], fr["frag_after_defrag"], fr["seq"]
    # Like the paper's PerfectDisk run (no client beside it): the defrag
    # that ran alone, after the free-space consolidation, before the
    # second install replay.
    alone = _g(f, "install_after", "fragments")
    lines += ["", f"Run alone (after the free-space consolidation, before the install trace "
              f"of 004-install) `strata defrag` leaves {alone:,} fragments; beside the client "
              f"writing to another disk it left {b:,}, its new runs interleaved with that "
              "disk's first writes in the pool."]
    b = alone
    cls, failed = rules.function([
        ("fewer fragments after defrag", rules.difference(Q(b) / Q(a)) == "lower"),
        ("no more than a disk written in order", rules.difference(Q(b) / Q(s)) != "higher"),
    ])
    verdict = (f"{cls} at the host layer: strata defrag, run alone, takes the fragmented disk "
               f"from {a:,} to {b:,} fragments ({s:,} for a disk written in order)"
               + (f"; failed: {', '.join(failed)}" if failed else "")
               + ". The paper's fragments are the guest file system's: strata passes them through "
               "unchanged, and the guest's defragmenter still has its job.")
    return paper, lines, verdict


def _hist_figure(f, key, path, title, bucket):
    """One vscsiStats histogram of the cold 1M read, fragmented and
    defragmented: the bar chart at PATH and its table; returns
    ({"frag_before": {bucket: count}, "frag_after": ...}, table lines)."""
    h = {ph: _g(f, ph, "seqread_1m", key) for ph in ("frag_before", "frag_after")}
    labels = _labels(h)
    rows = [[h["frag_before"].get(lab, 0), h["frag_after"].get(lab, 0)] for lab in labels]
    plot.bar_chart(path, title, "commands", labels, ["fragmented", "defragmented"], rows,
                   xlabel=bucket)
    lines = _table([bucket, "fragmented", "defragmented"],
                   [[lab, f"{a:,}", f"{b:,}"] for lab, (a, b) in zip(labels, rows)])
    return h, lines


def fig_004_t3(res, path):
    f = _frag(res)
    tags = [("seqread_1m", "1M cold sequential read"), ("copy_64k", "64k copy-like read")]
    vals = [[_g(f, ph, t, "commands") for ph in ("frag_before", "frag_after")] for t, _ in tags]
    plot.bar_chart(path, "004 T3/T6: I/O commands per job, before and after defrag", "commands",
                   [lab for _, lab in tags], ["fragmented", "defragmented"], vals)
    lines = _table(["job", "fragmented", "defragmented"],
                   [[lab, f"{a:,}", f"{b:,}"] for (_, lab), (a, b) in zip(tags, vals)])
    paper = ("I/O commands per install: Office 37191 → 29238 (\"21.3\" % fewer; writes \"22.5\" % "
             "fewer), SQL 127703 → 90526 (\"36.5\" %; writes \"44.6\" %).")
    classes = {rules.host_layer(a, b) for a, b in vals}
    cls = classes.pop() if len(classes) == 1 else rules.REPRODUCES
    verdict = (f"{cls}: the guest issues "
               + ("the same" if cls == rules.NOT_APPLICABLE else "different")
               + " commands before and after strata's defrag ("
               + ", ".join(f"{a:,} and {b:,}" for a, b in vals) + "): a host defrag changes where "
               "data lies, not what the guest asks for; fewer, larger commands come from defragmenting "
               "the guest's own file system, which strata serves as it is. The host-layer effect is "
               "in the latency (tables 5 and 8).")
    return paper, lines, verdict


def fig_004_t4(res, path):
    f = _frag(res)
    h, lines = _hist_figure(f, "io_length", path,
                            "004 T4/T7: I/O lengths of the 1M read, before and after defrag",
                            "I/O length bucket (bytes)")
    paper = ("vscsiStats I/O lengths (512 B to >512 KB): I/Os above 512 KB grow \"18.7 times\" for "
             "Office and \"11.9\" times for SQL after defragmentation.")
    big = {ph: sum(v for lab, v in d.items() if bucket_edge(lab)[0] >= 524288) for ph, d in h.items()}
    cls = rules.host_layer(h["frag_before"], h["frag_after"])
    verdict = (f"{cls}: strata records the same vscsiStats buckets; the guest's I/O lengths are "
               f"{'the same' if cls == rules.NOT_APPLICABLE else 'not the same'} before and after a "
               f"host defrag (I/Os of 512 KiB and more: {big['frag_before']:,} and "
               f"{big['frag_after']:,}), since the guest's file system sets them and strata passes "
               "them through.")
    return paper, lines, verdict


def fig_004_t5(res, path):
    f = _frag(res)
    h, lines = _hist_figure(f, "latency_us", path,
                            "004 T5/T8: latency of the 1M cold read, before and after defrag",
                            "latency bucket (µs)")
    a, b = slower_than(h["frag_before"], 15000), slower_than(h["frag_after"], 15000)
    speed = {ph: _q(f, ph, "seqread_1m", "mib_s") for ph in ("seq", "frag_before", "frag_after")}
    gain = speed["frag_after"] / speed["frag_before"]
    lines += ["", f"Cold 1M sequential read, MiB/s (median, min–max of its passes): in order "
              f"{_nq(speed['seq'])}, fragmented {_nq(speed['frag_before'])}, defragmented "
              f"{_nq(speed['frag_after'])}."]
    paper = ("vscsiStats latency (1 µs to >100 ms): I/Os slower than 15 ms fall from 11,657 to 6272 "
             "(\"46%\") for Office and by \"48.7%\" for SQL; Office I/Os of 100 ms or more fall by "
             "\"51.2%\".")
    cls = rules.ranking(gain, 1.0)
    verdict = (f"{cls}: the cold 1M read runs at {gain.fmt()} its fragmented speed after strata's "
               f"defrag (range from the passes), and reads slower than 15 ms go from {a:,} to {b:,} of "
               f"{sum(h['frag_after'].values()):,}. The paper's install is a different workload: its "
               "figure is the guest's, this one the host's layout under the same guest I/O.")
    return paper, lines, verdict


def _labels(h):
    """The buckets of both phases' histograms, in the histogram's order."""
    return sorted(set(h["frag_before"]) | set(h["frag_after"]), key=bucket_edge)


def fig_004_seek(res, path):
    f = _frag(res)
    h, lines = _hist_figure(f, "seek_distance", path,
                            "004: seek distance of the 1M read, before and after defrag",
                            "seek distance bucket (sectors)")

    def share(d):
        tot = sum(d.values())
        return d.get("<=1", 0) / tot if tot else 0.0
    sb, sa = share(h["frag_before"]), share(h["frag_after"])
    paper = ("vscsiStats seek distance: the share of I/Os one LBN from the last grows from \"23%\" to "
             "\"33%\" (Office) and from \"19.6%\" to \"31.6%\" (SQL) after defragmentation.")
    cls = rules.host_layer(h["frag_before"], h["frag_after"])
    verdict = (f"{cls}: the guest's seek distances are its own LBAs, "
               f"{'unchanged' if cls == rules.NOT_APPLICABLE else 'changed'} by a host defrag "
               f"({sb:.0%} and {sa:.0%} one sector on); the guest file system's defragmentation moves "
               "this figure, strata's moves the latency instead.")
    return paper, lines, verdict


def fig_004_install(res, path):
    f = _frag(res)
    ins = {ph: _g(f, f"install_{ph}") for ph in ("before", "after")}
    secs = {ph: Q.of(_g(ins[ph], "s_runs")) for ph in ins}
    slow = {ph: Q.of([r["slow_15ms"] for r in _g(ins[ph], "replays")]) for ph in ins}
    names = ["fragmented", "defragmented, free space consolidated"]
    plot.bar_chart(path, "004: the install-like trace, fragmented vs defragmented disk", "seconds",
                   ["replay time"], names, [[secs["before"].m, secs["after"].m]],
                   errors=[[(secs["before"].lo, secs["before"].hi),
                            (secs["after"].lo, secs["after"].hi)]])
    cmds = {ph: _g(ins[ph], "replays")[0]["commands"] for ph in ins}
    lines = ["The nearest host-layer thing to the paper's timed installs: one I/O trace, replayed "
             "the same on the fragmented `frag` disk and on it with its free space consolidated "
             "and then defragmented (the fragments and free extents of each in the table), each "
             "replay cold, on a "
             "snapshot taken first and reverted to after, so that its writes go to new grains "
             "placed in the datastore's free space as an install's new files do. The trace: fio, "
             "seeded, 40 % reads, 20 % random offsets (the rest continue sequentially), sizes "
             "4k / 64k / 1M in 30 / 40 / 30 %, 4 in flight, a quarter of the disk moved, ended by "
             "a flush.", ""]
    lines += _table(["disk", "fragments", "free extents", "seconds (median, min–max)", "commands",
                     "slower than 15 ms"],
                    [[n, f"{_g(ins[ph], 'fragments'):,}", f"{_g(ins[ph], 'free_extents'):,}",
                      secs[ph].fmt(2, " s"), f"{cmds[ph]:,}", slow[ph].fmt(0, "")]
                     for n, ph in zip(names, ("before", "after"))])
    paper = ("Install time (the summary, not measured by vscsiStats): MS Office about 20 minutes on "
             "the fragmented disk and 15 on the defragmented one; MS SQL approximately 75 and 50.")
    speed = secs["before"] / secs["after"]
    cls = rules.ranking(speed, 20 / 15)
    same = rules.host_layer(cmds["before"], cmds["after"])
    verdict = (f"{cls}: the trace runs {speed.fmt()} as fast on the defragmented disk (range from "
               "the replays; the paper's Office install ran ≈1.33× as fast, SQL's ≈1.5×), with "
               + ("the same" if same == rules.NOT_APPLICABLE else "a different number of")
               + f" commands ({cmds['before']:,} and {cmds['after']:,}): the host-layer share of "
               "the paper's gain, the layout under the same guest I/O. The rest of its gain came "
               "from the guest's file system issuing fewer, larger commands (tables 3-4).")
    return paper, lines, verdict
