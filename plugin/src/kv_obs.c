/* kv_obs: histograms, failure counters, per-request traces and their Prometheus text
 * (see kv_obs.h and docs/observability.md). */
#include "kv_obs.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_ext.h"

#define KV_HIST_SLOTS     40u    /* buckets, the last one +Inf */
#define KV_OBS_HASH       256u   /* the table of requests under way */
#define KV_OBS_MAX_RECS   65536u /* requests traced at once; beyond, the next ones are not */
#define KV_OBS_MAX_LANDED 4096u  /* landed marks kept per request */
#define KV_OBS_PEERS      64u    /* peers counted by name; the rest under peer="other" */

/* Bucket i holds values up to 2^(lo + i) (in the sample's unit); slot n: +Inf. */
struct kv_hist_spec {
  const char *name, *help;
  double scale; /* what the unit is divided by for Prometheus (ns -> s: 1e9) */
  uint8_t lo, n;
};

static const struct kv_hist_spec hist_spec[KV_H_COUNT] = {
    [KV_H_TRANSFER] =
        {"hixl_kv_transfer_seconds",
         "A request's transfer: its first op posted to its last byte there (the side that moves "
         "data: pull consumer, push producer)",
         1e9, 10, 27},
    [KV_H_POST] = {"hixl_kv_post_seconds",
                   "Building a request's op list and handing it to the engine (pull: per request; push: per "
                   "range of layers)",
                   1e9, 10, 27},
    [KV_H_BYTES] = {"hixl_kv_transfer_bytes", "Bytes one request moved", 1, 10, 31},
    [KV_H_OPS] = {"hixl_kv_transfer_ops", "Engine ops (descriptors) one request moved", 1, 0, 25},
    [KV_H_PIN] =
        {"hixl_kv_pin_seconds",
         "PIN (pull) or ACCEPT (push) round trip, asking again while the peer has not bound the request", 1e9,
         10, 27},
    [KV_H_TAIL] = {"hixl_kv_push_tail_seconds",
                   "Push producer: the step's last layer saved to the last landed notice answered", 1e9, 10,
                   27},
};

static const char *const cause_name[KV_CAUSE_COUNT] = {"timeout", "peer_gone", "layout",  "lease_expired",
                                                       "refused", "not_held",  "aborted", "other"};

static const char *const phase_name[KV_PH_COUNT] = {"bound",     "pin",  "pinned", "posted",
                                                    "last_byte", "free", "done",   "reported"};

struct kv_hist {
  _Atomic uint64_t b[KV_HIST_SLOTS];
  _Atomic uint64_t sum;
};

struct kv_landed {
  uint32_t layer, count;
  uint64_t t;
};

/* A request under way. */
struct kv_rec {
  char id[KV_MAX_ID + 1];
  char peer[KV_PEER_NAME_MAX + 1];
  char transport[8];
  uint64_t t[KV_PH_COUNT]; /* CLOCK_MONOTONIC ns, 0: not yet */
  uint64_t bytes, ops;
  bool failed;
  uint8_t cause, preset; /* preset: a cause + 1 set ahead (kv_obs_cause_set), 0: none */
  char why[192];
  struct kv_landed *lv;
  uint32_t nl, capl;
  struct kv_rec *next;
};

struct kv_peer_stat {
  char peer[KV_PEER_NAME_MAX + 1];
  char transport[8];
  uint64_t ok, failed, bytes;
};

struct kv_obs {
  bool metrics;
  uint32_t ring_cap; /* 0: no traces kept */
  int fd;            /* trace_file, or -1 */
  char role[12];
  const char *mode;
  uint32_t rank;
  int64_t off_ns; /* CLOCK_REALTIME - CLOCK_MONOTONIC, taken once */
  struct kv_hist h[KV_H_COUNT];
  _Atomic uint64_t fail[KV_CAUSE_COUNT];
  _Atomic uint64_t traces_dropped, trace_write_errors, untraced; /* untraced: the table was full */
  _Atomic bool torn; /* trace_file ends inside a line (a write it took only part of) */

  pthread_mutex_t lock; /* a leaf, below c->lock: the table, the ring, the peers */
  struct kv_rec *tab[KV_OBS_HASH];
  size_t nrec;
  char **ring;
  size_t ring_head, ring_n;
  struct kv_peer_stat peers[KV_OBS_PEERS + 1]; /* the last: "other" */
  size_t npeers;
};

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

