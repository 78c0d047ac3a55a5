/* auth: the pre-shared keys an engine proves itself with, and the HMAC-SHA256
 * (OpenSSL's libcrypto; nothing here is cryptography written by hand) that the HELLO
 * handshake and the same-host binding compute with them.
 *
 * A key file (AuthKeyFile, or HIXL_AUTH_KEY_FILE) holds one or two keys, one per
 * line, each 32 to 128 hex digits (16 to 64 bytes); blank lines and lines starting
 * with '#' are skipped. It is refused when group or others have any permission on
 * it, or when it is owned by another user than this process's or root. Two keys at
 * once let a deployment rotate: add the new key beside the old one on every host, then
 * take the old one out; each change is read at the next handshake (the file's
 * identity, size, mtime and ctime are checked), with no restart. A relative path is
 * taken from the working directory at auth_open. A key is
 * named on the wire by its id, the first 8 bytes of HMAC(key, "hixl key id v1"). */
#ifndef HIXL_AUTH_H
#define HIXL_AUTH_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "hixl/hixl_status.h"

#define AUTH_NONCE_LEN 32u
#define AUTH_MAC_LEN   32u
#define AUTH_ID_LEN    8u
#define AUTH_KEYS_MAX  2u
#define AUTH_KEY_MIN   16u
#define AUTH_KEY_MAX   64u
#define AUTH_PATH_MAX  1024u

struct auth_key {
  uint8_t k[AUTH_KEY_MAX];
  size_t len;
  uint8_t id[AUTH_ID_LEN];
};

/* The keys in force at one moment, copied out for a handshake. */
struct auth_ring {
  struct auth_key key[AUTH_KEYS_MAX];
  unsigned n; /* 0: no authentication */
};

/* An engine's key file and what was last read from it. */
struct auth {
  pthread_mutex_t mu;
  char path[AUTH_PATH_MAX]; /* "": no key file, anyone is accepted */
  struct auth_ring ring;
  dev_t dev; /* the file as last read: a change to any of these re-reads it */
  ino_t ino;
  struct timespec mtime;
  struct timespec ctime;
  off_t size;
  bool reload_failed; /* the last re-read failed (logged once until one succeeds) */
};

/* Parse a key file's text (it is overwritten) into ring; false with why. */
bool auth_parse(char *text, struct auth_ring *ring, char *why, size_t cap);
/* The struct's lifetime is the engine's (its mutex outlives every Initialize and
 * Finalize, so a Connect racing a Finalize reads keys or none, never a dead mutex). */
void auth_init(struct auth *a);
void auth_destroy(struct auth *a);
/* Read path (NULL or "": no authentication). Fails, naming the file and the reason,
 * when it cannot be read, has group or other permissions, another owner, or holds no
 * valid key. */
HixlStatus auth_open(struct auth *a, const char *path);
void auth_close(struct auth *a); /* the keys are wiped: no authentication until the next open */
bool auth_enabled(struct auth *a);
/* The keys in force (n 0: none, no authentication), re-reading the file first if it
 * changed; a file that no longer reads keeps the keys read before (logged). Wipe *out
 * after use (auth_wipe). */
void auth_current(struct auth *a, struct auth_ring *out);
void auth_wipe(void *p, size_t n);

/* HMAC-SHA256 of the concatenation of n parts under key. */
void auth_hmac(const struct auth_key *key, const void *const *parts, const size_t *lens, unsigned n,
               uint8_t out[AUTH_MAC_LEN]);
/* Constant-time comparison (CRYPTO_memcmp): true when equal. */
bool auth_equal(const void *a, const void *b, size_t n);
/* n random bytes (getrandom); false if the kernel has none to give. */
bool auth_random(void *p, size_t n);
/* The HELLO handshake's MACs: HMAC(key, label || nonce_i || nonce_t || key id ||
 * u16 len || name_i || u16 len || name_t || u32 caps_i || u16 len || dialled), lengths
 * and caps big-endian; dialled is the address the initiator dialled (channel binding:
 * a relay that passes the handshake on to another engine changes what that engine
 * sees dialled, or the proofs no longer match).
 * Labels: AUTH_LABEL_TARGET (the target's proof), AUTH_LABEL_INITIATOR (the
 * initiator's), AUTH_LABEL_SESSION (the link's session secret, never sent). */
