/* hixl-cache-bench (`hixl-perf cache`): the cache manager against the raw engine moving
 * the same bytes. The target, the test's server (forked before any engine exists),
 * registers a paged KV cache shaped like a model under cluster 2; this process, cluster
 * 1, moves one request's blocks per scenario and iteration through the cache manager
 * and, as HixlEngineTransferSync of the op list it builds, raw. The shape, the
 * scenarios and the method: docs/performance-cache.md; --help: the flags. */
#include <inttypes.h>

#include "harness.h"

#define MAX_TENSORS 512

static struct {
  const char *transport, *ip, *json;
  uint32_t layers, blocks, req, iters;
  size_t bs;
  bool progress;
} o = {NULL, "127.0.0.1", NULL, 32, 128, 64, 15, 32768, true};

static uint32_t ntensors(void) { return 2 * o.layers; }

/* A cache manager on e for cluster c with its cache registered, each tensor a pattern of
 * its own (c, tensor): the manager, the tensors into *t, the cache's id into *id. Dies
 * on failure. */
static HixlCacheManager *cache_up(HixlEngine *e, uint64_t c, uint8_t ***t, uint64_t *id) {
  HixlCacheManager *m;
  HixlCacheDesc d = {ntensors(), 2, 2, {o.blocks, o.bs / 2}, HIXL_CACHE_HOST};
  HixlBlocksCacheKey k = {c, 0};
  uintptr_t a[MAX_TENSORS];
  size_t len = (size_t)o.blocks * o.bs;
  hb_check(HixlCacheManagerCreate(e, c, &m), "manager");
  if (!(*t = calloc(ntensors(), sizeof(**t)))) hb_die("out of memory");
  for (uint32_t i = 0; i < ntensors(); i++) {
    if (!((*t)[i] = aligned_alloc(4096, len))) hb_die("out of memory");
    bench_pattern_fill((*t)[i], len, c << 32 | i);
    a[i] = (uintptr_t)(*t)[i];
  }
  hb_check(HixlCacheManagerRegisterBlocksCache(m, &d, a, ntensors(), &k, HIXL_CACHE_ACCESS_REMOTE, id),
           "register");
  return m;
}

/* FNV-1a, a word at a time, of blocks[] of every tensor, in order. */
static uint64_t digest(uint8_t **t, const uint64_t *blocks, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint32_t i = 0; i < ntensors(); i++)
    for (size_t b = 0; b < n; b++)
      for (size_t j = 0; j < o.bs; j += 8) {
        uint64_t w = 0;
        memcpy(&w, t[i] + blocks[b] * o.bs + j, o.bs - j < 8 ? o.bs - j : 8);
        h = (h ^ w) * 0x100000001b3ull;
      }
  return h;
}

/* ---- the target ---- */

static char peer[64]; /* the target's address */
static int target(int fd) {
  uint8_t **t;
  uint64_t id, addrs[MAX_TENSORS];
  HixlEngine *e = hb_engine(peer, o.transport, NULL, 0);
  if (!e) return 1;
  HixlCacheManager *m = cache_up(e, 2, &t, &id);
  for (uint32_t i = 0; i < ntensors(); i++) addrs[i] = (uintptr_t)t[i];
  if (!hb_ready(fd, addrs, ntensors())) return 1;
  uint32_t n;
  static uint64_t list[1 << 16];
  /* "digest these blocks": a count, the blocks; until the channel closes */
  while (bench_read_full(fd, &n, sizeof(n)) == 0 && n > 0 && n <= (1 << 16) &&
         bench_read_full(fd, list, n * sizeof(uint64_t)) == 0) {
    uint64_t h = digest(t, list, n);
    if (!hb_write_all(fd, &h, sizeof(h))) break;
  }
  HixlCacheManagerDestroy(m);
  HixlEngineDestroy(e);
  return 0;
}

/* ---- this side ---- */

