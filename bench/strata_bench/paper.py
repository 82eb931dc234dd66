"""`make paper` (bench.py --paper): every seed figure with storage data,
measured in the same shape on this machine, set beside the paper's own
numbers in docs/SEEDS.md, with a plot (docs/seeds/*.svg) and a verdict per
figure.

PAPER_CASES are the cases the page needs; FIGURES is the page, one entry
per seed figure: its id, its seed, its title, a function that writes its
plot and returns (what the paper measured, what strata measured as
Markdown lines, the verdict), where in the seed the paper's numbers are,
and the cases it reads. The figure functions live in seed000.py ...
seed003_004.py; every verdict's class comes from a rule in rules.py,
computed from the measured numbers and their spread, never written in
advance. A figure whose data is missing fails the render with
the missing key's path: that is what `make test` checks (`--paper
--smoke`)."""
import json
import os
import subprocess
import time

from . import rules
from .common import ROOT
from .paperlib import Missing, _table
from .seed000 import (fig_000_1, fig_000_2, fig_000_3, fig_000_4, fig_000_6, fig_000_8, fig_000_9,
                      fig_000_10)
from .seed001 import fig_001_1, fig_001_3, fig_001_4, fig_001_6, fig_001_7, fig_001_9, fig_001_10
from .seed002 import (fig_002_1, fig_002_2, fig_002_4, fig_002_5, fig_002_6, fig_002_7, fig_002_8,
                      fig_002_9, fig_002_t1, fig_002_t5)
from .seed003_004 import (fig_003, fig_004_install, fig_004_seek, fig_004_t1, fig_004_t3, fig_004_t4,
                          fig_004_t5)

PAPER_CASES = ["paper_matrix", "tera", "vdi", "thinprov", "fragmentation", "snapchain", "clone",
               "timeline"]

SEEDS = {
    "000": "SEsparse (VMware, vSphere 5.5): thin vs SEsparse vs VMFSsparse",
    "001": "vStorage thin provisioning (VMware, vSphere 4)",
    "002": "vSphere snapshots on VMFS, vSAN and vVols (VMware, ESXi 7.0 U2)",
    "003": "Thin VVols vs thin VMDKs (blog)",
    "004": "Defragmenting Windows guests on ESX, measured with vscsiStats (Raxco)",
}

