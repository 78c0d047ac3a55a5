/* xport: the interface between the link layer and what moves a link's data, in the
 * manner of UCX's UCT (memory domain, interface and endpoint operations) and
 * libfabric's providers (ops tables with every slot filled).
 *
 * A *transport* (tcp, shm, rdma) moves a link's direct chunks: ranges inside
 * registrations on both sides. The staging pool plugs into links through the same
 * table without being a transport (it has no connect and no post): it packs ops into
 * units that ride on the link's socket or, where a transport moves them itself
 * (bounce_reg and post_own: rdma), on its QP.
 *
 * The link layer (link.c: framing, handshake, notifications, the progress thread)
 * reaches a module only through its table: e->mods[id], or c->xp for the transport a
 * link uses. A transport reaches the engine only through engine/xport_link.h (records,
 * accessors, the link layer's calls) and keeps its state in its own slots: per engine
 * (engine_xe), per link (link_xs), per registration (r->xm[id]).
 *
 * Every slot of every table is filled: a module with nothing to do there names one of
 * the xport_no_* stubs below, which answer as "nothing here" does (SUCCESS with
 * nothing done, false, -1, 0, a link passed on, UNSUPPORTED for a chunk posted to a
 * module that moves none). xport_check verifies it when an engine opens its modules.
 * Every hook runs with the engine lock held unless it says otherwise. */
#ifndef HIXL_XPORT_H
#define HIXL_XPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hixl/hixl_engine.h"

struct HixlEngine;
struct conn;
struct chunk;
struct peer;
struct hixl_mem_reg;
struct hixl_transfer_req;
struct hixl_link_info;
struct remote_mem;
struct wire_msg;

/* Module ids, also the order Connect tries transports in (shm, then rdma, then tcp,
 * which always takes the link) and the order hooks run in. */
enum xport_id { XPORT_SHM, XPORT_RDMA, XPORT_TCP, XPORT_STAGE, XPORT_MODS };

/* flags */
#define XPORT_ONE_SIDED  0x1u  /* data moves without frames: the peer's table must be current first */
#define XPORT_STAGE_PACK 0x2u  /* small ops are worth packing into staged units on the socket */
#define XPORT_STAGE_RDMA 0x4u  /* staged units can travel by its own posts (bounce_reg, post_own) */
#define XPORT_CPU_COPY   0x8u  /* a thread's own copy moves the data (no NIC): its drive hook copies */
#define XPORT_IN_STREAM  0x10u /* direct chunks are frames on the link's socket, landed in order */
#define XPORT_DEVMEM     0x20u /* moves device memory (through host bounce buffers and devmem.h) */
#define XPORT_TAGS       0x40u /* its links carry tags behind their data (post_tag, link_tag_landed): CALL_TAG */

/* The module on one engine (UCT's interface). */
/* What a grant did to the ranges it tells a module of (iface.grant). */
enum xport_grant { XPORT_REVOKED, XPORT_GRANTED, XPORT_SHARED };

struct xport_iface_ops {
  /* Initialize: set up engine_xe(e, id); a transport this host cannot offer stays off
   * (logged) unless Transport asks for it, which fails Initialize with the reason. */
  HixlStatus (*open)(struct HixlEngine *e);
  void (*quiesce)(struct HixlEngine *e); /* Finalize, links ended: wait for work done without the lock */
  void (*close)(struct HixlEngine *e);   /* Finalize, after every registration was dropped */
  uint32_t (*caps)(const struct HixlEngine *e); /* WIRE_CAP_* it adds to HELLO / HELLO_ACK */
  int (*event_fd)(const struct HixlEngine *e);  /* a descriptor the progress thread watches, or -1 */
  void (*on_event)(struct HixlEngine *e);       /* ... it fired */
  bool (*progress)(struct HixlEngine *e);       /* progress thread, after each batch; true: work is left */
  /* A scoped engine granted peer ranges it did not hold (XPORT_GRANTED), granted again
   * ranges it held (XPORT_SHARED: another count, e.g. a block two requests share), or
   * revoked the last count of ranges (XPORT_REVOKED): the module opens or closes what
   * reaches them without the engine's CPU (rdma: memory windows on that peer's QPs).
   * ranges: sorted by address, disjoint, all of one kind of one grant or revoke
   * (grant.c, grant_tell). */
  void (*grant)(struct HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n,
                enum xport_grant how);
};

