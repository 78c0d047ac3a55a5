/* hixl-tp-bench: the prefill-to-decode hand-off between instances of different
 * tensor-parallel sizes through the KV-connector plugin (dlopened), against the raw
 * engine moving the same byte ranges (issue 29). Per pair (P, D) one process holds P
 * producer and D consumer ranks (each a worker connector with its own engine and KV
 * memory of its heads) and raw engines on the same memory. The method:
 * docs/performance-tp.md. Every consumer byte is checked after every run. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/param.h>

#include "harness.h"
#include "hixl/hixl_kv_connector.h"

#define MAX_TP     8
#define MAX_ROUNDS 256

static struct {
  const char *plugin, *ip, *transport, *json;
  uint32_t layers, heads, head_dim, block_tokens, prompt, requests, rounds, per_producer;
  int shared; /* every thread on every CPU (--cpus shared) */
  bool mla;
  const char *pairs;
} o = {.plugin = HIXL_KV_PLUGIN_DEFAULT,
       .ip = "127.0.0.1",
       .transport = "tcp",
       .layers = 8,
       .heads = 8,
       .head_dim = 128,
       .block_tokens = 16,
       .prompt = 1024,
       .requests = 8,
       .rounds = 3,
       .per_producer = 1,
       .pairs = "1,2 2,1 2,4 4,2 1,4 4,1 2,2"};

static const hixl_kv_ops *ops;
static FILE *json;

/* --cpus split (the default with 2 CPUs or more): the producer ranks' threads on the first
 * half of this process's CPUs, the consumer ranks' and the host's loop on the rest, as on
 * two hosts; shared measured the kernel's wake-affine placement (docs/performance-tp.md). */
static cpu_set_t cpus_all;
static int ncpus_all;

static bool cpus_split(void) { return !o.shared && ncpus_all >= 2; }

static void cpus_side(bool consumer) {
  if (!cpus_split()) return;
  cpu_set_t s;
  CPU_ZERO(&s);
  for (int c = 0, k = 0; c < CPU_SETSIZE && k < ncpus_all; c++)
    if (CPU_ISSET(c, &cpus_all)) {
      if ((k >= ncpus_all / 2) == consumer) CPU_SET(c, &s);
      k++;
    }
  int rc = pthread_setaffinity_np(pthread_self(), sizeof(s), &s);
  if (rc) fprintf(stderr, "hixl-tp-bench: cannot keep the sides' threads apart: %s\n", strerror(rc));
}

/* ---- the model ---- */

static uint64_t head_bytes(void) { return (uint64_t)o.block_tokens * 2 * o.head_dim * 2; } /* (N, 2D) bf16 */
static uint64_t latent_bytes(void) { return (uint64_t)o.block_tokens * 576 * 2; }
static uint32_t nblocks_req(void) { return (o.prompt + o.block_tokens - 1) / o.block_tokens; }
static uint32_t nb(void) { return nblocks_req() * o.requests + 1; } /* every rank's blocks; 0 unused */

struct rank {
  HixlEngine *raw;
  char raw_addr[64];
  uint8_t *mem;
  uint64_t layer_bytes, block, len; /* len: mem's */
  uint32_t nheads, first;
};

struct side {
  uint32_t world;
  hixl_kv_connector *sched, *w[MAX_TP]; /* w[i]: rank i's worker */
  struct rank r[MAX_TP];
};

/* The producer's or the consumer's ranks, made on its CPUs: this thread's, and those of the engines
 * it makes; it keeps the consumer's after, for the host's loop and the raw threads. */
