/* rping internals shared by rping.c (the API, the registry, the target list) and
 * rping_io.c (the responder, the AddTarget handshake and the batch prober). */
#ifndef HIXL_RPING_INT_H
#define HIXL_RPING_INT_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hixl/hccn_rping.h"
#include "rping_wire.h"

#define RP_NAME_LEN 24 /* "255.255.255.255:65535" */

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
};

/* Per-target figures of a batch, in nanoseconds. */
struct rp_tally {
  uint32_t tx, rx;
  uint64_t rtt_sum, rtt_min, rtt_max;
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

  pthread_mutex_t lock; /* targets, ntargets, cap, batch, next_batch_id */
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
/* Start / the body of the responder thread on ctx->resp_fd. */
void *rp_responder_main(void *arg);
/* Handshake with t[0..n): ok[i] set for each that answered before deadline_ns, err[i]
 * the last errno of sending to it (0: none). HCCN_E_FAIL when the context closes
 * meanwhile or no socket could be made. */
HccnResult rp_handshake(struct rp_ctx *ctx, const struct rp_target *t, size_t n, uint64_t deadline_ns,
                        bool *ok, int *err);
/* Sockets and the prober thread of b (filled by the caller); ladder inside. */
HccnResult rp_batch_run(struct rp_batch *b);
/* Stop b's thread if it still runs, join it and free b. */
void rp_batch_free(struct rp_batch *b);

#endif
