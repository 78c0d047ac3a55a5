/* kv_grant: scoped memory for a worker's engine (docs/security.md). A worker's engine
 * is scoped: a peer reaches only the blocks of the requests it was granted, by the
 * name it authenticated with. In pull mode the producer grants the consumer that
 * PINs a request its blocks, until FREE or the lease ends; in push mode the consumer
 * grants the producer that ACCEPTs a request the blocks it expects, until the push
 * ends. A grant is each block's pieces in each plane: one per head, or one per plane
 * when its heads are adjacent (the ops built from them, kv_layout.c, join adjacent
 * heads too), and pieces adjacent in address order one range (a run of blocks); the
 * engine counts each byte by the grants holding it, so requests that share blocks, or
 * part of a run, each hold them until their own revoke. The engine enforces grants
 * where its CPU serves an op (tcp, staged ops) and over RDMA through memory windows
 * over the granted runs on the peer's QP; a same-host peer is not scoped
 * (the engine says so), its device memory included (hixl_engine_set_devmap_scoped off:
 * the KV caches go to it whole by IPC handle).
 *
 * Locks: a grant is made inside the KV service's handler (kv_serve, on the engine's
 * progress thread, the engine lock held: the engine lets its handler grant). A revoke
 * may come from paths that hold this connector's lock and not the engine's (a lease
 * that ends in get_finished); the engine's lock must never be taken under ours, so
 * revokes are queued under our lock and made by kv_revoke_flush without it. A revoke
 * is allocated with its grant: queueing it cannot fail, so a peer never keeps blocks
 * the host reuses for want of memory at the revoke. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_ext.h"
#include "kv_int.h"
#include "util/log.h"

/* A grant's revoke: the peer and the ranges granted, made with the grant. */
struct kv_revoke {
  struct kv_revoke *next; /* in c->revq, once queued */
  char peer[KV_PEER_NAME_MAX + 1];
  size_t n;
  uint64_t r[][2];
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

/* How many pieces a request's blocks (gn[g] in group g) have in this worker's layout:
 * 0 when there is none yet. Lock held. */
static size_t request_count(const hixl_kv_connector *c, const uint32_t *gn, uint32_t ngroups) {
  const struct kv_layout *l = &c->lay;
  size_t n = 0;
  uint64_t len;
  if (l->ng == 0 || ngroups != l->ng) return 0;
  for (uint32_t g = 0; g < l->ng; g++)
    for (uint32_t p = 0; p < l->g[g].nplanes; p++)
      n += (size_t)gn[g] * plane_ranges(&l->g[g].planes[p], &len);
  return n;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The pieces of a request's blocks (every group's, one list after another, gn[g] in
 * group g) into r, request_count of them. They come in address
 * order (planes by base, each plane's blocks ascending) unless planes interleave (a
 * block-major layout) or heads lie apart by more than a block: the engine merges a
 * sorted batch into the peer's ranges as it is and sorts any other first, which for a
 * request of 64 blocks in 64 planes cost 1.4 M instructions of the PIN's 2.7 M
 * (issue 47). Out of memory for the sorted block ids: the request's order. Lock held. */
static void request_ranges(const hixl_kv_connector *c, const uint64_t *blocks, const uint32_t *gn,
                           uint64_t (*r)[2]) {
  const struct kv_layout *l = &c->lay;
  size_t total = 0, off[KV_MAX_GROUPS];
  for (uint32_t g = 0; g < l->ng; g++) off[g] = total, total += gn[g];
  uint64_t *sorted = malloc((total ? total : 1) * sizeof(*sorted));
  if (sorted) {
    memcpy(sorted, blocks, total * sizeof(*sorted));
    for (uint32_t g = 0; g < l->ng; g++) qsort(sorted + off[g], gn[g], sizeof(*sorted), cmp_u64);
    blocks = sorted;
  }
  size_t k = 0;
  uint64_t len;
  for (uint32_t i = 0; i < l->nplanes; i++) {
    uint32_t g = l->by_base[i].group;
    const struct kv_plane *pl = &l->g[g].planes[l->by_base[i].plane];
    uint32_t nr = plane_ranges(pl, &len);
    for (uint32_t j = 0; j < gn[g]; j++)
      for (uint32_t h = 0; h < nr; h++) {
        r[k][0] = pl->base + blocks[off[g] + j] * pl->stride + h * pl->head_stride;
        r[k][1] = len;
        k++;
      }
  }
  free(sorted);
}

/* r[0..n) with each range that starts where the one before it ends joined to it: a run of
 * blocks adjacent in a plane is one range (the engine's grants may overlap: a request sharing
 * part of a run with another counts the shared part twice). Returns how many are left. A
 * PIN of a 4096-token request granted 16,384 ranges, one per block and plane, in ~0.6 ms
 * on the producer's progress thread; in runs of 8 blocks, 2,048 (issue 47). */
static size_t runs(uint64_t (*r)[2], size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (k > 0 && r[k - 1][0] + r[k - 1][1] == r[i][0])
      r[k - 1][1] += r[i][1];
    else
      r[k][0] = r[i][0], r[k++][1] = r[i][1];
  }
  return k;
}

