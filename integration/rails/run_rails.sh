#!/usr/bin/env bash
# run_rails.sh BUILD_DIR [OUTPUT_MD]
#
# Rails (issue 31) on the shaped two-namespace bed (bed.sh), in one run: for 1, 2 and 4
# rails at RATE each, iperf3 over the same rails at once (the reference, as bed.sh
# ceiling measures it), then hixl-rails-bench 4 MiB READ and WRITE (prefill namespace
# the target, decode the initiator, every byte checked) and the P/D hand-off
# (hixl-mock-host, prefill and decode instances in the two namespaces, pull mode, every
# KV byte checked). One rail is the engine as it is without Rails (one link); 2 and 4
# rails set Rails on both ends (the bench: the rail addresses; the mock host: auto).
# ROUNDS rounds (each all rail counts in turn); the table takes each cell's median.
# Writes OUTPUT_MD (default docs/performance-rails.md): the table, the goal lines (2
# rails >= 1.8x one rail, 4 rails >= 3.4x) as measured, and the JSON lines (also in
# BUILD_DIR/rails-results/rails.json).
# Environment: RATE (default 1gbit: see docs/rails.md for why), SECS (each bench run,
# default 8), IPERF_SECS (default 5), ROUNDS (default 3), RAILS_SET (default "1 2 4"),
# MH_REQUESTS (default 8); REPORT_ONLY=1 writes OUTPUT_MD again from the JSON lines of the
# last run without measuring. Root only; makes its own bed (HIXL_BED=hxrun) and removes it.
set -euo pipefail
die() { echo "run_rails: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 BUILD_DIR [OUTPUT_MD]"
BUILD=$(cd "$1" 2>/dev/null && pwd) || die "no build dir: $1"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$SRC/docs/performance-rails.md}
BENCH=$BUILD/integration/bench/hixl-rails-bench
MH=$BUILD/integration/mock-host/hixl-mock-host
[ -x "$BENCH" ] || die "build hixl-rails-bench first ($BENCH)"
[ -x "$MH" ] || die "build hixl-mock-host and hixl_kv_connector first ($MH)"
[ "$(id -u)" -eq 0 ] || die "run as root (ip netns, tc)"
command -v iperf3 >/dev/null || die "no iperf3 (integration/scripts/install-deps.sh)"
RATE=${RATE:-1gbit}
SECS=${SECS:-8}
IPERF_SECS=${IPERF_SECS:-5}
ROUNDS=${ROUNDS:-3}
RAILS_SET=${RAILS_SET:-1 2 4}
MH_REQUESTS=${MH_REQUESTS:-8}
PORT=7000
export HIXL_BED=hxrun
PF=$HIXL_BED-pf
DC=$HIXL_BED-dc
RES=$BUILD/rails-results
mkdir -p "$RES"
JSON=$RES/rails.json
if [ "${REPORT_ONLY:-0}" != 1 ]; then
  : >"$JSON"
  git -C "$SRC" rev-parse --short HEAD >"$RES/commit" 2>/dev/null || echo '?' >"$RES/commit"
fi
bed() { bash "$SRC/integration/rails/bed.sh" "$@"; }
tpid=
cleanup() {
  set +e
  [ -n "$tpid" ] && kill "$tpid" 2>/dev/null && wait "$tpid" 2>/dev/null
  bed down
}
trap cleanup EXIT

rails_of() { # n end (1 prefill, 2 decode): "10.88.0.E,10.88.1.E,..."
  local n=$1 e=$2 i l=""
  for ((i = 0; i < n; i++)); do l+="${l:+,}10.88.$i.$e"; done
  echo "$l"
}

