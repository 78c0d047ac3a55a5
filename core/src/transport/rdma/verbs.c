/* rdma: device discovery, memory registration, RC queue pairs and completions. */
#include "transport/rdma/rdma.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "util/log.h"
#include "util/sock.h"

bool rdma_available(void) {
  int n = 0;
  struct ibv_device **l = ibv_get_device_list(&n);
  if (l) ibv_free_device_list(l);
  return n > 0;
}

static void ipv4_mapped(const struct sockaddr_in *ip, uint8_t gid[16]) {
  memset(gid, 0, 16);
  gid[10] = gid[11] = 0xff;
  memcpy(gid + 12, &ip->sin_addr, 4);
}

/* The RoCE v2 GID whose address is ip's IPv4-mapped form, or -1. */
static int find_gid(struct ibv_context *ctx, uint8_t port, int tbl_len, const struct sockaddr_in *ip) {
  uint8_t want[16];
  int fallback = -1;
  ipv4_mapped(ip, want);
  for (int i = 0; i < tbl_len; i++) {
    struct ibv_gid_entry ent;
    if (ibv_query_gid_ex(ctx, port, (uint32_t)i, &ent, 0) != 0) continue;
    if (memcmp(ent.gid.raw, want, 16) != 0) continue;
    if (ent.gid_type == IBV_GID_TYPE_ROCE_V2) return i;
    if (fallback < 0) fallback = i;
  }
  return fallback;
}

uint32_t rdma_cq_size(int max_cqe) {
  return max_cqe <= 0 ? 1 : (uint32_t)max_cqe < RDMA_CQ_FIRST ? (uint32_t)max_cqe : RDMA_CQ_FIRST;
}

uint32_t rdma_cq_grow(uint32_t cap, uint64_t need, int max_cqe) {
  if (max_cqe <= 0 || need > (uint64_t)max_cqe) return 0;
  uint64_t want = (uint64_t)cap * 2 > need ? (uint64_t)cap * 2 : need;
  return want < (uint64_t)max_cqe ? (uint32_t)want : (uint32_t)max_cqe;
}

bool rdma_cqb_take(struct rdma_cqb *b, uint32_t n) {
  if ((uint64_t)b->held + b->dead + n > b->cap) return false;
  b->held += n;
  return true;
}

void rdma_cqb_give(struct rdma_cqb *b, uint32_t n, bool dead) {
  b->held -= n;
  if (dead) b->dead += n;
}

void rdma_cqb_empty(struct rdma_cqb *b, uint32_t dead) { b->dead -= dead; }

