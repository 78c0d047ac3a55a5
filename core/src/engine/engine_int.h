/* engine internals: shared by api.c (public API) and link.c (progress
 * thread, connections, wire handling). One mutex per engine guards everything
 * here; the progress thread takes it for each batch of events. */
#ifndef HIXL_ENGINE_INT_H
#define HIXL_ENGINE_INT_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "transport/shm/cma.h"
#include "engine/engine_ext.h"
#include "hixl/hixl_engine.h"
#include "util/memtab.h"
#include "engine/options.h"
#include "util/ptrset.h"
#include "transport/rdma/rdma.h"
#include "wire/wire.h"

#define ENGINE_TCP_CHUNK (1u << 20) /* ops larger than this are split */
#define ENGINE_RXBUF     (256u << 10)
#define ENGINE_NAME_MAX  64

struct hixl_mem_reg {
  struct memtab_entry range; /* first: the memtab holds pointers to it */
  HixlMemType type;
  uint32_t inflight;          /* chunks in flight that touch the range, either role */
  char tag[WIRE_MAX_TAG + 1]; /* advertised with the range; "" when untagged */
  struct ibv_mr *mr;          /* with RDMA: registered with the engine's PD */
};

/* A peer's registration as it advertised it. */
struct remote_mem {
  struct memtab_entry range; /* first: the peer's memtab holds pointers to it */
  uint32_t rkey;             /* RDMA remote key, 0 without RDMA */
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
  size_t queued;            /* bytes counted in the link's stage_queued */
  size_t sent;              /* bytes of hdr, heap and payload sent so far */
  struct chunk *chunk;      /* initiator: awaits a response once sent */
  struct hixl_mem_reg *reg; /* target READ_RESP: inflight released once sent */
};

enum chunk_kind { CHUNK_WRITE, CHUNK_READ, CHUNK_NOTIFY, CHUNK_SYNC, CHUNK_SWRITE, CHUNK_SREAD, CHUNK_CALL };

/* One staged op, or a piece of one: local and remote ranges of the same length. */
struct stage_seg {
  uint64_t laddr, raddr;
  uint32_t len;
};
/* One request frame an initiator sends and the response it waits for. */
struct chunk {
  struct txitem tx;
  struct chunk *next_pending;
  struct hixl_transfer_req *req;
  struct hixl_mem_reg *lreg; /* NULL for notify */
  uint8_t *laddr;
  uint64_t raddr;
  uint32_t rkey; /* RDMA: the remote registration's key */
  uint32_t len;
  uint64_t seq;
  enum chunk_kind kind;
  /* A staged unit (CHUNK_SWRITE / CHUNK_SREAD): ranges packed through one pool
   * buffer, sent as one STAGE_WRITE / STAGE_READ on the link's socket. */
  struct stage_seg *segs; /* into the request's array */
  uint32_t nsegs;
  bool waiting;       /* in the pool's queue, no buffer yet */
  bool srdma;         /* sent as STAGE_PULL / STAGE_PUSH: the target moves the data by RDMA */
  uint8_t *sbuf;      /* the pool buffer, once it has one */
  struct conn *sconn; /* the link it goes on, while it waits */
  struct chunk *next_wait;
  uint32_t *call_len; /* CHUNK_CALL: where the answer's length goes (laddr, len: its buffer) */
};

struct hixl_transfer_req {
  struct HixlEngine *eng;
  struct chunk *chunks; /* direct chunks first, then staged units */
  uint32_t nchunks;
  uint32_t ndirect;       /* chunks[0, ndirect) move by the link's transport */
  struct stage_seg *segs; /* the staged units' ranges, one allocation */
  uint32_t outstanding;   /* chunks not yet ended */
  HixlStatus status;      /* first failure, or SUCCESS */
  bool user_holds;        /* the caller may still ask about it */
  bool cancelled;         /* timed out: unsent chunks are dropped, late data discarded */
  bool is_async;
  uint64_t deadline_ns;
  void *user_data;
  char err[256];
};

