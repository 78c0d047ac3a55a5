/* hixl-bench: READ / WRITE bandwidth and latency sweeps between two hixl engines (or HIXL's
 * HixlCS* client and server). The target (the test's server) registers a buffer, sends the
 * initiator its address (the engine API cannot look a peer's buffer up) and length, and
 * serves; the initiator sweeps block x batch x op. Each point: its first iteration checked
 * byte for byte, warm-up, then measured; method, units and staging: docs/performance.md. */
#include <inttypes.h>

#include "harness.h"

#define BENCH_TARGET_MAX_WAIT_MS 3600000 /* target lives at most this long for one initiator */
#define BENCH_MAX_ITERS          10000000ull
#define BENCH_MAX_WINDOW         1024
#define BENCH_DEFAULT_MEM_CAP    ((size_t)1 << 30)
#define BENCH_CS_TAG             "bench" /* tag of the target buffer in --api cs */

/* api is the last column so that readers of the older columns by position still work. */
#define BENCH_CSV_HEADER                                                                                     \
  "tool,mode,op,block_size,batch,window,iters,bytes,seconds,gbps,avg_us,p50_us,p99_us,min_us,max_us,"        \
  "verified,api"

enum bench_api { API_ENGINE, API_CS };
enum bench_unreg { UNREG_NONE = 0, UNREG_LOCAL = 1, UNREG_REMOTE = 2, UNREG_BOTH = 3 }; /* bits */

static const char *const apis[] = {"engine", "cs", NULL};
static const char *const transports[] = {"auto", "tcp", "rdma", "shm", NULL};
static const char *const op_choices[] = {"read", "write", "both", NULL}; /* HIXL_READ, HIXL_WRITE, both */
static const char *const op_names[] = {"READ", "WRITE"};
static const char *const unregs[] = {"none", "local", "remote", "both", NULL};

static struct {
  int api;               /* enum bench_api */
  const char *transport; /* --transport: NULL leaves the engine's default (auto) */
  int transport_idx;     /* --transport: index in transports[], -1 none */
  char peer[128];        /* target engine "ip:port" */
  char local[128];       /* initiator engine "ip" */
  int op_idx;            /* --op: index in op_choices[] */
  size_t blocks[BENCH_MAX_LIST], n_blocks, batches[BENCH_MAX_LIST], n_batches;
  size_t total;           /* bytes per point, when iters is 0 */
  uint64_t iters;         /* iterations per point; 0: from total */
  uint64_t warmup;        /* UINT64_MAX: automatic */
  double max_seconds;     /* per point */
  bool async, latency;    /* latency: only the small READ round trip test */
  size_t window;          /* outstanding async requests */
  uint64_t lat_iters;     /* round trips of --latency */
  size_t lat_size;        /* bytes per latency READ */
  const char *csv, *json; /* result files */
  bool progress;          /* progress lines on stderr */
  int cpu[2];             /* --pin: initiator, target; -1 none */
  struct hb_extra x;      /* --opt: to both engines, in order given */
  int unreg;              /* --unregistered: enum bench_unreg bits */
  char peer_ip[64];       /* --api cs: --peer split */
  uint16_t peer_port;
} o = {.local = "127.0.0.1",
       .transport_idx = -1,
       .op_idx = 2,
       .batches = {1},
       .n_batches = 1,
       .total = 256u << 20,
       .warmup = UINT64_MAX,
       .max_seconds = 3.0,
       .window = 4,
       .lat_iters = 20000,
       .lat_size = 64,
       .progress = true,
       .cpu = {-1, -1}};

struct point_result { /* a point's own figures; its api, mode and window are the run's */
  const char *op;     /* "READ" / "WRITE" */
  size_t block, batch;
  uint64_t iters, bytes;
  double seconds, gbps;
  struct bench_stats st;
  const char *verified; /* "yes" / "no" */
};

struct bench_ctx {
  HixlEngine *eng;           /* --api engine */
  HixlClientHandle cli;      /* --api cs */
  uint8_t *lbuf, *vbuf;      /* measured and verify region, registered unless --unregistered local */
  size_t span;               /* usable bytes of lbuf, vbuf and the remote buffer */
  uintptr_t rbase;           /* remote buffer */
  HixlTransferOpDesc *descs; /* window * max batch, --api engine */
  HixlOneSideOpDesc *cdescs; /* the same ops for --api cs, built beside descs */
  uint64_t *lat;             /* per-iteration latencies, as many as the longest point's */
  struct point_result *res;  /* as many as the points */
  size_t n_res;
};

/* ------------------------------------------------------------------- sizing */

/* The largest of v[0..n) (n > 0), or with max false the smallest. */
static size_t extreme(const size_t *v, size_t n, bool max) {
  size_t m = v[0];
  for (size_t i = 1; i < n; i++) m = (v[i] > m) == max ? v[i] : m;
  return m;
}

/* Bytes each side registers: enough for the largest point, capped; one block larger
 * than the cap still fits. */
