#!/usr/bin/env bash
# run-gpu-checks.sh BUILD_DIR [OUT_DIR]
#
# The GPU checks of docs/device-memory.md, as one script for a machine with an NVIDIA
# GPU and its driver (the project's lent device machine: it reaches nothing outside,
# so BUILD_DIR is a build made elsewhere, with -DHIXL_BUILD_TESTS=ON where the CUDA
# toolkit's cuda.h was found, carried along). It records the GPU and driver, then runs
# the device-memory tests for real on device 0: hixl-gpu-check (gpu_check: two engines
# on cuMemAlloc'd buffers, every byte read back, then cuMemcpy DtoD / DtoH beside hixl's
# device WRITE as ratios), the provider's tests (test_devmem*, which find the driver
# this time) and the mock host's hand-offs with cuMemAlloc'd KV caches in both
# processes (mock_host_cuda*: pull and push over tcp, pull and push over the same-host
# link by CUDA IPC, device to device, which --expect-device-ipc checks), every byte
# copied back and checked. A test that skips (77) here
# says why: no driver or no device is a failure of this run, not a pass.
# Output: OUT_DIR/gpu-checks.txt (default ./gpu-checks), the whole log.
set -uo pipefail
build=${1:?usage: run-gpu-checks.sh BUILD_DIR [OUT_DIR]}
out=${2:-gpu-checks}
mkdir -p "$out"
log=$out/gpu-checks.txt
{
  echo "== $(date -u +%FT%TZ) on $(hostname)"
  nvidia-smi -L 2>&1 || echo "nvidia-smi: not found"
  nvidia-smi --query-gpu=driver_version,memory.total --format=csv 2>&1 || true
  ls -l /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1 2>/dev/null || true
} >"$log"
rc=0
(cd "$build" && ctest --output-on-failure --timeout 300 -R 'gpu_check|test_devmem|mock_host_cuda|mock_host_devmem') \
  >>"$log" 2>&1 || rc=$?
if grep -q "Skipped" "$log"; then
  echo "run-gpu-checks: a GPU test skipped on the GPU machine (see $log)" | tee -a "$log" >&2
  rc=1
fi
echo "run-gpu-checks: exit $rc; log in $log" | tee -a "$log"
exit $rc