static void side_up(struct side *s, uint32_t world, bool consumer) {
  cpus_side(consumer);
  memset(s, 0, sizeof(*s));
  s->world = world;
  uint16_t port = hb_ports(o.ip, 2 * world), rport = (uint16_t)(port + world);
  char cfg[512], err[256] = "";
  snprintf(cfg, sizeof(cfg),
           "{\"address\": \"%s:%u\", \"role\": \"%s\", \"lease_ms\": 60000, \"transfer_timeout_ms\": 60000,"
           " \"connect_timeout_ms\": 10000, \"loads_per_producer\": %u, \"Transport\": \"%s\"}",
           o.ip, (unsigned)port, consumer ? "consumer" : "producer", o.per_producer, o.transport);
  if (ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, world, &s->sched, err, sizeof(err)))
    hb_die("create scheduler: %s", err);
  for (uint32_t i = 0; i < world; i++) {
    struct rank *k = &s->r[i];
    if (ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, i, world, &s->w[i], err, sizeof(err)))
      hb_die("create worker %u: %s", i, err);
    k->nheads = world <= o.heads ? o.heads / world : 1; /* its heads: first .. first + nheads - 1 */
    k->first = world <= o.heads ? i * k->nheads : i / (world / o.heads);
    k->block = o.mla ? latent_bytes() : k->nheads * head_bytes();
    k->layer_bytes = (uint64_t)nb() * k->block;
    k->len = (o.layers * k->layer_bytes + 4095) / 4096 * 4096;
    if (!(k->mem = hb_map(k->len))) exit(1);
    hixl_kv_plane pl[64];
    for (uint32_t l = 0; l < o.layers; l++)
      pl[l] = (hixl_kv_plane){.base = (uintptr_t)(k->mem + l * k->layer_bytes),
                              .block_stride = k->block,
                              .block_bytes = k->block,
                              .head_stride = o.mla ? 0 : head_bytes(),
                              .num_heads = o.mla ? 0 : k->nheads};
    hixl_kv_group g = {.size = sizeof(g),
                       .kind = o.mla ? HIXL_KV_GROUP_MLA : HIXL_KV_GROUP_FULL_ATTENTION,
                       .num_layers = o.layers,
                       .planes_per_layer = 1,
                       .planes = pl,
                       .num_blocks = nb(),
                       .block_tokens = o.block_tokens,
                       .elem_size = 2,
                       .layout = o.mla ? "mla" : "packed",
                       .layout_len = o.mla ? 3 : 6,
                       .total_kv_heads = o.mla ? 0 : o.heads};
    if (ops->register_kv_groups(s->w[i], &g, 1)) hb_die("register_kv_groups: %s", ops->last_error());
    HixlMemHandle h;
    snprintf(k->raw_addr, sizeof(k->raw_addr), "%s:%u", o.ip, (unsigned)(rport + i));
    if (!(k->raw = hb_engine(k->raw_addr, o.transport, NULL, 0)) || hb_reg(k->raw, k->mem, k->len, &h))
      hb_die("the raw engine %s failed", k->raw_addr);
  }
}

static void side_down(struct side *s) {
  for (uint32_t i = 0; i < s->world; i++) {
    ops->destroy(s->w[i]);
    HixlEngineDestroy(s->r[i].raw);
    munmap(s->r[i].mem, s->r[i].len);
  }
  ops->destroy(s->sched);
}

/* Steps s until every rank reported each of the n requests (sending or receiving). */
static void wait_all(struct side *s, uint32_t n, bool recving) {
  uint64_t want = (uint64_t)n * s->world, got = 0, deadline = bench_now_ns() + 120000000000ull;
  int32_t fd = -1; /* none (a plugin older than ABI 1.2): poll only waits its 1 ms */
  if (HIXL_KV_HAS_OP(ops, get_event_fd)) ops->get_event_fd(s->w[0], &fd);
  for (;;) {
    hb_kv_step(ops, s->sched, s->w, s->world);
    for (uint32_t i = 0; i < s->world; i++) {
      size_t sent = 0, recvd = 0;
      hb_kv_poll(ops, NULL, s->w[i], NULL, 0, &sent, &recvd);
      got += recving ? recvd : sent;
    }
    if (bench_now_ns() > deadline) hb_die("%" PRIu64 " of %" PRIu64 " reports in 120 s", got, want);
    if (got >= want) return;
    poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, 1);
  }
}

