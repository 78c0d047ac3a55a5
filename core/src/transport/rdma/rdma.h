/* rdma: the verbs side of the RDMA transport. One device context, protection domain,
 * completion queue and completion channel per engine; one RC queue pair per link on
 * each side. The control plane (TCP) carries the QP and memory-key exchange. */
#ifndef HIXL_RDMA_H
#define HIXL_RDMA_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ibv_context;
struct ibv_pd;
struct ibv_cq;
struct ibv_comp_channel;
struct ibv_qp;
struct ibv_mr;
struct ibv_mw;
struct ibv_wc;

/* The completion queue's entries, counted without a device. A QP in error completes
 * every work request it holds, signaled or not (flushed), so each QP on the CQ holds
 * room for its whole send and receive queues from its creation; a QP destroyed keeps
 * its room (its flushed completions may still be in the CQ) until the CQ is next found
 * empty. The CQ cannot overrun: a QP without room is refused. */
struct rdma_cqb {
  uint32_t cap;  /* entries the CQ holds */
  uint32_t held; /* by live QPs */
  uint32_t dead; /* by QPs destroyed since the CQ was last found empty */
};
/* Entries to ask of a CQ on a device that allows max_cqe, at first: RDMA_CQ_FIRST at
 * most (it grows as QPs come: rdma_cq_grow). */
uint32_t rdma_cq_size(int max_cqe);
/* What to resize a CQ of cap entries to, for need entries, on a device that allows
 * max_cqe: twice cap or need, whichever is more, at most max_cqe; 0 when need is more
 * than max_cqe (the CQ cannot hold it). */
uint32_t rdma_cq_grow(uint32_t cap, uint64_t need, int max_cqe);
/* Take n entries for a new QP: false when they do not fit (nothing taken). */
bool rdma_cqb_take(struct rdma_cqb *b, uint32_t n);
/* A QP's n entries come back: dead (it was posted on: its completions may be in the
 * CQ), or at once (it never held a work request). */
void rdma_cqb_give(struct rdma_cqb *b, uint32_t n, bool dead);
/* The CQ was found empty by a poll begun when b->dead was dead: those are free. */
void rdma_cqb_empty(struct rdma_cqb *b, uint32_t dead);

struct rdma_dev {
  struct ibv_context *ctx; /* this engine's own (async events are per context) */
  struct ibv_pd *pd;
  struct ibv_comp_channel *chan;
  struct ibv_cq *cq;
  uint8_t port;
  int gid_index;
  uint8_t gid[16];
  int mtu;            /* enum ibv_mtu of the port */
  uint32_t max_qp_wr; /* send queue depth used for every QP */
  uint32_t qp_cqes;   /* CQ entries each QP on cq holds: its send and receive depths */
  int max_cqe;        /* the device's: cq grows up to it (ibv_resize_cq) */
  struct rdma_cqb cqb;
  pthread_mutex_t cq_lock; /* cqb's (a leaf: QPs are made with and without the engine's lock) */
  uint32_t max_rd_atom;
  uint64_t max_msg_sz;
  bool mw2;      /* binds type 2 memory windows (a QP's own windows: scoped memory) */
  int mw_bounds; /* enum rdma_mw_bounds: whether a window's key is held to the window */
  char name[64];
};

/* What one side tells the other to connect an RC QP. */
struct rdma_qp_info {
  uint32_t qpn;
  uint32_t psn;
  uint8_t gid[16];
  uint8_t mtu;
};

#define RDMA_CQ_FIRST                                                                                        \
  8191                       /* a CQ's entries at first (64 bytes each): 7 QPs of 1,024 WRs; a power of two  \
                              * less one, as providers round (rxe: 8,192 asked gives 16,383) */
#define RDMA_SIGNAL_EVERY 16 /* selective signalling: every Nth WR, and the last posted */
#define RDMA_RECV_DEPTH   16 /* receives an RC QP holds: a target's, for the tags of WRITEs with immediate */

/* Whether any RDMA device exists on this host (cheap; for skips and auto). */
bool rdma_available(void);

