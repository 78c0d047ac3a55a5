/* hixl-rails-bench: large READ or WRITE ops over an engine's rails (issue 31), one role per
 * process, so the two ends can live in two network namespaces (integration/rails/). What each
 * role does, checks, prints and writes: docs/rails.md, "The benchmark". SIGINT or SIGTERM ends
 * an initiator's loop (the ops in flight complete and are checked, then it reports); SIGUSR1
 * holds it (the ops in flight complete, then none is posted; the stats file's phase says
 * "held") until SIGUSR2. */
#include <inttypes.h>

#include "harness.h"
#include "engine/engine_ext.h"

#define PROG         "hixl-rails-bench"
#define TAG_PREFIX   "hixl-rails-bench seed="
#define PAGE         4096u
#define MAX_DEPTH    64
#define MAX_FLIGHT   256        /* ops in flight: depth x batch */
#define MAX_REQS     (1u << 20) /* latencies kept */
#define RAILS_CAP    16         /* rails read back per link (the engine takes at most 8) */
#define STATS_PERIOD 200000000ull
#define PROG_PERIOD  1000000000ull
#define WRITE_SEED   0x5752495445ull /* "WRITE": the written pattern's seed is seed ^ this */

enum role { ROLE_NONE = -1, ROLE_TARGET, ROLE_INITIATOR };

static struct {
  int role; /* enum role */
  const char *listen, *connect, *local, *rails, *transport, *json, *label, *stats_file, *ready_file;
  size_t buf_size, op_size;
  uint64_t seed, ops, seconds, batch, depth, expect_rails, stall_ms, probe_ms, timeout_ms;
  bool progress, read, write;
  struct hb_extra x; /* --opt */
} o = {.role = ROLE_NONE,
       .buf_size = 256u << 20,
       .op_size = 4u << 20,
       .seed = 1,
       .batch = 1,
       .depth = 4,
       .timeout_ms = 30000,
       .transport = "tcp",
       .progress = true};

/* SIGINT, SIGTERM: stop; SIGUSR1: hold; SIGUSR2: go on. */
static volatile sig_atomic_t stop_flag, hold_flag;
static void on_signal(int sig) {
  if (sig == SIGUSR1 || sig == SIGUSR2) hold_flag = sig == SIGUSR1;
  if (sig == SIGINT || sig == SIGTERM) stop_flag = 1;
}

static void install_signals(void) {
  static const int sigs[] = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
  struct sigaction sa = {.sa_handler = on_signal};
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) sigaction(sigs[i], &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
}

