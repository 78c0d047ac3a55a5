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
 * (ESRCH, or its pidfd says it exited) breaks the link.
 *
 * Mapped memory: memory the target got from HixlEngineAllocMem is a sealed memfd.
 * Its SHM_HELLO_ACK names a unix socket made for this link; the initiator connects
 * and says so (SHM_MAP_HELLO); the target accepts only the process the link's
 * SHM_HELLO named, as the same user (SO_PEERCRED), and hands it each such region's
 * memfd (SCM_RIGHTS, then SHM_MAP on the link), now and whenever one is allocated.
 * The initiator maps them (MADV_DONTFORK) and moves ops inside them with memcpy; all
 * else keeps process_vm_*. Freeing such memory is a round trip: the target sends
 * SHM_UNMAP to every link that has it and waits; the initiator stops new copies into
 * it, unmaps it once the copies running end, and answers SHM_UNMAP_ACK; a link that
 * does not answer in time is cut. A link that dies unmaps what it had. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_int.h"
#include "transport/shm/cma.h"
#include "transport/shm/uds.h"
#include "transport/shm/xport_shm.h"
#include "util/log.h"
#include "util/memtab.h"
#include "util/sock.h"
#include "util/status_int.h"

#define ESHM_STEP        (16u << 20) /* bytes per copy step: deadlines are checked between steps */
#define ESHM_STEP_CHUNKS 1024u       /* chunks per progress-thread step */
#define ESHM_CALLER_COPY (64u << 10) /* an async request this small is copied by its caller */

struct eshm_engine {    /* e->xe[XPORT_SHM], while same-host copies are on */
  struct cma_self self; /* boot id, pid and uid told to shm peers */
  size_t queued;        /* async chunks waiting, on every link */
  uint32_t copying;     /* threads inside a copy, lock released; Finalize waits for 0 */
  uint32_t unsharing;   /* threads waiting for peers to unmap a region (FreeMem) */
  uint64_t round;       /* progress-thread rounds over links with work */
  int gen_fd;           /* a sealed page that mapping peers read: ... */
  uint64_t *gen;        /* ... its first 8 bytes count withdrawn registrations; NULL: no mapping */
};

/* Initiator: a target's region mapped into this process. */
struct shm_map {
  struct memtab_entry range; /* first: the target's [addr, addr + len), in the peer's maps */
  uint8_t *base;             /* this process's mapping of the region's memfd */
  size_t map_len;
  uint32_t refs; /* copies using it, lock released */
  bool revoked;  /* the target wants it back (SHM_UNMAP) or the link died: no new copy */
  bool ack_owed; /* ... SHM_UNMAP_ACK goes once the last copy ends */
};

/* Target: a region whose memfd a link's initiator was given. */
struct shm_grant {
  struct hixl_mem_reg *reg;
  bool unmapping; /* SHM_UNMAP sent; FreeMem waits for the answer */
};

/* The peer process an initiator link copies to and from. Copies run without the
 * engine lock and hold a reference, so a link that dies meanwhile cannot take this
 * away from under them. Lock held for every field. */
struct shm_peer {
  uint32_t refs;      /* the link's, plus one per copy in progress */
  uint32_t pid, uid;  /* the target process, as it named itself and the probe proved */
  int pidfd;          /* -1 where pidfd_open is missing */
  struct conn *conn;  /* NULL once the link died */
  struct memtab maps; /* the target's regions mapped here (struct shm_map) */
  uint64_t map_ops;   /* ops moved by memcpy on them */
  char name[WIRE_MAX_NAME + 1];
  char why[384]; /* why the link died, once it did */
};

struct eshm_link {                 /* c->xs[XPORT_SHM] */
  struct shm_peer *peer;           /* initiator: the process copies go to */
  struct chunk *sq_head, *sq_tail; /* initiator: async chunks waiting for the progress thread */
  uint64_t turn;                   /* progress-thread round that last served this link */
  uint8_t nonce[CMA_NONCE_LEN];    /* target: what an initiator's probe must read */
  bool nonce_set;
  int lfd;                  /* target: the socket offered in SHM_HELLO_ACK, until SHM_MAP_HELLO */
  int ufd;                  /* both: the connected unix socket memfds travel on, or -1 */
  uint32_t hello_pid;       /* target: the pid the initiator's SHM_HELLO named */
  struct shm_grant *grants; /* target: regions this link's initiator was given */
  uint32_t ngrants, cap_grants;
  const uint64_t *gen; /* initiator: the target's withdrawal count (its page, mapped) */
  uint64_t gen_seen;   /* ... as the last transfer read it */
};

#define ESHM_GEN_LEN 4096u
#define ESHM_GEN_MSG "hixl-gen" /* the page's message on the unix socket (8 bytes) */

static struct eshm_link *link_new(void) {
  struct eshm_link *l = calloc(1, sizeof(*l));
  if (l) {
    l->lfd = l->ufd = -1;
    l->gen_seen = UINT64_MAX; /* the first transfer reads the socket */
  }
  return l;
}

static void link_release(struct eshm_link *l) {
  if (l->gen) munmap((void *)l->gen, ESHM_GEN_LEN);
  free(l->grants);
  free(l);
}