static size_t needed_span(void) {
  if (o.latency) return o.lat_size < 4096 ? 4096 : o.lat_size;
  size_t maxb = extreme(o.blocks, o.n_blocks, true), maxn = extreme(o.batches, o.n_batches, true);
  size_t win = o.async ? o.window : 1, need = BENCH_DEFAULT_MEM_CAP;
  if (maxn <= SIZE_MAX / win && maxn * win <= need / maxb) need = maxb * maxn * win;
  return need < maxb ? maxb : need;
}

static int32_t call_timeout(size_t bytes) {
  uint64_t ms = 10000u + bytes / 100000u;
  return ms > INT32_MAX ? INT32_MAX : (int32_t)ms;
}

static uint64_t point_iters(size_t bytes_per_iter) {
  uint64_t n = o.iters ? o.iters : (o.total + bytes_per_iter - 1) / bytes_per_iter;
  n = o.iters || n >= 20 ? n : 20;
  return n > BENCH_MAX_ITERS ? BENCH_MAX_ITERS : n;
}

static uint64_t point_warmup(uint64_t iters) {
  if (o.warmup != UINT64_MAX) return o.warmup;
  return iters < 10 ? 1 : (iters > 1000 ? 100 : iters / 10);
}

/* ------------------------------------------------------------------- target */

/* The target serves an unregistered buffer and sets StagingUnregistered=on itself. */
static bool target_sets_unreg(void) {
  return (o.unreg & UNREG_REMOTE) != 0 && hb_extra_get(&o.x, "StagingUnregistered") == NULL;
}

/* The CS endpoint protocol for --transport (transports[]'s order); the CS API has no "auto": tcp. */
static HixlEndpointProtocol cs_protocol(void) {
  static const HixlEndpointProtocol p[] = {HIXL_EP_PROTOCOL_TCP, HIXL_EP_PROTOCOL_TCP, HIXL_EP_PROTOCOL_RDMA,
                                           HIXL_EP_PROTOCOL_SHM};
  return o.transport_idx >= 0 ? p[o.transport_idx] : HIXL_EP_PROTOCOL_TCP;
}

/* --api cs: a HixlCSServer on --peer whose one registration is the buffer, tagged "bench". */
static int target_cs(int ctrl, uint8_t *buf, size_t span) {
  HixlServerHandle srv = NULL;
  MemHandle mh = NULL;
  int rc = 1;
  EndpointDesc ep = {.protocol = cs_protocol()};
  HixlServerDesc sd = {
      .server_ip = o.peer_ip, .server_port = o.peer_port, .endpoint_list = &ep, .endpoint_list_num = 1};
  HcommMem mem = {.type = HCCL_MEM_TYPE_HOST, .addr = buf, .size = span};
  if (!hb_ok(HixlCSServerCreate(&sd, NULL, &srv), "target: HixlCSServerCreate")) return 1;
  if (!hb_ok(HixlCSServerRegMem(srv, BENCH_CS_TAG, &mem, &mh), "target: HixlCSServerRegMem"))
    goto out_destroy;
  if (!hb_ok(HixlCSServerListen(srv, 0), "target: HixlCSServerListen")) goto out_unreg;
  if (hb_ready(ctrl, (uint64_t[]){0, span}, 2)) rc = hb_serve(ctrl, "DONE", BENCH_TARGET_MAX_WAIT_MS);
out_unreg:
  if (!hb_ok(HixlCSServerUnregMem(srv, mh), "target: HixlCSServerUnregMem")) rc = 1;
out_destroy:
  if (!hb_ok(HixlCSServerDestroy(srv), "target: HixlCSServerDestroy")) rc = 1;
  return rc;
}

/* --api engine: an engine on --peer with the buffer registered (unless --unregistered
 * remote: StagingUnregistered serves it), its options every --opt and that one. */
static int target_engine(int ctrl, uint8_t *buf, size_t span) {
  HixlOption opt[HB_EXTRA_MAX + 1];
  HixlMemHandle mh = NULL;
  bool reg = (o.unreg & UNREG_REMOTE) == 0;
  size_t n = o.x.n;
  int rc = 1;
  memcpy(opt, o.x.v, n * sizeof(*opt));
  if (target_sets_unreg()) opt[n++] = (HixlOption){.key = "StagingUnregistered", .value = "on"};
  HixlEngine *eng = hb_engine(o.peer, o.transport, opt, n);
  if (eng == NULL) return 1;
  if (!reg || hb_reg(eng, buf, span, &mh) == HIXL_SUCCESS) {
    if (hb_ready(ctrl, (uint64_t[]){(uintptr_t)buf, span}, 2))
      rc = hb_serve(ctrl, "DONE", BENCH_TARGET_MAX_WAIT_MS);
    if (reg && !hb_ok(HixlEngineDeregisterMem(eng, mh), "target: HixlEngineDeregisterMem")) rc = 1;
  }
  if (!hb_ok(HixlEngineFinalize(eng), "target: HixlEngineFinalize")) rc = 1;
  HixlEngineDestroy(eng);
  return rc;
}

/* The target: its buffer holds the pattern; served until the initiator is done. */
static int target(int ctrl) {
  size_t span = needed_span();
  uint8_t *buf = bench_pin_cpu(o.cpu[1]) ? hb_map(span) : NULL;
  if (buf == NULL) return 1;
  bench_pattern_fill(buf, span, 0x7a7a7a7bull); /* the target's own pattern */
  int rc = o.api == API_CS ? target_cs(ctrl, buf, span) : target_engine(ctrl, buf, span);
  munmap(buf, span);
  return rc;
}

