/* kv_util: what every file of the connector uses: errors kept for last_error, small
 * sets of request ids, addresses, and what get_finished will report. */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "kv_int.h"
#include "util/log.h"

static _Thread_local char kv_err[512];

hixl_kv_status kv_fail(hixl_kv_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(kv_err, sizeof(kv_err), fmt, ap);
  va_end(ap);
  return st;
}

const char *kv_last_error(void) { return kv_err; }

uint64_t kv_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int32_t kv_ms_until(uint64_t deadline) {
  uint64_t now = kv_now_ns();
  return now >= deadline ? 0 : (int32_t)((deadline - now + 999999) / 1000000);
}

/* ---- small sets of ids ---- */

bool kv_idset_has(const struct kv_idset *s, const char *id) {
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->v[i], id) == 0) return true;
  return false;
}

size_t kv_idset_count(const struct kv_idset *s, const char *id) {
  size_t n = 0;
  for (size_t i = 0; i < s->n; i++) n += strcmp(s->v[i], id) == 0;
  return n;
}

int kv_idset_add(struct kv_idset *s, const char *id) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 16;
    char **v = realloc(s->v, cap * sizeof(*v));
    if (!v) return -1;
    s->v = v;
    s->cap = cap;
  }
  if (!(s->v[s->n] = strdup(id))) return -1;
  s->n++;
  return 0;
}

void kv_idset_del(struct kv_idset *s, const char *id) {
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->v[i], id) == 0) {
      free(s->v[i]);
      s->v[i] = s->v[--s->n];
      return;
    }
}

void kv_idset_clear(struct kv_idset *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]);
  free(s->v);
  memset(s, 0, sizeof(*s));
}

/* ---- hashed sets of ids, oldest first ---- */

struct kv_idnode {
  struct kv_idnode *chain;         /* the next in its bucket, newer before older */
  struct kv_idnode *older, *newer; /* the order added */
  uint64_t hash;
  void *val;
  char id[];
};

/* FNV-1a from a random start, then mixed (murmur3's finaliser): the low bits pick the
 * bucket. */
