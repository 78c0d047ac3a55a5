#!/usr/bin/env bash
# hixl beside its peers on the same transfers, in one run (issue 46): hixl-peers (hixl
# with Mooncake transfer_engine_bench's knobs and formula), Mooncake's
# transfer_engine_bench (TCP transport, P2PHANDSHAKE metadata), ucx_perftest
# (ucp_put_bw for WRITE, ucp_get for READ) and NIXL's Python agent with its UCX backend
# (nixl_peer.py), on loopback TCP and on the same-host path.
#
#   integration/peers/run_peers.sh [--quick] [--build DIR] [--out DIR] [--rounds N]
#       [--duration S] [--paths tcp,shm] [--ops read,write] [--blocks 4K,64K,4M]
#       [--batches 1,128] [--threads 1,8] [--buffer BYTES] [--poll-us US]
#
# --build: a build of this tree (default build-peers, configured RelWithDebInfo when new);
# the script builds its hixl-peers target (integration/peers/CMakeLists.txt).
#
# Every point (path x op x block x batch x threads) runs every tool for --duration
# seconds per round, the tools' order rotated from round to round. Each tool keeps
# batch x threads ops in flight: hixl and Mooncake with `threads` threads each waiting
# on one batch of `batch` ops; NIXL with `threads` requests of `batch` descriptors
# posted from one thread; ucx_perftest with -T threads and -O batch outstanding ops per
# thread (over TCP a put is done once UCX has it, so hixl-1buf gets UCX's measured window
# on TCP WRITE: below). Points whose block x batch x threads exceeds --buffer (default 1 GiB,
# Mooncake's default buffer_size) are left out and listed.
#
# hixl runs in the shape of each peer it is set against, each shape twice a round (the
# second run is that shape's A/A):
#   hixl        Mooncake's layout, batch x threads distinct blocks on both sides, into
#               plain memory the target registered (on the same host every op is one
#               process_vm_readv / writev); set against Mooncake and NIXL, whose
#               targets register plain memory too.
#   hixl-1buf   ucx_perftest's shape (hixl-peers --one_buffer): each thread moves one
#               block at one offset again and again, `batch` at a time, as
#               ucx_perftest's run_stream_uni puts or gets one message buffer a thread
#               (openucx/ucx src/tools/perf/lib/ucp_tests.cc); on the same host into
#               memory the target took from HixlEngineAllocMem (--alloc: the initiator
#               maps it and copies with memcpy), as UCX's sm transports copy into the
#               segment ucx_perftest allocated with ucp_mem_map. Set against UCX.
#   hixl-alloc  same host only: hixl's distinct blocks into HixlEngineAllocMem memory
#               (what allocating buys at the same workload; no peer column).
# Both hixl targets' data is checked byte for byte after each point of round 1.
#
# Processes: initiators on CPU 0, targets on CPU 1 (as run_perf.sh). hixl's targets (one
# on plain memory, on the same host a second with --alloc), Mooncake's and NIXL's
# targets (and NIXL's initiator) stay up for one path of one round; the others start
# per point. CPU seconds are both processes' user + system time from the
# point's start to its result (/usr/bin/time for processes started for the point,
# /proc/PID/stat deltas for the ones kept up), over the bytes the tool counted.
#
# --poll-us US runs every hixl engine (targets and initiators) with PollUs US (env
# HIXL_POLL_US; default 50 here, where hixl's own default is 0): its progress thread, and
# a sync caller, poll for that long after an event instead of sleeping at once (0), as
# NIXL's UCX progress thread polls all the time. The page says which.
#
# Output: OUT/raw.tsv (one record a run), OUT/peers.md (the tables), OUT/peers.json;
# progress on stderr. A tool that cannot run here gets a line saying why (a SKIP
# record). --quick: two points per path, one round, 1 s each (a smoke test).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
here=$top/integration/peers
build=$top/build-peers
out=
rounds=2
duration=1
paths=tcp,shm
ops=write,read
blocks=4K,64K,4M
batches=1,128
threads=1,8
buffer=$((1 << 30))
poll_us=50
quick=0
venv=${HIXL_VLLM_VENV:-/opt/hixl/vllm-venv}
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --build) build=$(cd "$2" && pwd); shift ;;
    --out) out=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --duration) duration=$2; shift ;;
    --paths) paths=$2; shift ;;
    --ops) ops=$2; shift ;;
    --blocks) blocks=$2; shift ;;
    --batches) batches=$2; shift ;;
    --threads) threads=$2; shift ;;
    --buffer) buffer=$2; shift ;;
    --poll-us) poll_us=$2; shift ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_peers.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [ $quick = 1 ]; then
  rounds=1 duration=1 ops=read blocks=4K,64K batches=128 threads=1
