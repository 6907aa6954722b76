#!/usr/bin/env bash
# shellcheck disable=SC2016  # single-quoted $(...) and ${...} are apt and dpkg-query formats
# The Debian packages, end to end:
#   1. builds them with cpack from BUILD_DIR (configured with -DCMAKE_INSTALL_PREFIX=/usr) and
#      checks their control data (names, dependencies, conffiles, shlibs);
#   2. installs all five with `apt-get install ./*.deb` into a fresh copy of a clean Debian 12
#      minbase tree (tests/pkg/chroot-cache.sh), so apt resolves their declared dependencies from
#      the archive; dpkg must report no problem;
#   3. checks file placement (dpkg -L), lockd --version / --check-config from the package, the
#      shared key postinst generates and the conffile requires (issue 17 finding 15: mode 0600
#      root:root, lockd refuses to start without it, a reinstall keeps it), the conffile (kept
#      across a reinstall when edited) and the unit's enable symlink;
#   4. runs the packaged lockd on real verbs under deploy/softroce/rxe-run, with the tree as the
#      share: first the way lockd.service does (ExecStartPre, ExecStart, LimitMEMLOCK,
#      StateDirectory, RuntimeDirectory, UMask; tests/pkg/in-vm.sh): the packaged lockctl's
#      `status` must succeed against it with the package's key and be refused without it, and the
#      epoch must appear in /var/lib/rdmalock; then the
#      unit itself under systemd as PID 1, booting the tree with systemd-nspawn (systemd installed
#      after our packages; tests/pkg/nspawn.sh, in-container.sh): lockd.service is active after
#      boot, reloads, stops cleanly, starts again, and a reinstall (the upgrade path) leaves it
#      running;
#   5. removes and purges lockd (prerm/postrm must not fail; remove keeps the conffile and the
#      key, purge deletes both).
# Prints "pkg: <check>: ok" per check and "pkg: <check>: FAIL ..." on the first failure; exits
# non-zero if anything failed or could not run. Needs root, debootstrap, dpkg-dev and network
# access to the Debian archive (apt).
#   tests/pkg/run.sh [BUILD_DIR]      (default: build)
# RDMALOCK_PKG_WORK=DIR: where the tree copy goes (default BUILD_DIR/pkg-test, or the chroot
# cache's work/ when BUILD_DIR is under /tmp or /var/tmp, which the VM replaces);
# RDMALOCK_CHROOT_CACHE: see chroot-cache.sh.
set -euo pipefail
# Any command failing where no check expects it: say where, never exit silently.
trap 'echo "pkg: unexpected failure: FAIL at line $LINENO: $BASH_COMMAND (exit $?)"' ERR
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
# The VM replaces /tmp and /var/tmp with tmpfs, so a build under them (a CI clone in /tmp) keeps
# its tree copy in the chroot cache's directory instead.
case $build in
  /tmp/* | /var/tmp/*) default_work=${RDMALOCK_CHROOT_CACHE:-/var/cache/rdmalock-chroot}/work ;;
  *) default_work=$build/pkg-test ;;
esac
work=${RDMALOCK_PKG_WORK:-$default_work}
tree=$work/root
debs_in_tree=/srv/rdmalock-debs

ok() { echo "pkg: $*: ok"; }
fail() {
  echo "pkg: $1: FAIL"
  shift
  [ $# -eq 0 ] || printf 'pkg:   %s\n' "$@"
  exit 1
}
in_tree() { chroot "$tree" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 "$@"; }

cleanup() {
  # Host-side mounts of the tree (apt's /proc); never leave them behind.
  if mountpoint -q "$tree/proc" 2>/dev/null; then umount "$tree/proc" || true; fi
}
trap cleanup EXIT

# ---- preconditions: fail, never skip
[ "$(id -u)" -eq 0 ] || fail "preconditions" "needs root (chroot, mounts)"
for tool in debootstrap dpkg-shlibdeps cpack systemd-nspawn; do
  command -v "$tool" >/dev/null || fail "preconditions" "$tool is missing (deploy/install-deps.sh)"
done
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
[ "$prefix" = /usr ] || fail "preconditions" \
  "$build is configured with CMAKE_INSTALL_PREFIX='$prefix'; packages need /usr:" \
  "cmake -S $root -B $build -DCMAKE_INSTALL_PREFIX=/usr"
case $work in
  /tmp/* | /var/tmp/*) fail "preconditions" "RDMALOCK_PKG_WORK=$work: the VM mounts tmpfs over /tmp and /var/tmp" ;;
esac

# ---- 1. build the packages
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
[ -n "$version" ] || fail "build packages" "no CMAKE_PROJECT_VERSION in $build/CMakeCache.txt"
debver="$version-1"
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
# cpack reads CPackConfig.cmake first, so regenerate it; then cpack builds the tree (its preinstall
# step) and installs each component.
cmake -S "$root" -B "$build" >/dev/null || fail "build packages" "configuring $build failed"
rm -rf "$build/pkg"
if ! cpack --config "$build/CPackConfig.cmake" >"$build/cpack.log" 2>&1; then
  fail "build packages" "cpack failed:" "$(tail -20 "$build/cpack.log")"
fi
# Every package of the build; python3-rdmalock is Architecture: all.
packages=(lockd librdmalock librdmalock-dev lockctl python3-rdmalock)
arch_of() { if [ "$1" = python3-rdmalock ]; then echo all; else echo "$arch"; fi; }
debs=()
for p in "${packages[@]}"; do
  f="$build/pkg/${p}_${debver}_$(arch_of "$p").deb"
  [ -f "$f" ] || fail "build packages" "no $f; cpack made: $(cd "$build/pkg" && echo ./*.deb)"
  debs+=("$f")
done
ok "build packages (${debs[*]##*/})"

