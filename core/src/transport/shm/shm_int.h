/* shm_int: the shm transport's private state and the calls between its files. */
#ifndef HIXL_SHM_INT_H
#define HIXL_SHM_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devmem/devmem.h"
#include "engine/xport_link.h"
#include "util/auth.h"
#include "util/cma.h"
#include "util/memtab.h"

#define ESHM_STEP (16u << 20) /* bytes per copy step: deadlines are checked between steps */
#define ESHM_DEV_WEIGHT                                                                                      \
  16u                                /* ... where an op's local side is device memory, 16 times its bytes:   \
                                      * a device copies them about that much faster, and each step           \
                                      * waits for the device once */
#define ESHM_STEP_CHUNKS 1024u       /* chunks per progress-thread step */
#define ESHM_CALLER_COPY (64u << 10) /* an async request this small is copied by its caller */

/* What one peer may have mapped here at once: each memfd is a mapping (the kernel allows
 * a process 65530) and address space (128 TiB in all), however sparse; the count also
 * bounds its table, whose regions taken back stay as tombstones. A peer that hands
 * over more is copied with process_vm_* beyond it. */
#define ESHM_PEER_MAPS      4096u
#define ESHM_PEER_MAP_BYTES ((uint64_t)4 << 40)

/* Connections from other processes than its peer a link's unix socket takes (each
 * accepted and closed); past that it closes, and the link goes on without same-host
 * copies: its peer connects right after SHM_HELLO_ACK, so more are someone flooding
 * the name, who would otherwise hold the progress thread accepting them. */
#define ESHM_STRANGERS_MAX 64u
#define ESHM_GEN_LEN       4096u
#define ESHM_GEN_MSG       "hixl-gen" /* the page's message on the unix socket (8 bytes) */
#define ESHM_LIFE_OFF      64u        /* the life word's offset in that page (shm_life.c) */

/* SHM_UNMAP_ACKs an initiator queues while its link's queue does not empty (the socket's
 * buffers full: the target does not read); past that the link is cut. A target asks back
 * only what it handed over, once each, and reads the answers; one that asks on without
 * reading made this process queue a frame for each (~8 times the bytes it sent) without
 * bound. Far above the regions a target hands over: drop_peer asks all back at once. */
#define ESHM_UNMAP_UNSENT 16384u

/* The binding of a link's unix socket to the link (authenticated links): the
 * initiator sends a fresh nonce on the socket, the target answers
 * HMAC-SHA256(session, ESHM_BIND_LABEL || nonce || u32 BE initiator pid). */
#define ESHM_BIND_LABEL     "hixl shm bind v1"
#define ESHM_BIND_NONCE_LEN 32u

struct eshm_link;
struct eshm_life;

struct eshm_engine {       /* engine_xe(e, XPORT_SHM), while same-host copies are on */
  struct cma_self self;    /* boot id, pid and uid told to shm peers */
  size_t queued;           /* async chunks waiting, on every link */
  uint32_t copying;        /* threads inside a copy, lock released; Finalize waits for 0 */
  uint32_t unsharing;      /* threads waiting for peers to unmap a region (FreeMem) */
  uint64_t round;          /* progress-thread rounds over links with work */
  uint32_t walks;          /* walks over links begun (eshm_next) */
  struct eshm_link *links; /* the live links with shm state, both roles */
  int gen_fd;              /* a sealed page that mapping peers read: ... */
  uint64_t *gen;           /* ... its first 8 bytes count withdrawn registrations; NULL: no mapping */
  int epfd;                /* target: links' unix sockets awaiting their initiator (accept, then its
                            * bind request); the progress thread watches it (event_fd) */
  bool gen_sealed;         /* the page is sealed against writes from anyone else (F_SEAL_FUTURE_WRITE) */
  struct eshm_life *life;  /* target: the thread keeping the life word, once a peer maps; NULL before */
};

/* Initiator: a target's device allocation opened here by its IPC handle (SHM_DEV_MAP),
 * once per allocation however many of its registrations were handed over. */
struct shm_ipc {
  struct shm_ipc *next; /* the peer's list */
  struct devmem_ipc h;  /* the handle it was opened by (blob and alloc_len identify it) */
  int device;           /* the device it was opened on */
  uint64_t base;        /* its start here */
  uint32_t maps;        /* struct shm_map using it; closed at 0 */
};

/* Initiator: a target's region mapped into this process: a memfd (SHM_MAP) or, dev,
 * device memory opened by IPC handle (SHM_DEV_MAP). */
struct shm_map {
  struct memtab_entry range; /* first: the target's [addr, addr + len), in the peer's maps */
  uint8_t *base;             /* this process's mapping of the region (dev: of its first byte) */
  size_t map_len;
  uint32_t refs;       /* copies using it, lock released */
  bool revoked;        /* the target wants it back (SHM_UNMAP) or the link died: no new copy */
  bool ack_owed;       /* ... SHM_UNMAP_ACK goes once the last copy ends */
  bool dev;            /* device memory: copied by the provider (d2d, to_host, to_device) */
  struct shm_ipc *ipc; /* dev: the allocation opened, NULL once let go */
};

