/* hixl-mock-host: what the router prints: the progress bar, the verdict and the
 * summary (stdout, and --json's file). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mh.h"

static const char *human_bytes(uint64_t b, char *buf, size_t cap) {
  if (b >= (1ull << 30))
    snprintf(buf, cap, "%.3f GiB", (double)b / (1ull << 30));
  else if (b >= (1ull << 20))
    snprintf(buf, cap, "%.3f MiB", (double)b / (1ull << 20));
  else
    snprintf(buf, cap, "%.3f KiB", (double)b / 1024);
  return buf;
}

void mh_progress(const struct mh_router *rt, bool last) {
  if (!rt->o->progress || !isatty(2)) return;
  const int w = 30;
  uint32_t n = rt->o->requests;
  int fill = (int)((uint64_t)rt->ndone * w / (n ? n : 1));
  char hb[32];
  fprintf(stderr, "\r\033[K[%.*s%*s] %u/%u  verified %u  failed %u  %s  %.1f s", fill,
          "##############################", w - fill, "", rt->ndone, n, rt->nverified,
          rt->nfail + rt->ncorrupt, human_bytes(rt->bytes, hb, sizeof(hb)),
          (double)(mh_now_ns() - rt->t_start) / 1e9);
  if (last) fprintf(stderr, "\r\033[K");
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

struct span {
  uint64_t from, to;
};

static int cmp_span(const void *a, const void *b) {
  return cmp_u64(&((const struct span *)a)->from, &((const struct span *)b)->from);
}

/* The time at least one of the n spans was under way (sorts them). */
static uint64_t spans_union(struct span *v, size_t n) {
  uint64_t busy = 0, end = 0;
  qsort(v, n, sizeof(*v), cmp_span);
  for (size_t i = 0; i < n; i++) {
    uint64_t from = v[i].from > end ? v[i].from : end;
    if (v[i].to > from) busy += v[i].to - from;
    if (v[i].to > end) end = v[i].to;
  }
  return busy;
}

/* What the summary says of the run, from the requests and the instances' reports. */
struct figures {
  uint64_t tokens;  /* prompt tokens of the requests that ended */
  size_t nlat;      /* hand-offs timed: verified requests with both ends' times */
  double p50, p99;  /* hand-off latency, ms */
  uint64_t hbytes;  /* KV bytes of the hand-offs timed */
  double busy_secs; /* the time at least one of them was under way */
  double hgbps;     /* hbytes / busy_secs: KV over the hand-offs, without the host's own fill and check */
  double secs, gbps, ops_per_req;
  struct mh_phases ph; /* the hand-off's phases, from the plugin's traces */
};

static void figures(const struct mh_router *rt, struct figures *f) {
  const struct mh_opts *o = rt->o;
  const struct mh_child *P = &rt->side[0], *D = &rt->side[1];
  *f = (struct figures){0};
  uint64_t *lat = calloc(o->requests ? o->requests : 1, sizeof(*lat));
  struct span *sp = calloc(o->requests ? o->requests : 1, sizeof(*sp));
  for (uint32_t i = 0; i < o->requests; i++) {
    if (rt->r[i].state == MH_R_DONE) f->tokens += rt->r[i].prompt;
    if (lat && sp && rt->r[i].outcome == MH_VERIFIED && rt->r[i].t_saved &&
        rt->r[i].t_held > rt->r[i].t_saved) {
      sp[f->nlat] = (struct span){rt->r[i].t_saved, rt->r[i].t_held};
      lat[f->nlat++] = rt->r[i].t_held - rt->r[i].t_saved;
      f->hbytes += rt->r[i].bytes;
    }
  }
  if (lat) qsort(lat, f->nlat, sizeof(*lat), cmp_u64);
  f->p50 = f->nlat ? (double)lat[(f->nlat - 1) / 2] / 1e6 : 0;
  f->p99 = f->nlat ? (double)lat[(f->nlat * 99 + 99) / 100 - 1] / 1e6 : 0;
  /* KV over the hand-offs (hixl-py-host computes the same): pull moves a request's whole
   * KV between its last layer saved and decode holding it; push only what is left then. */
  f->busy_secs = sp ? (double)spans_union(sp, f->nlat) / 1e9 : 0;
  f->hgbps = f->busy_secs > 0 ? (double)f->hbytes / f->busy_secs / 1e9 : 0;
  free(sp);
  free(lat);
  f->secs = (double)(rt->t_end - rt->t_start) / 1e9;
  f->gbps = f->secs > 0 ? (double)rt->bytes / f->secs / 1e9 : 0;
  mh_obs_phases(rt, &f->ph);
  /* Engine ops are issued by whoever moves the data: decode's loader (pull) or prefill's pusher;
   * with TP every rank moves its part of each request: the ops of all of them per request. */
  if (!rt->push && D->stats_in && D->s.stats_ok && D->s.ks.loads_done)
    f->ops_per_req = (double)D->s.ks.engine_ops * D->s.tp / (double)D->s.ks.loads_done;
  if (rt->push && P->stats_in && P->s.stats_ok && P->s.ks.pushes_done)
    f->ops_per_req = (double)P->s.ks.engine_ops * P->s.tp / (double)P->s.ks.pushes_done;
}