/* Request q's blocks: producer q * n + 1 .., consumer (requests - 1 - q) * n + 1 .. */
static uint64_t pblock(uint32_t q, uint32_t j) { return (uint64_t)q * nblocks_req() + j + 1; }
static uint64_t cblock(uint32_t q, uint32_t j) { return pblock(o.requests - 1 - q, j); }

/* ---- the plugin's pull ---- */

static uint64_t plugin_run(struct side *p, struct side *d, uint32_t round) {
  uint32_t n = nblocks_req(); /* at most 65536 / 16 */
  uint64_t pb[4096], cb[4096];
  char *params[256], id[256][24]; /* --requests: at most 256 */
  for (uint32_t q = 0; q < o.requests; q++) {
    for (uint32_t j = 0; j < n; j++) pb[j] = pblock(q, j);
    snprintf(id[q], sizeof(id[q]), "r%u-%u", round, q);
    hixl_kv_request r = {id[q], strlen(id[q]), o.prompt, NULL, 0, 0};
    int32_t delay = 0;
    hixl_kv_buffer b = {0};
    if (ops->request_finished(p->sched, &r, pb, n, &delay, &b) || !delay) hb_die("request_finished");
    params[q] = strndup((char *)b.data, b.len);
    ops->free_buffer(&b);
    if (!params[q]) hb_die("out of memory for request %u's parameters", q);
  }
  hb_kv_step(ops, p->sched, p->w, p->world);
  uint64_t t0 = bench_now_ns();
  for (uint32_t q = 0; q < o.requests; q++) {
    for (uint32_t j = 0; j < n; j++) cb[j] = cblock(q, j);
    hixl_kv_request r = {id[q], strlen(id[q]), o.prompt, params[q], strlen(params[q]), 0};
    int64_t tokens = -1;
    int32_t async = 0;
    if (ops->get_num_new_matched_tokens(d->sched, &r, 0, &tokens, &async) ||
        ops->update_state_after_alloc(d->sched, &r, cb, n, (uint64_t)tokens))
      hb_die("consumer scheduler: %s", ops->last_error());
  }
  wait_all(d, o.requests, true);
  uint64_t ns = bench_now_ns() - t0;
  wait_all(p, o.requests, false);
  for (uint32_t q = 0; q < o.requests; q++) free(params[q]);
  return ns;
}

/* ---- the same pieces by the raw engine ---- */

struct raw_job {
  HixlEngine *e;
  const char *remote;
  HixlTransferOpDesc *v;
  size_t *starts;        /* request q's ops: [starts[q], starts[q + 1]) */
  _Atomic uint32_t next; /* the next request a thread of this job takes */
};

/* The pieces consumer rank d reads of producer rank p into out: per request, block and
 * layer, its heads' run (MLA: the latent) when p is the rank it reads them from; 0 when
 * it reads none there (out untouched). With as many ranks on both sides, rank d's heads
 * are rank p = d's alone. */
