#!/bin/sh
# Runs pytest with ARGS under the first python3 that has it: python3 on PATH, else Debian's
# /usr/bin/python3 (python3-pytest, from deploy/install-deps.sh). Writes no bytecode or cache (the
# source tree is read-only in the Soft-RoCE VM).
for py in python3 /usr/bin/python3; do
  if "$py" -c 'import pytest' 2>/dev/null; then
    PYTHONDONTWRITEBYTECODE=1 exec "$py" -m pytest -p no:cacheprovider "$@"
  fi
done
echo "pytest: no python3 with pytest found (deploy/install-deps.sh installs python3-pytest)" >&2
exit 1