enum conn_role { CONN_TARGET_HELLO, CONN_TARGET, CONN_INITIATOR };

/* shm: the peer process an initiator link copies to and from (process_vm_*). Copies
 * run without the engine lock and hold a reference, so a link that dies meanwhile
 * cannot take this away from under them. Lock held for every field. */
struct shm_peer {
  uint32_t refs;     /* the link's, plus one per copy in progress */
  uint32_t pid, uid; /* the target process, as it named itself and the probe proved */
  int pidfd;         /* -1 where pidfd_open is missing */
  struct conn *conn; /* NULL once the link died */
  char name[WIRE_MAX_NAME + 1];
  char why[384]; /* why the link died, once it did */
};

struct peer;

struct conn {
  struct HixlEngine *eng;
  struct conn *next; /* engine's list of live connections */
  int fd;
  enum conn_role role;
  bool dead;
  bool want_out; /* EPOLLOUT armed */
  /* Who reads an initiator link: the progress thread; a sync caller (link_drive);
   * or nobody while nothing is pending (parked: only a hang-up wakes the thread). */
  enum { RX_PROGRESS, RX_CALLER, RX_PARKED } rx;
  struct peer *peer; /* initiator side */
  char remote_name[WIRE_MAX_NAME + 1];
  /* receive */
  uint8_t *rxbuf;
  size_t rx_start, rx_end;
  uint8_t *pay_dst; /* payload streaming: destination, or NULL to discard */
  size_t pay_left;  /* bytes of the payload still to come */
  size_t pay_cur;   /* ... of which the current destination takes this many */
  /* A payload scattered over spans (staged units): the ones after the current. */
  const struct stage_seg *pay_span;
  uint32_t pay_nspan;
  bool pay_span_remote;         /* the spans' raddr (target) rather than laddr (initiator) */
  bool pay_discard;             /* drop the rest (the caller gave up, or the target refused) */
  struct chunk *pay_chunk;      /* initiator READ_RESP being received */
  struct hixl_mem_reg *pay_reg; /* target WRITE_REQ being received */
  uint64_t pay_seq;
  uint32_t pay_status;
  /* target: the STAGE_WRITE being received into tbuf, then scattered */
  bool pay_stage;
  struct stage_seg *tsegs;     /* raddr and len used */
  struct hixl_mem_reg **tregs; /* registrations the spans lie in, held while they fill */
  uint32_t tregs_held;
  uint32_t tsegs_n, tsegs_cap;
  uint8_t *tbuf;
  size_t tbuf_cap;
  struct ibv_mr *tbuf_mr; /* tbuf registered, once a STAGE_PULL / STAGE_PUSH needed it */
  bool stalled;           /* a STAGE_PULL / STAGE_PUSH is on the QP: no frame is read until it ends */
  uint64_t stall_seq;
  bool stall_pull;
  size_t stage_queued; /* bytes of STAGE_READ answers queued, not yet sent */
  /* send */
  struct txitem *txq_head, *txq_tail;
  /* initiator: chunks sent, in the order their responses will come */
  struct chunk *pend_head, *pend_tail;
  uint64_t next_seq;
  /* RDMA data path (initiator: posts; target: only holds the QP) */
  struct ibv_qp *qp;
  struct chunk *rq_head, *rq_tail;       /* waiting for a send-queue slot */
  struct chunk *rpend_head, *rpend_tail; /* posted, in completion order */
  uint32_t sq_used;                      /* WRs posted and not yet completed */
  uint32_t unsignaled;                   /* WRs posted since the last signaled one */
  /* shm data path (initiator: copies; target: only shows the probe) */
  struct shm_peer *shm;
  struct chunk *sq_head, *sq_tail;  /* async chunks waiting for the progress thread */
  uint64_t shm_turn;                /* progress-thread round that last served this link */
  uint8_t shm_nonce[CMA_NONCE_LEN]; /* target: what an initiator's probe must read */
  bool shm_nonce_set;
};

