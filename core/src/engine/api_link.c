/* api_link: links to peers: Connect and its HELLO handshake, Disconnect, a link's lookup, info and drop. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/api_int.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"

/* ---- links ---- */

/* Receive one handshake frame's header into h and its body into body (cap bytes). */
static HixlStatus recv_frame(int fd, const char *remote, uint64_t deadline, struct wire_hdr *h, uint8_t *body,
                             size_t cap) {
  uint8_t hb[WIRE_HDR_LEN];
  HixlStatus st = sock_recv_all(fd, hb, sizeof(hb), deadline);
  if (st != HIXL_SUCCESS)
    return hixl_fail(st, "HixlEngineConnect: handshake with %s: %s", remote, HixlGetLastErrorMessage());
  enum wire_err err = wire_parse_hdr(hb, h);
  if (err == WIRE_EVERSION)
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s speaks hixl protocol version %u, this engine %u",
                     remote, h->version, WIRE_VERSION);
  if (err != WIRE_OK || (h->type != WIRE_HELLO_ACK && h->type != WIRE_AUTH_CHALLENGE))
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s is not a hixl engine (%s)", remote,
                     err != WIRE_OK ? wire_err_str(err) : "unexpected first frame");
  if (body && h->body_len > cap)
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s sent a malformed %s", remote,
                     wire_type_name(h->type));
  return body ? sock_recv_all(fd, body, h->body_len, deadline) : HIXL_SUCCESS;
}

/* The initiator's half of authentication: check the target's AUTH_CHALLENGE and
 * answer AUTH_PROOF; the link's session secret goes to p. */
static HixlStatus prove(HixlEngine *e, int fd, const char *remote, uint64_t deadline, struct peer *p,
                        const struct auth_ring *ring, const uint8_t nonce_i[AUTH_NONCE_LEN],
                        uint32_t caps_i) {
  uint8_t body[WIRE_AUTH_CHALLENGE_FIXED + WIRE_MAX_NAME], mac[AUTH_MAC_LEN];
  uint8_t frame[WIRE_HDR_LEN + WIRE_AUTH_MAC];
  struct wire_hdr h;
  struct wire_msg m;
  HixlStatus st = recv_frame(fd, remote, deadline, &h, body, sizeof(body));
  if (st != HIXL_SUCCESS) return st;
  if (h.type == WIRE_HELLO_ACK) {
    if (wire_decode(&h, body, &m) == WIRE_OK && m.u.hello_ack.status == WIRE_HELLO_OK)
      return hixl_fail(HIXL_FAILED,
                       "HixlEngineConnect: %s does not authenticate (it has no AuthKeyFile), and this engine "
                       "has one: refusing the link",
                       remote);
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
                      caps_i | WIRE_CAP_AUTH, out)
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
  return HIXL_SUCCESS;
}

/* Exchange HELLO (and, with a key, AUTH_CHALLENGE / AUTH_PROOF) and HELLO_ACK on a
 * fresh blocking socket; fills the peer. */