int rdma_dev_open(struct rdma_dev *d, const struct sockaddr_in *ip, const char *devname, int gid_index,
                  char *err, size_t errlen) {
  struct ibv_port_attr pa;
  struct ibv_device_attr da;
  char ipstr[INET_ADDRSTRLEN];
  memset(d, 0, sizeof(*d));
  inet_ntop(AF_INET, &ip->sin_addr, ipstr, sizeof(ipstr));
  if (devname) {
    int n = 0;
    struct ibv_device **l = ibv_get_device_list(&n);
    for (int i = 0; l && i < n && !d->ctx; i++)
      if (strcmp(ibv_get_device_name(l[i]), devname) == 0) d->ctx = ibv_open_device(l[i]);
    if (l) ibv_free_device_list(l);
    if (!d->ctx) {
      snprintf(err, errlen, "RDMA device \"%s\" not found or cannot be opened (%d devices here)", devname, n);
      return -1;
    }
    d->port = 1;
  } else {
    /* The device that owns the engine's IP, as librdmacm resolves it. The context is
     * this engine's own, not librdmacm's (which every engine of the process shares):
     * its async events (port down, QP fatal) are then this engine's alone. */
    struct sockaddr_in sa = *ip;
    struct rdma_cm_id *id = NULL;
    sa.sin_port = 0;
    if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) != 0) {
      snprintf(err, errlen, "rdma_create_id: %s (is librdmacm able to open /dev/infiniband/rdma_cm?)",
               strerror(errno));
      return -1;
    }
    if (rdma_bind_addr(id, (struct sockaddr *)&sa) != 0 || !id->verbs) {
      snprintf(err, errlen,
               "no RDMA device owns %s (rdma_bind_addr: %s); looked for a RoCE/IB device with that "
               "address, or name one with option RdmaDevice",
               ipstr, errno ? strerror(errno) : "no verbs context");
      rdma_destroy_id(id);
      return -1;
    }
    d->ctx = ibv_open_device(id->verbs->device);
    d->port = id->port_num ? id->port_num : 1;
    if (!d->ctx)
      snprintf(err, errlen, "%s: ibv_open_device: %s", ibv_get_device_name(id->verbs->device),
               strerror(errno));
    rdma_destroy_id(id);
    if (!d->ctx) return -1;
  }
  {
    int fl = fcntl(d->ctx->async_fd, F_GETFL);
    if (fl < 0 || fcntl(d->ctx->async_fd, F_SETFL, fl | O_NONBLOCK) != 0) {
      snprintf(err, errlen, "%s: async event fd: %s", ibv_get_device_name(d->ctx->device), strerror(errno));
      goto close_ctx;
    }
  }
  snprintf(d->name, sizeof(d->name), "%s", ibv_get_device_name(d->ctx->device));
  if (ibv_query_device(d->ctx, &da) != 0 || ibv_query_port(d->ctx, d->port, &pa) != 0) {
    snprintf(err, errlen, "%s: cannot query device or port %u: %s", d->name, d->port, strerror(errno));
    goto close_ctx;
  }
  if (pa.state != IBV_PORT_ACTIVE) {
    snprintf(err, errlen, "%s port %u is not ACTIVE (state %d)", d->name, d->port, (int)pa.state);
    goto close_ctx;
  }
  d->gid_index = gid_index >= 0 ? gid_index : find_gid(d->ctx, d->port, pa.gid_tbl_len, ip);
  if (d->gid_index < 0) {
    snprintf(err, errlen, "%s port %u has no GID for %s (set RdmaGidIndex to choose one)", d->name, d->port,
             ipstr);
    goto close_ctx;
  }
  union ibv_gid gid;
  if (ibv_query_gid(d->ctx, d->port, d->gid_index, &gid) != 0) {
    snprintf(err, errlen, "%s: GID index %d cannot be read", d->name, d->gid_index);
    goto close_ctx;
  }
  memcpy(d->gid, gid.raw, 16);
  d->mtu = pa.active_mtu;
  d->max_qp_wr = da.max_qp_wr < 1024 ? (uint32_t)da.max_qp_wr : 1024;
  d->max_rd_atom = da.max_qp_rd_atom < 16 ? (uint32_t)da.max_qp_rd_atom : 16;
  d->max_msg_sz = pa.max_msg_sz;
  d->mw2 = (da.device_cap_flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0;
  d->pd = ibv_alloc_pd(d->ctx);
  if (!d->pd) {
    snprintf(err, errlen, "%s: ibv_alloc_pd: %s", d->name, strerror(errno));
    goto close_ctx;
  }
  d->chan = ibv_create_comp_channel(d->ctx);
  if (!d->chan) {
    snprintf(err, errlen, "%s: ibv_create_comp_channel: %s", d->name, strerror(errno));
    goto free_pd;
  }
  uint32_t cqe = rdma_cq_size(da.max_cqe);
  d->cq = ibv_create_cq(d->ctx, (int)cqe, NULL, d->chan, 0);
  if (!d->cq || ibv_req_notify_cq(d->cq, 0) != 0) {
    snprintf(err, errlen, "%s: ibv_create_cq(%u): %s", d->name, cqe, strerror(errno));
    goto destroy_cq;
  }
  d->qp_cqes = d->max_qp_wr + RDMA_RECV_DEPTH;
  d->max_cqe = da.max_cqe;
  d->cqb = (struct rdma_cqb){.cap = d->cq->cqe > 0 ? (uint32_t)d->cq->cqe : 0};
  if (pthread_mutex_init(&d->cq_lock, NULL) != 0) {
    snprintf(err, errlen, "%s: pthread_mutex_init failed", d->name);
    goto destroy_cq;
  }
  log_info("rdma: %s port %u GID index %d for %s, mtu %d, %u WRs per QP, CQ of %u entries (%u QPs)", d->name,
           d->port, d->gid_index, ipstr, 128 << d->mtu, d->max_qp_wr, d->cqb.cap, d->cqb.cap / d->qp_cqes);
  return 0;
destroy_cq:
  if (d->cq) ibv_destroy_cq(d->cq);
  ibv_destroy_comp_channel(d->chan);
free_pd:
  ibv_dealloc_pd(d->pd);
close_ctx:
  ibv_close_device(d->ctx);
  memset(d, 0, sizeof(*d));
  return -1;
}

void rdma_dev_close(struct rdma_dev *d) {
  if (!d->ctx) return;
  pthread_mutex_destroy(&d->cq_lock);
  ibv_destroy_cq(d->cq);
  ibv_destroy_comp_channel(d->chan);
  ibv_dealloc_pd(d->pd);
  ibv_close_device(d->ctx);
  memset(d, 0, sizeof(*d));
}

static struct ibv_mr *reg_access(struct rdma_dev *d, void *addr, size_t len, int access,
                                 const struct rdma_dmabuf *db, char *err, size_t errlen) {
  struct ibv_mr *mr = db ? ibv_reg_dmabuf_mr(d->pd, db->off, len, (uintptr_t)addr, db->fd, access)
                         : ibv_reg_mr(d->pd, addr, len, access);
  if (mr) return mr;
  int e = errno;
  if (db) { /* nothing of host memory is pinned: the device, its driver or the kernel refused */
    snprintf(err, errlen, "ibv_reg_dmabuf_mr of %zu bytes on %s failed: %s", len, d->name, strerror(e));
    return NULL;
  }
  struct rlimit rl;
  if ((e == ENOMEM || e == EPERM || e == EFAULT) && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 &&
      rl.rlim_cur != RLIM_INFINITY)
    snprintf(
        err, errlen,
        "ibv_reg_mr of %zu bytes on %s failed (%s): the locked-memory limit (RLIMIT_MEMLOCK) is %llu bytes; "
        "raise it with `ulimit -l unlimited` or LimitMEMLOCK=infinity for a service",
        len, d->name, strerror(e), (unsigned long long)rl.rlim_cur);
  else
    snprintf(err, errlen, "ibv_reg_mr of %zu bytes on %s failed: %s", len, d->name, strerror(e));
  return NULL;
}

