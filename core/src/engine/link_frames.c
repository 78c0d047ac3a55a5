/* link_frames: a link's frames: queueing and flushing them, parsing, each role's handling, payloads. */
/* Sending and parsing share this file because they call each other: a flush that
 * empties the queue releases a fenced CALL, which parses on; parsing answers, and sends. */
#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "engine/engine_int.h"
#include "util/log.h"
#include "util/sock.h"

#define LINK_IOV_MAX 256

/* ---- the send queue ---- */

/* The frames tagged but not yet on the wire (a prefix of the queue: tags are made in
 * order, from the head) give their counts back, to be tagged again when they go. */
static void unseal_unsent(struct conn *c) {
  for (struct txitem *it = c->txq_head; it && it->sealed && it->sent == 0; it = it->next) {
    if (it->tag_len) {
      (it->hdr_len ? it->hdr : it->heap)[7] &= (uint8_t) ~(WIRE_F_TAG | WIRE_F_PAYLOAD_TAG);
      c->proof.tx.seq--;
    }
    it->tag_len = it->ptag_len = 0;
    it->sealed = false;
  }
}

/* Drop a chunk of a timed-out request that has not started on the wire. */
static bool drop_if_cancelled(struct conn *c) {
  struct txitem *it = c->txq_head;
  if (!it->chunk || it->sent || !it->chunk->req->cancelled) return false;
  if (it->chunk->dj && it->chunk->dj->running) return false; /* its copier ends it */
  if (it->sealed) unseal_unsent(c);                          /* the next frame out takes its count */
  struct chunk *ch = it->chunk;
  c->txq_head = it->next;
  if (!c->txq_head) c->txq_tail = NULL;
  link_txitem_done(c, it); /* a CALL's frame, what a payload held */
  link_chunk_end(ch, HIXL_TIMEOUT, "request timed out before it was sent");
  return true;
}

/* On an authenticated link, a frame's tag, made as it first goes out: the peer counts
 * frames in the order they leave. */
static void item_seal(struct conn *c, struct txitem *it) {
  it->sealed = true;
  if (!c->proof.on) return;
  uint8_t *h0 = it->hdr_len ? it->hdr : it->heap;
  bool ptag = c->eng->opts.auth_payload_tag && it->payload_len > 0;
  h0[7] =
      (uint8_t)((h0[7] & ~(WIRE_F_TAG | WIRE_F_PAYLOAD_TAG)) | WIRE_F_TAG | (ptag ? WIRE_F_PAYLOAD_TAG : 0));
  auth_seal_frame(&c->proof.tx, it->hdr, it->hdr_len, it->heap, it->heap_len, it->tag);
  it->tag_len = WIRE_TAG_LEN;
  if (!ptag) return;
  auth_data_begin(&c->proof.tx, c->proof.tx.seq - 1);
  if (it->gather)
    for (uint32_t g = 0; g < it->ngather; g++)
      auth_data_add(&c->proof.tx, (const void *)(uintptr_t)it->gather[g].laddr, it->gather[g].len);
  else
    auth_data_add(&c->proof.tx, it->payload, it->payload_len);
  auth_data_end(&c->proof.tx, it->ptag);
  it->ptag_len = WIRE_TAG_LEN;
}

/* Append iovecs for what is left of it (header, heap, tag, then its payload or its
 * gathered ranges, then the payload's tag) from iov[n] on, within budget; returns the new n. */
static int item_iov(const struct txitem *it, struct iovec *iov, int n, size_t budget, size_t *bytes) {
  size_t off = it->sent;
  const struct stage_seg one = {.laddr = (uintptr_t)it->payload, .len = (uint32_t)it->payload_len};
  const struct stage_seg head[3] = {{.laddr = (uintptr_t)it->hdr, .len = it->hdr_len},
                                    {.laddr = (uintptr_t)it->heap, .len = (uint32_t)it->heap_len},
                                    {.laddr = (uintptr_t)it->tag, .len = it->tag_len}};
  const struct stage_seg ptag = {.laddr = (uintptr_t)it->ptag, .len = it->ptag_len};
  const struct stage_seg *parts[3] = {head, it->gather ? it->gather : &one, &ptag};
  uint32_t nparts[3] = {3, it->gather ? it->ngather : 1, 1};
  for (int p = 0; p < 3; p++)
    for (uint32_t g = 0; g < nparts[p] && n < LINK_IOV_MAX && *bytes < budget; g++) {
      size_t len = parts[p][g].len;
      if (off >= len) {
        off -= len;
        continue;
      }
      iov[n].iov_base = (uint8_t *)(uintptr_t)parts[p][g].laddr + off;
      iov[n].iov_len = len - off < budget - *bytes ? len - off : budget - *bytes;
      *bytes += iov[n++].iov_len;
      off = 0;
    }
  return n;
}

static void stall_release(struct conn *c);

/* Send as much of the queue as the socket takes, in gathered writes. */
void link_flush_some(struct conn *c, size_t budget) {
  while (c->txq_head && !c->dead && budget > 0) {
    struct iovec iov[LINK_IOV_MAX];
    int n = 0;
    size_t bytes = 0;
    if (drop_if_cancelled(c)) continue;
    if (c->txq_head->unready) break; /* a device copy fills it: it and what follows wait */
    for (struct txitem *it = c->txq_head; it && !it->unready && n + 5 <= LINK_IOV_MAX && bytes < budget;
         it = it->next) {
      if (!it->sealed) item_seal(c, it);
      n = item_iov(it, iov, n, budget, &bytes);
      if (it->gather) break; /* its ranges may fill the vector: one such item per call */
      if (it->next && it->next->chunk && it->next->chunk->req->cancelled) break;
    }
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t k = sock_sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      char why[128];
      snprintf(why, sizeof(why), "send failed: %s", strerror(errno));
      link_conn_kill(c, HIXL_FAILED, why);
      return;
    }
    size_t done = (size_t)k;
    budget -= done;
    if (c->rail >= 0 && done > 0) c->last_io_ns = hixl_now_ns();
    while (c->txq_head) {
      struct txitem *it = c->txq_head;
      size_t total = it->hdr_len + it->heap_len + it->tag_len + it->payload_len + it->ptag_len;
      size_t take = total - it->sent < done ? total - it->sent : done;
      it->sent += take;
      done -= take;
      if (it->sent < total) break;
      c->txq_head = it->next;
      if (!c->txq_head) c->txq_tail = NULL;
      struct chunk *ch = it->chunk;
      link_txitem_done(c, it);
      if (ch) {
        ch->next_pending = NULL;
        if (c->pend_tail)
          c->pend_tail->next_pending = ch;
        else
          c->pend_head = ch;
        c->pend_tail = ch;
      }
    }
  }
  if (!c->dead) link_set_want_out(c, c->txq_head && !c->txq_head->unready);
  if (!c->dead && (c->stall & (LINK_STALL_FENCE | LINK_STALL_BACKLOG))) stall_release(c);
}