/* Initiator: take the target's withdrawal page, the first message on the socket. */
static bool gen_take(struct eshm_link *l, int timeout_ms, char *why, size_t cap) {
  char msg[8];
  int fd = -1;
  struct stat st;
  if (uds_recv_fd(l->ufd, msg, sizeof(msg), &fd, timeout_ms) < 0 || memcmp(msg, ESHM_GEN_MSG, 8) != 0) {
    if (fd >= 0) close(fd);
    snprintf(why, cap, "protocol error: the target's first message on the unix socket is not its page (%s)",
             fd >= 0 ? "wrong tag" : strerror(errno));
    return false;
  }
  int seals = fcntl(fd, F_GET_SEALS);
  void *p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size >= ESHM_GEN_LEN && seals >= 0 && (seals & F_SEAL_SHRINK))
    p = mmap(NULL, ESHM_GEN_LEN, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    snprintf(why, cap, "protocol error: the target's page is not a sealed memfd of %u bytes", ESHM_GEN_LEN);
    return false;
  }
  (void)madvise(p, ESHM_GEN_LEN, MADV_DONTFORK);
  l->gen = p;
  return true;
}

/* ---- initiator: mappings ---- */

static void map_free(struct shm_map *mp) {
  if (mp->base) munmap(mp->base, mp->map_len);
  free(mp);
}

static void send_unmap_ack(struct conn *c, uint64_t addr, uint64_t len) {
  uint8_t buf[WIRE_HDR_LEN + WIRE_SHM_UNMAP_LEN];
  struct wire_wr w;
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_UNMAP_ACK);
  wire_put_u64(&w, addr);
  wire_put_u64(&w, len);
  link_queue_copy(c, buf, wire_end(&w, 0));
  if (!c->dead) link_flush(c);
}

/* Take mp out of use: unmapped at once when no copy holds it, else when the last one
 * ends; then SHM_UNMAP_ACK if the target asked and the link is up. The entry stays
 * as a tombstone: an op queued before the target freed the range fails on it rather
 * than reaching, by process_vm_*, whatever the target maps there next. Lock held. */
static void map_retire(struct shm_peer *s, struct shm_map *mp) {
  mp->revoked = true;
  if (mp->refs > 0) return;
  if (mp->base) munmap(mp->base, mp->map_len);
  mp->base = NULL;
  if (mp->ack_owed && s->conn && !s->conn->dead) send_unmap_ack(s->conn, mp->range.addr, mp->range.len);
  mp->ack_owed = false;
}

static void map_put(struct shm_peer *s, struct shm_map *mp) {
  if (--mp->refs == 0 && mp->revoked) map_retire(s, mp);
}

/* Drop the tombstones overlapping [addr, addr + len): the target handed that range
 * over anew. Lock held. */
static void map_bury(struct shm_peer *s, uint64_t addr, uint64_t len) {
  for (size_t i = s->maps.count; i-- > 0;) {
    struct shm_map *mp = (struct shm_map *)s->maps.v[i];
    if (mp->base || mp->refs > 0 || mp->range.addr >= addr + len || mp->range.addr + mp->range.len <= addr)
      continue;
    memtab_remove(&s->maps, &mp->range);
    map_free(mp);
  }
}

static void eshm_peer_put(struct shm_peer *s) {
  if (!s || --s->refs > 0) return;
  for (size_t i = 0; i < s->maps.count; i++) map_free((struct shm_map *)s->maps.v[i]); /* no copy is left */
  memtab_free(&s->maps);
  if (s->pidfd >= 0) close(s->pidfd);
  free(s);
}

/* Receive the memfd an SHM_MAP announces on ufd (waiting at most timeout_ms) and map
 * it. A message that does not match the frame is a protocol error (FAILED, why
 * set); a region that cannot be mapped here is logged and left to process_vm_*. */
