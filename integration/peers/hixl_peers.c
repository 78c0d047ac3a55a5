/* hixl-peers: hixl driven with the knobs and the method of Mooncake's transfer_engine_bench,
 * so that the two throughputs mean the same thing (integration/peers/run_peers.sh runs
 * both, and UCX and NIXL, on the same points).
 *
 *   hixl-peers --mode=target --protocol=tcp|shm --local_server_name=IP:PORT
 *              [--buffer_size=BYTES] [--alloc]
 *     registers one buffer and prints "READY <engine> <address hex> <length>" on stdout,
 *     then serves until stdin ends (or SIGTERM / SIGINT). The buffer is plain anonymous
 *     memory registered with HixlEngineRegisterMem, or with --alloc memory from
 *     HixlEngineAllocMem: a same-host initiator (Transport shm) maps that and moves its
 *     ops with memcpy, as UCX's sm transports copy into a segment ucp_mem_map
 *     allocated; on plain memory its ops are process_vm_readv / writev calls.
 *   hixl-peers --mode=initiator --protocol=tcp|shm --segment_id=IP:PORT
 *              --remote_addr=HEX --operation=read|write --threads=T --batch_size=B
 *              --block_size=S --duration=SECONDS [--verify] [--buffer_size=BYTES]
 *              [--one_buffer] [--window=W]
 *
 * The initiator is Mooncake's method (mooncake-transfer-engine/example/
 * transfer_engine_bench.cpp, initiatorWorker): T threads share one engine; thread t
 * loops, while a flag is up, over batches of B ops of S bytes, op i at offset
 * S * (i * T + t) on both sides, one batch in flight per thread (Mooncake submits and
 * then polls every task; here one HixlEngineTransferSync of the B ops). The clock runs
 * from before the threads start to after they are joined, the main thread sleeping
 * `duration` seconds in between; throughput = batches x B x S / that time, GB = 10^9
 * bytes, as Mooncake prints it. --duration takes a fraction (Mooncake's is whole
 * seconds). Then, outside the timed region, --verify writes a fresh pattern through the
 * same descriptors, reads it back into a zeroed buffer and compares every byte.
 *
 * --one_buffer is ucx_perftest's shape instead (openucx/ucx src/tools/perf/lib/
 * ucp_tests.cc, run_stream_uni: every put or get of a thread moves the same message
 * buffer to the same remote address; libperf_memory.c allocates block x threads bytes
 * a side): all B ops of thread t are S bytes at offset S * t on both sides, so the
 * thread moves one block again and again, B at a time, and the data stays in the cache.
 * The count and the clock are as above.
 *
 * --window=W keeps W batches a thread in flight instead of one: each a
 * HixlEngineTransferAsync of the thread's B ops, the next posted as soon as one
 * completes. ucx_perftest's ucp_put_bw is such a window: over TCP a put is done once UCX
 * has taken it locally (into the socket), so with -O 1 its puts still stream, as many in
 * flight as the socket takes, where a hixl batch is done when the target has it. A batch
 * counts when it completed; the W requests move the same blocks.
 *
 * Output, one line on stdout:
 *   RESULT tool=hixl op=... block=... batch=... threads=... seconds=... batches=...
 *          bytes=... gbps=... verified_bytes=... cpu_s=...
 * cpu_s is this process's user + system time for its whole life (its CPU-time clock), as
 * /usr/bin/time would count it for the peers' programs.
 *
 * --mode=report turns run_peers.sh's raw records into the markdown table and the JSON
 * (run_report below). */
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

#include "harness.h"

#define PEERS_CALL_TIMEOUT_MS 30000
#define PEERS_MAX_THREADS     64
#define PEERS_MAX_WINDOW      1024

enum { MODE_TARGET, MODE_INITIATOR, MODE_REPORT };
static const char *const modes[] = {"target", "initiator", "report", NULL};
static const char *const operations[] = {"read", "write", NULL}; /* HIXL_READ, HIXL_WRITE */

static struct {
  int mode;              /* --mode: index in modes[], -1 none */
  const char *protocol;  /* hixl's Transport: tcp / shm */
  const char *local;     /* target: IP:PORT it listens on; initiator: IP */
  const char *segment;   /* initiator: the target engine, IP:PORT */
  uintptr_t remote_addr; /* initiator: the target's buffer */
  int op;                /* --operation: index in operations[], a HixlTransferOp */
  unsigned threads;
  size_t batch, block, buffer_size;
  double duration;
  bool verify;
  bool alloc;                  /* target: the buffer from HixlEngineAllocMem, not registered mmap */
  bool one_buffer;             /* initiator: ucx_perftest's shape, one block a thread (file head) */
  unsigned window;             /* initiator: batches in flight a thread (1: TransferSync; file head) */
  const char *raw, *md, *json; /* --mode=report */
} o = {.mode = -1,
       .protocol = "tcp",
       .op = HIXL_READ,
       .threads = 12,
       .batch = 128,
       .block = 65536,
       .buffer_size = (size_t)1 << 30,
       .duration = 10,
       .window = 1};