/* Open the device that owns ip (librdmacm bind), or the one named devname; choose the
 * GID (gid_index >= 0, or the RoCE v2 IPv4-mapped GID of ip). 0, or -1 with err. */
int rdma_dev_open(struct rdma_dev *d, const struct sockaddr_in *ip, const char *devname, int gid_index,
                  char *err, size_t errlen);
void rdma_dev_close(struct rdma_dev *d);

/* Where an MR's memory is when it is not host memory at its address: a dma-buf (device
 * memory, GPUDirect), whose byte off is the MR's first; the MR's addresses (iova) stay
 * the range's own, so work requests name it as they name host memory. */
struct rdma_dmabuf {
  int fd;
  uint64_t off;
};
/* Register [addr, addr+len) for local write, and remote read/write when remote: host
 * memory (db NULL; ibv_reg_mr), or db's (ibv_reg_dmabuf_mr). */
struct ibv_mr *rdma_reg(struct rdma_dev *d, void *addr, size_t len, bool remote, const struct rdma_dmabuf *db,
                        char *err, size_t errlen);
/* Register [addr, addr+len) for local write and for binding windows, no remote access
 * of its own: its key reaches nothing from the wire. db as rdma_reg's. */
struct ibv_mr *rdma_reg_window(struct rdma_dev *d, void *addr, size_t len, const struct rdma_dmabuf *db,
                               char *err, size_t errlen);
/* A type 2 memory window on d (NULL with err), bound by rdma_post_binds on one QP:
 * only that QP's peer reaches it, only inside its range, until rdma_mw_free. */
struct ibv_mw *rdma_mw_new(struct rdma_dev *d, char *err, size_t errlen);
void rdma_mw_free(struct ibv_mw *mw); /* invalidates it at once */
/* One bind: window mw over [addr, addr+len) of mr; rkey: the key the peer will use. */
struct rdma_bind {
  struct ibv_mw *mw;
  struct ibv_mr *mr;
  uint64_t addr, len;
  uint32_t rkey; /* out */
};
/* Post n binds on qp in one call (remote read and write), the last one signaled with
 * wr_id. 0, or -1 with errno set (then none was posted, or the QP is broken). */
int rdma_post_binds(struct ibv_qp *qp, struct rdma_bind *b, size_t n, uint64_t wr_id);
/* Whether d holds a type 2 window's key to the window, or lets it reach the whole MR
 * the window is bound over (soft-RoCE in Linux 6.1 checks only the MR's bounds). Asked
 * of the device itself: a window over one page of a two-page MR on a loopback pair of
 * QPs, read inside it (that must work), then on the other page. */
enum rdma_mw_bounds {
  RDMA_MWB_UNKNOWN = 0, /* not asked yet */
  RDMA_MWB_HELD,        /* the READ outside the window failed: remote access error */
  RDMA_MWB_MR,          /* it read the page: only the MR's bounds hold */
  RDMA_MWB_UNTOLD       /* the probe could not tell (no loopback, ...): taken as RDMA_MWB_MR */
};
/* 1: held (a remote access error), 0: the MR's bounds only, -1: could not tell (why). */
int rdma_probe_mw_bounds(struct rdma_dev *d, char *why, size_t cap);
/* d's node GUID (ibv_get_device_guid), as the device reports it (network order). */
uint64_t rdma_dev_guid(const struct rdma_dev *d);
void rdma_dereg(struct ibv_mr *mr);
uint32_t rdma_mr_lkey(const struct ibv_mr *mr);
uint32_t rdma_mr_rkey(const struct ibv_mr *mr);

/* Create an RC QP in INIT and fill *local with what the peer needs; refused (with err)
 * when d's CQ has no room for its queues (struct rdma_cqb). */
struct ibv_qp *rdma_qp_new(struct rdma_dev *d, struct rdma_qp_info *local, char *err, size_t errlen);
/* What every QP carries: GRH traffic class, SL, ack timeout (4.096 us * 2^timeout) and
 * retransmissions before a work request fails. */
