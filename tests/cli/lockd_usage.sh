#!/bin/sh
# lockd's command line: a flag CLI11 refuses (a value out of its range or not of its type, a flag
# lockd does not know) is exit status 2, as lockd(8) says of an invalid configuration, with one
# line naming the flag and its range. They were exit 105 or 109 (CLI11's own codes), and
# --lock-count 0 said "not in range 0.000000 to 1797693134862315708145274237317043567980...
# (309 digits)" (found by review, 2026-12-06). CLI11 read integers in base 0, so --port 07472 was
# port 3898 and --lock-count 0x10 was 16 locks: they are decimal now (common/cli_decimal.h).
#   lockd_usage.sh LOCKD
# Prints "lockd-usage-ok" at the end when every check held; each failure is one FAIL line.
lockd=$1
. "$(dirname "$0")/expect.sh"
expect_in "--port 0" 2 "--port: Value 0 not in range 1 to 65535" "$lockd" --port 0 --check-config
expect_in "--port x" 2 "--port: 'x' is not a decimal number" "$lockd" --port x --check-config
expect_in "--port 07472" 0 "port: 7472" "$lockd" --port 07472 --print-config
expect_in "--lock-count 0x10" 2 "--lock-count: '0x10' is not a decimal number" \
  "$lockd" --lock-count 0x10 --check-config
expect_in "--max-clients 010" 0 "max_clients: 10" "$lockd" --max-clients 010 --print-config
expect_in "--lock-count 0" 2 "--lock-count: Value 0 not in range 1 to 268435456" \
  "$lockd" --lock-count 0 --check-config
expect_in "--lock-count 2^28 + 1" 2 "--lock-count: Value 268435457 not in range 1 to 268435456" \
  "$lockd" --lock-count 268435457 --check-config
expect_in "--memory-windows x" 2 "--memory-windows: x not in {true,false}" \
  "$lockd" --memory-windows x --check-config
expect_in "--bogus" 2 "The following argument was not expected: --bogus" "$lockd" --bogus --check-config
expect_in "--help" 0 "lockd: the rdmalock lock server" "$lockd" --help
expect_in "--version" 0 "lockd " "$lockd" --version
expect_line "--lock-count 268435456" 0 "configuration OK" "$lockd" --lock-count 268435456 --check-config
# Every key has a command-line override of the same name (operations.md): stall_factor and
# liveness_timeout_ms had none, so they could be set only in the file (found by review,
# 2026-12-06).
expect_in "--stall-factor 3" 0 "stall_factor: 3" "$lockd" --stall-factor 3 --print-config
expect_in "--stall-factor 1" 2 "--stall-factor: Value 1 not in range 2 to 100" \
  "$lockd" --stall-factor 1 --check-config
expect_in "--liveness-timeout-ms 5s" 0 "liveness_timeout_ms: 5000" \
  "$lockd" --liveness-timeout-ms 5s --print-config
expect_in "--liveness-timeout-ms 2h" 2 "--liveness-timeout-ms:" \
  "$lockd" --liveness-timeout-ms 2h --check-config
[ "$fails" -eq 0 ] && echo lockd-usage-ok
