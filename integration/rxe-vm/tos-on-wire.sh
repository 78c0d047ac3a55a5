#!/bin/sh
# Inside the soft-RoCE guest: two rxe devices on the ends of a veth pair, with policy
# routing so traffic between their addresses really crosses the veth (otherwise Linux
# routes it via lo and rxe drops it). hixl-bench then writes from an engine on rxea
# (10.77.1.1) to one on rxeb (10.77.1.2) with traffic class 104 (HCCL_RDMA_TC), while
# tcpdump watches the veth: every RoCE v2 packet must carry IP TOS 0x68 (= 104). Then
# test_rdma's QP-reset test runs across the veth, where netem can drop packets.
#   tos-on-wire.sh BUILD_DIR
set -eu
build=$1
modprobe veth
ip link add va type veth peer name vb
# No retransmissions on the veth: this guest kernel's rxe has answered a retried WRITE
# with "remote invalid request" (seen once in CI). They came from two sources, both
# measured with `rdma statistic`: the veth's receive backlog (1000) overflowing under
# rxe's bursts, and packets of one QP reordered because threads on two CPUs queued
# them to two CPUs' backlogs. A large backlog and one CPU (taskset) leave none.
sysctl -qw net.core.netdev_max_backlog=65536
ip addr add 10.77.1.1/24 dev va
ip addr add 10.77.1.2/24 dev vb
ip link set va up
ip link set vb up
for d in all va vb; do sysctl -qw net.ipv4.conf.$d.accept_local=1 net.ipv4.conf.$d.rp_filter=0; done
ip rule add pref 1000 lookup local
ip rule del pref 0
ip rule add pref 10 iif va lookup local
ip rule add pref 10 iif vb lookup local
ip rule add pref 20 to 127.0.0.0/8 lookup local
ip route add 10.77.1.2/32 dev va src 10.77.1.1 table 100
ip route add 10.77.1.1/32 dev vb src 10.77.1.2 table 100
ip rule add pref 30 lookup 100
rdma link add rxea type rxe netdev va
rdma link add rxeb type rxe netdev vb
out=$(mktemp)
# Only the pair test's link crosses to 10.77.1.2; other tests' links stay on rxea.
tcpdump -i va -nn -v -l 'udp port 4791 and host 10.77.1.2' > "$out" 2> "$out.err" &
dump=$!
i=0 # wait (at most 10 s) until tcpdump says it is capturing
until grep -qs 'listening on' "$out.err"; do
  i=$((i + 1))
  [ $i -le 100 ] || { echo "tos-on-wire: tcpdump did not start"; cat "$out.err"; exit 1; }
  sleep 0.1
done
rc=0
# hixl-bench WRITEs from rxea to rxeb; both engines take the class from HCCL_RDMA_TC.
HCCL_RDMA_TC=104 timeout 600 taskset -c 0 "$build/integration/bench/hixl-bench" --transport rdma --local 10.77.1.1 \
  --peer 10.77.1.2:$((20000 + $$ % 20000)) --op write --block-sizes 64K,1M --batch 8 --total 16M \
  --max-seconds 60 --no-progress > "$out.test" 2>&1 || rc=$?
kill $dump 2>/dev/null || true
wait $dump 2>/dev/null || true
tail -4 "$out.test"
echo "tos-on-wire: rxea $(rdma statistic show link rxea/1 | grep -o 'completer_retry_err [0-9]*'), rxeb $(rdma statistic show link rxeb/1 | grep -o 'out_of_seq_request [0-9]*')"
[ $rc -eq 0 ] || { echo "tos-on-wire: hixl-bench failed over the veth (rc $rc)"; cat "$out.test"; exit 1; }
total=$(grep -c 'proto UDP' "$out" || true)
good=$(grep 'proto UDP' "$out" | grep -c 'tos 0x68' || true)
echo "tos-on-wire: $good of $total RoCE v2 packets on the veth carry TOS 0x68 (RdmaTrafficClass 104)"
grep 'proto UDP' "$out" | grep -v 'tos 0x68' | head -3
[ "$total" -gt 50 ] && [ "$good" -eq "$total" ] || exit 1
# Across the same veth, netem can break the path (rxe passes packets between QPs of
# one device straight over): test_rdma's "timeout with WRs posted resets the QP".
HIXL_TEST_IP=10.77.1.1 HIXL_TEST_PEER_IP=10.77.1.2 HIXL_TEST_NETEM_DEV=va HIXL_REQUIRE_RDMA=1 \
  timeout 600 taskset -c 0 "$build/tests/test_rdma" > "$out.reset" 2>&1 || { cat "$out.reset"; exit 1; }
grep -E 'Test:|tests ' "$out.reset"
