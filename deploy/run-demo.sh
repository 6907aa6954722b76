#!/usr/bin/env bash
# The main job: builds rdmalock and runs lockd plus clients on Soft-RoCE (rdma_rxe), natively
# where this kernel has RDMA, else inside the Soft-RoCE VM. It shows lockctl status, a client
# without lockd's key refused, a lock held by one process as seen from another, and benchmark figures next to the raw verbs latency
# (ib_atomic_lat) measured in the same boot. With --cluster it then runs etcd and three lockds
# in two shards, one with a standby, and kills a primary (deploy/run-cluster-demo.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

if [ "${1:-}" != "--inside" ]; then
  cluster=()
  case "${1:-}" in
    --cluster) cluster=(--cluster) ;;
    "") ;;
    *) echo "usage: $0 [--cluster]   (--cluster: also shards and failover with etcd)" >&2; exit 64 ;;
  esac
  "$root/deploy/install-deps.sh"
  cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$root/build" -j "$(nproc)" --target lockd lockctl
  cd "$root"
  exec "$root/deploy/softroce/rxe-run" --timeout 600 -- "$root/deploy/run-demo.sh" --inside \
    "${cluster[@]}"
fi
with_cluster=${2:-}

# ---- inside: rdma_rxe is up, RXE_IP is the address rdma_cm reaches it by.
bin="$root/build"
ip=${RXE_IP:?RXE_IP not set: run through deploy/softroce/rxe-run}
port=7471
state=$(mktemp -d)
lockctl() { "$bin/lockctl" --server "$ip" --port "$port" "$@"; }
section() { printf '\n=== %s\n' "$*"; }
# shellcheck source=deploy/lib.sh
. "$root/deploy/lib.sh"

section "RDMA device"
ibv_devinfo -d "${RXE_DEV:-rxe0}" -v | grep -E 'hca_id|transport|atomic_cap|max_qp_rd_atom' || true

section "raw verbs baseline: ib_atomic_lat FETCH_AND_ADD (same boot)"
ib_atomic_lat -d "${RXE_DEV:-rxe0}" -A FETCH_AND_ADD -n 5000 -F >/dev/null 2>&1 &
srv=$!
sleep 1
ib_atomic_lat -d "${RXE_DEV:-rxe0}" -A FETCH_AND_ADD -n 5000 -F "$ip" >"$state/atomic_lat.txt" 2>&1 || true
wait "$srv" 2>/dev/null || true
grep -E '^ *#bytes|^ *8 ' "$state/atomic_lat.txt" || { cat "$state/atomic_lat.txt"; exit 1; }
raw_typical=$(awk '$1 == 8 && NF >= 5 { print $5; exit }' "$state/atomic_lat.txt")

section "start lockd (1,048,576 locks; clients must prove a shared key)"
(umask 077 && "$bin/lockctl" keygen >"$state/lockd.key")
export RDMALOCK_AUTH_KEY_FILE=$state/lockd.key  # every client below finds the key here
start_lockd "$state/lockd.log" --lock-count 1048576 --state-dir "$state" \
  --auth-key-file "$state/lockd.key"
sed 's/^/  lockd: /' "$state/lockd.log"

section "lockctl status"
lockctl status

section "authentication: a client without the key gets no rkey"
set +e
env -u RDMALOCK_AUTH_KEY_FILE "$bin/lockctl" --server "$ip" --port "$port" status 2>&1 |
  sed 's/^/  [no key] /'
set -e
grep 'rejected connection from' "$state/lockd.log" | tail -1 | sed 's/^/  lockd: /'

section "a lock held by one process, seen from another"
lockctl acquire demo/orders -- sh -c 'echo "  [holder] running with $RDMALOCK_NAME (slot $RDMALOCK_SLOT, token $RDMALOCK_TOKEN)"; sleep 3' &
holder=$!
sleep 1.5
lockctl inspect demo/orders
set +e
lockctl acquire --timeout 300ms demo/orders -- true 2>&1 | sed 's/^/  [other] /'
rc=${PIPESTATUS[0]}
set -e
echo "  [other] lockctl acquire --timeout 300ms exited $rc (75 = not granted in time)"
wait "$holder"
lockctl acquire --timeout 1s demo/orders -- sh -c 'echo "  [other] got demo/orders after the holder finished"'