static HixlStatus map_take(struct shm_peer *s, int ufd, const struct wire_msg *m, int timeout_ms, char *why,
                           size_t cap) {
  uint8_t data[WIRE_SHM_MAP_LEN], want[WIRE_SHM_MAP_LEN + WIRE_HDR_LEN];
  struct wire_wr w;
  struct stat st;
  int fd = -1;
  if (ufd < 0) {
    snprintf(why, cap, "protocol error: SHM_MAP on a link without a unix socket");
    return HIXL_FAILED;
  }
  if (uds_recv_fd(ufd, data, sizeof(data), &fd, timeout_ms) < 0) {
    snprintf(why, cap,
             "protocol error: SHM_MAP of [0x%llx, +%llu) without its descriptor on the unix socket (%s)",
             (unsigned long long)m->u.map.addr, (unsigned long long)m->u.map.len, strerror(errno));
    return HIXL_FAILED;
  }
  wire_begin(&w, want, sizeof(want), WIRE_SHM_MAP);
  wire_put_u64(&w, m->u.map.addr);
  wire_put_u64(&w, m->u.map.len);
  wire_put_u64(&w, m->u.map.map_len);
  if (memcmp(data, want + WIRE_HDR_LEN, sizeof(data)) != 0) {
    close(fd);
    snprintf(why, cap, "protocol error: the descriptor on the unix socket is not the one SHM_MAP announced");
    return HIXL_FAILED;
  }
  map_bury(s, m->u.map.addr, m->u.map.len); /* a range freed before, handed over anew */
  /* Sealed against shrinking: the target cannot make a mapped page vanish (SIGBUS). */
  int seals = fcntl(fd, F_GET_SEALS);
  const char *bad = NULL;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
    bad = "not a regular file";
  else if (seals < 0 || !(seals & F_SEAL_SHRINK))
    bad = "not sealed against shrinking";
  else if ((uint64_t)st.st_size < m->u.map.map_len || m->u.map.map_len > SIZE_MAX)
    bad = "shorter than the region";
  else if (memtab_find(&s->maps, m->u.map.addr, 1) ||
           memtab_find(&s->maps, m->u.map.addr + m->u.map.len - 1, 1))
    bad = "overlapping a region already mapped";
  if (bad) {
    close(fd);
    snprintf(why, cap, "protocol error: the memfd of [0x%llx, +%llu) is %s",
             (unsigned long long)m->u.map.addr, (unsigned long long)m->u.map.len, bad);
    return HIXL_FAILED;
  }
  void *p = mmap(NULL, (size_t)m->u.map.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  struct shm_map *mp = p != MAP_FAILED ? calloc(1, sizeof(*mp)) : NULL;
  struct memtab_entry *clash;
  if (mp) {
    mp->range.addr = m->u.map.addr;
    mp->range.len = m->u.map.len;
    mp->base = p;
    mp->map_len = (size_t)m->u.map.map_len;
    /* A child forked later must not keep the target's pages alive, nor write them. */
    if (madvise(p, mp->map_len, MADV_DONTFORK) < 0 || memtab_add(&s->maps, &mp->range, &clash) < 0) {
      err = errno;
      map_free(mp);
      mp = NULL;
      p = MAP_FAILED;
    }
  } else if (p != MAP_FAILED) {
    munmap(p, (size_t)m->u.map.map_len);
    err = ENOMEM;
    p = MAP_FAILED;
  }
  if (!mp) {
    log_warn("link to %s: cannot map the peer's [0x%llx, +%llu) (%s): process_vm_* copies it", s->name,
             (unsigned long long)m->u.map.addr, (unsigned long long)m->u.map.len, strerror(err));
    return HIXL_SUCCESS;
  }
  log_info("link to %s: mapped the peer's [0x%llx, +%llu) at %p", s->name, (unsigned long long)m->u.map.addr,
           (unsigned long long)m->u.map.len, (void *)mp->base);
  return HIXL_SUCCESS;
}

static struct eshm_engine *eng_of(const struct HixlEngine *e) { return e->xe[XPORT_SHM]; }
static struct eshm_link *link_of(const struct conn *c) { return c->xs[XPORT_SHM]; }

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
  /* The withdrawal page: without it no memory is offered to map (logged). */
  x->gen_fd = memfd_create("hixl-gen", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (x->gen_fd >= 0 && ftruncate(x->gen_fd, ESHM_GEN_LEN) == 0 &&
      fcntl(x->gen_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0) {
    void *p = mmap(NULL, ESHM_GEN_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, x->gen_fd, 0);
    x->gen = p != MAP_FAILED ? p : NULL;
  }
  if (!x->gen) {
    log_info("engine %s: no memory offered to same-host peers to map (its page: %s)", e->local_name,
             strerror(errno));
    if (x->gen_fd >= 0) close(x->gen_fd);
    x->gen_fd = -1;
  }
  e->xe[XPORT_SHM] = x;
  return HIXL_SUCCESS;
}

/* Finalize, links ended: a caller may still be inside a copy (lock released), and its
 * chunks hold registrations about to be freed. Its link is dead, so it stops there. */
static void eshm_quiesce(struct HixlEngine *e) {
  while (eng_of(e) && (eng_of(e)->copying > 0 || eng_of(e)->unsharing > 0))
    pthread_cond_wait(&e->cond, &e->lock);
}

static void eshm_close(struct HixlEngine *e) {
  struct eshm_engine *x = eng_of(e);
  if (x && x->gen) munmap(x->gen, ESHM_GEN_LEN);
  if (x && x->gen_fd >= 0) close(x->gen_fd);
  free(x);
  e->xe[XPORT_SHM] = NULL;
}

static uint32_t eshm_caps(const struct HixlEngine *e) { return eng_of(e) ? WIRE_CAP_SHM : 0; }

/* ---- Connect ---- */

static void eshm_discard(void *link);

/* Initiator, in Connect, the probe passed and the target offered a unix socket:
 * connect to it, say so, and map the regions the target hands over until its
 * SHM_MAP_ACK. A socket that cannot be reached or a target that refuses leaves the
 * link on process_vm_* (logged); a malformed answer fails Connect. */
static HixlStatus map_connect(int fd, uint64_t deadline, struct peer *p, struct eshm_link *l,
                              const char *sock, size_t sock_len, uint8_t *buf, size_t cap) {
  struct shm_peer *s = l->peer;
  struct wire_wr w;
  struct wire_hdr h;
  struct wire_msg m;
  char why[384];
  HixlStatus st;
  if ((l->ufd = uds_connect(sock, sock_len)) < 0) {
    log_info("link to %s: no mapped memory: cannot reach its unix socket (%s)", s->name, strerror(errno));
    return HIXL_SUCCESS;
  }
  wire_begin(&w, buf, cap, WIRE_SHM_MAP_HELLO);
  wire_put_u32(&w, 0);
  if ((st = sock_send_all(fd, buf, wire_end(&w, 0), deadline)) != HIXL_SUCCESS) return st;
  for (;;) {
    if ((st = link_handshake_recv(fd, deadline, p, buf, cap, &h)) != HIXL_SUCCESS) return st;
    if ((h.type != WIRE_SHM_MAP && h.type != WIRE_SHM_MAP_ACK) ||
        wire_decode(&h, buf + WIRE_HDR_LEN, &m) != WIRE_OK)
      return hixl_fail(HIXL_FAILED, "answered SHM_MAP_HELLO with a malformed %s", wire_type_name(h.type));
    uint64_t now = hixl_now_ns();
    int ms = now < deadline ? (int)((deadline - now + 999999) / 1000000) : 0;
    /* The target's page comes first on the socket, when it hands anything over. */
    bool ok = h.type == WIRE_SHM_MAP || m.u.map.status == WIRE_HELLO_OK;
    if (ok && !l->gen && !gen_take(l, ms, why, sizeof(why))) return hixl_fail(HIXL_FAILED, "%s", why);
    if (h.type == WIRE_SHM_MAP_ACK) break;
    if (map_take(s, l->ufd, &m, ms, why, sizeof(why)) != HIXL_SUCCESS)
      return hixl_fail(HIXL_FAILED, "%s", why);
  }
  if (m.u.map.status != WIRE_HELLO_OK) {
    log_warn("link to %s: it refused to map its memory here: %.*s; process_vm_* copies it", s->name,
             (int)m.u.map.text_len, (const char *)m.u.map.text);
    close(l->ufd);
    l->ufd = -1;
    return HIXL_SUCCESS;
  }
  log_info("link to %s: %zu of its regions mapped here", s->name, s->maps.count);
  return HIXL_SUCCESS;
}

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
  wire_put_shm_id(&w, WIRE_SHM_LAYOUT, self->boot_id, self->pid, self->uid);
  wire_put_u32(&w, WIRE_SHM_F_MAP);
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
  char sock[WIRE_SHM_SOCK_MAX];
  size_t sock_len = m.u.shm.sock_len; /* m points into buf, which the next frame overwrites */
  memcpy(sock, m.u.shm.sock, sock_len);
  struct shm_peer *s = calloc(1, sizeof(*s));
  struct eshm_link *l = link_new();
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
  if (sock_len > 0 &&
      (st = map_connect(fd, deadline, p, l, sock, sock_len, buf, sizeof(buf))) != HIXL_SUCCESS) {
    eshm_discard(l);
    return hixl_fail(st, "HixlEngineConnect: shm handshake with %s: %s", remote, HixlGetLastErrorMessage());
  }
  *out = l;
  *taken = true;
  return HIXL_SUCCESS;
}

static void eshm_attach(struct conn *c, void *link) {
  struct eshm_link *l = link;
  c->xs[XPORT_SHM] = l;
  c->xp = &xport_shm;
  l->peer->conn = c;
  if (l->ufd >= 0) { /* the target may send SHM_MAP and SHM_UNMAP at any time: read them */
    c->always_read = true;
    link_unpark(c);
  }
}

static void eshm_discard(void *link) {
  struct eshm_link *l = link;
  if (!l) return;
  if (l->ufd >= 0) close(l->ufd);
  eshm_peer_put(l->peer);
  link_release(l);
}

/* Target, in the progress thread: answer SHM_HELLO with this process's identity and
 * the address of bytes only this link knows; to an initiator that maps memory, also
 * the name of a unix socket made for this link (layout 2). */
static void eshm_target_hello(struct conn *c, const struct wire_msg *m) {
  struct HixlEngine *e = c->eng;
  struct eshm_engine *x = eng_of(e);
  uint8_t buf[WIRE_HDR_LEN + WIRE_SHM_HELLO_ACK_LEN + 2 + WIRE_SHM_SOCK_MAX];
  char sock[64] = "";
  uint32_t status = WIRE_HELLO_REFUSED;
  struct cma_self none = {0};
  struct wire_wr w;
  struct eshm_link *l = link_of(c);
  if (x && !l && (l = link_new())) c->xs[XPORT_SHM] = l;
  if (l && !l->nonce_set)
    l->nonce_set = getrandom(l->nonce, sizeof(l->nonce), 0) == (ssize_t)sizeof(l->nonce);
  if (x && l && l->nonce_set) status = WIRE_HELLO_OK;
  if (status == WIRE_HELLO_OK && (m->u.shm.flags & WIRE_SHM_F_MAP) && x->gen && l->lfd < 0 && l->ufd < 0) {
    l->hello_pid = m->u.shm.pid;
    if ((l->lfd = uds_listen(sock, sizeof(sock))) < 0) {
      log_warn("link from %s: no mapped memory: cannot make a unix socket: %s", c->remote_name,
               strerror(errno));
      sock[0] = '\0';
    }
  }
  const struct cma_self *self = x ? &x->self : &none;
  bool layout2 = m->u.shm.layout >= 2; /* a layout-1 initiator gets what it knows */
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_HELLO_ACK);
  wire_put_u32(&w, status);
  wire_put_shm_id(&w, layout2 ? WIRE_SHM_LAYOUT : 1, self->boot_id, self->pid, self->uid);
  wire_put_u64(&w, status == WIRE_HELLO_OK ? (uint64_t)(uintptr_t)l->nonce : 0);
  if (status == WIRE_HELLO_OK)
    wire_put_bytes(&w, l->nonce, sizeof(l->nonce));
  else
    for (int i = 0; i < 4; i++) wire_put_u32(&w, 0);
  if (layout2) {
    wire_put_u16(&w, (uint16_t)strlen(sock));
    wire_put_bytes(&w, sock, strlen(sock));
  }
  link_queue_copy(c, buf, wire_end(&w, 0));
  if (c->dead) return;
  log_info("link from %s: %s (peer pid %u uid %u)", c->remote_name,
           status == WIRE_HELLO_OK ? "offered same-host copies" : "refused same-host copies", m->u.shm.pid,
           m->u.shm.uid);
}

