#!/usr/bin/env bash
# Writes the seed corpus for fuzz_cache_codec: CACHE service requests and LOOKUP answers
# (ok_*) and ones the parsers must refuse (bad_*), byte by byte from the layout at the
# top of core/src/cache/cache_codec.c. The output is committed; rerun only when that
# layout changes.
#   tests/fuzz/make_cache_corpus.sh [DIR]    (default: tests/fuzz/cache_corpus)
set -euo pipefail

out=${1:-"$(dirname "$0")/cache_corpus"}
mkdir -p "$out"
rm -f "$out"/ok_* "$out"/bad_*

u8() { printf "\\x$(printf %02x $(($1 & 255)))"; }
u16() { u8 $(($1 >> 8)); u8 "$1"; }
u32() { u16 $((($1 >> 16) & 65535)); u16 $(($1 & 65535)); }
u64() { u32 $((($1 >> 32) & 0xffffffff)); u32 $(($1 & 0xffffffff)); }

PROTO=1 HELLO=1 LOOKUP=2     # CM_PROTO, CM_OP_* (cache_int.h)
REQ=0 ID=1 BLOCKS=2          # HixlCacheKeyKind
key_req() { u8 $REQ; u64 "$1"; u64 7; u64 0; u64 0xffffffffffffffff; }
key_id() { u8 $ID; u64 "$1"; u64 3; u32 "$2"; }
key_blocks() { u8 $BLOCKS; u64 "$1"; u64 5; }
# view ID BLOCKS N ELEM BATCH SHAPE0 TENSOR_BYTES ADDR...
view() {
  u64 "$1"; u8 "$2"; u32 "$3"; u32 "$4"; u32 "$5"; u64 "$6"; u64 "$7"; shift 7
  for a in "$@"; do u64 "$a"; done
}

# ---- requests ----
{ u8 $PROTO; u8 $HELLO; } > "$out/ok_hello"
{ u8 $PROTO; u8 $LOOKUP; key_req 2; } > "$out/ok_lookup_req"
{ u8 $PROTO; u8 $LOOKUP; key_id 2 3; } > "$out/ok_lookup_id"
{ u8 $PROTO; u8 $LOOKUP; key_blocks 2; } > "$out/ok_lookup_blocks"
{ u8 0; u8 $LOOKUP; key_req 2; } > "$out/bad_old_proto"
{ u8 $PROTO; u8 9; } > "$out/bad_op"
{ u8 $PROTO; u8 $HELLO; u8 0; } > "$out/bad_hello_trailing"
{ u8 $PROTO; u8 $LOOKUP; key_req 2; u8 0; } > "$out/bad_lookup_trailing"
{ u8 $PROTO; u8 $LOOKUP; u8 7; u64 2; u64 5; } > "$out/bad_key_kind"
{ u8 $PROTO; u8 $LOOKUP; u8 $ID; u64 2; u64 3; u16 0; } > "$out/bad_key_short"
u8 $PROTO > "$out/bad_one_byte"

# ---- LOOKUP answers ----
A=0x7f0000001000 B=0x7f0000100000
view 1 0 4 2 1 4 512 $A $((A + 512)) $B $((B + 512)) > "$out/ok_view_contiguous"
view 2 1 6 2 0 1024 65536 $A $B 0x100000 0x200000 0x300000 0x400000 > "$out/ok_view_blocks"
view 1 0 1 2 4 4 512 $A > "$out/bad_view_batch"            # batch index past shape[0]
view 1 0 1 0 0 4 512 $A > "$out/bad_view_elem0"            # elem_size 0
view 1 0 2 2 0 4 512 $A > "$out/bad_view_truncated"        # 2 tensors, one address
view 1 0 1 2 0 4 512 $A $B > "$out/bad_view_trailing"      # one address too many
view 1 0 1 2 0 3 512 $A > "$out/bad_view_shape"            # 512 bytes not 3 items
view 1 0 1 2 0 4 512 0xfffffffffffffff0 > "$out/bad_view_wrap" # past 2^64
view 1 2 1 2 0 4 512 $A > "$out/bad_view_blocks_byte"
view 1 0 0xffffffff 2 0 4 512 $A > "$out/bad_view_count"   # a count near 2^32
view 1 0 1 2 0 1 0x2000000000000 $A > "$out/bad_view_huge" # a tensor past 2^48 bytes