/* What the decode ranks needed of the verified requests: each rank its heads of each
 * request's blocks (a head replicated on several ranks, once for each). */
static uint64_t tp_bytes_needed(const struct mh_router *rt, const struct mh_model *md) {
  const struct mh_opts *o = rt->o;
  uint64_t need = 0;
  for (uint32_t i = 0; i < o->requests; i++) {
    if (rt->r[i].outcome != MH_VERIFIED) continue;
    for (uint32_t r = 0; r < o->tp[1]; r++) {
      struct mh_model rm = mh_rank_model(md, r, o->tp[1]);
      need += mh_request_blocks(&rm, rt->r[i].prompt) * mh_pool_block_bytes(&rm);
    }
  }
  return need;
}

/* Every rank of the instance reported at exit (TP 1: the one). */
static bool ranks_alive(const struct mh_child *c) {
  for (uint32_t r = 0; r < c->s.tp; r++)
    if (!c->s.rk[r].alive) return false;
  return c->s.tp > 0;
}

/* --expect-device-ipc (--expect-device-rdma): the side that moves the KV moved every byte
 * decode loaded on the peer's device memory opened by IPC handle (by RDMA directly), and
 * the other side moved none that way. */
static bool dev_moved(const struct mh_router *rt) {
  const struct mh_child *mover = &rt->side[rt->push ? 0 : 1], *other = &rt->side[rt->push ? 1 : 0];
  const struct mh_child *D = &rt->side[1];
  bool ipc = rt->o->expect_ipc;
  if (!ipc && !rt->o->expect_rdma) return true;
  uint64_t moved = ipc ? mover->s.ipc_bytes : mover->s.rdma_bytes,
           idle = ipc ? other->s.ipc_bytes : other->s.rdma_bytes;
  return D->stats_in && mover->stats_in && other->stats_in && D->s.stats_ok && D->s.ks.bytes_loaded > 0 &&
         moved == D->s.ks.bytes_loaded && idle == 0;
}

