/* test_plugin_caps: request capabilities in the plugin's KV service (issue 27).
 *
 * Anyone who reaches a worker's engine port can call its KV service. Here a hostile
 * peer, a bare engine of this program, links to a worker of the plugin (loaded by
 * dlopen, as a host loads it) and sends KV service calls whose bodies it builds
 * itself: without the request's capability, with a wrong one, or in protocol 3 (before
 * capabilities). Each call is refused (PARAM_INVALID, the reason named), counted in
 * cap_refused, and changes nothing: the legitimate peer, a plugin instance of its own
 * that got the capability in kv_transfer_params, then moves the request and every byte
 * of the receiving side is checked. Transport: HIXL_TEST_TRANSPORT (tcp for the _tcp
 * run), else auto. No sleep synchronizes anything: waits poll real conditions (the
 * event fd, get_finished) with deadlines. */
#include <CUnit/Basic.h>
#include <dlfcn.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_ext.h"
#include "hixl/hixl_kv_connector.h"
#include "kv_wire.h"
#include "raw_auth.h"
#include "test_util.h"

#ifndef HIXL_KV_PLUGIN_PATH
#define HIXL_KV_PLUGIN_PATH "libhixl_kv_connector.so"
#endif

enum { LAYERS = 2, BLOCKS = 8, BLOCK_TOKENS = 4, ELEM = 2, BLOCK_BYTES = 8192, T_MS = 20000 };

static void *so;
static const hixl_kv_ops *ops;

#define ST_IS(expr, want)                                                                                    \
  do {                                                                                                       \
    hixl_kv_status st_ = (expr);                                                                             \
    if (st_ != (hixl_kv_status)(want))                                                                       \
      tu_fail(__FILE__, __LINE__, "%s: got %u, want %u (%s)", #expr, st_, (unsigned)(want),                  \
              ops->last_error());                                                                            \
  } while (0)

/* ---- one side: a scheduler and a worker connector, the host's KV in memory ---- */

struct side {
  hixl_kv_connector *sched, *worker;
  char addr[TU_ADDR_LEN];
  uint8_t *kv; /* per layer: BLOCKS blocks of K, then BLOCKS of V */
  size_t len;
  int32_t efd;
};

static uint8_t *block_at(const struct side *s, int layer, int v, uint64_t b) {
  return s->kv + ((size_t)layer * 2 + (size_t)v) * BLOCKS * BLOCK_BYTES + b * BLOCK_BYTES;
}

/* role ("producer", "consumer") and mode ("pull", "push"); its KV 0xEE. false: reported. */
static bool side_up(struct side *s, const char *role, const char *mode, unsigned lease_ms) {
  char cfg[512], err[256] = "";
  const char *t = tu_transport();
  *s = (struct side){.efd = -1};
  tu_addr(s->addr, sizeof(s->addr), tu_free_port());
  snprintf(cfg, sizeof(cfg),
           "{\"address\": \"%s\", \"role\": \"%s\", \"mode\": \"%s\", \"lease_ms\": %u,"
           " \"transfer_timeout_ms\": 5000, \"connect_timeout_ms\": 5000, \"Transport\": \"%s\"}",
           s->addr, role, mode, lease_ms, t ? t : "auto");
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &s->sched, err, sizeof(err)),
        HIXL_KV_SUCCESS);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, &s->worker, err, sizeof(err)),
        HIXL_KV_SUCCESS);
  s->len = (size_t)LAYERS * 2 * BLOCKS * BLOCK_BYTES;
  if (!s->sched || !s->worker || !(s->kv = malloc(s->len))) return false;
  memset(s->kv, 0xEE, s->len);
  hixl_kv_layer layers[LAYERS];
  for (int l = 0; l < LAYERS; l++)
    layers[l] = (hixl_kv_layer){"layer",
                                5,
                                (uintptr_t)block_at(s, l, 0, 0),
                                BLOCKS,
                                BLOCK_BYTES,
                                (uint64_t)BLOCKS * BLOCK_BYTES,
                                HIXL_KV_LAYOUT_KV_FIRST,
                                ELEM,
                                BLOCK_TOKENS};
  ST_IS(ops->register_kv_caches(s->worker, layers, LAYERS), HIXL_KV_SUCCESS);
  ST_IS(ops->get_event_fd(s->worker, &s->efd), HIXL_KV_SUCCESS);
  return s->efd >= 0;
}

static void side_down(struct side *s) {
  if (s->worker) ST_IS(ops->destroy(s->worker), HIXL_KV_SUCCESS);
  if (s->sched) ST_IS(ops->destroy(s->sched), HIXL_KV_SUCCESS);
  free(s->kv);
}

/* One step: the scheduler's metadata bound by the worker, its loads started. */
static void step(struct side *s) {
  hixl_kv_buffer m = {0};
  ST_IS(ops->build_connector_meta(s->sched, &m), HIXL_KV_SUCCESS);
  ST_IS(ops->bind_connector_meta(s->worker, m.data, m.len), HIXL_KV_SUCCESS);
  ops->free_buffer(&m);
  ST_IS(ops->start_load_kv(s->worker), HIXL_KV_SUCCESS);
}

/* The forward pass computes a request into blocks: each block of each plane its own
 * pattern, from seed and the block's place in the request (not its id). */
static uint64_t block_seed(uint64_t seed, int l, int v, size_t j) {
  return seed * 1000 + (uint64_t)l * 100 + (uint64_t)v * 10 + j;
}

static void paint(struct side *s, const uint64_t *blocks, size_t n, uint64_t seed) {
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (size_t j = 0; j < n; j++)
        tu_fill(block_at(s, l, v, blocks[j]), BLOCK_BYTES, block_seed(seed, l, v, j));
}

/* Every byte of s: blocks[j] of each plane holds the request's j-th block (seed),
 * every other block is still 0xEE. */
static void verify(const struct side *s, const uint64_t *blocks, size_t n, uint64_t seed) {
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (uint64_t b = 0; b < BLOCKS; b++) {
        size_t j = 0;
        while (j < n && blocks[j] != b) j++;
        if (j < n)
          TU_ASSERT_PATTERN(block_at(s, l, v, b), BLOCK_BYTES, block_seed(seed, l, v, j), "a landed block");
        else
          CU_ASSERT_EQUAL(tu_check_byte(block_at(s, l, v, b), BLOCK_BYTES, 0xEE), -1);
      }
}

static hixl_kv_request request(const char *id, size_t nblocks, const char *params) {
  return (hixl_kv_request){id, strlen(id), nblocks * BLOCK_TOKENS, params, params ? strlen(params) : 0, 0};
}

static bool ids_have(const hixl_kv_ids *ids, const char *id) {
  for (size_t i = 0; i < ids->count; i++)
    if (strcmp(ids->ids[i], id) == 0) return true;
  return false;
}

/* Whether get_finished reports id (sending or receiving) within timeout_ms; it runs
 * whenever the event fd polls readable, and every 20 ms (leases expire in it). Other
 * ids it reports are dropped. */
static bool wait_finished(struct side *s, const char *id, bool sending, int timeout_ms) {
  int64_t end = tu_now_ms() + timeout_ms;
  do {
    hixl_kv_ids snd = {0}, rcv = {0};
    ST_IS(ops->get_finished(s->worker, NULL, &snd, &rcv), HIXL_KV_SUCCESS);
    bool got = ids_have(sending ? &snd : &rcv, id);
    ops->free_ids(&snd);
    ops->free_ids(&rcv);
    if (got) return true;
    struct pollfd pfd = {.fd = s->efd, .events = POLLIN};
    poll(&pfd, 1, 20);
  } while (tu_now_ms() < end);
  return false;
}

