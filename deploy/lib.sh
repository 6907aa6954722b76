# shellcheck shell=bash disable=SC2154
# Shell helpers shared by deploy/run-demo.sh and deploy/perf/run-perf.sh (sourced, not run).
# Expects: $bin (the build directory), $port, and a `lockctl` function bound to lockd's address.

# start_lockd LOG [LOCKD ARGS...]: starts lockd on $port in the background (stderr to LOG), sets
# lockd_pid, stops it on exit, and waits until a client can connect; fails loudly if it cannot.
start_lockd() {
  local log=$1
  shift
  "$bin/lockd" --address 0.0.0.0 --port "$port" "$@" 2>"$log" &
  lockd_pid=$!
  trap 'kill -TERM $lockd_pid 2>/dev/null; wait $lockd_pid 2>/dev/null' EXIT
  for _ in $(seq 1 100); do
    lockctl --connect-timeout-ms 500 status >/dev/null 2>&1 && return 0
    kill -0 "$lockd_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "lockd did not become ready; its log:" >&2
  cat "$log" >&2
  return 1
}
