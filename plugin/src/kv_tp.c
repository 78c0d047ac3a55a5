/* kv_tp: tensor parallelism across the hand-off. A producer instance of P ranks and a
 * consumer instance of D ranks, one dividing the other: which producer ranks each
 * consumer rank reads (pull) or is written by (push), and which heads of each block.
 * Both sides compute it from the same numbers (the two world sizes and each group's
 * kind and KV head count, which the compatibility digest makes equal), so neither
 * tells the other.
 *
 * Heads: of K KV heads, rank r of T holds [r * K / T, (r + 1) * K / T) when T <= K,
 * else the one head r / (T / K), which T / K ranks hold (vLLM's rule). A consumer rank
 * reads each of its heads once, from the producer rank that holds it; of several that
 * do (P > K), from the one its rank picks (d modulo the replicas), so the replicas'
 * reads spread. An MLA group (every rank the same latent): consumer rank d reads the
 * whole block from producer rank d mod P. Equal world sizes: rank r reads rank r's
 * blocks whole, in any layout.
 *
 * Frees (pull): a producer rank frees a request once every consumer rank that reads it
 * freed it; one that no consumer rank reads (an MLA producer rank past D, a head
 * replica no rank picked) is freed by consumer rank p mod D. docs/plugin.md, "Tensor
 * parallelism", draws it. */
#include <stdio.h>

#include "kv_int.h"

/* The first of the heads rank r of world holds, and how many. */
static void rank_heads(uint32_t k, uint32_t world, uint32_t r, uint32_t *first, uint32_t *n) {
  if (world <= k) {
    *n = k / world;
    *first = r * *n;
  } else {
    *n = 1;
    *first = r / (world / k);
  }
}

static bool tp_fits(uint32_t k, uint32_t t) { return t <= k ? k % t == 0 : t % k == 0; }

bool kv_tp_check(const struct kv_layout *l, uint32_t p, uint32_t d, char *why, size_t cap) {
  if (p == d) return true;
  if (p % d && d % p) {
    snprintf(why, cap, "tensor-parallel sizes %u (producer) and %u (consumer): neither divides the other", p,
             d);
    return false;
  }
  if (p > KV_TP_MAX || d > KV_TP_MAX) {
    snprintf(why, cap, "tensor-parallel sizes %u and %u: at most %u", p, d, KV_TP_MAX);
    return false;
  }
  for (uint32_t gi = 0; gi < l->ng; gi++) {
    const struct kv_group *g = &l->g[gi];
    if (g->kind == HIXL_KV_GROUP_MLA) continue;
    if (g->kheads == 0) {
      snprintf(
          why, cap,
          "tensor-parallel sizes %u (producer) and %u (consumer) differ, and group %u's planes have no head "
          "dimension (num_heads 0): a rank's heads cannot be cut from its blocks; register a head-major "
          "layout (HND-like: packed, LBHNC, LHBNC, BLHNC, BHLNC) with num_heads set",
          p, d, gi);
      return false;
    }
    if (!tp_fits(g->kheads, p) || !tp_fits(g->kheads, d)) {
      snprintf(why, cap, "group %u's %u KV heads do not divide over tensor-parallel sizes %u and %u", gi,
               g->kheads, p, d);
      return false;
    }
  }
  return true;
}

bool kv_tp_slice(const struct kv_group *g, uint32_t np, uint32_t p, uint32_t nd, uint32_t d,
                 struct kv_tp_slice *s) {
  *s = (struct kv_tp_slice){0};
  if (np == nd || g->kind == HIXL_KV_GROUP_MLA) {
    if (p != (np == nd ? d : d % np)) return false;
    s->whole = true;
    return true;
  }
  uint32_t k = g->kheads, pf, pn, df, dn;
  if (!k || !tp_fits(k, np) || !tp_fits(k, nd)) return false; /* kv_tp_check refuses the pair */
  rank_heads(k, np, p, &pf, &pn);
  rank_heads(k, nd, d, &df, &dn);
  uint32_t lo = pf > df ? pf : df, hi = pf + pn < df + dn ? pf + pn : df + dn;
  if (lo >= hi) return false;
  if (np > k && p != pf * (np / k) + d % (np / k)) return false; /* another replica serves d */
  s->src = lo - pf;
  s->dst = lo - df;
  s->n = hi - lo;
  return true;
}

bool kv_tp_reads(const struct kv_layout *l, uint32_t np, uint32_t p, uint32_t nd, uint32_t d) {
  struct kv_tp_slice s;
  for (uint32_t g = 0; g < l->ng; g++)
    if (kv_tp_slice(&l->g[g], np, p, nd, d, &s)) return true;
  return false;
}

uint64_t kv_tp_touchers(const struct kv_layout *l, uint32_t np, uint32_t p, uint32_t nd) {
  uint64_t m = 0;
  for (uint32_t d = 0; d < nd; d++)
    if (kv_tp_reads(l, np, p, nd, d)) m |= UINT64_C(1) << d;
  return m ? m : UINT64_C(1) << (p % nd);
}

uint64_t kv_tp_sources(const struct kv_layout *l, uint32_t np, uint32_t nd, uint32_t d) {
  uint64_t m = 0;
  for (uint32_t p = 0; p < np; p++)
    if (kv_tp_reads(l, np, p, nd, d)) m |= UINT64_C(1) << p;
  return m;
}

uint64_t kv_tp_frees(const struct kv_layout *l, uint32_t np, uint32_t nd, uint32_t d) {
  uint64_t m = 0;
  for (uint32_t p = 0; p < np; p++)
    if (kv_tp_touchers(l, np, p, nd) >> d & 1) m |= UINT64_C(1) << p;
  return m;
}

uint32_t kv_tp_heads(const struct kv_group *g, uint32_t world) {
  uint32_t first, n;
  if (g->kheads == 0) return 0;
  rank_heads(g->kheads, world, 0, &first, &n);
  return n;
}