hixl_kv_status kv_obs_new(const struct kv_cfg *cfg, int32_t role, uint32_t rank, struct kv_obs **out,
                          char *why, size_t cap) {
  *out = NULL;
  bool file = cfg->trace_file[0] && role == HIXL_KV_ROLE_WORKER; /* with trace_ring 0 too: the file only */
  if (!cfg->metrics && cfg->trace_ring == 0 && !file) return HIXL_KV_SUCCESS;
  struct kv_obs *o = calloc(1, sizeof(*o));
  uint32_t ring = role == HIXL_KV_ROLE_WORKER ? cfg->trace_ring : 0; /* a scheduler moves nothing */
  if (!o || (ring && !(o->ring = calloc(ring, sizeof(char *))))) {
    free(o);
    snprintf(why, cap, "out of memory");
    return HIXL_KV_RESOURCE_EXHAUSTED;
  }
  o->metrics = cfg->metrics;
  o->ring_cap = ring;
  o->fd = -1;
  o->rank = rank;
  o->mode = cfg->push ? "push" : "pull";
  snprintf(o->role, sizeof(o->role), "%s",
           role == HIXL_KV_ROLE_SCHEDULER   ? "scheduler"
           : cfg->producer && cfg->consumer ? "both"
           : cfg->producer                  ? "producer"
                                            : "consumer");
  struct timespec r, m;
  clock_gettime(CLOCK_REALTIME, &r);
  clock_gettime(CLOCK_MONOTONIC, &m);
  o->off_ns = ((int64_t)r.tv_sec - (int64_t)m.tv_sec) * 1000000000ll + (r.tv_nsec - m.tv_nsec);
  if (file) {
    /* A regular file only: a FIFO blocked this open until a reader came (create hung for
     * ever), and later a reader that stops blocked every write. Not through a symbolic
     * link: one planted in /tmp by another user chose the file every trace was appended to.
     * Traces carry request ids: created 0600, and a file another user could have placed or
     * written (its owner, group or world write, a second name) is refused likewise. */
    struct stat sb;
    const char *bad = NULL, *not_reg = "not a regular file (a FIFO, socket or device)",
               *sym = "a symbolic link (not followed: name the file itself)";
    if (lstat(cfg->trace_file, &sb) == 0 && !S_ISREG(sb.st_mode))
      bad = S_ISLNK(sb.st_mode) ? sym : not_reg;
    else if ((o->fd = open(cfg->trace_file,
                           O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW,
                           0600)) < 0)
      bad = errno == ELOOP ? sym : strerror(errno);
    else if (fstat(o->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) /* swapped in meanwhile */
      bad = not_reg;
    else if (sb.st_uid != geteuid())
      bad = "owned by another user (name a file of this user's, or a new one)";
    else if (sb.st_mode & (S_IWGRP | S_IWOTH))
      bad = "writable by its group or by anyone (chmod go-w it, or name a new file)";
    else if (sb.st_nlink != 1)
      bad = "a hard link (the file has other names: name a file of its own)";
    if (bad) {
      snprintf(why, cap, "trace_file %s: %s", cfg->trace_file, bad);
      if (o->fd >= 0) close(o->fd);
      free(o->ring);
      free(o);
      return HIXL_KV_PARAM_INVALID;
    }
  }
  pthread_mutex_init(&o->lock, NULL);
  *out = o;
  return HIXL_KV_SUCCESS;
}

static void rec_free(struct kv_rec *r) {
  free(r->lv);
  free(r);
}

void kv_obs_free(struct kv_obs *o) {
  if (!o) return;
  for (size_t i = 0; i < KV_OBS_HASH; i++)
    for (struct kv_rec *r = o->tab[i], *next; r; r = next) {
      next = r->next;
      rec_free(r);
    }
  for (size_t i = 0; i < o->ring_n; i++) free(o->ring[(o->ring_head + i) % o->ring_cap]);
  free(o->ring);
  if (o->fd >= 0) close(o->fd);
  pthread_mutex_destroy(&o->lock);
  free(o);
}

/* ---- histograms and counters: atomics only ---- */

static unsigned bucket_of(const struct kv_hist_spec *s, uint64_t v) {
  unsigned up = v <= 1 ? 0 : 64u - (unsigned)__builtin_clzll(v - 1); /* ceil(log2 v) */
  unsigned i = up <= s->lo ? 0 : up - s->lo;
  return i < s->n ? i : s->n;
}

void kv_obs_hist(hixl_kv_connector *c, enum kv_hist_id h, uint64_t v) {
  struct kv_obs *o = c->obs;
  if (!o || !o->metrics) return;
  atomic_fetch_add_explicit(&o->h[h].b[bucket_of(&hist_spec[h], v)], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&o->h[h].sum, v, memory_order_relaxed);
}

void kv_obs_count(hixl_kv_connector *c, enum kv_cause cause) {
  struct kv_obs *o = c->obs;
  if (o && o->metrics) atomic_fetch_add_explicit(&o->fail[cause], 1, memory_order_relaxed);
}

enum kv_cause kv_obs_cause(HixlStatus st, const char *why) {
  if (why && strstr(why, "refused: ")) return KV_CAUSE_REFUSED;
  if (why && strstr(why, "linking to the ")) return KV_CAUSE_PEER_GONE; /* no link to it (any status) */
  switch (st) {
  case HIXL_TIMEOUT: return KV_CAUSE_TIMEOUT;
  case HIXL_NOT_CONNECTED: return KV_CAUSE_PEER_GONE;
  case HIXL_PARAM_INVALID: return KV_CAUSE_LAYOUT;
  case HIXL_NOT_FOUND: return KV_CAUSE_NOT_HELD;
  case HIXL_FAILED: return KV_CAUSE_PEER_GONE; /* the engine's end of a link (reset, closed) */
  default: return KV_CAUSE_OTHER;
  }
}

/* ---- the table of requests under way (o->lock) ---- */

static size_t hash_id(const char *id) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *id; id++) h = (h ^ (uint8_t)*id) * 1099511628211ull;
  return (size_t)(h % KV_OBS_HASH);
}

