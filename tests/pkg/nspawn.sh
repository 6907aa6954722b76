#!/usr/bin/env bash
# Run by tests/pkg/run.sh under deploy/softroce/rxe-run (TREE is the share), after in-vm.sh: boots
# TREE (a Debian 12 tree with the rdmalock packages and systemd installed) with systemd-nspawn -b,
# so the packaged lockd.service runs under a real systemd as PID 1, with /dev/infiniband bound in
# and the VM's network (rxe0 on $RXE_IP). tests/pkg/in-container.sh runs in there as a oneshot
# service (--register=no --keep-unit: the VM has no D-Bus and no systemd to ask for a scope):
# lockd.service is active after boot (the package enabled it), reload keeps it active, stop is
# clean, start reaches READY=1, the packaged lockctl's status answers, and reinstalling the
# package (the upgrade path) leaves the running lockd alone.
#   nspawn.sh TREE
set -euo pipefail
trap 'echo "pkg-nspawn: FAIL: unexpected failure at line $LINENO: $BASH_COMMAND (exit $?)"' ERR
tree=$1
here=$(cd "$(dirname "$0")" && pwd)
: "${RXE_IP:?RXE_IP is not set: run under deploy/softroce/rxe-run}"
fail() { echo "pkg-nspawn: FAIL: $*"; exit 1; }

command -v systemd-nspawn >/dev/null || fail "systemd-nspawn is missing (package systemd-container)"
[ -x "$tree/lib/systemd/systemd" ] || fail "no systemd in $tree"
# The VM's init mounts no cgroup filesystem; systemd (host side: nspawn; inside: PID 1) needs one.
if ! mountpoint -q /sys/fs/cgroup; then
  mount -t cgroup2 cgroup2 /sys/fs/cgroup || fail "cannot mount cgroup2 on /sys/fs/cgroup"
fi

sed -i "s/^address: .*/address: $RXE_IP/" "$tree/etc/rdmalock/lockd.yaml"
# The installed config requires the key the package generated (issue 17 finding 15); clients in
# the container find it through RDMALOCK_AUTH_KEY_FILE. Nothing here makes or names a key.
grep -qx 'auth_key_file: /etc/rdmalock/lockd.key' "$tree/etc/rdmalock/lockd.yaml" ||
  fail "the installed lockd.yaml does not name /etc/rdmalock/lockd.key"
[ -f "$tree/etc/rdmalock/lockd.key" ] || fail "the package installed no /etc/rdmalock/lockd.key"
unit=$tree/etc/systemd/system/rdmalock-pkg-test.service
cat >"$unit" <<UNIT
[Unit]
Description=rdmalock package test (tests/pkg/in-container.sh)
After=lockd.service

[Service]
Type=oneshot
ExecStart=/rdmalock-test/in-container.sh $RXE_IP
UNIT
mkdir -p "$tree/etc/systemd/system/multi-user.target.wants" "$tree/rdmalock-test"
ln -sf /etc/systemd/system/rdmalock-pkg-test.service "$tree/etc/systemd/system/multi-user.target.wants/"
rm -f "$tree/var/log/rdmalock-pkg-test.result" "$tree/var/log/rdmalock-pkg-test.log"

echo "pkg-nspawn: booting $tree with systemd-nspawn -b"
rc=0
timeout 360 systemd-nspawn --quiet --register=no --keep-unit --directory="$tree" --boot \
  --bind=/dev/infiniband --bind-ro="$here:/rdmalock-test" --console=read-only \
  >"$tree/var/log/nspawn.log" 2>&1 </dev/null || rc=$?
rm -f "$unit" "$tree/etc/systemd/system/multi-user.target.wants/rdmalock-pkg-test.service"
result=$(cat "$tree/var/log/rdmalock-pkg-test.result" 2>/dev/null || true)
if [ -f "$tree/var/log/rdmalock-pkg-test.log" ]; then
  sed 's/^/  /' "$tree/var/log/rdmalock-pkg-test.log"
fi
if [ "$result" != pass ]; then
  echo "pkg-nspawn: systemd-nspawn exited $rc; its output (tail):"
  tail -40 "$tree/var/log/nspawn.log" | sed 's/^/  /'
  fail "${result:-the test service in the container never reported}"
fi
[ "$rc" -eq 0 ] || fail "systemd-nspawn exited $rc after the test passed"
echo "pkg-nspawn: all checks passed"
