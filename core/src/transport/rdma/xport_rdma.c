/* xport_rdma: the RDMA data path of a link. The TCP control plane exchanges QP info
 * (RDMA_CONNECT / RDMA_CONNECT_ACK) and memory keys (in memory entries); data then
 * moves as one-sided RDMA WRITE and READ posted by the initiator, with no work on the
 * target's CPU. Every chunk is one work request; every RDMA_SIGNAL_EVERY-th one, the
 * last one posted and the one that fills the send queue are signaled (where posting
 * stops after an unsignaled one, a signaled zero-length WRITE follows it), and a
 * signaled completion ends every chunk posted before it (RC completes in order).
 *
 * Rails (docs/rails.md): the engine opens one device per local rail address besides
 * its own (each with its PD, CQ and completion channel), registers every range on
 * each, and a link's QP lives on the device of the link's local address. So each
 * rail's link advertises, and posts with, the keys of its own device. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "devmem/devmem.h"
#include "engine/xport_link.h"
#include "transport/rdma/erdma.h"
#include "transport/rdma/rdma.h"
#include "transport/rdma/xport_rdma.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"

#define ERDMA_CALLER_POST (4u << 20)  /* bytes a submitting thread posts itself */
#define ERDMA_STEP        (64u << 20) /* bytes posted per completion event */

static struct erdma_engine *eng_of(const struct HixlEngine *e) { return engine_xe(e, XPORT_RDMA); }
static struct erdma_link *link_of(const struct conn *c) { return link_xs(c, XPORT_RDMA); }

/* c's QP is connected: its link joins the engine's list. */
static void links_add(struct conn *c, struct erdma_link *l) {
  struct erdma_engine *x = eng_of(link_engine(c));
  l->conn = c;
  l->prev = NULL;
  l->next = x->links;
  if (x->links) x->links->prev = l;
  x->links = l;
  link_set_xs(c, XPORT_RDMA, l);
  link_use(c, &xport_rdma);
}

static void links_remove(struct conn *c, struct erdma_link *l) {
  struct erdma_engine *x = eng_of(link_engine(c));
  if (!l->conn) return;
  if (l->prev)
    l->prev->next = l->next;
  else
    x->links = l->next;
  if (l->next) l->next->prev = l->prev;
  l->conn = NULL;
  l->prev = l->next = NULL;
}

/* The device whose address is ip, else the engine's own (0). */
static int dev_of_ip(const struct erdma_engine *x, uint32_t ip) {
  for (int i = 1; i < x->n; i++)
    if (x->ip[i] == ip) return i;
  return 0;
}

/* The device link c's QP is (or would be) on: its local address's. */
static int dev_of_conn(const struct conn *c) {
  const struct erdma_link *l = link_of(c);
  return l ? l->dev : dev_of_ip(eng_of(link_engine(c)), link_local_ip(c));
}

static bool erdma_has_qp(const struct conn *c) { return link_of(c) && link_of(c)->qp; }
static uint32_t erdma_qpn(const struct conn *c) { return erdma_has_qp(c) ? rdma_qp_num(link_of(c)->qp) : 0; }

static void erdma_devs_close(struct erdma_engine *x) {
  if (x->epfd >= 0) close(x->epfd);
  x->epfd = -1;
  for (int i = x->n - 1; i >= 0; i--) rdma_dev_close(&x->dev[i]);
  x->n = 0;
}

/* Rails: a device for each local rail address other than the engine's (Rails auto:
 * each IPv4 address of an interface that is up) that an RDMA device owns. An address
 * no device owns is said, and its rails' links go by tcp. */
static void rails_open(struct HixlEngine *e, struct erdma_engine *x) {
  const struct hixl_options *o = engine_opts(e);
  uint32_t cand[64];
  size_t nc = 0;
  if (o->rails_auto) {
    int got = sock_if_addrs(cand, 64, false); /* rxe and RoCE NICs do not sit on loopback */
    nc = got > 0 ? (size_t)got : 0;
  } else {
    for (uint32_t k = 0; k < o->rails_n; k++) cand[nc++] = o->rail_addr[k];
  }
  for (size_t k = 0; k < nc && x->n < ERDMA_DEVS; k++) {
    struct sockaddr_in sa = {.sin_family = AF_INET};
    char err[384], ip[INET_ADDRSTRLEN];
    bool seen = false;
    for (int i = 0; i < x->n && !seen; i++) seen = x->ip[i] == cand[k];
    if (seen) continue;
    sa.sin_addr.s_addr = cand[k];
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
    if (rdma_dev_open(&x->dev[x->n], &sa, NULL, -1, err, sizeof(err)) != 0) {
      if (!o->rails_auto) log_info("engine %s: rail %s: %s; its rails go by tcp", engine_name(e), ip, err);
      continue;
    }
    log_info("engine %s: rail %s on RDMA device %s", engine_name(e), ip, x->dev[x->n].name);
    x->ip[x->n++] = cand[k];
  }
}

/* One epoll for every device's completion channel and async event fd, both
 * non-blocking: the module's event_fd. -1 (errno). */