static struct kv_rec *rec_find(struct kv_obs *o, const char *id, struct kv_rec ***link) {
  struct kv_rec **pp = &o->tab[hash_id(id)];
  for (; *pp; pp = &(*pp)->next)
    if (strcmp((*pp)->id, id) == 0) break;
  if (link) *link = pp;
  return *pp;
}

/* id's record; made when make (BOUND). */
static struct kv_rec *rec_get(struct kv_obs *o, const char *id, bool make) {
  struct kv_rec **pp;
  struct kv_rec *r = rec_find(o, id, &pp);
  if (r || !make) return r;
  if (o->nrec >= KV_OBS_MAX_RECS || !(r = calloc(1, sizeof(*r)))) {
    atomic_fetch_add_explicit(&o->untraced, 1, memory_order_relaxed);
    return NULL;
  }
  snprintf(r->id, sizeof(r->id), "%s", id);
  *pp = r;
  o->nrec++;
  return r;
}

uint64_t kv_obs_phase(hixl_kv_connector *c, const char *id, enum kv_phase ph, const char *peer) {
  uint64_t now = mono_ns();
  struct kv_obs *o = c->obs;
  if (!o || !id) return now;
  pthread_mutex_lock(&o->lock);
  struct kv_rec *r = rec_get(o, id, ph == KV_PH_BOUND);
  if (r) {
    if (ph == KV_PH_BOUND && r->t[KV_PH_BOUND]) { /* an id used again: a new request */
      struct kv_rec *next = r->next;
      free(r->lv);
      memset(r, 0, sizeof(*r));
      snprintf(r->id, sizeof(r->id), "%s", id);
      r->next = next;
    }
    if (!r->t[ph]) r->t[ph] = now;
    if (peer && peer[0] && !r->peer[0]) snprintf(r->peer, sizeof(r->peer), "%s", peer);
  }
  pthread_mutex_unlock(&o->lock);
  return now;
}

/* The transport of the link to peer, into id's trace (no lock held: it asks the engine). */
static void link_transport(hixl_kv_connector *c, const char *id, const char *peer) {
  struct kv_obs *o = c->obs;
  struct hixl_link_info li;
  if (!peer || !peer[0] || !c->eng || hixl_engine_link_info(c->eng, peer, &li) != HIXL_SUCCESS) return;
  pthread_mutex_lock(&o->lock);
  struct kv_rec *r = rec_get(o, id, false);
  if (r && !r->transport[0]) snprintf(r->transport, sizeof(r->transport), "%s", li.transport);
  pthread_mutex_unlock(&o->lock);
}

