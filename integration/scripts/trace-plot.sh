#!/usr/bin/env bash
# trace-plot.sh TRACE.jsonl [OUT_PREFIX]: pictures of a hixl-mock-host --trace file, with
# gnuplot (gnuplot-nox) and jq:
#   OUT_PREFIX-timeline.png    one bar per request's hand-off, from prefill's last layer
#                              saved to decode holding the KV, its segments coloured by
#                              phase (waiting for blocks, pin or accept, transfer, last
#                              notice, host wake-up; the hand-off lines of --trace)
#   OUT_PREFIX-histograms.png  hand-off latency and the transfers' own time (the side
#                              that moves data: its first op posted to its last byte),
#                              requests per log2 bucket
# OUT_PREFIX defaults to TRACE without .jsonl. See docs/observability.md.
set -euo pipefail
if [ $# -lt 1 ] || [ ! -r "$1" ]; then
  echo "usage: $0 TRACE.jsonl [OUT_PREFIX]  (a hixl-mock-host --trace file)" >&2
  exit 2
fi
for t in gnuplot jq; do
  command -v $t >/dev/null || { echo "trace-plot: $t is missing (integration/scripts/install-deps.sh)" >&2; exit 1; }
done
trace=$1
out=${2:-${trace%.jsonl}}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Hand-offs, in the order they started: index, request, then each boundary in ms from the
# first hand-off's start (jq's numbers are doubles: ns times keep ~0.3 us here).
jq -rn '[inputs | select(.role == "handoff")] | sort_by(.t.saved) | (.[0].t.saved) as $t0 |
  to_entries[] | [.key, .value.req] + ([.value.t.saved, .value.t.blocks, .value.t.pinned, .value.t.landed,
  .value.t.noticed, .value.t.held] | map((. - $t0) / 1e6)) | @tsv' "$trace" >"$tmp/handoff.tsv"
n=$(wc -l <"$tmp/handoff.tsv")
if [ "$n" -eq 0 ]; then
  echo "trace-plot: $trace has no hand-off lines (a run of hixl-mock-host --trace with verified requests)" >&2
  exit 1
fi
# Latencies (ms): the hand-off, and each request's transfer on the side that moved it.
awk -F'\t' '{ print $8 - $3 }' "$tmp/handoff.tsv" >"$tmp/handoff_ms"
jq -r 'select(.outcome == "ok" and .t.posted != null and .t.last_byte != null and .role != "handoff")
  | (.t.last_byte - .t.posted) / 1e6' "$trace" >"$tmp/transfer_ms"
# Requests per log2 bucket of ms: bucket k is [2^k, 2^(k+1)) ms, drawn at its middle.
buckets() {
  awk '{ v = $1 > 0.001 ? $1 : 0.001; k = int(log(v) / log(2) + 100) - 100; n[k]++ }
    END { for (k in n) printf "%.6g\t%d\t%.6g\n", 1.5 * 2 ^ k, n[k], 2 ^ k }' "$1" | sort -g
}
buckets "$tmp/handoff_ms" >"$tmp/handoff_hist"
buckets "$tmp/transfer_ms" >"$tmp/transfer_hist"
mode=$(jq -rn 'first(inputs | select(.role == "handoff") | .mode)' "$trace")
height=$((n * 14 + 160))
[ $height -gt 2400 ] && height=2400

gnuplot <<EOF
set terminal pngcairo size 1100,$height font "DejaVu Sans,10"
set output "$out-timeline.png"
set title "hixl hand-offs ($mode mode, $n requests): prefill's last layer saved -> decode holds the KV"
set xlabel "ms since the first hand-off began"
set ylabel "request (in the order its hand-off began)"
set yrange [-1:$n]
set ytics out
set grid xtics
set key outside top center horizontal
set style fill solid 0.9 noborder
bar(a, b) = (b > a ? b - a : 0)
plot "$tmp/handoff.tsv" using ((\$3+\$4)/2):1:(bar(\$3,\$4)/2):(0.4) with boxxyerror lc rgb "#bbbbbb" title "waiting for blocks", \
     "" using ((\$4+\$5)/2):1:(bar(\$4,\$5)/2):(0.4) with boxxyerror lc rgb "#e69f00" title "pin or accept", \
     "" using ((\$5+\$6)/2):1:(bar(\$5,\$6)/2):(0.4) with boxxyerror lc rgb "#0072b2" title "transfer", \
     "" using ((\$6+\$7)/2):1:(bar(\$6,\$7)/2):(0.4) with boxxyerror lc rgb "#009e73" title "last notice", \
     "" using ((\$7+\$8)/2):1:(bar(\$7,\$8)/2):(0.4) with boxxyerror lc rgb "#cc79a7" title "host wake-up"

set terminal pngcairo size 1100,450 font "DejaVu Sans,10"
set output "$out-histograms.png"
set multiplot layout 1,2 title "hixl latency histograms ($mode mode): requests per log2 bucket"
set logscale x 2
set format x "%g"
set xlabel "ms"
set ylabel "requests"
set yrange [0:*]
unset key
set grid
set style fill solid 0.8 border -1
set offsets 0, 0, 1, 0
set title "hand-off (last layer saved -> KV held)"
plot "$tmp/handoff_hist" using 1:2:3 with boxes lc rgb "#0072b2"
set title "transfer (first op posted -> last byte)"
plot "$tmp/transfer_hist" using 1:2:3 with boxes lc rgb "#e69f00"
unset multiplot
EOF
echo "trace-plot: $out-timeline.png ($n hand-offs), $out-histograms.png"
