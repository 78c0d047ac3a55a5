#!/usr/bin/env bash
# run_adapter.sh BUILD_DIR [--requests N] [--repeats N] [--json FILE]
#
# The prefill-to-decode hand-off through the Python adapter (integration/py-host/
# hixl-py-host: plugin/python/hixl_vllm's HixlKVConnector over libhixl_kv_connector.so,
# driven as vLLM's scheduler and model runner drive it) against the same hand-off through
# the C mock host (hixl-mock-host, the C ABI straight), in one run: the Llama-8B-like
# shape (32 layers x K|V, 16-token blocks of 8 heads x 128 x 2 bytes), 4096-token
# requests, the packed layout, the KV in the host's memory, every byte checked by both.
# Each case runs both hosts --repeats times, interleaved (which goes first alternates),
# and compares the medians. The figure of record is KV over the hand-offs: each host's
# verified requests' bytes over the time at least one hand-off (prefill's last layer
# saved to decode holding the KV) was under way, computed alike by both (hixl-mock-host's
# and hixl-py-host's --json handoff_gb_per_s). It holds neither host's own fill and check
# of the KV, which differ (a mix64 hash per 8 bytes in C, table copies and torch.equal in
# Python); in pull mode the whole transfer lies inside it, so the goal, adapter >= 0.95x
# the C path, is judged there. Push moves most layers while prefill still computes: its
# hand-off is only what is left after the last layer, so push is compared by hand-off
# p50. Throughput over the wall (verified KV / wall) is shown too, with both hosts' own
# work in it. Then the Python overhead per step: a py-host run keeping 64 requests
# in flight (--concurrency 64) on a 32-layer model with tiny blocks, so the steps are the
# connector's hooks and little else; time.perf_counter_ns around every connector call of
# each step, µs per scheduler step and per worker step, for each side and mode. Last, the
# adapter's own CPU per step with 64 requests in flight, without a peer
# (integration/bench/adapter_step.py): a producer's and a consumer's scheduler step over
# 64 requests of 4096 tokens, and a worker step of 32 layers, in thread CPU time.
# Prints progress lines on stderr, the tables on stdout, and with --json FILE the results.
# Environment: ADAPTER_MODES (default "pull push"), ADAPTER_TRANSPORTS (default tcp),
# ADAPTER_KV_MIB (default 2048: the four 4096-token requests in flight fit on each side, so
# no hand-off waits for blocks the other host's check still holds), ADAPTER_STEP_REQUESTS
# (default 512: requests of the overhead run).
set -u -o pipefail

die() { echo "run_adapter: $*" >&2; exit 1; }
usage="usage: $0 BUILD_DIR [--requests N] [--repeats N] [--json FILE]"
[ $# -ge 1 ] || die "$usage"
BUILD=$(cd "$1" 2>/dev/null && pwd) || die "no build dir: $1"
shift
REQUESTS=16
REPEATS=3
JSON=
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) REQUESTS=${2:?}; shift 2 ;;
    --repeats) REPEATS=${2:?}; shift 2 ;;
    --json) JSON=${2:?}; shift 2 ;;
    *) die "$usage" ;;
  esac
done
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PY=/usr/bin/python3
CHOST=$BUILD/integration/mock-host/hixl-mock-host
PYHOST=$SRC/integration/py-host/hixl-py-host
PLUGIN=$BUILD/plugin/libhixl_kv_connector.so
[ -x "$CHOST" ] || die "build hixl-mock-host first ($CHOST)"
[ -f "$PLUGIN" ] || die "build hixl_kv_connector first ($PLUGIN)"
"$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch: install Debian's python3-torch"
MODES=${ADAPTER_MODES:-pull push}
TRANSPORTS=${ADAPTER_TRANSPORTS:-tcp}
KV_MIB=${ADAPTER_KV_MIB:-2048}
STEP_REQUESTS=${ADAPTER_STEP_REQUESTS:-512}
RES=$BUILD/adapter-results
mkdir -p "$RES"
rm -f "$RES"/hand-*.json "$RES"/step-*.json "$RES"/adapter-step.json
export HIXL_KV_PLUGIN=$PLUGIN