void link_flush(struct conn *c) { link_flush_some(c, SIZE_MAX); }

void link_then_flush(struct hixl_transfer_req *r) {
  r->then_caller = false;
  struct conn *c = r->then_state == THEN_SENT ? link_then_conn(r) : NULL;
  if (!c || c->dead) return; /* not released yet (the progress thread will), or ended with its link */
  link_flush(c); /* outside any completion loop: a send failing kills the link, which ends the CALL */
  if (c->dead) return;
  link_unpark(c); /* the answer needs a reader */
  if (c->txq_head) link_set_want_out(c, true);
}

/* Whether target link c owes its peer more than the bound / div (LinkAnswersMax items,
 * LinkAnswerBytesMax bytes): 1 to stall, 2 to read again (hysteresis). */
static bool link_backlogged(const struct conn *c, uint32_t div) {
  const struct hixl_options *o = &c->eng->opts;
  return c->role == CONN_TARGET &&
         (c->answers_items > o->answers_max / div || c->answers_queued > o->answer_bytes_max / div);
}

/* What was sent may lift a stall: a CALL's fence once everything queued before it is
 * out, the backlog once what the link owes is down to half the bound. Then read on,
 * in a loop rather than by recursion (reading may stall it again, and sending may lift
 * that in turn). */
static void stall_release(struct conn *c) {
  if (c->in_fence) return;
  c->in_fence = true;
  while (!c->dead) {
    uint8_t before = c->stall;
    if ((c->stall & LINK_STALL_FENCE) && !c->txq_head) c->stall &= (uint8_t)~LINK_STALL_FENCE;
    if ((c->stall & LINK_STALL_BACKLOG) && !link_backlogged(c, 2)) c->stall &= (uint8_t)~LINK_STALL_BACKLOG;
    if (c->stall == before) break;
    link_conn_arm(c);
    link_parse_frames(c);
    if (!c->dead && c->txq_head) link_flush_some(c, SIZE_MAX);
  }
  c->in_fence = false;
}

/* Queue a small frame built by one of the wire_put_* helpers. */
int link_queue_small(struct conn *c, const uint8_t *frame, size_t len, const uint8_t *payload,
                     size_t payload_len, struct hixl_mem_reg *reg) {
  struct txitem *it = calloc(1, sizeof(*it));
  if (!it) return -1;
  memcpy(it->hdr, frame, len);
  it->hdr_len = (uint32_t)len;
  it->payload = payload;
  it->payload_len = payload_len;
  it->reg = reg;
  link_enqueue(c, it);
  return 0;
}

static int queue_heap(struct conn *c, uint8_t *frame, size_t len);

void link_queue_copy(struct conn *c, const uint8_t *frame, size_t len) {
  uint8_t *heap = malloc(len);
  if (!heap || queue_heap(c, heap, len) < 0) {
    free(heap);
    link_conn_kill(c, HIXL_FAILED, "out of memory");
    return;
  }
  memcpy(heap, frame, len);
}

static int queue_heap(struct conn *c, uint8_t *frame, size_t len) {
  struct txitem *it = calloc(1, sizeof(*it));
  if (!it) return -1;
  it->heap = frame;
  it->heap_len = len;
  link_enqueue(c, it);
  return 0;
}

void link_then_behind(struct hixl_transfer_req *r, struct conn *c, struct chunk *th, uint16_t service,
                      uint32_t len, uint8_t type, uint64_t after) {
  link_then_init(r, c, th, service, len, THEN_SENT);
  th->seq = c->next_seq++;
  th->tx.heap_len = type == WIRE_CALL_TAG
                        ? wire_put_call_tag(th->tx.heap, th->seq, (uint32_t)after, service, len)
                        : wire_put_call_after(th->tx.heap, th->seq, after, service, len);
  link_enqueue(c, &th->tx);
  /* Alone on the queue (the start sent the data already, or it moves on the QP): out
   * now. Else it leaves behind what is queued, which the progress thread is sending. */
  if (c->txq_head == &th->tx)
    link_flush(c);
  else
    link_set_want_out(c, true);
}

/* Whether target link c tells its peer of r: device memory (kind 1) only to an
 * initiator whose HELLO said it reads the kind byte (WIRE_CAP_DEVMEM); an older one
 * reads that byte as the high byte of the tag's length and refuses the frame. */
static bool mem_told(const struct conn *c, const struct hixl_mem_reg *r) {
  return r->type != HIXL_MEM_DEVICE || (c->hello_caps & WIRE_CAP_DEVMEM);
}

/* Every target link hears of r (a failed send kills its link: the walk goes on). */
void link_broadcast_mem(struct HixlEngine *e, enum wire_type type, const struct hixl_mem_reg *r) {
  uint32_t walk = ++e->walks;
  for (struct conn *c; (c = link_next(e, walk));) {
    if (c->role != CONN_TARGET || !mem_told(c, r)) continue;
    size_t cap = WIRE_HDR_LEN + link_mem_entry_len(r);
    uint8_t *buf = malloc(cap);
    struct wire_wr w;
    if (!buf) continue;
    wire_begin(&w, buf, cap, type);
    wire_put_mem_entry_kind(&w, r->range.addr, r->range.len, link_mem_key(c, r),
                            type == WIRE_MEM_ADD ? r->tag : NULL,
                            r->type == HIXL_MEM_DEVICE ? WIRE_MEM_DEVICE : WIRE_MEM_HOST);
    size_t len = wire_end(&w, 0);
    if (queue_heap(c, buf, len) < 0) {
      free(buf);
      link_conn_kill(c, HIXL_FAILED, "out of memory");
      continue;
    }
    link_flush(c);
  }
}

/* ---- target side ---- */

/* HELLO_ACK: on WIRE_HELLO_OK the engine's caps, name and memory table; a refusal
 * carries its status and nothing else. */
