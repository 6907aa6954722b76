#!/bin/sh
# lockctl release --force when lockd's admin socket closes the connection without answering (it
# serves 16 at once; an older lockd closed the 17th without a word): lockctl printed an empty
# line, or died of SIGPIPE (exit 141) when the close came before its request was written (found
# by review, 2026-12-06). It now says so and exits 69. A Python listener that accepts and closes
# at once stands in for that lockd; five rounds, for both orders of close and write.
#   admin_closed.sh LOCKCTL SCRATCH_DIR
# Prints "admin-closed-ok" at the end when every check held; each failure is one FAIL line.
lockctl=$1 dir=$2
. "$(dirname "$0")/expect.sh"
rm -rf "$dir" && mkdir -p "$dir"
sock=$dir/closing.sock
fake_admin_socket "$sock" close
for round in 1 2 3 4 5; do
  out=$(timeout 30 "$lockctl" --connect-timeout-ms 2000 release --force --slot 3 --admin-socket "$sock" 2>&1)
  rc=$?
  [ "$rc" -eq 69 ] || fail "round $round: exit $rc, not 69 (141: SIGPIPE): '$out'"
  case $out in
    *"closed the connection without answering"*) ;;
    *) fail "round $round: no 'closed the connection without answering' in: '$out'" ;;
  esac
done
[ "$fails" -eq 0 ] && echo "admin-closed-ok"
