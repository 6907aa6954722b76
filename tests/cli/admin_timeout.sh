#!/bin/sh
# lockctl release --force waits for lockd's admin socket no longer than --connect-timeout-ms: a
# socket that takes the connection and never answers (lockd stopped with SIGSTOP, or its event
# loop stuck: the kernel's backlog still accepts) made it wait for ever (found by review,
# 2026-12-05). A Python listener that never answers stands in for that lockd.
#   admin_timeout.sh LOCKCTL SCRATCH_DIR
# Prints "admin-timeout-ok" at the end when every check held; each failure is one FAIL line.
lockctl=$1 dir=$2
. "$(dirname "$0")/expect.sh"
rm -rf "$dir" && mkdir -p "$dir"
sock=$dir/mute.sock
fake_admin_socket "$sock" mute
start=$(date +%s)
out=$(timeout 30 "$lockctl" --connect-timeout-ms 500 release --force --slot 3 --admin-socket "$sock" 2>&1)
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -eq 69 ] || fail "exit $rc, not 69 (124: it hung until timeout(1) ended it): $out"
case $out in *"did not answer within 500 ms"*) ;; *) fail "no 'did not answer within 500 ms' in: $out" ;; esac
[ "$took" -le 10 ] || fail "took $took s"
[ "$fails" -eq 0 ] && echo "admin-timeout-ok (exit $rc after ${took} s)"
