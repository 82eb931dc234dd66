"""strata benchmarks against qemu-nbd, driven by the same fio in the same run.

Every figure is a ratio against a peer measured minutes apart on the same
machine, never an absolute threshold. Usage:

    bench/bench.py [--quick] [--out bench/results.json] [--only CASE,...]

Cases (issue #2 targets in brackets):
  depth       4k randread, data spread over 32 snapshot levels vs none  [>= 0.95]
              and qcow2 with a 12-deep backing chain vs qcow2 alone (the peer's cost)
  randwrite   4k randwrite on an empty thin disk vs qemu-nbd raw sparse [>= 1.0]
  randread    4k randread on a full disk vs qemu-nbd raw                [>= 0.95]
  seqwrite    512k sequential write, empty thin vs qemu-nbd raw         [>= 0.9]
  snaptime    snapshot create / linked clone / snapshot delete time at two data sizes
  rss         server RSS after writing and reading a large disk         [<= 256 MiB at 64 GiB]
  bigread     64k and 1M sequential reads of a half-written disk vs qemu-nbd raw
  ckpt        4k randwrite latency percentiles while checkpoints run (small
              metadata cache), with the number of checkpoints, vs qemu-nbd raw
  zeroing     seed 001's zeroing phase: 4k first-write IOPS and nb/tbz over time for
              thin / zeroedthick / eagerzeroedthick vs raw sparse / falloc / full under
              qemu-nbd; eagerzeroedthick create time vs the device's direct write rate
  zerodetect  4k randwrite of random data, zero detection on vs off      [>= 0.97]
  spacework   64k randwrite while convert fills (-> eagerzeroedthick) or scans
              (-> thin, punchzero) another disk, vs nothing running     [>= 0.8]
  reclaim     64k randwrite to an empty thin disk while a removed 2 GiB disk
              is reclaimed vs the same with nothing reclaiming            [>= 0.8]
              (same server, same run), and how long the reclaim took
  stats       4k randread with per-disk statistics recording vs paused  [>= 0.98]
              (one fio run, recording flipped every 2 s; plus the in-process
              cost of recording one command and its share of server CPU per I/O)

  multihost   issue 12: a disk on an object-store datastore (SeaweedFS on loopback)
              vs the same disk local: warm 4k randread [>= 0.9], 4k randwrite with a
              FLUSH every 64 writes (FLUSH latency percentiles), 512k seqwrite, and a
              cold start (cache deleted): time to first byte and to 90% of warm IOPS;
              a restart keeping the cache [<= 0.5 s to 90%]; a hot quarter read with
              the cache bound at half the disk vs local [>= 0.9]
  compaction  issue 27: 4k random overwrites of twice the disk (FLUSH every 64) on an
              object-store disk the server compacts and collects by itself: stored /
              live during [<= 1.5] and after, idle [<= 1.2], write amplification [<= 2]

  space       issue 64: ten copies of a 2 GiB image after strata dedup: pool vs one copy
              [<= 1.1], the pass's memory [<= 64 MiB], client reads during it [>= 0.9];
              import --base [<= 1% written]; 20 clones' same writes [<= 1.1x]; strata
              compress of a debootstrapped Debian and a text image vs qemu-img's zstd
              qcow2 [>= 0.9], 4k reads of a packed disk from the device and from the page
              cache [>= 0.85], writes [>= 0.95/0.90];
              an object store's compress-at-seal: the image's 512k writes vs the raw PUT
              ceiling [>= 1.0], bytes kept and cached reads vs --store-compress off
  move        issue 13: strata move of a served, full disk (2 GiB; quick 256 MiB) to
              another local datastore, idle and under 4k random writes: time loaded vs
              idle, the switch's pause and the longest write latency during the move vs
              without, client IOPS during the move vs without [>= 0.7]

  claims      issue 25: create-only writes of one key by 2, 8 and 32 racers at once
              (hosts racing to claim a disk), SeaweedFS on loopback: p50/p99/max ms

  backup      issue 26: a 1 TiB thin disk (quick 64 GiB), 1% rewritten in 1 MiB pieces
              since s1: time of 'strata diff vm@s2 --from s1' [<= 1 s] and of
              nbdinfo's qemu:dirty-bitmap:s1 map of the whole snapshot; libnbd reading
              the dirty extents vs as many bytes sequentially [>= 0.9]

  tls         issue 28: NBD over TLS on loopback TCP, 4k randread, 1M read, 512k
              write: strata vs qemu-nbd with the same x509 credentials [>= 1.0], and
              strata without TLS (what TLS costs)

  hostile     issue 28: 4k randread on one good NBD connection alone and while
              waves of 1,000 hostile connections (stalled, garbage, a 4 GiB option,
              an unsent 32 MiB WRITE) come and go, strata and qemu-nbd: under the
              storm vs alone [>= 0.9]

  firstwrite  issue 59: the first-write penalty in one run, each disk's first pass vs a
              rewrite of it (fio, all disks at once, flushed; MiB/s and server CPU per
              GiB; rounds alternate, median / min / max): 3 disks 512k sequential beyond
              the page cache and within it (teragen), 16 disks 64k random (randfill),
              1, 4 and 16 disks (scaling), each type vs qemu-nbd sparse / falloc / full
              raw and fio on a file (kinds), a filled disk beside a growing one
              (neighbour); writeback and --cache none. [thin first vs qemu-nbd sparse
              >= 1.0, first / rewrite >= 0.85 (zeroedthick 0.9, 16 disks 0.8), 16 disks
              vs 1 >= 0.9, beside first writes vs beside rewrites >= 0.8, CPU first /
              rewrite <= 1.3]

Paper suites (figures, no targets; each cell also measured on the peer):
  matrix      SEsparse Iometer matrix: 4k/64k/512k x seq/rand x read/write on
              thin, zeroedthick, eagerzeroedthick and delta disks, empty and
              full, vs qemu-nbd raw (and qcow2 in full mode)
  chain       4k randread/randwrite vs snapshot depth 0..N (quick 4, full 32),
              then after deleting snapshots oldest first; vs a qcow2 backing chain
  clone       strata clone --full time vs the source's snapshot count, vs
              qemu-img convert -O qcow2 of a chain of the same depth
  fragmentation  issue 10 / seed 004: fragments of a sequentially written disk and
              of one overwritten at random after snapshots; cold sequential and
              copy-like reads with latency/seek histograms before and after defrag
              vs the sequential disk [>= 0.9]; client writes during defrag and
              free-space consolidation [>= 0.8]; an install-like I/O trace
              replayed on the fragmented disk and after consolidation + defrag;
              placement vs arrival order: fragments after random first writes,
              overwrites, a diverging clone, k disks growing together
              (fragmentation.svg)
  vdi         seed 000 figure 10: seSparse linked clones of a golden image made by a
              TCG guest, each desktop (a guest) installs and uninstalls files and
              trims; then online vmdk shrink of all clones: space per clone
              before/after; 4k randwrite clients closed-loop (capacity), then
              paced: IOPS, latency and server CPU before, during and after the
              shrink; every clone fsck-clean with its files after

make paper (--paper): every seed figure measured in the paper's shape and set
beside the paper's numbers in docs/SEEDS.md (plots in docs/seeds/), from
bench/paper.json. It runs these cases (--only picks some of them, merged
into an existing --out file of the same mode):
  paper_matrix  seed 000 figures 1-4: the Iometer matrix at 4k-512k, empty and full,
              iodepth 16 and 32, strata thin / linked clone / SEsparse / VMFSsparse vs
              qemu-nbd raw and VMFSsparse
  tera        seed 000 figure 6: TeraGen / TeraSort / TeraValidate I/O phases as fio
              jobs on several disks at once, elapsed time per phase
  thinprov    seed 001: over-commit, zeroing vs post-zeroing (nb/tbz), scaling over
              disks, a thick disk beside a growing thin one, file copies, throughput
              vs fragments
  snapchain   seed 002: six workloads (4k randrw and readwrite, 16k mixed, 512k read
              and write, an OLTP analog) vs snapshot depth on native, VMDK and qcow2
              chains; 16k mixed after each delete
  timeline    seed 003: 32k writes at 2,000 IOPS, latency per second until the disk is
              allocated, thin / zeroedthick / eagerzeroedthick vs raw images, and across
              a snapshot create and delete
  and vdi, fragmentation and clone above (seeds 000, 004, 002).

Besides --out (JSON), every run writes results.md and SVG plots (chain.svg,
clone.svg, matrix.svg) next to it; --render JSON redraws them from a file.
"""

