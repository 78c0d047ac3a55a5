/* xport_shm: the same-host data path of a link. When both engines run on one host
 * (same boot id) and the kernel lets the initiator reach the target's memory, data
 * moves in one copy between the two processes with process_vm_writev (WRITE) and
 * process_vm_readv (READ), many ops per call; the target's CPU does nothing, as
 * with RDMA. The TCP link stays up for control: memory tables, SYNC, NOTIFY, and
 * noticing that the peer went away.
 *
 * Connect: the initiator sends SHM_HELLO; the target answers SHM_HELLO_ACK with its
 * boot id, pid, uid, and the address of 16 random bytes in its own memory. The
 * initiator reads those bytes from that pid with process_vm_readv: a match proves
 * the kernel allows the copies and that the pid is the peer (not a process of
 * another PID namespace, nor one a remote peer named). A refusal (EPERM: other
 * user, Yama ptrace_scope, a non-dumpable target) is logged and auto goes on to rdma
 * or tcp; Transport shm fails Connect with the reason.
 *
 * Data: a sync transfer is copied by its caller's thread, an async one by the
 * progress thread in steps of ESHM_STEP bytes (small ones by the submitter), both
 * with the engine lock released during the copy. A copy that finds the peer gone
 * (ESRCH, or its pidfd says it exited) breaks the link. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "engine/engine_int.h"
#include "transport/shm/cma.h"
#include "transport/shm/xport_shm.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"

#define ESHM_STEP        (16u << 20) /* bytes per copy step: deadlines are checked between steps */
#define ESHM_STEP_CHUNKS 1024u       /* chunks per progress-thread step */
#define ESHM_CALLER_COPY (64u << 10) /* an async request this small is copied by its caller */

struct eshm_engine {    /* e->xe[XPORT_SHM], while same-host copies are on */
  struct cma_self self; /* boot id, pid and uid told to shm peers */
  size_t queued;        /* async chunks waiting, on every link */
  uint32_t copying;     /* threads inside a copy, lock released; Finalize waits for 0 */
  uint64_t round;       /* progress-thread rounds over links with work */
};

/* The peer process an initiator link copies to and from. Copies run without the
 * engine lock and hold a reference, so a link that dies meanwhile cannot take this
 * away from under them. Lock held for every field. */
struct shm_peer {
  uint32_t refs;     /* the link's, plus one per copy in progress */
  uint32_t pid, uid; /* the target process, as it named itself and the probe proved */
  int pidfd;         /* -1 where pidfd_open is missing */
  struct conn *conn; /* NULL once the link died */
  char name[WIRE_MAX_NAME + 1];
  char why[384]; /* why the link died, once it did */
};

struct eshm_link {                 /* c->xs[XPORT_SHM] */
  struct shm_peer *peer;           /* initiator: the process copies go to */
  struct chunk *sq_head, *sq_tail; /* initiator: async chunks waiting for the progress thread */
  uint64_t turn;                   /* progress-thread round that last served this link */
  uint8_t nonce[CMA_NONCE_LEN];    /* target: what an initiator's probe must read */
  bool nonce_set;
};

static struct eshm_engine *eng_of(const struct HixlEngine *e) { return e->xe[XPORT_SHM]; }
static struct eshm_link *link_of(const struct conn *c) { return c->xs[XPORT_SHM]; }

static void eshm_peer_put(struct shm_peer *s) {
  if (!s || --s->refs > 0) return;
  if (s->pidfd >= 0) close(s->pidfd);
  free(s);
}

static HixlStatus eshm_open(struct HixlEngine *e) {
  bool must = e->opts.transport == HIXL_TRANSPORT_SHM;
  struct cma_self self;
  if (!must && e->opts.transport != HIXL_TRANSPORT_AUTO) return HIXL_SUCCESS;
  if (cma_self_get(&self) != 0) {
    if (must)
      return hixl_fail(HIXL_FAILED,
                       "HixlEngineInitialize: Transport shm: cannot read this host's boot id from "
                       "/proc/sys/kernel/random/boot_id (%s); is /proc mounted?",
                       strerror(errno));
    log_info("engine %s: no boot id (/proc/sys/kernel/random/boot_id: %s): no same-host copies",
             e->local_name, strerror(errno));
    return HIXL_SUCCESS;
  }
  struct eshm_engine *x = calloc(1, sizeof(*x));
  if (!x) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineInitialize: out of memory");
  x->self = self;
  e->xe[XPORT_SHM] = x;
  return HIXL_SUCCESS;
}

