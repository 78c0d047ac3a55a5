#!/bin/sh
# rdma-run.sh HIXL_MOCK_HOST [ARGS...]: the mock host with Transport rdma at the RDMA
# address of the soft-RoCE guest (HIXL_TEST_IP, set by integration/rxe-vm/run-rdma-tests.sh
# for the CTest label rdma); skipped (77) where there is none.
[ -n "${HIXL_TEST_IP:-}" ] || {
  echo "rdma-run.sh: no RDMA address (HIXL_TEST_IP): this runs in the soft-RoCE guest"
  exit 77
}
mh=$1
shift
exec "$mh" "$@" --ip "$HIXL_TEST_IP" --transport rdma