# Everything `cmake --install` installs is in some package (an install rule without a COMPONENT
# would fall out of every package silently).
inst=$(mktemp -d)
DESTDIR=$inst cmake --install "$build" >/dev/null || fail "every installed file packaged" "cmake --install failed"
installed=$(cd "$inst" && find . ! -type d | sed 's|^\.||' | sort)
rm -rf "$inst"
packaged=$(for f in "${debs[@]}"; do dpkg-deb -c "$f"; done | awk '$1 !~ /^d/ { print $6 }' | sed 's|^\.||' | sort)
unpackaged=$(comm -23 <(echo "$installed") <(echo "$packaged"))
[ -z "$unpackaged" ] || fail "every installed file packaged" "installed by cmake --install but in no package:" "$unpackaged"
ok "every installed file packaged ($(wc -l <<<"$installed") files)"

# ---- control data
field() { dpkg-deb -f "$1" "$2"; }
deb_of() { echo "$build/pkg/${1}_${debver}_$(arch_of "$1").deb"; }
for p in "${packages[@]}"; do
  echo "pkg:   $p: Depends: $(field "$(deb_of "$p")" Depends)"
done
echo "pkg:   lockd: Recommends: $(field "$(deb_of lockd)" Recommends); Suggests: $(field "$(deb_of lockd)" Suggests)"
need_dep() {  # package field pattern
  local value
  value=$(field "$(deb_of "$1")" "$2")
  grep -qE "(^|, )$3(,|$)" <<<"$value" || fail "control data" "$1's $2 lacks '$3': $value"
}
exact="\\(= ${debver//./\\.}\\)"
need_dep lockctl Depends "librdmalock $exact"
need_dep librdmalock-dev Depends "librdmalock $exact"
# The Python package loads librdmalock.so.0 with ctypes (invisible to dpkg-shlibdeps): exact.
need_dep python3-rdmalock Depends "librdmalock $exact"
need_dep python3-rdmalock Depends "python3"
[ "$(field "$(deb_of python3-rdmalock)" Architecture)" = all ] ||
  fail "control data" "python3-rdmalock is Architecture: $(field "$(deb_of python3-rdmalock)" Architecture), want all"