# The same hand-off, both hosts: llama8b, 4096-token requests, packed, the host's memory.
shape=(--model llama8b --layout packed --min-prompt 4096 --max-prompt 4096 --kv-mib "$KV_MIB"
  --requests "$REQUESTS" --concurrency 4 --no-progress --timeout 600)
run_host() { # run_host c|py TRANSPORT MODE REP
  local out=$RES/hand-$1-$2-$3-$4.json
  echo "run_adapter: $2 $3, run $4 of $REPEATS: $([ "$1" = c ] && echo "C mock host" || echo "Python adapter")" >&2
  if [ "$1" = c ]; then
    "$CHOST" "${shape[@]}" --kv-memory host --transport "$2" --mode "$3" --plugin "$PLUGIN" --json "$out" \
      >"${out%.json}.txt" || die "hixl-mock-host --transport $2 --mode $3 failed (see ${out%.json}.txt)"
  else
    "$PY" "$PYHOST" "${shape[@]}" --transport "$2" --mode "$3" --plugin "$PLUGIN" --json "$out" \
      >"${out%.json}.txt" || die "hixl-py-host --transport $2 --mode $3 failed (see ${out%.json}.txt)"
  fi
  tail -n 1 "${out%.json}.txt" | sed 's/^/run_adapter:   /' >&2
}
for t in $TRANSPORTS; do
  for m in $MODES; do
    for rep in $(seq 1 "$REPEATS"); do
      if [ $((rep % 2)) = 1 ]; then order="c py"; else order="py c"; fi
      for h in $order; do run_host "$h" "$t" "$m" "$rep"; done
    done
  done
done

# The Python overhead per step: 64 requests in flight, 32 layers of tiny blocks.
for m in $MODES; do
  echo "run_adapter: overhead per step, $m, $STEP_REQUESTS requests, 64 in flight" >&2
  out=$RES/step-$m.json
  "$PY" "$PYHOST" --model tiny --layers 32 --num-blocks 2048 --requests "$STEP_REQUESTS" --concurrency 64 \
    --mode "$m" --transport tcp --plugin "$PLUGIN" --no-progress --timeout 600 --json "$out" \
    >"${out%.json}.txt" || die "hixl-py-host (overhead run, $m) failed (see ${out%.json}.txt)"
  tail -n 1 "${out%.json}.txt" | sed 's/^/run_adapter:   /' >&2
done

echo "run_adapter: the adapter's CPU per step, 64 requests in flight (adapter_step.py)" >&2
"$PY" "$SRC/integration/bench/adapter_step.py" --json "$RES/adapter-step.json" >"$RES/adapter-step.txt" 2>&1 ||
  die "adapter_step.py failed (see $RES/adapter-step.txt)"

"$PY" - "$RES" "$REPEATS" "$REQUESTS" "$KV_MIB" "$(nproc)" "$(uname -r)" "$(date -u +%Y-%m-%d)" \
  "$(cut -d' ' -f1-3 /proc/loadavg)" "$JSON" <<'EOF' || die "the report could not be written"
import glob, json, os, statistics, sys

res, repeats, requests, kv_mib, ncpu, kernel, day, load, out = sys.argv[1:10]
runs = {}  # (transport, mode, host) -> [run's json]
for f in sorted(glob.glob(os.path.join(res, "hand-*.json"))):
    host, t, m = os.path.basename(f).split("-")[1:4]
    runs.setdefault((t, m, host), []).append(json.load(open(f)))
med = lambda js, k: statistics.median(j[k] for j in js)
rows = []
for (t, m) in sorted({(t, m) for t, m, _ in runs}, key=lambda x: (x[0], x[1] != "pull")):
    c, p = runs[(t, m, "c")], runs[(t, m, "py")]
    rows.append({"transport": t, "mode": m, "runs": len(c), "c_gbs": med(c, "gb_per_s"), "py_gbs": med(p, "gb_per_s"),
                 "c_gbs_runs": [j["gb_per_s"] for j in c], "py_gbs_runs": [j["gb_per_s"] for j in p],
                 "c_handoff_ms_p50": med(c, "handoff_ms_p50"), "py_handoff_ms_p50": med(p, "handoff_ms_p50"),
                 "c_handoff_p50_runs": [j["handoff_ms_p50"] for j in c],
                 "py_handoff_p50_runs": [j["handoff_ms_p50"] for j in p],
                 "c_hgbs": med(c, "handoff_gb_per_s"), "py_hgbs": med(p, "handoff_gb_per_s"),
                 "c_hgbs_runs": [j["handoff_gb_per_s"] for j in c], "py_hgbs_runs": [j["handoff_gb_per_s"] for j in p],
                 "all_verified": all(j["pass"] for j in c + p)})