static HixlStatus handshake(HixlEngine *e, int fd, const char *remote, uint64_t deadline, struct peer *p,
                            const struct xport_ops **xp, void **link) {
  uint8_t hello[WIRE_HDR_LEN + 6 + WIRE_MAX_NAME + WIRE_AUTH_BLOCK_MAX];
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
      size_t len = wire_put_hello_auth(hello, sizeof(hello), caps, e->local_name, nonce, ids, ring.n);
      if ((st = sock_send_all(fd, hello, len, deadline)) != HIXL_SUCCESS)
        st = hixl_fail(st, "HixlEngineConnect: handshake with %s: %s", remote, HixlGetLastErrorMessage());
    }
    if (st == HIXL_SUCCESS) st = prove(e, fd, remote, deadline, p, &ring, nonce, caps);
    auth_wipe(&ring, sizeof(ring));
    if (st != HIXL_SUCCESS) return st;
  }
  if ((st = recv_frame(fd, remote, deadline, &h, NULL, 0)) != HIXL_SUCCESS) return st;
  if (h.type != WIRE_HELLO_ACK)
    return hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s sent %s where HELLO_ACK was due", remote,
                     wire_type_name(h.type));
  uint8_t *body = malloc(h.body_len);
  if (!body) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineConnect: out of memory");
  st = sock_recv_all(fd, body, h.body_len, deadline);
  if (st != HIXL_SUCCESS) {
    st = hixl_fail(st, "HixlEngineConnect: handshake with %s: %s", remote, HixlGetLastErrorMessage());
    goto out;
  }
  if (wire_decode(&h, body, &m) != WIRE_OK) {
    st = hixl_fail(HIXL_FAILED, "HixlEngineConnect: %s sent a malformed HELLO_ACK", remote);
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
  while (wire_mem_entry_next(&cur, &left, &me)) link_peer_add_mem(p, &me);
  /* Data path: the first transport that takes the link (xport_id order: shm for a
   * peer on this host that the kernel lets us reach, else rdma when both ends have
   * it, else tcp). Each passes on, or fails when Transport names it and it cannot. */
  bool taken = false;
  for (int i = 0; i < XPORT_MODS && !taken && st == HIXL_SUCCESS; i++) {
    const struct xport_ops *x = e->mods[i];
    st = x->link.connect(e, fd, deadline, remote, p, &taken, link);
    if (taken) *xp = x;
  }
out:
  free(body);
  return st;
}

HixlStatus HixlEngineConnect(HixlEngine *e, const char *remote, int32_t timeout_ms) {
  struct sockaddr_in sa;
  HixlStatus st;
  if ((st = api_check_remote(remote, "HixlEngineConnect", &sa)) != HIXL_SUCCESS) return st;
  if ((st = api_check_timeout(timeout_ms, "HixlEngineConnect")) != HIXL_SUCCESS) return st;
  uint64_t deadline = hixl_deadline_ns(timeout_ms);
  if ((st = api_enter(e, "HixlEngineConnect")) != HIXL_SUCCESS) return st;
  struct peer *old = api_find_peer(e, remote);
  bool connected = old && old->conn && link_alive(old->conn);
  pthread_mutex_unlock(&e->lock);
  if (connected)
    return hixl_fail(HIXL_ALREADY_CONNECTED, "HixlEngineConnect: already connected to %s", remote);

  struct peer *p = calloc(1, sizeof(*p));
  if (!p) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineConnect: out of memory");
  snprintf(p->name, sizeof(p->name), "%s", remote);
  int fd = sock_connect(&sa, deadline, &st);
  if (fd < 0) goto free_peer;
  const struct xport_ops *xp = NULL;
  void *link = NULL;
  st = handshake(e, fd, remote, deadline, p, &xp, &link);
  if (st != HIXL_SUCCESS) goto close_fd;

  if ((st = api_enter(e, "HixlEngineConnect")) != HIXL_SUCCESS) goto close_fd;
  old = api_find_peer(e, remote);
  if (old && old->conn) {
    pthread_mutex_unlock(&e->lock);
    st = hixl_fail(HIXL_ALREADY_CONNECTED, "HixlEngineConnect: already connected to %s", remote);
    goto close_fd;
  }
  if (old) api_peer_free(e, old); /* a link that broke earlier: replaced */
  struct conn *c = link_conn_new(e, fd, CONN_INITIATOR);
  if (c) c->rx = RX_PARKED; /* nothing is owed yet; a hang-up still wakes the thread */
  if (!c || link_conn_watch(c) < 0) {
    pthread_mutex_unlock(&e->lock);
    if (c) {
      free(c->rxbuf);
      free(c);
    }
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineConnect: cannot set up the link to %s", remote);
    goto close_fd;
  }
  xp->link.attach(c, link); /* c->xp: xp */
  xp = NULL;
  snprintf(c->remote_name, sizeof(c->remote_name), "%s", p->remote_name[0] ? p->remote_name : remote);
  c->peer = p;
  p->conn = c;
  p->next = e->peers;
  e->peers = p;
  log_info("connected to %s (%zu remote registrations)", remote, p->rtab.count);
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
close_fd:
  if (xp) xp->link.discard(link);
  close(fd);
free_peer:
  for (size_t i = 0; i < p->rtab.count; i++) free(p->rtab.v[i]);
  memtab_free(&p->rtab);
  free(p);
  return st;
}

