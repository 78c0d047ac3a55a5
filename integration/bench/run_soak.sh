#!/usr/bin/env bash
# run_soak.sh BUILD_DIR [SECONDS] [-- hixl-soak options...]
#
# Runs hixl-soak (a target engine under hostile peers; docs/performance-soak.md) for
# SECONDS of hostile phase (default 120) with a baseline before and after, at low
# priority, and keeps in BUILD_DIR/soak-results/ soak.md (the table and the goals, PASS /
# MISS), soak.log (the per-second progress lines) and soak.json (the figures and every
# sample). Exit status: hixl-soak's (0 every goal passed, 3 a goal was missed, 1 the run
# failed).
NAME=run_soak
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
start "BUILD_DIR [SECONDS] [-- hixl-soak options...]" "$@"
shift
SECONDS_HOSTILE=120
if [ $# -ge 1 ] && [ "$1" != "--" ]; then SECONDS_HOSTILE=$1; shift; fi
[ $# -ge 1 ] && [ "$1" = "--" ] && shift
BENCH=$BIN/hixl-soak
need "$BENCH"
results soak-results

log "$SECONDS_HOSTILE s of hostile peers ($(nproc) CPUs, load $(load))"
# The whole run is bounded: baselines, the hostile phase, and a generous margin to end.
LIMIT=$((SECONDS_HOSTILE * 2 + 300))
timeout "$LIMIT" nice -n 19 "$BENCH" --seconds "$SECONDS_HOSTILE" --json "$RES/soak.json" "$@" \
  >"$RES/soak.md" 2> >(tee "$RES/soak.log" >&2)
rc=$?
cat "$RES/soak.md"
[ "$rc" = 124 ] && die "hixl-soak did not finish within $LIMIT s (a hang: see $RES/soak.log)"
log "exit status $rc; results in $RES"
exit "$rc"
