/* test_plugin: libhixl_kv_connector.so as a host sees it: dlopen, the one entry
 * point, version and size negotiation, every op's argument checks, and pull-mode
 * hand-offs between a prefill (producer) and a decode (consumer) with every byte
 * checked: in two processes, with a lease that runs out, an abort, a producer that
 * dies, and a layout that differs. This program includes only the plugin's ABI
 * header: it links nothing of hixl. */

#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hixl/hixl_kv_connector.h"
#include "kv_host.h"

#ifndef HIXL_KV_PLUGIN_PATH
#define HIXL_KV_PLUGIN_PATH "libhixl_kv_connector.so"
#endif

static void *so;
static const hixl_kv_ops *ops;

/* ---- small helpers (no hixl) ---- */

/* A bare hixl configuration document. */
static char *config(char *buf, size_t cap, uint16_t port, const char *role, unsigned lease_ms,
                    const char *policy, int timeout_ms) {
  snprintf(buf, cap,
           "{\"address\": \"%s:%u\", \"role\": \"%s\", \"mode\": \"pull\", \"lease_ms\": %u,\n"
           " \"load_failure_policy\": \"%s\", \"transfer_timeout_ms\": %d, \"connect_timeout_ms\": %d,\n"
           " \"Transport\": \"%s\"}\n",
           test_ip(), (unsigned)port, role, lease_ms, policy, timeout_ms, timeout_ms, transport());
  return buf;
}

static char *config_push(char *buf, size_t cap, uint16_t port, const char *role, unsigned lease_ms);

/* A re-executed child (--child) has no CUnit registry: a failure there exits 9. */
static bool in_child;

#define ST_IS(expr, want)                                                                                    \
  do {                                                                                                       \
    hixl_kv_status st_ = (expr);                                                                             \
    if (st_ != (hixl_kv_status)(want))                                                                       \
      fprintf(stderr, "%s:%d: %s -> %u, want %u (%s)\n", __FILE__, __LINE__, #expr, st_, (unsigned)(want),   \
              ops->last_error());                                                                            \
    if (in_child && st_ != (hixl_kv_status)(want)) _exit(9);                                                 \
    if (!in_child) CU_ASSERT_EQUAL(st_, (hixl_kv_status)(want));                                             \
  } while (0)

/* How many of this process's threads are named name (their comm). */
static int threads_named(const char *name) {
  DIR *d = opendir("/proc/self/task");
  int n = 0;
  for (struct dirent *t; d && (t = readdir(d));) {
    char path[300], comm[32] = "";
    snprintf(path, sizeof(path), "/proc/self/task/%s/comm", t->d_name);
    FILE *f = t->d_name[0] == '.' ? NULL : fopen(path, "r");
    if (!f) continue;
    if (fgets(comm, sizeof(comm), f)) comm[strcspn(comm, "\n")] = '\0';
    fclose(f);
    n += strcmp(comm, name) == 0;
  }
  if (d) closedir(d);
  return n;
}

static bool has_error(const char *needle) {
  const char *e = ops->last_error();
  if (strstr(e, needle)) return true;
  fprintf(stderr, "last_error \"%s\" does not mention \"%s\"\n", e, needle);
  return false;
}

/* ---- a model in miniature: layers of K and V blocks ---- */

enum { LAYERS = 3, BLOCKS = 32, BLOCK_TOKENS = 4, ELEM = 2, BLOCK_BYTES = BLOCK_TOKENS * 8 * ELEM };

struct kv {
  uint8_t *mem; /* LAYERS x (K blocks, V blocks) */
  size_t len;
  hixl_kv_layer layers[LAYERS];
};

static void kv_init(struct kv *k, uint64_t block_bytes) {
  k->len = LAYERS * 2 * BLOCKS * block_bytes;
  k->mem = malloc(k->len);
  memset(k->mem, 0xEE, k->len);
  for (int l = 0; l < LAYERS; l++)
    k->layers[l] = (hixl_kv_layer){"layer",
                                   5,
                                   (uintptr_t)(k->mem + l * 2 * BLOCKS * block_bytes),
                                   BLOCKS,
                                   block_bytes,
                                   BLOCKS * block_bytes,
                                   HIXL_KV_LAYOUT_KV_FIRST,
                                   ELEM,
                                   BLOCK_TOKENS};
}

/* The byte the prefill computed at (request seed, layer, K/V, position in the request). */
static uint8_t kv_byte(uint64_t seed, int layer, int v, size_t pos) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)layer << 40) ^ ((uint64_t)v << 39) ^ pos;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return (uint8_t)(x >> 29);
}

static uint8_t *kv_block(struct kv *k, int layer, int v, uint64_t block) {
  return k->mem + layer * 2 * BLOCKS * BLOCK_BYTES + (size_t)v * BLOCKS * BLOCK_BYTES + block * BLOCK_BYTES;
}

static void kv_compute_layer(struct kv *k, int l, uint64_t seed, const uint64_t *blocks, size_t n) {
  for (int v = 0; v < 2; v++)
    for (size_t b = 0; b < n; b++)
      for (size_t i = 0; i < BLOCK_BYTES; i++)
        kv_block(k, l, v, blocks[b])[i] = kv_byte(seed, l, v, b * BLOCK_BYTES + i);
}

/* Layer l of the request as prefill computed it (1), untouched (0), or neither (-1).
 * A layer may be landing while this looks (that is what it checks), so it reads the
 * blocks as an outside observer does, through the kernel (process_vm_readv on this
 * process), not with loads that would race the plugin's writes. */
static int kv_layer_state(struct kv *k, int l, uint64_t seed, const uint64_t *blocks, size_t n) {
  bool all_right = true, all_sentinel = true;
  uint8_t got[BLOCK_BYTES];
  for (int v = 0; v < 2; v++)
    for (size_t b = 0; b < n; b++) {
      struct iovec local = {got, BLOCK_BYTES}, remote = {kv_block(k, l, v, blocks[b]), BLOCK_BYTES};
      if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != BLOCK_BYTES) return -1;
      for (size_t i = 0; i < BLOCK_BYTES; i++) {
        uint8_t x = got[i];
        all_right &= x == kv_byte(seed, l, v, b * BLOCK_BYTES + i);
        all_sentinel &= x == 0xEE;
      }
    }
  return all_right ? 1 : all_sentinel ? 0 : -1;
}

static void kv_compute(struct kv *k, uint64_t seed, const uint64_t *blocks, size_t n) {
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (size_t b = 0; b < n; b++)
        for (size_t i = 0; i < BLOCK_BYTES; i++)
          kv_block(k, l, v, blocks[b])[i] = kv_byte(seed, l, v, b * BLOCK_BYTES + i);
}

/* Bytes of the request that differ from what prefill computed; -1 if none. */
static long kv_verify(struct kv *k, uint64_t seed, const uint64_t *blocks, size_t n) {
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (size_t b = 0; b < n; b++)
        for (size_t i = 0; i < BLOCK_BYTES; i++)
          if (kv_block(k, l, v, blocks[b])[i] != kv_byte(seed, l, v, b * BLOCK_BYTES + i))
            return (long)(((l * 2 + v) * n + b) * BLOCK_BYTES + i);
  return -1;
}

/* Every block of every layer not in blocks[] still holds only c. */
static bool others_untouched(struct kv *k, const uint64_t *blocks, size_t n, uint8_t c) {
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (uint64_t b = 0; b < BLOCKS; b++) {
        bool mine = false;
        for (size_t j = 0; j < n; j++) mine |= blocks[j] == b;
        for (size_t i = 0; !mine && i < BLOCK_BYTES; i++)
          if (kv_block(k, l, v, b)[i] != c) return false;
      }
  return true;
}

static size_t count_byte(struct kv *k, uint8_t c) {
  size_t n = 0;
  for (size_t i = 0; i < k->len; i++) n += k->mem[i] == c;
  return n;
}

/* ---- an instance: a scheduler and a worker connector ---- */

struct inst {
  hixl_kv_connector *sched, *worker;
  struct kv kv;
};

/* An instance whose worker is rank 0 of world workers (tensor parallelism). */
static hixl_kv_status inst_up_tp(struct inst *x, const char *cfg, uint64_t block_bytes, uint32_t world) {
  char err[256];
  memset(x, 0, sizeof(*x));
  hixl_kv_status st =
      ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &x->sched, err, sizeof(err));
  if (st == HIXL_KV_SUCCESS)
    st = ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, world, &x->worker, err, sizeof(err));
  if (st != HIXL_KV_SUCCESS) {
    fprintf(stderr, "create: %s\n", err);
    return st;
  }
  kv_init(&x->kv, block_bytes);
  return ops->register_kv_caches(x->worker, x->kv.layers, LAYERS);
}

static hixl_kv_status inst_up(struct inst *x, const char *cfg, uint64_t block_bytes) {
  return inst_up_tp(x, cfg, block_bytes, 1);
}

static void inst_down(struct inst *x) {
  if (x->worker) CU_ASSERT_EQUAL(ops->destroy(x->worker), HIXL_KV_SUCCESS);
  if (x->sched) CU_ASSERT_EQUAL(ops->destroy(x->sched), HIXL_KV_SUCCESS);
  free(x->kv.mem);
}

/* One step of metadata from the scheduler to the worker (ST_IS: also in a child). */
static void step(struct inst *x) {
  hixl_kv_buffer m = {0};
  ST_IS(ops->build_connector_meta(x->sched, &m), HIXL_KV_SUCCESS);
  ST_IS(ops->bind_connector_meta(x->worker, m.data, m.len), HIXL_KV_SUCCESS);
  ops->free_buffer(&m);
  ST_IS(ops->start_load_kv(x->worker), HIXL_KV_SUCCESS);
}

/* Step until one of ids[] not seen yet shows in the worker's sending (which 0) or
 * receiving (1) list, or timeout_ms passes: sets seen[] of each that showed in that
 * get_finished and returns how many did (0: none in time). */
static size_t wait_any(struct inst *x, const char *const *ids, bool *seen, size_t n, int which,
                       int timeout_ms) {
  int64_t end = now_ms() + timeout_ms;
  do {
    hixl_kv_ids s = {0}, r = {0};
    size_t got = 0;
    step(x);
    if (ops->get_finished(x->worker, NULL, &s, &r) != HIXL_KV_SUCCESS) return 0;
    for (size_t i = 0; i < n; i++)
      if (!seen[i] && ids_have(which ? &r : &s, ids[i])) seen[i] = true, got++;
    ops->free_ids(&s);
    ops->free_ids(&r);
    if (got) return got;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  } while (now_ms() < end);
  return 0;
}

/* wait_any until every one of ids[] has shown. */
static bool wait_all(struct inst *x, const char *const *ids, bool *seen, size_t n, int which,
                     int timeout_ms) {
  int64_t end = now_ms() + timeout_ms;
  size_t got = 0;
  for (size_t i = 0; i < n; i++) got += seen[i];
  while (got < n && now_ms() < end) got += wait_any(x, ids, seen, n, which, (int)(end - now_ms()));
  return got == n;
}

static bool wait_finished(struct inst *x, const char *id, int which, int timeout_ms) {
  bool seen = false;
  return wait_any(x, &id, &seen, 1, which, timeout_ms) > 0;
}

static hixl_kv_request request(const char *id, uint64_t tokens, const char *params) {
  return (hixl_kv_request){id, strlen(id), tokens, params, params ? strlen(params) : 0, 0};
}

/* params with the string value of key replaced by value (a copy to free). */
static char *params_with(const char *params, const char *key, const char *value) {
  char pat[64], *out = malloc(strlen(params) + strlen(value) + 1);
  snprintf(pat, sizeof(pat), "\"%s\":\"", key);
  const char *v = strstr(params, pat), *end = v ? strchr(v + strlen(pat), '"') : NULL;
  if (!out || !end) {
    free(out);
    return NULL;
  }
  size_t head = (size_t)(v - params) + strlen(pat);
  sprintf(out, "%.*s%s%s", (int)head, params, value, end);
  return out;
}

/* Prefill side of a hand-off: compute, finish, return the kv_transfer_params. */
static char *prefill_finish(struct inst *p, const char *id, uint64_t seed, const uint64_t *blocks, size_t n) {
  kv_compute(&p->kv, seed, blocks, n);
  for (uint32_t l = 0; l < LAYERS; l++) ST_IS(ops->save_kv_layer(p->worker, l), HIXL_KV_SUCCESS);
  ST_IS(ops->wait_for_save(p->worker), HIXL_KV_SUCCESS);
  hixl_kv_request r = request(id, n * BLOCK_TOKENS, NULL);
  int32_t delay = 0;
  hixl_kv_buffer params = {0};
  ST_IS(ops->request_finished(p->sched, &r, blocks, n, &delay, &params), HIXL_KV_SUCCESS);
  if (delay != 1) {
    fprintf(stderr, "request_finished: delay_free %d, want 1\n", delay);
    _exit(8);
  }
  char *text = strndup((char *)params.data, params.len);
  ops->free_buffer(&params);
  step(p); /* the worker now holds the blocks */
  return text;
}

/* Decode side: match, allocate (the LOAD goes in the next step's metadata). */
static void decode_alloc(struct inst *d, const char *id, const char *params, const uint64_t *blocks,
                         size_t n) {
  hixl_kv_request r = request(id, n * BLOCK_TOKENS, params);
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d->sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(tokens, (int64_t)(n * BLOCK_TOKENS));
  CU_ASSERT_EQUAL(async, 1);
  ST_IS(ops->update_state_after_alloc(d->sched, &r, blocks, n, (uint64_t)tokens), HIXL_KV_SUCCESS);
}

/* ... and load. */
static void decode_load(struct inst *d, const char *id, const char *params, const uint64_t *blocks,
                        size_t n) {
  decode_alloc(d, id, params, blocks, n);
  step(d);
}

static size_t load_errors(struct inst *d, uint64_t *out, size_t cap) {
  hixl_kv_blocks b = {0};
  ST_IS(ops->get_block_ids_with_load_errors(d->worker, &b), HIXL_KV_SUCCESS);
  size_t n = b.count;
  for (size_t i = 0; i < n && i < cap; i++) out[i] = b.ids[i];
  ops->free_buffer(&b.raw);
  return n;
}

/* ---- the ABI ---- */

