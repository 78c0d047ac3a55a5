/* erdma: the RDMA transport's own records, shared by its files: xport_rdma.c (links,
 * posts, completions) and rdma_win.c (scoped memory: a peer's windows; their vectors
 * are rdma_wins.h's). Nothing outside transport/rdma includes this. Lock: the engine's,
 * for every field. */
#ifndef HIXL_ERDMA_H
#define HIXL_ERDMA_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/xport_link.h"
#include "transport/rdma/rdma.h"
#include "transport/rdma/rdma_wins.h"

#define ERDMA_DEVS (HIXL_RAILS_MAX + 1) /* the engine's own, and one per other rail address */

/* Completions taken off a device's CQ by a thread waiting for its own (a window's
 * bind), kept in order for the progress thread. */
struct erdma_stash {
  struct rdma_wc *v;
  size_t head, n, cap;
};

struct erdma_link;
struct erdma_engine {              /* engine_xe(e, XPORT_RDMA), while the engine has a device */
  struct rdma_dev dev[ERDMA_DEVS]; /* [0]: the engine's address (or RdmaDevice); then rail addresses' */
  uint32_t ip[ERDMA_DEVS];         /* the IPv4 address each was opened for, network order */
  int n;
  int epfd;                        /* event_fd: every device's completion channel and async events */
  _Atomic bool down[ERDMA_DEVS];   /* its port went down (async event), until it is active again */
  _Atomic bool cq_err[ERDMA_DEVS]; /* its CQ overran (IBV_EVENT_CQ_ERR): no QP on it again */
  struct erdma_link *links;        /* those with a QP, for completions and timeouts */
  struct erdma_stash stash[ERDMA_DEVS];
  bool win_refusal_logged;    /* a range got no window: said once */
  bool dmabuf_refusal_logged; /* device memory got no MR (GPUDirect): said once at info */
  bool peermem_logged;        /* ... got one by address (a peer-memory client): said once */
};

/* epoll data: a device's index, plus this for its async event fd */
#define ERDMA_EV_ASYNC 0x100u

/* wr_ids that are never a chunk's or a link's address: a window's bind, a tag (a
 * WRITE with immediate data behind a transfer's WRITEs), a target's receive for one. */
#define ERDMA_WR_BIND 1u
#define ERDMA_WR_TAG  2u
#define ERDMA_WR_RECV 3u

/* An initiator link's tag to post once the chunk it follows is posted (after NULL:
 * now); in the order of their requests, as the chunks are. */
struct erdma_tag {
  struct chunk *after;
  uint32_t tag;
};
#define ERDMA_TAGS 64 /* tags waiting on a link at most: past it, a call waits for its data's completions */

/* A range's memory regions (r->xm[XPORT_RDMA], a bounce buffer's handle): one per device. */
struct erdma_mr {
  struct ibv_mr *mr[ERDMA_DEVS];
  bool dmabuf;           /* over device memory's dma-buf (GPUDirect): db.fd open until freed, */
  struct rdma_dmabuf db; /* for the windows' own MRs over parts of it (rdma_win.c) */
};

struct erdma_link {                      /* link_xs(c, XPORT_RDMA) (initiator: posts; target: holds the QP) */
  struct ibv_qp *qp;                     /* NULL once the link died */
  int dev;                               /* its device: the engine's dev[dev] */
  struct conn *conn;                     /* while in the engine's list (qp set) */
  struct erdma_link *prev, *next;        /* ... that list */
  struct chunk *rq_head, *rq_tail;       /* waiting for a send-queue slot */
  struct chunk *rpend_head, *rpend_tail; /* posted, in completion order */
  uint32_t sq_used;                      /* WRs posted and not yet completed */
  uint32_t unsignaled;                   /* WRs posted since the last signaled one */
  bool tail_unsig;                       /* the last chunk posted went unsignaled: nothing ends it yet */
  void (*own_done)(struct conn *c, bool ok, const char *status); /* a target's own WR */
  struct erdma_wins wins; /* target: scoped memory, the windows bound on this link's QP */
  /* A target's windows split since (a range in them shared by a later grant): still
   * open, all their ranges still granted, no longer the peer's; unsorted, may overlap. */
  struct erdma_wins retired;
  struct erdma_rwins rwins;          /* initiator: the windows its target told it of */
  uint64_t win_ops;                  /* initiator: chunks posted inside windows */
  struct erdma_tag tags[ERDMA_TAGS]; /* initiator: tags not yet posted, a ring */
  uint32_t tag_head, tag_n;
};

/* ---- rdma_win.c ---- */

/* xport_ops.iface.grant: open, split or close windows over ranges on peer's links. */
void erdma_win_grant(struct HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n,
                     enum xport_grant how);
/* xport_ops.link.initiator_frame: WIN_ADD / WIN_DEL. */
void erdma_win_frame(struct conn *c, const struct wire_msg *m);
/* Registration [addr, addr + len) is withdrawn: every window inside it closes (the
 * range's own MR pins its pages: left open, a window would outlive the memory). */
void erdma_wins_dereg(struct HixlEngine *e, uint64_t addr, uint64_t len);
/* The link dies (its QP goes after this) or is freed: its windows go. */
void erdma_wins_free(struct HixlEngine *e, struct erdma_link *l);
/* Completions kept by a waiting thread: handed to the progress thread's handler. */
void erdma_stash_drain(struct HixlEngine *e, int dev,
                       void (*handle)(struct HixlEngine *e, int dev, const struct rdma_wc *w));

/* Devices this process probed for whether they hold a window's key to the window (an
 * answer is kept per device for the process: mw_bounds_ask). */
uint32_t erdma_mw_probes(void);

#endif
