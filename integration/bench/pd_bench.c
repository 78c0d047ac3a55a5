/* hixl-pd-bench: the prefill-to-decode KV hand-off through the plugin (pull, and push
 * layer by layer), against the raw engine moving the same bytes as the same op lists, in
 * one run: a prefill process (child) and a decode process each dlopen the plugin twice (a
 * pull and a push connector) beside a raw HixlEngine on the same KV memory. What each
 * round measures and why: docs/performance-pd.md; the layouts: performance-layouts.md. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>

#include "harness.h"
#include "engine/engine_ext.h" /* the raw reference with landed calls: hixl_engine_transfer_then_call */
#include "hixl/hixl_kv_connector.h"

/* Under callgrind (--separate-threads=yes) each process dumps its counts at the end of
 * every phase, so a profile shows the plugin's instructions beside the raw engine's for
 * the same op lists (issue 47). Outside valgrind a mark does nothing. */
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define PD_PHASE(name) CALLGRIND_DUMP_STATS_AT(name)
#else
#define PD_PHASE(name) ((void)0)
#endif

#define MAX_ROUNDS   16
#define MAX_RUNS     (4 * MAX_ROUNDS) /* rounds of the shortest prompts */
#define PD_LAYER_OPS (1u << 16)       /* ops in one layer's list (probe_ns, raw_pusher) */
#define KV_ELEM      2                /* bytes of the data type (bf16) */
/* K (or V) bytes of one token of one layer: 8 KV heads x 128 x 2 bytes (Llama-8B) */
#define HEAD_BYTES_PER_TOKEN (8 * 128 * KV_ELEM)

enum layout { LAYOUT_KV_FIRST, LAYOUT_BLNHC, LAYOUT_CROSS };
static const char *const layout_names[] = {"kv_first", "BLNHC", "cross_layer", NULL};

static struct {
  const char *plugin, *transport, *ip, *json, *csv;
  bool pin;         /* decode on CPU 0, prefill on CPU 1, like two hosts */
  bool push;        /* measure the push too (kv_first only) */
  int obs;          /* the connectors keep histograms and traces (the plugin's default); --obs off: neither */
  int layout;       /* enum layout */
  uint64_t step_us; /* the host's step: it polls get_finished once a step */
  uint32_t layers, block_tokens, rounds;
  uint64_t block_bytes, pool_blocks; /* block_bytes: one block of K (or V) of one layer */
  size_t prompts[BENCH_MAX_LIST];
  size_t nprompts;
} o = {.plugin = HIXL_KV_PLUGIN_DEFAULT,
       .transport = "auto",
       .ip = "127.0.0.1",
       .layers = 32,
       .push = true,
       .obs = 1,
       .block_tokens = 16,
       .rounds = 3,
       .step_us = 200,
       .prompts = {256, 1024, 4096},
       .nprompts = 3};

static const hixl_kv_ops *ops;
static char line[1 << 16]; /* the last line from the other process */

/* ---- a process's side: its KV pool, its connectors (pull, push) and raw engine ---- */

struct conn {
  hixl_kv_connector *sched, *worker;
};

struct host {
  uint8_t *mem;             /* the KV pool: layers x (K, V) x pool_blocks blocks, one mapping */
  uint64_t *ids;            /* a shuffled free list (block_order): allocations come out scattered */
  const uint64_t *peer_ids; /* the other side's: which blocks it allocates (the head of it) */
  struct conn pull, push;
  HixlEngine *raw;
  char peer_raw[64]; /* the other side's raw engine */
};

/* The free list of a pool of seed: runs of 8 adjacent blocks in random order, as a busy
 * allocator hands them out. Each side knows the other's (no memory behind it). */
static uint64_t *block_order(uint64_t seed) {
  uint64_t *ids = malloc(o.pool_blocks * sizeof(*ids)), s = seed;
  if (!ids) hb_die("out of memory");
  for (uint64_t i = 0; i < o.pool_blocks; i++) ids[i] = i;
  for (uint64_t i = 0; i + 8 < o.pool_blocks; i += 8) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t j = (s >> 33) % ((o.pool_blocks - i) / 8) * 8 + i, run[8];
    memcpy(run, ids + i, sizeof(run)); /* runs i and j swap places (j may be i) */
    memmove(ids + i, ids + j, sizeof(run));
    memcpy(ids + j, run, sizeof(run));
  }
  return ids;
}

/* ---- the layout (docs/performance-layouts.md): where each plane lies in the pool ----
 * Block b of a plane is `bytes` at off + b * stride, one run (as test_plugin_layouts.c's
 * plane_of derives them); the plugin's planes and the raw op lists both come from here. */
struct plane_geo {
  uint64_t off, stride, bytes;
};

static uint32_t planes_per_layer(void) { return o.layout == LAYOUT_KV_FIRST ? 2 : 1; }

static struct plane_geo plane_geo(uint32_t l, uint32_t k) {
  uint64_t bb = o.block_bytes, all = (uint64_t)o.layers * 2 * bb;
  switch (o.layout) {
  case LAYOUT_BLNHC: return (struct plane_geo){(uint64_t)l * 2 * bb, all, 2 * bb};
  case LAYOUT_CROSS: return (struct plane_geo){0, all, all};
  default: return (struct plane_geo){((uint64_t)l * 2 + k) * o.pool_blocks * bb, bb, bb};
  }
}

static int cmp_op(const void *a, const void *b) {
  uintptr_t x = ((const HixlTransferOpDesc *)a)->local_addr, y = ((const HixlTransferOpDesc *)b)->local_addr;
  return x < y ? -1 : x > y;
}

/* The op list the plugin issues (kv_layout.c's kv_ops_build) for layers l0..l0+count-1:
 * a piece per block per plane (a cross-layer plane with its last layer), joined while
 * both sides run on, then sorted by local address and merged where both are contiguous. */
