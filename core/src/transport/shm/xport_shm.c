/* xport_shm: the shm transport's table, its engine state, Connect and the link hooks.
 *
 * The same-host data path of a link. When both engines run on one host
 * (same boot id) and the kernel lets the initiator reach the target's memory, data
 * moves in one copy between the two processes with process_vm_writev (WRITE) and
 * process_vm_readv (READ), many ops per call; the target's CPU does nothing, as
 * with RDMA. The TCP link stays up for control: memory tables, SYNC, NOTIFY, and
 * noticing that the peer went away.
 *
 * Connect: the initiator sends SHM_HELLO; the target answers SHM_HELLO_ACK with its
 * boot id, pid, uid, the address of 16 random bytes in its own memory, and the
 * abstract name of a unix socket it made for this link (layout 2). The copies go to
 * a pid, and a pid in a message is only a claim: a hostile peer can name this very
 * process, with a probe address where bytes it sent lie in our receive buffer, or
 * another local process, relaying that one's answer. So the pid is taken only once
 * the kernel vouches for it:
 *  - the initiator connects to the socket; the process listening on it (SO_PEERCRED)
 *    must be the pid and uid the answer named. This very process is taken only on an
 *    authenticated link, where the binding below proves the socket is the link's own
 *    (two engines of one process); without a key both sides refuse it (the target
 *    refuses an SHM_HELLO naming its own pid), and such engines link over rdma or tcp;
 *  - on an authenticated link (AuthKeyFile) the socket is bound to this TCP link:
 *    the initiator sends a fresh 32-byte nonce on it; the target, which took only the
 *    connection of the pid its link's SHM_HELLO named (the progress thread, woken by
 *    this module's epoll set, never blocking), answers HMAC-SHA256 under the link's
 *    session secret of ("hixl shm bind v1" || nonce || that pid, u32 big-endian).
 *    Only the two ends of this link hold the secret: the socket of another link,
 *    relayed by a peer, answers under that link's. Without a key nothing is bound:
 *    anyone can then reach every registered byte over tcp anyway;
 *  - the initiator opens a pidfd for the pid, then reads the 16 bytes from it with
 *    process_vm_readv: a match proves the kernel allows the copies.
 * Any check failing (no socket, another pid or uid, a wrong MAC, EPERM: other user,
 * Yama ptrace_scope, a non-dumpable target) is logged and auto goes on to rdma or
 * tcp; Transport shm fails Connect with the reason.
 *
 * Data: a sync transfer is copied by its caller's thread, an async one by the
 * progress thread in steps of ESHM_STEP bytes (small ones by the submitter), both
 * with the engine lock released during the copy. A copy that finds the peer gone
 * (ESRCH, or it exited: its life word, shm_life.c, else its pidfd) breaks the link.
 *
 * Mapped memory: memory the target got from HixlEngineAllocMem is a sealed memfd.
 * Once the socket is proven (and bound), the initiator says it maps (SHM_MAP_HELLO);
 * the target hands memory only to the connection of the process the link's
 * SHM_HELLO named, running as the same user (SO_PEERCRED): each such region's memfd
 * (SCM_RIGHTS, then SHM_MAP on the link), now and whenever one is allocated.
 * The initiator maps them (MADV_DONTFORK) and moves ops inside them with memcpy; all
 * else keeps process_vm_*. Freeing such memory is a round trip: the target sends
 * SHM_UNMAP to every link that has it and waits; the initiator stops new copies into
 * it, unmaps it once the copies running end, and answers SHM_UNMAP_ACK; a link that
 * does not answer in time is cut. A link that dies unmaps what it had.
 *
 * Device memory: an initiator with a device-memory provider says so (WIRE_SHM_F_DEVMAP);
 * the target then hands over each device registration the provider can export as its
 * IPC handle (SHM_DEV_MAP, on the link after its MEM_ADD; a scoped target only where the
 * peer's grants cover the whole allocation the handle opens). The initiator checks it
 * against the registration advertised, opens each allocation once, and copies device
 * ops inside it with the provider (d2d; to_host / to_device against host memory);
 * recalled like memfd regions (SHM_UNMAP) at DeregisterMem, revoke and link death.
 * Device ops outside such mappings go as tcp frames on the link's socket. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/shm/shm_int.h"
#include "transport/shm/uds.h"
#include "transport/shm/xport_shm.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"

/* c's link joins the engine's list of shm links (eshm_next walks it). */
static void links_add(struct conn *c, struct eshm_link *l) {
  struct eshm_engine *x = eng_of(link_engine(c));
  l->conn = c;
  l->prev = NULL;
  l->next = x->links;
  if (x->links) x->links->prev = l;
  x->links = l;
  link_set_xs(c, XPORT_SHM, l);
}