/* ---------------------------------------------------------------- transfers */

/* Descriptors for request w of a point, at index first of the descriptor arrays:
 * slots (w * batch + k) mod nslots. Both APIs' forms are built here, outside the
 * timed loops, so neither mode pays a conversion the other does not. */
static void build_descs(const struct bench_ctx *c, size_t first, uintptr_t local_base, size_t block,
                        size_t batch, size_t w) {
  size_t nslots = c->span / block;
  for (size_t k = 0; k < batch; k++) {
    size_t off = ((w * batch + k) % nslots) * block;
    HixlTransferOpDesc *d = &c->descs[first + k];
    *d = (HixlTransferOpDesc){.local_addr = local_base + off, .remote_addr = c->rbase + off, .len = block};
    c->cdescs[first + k] = (HixlOneSideOpDesc){
        .local_buf = (void *)d->local_addr, .remote_buf = (void *)d->remote_addr, .len = block};
  }
}

/* One batch of the n ops at index first: synchronous without handle (TransferSync or
 * Batch{Put,Get}Sync), else started, *handle its HixlTransferReq or CompleteHandle (the CS
 * API has no per-batch timeout: its batches end TIMEOUT after HIXL_CS_BATCH_TIMEOUT_MS).
 * False after saying which call failed ("HixlEngineTransferSync(READ, verify)"). */
static bool xfer(struct bench_ctx *c, HixlTransferOp op, size_t first, size_t n, int32_t tmo, void **handle,
                 const char *what) {
  const HixlOneSideOpDesc *cd = &c->cdescs[first];
  HixlTransferReq req = NULL;
  HixlStatus st;
  char w[96];
  if (o.api == API_ENGINE && handle == NULL)
    st = HixlEngineTransferSync(c->eng, o.peer, op, &c->descs[first], n, tmo);
  else if (o.api == API_ENGINE)
    st = HixlEngineTransferAsync(c->eng, o.peer, op, &c->descs[first], n, tmo, NULL, &req);
  else if (handle == NULL)
    st = op == HIXL_READ ? HixlCSClientBatchGetSync(c->cli, (uint32_t)n, cd, (uint32_t)tmo)
                         : HixlCSClientBatchPutSync(c->cli, (uint32_t)n, cd, (uint32_t)tmo);
  else
    st = op == HIXL_READ ? HixlCSClientBatchGetAsync(c->cli, (uint32_t)n, cd, handle)
                         : HixlCSClientBatchPutAsync(c->cli, (uint32_t)n, cd, handle);
  if (o.api == API_ENGINE && handle) *handle = req;
  if (st == HIXL_SUCCESS) return true;
  int k = o.api == API_CS ? snprintf(w, sizeof(w), "HixlCSClientBatch%s%s", op == HIXL_READ ? "Get" : "Put",
                                     handle ? "Async" : "Sync")
                          : snprintf(w, sizeof(w), "HixlEngineTransfer%s", handle ? "Async" : "Sync");
  if (!handle)
    snprintf(w + k, sizeof(w) - (size_t)k, "(%s%s%s)", op_names[op], what ? ", " : "", what ? what : "");
  return hb_fail(w, st);
}

/* Where an asynchronous batch stands, in the engine's terms. */
static HixlStatus xfer_status(struct bench_ctx *c, void *handle, HixlTransferStatus *ts) {
  HixlCompleteStatus cs = HIXL_COMPLETE_STATUS_WAITING;
  if (o.api == API_ENGINE) return HixlEngineGetTransferStatus(c->eng, handle, ts);
  HixlStatus st = HixlCSClientQueryCompleteStatus(c->cli, handle, &cs);
  *ts = cs == HIXL_COMPLETE_STATUS_WAITING     ? HIXL_TRANSFER_WAITING
        : cs == HIXL_COMPLETE_STATUS_COMPLETED ? HIXL_TRANSFER_COMPLETED
        : cs == HIXL_COMPLETE_STATUS_TIMEOUT   ? HIXL_TRANSFER_TIMEOUT
                                               : HIXL_TRANSFER_FAILED;
  return st;
}

/* Check a point's data path: a fresh pattern goes out by WRITE and comes back by READ,
 * through the very descriptors the point measures (op) plus the opposite op on the
 * verify region. Returns 1 verified, 0 mismatch, -1 transfer error. */