static size_t build_ops(HixlTransferOpDesc *v, uintptr_t lbase, uintptr_t rbase, const uint64_t *lb,
                        const uint64_t *rb, size_t n, uint32_t l0, uint32_t count) {
  size_t k = 0;
  for (uint32_t l = l0; l < l0 + count; l++) {
    if (o.layout == LAYOUT_CROSS && l != o.layers - 1) continue;
    for (uint32_t pk = 0; pk < planes_per_layer(); pk++) {
      struct plane_geo g = plane_geo(l, pk);
      for (size_t j = 0; j < n; j++) {
        uintptr_t lo = lbase + g.off + lb[j] * g.stride, ro = rbase + g.off + rb[j] * g.stride;
        if (k && v[k - 1].local_addr + v[k - 1].len == lo && v[k - 1].remote_addr + v[k - 1].len == ro)
          v[k - 1].len += g.bytes;
        else
          v[k++] = (HixlTransferOpDesc){lo, ro, g.bytes};
      }
    }
  }
  if (k < 2) return k;
  qsort(v, k, sizeof(*v), cmp_op);
  size_t m = 0;
  for (size_t j = 1; j < k; j++)
    if (v[m].local_addr + v[m].len == v[j].local_addr && v[m].remote_addr + v[m].len == v[j].remote_addr)
      v[m].len += v[j].len;
    else
      v[++m] = v[j];
  return m + 1;
}

/* The worker's KV cache as the one group of planes its layout is (register_kv_groups, ABI
 * 1.3, as hixl_vllm registers it; for kv_first the very group the plugin makes of
 * register_kv_caches' layers, kv_worker.c's kv_setup). The plugin copies. */
static void register_kv(hixl_kv_connector *w, const struct host *p) {
  static hixl_kv_plane pl[512];
  uint32_t ppl = planes_per_layer(), np = o.layout == LAYOUT_CROSS ? 1 : o.layers * ppl;
  const char *name = layout_names[o.layout];
  for (uint32_t i = 0; i < np; i++) {
    struct plane_geo g = plane_geo(i / ppl, i % ppl);
    pl[i] =
        (hixl_kv_plane){.base = (uintptr_t)p->mem + g.off, .block_stride = g.stride, .block_bytes = g.bytes};
  }
  hixl_kv_group g = {.size = sizeof(g),
                     .kind = HIXL_KV_GROUP_FULL_ATTENTION,
                     .flags = o.layout == LAYOUT_CROSS ? HIXL_KV_GROUP_CROSS_LAYER : 0,
                     .num_layers = o.layers,
                     .planes_per_layer = ppl,
                     .planes = pl,
                     .num_blocks = o.pool_blocks,
                     .block_tokens = o.block_tokens,
                     .elem_size = KV_ELEM,
                     .layout = name,
                     .layout_len = strlen(name)};
  if (!HIXL_KV_HAS_OP(ops, register_kv_groups))
    hb_die("register_kv_groups: the plugin is older than ABI 1.3");
  if (ops->register_kv_groups(w, &g, 1) != HIXL_KV_SUCCESS)
    hb_die("register_kv_groups: %s", ops->last_error());
}

static void conn_up(struct conn *c, uint16_t port, const char *role, const char *mode, struct host *p) {
  char cfg[512], err[256] = "";
  snprintf(cfg, sizeof(cfg),
           "{\"address\": \"%s:%u\", \"role\": \"%s\", \"mode\": \"%s\", \"lease_ms\": 60000,"
           " \"transfer_timeout_ms\": 60000, \"connect_timeout_ms\": 10000, \"Transport\": \"%s\"%s}",
           o.ip, (unsigned)port, role, mode, o.transport,
           o.obs ? "" : ", \"metrics\": false, \"trace_ring\": 0");
  for (int r = 0; r < 2; r++) /* the scheduler, then the worker */
    if (ops->create(cfg, strlen(cfg), r ? HIXL_KV_ROLE_WORKER : HIXL_KV_ROLE_SCHEDULER, 0, 1,
                    r ? &c->worker : &c->sched, err, sizeof(err)) != HIXL_KV_SUCCESS)
      hb_die("create %s %s: %s", role, mode, err);
  register_kv(c->worker, p);
}

/* Both processes start alike (pinned, the plugin loaded): the pool of seed, the pull and
 * push connectors on port and the one after, the raw engine on the next (the other side's: peer + 2). */
static void host_up(struct host *h, uint64_t seed, uint16_t port, uint16_t peer, const char *role, int cpu) {
  char addr[64];
  HixlMemHandle mh;
  if (o.pin && !bench_pin_cpu(cpu)) exit(1);
  size_t len = (size_t)o.layers * 2 * o.pool_blocks * o.block_bytes;
  if (!(h->mem = hb_map(len))) hb_die("mmap %zu bytes: %s", len, strerror(errno));
  memset(h->mem, 0x5a, len);
  h->ids = block_order(seed);
  h->peer_ids = block_order(3 - seed);
  ops = hb_plugin(o.plugin);
  conn_up(&h->pull, port, role, "pull", h);
  if (o.push) conn_up(&h->push, (uint16_t)(port + 1), role, "push", h);
  snprintf(addr, sizeof(addr), "%s:%u", o.ip, (unsigned)port + 2);
  if (!(h->raw = hb_engine(addr, o.transport, NULL, 0)) || hb_reg(h->raw, h->mem, len, &mh) != HIXL_SUCCESS)
    hb_die("the raw engine %s failed", addr);
  snprintf(h->peer_raw, sizeof(h->peer_raw), "%s:%u", o.ip, (unsigned)peer + 2);
}

static int host_down(struct host *h) {
  ops->destroy(h->pull.worker);
  ops->destroy(h->pull.sched);
  if (o.push) ops->destroy(h->push.worker), ops->destroy(h->push.sched);
  HixlEngineDestroy(h->raw);
  return 0;
}

static void step(struct conn *c) { hb_kv_step(ops, c->sched, &c->worker, 1); }

