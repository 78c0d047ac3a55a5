/* hixl-perf: the two-process benchmarks as the tests of one program, ucx_perftest's shape:
 * each a row below (struct hb_test, harness.h), run as `hixl-perf TEST [options]` or by its
 * old program name (a link CMake makes, so every caller works as before). The server is
 * forked before any engine exists and gets the parsed parameters with the fork. */
#include "harness.h"

extern const struct hb_test hb_test_bench, hb_test_tcp_ref, hb_test_shm_ref, hb_test_cache, hb_test_auth;
static const struct hb_test *const tests[] = {&hb_test_bench, &hb_test_tcp_ref, &hb_test_shm_ref,
                                              &hb_test_cache, &hb_test_auth};

static int server_main(void *t, int fd) { return ((const struct hb_test *)t)->server(fd); }

int main(int argc, char **argv) {
  const char *me = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  const struct hb_test *t = NULL;
  for (size_t i = 0; i < HB_NF(tests) && !t; i++)
    if (strcmp(me, tests[i]->prog) == 0) t = tests[i];
  for (size_t i = 0; i < HB_NF(tests) && !t && argc > 1; i++)
    if (strcmp(argv[1], tests[i]->name) == 0) t = tests[i], argv[1] = argv[0], argc--, argv++;
  if (t == NULL) {
    bool help = argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0);
    fprintf(help ? stdout : stderr, "usage: hixl-perf TEST [options] (TEST --help: its options)\n");
    for (size_t i = 0; i < HB_NF(tests); i++)
      fprintf(help ? stdout : stderr, "  %-10s %s (also as %s)\n", tests[i]->name, tests[i]->doc,
              tests[i]->prog);
    return help ? 0 : 2;
  }
  hb_prog = t->prog;
  hb_parse(argc, argv, t->opts, t->head);
  int rc = t->setup ? t->setup() : 0;
  if (rc != 0 || t->server == NULL) return rc != 0 ? rc : t->client(NULL);
  struct hb_peer p;
  hb_spawn(&p, server_main, (void *)t);
  rc = t->client(&p);
  int s = hb_reap(&p, 60);
  if (s != 0) hb_say("the server process exited with status %d\n", s);
  return rc != 0 ? rc : s != 0;
}
