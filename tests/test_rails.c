/* Rails (several links per peer, docs/rails.md) on loopback: the option's checks, the
 * handshake that finds the peer's rails, striping (every rail carries bytes, every
 * byte arrives), failover when a rail's socket resets mid-transfer (its chunks move to
 * the others, the transfer succeeds), the prober bringing a rail back, a slow link
 * that is not a failed rail, a peer without rails, and each rail's own table of the
 * peer's ranges whatever order rails are read in. Both engines live in this
 * process; the faults are made through the engines' internals (a socket shut, a
 * target link that stops reading). A rail whose path is gone (a veth set down) is the
 * shaped two-namespace bed's case, in integration/rails/. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/api_int.h"
#include "engine/engine_int.h"
#include "test_util.h"
#include "util/sock.h"

#define MIB      (1u << 20)
#define BUF_LEN  (16u * MIB)
#define T_ADDR   "127.0.0.1"
#define T_RAILS  "127.0.0.2,127.0.0.3"
#define I_RAILS  "127.0.0.1,127.0.0.2,127.0.0.3"
#define TIMEOUT  10000
#define POLL_MS  20
#define STALL_MS "200"
#define PROBE_MS "100"

struct pair {
  HixlEngine *target, *init;
  char addr[TU_ADDR_LEN];
  uint8_t *tbuf, *ibuf;
  HixlMemHandle th, ih;
};

static bool pair_up(struct pair *p, const char *t_rails, const char *i_rails) {
  memset(p, 0, sizeof(*p));
  uint16_t port = tu_free_port();
  snprintf(p->addr, sizeof(p->addr), T_ADDR ":%u", port);
  HixlOption t_opts[] = {{"Rails", t_rails}, {"RailStallMs", STALL_MS}, {"RailProbeMs", PROBE_MS}};
  HixlOption i_opts[] = {{"Rails", i_rails}, {"RailStallMs", STALL_MS}, {"RailProbeMs", PROBE_MS}};
  p->target = tu_engine_start_opts(p->addr, "tcp", t_opts, t_rails ? 3 : 0);
  p->init = tu_engine_start_opts(T_ADDR, "tcp", i_opts, i_rails ? 3 : 0);
  p->tbuf = tu_alloc_mem(BUF_LEN, false);
  p->ibuf = tu_alloc_mem(BUF_LEN, false);
  if (!p->target || !p->init || !p->tbuf || !p->ibuf) return false;
  tu_fill(p->tbuf, BUF_LEN, 31);
  p->th = tu_register(p->target, p->tbuf, BUF_LEN);
  p->ih = tu_register(p->init, p->ibuf, BUF_LEN);
  return p->th && p->ih && HixlEngineConnect(p->init, p->addr, TIMEOUT) == HIXL_SUCCESS;
}

static void pair_down(struct pair *p) {
  if (p->init) HixlEngineDestroy(p->init);
  if (p->target) HixlEngineDestroy(p->target);
  if (p->tbuf) tu_free_mem(p->tbuf, BUF_LEN);
  if (p->ibuf) tu_free_mem(p->ibuf, BUF_LEN);
}

static size_t rails_of(struct pair *p, struct hixl_rail_info *out) {
  size_t n = 0;
  TU_ASSERT_OK(hixl_engine_rails(p->init, p->addr, out, HIXL_RAILS_MAX, &n));
  return n;
}

/* Until deadline: are all n rails up? */
static bool wait_all_up(struct pair *p, size_t want, int64_t deadline_ms) {
  struct hixl_rail_info ri[HIXL_RAILS_MAX];
  do {
    size_t n = 0, up = 0;
    if (hixl_engine_rails(p->init, p->addr, ri, HIXL_RAILS_MAX, &n) != HIXL_SUCCESS) return false;
    for (size_t k = 0; k < n; k++) up += strcmp(ri[k].state, "up") == 0;
    if (n == want && up == want) return true;
    usleep(POLL_MS * 1000); /* polling a condition with a deadline, not a sleep for order */
  } while (tu_now_ms() < deadline_ms);
  return false;
}

