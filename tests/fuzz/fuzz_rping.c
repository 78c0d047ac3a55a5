/* fuzz_rping: RPing's packet parser (core/src/rping/rping_wire.c) against arbitrary
 * bytes. A datagram may come from anyone who reaches the port: whatever decodes must
 * encode to the same bytes (and a HELLO_ACK's endpoint, if it has one, too), whatever
 * does not must leave the packet untouched, and the responder's encoding in place of an
 * answer must stay inside the datagram. Invariants abort(). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rping/rping_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                          \
  do {                                                                                                       \
    if (!(cond)) {                                                                                           \
      fprintf(stderr, "fuzz_rping: %s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);               \
      abort();                                                                                               \
    }                                                                                                        \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *b = malloc(size ? size : 1), out[RP_MAX_PKT + 64]; /* exactly the bytes: over-reads are seen */
  CHECK(b != NULL);
  memcpy(b, data, size);
  struct rp_pkt p, untouched;
  memset(&p, 0xa5, sizeof(p));
  untouched = p;
  enum rp_err e = rp_decode(b, size, &p);
  if (e != RP_OK) {
    CHECK(memcmp(&p, &untouched, sizeof(p)) == 0);
  } else {
    CHECK(size >= RP_HDR_LEN && size <= RP_MAX_PKT);
    size_t n = rp_encode(&p, out, sizeof(out));
    CHECK(n == size && memcmp(out, b, size) == 0);
    if (p.type == RP_HELLO_ACK && p.payload_len) {
      struct rp_ep ep;
      uint8_t again[RP_EP_LEN];
      CHECK(rp_ep_get(p.payload, p.payload_len, &ep) == RP_OK);
      CHECK(rp_ep_put(&ep, again) == RP_EP_LEN && memcmp(again, p.payload, RP_EP_LEN) == 0);
    }
    p.type = p.type == RP_HELLO ? RP_HELLO_ACK : p.type == RP_PING ? RP_PONG : p.type; /* as the responder */
    (void)rp_encode(&p, b, size);
  }
  (void)rp_err_str(e);
  free(b);
  return 0;
}