# dpkg-shlibdeps ran: the libraries each binary links come with version floors.
need_dep lockd Depends "libibverbs1 \\(>= [^)]*\\)"
need_dep lockd Depends "librdmacm1 \\(>= [^)]*\\)"
need_dep lockd Depends "libsystemd0( \\(>= [^)]*\\))?"
need_dep lockd Depends "libc6 \\(>= [^)]*\\)"
need_dep librdmalock Depends "libibverbs1 \\(>= [^)]*\\)"
need_dep lockctl Depends "libyaml-cpp[0-9.]+( \\(>= [^)]*\\))?"
need_dep lockd Recommends "rdma-core"
need_dep lockd Depends "procps"  # /bin/kill for the unit's ExecReload
# lockd is static in the engine; librdmalock's consumers are lockctl and -dev only.
if field "$(deb_of lockd)" Depends | grep -q librdmalock; then
  fail "control data" "lockd depends on librdmalock, which it does not link"
fi
ctl=$(mktemp -d)
dpkg-deb -e "$(deb_of lockd)" "$ctl/lockd"
dpkg-deb -e "$(deb_of librdmalock)" "$ctl/lib"
[ "$(cat "$ctl/lockd/conffiles")" = /etc/rdmalock/lockd.yaml ] ||
  fail "control data" "lockd's conffiles is not exactly /etc/rdmalock/lockd.yaml: $(cat "$ctl/lockd/conffiles")"
for s in postinst prerm postrm; do
  [ -x "$ctl/lockd/$s" ] || fail "control data" "lockd has no executable $s"
done
grep -qx "librdmalock 0 librdmalock (>= $debver)" "$ctl/lib/shlibs" ||
  fail "control data" "librdmalock's shlibs is not 'librdmalock 0 librdmalock (>= $debver)': $(cat "$ctl/lib/shlibs")"
rm -rf "$ctl"
ok "control data (exact inter-package versions, shlibdeps, conffiles, maintainer scripts, shlibs; python3-rdmalock Architecture: all)"

# ---- 2. a fresh clean tree; apt installs the five .debs and their dependencies
base=$("$root/tests/pkg/chroot-cache.sh") || fail "clean Debian 12 tree" "tests/pkg/chroot-cache.sh failed"
rm -rf "$work"
mkdir -p "$work"
cp -a "$base" "$tree"
cp -L /etc/resolv.conf "$tree/etc/resolv.conf"
# The cached lists age: refresh them, or apt would ask for .debs the archive has replaced.
in_tree apt-get -q update >"$work/apt-update.log" 2>&1 ||
  fail "clean Debian 12 tree" "apt-get update failed: $(tail -5 "$work/apt-update.log")"
mkdir -p "$tree$debs_in_tree"
cp "${debs[@]}" "$tree$debs_in_tree/"
chmod -R a+rX "$tree$debs_in_tree"
ok "clean Debian 12 tree ($(in_tree sh -c '. /etc/os-release; echo "$PRETTY_NAME"'), copied from $base)"
[ ! -e "$tree/run/systemd/system" ] || fail "clean Debian 12 tree" "has /run/systemd/system: it would look like a booted systemd"

mount -t proc proc "$tree/proc" || fail "apt-get install" "cannot mount /proc in $tree"
apt_log=$work/apt-install.log
tree_debs=()
for f in "${debs[@]}"; do tree_debs+=("$debs_in_tree/${f##*/}"); done
rc=0
in_tree env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0 install "${tree_debs[@]}" \
  >"$apt_log" 2>&1 || rc=$?
# The key lines: what apt pulled in, and our five packages being configured.
awk '/^The following NEW packages/ { p = 1; print; next } p && /^  / { print; next } { p = 0 }
  /newly installed/ || /^Setting up (lockd|librdmalock|librdmalock-dev|lockctl|python3-rdmalock) / { print }' "$apt_log" |
  sed 's/^/pkg:   apt: /'