/* Step until id is finished sending (which 0) or receiving (1). Between steps the host
 * sleeps one step, or, efd >= 0 (an idle host), waits on the connector's event fd for
 * at most one step (ppoll ignores a negative fd: then it only sleeps). */
static void wait_finished(struct conn *c, const char *id, int which, int efd) {
  uint64_t end = bench_now_ns() + 120ull * 1000000000ull;
  for (step(c); !hb_kv_poll(ops, c->sched, c->worker, id, which, NULL, NULL); step(c)) {
    if (bench_now_ns() > end) hb_die("request %s did not finish within 120 s", id);
    struct timespec ts = {0, (long)o.step_us * 1000}; /* one step of the host */
    struct pollfd pf = {efd, POLLIN, 0};
    if (ppoll(&pf, 1, &ts, NULL) < 0 && errno != EINTR) hb_die("ppoll: %s", strerror(errno));
  }
}

/* A host stepping its idle connector beside a raw READ (docs/performance-pd.md: why): a
 * thread, one a process. Told to stop, it ends within a step, after the READ was timed. */
static pthread_t stepper;
static atomic_bool stepping;

static void *stepper_main(void *arg) {
  struct conn *c = arg;
  struct timespec ts = {0, (long)o.step_us * 1000};
  while (atomic_load(&stepping)) {
    step(c);
    hb_kv_poll(ops, NULL, c->worker, NULL, 0, NULL, NULL);
    nanosleep(&ts, NULL);
  }
  return NULL;
}

/* The stepping host on c, or (c NULL) off. */
static void stepper_set(struct conn *c) {
  atomic_store(&stepping, c != NULL);
  if (!c)
    pthread_join(stepper, NULL);
  else if (pthread_create(&stepper, NULL, stepper_main, c) != 0)
    hb_die("the stepping host's thread: cannot start it");
}

/* The next line from the other process, which must be want. */
static void expect(int fd, const char *want) {
  if (strcmp(hb_recv(fd, line, sizeof(line)), want) != 0) hb_die("want \"%s\", got \"%s\"", want, line);
}

static hixl_kv_request request(const char *id, uint64_t tokens, const char *params) {
  return (hixl_kv_request){id, strlen(id), tokens, params, params ? strlen(params) : 0, 0};
}

/* ---- the prefill process ---- */

/* A layer's forward pass: it runs on the accelerator, so the host CPU sleeps. */
static void compute_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  nanosleep(&ts, NULL);
}

/* Decode's raw engine serves a layer-landed call (raw_push_ns with calls) as the plugin's
 * consumer serves its notice (docs/performance-pd.md). */
static pthread_mutex_t landed_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t landed_cv = PTHREAD_COND_INITIALIZER;
static uint64_t landed;

static HixlStatus raw_landed_call(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                                  size_t cap, size_t *resp_len) {
  (void)ctx, (void)peer, (void)req, (void)resp, (void)cap;
  *resp_len = 0;
  if (len != sizeof(uint32_t)) return HIXL_PARAM_INVALID;
  pthread_mutex_lock(&landed_mu);
  landed++;
  pthread_cond_broadcast(&landed_cv);
  pthread_mutex_unlock(&landed_mu);
  return HIXL_SUCCESS;
}

/* Where prefill's raw engine writes a push's layers: the blocks decode holds for the
 * request (the same bytes as the plugin's push). */
struct dest {
  const struct host *p; /* prefill's: its raw engine writes to peer_raw */
  uintptr_t dbase;
  uint64_t nb;
};

static size_t layer_ops(HixlTransferOpDesc *v, const struct dest *d, uint32_t l) {
  return build_ops(v, (uintptr_t)d->p->mem, d->dbase, d->p->ids, d->p->peer_ids, d->nb, l, 1);
}

/* What prefill measures right before a push (docs/performance-pd.md), each the median of
 * a few samples, layers spread: a single short transfer is one noisy sample. BUSY: a
 * notice while a layer's WRITE moves (where the CPUs move the bytes, it waits for it). */
enum probe { PROBE_LAYER, PROBE_NOTICE, PROBE_BUSY };

static uint64_t probe_ns(const struct dest *d, enum probe what) {
  static HixlTransferOpDesc v[PD_LAYER_OPS];
  static const uint32_t samples[] = {5, 9, 3};
  HixlNotifyDesc note = {"pd-bench", "layer", NULL};
  uint64_t t[9];
  uint32_t n = samples[what];
  for (uint32_t j = 0; j < n; j++) {
    size_t nv = what == PROBE_NOTICE ? 0 : layer_ops(v, d, j * (o.layers - 1) / (n - 1));
    HixlTransferReq rq;
    HixlTransferStatus ts;
    if (what == PROBE_BUSY)
      hb_check(HixlEngineTransferAsync(d->p->raw, d->p->peer_raw, HIXL_WRITE, v, nv, 60000, NULL, &rq),
               "raw async WRITE of one layer");
    uint64_t t0 = bench_now_ns();
    if (what == PROBE_LAYER)
      hb_check(HixlEngineTransferSync(d->p->raw, d->p->peer_raw, HIXL_WRITE, v, nv, 60000),
               "raw WRITE of one layer");
    else
      hb_check(HixlEngineSendNotify(d->p->raw, d->p->peer_raw, &note, what == PROBE_BUSY ? 60000 : 10000),
               "raw notify");
    t[j] = bench_now_ns() - t0;
    if (what != PROBE_BUSY) continue;
    hb_check(hb_wait_xfer(d->p->raw, rq, &ts), "raw status");
    if (ts != HIXL_TRANSFER_COMPLETED) hb_die("raw async WRITE of one layer ended %d", (int)ts);
  }
  return bench_median_u64(t, n);
}

/* The raw engine's own pipelined push (docs/performance-pd.md): each layer's WRITE (with
 * calls, a then-call behind it) started by a second thread, as by the plugin's pusher (where
 * the CPUs move the bytes in the posting thread, both are busy a layer per layer); the time
 * from the last compute's end to all landed (with calls: the last answer back). */
