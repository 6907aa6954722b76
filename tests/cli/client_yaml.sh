#!/bin/sh
# client.yaml's auth_key_file is the key of every connection lockctl makes: to --server, to a
# --cluster map's --shard, and through the cluster client that bench and `--etcd ... acquire` use.
# The cluster client took only --auth-key-file and the environment (and --connect-timeout-ms, not
# the file's connect_timeout_ms), so those commands reached lockd without the key the file names
# (found by review, 2026-12-06). A key file that does not exist shows which key each path used:
# every command must name it, where the cluster client went on without a key to the RDMA device.
#   client_yaml.sh LOCKCTL SCRATCH_DIR
# Prints "client-yaml-ok" at the end when every check held; each failure is one FAIL line.
lockctl=$1 dir=$2
. "$(dirname "$0")/expect.sh"
rm -rf "$dir" && mkdir -p "$dir/rdmalock"
map=$dir/two-shards.yaml
printf 'shards:\n  - {name: a, server: 192.0.2.1}\n  - {name: b, server: 192.0.2.2}\n' >"$map"
printf 'auth_key_file: %s/no-such.key\n' "$dir" >"$dir/rdmalock/client.yaml"
export HOME=$dir XDG_CONFIG_HOME=$dir
unset RDMALOCK_SERVER RDMALOCK_AUTH_KEY RDMALOCK_AUTH_KEY_FILE

key="auth key file $dir/no-such.key: cannot open it"
expect_in "--server status" 69 "$key" "$lockctl" --server 192.0.2.9 status
expect_in "--cluster --shard a status" 69 "$key" "$lockctl" --cluster "$map" --shard a status
expect_in "--cluster bench" 69 "$key" "$lockctl" --cluster "$map" bench --duration 1

[ "$fails" -eq 0 ] && echo client-yaml-ok
