"""Seed 002 (vSphere snapshots): six workloads against snapshot depth,
the 16k job while snapshots are deleted, full clone time, and the loss
with one snapshot. Each figure function writes its plot and returns (the
paper, strata's lines, the verdict); verdicts come from rules.py."""
from . import plot, rules
from .paperlib import LABEL, _g, _keys_int, _nq, _q, _series, _table
from .rules import qmedian

# Per workload: the figure's number, its title, what the paper says, and
# what its worst system (VMFS) kept with snapshots (None: no figure).
SNAP_PAPER = {
    "randrw_4k": ("1", "FIO 4 KB random read/write vs snapshots 0-12",
                  "fio `-iodepth=32 -numjobs=4`, 300 s, 50 GB: VMFS loses \"65%\" with one snapshot "
                  "(Table 1), vSAN \"35%\", vVol nothing; the loss reaches \"as much as 85%\" on "
                  "VMFS with more snapshots.", 0.35),
    "readwrite_4k": ("2", "FIO 4 KB sequential read/write vs snapshots",
                     "VMFS loses \"65%\" with one snapshot; vSAN and vVol: no impact (Table 1).", 0.35),
    "oltp": ("4", "HammerDB (TPC-C) vs snapshots",
             "1000 warehouses: VMFS loses \"65%\" with one snapshot; vSAN and vVol: no impact "
             "(Table 1).", 0.35),
    "mixed_16k": ("5", "16 KB, 50 % random read/write while snapshots are created 1 → 12",
                  "VMFS and vSAN lose much as the chain grows; vVol is unaffected (no numbers in the "
                  "text).", None),
    "read_512k": ("7", "512 KB sequential reads vs snapshots",
                  "VMFS: \"a drop of about 33%\" with the first two snapshots, then \"about 6%\" per "
                  "snapshot; vSAN and vVol: no drop.", 0.67),
    "write_512k": ("8", "512 KB sequential writes vs snapshots",
                   "VMFS: \"dropped 35% with the first snapshot\", maintained after; vSAN and vVol: "
                   "no drop.", 0.65),
}


# What stands for the paper's application, where fio is not the paper's.
ANALOG = {"oltp": "HammerDB's analog: 8k 70/30 random data I/O beside a 4k log written with a flush "
                  "per write; the data job's IOPS carry the transactions (the log's writes rise when "
                  "the data job slows, so they are shown, not judged). "}


def _snap(res):
    s = _g(res, "snapchain")
    return s, _g(s, "params")


def _key(w):
    return "data_iops" if w == "oltp" else "iops"


def _inflight(p):
    """What the workloads keep in flight, from their fio options."""
    opts = " ".join(_g(p, "workloads").values())
    qd = next((int(o.split("=")[1]) for o in opts.split() if o.startswith("--iodepth=")), None)
    jobs = next((int(o.split("=")[1]) for o in opts.split() if o.startswith("--numjobs=")), 1)
    return qd, jobs


def _baseline_words(p):
    if p.get("baseline") == "with no snapshot":
        return ("Depth 0 is the disk with no snapshot (strata: never snapshotted; VMDK: one flat "
                "file; qcow2: the base alone); depth n has n snapshots, and the benchmark writes "
                "into the newest level, as the paper's VMs did.")
    return ("Depth 0 is the disk over a throwaway snapshot (strata: a snapshot taken and kept out "
            "of the way; VMDK: a flat base plus an empty delta; qcow2: an empty overlay), and depth "
            "n over n + 1 levels: the paper's baseline has none, so \"0 → 1\" here is one level to "
            "two.")


