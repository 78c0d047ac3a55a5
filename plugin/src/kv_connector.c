/* kv_connector: the ops of libhixl_kv_connector.so (hixl_kv_connector.h) over the
 * cache manager, in vLLM's KV-connector shape.
 *
 * Pull mode. The producer's scheduler keeps a finished request's blocks
 * (delay_free) and returns kv_transfer_params naming its worker's engine, cluster,
 * request and blocks; its workers hold those blocks (HOLD in the metadata) until the
 * consumer frees them or the lease runs out. The consumer's scheduler turns the
 * params into LOAD entries; its worker's loader thread PINs the request on the
 * producer (KV service call: is it still held? same layout? it extends the lease),
 * pulls the blocks through the cache manager (one op per run of adjacent blocks per
 * tensor), then FREEs it there. A failed load reports its blocks
 * (get_block_ids_with_load_errors) and, with load_failure_policy recompute, the
 * scheduler answers 0 matched tokens for that request.
 *
 * Locking: c->lock is a leaf, never held across a hixl call: the engine calls
 * kv_serve on its progress thread with its own lock held, and kv_serve takes c->lock. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache_ext.h"
#include "engine/engine_ext.h"
#include "kv_int.h"

#define KV_EXPORT   __attribute__((visibility("default")))
#define KV_GONE_MAX 4096 /* ids remembered as freed, so a late PIN fails at once */

static _Thread_local char kv_err[512];

hixl_kv_status kv_fail(hixl_kv_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(kv_err, sizeof(kv_err), fmt, ap);
  va_end(ap);
  return st;
}

static const char *kv_last_error(void) { return kv_err; }

#define CHECK_ARG(cond, ...)                                                                                 \
  do {                                                                                                       \
    if (!(cond)) return kv_fail(HIXL_KV_PARAM_INVALID, __VA_ARGS__);                                         \
  } while (0)

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- small sets of ids ---- */

static bool idset_has(const struct kv_idset *s, const char *id) {
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->v[i], id) == 0) return true;
  return false;
}

static int idset_add(struct kv_idset *s, const char *id) {
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

static void idset_del(struct kv_idset *s, const char *id) {
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->v[i], id) == 0) {
      free(s->v[i]);
      s->v[i] = s->v[--s->n];
      return;
    }
}

static void idset_clear(struct kv_idset *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]);
  free(s->v);
  memset(s, 0, sizeof(*s));
}

