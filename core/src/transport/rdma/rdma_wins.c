/* rdma_wins: sorted vectors of RDMA windows (rdma_wins.h). No verbs: a target's
 * windows are bound and closed in rdma_win.c, an initiator's are only keys.
 *
 * An initiator's windows are what its target says, and a hostile target may say a
 * window at a time up to ERDMA_WINS_MAX of them: a frame costs what it holds (its
 * windows' searches, moves inside side, at most ERDMA_RWINS_SIDE each) and a share of
 * the rebuilds, never the whole vector for one window, all under the engine lock. */
#include <stdlib.h>
#include <string.h>

#include "transport/rdma/rdma_wins.h"
#include "util/memtab.h"

_Thread_local size_t erdma_rwins_steps;

size_t erdma_wins_at(const struct erdma_wins *w, uint64_t addr) {
  size_t lo = memtab_upper(w->v, w->n, sizeof(*w->v), addr);
  return lo == 0 ? w->n : lo - 1;
}

/* The window of v holding addr, or NULL. A hole holds nothing, nor does a window before
 * it: main's windows were disjoint when it was built, so each ends where the next
 * (a hole since, or not) starts at the latest. */
static struct erdma_win *vec_find(const struct erdma_wins *v, uint64_t addr) {
  size_t i = erdma_wins_at(v, addr);
  return i < v->n && addr - v->v[i].addr < v->v[i].len ? &v->v[i] : NULL;
}

size_t erdma_rwins_count(const struct erdma_rwins *w) { return w->main.n - w->holes + w->side.n; }

const struct erdma_win *erdma_rwins_find(const struct erdma_rwins *w, uint64_t addr) {
  const struct erdma_win *x = vec_find(&w->main, addr);
  return x ? x : vec_find(&w->side, addr);
}

uint32_t erdma_rwins_pieces(const struct erdma_rwins *w, uint64_t addr, uint64_t len) {
  uint64_t pos = addr, end = addr + len;
  uint32_t k = 0;
  while (pos < end) { /* a window never wraps (wire_decode): pos only grows */
    const struct erdma_win *x = erdma_rwins_find(w, pos);
    if (!x) return 0; /* a gap */
    pos = x->addr + x->len;
    k++;
  }
  return k;
}

bool erdma_rwins_cover(const struct erdma_rwins *w, uint64_t addr, uint64_t len) {
  return len > 0 && erdma_rwins_pieces(w, addr, len) > 0;
}

