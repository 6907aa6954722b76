# The checks tests/cli's scripts share (sourced: . "$(dirname "$0")/expect.sh"). Each failed
# check prints one FAIL line and counts in $fails.
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_line WHAT EXPECTED_RC EXPECTED_TEXT CMD...: CMD's stdout+stderr must be exactly the one
# line EXPECTED_TEXT and its status EXPECTED_RC.
expect_line() {
  what=$1 rc_want=$2 text=$3
  shift 3
  out=$("$@" 2>&1)
  rc=$?
  [ "$rc" -eq "$rc_want" ] || fail "$what: exit $rc, not $rc_want: $out"
  [ "$out" = "$text" ] || fail "$what: printed
$out
  instead of the one line
$text"
}

# expect_in WHAT EXPECTED_RC TEXT CMD...: CMD's output contains TEXT, exit EXPECTED_RC.
expect_in() {
  what=$1 rc_want=$2 text=$3
  shift 3
  out=$("$@" 2>&1)
  rc=$?
  [ "$rc" -eq "$rc_want" ] || fail "$what: exit $rc, not $rc_want: $out"
  case $out in *"$text"*) ;; *) fail "$what: no '$text' in: $out" ;; esac
}

# expect_has_line WHAT EXPECTED_RC LINE CMD...: one line of CMD's output is exactly LINE, exit
# EXPECTED_RC.
expect_has_line() {
  what=$1 rc_want=$2 line=$3
  shift 3
  out=$("$@" 2>&1)
  rc=$?
  [ "$rc" -eq "$rc_want" ] || fail "$what: exit $rc, not $rc_want: $out"
  printf '%s\n' "$out" | grep -qxF "$line" || fail "$what: no line '$line' in: $out"
}

# wait_for_socket PATH: waits (up to 5 s) until PATH is a socket, as a listener started in the
# background makes it; a FAIL line and exit 1 if it never is.
wait_for_socket() { wait_for_path -S "$1" "the listener ($1)"; }

# wait_for_path TEST PATH WHAT: waits (up to about 5 s) until [ TEST PATH ] holds (-S a socket,
# -s a non-empty file); a FAIL line naming WHAT and exit 1 if it never does.
wait_for_path() {
  i=0
  until [ "$1" "$2" ]; do
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "FAIL: $3 did not start"; exit 1; }
    sleep 0.05
  done
}

# fake_admin_socket PATH MODE: a stand-in for lockd's admin socket at PATH, in the background
# until the script exits, that for each connection: "mute" keeps it open and never answers,
# "close" closes it at once, "echo" answers "ok asked: " and the request line it read.
fake_admin_socket() {
  python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(16)
conns = []
while True:
    c, _ = s.accept()
    if sys.argv[2] == "mute":
        conns.append(c)  # kept open, never read, never answered
        continue
    if sys.argv[2] == "echo":
        line = c.makefile("rb").readline().decode().strip()
        c.sendall(("ok asked: " + line + "\n").encode())
    c.close()
' "$1" "$2" &
  fake_admin_pid=$!
  trap 'kill $fake_admin_pid 2>/dev/null' EXIT
  wait_for_socket "$1"
}

# two_shard_map DIR: writes DIR/two-shards.yaml, a cluster map of shards a and b at addresses
# that do not answer, into $map, and keeps lockctl from reading the user's client.yaml or
# RDMALOCK_SERVER.
two_shard_map() {
  map=$1/two-shards.yaml
  printf 'shards:\n  - {name: a, server: 192.0.2.1}\n  - {name: b, server: 192.0.2.2}\n' >"$map"
  export HOME="$1" XDG_CONFIG_HOME="$1"
  unset RDMALOCK_SERVER
}

# start_etcd DIR: a single-member etcd (Debian's etcd-server) on two free loopback ports, its data
# and log (etcd.log) in DIR, in the background; sets $url (its client URL) and $etcd_pid (the
# caller kills it, in its EXIT trap). A FAIL line and exit 1 without the binary.
start_etcd() {
  command -v etcd >/dev/null || { echo "FAIL: no etcd binary (Debian's etcd-server)"; exit 1; }
  set -- "$1" $(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
  url=http://127.0.0.1:$2
  etcd --data-dir "$1/data" --name t --listen-client-urls "$url" --advertise-client-urls "$url" \
    --listen-peer-urls "http://127.0.0.1:$3" --initial-advertise-peer-urls "http://127.0.0.1:$3" \
    --initial-cluster "t=http://127.0.0.1:$3" >"$1/etcd.log" 2>&1 &
  etcd_pid=$!
}
