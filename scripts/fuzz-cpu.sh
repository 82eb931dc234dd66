#!/usr/bin/env bash
# Runs one cargo-fuzz target until it has used CPU_SECONDS of CPU time
# (user + system, all its threads), not of wall time: on a shared machine
# libFuzzer's -max_total_time counts time the fuzzer spent waiting for a
# core. The run may be paused (SIGSTOP) and resumed (SIGCONT) freely, e.g.
# while a benchmark needs quiet cores; paused time is not counted.
#
#   scripts/fuzz-cpu.sh TARGET CPU_SECONDS WORKDIR
#
# WORKDIR/TARGET is the working corpus: the committed seeds are copied in
# when it is created, and what the run finds stays there for the next
# run. WORKDIR/TARGET.log is libFuzzer's output; the last line printed
# (and appended to WORKDIR/cpu.tsv) is the run's account:
#   TARGET  cpu_seconds  wall_seconds  executions  result
# Run from the repository's root, after `cargo +nightly fuzz build`.
set -euo pipefail

if [ $# -ne 3 ]; then
	echo "usage: $0 TARGET CPU_SECONDS WORKDIR" >&2
	exit 2
fi
target=$1 budget=$2 work=$3
bin=fuzz/target/x86_64-unknown-linux-gnu/release/$target
if [ ! -x "$bin" ]; then
	echo "$0: $bin is not built: run 'cd fuzz && cargo +nightly fuzz build' first" >&2
	exit 2
fi
case $budget in '' | *[!0-9]*)
	echo "$0: CPU_SECONDS must be a whole number of seconds, not '$budget'" >&2
	exit 2
	;;
esac

mkdir -p "$work/$target" fuzz/artifacts/"$target"
if [ -z "$(ls -A "$work/$target")" ]; then
	cp -r fuzz/corpus/"$target"/. "$work/$target"/
fi
log=$work/$target.log
hz=$(getconf CLK_TCK)
start=$(date +%s)

# Wall-time limit far past the budget: the watcher below ends the run.
"$bin" "$work/$target" -artifact_prefix=fuzz/artifacts/"$target"/ \
	-max_total_time=$((budget * 20 + 600)) -rss_limit_mb=2048 -malloc_limit_mb=512 \
	-max_len=1048576 -print_final_stats=1 >"$log" 2>&1 &
pid=$!

cpu_of() { # utime + stime of a live process, in seconds
	awk -v hz="$hz" '{ sub(/^.*\) /, ""); print int(($12 + $13) / hz) }' "/proc/$1/stat" 2>/dev/null || echo -1
}
used=0
while kill -0 "$pid" 2>/dev/null; do
	used=$(cpu_of "$pid")
	if [ "$used" -ge "$budget" ]; then
		kill -INT "$pid" 2>/dev/null || true
		break
	fi
	sleep 5
done
set +e
wait "$pid"
rc=$?
set -e
end=$(date +%s)

execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
if ls fuzz/artifacts/"$target"/crash-* fuzz/artifacts/"$target"/timeout-* \
	fuzz/artifacts/"$target"/oom-* fuzz/artifacts/"$target"/leak-* >/dev/null 2>&1; then
	result="FINDINGS in fuzz/artifacts/$target (exit $rc)"
elif [ "$used" -ge "$budget" ] && grep -q 'stat::number_of_executed_units' "$log"; then
	result="no crash"
else
	result="ended early (exit $rc): see $log"
fi
line=$(printf '%s\t%s\t%s\t%s\t%s' "$target" "$used" "$((end - start))" "${execs:-?}" "$result")
echo "$line" | tee -a "$work/cpu.tsv"
case $result in "no crash") exit 0 ;; *) exit 1 ;; esac