void kv_obs_span(hixl_kv_connector *c, const char *id, enum kv_phase ph, enum kv_hist_id h, uint64_t t0) {
  struct kv_obs *o = c->obs;
  if (!o || !id) return;
  uint64_t now = kv_obs_phase(c, id, ph, NULL);
  kv_obs_hist(c, h, now > t0 ? now - t0 : 0);
  if (ph != KV_PH_PINNED) return;
  /* Pinned (accepted): the link that will move the data is up now (the peer may close it
   * as soon as the data is there, before the mover looks again). */
  char peer[KV_PEER_NAME_MAX + 1] = "";
  pthread_mutex_lock(&o->lock);
  struct kv_rec *r = rec_get(o, id, false);
  if (r && !r->transport[0]) snprintf(peer, sizeof(peer), "%s", r->peer);
  pthread_mutex_unlock(&o->lock);
  link_transport(c, id, peer);
}

void kv_obs_layer(hixl_kv_connector *c, const char *id, uint32_t layer, uint32_t count) {
  struct kv_obs *o = c->obs;
  if (!o || !id) return;
  uint64_t now = mono_ns();
  pthread_mutex_lock(&o->lock);
  struct kv_rec *r = rec_get(o, id, false);
  if (r && r->nl < KV_OBS_MAX_LANDED) {
    if (r->nl == r->capl) {
      uint32_t cap = r->capl ? 2 * r->capl : 16;
      struct kv_landed *v = realloc(r->lv, cap * sizeof(*v));
      if (v) {
        r->lv = v;
        r->capl = cap;
      }
    }
    if (r->nl < r->capl) r->lv[r->nl++] = (struct kv_landed){layer, count, now};
  }
  pthread_mutex_unlock(&o->lock);
}

void kv_obs_moved(hixl_kv_connector *c, const char *id, uint64_t bytes, uint64_t ops) {
  struct kv_obs *o = c->obs;
  if (!o || !id) return;
  pthread_mutex_lock(&o->lock);
  struct kv_rec *r = rec_get(o, id, false);
  if (r) {
    r->bytes += bytes;
    r->ops += ops;
  }
  pthread_mutex_unlock(&o->lock);
}

void kv_obs_landed(hixl_kv_connector *c, const char *id, const char *peer) {
  struct kv_obs *o = c->obs;
  if (!o || !id) return;
  uint64_t now = mono_ns();
  pthread_mutex_lock(&o->lock);
  struct kv_rec *r = rec_get(o, id, false);
  bool ask = false;
  if (r) {
    r->t[KV_PH_LAST_BYTE] = now; /* the last of its parts, if it moves in several */
    if (peer && peer[0] && !r->peer[0]) snprintf(r->peer, sizeof(r->peer), "%s", peer);
    ask = !r->transport[0];
  }
  pthread_mutex_unlock(&o->lock);
  if (ask) link_transport(c, id, peer); /* not known from its pin: the link that moved it, if still up */
}

void kv_obs_cause_set(hixl_kv_connector *c, const char *id, enum kv_cause cause) {
  struct kv_obs *o = c->obs;
  if (!o || !id) return;
  pthread_mutex_lock(&o->lock);
  struct kv_rec *r = rec_get(o, id, false);
  if (r && !r->preset) r->preset = (uint8_t)(cause + 1);
  pthread_mutex_unlock(&o->lock);
}

void kv_obs_failed(hixl_kv_connector *c, const char *id, enum kv_cause cause, const char *why) {
  struct kv_obs *o = c->obs;
  if (!o || !id) return;
  pthread_mutex_lock(&o->lock);
  struct kv_rec *r = rec_get(o, id, false);
  bool count = !r || !r->failed;
  if (r && !r->failed) {
    r->failed = true;
    if (r->preset) cause = (enum kv_cause)(r->preset - 1);
    r->cause = (uint8_t)cause;
    snprintf(r->why, sizeof(r->why), "%s", why ? why : "");
  }
  pthread_mutex_unlock(&o->lock);
  if (count) kv_obs_count(c, cause);
}

/* ---- text: JSON strings, Prometheus label values ---- */

/* The length of the well-formed UTF-8 sequence that starts at s (no overlong form,
 * surrogate or code point past U+10FFFF), 0 if none. */
static size_t utf8_len(const unsigned char *s) {
  unsigned char c = s[0];
  size_t n = c < 0x80                 ? 1
             : c >= 0xc2 && c <= 0xdf ? 2
             : c >= 0xe0 && c <= 0xef ? 3
             : c >= 0xf0 && c <= 0xf4 ? 4
                                      : 0;
  for (size_t i = 1; i < n; i++)
    if ((s[i] & 0xc0) != 0x80) return 0; /* stops at the NUL */
  if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) || (c == 0xf0 && s[1] < 0x90) ||
      (c == 0xf4 && s[1] > 0x8f))
    return 0;
  return n;
}