static int devs_watch(struct erdma_engine *x) {
  if ((x->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) return -1;
  for (int i = 0; i < x->n; i++) {
    int fl = fcntl(rdma_chan_fd(&x->dev[i]), F_GETFL);
    if (fl < 0 || fcntl(rdma_chan_fd(&x->dev[i]), F_SETFL, fl | O_NONBLOCK) != 0) return -1;
    struct epoll_event cq = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
    struct epoll_event as = {.events = EPOLLIN, .data.u32 = (uint32_t)i | ERDMA_EV_ASYNC};
    if (epoll_ctl(x->epfd, EPOLL_CTL_ADD, rdma_chan_fd(&x->dev[i]), &cq) != 0 ||
        epoll_ctl(x->epfd, EPOLL_CTL_ADD, rdma_async_fd(&x->dev[i]), &as) != 0)
      return -1;
  }
  return 0;
}

static HixlStatus erdma_open(struct HixlEngine *e) {
  const struct hixl_options *o = engine_opts(e);
  char err[384];
  const char *dev = o->rdma_device[0] ? o->rdma_device : NULL;
  bool must = o->transport == HIXL_TRANSPORT_RDMA;
  if (!must && o->transport != HIXL_TRANSPORT_AUTO) return HIXL_SUCCESS; /* tcp or shm: no device */
  if (!rdma_available()) {
    if (must)
      return hixl_fail(HIXL_FAILED,
                       "HixlEngineInitialize: Transport rdma: this host has no RDMA device (looked for %s, "
                       "and for one owning %s through librdmacm); use Transport auto or tcp",
                       dev ? dev : "any device", engine_name(e));
    log_info("engine %s: no RDMA device on this host: data goes over tcp", engine_name(e));
    return HIXL_SUCCESS;
  }
  struct erdma_engine *x = calloc(1, sizeof(*x));
  if (!x) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineInitialize: out of memory");
  if (rdma_dev_open(&x->dev[0], engine_addr(e), dev, o->rdma_gid_index, err, sizeof(err)) != 0) {
    free(x);
    if (must) return hixl_fail(HIXL_FAILED, "HixlEngineInitialize: Transport rdma: %s", err);
    log_info("engine %s: RDMA not usable (%s): data goes over tcp", engine_name(e), err);
    return HIXL_SUCCESS;
  }
  x->ip[0] = engine_addr(e)->sin_addr.s_addr;
  x->n = 1;
  x->epfd = -1;
  if (o->rails_on) rails_open(e, x);
  if (devs_watch(x) != 0) {
    int en = errno;
    erdma_devs_close(x);
    free(x);
    return hixl_fail(HIXL_FAILED, "HixlEngineInitialize: cannot watch the RDMA devices' events: %s",
                     strerror(en));
  }
  engine_set_xe(e, XPORT_RDMA, x);
  log_info("engine %s: RDMA on %s (GID index %d)%s, traffic class %u, service level %u", engine_name(e),
           x->dev[0].name, x->dev[0].gid_index, x->n > 1 ? " and its rails' devices" : "", o->rdma_tc,
           o->rdma_sl);
  return HIXL_SUCCESS;
}

static void erdma_close(struct HixlEngine *e) {
  struct erdma_engine *x = eng_of(e);
  if (!x) return;
  erdma_devs_close(x);
  for (int i = 0; i < ERDMA_DEVS; i++) free(x->stash[i].v);
  free(x);
  engine_set_xe(e, XPORT_RDMA, NULL);
}

static uint32_t erdma_caps(const struct HixlEngine *e) {
  uint32_t tags = WIRE_CAP_CALL_TAG; /* its target links keep receives posted for tags */
#ifdef HIXL_DEVMEM_TEST
  if (getenv("HIXL_TEST_NO_CALL_TAG")) tags = 0; /* test builds: a peer that takes no tags */
#endif
  return eng_of(e) ? WIRE_CAP_RDMA | WIRE_CAP_STAGE_RDMA | WIRE_CAP_WIN | WIRE_CAP_WIN_RUNS | tags : 0;
}

static int erdma_event_fd(const struct HixlEngine *e) {
  const struct erdma_engine *x = eng_of(e);
  return x ? x->epfd : -1;
}

static void mrs_free(struct erdma_mr *m) {
  if (!m) return;
  for (int i = 0; i < ERDMA_DEVS; i++) rdma_dereg(m->mr[i]);
  if (m->dmabuf) close(m->db.fd);
  free(m);
}

/* [addr, addr + len) registered on every device: host memory (db NULL), or db's dma-buf,
 * which the MRs then hold (closed with them, even when registering fails); NULL with err. */
static struct erdma_mr *mrs_reg(struct erdma_engine *x, void *addr, size_t len, bool remote,
                                const struct rdma_dmabuf *db, char *err, size_t errlen) {
  struct erdma_mr *m = calloc(1, sizeof(*m));
  if (!m) {
    snprintf(err, errlen, "out of memory");
    if (db) close(db->fd);
    return NULL;
  }
  if (db) {
    m->dmabuf = true;
    m->db = *db;
  }
  for (int i = 0; i < x->n; i++)
    if (!(m->mr[i] = rdma_reg(&x->dev[i], addr, len, remote, db, err, errlen))) {
      mrs_free(m);
      return NULL;
    }
  return m;
}

#ifdef HIXL_DEVMEM_TEST
/* Test builds: HIXL_TEST_RDMA_DMABUF=plain registers the host stand-in's "device" memory
 * as the host memory it is, as if its dma-buf had been: every GPUDirect path but the
 * ibv_reg_dmabuf_mr call runs on a device (soft-RoCE) that takes no dma-buf; =refuse:
 * no MR, as on a NIC without GPUDirect. 'p', 'r' or 0. */
static char dmabuf_test(void) {
  const char *t = getenv("HIXL_TEST_RDMA_DMABUF");
  return !t ? 0 : strcmp(t, "plain") == 0 ? 'p' : strcmp(t, "refuse") == 0 ? 'r' : 0;
}
#endif

/* Device memory (GPUDirect): an MR over the dma-buf its provider exports, on every
 * device; where that cannot be made, an MR by the memory's address where a peer-memory
 * client is loaded (nvidia-peermem: NCCL's and UCX's other way). Where neither, none:
 * peers see key 0 and its ops go as tcp frames through host buffers on the link's
 * socket (docs/device-memory.md), said once at info, then at debug. */
static void erdma_dev_reg(struct HixlEngine *e, struct hixl_mem_reg *r, bool remote) {
  struct erdma_engine *x = eng_of(e);
  char why[384] = "";
  struct rdma_dmabuf db = {.fd = -1};
  void *addr = (void *)(uintptr_t)r->range.addr;
  struct erdma_mr *m = NULL;
#ifdef HIXL_DEVMEM_TEST
  char t = dmabuf_test();
  if (t == 'p') {
    log_warn(
        "engine %s: device memory [0x%llx, +%llu) registered as host memory (HIXL_TEST_RDMA_DMABUF=plain, "
        "a test build)",
        engine_name(e), (unsigned long long)r->range.addr, (unsigned long long)r->range.len);
    m = mrs_reg(x, addr, r->range.len, remote, NULL, why, sizeof(why));
    goto done;
  }
  if (t == 'r') {
    snprintf(why, sizeof(why), "refused by HIXL_TEST_RDMA_DMABUF=refuse (a test build)");
    goto done;
  }
#endif
  const struct devmem_ops *dm = devmem_get(why, sizeof(why));
  if (dm &&
      dm->dmabuf(r->range.addr, r->range.len, r->device, &db.fd, &db.off, why, sizeof(why)) == HIXL_SUCCESS)
    m = mrs_reg(x, addr, r->range.len, remote, &db, why, sizeof(why));
  if (!m && dm && dm->peer_mem) { /* GPUDirect without dma-buf */
    size_t at = strlen(why);
    char pwhy[256] = "";
    if (dm->peer_mem(pwhy, sizeof(pwhy)) &&
        (m = mrs_reg(x, addr, r->range.len, remote, NULL, pwhy, sizeof(pwhy))) != NULL) {
      engine_dev_stats(e)->rdma_peermem++;
      if (!x->peermem_logged)
        log_info(
            "engine %s: device memory [0x%llx, +%llu) on device %d registered by its address through the "
            "peer-memory client (no dma-buf MR: %s)",
            engine_name(e), (unsigned long long)r->range.addr, (unsigned long long)r->range.len, r->device,
            why);
      x->peermem_logged = true;
    } else if (at + 3 < sizeof(why)) {
      snprintf(why + at, sizeof(why) - at, "; by address: %s", pwhy);
    }
  }
#ifdef HIXL_DEVMEM_TEST
done:
#endif
  if (!m) {
    engine_dev_stats(e)->rdma_refused++;
    HixlLogLevel lvl = x->dmabuf_refusal_logged ? HIXL_LOG_DEBUG : HIXL_LOG_INFO;
    x->dmabuf_refusal_logged = true;
    HIXL_LOG(lvl,
             "engine %s: device memory [0x%llx, +%llu) on device %d: no RDMA memory region (GPUDirect): %s; "
             "its ops go as tcp frames through host buffers",
             engine_name(e), (unsigned long long)r->range.addr, (unsigned long long)r->range.len, r->device,
             why);
    return;
  }
  engine_dev_stats(e)->rdma_regs++;
  r->xm[XPORT_RDMA] = m;
}

/* Each device's answer, kept for the process (by its name and node GUID): a device is
 * probed once, whichever engine opened it first (the plugin runs several scoped engines
 * a process; a probe is a loopback pair of QPs and two MRs). An answer of "could not
 * tell" is not kept. mwb_lock is held across a probe, so two engines opening the same
 * device at once probe it once; it is a leaf (a probe takes no other lock). */
#define MWB_KNOWN 16
static struct {
  char name[64];
  uint64_t guid;
  int answer; /* RDMA_MWB_HELD or RDMA_MWB_MR */
} mwb_known[MWB_KNOWN];
static size_t mwb_n;
static uint32_t mwb_probes;
static pthread_mutex_t mwb_lock = PTHREAD_MUTEX_INITIALIZER;

uint32_t erdma_mw_probes(void) {
  pthread_mutex_lock(&mwb_lock);
  uint32_t n = mwb_probes;
  pthread_mutex_unlock(&mwb_lock);
  return n;
}

/* Whether d holds a window's key to the window (rdma_probe_mw_bounds), once per device
 * and process; said in the log. Test builds may say it instead
 * (HIXL_TEST_RDMA_MW_BOUNDS=held|mr): "held" on a device that does not hold it opens the
 * whole registration to a window's key, which only a benchmark of the cost should do. */
static void mw_bounds_ask(struct rdma_dev *d) {
  if (!d->mw2 || d->mw_bounds != RDMA_MWB_UNKNOWN) return;
#ifdef HIXL_DEVMEM_TEST
  const char *t = getenv("HIXL_TEST_RDMA_MW_BOUNDS");
  if (t && (strcmp(t, "held") == 0 || strcmp(t, "mr") == 0)) {
    d->mw_bounds = t[0] == 'h' ? RDMA_MWB_HELD : RDMA_MWB_MR;
    log_warn("rdma: %s: taken as %s (HIXL_TEST_RDMA_MW_BOUNDS, a test build)", d->name,
             t[0] == 'h' ? "holding a window's key to the window" : "holding it to the MR only");
    return;
  }
#endif
  char why[256] = "";
  uint64_t guid = rdma_dev_guid(d);
  pthread_mutex_lock(&mwb_lock);
  for (size_t i = 0; i < mwb_n; i++)
    if (mwb_known[i].guid == guid && strcmp(mwb_known[i].name, d->name) == 0) {
      d->mw_bounds = mwb_known[i].answer;
      pthread_mutex_unlock(&mwb_lock);
      return; /* said when it was probed */
    }
  int rc = rdma_probe_mw_bounds(d, why, sizeof(why));
  mwb_probes++;
  d->mw_bounds = rc == 1 ? RDMA_MWB_HELD : rc == 0 ? RDMA_MWB_MR : RDMA_MWB_UNTOLD;
  if (rc >= 0 && mwb_n < MWB_KNOWN) {
    snprintf(mwb_known[mwb_n].name, sizeof(mwb_known[mwb_n].name), "%s", d->name);
    mwb_known[mwb_n].guid = guid;
    mwb_known[mwb_n++].answer = d->mw_bounds;
  }
  pthread_mutex_unlock(&mwb_lock);
  if (rc == 1)
    log_info("rdma: %s holds a memory window's key to the window: a grant binds windows over the "
             "registration's own MR",
             d->name);
  else if (rc == 0)
    log_info("rdma: %s lets a memory window's key reach the whole MR it is bound over (Linux 6.1's "
             "soft-RoCE does): each window gets an MR of its own, registered at each grant",
             d->name);
  else
    log_warn("rdma: %s: could not tell whether a memory window's key is held to the window (%s): each "
             "window gets an MR of its own, registered at each grant",
             d->name, why);
}

static HixlStatus erdma_reg(struct HixlEngine *e, struct hixl_mem_reg *r) {
  char err[384];
  if (!eng_of(e)) return HIXL_SUCCESS;
  /* Scoped: no remote access of its own; peers reach what they were granted through
   * windows (rdma_win.c), over this registration's own MR where the device holds a
   * window's key to the window, asked once per device here. */
  if (engine_scoped(e))
    for (int i = 0; i < eng_of(e)->n; i++) mw_bounds_ask(&eng_of(e)->dev[i]);
  if (r->type == HIXL_MEM_DEVICE) { /* never refused: without an MR it moves as frames */
    erdma_dev_reg(e, r, !engine_scoped(e));
    return HIXL_SUCCESS;
  }
  r->xm[XPORT_RDMA] = mrs_reg(eng_of(e), (void *)(uintptr_t)r->range.addr, r->range.len, !engine_scoped(e),
                              NULL, err, sizeof(err));
  return r->xm[XPORT_RDMA] ? HIXL_SUCCESS
                           : hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineRegisterMem: %s", err);
}

static void erdma_dereg(struct HixlEngine *e, struct hixl_mem_reg *r) {
  erdma_wins_dereg(e, r->range.addr, r->range.len); /* scoped: the peers' windows inside it */
  if (r->type == HIXL_MEM_DEVICE && r->xm[XPORT_RDMA]) engine_dev_stats(e)->rdma_regs--;
  mrs_free(r->xm[XPORT_RDMA]);
  r->xm[XPORT_RDMA] = NULL;
}

/* The key of r on the device of c's rail; none on a scoped engine (windows instead). */
static uint32_t erdma_rkey(const struct conn *c, const struct hixl_mem_reg *r) {
  const struct erdma_mr *m = r->xm[XPORT_RDMA];
  return m && !engine_scoped(link_engine(c)) ? rdma_mr_rkey(m->mr[dev_of_conn(c)]) : 0;
}

static uint32_t mr_lkey(const void *h, int dev) {
  return rdma_mr_lkey(((const struct erdma_mr *)h)->mr[dev]);
}

static size_t put_qp_frame(uint8_t *buf, size_t cap, enum wire_type type, uint32_t status,
                           const struct rdma_qp_info *qi) {
  struct wire_wr w;
  wire_begin(&w, buf, cap, type);
  if (type == WIRE_RDMA_CONNECT_ACK) wire_put_u32(&w, status);
  wire_put_qp_info(&w, qi->qpn, qi->psn, qi->gid, qi->mtu);
  return wire_end(&w, 0);
}

static struct rdma_qp_params qp_params_of(const struct hixl_options *o) {
  return (struct rdma_qp_params){.tc = (uint8_t)o->rdma_tc,
                                 .sl = (uint8_t)o->rdma_sl,
                                 .timeout = (uint8_t)o->rdma_timeout,
                                 .retry = (uint8_t)o->rdma_retry};
}

static void qp_info_of(const struct wire_msg *m, struct rdma_qp_info *qi) {
  qi->qpn = m->u.qp.qpn;
  qi->psn = m->u.qp.psn;
  memcpy(qi->gid, m->u.qp.gid, 16);
  qi->mtu = m->u.qp.mtu;
}

/* Initiator, during Connect (blocking socket, no lock held): exchange QP info on the
 * socket and connect the QP. Takes the link when both ends have RDMA (Transport auto
 * or rdma); Transport rdma fails when either has none. */
static HixlStatus erdma_connect(struct HixlEngine *e, int fd, uint64_t deadline, const char *remote,
                                struct peer *p, bool *taken, void **out) {
  struct rdma_qp_info local, peer;
  uint8_t buf[WIRE_HDR_LEN + 4 + WIRE_QP_INFO_LEN];
  struct wire_hdr h;
  struct wire_msg m;
  char err[384];
  HixlStatus st;
  bool must = engine_opts(e)->transport == HIXL_TRANSPORT_RDMA;
  *taken = false;
  if (!must && engine_opts(e)->transport != HIXL_TRANSPORT_AUTO) return HIXL_SUCCESS;
  if (!eng_of(e) || !(peer_caps(p) & WIRE_CAP_RDMA)) {
    if (must)
      return hixl_fail(HIXL_FAILED, "HixlEngineConnect: Transport is rdma but %s has no usable RDMA device",
                       eng_of(e) ? remote : "this engine");
    log_info("link to %s: no rdma (%s)", remote,
             eng_of(e) ? "the peer has no RDMA device" : "no RDMA device here");
    return HIXL_SUCCESS;
  }
  struct erdma_link *l = calloc(1, sizeof(*l));
  if (!l) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineConnect: out of memory");
  struct sockaddr_in here = {0};
  getsockname(fd, (struct sockaddr *)&here, &(socklen_t){sizeof(here)});
  l->dev = dev_of_ip(eng_of(e), here.sin_addr.s_addr); /* a rail's: its address's device */
  struct rdma_dev *d = &eng_of(e)->dev[l->dev];
  if (atomic_load(&eng_of(e)->cq_err[l->dev])) {
    free(l);
    return hixl_fail(HIXL_FAILED,
                     "HixlEngineConnect: %s: RDMA device %s: its completion queue overran (CQ_ERR); "
                     "reinitialize the engine",
                     remote, d->name);
  }
  /* A port marked down by its event: refused until it is active (its PORT_ACTIVE event,
   * or the port's state now, should that event come late). */
  if (atomic_load(&eng_of(e)->down[l->dev]) && rdma_port_active(d) != 1) {
    free(l);
    return hixl_fail(HIXL_FAILED,
                     "HixlEngineConnect: %s: RDMA device %s port %u is down (until its PORT_ACTIVE event)",
                     remote, d->name, d->port);
  }
  struct ibv_qp *qp = rdma_qp_new(d, &local, err, sizeof(err));
  if (!qp) {
    free(l);
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s: %s", remote, err);
  }
  size_t n = put_qp_frame(buf, sizeof(buf), WIRE_RDMA_CONNECT, 0, &local);
  if ((st = link_handshake_send(fd, p, buf, n, deadline)) != HIXL_SUCCESS) goto fail_io;
  /* Registrations the target makes meanwhile may come first (MEM_ADD / MEM_DEL). */
  if ((st = link_handshake_recv(fd, deadline, p, buf, sizeof(buf), &h)) != HIXL_SUCCESS) goto fail_io;
  if (h.type != WIRE_RDMA_CONNECT_ACK) {
    st = hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s answered the QP exchange with %s", remote,
                   wire_type_name(h.type));
    goto free_qp;
  }
  if (wire_decode(&h, buf + WIRE_HDR_LEN, &m) != WIRE_OK || m.u.qp.status != 0) {
    st = hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s could not connect its QP (see its log)", remote);
    goto free_qp;
  }
  qp_info_of(&m, &peer);
  struct rdma_qp_params qp_params = qp_params_of(engine_opts(e));
  if (rdma_qp_connect(d, qp, &local, &peer, &qp_params, err, sizeof(err)) != 0) {
    st = hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s: %s", remote, err);
    goto free_qp;
  }
  log_info("link to %s: rdma, QP 0x%x <-> 0x%x on %s", remote, local.qpn, peer.qpn, d->name);
  l->qp = qp;
  *out = l;
  *taken = true;
  return HIXL_SUCCESS;
fail_io:
  st = hixl_fail(st, "HixlEngineConnect: QP exchange with %s: %s", remote, HixlGetLastErrorMessage());
free_qp:
  rdma_qp_free(qp);
  link_wake(e); /* as erdma_kill */
  free(l);
  return st;
}