static void test_entry(void) {
  hixl_kv_entry_fn entry = (hixl_kv_entry_fn)dlsym(so, HIXL_KV_ENTRY_SYMBOL);
  const hixl_kv_ops *o = NULL;
  char err[256] = "";
  CU_ASSERT_PTR_NOT_NULL_FATAL(entry);
  CU_ASSERT_EQUAL(entry(HIXL_KV_ABI_MAJOR + 1, &o, err, sizeof(err)), HIXL_KV_UNSUPPORTED);
  CU_ASSERT_PTR_NULL(o);
  CU_ASSERT_PTR_NOT_NULL(strstr(err, "ABI major version 1"));
  CU_ASSERT_EQUAL(entry(0, &o, err, sizeof(err)), HIXL_KV_UNSUPPORTED);
  CU_ASSERT_EQUAL(entry(HIXL_KV_ABI_MAJOR, NULL, err, sizeof(err)), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_EQUAL(entry(HIXL_KV_ABI_MAJOR, &o, NULL, 0), HIXL_KV_SUCCESS);
  CU_ASSERT_PTR_EQUAL(o, ops);
  CU_ASSERT_EQUAL(o->abi_version >> 16, HIXL_KV_ABI_MAJOR);
  CU_ASSERT(o->size >= sizeof(hixl_kv_ops)); /* this host's table is covered */
  /* Nothing of hixl leaks out of the plugin. */
  CU_ASSERT_PTR_NULL(dlsym(so, "HixlEngineCreate"));
  CU_ASSERT_PTR_NULL(dlsym(so, "HixlCacheManagerCreate"));
  CU_ASSERT_PTR_NULL(dlsym(so, "HixlConfigParse"));
  CU_ASSERT_PTR_NULL(dlsym(so, "kv_fail"));
}

/* Every slot this host knows is set: none is NULL. */
static void test_no_null_slot(void) {
  const size_t first = offsetof(hixl_kv_ops, create);
  for (size_t off = first; off + sizeof(void (*)(void)) <= sizeof(hixl_kv_ops);
       off += sizeof(void (*)(void))) {
    void (*fn)(void);
    memcpy(&fn, (const char *)ops + off, sizeof(fn));
    CU_ASSERT_PTR_NOT_NULL(fn);
  }
}

/* A host built against a smaller table (an older plugin): HIXL_KV_HAS_OP says which
 * ops it may call, and a table that grew is read by an older host as its prefix. */
static void test_table_sizes(void) {
  hixl_kv_ops small = *ops;
  small.size = (uint32_t)offsetof(hixl_kv_ops, get_stats);
  CU_ASSERT_TRUE(HIXL_KV_HAS_OP(&small, create));
  CU_ASSERT_TRUE(HIXL_KV_HAS_OP(&small, get_handshake_metadata));
  CU_ASSERT_FALSE(HIXL_KV_HAS_OP(&small, get_stats));
  CU_ASSERT_TRUE(HIXL_KV_HAS_OP(ops, get_stats));
  /* The v1.0 layout is fixed: these offsets are part of the ABI. */
  CU_ASSERT_EQUAL(offsetof(hixl_kv_ops, abi_version), 0);
  CU_ASSERT_EQUAL(offsetof(hixl_kv_ops, size), 4);
  CU_ASSERT_EQUAL(offsetof(hixl_kv_ops, create), 8);
  CU_ASSERT_EQUAL(offsetof(hixl_kv_ops, get_stats), 8 + 22 * sizeof(void *));
  /* 1.1 appends alloc_kv_caches after 1.0's last op */
  CU_ASSERT_EQUAL(offsetof(hixl_kv_ops, alloc_kv_caches), 8 + 24 * sizeof(void *));
  /* 1.2 appends get_event_fd */
  CU_ASSERT_EQUAL(offsetof(hixl_kv_ops, get_event_fd), 8 + 25 * sizeof(void *));
  /* 1.3 appends get_stats_ex */
  CU_ASSERT_EQUAL(offsetof(hixl_kv_ops, get_stats_ex), 8 + 26 * sizeof(void *));
  CU_ASSERT_EQUAL(ops->abi_version, (1u << 16) | 6u); /* 1.4 adds no op: hixl_kv_stats_ex.cap_refused */
  /* 1.5 appends render_metrics and drain_traces after 1.3's build_connector_worker_meta */
  CU_ASSERT_EQUAL(offsetof(hixl_kv_ops, render_metrics),
                  offsetof(hixl_kv_ops, build_connector_worker_meta) + sizeof(void *));
  CU_ASSERT_EQUAL(offsetof(hixl_kv_ops, drain_traces),
                  offsetof(hixl_kv_ops, render_metrics) + sizeof(void *));
  /* 1.6 appends on_new_request */
  CU_ASSERT_EQUAL(offsetof(hixl_kv_ops, on_new_request),
                  offsetof(hixl_kv_ops, drain_traces) + sizeof(void *));
  CU_ASSERT_EQUAL(ops->size, sizeof(hixl_kv_ops));
  small.size = (uint32_t)offsetof(hixl_kv_ops, render_metrics); /* a 1.4 plugin */
  CU_ASSERT_TRUE(HIXL_KV_HAS_OP(&small, build_connector_worker_meta));
  CU_ASSERT_FALSE(HIXL_KV_HAS_OP(&small, render_metrics));
  small.size = (uint32_t)offsetof(hixl_kv_ops, alloc_kv_caches); /* a 1.0 plugin */
  CU_ASSERT_TRUE(HIXL_KV_HAS_OP(&small, get_push_params));
  CU_ASSERT_FALSE(HIXL_KV_HAS_OP(&small, alloc_kv_caches));
  small.size = (uint32_t)offsetof(hixl_kv_ops, get_event_fd); /* a 1.1 plugin */
  CU_ASSERT_TRUE(HIXL_KV_HAS_OP(&small, alloc_kv_caches));
  CU_ASSERT_FALSE(HIXL_KV_HAS_OP(&small, get_event_fd));
  small.size = (uint32_t)offsetof(hixl_kv_ops, get_stats_ex); /* a 1.2 plugin */
  CU_ASSERT_TRUE(HIXL_KV_HAS_OP(&small, get_event_fd));
  CU_ASSERT_FALSE(HIXL_KV_HAS_OP(&small, get_stats_ex));
  /* hixl_kv_stats is frozen; hixl_kv_stats_ex is hixl_kv_stats's fields behind its size */
  CU_ASSERT_EQUAL(sizeof(hixl_kv_stats), 11 * 8);
  CU_ASSERT_EQUAL(offsetof(hixl_kv_stats_ex, blocks_held), 8);
  CU_ASSERT_EQUAL(offsetof(hixl_kv_stats_ex, bytes_pushed), 8 + sizeof(hixl_kv_stats));
  CU_ASSERT_EQUAL(offsetof(hixl_kv_stats_ex, cap_refused), 8 + sizeof(hixl_kv_stats) + 8); /* 1.4 */
}

/* alloc_kv_caches: the plugin allocates the layers (base and v_offset written back,
 * page-aligned, zeroed, K and V apart); a scheduler, a second call or a bad shape is
 * PARAM_INVALID and writes nothing. */
static void test_alloc_kv_caches(void) {
  char cfg[512], err[256];
  hixl_kv_connector *w = NULL;
  struct kv k;
  config(cfg, sizeof(cfg), free_port(), "both", 30000, "fail", 2000);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, &w, err, sizeof(err)), HIXL_KV_SUCCESS);
  kv_init(&k, BLOCK_BYTES);
  free(k.mem);
  for (int l = 0; l < LAYERS; l++) k.layers[l].base = k.layers[l].v_offset = 0;
  k.layers[1].block_bytes *= 2;
  ST_IS(ops->alloc_kv_caches(w, k.layers, LAYERS), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_EQUAL(k.layers[0].base, 0);
  k.layers[1].block_bytes /= 2;
  ST_IS(ops->alloc_kv_caches(w, k.layers, LAYERS), HIXL_KV_SUCCESS);
  for (int l = 0; l < LAYERS; l++) {
    const hixl_kv_layer *y = &k.layers[l];
    CU_ASSERT(y->base != 0 && y->base % 4096 == 0);
    CU_ASSERT(y->v_offset >= (uint64_t)BLOCKS * BLOCK_BYTES);
    for (int v = 0; v < 2; v++) {
      const uint8_t *p = (const uint8_t *)(y->base + (v ? y->v_offset : 0));
      size_t nz = 0;
      for (size_t i = 0; i < (size_t)BLOCKS * BLOCK_BYTES; i++) nz += p[i] != 0;
      CU_ASSERT_EQUAL(nz, 0);
    }
    memset((void *)y->base, 0x5a, (size_t)BLOCKS * BLOCK_BYTES); /* the host writes it */
    if (l > 0) CU_ASSERT(y->base >= k.layers[l - 1].base + k.layers[l - 1].v_offset + BLOCKS * BLOCK_BYTES);
  }
  ST_IS(ops->alloc_kv_caches(w, k.layers, LAYERS), HIXL_KV_PARAM_INVALID); /* already */
  ST_IS(ops->register_kv_caches(w, k.layers, LAYERS), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->destroy(w), HIXL_KV_SUCCESS); /* frees it */
  hixl_kv_connector *sch = NULL;
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &sch, err, sizeof(err)), HIXL_KV_SUCCESS);
  ST_IS(ops->alloc_kv_caches(sch, k.layers, LAYERS), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->destroy(sch), HIXL_KV_SUCCESS);
}

/* ---- arguments ---- */

static void test_create_args(void) {
  char cfg[512], err[256] = "";
  hixl_kv_connector *c = NULL;
  config(cfg, sizeof(cfg), free_port(), "producer", 30000, "fail", 2000);
  ST_IS(ops->create(NULL, 0, HIXL_KV_ROLE_SCHEDULER, 0, 1, &c, err, sizeof(err)), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->create(cfg, strlen(cfg), 7, 0, 1, &c, err, sizeof(err)), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 1, 1, &c, err, sizeof(err)),
        HIXL_KV_PARAM_INVALID);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, NULL, err, sizeof(err)),
        HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(c);
  const char *bad = "{\"address\": \"127.0.0.1:1\", \"role\": \"producer\",";
  ST_IS(ops->create(bad, strlen(bad), HIXL_KV_ROLE_SCHEDULER, 0, 1, &c, err, sizeof(err)),
        HIXL_KV_PARAM_INVALID);
  CU_ASSERT(strlen(err) > 0);
  fprintf(stderr, "truncated config: %s\n", err);
  const char *unknown = "{\"adress\": \"127.0.0.1:1\"}";
  ST_IS(ops->create(unknown, strlen(unknown), HIXL_KV_ROLE_SCHEDULER, 0, 1, &c, err, sizeof(err)),
        HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(err, "adress"));
  /* A value out of its range names the key. */
  const char *lease = "{\"address\": \"127.0.0.1:1\", \"lease_ms\": -5}";
  ST_IS(ops->create(lease, strlen(lease), HIXL_KV_ROLE_SCHEDULER, 0, 1, &c, err, sizeof(err)),
        HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(err, "lease_ms"));
  /* A worker needs a port to listen on. */
  const char *noport = "{\"address\": \"127.0.0.1\"}";
  ST_IS(ops->create(noport, strlen(noport), HIXL_KV_ROLE_WORKER, 0, 1, &c, err, sizeof(err)),
        HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(c);
}

static void test_op_args(void) {
  char cfg[512];
  struct inst x;
  hixl_kv_request r = request("r1", 8, NULL);
  int64_t tokens;
  int32_t flag;
  hixl_kv_buffer b = {0};
  hixl_kv_ids s, rv;
  hixl_kv_blocks eb;
  hixl_kv_stats stats;
  uint64_t blocks[1] = {0};
  config(cfg, sizeof(cfg), free_port(), "both", 30000, "fail", 2000);
  ST_IS(inst_up(&x, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  /* NULL connector: every op says so. */
  ST_IS(ops->destroy(NULL), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->shutdown(NULL), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->get_num_new_matched_tokens(NULL, &r, 0, &tokens, &flag), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->update_state_after_alloc(NULL, &r, blocks, 1, 4), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->build_connector_meta(NULL, &b), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->request_finished(NULL, &r, blocks, 1, &flag, &b), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->update_connector_output(NULL, NULL, NULL, NULL), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->set_handshake_metadata(NULL, NULL, 0), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->register_kv_caches(NULL, x.kv.layers, LAYERS), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->bind_connector_meta(NULL, (const uint8_t *)"x", 1), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->clear_connector_meta(NULL), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->start_load_kv(NULL), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->wait_for_layer_load(NULL, 0), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->save_kv_layer(NULL, 0), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->wait_for_save(NULL), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->get_finished(NULL, NULL, &s, &rv), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->get_block_ids_with_load_errors(NULL, &eb), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->get_handshake_metadata(NULL, &b), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->get_stats(NULL, &stats), HIXL_KV_PARAM_INVALID);
  /* NULL outputs and wrong roles. */
  ST_IS(ops->get_num_new_matched_tokens(x.sched, &r, 0, NULL, &flag), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->get_num_new_matched_tokens(x.worker, &r, 0, &tokens, &flag), HIXL_KV_PARAM_INVALID);
  CU_ASSERT(has_error("scheduler"));
  ST_IS(ops->build_connector_meta(x.worker, &b), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->request_finished(x.sched, &r, blocks, 1, NULL, &b), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->start_load_kv(x.sched), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->get_finished(x.worker, NULL, NULL, &rv), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->register_kv_caches(x.sched, x.kv.layers, LAYERS), HIXL_KV_PARAM_INVALID);
  /* Bad requests. */
  hixl_kv_request noid = request("", 8, NULL);
  ST_IS(ops->get_num_new_matched_tokens(x.sched, &noid, 0, &tokens, &flag), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->get_num_new_matched_tokens(x.sched, NULL, 0, &tokens, &flag), HIXL_KV_PARAM_INVALID);
  /* Params that are not ours: no tokens to load. */
  hixl_kv_request junk = request("r2", 8, "{\"do_remote_prefill\": \"yes\"}");
  ST_IS(ops->get_num_new_matched_tokens(x.sched, &junk, 0, &tokens, &flag), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(tokens, 0);
  CU_ASSERT_EQUAL(flag, 0);
  /* Metadata that is not ours is refused whole. */
  const uint8_t garbage[] = {0x48, 0x58, 0x4b, 0x4d, 1, 0, 0, 0, 9, 1};
  ST_IS(ops->bind_connector_meta(x.worker, garbage, sizeof(garbage)), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->bind_connector_meta(x.worker, garbage, 3), HIXL_KV_PARAM_INVALID);
  /* Layers: twice, or of different shapes. */
  ST_IS(ops->register_kv_caches(x.worker, x.kv.layers, LAYERS), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->wait_for_layer_load(x.worker, LAYERS), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->save_kv_layer(x.worker, LAYERS), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->get_stats(x.worker, &stats), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(stats.blocks_held, 0);
  /* 1.3 hooks: any layout will do (""); no worker metadata for the scheduler, said why. */
  ST_IS(ops->get_required_kvcache_layout(x.sched, &b), HIXL_KV_SUCCESS);
  CU_ASSERT(b.data && b.len == 0);
  ops->free_buffer(&b);
  ST_IS(ops->get_required_kvcache_layout(x.sched, NULL), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->build_connector_worker_meta(x.worker, &b), HIXL_KV_UNSUPPORTED);
  CU_ASSERT_TRUE(has_error("get_finished"));
  ST_IS(ops->handle_preemptions(x.worker, NULL), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->handle_preemptions(x.sched, &(hixl_kv_ids){NULL, 0}), HIXL_KV_PARAM_INVALID);
  /* A list with a count and no array (before: read through NULL); a prompt past int64. */
  ST_IS(ops->update_connector_output(x.sched, &(hixl_kv_ids){NULL, 1}, NULL, NULL), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->update_connector_output(x.sched, NULL, NULL, &(hixl_kv_ids){NULL, 2}), HIXL_KV_PARAM_INVALID);
  CU_ASSERT(has_error("failed list"));
  hixl_kv_request huge = request("r3", UINT64_MAX, NULL);
  ST_IS(ops->get_num_new_matched_tokens(x.sched, &huge, 0, &tokens, &flag), HIXL_KV_PARAM_INVALID);
  CU_ASSERT(has_error("num_prompt_tokens"));
  ST_IS(ops->register_kv_groups(x.worker, NULL, 1), HIXL_KV_PARAM_INVALID);
  inst_down(&x);

  config(cfg, sizeof(cfg), free_port(), "both", 30000, "fail", 2000);
  char err[256];
  hixl_kv_connector *w = NULL;
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, &w, err, sizeof(err)), HIXL_KV_SUCCESS);
  struct kv k;
  kv_init(&k, BLOCK_BYTES);
  k.layers[1].block_bytes *= 2;
  ST_IS(ops->register_kv_caches(w, k.layers, LAYERS), HIXL_KV_PARAM_INVALID);
  CU_ASSERT(has_error("layer 1"));
  k.layers[1].block_bytes /= 2;
  k.layers[2].layout = 9;
  ST_IS(ops->register_kv_caches(w, k.layers, LAYERS), HIXL_KV_PARAM_INVALID);
  k.layers[2].layout = HIXL_KV_LAYOUT_KV_FIRST;
  k.layers[0].v_offset = BLOCK_BYTES;
  ST_IS(ops->register_kv_caches(w, k.layers, LAYERS), HIXL_KV_PARAM_INVALID);
  CU_ASSERT(has_error("overlaps"));
  ST_IS(ops->register_kv_caches(w, k.layers, 0), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->destroy(w), HIXL_KV_SUCCESS);
  free(k.mem);
}

/* A producer's scheduler that holds at most 2 requests (max_inflight_requests). */
static hixl_kv_connector *producer_sched_max2(void) {
  char cfg[640], err[256] = "";
  hixl_kv_connector *s = NULL;
  snprintf(cfg, sizeof(cfg),
           "{\"address\": \"%s:%u\", \"role\": \"producer\", \"max_inflight_requests\": 2, "
           "\"Transport\": \"%s\"}",
           test_ip(), (unsigned)free_port(), transport());
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &s, err, sizeof(err)), HIXL_KV_SUCCESS);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  return s;
}