/* The pair with three rails up; false: the setup failed (reported, torn down). */
static bool three_up(struct pair *p) {
  if (pair_up(p, T_RAILS, I_RAILS) && wait_all_up(p, 3, tu_now_ms() + 5000)) return true;
  CU_FAIL("setup");
  pair_down(p);
  return false;
}

/* req ends COMPLETED within the timeout, and every byte of the initiator's buffer came. */
static void completes(struct pair *p, HixlTransferReq req, const char *what) {
  HixlTransferStatus fin;
  TU_ASSERT_OK(tu_wait_request(p->init, req, tu_now_ms() + TIMEOUT, &fin));
  CU_ASSERT_EQUAL(fin, HIXL_TRANSFER_COMPLETED);
  TU_ASSERT_PATTERN(p->ibuf, BUF_LEN, 31, what);
}

static HixlStatus read_all(struct pair *p) {
  HixlTransferOpDesc d = {
      .local_addr = (uintptr_t)p->ibuf, .remote_addr = (uintptr_t)p->tbuf, .len = BUF_LEN};
  memset(p->ibuf, 0, BUF_LEN);
  return HixlEngineTransferSync(p->init, p->addr, HIXL_READ, &d, 1, TIMEOUT);
}

static void test_options(void) {
  static const char *bad[] = {
      "127.0.0.1,", "127.0.0.1,127.0.0.1",
      "1.2.3",      "0.0.0.0",
      "a,b",        "1.1.1.1,1.1.1.2,1.1.1.3,1.1.1.4,1.1.1.5,1.1.1.6,1.1.1.7,1.1.1.8,1.1.1.9"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    TU_ASSERT_STATUS(HixlEngineCheckOption("Rails", bad[i]), HIXL_PARAM_INVALID);
    TU_ASSERT_ERRMSG_HAS("Rails");
  }
  TU_ASSERT_OK(HixlEngineCheckOption("Rails", ""));
  TU_ASSERT_OK(HixlEngineCheckOption("Rails", "auto"));
  TU_ASSERT_OK(HixlEngineCheckOption("Rails", "10.0.0.1,10.0.1.1"));
  TU_ASSERT_STATUS(HixlEngineCheckOption("RailStallMs", "99"), HIXL_PARAM_INVALID);
  TU_ASSERT_STATUS(HixlEngineCheckOption("RailProbeMs", "49"), HIXL_PARAM_INVALID);
  /* An engine listening on 0.0.0.0 has no one address per rail. */
  HixlEngine *e = NULL;
  HixlOption o[] = {{"Rails", "auto"}};
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  char any[TU_ADDR_LEN];
  snprintf(any, sizeof(any), "0.0.0.0:%u", tu_free_port());
  TU_ASSERT_STATUS(HixlEngineInitialize(e, any, o, 1), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("0.0.0.0");
  HixlEngineDestroy(e);
}

/* Three rails found in the handshake; a 16 MiB READ and WRITE striped over all of them. */
static void test_striping(void) {
  struct pair p;
  if (!three_up(&p)) return;
  TU_ASSERT_OK(read_all(&p));
  TU_ASSERT_PATTERN(p.ibuf, BUF_LEN, 31, "striped READ");
  struct hixl_rail_info ri[HIXL_RAILS_MAX];
  size_t n = rails_of(&p, ri);
  CU_ASSERT_EQUAL(n, 3);
  uint64_t sum = 0;
  for (size_t k = 0; k < n; k++) {
    if (ri[k].bytes == 0) tu_fail(__FILE__, __LINE__, "rail %zu (%s) carried no byte", k, ri[k].remote);
    sum += ri[k].bytes;
  }
  CU_ASSERT_EQUAL(sum, BUF_LEN);
  CU_ASSERT_EQUAL(ri[0].control, 1);
  if (strncmp(ri[1].remote, "127.0.0.2:", 10) != 0 || strncmp(ri[2].remote, "127.0.0.3:", 10) != 0)
    tu_fail(__FILE__, __LINE__, "rails 1, 2 are %s, %s: not the target's rail addresses", ri[1].remote,
            ri[2].remote);
  /* WRITE back a new pattern, striped too, and read the target's memory. */
  tu_fill(p.ibuf, BUF_LEN, 47);
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)p.ibuf, .remote_addr = (uintptr_t)p.tbuf, .len = BUF_LEN};
  TU_ASSERT_OK(HixlEngineTransferSync(p.init, p.addr, HIXL_WRITE, &d, 1, TIMEOUT));
  TU_ASSERT_PATTERN(p.tbuf, BUF_LEN, 47, "striped WRITE, at the target");
  n = rails_of(&p, ri);
  sum = 0;
  for (size_t k = 0; k < n; k++) sum += ri[k].bytes;
  CU_ASSERT_EQUAL(sum, 2ull * BUF_LEN);
  pair_down(&p);
}

