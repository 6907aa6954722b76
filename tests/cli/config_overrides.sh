#!/bin/sh
# lockd's command-line flags stand in for its file's keys (docs/operations.md): the checks across
# keys are made on what lockd will run, the file with the flags over it, not on the file alone. A file that names etcd but no shard
# was refused even with --shard on the command line (found by review, 2026-12-08).
#   config_overrides.sh LOCKD DIR
# Prints "config-overrides-ok" at the end when every check held; each failure is one FAIL line.
lockd=$1 dir=$2
. "$(dirname "$0")/expect.sh"
rm -rf "$dir" && mkdir -p "$dir" || exit 1

# Cluster mode whose shard and advertise address come from the command line.
printf 'etcd_endpoints:\n  - http://127.0.0.1:2379\n' > "$dir/etcd.yaml"
expect_line "etcd in the file, --shard and --advertise-address on the command line" 0 \
  "configuration OK" "$lockd" --config "$dir/etcd.yaml" --shard a \
  --advertise-address 10.0.0.1:7471 --check-config
# Without them it is still refused, naming the file and what is missing.
expect_in "etcd in the file, no shard anywhere" 2 \
  "etcd.yaml: etcd_endpoints is set but shard is not" "$lockd" --config "$dir/etcd.yaml" \
  --check-config
# A heartbeat pair the file alone gets wrong and the command line puts right.
printf 'heartbeat_interval_ms: 400\nheartbeat_timeout_ms: 600\n' > "$dir/hb.yaml"
expect_line "heartbeat timeout from the command line" 0 "configuration OK" \
  "$lockd" --config "$dir/hb.yaml" --heartbeat-timeout-ms 1000 --check-config
expect_in "heartbeat pair wrong, no flag" 2 \
  "hb.yaml: heartbeat_timeout_ms (600) must be at least twice heartbeat_interval_ms (400)" \
  "$lockd" --config "$dir/hb.yaml" --check-config
# A key's own value is checked in the file, with its line, whatever the command line says:
# only the checks across keys wait for the flags.
printf 'metrics_address: "nowhere"\n' > "$dir/metrics.yaml"
expect_in "a bad metrics_address in the file" 2 "metrics.yaml:1: key 'metrics_address'" \
  "$lockd" --config "$dir/metrics.yaml" --metrics-address 127.0.0.1:9100 --check-config
# A flag that makes a good file wrong is refused, and the message names the flag's value.
printf 'heartbeat_interval_ms: 400\n' > "$dir/hb2.yaml"
expect_in "--heartbeat-timeout-ms too short for the file's interval" 2 \
  "heartbeat_timeout_ms (500) must be at least twice heartbeat_interval_ms (400)" \
  "$lockd" --config "$dir/hb2.yaml" --heartbeat-timeout-ms 500 --check-config

[ "$fails" -eq 0 ] && echo config-overrides-ok
