/* test_auth: authenticated links (AuthKeyFile, docs/security.md): engines that share
 * a key link and move data; engines that do not are refused, with nothing of the
 * target's memory said; key files with loose permissions or bad contents are refused;
 * a key is rotated without a restart. Engines on 127.0.0.1, one process. */
#include <CUnit/Basic.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/api_int.h"
#include "engine/engine_ext.h"
#include "engine/engine_int.h"
#include "hixl/hixl_engine.h"
#include "raw_auth.h"
#include "util/be.h"
#include "util/log.h"
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

/* An engine on a free port with key (NULL: none) and n_extra more options (at most
 * 3; a Transport among them overrides the test's); registers MEM bytes of pattern seed. */
static HixlStatus eng_up_with(struct eng *g, const char *key, uint64_t seed, const HixlOption *extra,
                              size_t n_extra) {
  const char *t = tu_transport();
  HixlOption o[5] = {{"AuthKeyFile", key ? key : ""}, {"Transport", t}};
  size_t n = t ? 2 : 1;
  for (size_t i = 0; i < n_extra && i < 3; i++) {
    if (strcmp(extra[i].key, "Transport") == 0 && t)
      o[1] = extra[i];
    else
      o[n++] = extra[i];
  }
  memset(g, 0, sizeof(*g));
  tu_addr(g->name, sizeof(g->name), tu_free_port());
  if (HixlEngineCreate(&g->e) != HIXL_SUCCESS) return HIXL_FAILED;
  HixlStatus st = HixlEngineInitialize(g->e, g->name, o, n);
  if (st != HIXL_SUCCESS) return st;
  g->mem = tu_alloc_mem(MEM, false);
  tu_fill(g->mem, MEM, seed);
  HixlMemDesc d = {.addr = (uintptr_t)g->mem, .len = MEM};
  return HixlEngineRegisterMem(g->e, &d, HIXL_MEM_HOST, &g->h);
}

static HixlStatus eng_up(struct eng *g, const char *key, uint64_t seed) {
  return eng_up_with(g, key, seed, NULL, 0);
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
  /* A path with a newline (from the environment, say) is quoted escaped: it forged a line of a log. */
  HixlOption nl = {"AuthKeyFile", "/nonexistent/a\nb.key"};
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", &nl, 1), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("/nonexistent/a\\x0ab.key");
  CU_ASSERT_PTR_NULL(strchr(HixlGetLastErrorMessage(), '\n'));
  HixlEngineDestroy(e);
  /* Not a regular file (a directory, a fifo: open takes both), too large, a NUL byte,
   * a read that fails (/proc/self/mem: a regular file of mode 0600 this user owns, whose
   * offset 0 is no mapping: EIO), a path past AUTH_PATH_MAX: each refused, naming why. */
  char big[4097 + 1], dpath[128], fpath[128], lpath[AUTH_PATH_MAX + 8];
  memset(big, '#', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  snprintf(dpath, sizeof(dpath), "%s/a-dir", dir);
  snprintf(fpath, sizeof(fpath), "%s/a-fifo", dir);
  CU_ASSERT_FATAL(mkdir(dpath, 0700) == 0 && mkfifo(fpath, 0600) == 0);
  memset(lpath, 'a', AUTH_PATH_MAX - 4); /* relative: under 1024 bytes, but not once made absolute */
  lpath[AUTH_PATH_MAX - 4] = '\0';
  char *nul = (char *)key_file("nul", KEY_A "\n#x\n", 0600);
  CU_ASSERT_FATAL(nul && truncate(nul, 64 + 1 + 3) == 0);
  FILE *nf = fopen(nul, "r+");
  CU_ASSERT_FATAL(nf && fseek(nf, 66, SEEK_SET) == 0 && fputc(0, nf) == 0);
  fclose(nf);
  const struct {
    const char *path, *why;
  } files[] = {{dpath, "not a regular file"},
               {fpath, "not a regular file"},
               {key_file("big", big, 0600), "4097 bytes: a key file is at most 4096"},
               {nul, "holds a NUL byte"},
               {"/proc/self/mem", "cannot read it"},
               {lpath, "the path is longer than 1023 bytes"}};
  for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
    HixlOption f = {"AuthKeyFile", files[i].path};
    TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
    TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", &f, 1), HIXL_PARAM_INVALID);
    TU_ASSERT_ERRMSG_HAS(files[i].why);
    HixlEngineDestroy(e);
  }
  /* A path of 1024 bytes or more, a newline in it (from the environment, say): refused
   * by the options' check, saying why (before, the whole value was quoted first and the
   * reason fell past the end of the 1 KiB message) and escaped (it was quoted raw). */
  memset(lpath, 'b', sizeof(lpath) - 1);
  lpath[0] = '/';
  lpath[40] = '\n';
  lpath[sizeof(lpath) - 1] = '\0';
  HixlOption lo = {"AuthKeyFile", lpath};
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", &lo, 1), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("is invalid: expected a path (< 1024 bytes)");
  TU_ASSERT_ERRMSG_HAS("/bbb");
  TU_ASSERT_ERRMSG_HAS("\\x0abbb");
  CU_ASSERT_PTR_NULL(strchr(HixlGetLastErrorMessage(), '\n'));
  HixlEngineDestroy(e);
  /* StagingUnregistered on needs a key. */
  HixlOption u = {"StagingUnregistered", "on"};
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", &u, 1), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("needs AuthKeyFile");
  HixlEngineDestroy(e);
  /* So do AuthPayloadTag on and AuthAliases: without a key they protected nothing, silently. */
  const HixlOption keyless[2] = {{"AuthPayloadTag", "on"}, {"AuthAliases", "127.0.0.2:7000"}};
  for (int i = 0; i < 2; i++) {
    TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
    TU_ASSERT_STATUS(HixlEngineInitialize(e, "127.0.0.1", &keyless[i], 1), HIXL_PARAM_INVALID);
    TU_ASSERT_ERRMSG_HAS("needs AuthKeyFile");
    TU_ASSERT_ERRMSG_HAS(keyless[i].key);
    HixlEngineDestroy(e);
  }
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

/* A key file another user owns is refused even where this process can read it (root):
 * that user could rewrite the key at will. Only as root can the test make one. */
static void test_key_file_owner(void) {
  HixlEngine *e;
  char addr[TU_ADDR_LEN];
  if (geteuid() != 0) {
    printf("  [skipped: not root: only root can give a file to another user]\n");
    return;
  }
  const char *k = key_file("theirs", KEY_A "\n", 0600);
  CU_ASSERT_EQUAL_FATAL(chown(k, 65534, 65534), 0);
  HixlOption o = {"AuthKeyFile", k};
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&e));
  TU_ASSERT_STATUS(HixlEngineInitialize(e, tu_addr(addr, sizeof(addr), tu_free_port()), &o, 1),
                   HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("owned by");
  HixlEngineDestroy(e);
}

/* A relative AuthKeyFile names the file as it was when the engine started: after the
 * process changes its directory, the same name there is another file (here with
 * another key), and it is not read as a rotation. */
static void test_key_file_relative(void) {
  struct eng a = {0}, b = {0};
  char here[512], d1[96], d2[96];
  CU_ASSERT_PTR_NOT_NULL_FATAL(getcwd(here, sizeof(here)));
  snprintf(d1, sizeof(d1), "%s/rel1", dir);
  snprintf(d2, sizeof(d2), "%s/rel2", dir);
  CU_ASSERT_EQUAL_FATAL(mkdir(d1, 0700), 0);
  CU_ASSERT_EQUAL_FATAL(mkdir(d2, 0700), 0);
  key_file("rel1/k", KEY_A "\n", 0600);
  key_file("rel2/k", KEY_B "\n", 0600);
  CU_ASSERT_EQUAL_FATAL(chdir(d1), 0);
  HixlStatus st = eng_up(&b, "k", 2);
  CU_ASSERT_EQUAL(chdir(d2), 0);
  if (st == HIXL_SUCCESS) st = eng_up(&a, key_file("rel_i", KEY_A "\n", 0600), 1);
  if (st == HIXL_SUCCESS) {
    TU_ASSERT_OK(HixlEngineConnect(a.e, b.name, 5000));
    TU_ASSERT_OK(HixlEngineDisconnect(a.e, b.name, 5000));
  }
  CU_ASSERT_EQUAL(chdir(here), 0);
  TU_ASSERT_OK(st);
  eng_down(&a);
  eng_down(&b);
}

/* A key file made unusable after it was read (group-readable, then removed) keeps the
 * keys in force, and the engine says so: a chmod moves no mtime, a missing file has
 * none. */
static void test_key_file_unusable_logged(void) {
  struct eng a, b;
  char line[512], path[96];
  const char *k = key_file("gone_t", KEY_A "\n", 0600);
  snprintf(path, sizeof(path), "%s", k);
  TU_ASSERT_OK_FATAL(eng_up(&a, key_file("gone_i", KEY_A "\n", 0600), 1));
  TU_ASSERT_OK_FATAL(eng_up(&b, path, 2));
  TU_ASSERT_OK(HixlEngineConnect(a.e, b.name, 5000));
  TU_ASSERT_OK(HixlEngineDisconnect(a.e, b.name, 5000));
  tu_log_capture(HIXL_LOG_ERROR, false);
  tu_log_watch("cannot be used");
  /* A kernel with coarse timestamps moves the ctime at its next tick: chmod until it has. */
  struct stat was, now;
  CU_ASSERT_EQUAL_FATAL(stat(path, &was), 0);
  do chmod(path, 0640);
  while (stat(path, &now) == 0 && now.st_ctim.tv_sec == was.st_ctim.tv_sec &&
         now.st_ctim.tv_nsec == was.st_ctim.tv_nsec);
  TU_ASSERT_OK(HixlEngineConnect(a.e, b.name, 5000));
  TU_ASSERT_OK(HixlEngineDisconnect(a.e, b.name, 5000));
  CU_ASSERT_TRUE(tu_log_seen(line, sizeof(line)));
  CU_ASSERT_PTR_NOT_NULL(strstr(line, "group or others"));
  /* Usable again (a clean re-read), then removed: said again. */
  chmod(path, 0600);
  TU_ASSERT_OK(HixlEngineConnect(a.e, b.name, 5000));
  TU_ASSERT_OK(HixlEngineDisconnect(a.e, b.name, 5000));
  tu_log_watch("cannot be used");
  unlink(path);
  TU_ASSERT_OK(HixlEngineConnect(a.e, b.name, 5000));
  TU_ASSERT_OK(HixlEngineDisconnect(a.e, b.name, 5000));
  CU_ASSERT_TRUE(tu_log_seen(line, sizeof(line)));
  HixlSetLogCallback(NULL, NULL);
  HixlSetLogLevel(HIXL_LOG_ERROR);
  eng_down(&a);
  eng_down(&b);
}

/* ---- a keyless relay (channel binding) ---- */

/* A TCP forwarder holding no key: it accepts one connection on its own port and passes
 * the bytes both ways to the engine at to_port, as a relay or a NAT does. Once the
 * initiator's side is linked it could inject frames; channel binding stops it earlier:
 * the HELLO says what was dialled, in the proven transcript. */
struct relay {
  int lfd, done_r, done_w;
  uint16_t port, to_port;
  pthread_t th;
  uint64_t passed; /* bytes passed on either way */
};

