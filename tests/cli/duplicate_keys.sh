#!/bin/sh
# A key written twice in a YAML file is an error that names it and both lines, in every file the
# project reads: lockd.yaml, lockctl's client.yaml and a cluster map (lockctl --cluster; the SDK's
# map file has a unit test). yaml-cpp keeps one of the two values without a word: a second
# `shards:` block left the shards under it unused by every client, a second `lease_ms:` set
# another lease than the one the operator last wrote (found by review, 2026-12-06).
#   duplicate_keys.sh LOCKCTL LOCKD SCRATCH_DIR
# Prints "duplicate-keys-ok" at the end when every check held; each failure is one FAIL line.
lockctl=$1 lockd=$2 dir=$3
. "$(dirname "$0")/expect.sh"
rm -rf "$dir" && mkdir -p "$dir/rdmalock"
export HOME=$dir XDG_CONFIG_HOME=$dir
unset RDMALOCK_SERVER RDMALOCK_AUTH_KEY RDMALOCK_AUTH_KEY_FILE

printf 'port: 7471\nlease_ms: 1000\nlease_ms: 2000\n' >"$dir/lockd.yaml"
expect_in "lockd.yaml, lease_ms twice" 2 "lockd.yaml:3: key 'lease_ms' appears twice (also line 2)" \
  "$lockd" --check-config --config "$dir/lockd.yaml"

printf 'shards:\n  - {name: a, server: 192.0.2.1}\nshards:\n  - {name: b, server: 192.0.2.2}\n' \
  >"$dir/two-blocks.yaml"
expect_in "cluster map, shards twice" 64 "two-blocks.yaml:3: key 'shards' appears twice (also line 1)" \
  "$lockctl" --cluster "$dir/two-blocks.yaml" inspect x

printf 'shards:\n  - name: a\n    server: 192.0.2.1\n    server: 192.0.2.2\n' >"$dir/two-servers.yaml"
expect_in "cluster map, server twice in a shard" 64 \
  "two-servers.yaml:4: key 'server' appears twice (also line 3)" \
  "$lockctl" --cluster "$dir/two-servers.yaml" inspect x

printf 'server: 192.0.2.1\nserver: 192.0.2.2\n' >"$dir/rdmalock/client.yaml"
expect_in "client.yaml, server twice" 64 "client.yaml:2: key 'server' appears twice (also line 1)" \
  "$lockctl" status

[ "$fails" -eq 0 ] && echo duplicate-keys-ok
