#!/bin/sh
# Durations as people write them (issue 20, item 4): lockctl's and lockd's time flags and the time
# keys of client.yaml and lockd.yaml take 60s, 500ms, 2m (or a plain number in the unit they have
# always had), and a bad value is one line that names the flag or key and gives examples.
#   durations.sh LOCKCTL LOCKD SCRATCH_DIR SOURCE_DIR
# Prints "durations-ok" at the end when every check held; each failure is one FAIL line.
lockctl=$1 lockd=$2 dir=$3 src=$4
mkdir -p "$dir"
. "$(dirname "$0")/expect.sh"

ex='(examples: 500ms, 10s, 2m, or milliseconds as a number)'
# Accepted: parsing passes and acquire goes on to say the command is missing (exit 64 from there).
for t in 60s 60000 1.5s 2m 1m30s 250ms; do
  expect_in "acquire --timeout $t" 64 "give the command after --" \
    "$lockctl" --server 192.0.2.1 acquire --timeout "$t" some-lock
done
expect_in "acquire --grace 2s" 64 "give the command after --" \
  "$lockctl" --server 192.0.2.1 acquire --grace 2s some-lock
expect_line "acquire --timeout 60x" 64 "lockctl: --timeout: \"60x\" is not a duration $ex" \
  "$lockctl" --server 192.0.2.1 acquire --timeout 60x some-lock -- true
expect_line "acquire --timeout=-5s" 64 'lockctl: --timeout: "-5s" is negative: a duration is 0 or more' \
  "$lockctl" --server 192.0.2.1 acquire --timeout=-5s some-lock -- true
expect_line "acquire --timeout 1.5ms" 64 'lockctl: --timeout: "1.5ms" is not a whole number of milliseconds' \
  "$lockctl" --server 192.0.2.1 acquire --timeout 1.5ms some-lock -- true
big=99999999999999999999999999999999999999999999999999
expect_line "acquire --timeout (50 digits)" 64 \
  "lockctl: --timeout: \"$big\" is too large for a duration (at most 2562047h)" \
  "$lockctl" --server 192.0.2.1 acquire --timeout "$big" some-lock -- true
expect_line "acquire --timeout 2y" 64 "lockctl: --timeout: \"2y\" is not a duration $ex" \
  "$lockctl" --server 192.0.2.1 acquire --timeout 2y some-lock -- true
expect_line "top --interval-ms 10ms" 64 \
  'lockctl: --interval-ms: "10ms" is out of range: between 50ms and 1h' \
  "$lockctl" --server 192.0.2.1 top --interval-ms 10ms
expect_line "--connect-timeout-ms soon" 64 \
  "lockctl: --connect-timeout-ms: \"soon\" is not a duration $ex" \
  "$lockctl" --server 192.0.2.1 --connect-timeout-ms soon status
expect_line "bench --duration 2x" 64 \
  'lockctl: --duration: "2x" is not a duration (examples: 500ms, 10s, 2m, or seconds as a number)' \
  "$lockctl" --server 192.0.2.1 bench --duration 2x
expect_line "bench --hold-us 1q" 64 \
  'lockctl: --hold-us: "1q" is not a duration (examples: 500ms, 10s, 2m, or microseconds as a number)' \
  "$lockctl" --server 192.0.2.1 bench --hold-us 1q
# bench's seconds: 0 is still refused by bench's own check, 500ms passes parsing (bench then
# fails to reach 192.0.2.1, which is not what this checks).
expect_line "bench --duration 0s" 64 'lockctl bench: --duration must be > 0' \
  "$lockctl" --server 192.0.2.1 bench --duration 0s
# --timeline: one process's sets, to a file it can write (said before connecting).
expect_line "bench --timeline with --processes 2" 64 \
  "lockctl bench: --timeline records one process's sets: it needs --processes 1" \
  "$lockctl" --server 192.0.2.1 bench --processes 2 --timeline "$dir/timeline"
expect_line "bench --timeline in a missing folder" 64 \
  "lockctl bench: cannot write --timeline $dir/none/timeline: No such file or directory" \
  "$lockctl" --server 192.0.2.1 bench --timeline "$dir/none/timeline"

# client.yaml: connect_timeout_ms takes a duration; a bad one names the file, line and key.
mkdir -p "$dir/good/rdmalock" "$dir/bad/rdmalock"
printf 'server: 192.0.2.77\nconnect_timeout_ms: 300ms\n' >"$dir/good/rdmalock/client.yaml"
printf 'server: 192.0.2.77\nconnect_timeout_ms: 3 s\n' >"$dir/bad/rdmalock/client.yaml"
expect_in "client.yaml connect_timeout_ms: 300ms" 69 "lockd at 192.0.2.77:7471" \
  env -u RDMALOCK_SERVER XDG_CONFIG_HOME="$dir/good" "$lockctl" status