/* Finalize, links ended: a caller may still be inside a copy (lock released), and its
 * chunks hold registrations about to be freed. Its link is dead, so it stops there. */
static void eshm_quiesce(struct HixlEngine *e) {
  while (eng_of(e) && eng_of(e)->copying > 0) pthread_cond_wait(&e->cond, &e->lock);
}

static void eshm_close(struct HixlEngine *e) {
  free(e->xe[XPORT_SHM]);
  e->xe[XPORT_SHM] = NULL;
}

static uint32_t eshm_caps(const struct HixlEngine *e) { return eng_of(e) ? WIRE_CAP_SHM : 0; }

/* ---- Connect ---- */

/* Initiator, during Connect (blocking socket, no lock held). Takes the link when the
 * peer is on this host and the probe proves the copies work (Transport auto or shm);
 * Transport shm fails otherwise, with the reason. */
static HixlStatus eshm_connect(struct HixlEngine *e, int fd, uint64_t deadline, const char *remote,
                               struct peer *p, bool *taken, void **out) {
  uint8_t buf[WIRE_HDR_LEN + WIRE_SHM_HELLO_ACK_LEN + WIRE_SHM_EXT_MAX];
  uint8_t probe[CMA_NONCE_LEN];
  bool must = e->opts.transport == HIXL_TRANSPORT_SHM;
  char why[384] = "";
  struct wire_wr w;
  struct wire_hdr h;
  struct wire_msg m;
  HixlStatus st;
  int pidfd = -1;

  *out = NULL;
  *taken = false;
  if (!must && e->opts.transport != HIXL_TRANSPORT_AUTO) return HIXL_SUCCESS;
  if (!eng_of(e) || !(p->caps & WIRE_CAP_SHM)) {
    if (must)
      return hixl_fail(HIXL_FAILED,
                       "HixlEngineConnect: Transport is shm but %s does not offer same-host copies (its "
                       "Transport is tcp or rdma, or it cannot read its boot id)",
                       remote);
    return HIXL_SUCCESS;
  }
  const struct cma_self *self = &eng_of(e)->self;
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_HELLO);
  wire_put_shm_id(&w, self->boot_id, self->pid, self->uid);
  if ((st = sock_send_all(fd, buf, wire_end(&w, 0), deadline)) != HIXL_SUCCESS ||
      (st = link_handshake_recv(fd, deadline, p, buf, sizeof(buf), &h)) != HIXL_SUCCESS)
    return hixl_fail(st, "HixlEngineConnect: shm handshake with %s: %s", remote, HixlGetLastErrorMessage());
  if (h.type != WIRE_SHM_HELLO_ACK || wire_decode(&h, buf + WIRE_HDR_LEN, &m) != WIRE_OK)
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s answered SHM_HELLO with a malformed %s", remote,
                     wire_type_name(h.type));
  if (m.u.shm.status != WIRE_HELLO_OK) {
    snprintf(why, sizeof(why), "%s does not offer same-host copies", remote);
  } else if (memcmp(m.u.shm.boot_id, self->boot_id, CMA_BOOT_ID_LEN) != 0) {
    snprintf(why, sizeof(why), "%s runs on another host (its boot id differs)", remote);
  } else {
    int err = 0;
    struct cma_seg seg = {probe, m.u.shm.probe_addr, sizeof(probe)};
    /* The pidfd first: it then names the process the probe reaches, not a later one
     * that might reuse the pid. */
    pidfd = cma_pidfd_open(m.u.shm.pid);
    if (pidfd < 0 && errno != ENOSYS) err = errno;
    if (err == 0 && cma_copy(m.u.shm.pid, false, &seg, 1, &err) == sizeof(probe) &&
        memcmp(probe, m.u.shm.nonce, sizeof(probe)) != 0)
      snprintf(why, sizeof(why),
               "pid %u, which %s named, does not hold its probe bytes: another process (a separate PID "
               "namespace?)",
               m.u.shm.pid, remote);
    else if (err != 0)
      cma_explain(err, m.u.shm.pid, m.u.shm.uid, why, sizeof(why));
  }
  if (why[0]) {
    if (pidfd >= 0) close(pidfd);
    if (must) return hixl_fail(HIXL_FAILED, "HixlEngineConnect: Transport is shm, but %s", why);
    log_info("link to %s: no same-host copies (%s)", remote, why);
    return HIXL_SUCCESS;
  }
  struct shm_peer *s = calloc(1, sizeof(*s));
  struct eshm_link *l = calloc(1, sizeof(*l));
  if (!s || !l) {
    free(s);
    free(l);
    if (pidfd >= 0) close(pidfd);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineConnect: out of memory");
  }
  s->refs = 1;
  s->pid = m.u.shm.pid;
  s->uid = m.u.shm.uid;
  s->pidfd = pidfd;
  snprintf(s->name, sizeof(s->name), "%s", remote);
  log_info("link to %s: shm, one copy to and from pid %u (uid %u)", remote, s->pid, s->uid);
  l->peer = s;
  *out = l;
  *taken = true;
  return HIXL_SUCCESS;
}