fi
[[ $poll_us =~ ^[0-9]+$ ]] && [ "$poll_us" -le 1000000 ] || { echo "run_peers.sh: --poll-us takes 0 to 1000000" >&2; exit 2; }
export HIXL_POLL_US=$poll_us # read by hixl's engines only
out=${out:-$build/peers-results}
mkdir -p "$out"
raw=$out/raw.tsv
: >"$raw"
log=$out/log
: >"$log"
say() { echo "peers: $*" >&2; }

# ------------------------------------------------------------------ the tools
[ -f "$build/CMakeCache.txt" ] || cmake -S "$top" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target hixl-peers -j2 >/dev/null
hp=$build/integration/peers/hixl-peers

size_of() { # 4K -> 4096
  local v=${1%[KkMmGg]} u=${1: -1}
  case $u in K|k) echo $((v << 10)) ;; M|m) echo $((v << 20)) ;; G|g) echo $((v << 30)) ;; *) echo "$1" ;; esac
}
skip() { printf 'SKIP\t%s\t%s\t%s\n' "$1" "$2" "$3" >>"$raw"; say "$1: $2 skipped: $3"; }

vpy=$venv/bin/python
# The venv's transfer_engine_bench is a Python wrapper that runs the wheel's binary as a
# child; the binary itself is run, so that its pid is the one measured and signalled.
teb=$("$vpy" -c 'import mooncake, os; print(os.path.join(os.path.dirname(mooncake.__file__), "transfer_engine_bench"))' 2>/dev/null || echo "$venv/bin/transfer_engine_bench")
have_mooncake=1 have_ucx=1 have_nixl=1
[ -x "$teb" ] || { have_mooncake=0; why_mooncake="transfer_engine_bench missing (integration/vllm/install.sh --peers installs mooncake-transfer-engine-non-cuda)"; }
command -v ucx_perftest >/dev/null || { have_ucx=0; why_ucx="ucx_perftest missing (apt-get install ucx-utils)"; }
if [ ! -x "$vpy" ]; then
  have_nixl=0 why_nixl="no venv at $venv (integration/vllm/install.sh --peers)"
