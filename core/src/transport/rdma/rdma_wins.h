/* rdma_wins: the RDMA transport's sorted vectors of memory windows, no verbs in them
 * (test_rdma_wins drives them without a device). A target's windows of a link are one
 * sorted vector (struct erdma_wins), rebuilt by its own grants; an initiator's are what
 * its target said (WIN_ADD, WIN_DEL), kept so that a frame costs what it holds, not
 * what the link holds (struct erdma_rwins). Lock: the engine's. */
#ifndef HIXL_RDMA_WINS_H
#define HIXL_RDMA_WINS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ibv_mr;
struct ibv_mw;

/* A window: on a target's link, bound on its QP (mw) over an MR: the registration's
 * where the device holds the key to the window, else one of its own (own_mr); on an
 * initiator's, what WIN_ADD said (mr and mw NULL). */
struct erdma_win {
  uint64_t addr, len;
  uint32_t rkey;
  struct ibv_mr *mr;
  struct ibv_mw *mw;
  bool own_mr;  /* mr is the window's: deregistered when it closes */
  bool closing; /* a target's, marked to close (rdma_win.c, wins_close_marked) */
};
/* Windows one initiator link takes from its target at most: past it, WIN_ADD ends the link. */
#define ERDMA_WINS_MAX (1u << 20)

struct erdma_wins { /* sorted by addr, disjoint */
  struct erdma_win *v;
  size_t n, cap;
};

/* Index of the last window starting at or before addr, or n when none does. */
size_t erdma_wins_at(const struct erdma_wins *w, uint64_t addr);

/* An initiator's windows. A WIN_ADD's go into side (a merge of two sorted runs), which
 * is merged into main when it would pass ERDMA_RWINS_SIDE; a WIN_DEL's leave a hole in
 * main (len 0, addr kept: what a lookup lands on there held nothing another window
 * holds) or are moved out of side; main is rebuilt without its holes once the holes,
 * and the holes a WIN_ADD stepped over, pass half of it. A frame of k windows thus
 * costs k log n, k * ERDMA_RWINS_SIDE moves at most, and a share of the rebuilds (n
 * for every ERDMA_RWINS_SIDE windows added, for every n / 2 holes made or stepped
 * over); one window's frame pays n only as that share, never each time. */
struct erdma_rwins {
  struct erdma_wins main; /* sorted by addr; a hole: len 0 */
  struct erdma_wins side; /* sorted by addr, disjoint from main's windows */
  size_t holes;           /* main's */
  size_t waste;           /* holes made and holes stepped over since main was rebuilt */
};
/* About the square root of ERDMA_WINS_MAX: a window's moves in side and its share of
 * the merges cost alike. */
#define ERDMA_RWINS_SIDE 1024u

/* Windows held. */
size_t erdma_rwins_count(const struct erdma_rwins *w);
/* The window holding addr, or NULL. */
const struct erdma_win *erdma_rwins_find(const struct erdma_rwins *w, uint64_t addr);
/* The work requests a chunk of [addr, addr + len) takes inside the windows: one per
 * window it spans; 0 when they do not cover it (closed since it was planned). */
uint32_t erdma_rwins_pieces(const struct erdma_rwins *w, uint64_t addr, uint64_t len);
/* Whether the windows cover [addr, addr + len) (adjacent ones together). */
bool erdma_rwins_cover(const struct erdma_rwins *w, uint64_t addr, uint64_t len);
/* Add n windows (sorted here), after dropping those held that one of them overlaps (an
 * initiator told of a split, WIRE_CAP_WIN_RUNS). 0; -1: out of memory, -2: two of add
 * overlap (w unchanged on either). */
int erdma_rwins_add(struct erdma_rwins *w, struct erdma_win *add, size_t n);
/* Forget the window that is exactly [addr, addr + len): false when there is none. */
bool erdma_rwins_del(struct erdma_rwins *w, uint64_t addr, uint64_t len);
void erdma_rwins_free(struct erdma_rwins *w);

/* Windows this thread's erdma_rwins calls copied or moved, and holes they stepped over:
 * for a test (not timed). */
extern _Thread_local size_t erdma_rwins_steps;

#endif