struct kv_revoke *kv_grant(hixl_kv_connector *c, const char *peer, const uint64_t *blocks, const uint32_t *gn,
                           uint32_t ngroups) {
  size_t n = request_count(c, gn, ngroups);
  if (n == 0) return NULL;
  /* The revoke first: a grant is made only when its revoke cannot fail. */
  struct kv_revoke *v = KV_ALLOC(KV_TEST_GRANT, malloc(sizeof(*v) + n * sizeof(v->r[0])));
  if (!v) {
    log_error("hixl-kv: out of memory granting %s the blocks of a request (%zu ranges); its transfers will "
              "be refused",
              peer, n);
    return NULL;
  }
  v->next = NULL;
  snprintf(v->peer, sizeof(v->peer), "%s", peer);
  request_ranges(c, blocks, gn, v->r);
  v->n = runs(v->r, n);
  if (hixl_engine_grant(c->eng, peer, (const uint64_t(*)[2])v->r, v->n) != HIXL_SUCCESS) {
    log_error(
        "hixl-kv: cannot grant %s the blocks of a request (%zu ranges): %s; its transfers will be refused",
        peer, v->n, HixlGetLastErrorMessage());
    free(v);
    return NULL;
  }
  return v;
}

void kv_revoke_later(hixl_kv_connector *c, struct kv_revoke *v) {
  v->next = c->revq;
  c->revq = v;
}

void kv_revoke_free(struct kv_revoke *v) { free(v); }

void kv_revoke_flush(hixl_kv_connector *c) {
  pthread_mutex_lock(&c->lock);
  struct kv_revoke *q = c->revq;
  c->revq = NULL;
  if (q) c->revoking++;
  pthread_mutex_unlock(&c->lock);
  if (!q) return;
  while (q) {
    struct kv_revoke *v = q;
    q = v->next;
    if (c->eng && hixl_engine_revoke(c->eng, v->peer, (const uint64_t(*)[2])v->r, v->n) != HIXL_SUCCESS)
      log_error("hixl-kv: revoking %s's grant: %s", v->peer, HixlGetLastErrorMessage());
    free(v);
  }
  pthread_mutex_lock(&c->lock);
  if (--c->revoking == 0) pthread_cond_broadcast(&c->revoked);
  pthread_mutex_unlock(&c->lock);
}

void kv_revoke_settle(hixl_kv_connector *c) {
  kv_revoke_flush(c);
  pthread_mutex_lock(&c->lock);
  while (c->revoking) pthread_cond_wait(&c->revoked, &c->lock);
  pthread_mutex_unlock(&c->lock);
}

void kv_revq_free(hixl_kv_connector *c) {
  while (c->revq) {
    struct kv_revoke *v = c->revq;
    c->revq = v->next;
    free(v);
  }
}
