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
# The venv integration/vllm/install.sh makes holds torch (pip install torch==2.13.0);
# HIXL_PY names another interpreter.
venv_py=${HIXL_VLLM_VENV:-/opt/hixl/vllm-venv}/bin/python
PY=${HIXL_PY:-$([ -x "$venv_py" ] && echo "$venv_py" || echo /usr/bin/python3)}
CHOST=$BUILD/integration/mock-host/hixl-mock-host
PYHOST=$SRC/integration/py-host/hixl-py-host
PLUGIN=$BUILD/plugin/libhixl_kv_connector.so
[ -x "$CHOST" ] || die "build hixl-mock-host first ($CHOST)"
[ -f "$PLUGIN" ] || die "build hixl_kv_connector first ($PLUGIN)"
"$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch: run integration/vllm/install.sh (a venv with torch), or name one with HIXL_PY"
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

"$PY" "$SRC/integration/bench/report.py" adapter "$RES" "$REPEATS" "$REQUESTS" "$KV_MIB" "$JSON" ||
  die "the report could not be written"
