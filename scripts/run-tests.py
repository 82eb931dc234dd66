#!/usr/bin/env python3
"""`make test`'s runner: every test binary of the workspace, in lanes.

`cargo test` runs its test binaries one after another, each with as many
test threads as cores, so the suite's wall time is the sum of the
binaries' and a binary whose last test runs alone leaves a core idle (most
tests wait on servers, guests and fio). Here the binaries are built once
(`cargo test --no-run`) and run in LANES lanes (default 5) that take the
next item from one queue, longest first: the benchmark runs of
crates/cli/tests/bench_quick.rs (bench.py's smoke, its two halves in one
process, and the paper's smallest mode: a third of the suite on their
own, mostly fixed-length runs and waits), then every binary, a suite's
modules (crates/cli/tests, one binary) each as an item of its own.
Nothing is skipped: together the lanes run
exactly what `cargo test --workspace --all-targets` runs, each binary from
its package's directory as cargo runs it, and each binary's output is
printed whole when it ends, under cargo's own "Running" line, so the log
reads as cargo's does (and .ci/run's count of "test result:" lines
holds). The exit status is 101 if any binary failed, naming them after
repeating what their failures printed (a log cut to its tail keeps them).

The benchmarks have no timing thresholds (their figures in a smoke run
mean nothing), so sharing the machine changes their numbers, never their
verdict; no test has a timing threshold either, and one that depends on
how long something takes under load is a defect (DESIGN.md).
"""

import json
import os
import queue
import subprocess
import sys
import threading
import time