/* ---- a host that misuses the plugin: a clear status each time, nothing held ---- */

struct alloc_arg {
  hixl_kv_connector *w;
  uintptr_t base[16];
  hixl_kv_status st[16];
};

static void *alloc_main(void *p) {
  struct alloc_arg *a = p;
  for (int i = 0; i < 16; i++) a->st[i] = ops->alloc_kv_memory(a->w, 4096, &a->base[i]);
  return NULL;
}

static int cmp_uptr(const void *a, const void *b) {
  return *(const uintptr_t *)a < *(const uintptr_t *)b ? -1 : *(const uintptr_t *)a > *(const uintptr_t *)b;
}

/* alloc_kv_memory on six threads at once: every call its own memory, all freed by destroy
 * (before: two calls grew the list to the same size and both appended, one past its end). */
static void test_alloc_memory_threads(void) {
  char cfg[512], err[256];
  hixl_kv_connector *w = NULL;
  struct alloc_arg a[6] = {0};
  pthread_t t[6];
  uintptr_t all[6 * 16];
  config(cfg, sizeof(cfg), free_port(), "both", 30000, "fail", 2000);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, &w, err, sizeof(err)), HIXL_KV_SUCCESS);
  for (int i = 0; i < 6; i++) {
    a[i].w = w;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&t[i], NULL, alloc_main, &a[i]), 0);
  }
  for (int i = 0; i < 6; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 16; j++) {
      CU_ASSERT_EQUAL(a[i].st[j], HIXL_KV_SUCCESS);
      all[i * 16 + j] = a[i].base[j];
      if (a[i].st[j] == HIXL_KV_SUCCESS) memset((void *)a[i].base[j], i, 4096); /* it is ours to write */
    }
  qsort(all, 6 * 16, sizeof(all[0]), cmp_uptr);
  for (int i = 1; i < 6 * 16; i++) CU_ASSERT(all[i] >= all[i - 1] + 4096);
  ST_IS(ops->destroy(w), HIXL_KV_SUCCESS);
}

struct shut_arg {
  hixl_kv_connector *c;
  hixl_kv_status st;
};

static void *shut_main(void *p) {
  struct shut_arg *a = p;
  a->st = ops->shutdown(a->c);
  return NULL;
}

/* shutdown on two threads at once (a push producer: its pusher thread runs from create):
 * both return, the threads joined once (before: both joined the pusher, and one of them
 * waited for ever); then destroy. */
