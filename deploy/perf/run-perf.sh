#!/usr/bin/env bash
# The performance suite: boots the Soft-RoCE VM once (or runs natively where the kernel has RDMA)
# and, in that one boot, measures the raw verbs limits with perftest (ib_atomic_lat,
# ib_atomic_bw, ib_read_lat of 8 bytes), then rdmalock's scenarios with `lockctl bench` and, next
# to them, the same scenarios on the bare ticket lock (deploy/perf/bare_lock.cc: rdmalock's word,
# posted release, nothing else). Prints one table with each rdmalock figure next to the raw figure
# it is judged against and, where the bare lock ran the same scenario, its ratio to the bare lock;
# saves every measurement as JSON and plots the uncontended pair latency's CDF
# (OUT_DIR/pair-cdf.png).
#
#   deploy/perf/run-perf.sh [OUT_DIR]        (default: build/perf)
#
# Under TCG emulation absolute times mean little; the ratios, measured in the same boot, are the
# point. lockd's CPU time over each data-path run comes from /proc/<pid>/stat.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)

if [ "${1:-}" != "--inside" ]; then
  out=${1:-$root/build/perf}
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  # Only this boot's results: the figures below glob NAME.*.json, and perf.json takes in every
  # *.json here, so a scenario renamed or run with fewer processes since an earlier run would
  # have mixed that run's files into this one's. They are cleared only in a directory of this
  # script's (its marker file, or the default) or an empty one: never a directory of the user's
  # (`run-perf.sh build` would have deleted build/compile_commands.json).
  if [ -e "$out/.run-perf-results" ] || [ "$out" = "$root/build/perf" ] ||
    [ -z "$(ls -A "$out")" ]; then
    rm -f "$out"/*.json "$out"/*.timeline
    : >"$out/.run-perf-results"
  else
    echo "run-perf: $out holds files run-perf.sh did not make: give a new or empty directory" \
      "(default build/perf)" >&2
    exit 2
  fi
  "$root/deploy/install-deps.sh"
  # The CDF plot's gnuplot (Debian's, without X; it has the pngcairo terminal). The VM sees the
  # host's root file system, so what is installed here is there too. No plot is no failure.
  if ! command -v gnuplot >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends gnuplot-nox ||
      echo "run-perf: could not install gnuplot-nox; the CDF plot will be missing" >&2
  fi
  cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$root/build" -j "$(nproc)" --target lockd lockctl rdma_bare_lock sdk_microbench
  # The SDK's own CPU per operation, on this host's CPU and outside the VM (issue 19): the SDK
  # over the in-process backend, against that backend's own work (tests/bench/sdk_microbench.cc).
  "$root/build/tests/sdk_microbench" >"$out/sdk_microbench.txt"
  "$root/build/tests/sdk_microbench" --json >"$out/sdk_microbench.json"
  cd "$root"
  exec "$root/deploy/softroce/rxe-run" --timeout 1200 --share "$out" -- \
    "$root/deploy/perf/run-perf.sh" --inside "$out"
fi

out=${2:?}
bin="$root/build"
ip=${RXE_IP:?RXE_IP not set: run through deploy/softroce/rxe-run}
dev=${RXE_DEV:-rxe0}
port=7471
state=$(mktemp -d)
lockctl() { "$bin/lockctl" --server "$ip" --port "$port" "$@"; }
section() { printf '\n=== %s\n' "$*" >&2; }
# shellcheck source=deploy/lib.sh
. "$root/deploy/lib.sh"

# perftest: server in the background, client against it; the client's output is kept. On a
# loaded host the server may not listen yet after 1 s: the client then cannot connect, and is
# tried again (up to 10 times); a server left waiting for a client that never came is killed.
perftest() {  # name tool args...
  local name=$1 tool=$2 try
  shift 2
  "$tool" -d "$dev" "$@" >/dev/null 2>&1 &
  local srv=$!
  for try in $(seq 1 10); do
    sleep 1
    "$tool" -d "$dev" "$@" "$ip" >"$out/$name.txt" 2>&1 || true
    grep -q "Couldn't connect" "$out/$name.txt" || break
    echo "run-perf: $name: the client could not connect (try $try), again" >&2
  done
  kill "$srv" 2>/dev/null || true
  wait "$srv" 2>/dev/null || true
}

section "raw verbs limits (perftest, same boot)"
perftest atomic_lat ib_atomic_lat -A FETCH_AND_ADD -n 5000 -F
perftest atomic_bw ib_atomic_bw -A FETCH_AND_ADD -n 20000 -F
perftest read_lat ib_read_lat -s 8 -n 5000 -F
cat "$out/atomic_lat.txt" "$out/atomic_bw.txt" "$out/read_lat.txt" | grep -E '^ *[0-9]' >&2 || true
# ib_*_lat columns: bytes iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
fa_med=$(awk '$1 == 8 && NF >= 9 { print $5; exit }' "$out/atomic_lat.txt")
fa_p99=$(awk '$1 == 8 && NF >= 9 { print $8; exit }' "$out/atomic_lat.txt")
rd_med=$(awk '$1 == 8 && NF >= 9 { print $5; exit }' "$out/read_lat.txt")
# ib_atomic_bw columns: bytes iterations BW_peak BW_average MsgRate[Mpps]
bw_mpps=$(awk '$1 == 8 && NF >= 5 { print $5; exit }' "$out/atomic_bw.txt")
for v in fa_med fa_p99 rd_med bw_mpps; do
  [ -n "${!v}" ] || { echo "run-perf: could not parse $v from perftest output" >&2; exit 1; }
done

section "start lockd and the bare lock's server"
start_lockd "$state/lockd.log" --state-dir "$state" --log-level warn
# The bare lock's server: lockd's default table size (65,536 slots), zeroed; idle (blocked in
# poll) while lockctl bench runs, as lockd is idle while the bare clients run.
bare_port=7480
"$bin/rdma_bare_lock" server --address 0.0.0.0 --port "$bare_port" --locks 65536 \
  2>"$state/bare.log" &
bare_pid=$!
trap 'kill -TERM $lockd_pid $bare_pid 2>/dev/null; wait $lockd_pid $bare_pid 2>/dev/null' EXIT
for _ in $(seq 1 100); do
  grep -q "listening on" "$state/bare.log" 2>/dev/null && break
  kill -0 "$bare_pid" 2>/dev/null || break
  sleep 0.1
done
grep -q "listening on" "$state/bare.log" || {
  echo "run-perf: the bare lock's server did not start; its log:" >&2
  cat "$state/bare.log" >&2
  exit 1
}
# utime and stime of lockd (all threads), in ms.
cpu_ms() { awk -v t="$(getconf CLK_TCK)" '{ print int($14 * 1000 / t), int($15 * 1000 / t) }' "/proc/$lockd_pid/stat"; }
# Time on CPU of all lockd's threads in us (schedstat: nanosecond precision, unlike the 10 ms ticks
# of /proc/<pid>/stat).
cpu_us() { cat /proc/"$lockd_pid"/task/*/schedstat | awk '{ s += $1 } END { printf "%d", s / 1000 }'; }
rss_kb() { awk '/^VmRSS/ { print $2 }' "/proc/$lockd_pid/status"; }
# The guest's CPU ticks: "idle total" (idle and iowait; every field of /proc/stat's cpu line).
guest_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print $5 + $6, t }' /proc/stat; }
# Percent of the guest's CPU time left idle between two guest_ticks readings.
idle_pct() {  # "idle0 total0" "idle1 total1"
  awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " ");
    printf "%.0f", (y[2] > x[2]) ? 100 * (y[1] - x[1]) / (y[2] - x[2]) : 0 }'
}
json() {  # file key -> number after "key":
  sed -n "s/.*\"$2\":\\([0-9.]*\\).*/\\1/p" "$1" | head -1
}
json_p() {  # file object pct -> e.g. "pair_us" "p50"
  sed -n "s/.*\"$2\":{[^}]*\"$3\":\\([0-9.]*\\).*/\\1/p" "$1" | head -1
}