struct worker {
  pthread_t tid;
  HixlEngine *eng;
  uint8_t *local;
  unsigned index;
  uint64_t batches;
  HixlStatus st; /* first failure */
};

static atomic_bool g_running = true;
static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

/* The B ops of thread t, Mooncake's layout: op i at S * (i * T + t) on both sides; with
 * --one_buffer all at S * t, ucx_perftest's one message buffer a thread. */
static void fill_descs(unsigned t, uintptr_t local, HixlTransferOpDesc *d) {
  for (size_t i = 0; i < o.batch; i++) {
    size_t off = o.block * (o.one_buffer ? t : i * o.threads + t);
    d[i] =
        (HixlTransferOpDesc){.local_addr = local + off, .remote_addr = o.remote_addr + off, .len = o.block};
  }
}

/* --window=W: W batches of the thread's B ops in flight at once, each a
 * HixlEngineTransferAsync, a new one posted as soon as one completes (a batch counts
 * when it completed); the W requests move the same blocks. The poll yields the CPU only
 * when no request ended. */
static HixlStatus stream(struct worker *w, const HixlTransferOpDesc *d) {
  HixlTransferReq req[PEERS_MAX_WINDOW] = {0};
  HixlStatus st = HIXL_SUCCESS;
  unsigned busy = 0;
  for (;;) {
    bool running = atomic_load_explicit(&g_running, memory_order_relaxed) && st == HIXL_SUCCESS;
    for (unsigned k = 0; k < o.window && running; k++) {
      if (req[k] != NULL) continue;
      st = HixlEngineTransferAsync(w->eng, o.segment, o.op, d, o.batch, PEERS_CALL_TIMEOUT_MS, NULL, &req[k]);
      if (st != HIXL_SUCCESS) {
        hb_fail("HixlEngineTransferAsync", st);
        req[k] = NULL;
        break;
      }
      busy++;
    }
    if (busy == 0) return st;
    bool ended = false;
    for (unsigned k = 0; k < o.window; k++) {
      HixlTransferStatus ts = HIXL_TRANSFER_WAITING;
      if (req[k] == NULL) continue;
      HixlStatus ps = HixlEngineGetTransferStatus(w->eng, req[k], &ts);
      if (ps == HIXL_SUCCESS && ts == HIXL_TRANSFER_WAITING) continue;
      req[k] = NULL; /* ended, whatever the state: not polled again */
      busy--;
      ended = true;
      if (ps != HIXL_SUCCESS || ts != HIXL_TRANSFER_COMPLETED) {
        if (ps != HIXL_SUCCESS)
          hb_fail("HixlEngineGetTransferStatus", ps);
        else
          hb_say("a request ended %s\n", ts == HIXL_TRANSFER_TIMEOUT ? "TIMEOUT" : "FAILED");
        if (st == HIXL_SUCCESS) st = ps != HIXL_SUCCESS ? ps : HIXL_FAILED;
      } else if (st == HIXL_SUCCESS) {
        w->batches++;
      }
    }
    if (!ended) sched_yield();
  }
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  HixlTransferOpDesc *d = calloc(o.batch, sizeof(*d));
  if (d == NULL) {
    w->st = HIXL_FAILED;
    return NULL;
  }
  fill_descs(w->index, (uintptr_t)w->local, d);
  if (o.window > 1)
    w->st = stream(w, d);
  else
    while (w->st == HIXL_SUCCESS && atomic_load_explicit(&g_running, memory_order_relaxed)) {
      w->st = HixlEngineTransferSync(w->eng, o.segment, o.op, d, o.batch, PEERS_CALL_TIMEOUT_MS);
      if (hb_ok(w->st, "HixlEngineTransferSync")) w->batches++;
    }
  free(d);
  return NULL;
}

/* Pattern out through the point's descriptors, back into a zeroed buffer, compared:
 * the bytes checked, or 0 when a transfer failed or a byte differs (said on stderr). */