/* Memory (UCT's memory domain). */
struct xport_mem_ops {
  HixlStatus (*reg)(struct HixlEngine *e, struct hixl_mem_reg *r); /* RegisterMem */
  void (*dereg)(struct HixlEngine *e, struct hixl_mem_reg *r);
  /* Advertised with the range on link c (a target's link: its memory entries); 0: none.
   * Per link: with rails, each rail's device has a key of its own (rdma). */
  uint32_t (*key)(const struct conn *c, const struct hixl_mem_reg *r);
  /* HixlEngineAllocMem's memory (r->memfd) was registered: offer it to peers to map. */
  void (*share)(struct HixlEngine *e, struct hixl_mem_reg *r);
  /* ... is about to be freed: every peer that mapped it lets go first (or is cut off
   * at deadline, CLOCK_MONOTONIC ns); may release the lock while it waits. */
  void (*unshare)(struct HixlEngine *e, struct hixl_mem_reg *r, uint64_t deadline);
  /* hixl_engine_drop_peer, before the links with the engine called remote_name are
   * cut: make that peer let go of this engine's memory first (shm: unmap), waiting
   * with the lock released until deadline (CLOCK_MONOTONIC ns). */
  void (*peer_drop)(struct HixlEngine *e, const char *remote_name, uint64_t deadline);
  /* For the staging protocol: register a buffer of the engine's own (the pool, a
   * target's bounce buffer) for post_own. NULL when it cannot: err says why, or is ""
   * when this engine has nothing to register with (no device). */
  void *(*bounce_reg)(struct HixlEngine *e, void *addr, size_t len, char *err, size_t errlen);
  void (*bounce_dereg)(void *h);                               /* NULL h: nothing */
  uint32_t (*bounce_key)(const struct conn *c, const void *h); /* the key c's peer posts against it with */
};

/* Links (UCT's endpoints). */
struct xport_link_ops {
  /* Initiator, in Connect after HELLO_ACK, on the blocking socket, lock NOT held.
   * Either take the link (*taken, *link its state or NULL), or pass it on to the next
   * transport (*taken false), or fail Connect. */
  HixlStatus (*connect)(struct HixlEngine *e, int fd, uint64_t deadline, const char *remote, struct peer *p,
                        bool *taken, void **link);
  void (*attach)(struct conn *c, void *link); /* the link is made: its state and link_use */
  void (*discard)(void *link);                /* Connect failed after connect took the link */
  /* A target link received a frame of a type this module owns (frames[]). */
  void (*target_frame)(struct conn *c, const struct wire_msg *m);
  /* An initiator link received a frame the target sent on its own (init_frames[]). */
  void (*initiator_frame)(struct conn *c, const struct wire_msg *m);
  void (*payload_done)(struct conn *c); /* a payload its target frame asked for arrived (or was dropped) */
  void (*kill)(struct conn *c, HixlStatus st, const char *why); /* the link dies: end what it holds */
  void (*closed)(struct conn *c); /* the dead link's socket was just shut: the peer can see its end */
  void (*free)(struct conn *c);   /* the dead link is freed: release its state */
  HixlStatus (*info)(const struct conn *c, struct hixl_link_info *info); /* its fields of link_info */

