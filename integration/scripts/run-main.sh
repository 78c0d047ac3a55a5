#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
bash "$top/integration/scripts/install-deps.sh"
cmake -S "$top" -B "$top/build" -DCMAKE_BUILD_TYPE=Release -DHIXL_BUILD_TESTS=OFF >/dev/null
cmake --build "$top/build" -j"$(nproc)" >/dev/null
exec "$top/build/integration/demo/hixl-demo" "$@"
