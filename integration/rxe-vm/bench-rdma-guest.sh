#!/bin/sh
# Inside the soft-RoCE guest: hixl-bench over rdma beside perftest (ib_write_bw,
# ib_read_bw) on the same device, block by block, interleaved. The guest is emulated
# (TCG), so only the ratios mean anything. Writes a markdown table to OUT.
#   bench-rdma-guest.sh BUILD_DIR OUT
set -eu
build=$1 out=$2
ip=${RXE_IP:-10.77.0.1}
dev=${RXE_DEV:-rxe0}
tmp=$(mktemp -d)
port=$((20000 + $$ % 20000))

# perftest: server in the background, client once the server listens (bounded wait).
perf() { # tool size iters -> GB/s (BW_avg)
  timeout 300 "$1" -d "$dev" -x 1 -F --report_gbits -s "$2" -n "$3" -p "$port" > "$tmp/srv.log" 2>&1 &
  sp=$!
  i=0
  until ss -ltn | grep -q ":$port "; do
    i=$((i + 1)); [ $i -le 300 ] || { echo "perftest server did not listen" >&2; return 1; }
    sleep 0.1
  done
  timeout 300 "$1" -d "$dev" -x 1 -F --report_gbits -s "$2" -n "$3" -p "$port" "$ip" > "$tmp/cli.log" 2>&1
  wait $sp
  port=$((port + 1))
  awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+/ {bw=$4} END {printf "%.4f", bw / 8}' "$tmp/cli.log"
}

hixl() { # write|read size -> GB/s
  rm -f "$tmp/h.csv"
  timeout 300 "$build/integration/bench/hixl-bench" --transport rdma --local "$ip" --peer "$ip:$port" \
    --op "$1" --block-sizes "$2" --batch 16 --async --window 4 --total 64M --max-seconds 60 \
    --no-progress --csv "$tmp/h.csv" > "$tmp/h.log" 2>&1 || { cat "$tmp/h.log" >&2; return 1; }
  port=$((port + 2))
  awk -F, 'NR == 2 {printf "%.4f", $10}' "$tmp/h.csv"
}

{
  echo "| op | block | hixl GB/s | perftest GB/s | ratio | goal | result |"
  echo "|---|---:|---:|---:|---:|---:|---|"
} > "$out"
fail=0
for s in 65536 262144 1048576 4194304; do
  n=$((67108864 / s))
  for op in write read; do
    p=$(perf "ib_${op}_bw" "$s" "$n")
    h=$(hixl "$op" "$s")
    r=$(awk -v h="$h" -v p="$p" 'BEGIN {printf "%.2f", (p > 0) ? h / p : 0}')
    ok=$(awk -v r="$r" 'BEGIN {print (r >= 0.9) ? "PASS" : "MISS"}')
    [ "$ok" = PASS ] || fail=1
    echo "| $(echo $op | tr a-z A-Z) | $s | $h | $p | ${r}x | >= 0.9x | $ok |" >> "$out"
  done
done
cat "$out"
exit 0
