/* auth_frames: the tags every frame of an authenticated link carries (auth.h). GMAC
 * through OpenSSL's AES-256-GCM: with AES-NI and carry-less multiply it costs about a
 * quarter of a microsecond per frame header (integration/bench/run_auth.sh measures
 * it), where HMAC-SHA256 costs two. */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <string.h>

#include "util/auth.h"

#define FRAME_DOMAIN 1u /* the nonce's first word: frame tags */
#define DATA_DOMAIN  2u /* ... payload tags */

static bool seal_init(struct auth_seal *s, const struct auth_key *session, const char *label) {
  uint8_t key[AUTH_MAC_LEN];
  const void *parts[] = {label};
  const size_t lens[] = {strlen(label)};
  auth_hmac(session, parts, lens, 1, key);
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
  bool ok = ctx && EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, NULL) == 1;
  auth_wipe(key, sizeof(key));
  if (!ok) {
    EVP_CIPHER_CTX_free(ctx);
    return false;
  }
  s->ctx = ctx;
  s->seq = 0;
  return true;
}

bool auth_frames_init(struct auth_frames *f, const uint8_t session[AUTH_MAC_LEN], bool initiator) {
  struct auth_key k = {.len = AUTH_MAC_LEN};
  memcpy(k.k, session, AUTH_MAC_LEN);
  auth_frames_free(f);
  bool ok = seal_init(&f->tx, &k, initiator ? AUTH_LABEL_FRAMES_I2T : AUTH_LABEL_FRAMES_T2I) &&
            seal_init(&f->rx, &k, initiator ? AUTH_LABEL_FRAMES_T2I : AUTH_LABEL_FRAMES_I2T);
  auth_wipe(&k, sizeof(k));
  if (!ok) auth_frames_free(f);
  f->on = ok;
  return ok;
}

void auth_frames_free(struct auth_frames *f) {
  EVP_CIPHER_CTX_free(f->tx.ctx);
  EVP_CIPHER_CTX_free(f->rx.ctx);
  memset(f, 0, sizeof(*f));
}

void auth_frames_move(struct auth_frames *to, struct auth_frames *from) {
  auth_frames_free(to);
  *to = *from;
  memset(from, 0, sizeof(*from));
}

static void put_iv(uint8_t iv[12], uint32_t domain, uint64_t seq) {
  iv[0] = (uint8_t)(domain >> 24), iv[1] = (uint8_t)(domain >> 16), iv[2] = (uint8_t)(domain >> 8);
  iv[3] = (uint8_t)domain;
  for (int i = 0; i < 8; i++) iv[4 + i] = (uint8_t)(seq >> (56 - 8 * i));
}

/* GMAC of a || b under s's key with nonce (FRAME_DOMAIN, seq); the count moves on. */
static void frame_tag(struct auth_seal *s, const void *a, size_t alen, const void *b, size_t blen,
                      uint8_t tag[AUTH_TAG_LEN]) {
  uint8_t iv[12];
  put_iv(iv, FRAME_DOMAIN, s->seq++);
  EVP_CIPHER_CTX *ctx = s->ctx;
  int outl = 0;
  bool ok = ctx && EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, iv) == 1 &&
            (alen == 0 || EVP_EncryptUpdate(ctx, NULL, &outl, a, (int)alen) == 1) &&
            (blen == 0 || EVP_EncryptUpdate(ctx, NULL, &outl, b, (int)blen) == 1) &&
            EVP_EncryptFinal_ex(ctx, tag, &outl) == 1 &&
            EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, AUTH_TAG_LEN, tag) == 1;
  /* GCM does not fail on these lengths; if it ever did, a random tag matches nothing
   * and the link ends at the peer. */
  if (!ok) auth_random(tag, AUTH_TAG_LEN);
}

void auth_data_begin(struct auth_seal *s, uint64_t frame_seq) {
  uint8_t iv[12];
  put_iv(iv, DATA_DOMAIN, frame_seq);
  s->data_ok = s->ctx && EVP_EncryptInit_ex(s->ctx, NULL, NULL, NULL, iv) == 1;
}

void auth_data_add(struct auth_seal *s, const void *p, size_t n) {
  int outl = 0;
  /* EVP takes an int: pieces of at most 1 GiB */
  for (const uint8_t *b = p; n > 0 && s->data_ok;) {
    size_t k = n < (1u << 30) ? n : (1u << 30);
    s->data_ok = EVP_EncryptUpdate(s->ctx, NULL, &outl, b, (int)k) == 1;
    b += k;
    n -= k;
  }
}

void auth_data_end(struct auth_seal *s, uint8_t tag[AUTH_TAG_LEN]) {
  int outl = 0;
  bool ok = s->data_ok && EVP_EncryptFinal_ex(s->ctx, tag, &outl) == 1 &&
            EVP_CIPHER_CTX_ctrl(s->ctx, EVP_CTRL_GCM_GET_TAG, AUTH_TAG_LEN, tag) == 1;
  if (!ok) auth_random(tag, AUTH_TAG_LEN);
  s->data_ok = false;
}

void auth_seal_frame(struct auth_seal *s, const void *a, size_t alen, const void *b, size_t blen,
                     uint8_t tag[AUTH_TAG_LEN]) {
  frame_tag(s, a, alen, b, blen, tag);
}

bool auth_check_frame(struct auth_seal *s, const void *a, size_t alen, const void *b, size_t blen,
                      const uint8_t tag[AUTH_TAG_LEN]) {
  uint8_t want[AUTH_TAG_LEN];
  frame_tag(s, a, alen, b, blen, want);
  return CRYPTO_memcmp(want, tag, AUTH_TAG_LEN) == 0;
}
