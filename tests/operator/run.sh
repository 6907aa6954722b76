#!/bin/bash
# lockd's operator paths on real verbs, with lockd built under AddressSanitizer+UBSan:
#
#   deploy/softroce/rxe-run --timeout 600 -- tests/operator/run.sh "$PWD/build-asan"
#
# What an operator, a local user or a misbehaving peer can do to lockd from outside the lock
# protocol: forced releases, the admin socket, the metrics endpoint, running out of descriptors.
# Each check names the finding of issue 17 it covers. lockd must survive every one of them,
# answer afterwards, and its log must show no sanitizer report. Prints one line per check,
# "operator: <check>: ok" or "operator: <check>: FAIL <why>", then "operator: N passed, M failed",
# and exits non-zero if anything failed or could not run.
set -u
build=${1:?usage: run.sh BUILD_DIR (a build with lockd and lockctl)}
ip=${RXE_IP:?RXE_IP is not set: run this through deploy/softroce/rxe-run}
port=7490
metrics_port=9490
work=$(mktemp -d /tmp/operator-test.XXXXXX)
log=$work/lockd.log
sock=$work/admin.sock
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
lockctl="$build/lockctl --server $ip --port $port"
ok=0
bad=0
pass() { echo "operator: $1: ok"; ok=$((ok + 1)); }
fail() { echo "operator: $1: FAIL $2"; bad=$((bad + 1)); }

lockd_pid=
bg_pids=()
stop_lockd() {
  [ -n "$lockd_pid" ] || return 0
  kill -TERM "$lockd_pid" 2>/dev/null
  wait "$lockd_pid" 2>/dev/null
  lockd_pid=
}
cleanup() {
  for p in "${bg_pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  stop_lockd
  rm -rf "$work"
}
trap cleanup EXIT

for f in "$build/lockd" "$build/lockctl"; do
  [ -x "$f" ] || { echo "operator: $f is missing: build first"; exit 1; }
done
key=$work/lockd.key
(umask 077 && "$build/lockctl" keygen >"$key") || { echo "operator: lockctl keygen failed"; exit 1; }
export RDMALOCK_AUTH_KEY_FILE=$key

start_lockd() {
  "$build/lockd" --address "$ip" --port "$port" --lock-count 1024 --lease-ms 2000 \
    --state-dir "$work/state" --admin-socket "$sock" --metrics-address "127.0.0.1:$metrics_port" \
    --log-level info --auth-key-file "$key" "$@" >>"$log" 2>&1 &
  lockd_pid=$!
  local i=0
  until $lockctl status >/dev/null 2>&1; do
    if ! kill -0 "$lockd_pid" 2>/dev/null; then
      echo "operator: lockd exited during start-up:"; cat "$log"; exit 1
    fi
    i=$((i + 1))
    [ "$i" -gt 150 ] && { echo "operator: lockd did not answer within 30 s:"; cat "$log"; exit 1; }
    sleep 0.2
  done
}

# lockd is alive, answers lockctl status, and its log has no sanitizer report.
lockd_healthy() {
  kill -0 "$lockd_pid" 2>/dev/null || { echo "lockd is gone"; return 1; }
  $lockctl status >/dev/null 2>&1 || { echo "lockctl status failed"; return 1; }
  $lockctl release --force --session 999999 --admin-socket "$sock" 2>&1 | grep -q 'no client session' ||
    { echo "the admin socket did not answer"; return 1; }
  if grep -qE 'Sanitizer|runtime error|terminate called' "$log"; then
    echo "lockd's log shows a sanitizer report"; return 1
  fi
  return 0
}

# Seconds of CPU lockd used (user + system), from /proc.
lockd_cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$lockd_pid/stat"; }

start_lockd
echo "operator: lockd (ASan) at $ip:$port, pid $lockd_pid"