static int by_addr(const void *a, const void *b) {
  const struct erdma_win *x = a, *y = b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* Merge add (k, sorted) into v (n, sorted, room for n + k), from the back: what moves
 * is what lies after add's first window. */
static void merge_back(struct erdma_win *v, size_t n, const struct erdma_win *add, size_t k) {
  size_t i = n, j = k, o = n + k;
  while (j > 0) {
    if (i > 0 && v[i - 1].addr > add[j - 1].addr)
      v[--o] = v[--i];
    else
      v[--o] = add[--j];
    erdma_rwins_steps++;
  }
}

/* main again without its holes, in place. */
static void compact(struct erdma_rwins *w) {
  size_t k = 0;
  for (size_t i = 0; i < w->main.n; i++)
    if (w->main.v[i].len) w->main.v[k++] = w->main.v[i];
  erdma_rwins_steps += w->main.n;
  w->main.n = k;
  w->holes = w->waste = 0;
}

/* main rebuilt in out (room for all): its windows, side's and add's (k, sorted). */
static void rebuild(struct erdma_rwins *w, struct erdma_win *out, const struct erdma_win *add, size_t k) {
  const struct erdma_wins *m = &w->main, *s = &w->side;
  size_t i = 0, j = 0, o = 0;
  while (i < m->n || j < s->n) {
    if (i < m->n && m->v[i].len == 0)
      i++;
    else if (j == s->n || (i < m->n && m->v[i].addr < s->v[j].addr))
      out[o++] = m->v[i++];
    else
      out[o++] = s->v[j++];
  }
  erdma_rwins_steps += i + j;
  merge_back(out, o, add, k);
  free(w->main.v);
  w->main = (struct erdma_wins){out, o + k, o + k};
  w->side.n = 0;
  w->holes = w->waste = 0;
}

/* Drop the windows held that overlap [addr, end): holes in main, moved out of side. */
static void drop(struct erdma_rwins *w, uint64_t addr, uint64_t end) {
  struct erdma_wins *m = &w->main, *s = &w->side;
  size_t i = erdma_wins_at(m, addr);
  if (i == m->n)
    i = 0;
  else if (m->v[i].addr + m->v[i].len <= addr) /* ends before (a hole too) */
    i++;
  for (; i < m->n && m->v[i].addr < end; i++, erdma_rwins_steps++) {
    if (m->v[i].len) w->holes++;
    m->v[i].len = 0;
    w->waste++; /* a hole made, or one stepped over */
  }
  size_t lo = erdma_wins_at(s, addr);
  if (lo == s->n)
    lo = 0;
  else if (s->v[lo].addr + s->v[lo].len <= addr)
    lo++;
  size_t hi = memtab_upper(s->v, s->n, sizeof(*s->v), end - 1); /* the first starting at end or past */
  if (hi > lo) {
    memmove(s->v + lo, s->v + hi, (s->n - hi) * sizeof(*s->v));
    erdma_rwins_steps += s->n - hi;
    s->n -= hi - lo;
  }
}

int erdma_rwins_add(struct erdma_rwins *w, struct erdma_win *add, size_t n) {
  if (n == 0) return 0;
  qsort(add, n, sizeof(*add), by_addr);
  for (size_t i = 1; i < n; i++)
    if (add[i - 1].addr + add[i - 1].len > add[i].addr) return -2;
  /* Room first, so that nothing has changed on a failure. */
  struct erdma_win *out = NULL;
  bool merge = w->side.n + n > ERDMA_RWINS_SIDE;
  if (merge) {
    if (!(out = malloc((erdma_rwins_count(w) + n) * sizeof(*out)))) return -1;
  } else if (w->side.cap < w->side.n + n) {
    size_t cap = w->side.cap ? w->side.cap : 16;
    while (cap < w->side.n + n) cap *= 2;
    cap = cap < ERDMA_RWINS_SIDE ? cap : ERDMA_RWINS_SIDE;
    struct erdma_win *v = realloc(w->side.v, cap * sizeof(*v));
    if (!v) return -1;
    w->side.v = v;
    w->side.cap = cap;
  }
  for (size_t i = 0; i < n; i++) drop(w, add[i].addr, add[i].addr + add[i].len);
  if (merge) {
    rebuild(w, out, add, n);
    return 0;
  }
  merge_back(w->side.v, w->side.n, add, n);
  w->side.n += n;
  if (w->waste > w->main.n / 2) compact(w);
  return 0;
}

bool erdma_rwins_del(struct erdma_rwins *w, uint64_t addr, uint64_t len) {
  struct erdma_win *x = vec_find(&w->main, addr);
  if (x && x->addr == addr && x->len == len) {
    x->len = 0;
    w->holes++;
    if (++w->waste > w->main.n / 2) compact(w);
    return true;
  }
  struct erdma_wins *s = &w->side;
  size_t i = erdma_wins_at(s, addr);
  if (i == s->n || s->v[i].addr != addr || s->v[i].len != len) return false;
  memmove(s->v + i, s->v + i + 1, (s->n - i - 1) * sizeof(*s->v));
  erdma_rwins_steps += s->n - i - 1;
  s->n--;
  return true;
}

void erdma_rwins_free(struct erdma_rwins *w) {
  free(w->main.v);
  free(w->side.v);
  *w = (struct erdma_rwins){0};
}