# The page: (id, seed, title, function, where in the seed its numbers
# are, the cases it reads).
FIGURES = [
    ("000-f1", "000", "Figure 1: write performance of empty disks (local)", fig_000_1,
     "Figure 1, \"Empty VMDK\"; Tables 2-3; executive summary", ["paper_matrix"]),
    ("000-f2", "000", "Figure 2: reads and writes of full disks (local)", fig_000_2,
     "Figure 2, \"Full VMDK\"", ["paper_matrix"]),
    ("000-f3", "000", "Figure 3: write performance of empty disks (SAN)", fig_000_3,
     "Figure 3, \"Performance Results on SAN Storage\"; Table 1", ["paper_matrix"]),
    ("000-f4", "000", "Figure 4: reads and writes of full disks (SAN)", fig_000_4,
     "Figure 4, \"Full VMDK\" (SAN)", ["paper_matrix"]),
    ("000-f6", "000", "Figure 6: TeraGen, TeraSort, TeraValidate", fig_000_6,
     "Figure 6, \"Hadoop MapReduce Applications\"", ["tera"]),
    ("000-f8", "000", "Figure 8: VDI, CPU-sensitive operations", fig_000_8,
     "Figure 8, \"VDI\"", ["vdi"]),
    ("000-f9", "000", "Figure 9: VDI, storage-sensitive operations", fig_000_9, "Figure 9", ["vdi"]),
    ("000-f10", "000", "Figure 10: VDI, CPU and space of wipe-shrink", fig_000_10,
     "Figure 10 and the text above it", ["vdi"]),
    ("001-f1", "001", "Figure 1: over-commitment", fig_001_1, "Figure 1 and the text above it",
     ["thinprov"]),
    ("001-f3", "001", "Figure 3: zeroing phase vs post-zeroing", fig_001_3,
     "\"Allocation Type of Disks\", Figure 3 and footnote 3", ["thinprov"]),
    ("001-f4", "001", "Figure 4: scaling over hosts", fig_001_4,
     "Figure 4, \"How does thin provisioning scale compared to thick?\"", ["thinprov"]),
    ("001-f6", "001", "Figure 6: fragmentation vs throughput", fig_001_6,
     "Figure 6 and the text under it", ["thinprov"]),
    ("001-f7", "001", "Figure 7: a thick disk beside a growing thin disk", fig_001_7,
     "Figure 7 and the sentence above it", ["thinprov"]),
    ("001-f9", "001", "Figure 9: file copies", fig_001_9, "\"Test 2 Methodology\", Figure 9",
     ["thinprov"]),
    ("001-f10", "001", "Figures 10-11, Table 2: nb and tbz", fig_001_10,
     "Figures 10-11, Table 2, Appendix", ["thinprov"]),
    ("002-f1", "002", "Figure 1: random I/O vs snapshots", fig_002_1,
     "Figure 1, the fio command lines, Table 1, conclusion", ["snapchain"]),
    ("002-f2", "002", "Figure 2: sequential I/O vs snapshots", fig_002_2, "Figure 2, Table 1",
     ["snapchain"]),
    ("002-f4", "002", "Figure 4: HammerDB vs snapshots", fig_002_4,
     "Figure 4, HammerDB parameters, Table 1", ["snapchain"]),
    ("002-f5", "002", "Figure 5: 16 KB mixed I/O while snapshots are created", fig_002_5,
     "Figure 5 and the text under it", ["snapchain"]),
    ("002-f6", "002", "Figure 6: 16 KB mixed I/O while snapshots are deleted", fig_002_6,
     "Figure 6 and the text under it", ["snapchain"]),
    ("002-f7", "002", "Figure 7: 512 KB sequential reads vs snapshots", fig_002_7,
     "\"Workloads with large I/O sizes\", Figure 7", ["snapchain"]),
    ("002-f8", "002", "Figure 8: 512 KB sequential writes vs snapshots", fig_002_8,
     "\"Workloads with large I/O sizes\", Figure 8", ["snapchain"]),
    ("002-f9", "002", "Figure 9: full clone time vs snapshots", fig_002_9,
     "\"Impact on VM clone performance\", Table 2, Figure 9", ["clone"]),
    ("002-t1", "002", "Table 1: loss with one snapshot", fig_002_t1, "Table 1", ["snapchain"]),
    ("002-t5", "002", "Table 5: Redis vs snapshots (its disk I/O)", fig_002_t5,
     "Redis container workload parameters, Tables 4 and 5", ["snapchain"]),
    ("003", "003", "Latency over time at 2,000 IOPS: RDM, EZT, thin VMDK, thin VVol", fig_003,
     "\"Performance Testing\" (the post's four charts)", ["timeline"]),
    ("004-t1", "004", "Tables 1-2: fragmentation before and after", fig_004_t1, "Tables 1 and 2",
     ["fragmentation"]),
    ("004-t3", "004", "Tables 3 and 6: I/O commands", fig_004_t3, "Tables 3 and 6", ["fragmentation"]),
    ("004-t4", "004", "Tables 4 and 7: I/O lengths", fig_004_t4, "Tables 4 and 7 and the text under "
     "them", ["fragmentation"]),
    ("004-t5", "004", "Tables 5 and 8: latency", fig_004_t5, "Tables 5 and 8, the text under them, "
     "summary", ["fragmentation"]),
    ("004-seek", "004", "Seek distance", fig_004_seek, "the seek-distance histograms' text (Office "
     "and SQL)", ["fragmentation"]),
    ("004-install", "004", "Install times: an install-like trace before and after", fig_004_install,
     "the summary's install times", ["fragmentation"]),
]

NOT_MEASURED = [
    ("000", "Figures 5 and 7, Tables 1-4", "test beds and diagrams: the configuration is given in each section"),
    ("001", "Figures 2, 5 and 8, Table 1", "diagrams; Table 1 (allocation types) is `strata create --type`"),
    ("002", "Figure 3 (SPECjbb)", "no storage I/O: unaffected everywhere, nothing to measure"),
    ("002", "Figure 10, Tables 3-4 (Kubernetes)", "no container stack here: Table 4's disk I/O shapes "
     "the Redis analog of Table 5, and Table 2, the clone workflow, is figure 9's"),
]


def commit():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _took(results):
    """' (this run: N minutes, the longest cases ...)' from the cases'
    times, or nothing when they are not recorded."""
    t = results.get("case_s") or {}
    if not t:
        return ""
    top = sorted(t.items(), key=lambda kv: -kv[1])[:3]
    return (f" (this run: {sum(t.values()) / 60:.0f} minutes; longest "
            + ", ".join(f"{c} {s / 60:.0f}" for c, s in top) + ")")


def _run_of(results, case):
    """The commit, date and machine of the run that measured CASE."""
    r = (results.get("case_runs") or {}).get(case, {})
    m = r.get("machine") or results.get("machine") or {}
    return (r.get("commit", results.get("commit")), r.get("date", results.get("date")),
            m.get("cpus"), m.get("uname"))


def _provenance(results):
    """Which run measured which case: one sentence when a single run
    measured them all, else the cases of each commit and date (a run of
    some cases, `--only`, keeps the others from the run before)."""
    by = {}
    for case in results["cases"]:
        by.setdefault(_run_of(results, case)[:2], []).append(case)
    if len(by) <= 1:
        return "Every number below was measured in that run (bench/paper.json). "
    parts = [f"{', '.join(f'`{c}`' for c in cases)} at `{c}` on {d}"
             for (c, d), cases in sorted(by.items(), key=lambda x: x[0][1] or "", reverse=True)]
    return ("Not every case ran in that run: " + "; ".join(parts) +
            " (bench/paper.json, `case_runs`; each section names its own). ")