static uint64_t verify(HixlEngine *eng, uint8_t *local, size_t span) {
  HixlTransferOpDesc *d = calloc(o.batch, sizeof(*d));
  uint8_t *want = malloc(span);
  uint64_t ok = 0;
  size_t bad = 0;
  if (d == NULL || want == NULL) goto out;
  bench_pattern_fill(want, span, 0x5eed ^ (uint64_t)o.block);
  memcpy(local, want, span);
  for (int pass = 0; pass < 2; pass++) { /* WRITE the pattern, then READ it back into zeros */
    HixlTransferOp op = pass ? HIXL_READ : HIXL_WRITE;
    if (pass) memset(local, 0, span);
    for (unsigned t = 0; t < o.threads; t++) {
      fill_descs(t, (uintptr_t)local, d);
      if (!hb_ok(HixlEngineTransferSync(eng, o.segment, op, d, o.batch, PEERS_CALL_TIMEOUT_MS),
                 pass ? "verify: HixlEngineTransferSync(READ)" : "verify: HixlEngineTransferSync(WRITE)"))
        goto out;
    }
  }
  if (!bench_same(want, local, span, &bad)) {
    hb_say("VERIFY FAILED at byte %zu of %zu (block %zu): 0x%02x, expected 0x%02x\n", bad, span, o.block,
           local[bad], want[bad]);
    goto out;
  }
  ok = span;
out:
  free(want);
  free(d);
  return ok;
}

static int run_initiator(void) {
  int rc = 1;
  HixlEngine *eng = NULL;
  HixlMemHandle mh = NULL;
  struct worker w[PEERS_MAX_THREADS];
  size_t span = o.block * (o.one_buffer ? 1 : o.batch) * o.threads;
  if (span > o.buffer_size) {
    hb_say("%zu x %zu x %u bytes do not fit --buffer_size=%zu\n", o.block, o.batch, o.threads, o.buffer_size);
    return 2;
  }
  uint8_t *local = hb_map(span);
  if (local == NULL) return 1;
  if (!(eng = hb_engine(o.local, o.protocol, NULL, 0))) goto out_unmap;
  if (hb_reg(eng, local, span, &mh) != HIXL_SUCCESS) goto out_destroy;
  if (!hb_ok(HixlEngineConnect(eng, o.segment, 10000), "HixlEngineConnect")) goto out_dereg;

  uint64_t t0 = bench_now_ns();
  unsigned started = 0;
  for (; started < o.threads; started++) {
    w[started] = (struct worker){.eng = eng, .local = local, .index = started, .st = HIXL_SUCCESS};
    if (pthread_create(&w[started].tid, NULL, worker_main, &w[started]) != 0) {
      hb_say("pthread_create: %s\n", strerror(errno));
      break;
    }
  }
  struct timespec nap = {.tv_sec = (time_t)o.duration,
                         .tv_nsec = (long)((o.duration - (double)(time_t)o.duration) * 1e9)};
  while (nanosleep(&nap, &nap) != 0 && errno == EINTR && !g_stop) {
  }
  atomic_store(&g_running, false);
  uint64_t batches = 0;
  bool failed = started < o.threads;
  for (unsigned i = 0; i < started; i++) {
    pthread_join(w[i].tid, NULL);
    batches += w[i].batches;
    failed |= w[i].st != HIXL_SUCCESS;
  }
  double secs = (double)(bench_now_ns() - t0) / 1e9;
  if (failed) goto out_disconnect;

  uint64_t bytes = batches * o.batch * o.block;
  uint64_t checked = o.verify ? verify(eng, local, span) : 0;
  printf("Test completed: duration %.2f, batch count %" PRIu64 ", throughput %.2f GB/s\n", secs, batches,
         (double)bytes / secs / 1e9);
  printf("RESULT tool=hixl op=%s block=%zu batch=%zu threads=%u shape=%s window=%u seconds=%.4f"
         " batches=%" PRIu64 " bytes=%" PRIu64 " gbps=%.4f verified_bytes=%" PRIu64 " cpu_s=%.3f\n",
         o.op == HIXL_READ ? "READ" : "WRITE", o.block, o.batch, o.threads,
         o.one_buffer ? "one_buffer" : "blocks", o.window, secs, batches, bytes, (double)bytes / secs / 1e9,
         checked, (double)hb_cpu_ns(0) / 1e9);
  rc = (o.verify && checked == 0) ? 3 : 0;
out_disconnect:
  HixlEngineDisconnect(eng, o.segment, 0);
out_dereg:
  HixlEngineDeregisterMem(eng, mh);
out_destroy:
  HixlEngineDestroy(eng);
out_unmap:
  munmap(local, span);
  return rc;
}