/* ... and leaves it as the link dies (or is freed). */
static void links_remove(struct conn *c, struct eshm_link *l) {
  if (!l->conn) return;
  struct eshm_engine *x = eng_of(link_engine(c));
  if (l->prev)
    l->prev->next = l->next;
  else
    x->links = l->next;
  if (l->next) l->next->prev = l->prev;
  l->conn = NULL;
  l->prev = l->next = NULL;
}

static struct eshm_link *eshm_link_new(void) {
  struct eshm_link *l = calloc(1, sizeof(*l));
  if (l) {
    l->lfd = l->ufd = -1;
    l->gen_seen = UINT64_MAX; /* the first transfer reads the socket */
  }
  return l;
}

static void eshm_link_release(struct eshm_link *l) {
  if (l->gen) munmap((void *)l->gen, ESHM_GEN_LEN);
  free(l->grants);
  free(l);
}

/* Transport shm fails Initialize with why; auto goes on without same-host copies. */
static HixlStatus eshm_off(struct HixlEngine *e, bool must, const char *why, int err) {
  if (must) return hixl_fail(HIXL_FAILED, "HixlEngineInitialize: Transport shm: %s (%s)", why, strerror(err));
  log_info("engine %s: no same-host copies: %s (%s)", engine_name(e), why, strerror(err));
  return HIXL_SUCCESS;
}

