#!/usr/bin/env bash
# run_peers.sh --quick on this build, end to end (two points a path, one round): it must
# end 0 and write both paths' tables and the JSON, with every hixl run's bytes checked
# and figures for each hixl column. A peer not installed here is a row saying why, not
# a failure. Skips (77) on one CPU: the script pins initiators and targets apart.
set -uo pipefail
build=$1
src=$2
[ "$(nproc)" -ge 2 ] || { echo "test_run_peers: skipped: one CPU (the script pins to CPUs 0 and 1)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! bash "$src/integration/peers/run_peers.sh" --quick --build "$build" --out "$work" >"$work/out" 2>"$work/err"; then
  echo "FAIL run_peers.sh --quick ended $?"
  cat "$work/out" "$work/err"
  exit 1
fi
python3 - "$work" <<'PY'
import json, os, re, sys
work = sys.argv[1]
md = open(os.path.join(work, "peers.md")).read()
for title in ("### Loopback TCP (127.0.0.1)", "### Same host"):
    assert title in md, f"no table {title!r} in peers.md:\n{md}"
rows = [l for l in md.splitlines() if re.match(r"^\| READ \| (4|64) KiB \| 128 x 1 \|", l)]
assert len(rows) == 4, f"want 4 point rows, got {len(rows)}:\n{md}"
for r in rows:  # the last cell: verified, hixl's columns first ("yes"), NIXL's last
    v = [x.strip() for x in r.strip("|").split("|")[-1].split(",")]
    assert all(x == "yes" for x in v[:-1]), f"a hixl run not verified: {r}"
d = json.load(open(os.path.join(work, "peers.json")))
assert len(d["points"]) == 4, d["points"]
for p in d["points"]:
    hixl = ["hixl", "hixl-aa", "hixl-1buf", "hixl-1buf-aa"] + (["hixl-alloc"] if p["path"] == "shm" else [])
    for t in hixl:
        f = p["tools"].get(t)
        assert f and f["gbps"] > 0 and f["cpu_s_per_gib"] > 0, (p["path"], p["block"], t, f)
    span = p["block"] * p["batch"] * p["threads"]  # Mooncake's layout; one buffer: a block a thread
    assert p["tools"]["hixl"]["verified_bytes"] == span, (p, span)
    assert p["tools"]["hixl-1buf"]["verified_bytes"] == p["block"] * p["threads"], p
skipped = {s["tool"]: s["reason"] for s in d["skipped"]}
tools = {t for p in d["points"] for t in p["tools"]}
for peer in ("mooncake", "ucx", "nixl"):
    assert peer in tools or peer in skipped, f"{peer}: neither figures nor a reason"
print("test_run_peers: 4 points, every hixl run verified; peers measured:", sorted(tools & {"mooncake", "ucx", "nixl"}),
      "skipped:", sorted(skipped))
PY