/* Hand a set to the host as hixl_kv_ids (one allocation), emptying it. */
static int idset_take(struct kv_idset *s, hixl_kv_ids *out) {
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

static void kv_free_ids(hixl_kv_ids *ids) {
  if (!ids) return;
  free((void *)ids->ids);
  ids->ids = NULL;
  ids->count = 0;
}

static void kv_free_buffer(hixl_kv_buffer *b) {
  if (!b) return;
  free(b->data);
  b->data = NULL;
  b->len = 0;
}

static bool copy_id(char *dst, const char *src, size_t n) {
  if (!src || n == 0 || n > KV_MAX_ID || memchr(src, '\0', n)) return false;
  memcpy(dst, src, n);
  dst[n] = '\0';
  return true;
}

/* ---- engine address and cluster id ---- */

/* "ip:port" + rank -> this worker's engine address and its cluster id. */
static hixl_kv_status worker_address(const char *base, uint32_t rank, char *out, size_t cap,
                                     uint64_t *cluster) {
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
static void efd_signal(hixl_kv_connector *c) {
  if (c->efd >= 0) {
    uint64_t one = 1;
    ssize_t w = write(c->efd, &one, sizeof(one)); /* fails only when the count is full: readable anyway */
    (void)w;
  }
}

/* id is finished sending (set sending_done) or receiving (recving_done): the host
 * learns it at its next get_finished; one waiting on the event fd wakes now. Lock held. */
static void finished_add(hixl_kv_connector *c, struct kv_idset *set, const char *id) {
  idset_add(set, id);
  efd_signal(c);
}

/* ---- the KV service (producer side; engine progress thread) ---- */

static struct kv_held *held_find(hixl_kv_connector *c, const char *id) {
  for (struct kv_held *h = c->held; h; h = h->next)
    if (strcmp(h->id, id) == 0) return h;
  return NULL;
}

static void gone_add(hixl_kv_connector *c, const char *id) {
  if (c->gone.n >= KV_GONE_MAX) {
    free(c->gone.v[0]);
    memmove(c->gone.v, c->gone.v + 1, (c->gone.n - 1) * sizeof(char *));
    c->gone.n--;
  }
  idset_add(&c->gone, id);
}

/* Unlink h, report it finished-sending, free it. Lock held. */
static void held_release(hixl_kv_connector *c, struct kv_held *h) {
  struct kv_held **pp = &c->held;
  while (*pp != h) pp = &(*pp)->next;
  *pp = h->next;
  c->stats.blocks_held -= h->n;
  c->stats.requests_held--;
  finished_add(c, &c->sending_done, h->id);
  gone_add(c, h->id);
  free(h->blocks);
  free(h);
}

/* Free held requests whose lease ran out. A consumer that pinned one may still be
 * reading its blocks: its links are cut before the host hears that the blocks are
 * free (drop_peers, in get_finished), so no answer of this engine reads them after
 * the host reuses them. Lock held. */
static void leases_expire(hixl_kv_connector *c) {
  uint64_t now = now_ns();
  for (struct kv_held *h = c->held, *next; h; h = next) {
    next = h->next;
    if (now >= h->expires_ns) {
      c->stats.lease_expired++;
      if (h->consumer[0] && !idset_has(&c->drop, h->consumer)) idset_add(&c->drop, h->consumer);
      held_release(c, h);
    }
  }
}

/* ---- push mode: what a consumer worker expects ---- */

static struct kv_expect *expect_find(hixl_kv_connector *c, const char *id) {
  for (struct kv_expect *x = c->expects; x; x = x->next)
    if (strcmp(x->id, id) == 0) return x;
  return NULL;
}

static void err_blocks_add(hixl_kv_connector *c, const uint64_t *b, size_t n) {
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

/* x ends: landed whole (why NULL) or failed. Lock held. */
static void expect_end(hixl_kv_connector *c, struct kv_expect *x, const char *why) {
  struct kv_expect **pp = &c->expects;
  while (*pp != x) pp = &(*pp)->next;
  *pp = x->next;
  if (why) {
    c->stats.loads_failed++;
    err_blocks_add(c, x->blocks, x->n);
    fprintf(stderr, "hixl-kv: request %s failed to load: %s\n", x->id, why);
  } else {
    c->stats.loads_done++;
  }
  finished_add(c, &c->recving_done, x->id);
  gone_add(c, x->id);
  free(x->blocks);
  free(x->landed);
  free(x);
  pthread_cond_broadcast(&c->landed);
}

/* Expected pushes that no producer finished within the lease fail. Lock held. */
static void expects_expire(hixl_kv_connector *c) {
  uint64_t now = now_ns();
  for (struct kv_expect *x = c->expects, *next; x; x = next) {
    next = x->next;
    if (now >= x->deadline_ns) {
      char why[96];
      snprintf(why, sizeof(why), "no producer wrote all %u layers within lease_ms %u", c->layers,
               c->cfg.lease_ms);
      /* A producer that accepted may still be writing: its links are cut before the
       * host hears of the failure and reuses the blocks (see drop_peers). */
      if (x->producer[0] && !idset_has(&c->drop, x->producer)) idset_add(&c->drop, x->producer);
      expect_end(c, x, why);
    }
  }
}

static HixlStatus kv_serve(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                           size_t cap, size_t *resp_len) {
  hixl_kv_connector *c = ctx;
  struct kv_in in = {req, len, 0, false};
  char id[KV_MAX_ID + 1];
  char reason[KV_MAX_ID + 1] = "";
  uint8_t proto = kv_get_u8(&in), op = kv_get_u8(&in);
  kv_get_str(&in, id, KV_MAX_ID);
  uint32_t layer = op == KV_SVC_LAYER || op == KV_SVC_LAYERS ? kv_get_u32(&in) : 0;
  uint32_t count = op == KV_SVC_LAYERS ? kv_get_u32(&in) : 1;
  if (op == KV_SVC_ABORT) kv_get_str(&in, reason, KV_MAX_ID);
  struct kv_out out = {0};
  HixlStatus st = HIXL_SUCCESS;
  if (in.bad || in.off != len || proto != KV_SVC_PROTO || (op == KV_SVC_LAYERS && count < 2)) {
    *resp_len = (size_t)snprintf((char *)resp, cap, "malformed KV service request from %s", peer);
    return HIXL_PARAM_INVALID;
  }
  pthread_mutex_lock(&c->lock);
  leases_expire(c);
  expects_expire(c);
  struct kv_held *h = held_find(c, id);
  struct kv_expect *x = expect_find(c, id);
  if (op == KV_SVC_ACCEPT) {
    if (x) {
      snprintf(x->producer, sizeof(x->producer), "%s", peer);
      kv_put_u8(&out, KV_PIN_HELD);
      kv_put_str(&out, c->layout_text, strlen(c->layout_text));
      kv_put_u32(&out, (uint32_t)x->n);
      kv_put_u64(&out, kv_blocks_digest(x->blocks, x->n));
    } else if (idset_has(&c->gone, id)) {
      kv_put_u8(&out, KV_PIN_GONE);
      const char *why = "it already ended (loaded, failed or expired)";
      kv_put_str(&out, why, strlen(why));
    } else {
      kv_put_u8(&out, KV_PIN_NOT_YET);
    }
  } else if (op == KV_SVC_LAYER || op == KV_SVC_LAYERS) {
    if (x && layer < c->layers && count <= c->layers - layer) {
      bool woke = false;
      for (uint32_t l = layer; l < layer + count && x; l++)
        if (!x->landed[l]) {
          x->landed[l] = 1;
          woke = true;
          if (++x->nlanded == c->layers) expect_end(c, x, NULL), x = NULL;
        }
      if (woke) pthread_cond_broadcast(&c->landed); /* the forward pass only */
    } else {
      st = x ? HIXL_PARAM_INVALID : HIXL_NOT_FOUND;
    }
  } else if (op == KV_SVC_ABORT) {
    if (x) {
      char why[KV_MAX_ID + 64];
      snprintf(why, sizeof(why), "the producer %s gave up: %s", peer, reason);
      expect_end(c, x, why);
    }
  } else if (op == KV_SVC_PIN) {
    if (h) {
      h->expires_ns = now_ns() + (uint64_t)c->cfg.lease_ms * 1000000ull;
      snprintf(h->consumer, sizeof(h->consumer), "%s", peer);
      kv_put_u8(&out, KV_PIN_HELD);
      kv_put_str(&out, c->layout_text, strlen(c->layout_text));
      kv_put_u32(&out, (uint32_t)h->n);
      kv_put_u64(&out, kv_blocks_digest(h->blocks, h->n));
    } else if (idset_has(&c->gone, id)) {
      kv_put_u8(&out, KV_PIN_GONE);
      const char *why = "it was freed, its lease expired, or it was aborted";
      kv_put_str(&out, why, strlen(why));
    } else {
      kv_put_u8(&out, KV_PIN_NOT_YET);
    }
  } else if (op == KV_SVC_FREE) {
    if (h)
      held_release(c, h);
    else if (!idset_has(&c->gone, id))
      gone_add(c, id); /* freed before it was even bound (an abort): never hold it */
  } else {
    st = HIXL_UNSUPPORTED;
  }
  pthread_mutex_unlock(&c->lock);
  if (st != HIXL_SUCCESS) {
    *resp_len = (size_t)snprintf((char *)resp, cap, "%s: KV service operation %u for request %s",
                                 st == HIXL_NOT_FOUND       ? "not expected here"
                                 : st == HIXL_PARAM_INVALID ? "layers out of range"
                                                            : "unknown",
                                 op, id);
    free(out.p);
    return st;
  }
  if (out.bad || out.len > cap) {
    free(out.p);
    *resp_len = (size_t)snprintf((char *)resp, cap, "KV service answer for %s does not fit", id);
    return HIXL_RESOURCE_EXHAUSTED;
  }
  if (out.len) memcpy(resp, out.p, out.len);
  *resp_len = out.len;
  free(out.p);
  return HIXL_SUCCESS;
}

/* ---- the consumer's loader thread ---- */

static int32_t ms_until(uint64_t deadline) {
  uint64_t now = now_ns();
  return now >= deadline ? 0 : (int32_t)((deadline - now + 999999) / 1000000);
}

/* A KV service request: op on request id (LAYER: which layer; ABORT: why). */
static bool kv_msg(struct kv_out *o, uint8_t op, const char *id, uint32_t layer, const char *reason) {
  kv_put_u8(o, KV_SVC_PROTO);
  kv_put_u8(o, op);
  kv_put_str(o, id, strlen(id));
  if (op == KV_SVC_LAYER || op == KV_SVC_LAYERS) kv_put_u32(o, layer); /* LAYERS: the caller adds count */
  if (op == KV_SVC_ABORT) kv_put_str(o, reason, strnlen(reason, KV_MAX_ID));
  return !o->bad;
}

static int kv_call_ex(hixl_kv_connector *c, const char *remote, uint8_t op, const char *id, uint32_t layer,
                      const char *reason, uint8_t *ans, size_t cap, size_t *n, int32_t timeout_ms,
                      HixlStatus *st) {
  struct kv_out o = {0};
  if (!kv_msg(&o, op, id, layer, reason)) {
    free(o.p);
    *st = HIXL_RESOURCE_EXHAUSTED;
    return -1;
  }
  *st = hixl_engine_call(c->eng, remote, HIXL_SERVICE_KV, o.p, o.len, ans, cap, n,
                         timeout_ms > 0 ? timeout_ms : 1);
  free(o.p);
  return *st == HIXL_SUCCESS ? 0 : -1;
}

static int kv_call(hixl_kv_connector *c, const char *remote, uint8_t op, const char *id, uint8_t *ans,
                   size_t cap, size_t *n, int32_t timeout_ms, HixlStatus *st) {
  return kv_call_ex(c, remote, op, id, 0, "", ans, cap, n, timeout_ms, st);
}

/* Link to the peer of e (again, if its link was lost), within timeout_ms: SUCCESS
 * also when it was linked already. A peer it fails for is remembered as unreachable
 * until a Link to it succeeds. */
static HixlStatus kv_link(hixl_kv_connector *c, const struct kv_meta_entry *e, int32_t timeout_ms) {
  HixlStatus st = HixlCacheManagerLink(c->mgr, e->cluster, e->remote, timeout_ms);
  if (st == HIXL_ALREADY_CONNECTED) st = HIXL_SUCCESS;
  pthread_mutex_lock(&c->lock);
  if (st == HIXL_SUCCESS)
    idset_del(&c->unreach, e->remote);
  else if (!idset_has(&c->unreach, e->remote))
    idset_add(&c->unreach, e->remote);
  pthread_mutex_unlock(&c->lock);
  return st;
}

/* Tell the peer of e that its request ended (FREE, ABORT with reason), best effort;
 * a peer that could not be told is named on stderr.
 * When the link was lost (by the transfer, or under this call), link again and tell it
 * there: else the peer would hold the request until its lease ran out, and then cut
 * every link with this side, the new one and the transfers on it included. Not when the
 * last Link to that peer failed (a peer that is gone would cost a wait per request),
 * and linking within notify_timeout_ms at most. A call that timed out is not sent
 * again: it is on the link, served when the peer reads it. */
static HixlStatus kv_tell(hixl_kv_connector *c, const struct kv_meta_entry *e, uint8_t op, const char *reason,
                          uint8_t *ans, size_t cap, size_t *n) {
  HixlStatus st;
  kv_call_ex(c, e->remote, op, e->rreq, 0, reason, ans, cap, n, c->cfg.notify_timeout_ms, &st);
  pthread_mutex_lock(&c->lock);
  bool again = !c->shut && !idset_has(&c->unreach, e->remote);
  pthread_mutex_unlock(&c->lock);
  if ((st == HIXL_NOT_CONNECTED || st == HIXL_FAILED) && again) {
    int32_t t = c->cfg.notify_timeout_ms < c->cfg.connect_timeout_ms ? c->cfg.notify_timeout_ms
                                                                     : c->cfg.connect_timeout_ms;
    if (kv_link(c, e, t) == HIXL_SUCCESS)
      kv_call_ex(c, e->remote, op, e->rreq, 0, reason, ans, cap, n, c->cfg.notify_timeout_ms, &st);
  }
  if (st != HIXL_SUCCESS)
    fprintf(stderr,
            "hixl-kv: request %s: %s could not be told that it ended (%s): it keeps it until its lease runs "
            "out\n",
            e->req, e->remote, HixlStatusName(st));
  return st;
}

/* Two compatibility digests differ: UNSUPPORTED when only the tensor-parallel sizes
 * do (heterogeneous TP is not built), else PARAM_INVALID; why names both. */
static HixlStatus layout_mismatch(const char *peer_kind, const char *peer, const char *theirs,
                                  const char *mine, const char *me, char *why, size_t cap) {
  const char *a = strstr(theirs, " tp="), *b = strstr(mine, " tp=");
  if (a && b && (size_t)(a - theirs) == (size_t)(b - mine) &&
      strncmp(theirs, mine, (size_t)(a - theirs)) == 0) {
    snprintf(why, cap,
             "heterogeneous tensor parallelism is not supported: the %s %s runs%s, this %s runs%s; nothing "
             "was moved",
             peer_kind, peer, a, me, b);
    return HIXL_UNSUPPORTED;
  }
  snprintf(why, cap, "layout mismatch: the %s %s has %s, this %s has %s; nothing was moved", peer_kind, peer,
           theirs, me, mine);
  return HIXL_PARAM_INVALID;
}

/* One load: link, pin (asking again while the producer has not bound it yet),
 * check the layout, pull, free. Returns the status and the reason in why. */
static HixlStatus load_one(hixl_kv_connector *c, const struct kv_meta_entry *e, char *why, size_t cap) {
  uint64_t deadline = now_ns() + (uint64_t)c->cfg.transfer_timeout_ms * 1000000ull;
  HixlStatus st = kv_link(c, e, c->cfg.connect_timeout_ms);
  if (st != HIXL_SUCCESS) {
    snprintf(why, cap, "linking to the producer %s: %s", e->remote, HixlGetLastErrorMessage());
    return st;
  }
  uint8_t *ans = malloc(HIXL_CALL_MAX);
  if (!ans) {
    snprintf(why, cap, "out of memory");
    return HIXL_RESOURCE_EXHAUSTED;
  }
  uint64_t digest = 0;
  size_t nrb = 0, n = 0;
  char layout[257];
  for (unsigned tries = 0;; tries++) {
    if (kv_call(c, e->remote, KV_SVC_PIN, e->rreq, ans, HIXL_CALL_MAX, &n, ms_until(deadline), &st) < 0) {
      snprintf(why, cap, "asking %s for request %s: %s", e->remote, e->rreq, HixlGetLastErrorMessage());
      goto out;
    }
    struct kv_in in = {ans, n, 0, false};
    uint8_t state = kv_get_u8(&in);
    if (state == KV_PIN_HELD) {
      kv_get_str(&in, layout, 256);
      nrb = kv_get_u32(&in);
      digest = kv_get_u64(&in);
      if (in.bad || in.off != n) {
        snprintf(why, cap, "%s gave a malformed answer for request %s", e->remote, e->rreq);
        st = HIXL_FAILED;
        goto out;
      }
      break;
    }
    if (state == KV_PIN_GONE) {
      char reason[257];
      kv_get_str(&in, reason, 256);
      snprintf(why, cap, "the producer %s no longer holds request %s: %s", e->remote, e->rreq, reason);
      st = HIXL_NOT_FOUND;
      goto out;
    }
    if (state != KV_PIN_NOT_YET || ms_until(deadline) == 0) {
      snprintf(why, cap, "the producer %s did not hold request %s within %d ms", e->remote, e->rreq,
               c->cfg.transfer_timeout_ms);
      st = HIXL_TIMEOUT;
      goto out;
    }
    struct timespec ts = {0, tries < 20 ? 200000 : 2000000}; /* the producer binds it at its next step */
    nanosleep(&ts, NULL);
  }
  if (strcmp(layout, c->layout_text) != 0) {
    st = layout_mismatch("producer", e->remote, layout, c->layout_text, "consumer", why, cap);
    goto out;
  }
  if (nrb < e->nrblocks || (nrb == e->nrblocks && digest != kv_blocks_digest(e->rblocks, e->nrblocks))) {
    snprintf(why, cap, "the producer %s holds %zu blocks of request %s, %zu %s asked for", e->remote, nrb,
             e->rreq, e->nrblocks, nrb < e->nrblocks ? "were" : "other ones were");
    st = HIXL_PARAM_INVALID;
    goto out;
  }
  HixlCacheAnyKey key = {.kind = HIXL_CACHE_KEY_BLOCKS, .u.blocks = {e->cluster, 0}};
  HixlCacheTransferArgs args = HIXL_CACHE_TRANSFER_ARGS_INIT;
  args.tensor_num_per_layer = c->tensors_per_layer;
  args.timeout_ms = ms_until(deadline) > 0 ? ms_until(deadline) : 1;
  st = HixlCacheManagerPullBlocks(c->mgr, &key, c->cache_id, e->rblocks, e->nrblocks, e->blocks, e->nblocks,
                                  &args);
  if (st != HIXL_SUCCESS)
    snprintf(why, cap, "pulling request %s from %s: %s", e->rreq, e->remote, HixlGetLastErrorMessage());
out:
  free(ans);
  return st;
}

static void *loader_main(void *arg) {
  hixl_kv_connector *c = arg;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    while (!c->queue && !c->shut) pthread_cond_wait(&c->cond, &c->lock);
    if (!c->queue && c->shut) break;
    struct kv_load *l = c->queue;
    c->queue = l->next;
    if (!c->queue) c->queue_tail = NULL;
    pthread_mutex_unlock(&c->lock);
    char why[1024] = "";
    HixlStatus st;
    if (l->e.type == KV_META_FREE) { /* an abort: the producer frees what it holds */
      uint8_t ans[64];
      size_t n;
      HixlStatus ls = kv_link(c, &l->e, c->cfg.connect_timeout_ms);
      if (ls != HIXL_SUCCESS)
        st = ls;
      else
        kv_call(c, l->e.remote, KV_SVC_FREE, l->e.rreq, ans, sizeof(ans), &n, c->cfg.notify_timeout_ms, &st);
      pthread_mutex_lock(&c->lock);
      c->loading--;
      free(l->e.blocks);
      free(l->e.rblocks);
      free(l);
      pthread_cond_broadcast(&c->cond);
      continue;
    }
    st = c->shut ? HIXL_FAILED : load_one(c, &l->e, why, sizeof(why));
    HixlCacheStats cs;
    HixlCacheManagerGetStats(c->mgr, &cs);
    pthread_mutex_lock(&c->lock);
    c->loading--;
    c->stats.engine_ops = cs.engine_ops;
    c->stats.lookups = cs.lookups;
    if (st == HIXL_SUCCESS) {
      c->stats.loads_done++;
      c->stats.bytes_loaded = cs.bytes;
    } else {
      c->stats.loads_failed++;
      fprintf(stderr, "hixl-kv: request %s failed to load (%s): %s\n", l->e.req, HixlStatusName(st), why);
      err_blocks_add(c, l->e.blocks, l->e.nblocks);
    }
    finished_add(c, &c->recving_done, l->e.req); /* the host may use the blocks now */
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    if (st != HIXL_NOT_FOUND) { /* the producer may still hold it: free it there (best effort) */
      uint8_t ans[64];
      size_t n;
      kv_tell(c, &l->e, KV_SVC_FREE, "", ans, sizeof(ans), &n);
    }
    free(l->e.blocks);
    free(l->e.rblocks);
    free(l);
    pthread_mutex_lock(&c->lock);
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

/* ---- push mode: the producer's pusher thread ---- */

/* Accept on the consumer: it expects the request, with the same layout, into at
 * least as many blocks. */
static HixlStatus push_accept(hixl_kv_connector *c, struct kv_push *p, char *why, size_t cap) {
  struct kv_meta_entry *e = &p->e;
  uint64_t deadline = now_ns() + (uint64_t)c->cfg.transfer_timeout_ms * 1000000ull;
  HixlStatus st = kv_link(c, e, c->cfg.connect_timeout_ms);
  if (st != HIXL_SUCCESS) {
    snprintf(why, cap, "linking to the consumer %s: %s", e->remote, HixlGetLastErrorMessage());
    return st;
  }
  uint8_t *ans = malloc(HIXL_CALL_MAX);
  if (!ans) return HIXL_RESOURCE_EXHAUSTED;
  char layout[257] = "";
  uint64_t digest = 0;
  size_t nrb = 0, n = 0;
  for (unsigned tries = 0;; tries++) {
    if (kv_call(c, e->remote, KV_SVC_ACCEPT, e->rreq, ans, HIXL_CALL_MAX, &n, ms_until(deadline), &st) < 0) {
      snprintf(why, cap, "asking the consumer %s for request %s: %s", e->remote, e->rreq,
               HixlGetLastErrorMessage());
      break;
    }
    struct kv_in in = {ans, n, 0, false};
    uint8_t state = kv_get_u8(&in);
    if (state == KV_PIN_HELD) {
      kv_get_str(&in, layout, 256);
      nrb = kv_get_u32(&in);
      digest = kv_get_u64(&in);
      if (in.bad || in.off != n) {
        snprintf(why, cap, "the consumer %s gave a malformed answer for request %s", e->remote, e->rreq);
        st = HIXL_FAILED;
      } else if (strcmp(layout, c->layout_text) != 0) {
        st = layout_mismatch("consumer", e->remote, layout, c->layout_text, "producer", why, cap);
      } else if (nrb < e->nblocks) {
        snprintf(why, cap, "the consumer %s expects %zu blocks of request %s, this producer has %zu",
                 e->remote, nrb, e->rreq, e->nblocks);
        st = HIXL_PARAM_INVALID;
      } else if (nrb == e->nrblocks && digest != kv_blocks_digest(e->rblocks, e->nrblocks)) {
        snprintf(why, cap, "the consumer %s expects request %s in other blocks than its push params named",
                 e->remote, e->rreq);
        st = HIXL_PARAM_INVALID;
      }
      break;
    }
    if (state == KV_PIN_GONE || state != KV_PIN_NOT_YET || ms_until(deadline) == 0) {
      snprintf(why, cap, "the consumer %s does not expect request %s (%s)", e->remote, e->rreq,
               state == KV_PIN_GONE ? "it already ended" : "not within the transfer timeout");
      st = state == KV_PIN_GONE ? HIXL_NOT_FOUND : HIXL_TIMEOUT;
      break;
    }
    struct timespec ts = {0, tries < 20 ? 200000 : 2000000};
    nanosleep(&ts, NULL);
  }
  free(ans);
  return st;
}

/* Wait until layer l of step has been saved (save_kv_layer), or the deadline. */
static bool push_wait_saved(hixl_kv_connector *c, uint32_t l, uint64_t step, uint64_t deadline) {
  struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                        .tv_nsec = (long)(deadline % 1000000000ull)};
  pthread_mutex_lock(&c->lock);
  while (!c->shut && c->saved_step[l] < step)
    if (pthread_cond_timedwait(&c->saved, &c->lock, &ts) == ETIMEDOUT) break;
  bool ok = c->saved_step[l] >= step;
  pthread_mutex_unlock(&c->lock);
  return ok;
}

/* One range of layers of one push on its way (one layer while the pusher keeps up):
 * its WRITE, and the landed notice (KV service LAYER or LAYERS call) the engine sends
 * once the WRITE has landed (hixl_cache_push_blocks_then_call). The pusher starts
 * each range as soon as it is saved, never waiting for the one before: the next
 * range's data queues right behind, as the raw engine's async WRITEs do; all are
 * waited for once the step's layers are out. */
struct push_note {
  hixl_call_t call;
  uint32_t i, layer, count;
  uint32_t alen;
  uint8_t ans[256];
};

/* Start layers [k, k + count) of push v with their notice (LAYER for one, LAYERS
 * for more); why on failure. */
static HixlStatus layer_start(hixl_kv_connector *c, struct kv_push *v, uint32_t k, uint32_t count,
                              struct push_note *pn, char *why, size_t cap) {
  struct kv_meta_entry *e = &v->e;
  struct kv_out o = {0};
  HixlStatus st = HIXL_RESOURCE_EXHAUSTED;
  HixlBlocksCacheKey key = {e->cluster, 0};
  HixlCacheTransferArgs a = HIXL_CACHE_TRANSFER_ARGS_INIT;
  a.src_layer_start = a.dst_layer_start = k;
  a.src_layer_count = a.dst_layer_count = count;
  a.tensor_num_per_layer = c->tensors_per_layer;
  a.timeout_ms = c->cfg.transfer_timeout_ms;
  bool built = kv_msg(&o, count > 1 ? KV_SVC_LAYERS : KV_SVC_LAYER, e->rreq, k, "");
  if (count > 1) kv_put_u32(&o, count);
  built = built && !o.bad;
  if (built)
    st = hixl_cache_push_blocks_then_call(c->mgr, &key, c->cache_id, e->blocks, e->nblocks, e->rblocks,
                                          e->nblocks, &a, HIXL_SERVICE_KV, o.p, o.len, pn->ans,
                                          sizeof(pn->ans), &pn->alen, &pn->call);
  free(o.p);
  if (st != HIXL_SUCCESS)
    snprintf(why, cap, "layers %u..%u of request %s to %s: %s", k, k + count - 1, e->req, e->remote,
             !built ? "out of memory" : HixlGetLastErrorMessage());
  return st;
}

/* The last layer from k on whose save for step has come, each one between too. */
static uint32_t saved_through(hixl_kv_connector *c, uint32_t k, uint64_t step) {
  pthread_mutex_lock(&c->lock);
  while (k + 1 < c->layers && c->saved_step[k + 1] >= step) k++;
  pthread_mutex_unlock(&c->lock);
  return k;
}

/* One step's pushes, layer by layer: each layer leaves as soon as it is saved, while
 * the producer computes the next; layers saved while the pusher was busy starting
 * earlier ones leave together, as one range with one notice (layer_pipelining false:
 * every layer at once, once the last is saved). Each notice follows its data. */
static void push_batch(hixl_kv_connector *c, struct kv_push **v, size_t n) {
  HixlStatus *st = calloc(n, sizeof(*st));
  char(*why)[512] = calloc(n, sizeof(*why));
  struct push_note *notes = calloc(n * c->layers + 1, sizeof(*notes));
  size_t nnotes = 0;
  if (!st || !why || !notes) {
    free(st);
    free(why);
    free(notes);
    return;
  }
  for (size_t i = 0; i < n; i++) st[i] = push_accept(c, v[i], why[i], sizeof(why[i]));
  for (uint32_t l = 0, count; l < c->layers; l += count) {
    bool any = false;
    count = 1;
    for (size_t i = 0; i < n; i++) any |= st[i] == HIXL_SUCCESS;
    if (!any) break;
    uint32_t need = c->cfg.pipelining ? l : c->layers - 1;
    uint64_t deadline = v[0]->bound_ns + (uint64_t)c->cfg.lease_ms * 1000000ull;
    if (!push_wait_saved(c, need, v[0]->step, deadline)) {
      for (size_t i = 0; i < n; i++)
        if (st[i] == HIXL_SUCCESS) {
          st[i] = HIXL_TIMEOUT;
          snprintf(why[i], sizeof(why[i]), "layer %u was not saved within lease_ms %u", need,
                   c->cfg.lease_ms);
        }
      break;
    }
    count = saved_through(c, need, v[0]->step) - l + 1;
    for (size_t i = 0; i < n; i++) {
      if (st[i] != HIXL_SUCCESS) continue;
      struct push_note *pn = &notes[nnotes];
      if ((st[i] = layer_start(c, v[i], l, count, pn, why[i], sizeof(why[i]))) != HIXL_SUCCESS) continue;
      pn->i = (uint32_t)i;
      pn->layer = l;
      pn->count = count;
      nnotes++;
    }
  }
  /* Every notice answered (or failed) before the pushes are reported done. */
  for (size_t j = 0; j < nnotes; j++) {
    struct push_note *pn = &notes[j];
    struct kv_meta_entry *e = &v[pn->i]->e;
    HixlStatus ns = hixl_engine_call_wait(c->eng, e->remote, pn->call);
    hixl_cache_unpin(c->mgr, c->cache_id);
    if (ns == HIXL_SUCCESS) {
      pthread_mutex_lock(&c->lock);
      c->stats.layers_pushed += pn->count;
      pthread_mutex_unlock(&c->lock);
    } else if (st[pn->i] == HIXL_SUCCESS) {
      st[pn->i] = ns;
      snprintf(why[pn->i], sizeof(why[pn->i]),
               "layers %u..%u of request %s to %s, or their landed notice: %s", pn->layer,
               pn->layer + pn->count - 1, e->req, e->remote, HixlGetLastErrorMessage());
    }
  }
  free(notes);
  uint8_t ans[256];
  size_t an;
  HixlCacheStats cs;
  HixlCacheManagerGetStats(c->mgr, &cs);
  for (size_t i = 0; i < n; i++) {
    struct kv_meta_entry *e = &v[i]->e;
    if (st[i] != HIXL_SUCCESS) { /* the consumer reports the failure; best effort */
      fprintf(stderr, "hixl-kv: request %s was not pushed (%s): %s\n", e->req, HixlStatusName(st[i]), why[i]);
      kv_tell(c, e, KV_SVC_ABORT, why[i], ans, sizeof(ans), &an);
    }
    pthread_mutex_lock(&c->lock);
    if (st[i] == HIXL_SUCCESS)
      c->stats.pushes_done++;
    else
      c->stats.pushes_failed++;
    c->stats.engine_ops = cs.engine_ops;
    c->stats.lookups = cs.lookups;
    c->stats.blocks_held -= e->nblocks;
    c->stats.requests_held--;
    finished_add(c, &c->sending_done, e->req); /* the host may free the producer's blocks */
    pthread_mutex_unlock(&c->lock);
  }
  free(st);
  free(why);
}

static void *pusher_main(void *arg) {
  hixl_kv_connector *c = arg;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    while (!c->pushes && !c->shut) pthread_cond_wait(&c->cond, &c->lock);
    if (!c->pushes) break;
    /* The head's step: every push bound in it goes layer by layer together. */
    uint64_t step = c->pushes->step;
    size_t n = 0;
    for (struct kv_push *p = c->pushes; p && p->step == step; p = p->next) n++;
    struct kv_push **v = malloc(n * sizeof(*v));
    if (!v) break;
    for (size_t i = 0; i < n; i++) {
      v[i] = c->pushes;
      c->pushes = c->pushes->next;
    }
    if (!c->pushes) c->pushes_tail = NULL;
    pthread_mutex_unlock(&c->lock);
    push_batch(c, v, n);
    for (size_t i = 0; i < n; i++) {
      free(v[i]->e.blocks);
      free(v[i]->e.rblocks);
      free(v[i]);
    }
    free(v);
    pthread_mutex_lock(&c->lock);
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

/* ---- life ---- */

static hixl_kv_status kv_shutdown(hixl_kv_connector *c);

static hixl_kv_status kv_create(const char *json, size_t len, int32_t role, uint32_t rank, uint32_t world,
                                hixl_kv_connector **out, char *err, size_t err_cap) {
  hixl_kv_status st;
  char why[512] = "";
  hixl_kv_connector *c = NULL;
  if (!json || !out || (role != HIXL_KV_ROLE_SCHEDULER && role != HIXL_KV_ROLE_WORKER) || world == 0 ||
      rank >= world) {
    st = kv_fail(HIXL_KV_PARAM_INVALID,
                 "create: config_json or out is NULL, role %d is unknown, or rank %u is not "
                 "below world size %u",
                 role, rank, world);
    goto fail;
  }
  if (!(c = calloc(1, sizeof(*c)))) {
    st = kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "create: out of memory");
    goto fail;
  }
  c->role = role;
  c->rank = rank;
  c->world = world;
  c->efd = -1;
  if ((st = kv_config_load(json, len, &c->cfg, why, sizeof(why))) != HIXL_KV_SUCCESS) {
    kv_fail(st, "create: %s", why);
    goto fail_cfg;
  }
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->cond, &ca);
  pthread_cond_init(&c->saved, &ca);
  pthread_cond_init(&c->landed, &ca);
  pthread_condattr_destroy(&ca);
  if (role == HIXL_KV_ROLE_WORKER) {
    if ((st = worker_address(c->cfg.address, rank, c->engine_addr, sizeof(c->engine_addr), &c->cluster)) !=
        HIXL_KV_SUCCESS)
      goto fail_sync;
    if ((st = HixlEngineCreate(&c->eng)) != HIXL_SUCCESS) {
      kv_fail(st, "create: %s", HixlGetLastErrorMessage());
      goto fail_sync;
    }
    if ((st = HixlEngineInitialize(c->eng, c->engine_addr, c->cfg.opts, c->cfg.nopts)) != HIXL_SUCCESS) {
      kv_fail(st, "create: engine %s: %s", c->engine_addr, HixlGetLastErrorMessage());
      goto fail_engine;
    }
    if ((st = HixlCacheManagerCreate(c->eng, c->cluster, &c->mgr)) != HIXL_SUCCESS) {
      kv_fail(st, "create: %s", HixlGetLastErrorMessage());
      goto fail_engine;
    }
    if ((st = hixl_engine_set_service(c->eng, HIXL_SERVICE_KV, kv_serve, c)) != HIXL_SUCCESS) {
      kv_fail(st, "create: %s", HixlGetLastErrorMessage());
      goto fail_mgr;
    }
    int rc = pthread_create(&c->loader, NULL, loader_main, c);
    if (rc != 0) {
      st = kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "create: pthread_create: %s", strerror(rc));
      goto fail_service;
    }
    c->loader_on = true;
    if (c->cfg.push && c->cfg.producer) {
      if ((rc = pthread_create(&c->pusher, NULL, pusher_main, c)) != 0) {
        st = kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "create: pthread_create: %s", strerror(rc));
        kv_shutdown(c);
        goto fail_service;
      }
      c->pusher_on = true;
    }
  }
  *out = c;
  return HIXL_KV_SUCCESS;

fail_service:
  hixl_engine_set_service(c->eng, HIXL_SERVICE_KV, NULL, NULL);
fail_mgr:
  HixlCacheManagerDestroy(c->mgr);
fail_engine:
  HixlEngineDestroy(c->eng);
fail_sync:
  pthread_cond_destroy(&c->cond);
  pthread_cond_destroy(&c->saved);
  pthread_cond_destroy(&c->landed);
  pthread_mutex_destroy(&c->lock);
fail_cfg:
  kv_config_free(&c->cfg);
  free(c);
fail:
  if (err && err_cap) snprintf(err, err_cap, "%s", kv_err);
  return st;
}

