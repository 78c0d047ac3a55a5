/* api_dial: a fresh socket's HELLO handshake (and authentication), and rails: asking
 * a peer for its rail addresses, dialling one link per rail, the prober thread that
 * dials a rail that went down, and the rails' counters (docs/rails.md). Below
 * api_link.c, which makes the links Connect asks for. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/api_int.h"
#include "util/be.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"
#include "util/thread.h"

/* ---- the handshake ---- */

static HixlStatus ask_rails(HixlEngine *e, int fd, const char *remote, uint64_t deadline, struct peer *p);

/* Receive one handshake frame's header into h (its bytes into hb); the caller reads its body. */
static HixlStatus recv_frame(int fd, const char *remote, uint64_t deadline, struct wire_hdr *h,
                             uint8_t hb[WIRE_HDR_LEN]) {
  HixlStatus st = sock_recv_all(fd, hb, WIRE_HDR_LEN, deadline);
  if (st != HIXL_SUCCESS)
    return hixl_fail(st, "HixlEngineConnect: handshake with %s: %s", remote, HixlGetLastErrorMessage());
  enum wire_err err = wire_parse_hdr(hb, h);
  if (err == WIRE_EVERSION)
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s speaks hixl protocol version %u, this engine %u",
                     remote, h->version, WIRE_VERSION);
  if (err != WIRE_OK || (h->type != WIRE_HELLO_ACK && h->type != WIRE_AUTH_CHALLENGE))
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s is not a hixl engine (%s)", remote,
                     err != WIRE_OK ? wire_err_str(err) : "unexpected first frame");
  return HIXL_SUCCESS;
}

/* The initiator's half of authentication: check the target's AUTH_CHALLENGE and
 * answer AUTH_PROOF; the link's session secret goes to p. */
static HixlStatus prove(HixlEngine *e, int fd, const char *remote, uint64_t deadline, struct peer *p,
                        const struct auth_ring *ring, const uint8_t nonce_i[AUTH_NONCE_LEN],
                        uint32_t caps_i) {
  uint8_t body[WIRE_AUTH_CHALLENGE_FIXED + WIRE_MAX_NAME], mac[AUTH_MAC_LEN];
  uint8_t frame[WIRE_HDR_LEN + WIRE_AUTH_MAC];
  uint8_t hb[WIRE_HDR_LEN];
  struct wire_hdr h;
  struct wire_msg m;
  HixlStatus st = recv_frame(fd, remote, deadline, &h, hb);
  if (st != HIXL_SUCCESS) return st;
  /* A keyless target serving the link sends its whole table, longer than any refusal
   * or challenge: of such a HELLO_ACK only the status (its first field) is read. */
  bool served = h.type == WIRE_HELLO_ACK && h.body_len > sizeof(body);
  if (h.body_len > sizeof(body) && !served)
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s sent a malformed %s", remote,
                     wire_type_name(h.type));
  if ((st = sock_recv_all(fd, body, served ? 4 : h.body_len, deadline)) != HIXL_SUCCESS)
    return hixl_fail(st, "HixlEngineConnect: handshake with %s: %s", remote, HixlGetLastErrorMessage());
  if (h.type == WIRE_HELLO_ACK) {
    if (served ? be_get32(body) != WIRE_HELLO_OK : wire_decode(&h, body, &m) != WIRE_OK)
      return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s sent a malformed HELLO_ACK", remote);
    if (served || m.u.hello_ack.status == WIRE_HELLO_OK)
      return hixl_fail(HIXL_FAILED,
                       "HixlEngineConnect: %s does not authenticate (it has no AuthKeyFile), and this engine "
                       "has one: refusing the link",
                       remote);
    if (m.u.hello_ack.status == WIRE_HELLO_NOT_ME) {
      char who[WIRE_MAX_NAME + 1];
      log_escape(who, sizeof(who), m.u.hello_ack.name, m.u.hello_ack.name_len);
      if (strcmp(who, e->local_name) == 0)
        return hixl_fail(
            HIXL_FAILED,
            "HixlEngineConnect: dialled %s, and this engine itself answered (%s): a relay passed "
            "the handshake back to it; an engine never links to itself",
            remote, who);
      return hixl_fail(
          HIXL_FAILED,
          "HixlEngineConnect: dialled %s, but the engine that answered (calling itself \"%s\") does "
          "not take that address as one of its names: something between passes links on (a relay, "
          "NAT or a service address); if that is meant, list %s in that engine's AuthAliases",
          remote, who, remote);
    }
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s refused the link: %s", remote,
                     m.u.hello_ack.status == WIRE_HELLO_VERSION ? "protocol version mismatch"
                     : m.u.hello_ack.status == WIRE_HELLO_AUTH
                         ? "authentication failed (it holds none of this engine's keys)"
                         : "refused");
  }
  if (wire_decode(&h, body, &m) != WIRE_OK)
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s sent a malformed AUTH_CHALLENGE", remote);
  const struct auth_key *k = auth_key_by_id(ring, m.u.auth.id);
  if (!k)
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s chose a key this engine does not hold", remote);
  const char *me = e->local_name;