static int verify_point(struct bench_ctx *c, HixlTransferOp op, size_t block, size_t batch, size_t window,
                        uint64_t seed) {
  size_t nslots = c->span / block;
  size_t used = (batch * window < nslots ? batch * window : nslots) * block;
  /* src holds the pattern, dst gets it back: the measured region is WRITE's src, READ's dst */
  uint8_t *src = op == HIXL_WRITE ? c->lbuf : c->vbuf, *dst = op == HIXL_WRITE ? c->vbuf : c->lbuf;
  bench_pattern_fill(src, used, seed);
  memset(dst, 0, used);
  for (size_t w = 0; w < 2 * window; w++) { /* every request's slots: WRITE from src, then READ into dst */
    HixlTransferOp d = w < window ? HIXL_WRITE : HIXL_READ;
    build_descs(c, 0, (uintptr_t)(d == HIXL_WRITE ? src : dst), block, batch, w % window);
    if (!xfer(c, d, 0, batch, call_timeout(block * batch), NULL, "verify")) return -1;
  }
  size_t bad = 0;
  if (!bench_same(src, dst, used, &bad)) {
    hb_say("VERIFY FAILED: %s block %zu batch %zu: byte %zu (slot %zu, offset %zu in the op) is 0x%02x, "
           "expected 0x%02x\n",
           op_names[op], block, batch, bad, bad / block, bad % block, dst[bad], src[bad]);
    return 0;
  }
  return 1;
}

/* count batches of op, each timed from its call to its completion into lat (when not
 * NULL: not a warm-up), stopping early past limit_ns (0: never); the number done into *done. Sync:
 * one call at a time, the same batch each time (like ib_write_bw); async: `window`
 * requests in flight, each on its own slots. */
static bool run_phase(struct bench_ctx *c, bool async, HixlTransferOp op, size_t block, size_t batch,
                      uint64_t count, uint64_t *lat, uint64_t limit_ns, uint64_t *done) {
  struct {
    void *req; /* HixlTransferReq, or CompleteHandle with --api cs; NULL: none in flight */
    uint64_t t_submit;
  } s[BENCH_MAX_WINDOW] = {0};
  size_t window = async ? o.window : 1, busy = 0;
  int32_t tmo = call_timeout(block * batch);
  uint64_t submitted = 0;
  bool ok = true;
  for (size_t w = 0; w < window; w++) build_descs(c, w * batch, (uintptr_t)c->lbuf, block, batch, w);
  for (*done = 0; !async && *done < count;) {
    uint64_t t0 = bench_now_ns();
    if (!xfer(c, op, 0, batch, tmo, NULL, lat ? NULL : "warm-up")) return false;
    uint64_t t = bench_now_ns();
    if (lat) lat[*done] = t - t0;
    ++*done;
    if (limit_ns != 0 && t > limit_ns) break;
  }
  if (!async) return true;
  /* Bound an async phase: the time limit plus one timeout for the stragglers. */
  uint64_t hard =
      (limit_ns ? limit_ns : bench_now_ns() + 3600ull * 1000000000ull) + (uint64_t)tmo * 2000000ull;
  for (;;) {
    bool submit = limit_ns == 0 || bench_now_ns() <= limit_ns;
    for (size_t w = 0; w < window && submit && ok && submitted < count; w++) {
      if (s[w].req) continue;
      s[w].t_submit = bench_now_ns();
      if (!(ok = xfer(c, op, w * batch, batch, tmo, &s[w].req, NULL))) break;
      submitted++;
      busy++;
    }
    if (busy == 0) break;
    bool progressed = false;
    for (size_t w = 0; w < window; w++) {
      HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
      if (!s[w].req) continue;
      HixlStatus st = xfer_status(c, s[w].req, &ts);
      if (st == HIXL_SUCCESS && ts == HIXL_TRANSFER_WAITING) continue;
      s[w].req = NULL; /* an unknown state is not polled again */
      busy--;
      progressed = true;
      if (st == HIXL_SUCCESS && ts == HIXL_TRANSFER_COMPLETED) {
        if (lat) lat[*done] = bench_now_ns() - s[w].t_submit;
        ++*done;
        continue;
      }
      ok = false; /* a failed poll is said by hb_ok, a request that ended badly here */
      if (hb_ok(st, o.api == API_CS ? "HixlCSClientQueryCompleteStatus" : "HixlEngineGetTransferStatus"))
        hb_say("async %s %s request ended %s (%s)\n", apis[o.api], op_names[op],
               ts == HIXL_TRANSFER_TIMEOUT ? "TIMEOUT" : "FAILED", HixlGetLastErrorMessage());
    }
    if (!progressed && bench_now_ns() > hard) {
      hb_say("%zu async requests still WAITING past their timeout; giving up\n", busy);
      return false; /* leaves requests behind; the caller exits */
    }
    if (!progressed) sched_yield();
  }
  return ok;
}

/* A point: warm-up, then the measured phase, its figures into r. */
static bool run_point(struct bench_ctx *c, bool async, HixlTransferOp op, size_t block, size_t batch,
                      uint64_t iters, uint64_t warmup, struct point_result *r) {
  if (warmup > 0 && !run_phase(c, async, op, block, batch, warmup, NULL, 0, &r->iters)) return false;
  uint64_t t0 = bench_now_ns();
  if (!run_phase(c, async, op, block, batch, iters, c->lat, t0 + (uint64_t)(o.max_seconds * 1e9), &r->iters))
    return false;
  r->seconds = (double)(bench_now_ns() - t0) / 1e9;
  r->bytes = r->iters * block * batch;
  r->gbps = r->seconds > 0 ? (double)r->bytes / r->seconds / 1e9 : 0;
  r->st = bench_stats_ns(c->lat, r->iters);
  return true;
}

