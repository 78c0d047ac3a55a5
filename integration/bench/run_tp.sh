#!/usr/bin/env bash
# run_tp.sh BUILD_DIR [OUTPUT_MD]: hixl-tp-bench over the pairs (1,2) (2,1) (2,4) (4,2) (1,4) (4,1) (2,2), a GQA and
# an MLA model, then MLA again with shared CPUs for reference: OUTPUT_MD (default docs/performance-tp.md, the method
# on it), the JSON lines in BUILD_DIR/tp-results/tp.json. Environment: TP_ROUNDS (default 45, a multiple of 3: the
# plugin takes each place in a round equally often), TP_REQUESTS (8), TP_PROMPT (1024), TP_LAYERS (GQA, 8),
# TP_MLA_LAYERS (27, DeepSeek-V2-Lite's: a request then carries about a GQA one's bytes), TP_TRANSPORT (tcp), TP_CPUS
# (split, the sides on their own CPUs as on two hosts; or shared).
NAME=run_tp
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
page performance-tp.md hixl-tp-bench tp-results "$@"
rm -f "$RES/tp.json" "$RES/tp-shared.json"
CPUS=${TP_CPUS:-split}
MLA=(--mla --layers "${TP_MLA_LAYERS:-27}")
tp() { # WHAT JSON MD ARGS...: one hixl-tp-bench run over every pair
  log "$1"
  "$BENCH" --rounds "${TP_ROUNDS:-45}" --requests "${TP_REQUESTS:-8}" --prompt "${TP_PROMPT:-1024}" \
    --transport "${TP_TRANSPORT:-tcp}" --pairs "1,2 2,1 2,4 4,2 1,4 4,1 2,2" "${@:4}" --json "$RES/$2" >"$RES/$3" ||
    die "hixl-tp-bench ($1) failed"
}
tp "GQA (8 KV heads), CPUs $CPUS" tp.json gqa.md --layers "${TP_LAYERS:-8}" --cpus "$CPUS"
tp "MLA, CPUs $CPUS" tp.json mla.md "${MLA[@]}" --cpus "$CPUS"
tp "MLA, CPUs shared (reference)" tp-shared.json mla-shared.md "${MLA[@]}" --cpus shared
# The page is docs/performance-tp.md itself: report.py rewrites its marked blocks.
report tp "$RES" "$OUT" "$SRC/docs/performance-tp.md" "$CPUS" "${TP_MLA_LAYERS:-27}" "${RES#"$SRC"/}"
log "wrote $OUT"