elif ! err=$(UCX_TLS=tcp "$vpy" -c 'import os
from nixl._api import nixl_agent, nixl_agent_config
nixl_agent("probe", nixl_agent_config(backends=["UCX"])); os._exit(0)' 2>&1 >/dev/null); then
  have_nixl=0 why_nixl="nixl's UCX backend does not load: $(echo "$err" | grep -v ' INFO ' | tail -1)"
fi

cpu_ticks() { # utime + stime of a live process, in clock ticks
  awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0
}
hz=$(getconf CLK_TCK)
time_cpu() { # the CPU seconds a /usr/bin/time -f '%U %S' file holds (its last line)
  tail -1 "$1" 2>/dev/null | awk 'NF == 2 { print $1 + $2; exit } { print 0 }'
}
kv() { # the value of key in a "RESULT k=v ..." line
  echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"
}
record() { # round path op block batch threads tool gbps bytes seconds verified cpu
  printf 'RUN\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$raw"
}

# ------------------------------------------------------------------ targets kept up
fifos=
declare -A tgt_pid=() tgt_eng=() tgt_addr=() tgt_in=() # hixl's targets by kind: plain, alloc
mc_tgt_pid= mc_seg=
nixl_dir= nixl_tgt_pid= nixl_ini_pid=

start_hixl_target() { # path kind: plain (RegisterMem on mmap) or alloc (HixlEngineAllocMem)
  local path=$1 kind=$2 port ready eng addr fd flag=()
  [ "$kind" = alloc ] && flag=(--alloc)
  mkfifo "$fifos/hixl-$kind-in"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # The target serves until its stdin ends: this script holds the fifo's write end.
  taskset -c 1 "$hp" --mode=target --protocol="$path" --local_server_name=127.0.0.1:"$port" \
    --buffer_size="$buffer" "${flag[@]}" <"$fifos/hixl-$kind-in" >"$fifos/hixl-$kind-ready" 2>>"$log" &
  tgt_pid[$kind]=$!
  exec {fd}>"$fifos/hixl-$kind-in"
  tgt_in[$kind]=$fd
  for _ in $(seq 300); do
    read -r ready eng addr _ <"$fifos/hixl-$kind-ready" 2>/dev/null || true
    [ "${ready:-}" = READY ] && break
    kill -0 "${tgt_pid[$kind]}" 2>/dev/null || break
    sleep 0.1
  done
  [ "${ready:-}" = READY ] || { say "hixl's $kind target did not start (see $log)"; exit 1; }
  tgt_eng[$kind]=$eng tgt_addr[$kind]=$addr
}

start_targets() { # path
  local path=$1
  fifos=$(mktemp -d)
  mkfifo "$fifos/nixl-in" "$fifos/nixl-out"
  start_hixl_target "$path" plain
  [ "$path" = shm ] && start_hixl_target "$path" alloc
  if [ "$path" = tcp ] && [ $have_mooncake = 1 ]; then
    taskset -c 1 "$teb" --mode=target --protocol=tcp --metadata_server=P2PHANDSHAKE \
      --local_server_name=127.0.0.1 --buffer_size="$buffer" >"$out/mooncake-target.log" 2>&1 &
    mc_tgt_pid=$!
    mc_seg=
    for _ in $(seq 100); do
      mc_seg=$(sed -n 's/.*listening on \([0-9.]*:[0-9]*\).*/\1/p' "$out/mooncake-target.log" | head -1)
      [ -n "$mc_seg" ] && grep -q 'numa node num' "$out/mooncake-target.log" && break
      sleep 0.1
    done
    if [ -z "$mc_seg" ]; then
      skip tcp mooncake "its target did not start: $(tail -1 "$out/mooncake-target.log")"
      kill "$mc_tgt_pid"
      mc_tgt_pid=
    fi
  fi
  if [ $have_nixl = 1 ]; then
    nixl_dir=$fifos/nixl
    mkdir "$nixl_dir"
    local tls=tcp
    [ "$path" = shm ] && tls=sm,tcp # NIXL's UCX backend needs a network transport beside sm for wire-up
    UCX_TLS=$tls UCX_KEEPALIVE_INTERVAL=inf taskset -c 1 "$vpy" "$here/nixl_peer.py" --mode=target --dir="$nixl_dir" \
      --buffer_size="$buffer" >>"$log" 2>&1 &
    nixl_tgt_pid=$!
    UCX_TLS=$tls UCX_KEEPALIVE_INTERVAL=inf taskset -c 0 "$vpy" "$here/nixl_peer.py" --mode=initiator --dir="$nixl_dir" \
      --buffer_size="$buffer" <"$fifos/nixl-in" >"$fifos/nixl-out" 2>>"$log" &
    nixl_ini_pid=$!
    exec {nixl_in}>"$fifos/nixl-in" {nixl_out}<"$fifos/nixl-out"
    nixl_line 60 >/dev/null || { say "NIXL's agents did not start (see $log)"; exit 1; }
    # Their UCX progress threads poll even when idle: stopped between NIXL's own runs,
    # so that they take no CPU from the other tools.
    kill -STOP "$nixl_ini_pid" "$nixl_tgt_pid"
  fi
}

wait_or_kill() { # pid seconds: wait for a process we started, TERM then KILL it past the time
  local i
  for i in $(seq $(($2 * 10))); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -TERM "$1" 2>/dev/null || true
  for i in $(seq 30); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

stop_targets() {
  local kind fd
  # Children started later hold the fifo's write end too: the target is told by TERM.
  for kind in "${!tgt_pid[@]}"; do
    kill -TERM "${tgt_pid[$kind]}" 2>/dev/null || true
    fd=${tgt_in[$kind]}
    exec {fd}>&-
    wait_or_kill "${tgt_pid[$kind]}" 5
  done
  tgt_pid=() tgt_eng=() tgt_addr=() tgt_in=()
  if [ -n "$mc_tgt_pid" ]; then
    kill -TERM "$mc_tgt_pid" 2>/dev/null || true
    wait_or_kill "$mc_tgt_pid" 5
    mc_tgt_pid=
  fi
  if [ -n "$nixl_ini_pid" ]; then
    kill -CONT "$nixl_ini_pid" "$nixl_tgt_pid" 2>/dev/null || true
    exec {nixl_in}>&- {nixl_out}<&-
    wait_or_kill "$nixl_ini_pid" 10
    : >"$nixl_dir/done"
    wait_or_kill "$nixl_tgt_pid" 5
    nixl_ini_pid= nixl_tgt_pid=
  fi
  rm -rf "$fifos"
}

nixl_line() { # the next RESULT or READY line of NIXL's initiator (its log lines go to stdout too)
  local line
  while read -r -t "$1" -u "$nixl_out" line; do
    case $line in RESULT*|READY*) echo "$line"; return 0 ;; esac
  done
  return 1
}

stop_child() { # the child of a /usr/bin/time we started: TERM, then KILL after 5 s
  local kid i
  kid=$(pgrep -P "$1" || true)
  if [ -n "$kid" ]; then
    kill -TERM "$kid" 2>/dev/null || true
    for i in $(seq 50); do kill -0 "$kid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$kid" 2>/dev/null || true
  fi
  wait "$1" 2>/dev/null || true
}

# ------------------------------------------------------------------ one run per tool
# Each: round path op block batch threads [verify]; appends a RUN record, or says why not.
run_hixl() { # ... tool-name verify: hixl, hixl-aa, hixl-alloc, hixl-1buf or hixl-1buf-aa (head)
  local r=$1 path=$2 op=$3 bs=$4 b=$5 t=$6 tool=$7 verify=$8 c0 c1 res tf kind=plain shape=()
  case $tool in
    hixl-alloc) kind=alloc ;;
    hixl-1buf*) shape=(--one_buffer); [ "$path" = shm ] && kind=alloc ;;
  esac
  [ "${shape[*]}" = --one_buffer ] && [ -n "${win["$bs $b $t"]:-}" ] && [ "$path $op" = "tcp write" ] &&
    shape+=(--window="${win["$bs $b $t"]}")
  tf=$(mktemp)
  c0=$(cpu_ticks "${tgt_pid[$kind]}")
  res=$(/usr/bin/time -f '%U %S' -o "$tf" taskset -c 0 "$hp" --mode=initiator --protocol="$path" \
    --segment_id="${tgt_eng[$kind]}" --remote_addr="${tgt_addr[$kind]}" --operation="$op" --threads="$t" \
    --batch_size="$b" --block_size="$bs" --duration="$duration" --buffer_size="$buffer" "${shape[@]}" $verify \
    2>>"$log" | grep '^RESULT') || { say "$tool failed at $path $op $bs x $b x $t (see $log)"; rm -f "$tf"; return 0; }
  c1=$(cpu_ticks "${tgt_pid[$kind]}")
  record "$r" "$path" "${op^^}" "$bs" "$b" "$t" "$tool" "$(kv gbps "$res")" "$(kv bytes "$res")" \
    "$(kv seconds "$res")" "$(kv verified_bytes "$res")" \
    "$(awk -v a="$(time_cpu "$tf")" -v d=$((c1 - c0)) -v hz="$hz" 'BEGIN { print a + d / hz }')"
  rm -f "$tf"
}

