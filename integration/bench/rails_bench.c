/* hixl-rails-bench: large READ or WRITE ops over an engine's rails (issue 31), one role
 * per process, so the two ends can live in two network namespaces (integration/rails/).
 *
 *   hixl-rails-bench --role target --listen IP:PORT [--rails LIST] [--buf-size SIZE]
 *                    [--seed N] [--ready-file FILE] [engine options]
 *   hixl-rails-bench --role initiator --connect IP:PORT [--local IP] [--rails LIST]
 *                    --read|--write [--op-size SIZE] [--ops N | --seconds S] [--batch N]
 *                    [--depth N] [--expect-rails N] [--json FILE] [--label TEXT]
 *                    [--stats-file FILE] [--no-progress] [engine options]
 *   engine options: [--transport NAME] [--stall-ms N] [--probe-ms N] [--timeout-ms N]
 *                   [--opt KEY=VALUE]...
 *
 * The target registers --buf-size bytes (default 256 MiB) filled with a pattern from
 * --seed, tagged "hixl-rails-bench seed=N" so the initiator finds the range and the
 * seed in the target's memory table; it says "ready" (stdout, and --ready-file) and
 * serves until SIGINT or SIGTERM.
 *
 * The initiator keeps --depth requests of --batch ops each in flight
 * (HixlEngineTransferAsync); op k uses the target's slot k mod (buffer / op size).
 * READ: each op's destination is poisoned before it is posted and compared with the
 * pattern when it completes. WRITE: op k writes the pattern of a second seed with its
 * own stamp (k) in every 4 KiB page; before a slot is written a second time (a pass
 * over the buffer) and at the end, the pipeline is drained and every slot written is
 * read back and compared, stamps included, so each write is checked byte for byte;
 * the read-backs are not timed. Any failed or wrong op ends the run, exit status 1.
 *
 * Prints GB/s and Gbit/s, the latency of the requests (submit to completion; max
 * included: a bound on a failover), the rails' counters (hixl_engine_rails), and with
 * --json FILE appends one JSON line. --stats-file FILE is rewritten (a rename, so a
 * reader never sees half of it) every 200 ms with ops, failures and the rails, for
 * scripts that act when a condition holds (the fault tests). Progress on stderr every
 * second unless --no-progress. SIGINT or SIGTERM ends an initiator's loop: the ops in
 * flight complete and are checked, then it reports. SIGUSR1 holds it: the ops in flight
 * complete, then none is posted (the stats file's phase says "held") until SIGUSR2. */
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
  int dir; /* -1 unset, else HIXL_READ or HIXL_WRITE */
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
       .dir = -1,
       .progress = true};

static volatile sig_atomic_t stop_flag, hold_flag;
static void on_stop(int sig) {
  (void)sig;
  stop_flag = 1;
}
static void on_hold(int sig) { hold_flag = sig == SIGUSR1; }

static const char *const roles[] = {"target", "initiator", NULL};
static const struct hb_opt opts[] = {
    {"--role", HB_CHOICE, &o.role, "target|initiator", "(required)", 0, 0, roles},
    {"--listen", HB_STR, &o.listen, "IP:PORT", "target: its engine's address", 0, 0, NULL},
    {"--connect", HB_STR, &o.connect, "IP:PORT", "initiator: the target's", 0, 0, NULL},
    {"--local", HB_STR, &o.local, "IP", "initiator: its engine's address", 0, 0, NULL},
    {"--rails", HB_STR, &o.rails, "LIST",
     "this engine's rail addresses, comma-separated, or auto (the Rails option)", 0, 0, NULL},
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
    {"--expect-rails", HB_U64, &o.expect_rails, "N",
     "fail unless the link has N rails, all up, after Connect", 0, 0, NULL},
    {"--json", HB_STR, &o.json, "FILE", "the result", 0, 0, NULL},
    {"--label", HB_STR, &o.label, "TEXT", "a label for the JSON", 0, 0, NULL},
    {"--stats-file", HB_STR, &o.stats_file, "FILE", "the rails' counters, rewritten as they move", 0, 0,
     NULL},
    {"--no-progress", HB_NOFLAG, &o.progress, NULL, "nothing on stderr but errors", 0, 0, NULL},
    {"--transport", HB_STR, &o.transport, "NAME", "default tcp; rdma rails need an RDMA device per rail", 0,
     0, NULL},
    {"--stall-ms", HB_U64, &o.stall_ms, "N", "RailStallMs", 0, 0, NULL},
    {"--probe-ms", HB_U64, &o.probe_ms, "N", "RailProbeMs", 0, 0, NULL},
    {"--timeout-ms", HB_U64, &o.timeout_ms, "N", "each request's timeout (default 30000)", 1, INT32_MAX,
     NULL},
    {"--opt", HB_FN, &o.x, "KEY=VALUE", "any other engine option; repeatable", 0, 0, hb_extra_add},
    {NULL, 0, NULL, NULL, NULL, 0, 0, NULL}};

