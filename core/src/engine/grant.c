/* grant: scoped memory, the ranges each peer may reach on a target (engine_ext.h,
 * docs/security.md). One set per peer name holding a grant (freed with its last
 * range), a sorted vector of disjoint ranges, each counted (granted twice, revoked twice). A batch is sorted
 * and merged in, O(n + m log m); a check is a binary search and a walk over the ranges it spans. Lock held
 * for all of it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_int.h"
#include "util/log.h"
#include "util/memtab.h"
#include "util/status_int.h"

struct grant_range {
  uint64_t addr, len;
  uint32_t refs;
  bool fresh;  /* grant_add: not granted before this batch (told to the modules) */
  bool shared; /* grant_add: granted before and again by this batch (told too) */
};

struct grant_set {
  struct grant_set *next;
  char name[WIRE_MAX_NAME + 1];
  struct grant_range *v;
  size_t n; /* ranges in v, which each grant rebuilds */
};

static int by_addr(const void *a, const void *b) {
  const struct grant_range *x = a, *y = b;
  if (x->addr != y->addr) return x->addr < y->addr ? -1 : 1;
  return x->len < y->len ? -1 : x->len > y->len;
}

struct grant_set *grant_set_of(struct HixlEngine *e, const char *peer, bool make) {
  for (struct grant_set *g = e->grants; g; g = g->next)
    if (strcmp(g->name, peer) == 0) return g;
  if (!make) return NULL;
  struct grant_set *g = calloc(1, sizeof(*g));
  if (!g) return NULL;
  snprintf(g->name, sizeof(g->name), "%s", peer);
  g->next = e->grants;
  e->grants = g;
  return g;
}

void grant_free_all(struct HixlEngine *e) {
  while (e->grants) {
    struct grant_set *g = e->grants;
    e->grants = g->next;
    free(g->v);
    free(g);
  }
}

/* Index of the last range starting at or before addr, or n when none does. */
static size_t last_at_or_before(const struct grant_set *g, uint64_t addr) {
  size_t lo = memtab_upper(g->v, g->n, sizeof(*g->v), addr);
  return lo == 0 ? g->n : lo - 1;
}

bool grant_covers(const struct grant_set *g, uint64_t addr, uint64_t len) {
  if (!g || g->n == 0 || len == 0 || addr > UINT64_MAX - len) return false;
  size_t i = last_at_or_before(g, addr);
  uint64_t pos = addr, end = addr + len;
  for (; i < g->n && g->v[i].addr <= pos && pos < g->v[i].addr + g->v[i].len; i++) {
    pos = g->v[i].addr + g->v[i].len; /* the next must start exactly here: ranges are disjoint */
    if (pos >= end) return true;
  }
  return false;
}

/* The modules hear of the ranges a grant added (marked fresh: XPORT_GRANTED) or granted
 * again (marked shared: XPORT_SHARED), or a revoke left with no count (!add:
 * XPORT_REVOKED), and the marks are cleared. Only a scoped engine's: an unscoped one's
 * peers reach every registration anyway. Each kind of one grant or revoke in one call,
 * sorted by address (the rdma module makes one window of each run of adjacent ranges,
 * and on a revoke reopens what a window held besides: it must see the whole of it at
 * once); in batches only when there is no memory for the list. */
static void tell_kind(struct HixlEngine *e, const char *peer, struct grant_range *v, size_t n,
                      enum xport_grant how) {
  uint64_t stack[256][2];
  size_t told = 0;
#define TOLD(r) (how == XPORT_GRANTED ? (r).fresh : how == XPORT_SHARED ? (r).shared : (r).refs == 0)
  for (size_t i = 0; i < n; i++) told += TOLD(v[i]);
  uint64_t(*batch)[2] = told > 256 ? malloc(told * sizeof(*batch)) : NULL;
  size_t cap = batch ? told : 256, k = 0;
  if (!batch) batch = stack;
  for (size_t i = 0; i <= n; i++) {
    if (k == cap || (i == n && k > 0)) {
      for (int m = 0; m < XPORT_MODS; m++)
        e->mods[m]->iface.grant(e, peer, (const uint64_t(*)[2])batch, k, how);
      k = 0;
    }
    if (i < n && TOLD(v[i])) batch[k][0] = v[i].addr, batch[k++][1] = v[i].len;
  }
#undef TOLD
  if (batch != stack) free(batch);
}

static void grant_tell(struct HixlEngine *e, const char *peer, struct grant_range *v, size_t n, bool add) {
  if (e->scoped) {
    if (add) tell_kind(e, peer, v, n, XPORT_SHARED); /* first: a window split before new ones open */
    tell_kind(e, peer, v, n, add ? XPORT_GRANTED : XPORT_REVOKED);
  }
  for (size_t i = 0; i < n; i++) v[i].fresh = v[i].shared = false;
}

