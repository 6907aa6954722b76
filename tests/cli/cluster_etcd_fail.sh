#!/bin/sh
# lockctl cluster shows each shard's primary and standbys as etcd has them. When etcd failed the
# read of every shard's primary, or of a shard's members, lockctl showed "primary (none now)" or
# "standby (none)" and exited 0: a guess shown as etcd's answer during an etcd hiccup (found by
# review, 2026-12-05). Each failed read is an error that names it (exit 69, unavailable).
# A real etcd (Debian's etcd-server) on loopback holds a map of shards a and b with a's primary
# and a standby; a proxy in front of it (etcd_fail_proxy.py) fails one kind of prefix read.
#   cluster_etcd_fail.sh LOCKCTL SCRATCH_DIR
# Prints "cluster-etcd-fail-ok" at the end when every check held; each failure is one FAIL line.
lockctl=$1 dir=$2 here=$(dirname "$0")
. "$here/expect.sh"
rm -rf "$dir" && mkdir -p "$dir"
start_etcd "$dir"
pids=$etcd_pid
trap 'kill $pids 2>/dev/null; wait $pids 2>/dev/null' EXIT
ctl() { at=$1; shift; "$lockctl" --etcd "$at" --etcd-cluster t "$@" 2>&1; }
i=0
until ctl "$url" cluster init a,b >/dev/null; do
  i=$((i + 1))
  [ $i -lt 150 ] || { echo "FAIL: etcd did not take the map in 30 s (see $dir/etcd.log)"; exit 1; }
  sleep 0.2
done
# Shard a's primary and one standby, as lockd's campaign writes them (etcdctl's v3 gateway: JSON).
put() {
  python3 - "$url" "$1" "$2" <<'PY' || fail "could not write $2 to etcd"
import base64, json, sys, urllib.request
b = lambda s: base64.b64encode(s.encode()).decode()
req = urllib.request.Request(sys.argv[1] + "/v3/kv/put", data=json.dumps(
    {"key": b(sys.argv[2]), "value": b(sys.argv[3])}).encode())
urllib.request.urlopen(req, timeout=5).read()
PY
}
put /rdmalock/t/shard/a/primary 10.0.0.1:7471
put /rdmalock/t/shard/a/members/1 10.0.0.1:7471
put /rdmalock/t/shard/a/members/2 10.0.0.2:7471

# proxy SUFFIX: starts a proxy failing prefix reads of keys ending with SUFFIX; sets $proxy.
proxy() {
  python3 "$here/etcd_fail_proxy.py" "$url" "$1" >"$dir/proxy.url" 2>"$dir/proxy.log" &
  pids="$pids $!"
  wait_for_path -s "$dir/proxy.url" "the proxy (see $dir/proxy.log)"
  proxy=$(cat "$dir/proxy.url")
  rm -f "$dir/proxy.url"
}

# Through etcd itself: what etcd has.
out=$(ctl "$url" cluster)
rc=$?
case "$rc:$out" in
  "0:"*"a  primary 10.0.0.1:7471  standby 10.0.0.2:7471"*"b  primary (none now)  standby (none)"*) ;;
  *) fail "cluster, etcd answering: exit $rc: $out" ;;
esac

proxy /shard/
expect_in "cluster, etcd failing the primaries' read" 69 "shards' primaries" ctl "$proxy" cluster
expect_in "cluster --json, etcd failing the primaries' read" 69 "shards' primaries" \
  ctl "$proxy" --json cluster

proxy /members/
expect_in "cluster, etcd failing the members' read" 69 "members of shard 'a'" ctl "$proxy" cluster

# A primary key that holds no HOST:PORT (written by hand) is an error naming the key, not
# "(none now)" (2026-12-07).
put /rdmalock/t/shard/b/primary 10.0.0.3
expect_in "cluster, shard b's primary garbled" 69 "/rdmalock/t/shard/b/primary holds '10.0.0.3'" \
  ctl "$url" cluster
# A command on that shard says the same, not "no primary now ... try again" (the review).
expect_in "status --shard b, its primary garbled" 69 "/rdmalock/t/shard/b/primary holds '10.0.0.3'" \
  ctl "$url" --shard b status

[ $fails -eq 0 ] && echo "cluster-etcd-fail-ok"
