#!/usr/bin/env bash
# run_adapter.sh BUILD_DIR [--requests N] [--repeats N] [--json FILE]: the prefill-to-decode hand-off through the
# Python adapter (integration/py-host/hixl-py-host) against the C mock host, each case --repeats times interleaved
# (which goes first alternates); then the Python overhead per step and adapter_step.py's CPU per step. docs/vllm.md
# gives the method and why the figure of record is GB/s over the hand-offs. Progress on stderr, the tables on
# stdout, with --json FILE the results. Environment (defaults below): ADAPTER_MODES, ADAPTER_TRANSPORTS,
# ADAPTER_KV_MIB (2048: the four 4096-token requests in flight fit on each side, so no hand-off waits for blocks
# the other host's check still holds), ADAPTER_STEP_REQUESTS (the overhead run's requests).
NAME=run_adapter
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
usage="BUILD_DIR [--requests N] [--repeats N] [--json FILE]"
start "$usage" "$@"
shift
REQUESTS=16 REPEATS=3 JSON=
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) REQUESTS=${2:?}; shift 2 ;;
    --repeats) REPEATS=${2:?}; shift 2 ;;
    --json) JSON=${2:?}; shift 2 ;;
    *) die "usage: $0 $usage" ;;
  esac
done
# PY: HIXL_PY, else the venv integration/vllm/install.sh makes (it holds torch==2.13.0), else /usr/bin/python3.
venv_py=${HIXL_VLLM_VENV:-/opt/hixl/vllm-venv}/bin/python
PY=${HIXL_PY:-$([ -x "$venv_py" ] && echo "$venv_py" || echo /usr/bin/python3)}
CHOST=$BUILD/integration/mock-host/hixl-mock-host
PYHOST=$SRC/integration/py-host/hixl-py-host
PLUGIN=$BUILD/plugin/libhixl_kv_connector.so
need "$CHOST" "$PLUGIN"
"$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch: run integration/vllm/install.sh (a venv with torch), or name one with HIXL_PY"
MODES=${ADAPTER_MODES:-pull push} TRANSPORTS=${ADAPTER_TRANSPORTS:-tcp}
KV_MIB=${ADAPTER_KV_MIB:-2048} STEP_REQUESTS=${ADAPTER_STEP_REQUESTS:-512}
results adapter-results
rm -f "$RES"/hand-*.json "$RES"/step-*.json "$RES"/adapter-step.json
export HIXL_KV_PLUGIN=$PLUGIN

# run_host OUT_JSON WHAT CMD...: CMD --json OUT_JSON, its output beside it as .txt, whose
# last line (the summary) is shown.
run_host() {
  local out=$1
  "${@:3}" --json "$out" >"${out%.json}.txt" || die "$2 failed (see ${out%.json}.txt)"
  tail -n 1 "${out%.json}.txt" | sed "s/^/$NAME:   /" >&2
}
# The same hand-off, both hosts: llama8b, 4096-token requests, packed, the host's memory.
shape=(--model llama8b --layout packed --min-prompt 4096 --max-prompt 4096 --kv-mib "$KV_MIB"
  --requests "$REQUESTS" --concurrency 4 --no-progress --timeout 600)
for t in $TRANSPORTS; do
  for m in $MODES; do
    for rep in $(seq 1 "$REPEATS"); do
      if [ $((rep % 2)) = 1 ]; then order="c py"; else order="py c"; fi
      for h in $order; do
        host=(hixl-py-host "$PY" "$PYHOST" "${shape[@]}") what="Python adapter"
        [ "$h" = py ] || host=(hixl-mock-host "$CHOST" "${shape[@]}" --kv-memory host) what="C mock host"
        log "$t $m, run $rep of $REPEATS: $what"
        run_host "$RES/hand-$h-$t-$m-$rep.json" "${host[0]} --transport $t --mode $m" "${host[@]:1}" \
          --transport "$t" --mode "$m" --plugin "$PLUGIN"
      done
    done
  done
done

# The Python overhead per step: 64 requests in flight, 32 layers of tiny blocks.
for m in $MODES; do
  log "overhead per step, $m, $STEP_REQUESTS requests, 64 in flight"
  run_host "$RES/step-$m.json" "hixl-py-host (overhead run, $m)" "$PY" "$PYHOST" --model tiny --layers 32 \
    --num-blocks 2048 --requests "$STEP_REQUESTS" --concurrency 64 --mode "$m" --transport tcp --plugin "$PLUGIN" \
    --no-progress --timeout 600
done

log "the adapter's CPU per step, 64 requests in flight (adapter_step.py)"
"$PY" "$SRC/integration/bench/adapter_step.py" --json "$RES/adapter-step.json" >"$RES/adapter-step.txt" 2>&1 ||
  die "adapter_step.py failed (see $RES/adapter-step.txt)"

report adapter "$RES" "$REPEATS" "$REQUESTS" "$KV_MIB" "$JSON"
