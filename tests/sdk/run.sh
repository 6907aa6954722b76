#!/bin/bash
# The C API and Python module tests against a real lockd, on real verbs:
#
#   deploy/softroce/rxe-run --timeout 600 -- tests/sdk/run.sh "$PWD/build"
#
# Starts lockd from BUILD_DIR on $RXE_IP (set by rxe-run), runs the C API test
# (BUILD_DIR/tests/c_api_test rdma ...) and the Python tests (python3 -m pytest tests/python),
# stops lockd. Prints one line per test, "sdk-test: <suite>: <test>: ok|FAIL", then
# "sdk: N passed, M failed", and exits non-zero if anything failed or could not run.
set -u
build=${1:?usage: run.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
ip=${RXE_IP:?RXE_IP is not set: run this through deploy/softroce/rxe-run}
port=7480
# Scratch for lockd (state, admin socket, log) and the test logs; removed on exit.
work=$(mktemp -d /tmp/sdk-test.XXXXXX)
log=$work/lockd.log
sock=$work/admin.sock
lockctl="$build/lockctl --server $ip --port $port"

lockd_pid=
stop_lockd() {
  [ -n "$lockd_pid" ] || return 0
  kill -TERM "$lockd_pid" 2>/dev/null
  wait "$lockd_pid" 2>/dev/null
  lockd_pid=
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
"$build/lockd" --address "$ip" --port "$port" --lock-count 1024 --lease-ms 2000 \
  --state-dir "$work" --admin-socket "$sock" --metrics-address "" --log-level info \
  --auth-key-file "$key" >"$log" 2>&1 &
lockd_pid=$!
i=0
until $lockctl status >/dev/null 2>&1; do
  if ! kill -0 "$lockd_pid" 2>/dev/null; then
    echo "sdk: lockd exited during start-up:"; cat "$log"; exit 1
  fi
  i=$((i + 1))
  [ "$i" -gt 100 ] && { echo "sdk: lockd did not answer within 20 s:"; cat "$log"; exit 1; }
  sleep 0.2
done
echo "sdk: lockd at $ip:$port (pid $lockd_pid)"

echo "=== C API (tests/c/c_api_test.c)"
"$build/tests/c_api_test" rdma "$ip" "$port" "$build/lockctl" "$sock" 2>&1 | tee "$work/c.log"
c_rc=${PIPESTATUS[0]}

echo "=== Python module (tests/python)"
# pytest.sh writes no bytecode or cache: the root is read-only in the VM.
RDMALOCK_SERVER=$ip RDMALOCK_PORT=$port RDMALOCK_LIBRARY="$build/librdmalock.so" \
RDMALOCK_LOCKCTL="$build/lockctl" RDMALOCK_ADMIN_SOCKET="$sock" \
  "$root/tests/python/pytest.sh" -q -rA "$root/tests/python" 2>&1 | tee "$work/py.log"
py_rc=${PIPESTATUS[0]}

stop_lockd
if grep -qE 'terminate called|Sanitizer|Assertion' "$log"; then
  echo "sdk: lockd's log shows a failure:"; cat "$log"; lockd_bad=1
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