static hixl_kv_status kv_shutdown(hixl_kv_connector *c) {
  CHECK_ARG(c, "shutdown: connector is NULL");
  pthread_mutex_lock(&c->lock);
  c->shut = true;
  pthread_cond_broadcast(&c->cond);
  pthread_cond_broadcast(&c->saved);
  pthread_cond_broadcast(&c->landed);
  pthread_mutex_unlock(&c->lock);
  if (c->loader_on) {
    pthread_join(c->loader, NULL);
    c->loader_on = false;
  }
  if (c->pusher_on) {
    pthread_join(c->pusher, NULL);
    c->pusher_on = false;
  }
  return HIXL_KV_SUCCESS;
}

static void loads_free(struct kv_load *l) {
  while (l) {
    struct kv_load *n = l->next;
    free(l->e.blocks);
    free(l->e.rblocks);
    free(l);
    l = n;
  }
}

static hixl_kv_status kv_destroy(hixl_kv_connector *c) {
  CHECK_ARG(c, "destroy: connector is NULL");
  kv_shutdown(c);
  if (c->eng) {
    hixl_engine_set_service(c->eng, HIXL_SERVICE_KV, NULL, NULL);
    HixlCacheManagerDestroy(c->mgr);
    HixlEngineDestroy(c->eng);
  }
  while (c->held) {
    struct kv_held *h = c->held;
    c->held = h->next;
    free(h->blocks);
    free(h);
  }
  loads_free(c->loads);
  loads_free(c->queue);
  while (c->pushes) {
    struct kv_push *p = c->pushes;
    c->pushes = p->next;
    free(p->e.blocks);
    free(p->e.rblocks);
    free(p);
  }
  while (c->expects) {
    struct kv_expect *x = c->expects;
    c->expects = x->next;
    free(x->blocks);
    free(x->landed);
    free(x);
  }
  while (c->allocs) {
    struct kv_alloc *a = c->allocs;
    c->allocs = a->next;
    free(a->blocks);
    free(a);
  }
  idset_clear(&c->pushing);
  idset_clear(&c->holding);
  idset_clear(&c->drop);
  idset_clear(&c->unreach);
  free(c->saved_step);
  idset_clear(&c->failed);
  idset_clear(&c->gone);
  idset_clear(&c->sending_done);
  idset_clear(&c->recving_done);
  free(c->err_blocks);
  free(c->meta.p);
  if (c->efd >= 0) close(c->efd);
  kv_config_free(&c->cfg);
  pthread_cond_destroy(&c->cond);
  pthread_cond_destroy(&c->saved);
  pthread_cond_destroy(&c->landed);
  pthread_mutex_destroy(&c->lock);
  free(c);
  return HIXL_KV_SUCCESS;
}