struct ibv_mr *rdma_reg(struct rdma_dev *d, void *addr, size_t len, bool remote, const struct rdma_dmabuf *db,
                        char *err, size_t errlen) {
  int access = IBV_ACCESS_LOCAL_WRITE;
  if (remote)
    access |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  else if (d->mw2)
    access |= IBV_ACCESS_MW_BIND; /* no remote access of its own: windows over it (scoped memory) */
  return reg_access(d, addr, len, access, db, err, errlen);
}

struct ibv_mr *rdma_reg_window(struct rdma_dev *d, void *addr, size_t len, const struct rdma_dmabuf *db,
                               char *err, size_t errlen) {
  return reg_access(d, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, db, err, errlen);
}

struct ibv_mw *rdma_mw_new(struct rdma_dev *d, char *err, size_t errlen) {
  struct ibv_mw *mw = ibv_alloc_mw(d->pd, IBV_MW_TYPE_2);
  if (!mw) snprintf(err, errlen, "%s: ibv_alloc_mw(type 2): %s", d->name, strerror(errno));
  return mw;
}

void rdma_mw_free(struct ibv_mw *mw) {
  if (mw && ibv_dealloc_mw(mw) != 0) log_error("rdma: ibv_dealloc_mw: %s", strerror(errno));
}

int rdma_post_binds(struct ibv_qp *qp, struct rdma_bind *b, size_t n, uint64_t wr_id) {
  struct ibv_send_wr *wr = calloc(n ? n : 1, sizeof(*wr)), *bad;
  if (!wr) {
    errno = ENOMEM;
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    wr[i].wr_id = wr_id;
    wr[i].opcode = IBV_WR_BIND_MW;
    wr[i].send_flags = i + 1 == n ? IBV_SEND_SIGNALED : 0;
    wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
    wr[i].bind_mw.mw = b[i].mw;
    wr[i].bind_mw.rkey = ibv_inc_rkey(b[i].mw->rkey); /* a new key each bind: an old one reaches nothing */
    wr[i].bind_mw.bind_info.mr = b[i].mr;
    wr[i].bind_mw.bind_info.addr = b[i].addr;
    wr[i].bind_mw.bind_info.length = b[i].len;
    wr[i].bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    b[i].rkey = wr[i].bind_mw.rkey;
  }
  int rc = n ? ibv_post_send(qp, wr, &bad) : 0;
  free(wr);
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  return 0;
}

void rdma_dereg(struct ibv_mr *mr) {
  int rc = mr ? ibv_dereg_mr(mr) : 0;
  if (rc != 0) log_error("rdma: ibv_dereg_mr: %s (the MR stays registered)", strerror(rc));
}
uint32_t rdma_mr_lkey(const struct ibv_mr *mr) { return mr->lkey; }
uint32_t rdma_mr_rkey(const struct ibv_mr *mr) { return mr->rkey; }

/* A QP on d's own CQ holds room there (qp_context: d); the probe's are on a CQ of its own. */
static struct ibv_qp *qp_new_on(struct rdma_dev *d, struct ibv_cq *cq, struct rdma_qp_info *local, char *err,
                                size_t errlen) {
  bool counted = cq == d->cq;
  if (counted) {
    pthread_mutex_lock(&d->cq_lock);
    bool room = rdma_cqb_take(&d->cqb, d->qp_cqes);
    /* Full: the CQ grows, up to the device's max_cqe (under cq_lock: one QP at a time;
     * the progress thread's polls go on, the provider serializes them with the resize). */
    uint32_t want =
        room ? 0 : rdma_cq_grow(d->cqb.cap, (uint64_t)d->cqb.held + d->cqb.dead + d->qp_cqes, d->max_cqe);
    if (want && ibv_resize_cq(d->cq, (int)want) == 0 && d->cq->cqe > 0) {
      d->cqb.cap = (uint32_t)d->cq->cqe;
      room = rdma_cqb_take(&d->cqb, d->qp_cqes);
    }
    struct rdma_cqb b = d->cqb;
    pthread_mutex_unlock(&d->cq_lock);
    if (!room) {
      snprintf(
          err, errlen,
          "%s: no room for another QP on its completion queue (%u entries, the device allows %d: %u held "
          "by %u QPs, %u by QPs destroyed whose completions are not yet taken; %u each): fewer links on "
          "this device",
          d->name, b.cap, d->max_cqe, b.held, b.held / d->qp_cqes, b.dead, d->qp_cqes);
      return NULL;
    }
  }
  struct ibv_qp_init_attr ia = {.qp_context = counted ? d : NULL,
                                .send_cq = cq,
                                .recv_cq = cq,
                                .cap = {.max_send_wr = d->max_qp_wr,
                                        .max_recv_wr = RDMA_RECV_DEPTH,
                                        .max_send_sge = 1,
                                        .max_recv_sge = 1},
                                .qp_type = IBV_QPT_RC,
                                .sq_sig_all = 0};
  struct ibv_qp *qp = ibv_create_qp(d->pd, &ia);
  if (!qp) {
    snprintf(err, errlen, "%s: ibv_create_qp: %s", d->name, strerror(errno));
    goto give;
  }
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                          .pkey_index = 0,
                          .port_num = d->port,
                          .qp_access_flags =
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    snprintf(err, errlen, "%s: QP 0x%x to INIT: %s", d->name, qp->qp_num, strerror(errno));
    ibv_destroy_qp(qp);
    goto give;
  }
  local->qpn = qp->qp_num;
  local->psn = (uint32_t)random() & 0xffffff;
  memcpy(local->gid, d->gid, 16);
  local->mtu = (uint8_t)d->mtu;
  return qp;
