/* engine internals: the structures of the engine, its links and requests, and the
 * link layer's functions (link.c), which the modules behind the transport interface
 * (xport.h) and the public API (api.c) use. One mutex per engine guards everything
 * here; the progress thread takes it for each batch of events. */
#ifndef HIXL_ENGINE_INT_H
#define HIXL_ENGINE_INT_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "devmem/devmem.h"
#include "engine/engine_ext.h"
#include "engine/options.h"
#include "engine/xport.h"
#include "engine/xport_link.h"
#include "hixl/hixl_engine.h"
#include "util/auth.h"
#include "util/memtab.h"
#include "util/handles.h"
#include "wire/wire.h"

#define ENGINE_TCP_CHUNK (1u << 20) /* ops larger than this are split */
#define ENGINE_RXBUF     (256u << 10)
#define ENGINE_NAME_MAX  64

struct hixl_transfer_req {
  struct HixlEngine *eng;
  struct chunk *chunks; /* direct chunks first, then staged units */
  uint32_t nchunks;
  uint32_t ndirect;     /* chunks[0, ndirect) move by the link's transport */
  uint32_t nsock;       /* ... then nsock chunks of device memory on the link's socket (tcp frames),
                           where its transport does not move device memory; staged units after them */
  void *staged;         /* stage.c's: the staged units' state and ranges, one allocation */
  uint32_t outstanding; /* chunks not yet ended */
  HixlStatus status;    /* first failure, or SUCCESS */
  bool user_holds;      /* the caller may still ask about it */
  bool cancelled;       /* timed out: unsent chunks are dropped, late data discarded */
  bool is_async;
  bool railed; /* its chunks went on several rails: the progress thread reads them all */
  uint64_t deadline_ns;
  void *user_data;
  char err[256];
  /* hixl_engine_transfer_then_call: a CALL that leaves on the link then_link names once
   * every chunk above ended, all with SUCCESS (else it ends with their failure), if that
   * link is still in the engine's list (found by its id, not its address: a link freed
   * meanwhile may have left its address to a newer one). Counted in outstanding; its
   * frame is built when it leaves (the link's next seq). */
  struct chunk *then;
  uint64_t then_link; /* conn.id */
  enum { THEN_NONE, THEN_HELD, THEN_SENT, THEN_ENDED } then_state;
  uint16_t then_service;
  uint32_t then_len; /* request bytes, at WIRE_CALL_REQ_AT of then->tx.heap */
  /* The caller copies the transfer itself (a CPU-copy transport) and sends the CALL
   * right after (link_then_flush): a release meanwhile only queues it, so that the
   * progress thread is not woken to send it first (on the caller's CPU, ahead of it). */
  bool then_caller;
};

/* A target link: HELLO awaited, then (with a key) AUTH_PROOF awaited, then served. */
enum conn_role { CONN_TARGET_HELLO, CONN_TARGET_AUTH, CONN_TARGET, CONN_INITIATOR };

struct peer;

/* Why a link reads no frames (struct conn's stall): it reads again once none holds. */
#define LINK_STALL_MODULE  0x1  /* a module paused it (a target's RDMA staged unit is on the QP) */
#define LINK_STALL_FENCE   0x2  /* a CALL waits until every answer queued before it was sent */
#define LINK_STALL_BACKLOG 0x4  /* it owes its peer more answers than the bound (issue 28) */
#define LINK_STALL_DEVMEM  0x8  /* the engine's device buffers are all in use: reads once one is back */
#define LINK_STALL_TAG     0x10 /* a CALL_TAG waits for its data's tag (link_tag_landed) */

/* Tags a target link takes ahead of the CALL_TAGs that name them, at most: past it the
 * peer is not sending the calls its data announced, and the link ends. */
#define LINK_TAGS_AHEAD 65536u

struct tag_park; /* link_frames.c: the CALL_TAG a target link waits to serve */

/* A Connect between its dial and its link's attach, lock released (HixlEngine's dials). */
struct api_dial {
  int fd; /* its socket once dialled, else -1 */
  struct api_dial *next;
};