static const char *const roles[] = {"target", "initiator", NULL};
static const struct hb_opt opts[] = {
    {"--role", HB_CHOICE, &o.role, "target|initiator", "(required)", 0, 0, roles},
    {"--listen", HB_STR, &o.listen, "IP:PORT", "target: its engine's address", 0, 0, NULL},
    {"--connect", HB_STR, &o.connect, "IP:PORT", "initiator: the target's", 0, 0, NULL},
    {"--local", HB_STR, &o.local, "IP", "initiator: its engine's address", 0, 0, NULL},
    {"--rails", HB_STR, &o.rails, "LIST", "Rails: this engine's addresses, a,b,... or auto", 0, 0, NULL},
    {"--buf-size", HB_SIZE, &o.buf_size, "SIZE", "target: its buffer (default 256M)", 1, 1e18, NULL},
    {"--seed", HB_U64, &o.seed, "N", "target: the pattern's seed (default 1)", 0, 0, NULL},
    {"--ready-file", HB_STR, &o.ready_file, "FILE", "target: written once it serves", 0, 0, NULL},
    {"--read", HB_FLAG, &o.read, NULL, "initiator: READ ops", 0, 0, NULL},
    {"--write", HB_FLAG, &o.write, NULL, "initiator: WRITE ops, read back and checked", 0, 0, NULL},
    {"--op-size", HB_SIZE, &o.op_size, "SIZE", "bytes of an op (default 4M)", 1, 1e18, NULL},
    {"--ops", HB_U64, &o.ops, "N", "ops in all, or", 0, 0, NULL},
    {"--seconds", HB_U64, &o.seconds, "S", "seconds of ops", 0, 0, NULL},
    {"--batch", HB_U64, &o.batch, "N", "ops a request (default 1)", 1, MAX_FLIGHT, NULL},
    {"--depth", HB_U64, &o.depth, "N", "requests in flight (default 4)", 1, MAX_DEPTH, NULL},
    {"--expect-rails", HB_U64, &o.expect_rails, "N", "fail unless N rails are up after Connect", 0, 0, NULL},
    {"--json", HB_STR, &o.json, "FILE", "the result", 0, 0, NULL},
    {"--label", HB_STR, &o.label, "TEXT", "a label for the JSON", 0, 0, NULL},
    {"--stats-file", HB_STR, &o.stats_file, "FILE", "the rails' counters, kept up to date", 0, 0, NULL},
    {"--no-progress", HB_NOFLAG, &o.progress, NULL, "nothing on stderr but errors", 0, 0, NULL},
    {"--transport", HB_STR, &o.transport, "NAME", "default tcp (rdma: a device per rail)", 0, 0, NULL},
    {"--stall-ms", HB_U64, &o.stall_ms, "N", "RailStallMs", 0, 0, NULL},
    {"--probe-ms", HB_U64, &o.probe_ms, "N", "RailProbeMs", 0, 0, NULL},
    {"--timeout-ms", HB_U64, &o.timeout_ms, "N", "a request's timeout (default 30000)", 1, INT32_MAX, NULL},
    {"--opt", HB_FN, &o.x, "KEY=VALUE", "any other engine option; repeatable", 0, 0, hb_extra_add},
    {NULL, 0, NULL, NULL, NULL, 0, 0, NULL}};

/* An engine on addr with the options given; NULL when it cannot (said). */
static HixlEngine *engine_up(const char *addr) {
  HixlOption opt[HB_EXTRA_MAX + 3];
  char stall[24], probe[24];
  size_t n = 0;
  snprintf(stall, sizeof(stall), "%" PRIu64, o.stall_ms);
  snprintf(probe, sizeof(probe), "%" PRIu64, o.probe_ms);
  if (o.rails) opt[n++] = (HixlOption){"Rails", o.rails};
  if (o.stall_ms) opt[n++] = (HixlOption){"RailStallMs", stall};
  if (o.probe_ms) opt[n++] = (HixlOption){"RailProbeMs", probe};
  memcpy(opt + n, o.x.v, o.x.n * sizeof(o.x.v[0]));
  return hb_engine(addr, o.transport, opt, n + o.x.n);
}

/* ---- target ---- */

static int run_target(void) {
  int rc = 1;
  char tag[64];
  HixlMemHandle h = NULL;
  install_signals();
  HixlEngine *e = engine_up(o.listen);
  if (!e) return 1;
  uint8_t *buf = hb_map(o.buf_size);
  if (!buf) goto out_engine;
  bench_pattern_fill(buf, o.buf_size, o.seed);
  snprintf(tag, sizeof(tag), TAG_PREFIX "%" PRIu64, o.seed);
  HixlMemDesc md = {.addr = (uintptr_t)buf, .len = o.buf_size};
  if (!hb_ok(hixl_engine_register_tagged(e, &md, HIXL_MEM_HOST, tag, &h), "registering the target's buffer"))
    goto out_buf;
  printf(PROG ": target ready on %s (rails %s), %zu bytes, seed %" PRIu64 "\n", o.listen,
         o.rails ? o.rails : "none", o.buf_size, o.seed);
  fflush(stdout);
  if (o.ready_file) {
    FILE *f = fopen(o.ready_file, "w");
    if (!f || fprintf(f, "ready %s\n", o.listen) < 0 || fclose(f) != 0) {
      hb_say("--ready-file %s: %s\n", o.ready_file, strerror(errno));
      goto out_dereg;
    }
  }
  while (!stop_flag) pause(); /* the engine's threads serve; a signal ends it */
  rc = 0;
out_dereg:
  HixlEngineDeregisterMem(e, h);
out_buf:
  munmap(buf, o.buf_size);
out_engine:
  HixlEngineDestroy(e);
  return rc;
}