static void *relay_main(void *arg) {
  struct relay *r = arg;
  uint8_t buf[16384];
  int a = accept(r->lfd, NULL, NULL), b = a >= 0 ? raw_dial(r->to_port) : -1;
  while (a >= 0 && b >= 0) {
    struct pollfd pf[3] = {
        {.fd = r->done_r, .events = POLLIN}, {.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
    if (poll(pf, 3, 10000) <= 0 || pf[0].revents) break;
    int from = pf[1].revents ? a : b, to = from == a ? b : a;
    ssize_t n = read(from, buf, sizeof(buf));
    if (n > 0) sock_hb_received(from); /* ThreadSanitizer: the stream orders what the ends did */
    if (n <= 0 || !raw_send_all(to, buf, (size_t)n)) break;
    r->passed += (uint64_t)n;
  }
  if (a >= 0) close(a);
  if (b >= 0) close(b);
  return NULL;
}

/* The relay's listener on a free port and its done pipe; no thread yet. */
static bool relay_bind(struct relay *r) {
  int p[2];
  memset(r, 0, sizeof(*r));
  r->port = tu_free_port();
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(r->port)};
  inet_pton(AF_INET, tu_ip(), &sa.sin_addr);
  r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(r->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (r->lfd < 0 || bind(r->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(r->lfd, 4) < 0 ||
      pipe(p) < 0)
    return false;
  r->done_r = p[0];
  r->done_w = p[1];
  return true;
}

static bool relay_up(struct relay *r, uint16_t to_port) {
  if (!relay_bind(r)) return false;
  r->to_port = to_port;
  return pthread_create(&r->th, NULL, relay_main, r) == 0;
}

static void relay_down(struct relay *r) {
  close(r->done_w);
  shutdown(r->lfd, SHUT_RDWR); /* an accept still waiting returns */
  pthread_join(r->th, NULL);
  close(r->lfd);
  close(r->done_r);
}

static uint16_t port_of(const struct eng *g) { return (uint16_t)atoi(strchr(g->name, ':') + 1); }

/* V dials the relay, which passes the handshake on to Z: both hold the key, neither is
 * the other's dialled engine. Connect fails naming what was dialled and who answered;
 * both memories are untouched. */
static void test_keyless_relay(void) {
  struct eng v, z;
  struct relay r;
  char via[TU_ADDR_LEN];
  TU_ASSERT_OK_FATAL(eng_up(&v, key_file("rel_v", KEY_A "\n", 0600), 41));
  TU_ASSERT_OK_FATAL(eng_up(&z, key_file("rel_z", KEY_A "\n", 0600), 42));
  CU_ASSERT_FATAL(relay_up(&r, port_of(&z)));
  tu_addr(via, sizeof(via), r.port);
  TU_ASSERT_STATUS(HixlEngineConnect(v.e, via, 5000), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS(via);
  TU_ASSERT_ERRMSG_HAS(z.name);
  TU_ASSERT_ERRMSG_HAS("AuthAliases");
  relay_down(&r);
  CU_ASSERT(r.passed > 0); /* the handshake did cross */
  TU_ASSERT_PATTERN(v.mem, MEM, 41, "V's memory after the relayed handshake");
  TU_ASSERT_PATTERN(z.mem, MEM, 42, "Z's memory after the relayed handshake");
  TU_ASSERT_OK(HixlEngineConnect(v.e, z.name, 5000)); /* V dials Z itself: linked */
  move_and_check(&v, &z, 42);
  eng_down(&v);
  eng_down(&z);
}

/* The relay passes V's handshake back to V's own port: refused, V's memory untouched. */
static void test_reflection(void) {
  struct eng v;
  struct relay r;
  char via[TU_ADDR_LEN];
  TU_ASSERT_OK_FATAL(eng_up(&v, key_file("refl_v", KEY_A "\n", 0600), 43));
  CU_ASSERT_FATAL(relay_up(&r, port_of(&v)));
  tu_addr(via, sizeof(via), r.port);
  TU_ASSERT_STATUS(HixlEngineConnect(v.e, via, 5000), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("never links to itself");
  relay_down(&r);
  TU_ASSERT_PATTERN(v.mem, MEM, 43, "V's memory after its reflected handshake");
  eng_down(&v);
}

/* One keyed handshake of a raw peer holding the key that says it dialled dialled: the
 * status of Z's HELLO_ACK, and whether it was challenged. */
static uint32_t dialled_status(uint16_t port, const char *dialled, bool *challenged) {
  struct raw_auth a = {.name = "raw:1", .key_hex = KEY_A, .dialled = dialled};
  int fd = raw_dial(port);
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_TRUE(raw_auth_hello(fd, &a, raw_send_all, raw_recv_all));
  close(fd);
  *challenged = a.challenged;
  return a.status;
}

/* Z listens on 0.0.0.0 (any address of its host). A handshake that says it dialled an
 * address of this host at Z's port is Z's; one that dialled another host at the same
 * port (a relay elsewhere that passes on what it was sent, in a deployment where every
 * engine uses one port) is refused NOT_ME, as any other address is: before, Z took any
 * IP at its port as its own name, and such a relay passed channel binding. */
static void test_any_address_binding(void) {
  struct eng z;
  char name[32], dialled[48];
  bool ch = false;
  memset(&z, 0, sizeof(z));
  uint16_t port = tu_free_port();
  snprintf(name, sizeof(name), "0.0.0.0:%u", (unsigned)port);
  HixlOption o[1] = {{"AuthKeyFile", key_file("any_z", KEY_A "\n", 0600)}};
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&z.e));
  TU_ASSERT_OK_FATAL(HixlEngineInitialize(z.e, name, o, 1));
  snprintf(dialled, sizeof(dialled), "127.0.0.1:%u", (unsigned)port);
  CU_ASSERT_EQUAL(dialled_status(port, dialled, &ch), WIRE_HELLO_OK);
  CU_ASSERT_TRUE(ch);
  snprintf(dialled, sizeof(dialled), "%s:%u", tu_ip(), (unsigned)port);
  CU_ASSERT_EQUAL(dialled_status(port, dialled, &ch), WIRE_HELLO_OK); /* the address it was reached at */
  CU_ASSERT_TRUE(ch);
  /* 192.0.2.1 (TEST-NET-1, RFC 5737) is no address of this host. */
  snprintf(dialled, sizeof(dialled), "192.0.2.1:%u", (unsigned)port);
  CU_ASSERT_EQUAL(dialled_status(port, dialled, &ch), WIRE_HELLO_NOT_ME);
  CU_ASSERT_FALSE(ch);
  snprintf(dialled, sizeof(dialled), "127.0.0.1:%u", (unsigned)(port == 65535 ? 1 : port + 1));
  CU_ASSERT_EQUAL(dialled_status(port, dialled, &ch), WIRE_HELLO_NOT_ME); /* another port */
  CU_ASSERT_FALSE(ch);
  eng_down(&z);
}

/* The same forwarder, listed in Z's AuthAliases (NAT, a service address): linked
 * through it, data byte for byte. The relay's port is chosen before Z starts. */
static void test_alias_through_forwarder(void) {
  struct eng v, z;
  struct relay r;
  char via[TU_ADDR_LEN];
  TU_ASSERT_OK_FATAL(eng_up(&v, key_file("al_v", KEY_A "\n", 0600), 44));
  memset(&z, 0, sizeof(z));
  uint16_t zport = tu_free_port();
  CU_ASSERT_FATAL(relay_up(&r, zport));
  tu_addr(via, sizeof(via), r.port);
  tu_addr(z.name, sizeof(z.name), zport);
  HixlOption o[2] = {{"AuthKeyFile", key_file("al_z", KEY_A "\n", 0600)}, {"AuthAliases", via}};
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&z.e));
  TU_ASSERT_OK_FATAL(HixlEngineInitialize(z.e, z.name, o, 2));
  z.mem = tu_alloc_mem(MEM, false);
  tu_fill(z.mem, MEM, 45);
  HixlMemDesc d = {.addr = (uintptr_t)z.mem, .len = MEM};
  TU_ASSERT_OK_FATAL(HixlEngineRegisterMem(z.e, &d, HIXL_MEM_HOST, &z.h));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(v.e, via, 5000));
  /* a READ of Z's memory through the forwarder */
  uint8_t *got = tu_alloc_mem(MEM, false);
  HixlMemDesc l = {.addr = (uintptr_t)got, .len = MEM};
  HixlMemHandle lh = NULL;
  TU_ASSERT_OK_FATAL(HixlEngineRegisterMem(v.e, &l, HIXL_MEM_HOST, &lh));
  HixlTransferOpDesc op = {.local_addr = (uintptr_t)got, .remote_addr = (uintptr_t)z.mem, .len = MEM};
  TU_ASSERT_OK(HixlEngineTransferSync(v.e, via, HIXL_READ, &op, 1, 10000));
  TU_ASSERT_PATTERN(got, MEM, 45, "Z's memory read through the listed forwarder");
  TU_ASSERT_OK(HixlEngineDisconnect(v.e, via, 5000));
  HixlEngineDeregisterMem(v.e, lh);
  tu_free_mem(got, MEM);
  relay_down(&r);
  eng_down(&v);
  eng_down(&z);
}

/* ---- a forwarder in the path of a proven link: what it changes ends the link ---- */

/* The forwarder of test_alias_through_forwarder (listed in Z's AuthAliases, so the
 * handshake passes through it), which on the test's word alters one byte of the next
 * bytes from Z to V (cmd 'F'), or puts a frame of its own into the stream to Z: a
 * WRITE_REQ into Z's memory with a tag it cannot make (cmd 'I'). It says on done_w
 * when it has done so, and again when Z closed its side. */
struct mitm {
  struct relay r; /* lfd, port, to_port, th; done_r / done_w: the test's end */
  int cmd_r, cmd_w, ack_r, ack_w;
  uint64_t z_addr;
  ssize_t flip_at; /* 'F': the byte altered (30: a READ_RESP's status) */
};

static void *mitm_main(void *arg) {
  struct mitm *x = arg;
  uint8_t buf[16384];
  bool flip = false;
  int a = accept(x->r.lfd, NULL, NULL), b = a >= 0 ? raw_dial(x->r.to_port) : -1;
  while (a >= 0 && b >= 0) {
    struct pollfd pf[4] = {{.fd = x->r.done_r, .events = POLLIN},
                           {.fd = x->cmd_r, .events = POLLIN},
                           {.fd = a, .events = POLLIN},
                           {.fd = b, .events = POLLIN}};
    if (poll(pf, 4, 10000) <= 0 || pf[0].revents) break;
    if (pf[1].revents) {
      char cmd;
      if (read(x->cmd_r, &cmd, 1) != 1) break;
      if (cmd == 'F') flip = true;
      if (cmd == 'I') {
        uint8_t f[WIRE_SMALL_FRAME + AUTH_TAG_LEN + 64];
        size_t n = wire_put_write_req(f, 1000, x->z_addr, 64);
        f[7] |= WIRE_F_TAG;
        memset(f + n, 0x66, AUTH_TAG_LEN + 64); /* a guessed tag, then the data */
        if (!raw_send_all(b, f, n + AUTH_TAG_LEN + 64)) break;
      }
      if (write(x->ack_w, &cmd, 1) != 1) break;
      continue;
    }
    int from = pf[2].revents ? a : b, to = from == a ? b : a;
    ssize_t n = read(from, buf, sizeof(buf));
    if (n > 0) sock_hb_received(from); /* ThreadSanitizer: the stream orders what the ends did */
    if (n <= 0) {
      if (from == b) (void)!write(x->ack_w, "Z", 1); /* Z closed the link */
      break;
    }
    if (from == b && flip) {
      buf[n > x->flip_at ? x->flip_at : n - 1] ^= 0x10; /* by default inside the first frame's body */
      flip = false;
    }
    if (!raw_send_all(to, buf, (size_t)n)) break;
    x->r.passed += (uint64_t)n;
  }
  if (a >= 0) close(a);
  if (b >= 0) close(b);
  return NULL;
}