# ---- finding 1: lockctl release --force --session ID of a live session (a use-after-free in
# lockd: it ended the session through a reference into the table it was erasing from).
check=f1_force_release_live_session
$build/lockctl --server "$ip" --port "$port" acquire f1-lock -- sleep 30 >"$work/f1.out" 2>&1 &
bg_pids+=($!)
sid=
for _ in $(seq 1 50); do
  sid=$($lockctl --json clients 2>"$work/clients.err" | python3 -c '
import json, sys
text = sys.stdin.read()
for s in (json.loads(text) if text.strip() else []):
    if not s["lockd_loopback"] and not s["this_lockctl"] and s["requests"]:
        print(s["session"]); break')
  [ -n "$sid" ] && break
  sleep 0.2
done
if [ -z "$sid" ]; then
  fail $check "the holder's session never showed in lockctl clients: $(cat "$work/clients.err" "$work/f1.out")"
else
  out=$($lockctl release --force --session "$sid" --admin-socket "$sock" 2>&1)
  rc=$?
  sleep 0.5
  if [ "$rc" -ne 0 ]; then
    fail $check "release --force --session $sid: exit $rc: $out"
  elif ! why=$(lockd_healthy); then
    fail $check "after release --force --session $sid: $why"; tail -40 "$log"
  elif ! out=$($lockctl acquire --timeout 10000 f1-lock -- true 2>&1); then
    fail $check "f1-lock could not be taken again after the forced release: $out"
  else
    pass $check
  fi
fi

# ---- finding 2: a peer that sends its line and closes before the reply (the reply's write hit
# a closed socket: SIGPIPE, which lockd did not handle, ended it and every client's leases).
check=f2_admin_peer_closes_before_reply
python3 - "$sock" <<'EOF'
import socket, sys, struct
for i in range(50):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    s.sendall(b"release-session 999999\n")
    # RST-free close with nothing read: lockd's reply meets a socket with no reader.
    s.close()
EOF
sleep 0.5
if why=$(lockd_healthy); then pass $check; else fail $check "$why"; tail -20 "$log"; fi

# ---- finding 5a: an accept that fails for want of descriptors must not spin the event loop.
# lockd's descriptor limit is lowered to what it has open, so the admin accept fails (EMFILE).
check=f5_failed_accept_does_not_spin
nofds=$(ls "/proc/$lockd_pid/fd" | wc -l)
if ! prlimit --pid "$lockd_pid" --nofile="$nofds:$nofds"; then
  fail $check "prlimit failed"
else
  python3 - "$sock" <<'EOF' &
import socket, sys, time
conns = []
for i in range(4):  # queued in the listen backlog, never accepted while the limit holds
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(sys.argv[1])
        s.send(b"release-session 999999\n")
    except OSError:
        pass
    conns.append(s)
time.sleep(4)
EOF
  bg_pids+=($!)
  sleep 0.5
  t0=$(lockd_cpu_ticks)
  sleep 3
  t1=$(lockd_cpu_ticks)
  used=$((t1 - t0))
  echo "operator: lockd used $used CPU ticks ($(getconf CLK_TCK)/s) in 3 s with its admin accept failing"
  prlimit --pid "$lockd_pid" --nofile=1024:1024
  sleep 0.3
  if [ "$used" -ge 100 ]; then  # a spinning loop uses all 300; an idle lockd a few
    fail $check "lockd used $used CPU ticks in 3 s while accept failed (spinning)"
  elif ! why=$(lockd_healthy); then
    fail $check "after the limit was raised again: $why"
  else
    pass $check
  fi
fi

# ---- finding 5b: connections held open to the metrics endpoint must not take lockd's
# descriptors (httplib queued every accepted connection without a bound behind 2 workers).
check=f5_metrics_flood_leaves_lockd_serving
nofds=$(ls "/proc/$lockd_pid/fd" | wc -l)
limit=$((nofds + 40))
prlimit --pid "$lockd_pid" --nofile="$limit:$limit"
python3 - "$metrics_port" "$work/flood.ready" <<'EOF' &
import socket, sys, time
conns = []
for i in range(300):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", int(sys.argv[1])))
    except BlockingIOError:
        pass
    except OSError:
        break
    conns.append(s)
open(sys.argv[2], "w").close()
time.sleep(20)
EOF
flood_pid=$!
bg_pids+=($flood_pid)
for _ in $(seq 1 50); do [ -e "$work/flood.ready" ] && break; sleep 0.2; done
sleep 1
held=$(ls "/proc/$lockd_pid/fd" | wc -l)
echo "operator: lockd holds $held descriptors (limit $limit) with 300 metrics connections open"
if ! why=$(lockd_healthy); then
  fail $check "with 300 metrics connections held open: $why"
elif ! out=$($lockctl acquire --timeout 10000 f5-lock -- true 2>&1); then
  fail $check "a client could not take a lock with 300 metrics connections held open: $out"
else
  kill -KILL "$flood_pid" 2>/dev/null
  sleep 0.5
  if ! curl -fsS -m 20 "http://127.0.0.1:$metrics_port/metrics" | grep -q '^rdmalock_lockd_epoch'; then
    fail $check "metrics did not answer after the flood ended"
  else
    pass $check
  fi
fi
prlimit --pid "$lockd_pid" --nofile=1024:1024

stop_lockd
if grep -qE 'Sanitizer|runtime error|terminate called' "$log"; then
  fail lockd_log "lockd's log shows a sanitizer report:"; cat "$log"
else
  pass lockd_log
fi
echo "operator: $ok passed, $bad failed"
[ "$bad" -eq 0 ] && [ "$ok" -gt 0 ]