/* ---- initiator ---- */

static uint64_t lat[MAX_REQS]; /* the requests' latencies, ns */

struct run {
  HixlEngine *e;
  HixlMemHandle lh;
  uint8_t *local; /* depth x batch op-sized slots (WRITE's read-backs land there too), then a scratch op */
  uint8_t *ref;   /* the target's buffer as it should read (READ) or the written pattern (WRITE) */
  uint64_t remote, remote_len, seed, nslots;
  HixlTransferReq req[MAX_DEPTH]; /* the requests in flight, NULL: a free slot */
  uint64_t t0[MAX_DEPTH];         /* ... posted at */
  size_t nlat;
  uint64_t submitted, done, checked, verified_bytes, timed_ns, t_start, max_ns; /* checked: WRITEs to here */
  uint64_t next_stats, next_prog, last_prog_done;
  uint64_t prog_ns_at;                 /* timed time at the last progress line */
  uint64_t t_phase;                    /* the timed phase under way began here */
  struct hixl_rail_info ri[RAILS_CAP]; /* the rails as last read */
  size_t nri;
};

static double gbps_of(uint64_t bytes, uint64_t ns) { return ns ? (double)bytes * 8.0 / (double)ns : 0.0; }

/* The local and the remote slot op k uses. */
static uint8_t *lslot(const struct run *r, uint64_t op) {
  return r->local + (op % (o.depth * o.batch)) * o.op_size;
}
static uint64_t rslot(const struct run *r, uint64_t op) { return op % r->nslots; }

/* The op between lp and remote slot sl; a READ's destination is poisoned first, so that a
 * read that moves nothing cannot pass. */
static HixlTransferOpDesc op_at(const struct run *r, uint8_t *lp, uint64_t sl, bool read) {
  if (read) memset(lp, 0xA5, o.op_size);
  return (HixlTransferOpDesc){
      .local_addr = (uintptr_t)lp, .remote_addr = (uintptr_t)(r->remote + sl * o.op_size), .len = o.op_size};
}

/* The data WRITE op k carries, into dst: the written pattern of its remote slot with the
 * op's own 8-byte stamp at the start of every page. */
static void write_data(const struct run *r, uint64_t op, uint8_t *dst) {
  memcpy(dst, r->ref + rslot(r, op) * o.op_size, o.op_size);
  for (uint64_t p = 0; p * PAGE + 8 <= o.op_size; p++) {
    uint64_t s = bench_pattern_word(WRITE_SEED, op) ^ (p * 0x9e3779b97f4a7c15ull);
    memcpy(dst + p * PAGE, &s, 8);
  }
}

/* The rails of the link now, into r->ri (none when they cannot be read: said). */
static int rails_read(struct run *r) {
  size_t got = 0;
  r->nri = 0;
  if (!hb_ok(hixl_engine_rails(r->e, o.connect, r->ri, RAILS_CAP, &got), "hixl_engine_rails")) return -1;
  r->nri = got < RAILS_CAP ? got : RAILS_CAP;
  return 0;
}

/* A JSON line's end: its last key, "rails", the rails as last read. */
static void rails_json_end(FILE *f, const struct run *r) {
  fprintf(f, "\"rails\": [");
  for (size_t k = 0; k < r->nri; k++) {
    const struct hixl_rail_info *x = &r->ri[k];
    fprintf(f,
            "%s{\"rail\": %zu, \"local\": \"%s\", \"remote\": \"%s\", \"state\": \"%s\", \"bytes\": %" PRIu64
            ", \"ops\": %" PRIu64 ", \"failures\": %" PRIu64 ", \"retried\": %" PRIu64
            ", \"control\": %d, \"last_down\": ",
            k ? ", " : "", k, x->local, x->remote, x->state, x->bytes, x->ops, x->failures, x->retried,
            x->control);
    hb_json_str(f, x->last_down); /* a message */
    fputc('}', f);
  }
  fprintf(f, "]}\n");
}

