#!/usr/bin/env bash
# Where each tool's time goes at the TCP points where hixl is below a peer (issue 46):
# every process counted by `perf stat` (its system calls by tracepoint, its context
# switches and CPU time), each count divided by the ops the tool reports, so the tools
# compare per op whatever the machine's load. The points, as run_peers.sh runs them:
#   WRITE 4 KiB x 1 x 1  hixl-peers --one_buffer with UCX's window (--window) and PollUs
#                        50, and with window 1024 and PollUs 0; ucx_perftest ucp_put_bw -O 1
#   READ 4 KiB x 1 x 1   hixl-peers sync with PollUs 0 (the default) and 50; NIXL's agent
#                        (nixl_peer.py, UCX backend)
# and, for the same-host points, copy_lock.c: a memcpy of 4 KiB and of 64 KiB with and
# without a mutex around it (OUT/copy_lock.txt). Last, the three points below UCX
# (loopback WRITE 4 KiB, same-host READ 4 KiB and 64 KiB, x 1 x 1) with UCX's worker in
# both its thread modes, 3 rounds interleaved, GB/s only (OUT/thread_mode.md, .json):
# ucx_perftest's one-thread default, -M single, takes no lock (only the master thread may
# call it), where hixl's API takes the engine's lock in every call; -M multi (any thread
# may call it, as hixl's) is the like-for-like one. And the loopback WRITE's ceiling: a
# WRITE ends when the target holds its data, a UCX put when its bytes are handed to the
# socket, so hixl-tcp-ref --mode answered (plain sockets, 4 KiB messages, each answered by
# the receiver with 8 bytes once it has it whole, hixl's window unanswered at most) runs
# beside hixl 1-buf and UCX, 3 rounds interleaved, with the TCP segments each sends per
# op (the host's OutSegs, both directions: run it on an idle machine) (OUT/answered.md, .json).
#
#   integration/peers/profile_peers.sh [--build DIR] [--out DIR] [--duration S] [--window W]
#
# --build: a build with hixl-peers (run_peers.sh builds it; default build-peers);
# --window: hixl's window at WRITE (default 53, what run_peers.sh measured for UCX on
# 2026-12-04). Initiators on CPU 0, targets on CPU 1. Output: OUT/profile.md (a table),
# OUT/profile.json, OUT/*.stat (perf's own output). Needs perf with the syscalls
# tracepoints (root, or perf_event_paranoid <= 1); a tool that is missing is said and
# left out.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$top/build-peers
out=
duration=2
window=53
venv=${HIXL_VLLM_VENV:-/opt/hixl/vllm-venv}
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$(cd "$2" && pwd); shift ;;
    --out) out=$2; shift ;;
    --duration) duration=$2; shift ;;
    --window) window=$2; shift ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "profile_peers.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
say() { echo "profile: $*" >&2; }
hp=$build/integration/peers/hixl-peers
[ -x "$hp" ] || { say "no $hp (cmake --build $build --target hixl-peers builds it)"; exit 1; }
command -v perf >/dev/null || { say "perf is missing (apt-get install linux-perf)"; exit 1; }
perf stat -e syscalls:sys_enter_read true 2>/dev/null ||
  { say "perf cannot count the syscalls tracepoints here (root, or perf_event_paranoid <= 1)"; exit 1; }
out=${out:-$build/profile-results}
mkdir -p "$out"
ev=context-switches,task-clock
for s in sendmsg sendto recvfrom recvmsg epoll_wait poll futex sched_yield; do
  ev+=,syscalls:sys_enter_$s
