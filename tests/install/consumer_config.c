/* Built against an installed hixl-config by test_install.sh with pkg-config: a
 * document becomes engine options an engine takes. */
#include <hixl/hixl.h>
#include <hixl/hixl_config.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  const char *doc = "{\"address\": \"127.0.0.1\", \"Transport\": \"tcp\", \"RdmaTrafficClass\": 104}";
  HixlConfig *c = NULL;
  HixlConfigError err[4];
  size_t nerr = 0;
  if (HixlConfigParse(doc, strlen(doc), &c, err, 4, &nerr) != HIXL_SUCCESS) {
    fprintf(stderr, "%u:%u: %s\n", err[0].line, err[0].column, err[0].message);
    return 1;
  }
  const HixlOption *opts;
  size_t n;
  const char *addr;
  HixlEngine *e;
  HixlConfigEngineOptions(c, &opts, &n);
  HixlConfigGetString(c, "address", &addr);
  if (HixlEngineCreate(&e) != HIXL_SUCCESS) return 1;
  HixlStatus st = HixlEngineInitialize(e, addr, opts, n);
  printf("hixl-config: %zu engine options -> Initialize %s\n", n, HixlStatusName(st));
  HixlEngineDestroy(e);
  HixlConfigFree(c);
  return st == HIXL_SUCCESS ? 0 : 1;
}