/* --stats-file, every STATS_PERIOD (now UINT64_MAX: at once): the state now, written whole
 * then renamed over the file. */
static void stats_write(struct run *r, uint64_t now, const char *phase) {
  char tmp[4096];
  if (!o.stats_file || now < r->next_stats) return;
  r->next_stats = now + STATS_PERIOD;
  rails_read(r);
  snprintf(tmp, sizeof(tmp), "%s.tmp", o.stats_file);
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  fprintf(f, "{\"phase\": \"%s\", \"ops\": %" PRIu64 ", \"verified_bytes\": %" PRIu64 ", \"max_ms\": %.3f, ",
          phase, r->done, r->verified_bytes, (double)r->max_ns / 1e6);
  rails_json_end(f, r);
  if (fclose(f) == 0) rename(tmp, o.stats_file);
}

/* The stats file every STATS_PERIOD, a progress line every PROG_PERIOD. */
static void progress(struct run *r, uint64_t now) {
  stats_write(r, now, "running");
  if (!o.progress || now < r->next_prog) return;
  uint64_t tn = r->timed_ns + (now - r->t_phase), dn = r->done - r->last_prog_done, dt = tn - r->prog_ns_at;
  hb_say("%.1f s: %" PRIu64 " ops, %.2f Gbit/s (last second %.2f), max %.1f ms",
         (double)(now - r->t_start) / 1e9, r->done, gbps_of(r->done * o.op_size, tn),
         gbps_of(dn * o.op_size, dt), (double)r->max_ns / 1e6);
  rails_read(r);
  for (size_t k = 0; k < r->nri; k++)
    fprintf(stderr, "; rail %zu %s %" PRIu64 " MiB", k, r->ri[k].state, r->ri[k].bytes >> 20);
  fprintf(stderr, "\n");
  r->last_prog_done = r->done;
  r->prog_ns_at = tn;
  r->next_prog = now + PROG_PERIOD;
}

/* Op op's bytes at got against want (and counted verified): false after saying which
 * byte is wrong. */
static bool check(struct run *r, uint64_t op, const uint8_t *got, const uint8_t *want) {
  size_t bad = 0;
  if (bench_same(got, want, o.op_size, &bad)) return r->verified_bytes += o.op_size, true;
  hb_say("%s op %" PRIu64 " (remote offset %" PRIu64 "): byte %zu %s\n", o.read ? "READ" : "WRITE", op,
         rslot(r, op) * o.op_size, bad, o.read ? "is wrong" : "reads back wrong");
  return false;
}

/* Post request slot s: batch ops from op number first. 0, or -1 (said). */
static int post(struct run *r, size_t s, uint64_t first) {
  HixlTransferOpDesc d[MAX_FLIGHT];
  for (uint64_t i = 0; i < o.batch; i++) {
    uint64_t op = first + i;
    if (o.write) write_data(r, op, lslot(r, op));
    d[i] = op_at(r, lslot(r, op), rslot(r, op), o.read);
  }
  r->t0[s] = bench_now_ns();
  HixlStatus st = HixlEngineTransferAsync(r->e, o.connect, o.read ? HIXL_READ : HIXL_WRITE, d, o.batch,
                                          (int32_t)o.timeout_ms, NULL, &r->req[s]);
  return hb_ok(st, "HixlEngineTransferAsync") ? 0 : -1; /* the slot's req is set only on success */
}

/* Wait for request slot s, the oldest in flight (so its first op is op done); a READ's data
 * is checked. 0, or -1 (said). */