run_mooncake() {
  local r=$1 path=$2 op=$3 bs=$4 b=$5 t=$6 c0 c1 line tf secs count
  [ -n "$mc_tgt_pid" ] || return 0
  tf=$(mktemp)
  c0=$(cpu_ticks "$mc_tgt_pid")
  # Its --duration is whole seconds: the next one up.
  secs=$(awk -v d="$duration" 'BEGIN { s = int(d); if (s < d) s++; if (s < 1) s = 1; print s }')
  line=$(/usr/bin/time -f '%U %S' -o "$tf" taskset -c 0 "$teb" --mode=initiator --protocol=tcp \
    --metadata_server=P2PHANDSHAKE --local_server_name=127.0.0.1 --segment_id="$mc_seg" --operation="$op" \
    --threads="$t" --batch_size="$b" --block_size="$bs" --duration="$secs" --buffer_size="$buffer" 2>&1 |
    grep 'Test completed') || { say "Mooncake failed at $path $op $bs x $b x $t"; rm -f "$tf"; return 0; }
  c1=$(cpu_ticks "$mc_tgt_pid")
  # "Test completed: duration 2.01, batch count 155, throughput 0.65 GB/s"
  local dur cnt gbps
  dur=$(echo "$line" | sed -n 's/.*duration \([0-9.]*\),.*/\1/p')
  cnt=$(echo "$line" | sed -n 's/.*batch count \([0-9]*\),.*/\1/p')
  # Its own formula, batches x batch x block / duration, with more places than its 2.
  gbps=$(awk -v c="$cnt" -v b="$b" -v s="$bs" -v d="$dur" 'BEGIN { printf "%.4f", (d > 0 ? c * b * s / d / 1e9 : 0) }')
  record "$r" "$path" "${op^^}" "$bs" "$b" "$t" mooncake "$gbps" $((cnt * b * bs)) "$dur" 0 \
    "$(awk -v a="$(time_cpu "$tf")" -v d=$((c1 - c0)) -v hz="$hz" 'BEGIN { print a + d / hz }')"
  rm -f "$tf"
}