/* A peer's registrations an initiator keeps, at most, per link (its HELLO_ACK's
 * WIRE_MAX_MEM_ENTRIES and the MEM_ADDs after): past it the link ends, so a link's table
 * costs this side at most ~5 MiB (a railed peer's, one per rail) and its sorted inserts a
 * bounded time under the engine's lock. */
#define LINK_PEER_MEM_MAX 16384u

#define LINK_DEV_STREAMS 2 /* devices a link copies on asynchronously; a third's copies are synchronous */
struct conn {
  struct HixlEngine *eng;
  struct conn *next; /* engine's list of live connections */
  uint64_t id;       /* unique per engine (conn_ids): what a request names it by (then_link) */
  int fd;
  enum conn_role role;
  bool dead;
  bool want_out; /* EPOLLOUT armed */
  /* Who reads an initiator link: the progress thread; a sync caller (link_drive);
   * or nobody while nothing is pending (parked: only a hang-up wakes the thread). */
  enum { RX_PROGRESS, RX_CALLER, RX_PARKED } rx;
  struct peer *peer;          /* initiator side */
  const struct xport_ops *xp; /* the transport moving its data (tcp until a handshake says more) */
  void *xs[XPORT_MODS];       /* each module's state for this link, or NULL */
  char remote_name[WIRE_MAX_NAME + 1];
  uint32_t hello_caps; /* target: WIRE_CAP_* of the peer's HELLO */
  /* receive */
  uint8_t *rxbuf;
  size_t rx_start, rx_end;
  uint8_t *pay_dst; /* payload streaming: destination, or NULL to discard */
  size_t pay_left;  /* bytes of the payload still to come */
  size_t pay_cur;   /* ... of which the current destination takes this many */
  size_t pay_last;  /* the last payload's length (how much to read while none is under way) */
  /* A payload scattered over spans (staged units): the ones after the current. */
  const struct stage_seg *pay_span;
  uint32_t pay_nspan;
  bool pay_span_remote;               /* the spans' raddr (target) rather than laddr (initiator) */
  bool pay_discard;                   /* drop the rest (the caller gave up, or the target refused) */
  struct chunk *pay_chunk;            /* initiator READ_RESP being received */
  const struct xport_ops *pay_module; /* target: the module whose frame asked for the payload */
  struct link_pay pay;                /* ... and what it keeps about it (link_pay_of) */
  /* target: the last seq of a WRITE refused here (CALL_AFTER checks it) */
  uint64_t write_refused;
  /* target: notifications from this link still undrained, as of the engine's drain
   * notify_gen (a later drain took them all) */
  uint64_t notify_gen;
  uint32_t notify_held;
  /* CALL_TAG. Target: the last tag landed (link_tag_landed) and the last a CALL_TAG
   * named, and the call waiting for its tag (LINK_STALL_TAG); initiator: the last tag
   * sent, and the calls sent so (hixl_link_info.tag_calls). */
  uint32_t tags_landed, tags_called, tags_sent;
  struct tag_park *tag_park;
  uint64_t tag_calls;
  uint8_t stall;          /* why the link reads no frames now (LINK_STALL_*), 0: it reads */
  bool in_fence;          /* releasing a stall (no recursion) */
  bool always_read;       /* initiator: the target sends frames on its own (shm SHM_UNMAP): never parked */
  uint32_t recalls;       /* target: what a revoke took back from the peer and it has not let go of yet
                           * (link_recall_begin / _end: shm's device mappings); the revoke waits */
  size_t answers_queued;  /* target: bytes of answers queued, not yet sent (txitem.queued) */
  uint32_t answers_items; /* ... and how many: past LinkAnswersMax or LinkAnswerBytesMax the link
                             stops reading frames until they are down to half (LINK_STALL_BACKLOG) */
  /* send */
  struct txitem *txq_head, *txq_tail;
  /* initiator: chunks sent, in the order their responses will come */
  struct chunk *pend_head, *pend_tail;
  uint64_t next_seq;
  uint32_t walk;           /* the last walk (link_next) that visited it */
  uint64_t hello_deadline; /* target: closed unless its HELLO came by then (HandshakeTimeout) */
  struct in_addr from;     /* target: the peer's address (MaxLinksPerAddress) */
  /* Authentication (AuthKeyFile): the proof a CONN_TARGET_AUTH link awaits, and the
   * link's session secret once proven (both sides: the initiator's is in its peer). */
  uint8_t auth_expect[AUTH_MAC_LEN];
  uint8_t session[AUTH_MAC_LEN];
  bool authed;
  struct auth_frames proof; /* authenticated: every frame after AUTH_PROOF is tagged (on) */
  bool pay_tagged;          /* the payload under way has a tag behind it (WIRE_F_PAYLOAD_TAG) */
  bool pay_tag_due;         /* ... it has all come: its tag is the next 16 bytes, then payload_done */
  struct grant_set *grants; /* target, scoped memory: its peer's grants, found at its first op */
  /* Rails (initiator): the link's index in its peer's rails, or -1 outside rails; the
   * bytes of its chunks not yet answered, and when it last moved a byte (RailStallMs). */
  int rail;
  uint64_t rail_load;
  uint64_t last_io_ns;
  uint32_t devjobs;              /* device copies of its queued on the engine's devq (waiting or running) */
  uint32_t spin_skip, spin_left; /* PollUs back-off of a caller driving it (link_drive_socket) */
  uint64_t spin_quiet;           /* ... and no spinning before this: another task wanted the CPU */
  uint32_t devbufs; /* pool buffers it holds now (at most ENGINE_DEV_LINK_BUFS but for a target's spill) */
  /* Its device copies' streams, one per device, made at its first asynchronous copy
   * there (stream NULL: none could be made, its copies are synchronous); under
   * devq.stream_lock, freed with the link. */
  struct {
    int device;
    void *stream;
  } devstream[LINK_DEV_STREAMS];
  uint32_t ndevstreams;
};