give: /* no work request was posted on it: its room comes back at once */
  if (counted) {
    pthread_mutex_lock(&d->cq_lock);
    rdma_cqb_give(&d->cqb, d->qp_cqes, false);
    pthread_mutex_unlock(&d->cq_lock);
  }
  return NULL;
}

struct ibv_qp *rdma_qp_new(struct rdma_dev *d, struct rdma_qp_info *local, char *err, size_t errlen) {
  return qp_new_on(d, d->cq, local, err, errlen);
}

int rdma_qp_connect(struct rdma_dev *d, struct ibv_qp *qp, const struct rdma_qp_info *local,
                    const struct rdma_qp_info *remote, const struct rdma_qp_params *p, char *err,
                    size_t errlen) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
                          .path_mtu = (enum ibv_mtu)(remote->mtu < d->mtu ? remote->mtu : d->mtu),
                          .dest_qp_num = remote->qpn,
                          .rq_psn = remote->psn,
                          .max_dest_rd_atomic = (uint8_t)d->max_rd_atom,
                          .min_rnr_timer = 12};
  a.ah_attr.is_global = 1;
  memcpy(a.ah_attr.grh.dgid.raw, remote->gid, 16);
  a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.grh.traffic_class = p->tc; /* RdmaTrafficClass: the IP TOS byte on RoCE v2 */
  a.ah_attr.sl = p->sl;                /* RdmaServiceLevel */
  a.ah_attr.port_num = d->port;
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
    snprintf(err, errlen, "%s: QP 0x%x to RTR (peer QP 0x%x): %s", d->name, qp->qp_num, remote->qpn,
             strerror(errno));
    return -1;
  }
  struct ibv_qp_attr b = {.qp_state = IBV_QPS_RTS,
                          .timeout = p->timeout, /* RdmaTimeout */
                          .retry_cnt = p->retry, /* RdmaRetryCount */
                          .rnr_retry = 7,
                          .sq_psn = local->psn,
                          .max_rd_atomic = (uint8_t)d->max_rd_atom};
  if (ibv_modify_qp(qp, &b,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                        IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
    snprintf(err, errlen, "%s: QP 0x%x to RTS: %s", d->name, qp->qp_num, strerror(errno));
    return -1;
  }
  return 0;
}

void rdma_qp_free(struct ibv_qp *qp) {
  if (!qp) return;
  struct rdma_dev *d = qp->qp_context;
  if (ibv_destroy_qp(qp) != 0) {
    log_error("rdma: destroying QP 0x%x: %s (its CQ entries stay held)", qp->qp_num, strerror(errno));
    return;
  }
  if (d) {
    pthread_mutex_lock(&d->cq_lock);
    rdma_cqb_give(&d->cqb, d->qp_cqes, true);
    pthread_mutex_unlock(&d->cq_lock);
  }
}

uint32_t rdma_qp_num(const struct ibv_qp *qp) { return qp->qp_num; }

int rdma_qp_query(struct ibv_qp *qp, struct rdma_qp_params *out) {
  struct ibv_qp_attr a;
  struct ibv_qp_init_attr ia;
  if (ibv_query_qp(qp, &a, IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT, &ia) != 0) return -1;
  *out = (struct rdma_qp_params){
      .tc = a.ah_attr.grh.traffic_class, .sl = a.ah_attr.sl, .timeout = a.timeout, .retry = a.retry_cnt};
  return 0;
}

int rdma_post(struct ibv_qp *qp, bool write, void *laddr, uint32_t len, uint32_t lkey, uint64_t raddr,
              uint32_t rkey, uint64_t wr_id, bool signaled) {
  struct ibv_sge sge = {.addr = (uintptr_t)laddr, .length = len, .lkey = lkey};
  struct ibv_send_wr wr = {.wr_id = wr_id,
                           .sg_list = &sge,
                           .num_sge = len ? 1 : 0, /* zero-length: no memory named (C9-88) */
                           .opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
                           .send_flags = signaled ? IBV_SEND_SIGNALED : 0},
                     *bad;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  int rc = ibv_post_send(qp, &wr, &bad);
  if (rc == 0) return 0;
  errno = rc;
  return -1;
}

int rdma_post_tag(struct ibv_qp *qp, uint32_t tag, uint64_t wr_id) {
  struct ibv_send_wr wr = {.wr_id = wr_id,
                           .sg_list = NULL,
                           .num_sge = 0,
                           .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                           .send_flags = IBV_SEND_SIGNALED,
                           .imm_data = htonl(tag)},
                     *bad;
  /* A zero-length WRITE names no memory: neither address nor key is checked (C9-88). */
  wr.wr.rdma.remote_addr = 0;
  wr.wr.rdma.rkey = 0;
  int rc = ibv_post_send(qp, &wr, &bad);
  if (rc == 0) return 0;
  errno = rc;
  return -1;
}

