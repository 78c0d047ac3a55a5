/* kv_grant: scoped memory for a worker's engine (docs/security.md). A worker's engine
 * is scoped: a peer reaches only the blocks of the requests it was granted, by the
 * name it authenticated with. In pull mode the producer grants the consumer that
 * PINs a request its blocks, until FREE or the lease ends; in push mode the consumer
 * grants the producer that ACCEPTs a request the blocks it expects, until the push
 * ends. A grant is each block's pieces in each plane: one per head, or one per plane
 * when its heads are adjacent (the ops built from them, kv_layout.c, join adjacent
 * heads too), so requests that share a block share identical, counted ranges. The
 * engine enforces grants where its CPU serves an op (tcp, staged ops); an rdma or
 * same-host peer is not scoped (the engine says so).
 *
 * Locks: a grant is made inside the KV service's handler (kv_serve, on the engine's
 * progress thread, the engine lock held: the engine lets its handler grant). A revoke
 * may come from paths that hold this connector's lock and not the engine's (a lease
 * that ends in get_finished); the engine's lock must never be taken under ours, so
 * revokes are queued under our lock and made by kv_revoke_flush without it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_ext.h"
#include "kv_int.h"
#include "util/log.h"

struct kv_revoke {
  char peer[KV_PEER_NAME_MAX + 1];
  uint64_t (*r)[2];
  size_t n;
};

/* The ranges of plane pl's block: one per head, or one when its heads are adjacent (or
 * it has none): the same bytes either way, but a PIN grants and a FREE revokes every
 * range on the producer's progress thread, which serves the reads meanwhile: with a
 * range per head, a PIN of a 1024-token request of 8 layers and 8 heads (4096 ranges)
 * held that thread ~0.6 ms, a FREE ~0.4 ms. */
static uint32_t plane_ranges(const struct kv_plane *pl, uint64_t *len) {
  uint32_t heads = pl->heads ? pl->heads : 1;
  bool adjacent = heads == 1 || pl->head_stride == pl->bytes / heads;
  *len = adjacent ? pl->bytes : pl->bytes / heads;
  return adjacent ? 1 : heads;
}

/* The pieces of a request's blocks (every group's, one list after another, gn[g] in
 * group g) in this worker's layout: *out (malloc'd), their count; 0 with *out NULL
 * when there are none (no layout yet) or no memory. A block's ranges are always cut
 * the same way, so requests that share a block share identical ranges. Lock held. */
static size_t request_ranges(const hixl_kv_connector *c, const uint64_t *blocks, const uint32_t *gn,
                             uint32_t ngroups, uint64_t (**out)[2]) {
  const struct kv_layout *l = &c->lay;
  size_t n = 0, off = 0;
  uint64_t len;
  *out = NULL;
  if (l->ng == 0 || ngroups != l->ng) return 0;
  for (uint32_t g = 0; g < l->ng; g++)
    for (uint32_t p = 0; p < l->g[g].nplanes; p++)
      n += (size_t)gn[g] * plane_ranges(&l->g[g].planes[p], &len);
  uint64_t(*r)[2] = n ? malloc(n * sizeof(*r)) : NULL;
  if (!r) return 0;
  size_t k = 0;
  for (uint32_t g = 0; g < l->ng; off += gn[g], g++)
    for (uint32_t p = 0; p < l->g[g].nplanes; p++) {
      const struct kv_plane *pl = &l->g[g].planes[p];
      uint32_t nr = plane_ranges(pl, &len);
      for (uint32_t j = 0; j < gn[g]; j++)
        for (uint32_t h = 0; h < nr; h++) {
          r[k][0] = pl->base + blocks[off + j] * pl->stride + h * pl->head_stride;
          r[k][1] = len;
          k++;
        }
    }
  *out = r;
  return k;
}

bool kv_grant(hixl_kv_connector *c, const char *peer, const uint64_t *blocks, const uint32_t *gn,
              uint32_t ngroups) {
  uint64_t(*r)[2];
  size_t n = request_ranges(c, blocks, gn, ngroups, &r);
  if (n == 0) return false;
  HixlStatus st = hixl_engine_grant(c->eng, peer, (const uint64_t(*)[2])r, n);
  if (st != HIXL_SUCCESS)
    log_error(
        "hixl-kv: cannot grant %s the blocks of a request (%zu ranges): %s; its transfers will be refused",
        peer, n, HixlGetLastErrorMessage());
  free(r);
  return st == HIXL_SUCCESS;
}

void kv_revoke_later(hixl_kv_connector *c, const char *peer, const uint64_t *blocks, const uint32_t *gn,
                     uint32_t ngroups) {
  struct kv_revoke v = {.n = 0};
  snprintf(v.peer, sizeof(v.peer), "%s", peer);
  v.n = request_ranges(c, blocks, gn, ngroups, &v.r);
  if (v.n == 0) {
    log_error("hixl-kv: out of memory queueing the revoke of %s's grant: it stays until the engine ends",
              peer);
    return;
  }
  if (c->nrevq == c->caprevq) {
    size_t cap = c->caprevq ? 2 * c->caprevq : 8;
    struct kv_revoke *q = realloc(c->revq, cap * sizeof(*q));
    if (!q) {
      free(v.r);
      log_error("hixl-kv: out of memory queueing the revoke of %s's grant: it stays until the engine ends",
                peer);
      return;
    }
    c->revq = q;
    c->caprevq = cap;
  }
  c->revq[c->nrevq++] = v;
}

void kv_revoke_flush(hixl_kv_connector *c) {
  pthread_mutex_lock(&c->lock);
  struct kv_revoke *q = c->revq;
  size_t n = c->nrevq;
  c->revq = NULL;
  c->nrevq = c->caprevq = 0;
  pthread_mutex_unlock(&c->lock);
  for (size_t i = 0; i < n; i++) {
    if (c->eng && hixl_engine_revoke(c->eng, q[i].peer, (const uint64_t(*)[2])q[i].r, q[i].n) != HIXL_SUCCESS)
      log_error("hixl-kv: revoking %s's grant: %s", q[i].peer, HixlGetLastErrorMessage());
    free(q[i].r);
  }
  free(q);
}

void kv_revq_free(hixl_kv_connector *c) {
  for (size_t i = 0; i < c->nrevq; i++) free(c->revq[i].r);
  free(c->revq);
  c->revq = NULL;
  c->nrevq = c->caprevq = 0;
}
