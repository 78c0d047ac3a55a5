#!/usr/bin/env bash
# check_gather_ptx.sh SRC_DIR: core/src/devmem/gather_ptx.h is what gen_gather_ptx.sh
# makes of gather.cu now (the sha256 it records), and where the toolkit's ptxas is
# found, its PTX assembles for the oldest GPU it names (sm_75) and for Hopper (sm_90).
set -euo pipefail
dir=${1:?usage: check_gather_ptx.sh SRC_DIR}/core/src/devmem
want=$(sha256sum "$dir/gather.cu" | cut -c1-64)
have=$(sed -n 's/^ \* gather\.cu sha256 \([0-9a-f]\{64\}\)$/\1/p' "$dir/gather_ptx.h")
if [ "$want" != "$have" ]; then
  echo "check_gather_ptx: gather_ptx.h was made from another gather.cu ($have, now $want): run gen_gather_ptx.sh" >&2
  exit 1
fi
echo "check_gather_ptx: gather_ptx.h matches gather.cu ($want)"
ptxas=$(command -v ptxas || true)
[ -n "$ptxas" ] || [ ! -x /usr/local/cuda/bin/ptxas ] || ptxas=/usr/local/cuda/bin/ptxas
if [ -z "$ptxas" ]; then
  echo "check_gather_ptx: no ptxas here: the PTX itself not assembled"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The C string's lines back to PTX: "    \"...\\n\"" -> ...
sed -n '/^static const char hixl_gather_ptx\[\] =$/,/^    ;$/p' "$dir/gather_ptx.h" | sed '1d;$d' |
  sed -e 's/^    "//' -e 's/\\n"$//' -e 's/\\"/"/g' -e 's/\\\\/\\/g' >"$tmp/g.ptx"
grep -q '^\.entry\|^\.visible \.entry hixl_gather_copy(' "$tmp/g.ptx"
for arch in sm_75 sm_90; do
  "$ptxas" -arch=$arch "$tmp/g.ptx" -o "$tmp/g.$arch.cubin"
  echo "check_gather_ptx: assembles for $arch"
done
