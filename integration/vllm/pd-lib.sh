# Sourced by run-pd.sh and compare.sh: vLLM instances on 127.0.0.1, each in its own
# process group, and the producer/consumer settings of each KV connector compared.
#
# Callers set: vpy (the venv's python), model (its folder), out (the log folder),
# here (this folder), pd_me (the prefix of its messages).
# Every instance started here is in pd_pids; pd_cleanup kills their groups.

# mooncake is vLLM's MooncakeConnector behind mooncake_cpu_shim.py (the stock class
# cannot start on a CPU-only torch); mooncake-stock is the stock class, to show that.
pd_connectors="hixl hixl-fwd nixl mooncake mooncake-stock"

# The environment every instance shares. One CPU's worth of threads each (two cores).
pd_export_env() {
  export VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_CPU_OMP_THREADS_BIND=nobind
  export HF_HUB_OFFLINE=1 VLLM_HOST_IP=127.0.0.1 VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
}

# N ports the kernel handed out for port 0, each checked free by bind (a free block
# picked by hand would race with other jobs on the machine).
pd_ports() {  # n
  # Below the kernel's ephemeral range: vLLM starts for a minute or two after this, and a
  # port-0 bind or an outgoing connection meanwhile (vLLM's own sockets, another test)
  # could take an ephemeral one (seen: "cannot listen ... Address already in use"). A
  # random free one below it is taken only by an explicit bind of the same number.
  "$vpy" - "$1" <<'EOF'
import random, socket, sys
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
ss, ports = [], []
while len(ss) < int(sys.argv[1]):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", random.randrange(10000, max(low, 10001))))
    except OSError:
        s.close()
        continue
    ss.append(s)
    ports.append(s.getsockname()[1])
print(" ".join(map(str, ports)))
for s in ss:
    s.close()
EOF
}

pd_check_connector() {  # name
  case " $pd_connectors " in
    *" $1 "*) ;;
    *) echo "${pd_me:-pd}: unknown connector '$1' (one of: $pd_connectors)" >&2; return 2 ;;
  esac
}

# --kv-transfer-config of one side of a pair. kv_port is the side's own listening
# port: hixl's data address, NIXL's handshake side channel, Mooncake's bootstrap server.
# Every consumer recomputes on a failed load (vLLM's default is to fail the request).
# hixl's lease is $pd_lease_ms (default 30000) on both sides. role kv_both (both
# sides, as vLLM's NixlConnector examples have it): decode is the one that recomputes.
pd_kvcfg() {  # connector role kv_port
  local policy=
  case $2 in kv_consumer|kv_both) policy='"kv_load_failure_policy": "recompute", ' ;; esac
  case $1 in
    hixl|hixl-fwd)
      # hixl-fwd: the consumer loads in the forward pass (load_in_forward, vLLM's
      # synchronous load); the producer is hixl's usual one.
      local fwd=
      [ "$1" = hixl-fwd ] && [ "$2" != kv_producer ] && fwd=', "load_in_forward": true'
      printf '{"kv_connector": "HixlKVConnector", "kv_connector_module_path": "hixl_vllm", "kv_role": "%s", %s"kv_connector_extra_config": {"address": "127.0.0.1:%s", "mode": "pull", "lease_ms": %s, "transfer_timeout_ms": 10000%s}}' \
        "$2" "$policy" "$3" "${pd_lease_ms:-30000}" "$fwd" ;;
    nixl)
      # The CPU platform registers vLLM's own KV cache as DRAM (no host buffer);
      # kv_buffer_device must say "cpu" (_NIXL_SUPPORTED_DEVICE["cpu"]).
      printf '{"kv_connector": "NixlConnector", "kv_role": "%s", %s"kv_buffer_device": "cpu", "kv_connector_extra_config": {"backends": ["UCX"]}}' \
        "$2" "$policy" ;;
    mooncake)
      printf '{"kv_connector": "CpuMooncakeConnector", "kv_connector_module_path": "mooncake_cpu_shim", "kv_role": "%s", %s"kv_connector_extra_config": {"mooncake_protocol": "tcp"}}' \
        "$2" "$policy" ;;
    mooncake-stock)
      printf '{"kv_connector": "MooncakeConnector", "kv_role": "%s", %s"kv_connector_extra_config": {"mooncake_protocol": "tcp"}}' \
        "$2" "$policy" ;;
  esac
}

