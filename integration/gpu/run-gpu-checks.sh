#!/usr/bin/env bash
# run-gpu-checks.sh BUILD_DIR|PACK_DIR [OUT_DIR]
#
# The GPU checks of docs/device-memory.md, as one script for a machine with an NVIDIA
# GPU and its driver (the project's lent device machine: it reaches nothing outside,
# so it runs a build made elsewhere: a PACK_DIR made by pack.sh, carried along, whose
# libraries and paths this script sets up; or a BUILD_DIR made there). It records the
# GPU and driver, then runs the device-memory tests for real on device 0:
# hixl-gpu-check (gpu_check: two engines on cuMemAlloc'd buffers, every byte read
# back, then cuMemcpy DtoD / DtoH beside hixl's device WRITE as ratios, and a child
# process's device memory READ by CUDA IPC beside cuMemcpyDtoD), the provider's tests
# (test_devmem and the rest, the driver found this time: host memory called device
# memory is refused by it), the CS API's and the cache manager's argument tests, and the
# mock host's hand-offs with cuMemAlloc'd KV caches in both processes (mock_host_cuda*:
# pull and push over tcp, pull and push over the same-host link by CUDA IPC, device to
# device, which --expect-device-ipc checks), every byte copied back and checked; the
# host stand-in's tests beside them. The RDMA ones are left out (no RDMA device there).
# A GPU test that skips (77) here says why: no driver or no device is a failure of this
# run, not a pass.
# Output: OUT_DIR/gpu-checks.txt (default ./gpu-checks), the whole log.
#   On the device tool: run(command="bash integration/gpu/run-gpu-checks.sh gpu-pack $OUT/gpu",
#                           carry=["gpu-pack"], timeout_s=540)
set -uo pipefail
build=${1:?usage: run-gpu-checks.sh BUILD_DIR|PACK_DIR [OUT_DIR]}
out=${2:-gpu-checks}
mkdir -p "$out"
log=$out/gpu-checks.txt
src=$(cd "$(dirname "$0")/../.." && pwd)
if [ -f "$build/build.origin" ]; then # a pack: its build and libraries, its paths made this copy's
  pack=$(cd "$build" && pwd)
  build=$pack/build
  export LD_LIBRARY_PATH=$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  old_build=$(cat "$pack/build.origin")
  old_src=$(cat "$pack/src.origin")
  find "$build" -name CTestTestfile.cmake -exec sed -i -e "s#$old_build#$build#g" -e "s#$old_src#$src#g" {} +
  HIXL_KV_PLUGIN=$(find "$build" -name libhixl_kv_connector.so | head -n 1)
  export HIXL_KV_PLUGIN # the mock host's default is the path it was built at
fi
{
  echo "== $(date -u +%FT%TZ) on $(hostname), $build"
  nvidia-smi -L 2>&1 || echo "nvidia-smi: not found"
  nvidia-smi --query-gpu=driver_version,memory.total --format=csv 2>&1 || true
  ldconfig -p 2>/dev/null | grep 'libcuda\.so\.1' || echo "libcuda.so.1: not in the loader's cache"
  echo "== libraries not found (none expected):"
  find "$build" -type f -perm -u+x -print0 | xargs -0 -r ldd 2>/dev/null | grep 'not found' | sort -u
} >"$log"
rc=0
. "$src/integration/gpu/tests.sh"
(cd "$build" && ctest --output-on-failure --timeout 300 -R "$GPU_TESTS_R" -E "$GPU_TESTS_E") >>"$log" 2>&1 || rc=$?
if grep -qE '^[[:space:]]*[0-9]+ - (gpu_check|mock_host_cuda[a-z_]*) \(Skipped\)' "$log"; then
  echo "run-gpu-checks: a GPU test skipped on the GPU machine (see $log)" | tee -a "$log" >&2
  rc=1
fi
echo "run-gpu-checks: exit $rc; log in $log" | tee -a "$log"
exit $rc
