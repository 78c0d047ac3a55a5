#!/usr/bin/env bash
# check_boundary: the transport boundary, by includes (docs/design.md, "Interfaces").
# Fails when
#   - a transport's source (core/src/transport/T/) includes engine/engine_int.h (it
#     sees the engine through engine/xport_link.h only) or another transport's header;
#   - staging (engine/stage*.c, stage*.h) includes a transport's header: it reaches transports
#     through their tables (bounce_reg, post_own), never by name.
# Usage: check_boundary.sh CORE_SRC_DIR
set -euo pipefail
src=${1:?usage: check_boundary.sh CORE_SRC_DIR}
bad=0
for dir in "$src"/transport/*/; do
  t=$(basename "$dir")
  for f in "$dir"*.c "$dir"*.h; do
    [ -e "$f" ] || continue
    while IFS= read -r inc; do
      case "$inc" in
        engine/engine_int.h | engine/stage.h | engine/link.h)
          echo "check_boundary: ${f#"$src"/} includes $inc: a transport sees the engine through engine/xport_link.h"
          bad=1 ;;
        transport/"$t"/*) ;;
        transport/*)
          echo "check_boundary: ${f#"$src"/} includes $inc: a transport never names another"
          bad=1 ;;
      esac
    done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f")
  done
done
for f in "$src"/engine/stage*.c "$src"/engine/stage*.h; do
  if grep -n '^#include "transport/' "$f"; then
    echo "check_boundary: ${f#"$src"/} includes a transport's header: staging asks transports through their tables"
    bad=1
  fi
done
[ "$bad" -eq 0 ] || exit 1
n=$(find "$src/transport" -name '*.[ch]' | wc -l)
echo "check_boundary: $n transport files see the engine through xport_link.h only; staging names no transport"