HixlStatus HixlEngineDisconnect(HixlEngine *e, const char *remote, int32_t timeout_ms) {
  struct sockaddr_in sa;
  HixlStatus st;
  if ((st = api_check_remote(remote, "HixlEngineDisconnect", &sa)) != HIXL_SUCCESS) return st;
  if ((st = api_check_timeout(timeout_ms, "HixlEngineDisconnect")) != HIXL_SUCCESS) return st;
  if ((st = api_enter(e, "HixlEngineDisconnect")) != HIXL_SUCCESS) return st;
  struct peer *p = api_find_peer(e, remote);
  if (!p) {
    st = hixl_fail(HIXL_NOT_CONNECTED, "HixlEngineDisconnect: not connected to %s", remote);
  } else {
    if (p->conn) link_conn_kill(p->conn, HIXL_FAILED, "disconnected by the local engine");
    api_peer_free(e, p);
  }
  pthread_mutex_unlock(&e->lock);
  return st;
}

/* The live link to remote, or NULL with the reason recorded. Lock held. */
struct conn *api_link_for(HixlEngine *e, const char *remote, const char *fn, HixlStatus *st) {
  struct peer *p = api_find_peer(e, remote);
  if (!p) {
    *st = hixl_fail(HIXL_NOT_CONNECTED, "%s: not connected to %s; call HixlEngineConnect first", fn, remote);
    return NULL;
  }
  if (!p->conn) {
    *st = hixl_fail(HIXL_NOT_CONNECTED, "%s: the link to %s was lost (%s); call HixlEngineConnect again", fn,
                    remote, p->broken_why);
    return NULL;
  }
  return p->conn;
}

/* ---- for the HixlCS* layer (engine_ext.h) ---- */

HixlStatus hixl_engine_link_info(HixlEngine *e, const char *remote, struct hixl_link_info *info) {
  HixlStatus st = api_enter(e, "hixl_engine_link_info");
  if (st != HIXL_SUCCESS) return st;
  struct conn *c = api_link_for(e, remote, "hixl_engine_link_info", &st);
  if (c) {
    memset(info, 0, sizeof(*info));
    snprintf(info->transport, sizeof(info->transport), "%s", c->xp->name);
    st = c->xp->link.info(c, info);
  }
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus hixl_engine_drop_peer(HixlEngine *e, const char *remote_name, const char *why, size_t *dropped) {
  CHECK_ARG(remote_name && *remote_name, "hixl_engine_drop_peer: remote_name is NULL or empty");
  HixlStatus st = api_enter(e, "hixl_engine_drop_peer");
  if (st != HIXL_SUCCESS) return st;
  uint64_t deadline = hixl_now_ns() + (uint64_t)HIXL_DEFAULT_TIMEOUT_MS * 1000000u;
  for (int k = 0; k < XPORT_MODS; k++) /* the peer lets go of mapped memory first */
    e->mods[k]->mem.peer_drop(e, remote_name, deadline);
  size_t n = 0;
  uint32_t walk = ++e->walks;
  for (struct conn *c; (c = link_next(e, walk));) {
    bool his = strcmp(c->remote_name, remote_name) == 0 ||
               (c->peer && strcmp(c->peer->remote_name, remote_name) == 0);
    if (c->dead || !his) continue;
    link_conn_kill(c, HIXL_FAILED, why ? why : "dropped by this engine's user");
    n++;
  }
  pthread_mutex_unlock(&e->lock);
  if (dropped) *dropped = n;
  return HIXL_SUCCESS;
}