def _snapfig(res, path, w):
    s, p = _snap(res)
    num, title, quote, paper_keep = SNAP_PAPER[w]
    key = _key(w)
    fmts = _g(p, "formats")
    depths = _g(p, "depths")
    qd, jobs = _inflight(p)
    ser = [_series(i, LABEL.get(f, f), [(int(d), _q(s, f, "growing", d, w, key).m) for d in depths])
           for i, f in enumerate(fmts)]
    plot.line_chart(path, f"002 F{num}: {title} (here iodepth {qd} × {jobs} jobs)",
                    [{"title": w, "xlabel": "snapshots",
                      "ylabel": "data IOPS" if w == "oltp" else "IOPS (read + write)",
                      "series": ser, "xticks": [int(d) for d in depths]}],
                    cols=1, pw=720, ph=400)
    lines = [ANALOG.get(w, "") + f"`{_g(p, 'workloads', w)}`: iodepth {qd} × {jobs} jobs = {qd * jobs} in flight (the "
             f"paper: 32 × 4 = 128), {p['runtime_s']} s per run (the paper: 300 s), "
             f"{p.get('repeats', 1)} runs per cell taking turns, on a {p['disk']} "
             f"disk (the paper: 50 GB), {p['slice_mib']} MiB overwritten after each snapshot. "
             + _baseline_words(p), ""]
    cols = [LABEL.get(f, f) for f in fmts]
    if w == "oltp":
        cols += [f"{LABEL.get(f, f)} log writes/s" for f in fmts]
    lines += _table(["snapshots"] + cols,
                    [[d] + [_nq(_q(s, f, "growing", d, w, key)) for f in fmts]
                     + ([_nq(_q(s, f, "growing", d, w, "log_writes_s")) for f in fmts] if w == "oltp" else [])
                     for d in depths])
    keep = {f: qmedian([_q(s, f, "growing", d, w, key) / _q(s, f, "growing", depths[0], w, key)
                        for d in depths[1:]]) for f in fmts}
    n = keep["native"]
    cls = rules.cost(n, paper_keep)
    why = ("strata keeps one map per version, so there is no chain to walk"
           if cls == rules.REMOVES else
           "a cost strata's one map per version does not explain: see the spread and the peers")
    if rules.difference(n) == "higher":
        why += ("; it is faster with snapshots than without: its writes then go to new grains, "
                "while on the never-snapshotted disk they overwrite grains in place, which runs "
                "slower here (an open performance question, not a cost of snapshots)")
    verdict = (f"{cls}: with 1 to {depths[-1]} snapshots the native disk runs at {n.fmt()} its speed "
               f"at depth 0 (median over the depths"
               + (f"; the paper's VMFS kept ≈{paper_keep:.2f}×, vVol 1×" if paper_keep else "; vVol 1×")
               + f"); {why}. Peers: "
               + ", ".join(f"{LABEL[f]} {keep[f].fmt()}" for f in fmts if f != "native") + ".")
    return f"{title}. {quote}", lines, verdict


def fig_002_1(res, path):
    return _snapfig(res, path, "randrw_4k")


def fig_002_2(res, path):
    return _snapfig(res, path, "readwrite_4k")


def fig_002_4(res, path):
    return _snapfig(res, path, "oltp")


def fig_002_5(res, path):
    return _snapfig(res, path, "mixed_16k")


def fig_002_7(res, path):
    return _snapfig(res, path, "read_512k")


def fig_002_8(res, path):
    return _snapfig(res, path, "write_512k")


