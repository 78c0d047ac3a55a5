#!/usr/bin/env bash
# run_perf.sh BUILD_DIR [OUTPUT_MD]
#
# Measures, in one run on 127.0.0.1 only: the plain TCP reference (hixl-tcp-ref),
# iperf3, ucx_perftest over tcp, and hixl-bench (WRITE and READ at 4 MiB, a small
# sweep, the 64-byte READ round trip), and hixl-bench through HIXL's client/server API
# (--api cs) against the engine API on the same transport (tcp), and the staging pool
# (small ops coalesced or not, unregistered memory, over tcp), and the same-host
# transport (hixl-shm-ref: Transport shm beside memcpy and process_vm_readv, with 4 KiB
# and with transparent huge pages); then writes OUTPUT_MD (default docs/performance.md
# of this source tree) with every figure and the ratios of issues 2, 4 and 5 and the
# staging pool target, PASS or MISS each. Builds nothing: BUILD_DIR must hold the
# built tools.
#
# Loopback figures on a small VM swing by 20-50% from one run to the next, so the
# figures behind the targets are taken PERF_ROUNDS times (default 3), hixl and its
# reference interleaved, and the median is compared. Every two-process measurement
# pins one process per CPU (initiator/client/sender on CPU 0, target/server/receiver
# on CPU 1), like two hosts: unpinned, the scheduler puts both on one CPU or on two
# at random, which flips small-op latency between ~8 and ~55 us (a cross-CPU wake-up
# on this kind of VM costs ~45 us) and large-op bandwidth between ~2.7 and ~5 GB/s.
# Unpinned and same-CPU round trips are shown for information. The CS-vs-engine pairs
# run back to back near the end of every round, their order alternating between
# rounds; so do the staging runs after them. hixl-shm-ref runs once per page size at
# the end: it interleaves its figures over 3 rounds itself and reports their medians.
#
# Environment: PERF_ROUNDS=N (1..9); PERF_WAIT_IDLE=SECONDS waits, bounded, for
# other processes to leave the CPUs idle first. Raw outputs: BUILD_DIR/perf-results.
# Every step runs under `timeout`.
set -u -o pipefail

die() { echo "run_perf: $*" >&2; exit 1; }
log() { echo "run_perf: $*" >&2; }

[ $# -ge 1 ] || die "usage: $0 BUILD_DIR [OUTPUT_MD]"
BUILD=$(cd "$1" 2>/dev/null && pwd) || die "no build dir: $1"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$SRC/docs/performance.md}
BENCH=$BUILD/integration/bench/hixl-bench
TCPREF=$BUILD/integration/bench/hixl-tcp-ref
for b in "$BENCH" "$TCPREF"; do
  [ -x "$b" ] || die "$b is missing: build first (cmake --build $BUILD)"
done
ROUNDS=${PERF_ROUNDS:-3}
[[ "$ROUNDS" =~ ^[1-9]$ ]] || die "PERF_ROUNDS must be 1..9"
NPROC=$(nproc)
PIN="" ON_CLIENT=() ON_SERVER=()
if [ "$NPROC" -ge 2 ]; then
  PIN="0,1" ON_CLIENT=(taskset -c 0) ON_SERVER=(taskset -c 1)
fi
UCX_ENV=(UCX_TLS=tcp UCX_NET_DEVICES=lo)

RES=$BUILD/perf-results
rm -rf "$RES"
mkdir -p "$RES" || die "cannot create $RES"

# Background servers we start; stopped on any exit.
BG_PIDS=()
cleanup() {
  for p in "${BG_PIDS[@]}"; do
    kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A TCP port not in use on this host (not in /proc/net/tcp{,6}), from $1 upward.
free_port() {
  local p
  for p in $(seq "$1" $(($1 + 200))); do
    if ! grep -q "$(printf ':%04X ' "$p")" /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# Wait (at most $2 seconds) until something listens on port $1. Reads
# /proc/net/tcp rather than connecting: a probe would count as a client.
wait_listen() {
  local hex i
  hex=$(printf '%04X' "$1")
  for ((i = 0; i < $2 * 20; i++)); do
    if awk -v h="$hex" 'NR > 1 { split($2, a, ":"); if (a[2] == h && $4 == "0A") f = 1 } END { exit !f }' \
      /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
      return 0
    fi
    sleep 0.05
  done
  return 1
}

# csv_get FILE KEY=VALUE... COLUMN: COLUMN of the first row matching every KEY=VALUE.
csv_get() {
  local file=$1
  shift
  local col=${!#}
  local conds=("${@:1:$#-1}")
  [ -s "$file" ] || return 0
  awk -F, -v col="$col" -v conds="${conds[*]}" '
    NR == 1 { for (i = 1; i <= NF; i++) idx[$i] = i; n = split(conds, c, " "); next }
    {
      ok = 1
      for (k = 1; k <= n; k++) { split(c[k], kv, "="); if ($(idx[kv[1]]) != kv[2]) ok = 0 }
      if (ok) { print $(idx[col]); exit }
    }' "$file"
}
num() { [[ -n "${1:-}" ]] && echo "$1" || echo n/a; }
# median of the arguments that are numbers; n/a when none is.
median() {
  printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g |
    awk '{ a[NR] = $1 } END { if (NR == 0) print "n/a"; else if (NR % 2) print a[(NR + 1) / 2];
      else printf "%.4f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
ratio() { # A/B with 2 decimals, or n/a
  if [[ -z "$1" || -z "$2" || "$1" == n/a || "$2" == n/a ]]; then echo n/a; return; fi
  awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'
}
verdict() { # RATIO ge|le TARGET
  if [[ "$1" == n/a ]]; then echo "NOT MEASURED"; return; fi
  awk -v r="$1" -v op="$2" -v t="$3" 'BEGIN {
    ok = (op == "ge") ? (r + 0 >= t + 0) : (r + 0 <= t + 0); print ok ? "PASS" : "MISS" }'
}
join() { local IFS=/; echo "$*"; }
r2() { if [[ "$1" == n/a ]]; then echo n/a; else awk -v v="$1" 'BEGIN { printf "%.2f", v }'; fi; }
r2all() { local v out=(); for v in "$@"; do out+=("$(r2 "$v")"); done; join "${out[@]}"; }

# Percent of all CPUs busy over one second, from /proc/stat.
cpu_busy() {
  local a b
  a=$(awk '/^cpu / { t = 0; for (i = 2; i <= 9; i++) t += $i; print t, $5 + $6 }' /proc/stat)
  sleep 1
  b=$(awk '/^cpu / { t = 0; for (i = 2; i <= 9; i++) t += $i; print t, $5 + $6 }' /proc/stat)
  awk -v a="$a" -v b="$b" 'BEGIN { split(a, x, " "); split(b, y, " "); dt = y[1] - x[1]
    busy = 0; if (dt > 0) busy = 100 * (dt - (y[2] - x[2])) / dt; printf "%d\n", busy }'
}
BUSY=$(cpu_busy)
if [[ "${PERF_WAIT_IDLE:-}" =~ ^[0-9]+$ ]]; then
  for ((w = 0; w < PERF_WAIT_IDLE && BUSY > 10; w++)); do BUSY=$(cpu_busy); done
fi
[ "$BUSY" -gt 10 ] && log "warning: other processes keep ${BUSY}% of the CPUs busy; figures will be disturbed"

# CPU time of everything else while we measure: the machine's user+nice+system time
# less what this script's own (waited-for) processes used, as a percent of all CPUs.
cpu_snap() {
  echo "$(awk '/^cpu / { print $2 + $3 + $4, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat)" \
    "$(awk '{ print $16 + $17 }' /proc/$$/stat)"
}
others_pct() { # SNAP_BEFORE SNAP_AFTER
  awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " ")
    dt = y[2] - x[2]; o = (y[1] - x[1]) - (y[3] - x[3]); p = 0
    if (dt > 0 && o > 0) p = 100 * o / dt
    printf "%d\n", p }'
}

START=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
SNAP_START=$(cpu_snap)
T0=$(date +%s)