/* A target without Rails: one link, as before; the transfer works. */
static void test_peer_without_rails(void) {
  struct pair p;
  if (!pair_up(&p, NULL, I_RAILS)) {
    CU_FAIL("setup");
    pair_down(&p);
    return;
  }
  struct hixl_rail_info ri[HIXL_RAILS_MAX];
  CU_ASSERT_EQUAL(rails_of(&p, ri), 0);
  TU_ASSERT_OK(read_all(&p));
  TU_ASSERT_PATTERN(p.ibuf, BUF_LEN, 31, "READ over one link");
  pair_down(&p);
}

/* The initiator's rail k link, found through its peer (lock held by the caller). */
static struct conn *rail_conn(struct pair *p, uint32_t k) {
  for (struct peer *q = p->init->peers; q; q = q->next)
    if (k < q->n_rails) return q->rails[k].conn;
  return NULL;
}

/* Rail 1's socket resets while every rail has chunks queued: its chunks are retried on
 * the others, every byte arrives, and the prober brings rail 1 back. The target's
 * lock is held while the READ is submitted and the socket shut, so that no chunk is
 * answered before (deterministic: rail 1 holds chunks when it dies). */
static void test_reset_fails_over(void) {
  struct pair p;
  if (!three_up(&p)) return;
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)p.ibuf, .remote_addr = (uintptr_t)p.tbuf, .len = BUF_LEN};
  HixlTransferReq req = NULL;
  memset(p.ibuf, 0, BUF_LEN);
  pthread_mutex_lock(&p.target->lock);
  HixlStatus st = HixlEngineTransferAsync(p.init, p.addr, HIXL_READ, &d, 1, TIMEOUT, NULL, &req);
  pthread_mutex_lock(&p.init->lock);
  struct conn *c = rail_conn(&p, 1);
  bool loaded = c && c->rail_load > 0;
  if (c) shutdown(c->fd, SHUT_RDWR);
  pthread_mutex_unlock(&p.init->lock);
  pthread_mutex_unlock(&p.target->lock);
  TU_ASSERT_OK(st);
  CU_ASSERT_TRUE(loaded);
  completes(&p, req, "READ after rail 1 reset");
  struct hixl_rail_info ri[HIXL_RAILS_MAX];
  rails_of(&p, ri);
  CU_ASSERT_TRUE(ri[1].failures >= 1);
  CU_ASSERT_TRUE(ri[1].retried >= 1);
  CU_ASSERT_TRUE(ri[1].last_down[0] != '\0'); /* why, for an operator */
  CU_ASSERT_STRING_EQUAL(ri[0].last_down, "");
  /* The prober dials it again; then it carries bytes again. */
  CU_ASSERT_TRUE_FATAL(wait_all_up(&p, 3, tu_now_ms() + 5000));
  uint64_t before = ri[1].bytes;
  TU_ASSERT_OK(read_all(&p));
  TU_ASSERT_PATTERN(p.ibuf, BUF_LEN, 31, "READ after rail 1 came back");
  rails_of(&p, ri);
  CU_ASSERT_TRUE(ri[1].bytes > before);
  pair_down(&p);
}

/* The control rail (0) resets: rail 1 carries the control frames, a SYNC-needing
 * transfer and a notification still work, and rail 0 comes back as a data rail. */
