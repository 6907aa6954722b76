#!/usr/bin/env bash
# The main job's cluster part (deploy/run-demo.sh --cluster runs it in the same boot, after the
# single-lockd part): etcd, and three lockds on this host's rdma_rxe, two shards of which shard a
# has a standby. Shows the map and the primaries, names spread over the shards, a lock held on
# shard a while its primary is killed (kill -9), the standby taking over after its grace, and the
# new fencing tokens leading with the new epoch. Runs where run-demo.sh runs (RXE_IP set).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build"
ip=${RXE_IP:?RXE_IP not set: run through deploy/run-demo.sh --cluster}
state=$(mktemp -d)
section() { printf '\n=== %s\n' "$*"; }
etcd_url=http://127.0.0.1:23790
ctl() { "$bin/lockctl" --etcd "$etcd_url" --etcd-cluster demo "$@"; }
# Clients and lockds share one key (run-demo.sh's, or a new one).
if [ -z "${RDMALOCK_AUTH_KEY_FILE:-}" ]; then
  (umask 077 && "$bin/lockctl" keygen >"$state/lockd.key")
  export RDMALOCK_AUTH_KEY_FILE=$state/lockd.key
fi
pids=()
cleanup() { kill -TERM "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT

section "cluster: etcd (Debian's etcd-server) on 127.0.0.1:23790"
etcd --name demo --data-dir "$state/etcd" --listen-client-urls "$etcd_url" \
  --advertise-client-urls "$etcd_url" --listen-peer-urls http://127.0.0.1:23800 \
  --initial-advertise-peer-urls http://127.0.0.1:23800 \
  --initial-cluster demo=http://127.0.0.1:23800 >"$state/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 60); do ctl cluster init a,b >/dev/null 2>&1 && break; sleep 0.5; done
ctl cluster init a,b | sed 's/^/  /'

# lockd NAME SHARD PORT: a cluster-mode lockd (etcd lease TTL 2 s, lease 1 s: grace 3 s).
lockd() {
  "$bin/lockd" --address "$ip" --port "$3" --etcd "$etcd_url" --cluster demo --shard "$2" \
    --etcd-lease-ttl-s 2 --lease-ms 1000 --heartbeat-interval-ms 100 \
    --heartbeat-timeout-ms 1000 --state-dir "" --admin-socket "" --metrics-address "" \
    --auth-key-file "$RDMALOCK_AUTH_KEY_FILE" 2>"$state/$1.log" &
}
section "three lockds: a1 (shard a), b1 (shard b), then a2 (shard a's standby)"
lockd a1 a 7481
a1=$!
pids+=("$a1")
lockd b1 b 7483
pids+=($!)
sleep 1
lockd a2 a 7482
pids+=($!)
up=0
for _ in $(seq 1 50); do
  ctl --shard a status >/dev/null 2>&1 && ctl --shard b status >/dev/null 2>&1 && { up=1; break; }
  sleep 0.2
done
if [ "$up" = 0 ]; then
  echo "the cluster did not come up; lockd logs:" >&2
  cat "$state"/*.log >&2
  exit 1
fi
grep -h "primary of shard\|standby for shard" "$state"/a1.log "$state"/b1.log "$state"/a2.log |
  sed 's/ \[won_mono_ns=[0-9]*\]//; s/^/  /'
ctl cluster | sed 's/^/  /'

section "names spread over the shards: lockctl bench over the cluster (4 threads, 2 s)"
ctl bench --threads 4 --locks 1000 --duration 2 | sed 's/^/  /'

section "a lock on shard a, held while a1 (its primary) is killed with kill -9"
name=demo/orders
for k in $(seq 1 50); do  # a name that shard a owns
  ctl inspect "demo/orders-$k" 2>/dev/null | grep -q "^shard  *a$" && { name=demo/orders-$k; break; }
done
ctl acquire "$name" -- sh -c 'echo "  [holder] $RDMALOCK_NAME held, token $RDMALOCK_TOKEN (epoch $((RDMALOCK_TOKEN >> 48)))"; sleep 30' &
holder=$!
sleep 2
t0=$(date +%s%N)
{ kill -9 "$a1" && wait "$a1"; } 2>/dev/null || true
echo "  a1 killed"
set +e
wait "$holder"
echo "  [holder] lockctl exited $? (76: the lock was lost, and the command was stopped)"
set -e
for _ in $(seq 1 50); do ctl --shard a status >/dev/null 2>&1 && break; sleep 0.2; done
ctl acquire "$name" -- sh -c 'echo "  [after] $RDMALOCK_NAME held again, token $RDMALOCK_TOKEN (epoch $((RDMALOCK_TOKEN >> 48)))"'
t1=$(date +%s%N)
echo "  from the kill to the lock held again through the standby: $(((t1 - t0) / 1000000)) ms" \
  "(etcd TTL 2 s + grace 3 s = lease 1 s + TTL)"
grep -h "primary of shard a (epoch 2)" "$state/a2.log" | sed 's/ \[won_mono_ns=[0-9]*\]//; s/^/  a2: /'
ctl cluster | sed 's/^/  /'