for r in rows:
    r["ratio"] = r["py_gbs"] / r["c_gbs"] if r["c_gbs"] else 0.0  # over the wall: each host's own work in it
    r["handoff_ratio"] = r["py_hgbs"] / r["c_hgbs"] if r["c_hgbs"] else 0.0
steps = []
for f in sorted(glob.glob(os.path.join(res, "step-*.json"))):
    j = json.load(open(f))
    for side in ("prefill", "decode"):
        s = j["connector_step_us"][side]
        if s:
            steps.append({"mode": j["mode"], "side": side, "layers": j["layers"], "concurrency": j["concurrency"],
                          "all": {k: v for k, v in s.items() if k != "at_full"}, "at_64": s["at_full"]})
pulls = [r for r in rows if r["mode"] == "pull"]
goal = bool(pulls) and all(r["handoff_ratio"] >= 0.95 for r in pulls)
spread = lambda v: "%.2f-%.2f" % (min(v), max(v))
print("# Hand-offs through the Python adapter against the C mock host")
print()
print("run_adapter.sh on %s (%s CPUs, %s, load average %s): llama8b-like shape (32 layers, 8 KV heads x 128 x"
      " 2 B, 16-token blocks), packed layout, KV in the host's memory (%s MiB per instance), %s requests of 4096"
      " tokens, concurrency 4; medians of %s runs per host, interleaved. Hand-off = prefill's last layer saved"
      " to decode holding the KV; over the hand-offs = the verified KV over the time at least one hand-off was under"
      " way (the same interval on both hosts, without their own fill and check); over the wall = verified KV /"
      " wall from the first request (each host's own work in it)." %
      (day, ncpu, kernel, load, kv_mib, requests, repeats))
print()
print("| transport | mode | C: GB/s over the hand-offs | adapter: GB/s over the hand-offs | adapter / C"
      " | C hand-off p50 ms | adapter hand-off p50 ms | C GB/s over the wall | adapter GB/s over the wall"
      " | every request verified |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print("| %s | %s | %.2f | %.2f | %.2fx | %.1f | %.1f | %.2f | %.2f | %s |" %
          (r["transport"], r["mode"], r["c_hgbs"], r["py_hgbs"], r["handoff_ratio"], r["c_handoff_ms_p50"],
           r["py_handoff_ms_p50"], r["c_gbs"], r["py_gbs"], "yes" if r["all_verified"] else "NO"))
print()
print("- adapter / C, GB/s over the hand-offs, 4096-token requests, pull (the whole transfer inside the"
      " hand-off): %s (goal >= 0.95x): %s" %
      (", ".join("%s %.2fx" % (r["transport"], r["handoff_ratio"]) for r in pulls), "PASS" if goal else "MISS"))
print("- push: most layers move while prefill still computes, so its hand-off holds only what is left after the"
      " last layer; compare its hand-off p50 (its GB/s over the hand-offs counts the whole request's bytes over"
      " that tail, and is not a transfer rate)")
print("- spread over the %s runs (min-max): GB/s over the hand-offs, C: %s; adapter: %s; hand-off p50 ms, C: %s;"
      " adapter: %s" % (repeats,
      "; ".join("%s %s %s" % (r["transport"], r["mode"], spread(r["c_hgbs_runs"])) for r in rows),
      "; ".join("%s %s %s" % (r["transport"], r["mode"], spread(r["py_hgbs_runs"])) for r in rows),
      "; ".join("%s %s %s" % (r["transport"], r["mode"], spread(r["c_handoff_p50_runs"])) for r in rows),
      "; ".join("%s %s %s" % (r["transport"], r["mode"], spread(r["py_handoff_p50_runs"])) for r in rows)))