run_ucx() { # ... [probe]: with probe, no record: prints the bytes its sockets held (below)
  local r=$1 path=$2 op=$3 bs=$4 b=$5 t=$6 probe=${7:-} port test tls sf cf so co spid cpid mt=() q=()
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  test=ucp_put_bw
  [ "$op" = read ] && test=ucp_get
  tls=tcp
  [ "$path" = shm ] && tls=sm
  [ "$t" -gt 1 ] && mt=(-T "$t" -M multi)
  local n
  n=$(awk -v d="$duration" -v s="$bs" 'BEGIN { n = int(d * 1e9 / s); print n < 200 ? 200 : (n > 200000 ? 200000 : n) }')
  sf=$(mktemp) cf=$(mktemp) so=$(mktemp) co=$(mktemp)
  UCX_TLS=$tls UCX_NET_DEVICES=lo,all /usr/bin/time -f '%U %S' -o "$sf" \
    ucx_perftest -p "$port" -c 1 "${mt[@]}" >"$so" 2>&1 &
  spid=$!
  sleep 0.3
  # No duration knob: -n is what 1 GB/s would move in `duration` (at least 200, at most
  # 200000 ops per thread); it reports every second while it runs and is stopped after
  # `duration` + 4 s: its Final line, or else its last report per thread, is the figure.
  UCX_TLS=$tls UCX_NET_DEVICES=lo,all /usr/bin/time -f '%U %S' -o "$cf" stdbuf -oL \
    ucx_perftest 127.0.0.1 -p "$port" -c 0 -t "$test" -s "$bs" -O "$b" -n "$n" -w 100 "${mt[@]}" \
    >"$co" 2>&1 &
  cpid=$!
  local want need=0 i
  want=$(awk -v d="$duration" 'BEGIN { s = int(d); if (s < d) s++; print s < 1 ? 1 : s }')
  for i in $(seq $(((want + 4) * 10))); do
    kill -0 "$cpid" 2>/dev/null || break
    # probe: what both processes' TCP sockets hold (send and receive queues), the puts
    # UCX has counted done that the target has not taken yet; a sample of 0 (before the
    # puts start, after they end) is not one of the window's
    [ -n "$probe" ] && q+=("$(sock_bytes "$(pgrep -P "$cpid")" "$(pgrep -P "$spid")")")
    sleep 0.1
  done
  # SIGTERM: this shell's background jobs ignore SIGINT. The pids are ucx_perftest's,
  # children of /usr/bin/time (stdbuf execs it).
  stop_child "$cpid"
  stop_child "$spid"
  if [ -n "$probe" ]; then
    rm -f "$sf" "$cf" "$so" "$co"
    printf '%s\n' "${q[@]}" | awk '$1 > 0' | sort -n | awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : 0 }'
    return 0
  fi
  need=$(grep -c '^\[thread\|^Final' "$co" || true)
  if [ "$need" -lt 1 ]; then
    say "UCX gave no figure at $path $op $bs x $b x $t: $(grep -v '^\[\|^|\|^+' "$co" | tail -1)"
    rm -f "$sf" "$cf" "$so" "$co"
    return 0
  fi
  # The last line of each thread: "[thread N] iters p50 avg overall MB/s-avg MB/s-overall ..." (MB = 2^20).
  local iters mibs
  if grep -q '^Final' "$co"; then
    read -r iters mibs < <(awk '/^Final/ { n += $2; bw += $7 } END { print n, bw }' "$co")
  else
    read -r iters mibs < <(grep '^\[thread' "$co" | awk '{ last[$2] = $0 }
      END { for (k in last) { split(last[k], f, " "); n += f[3]; bw += f[8] } print n, bw }')
  fi
  local gbps bytes secs
  gbps=$(awk -v m="$mibs" 'BEGIN { printf "%.4f", m * 1048576 / 1e9 }')
  bytes=$(awk -v n="$iters" -v s="$bs" 'BEGIN { printf "%d", n * s }')
  secs=$(awk -v b="$bytes" -v g="$gbps" 'BEGIN { printf "%.4f", (g > 0 ? b / g / 1e9 : 0) }')
  record "$r" "$path" "${op^^}" "$bs" "$b" "$t" ucx "$gbps" "$bytes" "$secs" 0 \
    "$(awk -v a="$(time_cpu "$sf")" -v b="$(time_cpu "$cf")" 'BEGIN { print a + b }')"
  rm -f "$sf" "$cf" "$so" "$co"
}

