#!/usr/bin/env bash
# run_pd.sh BUILD_DIR [OUTPUT_MD]: hixl-pd-bench over tcp, auto (shm between two processes) and rdma (the soft-RoCE
# guest, integration/rxe-vm/, rxe0 at 10.77.0.1), decode on CPU 0 and prefill on CPU 1 like two hosts: OUTPUT_MD
# (default docs/performance-pd.md, the method and the goals on it) and beside it a plot of hand-off latency against
# prompt length (.png, by gnuplot); then the pull per layout for docs/performance-layouts.md (and
# pd-results/pd-layouts.json). Environment: the PD_* below, their defaults there; PD_STEP_US: the host polls
# get_finished once a step, as a runtime does; PD_REPORT_ONLY=1: the pages from the last results, measuring nothing;
# PD_RDMA=0: no rdma; PD_LAYOUTS: 1 after the rest, 0 not, only: alone (performance-pd.md untouched);
# PD_LAYOUT_REPEATS: the runs of each case.
NAME=run_pd
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
page performance-pd.md hixl-pd-bench pd-results "$@"
PNG=${OUT%.md}.png
ROUNDS=${PD_ROUNDS:-5} PROMPTS=${PD_PROMPTS:-256,512,1024,2048,4096} STEP_US=${PD_STEP_US:-500}
REPORT_ONLY=${PD_REPORT_ONLY:-0} RDMA=${PD_RDMA:-1} RP=${PD_RDMA_PROMPTS:-$PROMPTS} RR=${PD_RDMA_ROUNDS:-5}
LAYOUTS=${PD_LAYOUTS:-1} LPROMPTS=${PD_LAYOUT_PROMPTS:-256,1024,4096} LROUNDS=${PD_LAYOUT_ROUNDS:-3}
LREPEATS=${PD_LAYOUT_REPEATS:-2} LOUT=$SRC/docs/performance-layouts.md

# The layouts sweep: every case LREPEATS times, the two block sizes alternating which
# goes first, so drift on this shared machine falls on both alike; then the page.
layouts() {
  local t rep lay bt order
  if [ "$REPORT_ONLY" = 0 ]; then
    rm -f "$RES"/layouts-*.json
    for t in tcp auto; do
      for rep in $(seq 1 "$LREPEATS"); do
        order=$([ $((rep % 2)) = 1 ] && echo "16 64" || echo "64 16")
        for lay in kv_first BLNHC cross_layer; do
          for bt in $order; do
            log "layouts: transport $t, $lay, $bt-token blocks, run $rep of $LREPEATS"
            timeout 1800 "$BENCH" --transport "$t" --layout "$lay" --block-tokens "$bt" --no-push \
              --prompts "$LPROMPTS" --rounds "$LROUNDS" --step-us "$STEP_US" --pin \
              --json "$RES/layouts-$t-$lay-$bt-$rep.json" >/dev/null ||
              die "hixl-pd-bench --transport $t --layout $lay --block-tokens $bt failed"
          done
        done
      done
    done
  fi
  ls "$RES"/layouts-*.json >/dev/null 2>&1 || die "no layout results in $RES"
  report layouts "$RES" "$LOUT" "$LROUNDS" "$SRC/docs/performance-layouts.md"
}

[ "$LAYOUTS" != only ] || { layouts; exit 0; }

command -v gnuplot >/dev/null || die "gnuplot is missing, for the plot (integration/scripts/install-deps.sh)"

for t in tcp auto; do
  [ "$REPORT_ONLY" = 0 ] || { [ -s "$RES/pd-$t.json" ] || die "PD_REPORT_ONLY: no $RES/pd-$t.json"; continue; }
  log "transport $t, prompts $PROMPTS, $ROUNDS rounds"
  timeout 1800 "$BENCH" --transport "$t" --prompts "$PROMPTS" --rounds "$ROUNDS" --step-us "$STEP_US" --pin \
    --json "$RES/pd-$t.json" >"$RES/pd-$t.md" || die "hixl-pd-bench --transport $t failed"
done

if [ "$RDMA" != 0 ] && [ "$REPORT_ONLY" != 0 ]; then
  [ -s "$RES/pd-rdma.json" ] || die "PD_REPORT_ONLY: no $RES/pd-rdma.json"
elif [ "$RDMA" != 0 ]; then
  log "transport rdma in the soft-RoCE guest, prompts $RP, $RR rounds"
  rm -f "$RES/pd-rdma.json" "$RES/pd-rdma.md"
  RXE_VM_RW_DIR="$BUILD" RXE_VM_TIMEOUT=3600 bash "$SRC/integration/rxe-vm/run-in-rxe-vm.sh" \
    "$BENCH --transport rdma --ip 10.77.0.1 --prompts $RP --rounds $RR --step-us $STEP_US --pin \
     --json $RES/pd-rdma.json > $RES/pd-rdma.md" >"$RES/pd-rdma.log" 2>&1 ||
    die "hixl-pd-bench in the soft-RoCE guest failed (see $RES/pd-rdma.log)"
  [ -s "$RES/pd-rdma.json" ] || die "the guest wrote no results (see $RES/pd-rdma.log)"
fi

# JSON rows -> "tokens handoff_ms push_after_last_ms layer_ms" for gnuplot.
for t in tcp auto; do report pd_dat "$RES/pd-$t.json" >"$RES/pd-$t.dat"; done
gnuplot <<EOF || die "gnuplot failed"
set terminal pngcairo size 900,520 noenhanced
set output "$PNG"
set title "Prefill-to-decode hand-off latency (32 layers x K,V, 32 KiB blocks)"
set xlabel "prompt tokens"
set ylabel "ms"
set logscale xy
set key left top
set grid
plot "$RES/pd-tcp.dat" using 1:2 with linespoints title "tcp, pull (prefill finished -> decode holds KV)", \
     "$RES/pd-tcp.dat" using 1:3 with linespoints title "tcp, push (last layer saved -> decode holds KV)", \
     "$RES/pd-tcp.dat" using 1:4 with lines dashtype 2 title "tcp, one layer's raw transfer", \
     "$RES/pd-auto.dat" using 1:2 with linespoints title "shm, pull", \
     "$RES/pd-auto.dat" using 1:3 with linespoints title "shm, push", \
     "$RES/pd-auto.dat" using 1:4 with lines dashtype 2 title "shm, one layer's raw transfer"
EOF

# The page is docs/performance-pd.md itself: report.py rewrites its marked blocks.
[ "$RDMA" != 0 ] || RR=-
report pd "$RES" "$OUT" "$SRC/docs/performance-pd.md" "$ROUNDS" "$STEP_US" "$RR"
log "wrote $OUT and $PNG"
[ "$LAYOUTS" = 0 ] || layouts
