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
# other processes to leave the CPUs idle first; PERF_REPORT_ONLY=1 writes the page again
# from the last run's raw outputs (BUILD_DIR/perf-results), measuring nothing. Every step
# runs under `timeout`. This script runs the tools; report.py computes and writes the page.
set -u -o pipefail

die() { echo "run_perf: $*" >&2; exit 1; }
log() { echo "run_perf: $*" >&2; }

[ $# -ge 1 ] || die "usage: $0 BUILD_DIR [OUTPUT_MD]"
BUILD=$(cd "$1" 2>/dev/null && pwd) || die "no build dir: $1"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$SRC/docs/performance.md}
BENCH=$BUILD/integration/bench/hixl-bench
TCPREF=$BUILD/integration/bench/hixl-tcp-ref
SHMREF=$BUILD/integration/bench/hixl-shm-ref
RES=$BUILD/perf-results
ROUNDS=${PERF_ROUNDS:-3}
[[ "$ROUNDS" =~ ^[1-9]$ ]] || die "PERF_ROUNDS must be 1..9"
PIN="" ON_CLIENT=() ON_SERVER=()
if [ "$(nproc)" -ge 2 ]; then
  PIN="0,1" ON_CLIENT=(taskset -c 0) ON_SERVER=(taskset -c 1)
fi
UCX_ENV=(UCX_TLS=tcp UCX_NET_DEVICES=lo)
meta() { echo "$1=$2" >>"$RES/meta"; } # KEY VALUE: what the page needs besides the tools' outputs

if [ "${PERF_REPORT_ONLY:-0}" = 1 ]; then
  [ -s "$RES/meta" ] || die "PERF_REPORT_ONLY: no $RES/meta"
  exec python3 "$SRC/integration/bench/report.py" perf "$RES" "$OUT" "$SRC"
fi
for b in "$BENCH" "$TCPREF"; do
  [ -x "$b" ] || die "$b is missing: build first (cmake --build $BUILD)"
done
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
run() { # LOG TIMEOUT TOOL ARGS...: one run of a tool, its output appended to $RES/LOG
  local out=$RES/$1 t=$2
  shift 2
  timeout "$t" "$@" >>"$out" 2>&1 || log "${1##*/} ${*:2} failed (see $out)"
}
tcp_stream() { # STREAMS SIZE CSV [PIN] -> runs hixl-tcp-ref, appends to CSV
  run tcp_ref.log 30 "$TCPREF" --mode stream --streams "$1" --size "$2" --seconds 3 --csv "$3" ${4:+--pin "$4"}
}
tcp_rtt() { # CSV [PIN]
  run tcp_ref.log 60 "$TCPREF" --mode rtt --size 64 --iters 10000 --warmup 1000 --seconds 20 --csv "$1" ${2:+--pin "$2"}
}
hixl_lat() { # LOG CSV [PIN] [extra args]: 64 B READ round trips, appended to CSV
  local log=$1 csv=$2 pin=${3:-}
  shift $(($# < 3 ? $# : 3))
  run "$log" 60 "$BENCH" --transport tcp --latency --lat-size 64 --lat-iters 10000 --max-seconds 20 --csv "$csv" \
    --no-progress ${pin:+--pin "$pin"} "$@"
}
hixl_4m() { # LOG CSV [extra args]: 4 MiB WRITE and READ, pinned, appended to CSV
  local log=$1 csv=$2
  shift 2
  run "$log" 120 "$BENCH" --transport tcp --op both --block-sizes 4M --batch 1 --total 16G --max-seconds 3 \
    --csv "$csv" --no-progress ${PIN:+--pin "$PIN"} "$@"
}
# The CS-vs-engine comparison: both APIs with --transport tcp, pinned.
hixl_cmp() { # CSV API sync|async -> 4 MiB WRITE (put) and READ (get), appended to CSV
  local extra=()
  [ "$3" = async ] && extra=(--async --window 4)
  hixl_4m hixl_cs.log "$1" --api "$2" "${extra[@]}"
}
# Staging over tcp: the same sync sweep with engine options (--opt) or with the
# initiator's memory unregistered. Every run is named; its CSV is round<R>_st_<name>.csv.
ST_ALL=1048576 # StagingThreshold that coalesces every block below (the option's maximum)
ST_SMALL=(--block-sizes "64,512,1K,2K,4K,16K" --batch 1024)
ST_SMALL_B="64 512 1024 2048 4096 16384" # the same blocks, in bytes
ST_BIG=(--block-sizes "64K,4M" --batch 64)
hixl_stage() { # NAME -> the staging run NAME of round $r, WRITE and READ
  local csv=$RES/round${r}_st_$1.csv args
  case $1 in
    default) args=("${ST_SMALL[@]}") ;;
    direct) args=("${ST_SMALL[@]}" --opt StagingThreshold=0) ;;
    coalesced) args=("${ST_SMALL[@]}" --opt "StagingThreshold=$ST_ALL") ;;
    registered) args=("${ST_BIG[@]}") ;;
    unregistered) args=("${ST_BIG[@]}" --unregistered local) ;;
  esac
  run hixl_staging.log 120 "$BENCH" --transport tcp --op both --total 4G --max-seconds 1 --csv "$csv" --no-progress \
    ${PIN:+--pin "$PIN"} "${args[@]}"
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
for ((r = 1; r <= ROUNDS; r++)); do
  log "round $r/$ROUNDS: TCP stream 4 MiB, UCX put 4 MiB, hixl WRITE/READ 4 MiB, 64 B round trips"
  snap=$(cpu_snap)
  csv=$RES/round$r.csv
  tcp_stream 1 4M "$RES/round${r}_tcp.csv" "$PIN"
  ucx_put
  echo "$UCX_LAST" >"$RES/round${r}_ucx.txt"
  hixl_4m hixl_4m.log "$csv"
  tcp_rtt "$RES/round${r}_rtt.csv" "$PIN"
  hixl_lat hixl_latency.log "$RES/round${r}_lat.csv" "$PIN"
  log "round $r/$ROUNDS: CS API vs engine over tcp: 4 MiB sync and async window 4, 64 B round trips"
  ccsv=$RES/round${r}_cs.csv
  if ((r % 2)); then apis=(engine cs); else apis=(cs engine); fi
  for api in "${apis[@]}"; do hixl_cmp "$ccsv" "$api" sync; done
  for api in "${apis[@]}"; do hixl_cmp "$ccsv" "$api" async; done
  for api in "${apis[@]}"; do hixl_lat hixl_cs.log "$RES/round${r}_cs_lat.csv" "$PIN" --api "$api"; done
  log "round $r/$ROUNDS: staging over tcp: 64 B..16 KiB x 1024 coalesced or direct, unregistered memory"
  if ((r % 2)); then runs=(default direct coalesced registered unregistered); else
    runs=(unregistered registered coalesced direct default); fi
  for run in "${runs[@]}"; do hixl_stage "$run"; done
  others=$(others_pct "$snap" "$(cpu_snap)")
  meta others_r "$others"
  log "round $r: other processes used $others% of the CPUs"