# Five on this 2-core machine: with three, the cores stood idle a quarter
# of the test phase while tests waited on servers, guests and fio (a fresh
# clone's test phase, after the build: 739 s with five, 827 with four,
# 914-946 with three).
LANES = int(os.environ.get("STRATA_TEST_LANES", "5"))
# The benchmark runs, as queue items, longest first: the smoke's two halves
# in one process (they take turns there; three benchmark runs side by side
# on two cores starve each other: the suite took longer, not shorter), then
# the paper's smoke.
BENCH_ITEMS = [
    ["bench_quick::bench_quick_store_cases", "bench_quick::bench_quick_serving_cases"],
    ["bench_quick::paper_smoke_writes_every_figure"],
]
BENCH_TESTS = [t for item in BENCH_ITEMS for t in item]
# Test binaries made of one module per source file (crates/cli/tests/
# suite.rs: one link of the dependencies instead of one per file): each
# module is an item of its own, named and labelled after its file.
SUITES = {"suite"}
# Binaries (and suites' modules) by their last measured wall time (seconds,
# 2 cores), longest first, so the lanes end together; one not named here
# runs after these, in name order. Only the order depends on it.
LONGEST_FIRST = [
    "guest", "groups", "objstore", "crash", "three_hosts", "disk", "move",
    "model", "encryption", "nbd_stress", "package", "qemu_interop",
    "dashboard", "alarms", "power_cut", "backup", "sesparse_crash", "limits",
    "clients", "defrag", "rekey", "compress", "clone", "hostile", "tls",
    "provisioning", "vmdk", "sesparse_fixtures", "stats", "contract", "cli",
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
print_lock = threading.Lock()
# How much of a failed binary's output is repeated at the end.
FAILURE_TAIL = 6000


def artifacts(cmd):
    """Run a cargo build with JSON messages (exit if it fails); each
    compiled artifact that has an executable, as cargo describes it."""
    p = subprocess.run(cmd + ["--message-format=json-render-diagnostics"], cwd=ROOT,
                       stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(p.returncode)
    for line in p.stdout.splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("reason") == "compiler-artifact" and m.get("executable"):
            yield m


def build(cargo):
    """Build every test target; [(label, executable, package dir)]. The
    examples are then built as programs too (`examples`) and their paths
    go to the benchmark smoke as STRATA_BENCH_EXAMPLES (NAME=PATH:...), so
    it runs these builds of store_ceiling, vhost_bench and friends instead
    of compiling them again in release mode (bench/strata_bench/common.py
    `example`)."""
    found = []
    for m in artifacts([cargo, "test", "--workspace", "--all-targets", "--no-run"]):
        if m.get("profile", {}).get("test"):
            t = m["target"]
            pkg = os.path.dirname(m["manifest_path"])
            src = os.path.relpath(t["src_path"], pkg)
            kind = t["kind"][0]
            label = f"unittests {src}" if kind in ("lib", "bin", "proc-macro") else src
            found.append((t["name"], label, m["executable"], pkg))
    os.environ["STRATA_BENCH_EXAMPLES"] = os.pathsep.join(examples(cargo))
    return found


def examples(cargo):
    """Build the examples as programs (`--all-targets` built them as test
    harnesses) with the same profile, on the dependencies just built;
    ["NAME=PATH"]."""
    cmd = [cargo, "build", "--workspace", "--examples", "--profile", "test"]
    return [f"{m['target']['name']}={m['executable']}" for m in artifacts(cmd)
            if m["target"]["kind"] == ["example"]]


def modules(exe, pkg):
    """A suite's tests by their top module: {module: [full names]}."""
    p = subprocess.run([exe, "--list", "--format", "terse"], cwd=pkg,
                       stdout=subprocess.PIPE, text=True, check=True)
    found = {}
    for line in p.stdout.splitlines():
        if line.endswith(": test"):
            name = line[:-len(": test")]
            found.setdefault(name.split("::")[0].removeprefix("r#"), []).append(name)
    return found


def items(binaries, bench):
    """The queue: [(name, label, executable, package dir, arguments)], the
    benchmark runs first (when `bench`), then the longest first. A suite
    becomes an item per module, run with `--exact` and its tests' names
    (a filter matches substrings: `backup` would run `backup_scripts` too)."""
    rank = {n: i for i, n in enumerate(LONGEST_FIRST)}
    first, rest = [], []
    for name, label, exe, pkg in binaries:
        if name not in SUITES:
            rest.append((name, label, exe, pkg, []))
            continue
        here = os.path.dirname(label)
        for mod, names in modules(exe, pkg).items():
            lab = f"{here}/{mod}.rs"
            if bench and mod == "bench_quick":
                # Its benchmark runs, each an item of its own, and the
                # rest of the module (the rules' unit test) with the others.
                first += [(mod, f"{lab} ({', '.join(i)})", exe, pkg, ["--exact"] + i)
                          for i in BENCH_ITEMS]
                names = [n for n in names if n not in BENCH_TESTS]
            if names:  # (`--exact` and no names would run the whole suite)
                rest.append((mod, lab, exe, pkg, ["--exact"] + names))
    rest.sort(key=lambda b: (rank.get(b[0], len(rank)), b[1], b[2]))
    return first + rest


def run(label, exe, pkg, args):
    """Run one binary; print its output whole, with its wall time and the
    CPU time it and the processes it waited for used (servers, qemu, fio);
    (CPU seconds, None if it passed, else what its failures printed: the
    harness's "failures:" part)."""
    t = time.time()
    p = subprocess.Popen([exe] + args, cwd=pkg, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
    stdout = p.stdout.read()
    p.stdout.close()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    rel = os.path.relpath(exe, ROOT)
    with print_lock:
        sys.stdout.write(f"     Running {label} ({rel}) [{time.time() - t:.0f} s, "
                         f"{cpu:.0f} CPU-s]\n")
        sys.stdout.flush()
        sys.stdout.buffer.write(stdout)
        sys.stdout.buffer.flush()
    if p.returncode == 0:
        return cpu, None
    out = stdout.decode(errors="replace")
    at = out.rfind("\nfailures:\n", 0, out.rfind("\nfailures:\n"))
    why = out[at:] if at >= 0 else out[-FAILURE_TAIL:]
    # Without the summary line: .ci/run counts those, one per binary.
    return cpu, why.split("\ntest result:")[0]


def main():
    cargo = os.environ.get("CARGO", "cargo")
    if os.environ.get("CI") == "true":
        # A fresh clone builds everything once: incremental compilation's
        # caches of the workspace crates would only be written, never read.
        os.environ.setdefault("CARGO_INCREMENTAL", "0")
    start = time.time()
    binaries = build(cargo)
    print(f"built {len(binaries)} test binaries in {time.time() - start:.0f} s; "
          f"running them in {LANES} lanes", flush=True)
    failed, used = [], []
    work = queue.Queue()
    for _, label, exe, pkg, args in items(binaries, os.environ.get("STRATA_BENCH_QUICK") == "1"):
        work.put((label, exe, pkg, args))

    def lane():
        while True:
            try:
                b = work.get_nowait()
            except queue.Empty:
                return
            cpu, why = run(*b)
            used.append((cpu, b[0]))
            if why is not None:
                failed.append((b[0], why))

    lanes = [threading.Thread(target=lane) for _ in range(LANES)]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    print(f"make test: {time.time() - start:.0f} s (build included)")
    most = ", ".join(f"{label} {cpu:.0f}" for cpu, label in sorted(used, reverse=True)[:8])
    print(f"test CPU: {sum(c for c, _ in used):.0f} s; most: {most}")
    if failed:
        # Again at the end, where a log cut to its tail still shows them.
        for name, why in sorted(failed):
            print(f"---- {name} failed:\n{why[-FAILURE_TAIL:].strip()}")
        print("failed: " + ", ".join(sorted(n for n, _ in failed)))
        sys.exit(101)


if __name__ == "__main__":
    main()