#define AUTH_LABEL_TARGET    "hixl auth v2 target"
#define AUTH_LABEL_INITIATOR "hixl auth v2 initiator"
#define AUTH_LABEL_SESSION   "hixl auth v2 session"
void auth_transcript_mac(const struct auth_key *key, const char *label, const uint8_t nonce_i[AUTH_NONCE_LEN],
                         const uint8_t nonce_t[AUTH_NONCE_LEN], const void *name_i, size_t name_i_len,
                         const void *name_t, size_t name_t_len, uint32_t caps_i, const void *dialled,
                         size_t dialled_len, uint8_t out[AUTH_MAC_LEN]);
/* ... and the HELLO's extensions (wire.h WIRE_HELLO_EXT_MAX), whole, known or not: a
 * relay that drops or alters one fails the proofs. None (ext_len 0): the same MAC as
 * auth_transcript_mac, so engines from before extensions still agree. */
void auth_transcript_mac_ext(const struct auth_key *key, const char *label,
                             const uint8_t nonce_i[AUTH_NONCE_LEN], const uint8_t nonce_t[AUTH_NONCE_LEN],
                             const void *name_i, size_t name_i_len, const void *name_t, size_t name_t_len,
                             uint32_t caps_i, const void *dialled, size_t dialled_len, const void *ext,
                             size_t ext_len, uint8_t out[AUTH_MAC_LEN]);
/* The key of ring with this id, or NULL. */
const struct auth_key *auth_key_by_id(const struct auth_ring *ring, const uint8_t id[AUTH_ID_LEN]);

/* Frame proofs (docs/security.md, "Every frame proven"). After an authenticated
 * handshake every frame on the link carries a tag of AUTH_TAG_LEN bytes: AES-256-GCM's
 * tag over no plaintext, with the frame's header and body as associated data (GMAC),
 * under the key of its direction (HMAC(session, AUTH_LABEL_FRAMES_I2T or _T2I)), the
 * nonce being the direction's count of frames (u32 1, u64 count, big-endian). A frame
 * inserted, replayed, reordered, dropped or altered fails the next check, and the link
 * ends. One auth_seal per direction: tx seals, rx checks; each call moves its count on. */
#define AUTH_TAG_LEN          16u
#define AUTH_LABEL_FRAMES_I2T "hixl frames v1 initiator to target"
#define AUTH_LABEL_FRAMES_T2I "hixl frames v1 target to initiator"
struct auth_seal {
  void *ctx; /* EVP_CIPHER_CTX with the direction's key */
  uint64_t seq;
  bool data_ok; /* a payload's tag is under way and OpenSSL took every piece */
};
struct auth_frames {
  struct auth_seal tx, rx;
  bool on; /* the link was authenticated: every frame from here on is tagged */
};
/* Derive both directions' keys from the link's session secret; the initiator sends with
 * I2T. false when OpenSSL cannot (out of memory): the link must not go on. */
bool auth_frames_init(struct auth_frames *f, const uint8_t session[AUTH_MAC_LEN], bool initiator);
void auth_frames_free(struct auth_frames *f);
/* to takes from's state; from is left off. */
void auth_frames_move(struct auth_frames *to, struct auth_frames *from);
/* The tag of the next frame (its bytes: a, then b; b may be NULL). */
void auth_seal_frame(struct auth_seal *s, const void *a, size_t alen, const void *b, size_t blen,
                     uint8_t tag[AUTH_TAG_LEN]);
/* Whether tag is the next frame's (compared in constant time). */
bool auth_check_frame(struct auth_seal *s, const void *a, size_t alen, const void *b, size_t blen,
                      const uint8_t tag[AUTH_TAG_LEN]);
/* A payload's tag (AuthPayloadTag): GMAC over its bytes, fed in pieces, under the
 * direction's key with the nonce (2, the count of the frame it follows: s->seq - 1
 * once that frame's tag was made or checked). Between begin and end, s tags or checks
 * no other frame (a stream carries one payload at a time). */
void auth_data_begin(struct auth_seal *s, uint64_t frame_seq);
void auth_data_add(struct auth_seal *s, const void *p, size_t n);
void auth_data_end(struct auth_seal *s, uint8_t tag[AUTH_TAG_LEN]);

#endif