static void eshm_attach(struct conn *c, void *link) {
  struct eshm_link *l = link;
  c->xs[XPORT_SHM] = l;
  c->xp = &xport_shm;
  l->peer->conn = c;
}

static void eshm_discard(void *link) {
  struct eshm_link *l = link;
  if (!l) return;
  eshm_peer_put(l->peer);
  free(l);
}

/* Target, in the progress thread: answer SHM_HELLO with this process's identity and
 * the address of bytes only this link knows. */
static void eshm_target_hello(struct conn *c, const struct wire_msg *m) {
  struct HixlEngine *e = c->eng;
  struct eshm_engine *x = eng_of(e);
  uint8_t buf[WIRE_HDR_LEN + WIRE_SHM_HELLO_ACK_LEN];
  uint32_t status = WIRE_HELLO_REFUSED;
  struct cma_self none = {0};
  struct wire_wr w;
  struct eshm_link *l = link_of(c);
  if (x && !l && (l = calloc(1, sizeof(*l)))) c->xs[XPORT_SHM] = l;
  if (l && !l->nonce_set)
    l->nonce_set = getrandom(l->nonce, sizeof(l->nonce), 0) == (ssize_t)sizeof(l->nonce);
  if (x && l && l->nonce_set) status = WIRE_HELLO_OK;
  const struct cma_self *self = x ? &x->self : &none;
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_HELLO_ACK);
  wire_put_u32(&w, status);
  wire_put_shm_id(&w, self->boot_id, self->pid, self->uid);
  wire_put_u64(&w, status == WIRE_HELLO_OK ? (uint64_t)(uintptr_t)l->nonce : 0);
  if (status == WIRE_HELLO_OK)
    wire_put_bytes(&w, l->nonce, sizeof(l->nonce));
  else
    for (int i = 0; i < 4; i++) wire_put_u32(&w, 0);
  link_queue_copy(c, buf, wire_end(&w, 0));
  if (c->dead) return;
  log_info("link from %s: %s (peer pid %u uid %u)", c->remote_name,
           status == WIRE_HELLO_OK ? "offered same-host copies" : "refused same-host copies", m->u.shm.pid,
           m->u.shm.uid);
}

/* ---- data ---- */

/* Whether err means the peer process can no longer be reached at all. */
static bool fatal_errno(int err) { return err == ESRCH || err == EPERM || err == EACCES; }

/* Copy v[0..n) (chunks of one kind) to or from s's process with the lock released,
 * then end each chunk. A range the kernel refuses (EFAULT: unmapped on either side)
 * fails alone; a peer that is gone breaks the link and fails the rest. Lock held on
 * entry and on return; v's chunks must not be on any queue. */