/* s as a JSON string. JSON is UTF-8: a byte of s that is not (ids are any bytes but NUL
 * through the C API) is written as the code point of its value, \u00XX. */
static void put_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    size_t n = ch < 0x80 ? 1 : utf8_len((const unsigned char *)s);
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20 || ch == 0x7f || n == 0)
      fprintf(f, "\\u%04x", ch);
    else {
      fwrite(s, 1, n, f);
      s += n - 1;
    }
  }
  fputc('"', f);
}

static void put_label(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      fprintf(f, "\\%c", *s);
    else if (*s == '\n')
      fputs("\\n", f);
    else
      fputc(*s, f);
  }
}

/* r as one JSON line (malloc'ed), or NULL out of memory. */
static char *rec_line(const struct kv_obs *o, const struct kv_rec *r, size_t *len) {
  char *p = NULL;
  FILE *f = open_memstream(&p, len);
  if (!f) return NULL;
  fputs("{\"req\":", f);
  put_json_str(f, r->id);
  fprintf(f, ",\"role\":\"%s\",\"mode\":\"%s\",\"rank\":%" PRIu32 ",\"peer\":", o->role, o->mode, o->rank);
  put_json_str(f, r->peer);
  fprintf(f, ",\"transport\":\"%s\",\"outcome\":\"%s\"", r->transport, r->failed ? "failed" : "ok");
  if (r->failed) {
    fprintf(f, ",\"cause\":\"%s\",\"why\":", cause_name[r->cause]);
    put_json_str(f, r->why);
  }
  fprintf(f, ",\"bytes\":%" PRIu64 ",\"ops\":%" PRIu64 ",\"mono_off_ns\":%" PRId64 ",\"t\":{", r->bytes,
          r->ops, o->off_ns);
  bool first = true;
  for (int ph = 0; ph < KV_PH_COUNT; ph++)
    if (r->t[ph]) {
      fprintf(f, "%s\"%s\":%" PRId64, first ? "" : ",", phase_name[ph], (int64_t)r->t[ph] + o->off_ns);
      first = false;
    }
  fputs("},\"landed\":[", f);
  for (uint32_t i = 0; i < r->nl; i++)
    fprintf(f, "%s[%" PRIu32 ",%" PRIu32 ",%" PRId64 "]", i ? "," : "", r->lv[i].layer, r->lv[i].count,
            (int64_t)r->lv[i].t + o->off_ns);
  fputs("]}\n", f);
  if (fclose(f) != 0) {
    free(p);
    return NULL;
  }
  return p;
}

/* r's figures into its peer's counters. o->lock held. */
static void peer_count(struct kv_obs *o, const struct kv_rec *r) {
  if (!r->peer[0]) return;
  size_t i = 0;
  while (i < o->npeers && strcmp(o->peers[i].peer, r->peer) != 0) i++;
  if (i == o->npeers) {
    if (o->npeers < KV_OBS_PEERS) {
      o->npeers++;
      snprintf(o->peers[i].peer, sizeof(o->peers[i].peer), "%s", r->peer);
    } else {
      i = KV_OBS_PEERS;
      snprintf(o->peers[i].peer, sizeof(o->peers[i].peer), "other");
    }
  }
  struct kv_peer_stat *p = &o->peers[i];
  if (r->transport[0]) snprintf(p->transport, sizeof(p->transport), "%s", r->transport);
  if (r->failed)
    p->failed++;
  else
    p->ok++;
  p->bytes += r->bytes;
}