static int wait_req(struct run *r, size_t s) {
  HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
  HixlStatus st = hb_wait_xfer(r->e, r->req[s], &ts);
  uint64_t first = r->done, ns = bench_now_ns() - r->t0[s];
  r->req[s] = NULL;
  if (st != HIXL_SUCCESS) return hb_fail("HixlEngineGetTransferStatus", st), -1;
  if (ts != HIXL_TRANSFER_COMPLETED) {
    hb_say("request of ops %" PRIu64 "..%" PRIu64 " ended %s after %.1f ms: %s\n", first, first + o.batch - 1,
           ts == HIXL_TRANSFER_TIMEOUT ? "TIMEOUT" : "FAILED", (double)ns / 1e6, HixlGetLastErrorMessage());
    return -1;
  }
  if (r->nlat < MAX_REQS) lat[r->nlat++] = ns;
  if (ns > r->max_ns) r->max_ns = ns;
  for (uint64_t op = first; o.read && op < first + o.batch; op++)
    if (!check(r, op, lslot(r, op), r->ref + rslot(r, op) * o.op_size)) return -1;
  r->done += o.batch;
  return 0;
}

/* WRITE: read back the slots of every op since the last check, depth x batch at a time
 * into the local slots (nothing is in flight), and compare. Untimed. 0, or -1 (said). */
static int write_check(struct run *r) {
  HixlTransferOpDesc d[MAX_FLIGHT];
  uint64_t chunk = o.depth * o.batch;
  uint8_t *want = r->local + chunk * o.op_size; /* the scratch: what a slot should read back */
  for (uint64_t first = r->checked; first < r->submitted; first += chunk) {
    uint64_t nb = r->submitted - first < chunk ? r->submitted - first : chunk;
    for (uint64_t i = 0; i < nb; i++) d[i] = op_at(r, r->local + i * o.op_size, rslot(r, first + i), true);
    if (!hb_ok(HixlEngineTransferSync(r->e, o.connect, HIXL_READ, d, nb, (int32_t)o.timeout_ms),
               "reading back the written slots"))
      return -1;
    for (uint64_t i = 0; i < nb; i++) {
      write_data(r, first + i, want);
      if (!check(r, first + i, r->local + i * o.op_size, want)) return -1;
    }
  }
  r->checked = r->submitted;
  return 0;
}

/* Whether to post more: not stopped or held, ops or seconds left, and for WRITE room: the ops
 * since the last check are consecutive, so the next request would write a slot one of them
 * wrote once they span more than the buffer (then drain, check). */
static bool more(const struct run *r, uint64_t now) {
  return !stop_flag && !hold_flag &&
         (o.ops ? r->submitted < o.ops : now - r->t_start < o.seconds * 1000000000ull) &&
         !(o.write && r->submitted + o.batch - r->checked > r->nslots);
}

/* A failure inside a timed phase: the phase's time so far counts, as its ops done do. */
static int phase_failed(struct run *r) {
  r->timed_ns += bench_now_ns() - r->t_phase;
  return -1;
}

/* The loop: keep depth requests in flight; 0, or -1 at the first failure (said). */
static int loop(struct run *r) {
  size_t s = 0; /* requests complete in order of slots: the oldest is waited for first */
  r->t_phase = r->t_start = bench_now_ns();
  r->next_prog = r->t_start + PROG_PERIOD;
  for (;;) {
    if (r->req[s]) { /* the oldest: once it is done, its slot takes the next request */
      if (wait_req(r, s) < 0) return phase_failed(r);
      progress(r, bench_now_ns());
      continue;
    }
    if (more(r, bench_now_ns())) {
      if (post(r, s, r->submitted) < 0) return phase_failed(r);
      r->submitted += o.batch;
    } else if (r->done == r->submitted) {
      r->timed_ns += bench_now_ns() - r->t_phase; /* none in flight (done: those ended well): phase over */
      if (o.write && write_check(r) < 0) return -1;
      while (hold_flag && !stop_flag) { /* SIGUSR1: nothing in flight until SIGUSR2 */
        stats_write(r, bench_now_ns(), "held");
        poll(NULL, 0, 20);
      }
      if (!more(r, bench_now_ns())) return 0;
      r->t_phase = bench_now_ns();
      continue;
    }
    s = (s + 1) % o.depth; /* posted, or another request is in flight: the next slot */
  }
}

