#!/usr/bin/env bash
# bed.sh: a two-host test bed on one machine for several NICs per engine (issue 31):
# two network namespaces, "prefill" (hixl-pf) and "decode" (hixl-dc), joined by RAILS
# veth pairs, each one a rail shaped with tc so that the rails, not the CPU, bound the
# throughput: tbf at RATE on both ends, and netem DELAY where the kernel has sch_netem
# (it is said when it does not). Rail i is 10.88.i.1 (prefill) -- 10.88.i.2 (decode).
#
#   bed.sh up [RAILS=2] [RATE=2gbit] [DELAY=100us]   make the bed (replaces one left over)
#   bed.sh down                                      remove it
#   bed.sh ceiling [SECONDS=5]                       iperf3 over one rail, then over every rail
#                                                    at once: what striping can reach here
#   bed.sh pf|dc CMD...                              run CMD in the prefill / decode namespace
#   bed.sh link RAIL up|down                         set rail RAIL's link (its prefill end; the
#                                                    veth pair's carrier follows) up or down
#   bed.sh loss RAIL PERCENT                         drop PERCENT of the packets each end of rail
#                                                    RAIL receives (0: none): iptables' statistic
#                                                    match, as this kernel has no sch_netem and no
#                                                    tc actions (apt-get install iptables); the
#                                                    rail sends one segment per packet meanwhile
#   bed.sh dropped RAIL                              packets the loss rules of RAIL dropped so far
#   bed.sh seen RAIL                                 packets the loss rules of RAIL drew for so far
#
# HIXL_BED=NAME names the namespaces NAME-pf and NAME-dc (default hixl: hixl-pf, hixl-dc),
# so that several beds (tests running in parallel) live side by side.
#
# Root only (ip netns, tc). Nothing leaves the machine: the addresses live inside the
# namespaces this script makes.
set -euo pipefail
BED=${HIXL_BED:-hixl}
PF=$BED-pf
DC=$BED-dc
die() { echo "bed.sh: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run as root (ip netns, tc)"

rails() { ip -n "$PF" -o link show 2>/dev/null | grep -o 'hxr[0-9]*p' | sort -u | wc -l; }

down() {
  ip netns del "$PF" 2>/dev/null || true
  ip netns del "$DC" 2>/dev/null || true
}

shape() { # ns dev rate delay
  local ns=$1 dev=$2 rate=$3 delay=$4
  if ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$delay" 2>/dev/null; then
    ip netns exec "$ns" tc qdisc add dev "$dev" parent 1: handle 2: tbf rate "$rate" burst 512kb latency 50ms
  else
    ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst 512kb latency 50ms
    NO_NETEM=1
  fi
}

up() {
  local n=${1:-2} rate=${2:-2gbit} delay=${3:-100us}
  [ "$n" -ge 1 ] && [ "$n" -le 8 ] || die "RAILS is 1 to 8"
  down
  ip netns add "$PF"
  ip netns add "$DC"
  ip -n "$PF" link set lo up
  ip -n "$DC" link set lo up
  NO_NETEM=0
  for ((i = 0; i < n; i++)); do
    ip link add "hxr${i}p" netns "$PF" type veth peer name "hxr${i}d" netns "$DC"
    ip -n "$PF" addr add "10.88.$i.1/24" dev "hxr${i}p"
    ip -n "$DC" addr add "10.88.$i.2/24" dev "hxr${i}d"
    ip -n "$PF" link set "hxr${i}p" up
    ip -n "$DC" link set "hxr${i}d" up
    shape "$PF" "hxr${i}p" "$rate" "$delay"
    shape "$DC" "hxr${i}d" "$rate" "$delay"
  done
  if [ "$NO_NETEM" = 1 ]; then
    echo "bed.sh: $n rails at $rate each (this kernel has no sch_netem: no added delay)"
  else
    echo "bed.sh: $n rails at $rate each, $delay each way"
  fi
}

gbps() { # iperf3 JSON on stdin -> Gbit/s received
  python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9))'
}

ceiling() {
  local secs=${1:-5} n i t
  n=$(rails)
  [ "$n" -ge 1 ] || die "no bed: bed.sh up first"
  local servers=() clients=() out
  out=$(mktemp -d)
  for ((i = 0; i < n; i++)); do
    ip netns exec "$DC" iperf3 -s -B "10.88.$i.2" -p $((5201 + i)) >/dev/null 2>&1 &
    servers+=($!)
  done
  for ((i = 0; i < n; i++)); do # each server is up once it listens (a deadline, not a fixed wait)
    for ((t = 0; t < 200; t++)); do
      ip netns exec "$DC" ss -ltn | grep -q "10.88.$i.2:$((5201 + i))" && break
      sleep 0.05
    done
  done
  ip netns exec "$PF" iperf3 -J -c 10.88.0.2 -B 10.88.0.1 -p 5201 -t "$secs" >"$out/one.json"
  for ((i = 0; i < n; i++)); do
    ip netns exec "$PF" iperf3 -J -c "10.88.$i.2" -B "10.88.$i.1" -p $((5201 + i)) -t "$secs" >"$out/$i.json" &
    clients+=($!)
  done
  wait "${clients[@]}"
  kill "${servers[@]}" 2>/dev/null || true
  wait "${servers[@]}" 2>/dev/null || true
  local one all=0
  one=$(gbps <"$out/one.json")
  for ((i = 0; i < n; i++)); do all=$(python3 -c "print(round($all + $(gbps <"$out/$i.json"), 3))"); done
  rm -rf "$out"
  echo "| rails | iperf3 Gbit/s | vs one rail |"
  echo "|---|---|---|"
  echo "| 1 | $one | 1.00x |"
  echo "| $n at once | $all | $(python3 -c "print('%.2fx' % ($all / $one))") |"
  echo "{\"rails\": $n, \"one_rail_gbps\": $one, \"all_rails_gbps\": $all}" >&2
}

