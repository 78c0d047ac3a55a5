#!/usr/bin/env bash
# ab.sh OLD NEW [OUT_DIR]: hixl-bench built at git revision OLD against NEW (a revision, or WORKTREE: this checkout's
# uncommitted tree), interleaved on this machine over one sweep (README.md, "Layout", says which; ab.md what each figure
# is and when a point is flagged). The sweep has batch 1 and batched because 476b89a halved tcp batches of 16 KiB ops
# when only batch 1 was measured; each run's CPU seconds are kept beside it because per GiB they move far less than
# wall-clock on a shared machine. Revisions get detached worktrees OUT_DIR/wt-<sha> (built in <wt>/build), removed at
# the end unless they were there before (then reused) or AB_KEEP=1; WORKTREE builds into OUT_DIR/new-build. Writes
# OUT_DIR/ab.md (also on stdout), ab.json and the raw runs in raw/. Environment: AB_ROUNDS (1..9, default 3), AB_SECONDS
# (per point, default 1), AB_TIMEOUT (seconds per hixl-bench run, default 300), AB_KEEP=1, AB_QUICK=1 (tcp, 16K and 1M,
# one round unless AB_ROUNDS, 0.5 s a point: to try the script, not to decide).
NAME=ab
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
set -e

(($# == 2 || $# == 3)) || die "usage: $0 OLD NEW [OUT_DIR]  (git revisions; NEW may be WORKTREE)"
git -C "$SRC" rev-parse --git-dir >/dev/null 2>&1 || die "$0 is not inside a git checkout"
OUT=${3:-$SRC/build-ab}
mkdir -p "$OUT" || die "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)
[ "$1" != WORKTREE ] || die "OLD must be a revision; only NEW may be WORKTREE"
[ -x /usr/bin/time ] || die "/usr/bin/time is missing (Debian: apt-get install time)"
for c in cmake python3 timeout taskset; do command -v "$c" >/dev/null || die "$c is missing"; done
[ "$(nproc)" -ge 2 ] || die "needs 2 CPUs: initiator and target are pinned to CPUs 0 and 1"

ROUNDS=${AB_ROUNDS:-3} SECS=${AB_SECONDS:-1} TIMEOUT=${AB_TIMEOUT:-300} TOTAL=4G # TOTAL per point: SECS ends it first
TRANSPORTS=(tcp shm) BATCHES=(1 64) OPS=(read write) SIZES=4K,16K,64K,256K,1M,4M
[ "${AB_QUICK:-0}" != 1 ] || TRANSPORTS=(tcp) SIZES=16K,1M ROUNDS=${AB_ROUNDS:-1} SECS=0.5
[[ "$ROUNDS" =~ ^[1-9]$ ]] || die "AB_ROUNDS must be 1..9"
[[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die "AB_TIMEOUT must be whole seconds"

CREATED=() # worktrees this run created; removed on any exit unless AB_KEEP=1
cleanup() {
  [ "${AB_KEEP:-0}" = 1 ] && return 0
  local wt
  for wt in "${CREATED[@]}"; do
    git -C "$SRC" worktree remove --force "$wt" 2>/dev/null || echo "ab: could not remove worktree $wt" >&2
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

declare -A BIN DESC
# prepare LABEL REV: check out REV (or take WORKTREE) and build hixl-bench there.
prepare() {
  local label=$1 rev=$2 sha wt build
  if [ "$rev" = WORKTREE ]; then
    wt=$SRC build=$OUT/$label-build
    DESC[$label]="WORKTREE: $SRC at $(git -C "$SRC" rev-parse --short HEAD) with $(git -C "$SRC" status --porcelain --untracked-files=no | wc -l) changed files"
  else
    sha=$(git -C "$SRC" rev-parse --verify --quiet "$rev^{commit}") || die "$rev is not a revision of $SRC"
    wt=$OUT/wt-${sha:0:12} build=$OUT/wt-${sha:0:12}/build
    if [ -e "$wt" ]; then
      [ "$(git -C "$wt" rev-parse HEAD 2>/dev/null)" = "$sha" ] ||
        die "$wt exists but is not a worktree at $sha: remove it (git worktree remove --force $wt)"
      log "$label: reusing worktree $wt"
    else
      git -C "$SRC" worktree add --detach --quiet "$wt" "$sha" >&2 || die "git worktree add $wt $sha failed"
      CREATED+=("$wt")
    fi
    DESC[$label]="$rev = $(git -C "$SRC" log -1 --format='%h %<(60,trunc)%s' "$sha" | sed 's/ *$//')"
  fi
  log "$label: building hixl-bench in $build (log: $OUT/$label-build.log)"
  { cmake -S "$wt" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHIXL_BUILD_TESTS=OFF &&
    cmake --build "$build" --target hixl-bench -j2; } >"$OUT/$label-build.log" 2>&1 ||
    die "$label ($rev): build failed, see $OUT/$label-build.log"
  BIN[$label]=$build/integration/bench/hixl-bench
  [ -x "${BIN[$label]}" ] || die "$label: no ${BIN[$label]} after the build"
}

prepare old "$1"
prepare new "$2"
RAW=$OUT/raw
rm -rf "$RAW"
mkdir -p "$RAW"

NGROUPS=$((${#TRANSPORTS[@]} * ${#BATCHES[@]} * ${#OPS[@]})) LOAD0=$(load) T0=$SECONDS
log "sweep: ${TRANSPORTS[*]} x batch ${BATCHES[*]} x $SIZES x ${OPS[*]}, rounds: $ROUNDS, $SECS s a point; load $LOAD0"
awk '$1 > 0.5 { exit 1 }' /proc/loadavg || log "other processes keep the CPUs busy: expect a wide A/A spread"
for ((r = 1; r <= ROUNDS; r++)); do
  order=(old new)
  ((r % 2)) || order=(new old)
  g=0
  for t in "${TRANSPORTS[@]}"; do
    for b in "${BATCHES[@]}"; do
      for op in "${OPS[@]}"; do
        g=$((g + 1))
        for who in "${order[@]}"; do
          log "round $r/$ROUNDS group $g/$NGROUPS: $who $t batch $b $op"
          base=$RAW/r$r-$who-$t-b$b-$op # one group, its CPU time (timed's BASE.time) beside its JSON
          timed "$base" "$TIMEOUT" "$who ($t batch $b $op, round $r)" "${BIN[$who]}" --transport "$t" --batch "$b" \
            --op "$op" --block-sizes "$SIZES" --pin 0,1 --opt StagingThreshold=0 --max-seconds "$SECS" \
            --total "$TOTAL" --no-progress --json "$base.json"
        done
      done
    done
  done
  log "round $r done after $((SECONDS - T0)) s; about $(((SECONDS - T0) * (ROUNDS - r) / r)) s to go"
done

AB_OLD=${DESC[old]} AB_NEW=${DESC[new]} AB_ROUNDS=$ROUNDS AB_SECS=$SECS AB_SIZES=$SIZES \
  AB_LOAD="$LOAD0 before, $(load) after" AB_ELAPSED=$((SECONDS - T0)) \
  report ab "$RAW" "$OUT"
log "wrote $OUT/ab.md and $OUT/ab.json"