sock_bytes() { # pid...: the bytes in the send and receive queues of their TCP sockets
  local pids
  pids=$(printf 'pid=%s,|' "$@")
  ss -tnpH state established 2>/dev/null | grep -E "${pids%|}" | awk '{ n += $1 + $2 } END { print n + 0 }'
}

run_nixl() {
  local r=$1 path=$2 op=$3 bs=$4 b=$5 t=$6 v=0 c0 c1 res
  [ -n "$nixl_ini_pid" ] || return 0
  [ "${7:-}" = --verify ] && v=1
  c0=$(cpu_ticks "$nixl_tgt_pid")
  kill -CONT "$nixl_tgt_pid" "$nixl_ini_pid"
  echo "$op $t $b $bs $duration $v" >&"$nixl_in"
  res=$(nixl_line 120) || res="no result within 120 s (see $log)"
  kill -STOP "$nixl_ini_pid" "$nixl_tgt_pid"
  c1=$(cpu_ticks "$nixl_tgt_pid")
  case $res in RESULT*gbps=*) ;; *) say "NIXL at $path $op $bs x $b x $t: $res"; return 0 ;; esac
  record "$r" "$path" "${op^^}" "$bs" "$b" "$t" nixl "$(kv gbps "$res")" "$(kv bytes "$res")" \
    "$(kv seconds "$res")" "$(kv verified_bytes "$res")" \
    "$(awk -v a="$(kv cpu_s "$res")" -v d=$((c1 - c0)) -v hz="$hz" 'BEGIN { print a + d / hz }')"
}