static size_t pieces(const struct side *ps, const struct side *ds, uint32_t p, uint32_t d,
                     struct raw_job *out) {
  const struct rank *pr = &ps->r[p], *dr = &ds->r[d];
  uint32_t np = ps->world;
  uint64_t off_p = 0, off_d = 0, len = pr->block;
  if (o.mla) {
    if (p != d % np) return 0;
  } else {
    uint32_t lo = MAX(pr->first, dr->first), hi = MIN(pr->first + pr->nheads, dr->first + dr->nheads);
    if (lo >= hi) return 0;
    if (np > o.heads && p != pr->first * (np / o.heads) + d % (np / o.heads)) return 0;
    off_p = (lo - pr->first) * head_bytes();
    off_d = (lo - dr->first) * head_bytes();
    len = (hi - lo) * head_bytes();
  }
  size_t n = (size_t)o.requests * nblocks_req() * o.layers, k = 0,
         *starts = calloc(o.requests + 1, sizeof(*starts));
  HixlTransferOpDesc *v = malloc(n * sizeof(*v));
  if (!starts || !v) hb_die("out of memory for %zu ops", n);
  for (uint32_t q = 0; q < o.requests; q++) {
    starts[q] = k; /* request q's ops start here (never merged with the one before) */
    for (uint32_t l = 0; l < o.layers; l++)
      for (uint32_t j = 0; j < nblocks_req(); j++) {
        uintptr_t lo = (uintptr_t)dr->mem + l * dr->layer_bytes + cblock(q, j) * dr->block + off_d;
        uintptr_t ro = (uintptr_t)pr->mem + l * pr->layer_bytes + pblock(q, j) * pr->block + off_p;
        if (k > starts[q] && v[k - 1].local_addr + v[k - 1].len == lo &&
            v[k - 1].remote_addr + v[k - 1].len == ro)
          v[k - 1].len += len; /* adjacent on both sides: one op, as the plugin merges */
        else
          v[k++] = (HixlTransferOpDesc){.local_addr = lo, .remote_addr = ro, .len = len};
      }
  }
  starts[o.requests] = k;
  *out = (struct raw_job){.e = dr->raw, .remote = pr->raw_addr, .v = v, .starts = starts};
  atomic_init(&out->next, 0);
  return k;
}

/* One of a consumer rank's threads reading one producer rank: the job's requests in
 * turn, one after another as the plugin's loader threads take them (a hand-off is a
 * request), each in engine-sized batches. */
static void *raw_main(void *arg) {
  struct raw_job *j = arg;
  for (uint32_t q; (q = atomic_fetch_add(&j->next, 1)) < o.requests;)
    for (size_t i = j->starts[q]; i < j->starts[q + 1]; i += HIXL_MAX_BATCH) {
      size_t k = MIN(j->starts[q + 1] - i, (size_t)HIXL_MAX_BATCH);
      hb_check(HixlEngineTransferSync(j->e, j->remote, HIXL_READ, j->v + i, k, 60000), "raw READ");
    }
  return NULL;
}

static uint64_t raw_run(struct side *p, struct side *d, uint64_t *ops_out) {
  struct raw_job jobs[MAX_TP * MAX_TP];
  pthread_t th[MAX_TP * MAX_TP * 8];
  size_t nj = 0;
  *ops_out = 0;
  for (uint32_t di = 0; di < d->world; di++)
    for (uint32_t pi = 0; pi < p->world; pi++) {
      size_t n = pieces(p, d, pi, di, &jobs[nj]);
      if (!n) continue;
      HixlStatus st = HixlEngineConnect(d->r[di].raw, p->r[pi].raw_addr, 10000);
      hb_check(st == HIXL_ALREADY_CONNECTED ? HIXL_SUCCESS : st, "raw connect");
      *ops_out += n;
      nj++;
    }
  uint64_t t0 = bench_now_ns();
  size_t nt = 0;
  for (size_t i = 0; i < nj; i++)
    for (uint32_t w = 0; w < o.per_producer && w < o.requests; w++)
      if ((errno = pthread_create(&th[nt++], NULL, raw_main, &jobs[i])) != 0) /* fewer: a slower reference */
        hb_die("raw reference: pthread_create: %s", strerror(errno));
  for (size_t i = 0; i < nt; i++) pthread_join(th[i], NULL);
  uint64_t ns = bench_now_ns() - t0;
  for (size_t i = 0; i < nj; i++) free(jobs[i].v), free(jobs[i].starts);
  return ns;
}

/* ---- data ---- */

/* Byte in of block b of layer l of rank k: head h's bytes are the same on every rank
 * that holds it. */
static uint8_t pattern(uint32_t seed, const struct rank *k, uint64_t l, uint64_t b, uint64_t in) {
  uint64_t h = o.mla ? 0 : k->first + in / head_bytes(), z = o.mla ? in : in % head_bytes();
  return (uint8_t)(seed * 31 + l * 7 + b * 13 + h * 101 + z * 3);
}