expect_line "client.yaml connect_timeout_ms: 3 s" 64 \
  "lockctl: $dir/bad/rdmalock/client.yaml:2: key 'connect_timeout_ms': \"3 s\" is not a duration $ex" \
  env -u RDMALOCK_SERVER XDG_CONFIG_HOME="$dir/bad" "$lockctl" status
# The shipped example client.yaml reads (its connect_timeout_ms: 5s; the flag wins here).
mkdir -p "$dir/example/rdmalock"
cp "$src/config/client.yaml" "$dir/example/rdmalock/client.yaml"
expect_in "config/client.yaml" 69 "lockd at 192.0.2.1:7471" \
  env -u RDMALOCK_SERVER XDG_CONFIG_HOME="$dir/example" "$lockctl" --connect-timeout-ms 300ms status

# lockd: flags and lockd.yaml keys.
expect_in "lockd --lease-ms 3s" 0 "lease_ms: 3000" "$lockd" --lease-ms 3s --print-config
expect_in "lockd --lease-ms 3000" 0 "lease_ms: 3000" "$lockd" --lease-ms 3000 --print-config
expect_in "lockd --etcd-lease-ttl-s 1m" 0 "etcd_lease_ttl_s: 60" "$lockd" --etcd-lease-ttl-s 1m --print-config
expect_in "lockd --heartbeat-interval-ms 250ms" 0 "heartbeat_interval_ms: 250" \
  "$lockd" --heartbeat-interval-ms 250ms --print-config
expect_line "lockd --lease-ms 60x" 2 "lockd: --lease-ms: \"60x\" is not a duration $ex" \
  "$lockd" --lease-ms 60x --print-config
expect_line "lockd --etcd-lease-ttl-s 20m" 2 \
  'lockd: --etcd-lease-ttl-s: "20m" is out of range: between 2s and 10m' \
  "$lockd" --etcd-lease-ttl-s 20m --print-config
# The time flags have the ranges of their lockd.yaml keys (stop 27: --lease-ms 2562047h was
# "configuration OK", and lockd would have handed clients a lease of lease_ms x 10^6 ns, which
# overflows; 5 ms, which lockd.yaml refuses, was accepted too).
expect_line "lockd --lease-ms 100h" 2 \
  'lockd: --lease-ms: "100h" is out of range: between 10ms and 1h' \
  "$lockd" --lease-ms 100h --print-config
expect_line "lockd --lease-ms 5" 2 'lockd: --lease-ms: "5" is out of range: between 10ms and 1h' \
  "$lockd" --lease-ms 5 --print-config
expect_line "lockd --heartbeat-interval-ms 11m" 2 \
  'lockd: --heartbeat-interval-ms: "11m" is out of range: between 10ms and 10m' \
  "$lockd" --heartbeat-interval-ms 11m --print-config
expect_line "lockd --heartbeat-timeout-ms 10ms" 2 \
  'lockd: --heartbeat-timeout-ms: "10ms" is out of range: between 20ms and 1h' \
  "$lockd" --heartbeat-timeout-ms 10ms --print-config
expect_line "lockd --restart-grace-ms 2h" 2 \
  'lockd: --restart-grace-ms: "2h" is out of range: between 0s and 1h' \
  "$lockd" --restart-grace-ms 2h --print-config
printf 'lease_ms: 2s\nheartbeat_interval_ms: 100ms\nheartbeat_timeout_ms: 1.5s\nrestart_grace_ms: 1m\netcd_lease_ttl_s: 5\nliveness_timeout_ms: 0\n' \
  >"$dir/lockd.yaml"
expect_in "lockd.yaml with durations" 0 "heartbeat_timeout_ms: 1500" \
  "$lockd" --config "$dir/lockd.yaml" --print-config
printf 'port: 7471\nlease_ms: 60x\n' >"$dir/bad-lockd.yaml"
expect_line "lockd.yaml lease_ms: 60x" 2 \
  "lockd: $dir/bad-lockd.yaml:2: key 'lease_ms': \"60x\" is not a duration $ex" \
  "$lockd" --config "$dir/bad-lockd.yaml" --check-config

[ "$fails" -eq 0 ] && echo durations-ok
