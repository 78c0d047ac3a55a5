#!/usr/bin/env bash
# run_obs.sh BUILD_DIR [OUTPUT_MD]: what observing costs the P/D hand-off (issue 30), written as the page OUTPUT_MD
# (default docs/performance-obs.md), which says the method; results in BUILD_DIR/obs-results/. Environment: OBS_CYCLES
# (default 4), OBS_PROMPTS (default 256,1024,4096), OBS_ROUNDS (default 3), OBS_TRANSPORT (default auto: shm between the
# two processes; tcp too), OBS_REPORT_ONLY=1 (write the page again from the last run's results, measuring nothing).
NAME=run_obs
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
page performance-obs.md hixl-pd-bench obs-results "$@"
CYCLES=${OBS_CYCLES:-4} PROMPTS=${OBS_PROMPTS:-256,1024,4096} ROUNDS=${OBS_ROUNDS:-3} TRANSPORT=${OBS_TRANSPORT:-auto}
if [ "${OBS_REPORT_ONLY:-0}" != 1 ]; then
  rm -f "$RES"/obs-*.json
  for c in $(seq 1 "$CYCLES"); do
    for run in 1-off 2-on 3-on 4-off; do
      k=${run%-*} mode=${run#*-}
      log "cycle $c of $CYCLES, run $k: --obs $mode"
      timeout 900 "$BENCH" --transport "$TRANSPORT" --prompts "$PROMPTS" --rounds "$ROUNDS" --pin --obs "$mode" \
        --json "$RES/obs-$c-$k-$mode.json" >/dev/null 2>"$RES/obs-$c-$k-$mode.log" ||
        die "hixl-pd-bench --obs $mode failed (see $RES/obs-$c-$k-$mode.log)"
    done
  done
fi

report obs "$RES" "$OUT" "$CYCLES" "$ROUNDS" "$TRANSPORT" "$SRC/docs/performance-obs.md"