void kv_obs_reported(hixl_kv_connector *c, const hixl_kv_ids *ids) {
  struct kv_obs *o = c->obs;
  if (!o || !ids) return;
  for (size_t k = 0; k < ids->count; k++) {
    char peer[KV_PEER_NAME_MAX + 1] = "";
    struct hixl_link_info li;
    pthread_mutex_lock(&o->lock);
    struct kv_rec **pp, *r = rec_find(o, ids->ids[k], &pp);
    if (r && !r->transport[0]) snprintf(peer, sizeof(peer), "%s", r->peer); /* else known already */
    pthread_mutex_unlock(&o->lock);
    if (!r) continue;
    /* The transport of the link to its peer, asked of the engine with no lock held. */
    bool have = peer[0] && c->eng && hixl_engine_link_info(c->eng, peer, &li) == HIXL_SUCCESS;
    pthread_mutex_lock(&o->lock);
    if (!(r = rec_find(o, ids->ids[k], &pp))) {
      pthread_mutex_unlock(&o->lock);
      continue;
    }
    *pp = r->next;
    o->nrec--;
    r->t[KV_PH_REPORTED] = mono_ns();
    if (have && !r->transport[0]) snprintf(r->transport, sizeof(r->transport), "%s", li.transport);
    peer_count(o, r);
    size_t len = 0;
    char *line = o->ring_cap || o->fd >= 0 ? rec_line(o, r, &len) : NULL;
    pthread_mutex_unlock(&o->lock);
    /* A transfer this side moved (it posted ops), whole: once per request, whatever parts. */
    uint64_t posted = r->t[KV_PH_POSTED], last = r->t[KV_PH_LAST_BYTE];
    if (!r->failed && posted && last >= posted) {
      kv_obs_hist(c, KV_H_TRANSFER, last - posted);
      kv_obs_hist(c, KV_H_BYTES, r->bytes);
      kv_obs_hist(c, KV_H_OPS, r->ops);
    }
    rec_free(r);
    if (!line) continue;
    if (o->fd >= 0) { /* no lock held: a slow disk stalls no mark */
      /* After a line the file took only part of (disk full), the next starts a line of its
       * own: glued to the torn one, a reader of JSON lines lost both. */
      bool torn = atomic_exchange_explicit(&o->torn, false, memory_order_relaxed);
      struct iovec v[2] = {{(void *)"\n", 1}, {line, len}};
      size_t want = len + torn;
      ssize_t n = writev(o->fd, torn ? v : v + 1, torn ? 2 : 1);
      if (n != (ssize_t)want) {
        atomic_fetch_add_explicit(&o->trace_write_errors, 1, memory_order_relaxed);
        /* It ends inside a line now, unless nothing went (as it was) or only the newline did. */
        bool inside = n <= 0 ? torn : !(torn && n == 1);
        if (inside) atomic_store_explicit(&o->torn, true, memory_order_relaxed);
      }
    }
    if (!o->ring_cap) { /* trace_file only */
      free(line);
      continue;
    }
    pthread_mutex_lock(&o->lock);
    if (o->ring_n == o->ring_cap) { /* full: the oldest goes */
      free(o->ring[o->ring_head]);
      o->ring_head = (o->ring_head + 1) % o->ring_cap;
      o->ring_n--;
      atomic_fetch_add_explicit(&o->traces_dropped, 1, memory_order_relaxed);
    }
    o->ring[(o->ring_head + o->ring_n++) % o->ring_cap] = line;
    pthread_mutex_unlock(&o->lock);
  }
}

/* ---- the ops ---- */

static hixl_kv_status empty_buffer(hixl_kv_buffer *b, const char *fn) {
  uint8_t *p = calloc(1, 1);
  if (!p) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  b->data = p;
  b->len = 0;
  return HIXL_KV_SUCCESS;
}

hixl_kv_status kv_drain_traces(hixl_kv_connector *c, hixl_kv_buffer *lines) {
  const char *fn = "drain_traces";
  CHECK_ARG(c && lines, "%s: connector or lines is NULL", fn);
  struct kv_obs *o = c->obs;
  if (!o || !o->ring_cap) return empty_buffer(lines, fn);
  pthread_mutex_lock(&o->lock);
  size_t total = 0;
  for (size_t i = 0; i < o->ring_n; i++) total += strlen(o->ring[(o->ring_head + i) % o->ring_cap]);
  uint8_t *p = malloc(total + 1);
  if (!p) {
    pthread_mutex_unlock(&o->lock);
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory for %zu bytes", fn, total);
  }
  size_t off = 0;
  for (size_t i = 0; i < o->ring_n; i++) {
    char *l = o->ring[(o->ring_head + i) % o->ring_cap];
    size_t n = strlen(l);
    memcpy(p + off, l, n);
    off += n;
    free(l);
  }
  p[off] = '\0';
  o->ring_head = 0;
  o->ring_n = 0;
  pthread_mutex_unlock(&o->lock);
  lines->data = p;
  lines->len = off;
  return HIXL_KV_SUCCESS;
}

static void labels(FILE *f, const hixl_kv_connector *c, const char *role) {
  fprintf(f, "role=\"%s\",rank=\"%" PRIu32 "\",mode=\"%s\"", role, c->rank, c->cfg.push ? "push" : "pull");
}

