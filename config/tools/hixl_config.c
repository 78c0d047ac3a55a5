/* hixl-config: check a configuration, show what it means, print the key table.
 *
 *   hixl-config check FILE...        every error of every file (exit 1 if any)
 *   hixl-config show [--json] FILE   the effective configuration and where each value came from
 *   hixl-config reference            the key table as Markdown (docs/config.md) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_int.h" /* cfg_escape: the tool links libhixl-config statically */
#include "hixl/hixl_config.h"
#include "util/auth.h" /* core's key-file reader: the tool links libhixl statically */

#define MAX_ERRORS 256

/* Text that is not the tool's own (a file name, a value, a message quoting one), as
 * the library's messages quote it: one line, whatever it holds. */
#define SHOWN_CAP (4 * 4096 + 4)
static const char *shown(char *buf, const char *s) { return cfg_escape(buf, SHOWN_CAP, s); }

static int usage(FILE *f, int rc) {
  fputs("usage: hixl-config check FILE...        every error of each file, as FILE:LINE:COL: key: message;\n"
        "                                         exit 0 when all are valid, 1 otherwise\n"
        "       hixl-config show [--json] FILE   the effective configuration, each value with its source\n"
        "                                         (document LINE:COL, env NAME, or default)\n"
        "       hixl-config reference            the key table as Markdown (docs/config.md)\n"
        "A FILE of - reads standard input. docs/config.md explains the keys and the two shapes\n"
        "(a bare hixl document, or vLLM's --kv-transfer-config).\n",
        f);
  return rc;
}

static HixlStatus parse(const char *path, HixlConfig **c, HixlConfigError *e, size_t *n) {
  if (strcmp(path, "-") != 0) return HixlConfigParseFile(path, c, e, MAX_ERRORS, n);
  size_t cap = HIXL_CONFIG_MAX_BYTES + 1, len = 0, got;
  char *buf = malloc(cap);
  if (!buf) {
    fprintf(stderr, "hixl-config: out of memory\n");
    exit(1);
  }
  while (len < cap && (got = fread(buf + len, 1, cap - len, stdin)) > 0) len += got;
  HixlStatus st = HixlConfigParse(buf, len, c, e, MAX_ERRORS, n);
  free(buf);
  return st;
}

static void print_errors(const char *path, const HixlConfigError *e, size_t n) {
  for (size_t i = 0; i < n && i < MAX_ERRORS; i++) {
    if (e[i].line)
      fprintf(stderr, "%s:%u:%u: ", path, e[i].line, e[i].column);
    else
      fprintf(stderr, "%s: ", path);
    if (e[i].path[0]) fprintf(stderr, "%s: ", e[i].path);
    fprintf(stderr, "%s\n", e[i].message);
  }
  if (n > MAX_ERRORS) fprintf(stderr, "%s: %zu more errors\n", path, n - MAX_ERRORS);
}

/* The AuthKeyFile a valid document names, as Initialize will find it on this host: a
 * note when there is none (the engine accepts anyone) or the file is not here (it may
 * be on the host that runs it); an error (-1) when Initialize would refuse it, with
 * Initialize's reason: the file is read by auth_open, as HixlEngineInitialize reads it
 * (its kind, its mode, its size and the keys in it), or StagingUnregistered is on
 * without a key. A file this user may not read is judged by its kind and mode alone. */
static int key_check(const char *path, const HixlConfig *c) {
  const char *key = NULL, *unreg = NULL;
  static char kbuf[SHOWN_CAP], mbuf[SHOWN_CAP];
  struct stat st;
  HixlConfigGetString(c, "AuthKeyFile", &key);
  HixlConfigGetString(c, "StagingUnregistered", &unreg);
  const char *k = key ? shown(kbuf, key) : ""; /* the key file's name, as printed */
  if (!key || !*key) {
    if (unreg && strcmp(unreg, "on") == 0) {
      fprintf(stderr,
              "%s: StagingUnregistered: on needs AuthKeyFile (it lets a peer reach any address of the "
              "process); Initialize refuses it without one\n",
              path);
      return -1;
    }
    printf("%s: note: no AuthKeyFile: an engine configured by it alone accepts links from anyone who reaches "
           "its port "
           "(docs/security.md)\n",
           path);
    return 0;
  }
  if (stat(key, &st) != 0) {
    printf("%s: note: AuthKeyFile %s: %s on this host (Initialize needs it where the engine runs)\n", path, k,
           strerror(errno));
    return 0;
  }
  if (access(key, R_OK) != 0 && errno == EACCES) { /* the engine's user may read it: kind and mode only */
    if (!S_ISREG(st.st_mode)) {
      fprintf(stderr, "%s: AuthKeyFile %s is not a regular file: Initialize refuses it\n", path, k);
      return -1;
    }
    if (st.st_mode & 077) {
      fprintf(
          stderr,
          "%s: AuthKeyFile %s is mode %04o, open to group or others: Initialize refuses it; chmod 600 it\n",
          path, k, (unsigned)(st.st_mode & 07777));
      return -1;
    }
    printf(
        "%s: note: AuthKeyFile %s: this user cannot read it (%s): its keys are not checked (Initialize reads "
        "it as the engine's user)\n",
        path, k, strerror(EACCES));
    return 0;
  }
  struct auth a;
  auth_init(&a);
  HixlStatus st_open = auth_open(&a, key);
  auth_destroy(&a); /* wipes the keys read */
  if (st_open != HIXL_SUCCESS) {
    fprintf(stderr, "%s: HixlEngineInitialize would fail: %s\n", path, /* it quotes the file's name */
            shown(mbuf, HixlGetLastErrorMessage()));
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  static HixlConfigError errs[MAX_ERRORS];
  if (argc < 2) return usage(stderr, 2);
  const char *cmd = argv[1];
  if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0) return usage(stdout, 0);
  for (int i = 2; i < argc; i++) /* --help on every form */
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return usage(stdout, 0);
  if (strcmp(cmd, "reference") == 0) {
    if (argc != 2) return usage(stderr, 2);
    HixlConfigPrintReference(stdout);
    return 0;
  }
  if (strcmp(cmd, "check") == 0) {
    static char name[SHOWN_CAP];
    int bad = 0;
    /* What only the host that runs it can tell, said here too: the key file. */
    if (argc < 3) return usage(stderr, 2);
    for (int i = 2; i < argc; i++) {
      HixlConfig *c = NULL;
      size_t n = 0;
      shown(name, argv[i]);
      if (parse(argv[i], &c, errs, &n) != HIXL_SUCCESS) {
        print_errors(name, errs, n);
        bad = 1;
      } else if (key_check(name, c) != 0) {
        bad = 1;
      } else {
        printf("%s: ok\n", name);
      }
      HixlConfigFree(c);
    }
    return bad;
  }
  if (strcmp(cmd, "show") == 0) {
    int as_json = argc == 4 && strcmp(argv[2], "--json") == 0;
    if (argc != 3 + as_json) return usage(stderr, 2);
    const char *path = argv[2 + as_json];
    static char name[SHOWN_CAP];
    HixlConfig *c = NULL;
    size_t n = 0;
    if (parse(path, &c, errs, &n) != HIXL_SUCCESS) {
      print_errors(shown(name, path), errs, n);
      return 1;
    }
    HixlConfigPrint(c, stdout, as_json);
    HixlConfigFree(c);
    return 0;
  }
  fprintf(stderr, "hixl-config: unknown command \"%s\"\n", cmd);
  return usage(stderr, 2);
}
