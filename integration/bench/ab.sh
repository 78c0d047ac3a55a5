#!/usr/bin/env bash
# ab.sh OLD NEW [OUT_DIR]
#
# Measures a data-path change A/B: hixl-bench built at git revision OLD against
# NEW (a revision, or WORKTREE: the uncommitted tree of this checkout), over one
# fixed sweep, the two interleaved on this machine. 476b89a halved tcp batches of
# 16 KiB ops because only batch 1 was measured; this sweep has both.
#
# Sweep: transports tcp and shm x batch 1 and 64 x blocks 4K..4M x READ and WRITE,
# StagingThreshold=0 (every op direct), initiator on CPU 0 and target on CPU 1.
# One hixl-bench run per (transport, batch, op) group; ROUNDS rounds, each group run
# OLD then NEW, the order swapped every other round. Reported per point: the median
# GB/s of each and NEW/OLD, beside the A/A spread (max/min of OLD's own rounds);
# per group: CPU seconds (user + system of both processes, the whole run: start-up,
# verify and warm-up included) per GiB measured, which moves far less than wall-clock
# on a shared machine. A point is flagged when NEW/OLD < 0.9 and below 1/A/A.
#
# Revisions get detached worktrees OUT_DIR/wt-<sha> (built in <wt>/build), removed at
# the end unless they were there before (then reused) or AB_KEEP=1. WORKTREE builds
# this checkout into OUT_DIR/new-build. Writes OUT_DIR/ab.md (also on stdout),
# OUT_DIR/ab.json and the raw runs in OUT_DIR/raw; progress goes to stderr.
#
# Environment: AB_ROUNDS (1..9, default 3), AB_SECONDS (per point, default 1),
# AB_TIMEOUT (seconds per hixl-bench run, default 300), AB_KEEP=1, AB_QUICK=1 (tcp,
# 16K and 1M, one round unless AB_ROUNDS, 0.5 s a point: to try the script, not to
# decide).
set -euo pipefail

die() { echo "ab: $*" >&2; exit 1; }
log() { echo "ab: $(date +%T) $*" >&2; }