# The docstring above is --help's description. This module holds the
# command line: the options, the run over the chosen cases, results.json
# (merged into an existing file by --only) and the reports.
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

from . import common
from .cases import CASES, PAPER_ONLY
from .common import ROOT, STRATA
from .paper import PAPER_CASES, commit, render_paper
from .report import render


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, short runs (a few minutes)")
    ap.add_argument("--smoke", action="store_true",
                    help="--quick at each case's smallest size and shortest run: checks that every "
                         "figure is still produced (make test), measures nothing worth keeping")
    ap.add_argument("--only", help="comma-separated cases (an existing --out file of the same kind keeps its other cases): " + ",".join(CASES))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results.json"))
    ap.add_argument("--workdir", help="where to put datastores and images (default: a temp dir)")
    ap.add_argument("--render", metavar="JSON",
                    help="only rewrite results.md and the SVGs next to JSON from its contents")
    ap.add_argument("--paper", action="store_true",
                    help="make paper: the seeds' experiments into --out (default bench/paper.json) and "
                         "docs/SEEDS.md (--doc); with --render, only rewrite the page from JSON")
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "SEEDS.md"),
                    help="--paper: the page to write (its plots go to seeds/ next to it)")
    ap.add_argument("--chain-max", type=int, help="chain: stop at this depth (default quick 4, full 32)")
    a = ap.parse_args()
    common.CHAIN_MAX = a.chain_max
    common.SMOKE = a.smoke
    a.quick = a.quick or a.smoke
    common.QUICK = a.quick
    if a.render:
        with open(a.render) as f:
            if a.paper:
                render_paper(json.load(f), a.doc, partial=True)
            else:
                render(json.load(f), a.render)
        return
    if a.paper and a.out == ap.get_default("out"):
        a.out = os.path.join(ROOT, "bench", "paper.json")
    for tool in ("fio", "qemu-nbd", "qemu-img"):
        if not shutil.which(tool):
            sys.exit(f"bench: {tool} is missing (run scripts/install-deps.sh)")
    if not os.path.exists(STRATA):
        sys.exit(f"bench: {STRATA} not built (make build)")
    if a.only:
        cases = a.only.split(",")
        unknown = [c for c in cases if c not in CASES]
        if unknown:
            sys.exit(f"bench: no case {', '.join(unknown)} (--help lists them)")
    else:
        # The paper's own cases run only under --paper (or when named).
        cases = PAPER_CASES if a.paper else [c for c in CASES if c not in PAPER_ONLY]
    # Fail now, not after an hour of measuring, if the results cannot be written.
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    work = a.workdir or tempfile.mkdtemp(prefix="strata-bench-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    results = {"machine": {"cpus": os.cpu_count(), "uname": " ".join(os.uname())},
               "quick": a.quick, "smoke": a.smoke, "case_s": {}, "cases": {}}
    if a.paper:
        results.update(commit=commit(), date=time.strftime("%Y-%m-%d"))
        results["case_runs"] = {c: {"commit": results["commit"], "date": results["date"],
                                    "machine": results["machine"]} for c in cases}
    # A case that fails is reported and the run goes on: an hour of other
    # cases' figures is not thrown away for one, and the run still fails.
    failed = {}
    try:
        for c in cases:
            print(f"== {c}", flush=True)
            case_dir = os.path.join(work, c)
            os.makedirs(case_dir, exist_ok=True)
            t_case = time.time()
            try:
                results["cases"][c] = CASES[c](case_dir, a.quick)
                results["case_s"][c] = round(time.time() - t_case, 1)
            except Exception:  # noqa: BLE001 (any failure of a case is reported the same way)
                failed[c] = traceback.format_exc()
                print(f"== {c} FAILED after {time.time() - t_case:.0f} s:\n{failed[c]}",
                      file=sys.stderr, flush=True)
                continue
            finally:
                # Each case's images go before the next: the full run needs
                # 64 GiB for the RSS case alone.
                shutil.rmtree(case_dir, ignore_errors=True)
            print(json.dumps(results["cases"][c], indent=2), flush=True)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    if failed:
        if not results["cases"]:
            sys.exit(f"bench: every case failed: {', '.join(failed)}")
    if a.only and os.path.exists(a.out):
        # A run of some cases updates those cases in the file and keeps the
        # others (from a run of the same kind: quick or full).
        with open(a.out) as f:
            before = json.load(f)
        if before.get("quick") == a.quick and before.get("smoke", False) == a.smoke:
            if a.paper:
                # Each kept case keeps the commit, date and machine of the
                # run that measured it.
                runs = before.setdefault("case_runs", {})
                for c in before["cases"]:
                    runs.setdefault(c, {k: before.get(k) for k in ("commit", "date", "machine")})
                    runs[c].setdefault("machine", before.get("machine"))
                runs.update(results["case_runs"])
                results.pop("case_runs")
            before["cases"].update(results["cases"])
            before.setdefault("case_s", {}).update(results["case_s"])
            before["machine"] = results["machine"]
            for k in ("commit", "date"):
                if k in results:
                    before[k] = results[k]
            results = before
    # The report of the others is written; the failed cases are named in
    # the JSON (their last line of traceback) and the exit status is 1.
    results.pop("failed", None)
    if failed:
        results["failed"] = {c: t.strip().splitlines()[-1] for c, t in failed.items()}
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"results in {a.out}")
    if a.paper:
        # A run of some cases writes what it can; a whole run must have
        # every figure's data (make test checks that).
        render_paper(results, a.doc, partial=bool(a.only or failed))
    else:
        render(results, a.out)
    if failed:
        sys.exit(f"bench: {len(failed)} case(s) failed: {', '.join(failed)}")