struct raw_push {
  const struct dest *d;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint32_t saved;
  bool calls;
  uint64_t done_ns;
};

static void *raw_pusher(void *arg) {
  struct raw_push *k = arg;
  const struct dest *d = k->d;
  static HixlTransferOpDesc v[PD_LAYER_OPS];
  static HixlTransferReq rq[256];
  static hixl_call_t call[256];
  static uint8_t ans[256][16];
  static uint32_t alen[256];
  for (uint32_t l = 0; l < o.layers; l++) {
    pthread_mutex_lock(&k->mu);
    while (k->saved <= l) pthread_cond_wait(&k->cv, &k->mu);
    pthread_mutex_unlock(&k->mu);
    size_t n = layer_ops(v, d, l);
    HixlStatus st =
        k->calls
            ? hixl_engine_transfer_then_call(d->p->raw, d->p->peer_raw, HIXL_WRITE, v, n, HIXL_SERVICE_KV, &l,
                                             sizeof(l), ans[l], sizeof(ans[l]), &alen[l], 60000, &call[l])
            : HixlEngineTransferAsync(d->p->raw, d->p->peer_raw, HIXL_WRITE, v, n, 60000, NULL, &rq[l]);
    hb_check(st, "raw async WRITE of layer %u", l);
  }
  for (uint32_t l = 0; l < o.layers; l++) {
    HixlTransferStatus ts = HIXL_TRANSFER_COMPLETED;
    if (k->calls)
      hb_check(hixl_engine_call_wait(d->p->raw, d->p->peer_raw, call[l]),
               "raw WRITE of layer %u, or its landed call", l);
    else
      hb_check(hb_wait_xfer(d->p->raw, rq[l], &ts), "raw status");
    if (ts != HIXL_TRANSFER_COMPLETED) hb_die("raw async WRITE of layer %u ended %d", l, (int)ts);
  }
  k->done_ns = bench_now_ns();
  return NULL;
}

static uint64_t raw_push_ns(const struct dest *d, uint64_t compute, bool calls) {
  struct raw_push k = {d, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, calls, 0};
  pthread_t t;
  if (pthread_create(&t, NULL, raw_pusher, &k) != 0) hb_die("raw pusher thread");
  uint64_t t_last = 0;
  for (uint32_t l = 0; l < o.layers; l++) {
    compute_ns(compute);
    t_last = bench_now_ns();
    pthread_mutex_lock(&k.mu);
    k.saved = l + 1;
    pthread_cond_signal(&k.cv);
    pthread_mutex_unlock(&k.mu);
  }
  pthread_join(t, NULL);
  return k.done_ns - t_last;
}

/* The raw engine's two pushes, the one without calls first when it goes first in its
 * round (before the plugin's push), last when it goes last: ns[0] without, ns[1] with. */
static void raw_pushes(const struct dest *d, uint64_t compute, bool plain_first, uint64_t ns[2]) {
  for (int i = 0; i < 2; i++) {
    bool calls = (i == 0) != plain_first;
    ns[calls] = raw_push_ns(d, compute, calls);
    PD_PHASE(calls ? "prefill: raw push, a call per layer" : "prefill: raw push");
  }
}

static int prefill_main(void *arg, int fd) {
  uint16_t port = *(uint16_t *)arg;
  struct host p;
  host_up(&p, 1, port, (uint16_t)(port + 3), "producer", 1);
  hb_send(fd, "ready %" PRIuPTR "\n", (uintptr_t)p.mem);
  PD_PHASE("prefill: setup");
  unsigned npush = 0;
  for (;;) {
    char id[64];
    uint64_t nb = 0;
    uintptr_t dbase = 0;
    int off = 0;
    int32_t delay = 0;
    hb_recv(fd, line, sizeof(line));
    PD_PHASE("prefill: between commands (raw READs served)");
    if (strcmp(line, "quit") == 0) break;
    if (strcmp(line, "step") == 0) { /* the host steps its pull connector until "rest" */
      stepper_set(&p.pull);
      hb_send(fd, "stepping\n");
      expect(fd, "rest");
      stepper_set(NULL);
      hb_send(fd, "resting\n");
    } else if (sscanf(line, "pull %63s %" SCNu64, id, &nb) == 2) {
      hixl_kv_request r = request(id, nb * o.block_tokens, NULL);
      hixl_kv_buffer params = {0};
      if (ops->request_finished(p.pull.sched, &r, p.ids, nb, &delay, &params) != HIXL_KV_SUCCESS || !delay)
        hb_die("request_finished: %s", ops->last_error());
      step(&p.pull);
      hb_send(fd, "params %" PRIu64 " %.*s\n", bench_now_ns(), (int)params.len, (char *)params.data);
      ops->free_buffer(&params);
      wait_finished(&p.pull, id, 0, -1);
      PD_PHASE("prefill: plugin pull");
      hb_send(fd, "freed\n");
    } else if (sscanf(line, "push %63s %" SCNu64 " %" SCNuPTR " %n", id, &nb, &dbase, &off) == 3 && off > 0) {
      if (npush == 0) hb_check(HixlEngineConnect(p.raw, p.peer_raw, 10000), "raw connect to %s", p.peer_raw);
      const struct dest d = {&p, dbase, nb};
      /* Each layer's compute as long as one layer's raw WRITE: the unit pipelining cannot hide. */
      uint64_t compute = probe_ns(&d, PROBE_LAYER), rtt = probe_ns(&d, PROBE_NOTICE);
      uint64_t busy = probe_ns(&d, PROBE_BUSY), rawp[2] = {0, 0}, t_last = 0;
      PD_PHASE("prefill: raw layer, notice round trips");
      /* The raw engine's push goes before the plugin's in every other round, after it in
       * the rest, so neither gains from the other's warm-up or drift. */
      bool raw_first = npush++ % 2 == 1;
      if (raw_first) raw_pushes(&d, compute, true, rawp);
      hixl_kv_request r = request(id, nb * o.block_tokens, line + off);
      if (ops->update_state_after_alloc(p.push.sched, &r, p.ids, nb, 0) != HIXL_KV_SUCCESS)
        hb_die("update_state_after_alloc: %s", ops->last_error());
      step(&p.push);
      for (uint32_t l = 0; l < o.layers; l++) {
        compute_ns(compute);     /* the layer's "forward pass" */
        t_last = bench_now_ns(); /* before the call: the pusher it wakes may run first on this CPU */
        ops->save_kv_layer(p.push.worker, l);
      }
      ops->wait_for_save(p.push.worker);
      hixl_kv_buffer none = {0};
      ops->request_finished(p.push.sched, &r, p.ids, nb, &delay, &none);
      wait_finished(&p.push, id, 0, -1);
      PD_PHASE("prefill: plugin push");
      if (!raw_first) raw_pushes(&d, compute, false, rawp);
      hb_send(fd, "pushed %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", t_last,
              compute, rtt, busy, rawp[0], rawp[1]);
    } else {
      hb_die("prefill: unknown command \"%s\"", line);
    }
  }
  return host_down(&p);
}