# ------------------------------------------------------------ one-shot tools
tcp_stream() { # STREAMS SIZE CSV [PIN] -> runs hixl-tcp-ref, appends to CSV
  timeout 30 "$TCPREF" --mode stream --streams "$1" --size "$2" --seconds 3 --csv "$3" \
    ${4:+--pin "$4"} >>"$RES/tcp_ref.log" 2>&1 || log "hixl-tcp-ref stream $1 x $2 failed (see $RES/tcp_ref.log)"
}
tcp_rtt() { # CSV [PIN]
  timeout 60 "$TCPREF" --mode rtt --size 64 --iters 10000 --warmup 1000 --seconds 20 --csv "$1" \
    ${2:+--pin "$2"} >>"$RES/tcp_ref.log" 2>&1 || log "hixl-tcp-ref rtt failed (see $RES/tcp_ref.log)"
}
hixl_lat() { # CSV [PIN]
  timeout 60 "$BENCH" --transport tcp --latency --lat-size 64 --lat-iters 10000 --max-seconds 20 --csv "$1" \
    --no-progress ${2:+--pin "$2"} >>"$RES/hixl_latency.log" 2>&1 ||
    log "hixl-bench latency failed (see $RES/hixl_latency.log)"
}
hixl_4m() { # CSV [extra args]
  local csv=$1
  shift
  timeout 120 "$BENCH" --transport tcp --op both --block-sizes 4M --batch 1 --total 16G --max-seconds 3 \
    --csv "$csv" --no-progress ${PIN:+--pin "$PIN"} "$@" >>"$RES/hixl_4m.log" 2>&1 ||
    log "hixl-bench 4 MiB $* failed (see $RES/hixl_4m.log)"
}
# The CS-vs-engine comparison: both APIs with --transport tcp, pinned.
hixl_cmp() { # CSV API sync|async -> 4 MiB WRITE (put) and READ (get), appended to CSV
  local csv=$1 api=$2 extra=()
  [ "$3" = async ] && extra=(--async --window 4)
  timeout 120 "$BENCH" --api "$api" --transport tcp --op both --block-sizes 4M --batch 1 --total 16G \
    --max-seconds 3 --csv "$csv" --no-progress ${PIN:+--pin "$PIN"} "${extra[@]}" >>"$RES/hixl_cs.log" 2>&1 ||
    log "hixl-bench --api $api 4 MiB $3 failed (see $RES/hixl_cs.log)"
}
hixl_cmp_lat() { # CSV API -> 64 B READ (get) round trips, appended to CSV
  timeout 60 "$BENCH" --api "$2" --transport tcp --latency --lat-size 64 --lat-iters 10000 --max-seconds 20 \
    --csv "$1" --no-progress ${PIN:+--pin "$PIN"} >>"$RES/hixl_cs.log" 2>&1 ||
    log "hixl-bench --api $2 latency failed (see $RES/hixl_cs.log)"
}
# Staging over tcp: the same sync sweep with engine options (--opt) or with the
# initiator's memory unregistered. Every run is named; its CSV is round<R>_st_<name>.csv.
ST_ALL=1048576 # StagingThreshold that coalesces every block below (the option's maximum)
ST_SMALL=(--block-sizes "64,512,1K,2K,4K,16K" --batch 1024)
ST_SMALL_B="64 512 1024 2048 4096 16384" # the same blocks, in bytes
ST_BIG=(--block-sizes "64K,4M" --batch 64)
# The default StagingThreshold, from the option table (for the report only).
ST_DEF=$(awk -F'"' '/[{]"StagingThreshold"/ { print $4; exit }' "$SRC/core/src/engine/options.c" 2>/dev/null)
if [ "$ST_DEF" = auto ]; then # auto: the tcp-link value from options.h
  ST_DEF=$(awk '/#define STAGE_AUTO_TCP/ { sub(/u$/, "", $3); print $3; exit }' "$SRC/core/src/engine/options.h" 2>/dev/null)
fi
[[ "$ST_DEF" =~ ^[0-9]+$ ]] || ST_DEF=""
hixl_stage() { # NAME -> the staging run NAME of round $r, WRITE and READ
  local csv=$RES/round${r}_st_$1.csv args
  case $1 in
    default) args=("${ST_SMALL[@]}") ;;
    direct) args=("${ST_SMALL[@]}" --opt StagingThreshold=0) ;;
    coalesced) args=("${ST_SMALL[@]}" --opt "StagingThreshold=$ST_ALL") ;;
    registered) args=("${ST_BIG[@]}") ;;
    unregistered) args=("${ST_BIG[@]}" --unregistered local) ;;
  esac
  timeout 120 "$BENCH" --transport tcp --op both --total 4G --max-seconds 1 --csv "$csv" --no-progress \
    ${PIN:+--pin "$PIN"} "${args[@]}" >>"$RES/hixl_staging.log" 2>&1 ||
    log "hixl-bench staging run $1 (${args[*]}) failed (see $RES/hixl_staging.log)"
}
# st_rounds NAME OP BLOCK BATCH: GB/s of one staging figure in every round, n/a where missing.
st_rounds() {
  local k
  for ((k = 1; k <= ROUNDS; k++)); do
    num "$(csv_get "$RES/round${k}_st_$1.csv" mode=sync op="$2" block_size="$3" batch="$4" gbps)"
  done
}
# shellcheck disable=SC2046 # st_rounds prints one number or n/a per line
st_median() { median $(st_rounds "$@"); }
# shellcheck disable=SC2046
st_all() { r2all $(st_rounds "$@"); }
# verified_of FILE...: how many hixl-bench points in the CSV files were checked.
verified_of() {
  awk -F, 'FNR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $1 == "hixl-bench" { n++; if ($col["verified"] != "yes") bad++ }
    END { if (n == 0) print "nothing ran"; else if (bad) print bad " of " n " points NOT verified"
      else print "all " n " points verified" }' "$@" 2>/dev/null
}
UCX_NOTE=""
ucx_put() { # sets UCX_LAST to GB/s or n/a, and UCX_NOTE on failure
  local port mib
  UCX_LAST=n/a
  if ! command -v ucx_perftest >/dev/null 2>&1; then
    UCX_NOTE="ucx_perftest not installed (apt-get install ucx-utils)"
    return
  fi
  port=$(free_port 13337) || { UCX_NOTE="no free port"; return; }
  env "${UCX_ENV[@]}" timeout 60 "${ON_SERVER[@]}" ucx_perftest -p "$port" >>"$RES/ucx_server.log" 2>&1 &
  BG_PIDS+=($!)
  if wait_listen "$port" 10; then
    env "${UCX_ENV[@]}" timeout 60 "${ON_CLIENT[@]}" ucx_perftest 127.0.0.1 -p "$port" -t ucp_put_bw -s 4194304 -n 750 \
      >"$RES/ucx_client.tmp" 2>&1 || UCX_NOTE="ucx_perftest client failed: $(tail -1 "$RES/ucx_client.tmp")"
    cat "$RES/ucx_client.tmp" >>"$RES/ucx_client.log"
    # ucx_perftest's MB/s are MiB/s; the Final row's overall bandwidth is column 7.
    mib=$(awk '$1 == "Final:" { print $7 }' "$RES/ucx_client.tmp")
    if [ -n "$mib" ]; then
      UCX_LAST=$(awk -v m="$mib" 'BEGIN { printf "%.4f", m * 1048576 / 1e9 }')
    else
      UCX_NOTE=${UCX_NOTE:-"no Final: row in ucx_perftest output"}
    fi
  else
    UCX_NOTE="ucx_perftest server did not listen within 10 s: $(tail -1 "$RES/ucx_server.log")"
  fi
  # It exits after its one test; a failed client leaves it waiting: stop it.
  kill "${BG_PIDS[-1]}" 2>/dev/null
  wait "${BG_PIDS[-1]}" 2>/dev/null
}

