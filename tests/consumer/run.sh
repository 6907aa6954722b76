#!/bin/sh
# Installs the build tree into a temporary prefix, then builds tests/consumer against it twice:
# with CMake (find_package(rdmalock CONFIG)) and with pkg-config, and runs both. Also checks that
# librdmalock has a SONAME and exports no internal symbol.
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
leaked=$(echo "$syms" | grep -v -E '^rdmalock::(Client|LockHandle|Status|SlotForName|ErrorCodeName)\b' || true)
leaked="$leaked$(echo "$syms" | grep -E '^rdmalock::(Client::Impl|LockHandle::State)' || true)"
if [ -n "$leaked" ]; then
  echo "librdmalock exports internal symbols:"; echo "$leaked" | head -20; exit 1
fi
public=$(nm -DC --defined-only "$lib" | grep -c ' rdmalock::Client::Connect' || true)
[ "$public" -ge 1 ] || { echo "rdmalock::Client::Connect is not exported"; exit 1; }
for f in include/rdmalock/client.h include/rdmalock/status.h include/rdmalock/export.h \
  sbin/lockd bin/lockctl lib/systemd/system/lockd.service share/man/man8/lockd.8 \
  share/man/man1/lockctl.1; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done

# 1. CMake package.
cmake -S "$src/tests/consumer" -B "$prefix/consumer-cmake" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer-cmake" >/dev/null
"$prefix/consumer-cmake/consumer"

# 2. pkg-config.
pc=$(dirname "$(find "$prefix" -name rdmalock.pc | head -1)")
flags=$(PKG_CONFIG_PATH=$pc pkg-config --cflags --libs rdmalock)
libdir=$(PKG_CONFIG_PATH=$pc pkg-config --variable=libdir rdmalock)
# shellcheck disable=SC2086
c++ -std=c++20 "$src/tests/consumer/main.cc" $flags -o "$prefix/consumer-pc"
LD_LIBRARY_PATH=$libdir "$prefix/consumer-pc"
echo "installed SDK builds and runs with CMake and pkg-config"