print("- hand-off p50, C / adapter (above 1: the adapter's is shorter): %s" %
      ", ".join("%s %s %.2fx" % (r["transport"], r["mode"], r["c_handoff_ms_p50"] / r["py_handoff_ms_p50"])
                for r in rows if r["py_handoff_ms_p50"]))
print("- over the wall, adapter / C: %s. The hosts' own work per byte differs: the C host computes every 8 bytes"
      " of KV with a mix64 hash and checks them the same way; the Python host copies a window of a random table"
      " into the blocks and compares bytes with torch.equal (int64 views); that ratio holds that difference, not"
      " the adapter's cost." % ", ".join("%s %s %.2fx" % (r["transport"], r["mode"], r["ratio"]) for r in rows))
print("- runs' GB/s over the wall, C: %s; adapter: %s" %
      ("; ".join("%s %s %s" % (r["transport"], r["mode"], " ".join("%.2f" % g for g in r["c_gbs_runs"])) for r in rows),
       "; ".join("%s %s %s" % (r["transport"], r["mode"], " ".join("%.2f" % g for g in r["py_gbs_runs"])) for r in rows)))
print()
print("## Python overhead per step")
print()
print("hixl-py-host, %s layers of tiny blocks (2 KV heads x 16, 4-token blocks), concurrency 64, tcp: the time"
      " each step spends in the connector's hooks (time.perf_counter_ns around each call: the adapter, ctypes and"
      " the plugin's C; push mode's worker hooks also wait for the push), over the steps with requests in flight." %
      (steps[0]["layers"] if steps else "?"))
print()
print("| mode | side | steps | requests in flight | scheduler step: us, of it in C | its Python, CPU us"
      " | worker step: us, of it in C | its Python, CPU us |")
print("|---|---|---|---|---|---|---|---|")
cell = lambda f, k: "%.0f, %.0f | %.0f" % (f[k + "_us"], f[k + "_c_us"], f[k + "_cpu_us"] - f[k + "_c_cpu_us"])
for s in steps:
    for what, f in (("64", s["at_64"]), ("any, mean %.1f" % s["all"]["inflight_mean"], s["all"])):
        if f:
            print("| %s | %s | %d | %s | %s | %s |" % (s["mode"], s["side"], f["steps"], what, cell(f, "scheduler"),
                                                     cell(f, "worker")))
print()
print("*us*: wall time in the hooks (time.perf_counter_ns), *in C*: inside the plugin's ops (ctypes' marshalling"
      " included); *its Python, CPU us*: the hooks' CPU time outside the plugin's ops (time.thread_time_ns: the"
      " adapter's own work and this driver's timing wrappers, and not inflated when the machine takes the CPU"
      " away mid-hook).")
astep = json.load(open(os.path.join(res, "adapter-step.json")))
print()
print("## The adapter's CPU per step, 64 requests in flight")
print()
print("integration/bench/adapter_step.py: the hooks through hixl_vllm into the plugin without a peer (no KV moves),"
      " 64 requests of %d blocks, %d layers; this thread's CPU time (time.thread_time_ns), median of %d steps." %
      (astep["blocks_per_request"], astep["layers"], astep["steps"]))
print()
print("| step | CPU us | of it in the plugin's C ops | Python | per request |")
print("|---|---|---|---|---|")
for k, v in astep["per_step"].items():
    print("| %s | %.0f | %.0f | %.0f | %s |" % (k, v["us"], v["c_us"], v["us"] - v["c_us"],
                                               "-" if k == "worker" else "%.1f" % (v["us"] / 64)))
if out:
    json.dump({"date": day, "cpus": int(ncpu), "kernel": kernel, "load": load, "requests": int(requests),
               "repeats": int(repeats), "kv_mib": int(kv_mib), "prompt_tokens": 4096, "rows": rows,
               "step_overhead": steps, "adapter_step": astep, "goal_metric": "pull: GB/s over the hand-offs",
               "goal_ratio_ge_0_95": "PASS" if goal else "MISS"},
              open(out, "w"), indent=1)
    print("run_adapter: wrote %s" % out, file=sys.stderr)
EOF
