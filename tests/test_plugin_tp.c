/* test_plugin_tp: tensor parallelism across the hand-off (ABI 1.5). A producer
 * instance of P worker ranks and a consumer instance of D, one dividing the other, each
 * rank its own worker connector, engine and KV memory of its heads (vLLM's rule: of K
 * KV heads rank r of T holds [r K / T, (r + 1) K / T), or with T > K the one head
 * r / (T / K)), and one scheduler per instance whose metadata every rank binds. A
 * request is handed over pulled and pushed; then every byte of every consumer rank's
 * memory is checked: its request blocks hold its heads as the producer computed them,
 * every other byte is still 0xEE; every rank of both sides holds 0 blocks after, and
 * the bytes moved are the bytes the consumer needed (a replicated head is read once).
 * MLA (every rank the same latent) as well. Pairs that cannot map (neither size
 * divides the other; a layout without a head dimension) fail with both sizes named
 * and move nothing. This program includes only the plugin's ABI header. */

#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <dlfcn.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hixl/hixl_kv_connector.h"
#include "kv_host.h"

#ifndef HIXL_KV_PLUGIN_PATH
#define HIXL_KV_PLUGIN_PATH "libhixl_kv_connector.so"
#endif

static void *so;
static const hixl_kv_ops *ops;

#define ST_IS(expr, want)                                                                                    \
  do {                                                                                                       \
    hixl_kv_status st_ = (expr);                                                                             \
    if (st_ != (hixl_kv_status)(want))                                                                       \
      fprintf(stderr, "%s:%d: %s -> %u, want %u (%s)\n", __FILE__, __LINE__, #expr, st_, (unsigned)(want),   \
              ops->last_error());                                                                            \
    CU_ASSERT_EQUAL(st_, (hixl_kv_status)(want));                                                            \
  } while (0)

enum {
  LAYERS = 2,
  TOKENS = 4,   /* per block */
  HEAD_DIM = 8, /* K|V packed: 2 * HEAD_DIM elements per token and head */
  ELEM = 2,
  HEAD_BYTES = TOKENS * 2 * HEAD_DIM * ELEM, /* one head of one block: (N, 2D) */
  LATENT_BYTES = TOKENS * 576 * ELEM,        /* MLA: one block of the latent */
  NB = 16,                                   /* blocks of every rank */
  MAX_TP = 4,
  NREQ = 4, /* blocks of the request */
};

struct model {
  bool mla;
  uint32_t kv_heads; /* K */
  bool no_heads;     /* the planes give no head dimension (a token-major layout) */
};

/* One rank's KV: per layer a (NB, h, N, 2D) tensor (MLA: (NB, N, 576)). */
struct rank {
  hixl_kv_connector *worker;
  uint8_t *mem;
  size_t layer_bytes;
  uint32_t heads, first; /* its heads, and the first one's model number */
};

struct side {
  uint32_t world;
  hixl_kv_connector *sched;
  struct rank r[MAX_TP];
  const struct model *m;
};

static uint32_t block_bytes(const struct side *s, const struct rank *k) {
  return s->m->mla ? LATENT_BYTES : k->heads * HEAD_BYTES;
}

static unsigned lease_ms = 10000;
static const char *auth_key; /* set: both sides hold this key file, and link over shm (push_shm) */

/* A key file (mode 0600) both sides read, made once and removed at exit: two engines of
 * this process link over shm only when they hold a key. */
static char key_path[64];
static void key_remove(void) { unlink(key_path); }
static const char *key_file(void) {
  if (key_path[0]) return key_path;
  char path[] = "/tmp/hixl-tp-key-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  static const char hex[] = "5e0c9a7b3d1f2e4a6c8b0d2f4e6a8c0b1d3f5e7a9c2b4d6f8e0a1c3e5b7d9f2a\n";
  bool ok = write(fd, hex, sizeof(hex) - 1) == (ssize_t)(sizeof(hex) - 1);
  close(fd);
  if (!ok) {
    unlink(path);
    return NULL;
  }
  snprintf(key_path, sizeof(key_path), "%s", path);
  atexit(key_remove);
  return key_path;
}

static hixl_kv_status side_up(struct side *s, const struct model *m, uint32_t world, const char *role,
                              const char *mode) {
  memset(s, 0, sizeof(*s));
  s->m = m;
  s->world = world;
  char cfg[640], key[128] = "";
  uint16_t port = hold_run(test_ip(), world);
  if (auth_key) snprintf(key, sizeof(key), ",\n \"AuthKeyFile\": \"%s\"", auth_key);
  snprintf(
      cfg, sizeof(cfg),
      "{\"address\": \"%s:%u\", \"role\": \"%s\", \"mode\": \"%s\", \"lease_ms\": %u,\n"
      " \"load_failure_policy\": \"fail\", \"transfer_timeout_ms\": 5000, \"connect_timeout_ms\": 5000,\n"
      " \"Transport\": \"%s\"%s}\n",
      test_ip(), (unsigned)port, role, mode, lease_ms, auth_key ? "auto" : transport(), key);
  char err[256] = "";
  hixl_kv_status st =
      ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, world, &s->sched, err, sizeof(err));
  if (st != HIXL_KV_SUCCESS) return st;
  for (uint32_t i = 0; i < world; i++) {
    struct rank *k = &s->r[i];
    if ((st = ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, i, world, &k->worker, err, sizeof(err))) !=
        HIXL_KV_SUCCESS)
      return st;
    if (m->mla) {
      k->heads = 0;
    } else if (world <= m->kv_heads) {
      k->heads = m->kv_heads / world;
      k->first = i * k->heads;
    } else {
      k->heads = 1;
      k->first = i / (world / m->kv_heads);
    }
    k->layer_bytes = (size_t)NB * block_bytes(s, k);
    k->mem = aligned_alloc(4096, (LAYERS * k->layer_bytes + 4095) / 4096 * 4096);
    if (!k->mem) return HIXL_KV_RESOURCE_EXHAUSTED;
    memset(k->mem, 0xEE, LAYERS * k->layer_bytes);
    hixl_kv_plane planes[LAYERS];
    for (int l = 0; l < LAYERS; l++)
      planes[l] = (hixl_kv_plane){.base = (uintptr_t)(k->mem + l * k->layer_bytes),
                                  .block_stride = block_bytes(s, k),
                                  .block_bytes = block_bytes(s, k),
                                  .head_stride = m->mla || m->no_heads ? 0 : HEAD_BYTES,
                                  .num_heads = m->mla || m->no_heads ? 0 : k->heads};
    hixl_kv_group g = {.size = sizeof(g),
                       .kind = m->mla ? HIXL_KV_GROUP_MLA : HIXL_KV_GROUP_FULL_ATTENTION,
                       .num_layers = LAYERS,
                       .planes_per_layer = 1,
                       .planes = planes,
                       .num_blocks = NB,
                       .block_tokens = TOKENS,
                       .elem_size = ELEM,
                       .layout = m->mla ? "mla" : "packed",
                       .layout_len = m->mla ? 3 : 6,
                       .total_kv_heads = m->mla || m->no_heads ? 0 : m->kv_heads};
    if ((st = ops->register_kv_groups(k->worker, &g, 1)) != HIXL_KV_SUCCESS) return st;
  }
  return HIXL_KV_SUCCESS;
}