/* Target: hand r's memfd to c's initiator (the descriptor on the unix socket first,
 * then SHM_MAP on the link, so it is there when the frame is read). Lock held. */
static void grant(struct conn *c, struct hixl_mem_reg *r) {
  struct eshm_link *l = link_of(c);
  uint8_t buf[WIRE_HDR_LEN + WIRE_SHM_MAP_LEN];
  struct wire_wr w;
  if (l->ngrants == l->cap_grants) {
    uint32_t cap = l->cap_grants ? 2 * l->cap_grants : 8;
    struct shm_grant *g = realloc(l->grants, cap * sizeof(*g));
    if (!g) {
      log_warn("link from %s: out of memory: [0x%llx, +%llu) is not mapped there", c->remote_name,
               (unsigned long long)r->range.addr, (unsigned long long)r->range.len);
      return;
    }
    l->grants = g;
    l->cap_grants = cap;
  }
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_MAP);
  wire_put_u64(&w, r->range.addr);
  wire_put_u64(&w, r->range.len);
  wire_put_u64(&w, r->map_len);
  size_t len = wire_end(&w, 0);
  if (uds_send_fd(l->ufd, buf + WIRE_HDR_LEN, WIRE_SHM_MAP_LEN, r->memfd) < 0) {
    log_warn("link from %s: cannot hand over the memfd of [0x%llx, +%llu) (%s): process_vm_* copies it",
             c->remote_name, (unsigned long long)r->range.addr, (unsigned long long)r->range.len,
             strerror(errno));
    return;
  }
  l->grants[l->ngrants++] = (struct shm_grant){r, false};
  link_queue_copy(c, buf, len);
}

