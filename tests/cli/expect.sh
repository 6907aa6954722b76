# The checks tests/cli's scripts share (sourced: . "$(dirname "$0")/expect.sh"). Each failed
# check prints one FAIL line and counts in $fails.
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_line WHAT EXPECTED_RC EXPECTED_TEXT CMD...: CMD's stdout+stderr must be exactly the one
# line EXPECTED_TEXT and its status EXPECTED_RC.
expect_line() {
  what=$1 rc_want=$2 text=$3
  shift 3
  out=$("$@" 2>&1)
  rc=$?
  [ "$rc" -eq "$rc_want" ] || fail "$what: exit $rc, not $rc_want: $out"
  [ "$out" = "$text" ] || fail "$what: printed
$out
  instead of the one line
$text"
}

# expect_in WHAT EXPECTED_RC TEXT CMD...: CMD's output contains TEXT, exit EXPECTED_RC.
expect_in() {
  what=$1 rc_want=$2 text=$3
  shift 3
  out=$("$@" 2>&1)
  rc=$?
  [ "$rc" -eq "$rc_want" ] || fail "$what: exit $rc, not $rc_want: $out"
  case $out in *"$text"*) ;; *) fail "$what: no '$text' in: $out" ;; esac
}

# expect_has_line WHAT EXPECTED_RC LINE CMD...: one line of CMD's output is exactly LINE, exit
# EXPECTED_RC.
expect_has_line() {
  what=$1 rc_want=$2 line=$3
  shift 3
  out=$("$@" 2>&1)
  rc=$?
  [ "$rc" -eq "$rc_want" ] || fail "$what: exit $rc, not $rc_want: $out"
  printf '%s\n' "$out" | grep -qxF "$line" || fail "$what: no line '$line' in: $out"
}

# wait_for_socket PATH: waits (up to 5 s) until PATH is a socket, as a listener started in the
# background makes it; a FAIL line and exit 1 if it never is.
wait_for_socket() {
  i=0
  until [ -S "$1" ]; do
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "FAIL: the listener did not start ($1)"; exit 1; }
    sleep 0.05
  done
}