static void test_shutdown_threads(void) {
  char cfg[512], err[256];
  struct shut_arg a[2] = {0};
  pthread_t t[2];
  config_push(cfg, sizeof(cfg), free_port(), "producer", 10000);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, &a[0].c, err, sizeof(err)), HIXL_KV_SUCCESS);
  a[1].c = a[0].c;
  for (int i = 0; i < 2; i++) CU_ASSERT_EQUAL_FATAL(pthread_create(&t[i], NULL, shut_main, &a[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  CU_ASSERT(a[0].st == HIXL_KV_SUCCESS && a[1].st == HIXL_KV_SUCCESS);
  ST_IS(ops->shutdown(a[0].c), HIXL_KV_SUCCESS);
  ST_IS(ops->destroy(a[0].c), HIXL_KV_SUCCESS);
}

/* request_finished twice for one request: the second is refused, and the request holds
 * one place of max_inflight_requests (before: two, one never given back). */
static void test_finished_twice(void) {
  hixl_kv_connector *s = producer_sched_max2();
  uint64_t blocks[2] = {3, 4};
  const char *ids[3] = {"t-1", "t-2", "t-3"};
  for (int k = 0; k < 2; k++) {
    hixl_kv_request r = request(ids[0], 2 * BLOCK_TOKENS, "{\"do_remote_decode\": true}");
    int32_t delay = -1;
    hixl_kv_buffer out = {0};
    ST_IS(ops->request_finished(s, &r, blocks, 2, &delay, &out), k ? HIXL_KV_PARAM_INVALID : HIXL_KV_SUCCESS);
    if (k) CU_ASSERT(has_error("held already"));
    ops->free_buffer(&out);
  }
  ST_IS(ops->update_connector_output(s, &(hixl_kv_ids){ids, 1}, NULL, NULL), HIXL_KV_SUCCESS);
  for (int i = 1; i < 3; i++) { /* both held: t-1's one place is free again */
    hixl_kv_request r = request(ids[i], 2 * BLOCK_TOKENS, "{\"do_remote_decode\": true}");
    int32_t delay = -1;
    hixl_kv_buffer out = {0};
    ST_IS(ops->request_finished(s, &r, blocks, 2, &delay, &out), HIXL_KV_SUCCESS);
    CU_ASSERT_EQUAL(delay, 1);
    ops->free_buffer(&out);
  }
  ST_IS(ops->destroy(s), HIXL_KV_SUCCESS);
}

/* Bind the scheduler's metadata at the worker: its status (not stepped: that asserts). */
static hixl_kv_status bind_once(hixl_kv_connector *sched, hixl_kv_connector *worker) {
  hixl_kv_buffer m = {0};
  ST_IS(ops->build_connector_meta(sched, &m), HIXL_KV_SUCCESS);
  hixl_kv_status st = ops->bind_connector_meta(worker, m.data, m.len);
  ops->free_buffer(&m);
  return st;
}

/* Whether the worker reports id finished sending, and holds no block after. */
static bool sent_and_empty(hixl_kv_connector *worker, const char *id) {
  hixl_kv_ids sd = {0}, rv = {0};
  hixl_kv_stats st = {0};
  bool sent = ops->get_finished(worker, NULL, &sd, &rv) == HIXL_KV_SUCCESS && ids_have(&sd, id);
  ops->free_ids(&sd);
  ops->free_ids(&rv);
  ops->get_stats(worker, &st);
  if (!sent || st.blocks_held || st.requests_held)
    fprintf(stderr, "%s: sent %d, blocks_held %llu, requests_held %llu\n", id, sent,
            (unsigned long long)st.blocks_held, (unsigned long long)st.requests_held);
  return sent && st.blocks_held == 0 && st.requests_held == 0;
}

/* A producer's block id past its caches' blocks: the hold is refused at bind, said, and
 * the request reported finished (the host frees its blocks); nothing is held, so no PIN
 * grants memory for it (before: held, and a PIN granted memory past the request's). */
static void test_hold_past_blocks(void) {
  char cfg[512];
  struct inst x;
  config(cfg, sizeof(cfg), free_port(), "both", 30000, "fail", 2000);
  ST_IS(inst_up(&x, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  uint64_t blocks[2] = {1, BLOCKS};
  hixl_kv_request r = request("past-1", 2 * BLOCK_TOKENS, "{\"do_remote_decode\": true}");
  int32_t delay = -1;
  hixl_kv_buffer out = {0};
  ST_IS(ops->request_finished(x.sched, &r, blocks, 2, &delay, &out), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(delay, 1);
  ops->free_buffer(&out);
  ST_IS(bind_once(x.sched, x.worker), HIXL_KV_PARAM_INVALID);
  CU_ASSERT(has_error("is past its 32 blocks"));
  CU_ASSERT_TRUE(sent_and_empty(x.worker, "past-1"));
  inst_down(&x);
}

/* A push consumer's expected block past its caches' blocks: refused at bind, said, the
 * load reported received with its blocks in the load errors, nothing expected (before:
 * expected, and an ACCEPT granted the producer memory past the caches: another
 * request's blocks, which it then overwrote). */
static void test_expect_past_blocks(void) {
  char cfg[512];
  struct inst d;
  config_push(cfg, sizeof(cfg), free_port(), "consumer", 10000);
  ST_IS(inst_up(&d, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  uint64_t blocks[2] = {1, BLOCKS};
  decode_alloc(&d, "xpast-1", "{\"do_remote_prefill\": true}", blocks, 2);
  hixl_kv_buffer params = {0};
  ST_IS(ops->get_push_params(d.sched, "xpast-1", 7, &params), HIXL_KV_SUCCESS);
  ops->free_buffer(&params);
  ST_IS(bind_once(d.sched, d.worker), HIXL_KV_PARAM_INVALID);
  CU_ASSERT(has_error("is past its 32 blocks"));
  hixl_kv_ids sd = {0}, rv = {0};
  ST_IS(ops->get_finished(d.worker, NULL, &sd, &rv), HIXL_KV_SUCCESS);
  CU_ASSERT_TRUE(ids_have(&rv, "xpast-1"));
  ops->free_ids(&sd);
  ops->free_ids(&rv);
  hixl_kv_blocks eb = {0};
  ST_IS(ops->get_block_ids_with_load_errors(d.worker, &eb), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(eb.count, 2);
  ops->free_buffer(&eb.raw);
  inst_down(&d);
}

/* A HOLD bound before the worker registered its caches: refused (there is nothing to
 * check its blocks against; before, bound unchecked, and a PIN granted whatever ids it
 * named once the caches came). */
static void test_hold_before_register(void) {
  char cfg[512], err[256];
  struct inst x = {0};
  config(cfg, sizeof(cfg), free_port(), "producer", 10000, "fail", 2000);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &x.sched, err, sizeof(err)),
        HIXL_KV_SUCCESS);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, &x.worker, err, sizeof(err)),
        HIXL_KV_SUCCESS);
  uint64_t blocks[2] = {1, 2};
  hixl_kv_request r = request("early-1", 2 * BLOCK_TOKENS, "{\"do_remote_decode\": true}");
  int32_t delay = -1;
  hixl_kv_buffer out = {0};
  ST_IS(ops->request_finished(x.sched, &r, blocks, 2, &delay, &out), HIXL_KV_SUCCESS);
  ops->free_buffer(&out);
  ST_IS(bind_once(x.sched, x.worker), HIXL_KV_PARAM_INVALID);
  CU_ASSERT(has_error("of KV caches registered"));
  CU_ASSERT_TRUE(sent_and_empty(x.worker, "early-1"));
  inst_down(&x);
}

/* A push-mode scheduler's PUSH bound by a pull-mode worker (the two configured apart):
 * refused at bind, said, and reported finished and failed (before: queued for a pusher
 * that does not run here, its blocks held for ever). */
static void test_push_into_pull(void) {
  char pcfg[512], wcfg[512], err[256];
  struct inst x = {0};
  uint16_t port = free_port();
  config_push(pcfg, sizeof(pcfg), port, "producer", 10000);
  config(wcfg, sizeof(wcfg), port, "producer", 10000, "fail", 2000);
  ST_IS(ops->create(pcfg, strlen(pcfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &x.sched, err, sizeof(err)),
        HIXL_KV_SUCCESS);
  ST_IS(ops->create(wcfg, strlen(wcfg), HIXL_KV_ROLE_WORKER, 0, 1, &x.worker, err, sizeof(err)),
        HIXL_KV_SUCCESS);
  kv_init(&x.kv, BLOCK_BYTES);
  ST_IS(ops->register_kv_caches(x.worker, x.kv.layers, LAYERS), HIXL_KV_SUCCESS);
  const char *params = "{\"do_remote_decode\": true, \"remote_engine\": \"127.0.0.1:9\", "
                       "\"remote_request_id\": \"c1\", \"remote_block_ids\": [1, 2], \"hixl_abi\": 1, "
                       "\"tp_size\": 1, \"cap\": \"00112233445566778899aabbccddeeff\"}";
  uint64_t blocks[2] = {3, 4};
  hixl_kv_request r = request("pp-1", 2 * BLOCK_TOKENS, params);
  ST_IS(ops->update_state_after_alloc(x.sched, &r, blocks, 2, 0), HIXL_KV_SUCCESS);
  ST_IS(bind_once(x.sched, x.worker), HIXL_KV_PARAM_INVALID);
  CU_ASSERT(has_error("this worker's mode is pull"));
  CU_ASSERT_TRUE(sent_and_empty(x.worker, "pp-1"));
  hixl_kv_stats st = {0};
  ST_IS(ops->get_stats(x.worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(st.pushes_failed, 1);
  inst_down(&x);
}

/* A request whose entry the worker refused at bind: reported finished at once (sending,
 * or receiving with its blocks 3 and 4 in the load errors), nothing held after. The
 * worker's stats then. */
static hixl_kv_stats_ex ended_refused(struct inst *x, const char *id, bool sending) {
  hixl_kv_ids sd = {0}, rv = {0};
  ST_IS(ops->get_finished(x->worker, NULL, &sd, &rv), HIXL_KV_SUCCESS);
  CU_ASSERT_TRUE(ids_have(sending ? &sd : &rv, id));
  ops->free_ids(&sd);
  ops->free_ids(&rv);
  uint64_t errs[4] = {0};
  size_t nerr = load_errors(x, errs, 4);
  if (!sending) CU_ASSERT_TRUE(nerr == 2 && errs[0] == 3 && errs[1] == 4);
  hixl_kv_stats_ex st = {.size = sizeof(st)};
  ST_IS(ops->get_stats_ex(x->worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT(st.blocks_held == 0 && st.requests_held == 0);
  return st;
}

/* Each kind of entry's request params: a HOLD's (none), a LOAD's, a PUSH's, an EXPECT's. */
static const char *const entry_params[4] = {
    NULL,
    "{\"do_remote_prefill\": true, \"remote_engine\": \"127.0.0.1:9\", \"remote_request_id\": \"p1\", "
    "\"remote_block_ids\": [5, 6], \"hixl_abi\": 1, \"tp_size\": 1, "
    "\"cap\": \"00112233445566778899aabbccddeeff\"}",
    "{\"do_remote_decode\": true, \"remote_engine\": \"127.0.0.1:9\", \"remote_request_id\": \"c1\", "
    "\"remote_block_ids\": [1, 2], \"hixl_abi\": 1, \"tp_size\": 1, "
    "\"cap\": \"00112233445566778899aabbccddeeff\"}",
    "{\"do_remote_prefill\": true}"};

/* Metadata bound after shutdown (no thread is left to run it), and a LOAD bound before
 * it that no start_load_kv started: each request is reported finished (a HOLD or PUSH:
 * sending; a LOAD or EXPECT: receiving, its blocks in the load errors) and the bind
 * answers FAILED, said (before: taken, and never finished: the host waited for ever). */
static void test_bind_after_shutdown(void) {
  static const char *const role[4] = {"producer", "consumer", "producer", "consumer"};
  static const char *const ids[5] = {"sd-hold", "sd-load", "sd-push", "sd-expect", "sd-unstarted"};
  const char *const *params = entry_params;
  for (int k = 0; k < 5; k++) {
    char cfg[512];
    struct inst x = {0};
    bool push = k == 2 || k == 3;
    if (push)
      config_push(cfg, sizeof(cfg), free_port(), role[k], 10000);
    else
      config(cfg, sizeof(cfg), free_port(), k == 4 ? "consumer" : role[k], 10000, "fail", 2000);
    ST_IS(inst_up(&x, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
    uint64_t blocks[2] = {3, 4};
    hixl_kv_request r = request(ids[k], 2 * BLOCK_TOKENS, params[k == 4 ? 1 : k]);
    if (k == 0) {
      int32_t delay = -1;
      hixl_kv_buffer out = {0};
      ST_IS(ops->request_finished(x.sched, &r, blocks, 2, &delay, &out), HIXL_KV_SUCCESS);
      ops->free_buffer(&out);
    } else if (k == 3) {
      decode_alloc(&x, ids[k], params[k], blocks, 2);
      hixl_kv_buffer out = {0};
      ST_IS(ops->get_push_params(x.sched, ids[k], strlen(ids[k]), &out), HIXL_KV_SUCCESS);
      ops->free_buffer(&out);
    } else {
      ST_IS(ops->update_state_after_alloc(x.sched, &r, blocks, 2, 2 * BLOCK_TOKENS), HIXL_KV_SUCCESS);
    }
    if (k == 4) { /* bound, then shut down before start_load_kv */
      ST_IS(bind_once(x.sched, x.worker), HIXL_KV_SUCCESS);
      ST_IS(ops->shutdown(x.worker), HIXL_KV_SUCCESS);
    } else {
      ST_IS(ops->shutdown(x.worker), HIXL_KV_SUCCESS);
      ST_IS(bind_once(x.sched, x.worker), HIXL_KV_FAILED);
      CU_ASSERT(has_error("shut down"));
    }
    ended_refused(&x, ids[k], k == 0 || k == 2);
    inst_down(&x);
  }
}

/* A worker whose config names another role than its scheduler's (kv_role set apart):
 * each entry it has no part for is refused at bind, said, and reported finished (a
 * HOLD or PUSH: sending; a LOAD or EXPECT: receiving, its blocks in the load errors),
 * so the host frees or recomputes (before: skipped without a word, and the host waited
 * for the request for ever, its blocks held). */
static void test_roles_mixed(void) {
  static const char *const sched_role[4] = {"producer", "consumer", "producer", "consumer"};
  static const char *const worker_role[4] = {"consumer", "producer", "consumer", "producer"};
  static const char *const ids[4] = {"rm-hold", "rm-load", "rm-push", "rm-expect"};
  const char *const *params = entry_params;
  for (int k = 0; k < 4; k++) {
    char scfg[512], wcfg[512], err[256];
    struct inst x = {0};
    uint16_t port = free_port();
    bool push = k >= 2;
    if (push) {
      config_push(scfg, sizeof(scfg), port, sched_role[k], 10000);
      config_push(wcfg, sizeof(wcfg), port, worker_role[k], 10000);
    } else {
      config(scfg, sizeof(scfg), port, sched_role[k], 10000, "fail", 2000);
      config(wcfg, sizeof(wcfg), port, worker_role[k], 10000, "fail", 2000);
    }
    ST_IS(ops->create(scfg, strlen(scfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &x.sched, err, sizeof(err)),
          HIXL_KV_SUCCESS);
    ST_IS(ops->create(wcfg, strlen(wcfg), HIXL_KV_ROLE_WORKER, 0, 1, &x.worker, err, sizeof(err)),
          HIXL_KV_SUCCESS);
    kv_init(&x.kv, BLOCK_BYTES);
    ST_IS(ops->register_kv_caches(x.worker, x.kv.layers, LAYERS), HIXL_KV_SUCCESS);
    uint64_t blocks[2] = {3, 4};
    hixl_kv_request r = request(ids[k], 2 * BLOCK_TOKENS, params[k]);
    if (k == 0) { /* a HOLD: the host keeps the blocks until get_finished reports them sent */
      int32_t delay = -1;
      hixl_kv_buffer out = {0};
      ST_IS(ops->request_finished(x.sched, &r, blocks, 2, &delay, &out), HIXL_KV_SUCCESS);
      CU_ASSERT_EQUAL(delay, 1);
      ops->free_buffer(&out);
    } else if (k == 3) { /* an EXPECT: the host waits for the push to land */
      decode_alloc(&x, ids[k], params[k], blocks, 2);
      hixl_kv_buffer out = {0};
      ST_IS(ops->get_push_params(x.sched, ids[k], strlen(ids[k]), &out), HIXL_KV_SUCCESS);
      ops->free_buffer(&out);
    } else { /* a LOAD (waited for as received) or a PUSH (as sent) */
      ST_IS(ops->update_state_after_alloc(x.sched, &r, blocks, 2, 2 * BLOCK_TOKENS), HIXL_KV_SUCCESS);
    }
    ST_IS(bind_once(x.sched, x.worker), HIXL_KV_PARAM_INVALID);
    CU_ASSERT(has_error("role"));
    bool sending = k == 0 || k == 2;
    hixl_kv_stats_ex st = ended_refused(&x, ids[k], sending);
    CU_ASSERT_EQUAL(sending ? st.loads_failed : st.loads_failed - 1, 0);
    inst_down(&x);
  }
}

/* An EXPECT bound before the push consumer's worker registered its caches: refused,
 * said, and the load reported received with its blocks in the load errors (before:
 * refused but never reported, so the host waited for the request for ever). */
static void test_expect_before_register(void) {
  char cfg[512], err[256];
  struct inst d = {0};
  config_push(cfg, sizeof(cfg), free_port(), "consumer", 10000);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &d.sched, err, sizeof(err)),
        HIXL_KV_SUCCESS);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, &d.worker, err, sizeof(err)),
        HIXL_KV_SUCCESS);
  uint64_t blocks[2] = {1, 2}, errs[4] = {0};
  decode_alloc(&d, "xearly-1", "{\"do_remote_prefill\": true}", blocks, 2);
  hixl_kv_buffer params = {0};
  ST_IS(ops->get_push_params(d.sched, "xearly-1", 8, &params), HIXL_KV_SUCCESS);
  ops->free_buffer(&params);
  ST_IS(bind_once(d.sched, d.worker), HIXL_KV_PARAM_INVALID);
  CU_ASSERT(has_error("first"));
  hixl_kv_ids sd = {0}, rv = {0};
  ST_IS(ops->get_finished(d.worker, NULL, &sd, &rv), HIXL_KV_SUCCESS);
  CU_ASSERT_TRUE(ids_have(&rv, "xearly-1"));
  ops->free_ids(&sd);
  ops->free_ids(&rv);
  CU_ASSERT_TRUE(load_errors(&d, errs, 4) == 2 && errs[0] == 1 && errs[1] == 2);
  inst_down(&d);
}

/* ---- hand-offs ---- */

/* Prefill in a child process: serves one request, reports through a pipe. */
struct child {
  pid_t pid;
  int to_child, from_child;
};

struct prefill_args {
  uint16_t port;
  unsigned lease_ms;
  uint64_t seed;
  size_t nblocks;
};

/* The prefill runs in a child that re-executes this program (--child KIND PORT LEASE
 * SEED NBLOCKS, pipes on fds 3 and 4): a fork without exec would inherit the parent's
 * verbs state and locks of its engine threads. */
static int child_start(struct child *ch, const char *kind, const struct prefill_args *a) {
  int to[2], from[2];
  if (pipe(to) != 0 || pipe(from) != 0) return -1;
  ch->pid = fork();
  if (ch->pid < 0) return -1;
  if (ch->pid == 0) {
    char port[16], lease[16], seed[32], nb[16];
    snprintf(port, sizeof(port), "%u", (unsigned)a->port);
    snprintf(lease, sizeof(lease), "%u", a->lease_ms);
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)a->seed);
    snprintf(nb, sizeof(nb), "%zu", a->nblocks);
    if (dup2(to[0], 3) < 0 || dup2(from[1], 4) < 0) _exit(126);
    execl("/proc/self/exe", "test_plugin", "--child", kind, port, lease, seed, nb, (char *)NULL);
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  ch->to_child = to[1];
  ch->from_child = from[0];
  return 0;
}

/* A line from fd within timeout_ms, into buf; false on timeout or end. */
static bool read_line(int fd, char *buf, size_t cap, int timeout_ms) {
  size_t n = 0;
  int64_t end = now_ms() + timeout_ms;
  while (n + 1 < cap) {
    struct pollfd p = {fd, POLLIN, 0};
    int left = (int)(end - now_ms());
    if (left <= 0 || poll(&p, 1, left) <= 0) return false;
    if (read(fd, buf + n, 1) != 1) return false;
    if (buf[n] == '\n') break;
    n++;
  }
  buf[n] = '\0';
  return true;
}

static void write_line(int fd, const char *fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (write(fd, buf, (size_t)n) != n) _exit(3);
}

static const uint64_t prefill_blocks[] = {3, 4, 5, 6, 10, 11, 20, 31};
static const uint64_t decode_blocks[] = {0, 1, 2, 7, 8, 9, 12, 13};

/* The prefill child: "params <json>", then "freed <held blocks>" when the decode
 * freed the request (or its lease ran out), then waits for "exit". */
static void prefill_main(int in, int out, void *arg) {
  struct prefill_args *a = arg;
  char cfg[512], line[64];
  struct inst p;
  config(cfg, sizeof(cfg), a->port, "producer", a->lease_ms, "fail", 3000);
  if (inst_up(&p, cfg, BLOCK_BYTES) != HIXL_KV_SUCCESS) {
    write_line(out, "error %s\n", ops->last_error());
    _exit(1);
  }
  char *params = prefill_finish(&p, "req-7", a->seed, prefill_blocks, a->nblocks);
  write_line(out, "params %s\n", params);
  free(params);
  bool freed = wait_finished(&p, "req-7", 0, 20000);
  hixl_kv_stats st;
  ops->get_stats(p.worker, &st);
  write_line(out, "freed %d held %llu expired %llu\n", freed, (unsigned long long)st.blocks_held,
             (unsigned long long)st.lease_expired);
  read_line(in, line, sizeof(line), 30000);
  ops->destroy(p.worker);
  ops->destroy(p.sched);
  _exit(0);
}

static void child_end(struct child *ch) {
  write_line(ch->to_child, "exit\n");
  int status = 0;
  CU_ASSERT_EQUAL(waitpid(ch->pid, &status, 0), ch->pid);
  CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(ch->to_child);
  close(ch->from_child);
}

/* A prefill child holding req-7 (seed, nblocks) and a decode whose connect and transfer
 * timeouts are timeout_ms; returns req-7's kv_transfer_params (to free), NULL if none. */
static char *pull_pair_up(struct child *ch, struct inst *d, uint64_t seed, size_t nblocks, int timeout_ms) {
  struct prefill_args a = {free_port(), 30000, seed, nblocks};
  char line[4096], cfg[512];
  if (child_start(ch, "pull", &a) != 0 || !read_line(ch->from_child, line, sizeof(line), 20000) ||
      strncmp(line, "params ", 7) != 0)
    return NULL;
  config(cfg, sizeof(cfg), free_port(), "consumer", 30000, "fail", timeout_ms);
  ST_IS(inst_up(d, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  return strdup(line + 7);
}

/* Load errors are exactly blocks[0..n). */
static bool load_errors_are(struct inst *d, const uint64_t *blocks, size_t n) {
  uint64_t errs[BLOCKS];
  size_t got = load_errors(d, errs, BLOCKS);
  return got == n && (n == 0 || memcmp(errs, blocks, n * sizeof(*blocks)) == 0);
}

static void test_pull_two_processes(void) {
  struct prefill_args a = {free_port(), 30000, 42, 8};
  struct child ch;
  char line[4096], cfg[512];
  CU_ASSERT_EQUAL_FATAL(child_start(&ch, "pull", &a), 0);
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  CU_ASSERT_EQUAL_FATAL(strncmp(line, "params ", 7), 0);
  const char *params = line + 7;
  CU_ASSERT_PTR_NOT_NULL(strstr(params, "\"remote_block_ids\":[3,4,5,6,10,11,20,31]"));
  struct inst d;
  config(cfg, sizeof(cfg), free_port(), "consumer", 30000, "fail", 3000);
  ST_IS(inst_up(&d, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  decode_load(&d, "dec-7", params, decode_blocks, 8);
  CU_ASSERT_TRUE(wait_finished(&d, "dec-7", 1, 20000));
  uint64_t errs[16];
  CU_ASSERT_EQUAL(load_errors(&d, errs, 16), 0);
  CU_ASSERT_EQUAL(kv_verify(&d.kv, 42, decode_blocks, 8), -1);
  /* Nothing outside the request's blocks was written. */
  CU_ASSERT_TRUE(others_untouched(&d.kv, decode_blocks, 8, 0xEE));
  hixl_kv_stats st;
  ST_IS(ops->get_stats(d.worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(st.loads_done, 1);
  CU_ASSERT_EQUAL(st.loads_failed, 0);
  /* Adjacent blocks coalesce: runs {3,4,5,6}->{0,1,2,7}: 3+1, {10,11}->{8,9}, {20}->{12},
   * {31}->{13}: 5 runs per tensor, 6 tensors. */
  CU_ASSERT_EQUAL(st.engine_ops, 5 * LAYERS * 2);
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  CU_ASSERT_STRING_EQUAL(line, "freed 1 held 0 expired 0");
  child_end(&ch);
  inst_down(&d);
}

/* get_event_fd: a decode that does not step waits on the fd and wakes when the KV has
 * landed; get_finished takes it and the fd is quiet again. Its argument checks. */
static void test_event_fd(void) {
  struct prefill_args a = {free_port(), 30000, 43, 8};
  struct child ch;
  char line[4096], cfg[512];
  int32_t fd = -1, fd2 = -1;
  CU_ASSERT_EQUAL_FATAL(child_start(&ch, "pull", &a), 0);
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  CU_ASSERT_EQUAL_FATAL(strncmp(line, "params ", 7), 0);
  struct inst d;
  config(cfg, sizeof(cfg), free_port(), "consumer", 30000, "fail", 3000);
  ST_IS(inst_up(&d, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  ST_IS(ops->get_event_fd(NULL, &fd), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->get_event_fd(d.worker, NULL), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->get_event_fd(d.sched, &fd), HIXL_KV_PARAM_INVALID);
  CU_ASSERT(has_error("scheduler"));
  ST_IS(ops->get_event_fd(d.worker, &fd), HIXL_KV_SUCCESS);
  ST_IS(ops->get_event_fd(d.worker, &fd2), HIXL_KV_SUCCESS);
  CU_ASSERT(fd >= 0 && fd == fd2);
  struct pollfd pf = {fd, POLLIN, 0};
  CU_ASSERT_EQUAL(poll(&pf, 1, 0), 0); /* nothing finished yet */
  decode_load(&d, "dec-8", line + 7, decode_blocks, 8);
  /* No more steps: the loader's completion alone makes the fd readable. */
  CU_ASSERT_EQUAL(poll(&pf, 1, 20000), 1);
  CU_ASSERT(pf.revents & POLLIN);
  CU_ASSERT(threads_named("hixl-kv-load") >= 1); /* named, for top -H and perf */
  CU_ASSERT(threads_named("hixl-progress") >= 1);
  CU_ASSERT_EQUAL(poll(&pf, 1, 0), 1); /* level: still readable until get_finished */
  hixl_kv_ids s = {0}, r = {0};
  ST_IS(ops->get_finished(d.worker, NULL, &s, &r), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(s.count, 0);
  CU_ASSERT_EQUAL(r.count, 1);
  CU_ASSERT(r.count == 1 && strcmp(r.ids[0], "dec-8") == 0);
  ops->free_ids(&s);
  ops->free_ids(&r);
  CU_ASSERT_EQUAL(poll(&pf, 1, 0), 0); /* all taken: quiet */
  CU_ASSERT_EQUAL(kv_verify(&d.kv, 43, decode_blocks, 8), -1);
  CU_ASSERT_TRUE(others_untouched(&d.kv, decode_blocks, 8, 0xEE));
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  CU_ASSERT_STRING_EQUAL(line, "freed 1 held 0 expired 0");
  child_end(&ch);
  inst_down(&d);
}

/* The lease runs out before any consumer comes: the producer frees the blocks and
 * reports them finished; a late consumer's load fails and reports its blocks. */
static void test_lease_expiry(void) {
  struct prefill_args a = {free_port(), 200, 5, 4};
  struct child ch;
  char line[4096], cfg[512];
  CU_ASSERT_EQUAL_FATAL(child_start(&ch, "pull", &a), 0);
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  char *params = strdup(line + 7);
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  CU_ASSERT_STRING_EQUAL(line, "freed 1 held 0 expired 1");
  struct inst d;
  config(cfg, sizeof(cfg), free_port(), "consumer", 30000, "recompute", 3000);
  ST_IS(inst_up(&d, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  decode_load(&d, "dec-5", params, decode_blocks, 4);
  CU_ASSERT_TRUE(wait_finished(&d, "dec-5", 1, 20000));
  uint64_t errs[16];
  CU_ASSERT_EQUAL(load_errors(&d, errs, 16), 4);
  CU_ASSERT(errs[0] == 0 && errs[3] == 7);
  CU_ASSERT_EQUAL(count_byte(&d.kv, 0xEE), d.kv.len); /* nothing moved */
  /* recompute: the scheduler, told of the failure, matches no tokens. */
  const char *failed_id = "dec-5";
  hixl_kv_ids failed = {&failed_id, 1};
  ST_IS(ops->update_connector_output(d.sched, NULL, NULL, &failed), HIXL_KV_SUCCESS);
  hixl_kv_request r = request("dec-5", 16, params);
  int64_t tokens = -5;
  int32_t async = 1;
  ST_IS(ops->get_num_new_matched_tokens(d.sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(tokens, 0);
  CU_ASSERT_EQUAL(async, 0);
  child_end(&ch);
  inst_down(&d);
  free(params);
}

/* The consumer aborts before loading: the producer frees at once. */
static void test_abort(void) {
  struct prefill_args a = {free_port(), 30000, 9, 2};
  struct child ch;
  char line[4096], cfg[512];
  CU_ASSERT_EQUAL_FATAL(child_start(&ch, "pull", &a), 0);
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  char *params = strdup(line + 7);
  struct inst d;
  config(cfg, sizeof(cfg), free_port(), "consumer", 30000, "fail", 3000);
  ST_IS(inst_up(&d, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  hixl_kv_request r = request("dec-9", 8, params);
  r.flags = HIXL_KV_REQ_ABORTED;
  int32_t delay = 1;
  hixl_kv_buffer out = {0};
  ST_IS(ops->request_finished(d.sched, &r, NULL, 0, &delay, &out), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(delay, 0);
  step(&d);
  int64_t t0 = now_ms();
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  CU_ASSERT_STRING_EQUAL(line, "freed 1 held 0 expired 0");
  CU_ASSERT(now_ms() - t0 < 10000); /* freed by the abort, not by the 30 s lease */
  child_end(&ch);
  inst_down(&d);
  free(params);
}

/* The producer dies after request_finished: the load fails within its timeout and
 * reports its blocks; nothing is written. */
static void test_producer_death(void) {
  struct prefill_args a = {free_port(), 30000, 11, 4};
  struct child ch;
  char line[4096], cfg[512];
  CU_ASSERT_EQUAL_FATAL(child_start(&ch, "pull", &a), 0);
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  char *params = strdup(line + 7);
  kill(ch.pid, SIGKILL);
  waitpid(ch.pid, NULL, 0);
  struct inst d;
  config(cfg, sizeof(cfg), free_port(), "consumer", 30000, "fail", 1500);
  ST_IS(inst_up(&d, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  int64_t t0 = now_ms();
  decode_load(&d, "dec-11", params, decode_blocks, 4);
  CU_ASSERT_TRUE(wait_finished(&d, "dec-11", 1, 20000));
  CU_ASSERT(now_ms() - t0 < 6000);
  uint64_t errs[16];
  CU_ASSERT_EQUAL(load_errors(&d, errs, 16), 4);
  CU_ASSERT_EQUAL(count_byte(&d.kv, 0xEE), d.kv.len);
  close(ch.to_child);
  close(ch.from_child);
  inst_down(&d);
  free(params);
}

/* load_in_forward: a pull consumer whose loads are the runtime's synchronous ones. */
static char *config_in_forward(char *buf, size_t cap, uint16_t port, int timeout_ms) {
  char base[512];
  config(base, sizeof(base), port, "consumer", 30000, "fail", timeout_ms);
  snprintf(buf, cap, "{\"load_in_forward\": true, %s", base + 1);
  return buf;
}

/* Match and allocate as a runtime does for a synchronous load: async 0, every prompt
 * token but the last loaded (all n blocks). */
static void decode_alloc_sync(struct inst *d, const char *id, const char *params, const uint64_t *blocks,
                              size_t n) {
  hixl_kv_request r = request(id, n * BLOCK_TOKENS, params);
  int64_t tokens = 0;
  int32_t async = 1;
  ST_IS(ops->get_num_new_matched_tokens(d->sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(tokens, (int64_t)(n * BLOCK_TOKENS) - 1); /* the step computes the last token */
  CU_ASSERT_EQUAL(async, 0);
  ST_IS(ops->update_state_after_alloc(d->sched, &r, blocks, n, (uint64_t)tokens), HIXL_KV_SUCCESS);
}

/* Whether id shows in the worker's finished lists now (one get_finished). */
static bool reported_now(struct inst *x, const char *id) {
  hixl_kv_ids s = {0}, r = {0};
  ST_IS(ops->get_finished(x->worker, NULL, &s, &r), HIXL_KV_SUCCESS);
  bool seen = ids_have(&s, id) || ids_have(&r, id);
  ops->free_ids(&s);
  ops->free_ids(&r);
  return seen;
}

/* load_in_forward: get_num_new_matched_tokens says the load is synchronous; the step's
 * start_load_kv returns with every byte there (no get_finished between: the forward
 * pass writes the new token's KV into these blocks next), wait_for_layer_load at once;
 * get_finished never reports the request; the producer frees it. */
static void test_load_in_forward(void) {
  struct prefill_args a = {free_port(), 30000, 47, 8};
  struct child ch;
  char line[4096], cfg[600];
  CU_ASSERT_EQUAL_FATAL(child_start(&ch, "pull", &a), 0);
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  CU_ASSERT_EQUAL_FATAL(strncmp(line, "params ", 7), 0);
  struct inst d;
  config_in_forward(cfg, sizeof(cfg), free_port(), 3000);
  ST_IS(inst_up(&d, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  decode_alloc_sync(&d, "dec-f", line + 7, decode_blocks, 8);
  step(&d); /* bind, start_load_kv */
  CU_ASSERT_EQUAL(kv_verify(&d.kv, 47, decode_blocks, 8), -1);
  CU_ASSERT_TRUE(others_untouched(&d.kv, decode_blocks, 8, 0xEE));
  for (uint32_t l = 0; l < LAYERS; l++) ST_IS(ops->wait_for_layer_load(d.worker, l), HIXL_KV_SUCCESS);
  uint64_t errs[16];
  CU_ASSERT_EQUAL(load_errors(&d, errs, 16), 0);
  CU_ASSERT_FALSE(reported_now(&d, "dec-f"));
  hixl_kv_stats st;
  ST_IS(ops->get_stats(d.worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(st.loads_done, 1);
  CU_ASSERT_EQUAL(st.loads_failed, 0);
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  CU_ASSERT_STRING_EQUAL(line, "freed 1 held 0 expired 0");
  /* The next step has no load: its forward pass does not wait. */
  step(&d);
  ST_IS(ops->wait_for_layer_load(d.worker, 0), HIXL_KV_SUCCESS);
  CU_ASSERT_FALSE(reported_now(&d, "dec-f"));
  child_end(&ch);
  inst_down(&d);
}

/* load_in_forward, the producer dead: start_load_kv's wait ends within the load's
 * timeouts, the blocks are load errors (the runtime recomputes or fails the request),
 * nothing is written, and get_finished does not report it. */
static void test_load_in_forward_producer_death(void) {
  struct prefill_args a = {free_port(), 30000, 48, 4};
  struct child ch;
  char line[4096], cfg[600];
  CU_ASSERT_EQUAL_FATAL(child_start(&ch, "pull", &a), 0);
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  char *params = strdup(line + 7);
  kill(ch.pid, SIGKILL);
  waitpid(ch.pid, NULL, 0);
  struct inst d;
  config_in_forward(cfg, sizeof(cfg), free_port(), 1500);
  ST_IS(inst_up(&d, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  decode_alloc_sync(&d, "dec-fd", params, decode_blocks, 4);
  step(&d); /* start_load_kv returns once the load failed */
  ST_IS(ops->wait_for_layer_load(d.worker, 0), HIXL_KV_SUCCESS);
  CU_ASSERT_TRUE(load_errors_are(&d, decode_blocks, 4));
  CU_ASSERT_EQUAL(count_byte(&d.kv, 0xEE), d.kv.len);
  CU_ASSERT_FALSE(reported_now(&d, "dec-fd"));
  hixl_kv_stats st;
  ST_IS(ops->get_stats(d.worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(st.loads_failed, 1);
  close(ch.to_child);
  close(ch.from_child);
  inst_down(&d);
  free(params);
}

/* load_in_forward belongs to pull mode: with mode push, create refuses it, naming it. */
static void test_load_in_forward_push_refused(void) {
  char base[512], cfg[600], err[256] = "";
  hixl_kv_connector *w = NULL;
  config(base, sizeof(base), free_port(), "consumer", 30000, "fail", 1000);
  char *pull = strstr(base, "\"pull\"");
  CU_ASSERT_PTR_NOT_NULL_FATAL(pull);
  snprintf(cfg, sizeof(cfg), "{\"load_in_forward\": true, %.*s\"push\"%s", (int)(pull - base - 1), base + 1,
           pull + 6);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, &w, err, sizeof(err)),
        HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(w);
  CU_ASSERT_PTR_NOT_NULL(strstr(err, "load_in_forward"));
}

/* A consumer whose blocks are another size: the load fails naming both layouts and
 * moves nothing; the producer is told to free. */
static void mismatch_case(uint64_t seed, const char *id, uint64_t block_bytes, uint32_t world) {
  struct prefill_args a = {free_port(), 30000, seed, 4};
  struct child ch;
  char line[4096], cfg[512];
  CU_ASSERT_EQUAL_FATAL(child_start(&ch, "pull", &a), 0);
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  char *params = strdup(line + 7);
  struct inst d;
  config(cfg, sizeof(cfg), free_port(), "consumer", 30000, "fail", 3000);
  ST_IS(inst_up_tp(&d, cfg, block_bytes, world), HIXL_KV_SUCCESS);
  decode_load(&d, id, params, decode_blocks, 4);
  CU_ASSERT_TRUE(wait_finished(&d, id, 1, 20000));
  uint64_t errs[16];
  CU_ASSERT_EQUAL(load_errors(&d, errs, 16), 4);
  CU_ASSERT_EQUAL(count_byte(&d.kv, 0xEE), d.kv.len);
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  CU_ASSERT_STRING_EQUAL(line, "freed 1 held 0 expired 0");
  child_end(&ch);
  inst_down(&d);
  free(params);
}

static void test_layout_mismatch(void) { mismatch_case(13, "dec-13", BLOCK_BYTES / 2, 1); }

/* A consumer of another tensor-parallel size (2 against the producer's 1) whose
 * layout has no head dimension (kv_first): the load fails (a rank's heads cannot be
 * cut from its blocks), moves nothing, and the producer frees. */
static void test_tp_mismatch(void) { mismatch_case(14, "dec-14", BLOCK_BYTES, 2); }

/* A producer that refuses connections (nothing listens at its address) does not stall
 * the loads of a healthy one bound in the same step behind it: A is received and
 * verified while B still waits out connect_timeout_ms, and B fails after. */
static void test_dead_producer_no_stall(void) {
  enum { T = 10000 }; /* connect and transfer timeout; A's load on loopback takes milliseconds */
  struct child ch = {0};
  struct inst d;
  char dead[64];
  char *params = pull_pair_up(&ch, &d, 46, 4, T);
  CU_ASSERT_PTR_NOT_NULL_FATAL(params);
  snprintf(dead, sizeof(dead), "%s:%u", test_ip(), (unsigned)free_port());
  char *dead_params = params_with(params, "remote_engine", dead);
  CU_ASSERT_PTR_NOT_NULL_FATAL(dead_params);
  const char *ids[2] = {"dec-a", "dec-b"};
  decode_alloc(&d, ids[1], dead_params, decode_blocks + 4, 4); /* B ahead of A in the step's metadata */
  decode_alloc(&d, ids[0], params, decode_blocks, 4);
  step(&d);
  bool seen[2] = {false, false};
  CU_ASSERT(wait_any(&d, ids, seen, 2, 1, T + 10000) > 0);
  CU_ASSERT_TRUE(seen[0]);  /* A first ... */
  CU_ASSERT_FALSE(seen[1]); /* ... while B still links */
  CU_ASSERT_EQUAL(kv_verify(&d.kv, 46, decode_blocks, 4), -1);
  CU_ASSERT_TRUE(wait_all(&d, ids, seen, 2, 1, T + 10000));
  CU_ASSERT_TRUE(load_errors_are(&d, decode_blocks + 4, 4)); /* B's, and none of A's */
  CU_ASSERT_TRUE(others_untouched(&d.kv, decode_blocks, 4, 0xEE));
  char line[128];
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  CU_ASSERT_STRING_EQUAL(line, "freed 1 held 0 expired 0");
  child_end(&ch);
  inst_down(&d);
  free(dead_params);
  free(params);
}

/* A request id the producer never held fails at once (NOT_FOUND), not after
 * transfer_timeout_ms, and moves nothing; the id it holds still loads after it. */
static void test_never_held_fails_at_once(void) {
  struct child ch = {0};
  struct inst d;
  char *params = pull_pair_up(&ch, &d, 47, 4, 30000);
  CU_ASSERT_PTR_NOT_NULL_FATAL(params);
  char *bogus = params_with(params, "remote_request_id", "never-held");
  CU_ASSERT_PTR_NOT_NULL_FATAL(bogus);
  decode_load(&d, "dec-n", bogus, decode_blocks + 4, 4);
  CU_ASSERT_TRUE(wait_finished(&d, "dec-n", 1, 10000)); /* a third of the timeout */
  CU_ASSERT_TRUE(load_errors_are(&d, decode_blocks + 4, 4));
  CU_ASSERT_EQUAL(count_byte(&d.kv, 0xEE), d.kv.len);
  decode_load(&d, "dec-7", params, decode_blocks, 4);
  CU_ASSERT_TRUE(wait_finished(&d, "dec-7", 1, 20000));
  CU_ASSERT_TRUE(load_errors_are(&d, NULL, 0));
  CU_ASSERT_EQUAL(kv_verify(&d.kv, 47, decode_blocks, 4), -1);
  CU_ASSERT_TRUE(others_untouched(&d.kv, decode_blocks, 4, 0xEE));
  hixl_kv_stats st;
  ST_IS(ops->get_stats(d.worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT(st.loads_done == 1 && st.loads_failed == 1 && st.blocks_held == 0);
  char line[128];
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  CU_ASSERT_STRING_EQUAL(line, "freed 1 held 0 expired 0");
  child_end(&ch);
  inst_down(&d);
  free(bogus);
  free(params);
}

static bool push_pipelining = true; /* the push prefill child's layer_pipelining */

static char *config_push(char *buf, size_t cap, uint16_t port, const char *role, unsigned lease_ms) {
  snprintf(buf, cap,
           "{\"address\": \"%s:%u\", \"role\": \"%s\", \"mode\": \"push\", \"lease_ms\": %u,\n"
           " \"transfer_timeout_ms\": 3000, \"connect_timeout_ms\": 3000, \"Transport\": \"%s\",\n"
           " \"layer_pipelining\": %s}\n",
           test_ip(), (unsigned)port, role, lease_ms, transport(), push_pipelining ? "true" : "false");
  return buf;
}

/* The push producer child: reads "params <json>", binds the PUSH, then computes
 * layer by layer; after each save_kv_layer it says "saved L" and waits for "next"
 * (the decode checked that layer L arrived and L + 1 did not). */
static void push_prefill_main(int in, int out, void *arg) {
  uint16_t port = ((struct prefill_args *)arg)->port;
  char cfg[512], line[4096];
  struct inst p;
  config_push(cfg, sizeof(cfg), port, "producer", 10000);
  if (inst_up(&p, cfg, BLOCK_BYTES) != HIXL_KV_SUCCESS || !read_line(in, line, sizeof(line), 20000)) _exit(1);
  hixl_kv_request r = request("pre-1", 8 * BLOCK_TOKENS, line + 7);
  int64_t tokens = -1;
  int32_t async = 1;
  if (ops->get_num_new_matched_tokens(p.sched, &r, 0, &tokens, &async) != HIXL_KV_SUCCESS || tokens != 0)
    _exit(2);
  if (ops->update_state_after_alloc(p.sched, &r, prefill_blocks, 8, 0) != HIXL_KV_SUCCESS) _exit(3);
  step(&p);
  for (int l = 0; l < LAYERS; l++) {
    kv_compute_layer(&p.kv, l, ((struct prefill_args *)arg)->seed, prefill_blocks, 8);
    ops->save_kv_layer(p.worker, (uint32_t)l);
    write_line(out, "saved %d\n", l);
    if (!read_line(in, line, sizeof(line), 20000) || strcmp(line, "next") != 0) _exit(4);
  }
  ops->wait_for_save(p.worker);
  int32_t delay = 0;
  hixl_kv_buffer none = {0};
  if (ops->request_finished(p.sched, &r, prefill_blocks, 8, &delay, &none) != HIXL_KV_SUCCESS || delay != 1)
    _exit(5);
  bool freed = wait_finished(&p, "pre-1", 0, 20000);
  hixl_kv_stats st;
  ops->get_stats(p.worker, &st);
  write_line(out, "freed %d held %llu pushed %llu layers %llu\n", freed, (unsigned long long)st.blocks_held,
             (unsigned long long)st.pushes_done, (unsigned long long)st.layers_pushed);
  read_line(in, line, sizeof(line), 30000);
  ops->destroy(p.worker);
  ops->destroy(p.sched);
  _exit(0);
}

/* Push mode in two processes: decode allocates first and hands its blocks to
 * prefill, which writes each layer as save_kv_layer releases it: layer L is in
 * decode's blocks before prefill computes L + 1. Without layer pipelining (kind
 * "push-whole") nothing is sent before the last layer is saved, then every layer. */
static void push_handoff(const char *kind, uint64_t seed, const char *id) {
  bool pipelined = strcmp(kind, "push") == 0;
  struct prefill_args a = {free_port(), 10000, seed, 8};
  struct child ch;
  char line[4096], cfg[512];
  CU_ASSERT_EQUAL_FATAL(child_start(&ch, kind, &a), 0);
  struct inst d;
  config_push(cfg, sizeof(cfg), free_port(), "consumer", 10000);
  ST_IS(inst_up(&d, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  const char *mark = "{\"do_remote_prefill\": true}";
  hixl_kv_request r = request(id, 8 * BLOCK_TOKENS, mark);
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d.sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(tokens, 8 * BLOCK_TOKENS);
  ST_IS(ops->update_state_after_alloc(d.sched, &r, decode_blocks, 8, (uint64_t)tokens), HIXL_KV_SUCCESS);
  hixl_kv_buffer params = {0};
  ST_IS(ops->get_push_params(d.sched, id, strlen(id), &params), HIXL_KV_SUCCESS);
  CU_ASSERT_PTR_NOT_NULL(strstr((char *)params.data, "\"remote_block_ids\":[0,1,2,7,8,9,12,13]"));
  ST_IS(ops->get_push_params(d.sched, id, strlen(id), &params), HIXL_KV_NOT_FOUND); /* handed out once */
  step(&d);
  write_line(ch.to_child, "params %.*s\n", (int)params.len, (char *)params.data);
  ops->free_buffer(&params);
  for (int l = 0; l < LAYERS; l++) {
    char want[32];
    snprintf(want, sizeof(want), "saved %d", l);
    CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
    CU_ASSERT_STRING_EQUAL(line, want);
    if (pipelined) {
      ST_IS(ops->wait_for_layer_load(d.worker, (uint32_t)l), HIXL_KV_SUCCESS);
      CU_ASSERT_EQUAL(kv_layer_state(&d.kv, l, seed, decode_blocks, 8), 1);
      if (l + 1 < LAYERS) CU_ASSERT_EQUAL(kv_layer_state(&d.kv, l + 1, seed, decode_blocks, 8), 0);
    } else if (l + 1 < LAYERS) { /* the producer saves no more until "next": nothing sent yet */
      CU_ASSERT_EQUAL(kv_layer_state(&d.kv, l, seed, decode_blocks, 8), 0);
    }
    write_line(ch.to_child, "next\n");
  }
  if (!pipelined) ST_IS(ops->wait_for_layer_load(d.worker, LAYERS - 1), HIXL_KV_SUCCESS);
  CU_ASSERT_TRUE(wait_finished(&d, id, 1, 20000));
  uint64_t errs[16];
  CU_ASSERT_EQUAL(load_errors(&d, errs, 16), 0);
  CU_ASSERT_EQUAL(kv_verify(&d.kv, seed, decode_blocks, 8), -1);
  CU_ASSERT_TRUE(others_untouched(&d.kv, decode_blocks, 8, 0xEE));
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  char want[96];
  snprintf(want, sizeof(want), "freed 1 held 0 pushed 1 layers %d", LAYERS);
  CU_ASSERT_STRING_EQUAL(line, want);
  child_end(&ch);
  inst_down(&d);
}

static void test_push_two_processes(void) { push_handoff("push", 77, "dec-p"); }

static void test_push_whole(void) { push_handoff("push-whole", 79, "dec-w"); }

/* The consumer's expected push expires after layer 0 landed (its lease is short, the
 * producer's long): it reports the failure, and only after cutting the producer's
 * links, so the layers the producer saves later never land in blocks the host may
 * already have given to another request. */
static void test_push_expired(void) {
  struct prefill_args a = {free_port(), 10000, 81, 8};
  struct child ch;
  char line[4096], cfg[512];
  CU_ASSERT_EQUAL_FATAL(child_start(&ch, "push", &a), 0);
  struct inst d;
  config_push(cfg, sizeof(cfg), free_port(), "consumer", 1500);
  ST_IS(inst_up(&d, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  hixl_kv_request r = request("dec-x", 8 * BLOCK_TOKENS, "{\"do_remote_prefill\": true}");
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d.sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  ST_IS(ops->update_state_after_alloc(d.sched, &r, decode_blocks, 8, (uint64_t)tokens), HIXL_KV_SUCCESS);
  hixl_kv_buffer params = {0};
  ST_IS(ops->get_push_params(d.sched, "dec-x", 5, &params), HIXL_KV_SUCCESS);
  step(&d);
  write_line(ch.to_child, "params %.*s\n", (int)params.len, (char *)params.data);
  ops->free_buffer(&params);
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  CU_ASSERT_STRING_EQUAL(line, "saved 0");
  ST_IS(ops->wait_for_layer_load(d.worker, 0), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(kv_layer_state(&d.kv, 0, 81, decode_blocks, 8), 1);
  /* the lease runs out while the producer waits for "next" */
  CU_ASSERT_TRUE(wait_finished(&d, "dec-x", 1, 20000));
  uint64_t errs[16];
  CU_ASSERT_EQUAL(load_errors(&d, errs, 16), 8);
  for (int l = 1; l < LAYERS; l++) { /* the producer saves the rest: its pusher tries to send them */
    write_line(ch.to_child, "next\n");
    char want[32];
    snprintf(want, sizeof(want), "saved %d", l);
    CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
    CU_ASSERT_STRING_EQUAL(line, want);
  }
  write_line(ch.to_child, "next\n");
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000)); /* its pusher has ended */
  CU_ASSERT_STRING_EQUAL(line, "freed 1 held 0 pushed 0 layers 1");
  for (int l = 1; l < LAYERS; l++) CU_ASSERT_EQUAL(kv_layer_state(&d.kv, l, 81, decode_blocks, 8), 0);
  CU_ASSERT_TRUE(others_untouched(&d.kv, decode_blocks, 8, 0xEE));
  child_end(&ch);
  inst_down(&d);
}

/* max_inflight_requests: a producer's scheduler holds at most that many requests for
 * consumers; one more is not held (its blocks free at once, no kv_transfer_params),
 * and a request that finished sending makes room again. */
static void test_max_inflight(void) {
  hixl_kv_connector *s = producer_sched_max2();
  uint64_t blocks[2] = {3, 4};
  const char *ids[3] = {"m-1", "m-2", "m-3"};
  for (int i = 0; i < 3; i++) {
    hixl_kv_request r = request(ids[i], 2 * BLOCK_TOKENS, "{\"do_remote_decode\": true}");
    int32_t delay = -1;
    hixl_kv_buffer out = {0};
    ST_IS(ops->request_finished(s, &r, blocks, 2, &delay, &out), HIXL_KV_SUCCESS);
    CU_ASSERT_EQUAL(delay, i < 2 ? 1 : 0);
    CU_ASSERT_EQUAL(out.len > 0, i < 2);
    if (i < 2) CU_ASSERT_PTR_NOT_NULL(strstr((char *)out.data, ids[i]));
    ops->free_buffer(&out);
  }
  const char *done[1] = {"m-1"};
  hixl_kv_ids sent = {done, 1};
  ST_IS(ops->update_connector_output(s, &sent, NULL, NULL), HIXL_KV_SUCCESS);
  hixl_kv_request r = request("m-4", 2 * BLOCK_TOKENS, "{\"do_remote_decode\": true}");
  int32_t delay = -1;
  hixl_kv_buffer out = {0};
  ST_IS(ops->request_finished(s, &r, blocks, 2, &delay, &out), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(delay, 1);
  CU_ASSERT(out.len > 0);
  ops->free_buffer(&out);
  ST_IS(ops->destroy(s), HIXL_KV_SUCCESS);
}

/* The scheduler's bounds (plugin/src/kv_int.h; docs/plugin.md, "Bounds"). */
#define KV_FAILED_MAX  4096
#define KV_ALLOCS_MAX  4096
#define KV_MAX_ID_TEST 256 /* a request id's bytes at most (plugin/src/kv_wire.h, KV_MAX_ID) */

/* get_num_new_matched_tokens of id: the status (and, on success, tokens > 0). */
static hixl_kv_status matched(hixl_kv_connector *s, const char *id, const char *params) {
  hixl_kv_request r = request(id, 2 * BLOCK_TOKENS, params);
  int64_t tokens = -1;
  int32_t async = -1;
  hixl_kv_status st = ops->get_num_new_matched_tokens(s, &r, 0, &tokens, &async);
  if (st == HIXL_KV_SUCCESS) CU_ASSERT(tokens == 2 * BLOCK_TOKENS && async == 1);
  return st;
}

/* A consumer's failed loads (load_failure_policy fail): a request reported failed is
 * refused until request_finished, which forgets it (before: remembered for ever, so a
 * request id used again was refused); at most KV_FAILED_MAX unfinished ones are kept,
 * the oldest forgotten first (before: one more each, for ever). */
static void test_failed_bounded(void) {
  char cfg[640];
  hixl_kv_connector *s = NULL;
  char err[256] = "";
  const char *params = "{\"do_remote_prefill\": true, \"remote_engine\": \"127.0.0.1:9\", "
                       "\"remote_request_id\": \"p-1\", \"remote_block_ids\": [1, 2]}";
  config(cfg, sizeof(cfg), free_port(), "consumer", 1000, "fail", 1000);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &s, err, sizeof(err)), HIXL_KV_SUCCESS);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  ST_IS(matched(s, "fl-x", params), HIXL_KV_SUCCESS);
  const char *one[1] = {"fl-x"};
  ST_IS(ops->update_connector_output(s, NULL, NULL, &(hixl_kv_ids){one, 1}), HIXL_KV_SUCCESS);
  ST_IS(matched(s, "fl-x", params), HIXL_KV_FAILED);
  hixl_kv_request r = request("fl-x", 2 * BLOCK_TOKENS, params);
  uint64_t blocks[2] = {5, 6};
  int32_t delay = -1;
  hixl_kv_buffer out = {0};
  ST_IS(ops->request_finished(s, &r, blocks, 2, &delay, &out), HIXL_KV_SUCCESS);
  ops->free_buffer(&out);
  ST_IS(matched(s, "fl-x", params), HIXL_KV_SUCCESS); /* finished: forgotten */
  /* One more than the bound, in one update_connector_output. */
  char(*ids)[16] = calloc(KV_FAILED_MAX + 1, sizeof(*ids));
  const char **v = calloc(KV_FAILED_MAX + 1, sizeof(*v));
  CU_ASSERT_FATAL(ids && v);
  for (unsigned i = 0; i <= KV_FAILED_MAX; i++) {
    snprintf(ids[i], sizeof(ids[i]), "fl-%u", i);
    v[i] = ids[i];
  }
  ST_IS(ops->update_connector_output(s, NULL, NULL, &(hixl_kv_ids){v, KV_FAILED_MAX + 1}), HIXL_KV_SUCCESS);
  ST_IS(matched(s, "fl-0", params), HIXL_KV_SUCCESS); /* the oldest, forgotten */
  ST_IS(matched(s, "fl-1", params), HIXL_KV_FAILED);
  ST_IS(matched(s, ids[KV_FAILED_MAX], params), HIXL_KV_FAILED);
  ST_IS(ops->destroy(s), HIXL_KV_SUCCESS);
  free(ids);
  free(v);
}

/* update_connector_output with an id no request has (NULL, "", or past KV_MAX_ID bytes,
 * which every other op refuses) in any list: PARAM_INVALID naming the list and the id's
 * place, and nothing changes: the valid ids beside it are not taken either (before:
 * SUCCESS, the bad ids skipped or kept among the failed loads, and the good ones taken:
 * a held request's place given back, a load marked failed). */
static void test_output_bad_ids(void) {
  char cfg[640], err[256] = "", longid[KV_MAX_ID_TEST + 2];
  hixl_kv_connector *s = NULL;
  const char *params = "{\"do_remote_prefill\": true, \"remote_engine\": \"127.0.0.1:9\", "
                       "\"remote_request_id\": \"p-1\", \"remote_block_ids\": [1, 2]}";
  memset(longid, 'x', sizeof(longid) - 1);
  longid[sizeof(longid) - 1] = '\0'; /* KV_MAX_ID + 1 bytes */
  config(cfg, sizeof(cfg), free_port(), "both", 1000, "fail", 1000);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &s, err, sizeof(err)), HIXL_KV_SUCCESS);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  /* A request held for a consumer (its producer side) and one loaded (its consumer side). */
  uint64_t blocks[2] = {3, 4};
  hixl_kv_request held = request("ob-held", 2 * BLOCK_TOKENS, NULL);
  int32_t delay = -1;
  hixl_kv_buffer out = {0};
  ST_IS(ops->request_finished(s, &held, blocks, 2, &delay, &out), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(delay, 1);
  ops->free_buffer(&out);
  ST_IS(matched(s, "ob-load", params), HIXL_KV_SUCCESS);
  const char *bad[3] = {NULL, "", longid};
  static const char *const said[3] = {"sending list's id 1", "recving list's id 1", "failed list's id 1"};
  for (int b = 0; b < 3; b++)
    for (int list = 0; list < 3; list++) {
      const char *v[2] = {list == 0 ? "ob-held" : "ob-load", bad[b]};
      hixl_kv_ids ids = {v, 2};
      ST_IS(ops->update_connector_output(s, list == 0 ? &ids : NULL, list == 1 ? &ids : NULL,
                                         list == 2 ? &ids : NULL),
            HIXL_KV_PARAM_INVALID);
      CU_ASSERT(has_error(said[list]));
    }
  /* Nothing changed: ob-held is held still (a second request_finished is refused as held
   * already, not as ended lately), and ob-load's load is not failed. */
  ST_IS(ops->request_finished(s, &held, blocks, 2, &delay, &out), HIXL_KV_PARAM_INVALID);
  CU_ASSERT(has_error("held already"));
  ST_IS(matched(s, "ob-load", params), HIXL_KV_SUCCESS);
  ST_IS(ops->destroy(s), HIXL_KV_SUCCESS);
}

/* A request whose flags have a bit this ABI does not define (only HIXL_KV_REQ_ABORTED):
 * refused by every op that takes a request, and nothing changes (before: the bit was
 * ignored, so a request_finished with it held the request as if it were not there). */
static void test_request_unknown_flags(void) {
  hixl_kv_connector *s = producer_sched_max2();
  uint64_t blocks[2] = {3, 4};
  int64_t tokens = -1;
  int32_t delay = -1, async = -1;
  hixl_kv_buffer out = {0};
  hixl_kv_request r = request("uf-1", 2 * BLOCK_TOKENS, NULL);
  r.flags = 0x2u;
  ST_IS(ops->request_finished(s, &r, blocks, 2, &delay, &out), HIXL_KV_PARAM_INVALID);
  CU_ASSERT(has_error("flags 0x2"));
  CU_ASSERT_EQUAL(delay, -1);
  CU_ASSERT_PTR_NULL(out.data);
  r.flags = HIXL_KV_REQ_ABORTED | 0x80000000u;
  ST_IS(ops->get_num_new_matched_tokens(s, &r, 0, &tokens, &async), HIXL_KV_PARAM_INVALID);
  CU_ASSERT(has_error("flags 0x80000001"));
  CU_ASSERT_EQUAL(tokens, -1);
  ST_IS(ops->update_state_after_alloc(s, &r, blocks, 2, 0), HIXL_KV_PARAM_INVALID);
  ST_IS(ops->request_finished_groups(s, &r, &(hixl_kv_block_ids){blocks, 2}, 1, &delay, &out),
        HIXL_KV_PARAM_INVALID);
  /* Nothing was held: the same request without the bit is held now, once. */
  r.flags = 0;
  ST_IS(ops->request_finished(s, &r, blocks, 2, &delay, &out), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(delay, 1);
  ops->free_buffer(&out);
  ST_IS(ops->destroy(s), HIXL_KV_SUCCESS);
}

/* get_push_params of id: the status (params freed). */
static hixl_kv_status push_params(hixl_kv_connector *s, const char *id) {
  hixl_kv_buffer out = {0};
  hixl_kv_status st = ops->get_push_params(s, id, strlen(id), &out);
  if (st == HIXL_KV_SUCCESS) CU_ASSERT_PTR_NOT_NULL(strstr((char *)out.data, id));
  ops->free_buffer(&out);
  return st;
}

static void push_alloc(hixl_kv_connector *s, const char *id) {
  hixl_kv_request r = request(id, 2 * BLOCK_TOKENS, "{\"do_remote_prefill\": true}");
  uint64_t blocks[2] = {7, 8};
  ST_IS(ops->update_state_after_alloc(s, &r, blocks, 2, 2 * BLOCK_TOKENS), HIXL_KV_SUCCESS);
}

/* A push consumer's allocations wait for get_push_params: request_finished (or an abort)
 * releases one no producer took (before: kept for ever), an allocation made again
 * replaces the one before (before: both kept, the old one for ever), and at most
 * KV_ALLOCS_MAX wait, the oldest forgotten first (before: one more each). */
static void test_push_allocs_bounded(void) {
  char cfg[512];
  hixl_kv_connector *s = NULL;
  char err[256] = "";
  config_push(cfg, sizeof(cfg), free_port(), "consumer", 1000);
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &s, err, sizeof(err)), HIXL_KV_SUCCESS);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  push_alloc(s, "pa-taken");
  ST_IS(push_params(s, "pa-taken"), HIXL_KV_SUCCESS);
  ST_IS(push_params(s, "pa-taken"), HIXL_KV_NOT_FOUND); /* taken once */
  uint64_t blocks[2] = {7, 8};
  int32_t delay = -1;
  hixl_kv_buffer out = {0};
  for (int aborted = 0; aborted < 2; aborted++) {
    const char *id = aborted ? "pa-aborted" : "pa-finished";
    push_alloc(s, id);
    hixl_kv_request r = request(id, 2 * BLOCK_TOKENS, "{\"do_remote_prefill\": true}");
    r.flags = aborted ? HIXL_KV_REQ_ABORTED : 0;
    ST_IS(ops->request_finished(s, &r, blocks, 2, &delay, &out), HIXL_KV_SUCCESS);
    ops->free_buffer(&out);
    ST_IS(push_params(s, id), HIXL_KV_NOT_FOUND); /* released */
  }
  push_alloc(s, "pa-again");
  push_alloc(s, "pa-again");
  ST_IS(push_params(s, "pa-again"), HIXL_KV_SUCCESS);
  ST_IS(push_params(s, "pa-again"), HIXL_KV_NOT_FOUND); /* the first allocation went with the second */
  char id[32];
  for (unsigned i = 0; i <= KV_ALLOCS_MAX; i++) {
    snprintf(id, sizeof(id), "pa-%u", i);
    push_alloc(s, id);
  }
  ST_IS(push_params(s, "pa-0"), HIXL_KV_NOT_FOUND); /* the oldest, forgotten */
  CU_ASSERT_PTR_NOT_NULL(strstr(ops->last_error(), "4096"));
  ST_IS(push_params(s, "pa-1"), HIXL_KV_SUCCESS);
  snprintf(id, sizeof(id), "pa-%u", KV_ALLOCS_MAX);
  ST_IS(push_params(s, id), HIXL_KV_SUCCESS);
  ST_IS(ops->destroy(s), HIXL_KV_SUCCESS); /* the rest freed here (ASan: no leak) */
}

/* A push producer's update_state_after_alloc of id (the consumer's params name
 * 127.0.0.1:9); then its request_finished's delay_free when finish is set. */
static int32_t push_producer_alloc(hixl_kv_connector *s, const char *id, bool finish) {
  char params[256];
  snprintf(params, sizeof(params),
           "{\"do_remote_decode\": true, \"remote_engine\": \"127.0.0.1:9\", \"remote_request_id\": \"%s\", "
           "\"remote_block_ids\": [1, 2]}",
           id);
  hixl_kv_request r = request(id, 2 * BLOCK_TOKENS, params);
  uint64_t blocks[2] = {3, 4};
  int32_t delay = -1;
  if (!finish) {
    ST_IS(ops->update_state_after_alloc(s, &r, blocks, 2, 0), HIXL_KV_SUCCESS);
    return delay;
  }
  hixl_kv_buffer out = {0};
  ST_IS(ops->request_finished(s, &r, blocks, 2, &delay, &out), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(out.len, 0);
  ops->free_buffer(&out);
  return delay;
}

/* Bytes of the next metadata (freed). */
static size_t meta_len(hixl_kv_connector *s) {
  hixl_kv_buffer m = {0};
  ST_IS(ops->build_connector_meta(s, &m), HIXL_KV_SUCCESS);
  size_t n = m.len;
  ops->free_buffer(&m);
  return n;
}

/* A push producer's scheduler tracks the requests waiting to be pushed (their blocks
 * stay at request_finished): at most max_inflight_requests of them (before: one more
 * each, in a list searched linearly); one more is not pushed (no PUSH entry, its
 * request_finished frees its blocks), and a finished_sending or request_finished makes
 * room. A request pushed, reported sent, then allocated again (a preemption) is pushed
 * again and its blocks kept until that push ends (before: request_finished found it in
 * the "pushed" list and answered delay_free 0 while the second push was under way). */
static void test_push_producer_bounded(void) {
  char cfg[640], err[256] = "";
  hixl_kv_connector *s = NULL;
  snprintf(cfg, sizeof(cfg),
           "{\"address\": \"%s:%u\", \"role\": \"producer\", \"mode\": \"push\", "
           "\"max_inflight_requests\": 2, \"Transport\": \"%s\"}",
           test_ip(), (unsigned)free_port(), transport());
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &s, err, sizeof(err)), HIXL_KV_SUCCESS);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  size_t empty = meta_len(s); /* the header alone */
  push_producer_alloc(s, "pb-1", false);
  push_producer_alloc(s, "pb-2", false);
  CU_ASSERT(meta_len(s) > empty); /* two PUSH entries */
  push_producer_alloc(s, "pb-3", false);
  CU_ASSERT_EQUAL(meta_len(s), empty); /* at the bound: not pushed */
  CU_ASSERT_EQUAL(push_producer_alloc(s, "pb-3", true), 0);
  push_producer_alloc(s, "pb-2", false); /* allocated again (a preemption): pushed again, not counted twice */
  CU_ASSERT(meta_len(s) > empty);
  const char *sent1[1] = {"pb-1"};
  ST_IS(ops->update_connector_output(s, &(hixl_kv_ids){sent1, 1}, NULL, NULL), HIXL_KV_SUCCESS);
  push_producer_alloc(s, "pb-4", false); /* pb-1's push ended: room for one */
  CU_ASSERT(meta_len(s) > empty);
  CU_ASSERT_EQUAL(push_producer_alloc(s, "pb-1", true), 0); /* pushed already: freed now */
  CU_ASSERT_EQUAL(push_producer_alloc(s, "pb-2", true), 1);
  CU_ASSERT_EQUAL(push_producer_alloc(s, "pb-4", true), 1);
  /* Pushed, reported sent, allocated again, finished before the second push ended. */
  push_producer_alloc(s, "pb-5", false);
  const char *sent5[1] = {"pb-5"};
  ST_IS(ops->update_connector_output(s, &(hixl_kv_ids){sent5, 1}, NULL, NULL), HIXL_KV_SUCCESS);
  push_producer_alloc(s, "pb-5", false);
  CU_ASSERT_EQUAL(push_producer_alloc(s, "pb-5", true), 1);
  ST_IS(ops->update_connector_output(s, &(hixl_kv_ids){sent5, 1}, NULL, NULL), HIXL_KV_SUCCESS);
  /* Nothing left behind: the bound's two places are free again. */
  meta_len(s);
  push_producer_alloc(s, "pb-6", false);
  push_producer_alloc(s, "pb-7", false);
  CU_ASSERT(meta_len(s) > empty);
  CU_ASSERT_EQUAL(push_producer_alloc(s, "pb-6", true), 1);
  CU_ASSERT_EQUAL(push_producer_alloc(s, "pb-7", true), 1);
  ST_IS(ops->destroy(s), HIXL_KV_SUCCESS);
}

/* The producer has more blocks than the consumer gave: its pusher refuses and tells
 * the consumer at once (not at the end of the consumer's lease); nothing moves. */
static void test_push_short_of_blocks(void) {
  struct prefill_args a = {free_port(), 10000, 78, 8};
  struct child ch;
  char line[4096], cfg[512];
  CU_ASSERT_EQUAL_FATAL(child_start(&ch, "push", &a), 0);
  struct inst d;
  config_push(cfg, sizeof(cfg), free_port(), "consumer", 10000);
  ST_IS(inst_up(&d, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  const char *mark = "{\"do_remote_prefill\": true}";
  hixl_kv_request r = request("dec-s", 4 * BLOCK_TOKENS, mark);
  int64_t tokens = 0;
  int32_t async = 0;
  hixl_kv_buffer params = {0};
  ST_IS(ops->get_num_new_matched_tokens(d.sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  ST_IS(ops->update_state_after_alloc(d.sched, &r, decode_blocks, 4, (uint64_t)tokens), HIXL_KV_SUCCESS);
  ST_IS(ops->get_push_params(d.sched, "dec-s", 5, &params), HIXL_KV_SUCCESS);
  step(&d);
  int64_t t0 = now_ms();
  write_line(ch.to_child, "params %.*s\n", (int)params.len, (char *)params.data);
  ops->free_buffer(&params);
  for (int l = 0; l < LAYERS; l++) {
    CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
    write_line(ch.to_child, "next\n");
  }
  CU_ASSERT_TRUE(wait_finished(&d, "dec-s", 1, 20000));
  CU_ASSERT(now_ms() - t0 < 5000);
  uint64_t errs[16];
  CU_ASSERT_EQUAL(load_errors(&d, errs, 16), 4);
  CU_ASSERT_EQUAL(count_byte(&d.kv, 0xEE), d.kv.len);
  CU_ASSERT_FATAL(read_line(ch.from_child, line, sizeof(line), 20000));
  CU_ASSERT_STRING_EQUAL(line, "freed 1 held 0 pushed 0 layers 0");
  child_end(&ch);
  inst_down(&d);
}

/* A push consumer whose producer never comes: the load fails at the lease, and
 * wait_for_layer_load does not hang past it. */
static void test_push_nobody_comes(void) {
  char cfg[512];
  struct inst d;
  config_push(cfg, sizeof(cfg), free_port(), "consumer", 300);
  ST_IS(inst_up(&d, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  const char *mark = "{\"do_remote_prefill\": true}";
  hixl_kv_request r = request("dec-q", 4 * BLOCK_TOKENS, mark);
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d.sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  ST_IS(ops->update_state_after_alloc(d.sched, &r, decode_blocks, 4, (uint64_t)tokens), HIXL_KV_SUCCESS);
  step(&d);
  int64_t t0 = now_ms();
  ST_IS(ops->wait_for_layer_load(d.worker, 0), HIXL_KV_SUCCESS);
  CU_ASSERT(now_ms() - t0 < 5000);
  CU_ASSERT_TRUE(wait_finished(&d, "dec-q", 1, 5000));
  uint64_t errs[16];
  CU_ASSERT_EQUAL(load_errors(&d, errs, 16), 4);
  inst_down(&d);
}

/* A pushed request's blocks as a host keeps them (vLLM's scheduler): request_finished's
 * delay_free 0 frees them at once, 1 when the request's finished_sending comes; a
 * finished_sending for a request not finished yet frees nothing. */
struct host_req {
  hixl_kv_request r;
  const uint64_t *blocks; /* 4 of them */
  bool finished;
  int32_t delay;
  int freed; /* how often the host freed the blocks: 0 is a leak */
};

static void host_request_finished(hixl_kv_connector *sched, struct host_req *h) {
  hixl_kv_buffer none = {0};
  ST_IS(ops->request_finished(sched, &h->r, h->blocks, 4, &h->delay, &none), HIXL_KV_SUCCESS);
  ops->free_buffer(&none);
  h->finished = true;
  h->freed += h->delay == 0;
}

static void host_finished_sending(hixl_kv_connector *sched, const hixl_kv_ids *sent, struct host_req *h,
                                  size_t n) {
  ST_IS(ops->update_connector_output(sched, sent, NULL, NULL), HIXL_KV_SUCCESS);
  for (size_t i = 0; i < n; i++)
    h[i].freed += ids_have(sent, h[i].r.req_id) && h[i].finished && h[i].delay == 1;
}

/* get_stats_ex into hosts' structs of other sizes, on a producer that pushed
 * `pushes` requests of `bytes` bytes: the whole fields that fit are written, never a
 * byte past size, and size comes back as the bytes written. */
static void stats_ex_sizes(hixl_kv_connector *w, uint64_t pushes, uint64_t bytes) {
  struct {
    hixl_kv_stats_ex s;
    uint64_t later; /* a host built against a later header */
  } big;
  memset(&big, 0xA5, sizeof(big));
  big.s.size = sizeof(big);
  ST_IS(ops->get_stats_ex(w, &big.s), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(big.s.size, sizeof(hixl_kv_stats_ex));
  CU_ASSERT(big.s.reserved == 0 && big.s.pushes_done == pushes && big.s.bytes_pushed == bytes);
  CU_ASSERT_EQUAL(big.later, 0xA5A5A5A5A5A5A5A5ull);
  hixl_kv_stats_ex old; /* a host built before bytes_pushed, and one whose size ends mid-field */
  const uint32_t sizes[2] = {offsetof(hixl_kv_stats_ex, bytes_pushed),
                             offsetof(hixl_kv_stats_ex, bytes_pushed) - 4};
  for (int k = 0; k < 2; k++) {
    memset(&old, 0xA5, sizeof(old));
    old.size = sizes[k];
    ST_IS(ops->get_stats_ex(w, &old), HIXL_KV_SUCCESS);
    CU_ASSERT_EQUAL(old.size, k == 0 ? sizes[0] : offsetof(hixl_kv_stats_ex, layers_pushed));
    CU_ASSERT_EQUAL(old.pushes_done, pushes);
    CU_ASSERT_EQUAL(k == 0 ? old.bytes_pushed : old.layers_pushed, 0xA5A5A5A5A5A5A5A5ull);
  }
  old.size = HIXL_KV_STATS_EX_MIN_SIZE - 1;
  ST_IS(ops->get_stats_ex(w, &old), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_TRUE(has_error("sizeof(hixl_kv_stats_ex)"));
}

/* Push mode, one process: A's request_finished comes before its finished_sending, B's
 * after (its push completed before the request finished on the scheduler). Each
 * request's blocks are freed exactly once (B's leaked when request_finished answered
 * delay_free 1 after its finished_sending), and both land byte for byte. */
static void test_push_freed_once(void) {
  struct inst d, p;
  char cfg[512];
  const char *ids[2] = {"pf-a", "pf-b"};
  char *params[2];
  struct host_req h[2];
  config_push(cfg, sizeof(cfg), free_port(), "consumer", 10000);
  ST_IS(inst_up(&d, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  config_push(cfg, sizeof(cfg), free_port(), "producer", 10000);
  ST_IS(inst_up(&p, cfg, BLOCK_BYTES), HIXL_KV_SUCCESS);
  for (int i = 0; i < 2; i++) { /* decode allocates first and hands its blocks to prefill */
    hixl_kv_request r = request(ids[i], 4 * BLOCK_TOKENS, "{\"do_remote_prefill\": true}");
    int64_t tokens = 0;
    int32_t async = 0;
    hixl_kv_buffer b = {0};
    ST_IS(ops->get_num_new_matched_tokens(d.sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
    ST_IS(ops->update_state_after_alloc(d.sched, &r, decode_blocks + 4 * i, 4, (uint64_t)tokens),
          HIXL_KV_SUCCESS);
    ST_IS(ops->get_push_params(d.sched, ids[i], strlen(ids[i]), &b), HIXL_KV_SUCCESS);
    params[i] = strndup((char *)b.data, b.len);
    ops->free_buffer(&b);
    h[i] = (struct host_req){.r = request(ids[i], 4 * BLOCK_TOKENS, params[i]),
                             .blocks = prefill_blocks + 4 * i};
    ST_IS(ops->get_num_new_matched_tokens(p.sched, &h[i].r, 0, &tokens, &async), HIXL_KV_SUCCESS);
    ST_IS(ops->update_state_after_alloc(p.sched, &h[i].r, h[i].blocks, 4, 0), HIXL_KV_SUCCESS);
    kv_compute(&p.kv, 90 + (uint64_t)i, h[i].blocks, 4);
  }
  step(&d);
  step(&p);
  for (uint32_t l = 0; l < LAYERS; l++) ST_IS(ops->save_kv_layer(p.worker, l), HIXL_KV_SUCCESS);
  ST_IS(ops->wait_for_save(p.worker), HIXL_KV_SUCCESS);
  host_request_finished(p.sched, &h[0]);
  CU_ASSERT_EQUAL(h[0].delay, 1);
  bool sent[2] = {false, false}, got[2] = {false, false};
  CU_ASSERT_TRUE(wait_all(&p, ids, sent, 2, 0, 20000));
  host_finished_sending(p.sched, &(hixl_kv_ids){ids, 2}, h, 2);
  host_request_finished(p.sched, &h[1]);
  hixl_kv_ids s = {0}, r = {0}; /* the host's next step */
  step(&p);
  ST_IS(ops->get_finished(p.worker, NULL, &s, &r), HIXL_KV_SUCCESS);
  host_finished_sending(p.sched, &s, h, 2);
  ops->free_ids(&s);
  ops->free_ids(&r);
  CU_ASSERT_EQUAL(h[0].freed, 1);
  CU_ASSERT_EQUAL(h[1].freed, 1);
  CU_ASSERT_TRUE(wait_all(&d, ids, got, 2, 1, 20000));
  CU_ASSERT_TRUE(load_errors_are(&d, NULL, 0));
  for (int i = 0; i < 2; i++)
    CU_ASSERT_EQUAL(kv_verify(&d.kv, 90 + (uint64_t)i, decode_blocks + 4 * i, 4), -1);
  CU_ASSERT_TRUE(others_untouched(&d.kv, decode_blocks, 8, 0xEE));
  hixl_kv_stats st;
  ST_IS(ops->get_stats(p.worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT(st.pushes_done == 2 && st.blocks_held == 0);
  uint64_t bytes = 8 * LAYERS * 2 * BLOCK_BYTES; /* both requests' blocks, K and V of every layer */
  ST_IS(ops->get_stats(d.worker, &st), HIXL_KV_SUCCESS);
  CU_ASSERT(st.loads_done == 2 && st.bytes_loaded == bytes);
  stats_ex_sizes(p.worker, 2, bytes);
  inst_down(&p);
  inst_down(&d);
  free(params[0]);
  free(params[1]);
}

static CU_TestInfo abi_tests[] = {
    {"entry and versions", test_entry},
    {"no NULL slot", test_no_null_slot},
    {"table sizes", test_table_sizes},
    CU_TEST_INFO_NULL,
};
static CU_TestInfo arg_tests[] = {
    {"create", test_create_args},
    {"every op", test_op_args},
    {"alloc_kv_caches: the plugin's memory for the layers", test_alloc_kv_caches},
    {"max_inflight_requests bounds what a producer holds", test_max_inflight},
    {"a consumer's failed loads: forgotten at request_finished, at most KV_FAILED_MAX", test_failed_bounded},
    {"update_connector_output with an id no request has: refused, nothing taken", test_output_bad_ids},
    {"a request's flags with a bit not defined: refused, nothing held", test_request_unknown_flags},
    {"push allocations: released at request_finished, replaced, at most KV_ALLOCS_MAX",
     test_push_allocs_bounded},
    {"push producer: at most max_inflight_requests wait to be pushed, room made again",
     test_push_producer_bounded},
    {"alloc_kv_memory on six threads at once", test_alloc_memory_threads},
    {"shutdown on two threads at once", test_shutdown_threads},
    {"metadata bound after shutdown, and a load it left unstarted: reported finished",
     test_bind_after_shutdown},
    {"request_finished twice: refused, one place held", test_finished_twice},
    {"a held block past the caches: refused at bind, nothing held", test_hold_past_blocks},
    {"an expected block past the caches: refused at bind, the load failed", test_expect_past_blocks},
    {"a hold bound before the caches are registered: refused", test_hold_before_register},
    {"a PUSH bound by a pull-mode worker: refused, finished, nothing held", test_push_into_pull},
    {"a worker of another role than its scheduler: each entry refused, finished", test_roles_mixed},
    {"an expect bound before the caches are registered: refused, the load failed",
     test_expect_before_register},
    CU_TEST_INFO_NULL,
};
static CU_TestInfo pd_tests[] = {
    {"pull, two processes, every byte", test_pull_two_processes},
    {"get_event_fd: a decode that does not step wakes when the KV landed", test_event_fd},
    {"lease expiry, then recompute", test_lease_expiry},
    {"abort frees the producer's blocks", test_abort},
    {"producer death", test_producer_death},
    {"layout mismatch", test_layout_mismatch},
    {"tensor-parallel size mismatch", test_tp_mismatch},
    {"push, two processes, layer by layer", test_push_two_processes},
    {"push without layer pipelining: all layers after the last", test_push_whole},
    {"push: the consumer's lease expires mid-push, later layers never land", test_push_expired},
    {"push: the consumer gave too few blocks", test_push_short_of_blocks},
    {"push: no producer comes", test_push_nobody_comes},
    {"push: blocks freed once, request_finished before or after finished_sending", test_push_freed_once},
    {"pull: a producer that refuses connections stalls no other load", test_dead_producer_no_stall},
    {"pull: a request id the producer never held fails at once", test_never_held_fails_at_once},
    {"load_in_forward: loaded before the forward pass reads it, never in get_finished", test_load_in_forward},
    {"load_in_forward: the producer dead, the blocks are load errors", test_load_in_forward_producer_death},
    {"load_in_forward: refused in push mode", test_load_in_forward_push_refused},
    CU_TEST_INFO_NULL,
};
static CU_SuiteInfo suites[] = {
    {.pName = "plugin abi", .pTests = abi_tests},
    {.pName = "plugin arguments", .pTests = arg_tests},
    {.pName = "plugin prefill to decode", .pTests = pd_tests},
    CU_SUITE_INFO_NULL,
};

int main(int argc, char **argv) {
  const char *path = getenv("HIXL_KV_PLUGIN") ? getenv("HIXL_KV_PLUGIN") : HIXL_KV_PLUGIN_PATH;
  signal(SIGPIPE, SIG_IGN);
  if (!(so = kv_host_open("test_plugin", path, &ops))) return 1;
  if (argc == 7 && strcmp(argv[1], "--child") == 0) { /* a prefill, see child_start */
    struct prefill_args a = {(uint16_t)atoi(argv[3]), (unsigned)atoi(argv[4]), strtoull(argv[5], NULL, 10),
                             (size_t)atoi(argv[6])};
    in_child = true;
    push_pipelining = strcmp(argv[2], "push-whole") != 0;
    if (strncmp(argv[2], "push", 4) == 0) push_prefill_main(3, 4, &a);
    prefill_main(3, 4, &a);
    return 0;
  }
  return kv_host_run("test_plugin", suites, so);
}