# ---------------------------------------------- rounds: the targeted figures
V_TCP4M=() V_UCX=() V_HW=() V_HR=() V_TRTT=() V_HRTT=() V_TRTT99=() V_HRTT99=()
V_OTHERS=()
# CS vs engine: C_<api>_<figure>, figures SW SR (sync) AW AR (async window 4) L L99 (64 B).
C_cs_SW=() C_cs_SR=() C_cs_AW=() C_cs_AR=() C_cs_L=() C_cs_L99=()
C_engine_SW=() C_engine_SR=() C_engine_AW=() C_engine_AR=() C_engine_L=() C_engine_L99=()
c4m() { num "$(csv_get "$RES/round${r}_cs.csv" api="$1" mode="$2" op="$3" block_size=4194304 gbps)"; } # API MODE OP
clat() { num "$(csv_get "$RES/round${r}_cs_lat.csv" api="$1" mode=latency "$2")"; }                     # API COLUMN
for ((r = 1; r <= ROUNDS; r++)); do
  log "round $r/$ROUNDS: TCP stream 4 MiB, UCX put 4 MiB, hixl WRITE/READ 4 MiB, 64 B round trips"
  snap=$(cpu_snap)
  csv=$RES/round$r.csv
  tcp_stream 1 4M "$RES/round${r}_tcp.csv" "$PIN"
  V_TCP4M+=("$(num "$(csv_get "$RES/round${r}_tcp.csv" mode=stream streams=1 size=4194304 gbps)")")
  ucx_put
  V_UCX+=("$UCX_LAST")
  hixl_4m "$csv"
  V_HW+=("$(num "$(csv_get "$csv" mode=sync op=WRITE block_size=4194304 gbps)")")
  V_HR+=("$(num "$(csv_get "$csv" mode=sync op=READ block_size=4194304 gbps)")")
  tcp_rtt "$RES/round${r}_rtt.csv" "$PIN"
  hixl_lat "$RES/round${r}_lat.csv" "$PIN"
  V_TRTT+=("$(num "$(csv_get "$RES/round${r}_rtt.csv" mode=rtt avg_us)")")
  V_TRTT99+=("$(num "$(csv_get "$RES/round${r}_rtt.csv" mode=rtt p99_us)")")
  V_HRTT+=("$(num "$(csv_get "$RES/round${r}_lat.csv" mode=latency avg_us)")")
  V_HRTT99+=("$(num "$(csv_get "$RES/round${r}_lat.csv" mode=latency p99_us)")")
  log "round $r/$ROUNDS: CS API vs engine over tcp: 4 MiB sync and async window 4, 64 B round trips"
  ccsv=$RES/round${r}_cs.csv
  if ((r % 2)); then apis=(engine cs); else apis=(cs engine); fi
  for api in "${apis[@]}"; do hixl_cmp "$ccsv" "$api" sync; done
  for api in "${apis[@]}"; do hixl_cmp "$ccsv" "$api" async; done
  for api in "${apis[@]}"; do hixl_cmp_lat "$RES/round${r}_cs_lat.csv" "$api"; done
  C_cs_SW+=("$(c4m cs sync WRITE)") C_engine_SW+=("$(c4m engine sync WRITE)")
  C_cs_SR+=("$(c4m cs sync READ)") C_engine_SR+=("$(c4m engine sync READ)")
  C_cs_AW+=("$(c4m cs async WRITE)") C_engine_AW+=("$(c4m engine async WRITE)")
  C_cs_AR+=("$(c4m cs async READ)") C_engine_AR+=("$(c4m engine async READ)")
  C_cs_L+=("$(clat cs avg_us)") C_engine_L+=("$(clat engine avg_us)")
  C_cs_L99+=("$(clat cs p99_us)") C_engine_L99+=("$(clat engine p99_us)")
  log "round $r/$ROUNDS: staging over tcp: 64 B..16 KiB x 1024 coalesced or direct, unregistered memory"
  if ((r % 2)); then runs=(default direct coalesced registered unregistered); else
    runs=(unregistered registered coalesced direct default); fi
  for run in "${runs[@]}"; do hixl_stage "$run"; done
  V_OTHERS+=("$(others_pct "$snap" "$(cpu_snap)")")
  log "round $r: other processes used ${V_OTHERS[-1]}% of the CPUs"
done
[ -n "$UCX_NOTE" ] && log "UCX: $UCX_NOTE"
TCP_4M=$(median "${V_TCP4M[@]}")
UCX_BW=$(median "${V_UCX[@]}")
H_W4M=$(median "${V_HW[@]}")
H_R4M=$(median "${V_HR[@]}")
TCP_RTT=$(median "${V_TRTT[@]}")
H_RTT=$(median "${V_HRTT[@]}")
TCP_RTT99=$(median "${V_TRTT99[@]}")
H_RTT99=$(median "${V_HRTT99[@]}")
H_VERIFIED=$(verified_of "$RES"/round[0-9].csv "$RES"/round[0-9]_lat.csv)
CS_VERIFIED=$(verified_of "$RES"/round[0-9]_cs.csv "$RES"/round[0-9]_cs_lat.csv)
M_cs_SW=$(median "${C_cs_SW[@]}") M_engine_SW=$(median "${C_engine_SW[@]}")
M_cs_SR=$(median "${C_cs_SR[@]}") M_engine_SR=$(median "${C_engine_SR[@]}")
M_cs_AW=$(median "${C_cs_AW[@]}") M_engine_AW=$(median "${C_engine_AW[@]}")
M_cs_AR=$(median "${C_cs_AR[@]}") M_engine_AR=$(median "${C_engine_AR[@]}")
M_cs_L=$(median "${C_cs_L[@]}") M_engine_L=$(median "${C_engine_L[@]}")
M_cs_L99=$(median "${C_cs_L99[@]}") M_engine_L99=$(median "${C_engine_L99[@]}")
R_CS_SW=$(ratio "$M_cs_SW" "$M_engine_SW")
R_CS_SR=$(ratio "$M_cs_SR" "$M_engine_SR")
R_CS_AW=$(ratio "$M_cs_AW" "$M_engine_AW")
R_CS_AR=$(ratio "$M_cs_AR" "$M_engine_AR")
R_CS_L=$(ratio "$M_cs_L" "$M_engine_L")
R_CS_L99=$(ratio "$M_cs_L99" "$M_engine_L99")
ST_W16K=$(st_median default WRITE 16384 1024)
ST_R16K=$(st_median default READ 16384 1024)
R_ST_W=$(ratio "$ST_W16K" "$H_W4M")
R_ST_R=$(ratio "$ST_R16K" "$H_R4M")
ST_VERIFIED=$(verified_of "$RES"/round[0-9]_st_*.csv)

# ------------------------------------------------------- once: for context
log "TCP streams 1 MiB, 4 KiB, 2 x 4 MiB, 2 x 4 KiB"
ONCE=$RES/tcp_once.csv
tcp_stream 1 1M "$ONCE" "$PIN"
tcp_stream 1 4K "$ONCE" "$PIN"
# Two streams are not pinned: pinned, both senders would share CPU 0.
tcp_stream 2 4M "$ONCE" ""
tcp_stream 2 4K "$ONCE" ""
TCP_1M=$(num "$(csv_get "$ONCE" mode=stream streams=1 size=1048576 gbps)")
TCP_4K=$(num "$(csv_get "$ONCE" mode=stream streams=1 size=4096 gbps)")
TCP_2x4M=$(num "$(csv_get "$ONCE" mode=stream streams=2 size=4194304 gbps)")
TCP_2x4K=$(num "$(csv_get "$ONCE" mode=stream streams=2 size=4096 gbps)")

log "64 B round trips unpinned and with both processes on CPU 0"
tcp_rtt "$RES/rtt_free.csv" ""
hixl_lat "$RES/lat_free.csv" ""
tcp_rtt "$RES/rtt_same.csv" "0,0"
hixl_lat "$RES/lat_same.csv" "0,0"
rtt_of() { echo "$(r2 "$(num "$(csv_get "$1" mode="$2" avg_us)")") / $(r2 "$(num "$(csv_get "$1" mode="$2" p99_us)")")"; }
TCP_RTT_FREE=$(rtt_of "$RES/rtt_free.csv" rtt)
H_RTT_FREE=$(rtt_of "$RES/lat_free.csv" latency)
TCP_RTT_SAME=$(rtt_of "$RES/rtt_same.csv" rtt)
H_RTT_SAME=$(rtt_of "$RES/lat_same.csv" latency)

# iperf3: summary "receiver" line -> GB/s (10^9 bytes/s).
iperf_gbps() {
  awk '/receiver/ { for (i = 2; i <= NF; i++) if ($i ~ /bits\/sec$/) {
         v = $(i - 1); u = $i
         m = (u ~ /^G/) ? 1e9 : (u ~ /^M/) ? 1e6 : (u ~ /^K/) ? 1e3 : 1
         r = sprintf("%.3f", v * m / 8 / 1e9) } }
       END { if (r != "") print r }' "$1"
}
IPERF_1=n/a IPERF_2=n/a IPERF_NOTE=""
IPERF_VER=$(iperf3 --version 2>/dev/null | head -1)
if command -v iperf3 >/dev/null 2>&1; then
  for streams in 1 2; do
    log "iperf3 -P $streams on 127.0.0.1"
    port=$(free_port 15201) || { IPERF_NOTE="no free port"; break; }
    timeout 30 "${ON_SERVER[@]}" iperf3 -s -B 127.0.0.1 -p "$port" -1 >"$RES/iperf3_server_$streams.log" 2>&1 &
    BG_PIDS+=($!)
    if wait_listen "$port" 10; then
      timeout 30 "${ON_CLIENT[@]}" iperf3 -c 127.0.0.1 -p "$port" -t 3 -P "$streams" -f g >"$RES/iperf3_$streams.log" 2>&1 ||
        log "iperf3 client failed (see $RES/iperf3_$streams.log)"
      v=$(num "$(iperf_gbps "$RES/iperf3_$streams.log")")
      if [ "$streams" = 1 ]; then IPERF_1=$v; else IPERF_2=$v; fi
    else
      IPERF_NOTE="iperf3 server did not listen within 10 s"
    fi
    kill "${BG_PIDS[-1]}" 2>/dev/null
    wait "${BG_PIDS[-1]}" 2>/dev/null
  done
