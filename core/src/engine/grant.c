/* grant: scoped memory, the ranges each peer may reach on a target (engine_ext.h,
 * docs/security.md). One set per peer name holding a grant (freed with its last range):
 * a sorted vector of disjoint pieces, each with how many grants hold it. A grant may name
 * any ranges, overlapping each other or what is held (a run of blocks one request shares in
 * part with another): each of its ranges cuts the pieces where it starts and ends and counts
 * every piece it spans once more; pieces are never joined again, so a revoke of a range
 * granted before finds a piece starting and one ending where it does, counts them down in
 * place, and needs no memory. A grant is one merge of the set's boundaries with the batch's,
 * O(n + m log m); a revoke a binary search per range and one compaction; a check a binary
 * search and a walk over the pieces it spans. Lock held for all of it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_int.h"
#include "util/log.h"
#include "util/memtab.h"
#include "util/sock.h"
#include "util/status_int.h"

struct grant_range {
  uint64_t addr, len; /* first: memtab_upper reads addr at a record's start */
  uint32_t refs;
};

struct grant_set {
  struct grant_set *next;
  char name[WIRE_MAX_NAME + 1];
  struct grant_range *v;
  size_t n; /* pieces in v, which each grant rebuilds */
};

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
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

/* Index of the last piece starting at or before addr, or n when none does. */
static size_t last_at_or_before(const struct grant_set *g, uint64_t addr) {
  size_t lo = memtab_upper(g->v, g->n, sizeof(*g->v), addr);
  return lo == 0 ? g->n : lo - 1;
}

bool grant_covers(const struct grant_set *g, uint64_t addr, uint64_t len) {
  if (!g || g->n == 0 || len == 0 || addr > UINT64_MAX - len) return false;
  size_t i = last_at_or_before(g, addr);
  uint64_t pos = addr, end = addr + len;
  for (; i < g->n && g->v[i].addr <= pos && pos < g->v[i].addr + g->v[i].len; i++) {
    pos = g->v[i].addr + g->v[i].len; /* the next must start exactly here: pieces are disjoint */
    if (pos >= end) return true;
  }
  return false;
}

/* The modules hear of what a grant added (held by no grant before: XPORT_GRANTED) or
 * counted again (held: XPORT_SHARED), or what a revoke left with no count
 * (XPORT_REVOKED): each kind of one grant or revoke in one call, sorted by address (the
 * rdma module makes one window of each run of adjacent ranges, and on a revoke reopens
 * what a window held besides: it must see the whole of it at once). Only a scoped
 * engine's: an unscoped one's peers reach every registration anyway. */
static void tell(struct HixlEngine *e, const char *peer, const uint64_t (*v)[2], size_t n,
                 enum xport_grant how) {
  if (!e->scoped || n == 0) return;
  for (int m = 0; m < XPORT_MODS; m++) e->mods[m]->iface.grant(e, peer, v, n, how);
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

HixlStatus grant_add(struct HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n) {
  struct grant_set *g = grant_set_of(e, peer, true);
  if (!g) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "hixl_engine_grant: out of memory");
  /* One sweep in address order over three sorted streams of boundaries: the set's pieces,
   * the batch's starts and its ends (each sorted here unless in order already, as a
   * request's runs come). Between two boundaries in a row lies a piece of the new set,
   * held by the set's count there plus the batch's ranges over it. */
  size_t cap = 2 * g->n + 2 * n + 1; /* pieces between boundaries, at most one fewer than these */
  uint64_t *starts = malloc((2 * n + 1) * sizeof(*starts));
  struct grant_range *out = malloc(cap * sizeof(*out));
  uint64_t(*told)[2] =
      e->scoped ? malloc(cap * sizeof(*told)) : NULL; /* GRANTED at the front, SHARED at the back */
  HixlStatus st = HIXL_SUCCESS;
  if (!starts || !out || (e->scoped && !told)) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "hixl_engine_grant: out of memory");
    goto done;
  }
  uint64_t *ends = starts + n;
  bool s_sorted = true, e_sorted = true;
  for (size_t i = 0; i < n; i++) {
    starts[i] = ranges[i][0], ends[i] = ranges[i][0] + ranges[i][1];
    s_sorted = s_sorted && (i == 0 || starts[i - 1] <= starts[i]);
    e_sorted = e_sorted && (i == 0 || ends[i - 1] <= ends[i]);
  }
  if (!s_sorted) qsort(starts, n, sizeof(*starts), cmp_u64);
  if (!e_sorted) qsort(ends, n, sizeof(*ends), cmp_u64);
  const struct grant_range *v = g->v;
  size_t i = 0, is = 0, ie = 0, k = 0, ngr = 0, nsh = 0;
  uint32_t cover = 0;
  uint64_t x = g->n ? v[0].addr : UINT64_MAX; /* the first boundary of all */
  if (n && starts[0] < x) x = starts[0];
  for (;;) {
    if (cover == 0 && (i == g->n || v[i].addr >= x)) {
      /* No range of the batch over x: the set's pieces before its next start go over whole. */
      uint64_t nx = is < n ? starts[is] : UINT64_MAX;
      size_t j = i;
      while (j < g->n && v[j].addr + v[j].len <= nx) j++;
      if (j > i) memcpy(out + k, v + i, (j - i) * sizeof(*out)); /* v is NULL in a new set */
      k += j - i;
      i = j;
      x = j < g->n && v[j].addr < nx ? v[j].addr : nx;
      if (x == UINT64_MAX) break;
    }
    while (is < n && starts[is] == x) cover++, is++;
    while (ie < n && ends[ie] == x) cover--, ie++;
    while (i < g->n && v[i].addr + v[i].len <= x) i++;
    bool in = i < g->n && v[i].addr <= x, more = false;
    uint64_t y = 0; /* the next boundary (a range may end at 2^64 - 1) */
#define NEXT(b)                                                                                              \
  do {                                                                                                       \
    uint64_t b_ = (b);                                                                                       \
    if (!more || b_ < y) y = b_;                                                                             \
    more = true;                                                                                             \
  } while (0)
    if (i < g->n) NEXT(in ? v[i].addr + v[i].len : v[i].addr);
    if (is < n) NEXT(starts[is]);
    if (ie < n) NEXT(ends[ie]);
#undef NEXT
    if (!more) break;
    uint32_t held = in ? v[i].refs : 0;
    if (held || cover) out[k++] = (struct grant_range){x, y - x, held + cover};
    if (cover && told) {
      size_t t = held ? cap - ++nsh : ngr++;
      told[t][0] = x, told[t][1] = y - x;
    }
    x = y;
  }
  free(g->v);
  g->v = out;
  g->n = k;
  out = NULL;
  if (told) {
    /* SHARED first: a window split before new ones open. The back of told holds them last first. */
    for (size_t a = cap - nsh, b = cap - 1; nsh > 1 && a < b; a++, b--) {
      uint64_t t0 = told[a][0], t1 = told[a][1];
      told[a][0] = told[b][0], told[a][1] = told[b][1];
      told[b][0] = t0, told[b][1] = t1;
    }
    tell(e, peer, (const uint64_t(*)[2])(told + cap - nsh), nsh, XPORT_SHARED);
    tell(e, peer, (const uint64_t(*)[2])told, ngr, XPORT_GRANTED);
  }
