#!/bin/sh
# A lockd start that fails before serving (here: no RDMA device on this host, or, on a host with
# one, an address that is none of its own; in the field a port in use, a missing NIC) must not
# use up an epoch: under systemd's Restart=on-failure (every 2 s)
# each failed start bumped state_dir/epoch, and at 65,535 lockd could never start again (found
# by review, 2026-12-06). Nor may it leave the running mark when the last run stopped cleanly: the
# next start then waited out a restart grace (refusing every client for a lease) for nothing
# (found by review, 2026-12-06 too).
#   failed_start_epoch.sh LOCKD SCRATCH_DIR
# Prints "failed-start-epoch-ok" at the end when every check held; each failure is one FAIL line.
lockd=$1 dir=$2
. "$(dirname "$0")/expect.sh"
rm -rf "$dir" && mkdir -p "$dir"
printf '7\n' >"$dir/epoch"
for round in 1 2 3; do
  out=$(timeout 30 "$lockd" --state-dir "$dir" --admin-socket "" --metrics-address "" \
    --address 192.0.2.1 --port 7999 2>&1)
  rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "round $round: lockd did not fail to start (exit $rc): $out"
done
epoch=$(cat "$dir/epoch")
[ "$epoch" = 7 ] || fail "three failed starts moved the epoch from 7 to $epoch"
[ ! -e "$dir/running" ] || fail "a failed start after a clean stop left the running mark ($(cat "$dir/running"))"
# After an unclean stop (the mark there) a failed start must leave it: the grace is still owed.
printf '1\n' >"$dir/running"
timeout 30 "$lockd" --state-dir "$dir" --admin-socket "" --metrics-address "" \
  --address 192.0.2.1 --port 7999 >/dev/null 2>&1
[ -e "$dir/running" ] || fail "a failed start after an unclean stop removed the running mark"
[ "$fails" -eq 0 ] && echo "failed-start-epoch-ok"
