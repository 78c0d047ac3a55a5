#!/usr/bin/env bash
# README command 2 (and .ci/run): build and run every test.
#  1. warnings-as-errors build + every CTest test (RDMA tests skip without a device),
#     with CUDA's cuda.h (from PyPI where none is installed: the device-memory code and
#     its tests on a fake CUDA driver need the header, not a GPU);
#  1b. the vLLM adapter's pytest suite (plugin/python) against that build's plugin;
#  1c. real vLLM on the CPU (integration/vllm, its own venv from PyPI): the adapter's
#     tests that use vLLM's classes, vLLM's Scheduler with hixl's connector, and
#     prefill -> decode vLLM instances handing off through hixl (run-pd.sh), with
#     asynchronous loads and with loads in the forward pass (load_in_forward, and
#     kv_role kv_both), and the scenarios of pd_check.py --scenarios;
#  2. the same suite built with AddressSanitizer + UBSan (zero errors, zero leaks);
#  2b. the same suite built with ThreadSanitizer: zero reports, from any process the
#     tests start (TSan writes each process's reports to build-tsan/tsan/);
#  3. a clang build of everything, and the wire, plugin-metadata and configuration
#     parsers fuzzed with libFuzzer, and a live engine's links (fuzz_link);
#  4. the RDMA suite (CTest label rdma) for real inside a QEMU guest with soft-RoCE;
#  5. formatting check against .clang-format.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
jobs=$(nproc)
bash "$top/integration/scripts/install-deps.sh"

# CUDA's cuda.h: the device-memory code (core/src/devmem, the cuda provider) and the
# fakecuda_* and gpu_check tests are built only where it is found; no GPU or driver is
# needed (the driver is loaded at run time; the tests bring a fake one). Debian's main
# has no cuda.h, so where none is installed (CUDA_HOME, /usr/local/cuda, /usr), it comes
# from PyPI's nvidia-cuda-runtime (CUDA 13.0's header) in a venv of its own.
cuda=()
have_cuda_h() {
  local d
  for d in "${CUDA_HOME:-}" /usr/local/cuda /usr /usr/local; do
    [ -n "$d" ] && [ -f "$d/include/cuda.h" ] && return 0
  done
  return 1
}
if ! have_cuda_h; then
  cvenv=$top/build-cuda-h
  find_cuda_h() { find "$cvenv" -path '*/include/cuda.h' -print -quit 2>/dev/null; }
  if [ -z "$(find_cuda_h)" ]; then
    [ -x "$cvenv/bin/python" ] || /usr/bin/python3 -m venv "$cvenv"
    "$cvenv/bin/python" -m pip install -q --disable-pip-version-check nvidia-cuda-runtime==13.0.96
  fi
  h=$(find_cuda_h)
  [ -n "$h" ] || { echo "hixl: no cuda.h in PyPI's nvidia-cuda-runtime ($cvenv)" >&2; exit 1; }
  echo "hixl: cuda.h from PyPI's nvidia-cuda-runtime: $h"
  cuda=(-DHIXL_CUDA_INCLUDE="$(dirname "$h")")
fi

echo "== build (-Werror) and test"
cmake -S "$top" -B "$top/build-test" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHIXL_WERROR=ON "${cuda[@]}" >/dev/null
cmake --build "$top/build-test" -j"$jobs"
# Without cuda.h the device-memory tests would be left out, not failed: that fails here.
(cd "$top/build-test" && ctest -N -L fakecuda | grep -q '^Total Tests: [1-9]') ||
  { echo "hixl: build-test has no fakecuda_* tests (no cuda.h found by CMake)" >&2; exit 1; }
(cd "$top/build-test" && ctest --output-on-failure --timeout 600)

echo "== the vLLM adapter (plugin/python) against build-test's plugin"
# Debian's interpreter, which has python3-torch and python3-pytest (a pyenv python3
# earlier on PATH may have neither); a missing one fails this stage, never skips it.
py=/usr/bin/python3
echo "hixl: python tests use $py ($($py --version 2>&1))"
for m in torch pytest; do
  $py -c "import $m" 2>/dev/null || { echo "hixl: $py cannot import $m (apt-get install python3-$m)" >&2; exit 1; }