  /* A one-sided transfer is about to start on c: true when the peer has withdrawn no
   * registration since the last call that said false (the link then skips reading
   * the frames waiting on its socket first). false: not known. */
  bool (*table_current)(struct conn *c);
  /* Whether the link moves [raddr, raddr + len) of the peer's registration rm directly
   * (rdma: with the registration's key, or inside windows the peer opened to it);
   * false: the op goes as tcp frames on the link's socket, where the peer's CPU checks it. */
  bool (*reach)(const struct conn *c, const struct remote_mem *rm, uint64_t raddr, uint64_t len);
  void (*post)(struct conn *c, struct chunk *ch);             /* queue a direct chunk */
  void (*start)(struct conn *c, struct hixl_transfer_req *r); /* its chunks are queued: begin */
  void (*async)(struct conn *c, struct hixl_transfer_req *r); /* ... and nobody waits in a call */
  /* A sync caller waits for r (data only): move it, watch it, or read the link's
   * socket until it ends (link_drive_socket). c may be gone afterwards. */
  void (*drive)(struct conn *c, struct hixl_transfer_req *r);
  bool (*req_timeout)(struct HixlEngine *e, struct hixl_transfer_req *r); /* true: a link was reset */
  /* An initiator answer to one of its chunks (ch->owner), after the link matched it;
   * true: handled (ended or resent), false: the link ends the chunk as usual. */
  bool (*answer)(struct conn *c, struct chunk *ch, const struct wire_msg *m);
  void (*chunk_end)(struct chunk *ch); /* one of its chunks ended, before the request counts it */
  /* Post one signaled work request of c's own, moving len bytes between buf (inside
   * h, from bounce_reg) and the peer's raddr (rkey); done runs at its completion (ok
   * false: the link broke, status says why). 0, or -1 with errno set (the caller
   * then kills the link). */
  int (*post_own)(struct conn *c, bool write, void *buf, uint32_t len, void *h, uint64_t raddr, uint32_t rkey,
                  void (*done)(struct conn *c, bool ok, const char *status));
  /* Whether the link moves an op touching device memory (lreg here, or the peer's rm)
   * directly, by its own copies (shm: the peer's range is mapped here, device memory
   * by IPC handle); false: it goes as tcp frames on the link's socket. Transports with
   * XPORT_DEVMEM are not asked. */
  bool (*dev_reach)(struct conn *c, const struct hixl_mem_reg *lreg, const struct remote_mem *rm,
                    uint64_t raddr, uint64_t len);
  /* A sync call's ops, planned (each direct, in one piece, host memory at lregs[i]) and
   * nothing posted: copy them now in the calling thread, with no request, where the
   * transport can (shm: all inside one live mapping of the peer's memory). true: done,
   * the result in *st and, when it failed, why; c may be gone. false: nothing was
   * done, the request path moves them. Lock held (released during the copy). */
  bool (*copy_now)(struct conn *c, HixlTransferOp op, const HixlTransferOpDesc *descs, size_t n,
                   struct hixl_mem_reg *const *lregs, HixlStatus *st, char *why, size_t cap);
  /* Initiator: the peer advertised [addr, addr + len) on c (MEM_ADD), now in its table
   * (shm: a freed range's tombstone there goes; the memory is new). Lock held. */
  void (*mem_added)(struct conn *c, uint64_t addr, uint64_t len);
  /* Initiator: r's chunks are all direct ones on c, queued by start: post behind them a
   * notice carrying tag, which the peer's module hands to link_tag_landed once every
   * one of them has landed there (rdma: a WRITE with immediate data on the link's QP).
   * 0: it will be posted (a failure to post kills the link); -1: it cannot be here (the
   * caller sends its call once the chunks' answers are back instead). Lock held. */
  int (*post_tag)(struct conn *c, struct hixl_transfer_req *r, uint32_t tag);
};

struct xport_ops {
  const char *name; /* "tcp", "rdma", "shm", "stage": hixl_link_info's transport */
  enum xport_id id;
  uint32_t flags;
  uint32_t stage_threshold;   /* StagingThreshold "auto" on its links: ops shorter than this are packed */
  const uint8_t *frames;      /* wire types it owns on target links, 0-terminated, or NULL */
  const uint8_t *init_frames; /* wire types it owns on initiator links, 0-terminated, or NULL */
  struct xport_iface_ops iface;
  struct xport_mem_ops mem;
  struct xport_link_ops link;
};

/* Every slot, for xport_check and its test (which also checks the list is whole).
 * Kept as written: clang-format re-wraps this list differently on every run. */
/* clang-format off */
#define XPORT_SLOTS(X)                                                                                       \
  X(iface.open) X(iface.quiesce) X(iface.close) X(iface.caps) X(iface.event_fd) X(iface.on_event)             \
  X(iface.progress) X(iface.grant)                                                                           \
  X(mem.reg) X(mem.dereg) X(mem.key) X(mem.share) X(mem.unshare) X(mem.peer_drop) X(mem.bounce_reg)          \
  X(mem.bounce_dereg) X(mem.bounce_key)                                                                      \
  X(link.connect) X(link.attach) X(link.discard) X(link.target_frame) X(link.initiator_frame)                \
  X(link.payload_done) X(link.kill) X(link.closed) X(link.free) X(link.info) X(link.table_current)           \
  X(link.reach) X(link.post) X(link.start) X(link.async) X(link.drive) X(link.req_timeout) X(link.answer)    \
  X(link.chunk_end) X(link.post_own) X(link.dev_reach) X(link.copy_now) X(link.mem_added)                   \
  X(link.post_tag)
/* clang-format on */

/* PARAM_INVALID naming the module and the first empty slot, or SUCCESS. */
HixlStatus xport_check(const struct xport_ops *x);

