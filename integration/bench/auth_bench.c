/* hixl-auth-bench (`hixl-perf auth`, one process): what the authenticated handshake (issue 27)
 * adds to HixlEngineConnect, on against off (with --aa off-b too: the A/A spread); --frames:
 * what proving every frame (issue 43) costs on one core against its alternatives; --grants:
 * what a scoped engine's grant and revoke cost as one peer's grants grow. The modes
 * and the method: docs/performance-auth.md ("Connect"; "What proving a frame costs"). */
#include <inttypes.h>

#include <openssl/evp.h>

#include "engine/engine_ext.h"
#include "harness.h"
#include "util/auth.h"

#define MAX_TRANSPORTS 4
#define REGION_BYTES   (1u << 20)

enum { MODE_ON, MODE_OFF, MODE_OFF_B, MODE_COUNT };
static const char *const mode_names[MODE_COUNT] = {"on", "off", "off-b"};

static struct {
  uint64_t connects, block, warmup;
  char *transports[MAX_TRANSPORTS];
  size_t n_transports;
  bool aa, progress;
  const char *json;
} o = {500, 50, 10, {"tcp", "auto"}, 2, false, true, NULL};

enum { TGT, INI }; /* a pair's target (listens) and initiator (client-only) */
struct pair {
  HixlEngine *e[2];   /* [TGT], [INI] */
  HixlMemHandle h[2]; /* their registrations of the shared region */
  char peer[32];      /* the target's "127.0.0.1:port" */
};

struct result {
  struct bench_stats conn; /* Connect */
  double disc_mean_us;     /* Disconnect, for the record */
};

static size_t n_modes(void) { return o.aa ? MODE_COUNT : MODE_OFF_B; }

static void pair_down(struct pair *p) {
  for (int i = INI; i >= TGT; i--) {
    if (p->h[i]) HixlEngineDeregisterMem(p->e[i], p->h[i]);
    if (p->e[i]) HixlEngineDestroy(p->e[i]);
  }
  memset(p, 0, sizeof(*p));
}

/* A target on a free port of 127.0.0.1 and an initiator, both with Transport transport
 * and AuthKeyFile key ("" none), each with region registered; 0 or -1 (said). */
static int pair_up(struct pair *p, const char *transport, const char *key, void *region) {
  HixlOption opt = {"AuthKeyFile", key};
  memset(p, 0, sizeof(*p));
  snprintf(p->peer, sizeof(p->peer), "127.0.0.1:%u", hb_ports("127.0.0.1", 1));
  for (int i = TGT; i <= INI; i++)
    if (!(p->e[i] = hb_engine(i == TGT ? p->peer : "127.0.0.1", transport, &opt, 1)) ||
        hb_reg(p->e[i], region, REGION_BYTES, &p->h[i]) != HIXL_SUCCESS) {
      pair_down(p);
      return -1;
    }
  return 0;
}

/* One Connect and Disconnect of pair p, each timed; 0 or -1 (said). */
static int cycle(struct pair *p, const char *transport, int mode, uint64_t *conn_ns, uint64_t *disc_ns) {
  char what[160];
  uint64_t t0 = bench_now_ns();
  HixlStatus st = HixlEngineConnect(p->e[INI], p->peer, 10000);
  uint64_t t1 = bench_now_ns();
  HixlStatus dst = st == HIXL_SUCCESS ? HixlEngineDisconnect(p->e[INI], p->peer, 5000) : st;
  uint64_t t2 = bench_now_ns();
  if (dst != HIXL_SUCCESS) {
    snprintf(what, sizeof(what), "HixlEngine%s(%s), transport %s, mode %s",
             st != HIXL_SUCCESS ? "Connect" : "Disconnect", p->peer, transport, mode_names[mode]);
    return hb_fail(what, dst), -1;
  }
  *conn_ns = t1 - t0;
  *disc_ns = t2 - t1;
  return 0;
}

/* A keyless initiator (mode off's) must not get through to the keyed target: 0, or -1
 * (said). */
