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
#             hardware counters), so the data went by the QPs of both devices.
#   linkdown  READs in a loop; rail 1's veth is set down: its QP fails (RdmaTimeout 16,
#             RdmaRetryCount 3: about 1 s of retries), the rail is taken out, its work
#             requests are posted again on rail 0, no read fails, none takes longer than
#             BOUND_MS; the veth set up: the rail is dialled again (its QP rebuilt on its
#             device) and carries bytes again.
#   devdel    READs in a loop; rail 1's rxe device at the target end is removed
#             (`rdma link delete`): the case is run and its outcome printed (see
#             docs/rails.md: whether the kernel lets a device in use go).
#
# Every wait polls a condition with a deadline. Root in the guest; exits 77 outside it.
set -euo pipefail
build=$(cd "${1:?usage: rdma_rails.sh BUILD_DIR [CASES...]}" && pwd)
shift
cases=${*:-stripe linkdown}
BENCH=$build/integration/bench/hixl-rails-bench
SCALE=${RAILS_TIME_SCALE:-1}
BOUND_MS=${BOUND_MS:-$((20000 * SCALE))} # a 4 MiB read under emulation, a failover in it
PROBE_MS=300
PORT=$((21000 + $$ % 20000))
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root"; exit 77; }
command -v rdma >/dev/null && command -v jq >/dev/null || { echo "SKIP: needs rdma (iproute2) and jq"; exit 77; }
now_ms() { date +%s%3N; }
work=$(mktemp -d)
tpid=
ipid=
fail() {
  echo "rdma_rails FAIL: $*"
  for f in ini.err tgt.err; do [ -s "$work/$f" ] && { echo "-- $f:"; tail -25 "$work/$f"; }; done
  exit 1
}
cleanup() {
  set +e
  [ -n "$ipid" ] && kill -KILL "$ipid" 2>/dev/null && wait "$ipid" 2>/dev/null
  [ -n "$tpid" ] && kill -KILL "$tpid" 2>/dev/null && wait "$tpid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# ---- the two rails ----
modprobe veth
sysctl -qw net.core.netdev_max_backlog=65536 # see tos-on-wire.sh: no drops in the veth's backlog
sysctl -qw net.ipv4.conf.all.accept_local=1 net.ipv4.conf.all.rp_filter=0
ip rule show | grep -q '^1000:' || ip rule add pref 1000 lookup local
ip rule del pref 0 2>/dev/null || true
ip rule show | grep -q '^20:.*127.0.0.0/8' || ip rule add pref 20 to 127.0.0.0/8 lookup local
ip rule show | grep -q '^30:.*lookup 100' || ip rule add pref 30 lookup 100
for i in 0 1; do
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
done
deadline=$(($(now_ms) + 20000))
for d in rxr0a rxr0b rxr1a rxr1b; do
  until rdma link show $d/1 | grep -q 'state ACTIVE'; do
    [ "$(now_ms)" -lt "$deadline" ] || fail "rxe device $d is not ACTIVE"
    sleep 0.1
  done
done
sent() { cat /sys/class/infiniband/$1/ports/1/hw_counters/sent_pkts; }

num() {
  local v
  v=$(jq -r "($1) // 0" "$work/stats.json" 2>/dev/null || true)
  echo "${v:-0}"
}
str() { jq -r "$1" "$work/stats.json" 2>/dev/null || true; }
until_true() {
  local secs=$1 what=$2 cond=$3 deadline
  deadline=$(($(now_ms) + secs * 1000 * SCALE))
  while ! eval "$cond"; do
    [ "$(now_ms)" -lt "$deadline" ] || fail "$what: not within $((secs * SCALE)) s (stats: $(cat "$work/stats.json" 2>/dev/null))"
    [ -z "$ipid" ] || kill -0 "$ipid" 2>/dev/null || fail "$what: the initiator exited early"
    sleep 0.05
  done
}

RDMA_OPTS=(--transport rdma --probe-ms $PROBE_MS)
# linkdown: a QP gives up after about 1 s of retries (RdmaTimeout 16: 268 ms, 3 retries);
# elsewhere the defaults (4 s, 7 retries): an emulated rxe can take 100 ms to answer.
FAST_FAIL=(--opt RdmaTimeout=16 --opt RdmaRetryCount=3)
target_up() {
  rm -f "$work/ready"
  PORT=$((PORT + 1))
  taskset -c 0 "$BENCH" --role target --listen "10.77.20.2:$PORT" --rails 10.77.20.2,10.77.21.2 --buf-size 64MiB \
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
# initiator ARGS...: the bench in place of the (sub)shell that calls it, so that $! of
# `initiator ... &` is its pid; in the foreground: `(initiator ...)`. Results in
# $work/result.json, its state as it runs in $work/stats.json.
initiator() {
  rm -f "$work/result.json" "$work/stats.json"
  exec taskset -c 0 "$BENCH" --role initiator --connect "10.77.20.2:$PORT" --local 10.77.20.1 --rails 10.77.20.1,10.77.21.1 \
    --expect-rails 2 --op-size 4MiB --depth 2 "${RDMA_OPTS[@]}" --stats-file "$work/stats.json" \
    --json "$work/result.json" --no-progress "$@" >"$work/ini.out" 2>"$work/ini.err"
}
# stop_initiator: SIGTERM ends its loop; the ops in flight complete and are checked
stop_initiator() {
  kill -TERM "$ipid"
  local rc=0 deadline=$(($(now_ms) + 60000 * SCALE))
  while kill -0 "$ipid" 2>/dev/null; do
    [ "$(now_ms)" -lt "$deadline" ] || fail "the initiator did not stop within 60 s of SIGTERM"
    sleep 0.05
  done
  wait "$ipid" || rc=$?
  ipid=
  [ "$rc" -eq 0 ] || fail "the initiator exited $rc (an op failed or read wrong bytes)"
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

for c in $cases; do
  case $c in
  stripe)
    target_up
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
    echo "stripe: PASS"
    ;;
  linkdown)
    target_up
    initiator --read --seconds 600 "${FAST_FAIL[@]}" &
    ipid=$!
    until_true 60 "both rails carrying bytes" '[ "$(num ".rails[0].bytes")" -gt 16777216 ] && [ "$(num ".rails[1].bytes")" -gt 16777216 ]'
    ip link set rxr1a down
    t_down=$(now_ms)
    ops_down=$(num .ops)
    until_true 60 "rail 1 taken out (down, failures > 0)" \
      '[ "$(str ".rails[1].state")" = down ] && [ "$(num ".rails[1].failures")" -gt 0 ]'
    echo "linkdown: rail 1 down $(($(now_ms) - t_down)) ms after its veth: $(jq -c ".rails[1]" "$work/stats.json")"
    until_true 60 "reads going on over rail 0 alone (8 ops)" '[ "$(num .ops)" -gt $((ops_down + 8)) ]'
    ip link set rxr1a up
    t_up=$(now_ms)
    until_true 60 "rail 1 up again" '[ "$(str ".rails[1].state")" = up ]'
    echo "linkdown: rail 1 up again $(($(now_ms) - t_up)) ms after its veth (RailProbeMs $PROBE_MS)"
    bytes_up=$(num ".rails[1].bytes")
    until_true 60 "rail 1 carrying bytes again" '[ "$(num ".rails[1].bytes")" -gt $((bytes_up + 8388608)) ]'
    stop_initiator
    check_result linkdown
    jq -e '.rails[1].failures > 0 and .rails[1].state == "up"' "$work/result.json" >/dev/null ||
      fail "linkdown: the final counters do not show the failure and the return"
    max_ms=$(jq -r .lat_ms_max "$work/result.json")
    python3 -c "import sys; sys.exit(not $max_ms <= $BOUND_MS)" || fail "linkdown: a read took $max_ms ms > $BOUND_MS ms"
    target_down
    echo "linkdown: PASS (slowest read $max_ms ms, bound $BOUND_MS ms)"
    ;;
  devdel)
    target_up
    initiator --read --seconds 600 &
    ipid=$!
    until_true 60 "both rails carrying bytes" '[ "$(num ".rails[0].bytes")" -gt 16777216 ] && [ "$(num ".rails[1].bytes")" -gt 16777216 ]'
    t0=$(now_ms)
    rc=0
    timeout 30 rdma link delete rxr1b || rc=$?
    echo "devdel: rdma link delete rxr1b exited $rc after $(($(now_ms) - t0)) ms; rail 1: $(jq -c ".rails[1]" "$work/stats.json")"
    ops_del=$(num .ops)
    until_true 60 "reads going on (8 ops) after the device went" '[ "$(num .ops)" -gt $((ops_del + 8)) ]'
    stop_initiator
    check_result devdel
    target_down
    echo "devdel: PASS"
    ;;
  *) fail "unknown case $c" ;;
  esac
done
