#!/usr/bin/env bash
# run_perf.sh BUILD_DIR [OUTPUT_MD]
#
# Measures, in one run on 127.0.0.1 only: the plain TCP reference (hixl-tcp-ref),
# iperf3, ucx_perftest over tcp, and hixl-bench (WRITE and READ at 4 MiB, a small
# sweep, the 64-byte READ round trip); then writes OUTPUT_MD (default
# docs/performance.md of this source tree) with every figure and the ratios issue 2
# targets, PASS or MISS each. Builds nothing: BUILD_DIR must hold the built tools.
# Raw outputs are kept in BUILD_DIR/perf-results. Every step runs under `timeout`.
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

RES=$BUILD/perf-results
rm -rf "$RES"
mkdir -p "$RES" || die "cannot create $RES"
REF_CSV=$RES/tcp_ref.csv
BW_CSV=$RES/hixl_4m.csv
SWEEP_CSV=$RES/hixl_sweep.csv
LAT_CSV=$RES/hixl_latency.csv

# Background servers we start; stopped on any exit.
BG_PIDS=()
cleanup() {
  for p in "${BG_PIDS[@]}"; do
    kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free TCP port on 127.0.0.1 (not listed in /proc/net/tcp), from a fixed range.
free_port() {
  local p hex
  for p in $(seq "$1" $(($1 + 200))); do
    hex=$(printf ':%04X ' "$p")
    if ! grep -q "$hex" /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# Wait (at most $2 seconds) until something listens on 127.0.0.1:$1 or 0.0.0.0:$1.
# Reads /proc/net/tcp rather than connecting: a probe would count as a client.
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

# csv_get FILE KEY=VALUE... COLUMN: COLUMN of the first row matching all KEY=VALUE.
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

ratio() { # ratio A B -> A/B with 2 decimals, or n/a
  if [[ -z "$1" || -z "$2" || "$1" == n/a || "$2" == n/a ]]; then echo n/a; return; fi
  awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'
}
verdict() { # verdict RATIO ge|le TARGET
  if [[ "$1" == n/a ]]; then echo "NOT MEASURED"; return; fi
  awk -v r="$1" -v op="$2" -v t="$3" 'BEGIN {
    ok = (op == "ge") ? (r + 0 >= t + 0) : (r + 0 <= t + 0); print ok ? "PASS" : "MISS" }'
}
num() { [[ -n "${1:-}" ]] && echo "$1" || echo n/a; }

# Percent of all CPUs busy over one second, from /proc/stat.
cpu_busy() {
  local a b
  a=$(awk '/^cpu / { t = 0; for (i = 2; i <= 9; i++) t += $i; print t, $5 + $6 }' /proc/stat)
  sleep 1
  b=$(awk '/^cpu / { t = 0; for (i = 2; i <= 9; i++) t += $i; print t, $5 + $6 }' /proc/stat)
  awk -v a="$a" -v b="$b" 'BEGIN { split(a, x, " "); split(b, y, " "); dt = y[1] - x[1]
    printf "%d", dt > 0 ? 100 * (dt - (y[2] - x[2])) / dt : 0 }'
}
# The figures mean little on a busy machine: say how busy it was, and with
# PERF_WAIT_IDLE=SECONDS wait (bounded) for other work to finish first.
BUSY=$(cpu_busy)
if [ -n "${PERF_WAIT_IDLE:-}" ]; then
  for ((w = 0; w < PERF_WAIT_IDLE && BUSY > 10; w++)); do
    BUSY=$(cpu_busy)
  done
fi
[ "$BUSY" -gt 10 ] && log "warning: other processes keep ${BUSY}% of the CPUs busy; figures will be disturbed"

START=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
T0=$(date +%s)

# ---------------------------------------------------------------- plain TCP
log "plain TCP reference (hixl-tcp-ref)"
for spec in 1:4M 1:1M 1:4K 2:4M 2:4K; do
  timeout 30 "$TCPREF" --mode stream --streams "${spec%%:*}" --size "${spec#*:}" --seconds 3 --csv "$REF_CSV" \
    >>"$RES/tcp_ref.log" 2>&1 || log "hixl-tcp-ref stream $spec failed (see $RES/tcp_ref.log)"
