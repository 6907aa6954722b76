#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan+UBSan) in build-fuzz/ and runs each for
# FUZZ_SECONDS (default 30) from its seed corpus in tests/fuzz/corpus/NAME (kept in the repo; new
# inputs go to a scratch copy). A crash, a sanitizer report or a failed property is a FAIL, and the
# input is saved under OUT (default build/test-logs/fuzz). One line per target:
#   fuzz: NAME: ok (RUNS runs in SECS s, COV coverage points, CORPUS inputs)  |  fuzz: NAME: FAIL ...
#   run.sh [OUT]
#   run.sh --build-only      (builds the targets and stops: tests/run-all.sh builds them early)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build_only=0
if [ "${1:-}" = --build-only ]; then
  build_only=1
  shift
fi
out=${1:-$root/build/test-logs/fuzz}
secs=${FUZZ_SECONDS:-30}
build=$root/build-fuzz
mkdir -p "$out" "$build"

# -O1 with line tables (-g1), as libFuzzer's documentation suggests: reports keep file:line, and
# the build takes less time than at -O2 -g.
if ! CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DRDMALOCK_FUZZ=ON -DRDMALOCK_WERROR=ON -DRDMALOCK_BUILD_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" >"$build/configure.log" 2>&1; then
  cat "$build/configure.log"
  echo "fuzz: build: FAIL (configure)"
  exit 1
fi
if ! cmake --build "$build" -j "${JOBS:-$(nproc)}" --target fuzz_handshake fuzz_config fuzz_lockctl_args; then
  echo "fuzz: build: FAIL"
  exit 1
fi
[ "$build_only" -eq 1 ] && exit 0

# One target: runs it and writes its line to $build/result-NAME (and the log to OUT/NAME.log).
fuzz_one() {
  local name=$1 seeds=$root/tests/fuzz/corpus/$1 work=$build/corpus-$1 log=$out/$1.log
  local status runs cov n
  rm -rf "$work"
  mkdir -p "$work"
  # -max_total_time bounds the run; a crash stops it with a non-zero status and a crash-* file.
  "$build/tests/fuzz/fuzz_$name" -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="$out/$name-" -timeout=10 -rss_limit_mb=2048 -close_fd_mask=3 "$work" "$seeds" \
    >"$log" 2>&1
  status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  n=$(find "$work" -type f | wc -l)
  if [ "$status" -eq 0 ] && [ -n "$runs" ] && [ "$runs" -gt 0 ]; then
    echo "fuzz: $name: ok (${runs} runs in ${secs} s, ${cov:-?} coverage points, $n new inputs)"
  else
    echo "fuzz: $name: FAIL (exit $status); log $log; last lines:"
    tail -30 "$log" | sed 's/^/  /'
    ls "$out/$name-"* 2>/dev/null | sed 's/^/  saved input: /'
  fi
}

# Each fuzzer is one single-threaded process with a wall-time bound: they run JOBS (default: the
# number of CPUs) at a time, never more than there are CPUs, so that each has a CPU for its
# FUZZ_SECONDS; their lines are printed in this order.
jobs=${JOBS:-$(nproc)}
targets=(handshake config lockctl_args)
for name in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  fuzz_one "$name" >"$build/result-$name" 2>&1 &
done
wait

rc=0
for name in "${targets[@]}"; do
  cat "$build/result-$name"
  grep -q "^fuzz: $name: ok " "$build/result-$name" || rc=1
done
exit "$rc"