/* One rail to a peer: a tcp link from a local address to one of the peer's. */
struct rail {
  struct conn *conn; /* NULL while down */
  struct sockaddr_in local, remote;
  uint64_t bytes, ops, failures, retried; /* answered chunks' bytes and count; times it went down; chunks
                                             moved off it when it did */
  uint64_t next_probe_ns;                 /* down: dialled again from then on (RailProbeMs) */
  char last_down[128];                    /* why it last went down ("" if never) */
  bool dialling;                          /* the prober is dialling it, the lock released */
  struct memtab rtab; /* k >= 1: the peer's registrations as this rail's link told them (rail 0's: the
                         peer's rtab); each link's own frames alone change it (link_rtab) */
};

struct peer {
  struct peer *next;
  char name[ENGINE_NAME_MAX];          /* as given to Connect */
  char remote_name[WIRE_MAX_NAME + 1]; /* as the peer calls itself */
  struct conn *conn;                   /* NULL once the link broke */
  struct memtab rtab;                  /* the peer's registrations, as its first link (rail 0) told them */
  uint32_t caps;                       /* WIRE_CAP_* from its HELLO_ACK */
  char broken_why[256];
  uint8_t session[AUTH_MAC_LEN]; /* the link's session secret, when authed; wiped when that link ends */
  bool authed;                   /* the peer proved a key this engine holds (false once wiped) */
  struct auth_frames proof;      /* during Connect: the frame tags (its link takes them) */
  uint64_t id;                   /* unique per engine: found again after the lock was released */
  /* Rails: n_rails > 1 when both engines have them and the link is tcp. rails[0] is
   * the link Connect made; conn is whichever live rail carries the control frames
   * (memory table, SYNC, NOTIFY, CALL, staged units), the lowest one up. */
  uint32_t n_rails;
  struct rail rails[HIXL_RAILS_MAX];
  bool closing; /* Disconnect or Finalize: a rail that dies now is not failed over */
};

/* The staging pool ("BufferPool"): NUM buffers of SIZE bytes in one mapping, and
 * the staged units waiting for one, in order. Lock held for every field. */
