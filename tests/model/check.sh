#!/usr/bin/env bash
# Model-checks rdmalock.pml (the lock word) with spin: one exhaustive run and two bitstate
# (supertrace) runs over larger configurations, each bounded in time; records.pml (request
# records, the entry pool across QPs, lockd's reaping) exhaustively; and cohort.pml (cohort
# handover among a client's threads) exhaustively, plus one run without its bound that must find
# the bypass it prevents (else the property would not be checking anything). Prints the state counts; exits non-zero on any
# assertion violation, invalid end state, or an exhaustive run that did not complete.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
command -v spin >/dev/null || { echo "model: spin is not installed (apt-get install spin)"; exit 1; }
cp "$here/rdmalock.pml" "$here/records.pml" "$here/cohort.pml" "$work/"
cd "$work"
status=0

model=rdmalock.pml
run() {  # label mode(exhaustive|bitstate) minutes defines...
  local label=$1 mode=$2 minutes=$3
  shift 3
  local flags="-O2 -DSAFETY -w"
  if [ "$mode" = exhaustive ]; then flags="$flags -DCOLLAPSE -DMEMLIM=4000"; else flags="$flags -DBITSTATE"; fi
  spin "$@" -a "$model" >/dev/null || { echo "model: spin -a failed"; status=1; return; }
  # shellcheck disable=SC2086
  gcc $flags -o pan pan.c || { echo "model: compiling pan failed"; status=1; return; }
  local extra=""
  [ "$mode" = bitstate ] && extra="-w29 -k3"
  # shellcheck disable=SC2086
  ./pan -m1000000 -Q"$minutes" $extra >out.txt 2>&1
  local errors states depth
  errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' out.txt | tail -1)
  states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' out.txt | tail -1)
  depth=$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' out.txt | tail -1)
  local verdict=ok
  if [ "${errors:-1}" != 0 ]; then verdict="VIOLATION"; status=1; fi
  if [ "$mode" = exhaustive ] && grep -qE 'reached -DMEMLIM|time limit' out.txt; then
    verdict="INCOMPLETE"; status=1
  fi
  printf 'model %-34s %-10s states %-12s depth %-5s errors %s: %s\n' "$label" "$mode" \
    "${states:-?}" "${depth:-?}" "${errors:-?}" "$verdict"
  if [ "$verdict" != ok ]; then
    cat out.txt
    [ -f "$model.trail" ] && spin "$@" -t -p -g "$model" | tail -80
  fi
  rm -f "$model.trail"
}

run "2 clients, 1 round, 6 ticks, CMAX 2" exhaustive 3 -DNCLIENTS=2 -DROUNDS=1 -DTMAX=6 -DCMAX=2
run "3 clients, 1 round, 6 ticks, CMAX 2" bitstate 1 -DNCLIENTS=3 -DROUNDS=1 -DTMAX=6 -DCMAX=2
run "2 clients, 2 rounds, 6 ticks, CMAX 3" bitstate 1 -DNCLIENTS=2 -DROUNDS=2 -DTMAX=6 -DCMAX=3
model=records.pml
run "records: 2 QPs, 2 uses each" exhaustive 2 -DUSES=2
run "records: 2 QPs, 3 uses each" exhaustive 2 -DUSES=3
model=cohort.pml
run "cohort: 2 threads + 1, 3 rounds" exhaustive 2 -DNT=2 -DROUNDS=3
run "cohort: 3 threads + 1, no timeouts" exhaustive 3 -DNT=3 -DROUNDS=2 -DTIMEOUTS=0
run "cohort: 3 threads + 1, 2 rounds" bitstate 1 -DNT=3 -DROUNDS=2
# Without the bound spin must find another client's waiter bypassed more than KMAX + 1 times.
spin -DNT=2 -DROUNDS=3 -DTIMEOUTS=0 -DNOBOUND=1 -a cohort.pml >/dev/null &&
  gcc -O2 -DSAFETY -w -o pan pan.c && ./pan -m1000000 >out.txt 2>&1
if grep -q 'assertion violated (bypass' out.txt; then
  echo "model cohort: without the bound               exhaustive finds the bypass: ok"
else
  echo "model cohort: without the bound, no bypass was found: the property checks nothing"
  status=1
fi
rm -f cohort.pml.trail
exit $status