static void erdma_attach(struct conn *c, void *link) {
  if (!link) return;
  links_add(c, link);
  /* A scoped target sends WIN_ADD / WIN_DEL on its own, on every rail's link: read it
   * even while nothing is pending here. */
  link_read_always(c);
}

static void erdma_discard(void *link) {
  struct erdma_link *l = link;
  if (!l) return;
  rdma_qp_free(l->qp);
  free(l);
}

/* Target, in the progress thread: connect a QP to the initiator's and answer. */
static void erdma_target_connect(struct conn *c, const struct wire_msg *m) {
  struct HixlEngine *e = link_engine(c);
  struct rdma_qp_info local = {0}, peer;
  char err[384] = "this engine has no RDMA device";
  uint8_t buf[WIRE_HDR_LEN + 4 + WIRE_QP_INFO_LEN];
  uint32_t status = 1;
  struct erdma_link *l = NULL;
  unsigned long long more;
  qp_info_of(m, &peer);
  if (eng_of(e) && link_of(c))
    snprintf(err, sizeof(err), "this link has a QP already");
  else if (eng_of(e) && !(l = calloc(1, sizeof(*l))))
    snprintf(err, sizeof(err), "out of memory");
  struct rdma_dev *d = l ? &eng_of(e)->dev[l->dev = dev_of_conn(c)] : NULL;
  if (d && atomic_load(&eng_of(e)->cq_err[l->dev]))
    snprintf(err, sizeof(err), "RDMA device %s: its completion queue overran (CQ_ERR)", d->name);
  else if (d && atomic_load(&eng_of(e)->down[l->dev]) && rdma_port_active(d) != 1) /* as erdma_connect */
    snprintf(err, sizeof(err), "RDMA device %s port %u is down (until its PORT_ACTIVE event)", d->name,
             d->port);
  else if (l && (l->qp = rdma_qp_new(d, &local, err, sizeof(err)))) {
    struct rdma_qp_params qp_params = qp_params_of(engine_opts(e));
    /* Receives for the peer's tags (WRITEs with immediate data), each posted again as
     * it completes: a tag finding none waits at the peer (RNR, retried without end). */
    int rc = 0;
    for (int i = 0; i < RDMA_RECV_DEPTH && rc == 0; i++) rc = rdma_post_recv0(l->qp, ERDMA_WR_RECV);
    if (rc != 0)
      snprintf(err, sizeof(err), "%s: ibv_post_recv on QP 0x%x: %s", d->name, local.qpn, strerror(errno));
    else if (rdma_qp_connect(d, l->qp, &local, &peer, &qp_params, err, sizeof(err)) == 0) {
      status = 0;
      links_add(c, l);
      log_info("link from %s: rdma, QP 0x%x <-> 0x%x on %s", link_remote(c), local.qpn, peer.qpn, d->name);
    } else {
      rdma_qp_free(l->qp);
    }
  }
  if (status != 0) free(l);
  if (status != 0 && link_refused_say(c, &more)) /* a peer can send it over and over: not a line each */
    log_error("link from %s: cannot connect a QP: %s (%llu more refused since the last such line)",
              link_remote(c), err, more);
  if (local.mtu == 0) local.mtu = 1; /* a refusal without a QP: its fields are not read, but must parse */
  link_queue_copy(c, buf, put_qp_frame(buf, sizeof(buf), WIRE_RDMA_CONNECT_ACK, status, &local));
}