/* ---- scheduler side ---- */

/* The fields of a consumer's kv_transfer_params; false with why when absent or bad. */
struct kv_params {
  char remote[KV_MAX_ENGINE + 1]; /* rank 0's engine */
  uint64_t port0;
  char rreq[KV_MAX_ID + 1];
  uint64_t *blocks;
  size_t n;
};

/* flag: "do_remote_prefill" (a consumer's params, from a producer) or
 * "do_remote_decode" (a producer's, from a consumer in push mode). */
static bool params_parse(const hixl_kv_request *r, const char *flag, struct kv_params *p, char *why,
                         size_t cap) {
  memset(p, 0, sizeof(*p));
  if (!r->kv_transfer_params || r->kv_transfer_params_len == 0) {
    snprintf(why, cap, "no kv_transfer_params");
    return false;
  }
  struct json_tokener *tok = json_tokener_new();
  if (!tok) return false;
  json_object *o = json_tokener_parse_ex(tok, r->kv_transfer_params, (int)r->kv_transfer_params_len);
  bool ok =
      o && json_tokener_get_error(tok) == json_tokener_success && json_object_is_type(o, json_type_object);
  json_tokener_free(tok);
  json_object *v;
  if (ok && (!json_object_object_get_ex(o, flag, &v) || !json_object_is_type(v, json_type_boolean) ||
             !json_object_get_boolean(v)))
    ok = false, snprintf(why, cap, "%s is not true", flag);
  else if (ok &&
           (!json_object_object_get_ex(o, "remote_engine", &v) || !json_object_is_type(v, json_type_string) ||
            json_object_get_string_len(v) > (int)KV_MAX_ENGINE))
    ok = false,
    snprintf(why, cap, "remote_engine is missing or not a string of at most %u bytes", KV_MAX_ENGINE);
  else if (ok)
    snprintf(p->remote, sizeof(p->remote), "%s", json_object_get_string(v));
  if (ok &&
      (!json_object_object_get_ex(o, "remote_request_id", &v) || !json_object_is_type(v, json_type_string) ||
       !copy_id(p->rreq, json_object_get_string(v), (size_t)json_object_get_string_len(v))))
    ok = false,
    snprintf(why, cap, "remote_request_id is missing or not a string of 1 to %u bytes", KV_MAX_ID);
  json_object *b = NULL;
  if (ok &&
      (!json_object_object_get_ex(o, "remote_block_ids", &b) || !json_object_is_type(b, json_type_array) ||
       json_object_array_length(b) == 0 || json_object_array_length(b) > KV_MAX_BLOCKS))
    ok = false, snprintf(why, cap, "remote_block_ids is missing, empty or longer than %u", KV_MAX_BLOCKS);
  if (ok && !(p->blocks = malloc(json_object_array_length(b) * sizeof(uint64_t))))
    ok = false, snprintf(why, cap, "out of memory");
  for (size_t i = 0; ok && i < json_object_array_length(b); i++) {
    json_object *e = json_object_array_get_idx(b, i);
    int64_t x = json_object_get_int64(e);
    if (!json_object_is_type(e, json_type_int) || x < 0)
      ok = false, snprintf(why, cap, "remote_block_ids[%zu] is not a block id", i);
    else
      p->blocks[p->n++] = (uint64_t)x;
  }
  if (!ok && why[0] == '\0') snprintf(why, cap, "kv_transfer_params is not a JSON object");
  if (!ok) {
    free(p->blocks);
    p->blocks = NULL;
  }
  json_object_put(o);
  return ok;
}