# Environment of one side of a pair (as NAME=VALUE words for env(1)).
pd_kvenv() {  # connector kv_port
  case $1 in
    hixl|hixl-fwd) ;;
    # The side channel the consumer dials for the producer's agent metadata; each
    # instance listens on its own (both default to 5600).
    nixl) echo "VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT=$2" ;;
    # The producer's bootstrap server (vLLM binds it on 0.0.0.0; it is dialled on
    # VLLM_HOST_IP, 127.0.0.1); the Transfer Engine's own RPC port is picked by it.
    mooncake) echo "VLLM_MOONCAKE_BOOTSTRAP_PORT=$2 PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}" ;;
    mooncake-stock) echo "VLLM_MOONCAKE_BOOTSTRAP_PORT=$2" ;;
  esac
}

pd_pids=()
pd_cleanup() {
  local p i live
  # SIGCONT after SIGTERM: compare.py stops idle pairs, and a stopped process acts on
  # SIGTERM only once continued.
  for p in "${pd_pids[@]}"; do
    kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true
    kill -CONT -- "-$p" 2>/dev/null || true
  done
  # Then SIGKILL what is left after 30 s: a vLLM API server whose engine core it had
  # just force-killed sat in epoll_wait for minutes after SIGTERM (2026-12-05, the fault
  # case's decode; it had no hixl library loaded), and an unbounded wait hangs the run.
  for ((i = 0; i < 300; i++)); do
    live=0
    for p in "${pd_pids[@]}"; do # running, not a zombie waiting for the wait below
      [ -r "/proc/$p/stat" ] && [ "$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -c1)" != Z ] && live=1
    done
    [ $live = 0 ] && break
    sleep 0.1
  done
  if [ $live = 1 ]; then
    echo "pd_cleanup: instances still up 30 s after SIGTERM: SIGKILL" >&2
    for p in "${pd_pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true; done
  fi
  for p in "${pd_pids[@]}"; do wait "$p" 2>/dev/null || true; done
}

# Starts one vLLM OpenAI server in its own process group (vLLM's engine core and
# worker are its children; the fault case kills the whole instance); its pid is
# stored in the variable <name>_pid ('-' in the name written '_').
pd_serve() {  # name port "ENV=V ..." args...
  local name=$1 port=$2 envs=$3
  shift 3
  # shellcheck disable=SC2086 # envs is a list of words
  setsid env $envs "$vpy" -m vllm.entrypoints.openai.api_server --model "$model" --host 127.0.0.1 --port "$port" "$@" \
    >"$out/$name.log" 2>&1 &
  pd_pids+=($!)
  printf -v "${name//-/_}_pid" %s "$!"
}

# proxy.py in front of a pair. MooncakeConnector's requests are paired by a transfer
# id the proxy makes and the producer's engine id, read from its bootstrap server.
pd_proxy() {  # name port prefill_port decode_port connector producer_kv_port
  local extra=()
  case $5 in mooncake*) extra=(--mooncake-bootstrap "http://127.0.0.1:$6") ;; esac
  setsid "$vpy" "$here/proxy.py" --port "$2" --prefill "http://127.0.0.1:$3" \
    --decode "http://127.0.0.1:$4" "${extra[@]}" >"$out/$1.log" 2>&1 &
  pd_pids+=($!)
}

# Polls /health until the instance answers; fails with the end of its log if it exits
# or the deadline (seconds since the script began, bash's SECONDS) passes.
pd_wait_healthy() {  # name port pid deadline
  until curl -sf "http://127.0.0.1:$2/health" >/dev/null; do
    if ! kill -0 "$3" 2>/dev/null; then
      echo "${pd_me:-pd}: $1 exited while starting; the end of $out/$1.log:" >&2
      tail -40 "$out/$1.log" >&2
      return 1
    fi
    if [ $SECONDS -gt "$4" ]; then
      echo "${pd_me:-pd}: $1 not healthy after ${HIXL_VLLM_START_S:-600} s; the end of $out/$1.log:" >&2
      tail -40 "$out/$1.log" >&2
      return 1
    fi
    sleep 1
  done
}