struct stage_pool {
  uint8_t *mem;
  size_t mem_len;
  size_t buf_size; /* bytes per buffer */
  size_t unit;     /* bytes per staged unit: min(buf_size, WIRE_MAX_STAGE) */
  uint32_t num;
  void *mr;                       /* the whole pool registered with mr_mod (bounce_reg), or NULL */
  const struct xport_ops *mr_mod; /* the transport whose links then carry STAGE_PULL / STAGE_PUSH */
  uint8_t **free;
  uint32_t nfree;
  struct chunk *wait_head, *wait_tail;
  struct hixl_transfer_req *submitting; /* inside stage_submit: the request being submitted */
  struct hixl_stage_stats stats;
};

/* A device copy (docs/device-memory.md) between a registration's device memory and a
 * buffer of the engine's pool, queued on e->devq, done with the lock released by the
 * progress thread or by the sync caller driving its link. */
enum devjob_kind {
  DJ_SEND,   /* initiator WRITE: device -> buffer, then its frame (ch->tx) goes */
  DJ_ASK,    /* initiator READ: a buffer for its answer, then its frame goes (no copy) */
  DJ_LAND,   /* initiator READ answered: buffer (ch->bounce) -> device, then ch ends */
  DJ_T_LAND, /* target WRITE landed: buffer -> device, then its ACK (it) goes */
  DJ_T_READ  /* target READ: device -> buffer, then its READ_RESP (it) goes with it */
};
struct devjob {
  struct devjob *next;
  struct conn *c;
  enum devjob_kind kind;
  struct chunk *ch;         /* initiator kinds */
  struct txitem *it;        /* the frame it readies: &ch->tx, or the target's answer (owned) */
  struct hixl_mem_reg *reg; /* the device registration (target kinds hold it: inflight) */
  uint64_t dev;             /* device address */
  uint8_t *buf;             /* its pool buffer; NULL while it waits for one */
  uint32_t len;
  uint64_t seq;   /* target kinds: the frame answered */
  bool needs_buf; /* waiting for a pool buffer (counted in devq.waiting) */
  bool running;   /* being copied (by a thread, the lock released, or on a stream): nobody else touches it */
  bool copied;    /* its asynchronous copy ended (cst, cwhy): the thread that reaps its link's ends it */
  bool lost;      /* its link died meanwhile: st and why say how */
  HixlStatus st, cst;
  char why[256], cwhy[128];
  struct devjob *copied_next; /* on devq.copied, once its copy ended */
};
/* The engine's device copies and the pool of pinned host buffers they use, made at the
 * first device op and freed at Finalize. Lock held for every field. */
#define ENGINE_DEV_BUFS 16 /* buffers of ENGINE_TCP_CHUNK: 16 MiB pinned at most */
/* Pool buffers one link holds at once: max(2, ENGINE_DEV_BUFS / 4). Two let a link's
 * copy of one chunk overlap the wire of the one before; a quarter of the pool keeps
 * four links at that depth and more together, so one link with many ops queued (or a
 * peer that stops reading) cannot take every buffer and hold the others' ops behind. */
#define ENGINE_DEV_LINK_BUFS (ENGINE_DEV_BUFS / 4 > 2 ? ENGINE_DEV_BUFS / 4 : 2)
struct devq {
  struct devmem_pool *pool;
  struct devjob *head, *tail; /* in order: a job waiting for a buffer holds back those behind */
  uint32_t waiting;           /* jobs in it waiting for a buffer */
  uint32_t stalls;            /* target links stalled on the pool (LINK_STALL_DEVMEM) */
  uint32_t copying;           /* threads copying now, the lock released (Finalize waits for them) */
  /* Copies on streams: their ends come on the provider's thread, which takes no lock
   * (CUDA forbids a callback to wait on anything that may wait on device work): it
   * pushes the job on copied (a stack, atomic), rings copier_fd and evfd (and the
   * progress thread when there is no copier), then takes one off inflight (atomic), its
   * last touch of the engine. A reaper, lock held, takes the stack and ends the jobs of
   * its links: the copier (woken by copier_fd), or a sync caller driving the link (it
   * polls evfd beside its socket). Finalize waits for inflight to reach 0. */
  uint32_t inflight;
  struct devjob *copied;
  int evfd, copier_fd;
  pthread_mutex_t stream_lock; /* the links' devstream: taken without the engine lock */
  bool resume;                 /* a buffer came back: target links stalled on the pool read again */
  /* A job was queued, a buffer came back (or a link's share of them), or a sync caller
   * left its link's jobs to the copier, since the progress thread last rang the copier:
   * link_devq_kick rings it only then (the copier steps on while it has work, and the
   * copies' ends ring it themselves). */
  bool news;
  /* The copier: the thread that runs the copies of links the progress thread reads,
   * so that a copy (a device's DMA, waited for) never holds up the wire: started at
   * the first device job, woken by the progress thread (link_devq_kick: copier_fd),
   * stopped and joined at Finalize. A sync caller still copies its own link's jobs
   * itself. copier_up is read by the providers' threads (atomic). */
  pthread_t copier;
  bool copier_up, copier_stop;