static void side_down(struct side *s) {
  for (uint32_t i = 0; i < s->world; i++) {
    if (s->r[i].worker) ops->destroy(s->r[i].worker);
    free(s->r[i].mem);
  }
  if (s->sched) ops->destroy(s->sched);
}

/* One step: the scheduler's metadata, bound by every rank, and their loads started. */
static void step(struct side *s) {
  hixl_kv_buffer m = {0};
  ST_IS(ops->build_connector_meta(s->sched, &m), HIXL_KV_SUCCESS);
  for (uint32_t i = 0; i < s->world; i++) {
    ST_IS(ops->bind_connector_meta(s->r[i].worker, m.data, m.len), HIXL_KV_SUCCESS);
    ST_IS(ops->start_load_kv(s->r[i].worker), HIXL_KV_SUCCESS);
  }
  ops->free_buffer(&m);
}

enum { SENDING, RECVING };

/* Steps s until every rank reported id finished (sending or receiving), as vLLM's
 * output aggregator waits for every worker; false after timeout_ms. */
static bool wait_all(struct side *s, const char *id, int which, int timeout_ms) {
  bool got[MAX_TP] = {false};
  uint32_t n = 0;
  int64_t end = now_ms() + timeout_ms;
  do {
    step(s);
    for (uint32_t i = 0; i < s->world; i++) {
      hixl_kv_ids sent = {0}, recv = {0};
      if (ops->get_finished(s->r[i].worker, NULL, &sent, &recv) != HIXL_KV_SUCCESS) return false;
      if (ids_have(which == RECVING ? &recv : &sent, id)) {
        CU_ASSERT_FALSE(got[i]); /* once per rank */
        n += !got[i];
        got[i] = true;
      }
      ops->free_ids(&sent);
      ops->free_ids(&recv);
    }
    if (n == s->world) return true;
    int32_t fd = -1;
    ops->get_event_fd(s->r[0].worker, &fd);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    poll(&pfd, 1, 5);
  } while (now_ms() < end);
  fprintf(stderr, "  %s: %u of %u ranks reported it\n", id, n, s->world);
  return false;
}

static uint8_t pat(uint64_t seed, uint32_t layer, uint32_t pos, uint32_t head, uint32_t byte) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)layer << 40) ^ ((uint64_t)pos << 24) ^
               ((uint64_t)head << 16) ^ byte;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return (uint8_t)(x >> 32);
}

static const uint64_t p_blocks[NREQ] = {3, 7, 8, 12};
static const uint64_t c_blocks[NREQ] = {1, 2, 9, 15};

/* Rank k of s computes layer l of the request into its blocks: its heads (MLA: the
 * latent, the same on every rank). */
static void compute(const struct side *s, const struct rank *k, uint64_t seed, uint32_t l) {
  for (uint32_t j = 0; j < NREQ; j++) {
    uint8_t *b = k->mem + l * k->layer_bytes + p_blocks[j] * block_bytes(s, k);
    if (s->m->mla)
      for (uint32_t y = 0; y < LATENT_BYTES; y++) b[y] = pat(seed, l, j, 0, y);
    else
      for (uint32_t h = 0; h < k->heads; h++)
        for (uint32_t y = 0; y < HEAD_BYTES; y++) b[h * HEAD_BYTES + y] = pat(seed, l, j, k->first + h, y);
  }
}

/* Every byte of consumer rank k: its request blocks of layers below upto hold its heads
 * as computed, every other byte 0xEE. */
static bool rank_is(const struct side *s, const struct rank *k, uint64_t seed, uint32_t upto) {
  uint32_t bb = block_bytes(s, k);
  for (uint32_t l = 0; l < LAYERS; l++)
    for (uint32_t b = 0; b < NB; b++) {
      int j = -1;
      for (int q = 0; q < NREQ; q++)
        if (c_blocks[q] == b) j = q;
      const uint8_t *p = k->mem + l * k->layer_bytes + (size_t)b * bb;
      for (uint32_t y = 0; y < bb; y++) {
        uint8_t want = 0xEE;
        if (j >= 0 && l < upto)
          want = s->m->mla ? pat(seed, l, (uint32_t)j, 0, y)
                           : pat(seed, l, (uint32_t)j, k->first + y / HEAD_BYTES, y % HEAD_BYTES);
        if (p[y] != want) {
          fprintf(stderr, "  rank with heads %u+%u: layer %u block %u byte %u: 0x%02x, want 0x%02x\n",
                  k->first, k->heads, l, b, y, p[y], want);
          return false;
        }
      }
    }
  return true;
}

static hixl_kv_stats_ex stats(hixl_kv_connector *w) {
  hixl_kv_stats_ex x = {.size = sizeof(x)};
  ST_IS(ops->get_stats_ex(w, &x), HIXL_KV_SUCCESS);
  return x;
}

static hixl_kv_request request(const char *id, uint64_t tokens, const char *params) {
  return (hixl_kv_request){id, strlen(id), tokens, params, params ? strlen(params) : 0, 0};
}

static char *take_text(hixl_kv_buffer *b) {
  char *t = b->data ? strndup((char *)b->data, b->len) : NULL;
  ops->free_buffer(b);
  return t;
}