done
# The median of a space-separated list of numbers, for the awk programs below (mawk has no asort).
awk_med='function med(l,  v, c, i, j, t) {
  c = split(l, v, " ")
  for (i = 2; i <= c; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
  return v[int((c + 1) / 2)]
}
'
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# hixl_run PATH OP BLOCK POLLUS WINDOW [TAG]: a target (same host: --alloc, as run_peers.sh's
# hixl-1buf) and an initiator of hixl-peers --one_buffer; with TAG each under perf stat
# (OUT/TAG.*), without it the GB/s on stdout.
hixl_run() {
  local path=$1 op=$2 bs=$3 pu=$4 tag=${6:-} port fifo rd= eng addr tp res w=() a=() ps=() pi=()
  port=$(free_port)
  [ "$5" -gt 1 ] && w=(--window="$5")
  [ "$path" = shm ] && a=(--alloc)
  [ -n "$tag" ] && ps=(perf stat -x, -e "$ev" -o "$out/$tag.tgt.stat") pi=(perf stat -x, -e "$ev" -o "$out/$tag.ini.stat")
  fifo=$(mktemp -u) && mkfifo "$fifo"
  # The target serves until its stdin ends: this shell holds the fifo's write end.
  HIXL_POLL_US=$pu taskset -c 1 "${ps[@]}" "$hp" --mode=target --protocol="$path" \
    --local_server_name=127.0.0.1:"$port" --buffer_size=64M "${a[@]}" <"$fifo" >"$out/${tag:-run}.ready" 2>>"$out/log" &
  tp=$!
  exec 9>"$fifo"
  for _ in $(seq 100); do
    read -r rd eng addr _ <"$out/${tag:-run}.ready" 2>/dev/null || true
    [ "$rd" = READY ] && break
    sleep 0.1
  done
  res=$(HIXL_POLL_US=$pu taskset -c 0 "${pi[@]}" "$hp" --mode=initiator --protocol="$path" --segment_id="$eng" \
    --remote_addr="$addr" --operation="$op" --threads=1 --batch_size=1 --block_size="$bs" --duration="$duration" \
    --buffer_size=64M --one_buffer "${w[@]}" 2>>"$out/log" | grep '^RESULT') || say "hixl ${tag:-$path $op $bs} failed (see $out/log)"
  exec 9>&-
  wait "$tp" || true
  rm -f "$fifo"
  if [ -z "$tag" ]; then
    echo "$res" | sed -n 's/.* gbps=\([0-9.]*\).*/\1/p'
    return 0
  fi
  echo "$res" >"$out/$tag.res"
  sed -n 's/.* batches=\([0-9]*\) .* gbps=\([0-9.]*\) .*/\1 \2/p' "$out/$tag.res" >"$out/$tag.ops"
}
hixl() { hixl_run tcp "$2" 4096 "$3" "$4" "$1"; } # TAG OP POLLUS WINDOW: a TCP point under perf stat

# ucx_run PATH OP BLOCK MODE N [TAG]: ucx_perftest -M MODE -O 1, N ops (100 warm-up ones
# first), target on CPU 1 and initiator on CPU 0; with TAG each under perf stat (OUT/TAG.*,
# its output in OUT/TAG.res, "N GB/s" in OUT/TAG.ops), without it the GB/s on stdout (from
# its MB/s, 2^20 bytes).
ucx_run() {
  local tls=tcp test=ucp_put_bw tag=${6:-} port tp ps=() pi=() res
  command -v ucx_perftest >/dev/null || { say "ucx_perftest is missing (apt-get install ucx-utils)"; return 0; }
  [ "$1" = shm ] && tls=sm
  [ "$2" = read ] && test=ucp_get
  [ -n "$tag" ] && ps=(perf stat -x, -e "$ev" -o "$out/$tag.tgt.stat") pi=(perf stat -x, -e "$ev" -o "$out/$tag.ini.stat")
  port=$(free_port)
  UCX_TLS=$tls UCX_NET_DEVICES=lo,all taskset -c 1 "${ps[@]}" ucx_perftest -p "$port" -c 1 -M "$4" >>"$out/log" 2>&1 &
  tp=$!
  sleep 0.5 # its server has no ready line
  res=$(UCX_TLS=$tls UCX_NET_DEVICES=lo,all taskset -c 0 "${pi[@]}" ucx_perftest 127.0.0.1 -p "$port" -c 0 -t "$test" \
    -s "$3" -O 1 -n "$5" -w 100 -M "$4" 2>&1) || say "ucx ${tag:-$1 $2 $3 $4} failed"
  wait "$tp" || true
  if [ -z "$tag" ]; then
    echo "$res" | awk '/^Final/ { printf "%.4f\n", $7 * 1048576 / 1e9 }'
    return 0
  fi
  echo "$res" >"$out/$tag.res"
  awk -v n="$5" '/^Final/ { printf "%d %.4f\n", n, $7 * 1048576 / 1e9 }' "$out/$tag.res" >"$out/$tag.ops"
}
ucx() { ucx_run tcp write 4096 single 200000 "$1"; } # TAG: ucp_put_bw, 4 KiB, under perf stat