[ "$rc" -eq 0 ] || fail "apt-get install" "apt-get install exited $rc:" "$(tail -20 "$apt_log")"
# Anything dpkg or a maintainer script complains about is a failure, even with exit status 0.
problems=$(grep -E '^(E:|W:)|dpkg: (error|warning)|warning:|error:|[Ff]ailed|not found|Traceback' "$apt_log" || true)
[ -z "$problems" ] || fail "apt-get install" "problems in $apt_log:" "$problems"
# Our maintainer scripts print nothing: after "Setting up <ours>" comes dpkg's next step.
chatter=$(awk '/^Setting up (lockd|librdmalock|librdmalock-dev|lockctl|python3-rdmalock) / { ours = $3; next }
  ours != "" && !/^(Setting up|Processing triggers|Unpacking|Preparing|Selecting|\(Reading)/ { print ours ": " $0 }
  { ours = "" }' "$apt_log")
[ -z "$chatter" ] || fail "apt-get install" "our maintainer scripts printed:" "$chatter"
audit=$(in_tree dpkg --audit)
[ -z "$audit" ] || fail "apt-get install" "dpkg --audit: $audit"
for p in "${packages[@]}"; do
  st=$(in_tree dpkg-query -W -f='${Status} ${Version}' "$p")
  [ "$st" = "install ok installed $debver" ] || fail "apt-get install" "$p: '$st'"
done
ok "apt-get install ./*.deb resolved the dependencies from the archive; dpkg reported no problem"

# ---- 3. files, binaries, conffile, unit
files() { in_tree dpkg -L "$1"; }
has() {  # package path...
  local p=$1 list f
  shift
  list=$(files "$p")
  for f in "$@"; do
    grep -qx "$f" <<<"$list" || fail "file placement" "$p does not ship $f"
    [ -e "$tree$f" ] || [ -L "$tree$f" ] || fail "file placement" "$p lists $f but it is not in the tree"
  done
}
libdir=/usr/lib/$multiarch
has lockd /usr/sbin/lockd /usr/lib/systemd/system/lockd.service /usr/share/man/man8/lockd.8 \
  /etc/rdmalock/lockd.yaml /usr/share/doc/rdmalock/operations.md /usr/share/doc/rdmalock/README.md \
  /usr/share/doc/rdmalock/security.md \
  /usr/share/doc/rdmalock/examples/lockd.yaml
has librdmalock "$libdir/librdmalock.so.0" "$libdir/librdmalock.so.$version"
has librdmalock-dev /usr/include/rdmalock/client.h /usr/include/rdmalock/status.h \
  /usr/include/rdmalock/export.h "$libdir/librdmalock.so" "$libdir/cmake/rdmalock/rdmalockConfig.cmake" \
  "$libdir/cmake/rdmalock/rdmalockConfigVersion.cmake" "$libdir/cmake/rdmalock/rdmalockTargets.cmake" \
  "$libdir/pkgconfig/rdmalock.pc"
has lockctl /usr/bin/lockctl /usr/share/man/man1/lockctl.1
pydir=/usr/lib/python3/dist-packages
has python3-rdmalock "$pydir/rdmalock/__init__.py" "$pydir/rdmalock/py.typed" \
  "$pydir/rdmalock-$version.dist-info/METADATA"
# The runtime package has no development symlink; nothing lands in /usr/etc, /usr/local or /tmp.
if files librdmalock | grep -qx "$libdir/librdmalock.so"; then
  fail "file placement" "librdmalock ships the development symlink librdmalock.so"
fi
stray=$(for p in "${packages[@]}"; do files "$p"; done |
  grep -E '^/(usr/etc|usr/local|tmp|home|root)(/|$)' || true)
[ -z "$stray" ] || fail "file placement" "files in the wrong place:" "$stray"
soname=$(objdump -p "$tree$libdir/librdmalock.so.$version" | awk '/SONAME/ { print $2 }')
[ "$soname" = librdmalock.so.0 ] || fail "file placement" "SONAME is '$soname'"
ok "file placement (dpkg -L; SONAME librdmalock.so.0)"

out=$(in_tree lockd --version) || fail "packaged binaries" "lockd --version failed: $out"
[ "$out" = "lockd $version" ] || fail "packaged binaries" "lockd --version printed '$out', want 'lockd $version'"
out=$(in_tree lockd --check-config --config /etc/rdmalock/lockd.yaml 2>&1) ||
  fail "packaged binaries" "lockd --check-config of the shipped conffile failed: $out"
grep -q "configuration OK" <<<"$out" || fail "packaged binaries" "lockd --check-config said: $out"
# lockctl loads librdmalock.so.0 from the librdmalock package (no RUNPATH, no build tree).
out=$(in_tree lockctl --help 2>&1) || fail "packaged binaries" "lockctl --help failed: $out"
lib=$(in_tree sh -c 'ldd /usr/bin/lockctl' | awk '$1 == "librdmalock.so.0" { print $3 }')
# (/lib is /usr/lib in a merged-/usr tree, as bookworm's are.)
[ "$lib" = "$libdir/librdmalock.so.0" ] || [ "$lib" = "/lib/$multiarch/librdmalock.so.0" ] || fail "packaged binaries" "lockctl loads librdmalock.so.0 from '$lib'"
missing=$(in_tree sh -c 'ldd /usr/sbin/lockd /usr/bin/lockctl' | grep 'not found' || true)
[ -z "$missing" ] || fail "packaged binaries" "unresolved libraries:" "$missing"
ok "packaged binaries (lockd --version: $version; --check-config of /etc/rdmalock/lockd.yaml; lockctl loads $lib)"

# python3-rdmalock in the tree: the system python3 imports it with no RDMALOCK_LIBRARY, and it
# loads librdmalock.so.0 from the librdmalock package (not a build tree: there is none here).
pyout=$(in_tree python3 -c '
import importlib.metadata, rdmalock
v = rdmalock.library_version()
lib = next(l.split()[-1] for l in open("/proc/self/maps") if "librdmalock.so" in l)
print(rdmalock.__version__, importlib.metadata.version("rdmalock"), v, lib, rdmalock.__file__)
' 2>&1) || fail "python3-rdmalock imports" "python3 -c 'import rdmalock' in the tree failed: $pyout"
read -r py_version py_meta py_lib_version py_lib py_file <<<"$pyout"
{ [ "$py_version" = "$version" ] && [ "$py_meta" = "$version" ] && [ "$py_lib_version" = "$version" ]; } ||
  fail "python3-rdmalock imports" "versions (module, metadata, librdmalock): $pyout; want $version"
case $py_lib in
  "$libdir/librdmalock.so.$version" | "/lib/$multiarch/librdmalock.so.$version") ;;
  *) fail "python3-rdmalock imports" "rdmalock loaded '$py_lib', not the librdmalock package's" ;;
esac
ok "python3-rdmalock imports (rdmalock $py_version from $py_file; loads $py_lib)"

# pip install of the source tree, offline (--no-build-isolation --no-index, Debian's setuptools),
# into a venv on the host; it imports from the venv and reports the version.
pipout=$("$root/tests/python/pip-install.sh" "$build/librdmalock.so" 2>&1) ||
  fail "pip install ./python (offline, venv)" "tests/python/pip-install.sh failed:" "$pipout"
grep -qx "pip-install: rdmalock $version (librdmalock $version) from .*" <<<"$pipout" ||
  fail "pip install ./python (offline, venv)" "it printed: $pipout"
ok "pip install ./python (offline, venv): ${pipout#pip-install: }"

# Issue 17 finding 15: the package must not install an open lockd (its unit is enabled, so the next
# boot starts it). postinst generates the shared key if there is none, root's only (lockd refuses
# a looser mode); the conffile requires it, so a client without the key gets no rkey; without the
# key lockd refuses to start (ExecStartPre --check-config fails) and says which file it wants.
f15="issue 17 finding 15: the installed lockd is not open"
keyf=/etc/rdmalock/lockd.key
{ [ -f "$tree$keyf" ] && [ ! -L "$tree$keyf" ]; } ||
  fail "$f15" "the package installed no $keyf (postinst generates none): the shipped config" \
    "$(grep -E '^(address|auth_key_file):' "$tree/etc/rdmalock/lockd.yaml" | tr '\n' ' ')serves anyone who reaches the port"
perm=$(stat -c '%a %U:%G' "$tree$keyf")
[ "$perm" = "600 root:root" ] || fail "$f15" "$keyf is $perm, want 600 root:root (lockd refuses group or other access)"
{ grep -qxE '[0-9a-f]{64}' "$tree$keyf" && [ "$(wc -l <"$tree$keyf")" -eq 1 ]; } ||
  fail "$f15" "$keyf is not one line of 64 hex digits (32 random bytes, as lockctl keygen prints)"
eff=$(in_tree lockd --print-config --config /etc/rdmalock/lockd.yaml 2>&1) || fail "$f15" "lockd --print-config failed: $eff"
grep -qx "auth_key_file: \"$keyf\"" <<<"$eff" ||
  fail "$f15" "the installed config does not require the key: $(grep '^auth_key_file:' <<<"$eff")"
mv "$tree$keyf" "$tree$keyf.away"
rc=0
out=$(in_tree lockd --check-config --config /etc/rdmalock/lockd.yaml 2>&1) || rc=$?
mv "$tree$keyf.away" "$tree$keyf"
{ [ "$rc" -eq 2 ] && grep -q "$keyf" <<<"$out"; } ||
  fail "$f15" "without $keyf, lockd --check-config (the unit's ExecStartPre) exited $rc: $out"
key_sum=$(sha256sum <"$tree$keyf")
ok "$f15 (postinst generated $keyf, $perm, 64 hex digits; the conffile requires it; without it the unit's check fails: $out)"

# The conffile: registered with dpkg, and an admin's edit survives reinstalling the package.
conf=$(in_tree dpkg-query -W -f='${Conffiles}\n' lockd | awk 'NF { print $1 }')
[ "$conf" = /etc/rdmalock/lockd.yaml ] || fail "conffile" "dpkg's conffiles for lockd: '$conf'"
echo "# edited by tests/pkg/run.sh" >>"$tree/etc/rdmalock/lockd.yaml"
in_tree env DEBIAN_FRONTEND=noninteractive dpkg -i "${tree_debs[0]}" >"$work/reinstall.log" 2>&1 ||
  fail "conffile" "reinstalling lockd failed: $(tail -5 "$work/reinstall.log")"
tail -1 "$tree/etc/rdmalock/lockd.yaml" | grep -q "edited by tests/pkg/run.sh" ||
  fail "conffile" "reinstalling lockd overwrote the edited /etc/rdmalock/lockd.yaml"
ok "conffile (/etc/rdmalock/lockd.yaml registered; an edit survives a reinstall)"
[ "$(sha256sum <"$tree$keyf")" = "$key_sum" ] || fail "$f15: a reinstall keeps the key" "reinstalling lockd replaced $keyf"
[ "$(stat -c '%a %U:%G' "$tree$keyf")" = "600 root:root" ] ||
  fail "$f15: a reinstall keeps the key" "after a reinstall $keyf is $(stat -c '%a %U:%G' "$tree$keyf")"
ok "$f15: a reinstall keeps the key (same bytes, 600 root:root)"

# postinst enabled the unit (deb-systemd-helper, no systemd running), started nothing.
link=$(readlink "$tree/etc/systemd/system/multi-user.target.wants/lockd.service" || true)
case $link in
  /lib/systemd/system/lockd.service | /usr/lib/systemd/system/lockd.service) ;;
  *) fail "unit enabled" "no multi-user.target.wants/lockd.service symlink (got '$link')" ;;
