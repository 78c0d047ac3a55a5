/* Hostile and broken peers speaking raw frames at a live engine, on both sides of a
 * link: a target must reject bad frames and out-of-range requests before touching
 * memory and keep serving; an initiator must turn a broken target into a clear error. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CUnit/Basic.h>
#include <errno.h>

#include "test_util.h"
#include "wire.h"

#define MEM_LEN (1u << 20)

static HixlEngine *target;
static uint8_t *tmem;
static char taddr[TU_ADDR_LEN];

static int suite_init(void) {
  HixlMemHandle h;
  HixlMemDesc d;
  uint16_t port = tu_free_port();
  tmem = tu_alloc_mem(MEM_LEN, false);
  if (!port || !tmem || HixlEngineCreate(&target) != HIXL_SUCCESS) return -1;
  tu_addr(taddr, sizeof(taddr), port);
  if (HixlEngineInitialize(target, taddr, NULL, 0) != HIXL_SUCCESS) return -1;
  d.addr = (uintptr_t)tmem;
  d.len = MEM_LEN;
  return HixlEngineRegisterMem(target, &d, HIXL_MEM_HOST, &h) == HIXL_SUCCESS ? 0 : -1;
}

static int suite_clean(void) {
  HixlEngineDestroy(target);
  tu_free_mem(tmem, MEM_LEN);
  return 0;
}

/* A blocking socket to addr:port with 5 s receive and send timeouts. */
static int raw_connect(uint16_t port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  struct timeval tv = {.tv_sec = 5};
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static uint16_t target_port(void) { return (uint16_t)atoi(strchr(taddr, ':') + 1); }

static bool send_all(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    b += k;
    n -= (size_t)k;
  }
  return true;
}

static bool recv_all(int fd, void *p, size_t n) {
  uint8_t *b = p;
  while (n > 0) {
    ssize_t k = recv(fd, b, n, 0);
    if (k <= 0) return false;
    b += k;
    n -= (size_t)k;
  }
  return true;
}

/* True when the peer closes the socket (EOF or reset) within the receive timeout. */
static bool closed_by_peer(int fd) {
  uint8_t buf[4096];
  for (;;) {
    ssize_t k = recv(fd, buf, sizeof(buf), 0);
    if (k == 0) return true;
    if (k < 0) return errno == ECONNRESET;
  }
}

static size_t build_hello(uint8_t *buf, size_t cap, const char *name) {
  struct wire_wr w;
  wire_begin(&w, buf, cap, WIRE_HELLO);
  wire_put_u32(&w, WIRE_CAP_TCP_DATA);
  wire_put_u16(&w, (uint16_t)strlen(name));
  wire_put_bytes(&w, name, strlen(name));
  return wire_end(&w, 0);
}

/* Read one frame; the body goes to body (cap bytes). */
static bool read_frame(int fd, struct wire_hdr *h, uint8_t *body, size_t cap) {
  uint8_t hb[WIRE_HDR_LEN];
  if (!recv_all(fd, hb, sizeof(hb))) return false;
  enum wire_err err = wire_parse_hdr(hb, h);
  if (err != WIRE_OK || h->body_len > cap) return false;
  return recv_all(fd, body, h->body_len);
}