nixl() { # TAG: its target and one initiator point, each under perf stat
  local tag=$1 dir tp
  [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import nixl' 2>/dev/null ||
    { say "NIXL is missing (bash integration/vllm/install.sh --peers)"; return 0; }
  dir=$(mktemp -d)
  UCX_TLS=tcp UCX_KEEPALIVE_INTERVAL=inf taskset -c 1 perf stat -x, -e "$ev" -o "$out/$tag.tgt.stat" \
    "$venv/bin/python" "$top/integration/peers/nixl_peer.py" --mode=target --dir="$dir" --buffer_size=67108864 \
    >>"$out/log" 2>&1 &
  tp=$!
  UCX_TLS=tcp UCX_KEEPALIVE_INTERVAL=inf taskset -c 0 perf stat -x, -e "$ev" -o "$out/$tag.ini.stat" \
    "$venv/bin/python" "$top/integration/peers/nixl_peer.py" --mode=initiator --dir="$dir" --buffer_size=67108864 \
    --point --operation=read --threads=1 --batch_size=1 --block_size=4096 --duration="$duration" 2>>"$out/log" |
    grep '^RESULT' >"$out/$tag.res" || say "$tag failed (see $out/log)"
  touch "$dir/done"
  wait "$tp" || true
  rm -rf "$dir"
  sed -n 's/.* batches=\([0-9]*\) .* gbps=\([0-9.]*\) .*/\1 \2/p' "$out/$tag.res" >"$out/$tag.ops"
}

runs=("write-ucx:UCX ucp_put_bw -O 1" "write-hixl-p50:hixl PollUs 50 window $window"
  "write-hixl-p0:hixl PollUs 0 window 1024" "read-nixl:NIXL (UCX backend)" "read-hixl-p0:hixl PollUs 0 (default), sync"
  "read-hixl-p50:hixl PollUs 50, sync")
say "WRITE 4 KiB x 1 x 1"
ucx write-ucx
hixl write-hixl-p50 write 50 "$window"
hixl write-hixl-p0 write 0 1024
say "READ 4 KiB x 1 x 1"
nixl read-nixl
hixl read-hixl-p0 read 0 1
hixl read-hixl-p50 read 50 1

# One row per tool and process: GB/s, us per op, then each count per op.
{
  echo "| point | tool | GB/s | us an op | process | CPU us an op | context switches | socket sends | socket receives | epoll_wait + poll | sched_yield | futex |"
  echo "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"
  for r in "${runs[@]}"; do
    tag=${r%%:*}
    [ -s "$out/$tag.ops" ] || continue
    read -r ops gbps <"$out/$tag.ops"
    for side in ini tgt; do
      awk -F, -v ops="$ops" -v gbps="$gbps" -v tag="$tag" -v what="${r#*:}" -v side=$side -v dur="$duration" '
        { n = $3; sub(/syscalls:sys_enter_/, "", n); v[n] = $1 + 0 }
        END {
          split(tag, t, "-")
          printf "| %s 4 KiB x 1 x 1 | %s | %.3f | %.2f | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
            toupper(t[1]), what, gbps, 4096 / (gbps * 1e3), side == "ini" ? "initiator" : "target",
            v["task-clock"] * 1e3 / ops, v["context-switches"] / ops, (v["sendmsg"] + v["sendto"]) / ops,
            (v["recvfrom"] + v["recvmsg"]) / ops, (v["epoll_wait"] + v["poll"]) / ops,
            v["sched_yield"] / ops, v["futex"] / ops
        }' "$out/$tag.$side.stat"
    done
  done
} >"$out/profile.md"
# The same rows as JSON, from the table.
awk -F' *\\| *' 'NR > 2 {
    printf "%s  {\"point\": \"%s\", \"tool\": \"%s\", \"gbps\": %s, \"us_per_op\": %s, \"process\": \"%s\", ", (n++ ? ",\n" : "[\n"), $2, $3, $4, $5, $6
    printf "\"cpu_us_per_op\": %s, \"switches_per_op\": %s, \"sends_per_op\": %s, \"receives_per_op\": %s, ", $7, $8, $9, $10
    printf "\"polls_per_op\": %s, \"yields_per_op\": %s, \"futex_per_op\": %s}", $11, $12, $13 }
  END { print (n ? "\n]" : "[]") }' "$out/profile.md" >"$out/profile.json"
cat "$out/profile.md"
cc -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -o "$out/copy_lock" "$top/integration/peers/copy_lock.c" -lpthread
for size in 4096 65536; do
  taskset -c 0 "$out/copy_lock" "$size" $((8 * 1024 * 1024 * 1024 / size / 4)) 5
done | tee "$out/copy_lock.txt"
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$out/profile.json"