  void *held[ENGINE_DEV_BUFS];           /* the pool's buffers handed out ... */
  struct conn *held_by[ENGINE_DEV_BUFS]; /* ... and the link each is charged to (NULL: none, or freed) */
};

struct notify_item {
  char *name, *msg, *remote;
};

/* A service answering CALL frames (engine_ext.h). */
#define ENGINE_SERVICES 4
#define ENGINE_NONCES   16 /* keyed handshakes of one engine as initiator watched for reflection at once */
struct engine_service {
  hixl_call_fn fn; /* NULL: CALLs for it are answered UNSUPPORTED */
  void *ctx;
};

struct HixlEngine {
  pthread_mutex_t lock;
  pthread_cond_t cond; /* a request ended, on any link */
  bool initialized;
  bool stopping;
  char local_name[ENGINE_NAME_MAX];
  struct sockaddr_in local_addr;
  struct hixl_options opts;
  int listen_fd, epfd, evfd;
  int tfd; /* timerfd: handshake deadlines and the accept back-off, while either waits */
  bool tfd_armed;
  uint64_t accept_resume;   /* accepting paused (out of descriptors) until then, CLOCK_MONOTONIC ns; 0: not */
  uint64_t accept_refusals; /* links refused or deferred since the last log line about it */
  uint64_t accept_logged;   /* when that line was written */
  struct hixl_window_stats wstats; /* scoped memory's RDMA windows (transport/rdma/rdma_win.c) */
  struct hixl_poll_stats pstats;   /* the progress thread's wake-ups and polls (PollUs) */
  bool prog_busy;                  /* the progress thread has steps left (copies queued on it) */
  struct hixl_devmem_stats dstats; /* device memory by same-host IPC (transport/shm/shm_copy.c) */
  struct auth auth;                /* AuthKeyFile's keys; none: anyone is accepted */
  bool scoped;                     /* scoped memory: a target serves a peer only inside its grants */
  bool devmap_unscoped;            /* ... but hands same-host peers device allocations by IPC handle
                                    * whatever they were granted (hixl_engine_set_devmap_scoped) */
  uint32_t revoke_waiters;         /* revokes waiting for recalls (lock released): Finalize waits */
  uint32_t outside;                /* calls between two holds of the lock that use what Finalize frees
                                    * (api_out / api_back): Finalize waits for none */
  struct api_dial *dials;          /* Connects handshaking: Finalize cuts their sockets */
  int dev_local;                   /* 1 + the device of the first device memory registered, 0 before:
                                    * where peers' device memory is opened (atomic: Connect reads it
                                    * without the lock) */
  struct grant_set *grants;        /* ... one set per peer name (grant.c) */
  uint64_t grant_refusals;         /* ops refused for want of a grant */
  uint64_t auth_refusals;          /* handshakes refused since the last log line about them */
  /* The nonces of this engine's own keyed handshakes in flight (link_nonce_hold): a
   * HELLO that carries one is that handshake reflected back to this engine. */
  pthread_mutex_t nonce_lock;
  uint8_t nonces[ENGINE_NONCES][32];
  bool nonce_used[ENGINE_NONCES];
  uint64_t auth_logged; /* when that line was written */
  uint64_t op_refusals; /* a linked peer's ops refused since the last line about one (link_refused_say) */
  uint64_t op_logged;   /* when that line was written */
  pthread_t thread;
  struct memtab regs;
  struct peer *peers;
  struct conn *conns;
  uint32_t walks; /* walks over conns begun (link_next) */
  /* The lock's hand-off to callers (engine_lock_caller, link_progress.c): callers blocked
   * on it now, callers that took it so far, waiters on cond now, and whether cond was
   * signalled in this hold. The progress thread, releasing the lock while a caller is
   * blocked on it or one it woke waits, lets that caller in before it takes it again:
   * a mutex favours the thread that just released it, and a peer that keeps it busy
   * would otherwise keep every caller out past its timeout. */
  uint32_t lock_wanted, lock_gen, cond_waiters; /* __atomic */
  bool signalled;                               /* __atomic */
  struct conn *graveyard;                       /* killed, freed by the progress thread after a batch */
  const struct xport_ops *mods[XPORT_MODS];     /* the transports and the staging pool (xport.h) */
  void *xe[XPORT_MODS];                         /* each module's engine state, or NULL */
  const struct xport_ops *frame_owner[WIRE_TYPE_MAX_ + 1]; /* target frames a module owns */
  const struct xport_ops *init_owner[WIRE_TYPE_MAX_ + 1];  /* initiator frames a module owns */
  struct stage_pool pool;
  struct handles reqs;      /* async requests the caller holds, by token; under req_lock too */
  pthread_mutex_t req_lock; /* taken after lock, or alone to poll a WAITING request */
  struct notify_item *notifies;
  size_t n_notifies, cap_notifies;
  uint64_t notify_gen; /* GetNotifies drains so far (a link's notify_held counts since one) */
  struct engine_service services[ENGINE_SERVICES]; /* CALL handlers, by service number */
  /* Rails (api_dial.c): the addresses this engine accepts links on, listen address first
   * (advertised in RAILS_ACK), the extra listeners, and the prober thread, started at the
   * first railed Connect and stopped at Finalize through rail_stop. */
  uint32_t n_rail_addrs;
  uint32_t rail_addrs[HIXL_RAILS_MAX]; /* network order */
  uint16_t rail_ports[HIXL_RAILS_MAX]; /* host order */
  int rail_fds[HIXL_RAILS_MAX];        /* listeners beyond listen_fd; -1: none */
  uint64_t peer_ids;
  uint64_t conn_ids; /* links made so far (conn.id) */
  bool rail_thread_on;
  bool rail_stop_failed; /* the prober could not start: not tried again */
  pthread_t rail_thread;
  pthread_cond_t rail_cond;
  void (*rail_stop)(struct HixlEngine *e);
  struct devq devq;          /* device copies and their buffers (link_progress.c) */
  uint8_t scratch[64 << 10]; /* sink for discarded payload */
};

