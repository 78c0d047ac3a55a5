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

python3 - "$RES" "$OUT" "$CYCLES" "$ROUNDS" "$TRANSPORT" "$(nproc)" "$(uname -r)" "$(date -u +%Y-%m-%d)" \
  "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF' || die "the page could not be written"
import glob, json, math, os, statistics, sys

res, out, cycles, rounds, transport, ncpu, kernel, day, load = sys.argv[1:10]
# runs[cycle][k] = (mode, json): k 1 and 4 off, 2 and 3 on (A B B A)
runs = {}
for f in sorted(glob.glob(os.path.join(res, "obs-*.json"))):
    c, k, mode = os.path.basename(f)[4:-5].split("-")
    runs.setdefault(int(c), {})[int(k)] = (mode, json.load(open(f)))

def val(j, tokens, key):
    return next(r[key] for r in j["rows"] if r["tokens"] == tokens)

def gmean(v):
    return math.exp(sum(math.log(x) for x in v) / len(v))

# Per cycle, on against off, each the geometric mean of its two runs (A B B A: drift
# falls on both alike); a cell is the median over cycles. A/A: a cycle's last off run
# against its first.
tokens = [r["tokens"] for r in runs[min(runs)][2][1]["rows"]]
lines, cells, aas = [], [], []
for t in tokens:
    row = [str(t)]
    for key, higher in (("plugin_fd_gbs", True), ("plugin_gbs", True), ("push_after_last_ms", False)):
        ratio, aa, on_v, off_v = [], [], [], []
        for c, r in sorted(runs.items()):
            off = gmean([val(r[1][1], t, key), val(r[4][1], t, key)])
            on = gmean([val(r[2][1], t, key), val(r[3][1], t, key)])
            on_v.append(on)
            off_v.append(off)
            ratio.append(on / off if higher else off / on)
            a1, a4 = val(r[1][1], t, key), val(r[4][1], t, key)
            aa.append(a4 / a1 if higher else a1 / a4)
        m, a = statistics.median(ratio), statistics.median(aa)
        cells.append(m)
        aas.append(a)
        row += ["%.2f" % statistics.median(off_v), "%.2f" % statistics.median(on_v), "%.3f" % m,
                "%.3f" % a, "%.3f..%.3f" % (min(ratio), max(ratio))]
    lines.append("| " + " | ".join(row) + " |")
overall, overall_aa = gmean(cells), gmean(aas)
worst = min(cells)
summary = ("overall (geometric mean of the %d cells) %.3f, A/A %.3f; every cell >= 0.98" % (len(cells), overall, overall_aa)
           if worst >= 0.98 else
           "overall (geometric mean of the %d cells) %.3f, A/A %.3f; lowest cell %.3f" % (len(cells), overall, overall_aa, worst))
page = f"""# What observing costs the hand-off (issue 30)

`integration/bench/run_obs.sh build` ({day}): `hixl-pd-bench` with the connectors'
histograms and traces **on** (the plugin's defaults: `metrics` true, `trace_ring` 1024;
the host drains nothing, so the ring stays full and drops its oldest, the steady state)
against **off** (`"metrics": false, "trace_ring": 0`: `c->obs` is NULL and every mark is
one test of it), in one run: {len(runs)} cycles of off, on, on, off, each a whole
`hixl-pd-bench --pin --prompts ... --rounds {rounds} --transport {transport}` (Llama-8B-like:
32 layers x K, V, 16-token blocks of 32 KiB; decode on CPU 0, prefill on CPU 1). Each
run reports its median over rounds; per cycle, "on" is the geometric mean of its two on
runs and "off" of its two off runs, and their ratio is the cycle's; a cell is the median
over cycles (the range over cycles beside it). A/A is each cycle's last "off" run against
its first: the noise of this machine ({ncpu} CPUs shared with other work, load {load}
at the end, kernel {kernel}).

Ratios: pull GB/s on / off, push ms off / on (goal >= 0.98 each): **{summary}**.

| prompt tokens | pull GB/s, host woken by the fd: off | on | ratio | A/A | ratio over cycles | pull GB/s, host stepping: off | on | ratio | A/A | ratio over cycles | push: after last layer ms: off | on | ratio | A/A | ratio over cycles |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
""" + "\n".join(lines) + """

What "on" adds per request: a handful of phase marks (each a lookup in the connector's
table of requests under way, under its own mutex, a leaf below the connector's lock),
the histograms' relaxed atomic adds, and at `get_finished` the JSON line of the trace
(and the engine's link info for its transport). Nothing is added per engine op, and no
lock is taken on the engine's data path. See docs/observability.md.
"""
open(out, "w").write(page)
print(page)
EOF