/* --------------------------------------------------------------------- runs */

/* The sweep: block sizes x batch sizes x ops (WRITE before READ). Returns 0 ok, 1 verify
 * or transfer failure. */
static int run_sweep(struct bench_ctx *c) {
  static const HixlTransferOp opv[] = {HIXL_WRITE, HIXL_READ};
  size_t op0 = o.op_idx == HIXL_READ, n_ops = o.op_idx == 2 ? 2 : 1;
  size_t window = o.async ? o.window : 1, total_points = o.n_blocks * o.n_batches * n_ops;
  uint64_t sweep_t0 = bench_now_ns();
  int rc = 0;
  printf("%-6s %10s %6s %9s %9s %10s %10s %10s  %s\n", "op", "block", "batch", "iters", "GB/s", "avg_us",
         "p50_us", "p99_us", "verified");
  for (size_t p = 0; p < total_points; p++) {
    size_t block = o.blocks[p / (o.n_batches * n_ops)], batch = o.batches[p / n_ops % o.n_batches];
    HixlTransferOp op = opv[op0 + p % n_ops];
    uint64_t iters = point_iters(block * batch);
    if (o.progress)
      hb_say("[%zu/%zu] %s block %zu batch %zu%s: up to %" PRIu64 " iterations (%.1f s so far)\n", p + 1,
             total_points, op_names[op], block, batch, o.async ? " async" : "", iters,
             (double)(bench_now_ns() - sweep_t0) / 1e9);
    int v = verify_point(c, op, block, batch, window, p + 2);
    struct point_result r = {op_names[op], block, batch, .verified = v == 1 ? "yes" : "no"};
    if (v < 0) return 1;
    rc |= v == 0;
    if (!run_point(c, o.async, op, block, batch, iters, point_warmup(iters), &r)) return 1;
    printf("%-6s %10zu %6zu %9" PRIu64 " %9.3f %10.2f %10.2f %10.2f  %s\n", r.op, r.block, r.batch, r.iters,
           r.gbps, r.st.avg_us, r.st.p50_us, r.st.p99_us, r.verified);
    fflush(stdout);
    c->res[c->n_res++] = r;
  }
  if (o.progress)
    hb_say("sweep of %zu points done in %.1f s\n", total_points, (double)(bench_now_ns() - sweep_t0) / 1e9);
  return rc;
}

/* Small READ round trips, one TransferSync (cs: BatchGetSync) of one op each: a sync
 * point of --lat-size, batch 1 (its seconds: the round trips' wall time). */
static int run_latency(struct bench_ctx *c) {
  uint64_t warmup = o.warmup != UINT64_MAX ? o.warmup : 1000;
  struct point_result r = {"READ", o.lat_size, 1, .verified = "yes"};
  if (verify_point(c, HIXL_READ, o.lat_size, 1, 1, 1) != 1) return 1;
  if (o.progress)
    hb_say("latency: %" PRIu64 " READ round trips of %zu B after %" PRIu64 " warm-up\n", o.lat_iters,
           o.lat_size, warmup);
  if (!run_point(c, false, HIXL_READ, o.lat_size, 1, o.lat_iters, warmup, &r)) return 1;
  printf("latency: %zu B READ round trip (api %s), %" PRIu64 " iterations: avg %.2f us, p50 %.2f us, "
         "p99 %.2f us, min %.2f us, max %.2f us (verified: %s)\n",
         o.lat_size, apis[o.api], r.iters, r.st.avg_us, r.st.p50_us, r.st.p99_us, r.st.min_us, r.st.max_us,
         r.verified);
  c->res[c->n_res++] = r;
  return 0;
}

/* A point's fields in the CSV's order (tool first, api last); the JSON's without tool. */
static size_t point_fields(const struct point_result *r, struct hb_field *f) {
  const struct hb_field v[] = {HB_FS("tool", NULL, "hixl-bench"),
                               HB_FS("mode", NULL, o.latency ? "latency" : (o.async ? "async" : "sync")),
                               HB_FS("op", NULL, r->op),
                               HB_FU("block_size", NULL, r->block),
                               HB_FU("batch", NULL, r->batch),
                               HB_FU("window", NULL, o.async && !o.latency ? o.window : 1),
                               HB_FU("iters", NULL, r->iters),
                               HB_FU("bytes", NULL, r->bytes),
                               HB_FD("seconds", NULL, "%.6f", NULL, r->seconds),
                               HB_FD("gbps", NULL, "%.4f", NULL, r->gbps),
                               HB_FD("avg_us", NULL, "%.3f", NULL, r->st.avg_us),
                               HB_FD("p50_us", NULL, "%.3f", NULL, r->st.p50_us),
                               HB_FD("p99_us", NULL, "%.3f", NULL, r->st.p99_us),
                               HB_FD("min_us", NULL, "%.3f", NULL, r->st.min_us),
                               HB_FD("max_us", NULL, "%.3f", NULL, r->st.max_us),
                               HB_FS("verified", NULL, r->verified),
                               HB_FS("api", NULL, apis[o.api])};
  memcpy(f, v, sizeof(v));
  return HB_NF(v);
}