static void fill(struct side *p, uint32_t seed) {
  for (uint32_t i = 0; i < p->world; i++) {
    struct rank *k = &p->r[i];
    for (uint64_t y = 0; y < o.layers * k->layer_bytes; y++)
      k->mem[y] = pattern(seed, k, y / k->layer_bytes, (y % k->layer_bytes) / k->block, y % k->block);
  }
}

/* Every consumer rank's request blocks hold its heads as the producer has them. */
static bool check(struct side *d, uint32_t seed) {
  for (uint32_t di = 0; di < d->world; di++) {
    const struct rank *k = &d->r[di];
    for (uint32_t q = 0; q < o.requests; q++)
      for (uint32_t l = 0; l < o.layers; l++)
        for (uint32_t j = 0; j < nblocks_req(); j++) {
          const uint8_t *got = k->mem + l * k->layer_bytes + cblock(q, j) * k->block;
          for (uint64_t in = 0; in < k->block; in++) {
            uint8_t want = pattern(seed, k, l, pblock(q, j), in);
            if (got[in] != want) {
              fprintf(stderr, "rank %u request %u layer %u block %u byte %" PRIu64 ": 0x%02x, want 0x%02x\n",
                      di, q, l, j, in, got[in], want);
              return false;
            }
          }
        }
  }
  return true;
}

