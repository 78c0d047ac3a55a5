#!/usr/bin/env bash
# run_perf.sh BUILD_DIR [OUTPUT_MD]
#
# hixl-bench, hixl-tcp-ref and hixl-shm-ref beside iperf3 and ucx_perftest on 127.0.0.1; report.py
# writes OUTPUT_MD (default docs/performance.md: each figure, and under "Reproduce" what runs).
# Loopback figures on a small VM swing by 20-50% from run to run: the targeted ones are taken
# PERF_ROUNDS times (1..9, default 3), hixl and its reference interleaved, medians compared.
# One process per CPU (client 0, server 1), like two hosts: unpinned, the scheduler's choice of
# one CPU or two flips small-op latency between ~8 and ~55 us (a cross-CPU wake-up here costs
# ~45 us) and large-op bandwidth between ~2.7 and ~5 GB/s. PERF_WAIT_IDLE=SECONDS waits, bounded,
# for idle CPUs; PERF_REPORT_ONLY=1 rewrites the page from BUILD_DIR/perf-results.
NAME=run_perf
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
page performance.md hixl-bench perf-results "$@"
TCPREF=$BIN/hixl-tcp-ref SHMREF=$BIN/hixl-shm-ref
ROUNDS=${PERF_ROUNDS:-3}
[[ "$ROUNDS" =~ ^[1-9]$ ]] || die "PERF_ROUNDS must be 1..9"
PIN="" ON_CLIENT=() ON_SERVER=()
[ "$(nproc)" -ge 2 ] && PIN="0,1" ON_CLIENT=(taskset -c 0) ON_SERVER=(taskset -c 1)
UCX_ENV=(UCX_TLS=tcp UCX_NET_DEVICES=lo)

if [ "${PERF_REPORT_ONLY:-0}" = 1 ]; then
  [ -s "$RES/meta" ] || die "PERF_REPORT_ONLY: no $RES/meta"
  report perf "$RES" "$OUT" "$SRC"
  exit 0
fi
need "$TCPREF"
rm -rf "$RES"
results perf-results