section "contended workload: 4 threads on one lock, 30% shared"
lockctl bench --threads 4 --locks 1 --duration 3 --shared-ratio 0.3

section "lockd's metrics (Prometheus text at http://127.0.0.1:9477/metrics) move during a bench"
metrics() { curl -sf --max-time 5 http://127.0.0.1:9477/metrics; }
watch='^rdmalock_lockd_(sessions_connected|handshakes_accepted_total|connections_joined_total|lock_requests_total|locks_held|lock_waiters|locks_contended|sessions_ended_total\{reason="disconnected"\})'
metrics >"$state/metrics-0.txt"
lockctl bench --threads 4 --locks 4 --duration 8 >"$state/bench-metrics.txt" &
bench=$!
sleep 1.5
# top reads the whole table (16 MiB here) twice; on rdma_rxe that takes a few seconds.
echo "  lockctl top during the bench (one 500 ms refresh):"
lockctl top --iterations 1 --interval-ms 500 -n 5 | sed 's/^/    /'
metrics >"$state/metrics-1.txt"
wait "$bench"
metrics >"$state/metrics-2.txt"
echo "  before / during / after the bench:"
# (no process substitution: the VM has no /dev/fd)
for i in 0 1 2; do grep -E "$watch" "$state/metrics-$i.txt" >"$state/m$i.txt"; done
awk '{ print $2 }' "$state/m1.txt" >"$state/m1v.txt"
awk '{ print $2 }' "$state/m2.txt" >"$state/m2v.txt"
paste "$state/m0.txt" "$state/m1v.txt" "$state/m2v.txt" |
  awk '{ printf "    %-62s %10s %10s %10s\n", $1, $2, $3, $4 }'
grep -E '^(acquisitions|sdk histogram)' "$state/bench-metrics.txt" | sed 's/^/  bench: /'

section "lockctl bench: 1 thread, 10,000 locks, uncontended exclusive"
lockctl bench --threads 1 --locks 10000 --duration 5 | tee "$state/bench.txt"
lockctl --json bench --threads 1 --locks 10000 --duration 5 >"$state/bench.json"
p50=$(sed -n 's/.*"acquire_us":{"p50":\([0-9.]*\).*/\1/p' "$state/bench.json")
echo "  the same without request records (--no-records: lockd could not free these locks at once"
echo "  if this process died; on rdma_rxe each record WRITE costs about as much as an atomic):"
lockctl --json bench --threads 1 --locks 10000 --duration 5 --no-records >"$state/bench-norec.json"
p50_norec=$(sed -n 's/.*"acquire_us":{"p50":\([0-9.]*\).*/\1/p' "$state/bench-norec.json")

section "lockd resources"
rss_kb=$(awk '/^VmRSS/ { print $2 }' "/proc/$lockd_pid/status")
cpu_ticks=$(awk '{ print $14 + $15 }' "/proc/$lockd_pid/stat")
echo "lockd resident memory: $((rss_kb / 1024)) MiB ($rss_kb KiB) with 1,048,576 locks"
echo "lockd CPU time so far: $((cpu_ticks * 1000 / $(getconf CLK_TCK))) ms"

section "acquire latency vs raw FETCH_AND_ADD (same boot)"
awk -v a="$p50" -v n="$p50_norec" -v r="$raw_typical" 'BEGIN {
  printf "  ib_atomic_lat FA typical:                  %8.2f us\n", r
  printf "  rdmalock acquire p50, with records:        %8.2f us", a
  if (r > 0) printf "   ratio %5.2f x", a / r
  printf "\n  rdmalock acquire p50, without records:     %8.2f us", n
  if (r > 0) printf "   ratio %5.2f x", n / r
  printf "\n"
}'

section "stop lockd (SIGTERM)"
kill -TERM "$lockd_pid"
wait "$lockd_pid"
trap - EXIT
tail -n 2 "$state/lockd.log" | sed 's/^/  lockd: /'

if [ "$with_cluster" = --cluster ]; then
  "$root/deploy/run-cluster-demo.sh"
fi