#define TRANSCRIPT(label, out)                                                                               \
  auth_transcript_mac(k, label, nonce_i, m.u.auth.nonce, me, strlen(me), m.u.auth.name, m.u.auth.name_len,   \
                      caps_i | WIRE_CAP_AUTH, remote, strlen(remote), out)
  TRANSCRIPT(AUTH_LABEL_TARGET, mac);
  if (!auth_equal(mac, m.u.auth.mac, AUTH_MAC_LEN))
    return hixl_fail(HIXL_FAILED,
                     "HixlEngineConnect: %s failed to prove the key it named: not a trusted engine (or the "
                     "handshake was tampered with)",
                     remote);
  TRANSCRIPT(AUTH_LABEL_INITIATOR, mac);
  TRANSCRIPT(AUTH_LABEL_SESSION, p->session);
#undef TRANSCRIPT
  struct wire_wr w;
  wire_begin(&w, frame, sizeof(frame), WIRE_AUTH_PROOF);
  wire_put_bytes(&w, mac, sizeof(mac));
  st = sock_send_all(fd, frame, wire_end(&w, 0), deadline);
  auth_wipe(mac, sizeof(mac));
  if (st != HIXL_SUCCESS)
    return hixl_fail(st, "HixlEngineConnect: handshake with %s: %s", remote, HixlGetLastErrorMessage());
  p->authed = true;
  /* Every frame from here on, both ways, is tagged (the HELLO_ACK first). */
  if (!auth_frames_init(&p->proof, p->session, true))
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineConnect: cannot set up the frame proofs (OpenSSL)");
  return HIXL_SUCCESS;
}

/* Exchange HELLO (and, with a key, AUTH_CHALLENGE / AUTH_PROOF) and HELLO_ACK on a
 * fresh blocking socket; fills the peer. */