one_rail_count() { # round n
  local round=$1 n=$2 rt=() ri=() mh=() dir t0
  bed up "$n" "$RATE" >&2
  echo "run_rails: round $round, $n rail(s) at $RATE: iperf3" >&2
  bed ceiling "$IPERF_SECS" 2>"$RES/ceiling.json" >/dev/null
  python3 - "$RES/ceiling.json" "$round" "$n" >>"$JSON" <<'PY'
import json, sys
c = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(json.dumps({"bench": "iperf3", "round": int(sys.argv[2]), "rails": int(sys.argv[3]),
                  "gbps": c["all_rails_gbps"], "one_rail_gbps": c["one_rail_gbps"]}))
PY
  if [ "$n" -gt 1 ]; then
    rt=(--rails "$(rails_of "$n" 1)")
    ri=(--rails "$(rails_of "$n" 2)" --expect-rails "$n")
    mh=(--set Rails=auto)
  fi
  rm -f "$RES/ready"
  ip netns exec "$PF" "$BENCH" --role target --listen "10.88.0.1:$PORT" "${rt[@]}" --ready-file "$RES/ready" \
    >"$RES/target.log" 2>&1 &
  tpid=$!
  t0=$(date +%s)
  until [ -s "$RES/ready" ]; do
    kill -0 "$tpid" 2>/dev/null || die "the target exited: $(cat "$RES/target.log")"
    [ $(($(date +%s) - t0)) -lt 30 ] || die "the target is not ready within 30 s"
    sleep 0.05
  done
  for dir in read write; do
    echo "run_rails: round $round, $n rail(s): hixl-rails-bench 4 MiB $dir" >&2
    ip netns exec "$DC" "$BENCH" --role initiator --connect "10.88.0.1:$PORT" "${ri[@]}" "--$dir" \
      --op-size 4MiB --seconds "$SECS" --depth 8 --no-progress --label "round=$round" --json "$RES/one.json" \
      >"$RES/bench-$n-$dir.log" 2>&1 || die "hixl-rails-bench $dir on $n rail(s) failed: $(tail -5 "$RES/bench-$n-$dir.log")"
    python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).read().splitlines()[-1]); r["round"]=int(sys.argv[2]); r["rails"]=int(sys.argv[3]); print(json.dumps(r))' \
      "$RES/one.json" "$round" "$n" >>"$JSON"
    rm -f "$RES/one.json"
  done
  kill "$tpid"
  wait "$tpid" || true
  tpid=
  echo "run_rails: round $round, $n rail(s): hand-off (hixl-mock-host, pull, $MH_REQUESTS requests)" >&2
  rm -f "$RES/mh.json"
  "$MH" --requests "$MH_REQUESTS" --min-prompt 1024 --max-prompt 2048 --transport tcp "${mh[@]}" \
    --prefill-addr "10.88.0.1:$((PORT + 100))" --decode-addr "10.88.0.2:$((PORT + 101))" \
    --prefill-netns "$PF" --decode-netns "$DC" --no-progress --json "$RES/mh.json" \
    >"$RES/mh-$n.log" 2>&1 || die "hixl-mock-host on $n rail(s) failed: $(tail -5 "$RES/mh-$n.log")"
  python3 - "$RES/mh.json" "$round" "$n" >>"$JSON" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
print(json.dumps({"bench": "handoff", "round": int(sys.argv[2]), "rails": int(sys.argv[3]), "pass": m["pass"],
                  "requests": m["requests"], "kv_bytes_verified": m["kv_bytes_verified"],
                  "gbps": m["handoff_gb_per_s"] * 8, "handoff_ms_p50": m["handoff_ms_p50"],
                  "handoff_ms_p99": m["handoff_ms_p99"], "blocks_held": m["prefill"]["blocks_held"] + m["decode"]["blocks_held"]}))
PY
}

if [ "${REPORT_ONLY:-0}" = 1 ]; then
  [ -s "$JSON" ] || die "REPORT_ONLY: no $JSON"
  ROUNDS=$(python3 -c 'import json,sys; print(max(json.loads(l)["round"] for l in open(sys.argv[1]) if l.strip()))' "$JSON")
else
  for ((round = 1; round <= ROUNDS; round++)); do
    for n in $RAILS_SET; do one_rail_count "$round" "$n"; done
  done
fi

python3 - "$JSON" "$OUT" "$RATE" "$SECS" "$ROUNDS" "$(nproc)" "$(uname -r)" "$(cat "$RES/commit" 2>/dev/null || echo '?')" \
  "$IPERF_SECS" "$MH_REQUESTS" <<'PY'