int rdma_post_recv0(struct ibv_qp *qp, uint64_t wr_id) {
  struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = NULL, .num_sge = 0}, *bad;
  int rc = ibv_post_recv(qp, &wr, &bad);
  if (rc == 0) return 0;
  errno = rc;
  return -1;
}

/* ---- whether a window's key is held to the window ---- */

#define PROBE_WAIT_NS (2ull * 1000000000ull)

/* The next completion on cq within PROBE_WAIT_NS: 0 with its status, or -1. */
static int probe_wait(struct ibv_cq *cq, enum ibv_wc_status *st) {
  uint64_t end = hixl_now_ns() + PROBE_WAIT_NS;
  struct ibv_wc wc;
  for (;;) {
    int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) return -1;
    if (n == 1) {
      *st = wc.status;
      return 0;
    }
    if (hixl_now_ns() > end) return -1;
    sched_yield();
  }
}

/* READ 8 bytes at raddr through rkey on qa, into lbuf: 0 with the completion's status,
 * or -1 (not posted, or no completion in time). */
static int probe_read(struct ibv_qp *qa, struct ibv_cq *cq, void *lbuf, uint32_t lkey, uint64_t raddr,
                      uint32_t rkey, enum ibv_wc_status *st) {
  if (rdma_post(qa, false, lbuf, 8, lkey, raddr, rkey, 2, true) != 0) return -1;
  return probe_wait(cq, st);
}

uint64_t rdma_dev_guid(const struct rdma_dev *d) {
  return d->ctx ? (uint64_t)ibv_get_device_guid(d->ctx->device) : 0;
}

int rdma_probe_mw_bounds(struct rdma_dev *d, char *why, size_t cap) {
  long page = sysconf(_SC_PAGESIZE);
  size_t pg = page > 0 ? (size_t)page : 4096;
  int rc = -1;
  struct ibv_cq *cq = NULL;
  struct ibv_qp *qa = NULL, *qb = NULL;
  struct ibv_mr *mr = NULL, *lmr = NULL;
  struct ibv_mw *mw = NULL;
  uint8_t *buf = aligned_alloc(pg, 3 * pg); /* pages 0 and 1: the MR; 2: where the READs land */
  if (!buf) {
    snprintf(why, cap, "out of memory");
    return -1;
  }
  memset(buf, 0x5a, 3 * pg);
  struct rdma_qp_info ia, ib;
  const struct rdma_qp_params qp = {.tc = 0, .sl = 0, .timeout = 14, .retry = 1}; /* ~67 ms, one retry */
  char err[512] = ""; /* reg_access says why in up to ~400 bytes (a device name of 64) */
  enum ibv_wc_status st = IBV_WC_GENERAL_ERR;
  if (!(cq = ibv_create_cq(d->ctx, 8, NULL, NULL, 0))) {
    snprintf(why, cap, "ibv_create_cq: %s", strerror(errno));
    goto out;
  }
  if (!(qa = qp_new_on(d, cq, &ia, err, sizeof(err))) || !(qb = qp_new_on(d, cq, &ib, err, sizeof(err))) ||
      rdma_qp_connect(d, qa, &ia, &ib, &qp, err, sizeof(err)) != 0 ||
      rdma_qp_connect(d, qb, &ib, &ia, &qp, err, sizeof(err)) != 0) {
    snprintf(why, cap, "a loopback pair of QPs: %s", err);
    goto out;
  }
  if (!(mr = reg_access(d, buf, 2 * pg, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, NULL, err,
                        sizeof(err))) ||
      !(lmr = reg_access(d, buf + 2 * pg, pg, IBV_ACCESS_LOCAL_WRITE, NULL, err, sizeof(err))) ||
      !(mw = rdma_mw_new(d, err, sizeof(err)))) {
    snprintf(why, cap, "%s", err);
    goto out;
  }
  /* A window over page 0 bound on qb, read through by its peer qa. */
  struct rdma_bind b = {.mw = mw, .mr = mr, .addr = (uintptr_t)buf, .len = pg};
  if (rdma_post_binds(qb, &b, 1, 1) != 0 || probe_wait(cq, &st) != 0 || st != IBV_WC_SUCCESS) {
    snprintf(why, cap, "binding a window on a loopback QP failed or did not complete");
    goto out;
  }
  if (probe_read(qa, cq, buf + 2 * pg, lmr->lkey, (uintptr_t)buf, b.rkey, &st) != 0 || st != IBV_WC_SUCCESS) {
    snprintf(why, cap, "a loopback READ inside the window did not complete (%s)", ibv_wc_status_str(st));
    goto out;
  }
  /* Then page 1: inside the MR, outside the window. */
  if (probe_read(qa, cq, buf + 2 * pg, lmr->lkey, (uintptr_t)buf + pg, b.rkey, &st) != 0) {
    snprintf(why, cap, "a loopback READ outside the window got no completion");
    goto out;
  }
  if (st == IBV_WC_SUCCESS)
    rc = 0;
  else if (st == IBV_WC_REM_ACCESS_ERR)
    rc = 1;
  else
    snprintf(why, cap, "a loopback READ outside the window ended %s", ibv_wc_status_str(st));
out:
  /* The window first: bound, it holds qb (soft-RoCE's destroy of qb would wait for it,
   * seconds at a time), and nothing is in flight by now. */
  rdma_mw_free(mw);
  if (qa) ibv_destroy_qp(qa);
  if (qb) ibv_destroy_qp(qb);
  rdma_dereg(lmr);
  rdma_dereg(mr);
  if (cq) ibv_destroy_cq(cq);
  free(buf);
  return rc;
}

