#!/bin/bash
# Two-host fault tests: lockd in one VM ("server"), clients in the other ("client"), joined by a
# virtual wire. Run through the harness, which starts this script in both VMs:
#
#   deploy/softroce/rxe-run --vms 2 --share OUT -- tests/twohost/run.sh OUT [BUILD_DIR]
#
# The server side runs lockd and restarts it (kill -9) when the client side asks, through files in
# OUT (the share both VMs see). The client side runs the scenarios, each checked by rdma_history's
# history checker over every grant it recorded:
#   1. netem: 5% packet loss and 1 ms delay on the client VM for a whole contended workload;
#   2. lockd kill -9 and restart under load (clients reconnect; tokens keep increasing);
#   3. a client killed while holding (freed well before F x L).
# The client prints one line per check, "twohost: <check>: ok|FAIL ...", and exits non-zero if any
# failed.
set -u
out=${1:?usage: run.sh OUT_DIR [BUILD_DIR]}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${2:-$root/build}
# shellcheck source=tests/vm-lib.sh
. "$root/tests/vm-lib.sh"
port=7471
lease_ms=1000

server() {
  local state=/tmp/lockd-state lp stop=0
  mkdir -p "$state"
  start_lockd() {
    "$build/lockd" --address "$RXE_IP" --port "$port" --lease-ms "$lease_ms" \
      --heartbeat-interval-ms 100 --heartbeat-timeout-ms 1000 --state-dir "$state" \
      --admin-socket /tmp/lockd.sock --log-level info >>"$out/lockd.log" 2>&1 &
    lp=$!
  }
  trap 'stop=1' TERM
  start_lockd
  echo "$lp" >"$out/server.ready"
  local n=1
  while [ "$stop" = 0 ]; do
    if [ -f "$out/cmd.$n" ]; then
      case $(cat "$out/cmd.$n") in
        restart)
          kill -9 "$lp"
          wait "$lp" 2>/dev/null
          echo "lockd killed (kill -9) and started again" >>"$out/lockd.log"
          start_lockd
          ;;
      esac
      echo "done" >"$out/ack.$n"
      n=$((n + 1))
    fi
    sleep 0.1
  done
  kill -TERM "$lp" 2>/dev/null
  wait "$lp" 2>/dev/null
  exit 0
}

workload() {  # workload PREFIX PROCESSES SECONDS
  local pids=() i
  for i in $(seq 1 "$2"); do
    "$build/tests/rdma_history" run --server "$RXE_PEER_IP" --port "$port" --out "$out/$1.$i" \
      --threads 4 --locks 2 --seconds "$3" --shared-ratio 0.2 --hold-us 500 \
      --timeout-ms 10000 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

client() {
  lctl() { "$build/lockctl" --server "$RXE_PEER_IP" --port "$port" "$@"; }
  wait_file "$out/server.ready" 120 || { echo "twohost: server never became ready"; exit 1; }
  local i=0
  until lctl status >/dev/null 2>&1; do
    i=$((i + 1))
    [ "$i" -gt 60 ] && { echo "twohost: lockd unreachable"; exit 1; }
    sleep 1
  done
  echo "twohost: lockd at $RXE_PEER_IP reachable from $RXE_IP"

  # 1. Packet loss and delay on the client's side of the wire, for the whole workload.
  if ! tc qdisc add dev eth0 root netem delay 1ms loss 5%; then
    echo "twohost: netem could not be set up: no loss or delay to test under: FAIL"
    exit 1
  fi
  workload netem 2 15
  local wl=$?
  tc qdisc del dev eth0 root
  summaries netem
  local check
  check=$("$build/tests/rdma_history" check "$out"/netem.*)
  local rc=$?
  echo "  $check"
  # Every acquisition completes or fails with a named error; timeouts are the only failures a
  # healthy lockd should give under loss (a 10 s timeout that expired).
  local unexpected
  unexpected=$(grep -h '^E ' "$out"/netem.* | grep -vc '^E timeout ')
  verdict twohost "netem 5% loss + 1 ms delay, 2 processes x 4 threads on 2 locks for 15 s" \
    $((rc + wl + unexpected)) "($check; $unexpected unexpected errors)"

  # 2. lockd kill -9 and restart under load.
  workload restart 2 16 &
  local wpid=$!
  sleep 5
  echo restart >"$out/cmd.1"
  wait_file "$out/ack.1" 30
  wait "$wpid"
  wl=$?
  summaries restart
  check=$("$build/tests/rdma_history" check "$out"/restart.*)
  rc=$?
  echo "  $check"
  local lost
  lost=$(grep -h '^S ' "$out"/restart.* | grep -c 'sessions_lost=1')
  [ "$lost" -eq 2 ] || rc=1  # both processes lost their session once, and carried on
  local gap
  gap=$(echo "$check" | sed -n 's/.*longest gap between grants \([0-9.]*\) ms.*/\1/p')
  echo "  lockd restart under load: clients serving again ${gap} ms after their last grant before" \
    "the kill -9 (restart grace = one lease = $lease_ms ms)"
  verdict twohost "lockd kill -9 + restart under load (grace = lease $lease_ms ms)" $((rc + wl)) \
    "($check; $lost of 2 processes saw their session end and reconnected)"

  # 3. A client killed while holding.
  # lockctl itself in the background, not the lctl function (its $! would be a subshell's, and
  # the kill -9 below would leave lockctl holding).
  "$build/lockctl" --server "$RXE_PEER_IP" --port "$port" acquire victim -- sleep 120 &
  local holder=$!
  i=0
  until lctl --json inspect victim 2>/dev/null | grep -q '"status":"holding"'; do
    i=$((i + 1))
    [ "$i" -gt 100 ] && break
    sleep 0.1
  done
  local line
  line=$("$build/tests/rdma_history" killwait --server "$RXE_PEER_IP" --port "$port" --name victim \
    --pid "$holder")
  rc=$?
  wait "$holder" 2>/dev/null
  verdict twohost "client killed while holding" $rc "($line)"

  echo "twohost: $fails check(s) failed"
  [ "$fails" -eq 0 ]
}

case "${RXE_ROLE:-}" in
  server) server ;;
  client) client ;;
  *)
    echo "run.sh: RXE_ROLE is not set: run it through deploy/softroce/rxe-run --vms 2" >&2
    exit 2
    ;;
esac
