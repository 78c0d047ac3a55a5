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

/* What the summary says of the run, from the requests and the instances' reports. */
struct figures {
  uint64_t tokens; /* prompt tokens of the requests that ended */
  size_t nlat;     /* hand-offs timed: verified requests with both ends' times */
  double p50, p99; /* hand-off latency, ms */
  double secs, gbps, ops_per_req;
  struct mh_phases ph; /* the hand-off's phases, from the plugin's traces */
};

static void figures(const struct mh_router *rt, struct figures *f) {
  const struct mh_opts *o = rt->o;
  const struct mh_child *P = &rt->side[0], *D = &rt->side[1];
  *f = (struct figures){0};
  uint64_t *lat = calloc(o->requests ? o->requests : 1, sizeof(*lat));
  for (uint32_t i = 0; i < o->requests; i++) {
    if (rt->r[i].state == MH_R_DONE) f->tokens += rt->r[i].prompt;
    if (lat && rt->r[i].outcome == MH_VERIFIED && rt->r[i].t_saved && rt->r[i].t_held > rt->r[i].t_saved)
      lat[f->nlat++] = rt->r[i].t_held - rt->r[i].t_saved;
  }
  if (lat) qsort(lat, f->nlat, sizeof(*lat), cmp_u64);
  f->p50 = f->nlat ? (double)lat[(f->nlat - 1) / 2] / 1e6 : 0;
  f->p99 = f->nlat ? (double)lat[(f->nlat * 99 + 99) / 100 - 1] / 1e6 : 0;
  free(lat);
  f->secs = (double)(rt->t_end - rt->t_start) / 1e9;
  f->gbps = f->secs > 0 ? (double)rt->bytes / f->secs / 1e9 : 0;
  mh_obs_phases(rt, &f->ph);
  /* Engine ops are issued by whoever moves the data: decode's loader (pull) or prefill's pusher. */
  if (!rt->push && D->stats_in && D->s.stats_ok && D->s.ks.loads_done)
    f->ops_per_req = (double)D->s.ks.engine_ops / (double)D->s.ks.loads_done;
  if (rt->push && P->stats_in && P->s.stats_ok && P->s.ks.pushes_done)
    f->ops_per_req = (double)P->s.ks.engine_ops / (double)P->s.ks.pushes_done;
}

bool mh_verdict(const struct mh_router *rt) {
  const struct mh_opts *o = rt->o;
  const struct mh_child *P = &rt->side[0], *D = &rt->side[1];
  bool p_clean = P->stats_in && P->s.blocks_free == P->s.blocks_total && P->s.requests_left == 0 &&
                 (!P->s.stats_ok || P->s.ks.blocks_held == 0);
  bool d_clean = D->stats_in && D->s.blocks_free == D->s.blocks_total && D->s.requests_left == 0;
  bool base = !rt->timed_out && !rt->fatal && rt->exits_clean;
  if (o->fault == MH_FAULT_NONE) return base && rt->nverified == o->requests && p_clean && d_clean;
  if (o->fault == MH_FAULT_INTRUDER) /* nothing let in, nothing learned, the hand-off untouched */
    return base && rt->nverified == o->requests && p_clean && d_clean && rt->intruder_in &&
           rt->intrusion.attempts > 0 && rt->intrusion.admitted == 0 && rt->intrusion.entries_seen == 0 &&
           rt->intrusion.refused == rt->intrusion.attempts;
  if (o->fault == MH_FAULT_DECODE_DIES)
    return base && D->dead && !D->stats_in && rt->nfail > 0 && !rt->ncorrupt && p_clean &&
           rt->ndone == o->requests;
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
static int write_json(const struct mh_router *rt, const struct figures *f, bool pass) {
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
          "\"engine_ops_per_request\": %.2f, \"transfer_gb_per_s\": %.4f, \"transfer_gb_per_s_p50\": %.4f,\n",
          m->name, mh_layout_name(m->layout), rt->push ? "push" : "pull", m->layers, m->kv_heads, m->head_dim,
          m->elem_size, m->block_tokens, fault, o->requests, o->concurrency, f->tokens, rt->nverified,
          rt->nrecomputed, rt->nfail, rt->ncorrupt, rt->bytes, f->secs, f->gbps, f->p50, f->p99,
          f->ops_per_req, f->ph.xfer_gbps, f->ph.xfer_gbps_p50);
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
         strcmp(o->kv_memory, "host") == 0 ? "the host's" : "hixl's");
  printf("  prefill %" PRIu64 " blocks, decode %" PRIu64 " blocks%s%s, %u requests of %" PRIu64 "..%" PRIu64
         " tokens, concurrency %u\n",
         m->num_blocks, md->num_blocks, o->fault ? ", fault " : "", o->fault ? fault : "", o->requests,
         o->min_prompt, o->max_prompt, o->concurrency);
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
  if (f.ph.n) {
    printf("  %-28s p50 / p99 (ms), from the plugin's traces (%zu requests)\n", "hand-off phases", f.ph.n);
    for (int p = 0; p < MH_NPHASES; p++)
      printf("    %-26s %9.3f / %9.3f\n", mh_phase_names[p], f.ph.p50[p], f.ph.p99[p]);
  }
  if (f.ops_per_req > 0)
    printf("  %-28s %.1f (%s)\n", "engine ops per request", f.ops_per_req,
           rt->push ? "prefill engine_ops / pushes_done" : "decode engine_ops / loads_done");
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
  }
  if (rt->nfail || rt->nrecomputed || rt->ncorrupt)
    printf("  %-28s failed %u, recomputed %u, corrupt %u\n", "not verified", rt->nfail, rt->nrecomputed,
           rt->ncorrupt);
  printf("  %-28s %s\n", "links",
         rt->key_file ? "authenticated: both instances hold a key (AuthKeyFile)"
                      : "no key: anyone who reaches a port may link");
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
           pass ? "reported, no byte wrong, the surviving side holds zero blocks"
                : "NOT handled as expected");
  printf("  %-28s %u/%u requests, every byte checked%s\n", "verified", rt->nverified, o->requests,
         pass ? "" : "  FAIL");

  return o->json ? write_json(rt, &f, pass) : 0;
}
