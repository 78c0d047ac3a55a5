/* fuzz_config: libhixl-config's parser (HixlConfigParse) against arbitrary bytes. An
 * operator's file, or a runtime's --kv-transfer-config, may hold anything: a document
 * either yields a configuration whose every key reads back, or no configuration and
 * at least one error, each placed inside the document with a message. Invariants
 * abort(); the sanitizers of the libFuzzer build catch the rest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hixl/hixl_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                          \
  do {                                                                                                       \
    if (!(cond)) {                                                                                           \
      fprintf(stderr, "fuzz_config: %s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);              \
      abort();                                                                                               \
    }                                                                                                        \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *copy = malloc(size ? size : 1); /* exactly the bytes, no NUL: the sanitizer sees over-reads */
  CHECK(copy != NULL);
  memcpy(copy, data, size);
  HixlConfigError errs[8];
  memset(errs, 0x5a, sizeof(errs));
  size_t nerr = 12345, lines = 1;
  for (size_t i = 0; i < size; i++) lines += copy[i] == '\n';
  HixlConfig *c = (HixlConfig *)&nerr;
  HixlStatus st = HixlConfigParse(copy, size, &c, errs, 8, &nerr);
  if (st == HIXL_SUCCESS) {
    CHECK(c != NULL && nerr == 0);
    for (size_t i = 0; HixlConfigKeyAt(i); i++) {
      const char *v = NULL;
      HixlConfigSource src;
      CHECK(HixlConfigGetString(c, HixlConfigKeyAt(i)->name, &v) == HIXL_SUCCESS && v != NULL);
      CHECK(HixlConfigGetSource(c, HixlConfigKeyAt(i)->name, &src, NULL) == HIXL_SUCCESS);
    }
    const HixlOption *o;
    size_t n;
    CHECK(HixlConfigEngineOptions(c, &o, &n) == HIXL_SUCCESS);
    for (size_t i = 0; i < n; i++) CHECK(HixlEngineCheckOption(o[i].key, o[i].value) == HIXL_SUCCESS);
    HixlConfigFree(c);
  } else {
    CHECK(st == HIXL_PARAM_INVALID && c == NULL && nerr >= 1);
    for (size_t i = 0; i < nerr && i < 8; i++) {
      CHECK(memchr(errs[i].message, '\0', sizeof(errs[i].message)) != NULL && errs[i].message[0] != '\0');
      CHECK(memchr(errs[i].path, '\0', sizeof(errs[i].path)) != NULL);
      CHECK(errs[i].line <= lines);
      CHECK((errs[i].line == 0) == (errs[i].column == 0));
      CHECK(errs[i].column <= size + 1);
      if (i > 0)
        CHECK(errs[i - 1].line < errs[i].line ||
              (errs[i - 1].line == errs[i].line && errs[i - 1].column <= errs[i].column));
    }
  }
  free(copy);
  return 0;
}
