/* mh_intruder: --fault intruder. A process that holds no key and reaches both
 * instances' engine ports, as anyone on the data network could, and tries, for as
 * long as the run lasts, to be let in. It speaks the wire by hand from
 * docs/design.md ("Wire protocol"), as an outsider would, knowing nothing of hixl's
 * code:
 *   - a plain HELLO (no key): the engine must answer a bare refusal (HELLO_ACK status
 *     3, no name, no capabilities, no memory table) and close;
 *   - a HELLO offering a key id it made up, with a nonce: the same;
 *   - a CALL to the KV service (a FREE) as its first frame, before any HELLO: the link
 *     must close with no answer;
 *   - a connection that says nothing and goes away.
 * Anything else (a HELLO_ACK that admits it or lists memory, an AUTH_CHALLENGE for a
 * key it cannot hold, an answer to the CALL) counts as admitted, and the run fails.
 * Meanwhile the hand-off runs as usual and must verify every request. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mh.h"

#define HXL_MAGIC      0x4858494cu
#define T_HELLO        1
#define T_HELLO_ACK    2
#define T_CALL         21
#define CAP_TCP_DATA   0x1u
#define CAP_AUTH       0x100u
#define ST_AUTH        3u
#define IO_TIMEOUT_MS  2000
#define ROUND_PAUSE_MS 5
#define MIN_ROUNDS     16 /* each kind of attempt 4 times on each engine before the run may end */

static void be16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}
static void be32(uint8_t *p, uint32_t v) {
  be16(p, (uint16_t)(v >> 16));
  be16(p + 2, (uint16_t)v);
}
static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The 20-byte header: magic, version 1, type, flags 0, body length, payload 0, 0. */
static size_t hdr(uint8_t *b, uint8_t type, uint32_t body_len) {
  memset(b, 0, 20);
  be32(b, HXL_MAGIC);
  b[4] = 1;
  b[5] = type;
  be32(b + 8, body_len);
  return 20;
}

static int dial(const char *addr) {
  char host[64];
  const char *colon = strrchr(addr, ':');
  if (!colon || (size_t)(colon - addr) >= sizeof(host)) return -1;
  snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct timeval tv = {.tv_sec = IO_TIMEOUT_MS / 1000};
  if (fd < 0) return -1;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static bool send_all(int fd, const uint8_t *b, size_t n) {
  while (n > 0) {
    ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    b += k;
    n -= (size_t)k;
  }
  return true;
}

/* Read up to cap bytes until the peer closes; the count, or -1 on a timeout. */
static ssize_t read_to_close(int fd, uint8_t *b, size_t cap) {
  size_t got = 0;
  for (;;) {
    ssize_t k = recv(fd, b + got, cap - got, 0);
    if (k == 0) return (ssize_t)got;
    if (k < 0) return errno == ECONNRESET ? (ssize_t)got : -1;
    got += (size_t)k;
    if (got == cap) return (ssize_t)got; /* more than any refusal: admitted */
  }
}

/* What the engine answered a HELLO: refused (a bare HELLO_ACK status 3, then the
 * close), or anything else. */
static bool recv_all(int fd, uint8_t *b, size_t n) {
  while (n > 0) {
    ssize_t k = recv(fd, b, n, 0);
    if (k <= 0) return false;
    b += k;
    n -= (size_t)k;
  }
  return true;
}

static bool refused_hello(int fd, struct mh_intrusion *s) {
  uint8_t b[20 + 65536];
  ssize_t k = recv(fd, b, 1, 0);
  if (k == 0 || (k < 0 && errno == ECONNRESET)) return true; /* closed with nothing said: nothing learned */
  if (k != 1 || !recv_all(fd, b + 1, 19) || get32(b) != HXL_MAGIC || b[5] != T_HELLO_ACK) return false;
  uint32_t body = get32(b + 8);
  if (body < 14 || body > sizeof(b) - 20 || !recv_all(fd, b + 20, body)) return false;
  uint32_t status = get32(b + 20), caps = get32(b + 24);
  uint32_t name_len = (uint32_t)b[28] << 8 | b[29];
  if (34 + name_len <= 20 + body) s->entries_seen += get32(b + 30 + name_len); /* what it was told */
  /* A bare refusal: status 3, nothing else in it, and the link closed after it. */
  return status == ST_AUTH && caps == 0 && name_len == 0 && body == 14 && get32(b + 30) == 0 &&
         read_to_close(fd, b, sizeof(b)) == 0;
}

static void attempt(const char *addr, int kind, struct mh_intrusion *s) {
  static const char name[] = "intruder:1";
  uint8_t b[256];
  size_t n;
  int fd = dial(addr);
  s->attempts++;
  if (fd < 0) { /* the port is closed (an instance between runs): nothing learned */
    s->refused++;
    return;
  }
  bool ok = false;
  switch (kind) {
  case 0: /* HELLO without a key */
  case 1: /* HELLO claiming a key it does not hold */
    n = hdr(b, T_HELLO, (uint32_t)(6 + strlen(name) + (kind == 1 ? 32 + 1 + 8 : 0)));
    be32(b + n, CAP_TCP_DATA | (kind == 1 ? CAP_AUTH : 0));
    be16(b + n + 4, (uint16_t)strlen(name));
    memcpy(b + n + 6, name, strlen(name));
    n += 6 + strlen(name);
    if (kind == 1) {
      if (getrandom(b + n, 32 + 1 + 8, 0) != 32 + 1 + 8) break;
      b[n + 32] = 1; /* one key id, random */
      n += 32 + 1 + 8;
    }
    ok = send_all(fd, b, n) && refused_hello(fd, s);
    break;
  case 2: { /* a KV-service CALL before any HELLO: seq, service 1, a FREE's bytes */
    n = hdr(b, T_CALL, 10 + 8);
    memset(b + n, 0, 18);
    b[n + 7] = 1;
    be16(b + n + 8, 1);
    memcpy(b + n + 10, "FREE\0\0\0\0", 8);
    n += 18;
    ssize_t got = send_all(fd, b, n) ? read_to_close(fd, b, sizeof(b)) : 0;
    ok = got == 0; /* closed, no answer */
    break;
  }
  default: ok = true; /* said nothing */
  }
  close(fd);
  if (ok)
    s->refused++;
  else
    s->admitted++;
}

int mh_intruder_main(const char *const addr[2], int stop_fd, int report_fd) {
  struct mh_intrusion s = {0};
  for (uint32_t round = 1;; round++) {
    for (int k = 0; k < 2; k++) attempt(addr[k], (int)(round % 4), &s);
    if (round == MIN_ROUNDS && write(report_fd, "R", 1) != 1) return 1; /* the run may end now */
    struct pollfd p = {stop_fd, POLLIN, 0};
    if (round >= MIN_ROUNDS && poll(&p, 1, ROUND_PAUSE_MS) != 0) break; /* the router said stop */
    if (round < MIN_ROUNDS) poll(NULL, 0, ROUND_PAUSE_MS);
  }
  return write(report_fd, &s, sizeof(s)) == (ssize_t)sizeof(s) ? 0 : 1;
}
