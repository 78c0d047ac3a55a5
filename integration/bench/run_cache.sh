#!/usr/bin/env bash
# run_cache.sh BUILD_DIR [OUTPUT_MD]: the cache manager against the raw engine moving the same op lists
# (hixl-cache-bench), over tcp and auto (shm between two processes of this host); the method and the goal are on the
# page, OUTPUT_MD (default docs/performance-cache.md). Each transport runs CACHE_RUNS times (default 3) of
# CACHE_ITERS iterations (default 15); each run's JSON is kept in BUILD_DIR/cache-results. RDMA figures come from the
# soft-RoCE guest (not here).
NAME=run_cache
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
page performance-cache.md hixl-cache-bench cache-results "$@"
RUNS=${CACHE_RUNS:-3} ITERS=${CACHE_ITERS:-15}
rm -f "$RES"/*.json

for t in tcp auto; do
  for r in $(seq 1 "$RUNS"); do
    log "transport $t, run $r of $RUNS"
    timeout 600 "$BENCH" --transport "$t" --iters "$ITERS" --json "$RES/$t-$r.json" >"$RES/$t-$r.txt" ||
      die "hixl-cache-bench --transport $t failed (see $RES/$t-$r.txt)"
  done
done

report cache "$RES" "$OUT" "$RUNS" "$ITERS" "$SRC/docs/performance-cache.md"