static int run_target(void) {
  int rc = 1;
  HixlEngine *eng = NULL;
  HixlMemHandle mh = NULL;
  void *buf = NULL;
  /* Not populated: the pages a point touches fault in on its first use, as
   * numa_alloc_onnode's do for Mooncake's target (and as a fresh memfd's do). */
  if (!o.alloc) {
    buf = mmap(NULL, o.buffer_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
      hb_say("mmap %zu bytes: %s\n", o.buffer_size, strerror(errno));
      return 1;
    }
  }
  if (!(eng = hb_engine(o.local, o.protocol, NULL, 0))) goto out_unmap;
  if (o.alloc ? !hb_ok(HixlEngineAllocMem(eng, o.buffer_size, &buf, &mh), "HixlEngineAllocMem")
              : hb_reg(eng, buf, o.buffer_size, &mh) != HIXL_SUCCESS)
    goto out_destroy;
  printf("READY %s %" PRIxPTR " %zu\n", o.local, (uintptr_t)buf, o.buffer_size);
  fflush(stdout);
  /* Serve until stdin ends or a signal: the engine's own threads do the work. */
  struct pollfd pfd = {.fd = 0, .events = POLLIN};
  char sink[256];
  while (!g_stop) {
    int r = poll(&pfd, 1, 200);
    if (r > 0 && read(0, sink, sizeof(sink)) <= 0) break;
  }
  rc = 0;
  if (o.alloc)
    HixlEngineFreeMem(eng, mh);
  else
    HixlEngineDeregisterMem(eng, mh);
out_destroy:
  HixlEngineDestroy(eng);
out_unmap:
  if (!o.alloc) munmap(buf, o.buffer_size);
  return rc;
}

/* ------------------------------------------------------------------ report */

/* --mode=report --raw=FILE [--md=FILE] [--json=FILE]: the table and JSON from the raw
 * records run_peers.sh appends, one run a line, tab-separated:
 *   RUN round path op block batch threads tool gbps bytes seconds verified_bytes cpu_s
 *   SKIP path tool reason
 * Each figure is the median over rounds. Each peer is set against the hixl run of the
 * same workload (rep_peer): Mooncake and NIXL against hixl on distinct blocks, UCX
 * against hixl in ucx_perftest's shape (hixl-1buf; on the same host into memory from
 * HixlEngineAllocMem, as UCX's segment is ucp_mem_map's). Each of those hixl runs has
 * its A/A beside it: its median over a second run in the same rounds (hixl-aa,
 * hixl-1buf-aa), so a ratio to a peer that sits inside it says nothing. hixl-alloc
 * (same host: distinct blocks into allocated memory) is shown without a peer. CPU s/GiB
 * is both processes' CPU seconds over the bytes the tool counted, median over rounds. */

enum { T_HIXL, T_HIXL_AA, T_ALLOC, T_1BUF, T_1BUF_AA, T_MOONCAKE, T_UCX, T_NIXL, REP_TOOLS };
#define REP_ROUNDS 64
#define REP_POINTS 256
#define REP_SKIPS  32

static const struct {
  const char *name, *title, *what;
} rep_tool[REP_TOOLS] = {
    [T_HIXL] = {"hixl", "hixl",
                "hixl-peers, Mooncake's layout: batch x threads distinct blocks, the target's "
                "buffer plain memory registered with HixlEngineRegisterMem"},
    [T_HIXL_AA] = {"hixl-aa", "hixl A/A", "hixl again, a second run in the same round (its A/A)"},
    [T_ALLOC] = {"hixl-alloc", "hixl alloc",
                 "as hixl, the target's buffer from HixlEngineAllocMem (same host: memcpy into the mapping)"},
    [T_1BUF] =
        {"hixl-1buf", "hixl 1-buf",
         "hixl-peers --one_buffer, ucx_perftest's shape: one block a thread moved again and again, batch "
         "at a time; on the same host into HixlEngineAllocMem memory; over TCP, WRITE with UCX's window "
         "(--window)"},
    [T_1BUF_AA] = {"hixl-1buf-aa", "hixl 1-buf A/A", "hixl-1buf again, a second run in the same round"},
    [T_MOONCAKE] = {"mooncake", "Mooncake TE", "transfer_engine_bench, TCP transport"},
    [T_UCX] = {"ucx", "UCX perftest", "ucx_perftest ucp_put_bw / ucp_get, one message buffer a thread"},
    [T_NIXL] = {"nixl", "NIXL (UCX)",
                "nixl_peer.py, NIXL's Python agent with its UCX backend, distinct blocks"},
};

