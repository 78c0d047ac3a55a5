/* rping internals shared by rping.c (the API, the registry, the target list),
 * rping_io.c (UDP sockets, the AddTarget handshake), rping_responder.c (the responder,
 * and in mode ROCE the context's device, memory and UD QP) and rping_prober.c (the
 * batch prober), over UDP sockets or, in mode ROCE, RoCE UD queue pairs. */
#ifndef HIXL_RPING_INT_H
#define HIXL_RPING_INT_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "hixl/hccn_rping.h"
#include "transport/rdma/rdma.h"
#include "rping/rping_wire.h"

#define RP_NAME_LEN 24 /* "255.255.255.255:65535" */

/* Mode ROCE. Every context's memory is one registered region: the responder's
 * receive slots, then the batch area of attr->bufferSize (hcomm's contract: a
 * 2048-byte slot per probe of a batch, and at least one more). */
#define RP_QKEY         0x11111111u /* Q_Key of every RPing UD queue pair */
#define RP_SLOT         HCCN_RPING_BUFFER_PER_PACKET
#define RP_RESP_SLOTS   256u  /* the responder's receives (and answers in flight) */
#define RP_BATCH_RECV   1024u /* most receives a batch posts */
#define RP_BATCH_SEND   64u   /* most probes a batch has in flight */
#define RP_AH_CACHE     16    /* the responder keeps the AHs of this many recent senders */
#define RP_HS_NOT_ROCE  (-1)  /* rp_handshake err[]: answered without a RoCE endpoint */
#define RP_HS_SMALL_MTU (-2)  /* rp_handshake err[]: its MTU cannot carry the target's probes */
#define RP_HS_BAD_GID   (-3)  /* rp_handshake err[]: its endpoint's GID is not the target's address */
#define RP_ADD_FULL     (-4)  /* AddTarget: answered, but a concurrent AddTarget filled the context */

#define RP_WR_SEND  (1ull << 32) /* wr_id: a send (else a receive); the low 32 bits are the slot */
#define RP_WC_BATCH 16           /* completions taken by one poll */
/* Datagrams (or completions) a loop takes before it looks at its deadline and its stop
 * again: a flood faster than one thread answers must not keep it from either. */
#define RP_DRAIN_MAX 256

/* A target as the context keeps it (copied from HccnRpingTargetInfo). */
struct rp_target {
  struct in_addr dst; /* the key: duplicates by dstIp keep the first */
  uint16_t port;      /* the target's responder */
  uint16_t src_port;  /* 0: any */
  uint8_t tc;         /* IP TOS byte */
  uint8_t sl;
  uint16_t payload_len;
  uint8_t payload[RP_MAX_PAYLOAD];
  char name[RP_NAME_LEN]; /* "ip:port", for messages */
  struct rp_ep ep;        /* ROCE: the responder's UD endpoint, from the handshake */
};

/* An address handle the responder keeps for answers to one sender: made from the
 * first probe's completion (ibv_create_ah_from_wc) and used again for probes whose GRH
 * and SL are the same, so it has exactly the attributes a new one would have. */
struct rp_ah_ent {
  struct ibv_ah *ah;        /* NULL: free */
  struct rdma_grh_info grh; /* the key: sender, receiver, tc, hop limit, flow label ... */
  uint16_t slid;            /* ... and what the completion adds */
  uint8_t sl;
  uint32_t busy; /* answers in flight with it */
  uint64_t used; /* for eviction: the least recently used idle entry goes */
};

/* Per-target figures of a batch, in nanoseconds; and the traffic class seen. */
struct rp_tally {
  uint32_t tx, rx;
  uint64_t rtt_sum, rtt_min, rtt_max;
  uint8_t set_tc, set_sl;      /* what the probes were sent with (ROCE: the AH's attributes) */
  uint8_t echo_tc, here_tc;    /* of the last answer counted: the tc the responder saw on the
                                * probe (the answer's tos), and the tc the answer arrived with */
  uint32_t echo_bad, here_bad; /* answers counted whose echo_tc / here_tc was not set_tc */
};

/* One batch: a snapshot of the targets at BatchPingStart and the prober thread. */
struct rp_batch {
  struct rp_ctx *ctx;
  pthread_t thread;
  int stop_efd; /* written by Stop / Deinit */
  uint32_t id;  /* in every PING; answers of other batches are ignored */
  uint32_t pkt_num, interval_ms, timeout_ms;
  size_t n;               /* targets in the batch */
  struct rp_target *t;    /* [n] */
  struct rp_tally *tally; /* [n] */
  uint64_t *sent_ns;      /* [n * pkt_num]: send time, 0 not sent, RP_ANSWERED answered */
  int *sock_of;           /* [n]: index into socks */
  int *socks;             /* one per distinct source port */
  size_t nsocks;
  bool done; /* under ctx->lock: the tallies are final */
  /* ROCE: a UD QP of the batch's own, an AH per target, slots in the batch area */
  struct rdma_ud ud;
  struct ibv_ah **ah;    /* [n] */
  uint32_t nrecv, nsend; /* receive slots (recv_len bytes), then send slots (RP_SLOT bytes) */
  uint32_t recv_len;
  uint32_t *send_probe; /* [nsend]: target * pkt_num + seq in flight, or UINT32_MAX */
  uint32_t *free_send;  /* [nsend]: a stack of free send slots */
  uint32_t nfree;
  uint64_t sent, answered; /* prober thread only */
  bool stopping;           /* prober thread only: Stop or Deinit seen */
  bool qp_dead;            /* prober thread only: the QP failed; nothing more is sent */
  bool roce_more;          /* prober thread only: the last CQ drain stopped at RP_DRAIN_MAX */
};
#define RP_ANSWERED UINT64_MAX