done:
  free(starts);
  free(out);
  free(told);
  if (g->n == 0) set_free(e, g); /* made for this grant, which failed or named nothing */
  return st;
}

size_t grant_peers(const struct HixlEngine *e) {
  size_t n = 0;
  for (const struct grant_set *g = e->grants; g; g = g->next) n++;
  return n;
}

/* Whether [addr, +len) starts and ends at piece boundaries with every piece between held
 * (as a range granted and not yet revoked does): the index of its first piece, or n. */
static size_t granted_span(const struct grant_set *g, uint64_t addr, uint64_t len) {
  size_t i = last_at_or_before(g, addr);
  if (i == g->n || g->v[i].addr != addr) return g->n;
  uint64_t pos = addr, end = addr + len;
  for (size_t k = i; k < g->n && g->v[k].addr == pos && g->v[k].refs > 0; k++) {
    pos += g->v[k].len;
    if (pos == end) return i;
    if (pos > end) break;
  }
  return g->n;
}

HixlStatus grant_remove(struct HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n) {
  struct grant_set *g = grant_set_of(e, peer, false);
  size_t missing = 0, zeroed = 0;
  for (size_t i = 0; i < n; i++) {
    size_t k = g ? granted_span(g, ranges[i][0], ranges[i][1]) : 0;
    if (!g || k == g->n) {
      missing++;
      continue;
    }
    for (uint64_t end = ranges[i][0] + ranges[i][1]; k < g->n && g->v[k].addr < end; k++)
      zeroed += --g->v[k].refs == 0;
  }
  if (zeroed && e->scoped) { /* nothing to tell or take out when every piece is still held */
    /* The pieces left with no count, told while they are still in g (in batches only
     * when there is no memory for the list). */
    uint64_t stack[256][2], (*v)[2] = NULL;
    size_t zero = 0, cap, m = 0;
    for (size_t i = 0; i < g->n; i++) zero += g->v[i].refs == 0;
    if (zero > 256) v = malloc(zero * sizeof(*v));
    cap = v ? zero : 256;
    if (!v) v = stack;
    for (size_t i = 0; i <= g->n; i++) {
      if (m == cap || (i == g->n && m > 0)) {
        tell(e, peer, (const uint64_t(*)[2])v, m, XPORT_REVOKED);
        m = 0;
      }
      if (i < g->n && g->v[i].refs == 0) v[m][0] = g->v[i].addr, v[m++][1] = g->v[i].len;
    }
    if (v != stack) free(v);
  }
  if (zeroed) { /* then out */
    size_t k = 0;
    for (size_t i = 0; i < g->n; i++)
      if (g->v[i].refs > 0) g->v[k++] = g->v[i];
    g->n = k;
    if (k == 0) set_free(e, g); /* a peer that holds nothing leaves nothing behind */
  }
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

bool link_refused_say(struct conn *c, unsigned long long *more) {
  struct HixlEngine *e = c->eng;
  uint64_t now = hixl_now_ns();
  if (e->op_logged != 0 && now - e->op_logged < 1000000000ull) {
    e->op_refusals++;
    return false;
  }
  *more = (unsigned long long)e->op_refusals;
  e->op_refusals = 0;
  e->op_logged = now;
  return true;
}

bool link_granted(struct conn *c, uint64_t addr, uint64_t len, const char *what) {
  struct HixlEngine *e = c->eng;
  unsigned long long more;
  if (link_grant_ok(c, addr, len)) return true;
  e->grant_refusals++;
  if (link_refused_say(c, &more))
    log_warn("refused %s of [0x%llx, +%llu) from %s: not granted to it (scoped memory; %llu more ops "
             "refused since the last such line)",
             what, (unsigned long long)addr, (unsigned long long)len, c->remote_name, more);
  return false;
}