static void fifo_push(struct chunk **head, struct chunk **tail, struct chunk *ch) {
  ch->next_pending = NULL;
  if (*tail)
    (*tail)->next_pending = ch;
  else
    *head = ch;
  *tail = ch;
}

static struct chunk *fifo_pop(struct chunk **head, struct chunk **tail) {
  struct chunk *ch = *head;
  if (ch && !(*head = ch->next_pending)) *tail = NULL;
  return ch;
}

/* The first of l's tags still waiting for its chunk to be posted, or NULL. */
static struct erdma_tag *tag_waiting(struct erdma_link *l) {
  for (uint32_t i = 0; i < l->tag_n; i++) {
    struct erdma_tag *t = &l->tags[(l->tag_head + i) % ERDMA_TAGS];
    if (t->after) return t;
  }
  return NULL;
}

/* Post the tags whose chunks are posted, in order, while the send queue has room;
 * each signaled (its completion gives its slot back). false: the link was killed. */
static bool tags_post(struct conn *c, struct erdma_link *l, uint32_t max_wr) {
  while (l->tag_n && !l->tags[l->tag_head].after && l->sq_used < max_wr) {
    if (rdma_post_tag(l->qp, l->tags[l->tag_head].tag, ERDMA_WR_TAG) != 0) {
      char why[192];
      snprintf(why, sizeof(why), "ibv_post_send of a tag (WRITE with immediate) on QP 0x%x failed: %s",
               rdma_qp_num(l->qp), strerror(errno));
      link_conn_kill(c, HIXL_FAILED, why);
      return false;
    }
    l->tag_head = (l->tag_head + 1) % ERDMA_TAGS;
    l->tag_n--;
    l->sq_used++;
    l->unsignaled = 0;
  }
  return true;
}

