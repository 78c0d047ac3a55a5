/* shm_map: the unix socket of a same-host link (the target's pid proven by the
 * kernel, the socket bound to the link), and memory the target got from
 * HixlEngineAllocMem, handed over on it and mapped into same-host peers. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transport/shm/shm_int.h"
#include "transport/shm/uds.h"
#include "util/be.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"

/* ---- the link's unix socket: the target's pid proven, and bound to the link ---- */

void eshm_bind_mac(const uint8_t *session, const uint8_t nonce[ESHM_BIND_NONCE_LEN], uint32_t pid,
                   uint8_t out[AUTH_MAC_LEN]) {
  struct auth_key k = {.len = AUTH_MAC_LEN};
  uint8_t be_pid[4];
  memcpy(k.k, session, AUTH_MAC_LEN);
  be_put32(be_pid, pid);
  const void *parts[] = {ESHM_BIND_LABEL, nonce, be_pid};
  const size_t lens[] = {sizeof(ESHM_BIND_LABEL) - 1, ESHM_BIND_NONCE_LEN, sizeof(be_pid)};
  auth_hmac(&k, parts, lens, 3, out);
  auth_wipe(&k, sizeof(k));
}

bool eshm_unix_watch(struct eshm_engine *x, struct eshm_link *l) {
  int *fdp = l->lfd >= 0 ? &l->lfd : &l->ufd;
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = fdp};
  l->watched = epoll_ctl(x->epfd, EPOLL_CTL_ADD, *fdp, &ev) == 0;
  return l->watched;
}

/* Out of epfd before it closes: a forked child holding a copy of the descriptor
 * would keep it in the set, with a pointer into l. */
static void unix_unwatch(struct eshm_engine *x, struct eshm_link *l) {
  if (!l->watched) return;
  (void)epoll_ctl(x->epfd, EPOLL_CTL_DEL, l->lfd >= 0 ? l->lfd : l->ufd, NULL);
  l->watched = false;
}

void eshm_unix_close(struct eshm_engine *x, struct eshm_link *l) {
  unix_unwatch(x, l);
  if (l->lfd >= 0) close(l->lfd);
  if (l->ufd >= 0) close(l->ufd);
  l->lfd = l->ufd = -1;
  l->bound = l->mapping = false;
}

/* The pid in the MAC is the initiator's as the kernel showed it at accept
 * (SO_PEERCRED, equal to hello_pid), so the answer is worth nothing to another
 * process. Never blocks. */
void eshm_target_bind(struct conn *c, struct eshm_link *l) {
  struct eshm_engine *x = eng_of(link_engine(c));
  const uint8_t *session = link_session(c);
  uint8_t nonce[ESHM_BIND_NONCE_LEN], mac[AUTH_MAC_LEN];
  if (l->bound || l->ufd < 0 || !session) return;
  if (uds_recv(l->ufd, nonce, sizeof(nonce), 0) < 0) {
    if (errno == ETIMEDOUT) return; /* not yet */
    log_info("link from %s: its initiator's unix socket ended before the binding, or sent something else "
             "(%s): closed",
             link_remote(c), strerror(errno));
    eshm_unix_close(x, l);
    return;
  }
  eshm_bind_mac(session, nonce, l->hello_pid, mac);
  int rc = uds_send(l->ufd, mac, sizeof(mac));
  auth_wipe(mac, sizeof(mac));
  if (rc < 0) {
    log_info("link from %s: cannot answer the binding on the unix socket (%s): closed", link_remote(c),
             strerror(errno));
    eshm_unix_close(x, l);
    return;
  }
  unix_unwatch(x, l);
  l->bound = true;
}

bool eshm_target_accept(struct conn *c, struct eshm_link *l) {
  struct eshm_engine *x = eng_of(link_engine(c));
  while (l->ufd < 0 && l->lfd >= 0) {
    uint32_t pid = 0, uid = 0;
    int fd = accept4(l->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      /* Out of descriptors, say: the listener would wake the progress thread forever. */
      log_warn("link from %s: no same-host copies: cannot accept on its unix socket: %s", link_remote(c),
               strerror(errno));
      eshm_unix_close(x, l);
      break;
    }
    if (uds_peer(fd, &pid, &uid) == 0 && pid == l->hello_pid) {
      unix_unwatch(x, l); /* one connection per link: the listener goes */
      close(l->lfd);
      l->lfd = -1;
      l->ufd = fd;
      l->peer_uid = uid;
      /* Without a key there is no secret to bind the socket to the link with; but
       * then anyone can already reach every registered byte of this engine. */
      l->bound = !link_session(c);
      if (!l->bound && !eshm_unix_watch(x, l)) {
        log_warn("link from %s: no same-host copies: cannot watch its unix socket: %s", link_remote(c),
                 strerror(errno));
        eshm_unix_close(x, l);
        break;
      }
      eshm_target_bind(c, l); /* the request may be there already */
      break;
    }
    /* Anyone may connect to an abstract socket: only the link's own peer is taken. */
    log_info("link from %s: pid %u (uid %u) connected to its unix socket, but the link's peer is pid %u: "
             "closed",
             link_remote(c), pid, uid, l->hello_pid);
    close(fd);
    if (++l->strangers >= ESHM_STRANGERS_MAX) {
      log_warn("link from %s: no same-host copies: %u other processes than pid %u connected to its unix "
               "socket (someone floods its name): closed",
               link_remote(c), l->strangers, l->hello_pid);
      eshm_unix_close(x, l);
      break;
    }
  }
  return l->ufd >= 0;
}