/* Each peer, the hixl run of the same workload, and that run's A/A. */
static const struct {
  int peer, hixl, aa;
} rep_peer[] = {
    {T_MOONCAKE, T_HIXL, T_HIXL_AA},
    {T_UCX, T_1BUF, T_1BUF_AA},
    {T_NIXL, T_HIXL, T_HIXL_AA},
};
#define REP_PEERS (sizeof(rep_peer) / sizeof(rep_peer[0]))

struct rep_point {
  char path[16], op[8];
  size_t block, batch, threads;
  double gbps[REP_TOOLS][REP_ROUNDS], cpu[REP_TOOLS][REP_ROUNDS];
  size_t n[REP_TOOLS];
  uint64_t verified[REP_TOOLS];
  unsigned window;              /* hixl-1buf's batches in flight a thread (0: one, sync) */
  unsigned long long ucx_bytes; /* what UCX's sockets held at that point (its window) */
};

struct rep_skip {
  char path[16], tool[16], why[256];
};

static int rep_tool_index(const char *t) {
  for (int i = 0; i < REP_TOOLS; i++)
    if (strcmp(t, rep_tool[i].name) == 0) return i;
  return -1;
}

static void rep_size(size_t b, char *out, size_t cap) {
  if (b >= (1u << 20) && b % (1u << 20) == 0)
    snprintf(out, cap, "%zu MiB", b >> 20);
  else if (b >= 1024 && b % 1024 == 0)
    snprintf(out, cap, "%zu KiB", b >> 10);
  else
    snprintf(out, cap, "%zu B", b);
}

static const char *rep_skip_why(const struct rep_skip *sk, size_t nsk, const char *path, const char *tool) {
  for (size_t i = 0; i < nsk; i++)
    if (strcmp(sk[i].path, path) == 0 && strcmp(sk[i].tool, tool) == 0) return sk[i].why;
  return NULL;
}

static void rep_gbps(FILE *md, double v) {
  if (v > 0)
    fprintf(md, " %.3f |", v);
  else
    fprintf(md, " - |");
}

static void rep_ratio(FILE *md, double a, double b) {
  if (a > 0 && b > 0)
    fprintf(md, " %.2fx |", a / b);
  else
    fprintf(md, " - |");
}