esac
ok "unit enabled by postinst without a running systemd ($link)"

# systemd for the boot under systemd-nspawn (step 4); installed after our packages, so the enable
# symlink their postinst made is what starts lockd at boot.
in_tree env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0 install systemd \
  >"$work/apt-systemd.log" 2>&1 || fail "systemd in the tree" "apt-get install systemd failed: $(tail -5 "$work/apt-systemd.log")"
umount "$tree/proc"

# ---- 4. the packaged lockd on real verbs in one VM boot: as the unit runs it (in-vm.sh), then
# under systemd as PID 1 in a systemd-nspawn container (nspawn.sh)
{
  rc=0
  "$root/deploy/softroce/rxe-run" --share "$work" --timeout 900 -- \
    sh -c '"$0/in-vm.sh" "$1" && "$0/nspawn.sh" "$1"' "$root/tests/pkg" "$tree" 2>&1 || rc=$?
  echo "$rc" >"$work/vm.rc"
} | tee "$work/vm.log"
rc=$(cat "$work/vm.rc")
grep -q '^pkg-vm: all checks passed$' "$work/vm.log" ||
  fail "packaged lockd on rdma_rxe" "the VM run exited $rc without passing its checks (log: $work/vm.log)"
grep -q '^pkg-vm: the installed config refuses a client without the key' "$work/vm.log" ||
  fail "$f15: a client without the key is refused on rdma_rxe" "in-vm.sh did not show it (log: $work/vm.log)"
