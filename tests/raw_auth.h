/* raw_auth: a test's raw peer: a socket to an engine, its I/O, and the initiator's
 * side of the HELLO handshake, spoken over it: honestly (it holds the key) or as a hostile peer would (a
 * wrong proof, a recorded proof replayed, a claimed name). Uses the engine's own wire and auth code (white
 * box), and the caller's send_all / recv_all. */
#ifndef HIXL_TEST_RAW_AUTH_H
#define HIXL_TEST_RAW_AUTH_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include "util/auth.h"
#include "util/be.h"
#include "util/sock.h"
#include "wire/wire.h"

/* A blocking socket to 127.0.0.1:port with 5 s timeouts, or -1. */
static inline int raw_dial(uint16_t port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  struct timeval tv = {.tv_sec = 5};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Socket I/O that tells ThreadSanitizer the order the stream gives, as the engine's
 * own does (sock.h). */
static inline bool raw_send_all(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    struct iovec iov = {(void *)b, n};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    ssize_t k = sock_sendmsg(fd, &mh, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= (size_t)k;
  }
  return true;
}

static inline bool raw_recv_all(int fd, void *p, size_t n) {
  uint8_t *b = p;
  while (n > 0) {
    ssize_t k = recv(fd, b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    sock_hb_received(fd);
    b += k;
    n -= (size_t)k;
  }
  return true;
}

/* True when the peer closes fd (EOF or reset) within the receive timeout, having sent
 * nothing more. */
static inline bool raw_closed_silent(int fd) {
  uint8_t b[64];
  ssize_t k = recv(fd, b, sizeof(b), 0);
  return k == 0 || (k < 0 && errno == ECONNRESET);
}

/* Read and drop n bytes (a payload nobody looks at). */
static inline bool raw_drain(int fd, uint32_t n) {
  uint8_t sink[4096];
  for (uint32_t left = n; left > 0;) {
    uint32_t k = left < sizeof(sink) ? left : (uint32_t)sizeof(sink);
    if (!raw_recv_all(fd, sink, k)) return false;
    left -= k;
  }
  return true;
}

/* One frame: its header into *h (and its bytes into hdr, when not NULL), its body into
 * body (cap bytes at most), its payload read and dropped. */
static inline bool raw_recv_frame(int fd, struct wire_hdr *h, uint8_t *hdr, uint8_t *body, size_t cap) {
  uint8_t hb[WIRE_HDR_LEN];
  if (!hdr) hdr = hb;
  if (!raw_recv_all(fd, hdr, WIRE_HDR_LEN) || wire_parse_hdr(hdr, h) != WIRE_OK || h->body_len > cap ||
      !raw_recv_all(fd, body, h->body_len))
    return false;
  return raw_drain(fd, h->payload_len);
}

typedef bool (*raw_send_fn)(int fd, const void *buf, size_t n);
typedef bool (*raw_recv_fn)(int fd, void *buf, size_t n);

struct raw_auth {
  const char *key_hex;   /* the key the raw peer holds; NULL: it sends a plain HELLO */
  const char *name;      /* the name it claims */
  bool bad_proof;        /* send a proof with one bit flipped */
  const uint8_t *replay; /* send these WIRE_AUTH_MAC bytes as the proof, whatever the challenge */
  const uint8_t *nonce;  /* use this nonce (NULL: a fresh one) */
  const char *dialled;   /* the address it says it dialled (NULL: the fd's peer, as "ip:port") */
  bool unproven;         /* offer no WIRE_CAP_PROVEN (an older hixl: its frames carry no tags) */
  const uint8_t *ext;    /* HELLO extension bytes to append as they are (entries, or not) */
  uint16_t ext_len;
  bool ext_unproven;          /* leave them out of its proof (as if a relay had added them) */
  struct auth_frames *frames; /* where to keep the link's frame tags once proven (NULL: not kept) */
  uint8_t proof[32];          /* out: the proof it sent */
  uint8_t session[32];        /* out: the session secret, when the target's proof checked */
  bool target_proved;         /* out: the target's AUTH_CHALLENGE carried a valid proof */
  bool challenged;            /* out: an AUTH_CHALLENGE came */
  uint32_t status;            /* out: HELLO_ACK's status */
  uint32_t ack_caps;          /* out: ... its caps */
  uint32_t ack_count;         /* out: ... and how many memory entries it listed */
  uint16_t ack_name_len;      /* out: ... and its name's length */
  bool ack_tagged;            /* out: ... it carried a tag */
  bool ack_proven;            /* out: ... and the tag checked */
};

/* Run the handshake on fd; true when a HELLO_ACK came back (a refusal included). */
static inline bool raw_auth_hello(int fd, struct raw_auth *a, raw_send_fn send_fn, raw_recv_fn recv_fn) {
  uint8_t buf[8192], nonce[AUTH_NONCE_LEN];
  struct auth_ring ring = {.n = 0};
  struct wire_hdr h;
  struct wire_msg m;
  struct auth_frames fr = {0};
  uint32_t caps = WIRE_CAP_TCP_DATA | (a->key_hex && !a->unproven ? WIRE_CAP_PROVEN : 0u);
  size_t len;
  char dialled[64];
  if (a->dialled) {
    snprintf(dialled, sizeof(dialled), "%s", a->dialled);
  } else {
    struct sockaddr_in peer;
    socklen_t pl = sizeof(peer);
    char ip[INET_ADDRSTRLEN] = "0.0.0.0";
    if (getpeername(fd, (struct sockaddr *)&peer, &pl) == 0)
      inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof(ip));
    snprintf(dialled, sizeof(dialled), "%s:%u", ip, (unsigned)ntohs(peer.sin_port));
  }
  if (a->key_hex) {
    char text[256];
    char why[128];
    snprintf(text, sizeof(text), "%s\n", a->key_hex);
    if (!auth_parse(text, &ring, why, sizeof(why))) return false;
    if (a->nonce)
      memcpy(nonce, a->nonce, sizeof(nonce));
    else
      auth_random(nonce, sizeof(nonce));
    len = wire_put_hello_auth(buf, sizeof(buf), caps, a->name, nonce, ring.key[0].id, 1, dialled);
  } else {
    len = wire_put_hello(buf, sizeof(buf), WIRE_CAP_TCP_DATA, a->name);
  }
  if (a->ext_len) { /* appended after the fields, the body's length put right */
    memcpy(buf + len, a->ext, a->ext_len);
    be_put32(buf + 8, (uint32_t)(len - WIRE_HDR_LEN + a->ext_len));
    len += a->ext_len;
  }
  if (!send_fn(fd, buf, len)) return false;
  for (;;) {
    if (!recv_fn(fd, buf, WIRE_HDR_LEN) || wire_parse_hdr(buf, &h) != WIRE_OK ||
        h.body_len > sizeof(buf) - WIRE_HDR_LEN || !recv_fn(fd, buf + WIRE_HDR_LEN, h.body_len) ||
        wire_decode(&h, buf + WIRE_HDR_LEN, &m) != WIRE_OK)
      break;
    if (h.type == WIRE_HELLO_ACK) {
      uint8_t tag[AUTH_TAG_LEN];
      a->ack_tagged = (h.flags & WIRE_F_TAG) != 0;
      if (a->ack_tagged && !recv_fn(fd, tag, sizeof(tag))) break;
      a->ack_proven =
          a->ack_tagged && fr.on && auth_check_frame(&fr.rx, buf, WIRE_HDR_LEN + h.body_len, NULL, 0, tag);
      if (a->frames && a->ack_proven) auth_frames_move(a->frames, &fr);
      auth_frames_free(&fr);
      a->status = m.u.hello_ack.status;
      a->ack_caps = m.u.hello_ack.caps;
      a->ack_count = m.u.hello_ack.count;
      a->ack_name_len = m.u.hello_ack.name_len;
      return true;
    }
    if (h.type != WIRE_AUTH_CHALLENGE || !a->key_hex) break;
    a->challenged = true;
    const struct auth_key *k = &ring.key[0];
    uint8_t mac[AUTH_MAC_LEN];
    size_t nl = strlen(a->name);
    const uint8_t *ext = a->ext_unproven ? NULL : a->ext;
    size_t ext_len = a->ext_unproven ? 0 : a->ext_len;
    auth_transcript_mac_ext(k, AUTH_LABEL_TARGET, nonce, m.u.auth.nonce, a->name, nl, m.u.auth.name,
                            m.u.auth.name_len, caps | WIRE_CAP_AUTH, dialled, strlen(dialled), ext, ext_len,
                            mac);
    a->target_proved = auth_equal(mac, m.u.auth.mac, AUTH_MAC_LEN);
    auth_transcript_mac_ext(k, AUTH_LABEL_INITIATOR, nonce, m.u.auth.nonce, a->name, nl, m.u.auth.name,
                            m.u.auth.name_len, caps | WIRE_CAP_AUTH, dialled, strlen(dialled), ext, ext_len,
                            a->proof);
    auth_transcript_mac_ext(k, AUTH_LABEL_SESSION, nonce, m.u.auth.nonce, a->name, nl, m.u.auth.name,
                            m.u.auth.name_len, caps | WIRE_CAP_AUTH, dialled, strlen(dialled), ext, ext_len,
                            a->session);
    if (a->replay) memcpy(a->proof, a->replay, AUTH_MAC_LEN);
    if (a->bad_proof) a->proof[0] ^= 1;
    struct wire_wr w;
    uint8_t frame[WIRE_HDR_LEN + WIRE_AUTH_MAC];
    wire_begin(&w, frame, sizeof(frame), WIRE_AUTH_PROOF);
    wire_put_bytes(&w, a->proof, AUTH_MAC_LEN);
    if (!send_fn(fd, frame, wire_end(&w, 0))) break;
    if (!a->unproven && !auth_frames_init(&fr, a->session, true)) break; /* tags from here on */
  }
  auth_frames_free(&fr);
  return false;
}

/* Receive one frame as raw_recv_frame does, its tag checked under f when it carries
 * one (a frame with no tag where f is on, or a wrong tag: false). */
static inline bool raw_recv_proven(int fd, struct auth_frames *f, struct wire_hdr *h, uint8_t *hdr,
                                   uint8_t *body, size_t cap) {
  uint8_t tag[AUTH_TAG_LEN];
  if (!raw_recv_all(fd, hdr, WIRE_HDR_LEN) || wire_parse_hdr(hdr, h) != WIRE_OK || h->body_len > cap ||
      (body != hdr + WIRE_HDR_LEN) || !raw_recv_all(fd, body, h->body_len))
    return false;
  bool tagged = (h->flags & WIRE_F_TAG) != 0;
  if (tagged != f->on ||
      (tagged && (!raw_recv_all(fd, tag, sizeof(tag)) ||
                  !auth_check_frame(&f->rx, hdr, WIRE_HDR_LEN + h->body_len, NULL, 0, tag))))
    return false;
  return raw_drain(fd, h->payload_len);
}

/* Send a built frame (len bytes, its header's flags set here) tagged under f, then
 * payload (plen bytes, may be 0): as a proven peer does. */
static inline bool raw_send_proven(int fd, struct auth_frames *f, uint8_t *frame, size_t len,
                                   const void *payload, size_t plen) {
  uint8_t tag[AUTH_TAG_LEN];
  frame[7] |= WIRE_F_TAG;
  auth_seal_frame(&f->tx, frame, len, NULL, 0, tag);
  return raw_send_all(fd, frame, len) && raw_send_all(fd, tag, sizeof(tag)) &&
         (plen == 0 || raw_send_all(fd, payload, plen));
}

#endif
