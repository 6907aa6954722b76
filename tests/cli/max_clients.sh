#!/bin/sh
# lockd --max-clients takes 1 to 8191, the range of lockd.yaml's max_clients, and a value outside
# it is one line naming the flag and the range, exit 2. The flag's 64-bit value was cast to 32 bits
# before any check: --max-clients 4294968319 (2^32 + 1023) ran as 1023, "configuration OK" (found
# by review, 2026-12-05).
#   max_clients.sh LOCKD
# Prints "maxclients-ok" at the end when every check held; each failure is one FAIL line.
lockd=$1
. "$(dirname "$0")/expect.sh"

range='is out of range: between 1 and 8191'
# 2^32 + 1023 and 2^32 + 1: each would wrap to a valid 32-bit count.
for v in 4294968319 4294967297 8192 0; do
  expect_line "--max-clients $v" 2 "lockd: --max-clients: $v $range" \
    "$lockd" --max-clients "$v" --check-config
done
# Not a decimal number (common/cli_decimal.h): refused by the command line's parser.
expect_in "--max-clients=-1" 2 "--max-clients: '-1' is not a decimal number" \
  "$lockd" --max-clients=-1 --check-config
# The ends of the range are taken.
expect_has_line "--max-clients 8191" 0 "max_clients: 8191" "$lockd" --max-clients 8191 --print-config
expect_has_line "--max-clients 1" 0 "max_clients: 1" "$lockd" --max-clients 1 --print-config
expect_line "--max-clients 1 --check-config" 0 "configuration OK" \
  "$lockd" --max-clients 1 --check-config

[ "$fails" -eq 0 ] && echo maxclients-ok
