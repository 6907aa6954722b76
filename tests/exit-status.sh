#!/bin/sh
# Runs a command and prints its exit status last, as "exit-status=N.": ctest ignores a test's
# exit status once it has a PASS_REGULAR_EXPRESSION, so the tests of add_output_test
# (tests/CMakeLists.txt) match this line too. Exits with the command's status.
"$@"
rc=$?
echo "exit-status=$rc."
exit "$rc"
