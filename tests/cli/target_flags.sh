#!/bin/sh
# Where lockd is comes from one place: --server and --port, or a cluster map (--cluster FILE or
# --etcd URL) with --shard. lockctl dropped what did not fit without a word (found by review,
# 2026-12-06): --shard without a map was ignored (the command went to --server, or client.yaml's
# lockd), and --server and --port with a map were ignored (the command went to the map's shard).
# Each is now a usage error, exit 64, that names the flags, before any connection.
#   target_flags.sh LOCKCTL SCRATCH_DIR
# Prints "target-flags-ok" at the end when every check held; each failure is one FAIL line.
lockctl=$1 dir=$2
. "$(dirname "$0")/expect.sh"
rm -rf "$dir" && mkdir -p "$dir"
two_shard_map "$dir"

no_map='lockctl: --shard names a shard of a cluster map: give --cluster FILE or --etcd URL with it'
for cmd in status "inspect x" "release --force --slot 3" "acquire x -- true"; do
  # shellcheck disable=SC2086 # the command's words
  expect_line "--shard without a map: $cmd" 64 "$no_map" \
    "$lockctl" --connect-timeout-ms 200 --server 192.0.2.9 --shard b $cmd
done
both='lockctl: --server and --port say where lockd is, and so does the cluster map (--cluster or --etcd): pass one'
for flag in "--server 192.0.2.9" "--port 7471"; do
  # shellcheck disable=SC2086 # the flag and its value
  expect_line "$flag with --cluster" 64 "$both" \
    "$lockctl" --connect-timeout-ms 200 $flag --cluster "$map" --shard a status
  # shellcheck disable=SC2086
  expect_line "$flag with --etcd" 64 "$both" \
    "$lockctl" --connect-timeout-ms 200 $flag --etcd http://127.0.0.1:1 --shard a status
done

[ "$fails" -eq 0 ] && echo target-flags-ok
