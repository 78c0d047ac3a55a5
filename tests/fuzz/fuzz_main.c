/* fuzz_main: a driver for LLVMFuzzerTestOneInput without libFuzzer, so any compiler can
 * run the fuzz target as a regression and smoke test. It runs every seed given (files,
 * or directories of files), then a fixed number of pseudo-random mutations of them from
 * a fixed seed, so a failure reproduces exactly.
 *
 *   fuzz_wire_smoke [-n ITERATIONS] [-s SEED] [-t SECONDS] PATH...
 *
 * Mutations: bit flips, random bytes, boundary integers written big-endian (the header
 * and the length fields are all big-endian), inserts, deletes, splices of two seeds,
 * and frames repeated back to back. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_SEEDS 1024
#define FUZZ_MAX_INPUT 16384

struct seed {
  uint8_t *data;
  size_t len;
};

static struct seed seeds[FUZZ_MAX_SEEDS];
static size_t nseeds;

static uint64_t rng_state;

/* xorshift64*: small, fast, and the same on every platform. */
static uint64_t rnd(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}
static size_t rnd_below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static int load_file(const char *path) {
  FILE *f = fopen(path, "rb");
  uint8_t *buf;
  size_t len;

  if (!f) {
    fprintf(stderr, "fuzz_main: cannot open %s: %s\n", path, strerror(errno));
    return -1;
  }
  buf = malloc(FUZZ_MAX_INPUT);
  if (!buf) {
    fclose(f);
    return -1;
  }
  len = fread(buf, 1, FUZZ_MAX_INPUT, f);
  fclose(f);
  if (nseeds == FUZZ_MAX_SEEDS) {
    fprintf(stderr, "fuzz_main: more than %d seeds, ignoring %s\n", FUZZ_MAX_SEEDS, path);
    free(buf);
    return 0;
  }
  seeds[nseeds].data = buf;
  seeds[nseeds].len = len;
  nseeds++;
  return 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Loads a file, or every regular file in a directory in name order (so runs repeat). */
static int load_path(const char *path) {
  struct stat st;
  DIR *d;
  struct dirent *de;
  char **names = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;

  if (stat(path, &st) != 0) {
    fprintf(stderr, "fuzz_main: %s: %s\n", path, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) return load_file(path);
  d = opendir(path);
  if (!d) {
    fprintf(stderr, "fuzz_main: cannot open directory %s: %s\n", path, strerror(errno));
    return -1;
  }
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.') continue;
    if (n == cap) {
      char **grown = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof(*names));
      if (!grown) {
        rc = -1;
        goto close_dir;
      }
      names = grown;
    }
    size_t sz = strlen(path) + strlen(de->d_name) + 2;
    names[n] = malloc(sz);
    if (!names[n]) {
      rc = -1;
      goto close_dir;
    }
    snprintf(names[n], sz, "%s/%s", path, de->d_name);
    n++;
  }
  if (n) qsort(names, n, sizeof(*names), cmp_str);
  for (size_t i = 0; i < n && rc == 0; i++)
    if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) rc = load_file(names[i]);
close_dir:
  closedir(d);
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  return rc;
}

/* Boundary values for the fields: limits of the protocol and of the integer widths. */
static const uint32_t interesting[] = {
    0,
    1,
    2,
    6,
    11,
    12,
    13,
    14,
    16,
    17,
    18,
    19,
    20,
    21,
    255,
    256,
    273,
    274,
    1024,
    1025,
    2060,
    2061,
    4096,
    4097,
    0x7fff,
    0x8000,
    0xffff,
    0x10000,
    (4u << 20) - 1,
    4u << 20,
    (4u << 20) + 1,
    0x7fffffffu,
    0x80000000u,
    0xffffffffu,
    0x4858494cu,
};

static void put_be(uint8_t *p, uint32_t v, size_t width) {
  for (size_t i = width; i-- > 0; v >>= 8) p[i] = (uint8_t)v;
}

