/* mh_obs: the plugin's traces and metrics in the mock host (ABI 1.5). Each instance
 * drains its worker's traces and renders its metrics (mh_obs_tick) and sends them to
 * the router over its socket; the router matches traces to requests for the summary's
 * phases (mh_obs_phases), writes them to --trace's file with one hand-off line per
 * request, and serves the latest metrics of both instances on --metrics-port
 * (mh_metrics.c). See docs/observability.md. */
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mh.h"

#define CHUNK (MH_FRAME_MAX - 4096) /* trace lines per frame, at most */

static bool has_op(const hixl_kv_ops *ops, size_t end) { return ops->size >= end; }
#define HAS_OP(ops, op) has_op((ops), offsetof(hixl_kv_ops, op) + sizeof((ops)->op))

/* ---- instance side ---- */

void mh_obs_tick(const hixl_kv_ops *ops, hixl_kv_connector *worker, int fd, bool metrics, bool final) {
  static uint64_t last_traces, last_metrics;
  uint64_t now = mh_now_ns();
  if (HAS_OP(ops, drain_traces) && (final || now - last_traces >= 10000000ull)) {
    last_traces = now;
    hixl_kv_buffer b = {0};
    if (ops->drain_traces(worker, &b) == HIXL_KV_SUCCESS) {
      for (size_t off = 0; off < b.len;) { /* whole lines, a frame at most CHUNK bytes */
        size_t n = b.len - off;
        if (n > CHUNK) {
          n = CHUNK;
          while (n > 0 && b.data[off + n - 1] != '\n') n--;
          if (n == 0) n = CHUNK; /* one line longer than a frame: cut (the router drops it) */
        }
        struct mh_out o = {0};
        mh_put_str(&o, b.data + off, n);
        mh_send(fd, MH_TRACE, &o);
        off += n;
      }
      ops->free_buffer(&b);
    }
  }
  if (metrics && HAS_OP(ops, render_metrics) && (final || now - last_metrics >= 250000000ull)) {
    last_metrics = now;
    hixl_kv_buffer b = {0};
    if (ops->render_metrics(worker, &b) == HIXL_KV_SUCCESS) {
      struct mh_out o = {0};
      mh_put_str(&o, b.data, b.len);
      mh_send(fd, MH_METRICS, &o);
      ops->free_buffer(&b);
    }
  }
}

uint64_t mh_obs_counter(const hixl_kv_ops *ops, hixl_kv_connector *worker, const char *fam) {
  size_t flen = strlen(fam);
  hixl_kv_buffer b = {0};
  uint64_t sum = 0;
  if (!HAS_OP(ops, render_metrics) || ops->render_metrics(worker, &b) != HIXL_KV_SUCCESS) return 0;
  for (size_t off = 0; off < b.len;) { /* a sample: NAME{labels} VALUE\n */
    const char *line = (const char *)b.data + off;
    const char *nl = memchr(line, '\n', b.len - off);
    size_t n = nl ? (size_t)(nl - line) : b.len - off;
    const char *sp = n > flen && memcmp(line, fam, flen) == 0 ? memrchr(line, ' ', n) : NULL;
    if (sp) sum += strtoull(sp + 1, NULL, 10);
    off += n + 1;
  }
  ops->free_buffer(&b);
  return sum;
}

/* ---- router side ---- */

struct mh_obs {
  FILE *trace;
  struct mh_metrics *m;
};

static const char *const tphase_key[MH_TP_COUNT] = {"bound",     "pin",  "pinned", "posted",
                                                    "last_byte", "free", "done",   "reported"};
const char *const mh_phase_names[MH_NPHASES] = {"waiting for blocks", "pin or accept", "transfer",
                                                "last notice", "host wake-up"};

int mh_obs_start(struct mh_router *rt) {
  const struct mh_opts *o = rt->o;
  struct mh_obs *ob = calloc(1, sizeof(*ob));
  if (!ob) return -1;
  rt->obs = ob;
  if (o->trace && !(ob->trace = fopen(o->trace, "w"))) {
    fprintf(stderr, "hixl-mock-host: --trace %s: %s\n", o->trace, strerror(errno));
    return -1;
  }
  return 0;
}

int mh_obs_serve(struct mh_router *rt) {
  const struct mh_opts *o = rt->o;
  struct mh_obs *ob = rt->obs;
  if (ob && o->metrics_port) {
    char err[256];
    if (!(ob->m = mh_metrics_start(o->metrics_port, err, sizeof(err)))) {
      fprintf(stderr, "hixl-mock-host: --metrics-port %u: %s\n", o->metrics_port, err);
      return -1;
    }
  }
  return 0;
}