static int check_refused(const struct pair *p, const char *transport) {
  if (HixlEngineConnect(p[MODE_OFF].e[INI], p[MODE_ON].peer, 2000) != HIXL_SUCCESS) return 0;
  hb_say("a keyless engine connected to the keyed target %s (transport %s): mode \"on\" does not "
         "authenticate, nothing to measure\n",
         p[MODE_ON].peer, transport);
  HixlEngineDisconnect(p[MODE_OFF].e[INI], p[MODE_ON].peer, 1000);
  return -1;
}

/* Every mode of one transport, in turns of o.block connects; res[mode] filled. */
static int measure(const char *transport, const char *key, void *region, struct result *res) {
  struct pair pairs[MODE_COUNT] = {0};
  size_t m, nm = n_modes();
  uint64_t *conn = calloc(nm * o.connects, sizeof(*conn)); /* mode m's from m * o.connects */
  uint64_t disc_sum[MODE_COUNT] = {0}, done[MODE_COUNT] = {0};
  uint64_t c_ns, d_ns, t_start = bench_now_ns(), last = 0;
  int rc = -1;

  for (m = 0; m < nm; m++)
    if (!conn || pair_up(&pairs[m], transport, m == MODE_ON ? key : "", region) != 0) goto out_pairs;
  if (check_refused(pairs, transport) != 0) goto out_pairs;
  for (m = 0; m < nm; m++) /* first links cost more (threads, pages): not measured */
    for (uint64_t i = 0; i < o.warmup; i++)
      if (cycle(&pairs[m], transport, (int)m, &c_ns, &d_ns) != 0) goto out_pairs;

  for (uint64_t turn = 0; done[MODE_ON] < o.connects; turn++) {
    for (size_t k = 0; k < nm; k++) {
      m = turn % 2 ? nm - 1 - k : k; /* on off [off-b], then [off-b] off on */
      for (uint64_t i = 0; i < o.block && done[m] < o.connects; i++) {
        if (cycle(&pairs[m], transport, (int)m, &c_ns, &d_ns) != 0) goto out_pairs;
        conn[m * o.connects + done[m]++] = c_ns;
        disc_sum[m] += d_ns;
      }
    }
    uint64_t now = bench_now_ns();
    if (o.progress && (now - last > 1000000000ull || done[MODE_ON] == o.connects)) {
      hb_say("transport %s: %" PRIu64 "/%" PRIu64 " connects per mode, %.1f s\n", transport, done[MODE_ON],
             o.connects, (double)(now - t_start) / 1e9);
      last = now;
    }
  }
  for (m = 0; m < nm; m++) {
    res[m].conn = bench_stats_ns(conn + m * o.connects, o.connects);
    res[m].disc_mean_us = (double)disc_sum[m] / (double)o.connects / 1e3;
  }
  rc = 0;
out_pairs:
  for (m = 0; m < nm; m++) pair_down(&pairs[m]);
  free(conn);
  return rc;
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

/* A mode's figures (when m < MODE_COUNT), or a transport's ratios on/off and off-b/off. */
static size_t fields(struct result (*res)[MODE_COUNT], size_t t, size_t m, struct hb_field *f) {
  size_t k = m % MODE_COUNT;
  const struct bench_stats *s = &res[t][k].conn, *on = &res[t][MODE_ON].conn, *off = &res[t][MODE_OFF].conn,
                           *b = &res[t][MODE_OFF_B].conn;
  const struct hb_field v[] = {HB_FS("transport", "transport", o.transports[t]),
                               HB_FS("mode", "mode", mode_names[k]),
                               HB_FU("connects", "connects", o.connects),
                               HB_FD("p50_us", "p50_us", "%.3f", "%.1f", s->p50_us),
                               HB_FD("p99_us", "p99_us", "%.3f", "%.1f", s->p99_us),
                               HB_FD("mean_us", "mean_us", "%.3f", "%.1f", s->avg_us),
                               HB_FD("min_us", "min_us", "%.3f", "%.1f", s->min_us),
                               HB_FD("max_us", NULL, "%.3f", NULL, s->max_us),
                               HB_FD("disc_mean_us", "disc_mean_us", "%.3f", "%.1f", res[t][k].disc_mean_us)};
  const struct hb_field r[] = {
      HB_FS("transport", "transport", o.transports[t]),
      HB_FD("on_off_p50", "p50 on/off", "%.4f", "%.2fx", ratio(on->p50_us, off->p50_us)),
      HB_FD("on_off_p99", "p99 on/off", "%.4f", "%.2fx", ratio(on->p99_us, off->p99_us)),
      HB_FD("on_off_mean", "mean on/off", "%.4f", "%.2fx", ratio(on->avg_us, off->avg_us)),
      HB_FD("aa_p50", "p50 A/A", "%.4f", "%.2fx", ratio(b->p50_us, off->p50_us)),
      HB_FD("aa_p99", "p99 A/A", "%.4f", "%.2fx", ratio(b->p99_us, off->p99_us)),
      HB_FD("aa_mean", "mean A/A", "%.4f", "%.2fx", ratio(b->avg_us, off->avg_us))};
  if (m == MODE_COUNT) return memcpy(f, r, sizeof(r)), HB_NF(r) - (o.aa ? 0 : 3);
  return memcpy(f, v, sizeof(v)), HB_NF(v);
}

/* The table on stdout, and --json FILE: a mode's figures each, then each transport's ratios. */
static int report(struct result (*res)[MODE_COUNT]) {
  struct hb_field f[16];
  size_t nm = n_modes(), nt = o.n_transports;
  FILE *j = o.json ? hb_json_open(o.json, "hixl-auth-bench") : NULL;
  if (j)
    fprintf(j,
            "  \"connects\": %" PRIu64 ",\n  \"block\": %" PRIu64 ",\n  \"warmup\": %" PRIu64
            ",\n  \"results\": [\n",
            o.connects, o.block, o.warmup);
  for (size_t i = 0; i < nt * nm; i++)
    hb_emit(stdout, j, NULL, i, nt * nm, f, fields(res, i / nm, i % nm, f));
  if (j) fprintf(j, "  ],\n  \"ratios\": [\n");
  putchar('\n');
  for (size_t t = 0; t < nt; t++) hb_emit(stdout, j, NULL, t, nt, f, fields(res, t, MODE_COUNT, f));
  return j && !hb_json_end(j, o.json) ? -1 : 0;
}

/* ---- --frames: the per-frame proof against its alternatives ---- */

struct fctx {
  struct auth_frames f, peer; /* the initiator's tags and the target's, which checks them */
  struct auth_key k;
  uint8_t *a, *b, tag[AUTH_TAG_LEN], tag0[AUTH_TAG_LEN], mac[AUTH_MAC_LEN]; /* tag0: frame 0's */
  size_t n;
  EVP_CIPHER_CTX *gcm;
  uint64_t ok; /* checks that passed */
};

/* Median ns per call of fn over 9 runs of reps calls each. */
static double time_ns(void (*fn)(struct fctx *), struct fctx *c, unsigned reps) {
  double v[9];
  for (int r = 0; r < 9; r++) {
    uint64_t t0 = bench_now_ns();
    for (unsigned i = 0; i < reps; i++) fn(c);
    v[r] = (double)(bench_now_ns() - t0) / reps;
  }
  return bench_median(v, 9);
}

static void p_seal(struct fctx *c) { auth_seal_frame(&c->f.tx, c->a, c->n, NULL, 0, c->tag); }
static void p_check(struct fctx *c) {
  c->peer.rx.seq = 0; /* the same frame checked again and again: its count held */
  c->ok += auth_check_frame(&c->peer.rx, c->a, c->n, NULL, 0, c->tag0);
}
static void p_hmac(struct fctx *c) {
  auth_hmac(&c->k, (const void *const[]){c->a}, (const size_t[]){c->n}, 1, c->mac);
}
static void p_encrypt(struct fctx *c) {
  uint8_t iv[12] = {0};
  int outl = 0;
  EVP_EncryptInit_ex(c->gcm, NULL, NULL, NULL, iv);
  EVP_EncryptUpdate(c->gcm, c->b, &outl, c->a, (int)c->n);
  EVP_EncryptFinal_ex(c->gcm, c->tag, &outl);
}
static void p_memcpy(struct fctx *c) {
  memcpy(c->b, c->a, c->n);
  __asm__ __volatile__("" ::"r"(c->b) : "memory");
}

/* What --frames times, in the table's order: a frame header's bytes, or a 1 MiB chunk's. */
static const struct {
  const char *name;
  void (*fn)(struct fctx *);
  bool chunk;
} prims[] = {{"tag a frame header (hixl: GMAC)", p_seal, false},
             {"check a frame header's tag (hixl)", p_check, false},
             {"HMAC-SHA256 of a frame header", p_hmac, false},
             {"memcpy of a frame header", p_memcpy, false},
             {"GMAC over a 1 MiB payload (tagging the data too)", p_seal, true},
             {"AES-256-GCM encrypt 1 MiB (a TLS 1.3 record layer)", p_encrypt, true},
             {"memcpy 1 MiB (the reference: a copy of the data)", p_memcpy, true}};

static int frames_bench(void) {
  static const uint8_t session[AUTH_MAC_LEN] = {1, 2, 3};
  const size_t hdr = 36, chunk = 1u << 20; /* a WRITE_REQ's header and body; a tcp chunk (ENGINE_TCP_CHUNK) */
  struct fctx c = {.k = {.len = AUTH_MAC_LEN}, .n = hdr};
  uint8_t key[32] = {9};
  memcpy(c.k.k, session, AUTH_MAC_LEN);
  c.a = malloc(chunk);
  c.b = malloc(chunk + 16);
  c.gcm = EVP_CIPHER_CTX_new();
  if (!c.a || !c.b || !c.gcm || !auth_frames_init(&c.f, session, true) ||
      !auth_frames_init(&c.peer, session, false) ||
      EVP_EncryptInit_ex(c.gcm, EVP_aes_256_gcm(), NULL, key, NULL) != 1) {
    hb_say("--frames: out of memory or no AES-256-GCM\n");
    return 1;
  }
  bench_pattern_fill(c.a, chunk, 7);
  auth_seal_frame(&c.f.tx, c.a, hdr, NULL, 0, c.tag0); /* frame 0, which every check then takes */
  double ns[HB_NF(prims)];
  for (size_t i = 0; i < HB_NF(prims); i++) {
    c.n = prims[i].chunk ? chunk : hdr;
    ns[i] = time_ns(prims[i].fn, &c, prims[i].chunk ? 20 : 20000);
  }
  if (c.ok != 9 * 20000u) {
    hb_say("--frames: %" PRIu64 " of %u checks passed\n", c.ok, 9 * 20000u);
    return 1;
  }
  char ulp[256] = "";
  FILE *f = fopen("/proc/sys/net/ipv4/tcp_available_ulp", "r");
  if (f && !fgets(ulp, sizeof(ulp), f)) ulp[0] = '\0';
  if (f) fclose(f);
  ulp[strcspn(ulp, "\n")] = '\0';
  bool ktls = strstr(ulp, "tls") != NULL;
  FILE *j = o.json ? fopen(o.json, "w") : NULL;
  if (o.json && !j) hb_die("cannot write %s: %s", o.json, strerror(errno));
  if (j)
    fprintf(j,
            "{\n  \"version\": \"%s\",\n  \"ktls\": %s,\n  \"tcp_available_ulp\": \"%s\",\n  \"frames\": [\n",
            HixlVersionString(), ktls ? "true" : "false", ulp);
  printf("# hixl-auth-bench --frames (hixl %s): one core, median of 9 runs\n", HixlVersionString());
  /* the head by hand: hb_head aligns no column right */
  printf("| what | bytes | ns per op | GB/s | / memcpy of the same bytes |\n|---|---:|---:|---:|---:|\n");
  for (size_t i = 0; i < HB_NF(prims); i++) {
    size_t bytes = prims[i].chunk ? chunk : hdr;
    const struct hb_field rec[] = {
        HB_FS("what", "what", prims[i].name), HB_FU("bytes", "bytes", bytes),
        HB_FD("ns", "ns per op", "%.1f", "%.0f", ns[i]), HB_FD(NULL, "GB/s", "%.2f", NULL, bytes / ns[i]),
        HB_FD(NULL, "/ memcpy of the same bytes", "%.2fx", NULL, ns[i] / ns[prims[i].chunk ? 6 : 3])};
    hb_row(stdout, HB_MD, rec, HB_NF(rec));
    putchar('\n');
    if (j) hb_json_item(j, i, HB_NF(prims), rec, HB_NF(rec));
  }
  printf(
      "\nper 4 MiB op over tcp (4 chunks, a tagged request and answer each, tagged and checked): %.2f us\n",
      4 * 2 * (ns[0] + ns[1]) / 1000);
  printf("kTLS (TCP ULP \"tls\"): %s (tcp_available_ulp: \"%s\")\n", ktls ? "offered" : "not offered", ulp);
  if (j) hb_json_end(j, o.json);
  auth_frames_free(&c.f);
  auth_frames_free(&c.peer);
  EVP_CIPHER_CTX_free(c.gcm);
  free(c.a);
  free(c.b);
  return 0;
}

/* ---- --grants: a grant's cost against what the peer holds ---- */

/* One peer granted 64 requests of n ranges in turn, then each revoked: request q's range i
 * at slot i * 64 + q (interleaved in address, as blocks from one free list are; 32 KiB
 * each, 64 KiB apart). ms[0..2]: the first grant's, the 64th's and the mean revoke's, each
 * the median of 3 runs. */
static int grants_one(size_t n, double *ms) {
  enum { REQS = 64, RUNS = 3 };
  double t[3][RUNS] = {{0}};
  uint64_t(*r)[2] = malloc(n * sizeof(*r));
  HixlStatus st = r ? HIXL_SUCCESS : HIXL_RESOURCE_EXHAUSTED;
  for (int run = 0; run < RUNS && st == HIXL_SUCCESS; run++) {
    HixlEngine *e = hb_engine("127.0.0.1", NULL, NULL, 0);
    st = e ? hixl_engine_set_scoped(e, true) : HIXL_FAILED;
    for (int pass = 0; pass < 2 && st == HIXL_SUCCESS; pass++)
      for (uint64_t q = 0; q < REQS && st == HIXL_SUCCESS; q++) {
        for (size_t i = 0; i < n; i++) r[i][0] = (1ull << 40) + (i * REQS + q) * 65536, r[i][1] = 32768;
        uint64_t t0 = bench_now_ns();
        st = (pass ? hixl_engine_revoke : hixl_engine_grant)(e, "10.0.0.2:1", (const uint64_t(*)[2])r, n);
        double d = (double)(bench_now_ns() - t0) / 1e6;
        if (pass)
          t[2][run] += d / REQS;
        else if (q == 0 || q == REQS - 1)
          t[q ? 1 : 0][run] = d;
      }
    if (e) HixlEngineDestroy(e);
  }
  free(r);
  if (st != HIXL_SUCCESS) return !hb_fail("--grants", st);
  for (int k = 0; k < 3; k++) ms[k] = bench_median_sorting(t[k], RUNS);
  return 0;
}

static int grants_bench(void) {
  static const size_t sizes[] = {16384, 2048}; /* 4096 tokens of 32 layers: a range per block; per run of 8 */
  FILE *j = o.json ? fopen(o.json, "w") : NULL;
  if (o.json && !j) hb_die("cannot write %s: %s", o.json, strerror(errno));
  if (j) fprintf(j, "{\n  \"version\": \"%s\",\n  \"grants\": [\n", HixlVersionString());
  printf("# hixl-auth-bench --grants (hixl %s): one peer, 64 requests granted in turn, interleaved in "
         "address, then revoked; medians of 3 runs\n",
         HixlVersionString());
  printf("| ranges a request | first grant ms | 64th grant ms | / first | revoke ms (mean) |\n"
         "|---:|---:|---:|---:|---:|\n");
  for (size_t k = 0; k < 2; k++) {
    double ms[3];
    if (grants_one(sizes[k], ms)) {
      if (j) fclose(j);
      return 1;
    }
    const struct hb_field rec[] = {HB_FU("ranges", "ranges a request", sizes[k]),
                                   HB_FD("first_grant_ms", "first grant ms", "%.3f", NULL, ms[0]),
                                   HB_FD("last_grant_ms", "64th grant ms", "%.3f", NULL, ms[1]),
                                   HB_FD(NULL, "/ first", "%.1fx", NULL, ms[1] / ms[0]),
                                   HB_FD("revoke_ms", "revoke ms", "%.3f", NULL, ms[2])};
    hb_row(stdout, HB_MD, rec, HB_NF(rec));
    putchar('\n');
    if (j) hb_json_item(j, k, 2, rec, HB_NF(rec));
  }
  return j && !hb_json_end(j, o.json);
}

/* "tcp,auto" into o.transports (the string is kept and cut in place). */
static bool parse_transports(void *p, const char *v) {
  (void)p;
  o.n_transports = 0;
  for (char *save = NULL, *t = strtok_r(strdup(v), ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (o.n_transports == MAX_TRANSPORTS || HixlEngineCheckOption("Transport", t) != HIXL_SUCCESS)
      return false;
    o.transports[o.n_transports++] = t;
  }
  return o.n_transports > 0;
}

static bool frames, grants;
static const struct hb_opt opts[] = {
    {"--connects", HB_U64, &o.connects, "N", "connects per mode and transport (default 500)", 1, 1e7, NULL},
    {"--block", HB_U64, &o.block, "N", "connects per mode before the other mode's turn (default 50)", 1, 1e7,
     NULL},
    {"--warmup", HB_U64, &o.warmup, "N", "unmeasured connects per mode first (default 10)", 0, 1e7, NULL},
    {"--transports", HB_FN, NULL, "LIST", "e.g. tcp,auto (default; auto: shm between the two engines)", 0, 0,
     parse_transports},
    {"--aa", HB_FLAG, &o.aa, NULL, "add mode off-b, a second keyless pair: the A/A spread", 0, 0, NULL},
    {"--frames", HB_FLAG, &frames, NULL, "instead: what proving every frame costs, and its alternatives", 0,
     0, NULL},
    {"--grants", HB_FLAG, &grants, NULL, "instead: what a grant and a revoke cost as one peer's grants grow",
     0, 0, NULL},
    {"--json", HB_STR, &o.json, "FILE", "the results as JSON", 0, 0, NULL},
    {"--no-progress", HB_NOFLAG, &o.progress, NULL, "nothing on stderr but errors", 0, 0, NULL},
    {NULL, 0, NULL, NULL, NULL, 0, 0, NULL}};

static int run(struct hb_peer *none) {
  struct result res[MAX_TRANSPORTS][MODE_COUNT];
  char key[256];
  void *region = NULL;
  int rc = 1;
  (void)none;
  if (frames) return frames_bench();
  if (grants) return grants_bench();
  if (bench_key_file(key, sizeof(key), "hixl-auth-bench") != 0) return 1;
  if (!(region = hb_map(REGION_BYTES))) goto out_key;
  printf("# hixl-auth-bench (hixl %s): 127.0.0.1, %" PRIu64
         " connects per mode and transport in turns of %" PRIu64 ", %" PRIu64
         " unmeasured first; Connect timed, then Disconnect\n",
         HixlVersionString(), o.connects, o.block, o.warmup);
  for (size_t t = 0; t < o.n_transports; t++)
    if (measure(o.transports[t], key, region, res[t]) != 0) goto out_region;
  if (report(res) != 0) goto out_region;
  rc = 0;
out_region:
  munmap(region, REGION_BYTES);
out_key:
  unlink(key);
  return rc;
}

const struct hb_test hb_test_auth = {
    "auth",
    "hixl-auth-bench",
    "Connect with the authenticated handshake against none; --frames: a frame's proof; --grants: scoped "
    "grants",
    "HixlEngineConnect time with the authenticated handshake (AuthKeyFile on both engines)\n"
    "and without (no key on either), two engines per mode in this process on 127.0.0.1.\n",
    opts,
    NULL,
    NULL,
    run};