# Runs one bench (possibly several processes at once) and records lockd's CPU time over it.
# lockd's CPU is sampled twice: over the whole run from /proc/<pid>/stat (user and sys, in 10 ms
# ticks; it includes the clients' connection set-up and teardown, handled by lockd's event loop),
# and from schedstat over a 3 s window inside the measuring period (1.5 s to 4.5 s after the
# clients start; they connect, warm up 0.5 s and measure 5 s): the data path alone.
bench() {  # name processes args...
  local name=$1 procs=$2 i
  shift 2
  local c u0 s0 w0 u1 s1 w1 du0 du1 g0
  c=$(cpu_ms)
  u0=${c% *} s0=${c#* }
  w0=$(date +%s%N)
  local pids=()
  for i in $(seq 1 "$procs"); do
    lockctl --json bench "$@" >"$out/$name.$i.json" &
    pids+=($!)
  done
  sleep 1.5
  du0=$(cpu_us)
  g0=$(guest_ticks)
  sleep 3
  du1=$(cpu_us)
  idle_pct "$g0" "$(guest_ticks)" >"$out/$name.idle"
  for p in "${pids[@]}"; do wait "$p"; done
  c=$(cpu_ms)
  u1=${c% *} s1=${c#* }
  w1=$(date +%s%N)
  # total_ms wall_ms user_ms sys_ms window_total_ms window_wall_ms
  echo "$((u1 - u0 + s1 - s0)) $(((w1 - w0) / 1000000)) $((u1 - u0)) $((s1 - s0))" \
    "$((du1 - du0)) 3000000" >"$out/$name.cpu"
  section "$name: $(cat "$out/$name".*.json | tr '\n' ' ' | cut -c1-300)"
}

# Runs the bare lock's client in `processes` processes at once, as bench runs lockctl; each writes
# OUT_DIR/bare-NAME.I.json with lockctl bench's keys.
bare() {  # name processes args...
  local name=$1 procs=$2 i g0
  shift 2
  local pids=()
  for i in $(seq 1 "$procs"); do
    "$bin/rdma_bare_lock" client --server "$ip" --port "$bare_port" --json "$@" \
      >"$out/bare-$name.$i.json" &
    pids+=($!)
  done
  # The guest's idle CPU over the same window as bench's (1.5 s to 4.5 s after the start).
  sleep 1.5
  g0=$(guest_ticks)
  sleep 3
  idle_pct "$g0" "$(guest_ticks)" >"$out/bare-$name.idle"
  for p in "${pids[@]}"; do wait "$p"; done
  section "bare $name: $(cat "$out/bare-$name".*.json | tr '\n' ' ' | cut -c1-300)"
}

# Each bare scenario runs right before the rdmalock scenario it is compared with, so that drift
# over the boot hits both alike.
section "rdmalock scenarios, and the bare lock's next to them"
bare uncontended 1 --threads 1 --locks 10000 --duration 5
bench uncontended 1 --threads 1 --locks 10000 --duration 5
bench uncontended-norec 1 --threads 1 --locks 10000 --duration 5 --no-records
# What an application pays with LockOptions' own defaults, which ask for a fencing token (a READ
# of word1 in every exclusive acquire's doorbell); lockctl bench asks for none unless --token.
bench uncontended-token 1 --threads 1 --locks 10000 --duration 5 --token
bare throughput 1 --threads 8 --locks 10000 --duration 5
bench throughput 1 --threads 8 --locks 10000 --duration 5
bench throughput-norec 1 --threads 8 --locks 10000 --duration 5 --no-records
bench throughput-many 1 --threads 4 --locks 10000 --batch 8 --duration 5
bench throughput-async 1 --threads 2 --locks 10000 --inflight 16 --duration 5
bare onelock 1 --threads 1 --locks 1 --duration 5
bench onelock 1 --threads 1 --locks 1 --duration 5
bare contended 2 --threads 4 --locks 1 --duration 5
bench contended 2 --threads 4 --locks 1 --duration 5
# One lock: threads of one process (a session's own contention), and processes of one thread.
bare onelock-4t 1 --threads 4 --locks 1 --duration 5
bench onelock-4t 1 --threads 4 --locks 1 --duration 5
# The same 4 threads each queueing at lockd on its own connection, as the bare lock's 4 threads
# do (no cohort handover): rdmalock's protocol against the bare lock's, like for like.
bench onelock-4t-remote 1 --threads 4 --locks 1 --duration 5 --no-local-handover
bare onelock-8t 1 --threads 8 --locks 1 --duration 5
bench onelock-8t 1 --threads 8 --locks 1 --duration 5
bare onelock-4p 4 --threads 1 --locks 1 --duration 5
bench onelock-4p 4 --threads 1 --locks 1 --duration 5
# Another process's waiter on a lock that 4 threads of one process hand over in-process (issue
# 19, cohort handover). The bound: one remote grant is handed over at most kMaxLocalHandovers (8)
# times in a row, so the other process waits for at most 9 of their grants once its FETCH_AND_ADD
# is at lockd. Both runs write when each set started and was granted, with its fencing token
# (--timeline, --token), and deploy/perf/cohort_waits.py counts the 4 threads' grants each wait
# of the other waited for: exactly, from the tokens' ticket numbers, and within its start and
# grant times.
lockctl --json bench --threads 4 --locks 1 --duration 5 --token \
  --timeline "$out/cohort-local.timeline" >"$out/cohort-local.json" &
cohort_local_pid=$!
lockctl --json bench --threads 1 --locks 1 --duration 5 --token \
  --timeline "$out/cohort-remote.timeline" >"$out/cohort-remote.json" &
cohort_remote_pid=$!
wait "$cohort_local_pid"
wait "$cohort_remote_pid"
section "cohort with a remote waiter: $(cat "$out/cohort-local.json" "$out/cohort-remote.json" | tr '\n' ' ' | cut -c1-300)"
python3 "$root/deploy/perf/cohort_waits.py" "$out/cohort-local.timeline" \
  "$out/cohort-remote.timeline" >"$out/cohort-waits.json"
bench many 1 --threads 1 --locks 10000 --batch 8 --duration 5
bench zipf 1 --threads 4 --locks 10000 --keys zipf --zipf-s 0.99 --shared-ratio 0.5 --duration 5
bench openloop 1 --threads 2 --locks 10000 --rate 2000 --duration 5
rss0=$(rss_kb)
lockctl --json bench --threads 1 --locks 1000 --duration 4 --idle-sessions 256 \
  >"$out/sessions.json" &
spid=$!
sleep 3
rss1=$(rss_kb)
wait "$spid"

# Memory windows (the default) against shared rkeys (memory_windows: false), a second lockd in the
# same boot; the two are measured alternately, four rounds of 3 s each, so that drift hits both
# alike; the table gives the median of the rounds.
section "memory windows vs shared rkeys"
port2=7472
"$bin/lockd" --address 0.0.0.0 --port "$port2" --state-dir "$state/shared" --memory-windows false \
  --admin-socket "" --metrics-address "" --log-level warn 2>"$state/lockd-shared.log" &
lockd2_pid=$!
trap 'kill -TERM $lockd_pid $lockd2_pid $bare_pid 2>/dev/null
  wait $lockd_pid $lockd2_pid $bare_pid 2>/dev/null' EXIT
for _ in $(seq 1 100); do
  "$bin/lockctl" --server "$ip" --port "$port2" --connect-timeout-ms 500 status >/dev/null 2>&1 && break
  sleep 0.1
done
connect_ms() {  # port -> mean ms of 20 `lockctl status` runs (process start, handshake, one READ)
  local t0 t1
  t0=$(date +%s%N)
  for _ in $(seq 1 20); do "$bin/lockctl" --server "$ip" --port "$1" status >/dev/null; done
  t1=$(date +%s%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f\n", (b - a) / 20 / 1e6 }'
}
rounds="1 2 3 4"
for r in $rounds; do
  for mode in mw shared; do
    p=$port
    [ "$mode" = shared ] && p=$port2
    "$bin/lockctl" --server "$ip" --port "$p" --json bench --threads 1 --locks 10000 --duration 3 \
      >"$out/$mode-unc-$r.json"
    "$bin/lockctl" --server "$ip" --port "$p" --json bench --threads 8 --locks 10000 --duration 3 \
      >"$out/$mode-tput-$r.json"
    connect_ms "$p" >"$out/$mode-connect-$r.txt"
  done
done
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
rounds_of() {  # prefix key [pct] -> one value per round, a line each
  local r
  for r in $rounds; do
    if [ $# = 3 ]; then json_p "$out/$1-$r.json" "$2" "$3"; else json "$out/$1-$r.json" "$2"; fi
  done
}
mw_unc=$(rounds_of mw-unc pair_us p50 | median)
sh_unc=$(rounds_of shared-unc pair_us p50 | median)
mw_acq=$(rounds_of mw-unc acquire_us p50 | median)
sh_acq=$(rounds_of shared-unc acquire_us p50 | median)
mw_tput=$(rounds_of mw-tput pairs_per_s | median)
sh_tput=$(rounds_of shared-tput pairs_per_s | median)
mw_conn=$(cat "$out"/mw-connect-*.txt | median)
sh_conn=$(cat "$out"/shared-connect-*.txt | median)
# Every round, for the spread.
{
  echo "memory windows vs shared rkeys, round by round (uncontended pair p50 us; 8-thread pairs/s):"
  for r in $rounds; do
    printf '  round %s: windows %s us, %s/s; shared %s us, %s/s\n' "$r" \
      "$(json_p "$out/mw-unc-$r.json" pair_us p50)" "$(json "$out/mw-tput-$r.json" pairs_per_s)" \
      "$(json_p "$out/shared-unc-$r.json" pair_us p50)" "$(json "$out/shared-tput-$r.json" pairs_per_s)"
  done
} >"$out/windows-rounds.txt"

# Two shards against one: a second lockd (port 7473, same settings as the first) and two static
# cluster maps; `lockctl --cluster MAP bench` locks names (bench/K) through ClusterClient, so the
# name picks the shard. Alternated, three rounds of 3 s, medians. Both lockds share this one
# machine's CPUs and its one rxe device, so this measures what sharding costs and gains here,
# not what two lock nodes with NICs of their own give.
section "two shards vs one (ClusterClient, names over shards)"
kill -TERM "$lockd2_pid" 2>/dev/null
wait "$lockd2_pid" 2>/dev/null || true
port3=7473
"$bin/lockd" --address 0.0.0.0 --port "$port3" --state-dir "$state/shard-b" \
  --admin-socket "" --metrics-address "" --log-level warn 2>"$state/lockd-shard-b.log" &
lockd2_pid=$!
for _ in $(seq 1 100); do
  "$bin/lockctl" --server "$ip" --port "$port3" --connect-timeout-ms 500 status >/dev/null 2>&1 && break
  sleep 0.1
done
printf 'shards:\n  - {name: a, server: %s, port: %s}\n' "$ip" "$port" >"$out/one-shard.yaml"
printf 'shards:\n  - {name: a, server: %s, port: %s}\n  - {name: b, server: %s, port: %s}\n' \
  "$ip" "$port" "$ip" "$port3" >"$out/two-shards.yaml"
shard_rounds="1 2 3"
for r in $shard_rounds; do
  for k in one-shard two-shards; do
    "$bin/lockctl" --cluster "$out/$k.yaml" --json bench --threads 8 --locks 10000 --duration 3 \
      >"$out/$k-$r.json"
  done
done
one_tput=$(for r in $shard_rounds; do json "$out/one-shard-$r.json" pairs_per_s; done | median)
two_tput=$(for r in $shard_rounds; do json "$out/two-shards-$r.json" pairs_per_s; done | median)
one_p50=$(for r in $shard_rounds; do json_p "$out/one-shard-$r.json" pair_us p50; done | median)
two_p50=$(for r in $shard_rounds; do json_p "$out/two-shards-$r.json" pair_us p50; done | median)
{
  echo "two shards vs one, round by round (8 threads, pairs/s):"
  for r in $shard_rounds; do
    printf '  round %s: one shard %s/s, two shards %s/s\n' "$r" \
      "$(json "$out/one-shard-$r.json" pairs_per_s)" "$(json "$out/two-shards-$r.json" pairs_per_s)"
  done
} >"$out/shard-rounds.txt"

# ---- the table
u=$out/uncontended.1.json
n=$out/uncontended-norec.1.json
ut=$out/uncontended-token.1.json
t=$out/throughput.1.json
m=$out/many.1.json
tn=$out/throughput-norec.1.json
tm=$out/throughput-many.1.json
ta=$out/throughput-async.1.json
one=$out/onelock.1.json
z=$out/zipf.1.json
o=$out/openloop.1.json
# A scenario run in several processes (bench/bare NAME PROCS): pairs/s summed over its
# processes, and RDMA ops per acquisition weighted by each process's pairs/s.
merged() {  # file-prefix -> "pairs_per_s ops_per_acquisition"
  local f p=0 w=0
  for f in "$1".*.json; do
    p=$(awk -v a="$p" -v b="$(json "$f" pairs_per_s)" 'BEGIN { print a + b }')
    w=$(awk -v a="$w" -v b="$(json "$f" rdma_ops_per_pair)" -v r="$(json "$f" pairs_per_s)" \
      'BEGIN { print a + b * r }')
  done
  awk -v w="$w" -v p="$p" 'BEGIN { print p, (p > 0) ? w / p : 0 }'
}
read -r pairs_c ops_c <<<"$(merged "$out/contended")"
read -r pairs_4p ops_4p <<<"$(merged "$out/onelock-4p")"
# Release CASes that missed (a request queued after the grant was seen: one more round trip on
# the handover's path), per acquisition, summed over the processes.
misses_4p=$(for f in "$out"/onelock-4p.*.json; do
  echo "$(json "$f" release_misses) $(json "$f" acquisitions)"
done | awk '{ m += $1; a += $2 } END { printf "%.3f", (a > 0) ? m / a : 0 }')
o4r=$out/onelock-4t-remote.1.json
o4=$out/onelock-4t.1.json
o8=$out/onelock-8t.1.json
# The bare lock's runs.
bu=$out/bare-uncontended.1.json
bt=$out/bare-throughput.1.json
bone=$out/bare-onelock.1.json
b4=$out/bare-onelock-4t.1.json
b8=$out/bare-onelock-8t.1.json
read -r bpairs_c bops_c <<<"$(merged "$out/bare-contended")"
read -r bpairs_4p bops_4p <<<"$(merged "$out/bare-onelock-4p")"
cpu_pct() { awk '{ printf "%.2f", ($2 > 0) ? 100 * $1 / $2 : 0 }' "$out/$1.cpu"; }
cpu_pct_window() { awk '{ printf "%.2f", ($6 > 0) ? 100 * $5 / $6 : 0 }' "$out/$1.cpu"; }

{
  printf '%-58s %12s %12s %8s %12s %8s %s\n' "figure" "rdmalock" "raw" "ratio" "bare" "x bare" \
    "target"
  # The raw column is perftest's figure (or what a section's header says it holds), the bare
  # column the bare lock's in the same scenario; each ratio is rdmalock's figure divided by it.
  # Either is left blank where there is none.
  row() { # label ours raw target [bare]
    awk -v l="$1" -v a="$2" -v r="$3" -v t="$4" -v b="${5:-}" 'BEGIN {
      rs = (r == "") ? sprintf("%12s %8s", "", "") : sprintf("%12.2f %8.2f", r, (r > 0 ? a / r : 0))
      bs = (b == "") ? sprintf("%12s %8s", "", "") : sprintf("%12.2f %8.2f", b, (b > 0 ? a / b : 0))
      printf "%-58s %12.2f %s %s %s\n", l, a, rs, bs, t }'
  }
  row "uncontended pair p50 us (acquire+release) vs FA median" "$(json_p "$u" pair_us p50)" "$fa_med" "<= 1.1" \
    "$(json_p "$bu" pair_us p50)"
  row "uncontended pair p99 us vs FA p99" "$(json_p "$u" pair_us p99)" "$fa_p99" "<= 1.5" \
    "$(json_p "$bu" pair_us p99)"
  row "uncontended acquire p50 us vs FA median" "$(json_p "$u" acquire_us p50)" "$fa_med" "(one FA)" \
    "$(json_p "$bu" acquire_us p50)"
  row "  same, --no-records: acquire p50 us" "$(json_p "$n" acquire_us p50)" "$fa_med" "" \
    "$(json_p "$bu" acquire_us p50)"
  row "  same, --no-records: pair p50 us" "$(json_p "$n" pair_us p50)" "$fa_med" "" \
    "$(json_p "$bu" pair_us p50)"
  row "throughput 8 threads, pairs/s vs ib_atomic_bw ops/s" "$(json "$t" pairs_per_s)" \
    "$(awk -v m="$bw_mpps" 'BEGIN { print m * 1e6 }')" ">= 0.45" \
    "$(json "$bt" pairs_per_s)"
  row "  same, --no-records: pairs/s vs ib_atomic_bw ops/s" "$(json "$tn" pairs_per_s)" \
    "$(awk -v m="$bw_mpps" 'BEGIN { print m * 1e6 }')" "" \
    "$(json "$bt" pairs_per_s)"
  row "  same, 4 threads x acquire_many 8: locks/s vs ib_atomic_bw" "$(json "$tm" locks_per_s)" \
    "$(awk -v m="$bw_mpps" 'BEGIN { print m * 1e6 }')" ">= 0.45"
  row "  same, 2 threads x 16 async in flight: pairs/s vs ib_atomic_bw" "$(json "$ta" locks_per_s)" \
    "$(awk -v m="$bw_mpps" 'BEGIN { print m * 1e6 }')" ">= 0.45"
  row "contended 2x4 on one lock: handovers/s vs 1/(FA+READ)" "$pairs_c" \
    "$(awk -v f="$fa_med" -v r="$rd_med" 'BEGIN { print 1e6 / (f + r) }')" ">= 1.0" \
    "$bpairs_c"
  row "  ceiling here: 1 thread alone on one lock, pairs/s" "$(json "$one" pairs_per_s)" \
    "$(awk -v f="$fa_med" -v r="$rd_med" 'BEGIN { print 1e6 / (f + r) }')" "" \
    "$(json "$bone" pairs_per_s)"
  row "contended: RDMA ops per acquisition" "$ops_c" "" "<= 6" "$bops_c"
  row "acquire_many of 8 locks: acquire p50 us vs FA median" "$(json_p "$m" acquire_us p50)" "$fa_med" "<= 1.5"
  row "  same vs 8 FAs at ib_atomic_bw's rate (us)" "$(json_p "$m" acquire_us p50)" \
    "$(awk -v m="$bw_mpps" 'BEGIN { print 8 / m }')" ""
  row "  same: release_many p50 us vs FA median" "$(json_p "$m" release_us p50)" "$fa_med" ""
  row "uncontended release p50 us (posted) vs FA median" "$(json_p "$u" release_us p50)" "$fa_med" "(caller's cost)" \
    "$(json_p "$bu" release_us p50)"
  row "zipf 0.99, 4 threads, 50% shared: pair p50 us vs FA median" "$(json_p "$z" pair_us p50)" "$fa_med" ""
  row "open loop 2000/s, 2 threads: pair p99 us vs FA p99" "$(json_p "$o" pair_us p99)" "$fa_p99" ""
  for s in uncontended throughput contended many; do
    printf '%-58s %12s %12s %8s %12s %8s %s\n' "lockd CPU, % of a 3 s window of $s's data path" \
      "$(cpu_pct_window "$s")" "" "" "" "" "< 1"
    printf '%-58s %12s\n' "  whole run incl. connection set-up (user / sys ms)" \
      "$(cpu_pct "$s") ($(awk '{ print $3 " / " $4 }' "$out/$s.cpu"))"
  done
  awk -v a="$rss0" -v b="$rss1" 'BEGIN {
    printf "%-58s %12.1f %12s %8s %12s %8s %s\n",
      "lockd memory growth per connection, KiB (256 sessions)", (b - a) / 256, "", "", "", "", "< 64" }'
  printf '%-58s %12s %12s %8s\n' "memory windows (rdmalock) vs shared rkeys (raw column)" \
    "windows" "shared" "ratio"
  row "  uncontended pair p50 us (median of 4 alternating runs)" "$mw_unc" "$sh_unc" "~1.0"
  row "  uncontended acquire p50 us" "$mw_acq" "$sh_acq" "~1.0"
  row "  throughput 8 threads, pairs/s" "$mw_tput" "$sh_tput" "~1.0"
  row "  lockctl status incl. connect, ms each (median of 4 x 20)" "$mw_conn" "$sh_conn" ""
  printf '%-58s %12s %12s %8s\n' "two shards (rdmalock) vs one shard (raw column)" \
    "two" "one" "ratio"
  row "  throughput 8 threads, pairs/s (median of 3 alternating)" "$two_tput" "$one_tput" ""
  row "  pair p50 us, 8 threads" "$two_p50" "$one_p50" ""
  # Issue 19's targets against the bare lock. Where the raw column holds another rdmalock figure,
  # the label says which.
  printf '%-58s\n' "against the bare ticket lock (same boot; x bare = rdmalock / bare)"
  row "  uncontended pair p50 us, defaults" "$(json_p "$u" pair_us p50)" "" "<= 1.6 x bare" \
    "$(json_p "$bu" pair_us p50)"
  row "  uncontended pairs/s, defaults" "$(json "$u" pairs_per_s)" "" ">= 0.6 x bare" \
    "$(json "$bu" pairs_per_s)"
  row "  uncontended pair p50 us, --no-records" "$(json_p "$n" pair_us p50)" "" "<= 1.1 x bare" \
    "$(json_p "$bu" pair_us p50)"
  row "  uncontended pairs/s, --no-records" "$(json "$n" pairs_per_s)" "" ">= 0.9 x bare" \
    "$(json "$bu" pairs_per_s)"
  row "  uncontended acquire p50 us, defaults" "$(json_p "$u" acquire_us p50)" "" "<= 1.3 x bare" \
    "$(json_p "$bu" acquire_us p50)"
  row "  uncontended acquire p50 us, --no-records" "$(json_p "$n" acquire_us p50)" "" "" \
    "$(json_p "$bu" acquire_us p50)"
  row "  RDMA ops per uncontended exclusive pair, defaults" "$(json "$u" rdma_ops_per_pair)" "" \
    "<= 3" "$(json "$bu" rdma_ops_per_pair)"
  row "  same, --no-records" "$(json "$n" rdma_ops_per_pair)" "" "" \
    "$(json "$bu" rdma_ops_per_pair)"
  # The SDK's LockOptions defaults: a fencing token with every exclusive grant.
  row "  uncontended pair p50 us, with fencing tokens (SDK default)" "$(json_p "$ut" pair_us p50)" \
    "" "" "$(json_p "$bu" pair_us p50)"
  row "  same: pairs/s" "$(json "$ut" pairs_per_s)" "" "" "$(json "$bu" pairs_per_s)"
  row "  same: RDMA ops per pair" "$(json "$ut" rdma_ops_per_pair)" "" "" \
    "$(json "$bu" rdma_ops_per_pair)"
  row "  1 thread alone on one lock, pairs/s" "$(json "$one" pairs_per_s)" "" "" \
    "$(json "$bone" pairs_per_s)"
  row "  4 threads x 1 process, one lock, pairs/s (raw: 1 thread)" "$(json "$o4" pairs_per_s)" \
    "$(json "$one" pairs_per_s)" ">= 1.5 x 1 thread" "$(json "$b4" pairs_per_s)"
  row "    RDMA ops per acquisition" "$(json "$o4" rdma_ops_per_pair)" "" "<= 1" \
    "$(json "$b4" rdma_ops_per_pair)"
  row "  8 threads x 1 process, one lock, pairs/s (raw: 1 thread)" "$(json "$o8" pairs_per_s)" \
    "$(json "$one" pairs_per_s)" ">= 1.5 x 1 thread" "$(json "$b8" pairs_per_s)"
  row "    RDMA ops per acquisition" "$(json "$o8" rdma_ops_per_pair)" "" "<= 1" \
    "$(json "$b8" rdma_ops_per_pair)"
  row "  4 processes x 1 thread, one lock, pairs/s vs bare 4 threads" "$pairs_4p" "" \
    ">= 1.0 x bare" "$(json "$b4" pairs_per_s)"
  row "    same vs bare 4 processes x 1 thread" "$pairs_4p" "" "" "$bpairs_4p"
  row "    RDMA ops per acquisition" "$ops_4p" "" "<= 5" "$bops_4p"
  row "    release CASes that missed, per acquisition" "$misses_4p" "" "" ""
  row "    the guest's CPU idle over 3 s of the run, %" "$(cat "$out/onelock-4p.idle")" "" "" \
    "$(cat "$out/bare-onelock-4p.idle")"
  row "  4 threads x 1 process, each queueing at lockd (--no-local-handover), pairs/s" \
    "$(json "$o4r" pairs_per_s)" "" "" "$(json "$b4" pairs_per_s)"
  row "    RDMA ops per acquisition" "$(json "$o4r" rdma_ops_per_pair)" "" "" \
    "$(json "$b4" rdma_ops_per_pair)"
  row "    the guest's CPU idle over 3 s of the run, %" "$(cat "$out/onelock-4t-remote.idle")" "" \
    "" "$(cat "$out/bare-onelock-4t.idle")"
  cl=$out/cohort-local.json
  cr=$out/cohort-remote.json
  row "  4 threads of one process + 1 of another, one lock: pairs/s" \
    "$(json "$cl" pairs_per_s)" "" "(4 threads)"
  row "    local handovers per acquisition of the 4 threads" \
    "$(awk -v h="$(json "$cl" local_handovers)" -v a="$(json "$cl" acquisitions)" \
      'BEGIN { print (a > 0) ? h / a : 0 }')" "" ""
  row "    the other process: pairs/s, acquire p50 us" "$(json "$cr" pairs_per_s)" \
    "$(json_p "$cr" acquire_us p50)" ""
  row "    its longest acquire us (raw: the 4 threads' us per grant)" \
    "$(json_p "$cr" acquire_us max)" \
    "$(awk -v p="$(json "$cl" pairs_per_s)" 'BEGIN { print (p > 0) ? 1e6 / p : 0 }')" \
    "~ 9 grants + its turn"
  # The bound in grants rather than time (a stalled vCPU stretches one grant, not the count),
  # counted wait by wait (cohort_waits.py): exactly, the 4 threads' grants on the remote grant
  # just before the other's ticket (fencing tokens number them), at most 9; and by the clocks,
  # their grants between the other's start and its grant, which adds those made while its
  # FETCH_AND_ADD was on its way to lockd.
  cw=$out/cohort-waits.json
  row "    the 4 threads' grants one wait of the other waits for: max" "$(json "$cw" exact_max)" \
    "" "<= 9"
  printf '%-58s %12s\n' "      p99 / mean / waits over 9 / waits counted" \
    "$(json "$cw" exact_p99) / $(json "$cw" exact_mean) / $(json "$cw" exact_over_9) / $(json "$cw" waits)"
  printf '%-58s %12s\n' "      by the clocks (incl. its FA's flight): max / p99 / mean" \
    "$(json "$cw" clock_max) / $(json "$cw" clock_p99) / $(json "$cw" clock_mean)"
  row "    the 4 threads' own longest acquire us (the VM's stalls)" \
    "$(json_p "$cl" acquire_us max)" "" ""
  printf '%s\n' "the SDK's own cost on the host CPU, outside the VM (tests/bench/sdk_microbench;" \
    "target: SDK beyond the backend's own work <= 150 ns per uncontended pair)"
  sed 's/^/  /' "$out/sdk_microbench.txt"
} | tee "$out/table.txt"
cat "$out/windows-rounds.txt" "$out/shard-rounds.txt"

{
  printf '{"raw":{"fa_median_us":%s,"fa_p99_us":%s,"read8_median_us":%s,"atomic_bw_mpps":%s},' \
    "$fa_med" "$fa_p99" "$rd_med" "$bw_mpps"
  printf '"lockd_rss_kb":{"before_sessions":%s,"with_256_sessions":%s},' "$rss0" "$rss1"
  printf '"runs":{'
  first=1
  for f in "$out"/*.json; do
    case $(basename "$f") in perf.json) continue ;; esac
    [ $first = 1 ] || printf ','
    first=0
    printf '"%s":%s' "$(basename "$f" .json)" "$(cat "$f")"
  done
  printf '}}\n'
} >"$out/perf.json"
echo "perf: table in $out/table.txt, every measurement in $out/perf.json" >&2

# ---- the CDF of the uncontended pair latency: rdmalock with its defaults, with --no-records, and
# the bare lock (1 thread, 10,000 locks, same boot), from each run's pair_quantiles_us (the minimum,
# every percent, p99.5, p99.9, p99.99 and the maximum). The data and the gnuplot script stay in
# OUT_DIR next to the PNG. No gnuplot, or a gnuplot that fails, leaves no plot and says so.
# Called after perf.json is written, and in a condition, so that nothing here can stop the suite.
cdf_data() {  # json dat
  python3 -c 'import json, sys
for q, us in json.load(open(sys.argv[1]))["pair_quantiles_us"]:
    print(q, us)' "$1" >"$2"
}
plot_cdf() {
  command -v gnuplot >/dev/null || return 1
  cdf_data "$u" "$out/cdf-rdmalock.dat" || return 1
  cdf_data "$n" "$out/cdf-rdmalock-norec.dat" || return 1
  cdf_data "$bu" "$out/cdf-bare.dat" || return 1
  local term="png size 960,600"
  gnuplot -e 'set terminal' 2>/dev/null | grep -q pngcairo && term="pngcairo size 960,600 font ',10'"
  cat >"$out/pair-cdf.gp" <<EOF
set terminal $term
set output "$out/pair-cdf.png"
set title "Uncontended acquire+release latency, 1 thread, 10,000 locks, exclusive (one boot, $dev)"
set xlabel "pair latency, us (log scale)"
set ylabel "fraction of pairs at or below"
set logscale x
set grid xtics mxtics ytics
set key bottom right
set yrange [0:1]
plot "$out/cdf-bare.dat" using 2:1 with lines lw 2 title "bare ticket lock (p50 $(json_p "$bu" pair_us p50) us)", \\
     "$out/cdf-rdmalock-norec.dat" using 2:1 with lines lw 2 title "rdmalock --no-records (p50 $(json_p "$n" pair_us p50) us)", \\
     "$out/cdf-rdmalock.dat" using 2:1 with lines lw 2 title "rdmalock defaults (p50 $(json_p "$u" pair_us p50) us)"
EOF
  gnuplot "$out/pair-cdf.gp"
}
if plot_cdf; then
  echo "perf: CDF of the uncontended pair latency in $out/pair-cdf.png" >&2
else
  echo "perf: no CDF plot (gnuplot missing or failed); data in $out/cdf-*.dat" >&2
fi