# Background servers we start; stopped on any exit.
BG_PIDS=()
# stop PID: stops a server we started: it exits after one client; a failed client leaves it waiting.
stop() {
  kill "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
trap 'for p in "${BG_PIDS[@]}"; do stop "$p"; done' EXIT
trap 'exit 130' INT TERM

# A TCP port not in use on this host (not in /proc/net/tcp{,6}), from $1 upward.
free_port() {
  local p=$1
  while grep -q "$(printf ':%04X ' "$p")" /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
    ((++p <= $1 + 200)) || return 1
  done
  echo "$p"
}
# serve LOG PORT CMD...: starts server CMD (stopped on exit; its output appended to LOG) and
# waits up to 10 s for it to listen on PORT. Reads /proc/net/tcp rather than connecting: a
# probe would count as a client.
serve() {
  local hex i
  hex=$(printf '%04X' "$2")
  "${@:3}" >>"$1" 2>&1 &
  BG_PIDS+=($!)
  for ((i = 0; i < 200; i++)); do
    awk -v h="$hex" 'NR > 1 { split($2, a, ":"); if (a[2] == h && $4 == "0A") f = 1 } END { exit !f }' \
      /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

# /proc/stat's cpu line as "user+nice+system, all, idle+iowait" jiffies, then the CPU
# time of this script's own (waited-for) processes.
cpu_snap() {
  echo "$(awk '/^cpu / { t = 0; for (i = 2; i <= 9; i++) t += $i; print $2 + $3 + $4, t, $5 + $6 }' /proc/stat)" \
    "$(awk '{ print $16 + $17 }' /proc/$$/stat)"
}
# Percent of all CPUs between two snaps: busy (not idle), or others: the CPU time of everything
# else while we measure (the machine's user+nice+system time less this script's processes').
cpu_pct() { # busy|others SNAP_BEFORE SNAP_AFTER
  awk -v w="$1" -v a="$2" -v b="$3" 'BEGIN { split(a, x, " "); split(b, y, " "); dt = y[2] - x[2]
    u = w == "busy" ? dt - (y[3] - x[3]) : (y[1] - x[1]) - (y[4] - x[4]); p = 0
    if (dt > 0 && u > 0) p = 100 * u / dt
    printf "%d\n", p }'
}
# Percent of all CPUs busy over one second.
cpu_busy() {
  local a
  a=$(cpu_snap)
  sleep 1
  cpu_pct busy "$a" "$(cpu_snap)"
}
BUSY=$(cpu_busy)
[[ "${PERF_WAIT_IDLE:-}" =~ ^[0-9]+$ ]] || PERF_WAIT_IDLE=0
for ((w = 0; w < PERF_WAIT_IDLE && BUSY > 10; w++)); do BUSY=$(cpu_busy); done
[ "$BUSY" -gt 10 ] && log "warning: other processes keep ${BUSY}% of the CPUs busy; figures will be disturbed"

START=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
SNAP_START=$(cpu_snap)
T0=$(date +%s)

# ------------------------------------------------------------ one-shot tools
run() { # LOG TIMEOUT TOOL ARGS...: one run of a tool, its output appended to $RES/LOG
  timeout "$2" "${@:3}" >>"$RES/$1" 2>&1 || log "${3##*/} ${*:4} failed (see $RES/$1)"
}
tcp_stream() { # STREAMS SIZE CSV PIN -> runs hixl-tcp-ref, appends to CSV
  run tcp_ref.log 30 "$TCPREF" --mode stream --streams "$1" --size "$2" --seconds 3 --csv "$3" ${4:+--pin "$4"}
}
tcp_rtt() { # CSV PIN
  run tcp_ref.log 60 "$TCPREF" --mode rtt --size 64 --iters 10000 --warmup 1000 --seconds 20 --csv "$1" ${2:+--pin "$2"}
}
hixl_lat() { # LOG CSV PIN [extra args]: 64 B READ round trips, appended to CSV
  run "$1" 60 "$BENCH" --transport tcp --latency --lat-size 64 --lat-iters 10000 --max-seconds 20 --csv "$2" \
    --no-progress ${3:+--pin "$3"} "${@:4}"
}
hixl_4m() { # LOG CSV [extra args]: 4 MiB WRITE and READ, pinned, appended to CSV
  run "$1" 120 "$BENCH" --transport tcp --op both --block-sizes 4M --batch 1 --total 16G --max-seconds 3 \
    --csv "$2" --no-progress ${PIN:+--pin "$PIN"} "${@:3}"
}
# Staging over tcp: the same sync sweep with engine options (--opt) or with the
# initiator's memory unregistered. Every run is named; its CSV is round<R>_st_<name>.csv.
ST_ALL=1048576 # StagingThreshold that coalesces every block below (the option's maximum)
ST_SMALL=(--block-sizes "64,512,1K,2K,4K,16K" --batch 1024)
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
  local port
  UCX_LAST=n/a
  if ! command -v ucx_perftest >/dev/null 2>&1; then
    UCX_NOTE="ucx_perftest not installed (apt-get install ucx-utils)"
    return
  fi
  port=$(free_port 13337) || { UCX_NOTE="no free port"; return; }
  if serve "$RES/ucx_server.log" "$port" env "${UCX_ENV[@]}" timeout 60 "${ON_SERVER[@]}" ucx_perftest -p "$port"; then
    env "${UCX_ENV[@]}" timeout 60 "${ON_CLIENT[@]}" ucx_perftest 127.0.0.1 -p "$port" -t ucp_put_bw -s 4194304 -n 750 \
      >"$RES/ucx_client.tmp" 2>&1 || UCX_NOTE="ucx_perftest client failed: $(tail -1 "$RES/ucx_client.tmp")"
    cat "$RES/ucx_client.tmp" >>"$RES/ucx_client.log"
    # ucx_perftest's MB/s are MiB/s; the Final row's overall bandwidth is column 7.
    UCX_LAST=$(awk '$1 == "Final:" { printf "%.4f", $7 * 1048576 / 1e9 }' "$RES/ucx_client.tmp")
    [ -n "$UCX_LAST" ] || UCX_LAST=n/a UCX_NOTE=${UCX_NOTE:-"no Final: row in ucx_perftest output"}
  else
    UCX_NOTE="ucx_perftest server did not listen within 10 s: $(tail -1 "$RES/ucx_server.log")"
  fi
  stop "${BG_PIDS[-1]}"
}

