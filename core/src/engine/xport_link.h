/* xport_link: all a transport sees of the engine and its link layer, in the manner of
 * UCT's view of UCP: the records it works on (a registration, a peer's advertised
 * range, a chunk to move and its frame), and functions for everything else. struct
 * conn, struct HixlEngine, struct peer and struct hixl_transfer_req stay opaque here:
 * a transport reads them through the accessors below and never walks their lists
 * itself. A transport's own state lives in its per-engine (engine_xe) and per-link
 * (link_xs) slots. Lock: as xport.h says for each hook; every function here expects
 * the engine lock held unless it says otherwise. */
#ifndef HIXL_XPORT_LINK_H
#define HIXL_XPORT_LINK_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine_ext.h"
#include "engine/options.h"
#include "engine/xport.h"
#include "hixl/hixl_engine.h"
#include "util/memtab.h"
#include "wire/wire.h"

struct hixl_mem_reg {
  struct memtab_entry range; /* first: the memtab holds pointers to it */
  HixlMemType type;
  int device;                 /* HIXL_MEM_DEVICE: its device's ordinal (devmem.h) */
  uint32_t inflight;          /* chunks in flight that touch the range, either role */
  char tag[WIRE_MAX_TAG + 1]; /* advertised with the range; "" when untagged */
  void *xm[XPORT_MODS];       /* each module's state for the range (rdma: the MR), or NULL */
  int memfd;                  /* HixlEngineAllocMem's memory: its memfd (-1: the caller's memory) */
  size_t map_len;             /* ... and the length of its mapping */
  bool sealed;                /* ... sealed against shrinking and growing: peers may map it */
  bool freeing;               /* ... FreeMem or a device DeregisterMem waits: a second one is refused */
  uintptr_t token;            /* its HixlMemHandle (util/handles.h: never an address, never reused) */
};

/* A peer's registration as it advertised it. */
struct remote_mem {
  struct memtab_entry range; /* first: the peer's memtab holds pointers to it */
  /* RDMA remote key on the link that told it (each rail's link reaches a device of its
   * own, with keys of its own: each rail has its own table), 0 without RDMA */
  uint32_t rkey;
  uint8_t kind; /* WIRE_MEM_HOST or WIRE_MEM_DEVICE: the peer's device memory, which only its CPU moves */
  char tag[WIRE_MAX_TAG + 1];
};

/* One frame to send: a small inline header, or a heap frame, then an optional
 * payload taken straight from registered memory. */
struct txitem {
  struct txitem *next;
  uint8_t hdr[WIRE_SMALL_FRAME];
  uint32_t hdr_len;
  uint8_t *heap; /* owned; freed once sent */
  size_t heap_len;
  /* On an authenticated link: the frame's tag (over hdr and heap), made as it first
   * goes out, in the order frames go out (tag_len WIRE_TAG_LEN once made); then it
   * cannot be dropped unsent any more (the peer counts frames). */
  uint8_t tag[WIRE_TAG_LEN];
  uint8_t tag_len;
  bool sealed;
  uint8_t ptag[WIRE_TAG_LEN]; /* AuthPayloadTag: the payload's tag, sent after it */
  uint8_t ptag_len;
  const uint8_t *payload;
  size_t payload_len;
  const struct stage_seg *gather; /* instead of payload: laddr ranges sent in order */
  uint32_t ngather;
  /* A target's STAGE_READ answer: an owned payload, or its ranges gathered in place
   * (own_block: the gather list, then the registrations held until sent). */
  uint8_t *own_payload;
  void *own_block;
  struct hixl_mem_reg **own_regs;
  uint32_t n_own_regs;
  size_t queued;            /* bytes counted in the link's answers_queued (heap frame and payload) */
  bool owed;                /* counted in the link's answers_items: an answer a target owes */
  size_t sent;              /* bytes of hdr, heap, tag and payload sent so far */
  struct chunk *chunk;      /* initiator: awaits a response once sent */
  struct hixl_mem_reg *reg; /* target READ_RESP: inflight released once sent */
  bool unready;             /* a device copy still fills it: the queue stops here until it is done */
  bool pool_payload;        /* own_payload is a buffer of the engine's device pool */
};

enum chunk_kind { CHUNK_WRITE, CHUNK_READ, CHUNK_NOTIFY, CHUNK_SYNC, CHUNK_SWRITE, CHUNK_SREAD, CHUNK_CALL };

