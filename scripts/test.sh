#!/usr/bin/env bash
# `make test`: every test of the workspace, in two streams side by side.
#
# Cargo runs test binaries one after another, and one of them
# (crates/cli/tests/bench_quick.rs: bench.py's smoke and the paper's
# smallest mode) is half of the suite's wall time on its own, mostly
# fixed-length fio runs and waits that leave a core idle. So the binaries
# are built once, the two benchmark runs start in the background, and
# every other test (the benchmark binary's own unit check included) runs
# beside them through `cargo test`. Nothing is skipped: the two streams
# together run exactly what `cargo test --workspace --all-targets` runs.
# The benchmark stream's output is printed after the rest, whole, and the
# exit status is non-zero if either stream failed.
#
# The benchmarks have no timing thresholds (their figures in a smoke run
# mean nothing), so sharing the machine changes their numbers, never
# their verdict.
set -uo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
export STRATA_REQUIRE_TOOLS=${STRATA_REQUIRE_TOOLS:-1}
export STRATA_MODEL_CASES=${STRATA_MODEL_CASES:-2000}
export STRATA_BENCH_QUICK=${STRATA_BENCH_QUICK:-1}

# The two tests that run bench.py (bench_quick.rs); the main stream skips
# them by exact name.
BENCH_TESTS=(bench_quick_cases_with_targets paper_smoke_writes_every_figure)

start=$(date +%s)
"$CARGO" test --workspace --all-targets --no-run || exit 101
echo "built in $(($(date +%s) - start)) s"

bench_pid=
bench_log=$(mktemp)
if [ "$STRATA_BENCH_QUICK" = 1 ]; then
    bin=$("$CARGO" test -p strata --test bench_quick --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "bench_quick" and m.get("executable"):
        print(m["executable"])')
    if [ -z "$bin" ]; then
        echo "test.sh: cannot find the bench_quick test binary" >&2
        exit 101
    fi
    # Cargo runs an integration test from its package's directory.
    (cd crates/cli && exec "$bin" --exact "${BENCH_TESTS[@]}") >"$bench_log" 2>&1 &
    bench_pid=$!
    echo "bench_quick: running in the background (pid $bench_pid), its output follows the rest"
fi

skip=()
for t in "${BENCH_TESTS[@]}"; do skip+=(--skip "$t"); done
"$CARGO" test --workspace --all-targets --no-fail-fast -- "${skip[@]}"
status=$?

bench_status=0
if [ -n "$bench_pid" ]; then
    wait "$bench_pid"
    bench_status=$?
    echo
    echo "     Running the benchmark stream (crates/cli/tests/bench_quick.rs)"
    cat "$bench_log"
fi
rm -f "$bench_log"
echo "make test: $(($(date +%s) - start)) s (build included)"
if [ "$status" -ne 0 ] || [ "$bench_status" -ne 0 ]; then
    exit 101
fi