/* Applies one random mutation to buf[0..*len) in place; cap is the buffer size. */
static void mutate_once(uint8_t *buf, size_t *len, size_t cap) {
  size_t n = *len;

  switch (rnd_below(8)) {
  case 0: /* flip a bit */
    if (n) buf[rnd_below(n)] ^= (uint8_t)(1u << rnd_below(8));
    break;
  case 1: /* random byte */
    if (n) buf[rnd_below(n)] = (uint8_t)rnd();
    break;
  case 2: /* boundary value, 1, 2 or 4 bytes wide, big-endian */
  case 3: {
    static const size_t widths[] = {1, 2, 4};
    size_t wd = widths[rnd_below(3)];
    uint32_t v = interesting[rnd_below(sizeof(interesting) / sizeof(interesting[0]))];
    if (rnd_below(4) == 0) v += (uint32_t)rnd_below(3) - 1;
    if (n >= wd) put_be(buf + rnd_below(n - wd + 1), v, wd);
    break;
  }
  case 4: { /* insert random bytes */
    size_t k = 1 + rnd_below(16), at = rnd_below(n + 1);
    if (n + k > cap) break;
    memmove(buf + at + k, buf + at, n - at);
    for (size_t i = 0; i < k; i++) buf[at + i] = (uint8_t)rnd();
    *len = n + k;
    break;
  }
  case 5: { /* delete a run */
    if (!n) break;
    size_t at = rnd_below(n), k = 1 + rnd_below(n - at < 16 ? n - at : 16);
    memmove(buf + at, buf + at + k, n - at - k);
    *len = n - k;
    break;
  }
  case 6: { /* splice: part of another seed overwrites or extends the tail */
    const struct seed *s = &seeds[rnd_below(nseeds)];
    size_t at = rnd_below(n + 1), from = rnd_below(s->len + 1);
    size_t k = s->len - from;
    if (at + k > cap) k = cap - at;
    memcpy(buf + at, s->data + from, k);
    if (at + k > n) *len = at + k;
    break;
  }
  case 7: { /* repeat the input, or append another seed: multi-frame streams */
    const struct seed *s = &seeds[rnd_below(nseeds)];
    const uint8_t *src = rnd_below(2) ? buf : s->data;
    size_t k = src == buf ? n : s->len;
    if (n + k > cap) break;
    memmove(buf + n, src, k);
    *len = n + k;
    break;
  }
  }
}

static void usage(void) {
  fprintf(stderr, "usage: fuzz_wire_smoke [-n ITERATIONS] [-s SEED] [-t SECONDS] PATH...\n");
}

int main(int argc, char **argv) {
  unsigned long long iterations = 200000, seed = 0x6869786cull; /* "hixl" */
  double max_seconds = 50;
  int i;

  for (i = 1; i < argc && argv[i][0] == '-'; i++) {
    if (i + 1 >= argc) {
      usage();
      return 2;
    }
    if (!strcmp(argv[i], "-n"))
      iterations = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "-s"))
      seed = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "-t"))
      max_seconds = strtod(argv[++i], NULL);
    else {
      usage();
      return 2;
    }
  }
  if (i == argc) {
    usage();
    return 2;
  }
  for (; i < argc; i++)
    if (load_path(argv[i]) != 0) return 1;
  if (nseeds == 0) {
    fprintf(stderr, "fuzz_main: no seeds found\n");
    return 1;
  }

  for (size_t s = 0; s < nseeds; s++) LLVMFuzzerTestOneInput(seeds[s].data, seeds[s].len);

  uint8_t *buf = malloc(FUZZ_MAX_INPUT);
  if (!buf) return 1;
  rng_state = seed ? seed : 1;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  unsigned long long it;
  for (it = 0; it < iterations; it++) {
    const struct seed *s = &seeds[rnd_below(nseeds)];
    size_t len = s->len;
    memcpy(buf, s->data, len);
    for (size_t k = 1 + rnd_below(8); k > 0; k--) mutate_once(buf, &len, FUZZ_MAX_INPUT);
    /* An exact-size heap copy, so reads past the input are caught too. */
    uint8_t *in = malloc(len ? len : 1);
    if (!in) return 1;
    memcpy(in, buf, len);
    LLVMFuzzerTestOneInput(in, len);
    free(in);
    if ((it & 1023) == 0) {
      clock_gettime(CLOCK_MONOTONIC, &t);
      if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 > max_seconds) {
        fprintf(stderr, "fuzz_main: time limit of %.0f s reached\n", max_seconds);
        it++;
        break;
      }
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t);
  printf("fuzz_main: %zu seeds, %llu mutations (seed 0x%llx) in %.2f s, no failures\n", nseeds, it, seed,
         (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9);
  free(buf);
  for (size_t s = 0; s < nseeds; s++) free(seeds[s].data);
  return 0;
}
