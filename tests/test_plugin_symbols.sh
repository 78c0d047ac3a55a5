#!/usr/bin/env bash
# The plugin exports exactly one symbol: hixl_kv_connector_entry.
set -euo pipefail
so=$1
syms=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sort)
echo "defined dynamic symbols of $so:"; echo "$syms"
[ "$syms" = "hixl_kv_connector_entry" ] || { echo "expected exactly hixl_kv_connector_entry" >&2; exit 1; }