/* Stubs for a module with nothing to do in a slot. */
HixlStatus xport_no_open(struct HixlEngine *e);     /* SUCCESS: nothing opened */
void xport_no_engine(struct HixlEngine *e);         /* quiesce, close, on_event */
uint32_t xport_no_caps(const struct HixlEngine *e); /* 0 */
int xport_no_event_fd(const struct HixlEngine *e);  /* -1 */
bool xport_no_progress(struct HixlEngine *e);       /* false: no work left */
void xport_no_grant(struct HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n,
                    enum xport_grant how);
HixlStatus xport_no_reg(struct HixlEngine *e, struct hixl_mem_reg *r);     /* SUCCESS: nothing to register */
void xport_no_mem(struct HixlEngine *e, struct hixl_mem_reg *r);           /* dereg, share */
uint32_t xport_no_key(const struct conn *c, const struct hixl_mem_reg *r); /* 0 */
void xport_no_unshare(struct HixlEngine *e, struct hixl_mem_reg *r, uint64_t deadline);
void xport_no_peer_drop(struct HixlEngine *e, const char *remote_name, uint64_t deadline);
void *xport_no_bounce_reg(struct HixlEngine *e, void *addr, size_t len, char *err,
                          size_t errlen); /* NULL, "" */
void xport_no_bounce_dereg(void *h);
uint32_t xport_no_bounce_key(const struct conn *c, const void *h); /* 0 */
HixlStatus xport_no_connect(struct HixlEngine *e, int fd, uint64_t deadline, const char *remote,
                            struct peer *p, bool *taken, void **link); /* passes the link on */
void xport_no_attach(struct conn *c, void *link);
void xport_no_discard(void *link);
void xport_no_frame(struct conn *c, const struct wire_msg *m); /* never called: it owns no frames */
void xport_no_link(struct conn *c);                            /* payload_done, closed, free */
void xport_no_kill(struct conn *c, HixlStatus st, const char *why);
HixlStatus xport_no_info(const struct conn *c, struct hixl_link_info *info); /* SUCCESS, nothing added */
bool xport_no_table_current(struct conn *c);                                 /* false: not known */
bool xport_reach_all(const struct conn *c, const struct remote_mem *rm, uint64_t raddr,
                     uint64_t len);                                           /* true */
void xport_no_post(struct conn *c, struct chunk *ch);                         /* ends the chunk UNSUPPORTED */
void xport_no_req(struct conn *c, struct hixl_transfer_req *r);               /* start */
bool xport_no_req_timeout(struct HixlEngine *e, struct hixl_transfer_req *r); /* false */
bool xport_no_answer(struct conn *c, struct chunk *ch, const struct wire_msg *m); /* false */
void xport_no_chunk_end(struct chunk *ch);
int xport_no_post_own(struct conn *c, bool write, void *buf, uint32_t len, void *h, uint64_t raddr,
                      uint32_t rkey,
                      void (*done)(struct conn *c, bool ok, const char *status)); /* -1, ENOSYS */
bool xport_no_dev_reach(struct conn *c, const struct hixl_mem_reg *lreg, const struct remote_mem *rm,
                        uint64_t raddr, uint64_t len); /* false: device ops go as tcp frames */
bool xport_no_copy_now(struct conn *c, HixlTransferOp op, const HixlTransferOpDesc *descs, size_t n,
                       struct hixl_mem_reg *const *lregs, HixlStatus *st, char *why, size_t cap); /* false */
void xport_no_mem_added(struct conn *c, uint64_t addr, uint64_t len);
int xport_no_post_tag(struct conn *c, struct hixl_transfer_req *r, uint32_t tag); /* -1: no tags here */
/* The memory slots of a module that registers nothing (tcp: its frames carry the
 * data; staging: it asks the link's transport). */
#define XPORT_MEM_NONE                                                                                       \
  {                                                                                                          \
    .reg = xport_no_reg, .dereg = xport_no_mem, .key = xport_no_key, .share = xport_no_mem,                  \
    .unshare = xport_no_unshare, .peer_drop = xport_no_peer_drop, .bounce_reg = xport_no_bounce_reg,         \
    .bounce_dereg = xport_no_bounce_dereg, .bounce_key = xport_no_bounce_key                                 \
  }
/* The link layer's defaults: async hands reading to the progress thread (link_unpark);
 * drive reads the link's socket in the calling thread until r ends. */
void link_async_unpark(struct conn *c, struct hixl_transfer_req *r);
void link_drive_socket(struct conn *c, struct hixl_transfer_req *r);

#endif