done
timeout 60 "$TCPREF" --mode rtt --size 64 --iters 20000 --warmup 1000 --seconds 20 --csv "$REF_CSV" \
  >>"$RES/tcp_ref.log" 2>&1 || log "hixl-tcp-ref rtt failed (see $RES/tcp_ref.log)"
cat "$RES/tcp_ref.log" >&2

TCP_1x4M=$(num "$(csv_get "$REF_CSV" mode=stream streams=1 size=4194304 gbps)")
TCP_1x1M=$(num "$(csv_get "$REF_CSV" mode=stream streams=1 size=1048576 gbps)")
TCP_1x4K=$(num "$(csv_get "$REF_CSV" mode=stream streams=1 size=4096 gbps)")
TCP_2x4M=$(num "$(csv_get "$REF_CSV" mode=stream streams=2 size=4194304 gbps)")
TCP_2x4K=$(num "$(csv_get "$REF_CSV" mode=stream streams=2 size=4096 gbps)")
TCP_RTT_AVG=$(num "$(csv_get "$REF_CSV" mode=rtt size=64 avg_us)")
TCP_RTT_P50=$(num "$(csv_get "$REF_CSV" mode=rtt size=64 p50_us)")
TCP_RTT_P99=$(num "$(csv_get "$REF_CSV" mode=rtt size=64 p99_us)")

# ------------------------------------------------------------------- iperf3
# Summary "receiver" line -> GB/s (10^9 bytes/s).
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
    timeout 30 iperf3 -s -B 127.0.0.1 -p "$port" -1 >"$RES/iperf3_server_$streams.log" 2>&1 &
    BG_PIDS+=($!)
    if wait_listen "$port" 10; then
      timeout 30 iperf3 -c 127.0.0.1 -p "$port" -t 3 -P "$streams" -f g >"$RES/iperf3_$streams.log" 2>&1 ||
        log "iperf3 client failed (see $RES/iperf3_$streams.log)"
      v=$(num "$(iperf_gbps "$RES/iperf3_$streams.log")")
      [ "$streams" = 1 ] && IPERF_1=$v || IPERF_2=$v
    else
      IPERF_NOTE="iperf3 server did not listen within 10 s"
    fi
    wait "${BG_PIDS[-1]}" 2>/dev/null
  done
else
  IPERF_NOTE="iperf3 not installed (apt-get install iperf3)"
fi

# ------------------------------------------------------------- ucx_perftest
# ucp_put_bw, 4 MiB messages, TCP transport on lo only. ucx_perftest prints MB/s
# meaning MiB/s; the "Final:" row's overall bandwidth is column 7.
UCX_BW=n/a UCX_NOTE="" UCX_ENV="UCX_TLS=tcp UCX_NET_DEVICES=lo"
UCX_VER=$(ucx_info -v 2>/dev/null | head -1 | sed 's/^# *//')
if command -v ucx_perftest >/dev/null 2>&1; then
  log "ucx_perftest ucp_put_bw 4 MiB over tcp on lo"
  port=$(free_port 13337) || UCX_NOTE="no free port"
  if [ -z "$UCX_NOTE" ]; then
    env UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 60 ucx_perftest -p "$port" >"$RES/ucx_server.log" 2>&1 &
    BG_PIDS+=($!)
    if wait_listen "$port" 10; then
      env UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 60 ucx_perftest 127.0.0.1 -p "$port" -t ucp_put_bw \
        -s 4194304 -n 750 >"$RES/ucx_client.log" 2>&1 || UCX_NOTE="ucx_perftest client failed: $(tail -1 "$RES/ucx_client.log")"
      mib=$(awk '$1 == "Final:" { print $7 }' "$RES/ucx_client.log")
      if [ -n "$mib" ]; then
        UCX_BW=$(awk -v m="$mib" 'BEGIN { printf "%.3f", m * 1048576 / 1e9 }')
      else
        UCX_NOTE=${UCX_NOTE:-"no Final: line in ucx_perftest output"}
      fi
    else
      UCX_NOTE="ucx_perftest server did not listen within 10 s: $(tail -1 "$RES/ucx_server.log")"
    fi
    wait "${BG_PIDS[-1]}" 2>/dev/null
  fi