/* A raw link that completed the handshake. */
static int raw_link(void) {
  uint8_t buf[512];
  struct wire_hdr h;
  struct wire_msg m;
  int fd = raw_connect(target_port());
  if (fd < 0) return -1;
  if (!send_all(fd, buf, build_hello(buf, sizeof(buf), "raw-test")) ||
      !read_frame(fd, &h, buf, sizeof(buf)) || h.type != WIRE_HELLO_ACK ||
      wire_decode(&h, buf, &m) != WIRE_OK || m.u.hello_ack.status != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* A real client engine still gets service: WRITE then READ back, checked. */
static void assert_target_serves(void) {
  HixlEngine *c;
  HixlMemHandle h;
  uint8_t *buf = tu_alloc_mem(2 * 65536, false);
  HixlMemDesc d = {(uintptr_t)buf, 2 * 65536};
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&c));
  TU_ASSERT_OK_FATAL(HixlEngineInitialize(c, "127.0.0.1", NULL, 0));
  TU_ASSERT_OK_FATAL(HixlEngineRegisterMem(c, &d, HIXL_MEM_HOST, &h));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(c, taddr, 2000));
  tu_fill(buf, 65536, 77);
  HixlTransferOpDesc op = {(uintptr_t)buf, (uintptr_t)tmem + 4096, 65536};
  TU_ASSERT_OK(HixlEngineTransferSync(c, taddr, HIXL_WRITE, &op, 1, 2000));
  op.local_addr = (uintptr_t)buf + 65536;
  TU_ASSERT_OK(HixlEngineTransferSync(c, taddr, HIXL_READ, &op, 1, 2000));
  CU_ASSERT(tu_check_pattern(buf + 65536, 65536, 77) == -1);
  CU_ASSERT(tu_check_pattern(tmem + 4096, 65536, 77) == -1);
  HixlEngineDestroy(c);
  tu_free_mem(buf, 2 * 65536);
}

static void test_garbage_closes_link(void) {
  int fd = raw_connect(target_port());
  CU_ASSERT_FATAL(fd >= 0);
  const char junk[] = "GET / HTTP/1.0\r\n\r\n....";
  CU_ASSERT(send_all(fd, junk, sizeof(junk)));
  CU_ASSERT(closed_by_peer(fd));
  close(fd);
  assert_target_serves();
}

static void test_version_mismatch_answered(void) {
  uint8_t buf[512];
  struct wire_hdr h;
  struct wire_msg m;
  int fd = raw_connect(target_port());
  CU_ASSERT_FATAL(fd >= 0);
  size_t n = build_hello(buf, sizeof(buf), "from-the-future");
  buf[4] = WIRE_VERSION + 1;
  CU_ASSERT(send_all(fd, buf, n));
  CU_ASSERT_FATAL(read_frame(fd, &h, buf, sizeof(buf)));
  CU_ASSERT_EQUAL(h.type, WIRE_HELLO_ACK);
  CU_ASSERT_EQUAL(h.version, WIRE_VERSION);
  CU_ASSERT_FATAL(wire_decode(&h, buf, &m) == WIRE_OK);
  CU_ASSERT_EQUAL(m.u.hello_ack.status, WIRE_HELLO_VERSION);
  CU_ASSERT_EQUAL(m.u.hello_ack.count, 0); /* no memory table for a refused peer */
  CU_ASSERT(closed_by_peer(fd));
  close(fd);
  assert_target_serves();
}

static void test_request_before_hello_closes(void) {
  uint8_t buf[64];
  int fd = raw_connect(target_port());
  CU_ASSERT_FATAL(fd >= 0);
  size_t n = wire_put_read_req(buf, 1, (uintptr_t)tmem, 16);
  CU_ASSERT(send_all(fd, buf, n));
  CU_ASSERT(closed_by_peer(fd));
  close(fd);
}

static void test_oversized_frame_closes(void) {
  uint8_t buf[64];
  int fd = raw_link();
  CU_ASSERT_FATAL(fd >= 0);
  memset(tmem, 0x5a, 4096);
  size_t n = wire_put_write_req(buf, 1, (uintptr_t)tmem, 16);
  /* payload_len far beyond the largest chunk */
  buf[12] = 0x7f;
  CU_ASSERT(send_all(fd, buf, n));
  CU_ASSERT(closed_by_peer(fd));
  close(fd);
  CU_ASSERT(tu_check_byte(tmem, 4096, 0x5a) == -1);
  assert_target_serves();
}

