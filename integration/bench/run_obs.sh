#!/usr/bin/env bash
# run_obs.sh BUILD_DIR [OUTPUT_MD]
#
# What observing costs the P/D hand-off (issue 30): hixl-pd-bench with the connectors'
# histograms and traces on (the plugin's defaults) against off ("metrics": false,
# "trace_ring": 0), in one run, interleaved A B B A per cycle on one machine (decode
# pinned to CPU 0, prefill to CPU 1), so drift falls on both alike; the two "off" runs
# of a cycle against each other (A/A) are the noise any ratio carries. Per prompt: the
# pull through the plugin (GB/s, the host woken by the connector's event fd, and the
# host stepping) and the push (ms from the last layer saved to decode holding it);
# ratio = on / off for GB/s and off / on for ms (goal >= 0.98 both). Writes OUTPUT_MD
# (default docs/performance-obs.md); results in BUILD_DIR/obs-results/.
# Environment: OBS_CYCLES (default 4), OBS_PROMPTS (default 256,1024,4096), OBS_ROUNDS
# (default 3), OBS_TRANSPORT (default auto: shm between the two processes; tcp too),
# OBS_REPORT_ONLY=1 (write the page again from the last run's results, measuring nothing).
set -u -o pipefail

die() { echo "run_obs: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 BUILD_DIR [OUTPUT_MD]"
BUILD=$(cd "$1" 2>/dev/null && pwd) || die "no build dir: $1"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$SRC/docs/performance-obs.md}
BENCH=$BUILD/integration/bench/hixl-pd-bench
[ -x "$BENCH" ] || die "build hixl-pd-bench first ($BENCH)"
CYCLES=${OBS_CYCLES:-4}
PROMPTS=${OBS_PROMPTS:-256,1024,4096}
ROUNDS=${OBS_ROUNDS:-3}
TRANSPORT=${OBS_TRANSPORT:-auto}
RES=$BUILD/obs-results
mkdir -p "$RES"
if [ "${OBS_REPORT_ONLY:-0}" != 1 ]; then
  rm -f "$RES"/obs-*.json

  for c in $(seq 1 "$CYCLES"); do
    k=0
    for mode in off on on off; do
      k=$((k + 1))
      echo "run_obs: cycle $c of $CYCLES, run $k: --obs $mode" >&2
      timeout 900 "$BENCH" --transport "$TRANSPORT" --prompts "$PROMPTS" --rounds "$ROUNDS" --pin --obs "$mode" \
        --json "$RES/obs-$c-$k-$mode.json" >/dev/null 2>"$RES/obs-$c-$k-$mode.log" ||
        die "hixl-pd-bench --obs $mode failed (see $RES/obs-$c-$k-$mode.log)"
    done
  done
fi

python3 "$SRC/integration/bench/report.py" obs "$RES" "$OUT" "$CYCLES" "$ROUNDS" "$TRANSPORT" "$SRC/docs/performance-obs.md" ||
  die "the page could not be written"