bool mh_verdict(const struct mh_router *rt) {
  const struct mh_opts *o = rt->o;
  const struct mh_child *P = &rt->side[0], *D = &rt->side[1];
  bool p_clean = P->stats_in && P->s.blocks_free == P->s.blocks_total && P->s.requests_left == 0 &&
                 (!P->s.stats_ok || P->s.ks.blocks_held == 0) && ranks_alive(P) && P->s.twice == 0;
  bool d_pool =
      D->stats_in && D->s.blocks_free == D->s.blocks_total && D->s.requests_left == 0 && D->s.twice == 0;
  bool d_clean = d_pool && ranks_alive(D);
  bool base = !rt->timed_out && !rt->fatal && rt->exits_clean;
  if (o->fault == MH_FAULT_MISMATCH_HEADS) /* every request moved, and every one caught */
    return base && rt->ncorrupt == o->requests && p_clean && d_clean && rt->ndone == o->requests;
  if (o->fault == MH_FAULT_DECODE_RANK_DIES) /* its loads failed; those before it verified */
    return base && d_pool && !D->s.rk[D->s.tp - 1].alive && rt->nfail > 0 && rt->nverified > 0 &&
           !rt->ncorrupt && p_clean && rt->ndone == o->requests;
  /* TP: the decode ranks read what they needed, no more (replicated heads once each). */
  bool tp_bytes = !o->model.tp || (D->s.stats_ok && D->s.ks.bytes_loaded == tp_bytes_needed(rt, &o->model));
  /* ... and every prefill rank was freed by its consumer ranks, none left to its lease
   * (a producer rank no consumer rank reads included: one of them frees it). */
  bool tp_freed = !o->model.tp || (P->s.stats_ok && P->s.ks.lease_expired == 0);
  if (o->fault == MH_FAULT_NONE)
    return base && rt->nverified == o->requests && p_clean && d_clean && tp_bytes && tp_freed &&
           dev_moved(rt);
  if (o->fault == MH_FAULT_INTRUDER) /* nothing let in, nothing learned, the hand-off untouched */
    return base && rt->nverified == o->requests && p_clean && d_clean && rt->intruder_in &&
           rt->intrusion.attempts > 0 && rt->intrusion.admitted == 0 && rt->intrusion.entries_seen == 0 &&
           rt->intrusion.refused == rt->intrusion.attempts;
  if (o->fault == MH_FAULT_DECODE_DIES) /* pull: what prefill held for it went back by its lease */
    return base && D->dead && !D->stats_in && rt->nfail > 0 && !rt->ncorrupt && p_clean &&
           rt->ndone == o->requests && (rt->push || (P->s.stats_ok && P->s.ks.lease_expired > 0));
  if (o->fault == MH_FAULT_PREFILL_DIES)
    return base && P->dead && !P->stats_in && rt->nfail + rt->nrecomputed > 0 && !rt->ncorrupt && d_clean &&
           rt->ndone == o->requests;
  if (o->fault == MH_FAULT_DECODE_ABORTS) /* that one request, and only it */
    return base && rt->nfail == 1 && !rt->nrecomputed && !rt->ncorrupt && p_clean && d_clean &&
           rt->nverified == o->requests - 1;
  if (o->fault == MH_FAULT_LINK_CUT)
    return base && rt->nfail + rt->nrecomputed > 0 && !rt->ncorrupt && p_clean && d_clean &&
           rt->ndone == o->requests && rt->nverified_after_cut > 0; /* the link comes back */
  if (o->fault == MH_FAULT_LINK_RESET) /* the link comes back; in pull mode, every failed load */
    return base && rt->nreset > 0 && !rt->ncorrupt && p_clean && d_clean && rt->ndone == o->requests &&
           rt->nverified_after_cut > 0 &&
           (rt->push || (P->s.stats_ok && P->s.ks.lease_expired == 0)); /* freed */
  return base && rt->nfail + rt->nrecomputed == o->requests && !rt->ncorrupt && p_clean && d_clean;
}

/* --json: the summary as one JSON object; -1 (said on stderr) when the file cannot be
 * written. */