/* The bytes every consumer rank needs of a request: its heads of each block (MLA: the
 * latent), every layer. */
static uint64_t needed(const struct side *d) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < d->world; i++) n += (uint64_t)LAYERS * NREQ * block_bytes(d, &d->r[i]);
  return n;
}

/* The producer's scheduler finishes request id holding blocks: its kv_transfer_params'
 * text (the caller frees it). */
static char *finish(struct side *p, const char *id, const uint64_t *blocks) {
  hixl_kv_request r = request(id, NREQ * TOKENS, NULL);
  int32_t delay = 0;
  hixl_kv_buffer params = {0};
  ST_IS(ops->request_finished(p->sched, &r, blocks, NREQ, &delay, &params), HIXL_KV_SUCCESS);
  char *text = take_text(&params);
  CU_ASSERT_PTR_NOT_NULL_FATAL(text);
  return text;
}

/* The producer finishes request id (every rank holds its copy after the step) and the
 * consumer's scheduler takes its kv_transfer_params: matched, allocated, loaded at its
 * next step. The params' text; the caller frees it. */
static char *hand_over(struct side *p, struct side *d, const char *id) {
  hixl_kv_request r = request(id, NREQ * TOKENS, NULL);
  int32_t delay = 0;
  hixl_kv_buffer params = {0};
  ST_IS(ops->request_finished(p->sched, &r, p_blocks, NREQ, &delay, &params), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(delay, 1);
  step(p);
  char *text = take_text(&params);
  CU_ASSERT_PTR_NOT_NULL_FATAL(text);
  hixl_kv_request q = request(id, NREQ * TOKENS, text);
  int64_t tokens = -2;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d->sched, &q, 0, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(tokens, NREQ * TOKENS);
  ST_IS(ops->update_state_after_alloc(d->sched, &q, c_blocks, NREQ, (uint64_t)tokens), HIXL_KV_SUCCESS);
  return text;
}

static uint64_t next_seed = 500;

static void pull(const struct model *m, uint32_t np, uint32_t nd) {
  struct side p, d;
  ST_IS(side_up(&p, m, np, "producer", "pull"), HIXL_KV_SUCCESS);
  ST_IS(side_up(&d, m, nd, "consumer", "pull"), HIXL_KV_SUCCESS);
  uint64_t seed = next_seed++;
  char id[32];
  snprintf(id, sizeof(id), "tp-%u-%u-%llu", np, nd, (unsigned long long)seed);
  for (uint32_t l = 0; l < LAYERS; l++)
    for (uint32_t i = 0; i < np; i++) {
      compute(&p, &p.r[i], seed, l);
      ST_IS(ops->save_kv_layer(p.r[i].worker, l), HIXL_KV_SUCCESS);
    }
  char *text = hand_over(&p, &d, id);
  char tp[32];
  snprintf(tp, sizeof(tp), "\"tp_size\":%u", np);
  CU_ASSERT_PTR_NOT_NULL(strstr(text, tp));
  CU_ASSERT_TRUE(wait_all(&d, id, RECVING, 20000));
  CU_ASSERT_TRUE(wait_all(&p, id, SENDING, 20000)); /* every producer rank freed */
  uint64_t moved = 0, failed = 0;
  for (uint32_t i = 0; i < nd; i++) {
    hixl_kv_blocks e = {0};
    ST_IS(ops->get_block_ids_with_load_errors(d.r[i].worker, &e), HIXL_KV_SUCCESS);
    failed += e.count;
    ops->free_buffer(&e.raw);
    CU_ASSERT_TRUE(rank_is(&d, &d.r[i], seed, LAYERS));
    hixl_kv_stats_ex s = stats(d.r[i].worker);
    CU_ASSERT(s.loads_done == 1 && s.loads_failed == 0);
    moved += s.bytes_loaded;
  }
  CU_ASSERT_EQUAL(failed, 0);
  CU_ASSERT_EQUAL(moved, needed(&d)); /* bytes moved = bytes needed: a replicated head once */
  for (uint32_t i = 0; i < np; i++) {
    hixl_kv_stats_ex s = stats(p.r[i].worker);
    CU_ASSERT(s.blocks_held == 0 && s.requests_held == 0 && s.lease_expired == 0);
  }
  free(text);
  side_down(&d);
  side_down(&p);
}

static void push(const struct model *m, uint32_t np, uint32_t nd) {
  struct side p, d;
  ST_IS(side_up(&p, m, np, "producer", "push"), HIXL_KV_SUCCESS);
  ST_IS(side_up(&d, m, nd, "consumer", "push"), HIXL_KV_SUCCESS);
  uint64_t seed = next_seed++;
  char id[32];
  snprintf(id, sizeof(id), "tq-%u-%u-%llu", np, nd, (unsigned long long)seed);
  hixl_kv_request r = request(id, NREQ * TOKENS, "{\"do_remote_prefill\": true}");
  int64_t tokens = -2;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d.sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  ST_IS(ops->update_state_after_alloc(d.sched, &r, c_blocks, NREQ, (uint64_t)tokens), HIXL_KV_SUCCESS);
  hixl_kv_buffer params = {0};
  ST_IS(ops->get_push_params(d.sched, id, strlen(id), &params), HIXL_KV_SUCCESS);
  step(&d); /* every consumer rank expects it */
  char *text = take_text(&params);
  CU_ASSERT_PTR_NOT_NULL_FATAL(text);
  hixl_kv_request q = request(id, NREQ * TOKENS, text);
  ST_IS(ops->get_num_new_matched_tokens(p.sched, &q, 0, &tokens, &async), HIXL_KV_SUCCESS);
  ST_IS(ops->update_state_after_alloc(p.sched, &q, p_blocks, NREQ, 0), HIXL_KV_SUCCESS);
  step(&p); /* every producer rank pushes its part as its layers are saved */
  for (uint32_t l = 0; l < LAYERS; l++) {
    for (uint32_t i = 0; i < np; i++) {
      compute(&p, &p.r[i], seed, l);
      ST_IS(ops->save_kv_layer(p.r[i].worker, l), HIXL_KV_SUCCESS);
    }
    for (uint32_t i = 0; i < nd; i++) { /* layer l has landed on each rank, from every writer */
      ST_IS(ops->wait_for_layer_load(d.r[i].worker, l), HIXL_KV_SUCCESS);
      if (l + 1 == LAYERS) continue;
      CU_ASSERT_TRUE(rank_is(&d, &d.r[i], seed, l + 1)); /* and l + 1 not yet */
    }
  }
  for (uint32_t i = 0; i < np; i++) ST_IS(ops->wait_for_save(p.r[i].worker), HIXL_KV_SUCCESS);
  CU_ASSERT_TRUE(wait_all(&d, id, RECVING, 20000));
  int32_t delay = -1;
  hixl_kv_buffer unused = {0};
  ST_IS(ops->request_finished(p.sched, &q, p_blocks, NREQ, &delay, &unused), HIXL_KV_SUCCESS);
  ops->free_buffer(&unused);
  CU_ASSERT_TRUE(wait_all(&p, id, SENDING, 20000));
  uint64_t moved = 0;
  for (uint32_t i = 0; i < nd; i++) {
    CU_ASSERT_TRUE(rank_is(&d, &d.r[i], seed, LAYERS));
    hixl_kv_stats_ex s = stats(d.r[i].worker);
    CU_ASSERT(s.loads_done == 1 && s.loads_failed == 0);
  }
  for (uint32_t i = 0; i < np; i++) {
    hixl_kv_stats_ex s = stats(p.r[i].worker);
    CU_ASSERT(s.blocks_held == 0 && s.requests_held == 0 && s.pushes_failed == 0);
    moved += s.bytes_pushed;
  }
  CU_ASSERT_EQUAL(moved, needed(&d));
  if (auth_key) /* the links were shm: the layers told by landed bytes (docs/plugin.md) */
    for (uint32_t i = 0; i < np; i++) {
      hixl_kv_buffer mt = {0};
      ST_IS(ops->render_metrics(p.r[i].worker, &mt), HIXL_KV_SUCCESS);
      bool pushed = stats(p.r[i].worker).bytes_pushed > 0;
      CU_ASSERT(!pushed || memmem(mt.data, mt.len, "transport=\"shm\"", 15));
      CU_ASSERT(!memmem(mt.data, mt.len, "transport=\"tcp\"", 15));
      ops->free_buffer(&mt);
    }
  free(text);
  side_down(&d);
  side_down(&p);
}

/* push over shm (both sides hold a key): each producer rank that writes a consumer rank
 * asks it for a row of landed bytes (ACCEPT_W) and tells each layer by its byte; the
 * consumer rank's forward pass holds a layer once every writer's byte came, and not
 * before its data (rank_is: layer l + 1 still untouched). */
static void push_shm(const struct model *m, uint32_t np, uint32_t nd) {
  auth_key = key_file();
  CU_ASSERT_PTR_NOT_NULL_FATAL(auth_key);
  push(m, np, nd);
  auth_key = NULL;
}

static const struct model gqa8 = {.kv_heads = 8}, gqa2 = {.kv_heads = 2}, mla = {.mla = true};

#define PAIR(name, m, a, b)                                                                                  \
  static void test_pull_##name(void) { pull(&m, a, b); }                                                     \
  static void test_push_##name(void) { push(&m, a, b); }
PAIR(gqa8_1_2, gqa8, 1, 2)
PAIR(gqa8_2_1, gqa8, 2, 1)
PAIR(gqa8_2_4, gqa8, 2, 4)
PAIR(gqa8_4_2, gqa8, 4, 2)
PAIR(gqa8_1_4, gqa8, 1, 4)
PAIR(gqa8_4_1, gqa8, 4, 1)
PAIR(gqa8_2_2, gqa8, 2, 2)
PAIR(gqa2_1_4, gqa2, 1, 4) /* decode ranks share heads: each of 2 heads on 2 ranks */
PAIR(gqa2_4_1, gqa2, 4, 1) /* prefill replicas: one of each pair read, the other only freed */
PAIR(gqa2_4_2, gqa2, 4, 2)
PAIR(mla_1_4, mla, 1, 4)
PAIR(mla_4_1, mla, 4, 1) /* prefill ranks 1..3 read by nobody: freed */
PAIR(mla_2_4, mla, 2, 4)
#define SHM(name, m, a, b)                                                                                   \
  static void test_push_shm_##name(void) { push_shm(&m, a, b); }
SHM(gqa8_2_1, gqa8, 2, 1) /* two writers of one consumer rank: a row each */
SHM(gqa8_1_2, gqa8, 1, 2)
SHM(gqa8_4_2, gqa8, 4, 2)
SHM(gqa2_4_1, gqa2, 4, 1)
SHM(mla_4_1, mla, 4, 1)

/* Pairs that cannot map: the load fails with both sizes named, nothing moves, and
 * every producer rank frees its copy. */
static void cannot_map(const struct model *m, uint32_t np, uint32_t nd, const char *says) {
  struct side p, d;
  char logname[] = "/tmp/hixl-tp-log-XXXXXX"; /* the plugin's log (stderr) while it loads */
  int logfd = mkstemp(logname), saved = dup(2);
  CU_ASSERT_FATAL(logfd >= 0 && saved >= 0);
  unlink(logname);
  ST_IS(side_up(&p, m, np, "producer", "pull"), HIXL_KV_SUCCESS);
  ST_IS(side_up(&d, m, nd, "consumer", "pull"), HIXL_KV_SUCCESS);
  const char *id = "tp-bad";
  char *text = hand_over(&p, &d, id);
  fflush(stderr);
  dup2(logfd, 2);
  CU_ASSERT_TRUE(wait_all(&d, id, RECVING, 20000));
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char log[8192] = "";
  ssize_t got = pread(logfd, log, sizeof(log) - 1, 0);
  close(logfd);
  log[got > 0 ? got : 0] = '\0';
  char sizes[96];
  snprintf(sizes, sizeof(sizes), "(%u ranks) and this consumer (%u ranks)", np, nd);
  if (!strstr(log, says) || !strstr(log, sizes)) fprintf(stderr, "  the plugin said: %s\n", log);
  CU_ASSERT_PTR_NOT_NULL(strstr(log, says));
  CU_ASSERT_PTR_NOT_NULL(strstr(log, sizes));
  for (uint32_t i = 0; i < nd; i++) {
    hixl_kv_blocks e = {0};
    ST_IS(ops->get_block_ids_with_load_errors(d.r[i].worker, &e), HIXL_KV_SUCCESS);
    CU_ASSERT_EQUAL(e.count, NREQ);
    ops->free_buffer(&e.raw);
    CU_ASSERT_TRUE(rank_is(&d, &d.r[i], 0, 0)); /* untouched */
  }
  CU_ASSERT_TRUE(wait_all(&p, id, SENDING, 20000));
  free(text);
  side_down(&d);
  side_down(&p);
}

/* A consumer rank that is gone (its connector destroyed before it loads, as a process
 * that died): the other ranks load and verify; the producer rank it shared with a live
 * one frees its copy when the lease runs out, the producer rank only live ranks read at
 * once; every producer rank ends at 0 blocks. */
static void test_consumer_rank_gone(void) {
  struct side p, d;
  lease_ms = 1500;
  ST_IS(side_up(&p, &gqa8, 2, "producer", "pull"), HIXL_KV_SUCCESS);
  ST_IS(side_up(&d, &gqa8, 4, "consumer", "pull"), HIXL_KV_SUCCESS);
  lease_ms = 10000;
  uint64_t seed = next_seed++;
  const char *id = "tp-gone";
  for (uint32_t l = 0; l < LAYERS; l++)
    for (uint32_t i = 0; i < p.world; i++) compute(&p, &p.r[i], seed, l);
  char *text = hand_over(&p, &d, id);
  ops->destroy(d.r[3].worker); /* rank 3 dies before the step reaches it */
  d.r[3].worker = NULL;
  d.world = 3;
  CU_ASSERT_TRUE(wait_all(&d, id, RECVING, 20000));
  for (uint32_t i = 0; i < 3; i++) CU_ASSERT_TRUE(rank_is(&d, &d.r[i], seed, LAYERS));
  /* Producer rank 0 (read by consumer ranks 0 and 1) frees at once; rank 1 (ranks 2 and
   * 3) only when its lease ends. */
  struct side p0 = p, p1 = p;
  p0.world = 1;
  CU_ASSERT_TRUE(wait_all(&p0, id, SENDING, 1000));
  p1.r[0] = p.r[1];
  p1.world = 1;
  int64_t t0 = now_ms();
  CU_ASSERT_TRUE(wait_all(&p1, id, SENDING, 10000));
  CU_ASSERT(now_ms() - t0 >= 500); /* it waited for the lease, not for rank 3's FREE */
  hixl_kv_stats_ex s0 = stats(p.r[0].worker), s1 = stats(p.r[1].worker);
  CU_ASSERT(s0.blocks_held == 0 && s0.lease_expired == 0);
  CU_ASSERT(s1.blocks_held == 0 && s1.lease_expired == 1);
  d.world = 4;
  free(text);
  side_down(&d);
  side_down(&p);
}

/* Producer ranks that bind their holds only after the consumer has loaded (a router
 * forwards the params at request_finished, before the next step binds them): MLA 4 ->
 * 1 reads rank 0 and frees ranks 1 to 3 without reading them; those frees wait until
 * each rank holds the request, so no hold is left to its lease. */
static void test_late_hold(void) {
  struct side p, d;
  ST_IS(side_up(&p, &mla, 4, "producer", "pull"), HIXL_KV_SUCCESS);
  ST_IS(side_up(&d, &mla, 1, "consumer", "pull"), HIXL_KV_SUCCESS);
  uint64_t seed = next_seed++;
  const char *id = "tp-late";
  hixl_kv_request r = request(id, NREQ * TOKENS, NULL);
  for (uint32_t l = 0; l < LAYERS; l++)
    for (uint32_t i = 0; i < p.world; i++) compute(&p, &p.r[i], seed, l);
  int32_t delay = 0;
  hixl_kv_buffer params = {0}, m = {0};
  ST_IS(ops->request_finished(p.sched, &r, p_blocks, NREQ, &delay, &params), HIXL_KV_SUCCESS);
  ST_IS(ops->build_connector_meta(p.sched, &m), HIXL_KV_SUCCESS);
  ST_IS(ops->bind_connector_meta(p.r[0].worker, m.data, m.len), HIXL_KV_SUCCESS); /* rank 0 only, now */
  char *text = take_text(&params);
  CU_ASSERT_PTR_NOT_NULL_FATAL(text);
  hixl_kv_request q = request(id, NREQ * TOKENS, text);
  int64_t tokens = -2;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d.sched, &q, 0, &tokens, &async), HIXL_KV_SUCCESS);
  ST_IS(ops->update_state_after_alloc(d.sched, &q, c_blocks, NREQ, (uint64_t)tokens), HIXL_KV_SUCCESS);
  CU_ASSERT_TRUE(wait_all(&d, id, RECVING, 20000));
  CU_ASSERT_TRUE(rank_is(&d, &d.r[0], seed, LAYERS));
  for (uint32_t i = 1; i < p.world; i++) /* the other ranks bind it now */
    ST_IS(ops->bind_connector_meta(p.r[i].worker, m.data, m.len), HIXL_KV_SUCCESS);
  ops->free_buffer(&m);
  CU_ASSERT_TRUE(wait_all(&p, id, SENDING, 5000)); /* well within the 10 s lease */
  for (uint32_t i = 0; i < p.world; i++) {
    hixl_kv_stats_ex s = stats(p.r[i].worker);
    CU_ASSERT(s.blocks_held == 0 && s.lease_expired == 0 && s.cap_refused == 0);
  }
  free(text);
  side_down(&d);
  side_down(&p);
}

