#!/usr/bin/env bash
# run_soak.sh BUILD_DIR [SECONDS] [-- hixl-soak options...]: hixl-soak (docs/performance-soak.md) with
# SECONDS of hostile phase (default 120), at low priority, into BUILD_DIR/soak-results/: soak.md (the table,
# the goals), soak.log (the per-second lines), soak.json (the figures, every sample). Exit: hixl-soak's.
NAME=run_soak
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
start "BUILD_DIR [SECONDS] [-- hixl-soak options...]" "$@"
shift
SECONDS_HOSTILE=120
if [ $# -ge 1 ] && [ "$1" != "--" ]; then SECONDS_HOSTILE=$1; shift; fi
[ $# -ge 1 ] && [ "$1" = "--" ] && shift
need "$BIN/hixl-soak"
results soak-results
log "$SECONDS_HOSTILE s of hostile peers ($(nproc) CPUs, load $(load))"
# The whole run is bounded: baselines, the hostile phase, and a generous margin to end.
LIMIT=$((SECONDS_HOSTILE * 2 + 300))
timeout "$LIMIT" nice -n 19 "$BIN/hixl-soak" --seconds "$SECONDS_HOSTILE" --json "$RES/soak.json" "$@" \
  >"$RES/soak.md" 2> >(tee "$RES/soak.log" >&2)
rc=$?
cat "$RES/soak.md"
[ "$rc" = 124 ] && die "hixl-soak did not finish within $LIMIT s (a hang: see $RES/soak.log)"
log "exit status $rc; results in $RES"
exit "$rc"
