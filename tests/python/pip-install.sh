#!/bin/sh
# The Python package from the source tree, as a user installs it without network access:
#
#   tests/python/pip-install.sh LIBRARY [PYTHON]
#
# makes a venv (with the system's site packages, for Debian's python3-setuptools and
# python3-wheel), runs `pip install --no-build-isolation --no-index ./python` in it, then imports
# rdmalock from outside the tree (so the installed copy, not python/, is what loads), loading
# LIBRARY (RDMALOCK_LIBRARY), and prints "pip-install: rdmalock VERSION (librdmalock LIBVERSION)
# from PATH". PYTHON defaults to /usr/bin/python3 (Debian's, whose setuptools the build uses).
# Exits non-zero if any step fails. Leaves nothing behind.
set -eu
lib=${1:?usage: pip-install.sh LIBRARY [PYTHON]}
py=${2:-/usr/bin/python3}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/rdmalock-pip.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$py" -m venv --system-site-packages "$work/venv"
# A copy of the package directory: pip's build writes build/ and *.egg-info next to the sources,
# and the tree stays clean (it is read-only in the Soft-RoCE VM).
cp -r "$root/python" "$work/src"
PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
  "$work/venv/bin/pip" install -q --no-build-isolation --no-index "$work/src"
rm -rf "$work/src"
cd "$work"
RDMALOCK_LIBRARY=$lib "$work/venv/bin/python" -c '
import importlib.metadata, os, sys
import rdmalock
where = os.path.dirname(rdmalock.__file__)
assert where.startswith(sys.prefix), f"rdmalock imported from {where}, not the venv {sys.prefix}"
assert os.path.isfile(os.path.join(where, "py.typed")), "py.typed is not installed"
meta = importlib.metadata.version("rdmalock")
assert meta == rdmalock.__version__, f"metadata says {meta}, the module {rdmalock.__version__}"
print(f"pip-install: rdmalock {rdmalock.__version__} (librdmalock {rdmalock.library_version()})"
      f" from {where}")
'