int rdma_chan_fd(const struct rdma_dev *d) { return d->chan->fd; }

int rdma_async_fd(const struct rdma_dev *d) { return d->ctx->async_fd; }

int rdma_port_active(struct rdma_dev *d) {
  struct ibv_port_attr pa;
  if (ibv_query_port(d->ctx, d->port, &pa) != 0) return -1;
  return pa.state == IBV_PORT_ACTIVE;
}

int rdma_async_get(struct rdma_dev *d, struct rdma_async *out) {
  struct ibv_async_event ev;
  if (ibv_get_async_event(d->ctx, &ev) != 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
  memset(out, 0, sizeof(*out));
  out->what = ibv_event_type_str(ev.event_type);
  switch (ev.event_type) {
  case IBV_EVENT_PORT_ERR:
    out->kind = RDMA_ASYNC_PORT_DOWN;
    out->port = (uint8_t)ev.element.port_num;
    break;
  case IBV_EVENT_PORT_ACTIVE:
    out->kind = RDMA_ASYNC_PORT_UP;
    out->port = (uint8_t)ev.element.port_num;
    break;
  case IBV_EVENT_DEVICE_FATAL: out->kind = RDMA_ASYNC_DEVICE_FATAL; break;
  case IBV_EVENT_CQ_ERR: /* d's own CQ (a UD QP's CQ on this context is not) */
    out->kind = ev.element.cq == d->cq ? RDMA_ASYNC_CQ_ERR : RDMA_ASYNC_OTHER;
    break;
  case IBV_EVENT_QP_FATAL:
  case IBV_EVENT_QP_REQ_ERR:
  case IBV_EVENT_QP_ACCESS_ERR:
    out->kind = RDMA_ASYNC_QP_FATAL;
    out->qpn = ev.element.qp ? ev.element.qp->qp_num : 0;
    break;
  default:
    out->kind = RDMA_ASYNC_OTHER;
    if (ev.event_type == IBV_EVENT_GID_CHANGE || ev.event_type == IBV_EVENT_LID_CHANGE ||
        ev.event_type == IBV_EVENT_PKEY_CHANGE || ev.event_type == IBV_EVENT_SM_CHANGE ||
        ev.event_type == IBV_EVENT_CLIENT_REREGISTER)
      out->port = (uint8_t)ev.element.port_num;
    break;
  }
  ibv_ack_async_event(&ev);
  return 1;
}

int rdma_cq_rearm(struct rdma_dev *d) {
  struct ibv_cq *cq;
  void *ctx;
  if (ibv_get_cq_event(d->chan, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
  return ibv_req_notify_cq(d->cq, 0);
}

bool rdma_cq_dead(struct rdma_dev *d) {
  pthread_mutex_lock(&d->cq_lock);
  bool dead = d->cqb.dead > 0;
  pthread_mutex_unlock(&d->cq_lock);
  return dead;
}

int rdma_cq_poll(struct rdma_dev *d, struct rdma_wc *out, int max) {
  struct ibv_wc wc[32];
  if (max > 32) max = 32;
  /* QPs destroyed by now add no completion after: once the CQ is found empty, the
   * ones they left are taken. */
  pthread_mutex_lock(&d->cq_lock);
  uint32_t dead = d->cqb.dead;
  pthread_mutex_unlock(&d->cq_lock);
  int n = ibv_poll_cq(d->cq, max, wc);
  if (n >= 0 && n < max && dead) {
    pthread_mutex_lock(&d->cq_lock);
    rdma_cqb_empty(&d->cqb, dead);
    pthread_mutex_unlock(&d->cq_lock);
  }
  for (int i = 0; i < n; i++) {
    out[i].wr_id = wc[i].wr_id;
    out[i].qpn = wc[i].qp_num;
    out[i].ok = wc[i].status == IBV_WC_SUCCESS;
    out[i].bind = out[i].ok && wc[i].opcode == IBV_WC_BIND_MW;
    out[i].recv = out[i].ok && (wc[i].opcode & IBV_WC_RECV) != 0;
    out[i].imm = out[i].recv && (wc[i].wc_flags & IBV_WC_WITH_IMM) != 0;
    out[i].imm_data = out[i].imm ? ntohl(wc[i].imm_data) : 0;
    out[i].status = ibv_wc_status_str(wc[i].status);
  }
  return n;
}

/* ---- UD queue pairs and address handles ---- */

bool rdma_ip_has_device(const struct sockaddr_in *ip) {
  struct rdma_cm_id *id = NULL;
  struct sockaddr_in sa = *ip;
  bool has = false;
  sa.sin_port = 0;
  if (rdma_create_id(NULL, &id, NULL, RDMA_PS_UDP) != 0) return false;
  if (rdma_bind_addr(id, (struct sockaddr *)&sa) == 0 && id->verbs) has = true;
  rdma_destroy_id(id);
  return has;
}

uint32_t rdma_mtu_bytes(const struct rdma_dev *d) { return 128u << d->mtu; /* IBV_MTU_256 is 1 */ }

struct ibv_mr *rdma_reg_local(struct rdma_dev *d, void *addr, size_t len, char *err, size_t errlen) {
  return reg_access(d, addr, len, IBV_ACCESS_LOCAL_WRITE, NULL, err, errlen);
}

int rdma_ud_open(struct rdma_dev *d, struct rdma_ud *u, uint32_t qkey, uint32_t max_send, uint32_t max_recv,
                 char *err, size_t errlen) {
  int fl;
  memset(u, 0, sizeof(*u));
  if (max_send > d->max_qp_wr) max_send = d->max_qp_wr;
  if (max_recv > d->max_qp_wr) max_recv = d->max_qp_wr;
  if (max_send == 0 || max_recv == 0) {
    snprintf(err, errlen, "%s: a UD QP needs at least one send and one receive", d->name);
    return -1;
  }
  u->chan = ibv_create_comp_channel(d->ctx);
  if (!u->chan) {
    snprintf(err, errlen, "%s: ibv_create_comp_channel: %s", d->name, strerror(errno));
    return -1;
  }
  fl = fcntl(u->chan->fd, F_GETFL);
  if (fl < 0 || fcntl(u->chan->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    snprintf(err, errlen, "%s: completion channel fd: %s", d->name, strerror(errno));
    goto destroy_chan;
  }
  u->cq = ibv_create_cq(d->ctx, (int)(max_send + max_recv), NULL, u->chan, 0);
  if (!u->cq || ibv_req_notify_cq(u->cq, 0) != 0) {
    snprintf(err, errlen, "%s: ibv_create_cq(%u): %s", d->name, max_send + max_recv, strerror(errno));
    goto destroy_cq;
  }
  struct ibv_qp_init_attr ia = {
      .send_cq = u->cq,
      .recv_cq = u->cq,
      .cap = {.max_send_wr = max_send, .max_recv_wr = max_recv, .max_send_sge = 1, .max_recv_sge = 1},
      .qp_type = IBV_QPT_UD,
      .sq_sig_all = 1};
  u->qp = ibv_create_qp(d->pd, &ia);
  if (!u->qp) {
    snprintf(err, errlen, "%s: ibv_create_qp(UD, %u/%u WRs): %s", d->name, max_send, max_recv,
             strerror(errno));
    goto destroy_cq;
  }
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = d->port, .qkey = qkey};
  if (ibv_modify_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) != 0) {
    snprintf(err, errlen, "%s: UD QP 0x%x to INIT: %s", d->name, u->qp->qp_num, strerror(errno));
    goto destroy_qp;
  }
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(u->qp, &a, IBV_QP_STATE) != 0) {
    snprintf(err, errlen, "%s: UD QP 0x%x to RTR: %s", d->name, u->qp->qp_num, strerror(errno));
    goto destroy_qp;
  }
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  if (ibv_modify_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) != 0) {
    snprintf(err, errlen, "%s: UD QP 0x%x to RTS: %s", d->name, u->qp->qp_num, strerror(errno));
    goto destroy_qp;
  }
  u->qpn = u->qp->qp_num;
  u->qkey = qkey;
  u->max_send = max_send;
  u->max_recv = max_recv;
  return 0;
destroy_qp:
  ibv_destroy_qp(u->qp);
destroy_cq:
  if (u->cq) ibv_destroy_cq(u->cq);
destroy_chan:
  ibv_destroy_comp_channel(u->chan);
  memset(u, 0, sizeof(*u));
  return -1;
}