static uint64_t get_u64(json_object *o, const char *key) {
  json_object *v;
  return json_object_object_get_ex(o, key, &v) ? (uint64_t)json_object_get_int64(v) : 0;
}

/* One trace line: into its request's times (CLOCK_MONOTONIC, as the host's). */
static void trace_line(struct mh_router *rt, int k, const char *line, size_t n) {
  json_tokener *tok = json_tokener_new();
  json_object *doc = tok ? json_tokener_parse_ex(tok, line, (int)n) : NULL, *v, *t;
  json_tokener_free(tok);
  unsigned idx;
  if (!doc || !json_object_object_get_ex(doc, "req", &v) ||
      sscanf(json_object_get_string(v), "req-%u", &idx) != 1 || idx >= rt->o->requests ||
      !json_object_object_get_ex(doc, "t", &t)) {
    json_object_put(doc);
    return;
  }
  struct mh_rreq *r = &rt->r[idx];
  int64_t off = (int64_t)get_u64(doc, "mono_off_ns");
  uint64_t *dst = k == 0 ? r->tp : r->tc;
  for (int p = 0; p < MH_TP_COUNT; p++) {
    uint64_t real = get_u64(t, tphase_key[p]);
    dst[p] = real ? (uint64_t)((int64_t)real - off) : 0;
  }
  if (json_object_object_get_ex(doc, "outcome", &v) && strcmp(json_object_get_string(v), "failed") == 0)
    r->failed_trace = true;
  if (k == (rt->push ? 0 : 1)) r->moved = get_u64(doc, "bytes"); /* the side that moves data */
  json_object_put(doc);
}

int mh_obs_frame(struct mh_router *rt, int k, uint8_t type, struct mh_in *in) {
  size_t n = 0;
  const char *s = mh_get_str(in, &n);
  if (!mh_in_done(in)) return -1;
  struct mh_obs *ob = rt->obs;
  if (type == MH_METRICS) {
    if (ob && ob->m) mh_metrics_set(ob->m, k, s, n);
    return 0;
  }
  if (ob && ob->trace) fwrite(s, 1, n, ob->trace);
  for (size_t a = 0; a < n;) {
    const char *nl = memchr(s + a, '\n', n - a);
    size_t len = nl ? (size_t)(nl - (s + a)) : n - a;
    trace_line(rt, k, s + a, len);
    a += len + 1;
  }
  return 0;
}

/* Request i's hand-off as boundaries b[0..5] (CLOCK_MONOTONIC): prefill's last layer
 * saved, then the end of each phase, the last decode's get_finished; false when it
 * was not verified or is not timed. Each boundary is clamped into [the one before,
 * held]: a phase that happened before the hand-off (push: decode allocated and
 * accepted before prefill's compute ended) takes no time in it. */