HixlStatus api_handshake(HixlEngine *e, int fd, const char *remote, uint64_t deadline, struct peer *p,
                         bool rail, const struct xport_ops **xp, void **link) {
  uint8_t hello[WIRE_HDR_LEN + 6 + WIRE_MAX_NAME + WIRE_AUTH_BLOCK_MAX], hb[WIRE_HDR_LEN];
  struct wire_hdr h;
  struct wire_msg m;
  HixlStatus st;
  uint32_t caps = link_caps(e);
  struct auth_ring ring;
  auth_current(&e->auth, &ring); /* no keys (n 0): no authentication */
  if (ring.n == 0) {
    st = sock_send_all(fd, hello, wire_put_hello(hello, sizeof(hello), caps, e->local_name), deadline);
    if (st != HIXL_SUCCESS)
      return hixl_fail(st, "HixlEngineConnect: handshake with %s: %s", remote, HixlGetLastErrorMessage());
  } else {
    uint8_t nonce[AUTH_NONCE_LEN], ids[AUTH_ID_LEN * AUTH_KEYS_MAX];
    for (unsigned i = 0; i < ring.n; i++) memcpy(ids + i * AUTH_ID_LEN, ring.key[i].id, AUTH_ID_LEN);
    if (!auth_random(nonce, sizeof(nonce))) {
      st = hixl_fail(HIXL_FAILED, "HixlEngineConnect: no random bytes from the kernel for a challenge");
    } else {
      /* Kept until the handshake ends: a HELLO carrying it that reaches this engine's
       * own port is this handshake reflected (an engine never links to itself). */
      int slot = link_nonce_hold(e, nonce);
      caps |= WIRE_CAP_PROVEN; /* every frame after the proof is tagged */
      size_t len = wire_put_hello_auth(hello, sizeof(hello), caps, e->local_name, nonce, ids, ring.n, remote);
      if ((st = sock_send_all(fd, hello, len, deadline)) != HIXL_SUCCESS)
        st = hixl_fail(st, "HixlEngineConnect: handshake with %s: %s", remote, HixlGetLastErrorMessage());
      if (st == HIXL_SUCCESS) st = prove(e, fd, remote, deadline, p, &ring, nonce, caps);
      link_nonce_drop(e, slot);
    }
    auth_wipe(&ring, sizeof(ring));
    if (st != HIXL_SUCCESS) return st;
  }
  if ((st = recv_frame(fd, remote, deadline, &h, hb)) != HIXL_SUCCESS) return st;
  if (h.type != WIRE_HELLO_ACK)
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s sent %s where HELLO_ACK was due", remote,
                     wire_type_name(h.type));
  uint8_t *frame = malloc(WIRE_HDR_LEN + h.body_len), *body = frame ? frame + WIRE_HDR_LEN : NULL;
  if (!frame) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineConnect: out of memory");
  memcpy(frame, hb, WIRE_HDR_LEN);
  st = sock_recv_all(fd, body, h.body_len, deadline);
  if (st != HIXL_SUCCESS) {
    st = hixl_fail(st, "HixlEngineConnect: handshake with %s: %s", remote, HixlGetLastErrorMessage());
    goto out;
  }
  if (wire_decode(&h, body, &m) != WIRE_OK) {
    st = hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s sent a malformed HELLO_ACK", remote);
    goto out;
  }
  /* An authenticated link's HELLO_ACK is its first proven frame; a refusal of the proof
   * is not (the target never took the session). */
  if ((m.u.hello_ack.status == WIRE_HELLO_OK || (h.flags & WIRE_F_TAG)) &&
      (st = link_handshake_tag(fd, deadline, p, frame, &h)) != HIXL_SUCCESS) {
    st = hixl_fail(st, "HixlEngineConnect: %s's HELLO_ACK: %s", remote, HixlGetLastErrorMessage());
    goto out;
  }
  if (m.u.hello_ack.status != WIRE_HELLO_OK) {
    st = hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s refused the link (%s)", remote,
                   m.u.hello_ack.status == WIRE_HELLO_VERSION ? "protocol version mismatch"
                   : m.u.hello_ack.status != WIRE_HELLO_AUTH  ? "refused"
                   : p->authed ? "authentication failed: it did not take this engine's proof"
                               : "authentication required: it has an AuthKeyFile, this engine none");
    goto out;
  }
  log_escape(p->remote_name, sizeof(p->remote_name), m.u.hello_ack.name, m.u.hello_ack.name_len);
  p->caps = m.u.hello_ack.caps;
  const uint8_t *cur = m.u.hello_ack.entries;
  size_t left = m.u.hello_ack.entries_len;
  struct wire_mem_entry me;
  while (wire_mem_entry_next(&cur, &left, &me)) link_peer_add_mem(p, &me, 0);
  /* Data path: the first transport that takes the link (xport_id order: shm for a
   * peer on this host that the kernel lets us reach, else rdma when both ends have
   * it, else tcp). Each passes on, or fails when Transport names it and it cannot.
   * A rail crosses a NIC: rdma (a QP on the device of its local address) or tcp. */
  bool taken = false;
  for (int i = rail ? XPORT_RDMA : 0; i < XPORT_MODS && !taken && st == HIXL_SUCCESS; i++) {
    const struct xport_ops *x = e->mods[i];
    st = x->link.connect(e, fd, deadline, remote, p, &taken, link);
    if (taken) *xp = x;
  }
  if (st == HIXL_SUCCESS && !rail && e->opts.rails_on && (p->caps & WIRE_CAP_RAILS)) {
    if (*xp == e->mods[XPORT_TCP] || *xp == e->mods[XPORT_RDMA])
      st = ask_rails(e, fd, remote, deadline, p);
    else /* shm: one host, no NIC to stripe over */
      log_info("link to %s goes by %s: one rail (Rails stripes tcp and rdma links)", remote, (*xp)->name);
  }
