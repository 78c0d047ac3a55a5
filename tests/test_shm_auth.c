/* test_shm_auth: the same-host transport between engines that hold a key (AuthKeyFile,
 * issue 27). The unix socket a target names in SHM_HELLO_ACK is bound to the TCP link
 * (a MAC under the link's session secret), so:
 *  - the legitimate path still works: two engines in two processes link over shm,
 *    WRITE and READ checked byte for byte, and the target's AllocMem memory is mapped
 *    here and moved by memcpy, freed (unmapped here) by the target;
 *  - a middleman holding the key, which relays a real second engine's SHM_HELLO_ACK
 *    (its pid, probe, nonce and socket) to this engine, is refused by the binding:
 *    auto links over tcp and a WRITE aimed at the second engine's memory lands
 *    nothing there; Transport shm fails Connect saying why.
 * Every engine here and in the children holds the same key (a file of mode 0600; the
 * children get it through HIXL_AUTH_KEY_FILE). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "engine/engine_ext.h"
#include "raw_auth.h"
#include "test_util.h"
#include "util/auth.h"
#include "wire/wire.h"

#define KiB          ((size_t)1 << 10)
#define MiB          ((size_t)1 << 20)
#define MEM_LEN      (16 * MiB)
#define XFER_TIMEOUT 30000
#define READY_MS     10000

static const char *key; /* the key file every engine holds */

/* An engine of this process with the key, Transport transport (NULL: auto). */
static HixlEngine *keyed_engine(const char *transport) {
  HixlOption o = {"AuthKeyFile", key};
  return tu_engine_start_opts(tu_ip(), transport, &o, 1);
}

static struct hixl_link_info link_of(HixlEngine *e, const char *remote) {
  struct hixl_link_info li;
  memset(&li, 0, sizeof(li));
  TU_ASSERT_OK(hixl_engine_link_info(e, remote, &li));
  return li;
}

static HixlStatus xfer(HixlEngine *e, const char *remote, HixlTransferOp op, const void *local,
                       uint64_t remote_addr, size_t len, int32_t timeout_ms) {
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)local, .remote_addr = remote_addr, .len = len};
  return HixlEngineTransferSync(e, remote, op, &d, 1, timeout_ms);
}

/* ---------------------------------------------------------------- the legitimate path */

/* A target child (key from the environment) registering shared memory seen here. */
static bool target_up(tu_child *c, tu_shm *shm, const char *transport, char *name, tu_server_ready *info) {
  uint16_t port = tu_free_port();
  tu_server_cfg cfg = {.port = port, .mem_len = MEM_LEN, .shared = shm, .seed = 0, .transport = transport};
  tu_addr(name, TU_ADDR_LEN, port);
  if (tu_server_start(c, &cfg, info, READY_MS) != 0) {
    tu_fail(__FILE__, __LINE__, "target child did not start: %s (%s)", HixlStatusName(info->status),
            info->error);
    return false;
  }
  return true;
}

/* Two processes, both with the key: shm (proven and bound, as the log says), WRITE
 * and READ of 1 B to 16 MiB checked byte for byte, under Transport shm and auto. */
