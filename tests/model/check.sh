#!/usr/bin/env bash
# Model-checks rdmalock.pml (the lock word) with spin: one exhaustive run and two bitstate
# (supertrace) runs over larger configurations, each bounded in time, plus four runs that must
# find a violation (the stall timer from a READ's issue, a renewal without its checks, the
# freezing ticket withdrawn, a reset with the frozen field's last ticket held); records.pml (request
# records, the entry pool across QPs, lockd's reaping) exhaustively, plus two runs that must find
# a ticket released twice (either half of FreeRecord's fix taken out); cohort.pml (cohort
# handover among a client's threads, with fencing tokens) exhaustively, plus two runs that must
# find a violation: one without the bound (the bypass it prevents) and one without the
# handover's number in a local holder's token (a token no larger than the last);
# cohort_shared.pml (readers of a client joining one shared grant, among its writers and another
# session's) exhaustively, plus two runs that must find a violation: a shared grant handed to a
# writer, and joins without their bound; and
# stale_entry.pml (exclusive releases without a done mark: entries tagged with the generation)
# exhaustively, plus three runs that must find lockd releasing a live session's grant: without
# the generation check, with a generation newer than word1's, and with word1 read before word0.
# Without the runs that must fail, those properties would not be checking anything. Prints the
# state counts; exits non-zero on any assertion violation, invalid end state, or an exhaustive run
# that did not complete.
# The runs are independent, single-threaded programs: they run JOBS (default: the number of CPUs)
# at a time, each in a directory of its own, and their lines are printed in the order below. A
# bitstate run's bound is wall time (pan's -Q), so it needs a CPU of its own: never more runs at
# once than CPUs. MODEL_TIME_SCALE (default 1) multiplies the bitstate runs' time bounds, and
# MODEL_EXHAUSTIVE_TIME_SCALE (default MODEL_TIME_SCALE) those of the exhaustive runs and of the
# runs that must find a violation, which end when done and fail if cut off: run-all.sh runs the
# model at the idle scheduling priority beside the VM stages, where a run gets less than a CPU.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
command -v spin >/dev/null || { echo "model: spin is not installed (apt-get install spin)"; exit 1; }
jobs=${JOBS:-$(nproc)}
scale=${MODEL_TIME_SCALE:-1}
escale=${MODEL_EXHAUSTIVE_TIME_SCALE:-$scale}
for s in "MODEL_TIME_SCALE=$scale" "MODEL_EXHAUSTIVE_TIME_SCALE=$escale"; do
  if ! [[ "${s#*=}" =~ ^[1-9][0-9]*$ ]]; then
    echo "model: ${s%%=*} must be a whole number >= 1, not '${s#*=}'"
    exit 1
  fi
done

run() {  # model label mode(exhaustive|bitstate) minutes defines...
  local model=$1 label=$2 mode=$3 minutes=$4 status=0
  shift 4
  local flags="-O2 -DSAFETY -w"
  if [ "$mode" = exhaustive ]; then flags="$flags -DCOLLAPSE -DMEMLIM=4000"; else flags="$flags -DBITSTATE"; fi
  spin "$@" -a "$model" >/dev/null || { echo "model: spin -a failed"; return 1; }
  # shellcheck disable=SC2086
  gcc $flags -o pan pan.c || { echo "model: compiling pan failed"; return 1; }
  local extra="" bound=$((minutes * escale))
  [ "$mode" = bitstate ] && extra="-w29 -k3" bound=$((minutes * scale))
  # shellcheck disable=SC2086
  ./pan -m1000000 -Q"$bound" $extra >out.txt 2>&1
  local errors states depth
  errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' out.txt | tail -1)
  states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' out.txt | tail -1)
  depth=$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' out.txt | tail -1)
  local verdict=ok
  if [ "${errors:-1}" != 0 ]; then verdict="VIOLATION"; status=1; fi
  # pan says "pan: reached -DMEMLIM bound" and "Time limit of N minutes exceeded".
  if [ "$mode" = exhaustive ] && grep -qiE 'reached -DMEMLIM|time limit' out.txt; then
    verdict="INCOMPLETE"; status=1
  fi
  # A search cut at -m's depth left the states beyond it unexplored, in either mode ("errors: 0"
  # all the same).
  if grep -qi 'max search depth too small' out.txt; then verdict="INCOMPLETE"; status=1; fi
  printf 'model %-34s %-10s states %-12s depth %-5s errors %s: %s\n' "$label" "$mode" \
    "${states:-?}" "${depth:-?}" "${errors:-?}" "$verdict"
  if [ "$verdict" != ok ]; then
    cat out.txt
    [ -f "$model.trail" ] && spin "$@" -t -p -g "$model" | tail -80
  fi
  rm -f "$model.trail"
  return $status
}