void rdma_ud_destroy_qp(struct rdma_ud *u) {
  if (u->qp && ibv_destroy_qp(u->qp) != 0)
    log_error("rdma: destroying UD QP 0x%x: %s", u->qpn, strerror(errno));
  u->qp = NULL;
}

void rdma_ud_close(struct rdma_ud *u) {
  rdma_ud_destroy_qp(u);
  if (u->cq) {
    rdma_ud_rearm(u); /* ack what the channel still holds: destroying the CQ waits for that */
    ibv_destroy_cq(u->cq);
  }
  if (u->chan) ibv_destroy_comp_channel(u->chan);
  memset(u, 0, sizeof(*u));
}

int rdma_ud_post_recv(struct rdma_ud *u, void *addr, uint32_t len, uint32_t lkey, uint64_t wr_id) {
  struct ibv_sge sge = {.addr = (uintptr_t)addr, .length = len, .lkey = lkey};
  struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
  return ibv_post_recv(u->qp, &wr, &bad);
}

int rdma_ud_post_send(struct rdma_ud *u, struct ibv_ah *ah, uint32_t remote_qpn, uint32_t remote_qkey,
                      const void *addr, uint32_t len, uint32_t lkey, uint64_t wr_id) {
  struct ibv_sge sge = {.addr = (uintptr_t)addr, .length = len, .lkey = lkey};
  struct ibv_send_wr wr = {.wr_id = wr_id,
                           .sg_list = &sge,
                           .num_sge = 1,
                           .opcode = IBV_WR_SEND,
                           .send_flags = IBV_SEND_SIGNALED},
                     *bad;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = remote_qpn;
  wr.wr.ud.remote_qkey = remote_qkey;
  return ibv_post_send(u->qp, &wr, &bad);
}