static void test_keyed_shm(void) {
  static const size_t lens[] = {1, 4 * KiB + 3, MiB, MEM_LEN - 64, MEM_LEN};
  static const char *const transports[] = {"shm", NULL};
  tu_shm shm;
  tu_child c;
  tu_server_ready info;
  char name[TU_ADDR_LEN], line[512];
  CU_ASSERT_FATAL(tu_shm_create(&shm, MEM_LEN) == 0);
  unsigned char *loc = tu_alloc_mem(2 * MEM_LEN, false);
  CU_ASSERT_PTR_NOT_NULL_FATAL(loc);
  if (!target_up(&c, &shm, "auto", name, &info)) goto out;
  for (int t = 0; t < 2; t++) {
    HixlEngine *e = keyed_engine(transports[t]);
    CU_ASSERT_FATAL(e && tu_register(e, loc, 2 * MEM_LEN));
    tu_log_watch("bound to the link");
    TU_ASSERT_OK_FATAL(HixlEngineConnect(e, name, 5000));
    struct hixl_link_info li = link_of(e, name);
    CU_ASSERT_STRING_EQUAL(li.transport, "shm");
    CU_ASSERT_EQUAL(li.peer_pid, (uint32_t)c.pid);
    if (!tu_log_seen(line, sizeof(line)))
      tu_fail(__FILE__, __LINE__, "Connect did not log the socket bound to the link");
    else
      printf("  [%s]\n", line);
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
      size_t len = lens[k], roff = (MEM_LEN - len) / 2, seed = 10 * (uint64_t)t + k + 1;
      tu_fill(loc, len, seed);
      memset(shm.mem, 0xEE, MEM_LEN);
      TU_ASSERT_OK(xfer(e, name, HIXL_WRITE, loc, info.addr + roff, len, XFER_TIMEOUT));
      TU_ASSERT_PATTERN(shm.mem + roff, len, seed, "the child's memory after a keyed shm WRITE");
      CU_ASSERT_EQUAL(tu_check_byte(shm.mem, roff, 0xEE), -1);
      CU_ASSERT_EQUAL(tu_check_byte(shm.mem + roff + len, MEM_LEN - roff - len, 0xEE), -1);
      memset(loc + MEM_LEN, 0, len);
      TU_ASSERT_OK(xfer(e, name, HIXL_READ, loc + MEM_LEN, info.addr + roff, len, XFER_TIMEOUT));
      TU_ASSERT_PATTERN(loc + MEM_LEN, len, seed, "read back over keyed shm");
    }
    HixlEngineDestroy(e);
  }
  tu_child_stop(&c, 10000);
out:
  tu_free_mem(loc, 2 * MEM_LEN);
  tu_shm_destroy(&shm);
}

/* Two engines of one process, both with the key: the link to a pid that is this
 * process's own is taken, since the socket proves it was made for this link (without a
 * key it is refused: test_shm); WRITE and READ checked byte for byte. */
static void test_keyed_one_process(void) {
  char name[TU_ADDR_LEN], line[512];
  HixlOption o = {"AuthKeyFile", key};
  HixlEngine *t = tu_engine_start_opts(tu_addr(name, sizeof(name), tu_free_port()), "shm", &o, 1);
  HixlEngine *e = keyed_engine("shm");
  unsigned char *tmem = tu_alloc_mem(MiB, false), *loc = tu_alloc_mem(MiB, false);
  CU_ASSERT_FATAL(t && e && tmem && loc && tu_register(t, tmem, MiB) && tu_register(e, loc, MiB));
  tu_log_watch("bound to the link");
  TU_ASSERT_OK_FATAL(HixlEngineConnect(e, name, 5000));
  struct hixl_link_info li = link_of(e, name);
  CU_ASSERT_STRING_EQUAL(li.transport, "shm");
  CU_ASSERT_EQUAL(li.peer_pid, (uint32_t)getpid());
  if (!tu_log_seen(line, sizeof(line))) tu_fail(__FILE__, __LINE__, "Connect did not log the socket bound");
  tu_fill(loc, MiB, 61);
  memset(tmem, 0, MiB);
  TU_ASSERT_OK(xfer(e, name, HIXL_WRITE, loc, (uintptr_t)tmem, MiB, XFER_TIMEOUT));
  TU_ASSERT_PATTERN(tmem, MiB, 61, "a one-process keyed shm WRITE");
  tu_fill(tmem, MiB, 62);
  TU_ASSERT_OK(xfer(e, name, HIXL_READ, loc, (uintptr_t)tmem, MiB, XFER_TIMEOUT));
  TU_ASSERT_PATTERN(loc, MiB, 62, "a one-process keyed shm READ");
  HixlEngineDestroy(e);
  HixlEngineDestroy(t);
  tu_free_mem(tmem, MiB);
  tu_free_mem(loc, MiB);
}

