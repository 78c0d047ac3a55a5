/* test_plugin_abi12: a host built against the ABI 1.2 header as it was released
 * (tests/abi, frozen) runs with today's plugin: the table it knows, a pull and a push
 * hand-off in one process with every byte checked, get_stats into 1.2's struct, and
 * get_event_fd. It includes only that header and links nothing of hixl. */

#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "hixl_kv_connector_1_2.h"

#if HIXL_KV_ABI_MINOR != 2
#error "test_plugin_abi12 must be built against the frozen 1.2 header (tests/abi), not plugin/include"
#endif
_Static_assert(sizeof(hixl_kv_ops) == 8 + 26 * sizeof(void *),
               "the 1.2 table: 1.0's 24 ops, then 1.1's one and 1.2's one");
_Static_assert(sizeof(hixl_kv_stats) == 11 * 8, "1.2's hixl_kv_stats");

#ifndef HIXL_KV_PLUGIN_PATH
#define HIXL_KV_PLUGIN_PATH "libhixl_kv_connector.so"
#endif

static void *so;
static const hixl_kv_ops *ops;

#define ST_OK(expr)                                                                                          \
  do {                                                                                                       \
    hixl_kv_status st_ = (expr);                                                                             \
    if (st_ != HIXL_KV_SUCCESS)                                                                              \
      fprintf(stderr, "%s:%d: %s -> %u (%s)\n", __FILE__, __LINE__, #expr, st_, ops->last_error());          \
    CU_ASSERT_EQUAL(st_, HIXL_KV_SUCCESS);                                                                   \
  } while (0)

/* ---- small helpers, as tests/test_plugin.c's (kv_host.h includes today's header) ---- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A TCP port free on the loopback now (0 if none was found). */
/* A port on 127.0.0.1 held for this process: bound with SO_REUSEADDR, never listening,
 * never closed, so no parallel test's bind(:0) takes it before the engine listens. */
static uint16_t free_port(void) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof(sa);
  int one = 1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  uint16_t port = 0;
  if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
      bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
    port = ntohs(sa.sin_port);
  if (fd >= 0 && !port) close(fd);
  return port;
}

static char *config(char *buf, size_t cap, const char *role, const char *mode) {
  const char *t = getenv("HIXL_TEST_TRANSPORT");
  snprintf(buf, cap,
           "{\"address\": \"127.0.0.1:%u\", \"role\": \"%s\", \"mode\": \"%s\", \"lease_ms\": 30000,\n"
           " \"transfer_timeout_ms\": 5000, \"connect_timeout_ms\": 5000, \"Transport\": \"%s\"}\n",
           (unsigned)free_port(), role, mode, t && *t ? t : "auto");
  return buf;
}

/* ---- a model in miniature: KV-first layers of K and V blocks ---- */

enum { LAYERS = 3, BLOCKS = 32, BLOCK_BYTES = 64, N = 6, BLOCK_TOKENS = 4 };
static const uint64_t prefill_blocks[N] = {3, 4, 5, 10, 11, 20};
static const uint64_t decode_blocks[N] = {0, 1, 2, 7, 12, 13};

struct inst {
  hixl_kv_connector *sched, *worker;
  uint8_t *mem; /* LAYERS x (K blocks, V blocks), 0xEE where nothing was written */
  hixl_kv_layer layers[LAYERS];
};

static uint8_t *kv_block(struct inst *x, int l, int v, uint64_t b) {
  return x->mem + ((size_t)(l * 2 + v) * BLOCKS + b) * BLOCK_BYTES;
}

/* The byte prefill computed at (seed, layer, K/V, position in the request). */
static uint8_t kv_byte(uint64_t seed, int l, int v, size_t pos) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)l << 40) ^ ((uint64_t)v << 39) ^ pos;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return (uint8_t)(x >> 29);
}

/* With fill, write the pattern into blocks[]. Returns the bytes that differ from what
 * should be there: the pattern in blocks[], 0xEE in every other block. */
static size_t kv_pattern(struct inst *x, uint64_t seed, const uint64_t *blocks, bool fill) {
  size_t bad = 0;
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (uint64_t b = 0; b < BLOCKS; b++) {
        size_t j = 0;
        while (j < N && blocks[j] != b) j++;
        uint8_t *p = kv_block(x, l, v, b);
        for (size_t i = 0; i < BLOCK_BYTES; i++) {
          uint8_t want = j < N ? kv_byte(seed, l, v, j * BLOCK_BYTES + i) : 0xEE;
          if (fill && j < N) p[i] = want;
          bad += p[i] != want;
        }
      }
  return bad;
}

