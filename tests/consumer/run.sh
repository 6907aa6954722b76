#!/bin/sh
# Installs the build tree into a temporary prefix, then builds tests/consumer against it twice:
# with CMake (find_package(rdmalock CONFIG)) and with pkg-config, each a C++ and a C program, and
# runs them. Also checks that librdmalock has a SONAME, exports no internal symbol, and exports
# every function rdmalock.h (the C API) declares.
#   run.sh BUILD_DIR SOURCE_DIR
set -eu
build=$1 src=$2
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
lib=$(find "$prefix" -name 'librdmalock.so.0' | head -1)
[ -n "$lib" ] || { echo "librdmalock.so.0 not installed"; exit 1; }
soname=$(objdump -p "$lib" | awk '/SONAME/ { print $2 }')
[ "$soname" = "librdmalock.so.0" ] || { echo "SONAME is '$soname', want librdmalock.so.0"; exit 1; }
# Exported rdmalock symbols must all belong to the public API (not the SDK's Impl/State, not the
# engine). Template instantiations of std:: over our types are weak symbols of std::, not checked.
syms=$(nm -DC --defined-only "$lib" | sed -n 's/^[0-9a-f]* [A-Za-z] //p' | grep '^rdmalock::' || true)
leaked=$(echo "$syms" | grep -v -E '^rdmalock::(Client|LockHandle|Status|SlotForName|ErrorCodeName|ClusterClient|ClusterMap|ShardForName|ReadClusterMap|PublishClusterMap|operator[+-]=\(rdmalock::ClientStats)\b' || true)
leaked="$leaked$(echo "$syms" | grep -E '^rdmalock::(Client::Impl|LockHandle::State|ClusterClient::Impl)' || true)"
if [ -n "$leaked" ]; then
  echo "librdmalock exports internal symbols:"; echo "$leaked" | head -20; exit 1
fi
public=$(nm -DC --defined-only "$lib" | grep -c ' rdmalock::Client::Connect' || true)
[ "$public" -ge 1 ] || { echo "rdmalock::Client::Connect is not exported"; exit 1; }
# C symbols (not mangled): only the C API's rdmalock_* functions (names starting with '_' belong
# to the toolchain).
csyms=$(nm -D --defined-only "$lib" | sed -n 's/^[0-9a-f]* [A-Za-z] //p' | grep -v '^_' || true)
leaked=$(echo "$csyms" | grep -v '^rdmalock_' | grep . || true)
if [ -n "$leaked" ]; then
  echo "librdmalock exports C symbols outside the C API:"; echo "$leaked" | head -20; exit 1
fi
header=$prefix/include/rdmalock/rdmalock.h
[ -e "$header" ] || { echo "not installed: include/rdmalock/rdmalock.h"; exit 1; }
declared=$(tr '\n' ' ' <"$header" | grep -o 'RDMALOCK_C_EXPORT [^(]*(' |
  sed -n 's/.*[ *]\(rdmalock_[a-z0-9_]*\)($/\1/p' | sort -u)
[ "$(echo "$declared" | wc -l)" -ge 20 ] || { echo "rdmalock.h declares too few functions"; exit 1; }
for f in $declared; do
  echo "$csyms" | grep -qx "$f" || { echo "rdmalock.h declares $f; librdmalock does not export it"; exit 1; }
done
for f in $csyms; do
  echo "$declared" | grep -qx "$f" || { echo "librdmalock exports $f; rdmalock.h does not declare it"; exit 1; }
done
for f in include/rdmalock/client.h include/rdmalock/status.h include/rdmalock/export.h \
  include/rdmalock/rdmalock.h \
  sbin/lockd bin/lockctl lib/systemd/system/lockd.service share/man/man8/lockd.8 \
  share/man/man1/lockctl.1; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done

# 1. CMake package.
cmake -S "$src/tests/consumer" -B "$prefix/consumer-cmake" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer-cmake" >/dev/null
"$prefix/consumer-cmake/consumer"
"$prefix/consumer-cmake/consumer_c"

# 2. pkg-config.
pc=$(dirname "$(find "$prefix" -name rdmalock.pc | head -1)")
flags=$(PKG_CONFIG_PATH=$pc pkg-config --cflags --libs rdmalock)
libdir=$(PKG_CONFIG_PATH=$pc pkg-config --variable=libdir rdmalock)
# shellcheck disable=SC2086
c++ -std=c++20 "$src/tests/consumer/main.cc" $flags -o "$prefix/consumer-pc"
LD_LIBRARY_PATH=$libdir "$prefix/consumer-pc"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Werror -pedantic "$src/tests/consumer/main.c" $flags -o "$prefix/consumer-pc-c"
LD_LIBRARY_PATH=$libdir "$prefix/consumer-pc-c"
echo "installed SDK builds and runs with CMake and pkg-config"