# Every run goes in the background in a directory of its own once fewer than $jobs runs are
# running; its lines go to DIR/report and its verdict to DIR/status, printed in `runs` order.
runs=()
queue() {  # DIR MODEL: makes DIR with a copy of MODEL and waits for a free CPU
  mkdir "$1"
  cp "$here/$2" "$1/"
  runs+=("$1")
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
}
# start MODEL ARGS...: run MODEL ARGS... in work/N.
n=0
start() {
  n=$((n + 1))
  queue "$work/$n" "$1"
  (cd "$work/$n" && run "$@" >report 2>&1; echo $? >status) &
}

start rdmalock.pml "2 clients, 1 round, 6 ticks, CMAX 2" exhaustive 3 -DNCLIENTS=2 -DROUNDS=1 -DTMAX=6 -DCMAX=2
start rdmalock.pml "3 clients, 1 round, 6 ticks, CMAX 2" bitstate 1 -DNCLIENTS=3 -DROUNDS=1 -DTMAX=6 -DCMAX=2
start rdmalock.pml "2 clients, 2 rounds, 6 ticks, CMAX 3" bitstate 1 -DNCLIENTS=2 -DROUNDS=2 -DTMAX=6 -DCMAX=3
start records.pml "records: 2 QPs, 2 uses each" exhaustive 2 -DUSES=2
start records.pml "records: 2 QPs, 3 uses each" exhaustive 2 -DUSES=3
start cohort.pml "cohort: 2 threads + 1, 3 rounds" exhaustive 2 -DNT=2 -DROUNDS=3 -DTOKENS=0
start cohort.pml "cohort: 3 threads + 1, no timeouts" exhaustive 3 -DNT=3 -DROUNDS=2 -DTIMEOUTS=0 -DTOKENS=0
start cohort.pml "cohort: 3 threads + 1, 2 rounds" bitstate 1 -DNT=3 -DROUNDS=2 -DTOKENS=0
start cohort.pml "cohort tokens: 2 threads + 1, 2 rounds" exhaustive 2 -DNT=2 -DROUNDS=2
start cohort.pml "cohort tokens: 3 threads + 1, 1 round" exhaustive 2 -DNT=3 -DROUNDS=1
start cohort_shared.pml "cohort shared: 2 readers, 1 writer + 1" exhaustive 1 -DNR=2 -DNW=1 -DROUNDS=2
start cohort_shared.pml "cohort shared: 3 readers, 2 writers + 1" exhaustive 1 -DNR=3 -DNW=2 -DROUNDS=1
start stale_entry.pml "stale entries: 2 sessions, 2 rounds" exhaustive 1 -DNS=2 -DROUNDS=2
start stale_entry.pml "stale entries: 3 sessions, 1 round" exhaustive 1 -DNS=3 -DROUNDS=1
# A run of a model with a safeguard taken out must find the violation it prevents, else the
# property would check nothing (bounded at 3 minutes: one that finds nothing fails then, not at
# the memory's end): must_find MODEL DIR PATTERN OK_LINE FAIL_LINE defines..., queued
# with the runs above in work/DIR.
must_find() {
  local model=$1 dir=$work/$2 pattern=$3 ok=$4 bad=$5
  shift 5
  queue "$dir" "$model"
  (
    cd "$dir" || exit 1
    if spin "$@" -a "$model" >/dev/null && gcc -O2 -DSAFETY -w -o pan pan.c &&
      ./pan -m1000000 -Q$((3 * escale)) >out.txt 2>&1
      grep -q "$pattern" out.txt; then
      echo "$ok" >report
      echo 0 >status
    else
      echo "$bad" >report
      echo 1 >status
    fi
  ) &
}
# rdmalock.pml: the stall timer started at the READ's issue, not its completion (the bug the model
# found, docs/protocol.md section 9), and a renewal that checks neither its lease nor the word:
# two lease-valid holders (the grant-time assertion's failure, or the Exclusion process's).
two_holders='assertion violated \(0 (at\|((j==id)\)'
# word_must_find DIR PATTERN LABEL FINDS defines...: rdmalock.pml with a safeguard taken out.
word_must_find() {
  local dir=$1 pattern=$2 label=$3 finds=$4
  shift 4
  must_find rdmalock.pml "$dir" "$pattern" \
    "$(printf 'model word: %-40s exhaustive finds %s: ok' "$label" "$finds")" \
    "model word: $label: no $finds found, the property checks nothing" "$@"
}
word_must_find timerissue "$two_holders" "the stall timer from the READ's issue" "two holders" \
  -DNCLIENTS=2 -DROUNDS=1 -DTMAX=6 -DCMAX=2 -DTIMER_AT_ISSUE=1
word_must_find norenewcheck "$two_holders" "a renewal without its checks" "two holders" \
  -DNCLIENTS=2 -DROUNDS=1 -DTMAX=6 -DCMAX=2 -DNO_RENEW_CHECK=1
