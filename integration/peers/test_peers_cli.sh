#!/usr/bin/env bash
# hixl-peers end to end on loopback: targets over tcp and shm (registered and allocated
# memory), initiators in Mooncake's and ucx_perftest's shapes, sync and windowed, each
# point's bytes written, read back and compared (verified_bytes must be the point's whole
# span), points that do not fit (exit 1 and 2), the report from raw records (its medians,
# ratios, skips and JSON), and usage errors (exit 2). Readiness comes from the target's
# READY line, never a sleep.
set -uo pipefail
bin=$1
source "$(dirname "$0")/../cli_test.sh"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# target PROTOCOL [ARGS...]: a target on a free port; sets port, addr and the coproc's fds.
target() {
  local proto=$1
  shift
  port=$(free_port)
  coproc TGT { exec "$bin" --mode=target --protocol="$proto" --local_server_name="127.0.0.1:$port" "$@"; }
  pids+=("$TGT_PID")
  tgt_in=${TGT[1]}
  if ! read -r -t 30 ready _ addr len <&"${TGT[0]}" || [ "$ready" != READY ]; then
    echo "FAIL the $proto target did not start"
    exit 1
  fi
}
# target_end NAME: close the target's stdin; its exit status to NAME.rc
target_end() {
  local pid=$TGT_PID
  eval "exec $tgt_in>&-"
  wait "$pid"
  echo $? >"$work/$1.rc"
}
# point NAME PROTOCOL ARGS...: an initiator against the target, 0.2 s
point() {
  local name=$1 proto=$2
  shift 2
  run "$name" --mode=initiator --protocol="$proto" --segment_id="127.0.0.1:$port" --remote_addr="$addr" \
    --duration=0.2 "$@"
}
# verified NAME BYTES: exit 0, a RESULT with batches moved and every byte of the span checked
verified() {
  rc_is "$1" 0 && has "$1.out" "^RESULT tool=hixl .* batches=[1-9][0-9]* .* verified_bytes=$2 cpu_s=[0-9.]+$"
}

target tcp --buffer_size=16M
point w_tcp tcp --operation=write --threads=2 --batch_size=4 --block_size=64K --verify
check "tcp WRITE 2 threads x 4 x 64 KiB, distinct blocks: every byte back" verified w_tcp $((2 * 4 * 65536))
check "its line says the shape" has w_tcp.out "op=WRITE block=65536 batch=4 threads=2 shape=blocks window=1 "
point r_tcp_win tcp --operation read --threads 2 --batch_size 1 --block_size 4K --one_buffer --window 8 --verify
check "tcp READ, one buffer a thread, 8 in flight (--name value): every byte back" verified r_tcp_win $((2 * 4096))
check "its line says the shape" has r_tcp_win.out "shape=one_buffer window=8 "
point big tcp --operation=write --threads=2 --batch_size=16 --block_size=1M
check "a point past the target's 16 MiB: exit 1" rc_is big 1
check "... saying the range is not registered" has big.err "not inside memory registered with 127\.0\.0\.1:$port"
point nofit tcp --threads=2 --batch_size=4 --block_size=1M --buffer_size=4M
check "a point past the initiator's --buffer_size: exit 2" rc_is nofit 2
check "... saying so" has nofit.err "do not fit --buffer_size=4194304"
target_end t_tcp
check "the tcp target ends with its stdin: exit 0" rc_is t_tcp 0

target shm --buffer_size=32M --alloc
point r_shm shm --operation=read --threads=3 --batch_size=8 --block_size=1M --verify
check "shm READ 3 threads x 8 x 1 MiB into allocated memory: every byte back" verified r_shm $((3 * 8 << 20))
point w_shm shm --operation=write --threads=1 --batch_size=1 --block_size=4K --one_buffer --verify
check "shm WRITE 4 KiB, one buffer: every byte back" verified w_shm 4096
target_end t_shm
check "the shm target: exit 0" rc_is t_shm 0

# The report: three rounds, the medians 2.000 (hixl), 1.000 (its A/A), 4.000 (Mooncake).
raw=$work/raw.tsv
for r in 1 2 3; do
  printf 'RUN\t%s\ttcp\tREAD\t4096\t1\t1\thixl\t%s.0000\t1073741824\t1.0\t4096\t0.500\n' $r $r
  printf 'RUN\t%s\ttcp\tREAD\t4096\t1\t1\thixl-aa\t1.0000\t1073741824\t1.0\t0\t0.500\n' $r
  printf 'RUN\t%s\ttcp\tREAD\t4096\t1\t1\tmooncake\t%s.0000\t1073741824\t1.0\t0\t2.000\n' $r $((r + 2))
done >"$raw"
printf 'SKIP\ttcp\tnixl\tno "nixl" wheel here\n' >>"$raw"
printf 'not a record\n' >>"$raw"
run report --mode=report --raw="$raw" --md="$work/peers.md" --json="$work/peers.json"
check "report: exit 0" rc_is report 0
check "report: the point's row (medians, A/A, ratio to Mooncake, the best peer, CPU s/GiB)" has peers.md \
  '^\| READ \| 4 KiB \| 1 x 1 \| 2\.000 \| 2\.00x \| - \| - \| 4\.000 \| 0\.50x \| - \| - \| n/a \| - \| 0\.50x \(Mooncake TE\) \| 0\.50, -, 2\.00, -, - \| yes, -, - \|$'
check "report: the skipped peer, with its reason" has peers.md '^- n/a NIXL \(UCX\): no "nixl" wheel here$'
check "report: the JSON" python3 - "$work/peers.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p = d["points"][0]
assert len(d["points"]) == 1 and p["path"] == "tcp" and p["op"] == "READ" and p["block"] == 4096, p
assert p["tools"]["hixl"]["rounds"] == [1.0, 2.0, 3.0] and p["tools"]["hixl"]["gbps"] == 2.0, p
assert p["tools"]["hixl"]["verified_bytes"] == 4096 and p["tools"]["mooncake"]["cpu_s_per_gib"] == 2.0, p
assert d["skipped"] == [{"path": "tcp", "tool": "nixl", "reason": 'no "nixl" wheel here'}], d["skipped"]
PY
run report_missing --mode=report --raw="$work/none.tsv"
check "report of a missing file: exit 1" rc_is report_missing 1

for bad in "--threads=0" "--window=1025" "--batch_size=0" "--operation=copy" "--remote_addr=zz" "--verify=1" \
  "--nope" "--mode=target" "--mode=initiator --segment_id=127.0.0.1:1"; do
  run usage $bad
  check "usage error ($bad): exit 2" rc_is usage 2
done
run help --help
check "--help: exit 0, every option" has help.out "--remote_addr HEX"

cli_done hixl-peers