/* One staged op, or a piece of one: local and remote ranges of the same length. */
struct stage_seg {
  uint64_t laddr, raddr;
  uint32_t len;
};
/* One request frame an initiator sends and the response it waits for. */
struct stage_unit;

struct chunk {
  struct txitem tx;
  struct chunk *next_pending;
  struct hixl_transfer_req *req;
  struct hixl_mem_reg *lreg; /* NULL for notify */
  uint8_t *laddr;
  uint64_t raddr;
  uint32_t rkey; /* RDMA: the remote registration's key; 0: inside windows (scoped memory) */
  uint32_t nwr;  /* RDMA: the work requests it was posted as */
  uint32_t len;
  uint64_t seq;
  enum chunk_kind kind;
  struct stage_unit *unit;       /* a staged unit's (CHUNK_SWRITE / CHUNK_SREAD) state: stage.c's */
  uint32_t *call_len;            /* CHUNK_CALL: where the answer's length goes (laddr, len: its buffer) */
  const struct xport_ops *owner; /* the module told of its answer and its end (staged units) */
  uint8_t *bounce;               /* a READ into device memory: its answer lands here first (a pool buffer) */
  struct devjob *dj;             /* its device copy while one is queued or running (engine_int.h) */
  bool landing;                  /* its READ answer is being received into bounce */
  uint8_t answer;                /* the answer's wire type, when not the kind's usual one */
  bool dev;                      /* a direct op's on device memory (here or at the peer): counted */
};

/* ---- the engine ---- */
const struct hixl_options *engine_opts(const struct HixlEngine *e);
const char *engine_name(const struct HixlEngine *e); /* "ip:port" */
const struct sockaddr_in *engine_addr(const struct HixlEngine *e);
void *engine_xe(const struct HixlEngine *e, enum xport_id id); /* a module's engine state */
void engine_set_xe(struct HixlEngine *e, enum xport_id id, void *state);
/* The registration holding [addr, addr + len), or NULL. */
struct hixl_mem_reg *engine_reg_find(const struct HixlEngine *e, uint64_t addr, uint64_t len);
size_t engine_reg_count(const struct HixlEngine *e);
struct hixl_mem_reg *engine_reg_at(const struct HixlEngine *e, size_t i); /* in address order */
/* Wait on the engine's condition (a request ended, a module signalled), the lock
 * released meanwhile; deadline 0: no deadline (CLOCK_MONOTONIC ns). */
void engine_wait(struct HixlEngine *e, uint64_t deadline);
/* engine_wait's, with pthread_cond_(timed)wait's result (ETIMEDOUT). */
int engine_cond_wait(struct HixlEngine *e, uint64_t deadline);
void engine_signal(struct HixlEngine *e); /* wake every engine_wait */
/* Lock e as a caller of the API does: the progress thread lets it in (HixlEngine's lock_wanted). */
void engine_lock_caller(struct HixlEngine *e);
void engine_unlock(struct HixlEngine *e); /* around a long copy or a blocking call */
void engine_lock(struct HixlEngine *e);

/* ---- links ---- */
struct HixlEngine *link_engine(const struct conn *c);
const char *link_remote(const struct conn *c); /* the peer's name, "" while handshaking */
bool link_is_target(const struct conn *c);
bool link_dead(const struct conn *c); /* killed (link_alive also looks at the socket) */
bool link_alive(struct conn *c);
void *link_xs(const struct conn *c, enum xport_id id); /* a module's link state */
void link_set_xs(struct conn *c, enum xport_id id, void *state);
void link_use(struct conn *c, const struct xport_ops *xp); /* its data moves by xp from now on */
const struct xport_ops *link_transport(const struct conn *c);
uint32_t link_peer_caps(const struct conn *c);  /* initiator: WIRE_CAP_* of its HELLO_ACK; 0 else */
uint32_t link_hello_caps(const struct conn *c); /* target: WIRE_CAP_* of the peer's HELLO; 0 else */
bool engine_scoped(const struct HixlEngine *e); /* hixl_engine_set_scoped */
/* Whether same-host device handovers follow grants (hixl_engine_set_devmap_scoped). */
bool engine_devmap_scoped(const struct HixlEngine *e);
/* Target: a revoke asked c's peer to let go of something it reaches without this
 * engine's CPU (shm: a device mapping), and the peer has (or c died). The revoke
 * returns once c has none outstanding. Lock held. */