ok "$f15: a client without the key is refused on rdma_rxe ('authentication failed'; the packaged lockctl with $keyf is served)"
ok "packaged lockd on rdma_rxe (unit settings, lockctl status, epoch in /var/lib/rdmalock, clean stop)"
pyline=$(sed -n 's/^pkg-vm: python3-rdmalock: //p' "$work/vm.log")
[ -n "$pyline" ] || fail "python3-rdmalock on rdma_rxe" "in-vm.sh took no lock through the package (log: $work/vm.log)"
ok "python3-rdmalock on rdma_rxe (a lock through the package against the packaged lockd: $pyline)"
grep -q '^pkg-nspawn: all checks passed$' "$work/vm.log" ||
  fail "lockd.service under systemd (nspawn)" "the VM run exited $rc without passing its checks (log: $work/vm.log)"
[ "$rc" -eq 0 ] || fail "lockd.service under systemd (nspawn)" "the VM run exited $rc (log: $work/vm.log)"
ok "lockd.service under systemd (nspawn): started at boot (READY=1), lockctl status, reload, stop, start; an upgrade leaves it running"

# ---- 5. remove, then purge
mount -t proc proc "$tree/proc"
in_tree env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0 remove lockd >"$work/remove.log" 2>&1 ||
  fail "remove and purge" "apt-get remove lockd failed: $(tail -5 "$work/remove.log")"
