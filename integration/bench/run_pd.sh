#!/usr/bin/env bash
# run_pd.sh BUILD_DIR [OUTPUT_MD]
#
# Measures prefill-to-decode KV hand-offs through the KV-connector plugin against the
# raw engine moving the same bytes as the same op lists (hixl-pd-bench), in one run
# per transport (tcp, and auto = shm between two processes of this host), on a
# Llama-8B-like shape (32 layers x K, V; 16-token blocks of 8 heads x 128 x 2 bytes =
# 32 KiB), decode pinned to CPU 0 and prefill to CPU 1 like two hosts. Writes
# OUTPUT_MD (default docs/performance-pd.md) with the tables, the goals (pull >= 0.9x
# the raw engine; push: hand-off latency after the last layer <= 1.5x one layer's
# transfer), and a plot of hand-off latency against prompt length (gnuplot, PNG,
# docs/performance-pd.png; gnuplot-nox is installed from Debian when missing).
# Environment: PD_ROUNDS (default 5), PD_PROMPTS (default 256,512,1024,2048,4096),
# PD_STEP_US (default 500: the host polls get_finished once per step, as a runtime does),
# PD_REPORT_ONLY=1 (write the page again from the last run's results, measuring nothing).
# RDMA: the same benchmark inside the soft-RoCE guest (integration/rxe-vm/, on rxe0 at
# 10.77.0.1), pinned in the same way (decode on vCPU 0, prefill on vCPU 1),
# PD_RDMA_PROMPTS (default 256,1024,4096) and PD_RDMA_ROUNDS (default 5); PD_RDMA=0
# leaves it out.
# Layouts (issue "Plugin ABI 1.3", descriptor economy): the pull with the KV cache laid
# out kv_first, BLNHC and cross_layer, each with 16- and 64-token blocks (the same
# bytes), over tcp and auto (shm), written to docs/performance-layouts.md with the
# results in pd-results/pd-layouts.json. PD_LAYOUTS=1 (default) runs it after the rest,
# 0 leaves it out, only runs it alone (performance-pd.md untouched); PD_LAYOUT_PROMPTS
# (default 256,1024,4096), PD_LAYOUT_ROUNDS (default 3), PD_LAYOUT_REPEATS (default 2:
# each case runs that many times, interleaved, 16- and 64-token blocks in turn first).
set -u -o pipefail

die() { echo "run_pd: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 BUILD_DIR [OUTPUT_MD]"
BUILD=$(cd "$1" 2>/dev/null && pwd) || die "no build dir: $1"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$SRC/docs/performance-pd.md}
PNG=${OUT%.md}.png
BENCH=$BUILD/integration/bench/hixl-pd-bench
[ -x "$BENCH" ] || die "build hixl-pd-bench first ($BENCH)"
ROUNDS=${PD_ROUNDS:-5}
PROMPTS=${PD_PROMPTS:-256,512,1024,2048,4096}
STEP_US=${PD_STEP_US:-500}
RES=$BUILD/pd-results
mkdir -p "$RES"
REPORT_ONLY=${PD_REPORT_ONLY:-0}
LAYOUTS=${PD_LAYOUTS:-1}
LPROMPTS=${PD_LAYOUT_PROMPTS:-256,1024,4096}
LROUNDS=${PD_LAYOUT_ROUNDS:-3}
LREPEATS=${PD_LAYOUT_REPEATS:-2}
LOUT=$SRC/docs/performance-layouts.md

# The layouts sweep: every case LREPEATS times, the two block sizes alternating which
# goes first, so drift on this shared machine falls on both alike; then the page.
layouts() {
  local t rep lay bt order
  if [ "$REPORT_ONLY" = 0 ]; then
    rm -f "$RES"/layouts-*.json
    for t in tcp auto; do
      for rep in $(seq 1 "$LREPEATS"); do
        order="16 64"
        [ $((rep % 2)) = 1 ] || order="64 16"
        for lay in kv_first BLNHC cross_layer; do
          for bt in $order; do
            echo "run_pd: layouts: transport $t, $lay, $bt-token blocks, run $rep of $LREPEATS" >&2
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
  python3 "$SRC/integration/bench/report.py" layouts "$RES" "$LOUT" "$LROUNDS" "$SRC/docs/performance-layouts.md" || die "the layouts page could not be written"
}

[ "$LAYOUTS" != only ] || { layouts; exit 0; }

if ! command -v gnuplot >/dev/null; then
  echo "run_pd: installing gnuplot-nox (Debian) for the plot" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null ||
    die "gnuplot-nox could not be installed"
fi

for t in tcp auto; do
  [ "$REPORT_ONLY" = 0 ] || { [ -s "$RES/pd-$t.json" ] || die "PD_REPORT_ONLY: no $RES/pd-$t.json"; continue; }
  echo "run_pd: transport $t, prompts $PROMPTS, $ROUNDS rounds" >&2
  timeout 1800 "$BENCH" --transport "$t" --prompts "$PROMPTS" --rounds "$ROUNDS" --step-us "$STEP_US" --pin \
    --json "$RES/pd-$t.json" >"$RES/pd-$t.md" || die "hixl-pd-bench --transport $t failed"
done

RDMA=${PD_RDMA:-1}
RP=${PD_RDMA_PROMPTS:-256,1024,4096}
RR=${PD_RDMA_ROUNDS:-5}
if [ "$RDMA" != 0 ] && [ "$REPORT_ONLY" != 0 ]; then
  [ -s "$RES/pd-rdma.json" ] || die "PD_REPORT_ONLY: no $RES/pd-rdma.json"
elif [ "$RDMA" != 0 ]; then
  echo "run_pd: transport rdma in the soft-RoCE guest, prompts $RP, $RR rounds" >&2
  rm -f "$RES/pd-rdma.json" "$RES/pd-rdma.md"
  RXE_VM_RW_DIR="$BUILD" RXE_VM_TIMEOUT=1800 bash "$SRC/integration/rxe-vm/run-in-rxe-vm.sh" \
    "$BENCH --transport rdma --ip 10.77.0.1 --prompts $RP --rounds $RR --step-us $STEP_US --pin \
     --json $RES/pd-rdma.json > $RES/pd-rdma.md" >"$RES/pd-rdma.log" 2>&1 ||
    die "hixl-pd-bench in the soft-RoCE guest failed (see $RES/pd-rdma.log)"
  [ -s "$RES/pd-rdma.json" ] || die "the guest wrote no results (see $RES/pd-rdma.log)"
fi

# JSON rows -> "tokens handoff_ms push_after_last_ms layer_ms" for gnuplot.
for t in tcp auto; do python3 "$SRC/integration/bench/report.py" pd_dat "$RES/pd-$t.json" >"$RES/pd-$t.dat"; done
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
python3 "$SRC/integration/bench/report.py" pd "$RES" "$OUT" "$SRC/docs/performance-pd.md" "$ROUNDS" "$STEP_US" "$RR" ||
  die "the page could not be written"
echo "run_pd: wrote $OUT and $PNG" >&2
[ "$LAYOUTS" = 0 ] || layouts
