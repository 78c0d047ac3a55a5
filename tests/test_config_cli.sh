#!/usr/bin/env bash
# hixl-config as an operator runs it: every example checks, a bad document's errors
# come as FILE:LINE:COL: key: message with exit 1, show --json is JSON with the
# source of each value, --help works on every form, and `reference` is exactly the
# key table in docs/config.md.
set -euo pipefail
tool=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "test_config_cli: $*" >&2; exit 1; }

"$tool" check "$src"/config/examples/*.json >"$work/out"
[ "$(grep -c ': ok$' "$work/out")" -eq "$(ls "$src"/config/examples/*.json | wc -l)" ] || fail "an example does not check"

printf '{\n  "role": "producr",\n  "lease_ms": 5,\n  "lease_ms": 6\n}\n' >"$work/bad.json"
if "$tool" check "$work/bad.json" 2>"$work/err"; then fail "check passed a bad document"; fi
grep -qxF "$work/bad.json:2:11: role: \"producr\" is not one of: producer | consumer | both" "$work/err" ||
  { cat "$work/err"; fail "check's first error is not FILE:LINE:COL: key: message"; }
grep -qxF "$work/bad.json:4:3: lease_ms: duplicate key (first at 3:3); each key may appear once" "$work/err" ||
  { cat "$work/err"; fail "check did not list the second error"; }
set +e
"$tool" check "$work/nothing.json" 2>"$work/err"; rc=$?
set -e
[ $rc -eq 1 ] && grep -q "No such file or directory" "$work/err" || fail "a missing file: rc $rc"

# The key file, as Initialize will find it: none is a note; one Initialize refuses (open
# to others, no key in it, a line that is no key), or StagingUnregistered on without
# one, an error with Initialize's own reason (auth_open reads it); a file of mode 0600
# holding a key checks, saying nothing else.
echo '{"role": "producer"}' >"$work/nokey.json"
"$tool" check "$work/nokey.json" | grep -q "note: no AuthKeyFile" || fail "no note for a document without a key"
echo 00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff >"$work/k"
chmod 644 "$work/k"
echo "{\"AuthKeyFile\": \"$work/k\"}" >"$work/key.json"
if "$tool" check "$work/key.json" 2>"$work/err"; then fail "check passed a key file open to others"; fi
grep -qxF "$work/key.json: HixlEngineInitialize would fail: AuthKeyFile $work/k: mode 0644 gives group or others access to it: chmod 600 it" "$work/err" ||
  { cat "$work/err"; fail "the key file's mode"; }
chmod 600 "$work/k"
"$tool" check "$work/key.json" >"$work/out" 2>"$work/err" || { cat "$work/err"; fail "a key file of mode 0600 does not check"; }
[ "$(cat "$work/out")" = "$work/key.json: ok" ] && [ ! -s "$work/err" ] || { cat "$work/out" "$work/err"; fail "a good key file: more than ok"; }
check_key() { # CONTENT WHY: a key file of mode 0600 holding CONTENT fails check, saying WHY
  printf '%b' "$1" >"$work/k"
  if "$tool" check "$work/key.json" >"$work/out" 2>"$work/err"; then fail "check passed a key file of: $1"; fi
  grep -qxF "$work/key.json: HixlEngineInitialize would fail: AuthKeyFile $work/k: $2" "$work/err" ||
    { cat "$work/out" "$work/err"; fail "a key file of '$1': not \"$2\""; }
  ! grep -q ': ok$' "$work/out" || fail "a bad key file also said ok"
}
check_key '' 'no key in it (one line of 64 hex digits, e.g. from `openssl rand -hex 32`)'
check_key '# a comment\n\n' 'no key in it (one line of 64 hex digits, e.g. from `openssl rand -hex 32`)'
check_key 'not-a-key\n' 'line 1: a key is 32 to 128 hex digits, an even count (this line has 9 characters)'
check_key '00112233445566778899aabbccddeeffx0112233445566778899aabbccddeeff\n' 'line 1: not a hex digit at column 33'
check_key '00112233445566778899aabbccddeeff\n00112233445566778899aabbccddeeff\n' 'line 2: the same key twice'
check_key '00112233445566778899aabbccddeeff\n\0' 'it holds a NUL byte: a key file is text'
echo 00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff >"$work/k"
# A key file this user cannot read (its owner runs the engine): judged by kind and mode,
# its keys not read (a note); run as nobody where this test runs as root.
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null && as_nobody "$tool" --help >/dev/null 2>&1; then
  chmod 711 "$work"
  chmod 644 "$work/key.json"
  as_nobody "$tool" check "$work/key.json" >"$work/out" 2>"$work/err" || { cat "$work/err"; fail "an unreadable key file of mode 0600"; }
  grep -q "note: AuthKeyFile $work/k: this user cannot read it" "$work/out" && grep -q ': ok$' "$work/out" ||
    { cat "$work/out"; fail "no note for an unreadable key file"; }
  chmod 640 "$work/k"
  if as_nobody "$tool" check "$work/key.json" 2>"$work/err"; then fail "an unreadable key file of mode 0640 checked"; fi
  grep -q "mode 0640, open to group or others" "$work/err" || { cat "$work/err"; fail "an unreadable key file's mode"; }
  chmod 600 "$work/k"
  chmod 700 "$work"
fi
echo '{"StagingUnregistered": true}' >"$work/unreg.json"
if "$tool" check "$work/unreg.json" 2>"$work/err"; then fail "StagingUnregistered on without a key checked"; fi
grep -q "needs AuthKeyFile" "$work/err" || { cat "$work/err"; fail "StagingUnregistered without a key"; }

echo '{"role": "consumer", "RdmaServiceLevel": 3}' >"$work/ok.json"
HCCL_RDMA_TC=104 "$tool" show --json "$work/ok.json" >"$work/show.json"
python3 - "$work/show.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
k = d["keys"]
assert d["shape"] == "hixl", d
assert k["RdmaTrafficClass"] == {"value": "104", "source": "env HCCL_RDMA_TC"}, k["RdmaTrafficClass"]
assert k["role"] == {"value": "consumer", "source": "document 1:10"}, k["role"]
assert k["lease_ms"] == {"value": 30000, "source": "default"}, k["lease_ms"]
assert k["layer_pipelining"]["value"] is True
PY
HCCL_RDMA_TC=104 "$tool" show "$work/ok.json" | grep -q '^RdmaTrafficClass  *104  *(env HCCL_RDMA_TC)$' || fail "show"
"$tool" show - <"$work/ok.json" | grep -q '^role  *consumer  *(document 1:10)$' || fail "show from stdin"
# A value from the environment with a newline is shown escaped: it cannot forge a line.
HIXL_KV_TRACE_FILE=$'/tmp/t\nrole producer\x85' "$tool" show "$work/ok.json" >"$work/show.txt"
grep -q '^trace_file  */tmp/t\\nrole producer\\x85  *(env HIXL_KV_TRACE_FILE)$' "$work/show.txt" &&
  ! grep -q '^role producer' "$work/show.txt" || fail "show escapes control bytes"