/* A chunk popped from the queue is not posted (timed out, its window closed, or it
 * spans more windows than a send queue holds work requests): its
 * request failed, so a tag behind it must never land, or the call waiting for it would
 * be served. Where one waits behind it, the link is reset instead, the chunk ending
 * with the link and the call with it: true. */
static bool tags_chunk_dropped(struct conn *c, struct erdma_link *l, struct chunk *ch) {
  for (uint32_t i = 0; i < l->tag_n; i++) {
    const struct erdma_tag *t = &l->tags[(l->tag_head + i) % ERDMA_TAGS];
    if (t->after && t->after->req == ch->req) {
      fifo_push(&l->rpend_head, &l->rpend_tail, ch); /* ended by the kill */
      link_conn_kill(c, HIXL_FAILED,
                     "a transfer with a call behind it lost a chunk before it was posted: link reset so that "
                     "the call is not served");
      return true;
    }
  }
  return false;
}

/* Post waiting chunks while the send queue has room, at most budget bytes: a
 * provider may do the transfer's work in the posting thread (rxe does), so a caller
 * posts a little and completions post the rest in steps. The last WR posted in a
 * step is signaled, so its completion comes back and the next step follows. A tag
 * behind a chunk (post_tag) is posted right after it. */
static void erdma_post(struct conn *c, size_t budget) {
  struct erdma_link *l = link_of(c);
  uint32_t max_wr = eng_of(link_engine(c))->dev[l->dev].max_qp_wr;
  size_t posted = 0;
  if (!tags_post(c, l, max_wr)) return;
  while (l->rq_head && !link_dead(c) && l->sq_used < max_wr && posted < budget) {
    struct chunk *ch = l->rq_head;
    bool cancelled = link_req_cancelled(ch->req);
#ifdef HIXL_DEVMEM_TEST
    if (l->tag_n && getenv("HIXL_TEST_TAG_DROP")) cancelled = true; /* test builds: its deadline passed */
#endif
    if (cancelled) { /* timed out before it reached the wire */
      fifo_pop(&l->rq_head, &l->rq_tail);
      if (l->tag_n && tags_chunk_dropped(c, l, ch)) return;
      link_chunk_end(ch, HIXL_TIMEOUT, "request timed out before it was posted");
      continue;
    }
    /* With the registration's key, one WR; inside windows (key 0), one per window. */
    ch->nwr = ch->rkey ? 1 : erdma_rwins_pieces(&l->rwins, ch->raddr, ch->len);
    if (ch->nwr == 0 || ch->nwr > max_wr) { /* past the depth: the provider refuses, the link dies */
      char why[256];
      fifo_pop(&l->rq_head, &l->rq_tail);
      if (l->tag_n && tags_chunk_dropped(c, l, ch)) return;
      if (ch->nwr)
        snprintf(why, sizeof(why),
                 "an op spans %u of the peer's memory windows, a work request each, and a send queue holds "
                 "%u: ask the peer to grant the range as one run",
                 ch->nwr, max_wr);
      else
        snprintf(why, sizeof(why),
                 "the peer closed the memory window over it (its grant was revoked) before it was posted");
      link_chunk_end(ch, HIXL_FAILED, why);
      continue;
    }
    if (l->sq_used + ch->nwr > max_wr && l->sq_used > 0) break; /* room comes back with completions */
    fifo_pop(&l->rq_head, &l->rq_tail);
    posted += ch->len;
    struct erdma_tag *tag = l->tag_n ? tag_waiting(l) : NULL;
    if (tag && tag->after != ch) tag = NULL;
    bool last = !l->rq_head || l->sq_used + ch->nwr >= max_wr || posted >= budget;
    /* A tag's chunk is signaled: the tag's own completion ends no chunk. */
    bool signaled = last || tag || l->unsignaled + ch->nwr >= RDMA_SIGNAL_EVERY;
    uint32_t lkey = mr_lkey(ch->lreg->xm[XPORT_RDMA], l->dev);
    int rc = 0;
    if (ch->rkey) {
      rc = rdma_post(l->qp, ch->kind == CHUNK_WRITE, ch->laddr, ch->len, lkey, ch->raddr, ch->rkey,
                     (uint64_t)(uintptr_t)ch, signaled);
    } else { /* the last piece carries the chunk (and the signal): RC completes in order */
      uint64_t pos = ch->raddr, end = ch->raddr + ch->len;
      for (uint32_t p = 0; p < ch->nwr && rc == 0; p++) {
        const struct erdma_win *win = erdma_rwins_find(&l->rwins, pos); /* there: counted in nwr just now */
        uint64_t stop = win->addr + win->len < end ? win->addr + win->len : end;
        bool lastp = p + 1 == ch->nwr;
        rc = rdma_post(l->qp, ch->kind == CHUNK_WRITE, ch->laddr + (pos - ch->raddr), (uint32_t)(stop - pos),
                       lkey, pos, win->rkey, lastp ? (uint64_t)(uintptr_t)ch : 0, lastp && signaled);
        pos = stop;
      }
      l->win_ops++;
    }
    if (rc != 0) {
      char why[192];
      fifo_push(&l->rpend_head, &l->rpend_tail, ch); /* ended by the kill below */
      snprintf(why, sizeof(why), "ibv_post_send on QP 0x%x failed: %s", rdma_qp_num(l->qp), strerror(errno));
      link_conn_kill(c, HIXL_FAILED, why);
      return;
    }
    fifo_push(&l->rpend_head, &l->rpend_tail, ch);
    l->sq_used += ch->nwr;
    l->unsignaled = signaled ? 0 : l->unsignaled + ch->nwr;
    l->tail_unsig = !signaled;
    if (tag) {
      tag->after = NULL;
      if (!tags_post(c, l, max_wr)) return;
    }
  }
  /* The last chunk posted went unsignaled and posting stopped before a signaled one
   * (the chunks behind it dropped or refused, or too wide for the room left): no
   * completion would end it. A zero-length WRITE, signaled, does (RC completes in
   * order); its slot is counted as the chunk's. */
  if (l->tail_unsig && l->rpend_tail && !link_dead(c) && l->sq_used < max_wr) {
    struct chunk *ch = l->rpend_tail;
    if (rdma_post(l->qp, true, NULL, 0, 0, 0, 0, (uint64_t)(uintptr_t)ch, true) != 0) {
      char why[192];
      snprintf(why, sizeof(why), "ibv_post_send of a zero-length WRITE on QP 0x%x failed: %s",
               rdma_qp_num(l->qp), strerror(errno));
      link_conn_kill(c, HIXL_FAILED, why);
      return;
    }
    ch->nwr++;
    l->sq_used++;
    l->unsignaled = 0;
    l->tail_unsig = false;
  }
}