st=$(in_tree dpkg-query -W -f='${Status}' lockd)
[ "$st" = "deinstall ok config-files" ] || fail "remove and purge" "after apt-get remove lockd is '$st'"
[ -f "$tree/etc/rdmalock/lockd.yaml" ] || fail "remove and purge" "remove deleted the conffile"
[ -f "$tree$keyf" ] || fail "remove and purge" "remove deleted $keyf (the clients' copies would no longer match a reinstall)"
[ ! -e "$tree/usr/sbin/lockd" ] || fail "remove and purge" "remove left /usr/sbin/lockd"
in_tree env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0 purge lockd >>"$work/remove.log" 2>&1 ||
  fail "remove and purge" "apt-get purge lockd failed: $(tail -5 "$work/remove.log")"
problems=$(grep -E '^(E:|W:)|dpkg: (error|warning)|warning:|error:' "$work/remove.log" || true)
[ -z "$problems" ] || fail "remove and purge" "problems in $work/remove.log:" "$problems"
[ ! -e "$tree/etc/rdmalock/lockd.yaml" ] || fail "remove and purge" "purge left /etc/rdmalock/lockd.yaml"
[ ! -e "$tree/etc/systemd/system/multi-user.target.wants/lockd.service" ] ||
  fail "remove and purge" "purge left the enable symlink"
[ ! -e "$tree/etc/systemd/system/lockd.service" ] || fail "remove and purge" "purge left a mask"
[ -f "$tree/var/lib/rdmalock/epoch" ] || fail "remove and purge" "purge removed /var/lib/rdmalock/epoch"
[ ! -e "$tree$keyf" ] || fail "$f15: purge removes the key" "purge left $keyf"
[ ! -e "$tree/etc/rdmalock" ] || fail "$f15: purge removes the key" "purge left /etc/rdmalock: $(ls -A "$tree/etc/rdmalock")"
ok "$f15: purge removes the key (and /etc/rdmalock)"
ok "remove and purge (remove kept the conffile; purge removed it, the enable symlink and the mask; epoch kept)"
umount "$tree/proc"
echo "pkg: all checks passed"