/* A load that waits for its loader thread (behind another of the same producer, whose
 * producer has not bound it yet) keeps its request held: the renewer pins queued loads
 * too, not only the one being pulled. Request a's hold is bound late; b's, bound at
 * once, would otherwise run out its 1 s lease while a's load waits. */
static void test_queued_load_kept(void) {
  static const uint64_t pa[NREQ] = {3, 7, 8, 12}, pb[NREQ] = {1, 2, 4, 5};
  static const uint64_t ca[NREQ] = {1, 2, 9, 15}, cb[NREQ] = {3, 4, 5, 6};
  struct side p, d;
  lease_ms = 1000;
  ST_IS(side_up(&p, &gqa8, 1, "producer", "pull"), HIXL_KV_SUCCESS);
  ST_IS(side_up(&d, &gqa8, 1, "consumer", "pull"), HIXL_KV_SUCCESS);
  lease_ms = 10000;
  const char *ids[2] = {"q-a", "q-b"};
  const uint64_t *pbl[2] = {pa, pb}, *cbl[2] = {ca, cb};
  char *text[2];
  for (int k = 1; k >= 0; k--) { /* b held now, a only after the wait */
    text[k] = finish(&p, ids[k], pbl[k]);
    if (k == 1) step(&p);
  }
  for (int k = 0; k < 2; k++) { /* a first: its load takes the loader thread, b waits behind it */
    hixl_kv_request q = request(ids[k], NREQ * TOKENS, text[k]);
    int64_t tokens = -2;
    int32_t async = 0;
    ST_IS(ops->get_num_new_matched_tokens(d.sched, &q, 0, &tokens, &async), HIXL_KV_SUCCESS);
    ST_IS(ops->update_state_after_alloc(d.sched, &q, cbl[k], NREQ, (uint64_t)tokens), HIXL_KV_SUCCESS);
  }
  step(&d);
  /* Two and a half leases, or until b's ran out (the failure). */
  int64_t end = now_ms() + 2500;
  while (now_ms() < end && stats(p.r[0].worker).lease_expired == 0) {
    hixl_kv_ids sent = {0}, recv = {0};
    poll(NULL, 0, 50); /* a deadline, not a synchronization: the lease is what is tested */
    if (ops->get_finished(p.r[0].worker, NULL, &sent, &recv) == HIXL_KV_SUCCESS) { /* expiries run here */
      ops->free_ids(&sent);
      ops->free_ids(&recv);
    }
  }
  step(&p); /* a held now: its load goes, then b's */
  CU_ASSERT_TRUE(wait_all(&d, ids[0], RECVING, 10000));
  hixl_kv_stats_ex s = stats(d.r[0].worker);
  if (s.loads_done != 2) CU_ASSERT_TRUE(wait_all(&d, ids[1], RECVING, 10000));
  s = stats(d.r[0].worker);
  CU_ASSERT(s.loads_done == 2 && s.loads_failed == 0);
  CU_ASSERT_EQUAL(stats(p.r[0].worker).lease_expired, 0);
  free(text[0]);
  free(text[1]);
  side_down(&d);
  side_down(&p);
}