static void shm_copy(struct HixlEngine *e, struct shm_peer *s, struct chunk *const *v, size_t n,
                     struct cma_seg *segs) {
  struct eshm_engine *x = eng_of(e);
  bool write = v[0]->kind == CHUNK_WRITE;
  const char *call = write ? "process_vm_writev" : "process_vm_readv";
  size_t pos = 0;
  for (size_t k = 0; k < n; k++) segs[k] = (struct cma_seg){v[k]->laddr, v[k]->raddr, v[k]->len};
  s->refs++;
  while (pos < n) {
    int err = 0;
    size_t bytes = 0;
    if (!s->conn) { /* the link died: Disconnect, Finalize, or the peer went away */
      while (pos < n) link_chunk_end(v[pos++], HIXL_FAILED, s->why);
      break;
    }
    x->copying++;
    pthread_mutex_unlock(&e->lock);
    if (cma_pid_exited(s->pidfd))
      err = ESRCH;
    else
      bytes = cma_copy(s->pid, write, segs + pos, n - pos, &err);
    pthread_mutex_lock(&e->lock);
    if (--x->copying == 0) pthread_cond_broadcast(&e->cond);
    for (; pos < n && bytes >= segs[pos].len; pos++) {
      bytes -= segs[pos].len;
      link_chunk_end(v[pos], HIXL_SUCCESS, "");
    }
    if (pos == n) break;
    char why[384];
    if (!fatal_errno(err)) { /* this range only; the next ones may well work */
      snprintf(why, sizeof(why),
               "%s with pid %u failed on remote [0x%llx, +%u) / local %p: %s (memory unmapped on one side "
               "while registered?)",
               call, s->pid, (unsigned long long)v[pos]->raddr, v[pos]->len, (void *)v[pos]->laddr,
               strerror(err));
      log_warn("link to %s: %s", s->name, why);
      link_chunk_end(v[pos++], HIXL_FAILED, why);
      continue;
    }
    char msg[sizeof(why) + sizeof(s->name) + 16];
    if (err == ESRCH)
      snprintf(why, sizeof(why), "the peer process (pid %u) has exited (%s: no such process)", s->pid, call);
    else
      snprintf(why, sizeof(why), "%s on pid %u is no longer permitted: %s", call, s->pid, strerror(err));
    if (s->conn) link_conn_kill(s->conn, HIXL_FAILED, why);
    snprintf(msg, sizeof(msg), "link to %s: %s", s->name, why);
    while (pos < n) link_chunk_end(v[pos++], HIXL_FAILED, msg);
  }
  eshm_peer_put(s);
}

/* A sync request on an shm link: its caller copies it, step by step. Lock held. */
static void eshm_run_sync(struct conn *c, struct hixl_transfer_req *r) {
  struct HixlEngine *e = c->eng;
  struct shm_peer *s = link_of(c)->peer; /* c may die while a copy runs: only s from here on */
  struct chunk *vbuf[16], **v = vbuf;
  struct cma_seg sbuf[16], *segs = sbuf;
  size_t n = r->ndirect, i = 0; /* staged units go on the socket */
  if (n > 16) {
    v = malloc(n * sizeof(*v));
    segs = malloc(n * sizeof(*segs));
    if (!v || !segs) {
      free(v);
      free(segs);
      for (size_t k = 0; k < n; k++) link_chunk_end(&r->chunks[k], HIXL_RESOURCE_EXHAUSTED, "out of memory");
      return;
    }
  }
  s->refs++;
  while (i < n) {
    size_t j = i, bytes = 0;
    if (hixl_now_ns() >= r->deadline_ns) {
      while (i < n) link_chunk_end(&r->chunks[i++], HIXL_TIMEOUT, "request timed out before it was copied");
      break;
    }
    for (; j < n && (j == i || bytes + r->chunks[j].len <= ESHM_STEP); j++) {
      v[j - i] = &r->chunks[j];
      bytes += r->chunks[j].len;
    }
    shm_copy(e, s, v, j - i, segs);
    i = j;
  }
  eshm_peer_put(s);
  if (v != vbuf) {
    free(v);
    free(segs);
  }
}

/* An async request on an shm link: copied here when small and nothing waits before
 * it, else queued for the progress thread. Lock held; c is not used after a copy. */
static void eshm_async(struct conn *c, struct hixl_transfer_req *r) {
  struct eshm_link *l = link_of(c);
  uint64_t bytes = 0;
  if (r->ndirect < r->nchunks) link_unpark(c); /* staged units: their answers need a reader */
  for (uint32_t k = 0; k < r->ndirect; k++) bytes += r->chunks[k].len;
  if (r->ndirect == 0) return; /* all staged: they go on the socket */
  if (!l->sq_head && bytes <= ESHM_CALLER_COPY && r->ndirect <= 16) {
    eshm_run_sync(c, r);
    return;
  }
  for (uint32_t k = 0; k < r->ndirect; k++) {
    struct chunk *ch = &r->chunks[k];
    ch->next_pending = NULL;
    if (l->sq_tail)
      l->sq_tail->next_pending = ch;
    else
      l->sq_head = ch;
    l->sq_tail = ch;
  }
  eng_of(c->eng)->queued += r->ndirect;
  link_wake(c->eng);
}

