/* auth: key files, HMAC-SHA256 and constant-time comparison (see auth.h). */
#include "util/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/params.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/log.h"
#include "util/status_int.h"

#define KEY_FILE_MAX 4096 /* bytes: two keys and comments fit many times over */

static const char id_label[] = "hixl key id v1";

void auth_wipe(void *p, size_t n) { OPENSSL_cleanse(p, n); }

bool auth_equal(const void *a, const void *b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

bool auth_random(void *p, size_t n) {
  uint8_t *b = p;
  while (n > 0) {
    ssize_t k = getrandom(b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= (size_t)k;
  }
  return true;
}

static EVP_MAC *hmac_alg; /* fetched once: fetching per MAC costs a provider lookup */
static pthread_once_t hmac_once = PTHREAD_ONCE_INIT;
static void hmac_fetch(void) { hmac_alg = EVP_MAC_fetch(NULL, "HMAC", NULL); }

void auth_hmac(const struct auth_key *key, const void *const *parts, const size_t *lens, unsigned n,
               uint8_t out[AUTH_MAC_LEN]) {
  size_t olen = 0;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  pthread_once(&hmac_once, hmac_fetch);
  EVP_MAC_CTX *ctx = hmac_alg ? EVP_MAC_CTX_new(hmac_alg) : NULL;
  bool ok = ctx && EVP_MAC_init(ctx, key->k, key->len, params) == 1;
  for (unsigned i = 0; ok && i < n; i++) ok = EVP_MAC_update(ctx, parts[i], lens[i]) == 1;
  ok = ok && EVP_MAC_final(ctx, out, &olen, AUTH_MAC_LEN) == 1 && olen == AUTH_MAC_LEN;
  EVP_MAC_CTX_free(ctx);
  /* Only allocation can fail here; a MAC of random bytes then matches nothing. */
  if (!ok) auth_random(out, AUTH_MAC_LEN);
}

void auth_transcript_mac(const struct auth_key *key, const char *label, const uint8_t nonce_i[AUTH_NONCE_LEN],
                         const uint8_t nonce_t[AUTH_NONCE_LEN], const void *name_i, size_t name_i_len,
                         const void *name_t, size_t name_t_len, uint32_t caps_i, const void *dialled,
                         size_t dialled_len, uint8_t out[AUTH_MAC_LEN]) {
  auth_transcript_mac_ext(key, label, nonce_i, nonce_t, name_i, name_i_len, name_t, name_t_len, caps_i,
                          dialled, dialled_len, NULL, 0, out);
}

void auth_transcript_mac_ext(const struct auth_key *key, const char *label,
                             const uint8_t nonce_i[AUTH_NONCE_LEN], const uint8_t nonce_t[AUTH_NONCE_LEN],
                             const void *name_i, size_t name_i_len, const void *name_t, size_t name_t_len,
                             uint32_t caps_i, const void *dialled, size_t dialled_len, const void *ext,
                             size_t ext_len, uint8_t out[AUTH_MAC_LEN]) {
  uint8_t li[2] = {(uint8_t)(name_i_len >> 8), (uint8_t)name_i_len};
  uint8_t lt[2] = {(uint8_t)(name_t_len >> 8), (uint8_t)name_t_len};
  uint8_t ld[2] = {(uint8_t)(dialled_len >> 8), (uint8_t)dialled_len};
  uint8_t caps[4] = {(uint8_t)(caps_i >> 24), (uint8_t)(caps_i >> 16), (uint8_t)(caps_i >> 8),
                     (uint8_t)caps_i};
  uint8_t le[2] = {(uint8_t)(ext_len >> 8), (uint8_t)ext_len};
  const void *parts[] = {label,  nonce_i, nonce_t, key->id, li, name_i, lt,
                         name_t, caps,    ld,      dialled, le, ext};
  const size_t lens[] = {strlen(label),
                         AUTH_NONCE_LEN,
                         AUTH_NONCE_LEN,
                         AUTH_ID_LEN,
                         2,
                         name_i_len,
                         2,
                         name_t_len,
                         4,
                         2,
                         dialled_len,
                         2,
                         ext_len};
  auth_hmac(key, parts, lens, ext_len ? 13 : 11, out); /* no extensions: the transcript as before them */
}

const struct auth_key *auth_key_by_id(const struct auth_ring *ring, const uint8_t id[AUTH_ID_LEN]) {
  for (unsigned i = 0; i < ring->n; i++)
    if (memcmp(ring->key[i].id, id, AUTH_ID_LEN) == 0) return &ring->key[i];
  return NULL;
}

static int hexval(int ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

bool auth_parse(char *text, struct auth_ring *ring, char *why, size_t cap) {
  unsigned lineno = 0;
  ring->n = 0;
  for (char *line = text, *next; line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    lineno++;
    size_t len = strlen(line);
    while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t'))
      line[--len] = '\0';
    while (*line == ' ' || *line == '\t') line++, len--;
    if (len == 0 || line[0] == '#') continue;
    if (ring->n == AUTH_KEYS_MAX) {
      snprintf(why, cap, "line %u: more than %u keys (one in force and one being rotated)", lineno,
               AUTH_KEYS_MAX);
      return false;
    }
    if (len % 2 != 0 || len < 2 * AUTH_KEY_MIN || len > 2 * AUTH_KEY_MAX) {
      snprintf(why, cap,
               "line %u: a key is %u to %u hex digits, an even count (this line has %zu characters)", lineno,
               2 * AUTH_KEY_MIN, 2 * AUTH_KEY_MAX, len);
      return false;
    }
    struct auth_key *k = &ring->key[ring->n];
    for (size_t i = 0; i < len / 2; i++) {
      int hi = hexval((unsigned char)line[2 * i]), lo = hexval((unsigned char)line[2 * i + 1]);
      if (hi < 0 || lo < 0) {
        snprintf(why, cap, "line %u: not a hex digit at column %zu", lineno, 2 * i + (hi < 0 ? 1 : 2));
        return false;
      }
      k->k[i] = (uint8_t)(hi << 4 | lo);
    }
    k->len = len / 2;
    auth_wipe(line, len);
    uint8_t mac[AUTH_MAC_LEN];
    const void *parts[] = {id_label};
    const size_t lens[] = {sizeof(id_label) - 1};
    auth_hmac(k, parts, lens, 1, mac);
    memcpy(k->id, mac, AUTH_ID_LEN);
    for (unsigned j = 0; j < ring->n; j++)
      if (memcmp(ring->key[j].id, k->id, AUTH_ID_LEN) == 0) {
        snprintf(why, cap, "line %u: the same key twice", lineno);
        return false;
      }
    ring->n++;
  }
  if (ring->n == 0) {
    snprintf(why, cap, "no key in it (one line of 64 hex digits, e.g. from `openssl rand -hex 32`)");
    return false;
  }
  return true;
}

/* Read and check the file; fills ring and the file's identity. false with why. */
static bool load(const char *path, struct auth_ring *ring, struct stat *st, char *why, size_t cap) {
  char text[KEY_FILE_MAX + 1];
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    snprintf(why, cap, "cannot open it: %s", strerror(errno));
    return false;
  }
  bool ok = false;
  ssize_t n = 0;
  if (fstat(fd, st) != 0) {
    snprintf(why, cap, "cannot stat it: %s", strerror(errno));
  } else if (!S_ISREG(st->st_mode)) {
    snprintf(why, cap, "not a regular file");
  } else if (st->st_mode & 077) {
    snprintf(why, cap, "mode %04o gives group or others access to it: chmod 600 it",
             (unsigned)(st->st_mode & 07777));
  } else if (st->st_uid != geteuid() && st->st_uid != 0) {
    /* its owner may rewrite the key at will, whatever the mode says (ssh's StrictModes) */
    snprintf(why, cap, "owned by uid %u, not by this process's user (uid %u) or root: chown it",
             (unsigned)st->st_uid, (unsigned)geteuid());
  } else if (st->st_size > KEY_FILE_MAX) {
    snprintf(why, cap, "%lld bytes: a key file is at most %d", (long long)st->st_size, KEY_FILE_MAX);
  } else {
    size_t got = 0;
    while (got < (size_t)KEY_FILE_MAX && (n = read(fd, text + got, KEY_FILE_MAX - got)) > 0) got += (size_t)n;
    if (n < 0) {
      snprintf(why, cap, "cannot read it: %s", strerror(errno));
    } else {
      text[got] = '\0';
      if (memchr(text, '\0', got))
        snprintf(why, cap, "it holds a NUL byte: a key file is text");
      else
        ok = auth_parse(text, ring, why, cap);
    }
    auth_wipe(text, sizeof(text));
  }
  close(fd);
  if (!ok) auth_wipe(ring, sizeof(*ring));
  return ok;
}

static void remember(struct auth *a, const struct stat *st) {
  a->dev = st->st_dev;
  a->ino = st->st_ino;
  a->mtime = st->st_mtim;
  a->ctime = st->st_ctim;
  a->size = st->st_size;
}

void auth_init(struct auth *a) {
  memset(a, 0, sizeof(*a));
  pthread_mutex_init(&a->mu, NULL);
}

void auth_destroy(struct auth *a) {
  auth_close(a);
  pthread_mutex_destroy(&a->mu);
}

HixlStatus auth_open(struct auth *a, const char *path) {
  char why[256];
  struct stat st;
  struct auth_ring ring;
  char full[AUTH_PATH_MAX], cwd[AUTH_PATH_MAX];
  if (!path || !*path) return HIXL_SUCCESS;
  /* Re-read later by this name: a relative one is made absolute now, so a chdir of the
   * host does not point it at another file (symlinks are kept: they may be rotated). */
  if (path[0] != '/' && !getcwd(cwd, sizeof(cwd)))
    return hixl_fail(HIXL_PARAM_INVALID,
                     "AuthKeyFile: a relative path, and the working directory is unknown: %s",
                     strerror(errno));
  if ((size_t)snprintf(full, sizeof(full), "%s%s%s", path[0] == '/' ? "" : cwd, path[0] == '/' ? "" : "/",
                       path) >= sizeof(full))
    return hixl_fail(HIXL_PARAM_INVALID, "AuthKeyFile: the path is longer than %u bytes", AUTH_PATH_MAX - 1);
  if (!load(full, &ring, &st, why, sizeof(why))) {
    char shown[512]; /* escaped: a path from the environment cannot forge a line of a log */
    log_escape(shown, sizeof(shown), path, strlen(path));
    return hixl_fail(HIXL_PARAM_INVALID, "AuthKeyFile %s: %s", shown, why);
  }
  pthread_mutex_lock(&a->mu);
  a->ring = ring;
  snprintf(a->path, sizeof(a->path), "%s", full);
  remember(a, &st);
  a->reload_failed = false;
  pthread_mutex_unlock(&a->mu);
  auth_wipe(&ring, sizeof(ring));
  return HIXL_SUCCESS;
}

void auth_close(struct auth *a) {
  pthread_mutex_lock(&a->mu);
  auth_wipe(&a->ring, sizeof(a->ring));
  a->path[0] = '\0';
  pthread_mutex_unlock(&a->mu);
}

bool auth_enabled(struct auth *a) {
  pthread_mutex_lock(&a->mu);
  bool on = a->path[0] != '\0';
  pthread_mutex_unlock(&a->mu);
  return on;
}

void auth_current(struct auth *a, struct auth_ring *out) {
  struct stat st;
  pthread_mutex_lock(&a->mu);
  /* A file gone or changed in any way (a chmod moves only its ctime) is read again: what
   * cannot be used is said once, and the keys read before stay. */
  if (a->path[0] &&
      (stat(a->path, &st) != 0 || st.st_dev != a->dev || st.st_ino != a->ino || st.st_size != a->size ||
       st.st_mtim.tv_sec != a->mtime.tv_sec || st.st_mtim.tv_nsec != a->mtime.tv_nsec ||
       st.st_ctim.tv_sec != a->ctime.tv_sec || st.st_ctim.tv_nsec != a->ctime.tv_nsec)) {
    struct auth_ring ring;
    char why[256], shown[512];
    log_escape(shown, sizeof(shown), a->path, strlen(a->path));
    if (load(a->path, &ring, &st, why, sizeof(why))) {
      a->ring = ring;
      remember(a, &st);
      a->reload_failed = false;
      log_info("AuthKeyFile %s re-read: %u key(s) in force", shown, ring.n);
    } else if (!a->reload_failed) {
      a->reload_failed = true;
      log_error("AuthKeyFile %s changed but cannot be used (%s): the keys read before stay in force", shown,
                why);
    }
    auth_wipe(&ring, sizeof(ring));
  }
  *out = a->ring;
  pthread_mutex_unlock(&a->mu);
}