static void send_hello_ack(struct conn *c, uint32_t status) {
  struct HixlEngine *e = c->eng;
  bool ok = status == WIRE_HELLO_OK;
  const char *name = ok || status == WIRE_HELLO_NOT_ME ? e->local_name : ""; /* NOT_ME: who answered */
  size_t cap = WIRE_HDR_LEN + 14 + strlen(name);
  uint32_t told = 0;
  for (size_t i = 0; ok && i < e->regs.count; i++) {
    const struct hixl_mem_reg *r = (const struct hixl_mem_reg *)e->regs.v[i];
    if (!mem_told(c, r)) continue;
    cap += link_mem_entry_len(r);
    told++;
  }
  uint8_t *buf = malloc(cap);
  struct wire_wr w;
  if (!buf) {
    link_conn_kill(c, HIXL_FAILED, "out of memory building HELLO_ACK");
    return;
  }
  wire_begin(&w, buf, cap, WIRE_HELLO_ACK);
  wire_put_u32(&w, status);
  wire_put_u32(&w, ok ? link_caps(e) : 0);
  wire_put_u16(&w, (uint16_t)strlen(name));
  wire_put_bytes(&w, name, strlen(name));
  wire_put_u32(&w, told);
  for (size_t i = 0; ok && i < e->regs.count; i++) {
    const struct hixl_mem_reg *r = (const struct hixl_mem_reg *)e->regs.v[i];
    if (mem_told(c, r))
      wire_put_mem_entry_kind(&w, r->range.addr, r->range.len, link_mem_key(c, r), r->tag,
                              r->type == HIXL_MEM_DEVICE ? WIRE_MEM_DEVICE : WIRE_MEM_HOST);
  }
  size_t len = wire_end(&w, 0);
  if (len == 0 || queue_heap(c, buf, len) < 0) {
    free(buf);
    link_conn_kill(c, HIXL_FAILED, "cannot build HELLO_ACK");
    return;
  }
  link_flush(c);
}

_Thread_local struct HixlEngine *link_serving_engine;

/* One more link refused before it proved anything: whether the log may say so now (at
 * most once a second, whoever reaches the port must not fill the log), with *count the
 * links refused since the last such line, this one included. */
static bool refusal_due(struct HixlEngine *e, unsigned long long *count) {
  uint64_t now = hixl_now_ns();
  e->auth_refusals++;
  if (now - e->auth_logged < 1000000000ull && e->auth_logged != 0) return false;
  *count = (unsigned long long)e->auth_refusals;
  e->auth_refusals = 0;
  e->auth_logged = now;
  return true;
}

/* The log line of a refused link, from its address and claimed name: rate-limited by
 * refusal_due. */
static void refusal_log(struct conn *c, const char *why) {
  unsigned long long n;
  char from[INET_ADDRSTRLEN] = "?";
  if (!refusal_due(c->eng, &n)) return;
  inet_ntop(AF_INET, &c->from, from, sizeof(from));
  log_error("refused a link from %s (calling itself \"%s\"): %s (%llu refused since the last such line)",
            from, c->remote_name, why, n);
}

/* Refuse a handshake: a bare HELLO_ACK (status only), then the link is closed. The
 * log says why, at most once a second, with how many were refused meanwhile. */
static void auth_refuse(struct conn *c, const char *why) {
  refusal_log(c, why);
  c->authed = false;
  auth_wipe(c->auth_expect, sizeof(c->auth_expect));
  auth_wipe(c->session, sizeof(c->session));
  send_hello_ack(c, WIRE_HELLO_AUTH);
  link_conn_kill(c, HIXL_FAILED, why);
}

int link_nonce_hold(struct HixlEngine *e, const uint8_t nonce[32]) {
  int slot = -1;
  pthread_mutex_lock(&e->nonce_lock);
  for (int i = 0; i < ENGINE_NONCES && slot < 0; i++)
    if (!e->nonce_used[i]) {
      memcpy(e->nonces[i], nonce, 32);
      e->nonce_used[i] = true;
      slot = i;
    }
  pthread_mutex_unlock(&e->nonce_lock);
  return slot;
}

void link_nonce_drop(struct HixlEngine *e, int slot) {
  if (slot < 0 || slot >= ENGINE_NONCES) return;
  pthread_mutex_lock(&e->nonce_lock);
  e->nonce_used[slot] = false;
  memset(e->nonces[slot], 0, 32);
  pthread_mutex_unlock(&e->nonce_lock);
}

/* Whether nonce is one of this engine's own handshakes in flight (a reflection). */
static bool nonce_mine(struct HixlEngine *e, const uint8_t *nonce) {
  bool mine = false;
  pthread_mutex_lock(&e->nonce_lock);
  for (int i = 0; i < ENGINE_NONCES && !mine; i++)
    mine = e->nonce_used[i] && memcmp(e->nonces[i], nonce, 32) == 0;
  pthread_mutex_unlock(&e->nonce_lock);
  return mine;
}

/* Whether a (network order) is an address of this host, as link c's peer may have
 * dialled it: the address c came in on, a loopback address when c came in over
 * loopback (to a peer on another host, 127.0.0.1 is its own host: a forwarder there),
 * or an interface's (asked only when it is neither: a peer that dialled what it
 * reached needs no getifaddrs). */
static bool host_addr(const struct conn *c, uint32_t a) {
  struct sockaddr_in in;
  socklen_t sl = sizeof(in);
  uint32_t ifs[256];
  if (getsockname(c->fd, (struct sockaddr *)&in, &sl) != 0) return false;
  if (in.sin_addr.s_addr == a) return true;
  if ((ntohl(a) >> 24) == 127) return (ntohl(in.sin_addr.s_addr) >> 24) == 127;
  int n = sock_if_addrs(ifs, sizeof(ifs) / sizeof(ifs[0]), false);
  for (int i = 0; i < n; i++)
    if (ifs[i] == a) return true;
  return false;
}

/* Whether dialled ("ip:port", n bytes from the wire) names this engine: its listening
 * address (any IP of the host when it listens on 0.0.0.0: not any IP at all, or a relay
 * on another host at the same port would pass), a rail's, or an AuthAliases entry.
 * Channel binding: a relay that passed a handshake meant for it on to this engine is
 * caught here, or by the proofs (the dialled address is in the transcript). */