def _section_provenance(results, cases):
    out = []
    for c in cases:
        cm, d, cpus, uname = _run_of(results, c)
        out.append(f"`{c}` at `{cm}` on {d}" + (f", {cpus} CPUs" if cpus else "")
                   + (f", `{uname.split()[2]}`" if uname and len(uname.split()) > 2 else ""))
    return "*Measured by " + "; ".join(out) + ".*"


def verdict_class(verdict):
    """The class a verdict opens with (the words before its first colon)."""
    return verdict.split(":")[0].split(". ")[0]


def render_paper(results, doc, partial=False):
    """docs/SEEDS.md (or `doc`) and its plots in a `seeds/` directory next
    to it, from a paper run's results; returns {figure id: {"verdict",
    "plot"}}. Raises Missing (naming the key) when a figure's data is
    absent, unless `partial` (a run of some cases: those figures say that
    they have no data)."""
    cases = json.loads(json.dumps(results["cases"]))  # integer keys as on disk
    outdir = os.path.join(os.path.dirname(os.path.abspath(doc)), "seeds")
    os.makedirs(outdir, exist_ok=True)
    mode = "smoke" if results.get("smoke") else "quick" if results.get("quick") else "full"
    done, body, missing = {}, [], []
    seed = None
    for fid, sd, title, fn, where, used in FIGURES:
        if sd != seed:
            seed = sd
            body += [f"# Seed {sd}: {SEEDS[sd]}", ""]
        svg = os.path.join(outdir, f"{fid}.svg")
        try:
            paper, lines, verdict = fn(cases, svg)
        except Missing as e:
            missing.append(f"{fid}: cases.{e.args[0]}")
            body += [f"## {sd} {title}", "", f"**No data:** `cases.{e.args[0]}` is missing.", ""]
            done[fid] = {"verdict": "no data", "plot": None}
            continue
        rel = os.path.relpath(svg, os.path.dirname(os.path.abspath(doc)))
        body += [f"## {sd} {title}", "", f"**The paper** (seed {sd}: {where}). {paper}", "",
                 "**strata.** " + _section_provenance(results, used), "", *lines, "",
                 f"![{fid}]({rel})", "", f"**Verdict: {verdict}**", ""]
        done[fid] = {"verdict": verdict_class(verdict), "plot": rel}
    if missing and not partial:
        raise Missing("figures without their data: " + "; ".join(missing))
    head = [
        "# The seeds' figures, reproduced",
        "",
        f"Written by `make paper` ({mode} mode) at commit `{results.get('commit', commit())}` on "
        f"{results['machine']['cpus']} CPUs (`{results['machine']['uname']}`), "
        f"{results.get('date', time.strftime('%Y-%m-%d'))}. " + _provenance(results) +
        f"Rerun with `make paper`{_took(results)} or `python3 bench/bench.py --paper --quick` "
        "(about 20 minutes, one run per cell).",
        "",
        "What stands for what: VMFS thin VMDK → a strata `thin` disk (and qemu-nbd on a sparse raw "
        "file as the peer); VMFSsparse and SEsparse deltas → strata's own VMDK drivers "
        "(`strata serve --vmdk`) serving the files `strata export --subformat` writes, with qemu-nbd "
        "on the VMFSsparse files as the peer (QEMU 7.2 cannot write SEsparse); vVol / array "
        "snapshots → strata's native snapshots and linked clones (one map per version); vSAN → a "
        "qcow2 backing chain under qemu-nbd. Hosts and VMs → NBD clients of one server; Iometer, "
        "VDBench, HammerDB → fio jobs of the same shape. Scale: one 2-CPU VM with one virtio disk "
        "against the papers' servers and arrays; each section says what was scaled.",
        "",
        "How to read the numbers: a cell measured more than once shows its median and, in "
        "parentheses, the minimum and maximum of its runs (error bars in the plots); a ratio's "
        "range is the worst case of both sides' ranges. A number with no range was measured once. "
        "Paper numbers in quotes are the seed's words; a number marked ≈ is derived from them "
        "(e.g. ≈0.33× from 60 and 180 MBps); each section names where in the seed they are.",
        "",
        "Every verdict is computed by bench/strata_bench/rules.py, one rule per kind of claim:",
        "",
    ]
    head += [f"- **{k}**: {text}" for k, text in rules.LEGEND]
    head += ["", "| figure | verdict |", "|---|---|"]
    for fid, sd, title, *_ in FIGURES:
        head.append(f"| {sd} {title} | {done[fid]['verdict']} |")
    head += ["", "Not measured:", ""]
    head += _table(["seed", "figure", "why"], [list(x) for x in NOT_MEASURED])
    head.append("")
    with open(doc, "w") as f:
        f.write("\n".join(head + body))
    print(f"paper: {doc} and {len(done) - len(missing)} plots in {outdir}"
          + (f"; no data for {len(missing)} figures" if missing else ""))
    return done
