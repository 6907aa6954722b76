#!/bin/sh
# The lockd.service that `cmake --install` puts in place must run the lockd it put in place, and
# point at the docs it installed, whatever the prefix (the README's `cmake --install build
# [--prefix /usr]`; the default prefix is /usr/local). The unit named /usr/sbin/lockd whatever the
# prefix: installed to /usr/local, systemd found the unit (it reads /usr/local/lib/systemd/system)
# and failed to start it with 203/EXEC (found by review, 2026-12-06).
#   installed-unit.sh BUILD_DIR
set -eu
build=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for prefix in "$dir/usr/local" "$dir/opt/rdma lock"; do
  cmake --install "$build" --prefix "$prefix" >"$dir/install.log" 2>&1 || {
    cat "$dir/install.log"
    echo "cmake --install --prefix '$prefix' failed"
    exit 1
  }
  unit=$prefix/lib/systemd/system/lockd.service
  [ -f "$unit" ] || { echo "no $unit"; exit 1; }
  for key in ExecStartPre ExecStart; do
    line=$(sed -n "s/^$key=//p" "$unit")
    # The program: the first word, or the first quoted string (a path with a space).
    case $line in
      \"*) exe=${line#\"}; exe=${exe%%\"*} ;;
      *) exe=${line%% *} ;;
    esac
    [ "$exe" = "$prefix/sbin/lockd" ] ||
      { echo "$key= runs '$exe', not the installed lockd '$prefix/sbin/lockd': $line"; exit 1; }
    [ -x "$exe" ] || { echo "$key= runs '$exe', which is not an executable"; exit 1; }
  done
  doc=$(sed -n 's/^Documentation=file://p' "$unit" | sed 's/%20/ /g')
  [ -f "$doc" ] || { echo "Documentation= names '$doc', which was not installed"; exit 1; }
done
echo "installed lockd.service runs the installed lockd"
