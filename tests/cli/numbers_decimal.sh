#!/bin/sh
# lockctl's numbers are decimal. CLI11 (Debian 12's 2.1.2) reads integers with base 0, so
# "--slot 010" (a script's zero-padded number) was slot 8 and "--session 0x11" session 17, while
# the range checks read the same text as decimal and passed it: release --force fenced the holder
# of another lock than the one named (found by review, 2026-12-06). A leading zero is now decimal
# and anything else that is not decimal digits is a usage error (64). A Python listener stands in
# for lockd's admin socket and answers with the request it read.
#   numbers_decimal.sh LOCKCTL SCRATCH_DIR
# Prints "numbers-decimal-ok" at the end when every check held; each failure is one FAIL line.
lockctl=$1 dir=$2
. "$(dirname "$0")/expect.sh"
rm -rf "$dir" && mkdir -p "$dir"
sock=$dir/echo.sock
fake_admin_socket "$sock" echo
asks() {  # asks EXPECTED_REQUEST LOCKCTL_ARGS...
  want=$1
  shift
  out=$(timeout 30 "$lockctl" release --force --admin-socket "$sock" "$@" 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] || fail "$*: exit $rc, not 0: '$out'"
  case $out in
    "ok asked: $want"*) ;;
    *) fail "$*: lockd was asked '$out', not '$want'" ;;
  esac
}
asks "release-slot 10" --slot 010
asks "release-slot 0" --slot 000
asks "release-slot 7" --slot 7
asks "release-session 11" --session 011
# Past int64 (found by review, 2026-12-07): CLI11's strtoll saturated them without an error, and
# lockd was asked for slot 9223372036854775807.
for bad in 0x10 0X10 0b11 0o17 1e3 " 12" "+5" "-0" 9223372036854775808 99999999999999999999; do
  out=$(timeout 30 "$lockctl" release --force --admin-socket "$sock" --slot "$bad" 2>&1)
  rc=$?
  [ "$rc" -eq 64 ] || fail "--slot '$bad': exit $rc, not 64 (a usage error): '$out'"
done
# No lockd here (no RDMA device on a CI host): the error names the address it tried.
out=$(timeout 30 "$lockctl" --server 127.0.0.1 --port 07471 --connect-timeout-ms 500 status 2>&1)
case $out in
  *"127.0.0.1:7471 "*) ;;
  *) fail "--port 07471 did not go to port 7471: '$out'" ;;
esac
[ "$fails" -eq 0 ] && echo "numbers-decimal-ok"
