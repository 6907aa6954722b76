#!/bin/sh
# A flag given an empty value is a usage error naming it (exit 64), not a flag left out: with
# `lockctl --cluster "$MAP" acquire x -- cmd` and MAP unset, lockctl went to RDMALOCK_SERVER's
# lockd, not the name's shard, and locked where the cluster's other clients do not look (found by
# review, 2026-12-08).
#   empty_flags.sh LOCKCTL
# Prints "empty-flags-ok" at the end when every check held; each failure is one FAIL line.
lockctl=$1
. "$(dirname "$0")/expect.sh"
export RDMALOCK_SERVER=192.0.2.9
for flag in --server --cluster --etcd --shard --etcd-cluster --auth-key-file --etcd-ca-file \
  --etcd-cert-file --etcd-key-file; do
  expect_in "$flag ''" 64 "$flag" "$lockctl" --connect-timeout-ms 200 "$flag" "" status
  # "--flag=" too (CLI11 alone took the next word, "status", as its value: "A subcommand is
  # required", which names no flag; review, 2026-12-08).
  expect_in "$flag=''" 64 "$flag: empty value" "$lockctl" --connect-timeout-ms 200 "$flag=" status
done
# A subcommand's: release --force's admin socket.
expect_in "release --force --admin-socket ''" 64 "--admin-socket" \
  "$lockctl" release --force --slot 1 --admin-socket ""
# Not empty, as before: RDMALOCK_SERVER's lockd is tried (none here: 69).
expect_in "no --server" 69 "RDMALOCK_SERVER" "$lockctl" --connect-timeout-ms 200 status

[ "$fails" -eq 0 ] && echo empty-flags-ok