/* Consumer rank k's blocks cb of every layer hold what producer rank pr has in its
 * blocks pb (MLA: every rank's latent), and they were written (not 0xEE). */
static bool blocks_same(const struct side *p, const struct rank *pr, const uint64_t *pb, const struct side *d,
                        const struct rank *k, const uint64_t *cb) {
  uint32_t bb = block_bytes(d, k);
  for (uint32_t l = 0; l < LAYERS; l++)
    for (uint32_t j = 0; j < NREQ; j++) {
      const uint8_t *want = pr->mem + l * pr->layer_bytes + pb[j] * block_bytes(p, pr);
      const uint8_t *got = k->mem + l * k->layer_bytes + cb[j] * bb;
      if (memcmp(got, want, bb) != 0 || want[0] == 0xEE) {
        fprintf(stderr, "  layer %u block %llu differs from the producer's block %llu\n", l,
                (unsigned long long)cb[j], (unsigned long long)pb[j]);
        return false;
      }
    }
  return true;
}

/* A producer rank's loads go one after another on one loader thread, the next one's
 * PIN started while the one before is pulled (kv_loader.c). MLA 4 -> 1, requests a, b
 * and c in one step; b's hold is bound only after a has loaded, so the PIN started
 * ahead for b while a was pulled is answered "not yet": b asks again until the hold
 * comes, c (PINned ahead while b is pulled) waits behind it. Every request loads,
 * once, with the producer's bytes; every producer rank frees each and holds nothing. */
