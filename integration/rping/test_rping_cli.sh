#!/usr/bin/env bash
# hixl-rping end to end on loopback: a --serve responder, then the table, JSON, a
# targets file, an unreachable target (exit 1), progress on long runs, mode roce and
# usage errors (exit 2). Readiness comes from the "ready" line, never a sleep.
set -uo pipefail
bin=$1
source "$(dirname "$0")/../cli_test.sh"

# A responder on 127.0.0.1, port chosen by hixl-rping and printed.
coproc SERVE { exec "$bin" --serve -q -d 127.0.0.1 -p 0; }
pids+=("$SERVE_PID")
if ! read -r -t 20 ready _ _ port <&"${SERVE[0]}" || [ "$ready" != ready ]; then
  echo "FAIL the responder did not start"
  exit 1
fi
echo "responder on 127.0.0.1:$port"
dead=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.3", 0)); print(s.getsockname()[1])' 2>/dev/null || echo 9)

run table -q -d 127.0.0.2 -c 5 -i 1 "127.0.0.1:$port"
check "table: exit 0" rc_is table 0
check "table: header" has table.out '^target +sent +recv +loss% +min_us +avg_us +max_us +status'
check "table: 5 sent, 5 received, 0% loss, ok" has table.out "^127\.0\.0\.1:$port +5 +5 +0\.0 +[0-9]+ +[0-9]+ +[0-9]+ +ok$"

run json -q --json -d 127.0.0.2 -c 4 -i 0 -l 100 -t 184 "127.0.0.1:$port"
check "json: exit 0" rc_is json 0
if command -v python3 >/dev/null; then
  check "json: parses, 4 received, reachable" python3 - "$work/json.out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
t = d["targets"][0]
assert d["count"] == 4 and d["tc"] == 184 and d["payload_len"] == 100, d
assert t["sent"] == 4 and t["received"] == 4 and t["reachable"] is True and t["state"] == "valid", t
assert t["rtt_us"]["min"] <= t["rtt_us"]["avg"] <= t["rtt_us"]["max"], t
PY
else
  check "json: 4 received" has json.out '"received": 4'
fi

printf '# targets\n\n  127.0.0.1   # the responder, default port\n' >"$work/targets"
run file -q -d 127.0.0.2 -c 2 -i 0 -p "$port" -f "$work/targets"
check "file: exit 0" rc_is file 0
check "file: the listed target" has file.out "^127\.0\.0\.1:$port +2 +2 "

run noroute -q -c 2 -i 0 "127.0.0.1:$port"
check "default device from the route: exit 0" rc_is noroute 0

run unreach -q -d 127.0.0.2 -c 3 -i 0 -w 300 "127.0.0.1:$port" "127.0.0.3:$dead"
check "unreachable: exit 1" rc_is unreach 1
check "unreachable: the live one is ok" has unreach.out "^127\.0\.0\.1:$port +3 +3 +0\.0 .* ok$"
check "unreachable: the dead one says so" has unreach.out "^127\.0\.0\.3:$dead +0 +0 +100\.0 +- +- +- +no responder$"

run unreach_json -q --json -d 127.0.0.2 -c 1 -w 200 "127.0.0.3:$dead"
check "only unreachable: exit 1" rc_is unreach_json 1
check "only unreachable: reachable false" has unreach_json.out '"reachable": false'

run progress -d 127.0.0.2 -c 3 -i 1000 -W 300 "127.0.0.1:$port"
check "long run: exit 0" rc_is progress 0
check "long run: progress on stderr" has progress.err 'probing 1 target'

run roce -q -m roce -d 127.0.0.2 "127.0.0.1:$port"
check "mode roce: exit 2" rc_is roce 2
check "mode roce: says RDMA is missing" has roce.err 'RDMA'

run notargets -q -d 127.0.0.2
check "no targets: exit 2" rc_is notargets 2
run badcount -q -c 0 127.0.0.1
check "count 0: exit 2" rc_is badcount 2
run badip -q 127.0.0.1.5
check "bad address: exit 2" rc_is badip 2

kill -TERM "${pids[0]}"
wait "${pids[0]}"
serve_rc=$?
pids=()
check "responder exits 0 on SIGTERM" test "$serve_rc" = 0

cli_done hixl-rping
