#!/usr/bin/env python3
"""`make test`'s runner: every test binary of the workspace, in lanes.

`cargo test` runs its test binaries one after another, each with as many
test threads as cores, so the suite's wall time is the sum of the
binaries' and a binary whose last test runs alone leaves a core idle. Here
the binaries are built once (`cargo test --no-run`) and run in LANES lanes
that take the next binary from one queue, longest first, plus one lane of
its own for the two benchmark runs of crates/cli/tests/bench_quick.rs
(bench.py's smoke and the paper's smallest mode: half the suite on their
own, mostly fixed-length runs and waits). Nothing is skipped: together the
lanes run exactly what `cargo test --workspace --all-targets` runs, each
binary from its package's directory as cargo runs it, and each binary's
output is printed whole when it ends, under cargo's own "Running" line, so
the log reads as cargo's does (and .ci/run's count of "test result:" lines
holds). The exit status is 101 if any binary failed, naming them.

The benchmarks have no timing thresholds (their figures in a smoke run
mean nothing), so sharing the machine changes their numbers, never their
verdict; no test has a timing threshold either (DESIGN.md).
"""

import json
import os
import queue
import subprocess
import sys
import threading
import time

LANES = int(os.environ.get("STRATA_TEST_LANES", "2"))
BENCH_TESTS = ["bench_quick_cases_with_targets", "paper_smoke_writes_every_figure"]
# Binaries by their last measured wall time (seconds, 2 cores), longest
# first, so the lanes end together; a binary not named here runs after
# these, in name order. Only the order depends on it.
LONGEST_FIRST = [
    "objstore", "guest", "groups", "three_hosts", "disk", "move", "nbd_stress",
    "clients", "crash", "contract", "limits", "hostile", "dashboard",
    "power_cut", "qemu_interop", "clone", "package", "backup", "defrag",
    "model", "stats", "sesparse_crash", "s3", "vmdk", "vmdk_shrink_online",
    "fuse", "cli", "tls", "alarms",
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
print_lock = threading.Lock()


def build(cargo):
    """Build every test target; [(label, executable, package dir)]."""
    cmd = [cargo, "test", "--workspace", "--all-targets", "--no-run",
           "--message-format=json-render-diagnostics"]
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(p.returncode)
    found = []
    for line in p.stdout.splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if (m.get("reason") == "compiler-artifact" and m.get("executable")
                and m.get("profile", {}).get("test")):
            t = m["target"]
            pkg = os.path.dirname(m["manifest_path"])
            src = os.path.relpath(t["src_path"], pkg)
            kind = t["kind"][0]
            label = f"unittests {src}" if kind in ("lib", "bin", "proc-macro") else src
            found.append((t["name"], label, m["executable"], pkg))
    return found


def order(binaries):
    rank = {n: i for i, n in enumerate(LONGEST_FIRST)}
    return sorted(binaries, key=lambda b: (rank.get(b[0], len(rank)), b[1], b[2]))


def run(label, exe, pkg, args):
    """Run one binary; print its output whole; True if it passed."""
    t = time.time()
    p = subprocess.run([exe] + args, cwd=pkg, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    rel = os.path.relpath(exe, ROOT)
    with print_lock:
        sys.stdout.write(f"     Running {label} ({rel}) [{time.time() - t:.0f} s]\n")
        sys.stdout.flush()
        sys.stdout.buffer.write(p.stdout)
        sys.stdout.buffer.flush()
    return p.returncode == 0


def main():
    cargo = os.environ.get("CARGO", "cargo")
    start = time.time()
    binaries = build(cargo)
    print(f"built {len(binaries)} test binaries in {time.time() - start:.0f} s; "
          f"running them in {LANES} lanes" +
          (" and the benchmarks in one more" if os.environ.get("STRATA_BENCH_QUICK") == "1"
           else ""), flush=True)
    failed = []
    work = queue.Queue()
    lanes = []
    for name, label, exe, pkg in order(binaries):
        if name == "bench_quick" and os.environ.get("STRATA_BENCH_QUICK") == "1":
            skip = [a for t in BENCH_TESTS for a in ("--skip", t)]
            work.put((label, exe, pkg, skip))
            bench = (label + " (the benchmarks)", exe, pkg, ["--exact"] + BENCH_TESTS)
            lanes.append(threading.Thread(target=lambda b=bench: run(*b) or failed.append(b[0])))
        else:
            work.put((label, exe, pkg, []))

    def lane():
        while True:
            try:
                b = work.get_nowait()
            except queue.Empty:
                return
            if not run(*b):
                failed.append(b[0])

    lanes += [threading.Thread(target=lane) for _ in range(LANES)]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    print(f"make test: {time.time() - start:.0f} s (build included)")
    if failed:
        print("failed: " + ", ".join(sorted(failed)))
        sys.exit(101)


if __name__ == "__main__":
    main()
