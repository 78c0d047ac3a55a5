#!/usr/bin/env bash
# test_prometheus MOCK_HOST CONFIG: a real Prometheus server (Debian's prometheus,
# started here on a loopback port, its storage in a temp dir) scrapes hixl-mock-host
# --metrics-port through a pull and a push P/D run; its HTTP API then must say that the
# transfer histogram's count is the requests moved and the byte counter the bytes the
# host verified (one-token blocks: a request moves exactly its tokens' KV). Every wait is
# a poll with a deadline. Skips (77) only when there is no prometheus binary.
set -euo pipefail
mh=$1
cfg=$2
prom=${PROMETHEUS:-$(command -v prometheus || true)}
if [ -z "$prom" ] || [ ! -x "$prom" ]; then
  echo "test_prometheus: SKIP: no prometheus binary (Debian package prometheus; integration/scripts/install-deps.sh)"
  exit 77
fi
for t in curl jq python3; do
  command -v $t >/dev/null || { echo "test_prometheus: $t is missing (install-deps.sh)" >&2; exit 1; }
done

tmp=$(mktemp -d /tmp/test_prometheus.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

now() { date +%s; }
fail() {
  echo "test_prometheus: FAIL: $*" >&2
  for f in "$tmp"/*.out "$tmp"/prom.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done
  exit 1
}

# Three ports held until this script ends: a process keeps them bound (SO_REUSEADDR,
# never listening), so no parallel test's bind(:0) takes one before Prometheus or a
# mock host (both SO_REUSEADDR) listens there; a port probed and closed could go first.
coproc HOLD {
  python3 -c 'import socket, sys
ss = [socket.socket() for _ in range(3)]
for s in ss:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss), flush=True)
sys.stdin.read()'
}
pids+=("$HOLD_PID")
read -r pport mport_pull mport_push <&"${HOLD[0]}" || fail "no ports to hold"
cat >"$tmp/prom.yml" <<EOF
global:
  scrape_interval: 500ms
  scrape_timeout: 400ms
scrape_configs:
  - job_name: hixl
    static_configs:
      - targets: ["127.0.0.1:$mport_pull"]
        labels: {run: pull}
      - targets: ["127.0.0.1:$mport_push"]
        labels: {run: push}
EOF
"$prom" --config.file="$tmp/prom.yml" --storage.tsdb.path="$tmp/data" --web.listen-address="127.0.0.1:$pport" \
  --log.level=warn >"$tmp/prom.log" 2>&1 &
pids+=($!)
api="http://127.0.0.1:$pport"
end=$(($(now) + 60))
until curl -sf "$api/-/ready" >/dev/null; do
  [ "$(now)" -lt $end ] || fail "prometheus was not ready within 60 s"
  sleep 0.2
done

# The value of an instant query ("" while it has none).
query() {
  curl -sf "$api/api/v1/query" --data-urlencode "query=$1" | jq -r '.data.result[0].value[1] // ""'
}

# One run: mode, its metrics port, the role that moves data and its byte counter.
run() {
  local mode=$1 port=$2 mover=$3 bytes_metric=$4
  "$mh" --model tiny --no-progress --config "$cfg" --timeout 90 --mode "$mode" --requests 24 \
    --block-tokens 1 --num-blocks 512 --min-prompt 16 --max-prompt 64 \
    --metrics-port "$port" --metrics-linger 120 --json "$tmp/$mode.json" >"$tmp/$mode.out" 2>&1 &
  local pid=$!
  pids+=($pid)
  local end=$(($(now) + 120))
  until grep -q "/metrics on 127.0.0.1:$port" "$tmp/$mode.out"; do
    kill -0 $pid 2>/dev/null || fail "$mode: hixl-mock-host ended before serving its final metrics"
    [ "$(now)" -lt $end ] || fail "$mode: the run did not end within 120 s"
    sleep 0.2
  done
  [ "$(jq -r .pass "$tmp/$mode.json")" = true ] || fail "$mode: the run did not pass"
  local verified bytes
  verified=$(jq -r .verified "$tmp/$mode.json")
  bytes=$(jq -r .kv_bytes_verified "$tmp/$mode.json")
  [ "$verified" -eq 24 ] && [ "$bytes" -gt 0 ] || fail "$mode: verified $verified requests, $bytes bytes"
  # The text itself passes Prometheus's own checker (format; promtool's lint may add advice).
  if command -v promtool >/dev/null; then
    curl -sf "http://127.0.0.1:$port/metrics" >"$tmp/$mode.metrics"
    promtool check metrics <"$tmp/$mode.metrics" >"$tmp/$mode.promtool" 2>&1 || true
    ! grep -qiE "error|parse" "$tmp/$mode.promtool" || fail "$mode: promtool: $(cat "$tmp/$mode.promtool")"
  fi
  local sel="{run=\"$mode\",role=\"$mover\"}" count="" moved=""
  end=$(($(now) + 60))
  while :; do
    count=$(query "sum(hixl_kv_transfer_seconds_count{run=\"$mode\"})") # every role: only the mover times
    moved=$(query "sum(${bytes_metric}$sel)")
    [ "$count" = "$verified" ] && [ "$moved" = "$bytes" ] && break
    [ "$(now)" -lt $end ] ||
      fail "$mode: prometheus says $count transfers and $moved bytes; the host verified $verified and $bytes"
    sleep 0.2
  done
  [ "$(query "sum(hixl_kv_failures_total{run=\"$mode\"})")" = 0 ] || fail "$mode: failures counted"
  [ "$(query "up{run=\"$mode\"}")" = 1 ] || fail "$mode: target not up"
  echo "test_prometheus: $mode: prometheus scraped $count transfers and $moved bytes = $verified requests, $bytes bytes verified"
  kill -TERM $pid
  wait $pid || fail "$mode: hixl-mock-host exited with status $?"
}

run pull "$mport_pull" consumer hixl_kv_bytes_loaded_total
run push "$mport_push" producer hixl_kv_bytes_pushed_total
echo "test_prometheus: ok"