struct rdma_qp_params {
  uint8_t tc, sl, timeout, retry;
};
/* Move qp to RTR then RTS toward remote, with *p. */
int rdma_qp_connect(struct rdma_dev *d, struct ibv_qp *qp, const struct rdma_qp_info *local,
                    const struct rdma_qp_info *remote, const struct rdma_qp_params *p, char *err,
                    size_t errlen);
void rdma_qp_free(struct ibv_qp *qp); /* its CQ entries come back once the CQ is drained */
uint32_t rdma_qp_num(const struct ibv_qp *qp);
/* Read back what the QP carries (ibv_query_qp). */
int rdma_qp_query(struct ibv_qp *qp, struct rdma_qp_params *out);

/* Post one RDMA WRITE (write=true) or READ. 0, or -1 with errno set (ibv_post_send's
 * answer, which it returns rather than sets). */
int rdma_post(struct ibv_qp *qp, bool write, void *laddr, uint32_t len, uint32_t lkey, uint64_t raddr,
              uint32_t rkey, uint64_t wr_id, bool signaled);

/* Post a zero-length RDMA WRITE with immediate data tag, signaled with wr_id: the
 * peer's QP takes one of its receives for it and completes that with the tag once
 * every WR posted before it here has been executed there (RC, in order). 0, or -1
 * with errno set. */
int rdma_post_tag(struct ibv_qp *qp, uint32_t tag, uint64_t wr_id);
/* Post one receive with no buffer (for a WRITE with immediate: nothing lands in it). */
int rdma_post_recv0(struct ibv_qp *qp, uint64_t wr_id);

/* Completion channel: the fd to watch, then re-arm and drain. */
int rdma_chan_fd(const struct rdma_dev *d);
int rdma_cq_rearm(struct rdma_dev *d); /* take the event, ack it, request the next */

/* Async events (the context's non-blocking fd): a port going down or up, the device
 * failing, a QP failing outside a completion. Flattened like completions. */
enum rdma_async_kind {
  RDMA_ASYNC_OTHER,
  RDMA_ASYNC_PORT_DOWN,
  RDMA_ASYNC_PORT_UP,
  RDMA_ASYNC_DEVICE_FATAL,
  RDMA_ASYNC_QP_FATAL,
  RDMA_ASYNC_CQ_ERR /* d's CQ overran: it is broken, and every QP on it */
};
struct rdma_async {
  enum rdma_async_kind kind;
  uint8_t port;     /* port events */
  uint32_t qpn;     /* RDMA_ASYNC_QP_FATAL */
  const char *what; /* ibv_event_type_str */
};
int rdma_async_fd(const struct rdma_dev *d);
/* Whether d's port is ACTIVE now: 1, 0, or -1 when it cannot be queried. */
int rdma_port_active(struct rdma_dev *d);
/* Take one event and ack it: 1, 0 when there is none, -1 on error (errno). */
int rdma_async_get(struct rdma_dev *d, struct rdma_async *out);

/* One completion, flattened so callers need no verbs headers. */
struct rdma_wc {
  uint64_t wr_id;
  uint32_t qpn;
  bool bind; /* a window's bind */
  bool recv; /* a receive, completed (a failed one is told apart by its wr_id) */
  bool imm;  /* ... taken by a WRITE with immediate data: its tag is in imm_data */
  uint32_t imm_data;
  int ok;
  const char *status; /* ibv_wc_status_str */
};
/* Take up to max completions off d's CQ (finding it empty frees the dead QPs' room). */
int rdma_cq_poll(struct rdma_dev *d, struct rdma_wc *out, int max);
/* Whether destroyed QPs still hold room on d's CQ (a poll that finds it empty frees it). */
bool rdma_cq_dead(struct rdma_dev *d);

/* ---- unreliable datagram (UD) queue pairs, address handles: RPing's probes ---- */

struct ibv_ah;

#define RDMA_GRH_LEN 40 /* a UD receive buffer starts with room for the GRH (RoCE v2: IPv4 at 20) */