struct peer {
  struct peer *next;
  char name[ENGINE_NAME_MAX];          /* as given to Connect */
  char remote_name[WIRE_MAX_NAME + 1]; /* as the peer calls itself */
  struct conn *conn;                   /* NULL once the link broke */
  struct memtab rtab;                  /* the peer's registrations, as advertised */
  uint32_t caps;                       /* WIRE_CAP_* from its HELLO_ACK */
  char broken_why[256];
};

/* The staging pool ("BufferPool"): NUM buffers of SIZE bytes in one mapping, and
 * the staged units waiting for one, in order. Lock held for every field. */
struct stage_pool {
  uint8_t *mem;
  size_t mem_len;
  size_t buf_size; /* bytes per buffer */
  size_t unit;     /* bytes per staged unit: min(buf_size, WIRE_MAX_STAGE) */
  uint32_t num;
  struct ibv_mr *mr; /* with RDMA: the whole pool, for STAGE_PULL / STAGE_PUSH */
  uint8_t **free;
  uint32_t nfree;
  struct chunk *wait_head, *wait_tail;
  struct hixl_transfer_req *submitting; /* inside stage_submit: the request being submitted */
  struct hixl_stage_stats stats;
};

struct notify_item {
  char *name, *msg, *remote;
};

/* A service answering CALL frames (engine_ext.h). */
#define ENGINE_SERVICES 4
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
  pthread_t thread;
  struct memtab regs;
  struct peer *peers;
  struct conn *conns;
  struct conn *graveyard; /* killed, freed by the progress thread after a batch */
  struct rdma_dev rdma;   /* opened when the engine uses RDMA */
  bool has_rdma;
  bool shm_on;          /* Transport auto or shm, and this host's identity is known */
  struct cma_self self; /* boot id, pid and uid told to shm peers */
  size_t shm_queued;    /* async shm chunks waiting, on every link */
  uint32_t shm_copying; /* threads inside a copy, lock released; Finalize waits for 0 */
  uint64_t shm_round;   /* progress-thread rounds over links with shm work */
  struct stage_pool pool;
  struct ptrset reqs;       /* async requests the caller holds; under req_lock too */
  pthread_mutex_t req_lock; /* taken after lock, or alone to poll a WAITING request */
  struct notify_item *notifies;
  size_t n_notifies, cap_notifies;
  struct engine_service services[ENGINE_SERVICES]; /* CALL handlers, by service number */
  uint8_t scratch[64 << 10];                       /* sink for discarded payload */
};

/* link.c */
int link_start(struct HixlEngine *e, HixlStatus *st);
int link_watch_listener(struct HixlEngine *e);
void link_stop(struct HixlEngine *e);
struct conn *link_conn_new(struct HixlEngine *e, int fd, enum conn_role role);
int link_conn_watch(struct conn *c);
void link_conn_kill(struct conn *c, HixlStatus st, const char *why);
void link_flush(struct conn *c);
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
void link_broadcast_mem(struct HixlEngine *e, enum wire_type type, const struct hixl_mem_reg *r);
void link_chunk_end(struct chunk *ch, HixlStatus st, const char *why);
void link_req_maybe_free(struct hixl_transfer_req *r);
void link_drive(struct conn *c, struct hixl_transfer_req *r);
void link_unpark(struct conn *c);
bool link_alive(struct conn *c);
void link_pay_single(struct conn *c, uint8_t *dst, size_t len); /* a payload for dst (NULL: drop it) */
void link_pay_spans(struct conn *c, const struct stage_seg *s, uint32_t n, bool remote, size_t len,
                    bool discard); /* ... scattered over n spans, in order */
void link_rearm(struct conn *c);   /* tell epoll again what to watch (a target stalled or not) */
void link_resume(struct conn *c);  /* a stalled target link reads again: frames waiting first */
void link_take_pending(struct conn *c);
void link_free_graveyard(struct HixlEngine *e);
void link_peer_add_mem(struct peer *p, const struct wire_mem_entry *me);