struct scen {
  const char *name;
  bool push;
  uint64_t *src, *dst; /* req blocks each */
  uint64_t ops[2];     /* engine ops of a move: [0] through the cache manager, [1] raw */
};

static HixlEngine *eng;
static HixlCacheManager *mgr;
static uint8_t **mine;
static uint64_t my_id, peer_addrs[MAX_TENSORS];
static struct hb_peer *tgt;

/* The op list the cache manager builds: per tensor, one op per run of blocks adjacent
 * on both sides. */
static size_t build_ops(const struct scen *s, HixlTransferOpDesc *ops) {
  size_t n = 0;
  for (uint32_t t = 0; t < ntensors(); t++)
    for (size_t i = 0; i < o.req;) {
      size_t run = 1;
      while (i + run < o.req && s->src[i + run] == s->src[i] + run && s->dst[i + run] == s->dst[i] + run)
        run++;
      uint64_t local = (uintptr_t)mine[t] + (s->push ? s->src[i] : s->dst[i]) * o.bs;
      uint64_t remote = peer_addrs[t] + (s->push ? s->dst[i] : s->src[i]) * o.bs;
      ops[n++] = (HixlTransferOpDesc){(uintptr_t)local, (uintptr_t)remote, run * o.bs};
      i += run;
    }
  return n;
}

static int always_ready(void *ctx, uint32_t layer, int32_t timeout_ms) {
  (void)ctx, (void)layer, (void)timeout_ms;
  return 1;
}

/* One move of scenario s, through the cache manager or (raw) the engine's op list ops[n]:
 * its seconds; its engine ops into s. Dies on failure. */
static double run_one(struct scen *s, bool raw, const HixlTransferOpDesc *ops, size_t n) {
  HixlCacheAnyKey k = {.kind = HIXL_CACHE_KEY_BLOCKS, .u.blocks = {2, 0}};
  HixlCacheTransferArgs a = HIXL_CACHE_TRANSFER_ARGS_INIT;
  a.timeout_ms = 60000;
  HixlCacheStats c0, c1;
  HixlCacheManagerGetStats(mgr, &c0);
  uint64_t t0 = bench_now_ns();
  HixlStatus st;
  if (raw) {
    st = HixlEngineTransferSync(eng, peer, s->push ? HIXL_WRITE : HIXL_READ, ops, n, 60000);
  } else if (!s->push) {
    st = HixlCacheManagerPullBlocks(mgr, &k, my_id, s->src, o.req, s->dst, o.req, &a);
  } else {
    uintptr_t dst[MAX_TENSORS];
    for (uint32_t t = 0; t < ntensors(); t++) dst[t] = (uintptr_t)peer_addrs[t];
    HixlLayerSynchronizer sync = {always_ready, NULL, 60000};
    HixlCacheTransferConfig cfg = {2, dst, ntensors(), 0, 0, 0};
    HixlCacheAsyncArgs aa = {s->src, o.req, s->dst, o.req, 0, 0, 60000};
    HixlCacheTask *task;
    st = HixlCacheManagerTransferCacheAsync(mgr, my_id, &sync, &cfg, 1, &aa, &task);
    if (st == HIXL_SUCCESS) {
      st = HixlCacheTaskSynchronize(task, 60000);
      HixlCacheTaskDestroy(task);
    }
  }
  double sec = (double)(bench_now_ns() - t0) / 1e9;
  hb_check(st, "%s%s", s->name, raw ? ", raw engine" : " through the cache manager");
  HixlCacheManagerGetStats(mgr, &c1);
  s->ops[raw] = raw ? n : c1.engine_ops - c0.engine_ops;
  return sec;
}

/* Before a checked move: a pull's destination blocks zeroed, a byte of a push's source
 * blocks changed, so that only a move that lands makes them agree. */
static void prepare(const struct scen *s) {
  for (uint32_t t = 0; t < ntensors(); t++)
    for (size_t i = 0; i < o.req; i++)
      if (s->push)
        mine[t][s->src[i] * o.bs] ^= 0x5a;
      else
        memset(mine[t] + s->dst[i] * o.bs, 0, o.bs);
}

