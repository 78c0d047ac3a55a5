/* xport: the interface between the link layer and what moves a link's data, in the
 * manner of libfabric's provider ops and UCX's UCT interface.
 *
 * A *transport* (tcp, shm, rdma) moves a link's direct chunks: ranges inside
 * registrations on both sides. The staging pool plugs into links through the same
 * table without being a transport (it has no connect and no post): it packs ops into
 * units that ride on the link's socket or, on rdma links, on its QP.
 *
 * The link layer (link.c: framing, handshake, notifications, the progress thread)
 * reaches a module only through this table: e->mods[id], or c->xp for the transport
 * a link uses. A module reaches the link layer only through the completion functions
 * and frame queues link.c exports in engine_int.h (link_chunk_end, link_conn_kill,
 * link_enqueue, link_queue_small, link_queue_copy, link_pay_single, link_pay_spans,
 * link_unpark, link_flush_some, link_rearm, link_resume, link_handshake_recv,
 * link_peer_add_mem). A module keeps its state per engine in e->xe[id] and per link
 * in c->xs[id]; nothing of it lies in struct conn or struct HixlEngine.
 *
 * Every hook is optional (NULL: nothing to do) unless it says otherwise, and runs
 * with the engine lock held unless it says otherwise. */
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
struct wire_msg;

/* Module ids, also the order Connect tries transports in (shm, then rdma, then tcp,
 * which always takes the link) and the order hooks run in. */
enum xport_id { XPORT_SHM, XPORT_RDMA, XPORT_TCP, XPORT_STAGE, XPORT_MODS };

/* flags */
#define XPORT_ONE_SIDED  0x1u  /* data moves without frames: the peer's table must be current first */
#define XPORT_STAGE_PACK 0x2u  /* small ops are worth packing into staged units on the socket */
#define XPORT_STAGE_RDMA 0x4u  /* staged units can travel by RDMA (STAGE_PULL / STAGE_PUSH) */
#define XPORT_CPU_COPY   0x8u  /* a thread's own copy moves the data (no NIC): its drive hook copies */
#define XPORT_IN_STREAM  0x10u /* direct chunks are frames on the link's socket, landed in order */

struct xport_ops {
  const char *name; /* "tcp", "rdma", "shm": hixl_link_info's transport */
  enum xport_id id;
  uint32_t flags;
  uint32_t stage_threshold; /* StagingThreshold "auto" on its links: ops shorter than this are packed */

  /* ---- engine ---- */
  /* Initialize: set up e->xe[id]; a transport this host cannot offer stays off
   * (logged) unless Transport asks for it, which fails Initialize with the reason. */
  HixlStatus (*open)(struct HixlEngine *e);
  void (*quiesce)(struct HixlEngine *e); /* Finalize, links ended: wait for work done without the lock */
  void (*close)(struct HixlEngine *e);   /* Finalize, after every registration was dropped */
  uint32_t (*caps)(const struct HixlEngine *e); /* WIRE_CAP_* it adds to HELLO / HELLO_ACK */
  int (*event_fd)(const struct HixlEngine *e);  /* a descriptor the progress thread watches, or -1 */
  void (*on_event)(struct HixlEngine *e);       /* ... it fired */
  bool (*progress)(struct HixlEngine *e);       /* progress thread, after each batch; true: work is left */

  /* ---- memory ---- */
  HixlStatus (*mem_reg)(struct HixlEngine *e, struct hixl_mem_reg *r); /* RegisterMem */
  void (*mem_dereg)(struct HixlEngine *e, struct hixl_mem_reg *r);
  uint32_t (*mem_key)(const struct hixl_mem_reg *r); /* advertised with the range; 0: none */
  /* HixlEngineAllocMem's memory (r->memfd) was registered: offer it to peers to map. */
  void (*mem_share)(struct HixlEngine *e, struct hixl_mem_reg *r);
  /* ... is about to be freed: every peer that mapped it lets go first (or is cut off
   * at deadline, CLOCK_MONOTONIC ns); may release the lock while it waits. */
  void (*mem_unshare)(struct HixlEngine *e, struct hixl_mem_reg *r, uint64_t deadline);