static void test_out_of_range_refused_link_kept(void) {
  uint8_t frame[64], data[256], body[64];
  struct wire_hdr h;
  struct wire_msg m;
  int fd = raw_link();
  CU_ASSERT_FATAL(fd >= 0);
  memset(tmem, 0x11, MEM_LEN);
  memset(data, 0xee, sizeof(data));

  /* WRITE that runs past the end of the registration: refused, data discarded. */
  size_t n = wire_put_write_req(frame, 7, (uintptr_t)tmem + MEM_LEN - 128, sizeof(data));
  CU_ASSERT(send_all(fd, frame, n) && send_all(fd, data, sizeof(data)));
  CU_ASSERT_FATAL(read_frame(fd, &h, body, sizeof(body)));
  CU_ASSERT_FATAL(h.type == WIRE_WRITE_ACK && wire_decode(&h, body, &m) == WIRE_OK);
  CU_ASSERT_EQUAL(m.u.ack.seq, 7);
  CU_ASSERT_EQUAL(m.u.ack.status, HIXL_FAILED);
  CU_ASSERT(tu_check_byte(tmem, MEM_LEN, 0x11) == -1);

  /* READ of memory nobody registered: refused with no payload. */
  n = wire_put_read_req(frame, 8, (uintptr_t)data, sizeof(data));
  CU_ASSERT(send_all(fd, frame, n));
  CU_ASSERT_FATAL(read_frame(fd, &h, body, sizeof(body)));
  CU_ASSERT_FATAL(h.type == WIRE_READ_RESP && wire_decode(&h, body, &m) == WIRE_OK);
  CU_ASSERT_EQUAL(m.u.ack.seq, 8);
  CU_ASSERT_EQUAL(m.u.ack.status, HIXL_FAILED);
  CU_ASSERT_EQUAL(h.payload_len, 0);

  /* The same link still works for an in-range WRITE and READ. */
  n = wire_put_write_req(frame, 9, (uintptr_t)tmem + 100, sizeof(data));
  CU_ASSERT(send_all(fd, frame, n) && send_all(fd, data, sizeof(data)));
  CU_ASSERT_FATAL(read_frame(fd, &h, body, sizeof(body)));
  CU_ASSERT(h.type == WIRE_WRITE_ACK && wire_decode(&h, body, &m) == WIRE_OK && m.u.ack.status == 0);
  CU_ASSERT(tu_check_byte(tmem + 100, sizeof(data), 0xee) == -1);
  CU_ASSERT(tu_check_byte(tmem, 100, 0x11) == -1);
  CU_ASSERT(tu_check_byte(tmem + 100 + sizeof(data), MEM_LEN - 100 - sizeof(data), 0x11) == -1);

  uint8_t back[256];
  n = wire_put_read_req(frame, 10, (uintptr_t)tmem + 100, sizeof(back));
  CU_ASSERT(send_all(fd, frame, n));
  CU_ASSERT_FATAL(read_frame(fd, &h, body, sizeof(body)));
  CU_ASSERT(h.type == WIRE_READ_RESP && h.payload_len == sizeof(back));
  CU_ASSERT_FATAL(recv_all(fd, back, sizeof(back)));
  CU_ASSERT(memcmp(back, data, sizeof(back)) == 0);
  close(fd);
}

static void test_truncated_then_gone(void) {
  uint8_t frame[64];
  int fd = raw_link();
  CU_ASSERT_FATAL(fd >= 0);
  size_t n = wire_put_write_req(frame, 1, (uintptr_t)tmem, 4096);
  CU_ASSERT(send_all(fd, frame, n) && send_all(fd, frame, 10)); /* 10 of 4096 bytes, then gone */
  close(fd);
  assert_target_serves();
}

/* ---- a fake target, for the initiator side ---- */

enum fake_mode { FAKE_SILENT, FAKE_GARBAGE, FAKE_NEW_VERSION, FAKE_BAD_SEQ, FAKE_CLOSE_THEN_SERVE };

struct fake {
  int lfd;
  uint16_t port;
  enum fake_mode mode;
  pthread_t th;
  int pipe_done[2];   /* the test closes the write end to end the fake */
  int pipe_closed[2]; /* FAKE_CLOSE_THEN_SERVE: written once the first link is closed */
};

