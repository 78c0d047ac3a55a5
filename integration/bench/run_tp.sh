#!/usr/bin/env bash
# run_tp.sh BUILD_DIR [OUTPUT_MD]
#
# The hand-off between prefill and decode instances of different tensor-parallel sizes
# (issue 29): hixl-tp-bench for each pair (1,2) (2,1) (2,4) (4,2) (1,4) (4,1) and (2,2),
# a GQA model (8 KV heads, HND layout) and an MLA model, through the plugin against the
# raw engine moving the same byte ranges, in one run. Writes OUTPUT_MD (default
# docs/performance-tp.md) with both tables and the goal (plugin >= 0.9x the raw engine;
# bytes moved = bytes needed), and the JSON lines in BUILD_DIR/tp-results/tp.json.
# Environment: TP_ROUNDS (default 45, a multiple of 3: the plugin takes each place in a round equally often), TP_REQUESTS (default 8), TP_PROMPT (default 1024),
# TP_LAYERS (GQA, default 8), TP_MLA_LAYERS (default 27, DeepSeek-V2-Lite's: a request
# then carries about the bytes of a GQA one), TP_TRANSPORT (default tcp), TP_CPUS
# (split, the default: producer ranks on half the CPUs, consumer ranks on the other, as
# on two hosts; or shared). A last table repeats the MLA pairs with shared CPUs, for
# reference (not the goal).
set -u -o pipefail
die() { echo "run_tp: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 BUILD_DIR [OUTPUT_MD]"
BUILD=$(cd "$1" 2>/dev/null && pwd) || die "no build dir: $1"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$SRC/docs/performance-tp.md}
BENCH=$BUILD/integration/bench/hixl-tp-bench
[ -x "$BENCH" ] || die "build hixl-tp-bench first ($BENCH)"
RES=$BUILD/tp-results
mkdir -p "$RES" && rm -f "$RES/tp.json" "$RES/tp-shared.json"
PAIRS="1,2 2,1 2,4 4,2 1,4 4,1 2,2"
CPUS=${TP_CPUS:-split}
ARGS=(--rounds "${TP_ROUNDS:-45}" --requests "${TP_REQUESTS:-8}" --prompt "${TP_PROMPT:-1024}"
      --transport "${TP_TRANSPORT:-tcp}" --pairs "$PAIRS")
echo "run_tp: GQA (8 KV heads), CPUs $CPUS" >&2
"$BENCH" "${ARGS[@]}" --layers "${TP_LAYERS:-8}" --cpus "$CPUS" --json "$RES/tp.json" > "$RES/gqa.md" ||
  die "hixl-tp-bench (GQA) failed"
echo "run_tp: MLA, CPUs $CPUS" >&2
"$BENCH" "${ARGS[@]}" --mla --layers "${TP_MLA_LAYERS:-27}" --cpus "$CPUS" --json "$RES/tp.json" \
  > "$RES/mla.md" || die "hixl-tp-bench (MLA) failed"
echo "run_tp: MLA, CPUs shared (reference)" >&2
"$BENCH" "${ARGS[@]}" --mla --layers "${TP_MLA_LAYERS:-27}" --cpus shared --json "$RES/tp-shared.json" \
  > "$RES/mla-shared.md" || die "hixl-tp-bench (MLA, shared CPUs) failed"
# The page is docs/performance-tp.md itself: report.py rewrites its marked blocks.
python3 "$SRC/integration/bench/report.py" tp "$RES" "$OUT" "$SRC/docs/performance-tp.md" "$CPUS" \
  "${TP_MLA_LAYERS:-27}" "${RES#"$SRC"/}" || die "the page could not be written"
echo "run_tp: wrote $OUT" >&2