/* One path's table; alloc: whether it has the hixl-alloc column. */
static void rep_table(FILE *md, struct rep_point *pt, size_t npt, const struct rep_skip *sk, size_t nsk,
                      const char *path, bool alloc) {
  /* the hixl runs in the CPU and verified cells, in order */
  int cpu_tools[REP_TOOLS], ver_tools[REP_TOOLS];
  size_t ncpu = 0, nver = 0;
  cpu_tools[ncpu++] = T_HIXL, ver_tools[nver++] = T_HIXL;
  if (alloc) cpu_tools[ncpu++] = T_ALLOC, ver_tools[nver++] = T_ALLOC;
  cpu_tools[ncpu++] = T_1BUF, ver_tools[nver++] = T_1BUF;
  for (size_t k = 0; k < REP_PEERS; k++) cpu_tools[ncpu++] = rep_peer[k].peer;
  ver_tools[nver++] = T_NIXL;

  fprintf(md, "| op | block | batch x threads | hixl GB/s | A/A |%s hixl 1-buf GB/s | A/A 1-buf |",
          alloc ? " hixl alloc GB/s |" : "");
  for (size_t k = 0; k < REP_PEERS; k++)
    fprintf(md, " %s GB/s | %s / %s |", rep_tool[rep_peer[k].peer].title, rep_tool[rep_peer[k].hixl].title,
            rep_tool[rep_peer[k].peer].title);
  fprintf(md, " hixl / best peer | CPU s/GiB:");
  for (size_t k = 0; k < ncpu; k++) fprintf(md, "%s %s", k ? "," : "", rep_tool[cpu_tools[k]].title);
  fprintf(md, " | verified:");
  for (size_t k = 0; k < nver; k++) fprintf(md, "%s %s", k ? "," : "", rep_tool[ver_tools[k]].title);
  fprintf(md, " |\n|---|---:|---:|---:|---:|%s---:|---:|", alloc ? "---:|" : "");
  for (size_t k = 0; k < REP_PEERS; k++) fprintf(md, "---:|---:|");
  fprintf(md, "---:|---|---|\n");

  for (size_t i = 0; i < npt; i++) {
    struct rep_point *p = &pt[i];
    if (strcmp(p->path, path) != 0) continue;
    double med[REP_TOOLS], cpu[REP_TOOLS];
    for (int t = 0; t < REP_TOOLS; t++) {
      med[t] = p->n[t] ? bench_median(p->gbps[t], p->n[t]) : 0;
      cpu[t] = p->n[t] ? bench_median(p->cpu[t], p->n[t]) : 0;
    }
    char bs[32];
    rep_size(p->block, bs, sizeof(bs));
    fprintf(md, "| %s | %s | %zu x %zu |", p->op, bs, p->batch, p->threads);
    rep_gbps(md, med[T_HIXL]);
    rep_ratio(md, med[T_HIXL], med[T_HIXL_AA]);
    if (alloc) rep_gbps(md, med[T_ALLOC]);
    rep_gbps(md, med[T_1BUF]);
    rep_ratio(md, med[T_1BUF], med[T_1BUF_AA]);
    double worst = 0;
    const char *worst_name = NULL;
    for (size_t k = 0; k < REP_PEERS; k++) {
      int peer = rep_peer[k].peer, h = rep_peer[k].hixl;
      if (med[peer] > 0)
        fprintf(md, " %.3f |", med[peer]);
      else
        fprintf(md, " %s |", rep_skip_why(sk, nsk, p->path, rep_tool[peer].name) ? "n/a" : "-");
      rep_ratio(md, med[h], med[peer]);
      if (med[h] > 0 && med[peer] > 0 && (worst_name == NULL || med[h] / med[peer] < worst))
        worst = med[h] / med[peer], worst_name = rep_tool[peer].title;
    }
    if (worst_name != NULL)
      fprintf(md, " %.2fx (%s) |", worst, worst_name);
    else
      fprintf(md, " - |");
    for (size_t k = 0; k < ncpu; k++) {
      if (cpu[cpu_tools[k]] > 0)
        fprintf(md, "%s%.2f", k ? ", " : " ", cpu[cpu_tools[k]]);
      else
        fprintf(md, "%s-", k ? ", " : " ");
    }
    fprintf(md, " |");
    for (size_t k = 0; k < nver; k++) {
      int t = ver_tools[k];
      fprintf(md, "%s%s", k ? ", " : " ", p->verified[t] ? "yes" : (p->n[t] ? "no" : "-"));
    }
    fprintf(md, " |\n");
  }
  fprintf(md, "\n");
  for (size_t i = 0; i < npt; i++) {
    char bs[32];
    if (strcmp(pt[i].path, path) != 0 || pt[i].window == 0) continue;
    rep_size(pt[i].block, bs, sizeof(bs));
    fprintf(md,
            "- %s %s x %zu x %zu: hixl 1-buf kept %u batches a thread in flight (--window), UCX's window: "
            "%llu bytes in its sockets\n",
            pt[i].op, bs, pt[i].batch, pt[i].threads, pt[i].window, pt[i].ucx_bytes);
  }
  for (size_t k = 0; k < nsk; k++)
    if (strcmp(sk[k].path, path) == 0) {
      int t = rep_tool_index(sk[k].tool);
      fprintf(md, "- n/a %s: %s\n", t < 0 ? sk[k].tool : rep_tool[t].title, sk[k].why);
    }
  fprintf(md, "\n");
}

static void rep_json(FILE *js, struct rep_point *pt, size_t npt, const struct rep_skip *sk, size_t nsk) {
  fprintf(js, "{\n  \"unit\": \"GB/s (10^9 bytes per second), median over rounds\",\n  \"tools\": {");
  for (int t = 0; t < REP_TOOLS; t++) {
    fprintf(js, "%s\n    \"%s\": ", t ? "," : "", rep_tool[t].name);
    hb_json_str(js, rep_tool[t].what);
  }
  fprintf(js, "\n  },\n  \"compared\": {");
  for (size_t k = 0; k < REP_PEERS; k++)
    fprintf(js, "%s\"%s\": {\"hixl\": \"%s\", \"aa\": \"%s\"}", k ? ", " : "",
            rep_tool[rep_peer[k].peer].name, rep_tool[rep_peer[k].hixl].name, rep_tool[rep_peer[k].aa].name);
  fprintf(js, "},\n  \"points\": [");
  for (size_t i = 0; i < npt; i++) {
    struct rep_point *p = &pt[i];
    fprintf(js,
            "%s\n    {\"path\": \"%s\", \"op\": \"%s\", \"block\": %zu, \"batch\": %zu, \"threads\": %zu, "
            "\"in_flight\": %zu, ",
            i ? "," : "", p->path, p->op, p->block, p->batch, p->threads, p->batch * p->threads);
    if (p->window)
      fprintf(js, "\"hixl_1buf_window\": %u, \"ucx_socket_bytes\": %llu, ", p->window, p->ucx_bytes);
    fprintf(js, "\"tools\": {");
    bool first = true;
    for (int t = 0; t < REP_TOOLS; t++) {
      if (p->n[t] == 0) continue;
      fprintf(js,
              "%s\"%s\": {\"gbps\": %.4f, \"cpu_s_per_gib\": %.4f, \"verified_bytes\": %llu, \"rounds\": [",
              first ? "" : ", ", rep_tool[t].name, bench_median(p->gbps[t], p->n[t]),
              bench_median(p->cpu[t], p->n[t]), (unsigned long long)p->verified[t]);
      for (size_t r = 0; r < p->n[t]; r++) fprintf(js, "%s%.4f", r ? ", " : "", p->gbps[t][r]);
      fprintf(js, "]}");
      first = false;
    }
    fprintf(js, "}}");
  }
  fprintf(js, "\n  ],\n  \"skipped\": [");
  for (size_t k = 0; k < nsk; k++) {
    fprintf(js, "%s\n    {\"path\": \"%s\", \"tool\": \"%s\", \"reason\": ", k ? "," : "", sk[k].path,
            sk[k].tool);
    hb_json_str(js, sk[k].why);
    fprintf(js, "}");
  }
  fprintf(js, "\n  ]\n}\n");
}