/* xport link.post_tag: the tag goes behind r's last chunk, the tail of the queue
 * while r's chunks wait there, else (all posted) now. */
static int erdma_post_tag(struct conn *c, struct hixl_transfer_req *r, uint32_t tag) {
  struct erdma_link *l = link_of(c);
  if (!l || !l->qp || link_dead(c) || l->tag_n == ERDMA_TAGS) return -1;
  struct chunk *after = l->rq_tail && l->rq_tail->req == r ? l->rq_tail : NULL;
#ifdef HIXL_DEVMEM_TEST
  if (getenv("HIXL_TEST_TAG_SKEW")) tag++; /* test builds: a peer whose tags do not follow its calls */
#endif
  l->tags[(l->tag_head + l->tag_n++) % ERDMA_TAGS] = (struct erdma_tag){.after = after, .tag = tag};
  if (!after) (void)tags_post(c, l, eng_of(link_engine(c))->dev[l->dev].max_qp_wr); /* a failure kills c */
  return 0;
}

/* A target's own WR (a staged unit's STAGE_PULL / STAGE_PUSH), completed in erdma_on_cq. */
static int erdma_post_own(struct conn *c, bool write, void *buf, uint32_t len, void *mr, uint64_t raddr,
                          uint32_t rkey, void (*done)(struct conn *c, bool ok, const char *status)) {
  struct erdma_link *l = link_of(c);
  if (!l || !l->qp) {
    errno = ENOTCONN;
    return -1;
  }
  int rc = rdma_post(l->qp, write, buf, len, mr_lkey(mr, l->dev), raddr, rkey, (uint64_t)(uintptr_t)c, true);
  if (rc == 0) l->own_done = done;
  return rc;
}

static void *erdma_bounce_reg(struct HixlEngine *e, void *addr, size_t len, char *err, size_t errlen) {
  if (!eng_of(e)) {
    if (errlen) err[0] = '\0';
    return NULL;
  }
  return mrs_reg(eng_of(e), addr, len, true, NULL, err, errlen);
}
static void erdma_bounce_dereg(void *h) { mrs_free(h); }
static uint32_t erdma_bounce_key(const struct conn *c, const void *h) {
  return rdma_mr_rkey(((const struct erdma_mr *)h)->mr[dev_of_conn(c)]);
}

/* QP numbers are a device's: one is looked up with its device. */
static struct conn *conn_of_qpn(struct HixlEngine *e, int dev, uint32_t qpn) {
  for (struct erdma_link *l = eng_of(e)->links; l; l = l->next)
    if (l->dev == dev && rdma_qp_num(l->qp) == qpn) return l->conn;
  return NULL; /* a link already killed: its chunks were ended then */
}

/* One completion of device dev (progress thread, or a drain of the completions a
 * granting thread kept). */
static void wc_handle(struct HixlEngine *e, int dev, const struct rdma_wc *w) {
  struct conn *c = conn_of_qpn(e, dev, w->qpn);
  if (!c || link_dead(c)) return;
  struct erdma_link *l = link_of(c);
  if (link_is_target(c)) { /* a tag's receive, a target's own WR (a staged unit), or a window's bind */
    if (w->wr_id == ERDMA_WR_RECV) {
      char why[192];
      if (!w->ok || !w->imm) {
        snprintf(why, sizeof(why), "%s on QP 0x%x: %s",
                 w->ok ? "protocol error: a SEND, where only tags (WRITEs with immediate) come"
                       : "a receive failed",
                 w->qpn, w->ok ? "closing this link" : w->status);
        link_conn_kill(c, HIXL_FAILED, why);
        return;
      }
      if (rdma_post_recv0(l->qp, ERDMA_WR_RECV) != 0) {
        snprintf(why, sizeof(why), "ibv_post_recv on QP 0x%x failed: %s", w->qpn, strerror(errno));
        link_conn_kill(c, HIXL_FAILED, why);
        return;
      }
      link_tag_landed(c, w->imm_data);
      return;
    }
    if (w->wr_id == ERDMA_WR_BIND) {
      if (!w->ok) {
        char why[192];
        snprintf(why, sizeof(why), "binding a memory window on QP 0x%x failed: %s", w->qpn, w->status);
        link_conn_kill(c, HIXL_FAILED, why);
      }
      return;
    }
    void (*done)(struct conn *, bool, const char *) = l->own_done;
    l->own_done = NULL;
    if (done) done(c, w->ok, w->status);
    return;
  }
  if (!w->ok) {
    char why[256];
    struct chunk *ch = (struct chunk *)(uintptr_t)w->wr_id;
    bool known = false;
    for (struct chunk *p = l->rpend_head; p && !known; p = p->next_pending) known = p == ch;
    snprintf(why, sizeof(why), "RDMA %s failed: %s (QP 0x%x)",
             known ? (ch->kind == CHUNK_WRITE ? "WRITE" : "READ") : "work request", w->status, w->qpn);
    link_conn_kill(c, HIXL_FAILED, why); /* a QP in error is a broken link */
    return;
  }
  if (w->wr_id == ERDMA_WR_TAG) { /* a tag left: its slot is free (its chunks ended at their own) */
    l->sq_used--;
    erdma_post(c, ERDMA_STEP);
    return;
  }
  /* RC completes in order: this ends every chunk posted up to it. */
  struct chunk *target = (struct chunk *)(uintptr_t)w->wr_id, *ch;
  do {
    ch = fifo_pop(&l->rpend_head, &l->rpend_tail);
    if (!ch) break;
    l->sq_used -= ch->nwr;
    if (ch->dev) engine_dev_stats(e)->rdma_bytes += ch->len;
    link_chunk_moved(c, ch);
    link_chunk_end(ch, HIXL_SUCCESS, "");
  } while (ch != target);
  /* Frames those ends released (a call held behind its transfer) leave before the
   * next posts: where the provider moves the bytes inside ibv_post_send (rxe), a
   * step of posts takes that long, and the call would wait behind it. */
  if (link_unsent(c)) link_flush(c); /* a send failing kills c: erdma_post then posts nothing */
  erdma_post(c, ERDMA_STEP);
}