static bool dialled_is_me(const struct conn *c, const uint8_t *dialled, size_t n) {
  const struct HixlEngine *e = c->eng;
  char text[WIRE_MAX_NAME + 1];
  struct in_addr a;
  if (n == 0 || n > WIRE_MAX_NAME) return false;
  memcpy(text, dialled, n);
  text[n] = '\0';
  char *colon = strrchr(text, ':'), *end = NULL;
  if (!colon) return false;
  *colon = '\0';
  unsigned long port = strtoul(colon + 1, &end, 10);
  if (!colon[1] || *end || port == 0 || port > 65535 || inet_pton(AF_INET, text, &a) != 1) return false;
  const struct sockaddr_in *me = &e->local_addr;
  if (port == ntohs(me->sin_port) && (me->sin_addr.s_addr == a.s_addr ||
                                      (me->sin_addr.s_addr == htonl(INADDR_ANY) && host_addr(c, a.s_addr))))
    return true;
  for (uint32_t i = 0; i < e->n_rail_addrs; i++)
    if (e->rail_addrs[i] == a.s_addr && e->rail_ports[i] == port) return true;
  for (uint32_t i = 0; i < e->opts.alias_n; i++)
    if (e->opts.alias_addr[i] == a.s_addr && e->opts.alias_port[i] == port) return true;
  return false;
}

/* Refuse a keyed HELLO whose dialled address is not this engine's: HELLO_ACK status
 * NOT_ME with this engine's name (what the initiator reached, for its error), then close. */
static void refuse_not_me(struct conn *c, const struct wire_msg *m, bool reflected) {
  struct HixlEngine *e = c->eng;
  char dialled[WIRE_MAX_NAME + 1];
  log_escape(dialled, sizeof(dialled), m->u.hello.dialled, m->u.hello.dialled_len);
  unsigned long long n;
  if (refusal_due(e, &n))
    log_error("refused a link from \"%s\": it dialled %s, %s (%llu refused since the last such line)",
              c->remote_name, dialled,
              reflected
                  ? "and its HELLO is one of this engine's own handshakes reflected back to it (an engine "
                    "never links to itself)"
                  : "which is not one of this engine's names (its own, its rails', AuthAliases): a relay "
                    "or an address translation in between",
              n);
  send_hello_ack(c, WIRE_HELLO_NOT_ME);
  link_conn_kill(c, HIXL_FAILED, "it dialled another address than this engine's");
}

/* HELLO. Without a key the link is served at once. With one, the target picks the
 * first of its keys the initiator also holds, answers AUTH_CHALLENGE with its own
 * proof, and keeps the proof it awaits and the session secret (docs/security.md). */
static void target_hello(struct conn *c, const struct wire_msg *m) {
  struct HixlEngine *e = c->eng;
  struct auth_ring ring;
  const struct auth_key *k = NULL;
  log_escape(c->remote_name, sizeof(c->remote_name), m->u.hello.name, m->u.hello.name_len);
  c->hello_caps = m->u.hello.caps;
  auth_current(&e->auth, &ring); /* no keys (n 0): anyone is served */
  if (ring.n == 0) {
    c->role = CONN_TARGET;
    send_hello_ack(c, WIRE_HELLO_OK);
    log_info("accepted link from %s", c->remote_name);
    return;
  }
  if (!m->u.hello.nonce) {
    auth_wipe(&ring, sizeof(ring));
    auth_refuse(c, "authentication required: the peer offered no key (it has no AuthKeyFile)");
    return;
  }
  if (!(m->u.hello.caps & WIRE_CAP_PROVEN)) {
    auth_wipe(&ring, sizeof(ring));
    auth_refuse(c, "authentication failed: the peer does not prove its frames (an older hixl: this engine "
                   "needs WIRE_CAP_PROVEN on a keyed link)");
    return;
  }
  bool reflected = nonce_mine(e, m->u.hello.nonce);
  if (reflected || !dialled_is_me(c, m->u.hello.dialled, m->u.hello.dialled_len)) {
    auth_wipe(&ring, sizeof(ring));
    refuse_not_me(c, m, reflected);
    return;
  }
  for (unsigned i = 0; i < ring.n && !k; i++)
    for (unsigned j = 0; j < m->u.hello.n_ids && !k; j++)
      if (memcmp(ring.key[i].id, m->u.hello.ids + (size_t)j * WIRE_AUTH_ID, AUTH_ID_LEN) == 0)
        k = &ring.key[i];
  uint8_t nonce_t[AUTH_NONCE_LEN], mac[AUTH_MAC_LEN];
  if (!k) {
    auth_refuse(c, "authentication failed: the peer holds none of this engine's keys");
  } else if (!auth_random(nonce_t, sizeof(nonce_t))) {
    auth_refuse(c, "no random bytes from the kernel for a challenge");
  } else {
    const char *me = e->local_name;
    size_t me_len = strlen(me);
#define TRANSCRIPT(label, out)                                                                               \
  auth_transcript_mac_ext(k, label, m->u.hello.nonce, nonce_t, m->u.hello.name, m->u.hello.name_len, me,     \
                          me_len, m->u.hello.caps, m->u.hello.dialled, m->u.hello.dialled_len,               \
                          m->u.hello.ext, m->u.hello.ext_len, out)
    TRANSCRIPT(AUTH_LABEL_TARGET, mac);
    TRANSCRIPT(AUTH_LABEL_INITIATOR, c->auth_expect);
    TRANSCRIPT(AUTH_LABEL_SESSION, c->session);
#undef TRANSCRIPT
    uint8_t frame[WIRE_HDR_LEN + WIRE_AUTH_CHALLENGE_FIXED + WIRE_MAX_NAME];
    struct wire_wr w;
    wire_begin(&w, frame, sizeof(frame), WIRE_AUTH_CHALLENGE);
    wire_put_bytes(&w, nonce_t, sizeof(nonce_t));
    wire_put_bytes(&w, k->id, AUTH_ID_LEN);
    wire_put_bytes(&w, mac, sizeof(mac));
    wire_put_u16(&w, (uint16_t)me_len);
    wire_put_bytes(&w, me, me_len);
    c->role = CONN_TARGET_AUTH;
    link_queue_copy(c, frame, wire_end(&w, 0));
  }
  auth_wipe(&ring, sizeof(ring));
}

/* AUTH_PROOF: the initiator's proof over the same transcript; the link is served
 * only when it matches (compared in constant time). */
static void target_auth_proof(struct conn *c, const struct wire_msg *m) {
  if (!auth_equal(m->u.auth.mac, c->auth_expect, AUTH_MAC_LEN)) {
    auth_refuse(c, "authentication failed: a wrong proof (another key, or a replayed handshake)");
    return;
  }
  auth_wipe(c->auth_expect, sizeof(c->auth_expect));
  if (!auth_frames_init(&c->proof, c->session, false)) {
    auth_refuse(c, "cannot set up the link's frame proofs (OpenSSL: out of memory)");
    return;
  }
  c->authed = true;
  c->role = CONN_TARGET;
  send_hello_ack(c, WIRE_HELLO_OK); /* the first frame proven */
  log_info("accepted an authenticated link from %s", c->remote_name);
}

