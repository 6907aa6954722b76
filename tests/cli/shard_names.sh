#!/bin/sh
# A lock named with --shard must be on that shard by the map: acquire, inspect and release
# --force would otherwise act on the wrong lockd (found by review, 2026-12-05). Of ten names,
# every one the map puts on shard b is refused (exit 64, the message naming both shards), before
# any connection; every one on shard a goes on to connect (to an address that does not answer).
# (The ctest patterns this replaces passed if any one name was refused.)
#   shard_names.sh LOCKCTL SCRATCH_DIR
# Prints "shard-names-ok" at the end when every check held; each failure is one FAIL line.
lockctl=$1 dir=$2
. "$(dirname "$0")/expect.sh"
rm -rf "$dir" && mkdir -p "$dir"
two_shard_map "$dir"
on_b=0 on_a=0
for n in 0 1 2 3 4 5 6 7 8 9; do
  for cmd in "release --force" "acquire" "inspect"; do
    if [ "$cmd" = acquire ]; then set -- acquire "name$n" -- true; else set -- $cmd "name$n"; fi
    out=$(timeout 30 "$lockctl" --connect-timeout-ms 200 --cluster "$map" --shard a "$@" 2>&1)
    rc=$?
    case $out in
      *"lock 'name$n' is on shard 'b' by $map, not on --shard 'a'"*)
        [ "$rc" -eq 64 ] || fail "$cmd name$n (on b): exit $rc, not 64: '$out'"
        on_b=$((on_b + 1)) ;;
      *"is on shard"*) fail "$cmd name$n: a refusal that does not name it and both shards: '$out'" ;;
      *)
        [ "$rc" -eq 64 ] && fail "$cmd name$n (on a): a usage error: '$out'"
        on_a=$((on_a + 1)) ;;
    esac
  done
done
[ "$on_b" -gt 0 ] || fail "no name of ten was on shard b: nothing was checked"
[ "$on_a" -gt 0 ] || fail "no name of ten was on shard a"
[ "$fails" -eq 0 ] && echo "shard-names-ok ($on_b refusals, $on_a on shard a)"
