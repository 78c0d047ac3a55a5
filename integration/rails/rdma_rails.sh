#!/usr/bin/env bash
# rdma_rails.sh BUILD_DIR: RDMA rails, for real, inside the soft-RoCE guest (run by
# integration/rxe-vm/run-rdma-tests.sh). Two rails, each a veth pair with an rxe device
# on both ends (rxr0a/rxr0b on 10.77.20.1/.2, rxr1a/rxr1b on 10.77.21.1/.2), and policy
# routing so that traffic between the ends really crosses the veth (else Linux routes
# it via lo and rxe drops it). The target engine is on the b ends, the initiator on the
# a ends, each with Rails naming its two addresses and Transport rdma: each rail's link
# is a QP on that rail's device, with the keys of that device.
#
#   stripe    4 MiB READs, then 4 MiB WRITEs (each read back): every byte checked, both
#             rails carried bytes, and both rails' rxe devices sent RoCE packets (their
#             hardware counters), so the data went by the QPs of both devices; and
#             rail 1's RoCE packets carry RdmaTrafficClass as their TOS (tcpdump).
#   linkdown  READs in a loop, the default QP timeout and retries; rail 1's veth is set
#             down: the rail is out within PORT_OUT_MS (the port event, or a local QP
#             error when rxe cannot send, whichever comes first),
#             its work requests are posted again on rail 0, no read fails, none takes
#             longer than BOUND_MS; the veth set up: the rail is dialled again (its QP
#             rebuilt on its device) and carries bytes again.
#   portevent the initiator held (nothing in flight) when rail 1's veth goes down: no
#             work request can fail, so the port's async event (IBV_EVENT_PORT_ERR) is
#             what takes the idle rail out, within PORT_OUT_MS, its reason saying so;
#             the veth up, the rail comes back, and carries bytes once the reads resume.
#   blackhole every RoCE packet of rail 1 dropped (iptables), its link up: no port event,
#             the QP's retries run out (RdmaTimeout 16, RdmaRetryCount 3: about 1 s),
#             the rail is taken out and its work goes to rail 0; no read fails; the
#             rules removed, the rail carries bytes again.
#   loss      1% of the RoCE packets each end of rail 1 receives dropped (iptables) while
#             READs run: every read verified, the slowest bounded (LOSS_BOUND_MS).
#   handoff   hixl-mock-host over the rails (pull, 32 requests); rail 1's veth set down
#             mid-hand-off and up again: every request verified byte for byte, none
#             failed, 0 blocks held by either side, the slowest bounded, rail 1's devices
#             carry packets again after.
#   devdel    hixl-mock-host over the rails (24 requests); rail 1's rxe device at the
#             prefill end is deleted (`rdma link delete`) mid-hand-off: every request
#             verified, 0 blocks held, and what the kernel did printed (this guest's rxe
#             waits for the device's users to close it); the device added again carries
#             a new hand-off (8 requests).
#
# Every wait polls a condition with a deadline. Root in the guest; exits 77 outside it.
set -euo pipefail
build=$(cd "${1:?usage: rdma_rails.sh BUILD_DIR [CASES...]}" && pwd)
shift
cases=${*:-stripe linkdown}
BENCH=$build/integration/bench/hixl-rails-bench
SCALE=${RAILS_TIME_SCALE:-1}
BOUND_MS=${BOUND_MS:-$((20000 * SCALE))} # a 4 MiB read under emulation, a failover in it
# port down to rail out: half of what the default QP retries take (30 s). The kernel sends
# port events through a work queue: measured in this guest under CI's load, about 5 s
# after the link went down, to both engines at once (1.3 s on a quiet host).
PORT_OUT_MS=${PORT_OUT_MS:-$((15000 * SCALE))}
# a 4 MiB read whose rail 1 chunks lose packets: rxe resends a lost packet only at its
# ack timeout, and hixl does not move a slow chunk (only a failed rail's)
LOSS_BOUND_MS=${LOSS_BOUND_MS:-$((60000 * SCALE))}
PROBE_MS=300
PORT=$((21000 + $$ % 20000))
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root"; exit 77; }
for t in rdma jq tcpdump; do command -v $t >/dev/null || { echo "SKIP: needs $t"; exit 77; }; done
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=poll.sh
. "$here/poll.sh" # now_ms, num, str, until_true (the initiator's stats file)
export WAIT_SCALE=$SCALE
export HIXL_LOG_LEVEL=${HIXL_LOG_LEVEL:-warn} # the engines' warnings (a port event) in their .err files
work=$(mktemp -d)
tpid=
ipid=
fail() {
  echo "rdma_rails FAIL: $*"
  for f in ini.err tgt.err; do [ -s "$work/$f" ] && { echo "-- $f:"; tail -25 "$work/$f"; }; done
  mkdir -p "$build/rdma-rails-fail" && cp "$work"/*.err "$work"/*.out "$build/rdma-rails-fail/" 2>/dev/null
  echo "(the processes' whole output: $build/rdma-rails-fail)"
  exit 1
}
cleanup() {
  set +e
  [ -n "$ipid" ] && kill -KILL "$ipid" 2>/dev/null && wait "$ipid" 2>/dev/null
  [ -n "$tpid" ] && kill -KILL "$tpid" 2>/dev/null && wait "$tpid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# ---- the rails: RAILS_N (default 2; the bench makes 4) ----
NR=${RAILS_N:-2}
[ "$NR" -ge 2 ] && [ "$NR" -le 8 ] || fail "RAILS_N is 2 to 8"
devs=()
# list SIDE N: the first N rails' addresses of side a (.1) or b (.2), comma-separated
list() { local i out=; for ((i = 0; i < $2; i++)); do out+=${out:+,}10.77.2$i.$([ "$1" = a ] && echo 1 || echo 2); done; echo "$out"; }
modprobe veth
sysctl -qw net.core.netdev_max_backlog=65536 # see tos-on-wire.sh: no drops in the veth's backlog
sysctl -qw net.ipv4.conf.all.accept_local=1 net.ipv4.conf.all.rp_filter=0
# The rules read once into a variable: `ip rule show | grep -q` under pipefail fails when
# grep has matched and gone before ip's next write (SIGPIPE; ip flushes each rule), and
# the rule that exists is then added again: "RTNETLINK answers: File exists" (a CI run).
rules=$(ip rule show)
grep -q '^1000:' <<<"$rules" || ip rule add pref 1000 lookup local
ip rule del pref 0 2>/dev/null || true
rules=$(ip rule show)
grep -q '^20:.*127.0.0.0/8' <<<"$rules" || ip rule add pref 20 to 127.0.0.0/8 lookup local
grep -q '^30:.*lookup 100' <<<"$rules" || ip rule add pref 30 lookup 100
for ((i = 0; i < 8; i++)); do # a bed left by an earlier run in this guest goes first
  ip link show rxr${i}a >/dev/null 2>&1 || continue
  rdma link delete rxr${i}a 2>/dev/null || true
  rdma link delete rxr${i}b 2>/dev/null || true
  ip link del rxr${i}a
done
for ((i = 0; i < NR; i++)); do
  a=rxr${i}a b=rxr${i}b ipa=10.77.2$i.1 ipb=10.77.2$i.2
  ip link add $a type veth peer name $b
  ip addr add $ipa/24 dev $a
  ip addr add $ipb/24 dev $b
  ip link set $a up
  ip link set $b up
  for d in $a $b; do sysctl -qw net.ipv4.conf.$d.accept_local=1 net.ipv4.conf.$d.rp_filter=0; done
  ip rule add pref 10 iif $a lookup local
  ip rule add pref 10 iif $b lookup local
  ip route add $ipb/32 dev $a src $ipa table 100
  ip route add $ipa/32 dev $b src $ipb table 100
  rdma link add $a type rxe netdev $a
  rdma link add $b type rxe netdev $b
  devs+=($a $b)
done
deadline=$(($(now_ms) + 20000))
for d in "${devs[@]}"; do
  until rdma link show $d/1 | grep -q 'state ACTIVE'; do
    [ "$(now_ms)" -lt "$deadline" ] || fail "rxe device $d is not ACTIVE"
    sleep 0.1
  done
done
sent() { cat /sys/class/infiniband/$1/ports/1/hw_counters/sent_pkts; }


RDMA_OPTS=(--transport rdma --probe-ms $PROBE_MS)
# linkdown: a QP gives up after about 1 s of retries (RdmaTimeout 16: 268 ms, 3 retries);
# elsewhere the defaults (4 s, 7 retries): an emulated rxe can take 100 ms to answer.
FAST_FAIL=(--opt RdmaTimeout=16 --opt RdmaRetryCount=3)
target_up() {
  rm -f "$work/ready"
  PORT=$((PORT + 1))
  taskset -c 0 "$BENCH" --role target --listen "10.77.20.2:$PORT" --rails "$(list b "$NR")" --buf-size 64MiB \
    --ready-file "$work/ready" "${RDMA_OPTS[@]}" >"$work/tgt.out" 2>"$work/tgt.err" &
  tpid=$!
  until_true 30 "the target ready" '[ -s "$work/ready" ] || ! kill -0 "$tpid" 2>/dev/null'
  [ -s "$work/ready" ] || fail "the target exited"
}
target_down() {
  kill -TERM "$tpid" 2>/dev/null || true
  wait "$tpid" 2>/dev/null || true
  tpid=
}
# [USE=N] initiator ARGS...: the bench in place of the (sub)shell that calls it, so that
# $! of `initiator ... &` is its pid; in the foreground: `(initiator ...)`. USE: its
# rails (default 2; 1: the engine without Rails). Results in $work/result.json, its
# state as it runs in $work/stats.json.
initiator() {
  local use=${USE:-2} rails=()
  [ "$use" -eq 1 ] || rails=(--rails "$(list a "$use")" --expect-rails "$use")
  rm -f "$work/result.json" "$work/stats.json"
  exec taskset -c 0 "$BENCH" --role initiator --connect "10.77.20.2:$PORT" --local 10.77.20.1 "${rails[@]}" \
    --op-size 4MiB --depth "${DEPTH:-2}" "${RDMA_OPTS[@]}" --stats-file "$work/stats.json" \
    --json "$work/result.json" --no-progress "$@" >"$work/ini.out" 2>"$work/ini.err"
}
check_result() { # what
  local res ops verified
  res=$(cat "$work/result.json")
  [ "$(jq -r .pass <<<"$res")" = true ] || fail "$1: the run did not pass: $res"
  ops=$(jq -r .ops <<<"$res")
  verified=$(jq -r .verified_bytes <<<"$res")
  [ "$verified" -eq $((ops * 4194304)) ] || fail "$1: verified $verified bytes of $ops ops"
  echo "$1: $ops ops of 4 MiB verified byte for byte; slowest $(jq -r .lat_ms_max <<<"$res") ms;" \
    "rails $(jq -c '[.rails[] | {rail, state, bytes, failures, retried}]' <<<"$res")"
}
MH=$build/integration/mock-host/hixl-mock-host
# rail_pkts RAIL: RoCE packets the decode / initiator end of the rail sent and received
rail_pkts() { echo $(($(sent rxr${1}a) + $(cat /sys/class/infiniband/rxr${1}a/ports/1/hw_counters/rcvd_pkts))); }
# roce_drop -I|-D [PROBABILITY]: add (-I) or remove (-D) the rules that drop the RoCE
# packets each end of rail 1 receives: all of them, or at random with PROBABILITY
roce_drop() {
  local d stat=()
  [ -z "${2:-}" ] || stat=(-m statistic --mode random --probability "$2")
  for d in rxr1a rxr1b; do iptables "$1" INPUT -i $d -p udp --dport 4791 "${stat[@]}" -j DROP || return 1; done
}
# roce_dropped: packets the random-drop rules dropped so far
roce_dropped() { iptables -L INPUT -v -x -n | awk '/statistic/ { s += $1 } END { print s + 0 }'; }
# mh_start N [ARGS...]: hixl-mock-host in the background ($ipid) over the rails: pull, N
# requests of 64 to 256 tokens (the emulated rxe moves about 0.15 Gbit/s), prefill on the
# b ends, decode on the a ends, each instance's Rails its own addresses, Transport rdma.
# A load's timeout is 60 s, not the plugin's 1 s: under CI's load a pull of 256 ops in
# this emulated guest took over 1 s on a healthy rail (stop 38's devdel); the cases check
# their own bounds on the slowest hand-off.
mh_start() {
  local n=$1
  shift
  PORT=$((PORT + 2))
  taskset -c 0 "$MH" --requests "$n" --min-prompt 64 --max-prompt 256 --transport rdma --on-load-failure fail \
    --prefill-addr "10.77.20.2:$PORT" --decode-addr "10.77.20.1:$((PORT + 1))" \
    --prefill-set "Rails=\"$(list b "$NR")\"" --decode-set "Rails=\"$(list a "$NR")\"" \
    --set "RailProbeMs=\"$PROBE_MS\"" --set transfer_timeout_ms=$((60000 * SCALE)) --timeout $((600 * SCALE)) --no-progress --json "$work/mh.json" "$@" \
    >"$work/ini.out" 2>"$work/ini.err" &
  ipid=$!
}
# mh_check WHAT N: it exits 0 with all N requests verified byte for byte, none failed or
# recomputed, 0 blocks held at the end by either side
mh_check() {
  reap_initiator 600 "$1: the mock host finishing"
  [ "$reaped_rc" -eq 0 ] || fail "$1: hixl-mock-host exited $reaped_rc: $(tail -5 "$work/ini.out")"
  jq -e --argjson n "$2" '.pass and .verified == $n and .failed == 0 and .recomputed == 0 and .corrupt == 0 and
      .prefill.blocks_held == 0 and .decode.blocks_held == 0' "$work/mh.json" >/dev/null ||
    fail "$1: $(cat "$work/mh.json")"
}

for c in $cases; do
  case $c in
  stripe)
    target_up
    # Rail 1's packets must carry the traffic class too (RdmaTrafficClass 132: TOS 0x84).
    tcpdump -i rxr1a -nn -v -l -c 40 'udp port 4791' >"$work/tos" 2>"$work/tos.err" &
    dump=$!
    until_true 10 "tcpdump listening" 'grep -qs "listening on" "$work/tos.err"'
    for dir in read write; do
      a0=$(sent rxr0a) a1=$(sent rxr1a) b0=$(sent rxr0b) b1=$(sent rxr1b)
      (initiator --$dir --ops 24) || fail "stripe $dir: the initiator failed (rc $?)"
      check_result "stripe $dir"
      jq -e '[.rails[] | select(.state == "up" and .bytes >= 16777216)] | length == 2' "$work/result.json" \
        >/dev/null || fail "stripe $dir: not both rails carried 16 MiB"
      d0=$(($(sent rxr0a) - a0 + $(sent rxr0b) - b0)) d1=$(($(sent rxr1a) - a1 + $(sent rxr1b) - b1))
      echo "stripe $dir: RoCE packets sent on rail 0's devices $d0, on rail 1's $d1"
      [ "$d0" -gt 4096 ] && [ "$d1" -gt 4096 ] || fail "stripe $dir: a rail's rxe devices sent (almost) nothing"
    done
    target_down
    kill "$dump" 2>/dev/null || true
    wait "$dump" 2>/dev/null || true
    total=$(grep -c 'proto UDP' "$work/tos" || true)
    good=$(grep 'proto UDP' "$work/tos" | grep -c 'tos 0x84' || true)
    echo "stripe: $good of $total RoCE packets on rail 1's veth carry TOS 0x84 (RdmaTrafficClass 132)"
    [ "$total" -ge 20 ] && [ "$good" -eq "$total" ] || fail "stripe: rail 1's QPs do not carry the traffic class"
    echo "stripe: PASS"
    ;;
  linkdown | blackhole)
    # linkdown: the default QP timeout and retries (about 30 s to fail a QP by its
    # retries); the rail must be out within PORT_OUT_MS. blackhole: the link stays up, so
    # the QP's retries (made short) are what fail it.
    # fault -I|-D: rail 1's fault begins or ends
    fault() {
      if [ "$c" = linkdown ]; then
        ip link set rxr1a "$([ "$1" = -I ] && echo down || echo up)"
      else
        roce_drop "$1"
      fi
    }
    fast=()
    [ "$c" = linkdown ] || fast=("${FAST_FAIL[@]}")
    target_up
    initiator --read --seconds 600 "${fast[@]}" &
    ipid=$!
    until_true 60 "both rails carrying bytes" '[ "$(num ".rails[0].bytes")" -gt 16777216 ] && [ "$(num ".rails[1].bytes")" -gt 16777216 ]'
    fault -I
    t_down=$(now_ms)
    ops_down=$(num .ops)
    until_true 60 "rail 1 taken out (down, failures > 0)" \
      '[ "$(str ".rails[1].state")" = down ] && [ "$(num ".rails[1].failures")" -gt 0 ]'
    out_ms=$(($(now_ms) - t_down))
    echo "$c: rail 1 down $out_ms ms after its fault: $(jq -c ".rails[1]" "$work/stats.json")"
    if [ "$c" = linkdown ]; then
      [ "$out_ms" -le "$PORT_OUT_MS" ] || fail "linkdown: rail 1 out after $out_ms ms > $PORT_OUT_MS ms"
    fi
    until_true 60 "reads going on over rail 0 alone (8 ops)" '[ "$(num .ops)" -gt $((ops_down + 8)) ]'
    fault -D
    t_up=$(now_ms)
    bytes_up=$(num ".rails[1].bytes")
    until_true 60 "rail 1 up again and carrying bytes" \
      '[ "$(str ".rails[1].state")" = up ] && [ "$(num ".rails[1].bytes")" -gt $((bytes_up + 8388608)) ]'
    echo "$c: rail 1 up and carrying bytes again $(($(now_ms) - t_up)) ms after its fault ended (RailProbeMs $PROBE_MS)"
    stop_initiator 60
    check_result "$c"
    jq -e '.rails[1].failures > 0 and .rails[1].state == "up"' "$work/result.json" >/dev/null ||
      fail "$c: the final counters do not show the failure and the return"
    max_ms=$(jq -r .lat_ms_max "$work/result.json")
    python3 -c "import sys; sys.exit(not $max_ms <= $BOUND_MS)" || fail "$c: a read took $max_ms ms > $BOUND_MS ms"
    target_down
    echo "$c: PASS (slowest read $max_ms ms, bound $BOUND_MS ms)"
    ;;
  portevent)
    target_up
    initiator --read --seconds 600 &
    ipid=$!
    until_true 60 "both rails carrying bytes" '[ "$(num ".rails[0].bytes")" -gt 8388608 ] && [ "$(num ".rails[1].bytes")" -gt 8388608 ]'
    kill -USR1 "$ipid"
    until_true 60 "the initiator held, nothing in flight" '[ "$(str .phase)" = held ]'
    ip link set rxr1a down
    t_down=$(now_ms)
    until_true 60 "idle rail 1 taken out" '[ "$(str ".rails[1].state")" = down ]'
    out_ms=$(($(now_ms) - t_down))
    why=$(str ".rails[1].last_down")
    echo "portevent: idle rail 1 out $out_ms ms after its veth went down: $why"
    case $why in *"port error"*) ;; *) fail "portevent: rail 1 went down for another reason: $why" ;; esac
    [ "$out_ms" -le "$PORT_OUT_MS" ] || fail "portevent: rail 1 out after $out_ms ms > $PORT_OUT_MS ms"
    ip link set rxr1a up
    t_up=$(now_ms)
    until_true 60 "rail 1 up again" '[ "$(str ".rails[1].state")" = up ]'
    echo "portevent: rail 1 up again $(($(now_ms) - t_up)) ms after its veth"
    kill -USR2 "$ipid"
    bytes_up=$(num ".rails[1].bytes")
    until_true 60 "rail 1 carrying bytes again" '[ "$(num ".rails[1].bytes")" -gt $((bytes_up + 8388608)) ]'
    stop_initiator 60
    check_result portevent
    target_down
    echo "portevent: PASS"
    ;;
  devdel)
    # rxe in this guest kernel has no way to take a device from a process using it
    # (no disassociate_ucontext), and sends no event for it: `rdma link delete` waits,
    # in the kernel, until every process closed the device. So the delete runs in the
    # background while hand-offs go on; what happens is measured and printed. Every
    # request verified, 0 blocks held; the delete ends once the engines closed the
    # device; the device added again carries a new hand-off.
    mh_start 24
    p1=$(rail_pkts 1)
    until_true 120 "rail 1 carrying the hand-off (4000 packets)" '[ "$(rail_pkts 1)" -gt $((p1 + 4000)) ]'
    t0=$(now_ms)
    rdma link delete rxr1b &
    dpid=$!
    p1=$(rail_pkts 1)
    until_true 120 "the hand-off going on while rxr1b is being deleted" \
      '! kill -0 "$dpid" 2>/dev/null || [ "$(rail_pkts 1)" -gt $((p1 + 4000)) ]'
    if kill -0 "$dpid" 2>/dev/null; then
      echo "devdel: $(($(now_ms) - t0)) ms into the delete of rxr1b it still waits for its users; rail 1 carried 4000 packets more meanwhile"
    else
      echo "devdel: rxr1b deleted in $(($(now_ms) - t0)) ms while in use"
    fi
    mh_check devdel 24
    echo "devdel: 24 requests verified byte for byte, 0 blocks held, p99 hand-off $(jq -r .handoff_ms_p99 "$work/mh.json") ms ($(($(now_ms) - t0)) ms after the delete began)"
    deadline=$(($(now_ms) + 30000))
    while kill -0 "$dpid" 2>/dev/null; do
      [ "$(now_ms)" -lt "$deadline" ] || fail "devdel: rxr1b not deleted 30 s after the engines closed it"
      sleep 0.1
    done
    echo "devdel: rxr1b deleted $(($(now_ms) - t0)) ms after the delete began (the engines had closed it)"
    rdma link add rxr1b type rxe netdev rxr1b
    until_true 20 "rxr1b ACTIVE again" 'rdma link show rxr1b/1 | grep -q "state ACTIVE"'
    b1=$(sent rxr1b)
    mh_start 8
    mh_check "devdel, rxr1b added again" 8
    n=$(($(sent rxr1b) - b1))
    echo "devdel: rxr1b added again: a new hand-off, 8 requests verified, sent $n RoCE packets on it"
    [ "$n" -gt 1000 ] || fail "devdel: the re-added rxr1b carried (almost) nothing"
    echo "devdel: PASS"
    ;;
  bench)
    # Striping's gain under emulation, next to perftest on the same devices in the same
    # guest: hixl with one rail (no Rails), two, and RAILS_N when that is more; 4 MiB
    # READs and WRITEs; ib_read_bw / ib_write_bw over the same number of device pairs
    # at once (summed). Every process pinned to CPU 0, as in the other cases. A table,
    # and one JSON line per op and rail count to BENCH_OUT.
    out=${BENCH_OUT:-$build/rdma-rails-bench.json}
    rm -f "$out"
    ops=${BENCH_OPS:-24}
    rate=${BENCH_RATE:-15mbit}
    export DEPTH=${BENCH_DEPTH:-4}
    counts="1 2"
    [ "$NR" -le 2 ] || counts="1 2 $NR"
    declare -A hx ref
    # The guest's own ceiling, measured first and unshaped: READs and WRITEs over every
    # rail at once. The emulated CPUs bound it; the shaped rails' sum must stay under it
    # for their ratio to be the rails' and not the guest's.
    target_up
    for dir in read write; do
      (USE=$NR initiator --$dir --ops "$ops") || fail "bench: hixl $dir over $NR unshaped rails"
      hx[cap$dir]=$(jq -r .gbps "$work/result.json")
      echo "bench: the guest's ceiling, hixl $dir over $NR unshaped rails: ${hx[cap$dir]} Gbit/s" >&2
    done
    target_down
    # Each veth end shaped to RATE (tbf) so the rails, not the emulated CPU, bound the
    # throughput. rxe stops a QP at 64 packets in the stack, so the queue stays short in
    # time; its limit is still held to 2 s of the rate, under RC's ack timeout (4 s).
    if [ "$rate" != none ]; then
      bps=$(python3 -c 'import re, sys
m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", sys.argv[1])
print(int(float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[2]])) if m else print(0)' "$rate")
      [ "$bps" -gt 0 ] || fail "bench: BENCH_RATE $rate is not N[k|m|g]bit"
      for d in "${devs[@]}"; do
        tc qdisc replace dev "$d" root tbf rate "$rate" burst 64kb limit $((bps / 4)) || fail "bench: tbf on $d"
      done
    fi
    target_up
    for dir in read write; do
      for n in $counts; do
        (USE=$n initiator --$dir --ops "$ops") || fail "bench: hixl $dir over $n rails"
        hx[$dir$n]=$(jq -r .gbps "$work/result.json")
        echo "bench: hixl $dir over $n rail(s): ${hx[$dir$n]} Gbit/s" >&2
      done
    done
    target_down
    # The P/D hand-off (hixl-mock-host, pull, 8 requests of 32 to 64 tokens) over the
    # same rails: its transfers' own rate (handoff_gb_per_s), one rail being no Rails.
    for n in $counts; do
      PORT=$((PORT + 2))
      mhrails=()
      [ "$n" -eq 1 ] || mhrails=(--prefill-set "Rails=\"$(list b "$n")\"" --decode-set "Rails=\"$(list a "$n")\"")
      # one rail at RATE moves a 64-token request (8 MiB) in seconds: the loads' timeout and
      # the lease are raised so that a request waiting behind others does not time out
      taskset -c 0 "$MH" --requests 8 --min-prompt 32 --max-prompt 64 --concurrency 2 --transport rdma \
        --on-load-failure fail --lease-ms 300000 --set transfer_timeout_ms=240000 \
        --prefill-addr "10.77.20.2:$PORT" --decode-addr "10.77.20.1:$((PORT + 1))" "${mhrails[@]}" \
        --timeout 900 --no-progress --json "$work/mh.json" >"$work/mh.out" 2>&1 ||
        fail "bench: the hand-off over $n rails: $(tail -5 "$work/mh.out")"
      jq -e '.pass and .failed == 0 and .prefill.blocks_held == 0 and .decode.blocks_held == 0' "$work/mh.json" \
        >/dev/null || fail "bench: the hand-off over $n rails: $(cat "$work/mh.json")"
      hx[handoff$n]=$(jq -r '.handoff_gb_per_s * 8' "$work/mh.json")
      echo "bench: hixl hand-off over $n rail(s): ${hx[handoff$n]} Gbit/s" >&2
    done
    pt() { # tool rail port: Gbit/s of one perftest pair on rail's devices
      local i=0
      # -u 18: a QP timeout of 1 s, not perftest's 67 ms, which an emulated guest running
      # several pairs on one CPU overruns (its four READ pairs collapsed with it)
      taskset -c 0 "$1" -d "rxr${2}b" -x 1 -F --report_gbits -s 4194304 -n 16 -t "$DEPTH" -u 18 -p "$3" \
        >"$work/pt_s_$3" 2>&1 &
      local spid=$!
      until taskset -c 0 "$1" -d "rxr${2}a" -x 1 -F --report_gbits -s 4194304 -n 16 -t "$DEPTH" -u 18 -p "$3" "10.77.2$2.2" \
        >"$work/pt_c_$3" 2>&1; do
        i=$((i + 1))
        [ $i -lt 20 ] || { wait $spid; fail "bench: $1 on rail $2 did not connect"; }
        sleep 0.2
      done
      wait $spid || true
      awk '$1 == 4194304 { print $4 }' "$work/pt_c_$3"
    }
    for dir in read write; do
      for n in $counts; do
        pids=()
        for ((k = 0; k < n; k++)); do
          pt "ib_${dir}_bw" "$k" $((PORT + 20 + k)) >"$work/pt_$k" &
          pids+=($!)
        done
        wait "${pids[@]}"
        ref[$dir$n]=$(cat "$work"/pt_[0-9]* | awk -v n="$n" 'NR <= n { s += $1 } END { printf "%.4f", s }')
        rm -f "$work"/pt_[0-9]*
        echo "bench: perftest $dir over $n rail(s): ${ref[$dir$n]} Gbit/s" >&2
      done
    done
    [ "$rate" = none ] || for d in "${devs[@]}"; do tc qdisc del dev "$d" root; done
    echo "bench: rails shaped to $rate each (tbf), $ops ops of 4 MiB per run, depth $DEPTH, CPU 0"
    echo "| op | rails | hixl Gbit/s | hixl vs 1 rail | perftest Gbit/s | perftest vs 1 rail | hixl / perftest |"
    echo "|---|---|---|---|---|---|---|"
    for dir in read write; do
      python3 - "$dir" "$NR" "${hx[cap$dir]}" "$out" <<'PY'
import json, sys
d, n, g, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
print(f"| {d.upper()} 4 MiB, unshaped: the guest's ceiling | {n} | {g:.4f} | | | | |")
with open(out, "a") as f:
    f.write(json.dumps({"bench": "rdma_rails", "op": d + "_ceiling", "rails": n, "hixl_gbps": g}) + "\n")
PY
    done
    for n in $counts; do
      python3 - "$n" "${hx[handoff1]}" "${hx[handoff$n]}" "$out" <<'PY'
import json, sys
n, h1, h, out = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
print(f"| P/D hand-off | {n} | {h:.4f} | {h / h1:.2f}x | | | |")
with open(out, "a") as f:
    f.write(json.dumps({"bench": "rdma_rails", "op": "handoff", "rails": n, "hixl_gbps": h,
                        "hixl_vs_1": h / h1}) + "\n")
PY
    done
    for dir in read write; do
      for n in $counts; do
        python3 - "$dir" "$n" "${hx[${dir}1]}" "${hx[$dir$n]}" "${ref[${dir}1]}" "${ref[$dir$n]}" "$out" <<'PY'
import json, sys
d, n, h1, h, p1, p, out = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:7]), sys.argv[7]
print(f"| {d.upper()} 4 MiB | {n} | {h:.4f} | {h / h1:.2f}x | {p:.4f} | {p / p1:.2f}x | {h / p:.2f} |")
with open(out, "a") as f:
    f.write(json.dumps({"bench": "rdma_rails", "op": d, "rails": n, "hixl_gbps": h, "hixl_vs_1": h / h1,
                        "perftest_gbps": p, "perftest_vs_1": p / p1}) + "\n")
PY
      done
    done
    ;;
  loss)
    # 1% of the RoCE packets arriving at each end of rail 1 dropped (iptables' statistic
    # match) while READs run: RC retransmits them; should rail 1's QP run out of retries,
    # it is taken out and its work goes to rail 0. Every read verified, none failed, the
    # slowest printed and bounded.
    command -v iptables >/dev/null || { echo "loss: SKIP (no iptables)"; continue; }
    roce_drop -I 0.01 || fail "loss: iptables cannot drop 1% here"
    target_up
    # rxe recovers a lost packet by its ack timeout: RdmaTimeout 16 (268 ms), not 4 s
    # (measured: slowest read 16.7 s of 22, 3339 packets dropped): bound LOSS_BOUND_MS.
    initiator --read --seconds 600 --opt RdmaTimeout=16 --timeout-ms $((90000 * SCALE)) &
    ipid=$!
    until_true 60 "both rails carrying bytes" '[ "$(num ".rails[0].bytes")" -gt 8388608 ] && [ "$(num ".rails[1].bytes")" -gt 8388608 ]'
    ops0=$(num .ops)
    until_true 180 "16 reads under 1% loss on rail 1" '[ "$(num .ops)" -ge $((ops0 + 16)) ]'
    dropped=$(roce_dropped)
    roce_drop -D 0.01
    stop_initiator 60
    check_result loss
    [ "$dropped" -gt 0 ] || fail "loss: the rules dropped no packet"
    max_ms=$(jq -r .lat_ms_max "$work/result.json")
    echo "loss: $dropped RoCE packets dropped on rail 1; rail 1: $(jq -c '.rails[1] | {state, bytes, failures, retried}' "$work/result.json")"
    python3 -c "import sys; sys.exit(not $max_ms <= $LOSS_BOUND_MS)" || fail "loss: a read took $max_ms ms > $LOSS_BOUND_MS ms"
    target_down
    echo "loss: PASS (slowest read $max_ms ms, bound $LOSS_BOUND_MS ms)"
    ;;
  handoff)
    # The P/D hand-off over RDMA rails: hixl-mock-host, prefill on the b ends, decode on
    # the a ends, each instance's Rails its own addresses, Transport rdma; small prompts
    # (the emulated rxe moves about 0.15 Gbit/s). Mid-run rail 1's veth goes down (the
    # port event takes the rail out) and comes up again. Every request verified byte for
    # byte, none failed or recomputed, 0 blocks held at the end by either side, the
    # slowest within HANDOFF_BOUND_MS, every rail's devices sent RoCE packets, and rail
    # 1's again after its veth came back.
    HANDOFF_BOUND_MS=${HANDOFF_BOUND_MS:-$((60000 * SCALE))} # a hand-off with a loss in it: LOSS_BOUND_MS
    declare -A before
    for d in "${devs[@]}"; do before[$d]=$(sent "$d"); done
    # under 1% loss each lost packet waits out the QP's ack timeout (RdmaTimeout 16:
    # 268 ms, not 4 s); mh_start's load timeout covers it, the bound is what is checked
    mh_start 48 --set RdmaTimeout=16
    p1=$(rail_pkts 1)
    until_true 120 "rail 1 carrying the hand-off (4000 packets)" '[ "$(rail_pkts 1)" -gt $((p1 + 4000)) ]'
    ip link set rxr1a down
    t_down=$(now_ms)
    p0=$(rail_pkts 0)
    until_true 60 "rail 0 carrying the hand-off alone (8000 packets more)" '[ "$(rail_pkts 0)" -gt $((p0 + 8000)) ]'
    echo "handoff: rail 0 sent 8000 packets more $(($(now_ms) - t_down)) ms after rail 1's veth went down"
    ip link set rxr1a up
    t_up=$(now_ms)
    p1=$(rail_pkts 1)
    until_true 120 "rail 1 carrying the hand-off again (4000 packets)" '[ "$(rail_pkts 1)" -gt $((p1 + 4000)) ]'
    echo "handoff: rail 1 carrying the hand-off again $(($(now_ms) - t_up)) ms after its veth came up"
    # then 1% of rail 1's RoCE packets lost while it carries 8000 more
    roce_drop -I 0.01
    p1=$(rail_pkts 1)
    until_true 180 "rail 1 carrying the hand-off under 1% loss (8000 packets)" '[ "$(rail_pkts 1)" -gt $((p1 + 8000)) ]'
    dropped=$(roce_dropped)
    roce_drop -D 0.01
    echo "handoff: 1% loss on rail 1 while it sent 8000 packets: $dropped dropped"
    [ "$dropped" -gt 0 ] || fail "handoff: the loss rules dropped no packet"
    mh_check handoff 48
    grep -q "port error" "$work/ini.err" || fail "handoff: no engine logged rail 1's port event"
    worst=$(jq -r .handoff_ms_p99 "$work/mh.json")
    line="handoff: 48 requests verified byte for byte, 0 blocks held, slowest $worst ms (bound $HANDOFF_BOUND_MS ms); RoCE packets sent:"
    for ((i = 0; i < NR; i++)); do
      n=$(($(sent rxr${i}a) - before[rxr${i}a] + $(sent rxr${i}b) - before[rxr${i}b]))
      line+=" rail $i $n"
      [ "$n" -gt 1000 ] || { echo "$line"; fail "handoff: rail $i's devices sent (almost) nothing"; }
    done
    echo "$line"
    python3 -c "import sys; sys.exit(not $worst <= $HANDOFF_BOUND_MS)" || fail "handoff: a hand-off took $worst ms"
    echo "handoff: PASS"
    ;;
  *) fail "unknown case $c" ;;
  esac
done