static int write_json(const struct mh_router *rt, const struct mh_model *md, const struct figures *f,
                      bool pass) {
  const struct mh_opts *o = rt->o;
  const struct mh_model *m = &o->model;
  const char *fault = mh_fault_name(o->fault);
  FILE *fp = fopen(o->json, "w");
  if (!fp) {
    fprintf(stderr, "hixl-mock-host: --json %s: %m\n", o->json);
    return -1;
  }
  fprintf(fp,
          "{\"model\": \"%s\", \"layout\": \"%s\", \"mode\": \"%s\", \"layers\": %u, \"kv_heads\": %u, "
          "\"head_dim\": %u, "
          "\"elem_size\": %u, "
          "\"block_tokens\": %u,\n \"fault\": \"%s\", \"requests\": %u, \"concurrency\": %u, "
          "\"prompt_tokens\": %" PRIu64 ",\n"
          " \"verified\": %u, \"recomputed\": %u, \"failed\": %u, \"corrupt\": %u, "
          "\"kv_bytes_verified\": %" PRIu64 ",\n"
          " \"seconds\": %.6f, \"gb_per_s\": %.4f, \"handoff_ms_p50\": %.4f, \"handoff_ms_p99\": %.4f, "
          "\"engine_ops_per_request\": %.2f,\n \"handoff_bytes\": %" PRIu64
          ", \"handoff_busy_s\": %.6f, \"handoff_gb_per_s\": %.4f,\n"
          " \"transfer_gb_per_s\": %.4f, \"transfer_gb_per_s_p50\": %.4f,\n",
          m->name, mh_layout_name(m->layout), rt->push ? "push" : "pull", m->layers, m->kv_heads, m->head_dim,
          m->elem_size, m->block_tokens, fault, o->requests, o->concurrency, f->tokens, rt->nverified,
          rt->nrecomputed, rt->nfail, rt->ncorrupt, rt->bytes, f->secs, f->gbps, f->p50, f->p99,
          f->ops_per_req, f->hbytes, f->busy_secs, f->hgbps, f->ph.xfer_gbps, f->ph.xfer_gbps_p50);
  static const char *const keys[MH_NPHASES] = {"wait_blocks", "pin", "transfer", "last_notice", "wake_up"};
  fprintf(fp, " \"phases_timed\": %zu, \"phases_ms\": {", f->ph.n);
  for (int p = 0; p < MH_NPHASES; p++)
    fprintf(fp, "%s\"%s\": [%.4f, %.4f]", p ? ", " : "", keys[p], f->ph.p50[p], f->ph.p99[p]);
  fprintf(fp, "},\n");
  for (int k = 0; k < 2; k++) {
    const struct mh_child *s = &rt->side[k];
    fprintf(fp,
            " \"%s\": {\"reported\": %s, \"blocks_total\": %" PRIu64 ", \"blocks_free\": %" PRIu64
            ", \"blocks_held\": %" PRIu64 ", \"loads_done\": %" PRIu64 ", \"loads_failed\": %" PRIu64
            ", \"lease_expired\": %" PRIu64 ", \"bytes_loaded\": %" PRIu64 ", \"engine_ops\": %" PRIu64
            "},\n",
            s->name, s->stats_in ? "true" : "false", s->s.blocks_total, s->s.blocks_free, s->s.ks.blocks_held,
            s->s.ks.loads_done, s->s.ks.loads_failed, s->s.ks.lease_expired, s->s.ks.bytes_loaded,
            s->s.ks.engine_ops);
  }
  if (m->tp) { /* each side's TP size and its ranks' counters */
    fprintf(fp,
            " \"prefill_tp\": %u, \"decode_tp\": %u, \"kv_bytes_moved\": %" PRIu64
            ", \"kv_bytes_needed\": %" PRIu64 ",\n",
            o->tp[0], o->tp[1], rt->side[1].s.ks.bytes_loaded, tp_bytes_needed(rt, md));
    for (int k = 0; k < 2; k++) {
      const struct mh_child *s = &rt->side[k];
      fprintf(fp, " \"%s_ranks\": [", s->name);
      for (uint32_t r = 0; s->stats_in && r < s->s.tp; r++) {
        const struct mh_side_rank *q = &s->s.rk[r];
        fprintf(fp,
                "%s{\"alive\": %s, \"blocks_held\": %" PRIu64 ", \"lease_expired\": %" PRIu64
                ", \"loads_done\": %" PRIu64 ", \"loads_failed\": %" PRIu64 ", \"bytes_loaded\": %" PRIu64
                ", \"engine_ops\": %" PRIu64 ", \"pushes_done\": %" PRIu64 "}",
                r ? ", " : "", q->alive ? "true" : "false", q->ks.blocks_held, q->ks.lease_expired,
                q->ks.loads_done, q->ks.loads_failed, q->ks.bytes_loaded, q->ks.engine_ops,
                q->ks.pushes_done);
      }
      fprintf(fp, "],\n");
    }
  }
  fprintf(fp, " \"pass\": %s}\n", pass ? "true" : "false");
  fclose(fp);
  return 0;
}