static int parse_opts(int argc, char **argv) {
  hb_prog = PROG;
  hb_parse(argc, argv, opts,
           "Exit status: 0 when every op completed and verified, 1 otherwise, 2 for bad options.\n");
  o.dir = o.read ? HIXL_READ : o.write ? HIXL_WRITE : -1;
  const char *why = NULL;
  if (o.role == ROLE_NONE)
    why = "--role target or --role initiator";
  else if (o.role == ROLE_TARGET && !o.listen)
    why = "a target needs --listen IP:PORT";
  else if (o.role == ROLE_INITIATOR && !o.connect)
    why = "an initiator needs --connect IP:PORT";
  else if (o.role == ROLE_INITIATOR && o.dir < 0)
    why = "an initiator needs --read or --write";
  else if (o.role == ROLE_INITIATOR && o.ops == 0 && o.seconds == 0)
    why = "an initiator needs --ops N or --seconds S";
  else if (o.read && o.write)
    why = "--read or --write, not both";
  else if (o.depth * o.batch > MAX_FLIGHT)
    why = "--depth x --batch is at most 256 ops in flight";
  if (why) {
    hb_say("%s\n", why);
    return 2;
  }
  return 0;
}

/* Create and initialize an engine on addr with the options given; NULL when it cannot (said). */
static HixlEngine *engine_up(const char *addr) {
  HixlOption opt[HB_EXTRA_MAX + 4];
  char stall[24], probe[24];
  size_t n = 0;
  opt[n++] = (HixlOption){"Transport", o.transport};
  if (o.rails) opt[n++] = (HixlOption){"Rails", o.rails};
  if (o.stall_ms) {
    snprintf(stall, sizeof(stall), "%" PRIu64, o.stall_ms);
    opt[n++] = (HixlOption){"RailStallMs", stall};
  }
  if (o.probe_ms) {
    snprintf(probe, sizeof(probe), "%" PRIu64, o.probe_ms);
    opt[n++] = (HixlOption){"RailProbeMs", probe};
  }
  for (size_t i = 0; i < o.x.n; i++) opt[n++] = o.x.v[i];
  return hb_engine(addr, NULL, opt, n);
}

static void install_stop(void) {
  struct sigaction sa = {.sa_handler = on_stop};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  struct sigaction hs = {.sa_handler = on_hold};
  sigemptyset(&hs.sa_mask);
  sigaction(SIGUSR1, &hs, NULL);
  sigaction(SIGUSR2, &hs, NULL);
  signal(SIGPIPE, SIG_IGN);
}

/* ---- target ---- */