static void test_pinned_ahead(void) {
  static const uint64_t pb[3][NREQ] = {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}};
  static const uint64_t cb[3][NREQ] = {{12, 13, 14, 15}, {4, 5, 6, 7}, {8, 9, 10, 11}};
  const char *ids[3] = {"ahead-a", "ahead-b", "ahead-c"};
  struct side p, d;
  ST_IS(side_up(&p, &mla, 4, "producer", "pull"), HIXL_KV_SUCCESS);
  ST_IS(side_up(&d, &mla, 1, "consumer", "pull"), HIXL_KV_SUCCESS);
  uint64_t seed = next_seed++;
  for (uint32_t i = 0; i < p.world; i++) /* the same latent on every rank, another per request */
    for (uint32_t l = 0; l < LAYERS; l++)
      for (int q = 0; q < 3; q++)
        for (uint32_t j = 0; j < NREQ; j++)
          for (uint32_t y = 0; y < LATENT_BYTES; y++)
            p.r[i].mem[l * p.r[i].layer_bytes + pb[q][j] * LATENT_BYTES + y] = pat(seed + q, l, j, 0, y);
  char *text[3];
  for (int q = 0; q < 3; q++) { /* a and c held now; b's hold is bound at the producer's next step */
    int k = q == 2 ? 1 : q == 1 ? 2 : 0;
    text[k] = finish(&p, ids[k], pb[k]);
    if (q == 1) step(&p);
  }
  for (int k = 0; k < 3; k++) { /* bound in the order a, b, c */
    hixl_kv_request q = request(ids[k], NREQ * TOKENS, text[k]);
    int64_t tokens = -2;
    int32_t async = 0;
    ST_IS(ops->get_num_new_matched_tokens(d.sched, &q, 0, &tokens, &async), HIXL_KV_SUCCESS);
    ST_IS(ops->update_state_after_alloc(d.sched, &q, cb[k], NREQ, (uint64_t)tokens), HIXL_KV_SUCCESS);
  }
  CU_ASSERT_TRUE(wait_all(&d, ids[0], RECVING, 20000));
  hixl_kv_stats_ex s0 = stats(d.r[0].worker); /* b cannot load before its hold, nor c behind it */
  CU_ASSERT(s0.loads_done == 1 && s0.loads_failed == 0);
  step(&p); /* b's hold */
  CU_ASSERT_TRUE(wait_all(&d, ids[1], RECVING, 20000));
  if (stats(d.r[0].worker).loads_done < 3) CU_ASSERT_TRUE(wait_all(&d, ids[2], RECVING, 20000));
  hixl_kv_stats_ex s = stats(d.r[0].worker);
  CU_ASSERT(s.loads_done == 3 && s.loads_failed == 0);
  CU_ASSERT_EQUAL(s.bytes_loaded, 3ull * LAYERS * NREQ * LATENT_BYTES);
  for (int k = 0; k < 3; k++) CU_ASSERT_TRUE(blocks_same(&p, &p.r[0], pb[k], &d, &d.r[0], cb[k]));
  /* Every producer rank frees each request, once, well within the lease. */
  uint32_t sent[MAX_TP] = {0};
  int64_t end = now_ms() + 5000;
  bool all = false;
  while (!all && now_ms() < end) {
    step(&p);
    all = true;
    for (uint32_t i = 0; i < p.world; i++) {
      hixl_kv_ids sn = {0}, rv = {0};
      ST_IS(ops->get_finished(p.r[i].worker, NULL, &sn, &rv), HIXL_KV_SUCCESS);
      for (int k = 0; k < 3; k++)
        if (ids_have(&sn, ids[k])) {
          CU_ASSERT_FALSE(sent[i] >> k & 1);
          sent[i] |= 1u << k;
        }
      ops->free_ids(&sn);
      ops->free_ids(&rv);
      all &= sent[i] == 7;
    }
    if (!all) poll(NULL, 0, 5); /* polling for the reports, as wait_all does */
  }
  CU_ASSERT_TRUE(all);
  hixl_kv_blocks e = {0};
  ST_IS(ops->get_block_ids_with_load_errors(d.r[0].worker, &e), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(e.count, 0);
  ops->free_buffer(&e.raw);
  for (uint32_t i = 0; i < p.world; i++) {
    hixl_kv_stats_ex x = stats(p.r[i].worker);
    CU_ASSERT(x.blocks_held == 0 && x.requests_held == 0 && x.lease_expired == 0 && x.cap_refused == 0);
  }
  for (int k = 0; k < 3; k++) free(text[k]);
  side_down(&d);
  side_down(&p);
}