/* Progress thread: device dev's completion channel fired. Completions a granting
 * thread kept come first: they are older than any still on the CQ. */
static void erdma_on_dev_cq(struct HixlEngine *e, int dev) {
  struct rdma_dev *d = &eng_of(e)->dev[dev];
  struct rdma_wc wc[32];
  rdma_cq_rearm(d);
  for (;;) {
    if (eng_of(e)->stash[dev].n > eng_of(e)->stash[dev].head) {
      erdma_stash_drain(e, dev, wc_handle);
      continue;
    }
    int n = rdma_cq_poll(d, wc, 32);
    if (n <= 0) break;
    for (int i = 0; i < n; i++) wc_handle(e, dev, &wc[i]); /* a grant in one stashes what it meets */
  }
}

/* Kill every link whose QP is on device dev (qpn 0), or the one with QP qpn. */
static void links_kill_on(struct HixlEngine *e, int dev, uint32_t qpn, const char *why) {
  for (struct erdma_link *l = eng_of(e)->links, *next; l; l = next) {
    next = l->next; /* a kill takes l off the list */
    if (l->dev != dev || (qpn && rdma_qp_num(l->qp) != qpn) || link_dead(l->conn)) continue;
    link_conn_kill(l->conn, HIXL_FAILED, why); /* on a rail: its chunks go to another rail */
  }
}

/* Progress thread: device dev's async event fd is readable. A port that went down
 * fails its links at once, rather than after their QPs' retries (RdmaTimeout x
 * RdmaRetryCount: about 30 s with the defaults); while it is down, no link is built on
 * it. A rail taken out this way comes back by its probe once the port is active. */
static void erdma_on_dev_async(struct HixlEngine *e, int dev) {
  struct erdma_engine *x = eng_of(e);
  struct rdma_dev *d = &x->dev[dev];
  struct rdma_async ev;
  char why[192];
  int got;
  while ((got = rdma_async_get(d, &ev)) > 0) {
    switch (ev.kind) {
    case RDMA_ASYNC_PORT_DOWN:
      if (ev.port != d->port) break;
      /* Events come through the kernel's work queue, and can come late: a port that is
       * active again by now is not taken down (a link it broke fails by its QP). */
      if (rdma_port_active(d) == 1) {
        log_warn("engine %s: RDMA device %s port %u: %s, but the port is active again: its links stay",
                 engine_name(e), d->name, d->port, ev.what);
        break;
      }
      /* fall through */
    case RDMA_ASYNC_DEVICE_FATAL:
      atomic_store(&x->down[dev], true);
      snprintf(why, sizeof(why), "RDMA device %s port %u: %s", d->name, d->port, ev.what);
      log_warn("engine %s: %s; its links fail now", engine_name(e), why);
      links_kill_on(e, dev, 0, why);
      break;
    case RDMA_ASYNC_CQ_ERR: /* completions are lost: no request on the device would end but by its deadline */
      atomic_store(&x->cq_err[dev], true);
      snprintf(why, sizeof(why), "RDMA device %s: its completion queue overran (%s)", d->name, ev.what);
      log_error("engine %s: %s; its links fail now, and no QP is made on it again", engine_name(e), why);
      links_kill_on(e, dev, 0, why);
      break;
    case RDMA_ASYNC_PORT_UP:
      if (ev.port != d->port || !atomic_exchange(&x->down[dev], false)) break;
      log_info("engine %s: RDMA device %s port %u: %s", engine_name(e), d->name, d->port, ev.what);
      break;
    case RDMA_ASYNC_QP_FATAL:
      snprintf(why, sizeof(why), "RDMA device %s: QP 0x%x: %s", d->name, ev.qpn, ev.what);
      log_warn("engine %s: %s", engine_name(e), why);
      links_kill_on(e, dev, ev.qpn, why);
      break;
    case RDMA_ASYNC_OTHER: log_info("engine %s: RDMA device %s: %s", engine_name(e), d->name, ev.what); break;
    }
  }
  if (got < 0)
    log_warn("engine %s: RDMA device %s: ibv_get_async_event: %s", engine_name(e), d->name, strerror(errno));
}

/* Progress thread: the epoll of the devices' completion channels and async fds fired. */
static void erdma_on_event(struct HixlEngine *e) {
  struct erdma_engine *x = eng_of(e);
  struct epoll_event ev[2 * ERDMA_DEVS];
  int n = epoll_wait(x->epfd, ev, 2 * ERDMA_DEVS, 0);
  for (int i = 0; i < n; i++) {
    uint32_t v = ev[i].data.u32;
    if (v & ERDMA_EV_ASYNC)
      erdma_on_dev_async(e, (int)(v & ~ERDMA_EV_ASYNC));
    else
      erdma_on_dev_cq(e, (int)v);
  }
}

/* A request timed out. Chunks still waiting for a send-queue slot are dropped as they
 * come up; but work requests already posted cannot be taken back, and a READ among
 * them could still write the caller's memory after the call returned. So each link
 * holding posted WRs of r (several, with rails) is reset: its QP is destroyed (no DMA
 * after that), every chunk on it ends, and the next Connect builds a new QP. Lock held. */
static bool erdma_req_timeout(struct HixlEngine *e, struct hixl_transfer_req *r) {
  bool reset = false;
  if (!eng_of(e)) return false;
  for (struct erdma_link *l = eng_of(e)->links, *next; l; l = next) {
    struct conn *c = l->conn;
    bool holds = false;
    next = l->next; /* a kill takes l off the list */
    if (link_dead(c) || link_is_target(c)) continue;
    for (struct chunk *ch = l->rpend_head; ch && !holds; ch = ch->next_pending) holds = ch->req == r;
    if (!holds) continue;
    char why[192];
    snprintf(why, sizeof(why),
             "RDMA work requests of a transfer were still posted at its deadline: QP 0x%x reset so "
             "none touches memory afterwards; call HixlEngineConnect again",
             erdma_qpn(c));
    link_conn_kill(c, HIXL_TIMEOUT, why);
    reset = true;
  }
  return reset;
}

