/* test_obs: the plugin's observer (plugin/src/kv_obs.c), white-box: histogram buckets
 * and the Prometheus text against values worked out by hand, failures counted once per
 * request under the cause set first, traces as JSON lines (phases, bytes, ops, cause),
 * the bounded ring, trace_file, and the ops' argument checks. */
#include <CUnit/Basic.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv_int.h"
#include "kv_obs.h"

static hixl_kv_connector *conn_new(bool metrics, uint32_t ring, const char *file, bool push) {
  hixl_kv_connector *c = calloc(1, sizeof(*c));
  c->role = HIXL_KV_ROLE_WORKER;
  c->rank = 3;
  c->efd = -1;
  c->cfg.consumer = true;
  c->cfg.push = push;
  c->cfg.metrics = metrics;
  c->cfg.trace_ring = ring;
  snprintf(c->cfg.trace_file, sizeof(c->cfg.trace_file), "%s", file ? file : "");
  pthread_mutex_init(&c->lock, NULL);
  char why[256] = "";
  CU_ASSERT_EQUAL_FATAL(kv_obs_new(&c->cfg, c->role, c->rank, &c->obs, why, sizeof(why)), HIXL_KV_SUCCESS);
  return c;
}

static void conn_free(hixl_kv_connector *c) {
  kv_obs_free(c->obs);
  kv_idset_clear(&c->recving_done);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

static char *render(hixl_kv_connector *c) {
  hixl_kv_buffer b = {0};
  CU_ASSERT_EQUAL_FATAL(kv_render_metrics(c, &b), HIXL_KV_SUCCESS);
  return (char *)b.data;
}

#define HAS_LINE(text, line) CU_ASSERT_PTR_NOT_NULL(strstr((text), line "\n"))

/* How many lines of the file at path hold s (0: no file). */
static int lines_with(const char *path, const char *s) {
  FILE *f = fopen(path, "r");
  char line[4096];
  int n = 0;
  while (f && fgets(line, sizeof(line), f)) n += strstr(line, s) != NULL;
  if (f) fclose(f);
  return n;
}

/* Bucket i holds values up to 2^(lo + i): 1000 ns and 0 in the first (1.024 us), 1025 ns
 * in the second, 2^40 ns past the last (68.7 s) in +Inf; cumulative counts; _count is
 * the +Inf bucket's; _sum in seconds. */
static void test_histogram_text(void) {
  hixl_kv_connector *c = conn_new(true, 0, NULL, false);
  kv_obs_hist(c, KV_H_TRANSFER, 0);
  kv_obs_hist(c, KV_H_TRANSFER, 1000);
  kv_obs_hist(c, KV_H_TRANSFER, 1025);
  kv_obs_hist(c, KV_H_TRANSFER, 1ull << 40);
  kv_obs_hist(c, KV_H_BYTES, 4096); /* ceil(log2) 12, lo 10: the le="4096" bucket */
  kv_obs_hist(c, KV_H_OPS, 1);      /* lo 0: le="1" */
  kv_obs_hist(c, KV_H_OPS, 3);      /* le="4" */
  char *t = render(c);
  HAS_LINE(t, "# TYPE hixl_kv_transfer_seconds histogram");
  HAS_LINE(t,
           "hixl_kv_transfer_seconds_bucket{role=\"consumer\",rank=\"3\",mode=\"pull\",le=\"1.024e-06\"} 2");
  HAS_LINE(t,
           "hixl_kv_transfer_seconds_bucket{role=\"consumer\",rank=\"3\",mode=\"pull\",le=\"2.048e-06\"} 3");
  HAS_LINE(t,
           "hixl_kv_transfer_seconds_bucket{role=\"consumer\",rank=\"3\",mode=\"pull\",le=\"68.7194767\"} 3");
  HAS_LINE(t, "hixl_kv_transfer_seconds_bucket{role=\"consumer\",rank=\"3\",mode=\"pull\",le=\"+Inf\"} 4");
  HAS_LINE(t, "hixl_kv_transfer_seconds_sum{role=\"consumer\",rank=\"3\",mode=\"pull\"} 1099.51163");
  HAS_LINE(t, "hixl_kv_transfer_seconds_count{role=\"consumer\",rank=\"3\",mode=\"pull\"} 4");
  HAS_LINE(t, "hixl_kv_transfer_bytes_bucket{role=\"consumer\",rank=\"3\",mode=\"pull\",le=\"2048\"} 0");
  HAS_LINE(t, "hixl_kv_transfer_bytes_bucket{role=\"consumer\",rank=\"3\",mode=\"pull\",le=\"4096\"} 1");
  HAS_LINE(t, "hixl_kv_transfer_bytes_sum{role=\"consumer\",rank=\"3\",mode=\"pull\"} 4096");
  HAS_LINE(t, "hixl_kv_transfer_ops_bucket{role=\"consumer\",rank=\"3\",mode=\"pull\",le=\"1\"} 1");
  HAS_LINE(t, "hixl_kv_transfer_ops_bucket{role=\"consumer\",rank=\"3\",mode=\"pull\",le=\"2\"} 1");
  HAS_LINE(t, "hixl_kv_transfer_ops_bucket{role=\"consumer\",rank=\"3\",mode=\"pull\",le=\"4\"} 2");
  HAS_LINE(t, "hixl_kv_pin_seconds_count{role=\"consumer\",rank=\"3\",mode=\"pull\"} 0");
  HAS_LINE(t, "hixl_kv_loads_done_total{role=\"consumer\",rank=\"3\",mode=\"pull\"} 0");
  /* Every family's header comes once, right before its samples. */
  CU_ASSERT_PTR_NULL(
      strstr(strstr(t, "# TYPE hixl_kv_transfer_seconds ") + 1, "# TYPE hixl_kv_transfer_seconds "));
  free(t);
  conn_free(c);
}

/* A request's trace: its phases in order, bytes and ops added up, the transfer
 * histogram from posted to last byte; a failure counted once, under the cause set
 * ahead; the counters by cause in the text. */
static void test_trace_and_causes(void) {
  hixl_kv_connector *c = conn_new(true, 8, NULL, false);
  kv_obs_phase(c, "r1", KV_PH_BOUND, NULL);
  uint64_t t0 = kv_obs_phase(c, "r1", KV_PH_PIN, "127.0.0.1:5000");
  kv_obs_span(c, "r1", KV_PH_PINNED, KV_H_PIN, t0);
  kv_obs_phase(c, "r1", KV_PH_POSTED, NULL);
  kv_obs_moved(c, "r1", 1000, 3);
  kv_obs_moved(c, "r1", 24, 1);
  kv_obs_landed(c, "r1", NULL);
  kv_finished_add(c, &c->recving_done, "r1"); /* DONE, as the connector marks it */
  kv_obs_phase(c, "r2", KV_PH_BOUND, "127.0.0.1:5000");
  kv_obs_cause_set(c, "r2", KV_CAUSE_LEASE);
  kv_obs_failed(c, "r2", KV_CAUSE_ABORTED, "no producer wrote \"all\" layers"); /* counted as lease_expired */
  kv_obs_failed(c, "r2", KV_CAUSE_TIMEOUT, "again");                            /* not counted again */
  kv_obs_count(c, KV_CAUSE_REFUSED);
  kv_obs_phase(c, "r3", KV_PH_BOUND, NULL); /* never reported: not drained */
  const char *ids[] = {"r1", "r2", "unknown"};
  hixl_kv_ids got = {ids, 3};
  kv_obs_reported(c, &got);

  char *t = render(c);
  HAS_LINE(t, "hixl_kv_failures_total{role=\"consumer\",rank=\"3\",mode=\"pull\",cause=\"lease_expired\"} 1");
  HAS_LINE(t, "hixl_kv_failures_total{role=\"consumer\",rank=\"3\",mode=\"pull\",cause=\"aborted\"} 0");
  HAS_LINE(t, "hixl_kv_failures_total{role=\"consumer\",rank=\"3\",mode=\"pull\",cause=\"timeout\"} 0");
  HAS_LINE(t, "hixl_kv_failures_total{role=\"consumer\",rank=\"3\",mode=\"pull\",cause=\"refused\"} 1");
  HAS_LINE(t, "hixl_kv_transfer_seconds_count{role=\"consumer\",rank=\"3\",mode=\"pull\"} 1");
  HAS_LINE(t, "hixl_kv_transfer_bytes_sum{role=\"consumer\",rank=\"3\",mode=\"pull\"} 1024");
  HAS_LINE(t, "hixl_kv_transfer_ops_sum{role=\"consumer\",rank=\"3\",mode=\"pull\"} 4");
  HAS_LINE(t, "hixl_kv_pin_seconds_count{role=\"consumer\",rank=\"3\",mode=\"pull\"} 1");
  HAS_LINE(t,
           "hixl_kv_peer_requests_total{role=\"consumer\",rank=\"3\",mode=\"pull\",peer=\"127.0.0.1:5000\","
           "transport=\"unknown\",outcome=\"ok\"} 1");
  HAS_LINE(t,
           "hixl_kv_peer_requests_total{role=\"consumer\",rank=\"3\",mode=\"pull\",peer=\"127.0.0.1:5000\","
           "transport=\"unknown\",outcome=\"failed\"} 1");
  HAS_LINE(t, "hixl_kv_peer_bytes_total{role=\"consumer\",rank=\"3\",mode=\"pull\",peer=\"127.0.0.1:5000\","
              "transport=\"unknown\"} 1024");
  free(t);

  hixl_kv_buffer b = {0};
  CU_ASSERT_EQUAL_FATAL(kv_drain_traces(c, &b), HIXL_KV_SUCCESS);
  char *save = NULL, *line1 = strtok_r((char *)b.data, "\n", &save), *line2 = strtok_r(NULL, "\n", &save);
  CU_ASSERT_PTR_NULL(strtok_r(NULL, "\n", &save)); /* r3 is still under way */
  json_object *a = json_tokener_parse(line1), *z = json_tokener_parse(line2), *v, *tt;
  CU_ASSERT_PTR_NOT_NULL_FATAL(a);
  CU_ASSERT_PTR_NOT_NULL_FATAL(z);
  CU_ASSERT_TRUE(json_object_object_get_ex(a, "req", &v) && strcmp(json_object_get_string(v), "r1") == 0);
  CU_ASSERT_TRUE(json_object_object_get_ex(a, "outcome", &v) && strcmp(json_object_get_string(v), "ok") == 0);
  CU_ASSERT_TRUE(json_object_object_get_ex(a, "bytes", &v) && json_object_get_int64(v) == 1024);
  CU_ASSERT_TRUE(json_object_object_get_ex(a, "ops", &v) && json_object_get_int64(v) == 4);
  CU_ASSERT_TRUE(json_object_object_get_ex(a, "peer", &v) &&
                 strcmp(json_object_get_string(v), "127.0.0.1:5000") == 0);
  CU_ASSERT_TRUE(json_object_object_get_ex(a, "t", &tt));
  static const char *const order[] = {"bound", "pin", "pinned", "posted", "last_byte", "done", "reported"};
  int64_t prev = 0;
  for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
    CU_ASSERT_TRUE_FATAL(json_object_object_get_ex(tt, order[i], &v));
    CU_ASSERT_TRUE(json_object_get_int64(v) >= prev);
    prev = json_object_get_int64(v);
  }
  CU_ASSERT_FALSE(json_object_object_get_ex(tt, "free", &v));
  /* CLOCK_REALTIME: within a minute of now */
  CU_ASSERT_TRUE(llabs(prev / 1000000000ll - (long long)time(NULL)) < 60);
  CU_ASSERT_TRUE(json_object_object_get_ex(z, "outcome", &v) &&
                 strcmp(json_object_get_string(v), "failed") == 0);
  CU_ASSERT_TRUE(json_object_object_get_ex(z, "cause", &v) &&
                 strcmp(json_object_get_string(v), "lease_expired") == 0);
  CU_ASSERT_TRUE(json_object_object_get_ex(z, "why", &v) &&
                 strcmp(json_object_get_string(v), "no producer wrote \"all\" layers") == 0);
  json_object_put(a);
  json_object_put(z);
  kv_free_buffer(&b);
  /* Drained: empty now (len 0, still a buffer to free). */
  CU_ASSERT_EQUAL(kv_drain_traces(c, &b), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(b.len, 0);
  CU_ASSERT_PTR_NOT_NULL(b.data);
  kv_free_buffer(&b);
  conn_free(c);
}

/* The ring keeps the newest trace_ring traces and counts the ones it dropped; the
 * trace_file gets every one; push layers are listed as landed. */
static void test_ring_and_file(void) {
  char path[] = "/tmp/test_obs_XXXXXX";
  int fd = mkstemp(path);
  CU_ASSERT_FATAL(fd >= 0);
  close(fd);
  hixl_kv_connector *c = conn_new(false, 2, path, true);
  const char *names[] = {"a", "b", "c"};
  for (int i = 0; i < 3; i++) {
    kv_obs_phase(c, names[i], KV_PH_BOUND, NULL);
    kv_obs_layer(c, names[i], 0, 1);
    kv_obs_layer(c, names[i], 1, 3);
    hixl_kv_ids one = {&names[i], 1};
    kv_obs_reported(c, &one);
  }
  hixl_kv_buffer b = {0};
  CU_ASSERT_EQUAL_FATAL(kv_drain_traces(c, &b), HIXL_KV_SUCCESS);
  CU_ASSERT_PTR_NULL(strstr((char *)b.data, "\"req\":\"a\""));
  CU_ASSERT_PTR_NOT_NULL(strstr((char *)b.data, "\"req\":\"b\""));
  CU_ASSERT_PTR_NOT_NULL(strstr((char *)b.data, "\"req\":\"c\""));
  CU_ASSERT_PTR_NOT_NULL(strstr((char *)b.data, "\"mode\":\"push\""));
  json_object *d = json_tokener_parse(strchr((char *)b.data, '\n') + 1), *v;
  CU_ASSERT_TRUE_FATAL(d && json_object_object_get_ex(d, "landed", &v) && json_object_array_length(v) == 2);
  json_object *second = json_object_array_get_idx(v, 1);
  CU_ASSERT_EQUAL(json_object_get_int(json_object_array_get_idx(second, 0)), 1);
  CU_ASSERT_EQUAL(json_object_get_int(json_object_array_get_idx(second, 1)), 3);
  json_object_put(d);
  kv_free_buffer(&b);
  char *t = render(c); /* metrics off: no histograms, the counters and the ring's */
  HAS_LINE(t, "hixl_kv_traces_dropped_total{role=\"consumer\",rank=\"3\",mode=\"push\"} 1");
  CU_ASSERT_PTR_NULL(strstr(t, "hixl_kv_transfer_seconds"));
  free(t);
  conn_free(c);
  CU_ASSERT_EQUAL(lines_with(path, "\"req\":"), 3);
  unlink(path);
}

/* Metrics false and trace_ring 0: no observer; the ops still answer (counters only, no
 * traces); NULL arguments are PARAM_INVALID with the reason; a trace_file that cannot be
 * opened fails create's step with its path. */
static void test_off_and_args(void) {
  hixl_kv_connector *c = conn_new(false, 0, NULL, false);
  CU_ASSERT_PTR_NULL(c->obs);
  kv_obs_hist(c, KV_H_TRANSFER, 5); /* no-ops */
  kv_obs_phase(c, "x", KV_PH_BOUND, NULL);
  kv_obs_failed(c, "x", KV_CAUSE_TIMEOUT, "");
  char *t = render(c);
  HAS_LINE(t, "hixl_kv_loads_failed_total{role=\"consumer\",rank=\"3\",mode=\"pull\"} 0");
  CU_ASSERT_PTR_NULL(strstr(t, "hixl_kv_failures_total"));
  free(t);
  hixl_kv_buffer b = {0};
  CU_ASSERT_EQUAL(kv_drain_traces(c, &b), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(b.len, 0);
  kv_free_buffer(&b);
  CU_ASSERT_EQUAL(kv_render_metrics(NULL, &b), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(kv_last_error(), "render_metrics"));
  CU_ASSERT_EQUAL(kv_render_metrics(c, NULL), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_EQUAL(kv_drain_traces(NULL, &b), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_EQUAL(kv_drain_traces(c, NULL), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(kv_last_error(), "drain_traces"));
  conn_free(c);
  struct kv_cfg cfg = {.metrics = true, .trace_ring = 4};
  snprintf(cfg.trace_file, sizeof(cfg.trace_file), "/nonexistent-dir/t.jsonl");
  struct kv_obs *o = (struct kv_obs *)&cfg; /* overwritten with NULL */
  char why[256] = "";
  CU_ASSERT_EQUAL(kv_obs_new(&cfg, HIXL_KV_ROLE_WORKER, 0, &o, why, sizeof(why)), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(o);
  CU_ASSERT_PTR_NOT_NULL(strstr(why, "/nonexistent-dir/t.jsonl"));
  /* A FIFO (no reader): refused, not waited on (open blocked until a reader came: create
   * hung for ever); a device likewise. */
  snprintf(cfg.trace_file, sizeof(cfg.trace_file), "/tmp/hixl-test-obs-%d.fifo", (int)getpid());
  unlink(cfg.trace_file);
  CU_ASSERT_EQUAL_FATAL(mkfifo(cfg.trace_file, 0600), 0);
  CU_ASSERT_EQUAL(kv_obs_new(&cfg, HIXL_KV_ROLE_WORKER, 0, &o, why, sizeof(why)), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(why, "not a regular file"));
  unlink(cfg.trace_file);
  snprintf(cfg.trace_file, sizeof(cfg.trace_file), "/dev/zero");
  CU_ASSERT_EQUAL(kv_obs_new(&cfg, HIXL_KV_ROLE_WORKER, 0, &o, why, sizeof(why)), HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(why, "not a regular file"));
}

/* A trace_file that is a symbolic link is refused, not followed: another user plants
 * /tmp/t.jsonl -> a file this process may write (docs/observability.md's example path),
 * and every finished trace was appended to that file. */
static void test_file_symlink(void) {
  char dir[] = "/tmp/test_obs_XXXXXX", victim[64], link[64], why[256] = "";
  CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
  snprintf(victim, sizeof(victim), "%s/victim", dir);
  snprintf(link, sizeof(link), "%s/t.jsonl", dir);
  FILE *f = fopen(victim, "w");
  CU_ASSERT_PTR_NOT_NULL_FATAL(f);
  fputs("keep\n", f);
  fclose(f);
  CU_ASSERT_EQUAL_FATAL(symlink(victim, link), 0);
  struct kv_cfg cfg = {.metrics = true, .trace_ring = 4};
  snprintf(cfg.trace_file, sizeof(cfg.trace_file), "%s", link);
  struct kv_obs *o = NULL;
  hixl_kv_status st = kv_obs_new(&cfg, HIXL_KV_ROLE_WORKER, 0, &o, why, sizeof(why));
  CU_ASSERT_EQUAL(st, HIXL_KV_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(why, "symbolic link"));
  if (o) { /* followed: a trace lands in the victim */
    hixl_kv_connector c = {.obs = o};
    const char *id = "r";
    hixl_kv_ids one = {&id, 1};
    kv_obs_phase(&c, id, KV_PH_BOUND, NULL);
    kv_obs_reported(&c, &one);
    kv_obs_free(o);
  }
  struct stat sb;
  CU_ASSERT_EQUAL(stat(victim, &sb), 0);
  CU_ASSERT_EQUAL(sb.st_size, 5); /* "keep\n" only */
  unlink(link);
  unlink(victim);
  rmdir(dir);
}

/* trace_file holds request ids: created 0600 (what the umask leaves of it), as logs with
 * user data are. A file already there that others could have written or placed is
 * refused, as the symbolic link is: writable by its group or by anyone, owned by another
 * user, or a hard link (one more name: another user's link chose the file traces went to
 * where protected_hardlinks is off). Before, it was created 0644 and every such file was
 * appended to. */
static void test_file_owner_mode(void) {
  char dir[] = "/tmp/test_obs_XXXXXX", path[64], other[64], why[256] = "";
  CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/t.jsonl", dir);
  snprintf(other, sizeof(other), "%s/other", dir);
  struct kv_cfg cfg = {.metrics = true, .trace_ring = 4};
  snprintf(cfg.trace_file, sizeof(cfg.trace_file), "%s", path);
  struct kv_obs *o = NULL;
  mode_t was = umask(022);
  CU_ASSERT_EQUAL(kv_obs_new(&cfg, HIXL_KV_ROLE_WORKER, 0, &o, why, sizeof(why)), HIXL_KV_SUCCESS);
  umask(was);
  kv_obs_free(o);
  struct stat sb;
  CU_ASSERT_EQUAL_FATAL(stat(path, &sb), 0);
  CU_ASSERT_EQUAL(sb.st_mode & 07777, 0600);
  static const struct {
    mode_t mode;
    bool chown_other, hard_link;
    const char *says;
  } bad[] = {{0666, false, false, "writable by"},
             {0620, false, false, "writable by"},
             {0644, true, false, "owned by"},
             {0600, false, true, "hard link"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    unlink(path);
    unlink(other);
    FILE *f = fopen(path, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("keep\n", f);
    fclose(f);
    CU_ASSERT_EQUAL_FATAL(chmod(path, bad[i].mode), 0);
    if (bad[i].chown_other && chown(path, 65534, 65534) != 0) continue; /* not root: cannot give it away */
    if (bad[i].hard_link) CU_ASSERT_EQUAL_FATAL(link(path, other), 0);
    o = NULL;
    why[0] = '\0';
    CU_ASSERT_EQUAL(kv_obs_new(&cfg, HIXL_KV_ROLE_WORKER, 0, &o, why, sizeof(why)), HIXL_KV_PARAM_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, bad[i].says));
    CU_ASSERT_PTR_NOT_NULL(strstr(why, path));
    if (o) { /* taken: a trace lands in it */
      hixl_kv_connector c = {.obs = o};
      const char *id = "r";
      hixl_kv_ids one = {&id, 1};
      kv_obs_phase(&c, id, KV_PH_BOUND, NULL);
      kv_obs_reported(&c, &one);
      kv_obs_free(o);
    }
    CU_ASSERT_EQUAL(stat(path, &sb), 0);
    CU_ASSERT_EQUAL(sb.st_size, 5); /* "keep\n" only */
  }
  unlink(path);
  unlink(other);
  rmdir(dir);
}

/* trace_file with trace_ring 0 is honoured: every finished trace goes to the file, none
 * is kept for drain_traces. Before, the file was silently never opened nor written. */
static void test_file_without_ring(void) {
  char path[] = "/tmp/test_obs_XXXXXX";
  int fd = mkstemp(path);
  CU_ASSERT_FATAL(fd >= 0);
  close(fd);
  hixl_kv_connector *c = conn_new(false, 0, path, false);
  CU_ASSERT_PTR_NOT_NULL_FATAL(c->obs);
  const char *id = "w";
  hixl_kv_ids one = {&id, 1};
  kv_obs_phase(c, id, KV_PH_BOUND, NULL);
  kv_obs_reported(c, &one);
  hixl_kv_buffer b = {0};
  CU_ASSERT_EQUAL(kv_drain_traces(c, &b), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(b.len, 0);
  kv_free_buffer(&b);
  conn_free(c);
  CU_ASSERT_EQUAL(lines_with(path, "\"req\":\"w\""), 1);
  unlink(path);
}

/* Requests past the in-flight bound (65536) are not traced, and counted where the other
 * trace counters are: hixl_kv_traces_untraced_total. Before, the count was kept but never
 * shown. */
static void test_untraced_shown(void) {
  hixl_kv_connector *c = conn_new(false, 4, NULL, false);
  char id[16];
  for (unsigned i = 0; i <= 65536; i++) {
    snprintf(id, sizeof(id), "u%u", i);
    kv_obs_phase(c, id, KV_PH_BOUND, NULL);
  }
  char *t = render(c);
  HAS_LINE(t, "# TYPE hixl_kv_traces_untraced_total counter");
  HAS_LINE(t, "hixl_kv_traces_untraced_total{role=\"consumer\",rank=\"3\",mode=\"pull\"} 1");
  free(t);
  conn_free(c);
}

/* A trace the disk took only part of (full: here the file size limit) is counted, and
 * the next one that fits still starts a line of its own: the torn line was glued to it,
 * and both were lost to a reader of JSON lines. */
static void test_file_torn(void) {
  char path[] = "/tmp/test_obs_XXXXXX";
  int fd = mkstemp(path);
  CU_ASSERT_FATAL(fd >= 0);
  close(fd);
  hixl_kv_connector *c = conn_new(false, 4, path, false);
  const char *ids[] = {"a", "b"};
  struct rlimit was;
  CU_ASSERT_EQUAL_FATAL(getrlimit(RLIMIT_FSIZE, &was), 0);
  void (*old)(int) = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = {10, was.rlim_max};
  CU_ASSERT_EQUAL_FATAL(setrlimit(RLIMIT_FSIZE, &small), 0);
  kv_obs_phase(c, ids[0], KV_PH_BOUND, NULL);
  hixl_kv_ids one = {&ids[0], 1};
  kv_obs_reported(c, &one); /* 10 bytes of it written */
  CU_ASSERT_EQUAL(setrlimit(RLIMIT_FSIZE, &was), 0);
  signal(SIGXFSZ, old);
  kv_obs_phase(c, ids[1], KV_PH_BOUND, NULL);
  one.ids = &ids[1];
  kv_obs_reported(c, &one);
  char *t = render(c);
  HAS_LINE(t, "hixl_kv_trace_write_errors_total{role=\"consumer\",rank=\"3\",mode=\"pull\"} 1");
  free(t);
  conn_free(c);
  FILE *f = fopen(path, "r");
  char line[4096];
  int whole = 0;
  while (f && fgets(line, sizeof(line), f)) {
    json_object *o = json_tokener_parse(line), *v;
    if (o && json_object_object_get_ex(o, "req", &v) && strcmp(json_object_get_string(v), "b") == 0) whole++;
    json_object_put(o);
  }
  if (f) fclose(f);
  CU_ASSERT_EQUAL(whole, 1);
  unlink(path);
}

/* Trace lines are JSON, which is UTF-8: an id (any bytes but NUL through the C API) that
 * is not UTF-8 is written with its stray bytes escaped (\u00XX); well-formed UTF-8 and
 * quotes, backslashes and control characters as before. Before, the raw bytes made the
 * line one a strict reader (Python's json) refuses. */
static void test_trace_utf8(void) {
  hixl_kv_connector *c = conn_new(false, 4, NULL, false);
  const char *id = "r\xff\xc3\xa9\"\n\xe2\x82";
  hixl_kv_ids one = {&id, 1};
  kv_obs_phase(c, id, KV_PH_BOUND, NULL);
  kv_obs_reported(c, &one);
  hixl_kv_buffer b = {0};
  CU_ASSERT_EQUAL_FATAL(kv_drain_traces(c, &b), HIXL_KV_SUCCESS);
  json_tokener *tok = json_tokener_new();
  json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
  json_object *d = json_tokener_parse_ex(tok, (char *)b.data, (int)b.len - 1), *v; /* without its \n */
  CU_ASSERT_PTR_NOT_NULL(d);
  CU_ASSERT_TRUE(d && json_object_object_get_ex(d, "req", &v) &&
                 strcmp(json_object_get_string(v), "r\xc3\xbf\xc3\xa9\"\n\xc3\xa2\xc2\x82") == 0);
  json_object_put(d);
  json_tokener_free(tok);
  kv_free_buffer(&b);
  conn_free(c);
}

/* A request moved in parts (tensor parallelism: one per peer rank) is one transfer, from
 * its first op posted to its last part's last byte, observed once the host took it; a
 * failed one is not a transfer. */
static void test_parts_once(void) {
  hixl_kv_connector *c = conn_new(true, 4, NULL, false);
  kv_obs_phase(c, "p", KV_PH_BOUND, NULL);
  kv_obs_phase(c, "p", KV_PH_POSTED, NULL);
  kv_obs_moved(c, "p", 4096, 2);
  kv_obs_landed(c, "p", NULL);
  kv_obs_phase(c, "p", KV_PH_POSTED, NULL); /* the second part: the first stamp stays */
  kv_obs_moved(c, "p", 4096, 2);
  kv_obs_landed(c, "p", NULL);
  kv_obs_phase(c, "f", KV_PH_BOUND, NULL);
  kv_obs_phase(c, "f", KV_PH_POSTED, NULL);
  kv_obs_moved(c, "f", 1 << 20, 9);
  kv_obs_landed(c, "f", NULL);
  kv_obs_failed(c, "f", KV_CAUSE_TIMEOUT, "the second part timed out");
  char *t = render(c);
  HAS_LINE(t, "hixl_kv_transfer_seconds_count{role=\"consumer\",rank=\"3\",mode=\"pull\"} 0"); /* not yet */
  free(t);
  const char *ids[] = {"p", "f"};
  hixl_kv_ids got = {ids, 2};
  kv_obs_reported(c, &got);
  t = render(c);
  HAS_LINE(t, "hixl_kv_transfer_seconds_count{role=\"consumer\",rank=\"3\",mode=\"pull\"} 1");
  HAS_LINE(t, "hixl_kv_transfer_bytes_sum{role=\"consumer\",rank=\"3\",mode=\"pull\"} 8192");
  HAS_LINE(t, "hixl_kv_transfer_bytes_bucket{role=\"consumer\",rank=\"3\",mode=\"pull\",le=\"8192\"} 1");
  HAS_LINE(t, "hixl_kv_transfer_ops_sum{role=\"consumer\",rank=\"3\",mode=\"pull\"} 4");
  HAS_LINE(t, "hixl_kv_failures_total{role=\"consumer\",rank=\"3\",mode=\"pull\",cause=\"timeout\"} 1");
  free(t);
  conn_free(c);
}

/* Statuses and reasons to causes: what the loader's and the pusher's reasons say wins. */
static void test_cause_of(void) {
  CU_ASSERT_EQUAL(kv_obs_cause(HIXL_TIMEOUT, "pulling request r from p: timed out"), KV_CAUSE_TIMEOUT);
  CU_ASSERT_EQUAL(kv_obs_cause(HIXL_TIMEOUT, "linking to the producer p: connect timed out (refused)"),
                  KV_CAUSE_PEER_GONE);
  CU_ASSERT_EQUAL(kv_obs_cause(HIXL_TIMEOUT, "HIXL_TIMEOUT: linking to the producer p: connect timed out"),
                  KV_CAUSE_PEER_GONE); /* a reason with its status in front */
  CU_ASSERT_EQUAL(kv_obs_cause(HIXL_NOT_CONNECTED, ""), KV_CAUSE_PEER_GONE);
  CU_ASSERT_EQUAL(kv_obs_cause(HIXL_PARAM_INVALID, "layout mismatch: the producer p has ..."),
                  KV_CAUSE_LAYOUT);
  CU_ASSERT_EQUAL(kv_obs_cause(HIXL_PARAM_INVALID, "asking p for request r: refused: PIN of r"),
                  KV_CAUSE_REFUSED);
  CU_ASSERT_EQUAL(kv_obs_cause(HIXL_NOT_FOUND, "the producer p no longer holds request r"),
                  KV_CAUSE_NOT_HELD);
  CU_ASSERT_EQUAL(kv_obs_cause(HIXL_RESOURCE_EXHAUSTED, "out of memory"), KV_CAUSE_OTHER);
}

int main(void) {
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  CU_pSuite s = CU_add_suite("obs", NULL, NULL);
  CU_add_test(s, "histogram_text", test_histogram_text);
  CU_add_test(s, "trace_and_causes", test_trace_and_causes);
  CU_add_test(s, "ring_and_file", test_ring_and_file);
  CU_add_test(s, "off_and_args", test_off_and_args);
  CU_add_test(s, "file_symlink", test_file_symlink);
  CU_add_test(s, "file_owner_mode", test_file_owner_mode);
  CU_add_test(s, "file_without_ring", test_file_without_ring);
  CU_add_test(s, "untraced_shown", test_untraced_shown);
  CU_add_test(s, "file_torn", test_file_torn);
  CU_add_test(s, "trace_utf8", test_trace_utf8);
  CU_add_test(s, "cause_of", test_cause_of);
  CU_add_test(s, "parts_once", test_parts_once);
  CU_basic_set_mode(CU_BRM_VERBOSE);
  CU_basic_run_tests();
  unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
  CU_cleanup_registry();
  return failed ? 1 : 0;
}
