#!/usr/bin/env bash
# shellcheck disable=SC2001  # sed indents multi-line output
# Run by tests/pkg/run.sh under deploy/softroce/rxe-run (TREE is the share): runs the packaged lockd
# inside TREE, a Debian 12 tree with the rdmalock packages installed, the way the packaged
# lockd.service does it: its ExecStartPre and ExecStart, LimitMEMLOCK and LimitNOFILE as ulimits,
# StateDirectory and RuntimeDirectory as directories, UMask. The config /etc/rdmalock/lockd.yaml
# is edited to listen on $RXE_IP, and nothing else: it requires the key the package generated.
# Then the packaged lockctl's `status` must succeed against it with that key and be refused
# without it (issue 17 finding 15), a lock through python3-rdmalock must be held and released,
# the epoch must appear in /var/lib/rdmalock, and SIGTERM must stop lockd cleanly.
#   in-vm.sh TREE
set -euo pipefail
# Any command failing where no check expects it: say where, never exit silently.
trap 'echo "pkg-vm: FAIL: unexpected failure at line $LINENO: $BASH_COMMAND (exit $?)"' ERR
tree=$1
: "${RXE_IP:?RXE_IP is not set: run under deploy/softroce/rxe-run}"

fail() { echo "pkg-vm: FAIL: $*"; exit 1; }
step() { echo "pkg-vm: $*"; }
in_tree() { chroot "$tree" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 "$@"; }

lockd_pid=
cleanup() {
  if [ -n "$lockd_pid" ] && kill -0 "$lockd_pid" 2>/dev/null; then kill -KILL "$lockd_pid" || true; fi
  for m in run dev sys proc; do
    if mountpoint -q "$tree/$m"; then umount -R "$tree/$m" || umount -l "$tree/$m" || true; fi
  done
}
trap cleanup EXIT

# What the process needs from the host: /proc, /sys (/sys/class/infiniband), /dev
# (/dev/infiniband/uverbs0, rdma_cm); /run is a fresh tmpfs, as at boot.
for m in proc sys dev; do
  mount --rbind "/$m" "$tree/$m" || fail "cannot bind /$m into $tree"
done
mount -t tmpfs -o mode=755 tmpfs "$tree/run" || fail "cannot mount a tmpfs on $tree/run"
[ -e "$tree/dev/infiniband/rdma_cm" ] || fail "no /dev/infiniband/rdma_cm in the tree"
[ -e "$tree/sys/class/infiniband/$RXE_DEV" ] || fail "no /sys/class/infiniband/$RXE_DEV in the tree"

# The unit's settings, read from the packaged unit (so a changed unit changes this run).
unit=$tree/usr/lib/systemd/system/lockd.service
[ -f "$unit" ] || unit=$tree/lib/systemd/system/lockd.service
key() { sed -n "s/^$1=//p" "$unit"; }
exec_start_pre=$(key ExecStartPre)
exec_start=$(key ExecStart)
memlock=$(key LimitMEMLOCK)
nofile=$(key LimitNOFILE)
state=$(key StateDirectory)
state_mode=$(key StateDirectoryMode)
runtime=$(key RuntimeDirectory)
runtime_mode=$(key RuntimeDirectoryMode)
umask_=$(key UMask)
[ "$(key Type)" = notify ] || fail "the packaged unit is not Type=notify"
for v in exec_start_pre exec_start memlock nofile state state_mode runtime runtime_mode umask_; do
  [ -n "${!v}" ] || fail "the packaged unit has no setting for $v"
done
[ "$memlock" = infinity ] && memlock=unlimited
step "unit: ExecStartPre=$exec_start_pre ExecStart=$exec_start LimitMEMLOCK=$memlock" \
  "LimitNOFILE=$nofile StateDirectory=$state ($state_mode) RuntimeDirectory=$runtime ($runtime_mode)" \
  "UMask=$umask_"

sed -i "s/^address: .*/address: $RXE_IP/" "$tree/etc/rdmalock/lockd.yaml"
grep -qx "address: $RXE_IP" "$tree/etc/rdmalock/lockd.yaml" || fail "could not set address in lockd.yaml"
rm -rf "${tree:?}/var/lib/$state"