/* The target's buffer from its memory table: its tag gives the seed. 0, or -1 (said). */
static int find_remote(struct run *r) {
  struct hixl_remote_mem *m = NULL;
  size_t n = 0, lp = strlen(TAG_PREFIX);
  int rc = -1;
  if (!hb_ok(hixl_engine_remote_mems(r->e, o.connect, (int32_t)o.timeout_ms, &m, &n),
             "hixl_engine_remote_mems"))
    return -1;
  for (size_t i = 0; rc < 0 && i < n; i++)
    if (m[i].tag && strncmp(m[i].tag, TAG_PREFIX, lp) == 0 && bench_parse_u64(m[i].tag + lp, &r->seed)) {
      r->remote = m[i].addr;
      r->remote_len = m[i].len;
      rc = 0;
    }
  free(m);
  if (rc < 0) hb_say("%s registered no buffer tagged \"" TAG_PREFIX "N\"\n", o.connect);
  return rc;
}

/* --expect-rails N: wait (a deadline, polling) until the link has N rails, all up. */
static int expect_rails(struct run *r) {
  size_t up = 0;
  uint64_t deadline = bench_now_ns() + 10000000000ull;
  do {
    if (rails_read(r) < 0) return -1;
    up = 0;
    for (size_t k = 0; k < r->nri; k++) up += strcmp(r->ri[k].state, "up") == 0;
    if (r->nri == o.expect_rails && up == r->nri) return 0;
    if (o.expect_rails <= 1 && r->nri == 0) return 0; /* one rail: the link itself */
    poll(NULL, 0, 20);
  } while (bench_now_ns() < deadline);
  hb_say("--expect-rails %" PRIu64 ": the link to %s has %zu rails, %zu up\n", o.expect_rails, o.connect,
         r->nri, up);
  return -1;
}

static void print_result(struct run *r, bool pass) {
  rails_read(r);
  double gbit = gbps_of(r->done * o.op_size, r->timed_ns), secs = (double)r->timed_ns / 1e9;
  struct bench_stats ls = bench_stats_ns(lat, r->nlat); /* sorts them: the run is over */
  const char *dir = o.read ? "read" : "write";
  printf(PROG ": %s %" PRIu64 " ops of %zu bytes (batch %" PRIu64 ", depth %" PRIu64 ") to %s: %s\n", dir,
         r->done, o.op_size, o.batch, o.depth, o.connect, pass ? "every byte verified" : "FAILED");
  printf("  %.3f GB/s = %.3f Gbit/s over %.2f s; request latency p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
         gbit / 8.0, gbit, secs, ls.p50_us / 1e3, ls.p99_us / 1e3, ls.max_us / 1e3);
  if (r->nri == 0) printf("  one link (no rails)\n");
  for (size_t k = 0; k < r->nri; k++) {
    const struct hixl_rail_info *x = &r->ri[k];
    printf("  rail %zu %s -> %s %s%s: %" PRIu64 " bytes, %" PRIu64 " ops, %" PRIu64 " failures, %" PRIu64
           " retried\n",
           k, x->local[0] ? x->local : "*", x->remote, x->state, x->control ? " (control)" : "", x->bytes,
           x->ops, x->failures, x->retried);
  }
  fflush(stdout);
  FILE *f = o.json ? fopen(o.json, "a") : NULL;
  if (o.json && !f) hb_say("--json %s: %s\n", o.json, strerror(errno));
  if (!f) return;
  fputs("{\"bench\": \"rails\", \"label\": ", f); /* the label and the rails as given: escaped */
  hb_json_str(f, o.label ? o.label : "");
  fprintf(f, ", \"dir\": \"%s\", \"rails_configured\": ", dir);
  hb_json_str(f, o.rails ? o.rails : "");
  fprintf(f,
          ", \"pass\": %s, \"op_bytes\": %zu, \"ops\": %" PRIu64 ", \"batch\": %" PRIu64
          ", \"depth\": %" PRIu64
          ", \"secs\": %.4f, \"gbps\": %.4f, \"GBps\": %.4f, \"lat_ms_p50\": %.3f, \"lat_ms_p99\": %.3f, "
          "\"lat_ms_max\": %.3f, \"verified_bytes\": %" PRIu64 ", ",
          pass ? "true" : "false", o.op_size, r->done, o.batch, o.depth, secs, gbit, gbit / 8.0,
          ls.p50_us / 1e3, ls.p99_us / 1e3, ls.max_us / 1e3, r->verified_bytes);
  rails_json_end(f, r);
  fclose(f);
}