done
$py -c 'import torch, pytest; print("hixl: torch", torch.__version__, "pytest", pytest.__version__)'
(cd "$top" && HIXL_KV_PLUGIN="$top/build-test/plugin/libhixl_kv_connector.so" PYTHONDONTWRITEBYTECODE=1 \
  $py -m pytest -q -p no:cacheprovider plugin/python/tests)

echo "== real vLLM on the CPU (integration/vllm): adapter and Scheduler tests in vLLM's venv, then run-pd.sh"
vvenv=$(bash "$top/integration/vllm/install.sh" | tail -1)
(cd "$top" && VLLM_TARGET_DEVICE=cpu HIXL_KV_PLUGIN="$top/build-test/plugin/libhixl_kv_connector.so" \
  PYTHONDONTWRITEBYTECODE=1 "$vvenv/bin/python" -m pytest -q -p no:cacheprovider \
  plugin/python/tests/test_signatures.py plugin/python/tests/test_factory.py plugin/python/tests/test_stats.py \
  plugin/python/tests/test_layout.py plugin/python/tests/test_binding.py plugin/python/tests/test_vllm_scheduler.py)
# Then pd_check.py's scenarios (about 40 s): a shared prefix, identical prompts at once,
# max_tokens 1 and short prompts, clients hanging up, a burst past max_num_seqs; the
# forward-pass run with kv_role kv_both on both sides and the prefix-cache scenarios.
HIXL_VLLM_VENV=$vvenv bash "$top/integration/vllm/run-pd.sh" --requests 20 --scenarios all
HIXL_VLLM_VENV=$vvenv bash "$top/integration/vllm/run-pd.sh" --requests 20 --connector hixl-fwd --kv-both \
  --scenarios prefix,same

echo "== ASan + UBSan build and test"
cmake -S "$top" -B "$top/build-asan" -DCMAKE_BUILD_TYPE=Debug -DHIXL_WERROR=ON -DHIXL_SANITIZE=ON "${cuda[@]}" >/dev/null
cmake --build "$top/build-asan" -j"$jobs"
(cd "$top/build-asan" &&
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure --timeout 900)

echo "== ThreadSanitizer build and test (zero reports in any process)"
cmake -S "$top" -B "$top/build-tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHIXL_WERROR=ON -DHIXL_TSAN=ON "${cuda[@]}" >/dev/null
cmake --build "$top/build-tsan" -j"$jobs"
rm -rf "$top/build-tsan/tsan" && mkdir -p "$top/build-tsan/tsan"
(cd "$top/build-tsan" && TSAN_OPTIONS="log_path=$top/build-tsan/tsan/log second_deadlock_stack=1" \
  ctest --output-on-failure --timeout 900 -LE fuzz)
reports=$(grep -l "WARNING: ThreadSanitizer" "$top/build-tsan/tsan/"* 2>/dev/null || true)
if [ -n "$reports" ]; then
  echo "ThreadSanitizer reported, in $(echo "$reports" | wc -l) process(es):"
  for f in $reports; do cat "$f"; done
  exit 1
fi

echo "== clang build (-Werror) and the parsers under libFuzzer (wire 60 s; plugin metadata, KV service, cache service, RPing, configuration and an engine's links 30 s each)"
CC=clang cmake -S "$top" -B "$top/build-fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHIXL_WERROR=ON -DHIXL_FUZZ=ON "${cuda[@]}" >/dev/null
cmake --build "$top/build-fuzz" -j"$jobs"
(cd "$top/build-fuzz" && ctest -L fuzz --output-on-failure)

echo "== RDMA suite inside the soft-RoCE guest (real verbs; a skip there is a failure)"
bash "$top/integration/rxe-vm/run-rdma-tests.sh" "$top/build-test"

echo "== clang-format"
bad=$(cd "$top" && git ls-files '*.c' '*.h' | while read -r f; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || echo "$f"; done)
if [ -n "$bad" ]; then echo "not formatted per .clang-format:"; echo "$bad"; exit 1; fi
echo "hixl: every test passed"