static const struct model flat8 = {.kv_heads = 8, .no_heads = true};
static void test_no_head_dimension(void) { cannot_map(&flat8, 1, 2, "head dimension"); }
static void test_neither_divides(void) { cannot_map(&mla, 2, 3, "neither divides"); }

/* A group's heads that do not add up: refused at registration, naming them. */
/* Params whose remote_engine leaves no port for the peer's last rank (port + rank past
 * 65535: 65535 with tp_size 2, as a broken or hostile peer may send) are refused where
 * they come in: a pull consumer's get_num_new_matched_tokens offers nothing to load (the
 * host computes the prompt), a push producer pushes nothing (request_finished frees its
 * blocks), and no worker binds an entry it cannot act on. Before, the scheduler checked
 * rank 0's port alone: the worker's bind_connector_meta failed (PARAM_INVALID: the vLLM
 * adapter raises, stopping the worker), and a pull consumer's request never finished. */
static void test_ports_past_end(void) {
  char params[512];
  const char *flags[2] = {"do_remote_prefill", "do_remote_decode"};
  for (int k = 0; k < 2; k++) { /* a pull consumer, a push producer */
    struct side s;
    ST_IS(side_up(&s, &gqa8, 1, k ? "producer" : "consumer", k ? "push" : "pull"), HIXL_KV_SUCCESS);
    snprintf(params, sizeof(params),
             "{\"%s\": true, \"remote_engine\": \"%s:65535\", \"remote_request_id\": \"past\", "
             "\"remote_block_ids\": [1, 2, 3, 4], \"tp_size\": 2}",
             flags[k], test_ip());
    hixl_kv_request r = request("past", NREQ * TOKENS, params);
    int64_t tokens = -1;
    int32_t async = -1;
    ST_IS(ops->get_num_new_matched_tokens(s.sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
    CU_ASSERT_EQUAL(tokens, 0);
    ST_IS(ops->update_state_after_alloc(s.sched, &r, k ? p_blocks : c_blocks, NREQ, (uint64_t)tokens),
          HIXL_KV_SUCCESS);
    step(&s); /* bind_connector_meta: SUCCESS */
    hixl_kv_ids sent = {0}, recv = {0};
    ST_IS(ops->get_finished(s.r[0].worker, NULL, &sent, &recv), HIXL_KV_SUCCESS);
    CU_ASSERT(sent.count == 0 && recv.count == 0); /* nothing was bound */
    ops->free_ids(&sent);
    ops->free_ids(&recv);
    side_down(&s);
  }
}

static void test_heads_checked(void) {
  char cfg[256];
  snprintf(cfg, sizeof(cfg), "{\"address\": \"%s:%u\", \"Transport\": \"tcp\"}", test_ip(),
           (unsigned)hold_run(test_ip(), 2)); /* rank 1 listens on port + 1 */
  hixl_kv_connector *w = NULL;
  char err[256];
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 1, 2, &w, err, sizeof(err)), HIXL_KV_SUCCESS);
  uint8_t *mem = aligned_alloc(4096, 65536);
  CU_ASSERT_PTR_NOT_NULL_FATAL(mem);
  hixl_kv_plane pl = {.base = (uintptr_t)mem,
                      .block_stride = 3 * HEAD_BYTES,
                      .block_bytes = 3 * HEAD_BYTES,
                      .head_stride = HEAD_BYTES,
                      .num_heads = 3};
  hixl_kv_group g = {.size = sizeof(g),
                     .kind = HIXL_KV_GROUP_FULL_ATTENTION,
                     .num_layers = 1,
                     .planes_per_layer = 1,
                     .planes = &pl,
                     .num_blocks = 4,
                     .block_tokens = TOKENS,
                     .elem_size = ELEM,
                     .total_kv_heads = 8}; /* 8 over 2 ranks is 4 each, not 3 */
  ST_IS(ops->register_kv_groups(w, &g, 1), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(ops->last_error(), "8 KV heads over 2 ranks"));
  g.kind = HIXL_KV_GROUP_MLA; /* an MLA group holds no share of heads */
  ST_IS(ops->register_kv_groups(w, &g, 1), HIXL_KV_PARAM_INVALID);
  g.size = HIXL_KV_GROUP_SIZE_1_3; /* a 1.3 host: its planes' heads times the world (3 x 2) */
  g.kind = HIXL_KV_GROUP_FULL_ATTENTION;
  ST_IS(ops->register_kv_groups(w, &g, 1), HIXL_KV_SUCCESS);
  ops->destroy(w);
  /* A 1.3 host's array of two groups: its elements are 80 bytes apart, not 88 (before:
   * group 1 was read 88 bytes in, and refused for its "size"). */
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 1, 2, &w, err, sizeof(err)), HIXL_KV_SUCCESS);
  hixl_kv_plane pl2 = pl;
  pl2.base = (uintptr_t)mem + 32768;
  hixl_kv_group g1 = g;
  g1.first_layer = 1;
  g1.planes = &pl2;
  _Alignas(hixl_kv_group) uint8_t old_host[2 * HIXL_KV_GROUP_SIZE_1_3];
  memcpy(old_host, &g, HIXL_KV_GROUP_SIZE_1_3);
  memcpy(old_host + HIXL_KV_GROUP_SIZE_1_3, &g1, HIXL_KV_GROUP_SIZE_1_3);
  ST_IS(ops->register_kv_groups(w, (const hixl_kv_group *)(const void *)old_host, 2), HIXL_KV_SUCCESS);
  ops->destroy(w);
  free(mem);
  /* required_kv_layout HND: what get_required_kvcache_layout asks of the runtime. */
  snprintf(cfg, sizeof(cfg), "{\"address\": \"%s:%u\", \"required_kv_layout\": \"HND\"}", test_ip(),
           (unsigned)free_port());
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 2, &w, err, sizeof(err)), HIXL_KV_SUCCESS);
  hixl_kv_buffer b = {0};
  ST_IS(ops->get_required_kvcache_layout(w, &b), HIXL_KV_SUCCESS);
  CU_ASSERT(b.len == 3 && memcmp(b.data, "HND", 3) == 0);
  ops->free_buffer(&b);
  ops->destroy(w);
  snprintf(cfg, sizeof(cfg), "{\"address\": \"%s:%u\", \"required_kv_layout\": \"NHD\"}", test_ip(),
           (unsigned)free_port());
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 2, &w, err, sizeof(err)),
        HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(err, "required_kv_layout"));
}

