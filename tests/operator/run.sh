#!/bin/bash
# lockd's operator paths on real verbs, with lockd built under AddressSanitizer+UBSan:
#
#   deploy/softroce/rxe-run --timeout 600 -- tests/operator/run.sh "$PWD/build-asan"
#
# What an operator, a local user or a misbehaving peer can do to lockd from outside the lock
# protocol: forced releases, the admin socket, the metrics endpoint, running out of descriptors.
# Each check names the finding of issue 17 it covers (monitoring_metrics_served is issue 20's:
# the metrics that deploy/monitoring uses). lockd must survive every one of them,
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
# lockctl at this lockd (a function, not a string: a build path with spaces stays one word)
lctl() { "$build/lockctl" --server "$ip" --port "$port" "$@"; }
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

metrics_addr=127.0.0.1:$metrics_port
# lockd starts with SIGPIPE at its default action, as from a terminal: the harness (or systemd,
# whose IgnoreSIGPIPE= defaults to yes) may have it ignored, which would hide finding 2.
start_lockd() {
  env --default-signal=PIPE "$build/lockd" --address "$ip" --port "$port" --lock-count 1024 --lease-ms 2000 \
    --state-dir "$work/state" --admin-socket "$sock" --metrics-address "$metrics_addr" \
    --log-level info --auth-key-file "$key" "$@" >>"$log" 2>&1 &
  lockd_pid=$!
  local i=0
  until lctl status >/dev/null 2>&1; do
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
  lctl status >/dev/null 2>&1 || { echo "lockctl status failed"; return 1; }
  lctl release --force --session 999999 --admin-socket "$sock" 2>&1 | grep -q 'no client session' ||
    { echo "the admin socket did not answer"; return 1; }
  if grep -qE 'Sanitizer|runtime error|terminate called' "$log"; then
    echo "lockd's log shows a sanitizer report"; return 1
  fi
  return 0
}

# Seconds of CPU lockd used (user + system), from /proc.
# OPERATOR_ONLY="f2 f5" runs only the checks of those findings (to show one finding's failure
# on old code without an earlier one's ending lockd first); empty runs every check.
want() { [ -z "${OPERATOR_ONLY:-}" ] || [[ " $OPERATOR_ONLY " == *" $1 "* ]]; }

lockd_cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$lockd_pid/stat"; }

start_lockd
echo "operator: lockd (ASan) at $ip:$port, pid $lockd_pid"