static void pair_run(uint32_t np, uint32_t nd) {
  struct side p, d;
  side_up(&p, np, false);
  side_up(&d, nd, true);
  fill(&p, np * 10 + nd);
  uint64_t pns[MAX_ROUNDS], rns[MAX_ROUNDS], rops = 0, ops0 = 0, bytes0 = 0, held = 0, need = 0;
  double aa[MAX_ROUNDS], ratio[MAX_ROUNDS];
  uint32_t nr = o.rounds; /* at most MAX_ROUNDS (its option's bound) */
  /* A warm-up round (links made, pages touched), not counted; then each round runs the
   * plugin once and the raw engine twice, the plugin's place in turn (performance-tp.md). */
  for (uint32_t r = 0; r <= nr; r++) {
    uint32_t k = r ? r - 1 : 0;
    fprintf(stderr, "  TP %u -> %u: %s %u of %u\r", np, nd, r ? "round" : "warm-up", k + 1, r ? nr : 1);
    uint64_t pn = 0, raw[2] = {0, 0};
    for (uint32_t part = 0, nraw = 0; part < 3; part++) {
      bool plug = part == k % 3;
      for (uint32_t i = 0; i < nd; i++) memset(d.r[i].mem, 0, o.layers * d.r[i].layer_bytes);
      if (plug)
        pn = plugin_run(&p, &d, r);
      else
        raw[nraw++] = raw_run(&p, &d, &rops);
      if (!check(&d, np * 10 + nd))
        hb_die("TP %u -> %u: %s", np, nd,
               plug ? "the consumer's blocks differ from the producer's"
                    : "the raw reference moved other bytes");
    }
    pns[k] = pn;
    rns[k] = (raw[0] + raw[1]) / 2;
    aa[k] = (double)raw[1] / (double)raw[0]; /* the raw engine against itself */
    ratio[k] = (double)rns[k] / (double)pn;
  }
  fprintf(stderr, "%60s\r", "");
  for (uint32_t i = 0; i < nd; i++) {
    hixl_kv_stats_ex s = {.size = sizeof(s)};
    ops->get_stats_ex(d.w[i], &s);
    ops0 += s.engine_ops;
    bytes0 += s.bytes_loaded;
    need += (uint64_t)o.layers * nblocks_req() * d.r[i].block;
  }
  for (uint32_t i = 0; i < np; i++) {
    hixl_kv_stats_ex s = {.size = sizeof(s)};
    ops->get_stats_ex(p.w[i], &s);
    held += s.blocks_held;
  }
  /* The plugin took each place in a round in turn: its ratio is the geometric mean of the
   * three places' medians, so that a slow place counts once, not as a majority. */
  double rat_lo, rat_hi, by_place[3] = {0, 0, 0};
  double rat = bench_places_median(ratio, nr, 3, 2000, &rat_lo, &rat_hi, by_place);
  qsort(aa, nr, sizeof(*aa), bench_cmp_double);
  uint64_t pm = bench_median_u64(pns, nr), rm = bench_median_u64(rns, nr), total = need * o.requests;
  double pg = (double)total / (double)pm, rg = (double)total / (double)rm;
  double preq = (double)ops0 / ((double)o.requests * (nr + 1)), rreq = (double)rops / o.requests;
  double moved = (double)bytes0 / ((double)o.requests * (nr + 1));
  double aa_lo, aa_hi, aam = bench_median_ci(aa, nr, &aa_lo, &aa_hi); /* median, its 95% interval */
  printf(
      "| %u -> %u | %s | %.2f | %.2f | %.2fx (%.2f-%.2f) | %.2fx (%.2f-%.2f; %.2f-%.2f) | %.0f | %.0f | %.0f "
      "| %" PRIu64 " | %" PRIu64 " |\n",
      np, nd, o.mla ? "MLA" : "GQA", pg, rg, rat, rat_lo, rat_hi, aam, aa_lo, aa_hi, aa[0], aa[nr - 1], preq,
      rreq, moved, need, held);
  if (json) {
    fprintf(json,
            "{\"prefill_tp\": %u, \"decode_tp\": %u, \"model\": \"%s\", \"kv_heads\": %u, \"layers\": %u, "
            "\"prompt\": %u, \"requests\": %u, \"rounds\": %u, \"per_producer\": %u, \"transport\": \"%s\", "
            "\"cpus\": \"%s\", \"plugin_gbps\": %.3f, \"raw_gbps\": %.3f, \"ratio\": %.3f, "
            "\"ratio_ci95\": [%.3f, %.3f], \"ratio_by_place\": [%.3f, %.3f, %.3f], \"ratio_rounds\": [",
            np, nd, o.mla ? "mla" : "gqa", o.heads, o.layers, o.prompt, o.requests, nr, o.per_producer,
            o.transport, cpus_split() ? "split" : "shared", pg, rg, rat, rat_lo, rat_hi, by_place[0],
            by_place[1], by_place[2]);
    for (uint32_t i = 0; i < nr; i++) fprintf(json, "%s%.3f", i ? "," : "", ratio[i]);
    fprintf(json,
            "], \"raw_aa_median\": %.3f, \"raw_aa_ci95\": [%.3f, %.3f], \"raw_aa_lo\": %.3f, "
            "\"raw_aa_hi\": %.3f, \"plugin_ops_per_request\": %.1f, \"raw_ops_per_request\": %.1f, "
            "\"bytes_moved_per_request\": %.0f, \"bytes_needed_per_request\": %" PRIu64
            ", \"prefill_blocks_held\": %" PRIu64 "}\n",
            aam, aa_lo, aa_hi, aa[0], aa[nr - 1], preq, rreq, moved, need, held);
  }
  fflush(stdout);
  side_down(&d);
  side_down(&p);
}