/* Whether r can be handed to peers: HixlEngineAllocMem's, sealed, not being freed. */
static bool grantable(const struct hixl_mem_reg *r) { return r->memfd >= 0 && r->sealed && !r->unsharing; }

/* Target, SHM_MAP_HELLO: the initiator says it connected to the link's socket. Take
 * the connection of the process the link's SHM_HELLO named, running as this user;
 * hand it every region there is; answer SHM_MAP_ACK. */
static void target_map_hello(struct conn *c) {
  struct HixlEngine *e = c->eng;
  struct eshm_link *l = link_of(c);
  uint8_t buf[WIRE_HDR_LEN + 4 + WIRE_SHM_REASON_MAX];
  char why[WIRE_SHM_REASON_MAX] = "";
  struct wire_wr w;
  uint32_t me = (uint32_t)geteuid();
  if (!l || l->lfd < 0) {
    snprintf(why, sizeof(why), "no unix socket was offered on this link");
  } else {
    int fd;
    while ((fd = accept4(l->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
      uint32_t pid = 0, uid = 0;
      if (uds_peer(fd, &pid, &uid) == 0 && pid == l->hello_pid && uid == me) {
        l->ufd = fd;
        break;
      }
      /* Anyone may connect to an abstract socket: only the link's own peer is taken. */
      if (pid != l->hello_pid)
        snprintf(why, sizeof(why),
                 "pid %u (uid %u) connected to the unix socket, but this link's peer is pid %u", pid, uid,
                 l->hello_pid);
      else
        snprintf(why, sizeof(why),
                 "pid %u connected as uid %u; memory is mapped only into processes of uid %u", pid, uid, me);
      close(fd);
    }
    if (l->ufd < 0 && !why[0]) snprintf(why, sizeof(why), "nobody connected to the unix socket");
    close(l->lfd);
    l->lfd = -1;
  }
  if (l && l->ufd >= 0 && uds_send_fd(l->ufd, ESHM_GEN_MSG, 8, eng_of(e)->gen_fd) < 0) {
    snprintf(why, sizeof(why), "cannot hand over its page on the unix socket: %s", strerror(errno));
    close(l->ufd);
    l->ufd = -1;
  }
  if (l && l->ufd >= 0) {
    why[0] = '\0';
    for (size_t i = 0; i < e->regs.count && !c->dead; i++) {
      struct hixl_mem_reg *r = (struct hixl_mem_reg *)e->regs.v[i];
      if (grantable(r)) grant(c, r);
    }
    if (c->dead) return;
    log_info("link from %s: %u regions handed over to map", c->remote_name, l->ngrants);
  } else {
    log_warn("link from %s: memory not mapped there: %s", c->remote_name, why);
  }
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_MAP_ACK);
  wire_put_u32(&w, why[0] ? WIRE_HELLO_REFUSED : WIRE_HELLO_OK);
  wire_put_bytes(&w, why, strlen(why));
  link_queue_copy(c, buf, wire_end(&w, 0));
}

/* Target: forget the grant at i; a FreeMem waiting for it is told. Lock held. */
static void grant_drop(struct HixlEngine *e, struct eshm_link *l, uint32_t i) {
  struct shm_grant g = l->grants[i];
  l->grants[i] = l->grants[--l->ngrants];
  if (g.unmapping) { /* FreeMem waits for the region's count, drop_peer for the link's grants */
    g.reg->unshare_wait--;
    pthread_cond_broadcast(&e->cond);
  }
}

/* Target, SHM_UNMAP_ACK: the initiator let go of a region. */
static void target_unmap_ack(struct conn *c, const struct wire_msg *m) {
  struct eshm_link *l = link_of(c);
  for (uint32_t i = 0; l && i < l->ngrants; i++)
    if (l->grants[i].reg->range.addr == m->u.map.addr && l->grants[i].reg->range.len == m->u.map.len) {
      grant_drop(c->eng, l, i);
      return;
    }
}

static void eshm_target_frame(struct conn *c, const struct wire_msg *m) {
  switch (m->hdr.type) {
  case WIRE_SHM_HELLO: eshm_target_hello(c, m); break;
  case WIRE_SHM_MAP_HELLO: target_map_hello(c); break;
  case WIRE_SHM_UNMAP_ACK: target_unmap_ack(c, m); break;
  default: break;
  }
}

/* Initiator: a frame the target sent on its own. */
static void eshm_initiator_frame(struct conn *c, const struct wire_msg *m) {
  struct eshm_link *l = link_of(c);
  char why[384];
  if (!l || !l->peer) {
    link_conn_kill(c, HIXL_FAILED, "protocol error: a same-host frame on a link that is not shm");
    return;
  }
  struct shm_peer *s = l->peer;
  if (m->hdr.type == WIRE_SHM_MAP) {
    if (map_take(s, l->ufd, m, 0, why, sizeof(why)) != HIXL_SUCCESS) link_conn_kill(c, HIXL_FAILED, why);
    return;
  }
  if (m->hdr.type == WIRE_SHM_UNMAP) {
    struct shm_map *mp = (struct shm_map *)memtab_find_exact(&s->maps, m->u.map.addr, m->u.map.len);
    /* Ops submitted from now on fail at once: the region leaves the peer's table. */
    struct memtab_entry *ent =
        c->peer ? memtab_find_exact(&c->peer->rtab, m->u.map.addr, m->u.map.len) : NULL;
    if (ent && memtab_remove(&c->peer->rtab, ent)) free(ent);
    if (!mp) { /* never mapped here (it could not be): nothing to wait for */
      send_unmap_ack(c, m->u.map.addr, m->u.map.len);
      return;
    }
    mp->ack_owed = true;
    map_retire(s, mp);
    return;
  }
  snprintf(why, sizeof(why), "protocol error: unexpected %s", wire_type_name(m->hdr.type));
  link_conn_kill(c, HIXL_FAILED, why);
}

/* ---- data ---- */

/* Whether err means the peer process can no longer be reached at all. */
static bool fatal_errno(int err) { return err == ESRCH || err == EPERM || err == EACCES; }

/* The mapping holding all of [addr, addr + len) of the target, or NULL. */
static struct shm_map *map_of(struct shm_peer *s, uint64_t addr, uint64_t len) {
  return s->maps.count ? (struct shm_map *)memtab_find(&s->maps, addr, len) : NULL;
}

/* memcpy v[0..n), all inside mp, with the lock released; the chunks end SUCCESS, or
 * FAILED when the peer process is found gone afterwards (its pages outlive it:
 * nothing faults, but nobody is there to read them). Lock held on entry and return. */
static void map_copy(struct HixlEngine *e, struct shm_peer *s, struct shm_map *mp, struct chunk *const *v,
                     const struct cma_seg *segs, size_t n, bool write) {
  struct eshm_engine *x = eng_of(e);
  mp->refs++;
  x->copying++;
  pthread_mutex_unlock(&e->lock);
  for (size_t k = 0; k < n; k++) {
    uint8_t *remote = mp->base + (segs[k].remote - mp->range.addr);
    if (write)
      memcpy(remote, segs[k].local, segs[k].len);
    else
      memcpy(segs[k].local, remote, segs[k].len);
  }
  bool gone = cma_pid_exited(s->pidfd); /* after: a peer that died meanwhile read nothing */
  pthread_mutex_lock(&e->lock);
  if (--x->copying == 0) pthread_cond_broadcast(&e->cond);
  map_put(s, mp);
  char why[64], msg[sizeof(why) + sizeof(s->name) + 16] = "";
  if (gone) {
    snprintf(why, sizeof(why), "the peer process (pid %u) has exited", s->pid);
    if (s->conn) link_conn_kill(s->conn, HIXL_FAILED, why);
    snprintf(msg, sizeof(msg), "link to %s: %s", s->name, why);
  } else {
    s->map_ops += n;
  }
  for (size_t k = 0; k < n; k++) link_chunk_end(v[k], gone ? HIXL_FAILED : HIXL_SUCCESS, msg);
}

/* Copy v[0..n) (chunks of one kind) to or from s's process with the lock released,
 * then end each chunk: by memcpy where the target's range is mapped here, else by
 * process_vm_*. A range the kernel refuses (EFAULT: unmapped on either side) fails
 * alone; a peer that is gone breaks the link and fails the rest. Lock held on entry
 * and on return; v's chunks must not be on any queue. */
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
    /* A run of ops inside one mapping, or a run of ops outside every mapping. */
    struct shm_map *mp = map_of(s, segs[pos].remote, segs[pos].len);
    size_t end = pos + 1;
    while (end < n && map_of(s, segs[end].remote, segs[end].len) == mp) end++;
    if (mp && mp->revoked) {
      char why[384];
      snprintf(why, sizeof(why), "%s freed [0x%llx, +%llu) (SHM_UNMAP): ops into it fail", s->name,
               (unsigned long long)mp->range.addr, (unsigned long long)mp->range.len);
      while (pos < end) link_chunk_end(v[pos++], HIXL_FAILED, why);
      continue;
    }
    if (mp) {
      map_copy(e, s, mp, v + pos, segs + pos, end - pos, write);
      pos = end;
      continue;
    }
    x->copying++;
    pthread_mutex_unlock(&e->lock);
    if (cma_pid_exited(s->pidfd))
      err = ESRCH;
    else
      bytes = cma_copy(s->pid, write, segs + pos, end - pos, &err);
    pthread_mutex_lock(&e->lock);
    if (--x->copying == 0) pthread_cond_broadcast(&e->cond);
    for (; pos < end && bytes >= segs[pos].len; pos++) {
      bytes -= segs[pos].len;
      link_chunk_end(v[pos], HIXL_SUCCESS, "");
    }
    if (pos == end) continue;
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
  if (c->dead) return;                         /* died as r started: transfer_submit ended its chunks */
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
  if (c->dead) return; /* died as r started: transfer_submit ended its chunks */
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

/* The link is dying: end what waits on it, unmap what it mapped (once copies running
 * end), let go of the peer process; a target forgets what it handed over. */
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
    struct shm_peer *s = l->peer;
    snprintf(s->why, sizeof(s->why), "%s", msg);
    s->conn = NULL; /* no SHM_UNMAP_ACK any more */
    for (size_t i = s->maps.count; i-- > 0;) map_retire(s, (struct shm_map *)s->maps.v[i]);
    eshm_peer_put(s);
    l->peer = NULL;
  }
  while (l->ngrants > 0) grant_drop(c->eng, l, l->ngrants - 1);
  if (l->lfd >= 0) close(l->lfd);
  if (l->ufd >= 0) close(l->ufd);
  l->lfd = l->ufd = -1;
}