/* Whether the request's params set flag to true (push mode: the router's mark). */
static bool params_flag(const hixl_kv_request *r, const char *flag) {
  if (!r->kv_transfer_params || r->kv_transfer_params_len == 0) return false;
  struct json_tokener *tok = json_tokener_new();
  if (!tok) return false;
  json_object *o = json_tokener_parse_ex(tok, r->kv_transfer_params, (int)r->kv_transfer_params_len), *v;
  bool yes = o && json_tokener_get_error(tok) == json_tokener_success &&
             json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, flag, &v) &&
             json_object_is_type(v, json_type_boolean) && json_object_get_boolean(v);
  json_tokener_free(tok);
  json_object_put(o);
  return yes;
}

static hixl_kv_status check_req(const hixl_kv_request *r, const char *fn, char *id) {
  CHECK_ARG(r, "%s: request is NULL", fn);
  CHECK_ARG(copy_id(id, r->req_id, r->req_id_len), "%s: req_id must be 1 to %u bytes of text", fn, KV_MAX_ID);
  CHECK_ARG(r->kv_transfer_params_len == 0 || r->kv_transfer_params, "%s: kv_transfer_params is NULL", fn);
  return HIXL_KV_SUCCESS;
}

static hixl_kv_status kv_matched(hixl_kv_connector *c, const hixl_kv_request *r, uint64_t computed,
                                 int64_t *tokens, int32_t *load_async) {
  char id[KV_MAX_ID + 1], why[256] = "";
  hixl_kv_status st;
  CHECK_ARG(c && tokens && load_async, "get_num_new_matched_tokens: connector or an output is NULL");
  CHECK_ARG(c->role == HIXL_KV_ROLE_SCHEDULER,
            "get_num_new_matched_tokens: a scheduler op, on a worker connector");
  if ((st = check_req(r, "get_num_new_matched_tokens", id)) != HIXL_KV_SUCCESS) return st;
  int64_t n = 0;
  struct kv_params p = {0};
  bool remote =
      c->cfg.consumer &&
      (c->cfg.push ? params_flag(r, "do_remote_prefill")
                   : r->kv_transfer_params_len && params_parse(r, "do_remote_prefill", &p, why, sizeof(why)));
  if (remote) {
    free(p.blocks);
    pthread_mutex_lock(&c->lock);
    bool failed = idset_has(&c->failed, id);
    pthread_mutex_unlock(&c->lock);
    if (failed && !c->cfg.recompute)
      return kv_fail(HIXL_KV_FAILED,
                     "get_num_new_matched_tokens: request %s failed to load its KV "
                     "(load_failure_policy fail)",
                     id);
    if (!failed && r->num_prompt_tokens > computed) n = (int64_t)(r->num_prompt_tokens - computed);
  }
  *tokens = n;
  *load_async = n > 0;
  return HIXL_KV_SUCCESS;
}

/* Queue one metadata entry for the next build. Lock held. */
static void meta_add(hixl_kv_connector *c, const struct kv_meta_entry *e) {
  kv_meta_put(&c->meta, e);
  c->meta_count++;
}

/* Push mode: a consumer expects the producer's writes into the blocks just allocated
 * (get_push_params tells the producer where); a producer queues a PUSH of its blocks
 * into the consumer's named in the params. */
static hixl_kv_status push_after_alloc(hixl_kv_connector *c, const hixl_kv_request *r, const char *id,
                                       const uint64_t *blocks, size_t nblocks, uint64_t external) {
  char why[256] = "";
  if (c->cfg.consumer && params_flag(r, "do_remote_prefill")) {
    if (external == 0 || nblocks == 0) return HIXL_KV_SUCCESS;
    struct kv_alloc *a = calloc(1, sizeof(*a));
    uint64_t *b = malloc(nblocks * sizeof(*b));
    if (!a || !b) {
      free(a);
      free(b);
      return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "update_state_after_alloc: out of memory");
    }
    memcpy(b, blocks, nblocks * sizeof(*b));
    snprintf(a->id, sizeof(a->id), "%s", id);
    a->blocks = b;
    a->n = nblocks;
    struct kv_meta_entry e = {.type = KV_META_EXPECT, .blocks = (uint64_t *)blocks, .nblocks = nblocks};
    snprintf(e.req, sizeof(e.req), "%s", id);
    pthread_mutex_lock(&c->lock);
    a->next = c->allocs;
    c->allocs = a;
    meta_add(c, &e);
    pthread_mutex_unlock(&c->lock);
    return HIXL_KV_SUCCESS;
  }
  struct kv_params p;
  if (!c->cfg.producer || !params_parse(r, "do_remote_decode", &p, why, sizeof(why))) return HIXL_KV_SUCCESS;
  hixl_kv_status st = HIXL_KV_SUCCESS;
  struct kv_meta_entry e = {.type = KV_META_PUSH, .blocks = (uint64_t *)blocks, .nblocks = nblocks};
  snprintf(e.req, sizeof(e.req), "%s", id);
  snprintf(e.remote, sizeof(e.remote), "%s", p.remote);
  snprintf(e.rreq, sizeof(e.rreq), "%s", p.rreq);
  char engine[64];
  /* A block count that differs is refused by the pusher when it accepts on the consumer,
   * which tells the consumer at once (after the layout check, so a layout mismatch is
   * named as such). */
  if (nblocks == 0)
    st = kv_fail(HIXL_KV_PARAM_INVALID, "update_state_after_alloc: no blocks for request %s", id);
  else if (worker_address(p.remote, 0, engine, sizeof(engine), &e.cluster) != HIXL_KV_SUCCESS)
    st = kv_fail(HIXL_KV_PARAM_INVALID,
                 "update_state_after_alloc: request %s: remote_engine \"%s\" is not ip:port", id, p.remote);
  if (st == HIXL_KV_SUCCESS) {
    e.rblocks = p.blocks;
    e.nrblocks = p.n;
    pthread_mutex_lock(&c->lock);
    meta_add(c, &e);
    if (!idset_has(&c->pushing, id)) idset_add(&c->pushing, id);
    pthread_mutex_unlock(&c->lock);
  }
  free(p.blocks);
  return st;
}

