#!/bin/sh
# lockctl acquire NAME [OPTIONS] [--] CMD...: lockctl's options end at the command's first word,
# as flock(1)'s do; what follows is the command's, "--" or not. Without "--", CLI11 read on:
# `acquire job df -h` printed acquire's help and exited 0 (no lock, df never ran), and `acquire job
# wget --timeout=30` took wget's --timeout as the lock's wait (found by review, 2026-12-08).
# No lockd here (192.0.2.9, and no RDMA device on a host without one): a command line that parses
# gets as far as connecting, exit 69; one that does not is a usage error, exit 64.
#   acquire_command.sh LOCKCTL
# Prints "acquire-command-ok" at the end when every check held; each failure is one FAIL line.
lockctl=$1
. "$(dirname "$0")/expect.sh"
# lockctl against no lockd (a function: the path may have spaces, as CI's clone's does).
lc() { "$lockctl" --server 192.0.2.9 --connect-timeout-ms 200 "$@"; }

# parses WHAT CMD...: the command line parsed (connecting failed, 69), no usage text printed.
parses() {
  what=$1
  shift
  out=$("$@" 2>&1)
  rc=$?
  [ "$rc" -eq 69 ] || fail "$what: exit $rc, not 69 (lockd unreachable): $out"
  case $out in *Usage:* | *--timeout:*) fail "$what: lockctl read the command's options: $out" ;; esac
}
parses "acquire job df -h" lc acquire job df -h
parses "acquire job wget --timeout=30x URL" lc acquire job wget --timeout=30x http://x/
parses "acquire job --shared ls --shared" lc acquire job --shared ls --shared
parses "acquire --timeout 1s job -- sh -c 'exit 3'" lc acquire --timeout 1s job -- sh -c 'exit 3'
parses "acquire job --timeout 1s -- -dash-cmd" lc acquire job --timeout 1s -- -dash-cmd
parses "acquire job -- true -h" lc acquire job -- true -h
# A repeatable option's several values before the command (CLI11 takes them all), and a word
# that is a negative number, which CLI11 reads as no option (review, 2026-12-08).
parses "--etcd A B acquire job df -h" "$lockctl" --connect-timeout-ms 200 --etcd http://127.0.0.1:1 \
  http://127.0.0.1:2 acquire job df -h
parses "acquire job -1 foo" lc acquire job -1 foo
# lockctl's own options before the command are still lockctl's: a bad value is its usage error.
expect_in "acquire job --timeout=30x -- true" 64 "--timeout" lc acquire job --timeout=30x -- true
# An option lockctl does not know, before any command, is a usage error naming it; it is not run
# as the command.
expect_in "acquire job --sharde -- true" 64 "--sharde" lc acquire job --sharde -- true
expect_in "acquire job --sharde" 64 "--sharde" lc acquire job --sharde
# No command at all.
expect_in "acquire job" 64 "" lc acquire job
# Help asked for before any command is still help.
expect_in "acquire job -h" 0 "Usage:" lc acquire job -h

[ "$fails" -eq 0 ] && echo acquire-command-ok