static hixl_kv_status inst_up(struct inst *x, const char *role, const char *mode) {
  char cfg[512], err[256] = "";
  memset(x, 0, sizeof(*x));
  config(cfg, sizeof(cfg), role, mode);
  hixl_kv_status st =
      ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &x->sched, err, sizeof(err));
  if (st == HIXL_KV_SUCCESS)
    st = ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, &x->worker, err, sizeof(err));
  if (st != HIXL_KV_SUCCESS) {
    fprintf(stderr, "create %s: %s\n", role, err);
    return st;
  }
  x->mem = malloc((size_t)LAYERS * 2 * BLOCKS * BLOCK_BYTES);
  if (!x->mem) return HIXL_KV_RESOURCE_EXHAUSTED;
  memset(x->mem, 0xEE, (size_t)LAYERS * 2 * BLOCKS * BLOCK_BYTES);
  for (int l = 0; l < LAYERS; l++)
    x->layers[l] = (hixl_kv_layer){"layer",
                                   5,
                                   (uintptr_t)kv_block(x, l, 0, 0),
                                   BLOCKS,
                                   BLOCK_BYTES,
                                   BLOCKS * BLOCK_BYTES,
                                   HIXL_KV_LAYOUT_KV_FIRST,
                                   2,
                                   BLOCK_TOKENS};
  return ops->register_kv_caches(x->worker, x->layers, LAYERS);
}

static void inst_down(struct inst *x) {
  if (x->worker) ST_OK(ops->destroy(x->worker));
  if (x->sched) ST_OK(ops->destroy(x->sched));
  free(x->mem);
}

/* One step of metadata from the scheduler to the worker. */
static void step(struct inst *x) {
  hixl_kv_buffer m = {0};
  ST_OK(ops->build_connector_meta(x->sched, &m));
  ST_OK(ops->bind_connector_meta(x->worker, m.data, m.len));
  ops->free_buffer(&m);
  ST_OK(ops->start_load_kv(x->worker));
}

static hixl_kv_request request(const char *id, const char *params) {
  return (hixl_kv_request){id, strlen(id), N * BLOCK_TOKENS, params, params ? strlen(params) : 0, 0};
}

/* The worker's get_finished: true when id is among its sending (which 0) or receiving
 * (1) ids. */
static bool finished(struct inst *x, const char *id, int which) {
  hixl_kv_ids s = {0}, r = {0};
  bool has = false;
  ST_OK(ops->get_finished(x->worker, NULL, &s, &r));
  const hixl_kv_ids *l = which ? &r : &s;
  for (size_t i = 0; i < l->count; i++) has |= strcmp(l->ids[i], id) == 0;
  ops->free_ids(&s);
  ops->free_ids(&r);
  return has;
}

/* Step both sides until the producer reported pid sent and the consumer did received,
 * waiting between steps on both workers' get_event_fd (1.2). The consumer's
 * get_finished is asked only once its fd polls readable, which must then be because
 * did landed. */
static bool handoff_wait(struct inst *p, struct inst *d, const char *pid, const char *did) {
  struct pollfd pf[2] = {{-1, POLLIN, 0}, {-1, POLLIN, 0}};
  bool sent = false, got = false;
  ST_OK(ops->get_event_fd(d->worker, &pf[0].fd));
  ST_OK(ops->get_event_fd(p->worker, &pf[1].fd));
  for (int64_t end = now_ms() + 20000; (!sent || !got) && now_ms() < end;) {
    CU_ASSERT(poll(pf, 2, 10) >= 0);
    step(p);
    sent |= finished(p, pid, 0);
    step(d);
    if (got || !(pf[0].revents & POLLIN)) continue;
    got = finished(d, did, 1);
    CU_ASSERT_TRUE(got);                /* one request: the fd was readable for it */
    CU_ASSERT_EQUAL(poll(pf, 1, 0), 0); /* get_finished took it: quiet again */
  }
  CU_ASSERT_TRUE(sent);
  CU_ASSERT_TRUE(got);
  return sent && got;
}

/* get_stats into 1.2's struct with canary bytes behind it: every field written (none
 * left at the fill), not a byte past the struct. */
static hixl_kv_stats stats(hixl_kv_connector *w) {
  struct {
    hixl_kv_stats s;
    uint8_t canary[64];
  } buf;
  memset(&buf, 0xA5, sizeof(buf));
  ST_OK(ops->get_stats(w, &buf.s));
  for (size_t i = 0; i < sizeof(buf.canary); i++) CU_ASSERT_EQUAL(buf.canary[i], 0xA5);
  const uint64_t *f = &buf.s.blocks_held;
  for (size_t i = 0; i < sizeof(buf.s) / sizeof(*f); i++) CU_ASSERT_NOT_EQUAL(f[i], 0xA5A5A5A5A5A5A5A5ull);
  return buf.s;
}

