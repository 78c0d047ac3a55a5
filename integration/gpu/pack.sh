#!/usr/bin/env bash
# pack.sh BUILD_DIR [PACK_DIR]
#
# What run-gpu-checks.sh needs on the lent GPU machine, which reaches nothing outside
# and need not have this machine's libraries: BUILD_DIR's CTest files and the programs
# of the tests it runs there (tests.sh), stripped of their debug information, in
# PACK_DIR/build, and every shared library they load but the C and C++ runtimes' own
# (libhixl, the plugin, json-c, CUnit, libibverbs, libcrypto, ...) in PACK_DIR/lib. PACK_DIR (default gpu-pack, at the checkout's root, which git
# ignores) is what the device run carries; CTest's files name this build's and this
# checkout's paths, which the pack records for run-gpu-checks.sh to point at the copy's.
# BUILD_DIR: a build with tests where CUDA's cuda.h was found (gpu_check is built only
# there), RelWithDebInfo or Release:
#   cmake -S . -B build-rel -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build-rel -j
#   bash integration/gpu/pack.sh build-rel
# then, on the device: bash integration/gpu/run-gpu-checks.sh gpu-pack $OUT/gpu
set -euo pipefail
build=$(cd "${1:?usage: pack.sh BUILD_DIR [PACK_DIR]}" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
pack=${2:-$src/gpu-pack}
die() {
  echo "pack.sh: $*" >&2
  exit 1
}
[ -f "$build/CTestTestfile.cmake" ] || die "$build is not a CMake build with tests"
[ -x "$build/integration/gpu/hixl-gpu-check" ] ||
  die "$build has no hixl-gpu-check: configure it where CUDA's cuda.h is (HIXL_CUDA_INCLUDE)"
. "$src/integration/gpu/tests.sh"
rm -rf "$pack"
mkdir -p "$pack/build" "$pack/lib"
(cd "$build" && find . -name CTestTestfile.cmake -print0 | tar --null -T - -cf -) | tar -C "$pack/build" -xf -
# The programs the selected tests run (CTest's own list of their commands), and the
# plugin the mock host loads.
progs=$(cd "$build" && ctest --show-only=json-v1 -R "$GPU_TESTS_R" -E "$GPU_TESTS_E" |
  python3 -c 'import json, sys; print("\n".join(sorted({t["command"][0] for t in json.load(sys.stdin)["tests"] if t.get("command")})))')
[ -n "$progs" ] || die "no test of $build matches $GPU_TESTS_R"
for p in $progs $(find "$build/plugin" -maxdepth 1 -name 'libhixl_kv_connector.so*'); do
  case $p in "$build"/*) ;; *) die "$p is outside $build" ;; esac
  mkdir -p "$pack/build/$(dirname "${p#"$build"/}")"
  cp -a "$p" "$pack/build/${p#"$build"/}"
done
# Every library they load, found here (ldd), but the runtimes'.
find "$pack/build" -type f \( -perm -u+x -o -name '*.so*' \) ! -name '*.cmake' -print0 |
  xargs -0 -r ldd 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux-x86-64|libgcc_s|libstdc\+\+)\.so' |
  while read -r lib; do cp -L "$lib" "$pack/lib/"; done
find "$pack" -type f \( -perm -u+x -o -name '*.so*' \) ! -name '*.cmake' -exec strip --strip-debug {} +
echo "$build" >"$pack/build.origin"
echo "$src" >"$pack/src.origin"
echo "pack.sh: $(du -sh "$pack" | cut -f1) in $pack ($(ls "$pack/lib" | wc -l) libraries)"