else
  UCX_NOTE="ucx_perftest not installed (apt-get install ucx-utils)"
fi
[ -n "$UCX_NOTE" ] && log "UCX: $UCX_NOTE"

# --------------------------------------------------------------- hixl-bench
log "hixl-bench WRITE and READ, 4 MiB blocks"
timeout 120 "$BENCH" --op both --block-sizes 4M --batch 1 --total 16G --max-seconds 3 \
  --csv "$BW_CSV" --no-progress >"$RES/hixl_4m.log" 2>&1 || log "hixl-bench 4 MiB failed (see $RES/hixl_4m.log)"
timeout 120 "$BENCH" --op both --block-sizes 4M --batch 1 --async --window 4 --total 16G --max-seconds 3 \
  --csv "$BW_CSV" --no-progress >>"$RES/hixl_4m.log" 2>&1 || log "hixl-bench 4 MiB async failed (see $RES/hixl_4m.log)"
cat "$RES/hixl_4m.log" >&2
log "hixl-bench small sweep"
timeout 300 "$BENCH" --op both --block-sizes 4K,64K,1M,4M,16M --batch 1,8 --total 512M --max-seconds 2 \
  --csv "$SWEEP_CSV" >"$RES/hixl_sweep.log" 2>"$RES/hixl_sweep.err" || log "hixl-bench sweep failed (see $RES/hixl_sweep.*)"
cat "$RES/hixl_sweep.log" >&2
log "hixl-bench 64 B READ latency"
timeout 120 "$BENCH" --latency --lat-size 64 --lat-iters 20000 --max-seconds 20 --csv "$LAT_CSV" \
  --no-progress >"$RES/hixl_latency.log" 2>&1 || log "hixl-bench latency failed (see $RES/hixl_latency.log)"
cat "$RES/hixl_latency.log" >&2

H_W4M=$(num "$(csv_get "$BW_CSV" mode=sync op=WRITE block_size=4194304 batch=1 gbps)")
H_R4M=$(num "$(csv_get "$BW_CSV" mode=sync op=READ block_size=4194304 batch=1 gbps)")
H_W4M_P99=$(num "$(csv_get "$BW_CSV" mode=sync op=WRITE block_size=4194304 batch=1 p99_us)")
H_R4M_P99=$(num "$(csv_get "$BW_CSV" mode=sync op=READ block_size=4194304 batch=1 p99_us)")
H_W4M_AVG=$(num "$(csv_get "$BW_CSV" mode=sync op=WRITE block_size=4194304 batch=1 avg_us)")
H_R4M_AVG=$(num "$(csv_get "$BW_CSV" mode=sync op=READ block_size=4194304 batch=1 avg_us)")
H_W4M_V=$(num "$(csv_get "$BW_CSV" mode=sync op=WRITE block_size=4194304 batch=1 verified)")
H_R4M_V=$(num "$(csv_get "$BW_CSV" mode=sync op=READ block_size=4194304 batch=1 verified)")
HA_W4M=$(num "$(csv_get "$BW_CSV" mode=async op=WRITE block_size=4194304 gbps)")
HA_R4M=$(num "$(csv_get "$BW_CSV" mode=async op=READ block_size=4194304 gbps)")
H_LAT_AVG=$(num "$(csv_get "$LAT_CSV" mode=latency op=READ avg_us)")
H_LAT_P50=$(num "$(csv_get "$LAT_CSV" mode=latency op=READ p50_us)")
H_LAT_P99=$(num "$(csv_get "$LAT_CSV" mode=latency op=READ p99_us)")
H_LAT_V=$(num "$(csv_get "$LAT_CSV" mode=latency op=READ verified)")

