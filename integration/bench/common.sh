# shellcheck shell=bash disable=SC2034 # (BIN, RES and the rest are for the scripts that source this)
# common.sh: the start every integration/bench script shares, sourced after NAME (the
# prefix of its messages) is set. SRC is this source tree.
set -u -o pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

die() { echo "$NAME: $*" >&2; exit 1; }
log() { echo "$NAME: $(date +%T) $*" >&2; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

# start USAGE ARGS...: dies with USAGE unless ARGS has a first word, the build directory,
# taken as BUILD (absolute); BIN is where it holds the benchmarks.
start() {
  [ $# -ge 2 ] || die "usage: $0 $1"
  BUILD=$(cd "$2" 2>/dev/null && pwd) || die "no build dir: $2"
  BIN=$BUILD/integration/bench
}

# page DOC TOOL DIR ARGS...: the start of a script that writes one page from one tool's runs,
# called with its own ARGS (BUILD_DIR [OUTPUT_MD]): OUT is OUTPUT_MD (default docs/DOC of this
# tree), BENCH the tool TOOL (built), RES the results dir DIR.
page() {
  start "BUILD_DIR [OUTPUT_MD]" "${@:4}"
  OUT=${5:-$SRC/docs/$1} BENCH=$BIN/$2
  need "$BENCH"
  results "$3"
}

# need FILE...: dies unless each was built.
need() {
  local f
  for f; do [ -e "$f" ] || die "$f is missing: build it first (cmake --build $BUILD)"; done
}

# results DIR: RES=BUILD/DIR, created.
results() {
  RES=$BUILD/$1
  mkdir -p "$RES" || die "cannot create $RES"
}

# report KIND ARGS...: report.py writes the page (under $PY when set, else python3).
report() {
  "${PY:-python3}" "$SRC/integration/bench/report.py" "$@" || die "the page could not be written"
}

# timed BASE LIMIT WHAT CMD...: CMD within LIMIT seconds, its output in BASE.out and BASE.err,
# the user, system and wall seconds of all its processes in BASE.time; dies if it fails.
timed() {
  local base=$1 limit=$2 what=$3 st=0
  timeout -k 10 "$limit" /usr/bin/time -f "%U %S %e" -o "$base.time" "${@:4}" >"$base.out" 2>"$base.err" || st=$?
  [ "$st" = 0 ] || die "$what failed with status $st$([ "$st" = 124 ] && echo ": timed out after $limit s"); see $base.err"
}