static hixl_kv_status kv_after_alloc(hixl_kv_connector *c, const hixl_kv_request *r, const uint64_t *blocks,
                                     size_t nblocks, uint64_t external) {
  char id[KV_MAX_ID + 1], why[256] = "";
  hixl_kv_status st;
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_SCHEDULER,
            "update_state_after_alloc: connector is NULL or a worker's");
  if ((st = check_req(r, "update_state_after_alloc", id)) != HIXL_KV_SUCCESS) return st;
  CHECK_ARG(nblocks == 0 || blocks, "update_state_after_alloc: block_ids is NULL");
  if (c->cfg.push) return push_after_alloc(c, r, id, blocks, nblocks, external);
  struct kv_params p;
  if (!c->cfg.consumer || r->kv_transfer_params_len == 0 ||
      !params_parse(r, "do_remote_prefill", &p, why, sizeof(why)))
    return HIXL_KV_SUCCESS;
  struct kv_meta_entry e = {.type = external > 0 && nblocks > 0 ? KV_META_LOAD : KV_META_FREE};
  snprintf(e.req, sizeof(e.req), "%s", id);
  snprintf(e.remote, sizeof(e.remote), "%s", p.remote);
  snprintf(e.rreq, sizeof(e.rreq), "%s", p.rreq);
  st = HIXL_KV_SUCCESS;
  if (e.type == KV_META_LOAD) {
    /* Locally cached leading blocks are not loaded: the last nblocks remote ones are. */
    if (nblocks > p.n) {
      st = kv_fail(HIXL_KV_PARAM_INVALID,
                   "update_state_after_alloc: %zu blocks allocated for request %s, the "
                   "producer holds %zu",
                   nblocks, id, p.n);
      e.type = KV_META_FREE;
    } else {
      e.blocks = (uint64_t *)blocks;
      e.nblocks = nblocks;
      e.rblocks = p.blocks + (p.n - nblocks);
      e.nrblocks = nblocks;
    }
  }
  char engine[64];
  uint64_t cluster = 0;
  /* This rank's producer: the same rank on the other side (homogeneous parallelism). */
  if (worker_address(p.remote, 0, engine, sizeof(engine), &cluster) != HIXL_KV_SUCCESS) {
    st = kv_fail(HIXL_KV_PARAM_INVALID,
                 "update_state_after_alloc: request %s: remote_engine \"%s\" is not ip:port", id, p.remote);
  } else {
    e.cluster = cluster;
    pthread_mutex_lock(&c->lock);
    meta_add(c, &e);
    pthread_mutex_unlock(&c->lock);
  }
  free(p.blocks);
  return st;
}

static hixl_kv_status kv_build_meta(hixl_kv_connector *c, hixl_kv_buffer *meta) {
  CHECK_ARG(c && meta && c->role == HIXL_KV_ROLE_SCHEDULER,
            "build_connector_meta: connector or meta is NULL, or "
            "the connector is a worker's");
  struct kv_out o = {0};
  pthread_mutex_lock(&c->lock);
  kv_meta_begin(&o, c->meta_count);
  kv_put_raw(&o, c->meta.p, c->meta.len); /* the entries, encoded as they were queued */
  bool bad = o.bad || c->meta.bad;
  if (!bad) { /* the step's entries are in the metadata now */
    c->meta.len = 0;
    c->meta_count = 0;
  }
  pthread_mutex_unlock(&c->lock);
  if (bad) {
    free(o.p);
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "build_connector_meta: out of memory");
  }
  meta->data = o.p;
  meta->len = o.len;
  return HIXL_KV_SUCCESS;
}

static hixl_kv_status kv_finished(hixl_kv_connector *c, const hixl_kv_request *r, const uint64_t *blocks,
                                  size_t nblocks, int32_t *delay_free, hixl_kv_buffer *params) {
  char id[KV_MAX_ID + 1], why[256] = "";
  hixl_kv_status st;
  CHECK_ARG(c && delay_free && params && c->role == HIXL_KV_ROLE_SCHEDULER,
            "request_finished: connector or an output is NULL, or the connector is a worker's");
  if ((st = check_req(r, "request_finished", id)) != HIXL_KV_SUCCESS) return st;
  CHECK_ARG(nblocks == 0 || blocks, "request_finished: block_ids is NULL");
  struct kv_params p;
  /* A consumer's request that never loaded: the producer frees what it holds. */
  if (c->cfg.consumer && (r->flags & HIXL_KV_REQ_ABORTED) && r->kv_transfer_params_len &&
      params_parse(r, "do_remote_prefill", &p, why, sizeof(why))) {
    struct kv_meta_entry e = {.type = KV_META_FREE};
    snprintf(e.req, sizeof(e.req), "%s", id);
    snprintf(e.remote, sizeof(e.remote), "%s", p.remote);
    snprintf(e.rreq, sizeof(e.rreq), "%s", p.rreq);
    char engine[64];
    if (worker_address(p.remote, 0, engine, sizeof(engine), &e.cluster) == HIXL_KV_SUCCESS) {
      pthread_mutex_lock(&c->lock);
      meta_add(c, &e);
      pthread_mutex_unlock(&c->lock);
    }
    free(p.blocks);
  }
  if (c->cfg.push) { /* a pushed request's blocks stay until the pusher has sent them */
    pthread_mutex_lock(&c->lock);
    bool pushing = idset_has(&c->pushing, id);
    if (pushing) {
      for (size_t i = 0; i < c->pushing.n; i++)
        if (strcmp(c->pushing.v[i], id) == 0) {
          free(c->pushing.v[i]);
          c->pushing.v[i] = c->pushing.v[--c->pushing.n];
          break;
        }
    }
    pthread_mutex_unlock(&c->lock);
    *delay_free = pushing;
    params->data = NULL;
    params->len = 0;
    return HIXL_KV_SUCCESS;
  }
  bool full = false;
  if (c->cfg.producer && !(r->flags & HIXL_KV_REQ_ABORTED) && nblocks > 0) {
    pthread_mutex_lock(&c->lock);
    full = c->holding.n >= c->cfg.max_inflight;
    if (full && c->not_held++ == 0)
      fprintf(stderr,
              "hixl-kv: %zu requests are held for consumers (max_inflight_requests); request %s and "
              "later ones beyond the bound are not held: their consumers recompute them\n",
              c->holding.n, id);
    else if (!full && idset_add(&c->holding, id) != 0)
      full = true;
    pthread_mutex_unlock(&c->lock);
  }
  if (!c->cfg.producer || (r->flags & HIXL_KV_REQ_ABORTED) || nblocks == 0 || full) {
    *delay_free = 0;
    params->data = NULL;
    params->len = 0;
    return HIXL_KV_SUCCESS;
  }
  /* Keep the blocks for a consumer; tell it where they are. */
  json_object *o = json_object_new_object(), *arr = json_object_new_array();
  for (size_t i = 0; i < nblocks && arr; i++)
    json_object_array_add(arr, json_object_new_int64((int64_t)blocks[i]));
  if (o && arr) {
    json_object_object_add(o, "do_remote_prefill", json_object_new_boolean(1));
    json_object_object_add(o, "do_remote_decode", json_object_new_boolean(0));
    json_object_object_add(o, "remote_engine", json_object_new_string(c->cfg.address));
    json_object_object_add(o, "remote_request_id", json_object_new_string(id));
    json_object_object_add(o, "remote_block_ids", arr);
    json_object_object_add(o, "remote_num_tokens", json_object_new_int64((int64_t)r->num_prompt_tokens));
    json_object_object_add(o, "lease_ms", json_object_new_int64(c->cfg.lease_ms));
    json_object_object_add(o, "hixl_abi", json_object_new_int(HIXL_KV_ABI_MAJOR));
    arr = NULL;
  }
  const char *text = o ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN) : NULL;
  uint8_t *copy = text ? (uint8_t *)strdup(text) : NULL;
  struct kv_meta_entry e = {.type = KV_META_HOLD, .blocks = (uint64_t *)blocks, .nblocks = nblocks};
  snprintf(e.req, sizeof(e.req), "%s", id);
  if (copy) {
    pthread_mutex_lock(&c->lock);
    meta_add(c, &e);
    pthread_mutex_unlock(&c->lock);
  }
  json_object_put(arr);
  json_object_put(o);
  if (!copy) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "request_finished: out of memory");
  *delay_free = 1;
  params->data = copy;
  params->len = strlen((char *)copy);
  return HIXL_KV_SUCCESS;
}

static hixl_kv_status kv_push_params(hixl_kv_connector *c, const char *req_id, size_t len,
                                     hixl_kv_buffer *out) {
  char id[KV_MAX_ID + 1];
  CHECK_ARG(c && out && c->role == HIXL_KV_ROLE_SCHEDULER,
            "get_push_params: connector or output is NULL, or a worker's");
  CHECK_ARG(copy_id(id, req_id, len), "get_push_params: req_id must be 1 to %u bytes of text", KV_MAX_ID);
  CHECK_ARG(c->cfg.push && c->cfg.consumer, "get_push_params: for a consumer in mode push");
  pthread_mutex_lock(&c->lock);
  struct kv_alloc **pp = &c->allocs;
  while (*pp && strcmp((*pp)->id, id) != 0) pp = &(*pp)->next;
  struct kv_alloc *a = *pp;
  if (a) *pp = a->next;
  pthread_mutex_unlock(&c->lock);
  if (!a) return kv_fail(HIXL_KV_NOT_FOUND, "get_push_params: no blocks were allocated for request %s", id);
  json_object *o = json_object_new_object(), *arr = json_object_new_array();
  for (size_t i = 0; i < a->n && arr; i++)
    json_object_array_add(arr, json_object_new_int64((int64_t)a->blocks[i]));
  char *copy = NULL;
  if (o && arr) {
    json_object_object_add(o, "do_remote_prefill", json_object_new_boolean(0));
    json_object_object_add(o, "do_remote_decode", json_object_new_boolean(1));
    json_object_object_add(o, "remote_engine", json_object_new_string(c->cfg.address));
    json_object_object_add(o, "remote_request_id", json_object_new_string(id));
    json_object_object_add(o, "remote_block_ids", arr);
    json_object_object_add(o, "hixl_abi", json_object_new_int(HIXL_KV_ABI_MAJOR));
    arr = NULL;
    copy = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
  }
  json_object_put(arr);
  json_object_put(o);
  free(a->blocks);
  free(a);
  if (!copy) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "get_push_params: out of memory");
  out->data = (uint8_t *)copy;
  out->len = strlen(copy);
  return HIXL_KV_SUCCESS;
}

static hixl_kv_status kv_update_output(hixl_kv_connector *c, const hixl_kv_ids *sending,
                                       const hixl_kv_ids *recving, const hixl_kv_ids *failed) {
  (void)recving;
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_SCHEDULER,
            "update_connector_output: connector is NULL or a worker's");
  pthread_mutex_lock(&c->lock);
  for (size_t i = 0; sending && i < sending->count; i++) /* their blocks are free: room to hold more */
    if (sending->ids[i]) idset_del(&c->holding, sending->ids[i]);
  for (size_t i = 0; failed && i < failed->count; i++)
    if (failed->ids[i] && !idset_has(&c->failed, failed->ids[i])) idset_add(&c->failed, failed->ids[i]);
  pthread_mutex_unlock(&c->lock);
  return HIXL_KV_SUCCESS;
}

