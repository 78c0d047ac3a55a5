/* test_mock_host_trace: the plugin's per-request traces of real prefill-to-decode runs
 * (hixl-mock-host --trace, separate processes, loopback): every request's phases in
 * order on both sides, the bytes of the side that moves data adding up to the bytes
 * the host verified (one-token blocks: a request moves exactly its tokens' KV), and a
 * failed request carrying the cause its fault injected. */
#include <CUnit/Basic.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef MOCK_HOST
#error MOCK_HOST: the hixl-mock-host binary
#endif

static char trace_path[64], json_path[64];

/* Run the mock host with the tiny model, --trace and --json, and the given arguments
 * (NULL-terminated); its exit status. */
static int run(const char *first, ...) {
  const char *argv[64] = {MOCK_HOST,   "--model", "tiny",    "--no-progress", "--config", MOCK_CONFIG,
                          "--timeout", "60",      "--trace", trace_path,      "--json",   json_path};
  int n = 12;
  va_list ap;
  va_start(ap, first);
  for (const char *a = first; a && n < 63; a = va_arg(ap, const char *)) argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    if (!freopen("/dev/null", "w", stdout)) _exit(126);
    execv(MOCK_HOST, (char *const *)argv);
    _exit(127);
  }
  int ws = 0;
  waitpid(pid, &ws, 0);
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

/* The trace file's lines. */
struct lines {
  json_object *v[512];
  size_t n;
};

static void load(struct lines *l) {
  l->n = 0;
  FILE *f = fopen(trace_path, "r");
  CU_ASSERT_PTR_NOT_NULL_FATAL(f);
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0 && l->n < 512) {
    json_object *o = json_tokener_parse(line);
    CU_ASSERT_PTR_NOT_NULL(o); /* every line is JSON */
    if (o) l->v[l->n++] = o;
  }
  free(line);
  fclose(f);
}

static void unload(struct lines *l) {
  for (size_t i = 0; i < l->n; i++) json_object_put(l->v[i]);
  l->n = 0;
}

static const char *str(json_object *o, const char *key) {
  json_object *v;
  return json_object_object_get_ex(o, key, &v) ? json_object_get_string(v) : "";
}

static int64_t num(json_object *o, const char *key) {
  json_object *v;
  return json_object_object_get_ex(o, key, &v) ? json_object_get_int64(v) : -1;
}

/* The phases named, in this order, all present and not decreasing. */
static bool ordered(json_object *o, const char *const *keys, size_t n) {
  json_object *t, *v;
  if (!json_object_object_get_ex(o, "t", &t)) return false;
  int64_t prev = 0;
  for (size_t i = 0; i < n; i++) {
    if (!json_object_object_get_ex(t, keys[i], &v) || json_object_get_int64(v) < prev) {
      fprintf(stderr, "%s: %s phase %s missing or before the one before\n", str(o, "req"), str(o, "role"),
              keys[i]);
      return false;
    }
    prev = json_object_get_int64(v);
  }
  return true;
}

static int64_t verified_bytes(void) {
  json_object *s = json_object_from_file(json_path);
  CU_ASSERT_PTR_NOT_NULL_FATAL(s);
  int64_t b = num(s, "kv_bytes_verified");
  json_object_put(s);
  return b;
}

#define BLOCKS_1 "--block-tokens", "1", "--num-blocks", "512", "--min-prompt", "16", "--max-prompt", "64"

static const char *const mover_pull[] = {"bound", "pin", "pinned", "posted", "last_byte", "done", "reported"};
static const char *const holder_pull[] = {"bound", "pinned", "free", "done", "reported"};
static const char *const handoff[] = {"saved", "blocks", "pinned", "landed", "noticed", "held"};