void link_recall_begin(struct conn *c);
void link_recall_end(struct conn *c);
struct hixl_window_stats *engine_win_stats(struct HixlEngine *e); /* counted by the module that opens them */
struct hixl_devmem_stats *engine_dev_stats(struct HixlEngine *e); /* counted by the module that copies */
/* The device this engine's side uses: that of the first device memory it registered (0
 * before any). Callable without the lock. */
int engine_local_device(const struct HixlEngine *e);
/* The IPv4 address (network order) of c's end of its socket: which local interface,
 * and so which rail's device, the link leaves by; 0 when the kernel cannot say. */
uint32_t link_local_ip(const struct conn *c);
/* Initiator: forget the peer's advertised range [addr, addr + len) (it was withdrawn). */
void link_peer_forget(struct conn *c, uint64_t addr, uint64_t len);
/* Initiator: the peer's advertised registration holding [addr, addr + len), or NULL;
 * during Connect from its struct peer, afterwards from the link (each rail's link has
 * its own table; the peer's is that of its control link). */
const struct remote_mem *peer_remote_find(const struct peer *p, uint64_t addr, uint64_t len);
const struct remote_mem *link_remote_find(const struct conn *c, uint64_t addr, uint64_t len);
/* Target: whether c's peer may reach all of [addr, addr + len) (always, unless the
 * engine is scoped); nothing counted or logged. */
bool link_grant_covers(struct conn *c, uint64_t addr, uint64_t len);
/* Initiator: the target sends frames on its own: never park the link. */
void link_read_always(struct conn *c);

/* ---- frames and payloads ---- */
void link_conn_kill(struct conn *c, HixlStatus st, const char *why);
void link_flush(struct conn *c);
bool link_unsent(const struct conn *c); /* frames are queued, not yet sent */
/* Send at most budget bytes now; what is left goes on from the progress thread
 * (EPOLLOUT) or a driving caller. Submitting threads use LINK_CALLER_SEND. */
void link_flush_some(struct conn *c, size_t budget);
#define LINK_CALLER_SEND (256u << 10)
void link_enqueue(struct conn *c, struct txitem *it);
/* Queue a frame of at most WIRE_SMALL_FRAME bytes (then an optional payload whose
 * registration, if any, is released once sent); -1 when memory runs out. */
int link_queue_small(struct conn *c, const uint8_t *frame, size_t len, const uint8_t *payload,
                     size_t payload_len, struct hixl_mem_reg *reg);
/* Queue a copy of a built frame; out of memory kills the link. */
void link_queue_copy(struct conn *c, const uint8_t *frame, size_t len);
void link_pay_single(struct conn *c, uint8_t *dst, size_t len); /* a payload for dst (NULL: drop it) */
void link_pay_spans(struct conn *c, const struct stage_seg *s, uint32_t n, bool remote, size_t len,
                    bool discard); /* ... scattered over n spans, in order */
/* What a target module keeps about the payload its frame asked for, until its
 * payload_done hook: the frame's seq, the registration held (inflight counted; the
 * link releases it if it dies first), and the answer owed. */
struct link_pay {
  uint64_t seq;
  struct hixl_mem_reg *reg;
  uint32_t status;
  uint8_t *bounce; /* a WRITE into device memory lands here first (a pool buffer, back with the record) */
  uint64_t dst;    /* ... and goes here, */
  uint32_t len;    /* ... this many bytes */
};
/* The link's record; module (when not NULL) is the one whose payload_done hook runs. */
struct link_pay *link_pay_of(struct conn *c, const struct xport_ops *module);
/* A target refused the data of the WRITE (or STAGE_WRITE) seq: a CALL_AFTER behind it fails. */
void link_write_refused(struct conn *c, uint64_t seq);
/* Target: the tag the peer posted behind its data (xport link.post_tag) came, every
 * byte posted before it having landed: the CALL_TAG waiting for it is served. Tags come
 * in order, 1, 2, ...; any other is a protocol error that ends the link. Lock held. */
void link_tag_landed(struct conn *c, uint32_t tag);
void link_rearm(struct conn *c);      /* tell epoll again what to watch (a target stalled or not) */
void link_resume(struct conn *c);     /* a stalled target link reads again: frames waiting first */
void link_unpark(struct conn *c);     /* the progress thread reads the link (answers are due) */
void link_wake(struct HixlEngine *e); /* the progress thread looks at its work now */
/* During Connect (blocking socket, no lock): send a built frame (len bytes at frame,
 * no payload), tagged when p's link is authenticated (the header's flags are set). */