static hixl_kv_status kv_set_handshake(hixl_kv_connector *c, const uint8_t *meta, size_t len) {
  CHECK_ARG(c && (meta || len == 0), "set_handshake_metadata: connector or metadata is NULL");
  return HIXL_KV_SUCCESS; /* kv_transfer_params and the PIN answer carry what a peer needs */
}

/* ---- worker side ---- */

/* register_kv_caches (the host's memory at ly[i].base), or alloc_kv_caches (alloc:
 * the cache manager allocates it; base and v_offset are written back on success). */
static hixl_kv_status kv_setup(hixl_kv_connector *c, hixl_kv_layer *ly, size_t n, bool alloc) {
  const char *fn = alloc ? "alloc_kv_caches" : "register_kv_caches";
  CHECK_ARG(c && ly && n > 0 && c->role == HIXL_KV_ROLE_WORKER,
            "%s: connector or layers is NULL, none given, or a "
            "scheduler's connector",
            fn);
  CHECK_ARG(c->cache_id == 0, "%s: caches are already registered", fn);
  CHECK_ARG(n <= HIXL_CACHE_MAX_ADDRS / 2, "%s: %zu layers; at most %d", fn, n, HIXL_CACHE_MAX_ADDRS / 2);
  const hixl_kv_layer *l0 = &ly[0];
  for (size_t i = 0; i < n; i++) {
    const hixl_kv_layer *l = &ly[i];
    CHECK_ARG(
        (l->base || alloc) && l->num_blocks && l->block_bytes && l->elem_size && l->block_tokens &&
            l->block_bytes % l->elem_size == 0,
        "%s: layer %zu: base, num_blocks, block_bytes, elem_size and block_tokens must be set (block_bytes a "
        "multiple of elem_size)",
        fn, i);
    CHECK_ARG(l->layout == HIXL_KV_LAYOUT_KV_FIRST || l->layout == HIXL_KV_LAYOUT_BLOCKS_FIRST,
              "%s: layer %zu: layout %u is unknown", fn, i, l->layout);
    CHECK_ARG(alloc || l->layout != HIXL_KV_LAYOUT_KV_FIRST || l->v_offset >= l->num_blocks * l->block_bytes,
              "%s: layer %zu: V at offset %" PRIu64 " overlaps K's %" PRIu64 " bytes", fn, i, l->v_offset,
              l->num_blocks * l->block_bytes);
    CHECK_ARG(l->num_blocks == l0->num_blocks && l->block_bytes == l0->block_bytes &&
                  l->layout == l0->layout && l->elem_size == l0->elem_size &&
                  l->block_tokens == l0->block_tokens,
              "%s: layer %zu differs from layer 0 (every layer must have the same shape)", fn, i);
  }
  bool split = l0->layout == HIXL_KV_LAYOUT_KV_FIRST;
  uint32_t tpl = split ? 2 : 1;
  size_t nt = n * tpl;
  uintptr_t *addrs = malloc(nt * sizeof(*addrs));
  if (!addrs) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  for (size_t i = 0; i < n; i++) {
    addrs[i * tpl] = ly[i].base;
    if (split) addrs[i * tpl + 1] = ly[i].base + ly[i].v_offset;
  }
  uint64_t item = split ? l0->block_bytes : 2 * l0->block_bytes;
  HixlCacheDesc d = {(uint32_t)nt, l0->elem_size, 2, {l0->num_blocks, item / l0->elem_size}, HIXL_CACHE_HOST};
  HixlBlocksCacheKey key = {c->cluster, 0};
  uint64_t id = 0;
  HixlStatus st =
      alloc ? HixlCacheManagerAllocateBlocksCache(c->mgr, &d, &key, addrs, nt, &id)
            : HixlCacheManagerRegisterBlocksCache(c->mgr, &d, addrs, nt, &key, HIXL_CACHE_ACCESS_REMOTE, &id);
  if (st != HIXL_SUCCESS) {
    free(addrs);
    return kv_fail(st, "%s: %s", fn, HixlGetLastErrorMessage());
  }
  for (size_t i = 0; i < n && alloc; i++) { /* K (and V) of layer i are tensors i * tpl (+ 1) */
    ly[i].base = addrs[i * tpl];
    ly[i].v_offset = split ? addrs[i * tpl + 1] - addrs[i * tpl] : 0;
  }
  free(addrs);
  uint64_t *saved = calloc(n, sizeof(*saved));
  if (!saved) {
    HixlCacheManagerUnregisterCache(c->mgr, id);
    return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  }
  pthread_mutex_lock(&c->lock);
  c->saved_step = saved;
  c->cache_id = id;
  c->layers = (uint32_t)n;
  c->tensors_per_layer = tpl;
  snprintf(c->layout_text, sizeof(c->layout_text),
           "abi=%u layers=%zu block_tokens=%u block_bytes=%" PRIu64 " elem_size=%u layout=%s tp=%u",
           HIXL_KV_ABI_MAJOR, n, l0->block_tokens, l0->block_bytes, l0->elem_size,
           split ? "kv_first" : "blocks_first", c->world);
  pthread_mutex_unlock(&c->lock);
  return HIXL_KV_SUCCESS;
}

static hixl_kv_status kv_register(hixl_kv_connector *c, const hixl_kv_layer *ly, size_t n) {
  return kv_setup(c, (hixl_kv_layer *)ly, n, false); /* nothing is written back */
}

static hixl_kv_status kv_alloc_caches(hixl_kv_connector *c, hixl_kv_layer *ly, size_t n) {
  return kv_setup(c, ly, n, true);
}

static hixl_kv_status kv_bind(hixl_kv_connector *c, const uint8_t *meta, size_t len) {
  const char *fn = "bind_connector_meta";
  CHECK_ARG(c && meta && c->role == HIXL_KV_ROLE_WORKER,
            "%s: connector or metadata is NULL, or a scheduler's", fn);
  struct kv_meta_entry *v = NULL;
  size_t n = 0;
  CHECK_ARG(kv_meta_parse(meta, len, &v, &n),
            "%s: %zu bytes of metadata do not parse (not from this plugin's "
            "build_connector_meta?)",
            fn, len);
  hixl_kv_status st = HIXL_KV_SUCCESS;
  pthread_mutex_lock(&c->lock);
  c->step++; /* one bind per step: this step's save_kv_layer calls release its pushes */
  uint64_t now = now_ns();
  for (size_t i = 0; i < n; i++) {
    struct kv_meta_entry *e = &v[i];
    if (e->type == KV_META_PUSH || e->type == KV_META_EXPECT) {
      if (c->cache_id == 0) {
        st = kv_fail(HIXL_KV_PARAM_INVALID, "%s: request %s: register_kv_caches first", fn, e->req);
        continue;
      }
      if (e->type == KV_META_PUSH && c->cfg.producer) {
        struct kv_push *p = calloc(1, sizeof(*p));
        if (!p || worker_address(e->remote, c->rank, e->remote, sizeof(e->remote), &e->cluster) !=
                      HIXL_KV_SUCCESS) {
          free(p);
          st = kv_fail(HIXL_KV_PARAM_INVALID, "%s: request %s: cannot push to \"%s\"", fn, e->req, e->remote);
          continue;
        }
        p->e = *e;
        e->blocks = e->rblocks = NULL;
        p->step = c->step;
        p->bound_ns = now;
        c->stats.blocks_held += p->e.nblocks;
        c->stats.requests_held++;
        if (c->pushes_tail)
          c->pushes_tail->next = p;
        else
          c->pushes = p;
        c->pushes_tail = p;
        pthread_cond_broadcast(&c->cond);
      } else if (e->type == KV_META_EXPECT && c->cfg.consumer && !expect_find(c, e->req)) {
        struct kv_expect *x = calloc(1, sizeof(*x));
        uint8_t *landed = calloc(c->layers, 1);
        if (!x || !landed) {
          free(x);
          free(landed);
          st = kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
          continue;
        }
        snprintf(x->id, sizeof(x->id), "%s", e->req);
        x->blocks = e->blocks;
        x->n = e->nblocks;
        e->blocks = NULL;
        x->landed = landed;
        x->step = c->step;
        x->deadline_ns = now + (uint64_t)c->cfg.lease_ms * 1000000ull;
        x->next = c->expects;
        c->expects = x;
      }
      continue;
    }
    if (e->type == KV_META_HOLD) {
      if (!c->cfg.producer || held_find(c, e->req)) continue;
      if (idset_has(&c->gone, e->req)) { /* the consumer freed it already (an abort) */
        finished_add(c, &c->sending_done, e->req);
        continue;
      }
      struct kv_held *h = calloc(1, sizeof(*h));
      if (!h) {
        st = kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
        continue;
      }
      snprintf(h->id, sizeof(h->id), "%s", e->req);
      h->blocks = e->blocks;
      h->n = e->nblocks;
      e->blocks = NULL;
      h->expires_ns = now_ns() + (uint64_t)c->cfg.lease_ms * 1000000ull;
      h->next = c->held;
      c->held = h;
      c->stats.blocks_held += h->n;
      c->stats.requests_held++;
    } else if (c->cfg.consumer) { /* LOAD or FREE: the loader's */
      struct kv_load *l = calloc(1, sizeof(*l));
      if (!l) {
        st = kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
        continue;
      }
      l->e = *e;
      /* This rank pulls from the same rank of the producer. */
      if (worker_address(e->remote, c->rank, l->e.remote, sizeof(l->e.remote), &l->e.cluster) !=
          HIXL_KV_SUCCESS) {
        free(l);
        continue;
      }
      e->blocks = e->rblocks = NULL;
      if (c->loads_tail)
        c->loads_tail->next = l;
      else
        c->loads = l;
      c->loads_tail = l;
    }
  }
  pthread_mutex_unlock(&c->lock);
  kv_meta_free(v, n);
  return st;
}

static hixl_kv_status kv_clear(hixl_kv_connector *c) {
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_WORKER, "clear_connector_meta: connector is NULL or a scheduler's");
  return HIXL_KV_SUCCESS;
}

