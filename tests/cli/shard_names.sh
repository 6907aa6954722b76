#!/bin/sh
# A lock named with --shard must be on that shard by the map: acquire and release --force would
# otherwise act on the wrong lockd (found by review, 2026-12-05), and top label another lock's
# slot with the name (2026-12-07). inspect may look at a name's slot on any shard (lockctl.1).
# Of ten names, every one the map puts on shard b is refused (exit 64, the message naming both
# shards), before any connection; every one on shard a goes on to connect (to an address that does
# not answer: exit 69).
# (The ctest patterns this replaces passed if any one name was refused.)
#   shard_names.sh LOCKCTL SCRATCH_DIR
# Prints "shard-names-ok" at the end when every check held; each failure is one FAIL line.
lockctl=$1 dir=$2
. "$(dirname "$0")/expect.sh"
rm -rf "$dir" && mkdir -p "$dir"
two_shard_map "$dir"
name_on_a=name0  # on shard a by this map (its acquire below goes on to connect)
on_b=0 on_a=0
for n in 0 1 2 3 4 5 6 7 8 9; do
  # acquire first: whether it refuses the name is where the map puts it; every other command
  # must then agree.
  on=""
  # inspect is the exception, as lockctl.1 says: it looks at the name's slot on the shard given
  # (this script counted it among the others, and checked only that some name was refused).
  for cmd in "acquire" "release --force" "top"; do
    case $cmd in
      acquire) set -- acquire "name$n" -- true ;;
      # top labels the slots of --name's locks: a name on another shard labelled a slot of this
      # shard's table, another lock (stop 55's list; added 2026-12-07). With a name on a too.
      top) set -- top --iterations 1 --name "$name_on_a" --name "name$n" ;;
      *) set -- $cmd "name$n" ;;
    esac
    out=$(timeout 30 "$lockctl" --connect-timeout-ms 200 --cluster "$map" --shard a "$@" 2>&1)
    rc=$?
    case $out in
      *"lock 'name$n' is on shard 'b' by $map, not on --shard 'a'"*)
        [ "$rc" -eq 64 ] || fail "$cmd name$n (on b): exit $rc, not 64: '$out'"
        [ -z "$on" ] && on=b
        [ "$on" = b ] || fail "$cmd name$n: refused as on shard b, which acquire did not: '$out'"
        on_b=$((on_b + 1)) ;;
      *"is on shard"*) fail "$cmd name$n: a refusal that does not name it and both shards: '$out'" ;;
      *)
        # On to its shard's lockd, which does not answer (or no RDMA device here): unavailable.
        [ "$rc" -eq 69 ] || fail "$cmd name$n (on a): exit $rc, not 69 (lockd unreachable): '$out'"
        [ -z "$on" ] && on=a
        [ "$on" = a ] || fail "$cmd name$n (on b by acquire's refusal): not refused: exit $rc: '$out'"
        on_a=$((on_a + 1)) ;;
    esac
  done
done
[ "$on_b" -gt 0 ] || fail "no name of ten was on shard b: nothing was checked"
[ "$on_a" -gt 0 ] || fail "no name of ten was on shard a"
[ "$fails" -eq 0 ] && echo "shard-names-ok ($on_b refusals, $on_a on shard a)"