struct rp_ctx {
  struct rp_ctx *next; /* registry list, under the registry lock */
  uintptr_t handle;    /* what the caller holds; never reused */
  unsigned refs;       /* calls in progress, under the registry lock */
  bool ready;          /* Init finished */
  bool closing;        /* Deinit started: no new calls */
  int close_efd;       /* written once by Deinit: wakes the responder and AddTarget waits */

  struct in_addr addr; /* the device's address */
  char addr_str[INET_ADDRSTRLEN];
  uint16_t port; /* responder */
  uint32_t npu_num, buffer_size, sl, tc;
  uint32_t add_timeout_ms;

  int resp_fd;
  pthread_t resp_thread;

  /* mode ROCE (roce true); the responder thread alone uses resp_ud and resp_ah */
  bool roce;
  struct rdma_dev dev;
  uint8_t *mem; /* RP_RESP_SLOTS x resp_len, then the batch area (buffer_size) */
  size_t mem_len;
  uint32_t resp_len; /* bytes of a receive slot: RDMA_GRH_LEN + MTU, in whole RP_SLOTs */
  struct ibv_mr *mr;
  uint32_t lkey;
  struct rdma_ud resp_ud;
  struct ibv_ah **resp_ah; /* [RP_RESP_SLOTS]: an answer's own AH (not kept), freed once it left */
  int16_t *resp_ent;       /* [RP_RESP_SLOTS]: the kept AH an answer uses (ah_cache index), or -1 */
  struct rp_ah_ent ah_cache[RP_AH_CACHE];
  uint64_t ah_clock;
  struct rp_ep ep; /* what HELLO_ACK tells a ROCE client */

  pthread_mutex_t run_lock; /* BatchPingStart and Stop: a batch's teardown ends before the next starts */
  pthread_mutex_t lock;     /* targets, ntargets, cap, batch, next_batch_id */
  struct rp_target *targets;
  size_t ntargets, cap;
  struct rp_batch *batch; /* active from BatchPingStart until Stop */
  uint32_t next_batch_id;
};

/* Record why the current call fails (HixlGetLastErrorMessage) and return r. */
HccnResult rp_fail(HccnResult r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Bind a UDP socket to addr:port (non-blocking, close-on-exec, IP_RECVTOS);
 * -1 with the reason recorded. */
int rp_udp_socket(struct in_addr addr, uint16_t port, const char *what);
/* rping_io.c's UDP helpers, for the responder and the prober. sendmsg one datagram
 * with its IP TOS byte. */
ssize_t rp_send_tos(int fd, const void *buf, size_t len, const struct sockaddr_in *to, int tos);
/* recvmsg one datagram; *tos gets its IP TOS byte. Returns the length, -1 when the
 * socket is drained (or failed), -2 for a datagram too long for buf (dropped). */
ssize_t rp_recv_tos(int fd, uint8_t *buf, size_t cap, struct sockaddr_in *from, uint8_t *tos);
/* Whether from is t's responder; t's responder as a socket address. */
bool rp_from_target(const struct sockaddr_in *from, const struct rp_target *t);
struct sockaddr_in rp_target_sa(const struct rp_target *t);
/* Start / the body of the responder thread on ctx->resp_fd. */
void *rp_responder_main(void *arg);
/* Handshake with t[0..n): ok[i] set for each that answered before deadline_ns (ROCE:
 * with a usable endpoint whose GID is t[i]'s address, stored in t[i].ep), err[i] the last errno of sending to
 * it (0: none) or RP_HS_*. HCCN_E_FAIL when the context closes meanwhile or no socket could be made. */
HccnResult rp_handshake(struct rp_ctx *ctx, struct rp_target *t, size_t n, uint64_t deadline_ns, bool *ok,
                        int *err);
/* Mode ROCE: open the device that owns ctx->addr, the memory, the responder's UD QP
 * and its receives; undone by rp_roce_close (after the responder thread ended). */
HccnResult rp_roce_open(struct rp_ctx *ctx);
void rp_roce_close(struct rp_ctx *ctx);
/* Bytes of payload a ROCE probe may carry from this context (its MTU less the header). */
uint32_t rp_roce_max_payload(const struct rp_ctx *ctx);
/* Sockets and the prober thread of b (filled by the caller); ladder inside. */
HccnResult rp_batch_run(struct rp_batch *b);
/* Stop b's thread if it still runs, join it and free b. */
void rp_batch_free(struct rp_batch *b);
/* Free b and the arrays BatchPingStart gave it, nothing else (no thread, socket or
 * QP left); NULL is a no-op. */
void rp_batch_release(struct rp_batch *b);

/* For tests: the traffic class and service level a target of the active batch was
 * probed with and saw (the tally fields above), once the batch is done. HCCN_E_AGAIN
 * while it runs; HCCN_E_PARA when dst_ip is not in the batch. */
struct rp_qos_seen {
  bool roce;
  uint8_t set_tc, set_sl, echo_tc, here_tc;
  uint32_t rx, echo_bad, here_bad;
};
HccnResult rp_debug_qos(HccnRpingCtx h, const char *dst_ip, struct rp_qos_seen *out);

#endif
