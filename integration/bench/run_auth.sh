#!/usr/bin/env bash
# run_auth.sh BUILD_DIR [OUTPUT_MD]
#
# What authenticated links (issue 27: AuthKeyFile / HIXL_AUTH_KEY_FILE, an HMAC-SHA256
# challenge-response at HELLO; issue 43: then a GMAC tag on every frame, both ways)
# cost, authentication on against off, on this machine:
#   - 4 MiB ops: hixl-bench (READ and WRITE, batch 1, sync, initiator on CPU 0 and
#     target on CPU 1), tcp and auto (shm between two processes), with
#     HIXL_AUTH_KEY_FILE set to a key made for the run (on) and unset (off);
#   - the P/D hand-off: hixl-mock-host, llama8b-like, AUTH_REQUESTS requests (default
#     32), tcp and auto, with its own fresh key (on) and --auth-key none (off);
#   - connect time: hixl-auth-bench --aa (on, off and a second off, interleaved inside).
# AUTH_ROUNDS rounds (default 5). In each, every case runs "on + AuthPayloadTag" (onp:
# HIXL_AUTH_PAYLOAD_TAG=on, tcp payloads tagged too), "on", "off" and "off-b" (off
# again) back to back, in that order in odd rounds and reversed in even ones, so on and
# off are always neighbours, and so are off and off-b: on/off is the A/B ratio,
# off-b/off the A/A ratio, which shows what the same case differs by from one run to
# the next here. The page gives both ratios' min / median / max over the rounds.
# Goals (issue 43): GB/s on/off >= 0.95x for 4 MiB ops and for the P/D hand-off
# (median over rounds); the page says PASS or MISS per goal, and says where the A/A
# spread is wider than the 5% the goal resolves. CPU seconds (user + system of every
# process of a run, /usr/bin/time) per GiB moved, on against off, beside them.
#
# Writes OUTPUT_MD (default docs/performance-auth.md; also on stdout) and
# BUILD_DIR/auth-results/auth.json; raw runs in BUILD_DIR/auth-results/raw; progress on
# stderr. Environment: AUTH_ROUNDS (1..20, default 5), AUTH_REQUESTS (default 32),
# AUTH_SECONDS (hixl-bench seconds per op, default 1), AUTH_CONNECTS (hixl-auth-bench
# connects per mode, default 500), AUTH_REPORT_ONLY=1 (write the page again from the
# last run's raw results, measuring nothing), AUTH_LOCK=0 (see below).
# On a shared machine the measurement waits while /tmp/ci.lock or /tmp/bench.lock
# exists, holds /tmp/bench.lock while it runs and removes it on any exit; AUTH_LOCK=0
# does neither. About 8 minutes on 2 cores with the defaults.
#
# Build first: cmake --build BUILD_DIR --target hixl-bench hixl-auth-bench hixl-mock-host hixl_kv_connector
set -u -o pipefail

die() { echo "run_auth: $*" >&2; exit 1; }
log() { echo "run_auth: $(date +%T) $*" >&2; }