  /* hixl_engine_drop_peer, before the links with the engine called remote_name are
   * cut: make that peer let go of this engine's memory first (shm: unmap), waiting
   * with the lock released until deadline (CLOCK_MONOTONIC ns). */
  void (*peer_drop)(struct HixlEngine *e, const char *remote_name, uint64_t deadline);

  /* ---- links ---- */
  /* Initiator, in Connect after HELLO_ACK, on the blocking socket, lock NOT held.
   * Either take the link (*taken, *link its state or NULL), or pass it on to the next
   * transport (*taken false), or fail Connect. Required for a transport. */
  HixlStatus (*connect)(struct HixlEngine *e, int fd, uint64_t deadline, const char *remote, struct peer *p,
                        bool *taken, void **link);
  void (*attach)(struct conn *c, void *link); /* the link is made: c->xs[id] = link, and more */
  void (*discard)(void *link);                /* Connect failed after connect took the link */
  /* A target link received a frame of a type this module owns (frames[]). */
  void (*target_frame)(struct conn *c, const struct wire_msg *m);
  const uint8_t *frames; /* wire types it owns on target links, 0-terminated */
  /* An initiator link received a frame the target sent on its own (init_frames[]). */
  void (*initiator_frame)(struct conn *c, const struct wire_msg *m);
  const uint8_t *init_frames;           /* wire types it owns on initiator links, 0-terminated */
  void (*payload_done)(struct conn *c); /* a payload its target frame asked for arrived (or was dropped) */
  void (*kill)(struct conn *c, HixlStatus st, const char *why); /* the link dies: end what it holds */
  void (*closed)(struct conn *c); /* the dead link's socket was just shut: the peer can see its end */
  void (*free)(struct conn *c);   /* the dead link is freed: release c->xs[id] */
  HixlStatus (*info)(const struct conn *c, struct hixl_link_info *info); /* its fields of link_info */

  /* ---- data ---- */
  /* A one-sided transfer is about to start on c: true when the peer has withdrawn no
   * registration since the last call that said false (the link then skips reading
   * the frames waiting on its socket first). NULL: never known. */
  bool (*table_current)(struct conn *c);
  void (*post)(struct conn *c, struct chunk *ch); /* queue a direct chunk (required for a transport) */
  void (*start)(struct conn *c, struct hixl_transfer_req *r); /* its chunks are queued: begin */
  /* ... and nobody waits in a call. NULL: the progress thread takes the link (link_unpark). */
  void (*async)(struct conn *c, struct hixl_transfer_req *r);
  /* A sync caller waits for r (data only): move or watch it. NULL: the caller reads
   * the link's socket itself until r ends (link_drive). */
  void (*drive)(struct conn *c, struct hixl_transfer_req *r);
  bool (*req_timeout)(struct HixlEngine *e, struct hixl_transfer_req *r); /* true: a link was reset */
  /* An initiator answer to one of its chunks (ch->owner), after the link matched it;
   * true: handled (ended or resent), false: the link ends the chunk as usual. */
  bool (*answer)(struct conn *c, struct chunk *ch, const struct wire_msg *m);
  void (*chunk_end)(struct chunk *ch); /* one of its chunks ended, before the request counts it */

  /* ---- bounce: what the staging protocol above the transports asks of one ---- */
  /* Register a buffer of the engine's own (the pool, a target's bounce buffer) for
   * post_own. NULL when it cannot: err says why, or is "" when this engine has
   * nothing to register with (no device). */
  void *(*bounce_reg)(struct HixlEngine *e, void *addr, size_t len, char *err, size_t errlen);
  void (*bounce_dereg)(void *h);         /* NULL h: nothing */
  uint32_t (*bounce_key)(const void *h); /* the key a peer posts against it with */
  /* Post one signaled work request of c's own, moving len bytes between buf (inside
   * h) and the peer's raddr (rkey); done runs at its completion (ok false: the link
   * broke, status says why). 0, or an errno (the caller then kills the link). */
  int (*post_own)(struct conn *c, bool write, void *buf, uint32_t len, void *h, uint64_t raddr, uint32_t rkey,
                  void (*done)(struct conn *c, bool ok, const char *status));
};

#endif