static int run_report(const char *raw, const char *md_path, const char *json_path) {
  static struct rep_point pt[REP_POINTS];
  static struct rep_skip sk[REP_SKIPS];
  size_t npt = 0, nsk = 0;
  char line[1024];
  FILE *f = fopen(raw, "r");
  if (f == NULL) {
    hb_say("report: %s: %s\n", raw, strerror(errno));
    return 1;
  }
  while (fgets(line, sizeof(line), f) != NULL) {
    char path[16], op[8], tool[16], why[256];
    unsigned round;
    size_t block, batch, threads;
    double gbps, secs, cpu;
    unsigned long long bytes, ver;
    line[strcspn(line, "\n")] = '\0';
    if (sscanf(line, "SKIP\t%15[^\t]\t%15[^\t]\t%255[^\n]", path, tool, why) == 3 && nsk < REP_SKIPS) {
      struct rep_skip *s = &sk[nsk++];
      snprintf(s->path, sizeof(s->path), "%s", path);
      snprintf(s->tool, sizeof(s->tool), "%s", tool);
      snprintf(s->why, sizeof(s->why), "%s", why);
      continue;
    }
    unsigned window = 0;
    int ti = -1;
    if (sscanf(line, "WINDOW\t%15s\t%7s\t%zu\t%zu\t%zu\t%u\t%llu", path, op, &block, &batch, &threads,
               &window, &bytes) != 7 &&
        (sscanf(line, "RUN\t%u\t%15s\t%7s\t%zu\t%zu\t%zu\t%15s\t%lf\t%llu\t%lf\t%llu\t%lf", &round, path, op,
                &block, &batch, &threads, tool, &gbps, &bytes, &secs, &ver, &cpu) != 12 ||
         (ti = rep_tool_index(tool)) < 0))
      continue;
    size_t i = 0;
    while (i < npt && !(strcmp(pt[i].path, path) == 0 && strcmp(pt[i].op, op) == 0 && pt[i].block == block &&
                        pt[i].batch == batch && pt[i].threads == threads))
      i++;
    if (i == npt) {
      if (npt == REP_POINTS) continue;
      memset(&pt[npt], 0, sizeof(pt[npt]));
      snprintf(pt[npt].path, sizeof(pt[npt].path), "%s", path);
      snprintf(pt[npt].op, sizeof(pt[npt].op), "%s", op);
      pt[npt].block = block, pt[npt].batch = batch, pt[npt].threads = threads;
      npt++;
    }
    struct rep_point *p = &pt[i];
    if (ti < 0) {
      p->window = window, p->ucx_bytes = bytes;
      continue;
    }
    if (p->n[ti] == REP_ROUNDS) continue;
    p->gbps[ti][p->n[ti]] = gbps;
    p->cpu[ti][p->n[ti]] = bytes ? cpu / ((double)bytes / (double)(1u << 30)) : 0;
    p->n[ti]++;
    if (ver > p->verified[ti]) p->verified[ti] = ver;
  }
  fclose(f);

  FILE *md = md_path ? fopen(md_path, "w") : stdout;
  FILE *js = json_path ? fopen(json_path, "w") : NULL;
  if (md == NULL || (json_path && js == NULL)) {
    hb_say("report: cannot write %s\n", md == NULL ? md_path : json_path);
    if (md != NULL && md != stdout) fclose(md);
    return 1;
  }
  static const struct {
    const char *path, *title;
  } paths[] = {
      {"tcp", "Loopback TCP (127.0.0.1)"},
      {"shm", "Same host (hixl Transport shm; UCX and NIXL: UCX's shared-memory transports)"},
  };
  for (size_t pi = 0; pi < sizeof(paths) / sizeof(paths[0]); pi++) {
    bool any = false, alloc = false;
    for (size_t i = 0; i < npt; i++)
      if (strcmp(pt[i].path, paths[pi].path) == 0) any = true, alloc |= pt[i].n[T_ALLOC] > 0;
    if (!any) continue;
    fprintf(md, "### %s\n\n", paths[pi].title);
    rep_table(md, pt, npt, sk, nsk, paths[pi].path, alloc);
  }
  if (js != NULL) {
    rep_json(js, pt, npt, sk, nsk);
    fclose(js);
  }
  if (md != stdout) fclose(md);
  return 0;
}