/* Nothing finished on s now (a service call acts before it answers, so a call that
 * ended a request has reported it by the time it returns). */
static void none_finished(struct side *s) {
  hixl_kv_ids snd = {0}, rcv = {0};
  ST_IS(ops->get_finished(s->worker, NULL, &snd, &rcv), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(snd.count, 0);
  CU_ASSERT_EQUAL(rcv.count, 0);
  ops->free_ids(&snd);
  ops->free_ids(&rcv);
}

static void no_load_errors(struct side *d) {
  hixl_kv_blocks e = {0};
  ST_IS(ops->get_block_ids_with_load_errors(d->worker, &e), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(e.count, 0);
  ops->free_buffer(&e.raw);
}

static hixl_kv_stats_ex stats(struct side *s) {
  hixl_kv_stats_ex e = {.size = sizeof(e)};
  ST_IS(ops->get_stats_ex(s->worker, &e), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(e.size, sizeof(e));
  return e;
}

static char *take_text(hixl_kv_buffer *b) {
  char *t = b->data ? strndup((char *)b->data, b->len) : NULL;
  ops->free_buffer(b);
  return t;
}

/* The capability kv_transfer_params carry: "cap", 32 hex digits. */
static struct kv_cap params_cap(const char *params) {
  struct kv_cap c = {0};
  const char *h = params ? strstr(params, "\"cap\":\"") : NULL;
  CU_ASSERT_PTR_NOT_NULL_FATAL(h);
  h += 7;
  for (unsigned i = 0; i < KV_CAP_LEN; i++) {
    unsigned x;
    CU_ASSERT_FATAL(sscanf(h + 2 * i, "%2x", &x) == 1);
    c.b[i] = (uint8_t)x;
  }
  CU_ASSERT_EQUAL(h[2 * KV_CAP_LEN], '"');
  c.len = KV_CAP_LEN;
  return c;
}

/* ---- the flows of a legitimate host ---- */

/* Pull producer p computes request id into blocks, saves every layer and finishes it:
 * its kv_transfer_params (the caller frees them). Not held before p's next step. */
static char *produce(struct side *p, const char *id, const uint64_t *blocks, size_t n, uint64_t seed) {
  int32_t delay = 0;
  hixl_kv_buffer b = {0};
  hixl_kv_request r = request(id, n, NULL);
  paint(p, blocks, n, seed);
  for (uint32_t l = 0; l < LAYERS; l++) ST_IS(ops->save_kv_layer(p->worker, l), HIXL_KV_SUCCESS);
  ST_IS(ops->wait_for_save(p->worker), HIXL_KV_SUCCESS);
  ST_IS(ops->request_finished(p->sched, &r, blocks, n, &delay, &b), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(delay, 1);
  char *params = take_text(&b);
  CU_ASSERT_PTR_NOT_NULL_FATAL(params);
  return params;
}

/* Pull consumer d loads request id (the producer's, per params) into blocks. */
static void consume(struct side *d, const char *id, const char *params, const uint64_t *blocks, size_t n) {
  hixl_kv_request r = request(id, n, params);
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d->sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(tokens, (int64_t)(n * BLOCK_TOKENS));
  ST_IS(ops->update_state_after_alloc(d->sched, &r, blocks, n, (uint64_t)tokens), HIXL_KV_SUCCESS);
  step(d);
}

/* Push consumer d expects request id into blocks (bound): its push params. */
static char *expect_push(struct side *d, const char *id, const uint64_t *blocks, size_t n) {
  hixl_kv_request r = request(id, n, "{\"do_remote_prefill\": true}");
  int64_t tokens = 0;
  int32_t async = 0;
  hixl_kv_buffer b = {0};
  ST_IS(ops->get_num_new_matched_tokens(d->sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(tokens, (int64_t)(n * BLOCK_TOKENS));
  ST_IS(ops->update_state_after_alloc(d->sched, &r, blocks, n, (uint64_t)tokens), HIXL_KV_SUCCESS);
  ST_IS(ops->get_push_params(d->sched, id, strlen(id), &b), HIXL_KV_SUCCESS);
  step(d);
  char *params = take_text(&b);
  CU_ASSERT_PTR_NOT_NULL_FATAL(params);
  return params;
}

/* Push producer p computes its request id into blocks and pushes it per params. */
static void push(struct side *p, const char *id, const char *params, const uint64_t *blocks, size_t n,
                 uint64_t seed) {
  hixl_kv_request r = request(id, n, params);
  int64_t tokens = -1;
  int32_t async = 1;
  paint(p, blocks, n, seed);
  ST_IS(ops->get_num_new_matched_tokens(p->sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(tokens, 0);
  ST_IS(ops->update_state_after_alloc(p->sched, &r, blocks, n, 0), HIXL_KV_SUCCESS);
  step(p);
  for (uint32_t l = 0; l < LAYERS; l++) ST_IS(ops->save_kv_layer(p->worker, l), HIXL_KV_SUCCESS);
  ST_IS(ops->wait_for_save(p->worker), HIXL_KV_SUCCESS);
}

/* ---- the hostile peer ---- */

/* A bare engine of its own name (ip:port: the plugin names a peer as it names itself)
 * linked to target. */
static HixlEngine *hostile_up(const char *target) {
  char self[TU_ADDR_LEN];
  HixlEngine *e = tu_engine_start_with(tu_addr(self, sizeof(self), tu_free_port()), tu_transport());
  CU_ASSERT_PTR_NOT_NULL_FATAL(e);
  TU_ASSERT_OK_FATAL(HixlEngineConnect(e, target, 5000));
  return e;
}

/* Whether e's link to target is one the target's CPU serves (tcp), where its scoped
 * memory is enforced. */
static bool scoped_here(HixlEngine *e, const char *target) {
  struct hixl_link_info info;
  TU_ASSERT_OK_FATAL(hixl_engine_link_info(e, target, &info));
  return strcmp(info.transport, "shm") != 0; /* tcp: the producer's CPU; rdma: its windows */
}

/* How a call presents the request's capability. */
enum present {
  P_NONE,  /* protocol 4, capability length 0 */
  P_OLD,   /* protocol 3: no capability field at all */
  P_WRONG, /* the request's with its last bit flipped */
  P_OTHER, /* 16 bytes of 0xA5 */
  P_RIGHT, /* the request's (from kv_transfer_params) */
};

/* The body of a KV service call: op on id, presenting the capability as pr says
 * (right: *cap), then the op's own fields (tail). */
static struct kv_out call_body(uint8_t op, const char *id, enum present pr, const struct kv_cap *cap,
                               const struct kv_out *tail) {
  struct kv_out o = {0};
  struct kv_cap c = {0};
  if (pr == P_RIGHT || pr == P_WRONG) c = *cap;
  if (pr == P_WRONG) c.b[KV_CAP_LEN - 1] ^= 1;
  if (pr == P_OTHER) c.len = KV_CAP_LEN, memset(c.b, 0xA5, KV_CAP_LEN);
  kv_put_u8(&o, pr == P_OLD ? KV_SVC_PROTO_NOCAP : KV_SVC_PROTO);
  kv_put_u8(&o, op);
  kv_put_str(&o, id, strlen(id));
  if (pr != P_OLD) {
    kv_put_cap(&o, &c);
    kv_put_u32(&o, 1); /* the caller's world size and rank (protocol 5) */
    kv_put_u32(&o, 0);
  }
  if (tail) kv_put_raw(&o, tail->p, tail->len);
  CU_ASSERT_FATAL(!o.bad);
  return o;
}

/* A KV service call of e to target: op on id, presenting the capability as pr says
 * (right: *cap), then the op's own fields (tail). Its status; the answer in ans. */
static HixlStatus call(HixlEngine *e, const char *target, uint8_t op, const char *id, enum present pr,
                       const struct kv_cap *cap, const struct kv_out *tail, uint8_t *ans, size_t *n) {
  struct kv_out o = call_body(op, id, pr, cap, tail);
  size_t got = 0;
  HixlStatus st = hixl_engine_call(e, target, HIXL_SERVICE_KV, o.p, o.len, ans, 4096, &got, 5000);
  free(o.p);
  if (n) *n = got;
  return st;
}

/* A call refused for its capability: PARAM_INVALID, the reason naming what was wrong. */
#define REFUSED(expr, pr)                                                                                    \
  do {                                                                                                       \
    TU_ASSERT_STATUS(expr, HIXL_PARAM_INVALID);                                                              \
    TU_ASSERT_ERRMSG_HAS("refused");                                                                         \
    TU_ASSERT_ERRMSG_HAS((pr) == P_NONE || (pr) == P_OLD ? "carries no capability" : "wrong capability");    \
  } while (0)

/* ---- a raw peer: a name as long as the wire allows ---- */

/* A socket to target ("ip:port") whose HELLO names it name, over tcp (the target's CPU
 * serves its ops, so its grants apply); -1 when refused. A hixl engine calls itself by
 * at most 63 bytes, but the wire lets a peer claim up to WIRE_MAX_NAME (255), and the
 * target knows and grants it by that name. */
static int raw_peer_up(const char *target, const char *name) {
  static uint8_t body[HIXL_CALL_MAX];
  uint8_t hello[WIRE_HDR_LEN + 6 + WIRE_MAX_NAME];
  char ip[TU_ADDR_LEN];
  const char *colon = strrchr(target, ':');
  struct sockaddr_in sa = {.sin_family = AF_INET};
  struct timeval tv = {.tv_sec = 5};
  struct wire_hdr h;
  struct wire_msg m;
  if (!colon || (size_t)(colon - target) >= sizeof(ip)) return -1;
  snprintf(ip, sizeof(ip), "%.*s", (int)(colon - target), target);
  sa.sin_port = htons((uint16_t)atoi(colon + 1));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  size_t n = wire_put_hello(hello, sizeof(hello), WIRE_CAP_TCP_DATA, name);
  if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
      n == 0 || !raw_send_all(fd, hello, n) || !raw_recv_frame(fd, &h, NULL, body, sizeof(body)) ||
      h.type != WIRE_HELLO_ACK || wire_decode(&h, body, &m) != WIRE_OK ||
      m.u.hello_ack.status != WIRE_HELLO_OK) {
    close(fd);
    return -1;
  }
  return fd;
}

/* The next frame of type want on fd (others are read and dropped): its header, body
 * (at most cap bytes) and payload (at most pcap bytes, into payload). */
static bool raw_next(int fd, enum wire_type want, struct wire_hdr *h, uint8_t *body, size_t cap,
                     uint8_t *payload, size_t pcap) {
  for (;;) {
    uint8_t hb[WIRE_HDR_LEN];
    if (!raw_recv_all(fd, hb, sizeof(hb)) || wire_parse_hdr(hb, h) != WIRE_OK || h->body_len > cap ||
        !raw_recv_all(fd, body, h->body_len))
      return false;
    if (h->type == want) return h->payload_len <= pcap && raw_recv_all(fd, payload, h->payload_len);
    for (uint32_t left = h->payload_len; left > 0;) {
      uint8_t sink[4096];
      uint32_t k = left < sizeof(sink) ? left : (uint32_t)sizeof(sink);
      if (!raw_recv_all(fd, sink, k)) return false;
      left -= k;
    }
  }
}

/* A KV service call (req) on the raw peer's link, numbered seq: the answer's status,
 * its bytes in ans (*n of them, at most cap). */
static HixlStatus raw_call(int fd, uint64_t seq, const struct kv_out *req, uint8_t *ans, size_t cap,
                           size_t *n) {
  static uint8_t frame[WIRE_CALL_REQ_AT + 4096], body[WIRE_CALL_RESP_AT + HIXL_CALL_MAX];
  struct wire_hdr h;
  struct wire_msg m;
  CU_ASSERT_FATAL(req->len <= 4096);
  memcpy(frame + WIRE_CALL_REQ_AT, req->p, req->len);
  size_t len = wire_put_call(frame, WIRE_CALL, seq, HIXL_SERVICE_KV, (uint32_t)req->len);
  if (!raw_send_all(fd, frame, len) || !raw_next(fd, WIRE_CALL_RESP, &h, body, sizeof(body), NULL, 0) ||
      wire_decode(&h, body, &m) != WIRE_OK || m.u.call.seq != seq || m.u.call.len > cap) {
    CU_FAIL("no answer to the raw peer's KV service call");
    return HIXL_NOT_CONNECTED;
  }
  memcpy(ans, m.u.call.data, m.u.call.len);
  *n = m.u.call.len;
  return (HixlStatus)m.u.call.status;
}

/* A READ of one block (BLOCK_BYTES at addr) on the raw peer's link, numbered seq: the
 * answer's status, the bytes in dst when it served them. */
static HixlStatus raw_read(int fd, uint64_t seq, const uint8_t *addr, uint8_t *dst) {
  uint8_t frame[WIRE_SMALL_FRAME], body[64];
  struct wire_hdr h;
  struct wire_msg m;
  size_t len = wire_put_read_req(frame, seq, (uintptr_t)addr, BLOCK_BYTES);
  if (!raw_send_all(fd, frame, len) ||
      !raw_next(fd, WIRE_READ_RESP, &h, body, sizeof(body), dst, BLOCK_BYTES) ||
      wire_decode(&h, body, &m) != WIRE_OK || m.u.ack.seq != seq ||
      h.payload_len != (m.u.ack.status == HIXL_SUCCESS ? BLOCK_BYTES : 0)) {
    CU_FAIL("no answer to the raw peer's READ");
    return HIXL_NOT_CONNECTED;
  }
  return (HixlStatus)m.u.ack.status;
}

/* ---- the tests ---- */

/* Pull: a FREE without the capability (none, and protocol 3) is refused; the request
 * stays held, and the consumer that has the capability loads it byte for byte and
 * frees it. */
static void test_free_without_cap(void) {
  struct side p, d;
  CU_ASSERT_FATAL(side_up(&p, "producer", "pull", 30000) && side_up(&d, "consumer", "pull", 30000));
  const uint64_t pb[2] = {2, 5}, db[2] = {1, 6};
  char *params = produce(&p, "req-1", pb, 2, 11);
  step(&p); /* held now */
  HixlEngine *h = hostile_up(p.addr);
  uint8_t ans[4096];
  const enum present pr[2] = {P_NONE, P_OLD};
  for (int k = 0; k < 2; k++)
    REFUSED(call(h, p.addr, KV_SVC_FREE, "req-1", pr[k], NULL, NULL, ans, NULL), pr[k]);
  none_finished(&p); /* not freed */
  hixl_kv_stats_ex ps = stats(&p);
  CU_ASSERT(ps.requests_held == 1 && ps.blocks_held == 2 && ps.cap_refused == 2);

  consume(&d, "dec-1", params, db, 2);
  CU_ASSERT_TRUE(wait_finished(&d, "dec-1", false, T_MS));
  no_load_errors(&d);
  verify(&d, db, 2, 11);
  CU_ASSERT_TRUE(wait_finished(&p, "req-1", true, T_MS)); /* the consumer's FREE, with the capability */
  ps = stats(&p);
  hixl_kv_stats_ex ds = stats(&d);
  CU_ASSERT(ps.requests_held == 0 && ps.lease_expired == 0 && ps.cap_refused == 2);
  CU_ASSERT(ds.loads_done == 1 && ds.loads_failed == 0 && ds.cap_refused == 0);
  HixlEngineDestroy(h);
  free(params);
  side_down(&d);
  side_down(&p);
}

/* Pull: a FREE with a wrong capability (one bit off, another request's, garbage) is
 * refused; the request loads byte for byte. Whoever holds a request's capability may
 * free it: the hostile peer given req-b's frees req-b. */
static void test_free_wrong_cap(void) {
  struct side p, d;
  CU_ASSERT_FATAL(side_up(&p, "producer", "pull", 30000) && side_up(&d, "consumer", "pull", 30000));
  const uint64_t pa[2] = {0, 1}, pb[2] = {4, 7}, db[2] = {3, 2};
  char *a = produce(&p, "req-a", pa, 2, 21), *b = produce(&p, "req-b", pb, 2, 22);
  step(&p);
  struct kv_cap ca = params_cap(a), cb = params_cap(b);
  CU_ASSERT(memcmp(ca.b, cb.b, KV_CAP_LEN) != 0); /* each request its own */
  HixlEngine *h = hostile_up(p.addr);
  uint8_t ans[4096];
  REFUSED(call(h, p.addr, KV_SVC_FREE, "req-a", P_WRONG, &ca, NULL, ans, NULL), P_WRONG);
  REFUSED(call(h, p.addr, KV_SVC_FREE, "req-a", P_RIGHT, &cb, NULL, ans, NULL), P_WRONG); /* req-b's */
  REFUSED(call(h, p.addr, KV_SVC_FREE, "req-a", P_OTHER, NULL, NULL, ans, NULL), P_WRONG);
  none_finished(&p);
  hixl_kv_stats_ex ps = stats(&p);
  CU_ASSERT(ps.requests_held == 2 && ps.blocks_held == 4 && ps.cap_refused == 3);

  consume(&d, "dec-a", a, db, 2);
  CU_ASSERT_TRUE(wait_finished(&d, "dec-a", false, T_MS));
  no_load_errors(&d);
  verify(&d, db, 2, 21);
  CU_ASSERT_TRUE(wait_finished(&p, "req-a", true, T_MS));
  TU_ASSERT_OK(call(h, p.addr, KV_SVC_FREE, "req-b", P_RIGHT, &cb, NULL, ans, NULL));
  CU_ASSERT_TRUE(wait_finished(&p, "req-b", true, 0));
  ps = stats(&p);
  CU_ASSERT(ps.requests_held == 0 && ps.blocks_held == 0 && ps.cap_refused == 3);
  HixlEngineDestroy(h);
  free(a);
  free(b);
  side_down(&d);
  side_down(&p);
}

/* Pull: a FREE of an id the producer does not hold yet is remembered (the id never
 * held) only when it carries that id's capability, which the producer's scheduler
 * gave for it. Without one, with a garbage one, or before this worker bound any
 * metadata (nothing to check with), it is refused and forgotten: a later hold of the
 * id is held and loads byte for byte. A consumer that aborted early, with the
 * capability, still frees it before it is held. */
static void test_free_unknown_not_remembered(void) {
  struct side p, d;
  CU_ASSERT_FATAL(side_up(&p, "producer", "pull", 30000) && side_up(&d, "consumer", "pull", 30000));
  HixlEngine *h = hostile_up(p.addr);
  uint8_t ans[4096];
  /* No metadata bound yet: no key to check a capability with. */
  TU_ASSERT_STATUS(call(h, p.addr, KV_SVC_FREE, "req-early", P_OTHER, NULL, NULL, ans, NULL),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("cannot be checked");
  step(&p); /* a step: the worker has its scheduler's key now */
  const enum present pr[3] = {P_NONE, P_OLD, P_OTHER};
  for (int k = 0; k < 3; k++)
    REFUSED(call(h, p.addr, KV_SVC_FREE, "req-early", pr[k], NULL, NULL, ans, NULL), pr[k]);
  CU_ASSERT_EQUAL(stats(&p).cap_refused, 4);

  const uint64_t pb[3] = {1, 3, 5}, db[3] = {7, 0, 2};
  char *params = produce(&p, "req-early", pb, 3, 31);
  step(&p);
  none_finished(&p); /* held: not reported freed at its hold */
  hixl_kv_stats_ex ps = stats(&p);
  CU_ASSERT(ps.requests_held == 1 && ps.blocks_held == 3);
  consume(&d, "dec-early", params, db, 3);
  CU_ASSERT_TRUE(wait_finished(&d, "dec-early", false, T_MS));
  no_load_errors(&d);
  verify(&d, db, 3, 31);
  CU_ASSERT_TRUE(wait_finished(&p, "req-early", true, T_MS));

  /* The abort path: the FREE with the capability comes before the hold is bound. */
  const uint64_t qb[1] = {6};
  char *q = produce(&p, "req-abort", qb, 1, 32);
  struct kv_cap cq = params_cap(q);
  TU_ASSERT_OK(call(h, p.addr, KV_SVC_FREE, "req-abort", P_RIGHT, &cq, NULL, ans, NULL));
  step(&p);
  CU_ASSERT_TRUE(wait_finished(&p, "req-abort", true, 0)); /* reported at once, never held */
  ps = stats(&p);
  CU_ASSERT(ps.requests_held == 0 && ps.blocks_held == 0 && ps.lease_expired == 0 && ps.cap_refused == 4);
  HixlEngineDestroy(h);
  free(q);
  free(params);
  side_down(&d);
  side_down(&p);
}

/* Pull: a PIN without the capability (or a wrong one) is refused: it neither extends
 * the lease nor makes the hostile peer the request's consumer. A consumer with the
 * capability pins (HELD); the hostile peer pins without it all through the lease,
 * which still runs out, and the one cut off then is the consumer that pinned: its
 * READ fails, the hostile peer's link stays. */
static void test_pin_without_cap(void) {
  enum { LEASE_MS = 600 };
  struct side p;
  CU_ASSERT_FATAL(side_up(&p, "producer", "pull", LEASE_MS));
  /* Both peers linked before the hold is bound: the lease runs from the bind, and
   * linking (QPs in the soft-RoCE guest) may take longer than the lease. */
  HixlEngine *cons = hostile_up(p.addr), *h = hostile_up(p.addr);
  uint8_t ans[4096], *dst = tu_alloc_mem(BLOCK_BYTES, false), *hdst = tu_alloc_mem(BLOCK_BYTES, false);
  size_t n = 0;
  CU_ASSERT_FATAL(dst && hdst && tu_register(cons, dst, BLOCK_BYTES) && tu_register(h, hdst, BLOCK_BYTES));
  const uint64_t pb[2] = {2, 3};
  char *params = produce(&p, "req-pin", pb, 2, 41);
  struct kv_cap cap = params_cap(params);
  step(&p);
  int64_t pinned = tu_now_ms(); /* at most when the PIN set the lease running */
  TU_ASSERT_OK_FATAL(call(cons, p.addr, KV_SVC_PIN, "req-pin", P_RIGHT, &cap, NULL, ans, &n));
  CU_ASSERT_FATAL(n >= 1 && ans[0] == KV_PIN_HELD);
  REFUSED(call(h, p.addr, KV_SVC_PIN, "req-pin", P_WRONG, &cap, NULL, ans, &n), P_WRONG);
  unsigned refused = 1;
  bool expired = false;
  while (!expired && tu_now_ms() < pinned + LEASE_MS + T_MS) {
    REFUSED(call(h, p.addr, KV_SVC_PIN, "req-pin", refused % 2 ? P_NONE : P_OLD, NULL, NULL, ans, &n),
            refused % 2 ? P_NONE : P_OLD);
    refused++;
    expired = wait_finished(&p, "req-pin", true, 0);
    struct pollfd pfd = {.fd = p.efd, .events = POLLIN};
    poll(&pfd, 1, 20);
  }
  CU_ASSERT_TRUE_FATAL(expired);
  CU_ASSERT(tu_now_ms() - pinned >= LEASE_MS); /* the consumer's PIN ran its lease, no more */
  CU_ASSERT(refused >= 3);                     /* refused PINs came all through it */
  hixl_kv_stats_ex ps = stats(&p);
  CU_ASSERT(ps.lease_expired == 1 && ps.requests_held == 0 && ps.cap_refused == refused);
  HixlTransferOpDesc d = {(uintptr_t)dst, (uintptr_t)block_at(&p, 0, 0, 2), BLOCK_BYTES};
  HixlTransferOpDesc hd = {(uintptr_t)hdst, (uintptr_t)block_at(&p, 0, 0, 2), BLOCK_BYTES};
  CU_ASSERT_NOT_EQUAL(HixlEngineTransferSync(cons, p.addr, HIXL_READ, &d, 1, 5000), HIXL_SUCCESS);
  /* The hostile peer is not the consumer: its link was not cut (it is answered)... */
  REFUSED(call(h, p.addr, KV_SVC_PIN, "req-pin", P_NONE, NULL, NULL, ans, &n), P_NONE);
  /* ... and the blocks were never granted to it: the producer refuses its READ (tcp:
   * its CPU; rdma: no window); a same-host copy is not scoped (docs/security.md). */
  TU_ASSERT_STATUS(HixlEngineTransferSync(h, p.addr, HIXL_READ, &hd, 1, 5000),
                   scoped_here(h, p.addr) ? HIXL_FAILED : HIXL_SUCCESS);
  HixlEngineDestroy(h);
  HixlEngineDestroy(cons);
  tu_free_mem(dst, BLOCK_BYTES);
  tu_free_mem(hdst, BLOCK_BYTES);
  free(params);
  side_down(&p);
}

/* Scoped memory in pull mode: the consumer that PINs a request is granted its blocks
 * (its READ lands, byte for byte), a peer that did not is not (refused where the
 * producer serves the READ: tcp), and the FREE takes the grant back. */
static void test_pull_scoped(void) {
  struct side p;
  CU_ASSERT_FATAL(side_up(&p, "producer", "pull", 30000));
  const uint64_t pb[2] = {2, 3};
  char *params = produce(&p, "req-scope", pb, 2, 43);
  struct kv_cap cap = params_cap(params);
  step(&p);
  HixlEngine *cons = hostile_up(p.addr), *h = hostile_up(p.addr);
  uint8_t ans[4096], *dst = tu_alloc_mem(BLOCK_BYTES, false), *hdst = tu_alloc_mem(BLOCK_BYTES, false);
  size_t n = 0;
  CU_ASSERT_FATAL(dst && hdst && tu_register(cons, dst, BLOCK_BYTES) && tu_register(h, hdst, BLOCK_BYTES));
  const uint8_t *blk = block_at(&p, 0, 0, 2);
  HixlTransferOpDesc d = {(uintptr_t)dst, (uintptr_t)blk, BLOCK_BYTES};
  HixlTransferOpDesc hd = {(uintptr_t)hdst, (uintptr_t)blk, BLOCK_BYTES};
  bool scoped = scoped_here(cons, p.addr);
  /* Before any PIN: nobody's. */
  TU_ASSERT_STATUS(HixlEngineTransferSync(cons, p.addr, HIXL_READ, &d, 1, 5000),
                   scoped ? HIXL_FAILED : HIXL_SUCCESS);
  TU_ASSERT_OK_FATAL(call(cons, p.addr, KV_SVC_PIN, "req-scope", P_RIGHT, &cap, NULL, ans, &n));
  CU_ASSERT_FATAL(n >= 1 && ans[0] == KV_PIN_HELD);
  memset(dst, 0, BLOCK_BYTES);
  TU_ASSERT_OK(HixlEngineTransferSync(cons, p.addr, HIXL_READ, &d, 1, 5000));
  TU_ASSERT_SAME(dst, blk, BLOCK_BYTES, "the pinned block, read by its consumer");
  memset(hdst, 0, BLOCK_BYTES);
  TU_ASSERT_STATUS(HixlEngineTransferSync(h, p.addr, HIXL_READ, &hd, 1, 5000),
                   scoped ? HIXL_FAILED : HIXL_SUCCESS);
  if (scoped) CU_ASSERT_EQUAL(tu_check_byte(hdst, BLOCK_BYTES, 0), -1); /* nothing of it arrived */
  /* A WRITE into the block by the consumer: a grant is not a licence to a peer that did
   * not pin, and the pinned block's bytes stay the producer's. */
  TU_ASSERT_STATUS(HixlEngineTransferSync(h, p.addr, HIXL_WRITE, &hd, 1, 5000),
                   scoped ? HIXL_FAILED : HIXL_SUCCESS);
  if (scoped) TU_ASSERT_SAME(dst, blk, BLOCK_BYTES, "the pinned block after a hostile WRITE");
  TU_ASSERT_OK(call(cons, p.addr, KV_SVC_FREE, "req-scope", P_RIGHT, &cap, NULL, ans, &n));
  TU_ASSERT_STATUS(HixlEngineTransferSync(cons, p.addr, HIXL_READ, &d, 1, 5000),
                   scoped ? HIXL_FAILED : HIXL_SUCCESS);
  HixlEngineDestroy(h);
  HixlEngineDestroy(cons);
  tu_free_mem(dst, BLOCK_BYTES);
  tu_free_mem(hdst, BLOCK_BYTES);
  free(params);
  side_down(&p);
}

/* Pull, scoped memory, a consumer known by a long name (the 255 bytes the wire allows,
 * WIRE_MAX_NAME): its PINs (three, as a renewed load sends) grant it the request's
 * blocks once, and its FREE takes the grant back: its READs of every piece of them are
 * refused after, as before its first PIN. Issue 43: the plugin kept 80 bytes of a
 * peer's name, so each PIN granted again (the name kept never matched), the FREE
 * revoked a name nobody had, and the consumer kept reading the blocks after the host
 * reused them. */
static void test_pull_scoped_long_name(void) {
  struct side p;
  CU_ASSERT_FATAL(side_up(&p, "producer", "pull", 30000));
  const uint64_t pb[2] = {2, 3};
  char *params = produce(&p, "req-long", pb, 2, 47);
  struct kv_cap cap = params_cap(params);
  step(&p);
  char name[WIRE_MAX_NAME + 1];
  memset(name, 'n', WIRE_MAX_NAME);
  name[WIRE_MAX_NAME] = '\0';
  memcpy(name, "consumer-of-a-long-name.", 24);
  int fd = raw_peer_up(p.addr, name);
  CU_ASSERT_FATAL(fd >= 0);
  struct kv_out pin = call_body(KV_SVC_PIN, "req-long", P_RIGHT, &cap, NULL),
                fr = call_body(KV_SVC_FREE, "req-long", P_RIGHT, &cap, NULL);
  static uint8_t got[BLOCK_BYTES], ans[4096];
  size_t n = 0;
  uint64_t seq = 1;
  for (int l = 0; l < LAYERS; l++) /* before its PIN: not its to read */
    for (int v = 0; v < 2; v++)
      for (size_t j = 0; j < 2; j++)
        TU_ASSERT_STATUS(raw_read(fd, seq++, block_at(&p, l, v, pb[j]), got), HIXL_FAILED);
  for (int k = 0; k < 3; k++) {
    TU_ASSERT_OK_FATAL(raw_call(fd, seq++, &pin, ans, sizeof(ans), &n));
    CU_ASSERT_FATAL(n >= 1 && ans[0] == KV_PIN_HELD);
  }
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (size_t j = 0; j < 2; j++) {
        memset(got, 0, sizeof(got));
        TU_ASSERT_OK(raw_read(fd, seq++, block_at(&p, l, v, pb[j]), got));
        TU_ASSERT_PATTERN(got, BLOCK_BYTES, block_seed(47, l, v, j), "a pinned block, read by its consumer");
      }
  TU_ASSERT_OK(raw_call(fd, seq++, &fr, ans, sizeof(ans), &n));
  CU_ASSERT_TRUE(wait_finished(&p, "req-long", true, 0)); /* freed by the FREE, no lease waited out */
  hixl_kv_stats_ex ps = stats(&p);
  CU_ASSERT(ps.requests_held == 0 && ps.blocks_held == 0 && ps.lease_expired == 0 && ps.cap_refused == 0);
  for (int l = 0; l < LAYERS; l++) /* after its FREE: the grant is gone, every piece of it */
    for (int v = 0; v < 2; v++)
      for (size_t j = 0; j < 2; j++)
        TU_ASSERT_STATUS(raw_read(fd, seq++, block_at(&p, l, v, pb[j]), got), HIXL_FAILED);
  close(fd);
  free(pin.p);
  free(fr.p);
  free(params);
  side_down(&p);
}

/* The consumer of a push test and its legitimate producer, the hostile peer linked to
 * the consumer, which expects request id into blocks {3, 4}. */
struct push_case {
  struct side d, p;
  HixlEngine *h;
  char *params;
  struct kv_cap cap;
};

static const uint64_t push_db[2] = {3, 4}, push_pb[2] = {6, 1};

static void push_up(struct push_case *t, const char *id) {
  CU_ASSERT_FATAL(side_up(&t->d, "consumer", "push", 30000) && side_up(&t->p, "producer", "push", 30000));
  t->params = expect_push(&t->d, id, push_db, 2);
  t->cap = params_cap(t->params);
  t->h = hostile_up(t->d.addr);
}

/* The refused calls ended nothing and marked nothing; the legitimate producer pushes,
 * every byte lands, and the consumer counted refused refusals. */
static void push_then_down(struct push_case *t, const char *id, uint64_t refused) {
  none_finished(&t->d);
  hixl_kv_stats_ex ds = stats(&t->d);
  CU_ASSERT(ds.loads_done == 0 && ds.loads_failed == 0 && ds.cap_refused == refused);
  CU_ASSERT_EQUAL(tu_check_byte(t->d.kv, t->d.len, 0xEE), -1); /* nothing written */
  push(&t->p, "pre-1", t->params, push_pb, 2, 51);
  CU_ASSERT_TRUE(wait_finished(&t->d, id, false, T_MS));
  no_load_errors(&t->d);
  verify(&t->d, push_db, 2, 51);
  CU_ASSERT_TRUE(wait_finished(&t->p, "pre-1", true, T_MS));
  ds = stats(&t->d);
  CU_ASSERT(ds.loads_done == 1 && ds.loads_failed == 0 && ds.cap_refused == refused);
  hixl_kv_stats_ex ps = stats(&t->p);
  CU_ASSERT(ps.pushes_done == 1 && ps.pushes_failed == 0 && ps.cap_refused == 0);
  HixlEngineDestroy(t->h);
  free(t->params);
  side_down(&t->p);
  side_down(&t->d);
}

/* Push: an ABORT without the capability (none, protocol 3, wrong) is refused: the
 * expected push does not fail, and the producer's push lands byte for byte. */
static void test_abort_without_cap(void) {
  struct push_case t;
  push_up(&t, "push-a");
  struct kv_out why = {0};
  kv_put_str(&why, "a hostile abort", 15);
  uint8_t ans[4096];
  const enum present pr[3] = {P_NONE, P_OLD, P_WRONG};
  for (int k = 0; k < 3; k++)
    REFUSED(call(t.h, t.d.addr, KV_SVC_ABORT, "push-a", pr[k], &t.cap, &why, ans, NULL), pr[k]);
  free(why.p);
  push_then_down(&t, "push-a", 3);
}

/* Push, scoped memory: a peer that did not ACCEPT the request writes into the blocks the
 * consumer expects: refused where the consumer serves the WRITE (tcp), nothing lands;
 * the producer that ACCEPTs is granted them and its push lands byte for byte. */
static void test_push_scoped(void) {
  struct push_case t;
  push_up(&t, "push-s");
  if (scoped_here(t.h, t.d.addr)) {
    uint8_t *src = tu_alloc_mem(BLOCK_BYTES, false);
    CU_ASSERT_FATAL(src && tu_register(t.h, src, BLOCK_BYTES));
    memset(src, 0x5A, BLOCK_BYTES);
    for (int v = 0; v < 2; v++) {
      HixlTransferOpDesc d = {(uintptr_t)src, (uintptr_t)block_at(&t.d, 0, v, push_db[0]), BLOCK_BYTES};
      TU_ASSERT_STATUS(HixlEngineTransferSync(t.h, t.d.addr, HIXL_WRITE, &d, 1, 5000), HIXL_FAILED);
    }
    tu_free_mem(src, BLOCK_BYTES);
  }
  push_then_down(&t, "push-s", 0); /* nothing written; then the real push lands */
}

/* Push: LAYER and LAYERS notices without the capability (none, protocol 3, wrong,
 * garbage) are refused and mark nothing: the consumer does not report the request
 * received (its KV never came), until the producer's push lands, byte for byte. */
static void test_layers_without_cap(void) {
  struct push_case t;
  push_up(&t, "push-l");
  struct kv_out one = {0}, all = {0};
  kv_put_u32(&one, 0); /* LAYER 0 */
  kv_put_u32(&all, 0); /* LAYERS 0 .. LAYERS - 1: every layer */
  kv_put_u32(&all, LAYERS);
  uint8_t ans[4096];
  const enum present pr[4] = {P_NONE, P_OLD, P_WRONG, P_OTHER};
  for (int k = 0; k < 4; k++) {
    REFUSED(call(t.h, t.d.addr, KV_SVC_LAYER, "push-l", pr[k], &t.cap, &one, ans, NULL), pr[k]);
    REFUSED(call(t.h, t.d.addr, KV_SVC_LAYERS, "push-l", pr[k], &t.cap, &all, ans, NULL), pr[k]);
  }
  free(one.p);
  free(all.p);
  push_then_down(&t, "push-l", 8);
}

/* Push: an ACCEPT without the capability (none, protocol 3, wrong) is refused: the
 * answer is the reason, not the consumer's layout and planes. */
static void test_accept_without_cap(void) {
  struct push_case t;
  push_up(&t, "push-c");
  struct kv_out groups = {0};
  const uint32_t gn = 2;
  kv_put_groups(&groups, &gn, 1);
  uint8_t ans[4096];
  size_t n = 0;
  const enum present pr[3] = {P_NONE, P_OLD, P_WRONG};
  for (int k = 0; k < 3; k++) {
    REFUSED(call(t.h, t.d.addr, KV_SVC_ACCEPT, "push-c", pr[k], &t.cap, &groups, ans, &n), pr[k]);
    CU_ASSERT_PTR_NULL(strstr(HixlGetLastErrorMessage(), "layers=")); /* no layout in it */
  }
  free(groups.p);
  push_then_down(&t, "push-c", 3);
}

/* cap_refused counts each refused call, on any op, and nothing else: not malformed
 * calls, not calls that present the capability. A host whose hixl_kv_stats_ex ends
 * before cap_refused (ABI 1.3) never gets it written. */
static void test_refusals_counted(void) {
  struct side p;
  CU_ASSERT_FATAL(side_up(&p, "producer", "pull", 30000));
  const uint64_t pb[1] = {0};
  char *params = produce(&p, "req-n", pb, 1, 61);
  struct kv_cap cap = params_cap(params);
  step(&p);
  HixlEngine *h = hostile_up(p.addr);
  uint8_t ans[4096],
      op[6] = {KV_SVC_PIN, KV_SVC_FREE, KV_SVC_ACCEPT, KV_SVC_LAYER, KV_SVC_ABORT, KV_SVC_LAYERS};
  struct kv_out tail[6] = {{0}};
  kv_put_u32(&tail[3], 0);
  kv_put_str(&tail[4], "x", 1);
  kv_put_u32(&tail[5], 0);
  kv_put_u32(&tail[5], 2);
  const enum present pr[4] = {P_NONE, P_OLD, P_WRONG, P_OTHER};
  uint64_t want = 0;
  for (int o = 0; o < 6; o++)
    for (int k = 0; k < 4; k++, want++)
      REFUSED(call(h, p.addr, op[o], "req-n", pr[k], &cap, &tail[o], ans, NULL), pr[k]);
  CU_ASSERT_EQUAL(stats(&p).cap_refused, want);
  /* Malformed (a capability of 3 bytes), and a PIN with the capability: not counted. */
  struct kv_out bad = {0};
  kv_put_u8(&bad, KV_SVC_PROTO);
  kv_put_u8(&bad, KV_SVC_PIN);
  kv_put_str(&bad, "req-n", 5);
  kv_put_u8(&bad, 3);
  kv_put_raw(&bad, cap.b, 3);
  size_t n = 0;
  TU_ASSERT_STATUS(hixl_engine_call(h, p.addr, HIXL_SERVICE_KV, bad.p, bad.len, ans, sizeof(ans), &n, 5000),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("malformed");
  free(bad.p);
  TU_ASSERT_OK(call(h, p.addr, KV_SVC_PIN, "req-n", P_RIGHT, &cap, NULL, ans, &n));
  CU_ASSERT(n >= 1 && ans[0] == KV_PIN_HELD);
  hixl_kv_stats_ex ps = stats(&p);
  CU_ASSERT(ps.cap_refused == want && ps.requests_held == 1);
  hixl_kv_stats_ex old; /* a host built against 1.3's header */
  memset(&old, 0xA5, sizeof(old));
  old.size = (uint32_t)offsetof(hixl_kv_stats_ex, cap_refused);
  ST_IS(ops->get_stats_ex(p.worker, &old), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(old.size, offsetof(hixl_kv_stats_ex, cap_refused));
  CU_ASSERT_EQUAL(old.requests_held, 1);
  CU_ASSERT_EQUAL(old.cap_refused, 0xA5A5A5A5A5A5A5A5ull);
  for (int o = 0; o < 6; o++) free(tail[o].p);
  HixlEngineDestroy(h);
  free(params);
  side_down(&p);
}

/* Pull: RELEASE (a consumer rank that reads nothing of this producer rank lets go of
 * its copy in one call) is refused without the capability or with a wrong one; with
 * it, before the hold is bound it answers NOT_YET and remembers nothing (the hold that
 * comes next is held and loads byte for byte), once held it answers HELD and frees the
 * request at once, and after that GONE. */
static void test_release(void) {
  struct side p, d;
  CU_ASSERT_FATAL(side_up(&p, "producer", "pull", 30000) && side_up(&d, "consumer", "pull", 30000));
  HixlEngine *h = hostile_up(p.addr);
  uint8_t ans[4096];
  size_t n = 0;
  step(&p); /* the worker has its scheduler's key */
  const uint64_t pb[2] = {0, 4}, db[2] = {5, 1}, qb[2] = {2, 6};
  char *a = produce(&p, "req-rel", pb, 2, 51), *b = produce(&p, "req-rel2", qb, 2, 52);
  struct kv_cap ca = params_cap(a), cb = params_cap(b);
  REFUSED(call(h, p.addr, KV_SVC_RELEASE, "req-rel", P_NONE, NULL, NULL, ans, &n), P_NONE);
  REFUSED(call(h, p.addr, KV_SVC_RELEASE, "req-rel", P_WRONG, &ca, NULL, ans, &n), P_WRONG);
  TU_ASSERT_OK(call(h, p.addr, KV_SVC_RELEASE, "req-rel", P_RIGHT, &ca, NULL, ans, &n));
  CU_ASSERT(n == 1 && ans[0] == KV_PIN_NOT_YET); /* not bound yet: nothing done, nothing kept */
  step(&p);
  none_finished(&p);
  hixl_kv_stats_ex ps = stats(&p);
  CU_ASSERT(ps.requests_held == 2 && ps.blocks_held == 4 && ps.cap_refused == 2);
  consume(&d, "dec-rel", a, db, 2); /* the early RELEASE freed nothing: it loads */
  CU_ASSERT_TRUE(wait_finished(&d, "dec-rel", false, T_MS));
  no_load_errors(&d);
  verify(&d, db, 2, 51);
  CU_ASSERT_TRUE(wait_finished(&p, "req-rel", true, T_MS));
  TU_ASSERT_OK(call(h, p.addr, KV_SVC_RELEASE, "req-rel2", P_RIGHT, &cb, NULL, ans, &n));
  CU_ASSERT(n == 1 && ans[0] == KV_PIN_HELD);
  CU_ASSERT_TRUE(wait_finished(&p, "req-rel2", true, 0)); /* freed by it, no lease waited out */
  TU_ASSERT_OK(call(h, p.addr, KV_SVC_RELEASE, "req-rel2", P_RIGHT, &cb, NULL, ans, &n));
  CU_ASSERT(n >= 1 && ans[0] == KV_PIN_GONE);
  ps = stats(&p);
  CU_ASSERT(ps.requests_held == 0 && ps.blocks_held == 0 && ps.lease_expired == 0 && ps.cap_refused == 2);
  HixlEngineDestroy(h);
  free(a);
  free(b);
  side_down(&d);
  side_down(&p);
}

/* Push: two producers accepted the expected push (tensor parallelism: each writes its
 * own heads; here two engines as rank 0 of world 1), and one of them ABORTs it. Once
 * get_finished reports the load failed (its blocks in the load errors, the host may
 * reuse them), the other one, still writing, lands nothing more in them: its grant is
 * revoked and, as when the push expires, its links are cut (a same-host copy is not
 * scoped, so the revoke alone does not stop it). */
static void abort_cuts_body(void) {
  struct push_case t;
  push_up(&t, "push-ab");
  HixlEngine *h2 = hostile_up(t.d.addr);
  struct kv_out groups = {0}, why = {0};
  const uint32_t gn = 2;
  kv_put_groups(&groups, &gn, 1);
  kv_put_str(&why, "rank gave up", 12);
  uint8_t ans[4096], *src = tu_alloc_mem(BLOCK_BYTES, false);
  size_t n = 0;
  CU_ASSERT_FATAL(src && tu_register(t.h, src, BLOCK_BYTES));
  memset(src, 0x5A, BLOCK_BYTES);
  uint8_t *blk = block_at(&t.d, 0, 0, push_db[0]);
  HixlTransferOpDesc w = {(uintptr_t)src, (uintptr_t)blk, BLOCK_BYTES};
  TU_ASSERT_OK_FATAL(call(t.h, t.d.addr, KV_SVC_ACCEPT, "push-ab", P_RIGHT, &t.cap, &groups, ans, &n));
  CU_ASSERT_FATAL(n >= 1 && ans[0] == KV_PIN_HELD);
  TU_ASSERT_OK_FATAL(call(h2, t.d.addr, KV_SVC_ACCEPT, "push-ab", P_RIGHT, &t.cap, &groups, ans, &n));
  CU_ASSERT_FATAL(n >= 1 && ans[0] == KV_PIN_HELD);
  TU_ASSERT_OK(HixlEngineTransferSync(t.h, t.d.addr, HIXL_WRITE, &w, 1, 5000)); /* layer 0, accepted */
  TU_ASSERT_OK(call(h2, t.d.addr, KV_SVC_ABORT, "push-ab", P_RIGHT, &t.cap, &why, ans, &n));
  CU_ASSERT_TRUE(wait_finished(&t.d, "push-ab", false, 0)); /* failed: the host may reuse the blocks */
  hixl_kv_blocks e = {0};
  ST_IS(ops->get_block_ids_with_load_errors(t.d.worker, &e), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(e.count, 2);
  ops->free_buffer(&e.raw);
  memset(blk, 0xEE, BLOCK_BYTES); /* the host's next request computes into it */
  HixlStatus late = HixlEngineTransferSync(t.h, t.d.addr, HIXL_WRITE, &w, 1, 5000);
  CU_ASSERT_NOT_EQUAL(late, HIXL_SUCCESS);
  CU_ASSERT_EQUAL(tu_check_byte(blk, BLOCK_BYTES, 0xEE), -1); /* nothing of the late write landed */
  printf("  [the other producer's WRITE after the ABORT was reported: %s]\n", HixlStatusName(late));
  free(groups.p);
  free(why.p);
  HixlEngineDestroy(h2);
  HixlEngineDestroy(t.h);
  tu_free_mem(src, BLOCK_BYTES);
  free(t.params);
  side_down(&t.p);
  side_down(&t.d);
}

/* With a key, as a deployment runs: two engines of one process then link by same-host
 * copies under auto (without one, tcp), which the revoke alone does not stop. Before,
 * the late WRITE landed over shm (tcp refused it already). */
static void test_abort_cuts_other_producers(void) {
  const char *had = getenv("HIXL_AUTH_KEY_FILE");
  CU_ASSERT_FATAL(tu_key_file() != NULL);
  if (!had) setenv("HIXL_AUTH_KEY_FILE", tu_key_file(), 1);
  abort_cuts_body();
  if (!had) unsetenv("HIXL_AUTH_KEY_FILE");
}

int main(int argc, char **argv) {
  int rc = tu_child_main(argc, argv);
  if (rc >= 0) return rc;
  so = dlopen(HIXL_KV_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!so) {
    fprintf(stderr, "dlopen %s: %s\n", HIXL_KV_PLUGIN_PATH, dlerror());
    return 1;
  }
  hixl_kv_entry_fn entry = (hixl_kv_entry_fn)dlsym(so, HIXL_KV_ENTRY_SYMBOL);
  char err[256] = "";
  if (!entry || entry(HIXL_KV_ABI_MAJOR, &ops, err, sizeof(err)) != HIXL_KV_SUCCESS) {
    fprintf(stderr, "entry: %s\n", err);
    return 1;
  }
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  CU_pSuite s = CU_add_suite("plugin KV service: request capabilities, a hostile peer", NULL, NULL);
  CU_add_test(s, "pull: FREE without the capability is refused; the request still loads",
              test_free_without_cap);
  CU_add_test(s, "pull: FREE with a wrong capability is refused", test_free_wrong_cap);
  CU_add_test(s, "pull: FREE of an unknown id without its capability is not remembered",
              test_free_unknown_not_remembered);
  CU_add_test(s, "pull: PIN without the capability neither extends the lease nor takes the request over",
              test_pin_without_cap);
  CU_add_test(s, "pull: scoped memory: the PINning consumer reads, another peer does not, FREE ends it",
              test_pull_scoped);
  CU_add_test(s, "pull: scoped memory: a consumer of a 255-byte name is granted once, FREE ends it",
              test_pull_scoped_long_name);
  CU_add_test(s, "push: ABORT without the capability is refused", test_abort_without_cap);
  CU_add_test(s, "push: scoped memory: a peer that did not ACCEPT writes nothing", test_push_scoped);
  CU_add_test(s, "push: LAYER and LAYERS without the capability are refused and mark nothing",
              test_layers_without_cap);
  CU_add_test(s, "push: ACCEPT without the capability is refused", test_accept_without_cap);
  CU_add_test(
      s, "push: an ABORT by one producer cuts off the others that accepted, before the failure is reported",
      test_abort_cuts_other_producers);
  CU_add_test(s, "cap_refused counts each refusal and nothing else", test_refusals_counted);
  CU_add_test(s,
              "pull: RELEASE: refused without the capability, NOT_YET before the hold, then HELD and freed",
              test_release);
  if (CU_get_error() != CUE_SUCCESS) return 1;
  int result = tu_run_registry();
  dlclose(so);
  return result;
}