/* A UD QP with its own completion channel (non-blocking fd) and CQ. */
struct rdma_ud {
  struct ibv_comp_channel *chan;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  uint32_t qpn, qkey;
  uint32_t max_send, max_recv; /* queue depths granted */
};

/* One UD completion, flattened (what ibv_create_ah_from_wc needs, and the sender). */
struct rdma_ud_wc {
  uint64_t wr_id;
  int ok;
  int flushed;        /* status IBV_WC_WR_FLUSH_ERR: the QP is in error or being torn down */
  const char *status; /* ibv_wc_status_str */
  bool recv;          /* a receive (else a send) */
  bool grh;           /* the receive buffer starts with a valid GRH */
  uint32_t byte_len;  /* receives: RDMA_GRH_LEN + the message */
  uint32_t src_qp;
  uint16_t slid, pkey_index;
  uint8_t sl, dlid_path_bits;
};

/* Whether librdmacm finds an RDMA device that owns ip (bind and let go). */
bool rdma_ip_has_device(const struct sockaddr_in *ip);
/* Bytes one message may carry on d's port (the active MTU). */
uint32_t rdma_mtu_bytes(const struct rdma_dev *d);
/* Register [addr, addr+len) for local access only (send and receive buffers). */
struct ibv_mr *rdma_reg_local(struct rdma_dev *d, void *addr, size_t len, char *err, size_t errlen);

/* A UD QP on d, in RTS, with its own CQ (max_send + max_recv) and channel; depths are
 * capped at what d allows. 0, or -1 with err. */
int rdma_ud_open(struct rdma_dev *d, struct rdma_ud *u, uint32_t qkey, uint32_t max_send, uint32_t max_recv,
                 char *err, size_t errlen);
/* Destroy the QP alone (first in a teardown: no DMA and no completion after it). */
void rdma_ud_destroy_qp(struct rdma_ud *u);
/* Destroy what is left: the QP if still there, the CQ, the channel. */
void rdma_ud_close(struct rdma_ud *u);
/* Post one receive / one signaled send. 0, or an errno value. */
int rdma_ud_post_recv(struct rdma_ud *u, void *addr, uint32_t len, uint32_t lkey, uint64_t wr_id);
int rdma_ud_post_send(struct rdma_ud *u, struct ibv_ah *ah, uint32_t remote_qpn, uint32_t remote_qkey,
                      const void *addr, uint32_t len, uint32_t lkey, uint64_t wr_id);
int rdma_ud_chan_fd(const struct rdma_ud *u);
/* Take every pending channel event, ack it, request the next; then poll the CQ. */
int rdma_ud_rearm(struct rdma_ud *u);
int rdma_ud_poll(struct rdma_ud *u, struct rdma_ud_wc *out, int max);

/* An address handle toward gid from d's GID, GRH traffic class tc, service level sl. */
struct ibv_ah *rdma_ah_new(struct rdma_dev *d, const uint8_t gid[16], uint8_t tc, uint8_t sl, char *err,
                           size_t errlen);
/* The address handle that answers a received message (ibv_create_ah_from_wc: back to
 * its sender, with the traffic class and hop limit its GRH carried). NULL on error. */
struct ibv_ah *rdma_ah_from_wc(struct rdma_dev *d, const struct rdma_ud_wc *wc, const void *grh);
void rdma_ah_free(struct ibv_ah *ah);
/* What the 40 bytes in front of a UD message say: a RoCE v2 IPv4 header at offset 20
 * (GIDs the IPv4-mapped addresses, tc the TOS byte, hop_limit the TTL), or an IPv6 /
 * IB GRH. */
struct rdma_grh_info {
  uint8_t sgid[16];    /* the sender */
  uint8_t dgid[16];    /* this side, as the sender addressed it */
  uint32_t flow_label; /* IPv6 only; 0 */
  uint8_t tc;
  uint8_t hop_limit;
};
/* Returns 4 or 6 (which header it was), or -1 when it is neither. */
int rdma_grh_read(const uint8_t *grh, struct rdma_grh_info *out);

#endif