static int run_initiator(void) {
  int rc = 1;
  struct run r = {0};
  char local[64];
  size_t lbytes = (size_t)(o.depth * o.batch + 1) * o.op_size;
  /* --local, else the first of --rails, else any */
  const char *at = o.local ? o.local : o.rails && strcmp(o.rails, "auto") != 0 ? o.rails : "0.0.0.0";
  snprintf(local, sizeof(local), "%.*s", (int)strcspn(at, o.local ? "" : ","), at);
  if (!(r.e = engine_up(local))) return 1;
  if (!(r.local = hb_map(lbytes))) goto out_engine;
  if (hb_reg(r.e, r.local, lbytes, &r.lh) != HIXL_SUCCESS) goto out_local;
  if (!hb_ok(HixlEngineConnect(r.e, o.connect, 20000), "HixlEngineConnect")) goto out_dereg;
  if (find_remote(&r) < 0 || (o.expect_rails && expect_rails(&r) < 0)) goto out_disconnect;
  r.nslots = r.remote_len / o.op_size;
  if (r.nslots < o.depth * o.batch) {
    hb_say("the target's %" PRIu64 " bytes hold %" PRIu64 " ops of %zu, fewer than depth x batch\n",
           r.remote_len, r.nslots, o.op_size);
    goto out_disconnect;
  }
  if (!(r.ref = hb_map(r.nslots * o.op_size))) goto out_disconnect;
  bench_pattern_fill(r.ref, r.nslots * o.op_size, o.read ? r.seed : r.seed ^ WRITE_SEED);
  install_signals();
  int lr = loop(&r);
  HixlTransferStatus ts;
  for (size_t s = 0; lr < 0 && s < o.depth; s++) /* after a failure: let the others end */
    if (r.req[s]) hb_wait_xfer(r.e, r.req[s], &ts);
  stats_write(&r, UINT64_MAX, lr == 0 ? "done" : "failed");
  print_result(&r, lr == 0);
  rc = lr == 0 ? 0 : 1;
  munmap(r.ref, r.nslots * o.op_size);
out_disconnect:
  HixlEngineDisconnect(r.e, o.connect, 1000);
out_dereg:
  HixlEngineDeregisterMem(r.e, r.lh);
out_local:
  munmap(r.local, lbytes);
out_engine:
  HixlEngineDestroy(r.e);
  return rc;
}

/* The options, then what the role needs (2, said, for the first thing missing), then the role. */
int main(int argc, char **argv) {
  hb_prog = PROG;
  hb_parse(argc, argv, opts,
           "Exit status: 0 when every op completed and verified, 1 otherwise, 2 for bad options.\n");
  bool ini = o.role == ROLE_INITIATOR;
  if (o.role == ROLE_NONE) return hb_say("--role target or --role initiator\n"), 2;
  if (o.role == ROLE_TARGET && !o.listen) return hb_say("a target needs --listen IP:PORT\n"), 2;
  if (ini && !o.connect) return hb_say("an initiator needs --connect IP:PORT\n"), 2;
  if (ini && !o.read && !o.write) return hb_say("an initiator needs --read or --write\n"), 2;
  if (ini && o.ops == 0 && o.seconds == 0) return hb_say("an initiator needs --ops N or --seconds S\n"), 2;
  if (o.read && o.write) return hb_say("--read or --write, not both\n"), 2;
  if (o.depth * o.batch > MAX_FLIGHT) return hb_say("--depth x --batch is at most 256 ops in flight\n"), 2;
  return o.role == ROLE_TARGET ? run_target() : run_initiator();
}