import json, statistics, sys, datetime
path, out, rate, secs, rounds, cpus, kernel, commit, isecs, mhreq = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if l.strip()]
def vals(bench, n, dir=None):
    return [r["gbps"] for r in rows if r["bench"] == bench and r["rails"] == n and (dir is None or r.get("dir") == dir)]
def med(bench, n, dir=None):
    v = vals(bench, n, dir)
    return statistics.median(v) if v else None
rails = sorted({r["rails"] for r in rows})
what = [("READ 4 MiB", "rails", "read"), ("WRITE 4 MiB", "rails", "write"), ("hand-off (mock host)", "handoff", None)]
lines = []
goal = []
lines.append("| rails | what | iperf3 Gbit/s | hixl Gbit/s | hixl rounds min .. max | hixl / iperf3 | speedup over 1 rail |")
lines.append("|---|---|---|---|---|---|---|")
for n in rails:
    ip = med("iperf3", n)
    for label, bench, d in what:
        h = med(bench, n, d)
        base = med(bench, rails[0], d)
        sp = h / base if h and base else None
        v = vals(bench, n, d)
        lines.append("| %d | %s | %.3f | %.3f | %.3f .. %.3f | %.2f | %s |"
                     % (n, label, ip, h, min(v), max(v), h / ip, "%.2fx" % sp if sp else "-"))
for n, want in ((2, 1.8), (4, 3.4)):
    if n not in rails or rails[0] != 1:
        continue
    for label, bench, d in what:
        sp = med(bench, n, d) / med(bench, 1, d)
        goal.append("- %d rails >= %.1fx one rail, %s: %.2fx **%s**" % (n, want, label, sp, "PASS" if sp >= want else "FAIL"))
    ip = med("iperf3", n) / med("iperf3", 1)
    goal.append("- (iperf3 over the same rails: %.2fx)" % ip)
bad = [r for r in rows if r.get("pass") is False or r.get("blocks_held", 0) != 0]
with open(out, "w") as f:
    f.write("# Rails: striping over several links, measured on the shaped bed\n\n")
    f.write("Generated by `integration/rails/run_rails.sh` on %s (%s CPUs, kernel %s, commit %s).\n"
            % (datetime.datetime.utcnow().strftime("%Y-%m-%d"), cpus, kernel, commit))
    f.write("The bed (`integration/rails/bed.sh`, docs/rails.md): two network namespaces on this machine, prefill\n"
            "and decode, joined by N veth pairs, each shaped with tbf at %s on both ends (this kernel has no\n"
            "sch_netem: no added delay). Transport tcp. Prefill is the target, decode the initiator.\n\n" % rate)
    f.write("- iperf3: one stream per rail, all at once, %s s (`bed.sh ceiling`): what the rails carry.\n" % isecs)
    f.write("- READ / WRITE: `hixl-rails-bench`, 4 MiB ops, 8 requests of one op in flight (fewer leave the rails idle between requests), %s s each;\n"
            "  every byte read is checked, every write read back and checked (not timed).\n" % secs)
    f.write("- hand-off: `hixl-mock-host` (llama8b-like, kv_first, pull), prefill and decode instances in the\n"
            "  two namespaces (`--prefill-netns`, `--decode-netns`), %s requests of 1024 to 2048 tokens,\n"
            "  concurrency 4, every KV byte checked; Gbit/s = KV bytes over the time a hand-off was under way.\n" % mhreq)
    f.write("- 1 rail: the engine without Rails (one link per peer); 2 and 4 rails: Rails on both ends\n"
            "  (the bench names the rail addresses; the mock host sets `\"Rails\": \"auto\"`).\n")
    f.write("- Median of %s rounds; each round runs 1, 2 and 4 rails in turn.\n\n" % rounds)
    f.write("\n".join(lines) + "\n\n")
    f.write("Goals (issue 31), as measured:\n\n" + "\n".join(goal) + "\n\n")
    if bad:
        f.write("Runs that did not pass or held blocks at the end: %d (see the JSON lines).\n\n" % len(bad))
    f.write("JSON lines (`rails-results/rails.json`):\n\n```\n")
    for r in rows:
        f.write(json.dumps(r) + "\n")
    f.write("```\n")
print("\n".join(lines))
print("\n".join(goal))
PY
echo "run_rails: wrote $OUT" >&2