/* link.c: the control plane every module uses */
int link_start(struct HixlEngine *e, HixlStatus *st);
int link_watch_listener(struct HixlEngine *e);
void link_stop(struct HixlEngine *e);
struct conn *link_conn_new(struct HixlEngine *e, int fd, enum conn_role role);
int link_conn_watch(struct conn *c);
/* The one way to walk e's links when the walk's body may kill one: the next link in
 * e->conns that the walk numbered walk (= ++e->walks) has not visited, looked for from
 * the head each time. A kill moves a link out of e->conns (to the graveyard, whose
 * next leads elsewhere), so the body may kill any link, its own or others, and every
 * live link is still visited once. Lock held throughout; the body must not begin
 * another walk (a walk of its own would mark links anew). shm's links walk the same
 * way (eshm_next). */
static inline struct conn *link_next(struct HixlEngine *e, uint32_t walk) {
  struct conn *c = e->conns;
  while (c && c->walk == walk) c = c->next;
  if (c) c->walk = walk;
  return c;
}

void link_broadcast_mem(struct HixlEngine *e, enum wire_type type, const struct hixl_mem_reg *r);

/* The engine whose service handler this thread is running (the lock is held), or NULL. */
extern _Thread_local struct HixlEngine *link_serving_engine;

/* grant.c: scoped memory (engine_ext.h). Lock held. */
struct grant_set *grant_set_of(struct HixlEngine *e, const char *peer, bool make);
bool grant_covers(const struct grant_set *g, uint64_t addr, uint64_t len);
size_t grant_peers(const struct HixlEngine *e); /* peer names holding at least one range */
HixlStatus grant_add(struct HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n);
HixlStatus grant_remove(struct HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n);
size_t grant_count(const struct HixlEngine *e, const char *peer);
bool link_grant_ok(struct conn *c, uint64_t addr, uint64_t len); /* link_granted without the log */
void grant_free_all(struct HixlEngine *e);
void link_req_maybe_free(struct hixl_transfer_req *r);
/* r was given up (cancelled): its frames on a socket let go of the caller's host memory
 * and of its registrations. A WRITE frame part-sent cannot stop mid-frame: it ends from
 * a copy of its data made now; one not started is dropped unsent (link_frames.c), and
 * READ data that comes later is discarded, so nothing reads or writes the caller's
 * ranges after its call returned, and DeregisterMem need not wait for a peer that may
 * never answer. Out of memory for the copy, a chunk keeps its registration. Lock held. */