out:
  free(frame);
  return st;
}

/* ---- rails ---- */

static const char *addr_str(const struct sockaddr_in *a, char *buf, size_t cap) {
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
  snprintf(buf, cap, "%s:%u", ip, ntohs(a->sin_port));
  return buf;
}

/* The local address this engine reaches to from: the kernel's route, kept when it is
 * one of the listed rails (or with "auto"); else the listed rail i (mod the list). */
static uint32_t rail_source(const HixlEngine *e, const struct sockaddr_in *to, uint32_t i) {
  struct sockaddr_in src = {0};
  socklen_t sl = sizeof(src);
  int u = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  bool routed = u >= 0 && connect(u, (const struct sockaddr *)to, sizeof(*to)) == 0 &&
                getsockname(u, (struct sockaddr *)&src, &sl) == 0;
  if (u >= 0) close(u);
  if (e->opts.rails_auto) return routed ? src.sin_addr.s_addr : 0;
  for (uint32_t k = 0; routed && k < e->opts.rails_n; k++)
    if (e->opts.rail_addr[k] == src.sin_addr.s_addr) return src.sin_addr.s_addr;
  return e->opts.rail_addr[i % e->opts.rails_n];
}

/* Whether a peer reached at link (rail 0) may have a rail at to: a port and a unicast
 * address, never 0.0.0.0 (connect takes it as this host), loopback only for a peer on
 * this host. Else a peer would have this engine dial, and its prober dial again and
 * again, a service of this host it names. */
static bool rail_addr_ok(const struct sockaddr_in *link, const struct sockaddr_in *to) {
  uint32_t a = ntohl(to->sin_addr.s_addr), l = ntohl(link->sin_addr.s_addr);
  if (to->sin_port == 0 || a == INADDR_ANY || a >= 0xe0000000u)
    return false; /* multicast, reserved, broadcast */
  return (a >> 24) != 127 || (l >> 24) == 127;
}