static bool set_hex(void *p, const char *v) {
  char *end = NULL;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 16);
  *(uintptr_t *)p = (uintptr_t)x;
  return end != v && *end == '\0' && errno == 0 && x != 0 && x <= UINTPTR_MAX;
}

static const struct hb_opt opts[] = {
    {"--mode", HB_CHOICE, &o.mode, "MODE", "target | initiator | report", 0, 0, modes},
    {"--protocol", HB_STR, &o.protocol, "NAME", "hixl's Transport: tcp (default) | shm", 0, 0, NULL},
    {"--local_server_name", HB_STR, &o.local, "ADDR", "target: IP:PORT it listens on; initiator: its IP", 0,
     0, NULL},
    {"--buffer_size", HB_SIZE, &o.buffer_size, "BYTES", "the buffers' size (1G)", 1, 1e15, NULL},
    {"--alloc", HB_FLAG, &o.alloc, NULL, "target: the buffer from HixlEngineAllocMem", 0, 0, NULL},
    {"--segment_id", HB_STR, &o.segment, "IP:PORT", "initiator: the target engine", 0, 0, NULL},
    {"--remote_addr", HB_FN, &o.remote_addr, "HEX", "initiator: the target's buffer (its READY line)", 0, 0,
     set_hex},
    {"--operation", HB_CHOICE, &o.op, "OP", "read (default) | write", 0, 0, operations},
    {"--threads", HB_UNS, &o.threads, "T", "initiator threads (12)", 1, PEERS_MAX_THREADS, NULL},
    {"--batch_size", HB_SIZE, &o.batch, "B", "ops a batch (128)", 1, HIXL_MAX_BATCH, NULL},
    {"--block_size", HB_SIZE, &o.block, "S", "bytes an op (64K)", 1, 1e15, NULL},
    {"--duration", HB_DBL, &o.duration, "SECONDS", "how long the threads loop (10)", 1e-3, 86400, NULL},
    {"--verify", HB_FLAG, &o.verify, NULL, "then every byte of the point, out and back", 0, 0, NULL},
    {"--one_buffer", HB_FLAG, &o.one_buffer, NULL, "ucx_perftest's shape: one block a thread", 0, 0, NULL},
    {"--window", HB_UNS, &o.window, "W", "batches in flight a thread (1: sync)", 1, PEERS_MAX_WINDOW, NULL},
    {"--raw", HB_STR, &o.raw, "FILE", "report: run_peers.sh's raw records", 0, 0, NULL},
    {"--md", HB_STR, &o.md, "FILE", "report: the tables (default stdout)", 0, 0, NULL},
    {"--json", HB_STR, &o.json, "FILE", "report: the JSON", 0, 0, NULL},
    {NULL, 0, NULL, NULL, NULL, 0, 0, NULL}};

int main(int argc, char **argv) {
  static const char head[] =
      "hixl with Mooncake transfer_engine_bench's knobs and throughput formula (the file's head);\n"
      "--name=value, as Mooncake's flags, or --name value. A target needs --local_server_name, an\n"
      "initiator --segment_id and --remote_addr, a report --raw.\n";
  hb_prog = "hixl-peers";
  hb_parse(argc, argv, opts, head);
  bool target = o.mode == MODE_TARGET && o.local != NULL;
  if (!target && !(o.mode == MODE_INITIATOR && o.segment && o.remote_addr) &&
      !(o.mode == MODE_REPORT && o.raw)) {
    hb_usage(stderr, opts, head);
    return 2;
  }
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (o.mode == MODE_REPORT) return run_report(o.raw, o.md, o.json);
  if (target) return run_target();
  if (o.local == NULL) o.local = "127.0.0.1";
  return run_initiator();
}