static void check_run(bool push) {
  struct lines l;
  load(&l);
  int64_t moved = 0;
  size_t nmover = 0, nother = 0, nhand = 0;
  const char *mover = push ? "producer" : "consumer";
  for (size_t i = 0; i < l.n; i++) {
    json_object *o = l.v[i];
    const char *role = str(o, "role");
    if (strcmp(role, "handoff") == 0) {
      nhand++;
      CU_ASSERT_TRUE(ordered(o, handoff, 6));
      continue;
    }
    CU_ASSERT_STRING_EQUAL(str(o, "outcome"), "ok");
    CU_ASSERT_STRING_EQUAL(str(o, "mode"), push ? "push" : "pull");
    CU_ASSERT_TRUE(strncmp(str(o, "peer"), "127.0.0.1:", 10) == 0);
    if (strcmp(role, mover) == 0) {
      nmover++;
      moved += num(o, "bytes");
      CU_ASSERT_TRUE(num(o, "ops") > 0);
      CU_ASSERT_TRUE(ordered(o, mover_pull, 7)); /* pin: PIN or ACCEPT */
      CU_ASSERT_TRUE(strlen(str(o, "transport")) > 0);
    } else {
      nother++;
      if (push) { /* the consumer: expected, accepted, every layer landed */
        static const char *const exp[] = {"bound", "pinned", "last_byte", "done", "reported"};
        CU_ASSERT_TRUE(ordered(o, exp, 5));
        json_object *ld;
        int64_t layers = 0;
        CU_ASSERT_TRUE_FATAL(json_object_object_get_ex(o, "landed", &ld));
        for (size_t k = 0; k < json_object_array_length(ld); k++)
          layers += json_object_get_int64(json_object_array_get_idx(json_object_array_get_idx(ld, k), 1));
        CU_ASSERT_EQUAL(layers, 2); /* the tiny model's layers, each once */
      } else {
        CU_ASSERT_TRUE(ordered(o, holder_pull, 5));
      }
    }
  }
  CU_ASSERT_EQUAL(nmover, 12);
  CU_ASSERT_EQUAL(nother, 12);
  /* Pull: decode learns of a request only after prefill's last layer was saved, so every
   * hand-off is timed. Push: decode may hold the last layer before prefill's host thread,
   * descheduled on a loaded machine, reads the clock after that save; such a hand-off is
   * not timed (the summary skips it too). */
  CU_ASSERT_TRUE(push ? nhand >= 6 && nhand <= 12 : nhand == 12);
  CU_ASSERT_EQUAL(moved, verified_bytes()); /* one-token blocks: what moved is what was checked */
  CU_ASSERT_TRUE(moved > 0);
  unload(&l);
}

static void test_pull(void) {
  CU_ASSERT_EQUAL_FATAL(run("--requests", "12", BLOCKS_1, NULL), 0);
  check_run(false);
}

static void test_push(void) {
  CU_ASSERT_EQUAL_FATAL(run("--requests", "12", "--mode", "push", BLOCKS_1, NULL), 0);
  check_run(true);
}

/* Every failed trace of role carries cause, and there are at least min of them (and
 * of that role's failures, no other cause). */
static void check_failed(const char *role, const char *cause, size_t min) {
  struct lines l;
  load(&l);
  size_t n = 0;
  for (size_t i = 0; i < l.n; i++) {
    json_object *o = l.v[i];
    if (strcmp(str(o, "role"), role) != 0 || strcmp(str(o, "outcome"), "failed") != 0) continue;
    n++;
    if (strcmp(str(o, "cause"), cause) != 0)
      fprintf(stderr, "%s failed with cause %s (%s), want %s\n", str(o, "req"), str(o, "cause"),
              str(o, "why"), cause);
    CU_ASSERT_STRING_EQUAL(str(o, "cause"), cause);
    CU_ASSERT_TRUE(strlen(str(o, "why")) > 0);
  }
  CU_ASSERT_TRUE(n >= min);
  unload(&l);
}

#define FAST "--lease-ms", "1500", "--set", "transfer_timeout_ms=1000", "--set", "notify_timeout_ms=500"

/* decode's blocks hold twice the tokens: every load fails, layout. */
static void test_mismatch_layout(void) {
  CU_ASSERT_EQUAL_FATAL(
      run("--requests", "8", "--fault", "mismatch-block", "--on-load-failure", "recompute", FAST, NULL), 0);
  check_failed("consumer", "layout", 8);
}

/* prefill dies: decode's loads after it fail, the peer gone. */
static void test_prefill_dies_peer_gone(void) {
  CU_ASSERT_EQUAL_FATAL(run("--requests", "12", "--fault", "prefill-dies", "--fault-at", "4",
                            "--on-load-failure", "fail", FAST, NULL),
                        0);
  check_failed("consumer", "peer_gone", 1);
}

/* decode dies: what prefill held for it is freed by the lease. */
static void test_decode_dies_lease(void) {
  CU_ASSERT_EQUAL_FATAL(run("--requests", "12", "--fault", "decode-dies", "--fault-at", "6", FAST, NULL), 0);
  check_failed("producer", "lease_expired", 1);
}

int main(void) {
  snprintf(trace_path, sizeof(trace_path), "/tmp/test_mh_trace_%d.jsonl", (int)getpid());
  snprintf(json_path, sizeof(json_path), "/tmp/test_mh_trace_%d.json", (int)getpid());
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  CU_pSuite s = CU_add_suite("mock_host_trace", NULL, NULL);
  CU_add_test(s, "pull", test_pull);
  CU_add_test(s, "push", test_push);
  CU_add_test(s, "mismatch_layout", test_mismatch_layout);
  CU_add_test(s, "prefill_dies_peer_gone", test_prefill_dies_peer_gone);
  CU_add_test(s, "decode_dies_lease", test_decode_dies_lease);
  CU_basic_set_mode(CU_BRM_VERBOSE);
  CU_basic_run_tests();
  unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
  CU_cleanup_registry();
  unlink(trace_path);
  unlink(json_path);
  return failed ? 1 : 0;
}