int main(int argc, char **argv) {
  static const char *const cpus_names[] = {"split", "shared", NULL};
  const struct hb_opt opts[] = {
      {"--pairs", HB_STR, &o.pairs, "\"P,D ...\"", "TP sizes (default: pairs of 1, 2, 4)", 0, 0, NULL},
      {"--mla", HB_FLAG, &o.mla, NULL, "an MLA model (one 576 x 2 B latent) instead of GQA", 0, 0, NULL},
      {"--kv-heads", HB_U32, &o.heads, "N", "GQA KV heads (default 8)", 1, 64, NULL},
      {"--layers", HB_U32, &o.layers, "N", "layers (default 8)", 1, 64, NULL},
      {"--prompt", HB_U32, &o.prompt, "TOKENS", "tokens a request (default 1024)", 16, 65536, NULL},
      {"--requests", HB_U32, &o.requests, "N", "requests a batch (default 8)", 1, 256, NULL},
      {"--rounds", HB_U32, &o.rounds, "N", "measured rounds (default 3)", 1, MAX_ROUNDS, NULL},
      {"--per-producer", HB_U32, &o.per_producer, "N", "loads_per_producer (default 1)", 1, 8, NULL},
      {"--transport", HB_STR, &o.transport, "NAME", "tcp (default) | auto", 0, 0, NULL},
      {"--ip", HB_STR, &o.ip, "IP", "every engine's address (default 127.0.0.1)", 0, 0, NULL},
      {"--plugin", HB_STR, &o.plugin, "PATH", "the KV-connector plugin (default: this build's)", 0, 0, NULL},
      {"--json", HB_STR, &o.json, "FILE", "append a JSON line per pair", 0, 0, NULL},
      {"--cpus", HB_CHOICE, &o.shared, "split|shared", "split: the sides apart (default)", 0, 0, cpus_names},
      {NULL, 0, NULL, NULL, NULL, 0, 0, NULL}};
  hb_prog = "hixl-tp-bench";
  hb_parse(argc, argv, opts, NULL);
  /* Every pair read before the first runs: a typo at the end costs no run. */
  uint32_t pairs[64][2], npairs = 0;
  char *end;
  for (const char *s = o.pairs; *s; s = end + strspn(end, " ")) {
    unsigned long a = strtoul(s, &end, 10), b = 0;
    if (*end != ',') hb_die("--pairs: \"%s\" is not P,D", s);
    b = strtoul(end + 1, &end, 10);
    if (!a || !b || a > MAX_TP || b > MAX_TP) hb_die("--pairs: sizes 1 to %d", MAX_TP);
    if (npairs == 64) hb_die("--pairs: at most 64 pairs");
    pairs[npairs][0] = (uint32_t)a;
    pairs[npairs++][1] = (uint32_t)b;
  }
  char key[256] = "";
  if (!getenv("HIXL_AUTH_KEY_FILE")) { /* both sides of this run share one key, as a deployment does */
    if (bench_key_file(key, sizeof(key), "hixl-tp-bench") != 0) return 1;
    setenv("HIXL_AUTH_KEY_FILE", key, 1);
  }
  ops = hb_plugin(o.plugin);
  if (o.json && !(json = fopen(o.json, "a"))) hb_die("%s: %s", o.json, strerror(errno));
  if (sched_getaffinity(0, sizeof(cpus_all), &cpus_all) == 0) ncpus_all = CPU_COUNT(&cpus_all);
  printf("hixl-tp-bench: %s, %u layers, %u KV heads x %u x 2 B, %u-token blocks, %u requests of %u tokens, "
         "%u rounds (median), transport %s, HND (packed) layout, loads_per_producer %u (raw: as many threads "
         "per producer rank), ",
         o.mla ? "MLA (576 x 2 B latent)" : "GQA", o.layers, o.heads, o.head_dim, o.block_tokens, o.requests,
         o.prompt, o.rounds, o.transport, o.per_producer);
  if (cpus_split())
    printf("CPUs split: %d producer, %d consumer\n\n", ncpus_all / 2, ncpus_all - ncpus_all / 2);
  else
    printf("CPUs shared (%d)\n\n", ncpus_all);
  printf("| TP P -> D | model | plugin GB/s | raw engine GB/s | plugin / raw (95%% CI) | raw A/A (95%% CI; "
         "range) | plugin ops/request | raw ops/request | bytes moved/request | bytes needed/request | "
         "prefill blocks held after |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (uint32_t i = 0; i < npairs; i++) pair_run(pairs[i][0], pairs[i][1]);
  if (json) fclose(json);
  if (key[0]) unlink(key);
  return 0;
}
