#!/bin/sh
# Runs inside the systemd-nspawn container that tests/pkg/nspawn.sh boots (systemd is PID 1),
# as the oneshot rdmalock-pkg-test.service; results go to /var/log/rdmalock-pkg-test.log, the
# outcome to /var/log/rdmalock-pkg-test.result ("pass" or "fail: why"). Powers the container off
# when done.
#   in-container.sh ADDRESS
set -u
addr=$1
export RDMALOCK_AUTH_KEY_FILE=/etc/rdmalock/lockd.key  # the package generated it; lockd.yaml requires it
result=/var/log/rdmalock-pkg-test.result
exec >/var/log/rdmalock-pkg-test.log 2>&1

finish() {
  echo "$1" >"$result"
  echo "in-container: $1"
  systemctl --no-pager status lockd.service || true
  journalctl --no-pager -b -u lockd.service || true
  systemctl poweroff --no-block
  exit 0
}
check_active() {  # what
  state=$(systemctl is-active lockd.service || true)
  [ "$state" = active ] || finish "fail: $1: lockd.service is '$state', not active"
  echo "in-container: $1: active ($(systemctl show -p StatusText --value lockd.service))"
}
status() {
  out=$(lockctl --server "$addr" --connect-timeout-ms 5000 status 2>&1) || finish "fail: lockctl status after $1: $out"
  echo "in-container: lockctl status after $1:"
  echo "$out"
}

echo "in-container: systemd $(systemctl --version | head -1), PID 1 is $(cat /proc/1/comm)"
# 1. The package enabled lockd.service: it started at boot (this service is ordered after it, so
# its start job is done; a boot-time failure shows here as failed, a restart as activating).
check_active "started at boot (enabled by the package)"
# READY=1 came with lockd's STATUS= line (only lockd's sd_notify sets it).
case $(systemctl show -p StatusText --value lockd.service) in
  "serving "*) ;;
  *) finish "fail: StatusText is '$(systemctl show -p StatusText --value lockd.service)', not lockd's 'serving ...'" ;;
esac
status "boot"
# The sandboxed unit serves metrics on the shipped config's metrics_address (no curl in a minimal
# system: perl-base's IO::Socket).
metrics=$(perl -MIO::Socket::INET -e '
  my $s = IO::Socket::INET->new("127.0.0.1:9477") or die "connect: $!\n";
  print $s "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  print while <$s>;' 2>&1) || finish "fail: GET http://127.0.0.1:9477/metrics: $metrics"
echo "$metrics" | grep -q '^rdmalock_lockd_sessions_max 1024' ||
  finish "fail: the metrics page lacks rdmalock_lockd_sessions_max 1024: $(echo "$metrics" | head -5)"
echo "in-container: metrics served: $(echo "$metrics" | grep -c '^rdmalock_lockd_') samples, e.g. $(echo "$metrics" | grep '^rdmalock_lockd_handshakes_accepted_total')"
# 2. reload: RELOADING=1 ... READY=1; still active, same main PID.
pid=$(systemctl show -p MainPID --value lockd.service)
systemctl reload lockd.service || finish "fail: systemctl reload lockd exited $?"
check_active "after reload"
[ "$(systemctl show -p MainPID --value lockd.service)" = "$pid" ] || finish "fail: reload changed MainPID"
journalctl --no-pager -b -u lockd.service | grep -q 'Reloaded lockd.service' ||
  finish "fail: the journal shows no 'Reloaded lockd.service'"
journalctl --no-pager -b -u lockd.service | grep -q 'info reload: ' ||
  finish "fail: lockd logged no 'reload:' line: SIGHUP did not reach it"
# 3. stop: clean (exit 0, Result=success, 'stopped cleanly').
systemctl stop lockd.service || finish "fail: systemctl stop lockd exited $?"
[ "$(systemctl show -p Result --value lockd.service)" = success ] ||
  finish "fail: after stop Result=$(systemctl show -p Result --value lockd.service)"
[ "$(systemctl show -p ExecMainStatus --value lockd.service)" = 0 ] ||
  finish "fail: after stop ExecMainStatus=$(systemctl show -p ExecMainStatus --value lockd.service)"
journalctl --no-pager -b -u lockd.service | grep -q 'stopped cleanly' || finish "fail: no 'stopped cleanly' in the journal"
echo "in-container: stopped cleanly"
# 4. start: Type=notify returns once READY=1 came.
systemctl start lockd.service || finish "fail: systemctl start lockd exited $?"
check_active "after systemctl start"
status "start"
# 5. postinst under a running systemd: reinstalling runs "configure OLD", the upgrade path. It must
# leave the running lockd alone (a restart is an outage the admin plans). (A dpkg run here took
# 22-125 s in our runs while the share was mounted uncached, perl and dpkg reading the 9p share
# under TCG on a busy host, and 11 s cached; so prerm's stop on removal is not exercised under
# systemd; run.sh removes and purges lockd where systemd is not running.)
deb=$(ls /srv/rdmalock-debs/lockd_*.deb)
pid=$(systemctl show -p MainPID --value lockd.service)
t0=$(date +%s)
out=$(dpkg -i "$deb" 2>&1) || finish "fail: dpkg -i $deb (lockd running): $out"
check_active "after reinstalling the package (upgrade path; dpkg took $(($(date +%s) - t0)) s)"
[ "$(systemctl show -p MainPID --value lockd.service)" = "$pid" ] ||
  finish "fail: reinstalling the package restarted lockd (MainPID $pid -> $(systemctl show -p MainPID --value lockd.service))"
echo "in-container: the upgrade path left the running lockd alone (MainPID $pid)"
status "the upgrade path"
systemctl stop lockd.service || finish "fail: the last systemctl stop exited $?"
ls -l /var/lib/rdmalock
# Nothing at warning or worse, from systemd about the unit (e.g. a sandboxing option it could not
# apply) or from lockd.
warnings=$(journalctl --no-pager -q -b -p warning -u lockd.service || true)
[ -z "$warnings" ] || finish "fail: warnings logged for lockd.service: $warnings"
echo "in-container: no warnings logged for lockd.service"
finish pass