static uint64_t id_hash(uint64_t seed, const char *id) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (const unsigned char *p = (const unsigned char *)id; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

uint64_t kv_idhash_hash(const struct kv_idhash *s, const char *id) { return id_hash(s->seed, id); }

#define IDHASH_MIN_NB 16u /* buckets at the first add, and the fewest a set shrinks to */

/* nb buckets (a power of 2), each chain kept newer before older; -1: no memory,
 * nothing changed. Grown to twice the buckets at one entry per bucket, shrunk to half
 * below one per 8 (kv_idhash_del): a burst's table does not stay. */
static int idhash_resize(struct kv_idhash *s, size_t nb) {
  struct kv_idnode **b = calloc(nb, sizeof(*b));
  if (!b) return -1;
  if (s->nb == 0 && s->seed == 0 && getrandom(&s->seed, sizeof(s->seed), GRND_NONBLOCK) != sizeof(s->seed))
    s->seed = kv_now_ns() ^ (uint64_t)(uintptr_t)s;
  for (struct kv_idnode *x = s->oldest; x; x = x->newer) {
    size_t k = x->hash & (nb - 1);
    x->chain = b[k];
    b[k] = x;
  }
  free(s->b);
  s->b = b;
  s->nb = nb;
  return 0;
}

static struct kv_idnode **idhash_find(const struct kv_idhash *s, const char *id) {
  if (s->nb == 0) return NULL;
  uint64_t h = id_hash(s->seed, id);
  for (struct kv_idnode **pp = &s->b[h & (s->nb - 1)]; *pp; pp = &(*pp)->chain)
    if ((*pp)->hash == h && strcmp((*pp)->id, id) == 0) return pp;
  return NULL;
}

/* Unlink *pp (its bucket's link to it) and free it; its value. The buckets halve when
 * fewer than one in 8 holds an entry (a failed shrink keeps them: no harm). */
static void *idhash_unlink(struct kv_idhash *s, struct kv_idnode **pp) {
  struct kv_idnode *x = *pp;
  void *val = x->val;
  *pp = x->chain;
  if (x->older)
    x->older->newer = x->newer;
  else
    s->oldest = x->newer;
  if (x->newer)
    x->newer->older = x->older;
  else
    s->newest = x->older;
  s->n--;
  free(x);
  if (s->nb > IDHASH_MIN_NB && s->n < s->nb / 8) idhash_resize(s, s->nb / 2);
  return val;
}

bool kv_idhash_has(const struct kv_idhash *s, const char *id) { return idhash_find(s, id) != NULL; }

int kv_idhash_add(struct kv_idhash *s, const char *id, void *val, size_t max, void **old) {
  if (old) *old = NULL;
  if (s->n >= s->nb && idhash_resize(s, s->nb ? 2 * s->nb : IDHASH_MIN_NB) != 0 && s->nb == 0)
    return -1; /* else longer chains */
  size_t len = strlen(id) + 1;
  struct kv_idnode *x = malloc(sizeof(*x) + len);
  if (!x) return -1;
  int forgot = 0;
  if (s->n >= max && s->oldest) { /* at the bound: the oldest goes */
    struct kv_idnode **pp = &s->b[s->oldest->hash & (s->nb - 1)];
    while (*pp != s->oldest) pp = &(*pp)->chain;
    void *v = idhash_unlink(s, pp);
    if (old) *old = v;
    s->evicted++;
    forgot = 1;
  }
  memcpy(x->id, id, len);
  x->hash = id_hash(s->seed, id);
  x->val = val;
  size_t k = x->hash & (s->nb - 1);
  x->chain = s->b[k];
  s->b[k] = x;
  x->newer = NULL;
  x->older = s->newest;
  if (s->newest)
    s->newest->newer = x;
  else
    s->oldest = x;
  s->newest = x;
  s->n++;
  return forgot;
}

bool kv_idhash_get(const struct kv_idhash *s, const char *id, void **val) {
  struct kv_idnode **pp = idhash_find(s, id);
  if (!pp) return false;
  *val = (*pp)->val;
  return true;
}

bool kv_idhash_touch(struct kv_idhash *s, const char *id) {
  struct kv_idnode **pp = idhash_find(s, id), *x = pp ? *pp : NULL;
  if (!x) return false;
  if (x == s->newest) return true;
  if (x->older)
    x->older->newer = x->newer;
  else
    s->oldest = x->newer;
  x->newer->older = x->older; /* not the newest: it has a newer one */
  x->older = s->newest;
  x->newer = NULL;
  s->newest->newer = x;
  s->newest = x;
  return true;
}

const struct kv_idnode *kv_idnode_older(const struct kv_idnode *x) { return x->older; }

void *kv_idnode_val(const struct kv_idnode *x) { return x->val; }

const char *kv_idnode_id(const struct kv_idnode *x) { return x->id; }

bool kv_idhash_del(struct kv_idhash *s, const char *id, void **val) {
  struct kv_idnode **pp = idhash_find(s, id);
  if (!pp) return false;
  void *v = idhash_unlink(s, pp);
  if (val) *val = v;
  return true;
}

void kv_idhash_clear(struct kv_idhash *s, void (*free_val)(void *)) {
  for (struct kv_idnode *x = s->oldest, *next; x; x = next) {
    next = x->newer;
    if (free_val) free_val(x->val);
    free(x);
  }
  free(s->b);
  memset(s, 0, sizeof(*s));
}

/* Hand a set to the host as hixl_kv_ids (one allocation), emptying it. */
int kv_idset_take(struct kv_idset *s, hixl_kv_ids *out) {
  size_t bytes = s->n * sizeof(char *);
  for (size_t i = 0; i < s->n; i++) bytes += strlen(s->v[i]) + 1;
  char **v = malloc(bytes ? bytes : 1);
  if (!v) return -1;
  char *p = (char *)(v + s->n);
  for (size_t i = 0; i < s->n; i++) {
    size_t l = strlen(s->v[i]) + 1;
    v[i] = memcpy(p, s->v[i], l);
    p += l;
    free(s->v[i]);
  }
  out->ids = (const char *const *)v;
  out->count = s->n;
  s->n = 0;
  return 0;
}

void kv_free_ids(hixl_kv_ids *ids) {
  if (!ids) return;
  free((void *)ids->ids);
  ids->ids = NULL;
  ids->count = 0;
}

void kv_free_buffer(hixl_kv_buffer *b) {
  if (!b) return;
  free(b->data);
  b->data = NULL;
  b->len = 0;
}

bool kv_copy_id(char *dst, const char *src, size_t n) {
  if (!src || n == 0 || n > KV_MAX_ID || memchr(src, '\0', n)) return false;
  memcpy(dst, src, n);
  dst[n] = '\0';
  return true;
}

/* ---- engine address and cluster id ---- */

/* "ip:port" + rank -> this worker's engine address and its cluster id. */
hixl_kv_status kv_worker_address(const char *base, uint32_t rank, char *out, size_t cap, uint64_t *cluster) {
  char ip[48];
  const char *colon = strrchr(base, ':');
  CHECK_ARG(colon && (size_t)(colon - base) < sizeof(ip),
            "address \"%s\" needs a port: a worker's engine listens on port + rank", base);
  memcpy(ip, base, (size_t)(colon - base));
  ip[colon - base] = '\0';
  char *end;
  unsigned long port = strtoul(colon + 1, &end, 10);
  struct in_addr a;
  CHECK_ARG(*end == '\0' && port > 0 && port + rank <= 65535 && inet_pton(AF_INET, ip, &a) == 1,
            "address \"%s\" (rank %u) is not \"ip:port\" with port + rank in [1, 65535]", base, rank);
  snprintf(out, cap, "%s:%lu", ip, port + rank);
  *cluster = ((uint64_t)ntohl(a.s_addr) << 16) | (port + rank);
  return HIXL_KV_SUCCESS;
}

/* Make the event fd readable, if the host asked for it. Lock held. */
void kv_efd_signal(hixl_kv_connector *c) {
  if (c->efd >= 0) {
    uint64_t one = 1;
    ssize_t w = write(c->efd, &one, sizeof(one)); /* fails only when the count is full: readable anyway */
    (void)w;
  }
}

/* id ended here: a PIN, ACCEPT or RELEASE of it answers GONE while it is among the last
 * KV_GONE_MAX ids that ended (an id that ended twice counts twice). Lock held. */
void kv_gone_add(hixl_kv_connector *c, const char *id) { kv_gone_add_why(c, id, NULL); }

void kv_gone_add_why(hixl_kv_connector *c, const char *id, const char *why) {
  kv_idhash_add(&c->gone, id, (void *)why, KV_GONE_MAX, NULL);
}

/* Lock held. */
void kv_unreach_note(hixl_kv_connector *c, const char *peer, bool reached) {
  if (reached) {
    kv_idhash_del(&c->unreach, peer, NULL);
  } else if (!kv_idhash_has(&c->unreach, peer) &&
             kv_idhash_add(&c->unreach, peer, NULL, KV_UNREACH_MAX, NULL) == 1 && c->unreach.evicted == 1) {
    char esc[4 * KV_MAX_ENGINE + 1];
    log_escape(esc, sizeof(esc), peer, strnlen(peer, KV_MAX_ENGINE));
    log_warn("hixl-kv: unreachable peers (their last Link failed) are at their bound of %u, %s one more: "
             "the oldest are forgotten first, and a FREE or ABORT to a forgotten one may link again once, "
             "waiting notify_timeout_ms at most",
             KV_UNREACH_MAX, esc);
  }
}

void kv_err_blocks_add(hixl_kv_connector *c, const uint64_t *b, size_t n) {
  for (size_t k = 0; k < n; k++) {
    if (c->nerr == c->caperr) {
      size_t cap = c->caperr ? c->caperr * 2 : 64;
      uint64_t *v = realloc(c->err_blocks, cap * sizeof(*v));
      if (!v) return;
      c->err_blocks = v;
      c->caperr = cap;
    }
    c->err_blocks[c->nerr++] = b[k];
  }
}
