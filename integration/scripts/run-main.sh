#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job: a serving
# runtime in miniature (hixl-mock-host) runs a prefill process and a decode process on
# 127.0.0.1, each loading the KV-connector plugin by dlopen, configured by
# config/examples/pd-local.json, and hands KV cache from prefill to decode, checking
# every byte. Extra arguments go to hixl-mock-host (--help lists them).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
bash "$top/integration/scripts/install-deps.sh"
cmake -S "$top" -B "$top/build" -DCMAKE_BUILD_TYPE=Release -DHIXL_BUILD_TESTS=OFF >/dev/null
cmake --build "$top/build" -j"$(nproc)" >/dev/null
config="$top/config/examples/pd-local.json"
"$top/build/config/hixl-config" check "$config"
exec "$top/build/integration/mock-host/hixl-mock-host" --plugin "$top/build/plugin/libhixl_kv_connector.so" \
  --config "$config" "$@"