/* ---- the decode process ---- */

/* The first of remote_block_ids in prefill's params. */
static uint64_t first_block(const char *params) {
  const char *p = strstr(params, "\"remote_block_ids\":[");
  uint64_t b = UINT64_MAX;
  if (!p) hb_die("params without remote_block_ids: %s", params);
  return sscanf(p + strlen("\"remote_block_ids\":["), "%" SCNu64, &b) == 1 ? b : UINT64_MAX;
}

/* Decode's scheduler: the request q matched and its nb blocks allocated. */
static void sched_alloc(struct conn *c, const hixl_kv_request *q, const uint64_t *ids, uint64_t nb,
                        const char *what) {
  int64_t tokens = 0;
  int32_t async = 0;
  if (ops->get_num_new_matched_tokens(c->sched, q, 0, &tokens, &async) != HIXL_KV_SUCCESS || tokens <= 0 ||
      ops->update_state_after_alloc(c->sched, q, ids, nb, (uint64_t)tokens) != HIXL_KV_SUCCESS)
    hb_die("%s: %s", what, ops->last_error());
}

/* Each round's samples (ns), whose medians a row reports: the pull's, then the push's. */
enum sample {
  S_PLUGIN,          /* plugin pull, host stepping */
  S_PLUGIN_FD,       /* plugin pull, host woken by the fd */
  S_RAW,             /* raw READ */
  S_RAW2,            /* raw READ again (A/A) */
  S_RAW_HOST,        /* raw READ, both hosts stepping */
  S_HANDOFF,         /* prefill finished -> decode holds it (stepping pull) */
  S_CPU_PLUGIN,      /* CPU ns of both processes over the fd-woken pull */
  S_CPU_RAW,         /* over the raw READ */
  S_CPU_RAW_HOST,    /* over the raw READ with both hosts stepping */
  S_PULL_N,          /* the pull's count */
  S_PUSH = S_PULL_N, /* last layer saved -> decode's wait for it returned */
  S_LAYER,           /* one layer's raw WRITE */
  S_RTT,             /* a notice's round trip */
  S_BUSY,            /* a notice while a layer moves */
  S_BEHIND,          /* the pusher behind at the last save */
  S_RAW_PUSH,        /* the raw engine's push, after the last layer */
  S_RAW_CALL_PUSH,   /* the same with a call per layer */
  S_N
};

struct row {
  uint64_t tokens, blocks, bytes, ops, runs, plugin_ops; /* ops: the raw engine's; plugin_ops: per request */
  uint32_t rounds;
  uint64_t med[S_N]; /* each sample's median over the rounds */
};

static double gbs(const struct row *w, enum sample s) { return (double)w->bytes / (double)w->med[s]; }
static double ms(const struct row *w, enum sample s) { return (double)w->med[s] / 1e6; }
/* CPU s per GiB, both processes */
static double cpu(const struct row *w, enum sample s) {
  return (double)w->med[s] / 1e9 / ((double)w->bytes / (double)(1u << 30));
}

/* Row i's fields, the pull's columns, then the push's (kv_first only), to stdout as a markdown
 * table, csv and json (when open; the JSON's keys are the CSV's columns). */