R_W_TCP=$(ratio "$H_W4M" "$TCP_1x4M")
R_R_TCP=$(ratio "$H_R4M" "$TCP_1x4M")
R_W_UCX=$(ratio "$H_W4M" "$UCX_BW")
R_R_UCX=$(ratio "$H_R4M" "$UCX_BW")
R_RTT=$(ratio "$H_LAT_AVG" "$TCP_RTT_AVG")
R_RTT_P99=$(ratio "$H_LAT_P99" "$TCP_RTT_P99")
R_AW_TCP=$(ratio "$HA_W4M" "$TCP_1x4M")
R_AR_TCP=$(ratio "$HA_R4M" "$TCP_1x4M")

ELAPSED=$(($(date +%s) - T0))
BUSY_END=$(cpu_busy)

# ------------------------------------------------------------------- report
KERNEL=$(uname -r)
NPROC=$(nproc)
CPU=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
MEM=$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
# shellcheck disable=SC1091
OS=$(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown}")
COMMIT=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo "uncommitted")
HIXL_VER=$(awk '/^# hixl-bench/ { sub(/\):.*/, ""); sub(/.*hixl /, ""); print; exit }' "$RES/hixl_4m.log")

sweep_table() {
  [ -s "$SWEEP_CSV" ] || { echo "(sweep did not run; see $RES/hixl_sweep.err)"; return; }
  echo "| op | block | batch | iters | GB/s | avg us | p50 us | p99 us | verified |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
  awk -F, 'NR > 1 { printf "| %s | %s | %s | %s | %.2f | %.1f | %.1f | %.1f | %s |\n",
    $3, $4, $5, $7, $10, $11, $12, $13, $16 }' "$SWEEP_CSV"
}

mkdir -p "$(dirname "$OUT")"
cat >"$OUT" <<EOF
# hixl performance over TCP on loopback

