#!/usr/bin/env bash
# Same-boot A/B of two builds of rdmalock: boots the Soft-RoCE VM once (or runs natively where the
# kernel has RDMA), starts one lockd (build B's), and runs the same `lockctl bench` scenarios with
# build A's lockctl and build B's alternately, ROUNDS rounds of SECS seconds each, so that drift in
# the emulated machine hits both alike. Prints each scenario's median of the rounds for both builds
# and the ratio B/A, and every round (for the spread). Under TCG only such same-boot ratios mean
# anything; this is how a change is shown not to slow any scenario down.
#
#   deploy/perf/compare.sh BUILD_A BUILD_B [OUT_DIR]     (default OUT_DIR: BUILD_B/compare)
#   env: ROUNDS (default 3), SECS (default 3), ONLY (an extended regular expression: run only
#        the scenarios whose names match it, e.g. ONLY='^uncontended')
#
# BUILD_A and BUILD_B are build directories with lockd and lockctl built (cmake --build DIR
# --target lockd lockctl); they need not come from this checkout.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)

if [ "${1:-}" != "--inside" ]; then
  [ $# -ge 2 ] || { echo "usage: compare.sh BUILD_A BUILD_B [OUT_DIR]" >&2; exit 2; }
  a=$(cd "$1" && pwd)
  b=$(cd "$2" && pwd)
  for d in "$a" "$b"; do
    for t in lockd lockctl; do
      [ -x "$d/$t" ] || { echo "compare: $d/$t is not built" >&2; exit 2; }
    done
  done
  out=${3:-$b/compare}
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  # The run clears earlier results (below): only in a directory of this script's (its marker
  # file, or the default) or an empty one, never a directory of the user's.
  if [ -e "$out/.compare-results" ] || [ "$out" = "$b/compare" ] || [ -z "$(ls -A "$out")" ]; then
    : >"$out/.compare-results"
  else
    echo "compare: $out holds files compare.sh did not make: give a new or empty directory" \
      "(default BUILD_B/compare)" >&2
    exit 2
  fi
  cd "$root"
  # The guest does not inherit this shell's environment: ROUNDS and SECS go along explicitly.
  exec "$root/deploy/softroce/rxe-run" --timeout 1200 --share "$out" -- \
    env ROUNDS="${ROUNDS:-3}" SECS="${SECS:-3}" ONLY="${ONLY:-}" \
    "$root/deploy/perf/compare.sh" --inside "$a" "$b" "$out"
fi

a=${2:?}
b=${3:?}
out=${4:?}
ip=${RXE_IP:?RXE_IP not set: run through deploy/softroce/rxe-run}
port=7471
rounds=${ROUNDS:-3}
secs=${SECS:-3}
bin=$b
state=$(mktemp -d)
lockctl() { "$bin/lockctl" --server "$ip" --port "$port" "$@"; }
# shellcheck source=deploy/lib.sh
. "$root/deploy/lib.sh"
# lockd's log is kept with the results: a bench that fails says why in it.
start_lockd "$out/lockd.log" --state-dir "$state" --log-level info

# name processes bench-args...
scenarios=(
  "uncontended|1|--threads 1 --locks 10000"
  "uncontended-norec|1|--threads 1 --locks 10000 --no-records"
  "throughput|1|--threads 8 --locks 10000"
  "many-8|1|--threads 1 --locks 10000 --batch 8"
  "async-16|1|--threads 2 --locks 10000 --inflight 16"
  "onelock|1|--threads 1 --locks 1"
  "onelock-4threads|1|--threads 4 --locks 1"
  "onelock-8threads|1|--threads 8 --locks 1"
  "contended-2x4|2|--threads 4 --locks 1"
  "contended-4x1|4|--threads 1 --locks 1"
  "async-onelock|1|--threads 1 --locks 1 --inflight 8"
  "readers-4threads|1|--threads 4 --locks 1 --shared-ratio 1 --hold-us 100"
  "mixed-4threads|1|--threads 4 --locks 1 --shared-ratio 0.75 --hold-us 100"
)

run() {  # side(A|B) name procs round args -> out/name.side.round.process.json
  local side=$1 name=$2 procs=$3 r=$4 i pids=() build=$a
  [ "$side" = B ] && build=$b
  shift 4
  for i in $(seq 1 "$procs"); do
    # shellcheck disable=SC2048,SC2086  # the scenario's arguments, split on purpose
    "$build/lockctl" --server "$ip" --port "$port" --json bench $* --duration "$secs" \
      >"$out/$name.$side.$r.$i.json" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do
    # A failed bench is reported and its round left out (a marker: a failed bench still writes
    # its JSON, with the figures of a broken run); the comparison goes on.
    wait "$p" || {
      echo "compare: $side $name round $r failed (lockd's log: $out/lockd.log)" >&2
      failures=$((failures + 1))
      : >"$out/$name.$side.$r.failed"
    }
  done
}
failures=0
# Only this boot's results: OUT_DIR is kept between runs, and a scenario renamed or run with
# fewer processes since would leave files the figures below would read as this run's. (OUT_DIR
# is one of this script's: checked before the VM started.)
rm -f "$out"/*.json "$out"/*.failed
if [ -n "${ONLY:-}" ]; then
  kept=()
  for s in "${scenarios[@]}"; do
    if [[ ${s%%|*} =~ $ONLY ]]; then kept+=("$s"); fi
  done
  [ "${#kept[@]}" -gt 0 ] || { echo "compare: no scenario matches ONLY='$ONLY'" >&2; exit 2; }
  scenarios=("${kept[@]}")
fi

for r in $(seq 1 "$rounds"); do
  for s in "${scenarios[@]}"; do
    IFS='|' read -r name procs args <<<"$s"
    echo "round $r: $name" >&2
    run A "$name" "$procs" "$r" "$args"
    run B "$name" "$procs" "$r" "$args"
  done
done

python3 - "$out" "$rounds" "${scenarios[@]}" <<'EOF'
import glob, json, os, statistics, sys
out, rounds, scen = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def fig(files):
    """pairs/s summed over processes, pair p50 (max over processes), RDMA ops per acquisition."""
    js = []
    for f in files:
        try:
            js.append(json.load(open(f)))
        except ValueError:
            return None  # that run failed (reported above): its round is left out
    pairs = sum(j.get("pairs_per_s", 0) for j in js)
    p50 = max(j.get("pair_us", {}).get("p50", 0) for j in js)
    ops = statistics.mean(j.get("rdma_ops_per_pair", 0) for j in js)
    return pairs, p50, ops
print("%-20s %-14s %12s %12s %7s   rounds (pairs/s A | B)" % ("scenario", "figure", "A", "B", "B/A"))
for s in scen:
    name = s.split("|")[0]
    per = {"A": [], "B": []}
    for side in "AB":
        for r in range(1, rounds + 1):
            files = sorted(glob.glob("%s/%s.%s.%d.*.json" % (out, name, side, r)))
            failed = os.path.exists("%s/%s.%s.%d.failed" % (out, name, side, r))
            f = fig(files) if files and not failed else None
            if f:
                per[side].append(f)
    if not per["A"] or not per["B"]:
        print("%-20s missing results" % name); continue
    for k, label in ((0, "pairs/s"), (1, "pair p50 us"), (2, "ops/acq")):
        va = statistics.median(x[k] for x in per["A"])
        vb = statistics.median(x[k] for x in per["B"])
        extra = ""
        if k == 0:
            extra = "   " + " ".join("%.0f" % x[0] for x in per["A"]) + " | " + " ".join("%.0f" % x[0] for x in per["B"])
        ratio = "%7.2f" % (vb / va) if va else "    n/a"
        print("%-20s %-14s %12.2f %12.2f %s%s" % (name if k == 0 else "", label, va, vb, ratio, extra))
EOF
[ "$failures" -eq 0 ] || { echo "compare: $failures bench run(s) failed" >&2; exit 1; }