static void eshm_free(struct conn *c) {
  if (link_of(c)) link_release(link_of(c));
  c->xs[XPORT_SHM] = NULL;
}

/* Move the count mapping peers read before a transfer: their next one reads the
 * socket first. */
static void gen_bump(struct HixlEngine *e) {
  if (eng_of(e) && eng_of(e)->gen) __atomic_add_fetch(eng_of(e)->gen, 1, __ATOMIC_RELEASE);
}

/* A registration was withdrawn (its MEM_DEL sent): mapping peers see the count move. */
static void eshm_mem_dereg(struct HixlEngine *e, struct hixl_mem_reg *r) {
  (void)r;
  gen_bump(e);
}

/* A target's link was cut (Disconnect, drop_peer, Finalize, a bad frame): its
 * initiator must not take the count as a reason to skip the socket, where the end of
 * the stream now waits, and copy once more with process_vm_* into memory this side
 * may already reuse. Moved after the shutdown, so a transfer that sees the new count
 * also sees the end. (A copy already past its check cannot be stopped.) */
static void eshm_closed(struct conn *c) {
  if (c->role == CONN_TARGET && link_of(c)) gen_bump(c->eng);
}

/* Initiator: nothing withdrawn since the last transfer asked. */
static bool eshm_table_current(struct conn *c) {
  struct eshm_link *l = link_of(c);
  if (!l || !l->gen) return false;
  uint64_t v = __atomic_load_n(l->gen, __ATOMIC_ACQUIRE);
  if (v == l->gen_seen) return true;
  l->gen_seen = v; /* the caller now applies what the socket holds, all of it sent before v */
  return false;
}

