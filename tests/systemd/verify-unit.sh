#!/bin/sh
# Checks deploy/systemd/lockd.service with systemd-analyze verify, pointed at the built lockd and
# the shipped example config. systemd-analyze exits 0 even when it ignores a bad line, so any output
# fails the test. A deliberately broken copy must produce output, or the check proves nothing.
#   verify-unit.sh UNIT LOCKD CONFIG
set -eu
unit=$1 lockd=$2 config=$3
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not installed (apt install systemd)"; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# The paths quoted in the unit: systemd splits an unquoted path with spaces into words.
sed -e "s|/usr/sbin/lockd|\"$lockd\"|g" -e "s|/etc/rdmalock/lockd.yaml|\"$config\"|g" "$unit" >"$dir/lockd.service"
out=$(systemd-analyze verify "$dir/lockd.service" 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then
  echo "systemd-analyze verify complained about lockd.service:"
  echo "$out"
  exit 1
fi
sed -e 's/^LimitMEMLOCK=/LimitMEMLOCKX=/' "$dir/lockd.service" >"$dir/broken.service"
if [ -z "$(systemd-analyze verify "$dir/broken.service" 2>&1)" ]; then
  echo "systemd-analyze verify did not notice a broken key: this check cannot fail"
  exit 1
fi
grep -q '^Type=notify$' "$dir/lockd.service" || { echo "lockd.service is not Type=notify"; exit 1; }
echo "lockd.service verified"