/* The link is dying: end what it holds and destroy the QP (no DMA after this). */
static void erdma_kill(struct conn *c, HixlStatus st, const char *msg) {
  struct erdma_link *l = link_of(c);
  struct chunk *ch;
  if (!l) return;
  links_remove(c, l);
  erdma_wins_free(link_engine(c), l); /* before the QP they are bound on */
  if (l->qp) {
    rdma_qp_free(l->qp);
    link_wake(link_engine(c)); /* its CQ room comes back once erdma_progress finds the CQ empty */
  }
  l->qp = NULL;
  l->own_done = NULL;
  /* The QP is gone (no DMA after this): on a rail, its chunks go on another rail. */
  while ((ch = fifo_pop(&l->rpend_head, &l->rpend_tail))) link_chunk_lost(c, ch, st, msg);
  while ((ch = fifo_pop(&l->rq_head, &l->rq_tail))) link_chunk_lost(c, ch, st, msg);
  l->sq_used = l->unsignaled = 0;
  l->tail_unsig = false;
  l->tag_n = 0; /* their calls end with the link */
}

static void erdma_free(struct conn *c) {
  struct erdma_link *l = link_of(c);
  if (!l) return;
  links_remove(c, l);
  erdma_wins_free(link_engine(c), l);
  free(l);
  link_set_xs(c, XPORT_RDMA, NULL);
}

static HixlStatus erdma_info(const struct conn *c, struct hixl_link_info *info) {
  struct HixlEngine *e = link_engine(c);
  if (!erdma_has_qp(c)) return HIXL_SUCCESS;
  info->rdma = true;
  info->qpn = erdma_qpn(c);
  snprintf(info->device, sizeof(info->device), "%s", eng_of(e)->dev[link_of(c)->dev].name);
  info->tc_set = (uint8_t)engine_opts(e)->rdma_tc;
  info->sl_set = (uint8_t)engine_opts(e)->rdma_sl;
  struct rdma_qp_params q;
  if (rdma_qp_query(link_of(c)->qp, &q) != 0)
    return hixl_fail(HIXL_FAILED, "hixl_engine_link_info: ibv_query_qp on QP 0x%x failed", info->qpn);
  info->tc_queried = q.tc;
  info->sl_queried = q.sl;
  info->timeout_queried = q.timeout;
  info->retry_queried = q.retry;
  info->windows = (uint32_t)(link_of(c)->wins.n + erdma_rwins_count(&link_of(c)->rwins));
  info->win_ops = link_of(c)->win_ops;
  return HIXL_SUCCESS;
}

/* One-sided: a chunk is a work request, no frame. */
static void erdma_queue(struct conn *c, struct chunk *ch) {
  fifo_push(&link_of(c)->rq_head, &link_of(c)->rq_tail, ch);
}

/* A provider may do the transfer's work in the posting thread (rxe does): the
 * submitter posts a little; completions post the rest, in steps. */
static void erdma_start(struct conn *c, struct hixl_transfer_req *r) {
  (void)r;
  erdma_post(c, ERDMA_CALLER_POST);
}

/* Progress thread, after each batch: chunks queued on an idle QP (moved there from a
 * rail that died, link_chunk_lost) have no completion to post them: post them now. */
static bool erdma_progress(struct HixlEngine *e) {
  struct erdma_engine *x = eng_of(e);
  for (int i = 0; x && i < x->n; i++) {
    if (x->stash[i].n > x->stash[i].head) erdma_stash_drain(e, i, wc_handle); /* kept by a grant */
    if (rdma_cq_dead(&x->dev[i])) erdma_on_dev_cq(e, i); /* found empty: dead QPs' room is free */
  }
  for (struct erdma_link *l = x ? x->links : NULL, *next; l; l = next) {
    next = l->next; /* a failed post kills the link: it leaves the list */
    if ((l->rq_head || l->tag_n) && l->sq_used == 0 && !link_dead(l->conn)) erdma_post(l->conn, ERDMA_STEP);
  }
  return false;
}

/* Whether c moves [raddr, +len) of rm directly: with the registration's key, or inside
 * windows the peer opened to this engine (a scoped peer's key is 0). */
static bool erdma_reach(const struct conn *c, const struct remote_mem *rm, uint64_t raddr, uint64_t len) {
  const struct erdma_link *l = link_of(c);
  return rm->rkey != 0 || (l && l->qp && erdma_rwins_cover(&l->rwins, raddr, len));
}

/* Device memory moves by RDMA where both sides have an MR over it (GPUDirect): this
 * side's registration (erdma_dev_reg; host memory always has one) and the peer's range,
 * keyed or inside its windows. Else as tcp frames through host buffers. */
static bool erdma_dev_reach(struct conn *c, const struct hixl_mem_reg *lreg, const struct remote_mem *rm,
                            uint64_t raddr, uint64_t len) {
  const struct erdma_link *l = link_of(c);
  return l && l->qp && lreg && lreg->xm[XPORT_RDMA] && rm && erdma_reach(c, rm, raddr, len);
}

/* Data completes on the CQ (progress thread); frames (staged units) still need a reader. */
static const uint8_t erdma_frames[] = {WIRE_RDMA_CONNECT, 0};
static const uint8_t erdma_init_frames[] = {WIRE_WIN_ADD, WIRE_WIN_DEL, 0};

const struct xport_ops xport_rdma = {
    .name = "rdma",
    .id = XPORT_RDMA,
    .flags = XPORT_ONE_SIDED | XPORT_STAGE_RDMA | XPORT_TAGS,
    .stage_threshold = STAGE_AUTO_RDMA,
    .frames = erdma_frames,
    .init_frames = erdma_init_frames,
    .iface = {.open = erdma_open,
              .quiesce = xport_no_engine,
              .close = erdma_close,
              .caps = erdma_caps,
              .event_fd = erdma_event_fd,
              .on_event = erdma_on_event,
              .progress = erdma_progress,
              .grant = erdma_win_grant},
    .mem = {.reg = erdma_reg,
            .dereg = erdma_dereg,
            .key = erdma_rkey,
            .share = xport_no_mem,
            .unshare = xport_no_unshare,
            .peer_drop = xport_no_peer_drop,
            .bounce_reg = erdma_bounce_reg,
            .bounce_dereg = erdma_bounce_dereg,
            .bounce_key = erdma_bounce_key},
    .link = {.connect = erdma_connect,
             .attach = erdma_attach,
             .discard = erdma_discard,
             .target_frame = erdma_target_connect,
             .initiator_frame = erdma_win_frame,
             .payload_done = xport_no_link,
             .kill = erdma_kill,
             .closed = xport_no_link,
             .free = erdma_free,
             .info = erdma_info,
             .table_current = xport_no_table_current,
             .reach = erdma_reach,
             .post = erdma_queue,
             .start = erdma_start,
             .async = link_async_unpark,
             .drive = link_async_unpark, /* the CQ moves it; the progress thread reads the link */
             .req_timeout = erdma_req_timeout,
             .answer = xport_no_answer,
             .chunk_end = xport_no_chunk_end,
             .post_own = erdma_post_own,
             .dev_reach = erdma_dev_reach,
             .copy_now = xport_no_copy_now,
             .mem_added = xport_no_mem_added,
             .post_tag = erdma_post_tag},
};