/* Target: a region whose memfd a link's initiator was given. */
struct shm_grant {
  struct hixl_mem_reg *reg;
  bool unmapping; /* SHM_UNMAP sent; FreeMem waits for the answer */
  bool revoking;  /* ... for a revoke, which waits too (link_recall_begin) */
};

/* Target: r->xm[XPORT_SHM] of a region HixlEngineAllocMem made, from its mem_share
 * (offered to peers to map) to its mem_dereg. */
struct shm_reg {
  bool unsharing;        /* FreeMem waits for peers to unmap it: no new grant */
  uint32_t unshare_wait; /* peers that still have to answer SHM_UNMAP */
  bool ipc_ok;           /* HIXL_MEM_DEVICE: the provider exported ipc (SHM_DEV_MAP) */
  struct devmem_ipc ipc;
};

/* The peer process an initiator link copies to and from. Copies run without the
 * engine lock and hold a reference, so a link that dies meanwhile cannot take this
 * away from under them. Lock held for every field. */
struct shm_peer {
  uint32_t refs;        /* the link's, plus one per copy in progress */
  uint32_t pid, uid;    /* the target process, as it named itself and the probe proved */
  int pidfd;            /* -1 where pidfd_open is missing */
  const uint32_t *life; /* the target's life word (its page, mapped here), or NULL: the pidfd tells */
  void *life_page;      /* ... that mapping, the peer's own (the link's may go first) */
  struct conn *conn;    /* NULL once the link died */
  struct memtab maps;   /* the target's regions mapped here (struct shm_map) */
  uint64_t map_bytes;   /* ... the bytes of its memfds mapped now (ESHM_PEER_MAP_BYTES) */
  uint64_t pid_asked;   /* the coarse clock's tick its pidfd was last found alive (shm_copy.c) */
  bool map_full_told;   /* ... past that or ESHM_PEER_MAPS entries: logged once */
  struct shm_ipc *ipcs; /* the target's device allocations opened here ... */
  int device;           /* ... in the context of this device: the one this engine's side uses */
  uint64_t map_ops;     /* ops moved by memcpy on them */
  uint64_t now_ops;     /* ... of them copied by a sync call with no request (eshm_copy_now) */
  char name[WIRE_MAX_NAME + 1];
  char why[384]; /* why the link died, once it did */
};

struct eshm_link {                 /* link_xs(c, XPORT_SHM) */
  struct conn *conn;               /* while in the engine's list (until the link dies) */
  struct eshm_link *prev, *next;   /* ... that list */
  uint32_t walk;                   /* the last walk (eshm_next) that visited it */
  struct shm_peer *peer;           /* initiator: the process copies go to */
  struct chunk *sq_head, *sq_tail; /* initiator: async chunks waiting for the progress thread */
  uint64_t turn;                   /* progress-thread round that last served this link */
  uint8_t nonce[CMA_NONCE_LEN];    /* target: what an initiator's probe must read */
  bool nonce_set;
  int lfd;                  /* target: the socket offered in SHM_HELLO_ACK, until its peer connects */
  int ufd;                  /* both: the connected unix socket (binding, then memfds), or -1 */
  uint32_t hello_pid;       /* target: the pid the initiator's SHM_HELLO named */
  uint32_t peer_uid;        /* target: the uid the connected initiator runs as (SO_PEERCRED) */
  uint32_t strangers;       /* target: connections to lfd from other processes (ESHM_STRANGERS_MAX) */
  uint32_t acks_unsent;     /* initiator: SHM_UNMAP_ACKs queued since the queue last emptied */
  bool want_map;            /* target: the initiator maps memory (WIRE_SHM_F_MAP) */
  bool want_devmap;         /* target: ... and opens device memory by IPC handle (WIRE_SHM_F_DEVMAP) */
  bool dev_told;            /* initiator: a device op went as tcp frames (logged once a link) */
  bool watched;             /* target: lfd (before accept) or ufd (until its bind request) is in epfd */
  bool bound;               /* target: the binding was answered, or the link has no key to bind with */
  bool mapping;             /* target: SHM_MAP_HELLO was taken: regions go to ufd (grants) */
  bool said_again;          /* target: a repeated SHM_MAP_HELLO was warned of (the rest at debug) */
  struct shm_grant *grants; /* target: regions this link's initiator was given */
  uint32_t ngrants, cap_grants;
  const uint64_t *gen; /* initiator: the target's withdrawal count (its page, mapped) */
  uint64_t gen_seen;   /* ... as the last transfer read it */
};

static inline struct eshm_engine *eng_of(const struct HixlEngine *e) { return engine_xe(e, XPORT_SHM); }
static inline struct eshm_link *link_of(const struct conn *c) { return link_xs(c, XPORT_SHM); }
static inline struct shm_reg *reg_of(const struct hixl_mem_reg *r) { return r->xm[XPORT_SHM]; }

/* The next link in x's list that the walk numbered walk (++x->walks) has not visited
 * yet, marked visited; NULL once it saw them all. Each step starts again from the
 * head, and a dying link leaves the list (eshm_kill) before its struct conn moves
 * anywhere, so the walk's body may kill any link, its own or others. Lock held, and
 * kept by the body: a walk of another thread meanwhile would mark links anew (the
 * progress thread, which copies with the lock released, marks its own field, turn). */
