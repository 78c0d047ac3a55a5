#!/usr/bin/env bash
# Mixed builds, as an operator upgrading a deployment one instance at a time runs them:
# the KV connector plugin of each older COMMIT is built in a temporary directory (a
# detached git worktree there, only the hixl_kv_connector target), and hixl-mock-host
# runs it against this tree's plugin both ways (old prefill + new decode, new prefill +
# old decode), pull and push, over tcp and shm, with the default key (a fresh one made
# for the run). Each run must pass: every request verified, every byte checked, 0 blocks
# held on both sides (the host's count and the plugin's). docs/plugin.md, "Mixed
# versions", says what an older peer gets. Not in CI: an older build takes a minute or
# more on one job.
#
#   integration/scripts/upgrade-check.sh [options] COMMIT...
#     --build DIR   this tree's build (default build-test); hixl_kv_connector and
#                   hixl-mock-host are built there first
#     --keep DIR    build the older plugins in DIR and keep them (DIR/COMMIT.so is used
#                   again when it is there); default: a temporary directory, removed
#     --full        also llama8b (pull, tcp) each way; the faults decode-aborts (old
#                   prefill, push) and prefill-dies (old decode, push); and RENEW: a
#                   request waits in decode's queue past the producer's lease (--queue-ms
#                   2000 --lease-ms 1500, pull), each way
#     --devmem      also the KV in device memory (device-sim: HIXL_TEST_DEVMEM=host,
#                   both builds with HIXL_BUILD_TESTS on), pull and push, tcp and shm
#     --key none    run without a key (keyed links between builds on either side of
#                   the frame-proving change, f97fb9a, do not link: by design)
#     --jobs N      build jobs (default 1)
#
# One line per run: old commit, direction, mode, transport, key, model, result, blocks
# held at exit (prefill host,plugin / decode host,plugin), seconds. A run where the
# older build lacks what the run needs (RENEW before a52fc54, on_new_request's ABI 1.6;
# device memory told to an initiator before WIRE_CAP_DEVMEM, 8417983) passes when
# every request was recomputed, none failed or wrong, 0 blocks held: "as designed".
# Exits 1 when any run failed (its output is kept, named in the line).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build="$top/build-test"
keep=""
full=0
devmem=0
key=default
jobs=1
commits=()
while [ $# -gt 0 ]; do
  case "$1" in
  --build) build=$(cd "$2" && pwd); shift 2 ;;
  --keep) mkdir -p "$2"; keep=$(cd "$2" && pwd); shift 2 ;;
  --full) full=1; shift ;;
  --devmem) devmem=1; shift ;;
  --key) key="$2"; shift 2 ;;
  --jobs) jobs="$2"; shift 2 ;;
  -h | --help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "upgrade-check: unknown option $1" >&2; exit 2 ;;
  *) commits+=("$1"); shift ;;
  esac