HixlStatus grant_add(struct HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n) {
  struct grant_set *g = grant_set_of(e, peer, true);
  if (!g) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "hixl_engine_grant: out of memory");
  struct grant_range *add = malloc((n ? n : 1) * sizeof(*add));
  struct grant_range *out = malloc((g->n + n ? g->n + n : 1) * sizeof(*out));
  if (!add || !out) {
    free(add);
    free(out);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "hixl_engine_grant: out of memory");
  }
  bool sorted = true; /* a request's blocks usually come in order: no sort then */
  for (size_t i = 0; i < n; i++) {
    add[i] = (struct grant_range){ranges[i][0], ranges[i][1], 1, true, false};
    sorted = sorted && (i == 0 || by_addr(&add[i - 1], &add[i]) <= 0);
  }
  if (!sorted) qsort(add, n, sizeof(*add), by_addr);
  /* Merge the two sorted runs, counting identical ranges once. */
  size_t a = 0, b = 0, k = 0;
  while (a < g->n || b < n) {
    struct grant_range next = b == n || (a < g->n && by_addr(&g->v[a], &add[b]) <= 0) ? g->v[a++] : add[b++];
    if (k > 0 && out[k - 1].addr == next.addr && out[k - 1].len == next.len) {
      out[k - 1].refs += next.refs;
      out[k - 1].shared = out[k - 1].shared || out[k - 1].fresh != next.fresh; /* held, and granted again */
      out[k - 1].fresh = out[k - 1].fresh && next.fresh;
      continue;
    }
    if (k > 0 && out[k - 1].addr + out[k - 1].len > next.addr) {
      HixlStatus st =
          hixl_fail(HIXL_PARAM_INVALID,
                    "hixl_engine_grant: [0x%llx, +%llu) overlaps [0x%llx, +%llu) granted to %s: "
                    "grants are identical or disjoint",
                    (unsigned long long)next.addr, (unsigned long long)next.len,
                    (unsigned long long)out[k - 1].addr, (unsigned long long)out[k - 1].len, peer);
      free(add);
      free(out);
      return st;
    }
    out[k++] = next;
  }
  free(add);
  free(g->v);
  g->v = out;
  g->n = k;
  grant_tell(e, peer, g->v, g->n, true);
  return HIXL_SUCCESS;
}

/* The set g, now empty, goes: out of the engine's list and out of every link that
 * found it (a link looks its peer's set up again at its next op). */
static void set_free(struct HixlEngine *e, struct grant_set *g) {
  for (struct grant_set **pp = &e->grants; *pp; pp = &(*pp)->next)
    if (*pp == g) {
      *pp = g->next;
      break;
    }
  for (struct conn *c = e->conns; c; c = c->next)
    if (c->grants == g) c->grants = NULL;
  for (struct conn *c = e->graveyard; c; c = c->next)
    if (c->grants == g) c->grants = NULL;
  free(g->v);
  free(g);
}

size_t grant_peers(const struct HixlEngine *e) {
  size_t n = 0;
  for (const struct grant_set *g = e->grants; g; g = g->next) n++;
  return n;
}

HixlStatus grant_remove(struct HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n) {
  struct grant_set *g = grant_set_of(e, peer, false);
  size_t missing = 0;
  for (size_t i = 0; i < n; i++) {
    size_t j = g ? last_at_or_before(g, ranges[i][0]) : 0;
    if (g && j < g->n && g->v[j].addr == ranges[i][0] && g->v[j].len == ranges[i][1] && g->v[j].refs > 0)
      g->v[j].refs--;
    else
      missing++;
  }
  if (g) grant_tell(e, peer, g->v, g->n, false); /* the ranges no count holds any more */
  size_t k = 0;
  for (size_t i = 0; g && i < g->n; i++)
    if (g->v[i].refs > 0) g->v[k++] = g->v[i];
  if (g) g->n = k;
  if (g && k == 0) set_free(e, g); /* a peer that holds nothing leaves nothing behind */
  if (missing)
    return hixl_fail(HIXL_PARAM_INVALID, "hixl_engine_revoke: %zu of %zu ranges were not granted to %s",
                     missing, n, peer);
  return HIXL_SUCCESS;
}

size_t grant_count(const struct HixlEngine *e, const char *peer) {
  for (const struct grant_set *g = e->grants; g; g = g->next)
    if (strcmp(g->name, peer) == 0) return g->n;
  return 0;
}

bool link_grant_ok(struct conn *c, uint64_t addr, uint64_t len) {
  if (!c->eng->scoped) return true;
  if (!c->grants) c->grants = grant_set_of(c->eng, c->remote_name, false);
  return grant_covers(c->grants, addr, len);
}

bool link_granted(struct conn *c, uint64_t addr, uint64_t len, const char *what) {
  struct HixlEngine *e = c->eng;
  if (link_grant_ok(c, addr, len)) return true;
  e->grant_refusals++;
  log_warn("refused %s of [0x%llx, +%llu) from %s: not granted to it (scoped memory)", what,
           (unsigned long long)addr, (unsigned long long)len, c->remote_name);
  return false;
}