/* A CALL: the service's handler answers at once (in order with every other answer on
 * the link); no handler is UNSUPPORTED. A failing handler's answer is its reason. */
static void target_call(struct conn *c, const struct wire_msg *m) {
  struct HixlEngine *e = c->eng;
  uint16_t sv = m->u.call.service;
  uint8_t *frame = malloc(WIRE_CALL_RESP_AT + WIRE_MAX_CALL);
  if (!frame) {
    link_conn_kill(c, HIXL_FAILED, "out of memory");
    return;
  }
  uint8_t *resp = frame + WIRE_CALL_RESP_AT;
  size_t n = 0;
  HixlStatus st;
  if (sv < ENGINE_SERVICES && e->services[sv].fn) {
    link_serving_engine = e; /* a handler may grant and revoke (api_mem.c): the lock is its */
    st = e->services[sv].fn(e->services[sv].ctx, c->remote_name, m->u.call.data, m->u.call.len, resp,
                            WIRE_MAX_CALL, &n);
    link_serving_engine = NULL;
    if (n > WIRE_MAX_CALL) n = 0;
  } else {
    st = HIXL_UNSUPPORTED;
    n = (size_t)snprintf((char *)resp, WIRE_MAX_CALL, "%s offers no service %u", e->local_name, (unsigned)sv);
  }
  link_queue_copy(c, frame, wire_put_call(frame, WIRE_CALL_RESP, m->u.call.seq, st, (uint32_t)n));
  free(frame);
}

/* ---- CALL_TAG: a call served once its data's tag landed (target) ---- */

/* The CALL_TAG a target link waits to serve: one at most, since the link reads no
 * frames meanwhile (LINK_STALL_TAG), so its answers leave in the order the frames came. */
struct tag_park {
  uint64_t seq;
  uint32_t tag, len;
  uint16_t service;
  uint8_t data[];
};

static void tag_kill(struct conn *c, const char *why) {
  log_error("%s: %s", c->remote_name, why);
  link_conn_kill(c, HIXL_FAILED, why);
}

/* Tags come in the order they were posted, as the CALL_TAGs naming them do: a call is
 * served at once when its tag has landed, else it waits, and so does the link. */
static void target_call_tag(struct conn *c, const struct wire_msg *m) {
  uint32_t tag = (uint32_t)m->u.call.after;
  char why[192];
  if (!(c->xp->flags & XPORT_TAGS)) {
    snprintf(why, sizeof(why), "protocol error: CALL_TAG on a %s link, which carries no tags: closing it",
             c->xp->name);
    tag_kill(c, why);
    return;
  }
  if (tag != c->tags_called + 1) {
    snprintf(why, sizeof(why), "protocol error: CALL_TAG with tag %u where %u was due: closing this link",
             tag, c->tags_called + 1);
    tag_kill(c, why);
    return;
  }
  c->tags_called = tag;
  if ((int32_t)(c->tags_landed - tag) >= 0) { /* its data's tag came first */
    target_call(c, m);
    return;
  }
  struct tag_park *t = malloc(sizeof(*t) + m->u.call.len);
  if (!t) {
    link_conn_kill(c, HIXL_FAILED, "out of memory");
    return;
  }
  *t =
      (struct tag_park){.seq = m->u.call.seq, .tag = tag, .len = m->u.call.len, .service = m->u.call.service};
  if (m->u.call.len) memcpy(t->data, m->u.call.data, m->u.call.len);
  c->tag_park = t;
  c->stall |= LINK_STALL_TAG;
  link_conn_arm(c);
}

void link_tag_landed(struct conn *c, uint32_t tag) {
  char why[192];
  if (c->dead) return;
  if (tag != c->tags_landed + 1 || (uint32_t)(tag - c->tags_called) > LINK_TAGS_AHEAD) {
    snprintf(
        why, sizeof(why),
        "protocol error: data tag %u where %u was due, %u calls named so far (at most %u ahead): closing "
        "this link",
        tag, c->tags_landed + 1, c->tags_called, LINK_TAGS_AHEAD);
    tag_kill(c, why);
    return;
  }
  c->tags_landed = tag;
  struct tag_park *t = c->tag_park;
  if (!t || t->tag != tag) return;
  struct wire_msg m = {.hdr = {.type = WIRE_CALL_TAG}};
  m.u.call.seq = t->seq;
  m.u.call.after = t->tag;
  m.u.call.service = t->service;
  m.u.call.data = t->data;
  m.u.call.len = t->len;
  c->tag_park = NULL;
  target_call(c, &m);
  free(t);
  if (c->dead) return;
  c->stall &= (uint8_t)~LINK_STALL_TAG; /* the frames behind it, as link_resume reads them */
  link_conn_arm(c);
  link_parse_frames(c);
  if (!c->dead) link_flush(c);
}