/* ---- initiator: mappings ---- */

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
  if (p == MAP_FAILED) {
    close(fd);
    snprintf(why, cap, "protocol error: the target's page is not a sealed memfd of %u bytes", ESHM_GEN_LEN);
    return false;
  }
  (void)madvise(p, ESHM_GEN_LEN, MADV_DONTFORK);
  l->gen = p;
  /* The life word only from a page nobody but the target can write (shm_life.c); the
   * peer's own mapping, as copies may outlive the link. */
  if ((seals & F_SEAL_FUTURE_WRITE) && !l->peer->life_page) {
    void *q = mmap(NULL, ESHM_GEN_LEN, PROT_READ, MAP_SHARED, fd, 0);
    if (q != MAP_FAILED) {
      (void)madvise(q, ESHM_GEN_LEN, MADV_DONTFORK);
      l->peer->life_page = q;
      l->peer->life = (const uint32_t *)((const char *)q + ESHM_LIFE_OFF);
    }
  }
  close(fd);
  return true;
}

/* A device allocation one mapping less: closed when none uses it. Lock held. */
static void ipc_drop(struct shm_peer *s, struct shm_ipc *o) {
  if (--o->maps > 0) return;
  for (struct shm_ipc **pp = &s->ipcs; *pp; pp = &(*pp)->next)
    if (*pp == o) {
      *pp = o->next;
      break;
    }
  char why[128];
  const struct devmem_ops *dm = devmem_get(why, sizeof(why)); /* it opened o */
  if (dm) dm->ipc_close(o->base, o->h.alloc_len, o->device);
  free(o);
}

/* mp's pages let go of: a memfd unmapped, a device allocation one user less. */
static void map_unmap(struct shm_peer *s, struct shm_map *mp) {
  if (mp->dev && mp->ipc)
    ipc_drop(s, mp->ipc);
  else if (!mp->dev && mp->base) {
    munmap(mp->base, mp->map_len);
    s->map_bytes -= mp->map_len;
  }
  mp->ipc = NULL;
  mp->base = NULL;
}

static void map_free(struct shm_peer *s, struct shm_map *mp) {
  map_unmap(s, mp);
  free(mp);
}

/* Answer SHM_UNMAP: the link is cut once ESHM_UNMAP_UNSENT answers wait unsent. Lock held. */
static void send_unmap_ack(struct conn *c, uint64_t addr, uint64_t len) {
  struct eshm_link *l = link_of(c);
  uint8_t buf[WIRE_HDR_LEN + WIRE_SHM_UNMAP_LEN];
  struct wire_wr w;
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_UNMAP_ACK);
  wire_put_u64(&w, addr);
  wire_put_u64(&w, len);
  link_queue_copy(c, buf, wire_end(&w, 0));
  if (!link_dead(c)) link_flush(c);
  if (link_dead(c) || !l) return;
  l->acks_unsent = link_unsent(c) ? l->acks_unsent + 1 : 0;
  if (l->acks_unsent > ESHM_UNMAP_UNSENT) {
    char why[160];
    snprintf(why, sizeof(why),
             "it asked memory back (SHM_UNMAP) while %u answers waited unsent, not read: cut off",
             l->acks_unsent);
    log_warn("link to %s: %s", link_remote(c), why);
    link_conn_kill(c, HIXL_FAILED, why);
  }
}

/* Take mp out of use: unmapped at once when no copy holds it, else when the last one
 * ends; then SHM_UNMAP_ACK if the target asked and the link is up. The entry stays
 * as a tombstone: an op queued before the target freed the range fails on it rather
 * than reaching, by process_vm_*, whatever the target maps there next. The answer is
 * the last touch: a send that fails, or one answer too many, cuts the link, and with
 * it may go s and mp (eshm_kill). Lock held. */
void eshm_map_retire(struct shm_peer *s, struct shm_map *mp) {
  mp->revoked = true;
  if (mp->refs > 0) return;
  map_unmap(s, mp);
  bool ack = mp->ack_owed;
  mp->ack_owed = false;
  if (ack && s->conn && !link_dead(s->conn)) send_unmap_ack(s->conn, mp->range.addr, mp->range.len);
}

void eshm_map_put(struct shm_peer *s, struct shm_map *mp) {
  if (--mp->refs == 0 && mp->revoked) eshm_map_retire(s, mp);
}