def fig_002_6(res, path):
    s, p = _snap(res)
    fmts = [f for f in ("native", "qcow2") if "after_delete" in _g(s, f)]

    def iops(f, d):
        return _q(s, f, "after_delete", d, "mixed_16k", "iops")
    panels = [{"title": "16k 50 % random, IOPS", "xlabel": "snapshots left (deleted oldest first)",
               "ylabel": "IOPS", "series": [
                   _series(i, LABEL[f], [(int(d), iops(f, d).m) for d in _keys_int(_g(s, f, "after_delete"))])
                   for i, f in enumerate(fmts)]},
              {"title": "time of each delete", "xlabel": "snapshots left", "ylabel": "ms",
               "series": [_series(i, LABEL[f], [(int(d), _g(s, f, "after_delete", d, "delete_ms"))
                                                for d in _keys_int(_g(s, f, "after_delete"))])
                          for i, f in enumerate(fmts)]}]
    plot.line_chart(path, "002 F6: 16k 50 % random while snapshots are deleted", panels)
    left = _keys_int(_g(s, "native", "after_delete"))
    lines = _table(["snapshots left"] + [f"{LABEL[f]} {k}" for f in fmts for k in ("IOPS", "delete ms")],
                   [[d] + [x for f in fmts for x in (_nq(iops(f, d)),
                                                     f"{_g(s, f, 'after_delete', d, 'delete_ms'):.1f}")]
                    for d in reversed(left)])
    paper = ("The 16 KB job while snapshots are deleted 12 → 0: performance recovers \"with each "
             "snapshot deletion\", \"almost a mirror image\" of figure 5; vVol is flat.")
    top = _q(s, "native", "growing", 0, "mixed_16k", "iops")
    after = [iops("native", d) / top for d in left]
    keep = qmedian(after)
    dn = sorted(_g(s, "native", "after_delete", d, "delete_ms") for d in left)[len(left) // 2]
    dq = (sorted(_g(s, "qcow2", "after_delete", d, "delete_ms") for d in left)[len(left) // 2]
          if "qcow2" in fmts else None)
    cls = rules.cost(keep, None)
    verdict = (f"{cls}: after each delete the native disk runs at {keep.fmt()} its speed at depth 0 "
               f"(median over the deletes; single cells {min(a.m for a in after):.2f}–"
               f"{max(a.m for a in after):.2f}×), and a delete takes {dn:.0f} ms (median)"
               + (f" against {dq:.0f} ms for qcow2's commit and rebase" if dq else "")
               + ": deleting moves no data, it drops a map and frees what only it held.")
    return paper, lines, verdict


def fig_002_9(res, path):
    c = _g(res, "clone")
    ks = _keys_int(_g(c, "strata_s"))
    plot.line_chart(path, "002 F9: full clone time vs the source's snapshots",
                    [{"title": f"{c['params']['size']} source", "xlabel": "snapshots of the source",
                      "ylabel": "seconds", "xticks": [int(k) for k in ks],
                      "series": [_series(0, "strata clone --full", [(int(k), _q(c, "strata_s", k).m) for k in ks]),
                                 _series(1, "qemu-img convert of a qcow2 chain",
                                         [(int(k), _q(c, "qcow2_s", k).m) for k in ks])]}],
                    cols=1, pw=640)
    lines = [f"A {c['params']['size']} source, {c['params'].get('slice_mib', '?')} MiB overwritten "
             f"after each snapshot; {c['params']['strata']}; {c['params']['qcow2']}.", ""]
    lines += _table(["snapshots", "strata s", "qcow2 chain s"],
                    [[k, _nq(_q(c, "strata_s", k), 3), _nq(_q(c, "qcow2_s", k), 3)] for k in ks])
    paper = ("Full clone of a VM vs its snapshots: VMFS \"increased by 100%\" with the first snapshot, "
             "then \"an average of 4%\" per snapshot; vSAN \"25%\" then \"6%\"; vVol \"no impact\".")

    def keep(series):
        # Speed with snapshots against without: the median over the depths
        # (single copies spike on this machine), time inverted.
        t0 = _q(c, series, ks[0])
        return qmedian([t0 / _q(c, series, k) for k in ks[1:]])
    kn, kq = keep("strata_s"), keep("qcow2_s")
    cls = rules.cost(kn, 0.5)
    verdict = (f"{cls}: a full clone of a source with snapshots runs at {kn.fmt()} the speed of one "
               "with none (median over 1 to "
               f"{ks[-1]} snapshots; a version's one map is copied, not a chain walked; the paper's "
               f"VMFS ≈0.5× with the first); the qcow2 chain's copy at {kq.fmt()}.")
    return paper, lines, verdict


def fig_002_t1(res, path):
    s, p = _snap(res)
    fmts, ws = _g(p, "formats"), list(SNAP_PAPER)
    depths = _g(p, "depths")
    d1 = next(d for d in depths if int(d) >= 1)

    def keep(f, w):
        k = _key(w)
        return _q(s, f, "growing", d1, w, k) / _q(s, f, "growing", depths[0], w, k)
    vals = [[100 * (1 - keep(f, w).m) for f in fmts] for w in ws]
    plot.bar_chart(path, "002 T1: loss with one snapshot", "% lost (below 0: gained)", ws,
                   [LABEL.get(f, f) for f in fmts], vals)
    paper_row = {"randrw_4k": "65 % / 35 % / none", "readwrite_4k": "65 % / none / none",
                 "oltp": "65 % / none / none", "read_512k": "70 % / none / none",
                 "write_512k": "70 % / none / none", "mixed_16k": "(figure 5)"}
    lines = [_baseline_words(p), ""]
    lines += _table(["workload", "paper VMFS / vSAN / vVol"] + [LABEL.get(f, f) for f in fmts],
                    [[w, paper_row[w]] + [f"{v:.0f} %" for v in row] for w, row in zip(ws, vals)])
    paper = ("Table 1, loss with one snapshot: SPECjbb \"No impact\" everywhere; HammerDB, FIO "
             "sequential and FIO random \"65% loss\" on VMFS; FIO large sequential \"70 % loss\"; vSAN "
             "\"35% loss\" on random I/O only; vVol \"No impact\" anywhere. (SPECjbb does no storage "
             "I/O: not run.)")
    nat = [keep("native", w) for w in ws]
    typical = qmedian(nat)
    worst = min(range(len(ws)), key=lambda i: nat[i].m)
    cls = rules.cost(typical, 0.35)
    others = {f: qmedian([keep(f, w) for w in ws]) for f in fmts if f != "native"}
    verdict = (f"{cls}: the native disk keeps {typical.fmt()} of its speed with one snapshot (median "
               f"over the six workloads; worst {ws[worst]} {nat[worst].fmt()}); "
               + ", ".join(f"{LABEL[f]} {v.fmt()}" for f, v in others.items()) + ".")
    return paper, ["", *lines], verdict


def fig_002_t5(res, path):
    s, p = _snap(res)
    fmts, depths = _g(p, "formats"), _g(p, "depths")

    def lat(f, d):
        return _q(s, f, "growing", d, "redis", "lat_ms")
    ser = [_series(i, LABEL.get(f, f), [(int(d), lat(f, d).m) for d in depths],
                   err=[(lat(f, d).lo, lat(f, d).hi) for d in depths]) for i, f in enumerate(fmts)]
    plot.line_chart(path, "002 T5: Redis's disk I/O (Table 4's shape) vs snapshots",
                    [{"title": "paced appends and reads", "xlabel": "snapshots",
                      "ylabel": "mean latency ms", "series": ser,
                      "xticks": [int(d) for d in depths]}], cols=1, pw=720, ph=400)
    lines = [f"`{_g(p, 'workloads', 'redis')}`, {p['runtime_s']} s per run, "
             f"{p.get('repeats', 1)} runs per cell. Redis serves its operations from memory; what "
             "reaches its disk (Table 4: 220 writes/s of about 45 KB, the append-only file flushed "
             "once a second, and 150 reads/s of about 33 KB) is replayed here at that pace, and a "
             "snapshot can only change its latency. " + _baseline_words(p), ""]
    lines += _table(["snapshots"] + [f"{LABEL.get(f, f)} ms" for f in fmts],
                    [[d] + [_nq(lat(f, d), 3) for f in fmts] for d in depths])
    paper = ("Redis 6.2.6 with `--appendonly:yes` in a Kubernetes worker VM, memtier at 50:50: "
             "\"250K Ops/sec\" with 0 snapshots, \"264K Ops/sec\" with 1 and \"249K Ops/sec\" with 6; "
             "\"minimal impact\". The worker's disk I/O: \"150 READS/s\", \"5 MBREAD/s\", \"220 "
             "WRITES/s\", \"10 MBWRTN/s\".")
    keep = {f: qmedian([lat(f, depths[0]) / lat(f, d) for d in depths[1:]]) for f in fmts}
    cls = rules.no_effect(keep["native"])
    verdict = (f"{cls}: with 1 to {depths[-1]} snapshots the native disk serves this I/O at "
               f"{keep['native'].fmt()} the speed it has with none (latency inverted, median over the "
               "depths); " + ", ".join(f"{LABEL[f]} {keep[f].fmt()}" for f in fmts if f != "native")
               + ".")
    return paper, lines, verdict
