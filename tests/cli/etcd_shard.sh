#!/bin/sh
# lockctl --etcd ... --shard S acquire NAME: the lock must be on shard S by etcd's cluster map, as
# with --cluster FILE (an acquire on the wrong shard takes a lock no other client contends for).
# It ignored --shard and acquired wherever the map put the name (found by review, 2026-12-05).
# A real etcd (Debian's etcd-server) on loopback holds a map of shards a and b, neither with a
# primary: a name on b is refused as a usage error before any connection, a name on a goes on to
# its shard (which has no primary: exit 69), and a shard the map lacks is a usage error.
#   etcd_shard.sh LOCKCTL SCRATCH_DIR
# Prints "etcd-shard-ok" at the end when every check held; each failure is one FAIL line.
lockctl=$1 dir=$2
. "$(dirname "$0")/expect.sh"
rm -rf "$dir" && mkdir -p "$dir"
start_etcd "$dir"
trap 'kill $etcd_pid 2>/dev/null; wait $etcd_pid 2>/dev/null' EXIT
ctl() { "$lockctl" --connect-timeout-ms 200 --etcd "$url" --etcd-cluster t "$@" 2>&1; }
i=0
until ctl cluster init a,b >/dev/null; do
  i=$((i + 1))
  [ $i -lt 150 ] || { echo "FAIL: etcd did not take the map in 30 s (see $dir/etcd.log)"; exit 1; }
  sleep 0.2
done

on_a=0 on_b=0
for n in 0 1 2 3 4 5 6 7 8 9; do
  out=$(ctl --shard a acquire "name$n" -- true)
  rc=$?
  case "$rc:$out" in
    "64:"*"lock 'name$n' is on shard 'b' by etcd"*"not on --shard 'a'"*) on_b=$((on_b + 1)) ;;
    "69:"*"shard 'a' has no primary"*) on_a=$((on_a + 1)) ;;
    *) fail "--shard a acquire name$n: exit $rc: $out" ;;
  esac
done
# The ten names are fixed: both shards have some (else the test shows nothing).
[ $on_a -gt 0 ] && [ $on_b -gt 0 ] || fail "names on a: $on_a, on b: $on_b (want some of each)"

out=$(ctl --shard zz acquire name0 -- true)
rc=$?
case "$rc:$out" in
  "64:"*"no shard 'zz' in etcd"*) ;;
  *) fail "--shard zz acquire: exit $rc: $out" ;;
esac

[ $fails -eq 0 ] && echo "etcd-shard-ok (names on a: $on_a, refused on b: $on_b)"
