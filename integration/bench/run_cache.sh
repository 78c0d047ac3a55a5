#!/usr/bin/env bash
# run_cache.sh BUILD_DIR [OUTPUT_MD]
#
# Measures the cache manager against the raw engine moving the same op lists
# (hixl-cache-bench), per transport (tcp, and auto = shm between two processes of this
# host), on a Llama-8B-like paged cache (32 layers x K,V; 16-token blocks of 8 heads x
# 128 x 2 bytes = 32 KiB; 64 blocks a request = 128 MiB): a contiguous pull, a
# scattered pull, and the layer-pipelined async push. Each transport runs CACHE_RUNS
# times (default 3) of CACHE_ITERS iterations (default 15); the page shows every run's
# ratio and their median next to the goal (pull >= 0.95x the raw engine). Writes
# OUTPUT_MD (default docs/performance-cache.md) and the JSON of each run beside it
# under BUILD_DIR/cache-results. RDMA figures come from the soft-RoCE guest (not here).
set -u -o pipefail

die() { echo "run_cache: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 BUILD_DIR [OUTPUT_MD]"
BUILD=$(cd "$1" 2>/dev/null && pwd) || die "no build dir: $1"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$SRC/docs/performance-cache.md}
BENCH=$BUILD/integration/bench/hixl-cache-bench
[ -x "$BENCH" ] || die "build hixl-cache-bench first ($BENCH)"
RUNS=${CACHE_RUNS:-3}
ITERS=${CACHE_ITERS:-15}
RES=$BUILD/cache-results
mkdir -p "$RES"
rm -f "$RES"/*.json

for t in tcp auto; do
  for r in $(seq 1 "$RUNS"); do
    echo "run_cache: transport $t, run $r of $RUNS" >&2
    timeout 600 "$BENCH" --transport "$t" --iters "$ITERS" --json "$RES/$t-$r.json" >"$RES/$t-$r.txt" ||
      die "hixl-cache-bench --transport $t failed (see $RES/$t-$r.txt)"
  done
done

python3 "$SRC/integration/bench/report.py" cache "$RES" "$OUT" "$RUNS" "$ITERS" "$SRC/docs/performance-cache.md" || die "the page could not be written"