/* stage.c */
HixlStatus stage_open(struct HixlEngine *e);
void stage_open_rdma(struct HixlEngine *e);                        /* after erdma_open: the pool's MR */
void stage_target_cq(struct conn *c, bool ok, const char *status); /* its STAGE_PULL / PUSH completed */
void stage_close(struct HixlEngine *e);
void stage_submit(struct hixl_transfer_req *r);     /* queue r's units for buffers, start what can */
void stage_pump(struct HixlEngine *e);              /* give free buffers to waiting units */
void stage_release(struct chunk *ch);               /* the unit ended: its buffer is free */
uint32_t stage_cancel(struct hixl_transfer_req *r); /* end units still waiting; returns how many */
void stage_conn_kill(struct conn *c, HixlStatus st, const char *msg);
bool stage_rdma_refused(struct conn *c,
                        struct chunk *ch); /* RESOURCE_EXHAUSTED for a PULL/PUSH: resent on the socket */
void stage_read_done(struct chunk *ch);    /* STAGE_READ data arrived: scatter it */
void stage_target_frame(struct conn *c, const struct wire_msg *m);
void stage_target_write_done(struct conn *c);
void stage_conn_free(struct conn *c);
void stage_target_release(struct conn *c); /* let go of the registrations a STAGE_WRITE fills */
HixlStatus stage_exhausted(struct HixlEngine *e, const char *fn, uint32_t units, const char *remote);
#define STAGE_TARGET_QUEUE (64u << 20) /* STAGE_READ answer bytes a target queues per link */

/* transport/rdma/xport_rdma.c */
HixlStatus erdma_open(struct HixlEngine *e);
void erdma_close(struct HixlEngine *e);
HixlStatus erdma_reg(struct HixlEngine *e, struct hixl_mem_reg *r);
uint32_t erdma_rkey(const struct hixl_mem_reg *r);
HixlStatus erdma_connect(struct HixlEngine *e, int fd, uint64_t deadline, const char *remote, struct peer *p,
                         struct ibv_qp **qp);
void erdma_target_connect(struct conn *c, const struct wire_msg *m);
void erdma_post(struct conn *c, size_t budget);
#define ERDMA_CALLER_POST (4u << 20)  /* bytes a submitting thread posts itself */
#define ERDMA_STEP        (64u << 20) /* bytes posted per completion event */
void erdma_on_cq(struct HixlEngine *e);
bool erdma_req_timeout(struct HixlEngine *e,
                       struct hixl_transfer_req *r); /* reset a link with r's WRs posted */
void erdma_conn_kill(struct conn *c, HixlStatus st, const char *msg);
size_t link_mem_entry_len(const struct hixl_mem_reg *r);
uint32_t link_caps(const struct HixlEngine *e); /* WIRE_CAP_* this engine advertises */

/* transport/shm/xport_shm.c */
HixlStatus eshm_open(struct HixlEngine *e);
uint32_t eshm_caps(const struct HixlEngine *e);
HixlStatus eshm_connect(struct HixlEngine *e, int fd, uint64_t deadline, const char *remote, struct peer *p,
                        struct shm_peer **out);
void eshm_peer_put(struct shm_peer *s);
void eshm_target_hello(struct conn *c, const struct wire_msg *m);
void eshm_run_sync(struct conn *c, struct hixl_transfer_req *r);
void eshm_async(struct conn *c, struct hixl_transfer_req *r);
bool eshm_progress(struct HixlEngine *e);
void eshm_conn_kill(struct conn *c, HixlStatus st, const char *msg);
#define ESHM_STEP        (16u << 20) /* bytes per copy step: deadlines are checked between steps */
#define ESHM_STEP_CHUNKS 1024u       /* chunks per progress-thread step */
#define ESHM_CALLER_COPY (64u << 10) /* an async request this small is copied by its caller */

#endif