static bool handoff(const struct mh_router *rt, uint32_t i, uint64_t b[MH_NPHASES + 1]) {
  const struct mh_rreq *r = &rt->r[i];
  if (r->outcome != MH_VERIFIED || !r->t_saved || r->t_held <= r->t_saved) return false;
  const uint64_t *mv = rt->push ? r->tp : r->tc; /* the mover's trace */
  if (!r->tc[MH_TP_DONE] || !mv[MH_TP_PINNED]) return false;
  uint64_t ends[MH_NPHASES + 1] = {r->t_saved,        rt->push ? r->tp[MH_TP_BOUND] : r->tc[MH_TP_BOUND],
                                   mv[MH_TP_PINNED],  r->tc[MH_TP_LAST_BYTE],
                                   r->tc[MH_TP_DONE], r->t_held};
  b[0] = r->t_saved;
  for (int p = 1; p <= MH_NPHASES; p++) {
    uint64_t x = ends[p] ? ends[p] : b[p - 1];
    b[p] = x < b[p - 1] ? b[p - 1] : x > r->t_held ? r->t_held : x;
  }
  b[MH_NPHASES] = r->t_held;
  return true;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int cmp_span(const void *a, const void *b) {
  const uint64_t *x = a, *y = b;
  return x[0] < y[0] ? -1 : x[0] > y[0];
}

void mh_obs_phases(const struct mh_router *rt, struct mh_phases *ph) {
  uint32_t n = rt->o->requests;
  *ph = (struct mh_phases){0};
  double *v = calloc((size_t)n * (MH_NPHASES + 1) + 1, sizeof(*v));
  uint64_t(*span)[2] = calloc((size_t)n + 1, sizeof(*span));
  if (!v || !span) goto out;
  size_t m = 0, ns = 0;
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t b[MH_NPHASES + 1];
    if (handoff(rt, i, b)) {
      for (int p = 0; p < MH_NPHASES; p++) v[(size_t)p * n + m] = (double)(b[p + 1] - b[p]) / 1e6;
      m++;
    }
    /* The transfer itself: the mover's first op posted to its last byte. */
    const struct mh_rreq *r = &rt->r[i];
    const uint64_t *mv = rt->push ? r->tp : r->tc;
    uint64_t last = rt->push ? r->tc[MH_TP_LAST_BYTE] : mv[MH_TP_LAST_BYTE];
    if (r->outcome == MH_VERIFIED && mv[MH_TP_POSTED] && last > mv[MH_TP_POSTED] && r->moved) {
      span[ns][0] = mv[MH_TP_POSTED];
      span[ns][1] = last;
      v[(size_t)MH_NPHASES * n + ns] = (double)r->moved / (double)(last - mv[MH_TP_POSTED]); /* GB/s */
      bytes += r->moved;
      ns++;
    }
  }
  ph->n = m;
  for (int p = 0; p < MH_NPHASES && m; p++) {
    double *x = v + (size_t)p * n;
    qsort(x, m, sizeof(*x), cmp_d);
    ph->p50[p] = x[(m - 1) / 2];
    ph->p99[p] = x[(m * 99 + 99) / 100 - 1];
  }
  if (ns) {
    qsort(span, ns, sizeof(*span), cmp_span);
    uint64_t busy = 0, s0 = span[0][0], s1 = span[0][1];
    for (size_t k = 1; k < ns; k++) { /* the union of the transfers' intervals */
      if (span[k][0] > s1) {
        busy += s1 - s0;
        s0 = span[k][0];
        s1 = span[k][1];
      } else if (span[k][1] > s1) {
        s1 = span[k][1];
      }
    }
    busy += s1 - s0;
    ph->xfer_gbps = busy ? (double)bytes / (double)busy : 0;
    double *g = v + (size_t)MH_NPHASES * n;
    qsort(g, ns, sizeof(*g), cmp_d);
    ph->xfer_gbps_p50 = g[(ns - 1) / 2];
  }
out:
  free(v);
  free(span);
}

static volatile sig_atomic_t stop_linger;
static void on_term(int sig) {
  (void)sig;
  stop_linger = 1;
}

void mh_obs_finish(struct mh_router *rt) {
  struct mh_obs *ob = rt->obs;
  if (!ob) return;
  if (ob->trace) { /* one hand-off line per request timed, in CLOCK_REALTIME ns as the traces */
    struct timespec re, mo;
    clock_gettime(CLOCK_REALTIME, &re);
    clock_gettime(CLOCK_MONOTONIC, &mo);
    int64_t off = ((int64_t)re.tv_sec - (int64_t)mo.tv_sec) * 1000000000ll + (re.tv_nsec - mo.tv_nsec);
    for (uint32_t i = 0; i < rt->o->requests; i++) {
      uint64_t b[MH_NPHASES + 1];
      if (!handoff(rt, i, b)) continue;
      fprintf(ob->trace,
              "{\"req\":\"req-%u\",\"role\":\"handoff\",\"mode\":\"%s\",\"bytes\":%" PRIu64 ",\"t\":{", i,
              rt->push ? "push" : "pull", rt->r[i].bytes);
      static const char *const keys[] = {"saved", "blocks", "pinned", "landed", "noticed", "held"};
      for (int p = 0; p <= MH_NPHASES; p++)
        fprintf(ob->trace, "%s\"%s\":%" PRId64, p ? "," : "", keys[p], (int64_t)b[p] + off);
      fputs("}}\n", ob->trace);
    }
    if (fclose(ob->trace) != 0)
      fprintf(stderr, "hixl-mock-host: --trace %s: %s\n", rt->o->trace, strerror(errno));
    ob->trace = NULL;
  }
  if (ob->m && rt->o->metrics_linger) {
    struct sigaction sa = {.sa_handler = on_term}, old_int, old_term;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    printf("hixl-mock-host: /metrics on 127.0.0.1:%u for %u s more (SIGTERM ends it)\n", rt->o->metrics_port,
           rt->o->metrics_linger);
    fflush(stdout);
    uint64_t end = mh_now_ns() + (uint64_t)rt->o->metrics_linger * 1000000000ull;
    while (!stop_linger && mh_now_ns() < end) {
      struct timespec ts = {0, 50000000};
      nanosleep(&ts, NULL);
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
  }
  if (ob->m) mh_metrics_stop(ob->m);
  free(ob);
  rt->obs = NULL;
}