# ---------------------------------------------- rounds: the targeted figures
for ((r = 1; r <= ROUNDS; r++)); do
  log "round $r/$ROUNDS: TCP stream 4 MiB, UCX put 4 MiB, hixl WRITE/READ 4 MiB, 64 B round trips"
  snap=$(cpu_snap)
  tcp_stream 1 4M "$RES/round${r}_tcp.csv" "$PIN"
  ucx_put
  echo "$UCX_LAST" >"$RES/round${r}_ucx.txt"
  hixl_4m hixl_4m.log "$RES/round$r.csv"
  tcp_rtt "$RES/round${r}_rtt.csv" "$PIN"
  hixl_lat hixl_latency.log "$RES/round${r}_lat.csv" "$PIN"
  log "round $r/$ROUNDS: CS API vs engine over tcp: 4 MiB sync and async window 4, 64 B round trips"
  if ((r % 2)); then apis=(engine cs); else apis=(cs engine); fi
  for api in "${apis[@]}"; do hixl_4m hixl_cs.log "$RES/round${r}_cs.csv" --api "$api"; done
  for api in "${apis[@]}"; do hixl_4m hixl_cs.log "$RES/round${r}_cs.csv" --api "$api" --async --window 4; done
  for api in "${apis[@]}"; do hixl_lat hixl_cs.log "$RES/round${r}_cs_lat.csv" "$PIN" --api "$api"; done
  log "round $r/$ROUNDS: staging over tcp: 64 B..16 KiB x 1024 coalesced or direct, unregistered memory"
  runs=(default direct coalesced registered unregistered)
  ((r % 2)) || runs=(unregistered registered coalesced direct default)
  for run in "${runs[@]}"; do hixl_stage "$run"; done
  others=$(cpu_pct others "$snap" "$(cpu_snap)")
  echo "others_r=$others" >>"$RES/meta" # RES/meta: KEY=VALUE lines, what the page needs besides the tools' outputs
  log "round $r: other processes used $others% of the CPUs"
done
[ -n "$UCX_NOTE" ] && log "UCX: $UCX_NOTE"
# ------------------------------------------------------- once: for context
log "TCP streams 1 MiB, 4 KiB, 2 x 4 MiB, 2 x 4 KiB"
for size in 1M 4K; do tcp_stream 1 "$size" "$RES/tcp_once.csv" "$PIN"; done
# Two streams are not pinned: pinned, both senders would share CPU 0.
for size in 4M 4K; do tcp_stream 2 "$size" "$RES/tcp_once.csv" ""; done
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
    if serve "$RES/iperf3_server_$streams.log" "$port" timeout 30 "${ON_SERVER[@]}" iperf3 -s -B 127.0.0.1 -p "$port" -1; then
      timeout 30 "${ON_CLIENT[@]}" iperf3 -c 127.0.0.1 -p "$port" -t 3 -P "$streams" -f g >"$RES/iperf3_$streams.log" 2>&1 ||
        log "iperf3 client failed (see $RES/iperf3_$streams.log)"
    else
      IPERF_NOTE="iperf3 server did not listen within 10 s"
    fi
    stop "${BG_PIDS[-1]}"
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
# hixl-shm-ref takes its rounds itself (about 35 s a run), a CSV row per figure (pages=4k
# or thp); --kernel-refs: every target has the kernel's ceiling beside it.
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
  SHM_OTHERS=$(cpu_pct others "$snap" "$(cpu_snap)")
else
  SHM_NOTE="$SHMREF is missing (cmake --build $BUILD)"
fi

COMMIT=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo "uncommitted")
git -C "$SRC" diff --quiet HEAD -- core 2>/dev/null || COMMIT="$COMMIT (plus uncommitted changes in core/)"
printf '%s\n' "start=$START" "busy=$BUSY" "elapsed=$(($(date +%s) - T0))" \
  "others=$(cpu_pct others "$SNAP_START" "$(cpu_snap)")" "commit=$COMMIT" "ucx_note=$UCX_NOTE" \
  "iperf_note=$IPERF_NOTE" "shm_note=$SHM_NOTE" "shm_others=$SHM_OTHERS" "ucx_env=${UCX_ENV[*]}" \
  "pin=$PIN" "rounds=$ROUNDS" "st_all=$ST_ALL" >>"$RES/meta"
report perf "$RES" "$OUT" "$SRC"
log "wrote $OUT (raw results in $RES)"
