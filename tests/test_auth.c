/* test_auth: authenticated links (AuthKeyFile, docs/security.md): engines that share
 * a key link and move data; engines that do not are refused, with nothing of the
 * target's memory said; key files with loose permissions or bad contents are refused;
 * a key is rotated without a restart. Engines on 127.0.0.1, one process. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hixl/hixl_engine.h"
#include "test_util.h"

#define KEY_A "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
#define KEY_B "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
#define MEM   (256u << 10)

static char dir[64];

/* A key file in the test's directory holding text, with mode. */
static const char *key_file(const char *name, const char *text, mode_t mode) {
  static char paths[8][128];
  static int n;
  char *p = paths[n++ % 8];
  snprintf(p, 128, "%s/%s", dir, name);
  FILE *f = fopen(p, "w");
  if (!f) return NULL;
  fputs(text, f);
  fclose(f);
  chmod(p, mode);
  return p;
}

struct eng {
  HixlEngine *e;
  char name[TU_ADDR_LEN];
  uint8_t *mem;
  HixlMemHandle h;
};

/* An engine on a free port with key (NULL: none); registers MEM bytes of pattern seed. */
static HixlStatus eng_up(struct eng *g, const char *key, uint64_t seed) {
  const char *t = tu_transport();
  HixlOption o[2] = {{"AuthKeyFile", key ? key : ""}, {"Transport", t}};
  memset(g, 0, sizeof(*g));
  tu_addr(g->name, sizeof(g->name), tu_free_port());
  if (HixlEngineCreate(&g->e) != HIXL_SUCCESS) return HIXL_FAILED;
  HixlStatus st = HixlEngineInitialize(g->e, g->name, o, t ? 2 : 1);
  if (st != HIXL_SUCCESS) return st;
  g->mem = tu_alloc_mem(MEM, false);
  tu_fill(g->mem, MEM, seed);
  HixlMemDesc d = {.addr = (uintptr_t)g->mem, .len = MEM};
  return HixlEngineRegisterMem(g->e, &d, HIXL_MEM_HOST, &g->h);
}

static void eng_down(struct eng *g) {
  if (g->e) {
    HixlEngineFinalize(g->e);
    HixlEngineDestroy(g->e);
  }
  if (g->mem) tu_free_mem(g->mem, MEM);
  memset(g, 0, sizeof(*g));
}

/* a reads MEM bytes of b's memory and writes them back shifted; both checked. */
static void move_and_check(struct eng *a, struct eng *b, uint64_t seed_b) {
  uint8_t *got = tu_alloc_mem(MEM, false);
  HixlMemHandle h;
  HixlMemDesc d = {.addr = (uintptr_t)got, .len = MEM};
  TU_ASSERT_OK_FATAL(HixlEngineRegisterMem(a->e, &d, HIXL_MEM_HOST, &h));
  HixlTransferOpDesc op = {.local_addr = (uintptr_t)got, .remote_addr = (uintptr_t)b->mem, .len = MEM};
  TU_ASSERT_OK(HixlEngineTransferSync(a->e, b->name, HIXL_READ, &op, 1, 10000));
  TU_ASSERT_PATTERN(got, MEM, seed_b, "READ over an authenticated link");
  tu_fill(got, MEM, 99);
  TU_ASSERT_OK(HixlEngineTransferSync(a->e, b->name, HIXL_WRITE, &op, 1, 10000));
  TU_ASSERT_PATTERN(b->mem, MEM, 99, "WRITE over an authenticated link");
  HixlEngineDeregisterMem(a->e, h);
  tu_free_mem(got, MEM);
}

static void test_same_key(void) {
  struct eng a, b;
  const char *k = key_file("same", KEY_A "\n", 0600);
  TU_ASSERT_OK_FATAL(eng_up(&a, k, 1));
  TU_ASSERT_OK_FATAL(eng_up(&b, k, 2));
  TU_ASSERT_OK(HixlEngineConnect(a.e, b.name, 5000));
  move_and_check(&a, &b, 2);
  eng_down(&a);
  eng_down(&b);
}