done
[ ${#commits[@]} -gt 0 ] || { echo "upgrade-check: name at least one older commit (see --help)" >&2; exit 2; }
[ "$key" = default ] || [ "$key" = none ] || { echo "upgrade-check: --key default|none" >&2; exit 2; }
command -v jq >/dev/null || { echo "upgrade-check: needs jq" >&2; exit 2; }

work=$(mktemp -d /tmp/hixl-upgrade-XXXXXX)
dir=${keep:-$work}
cleanup() {
  for c in "${commits[@]}"; do
    if [ -d "$work/src-$c" ]; then git -C "$top" worktree remove --force "$work/src-$c" >/dev/null 2>&1 || true; fi
  done
  git -C "$top" worktree prune >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== this tree: hixl_kv_connector and hixl-mock-host in $build"
[ -f "$build/CMakeCache.txt" ] || cmake -S "$top" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$jobs" --target hixl_kv_connector hixl-mock-host >/dev/null
host="$build/integration/mock-host/hixl-mock-host"
new="$build/plugin/libhixl_kv_connector.so"
if [ $devmem = 1 ] && ! grep -q '^HIXL_BUILD_TESTS:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "upgrade-check: --devmem needs $build configured with HIXL_BUILD_TESTS=ON (the device stand-in)" >&2
  exit 2
fi
tests=$([ $devmem = 1 ] && echo ON || echo OFF)

old_plugin() { # the plugin of commit $1 as $dir/$1.so (with the device stand-in: $1-t.so), built once
  local c=$1 src="$work/src-$1" so="$dir/$1$([ $devmem = 1 ] && echo -t).so" t0
  [ -f "$so" ] && return 0
  t0=$(date +%s)
  git -C "$top" worktree add --detach "$src" "$c" >/dev/null 2>&1 ||
    { echo "upgrade-check: cannot check out $c" >&2; return 1; }
  if ! { cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHIXL_BUILD_TESTS=$tests &&
    cmake --build "$src/build" -j"$jobs" --target hixl_kv_connector; } >"$work/build-$c.log" 2>&1; then
    echo "upgrade-check: building $c failed ($work/build-$c.log)" >&2
    return 1
  fi
  cp "$src/build/plugin/libhixl_kv_connector.so" "$so"
  git -C "$top" worktree remove --force "$src" >/dev/null 2>&1 || true
  echo "== $c built in $(($(date +%s) - t0)) s"
}

# Whether commit $1 has commit $2 (an addition) in its history.
has() { git -C "$top" merge-base --is-ancestor "$2" "$1" 2>/dev/null; }

fails=0
n=0
printf '%-9s %-25s %-5s %-5s %-7s %-11s %-62s %-15s %s\n' old direction mode tr key model result \
  "held p/d" seconds
# run COMMIT DIRECTION(old-prefill|old-decode) MODE TRANSPORT MODEL KIND [host options...]
# KIND: plain (every request verified), fault (the host's verdict), renew, devmem
# (verified, or recomputed as designed where the older build lacks what is needed).
run() {
  local c=$1 way=$2 mode=$3 tr=$4 model=$5 kind=$6
  shift 6
  local pp dp out json rc t0 t1 res held so="$dir/$c$([ $devmem = 1 ] && echo -t).so" designed=""
  n=$((n + 1))
  out="$work/run-$n.log"
  json="$work/run-$n.json"
  if [ "$way" = old-prefill ]; then pp="$so" dp="$new"; else pp="$new" dp="$so"; fi
  local args=(--prefill-plugin "$pp" --decode-plugin "$dp" --mode "$mode" --transport "$tr" --model "$model"
    --no-progress --json "$json")
  [ "$model" = tiny ] && args+=(--requests 16)
  [ "$key" = none ] && args+=(--auth-key none)
  # What the older build cannot do, by design (docs/plugin.md, "Mixed versions").
  if [ "$kind" = renew ]; then
    if [ "$way" = old-prefill ] && ! has "$c" a52fc54; then designed="a producer before RENEW"; fi
    if [ "$way" = old-decode ] && ! has "$c" a52fc54; then designed="a consumer before on_new_request"; fi
  elif [ "$kind" = devmem ] && ! has "$c" 8417983; then
    if { [ "$way" = old-prefill ] && [ "$mode" = push ]; } || { [ "$way" = old-decode ] && [ "$mode" = pull ]; }; then
      designed="an initiator before WIRE_CAP_DEVMEM"
    fi
  fi
  t0=$(date +%s.%N)
  rc=0
  HIXL_LOG_LEVEL=warn "$host" "${args[@]}" "$@" >"$out" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  local ok=0 total=1
  if [ -f "$json" ]; then
    held=$(jq -r '"\(.prefill.blocks_total - .prefill.blocks_free),\(.prefill.blocks_held)/\(.decode.blocks_total - .decode.blocks_free),\(.decode.blocks_held)"' "$json")
    res="verified $(jq -r '"\(.verified)/\(.requests)"' "$json")"
    local clean='.prefill.blocks_total == .prefill.blocks_free and .decode.blocks_total == .decode.blocks_free and
      .prefill.blocks_held == 0 and .decode.blocks_held == 0'
    if [ "$kind" = fault ]; then
      [ $rc -eq 0 ] && ok=1
      res="$res, $(jq -r '.fault' "$json")"
    elif jq -e ".pass and .verified == .requests and $clean" "$json" >/dev/null; then
      ok=1
    elif [ -n "$designed" ] &&
      jq -e ".recomputed == .requests and .failed == 0 and .corrupt == 0 and $clean" "$json" >/dev/null; then
      ok=1
      res="recomputed $(jq -r '"\(.recomputed)/\(.requests)"' "$json") (as designed: $designed)"
    fi
  else
    res="no summary" held="-"
  fi
  [ $ok = 1 ] || { res="FAIL $res ($out)"; fails=$((fails + 1)); }
  printf '%-9s %-25s %-5s %-5s %-7s %-11s %-62s %-15s %.1f\n' "${c:0:9}" \
    "$way (new $([ "$way" = old-prefill ] && echo decode || echo prefill))" "$mode" "$tr" "$key" \
    "$model$([ "$kind" = plain ] || [ "$kind" = fault ] || echo "/$kind")" "$res" "$held" \
    "$(awk "BEGIN { print $t1 - $t0 }")"
  return 0
}

fast=(--lease-ms 1500 --set transfer_timeout_ms=1000 --set notify_timeout_ms=500)
for c in "${commits[@]}"; do
  old_plugin "$c" || { fails=$((fails + 1)); continue; }
  for way in old-prefill old-decode; do
    for mode in pull push; do
      for tr in tcp shm; do run "$c" $way $mode $tr tiny plain; done
    done
  done
  if [ $full = 1 ]; then
    run "$c" old-prefill pull tcp llama8b plain
    run "$c" old-decode pull tcp llama8b plain
    run "$c" old-prefill push tcp tiny fault --fault decode-aborts
    run "$c" old-decode push tcp tiny fault --fault prefill-dies "${fast[@]}"
    run "$c" old-prefill pull tcp tiny renew --queue-ms 2000 --lease-ms 1500 --concurrency 16
    run "$c" old-decode pull tcp tiny renew --queue-ms 2000 --lease-ms 1500 --concurrency 16
  fi
  if [ $devmem = 1 ]; then
    for way in old-prefill old-decode; do
      for mode in pull push; do
        for tr in tcp shm; do HIXL_TEST_DEVMEM=host run "$c" $way $mode $tr tiny devmem --kv-memory device-sim; done
      done
    done
  fi
done
echo "== $n runs, $fails failed${keep:+; plugins kept in $keep}"
if [ $fails -eq 0 ]; then rm -rf "$work"; else echo "   logs in $work"; fi
[ $fails -eq 0 ]
