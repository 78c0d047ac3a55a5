# poll.sh: sourced by the rails fault scripts (test_rails_faults.sh, rdma_rails.sh).
# The caller defines $work (its stats file is $work/stats.json), $ipid (the initiator's
# pid, or empty) and fail MESSAGE; WAIT_SCALE (default 1) stretches every wait.

now_ms() { date +%s%3N; }
# num JQ / str JQ: a number (0 until there is one) or a string from the initiator's stats file
num() {
  local v
  v=$(jq -r "($1) // 0" "$work/stats.json" 2>/dev/null || true)
  echo "${v:-0}"
}
str() { jq -r "$1" "$work/stats.json" 2>/dev/null || true; }
# until_true SECONDS WHAT COND: poll COND (a shell test) every 50 ms until it holds, for
# SECONDS x WAIT_SCALE at most; fails early when the initiator ($ipid) exited
until_true() {
  local secs=$(($1 * ${WAIT_SCALE:-1})) what=$2 cond=$3 deadline
  deadline=$(($(now_ms) + secs * 1000))
  while ! eval "$cond"; do
    [ "$(now_ms)" -lt "$deadline" ] || fail "$what: not within $secs s (stats: $(cat "$work/stats.json" 2>/dev/null))"
    [ -z "$ipid" ] || kill -0 "$ipid" 2>/dev/null || fail "$what: the initiator exited early"
    sleep 0.05
  done
}
# reap_initiator SECONDS WHAT: wait for $ipid to exit, SECONDS x WAIT_SCALE at most (else
# fail with WHAT); its exit status in $reaped_rc, and $ipid emptied
reap_initiator() {
  local secs=$(($1 * ${WAIT_SCALE:-1})) deadline
  deadline=$(($(now_ms) + secs * 1000))
  while kill -0 "$ipid" 2>/dev/null; do
    [ "$(now_ms)" -lt "$deadline" ] || fail "$2: not within $secs s"
    sleep 0.05
  done
  reaped_rc=0
  wait "$ipid" || reaped_rc=$?
  ipid=
}
# stop_initiator SECONDS: SIGTERM ends the initiator's loop (the ops in flight complete and
# are checked, then it reports); it must exit within SECONDS x WAIT_SCALE, and with 0
stop_initiator() {
  kill -TERM "$ipid"
  reap_initiator "$1" "the initiator stopping after SIGTERM"
  [ "$reaped_rc" -eq 0 ] || fail "the initiator exited $reaped_rc (an op failed or read wrong bytes)"
}
