/* kv_cap: the capability of a request held (pull) or expected (push), which every KV
 * service call on it must present (kv_service.c), and which travels to the peer as
 * "cap" in kv_transfer_params.
 *
 * A capability is HMAC-SHA256(key, request id) cut to KV_CAP_LEN bytes, the key being
 * KV_CAP_KEY_LEN random bytes of the scheduler that issues the request's params. It is
 * derived rather than drawn per request because the scheduler that hands it out
 * (request_finished, get_push_params) and the worker that checks it are different
 * connectors, usually different processes, and a FREE may reach the worker before the
 * step that holds the request: with the key (which each step's metadata carries to
 * the workers) a worker checks the capability of any id, held or not, without keeping
 * anything a peer could make it keep; so an early FREE is remembered only when it
 * proves that its id was issued. HMAC is a PRF: the capabilities of other requests
 * (a peer sees those it was given) say nothing of another id's. OpenSSL's libcrypto
 * does the cryptography; nothing here is written by hand. */
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>
#include <sys/random.h>

#include "kv_int.h"

hixl_kv_status kv_cap_key_new(uint8_t key[KV_CAP_KEY_LEN]) {
  ssize_t n;
  do n = getrandom(key, KV_CAP_KEY_LEN, 0); /* blocks only until the pool is first ready */
  while (n < 0 && errno == EINTR);
  if (n != (ssize_t)KV_CAP_KEY_LEN)
    return kv_fail(HIXL_KV_FAILED, "create: getrandom gave no capability key: %s",
                   n < 0 ? strerror(errno) : "short read");
  return HIXL_KV_SUCCESS;
}

void kv_cap_make(const uint8_t key[KV_CAP_KEY_LEN], const char *id, struct kv_cap *out) {
  uint8_t md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  memset(out, 0, sizeof(*out));
  if (!HMAC(EVP_sha256(), key, (int)KV_CAP_KEY_LEN, (const unsigned char *)id, strlen(id), md, &mdlen) ||
      mdlen < KV_CAP_LEN)
    return; /* none: every call on the request is refused, nothing is let through */
  memcpy(out->b, md, KV_CAP_LEN);
  out->len = KV_CAP_LEN;
  OPENSSL_cleanse(md, sizeof(md));
}

bool kv_cap_equal(const struct kv_cap *want, const struct kv_cap *got) {
  /* In constant time: the time taken says nothing of how many leading bytes matched. */
  return want->len == KV_CAP_LEN && got->len == KV_CAP_LEN && CRYPTO_memcmp(want->b, got->b, KV_CAP_LEN) == 0;
}

void kv_cap_hex(const struct kv_cap *c, char out[KV_CAP_HEX]) {
  static const char digit[] = "0123456789abcdef";
  for (unsigned i = 0; i < KV_CAP_LEN; i++) {
    out[2 * i] = digit[c->b[i] >> 4];
    out[2 * i + 1] = digit[c->b[i] & 15];
  }
  out[2 * KV_CAP_LEN] = '\0';
}

static int hex_value(char x) {
  if (x >= '0' && x <= '9') return x - '0';
  if (x >= 'a' && x <= 'f') return x - 'a' + 10;
  if (x >= 'A' && x <= 'F') return x - 'A' + 10;
  return -1;
}

bool kv_cap_parse_hex(const char *s, size_t n, struct kv_cap *out) {
  struct kv_cap c = {.len = KV_CAP_LEN};
  if (n != 2 * KV_CAP_LEN) return false;
  for (unsigned i = 0; i < KV_CAP_LEN; i++) {
    int hi = hex_value(s[2 * i]), lo = hex_value(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    c.b[i] = (uint8_t)(hi << 4 | lo);
  }
  *out = c;
  return true;
}

void kv_cap_wipe(void *p, size_t n) { OPENSSL_cleanse(p, n); }