static void test_control_rail_moves(void) {
  struct pair p;
  if (!three_up(&p)) return;
  pthread_mutex_lock(&p.init->lock);
  struct conn *c = rail_conn(&p, 0);
  if (c) shutdown(c->fd, SHUT_RDWR);
  pthread_mutex_unlock(&p.init->lock);
  /* Whatever the moment the reset is seen, the next calls succeed on the rails left. */
  TU_ASSERT_OK(read_all(&p));
  TU_ASSERT_PATTERN(p.ibuf, BUF_LEN, 31, "READ after the control rail reset");
  TU_ASSERT_OK(HixlEngineSendNotify(p.init, p.addr, &(HixlNotifyDesc){.name = "rails", .msg = "m"}, TIMEOUT));
  CU_ASSERT_TRUE(wait_all_up(&p, 3, tu_now_ms() + 5000));
  struct hixl_rail_info ri[HIXL_RAILS_MAX];
  rails_of(&p, ri);
  CU_ASSERT_TRUE(ri[0].failures >= 1);
  CU_ASSERT_EQUAL(ri[0].control + ri[1].control + ri[2].control, 1);
  pair_down(&p);
}

/* Rail 1's target link stops reading for a while (a peer that is slow on one link, its
 * kernel still acknowledging): not a failed rail. Nothing is failed over; the READ
 * completes once the link reads again. (A rail whose path is gone, its data
 * unacknowledged, is taken out: integration/rails/ sets a veth down for that.) */
static void test_slow_is_not_failed(void) {
  struct pair p;
  if (!three_up(&p)) return;
  struct sockaddr_in here;
  socklen_t sl = sizeof(here);
  pthread_mutex_lock(&p.init->lock);
  struct conn *c = rail_conn(&p, 1);
  int ok = c ? getsockname(c->fd, (struct sockaddr *)&here, &sl) : -1;
  pthread_mutex_unlock(&p.init->lock);
  CU_ASSERT_EQUAL_FATAL(ok, 0);
  struct conn *slow = NULL;
  pthread_mutex_lock(&p.target->lock);
  for (struct conn *t = p.target->conns; t; t = t->next) {
    struct sockaddr_in there;
    socklen_t tl = sizeof(there);
    if (t->role == CONN_TARGET && getpeername(t->fd, (struct sockaddr *)&there, &tl) == 0 &&
        there.sin_port == here.sin_port && there.sin_addr.s_addr == here.sin_addr.s_addr) {
      t->stall |= LINK_STALL_MODULE; /* reads nothing more */
      link_conn_arm(t);
      slow = t;
    }
  }
  pthread_mutex_unlock(&p.target->lock);
  CU_ASSERT_TRUE_FATAL(slow != NULL);
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)p.ibuf, .remote_addr = (uintptr_t)p.tbuf, .len = BUF_LEN};
  HixlTransferReq req = NULL;
  memset(p.ibuf, 0, BUF_LEN);
  TU_ASSERT_OK_FATAL(HixlEngineTransferAsync(p.init, p.addr, HIXL_READ, &d, 1, TIMEOUT, NULL, &req));
  /* The fault lasts three stall periods; the request waits all along. */
  int64_t until = tu_now_ms() + 3 * atoi(STALL_MS);
  HixlTransferStatus s = HIXL_TRANSFER_WAITING;
  while (tu_now_ms() < until && s == HIXL_TRANSFER_WAITING) {
    TU_ASSERT_OK(HixlEngineGetTransferStatus(p.init, req, &s));
    usleep(POLL_MS * 1000);
  }
  CU_ASSERT_EQUAL(s, HIXL_TRANSFER_WAITING);
  pthread_mutex_lock(&p.target->lock);
  slow->stall &= (uint8_t)~LINK_STALL_MODULE;
  link_conn_arm(slow);
  pthread_mutex_unlock(&p.target->lock);
  completes(&p, req, "READ after rail 1's target read again");
  struct hixl_rail_info ri[HIXL_RAILS_MAX];
  rails_of(&p, ri);
  CU_ASSERT_EQUAL(ri[1].failures, 0);
  CU_ASSERT_EQUAL(ri[1].retried, 0);
  CU_ASSERT_STRING_EQUAL(ri[1].state, "up");
  CU_ASSERT_STRING_EQUAL(ri[1].last_down, "");
  pair_down(&p);
}

/* Each rail's link keeps its own table of the peer's ranges, with its own keys (each
 * rail's device has its own: rdma), whichever rail's link told a range first; a
 * one-sided rail is used for a range only when its own table holds it, a tcp rail
 * always; a chunk carries the key of the rail it goes on. */
