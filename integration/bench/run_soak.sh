#!/usr/bin/env bash
# run_soak.sh BUILD_DIR [SECONDS] [-- hixl-soak options...]
#
# Runs hixl-soak (one target engine, its own process under RLIMIT_NOFILE 1024, against
# a READ flood that reads nothing, 2x its descriptor limit of idle connects, half-sent
# frames and connect/close churn, beside legitimate clients whose every byte is
# checked) for SECONDS of hostile phase (default 120) with a baseline before and after,
# at low priority, and keeps its output in BUILD_DIR/soak-results/: soak.md (the table
# and the goals, PASS / MISS), soak.log (the per-second progress lines) and soak.json
# (the figures and every sample). Exit status: hixl-soak's (0 every goal passed, 3 a
# goal was missed, 1 the run failed).
set -u -o pipefail

die() { echo "run_soak: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 BUILD_DIR [SECONDS] [-- hixl-soak options...]"
BUILD=$(cd "$1" 2>/dev/null && pwd) || die "no build dir: $1"
shift
SECONDS_HOSTILE=120
if [ $# -ge 1 ] && [ "$1" != "--" ]; then SECONDS_HOSTILE=$1; shift; fi
[ $# -ge 1 ] && [ "$1" = "--" ] && shift
BENCH=$BUILD/integration/bench/hixl-soak
[ -x "$BENCH" ] || die "build hixl-soak first ($BENCH)"
RES=$BUILD/soak-results
mkdir -p "$RES"

echo "run_soak: $SECONDS_HOSTILE s of hostile peers ($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
# The whole run is bounded: baselines, the hostile phase, and a generous margin to end.
LIMIT=$((SECONDS_HOSTILE * 2 + 300))
timeout "$LIMIT" nice -n 19 "$BENCH" --seconds "$SECONDS_HOSTILE" --json "$RES/soak.json" "$@" \
  >"$RES/soak.md" 2> >(tee "$RES/soak.log" >&2)
rc=$?
cat "$RES/soak.md"
[ "$rc" = 124 ] && die "hixl-soak did not finish within $LIMIT s (a hang: see $RES/soak.log)"
echo "run_soak: exit status $rc; results in $RES" >&2
exit "$rc"