int mh_report(const struct mh_router *rt, const struct mh_model *md, bool pass) {
  const struct mh_opts *o = rt->o;
  const struct mh_child *P = &rt->side[0];
  const char *fault = mh_fault_name(o->fault);
  struct figures f;
  figures(rt, &f);
  const struct mh_model *m = &o->model;
  printf("hixl-mock-host: %s model (%u layers, %s, %u KV heads x %u x %u B, %u-token blocks), %s layout, %s "
         "mode, KV in %s memory\n",
         m->name, m->layers, mh_kv_parts(m) == 1 ? "a latent" : "K and V", m->kv_heads, m->head_dim,
         m->elem_size, m->block_tokens, mh_layout_name(m->layout), rt->push ? "push" : "pull",
         strcmp(o->kv_memory, "host") == 0         ? "the host's"
         : strcmp(o->kv_memory, "cuda") == 0       ? "CUDA device (cuMemAlloc'd)"
         : strcmp(o->kv_memory, "device-sim") == 0 ? "simulated device"
                                                   : "hixl's");
  printf("  prefill %" PRIu64 " blocks, decode %" PRIu64 " blocks%s%s, %u requests of %" PRIu64 "..%" PRIu64
         " tokens, concurrency %u\n",
         m->num_blocks, md->num_blocks, o->fault ? ", fault " : "", o->fault ? fault : "", o->requests,
         o->min_prompt, o->max_prompt, o->concurrency);
  if (m->tp) {
    uint32_t h0, n0, h1, n1;
    mh_rank_heads(m->kv_heads, 0, o->tp[0], &h0, &n0);
    mh_rank_heads(m->kv_heads, 0, o->tp[1], &h1, &n1);
    if (m->kind == MH_MODEL_MLA) n0 = n1 = 1;
    printf("  %-28s prefill TP %u, decode TP %u (%u and %u KV heads a rank%s)\n", "tensor parallel", o->tp[0],
           o->tp[1], n0, n1, m->kind == MH_MODEL_MLA ? ": the latent, on every rank" : "");
  }
  if (m->tp)
    printf("  %-28s %" PRIu64 " moved (decode bytes_loaded, every rank's), %" PRIu64 " needed\n",
           "KV bytes moved / needed", rt->side[1].s.ks.bytes_loaded, tp_bytes_needed(rt, md));
  if (o->expect_ipc || o->expect_rdma)
    printf("  %-28s prefill %" PRIu64 ", decode %" PRIu64 " (decode bytes_loaded %" PRIu64 ")\n",
           o->expect_ipc ? "KV bytes by IPC handle" : "KV bytes by RDMA (GPUDirect)",
           o->expect_ipc ? rt->side[0].s.ipc_bytes : rt->side[0].s.rdma_bytes,
           o->expect_ipc ? rt->side[1].s.ipc_bytes : rt->side[1].s.rdma_bytes, rt->side[1].s.ks.bytes_loaded);
  printf("  %-28s %u\n", "requests", o->requests);
  printf("  %-28s %" PRIu64 "\n", "prompt tokens", f.tokens);
  char hb[32];
  printf("  %-28s %s\n", "KV bytes verified", human_bytes(rt->bytes, hb, sizeof(hb)));
  printf("  %-28s %.2f GB/s (%.2f s)\n", "GB/s (verified KV / wall)", f.gbps, f.secs);
  if (f.ph.xfer_gbps > 0)
    printf("  %-28s %.2f GB/s while a transfer was in flight; per request p50 %.2f GB/s\n",
           "GB/s (the transfers' own)", f.ph.xfer_gbps, f.ph.xfer_gbps_p50);
  if (f.nlat)
    printf("  %-28s %.2f ms / %.2f ms (%zu requests)\n", "hand-off p50 / p99", f.p50, f.p99, f.nlat);
  else
    printf("  %-28s n/a (no request loaded)\n", "hand-off p50 / p99");
  if (f.busy_secs > 0)
    printf("  %-28s %.2f GB/s (%.2f s with a hand-off under way)\n", "GB/s over the hand-offs", f.hgbps,
           f.busy_secs);
  if (f.ph.n) {
    printf("  %-28s p50 / p99 (ms), from the plugin's traces (%zu requests)\n", "hand-off phases", f.ph.n);
    for (int p = 0; p < MH_NPHASES; p++)
      printf("    %-26s %9.3f / %9.3f\n", mh_phase_names[p], f.ph.p50[p], f.ph.p99[p]);
  }
  if (f.ops_per_req > 0)
    printf("  %-28s %.1f (%s%s)\n", "engine ops per request", f.ops_per_req,
           rt->push ? "prefill engine_ops / pushes_done" : "decode engine_ops / loads_done",
           m->tp ? ", every rank's" : "");
  else
    printf("  %-28s n/a\n", "engine ops per request");
  for (int k = 0; k < 2; k++) {
    const struct mh_child *s = &rt->side[k];
    char line[160];
    if (s->stats_in)
      snprintf(line, sizeof(line), "%" PRIu64 " of %" PRIu64 " held, plugin blocks_held %" PRIu64 "%s",
               s->s.blocks_total - s->s.blocks_free, s->s.blocks_total, s->s.ks.blocks_held,
               k == 0 && s->s.ks.lease_expired ? " (some freed by lease expiry)" : "");
    else
      snprintf(line, sizeof(line), "%s", s->dead ? "died (no report)" : "no report");
    printf("  %-28s %s\n", k == 0 ? "prefill blocks at exit" : "decode blocks at exit", line);
    if (!s->stats_in || s->s.tp < 2) continue;
    for (uint32_t r = 0; r < s->s.tp; r++) { /* each rank's engine */
      const struct mh_side_rank *q = &s->s.rk[r];
      char what[64];
      if (!q->alive)
        snprintf(what, sizeof(what), "gone");
      else if (k == 0)
        snprintf(what, sizeof(what), "blocks_held %" PRIu64 ", leases expired %" PRIu64, q->ks.blocks_held,
                 q->ks.lease_expired);
      else
        snprintf(what, sizeof(what), "blocks_held %" PRIu64 ", loads %" PRIu64 " done %" PRIu64 " failed",
                 q->ks.blocks_held, q->ks.loads_done, q->ks.loads_failed);
      char label[32];
      snprintf(label, sizeof(label), "%s rank %u", s->name, r);
      printf("    %-26s %s\n", label, what);
    }
    if (s->s.twice) printf("    %-26s %u\n", "reported twice (a bug)", s->s.twice);
  }
  if (rt->nfail || rt->nrecomputed || rt->ncorrupt)
    printf("  %-28s failed %u, recomputed %u, corrupt %u\n", "not verified", rt->nfail, rt->nrecomputed,
           rt->ncorrupt);
  printf("  %-28s %s\n", "links",
         rt->key_file ? "authenticated: both instances hold a key (AuthKeyFile)"
                      : "no key: anyone who reaches a port may link");
  for (int k = 0; k < 2 && rt->plugin[0]; k++)
    printf("  %-28s %s (ABI %u.%u)\n", k ? "decode plugin" : "prefill plugin", rt->plugin[k],
           rt->abi[k] >> 16, rt->abi[k] & 0xffff);
  if (o->fault == MH_FAULT_INTRUDER)
    printf("  %-28s %" PRIu64 " connections, %" PRIu64 " refused, %" PRIu64 " let in, %" PRIu64
           " memory entries learned%s\n",
           "intruder (no key)", rt->intrusion.attempts, rt->intrusion.refused, rt->intrusion.admitted,
           rt->intrusion.entries_seen, rt->intruder_in ? "" : " (it did not report)");
  if (o->fault == MH_FAULT_LINK_CUT)
    printf("  %-28s %u of %u verified\n", "started once prefill resumed", rt->nverified_after_cut,
           rt->nafter_cut);
  if (o->fault == MH_FAULT_LINK_RESET) {
    printf("  %-28s %u TCP connection(s) of prefill\n", "shut down", rt->nreset);
    printf("  %-28s %u of %u verified\n", "started after the reset", rt->nverified_after_cut, rt->nafter_cut);
    if (!rt->push)
      printf("  %-28s %" PRIu64 " (0: every failed load freed its request over a new link)\n",
             "prefill leases expired", P->s.ks.lease_expired);
  }
  if (o->fault)
    printf("  fault %s: %s\n", fault,
           !pass ? "NOT handled as expected"
           : o->fault == MH_FAULT_MISMATCH_HEADS
               ? "every request's wrong heads caught, both sides hold zero blocks"
               : "reported, no byte wrong, the surviving side holds zero blocks");
  printf("  %-28s %u/%u requests, every byte checked%s\n", "verified", rt->nverified, o->requests,
         pass ? "" : "  FAIL");

  return o->json ? write_json(rt, md, &f, pass) : 0;
}