/* Connect's link is rail 0; RAILS_ACK names the peer's rails, its listen address first. */
static HixlStatus ask_rails(HixlEngine *e, int fd, const char *remote, uint64_t deadline, struct peer *p) {
  uint8_t buf[WIRE_HDR_LEN + 12 + WIRE_RAIL_LEN * WIRE_MAX_RAILS];
  struct wire_hdr h;
  struct wire_msg m;
  HixlStatus st = link_handshake_send(fd, p, buf, wire_put_rails(buf, 0), deadline);
  if (st == HIXL_SUCCESS) st = link_handshake_recv(fd, deadline, p, buf, sizeof(buf), &h);
  if (st != HIXL_SUCCESS)
    return hixl_fail(st, "HixlEngineConnect: asking %s for its rails: %s", remote, HixlGetLastErrorMessage());
  if (h.type != WIRE_RAILS_ACK || wire_decode(&h, buf + WIRE_HDR_LEN, &m) != WIRE_OK)
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s answered RAILS with a malformed %s", remote,
                     wire_type_name(h.type));
  struct sockaddr_in here;
  socklen_t sl = sizeof(here);
  uint32_t n = m.u.rails.count, most = e->opts.rails_auto ? HIXL_RAILS_MAX : e->opts.rails_n;
  if (n > most) n = most;
  if (n < 2) return HIXL_SUCCESS; /* one rail: the link Connect made */
  memset(p->rails, 0, sizeof(p->rails));
  getsockname(fd, (struct sockaddr *)&here, &sl);
  p->rails[0].local = here;
  p->rails[0].local.sin_port = 0; /* dialled again from any port */
  getpeername(fd, (struct sockaddr *)&p->rails[0].remote, &(socklen_t){sizeof(p->rails[0].remote)});
  uint32_t k = 1;
  for (uint32_t i = 1; i < n; i++) {
    uint32_t addr;
    uint16_t port;
    wire_rail_at(&m, i, &addr, &port);
    struct rail *rl = &p->rails[k];
    rl->remote = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(port)};
    rl->remote.sin_addr.s_addr = htonl(addr);
    if (!rail_addr_ok(&p->rails[0].remote, &rl->remote)) {
      char to[32];
      log_warn("link to %s: its rail %u (%s) is not an address a peer's rail can have (no port, 0.0.0.0, "
               "multicast or broadcast, or loopback from a peer reached over a network): not dialled",
               remote, i, addr_str(&rl->remote, to, sizeof(to)));
      memset(rl, 0, sizeof(*rl));
      continue;
    }
    rl->local = (struct sockaddr_in){.sin_family = AF_INET};
    rl->local.sin_addr.s_addr = rail_source(e, &rl->remote, k);
    k++;
  }
  if (k < 2) memset(p->rails, 0, sizeof(p->rails)); /* one rail: the link Connect made */
  p->n_rails = k < 2 ? 0 : k;
  return HIXL_SUCCESS;
}

/* Dial rail k of p (its addresses copied into rl): a link with its own handshake (and
 * proof of the key), to the same engine; *hs gets the peer as that handshake saw it
 * (the keys of the rail's device), for the caller to release. The lock is not held. */
static HixlStatus rail_dial(HixlEngine *e, const char *want_name, const struct rail *rl, uint64_t deadline,
                            int *out, struct peer **hs, const struct xport_ops **out_xp, void **out_link) {
  char to[32];
  HixlStatus st;
  addr_str(&rl->remote, to, sizeof(to));
  int fd = sock_connect_from(&rl->remote, rl->local.sin_addr.s_addr ? &rl->local : NULL, deadline, &st);
  if (fd < 0) return st;
  sock_set_buffers(fd, (size_t)e->opts.sockbuf_kib << 10);
  struct peer *tmp = calloc(1, sizeof(*tmp));
  if (!tmp) {
    close(fd);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "out of memory");
  }
  const struct xport_ops *xp = NULL;
  void *link = NULL;
  st = api_handshake(e, fd, to, deadline, tmp, true, &xp, &link);
  if (st == HIXL_SUCCESS && strcmp(tmp->remote_name, want_name) != 0)
    st = hixl_fail(HIXL_FAILED, "rail %s is engine %s, not %s: not taken", to, tmp->remote_name, want_name);
  if (st != HIXL_SUCCESS) {
    api_peer_release(tmp);
    if (xp) xp->link.discard(link);
    close(fd);
    return st;
  }
  *out = fd;
  *hs = tmp;
  *out_xp = xp;
  *out_link = link;
  return HIXL_SUCCESS;
}

/* The table rail k's handshake learned (with its device's keys) becomes that rail's,
 * replacing what its link before told (lock held). Bounded as Connect's own. */
static void rail_table(struct peer *p, struct peer *hs, uint32_t k) {
  struct memtab *t = link_peer_rtab(p, (int)k);
  link_peer_rtab_free(t);
  *t = hs->rtab;
  memset(&hs->rtab, 0, sizeof(hs->rtab));
}

