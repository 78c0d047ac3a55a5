/* rdma: the verbs side of the RDMA transport. One device context, protection domain,
 * completion queue and completion channel per engine; one RC queue pair per link on
 * each side. The control plane (TCP) carries the QP and memory-key exchange. */
#ifndef HIXL_RDMA_H
#define HIXL_RDMA_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ibv_context;
struct ibv_pd;
struct ibv_cq;
struct ibv_comp_channel;
struct ibv_qp;
struct ibv_mr;
struct ibv_wc;
struct rdma_cm_id;

struct rdma_dev {
  struct rdma_cm_id *cm_id; /* bound to the engine's IP: owns the device context */
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_comp_channel *chan;
  struct ibv_cq *cq;
  uint8_t port;
  int gid_index;
  uint8_t gid[16];
  int mtu;            /* enum ibv_mtu of the port */
  uint32_t max_qp_wr; /* send queue depth used for every QP */
  uint32_t max_rd_atom;
  uint64_t max_msg_sz;
  char name[64];
};

/* What one side tells the other to connect an RC QP. */
struct rdma_qp_info {
  uint32_t qpn;
  uint32_t psn;
  uint8_t gid[16];
  uint8_t mtu;
};

#define RDMA_CQ_DEPTH     4096
#define RDMA_SIGNAL_EVERY 16 /* selective signalling: every Nth WR, and the last posted */

/* Whether any RDMA device exists on this host (cheap; for skips and auto). */
bool rdma_available(void);

/* Open the device that owns ip (librdmacm bind), or the one named devname; choose the
 * GID (gid_index >= 0, or the RoCE v2 IPv4-mapped GID of ip). 0, or -1 with err. */
int rdma_dev_open(struct rdma_dev *d, const struct sockaddr_in *ip, const char *devname, int gid_index,
                  char *err, size_t errlen);
void rdma_dev_close(struct rdma_dev *d);

/* Register [addr, addr+len) for local write and remote read/write. */
struct ibv_mr *rdma_reg(struct rdma_dev *d, void *addr, size_t len, char *err, size_t errlen);
void rdma_dereg(struct ibv_mr *mr);
uint32_t rdma_mr_lkey(const struct ibv_mr *mr);
uint32_t rdma_mr_rkey(const struct ibv_mr *mr);

/* Create an RC QP in INIT and fill *local with what the peer needs. */
struct ibv_qp *rdma_qp_new(struct rdma_dev *d, struct rdma_qp_info *local, char *err, size_t errlen);
/* Move qp to RTR then RTS toward remote, with GRH traffic class and SL. */
int rdma_qp_connect(struct rdma_dev *d, struct ibv_qp *qp, const struct rdma_qp_info *local,
                    const struct rdma_qp_info *remote, uint8_t tc, uint8_t sl, char *err, size_t errlen);
void rdma_qp_free(struct ibv_qp *qp);
uint32_t rdma_qp_num(const struct ibv_qp *qp);
/* Read back the traffic class and SL the QP carries (ibv_query_qp). */
int rdma_qp_qos(struct ibv_qp *qp, uint8_t *tc, uint8_t *sl);

/* Post one RDMA WRITE (write=true) or READ. 0, or an errno value. */
int rdma_post(struct ibv_qp *qp, bool write, void *laddr, uint32_t len, uint32_t lkey, uint64_t raddr,
              uint32_t rkey, uint64_t wr_id, bool signaled);

/* Completion channel: the fd to watch, then re-arm and drain. */
int rdma_chan_fd(const struct rdma_dev *d);
int rdma_cq_rearm(struct rdma_dev *d); /* take the event, ack it, request the next */

/* One completion, flattened so callers need no verbs headers. */
struct rdma_wc {
  uint64_t wr_id;
  uint32_t qpn;
  int ok;
  const char *status; /* ibv_wc_status_str */
};
int rdma_cq_poll(struct rdma_dev *d, struct rdma_wc *out, int max);

#endif