static HixlStatus eshm_info(const struct conn *c, struct hixl_link_info *info) {
  struct eshm_link *l = link_of(c);
  if (!l || !l->peer) return HIXL_SUCCESS;
  info->peer_pid = l->peer->pid;
  for (size_t i = 0; i < l->peer->maps.count; i++) {
    const struct shm_map *mp = (const struct shm_map *)l->peer->maps.v[i];
    if (mp->revoked) continue; /* being unmapped, or a tombstone */
    info->mapped++;
    info->mapped_bytes += mp->range.len;
  }
  info->map_ops = l->peer->map_ops;
  if (l->gen) info->peer_gen = __atomic_load_n(l->gen, __ATOMIC_ACQUIRE);
  return HIXL_SUCCESS;
}

static void eshm_queue(struct conn *c, struct chunk *ch) {
  (void)c, (void)ch; /* copied from the request's chunks by drive or async: no frame, no queue yet */
}

/* ---- memory ---- */

/* HixlEngineAllocMem made r: hand it to every link whose initiator maps memory. */
static void eshm_mem_share(struct HixlEngine *e, struct hixl_mem_reg *r) {
  if (!eng_of(e) || !grantable(r)) return;
  for (struct conn *c = e->conns; c; c = c->next) {
    if (c->dead || c->role != CONN_TARGET || !link_of(c) || link_of(c)->ufd < 0) continue;
    grant(c, r);
    if (!c->dead) link_flush(c);
  }
}

/* Target: ask c's initiator for grant i back (SHM_UNMAP); the grant stays until it
 * answers or the link dies (grant_drop). Lock held. */
static void grant_recall(struct conn *c, uint32_t i) {
  struct shm_grant *g = &link_of(c)->grants[i];
  uint8_t buf[WIRE_HDR_LEN + WIRE_SHM_UNMAP_LEN];
  struct wire_wr w;
  g->unmapping = true;
  g->reg->unshare_wait++;
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_UNMAP);
  wire_put_u64(&w, g->reg->range.addr);
  wire_put_u64(&w, g->reg->range.len);
  link_queue_copy(c, buf, wire_end(&w, 0));
}

/* Wait, lock released, while pending(e, arg) holds and deadline has not passed;
 * Finalize waits for such waiters (quiesce). */