/* A dialled rail joins p as rail k, its data moved by xp (lock held); false: no
 * resources, fd closed and the transport's link discarded. */
static bool rail_attach(HixlEngine *e, struct peer *p, uint32_t k, int fd, const struct xport_ops *xp,
                        void *link, struct auth_frames *proof) {
  struct conn *c = link_conn_new(e, fd, CONN_INITIATOR);
  if (c) c->rx = RX_PARKED;
  if (!c || link_conn_watch(c) < 0) {
    if (c) {
      free(c->rxbuf);
      free(c);
    }
    xp->link.discard(link);
    close(fd);
    return false;
  }
  xp->link.attach(c, link);           /* c->xp: xp */
  auth_frames_move(&c->proof, proof); /* its own handshake's frame count and keys */
  snprintf(c->remote_name, sizeof(c->remote_name), "%s", p->remote_name[0] ? p->remote_name : p->name);
  sock_tune_rail(fd, e->opts.rail_stall_ms);
  c->peer = p;
  c->rail = (int)k;
  p->rails[k].conn = c;
  if (!p->conn) {
    p->conn = c; /* every rail was down: this one carries the control frames again */
    log_info("link to %s: rail %u is up again and carries its control frames", p->name, k);
  }
  link_tick_start(e);
  return true;
}

static struct peer *peer_by_id(HixlEngine *e, uint64_t id) {
  for (struct peer *p = e->peers; p; p = p->next)
    if (p->id == id) return p;
  return NULL;
}

/* Dial rail k of the peer id (lock held, released meanwhile); the peer may be gone after. */
static void rail_bring_up(HixlEngine *e, uint64_t id, uint32_t k, uint64_t deadline, bool quiet) {
  struct peer *p = peer_by_id(e, id);
  if (!p || p->rails[k].conn || p->rails[k].dialling) return;
  struct rail rl = p->rails[k];
  char want[WIRE_MAX_NAME + 1], to[32];
  snprintf(want, sizeof(want), "%s", p->remote_name);
  p->rails[k].dialling = true;
  pthread_mutex_unlock(&e->lock);
  int fd = -1;
  struct peer *hs = NULL;
  const struct xport_ops *xp = NULL;
  void *link = NULL;
  HixlStatus st = rail_dial(e, want, &rl, deadline, &fd, &hs, &xp, &link);
  pthread_mutex_lock(&e->lock);
  p = peer_by_id(e, id);
  if (p) p->rails[k].dialling = false;
  if (st != HIXL_SUCCESS) {
    if (!quiet)
      log_warn("link to %s: rail %u (%s) not up: %s", want, k, addr_str(&rl.remote, to, sizeof(to)),
               HixlGetLastErrorMessage());
    if (p) p->rails[k].next_probe_ns = hixl_now_ns() + (uint64_t)e->opts.rail_probe_ms * 1000000u;
    return;
  }
  if (!p || p->closing || p->rails[k].conn || !e->initialized) {
    api_peer_release(hs);
    xp->link.discard(link);
    close(fd);
    return;
  }
  rail_table(p, hs, k); /* before the link is read: its MEM_ADD / MEM_DEL follow these */
  struct auth_frames proof = {0};
  auth_frames_move(&proof, &hs->proof);
  api_peer_release(hs);
  bool up = rail_attach(e, p, k, fd, xp, link, &proof);
  auth_frames_free(&proof); /* taken by the link, or left with a link that never was */
  if (up)
    log_info("link to %s: rail %u up (%s, %s)", p->name, k, addr_str(&rl.remote, to, sizeof(to)), xp->name);
}