/* The engine options beyond Transport, "K=V K=V" ("none"), and the one the bench adds on
 * the target. */
static const char *options_text(void) {
  static char buf[HB_EXTRA_MAX * 128];
  size_t n = 0, cap = sizeof(buf);
  for (size_t i = 0; i < o.x.n && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s=%s", n > 0 ? " " : "", o.x.v[i].key, o.x.v[i].value);
  if (target_sets_unreg() && n < cap)
    n += (size_t)snprintf(buf + n, cap - n, "%starget StagingUnregistered=on", n > 0 ? " " : "");
  return n ? buf : "none";
}

/* The points as CSV rows (--csv, appended) and as --json's results (without tool). */
static bool write_results(const struct bench_ctx *c) {
  struct hb_field rec[24];
  FILE *f = o.csv && c->n_res ? hb_csv(o.csv, BENCH_CSV_HEADER) : NULL;
  for (size_t i = 0; f && i < c->n_res; i++)
    hb_emit(NULL, NULL, f, i, c->n_res, rec, point_fields(&c->res[i], rec));
  bool ok = !(o.csv && c->n_res) || (f && fclose(f) == 0);
  if (!o.json) return ok;
  f = hb_json_open(o.json, "hixl-bench");
  fprintf(f, "  \"api\": \"%s\",\n  \"transport\": \"%s\",\n", apis[o.api],
          o.transport ? o.transport : "default");
  if (o.api == API_ENGINE)
    fprintf(f, "  \"engine_options\": \"%s\",\n  \"unregistered\": \"%s\",\n", options_text(),
            unregs[o.unreg]);
  fprintf(f, "  \"peer\": \"%s\",\n  \"registered_bytes\": %zu,\n  \"results\": [\n", o.peer, c->span);
  for (size_t i = 0; i < c->n_res; i++)
    hb_emit(NULL, f, NULL, i, c->n_res, rec + 1, point_fields(&c->res[i], rec) - 1);
  return hb_json_end(f, o.json) && ok;
}

/* Print the run's header line, measure, write the results: 0 ok, 1 a failure. */
static int measure(struct bench_ctx *c, uint64_t connect_ns) {
  printf("# hixl-bench (hixl %s): initiator %s -> target %s, api %s, transport %s, ", HixlVersionString(),
         o.local, o.peer, apis[o.api], o.transport ? o.transport : (o.api == API_CS ? "tcp" : "default"));
  if (o.async) printf("async window %zu, ", o.window);
  if (!o.async) printf("sync, ");
  if (o.unreg) printf("%zu bytes per side, unregistered %s (staged)", c->span, unregs[o.unreg]);
  if (!o.unreg) printf("%zu registered bytes per side", c->span);
  if (o.api == API_ENGINE) printf(", engine options %s", options_text());
  printf(", verify on, connect %.2f ms\n", (double)connect_ns / 1e6);
  int rc = o.latency ? run_latency(c) : run_sweep(c);
  return write_results(c) ? rc : 1;
}

/* --api engine: an engine on --local, both regions registered (none with
 * --unregistered local), linked to the target whose buffer address came over the
 * control channel. */
static int initiator_engine(struct bench_ctx *c) {
  uint8_t *bufs[2] = {c->lbuf, c->vbuf};
  HixlMemHandle h[2];
  size_t nreg = 0, want = (o.unreg & UNREG_LOCAL) ? 0 : 2;
  int rc = 1;
  if (!(c->eng = hb_engine(o.local, o.transport, o.x.v, o.x.n))) return 1;
  while (nreg < want && hb_reg(c->eng, bufs[nreg], c->span, &h[nreg]) == HIXL_SUCCESS) nreg++;
  uint64_t t0 = bench_now_ns();
  if (nreg == want && hb_ok(HixlEngineConnect(c->eng, o.peer, 10000), "HixlEngineConnect")) {
    rc = measure(c, bench_now_ns() - t0);
    if (!hb_ok(HixlEngineDisconnect(c->eng, o.peer, 5000), "HixlEngineDisconnect")) rc = 1;
  }
  while (nreg > 0) /* in reverse */
    if (!hb_ok(HixlEngineDeregisterMem(c->eng, h[--nreg]), "HixlEngineDeregisterMem")) rc = 1;
  if (!hb_ok(HixlEngineFinalize(c->eng), "HixlEngineFinalize")) rc = 1;
  HixlEngineDestroy(c->eng);
  return rc;
}

/* The server's registration tagged BENCH_CS_TAG, by HixlCSClientGetRemoteMem: into c->rbase,
 * and c->span shrunk to its length. */
static bool cs_find_target(struct bench_ctx *c) {
  HcommMem *mems = NULL;
  char **tags = NULL;
  uint32_t n = 0;
  if (!hb_ok(HixlCSClientGetRemoteMem(c->cli, &mems, &tags, &n, 10000), "HixlCSClientGetRemoteMem"))
    return false;
  for (uint32_t i = 0; i < n; i++) {
    if (tags[i] == NULL || strcmp(tags[i], BENCH_CS_TAG) != 0) continue;
    if (mems[i].type != HCCL_MEM_TYPE_HOST || mems[i].size > SIZE_MAX) break;
    c->rbase = (uintptr_t)mems[i].addr;
    c->span = mems[i].size < c->span ? (size_t)mems[i].size : c->span;
    return true;
  }
  hb_say("the server at %s has no host memory tagged \"%s\" (%u registrations)\n", o.peer, BENCH_CS_TAG, n);
  return false;
}

/* --api cs: a CS client with both regions registered, connected to the target's CS
 * server, which holds the buffer found by its tag. */
static int initiator_cs(struct bench_ctx *c) {
  HcommMem mem[2] = {{.type = HCCL_MEM_TYPE_HOST, .addr = c->lbuf, .size = c->span},
                     {.type = HCCL_MEM_TYPE_HOST, .addr = c->vbuf, .size = c->span}};
  MemHandle h[2];
  size_t nreg = 0;
  int rc = 1;
  EndpointDesc lep = {.protocol = cs_protocol(), .address = o.local}, rep = {.protocol = cs_protocol()};
  HixlClientDesc cd = {
      .server_ip = o.peer_ip, .server_port = o.peer_port, .local_endpoint = &lep, .remote_endpoint = &rep};
  if (!hb_ok(HixlCSClientCreate(&cd, NULL, &c->cli), "HixlCSClientCreate")) return 1;
  while (nreg < 2 && hb_ok(HixlCSClientRegMem(c->cli, NULL, &mem[nreg], &h[nreg]), "HixlCSClientRegMem"))
    nreg++;
  uint64_t t0 = bench_now_ns();
  if (nreg == 2 && hb_ok(HixlCSClientConnect(c->cli, 10000), "HixlCSClientConnect")) {
    uint64_t connect_ns = bench_now_ns() - t0;
    if (cs_find_target(c)) rc = measure(c, connect_ns);
  }
  while (nreg > 0) /* in reverse */
    if (!hb_ok(HixlCSClientUnregMem(c->cli, h[--nreg]), "HixlCSClientUnregMem")) rc = 1;
  if (!hb_ok(HixlCSClientDestroy(c->cli), "HixlCSClientDestroy")) rc = 1;
  return rc;
}

static int initiator(struct hb_peer *peer) {
  struct bench_ctx c = {0};
  uint64_t ready[2]; /* the target's buffer: address (cs: 0), length */
  int rc = 1;
  if (!bench_pin_cpu(o.cpu[0])) return 1;
  if (o.csv && !hb_csv_ready(o.csv, BENCH_CSV_HEADER)) return 1; /* fails now, not after the sweep */
  hb_wait_ready(peer->fd, ready, 2);
  /* The CS target's length comes with its tag, after connecting: map what the sweep
   * needs, and use no more than the target has. */
  c.rbase = (uintptr_t)ready[0];
  c.span = needed_span();
  if (o.api == API_ENGINE && ready[1] < c.span) c.span = (size_t)ready[1];
  size_t mapped = c.span, window = o.async ? o.window : 1;
  size_t max_batch = o.latency ? 1 : extreme(o.batches, o.n_batches, true);
  /* Room for the longest point's latencies: the point moving the fewest bytes a call. */
  uint64_t nlat =
      o.latency ? o.lat_iters
                : point_iters(extreme(o.blocks, o.n_blocks, false) * extreme(o.batches, o.n_batches, false));
  c.lbuf = hb_map(mapped);
  c.vbuf = hb_map(mapped);
  c.descs = calloc(max_batch * window, sizeof(*c.descs));
  c.cdescs = calloc(max_batch * window, sizeof(*c.cdescs));
  c.lat = calloc(nlat, sizeof(*c.lat));
  c.res = calloc(o.latency ? 1 : o.n_blocks * o.n_batches * 2, sizeof(*c.res));
  if (c.lbuf && c.vbuf && c.descs && c.cdescs && c.lat && c.res) {
    memset(c.lbuf, 0x11, mapped);
    rc = o.api == API_CS ? initiator_cs(&c) : initiator_engine(&c);
  } else {
    hb_say("cannot allocate 2 x %zu bytes\n", mapped);
  }
  free(c.descs);
  free(c.cdescs);
  free(c.lat);
  free(c.res);
  if (c.vbuf != NULL) munmap(c.vbuf, mapped);
  if (c.lbuf != NULL) munmap(c.lbuf, mapped);
  return rc;
}

/* -------------------------------------------------------------------- main */

static bool set_addr(void *p, const char *v) { return strlen(v) < 128 && snprintf(p, 128, "%s", v) > 0; }

static const struct hb_opt opts[] = {
    {"--peer", HB_FN, o.peer, "IP:PORT", "the target (default: a free port on 127.0.0.1)", 0, 0, set_addr},
    {"--local", HB_FN, o.local, "IP", "the initiator (cs: client) (default 127.0.0.1)", 0, 0, set_addr},
    {"--api", HB_CHOICE, &o.api, "engine|cs", "HixlEngine* (default) or client/server HixlCS*", 0, 0, apis},
    {"--transport", HB_CHOICE, &o.transport_idx, "NAME",
     "auto|tcp|rdma|shm: the engines' Transport, or the CS endpoints' protocol\n"
     "(default: the library's; CS: tcp)",
     0, 0, transports},
    {"--opt", HB_FN, &o.x, "KEY=VALUE",
     "an engine option for both engines (--api engine; repeatable), e.g.\n"
     "--opt StagingThreshold=0 --opt BufferPool=8:8",
     0, 0, hb_extra_add},
    {"--unregistered", HB_CHOICE, &o.unreg, "local|remote|both",
     "leave that side's buffer unregistered, so every op is staged; remote/both\n"
     "run the target with StagingUnregistered=on (unless an --opt sets it), which\n"
     "needs a key: --opt AuthKeyFile=FILE (or HIXL_AUTH_KEY_FILE)",
     0, 0, unregs},
    {"--op", HB_CHOICE, &o.op_idx, "read|write|both", "(default both)", 0, 0, op_choices},
    {"--block-sizes", HB_SIZES, o.blocks, "LIST", "e.g. 4K,64K,4M (default 4K..16M, powers of 2)", 0, 0,
     &o.n_blocks},
    {"--batch", HB_SIZES, o.batches, "LIST", "ops per transfer call, e.g. 1,8,32 (default 1)", 1,
     HIXL_MAX_BATCH, &o.n_batches},
    {"--total", HB_SIZE, &o.total, "BYTES", "bytes per point (default 256M), or", 1, 1e18, NULL},
    {"--iters", HB_U64, &o.iters, "N", "iterations (transfer calls) per point", 1, BENCH_MAX_ITERS, NULL},
    {"--warmup", HB_U64, &o.warmup, "N", "unmeasured iterations (default iters/10, 1..100)", 0, 1e7, NULL},
    {"--max-seconds", HB_DBL, &o.max_seconds, "S", "a point's time limit (default 3)", 1e-9, 3600, NULL},
    {"--async", HB_FLAG, &o.async, NULL, "TransferAsync (cs: Batch*Async), --window requests", 0, 0, NULL},
    {"--window", HB_SIZE, &o.window, "N", "async requests in flight (default 4)", 1, BENCH_MAX_WINDOW, NULL},
    {"--latency", HB_FLAG, &o.latency, NULL, "only small READ round trips (sync, batch 1)", 0, 0, NULL},
    {"--lat-iters", HB_U64, &o.lat_iters, "N", "round trips (default 20000)", 1, BENCH_MAX_ITERS, NULL},
    {"--lat-size", HB_SIZE, &o.lat_size, "BYTES", "bytes per READ (default 64)", 1, 1e18, NULL},
    {"--csv", HB_STR, &o.csv, "FILE", "results, appended", 0, 0, NULL},
    {"--json", HB_STR, &o.json, "FILE", "results, rewritten", 0, 0, NULL},
    {"--no-progress", HB_NOFLAG, &o.progress, NULL, "no per-point progress on stderr", 0, 0, NULL},
    {"--pin", HB_PIN, o.cpu, "I,T", "pin the initiator process to CPU I, the target to CPU T", 0, 0, NULL},
    {NULL, 0, NULL, NULL, NULL, 0, 0, NULL}};

/* --peer into peer_ip and peer_port (the CS API takes them apart). */
static bool split_peer(void) {
  const char *colon = strrchr(o.peer, ':');
  uint64_t port = 0;
  if (colon == NULL || colon == o.peer || (size_t)(colon - o.peer) >= sizeof(o.peer_ip) ||
      !bench_parse_u64(colon + 1, &port) || port == 0 || port > 65535)
    return false;
  snprintf(o.peer_ip, sizeof(o.peer_ip), "%.*s", (int)(colon - o.peer), o.peer);
  o.peer_port = (uint16_t)port;
  return true;
}

/* Defaults that depend on other flags; 2 after saying what the CS API cannot go with. */
static int setup(void) {
  if (o.n_blocks == 0)
    for (size_t b = 4096; b <= (16u << 20); b *= 2) o.blocks[o.n_blocks++] = b;
  o.transport = o.transport_idx >= 0 ? transports[o.transport_idx] : NULL;
  if (o.peer[0] == '\0') snprintf(o.peer, sizeof(o.peer), "127.0.0.1:%u", (unsigned)hb_ports("127.0.0.1", 1));
  if (o.api == API_ENGINE)
    return 0;
  else if (o.x.n > 0)
    hb_say("--opt %s=%s: the CS API (--api cs) takes no engine options; use --api engine\n", o.x.v[0].key,
           o.x.v[0].value);
  else if (o.unreg != UNREG_NONE)
    hb_say("--unregistered %s needs --api engine: the CS API transfers registered memory only\n",
           unregs[o.unreg]);
  else if (!split_peer())
    hb_say("--peer %s is not IP:PORT\n", o.peer);
  else
    return 0;
  return 2;
}

const struct hb_test hb_test_bench = {
    "bench",
    "hixl-bench",
    "READ / WRITE bandwidth and latency sweeps between two engines (or CS API)",
    "READ / WRITE bandwidth and latency between two hixl engines (or HixlCS* client and server).\n",
    opts,
    setup,
    target,
    initiator};
