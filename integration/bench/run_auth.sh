#!/usr/bin/env bash
# run_auth.sh BUILD_DIR [OUTPUT_MD]
#
# What authenticated links cost (issues 27 and 43), on against off: 4 MiB ops (hixl-bench),
# the P/D hand-off (hixl-mock-host) and connect time (hixl-auth-bench --aa), over tcp and
# auto, each case as onp (on with HIXL_AUTH_PAYLOAD_TAG=on), on, off and offb back to back,
# reversed in even rounds. The method, the knobs (AUTH_ROUNDS, AUTH_REQUESTS, AUTH_SECONDS,
# AUTH_CONNECTS, AUTH_REPORT_ONLY=1, AUTH_LOCK=0) and the outputs: OUTPUT_MD (default
# docs/performance-auth.md; also on stdout), "Re-running". About 8 minutes on 2 cores.
#
# Build first: cmake --build BUILD_DIR --target hixl-bench hixl-auth-bench hixl-mock-host hixl_kv_connector
NAME=run_auth
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
(($# == 1 || $# == 2)) || die "usage: $0 BUILD_DIR [OUTPUT_MD]"
page performance-auth.md hixl-bench auth-results "$@"
ABENCH=$BIN/hixl-auth-bench MHOST=$BUILD/integration/mock-host/hixl-mock-host
PLUGIN=$BUILD/plugin/libhixl_kv_connector.so
need "$ABENCH" "$MHOST" "$PLUGIN"
for c in python3 timeout; do command -v "$c" >/dev/null || die "$c is missing"; done
[ -x /usr/bin/time ] || die "/usr/bin/time is missing (Debian: apt-get install time)"
ROUNDS=${AUTH_ROUNDS:-5} REQUESTS=${AUTH_REQUESTS:-32} SECS=${AUTH_SECONDS:-1} CONNECTS=${AUTH_CONNECTS:-500}
[[ "$ROUNDS" =~ ^[1-9][0-9]?$ && "$ROUNDS" -le 20 ]] || die "AUTH_ROUNDS must be 1..20"
for k in REQUESTS CONNECTS; do [[ "${!k}" =~ ^[1-9][0-9]*$ ]] || die "AUTH_$k must be a whole number"; done
[[ "$SECS" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "AUTH_SECONDS must be a number of seconds"
RAW=$RES/raw
NOTE=$RES/notes # one line per thing the page must say about the run
OPEN_MSG="accepts links from anyone" # an engine with a port and no key says this once

KEYDIR="" LOCKED=0
cleanup() { # each once: past it, /tmp/bench.lock may be another run's
  [ -n "$KEYDIR" ] && rm -rf "$KEYDIR"
  [ "$LOCKED" = 1 ] && rm -f /tmp/bench.lock
  KEYDIR="" LOCKED=0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The run of one case: KIND (ops | pd), ROUND, TRANSPORT, VARIANT (onp | on | off | offb).
# Its files are $RAW/rROUND-KIND-TRANSPORT-VARIANT.{json,out,err,time}.
run_case() {
  local kind=$1 r=$2 t=$3 v=$4 base on=0 auth=() authed
  local env_cmd=(env -u HIXL_AUTH_KEY_FILE -u HIXL_AUTH_PAYLOAD_TAG)
  base=$RAW/r$r-$kind-$t-$v
  [ "${v#on}" = "$v" ] || on=1
  [ "$v" = onp ] && env_cmd+=(HIXL_AUTH_PAYLOAD_TAG=on)
  if [ "$kind" = ops ]; then
    [ "$on" = 0 ] || env_cmd+=("HIXL_AUTH_KEY_FILE=$KEYDIR/key")
    timed "$base" 300 "ops $t $v (round $r)" "${env_cmd[@]}" "$BENCH" --transport "$t" --block-sizes 4M --op both \
      --pin 0,1 --max-seconds "$SECS" --total 16G --no-progress --json "$base.json"
    # Is the mode what it says? An open engine says so once.
    if [ "$on" = 1 ] && grep -q "$OPEN_MSG" "$base.err"; then
      die "ops $t on (round $r): an engine ran without a key despite HIXL_AUTH_KEY_FILE; see $base.err"
    elif [ "$on" = 0 ] && ! grep -q "$OPEN_MSG" "$base.err"; then
      echo "hixl-bench's keyless target did not say \"$OPEN_MSG\" (round $r, $t, $v): off was not confirmed from its log" >>"$NOTE"
    fi
  else
    # The mock host makes its own fresh key when on; --auth-key none is off.
    [ "$on" = 1 ] || auth=(--auth-key none)
    timed "$base" 400 "pd $t $v (round $r)" "${env_cmd[@]}" "$MHOST" --transport "$t" --requests "$REQUESTS" \
      "${auth[@]}" --timeout 360 --no-progress --json "$base.json"
    # Its links line says whether they were authenticated.
    grep -q "links *authenticated" "$base.out" && authed=1 || authed=0
    [ "$authed" = "$on" ] || die "pd $t $v (round $r): its links line says otherwise; see $base.out"
  fi
}

measure() {
  local r t v order kind t0=$SECONDS
  rm -rf "$RAW" "$NOTE"
  mkdir -p "$RAW"
  KEYDIR=$(mktemp -d /tmp/hixl-run-auth-XXXXXX) || die "mktemp -d failed"
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$KEYDIR/key") || die "cannot write the key"
  # on a shared machine: wait while /tmp/ci.lock or /tmp/bench.lock exists, then hold
  # /tmp/bench.lock (cleanup removes it on any exit)
  if [ "${AUTH_LOCK:-1}" != 0 ]; then
    while [ -e /tmp/ci.lock ] || [ -e /tmp/bench.lock ]; do
      log "waiting for /tmp/ci.lock and /tmp/bench.lock to go away"
      sleep 30
    done
    touch /tmp/bench.lock && LOCKED=1
  fi
  echo "before: $(load)" >"$RES/load"
  git -C "$SRC" rev-parse --short HEAD >"$RES/head" 2>/dev/null
  date -u +"%Y-%m-%d %H:%M UTC" >"$RES/date"
  log "the frame proof's primitives (hixl-auth-bench --frames)"
  timeout -k 10 300 "$ABENCH" --frames --json "$RES/frames.json" >"$RES/frames.out" 2>"$RAW/frames.err" ||
    die "hixl-auth-bench --frames failed; see $RAW/frames.err"
  log "$ROUNDS rounds: 4 MiB ops (${SECS} s per op), P/D ($REQUESTS requests), connects ($CONNECTS per mode); tcp and auto; load $(load)"
  for ((r = 1; r <= ROUNDS; r++)); do
    order=(onp on off offb)
    ((r % 2)) || order=(offb off on onp)
    for kind in ops pd; do
      for t in tcp auto; do
        for v in "${order[@]}"; do
          [ ! -e /tmp/ci.lock ] || echo "/tmp/ci.lock existed during round $r ($kind $t $v)" >>"$NOTE"
          log "round $r/$ROUNDS: $kind $t $v ($((SECONDS - t0)) s)"
          run_case "$kind" "$r" "$t" "$v"
        done
      done
    done
    log "round $r/$ROUNDS: connects"
    timed "$RAW/r$r-conn" 300 "hixl-auth-bench (round $r)" env -u HIXL_AUTH_KEY_FILE "$ABENCH" --connects "$CONNECTS" \
      --aa --transports tcp,auto --no-progress --json "$RAW/r$r-conn.json"
    echo "after round $r: $(load)" >>"$RES/load"
    log "round $r done after $((SECONDS - t0)) s; about $(((SECONDS - t0) * (ROUNDS - r) / r)) s to go"
  done
  echo "$((SECONDS - t0))" >"$RES/elapsed"
  cleanup
}

[ "${AUTH_REPORT_ONLY:-0}" = 1 ] || measure
ls "$RAW"/r*-ops-*.json >/dev/null 2>&1 || die "no results in $RAW"

# What the page records of the tree and the machine: where the uncommitted changes are
# ("core/src/transport (5), plugin/src (11)"), and whether the plugin checks capabilities.
CHANGED=$(git -C "$SRC" status --porcelain --untracked-files=no 2>/dev/null | awk '{ print $2 }')
WHERE=$(awk -F/ 'NF { print (NF > 3 ? $1 "/" $2 "/" $3 : NF > 2 ? $1 "/" $2 : $1) }' <<<"$CHANGED" | sort | uniq -c |
  awk '{ printf "%s%s (%s)", s, $2, $1; s = ", " }')
CAP_SRC=no CAP_BIN=no
grep -q "cap_check" "$SRC/plugin/src/kv_service.c" 2>/dev/null && CAP_SRC=yes
# (no pipe into grep -q: with pipefail, nm's SIGPIPE would read as "not found")
if command -v nm >/dev/null; then
  grep -q kv_cap_make <(nm "$PLUGIN" 2>/dev/null) && CAP_BIN=yes
else
  grep -qa "wrong capability" "$PLUGIN" && CAP_BIN=yes
fi
LIB=$(find "$BUILD/core" -maxdepth 1 -name 'libhixl.so.*.*' -print -quit)

AUTH_CPU="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)" AUTH_NCPU=$(nproc) \
  AUTH_KERNEL=$(uname -r) AUTH_DATE=$(date -u +"%Y-%m-%d %H:%M UTC") \
  AUTH_HEAD=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo "?") AUTH_DIRTY=$(grep -c . <<<"$CHANGED") \
  AUTH_BUILT="$(date -u -r "${LIB:-$BENCH}" +"%Y-%m-%d %H:%M UTC")" AUTH_WHERE="$WHERE" AUTH_CAP_SRC=$CAP_SRC \
  AUTH_CAP_BIN=$CAP_BIN AUTH_REQUESTS_N=$REQUESTS AUTH_SECS=$SECS AUTH_CONNECTS_N=$CONNECTS AUTH_BUILD=$BUILD \
  report auth "$RES" "$OUT" "$SRC/docs/performance-auth.md"
log "wrote $OUT and $RES/auth.json"
