# cli_test.sh: what the command-line tests share (integration/*/test_*_cli*.sh source it once
# $bin names the program under test): a scratch folder ($work), the processes to kill at
# exit ($pids), checks that count what failed, and cli_done, the last line.

work=$(mktemp -d)
fails=0
pids=()
cli_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cli_cleanup EXIT

check() { # check DESCRIPTION COMMAND...: run a shell test, report
  local what=$1
  shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
run() { # run NAME ARGS...: $bin's stdout to $work/NAME.out, stderr to .err, status to .rc
  local name=$1
  shift
  "$bin" "$@" >"$work/$name.out" 2>"$work/$name.err"
  echo $? >"$work/$name.rc"
}
rc_is() { [ "$(cat "$work/$1.rc")" = "$2" ] || { echo "  $1: exit $(cat "$work/$1.rc"), want $2"; cat "$work/$1.out" "$work/$1.err"; false; }; }
has() { grep -Eq -- "$2" "$work/$1" || { echo "  $1 lacks /$2/:"; cat "$work/$1"; false; }; }

cli_done() { # cli_done NAME: the summary line; the status 0 only when every check passed
  [ "$fails" = 0 ] && echo "$1: every check passed" || echo "$1: $fails checks failed"
  [ "$fails" = 0 ]
}