#define PD_PULL_FIELDS   23
#define F2(key, head, v) HB_FD(key, head, "%.4f", "%.2f", v)
#define F3(key, head, v) HB_FD(key, head, "%.4f", "%.3f", v)
static void row_out(const struct row *w, size_t i, FILE *json, FILE *csv) {
  const double l = ms(w, S_LAYER), fd = gbs(w, S_PLUGIN_FD), cp = cpu(w, S_CPU_PLUGIN);
  const struct hb_field r[] = {
      HB_FU("tokens", "prompt tokens", w->tokens),
      HB_FU("blocks", "blocks", w->blocks),
      HB_FU("bytes", NULL, w->bytes),
      HB_FD(NULL, "MiB", "%.1f", NULL, (double)w->bytes / 1048576.0),
      HB_FU("runs", "runs of adjacent blocks", w->runs),
      HB_FU("plugin_engine_ops", "plugin engine ops per request", w->plugin_ops),
      HB_FU("engine_ops", "raw engine ops", w->ops),
      HB_FU("rounds", "rounds", w->rounds),
      F2("raw_gbs", "raw engine GB/s", gbs(w, S_RAW)),
      F2("plugin_fd_gbs", "plugin pull GB/s, host woken by the fd", fd),
      F2("ratio", "ratio (goal >= 0.95)", fd / gbs(w, S_RAW)),
      HB_FD("raw2_gbs", NULL, "%.4f", NULL, gbs(w, S_RAW2)),
      F2("aa_ratio", "raw engine again / raw engine (A/A: the noise)", gbs(w, S_RAW2) / gbs(w, S_RAW)),
      F2("raw_host_gbs", "raw engine GB/s, both hosts stepping beside it", gbs(w, S_RAW_HOST)),
      F2("ratio_host", "fd-woken pull / that", fd / gbs(w, S_RAW_HOST)),
      F2("plugin_gbs", "plugin pull GB/s, host stepping", gbs(w, S_PLUGIN)),
      F2("ratio_stepping", "ratio", gbs(w, S_PLUGIN) / gbs(w, S_RAW)),
      F2("handoff_ms", "hand-off ms (pull, stepping)", ms(w, S_HANDOFF)),
      F3("cpu_s_per_gib_plugin", "CPU s/GiB, plugin pull (both processes)", cp),
      F3("cpu_s_per_gib_raw", "CPU s/GiB, raw engine", cpu(w, S_CPU_RAW)),
      F2("cpu_ratio", "CPU ratio plugin / raw", cp / cpu(w, S_CPU_RAW)),
      F3("cpu_s_per_gib_raw_host", "CPU s/GiB, raw engine, both hosts stepping", cpu(w, S_CPU_RAW_HOST)),
      F2("cpu_ratio_host", "CPU ratio plugin / that (goal <= 1.1)", cp / cpu(w, S_CPU_RAW_HOST)),
      F2("push_after_last_ms", "push: after last layer ms", ms(w, S_PUSH)),
      F2("layer_ms", "one layer ms", l),
      F2("push_ratio", "ratio (goal <= 1.25)", ms(w, S_PUSH) / l),
      F3("notice_rtt_ms", "notice round trip ms", ms(w, S_RTT)),
      F2("push_floor", "floor: (layer + notice) / layer", (l + ms(w, S_RTT)) / l),
      F3("notice_busy_ms", "notice while a layer moves ms", ms(w, S_BUSY)),
      F2("behind_ms", "pusher behind at the last save ms", ms(w, S_BEHIND)),
      F2("raw_push_ms", "raw engine push: after last layer ms", ms(w, S_RAW_PUSH)),
      F2("raw_push_ratio", "ratio", ms(w, S_RAW_PUSH) / l),
      F2("raw_call_push_ms", "raw engine push, a call per layer: after last layer ms",
         ms(w, S_RAW_CALL_PUSH)),
      F2("raw_call_push_ratio", "ratio", ms(w, S_RAW_CALL_PUSH) / l)};
  size_t nf = o.push ? HB_NF(r) : PD_PULL_FIELDS;
  if (i == 0 && csv) hb_head(csv, HB_CSV, r, nf);
  hb_emit(stdout, json, csv, i, o.nprompts, r, nf);
}