static void family(FILE *f, const char *name, const char *type, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

hixl_kv_status kv_render_metrics(hixl_kv_connector *c, hixl_kv_buffer *text) {
  const char *fn = "render_metrics";
  CHECK_ARG(c && text, "%s: connector or text is NULL", fn);
  struct kv_obs *o = c->obs;
  hixl_kv_stats_ex s;
  pthread_mutex_lock(&c->lock);
  s = c->stats;
  pthread_mutex_unlock(&c->lock);
  char role[12];
  snprintf(role, sizeof(role), "%s",
           o                                    ? o->role
           : c->role == HIXL_KV_ROLE_SCHEDULER  ? "scheduler"
           : c->cfg.producer && c->cfg.consumer ? "both"
           : c->cfg.producer                    ? "producer"
                                                : "consumer");
  char *p = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&p, &len);
  if (!f) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  static const struct {
    const char *name, *type, *help;
    size_t off;
  } counters[] = {
#define C(field, type, help) {"hixl_kv_" #field, type, help, offsetof(hixl_kv_stats_ex, field)}
      C(blocks_held, "gauge", "Blocks a producer holds for consumers (pull) or has still to push"),
      C(requests_held, "gauge", "Requests a producer holds for consumers (pull) or has still to push"),
      C(loads_done, "counter", "Loads (pull) or expected pushes (push) that landed whole, consumer"),
      C(loads_failed, "counter", "Loads or expected pushes that failed, consumer"),
      C(lease_expired, "counter", "Held requests freed because their lease ran out, pull producer"),
      C(bytes_loaded, "counter", "Bytes of the requests loaded (pull) or landed (push), consumer"),
      C(engine_ops, "counter", "Engine ops posted by the side that moves data"),
      C(lookups, "counter", "PIN or ACCEPT round trips"),
      C(pushes_done, "counter", "Requests pushed whole, push producer"),
      C(pushes_failed, "counter", "Requests whose push failed, push producer"),
      C(layers_pushed, "counter", "Layers pushed and answered, push producer"),
      C(bytes_pushed, "counter", "Bytes of the requests pushed, push producer"),
      C(cap_refused, "counter", "KV service calls refused for a missing or wrong request capability"),
#undef C
  };
  for (size_t i = 0; i < sizeof(counters) / sizeof(counters[0]); i++) {
    char name[64];
    bool ctr = strcmp(counters[i].type, "counter") == 0;
    snprintf(name, sizeof(name), "%s%s", counters[i].name, ctr ? "_total" : "");
    uint64_t v;
    memcpy(&v, (const uint8_t *)&s + counters[i].off, sizeof(v));
    family(f, name, counters[i].type, counters[i].help);
    fprintf(f, "%s{", name);
    labels(f, c, role);
    fprintf(f, "} %" PRIu64 "\n", v);
  }
  if (o && o->metrics) {
    family(f, "hixl_kv_failures_total", "counter", "Requests that failed, by cause (refused: calls refused)");
    for (int k = 0; k < KV_CAUSE_COUNT; k++) {
      fputs("hixl_kv_failures_total{", f);
      labels(f, c, role);
      fprintf(f, ",cause=\"%s\"} %" PRIu64 "\n", cause_name[k],
              atomic_load_explicit(&o->fail[k], memory_order_relaxed));
    }
    for (int h = 0; h < KV_H_COUNT; h++) {
      const struct kv_hist_spec *sp = &hist_spec[h];
      family(f, sp->name, "histogram", sp->help);
      uint64_t cum = 0;
      for (unsigned i = 0; i <= sp->n; i++) {
        cum += atomic_load_explicit(&o->h[h].b[i], memory_order_relaxed);
        fprintf(f, "%s_bucket{", sp->name);
        labels(f, c, role);
        if (i < sp->n)
          fprintf(f, ",le=\"%.9g\"} %" PRIu64 "\n", (double)(1ull << (sp->lo + i)) / sp->scale, cum);
        else
          fprintf(f, ",le=\"+Inf\"} %" PRIu64 "\n", cum);
      }
      fprintf(f, "%s_sum{", sp->name);
      labels(f, c, role);
      fprintf(f, "} %.9g\n%s_count{",
              (double)atomic_load_explicit(&o->h[h].sum, memory_order_relaxed) / sp->scale, sp->name);
      labels(f, c, role);
      fprintf(f, "} %" PRIu64 "\n", cum); /* the +Inf bucket's, as the format requires */
    }
  }
  if (o) {
    family(f, "hixl_kv_traces_dropped_total", "counter",
           "Finished traces the ring dropped (full: drain_traces was not called often enough)");
    fputs("hixl_kv_traces_dropped_total{", f);
    labels(f, c, role);
    fprintf(f, "} %" PRIu64 "\n", atomic_load_explicit(&o->traces_dropped, memory_order_relaxed));
    family(f, "hixl_kv_traces_untraced_total", "counter",
           "Requests not traced: 65536 were under way already (or out of memory for one more)");
    fputs("hixl_kv_traces_untraced_total{", f);
    labels(f, c, role);
    fprintf(f, "} %" PRIu64 "\n", atomic_load_explicit(&o->untraced, memory_order_relaxed));
    family(f, "hixl_kv_trace_write_errors_total", "counter", "Finished traces trace_file did not take whole");
    fputs("hixl_kv_trace_write_errors_total{", f);
    labels(f, c, role);
    fprintf(f, "} %" PRIu64 "\n", atomic_load_explicit(&o->trace_write_errors, memory_order_relaxed));
    pthread_mutex_lock(&o->lock);
    family(f, "hixl_kv_peer_requests_total", "counter", "Requests that ended with a peer, by outcome");
    for (size_t i = 0; i <= KV_OBS_PEERS; i++) {
      const struct kv_peer_stat *ps = &o->peers[i];
      if (i >= o->npeers && !(i == KV_OBS_PEERS && ps->peer[0])) continue;
      for (int ok = 1; ok >= 0; ok--) {
        fputs("hixl_kv_peer_requests_total{", f);
        labels(f, c, role);
        fputs(",peer=\"", f);
        put_label(f, ps->peer);
        fprintf(f, "\",transport=\"%s\",outcome=\"%s\"} %" PRIu64 "\n",
                ps->transport[0] ? ps->transport : "unknown", ok ? "ok" : "failed", ok ? ps->ok : ps->failed);
      }
    }
    family(f, "hixl_kv_peer_bytes_total", "counter", "Bytes of the requests that ended with a peer");
    for (size_t i = 0; i <= KV_OBS_PEERS; i++) {
      const struct kv_peer_stat *ps = &o->peers[i];
      if (i >= o->npeers && !(i == KV_OBS_PEERS && ps->peer[0])) continue;
      fputs("hixl_kv_peer_bytes_total{", f);
      labels(f, c, role);
      fputs(",peer=\"", f);
      put_label(f, ps->peer);
      fprintf(f, "\",transport=\"%s\"} %" PRIu64 "\n", ps->transport[0] ? ps->transport : "unknown",
              ps->bytes);
    }
    pthread_mutex_unlock(&o->lock);
    struct hixl_devmem_stats ds; /* asked of the engine with no lock held */
    if (c->eng && hixl_engine_devmem_stats(c->eng, &ds) == HIXL_SUCCESS) {
      family(
          f, "hixl_kv_device_ipc_bytes_total", "counter",
          "Bytes this worker moved on same-host peers' device memory opened by IPC handle (device to device, "
          "or to and from host memory)");
      fputs("hixl_kv_device_ipc_bytes_total{", f);
      labels(f, c, role);
      fprintf(f, "} %" PRIu64 "\n", ds.ipc_bytes);
      family(f, "hixl_kv_device_rdma_bytes_total", "counter",
             "Bytes of ops on device memory (here or at the peer) this worker's engine moved by RDMA "
             "directly (GPUDirect: an MR over the memory's dma-buf on both sides)");
      fputs("hixl_kv_device_rdma_bytes_total{", f);
      labels(f, c, role);
      fprintf(f, "} %" PRIu64 "\n", ds.rdma_bytes);
    }
  }
  if (fclose(f) != 0) {
    free(p);
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  }
  text->data = (uint8_t *)p;
  text->len = len;
  return HIXL_KV_SUCCESS;
}

/* id is finished sending (set sending_done) or receiving (recving_done): the host
 * learns it at its next get_finished; one waiting on the event fd wakes now. Lock held. */
void kv_finished_add(hixl_kv_connector *c, struct kv_idset *set, const char *id) {
  kv_obs_phase(c, id, KV_PH_DONE, NULL);
  kv_idset_add(set, id);
  kv_efd_signal(c);
}

void kv_recv_refused(hixl_kv_connector *c, const struct kv_meta_entry *e, enum kv_cause cause) {
  kv_obs_count(c, cause);
  c->stats.loads_failed++;
  kv_err_blocks_add(c, e->blocks, e->nblocks);
  kv_finished_add(c, &c->recving_done, e->req);
}