static bool send_hello_ack(int fd, uint8_t version) {
  uint8_t buf[64];
  struct wire_wr w;
  wire_begin(&w, buf, sizeof(buf), WIRE_HELLO_ACK);
  wire_put_u32(&w, 0);
  wire_put_u32(&w, WIRE_CAP_TCP_DATA);
  wire_put_u16(&w, 4);
  wire_put_bytes(&w, "fake", 4);
  wire_put_u32(&w, 0);
  size_t n = wire_end(&w, 0);
  buf[4] = version;
  return send_all(fd, buf, n);
}

static void *fake_main(void *arg) {
  struct fake *f = arg;
  uint8_t buf[1024];
  struct wire_hdr h;
  int fd = accept(f->lfd, NULL, NULL);
  if (fd < 0) return NULL;
  if (f->mode == FAKE_CLOSE_THEN_SERVE) {
    /* First link: handshake, then hang up while the link is idle. */
    if (read_frame(fd, &h, buf, sizeof(buf))) send_hello_ack(fd, WIRE_VERSION);
    close(fd);
    (void)!write(f->pipe_closed[1], "c", 1);
    fd = accept(f->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    if (read_frame(fd, &h, buf, sizeof(buf))) send_hello_ack(fd, WIRE_VERSION);
  }
  if (f->mode != FAKE_SILENT && f->mode != FAKE_CLOSE_THEN_SERVE && read_frame(fd, &h, buf, sizeof(buf))) {
    size_t n;
    switch (f->mode) {
    case FAKE_GARBAGE: send_all(fd, "HTTP/1.1 400 Bad Request\r\n\r\n", 28); break;
    case FAKE_NEW_VERSION:
    case FAKE_BAD_SEQ:
      send_hello_ack(fd, f->mode == FAKE_NEW_VERSION ? WIRE_VERSION + 1 : WIRE_VERSION);
      if (f->mode == FAKE_BAD_SEQ && read_frame(fd, &h, buf, sizeof(buf))) {
        n = wire_put_ack(buf, WIRE_WRITE_ACK, 999, 0, 0); /* not the seq it sent */
        send_all(fd, buf, n);
      }
      break;
    default: break;
    }
  }
  struct pollfd p = {.fd = f->pipe_done[0], .events = POLLIN};
  poll(&p, 1, 10000); /* hold the socket open until the test is done with it */
  close(fd);
  return NULL;
}

static void fake_start(struct fake *f, enum fake_mode mode) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t sl = sizeof(sa);
  f->mode = mode;
  f->lfd = socket(AF_INET, SOCK_STREAM, 0);
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  CU_ASSERT_FATAL(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(f->lfd, 4) == 0);
  getsockname(f->lfd, (struct sockaddr *)&sa, &sl);
  f->port = ntohs(sa.sin_port);
  CU_ASSERT_FATAL(pipe(f->pipe_done) == 0 && pipe(f->pipe_closed) == 0);
  pthread_create(&f->th, NULL, fake_main, f);
}

static void fake_stop(struct fake *f) {
  close(f->pipe_done[1]);
  pthread_join(f->th, NULL);
  close(f->pipe_done[0]);
  close(f->pipe_closed[0]);
  close(f->pipe_closed[1]);
  close(f->lfd);
}

static void connect_to_fake(enum fake_mode mode, HixlStatus want, const char *msg_has) {
  struct fake f;
  char addr[TU_ADDR_LEN];
  HixlEngine *c;
  fake_start(&f, mode);
  tu_addr(addr, sizeof(addr), f.port);
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&c));
  TU_ASSERT_OK_FATAL(HixlEngineInitialize(c, "127.0.0.1", NULL, 0));
  int64_t t0 = tu_now_ms();
  TU_ASSERT_STATUS(HixlEngineConnect(c, addr, 400), want);
  TU_ASSERT_ERRMSG_HAS(msg_has);
  CU_ASSERT(tu_now_ms() - t0 < 400 + 500);
  HixlEngineDestroy(c);
  fake_stop(&f);
}

static void test_connect_silent_target_times_out(void) {
  connect_to_fake(FAKE_SILENT, HIXL_TIMEOUT, "127.0.0.1");
}

