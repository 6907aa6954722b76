#!/usr/bin/env bash
# Sets up and runs every rdmalock test:
#   1. host unit tests (proto, config, the protocol engine over the in-process backend), in a plain
#      build (GCC), under AddressSanitizer+UndefinedBehaviorSanitizer (a clang tree, which also runs
#      clang's thread-safety analysis on every file it compiles), and under ThreadSanitizer (GCC);
#   2. the RDMA integration tests on real rdma_rxe, through deploy/softroce/rxe-run (natively if
#      this kernel has RDMA, else in the Soft-RoCE VM), started from a working directory under
#      /var/tmp with a space in its name, which the guest must see;
#   3. the C API and Python module against lockd on rdma_rxe (tests/sdk/run.sh);
#   4. lockd's operator paths (tests/operator/run.sh), lockd and lockctl built under ASan+UBSan,
#      on rdma_rxe: forced releases, admin socket peers, the metrics endpoint, running out of
#      descriptors, reload;
#   5. the two-host fault tests (tests/twohost/run.sh): lockd in one VM, clients in another;
#   6. the failover tests (tests/failover/run.sh): three lockds in two shards with etcd, across two
#      VMs: a partitioned primary and a killed one;
#   7. the Debian packages (tests/pkg/run.sh): built, installed with apt into a clean Debian 12
#      tree, and the packaged lockd run on rdma_rxe;
#   8. clang's thread-safety analysis over the files the clang tree did not compile
#      (tests/thread-safety/check.sh --compiled-in), and the protocol model (tests/model/check.sh,
#      spin), both in the background beside stages 2 and 3; the plain tree itself is built at -O3,
#      Release's optimisation level, with -Werror, so -O3-only warnings are caught before a user
#      meets them;
#   9. the libFuzzer targets (tests/fuzz/run.sh): the handshake, config and lockctl-argument
#      parsers, FUZZ_SECONDS (default here 15) each.
# An RDMA test that cannot run fails; nothing is skipped. Exits non-zero if anything failed.
# Each stage's wall and CPU seconds are printed when it ends and again in the summary.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=${JOBS:-$(nproc)}

passed=0
failed=0
results=()