static HixlStatus eshm_open(struct HixlEngine *e) {
  bool must = engine_opts(e)->transport == HIXL_TRANSPORT_SHM;
  struct cma_self self;
  if (!must && engine_opts(e)->transport != HIXL_TRANSPORT_AUTO) return HIXL_SUCCESS;
  if (cma_self_get(&self) != 0)
    return eshm_off(e, must,
                    "cannot read this host's boot id from /proc/sys/kernel/random/boot_id; is /proc mounted?",
                    errno);
  struct eshm_engine *x = calloc(1, sizeof(*x));
  if (!x) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineInitialize: out of memory");
  x->self = self;
  /* The links' unix sockets, which prove this process's pid to its initiators. */
  if ((x->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) {
    int err = errno;
    free(x);
    return eshm_off(e, must, "cannot make an epoll instance for its unix sockets", err);
  }
  /* The withdrawal page: without it no memory is offered to map (logged). */
  x->gen_fd = memfd_create("hixl-gen", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (x->gen_fd >= 0 && ftruncate(x->gen_fd, ESHM_GEN_LEN) == 0) {
    void *p = mmap(NULL, ESHM_GEN_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, x->gen_fd, 0);
    x->gen = p != MAP_FAILED ? p : NULL;
  }
  /* Sealed once this process's writable mapping exists: nobody else can write it (a
   * kernel before 5.1 has no F_SEAL_FUTURE_WRITE: then no life word, shm_life.c). */
  if (x->gen) {
    int base = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    x->gen_sealed = fcntl(x->gen_fd, F_ADD_SEALS, base | F_SEAL_FUTURE_WRITE) == 0;
    if (!x->gen_sealed && fcntl(x->gen_fd, F_ADD_SEALS, base) != 0) {
      munmap(x->gen, ESHM_GEN_LEN);
      x->gen = NULL;
    }
  }
  if (!x->gen) {
    log_info("engine %s: no memory offered to same-host peers to map (its page: %s)", engine_name(e),
             strerror(errno));
    if (x->gen_fd >= 0) close(x->gen_fd);
    x->gen_fd = -1;
  }
  engine_set_xe(e, XPORT_SHM, x);
  return HIXL_SUCCESS;
}

/* Finalize, links ended: a caller may still be inside a copy (lock released), and its
 * chunks hold registrations about to be freed. Its link is dead, so it stops there. */
static void eshm_quiesce(struct HixlEngine *e) {
  while (eng_of(e) && (eng_of(e)->copying > 0 || eng_of(e)->unsharing > 0)) engine_wait(e, 0);
}

static void eshm_close(struct HixlEngine *e) {
  struct eshm_engine *x = eng_of(e);
  if (x) eshm_life_stop(x);
  if (x && x->gen) munmap(x->gen, ESHM_GEN_LEN);
  if (x && x->gen_fd >= 0) close(x->gen_fd);
  if (x) close(x->epfd);
  free(x);
  engine_set_xe(e, XPORT_SHM, NULL);
}

static uint32_t eshm_caps(const struct HixlEngine *e) { return eng_of(e) ? WIRE_CAP_SHM : 0; }

static int eshm_event_fd(const struct HixlEngine *e) { return eng_of(e) ? eng_of(e)->epfd : -1; }

/* Target, progress thread: a link's unix socket is ready (a connection, or the bind
 * request on one). Lock held. */
static void eshm_on_event(struct HixlEngine *e) {
  struct eshm_engine *x = eng_of(e);
  struct epoll_event ev[16];
  if (!x) return;
  int n = epoll_wait(x->epfd, ev, 16, 0);
  for (int i = 0; i < n; i++) {
    struct eshm_link *l = x->links; /* kills nothing: the walk is safe */
    while (l && ev[i].data.ptr != &l->lfd && ev[i].data.ptr != &l->ufd) l = l->next;
    if (!l || !l->watched) continue; /* gone, or served by an earlier event */
    if (l->lfd >= 0)
      eshm_target_accept(l->conn, l);
    else
      eshm_target_bind(l->conn, l);
  }
}

/* ---- Connect ---- */

static void eshm_discard(void *link);

/* Milliseconds left until deadline (CLOCK_MONOTONIC ns), rounded up; 0 once passed. */
static int ms_until(uint64_t deadline) {
  uint64_t now = hixl_now_ns();
  if (now >= deadline) return 0;
  uint64_t ms = (deadline - now + 999999) / 1000000;
  return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* Initiator, in Connect: the kernel's word on the process the copies would reach.
 * Connect to the unix socket SHM_HELLO_ACK m named: the process listening on it
 * (SO_PEERCRED) must be the pid and uid m named, and not this one. On an
 * authenticated link it must also prove it made the socket for this very link: it
 * answers a fresh nonce with a MAC under the link's session secret, which only the
 * two ends of this TCP link hold (a peer that relays another engine's answer, or
 * this engine's own, cannot). *ufd gets the connected socket; false with why. */
static bool prove_peer(const char *remote, struct peer *p, const struct wire_msg *m, uint64_t deadline,
                       int *ufd, char *why, size_t cap) {
  const uint8_t *session = peer_session(p);
  uint32_t me = (uint32_t)getpid(), pid = 0, uid = 0;
  int fd = uds_connect((const char *)m->u.shm.sock, m->u.shm.sock_len, ms_until(deadline));
  if (fd < 0) {
    snprintf(why, cap, "cannot reach the unix socket %s named to prove its pid (%s)", remote,
             strerror(errno));
    return false;
  }
  if (uds_peer(fd, &pid, &uid) < 0) {
    snprintf(why, cap, "cannot read who listens on the unix socket %s named (SO_PEERCRED: %s)", remote,
             strerror(errno));
  } else if (pid == me && !session) {
    snprintf(why, cap,
             "the unix socket %s named belongs to this very process (pid %u): a link within one process is "
             "taken only on an authenticated link, whose socket proves it was made for it (no AuthKeyFile)",
             remote, pid);
  } else if (pid != m->u.shm.pid || uid != m->u.shm.uid) {
    snprintf(
        why, cap,
        "%s named pid %u (uid %u), but the unix socket it named belongs to pid %u (uid %u): the process it "
        "names is not its own",
        remote, m->u.shm.pid, m->u.shm.uid, pid, uid);
  } else if (session) {
    uint8_t nonce[ESHM_BIND_NONCE_LEN], got[AUTH_MAC_LEN], want[AUTH_MAC_LEN];
    if (!auth_random(nonce, sizeof(nonce))) {
      snprintf(why, cap, "no random bytes from the kernel to bind the unix socket %s named", remote);
    } else if (uds_send(fd, nonce, sizeof(nonce)) < 0 ||
               uds_recv(fd, got, sizeof(got), ms_until(deadline)) < 0) {
      snprintf(why, cap, "pid %u did not bind the unix socket %s named to this link (%s)", pid, remote,
               strerror(errno));
    } else {
      eshm_bind_mac(session, nonce, me, want);
      if (!auth_equal(got, want, sizeof(want)))
        snprintf(why, cap,
                 "pid %u, behind the unix socket %s named, did not prove it holds this link's session: its "
                 "answer is another link's (relayed?)",
                 pid, remote);
      auth_wipe(want, sizeof(want));
    }
  }
  if (why[0]) {
    close(fd);
    return false;
  }
  *ufd = fd;
  return true;
}

/* Initiator, during Connect (blocking socket, no lock held). Takes the link when the
 * peer is on this host, the kernel proves the pid it names is the process behind
 * the link (prove_peer) and the probe proves the copies work (Transport auto or
 * shm); Transport shm fails otherwise, with the reason. */
static HixlStatus eshm_connect(struct HixlEngine *e, int fd, uint64_t deadline, const char *remote,
                               struct peer *p, bool *taken, void **out) {
  uint8_t buf[WIRE_HDR_LEN + WIRE_SHM_HELLO_ACK_LEN + WIRE_SHM_EXT_MAX];
  uint8_t probe[CMA_NONCE_LEN];
  bool must = engine_opts(e)->transport == HIXL_TRANSPORT_SHM;
  char why[384] = "";
  struct wire_wr w;
  struct wire_hdr h;
  struct wire_msg m;
  HixlStatus st;
  int pidfd = -1, ufd = -1;

  *out = NULL;
  *taken = false;
  if (!must && engine_opts(e)->transport != HIXL_TRANSPORT_AUTO) return HIXL_SUCCESS;
  if (!eng_of(e) || !(peer_caps(p) & WIRE_CAP_SHM)) {
    if (must)
      return hixl_fail(HIXL_FAILED,
                       "HixlEngineConnect: Transport is shm but %s does not offer same-host copies (its "
                       "Transport is tcp or rdma, or it cannot read its boot id)",
                       remote);
    return HIXL_SUCCESS;
  }
  const struct cma_self *self = &eng_of(e)->self;
  /* Device memory by IPC handle only where this process has a provider to open it. */
  bool devmap = devmem_get(why, sizeof(why)) != NULL;
  why[0] = '\0';
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_HELLO);
  wire_put_shm_id(&w, WIRE_SHM_LAYOUT, self->boot_id, self->pid, self->uid);
  wire_put_u32(&w, WIRE_SHM_F_MAP | (devmap ? WIRE_SHM_F_DEVMAP : 0));
  if ((st = link_handshake_send(fd, p, buf, wire_end(&w, 0), deadline)) != HIXL_SUCCESS ||
      (st = link_handshake_recv(fd, deadline, p, buf, sizeof(buf), &h)) != HIXL_SUCCESS)
    return hixl_fail(st, "HixlEngineConnect: shm handshake with %s: %s", remote, HixlGetLastErrorMessage());
  if (h.type != WIRE_SHM_HELLO_ACK || wire_decode(&h, buf + WIRE_HDR_LEN, &m) != WIRE_OK)
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s answered SHM_HELLO with a malformed %s", remote,
                     wire_type_name(h.type));
  if (m.u.shm.pid == self->pid && memcmp(m.u.shm.boot_id, self->boot_id, CMA_BOOT_ID_LEN) == 0 &&
      !peer_session(p)) {
    /* A peer that lies, or an engine of this process (which refuses it too): without a
     * key nothing can tell them apart. With one, the socket's binding does (prove_peer). */
    snprintf(why, sizeof(why),
             "%s named this very process (pid %u) as its own: a link within one process is taken only on an "
             "authenticated link (no AuthKeyFile; or the peer runs in another PID namespace, where same-host "
             "copies cannot work)",
             remote, m.u.shm.pid);
  } else if (m.u.shm.status != WIRE_HELLO_OK) {
    snprintf(why, sizeof(why), "%s does not offer same-host copies", remote);
  } else if (memcmp(m.u.shm.boot_id, self->boot_id, CMA_BOOT_ID_LEN) != 0) {
    snprintf(why, sizeof(why), "%s runs on another host (its boot id differs)", remote);
  } else if (m.u.shm.sock_len == 0) {
    snprintf(why, sizeof(why),
             "%s named no unix socket to prove its pid with (an older hixl, or it could not make one)",
             remote);
  } else if (prove_peer(remote, p, &m, deadline, &ufd, why, sizeof(why))) {
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
    if (ufd >= 0) close(ufd);
    if (must) return hixl_fail(HIXL_FAILED, "HixlEngineConnect: Transport is shm, but %s", why);
    log_info("link to %s: no same-host copies (%s)", remote, why);
    return HIXL_SUCCESS;
  }
  struct shm_peer *s = calloc(1, sizeof(*s));
  struct eshm_link *l = eshm_link_new();
  if (!s || !l) {
    free(s);
    free(l);
    if (pidfd >= 0) close(pidfd);
    close(ufd);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineConnect: out of memory");
  }
  s->refs = 1;
  s->pid = m.u.shm.pid;
  s->uid = m.u.shm.uid;
  s->pidfd = pidfd;
  s->device = engine_local_device(e);
  snprintf(s->name, sizeof(s->name), "%s", remote);
  log_info("link to %s: shm, one copy to and from pid %u (uid %u; proven by SO_PEERCRED%s)", remote, s->pid,
           s->uid, peer_session(p) ? ", bound to the link" : "");
  l->peer = s;
  l->ufd = ufd;
  if ((st = eshm_map_connect(fd, deadline, p, l, buf, sizeof(buf))) != HIXL_SUCCESS) {
    eshm_discard(l);
    return hixl_fail(st, "HixlEngineConnect: shm handshake with %s: %s", remote, HixlGetLastErrorMessage());
  }
  *out = l;
  *taken = true;
  return HIXL_SUCCESS;
}

static void eshm_attach(struct conn *c, void *link) {
  struct eshm_link *l = link;
  links_add(c, l);
  link_use(c, &xport_shm);
  l->peer->conn = c;
  if (l->ufd >= 0) { /* the target may send SHM_MAP and SHM_UNMAP at any time: read them */
    link_read_always(c);
    link_unpark(c);
  }
}

static void eshm_discard(void *link) {
  struct eshm_link *l = link;
  if (!l) return;
  if (l->ufd >= 0) close(l->ufd);
  eshm_peer_put(l->peer);
  eshm_link_release(l);
}

/* Target, in the progress thread: answer SHM_HELLO with this process's identity, the
 * address of bytes only this link knows and (layout 2) the name of a unix socket made
 * for this link, which proves the pid to the initiator (and hands it memory to map).
 * An initiator that names this very process is refused: nothing else can, so it is
 * a peer that lies, or this engine linked to itself; with a key, the binding tells. */
static void eshm_target_hello(struct conn *c, const struct wire_msg *m) {
  struct eshm_engine *x = eng_of(link_engine(c));
  uint8_t buf[WIRE_HDR_LEN + WIRE_SHM_HELLO_ACK_LEN + 2 + WIRE_SHM_SOCK_MAX];
  char sock[64] = "";
  const char *why = NULL;
  uint32_t status = WIRE_HELLO_REFUSED;
  struct cma_self none = {0};
  struct wire_wr w;
  struct eshm_link *l = link_of(c);
  bool layout2 = m->u.shm.layout >= 2; /* a layout-1 initiator gets what it knows */
  if (x && m->u.shm.pid == x->self.pid && !link_session(c)) {
    why = "its SHM_HELLO named this very process's pid: a link within one process is taken only on an "
          "authenticated link (no AuthKeyFile)";
  } else {
    if (x && !l && (l = eshm_link_new())) links_add(c, l);
    bool first = l && !l->nonce_set; /* one socket per link: a repeated SHM_HELLO gets none */
    if (l && !l->nonce_set)
      l->nonce_set = getrandom(l->nonce, sizeof(l->nonce), 0) == (ssize_t)sizeof(l->nonce);
    if (x && l && l->nonce_set) status = WIRE_HELLO_OK;
    if (status == WIRE_HELLO_OK && layout2 && first) {
      l->hello_pid = m->u.shm.pid;
      l->want_map = (m->u.shm.flags & WIRE_SHM_F_MAP) != 0;
      /* Device memory is handed over only where it is told (link_frames.c mem_told): an
       * initiator whose HELLO lacks WIRE_CAP_DEVMEM (engines before it ask for device
       * mappings all the same) hears of no device registration, and would refuse a
       * SHM_DEV_MAP of one as a protocol error, ending the link. */
      l->want_devmap = l->want_map && (m->u.shm.flags & WIRE_SHM_F_DEVMAP) != 0 &&
                       (link_hello_caps(c) & WIRE_CAP_DEVMEM) != 0;
      if ((l->lfd = uds_listen(sock, sizeof(sock))) < 0 || !eshm_unix_watch(x, l)) {
        log_warn("link from %s: no same-host copies: cannot make and watch a unix socket to prove this "
                 "process's pid with: %s",
                 link_remote(c), strerror(errno));
        eshm_unix_close(x, l);
        sock[0] = '\0';
        status = WIRE_HELLO_REFUSED;
      }
    }
  }
  const struct cma_self *self = x ? &x->self : &none;
  bool ok = status == WIRE_HELLO_OK;
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_HELLO_ACK);
  wire_put_u32(&w, status);
  wire_put_shm_id(&w, layout2 ? WIRE_SHM_LAYOUT : 1, self->boot_id, self->pid, self->uid);
  wire_put_u64(&w, ok ? (uint64_t)(uintptr_t)l->nonce : 0);
  if (ok)
    wire_put_bytes(&w, l->nonce, sizeof(l->nonce));
  else
    for (int i = 0; i < 4; i++) wire_put_u32(&w, 0);
  if (layout2) {
    wire_put_u16(&w, (uint16_t)strlen(sock));
    wire_put_bytes(&w, sock, strlen(sock));
  }
  link_queue_copy(c, buf, wire_end(&w, 0));
  if (link_dead(c)) return;
  if (why) /* two engines of one process do it too: info, as the initiator says it */
    log_info("link from %s: refused same-host copies: %s (pid %u)", link_remote(c), why, m->u.shm.pid);
  else
    log_info("link from %s: %s (peer pid %u uid %u)", link_remote(c),
             ok ? "offered same-host copies" : "refused same-host copies", m->u.shm.pid, m->u.shm.uid);
}

static void eshm_target_frame(struct conn *c, const struct wire_msg *m) {
  switch (m->hdr.type) {
  case WIRE_SHM_HELLO: eshm_target_hello(c, m); break;
  case WIRE_SHM_MAP_HELLO: eshm_target_map_hello(c); break;
  case WIRE_SHM_UNMAP_ACK: eshm_target_unmap_ack(c, m); break;
  default: break;
  }
}

/* The link is dying: end what waits on it, unmap what it mapped (once copies running
 * end), let go of the peer process; a target forgets what it handed over. */
static void eshm_kill(struct conn *c, HixlStatus st, const char *msg) {
  struct eshm_link *l = link_of(c);
  struct chunk *ch;
  if (!l) return;
  links_remove(c, l); /* first: walks see live links only */
  while ((ch = l->sq_head)) {
    if (!(l->sq_head = ch->next_pending)) l->sq_tail = NULL;
    eng_of(link_engine(c))->queued--;
    link_chunk_end(ch, st, msg);
  }
  if (l->peer) {
    struct shm_peer *s = l->peer;
    snprintf(s->why, sizeof(s->why), "%s", msg);
    s->conn = NULL; /* no SHM_UNMAP_ACK any more */
    for (size_t i = s->maps.count; i-- > 0;) eshm_map_retire(s, (struct shm_map *)s->maps.v[i]);
    eshm_peer_put(s);
    l->peer = NULL;
  }
  while (l->ngrants > 0) eshm_grant_drop(c, l, l->ngrants - 1);
  eshm_unix_close(eng_of(link_engine(c)), l); /* an initiator's ufd is never watched */
}

static void eshm_free(struct conn *c) {
  struct eshm_link *l = link_of(c);
  if (!l) return;
  links_remove(c, l);
  eshm_link_release(l);
  link_set_xs(c, XPORT_SHM, NULL);
}

/* A target's link was cut (Disconnect, drop_peer, Finalize, a bad frame): its
 * initiator must not take the count as a reason to skip the socket, where the end of
 * the stream now waits, and copy once more with process_vm_* into memory this side
 * may already reuse. Moved after the shutdown, so a transfer that sees the new count
 * also sees the end. (A copy already past its check cannot be stopped.) */
static void eshm_closed(struct conn *c) {
  if (link_is_target(c) && link_of(c)) eshm_gen_bump(link_engine(c)); /* shm state: past HELLO */
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
  info->now_ops = l->peer->now_ops;
  if (l->gen) info->peer_gen = __atomic_load_n(l->gen, __ATOMIC_ACQUIRE);
  if (l->peer->life) info->peer_life = __atomic_load_n(l->peer->life, __ATOMIC_ACQUIRE);
  return HIXL_SUCCESS;
}

static const uint8_t eshm_frames[] = {WIRE_SHM_HELLO, WIRE_SHM_MAP_HELLO, WIRE_SHM_UNMAP_ACK, 0};
static const uint8_t eshm_init_frames[] = {WIRE_SHM_MAP, WIRE_SHM_UNMAP, WIRE_SHM_DEV_MAP, 0};

const struct xport_ops xport_shm = {
    .name = "shm",
    .id = XPORT_SHM,
    .flags = XPORT_ONE_SIDED | XPORT_CPU_COPY,
    .stage_threshold = STAGE_AUTO_TCP,
    .frames = eshm_frames,
    .init_frames = eshm_init_frames,
    .iface = {.open = eshm_open,
              .quiesce = eshm_quiesce,
              .close = eshm_close,
              .caps = eshm_caps,
              .event_fd = eshm_event_fd,
              .on_event = eshm_on_event,
              .progress = eshm_progress,
              .grant = eshm_grant},
    .mem = {.reg = xport_no_reg,
            .dereg = eshm_mem_dereg,
            .key = xport_no_key,
            .share = eshm_mem_share,
            .unshare = eshm_mem_unshare,
            .peer_drop = eshm_peer_drop,
            .bounce_reg = xport_no_bounce_reg,
            .bounce_dereg = xport_no_bounce_dereg,
            .bounce_key = xport_no_bounce_key},
    .link = {.connect = eshm_connect,
             .attach = eshm_attach,
             .discard = eshm_discard,
             .target_frame = eshm_target_frame,
             .initiator_frame = eshm_initiator_frame,
             .payload_done = xport_no_link,
             .kill = eshm_kill,
             .closed = eshm_closed,
             .free = eshm_free,
             .info = eshm_info,
             .table_current = eshm_table_current,
             .reach = xport_reach_all,
             .post = eshm_post,
             .start = xport_no_req,
             .async = eshm_async,
             .drive = eshm_drive,
             .req_timeout = xport_no_req_timeout,
             .answer = xport_no_answer,
             .chunk_end = xport_no_chunk_end,
             .post_own = xport_no_post_own,
             .dev_reach = eshm_dev_reach,
             .copy_now = eshm_copy_now,
             .mem_added = eshm_mem_added,
             .post_tag = xport_no_post_tag},
};