else
  IPERF_NOTE="iperf3 not installed (apt-get install iperf3)"
fi

log "hixl-bench 4 MiB with TransferAsync, window 4"
hixl_4m "$RES/hixl_async.csv" --async --window 4
HA_W4M=$(num "$(csv_get "$RES/hixl_async.csv" mode=async op=WRITE gbps)")
HA_R4M=$(num "$(csv_get "$RES/hixl_async.csv" mode=async op=READ gbps)")

log "hixl-bench sweep"
SWEEP_CSV=$RES/hixl_sweep.csv
timeout 300 "$BENCH" --transport tcp --op both --block-sizes 4K,64K,1M,4M,16M --batch 1,8 --total 512M --max-seconds 2 \
  --csv "$SWEEP_CSV" ${PIN:+--pin "$PIN"} >"$RES/hixl_sweep.log" 2>"$RES/hixl_sweep.err" ||
  log "hixl-bench sweep failed (see $RES/hixl_sweep.*)"
cat "$RES/hixl_sweep.log" >&2

# ----------------------------------- once: the same-host transport (shm), issue 4
# hixl-shm-ref takes 3 rounds of every figure itself (about 35 s a run) and appends
# their medians to one CSV, a row per figure; pages=4k or thp tells the runs apart.
# --kernel-refs adds the kernel's call at 1 MiB and its own scattered batch, so that
# every target has the kernel's ceiling beside it.
SHMREF=$BUILD/integration/bench/hixl-shm-ref
SHM_CSV=$RES/shm.csv
SHM_NOTE="" SHM_OTHERS=n/a
SHM_CPUS=(--cpu-initiator -1 --cpu-target -1)
[ -n "$PIN" ] && SHM_CPUS=(--cpu-initiator 0 --cpu-target 1)
THP_MODE=$(sed -n 's/.*\[\(.*\)\].*/\1/p' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)
if [ -x "$SHMREF" ]; then
  snap=$(cpu_snap)
  for pages in 4k thp; do
    log "hixl-shm-ref ($pages pages): Transport shm vs memcpy and process_vm_readv, 3 rounds"
    shm_args=("${SHM_CPUS[@]}" --kernel-refs --csv "$SHM_CSV")
    [ "$pages" = thp ] && shm_args+=(--thp)
    if timeout 120 "$SHMREF" "${shm_args[@]}" >"$RES/shm_ref_$pages.log" 2>&1; then
      cat "$RES/shm_ref_$pages.log" >&2
    else
      log "hixl-shm-ref ${shm_args[*]} failed (see $RES/shm_ref_$pages.log)"
      SHM_NOTE+="${SHM_NOTE:+; }the $pages run failed: $(tail -1 "$RES/shm_ref_$pages.log")"
    fi
  done
  SHM_OTHERS=$(others_pct "$snap" "$(cpu_snap)")
else
  SHM_NOTE="$SHMREF is missing (cmake --build $BUILD)"
fi

R_W_TCP=$(ratio "$H_W4M" "$TCP_4M")
R_R_TCP=$(ratio "$H_R4M" "$TCP_4M")
R_W_UCX=$(ratio "$H_W4M" "$UCX_BW")
R_R_UCX=$(ratio "$H_R4M" "$UCX_BW")
R_RTT=$(ratio "$H_RTT" "$TCP_RTT")
R_RTT99=$(ratio "$H_RTT99" "$TCP_RTT99")
ELAPSED=$(($(date +%s) - T0))
OTHERS=$(others_pct "$SNAP_START" "$(cpu_snap)")

# ------------------------------------------------------------------- report
KERNEL=$(uname -r)
CPU=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
MEM=$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
# shellcheck disable=SC1091
OS=$(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown}")
COMMIT=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo "uncommitted")
git -C "$SRC" diff --quiet HEAD -- core 2>/dev/null || COMMIT="$COMMIT (plus uncommitted changes in core/)"
HIXL_VER=$(awk '/^# hixl-bench/ { sub(/\):.*/, ""); sub(/.*hixl /, ""); print; exit }' "$RES/hixl_4m.log")
UCX_VER=$(ucx_info -v 2>/dev/null | head -1 | sed 's/^# *//')
PIN_TEXT=${PIN:+"one process per CPU: initiator / client / sender on CPU 0, target / server / receiver on CPU 1 (like two hosts)"}
PIN_TEXT=${PIN_TEXT:-"not pinned (one CPU only)"}

sweep_table() {
  [ -s "$SWEEP_CSV" ] || { echo "(the sweep did not run; see perf-results/hixl_sweep.err)"; return; }
  echo "| op | block | batch | iters | GB/s | avg us | p50 us | p99 us | verified |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
  awk -F, 'NR > 1 { printf "| %s | %s | %s | %s | %.2f | %.1f | %.1f | %.1f | %s |\n",
    $3, $4, $5, $7, $10, $11, $12, $13, $16 }' "$SWEEP_CSV"
}

gbps() { if [[ "$1" == n/a ]]; then echo n/a; else echo "$(r2 "$1") GB/s"; fi; }
rx() { local v; v=$(ratio "$1" "$2"); if [[ "$v" == n/a ]]; then echo n/a; else echo "${v}x"; fi; } # A B -> "A/Bx"
ST_DEF_TEXT=${ST_DEF:-"the default"}
# The coalescing table: every small block at batch 1024, direct, default, all coalesced.
coalesce_table() {
  local b op d def all how
  echo "| block x 1024 | op | direct (0) | default (${ST_DEF_TEXT}) | default / direct | coalesced (${ST_ALL}) | coalesced / direct |"
  echo "|---:|---|---:|---:|---:|---:|---:|"
  for b in $ST_SMALL_B; do
    for op in WRITE READ; do
      d=$(st_median direct "$op" "$b" 1024)
      def=$(st_median default "$op" "$b" 1024)
      all=$(st_median coalesced "$op" "$b" 1024)
      how=""
      [ -n "$ST_DEF" ] && how=$( ((b < ST_DEF)) && echo " (coalesced)" || echo " (direct)")
      echo "| $b B | $op | $(gbps "$d") | $(gbps "$def")$how | $(rx "$def" "$d") | $(gbps "$all") | $(rx "$all" "$d") |"
    done
  done
}
unreg_table() {
  local b op reg un
  echo "| block x 64 | op | registered | unregistered local (staged) | unregistered / registered |"
  echo "|---:|---|---:|---:|---:|"
  for b in 65536 4194304; do
    for op in WRITE READ; do
      reg=$(st_median registered "$op" "$b" 64)
      un=$(st_median unregistered "$op" "$b" 64)
      echo "| $((b / 1024)) KiB | $op | $(gbps "$reg") | $(gbps "$un") | $(rx "$un" "$reg") |"
    done
  done
}
# Per-round GB/s of every staging figure.
stage_rounds_table() {
  local b op
  echo "| figure | op | direct (0) | default | coalesced (${ST_ALL}) |"
  echo "|---|---|---|---|---|"
  for b in $ST_SMALL_B; do
    for op in WRITE READ; do
      echo "| $b B x 1024 | $op | $(st_all direct "$op" "$b" 1024) | $(st_all default "$op" "$b" 1024) | $(st_all coalesced "$op" "$b" 1024) |"
    done
  done
  echo
  echo "| figure | op | registered | unregistered local |"
  echo "|---|---|---|---|"
  for b in 65536 4194304; do
    for op in WRITE READ; do
      echo "| $((b / 1024)) KiB x 64 | $op | $(st_all registered "$op" "$b" 64) | $(st_all unregistered "$op" "$b" 64) |"
    done
  done
}

