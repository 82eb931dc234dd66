#!/usr/bin/env bash
# Soak: run the seeded crash simulation (crates/engine/tests/crash.rs)
# for a given time and print how many crash points it covered, then the
# threaded crash test (concurrent_crash.rs) for the same time in runs of 50,
# then the NBD deep-queue stress (nbd_stress.rs) at a twentieth of it per run.
#
#   bench/soak.sh [SECONDS] [FIRST_SEED]      (default 600 s, seed 1000000)
#
# A failure prints its seed; replay it with
#   STRATA_CRASH_SEED=<seed> STRATA_CRASH_RUNS=1 STRATA_CRASH_TRACE=1 \
#     cargo test --release -p strata-engine --test crash -- --nocapture
set -euo pipefail
secs=${1:-600}
seed=${2:-1000000}
cd "$(dirname "$0")/.."
echo "soak: seeded crash simulation for ${secs}s from seed ${seed}"
STRATA_CRASH_SECONDS=$secs STRATA_CRASH_SEED=$seed \
  cargo test --release -q -p strata-engine --test crash -- --nocapture 2>&1 \
  | grep -E "crash points covered|panicked|seed [0-9]+:" || { echo "soak: FAILED"; exit 1; }
echo "soak: threaded crash test (power cuts during concurrent checkpoints) for ${secs}s"
end=$(( $(date +%s) + secs ))
runs=0
while [ "$(date +%s)" -lt "$end" ]; do
  STRATA_CONCURRENT_CRASH_RUNS=50 cargo test --release -q -p strata-engine \
    --test concurrent_crash >/dev/null 2>&1 || { echo "soak: threaded crash test FAILED"; exit 1; }
  runs=$((runs + 50))
done
echo "soak: threaded crash test: ${runs} power cuts, all recovered"
# Deep NBD queues (issue 58): fio, nbdcopy and the byte-checking libnbd
# client at depths 1 to 1,024 in every cache/aio mode over Unix and TCP,
# plain and TLS; each client run gets a twentieth of the soak's seconds.
per=$(( secs / 20 > 1 ? secs / 20 : 1 ))
echo "soak: NBD deep-queue stress, ${per}s per client run (crates/cli/tests/nbd_stress.rs)"
STRATA_STRESS_SECONDS=$per STRATA_REQUIRE_TOOLS=1 cargo test --release -q -p strata \
  --test suite nbd_stress:: -- --nocapture 2>&1 | grep -E "read=|test result|panicked|FAIL" \
  || { echo "soak: NBD stress FAILED"; exit 1; }