static hixl_kv_status kv_start_load(hixl_kv_connector *c) {
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_WORKER, "start_load_kv: connector is NULL or a scheduler's");
  pthread_mutex_lock(&c->lock);
  if (c->loads && c->cache_id == 0) {
    pthread_mutex_unlock(&c->lock);
    return kv_fail(HIXL_KV_PARAM_INVALID, "start_load_kv: register_kv_caches first");
  }
  for (struct kv_load *l = c->loads; l; l = l->next) c->loading++;
  if (c->loads) {
    if (c->queue_tail)
      c->queue_tail->next = c->loads;
    else
      c->queue = c->loads;
    c->queue_tail = c->loads_tail;
    c->loads = c->loads_tail = NULL;
    pthread_cond_broadcast(&c->cond);
  }
  pthread_mutex_unlock(&c->lock);
  return HIXL_KV_SUCCESS;
}

static hixl_kv_status kv_wait_layer(hixl_kv_connector *c, uint32_t layer) {
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_WORKER, "wait_for_layer_load: connector is NULL or a scheduler's");
  CHECK_ARG(c->cache_id == 0 || layer < c->layers, "wait_for_layer_load: layer %u of %u", layer, c->layers);
  if (!c->cfg.push) return HIXL_KV_SUCCESS; /* pull loads are asynchronous: they end in get_finished */
  /* Push: until layer has landed for every request this step bound (the forward pass
   * about to use it), or one's lease ends. Earlier ones end in get_finished. */
  pthread_mutex_lock(&c->lock);
  hixl_kv_status st = HIXL_KV_SUCCESS;
  for (;;) {
    expects_expire(c);
    uint64_t first = UINT64_MAX;
    for (struct kv_expect *x = c->expects; x; x = x->next)
      if (x->step == c->step && !x->landed[layer] && x->deadline_ns < first) first = x->deadline_ns;
    if (first == UINT64_MAX || c->shut) break;
    struct timespec ts = {.tv_sec = (time_t)(first / 1000000000ull),
                          .tv_nsec = (long)(first % 1000000000ull)};
    pthread_cond_timedwait(&c->landed, &c->lock, &ts);
  }
  pthread_mutex_unlock(&c->lock);
  return st;
}

static hixl_kv_status kv_save_layer(hixl_kv_connector *c, uint32_t layer) {
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_WORKER, "save_kv_layer: connector is NULL or a scheduler's");
  CHECK_ARG(c->cache_id == 0 || layer < c->layers, "save_kv_layer: layer %u of %u", layer, c->layers);
  if (c->cfg.push && c->saved_step) { /* this step's pushes may send layer now */
    pthread_mutex_lock(&c->lock);
    c->saved_step[layer] = c->step;
    pthread_cond_broadcast(&c->saved); /* the pusher only */
    pthread_mutex_unlock(&c->lock);
  }
  return HIXL_KV_SUCCESS; /* pull mode: the consumer reads the blocks; nothing to send */
}

static hixl_kv_status kv_wait_save(hixl_kv_connector *c) {
  CHECK_ARG(c && c->role == HIXL_KV_ROLE_WORKER, "wait_for_save: connector is NULL or a scheduler's");
  return HIXL_KV_SUCCESS;
}

/* Cut the links of the peers in c->drop (taken under the lock): producers whose
 * expected pushes expired here, consumers that pinned a request whose lease expired
 * here. Over tcp and rdma nothing more of theirs lands, and no answer of ours reads
 * those blocks, once this returns; so the host may reuse the blocks get_finished and
 * get_block_ids_with_load_errors report. Called without the lock, before either reports. */
static void drop_peers(hixl_kv_connector *c, struct kv_idset *d) {
  const char *why = "a request between us expired here (a lease it pinned, or a push it accepted)";
  for (size_t i = 0; i < d->n; i++) {
    size_t n = 0;
    hixl_engine_drop_peer(c->eng, d->v[i], why, &n);
    if (n) fprintf(stderr, "hixl-kv: cut %zu link(s) with %s: %s\n", n, d->v[i], why);
  }
  idset_clear(d);
}

static hixl_kv_status kv_get_finished(hixl_kv_connector *c, const hixl_kv_ids *finished, hixl_kv_ids *sending,
                                      hixl_kv_ids *recving) {
  (void)finished;
  CHECK_ARG(c && sending && recving && c->role == HIXL_KV_ROLE_WORKER,
            "get_finished: connector or an output is NULL, or a scheduler's");
  pthread_mutex_lock(&c->lock);
  leases_expire(c);
  expects_expire(c);
  struct kv_idset drop = c->drop;
  memset(&c->drop, 0, sizeof(c->drop));
  hixl_kv_ids s = {0}, r = {0};
  int rc = idset_take(&c->sending_done, &s);
  if (rc == 0 && (rc = idset_take(&c->recving_done, &r)) < 0) {
    /* give the sending ids back: nothing is lost */
    for (size_t i = 0; i < s.count; i++) idset_add(&c->sending_done, s.ids[i]);
    kv_free_ids(&s);
  }
  if (rc == 0 && c->efd >= 0) { /* all taken: the fd is quiet until the next one finishes */
    uint64_t v;
    ssize_t n = read(c->efd, &v, sizeof(v)); /* EAGAIN when nothing was signalled */
    (void)n;
  }
  pthread_mutex_unlock(&c->lock);
  drop_peers(c, &drop);
  if (rc < 0) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "get_finished: out of memory");
  *sending = s;
  *recving = r;
  return HIXL_KV_SUCCESS;
}

static hixl_kv_status kv_load_errors(hixl_kv_connector *c, hixl_kv_blocks *out) {
  CHECK_ARG(c && out && c->role == HIXL_KV_ROLE_WORKER,
            "get_block_ids_with_load_errors: connector or output is NULL, or a scheduler's");
  pthread_mutex_lock(&c->lock);
  uint64_t *v = c->err_blocks;
  size_t n = c->nerr;
  c->err_blocks = NULL;
  c->nerr = c->caperr = 0;
  struct kv_idset drop = c->drop;
  memset(&c->drop, 0, sizeof(c->drop));
  pthread_mutex_unlock(&c->lock);
  drop_peers(c, &drop);
  out->ids = v;
  out->count = n;
  out->raw.data = (uint8_t *)v;
  out->raw.len = n * sizeof(*v);
  return HIXL_KV_SUCCESS;
}

static hixl_kv_status kv_get_handshake(hixl_kv_connector *c, hixl_kv_buffer *meta) {
  CHECK_ARG(c && meta && c->role == HIXL_KV_ROLE_WORKER,
            "get_handshake_metadata: connector or meta is NULL, or a "
            "scheduler's");
  char text[384];
  pthread_mutex_lock(&c->lock);
  int n =
      snprintf(text, sizeof(text), "{\"engine\":\"%s\",\"layout\":\"%s\"}", c->engine_addr, c->layout_text);
  pthread_mutex_unlock(&c->lock);
  uint8_t *p = malloc((size_t)n + 1);
  if (!p) return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "get_handshake_metadata: out of memory");
  memcpy(p, text, (size_t)n + 1);
  meta->data = p;
  meta->len = (size_t)n;
  return HIXL_KV_SUCCESS;
}

static hixl_kv_status kv_stats(hixl_kv_connector *c, hixl_kv_stats *out) {
  CHECK_ARG(c && out, "get_stats: connector or stats is NULL");
  pthread_mutex_lock(&c->lock);
  if (c->role == HIXL_KV_ROLE_WORKER) leases_expire(c);
  *out = c->stats;
  pthread_mutex_unlock(&c->lock);
  return HIXL_KV_SUCCESS;
}

static hixl_kv_status kv_event_fd(hixl_kv_connector *c, int32_t *fd) {
  CHECK_ARG(c && fd && c->role == HIXL_KV_ROLE_WORKER,
            "get_event_fd: connector or fd is NULL, or a scheduler's");
  pthread_mutex_lock(&c->lock);
  if (c->efd < 0) {
    c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->efd < 0) {
      int e = errno;
      pthread_mutex_unlock(&c->lock);
      return kv_fail(HIXL_KV_RESOURCE_EXHAUSTED, "get_event_fd: eventfd: %s", strerror(e));
    }
    if (c->sending_done.n || c->recving_done.n) efd_signal(c); /* finished before the fd existed */
  }
  *fd = c->efd;
  pthread_mutex_unlock(&c->lock);
  return HIXL_KV_SUCCESS;
}

/* ---- the table and the one exported symbol ---- */

static const hixl_kv_ops kv_ops_v1 = {
    .abi_version = HIXL_KV_ABI_VERSION,
    .size = sizeof(hixl_kv_ops),
    .create = kv_create,
    .destroy = kv_destroy,
    .shutdown = kv_shutdown,
    .last_error = kv_last_error,
    .free_buffer = kv_free_buffer,
    .free_ids = kv_free_ids,
    .get_num_new_matched_tokens = kv_matched,
    .update_state_after_alloc = kv_after_alloc,
    .build_connector_meta = kv_build_meta,
    .request_finished = kv_finished,
    .update_connector_output = kv_update_output,
    .set_handshake_metadata = kv_set_handshake,
    .register_kv_caches = kv_register,
    .alloc_kv_caches = kv_alloc_caches,
    .bind_connector_meta = kv_bind,
    .clear_connector_meta = kv_clear,
    .start_load_kv = kv_start_load,
    .wait_for_layer_load = kv_wait_layer,
    .save_kv_layer = kv_save_layer,
    .wait_for_save = kv_wait_save,
    .get_finished = kv_get_finished,
    .get_block_ids_with_load_errors = kv_load_errors,
    .get_handshake_metadata = kv_get_handshake,
    .get_stats = kv_stats,
    .get_push_params = kv_push_params,
    .get_event_fd = kv_event_fd,
};

KV_EXPORT hixl_kv_status hixl_kv_connector_entry(uint32_t abi_major, const hixl_kv_ops **ops, char *err,
                                                 size_t err_cap);

hixl_kv_status hixl_kv_connector_entry(uint32_t abi_major, const hixl_kv_ops **ops, char *err,
                                       size_t err_cap) {
  if (!ops) {
    if (err && err_cap) snprintf(err, err_cap, "hixl_kv_connector_entry: ops output is NULL");
    return HIXL_KV_PARAM_INVALID;
  }
  if (abi_major != HIXL_KV_ABI_MAJOR) {
    if (err && err_cap)
      snprintf(err, err_cap,
               "hixl_kv_connector_entry: this plugin serves ABI major version %u (minor %u), not %u",
               HIXL_KV_ABI_MAJOR, HIXL_KV_ABI_MINOR, abi_major);
    return HIXL_KV_UNSUPPORTED;
  }
  *ops = &kv_ops_v1;
  return HIXL_KV_SUCCESS;
}