static void target_handle(struct conn *c, const struct wire_msg *m) {
  struct HixlEngine *e = c->eng;
  uint8_t frame[WIRE_SMALL_FRAME];
  switch (m->hdr.type) {
  case WIRE_HELLO: target_hello(c, m); return;
  case WIRE_AUTH_PROOF: target_auth_proof(c, m); return;
  case WIRE_SYNC: {
    size_t len = wire_put_ack(frame, WIRE_SYNC_ACK, m->u.ack.seq, HIXL_SUCCESS, 0);
    if (link_queue_small(c, frame, len, NULL, 0, NULL) < 0) link_conn_kill(c, HIXL_FAILED, "out of memory");
    return;
  }
  case WIRE_CALL: target_call(c, m); return;
  case WIRE_CALL_TAG: target_call_tag(c, m); return;
  case WIRE_RAILS: {
    uint8_t ack[WIRE_HDR_LEN + 12 + WIRE_RAIL_LEN * WIRE_MAX_RAILS];
    uint32_t addr[WIRE_MAX_RAILS];
    uint32_t n = e->n_rail_addrs;
    for (uint32_t i = 0; i < n; i++) addr[i] = ntohl(e->rail_addrs[i]);
    size_t len = wire_put_rails_ack(ack, sizeof(ack), m->u.rails.seq, addr, e->rail_ports, n);
    if (len == 0)
      link_conn_kill(c, HIXL_FAILED, "RAILS asked of an engine without rails");
    else
      link_queue_copy(c, ack, len);
    return;
  }
  case WIRE_CALL_AFTER:
    /* Every WRITE before it has landed or been refused (one ordered stream): served
     * only if none from its first on was refused. */
    if (c->write_refused >= m->u.call.after) {
      uint8_t resp[WIRE_CALL_RESP_AT + 160];
      int n = snprintf((char *)resp + WIRE_CALL_RESP_AT, 160,
                       "a WRITE it followed (seq %llu) was refused: the call was not served",
                       (unsigned long long)c->write_refused);
      link_queue_copy(c, resp, wire_put_call(resp, WIRE_CALL_RESP, m->u.call.seq, HIXL_FAILED, (uint32_t)n));
      return;
    }
    target_call(c, m);
    return;
  case WIRE_NOTIFY: {
    uint32_t st = HIXL_SUCCESS;
    if (c->notify_gen != e->notify_gen) { /* drained since this link's last */
      c->notify_gen = e->notify_gen;
      c->notify_held = 0;
    }
    if (e->n_notifies >= HIXL_MAX_NOTIFY_QUEUE || c->notify_held >= HIXL_MAX_NOTIFY_PER_LINK) {
      st = HIXL_NOTIFY_FAILED;
    } else {
      if (e->n_notifies == e->cap_notifies) {
        size_t cap = e->cap_notifies ? e->cap_notifies * 2 : 16;
        struct notify_item *nv = realloc(e->notifies, cap * sizeof(*nv));
        if (nv) {
          e->notifies = nv;
          e->cap_notifies = cap;
        }
      }
      struct notify_item *it = e->n_notifies < e->cap_notifies ? &e->notifies[e->n_notifies] : NULL;
      if (it) {
        it->name = strndup((const char *)m->u.notify.name, m->u.notify.name_len);
        it->msg = strndup((const char *)m->u.notify.msg, m->u.notify.msg_len);
        it->remote = strdup(c->remote_name);
      }
      if (it && it->name && it->msg && it->remote) {
        e->n_notifies++;
        c->notify_held++;
      } else {
        if (it) {
          free(it->name);
          free(it->msg);
          free(it->remote);
        }
        st = HIXL_NOTIFY_FAILED;
      }
    }
    size_t len = wire_put_ack(frame, WIRE_NOTIFY_ACK, m->u.notify.seq, st, 0);
    if (link_queue_small(c, frame, len, NULL, 0, NULL) < 0) link_conn_kill(c, HIXL_FAILED, "out of memory");
    return;
  }
  default: {
    const struct xport_ops *x = e->frame_owner[m->hdr.type]; /* type_allowed: there is one */
    if (x) x->link.target_frame(c, m);
    return;
  }
  }
}

void link_pay_single(struct conn *c, uint8_t *dst, size_t len) {
  c->pay_dst = dst;
  c->pay_left = c->pay_cur = c->pay_last = len;
  c->pay_span = NULL;
  c->pay_nspan = 0;
  c->pay_discard = dst == NULL;
}

void link_pay_spans(struct conn *c, const struct stage_seg *s, uint32_t n, bool remote, size_t len,
                    bool discard) {
  c->pay_left = c->pay_last = len;
  c->pay_cur = s[0].len;
  c->pay_span_remote = remote;
  c->pay_discard = discard;
  c->pay_dst = discard ? NULL : (uint8_t *)(uintptr_t)(remote ? s[0].raddr : s[0].laddr);
  c->pay_span = s + 1;
  c->pay_nspan = n - 1;
}

static void payload_done(struct conn *c);

/* k bytes of the current destination arrived: move on, to the next span or the end
 * (a tagged payload's end waits for its tag: link_parse_frames). */
void link_payload_advance(struct conn *c, size_t k) {
  c->pay_left -= k;
  c->pay_cur -= k;
  if (c->pay_dst) c->pay_dst += k;
  if (c->pay_left == 0) {
    if (c->pay_tagged)
      c->pay_tag_due = true;
    else
      payload_done(c);
    return;
  }
  if (c->pay_cur > 0) return;
  if (c->pay_nspan == 0) { /* spans shorter than the payload: cannot happen (lengths checked) */
    c->pay_cur = c->pay_left;
    c->pay_dst = NULL;
    c->pay_discard = true;
    return;
  }
  const struct stage_seg *s = c->pay_span++;
  c->pay_nspan--;
  c->pay_cur = s->len;
  c->pay_dst = c->pay_discard ? NULL : (uint8_t *)(uintptr_t)(c->pay_span_remote ? s->raddr : s->laddr);
}

/* ---- initiator side ---- */

/* A CALL's answer: its bytes into the caller's buffer (unless it gave up), or a failure
 * whose reason is the peer's text, shown printable. */
static void call_answered(struct conn *c, struct chunk *ch, const struct wire_msg *m) {
  uint32_t st = m->u.call.status, n = m->u.call.len;
  char why[1024];
  if (st == HIXL_SUCCESS && n > ch->len) {
    snprintf(why, sizeof(why), "%s answered %u bytes; at most %u were expected", c->remote_name, n, ch->len);
    link_chunk_end(ch, HIXL_FAILED, why);
  } else if (st == HIXL_SUCCESS) {
    if (!ch->req->cancelled) {
      if (n) memcpy(ch->laddr, m->u.call.data, n);
      *ch->call_len = n;
    }
    link_chunk_end(ch, HIXL_SUCCESS, "");
  } else {
    char text[200];
    size_t k = n < sizeof(text) - 1 ? n : sizeof(text) - 1;
    for (size_t i = 0; i < k; i++) {
      uint8_t b = m->u.call.data[i];
      text[i] = b >= 0x20 && b < 0x7f ? (char)b : '?';
    }
    text[k] = '\0';
    /* Only a status hixl knows is passed on; anything else is FAILED. */
    bool known = strcmp(HixlStatusName(st), "HIXL_UNKNOWN_STATUS") != 0;
    snprintf(why, sizeof(why), "%s answered %s: %s", c->remote_name, known ? HixlStatusName(st) : "?", text);
    link_chunk_end(ch, known ? (HixlStatus)st : HIXL_FAILED, why);
  }
}

