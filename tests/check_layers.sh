#!/usr/bin/env bash
# check_layers: core/src's files, and plugin/src's, call only downward (docs/design.md,
# "Layers").
# Reads the symbols each object file of hixl_objs defines and uses (nm), draws an
# edge A -> B when A uses a symbol B defines, and fails on:
#   - any cycle between files (tsort finds it);
#   - a file calling a layer above its own (the ranks below), or one transport
#     calling another: a transport is reached through its table only.
# Usage: check_layers.sh OBJECT...  (hixl_objs' objects, or hixl_kv_connector's, as CMake
# lists them: a build tree may hold stale objects of files that are gone). Each is named
# by its path below core/src/ or plugin/src/ (the part after ".../src/"); a plugin object
# calls core through hixl's symbols, which it does not define, so only its own files are
# checked against each other.
set -euo pipefail
[ $# -gt 10 ] || { echo "check_layers: only $# object files given"; exit 1; }
declare -A path
objs=()
for o in "$@"; do
  name=${o##*/src/}
  path[$name]=$o
  objs+=("$name")
done

# Rank of a file: it may use files of a lower rank, and of its own rank only
# inside its own folder.
rank() {
  case "$1" in
    util/* | devmem/*) echo 0 ;;
    wire/*) echo 1 ;;
    engine/options.c.o) echo 2 ;;
    engine/link.c.o | engine/link_frames.c.o | engine/link_progress.c.o | engine/xport_link.c.o | engine/xport_stub.c.o | engine/grant.c.o) echo 3 ;;
    transport/*) echo 4 ;;
    engine/stage.c.o | engine/stage_target.c.o) echo 5 ;;
    engine/api.c.o | engine/api_mem.c.o | engine/api_dial.c.o | engine/api_link.c.o | engine/api_xfer.c.o | engine/api_call.c.o) echo 6 ;;
    cs/* | cache/*) echo 7 ;;
    rping/*) echo 7 ;;
    # plugin/src: utilities and codecs; capabilities and tensor parallelism; observability,
    # layouts and grants; the scheduler, a request's parts and calls to a peer; the KV
    # service; the loader and pusher threads; the worker ops; the connector's life.
    kv_util.c.o | kv_wire.c.o | kv_config.c.o | kv_test_hooks.c.o) echo 10 ;;
    kv_cap.c.o | kv_tp.c.o) echo 11 ;;
    kv_obs.c.o | kv_layout.c.o | kv_grant.c.o | kv_word.c.o) echo 12 ;;
    kv_sched.c.o | kv_parts.c.o | kv_peer.c.o) echo 13 ;;
    kv_service*.c.o) echo 14 ;;
    kv_loader.c.o | kv_pusher.c.o) echo 15 ;;
    kv_worker.c.o) echo 16 ;;
    kv_life.c.o) echo 17 ;;
    *) echo "?" ;;
  esac
}

defs=$(mktemp) uses=$(mktemp) edges=$(mktemp)
trap 'rm -f "$defs" "$uses" "$edges"' EXIT
for o in "${objs[@]}"; do
  nm -g --defined-only "${path[$o]}" | awk -v f="$o" 'NF == 3 { print $3, f }' >>"$defs"
  nm -u "${path[$o]}" | awk -v f="$o" '{ print $NF, f }' >>"$uses"
done
sort -o "$defs" "$defs"
sort -o "$uses" "$uses"
join "$uses" "$defs" | awk '$2 != $3 { print $2, $3, $1 }' | sort -u >"$edges"

bad=0
while read -r from to sym; do
  rf=$(rank "$from") rt=$(rank "$to")
  if [ "$rf" = "?" ] || [ "$rt" = "?" ]; then
    echo "check_layers: $from or $to has no layer in check_layers.sh: add it"
    bad=1
  elif [ "$rt" -gt "$rf" ]; then
    echo "check_layers: $from (layer $rf) calls $sym of $to (layer $rt): upward"
    bad=1
  elif [ "$rt" -eq "$rf" ] && [ "$(dirname "$from")" != "$(dirname "$to")" ]; then
    echo "check_layers: $from calls $sym of $to: a neighbour of the same layer (use its table)"
    bad=1
  fi
done <"$edges"

if ! awk '{ print $1, $2 }' "$edges" | sort -u | tsort >/dev/null 2>"$edges.err"; then
  echo "check_layers: the files call each other in a cycle:"
  cat "$edges.err"
  bad=1
fi
rm -f "$edges.err"
[ "$bad" -eq 0 ] || exit 1
echo "check_layers: ${#objs[@]} files, $(awk '{ print $1, $2 }' "$edges" | sort -u | wc -l) file-to-file" \
  "dependencies, all downward, no cycle"
