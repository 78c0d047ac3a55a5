#!/usr/bin/env bash
# Run the CTest labels "rdma" and "vm" (tests that need the guest kernel, e.g. netem) of BUILD_DIR (built on this host) inside a throw-away
# QEMU guest with soft-RoCE (rdma_rxe): real verbs, real RC queue pairs. The engines
# use the rxe device's address (HIXL_TEST_IP) and are told Transport rdma (tests read
# HIXL_REQUIRE_RDMA: auto would pick shm between two engines on one host), and a
# missing device fails instead of skipping. Then tos-on-wire.sh
# checks, on two rxe devices joined by a veth, that the IP TOS byte on the wire is
# the configured RdmaTrafficClass; then integration/rails/rdma_rails.sh runs RDMA rails
# (two rails of rxe devices on veths): striping, a rail's link down, 1% loss on a rail,
# the P/D hand-off over them, and a rail's device deleted.
#   integration/rxe-vm/run-rdma-tests.sh BUILD_DIR [CTEST_ARGS...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run-rdma-tests.sh BUILD_DIR [CTEST_ARGS...]}" && pwd)
shift
extra=$(printf ' %q' "$@")
RXE_VM_RW_DIR="$build" RXE_VM_TIMEOUT="${RXE_VM_TIMEOUT:-2400}" RXE_VM_MEM="${RXE_VM_MEM:-3072}" \
  bash "$here/run-in-rxe-vm.sh" \
  "cd $(printf %q "$build") && ulimit -l unlimited && HIXL_TEST_IP=\$RXE_IP HIXL_REQUIRE_RDMA=1 \
   ctest -L 'rdma|vm' --output-on-failure --no-tests=error$extra && \
   sh $(printf %q "$here/tos-on-wire.sh") $(printf %q "$build") && \
   bash $(printf %q "$here/../rails/rdma_rails.sh") $(printf %q "$build") stripe linkdown portevent blackhole loss handoff devdel"