int main(int argc, char **argv) {
  static const char *const off_on[] = {"off", "on", NULL};
  uint64_t block_kib = 0;
  const struct hb_opt opts[] = {
      {"--plugin", HB_STR, &o.plugin, "PATH", "the KV-connector plugin (default: this build's)", 0, 0, NULL},
      {"--transport", HB_STR, &o.transport, "NAME", "auto (default) | tcp | shm | rdma", 0, 0, NULL},
      {"--ip", HB_STR, &o.ip, "IP", "every engine's address (default 127.0.0.1)", 0, 0, NULL},
      {"--layers", HB_U32, &o.layers, "N", "layers (default 32)", 1, 256, NULL},
      {"--block-tokens", HB_U32, &o.block_tokens, "N", "tokens a block (default 16)", 1, 1024, NULL},
      {"--block-kib", HB_U64, &block_kib, "N", "a K block's KiB (default: 2 x block tokens)", 1, 1024, NULL},
      {"--prompts", HB_SIZES, o.prompts, "T1,T2", "prompt tokens (default 256,1024,4096)", 0, 0, &o.nprompts},
      {"--layout", HB_CHOICE, &o.layout, "NAME",
       "kv_first (default), BLNHC or cross_layer (these two: the pull only)", 0, 0, layout_names},
      {"--no-push", HB_NOFLAG, &o.push, NULL, "measure the pull only", 0, 0, NULL},
      {"--rounds", HB_U32, &o.rounds, "N", "rounds of the longest prompt (default 3)", 1, MAX_ROUNDS, NULL},
      {"--step-us", HB_U64, &o.step_us, "N", "get_finished every N us (default 200)", 0, 100000, NULL},
      {"--json", HB_STR, &o.json, "FILE", "the rows as JSON", 0, 0, NULL},
      {"--csv", HB_STR, &o.csv, "FILE", "the rows as CSV (the JSON's keys as its columns)", 0, 0, NULL},
      {"--pin", HB_FLAG, &o.pin, NULL, "decode on CPU 0, prefill on CPU 1, like two hosts", 0, 0, NULL},
      {"--obs", HB_CHOICE, &o.obs, "on|off", "off: no metrics, trace_ring 0 (default on)", 0, 0, off_on},
      {NULL, 0, NULL, NULL, NULL, 0, 0, NULL}};
  hb_prog = "hixl-pd-bench";
  hb_parse(argc, argv, opts,
           "Prefill-to-decode hand-offs through the KV-connector plugin (pull, and push layer by\n"
           "layer) against the raw engine moving the same bytes as the same op lists.\n");
  o.block_bytes = block_kib ? block_kib << 10 : (uint64_t)o.block_tokens * HEAD_BYTES_PER_TOKEN;
  if (o.layout != LAYOUT_KV_FIRST) o.push = false; /* the push is measured with kv_first only */
  uint64_t maxprompt = 0;
  for (size_t i = 0; i < o.nprompts; i++) maxprompt = o.prompts[i] > maxprompt ? o.prompts[i] : maxprompt;
  o.pool_blocks = ((maxprompt + o.block_tokens - 1) / o.block_tokens + 15) / 8 * 8 + 8;
  /* A layer's op list (probe_ns, raw_pusher) holds at most PD_LAYER_OPS ops: a piece per
   * block per plane when no two blocks are adjacent. */
  if ((maxprompt + o.block_tokens - 1) / o.block_tokens * planes_per_layer() > PD_LAYER_OPS)
    hb_die("--prompts: %" PRIu64 " tokens of %u a block is more than %u blocks a layer", maxprompt,
           o.block_tokens, PD_LAYER_OPS / planes_per_layer());
  uint16_t pport = hb_ports(o.ip, 6), dport = (uint16_t)(pport + 3); /* pull, push and raw engines */
  struct hb_peer prefill;
  hb_spawn(&prefill, prefill_main, &pport);
  int fd = prefill.fd;
  uintptr_t rbase = 0;
  if (sscanf(hb_recv(fd, line, sizeof(line)), "ready %" SCNuPTR, &rbase) != 1) hb_die("prefill: %s", line);

  struct host p;
  host_up(&p, 2, dport, pport, "consumer", 0);
  hb_check(hixl_engine_set_service(p.raw, HIXL_SERVICE_KV, raw_landed_call, NULL), "raw engine service");
  int32_t pull_fd = -1;
  if (ops->get_event_fd(p.pull.worker, &pull_fd) != HIXL_KV_SUCCESS) /* ABI 1.2: register_kv checked 1.3 */
    hb_die("get_event_fd: %s", ops->last_error());
  hb_check(HixlEngineConnect(p.raw, p.peer_raw, 10000), "raw connect");
  HixlTransferOpDesc *opv = malloc((size_t)o.layers * 2 * o.pool_blocks * sizeof(*opv));
  if (!opv) hb_die("out of memory for the raw engine's op list");
  struct row rows[BENCH_MAX_LIST];
  hb_say("%u layers x (K, V), %" PRIu64 " KiB blocks of %u tokens, layout %s, transport %s%s\n", o.layers,
         o.block_bytes >> 10, o.block_tokens, layout_names[o.layout], o.transport,
         o.push ? "" : ", pull only");
  /* A round's passes, in this order in odd rounds and the reverse in even ones, so none
   * gains from another's warm-up: the raw READ, the pull with the host stepping, the pull
   * woken by the fd, the raw READ again at the round's other end (A/A: the noise), the raw
   * READ with both hosts stepping; each one's time and CPU sample (-1: none). */
  static const int pass_t[5] = {S_RAW, S_PLUGIN, S_PLUGIN_FD, S_RAW2, S_RAW_HOST},
                   pass_c[5] = {S_CPU_RAW, -1, S_CPU_PLUGIN, -1, S_CPU_RAW_HOST};
  /* The result files are made before the runs, so that a bad path fails before minutes of them. */
  FILE *f = o.json ? fopen(o.json, "w") : NULL;
  FILE *csv = o.csv ? fopen(o.csv, "w") : NULL;
  if ((o.json && !f) || (o.csv && !csv)) hb_die("%s: %s", o.json && !f ? o.json : o.csv, strerror(errno));
  unsigned req = 0;
  for (size_t pi = 0; pi < o.nprompts; pi++) {
    struct row *w = &rows[pi];
    uint64_t nb = (o.prompts[pi] + o.block_tokens - 1) / o.block_tokens, t[S_N][MAX_RUNS];
    *w = (struct row){.tokens = o.prompts[pi], .blocks = nb, .bytes = nb * o.block_bytes * 2 * o.layers};
    /* Short prompts' fixed costs swing more from round to round: more rounds, at most 4x. */
    uint64_t scaled = (uint64_t)o.rounds * maxprompt / o.prompts[pi]; /* >= rounds */
    w->rounds = (uint32_t)(scaled > 4ull * o.rounds ? 4ull * o.rounds : scaled);
    /* The raw engine READs the same op list as the plugin's pulls. */
    w->ops = build_ops(opv, (uintptr_t)p.mem, rbase, p.ids, p.peer_ids, nb, 0, o.layers);
    w->runs = nb ? 1 : 0; /* runs of blocks adjacent on both sides: what one op moves per plane at most */
    for (size_t j = 1; j < nb; j++)
      w->runs += p.ids[j] != p.ids[j - 1] + 1 || p.peer_ids[j] != p.peer_ids[j - 1] + 1;
    for (uint32_t r = 0; r < w->rounds; r++) {
      char id[64], did[64];
      fprintf(stderr, "\r  prompt %" PRIu64 " tokens: round %u/%u ", w->tokens, r + 1, w->rounds);
      for (int k = 0; k < 5; k++) {
        int pass = r % 2 ? k : 4 - k;
        bool plug = pass == 1 || pass == 2;
        uint64_t t_fin = 0;
        hixl_kv_stats s0, s1;
        PD_PHASE("decode: between");
        if (pass == 4) {
          hb_send(fd, "step\n");
          expect(fd, "stepping");
          stepper_set(&p.pull);
        }
        if (plug) { /* prefill finishes a request; decode matches it and allocates */
          snprintf(id, sizeof(id), "p%u", req);
          snprintf(did, sizeof(did), "d%u", req++);
          hb_send(fd, "pull %s %" PRIu64 "\n", id, nb);
          int off = 0;
          if (sscanf(hb_recv(fd, line, sizeof(line)), "params %" SCNu64 " %n", &t_fin, &off) != 1 || !off)
            hb_die("prefill: %s", line);
          const char *params = line + off; /* used before the next hb_recv overwrites line */
          if (first_block(params) != p.peer_ids[0]) hb_die("prefill allocated other blocks: %s", params);
          hixl_kv_request q = request(did, nb * o.block_tokens, params);
          sched_alloc(&p.pull, &q, p.ids, nb, "decode scheduler");
          if (ops->get_stats(p.pull.worker, &s0) != HIXL_KV_SUCCESS)
            hb_die("get_stats: %s", ops->last_error());
        }
        uint64_t c0 = hb_cpu_ns(0) + hb_cpu_ns(prefill.pid), t0 = bench_now_ns();
        if (plug)
          wait_finished(&p.pull, did, 1, pass == 2 ? pull_fd : -1);
        else
          hb_check(HixlEngineTransferSync(p.raw, p.peer_raw, HIXL_READ, opv, w->ops, 60000), "raw READ%s",
                   pass == 4 ? ", hosts stepping" : "");
        uint64_t t1 = bench_now_ns();
        t[pass_t[pass]][r] = t1 - t0;
        if (pass_c[pass] >= 0) t[pass_c[pass]][r] = hb_cpu_ns(0) + hb_cpu_ns(prefill.pid) - c0;
        if (pass == 4) {
          stepper_set(NULL);
          hb_send(fd, "rest\n");
          expect(fd, "resting");
        }
        if (!plug) {
          PD_PHASE(pass == 4 ? "decode: raw READ, hosts stepping" : "decode: raw READ");
          continue;
        }
        if (ops->get_stats(p.pull.worker, &s1) != HIXL_KV_SUCCESS) hb_die("get_stats: %s", ops->last_error());
        if (s1.loads_done != s0.loads_done + 1)
          hb_die("request %s: %" PRIu64 " loads done, not 1", did, s1.loads_done - s0.loads_done);
        uint64_t pops = s1.engine_ops - s0.engine_ops; /* the engine ops of this one request */
        if (pops != w->ops && !w->plugin_ops)
          fprintf(stderr,
                  "\nhixl-pd-bench: %s, %" PRIu64 " tokens: the plugin issued %" PRIu64
                  " engine ops, the raw engine's mirror of its op list has %" PRIu64 "\n",
                  layout_names[o.layout], w->tokens, pops, w->ops);
        if (pops > w->plugin_ops) w->plugin_ops = pops;
        if (pass == 1) t[S_HANDOFF][r] = t1 - t_fin;
        hb_recv(fd, line, sizeof(line)); /* freed */
        PD_PHASE(pass == 2 ? "decode: plugin pull, host woken by the fd"
                           : "decode: plugin pull, host stepping");
      }
      if (!o.push) continue;
      /* Push, layer by layer (prefill's compute per layer: its probe_ns right before). */
      snprintf(id, sizeof(id), "p%u", req);
      snprintf(did, sizeof(did), "d%u", req++);
      PD_PHASE("decode: between");
      hixl_kv_request q = request(did, nb * o.block_tokens, "{\"do_remote_prefill\": true}");
      hixl_kv_buffer pp = {0};
      sched_alloc(&p.push, &q, p.ids, nb, "decode scheduler (push)");
      if (ops->get_push_params(p.push.sched, did, strlen(did), &pp) != HIXL_KV_SUCCESS)
        hb_die("decode scheduler (push): %s", ops->last_error());
      step(&p.push);
      hb_send(fd, "push %s %" PRIu64 " %" PRIuPTR " %.*s\n", id, nb, (uintptr_t)p.mem, (int)pp.len,
              (char *)pp.data);
      ops->free_buffer(&pp);
      /* The forward pass of this step: each layer waited for before it is used. */
      uint64_t t_prev = 0; /* when decode held the layer before the last */
      for (uint32_t l = 0; l < o.layers; l++) {
        if (ops->wait_for_layer_load(p.push.worker, l) != HIXL_KV_SUCCESS)
          hb_die("wait_for_layer_load %u: %s", l, ops->last_error());
        if (l + 2 == o.layers) t_prev = bench_now_ns();
      }
      uint64_t t_done = bench_now_ns(), t_last = 0;
      PD_PHASE("decode: plugin push, to the last layer held");
      wait_finished(&p.push, did, 1, -1); /* then the host learns it finished (and checks it did) */
      if (sscanf(hb_recv(fd, line, sizeof(line)),
                 "pushed %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64, &t_last,
                 &t[S_LAYER][r], &t[S_RTT][r], &t[S_BUSY][r], &t[S_RAW_PUSH][r], &t[S_RAW_CALL_PUSH][r]) != 6)
        hb_die("prefill: %s", line);
      PD_PHASE("decode: push reported, the raw pushes received");
      /* How far the pusher was behind at the last save: the layer before it on its way. */
      t[S_BEHIND][r] = t_prev > t_last ? t_prev - t_last : 0;
      HixlNotifyDesc *nv = NULL;
      size_t nn = 0;
      if (HixlEngineGetNotifies(p.raw, &nv, &nn) != HIXL_SUCCESS || nn != 12)
        hb_die("raw engine: %zu of prefill's 12 notices arrived: %s", nn, HixlGetLastErrorMessage());
      HixlEngineFreeNotifies(nv);
      if (t_done < t_last)
        hb_die("push %s: wait_for_layer_load returned before the last layer was saved", did);
      t[S_PUSH][r] = t_done - t_last;
    }
    for (int s = 0; s < (o.push ? S_N : S_PULL_N); s++) w->med[s] = bench_median_u64(t[s], w->rounds);
  }
  fprintf(stderr, "\r%60s\r", "");
  hb_send(fd, "quit\n");
  int rc = hb_reap(&prefill, 60);
  if (rc != 0) hb_say("the prefill process ended with %d\n", rc);

  if (f)
    fprintf(f,
            "{\"transport\": \"%s\", \"layout\": \"%s\", \"layers\": %u, \"block_tokens\": %u"
            ", \"block_bytes\": %" PRIu64 ", \"rounds\": %u, \"step_us\": %" PRIu64
            ", \"push\": %s, \"obs\": %s, \"rows\": [\n",
            o.transport, layout_names[o.layout], o.layers, o.block_tokens, o.block_bytes, o.rounds, o.step_us,
            o.push ? "true" : "false", o.obs ? "true" : "false");
  for (size_t i = 0; i < o.nprompts; i++) row_out(&rows[i], i, f, csv);
  if (f && !hb_json_end(f, o.json)) rc = 1;
  if (csv && fclose(csv) != 0) {
    hb_say("--csv %s: %s\n", o.csv, strerror(errno));
    rc = 1;
  }
  return host_down(&p) || rc != 0;
}