void link_req_let_go(struct hixl_transfer_req *r);
/* Attach th, a CALL chunk whose frame holds its request, to r (lock held): it leaves
 * on c when r's other chunks have all ended with SUCCESS; it may leave at once. */
void link_then_attach(struct hixl_transfer_req *r, struct conn *c, struct chunk *th, uint16_t service,
                      uint32_t len);
/* Send th, a CALL chunk, now, the target serving it once r's chunks have landed there
 * (lock held). type WIRE_CALL_AFTER: the request at WIRE_CALL_AFTER_AT, r's chunks all
 * frames already queued on c, served only if none of them was refused (after: the
 * first one's seq). WIRE_CALL_TAG: the request at WIRE_CALL_TAG_AT, served when the
 * tag after, which c's transport posts behind r's chunks (link.post_tag), lands. */
void link_then_behind(struct hixl_transfer_req *r, struct conn *c, struct chunk *th, uint16_t service,
                      uint32_t len, uint8_t type, uint64_t after);
/* After the caller's own copy of r (then_caller, now cleared): send r's CALL if it was
 * released meanwhile, and leave the link to the progress thread for its answer and for
 * what the socket did not take (lock held). */
void link_then_flush(struct hixl_transfer_req *r);
/* The link r's CALL goes on (r->then_link), if it is still in the engine's list, else NULL. */
struct conn *link_then_conn(struct hixl_transfer_req *r);
/* r gave up (its deadline): a CALL still held ends with st, why. */
void link_then_cancel(struct hixl_transfer_req *r, HixlStatus st, const char *why);
void link_drive(struct conn *c, struct hixl_transfer_req *r);
void link_take_pending(struct conn *c);
void link_free_graveyard(struct HixlEngine *e);
/* Device copies (link.c: the queue and the pool; link_progress.c: running them). */
/* A pool buffer charged to link c; NULL: none free (spill: one beyond the pool then, or
 * when c holds its share, NULL only without memory). A get that is not a spill first
 * checks link_devbuf_capped. */
void *link_devbuf_get(struct conn *c, int device, bool spill, char *why, size_t cap);
void link_devbuf_put(struct HixlEngine *e, void *buf);
bool link_devbuf_capped(const struct conn *c); /* c holds ENGINE_DEV_LINK_BUFS pool buffers */
void link_devbuf_disown(struct conn *c);       /* c is freed: buffers still charged to it are no one's */
void link_devq_add(struct HixlEngine *e, struct devjob *j);
void link_devq_drop(struct HixlEngine *e, struct devjob *j);         /* unqueued and freed, its buffer back */
void link_devq_kill(struct conn *c, HixlStatus st, const char *why); /* c dies: its jobs go or are lost */
void link_devq_land(struct conn *c,
                    struct chunk *ch); /* ch's READ answer landed in ch->bounce: to the device */