static int run_target(void) {
  int rc = 1;
  char tag[64];
  HixlMemHandle h = NULL;
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

struct slot {
  HixlTransferReq req; /* NULL: free */
  uint64_t first_op;   /* op number of its first op */
  uint64_t t0;         /* submitted at */
};

struct run {
  HixlEngine *e;
  HixlMemHandle lh;
  uint8_t *local; /* depth x batch op-sized slots */
  uint8_t *ref;   /* the target's buffer as it should read (READ) or the written pattern (WRITE) */
  uint8_t *back;  /* read-backs (WRITE) */
  uint64_t remote, remote_len, seed, nslots;
  uint64_t *last_writer; /* WRITE: op number + 1 that wrote each remote slot in this pass, 0 none */
  struct slot req[MAX_DEPTH];
  uint64_t *lat;
  size_t nlat;
  uint64_t submitted, done, verified_bytes, timed_ns, t_start, max_ns;
  uint64_t next_stats, next_prog, last_prog_done;
  uint64_t prog_ns_at; /* timed time at the last progress line */
  uint64_t t_phase;    /* the timed phase under way began here */
};

/* Timed time so far, the phase under way included. */
static uint64_t timed_now(const struct run *r, uint64_t now) { return r->timed_ns + (now - r->t_phase); }

static uint64_t slot_off(uint64_t op) { return (op % (o.depth * o.batch)) * o.op_size; }

/* The remote slot op k uses. */
static uint64_t rslot(const struct run *r, uint64_t op) { return op % r->nslots; }

/* The 8-byte stamp WRITE op k puts at the start of page p of its data. */
static uint64_t stamp(uint64_t op, uint64_t page) {
  return bench_pattern_word(WRITE_SEED, op) ^ (page * 0x9e3779b97f4a7c15ull);
}

/* The data WRITE op k carries, into dst: the written pattern of its remote slot, stamped. */
static void write_data(const struct run *r, uint64_t op, uint8_t *dst) {
  const uint8_t *src = r->ref + rslot(r, op) * o.op_size;
  memcpy(dst, src, o.op_size);
  for (uint64_t p = 0; p * PAGE + 8 <= o.op_size; p++) {
    uint64_t s = stamp(op, p);
    memcpy(dst + p * PAGE, &s, 8);
  }
}

/* Whether got holds what WRITE op k wrote; *bad the first wrong offset otherwise. */
static bool write_ok(const struct run *r, uint64_t op, const uint8_t *got, size_t *bad) {
  const uint8_t *want = r->ref + rslot(r, op) * o.op_size;
  for (uint64_t p = 0; p * PAGE < o.op_size; p++) {
    uint64_t at = p * PAGE, len = o.op_size - at < PAGE ? o.op_size - at : PAGE, head = 0;
    if (len >= 8) {
      uint64_t s = stamp(op, p);
      if (memcmp(got + at, &s, 8) != 0) {
        *bad = at;
        return false;
      }
      head = 8;
    }
    size_t b = 0;
    if (!bench_same(got + at + head, want + at + head, len - head, &b)) {
      *bad = at + head + b;
      return false;
    }
  }
  return true;
}

static int rails_now(const struct run *r, struct hixl_rail_info *ri, size_t *n) {
  size_t got = 0;
  if (!hb_ok(hixl_engine_rails(r->e, o.connect, ri, RAILS_CAP, &got), "hixl_engine_rails")) return -1;
  *n = got < RAILS_CAP ? got : RAILS_CAP;
  return 0;
}

/* s as a JSON string, quotes included */
static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

static void rails_json(FILE *f, const struct hixl_rail_info *ri, size_t n) {
  fprintf(f, "[");
  for (size_t k = 0; k < n; k++) {
    fprintf(f,
            "%s{\"rail\": %zu, \"local\": \"%s\", \"remote\": \"%s\", \"state\": \"%s\", \"bytes\": %" PRIu64
            ", \"ops\": %" PRIu64 ", \"failures\": %" PRIu64 ", \"retried\": %" PRIu64
            ", \"control\": %d, \"last_down\": ",
            k ? ", " : "", k, ri[k].local, ri[k].remote, ri[k].state, ri[k].bytes, ri[k].ops, ri[k].failures,
            ri[k].retried, ri[k].control);
    json_string(f, ri[k].last_down);
    fprintf(f, "}");
  }
  fprintf(f, "]");
}

static double gbps_of(uint64_t bytes, uint64_t ns) { return ns ? (double)bytes * 8.0 / (double)ns : 0.0; }

/* --stats-file: the state now, written whole then renamed over the file. */
static void stats_write(const struct run *r, const char *phase) {
  struct hixl_rail_info ri[RAILS_CAP];
  size_t n = 0;
  char tmp[4096];
  if (rails_now(r, ri, &n) < 0) n = 0;
  snprintf(tmp, sizeof(tmp), "%s.tmp", o.stats_file);
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  fprintf(f,
          "{\"phase\": \"%s\", \"ops\": %" PRIu64 ", \"verified_bytes\": %" PRIu64 ", \"max_ms\": %.3f, "
          "\"rails\": ",
          phase, r->done, r->verified_bytes, (double)r->max_ns / 1e6);
  rails_json(f, ri, n);
  fprintf(f, "}\n");
  if (fclose(f) == 0) rename(tmp, o.stats_file);
}

static void progress(struct run *r, uint64_t now) {
  if (o.stats_file && now >= r->next_stats) {
    stats_write(r, "running");
    r->next_stats = now + STATS_PERIOD;
  }
  if (!o.progress || now < r->next_prog) return;
  struct hixl_rail_info ri[RAILS_CAP];
  size_t n = 0;
  uint64_t tn = timed_now(r, now), dn = r->done - r->last_prog_done, dt = tn - r->prog_ns_at;
  hb_say("%.1f s: %" PRIu64 " ops, %.2f Gbit/s (last second %.2f), max %.1f ms",
         (double)(now - r->t_start) / 1e9, r->done, gbps_of(r->done * o.op_size, tn),
         gbps_of(dn * o.op_size, dt), (double)r->max_ns / 1e6);
  if (rails_now(r, ri, &n) == 0)
    for (size_t k = 0; k < n; k++)
      fprintf(stderr, "; rail %zu %s %" PRIu64 " MiB", k, ri[k].state, ri[k].bytes >> 20);
  fprintf(stderr, "\n");
  r->last_prog_done = r->done;
  r->prog_ns_at = tn;
  r->next_prog = now + PROG_PERIOD;
}

/* Post request slot s: batch ops from op number first. 0, or -1 (said). */
static int post(struct run *r, size_t s, uint64_t first) {
  HixlTransferOpDesc d[MAX_FLIGHT];
  for (uint64_t i = 0; i < o.batch; i++) {
    uint64_t op = first + i;
    uint8_t *lp = r->local + slot_off(op);
    if (o.dir == HIXL_READ)
      memset(lp, 0xA5, o.op_size); /* poison: a read that moves nothing cannot pass */
    else
      write_data(r, op, lp);
    d[i] = (HixlTransferOpDesc){.local_addr = (uintptr_t)lp,
                                .remote_addr = (uintptr_t)(r->remote + rslot(r, op) * o.op_size),
                                .len = o.op_size};
  }
  r->req[s].first_op = first;
  r->req[s].t0 = bench_now_ns();
  HixlStatus st = HixlEngineTransferAsync(r->e, o.connect, (HixlTransferOp)o.dir, d, o.batch,
                                          (int32_t)o.timeout_ms, NULL, &r->req[s].req);
  if (st != HIXL_SUCCESS) {
    r->req[s].req = NULL;
    hb_fail("HixlEngineTransferAsync", st);
    return -1;
  }
  return 0;
}

/* Request slot s completed: check it (READ), note the writers (WRITE). 0, or -1 (said). */
static int complete(struct run *r, size_t s, uint64_t now) {
  uint64_t first = r->req[s].first_op, ns = now - r->req[s].t0;
  r->req[s].req = NULL;
  if (r->nlat < MAX_REQS) r->lat[r->nlat++] = ns;
  if (ns > r->max_ns) r->max_ns = ns;
  for (uint64_t i = 0; i < o.batch; i++) {
    uint64_t op = first + i;
    if (o.dir == HIXL_READ) {
      size_t bad = 0;
      uint64_t off = rslot(r, op) * o.op_size;
      if (!bench_same(r->local + slot_off(op), r->ref + off, o.op_size, &bad)) {
        hb_say("READ op %" PRIu64 " (remote offset %" PRIu64 "): byte %zu is wrong\n", op, off, bad);
        return -1;
      }
      r->verified_bytes += o.op_size;
    } else {
      r->last_writer[rslot(r, op)] = op + 1;
    }
  }
  r->done += o.batch;
  return 0;
}

/* Wait for request slot s; 0, or -1 (said). */
static int wait_req(struct run *r, size_t s) {
  HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
  HixlStatus st = hb_wait_xfer(r->e, r->req[s].req, &ts);
  if (st == HIXL_SUCCESS && ts == HIXL_TRANSFER_COMPLETED) return complete(r, s, bench_now_ns());
  r->req[s].req = NULL;
  if (st != HIXL_SUCCESS) return hb_fail("HixlEngineGetTransferStatus", st), -1;
  hb_say("request of ops %" PRIu64 "..%" PRIu64 " ended %s after %.1f ms: %s\n", r->req[s].first_op,
         r->req[s].first_op + o.batch - 1, ts == HIXL_TRANSFER_TIMEOUT ? "TIMEOUT" : "FAILED",
         (double)(bench_now_ns() - r->req[s].t0) / 1e6, HixlGetLastErrorMessage());
  return -1;
}

/* WRITE: read back every remote slot written since the last check and compare. Untimed. */
static int write_check(struct run *r) {
  size_t chunk = (size_t)(o.depth * o.batch), nb = 0;
  uint64_t idx[MAX_FLIGHT];
  for (uint64_t sl = 0; sl <= r->nslots; sl++) {
    if (sl < r->nslots && r->last_writer[sl] != 0) idx[nb++] = sl;
    if (nb == 0 || (nb < chunk && sl < r->nslots)) continue;
    HixlTransferOpDesc d[MAX_FLIGHT];
    for (size_t i = 0; i < nb; i++) {
      memset(r->back + i * o.op_size, 0xA5, o.op_size);
      d[i] = (HixlTransferOpDesc){.local_addr = (uintptr_t)(r->back + i * o.op_size),
                                  .remote_addr = (uintptr_t)(r->remote + idx[i] * o.op_size),
                                  .len = o.op_size};
    }
    if (!hb_ok(HixlEngineTransferSync(r->e, o.connect, HIXL_READ, d, nb, (int32_t)o.timeout_ms),
               "reading back the written slots"))
      return -1;
    for (size_t i = 0; i < nb; i++) {
      size_t bad = 0;
      uint64_t op = r->last_writer[idx[i]] - 1;
      if (!write_ok(r, op, r->back + i * o.op_size, &bad)) {
        hb_say("WRITE op %" PRIu64 " (remote offset %" PRIu64 "): byte %zu reads back wrong\n", op,
               idx[i] * o.op_size, bad);
        return -1;
      }
      r->verified_bytes += o.op_size;
      r->last_writer[idx[i]] = 0;
    }
    nb = 0;
  }
  return 0;
}

static bool more(const struct run *r, uint64_t now) {
  if (stop_flag || hold_flag) return false;
  if (o.ops) return r->submitted < o.ops;
  return now - r->t_start < o.seconds * 1000000000ull;
}

/* Whether the next request would write a remote slot written since the last check. */
static bool pass_full(const struct run *r) {
  for (uint64_t i = 0; i < o.batch; i++)
    if (r->last_writer[rslot(r, r->submitted + i)] != 0) return true;
  for (size_t s = 0; s < o.depth; s++) /* ... or one still in flight */
    if (r->req[s].req)
      for (uint64_t i = 0; i < o.batch; i++)
        for (uint64_t j = 0; j < o.batch; j++)
          if (rslot(r, r->req[s].first_op + j) == rslot(r, r->submitted + i)) return true;
  return false;
}

/* The loop: keep depth requests in flight; 0, or -1 at the first failure (said). */
static int loop(struct run *r) {
  size_t s = 0; /* requests complete in order of slots: the oldest is waited for first */
  r->t_phase = r->t_start = bench_now_ns();
  r->next_prog = r->t_start + PROG_PERIOD;
  for (;;) {
    uint64_t now = bench_now_ns();
    bool go = more(r, now);
    if (go && o.dir == HIXL_WRITE && pass_full(r)) go = false; /* drain, then check */
    if (go && !r->req[s].req) {
      if (post(r, s, r->submitted) < 0) return -1;
      r->submitted += o.batch;
      s = (s + 1) % o.depth;
      continue;
    }
    if (r->req[s].req) {
      if (wait_req(r, s) < 0) return -1;
      s = (s + 1) % o.depth;
      progress(r, bench_now_ns());
      continue;
    }
    bool idle = true;
    for (size_t k = 0; k < o.depth; k++) idle = idle && !r->req[k].req;
    if (!idle) {
      s = (s + 1) % o.depth;
      continue;
    }
    r->timed_ns += bench_now_ns() - r->t_phase; /* nothing in flight: the timed phase ends */
    if (o.dir == HIXL_WRITE && write_check(r) < 0) return -1;
    while (hold_flag && !stop_flag) { /* SIGUSR1: nothing in flight until SIGUSR2 */
      uint64_t t = bench_now_ns();
      if (o.stats_file && t >= r->next_stats) {
        stats_write(r, "held");
        r->next_stats = t + STATS_PERIOD;
      }
      poll(NULL, 0, 20);
    }
    if (!more(r, bench_now_ns())) return 0;
    r->t_phase = bench_now_ns();
  }
}

/* The target's buffer from its memory table: its tag gives the seed. 0, or -1 (said). */
static int find_remote(struct run *r) {
  struct hixl_remote_mem *m = NULL;
  size_t n = 0;
  if (!hb_ok(hixl_engine_remote_mems(r->e, o.connect, (int32_t)o.timeout_ms, &m, &n),
             "hixl_engine_remote_mems"))
    return -1;
  int rc = -1;
  for (size_t i = 0; i < n; i++) {
    if (!m[i].tag || strncmp(m[i].tag, TAG_PREFIX, strlen(TAG_PREFIX)) != 0) continue;
    if (!bench_parse_u64(m[i].tag + strlen(TAG_PREFIX), &r->seed)) continue;
    r->remote = m[i].addr;
    r->remote_len = m[i].len;
    rc = 0;
    break;
  }
  free(m);
  if (rc < 0) hb_say("%s registered no buffer tagged \"" TAG_PREFIX "N\"\n", o.connect);
  return rc;
}

/* --expect-rails N: wait (a deadline, polling) until the link has N rails, all up. */
static int expect_rails(const struct run *r) {
  struct hixl_rail_info ri[RAILS_CAP];
  size_t n = 0, up = 0;
  uint64_t deadline = bench_now_ns() + 10000000000ull;
  do {
    if (rails_now(r, ri, &n) < 0) return -1;
    up = 0;
    for (size_t k = 0; k < n; k++) up += strcmp(ri[k].state, "up") == 0;
    if (n == o.expect_rails && up == n) return 0;
    if (o.expect_rails <= 1 && n == 0) return 0; /* one rail: the link itself */
    poll(NULL, 0, 20);
  } while (bench_now_ns() < deadline);
  hb_say("--expect-rails %" PRIu64 ": the link to %s has %zu rails, %zu up\n", o.expect_rails, o.connect, n,
         up);
  return -1;
}

static void print_result(const struct run *r, bool pass) {
  struct hixl_rail_info ri[RAILS_CAP];
  size_t n = 0;
  if (rails_now(r, ri, &n) < 0) n = 0;
  uint64_t bytes = r->done * o.op_size;
  double gbit = gbps_of(bytes, r->timed_ns), secs = (double)r->timed_ns / 1e9;
  uint64_t *lat = malloc((r->nlat ? r->nlat : 1) * sizeof(*lat));
  struct bench_stats ls = {0, 0, 0, 0, 0};
  if (lat) {
    memcpy(lat, r->lat, r->nlat * sizeof(*lat));
    ls = bench_stats_ns(lat, r->nlat);
    free(lat);
  }
  const char *dir = o.dir == HIXL_READ ? "read" : "write";
  printf(PROG ": %s %" PRIu64 " ops of %zu bytes (batch %" PRIu64 ", depth %" PRIu64 ") to %s: %s\n", dir,
         r->done, o.op_size, o.batch, o.depth, o.connect, pass ? "every byte verified" : "FAILED");
  printf("  %.3f GB/s = %.3f Gbit/s over %.2f s; request latency p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
         gbit / 8.0, gbit, secs, ls.p50_us / 1e3, ls.p99_us / 1e3, ls.max_us / 1e3);
  if (n == 0) printf("  one link (no rails)\n");
  for (size_t k = 0; k < n; k++)
    printf("  rail %zu %s -> %s %s%s: %" PRIu64 " bytes, %" PRIu64 " ops, %" PRIu64 " failures, %" PRIu64
           " retried\n",
           k, ri[k].local[0] ? ri[k].local : "*", ri[k].remote, ri[k].state,
           ri[k].control ? " (control)" : "", ri[k].bytes, ri[k].ops, ri[k].failures, ri[k].retried);
  fflush(stdout);
  if (!o.json) return;
  FILE *f = fopen(o.json, "a");
  if (!f) {
    hb_say("--json %s: %s\n", o.json, strerror(errno));
    return;
  }
  fprintf(f,
          "{\"bench\": \"rails\", \"label\": \"%s\", \"dir\": \"%s\", \"rails_configured\": \"%s\", "
          "\"pass\": %s, "
          "\"op_bytes\": %zu, \"ops\": %" PRIu64 ", \"batch\": %" PRIu64 ", \"depth\": %" PRIu64
          ", \"secs\": %.4f, \"gbps\": %.4f, \"GBps\": %.4f, \"lat_ms_p50\": %.3f, \"lat_ms_p99\": %.3f, "
          "\"lat_ms_max\": %.3f, \"verified_bytes\": %" PRIu64 ", \"rails\": ",
          o.label ? o.label : "", dir, o.rails ? o.rails : "", pass ? "true" : "false", o.op_size, r->done,
          o.batch, o.depth, secs, gbit, gbit / 8.0, ls.p50_us / 1e3, ls.p99_us / 1e3, ls.max_us / 1e3,
          r->verified_bytes);
  rails_json(f, ri, n);
  fprintf(f, "}\n");
  fclose(f);
}

static int run_initiator(void) {
  int rc = 1;
  struct run r = {0};
  char local[64];
  size_t lbytes = (size_t)(o.depth * o.batch) * o.op_size;
  if (o.local) {
    snprintf(local, sizeof(local), "%s", o.local);
  } else if (o.rails && strcmp(o.rails, "auto") != 0) {
    snprintf(local, sizeof(local), "%.*s", (int)strcspn(o.rails, ","), o.rails);
  } else {
    snprintf(local, sizeof(local), "0.0.0.0");
  }
  if (!(r.e = engine_up(local))) return 1;
  if (!(r.local = hb_map(lbytes))) goto out_engine;
  HixlMemDesc md = {.addr = (uintptr_t)r.local, .len = lbytes};
  if (!hb_ok(HixlEngineRegisterMem(r.e, &md, HIXL_MEM_HOST, &r.lh), "HixlEngineRegisterMem")) goto out_local;
  if (!hb_ok(HixlEngineConnect(r.e, o.connect, 20000), "HixlEngineConnect")) goto out_dereg;
  if (find_remote(&r) < 0 || (o.expect_rails && expect_rails(&r) < 0)) goto out_disconnect;
  r.nslots = r.remote_len / o.op_size;
  if (r.nslots < o.depth * o.batch) {
    hb_say("the target's %" PRIu64 " bytes hold %" PRIu64 " ops of %zu, fewer than depth x batch\n",
           r.remote_len, r.nslots, o.op_size);
    goto out_disconnect;
  }
  if (!(r.ref = hb_map(r.nslots * o.op_size))) goto out_disconnect;
  bench_pattern_fill(r.ref, r.nslots * o.op_size, o.dir == HIXL_READ ? r.seed : r.seed ^ WRITE_SEED);
  if (o.dir == HIXL_WRITE) {
    r.back = hb_map(lbytes);
    r.last_writer = calloc(r.nslots, sizeof(*r.last_writer));
    if (!r.back || !r.last_writer) goto out_ref;
    /* the read-backs land here: registered as well */
  }
  HixlMemHandle bh = NULL;
  if (r.back) {
    HixlMemDesc bd = {.addr = (uintptr_t)r.back, .len = lbytes};
    if (!hb_ok(HixlEngineRegisterMem(r.e, &bd, HIXL_MEM_HOST, &bh), "HixlEngineRegisterMem (read-backs)"))
      goto out_ref;
  }
  if (!(r.lat = malloc(MAX_REQS * sizeof(*r.lat)))) goto out_back;
  install_stop();
  int lr = loop(&r);
  HixlTransferStatus ts;
  for (size_t s = 0; lr < 0 && s < o.depth; s++) /* after a failure: let the others end */
    if (r.req[s].req) hb_wait_xfer(r.e, r.req[s].req, &ts);
  if (o.stats_file) stats_write(&r, lr == 0 ? "done" : "failed");
  print_result(&r, lr == 0);
  rc = lr == 0 ? 0 : 1;
  free(r.lat);
out_back:
  if (bh) HixlEngineDeregisterMem(r.e, bh);
out_ref:
  free(r.last_writer);
  if (r.back) munmap(r.back, lbytes);
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

int main(int argc, char **argv) {
  int rc = parse_opts(argc, argv);
  if (rc) return rc;
  if (o.role == ROLE_TARGET) {
    install_stop();
    return run_target();
  }
  return run_initiator();
}