static void recall_wait(struct HixlEngine *e, bool (*pending)(struct HixlEngine *, const void *),
                        const void *arg, uint64_t deadline) {
  struct eshm_engine *x = eng_of(e);
  struct timespec ts = {(time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u)};
  x->unsharing++;
  while (pending(e, arg) && hixl_now_ns() < deadline)
    if (pthread_cond_timedwait(&e->cond, &e->lock, &ts) == ETIMEDOUT) break;
  if (--x->unsharing == 0) pthread_cond_broadcast(&e->cond);
}

static bool reg_pending(struct HixlEngine *e, const void *r) {
  (void)e;
  return ((const struct hixl_mem_reg *)r)->unshare_wait > 0;
}

/* HixlEngineFreeMem, before r goes: ask every link that has r mapped to unmap it and
 * wait, lock released, for the answers until deadline; cut the links that did not
 * answer. Afterwards no peer can reach r's pages. Lock held on entry and return. */
static void eshm_mem_unshare(struct HixlEngine *e, struct hixl_mem_reg *r, uint64_t deadline) {
  if (!eng_of(e) || r->memfd < 0) return;
  r->unsharing = true; /* no new grant from here on */
  for (struct conn *c = e->conns; c; c = c->next) {
    struct eshm_link *l = link_of(c);
    if (c->dead || c->role != CONN_TARGET || !l) continue;
    for (uint32_t i = 0; i < l->ngrants; i++) {
      if (l->grants[i].reg != r || l->grants[i].unmapping) continue;
      grant_recall(c, i);
      if (!c->dead) link_flush(c); /* a link that died on the way dropped the grant */
      break;
    }
  }
  if (r->unshare_wait > 0) recall_wait(e, reg_pending, r, deadline);
  for (struct conn *c = e->conns; c && r->unshare_wait > 0; c = c->next) {
    struct eshm_link *l = link_of(c);
    if (c->dead || c->role != CONN_TARGET || !l) continue;
    for (uint32_t i = 0; i < l->ngrants; i++) {
      if (l->grants[i].reg != r) continue;
      char why[256];
      snprintf(
          why, sizeof(why),
          "it did not unmap [0x%llx, +%llu) in time (SHM_UNMAP unanswered): cut off before the memory is "
          "freed",
          (unsigned long long)r->range.addr, (unsigned long long)r->range.len);
      log_warn("link from %s: %s", c->remote_name, why);
      link_conn_kill(c, HIXL_TIMEOUT, why); /* its grants go with it */
      break;
    }
  }
  r->unsharing = false;
}

static bool conn_is(const struct conn *c, const char *name) {
  return strcmp(c->remote_name, name) == 0 || (c->peer && strcmp(c->peer->remote_name, name) == 0);
}

/* Whether the links with name still have regions mapped. */
static bool peer_pending(struct HixlEngine *e, const void *name) {
  for (struct conn *c = e->conns; c; c = c->next)
    if (!c->dead && c->role == CONN_TARGET && link_of(c) && link_of(c)->ngrants > 0 && conn_is(c, name))
      return true;
  return false;
}

/* drop_peer: every region the peer's links have mapped is asked back (SHM_UNMAP) and
 * the call waits, lock released, until the peer answered for each (its copies running
 * have ended) or deadline. Then nothing it does reaches this engine's memory once its
 * links are cut: a copy through a mapping cannot be stopped any other way. */
static void eshm_peer_drop(struct HixlEngine *e, const char *name, uint64_t deadline) {
  if (!eng_of(e)) return;
  for (struct conn *c = e->conns; c; c = c->next) {
    struct eshm_link *l = link_of(c);
    if (c->dead || c->role != CONN_TARGET || !l || !conn_is(c, name)) continue;
    for (uint32_t i = 0; i < l->ngrants && !c->dead; i++)
      if (!l->grants[i].unmapping) grant_recall(c, i); /* else a FreeMem asked already */
    if (!c->dead) link_flush(c);
  }
  if (!peer_pending(e, name)) return;
  recall_wait(e, peer_pending, name, deadline);
  if (peer_pending(e, name))
    log_warn("engine %s: %s did not unmap this engine's memory in time: its links are cut anyway",
             e->local_name, name);
}

static const uint8_t eshm_frames[] = {WIRE_SHM_HELLO, WIRE_SHM_MAP_HELLO, WIRE_SHM_UNMAP_ACK, 0};
static const uint8_t eshm_init_frames[] = {WIRE_SHM_MAP, WIRE_SHM_UNMAP, 0};

const struct xport_ops xport_shm = {
    .name = "shm",
    .id = XPORT_SHM,
    .flags = XPORT_ONE_SIDED | XPORT_CPU_COPY,
    .stage_threshold = STAGE_AUTO_TCP,
    .open = eshm_open,
    .quiesce = eshm_quiesce,
    .close = eshm_close,
    .caps = eshm_caps,
    .progress = eshm_progress,
    .mem_dereg = eshm_mem_dereg,
    .mem_share = eshm_mem_share,
    .mem_unshare = eshm_mem_unshare,
    .peer_drop = eshm_peer_drop,
    .closed = eshm_closed,
    .connect = eshm_connect,
    .attach = eshm_attach,
    .discard = eshm_discard,
    .target_frame = eshm_target_frame,
    .frames = eshm_frames,
    .initiator_frame = eshm_initiator_frame,
    .init_frames = eshm_init_frames,
    .kill = eshm_kill,
    .free = eshm_free,
    .info = eshm_info,
    .post = eshm_queue,
    .async = eshm_async,
    .drive = eshm_drive,
    .table_current = eshm_table_current,
};