bool link_devq_step(struct HixlEngine *e, struct conn *only); /* true: more can run now */
void link_devq_kick(struct HixlEngine *e);   /* progress thread: jobs or a buffer came: the copier runs */
void link_devq_fini(struct HixlEngine *e);   /* Finalize, links gone */
void link_devq_streams_free(struct conn *c); /* c is freed: no copy of its is under way */
void link_txq_unlink(struct conn *c, struct txitem *it); /* out of c's send queue, wherever it is */
/* Rails: the live rail of p least loaded, other than except (ties: p->conn), or NULL.
 * rm (NULL: any): a one-sided rail (rdma) only when its own table holds rm's range. */
struct conn *link_rail_pick(struct peer *p, const struct conn *except, const struct remote_mem *rm);
/* Whether rail link c can move a chunk into rm (an entry of any rail's table): any link
 * that is not one-sided, and a one-sided one whose own table holds rm's range exactly
 * (NULL rm: yes). */
bool link_rail_keyed(const struct conn *c, const struct remote_mem *rm);
/* The key a chunk into rm carries on link c: that of rm's range in c's own table, or
 * rm's own (off rails; a rail that does not hold the range). */
uint32_t link_rail_rkey(const struct conn *c, const struct remote_mem *rm);
/* The peer's registrations as its link of rail index rail told them (0, or -1 off
 * rails: p->rtab). Each rail's table is changed by that link's frames alone, so the
 * order in which rails are read cannot make one rail lose a range or a key. */
struct memtab *link_peer_rtab(struct peer *p, int rail);
struct memtab *link_rtab(const struct conn *c); /* c's own table (c->peer set) */
/* A chunk of len bytes goes on rail c: its load grows (the stall clock starts if it was idle). */
void link_rail_charge(struct conn *c, uint32_t len);
/* Post ch on rail link to (its next seq, its load, its key into rm when rm is not NULL);
 * the progress thread sends and reads. */
void link_rail_post(struct conn *to, struct chunk *ch, const struct remote_mem *rm);
/* Every rail with work that moved no byte for RailStallMs is killed (its chunks fail over). */
bool link_rails_tick(struct HixlEngine *e);
void link_tick_start(struct HixlEngine *e); /* the progress thread's 100 ms tick runs (rails need it) */
/* Record a registration p advertised on its link of rail index rail (0: its first link,
 * or a peer without rails) in that rail's table: the range, and that rail's key. */
void link_peer_add_mem(struct peer *p, const struct wire_mem_entry *me, int rail);
/* A registration p withdrew on its link of rail index rail leaves that rail's table. */
void link_peer_del_mem(struct peer *p, uint64_t addr, uint64_t len, int rail);
void link_peer_rtab_free(struct memtab *t); /* its entries and itself */
size_t link_mem_entry_len(const struct hixl_mem_reg *r);
uint32_t link_mem_key(const struct conn *c, const struct hixl_mem_reg *r); /* the transports' key on c */
uint32_t link_caps(const struct HixlEngine *e); /* WIRE_CAP_* this engine advertises */
/* An initiator's handshake nonce, held while its handshake runs (a slot, or -1 when all
 * are taken: then only the dialled-address check catches a reflection); dropped after. */
int link_nonce_hold(struct HixlEngine *e, const uint8_t nonce[32]);
void link_nonce_drop(struct HixlEngine *e, int slot);

/* What the link layer's files call of each other; they call only downward: link.c,
 * then link_frames.c, then link_progress.c. */
void link_txitem_done(struct conn *c, struct txitem *it); /* sent or dropped: release what it holds */
void link_conn_bury(struct conn *c);                      /* close a dead link, free it after the batch */
void link_conn_arm(struct conn *c);                       /* tell epoll what to watch on c */
void link_set_want_out(struct conn *c, bool on);
uint32_t link_then_init(struct hixl_transfer_req *r, struct conn *c, struct chunk *th, uint16_t service,
                        uint32_t len, int state);
void link_parse_frames(struct conn *c);
void link_payload_advance(struct conn *c, size_t k);
/* k payload bytes received at src (the destination, or where they were dropped):
 * into the payload's tag when it has one (AuthPayloadTag), then link_payload_advance. */
void link_payload_land(struct conn *c, const uint8_t *src, size_t k);
void link_payload_take(struct conn *c, const uint8_t *buf, size_t n);

#endif