/* Drop the tombstones overlapping [addr, addr + len): the target handed that range
 * over anew. Lock held. */
static void map_bury(struct shm_peer *s, uint64_t addr, uint64_t len) {
  for (size_t i = s->maps.count; i-- > 0;) {
    struct shm_map *mp = (struct shm_map *)s->maps.v[i];
    if (mp->base || mp->refs > 0 || mp->range.addr >= addr + len || mp->range.addr + mp->range.len <= addr)
      continue;
    memtab_remove(&s->maps, &mp->range);
    map_free(s, mp);
  }
}

void eshm_mem_added(struct conn *c, uint64_t addr, uint64_t len) {
  struct eshm_link *l = link_of(c);
  if (l && l->peer) map_bury(l->peer, addr, len);
}

void eshm_peer_put(struct shm_peer *s) {
  if (!s || --s->refs > 0) return;
  for (size_t i = 0; i < s->maps.count; i++)
    map_free(s, (struct shm_map *)s->maps.v[i]); /* no copy is left */
  memtab_free(&s->maps);
  if (s->life_page) munmap(s->life_page, ESHM_GEN_LEN);
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
  /* A bound on what a peer makes this process map, sparse memfds included, and on its
   * table: a region taken back stays there as a tombstone (eshm_map_retire). */
  if (s->maps.count >= ESHM_PEER_MAPS || m->u.map.map_len > ESHM_PEER_MAP_BYTES - s->map_bytes) {
    close(fd);
    if (!s->map_full_told)
      log_warn(
          "link to %s: not mapping the peer's [0x%llx, +%llu): %zu of its regions are mapped or taken "
          "back (%llu bytes mapped), at most %u (%llu bytes) are: process_vm_* copies this one and any more",
          s->name, (unsigned long long)m->u.map.addr, (unsigned long long)m->u.map.len, s->maps.count,
          (unsigned long long)s->map_bytes, ESHM_PEER_MAPS, (unsigned long long)ESHM_PEER_MAP_BYTES);
    s->map_full_told = true;
    return HIXL_SUCCESS;
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
    s->map_bytes += mp->map_len; /* map_unmap counts it off */
    /* A child forked later must not keep the target's pages alive, nor write them. */
    if (madvise(p, mp->map_len, MADV_DONTFORK) < 0 || memtab_add(&s->maps, &mp->range, &clash) < 0) {
      err = errno;
      map_free(s, mp);
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

HixlStatus eshm_dev_map_take(struct shm_peer *s, const struct remote_mem *rm, const struct wire_msg *m,
                             char *why, size_t cap) {
  uint64_t addr = m->u.map.addr, len = m->u.map.len, base = 0;
  struct devmem_ipc h;
  struct memtab_entry *clash;
  char dwhy[256] = "";
  memcpy(h.blob, m->u.map.blob, sizeof(h.blob));
  h.alloc_len = m->u.map.alloc_len;
  h.offset = m->u.map.offset;
  h.len = len;
  /* Only what the target advertised as device memory, exactly that registration. */
  if (!rm || rm->kind != WIRE_MEM_DEVICE || rm->range.addr != addr || rm->range.len != len) {
    snprintf(why, cap,
             "protocol error: SHM_DEV_MAP of [0x%llx, +%llu) is not a device registration it advertised",
             (unsigned long long)addr, (unsigned long long)len);
    return HIXL_FAILED;
  }
  if (devmem_ipc_valid(&h, dwhy, sizeof(dwhy)) != HIXL_SUCCESS) {
    snprintf(why, cap, "protocol error: SHM_DEV_MAP of [0x%llx, +%llu): %s", (unsigned long long)addr,
             (unsigned long long)len, dwhy);
    return HIXL_FAILED;
  }
  map_bury(s, addr, len); /* a range freed before, handed over anew */
  if (memtab_find(&s->maps, addr, 1) || memtab_find(&s->maps, addr + len - 1, 1)) {
    snprintf(why, cap, "protocol error: SHM_DEV_MAP of [0x%llx, +%llu) overlaps a region already mapped",
             (unsigned long long)addr, (unsigned long long)len);
    return HIXL_FAILED;
  }
  const struct devmem_ops *dm = devmem_get(dwhy, sizeof(dwhy));
  struct shm_ipc *o = s->ipcs;
  while (o && (o->h.alloc_len != h.alloc_len || memcmp(o->h.blob, h.blob, sizeof(h.blob)) != 0)) o = o->next;
  if (!o && dm) { /* the allocation's first registration handed over: opened once, in the context of
                   * the device this side uses (its copies run there; another device's by peer access) */
    HixlStatus st = dm->ipc_open(&h, s->device, &base, dwhy, sizeof(dwhy));
    if (st == HIXL_PARAM_INVALID) { /* it names less memory than it says: forged */
      snprintf(why, cap, "protocol error: SHM_DEV_MAP of [0x%llx, +%llu): %s", (unsigned long long)addr,
               (unsigned long long)len, dwhy);
      return HIXL_FAILED;
    }
    if (st == HIXL_SUCCESS && !(o = calloc(1, sizeof(*o)))) {
      dm->ipc_close(base, h.alloc_len, s->device);
      snprintf(dwhy, sizeof(dwhy), "out of memory");
    }
    if (o) {
      o->h = h;
      o->device = s->device;
      o->base = base;
      o->next = s->ipcs;
      s->ipcs = o;
    }
  }
  struct shm_map *mp = o ? calloc(1, sizeof(*mp)) : NULL;
  if (mp) {
    o->maps++;
    mp->range.addr = addr;
    mp->range.len = len;
    mp->base = (uint8_t *)(uintptr_t)(o->base + h.offset);
    mp->map_len = (size_t)len;
    mp->dev = true;
    mp->ipc = o;
    if (memtab_add(&s->maps, &mp->range, &clash) < 0) {
      map_free(s, mp);
      mp = NULL;
      snprintf(dwhy, sizeof(dwhy), "out of memory");
    }
  } else if (o && o->maps == 0) { /* opened just now for nothing */
    o->maps = 1;
    ipc_drop(s, o);
  }
  if (!mp) {
    log_warn(
        "link to %s: cannot open the peer's device memory [0x%llx, +%llu) by its IPC handle (%s): its ops go "
        "as tcp frames",
        s->name, (unsigned long long)addr, (unsigned long long)len,
        dm ? dwhy : "no device-memory provider here");
    return HIXL_SUCCESS;
  }
  log_info("link to %s: opened the peer's device memory [0x%llx, +%llu) by IPC handle", s->name,
           (unsigned long long)addr, (unsigned long long)len);
  return HIXL_SUCCESS;
}

/* Initiator, in Connect, the target's pid proven on its unix socket (l->ufd) and
 * the probe passed: say so on the link (SHM_MAP_HELLO) and map the regions the
 * target hands over until its SHM_MAP_ACK. A target that refuses leaves the link on
 * process_vm_* (logged); a malformed answer fails Connect. */
HixlStatus eshm_map_connect(int fd, uint64_t deadline, struct peer *p, struct eshm_link *l, uint8_t *buf,
                            size_t cap) {
  struct shm_peer *s = l->peer;
  struct wire_wr w;
  struct wire_hdr h;
  struct wire_msg m;
  char why[384];
  HixlStatus st;
  wire_begin(&w, buf, cap, WIRE_SHM_MAP_HELLO);
  wire_put_u32(&w, 0);
  if ((st = link_handshake_send(fd, p, buf, wire_end(&w, 0), deadline)) != HIXL_SUCCESS) return st;
  for (;;) {
    if ((st = link_handshake_recv(fd, deadline, p, buf, cap, &h)) != HIXL_SUCCESS) return st;
    if ((h.type != WIRE_SHM_MAP && h.type != WIRE_SHM_DEV_MAP && h.type != WIRE_SHM_MAP_ACK) ||
        wire_decode(&h, buf + WIRE_HDR_LEN, &m) != WIRE_OK)
      return hixl_fail(HIXL_FAILED, "answered SHM_MAP_HELLO with a malformed %s", wire_type_name(h.type));
    uint64_t now = hixl_now_ns();
    int ms = now < deadline ? (int)((deadline - now + 999999) / 1000000) : 0;
    /* The target's page comes first on the socket, when it hands anything over. */
    bool ok = h.type != WIRE_SHM_MAP_ACK || m.u.map.status == WIRE_HELLO_OK;
    if (ok && !l->gen && !gen_take(l, ms, why, sizeof(why))) return hixl_fail(HIXL_FAILED, "%s", why);
    if (h.type == WIRE_SHM_MAP_ACK) break;
    if (h.type == WIRE_SHM_DEV_MAP) {
      if (eshm_dev_map_take(s, peer_remote_find(p, m.u.map.addr, m.u.map.len), &m, why, sizeof(why)) !=
          HIXL_SUCCESS)
        return hixl_fail(HIXL_FAILED, "%s", why);
      continue;
    }
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

/* Initiator: a frame the target sent on its own. */
void eshm_initiator_frame(struct conn *c, const struct wire_msg *m) {
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
  if (m->hdr.type == WIRE_SHM_DEV_MAP) {
    s->device = engine_local_device(link_engine(c)); /* device memory registered since Connect */
    if (eshm_dev_map_take(s, link_remote_find(c, m->u.map.addr, m->u.map.len), m, why, sizeof(why)) !=
        HIXL_SUCCESS) {
      log_warn("link to %s: %s", s->name, why);
      link_conn_kill(c, HIXL_FAILED, why);
    }
    return;
  }
  if (m->hdr.type == WIRE_SHM_UNMAP) {
    struct shm_map *mp = (struct shm_map *)memtab_find_exact(&s->maps, m->u.map.addr, m->u.map.len);
    const struct remote_mem *rm = link_remote_find(c, m->u.map.addr, m->u.map.len);
    /* A memfd is being freed: ops submitted from now on fail at once, the region leaves
     * the peer's table. Device memory may stay registered (a revoke takes back only the
     * mapping, and may hand it over again): its ops go as tcp frames from now on, where
     * the target's CPU checks them, until a MEM_DEL withdraws it. */
    if (!rm || rm->kind != WIRE_MEM_DEVICE || rm->range.addr != m->u.map.addr ||
        rm->range.len != m->u.map.len)
      link_peer_forget(c, m->u.map.addr, m->u.map.len);
    if (!mp) { /* never mapped here (it could not be): nothing to wait for */
      send_unmap_ack(c, m->u.map.addr, m->u.map.len);
      return;
    }
    mp->ack_owed = true;
    eshm_map_retire(s, mp);
    return;
  }
  snprintf(why, sizeof(why), "protocol error: unexpected %s", wire_type_name(m->hdr.type));
  link_conn_kill(c, HIXL_FAILED, why);
}

/* ---- target: grants ---- */

/* Target: SHM_DEV_MAP of device registration r, its IPC handle exported at share. */
static size_t dev_map_frame(const struct hixl_mem_reg *r, uint8_t *buf, size_t cap) {
  struct devmem_ipc h = reg_of(r)->ipc;
  uint64_t addr = r->range.addr;
  struct wire_wr w;
#ifdef HIXL_DEVMEM_TEST
  /* Test builds: a forged handover, to see the initiator refuse it (test_devmem). */
  const char *forge = getenv("HIXL_TEST_SHM_FORGE");
  if (forge && strcmp(forge, "alloc") == 0) h.alloc_len += 1u << 20; /* more than the memfd holds */
  if (forge && strcmp(forge, "addr") == 0) addr += 4096;             /* not the registration */
#endif
  wire_begin(&w, buf, cap, WIRE_SHM_DEV_MAP);
  wire_put_u64(&w, addr);
  wire_put_u64(&w, r->range.len);
  wire_put_u64(&w, h.alloc_len);
  wire_put_u64(&w, h.offset);
  wire_put_bytes(&w, h.blob, sizeof(h.blob));
  return wire_end(&w, 0);
}

/* Target: hand r to c's initiator: a memfd (the descriptor on the unix socket first,
 * then SHM_MAP on the link, so it is there when the frame is read), or device memory's
 * IPC handle (SHM_DEV_MAP). Lock held. */
static void grant(struct conn *c, struct hixl_mem_reg *r) {
  struct eshm_link *l = link_of(c);
  uint8_t buf[WIRE_HDR_LEN + WIRE_SHM_DEV_MAP_LEN];
  struct wire_wr w;
  if (l->ngrants == l->cap_grants) {
    uint32_t cap = l->cap_grants ? 2 * l->cap_grants : 8;
    struct shm_grant *g = realloc(l->grants, cap * sizeof(*g));
    if (!g) {
      log_warn("link from %s: out of memory: [0x%llx, +%llu) is not mapped there", link_remote(c),
               (unsigned long long)r->range.addr, (unsigned long long)r->range.len);
      return;
    }
    l->grants = g;
    l->cap_grants = cap;
  }
  if (r->type == HIXL_MEM_DEVICE) {
    size_t n = dev_map_frame(r, buf, sizeof(buf));
    l->grants[l->ngrants++] = (struct shm_grant){.reg = r};
    link_queue_copy(c, buf, n);
    return;
  }
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_MAP);
  wire_put_u64(&w, r->range.addr);
  wire_put_u64(&w, r->range.len);
  wire_put_u64(&w, r->map_len);
  size_t len = wire_end(&w, 0);
  if (uds_send_fd(l->ufd, buf + WIRE_HDR_LEN, WIRE_SHM_MAP_LEN, r->memfd) < 0) {
    log_warn("link from %s: cannot hand over the memfd of [0x%llx, +%llu) (%s): process_vm_* copies it",
             link_remote(c), (unsigned long long)r->range.addr, (unsigned long long)r->range.len,
             strerror(errno));
    return;
  }
  l->grants[l->ngrants++] = (struct shm_grant){.reg = r};
  link_queue_copy(c, buf, len);
}

/* Whether r can be handed to c's initiator: HixlEngineAllocMem's, sealed (offered: it
 * has its shm state), not being freed; or device memory the provider exported, to an
 * initiator that opens it (WIRE_SHM_F_DEVMAP), and on a scoped engine only where the
 * peer's grants cover the whole allocation the handle opens (it maps all of it), unless
 * the engine hands device memory over as host memory (hixl_engine_set_devmap_scoped). */
static bool grantable(struct conn *c, const struct hixl_mem_reg *r) {
  const struct shm_reg *sr = reg_of(r);
  if (!sr || sr->unsharing) return false;
  if (r->type != HIXL_MEM_DEVICE) return r->memfd >= 0 && r->sealed;
  return sr->ipc_ok && link_of(c)->want_devmap &&
         (!engine_devmap_scoped(link_engine(c)) ||
          link_grant_covers(c, r->range.addr - sr->ipc.offset, sr->ipc.alloc_len));
}

/* Whether c's initiator holds a grant of r (being recalled or not). */
static bool granted(const struct eshm_link *l, const struct hixl_mem_reg *r) {
  for (uint32_t i = 0; i < l->ngrants; i++)
    if (l->grants[i].reg == r) return true;
  return false;
}

/* Target, SHM_MAP_HELLO: the initiator says it connected to the link's socket. The
 * connection must be the process the link's SHM_HELLO named (eshm_target_accept),
 * bound to the link when it has a key, and running as this user; then it gets every
 * region there is, and SHM_MAP_ACK. A refusal closes the socket (one try a link). */
void eshm_target_map_hello(struct conn *c) {
  struct HixlEngine *e = link_engine(c);
  struct eshm_engine *x = eng_of(e);
  struct eshm_link *l = link_of(c);
  uint8_t buf[WIRE_HDR_LEN + 4 + WIRE_SHM_REASON_MAX];
  char why[WIRE_SHM_REASON_MAX] = "";
  struct wire_wr w;
  uint32_t me = (uint32_t)geteuid();
  bool again = l && l->mapping;
  if (again) {
    snprintf(why, sizeof(why), "SHM_MAP_HELLO came twice");
  } else if (!l || (l->lfd < 0 && l->ufd < 0)) {
    snprintf(why, sizeof(why), "no unix socket is open on this link");
  } else if (!eshm_target_accept(c, l)) { /* it connected before it sent the frame */
    snprintf(why, sizeof(why), "pid %u, this link's peer, did not connect to the unix socket", l->hello_pid);
  } else if (!l->bound) {
    snprintf(why, sizeof(why), "the unix socket was not bound to this link first (the link has a key)");
  } else if (l->peer_uid != me) {
    snprintf(why, sizeof(why), "pid %u connected as uid %u; memory is mapped only into processes of uid %u",
             l->hello_pid, l->peer_uid, me);
  } else if (!l->want_map || !x->gen) {
    snprintf(why, sizeof(why), "%s",
             !l->want_map ? "the initiator's SHM_HELLO did not ask to map memory"
                          : "this engine offers no memory to map (it could not make its page)");
  } else if ((void)eshm_life_start(x), uds_send_fd(l->ufd, ESHM_GEN_MSG, 8, x->gen_fd) < 0) {
    snprintf(why, sizeof(why), "cannot hand over its page on the unix socket: %s", strerror(errno));
  }
  if (!why[0]) {
    l->mapping = true;
    for (size_t i = 0; i < engine_reg_count(e) && !link_dead(c); i++) {
      struct hixl_mem_reg *r = engine_reg_at(e, i);
      if (grantable(c, r)) grant(c, r);
    }
    if (link_dead(c)) return;
    log_info("link from %s: %u regions handed over to map", link_remote(c), l->ngrants);
  } else {
    if (l && !again) eshm_unix_close(x, l);
    if (again && l->said_again) /* refused alike each time: a peer repeating it cannot flood the log */
      log_debug("link from %s: memory not mapped there: %s", link_remote(c), why);
    else
      log_warn("link from %s: memory not mapped there: %s", link_remote(c), why);
    if (again) l->said_again = true;
  }
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_MAP_ACK);
  wire_put_u32(&w, why[0] ? WIRE_HELLO_REFUSED : WIRE_HELLO_OK);
  wire_put_bytes(&w, why, strlen(why));
  link_queue_copy(c, buf, wire_end(&w, 0));
}

/* Target: forget c's grant at i; a FreeMem or revoke waiting for it is told. Lock held. */
void eshm_grant_drop(struct conn *c, struct eshm_link *l, uint32_t i) {
  struct shm_grant g = l->grants[i];
  l->grants[i] = l->grants[--l->ngrants];
  if (g.unmapping) { /* FreeMem waits for the region's count, drop_peer for the link's grants */
    reg_of(g.reg)->unshare_wait--;
    engine_signal(link_engine(c));
  }
  if (g.revoking) link_recall_end(c);
}

/* Target, SHM_UNMAP_ACK: the initiator let go of a region. Device memory whose
 * allocation the peer's grants cover whole again (granted while the recall was on its
 * way, from a service handler that could not wait for it) is handed over anew. */
void eshm_target_unmap_ack(struct conn *c, const struct wire_msg *m) {
  struct eshm_link *l = link_of(c);
  for (uint32_t i = 0; l && i < l->ngrants; i++)
    if (l->grants[i].reg->range.addr == m->u.map.addr && l->grants[i].reg->range.len == m->u.map.len) {
      struct hixl_mem_reg *r = l->grants[i].reg; /* a FreeMem of it waits for the lock held here */
      eshm_grant_drop(c, l, i);
      if (r->type == HIXL_MEM_DEVICE && !granted(l, r) && grantable(c, r)) {
        grant(c, r);
        if (!link_dead(c)) link_flush(c);
      }
      return;
    }
}

/* Move the count mapping peers read before a transfer: their next one reads the
 * socket first. */
void eshm_gen_bump(struct HixlEngine *e) {
  if (eng_of(e) && eng_of(e)->gen) __atomic_add_fetch(eng_of(e)->gen, 1, __ATOMIC_RELEASE);
}

/* ---- memory ---- */

/* A registration was withdrawn (its MEM_DEL sent): mapping peers see the count move.
 * No link holds a grant of r any more (FreeMem recalled them, Finalize cut the links):
 * its shm state goes. */
void eshm_mem_dereg(struct HixlEngine *e, struct hixl_mem_reg *r) {
  eshm_gen_bump(e);
  free(reg_of(r));
  r->xm[XPORT_SHM] = NULL;
}

/* HixlEngineAllocMem made r, or RegisterMem registered device memory r: hand it to every
 * link whose initiator maps memory (device memory: by its IPC handle, when the provider
 * exports one). */
void eshm_mem_share(struct HixlEngine *e, struct hixl_mem_reg *r) {
  struct eshm_engine *x = eng_of(e);
  bool dev = r->type == HIXL_MEM_DEVICE;
  if (!x || (!dev && (r->memfd < 0 || !r->sealed))) return;
  if (!reg_of(r) && !(r->xm[XPORT_SHM] = calloc(1, sizeof(struct shm_reg)))) {
    log_warn("engine %s: out of memory: [0x%llx, +%llu) is not offered to same-host peers to map: %s",
             engine_name(e), (unsigned long long)r->range.addr, (unsigned long long)r->range.len,
             dev ? "they move it as tcp frames" : "process_vm_* copies it");
    return;
  }
  if (dev) {
    char why[256] = "";
    const struct devmem_ops *dm = devmem_get(why, sizeof(why));
    struct devmem_ipc h;
    if (dm && dm->ipc_export(r->range.addr, r->range.len, r->device, &h, why, sizeof(why)) == HIXL_SUCCESS) {
      reg_of(r)->ipc = h;
      reg_of(r)->ipc_ok = true;
    } else {
      log_info("engine %s: device memory [0x%llx, +%llu) is not offered by IPC handle (%s): same-host peers "
               "move it as tcp frames",
               engine_name(e), (unsigned long long)r->range.addr, (unsigned long long)r->range.len, why);
      return;
    }
  }
  uint32_t walk = ++x->walks;
  for (struct eshm_link *l; (l = eshm_next(x, walk));) {
    struct conn *c = l->conn;
    if (!link_is_target(c) || !l->mapping || !grantable(c, r)) continue;
    grant(c, r);
    if (!link_dead(c)) link_flush(c);
  }
}

/* Target: ask c's initiator for grant i back (SHM_UNMAP); the grant stays until it
 * answers or the link dies (eshm_grant_drop). Lock held. */
static void grant_recall(struct conn *c, uint32_t i) {
  struct shm_grant *g = &link_of(c)->grants[i];
  uint8_t buf[WIRE_HDR_LEN + WIRE_SHM_UNMAP_LEN];
  struct wire_wr w;
  g->unmapping = true;
  reg_of(g->reg)->unshare_wait++;
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
  x->unsharing++;
  while (pending(e, arg) && hixl_now_ns() < deadline) engine_wait(e, deadline);
  if (--x->unsharing == 0) engine_signal(e);
}

static bool reg_pending(struct HixlEngine *e, const void *r) {
  (void)e;
  return reg_of(r)->unshare_wait > 0;
}

/* HixlEngineFreeMem, before r goes: ask every link that has r mapped to unmap it and
 * wait, lock released, for the answers until deadline; cut the links that did not
 * answer. Afterwards no peer can reach r's pages. Lock held on entry and return. */
void eshm_mem_unshare(struct HixlEngine *e, struct hixl_mem_reg *r, uint64_t deadline) {
  struct eshm_engine *x = eng_of(e);
  struct shm_reg *sr = reg_of(r);
  if (!x || !sr) return; /* never offered: no link has it */
  sr->unsharing = true;  /* no new grant from here on */
  uint32_t walk = ++x->walks;
  for (struct eshm_link *l; (l = eshm_next(x, walk));) {
    struct conn *c = l->conn;
    if (!link_is_target(c)) continue;
    for (uint32_t i = 0; i < l->ngrants; i++) {
      if (l->grants[i].reg != r || l->grants[i].unmapping) continue;
      grant_recall(c, i);
      if (!link_dead(c)) link_flush(c); /* a link that died on the way dropped the grant */
      break;
    }
  }
  if (sr->unshare_wait > 0) recall_wait(e, reg_pending, r, deadline);
  walk = ++x->walks;
  for (struct eshm_link *l; sr->unshare_wait > 0 && (l = eshm_next(x, walk));) {
    struct conn *c = l->conn;
    if (!link_is_target(c)) continue;
    for (uint32_t i = 0; i < l->ngrants; i++) {
      if (l->grants[i].reg != r) continue;
      char why[256];
      snprintf(
          why, sizeof(why),
          "it did not unmap [0x%llx, +%llu) in time (SHM_UNMAP unanswered): cut off before the memory is "
          "freed",
          (unsigned long long)r->range.addr, (unsigned long long)r->range.len);
      log_warn("link from %s: %s", link_remote(c), why);
      link_conn_kill(c, HIXL_TIMEOUT, why); /* its grants go with it */
      break;
    }
  }
  sr->unsharing = false;
}

/* Whether the links with name still have regions mapped. (A target link is named by
 * its peer's HELLO alone: only initiator links have a struct peer.) */
static bool peer_pending(struct HixlEngine *e, const void *name) {
  for (struct eshm_link *l = eng_of(e)->links; l; l = l->next) /* kills nothing */
    if (link_is_target(l->conn) && l->ngrants > 0 && strcmp(link_remote(l->conn), name) == 0) return true;
  return false;
}

/* drop_peer: every region the peer's links have mapped is asked back (SHM_UNMAP) and
 * the call waits, lock released, until the peer answered for each (its copies running
 * have ended) or deadline. Then nothing it does reaches this engine's memory once its
 * links are cut: a copy through a mapping cannot be stopped any other way. */
void eshm_peer_drop(struct HixlEngine *e, const char *name, uint64_t deadline) {
  struct eshm_engine *x = eng_of(e);
  if (!x) return;
  uint32_t walk = ++x->walks;
  for (struct eshm_link *l; (l = eshm_next(x, walk));) {
    struct conn *c = l->conn;
    if (!link_is_target(c) || strcmp(link_remote(c), name) != 0) continue;
    for (uint32_t i = 0; i < l->ngrants && !link_dead(c); i++)
      if (!l->grants[i].unmapping) grant_recall(c, i); /* else a FreeMem asked already */
    if (!link_dead(c)) link_flush(c);
  }
  if (!peer_pending(e, name)) return;
  recall_wait(e, peer_pending, name, deadline);
  if (peer_pending(e, name))
    log_warn("engine %s: %s did not unmap this engine's memory in time: its links are cut anyway",
             engine_name(e), name);
}

/* Whether [addr, addr + len) meets one of ranges[0..n). */
static bool meets(uint64_t addr, uint64_t len, const uint64_t (*ranges)[2], size_t n) {
  for (size_t i = 0; i < n; i++)
    if (ranges[i][0] < addr + len && addr < ranges[i][0] + ranges[i][1]) return true;
  return false;
}

/* A scoped engine's grants for peer changed: its links get the device registrations
 * now covered whole (grantable), and are asked for those whose allocation meets a
 * range revoked back (SHM_UNMAP). This runs inside the grant's bookkeeping (lock held,
 * it must not be released here): the revoke waits for the answers once that is done
 * (link_recall_begin; api_mem.c's revoke_wait), unless it runs in a service handler. */
void eshm_grant(struct HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n,
                enum xport_grant how) {
  struct eshm_engine *x = eng_of(e);
  if (!x || !engine_devmap_scoped(e) || how == XPORT_SHARED) return; /* handovers follow whole coverage */
  bool add = how == XPORT_GRANTED;
  uint32_t walk = ++x->walks;
  for (struct eshm_link *l; (l = eshm_next(x, walk));) {
    struct conn *c = l->conn;
    if (!link_is_target(c) || !l->mapping || !l->want_devmap || strcmp(link_remote(c), peer) != 0) continue;
    if (add) {
      for (size_t i = 0; i < engine_reg_count(e) && !link_dead(c); i++) {
        struct hixl_mem_reg *r = engine_reg_at(e, i);
        if (r->type == HIXL_MEM_DEVICE && !granted(l, r) && grantable(c, r)) grant(c, r);
      }
    } else {
      for (uint32_t i = 0; i < l->ngrants && !link_dead(c); i++) {
        struct shm_grant *g = &l->grants[i];
        const struct shm_reg *sr = reg_of(g->reg);
        if (g->reg->type != HIXL_MEM_DEVICE || g->revoking ||
            !meets(g->reg->range.addr - sr->ipc.offset, sr->ipc.alloc_len, ranges, n))
          continue;
        if (!g->unmapping) grant_recall(c, i); /* else a FreeMem asked already: wait all the same */
        if (link_dead(c)) break;               /* its grants went with it */
        g->revoking = true;
        link_recall_begin(c);
      }
    }
    if (!link_dead(c)) link_flush(c);
  }
}