/* V linked to Z through the forwarder x (listed in Z's AuthAliases), V's buffer got
 * registered. */
static void mitm_up(struct mitm *x, struct eng *v, struct eng *z, char *via, uint8_t **got, HixlMemHandle *gh,
                    bool ptag) {
  int c[2], k[2];
  const HixlOption pt = {"AuthPayloadTag", "on"};
  TU_ASSERT_OK_FATAL(eng_up_with(v, key_file("mitm_v", KEY_A "\n", 0600), 51, &pt, ptag ? 1 : 0));
  memset(z, 0, sizeof(*z));
  memset(x, 0, sizeof(*x));
  uint16_t zport = tu_free_port();
  CU_ASSERT_FATAL(pipe(c) == 0 && pipe(k) == 0);
  x->cmd_r = c[0], x->cmd_w = c[1], x->ack_r = k[0], x->ack_w = k[1];
  /* relay_up's listener and thread, with this forwarder's loop */
  struct relay *r = &x->r;
  int p[2];
  r->to_port = zport;
  r->port = tu_free_port();
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(r->port)};
  inet_pton(AF_INET, tu_ip(), &sa.sin_addr);
  r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1; /* the port is held by tu_free_port's socket, also SO_REUSEADDR */
  setsockopt(r->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  CU_ASSERT_FATAL(r->lfd >= 0 && bind(r->lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
                  listen(r->lfd, 4) == 0 && pipe(p) == 0);
  r->done_r = p[0];
  r->done_w = p[1];
  tu_addr(via, TU_ADDR_LEN, r->port);
  tu_addr(z->name, sizeof(z->name), zport);
  HixlOption o[4] = {
      {"AuthKeyFile", key_file("mitm_z", KEY_A "\n", 0600)}, {"AuthAliases", via}, {"Transport", "tcp"}, pt};
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&z->e));
  TU_ASSERT_OK_FATAL(HixlEngineInitialize(z->e, z->name, o, ptag ? 4 : 3));
  z->mem = tu_alloc_mem(MEM, false);
  tu_fill(z->mem, MEM, 52);
  HixlMemDesc d = {.addr = (uintptr_t)z->mem, .len = MEM};
  TU_ASSERT_OK_FATAL(HixlEngineRegisterMem(z->e, &d, HIXL_MEM_HOST, &z->h));
  x->z_addr = (uintptr_t)z->mem;
  x->flip_at = 30;
  CU_ASSERT_FATAL(pthread_create(&r->th, NULL, mitm_main, x) == 0);
  TU_ASSERT_OK_FATAL(HixlEngineConnect(v->e, via, 5000));
  *got = tu_alloc_mem(MEM, false);
  HixlMemDesc l = {.addr = (uintptr_t)*got, .len = MEM};
  TU_ASSERT_OK_FATAL(HixlEngineRegisterMem(v->e, &l, HIXL_MEM_HOST, gh));
}

static void mitm_down(struct mitm *x, struct eng *v, struct eng *z, uint8_t *got, HixlMemHandle gh) {
  HixlEngineDeregisterMem(v->e, gh);
  tu_free_mem(got, MEM);
  relay_down(&x->r);
  close(x->cmd_r);
  close(x->cmd_w);
  close(x->ack_r);
  close(x->ack_w);
  eng_down(v);
  eng_down(z);
}

/* Tell the forwarder cmd; wait until it says it did, then (want) for its next word. */
static char mitm_say(struct mitm *x, char cmd, bool then_wait) {
  char got = 0;
  CU_ASSERT_FATAL(write(x->cmd_w, &cmd, 1) == 1);
  CU_ASSERT_FATAL(read(x->ack_r, &got, 1) == 1 && got == cmd);
  if (then_wait) CU_ASSERT_FATAL(read(x->ack_r, &got, 1) == 1);
  return got;
}