/* Each scheduler hears what its worker reported, as a host passes it on. */
static void pass_on(struct inst *p, struct inst *d, const char *pid, const char *did) {
  hixl_kv_ids sent = {&pid, 1}, got = {&did, 1};
  ST_OK(ops->update_connector_output(p->sched, &sent, NULL, NULL));
  ST_OK(ops->update_connector_output(d->sched, NULL, &got, NULL));
}

/* ---- the tests ---- */

static void test_table(void) {
  hixl_kv_entry_fn entry = (hixl_kv_entry_fn)dlsym(so, HIXL_KV_ENTRY_SYMBOL);
  const hixl_kv_ops *o = NULL;
  CU_ASSERT_PTR_NOT_NULL_FATAL(entry);
  CU_ASSERT_EQUAL(entry(HIXL_KV_ABI_MAJOR, &o, NULL, 0), HIXL_KV_SUCCESS);
  CU_ASSERT_PTR_EQUAL(o, ops);
  CU_ASSERT_EQUAL(ops->abi_version >> 16, 1);
  CU_ASSERT((ops->abi_version & 0xffff) >= 2);
  CU_ASSERT(ops->size >= sizeof(hixl_kv_ops));
  CU_ASSERT_TRUE(HIXL_KV_HAS_OP(ops, get_push_params)); /* 1.0's last */
  CU_ASSERT_TRUE(HIXL_KV_HAS_OP(ops, alloc_kv_caches)); /* 1.1 */
  CU_ASSERT_TRUE(HIXL_KV_HAS_OP(ops, get_event_fd));    /* 1.2 */
  for (size_t off = offsetof(hixl_kv_ops, create); off < sizeof(hixl_kv_ops); off += sizeof(void (*)(void))) {
    void (*fn)(void);
    memcpy(&fn, (const char *)ops + off, sizeof(fn));
    CU_ASSERT_PTR_NOT_NULL(fn);
  }
}

/* Pull: prefill finishes and holds its blocks; decode matches, allocates and loads. */
static void test_pull(void) {
  struct inst p = {0}, d = {0};
  int32_t delay = 0, async = 0;
  int64_t tokens = 0;
  hixl_kv_buffer params = {0};
  char *text = NULL;
  bool up = inst_up(&p, "producer", "pull") == HIXL_KV_SUCCESS &&
            inst_up(&d, "consumer", "pull") == HIXL_KV_SUCCESS;
  CU_ASSERT_TRUE(up);
  if (!up) goto down;
  CU_ASSERT_EQUAL(kv_pattern(&p, 12, prefill_blocks, true), 0);
  for (uint32_t l = 0; l < LAYERS; l++) ST_OK(ops->save_kv_layer(p.worker, l));
  ST_OK(ops->wait_for_save(p.worker));
  hixl_kv_request pr = request("pull-p", NULL);
  ST_OK(ops->request_finished(p.sched, &pr, prefill_blocks, N, &delay, &params));
  CU_ASSERT_EQUAL(delay, 1);
  step(&p); /* the worker holds the blocks now */
  hixl_kv_stats s = stats(p.worker);
  CU_ASSERT(s.blocks_held == N && s.requests_held == 1);
  text = strndup((char *)params.data, params.len);
  ops->free_buffer(&params);
  hixl_kv_request dr = request("pull-d", text);
  ST_OK(ops->get_num_new_matched_tokens(d.sched, &dr, 0, &tokens, &async));
  CU_ASSERT(tokens == N * BLOCK_TOKENS && async == 1);
  ST_OK(ops->update_state_after_alloc(d.sched, &dr, decode_blocks, N, (uint64_t)tokens));
  if (handoff_wait(&p, &d, "pull-p", "pull-d")) {
    CU_ASSERT_EQUAL(kv_pattern(&d, 12, decode_blocks, false), 0);
    pass_on(&p, &d, "pull-p", "pull-d");
  }
  hixl_kv_blocks errs = {0};
  ST_OK(ops->get_block_ids_with_load_errors(d.worker, &errs));
  CU_ASSERT_EQUAL(errs.count, 0);
  ops->free_buffer(&errs.raw);
  s = stats(d.worker);
  CU_ASSERT(s.loads_done == 1 && s.loads_failed == 0 && s.lookups == 1);
  CU_ASSERT_EQUAL(s.bytes_loaded, (uint64_t)N * LAYERS * 2 * BLOCK_BYTES);
  /* runs {3,4,5}->{0,1,2}, {10}->{7}, {11}->{12}, {20}->{13} per K and per V tensor */
  CU_ASSERT_EQUAL(s.engine_ops, 4 * LAYERS * 2);
  CU_ASSERT(s.blocks_held == 0 && s.pushes_done == 0);
  s = stats(p.worker);
  CU_ASSERT(s.blocks_held == 0 && s.requests_held == 0 && s.lease_expired == 0 && s.loads_done == 0);
down:
  free(text);
  inst_down(&d);
  inst_down(&p);
}