/* A sync caller copies its request itself; staged units' answers come on the socket. */
static void eshm_drive(struct conn *c, struct hixl_transfer_req *r) {
  if (r->ndirect < r->nchunks) link_unpark(c);
  if (r->ndirect > 0) eshm_run_sync(c, r); /* c may be gone afterwards */
}

/* Progress thread, between event batches: one step for each link with queued work.
 * Returns whether work is left (the thread then polls instead of sleeping). Lock
 * held; released during each copy. */
static bool eshm_progress(struct HixlEngine *e) {
  struct chunk *v[ESHM_STEP_CHUNKS];
  struct cma_seg segs[ESHM_STEP_CHUNKS];
  struct eshm_engine *x = eng_of(e);
  if (!x || x->queued == 0) return false;
  uint64_t round = ++x->round;
  for (;;) {
    /* Links change while a copy runs: look again from the head every time. */
    struct conn *c = e->conns;
    while (c && (c->dead || !link_of(c) || !link_of(c)->sq_head || link_of(c)->turn == round)) c = c->next;
    if (!c) break;
    struct eshm_link *l = link_of(c);
    l->turn = round;
    size_t n = 0, bytes = 0;
    uint64_t now = hixl_now_ns();
    while (l->sq_head && n < ESHM_STEP_CHUNKS && bytes < ESHM_STEP) {
      struct chunk *ch = l->sq_head;
      if (n > 0 && ch->kind != v[0]->kind) break;
      if (!(l->sq_head = ch->next_pending)) l->sq_tail = NULL;
      x->queued--;
      if (ch->req->cancelled || now >= ch->req->deadline_ns) {
        link_chunk_end(ch, HIXL_TIMEOUT, "request timed out before it was copied");
        continue;
      }
      v[n++] = ch;
      bytes += ch->len;
    }
    if (n > 0) shm_copy(e, l->peer, v, n, segs);
  }
  return x->queued > 0;
}

/* The link is dying: end what waits on it and let go of the peer process. */
static void eshm_kill(struct conn *c, HixlStatus st, const char *msg) {
  struct eshm_link *l = link_of(c);
  struct chunk *ch;
  if (!l) return;
  while ((ch = l->sq_head)) {
    if (!(l->sq_head = ch->next_pending)) l->sq_tail = NULL;
    eng_of(c->eng)->queued--;
    link_chunk_end(ch, st, msg);
  }
  if (l->peer) {
    snprintf(l->peer->why, sizeof(l->peer->why), "%s", msg);
    l->peer->conn = NULL;
    eshm_peer_put(l->peer);
    l->peer = NULL;
  }
}

static void eshm_free(struct conn *c) {
  free(c->xs[XPORT_SHM]);
  c->xs[XPORT_SHM] = NULL;
}

static HixlStatus eshm_info(const struct conn *c, struct hixl_link_info *info) {
  if (link_of(c) && link_of(c)->peer) info->peer_pid = link_of(c)->peer->pid;
  return HIXL_SUCCESS;
}

static void eshm_queue(struct conn *c, struct chunk *ch) {
  (void)c, (void)ch; /* copied from the request's chunks by drive or async: no frame, no queue yet */
}

static const uint8_t eshm_frames[] = {WIRE_SHM_HELLO, 0};

const struct xport_ops xport_shm = {
    .name = "shm",
    .id = XPORT_SHM,
    .flags = XPORT_ONE_SIDED,
    .stage_threshold = STAGE_AUTO_TCP,
    .open = eshm_open,
    .quiesce = eshm_quiesce,
    .close = eshm_close,
    .caps = eshm_caps,
    .progress = eshm_progress,
    .connect = eshm_connect,
    .attach = eshm_attach,
    .discard = eshm_discard,
    .target_frame = eshm_target_hello,
    .frames = eshm_frames,
    .kill = eshm_kill,
    .free = eshm_free,
    .info = eshm_info,
    .post = eshm_queue,
    .async = eshm_async,
    .drive = eshm_drive,
};