# ----- the shm section. A figure is KIND:OP:BLOCK:BATCH:LAYOUT, as in hixl-shm-ref's CSV.
SHM_MC256=memcpy:copy:262144:1:adjacent SHM_MC1M=memcpy:copy:1048576:1:adjacent
SHM_MC4M=memcpy:copy:4194304:1:adjacent SHM_RV4K=process_vm_readv:READ:4096:1:adjacent
SHM_RV256=process_vm_readv:READ:262144:1:adjacent SHM_RV1M=process_vm_readv:READ:1048576:1:adjacent
SHM_RV4M=process_vm_readv:READ:4194304:1:adjacent
SHM_RVS=process_vm_readv:READ:4096:1024:scattered # one call for 1024 scattered 4 KiB blocks
# The issue's targets, LABEL|GOAL|FIGURE|REFERENCE|KERNEL: FIGURE / REFERENCE >= GOAL.
# KERNEL / REFERENCE is the kernel's ceiling: the same ratio with the hixl figure
# replaced by bare process_vm_readv calls of the same blocks. For adjacent 4 KiB
# batches that is one call per 256 KiB (the best a batch of 4 KiB ops could reach);
# for scattered ones, the kernel's own scattered batch.
SHM_TARGETS=(
  "shm WRITE 256 KiB, 1 op per call / memcpy 256 KiB|0.8|shm:WRITE:262144:1:adjacent|$SHM_MC256|$SHM_RV256"
  "shm READ 256 KiB, 1 op per call / memcpy 256 KiB|0.8|shm:READ:262144:1:adjacent|$SHM_MC256|$SHM_RV256"
  "shm WRITE 1 MiB, 1 op per call / memcpy 1 MiB|0.8|shm:WRITE:1048576:1:adjacent|$SHM_MC1M|$SHM_RV1M"
  "shm READ 1 MiB, 1 op per call / memcpy 1 MiB|0.8|shm:READ:1048576:1:adjacent|$SHM_MC1M|$SHM_RV1M"
  "shm WRITE 4 MiB, 1 op per call / memcpy 4 MiB|0.8|shm:WRITE:4194304:1:adjacent|$SHM_MC4M|$SHM_RV4M"
  "shm READ 4 MiB, 1 op per call / memcpy 4 MiB|0.8|shm:READ:4194304:1:adjacent|$SHM_MC4M|$SHM_RV4M"
  "shm WRITE 16 x 256 KiB per call / memcpy 256 KiB|0.8|shm:WRITE:262144:16:adjacent|$SHM_MC256|$SHM_RV256"
  "shm READ 16 x 256 KiB per call / memcpy 256 KiB|0.8|shm:READ:262144:16:adjacent|$SHM_MC256|$SHM_RV256"
  "shm WRITE 1024 x 4 KiB per call, adjacent / one process_vm_readv per 4 KiB|2|shm:WRITE:4096:1024:adjacent|$SHM_RV4K|$SHM_RV256"
  "shm READ 1024 x 4 KiB per call, adjacent / one process_vm_readv per 4 KiB|2|shm:READ:4096:1024:adjacent|$SHM_RV4K|$SHM_RV256"
  "shm WRITE 1024 x 4 KiB per call, scattered / one process_vm_readv per 4 KiB|2|shm:WRITE:4096:1024:scattered|$SHM_RV4K|$SHM_RVS"
  "shm READ 1024 x 4 KiB per call, scattered / one process_vm_readv per 4 KiB|2|shm:READ:4096:1024:scattered|$SHM_RV4K|$SHM_RVS"
)
# Issue 15: memory the target allocated (HixlEngineAllocMem), mapped into the
# initiator and copied with memcpy. LABEL|GOAL|FIGURE|REFERENCE.
SHM_MC4K=memcpy:copy:4096:1:adjacent SHM_MC16M=memcpy:copy:16777216:1:adjacent
SHM_MAP_TARGETS=(
  "mapped WRITE 256 KiB, 1 op per call / memcpy 256 KiB|0.9|shm-mapped:WRITE:262144:1:adjacent|$SHM_MC256"
  "mapped READ 256 KiB, 1 op per call / memcpy 256 KiB|0.9|shm-mapped:READ:262144:1:adjacent|$SHM_MC256"
  "mapped WRITE 1 MiB, 1 op per call / memcpy 1 MiB|0.9|shm-mapped:WRITE:1048576:1:adjacent|$SHM_MC1M"
  "mapped READ 1 MiB, 1 op per call / memcpy 1 MiB|0.9|shm-mapped:READ:1048576:1:adjacent|$SHM_MC1M"
  "mapped WRITE 4 MiB, 1 op per call / memcpy 4 MiB|0.9|shm-mapped:WRITE:4194304:1:adjacent|$SHM_MC4M"
  "mapped READ 4 MiB, 1 op per call / memcpy 4 MiB|0.9|shm-mapped:READ:4194304:1:adjacent|$SHM_MC4M"
  "mapped WRITE 16 MiB, 1 op per call / memcpy 16 MiB|0.9|shm-mapped:WRITE:16777216:1:adjacent|$SHM_MC16M"
  "mapped READ 16 MiB, 1 op per call / memcpy 16 MiB|0.9|shm-mapped:READ:16777216:1:adjacent|$SHM_MC16M"
  "mapped WRITE 1024 x 4 KiB per call, scattered / one process_vm_readv per 4 KiB|3|shm-mapped:WRITE:4096:1024:scattered|$SHM_RV4K"
  "mapped READ 1024 x 4 KiB per call, scattered / one process_vm_readv per 4 KiB|3|shm-mapped:READ:4096:1024:scattered|$SHM_RV4K"
)
xr() { if [[ "$1" == n/a ]]; then echo n/a; else echo "${1}x"; fi; } # RATIO -> "RATIOx"
shm_fig() { # PAGES FIGURE -> its median GB/s, or n/a
  local k op b n l
  IFS=: read -r k op b n l <<<"$2"
  num "$(csv_get "$SHM_CSV" pages="$1" kind="$k" op="$op" block_size="$b" batch="$n" layout="$l" gbps)"
}
shm_ratio() { ratio "$(shm_fig "$1" "$2")" "$(shm_fig "$1" "$3")"; } # PAGES FIGURE REFERENCE
# shm_result RATIO CEILING GOAL: PASS, or whose the MISS is: the kernel's when its own
# call misses the goal too, else hixl's.
shm_result() {
  local v
  v=$(verdict "$1" ge "$3")
  if [ "$v" = MISS ]; then
    case $(verdict "$2" ge "$3") in
      MISS) v="MISS, the kernel's too" ;;
      PASS) v="MISS, hixl's" ;;
    esac
  fi
  echo "$v"
}
shm_target_table() {
  local t label goal f ref k p v c line
  echo "| target (ratio of medians) | goal | 4 KiB pages | kernel's ceiling | result | huge pages | kernel's ceiling | result |"
  echo "|---|---:|---:|---:|---|---:|---:|---|"
  for t in "${SHM_TARGETS[@]}"; do
    IFS='|' read -r label goal f ref k <<<"$t"
    line="| $label | >= ${goal}x |"
    for p in 4k thp; do
      v=$(shm_ratio "$p" "$f" "$ref") c=$(shm_ratio "$p" "$k" "$ref")
      line+=" $(xr "$v") | $(xr "$c") | $(shm_result "$v" "$c" "$goal") |"
    done
    echo "$line"
  done
}
shm_map_table() {
  local t label goal f ref p v line
  echo "| target (ratio of medians) | goal | 4 KiB pages | result | huge pages | result |"
  echo "|---|---:|---:|---|---:|---|"
  for t in "${SHM_MAP_TARGETS[@]}"; do
    IFS='|' read -r label goal f ref <<<"$t"
    line="| $label | >= ${goal}x |"
    for p in 4k thp; do
      v=$(shm_ratio "$p" "$f" "$ref")
      line+=" $(xr "$v") | $(verdict "$v" ge "$goal") |"
    done
    echo "$line"
  done
}
shm_minmax() { # min|max NUMBER...: n/a when none is a number
  printf '%s\n' "${@:2}" | grep -E '^[0-9.]+$' | sort -g |
    awk -v w="$1" '{ a[NR] = $1 } END { if (NR == 0) print "n/a"; else print (w == "min") ? a[1] : a[NR] }'
}
# shm_summary PAGES NAME: one bullet: how many targets pass, whose the misses are, and
# how close hixl comes to the bare kernel call (hixl figure / kernel figure, each target).
shm_summary() {
  local p=$1 t label goal f ref k pass=0 kern=0 ours=0 eff=()
  for t in "${SHM_TARGETS[@]}"; do
    IFS='|' read -r label goal f ref k <<<"$t"
    case $(shm_result "$(shm_ratio "$p" "$f" "$ref")" "$(shm_ratio "$p" "$k" "$ref")" "$goal") in
      PASS) pass=$((pass + 1)) ;;
      "MISS, the kernel's too") kern=$((kern + 1)) ;;
      "MISS, hixl's") ours=$((ours + 1)) ;;
    esac
    eff+=("$(shm_ratio "$p" "$f" "$k")")
  done
  if ((pass + kern + ours == 0)); then
    echo "- $2: not measured."
    return
  fi
  printf -- '- %s: %s of %s targets PASS; %s MISS where the bare kernel call misses the goal too (the kernel'"'"'s limit), %s where it does not (hixl'"'"'s). Across the %s targets hixl moves %s to %s of the bare kernel call'"'"'s rate.\n' \
    "$2" "$pass" "${#SHM_TARGETS[@]}" "$kern" "$ours" "${#SHM_TARGETS[@]}" \
    "$(xr "$(shm_minmax min "${eff[@]}")")" "$(xr "$(shm_minmax max "${eff[@]}")")" |
    fold -s -w 88 | sed 's/ *$//; 1!s/^/  /'
}
# The extra time of one 4 KiB READ op per sync call over one bare process_vm_readv, in us.
shm_op_cost() {
  local s k
  s=$(shm_fig "$1" shm:READ:4096:1:adjacent) k=$(shm_fig "$1" "$SHM_RV4K")
  if [[ "$s" == n/a || "$k" == n/a ]]; then echo n/a; return; fi
  awk -v s="$s" -v k="$k" 'BEGIN { if (s + 0 > 0 && k + 0 > 0) printf "%.1f us\n", 4.096 / s - 4.096 / k; else print "n/a" }'
}
shm_figure_table() {
  [ -s "$SHM_CSV" ] || { echo "(hixl-shm-ref did not run: ${SHM_NOTE:-see perf-results/shm_ref_*.log})"; return; }
  echo "| figure (GB/s) | 4 KiB pages | rounds | huge pages | rounds |"
  echo "|---|---:|---|---:|---|"
  awk -F, '
    function sz(b) { return b >= 1048576 ? b / 1048576 " MiB" : b / 1024 " KiB" }
    function r2s(s, a, n, i, o) { n = split(s, a, "/"); for (i = 1; i <= n; i++) o = o (i > 1 ? "/" : "") sprintf("%.2f", a[i]); return o }
    function cell(p, x) { return ((p, x) in med) ? med[p, x] " | " rnd[p, x] : "n/a | n/a" }
    NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    {
      k = $c["kind"]; b = $c["block_size"] + 0; n = $c["batch"] + 0
      if (k == "memcpy") x = "memcpy " sz(b)
      else if (k == "process_vm_readv" && n > 1) x = "process_vm_readv " n " x " sz(b) " in one call, " $c["layout"]
      else if (k == "process_vm_readv") x = "process_vm_readv " sz(b) ", one call per block"
      else if (n == 1) x = (k == "shm-mapped" ? "shm mapped " : "shm ") $c["op"] " " sz(b) ", 1 op per call"
      else x = (k == "shm-mapped" ? "shm mapped " : "shm ") $c["op"] " " n " x " sz(b) " per call" (b == 4096 ? ", " $c["layout"] : "")
      g = (k == "memcpy") ? 1 : (k == "process_vm_readv") ? 2 : (k == "shm") ? 3 : 4 # rows grouped by kind, in CSV order
      if (!(x in seen)) { # kernel calls by batch, then block; the others in CSV order
        seen[x] = 1; j = ++m[g]; key[x] = (g == 2) ? n * 1e10 + b : j
        for (; j > 1 && key[order[g, j - 1]] > key[x]; j--) order[g, j] = order[g, j - 1]
        order[g, j] = x
      }
      med[$c["pages"], x] = sprintf("%.2f", $c["gbps"]); rnd[$c["pages"], x] = r2s($c["round_gbps"])
    }
    END { for (g = 1; g <= 4; g++) for (i = 1; i <= m[g]; i++)
      printf "| %s | %s | %s |\n", order[g, i], cell("4k", order[g, i]), cell("thp", order[g, i]) }' "$SHM_CSV"
}
SHM_SPAN=$(num "$(csv_get "$SHM_CSV" tool=hixl-shm-ref span_mib)")
SHM_ROUNDS=$(num "$(csv_get "$SHM_CSV" tool=hixl-shm-ref rounds)")
SHM_PIN_TEXT=${PIN:+"the initiator on CPU 0, the target process on CPU 1"}
SHM_PIN_TEXT=${SHM_PIN_TEXT:-"not pinned (one CPU only)"}
SHM_RAN=""
for p in 4k thp; do
  [ "$(shm_fig "$p" "$SHM_MC256")" != n/a ] && SHM_RAN+="${SHM_RAN:+ and }$([ $p = 4k ] && echo "4 KiB pages" || echo "huge pages")"