/* Whether the blocks moved arrived: the digest of their far side, which the target
 * computes, against this side's. */
static bool arrived(const struct scen *s) {
  uint32_t n = o.req;
  uint64_t h = 0;
  const uint64_t *far = s->push ? s->dst : s->src, *near = s->push ? s->src : s->dst;
  return hb_write_all(tgt->fd, &n, sizeof(n)) && hb_write_all(tgt->fd, far, n * sizeof(uint64_t)) &&
         bench_read_full(tgt->fd, &h, sizeof(h)) == 0 && h == digest(mine, near, n);
}

static void pick(uint64_t *v, size_t n, uint64_t *rng) {
  for (size_t i = 0; i < n;) { /* distinct random blocks */
    *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
    uint64_t b = *rng % o.blocks;
    bool dup = false;
    for (size_t j = 0; j < i; j++) dup |= v[j] == b;
    if (!dup) v[i++] = b;
  }
}

static const char *const transports[] = {"auto", "tcp", "shm", "rdma", NULL};
static int transport;
static const struct hb_opt opts[] = {
    {"--transport", HB_CHOICE, &transport, "NAME", "auto (default) | tcp | shm | rdma", 0, 0, transports},
    {"--ip", HB_STR, &o.ip, "IP", "both engines' address (default 127.0.0.1)", 0, 0, NULL},
    {"--layers", HB_U32, &o.layers, "N", "layers, each K and V (default 32)", 1, MAX_TENSORS / 2, NULL},
    {"--blocks", HB_U32, &o.blocks, "N", "blocks per tensor (default 128)", 1, 1 << 16, NULL},
    {"--block-bytes", HB_SIZE, &o.bs, "SIZE", "bytes of a block, even (default 32K)", 2, 1u << 30, NULL},
    {"--req-blocks", HB_U32, &o.req, "N", "blocks a request (default 64, <= --blocks)", 1, 1 << 16, NULL},
    {"--iters", HB_U32, &o.iters, "N", "iterations per scenario (default 15)", 1, 1 << 16, NULL},
    {"--json", HB_STR, &o.json, "FILE", "the results as JSON", 0, 0, NULL},
    {"--no-progress", HB_NOFLAG, &o.progress, NULL, "nothing on stderr but errors", 0, 0, NULL},
    {NULL, 0, NULL, NULL, NULL, 0, 0, NULL}};

static int setup(void) {
  o.transport = transport ? transports[transport] : NULL;
  if (o.req > o.blocks || o.bs % 2) hb_die("--req-blocks <= --blocks, and an even --block-bytes");
  snprintf(peer, sizeof(peer), "%s:%u", o.ip, hb_ports(o.ip, 1));
  return 0;
}