done
[ -n "$UCX_NOTE" ] && log "UCX: $UCX_NOTE"
# ------------------------------------------------------- once: for context
log "TCP streams 1 MiB, 4 KiB, 2 x 4 MiB, 2 x 4 KiB"
ONCE=$RES/tcp_once.csv
tcp_stream 1 1M "$ONCE" "$PIN"
tcp_stream 1 4K "$ONCE" "$PIN"
# Two streams are not pinned: pinned, both senders would share CPU 0.
tcp_stream 2 4M "$ONCE" ""
tcp_stream 2 4K "$ONCE" ""
log "64 B round trips unpinned and with both processes on CPU 0"
tcp_rtt "$RES/rtt_free.csv" ""
hixl_lat hixl_latency.log "$RES/lat_free.csv" ""
tcp_rtt "$RES/rtt_same.csv" "0,0"
hixl_lat hixl_latency.log "$RES/lat_same.csv" "0,0"
IPERF_NOTE=""
if command -v iperf3 >/dev/null 2>&1; then
  for streams in 1 2; do
    log "iperf3 -P $streams on 127.0.0.1"
    port=$(free_port 15201) || { IPERF_NOTE="no free port"; break; }
    timeout 30 "${ON_SERVER[@]}" iperf3 -s -B 127.0.0.1 -p "$port" -1 >"$RES/iperf3_server_$streams.log" 2>&1 &
    BG_PIDS+=($!)
    if wait_listen "$port" 10; then
      timeout 30 "${ON_CLIENT[@]}" iperf3 -c 127.0.0.1 -p "$port" -t 3 -P "$streams" -f g >"$RES/iperf3_$streams.log" 2>&1 ||
        log "iperf3 client failed (see $RES/iperf3_$streams.log)"
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
hixl_4m hixl_4m.log "$RES/hixl_async.csv" --async --window 4

log "hixl-bench sweep"
timeout 300 "$BENCH" --transport tcp --op both --block-sizes 4K,64K,1M,4M,16M --batch 1,8 --total 512M --max-seconds 2 \
  --csv "$RES/hixl_sweep.csv" ${PIN:+--pin "$PIN"} >"$RES/hixl_sweep.log" 2>"$RES/hixl_sweep.err" ||
  log "hixl-bench sweep failed (see $RES/hixl_sweep.*)"
cat "$RES/hixl_sweep.log" >&2

# ----------------------------------- once: the same-host transport (shm), issue 4
# hixl-shm-ref takes 3 rounds of every figure itself (about 35 s a run) and appends
# their medians to one CSV, a row per figure; pages=4k or thp tells the runs apart.
# --kernel-refs adds the kernel's call at 1 MiB and its own scattered batch, so that
# every target has the kernel's ceiling beside it.
SHM_NOTE="" SHM_OTHERS=n/a
SHM_CPUS=(--cpu-initiator -1 --cpu-target -1)
[ -n "$PIN" ] && SHM_CPUS=(--cpu-initiator 0 --cpu-target 1)
if [ -x "$SHMREF" ]; then
  snap=$(cpu_snap)
  for pages in 4k thp; do
    log "hixl-shm-ref ($pages pages): Transport shm vs memcpy and process_vm_readv, 3 rounds"
    shm_args=("${SHM_CPUS[@]}" --kernel-refs --csv "$RES/shm.csv")
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

COMMIT=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo "uncommitted")
git -C "$SRC" diff --quiet HEAD -- core 2>/dev/null || COMMIT="$COMMIT (plus uncommitted changes in core/)"
meta start "$START"
meta busy "$BUSY"
meta elapsed $(($(date +%s) - T0))
meta others "$(others_pct "$SNAP_START" "$(cpu_snap)")"
meta commit "$COMMIT"
meta ucx_note "$UCX_NOTE"
meta iperf_note "$IPERF_NOTE"
meta shm_note "$SHM_NOTE"
meta shm_others "$SHM_OTHERS"
meta ucx_env "${UCX_ENV[*]}"
meta pin "$PIN"
meta rounds "$ROUNDS"
meta st_all "$ST_ALL"
python3 "$SRC/integration/bench/report.py" perf "$RES" "$OUT" "$SRC" || die "the page could not be written"
log "wrote $OUT (raw results in $RES)"