static inline struct eshm_link *eshm_next(struct eshm_engine *x, uint32_t walk) {
  struct eshm_link *l = x->links;
  while (l && l->walk == walk) l = l->next;
  if (l) l->walk = walk;
  return l;
}

/* ---- shm_map.c: the link's unix socket, both sides ---- */
/* The binding's MAC (see ESHM_BIND_LABEL) under a link's session secret. */
void eshm_bind_mac(const uint8_t *session, const uint8_t nonce[ESHM_BIND_NONCE_LEN], uint32_t pid,
                   uint8_t out[AUTH_MAC_LEN]);
/* Target: the one socket of l the progress thread waits on (lfd until its initiator
 * connects, then ufd until its bind request) goes into epfd; false with errno. The
 * event names the field, never the link: a walk finds the link. Lock held. */
bool eshm_unix_watch(struct eshm_engine *x, struct eshm_link *l);
/* Target: take the connection of the link's initiator waiting on l->lfd, if there is
 * one (strangers are closed); true once l->ufd holds it. Lock held. */
bool eshm_target_accept(struct conn *c, struct eshm_link *l);
/* Target: answer the initiator's bind request on l->ufd if it came (else the socket
 * stays watched). Lock held. */
void eshm_target_bind(struct conn *c, struct eshm_link *l);
/* Close l's unix sockets (a target's out of epfd first). Lock held. */
void eshm_unix_close(struct eshm_engine *x, struct eshm_link *l);

/* ---- shm_map.c: mapped memory, both sides ---- */
void eshm_peer_put(struct shm_peer *s);
void eshm_map_retire(struct shm_peer *s, struct shm_map *mp);
void eshm_map_put(struct shm_peer *s, struct shm_map *mp);
HixlStatus eshm_map_connect(int fd, uint64_t deadline, struct peer *p, struct eshm_link *l, uint8_t *buf,
                            size_t cap);
/* Initiator: open the device registration an SHM_DEV_MAP m hands over; rm: the peer's
 * advertised registration at its address (NULL: none). FAILED with why: a protocol
 * error (the link dies); a handle this process cannot open is logged and its ops stay
 * on tcp frames. Lock held (or Connect's thread). */
HixlStatus eshm_dev_map_take(struct shm_peer *s, const struct remote_mem *rm, const struct wire_msg *m,
                             char *why, size_t cap);
/* Target, a scoped engine's grants changed for peer: device registrations newly
 * covered are handed over, those no longer covered recalled (the revoke waits for the
 * answers: link_recall_begin). */
void eshm_grant(struct HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n,
                enum xport_grant how);
void eshm_target_map_hello(struct conn *c);
void eshm_target_unmap_ack(struct conn *c, const struct wire_msg *m);
void eshm_grant_drop(struct conn *c, struct eshm_link *l, uint32_t i);
void eshm_initiator_frame(struct conn *c, const struct wire_msg *m);
/* Initiator: the target advertised [addr, addr + len) (MEM_ADD): tombstones of regions it
 * freed there go (it registered memory anew where one was mapped; map_bury). */
void eshm_mem_added(struct conn *c, uint64_t addr, uint64_t len);
void eshm_gen_bump(struct HixlEngine *e);
void eshm_mem_dereg(struct HixlEngine *e, struct hixl_mem_reg *r);
void eshm_mem_share(struct HixlEngine *e, struct hixl_mem_reg *r);
void eshm_mem_unshare(struct HixlEngine *e, struct hixl_mem_reg *r, uint64_t deadline);
void eshm_peer_drop(struct HixlEngine *e, const char *name, uint64_t deadline);

/* ---- shm_life.c: whether the target process is still there, without a syscall ---- */
/* Target: start the thread that keeps x's life word (once; lock held). False where
 * the page is not sealed or the thread cannot start: the word stays 0 and the
 * initiators ask the pidfd instead. */
bool eshm_life_start(struct eshm_engine *x);
/* Target, Finalize: the word back to 0 and the thread ended. */
void eshm_life_stop(struct eshm_engine *x);
/* Initiator: whether s's process has exited: its life word, else its pidfd. The word
 * is the target's own to write: before a copy by pid, ask the pidfd too. */
bool eshm_peer_gone(const struct shm_peer *s);

/* ---- shm_copy.c: the data path ---- */
void eshm_post(struct conn *c, struct chunk *ch);
bool eshm_dev_reach(struct conn *c, const struct hixl_mem_reg *lreg, const struct remote_mem *rm,
                    uint64_t raddr, uint64_t len);
void eshm_async(struct conn *c, struct hixl_transfer_req *r);
void eshm_drive(struct conn *c, struct hixl_transfer_req *r);
bool eshm_copy_now(struct conn *c, HixlTransferOp op, const HixlTransferOpDesc *descs, size_t n,
                   struct hixl_mem_reg *const *lregs, HixlStatus *st, char *why, size_t cap);
bool eshm_progress(struct HixlEngine *e);

#endif
