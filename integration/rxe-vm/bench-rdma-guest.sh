#!/bin/sh
# Inside the soft-RoCE guest: hixl-bench over rdma beside perftest (ib_write_bw,
# ib_read_bw) on the same device, block by block, interleaved; then small blocks at
# batch 256 with the staging pool's coalescing at its default StagingThreshold,
# off (0) and for every block, against each other. The guest is emulated (TCG), so
# only the ratios mean anything. Writes a markdown table to OUT and the staging
# table to STAGING_OUT (default: OUT with -staging before .md).
#   bench-rdma-guest.sh BUILD_DIR OUT [STAGING_OUT]
# On a host without RDMA the staging commands run over tcp with
#   RXE_IP=127.0.0.1 RXE_BENCH_TRANSPORT=tcp RXE_BENCH_PARTS=staging bench-rdma-guest.sh ...
set -eu
build=$1 out=$2
sout=${3:-${out%.md}-staging.md}
ip=${RXE_IP:-10.77.0.1}
dev=${RXE_DEV:-rxe0}
transport=${RXE_BENCH_TRANSPORT:-rdma}
parts=${RXE_BENCH_PARTS:-perftest staging}
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
  timeout 300 "$build/integration/bench/hixl-bench" --transport "$transport" --local "$ip" --peer "$ip:$port" \
    --op "$1" --block-sizes "$2" --batch 16 --async --window 4 --total 64M --max-seconds 60 \
    --no-progress --csv "$tmp/h.csv" > "$tmp/h.log" 2>&1 || { cat "$tmp/h.log" >&2; return 1; }
  port=$((port + 2))
  awk -F, 'NR == 2 {printf "%.4f", $10}' "$tmp/h.csv"
}

# Staging: WRITE and READ of 64 B..16 KiB blocks at batch 256, sync, with
# StagingThreshold as named (default: the engine's own) -> $tmp/st_NAME.csv. A run
# that fails leaves its figures n/a rather than ending the script.
ST_ALL=1048576
stage_run() { # NAME default|THRESHOLD
  opt=""
  [ "$2" = default ] || opt="--opt StagingThreshold=$2"
  rm -f "$tmp/st_$1.csv"
  # shellcheck disable=SC2086 # $opt is empty or two words
  timeout 600 "$build/integration/bench/hixl-bench" --transport "$transport" --local "$ip" --peer "$ip:$port" \
    --op both --block-sizes 64,512,1K,2K,4K,16K --batch 256 $opt --total 4M --max-seconds 5 \
    --no-progress --csv "$tmp/st_$1.csv" > "$tmp/st_$1.log" 2>&1 ||
    { echo "hixl-bench staging run $1 failed:" >&2; cat "$tmp/st_$1.log" >&2; }
  port=$((port + 2))
}
st() { # NAME OP BLOCK -> GB/s or n/a
  [ -s "$tmp/st_$1.csv" ] || { echo n/a; return 0; }
  awk -F, -v op="$2" -v b="$3" 'NR > 1 && $3 == op && $4 == b && $5 == 256 {v = $10}
    END {if (v == "") print "n/a"; else printf "%.4f", v}' "$tmp/st_$1.csv"
}
rat() { # A B -> A/B with 2 decimals, or n/a
  awk -v a="$1" -v b="$2" 'BEGIN {if (a == "n/a" || b == "n/a" || b + 0 == 0) print "n/a";
    else printf "%.2fx", a / b}'
}

case " $parts " in *" perftest "*)
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
;; esac

case " $parts " in *" staging "*)
# Unmeasured first: the guest's first runs are slower (pages still coming in over 9p).
timeout 300 "$build/integration/bench/hixl-bench" --transport "$transport" --local "$ip" --peer "$ip:$port" \
  --op both --block-sizes 4K --batch 256 --total 4M --max-seconds 2 --no-progress > /dev/null 2>&1 || true
port=$((port + 2))
stage_run default default
stage_run direct 0
stage_run coalesced "$ST_ALL"
{
  echo "| block x 256 | op | direct (0) GB/s | default GB/s | default / direct | coalesced ($ST_ALL) GB/s | coalesced / direct |"
  echo "|---:|---|---:|---:|---:|---:|---:|"
  for b in 64 512 1024 2048 4096 16384; do
    for op in WRITE READ; do
      d=$(st direct $op $b) def=$(st default $op $b) all=$(st coalesced $op $b)
      echo "| $b B | $op | $d | $def | $(rat "$def" "$d") | $all | $(rat "$all" "$d") |"
    done
  done
} > "$sout"
cat "$sout"
;; esac
exit 0
