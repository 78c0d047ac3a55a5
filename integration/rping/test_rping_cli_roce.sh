#!/usr/bin/env bash
# hixl-rping -m roce end to end on a real RDMA device (the soft-RoCE guest): a
# --serve -m roce responder on the device's address, then the table and JSON of probes
# over RoCE with a traffic class and service level, a target that serves over UDP only
# (exit 1, "no responder"), and what roce refuses (exit 2). Skips (77) without an RDMA
# device or HIXL_TEST_IP; with HIXL_REQUIRE_RDMA set that is a failure instead.
set -uo pipefail
bin=$1
ip=${HIXL_TEST_IP:-}
if [ -z "$ip" ] || [ -z "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
  echo "test_rping_cli_roce: needs an RDMA device and HIXL_TEST_IP (run it in the soft-RoCE guest)"
  [ -n "${HIXL_REQUIRE_RDMA:-}" ] && exit 1
  exit 77
fi
source "$(dirname "$0")/../cli_test.sh"

# Responders: one in mode roce on the RDMA address, one in mode udp on loopback. Each
# prints "ready DEVICE port PORT" once it answers; wait for that line.
serve() { # serve NAME ARGS...: start a responder; sets served_port
  local name=$1 ready _a _b p
  shift
  "$bin" --serve -q "$@" >"$work/$name.serve" 2>"$work/$name.serve.err" &
  pids+=($!)
  for _ in $(seq 600); do
    if read -r ready _a _b p <"$work/$name.serve" && [ "$ready" = ready ]; then
      served_port=$p
      return 0
    fi
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAIL the $name responder did not start"
  cat "$work/$name.serve.err"
  exit 1
}
serve roce -m roce -d "$ip" -p 0
port=$served_port
serve udp -m udp -d 127.0.0.1 -p 0
uport=$served_port
echo "roce responder on $ip:$port, udp responder on 127.0.0.1:$uport"

run table -q -m roce -d "$ip" -c 20 -i 1 -t 104 -s 3 -l 64 "$ip:$port"
check "table: exit 0" rc_is table 0
check "table: says RoCE, tc and sl" has table.out "^# from $ip over RoCE: 20 probes .* tc 104, sl 3$"
check "table: 20 sent, 20 received, ok" has table.out "^${ip//./\\.}:$port +20 +20 +0\.0 +[0-9]+ +[0-9]+ +[0-9]+ +ok$"
cat "$work/table.out"

run json -q --json -m roce -d "$ip" -c 5 -i 0 -t 184 "$ip:$port"
check "json: exit 0" rc_is json 0
check "json: mode roce, tc 184" has json.out '"mode": "roce".*"tc": 184'
check "json: 5 received" has json.out '"sent": 5, "received": 5'

run udp_only -q -m roce -d "$ip" -c 2 -w 2000 "127.0.0.1:$uport"
check "a udp responder, probed over roce: exit 1" rc_is udp_only 1
check "a udp responder: no responder" has udp_only.out "^127\.0\.0\.1:$uport +0 +0 +100\.0 +- +- +- +no responder$"
run udp_only_loud -m roce -d "$ip" -c 2 -w 2000 "127.0.0.1:$uport"
check "a udp responder: the reason on stderr" has udp_only_loud.err 'in mode UDP'

run srcport -q -m roce -d "$ip" -S 40000 "$ip:$port"
check "roce with --src-port: exit 2" rc_is srcport 2
check "roce with --src-port: says why" has srcport.err 'srcPort'
run bigpayload -q -m roce -d "$ip" -l 1500 "$ip:$port"
check "roce payload over the MTU: exit 2" rc_is bigpayload 2
check "roce payload over the MTU: says why" has bigpayload.err 'MTU'
run nodev -q -m roce -d 127.0.0.2 "$ip:$port"
check "roce from a non-RDMA address: exit 2" rc_is nodev 2
check "roce from a non-RDMA address: says why" has nodev.err 'no RDMA device owns 127\.0\.0\.2'

for name in roce udp; do
  kill -TERM "${pids[0]}"
  wait "${pids[0]}"
  rc=$?
  pids=("${pids[@]:1}")
  check "the $name responder exits 0 on SIGTERM" test "$rc" = 0
  [ "$rc" = 0 ] || cat "$work/$name.serve.err"
done

cli_done "hixl-rping -m roce"