static void test_rail_keys(void) {
  static const struct xport_ops one_sided = {.name = "one-sided", .flags = XPORT_ONE_SIDED};
  static const struct xport_ops stream = {.name = "stream", .flags = XPORT_IN_STREAM};
  struct peer p;
  memset(&p, 0, sizeof(p));
  static const uint8_t tag[] = "kv";
  struct wire_mem_entry me = {.addr = 0x10000, .len = 4096, .rkey = 0x222, .tag_len = 2, .tag = tag};
  link_peer_add_mem(&p, &me, 1); /* rail 1's MEM_ADD came first */
  CU_ASSERT_PTR_NULL(memtab_find(&p.rtab, 0x10000, 4096));
  const struct remote_mem *r1m = (const struct remote_mem *)memtab_find(&p.rails[1].rtab, 0x10000, 4096);
  CU_ASSERT_PTR_NOT_NULL_FATAL(r1m);
  CU_ASSERT_EQUAL(r1m->rkey, 0x222u);
  CU_ASSERT_STRING_EQUAL(r1m->tag, "kv");
  struct conn r0 = {.rail = 0, .xp = &one_sided, .peer = &p}, r1 = {.rail = 1, .xp = &one_sided, .peer = &p};
  struct conn t0 = {.rail = 0, .xp = &stream, .peer = &p}, solo = {.rail = -1, .xp = &one_sided, .peer = &p};
  CU_ASSERT_FALSE(link_rail_keyed(&r0, r1m));
  CU_ASSERT_TRUE(link_rail_keyed(&r1, r1m));
  CU_ASSERT_TRUE(link_rail_keyed(&t0, r1m));
  CU_ASSERT_TRUE(link_rail_keyed(&r0, NULL));
  CU_ASSERT_EQUAL(link_rail_rkey(&r1, r1m), 0x222u);
  me.rkey = 0x111;
  link_peer_add_mem(&p, &me, 0); /* then rail 0's: in its own table, with its own key */
  const struct remote_mem *rm = (const struct remote_mem *)memtab_find(&p.rtab, 0x10000, 4096);
  CU_ASSERT_PTR_NOT_NULL_FATAL(rm);
  CU_ASSERT_EQUAL(p.rtab.count, 1u);
  CU_ASSERT_EQUAL(p.rails[1].rtab.count, 1u);
  CU_ASSERT_TRUE(link_rail_keyed(&r0, rm));
  CU_ASSERT_TRUE(link_rail_keyed(&r1, rm));
  CU_ASSERT_EQUAL(link_rail_rkey(&r0, rm), 0x111u);
  CU_ASSERT_EQUAL(link_rail_rkey(&r1, rm), 0x222u);   /* rail 0's entry, rail 1's key */
  CU_ASSERT_EQUAL(link_rail_rkey(&solo, rm), 0x111u); /* a link without rails: its table's key */
  CU_ASSERT_TRUE(link_rail_keyed(&solo, rm));
  me.rkey = 0x333;
  link_peer_add_mem(&p, &me, 1); /* re-advertised on rail 1 (registered again): the new key */
  CU_ASSERT_EQUAL(link_rail_rkey(&r1, rm), 0x333u);
  CU_ASSERT_EQUAL(link_rail_rkey(&r0, rm), 0x111u);
  link_peer_add_mem(&p, &me, HIXL_RAILS_MAX); /* out of range: taken as rail 0 */
  CU_ASSERT_EQUAL(link_rail_rkey(&r0, rm), 0x333u);
  link_peer_del_mem(&p, 0x10000, 4096, 1); /* withdrawn on rail 1: rail 0 keeps it */
  CU_ASSERT_FALSE(link_rail_keyed(&r1, rm));
  CU_ASSERT_EQUAL(link_rail_rkey(&r1, rm), 0x333u); /* rail 1 is not picked for it; rm's own key */
  CU_ASSERT_PTR_EQUAL(memtab_find(&p.rtab, 0x10000, 4096), rm);
  link_peer_rtab_free(&p.rtab);
  link_peer_rtab_free(&p.rails[1].rtab);
}

/* ---- each rail's view of the peer's table, whatever order rails are read in ---- */

/* A link of p's as rail k, on one end of a socketpair (the other end in *far), in e's
 * list and watched by no epoll: the test reads it itself (link_take_pending). Lock held. */