static void test_connect_non_hixl_target(void) {
  connect_to_fake(FAKE_GARBAGE, HIXL_FAILED, "not a hixl engine");
}

static void test_connect_version_mismatch(void) {
  connect_to_fake(FAKE_NEW_VERSION, HIXL_FAILED, "protocol version");
}

static void test_response_out_of_order_fails_link(void) {
  struct fake f;
  char addr[TU_ADDR_LEN];
  HixlEngine *c;
  HixlMemHandle h;
  uint8_t *buf = tu_alloc_mem(4096, false);
  HixlMemDesc d = {(uintptr_t)buf, 4096};
  fake_start(&f, FAKE_BAD_SEQ);
  tu_addr(addr, sizeof(addr), f.port);
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&c));
  TU_ASSERT_OK_FATAL(HixlEngineInitialize(c, "127.0.0.1", NULL, 0));
  TU_ASSERT_OK_FATAL(HixlEngineRegisterMem(c, &d, HIXL_MEM_HOST, &h));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(c, addr, 2000));
  HixlTransferOpDesc op = {(uintptr_t)buf, 0x1000, 64};
  TU_ASSERT_STATUS(HixlEngineTransferSync(c, addr, HIXL_WRITE, &op, 1, 3000), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("protocol error");
  TU_ASSERT_STATUS(HixlEngineTransferSync(c, addr, HIXL_WRITE, &op, 1, 1000), HIXL_NOT_CONNECTED);
  TU_ASSERT_ERRMSG_HAS("lost");
  HixlEngineDestroy(c);
  fake_stop(&f);
  tu_free_mem(buf, 4096);
}

/* A target that hangs up while the link is idle: the next Connect must see it is
 * gone and link again, not answer ALREADY_CONNECTED. */
static void test_reconnect_after_idle_hangup(void) {
  struct fake f;
  char addr[TU_ADDR_LEN], c1;
  HixlEngine *c;
  fake_start(&f, FAKE_CLOSE_THEN_SERVE);
  tu_addr(addr, sizeof(addr), f.port);
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&c));
  TU_ASSERT_OK_FATAL(HixlEngineInitialize(c, "127.0.0.1", NULL, 0));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(c, addr, 2000));
  CU_ASSERT_FATAL(read(f.pipe_closed[0], &c1, 1) == 1); /* the fake closed the first link */
  TU_ASSERT_OK(HixlEngineConnect(c, addr, 2000));
  HixlEngineDestroy(c);
  fake_stop(&f);
}

int main(void) {
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  CU_pSuite t = CU_add_suite("target_vs_raw_peers", suite_init, suite_clean);
  CU_add_test(t, "garbage closes the link, engine keeps serving", test_garbage_closes_link);
  CU_add_test(t, "HELLO of another version gets a clear refusal", test_version_mismatch_answered);
  CU_add_test(t, "a request before HELLO closes the link", test_request_before_hello_closes);
  CU_add_test(t, "an oversized frame closes the link, memory untouched", test_oversized_frame_closes);
  CU_add_test(t, "out-of-range WRITE/READ refused, memory untouched, link kept",
              test_out_of_range_refused_link_kept);
  CU_add_test(t, "a truncated frame then a vanished peer", test_truncated_then_gone);
  CU_pSuite i = CU_add_suite("initiator_vs_fake_targets", NULL, NULL);
  CU_add_test(i, "silent target: Connect times out", test_connect_silent_target_times_out);
  CU_add_test(i, "non-hixl target: clear error", test_connect_non_hixl_target);
  CU_add_test(i, "newer protocol version: clear error", test_connect_version_mismatch);
  CU_add_test(i, "response out of order: FAILED, then NOT_CONNECTED", test_response_out_of_order_fails_link);
  CU_add_test(i, "target hung up while idle: Connect links again", test_reconnect_after_idle_hangup);
  CU_basic_set_mode(CU_BRM_VERBOSE);
  CU_basic_run_tests();
  unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
  CU_cleanup_registry();
  return failed ? 1 : 0;
}
