#!/usr/bin/env bash
# shellcheck disable=SC2016  # single-quoted $(...) and ${...} are apt and dpkg-query formats
# Prints the path of a pristine Debian 12 (bookworm) minbase tree, building it first if it is not
# cached: debootstrap --variant=minbase from the Debian archive this host's apt uses, plus that
# archive's bookworm-updates and bookworm-security suites in its apt sources (as on the host).
# Cached under ${RDMALOCK_CHROOT_CACHE:-/var/cache/rdmalock-chroot}/<key>/root; builds are
# serialized with flock (racing runs wait and reuse), older keys are removed. Never modify the
# cached tree: copy it (tests/pkg/run.sh does `cp -a`). Needs root.
#   chroot-cache.sh
set -euo pipefail

# Bump when what goes into the tree changes: it is part of the cache key.
readonly REV=1
readonly SUITE=bookworm

die() { echo "chroot-cache: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot)"
command -v debootstrap >/dev/null || die "debootstrap is not installed (deploy/install-deps.sh)"

# The host's Debian sources for this suite: "URI SUITE COMPONENT" lines, e.g.
# "http://deb.debian.org/debian/ bookworm main".
sources=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' 'Created-By: Packages' |
  awk -v s="$SUITE" '$2 == s || $2 == s "-updates" || $2 == s "-security"' | sort -u)
mirror=$(awk -v s="$SUITE" '$2 == s { print $1; exit }' <<<"$sources")
[ -n "$mirror" ] || die "this host's apt has no '$SUITE' suite to debootstrap from (apt-get indextargets)"

cache=${RDMALOCK_CHROOT_CACHE:-/var/cache/rdmalock-chroot}
key="$SUITE-minbase-r$REV-$(printf '%s\n' "$sources" | md5sum | cut -c1-8)"
mkdir -p "$cache" || die "cannot create $cache"
exec 9>"$cache/lock"
flock 9
if [ ! -f "$cache/$key/ok" ]; then
  echo "chroot-cache: building $cache/$key (debootstrap --variant=minbase $SUITE $mirror)" >&2
  rm -rf "${cache:?}/$key"
  mkdir -p "$cache/$key"
  if ! debootstrap --variant=minbase "$SUITE" "$cache/$key/root" "$mirror" >"$cache/$key/debootstrap.log" 2>&1; then
    tail -20 "$cache/$key/debootstrap.log" >&2
    die "debootstrap failed (log: $cache/$key/debootstrap.log)"
  fi
  awk '{ print "deb " $1 " " $2 " " $3 }' <<<"$sources" >"$cache/$key/root/etc/apt/sources.list"
  # Package lists for every suite, so a copy installs without an update first; no .debs kept.
  chroot "$cache/$key/root" apt-get -q update >>"$cache/$key/debootstrap.log" 2>&1 ||
    die "apt-get update in the new tree failed (log: $cache/$key/debootstrap.log)"
  chroot "$cache/$key/root" apt-get clean
  touch "$cache/$key/ok"
  for old in "$cache"/*/; do
    [ "$old" = "$cache/$key/" ] || rm -rf "$old"
  done
fi
echo "$cache/$key/root"
