#!/usr/bin/env bash
# Install hixl from BUILD into a fresh prefix, then build and run a consumer with
# pkg-config and with find_package(hixl): headers, library, hixl.pc and the CMake
# package config all have to be right for this to pass.
set -euo pipefail
build=$1 src=$(cd "$(dirname "$0")" && pwd)
extra=${2:-} # compiler flags the library was built with that a consumer needs (sanitizers)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
libdir=$(find "$work/prefix" -name 'libhixl.so' -printf '%h\n' | head -n1)
test -f "$work/prefix/include/hixl/hixl.h"
readelf -d "$libdir/libhixl.so" | grep -q 'SONAME.*libhixl.so.0'
test -f "$libdir/libhixl.a"
# No internal header is installed.
test ! -e "$work/prefix/include/hixl/wire.h"

export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c11 -Wall -Werror $extra "$src/consumer.c" -o "$work/consumer_pc" $(pkg-config --cflags --libs hixl) \
  -Wl,-rpath,"$libdir"
"$work/consumer_pc"
# libhixl-config, its header, hixl-config.pc and the hixl-config tool.
test -f "$work/prefix/include/hixl/hixl_config.h"
cc -std=c11 -Wall -Werror $extra "$src/consumer_config.c" -o "$work/consumer_config" \
  $(pkg-config --cflags --libs hixl-config) -Wl,-rpath,"$libdir"
"$work/consumer_config"
LD_LIBRARY_PATH="$libdir" "$work/prefix/bin/hixl-config" reference >"$work/reference.md"
grep -q '^| `lease_ms` | integer | `30000`' "$work/reference.md"

mkdir -p "$work/cm"
cp "$src/consumer.c" "$work/cm/"
cp "$src/CMakeLists.txt.in" "$work/cm/CMakeLists.txt"
cmake -S "$work/cm" -B "$work/cm/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_C_FLAGS="$extra" >/dev/null
cmake --build "$work/cm/build" >/dev/null
LD_LIBRARY_PATH="$libdir" "$work/cm/build/consumer"
echo "install: headers, libhixl.so (SONAME libhixl.so.0), libhixl.a, hixl.pc, hixlConfig.cmake, libhixl-config, hixl-config.pc and hixl-config work"