(($# == 2 || $# == 3)) || die "usage: $0 OLD NEW [OUT_DIR]  (git revisions; NEW may be WORKTREE)"
SRC=$(git -C "$(dirname "$0")" rev-parse --show-toplevel 2>/dev/null) || die "$0 is not inside a git checkout"
OUT=${3:-$SRC/build-ab}
mkdir -p "$OUT" || die "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)
[ "$1" != WORKTREE ] || die "OLD must be a revision; only NEW may be WORKTREE"
[ -x /usr/bin/time ] || die "/usr/bin/time is missing (Debian: apt-get install time)"
for c in cmake python3 timeout taskset; do command -v "$c" >/dev/null || die "$c is missing"; done
[ "$(nproc)" -ge 2 ] || die "needs 2 CPUs: initiator and target are pinned to CPUs 0 and 1"

ROUNDS=${AB_ROUNDS:-3}
SECS=${AB_SECONDS:-1}
TIMEOUT=${AB_TIMEOUT:-300}
TRANSPORTS=(tcp shm) BATCHES=(1 64) OPS=(read write) SIZES=4K,16K,64K,256K,1M,4M
if [ "${AB_QUICK:-0}" = 1 ]; then
  TRANSPORTS=(tcp) SIZES=16K,1M ROUNDS=${AB_ROUNDS:-1} SECS=0.5
fi
[[ "$ROUNDS" =~ ^[1-9]$ ]] || die "AB_ROUNDS must be 1..9"
[[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die "AB_TIMEOUT must be whole seconds"
TOTAL=4G # per point: --max-seconds ends each point first

# Worktrees this run created; removed on any exit unless AB_KEEP=1.
CREATED=()
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

# run ROUND LABEL TRANSPORT BATCH OP: one group, its CPU time beside its JSON.
run() {
  local base=$RAW/r$1-$2-$3-b$4-$5 st=0
  timeout -k 10 "$TIMEOUT" /usr/bin/time -f "%U %S %e" -o "$base.time" \
    "${BIN[$2]}" --transport "$3" --batch "$4" --op "$5" --block-sizes "$SIZES" --pin 0,1 \
    --opt StagingThreshold=0 --max-seconds "$SECS" --total "$TOTAL" --no-progress \
    --json "$base.json" >"$base.out" 2>"$base.err" || st=$?
  [ "$st" = 0 ] || die "$2 ($3 batch $4 $5, round $1) failed with status $st$([ "$st" = 124 ] &&
    echo ": timed out after $TIMEOUT s"); see $base.err"
}

NGROUPS=$((${#TRANSPORTS[@]} * ${#BATCHES[@]} * ${#OPS[@]}))
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T0=$SECONDS
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
          run "$r" "$who" "$t" "$b" "$op"
        done
      done
    done
  done
  log "round $r done after $((SECONDS - T0)) s; about $(((SECONDS - T0) * (ROUNDS - r) / r)) s to go"
done

AB_OLD=${DESC[old]} AB_NEW=${DESC[new]} AB_ROUNDS=$ROUNDS AB_SECS=$SECS AB_SIZES=$SIZES \
  AB_LOAD="$LOAD0 before, $(cut -d' ' -f1-3 /proc/loadavg) after" AB_ELAPSED=$((SECONDS - T0)) \
  python3 - "$RAW" "$OUT" <<'EOF'
import glob, json, os, re, statistics, sys
raw, out = sys.argv[1], sys.argv[2]
E = os.environ
pts, grp = {}, {}  # (t, batch, op[, block]) -> {"old": {round: value}, "new": ...}
for path in sorted(glob.glob(f"{raw}/r*.json")):
    r, who, t, b, op = re.match(r".*/r(\d+)-(old|new)-(\w+)-b(\d+)-(\w+)\.json$", path).groups()
    res = json.load(open(path))["results"]
    user, sys_, _ = open(path[:-5] + ".time").read().split()[-3:]
    gib = sum(p["bytes"] for p in res) / 2**30
    g = grp.setdefault((t, int(b), op.upper()), {"old": {}, "new": {}})
    g[who][int(r)] = (float(user) + float(sys_)) / gib
    for p in res:
        k = (t, p["batch"], p["op"], p["block_size"])
        pts.setdefault(k, {"old": {}, "new": {}})[who][int(r)] = p["gbps"]

def summary(d):
    o, n = list(d["old"].values()), list(d["new"].values())
    mo, mn = statistics.median(o), statistics.median(n)
    aa = max(o) / min(o) if len(o) > 1 and min(o) > 0 else None
    return {"old": mo, "new": mn, "ratio": mn / mo if mo > 0 else None, "aa": aa,
            "old_rounds": o, "new_rounds": n}

def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"

def f2(x):
    return "n/a" if x is None else f"{x:.2f}x"

lines, flagged, cpu_flagged, unsure = [], 0, 0, 0
P = lambda s: lines.append(s)
P(f"# A/B: hixl-bench, OLD vs NEW\n\n- OLD: {E['AB_OLD']}\n- NEW: {E['AB_NEW']}")
n = int(E["AB_ROUNDS"])
P(f"- {n} round{'s' * (n > 1)} interleaved (OLD first in odd rounds), {E['AB_SECS']} s a point, "
  f"StagingThreshold=0, --pin 0,1; {E['AB_ELAPSED']} s; load average {E['AB_LOAD']}")
P("- GB/s: median over rounds. A/A: OLD's max/min over its rounds (n/a with one round). "
  "REGRESSION?: NEW/OLD < 0.9 and below 1/A/A; with one round, below 0.9 says no more than that.\n")
P("| transport | batch | op | block | OLD GB/s | NEW GB/s | NEW/OLD | A/A | REGRESSION? |")
P("|---|---:|---|---:|---:|---:|---:|---:|---|")
jp = []
for k in sorted(pts):
    s = summary(pts[k])
    low = s["ratio"] is not None and s["ratio"] < 0.9
    bad = low and s["aa"] is not None and s["ratio"] < 1 / s["aa"]
    flagged += bad
    unsure += low and s["aa"] is None
    flag = "REGRESSION?" if bad else "below 0.9, no A/A" if low and s["aa"] is None else ""
    P(f"| {k[0]} | {k[1]} | {k[2]} | {size(k[3])} | {s['old']:.2f} | {s['new']:.2f} | "
      f"{f2(s['ratio'])} | {f2(s['aa'])} | {flag} |")
    jp.append(dict(transport=k[0], batch=k[1], op=k[2], block_size=k[3], gbps=s, regression=bool(bad)))
P("\nCPU seconds (user + system, initiator and target, whole run) per GiB measured, per group; "
  "MORE CPU?: NEW/OLD > 1.1 and above A/A.\n")
P("| transport | batch | op | OLD s/GiB | NEW s/GiB | NEW/OLD | A/A | MORE CPU? |")
P("|---|---:|---|---:|---:|---:|---:|---|")
jg = []
for k in sorted(grp):
    s = summary(grp[k])
    bad = s["ratio"] is not None and s["ratio"] > 1.1 and s["aa"] is not None and s["ratio"] > s["aa"]
    cpu_flagged += bad
    P(f"| {k[0]} | {k[1]} | {k[2]} | {s['old']:.3f} | {s['new']:.3f} | {f2(s['ratio'])} | "
      f"{f2(s['aa'])} | {'MORE CPU?' if bad else ''} |")
    jg.append(dict(transport=k[0], batch=k[1], op=k[2], cpu_s_per_gib=s, more_cpu=bool(bad)))
rs = [p["gbps"]["ratio"] for p in jp if p["gbps"]["ratio"]]
aas = [p["gbps"]["aa"] for p in jp if p["gbps"]["aa"]]
P(f"\nNEW/OLD GB/s {min(rs):.2f}-{max(rs):.2f}x over {len(jp)} points"
  + (f", A/A {min(aas):.2f}-{max(aas):.2f}x" if aas else ", no A/A (one round)")
  + f"; {flagged} flagged REGRESSION?, {cpu_flagged} groups MORE CPU?"
  + (f", {unsure} points below 0.9 with no A/A to judge them by." if unsure else "."))
md = "\n".join(lines) + "\n"
open(f"{out}/ab.md", "w").write(md)
meta = {k[3:].lower(): v for k, v in E.items() if k.startswith("AB_")}
json.dump(dict(meta=meta, points=jp, groups=jg), open(f"{out}/ab.json", "w"), indent=1)
sys.stdout.write(md)
EOF
log "wrote $OUT/ab.md and $OUT/ab.json"
