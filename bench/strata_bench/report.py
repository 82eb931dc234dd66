"""Reports: results.md (one table per case) and SVG plots (plot.py) next to
results.json, from a run's results or, with --render, from a JSON file."""
import json
import os

from . import plot
from .common import ratio, size_bytes


def _n(v, nd=0):
    if v is None:
        return "—"
    if isinstance(v, (int, float)):
        return f"{v:,.{nd}f}"
    return str(v)


def _flat(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _md_generic(name, data):
    rows = ["| key | value |", "|---|---|"]
    rows += [f"| {k} | {v} |" for k, v in _flat(data)]
    return rows


def _md_matrix(m):
    cells, peers = m["params"]["cells"], m["params"]["peers"]
    p = m["params"]
    out = [f"Disk {p['size']}, {p['runtime_s']} s per cell, iodepth {p['iodepth']}. "
           f"IOPS (MiB/s); ratio = strata IOPS / qemu-nbd {peers[0]} IOPS for the same cell and state."]
    types = m["params"]["types"]
    for st in ("empty", "full"):
        out += ["", f"**{st}** disks — cells: IOPS (MiB/s) ×ratio", "",
                "| cell | " + " | ".join(f"strata {t}" for t in types)
                + " | " + " | ".join(f"qemu-nbd {p}" for p in peers) + " |",
                "|---|" + "---|" * (len(types) + len(peers))]
        for c in cells:
            row = []
            for typ in types:
                v = m["strata"][typ][st][c]
                row.append(f"{_n(v['iops'])} ({_n(v['mib_s'], 1)}) ×{_n(m['ratios'][peers[0]][typ][st][c], 2)}")
            for peer in peers:
                v = m["peers"][peer][st][c]
                row.append(f"{_n(v['iops'])} ({_n(v['mib_s'], 1)})")
            out.append(f"| {c.replace('_', ' ')} | " + " | ".join(row) + " |")
    return out


def _md_chain(c):
    p = c["params"]
    out = [f"Disk {p['size']}, {p['slice_mib']} MiB overwritten after each snapshot, "
           f"{p['workload']}, {p['runtime_s']} s each.", "",
           "Growing: N snapshots (strata) / N overlays above the base (qcow2).", "",
           "| N | strata randread | qcow2 randread | ratio | strata randwrite | qcow2 randwrite | ratio |",
           "|---|---|---|---|---|---|---|"]
    for k in sorted(c["strata"]["growing"], key=int):
        a, b = c["strata"]["growing"][k], c["qcow2"]["growing"].get(k, {})
        out.append(f"| {k} | {_n(a['randread_iops'])} | {_n(b.get('randread_iops'))} | "
                   f"{_n(ratio(a['randread_iops'], b.get('randread_iops') or 0), 2)} | "
                   f"{_n(a['randwrite_iops'])} | {_n(b.get('randwrite_iops'))} | "
                   f"{_n(ratio(a['randwrite_iops'], b.get('randwrite_iops') or 0), 2)} |")
    out += ["", "After deleting the oldest snapshots one by one (N left). qcow2 delete = "
            "`qemu-img commit` of the first overlay into the base + `qemu-img rebase -u` of the next.", "",
            "| N left | strata delete ms | strata randread | strata randwrite | qcow2 delete ms | qcow2 randread | qcow2 randwrite |",
            "|---|---|---|---|---|---|---|"]
    for k in sorted(c["strata"]["after_delete"], key=int, reverse=True):
        a, b = c["strata"]["after_delete"][k], c["qcow2"]["after_delete"].get(k, {})
        out.append(f"| {k} | {_n(a['delete_ms'], 1)} | {_n(a['randread_iops'])} | {_n(a['randwrite_iops'])} | "
                   f"{_n(b.get('delete_ms'), 1)} | {_n(b.get('randread_iops'))} | {_n(b.get('randwrite_iops'))} |")
    return out


def _md_clone(c):
    p = c["params"]
    out = [f"Source {p['size']}, filled; {p['slice_mib']} MiB overwritten after each snapshot. "
           f"strata: `{p['strata']}`; qcow2: `{p['qcow2']}`.", "",
           "| snapshots | strata s | qcow2 s | qcow2 / strata |", "|---|---|---|---|"]
    for k in sorted(c["strata_s"], key=int):
        out.append(f"| {k} | {_n(c['strata_s'][k], 3)} | {_n(c['qcow2_s'].get(k), 3)} | "
                   f"{_n(c['ratio_qcow2_over_strata'].get(k), 2)} |")
    return out


def _md_formats(c):
    p = c["params"]
    kinds = ("native", "vmfsSparse", "seSparse", "qcow2")
    out = [f"Disk {p['size']}, filled, then N snapshots each overwriting {p['slice_mib']} MiB; "
           f"{p['workload']}, {p['runtime_s']} s each. native = strata disk with N snapshots; "
           "vmfsSparse/seSparse = `strata export --chain` of that history served by `strata serve --vmdk` "
           "(flat base + N+1 deltas); qcow2 = backing chain of N overlays under qemu-nbd (+1 throwaway overlay).", "",
           "| N | " + " | ".join(f"{k} randread" for k in kinds) + " | " + " | ".join(f"{k} randwrite" for k in kinds) + " |",
           "|---|" + "---|" * (2 * len(kinds))]
    for n in sorted(c["native"], key=int):
        row = [_n(c[k].get(n, c[k].get(str(n), {})).get("randread_iops")) for k in kinds]
        row += [_n(c[k].get(n, c[k].get(str(n), {})).get("randwrite_iops")) for k in kinds]
        out.append(f"| {n} | " + " | ".join(row) + " |")
    out += ["", "randread relative to the same kind at N = 0:", "",
            "| N | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    rel = c["relative_to_depth0"]
    for n in sorted(c["native"], key=int):
        out.append(f"| {n} | " + " | ".join(_n(rel[k].get(n, rel[k].get(str(n))), 2) for k in kinds) + " |")
    return out


def write_markdown(results, path):
    lines = [f"# strata bench results ({'quick' if results.get('quick') else 'full'} mode)", "",
             f"Machine: {results['machine']['cpus']} CPUs, `{results['machine']['uname']}`", ""]
    special = {"matrix": _md_matrix, "chain": _md_chain, "clone": _md_clone, "formats": _md_formats}
    for name, data in results["cases"].items():
        lines += [f"## {name}", ""]
        lines += special.get(name, lambda d: _md_generic(name, d))(data)
        lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_plots(results, outdir):
    cases, made = results["cases"], []
    mode = "quick" if results.get("quick") else "full"
    if "chain" in cases:
        c = cases["chain"]

        def pts(side, phase, key):
            d = c[side][phase]
            return [(int(k), d[k][key]) for k in sorted(d, key=int)]
        panels = []
        for phase, xl in (("growing", "snapshots / backing-chain depth N"),
                          ("after_delete", "snapshots left after deleting oldest first")):
            for key, lab in (("randread_iops", "4k random read"), ("randwrite_iops", "4k random write")):
                panels.append({"title": f"{lab} — {phase.replace('_', ' ')}", "xlabel": xl,
                               "ylabel": "IOPS", "series": [
                                   {"name": "strata", "points": pts("strata", phase, key), "color": plot.PALETTE[0]},
                                   {"name": "qemu-nbd qcow2 chain", "points": pts("qcow2", phase, key),
                                    "color": plot.PALETTE[1], "dash": "6,3"}]})
        plot.line_chart(os.path.join(outdir, "chain.svg"),
                        f"IOPS vs snapshot depth ({c['params']['size']} disk, {mode} mode)", panels)
        made.append("chain.svg")
    if "clone" in cases:
        c = cases["clone"]
        series = [{"name": "strata clone --full", "points": [(int(k), v) for k, v in sorted(c["strata_s"].items(), key=lambda x: int(x[0]))]},
                  {"name": "qemu-img convert -O qcow2 (chain top)", "dash": "6,3",
                   "points": [(int(k), v) for k, v in sorted(c["qcow2_s"].items(), key=lambda x: int(x[0]))]}]
        plot.line_chart(os.path.join(outdir, "clone.svg"),
                        f"Full-clone time vs snapshot count ({c['params']['size']} source, {mode} mode)",
                        [{"title": "wall time of the copy", "xlabel": "snapshots / chain depth of the source",
                          "ylabel": "seconds", "series": series, "xticks": sorted(int(k) for k in c["strata_s"])}],
                        cols=1, pw=640, ph=380)
        made.append("clone.svg")
    if "matrix" in cases:
        m = cases["matrix"]
        cells, peer = m["params"]["cells"], m["params"]["peers"][0]
        rows, grid = [], []
        for typ in m["params"]["types"]:
            for st in ("empty", "full"):
                rows.append(f"{typ} {st}")
                grid.append([m["ratios"][peer][typ][st][c] for c in cells])
        cols = [f"{c.split('_')[0]} {c.split('_')[1]}\n{c.split('_')[2]}" for c in cells]
        plot.heat_table(os.path.join(outdir, "matrix.svg"),
                        f"strata IOPS / qemu-nbd {peer} IOPS, per cell ({m['params']['size']}, {mode} mode)",
                        rows, cols, grid,
                        note="green: strata faster; red: slower. Rows: strata disk type and state; "
                             f"the peer is a {peer} image in the same state.")
        made.append("matrix.svg")
    if "fragmentation" in cases:
        pl = cases["fragmentation"]["placement"]
        ks = sorted(pl["regions"]["growing_together"]["per_disk"], key=int)
        series = [{"name": f"placement: {p}", "color": plot.PALETTE[i],
                   "points": [(int(k), pl[p]["growing_together"]["per_disk"][k]) for k in ks]}
                  for i, p in enumerate(("arrival", "regions"))]
        plot.line_chart(os.path.join(outdir, "fragmentation.svg"),
                        f"Fragments per disk vs disks growing together ({mode} mode)",
                        [{"title": "64k sequential writes at iodepth 4, all disks at once",
                          "xlabel": "disks written together",
                          "ylabel": "fragments per disk", "series": series, "xticks": [int(k) for k in ks]}],
                        cols=1, pw=640, ph=380)
        made.append("fragmentation.svg")
    if "zeroing" in cases:
        z = cases["zeroing"]
        panels = []
        for i, typ in enumerate(("thin", "zeroedthick", "eagerzeroedthick")):
            if typ not in z:
                continue
            d = z[typ]
            peer_key = next(k for k in d if k.startswith("qemu_raw_"))
            panels.append({"title": f"{typ}: 4k first writes", "xlabel": "seconds", "ylabel": "IOPS",
                           "series": [
                               {"name": f"strata {typ}", "color": plot.PALETTE[0],
                                "points": [(w["t_s"], w["iops"]) for w in d["windows"]]},
                               {"name": peer_key.replace("_", " "), "color": plot.PALETTE[1], "dash": "6,3",
                                "points": [(w["t_s"], w["iops"]) for w in d[peer_key]["windows"]]}]})
        size_mib = size_bytes(z["params"]["size"]) >> 20
        panels.append({"title": "grains written at least once (strata)", "xlabel": "seconds",
                       "ylabel": "% of the disk", "series": [
                           {"name": typ, "color": plot.PALETTE[i], "dash": plot.DASHES[i % len(plot.DASHES)],
                            "points": [(x["t_s"], round(100 * x["allocated_mib"] / size_mib, 1))
                                       for x in z[typ]["windows"]]}
                           for i, typ in enumerate(("thin", "zeroedthick")) if typ in z]})
        plot.line_chart(os.path.join(outdir, "zeroing.svg"),
                        f"The zeroing phase ({z['params']['size']} disks, {mode} mode)", panels)
        made.append("zeroing.svg")
    if "formats" in cases:
        f = cases["formats"]
        kinds = [("native", "strata native"), ("vmfsSparse", "VMFSsparse chain"),
                 ("seSparse", "SEsparse chain"), ("qcow2", "qcow2 chain (qemu-nbd)")]
        panels = []
        for key, lab in (("randread_iops", "4k random read"), ("randwrite_iops", "4k random write")):
            series = []
            for i, (k, name) in enumerate(kinds):
                d = f[k]
                series.append({"name": name, "color": plot.PALETTE[i], "dash": plot.DASHES[i % len(plot.DASHES)],
                               "points": [(int(n), d[n][key]) for n in sorted(d, key=int)]})
            panels.append({"title": lab, "xlabel": "snapshots / delta links above the base",
                           "ylabel": "IOPS", "series": series})
        plot.line_chart(os.path.join(outdir, "formats.svg"),
                        f"Same history, four formats ({f['params']['size']} disk, {mode} mode)", panels,
                        cols=1, pw=900, ph=320)
        made.append("formats.svg")
    return made


def render(results, out_json):
    outdir = os.path.dirname(os.path.abspath(out_json))
    results = json.loads(json.dumps(results))  # integer keys become strings, as on disk
    write_markdown(results, os.path.join(outdir, "results.md"))
    made = write_plots(results, outdir)
    print(f"report: {os.path.join(outdir, 'results.md')} " + " ".join(made))