done
SHM_CHECK=${SHM_RAN:+"passed with $SHM_RAN"}
SHM_CHECK=${SHM_CHECK:-"no run finished"}
case ${THP_MODE:-unknown} in
  never) THP_TEXT="transparent huge pages are off on this kernel (\`never\`), so the huge-page column is 4 KiB pages too" ;;
  *) THP_TEXT="this kernel's transparent_hugepage setting: \`${THP_MODE:-unknown}\`" ;;
esac

mkdir -p "$(dirname "$OUT")"
# The page leads with the peers' table (docs/performance-peers.md, from run_peers.sh),
# copied from its "## " heading on, when that page exists.
PEERS_MD=$SRC/docs/performance-peers.md
{
  echo "# hixl performance on one host: TCP on loopback, and shm"
  echo
  if [ -f "$PEERS_MD" ]; then
    sed -n '/^## /,$p' "$PEERS_MD"
    echo
    echo "Everything below this section comes from \`integration/bench/run_perf.sh\`'s run."
    echo
  fi
} >"$OUT"
cat >>"$OUT" <<EOF
Generated by \`integration/bench/run_perf.sh\` in one run of ${ELAPSED} s; every
figure below comes from that run, on 127.0.0.1 only. GB/s means 10^9 bytes per
second of payload; latencies are microseconds.

- Date: ${START}
- Machine: ${NPROC} CPUs (${CPU}), ${MEM}, kernel ${KERNEL}, ${OS}
- Other load: ${BUSY}% of the CPUs busy just before the run; during it, other
  processes used ${OTHERS}% of the CPUs (rounds: $(join "${V_OTHERS[@]}") %). Above a
  few percent the figures are disturbed.
- hixl ${HIXL_VER:-?} at commit ${COMMIT}; ${IPERF_VER:-iperf3 not found}; UCX ${UCX_VER:-not found}

## Targets (issue 2)

Each figure is the median of ${ROUNDS} rounds, hixl and its reference interleaved in
every round (per-round values below). Every two-process measurement in this file is
pinned ${PIN_TEXT}, unless marked otherwise.

| target | hixl | reference | ratio | goal | result |
|---|---:|---:|---:|---:|---|
| WRITE 4 MiB vs plain TCP stream (1 connection, 4 MiB writes) | $(r2 "$H_W4M") GB/s | $(r2 "$TCP_4M") GB/s | ${R_W_TCP}x | >= 0.8x | $(verdict "$R_W_TCP" ge 0.8) |
| READ 4 MiB vs plain TCP stream (1 connection, 4 MiB writes) | $(r2 "$H_R4M") GB/s | $(r2 "$TCP_4M") GB/s | ${R_R_TCP}x | >= 0.8x | $(verdict "$R_R_TCP" ge 0.8) |
| WRITE 4 MiB vs UCX ucp_put_bw over tcp (4 MiB) | $(r2 "$H_W4M") GB/s | $(r2 "$UCX_BW") GB/s | ${R_W_UCX}x | >= 3x | $(verdict "$R_W_UCX" ge 3) |
| READ 4 MiB vs UCX ucp_put_bw over tcp (4 MiB) | $(r2 "$H_R4M") GB/s | $(r2 "$UCX_BW") GB/s | ${R_R_UCX}x | >= 3x | $(verdict "$R_R_UCX" ge 3) |
| 64 B READ round trip vs blocking TCP 64 B round trip (avg, one CPU per process) | $(r2 "$H_RTT") us | $(r2 "$TCP_RTT") us | ${R_RTT}x | <= 1.3x | $(verdict "$R_RTT" le 1.3) |

- hixl 4 MiB: HixlEngineTransferSync of one 4 MiB op per call, for 3 s after
  warm-up; data checked byte for byte on each point's first iteration (${H_VERIFIED}).
- Plain TCP: one connection, blocking send() of 4 MiB from one buffer, recv() into a
  4 MiB buffer, TCP_NODELAY, for 3 s; the time includes draining the socket.
- UCX: \`${UCX_ENV[*]} ucx_perftest -t ucp_put_bw -s 4194304 -n 750\`.
- Round trips: 10000 after 1000 warm-up. The 64 B READ p99 is $(r2 "$H_RTT99") us against $(r2 "$TCP_RTT99") us for TCP (${R_RTT99}x).
EOF
if [ -n "$UCX_NOTE" ]; then
  printf -- '- UCX note: %s. UCX ratios are reported as not measured rather than guessed.\n' "$UCX_NOTE" >>"$OUT"
fi
[ -n "$IPERF_NOTE" ] && printf -- '- iperf3 note: %s.\n' "$IPERF_NOTE" >>"$OUT"
cat >>"$OUT" <<EOF

## CS API vs engine (issue 5)

hixl-bench \`--api cs\` drives the same measurement through HIXL's client/server API
(a HixlCSServer holding the target buffer under the tag "bench", a HixlCSClient that
finds it with HixlCSClientGetRemoteMem), \`--api engine\` through HixlEngine*, both with
\`--transport tcp\`. Each figure is the median of ${ROUNDS} rounds; in every round the two
APIs run back to back, their order alternating between rounds, pinned as above.

| target | CS API | engine | ratio | goal | result |
|---|---:|---:|---:|---:|---|
| WRITE 4 MiB: BatchPutSync vs TransferSync, 1 op per call | $(r2 "$M_cs_SW") GB/s | $(r2 "$M_engine_SW") GB/s | ${R_CS_SW}x | >= 0.95x | $(verdict "$R_CS_SW" ge 0.95) |
| READ 4 MiB: BatchGetSync vs TransferSync, 1 op per call | $(r2 "$M_cs_SR") GB/s | $(r2 "$M_engine_SR") GB/s | ${R_CS_SR}x | >= 0.95x | $(verdict "$R_CS_SR" ge 0.95) |
| WRITE 4 MiB: BatchPutAsync vs TransferAsync, 4 batches in flight | $(r2 "$M_cs_AW") GB/s | $(r2 "$M_engine_AW") GB/s | ${R_CS_AW}x | >= 0.95x | $(verdict "$R_CS_AW" ge 0.95) |
| READ 4 MiB: BatchGetAsync vs TransferAsync, 4 batches in flight | $(r2 "$M_cs_AR") GB/s | $(r2 "$M_engine_AR") GB/s | ${R_CS_AR}x | >= 0.95x | $(verdict "$R_CS_AR" ge 0.95) |

For information (no goal), the 64 B READ round trip, one op per call:

| measurement | CS API | engine | ratio |
|---|---:|---:|---:|
| 64 B BatchGetSync vs TransferSync(READ), avg | $(r2 "$M_cs_L") us | $(r2 "$M_engine_L") us | ${R_CS_L}x |
| 64 B BatchGetSync vs TransferSync(READ), p99 | $(r2 "$M_cs_L99") us | $(r2 "$M_engine_L99") us | ${R_CS_L99}x |

- 4 MiB: one op per call for 3 s after warm-up; async keeps 4 batches in flight and
  polls them (HixlCSClientQueryCompleteStatus / HixlEngineGetTransferStatus). Data
  checked byte for byte on each point's first iteration, through the API measured
  (${CS_VERIFIED}). Round trips: 10000 after 1000 warm-up.
- Per-round values: in "Every figure" below.

## Staging pool over tcp

hixl-bench \`--transport tcp\`, sync, WRITE and READ, pinned as above. Ops shorter
than the engine option StagingThreshold (default ${ST_DEF_TEXT} bytes) whose memory is
registered on both sides are coalesced: packed into the staging pool's buffers
(BufferPool, default 4:8), one frame per buffer, scattered by the far side; \`0\`
never coalesces. Ops on unregistered memory are always staged. Each figure is the
median of ${ROUNDS} rounds; in every round the five runs go back to back, their order
reversed every other round (per-round values at the end of this section). Data
checked byte for byte on each point's first iteration (${ST_VERIFIED}).

| target | 16 KiB x 1024 | 4 MiB x 1 | ratio | goal | result |
|---|---:|---:|---:|---:|---|
| WRITE: a batch of 1024 ops of 16 KiB vs one op of 4 MiB per call | $(gbps "$ST_W16K") | $(gbps "$H_W4M") | $(rx "$ST_W16K" "$H_W4M") | >= 0.7x | $(verdict "$R_ST_W" ge 0.7) |
| READ: a batch of 1024 ops of 16 KiB vs one op of 4 MiB per call | $(gbps "$ST_R16K") | $(gbps "$H_R4M") | $(rx "$ST_R16K" "$H_R4M") | >= 0.7x | $(verdict "$R_ST_R" ge 0.7) |

The 16 KiB batch runs with the default StagingThreshold; the 4 MiB figure is the
round's "hixl WRITE / READ 4 MiB" of the targets above.

### Coalescing small ops (what the default StagingThreshold is chosen from)

One HixlEngineTransferSync of 1024 ops of one size per call, all memory registered:
direct (\`--opt StagingThreshold=0\`, every op its own transfer), the default
threshold (each block marked with what it does), and every op coalesced
(\`--opt StagingThreshold=${ST_ALL}\`). A ratio above 1 means coalescing wins at that
size: the default threshold belongs just above the largest block where it does. Where
the default sends blocks direct, default and direct run the same code, so their ratio
shows how far this run's figures swing.

$(coalesce_table)

### Unregistered local memory

The initiator's buffers are plain memory, not registered (\`--unregistered local\`),
so every op goes through the staging pool, against the same transfer with both
buffers registered (direct: these blocks are above the threshold).

$(unreg_table)

Per-round GB/s:

$(stage_rounds_table)

## Same-host transport (shm)

Issue 4's targets for Transport shm (what auto picks for a peer on the same host),
measured by \`hixl-shm-ref\` (\`integration/bench/shm_ref.c\`) near the end of this run,
once with 4 KiB pages and once with \`--thp\` (every buffer madvised MADV_HUGEPAGE;
${THP_TEXT}).

- In each run every figure is the median of ${SHM_ROUNDS} rounds, all figures interleaved
  in every round, over one ${SHM_SPAN} MiB span walked block by block; pinned:
  ${SHM_PIN_TEXT}.
- hixl figures are HixlEngineTransferSync over Transport shm from the initiator to an
  engine in the target process; memcpy copies between two buffers of the initiator on
  one thread; process_vm_readv is the initiator reading the target's memory.
- The data moved by hixl is checked byte for byte before and after the measurements:
  ${SHM_CHECK}.
- Other processes used ${SHM_OTHERS}% of the CPUs during these runs.

Beside each target, the kernel's ceiling from the same run: the same ratio with hixl
replaced by bare process_vm_readv calls of the same blocks, the calls hixl's shm path
is built on (one per block; for adjacent 4 KiB batches one per 256 KiB, the best a
batch of 4 KiB ops could reach; for scattered ones a single call for the 1024
scattered blocks, the kernel's own batch; process_vm_readv for WRITE targets too). A
MISS where that ceiling misses the goal too is the kernel's limit; one where it does
not is hixl's. A ratio within a few hundredths of its ceiling is inside the
round-to-round spread of these figures (per-round values at the end of this section).

$(shm_target_table)

$(shm_summary 4k "4 KiB pages")
$(shm_summary thp "Huge pages")
- Why the kernel's call stays under memcpy: for every call it pins and walks the
  target's pages one by one, even for one large block; huge pages leave fewer pages to
  walk. hixl's shm path copies with those same calls
  (process_vm_readv / process_vm_writev), many ops per call.
- Batches: "adjacent" ops touch on both sides (as hixl-bench lays them out) and become
  one iovec per side, one range for the kernel to walk; "scattered" ops (remote blocks
  in a random order) stay one iovec each and cost the kernel one pin per op, which is
  why their ceiling is the kernel's own scattered batch rather than one large call.
- The ratios depend on the working set: they move with the span
  (\`hixl-shm-ref --span-mib N\`), and a span that stays in cache raises all three
  rates. Compare runs and machines at the same span.
- A single 4 KiB READ per sync call costs about $(shm_op_cost 4k) more than one bare
  process_vm_readv of 4 KiB with 4 KiB pages
  ($(r2 "$(shm_fig 4k shm:READ:4096:1:adjacent)") against $(r2 "$(shm_fig 4k "$SHM_RV4K")") GB/s), $(shm_op_cost thp) with huge pages: the engine lock,
  table lookups, the peer's withdrawal count and its pidfd.

Mapped memory (issue 15): the target's second buffer comes from HixlEngineAllocMem, so
the initiator is handed its memfd, maps it and moves ops inside it with memcpy; the
same engines, link and span as above, in the same rounds. Goals: >= 0.9x
single-thread memcpy of the same block size for 256 KiB to 16 MiB ops, and 1024
scattered 4 KiB ops per call >= 3x one process_vm_readv per block.

$(shm_map_table)
EOF
[ -n "$SHM_NOTE" ] && printf -- '- hixl-shm-ref note: %s.\n' "$SHM_NOTE" >>"$OUT"
cat >>"$OUT" <<EOF

Every figure (GB/s, median and rounds):

$(shm_figure_table)

## Every figure

| measurement | tool | median | rounds |
|---|---|---:|---|
| TCP stream, 1 connection, 4 MiB writes | hixl-tcp-ref | $(r2 "$TCP_4M") GB/s | $(r2all "${V_TCP4M[@]}") |
| UCX ucp_put_bw 4 MiB over tcp on lo | ucx_perftest | $(r2 "$UCX_BW") GB/s | $(r2all "${V_UCX[@]}") |
| hixl WRITE 4 MiB, sync, 1 op per call | hixl-bench | $(r2 "$H_W4M") GB/s | $(r2all "${V_HW[@]}") |
| hixl READ 4 MiB, sync, 1 op per call | hixl-bench | $(r2 "$H_R4M") GB/s | $(r2all "${V_HR[@]}") |
| TCP 64 B request/response avg | hixl-tcp-ref | $(r2 "$TCP_RTT") us | $(r2all "${V_TRTT[@]}") |
| hixl 64 B READ avg | hixl-bench | $(r2 "$H_RTT") us | $(r2all "${V_HRTT[@]}") |
| TCP 64 B request/response p99 | hixl-tcp-ref | $(r2 "$TCP_RTT99") us | $(r2all "${V_TRTT99[@]}") |
| hixl 64 B READ p99 | hixl-bench | $(r2 "$H_RTT99") us | $(r2all "${V_HRTT99[@]}") |
| CS BatchPutSync 4 MiB, tcp | hixl-bench --api cs | $(r2 "$M_cs_SW") GB/s | $(r2all "${C_cs_SW[@]}") |
| engine TransferSync WRITE 4 MiB, tcp | hixl-bench --api engine | $(r2 "$M_engine_SW") GB/s | $(r2all "${C_engine_SW[@]}") |
| CS BatchGetSync 4 MiB, tcp | hixl-bench --api cs | $(r2 "$M_cs_SR") GB/s | $(r2all "${C_cs_SR[@]}") |
| engine TransferSync READ 4 MiB, tcp | hixl-bench --api engine | $(r2 "$M_engine_SR") GB/s | $(r2all "${C_engine_SR[@]}") |
| CS BatchPutAsync 4 MiB, 4 in flight, tcp | hixl-bench --api cs | $(r2 "$M_cs_AW") GB/s | $(r2all "${C_cs_AW[@]}") |
| engine TransferAsync WRITE 4 MiB, 4 in flight, tcp | hixl-bench --api engine | $(r2 "$M_engine_AW") GB/s | $(r2all "${C_engine_AW[@]}") |
| CS BatchGetAsync 4 MiB, 4 in flight, tcp | hixl-bench --api cs | $(r2 "$M_cs_AR") GB/s | $(r2all "${C_cs_AR[@]}") |
| engine TransferAsync READ 4 MiB, 4 in flight, tcp | hixl-bench --api engine | $(r2 "$M_engine_AR") GB/s | $(r2all "${C_engine_AR[@]}") |
| CS 64 B BatchGetSync avg / p99, tcp | hixl-bench --api cs | $(r2 "$M_cs_L") / $(r2 "$M_cs_L99") us | $(r2all "${C_cs_L[@]}") / $(r2all "${C_cs_L99[@]}") |
| engine 64 B TransferSync READ avg / p99, tcp | hixl-bench --api engine | $(r2 "$M_engine_L") / $(r2 "$M_engine_L99") us | $(r2all "${C_engine_L[@]}") / $(r2all "${C_engine_L99[@]}") |

Measured once, for context:

| measurement | tool | figure |
|---|---|---:|
| TCP stream, 1 connection, 1 MiB writes | hixl-tcp-ref | $(r2 "$TCP_1M") GB/s |
| TCP stream, 1 connection, 4 KiB writes | hixl-tcp-ref | $(r2 "$TCP_4K") GB/s |
| TCP stream, 2 connections, 4 MiB writes, not pinned | hixl-tcp-ref | $(r2 "$TCP_2x4M") GB/s |
| TCP stream, 2 connections, 4 KiB writes, not pinned | hixl-tcp-ref | $(r2 "$TCP_2x4K") GB/s |
| iperf3, 1 stream, 3 s (128 KiB writes) | iperf3 | $(r2 "$IPERF_1") GB/s |
| iperf3, 2 streams, 3 s | iperf3 | $(r2 "$IPERF_2") GB/s |
| hixl WRITE 4 MiB, TransferAsync, 4 requests in flight | hixl-bench | $(r2 "$HA_W4M") GB/s |
| hixl READ 4 MiB, TransferAsync, 4 requests in flight | hixl-bench | $(r2 "$HA_R4M") GB/s |
| TCP 64 B round trip avg / p99, not pinned | hixl-tcp-ref | ${TCP_RTT_FREE} us |
| hixl 64 B READ avg / p99, not pinned | hixl-bench | ${H_RTT_FREE} us |
| TCP 64 B round trip avg / p99, both processes on CPU 0 | hixl-tcp-ref | ${TCP_RTT_SAME} us |
| hixl 64 B READ avg / p99, both processes on CPU 0 | hixl-bench | ${H_RTT_SAME} us |

## hixl-bench sweep (sync; latency is per TransferSync call of \`batch\` ops)

$(sweep_table)

## Other transports

Every figure above outside the shm section is Transport tcp (\`--transport tcp\`; on
one host auto would pick shm). RDMA is measured beside perftest in the soft-RoCE guest,
in \`docs/performance-rdma.md\` (\`integration/rxe-vm/run-rdma-bench.sh\`).

## Reproduce

\`\`\`
cmake -S . -B build -DHIXL_BUILD_TESTS=OFF && cmake --build build -j
integration/bench/run_perf.sh build            # rewrites docs/performance.md
\`\`\`

What it runs (raw output in \`build/perf-results/\`); PORT is a free port; our
tools take \`--pin 0,1\`, the others run under \`taskset -c 0\` (client) and
\`taskset -c 1\` (server):

\`\`\`
# ${ROUNDS} rounds of:
hixl-tcp-ref --mode stream --streams 1 --size 4M --seconds 3
${UCX_ENV[*]} ucx_perftest -p PORT &
${UCX_ENV[*]} ucx_perftest 127.0.0.1 -p PORT -t ucp_put_bw -s 4194304 -n 750
hixl-bench --transport tcp --op both --block-sizes 4M --batch 1 --total 16G --max-seconds 3
hixl-tcp-ref --mode rtt --size 64 --iters 10000 --warmup 1000
hixl-bench --transport tcp --latency --lat-size 64 --lat-iters 10000
hixl-bench --api {engine,cs} --transport tcp --op both --block-sizes 4M --batch 1 --total 16G --max-seconds 3
hixl-bench --api {engine,cs} --transport tcp ... --async --window 4
hixl-bench --api {engine,cs} --transport tcp --latency --lat-size 64 --lat-iters 10000
hixl-bench --transport tcp --op both --block-sizes 64,512,1K,2K,4K,16K --batch 1024 --total 4G --max-seconds 1 \\
  [--opt StagingThreshold={0,${ST_ALL}}]
hixl-bench --transport tcp --op both --block-sizes 64K,4M --batch 64 --total 4G --max-seconds 1 [--unregistered local]
# once:
hixl-tcp-ref --mode stream --streams 1 --size {1M,4K}
hixl-tcp-ref --mode stream --streams 2 --size {4M,4K}    (not pinned)
hixl-tcp-ref --mode rtt ... and hixl-bench --latency ...  (not pinned, and --pin 0,0)
iperf3 -s -B 127.0.0.1 -p PORT -1 &
iperf3 -c 127.0.0.1 -p PORT -t 3 -P {1,2}
hixl-bench --op both --block-sizes 4M --batch 1 --async --window 4 --total 16G --max-seconds 3
hixl-bench --op both --block-sizes 4K,64K,1M,4M,16M --batch 1,8 --total 512M --max-seconds 2
hixl-shm-ref ${SHM_CPUS[*]} --kernel-refs [--thp]   (3 rounds inside each run)
\`\`\`
EOF
log "wrote $OUT (raw results in $RES)"