/* Push: decode allocates first and hands its blocks to prefill, which writes them. */
static void test_push(void) {
  struct inst p = {0}, d = {0};
  int32_t delay = 0, async = 0;
  int64_t tokens = 0;
  hixl_kv_buffer params = {0}, none = {0};
  char *text = NULL;
  bool up = inst_up(&d, "consumer", "push") == HIXL_KV_SUCCESS &&
            inst_up(&p, "producer", "push") == HIXL_KV_SUCCESS;
  CU_ASSERT_TRUE(up);
  if (!up) goto down;
  hixl_kv_request dr = request("push-d", "{\"do_remote_prefill\": true}");
  ST_OK(ops->get_num_new_matched_tokens(d.sched, &dr, 0, &tokens, &async));
  CU_ASSERT(tokens == N * BLOCK_TOKENS && async == 1);
  ST_OK(ops->update_state_after_alloc(d.sched, &dr, decode_blocks, N, (uint64_t)tokens));
  ST_OK(ops->get_push_params(d.sched, dr.req_id, dr.req_id_len, &params));
  text = strndup((char *)params.data, params.len);
  ops->free_buffer(&params);
  hixl_kv_request pr = request("push-p", text);
  ST_OK(ops->get_num_new_matched_tokens(p.sched, &pr, 0, &tokens, &async));
  CU_ASSERT_EQUAL(tokens, 0);
  ST_OK(ops->update_state_after_alloc(p.sched, &pr, prefill_blocks, N, 0));
  CU_ASSERT_EQUAL(kv_pattern(&p, 34, prefill_blocks, true), 0);
  step(&d);
  step(&p);
  for (uint32_t l = 0; l < LAYERS; l++) ST_OK(ops->save_kv_layer(p.worker, l));
  ST_OK(ops->wait_for_save(p.worker));
  ST_OK(ops->request_finished(p.sched, &pr, prefill_blocks, N, &delay, &none));
  ops->free_buffer(&none);
  CU_ASSERT_EQUAL(delay, 1);
  if (handoff_wait(&p, &d, "push-p", "push-d")) {
    CU_ASSERT_EQUAL(kv_pattern(&d, 34, decode_blocks, false), 0);
    pass_on(&p, &d, "push-p", "push-d");
  }
  hixl_kv_stats s = stats(d.worker);
  CU_ASSERT(s.loads_done == 1 && s.loads_failed == 0 && s.pushes_done == 0);
  CU_ASSERT_EQUAL(s.bytes_loaded, (uint64_t)N * LAYERS * 2 * BLOCK_BYTES);
  s = stats(p.worker);
  CU_ASSERT(s.pushes_done == 1 && s.pushes_failed == 0 && s.layers_pushed == LAYERS && s.lookups == 1);
  CU_ASSERT(s.blocks_held == 0 && s.requests_held == 0 && s.loads_done == 0 && s.engine_ops > 0);
down:
  free(text);
  inst_down(&p);
  inst_down(&d);
}

static CU_TestInfo tests[] = {
    {"the 1.2 table in today's plugin", test_table},
    {"pull hand-off, stats and event fd", test_pull},
    {"push hand-off, stats and event fd", test_push},
    CU_TEST_INFO_NULL,
};
static CU_SuiteInfo suites[] = {{.pName = "a 1.2 host", .pTests = tests}, CU_SUITE_INFO_NULL};

int main(void) {
  const char *path = getenv("HIXL_KV_PLUGIN") ? getenv("HIXL_KV_PLUGIN") : HIXL_KV_PLUGIN_PATH;
  char err[256] = "";
  int rc = 1;
  signal(SIGPIPE, SIG_IGN);
  so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  hixl_kv_entry_fn entry = so ? (hixl_kv_entry_fn)dlsym(so, HIXL_KV_ENTRY_SYMBOL) : NULL;
  if (!entry || entry(HIXL_KV_ABI_MAJOR, &ops, err, sizeof(err)) != HIXL_KV_SUCCESS) {
    fprintf(stderr, "test_plugin_abi12: %s: no usable %s %s %s\n", path, HIXL_KV_ENTRY_SYMBOL, err,
            so ? "" : dlerror());
    return 1;
  }
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  if (CU_register_suites(suites) == CUE_SUCCESS) {
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    rc = CU_get_number_of_failures() + CU_get_number_of_tests_failed() ? 1 : 0;
  }
  CU_cleanup_registry();
  dlclose(so);
  return rc;
}
