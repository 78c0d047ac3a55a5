#!/usr/bin/env bash
# The plugin exports exactly one symbol: hixl_kv_connector_entry; and it carries its own
# json-c: libjson-c is not NEEDED, no json_* symbol is left for a host to interpose.
set -euo pipefail
so=$1
syms=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sort)
echo "defined dynamic symbols of $so:"; echo "$syms"
[ "$syms" = "hixl_kv_connector_entry" ] || { echo "expected exactly hixl_kv_connector_entry" >&2; exit 1; }
needed=$(readelf -d "$so" | awk '/\(NEEDED\)/ {printf "%s ", $NF}')
echo "NEEDED: $needed"
if grep -q 'libjson-c' <<<"$needed"; then echo "libjson-c is NEEDED: link json-c's static archive" >&2; exit 1; fi
undef=$(nm -D --undefined-only "$so" | awk '$NF ~ /^json_/ {print $NF}')
[ -z "$undef" ] || { echo "json-c symbols imported: $undef" >&2; exit 1; }
