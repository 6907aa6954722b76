#!/bin/bash
# The C API and Python module tests against a real lockd, on real verbs:
#
#   deploy/softroce/rxe-run --timeout 600 -- tests/sdk/run.sh "$PWD/build"
#
# Starts two lockds from BUILD_DIR on $RXE_IP (set by rxe-run), ports 7480 and 7482, the shards
# "shard-a" and "shard-b" of a cluster map file; runs the C API tests (BUILD_DIR/tests/c_api_test
# rdma ... against the first, c_api_test cluster ... against both) and the Python tests
# (python3 -m pytest tests/python, the cluster's through the map), stops the lockds. Prints one line per test, "sdk-test: <suite>: <test>: ok|FAIL", then
# "sdk: N passed, M failed", and exits non-zero if anything failed or could not run.
set -u
build=${1:?usage: run.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
ip=${RXE_IP:?RXE_IP is not set: run this through deploy/softroce/rxe-run}
port=7480
port_b=7482  # not port + 1: c_api_test expects nothing to listen there
# Scratch for lockd (state, admin socket, log) and the test logs; removed on exit.
work=$(mktemp -d /tmp/sdk-test.XXXXXX)
log=$work/lockd.log

lockd_pid=
lockd_b_pid=
stop_lockd() {
  local p
  for p in $lockd_pid $lockd_b_pid; do
    kill -TERM "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  lockd_pid=
  lockd_b_pid=
}
trap 'stop_lockd; rm -rf "$work"' EXIT

for f in "$build/lockd" "$build/lockctl" "$build/tests/c_api_test" "$build/librdmalock.so"; do
  [ -e "$f" ] || { echo "sdk: $f is missing: build first"; exit 1; }
done

# lockd requires a shared key: the C API, the Python module and lockctl find it through the
# environment (RDMALOCK_AUTH_KEY_FILE), as a deployment's clients would.
key=$work/lockd.key
(umask 077 && "$build/lockctl" keygen >"$key") || { echo "sdk: lockctl keygen failed"; exit 1; }
export RDMALOCK_AUTH_KEY_FILE=$key
# start_lockd PORT STATE_DIR LOG: lockd in the background (its pid in $started), answering.
start_lockd() {
  mkdir -p "$2"
  "$build/lockd" --address "$ip" --port "$1" --lock-count 1024 --lease-ms 2000 \
    --state-dir "$2" --admin-socket "$2/admin.sock" --metrics-address "" --log-level info \
    --auth-key-file "$key" >"$3" 2>&1 &
  started=$!
  local i=0
  until "$build/lockctl" --server "$ip" --port "$1" status >/dev/null 2>&1; do
    if ! kill -0 "$started" 2>/dev/null; then
      echo "sdk: lockd (port $1) exited during start-up:"; cat "$3"; exit 1
    fi
    i=$((i + 1))
    [ "$i" -gt 100 ] && { echo "sdk: lockd (port $1) did not answer within 20 s:"; cat "$3"; exit 1; }
    sleep 0.2
  done
  echo "sdk: lockd at $ip:$1 (pid $started)"
}
start_lockd "$port" "$work/a" "$log"
lockd_pid=$started
sock=$work/a/admin.sock
log_b=$work/lockd-b.log
start_lockd "$port_b" "$work/b" "$log_b"
lockd_b_pid=$started
# The cluster map (the format of lockctl --cluster; docs/operations.md, "Several lock nodes").
map=$work/cluster.yaml
cat >"$map" <<EOF
shards:
  - {name: shard-a, server: $ip, port: $port}
  - {name: shard-b, server: $ip, port: $port_b}
EOF

echo "=== C API (tests/c/c_api_test.c)"
"$build/tests/c_api_test" rdma "$ip" "$port" "$build/lockctl" "$sock" 2>&1 | tee "$work/c.log"
c_rc=${PIPESTATUS[0]}
echo "=== C API, cluster of two shards (tests/c/c_api_test.c)"
"$build/tests/c_api_test" cluster "$map" "$build/lockctl" "$ip" "$port" "$port_b" 2>&1 |
  tee -a "$work/c.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || c_rc=1

echo "=== Python module (tests/python)"
# pytest.sh writes no bytecode or cache: the root is read-only in the VM.
RDMALOCK_SERVER=$ip RDMALOCK_PORT=$port RDMALOCK_LIBRARY="$build/librdmalock.so" \
RDMALOCK_LOCKCTL="$build/lockctl" RDMALOCK_ADMIN_SOCKET="$sock" \
RDMALOCK_CLUSTER_MAP="$map" RDMALOCK_PORT_B=$port_b \
  "$root/tests/python/pytest.sh" -q -rA "$root/tests/python" 2>&1 | tee "$work/py.log"
py_rc=${PIPESTATUS[0]}

stop_lockd
if grep -qE 'terminate called|Sanitizer|Assertion' "$log" "$log_b"; then
  echo "sdk: a lockd's log shows a failure:"; cat "$log" "$log_b"; lockd_bad=1
else
  lockd_bad=0
fi

echo "=== results"
ok=0
bad=0
while IFS= read -r line; do
  case $line in
    "c_api: "*": ok") echo "sdk-test: c: ${line#c_api: }"; ok=$((ok + 1)) ;;
    "c_api: "*": FAIL"*) echo "sdk-test: c: ${line#c_api: }"; bad=$((bad + 1)) ;;
  esac
done <"$work/c.log"
while IFS= read -r line; do
  case $line in
    "PASSED "*) echo "sdk-test: python: ${line#PASSED }: ok"; ok=$((ok + 1)) ;;
    "FAILED "* | "ERROR "* | "SKIPPED "* | "XFAIL "* | "XPASS "*)
      echo "sdk-test: python: ${line#* }: FAIL (${line%% *})"; bad=$((bad + 1)) ;;
  esac
done <"$work/py.log"
# A suite that failed without reporting a failed test (crashed, or could not start) is a failure.
if [ "$c_rc" -ne 0 ] && ! grep -q ': FAIL' "$work/c.log"; then
  echo "sdk-test: c: c_api_test: FAIL (exit $c_rc, no test reported failing)"; bad=$((bad + 1))
fi
if [ "$py_rc" -ne 0 ] && ! grep -qE '^(FAILED|ERROR) ' "$work/py.log"; then
  echo "sdk-test: python: pytest: FAIL (exit $py_rc, no test reported failing)"; bad=$((bad + 1))
fi
[ "$lockd_bad" -eq 0 ] || { echo "sdk-test: lockd: FAIL (see its log above)"; bad=$((bad + 1)); }
echo "sdk: $ok passed, $bad failed"
[ "$bad" -eq 0 ] && [ "$ok" -gt 0 ]