# The ticket whose FA froze the word withdrawn on a give-up, as before 2026-12-07: the word thaws
# before its reset (the Thaw process's assertion), which the frozen-word rescue's safety rests on.
word_must_find thaw 'assertion violated (resets!=r)' "the freezing ticket withdrawn" \
  "a frozen word thawed" -DNCLIENTS=2 -DROUNDS=1 -DTMAX=6 -DCMAX=2 -DTHAW=1
# A frozen word taken for one with nothing but bounces left while its last admitted ticket is
# still held (RESETTABLE off by one): the reset lands under that holder.
word_must_find resetearly "$two_holders" "a reset with the last ticket held" "two holders" \
  -DNCLIENTS=3 -DROUNDS=1 -DTMAX=6 -DCMAX=2 -DRESET_EARLY=1
# Without the bound: another client's waiter bypassed more than KMAX + 1 times.
must_find cohort.pml nobound 'assertion violated (bypass' \
  "model cohort: without the bound               exhaustive finds the bypass: ok" \
  "model cohort: without the bound, no bypass was found: the property checks nothing" \
  -DNT=2 -DROUNDS=3 -DTIMEOUTS=0 -DNOBOUND=1
# Without the handover's number in a local holder's token: a token no larger than the last.
must_find cohort.pml nolocal 'assertion violated.*last_tok' \
  "model cohort: tokens without the handover's number  exhaustive finds the repeat: ok" \
  "model cohort: tokens without the handover's number, no repeat was found: the property checks nothing" \
  -DNT=2 -DROUNDS=2 -DNOLOCAL=1
# cohort_shared.pml: a shared grant handed to a waiting writer as an exclusive one would be: a
# writer beside a reader.
must_find cohort_shared.pml handshared 'assertion violated ((writers_in' \
  "model cohort shared: a shared grant handed to a writer  exhaustive finds a writer beside a reader: ok" \
  "model cohort shared: a shared grant handed to a writer, no writer beside a reader was found: the property checks nothing" \
  -DNR=2 -DNW=1 -DROUNDS=2 -DHANDSHARED=1
# Without the join bound: another session's writer bypassed by more than JMAX joins.
must_find cohort_shared.pml nojoinbound 'assertion violated (b_joins' \
  "model cohort shared: without the join bound      exhaustive finds the bypass: ok" \
  "model cohort shared: without the join bound, no bypass was found: the property checks nothing" \
  -DNR=3 -DNW=1 -DROUNDS=1 -DNOJOINBOUND=1
# records.pml with either half of FreeRecord's fix taken out: a ticket released twice
# (docs/protocol.md section 9 says spin finds it; these runs keep that true).
twice='assertion violated.*released\['
must_find records.pml nowait "$twice" \
  "model records: the entry back at once (FIX_WAIT=0)  exhaustive finds a double release: ok" \
  "model records: the entry back at once (FIX_WAIT=0), no double release was found: the property checks nothing" \
  -DUSES=2 -DFIX_WAIT=0
must_find records.pml noclear "$twice" \
  "model records: a done mark instead of a clear (FIX_CLEAR=0)  exhaustive finds a double release: ok" \
  "model records: a done mark instead of a clear (FIX_CLEAR=0), no double release was found: the property checks nothing" \
  -DUSES=3 -DFIX_CLEAR=0
# lockd's reap releasing the grant of a session that is still live (stale_entry.pml).
reaped_live='assertion violated.*holding\[j\]&& !(ended\[j\])'
# Without the generation check: a released entry's ticket recurs after a reset.
must_find stale_entry.pml nogen "$reaped_live" \
  "model stale entries: without the generation check  exhaustive finds a live grant reaped: ok" \
  "model stale entries: without the generation check, no live grant was reaped: the property checks nothing" \
  -DNS=2 -DROUNDS=2 -DFIX_GEN=0
# A generation newer than word1's: the next generation's, so the stale entry matches again.
must_find stale_entry.pml newer "$reaped_live" \
  "model stale entries: a generation newer than word1's  exhaustive finds a live grant reaped: ok" \
  "model stale entries: a generation newer than word1's, no live grant was reaped: the property checks nothing" \
  -DNS=2 -DROUNDS=2 -DSTALE_NEWER=1
# word1 read before word0, a generation apart: the entry's generation beside a later word0.
must_find stale_entry.pml w1first "$reaped_live" \
  "model stale entries: word1 read before word0  exhaustive finds a live grant reaped: ok" \
  "model stale entries: word1 read before word0, no live grant was reaped: the property checks nothing" \
  -DNS=2 -DROUNDS=2 -DW1_FIRST=1
wait

status=0
for dir in "${runs[@]}"; do
  cat "$dir/report" 2>/dev/null || echo "model: a run in $dir left no report"
  [ "$(cat "$dir/status" 2>/dev/null)" = 0 ] || status=1
done
exit $status