# ------------------------------------------------------------------ the sweep
points=()
cut=()
for op in ${ops//,/ }; do
  for bsz in ${blocks//,/ }; do
    for b in ${batches//,/ }; do
      for t in ${threads//,/ }; do
        bs=$(size_of "$bsz")
        if [ $((bs * b * t)) -gt "$buffer" ]; then cut+=("$op $bsz x $b x $t"); continue; fi
        points+=("$op $bs $b $t")
      done
    done
  done
done
[ ${#cut[@]} -eq 0 ] || say "left out (block x batch x threads over $buffer bytes): ${cut[*]}"
printf '%s\n' "${cut[@]}" >"$out/cut.txt"

for path in ${paths//,/ }; do
  if [ $have_mooncake = 0 ]; then
    skip "$path" mooncake "$why_mooncake"
  elif [ "$path" = shm ]; then
    skip shm mooncake "the non-CUDA wheel's transports are tcp and RDMA-class ones; none is a same-host path (its loopback TCP figure is in the TCP table)"
  fi
  if [ $have_ucx = 0 ]; then skip "$path" ucx "$why_ucx"; fi
  if [ $have_nixl = 0 ]; then skip "$path" nixl "$why_nixl"; fi
done

# UCX's window over TCP. A ucp_put_bw put is done once UCX has taken it (into a socket):
# however small -O, its puts stream, as many in flight as its sockets hold. hixl-1buf
# (set against UCX) gets the same in flight, measured: one probe run of ucx_perftest per
# TCP WRITE point samples its sockets' queues (ss), and hixl-1buf and its A/A keep
# ceil(median bytes / (block x batch x threads)) batches a thread in flight
# (hixl-peers --window, at most 1024). A get waits for its data, so READ keeps -O batch,
# as hixl does; on the same host a put is a copy into the target's memory, done when it
# returns, as hixl's.
declare -A win=()
if [ $have_ucx = 1 ] && [[ ,$paths, == *,tcp,* ]]; then
  for pt in "${points[@]}"; do
    read -r op bs b t <<<"$pt"
    [ "$op" = write ] || continue
    q=$(run_ucx 0 tcp write "$bs" "$b" "$t" probe)
    w=$(awk -v q="$q" -v s=$((bs * b * t)) 'BEGIN { w = int((q + s - 1) / s); print w < 1 ? 1 : (w > 1024 ? 1024 : w) }')
    win["$bs $b $t"]=$w
    printf 'WINDOW\ttcp\tWRITE\t%s\t%s\t%s\t%s\t%s\n' "$bs" "$b" "$t" "$w" "$q" >>"$raw"
    say "UCX's window at WRITE $bs x $b x $t: $q bytes in its sockets, hixl-1buf keeps $w batches a thread"
  done
fi

t_start=$(date +%s)
total=$((${#points[@]} * rounds * $(echo "${paths//,/ }" | wc -w)))
done_n=0
for r in $(seq "$rounds"); do
  for path in ${paths//,/ }; do
    start_targets "$path"
    for i in "${!points[@]}"; do
      read -r op bs b t <<<"${points[$i]}"
      verify=
      [ "$r" = 1 ] && verify=--verify
      if [ "$path" = shm ]; then
        tools=(hixl hixl-alloc hixl-aa hixl-1buf ucx hixl-1buf-aa nixl)
      else
        tools=(hixl mooncake hixl-aa hixl-1buf ucx hixl-1buf-aa nixl)
      fi
      # rotate the order by round and point, so no tool always runs first
      k=$(((r + i) % ${#tools[@]}))
      tools=("${tools[@]:$k}" "${tools[@]:0:$k}")
      for tool in "${tools[@]}"; do
        case $tool in
          hixl | hixl-alloc | hixl-1buf) run_hixl "$r" "$path" "$op" "$bs" "$b" "$t" "$tool" "$verify" ;;
          hixl-aa | hixl-1buf-aa) run_hixl "$r" "$path" "$op" "$bs" "$b" "$t" "$tool" "" ;;
          mooncake) if [ "$path" = tcp ]; then run_mooncake "$r" "$path" "$op" "$bs" "$b" "$t"; fi ;;
          ucx) if [ $have_ucx = 1 ]; then run_ucx "$r" "$path" "$op" "$bs" "$b" "$t"; fi ;;
          nixl) run_nixl "$r" "$path" "$op" "$bs" "$b" "$t" $verify ;;
        esac
      done
      done_n=$((done_n + 1))
      say "[$done_n/$total, $(($(date +%s) - t_start)) s] round $r $path ${op^^} $bs x $b x $t: $(awk -F'\t' -v r="$r" -v p="$path" \
        -v o="${op^^}" -v s="$bs" -v b="$b" -v t="$t" '$1 == "RUN" && $2 == r && $3 == p && $4 == o && $5 == s && $6 == b && $7 == t { printf "%s %.2f  ", $8, $9 }' "$raw")"
    done
    stop_targets
  done
done
elapsed=$(($(date +%s) - t_start))
"$hp" --mode=report --raw="$raw" --md="$out/peers.md" --json="$out/peers.json"
{
  echo "- $rounds round(s), $duration s per run; $elapsed s in all; $(date -u '+%Y-%m-%d %H:%M UTC'); hixl's PollUs $poll_us"
  [ ${#cut[@]} -eq 0 ] || echo "- left out (block x batch x threads over $buffer bytes, the buffers' size): ${cut[*]}"
} >>"$out/peers.md"
cat "$out/peers.md"
say "raw records $raw, table $out/peers.md, JSON $out/peers.json ($elapsed s)"