static int initiator(struct hb_peer *p) {
  tgt = p;
  hb_wait_ready(tgt->fd, peer_addrs, ntensors());
  if (!(eng = hb_engine(o.ip, o.transport, NULL, 0))) return 1;
  mgr = cache_up(eng, 1, &mine, &my_id);
  hb_check(HixlCacheManagerLink(mgr, 2, peer, 10000), "link");

  uint64_t rng = 0x6869786c;
  static uint64_t blk[3][2][1 << 16]; /* each scenario's source and destination blocks */
  struct scen sc[3] = {{"pull-contiguous", false, blk[0][0], blk[0][1], {0}},
                       {"pull-scattered", false, blk[1][0], blk[1][1], {0}},
                       {"push-async", true, blk[2][0], blk[2][1], {0}}};
  for (size_t j = 0; j < o.req; j++) blk[0][0][j] = blk[0][1][j] = j;
  for (int i = 2; i < 6; i++) pick(blk[i / 2][i % 2], o.req, &rng);
  HixlTransferOpDesc *ops = calloc((size_t)ntensors() * o.req, sizeof(*ops));
  double *t[2] = {calloc(o.iters, sizeof(double)), calloc(o.iters, sizeof(double))};
  if (!ops || !t[0] || !t[1]) hb_die("out of memory");
  double bytes = (double)ntensors() * o.req * o.bs;
  printf(
      "# hixl-cache-bench (hixl %s): %s -> %s, transport %s, %u layers x K,V, %u blocks of %zu B per tensor,"
      " %u blocks a request (%.1f MiB), %u iterations, medians\n",
      HixlVersionString(), o.ip, peer, transports[transport], o.layers, o.blocks, o.bs, o.req,
      bytes / 1048576.0, o.iters);
  FILE *f = o.json ? hb_json_open(o.json, "hixl-cache-bench") : NULL;
  if (f)
    fprintf(f,
            "  \"transport\": \"%s\",\n  \"layers\": %u,\n  \"blocks\": %u,\n  \"block_bytes\": %zu,\n  "
            "\"req_blocks\": %u,\n  \"iters\": %u,\n  \"results\": [\n",
            transports[transport], o.layers, o.blocks, o.bs, o.req, o.iters);
  for (int i = 0; i < 3; i++) {
    struct scen *s = &sc[i];
    size_t n = build_ops(s, ops);
    bool ok[2];
    for (int raw = 0; raw < 2; raw++) { /* once each, checked */
      prepare(s);
      run_one(s, raw, ops, n);
      ok[raw] = arrived(s);
    }
    if (!ok[0] || !ok[1])
      hb_die("%s: the bytes that arrived are wrong (cache %s, raw %s)", s->name, ok[0] ? "ok" : "WRONG",
             ok[1] ? "ok" : "WRONG");
    for (uint32_t it = 0; it < o.iters; it++) {
      for (uint32_t k = 0; k < 2; k++) /* the cache manager first in even iterations, raw in odd */
        t[(it + k) % 2][it] = run_one(s, (it + k) % 2, ops, n);
      if (o.progress) fprintf(stderr, "\r%s: %u/%u", s->name, it + 1, o.iters);
    }
    if (o.progress) fprintf(stderr, "\r%*s\r", 40, "");
    double cache_sec = bench_median_sorting(t[0], o.iters), raw_sec = bench_median_sorting(t[1], o.iters);
    double cache_gbps = bytes / cache_sec / 1e9, raw_gbps = bytes / raw_sec / 1e9;
    const struct hb_field rec[] = {HB_FS("scenario", "scenario", s->name),
                                   HB_FD("raw_gbps", "raw GB/s", "%.4f", "%.2f", raw_gbps),
                                   HB_FD("cache_gbps", "cache GB/s", "%.4f", "%.2f", cache_gbps),
                                   HB_FD("raw_ms", "raw ms", "%.4f", "%.3f", raw_sec * 1e3),
                                   HB_FD("cache_ms", "cache ms", "%.4f", "%.3f", cache_sec * 1e3),
                                   HB_FU("raw_ops", "raw ops", s->ops[1]),
                                   HB_FU("cache_ops", "cache ops", s->ops[0]),
                                   HB_FD("ratio", "ratio", "%.4f", "%.2fx", cache_gbps / raw_gbps),
                                   HB_FR("verified", NULL, "true"), /* a wrong byte ends the run */
                                   HB_FS(NULL, "verified", "yes")};
    hb_emit(stdout, f, NULL, (size_t)i, 3, rec, HB_NF(rec));
  }
  if (f) hb_json_end(f, o.json);
  HixlCacheManagerDestroy(mgr);
  HixlEngineDestroy(eng);
  return 0;
}

const struct hb_test hb_test_cache = {"cache",
                                      "hixl-cache-bench",
                                      "the cache manager's pulls and push against the raw engine's op lists",
                                      NULL,
                                      opts,
                                      setup,
                                      target,
                                      initiator};