# A key or value a document holds is quoted escaped, and cut: a newline in it (a JSON
# escape) cannot forge a line of check's output, nor a long value push out what is allowed.
printf '{\n "role": "producer",\n "a\\nforged:1:1: role: forged": 1,\n "mode": "x\\u001b[2K\\u0085"}\n' >"$work/nl.json"
if "$tool" check "$work/nl.json" 2>"$work/err"; then fail "check passed a document with unknown keys"; fi
[ "$(wc -l <"$work/err")" -eq 2 ] || { cat "$work/err"; fail "a key holding \\n: not one line per error"; }
grep -qxF "$work/nl.json:3:2: a\\nforged:1:1: role: forged: unknown key \"a\\nforged:1:1: role: forged\" (\`hixl-config reference\` lists the keys)" "$work/err" &&
  grep -qxF "$work/nl.json:4:10: mode: \"x\\x1b[2K\\u0085\" is not one of: pull | push" "$work/err" ||
  { cat "$work/err"; fail "a key or value holding control characters: not quoted escaped"; }
printf '{"mode": "%01000d"}' 0 >"$work/long.json"
if "$tool" check "$work/long.json" 2>"$work/err"; then fail "check passed a 1000-byte mode"; fi
grep -qxF "$work/long.json:1:10: mode: \"$(printf '%064d' 0)...\" is not one of: pull | push" "$work/err" ||
  { cat "$work/err"; fail "a 1000-byte value: not cut, or what is allowed lost"; }
# A value that is a file's name, in check's notes; a file's name itself.
printf '{"AuthKeyFile": "/nonexistent/k\\nforged.json: ok"}' >"$work/nlkey.json"
"$tool" check "$work/nlkey.json" >"$work/out" || fail "a document naming a key file not here"
[ "$(wc -l <"$work/out")" -eq 2 ] &&
  grep -qxF "$work/nlkey.json: note: AuthKeyFile /nonexistent/k\\nforged.json: ok: No such file or directory on this host (Initialize needs it where the engine runs)" "$work/out" ||
  { cat "$work/out"; fail "AuthKeyFile holding \\n: not one line"; }
if "$tool" check "$work/no"$'\n'"ne.json" 2>"$work/err"; then fail "check passed a missing file"; fi
[ "$(wc -l <"$work/err")" -eq 1 ] || { cat "$work/err"; fail "a file's name holding a newline: not one line"; }

for form in "" check show reference; do
  # shellcheck disable=SC2086
  "$tool" $form --help | grep -q "^usage: hixl-config check" || fail "--help after '$form'"
done
set +e
"$tool" frobnicate >/dev/null 2>&1; rc=$?
set -e
[ $rc -eq 2 ] || fail "an unknown command: rc $rc, want 2"

"$tool" reference >"$work/ref.md"
sed -n '/^<!-- BEGIN hixl-config reference -->$/,/^<!-- END hixl-config reference -->$/p' "$src/docs/config.md" |
  sed '1d;$d' >"$work/doc.md"
diff -u "$work/doc.md" "$work/ref.md" >&2 || fail "docs/config.md's key table differs from hixl-config reference: regenerate it"
echo "test_config_cli: examples, errors, show, --help and the reference in docs/config.md agree"
