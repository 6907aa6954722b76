# shellcheck shell=bash
# Helpers shared by the two-VM test scripts (tests/twohost/run.sh, tests/failover/run.sh); sourced.
# Expects $out (the share both VMs see). verdict counts failures in $fails.

fails=0
verdict() { # verdict PREFIX NAME STATUS DETAIL: prints "PREFIX: NAME: ok|FAIL DETAIL"
  if [ "$3" -eq 0 ]; then
    echo "$1: $2: ok $4"
  else
    echo "$1: $2: FAIL $4"
    fails=$((fails + 1))
  fi
}

# Waits for file $1 (non-empty) for up to $2 seconds.
wait_file() {
  local i=0
  while [ ! -s "$1" ]; do
    i=$((i + 1))
    [ "$i" -gt $(($2 * 10)) ] && return 1
    sleep 0.1
  done
}

# Prints the E lines (failed acquisitions, with their messages) and the S summaries of records
# $out/$1.*, counted.
summaries() { grep -h '^[ES] ' "$out/$1".* | sort | uniq -c | sed 's/^/  /'; }