static void initiator_handle(struct conn *c, const struct wire_msg *m) {
  struct peer *p = c->peer;
  const struct xport_ops *owner = c->eng->init_owner[m->hdr.type];
  if (owner) {
    owner->link.initiator_frame(c, m);
    return;
  }
  if (m->hdr.type == WIRE_MEM_ADD || m->hdr.type == WIRE_MEM_DEL) {
    if (!p) return;
    /* Each rail's link changes its own table: rails are read in no set order, and one
     * rail's MEM_DEL read after another's MEM_DEL and MEM_ADD of the same range (registered
     * again) removed the new entry, and with it the other rail's key. */
    struct memtab *t = link_rtab(c);
    if (m->hdr.type == WIRE_MEM_ADD) {
      if (t->count >= LINK_PEER_MEM_MAX && !memtab_find_exact(t, m->u.mem.addr, m->u.mem.len)) {
        char why[320];
        snprintf(why, sizeof(why), "%s advertised more than %u registrations (LINK_PEER_MEM_MAX)",
                 c->remote_name, LINK_PEER_MEM_MAX);
        link_conn_kill(c, HIXL_FAILED, why);
        return;
      }
      link_peer_add_mem(p, &m->u.mem, c->rail);
      c->xp->link.mem_added(c, m->u.mem.addr, m->u.mem.len);
    } else {
      link_peer_del_mem(p, m->u.mem.addr, m->u.mem.len, c->rail);
    }
    return;
  }
  struct chunk *ch = c->pend_head;
  static const enum wire_type expect[] = {
      [CHUNK_WRITE] = WIRE_WRITE_ACK, [CHUNK_READ] = WIRE_READ_RESP,   [CHUNK_NOTIFY] = WIRE_NOTIFY_ACK,
      [CHUNK_SYNC] = WIRE_SYNC_ACK,   [CHUNK_SWRITE] = WIRE_WRITE_ACK, [CHUNK_SREAD] = WIRE_READ_RESP,
      [CHUNK_CALL] = WIRE_CALL_RESP};
  if (!ch || m->u.ack.seq != ch->seq || m->hdr.type != (ch->answer ? ch->answer : expect[ch->kind]) ||
      (m->hdr.type == WIRE_READ_RESP && m->u.ack.status == HIXL_SUCCESS && m->hdr.payload_len != ch->len)) {
    char why[192];
    snprintf(why, sizeof(why), "protocol error: unexpected %s seq %llu", wire_type_name(m->hdr.type),
             (unsigned long long)m->u.ack.seq);
    link_conn_kill(c, HIXL_FAILED, why);
    return;
  }
  c->pend_head = ch->next_pending;
  if (!c->pend_head) c->pend_tail = NULL;
  link_chunk_moved(c, ch);
  if (m->hdr.type == WIRE_CALL_RESP) {
    call_answered(c, ch, m);
    return;
  }
  if (ch->owner && ch->owner->link.answer(c, ch, m)) return; /* its data, its refusal (staged units) */
  if (m->hdr.type == WIRE_READ_RESP && m->hdr.payload_len > 0) {
    c->pay_chunk = ch;
    uint8_t *dst = ch->req->cancelled ? NULL : ch->laddr;
    if (dst && ch->bounce) dst = ch->bounce; /* device memory: into its pool buffer, copied in after */
    ch->landing = dst && dst == ch->bounce;  /* its bounce stays until then (api_xfer.c) */
    link_pay_single(c, dst, m->hdr.payload_len);
    return;
  }
  if (m->u.ack.status == HIXL_SUCCESS) {
    link_chunk_end(ch, HIXL_SUCCESS, "");
    return;
  }
  char why[512];
  if (ch->kind == CHUNK_NOTIFY)
    snprintf(why, sizeof(why), "%s refused the notification (%s; %d undrained at most, %d from one link)",
             c->remote_name, HixlStatusName(m->u.ack.status), HIXL_MAX_NOTIFY_QUEUE,
             HIXL_MAX_NOTIFY_PER_LINK);
  else
    snprintf(why, sizeof(why), "%s refused %s of remote [0x%llx, +%u): not inside memory registered there",
             c->remote_name, ch->kind == CHUNK_READ ? "READ" : "WRITE", (unsigned long long)ch->raddr,
             ch->len);
  link_chunk_end(ch,
                 m->u.ack.status == HIXL_NOTIFY_FAILED || m->u.ack.status == HIXL_RESOURCE_EXHAUSTED
                     ? (HixlStatus)m->u.ack.status
                     : HIXL_FAILED,
                 why);
}

static void payload_done(struct conn *c) {
  if (c->role == CONN_INITIATOR) {
    struct chunk *ch = c->pay_chunk;
    char why[384];
    why[0] = '\0';
    c->pay_chunk = NULL;
    if (!ch) return; /* its chunk ended first: the data was dropped */
    ch->landing = false;
    if (ch->bounce && !ch->req->cancelled) { /* a READ into device memory: copied in by the devq */
      link_devq_land(c, ch);
      return;
    }
    link_chunk_end(ch, HIXL_SUCCESS, why);
  } else {
    const struct xport_ops *x = c->pay_module;
    c->pay_module = NULL;
    if (x) x->link.payload_done(c);
  }
}

void link_payload_land(struct conn *c, const uint8_t *src, size_t k) {
  if (c->pay_tagged) auth_data_add(&c->proof.rx, src, k);
  link_payload_advance(c, k);
}

/* Take payload bytes from buf into the current destination. */
void link_payload_take(struct conn *c, const uint8_t *buf, size_t n) {
  while (n > 0 && c->pay_left > 0) {
    size_t k = n < c->pay_cur ? n : c->pay_cur;
    if (c->pay_dst) memcpy(c->pay_dst, buf, k);
    link_payload_land(c, buf, k);
    buf += k;
    n -= k;
  }
}

/* A tagged payload has all come: its tag, the next 16 bytes, is checked before the
 * payload counts as received (payload_done). false: not all here yet, or the link ended. */
static bool payload_tag_check(struct conn *c) {
  uint8_t want[WIRE_TAG_LEN];
  if (c->rx_end - c->rx_start < WIRE_TAG_LEN) return false;
  auth_data_end(&c->proof.rx, want);
  bool ok = CRYPTO_memcmp(want, c->rxbuf + c->rx_start, WIRE_TAG_LEN) == 0;
  c->rx_start += WIRE_TAG_LEN;
  c->pay_tag_due = c->pay_tagged = false;
  if (!ok) {
    char why[160];
    snprintf(why, sizeof(why),
             "the payload of frame %llu failed its proof: altered on the way: closing this link",
             (unsigned long long)c->proof.rx.seq);
    log_error("%s: %s", c->remote_name, why);
    link_conn_kill(c, HIXL_FAILED, why);
    return false;
  }
  payload_done(c);
  return !c->dead;
}