static struct conn *table_rail(HixlEngine *e, struct peer *p, uint32_t k, int *far) {
  int sv[2];
  struct conn *c = NULL;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) return NULL;
  if (sock_set_nonblock(sv[0], true) < 0 || !(c = link_conn_new(e, sv[0], CONN_INITIATOR))) {
    close(sv[0]);
    close(sv[1]);
    return NULL;
  }
  c->next = e->conns;
  e->conns = c;
  c->peer = p;
  c->rail = (int)k;
  p->rails[k].conn = c;
  *far = sv[1];
  return c;
}

/* The target says MEM_ADD (with rkey) or MEM_DEL of [addr, +len) on rail link c (its
 * far end far), and c reads it now. */
static void table_say(struct conn *c, int far, enum wire_type type, uint64_t addr, uint64_t len,
                      uint32_t rkey) {
  uint8_t buf[128];
  struct wire_wr w;
  wire_begin(&w, buf, sizeof(buf), type);
  wire_put_mem_entry(&w, addr, len, rkey, type == WIRE_MEM_ADD ? "kv" : NULL);
  size_t n = wire_end(&w, 0);
  CU_ASSERT_EQUAL(write(far, buf, n), (ssize_t)n);
  link_take_pending(c);
}

/* The key an RDMA chunk into [addr, +len) would carry on rail k, the op looked up in
 * the control rail's (rail 0's) table; 0: the control rail has no entry, or rail k
 * would not carry it. */
static uint32_t table_key(struct peer *p, uint32_t k, uint64_t addr, uint64_t len) {
  static const struct xport_ops one_sided = {.name = "one-sided", .flags = XPORT_ONE_SIDED};
  struct conn r = {.rail = (int)k, .xp = &one_sided, .peer = p};
  const struct remote_mem *rm = (const struct remote_mem *)memtab_find(&p->rtab, addr, len);
  return rm && link_rail_keyed(&r, rm) ? link_rail_rkey(&r, rm) : 0;
}

/* A range registered again (FreeMem then AllocMem at the same address, or
 * DeregisterMem then RegisterMem), told on both rails (MEM_DEL, MEM_ADD with each
 * rail's device's key), the rails read in either order, one rail lagging behind
 * several registrations, one of another length: the control rail keeps the range and
 * its key throughout, and each rail ends with its own new key. Before, one table for
 * every rail: a rail's MEM_DEL read after the other rail's MEM_DEL and MEM_ADD removed
 * the new entry; the lagging rail's MEM_ADD made it again with its own key only, so
 * the control rail had none (RDMA: every op into the range staged or refused
 * PARAM_INVALID until the next registration or reconnect; tcp: the range unknown
 * until the lagging rail's MEM_ADD was read). Driven in one hold of the lock. */
