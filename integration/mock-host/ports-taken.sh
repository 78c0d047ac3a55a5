#!/bin/sh
# ports-taken.sh HIXL_MOCK_HOST [ARGS...]: the mock host in a network namespace of its
# own (unshare -rn: its own loopback) whose ephemeral port range, 50000-50999, has every
# odd port (and 51000) bound by another process: the kernel's pick for port 0 is then
# an even port whose next one is taken, as on a busy machine where outgoing
# connections' ports (TIME_WAIT, 60 s) fill the range. The runs of TP ports the host
# finds for its ranks must come from elsewhere. Skipped (77) where no namespace can be
# made, or there is no python3 or ip.
if [ "${1:-}" != --in-netns ]; then
  for t in python3 ip unshare; do
    command -v $t >/dev/null 2>&1 || {
      echo "ports-taken.sh: no $t: skipped"
      exit 77
    }
  done
  unshare -rn true 2>/dev/null || {
    echo "ports-taken.sh: cannot make a network namespace (unshare -rn): skipped"
    exit 77
  }
  exec unshare -rn sh "$0" --in-netns "$@"
fi
shift
if ! ip link set lo up || ! echo "50000 50999" 2>/dev/null >/proc/sys/net/ipv4/ip_local_port_range; then
  echo "ports-taken.sh: cannot bring up the namespace's loopback or set its port range: skipped"
  exit 77
fi
set -e
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkfifo "$dir/ready"
python3 -c '
import signal, socket
held = []
for p in list(range(50001, 51000, 2)) + [51000]:
    s = socket.socket()
    s.bind(("127.0.0.1", p))
    held.append(s)
print("held", flush=True)
signal.pause()
' >"$dir/ready" &
holder=$!
read -r line <"$dir/ready"
[ "$line" = held ] || {
  echo "ports-taken.sh: the ports were not held"
  exit 1
}
rc=0
"$@" || rc=$?
kill "$holder"
exit $rc