/* Which frame types each role accepts; anything else is a protocol error. */
static bool type_allowed(const struct HixlEngine *e, enum conn_role role, unsigned type) {
  switch (role) {
  case CONN_TARGET_HELLO: return type == WIRE_HELLO;
  case CONN_TARGET_AUTH: return type == WIRE_AUTH_PROOF;
  case CONN_TARGET:
    return type == WIRE_NOTIFY || type == WIRE_SYNC || type == WIRE_CALL || type == WIRE_CALL_AFTER ||
           type == WIRE_CALL_TAG || (type == WIRE_RAILS && e->n_rail_addrs > 0) ||
           (type <= WIRE_TYPE_MAX_ && e->frame_owner[type] != NULL);
  case CONN_INITIATOR:
    return type == WIRE_WRITE_ACK || type == WIRE_READ_RESP || type == WIRE_NOTIFY_ACK ||
           type == WIRE_SYNC_ACK || type == WIRE_MEM_ADD || type == WIRE_MEM_DEL || type == WIRE_CALL_RESP ||
           (type <= WIRE_TYPE_MAX_ && e->init_owner[type] != NULL);
  }
  return false;
}

/* A frame that ends link c: logged and the link killed. A peer still handshaking (it
 * proved no key yet: without one it is anyone who reaches the port) is logged as a
 * refused handshake is, once a second at most with the count. */
static void frame_refuse(struct conn *c, const char *why) {
  if (c->role == CONN_TARGET_HELLO || c->role == CONN_TARGET_AUTH)
    refusal_log(c, why);
  else
    log_error("%s: %s", c->remote_name[0] ? c->remote_name : "handshaking peer", why);
  link_conn_kill(c, HIXL_FAILED, why);
}

/* Parse and act on every whole frame in the receive buffer. */
void link_parse_frames(struct conn *c) {
  while (!c->dead && c->pay_left == 0 && !c->stall) {
    if (c->pay_tag_due && !payload_tag_check(c)) return;
    size_t avail = c->rx_end - c->rx_start;
    uint8_t *p = c->rxbuf + c->rx_start;
    struct wire_hdr h;
    struct wire_msg m;
    if (avail < WIRE_HDR_LEN) return;
    enum wire_err err = wire_parse_hdr(p, &h);
    if (err == WIRE_EVERSION && c->role == CONN_TARGET_HELLO && h.type == WIRE_HELLO) {
      char why[96];
      snprintf(why, sizeof(why),
               "it speaks hixl protocol version %u, this engine %u (protocol version mismatch)", h.version,
               WIRE_VERSION);
      send_hello_ack(c, WIRE_HELLO_VERSION);
      frame_refuse(c, why);
      return;
    }
    if (err == WIRE_OK && !type_allowed(c->eng, c->role, h.type)) {
      char why[160];
      snprintf(why, sizeof(why), "protocol error: %s is not allowed on %s link: closing this link",
               wire_type_name(h.type),
               c->role == CONN_INITIATOR ? "an initiator"
               : c->role == CONN_TARGET  ? "a target"
                                         : "a handshaking");
      frame_refuse(c, why);
      return;
    }
    if (err != WIRE_OK) {
      char why[160];
      snprintf(why, sizeof(why), "malformed frame (%s, type %s): closing this link", wire_err_str(err),
               wire_type_name(h.type));
      frame_refuse(c, why);
      return;
    }
    size_t tag = c->proof.on ? WIRE_TAG_LEN : 0;
    if ((h.flags & WIRE_F_TAG) != (tag ? WIRE_F_TAG : 0u)) {
      char why[192];
      snprintf(why, sizeof(why), "%s %s on %s link: closing this link", tag ? "an unproven" : "a proven",
               wire_type_name(h.type), tag ? "an authenticated" : "a link that was not authenticated");
      frame_refuse(c, why);
      return;
    }
    if (avail < WIRE_HDR_LEN + h.body_len + tag) return; /* body not here yet; fits ENGINE_RXBUF */
    /* A CALL is served once every answer queued before it on this link has been sent:
     * a handler that lets memory go (the plugin's FREE) knows no earlier answer still
     * reads it. The link reads nothing more until then (stall_release). */
    if ((h.type == WIRE_CALL || h.type == WIRE_CALL_AFTER || h.type == WIRE_CALL_TAG) &&
        c->role == CONN_TARGET && c->txq_head) {
      c->stall |= LINK_STALL_FENCE;
      link_conn_arm(c);
      return;
    }
    if (tag && !auth_check_frame(&c->proof.rx, p, WIRE_HDR_LEN + h.body_len, NULL, 0,
                                 p + WIRE_HDR_LEN + h.body_len)) {
      char why[192];
      snprintf(why, sizeof(why),
               "%s (frame %llu from it) failed its proof: inserted, replayed, reordered, dropped or altered "
               "on the "
               "way: closing this link",
               wire_type_name(h.type), (unsigned long long)c->proof.rx.seq);
      frame_refuse(c, why);
      return;
    }
    if (tag && h.payload_len > 0 && c->eng->opts.auth_payload_tag && !(h.flags & WIRE_F_PAYLOAD_TAG)) {
      char why[192];
      snprintf(why, sizeof(why),
               "its %s's payload carries no tag, and this engine requires tagged payloads (AuthPayloadTag on "
               "both ends): closing this link",
               wire_type_name(h.type));
      log_error("%s: %s", c->remote_name, why);
      link_conn_kill(c, HIXL_FAILED, why);
      return;
    }
    err = wire_decode(&h, p + WIRE_HDR_LEN, &m);
    if (err != WIRE_OK) {
      char why[160];
      snprintf(why, sizeof(why), "malformed %s body (%s): closing this link", wire_type_name(h.type),
               wire_err_str(err));
      frame_refuse(c, why);
      return;
    }
    c->rx_start += WIRE_HDR_LEN + h.body_len + tag;
    if (c->role == CONN_INITIATOR)
      initiator_handle(c, &m);
    else
      target_handle(c, &m);
    if (c->dead) return;
    if (h.flags & WIRE_F_PAYLOAD_TAG) { /* its bytes go into the tag as they land */
      c->pay_tagged = true;
      auth_data_begin(&c->proof.rx, c->proof.rx.seq - 1);
    }
    if (link_backlogged(c, 1)) { /* a peer that does not read its answers reads no more of ours */
      c->stall |= LINK_STALL_BACKLOG;
      link_conn_arm(c);
    }
    if (c->pay_left > 0) {
      size_t have = c->rx_end - c->rx_start;
      size_t n = have < c->pay_left ? have : c->pay_left;
      c->rx_start += n;
      link_payload_take(c, c->rxbuf + c->rx_start - n, n);
    }
  }
}