/* The prober: every RailProbeMs, each rail that is down is dialled again. */
static void *rail_prober(void *arg) {
  HixlEngine *e = arg;
  pthread_mutex_lock(&e->lock);
  while (e->rail_thread_on) {
    uint64_t now = hixl_now_ns(), next = now + (uint64_t)e->opts.rail_probe_ms * 1000000u;
    bool dialled = false;
    for (struct peer *p = e->peers; p && !dialled; p = p->next)
      for (uint32_t k = 0; k < p->n_rails && !dialled; k++) {
        struct rail *rl = &p->rails[k];
        if (rl->conn || rl->dialling || p->closing) continue;
        if (rl->next_probe_ns > now) {
          if (rl->next_probe_ns < next) next = rl->next_probe_ns;
          continue;
        }
        /* one dial per pass: the list may change while the lock is released */
        rail_bring_up(e, p->id, k, now + (uint64_t)e->opts.rail_probe_ms * 2000000u, true);
        dialled = true;
      }
    if (dialled) continue;
    struct timespec ts = {.tv_sec = (time_t)(next / 1000000000u), .tv_nsec = (long)(next % 1000000000u)};
    pthread_cond_timedwait(&e->rail_cond, &e->lock, &ts);
  }
  pthread_mutex_unlock(&e->lock);
  return NULL;
}

static void rail_stop(HixlEngine *e) {
  pthread_mutex_lock(&e->lock);
  bool on = e->rail_thread_on;
  e->rail_thread_on = false;
  pthread_cond_signal(&e->rail_cond);
  pthread_mutex_unlock(&e->lock);
  if (on) pthread_join(e->rail_thread, NULL);
}

void api_rails_up(HixlEngine *e, struct peer *p, struct conn *c, uint64_t deadline) {
  if (p->n_rails < 2) return;
  c->rail = 0;
  p->rails[0].conn = c;
  sock_tune_rail(c->fd, e->opts.rail_stall_ms);
  link_tick_start(e);
  if (!e->rail_thread_on && !e->rail_stop_failed) {
    e->rail_thread_on = true;
    e->rail_stop = rail_stop;
    if (pthread_create(&e->rail_thread, NULL, rail_prober, e) != 0) {
      e->rail_thread_on = false;
      e->rail_stop_failed = true;
      log_error("engine %s: cannot start the rail prober: a rail that goes down stays down", e->local_name);
    } else {
      thread_name(e->rail_thread, "hixl-rails");
    }
  }
  uint64_t id = p->id;
  for (uint32_t k = 1; k < HIXL_RAILS_MAX; k++) {
    p = peer_by_id(e, id);
    if (!p || k >= p->n_rails) break;
    rail_bring_up(e, id, k, deadline, false);
  }
}

HixlStatus hixl_engine_rails(HixlEngine *e, const char *remote, struct hixl_rail_info *out, size_t cap,
                             size_t *n) {
  CHECK_ARG(remote && n && (out || cap == 0), "hixl_engine_rails: remote, out or n is NULL");
  HixlStatus st = api_enter(e, "hixl_engine_rails");
  if (st != HIXL_SUCCESS) return st;
  struct peer *p = api_find_peer(e, remote);
  if (!p) {
    pthread_mutex_unlock(&e->lock);
    return hixl_fail(HIXL_NOT_CONNECTED, "hixl_engine_rails: not connected to %s", remote);
  }
  *n = p->n_rails;
  for (uint32_t k = 0; k < p->n_rails && k < cap; k++) {
    const struct rail *rl = &p->rails[k];
    struct hixl_rail_info *o = &out[k];
    memset(o, 0, sizeof(*o));
    inet_ntop(AF_INET, &rl->local.sin_addr, o->local, sizeof(o->local));
    addr_str(&rl->remote, o->remote, sizeof(o->remote));
    snprintf(o->state, sizeof(o->state), "%s", rl->conn && !rl->conn->dead ? "up" : "down");
    o->bytes = rl->bytes;
    o->ops = rl->ops;
    o->failures = rl->failures;
    o->retried = rl->retried;
    o->control = rl->conn && rl->conn == p->conn;
    snprintf(o->last_down, sizeof(o->last_down), "%s", rl->last_down);
  }
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}