/* A 1.3 host's planes of 2^31 heads on rank 1 of 2: their heads times the world is 2^32,
 * which wrapped to 0 KV heads (before: a division by 0, the host killed by SIGFPE);
 * refused, naming the heads. */
static void test_heads_overflow(void) {
  char cfg[256];
  snprintf(cfg, sizeof(cfg), "{\"address\": \"%s:%u\", \"Transport\": \"tcp\"}", test_ip(),
           (unsigned)hold_run(test_ip(), 2));
  hixl_kv_connector *w = NULL;
  char err[256];
  ST_IS(ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 1, 2, &w, err, sizeof(err)), HIXL_KV_SUCCESS);
  uint8_t *mem = aligned_alloc(4096, 4096);
  CU_ASSERT_PTR_NOT_NULL_FATAL(mem);
  hixl_kv_plane pl = {.base = (uintptr_t)mem,
                      .block_bytes = UINT64_C(1) << 31,
                      .head_stride = 1,
                      .num_heads = UINT32_C(1) << 31};
  hixl_kv_group g = {.size = HIXL_KV_GROUP_SIZE_1_3,
                     .kind = HIXL_KV_GROUP_FULL_ATTENTION,
                     .num_layers = 1,
                     .planes_per_layer = 1,
                     .planes = &pl,
                     .num_blocks = 1,
                     .block_tokens = TOKENS,
                     .elem_size = 1};
  ST_IS(ops->register_kv_groups(w, &g, 1), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(ops->last_error(), "heads"));
  ops->destroy(w);
  free(mem);
}

#define T(name)                                                                                              \
  { #name, test_##name }
static CU_TestInfo tp_tests[] = {
    T(pull_gqa8_1_2),      T(pull_gqa8_2_1),     T(pull_gqa8_2_4),     T(pull_gqa8_4_2),
    T(pull_gqa8_1_4),      T(pull_gqa8_4_1),     T(pull_gqa8_2_2),     T(pull_gqa2_1_4),
    T(pull_gqa2_4_1),      T(pull_gqa2_4_2),     T(pull_mla_1_4),      T(pull_mla_4_1),
    T(pull_mla_2_4),       T(push_gqa8_1_2),     T(push_gqa8_2_1),     T(push_gqa8_2_4),
    T(push_gqa8_4_2),      T(push_gqa8_1_4),     T(push_gqa8_4_1),     T(push_gqa8_2_2),
    T(push_gqa2_1_4),      T(push_gqa2_4_1),     T(push_gqa2_4_2),     T(push_mla_1_4),
    T(push_mla_4_1),       T(push_mla_2_4),      T(no_head_dimension), T(neither_divides),
    T(consumer_rank_gone), T(late_hold),         T(queued_load_kept),  T(pinned_ahead),
    T(heads_checked),      T(heads_overflow),    T(ports_past_end),    T(push_shm_gqa8_2_1),
    T(push_shm_gqa8_1_2),  T(push_shm_gqa8_4_2), T(push_shm_gqa2_4_1), T(push_shm_mla_4_1),
    CU_TEST_INFO_NULL};

static CU_SuiteInfo suites[] = {{"tensor parallelism across the hand-off", NULL, NULL, NULL, NULL, tp_tests},
                                CU_SUITE_INFO_NULL};

int main(void) {
  so = kv_host_open("test_plugin_tp", HIXL_KV_PLUGIN_PATH, &ops);
  if (!so) return 1;
  /* Kept loaded past the run's dlclose: the push_shm cases' keys made libcrypto's global
   * state, which LeakSanitizer would report as lost once the library was unmapped. */
  dlopen(HIXL_KV_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD | RTLD_NODELETE);
  return kv_host_run("test_plugin_tp", suites, so);
}