# ---- UCX's thread modes beside hixl 1-buf: PATH OP BLOCK, 3 rounds, GB/s only ----
if command -v ucx_perftest >/dev/null; then
  say "UCX's thread modes beside hixl 1-buf"
  for r in 1 2 3; do
    for pt in "tcp write 4096" "shm read 4096" "shm read 65536"; do
      set -- $pt
      w=1
      [ "$1 $2" = "tcp write" ] && w=$window # UCX's window over TCP, as above; a sync call on the same host
      n=$(awk -v d="$duration" -v s="$3" -v p="$1" 'BEGIN { print int(d * (p == "shm" ? 50e9 : 1.5e9) / s) }')
      echo "$r $1 $2 $3 $(hixl_run "$1" "$2" "$3" 50 "$w") $(ucx_run "$1" "$2" "$3" single "$n") $(ucx_run "$1" "$2" "$3" multi "$n")"
    done
  done >"$out/thread_mode.txt"
  # Medians over the rounds, and the ratios of medians.
  awk "$awk_med"'{ k = $2 " " $3 " " $4; h[k] = h[k] " " $5; s[k] = s[k] " " $6; m[k] = m[k] " " $7; if (!(k in seen)) { seen[k]; o[++n] = k } }
    END {
      print "| point | hixl 1-buf GB/s | UCX -M single GB/s | UCX -M multi GB/s | hixl / single | hixl / multi | multi / single |"
      print "|---|---:|---:|---:|---:|---:|---:|"
      for (i = 1; i <= n; i++) {
        split(o[i], q, " "); a = med(h[o[i]]); b = med(s[o[i]]); c = med(m[o[i]])
        printf "| %s %s %d KiB x 1 x 1 | %.2f | %.2f | %.2f | %.2fx | %.2fx | %.2fx |\n", q[1] == "shm" ? "same host" : "loopback TCP",
          toupper(q[2]), q[3] / 1024, a, b, c, a / b, a / c, c / b
      }
    }' "$out/thread_mode.txt" >"$out/thread_mode.md"
  awk -F' *\\| *' 'NR > 2 { printf "%s  {\"point\": \"%s\", \"hixl_gbps\": %s, \"ucx_single_gbps\": %s, \"ucx_multi_gbps\": %s}", (n++ ? ",\n" : "[\n"), $2, $3, $4, $5 }
    END { print (n ? "\n]" : "[]") }' "$out/thread_mode.md" >"$out/thread_mode.json"
  cat "$out/thread_mode.md"
  python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$out/thread_mode.json"
fi

# ---- the loopback WRITE's ceiling with an answer per op: hixl 1-buf, plain sockets answered, UCX ----
segs() { awk '/^Tcp:/ { if (h) { print $f; exit } for (i = 1; i <= NF; i++) if ($i == "OutSegs") f = i; h = 1 }' /proc/net/snmp; }
cmake --build "$build" --target hixl-tcp-ref -j2 >/dev/null 2>&1 ||
  { say "cannot build hixl-tcp-ref in $build: the answered ceiling is left out"; exit 0; }
ref=$build/integration/bench/hixl-tcp-ref
say "loopback WRITE 4 KiB x 1 x 1: hixl 1-buf, plain sockets answered (window $window), UCX"
n=$(awk -v d="$duration" 'BEGIN { print int(d * 1.5e9 / 4096) }')
for r in 1 2 3; do
  s0=$(segs); h=$(hixl_run tcp write 4096 50 "$window"); s1=$(segs)
  a=$("$ref" --mode answered --size 4096 --window "$window" --seconds "$duration" --pin 0,1 |
    sed -n 's/.*: \([0-9]*\) in \([0-9.]*\) s = \([0-9.]*\) GB\/s/\1 \3/p'); s2=$(segs)
  u=$(ucx_run tcp write 4096 single "$n"); s3=$(segs)
  # round, GB/s and segments per op of each: hixl (ops from its GB/s), answered, UCX (N + 100 warm-up ops)
  awk -v r="$r" -v h="${h:-0}" -v a="${a:-0 0}" -v u="${u:-0}" -v d="$duration" -v n="$n" \
    -v s0="$s0" -v s1="$s1" -v s2="$s2" -v s3="$s3" 'BEGIN {
      split(a, q, " "); ho = h * 1e9 * d / 4096
      printf "%d %s %.3f %s %.3f %s %.3f\n", r, h, ho ? (s1 - s0) / ho : 0, q[2], q[1] ? (s2 - s1) / q[1] : 0, u, (s3 - s2) / (n + 100) }'
done >"$out/answered.txt"
awk "$awk_med"'{ for (i = 2; i <= 7; i++) v[i] = v[i] " " $i }
  END {
    h = med(v[2]); a = med(v[4]); u = med(v[6])
    print "| point | hixl 1-buf GB/s | plain sockets, answered, GB/s | UCX put GB/s | hixl / answered | answered / UCX | hixl / UCX | TCP segments an op: hixl | answered | UCX |"
    print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    printf "| loopback TCP WRITE 4 KiB x 1 x 1 | %.3f | %.3f | %.3f | %.2fx | %.2fx | %.2fx | %.2f | %.2f | %.2f |\n",
      h, a, u, (a > 0 ? h / a : 0), (u > 0 ? a / u : 0), (u > 0 ? h / u : 0), med(v[3]), med(v[5]), med(v[7])
  }' "$out/answered.txt" >"$out/answered.md"
awk -F' *\\| *' 'NR == 3 { printf "{\"point\": \"%s\", \"hixl_gbps\": %s, \"answered_gbps\": %s, \"ucx_gbps\": %s, \"segments_per_op\": {\"hixl\": %s, \"answered\": %s, \"ucx\": %s}}\n", $2, $3, $4, $5, $9, $10, $11 }' \
  "$out/answered.md" >"$out/answered.json"
cat "$out/answered.md"
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$out/answered.json"