/* A byte of Z's answer altered on the way: V's READ fails, V's buffer keeps its bytes. */
static void test_mitm_alters_answer(void) {
  struct mitm x;
  struct eng v, z;
  char via[TU_ADDR_LEN];
  uint8_t *got;
  HixlMemHandle gh;
  mitm_up(&x, &v, &z, via, &got, &gh, false);
  HixlTransferOpDesc op = {.local_addr = (uintptr_t)got, .remote_addr = (uintptr_t)z.mem, .len = 4096};
  TU_ASSERT_OK(HixlEngineTransferSync(v.e, via, HIXL_READ, &op, 1, 10000)); /* the forwarder passes it */
  TU_ASSERT_SAME(got, z.mem, 4096, "a READ through the forwarder");
  tu_fill(got, MEM, 53);
  mitm_say(&x, 'F', false);
  TU_ASSERT_STATUS(HixlEngineTransferSync(v.e, via, HIXL_READ, &op, 1, 10000), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("failed its proof");
  TU_ASSERT_PATTERN(got, MEM, 53, "V's buffer after an answer the proof refused");
  TU_ASSERT_PATTERN(z.mem, MEM, 52, "Z's memory");
  mitm_down(&x, &v, &z, got, gh);
}

/* A byte of the data in an answer altered on the way: without AuthPayloadTag the READ
 * succeeds with the altered byte (the data is not proven: docs/security.md); with it
 * on, the READ fails. Then one engine on, the other off: the link ends at the first
 * payload that carries no tag. */
static void test_mitm_alters_data(void) {
  for (int ptag = 0; ptag < 2; ptag++) {
    struct mitm x;
    struct eng v, z;
    char via[TU_ADDR_LEN];
    uint8_t *got;
    HixlMemHandle gh;
    mitm_up(&x, &v, &z, via, &got, &gh, ptag);
    HixlTransferOpDesc op = {.local_addr = (uintptr_t)got, .remote_addr = (uintptr_t)z.mem, .len = 4096};
    /* MEM bytes each way through the forwarder, by READ and WRITE: the payload tags check */
    HixlTransferOpDesc all = {.local_addr = (uintptr_t)got, .remote_addr = (uintptr_t)z.mem, .len = MEM};
    TU_ASSERT_OK(HixlEngineTransferSync(v.e, via, HIXL_READ, &all, 1, 10000));
    TU_ASSERT_PATTERN(got, MEM, 52, "a READ through the forwarder");
    tu_fill(got, MEM, 56);
    TU_ASSERT_OK(HixlEngineTransferSync(v.e, via, HIXL_WRITE, &all, 1, 10000));
    TU_ASSERT_PATTERN(z.mem, MEM, 56, "a WRITE through the forwarder");
    x.flip_at = WIRE_HDR_LEN + 12 + AUTH_TAG_LEN + 100; /* the answer's data, byte 100 */
    mitm_say(&x, 'F', false);
    HixlStatus st = HixlEngineTransferSync(v.e, via, HIXL_READ, &op, 1, 10000);
    if (ptag) {
      TU_ASSERT_STATUS(st, HIXL_FAILED);
      TU_ASSERT_ERRMSG_HAS("payload");
    } else {
      TU_ASSERT_OK(st); /* not proven: it lands as altered */
      CU_ASSERT_EQUAL(got[100], z.mem[100] ^ 0x10);
    }
    mitm_down(&x, &v, &z, got, gh);
  }
  /* V requires tagged payloads, Z (AuthPayloadTag off) sends none: V's READ of Z ends the link. */
  struct eng v, z;
  const HixlOption pt[2] = {{"AuthPayloadTag", "on"}, {"Transport", "tcp"}}; /* payloads go on the socket */
  const char *k = key_file("pt_mix", KEY_A "\n", 0600);
  TU_ASSERT_OK_FATAL(eng_up_with(&v, k, 54, pt, 2));
  TU_ASSERT_OK_FATAL(eng_up_with(&z, k, 55, pt + 1, 1));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(v.e, z.name, 5000));
  HixlTransferOpDesc op = {.local_addr = (uintptr_t)v.mem, .remote_addr = (uintptr_t)z.mem, .len = 4096};
  TU_ASSERT_STATUS(HixlEngineTransferSync(v.e, z.name, HIXL_READ, &op, 1, 10000), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS("AuthPayloadTag");
  TU_ASSERT_PATTERN(v.mem, MEM, 54, "V's memory after an untagged answer it refused");
  eng_down(&v);
  eng_down(&z);
}

/* AuthPayloadTag on both, tcp: direct ops of every size and staged batches (their
 * payloads gathered from many ranges) move byte for byte. */
static void test_payload_tags_move(void) {
  const HixlOption o[3] = {{"AuthPayloadTag", "on"}, {"Transport", "tcp"}, {"StagingThreshold", "8192"}};
  const char *k = key_file("pt_both", KEY_A "\n", 0600);
  struct eng a, b;
  TU_ASSERT_OK_FATAL(eng_up_with(&a, k, 61, o, 3));
  TU_ASSERT_OK_FATAL(eng_up_with(&b, k, 62, o, 3));
  TU_ASSERT_OK_FATAL(HixlEngineConnect(a.e, b.name, 5000));
  move_and_check(&a, &b, 62); /* MEM bytes each way, direct */
  HixlTransferOpDesc ops[64];
  for (int i = 0; i < 64; i++) /* 64 ops of 1000 bytes, 4 KiB apart: staged */
    ops[i] = (HixlTransferOpDesc){.local_addr = (uintptr_t)a.mem + (size_t)i * 4096,
                                  .remote_addr = (uintptr_t)b.mem + (size_t)i * 4096 + 7,
                                  .len = 1000};
  tu_fill(a.mem, MEM, 63);
  TU_ASSERT_OK(HixlEngineTransferSync(a.e, b.name, HIXL_WRITE, ops, 64, 10000));
  for (int i = 0; i < 64; i++)
    TU_ASSERT_SAME(b.mem + (size_t)i * 4096 + 7, a.mem + (size_t)i * 4096, 1000, "a staged WRITE, tagged");
  tu_fill(b.mem, MEM, 64);
  TU_ASSERT_OK(HixlEngineTransferSync(a.e, b.name, HIXL_READ, ops, 64, 10000));
  for (int i = 0; i < 64; i++)
    TU_ASSERT_SAME(a.mem + (size_t)i * 4096, b.mem + (size_t)i * 4096 + 7, 1000, "a staged READ, tagged");
  eng_down(&a);
  eng_down(&b);
}

/* Whether e's peer name holds a session secret (any byte set); *authed: it says it
 * is authenticated; *broken: its link is gone (read under e's lock, engine internals). */
static bool peer_secret(HixlEngine *e, const char *name, bool *authed, bool *broken) {
  bool any = false;
  pthread_mutex_lock(&e->lock);
  struct peer *p = api_find_peer(e, name);
  for (size_t i = 0; p && i < sizeof(p->session); i++) any |= p->session[i] != 0;
  *authed = p && p->authed;
  *broken = p && !p->conn;
  pthread_mutex_unlock(&e->lock);
  return any;
}

/* An initiator whose authenticated link broke (the target finalized) wipes the link's
 * session secret as the link ends, its peer kept (before: the secret stayed in memory
 * until Disconnect, Connect or Finalize freed the peer); the peer says the link was lost. */
static void test_broken_link_wipes_session(void) {
  const char *k = key_file("wipe", KEY_A "\n", 0600);
  struct eng a, b;
  bool authed = false, broken = true;
  TU_ASSERT_OK_FATAL(eng_up(&a, k, 71));
  TU_ASSERT_OK_FATAL(eng_up(&b, k, 72));
  char bname[TU_ADDR_LEN];
  snprintf(bname, sizeof(bname), "%s", b.name);
  TU_ASSERT_OK_FATAL(HixlEngineConnect(a.e, bname, 5000));
  CU_ASSERT_TRUE(peer_secret(a.e, bname, &authed, &broken));
  CU_ASSERT_TRUE(authed);
  CU_ASSERT_FALSE(broken);
  eng_down(&b); /* its end of the link closes: a's progress thread sees the link end */
  for (int64_t until = tu_now_ms() + 5000; tu_now_ms() < until; sched_yield()) {
    peer_secret(a.e, bname, &authed, &broken);
    if (broken) break;
  }
  CU_ASSERT_TRUE_FATAL(broken);
  CU_ASSERT_FALSE(peer_secret(a.e, bname, &authed, &broken)); /* wiped with the link */
  CU_ASSERT_FALSE(authed);
  HixlTransferOpDesc op = {.local_addr = (uintptr_t)a.mem, .remote_addr = 4096, .len = 64};
  TU_ASSERT_STATUS(HixlEngineTransferSync(a.e, bname, HIXL_READ, &op, 1, 1000), HIXL_NOT_CONNECTED);
  TU_ASSERT_ERRMSG_HAS("was lost");
  eng_down(&a);
}

/* A frame put into the stream to Z after the handshake: Z ends the link, its memory
 * unchanged; V's next transfer fails. */
static void test_mitm_injects(void) {
  struct mitm x;
  struct eng v, z;
  char via[TU_ADDR_LEN];
  uint8_t *got;
  HixlMemHandle gh;
  mitm_up(&x, &v, &z, via, &got, &gh, false);
  HixlTransferOpDesc op = {.local_addr = (uintptr_t)got, .remote_addr = (uintptr_t)z.mem, .len = 4096};
  TU_ASSERT_OK(HixlEngineTransferSync(v.e, via, HIXL_READ, &op, 1, 10000));
  CU_ASSERT_EQUAL(mitm_say(&x, 'I', true), 'Z'); /* Z closed the link */
  HixlStatus st = HixlEngineTransferSync(v.e, via, HIXL_WRITE, &op, 1, 10000);
  CU_ASSERT(st == HIXL_FAILED || st == HIXL_NOT_CONNECTED);
  TU_ASSERT_PATTERN(z.mem, MEM, 52, "Z's memory after a frame the forwarder put in");
  mitm_down(&x, &v, &z, got, gh);
}

/* ---- a forwarder that tampers with the proven handshake itself ---- */

/* The forwarder of test_alias_through_forwarder, reading Z's side frame by frame: on
 * HSX_FLIP_ACK it alters one byte of the HELLO_ACK's tag (the first proven frame); on
 * HSX_ADD_MEM it passes the HELLO_ACK on and puts after it a MEM_ADD of its own with a
 * tag it cannot make, which V reads while it waits for the shm handshake's answer. */
enum hsx_mode { HSX_FLIP_ACK, HSX_ADD_MEM };

struct hsx {
  struct relay r;
  enum hsx_mode mode;
  bool acked; /* a HELLO_ACK came from Z */
};

/* One frame from fd into buf (cap bytes): header, body, tag when flagged, payload. */
static bool hsx_frame(int fd, uint8_t *buf, size_t cap, struct wire_hdr *h, size_t *n) {
  if (!raw_recv_all(fd, buf, WIRE_HDR_LEN) || wire_parse_hdr(buf, h) != WIRE_OK) return false;
  size_t len = WIRE_HDR_LEN + h->body_len + ((h->flags & WIRE_F_TAG) ? AUTH_TAG_LEN : 0) + h->payload_len;
  if (len > cap || !raw_recv_all(fd, buf + WIRE_HDR_LEN, len - WIRE_HDR_LEN)) return false;
  *n = len;
  return true;
}

static void *hsx_main(void *arg) {
  struct hsx *x = arg;
  uint8_t buf[16384];
  int a = accept(x->r.lfd, NULL, NULL), b = a >= 0 ? raw_dial(x->r.to_port) : -1;
  while (a >= 0 && b >= 0) {
    struct pollfd pf[3] = {
        {.fd = x->r.done_r, .events = POLLIN}, {.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
    if (poll(pf, 3, 10000) <= 0 || pf[0].revents) break;
    ssize_t n;
    size_t fn = 0;
    struct wire_hdr h;
    if (pf[1].revents) { /* V's bytes pass as they are */
      n = read(a, buf, sizeof(buf));
      if (n > 0) sock_hb_received(a);
      if (n <= 0 || !raw_send_all(b, buf, (size_t)n)) break;
      continue;
    }
    if (!hsx_frame(b, buf, sizeof(buf), &h, &fn)) break;
    bool ack = h.type == WIRE_HELLO_ACK && (h.flags & WIRE_F_TAG);
    if (ack && x->mode == HSX_FLIP_ACK) buf[WIRE_HDR_LEN + h.body_len + 3] ^= 0x01; /* in its tag */
    if (!raw_send_all(a, buf, fn)) break;
    if (ack && x->mode == HSX_ADD_MEM) {
      struct wire_wr w;
      wire_begin(&w, buf, sizeof(buf), WIRE_MEM_ADD);
      wire_put_mem_entry(&w, 0x100000000ull, 4096, 0, "relay");
      n = (ssize_t)wire_end(&w, 0);
      buf[7] |= WIRE_F_TAG;
      memset(buf + n, 0x66, AUTH_TAG_LEN); /* a guessed tag */
      if (!raw_send_all(a, buf, (size_t)n + AUTH_TAG_LEN)) break;
    }
    x->acked |= ack;
  }
  if (a >= 0) close(a);
  if (b >= 0) close(b);
  return NULL;
}

/* How many links e holds (engine internals, under its lock). */
static unsigned conns_of(HixlEngine *e) {
  unsigned n = 0;
  pthread_mutex_lock(&e->lock);
  for (struct conn *c = e->conns; c; c = c->next) n++;
  pthread_mutex_unlock(&e->lock);
  return n;
}

/* V dials Z through the forwarder (listed in Z's AuthAliases), both on shm: Connect
 * FAILED naming the frame whose proof failed; V keeps no link, Z none (once it saw the
 * forwarder hang up), neither's memory changed; V then links to Z itself. */
static void hsx_case(enum hsx_mode mode, const char *frame) {
  struct eng v, z;
  struct hsx x;
  char via[TU_ADDR_LEN];
  bool authed = true, broken = false;
  const HixlOption shm = {"Transport", "shm"};
  memset(&x, 0, sizeof(x));
  x.mode = mode;
  TU_ASSERT_OK_FATAL(eng_up_with(&v, key_file("hsx_v", KEY_A "\n", 0600), 61, &shm, 1));
  CU_ASSERT_FATAL(relay_bind(&x.r));
  tu_addr(via, sizeof(via), x.r.port);
  HixlOption o[2] = {{"AuthAliases", via}, shm};
  TU_ASSERT_OK_FATAL(eng_up_with(&z, key_file("hsx_z", KEY_A "\n", 0600), 62, o, 2));
  x.r.to_port = port_of(&z);
  CU_ASSERT_FATAL(pthread_create(&x.r.th, NULL, hsx_main, &x) == 0);
  TU_ASSERT_STATUS(HixlEngineConnect(v.e, via, 5000), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS(frame);
  TU_ASSERT_ERRMSG_HAS("failed its proof");
  relay_down(&x.r);
  CU_ASSERT_TRUE(x.acked); /* Z did take V's proof: only the forwarder's byte failed */
  CU_ASSERT_FALSE(peer_secret(v.e, via, &authed, &broken));
  CU_ASSERT_FALSE(authed);
  CU_ASSERT_EQUAL(conns_of(v.e), 0);
  HixlTransferOpDesc op = {.local_addr = (uintptr_t)v.mem, .remote_addr = (uintptr_t)z.mem, .len = 64};
  TU_ASSERT_STATUS(HixlEngineTransferSync(v.e, via, HIXL_WRITE, &op, 1, 1000), HIXL_NOT_CONNECTED);
  unsigned left = 1;
  for (int64_t until = tu_now_ms() + 5000; tu_now_ms() < until && (left = conns_of(z.e)) != 0;) sched_yield();
  CU_ASSERT_EQUAL(left, 0);
  TU_ASSERT_PATTERN(v.mem, MEM, 61, "V's memory after a tampered handshake");
  TU_ASSERT_PATTERN(z.mem, MEM, 62, "Z's memory after a tampered handshake");
  TU_ASSERT_OK(HixlEngineConnect(v.e, z.name, 5000)); /* V dials Z itself: linked */
  move_and_check(&v, &z, 62);
  eng_down(&v);
  eng_down(&z);
}

static void test_hsx_flip_ack(void) { hsx_case(HSX_FLIP_ACK, "HELLO_ACK (frame 1)"); }
static void test_hsx_add_mem(void) { hsx_case(HSX_ADD_MEM, "MEM_ADD (frame 2)"); }

/* ---- hostile peers speaking the wire directly to a target with a key ---- */

static struct eng tgt, ini; /* a keyed target and a keyed initiator linked to it */
static uint16_t tport;

static int hostile_init(void) {
  if (eng_up(&tgt, key_file("h_t", KEY_A "\n", 0600), 5) != HIXL_SUCCESS ||
      eng_up(&ini, key_file("h_i", KEY_A "\n", 0600), 6) != HIXL_SUCCESS ||
      HixlEngineConnect(ini.e, tgt.name, 5000) != HIXL_SUCCESS)
    return -1;
  tport = (uint16_t)atoi(strchr(tgt.name, ':') + 1);
  return 0;
}

static int hostile_clean(void) {
  eng_down(&ini);
  eng_down(&tgt);
  return 0;
}

/* After each hostile attempt: the target's memory is as it was (pattern 5, or what the
 * last legitimate WRITE put there) and the legitimate link still moves data. */
static void legit_still_works(void) {
  move_and_check(&ini, &tgt, 5);
  tu_fill(tgt.mem, MEM, 5); /* back to the pattern for the next test */
}

/* A refusal is bare: status 3, no caps, no name, no memory table, then the close. */
static void assert_bare_refusal(int fd, const struct raw_auth *a) {
  CU_ASSERT_EQUAL(a->status, WIRE_HELLO_AUTH);
  CU_ASSERT_EQUAL(a->ack_caps, 0);
  CU_ASSERT_EQUAL(a->ack_name_len, 0);
  CU_ASSERT_EQUAL(a->ack_count, 0);
  CU_ASSERT_TRUE(raw_closed_silent(fd));
}

static void test_raw_no_key(void) {
  struct raw_auth a = {.name = "intruder:1"};
  int fd = raw_dial(tport);
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_TRUE_FATAL(raw_auth_hello(fd, &a, raw_send_all, raw_recv_all));
  CU_ASSERT_FALSE(a.challenged);
  assert_bare_refusal(fd, &a);
  close(fd);
  TU_ASSERT_PATTERN(tgt.mem, MEM, 5, "the target's memory after a keyless HELLO");
  legit_still_works();
}

static void test_raw_wrong_key(void) {
  struct raw_auth a = {.name = "intruder:1", .key_hex = KEY_B};
  int fd = raw_dial(tport);
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_TRUE_FATAL(raw_auth_hello(fd, &a, raw_send_all, raw_recv_all));
  CU_ASSERT_FALSE(a.challenged); /* no key id in common: not even a challenge */
  assert_bare_refusal(fd, &a);
  close(fd);
  legit_still_works();
}

/* A peer that offers the right key id but cannot compute the proof. */
static void test_raw_bad_proof(void) {
  struct raw_auth a = {.name = "intruder:1", .key_hex = KEY_A, .bad_proof = true};
  int fd = raw_dial(tport);
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_TRUE_FATAL(raw_auth_hello(fd, &a, raw_send_all, raw_recv_all));
  CU_ASSERT_TRUE(a.challenged);
  CU_ASSERT_TRUE(a.target_proved); /* the target proved the key first */
  assert_bare_refusal(fd, &a);
  close(fd);
  legit_still_works();
}

/* Two HELLO extensions (one of a type nobody knows yet, one empty): a keyed HELLO with
 * them is served and proven (they are in both proofs); left out of the initiator's
 * proof, as a relay that appended them would leave them, the same HELLO is refused
 * (before: any byte after HELLO's fields closed the link as malformed, so HELLO could
 * not grow; test_engine_wire has the unkeyed HELLO). */
static const uint8_t hello_ext[] = {0xfe, 0x01, 0x00, 0x03, 'n', 'e', 'w', 0x00, 0x07, 0x00, 0x00};

static void test_raw_hello_ext(void) {
  struct raw_auth a = {.name = "ext:1", .key_hex = KEY_A, .ext = hello_ext, .ext_len = sizeof(hello_ext)};
  int fd = raw_dial(tport);
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_TRUE_FATAL(raw_auth_hello(fd, &a, raw_send_all, raw_recv_all));
  CU_ASSERT_TRUE(a.challenged && a.target_proved);
  CU_ASSERT_EQUAL(a.status, WIRE_HELLO_OK);
  CU_ASSERT_TRUE(a.ack_proven);
  close(fd);
  struct raw_auth b = {.name = "ext:2",
                       .key_hex = KEY_A,
                       .ext = hello_ext,
                       .ext_len = sizeof(hello_ext),
                       .ext_unproven = true};
  fd = raw_dial(tport);
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_TRUE_FATAL(raw_auth_hello(fd, &b, raw_send_all, raw_recv_all));
  CU_ASSERT_TRUE(b.challenged);
  CU_ASSERT_FALSE(b.target_proved); /* the target's proof covers them: the initiator sees it too */
  assert_bare_refusal(fd, &b);
  close(fd);
  legit_still_works();
}

/* A recorded handshake played again: the same HELLO (nonce) and the same proof meet a
 * fresh challenge, and are refused. */
static void test_raw_replay(void) {
  uint8_t nonce[32];
  memset(nonce, 0x5a, sizeof(nonce));
  struct raw_auth rec = {.name = "recorded:1", .key_hex = KEY_A, .nonce = nonce};
  int fd = raw_dial(tport);
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_TRUE_FATAL(raw_auth_hello(fd, &rec, raw_send_all, raw_recv_all));
  CU_ASSERT_EQUAL(rec.status, WIRE_HELLO_OK); /* the original, by a key holder */
  close(fd);
  /* The replayer has the bytes, not the key: the proof it sends is the recorded one. */
  struct raw_auth a = {.name = "recorded:1", .key_hex = KEY_A, .nonce = nonce, .replay = rec.proof};
  fd = raw_dial(tport);
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_TRUE_FATAL(raw_auth_hello(fd, &a, raw_send_all, raw_recv_all));
  CU_ASSERT_TRUE(a.challenged);
  assert_bare_refusal(fd, &a);
  close(fd);
  legit_still_works();
}

/* Frames out of turn: AUTH_PROOF before HELLO, a CALL or a WRITE before the proof:
 * the link closes with no answer, nothing is written. */
static void test_raw_out_of_turn(void) {
  uint8_t b[128];
  struct wire_wr w;
  int fd = raw_dial(tport);
  CU_ASSERT_FATAL(fd >= 0);
  wire_begin(&w, b, sizeof(b), WIRE_AUTH_PROOF);
  wire_put_bytes(&w, b + 64, WIRE_AUTH_MAC);
  CU_ASSERT_TRUE(raw_send_all(fd, b, wire_end(&w, 0)));
  CU_ASSERT_TRUE(raw_closed_silent(fd));
  close(fd);
  /* HELLO with the key offered, then a WRITE into the target's memory instead of the proof. */
  uint8_t nonce[32] = {1}, hello[512];
  char text[80], why[64];
  struct auth_ring ring;
  snprintf(text, sizeof(text), "%s\n", KEY_A);
  CU_ASSERT_FATAL(auth_parse(text, &ring, why, sizeof(why)));
  fd = raw_dial(tport);
  CU_ASSERT_FATAL(fd >= 0);
  char dialled[TU_ADDR_LEN];
  tu_addr(dialled, sizeof(dialled), tport);
  CU_ASSERT_TRUE(raw_send_all(fd, hello,
                              wire_put_hello_auth(hello, sizeof(hello), WIRE_CAP_TCP_DATA | WIRE_CAP_PROVEN,
                                                  "x:1", nonce, ring.key[0].id, 1, dialled)));
  struct wire_hdr h;
  CU_ASSERT_TRUE_FATAL(raw_recv_all(fd, b, WIRE_HDR_LEN) && wire_parse_hdr(b, &h) == WIRE_OK);
  CU_ASSERT_EQUAL(h.type, WIRE_AUTH_CHALLENGE);
  CU_ASSERT_TRUE(raw_recv_all(fd, hello, h.body_len));
  uint8_t data[64];
  memset(data, 0xee, sizeof(data));
  size_t n = wire_put_write_req(b, 1, (uintptr_t)tgt.mem, sizeof(data));
  CU_ASSERT_TRUE(raw_send_all(fd, b, n) && raw_send_all(fd, data, sizeof(data)));
  CU_ASSERT_TRUE(raw_closed_silent(fd));
  close(fd);
  TU_ASSERT_PATTERN(tgt.mem, MEM, 5, "the target's memory after a WRITE before the proof");
  legit_still_works();
}

/* Error lines the library logs (a counter for HixlSetLogCallback), and the last. */
struct log_count {
  int n;
  char last[512];
};

static void count_line(HixlLogLevel level, const char *msg, void *ctx) {
  struct log_count *lc = ctx;
  if (level != HIXL_LOG_ERROR) return;
  lc->n++;
  snprintf(lc->last, sizeof(lc->last), "%s", msg);
}

/* Peers without the key open connections and send what is not a HELLO (garbage, a
 * frame out of turn, a HELLO of another version): each is closed, and the log says so
 * once a second at most, with the count, as for refused handshakes (docs/security.md,
 * threat model). Before, each such connection wrote an error line: a peer that reaches
 * the port could fill the log at the rate it connects. */
static void test_raw_garbage_logged_rarely(void) {
  struct log_count lc = {0};
  uint8_t b[64];
  HixlSetLogCallback(count_line, &lc);
  for (int i = 0; i < 300; i++) {
    int fd = raw_dial(tport);
    CU_ASSERT_FATAL(fd >= 0);
    size_t n = WIRE_HDR_LEN;
    if (i % 3 == 0) { /* not hixl at all */
      memset(b, 'G', sizeof(b));
    } else if (i % 3 == 1) { /* a frame out of turn: a WRITE before any HELLO */
      n = wire_put_write_req(b, 1, (uintptr_t)tgt.mem, 8);
      memset(b + n, 0xee, 8);
      n += 8;
    } else { /* a HELLO of another version */
      n = wire_put_hello(b, sizeof(b), WIRE_CAP_TCP_DATA, "old:1");
      b[4] = WIRE_VERSION + 1;
    }
    CU_ASSERT_TRUE(raw_send_all(fd, b, n));
    if (i % 3 == 2) {
      struct wire_hdr h;
      CU_ASSERT_TRUE(raw_recv_all(fd, b, WIRE_HDR_LEN)); /* HELLO_ACK status 1 */
      CU_ASSERT_EQUAL(wire_parse_hdr(b, &h), WIRE_OK);
      CU_ASSERT_TRUE(raw_recv_all(fd, b, h.body_len) && be_get32(b) == WIRE_HELLO_VERSION);
    }
    CU_ASSERT_TRUE(raw_closed_silent(fd));
    close(fd);
  }
  HixlSetLogCallback(NULL, NULL);
  /* 300 closed: one line a second at most (the run takes a few; none when the suite's
   * refusal before it was logged less than a second ago), each with the count */
  CU_ASSERT(lc.n <= 20);
  CU_ASSERT(lc.n == 0 || strstr(lc.last, "refused since the last such line") != NULL);
  TU_ASSERT_PATTERN(tgt.mem, MEM, 5, "the target's memory after garbage before HELLO");
  legit_still_works();
}

/* A connection that says HELLO and never proves is closed at HandshakeTimeout: its
 * own engine here, with a short one. */
static void test_raw_proof_never_comes(void) {
  struct eng t;
  const char *k = key_file("slow", KEY_A "\n", 0600);
  HixlOption o[2] = {{"AuthKeyFile", k}, {"HandshakeTimeout", "300"}};
  memset(&t, 0, sizeof(t));
  tu_addr(t.name, sizeof(t.name), tu_free_port());
  TU_ASSERT_OK_FATAL(HixlEngineCreate(&t.e));
  TU_ASSERT_OK_FATAL(HixlEngineInitialize(t.e, t.name, o, 2));
  uint8_t nonce[32] = {2}, b[512];
  char text[80], why[64];
  struct auth_ring ring;
  snprintf(text, sizeof(text), "%s\n", KEY_A);
  CU_ASSERT_FATAL(auth_parse(text, &ring, why, sizeof(why)));
  int fd = raw_dial((uint16_t)atoi(strchr(t.name, ':') + 1));
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_TRUE(raw_send_all(fd, b,
                              wire_put_hello_auth(b, sizeof(b), WIRE_CAP_TCP_DATA | WIRE_CAP_PROVEN, "slow:1",
                                                  nonce, ring.key[0].id, 1, t.name)));
  struct wire_hdr h;
  CU_ASSERT_TRUE_FATAL(raw_recv_all(fd, b, WIRE_HDR_LEN) && wire_parse_hdr(b, &h) == WIRE_OK);
  CU_ASSERT_EQUAL(h.type, WIRE_AUTH_CHALLENGE);
  CU_ASSERT_TRUE(raw_recv_all(fd, b, h.body_len));
  int64_t t0 = tu_now_ms();
  CU_ASSERT_TRUE(raw_closed_silent(fd)); /* within the 5 s receive timeout */
  CU_ASSERT_TRUE(tu_now_ms() - t0 < 4000);
  close(fd);
  eng_down(&t);
}

/* A name is what the peer proved under the key; a keyless peer claiming the
 * legitimate initiator's name is refused, and what it said reaches the log escaped. */
static char logged[4096];
static void log_cb(HixlLogLevel level, const char *msg, void *ctx) {
  (void)level;
  (void)ctx;
  if (strstr(msg, "refused a link")) snprintf(logged, sizeof(logged), "%s", msg);
}

static void test_raw_spoofed_name(void) {
  char name[96];
  snprintf(name, sizeof(name), "%s", ini.name);
  struct raw_auth a = {.name = name};
  int fd = raw_dial(tport);
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_TRUE_FATAL(raw_auth_hello(fd, &a, raw_send_all, raw_recv_all));
  assert_bare_refusal(fd, &a);
  close(fd);
  legit_still_works(); /* the real holder of that name is untouched */
  /* Control bytes and escapes in a name are logged as \xNN. */
  logged[0] = '\0';
  HixlSetLogCallback(log_cb, NULL);
  struct raw_auth e = {.name = "evil\n[hixl E] forged line\x1b[31m"};
  fd = raw_dial(tport);
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_TRUE(raw_auth_hello(fd, &e, raw_send_all, raw_recv_all));
  close(fd);
  legit_still_works(); /* a round trip: the refusal was logged before */
  HixlSetLogCallback(NULL, NULL);
  /* The line may be rate-limited into the next second's: when it was written, it is escaped. */
  if (logged[0]) {
    CU_ASSERT_PTR_NULL(strchr(logged, '\n'));
    CU_ASSERT_PTR_NULL(strchr(logged, '\x1b'));
    CU_ASSERT_PTR_NOT_NULL(strstr(logged, "evil\\x0a[hixl E] forged line\\x1b[31m"));
  }
}

static CU_TestInfo auth_tests[] = {
    {"same key: linked, READ and WRITE byte for byte", test_same_key},
    {"initiator without a key: refused, target untouched", test_no_key_refused},
    {"a wrong key: refused, target untouched", test_wrong_key_refused},
    {"a target without a key: the keyed initiator refuses it", test_keyless_target_refused},
    {"key files: permissions, contents; StagingUnregistered needs a key", test_key_file_checks},
    {"rotation: a second key, re-read at the next handshake", test_rotation},
    {"a key file another user owns: refused", test_key_file_owner},
    {"a relative key file after a chdir: still the file it named", test_key_file_relative},
    {"a key file made unusable after it was read: keys kept, and said", test_key_file_unusable_logged},
    {"a keyless relay between two keyed engines: refused, naming both; memory untouched", test_keyless_relay},
    {"a handshake reflected to its own engine: refused, memory untouched", test_reflection},
    {"listening on 0.0.0.0: a handshake that dialled another host at its port is refused",
     test_any_address_binding},
    {"a forwarder listed in AuthAliases: linked through it, byte for byte", test_alias_through_forwarder},
    {"a forwarder alters a byte of an answer: the READ fails, nothing lands", test_mitm_alters_answer},
    {"a forwarder puts in a frame of its own: the link ends, nothing written", test_mitm_injects},
    {"a forwarder alters data: taken without AuthPayloadTag, refused with it; on against off refused",
     test_mitm_alters_data},
    {"AuthPayloadTag on both: direct and staged ops byte for byte", test_payload_tags_move},
    {"a broken authenticated link: the initiator wipes its session secret at once",
     test_broken_link_wipes_session},
    {"a forwarder alters the HELLO_ACK's tag: Connect FAILED, no link either side, memory untouched",
     test_hsx_flip_ack},
    {"a forwarder puts a MEM_ADD into the handshake: Connect FAILED, no link either side, memory untouched",
     test_hsx_add_mem},
    CU_TEST_INFO_NULL,
};

/* The tags themselves: a payload's tag is the same fed whole or in pieces, and changes
 * with a byte, the frame's count and the direction; a frame's tag checks once, in
 * order, under the other end's keys only. */
static void test_tags(void) {
  static const uint8_t session[AUTH_MAC_LEN] = {7, 7, 7};
  struct auth_frames i = {0}, t = {0};
  uint8_t data[5000], whole[AUTH_TAG_LEN], pieces[AUTH_TAG_LEN], other[AUTH_TAG_LEN], tag[AUTH_TAG_LEN];
  tu_fill(data, sizeof(data), 9);
  CU_ASSERT_FATAL(auth_frames_init(&i, session, true) && auth_frames_init(&t, session, false));
  auth_data_begin(&i.tx, 3);
  auth_data_add(&i.tx, data, sizeof(data));
  auth_data_end(&i.tx, whole);
  auth_data_begin(&t.rx, 3);
  for (size_t off = 0, k = 1; off < sizeof(data); off += k, k = k * 3 + 1)
    auth_data_add(&t.rx, data + off, off + k < sizeof(data) ? k : sizeof(data) - off);
  auth_data_end(&t.rx, pieces);
  TU_ASSERT_SAME(whole, pieces, AUTH_TAG_LEN, "a payload's tag, whole and in pieces");
  auth_data_begin(&i.tx, 4); /* another frame's count */
  auth_data_add(&i.tx, data, sizeof(data));
  auth_data_end(&i.tx, other);
  CU_ASSERT_NOT_EQUAL(memcmp(whole, other, AUTH_TAG_LEN), 0);
  data[4999] ^= 1; /* another byte */
  auth_data_begin(&i.tx, 3);
  auth_data_add(&i.tx, data, sizeof(data));
  auth_data_end(&i.tx, other);
  CU_ASSERT_NOT_EQUAL(memcmp(whole, other, AUTH_TAG_LEN), 0);
  auth_data_begin(&i.rx, 3); /* the other direction's key */
  auth_data_add(&i.rx, data, sizeof(data));
  auth_data_end(&i.rx, other);
  CU_ASSERT_NOT_EQUAL(memcmp(whole, other, AUTH_TAG_LEN), 0);
  auth_seal_frame(&i.tx, data, 36, NULL, 0, tag);
  CU_ASSERT_FALSE(auth_check_frame(&i.rx, data, 36, NULL, 0, tag)); /* its own direction's rx: no */
  CU_ASSERT_TRUE(auth_check_frame(&t.rx, data, 36, NULL, 0, tag));
  CU_ASSERT_FALSE(auth_check_frame(&t.rx, data, 36, NULL, 0, tag)); /* once: the count moved on */
  auth_frames_free(&i);
  auth_frames_free(&t);
}

/* log_escape itself: what a peer names itself cannot break a line or drive a terminal. */
static void test_log_escape(void) {
  char out[64];
  log_escape(out, sizeof(out), "ok:1", 4);
  CU_ASSERT_STRING_EQUAL(out, "ok:1");
  log_escape(out, sizeof(out), "a\nb\x1b[0m\\\x7f\xff", 10);
  CU_ASSERT_STRING_EQUAL(out, "a\\x0ab\\x1b[0m\\x5c\\x7f\\xff");
  log_escape(out, 6, "\n\n\n", 3); /* cut at a whole escape, still terminated */
  CU_ASSERT_STRING_EQUAL(out, "\\x0a");
}

/* ---- scoped memory: a keyed target serving its peer only inside grants (tcp) ---- */

static struct eng st, si; /* scoped target, its initiator; both Transport tcp */
static uint8_t *sbuf;     /* the initiator's registered buffer */
static HixlMemHandle sh;

static HixlStatus tcp_eng_up(struct eng *g, const char *key, uint64_t seed) {
  HixlOption o[3] = {{"AuthKeyFile", key}, {"Transport", "tcp"}, {"StagingThreshold", "4096"}};
  memset(g, 0, sizeof(*g));
  tu_addr(g->name, sizeof(g->name), tu_free_port());
  if (HixlEngineCreate(&g->e) != HIXL_SUCCESS) return HIXL_FAILED;
  HixlStatus rc = HixlEngineInitialize(g->e, g->name, o, 3);
  if (rc != HIXL_SUCCESS) return rc;
  g->mem = tu_alloc_mem(MEM, false);
  tu_fill(g->mem, MEM, seed);
  HixlMemDesc d = {.addr = (uintptr_t)g->mem, .len = MEM};
  return HixlEngineRegisterMem(g->e, &d, HIXL_MEM_HOST, &g->h);
}

static int scoped_init(void) {
  const char *k = key_file("scoped", KEY_A "\n", 0600);
  if (tcp_eng_up(&st, k, 7) != HIXL_SUCCESS || tcp_eng_up(&si, k, 8) != HIXL_SUCCESS ||
      hixl_engine_set_scoped(st.e, true) != HIXL_SUCCESS ||
      HixlEngineConnect(si.e, st.name, 5000) != HIXL_SUCCESS)
    return -1;
  sbuf = si.mem;
  sh = si.h;
  return 0;
}

static int scoped_clean(void) {
  eng_down(&si);
  eng_down(&st);
  return 0;
}

/* One op of len bytes at the scoped target's offset off: its status. */
static HixlStatus sop(HixlTransferOp op, size_t off, size_t len) {
  HixlTransferOpDesc d = {
      .local_addr = (uintptr_t)sbuf + off, .remote_addr = (uintptr_t)st.mem + off, .len = len};
  return HixlEngineTransferSync(si.e, st.name, op, &d, 1, 5000);
}

static void test_scoped_nothing_granted(void) {
  uint64_t refused0, refused1;
  TU_ASSERT_OK(hixl_engine_grant_stats(st.e, si.name, NULL, &refused0));
  tu_fill(sbuf, MEM, 9);
  TU_ASSERT_STATUS(sop(HIXL_WRITE, 0, 65536), HIXL_FAILED);
  TU_ASSERT_STATUS(sop(HIXL_READ, 0, 65536), HIXL_FAILED);
  TU_ASSERT_STATUS(sop(HIXL_WRITE, 100, 64), HIXL_FAILED); /* staged (below StagingThreshold) */
  TU_ASSERT_STATUS(sop(HIXL_READ, 100, 64), HIXL_FAILED);
  TU_ASSERT_PATTERN(st.mem, MEM, 7, "the scoped target's memory: nothing granted, nothing written");
  TU_ASSERT_PATTERN(sbuf, MEM, 9, "the initiator's buffer: nothing read");
  TU_ASSERT_OK(hixl_engine_grant_stats(st.e, si.name, NULL, &refused1));
  CU_ASSERT_TRUE(refused1 >= refused0 + 4);
}

/* Warning lines about refused ops, and the last. */
static void count_refused(HixlLogLevel level, const char *msg, void *ctx) {
  struct log_count *lc = ctx;
  if (level != HIXL_LOG_WARN || !strstr(msg, "refused")) return;
  lc->n++;
  snprintf(lc->last, sizeof(lc->last), "%s", msg);
}

/* A peer that holds the key sends 300 ops outside its grants (direct and staged): each
 * is refused and counted, and the log says so once a second at most, with how many it
 * left unsaid (before: a warning each, so a key holder filled the log at the rate it
 * sent ops). */
static void test_scoped_refusals_logged_rarely(void) {
  struct log_count lc = {0};
  uint64_t refused0, refused1;
  TU_ASSERT_OK(hixl_engine_grant_stats(st.e, si.name, NULL, &refused0));
  HixlSetLogLevel(HIXL_LOG_WARN);
  HixlSetLogCallback(count_refused, &lc);
  for (int i = 0; i < 300; i++)
    TU_ASSERT_STATUS(sop(i % 2 ? HIXL_READ : HIXL_WRITE, 4096 * (size_t)(i % 8), i % 4 < 2 ? 64 : 8192),
                     HIXL_FAILED);
  HixlSetLogCallback(NULL, NULL);
  HixlSetLogLevel(HIXL_LOG_ERROR);
  TU_ASSERT_OK(hixl_engine_grant_stats(st.e, si.name, NULL, &refused1));
  CU_ASSERT_TRUE(refused1 >= refused0 + 300); /* every one counted */
  /* one line a second at most (none when the line before came less than a second ago) */
  CU_ASSERT(lc.n <= 20);
  CU_ASSERT(lc.n == 0 || strstr(lc.last, "refused since the last such line") != NULL);
  TU_ASSERT_PATTERN(st.mem, MEM, 7, "the scoped target's memory: nothing granted, nothing written");
}

static void test_scoped_inside_and_outside(void) {
  const uint64_t base = (uintptr_t)st.mem;
  const uint64_t g[2][2] = {{base + 65536, 65536}, {base + 131072, 32768}}; /* adjacent */
  size_t n;
  TU_ASSERT_OK(hixl_engine_grant(st.e, si.name, g, 2));
  TU_ASSERT_OK(hixl_engine_grant_stats(st.e, si.name, &n, NULL));
  CU_ASSERT_EQUAL(n, 2);
  tu_fill(sbuf, MEM, 10);
  TU_ASSERT_OK(sop(HIXL_WRITE, 65536, 98304)); /* both grants, across their border */
  TU_ASSERT_SAME(st.mem + 65536, sbuf + 65536, 98304, "a WRITE inside the grants");
  TU_ASSERT_STATUS(sop(HIXL_WRITE, 65536 - 64, 128), HIXL_FAILED);          /* straddles the start */
  TU_ASSERT_STATUS(sop(HIXL_WRITE, 131072 + 32768 - 64, 128), HIXL_FAILED); /* ... the end */
  TU_ASSERT_PATTERN(st.mem, 65536, 7, "below the grants");
  uint8_t *ref = tu_alloc_mem(MEM, false);
  tu_fill(ref, MEM, 7);
  TU_ASSERT_SAME(st.mem + 163840, ref + 163840, MEM - 163840, "above the grants");
  tu_free_mem(ref, MEM);
  tu_fill(sbuf, MEM, 11);
  TU_ASSERT_OK(sop(HIXL_READ, 70000, 100)); /* staged, inside */
  TU_ASSERT_SAME(sbuf + 70000, st.mem + 70000, 100, "a staged READ inside the grants");
  TU_ASSERT_STATUS(sop(HIXL_READ, 200000, 100), HIXL_FAILED);
  CU_ASSERT_EQUAL(tu_mismatch(sbuf + 200000, st.mem + 200000, 100) >= 0, true); /* not read */
}

static void test_scoped_revoke_and_counts(void) {
  const uint64_t base = (uintptr_t)st.mem;
  const uint64_t g[1][2] = {{base + 65536, 65536}}, g2[1][2] = {{base + 131072, 32768}};
  /* Granted twice (once more now): one revoke leaves it granted, the second ends it. */
  TU_ASSERT_OK(hixl_engine_grant(st.e, si.name, g, 1));
  TU_ASSERT_OK(hixl_engine_revoke(st.e, si.name, g, 1));
  TU_ASSERT_OK(sop(HIXL_READ, 65536, 4096));
  TU_ASSERT_OK(hixl_engine_revoke(st.e, si.name, g, 1));
  TU_ASSERT_STATUS(sop(HIXL_READ, 65536, 4096), HIXL_FAILED);
  TU_ASSERT_OK(sop(HIXL_READ, 131072, 4096)); /* the other one stays */
  TU_ASSERT_OK(hixl_engine_revoke(st.e, si.name, g2, 1));
  TU_ASSERT_STATUS(sop(HIXL_READ, 131072, 4096), HIXL_FAILED);
  /* A revoke of what is not granted: refused. */
  TU_ASSERT_STATUS(hixl_engine_revoke(st.e, si.name, g, 1), HIXL_PARAM_INVALID);
  /* Grants that overlap (runs of blocks two requests share in part): each byte is held
   * while a grant holding it is; a revoke names a range granted, not a piece of one. */
  const uint64_t a[1][2] = {{base, 8192}}, b[1][2] = {{base + 4096, 8192}}, mid[1][2] = {{base + 2048, 4096}};
  size_t n;
  TU_ASSERT_OK(hixl_engine_grant(st.e, si.name, a, 1));
  TU_ASSERT_OK(hixl_engine_grant(st.e, si.name, b, 1));
  TU_ASSERT_OK(hixl_engine_grant_stats(st.e, si.name, &n, NULL));
  CU_ASSERT_EQUAL(n, 3); /* [0, 4 KiB) held once, [4, 8) twice, [8, 12) once */
  tu_fill(sbuf, MEM, 12);
  TU_ASSERT_OK(sop(HIXL_READ, 0, 12288));
  TU_ASSERT_SAME(sbuf, st.mem, 12288, "a READ across two overlapping grants");
  TU_ASSERT_STATUS(hixl_engine_revoke(st.e, si.name, mid, 1), HIXL_PARAM_INVALID);
  TU_ASSERT_ERRMSG_HAS("not granted");
  TU_ASSERT_OK(hixl_engine_revoke(st.e, si.name, a, 1));
  TU_ASSERT_STATUS(sop(HIXL_READ, 0, 4096), HIXL_FAILED); /* a's alone: gone */
  tu_fill(sbuf, MEM, 13);
  TU_ASSERT_OK(sop(HIXL_READ, 4096, 8192)); /* b's, the part a shared included: still held */
  TU_ASSERT_SAME(sbuf + 4096, st.mem + 4096, 8192, "a READ inside the grant left");
  TU_ASSERT_STATUS(hixl_engine_revoke(st.e, si.name, a, 1), HIXL_PARAM_INVALID); /* not twice */
  TU_ASSERT_OK(hixl_engine_revoke(st.e, si.name, b, 1));
  TU_ASSERT_STATUS(sop(HIXL_READ, 4096, 4096), HIXL_FAILED);
  TU_ASSERT_OK(hixl_engine_grant_stats(st.e, si.name, &n, NULL));
  CU_ASSERT_EQUAL(n, 0);
  /* Granted to another name: no help to this peer. */
  TU_ASSERT_OK(hixl_engine_grant(st.e, "127.0.0.1:1", g, 1));
  TU_ASSERT_STATUS(sop(HIXL_READ, 65536, 4096), HIXL_FAILED);
  TU_ASSERT_OK(hixl_engine_revoke(st.e, "127.0.0.1:1", g, 1));
  TU_ASSERT_STATUS(hixl_engine_grant(st.e, "", g, 1), HIXL_PARAM_INVALID);
  const uint64_t wrap[1][2] = {{UINT64_MAX - 10, 100}};
  TU_ASSERT_STATUS(hixl_engine_grant(st.e, si.name, wrap, 1), HIXL_PARAM_INVALID);
}

/* An authenticated raw peer READs outside its grant: READ_RESP FAILED with no data. */
static void test_scoped_raw_read_outside(void) {
  struct auth_frames fr = {0};
  struct raw_auth a = {.name = "raw-reader:1", .key_hex = KEY_A, .frames = &fr};
  uint8_t b[WIRE_HDR_LEN + 64], tag[AUTH_TAG_LEN];
  struct wire_hdr h;
  struct wire_msg m;
  int fd = raw_dial((uint16_t)atoi(strchr(st.name, ':') + 1));
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_TRUE_FATAL(raw_auth_hello(fd, &a, raw_send_all, raw_recv_all));
  CU_ASSERT_EQUAL_FATAL(a.status, WIRE_HELLO_OK);
  /* It skips the HELLO_ACK's table (read by raw_auth_hello) and asks for 4 KiB. */
  CU_ASSERT_TRUE_FATAL(a.ack_proven);
  CU_ASSERT_TRUE(raw_send_proven(fd, &fr, b, wire_put_read_req(b, 1, (uintptr_t)st.mem, 4096), NULL, 0));
  CU_ASSERT_TRUE_FATAL(raw_recv_all(fd, b, WIRE_HDR_LEN) && wire_parse_hdr(b, &h) == WIRE_OK);
  CU_ASSERT_EQUAL(h.type, WIRE_READ_RESP);
  CU_ASSERT_EQUAL(h.payload_len, 0); /* no byte of the target's memory */
  CU_ASSERT_TRUE_FATAL(raw_recv_all(fd, b + WIRE_HDR_LEN, h.body_len) && raw_recv_all(fd, tag, sizeof(tag)) &&
                       wire_decode(&h, b + WIRE_HDR_LEN, &m) == WIRE_OK);
  CU_ASSERT_TRUE(auth_check_frame(&fr.rx, b, WIRE_HDR_LEN + h.body_len, NULL, 0, tag));
  CU_ASSERT_EQUAL(m.u.ack.status, HIXL_FAILED);
  /* Granted to it by the name it proved: now the bytes come. */
  const uint64_t g[1][2] = {{(uintptr_t)st.mem, 4096}};
  TU_ASSERT_OK(hixl_engine_grant(st.e, "raw-reader:1", g, 1));
  uint8_t data[4096];
  CU_ASSERT_TRUE(raw_send_proven(fd, &fr, b, wire_put_read_req(b, 2, (uintptr_t)st.mem, 4096), NULL, 0));
  CU_ASSERT_TRUE_FATAL(raw_recv_all(fd, b, WIRE_HDR_LEN) && wire_parse_hdr(b, &h) == WIRE_OK);
  CU_ASSERT_EQUAL_FATAL(h.payload_len, 4096);
  CU_ASSERT_TRUE(raw_recv_all(fd, b + WIRE_HDR_LEN, h.body_len) && raw_recv_all(fd, tag, sizeof(tag)) &&
                 raw_recv_all(fd, data, sizeof(data)));
  CU_ASSERT_TRUE(auth_check_frame(&fr.rx, b, WIRE_HDR_LEN + h.body_len, NULL, 0, tag));
  TU_ASSERT_SAME(data, st.mem, 4096, "a READ inside the raw peer's grant");
  TU_ASSERT_OK(hixl_engine_revoke(st.e, "raw-reader:1", g, 1));
  auth_frames_free(&fr);
  close(fd);
}

/* Grants to many peer names, all revoked: no name's set is left behind; a link whose
 * peer's set went (it had found it at an op) is refused, then served again on a new grant. */
static void test_scoped_sets_freed(void) {
  const uint64_t g[1][2] = {{(uintptr_t)st.mem, 4096}};
  char name[32];
  size_t peers = 99;
  TU_ASSERT_OK(hixl_engine_grant_peers(st.e, &peers));
  CU_ASSERT_EQUAL(peers, 0);
  for (int i = 0; i < 1000; i++) {
    snprintf(name, sizeof(name), "10.9.%d.%d:1", i / 250, i % 250);
    TU_ASSERT_OK(hixl_engine_grant(st.e, name, g, 1));
  }
  TU_ASSERT_OK(hixl_engine_grant_peers(st.e, &peers));
  CU_ASSERT_EQUAL(peers, 1000);
  for (int i = 0; i < 1000; i++) {
    snprintf(name, sizeof(name), "10.9.%d.%d:1", i / 250, i % 250);
    TU_ASSERT_OK(hixl_engine_revoke(st.e, name, g, 1));
  }
  TU_ASSERT_OK(hixl_engine_grant_peers(st.e, &peers));
  CU_ASSERT_EQUAL(peers, 0);
  /* si's link finds its set at an op; the set goes with its last range, and comes back */
  TU_ASSERT_OK(hixl_engine_grant(st.e, si.name, g, 1));
  tu_fill(sbuf, 4096, 71);
  TU_ASSERT_OK(sop(HIXL_WRITE, 0, 4096));
  TU_ASSERT_SAME(st.mem, sbuf, 4096, "a WRITE inside the grant");
  TU_ASSERT_OK(hixl_engine_revoke(st.e, si.name, g, 1));
  TU_ASSERT_STATUS(sop(HIXL_WRITE, 0, 4096), HIXL_FAILED);
  TU_ASSERT_OK(hixl_engine_grant(st.e, si.name, g, 1));
  tu_fill(sbuf, 4096, 72);
  TU_ASSERT_OK(sop(HIXL_WRITE, 0, 4096));
  TU_ASSERT_SAME(st.mem, sbuf, 4096, "a WRITE inside the grant given again");
  TU_ASSERT_OK(hixl_engine_revoke(st.e, si.name, g, 1));
  TU_ASSERT_OK(hixl_engine_grant_peers(st.e, &peers));
  CU_ASSERT_EQUAL(peers, 0);
}

static CU_TestInfo scoped_tests[] = {
    {"nothing granted: WRITE, READ, staged ops FAILED, nothing moved", test_scoped_nothing_granted},
    {"300 ops outside the grants: refused, counted, logged once a second at most",
     test_scoped_refusals_logged_rarely},
    {"inside the grants served byte for byte; across their edges FAILED", test_scoped_inside_and_outside},
    {"grants count; revoke; overlapping grants held byte by byte; other names refused",
     test_scoped_revoke_and_counts},
    {"a raw authenticated peer READs outside its grant: no data", test_scoped_raw_read_outside},
    {"1000 peers granted then revoked: no set left; a link's set freed and found again",
     test_scoped_sets_freed},
    CU_TEST_INFO_NULL,
};

/* ---- every frame proven: a key holder's frames altered, replayed, dropped, reordered ---- */

/* A raw link to the keyed target that proved the key; its frame tags in fr. */
static int proven_link(struct auth_frames *fr) {
  struct raw_auth a = {.name = "raw-framer:1", .key_hex = KEY_A, .frames = fr};
  int fd = raw_dial(tport);
  if (fd >= 0 &&
      (!raw_auth_hello(fd, &a, raw_send_all, raw_recv_all) || a.status != WIRE_HELLO_OK || !a.ack_proven)) {
    close(fd);
    fd = -1;
  }
  return fd;
}

/* A WRITE_REQ of 64 bytes into the target at off, tagged under fr (the next count):
 * the frame, its tag and the payload in out, their length returned. */
static size_t sealed_write(struct auth_frames *fr, uint64_t seq, size_t off, uint8_t fill, uint8_t *out) {
  size_t n = wire_put_write_req(out, seq, (uintptr_t)tgt.mem + off, 64);
  out[7] |= WIRE_F_TAG;
  auth_seal_frame(&fr->tx, out, n, NULL, 0, out + n);
  memset(out + n + AUTH_TAG_LEN, fill, 64);
  return n + AUTH_TAG_LEN + 64;
}

enum tamper { T_ALTER, T_BAD_TAG, T_UNTAGGED, T_REPLAY, T_DROP, T_REORDER, T_N };
static const char *const tamper_name[T_N] = {"altered",  "a wrong tag", "no tag",
                                             "replayed", "one dropped", "reordered"};

/* One case: the link ends with nothing said, and no byte of the target changes. */
static void tamper_case(enum tamper t) {
  struct auth_frames fr = {0};
  uint8_t a[WIRE_SMALL_FRAME + AUTH_TAG_LEN + 64], b[sizeof(a)], hdr[WIRE_HDR_LEN + 64];
  struct wire_hdr h;
  int fd = proven_link(&fr);
  CU_ASSERT_FATAL(fd >= 0);
  size_t na = 0, nb = 0, frame = wire_put_write_req(a, 1, 0, 64);
  bool sent = true;
  switch (t) {
  case T_ALTER: /* sealed for offset 0, then pointed at offset 4096 */
    na = sealed_write(&fr, 1, 0, 0xa1, a);
    wire_put_write_req(hdr, 1, (uintptr_t)tgt.mem + 4096, 64);
    memcpy(a + 8, hdr + 8, frame - 8); /* the lengths, seq and address; the flag kept */
    sent = raw_send_all(fd, a, na);
    break;
  case T_BAD_TAG:
    na = sealed_write(&fr, 1, 0, 0xa2, a);
    a[frame] ^= 0x01;
    sent = raw_send_all(fd, a, na);
    break;
  case T_UNTAGGED: /* what a peer that never proved anything sends */
    memset(a + frame, 0xa3, 64);
    sent = raw_send_all(fd, a, frame) && raw_send_all(fd, a + frame, 64);
    break;
  case T_REPLAY: { /* served once; the same bytes again after the target's memory is set back */
    na = sealed_write(&fr, 1, 0, 0xa4, a);
    CU_ASSERT_TRUE_FATAL(raw_send_all(fd, a, na));
    CU_ASSERT_TRUE_FATAL(raw_recv_proven(fd, &fr, &h, hdr, hdr + WIRE_HDR_LEN, 64));
    CU_ASSERT_EQUAL(h.type, WIRE_WRITE_ACK);
    CU_ASSERT_EQUAL(tgt.mem[0], 0xa4); /* the original landed */
    tu_fill(tgt.mem, MEM, 5);
    sent = raw_send_all(fd, a, na);
    break;
  }
  case T_DROP: /* the first of two never arrives */
    na = sealed_write(&fr, 1, 0, 0xa5, a);
    nb = sealed_write(&fr, 2, 64, 0xa5, b);
    sent = raw_send_all(fd, b, nb);
    break;
  case T_REORDER:
    na = sealed_write(&fr, 1, 0, 0xa6, a);
    nb = sealed_write(&fr, 2, 64, 0xa6, b);
    sent = raw_send_all(fd, b, nb) && raw_send_all(fd, a, na);
    break;
  case T_N: break;
  }
  CU_ASSERT_TRUE(sent);
  if (!raw_closed_silent(fd))
    tu_fail(__FILE__, __LINE__, "a frame %s: the link was not closed", tamper_name[t]);
  close(fd);
  auth_frames_free(&fr);
  TU_ASSERT_PATTERN(tgt.mem, MEM, 5, "the target's memory after a frame the proof refused");
}

static void test_frames_tampered(void) {
  for (int t = 0; t < T_N; t++) tamper_case((enum tamper)t);
  legit_still_works();
}

/* A proven frame answered proven: the count goes on over many frames, both ways. */
static void test_frames_counted(void) {
  struct auth_frames fr = {0};
  uint8_t a[WIRE_SMALL_FRAME + AUTH_TAG_LEN + 64], hdr[WIRE_HDR_LEN + 64];
  struct wire_hdr h;
  int fd = proven_link(&fr);
  CU_ASSERT_FATAL(fd >= 0);
  for (uint64_t seq = 1; seq <= 200; seq++) {
    size_t n = sealed_write(&fr, seq, (seq % 64) * 64, (uint8_t)seq, a);
    CU_ASSERT_TRUE_FATAL(raw_send_all(fd, a, n));
    CU_ASSERT_TRUE_FATAL(raw_recv_proven(fd, &fr, &h, hdr, hdr + WIRE_HDR_LEN, 64));
    CU_ASSERT_EQUAL(h.type, WIRE_WRITE_ACK);
    CU_ASSERT_EQUAL(tgt.mem[(seq % 64) * 64], (uint8_t)seq);
  }
  CU_ASSERT_EQUAL(fr.tx.seq, 200);
  CU_ASSERT_EQUAL(fr.rx.seq, 201); /* the HELLO_ACK and 200 answers */
  close(fd);
  auth_frames_free(&fr);
  tu_fill(tgt.mem, MEM, 5);
  legit_still_works();
}

/* An older hixl (no WIRE_CAP_PROVEN) holding the key: refused, saying why. */
static void test_frames_unproven_peer(void) {
  struct raw_auth a = {.name = "old-hixl:1", .key_hex = KEY_A, .unproven = true};
  int fd = raw_dial(tport);
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_TRUE_FATAL(raw_auth_hello(fd, &a, raw_send_all, raw_recv_all));
  CU_ASSERT_FALSE(a.challenged);
  assert_bare_refusal(fd, &a);
  close(fd);
  legit_still_works();
}

static CU_TestInfo hostile_tests[] = {
    {"names are escaped (log_escape)", test_log_escape},
    {"frame and payload tags: pieces agree; a byte, a count, a direction differ; checked once", test_tags},
    {"no key: a bare refusal, no table, memory untouched", test_raw_no_key},
    {"a wrong key: refused before any challenge", test_raw_wrong_key},
    {"the right key id, a wrong proof: refused", test_raw_bad_proof},
    {"HELLO extensions: in the proofs, served; left out of them (a relay's): refused", test_raw_hello_ext},
    {"a replayed handshake: refused", test_raw_replay},
    {"frames out of turn (a WRITE before the proof): closed, nothing written", test_raw_out_of_turn},
    {"a proof that never comes: closed at HandshakeTimeout", test_raw_proof_never_comes},
    {"300 connections sending garbage before HELLO: closed, logged once a second at most",
     test_raw_garbage_logged_rarely},
    {"a spoofed name: refused; names in the log escaped", test_raw_spoofed_name},
    {"frames altered, wrongly tagged, untagged, replayed, dropped, reordered: link closed, nothing written",
     test_frames_tampered},
    {"200 proven frames each way: counted on, every one served", test_frames_counted},
    {"a key holder that does not prove its frames (an older hixl): refused", test_frames_unproven_peer},
    CU_TEST_INFO_NULL,
};

static CU_SuiteInfo suites[] = {
    {"auth", NULL, NULL, NULL, NULL, auth_tests},
    {"hostile peers", hostile_init, hostile_clean, NULL, NULL, hostile_tests},
    {"scoped memory (tcp)", scoped_init, scoped_clean, NULL, NULL, scoped_tests},
    CU_SUITE_INFO_NULL,
};

int main(void) {
  char cmd[96];
  snprintf(dir, sizeof(dir), "/tmp/hixl-auth-XXXXXX");
  if (!mkdtemp(dir)) return 1;
  int rc = tu_run_suites("test_auth", suites);
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  if (system(cmd) != 0) rc = 1;
  return rc;
}