(($# == 1 || $# == 2)) || die "usage: $0 BUILD_DIR [OUTPUT_MD]"
BUILD=$(cd "$1" 2>/dev/null && pwd) || die "no build dir: $1"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${2:-$SRC/docs/performance-auth.md}
BENCH=$BUILD/integration/bench/hixl-bench
ABENCH=$BUILD/integration/bench/hixl-auth-bench
MHOST=$BUILD/integration/mock-host/hixl-mock-host
PLUGIN=$BUILD/plugin/libhixl_kv_connector.so
for b in "$BENCH" "$ABENCH" "$MHOST" "$PLUGIN"; do
  [ -e "$b" ] || die "$b is missing: cmake --build $BUILD --target hixl-bench hixl-auth-bench hixl-mock-host hixl_kv_connector"
done
for c in python3 timeout; do command -v "$c" >/dev/null || die "$c is missing"; done
[ -x /usr/bin/time ] || die "/usr/bin/time is missing (Debian: apt-get install time)"
ROUNDS=${AUTH_ROUNDS:-5}
REQUESTS=${AUTH_REQUESTS:-32}
SECS=${AUTH_SECONDS:-1}
CONNECTS=${AUTH_CONNECTS:-500}
[[ "$ROUNDS" =~ ^[1-9][0-9]?$ && "$ROUNDS" -le 20 ]] || die "AUTH_ROUNDS must be 1..20"
[[ "$REQUESTS" =~ ^[1-9][0-9]*$ ]] || die "AUTH_REQUESTS must be a whole number"
[[ "$CONNECTS" =~ ^[1-9][0-9]*$ ]] || die "AUTH_CONNECTS must be a whole number"
[[ "$SECS" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "AUTH_SECONDS must be a number of seconds"
RES=$BUILD/auth-results
RAW=$RES/raw
NOTE=$RES/notes # one line per thing the page must say about the run
mkdir -p "$RES" || die "cannot create $RES"
TRANSPORTS=(tcp auto)
OPEN_MSG="accepts links from anyone" # an engine with a port and no key says this once

KEYDIR="" LOCKED=0
cleanup() {
  [ -n "$KEYDIR" ] && rm -rf "$KEYDIR"
  [ "$LOCKED" = 1 ] && rm -f /tmp/bench.lock
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The run of one case: KIND (ops | pd | conn), ROUND, TRANSPORT, VARIANT (on | onp | off | offb;
# onp: on with HIXL_AUTH_PAYLOAD_TAG=on, every tcp payload tagged too).
# Its files are $RAW/rROUND-KIND-TRANSPORT-VARIANT.{json,out,err}.
run_case() {
  local kind=$1 r=$2 t=$3 v=$4 base st=0 env_cmd=(env -u HIXL_AUTH_KEY_FILE)
  base=$RAW/r$r-$kind-$t-$v
  [ "$v" = on ] && env_cmd=(env -u HIXL_AUTH_PAYLOAD_TAG "HIXL_AUTH_KEY_FILE=$KEYDIR/key")
  [ "$v" = onp ] && env_cmd=(env "HIXL_AUTH_KEY_FILE=$KEYDIR/key" HIXL_AUTH_PAYLOAD_TAG=on)
  case $kind in
  ops)
    timeout -k 10 300 /usr/bin/time -f "%U %S %e" -o "$base.time" "${env_cmd[@]}" "$BENCH" --transport "$t" --block-sizes 4M --op both --pin 0,1 \
      --max-seconds "$SECS" --total 16G --no-progress --json "$base.json" >"$base.out" 2>"$base.err" || st=$?
    ;;
  pd)
    local auth=() ptag=(-u HIXL_AUTH_PAYLOAD_TAG)
    [ "$v" = on ] || [ "$v" = onp ] || auth=(--auth-key none)
    [ "$v" = onp ] && ptag=(HIXL_AUTH_PAYLOAD_TAG=on)
    # its own fresh key when on: HIXL_AUTH_KEY_FILE unset either way
    timeout -k 10 400 /usr/bin/time -f "%U %S %e" -o "$base.time" env -u HIXL_AUTH_KEY_FILE "${ptag[@]}" "$MHOST" --transport "$t" --requests "$REQUESTS" "${auth[@]}" \
      --timeout 360 --no-progress --json "$base.json" >"$base.out" 2>"$base.err" || st=$?
    ;;
  esac
  [ "$st" = 0 ] || die "$kind $t $v (round $r) failed with status $st$([ "$st" = 124 ] && echo ": timed out"); see $base.err"
  # Is the mode what it says? An open engine says so once; a mock host names its links.
  if [ "$kind" = ops ]; then
    if [ "${v#on}" != "$v" ] && grep -q "$OPEN_MSG" "$base.err"; then
      die "ops $t on (round $r): an engine ran without a key despite HIXL_AUTH_KEY_FILE; see $base.err"
    elif [ "${v#on}" = "$v" ] && ! grep -q "$OPEN_MSG" "$base.err"; then
      echo "hixl-bench's keyless target did not say \"$OPEN_MSG\" (round $r, $t, $v): off was not confirmed from its log" >>"$NOTE"
    fi
  else
    grep -q "links *authenticated" "$base.out"
    local authed=$?
    { [ "${v#on}" != "$v" ] && [ "$authed" = 0 ]; } || { [ "${v#on}" = "$v" ] && [ "$authed" != 0 ]; } ||
      die "pd $t $v (round $r): its links line says otherwise; see $base.out"
  fi
}

measure() {
  local r t v order kind
  rm -rf "$RAW" "$NOTE"
  mkdir -p "$RAW"
  KEYDIR=$(mktemp -d /tmp/hixl-run-auth-XXXXXX) || die "mktemp -d failed"
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$KEYDIR/key") || die "cannot write the key"
  chmod 600 "$KEYDIR/key"
  if [ "${AUTH_LOCK:-1}" != 0 ]; then
    while [ -e /tmp/ci.lock ] || [ -e /tmp/bench.lock ]; do
      log "waiting for /tmp/ci.lock and /tmp/bench.lock to go away"
      sleep 30
    done
    touch /tmp/bench.lock && LOCKED=1
  fi
  local t0=$SECONDS
  echo "before: $(cut -d' ' -f1-3 /proc/loadavg)" >"$RES/load"
  git -C "$SRC" rev-parse --short HEAD >"$RES/head" 2>/dev/null
  date -u +"%Y-%m-%d %H:%M UTC" >"$RES/date"
  log "the frame proof's primitives (hixl-auth-bench --frames)"
  timeout -k 10 300 "$ABENCH" --frames --json "$RES/frames.json" >"$RES/frames.out" 2>"$RAW/frames.err" ||
    die "hixl-auth-bench --frames failed; see $RAW/frames.err"
  log "$ROUNDS rounds: 4 MiB ops (${SECS} s per op), P/D ($REQUESTS requests), connects ($CONNECTS per mode); tcp and auto; load $(cut -d' ' -f1-3 /proc/loadavg)"
  for ((r = 1; r <= ROUNDS; r++)); do
    order=(onp on off offb)
    ((r % 2)) || order=(offb off on onp)
    for kind in ops pd; do
      for t in "${TRANSPORTS[@]}"; do
        for v in "${order[@]}"; do
          [ ! -e /tmp/ci.lock ] || echo "/tmp/ci.lock existed during round $r ($kind $t $v)" >>"$NOTE"
          log "round $r/$ROUNDS: $kind $t $v ($((SECONDS - t0)) s)"
          run_case "$kind" "$r" "$t" "$v"
        done
      done
    done
    log "round $r/$ROUNDS: connects"
    timeout -k 10 300 env -u HIXL_AUTH_KEY_FILE "$ABENCH" --connects "$CONNECTS" --aa --transports tcp,auto \
      --no-progress --json "$RAW/r$r-conn.json" >"$RAW/r$r-conn.out" 2>"$RAW/r$r-conn.err" ||
      die "hixl-auth-bench (round $r) failed; see $RAW/r$r-conn.err"
    echo "after round $r: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$RES/load"
    log "round $r done after $((SECONDS - t0)) s; about $(((SECONDS - t0) * (ROUNDS - r) / r)) s to go"
  done
  echo "$((SECONDS - t0))" >"$RES/elapsed"
  cleanup
  LOCKED=0 KEYDIR=""
}

[ "${AUTH_REPORT_ONLY:-0}" = 1 ] || measure
ls "$RAW"/r*-ops-*.json >/dev/null 2>&1 || die "no results in $RAW"

# What the page records of the tree and the machine.
CPU=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
HEAD=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo "?")
DIRTY=$(git -C "$SRC" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
# where the uncommitted changes are: "core/src/transport (5), plugin/src (11)"
WHERE=$(git -C "$SRC" status --porcelain --untracked-files=no 2>/dev/null | awk '{ print $2 }' |
  awk -F/ '{ print (NF > 3 ? $1 "/" $2 "/" $3 : NF > 2 ? $1 "/" $2 : $1) }' | sort | uniq -c | awk '{ printf "%s%s (%s)", s, $2, $1; s = ", " }')
CAP_SRC=no CAP_BIN=no
grep -q "cap_check" "$SRC/plugin/src/kv_service.c" 2>/dev/null && CAP_SRC=yes
# (no pipe into grep -q: with pipefail, nm's SIGPIPE would read as "not found")
if command -v nm >/dev/null; then
  grep -q kv_cap_make <(nm "$PLUGIN" 2>/dev/null) && CAP_BIN=yes
else
  grep -qa "wrong capability" "$PLUGIN" && CAP_BIN=yes
fi
LIB=$(find "$BUILD/core" -maxdepth 1 -name 'libhixl.so.*.*' -print -quit)
BUILT=$(date -u -r "${LIB:-$BENCH}" +"%Y-%m-%d %H:%M UTC")

AUTH_CPU="$CPU" AUTH_NCPU=$(nproc) AUTH_KERNEL=$(uname -r) AUTH_DATE=$(date -u +"%Y-%m-%d %H:%M UTC") \
  AUTH_HEAD=$HEAD AUTH_DIRTY=$DIRTY AUTH_BUILT="$BUILT" AUTH_WHERE="$WHERE" AUTH_CAP_SRC=$CAP_SRC AUTH_CAP_BIN=$CAP_BIN AUTH_REQUESTS_N=$REQUESTS \
  AUTH_SECS=$SECS AUTH_CONNECTS_N=$CONNECTS AUTH_BUILD=$BUILD \
  python3 "$SRC/integration/bench/report.py" auth "$RES" "$OUT" "$SRC/docs/performance-auth.md" || die "the page could not be written"
log "wrote $OUT and $RES/auth.json"