int rdma_ud_chan_fd(const struct rdma_ud *u) { return u->chan->fd; }

int rdma_ud_rearm(struct rdma_ud *u) {
  struct ibv_cq *cq;
  void *ctx;
  unsigned n = 0;
  while (ibv_get_cq_event(u->chan, &cq, &ctx) == 0) n++; /* the fd is non-blocking */
  if (n) ibv_ack_cq_events(u->cq, n);
  return ibv_req_notify_cq(u->cq, 0);
}

int rdma_ud_poll(struct rdma_ud *u, struct rdma_ud_wc *out, int max) {
  struct ibv_wc wc[32];
  if (max > 32) max = 32;
  int n = ibv_poll_cq(u->cq, max, wc);
  for (int i = 0; i < n; i++) {
    struct rdma_ud_wc *o = &out[i];
    o->wr_id = wc[i].wr_id;
    o->ok = wc[i].status == IBV_WC_SUCCESS;
    o->flushed = wc[i].status == IBV_WC_WR_FLUSH_ERR;
    o->status = ibv_wc_status_str(wc[i].status);
    /* opcode is defined only for successful completions; receives are told apart by wr_id too */
    o->recv = o->ok ? (wc[i].opcode & IBV_WC_RECV) != 0 : false;
    o->grh = (wc[i].wc_flags & IBV_WC_GRH) != 0;
    o->byte_len = wc[i].byte_len;
    o->src_qp = wc[i].src_qp;
    o->slid = wc[i].slid;
    o->pkey_index = wc[i].pkey_index;
    o->sl = wc[i].sl;
    o->dlid_path_bits = wc[i].dlid_path_bits;
  }
  return n;
}

struct ibv_ah *rdma_ah_new(struct rdma_dev *d, const uint8_t gid[16], uint8_t tc, uint8_t sl, char *err,
                           size_t errlen) {
  struct ibv_ah_attr a = {.is_global = 1, .sl = sl, .port_num = d->port};
  memcpy(a.grh.dgid.raw, gid, 16);
  a.grh.sgid_index = (uint8_t)d->gid_index;
  a.grh.hop_limit = 64;
  a.grh.traffic_class = tc; /* the IP TOS byte on RoCE v2 */
  struct ibv_ah *ah = ibv_create_ah(d->pd, &a);
  if (!ah) {
    char g[INET6_ADDRSTRLEN];
    inet_ntop(AF_INET6, gid, g, sizeof(g));
    snprintf(err, errlen, "%s: ibv_create_ah toward GID %s (tc %u, sl %u): %s", d->name, g, tc, sl,
             strerror(errno));
  }
  return ah;
}

struct ibv_ah *rdma_ah_from_wc(struct rdma_dev *d, const struct rdma_ud_wc *wc, const void *grh) {
  struct ibv_wc w;
  memset(&w, 0, sizeof(w));
  w.wr_id = wc->wr_id;
  w.status = IBV_WC_SUCCESS;
  w.opcode = IBV_WC_RECV;
  w.byte_len = wc->byte_len;
  w.src_qp = wc->src_qp;
  w.wc_flags = wc->grh ? IBV_WC_GRH : 0;
  w.pkey_index = wc->pkey_index;
  w.slid = wc->slid;
  w.sl = wc->sl;
  w.dlid_path_bits = wc->dlid_path_bits;
  return ibv_create_ah_from_wc(d->pd, &w, (struct ibv_grh *)(uintptr_t)grh, d->port);
}

void rdma_ah_free(struct ibv_ah *ah) {
  if (ah) ibv_destroy_ah(ah);
}

static uint16_t ipv4_csum(const uint8_t *h) {
  uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += i == 10 ? 0 : (uint32_t)(h[i] << 8 | h[i + 1]);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return (uint16_t)~sum;
}

static void ipv4_mapped_raw(const uint8_t *a4, uint8_t gid[16]) {
  memset(gid, 0, 16);
  gid[10] = gid[11] = 0xff;
  memcpy(gid + 12, a4, 4);
}

int rdma_grh_read(const uint8_t *grh, struct rdma_grh_info *out) {
  const uint8_t *ip4 = grh + 20;
  /* As libibverbs tells them apart: RoCE v2 IPv4 when the first word is not an IPv6
   * version, or when a valid IPv4 header (ihl 5, checksum) sits at offset 20. */
  bool v4 = ip4[0] == 0x45 && (grh[0] >> 4 != 6 || (uint16_t)(ip4[10] << 8 | ip4[11]) == ipv4_csum(ip4));
  if (v4) {
    ipv4_mapped_raw(ip4 + 12, out->sgid);
    ipv4_mapped_raw(ip4 + 16, out->dgid);
    out->flow_label = 0;
    out->tc = ip4[1];
    out->hop_limit = ip4[8];
    return 4;
  }
  if (grh[0] >> 4 != 6) return -1;
  memcpy(out->sgid, grh + 8, 16);
  memcpy(out->dgid, grh + 24, 16);
  out->flow_label = (uint32_t)(grh[1] & 0x0f) << 16 | (uint32_t)grh[2] << 8 | grh[3];
  out->tc = (uint8_t)((grh[0] << 4) | (grh[1] >> 4));
  out->hop_limit = grh[7];
  return 6;
}