HixlStatus link_handshake_send(int fd, struct peer *p, uint8_t *frame, size_t len, uint64_t deadline);
/* ... and check a received frame (header and body at frame): its flag, and when p's
 * link is authenticated its tag, read from fd. */
HixlStatus link_handshake_tag(int fd, uint64_t deadline, struct peer *p, const uint8_t *frame,
                              const struct wire_hdr *h);
/* During Connect (blocking socket, no lock): receive the next frame into buf (header,
 * then body; its tag checked; cap bytes, for the answer awaited), applying the MEM_ADD /
 * MEM_DEL the target sends meanwhile to p (read apart: any tag fits). */
HixlStatus link_handshake_recv(int fd, uint64_t deadline, struct peer *p, uint8_t *buf, size_t cap,
                               struct wire_hdr *h);
uint32_t peer_caps(const struct peer *p); /* WIRE_CAP_* of its HELLO_ACK */
/* The link's session secret (AUTH_MAC_LEN bytes), derived in the authenticated
 * handshake and never sent; NULL when the link was not authenticated (no AuthKeyFile)
 * or, initiator, has ended (wiped then). Initiator: from its peer; target: from its link. */
const uint8_t *peer_session(const struct peer *p);
/* Target, scoped memory: may c's peer reach [addr, addr + len)? Always true unless the
 * engine is scoped; a refusal is counted and logged (what: "WRITE", "READ", ...). */
bool link_granted(struct conn *c, uint64_t addr, uint64_t len, const char *what);
/* A linked peer's op refused (not granted, not registered, ...): whether to say so in
 * the log now, once a second at most (a peer that holds the key must not fill the log
 * at the rate it sends ops), with *more the refusals left unsaid since the last line. */
bool link_refused_say(struct conn *c, unsigned long long *more);
const uint8_t *link_session(const struct conn *c);

/* ---- device memory (devmem.h), in r, a HIXL_MEM_DEVICE registration ---- */
/* n bytes from device address src (inside r) to host memory dst, and the reverse;
 * done when they return; why says what failed. No lock is needed. */
HixlStatus xport_devmem_out(const struct hixl_mem_reg *r, uint64_t src, void *dst, size_t n, char *why,
                            size_t cap);
HixlStatus xport_devmem_in(const struct hixl_mem_reg *r, uint64_t dst, const void *src, size_t n, char *why,
                           size_t cap);

/* Device memory over a link's socket, through the engine's pool of pinned host buffers,
 * copied with the lock released (link_progress.c). Initiator: ch, a WRITE or READ
 * chunk of a device registration, queued on c; its frame leaves once its buffer (and a
 * WRITE's copy) is ready, frames behind it wait. Target: the buffer a WRITE of len
 * bytes into r lands in, or NULL (no memory, or len above one pool buffer: refuse it);
 * the link stops reading while the pool is empty. A READ longer than a pool buffer is
 * answered FAILED. Once landed (pay), the copy to the device, then the ACK. A READ of
 * r: copied out, then answered; the answers keep their order. */
void link_dev_post(struct conn *c, struct chunk *ch);
uint8_t *link_dev_landing(struct conn *c, const struct hixl_mem_reg *r, uint32_t len);
void link_dev_landed(struct conn *c, struct link_pay *pay);
void link_dev_read(struct conn *c, struct hixl_mem_reg *r, uint64_t seq, uint64_t raddr, uint32_t len);

/* ---- chunks and requests ---- */
void link_chunk_end(struct chunk *ch, HixlStatus st, const char *why);
/* A direct chunk of c's was answered or completed: on a rail, its load goes down and
 * its counters up (bytes, ops). Before link_chunk_end. */
void link_chunk_moved(struct conn *c, struct chunk *ch);
/* A chunk c can no longer move (c is dying): posted again on another rail of c's peer
 * when it has one and the request time left, else ended with st. */
void link_chunk_lost(struct conn *c, struct chunk *ch, HixlStatus st, const char *why);
/* The chunks of r its link's transport moves (the staged units follow them). */
struct chunk *link_req_direct(struct hixl_transfer_req *r, uint32_t *n);
bool link_req_staged(const struct hixl_transfer_req *r); /* r has staged units (or socket chunks) too */
uint32_t link_req_first_staged(const struct hixl_transfer_req *r); /* the index of r's first staged unit */
uint64_t link_req_deadline(const struct hixl_transfer_req *r);
bool link_req_cancelled(const struct hixl_transfer_req *r); /* timed out: unsent chunks are dropped */

#endif