/* Each refusal: Connect fails with the reason, and the target's memory is untouched. */
static void refused(const char *key_i, const char *key_t, const char *why) {
  struct eng a, b;
  TU_ASSERT_OK_FATAL(eng_up(&a, key_i, 1));
  TU_ASSERT_OK_FATAL(eng_up(&b, key_t, 2));
  TU_ASSERT_STATUS(HixlEngineConnect(a.e, b.name, 5000), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS(why);
  HixlTransferOpDesc op = {.local_addr = (uintptr_t)a.mem, .remote_addr = (uintptr_t)b.mem, .len = 64};
  TU_ASSERT_STATUS(HixlEngineTransferSync(a.e, b.name, HIXL_WRITE, &op, 1, 1000), HIXL_NOT_CONNECTED);
  TU_ASSERT_PATTERN(b.mem, MEM, 2, "the target's memory after a refused link");
  eng_down(&a);
  eng_down(&b);
}

static void test_no_key_refused(void) {
  refused(NULL, key_file("t1", KEY_A "\n", 0600), "authentication required");
}

static void test_wrong_key_refused(void) {
  refused(key_file("i2", KEY_B "\n", 0600), key_file("t2", KEY_A "\n", 0600), "authentication failed");
}

static void test_keyless_target_refused(void) {
  refused(key_file("i3", KEY_A "\n", 0600), NULL, "does not authenticate");
}

static void test_key_file_checks(void) {
  HixlEngine *e;
  struct {
    const char *text;
    mode_t mode;
    const char *why;
  } bad[] = {
      {KEY_A "\n", 0640, "group or others"},
      {KEY_A "\n", 0604, "group or others"},
      {"", 0600, "no key"},
      {"# only a comment\n", 0600, "no key"},
      {"0011223344556677\n", 0600, "hex digits"},
      {KEY_A "g\n", 0600, "hex digits"},
      {KEY_A "\n" KEY_B "\n" KEY_A "\n", 0600, "more than 2 keys"},
      {KEY_A "\n" KEY_A "\n", 0600, "the same key twice"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char name[16], addr[TU_ADDR_LEN];
    snprintf(name, sizeof(name), "bad%zu", i);
    HixlOption o = {"AuthKeyFile", key_file(name, bad[i].text, bad[i].mode)};
    TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
    TU_ASSERT_STATUS(HixlEngineInitialize(e, tu_addr(addr, sizeof(addr), tu_free_port()), &o, 1),
                     HIXL_PARAM_INVALID);
    TU_ASSERT_ERRMSG_HAS(bad[i].why);
    HixlEngineDestroy(e);
  }
  HixlOption o = {"AuthKeyFile", "/nonexistent/hixl.key"};
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", &o, 1), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("cannot open it");
  HixlEngineDestroy(e);
  /* StagingUnregistered on needs a key. */
  HixlOption u = {"StagingUnregistered", "on"};
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", &u, 1), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("needs AuthKeyFile");
  HixlEngineDestroy(e);
}

/* Rotation: the target's file gains key B beside A, the initiator moves to B alone,
 * then the target drops A; each change is read at the next handshake, no restart. */
static void test_rotation(void) {
  struct eng a, b;
  char ti[96];
  const char *kt = key_file("rot_t", KEY_A "\n", 0600);
  const char *ki = key_file("rot_i", KEY_A "\n", 0600);
  TU_ASSERT_OK_FATAL(eng_up(&a, ki, 1));
  TU_ASSERT_OK_FATAL(eng_up(&b, kt, 2));
  TU_ASSERT_OK(HixlEngineConnect(a.e, b.name, 5000));
  TU_ASSERT_OK(HixlEngineDisconnect(a.e, b.name, 5000));
  /* The initiator now holds only B: refused until the target holds B too. */
  key_file("rot_i", KEY_B "\n", 0600);
  TU_ASSERT_STATUS(HixlEngineConnect(a.e, b.name, 5000), HIXL_FAILED);
  key_file("rot_t", "# rotating\n" KEY_A "\n" KEY_B "\n", 0600);
  TU_ASSERT_OK(HixlEngineConnect(a.e, b.name, 5000));
  move_and_check(&a, &b, 2);
  TU_ASSERT_OK(HixlEngineDisconnect(a.e, b.name, 5000));
  /* A file made unusable keeps the keys read before (the error is logged). */
  snprintf(ti, sizeof(ti), "%s/rot_t", dir);
  chmod(ti, 0644);
  TU_ASSERT_OK(HixlEngineConnect(a.e, b.name, 5000));
  TU_ASSERT_OK(HixlEngineDisconnect(a.e, b.name, 5000));
  /* The target drops A: an initiator still on A is refused. */
  key_file("rot_t", KEY_B "\n", 0600);
  key_file("rot_i", KEY_A "\n", 0600);
  TU_ASSERT_STATUS(HixlEngineConnect(a.e, b.name, 5000), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("authentication failed");
  eng_down(&a);
  eng_down(&b);
}

static int suite_init(void) {
  snprintf(dir, sizeof(dir), "/tmp/hixl-auth-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int suite_clean(void) {
  char cmd[96];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static CU_TestInfo auth_tests[] = {
    {"same key: linked, READ and WRITE byte for byte", test_same_key},
    {"initiator without a key: refused, target untouched", test_no_key_refused},
    {"a wrong key: refused, target untouched", test_wrong_key_refused},
    {"a target without a key: the keyed initiator refuses it", test_keyless_target_refused},
    {"key files: permissions, contents; StagingUnregistered needs a key", test_key_file_checks},
    {"rotation: a second key, re-read at the next handshake", test_rotation},
    CU_TEST_INFO_NULL,
};

static CU_SuiteInfo suites[] = {
    {"auth", suite_init, suite_clean, NULL, NULL, auth_tests},
    CU_SUITE_INFO_NULL,
};

int main(void) { return tu_run_suites("test_auth", suites); }