# Where the time goes: each stage's wall seconds and CPU seconds (user+system of the processes it
# ran, from the kernel's count of this shell's finished children in /proc/$$/stat; unlike wall time
# it does not grow when other work loads the machine). The summary prints one line per stage.
timings=()
stage_name=""
clk_tck=$(getconf CLK_TCK)
cpu_ticks() {  # prints this shell's finished children's user+system time, in clock ticks
  local stat f
  read -r stat </proc/$$/stat
  stat=${stat##*) }  # drop "pid (comm) ": the fields from "state" on, state being field 3
  read -r -a f <<<"$stat"
  echo $((f[13] + f[14]))  # fields 16 and 17: cutime, cstime
}
usecs() { local t=${EPOCHREALTIME/[.,]/}; echo $((10#$t)); }  # wall clock, microseconds
# Ends the running stage (if any) and starts the next one: stage NAME. "stage" alone ends the last.
stage() {
  local now ticks wall cpu
  now=$(usecs)
  ticks=$(cpu_ticks)
  if [ -n "$stage_name" ]; then
    wall=$(((now - stage_us0 + 500000) / 1000000))
    cpu=$((((ticks - stage_ticks0) * 10 / clk_tck + 5) / 10))
    timings+=("$(printf '%-34s %6d s wall %6d s CPU' "$stage_name" "$wall" "$cpu")")
    echo "--- time: ${timings[-1]}"
  fi
  stage_name=${1:-}
  stage_us0=$now
  stage_ticks0=$ticks
}
run_us0=$(usecs)

stage "install dependencies"
"$root/deploy/install-deps.sh" || { echo "run-all: installing dependencies failed"; exit 1; }

# What failed, for the end of the output: a CI log may keep only its last lines, and the summary's
# counts alone do not say which test to look at. For a Catch2 log, each failing test case's name
# and section with its first failed assertion; for a stage of check lines, its failed lines.
failures=()
note_failures() {  # name log catch|bad_re
  local name=$1 log=$2 what=$3 text
  if [ "$what" = catch ]; then
    # Catch2 v2's console reporter frames a test case's name (and sections) between two rules of
    # dashes, then prints "file:line: FAILED:" and the expression; "due to unexpected exception"
    # and fatal signals are reported the same way.
    text=$(awk '
      /^-+$/ && length($0) > 70 { if (inhead) { inhead = 0 } else { inhead = 1; head = "" } next }
      inhead { sub(/^ +/, ""); head = head (head == "" ? "" : " / ") $0; next }
      /: FAILED:$/ && !(head in shown) { shown[head] = 1; print "  " head; print "    " $0; n = 3; next }
      n > 0 { print "    " $0; n-- }' "$log" | head -60)
  else
    text=$(grep -E "$what" "$log" | sed 's/^/  /' | head -20)
  fi
  [ -n "$text" ] || text="  (no failed check named in $log: it exited non-zero or ran nothing)"
  failures+=("$name:" "$text")
}

# Adds a Catch2 run's test-case counts to the totals.
count() {  # name log rc
  local name=$1 log=$2 rc=$3 p f
  if grep -q '^All tests passed' "$log"; then
    p=$(sed -n 's/^All tests passed (.* in \([0-9]*\) test case.*/\1/p' "$log" | tail -1)
    f=0
  else
    p=$(sed -n 's/^test cases: *[0-9]* | *\([0-9]*\) passed.*/\1/p' "$log" | tail -1)
    f=$(sed -n 's/^test cases:.*| *\([0-9]*\) failed.*/\1/p' "$log" | tail -1)
  fi
  p=${p:-0}
  f=${f:-0}
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi  # crashed or never reported: a failure
  # Catch2 exits 0 when no test case ran ("No tests ran"), and a summary lost from a VM's
  # console reads as nothing: a clean exit with nothing passed is a failure too.
  if [ "$rc" -eq 0 ] && [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  [ "$f" -gt 0 ] && note_failures "$name" "$log" catch
  passed=$((passed + p))
  failed=$((failed + f))
  results+=("$(printf '%-34s %4d passed %4d failed (exit %d)' "$name" "$p" "$f" "$rc")")
}

# Adds a stage that prints one line per check to the totals: lines matching OK_RE pass, lines
# matching BAD_RE fail. A non-zero exit with no failed line, or a clean exit with nothing passed
# (nothing ran), counts as one failure.
tally() {  # name log rc ok_re bad_re
  local name=$1 log=$2 rc=$3 ok bad
  ok=$(grep -cE "$4" "$log" 2>/dev/null)
  bad=$(grep -cE "$5" "$log" 2>/dev/null)
  ok=${ok:-0}  # no log at all: nothing passed, and the exit status decides
  bad=${bad:-0}
  [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
  [ "$rc" -eq 0 ] && [ "$ok" -eq 0 ] && bad=1
  [ "$bad" -gt 0 ] && note_failures "$name" "$log" "$5"
  passed=$((passed + ok))
  failed=$((failed + bad))
  results+=("$(printf '%-34s %4d passed %4d failed (exit %d)' "$name" "$ok" "$bad" "$rc")")
}

build() {  # dir sanitize compiler(gcc|clang) targets...
  local dir=$1 san=$2 opt=()
  local cc=$3 cxx=g++
  [ "$cc" = clang ] && cxx=clang++
  shift 3
  mkdir -p "$root/$dir"
  # The sanitizer trees compile at -O1 with line tables only (-g1), as the sanitizers' own
  # documentation suggests: that keeps file:line in every report and takes half the compile time
  # of -O2 -g (measured: client_keeper_test.cc 26 s -> 12 s under ASan+UBSan). The plain tree
  # compiles at -O3, a Release build's level, with line tables only: its -Werror compile is also
  # the check that the code builds clean where GCC 12 has -O3-only false positives (a Release
  # tree of its own cost about 290 s of CPU more), and the tests run the code as a Release build
  # optimises it. (A user's RelWithDebInfo build is CMake's -O2 -g, Release -O3.)
  local level=-O3
  [ -n "$san" ] && level=-O1
  opt=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$level -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$level -g1 -DNDEBUG")
  # The sanitizer trees compile the libraries as unity builds (RDMALOCK_UNITY_LIBS): measured
  # 2026-12-07 with -j2 on this machine, the ASan+UBSan tree's build 425 -> 307 CPU s, the TSan
  # tree's 270 -> 200. The plain tree compiles each file on its own, as a user's build does.
  # (Given either way: the option is cached, and a reused tree keeps what it was last given.)
  if [ -n "$san" ]; then opt+=(-DRDMALOCK_UNITY_LIBS=ON); else opt+=(-DRDMALOCK_UNITY_LIBS=OFF); fi
  # Prefix /usr, as Debian's packages are laid out (the package stage builds them from build/).
  # compile_commands.json: tests/thread-safety/check.sh reads which files a clang tree compiled.
  cmake -S "$root" -B "$root/$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRDMALOCK_SANITIZE="$san" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
    -DRDMALOCK_WERROR=ON "${opt[@]}" \
    -DCMAKE_INSTALL_PREFIX=/usr \
    >"$root/$dir/configure.log" 2>&1 || { cat "$root/$dir/configure.log"; return 1; }
  cmake --build "$root/$dir" -j "$jobs" --target "$@"
}

logs="$root/build/test-logs"
mkdir -p "$logs"

# What only the VM and package stages need, and the build does not: the Soft-RoCE VM's kernel and
# initramfs (rxe-run --prepare, about a minute on a fresh machine) and the package stage's clean
# Debian 12 tree (tests/pkg/chroot-cache.sh, about 3.5 minutes, mostly downloading). Both are made
# in the background while the first build compiles, not in the VM stages after the host stages;
# both caches are flock'ed, so the stages that use them wait for them and build nothing twice.
# Where they are cached already this takes seconds. If it fails, the stages that need the caches
# make them again and fail there if they cannot.
(
  "$root/deploy/softroce/rxe-run" --prepare &&
  "$root/tests/pkg/chroot-cache.sh"
) >"$logs/prefetch.log" 2>&1 &
prefetch_pid=$!

stage "build (RelWithDebInfo)"
echo "=== build (RelWithDebInfo)"
if ! build build "" gcc all; then echo "run-all: build failed"; exit 1; fi

# The command-line tests, the host unit tests and the sanitizer runs use about one of the two cores:
# each runs beside the next tree's build, started at nice 19 (bg_start), so that the build takes
# only what the tests leave idle (a nice-0 thread that wakes preempts it at once, so the tests'
# 30-40 ms leases keep their timing). bg_wait lets the build finish at full speed and prints its
# output. A stage's CPU figure counts a background job in the stage during which bash reaps it
# (when it ends, or at the wait that waits for it), not necessarily the stage it served. Only the
# model and the thread-safety analysis run beside VM stages, and only beside the first two (see
# side_start below; with the thread-safety analysis beside it at nice 19, the operator stage once
# failed a cluster check and took 468 s instead of 79, tried 2026-12-06: a race in lockd the
# slowness exposed, since fixed: a reload during a new term's loopback probe made lockd exit, and
# lockctl then retried its dead port for 5 s sixty times).
bg_pid=""
bg_log=""
bg_start() {  # LOG COMMAND...: runs COMMAND in the background at nice 19, output to LOG
  bg_log=$1
  shift
  (renice -n 19 -p "$BASHPID" >/dev/null && "$@") >"$bg_log" 2>&1 &
  bg_pid=$!
}
bg_wait() {  # returns the background build's exit status, after printing its output
  local rc=0
  wait "$bg_pid" || rc=$?
  cat "$bg_log"
  return "$rc"
}

stage "command-line tests (+ ASan build, nice 19)"
# The ASan+UBSan tree's build starts here, beside the command-line tests (one core: ctest runs
# one test at a time), and goes on beside the host unit tests.
# lockd and lockctl too: the operator suite (stage 4) runs them under ASan on rdma_rxe. A clang
# tree: clang's UBSan checks more (-fsanitize=enum found a C API argument check that was itself
# undefined behaviour), the project's code meets a second compiler's warnings, and every file it
# compiles gets the thread-safety analysis with -Werror, which the analysis stage then need not
# repeat. The plain and TSan trees are GCC's.
bg_start "$logs/build-asan.log" build build-asan "address;undefined" clang unit_tests lockd lockctl
echo "=== command-line tests (ctest)"
ctest --test-dir "$root/build" --output-on-failure -E '^unit:' 2>&1 | tee "$logs/ctest.log"
rc=${PIPESTATUS[0]}
cli_total=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2/p' "$logs/ctest.log")
cli_failed=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of.*/\1/p' "$logs/ctest.log")
cli_failed=${cli_failed:-1}
[ "$rc" -ne 0 ] && [ "$cli_failed" -eq 0 ] && cli_failed=1
passed=$((passed + ${cli_total:-0} - cli_failed))
failed=$((failed + cli_failed))
results+=("$(printf '%-34s %4d passed %4d failed (exit %d)' "command-line tests" "$((${cli_total:-0} - cli_failed))" "$cli_failed" "$rc")")

stage "VM and Debian-tree caches (wait)"
wait "$prefetch_pid" ||
  echo "run-all: making the VM and Debian-tree caches failed (log: $logs/prefetch.log); their stages retry"

stage "host unit tests (+ ASan build)"
echo "=== host unit tests"
"$root/build/tests/unit_tests" --use-colour no 2>&1 | tee "$logs/unit.log" | tail -3
count "host unit tests" "$logs/unit.log" "${PIPESTATUS[0]}"

stage "ASan+UBSan (clang) (+ TSan build)"
echo "=== host unit tests under ASan+UBSan (clang)"
bg_wait
asan_built=$?
bg_start "$logs/build-tsan.log" build build-tsan "thread" gcc unit_tests
if [ "$asan_built" -eq 0 ]; then
  # The stress tests run a smaller randomized workload under the (slow) sanitizers.
  RDMALOCK_STRESS_OPS=${RDMALOCK_STRESS_OPS:-40000} RDMALOCK_SDK_STRESS_OPS=${RDMALOCK_SDK_STRESS_OPS:-200} \
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$root/build-asan/tests/unit_tests" --use-colour no 2>&1 | tee "$logs/asan.log" | tail -3
  count "host unit tests (ASan+UBSan, clang)" "$logs/asan.log" "${PIPESTATUS[0]}"
else
  echo "run-all: the ASan+UBSan build failed"
  count "host unit tests (ASan+UBSan, clang)" /dev/null 1
fi

stage "TSan (+ fuzzers' build and runs)"
echo "=== host unit tests under TSan"
bg_wait
tsan_built=$?
# The libFuzzer tree (clang, ASan+UBSan, tests off: also the check that a tree without the tests
# configures and builds), then the fuzzers, one at a time (JOBS=1), FUZZ_SECONDS each (15 here;
# run.sh's own default is 30): a regression check over the seed corpus and what it reaches
# quickly, not a fuzzing campaign (run tests/fuzz/run.sh with a larger FUZZ_SECONDS for that).
# Beside the TSan tests, which leave about a core idle once this build is done (at stop 49 the
# build ended 88 s before the tests); as a stage of their own the fuzzers took 34 s of wall time.
# Each fuzzer's bound is wall time: at nice 19 it gets the CPU the tests leave, and its line says
# how many runs that was (tried 2026-12-06: they ended 15 s before the TSan tests, which took 5 s
# longer; the handshake fuzzer made 6.6 million runs in its 15 s, 7.7 million in a stage of its
# own).
export FUZZ_SECONDS=${FUZZ_SECONDS:-15}
fuzz_build_and_run() {  # the build with every CPU (at nice 19), the runs one at a time
  "$root/tests/fuzz/run.sh" --build-only && JOBS=1 "$root/tests/fuzz/run.sh" "$logs/fuzz"
}
bg_start "$logs/fuzz.log" fuzz_build_and_run
if [ "$tsan_built" -eq 0 ]; then
  # TSan needs a narrower address-space randomisation than recent kernels use by default.
  RDMALOCK_STRESS_OPS=${RDMALOCK_STRESS_OPS:-40000} RDMALOCK_SDK_STRESS_OPS=${RDMALOCK_SDK_STRESS_OPS:-200} \
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    setarch "$(uname -m)" -R "$root/build-tsan/tests/unit_tests" --use-colour no 2>&1 | tee "$logs/tsan.log" | tail -3
  count "host unit tests (TSan)" "$logs/tsan.log" "${PIPESTATUS[0]}"
else
  echo "run-all: the TSan build failed"
  count "host unit tests (TSan)" /dev/null 1
fi

stage "fuzzers (wait)"
echo "=== fuzzers (libFuzzer + ASan/UBSan: handshake, config and lockctl-argument parsers, $FUZZ_SECONDS s each)"
rc=0
wait "$bg_pid" || rc=$?
if [ "$rc" -eq 0 ]; then grep '^fuzz: ' "$logs/fuzz.log"; else cat "$logs/fuzz.log"; fi
tally "fuzzers (libFuzzer)" "$logs/fuzz.log" "$rc" '^fuzz: .*: ok ' '^fuzz: .*: FAIL'

# The protocol model and the thread-safety analysis, host work that uses both cores, run beside the
# first two VM stages at the idle scheduling policy (SCHED_IDLE: any other thread that wakes
# preempts them, and they weigh a fifth of a nice-19 task) and are waited for after them. Under
# TCG the VMs use about one core on average but both in bursts, so this work slows them: tried 2026-12-07,
# the RDMA stage took 248 s with the whole model beside it against 210 s alone, where the model's
# own stage took 165 s; at nice 19 (2026-12-06) the thread-safety analysis alone had slowed it from
# 181 s to 240 s. A model run gets less than a CPU there, so the bitstate runs' time bounds are
# doubled (MODEL_TIME_SCALE=2): bounded by wall time, they get about the CPU time they had in a
# stage of their own. The exhaustive runs' bounds (and those of the runs that must find a
# violation) only stop a runaway, and a run cut off by one fails, so beside the VMs, which can
# take both cores for a while, they get five times theirs (MODEL_EXHAUSTIVE_TIME_SCALE=5).
side_start() {
  (
    chrt --idle -p 0 "$BASHPID" >/dev/null 2>&1 || renice -n 19 -p "$BASHPID" >/dev/null
    MODEL_TIME_SCALE=2 MODEL_EXHAUSTIVE_TIME_SCALE=5 "$root/tests/model/check.sh" \
      >"$logs/model.log" 2>&1
    echo $? >"$logs/model.rc"
    "$root/tests/thread-safety/check.sh" --compiled-in "$root/build-asan" "$root/build-tsa" \
      >"$logs/thread-safety.log" 2>&1
    echo $? >"$logs/thread-safety.rc"
  ) &
  side_pid=$!
}
# A status file that is missing or holds no number (the job died, or was killed while writing
# it): a failure, with a line that says so.
side_rc() {  # RC_FILE LOG FAIL_LINE: prints the exit status the file holds, else 1
  local rc
  rc=$(cat "$1" 2>/dev/null)
  if [[ "$rc" =~ ^[0-9]+$ ]]; then echo "$rc"; else echo "$3" >>"$2"; echo 1; fi
}
side_wait() {
  local rc
  wait "$side_pid"
  echo "=== protocol model (spin), beside the VM stages"
  rc=$(side_rc "$logs/model.rc" "$logs/model.log" \
    "model: the background job left no exit status: VIOLATION")
  cat "$logs/model.log"
  tally "protocol model (spin)" "$logs/model.log" "$rc" ': ok$' ': (VIOLATION|INCOMPLETE)$'
  echo "=== thread-safety analysis (clang -Wthread-safety: every translation unit the clang ASan tree did not compile, syntax only), beside the VM stages"
  rc=$(side_rc "$logs/thread-safety.rc" "$logs/thread-safety.log" \
    "thread-safety: the background job left no exit status: FAIL")
  grep -v ': ok' "$logs/thread-safety.log"
  # One check: the analysis refuses the known violations and accepts every file of the project.
  if [ "$rc" -eq 0 ]; then echo "thread-safety: all files: ok" >>"$logs/thread-safety.log"; fi
  tally "thread-safety analysis (clang)" "$logs/thread-safety.log" "$rc" \
    "^thread-safety: (the analysis refuses|.*'s own flags refuse|all files)" \
    '^thread-safety: .*: FAIL$'
}
# No status or line of an earlier run's may count for this one.
rm -f "$logs/model.rc" "$logs/thread-safety.rc"
: >"$logs/model.log"
: >"$logs/thread-safety.log"
side_start

stage "RDMA tests (rdma_rxe)"
echo "=== RDMA integration tests on rdma_rxe"
# A clone may be anywhere (issue 20, item 1): the VM is started from a working directory that the
# guest's tmpfs would hide (/var/tmp) with a space in its name, and must see it there (one check,
# in this stage's boot rather than a boot of its own); the tests then run from the tree as usual.
anywhere=$(mktemp -d "/var/tmp/rdmalock any dir.XXXXXX")
echo here >"$anywhere/cwd-marker"
(cd "$anywhere" && "$root/deploy/softroce/rxe-run" --timeout 1200 -- \
  sh -c 'if [ "$(cat cwd-marker 2>/dev/null)" = here ]; then r=ok; else r=FAIL; fi
         echo "harness: working directory $(pwd) seen in the guest: $r"
         cd "$0" || exit 1
         echo "rdma device: $RXE_DEV at $RXE_IP (in VM: ${RXE_IN_VM:-0})"; ibv_devices;
         exec "$0"/build/tests/rdma_tests --use-colour no --durations yes' "$root") 2>&1 | tee "$logs/rdma.log"
rc=${PIPESTATUS[0]}
rm -rf "$anywhere"
count "RDMA tests (rdma_rxe)" "$logs/rdma.log" "$rc"
# Its own line in the summary; the exit status is the RDMA tests' (counted above).
tally "harness from any directory" "$logs/rdma.log" 0 '^harness: .*: ok$' '^harness: .*: FAIL$'

stage "C API + Python (rdma_rxe)"
echo "=== C API and Python module on rdma_rxe"
"$root/deploy/softroce/rxe-run" --timeout 600 -- "$root/tests/sdk/run.sh" "$root/build" 2>&1 |
  tee "$logs/sdk.log"
tally "C API + Python (rdma_rxe)" "$logs/sdk.log" "${PIPESTATUS[0]}" '^sdk-test: .*: ok$' \
  '^sdk-test: .*: FAIL'

stage "protocol model and thread-safety analysis (wait)"
side_wait

stage "operator paths (rdma_rxe, ASan)"
echo "=== lockd's operator paths on rdma_rxe, lockd under ASan+UBSan (tests/operator/run.sh)"
"$root/deploy/softroce/rxe-run" --timeout 600 -- "$root/tests/operator/run.sh" "$root/build-asan" 2>&1 |
  tee "$logs/operator.log"
tally "operator paths (rdma_rxe, ASan)" "$logs/operator.log" "${PIPESTATUS[0]}" '^operator: .*: ok$' \
  '^operator: .*: FAIL'

stage "two-host fault tests"
echo "=== two-host fault tests (lockd and clients in two VMs)"
twohost_out="$root/build/twohost"
rm -rf "$twohost_out"
mkdir -p "$twohost_out"
# Two hosts are two VMs even where this kernel has RDMA (the harness's --vms 2 is vm mode only).
"$root/deploy/softroce/rxe-run" --vms 2 --share "$twohost_out" --timeout 900 -- \
  "$root/tests/twohost/run.sh" "$twohost_out" "$root/build" 2>&1 | tee "$logs/twohost.log"
tally "two-host fault tests" "$logs/twohost.log" "${PIPESTATUS[0]}" 'twohost: .*: ok ' \
  'twohost: .*: FAIL'

stage "failover tests"
echo "=== failover tests (two shards, one with a standby, etcd; two VMs)"
failover_out="$root/build/failover"
rm -rf "$failover_out"
mkdir -p "$failover_out"
"$root/deploy/softroce/rxe-run" --vms 2 --share "$failover_out" --timeout 900 -- \
  "$root/tests/failover/run.sh" "$failover_out" "$root/build" 2>&1 | tee "$logs/failover.log"
tally "failover tests" "$logs/failover.log" "${PIPESTATUS[0]}" 'failover: .*: ok ' \
  'failover: .*: FAIL'

stage "Debian packages"
echo "=== Debian packages (built, installed into a clean Debian 12 tree, lockd run from them on rdma_rxe)"
"$root/tests/pkg/run.sh" "$root/build" 2>&1 | tee "$logs/pkg.log"
tally "Debian packages" "$logs/pkg.log" "${PIPESTATUS[0]}" '^pkg: .*: ok$' '^pkg: .*: FAIL'

stage
echo
echo "=== summary"
for r in "${results[@]}"; do echo "$r"; done
echo "--- time per stage (CPU: user+system of the stage's processes; the machine has $(nproc) cores)"
for t in "${timings[@]}"; do echo "$t"; done
printf '%-34s %6d s wall\n' "whole run" $((($(usecs) - run_us0 + 500000) / 1000000))
if [ "${#failures[@]}" -gt 0 ]; then
  echo "--- what failed (the full logs are in $logs)"
  for f in "${failures[@]}"; do echo "$f"; done
fi
echo "total: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