Generated by \`integration/bench/run_perf.sh\` in one run of ${ELAPSED} s; every
figure below comes from that run, on 127.0.0.1 only. GB/s means 10^9 bytes per
second of payload; latencies are microseconds.

- Date: ${START}
- Machine: ${NPROC} CPUs (${CPU}), ${MEM}, kernel ${KERNEL}, ${OS}
- Other load: ${BUSY}% of the CPUs busy just before the run, ${BUSY_END}% just after
  (outside this script's processes; above ~10% the figures are disturbed)
- hixl ${HIXL_VER:-?} at commit ${COMMIT}; ${IPERF_VER:-iperf3 not found}; ${UCX_VER:-UCX not found}

## Targets (issue 2)

| target | hixl | reference | ratio | goal | result |
|---|---:|---:|---:|---:|---|
| WRITE 4 MiB vs plain TCP stream (1 conn, 4 MiB writes) | ${H_W4M} GB/s | ${TCP_1x4M} GB/s | ${R_W_TCP}x | >= 0.8x | $(verdict "$R_W_TCP" ge 0.8) |
| READ 4 MiB vs plain TCP stream (1 conn, 4 MiB writes) | ${H_R4M} GB/s | ${TCP_1x4M} GB/s | ${R_R_TCP}x | >= 0.8x | $(verdict "$R_R_TCP" ge 0.8) |
| WRITE 4 MiB vs UCX put over tcp (4 MiB) | ${H_W4M} GB/s | ${UCX_BW} GB/s | ${R_W_UCX}x | >= 3x | $(verdict "$R_W_UCX" ge 3) |
| READ 4 MiB vs UCX put over tcp (4 MiB) | ${H_R4M} GB/s | ${UCX_BW} GB/s | ${R_R_UCX}x | >= 3x | $(verdict "$R_R_UCX" ge 3) |
| 64 B READ round trip (avg) vs blocking TCP 64 B round trip (avg) | ${H_LAT_AVG} us | ${TCP_RTT_AVG} us | ${R_RTT}x | <= 1.3x | $(verdict "$R_RTT" le 1.3) |

The hixl 4 MiB figures are HixlEngineTransferSync of one 4 MiB op per call,
repeated for 3 s after warm-up (data verified on the first iteration:
WRITE ${H_W4M_V}, READ ${H_R4M_V}). For information, with TransferAsync and 4
requests in flight: WRITE ${HA_W4M} GB/s (${R_AW_TCP}x TCP), READ ${HA_R4M} GB/s
(${R_AR_TCP}x TCP). The 64 B round trip p99 ratio is ${R_RTT_P99}x
(hixl ${H_LAT_P99} us, TCP ${TCP_RTT_P99} us).
EOF
if [ -n "$UCX_NOTE" ]; then
  printf '\nUCX note: %s. The UCX ratios are not measured rather than guessed.\n' "$UCX_NOTE" >>"$OUT"
fi
if [ -n "$IPERF_NOTE" ]; then
  printf '\niperf3 note: %s.\n' "$IPERF_NOTE" >>"$OUT"
fi
cat >>"$OUT" <<EOF

## Every figure

| measurement | tool | figure |
|---|---|---:|
| TCP stream, 1 connection, 4 MiB writes | hixl-tcp-ref | ${TCP_1x4M} GB/s |
| TCP stream, 1 connection, 1 MiB writes | hixl-tcp-ref | ${TCP_1x1M} GB/s |
| TCP stream, 1 connection, 4 KiB writes | hixl-tcp-ref | ${TCP_1x4K} GB/s |
| TCP stream, 2 connections, 4 MiB writes | hixl-tcp-ref | ${TCP_2x4M} GB/s |
| TCP stream, 2 connections, 4 KiB writes | hixl-tcp-ref | ${TCP_2x4K} GB/s |
| TCP 64 B request/response, blocking | hixl-tcp-ref | avg ${TCP_RTT_AVG} / p50 ${TCP_RTT_P50} / p99 ${TCP_RTT_P99} us |
| iperf3, 1 stream, 3 s | iperf3 | ${IPERF_1} GB/s |
| iperf3, 2 streams, 3 s | iperf3 | ${IPERF_2} GB/s |
| UCX ucp_put_bw 4 MiB, ${UCX_ENV} | ucx_perftest | ${UCX_BW} GB/s |
| hixl WRITE 4 MiB, sync, batch 1 | hixl-bench | ${H_W4M} GB/s (avg ${H_W4M_AVG} us, p99 ${H_W4M_P99} us per op) |
| hixl READ 4 MiB, sync, batch 1 | hixl-bench | ${H_R4M} GB/s (avg ${H_R4M_AVG} us, p99 ${H_R4M_P99} us per op) |
| hixl WRITE 4 MiB, async, window 4 | hixl-bench | ${HA_W4M} GB/s |
| hixl READ 4 MiB, async, window 4 | hixl-bench | ${HA_R4M} GB/s |
| hixl 64 B READ round trip, sync | hixl-bench | avg ${H_LAT_AVG} / p50 ${H_LAT_P50} / p99 ${H_LAT_P99} us (verified: ${H_LAT_V}) |

## hixl-bench sweep (sync; latency is per TransferSync batch)

$(sweep_table)

## Reproduce

\`\`\`
cmake -S . -B build -DHIXL_BUILD_TESTS=OFF && cmake --build build -j
integration/bench/run_perf.sh build            # rewrites docs/performance.md
\`\`\`

The steps it runs (raw output in \`build/perf-results/\`):

\`\`\`
hixl-tcp-ref --mode stream --streams {1,2} --size {4M,1M,4K} --seconds 3
hixl-tcp-ref --mode rtt --size 64 --iters 20000 --warmup 1000
iperf3 -s -B 127.0.0.1 -p PORT -1  &  iperf3 -c 127.0.0.1 -p PORT -t 3 -P {1,2}
${UCX_ENV} ucx_perftest -p PORT  &  ${UCX_ENV} ucx_perftest 127.0.0.1 -p PORT -t ucp_put_bw -s 4194304 -n 750
hixl-bench --op both --block-sizes 4M --batch 1 --total 16G --max-seconds 3 [--async --window 4]
hixl-bench --op both --block-sizes 4K,64K,1M,4M,16M --batch 1,8 --total 512M --max-seconds 2
hixl-bench --latency --lat-size 64 --lat-iters 20000
\`\`\`
EOF
log "wrote $OUT (raw results in $RES)"