static void test_rereg_every_rail_keyed(void) {
  enum { R = 0x10000, L = 4096 };
  int far[2] = {-1, -1};
  struct conn *c[2] = {NULL, NULL};
  HixlEngine *e = tu_engine_start_opts(T_ADDR, "tcp", NULL, 0);
  struct peer *p = calloc(1, sizeof(*p));
  CU_ASSERT_FATAL(e && p);
  pthread_mutex_lock(&e->lock);
  p->n_rails = 2;
  c[0] = table_rail(e, p, 0, &far[0]);
  c[1] = table_rail(e, p, 1, &far[1]);
  p->conn = c[0];
  if (c[0] && c[1]) {
    table_say(c[0], far[0], WIRE_MEM_ADD, R, L, 0x100);
    table_say(c[1], far[1], WIRE_MEM_ADD, R, L, 0x200);
    CU_ASSERT_EQUAL(table_key(p, 0, R, L), 0x100u);
    CU_ASSERT_EQUAL(table_key(p, 1, R, L), 0x200u);
    /* Rail 0 read first. */
    table_say(c[0], far[0], WIRE_MEM_DEL, R, L, 0);
    table_say(c[0], far[0], WIRE_MEM_ADD, R, L, 0x101);
    CU_ASSERT_EQUAL(table_key(p, 0, R, L), 0x101u);
    table_say(c[1], far[1], WIRE_MEM_DEL, R, L, 0);
    CU_ASSERT_PTR_NOT_NULL(memtab_find(&p->rtab, R, L)); /* before: no entry (tcp rails too) */
    CU_ASSERT_EQUAL(table_key(p, 0, R, L), 0x101u);
    CU_ASSERT_EQUAL(table_key(p, 1, R, L), 0u);
    table_say(c[1], far[1], WIRE_MEM_ADD, R, L, 0x201);
    CU_ASSERT_EQUAL(table_key(p, 0, R, L), 0x101u); /* before: 0, rail 1's key only */
    CU_ASSERT_EQUAL(table_key(p, 1, R, L), 0x201u);
    /* Rail 1 read first. */
    table_say(c[1], far[1], WIRE_MEM_DEL, R, L, 0);
    table_say(c[1], far[1], WIRE_MEM_ADD, R, L, 0x202);
    table_say(c[0], far[0], WIRE_MEM_DEL, R, L, 0);
    CU_ASSERT_EQUAL(table_key(p, 0, R, L), 0u); /* rail 0 has not heard of the new one yet */
    table_say(c[0], far[0], WIRE_MEM_ADD, R, L, 0x102);
    CU_ASSERT_EQUAL(table_key(p, 0, R, L), 0x102u);
    CU_ASSERT_EQUAL(table_key(p, 1, R, L), 0x202u); /* before: 0, rail 0's key only */
    /* Registered again with another length, then twice more at the first: rail 1
     * reads all of it after rail 0. */
    table_say(c[0], far[0], WIRE_MEM_DEL, R, L, 0);
    table_say(c[0], far[0], WIRE_MEM_ADD, R, 2 * L, 0x103);
    table_say(c[0], far[0], WIRE_MEM_DEL, R, 2 * L, 0);
    table_say(c[0], far[0], WIRE_MEM_ADD, R, L, 0x104);
    table_say(c[0], far[0], WIRE_MEM_DEL, R, L, 0);
    table_say(c[0], far[0], WIRE_MEM_ADD, R, L, 0x105);
    table_say(c[1], far[1], WIRE_MEM_DEL, R, L, 0);
    table_say(c[1], far[1], WIRE_MEM_ADD, R, 2 * L, 0x203);
    CU_ASSERT_EQUAL(table_key(p, 0, R, L), 0x105u);
    CU_ASSERT_EQUAL(table_key(p, 1, R, L), 0u); /* rail 1's (R, 2L) is not the control rail's range */
    table_say(c[1], far[1], WIRE_MEM_DEL, R, 2 * L, 0);
    table_say(c[1], far[1], WIRE_MEM_ADD, R, L, 0x204);
    table_say(c[1], far[1], WIRE_MEM_DEL, R, L, 0);
    CU_ASSERT_EQUAL(table_key(p, 0, R, L), 0x105u); /* before: no entry */
    table_say(c[1], far[1], WIRE_MEM_ADD, R, L, 0x205);
    CU_ASSERT_EQUAL(table_key(p, 0, R, L), 0x105u); /* before: 0 */
    CU_ASSERT_EQUAL(table_key(p, 1, R, L), 0x205u);
    CU_ASSERT_EQUAL(table_key(p, 0, R, 2 * L), 0u);
  }
  for (int k = 0; k < 2; k++) {
    if (!c[k]) continue;
    c[k]->peer = NULL;
    link_conn_kill(c[k], HIXL_FAILED, "test: done");
    close(far[k]);
  }
  pthread_mutex_unlock(&e->lock);
  api_peer_release(p);
  HixlEngineDestroy(e);
}

static CU_TestInfo tests[] = {
    {"rail_keys", test_rail_keys},
    {"rereg_every_rail_keyed", test_rereg_every_rail_keyed},
    {"options", test_options},
    {"striping", test_striping},
    {"peer_without_rails", test_peer_without_rails},
    {"reset_fails_over", test_reset_fails_over},
    {"control_rail_moves", test_control_rail_moves},
    {"slow_is_not_failed", test_slow_is_not_failed},
    CU_TEST_INFO_NULL,
};

static CU_SuiteInfo suites[] = {{"rails", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};

int main(void) { return tu_run_suites("test_rails", suites); }
