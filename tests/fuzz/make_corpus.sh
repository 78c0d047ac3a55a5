#!/usr/bin/env bash
# Writes the seed corpus for fuzz_wire: small valid frames of every type (ok_*) and
# frames the parser must refuse (bad_*), built byte by byte from the layout in wire.h.
# The output is committed; rerun only when the wire format changes.
#   tests/fuzz/make_corpus.sh [DIR]    (default: tests/fuzz/corpus next to this script)
set -euo pipefail

out=${1:-"$(dirname "$0")/corpus"}
mkdir -p "$out"
rm -f "$out"/ok_* "$out"/bad_*

# Big-endian writers; output goes straight to the file (never through $(...), which
# would drop NUL bytes).
u8() { printf "\\x$(printf %02x $(($1 & 255)))"; }
u16() { u8 $(($1 >> 8)); u8 "$1"; }
u32() { u16 $((($1 >> 16) & 65535)); u16 $(($1 & 65535)); }
u64() { u32 $((($1 >> 32) & 0xffffffff)); u32 $(($1 & 0xffffffff)); }
str() { printf '%s' "$1"; }
fill() { head -c "$1" /dev/zero | tr '\0' "$2"; } # fill COUNT CHAR

MAGIC=0x4858494c
# hdr TYPE BODY_LEN PAYLOAD_LEN [VERSION] [FLAGS] [RESERVED] [MAGIC]
hdr() {
  u32 "${7:-$MAGIC}"; u8 "${4:-1}"; u8 "$1"; u16 "${5:-0}"
  u32 "$2"; u32 "$3"; u32 "${6:-0}"
}
entry() { u64 "$1"; u64 "$2"; u32 0x1234; u16 ${#3}; str "$3"; } # entry ADDR LEN TAG

HELLO=1 HELLO_ACK=2 MEM_ADD=3 MEM_DEL=4 WRITE_REQ=5 WRITE_ACK=6 READ_REQ=7
READ_RESP=8 NOTIFY=9 NOTIFY_ACK=10 SYNC=11 SYNC_ACK=12 RDMA_CONNECT=13 RDMA_CONNECT_ACK=14
SHM_HELLO=15 SHM_HELLO_ACK=16 STAGE_WRITE=17 STAGE_READ=18 STAGE_PULL=19 STAGE_PUSH=20
CALL=21 CALL_RESP=22 SHM_MAP_HELLO=23 SHM_MAP=24 SHM_MAP_ACK=25 SHM_UNMAP=26 SHM_UNMAP_ACK=27 CALL_AFTER=28
AUTH_CHALLENGE=29 AUTH_PROOF=30 RAILS=31 RAILS_ACK=32 WIN_ADD=33 WIN_DEL=34 SHM_DEV_MAP=35 CALL_TAG=36
seg() { u64 "$1"; u32 "$2"; } # seg ADDR LEN: one STAGE range
# stage_rdma TYPE BODY_LEN PAYLOAD_LEN BUF COUNT: a STAGE_PULL / STAGE_PUSH up to its ranges
stage_rdma() { hdr "$1" "$2" "$3"; u64 10; u64 "$4"; u32 0xc0ffee; u32 "$5"; }
shm_id() { u16 "$1"; fill 16 B; u32 4242; u32 1000; } # shm_id LAYOUT: boot id, pid, uid

# ---- valid frames ----
hello() { hdr $HELLO 11 0; u32 1; u16 5; str dec-0; }
hello >"$out/ok_hello"
{
  hdr $HELLO_ACK 66 0; u32 0; u32 1; u16 5; str pre-0; u32 2
  entry 0x7f0000000000 4096 kv0; entry 0x7f0000100000 65536 ""
} >"$out/ok_hello_ack"
{ hdr $HELLO_ACK 14 0; u32 1; u32 0; u16 0; u32 0; } >"$out/ok_hello_ack_version"
{ hdr $MEM_ADD 25 0; entry 0x7f0000200000 8192 blk; } >"$out/ok_mem_add"
{ hdr $MEM_DEL 22 0; entry 0x7f0000200000 8192 ""; } >"$out/ok_mem_del"
write_req() { hdr $WRITE_REQ 16 8; u64 1; u64 0x7f0000001000; str payload8; }
write_req >"$out/ok_write_req"
{ hdr $WRITE_ACK 12 0; u64 1; u32 0; } >"$out/ok_write_ack"
read_req() { hdr $READ_REQ 20 0; u64 2; u64 0x7f0000002000; u32 4096; }
read_req >"$out/ok_read_req"
{ hdr $READ_RESP 12 4; u64 2; u32 0; str data; } >"$out/ok_read_resp"
{ hdr $READ_RESP 12 0; u64 3; u32 503900; } >"$out/ok_read_resp_failed"
{ hdr $NOTIFY 22 0; u64 4; u16 4; u16 6; str done; str req-17; } >"$out/ok_notify"
notify_ack() { hdr $NOTIFY_ACK 12 0; u64 4; u32 0; }
notify_ack >"$out/ok_notify_ack"
{ hdr $SYNC 8 0; u64 5; } >"$out/ok_sync"
{ hdr $CALL 19 0; u64 6; u16 1; u8 2; u64 0x1234; } >"$out/ok_call"
{ hdr $CALL 10 0; u64 6; u16 3; } >"$out/ok_call_empty"
{ hdr $CALL_RESP 16 0; u64 6; u32 0; u32 7; } >"$out/ok_call_resp"
{ hdr $CALL_RESP 19 0; u64 6; u32 103906; str missing; } >"$out/ok_call_resp_fail"
{ hdr $CALL 9 0; u64 6; u8 1; } >"$out/bad_call_short"
{ hdr $CALL_RESP 12 4; u64 6; u32 0; str abcd; } >"$out/bad_call_resp_payload"
{ hdr $CALL 65547 0; u64 6; u16 1; fill 65537 x; } >"$out/bad_call_long"
{ hdr $CALL_AFTER 27 0; u64 9; u64 6; u16 2; u8 2; u64 0x1234; } >"$out/ok_call_after"
# HELLO with the auth block (caps 0x101): name "a:1", nonce 32, 2 key ids.
{ hdr $HELLO $((6 + 3 + 32 + 1 + 16 + 2 + 3)) 0; u32 0x101; u16 3; str a:1; fill 32 n; u8 2; fill 16 i; u16 3; str b:2; } >"$out/ok_hello_auth"
{ hdr $HELLO $((6 + 3 + 32 + 1 + 16)) 0; u32 0x101; u16 3; str a:1; fill 32 n; u8 2; fill 16 i; } >"$out/bad_hello_auth_no_dialled"
{ hdr $HELLO $((6 + 3 + 32 + 1 + 16 + 2)) 0; u32 0x101; u16 3; str a:1; fill 32 n; u8 2; fill 16 i; u16 0; } >"$out/bad_hello_auth_dialled_empty"
{ hdr $HELLO $((6 + 3 + 32 + 1 + 16 + 2 + 3)) 0; u32 0x101; u16 3; str a:1; fill 32 n; u8 2; fill 16 i; u16 9; str b:2; } >"$out/bad_hello_auth_dialled_past_body"
{ hdr $HELLO $((6 + 3 + 32 + 1 + 8)) 0; u32 0x101; u16 3; str a:1; fill 32 n; u8 2; fill 8 i; } >"$out/bad_hello_auth_ids"
{ hdr $HELLO $((6 + 3 + 32 + 1)) 0; u32 0x101; u16 3; str a:1; fill 32 n; u8 0; } >"$out/bad_hello_auth_no_id"
# HELLO extensions: entries of u16 type, u16 length, bytes, after the fields.
{ hdr $HELLO $((11 + 7 + 4)) 0; u32 1; u16 5; str dec-0; u16 0xfe01; u16 3; str new; u16 7; u16 0; } >"$out/ok_hello_ext"
{ hdr $HELLO $((6 + 3 + 32 + 1 + 16 + 2 + 3 + 6)) 0; u32 0x101; u16 3; str a:1; fill 32 n; u8 2; fill 16 i; u16 3; str b:2; u16 1; u16 2; str hi; } >"$out/ok_hello_auth_ext"
{ hdr $HELLO $((11 + 3)) 0; u32 1; u16 5; str dec-0; u16 1; u8 0; } >"$out/bad_hello_ext_stub"
{ hdr $HELLO $((11 + 7)) 0; u32 1; u16 5; str dec-0; u16 1; u16 9; str abc; } >"$out/bad_hello_ext_past_body"
{ hdr $AUTH_CHALLENGE $((74 + 3)) 0; fill 32 n; fill 8 i; fill 32 m; u16 3; str b:2; } >"$out/ok_auth_challenge"
{ hdr $AUTH_CHALLENGE $((74 + 3)) 0; fill 32 n; fill 8 i; fill 32 m; u16 4; str b:2; } >"$out/bad_auth_challenge_name"
{ hdr $AUTH_PROOF 32 0; fill 32 m; } >"$out/ok_auth_proof"
{ hdr $CALL_AFTER 18 0; u64 9; u64 9; u16 2; } >"$out/bad_call_after_not_before"
{ hdr $CALL_AFTER 17 0; u64 9; u64 6; u8 2; } >"$out/bad_call_after_short"
{ hdr $RDMA_CONNECT 25 0; u32 0x11; u32 0x22; fill 16 G; u8 3; } >"$out/ok_rdma_connect"
{ hdr $RDMA_CONNECT_ACK 29 0; u32 0; u32 0x33; u32 0x44; fill 16 G; u8 3; } >"$out/ok_rdma_connect_ack"
{ hdr $SYNC_ACK 12 0; u64 5; u32 0; } >"$out/ok_sync_ack"
{ hdr $SHM_HELLO 26 0; shm_id 1; } >"$out/ok_shm_hello"
{ hdr $SHM_HELLO_ACK 54 0; u32 0; shm_id 1; u64 0x7f0000003000; fill 16 N; } >"$out/ok_shm_hello_ack"
{ hdr $SHM_HELLO 30 0; shm_id 2; u32 1; } >"$out/ok_shm_hello_layout2"
{ hdr $SHM_HELLO 34 0; shm_id 3; u32 1; str more; } >"$out/ok_shm_hello_layout3"
{ hdr $SHM_HELLO_ACK 65 0; u32 0; shm_id 2; u64 0x7f0000003000; fill 16 N; u16 9; str hixl-1-ab; } >"$out/ok_shm_hello_ack_layout2"
{ hdr $SHM_MAP_HELLO 4 0; u32 0; } >"$out/ok_shm_map_hello"
{ hdr $SHM_MAP 24 0; u64 0x7f0000000000; u64 4096; u64 8192; } >"$out/ok_shm_map"
{ hdr $SHM_MAP_ACK 4 0; u32 0; } >"$out/ok_shm_map_ack"
{ hdr $SHM_MAP_ACK 13 0; u32 2; str "uid 65534"; } >"$out/ok_shm_map_ack_refused"
{ hdr $SHM_UNMAP 16 0; u64 0x7f0000000000; u64 4096; } >"$out/ok_shm_unmap"
{ hdr $SHM_UNMAP_ACK 16 0; u64 0x7f0000000000; u64 4096; } >"$out/ok_shm_unmap_ack"
{ hdr $SHM_DEV_MAP 96 0; u64 0x7f0000400000; u64 4096; u64 65536; u64 8192; fill 64 H; } >"$out/ok_shm_dev_map"
{ hello; read_req; write_req; notify_ack; } >"$out/ok_stream"
stage_write() {
  hdr $STAGE_WRITE 48 30; u64 6; u32 3
  seg 0x7f0000004000 10; seg 0x7f0000005000 15; seg 0x7f0000006000 5; fill 30 D
}
stage_write >"$out/ok_stage_write"
{ hdr $STAGE_WRITE 24 16777216; u64 7; u32 1; seg 0x7f0000008000 16777216; } >"$out/ok_stage_write_max"
stage_read() { hdr $STAGE_READ 36 0; u64 8; u32 2; seg 0x7f0000004000 10; seg 0xffffffffffffff00 0xff; }
stage_read >"$out/ok_stage_read"
read_resp_stage() { hdr $READ_RESP 12 265; u64 8; u32 0; fill 265 R; } # the answer, packed
{ hdr $READ_RESP 12 16777216; u64 9; u32 0; } >"$out/ok_read_resp_max"
{ stage_write; stage_read; read_resp_stage; notify_ack; } >"$out/ok_stream_stage"
stage_pull() { stage_rdma $STAGE_PULL 60 0 0x7f0000010000 3; seg 0x7f0000004000 10; seg 0x7f0000005000 15; seg 0x7f0000006000 5; }
stage_pull >"$out/ok_stage_pull"
stage_push() { stage_rdma $STAGE_PUSH 48 0 0x7f0000020000 2; seg 0x7f0000004000 10; seg 0xffffffffffffff00 0xff; }
stage_push >"$out/ok_stage_push"
# one 16 MiB range; the buffer ends at the very top of the address space
{ stage_rdma $STAGE_PULL 36 0 0xfffffffffeffffff 1; seg 0x7f0000008000 16777216; } >"$out/ok_stage_pull_max"
{ stage_rdma $STAGE_PUSH 36 0 0 1; seg 0x7f0000008000 1; } >"$out/ok_stage_push_buf_0"
write_ack_stage() { hdr $WRITE_ACK 12 0; u64 10; u32 0; } # what ends either
{ stage_pull; write_ack_stage; stage_push; write_ack_stage; } >"$out/ok_stream_stage_rdma"

# ---- frames to refuse ----
{ hdr $HELLO 11 0 1 0 0 0x4c495848; u32 1; u16 5; str dec-0; } >"$out/bad_magic_le"
{ hdr $HELLO 11 0 2; u32 1; u16 5; str dec-0; } >"$out/bad_version_2"
{ hdr 0 12 0; u64 1; u32 0; } >"$out/bad_type_0"
{ hdr 11 12 0; u64 1; u32 0; } >"$out/bad_type_11"
{ hdr $WRITE_ACK 12 0 1 1; u64 1; u32 0; } >"$out/bad_flags"
{ hdr $WRITE_ACK 12 0 1 0 1; u64 1; u32 0; } >"$out/bad_reserved"
{ hdr $HELLO 5 0; u32 1; u8 0; } >"$out/bad_hello_body_short"
{ hdr $MEM_DEL 23 0; entry 1 2 x; } >"$out/bad_mem_del_body_long"
{ hdr $WRITE_ACK 12 1; u64 1; u32 0; str x; } >"$out/bad_payload_on_ack"
{ hdr $WRITE_REQ 16 $(((4 << 20) + 1)); u64 1; u64 0x1000; } >"$out/bad_payload_too_big"
{ hdr $HELLO 11 0; u32 1; u16 6; str dec-0; } >"$out/bad_hello_name_len"
{
  hdr $HELLO_ACK 66 0; u32 0; u32 1; u16 5; str pre-0; u32 3
  entry 0x7f0000000000 4096 kv0; entry 0x7f0000100000 65536 ""
} >"$out/bad_hello_ack_count"
{
  hdr $HELLO_ACK 60 0; u32 0; u32 1; u16 5; str pre-0; u32 2
  entry 0x7f0000000000 4096 kv0; entry 0x7f0000100000 65536 ""; u16 0
} >"$out/bad_hello_ack_trailing"
{
  hdr $HELLO_ACK 288 0; u32 0; u32 1; u16 0; u32 1
  u64 0x1000; u64 4096; u16 256; fill 256 t
} >"$out/bad_hello_ack_tag_len"
{ hdr $NOTIFY 1037 0; u64 5; u16 1025; u16 0; fill 1025 n; } >"$out/bad_notify_name_len"
{ hdr $NOTIFY 22 0; u64 4; u16 4; u16 7; str done; str req-17; } >"$out/bad_notify_sum"
{ hdr $READ_REQ 20 0; u64 2; u64 0x1000; u32 0; } >"$out/bad_read_req_len_0"
{ hdr $READ_REQ 20 0; u64 2; u64 0x1000; u32 $(((4 << 20) + 1)); } >"$out/bad_read_req_len_big"
{ hdr $READ_RESP 12 4; u64 3; u32 503900; str data; } >"$out/bad_read_resp_failed_data"
{ hdr $WRITE_REQ 16 0; u64 1; u64 0x1000; } >"$out/bad_write_req_empty"
{ hdr $SHM_HELLO 26 0; shm_id 0; } >"$out/bad_shm_hello_layout_0"
{ hdr $SHM_HELLO 27 0; shm_id 1; u8 0; } >"$out/bad_shm_hello_layout1_long"
{ hdr $SHM_HELLO 28 0; shm_id 2; u16 1; } >"$out/bad_shm_hello_layout2_short"
{ hdr $SHM_HELLO_ACK 61 0; u32 0; shm_id 2; u64 0x1000; fill 16 N; u16 5; str "a b"; } >"$out/bad_shm_hello_ack_sock"
{ hdr $SHM_HELLO_ACK 58 0; u32 0; shm_id 2; u64 0x1000; fill 16 N; u16 9; str ab; } >"$out/bad_shm_hello_ack_sock_past_body"
{ hdr $SHM_MAP_HELLO 4 0; u32 1; } >"$out/bad_shm_map_hello_flags"
{ hdr $SHM_MAP 24 0; u64 0x1000; u64 8192; u64 4096; } >"$out/bad_shm_map_short_mapping"
{ hdr $SHM_MAP_ACK 4 0; u32 1; } >"$out/bad_shm_map_ack_status"
{ hdr $SHM_UNMAP 16 0; u64 0xfffffffffffff000; u64 8192; } >"$out/bad_shm_unmap_wrap"
{ hdr $SHM_DEV_MAP 96 0; u64 0x7f0000400000; u64 4096; u64 65536; u64 65000; fill 64 H; } >"$out/bad_shm_dev_map_past_alloc"
{ hdr $SHM_DEV_MAP 96 0; u64 0x7f0000400000; u64 0; u64 65536; u64 0; fill 64 H; } >"$out/bad_shm_dev_map_empty"
{ hdr $SHM_DEV_MAP 64 0; u64 0x7f0000400000; u64 4096; u64 65536; u64 8192; fill 32 H; } >"$out/bad_shm_dev_map_short"
{ hdr $SHM_HELLO_ACK 53 0; u32 0; shm_id 1; u64 0x1000; fill 15 N; } >"$out/bad_shm_hello_ack_short"
{ hdr 37 36 0; u64 1; u64 0x1000; u32 1; u32 1; seg 0x2000 10; } >"$out/bad_type_37" # one past the last type
{ hdr $STAGE_READ 24 0; u64 1; u32 0; seg 0x1000 10; } >"$out/bad_stage_count_0"
{ hdr $STAGE_READ 24 0; u64 1; u32 0x40000001; seg 0x1000 10; } >"$out/bad_stage_count_wrap32"
{ hdr $STAGE_READ 36 0; u64 1; u32 1; seg 0x1000 10; seg 0x2000 10; } >"$out/bad_stage_body_len"
{ hdr $STAGE_WRITE 36 10; u64 1; u32 2; seg 0x1000 10; seg 0x2000 0; fill 10 D; } >"$out/bad_stage_seg_len_0"
{ hdr $STAGE_READ 36 0; u64 1; u32 2; seg 0x1000 10; seg 0xffffffffffffff00 0x100; } >"$out/bad_stage_wrap"
{ hdr $STAGE_READ 36 0; u64 1; u32 2; seg 0x1000 8388608; seg 0x2000000 8388609; } >"$out/bad_stage_sum_big"
{ hdr $STAGE_WRITE 36 0; u64 1; u32 2; seg 0x1000 0x80000000; seg 0x100000000 0x80000000; } >"$out/bad_stage_sum_2p32"
{ hdr $STAGE_WRITE 36 19; u64 1; u32 2; seg 0x1000 10; seg 0x2000 10; fill 19 D; } >"$out/bad_stage_write_payload"
{ hdr $STAGE_READ 36 20; u64 1; u32 2; seg 0x1000 10; seg 0x2000 10; fill 20 D; } >"$out/bad_stage_read_payload"
{ hdr $STAGE_WRITE 12 0; u64 1; u32 0; } >"$out/bad_stage_body_short"
{ hdr $READ_RESP 12 $(((16 << 20) + 1)); u64 1; u32 0; } >"$out/bad_read_resp_too_big"
{ stage_rdma $STAGE_PULL 36 0 0x1000 0; seg 0x2000 10; } >"$out/bad_stage_pull_count_0"
{ stage_rdma $STAGE_PUSH 36 0 0x1000 4097; seg 0x2000 10; } >"$out/bad_stage_push_count_big"
{ stage_rdma $STAGE_PULL 36 0 0x1000 0x40000001; seg 0x2000 10; } >"$out/bad_stage_pull_count_wrap32"
{ stage_rdma $STAGE_PUSH 48 0 0x1000 1; seg 0x2000 10; seg 0x3000 10; } >"$out/bad_stage_push_body_len"
{ hdr $STAGE_PULL 36 0; u64 1; u32 2; seg 0x2000 10; seg 0x3000 10; } >"$out/bad_stage_pull_read_layout"
{ stage_rdma $STAGE_PULL 24 0 0x1000 0; } >"$out/bad_stage_pull_body_short"
{ stage_rdma $STAGE_PUSH 48 0 0x1000 2; seg 0x2000 10; seg 0x3000 0; } >"$out/bad_stage_push_seg_len_0"
{ stage_rdma $STAGE_PULL 48 0 0x1000 2; seg 0x2000 10; seg 0xffffffffffffff00 0x100; } >"$out/bad_stage_pull_wrap"
{ stage_rdma $STAGE_PUSH 48 0 0x1000 2; seg 0x1000 8388608; seg 0x2000000 8388609; } >"$out/bad_stage_push_sum_big"
{ stage_rdma $STAGE_PULL 48 0 0x1000 2; seg 0x1000 0x80000000; seg 0x100000000 0x80000000; } >"$out/bad_stage_pull_sum_2p32"
# buf + 21 == 2^64
{ stage_rdma $STAGE_PULL 48 0 0xffffffffffffffeb 2; seg 0x2000 10; seg 0x3000 11; } >"$out/bad_stage_pull_buf_wrap"
{ stage_rdma $STAGE_PUSH 36 0 0xffffffffff000000 1; seg 0x2000 16777216; } >"$out/bad_stage_push_buf_wrap"
{ stage_rdma $STAGE_PULL 48 21 0x1000 2; seg 0x2000 10; seg 0x3000 11; fill 21 D; } >"$out/bad_stage_pull_payload"
{ stage_rdma $STAGE_PUSH 48 1 0x1000 2; seg 0x2000 10; seg 0x3000 11; str D; } >"$out/bad_stage_push_payload"
{ hdr $RAILS 8 0; u64 1; } >"$out/ok_rails"
{ hdr $RAILS_ACK 24 0; u64 1; u32 2; u32 0x0a580001; u16 5000; u32 0x0a580101; u16 5000; } >"$out/ok_rails_ack"
{ hdr $RAILS_ACK 24 0; u64 1; u32 3; u32 0x0a580001; u16 5000; u32 0x0a580101; u16 5000; } >"$out/bad_rails_ack_count"
{ hdr $RAILS_ACK 18 0; u64 1; u32 0; u32 0x0a580001; u16 5000; } >"$out/bad_rails_ack_count_0"
{ hdr $RAILS_ACK 66 0; u64 1; u32 9; fill 54 R; } >"$out/bad_rails_ack_long"
{ hdr $WIN_ADD 44 0; u32 2; u64 4096; u64 4096; u32 0x11; u64 65536; u64 8192; u32 0x22; } >"$out/ok_win_add"
{ hdr $WIN_DEL 20 0; u32 1; u64 4096; u64 4096; } >"$out/ok_win_del"
{ hdr $WIN_ADD 44 0; u32 3; u64 4096; u64 4096; u32 0x11; u64 65536; u64 8192; u32 0x22; } >"$out/bad_win_add_count"
{ hdr $WIN_ADD 24 0; u32 1; u64 4096; u64 0; u32 0x11; } >"$out/bad_win_add_empty"
{ hdr $WIN_DEL 20 0; u32 1; u64 0xffffffffffff0000; u64 0x20000; } >"$out/bad_win_del_wraps"
# CALL_TAG, device entries, and each fixed-range field one past its bound
{ hdr $CALL_TAG 18 0; u64 11; u32 1; u16 1; str abcd; } >"$out/ok_call_tag"
{ hdr $CALL_TAG 13 0; u64 11; u32 1; u8 1; } >"$out/bad_call_tag_short"
{ hdr $CALL_TAG $((14 + 65537)) 0; u64 11; u32 1; u16 1; fill 65537 x; } >"$out/bad_call_tag_long"
{ hdr $MEM_ADD 23 0; u64 0x7f0000200000; u64 8192; u32 0x1234; u8 1; u8 1; str d; } >"$out/ok_mem_add_device"
{ hdr $MEM_ADD 23 0; u64 0x7f0000200000; u64 8192; u32 0x1234; u8 2; u8 1; str d; } >"$out/bad_mem_add_kind_2"
{ hdr $HELLO_ACK 270 0; u32 4; u32 0; u16 256; fill 256 n; u32 0; } >"$out/bad_hello_ack_name_256"
{ hdr $HELLO_ACK 18 0; u32 4; u32 0; u16 4; str fake; u32 0; } >"$out/ok_hello_ack_not_me"
{ hdr $RDMA_CONNECT 25 0; u32 0x1000000; u32 0x22; fill 16 G; u8 3; } >"$out/bad_rdma_connect_qpn"
{ hdr $RDMA_CONNECT 25 0; u32 0x11; u32 0x22; fill 16 G; u8 0; } >"$out/bad_rdma_connect_mtu_0"
{ hdr $RDMA_CONNECT_ACK 29 0; u32 0; u32 0x33; u32 0x1000000; fill 16 G; u8 6; } >"$out/bad_rdma_connect_ack_psn_mtu"
{ hdr $AUTH_PROOF 31 0; fill 31 m; } >"$out/bad_auth_proof_short"
{ hdr $SHM_MAP_ACK 261 0; u32 2; fill 257 r; } >"$out/bad_shm_map_ack_long"
{ hdr $WIN_DEL 4 0; u32 0; } >"$out/bad_win_del_count_0"
{ hdr $WIN_ADD 24 0; u32 1; u64 0xffffffffffff0000; u64 0xffff; u32 0x11; } >"$out/ok_win_add_top"
{ hdr $WIN_ADD 24 0; u32 1; u64 0xffffffffffff0000; u64 0x10000; u32 0x11; } >"$out/bad_win_add_to_2p64"
{ hdr $WRITE_REQ 16 8 1 2; u64 1; u64 0x1000; str payload8; } >"$out/bad_payload_tag_alone"
{ hdr $SYNC 9 0; u64 5; u8 0; } >"$out/bad_sync_long"
head -c 10 "$out/ok_hello" >"$out/bad_truncated_header"
head -c 25 "$out/ok_hello" >"$out/bad_truncated_body"