rail_ok() { [[ "${1:-}" =~ ^[0-9]+$ ]] && ip -n "$PF" link show "hxr${1}p" >/dev/null 2>&1 || die "no rail '${1:-}' on bed $BED"; }

link() { # rail up|down
  rail_ok "${1:-}"
  case "${2:-}" in up | down) ;; *) die "link RAIL up|down" ;; esac
  ip -n "$PF" link set "hxr${1}p" "$2"
}

# One chain per rail end (HXLOSS<rail>), jumped to from INPUT: a packet dropped there
# was on the wire (the sender's TCP sees a loss and retransmits), unlike one dropped on
# its way out (OUTPUT), which the sender's stack hears about at once. The rules live in
# the namespaces and go with them.
loss() { # rail percent
  local r=${1:-} pct=${2:-} ns end p
  rail_ok "$r"
  [[ "$pct" =~ ^[0-9]+(\.[0-9]+)?$ ]] && python3 -c "import sys; sys.exit(not 0 <= $pct <= 100)" ||
    die "loss RAIL PERCENT (0 to 100)"
  command -v iptables >/dev/null || die "no iptables (apt-get install iptables)"
  p=$(python3 -c "print('%.6f' % ($pct / 100))")
  for end in p d; do
    ns=$PF; [ "$end" = d ] && ns=$DC
    if ! ip netns exec "$ns" iptables -w -n -L "HXLOSS$r" >/dev/null 2>&1; then
      ip netns exec "$ns" iptables -w -N "HXLOSS$r" &&
        ip netns exec "$ns" iptables -w -A INPUT -i "hxr$r$end" -j "HXLOSS$r" ||
        die "iptables cannot make a chain in $ns (does the kernel have netfilter?)"
    fi
    ip netns exec "$ns" iptables -w -F "HXLOSS$r"
    # One packet per segment while it loses them: TCP's segmentation offload hands
    # netfilter (and so the rule) up to 64 KiB at a time, which would drop 45 segments
    # in a burst with each draw instead of 1% of the segments.
    if [ "$p" = 0.000000 ]; then
      ip -n "$ns" link set dev "hxr$r$end" gso_max_segs 65535
      continue
    fi
    ip -n "$ns" link set dev "hxr$r$end" gso_max_segs 1
    ip netns exec "$ns" iptables -w -A "HXLOSS$r" -m statistic --mode random --probability "$p" -j DROP ||
      die "iptables cannot add the loss rule in $ns (does the kernel's netfilter have the statistic match?)"
  done
}

dropped() { # rail: packets the loss rules dropped, both ends
  local r=${1:-} n=0 ns end c
  rail_ok "$r"
  for end in p d; do
    ns=$PF; [ "$end" = d ] && ns=$DC
    c=$(ip netns exec "$ns" iptables -w -L "HXLOSS$r" -v -n -x 2>/dev/null |
      awk '$3 == "DROP" { s += $1 } END { print s + 0 }')
    n=$((n + c))
  done
  echo "$n"
}

seen() { # rail: packets the loss rules drew for (what netfilter saw; GRO may merge segments), both ends
  local r=${1:-} n=0 ns end c
  rail_ok "$r"
  for end in p d; do
    ns=$PF; [ "$end" = d ] && ns=$DC
    c=$(ip netns exec "$ns" iptables -w -L INPUT -v -n -x 2>/dev/null |
      awk -v ch="HXLOSS$r" '$3 == ch { s += $1 } END { print s + 0 }')
    n=$((n + c))
  done
  echo "$n"
}

case "${1:-}" in
up) shift; up "$@" ;;
down) down ;;
ceiling) shift; ceiling "$@" ;;
link) shift; link "$@" ;;
loss) shift; loss "$@" ;;
dropped) shift; dropped "$@" ;;
seen) shift; seen "$@" ;;
pf) shift; exec ip netns exec "$PF" "$@" ;;
dc) shift; exec ip netns exec "$DC" "$@" ;;
*) die "usage: bed.sh up [RAILS] [RATE] [DELAY] | down | ceiling [SECONDS] | pf CMD... | dc CMD... | link RAIL up|down | loss RAIL PERCENT | dropped RAIL" ;;
esac