# systemd creates StateDirectory= and RuntimeDirectory= (with their modes) before
# ExecStartPre. chroot, env and the shell all exec, so $! is lockd's pid (the unit's MAINPID).
log=$tree/var/log/lockd.log
chroot "$tree" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 sh -c "mkdir -p -m $state_mode /var/lib/$state && mkdir -p -m $runtime_mode /run/$runtime && umask $umask_ &&
  ulimit -l $memlock && ulimit -n $nofile && $exec_start_pre && exec $exec_start" >"$log" 2>&1 &
lockd_pid=$!

# Ready when lockctl status answers (lockd listens only once the table is registered). The
# installed config requires the key the package generated (issue 17 finding 15): lockctl gets it
# the way docs/operations.md's first steps say, root on the lock node naming the file.
key=/etc/rdmalock/lockd.key
status_out=
for _ in $(seq 1 120); do
  kill -0 "$lockd_pid" 2>/dev/null || { cat "$log"; fail "lockd exited before it answered"; }
  if status_out=$(in_tree lockctl --server "$RXE_IP" --connect-timeout-ms 2000 --auth-key-file "$key" status 2>&1); then break; fi
  status_out=
  sleep 1
done
[ -n "$status_out" ] || { cat "$log"; fail "the packaged lockctl status did not succeed within 120 s"; }
# A client without the key gets no rkey: refused (auth_failed) after its Hello.
rc=0
nokey_out=$(in_tree lockctl --server "$RXE_IP" --connect-timeout-ms 5000 status 2>&1) || rc=$?
[ "$rc" -ne 0 ] || fail "the installed config serves a client without the key: lockctl status printed: $nokey_out"
grep -q "authentication failed" <<<"$nokey_out" ||
  fail "lockctl status without the key failed, but not as an authentication failure: $nokey_out"
step "the installed config refuses a client without the key: lockctl status exited $rc: $nokey_out"
step "lockctl --server $RXE_IP --auth-key-file $key status (packaged lockctl against the packaged lockd):"
sed 's/^/  /' <<<"$status_out"
grep -qi "epoch" <<<"$status_out" || fail "lockctl status shows no epoch"

epoch_file=$tree/var/lib/$state/epoch
[ -f "$epoch_file" ] || fail "no epoch file in /var/lib/$state"
epoch=$(cat "$epoch_file")
[[ $epoch =~ ^[0-9]+$ ]] || fail "/var/lib/$state/epoch holds '$epoch'"
step "epoch $epoch in /var/lib/$state/epoch; /var/lib/$state: $(stat -c '%a' "$tree/var/lib/$state")"
[ -S "$tree/run/$runtime/lockd.sock" ] || fail "no admin socket /run/$runtime/lockd.sock"
out=$(in_tree lockctl --server "$RXE_IP" --auth-key-file "$key" clients 2>&1) || fail "lockctl clients failed: $out"

# python3-rdmalock against the packaged lockd: the system python3, the package's key through the
# environment (as lockctl's --auth-key-file), a lock held and released in a with-block; lockctl
# inspect sees it held while the block runs (the script waits for it on stdin).
py_out=$(in_tree env RDMALOCK_AUTH_KEY_FILE="$key" python3 -c '
import sys, subprocess, rdmalock
ip, key = sys.argv[1], sys.argv[2]
with rdmalock.Client.connect(ip, connect_timeout=10, client_name="pkg-python") as client:
    with client.lock("pkg/python", timeout=10) as lock:
        shown = subprocess.run(["lockctl", "--server", ip, "--auth-key-file", key, "inspect",
                                "pkg/python"], capture_output=True, text=True, check=True).stdout
        assert "held exclusive" in shown and "pkg-python" in shown, shown
        token, mode, session = lock.token, lock.mode, client.session_id
    assert lock.state == rdmalock.LockState.RELEASED
print(f"rdmalock {rdmalock.__version__}: pkg/python {mode}, token {token:#x}, "
      f"held (lockctl inspect) then released, session {session}")
' "$RXE_IP" "$key" 2>&1) || fail "a lock through python3-rdmalock failed: $py_out"
step "python3-rdmalock: $py_out"

# The unit's stop: SIGTERM; lockd must exit 0 and say it stopped cleanly.
kill -TERM "$lockd_pid"
rc=0
wait "$lockd_pid" || rc=$?
lockd_pid=
step "lockd log:"
sed 's/^/  /' "$log"
[ "$rc" -eq 0 ] || fail "lockd exited $rc after SIGTERM"
grep -q "stopped cleanly" "$log" || fail "lockd did not log 'stopped cleanly'"
echo "pkg-vm: all checks passed"