static int64_t child_cmd(tu_child *c, uint32_t op, uint64_t seed, uint64_t off, uint64_t len) {
  tu_cmd cmd = {.op = op, .seed = seed, .off = off, .len = len};
  int64_t reply = -100;
  if (tu_server_send(c, &cmd, &reply, 30000) != 0)
    tu_fail(__FILE__, __LINE__, "child command %u: no reply", op);
  return reply;
}

/* The target's AllocMem memory, with keys: mapped here over the bound socket, moved by
 * memcpy (checked by the child), unmapped here when the child frees it. */
static void test_keyed_mapped(void) {
  tu_child c;
  tu_server_ready info;
  char name[TU_ADDR_LEN];
  uint16_t port = tu_free_port();
  tu_server_cfg cfg = {.port = port, .mem_len = MEM_LEN, .transport = "shm", .alloc = true};
  HixlEngine *e = keyed_engine("shm");
  unsigned char *loc = tu_alloc_mem(2 * MEM_LEN, false);
  CU_ASSERT_FATAL(e && loc && tu_register(e, loc, 2 * MEM_LEN));
  tu_addr(name, sizeof(name), port);
  if (tu_server_start(&c, &cfg, &info, READY_MS) != 0) {
    tu_fail(__FILE__, __LINE__, "target child did not start: %s", info.error);
    goto out;
  }
  TU_ASSERT_OK_FATAL(HixlEngineConnect(e, name, 5000));
  struct hixl_link_info li = link_of(e, name);
  CU_ASSERT_STRING_EQUAL(li.transport, "shm");
  CU_ASSERT_EQUAL(li.mapped, 1);
  CU_ASSERT_EQUAL(tu_memfd_maps(0), 1);
  tu_fill(loc, MEM_LEN, 21);
  TU_ASSERT_OK(xfer(e, name, HIXL_WRITE, loc, info.addr, MEM_LEN, XFER_TIMEOUT));
  CU_ASSERT_EQUAL(child_cmd(&c, TU_CMD_CHECK, 21, 0, MEM_LEN), -1);
  CU_ASSERT_EQUAL(child_cmd(&c, TU_CMD_FILL, 22, 0, MEM_LEN), 0);
  TU_ASSERT_OK(xfer(e, name, HIXL_READ, loc + MEM_LEN, info.addr, MEM_LEN, XFER_TIMEOUT));
  TU_ASSERT_PATTERN(loc + MEM_LEN, MEM_LEN, 22, "the child's AllocMem memory read by memcpy");
  CU_ASSERT(link_of(e, name).map_ops >= 2);
  CU_ASSERT_EQUAL(child_cmd(&c, TU_CMD_FREE, 0, 0, 0), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(tu_memfd_maps(0), 0); /* unmapped here before the child's FreeMem returned */
  CU_ASSERT_EQUAL(link_of(e, name).mapped, 0);
  tu_child_stop(&c, 10000);
out:
  HixlEngineDestroy(e);
  tu_free_mem(loc, 2 * MEM_LEN);
}

/* ---------------------------------------------------------------- a relay */

/* A middleman with the key: the target of this process's engine (its own handshake,
 * its own session secret), the initiator of a link to the real target B, named as
 * this process in SHM_HELLO (so B takes this process's connection on its socket). It
 * lists B's memory as its own and answers this engine's SHM_HELLO with B's
 * SHM_HELLO_ACK, byte for byte; SHM_MAP* frames go across both ways, the rest of
 * this engine's frames are dropped. */
struct relay {
  int lfd;
  char name[TU_ADDR_LEN];
  uint16_t b_port; /* B */
  uint64_t b_addr, b_len;
  int done, done_w; /* the test closes done_w to end it */
  pthread_t th;
  bool relayed; /* B's SHM_HELLO_ACK went to this engine */
};

static void *relay_main(void *arg) {
  struct relay *r = arg;
  static uint8_t buf[8192];
  struct auth_ring ring;
  char text[128], why[128];
  struct wire_wr w;
  struct wire_hdr h;
  struct wire_msg m;
  struct auth_frames fe = {0}, fb = {0}; /* its frame tags with this engine, and with B */
  int bfd = -1;
  snprintf(text, sizeof(text), "%s\n", TU_KEY_HEX);
  int fd = accept(r->lfd, NULL, NULL);
  if (fd < 0 || !auth_parse(text, &ring, why, sizeof(why))) goto out;
  const struct auth_key *k = &ring.key[0];
  /* This engine's HELLO: prove the key, as a target does. */
  if (!raw_recv_frame(fd, &h, buf, buf + WIRE_HDR_LEN, sizeof(buf) - WIRE_HDR_LEN) || h.type != WIRE_HELLO ||
      wire_decode(&h, buf + WIRE_HDR_LEN, &m) != WIRE_OK || !m.u.hello.nonce)
    goto out;
  uint8_t nonce_i[AUTH_NONCE_LEN], nonce_t[AUTH_NONCE_LEN], mac[AUTH_MAC_LEN], name_i[WIRE_MAX_NAME];
  uint16_t name_i_len = m.u.hello.name_len;
  uint32_t caps_i = m.u.hello.caps;
  memcpy(nonce_i, m.u.hello.nonce, sizeof(nonce_i));
  memcpy(name_i, m.u.hello.name, name_i_len);
  auth_random(nonce_t, sizeof(nonce_t));
  uint8_t dialled[WIRE_MAX_NAME];
  uint16_t dialled_len = m.u.hello.dialled_len;
  memcpy(dialled, m.u.hello.dialled, dialled_len);
  auth_transcript_mac(k, AUTH_LABEL_TARGET, nonce_i, nonce_t, name_i, name_i_len, "relay", 5, caps_i, dialled,
                      dialled_len, mac);
  wire_begin(&w, buf, sizeof(buf), WIRE_AUTH_CHALLENGE);
  wire_put_bytes(&w, nonce_t, sizeof(nonce_t));
  wire_put_bytes(&w, k->id, AUTH_ID_LEN);
  wire_put_bytes(&w, mac, sizeof(mac));
  wire_put_u16(&w, 5);
  wire_put_bytes(&w, "relay", 5);
  if (!raw_send_all(fd, buf, wire_end(&w, 0)) ||
      !raw_recv_frame(fd, &h, buf, buf + WIRE_HDR_LEN, sizeof(buf) - WIRE_HDR_LEN) ||
      h.type != WIRE_AUTH_PROOF)
    goto out;
  /* It holds the key: it derives the session and proves its frames to this engine. */
  uint8_t session[AUTH_MAC_LEN];
  auth_transcript_mac(k, AUTH_LABEL_SESSION, nonce_i, nonce_t, name_i, name_i_len, "relay", 5, caps_i,
                      dialled, dialled_len, session);
  if (!auth_frames_init(&fe, session, false)) goto out;
  wire_begin(&w, buf, sizeof(buf), WIRE_HELLO_ACK);
  wire_put_u32(&w, WIRE_HELLO_OK);
  wire_put_u32(&w, WIRE_CAP_TCP_DATA | WIRE_CAP_SHM);
  wire_put_u16(&w, 5);
  wire_put_bytes(&w, "relay", 5);
  wire_put_u32(&w, 1);
  wire_put_mem_entry(&w, r->b_addr, r->b_len, 0, "");
  if (!raw_send_proven(fd, &fe, buf, wire_end(&w, 0), NULL, 0)) goto out;
  /* Its SHM_HELLO: ask B the same, for this engine's pid. */
  if (!raw_recv_proven(fd, &fe, &h, buf, buf + WIRE_HDR_LEN, sizeof(buf) - WIRE_HDR_LEN) ||
      h.type != WIRE_SHM_HELLO || wire_decode(&h, buf + WIRE_HDR_LEN, &m) != WIRE_OK)
    goto out;
  uint8_t boot[16];
  uint32_t pid = m.u.shm.pid, uid = m.u.shm.uid;
  memcpy(boot, m.u.shm.boot_id, sizeof(boot));
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(r->b_port)};
  struct raw_auth a = {.key_hex = TU_KEY_HEX, .name = "relay", .frames = &fb};
  inet_pton(AF_INET, tu_ip(), &sa.sin_addr);
  bfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (bfd < 0 || connect(bfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
      !raw_auth_hello(bfd, &a, raw_send_all, raw_recv_all) || a.status != WIRE_HELLO_OK)
    goto out;
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_HELLO);
  wire_put_shm_id(&w, WIRE_SHM_LAYOUT, boot, pid, uid);
  wire_put_u32(&w, WIRE_SHM_F_MAP);
  if (!raw_send_proven(bfd, &fb, buf, wire_end(&w, 0), NULL, 0)) goto out;
  do {
    if (!raw_recv_proven(bfd, &fb, &h, buf, buf + WIRE_HDR_LEN, sizeof(buf) - WIRE_HDR_LEN)) goto out;
  } while (h.type != WIRE_SHM_HELLO_ACK);
  /* B's answer, byte for byte, under this relay's own proof */
  if (!raw_send_proven(fd, &fe, buf, WIRE_HDR_LEN + h.body_len, NULL, 0)) goto out;
  r->relayed = true;
  for (;;) {
    struct pollfd pf[3] = {
        {.fd = r->done, .events = POLLIN}, {.fd = fd, .events = POLLIN}, {.fd = bfd, .events = POLLIN}};
    if (poll(pf, 3, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (pf[0].revents) break;
    if (pf[1].revents) {
      if (!raw_recv_proven(fd, &fe, &h, buf, buf + WIRE_HDR_LEN, sizeof(buf) - WIRE_HDR_LEN)) break;
      if (h.type == WIRE_SHM_MAP_HELLO && !raw_send_proven(bfd, &fb, buf, WIRE_HDR_LEN + h.body_len, NULL, 0))
        break;
    }
    if (pf[2].revents) {
      if (!raw_recv_proven(bfd, &fb, &h, buf, buf + WIRE_HDR_LEN, sizeof(buf) - WIRE_HDR_LEN)) break;
      bool map = h.type == WIRE_SHM_MAP || h.type == WIRE_SHM_MAP_ACK || h.type == WIRE_SHM_UNMAP;
      if (map && !raw_send_proven(fd, &fe, buf, WIRE_HDR_LEN + h.body_len, NULL, 0)) break;
    }
  }
out:
  auth_wipe(&ring, sizeof(ring));
  auth_frames_free(&fe);
  auth_frames_free(&fb);
  if (bfd >= 0) close(bfd);
  if (fd >= 0) close(fd);
  return NULL;
}

static void relay_start(struct relay *r, uint16_t b_port, uint64_t b_addr, uint64_t b_len) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t sl = sizeof(sa);
  int pfd[2];
  memset(r, 0, sizeof(*r));
  r->b_port = b_port;
  r->b_addr = b_addr;
  r->b_len = b_len;
  r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  inet_pton(AF_INET, tu_ip(), &sa.sin_addr);
  CU_ASSERT_FATAL(r->lfd >= 0 && bind(r->lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
                  listen(r->lfd, 4) == 0 && getsockname(r->lfd, (struct sockaddr *)&sa, &sl) == 0);
  tu_addr(r->name, sizeof(r->name), ntohs(sa.sin_port));
  CU_ASSERT_FATAL(pipe(pfd) == 0);
  r->done = pfd[0];
  r->done_w = pfd[1];
  CU_ASSERT_FATAL(pthread_create(&r->th, NULL, relay_main, r) == 0);
}

static void relay_stop(struct relay *r) {
  close(r->done_w);
  pthread_join(r->th, NULL);
  close(r->done);
  close(r->lfd);
}

/* B's SHM_HELLO_ACK relayed to this engine: the pid, its socket (SO_PEERCRED) and the
 * probe all check out, but B answers the binding under its link with the relay, not
 * under this link: auto links over tcp and B's memory stays as it was, byte for byte;
 * Transport shm fails Connect with the reason. */
static void test_keyed_relay_refused(void) {
  static const char *const transports[] = {NULL, "shm"};
  tu_shm shm;
  tu_child c;
  tu_server_ready info;
  char name[TU_ADDR_LEN];
  CU_ASSERT_FATAL(tu_shm_create(&shm, MEM_LEN) == 0);
  unsigned char *loc = tu_alloc_mem(MEM_LEN, false);
  CU_ASSERT_PTR_NOT_NULL_FATAL(loc);
  tu_fill(shm.mem, MEM_LEN, 31);
  if (!target_up(&c, &shm, "auto", name, &info)) goto out;
  uint16_t b_port = (uint16_t)atoi(strchr(name, ':') + 1);
  for (int t = 0; t < 2; t++) {
    struct relay r;
    HixlEngine *e = keyed_engine(transports[t]);
    CU_ASSERT_FATAL(e && tu_register(e, loc, MEM_LEN));
    tu_fill(loc, MEM_LEN, 32);
    relay_start(&r, b_port, info.addr, MEM_LEN);
    HixlStatus st = HixlEngineConnect(e, r.name, 5000);
    if (transports[t]) {
      TU_ASSERT_STATUS(st, HIXL_FAILED);
      TU_ASSERT_ERRMSG_HAS("did not prove it holds this link's session");
      printf("  [shm: %s]\n", HixlGetLastErrorMessage());
    } else {
      TU_ASSERT_OK(st);
      struct hixl_link_info li = link_of(e, r.name);
      CU_ASSERT_STRING_EQUAL(li.transport, "tcp");
      CU_ASSERT_EQUAL(li.peer_pid, 0);
      st = xfer(e, r.name, HIXL_WRITE, loc, info.addr, MEM_LEN, 300);
      CU_ASSERT_NOT_EQUAL(st, HIXL_SUCCESS); /* over tcp to the relay, which drops it */
      printf("  [auto: linked over %s; the WRITE aimed at the other engine: %s]\n", li.transport,
             HixlStatusName(st));
    }
    HixlEngineDestroy(e);
    relay_stop(&r);
    CU_ASSERT(r.relayed); /* read after the join */
    TU_ASSERT_PATTERN(shm.mem, MEM_LEN, 31, "the relayed engine's memory");
  }
  tu_child_stop(&c, 10000);
out:
  tu_free_mem(loc, MEM_LEN);
  tu_shm_destroy(&shm);
}

int main(int argc, char **argv) {
  int rc = tu_child_main(argc, argv);
  if (rc >= 0) return rc; /* a server child */
  if (!(key = tu_key_file()) || setenv("HIXL_AUTH_KEY_FILE", key, 1) != 0) {
    fprintf(stderr, "test_shm_auth: no key file\n");
    return 1;
  }
  tu_log_capture(HIXL_LOG_INFO, false); /* the lines the tests look for */
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  CU_pSuite s = CU_add_suite("shm with keys", NULL, NULL);
  CU_add_test(s, "two processes: shm, bound; WRITE and READ byte for byte", test_keyed_shm);
  CU_add_test(s, "AllocMem memory mapped over the bound socket", test_keyed_mapped);
  CU_add_test(s, "two engines of one process: shm, bound", test_keyed_one_process);
  CU_add_test(s, "a middleman relaying another engine's SHM_HELLO_ACK: refused", test_keyed_relay_refused);
  if (CU_get_error() != CUE_SUCCESS) {
    fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
    CU_cleanup_registry();
    return 1;
  }
  return tu_run_registry();
}