if want f1; then
# ---- finding 1: lockctl release --force --session ID of a live session (a use-after-free in
# lockd: it ended the session through a reference into the table it was erasing from).
check=f1_force_release_live_session
"$build/lockctl" --server "$ip" --port "$port" acquire f1-lock -- sleep 30 >"$work/f1.out" 2>&1 &
bg_pids+=($!)
sid=
for _ in $(seq 1 50); do
  sid=$(lctl --json clients 2>"$work/clients.err" | python3 -c '
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
  out=$(lctl release --force --session "$sid" --admin-socket "$sock" 2>&1)
  rc=$?
  sleep 0.5
  if [ "$rc" -ne 0 ]; then
    fail $check "release --force --session $sid: exit $rc: $out"
  elif ! why=$(lockd_healthy); then
    fail $check "after release --force --session $sid: $why"; tail -40 "$log"
  elif ! out=$(lctl acquire --timeout 10000 f1-lock -- true 2>&1); then
    fail $check "f1-lock could not be taken again after the forced release: $out"
  else
    pass $check
  fi
fi
fi

if want f2; then
# ---- finding 2: a peer that sends its line and closes before the reply (the reply's write hit
# a closed socket: SIGPIPE, which lockd did not handle, ended it and every client's leases).
# cpp-httplib's server ignores SIGPIPE for the whole process when it starts, so this lockd serves
# no metrics (as with metrics_address: ""), as lockd's own code must not need it to.
check=f2_admin_peer_closes_before_reply
stop_lockd
metrics_addr=
start_lockd
grep SigIgn "/proc/$lockd_pid/status" | sed 's/^/operator: lockd /'
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
stop_lockd
metrics_addr=127.0.0.1:$metrics_port
start_lockd
fi

if want f5; then
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
  if [ "$used" -ge 30 ]; then  # measured: a spinning loop 56 under TCG, an idle lockd 1-4
    fail $check "lockd used $used CPU ticks in 3 s while accept failed (spinning)"
  elif ! why=$(lockd_healthy); then
    fail $check "after the limit was raised again: $why"
  else
    pass $check
  fi
fi
fi

if want f5; then
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
echo "operator: lockd holds $held descriptors (limit $limit; $nofds before) with 300 metrics connections open"
if [ "$held" -gt $((nofds + 16)) ]; then  # 2 workers + 8 queued + 1 waiting, and slack
  fail $check "the metrics connections took lockd's descriptors: $held open, $nofds before, limit $limit"
elif ! why=$(lockd_healthy); then
  fail $check "with 300 metrics connections held open: $why"
elif ! out=$(lctl acquire --timeout 10000 f5-lock -- true 2>&1); then
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
fi

if want metrics; then
# ---- issue 20: every metric and label value that deploy/monitoring's Grafana dashboard and
# Prometheus rules use is on this lockd's /metrics (a renamed metric would leave a panel empty
# and an alert silent, and nothing else would notice). After the checks above, so that it does
# not change their timing; lockd serves every family from its start.
check=monitoring_metrics_served
src=$(cd "$(dirname "$0")/../.." && pwd)
if ! curl -fsS -m 20 "http://$metrics_addr/metrics" >"$work/metrics.txt" 2>"$work/metrics.err"; then
  fail $check "GET /metrics failed: $(cat "$work/metrics.err")"
elif out=$(python3 "$src/deploy/monitoring/check_monitoring.py" served "$work/metrics.txt" 2>&1); then
  echo "operator: ${out%: ok}"
  pass $check
else
  fail $check "$(echo "$out" | tr '\n' ' ')"
fi
fi

if want sd; then
# ---- a second lockd on the same state_dir (two shards on one host, the default state_dir):
# lockd's running mark was one shared file, so the first lockd's clean stop removed it and a
# kill -9 of the second went unseen (no restart grace), and the epoch file was read and written
# by both at once (found by review, 2026-12-06). The second must refuse to start, naming the
# first; the first serves on.
check=state_dir_in_use_refused
"$build/lockd" --address "$ip" --port $((port + 1)) --lock-count 64 --lease-ms 2000 \
  --state-dir "$work/state" --admin-socket "$work/second.sock" --metrics-address "" \
  --log-level info --auth-key-file "$key" >"$work/second.log" 2>&1 &
second=$!
for _ in $(seq 1 75); do kill -0 "$second" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$second" 2>/dev/null; then
  kill -TERM "$second" 2>/dev/null
  wait "$second" 2>/dev/null
  fail $check "a second lockd ran on the first one's state_dir: $(grep -E 'ready|grace|epoch' "$work/second.log" | head -3 | tr '\n' ' ')"
else
  wait "$second"
  rc=$?
  if [ "$rc" -eq 0 ] || ! grep -q "in use by another lockd (pid $lockd_pid)" "$work/second.log"; then
    fail $check "exit $rc: $(tail -3 "$work/second.log")"
  elif ! why=$(lockd_healthy); then
    fail $check "the first lockd after the second was refused: $why"
  else
    pass $check
  fi
fi
cat "$work/second.log" >>"$log"
fi

if want f16; then
# ---- finding 16: reload. lockd runs from a config file with --lease-ms on the command line.
stop_lockd
printf '%s\n' "address: $ip" "port: $port" "lock_count: 1024" "lease_ms: 2000" \
  "state_dir: $work/state" "admin_socket: $sock" 'metrics_address: ""' \
  "auth_key_file: $key" >"$work/lockd.yaml"
env --default-signal=PIPE "$build/lockd" --config "$work/lockd.yaml" --lease-ms 3000 >>"$log" 2>&1 &
lockd_pid=$!
for _ in $(seq 1 150); do lctl status >/dev/null 2>&1 && break; sleep 0.2; done
# (a) A key the command line overrides, changed in the file, is not reported as needing a
# restart (a restart would keep the override).
check=f16_reload_override_not_reported
sed -i 's/^lease_ms: 2000/lease_ms: 2500/' "$work/lockd.yaml"
kill -HUP "$lockd_pid"
for _ in $(seq 1 50); do grep -q 'reload: ' "$log" && break; sleep 0.1; done
if grep -q 'restart lockd to apply' "$log"; then
  fail $check "$(grep 'reload: ' "$log" | tail -1)"
elif ! grep -q 'reload: ' "$log"; then
  fail $check "lockd logged nothing about the reload"
else
  pass $check
fi
# (b) A key file rewritten in place: after the reload, the new key is the one handshakes need.
check=f16_reload_rotated_key
cp "$key" "$work/old.key"
(umask 077 && "$build/lockctl" keygen >"$key.new" && mv "$key.new" "$key")
rotations=$(grep -c 'new shared key' "$log")
kill -HUP "$lockd_pid"
for _ in $(seq 1 100); do
  [ "$(grep -c 'new shared key' "$log")" -gt "$rotations" ] && break
  sleep 0.1
done
if ! out=$(RDMALOCK_AUTH_KEY_FILE=$key lctl status 2>&1); then
  fail $check "a client with the new key was refused after the reload: $out"
elif RDMALOCK_AUTH_KEY_FILE=$work/old.key lctl status >/dev/null 2>&1; then
  fail $check "a client with the old key was still admitted after the reload"
elif ! why=$(lockd_healthy); then
  fail $check "$why"
else
  pass $check
fi
stop_lockd

# (c) A standby's reload keeps its status (it said STATUS=serving, although it served nothing).
check=f16_reload_standby_status
etcd_url=http://127.0.0.1:23790
etcd --name op --data-dir "$work/etcd" --listen-client-urls "$etcd_url" \
  --advertise-client-urls "$etcd_url" --listen-peer-urls http://127.0.0.1:23800 \
  --initial-advertise-peer-urls http://127.0.0.1:23800 \
  --initial-cluster op=http://127.0.0.1:23800 >"$work/etcd.log" 2>&1 &
bg_pids+=($!)
i=0
until "$build/lockctl" --etcd "$etcd_url" --etcd-cluster op cluster init s >/dev/null 2>&1; do
  i=$((i + 1))
  [ "$i" -gt 60 ] && break
  sleep 1
done
cluster_lockd() {  # PORT LOG [VAR=VALUE...]: a cluster-mode lockd for shard s
  local p=$1 l=$2
  shift 2
  env "$@" "$build/lockd" --address "$ip" --port "$p" --etcd "$etcd_url" --cluster op --shard s \
    --etcd-lease-ttl-s 5 --lease-ms 2000 --state-dir "" --admin-socket "" --metrics-address "" \
    --auth-key-file "$key" --log-level info >>"$l" 2>&1 &
}
cluster_lockd 7491 "$work/primary.log"
bg_pids+=($!)
for _ in $(seq 1 150); do grep -q 'primary of shard s' "$work/primary.log" && break; sleep 0.2; done
python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
with open(sys.argv[2], "a", buffering=1) as out:
    while True:
        out.write(s.recv(4096).decode().replace("\n", " ") + "\n")
' "$work/notify.sock" "$work/notify.log" &
bg_pids+=($!)
for _ in $(seq 1 100); do [ -S "$work/notify.sock" ] && break; sleep 0.2; done
cluster_lockd 7492 "$work/standby.log" NOTIFY_SOCKET="$work/notify.sock"
standby=$!
bg_pids+=($standby)
for _ in $(seq 1 150); do grep -q 'READY=1' "$work/notify.log" 2>/dev/null && break; sleep 0.2; done
kill -HUP "$standby"
for _ in $(seq 1 100); do [ "$(grep -c 'READY=1' "$work/notify.log")" -ge 2 ] && break; sleep 0.1; done
last=$(grep 'READY=1' "$work/notify.log" | tail -1)
if ! grep -q 'primary of shard s' "$work/primary.log"; then
  fail $check "the first cluster lockd never became primary: $(tail -3 "$work/primary.log")"
elif [ "$(grep -c 'READY=1' "$work/notify.log")" -lt 2 ]; then
  fail $check "the standby sent no READY=1 after the reload: $(cat "$work/notify.log")"
elif [[ $last != *"STATUS=campaigning for shard s"* ]]; then
  fail $check "after the reload the standby said: $last"
else
  pass $check
fi
kill -TERM "$standby" 2>/dev/null
wait "$standby" 2>/dev/null
cat "$work/primary.log" "$work/standby.log" >>"$log"

# (d) A cluster lockd whose key was rotated by naming another file (auth_key_file changed, and a
# reload) keeps that key in its next term as primary: each term made its server from the start's
# configuration, so after the next win every client with the new key was refused (found by
# review, 2026-12-06). The term is ended by deleting the primary key in etcd.
# The reload comes just after the win, often while the term's server connects its own loopback:
# in the project's CI that probe once failed (the key changed under its handshake) and lockd
# exited; the RDMA test 'a key rotated while lockd connects its own loopback ...' covers it.
# second_term_check SHARD PID PORT KEY_FILE WHAT: ends the term of the cluster lockd PID (shard
# SHARD, logging to $work/SHARD.log) by deleting its primary key in etcd; passes $check if it
# wins the next term (epoch 2) and then admits a client with KEY_FILE (WHAT names that key in
# the failure). Stops that lockd and appends its log to $log.
second_term_check() {
  local shard=$1 pid=$2 port=$3 key_file=$4 what=$5 out="" slog="$work/$1.log"
  python3 -c '
import base64, json, sys, urllib.request
key = base64.b64encode(("/rdmalock/op/shard/%s/primary" % sys.argv[2]).encode()).decode()
urllib.request.urlopen(sys.argv[1] + "/v3/kv/deleterange", json.dumps({"key": key}).encode())
' "$etcd_url" "$shard"
  for _ in $(seq 1 150); do
    grep -q "primary of shard $shard (epoch 2)" "$slog" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  for _ in $(seq 1 60); do  # the takeover grace first: lease + etcd TTL + liveness timeout
    kill -0 "$pid" 2>/dev/null || break  # (lockctl retries a port no one listens on for 5 s)
    out=$("$build/lockctl" --auth-key-file "$key_file" --server "$ip" --port "$port" status 2>&1) &&
      break
    sleep 0.5
  done
  local lines
  lines=$(grep -E 'primary|shared key| error | critical ' "$slog" | tail -4 | tr '\n' ' ')
  if ! kill -0 "$pid" 2>/dev/null; then
    fail $check "lockd exited: $lines"
  elif ! grep -q "primary of shard $shard (epoch 2)" "$slog"; then
    fail $check "no second term: $lines"
  elif ! "$build/lockctl" --auth-key-file "$key_file" --server "$ip" --port "$port" status \
    >/dev/null 2>&1; then
    fail $check "in its second term a client with $what was refused: $out"
  else
    pass $check
  fi
  kill -TERM "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  cat "$slog" >>"$log"
}
check=f16_cluster_rotated_key_file_kept_across_terms
(umask 077 && "$build/lockctl" keygen >"$work/k2.key")
printf '%s\n' "auth_key_file: $key" >"$work/cluster.yaml"
env "$build/lockd" --config "$work/cluster.yaml" --address "$ip" --port 7493 --etcd "$etcd_url" \
  --cluster op --shard s2 --etcd-lease-ttl-s 5 --lease-ms 2000 --state-dir "" --admin-socket "" \
  --metrics-address "" --log-level info >>"$work/s2.log" 2>&1 &
s2=$!
bg_pids+=($s2)
for _ in $(seq 1 150); do grep -q 'primary of shard s2' "$work/s2.log" && break; sleep 0.2; done
printf '%s\n' "auth_key_file: $work/k2.key" >"$work/cluster.yaml"
kill -HUP "$s2"
for _ in $(seq 1 50); do grep -q 'new shared key' "$work/s2.log" && break; sleep 0.1; done
second_term_check s2 "$s2" 7493 "$work/k2.key" "the rotated key"

# (e) A cluster lockd's next term serves the key in force (the start's, or the last reload's),
# not whatever its key file holds at that moment: each term read the file again, so a file an
# operator had left unreadable, or with group access, or half-written, made lockd exit at the
# takeover (a reload of the same file keeps the running key and says why), and a key written to
# the file without a reload took effect at the next failover, where a reload could not undo it
# (found by review, 2026-12-06). Here the file gets mode 0644 while the first term serves.
check=f16_cluster_term_keeps_key_in_force
(umask 077 && "$build/lockctl" keygen >"$work/k3.key")
"$build/lockd" --address "$ip" --port 7494 --etcd "$etcd_url" --cluster op --shard s3 \
  --etcd-lease-ttl-s 5 --lease-ms 2000 --state-dir "" --admin-socket "" --metrics-address "" \
  --auth-key-file "$work/k3.key" --log-level info >>"$work/s3.log" 2>&1 &
s3=$!
bg_pids+=($s3)
for _ in $(seq 1 150); do grep -q 'loopback through' "$work/s3.log" && break; sleep 0.2; done
chmod 0644 "$work/k3.key"
second_term_check s3 "$s3" 7494 "$work/k3.key" "the key in force"
fi

stop_lockd
for p in "${bg_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
wait 2>/dev/null
if grep -qE 'Sanitizer|runtime error|terminate called' "$log"; then
  fail lockd_log "lockd's log shows a sanitizer report:"; cat "$log"
else
  pass lockd_log
fi
echo "operator: $ok passed, $bad failed"
[ "$bad" -eq 0 ] && [ "$ok" -gt 0 ]
