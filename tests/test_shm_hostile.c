/* test_shm_hostile: a same-host target that lies to the engine linked to it, played
 * by a fake that speaks the wire on raw sockets (the engine here is the initiator):
 *  - it dies leaving its life word "alive" (it writes that word itself) while a child
 *    of it keeps the link, and another process gets its pid (a PID namespace of this
 *    test's own, where clone3 picks the pid): a WRITE to the memory it listed fails,
 *    and the other process's bytes stay as they were (skipped where user namespaces
 *    are off);
 *  - it hands over more memfds than a peer may have mapped (ESHM_PEER_MAPS), or more
 *    bytes (ESHM_PEER_MAP_BYTES, sparse 1 TiB memfds): the engine maps up to the bound
 *    and copies the rest with process_vm_*; the link stays up and data moves;
 *  - it hands regions over and takes each back at once, past ESHM_PEER_MAPS: the
 *    tombstones they leave are bounded too (a region after them is not mapped);
 *  - its first SHM_MAP comes with a pipe, a file on disk, an unsealed or short memfd,
 *    no descriptor, two or eight: Connect fails with a protocol error naming it, and
 *    no descriptor it sent stays open here;
 *  - it sends SHM_UNMAPs without end and reads none of the answers: the link is cut
 *    once ESHM_UNMAP_UNSENT answers wait unsent, rather than each queued here;
 *  - it asks its mapped region back and resets the link: the answer's failed send cuts
 *    the link, which frees nothing still in use (ASan).
 * And an initiator that lies to the engine (the target here), a raw one in a child:
 * its SHM_MAP_HELLO comes twice, with nobody connected to the link's unix socket (or a
 * stranger instead), on a keyed link whose socket it never bound, from a connection of
 * another uid, when its SHM_HELLO did not ask to map, after it closed its end (the page
 * cannot go), with no SHM_HELLO at all; and to a target that could not make its page
 * (memfd_create refused by a seccomp filter, in a child). Each is refused in SHM_MAP_ACK
 * with its reason, nothing is handed over for it, the socket is closed for good (but
 * after a second SHM_MAP_HELLO, where the first's grants live on), and the TCP link
 * stays up: a WRITE on it after lands byte for byte. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "engine/engine_ext.h"
#include "raw_auth.h"
#include "test_util.h"
#include "transport/shm/shm_int.h"
#include "transport/shm/uds.h"
#include "util/be.h"
#include "util/cma.h"
#include "wire/wire.h"

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif
#ifndef UNDER_TSAN
#define UNDER_TSAN 0
#endif

#define KiB        ((size_t)1 << 10)
#define TiB        ((uint64_t)1 << 40)
#define REG_LEN    (64 * KiB)
#define REG_SEED   4301
#define SRC_SEED   4302
#define READY_MS   10000
#define CONNECT_MS 30000
#define FAKE_LIFE  0x1234u             /* the life word the fake writes: a thread id, no FUTEX_OWNER_DIED */
#define MAP_BASE   ((uint64_t)1 << 44) /* where the fake says its memfds lie (nothing of its own) */
#define FINAL_MAP  (MAP_BASE + ((uint64_t)1 << 30)) /* churn: the region it hands over last */
#define LAST_UNMAP (MAP_BASE + ((uint64_t)2 << 30)) /* ... and the range it asks back last */
#define USER_A     65501 /* the user a raw initiator becomes (test_map_hello_other_uid) */

/* The probe bytes the fake shows at their own address (SHM_HELLO_ACK). */
static uint8_t probe[CMA_NONCE_LEN] = "hixl-hostile-pr";

struct fake {
  uint16_t port;          /* its TCP port */
  int lfd;                /* ... its listener there */
  char name[TU_ADDR_LEN]; /* ... as an engine name */
  uint64_t reg;           /* the one registration its HELLO_ACK lists: [reg, + REG_LEN) */
  uint32_t maps;          /* memfds it hands over after SHM_MAP_HELLO ... */
  uint64_t map_len;       /* ... of this many bytes each (sparse) */
  bool die;               /* after SHM_MAP_ACK: a child keeps its sockets, it exits */
  int bad;                /* what goes with the first SHM_MAP instead of its memfd (enum bad) */
  uint32_t churn;         /* after SHM_MAP_ACK: regions handed over and taken back at once */
  int ready;              /* ... then 'd' here, once the engine answered all of it */
  int done;               /* readable (EOF) ends it; -1: only the link's end does */
  uint32_t flood;         /* after SHM_MAP_ACK: SHM_UNMAPs, their answers unread (fake_flood) */
  bool flood_mapped;      /* ... each of the region it handed over first, not of other ranges */
  bool reset;             /* after SHM_MAP_ACK: an SHM_UNMAP of that region, then a reset */
  int ack;                /* what its SHM_HELLO_ACK says (enum ack) */
};

/* What a fake's SHM_HELLO_ACK says instead of the truth (its pid, its socket, OK). */
enum ack {
  ACK_TRUE,      /* the truth */
  ACK_SHORT,     /* its status alone: shorter than any SHM_HELLO_ACK */
  ACK_LAYOUT0,   /* layout 0: no layout */
  ACK_REFUSED,   /* WIRE_HELLO_REFUSED */
  ACK_BOOT,      /* another boot id (one byte changed) */
  ACK_NO_SOCK,   /* no unix socket named */
  ACK_SELF,      /* the initiator's own pid */
  ACK_OTHER_PID, /* pid 1, whose socket it is not */
};

/* What a fake sends with its first SHM_MAP in place of a sealed memfd of the region. */
enum bad {
  BAD_NONE,     /* nothing bad: the memfd */
  BAD_PIPE,     /* a pipe's read end */
  BAD_FILE,     /* a regular file on disk */
  BAD_UNSEALED, /* a memfd that can shrink */
  BAD_SHORT,    /* a sealed memfd of half the region */
  BAD_NO_FD,    /* the message alone */
  BAD_TWO,      /* the memfd and a second one */
  BAD_MANY,     /* eight memfds: more than the receiver has room for (MSG_CTRUNC) */
  BAD_DESC,     /* the memfd, its message naming another address than the frame */
  BAD_OVERLAP,  /* the memfd; a second SHM_MAP of a region overlapping the first's */
  BAD_PAGE,     /* its page (before any SHM_MAP) a memfd not sealed against shrinking */
  BAD_REFUSE,   /* SHM_MAP_ACK refused (no page, no memfd), then an SHM_MAP on the live link */
};

/* One message of len bytes with descriptors fds[0..n) on the unix socket (n <= 8). */
static bool send_fds(int sock, const void *data, size_t len, const int *fds, size_t n) {
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(8 * sizeof(int))];
  } u;
  struct iovec iov = {(void *)data, len};
  struct msghdr mh = {.msg_iov = &iov,
                      .msg_iovlen = 1,
                      .msg_control = n ? u.buf : NULL,
                      .msg_controllen = n ? CMSG_SPACE(n * sizeof(int)) : 0};
  memset(&u, 0, sizeof(u));
  if (n > 0) {
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(n * sizeof(int));
    memcpy(CMSG_DATA(c), fds, n * sizeof(int));
  }
  return sendmsg(sock, &mh, MSG_NOSIGNAL) == (ssize_t)len;
}

static bool send_fd(int sock, const void *data, size_t len, int fd) {
  return send_fds(sock, data, len, &fd, 1);
}

/* A memfd of len bytes sealed with seals, its word at ESHM_LIFE_OFF set to life when
 * life is not 0; -1 on error. */
static int memfd_sealed(uint64_t len, unsigned seals, uint32_t life) {
  int fd = memfd_create("hixl-test-fake", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd >= 0 && (ftruncate(fd, (off_t)len) != 0 ||
                  (life && pwrite(fd, &life, sizeof(life), ESHM_LIFE_OFF) != (ssize_t)sizeof(life)) ||
                  fcntl(fd, F_ADD_SEALS, seals) != 0)) {
    close(fd);
    fd = -1;
  }
  return fd;
}

/* The answer to SHM_MAP_HELLO: its page (life word FAKE_LIFE, sealed as a target
 * seals it), f->maps memfds, SHM_MAP_ACK OK. */
static bool fake_map(const struct fake *f, int fd, int uc) {
  uint8_t buf[256];
  struct wire_wr w;
  if (f->bad == BAD_REFUSE) { /* refused; then a region handed over all the same, on TCP alone */
    wire_begin(&w, buf, sizeof(buf), WIRE_SHM_MAP_ACK);
    wire_put_u32(&w, WIRE_HELLO_REFUSED);
    wire_put_bytes(&w, "a test refuses", 14);
    bool ok = raw_send_all(fd, buf, wire_end(&w, 0));
    wire_begin(&w, buf, sizeof(buf), WIRE_SHM_MAP);
    wire_put_u64(&w, MAP_BASE);
    wire_put_u64(&w, f->map_len);
    wire_put_u64(&w, f->map_len);
    return ok && raw_send_all(fd, buf, wire_end(&w, 0));
  }
  int g = memfd_sealed(ESHM_GEN_LEN,
                       f->bad == BAD_PAGE ? F_SEAL_GROW
                                          : F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | F_SEAL_FUTURE_WRITE,
                       FAKE_LIFE);
  bool ok = g >= 0 && send_fd(uc, ESHM_GEN_MSG, 8, g);
  if (g >= 0) close(g);
  for (uint32_t i = 0; ok && i < f->maps; i++) {
    int bad = i == 0 ? f->bad : BAD_NONE, v[8], nv = 1, p[2] = {-1, -1};
    v[0] = memfd_sealed(bad == BAD_SHORT ? f->map_len / 2 : f->map_len,
                        bad == BAD_UNSEALED ? F_SEAL_GROW : F_SEAL_SHRINK | F_SEAL_GROW, 0);
    if (bad == BAD_PIPE && pipe(p) == 0) close(v[0]), v[0] = p[0];
    if (bad == BAD_FILE) close(v[0]), v[0] = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (bad == BAD_TWO || bad == BAD_MANY)
      for (; nv < (bad == BAD_TWO ? 2 : 8); nv++) v[nv] = memfd_sealed(f->map_len, F_SEAL_SHRINK, 0);
    if (bad == BAD_NO_FD) nv = 0;
    uint8_t said[WIRE_SHM_MAP_LEN]; /* what the message on the unix socket says */
    wire_begin(&w, buf, sizeof(buf), WIRE_SHM_MAP);
    wire_put_u64(&w, MAP_BASE + i * f->map_len - (f->bad == BAD_OVERLAP && i ? f->map_len / 2 : 0));
    wire_put_u64(&w, f->map_len);
    wire_put_u64(&w, f->map_len);
    size_t n = wire_end(&w, 0);
    memcpy(said, buf + WIRE_HDR_LEN, sizeof(said));
    said[6] ^= bad == BAD_DESC ? 0x10 : 0; /* 1 MiB on */
    ok = v[0] >= 0 && send_fds(uc, said, WIRE_SHM_MAP_LEN, v, (size_t)nv) && raw_send_all(fd, buf, n);
    for (int k = 0; k < (nv > 1 ? nv : 1); k++)
      if (v[k] >= 0) close(v[k]);
    if (p[1] >= 0) close(p[1]);
  }
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_MAP_ACK);
  wire_put_u32(&w, WIRE_HELLO_OK);
  return ok && raw_send_all(fd, buf, wire_end(&w, 0));
}

/* Read the engine's frames on fd into rb (*rn bytes held) without blocking, or
 * waiting up to 10 s when wait; true once an SHM_UNMAP_ACK of addr came. */
static bool ack_seen(int fd, uint8_t *rb, size_t cap, size_t *rn, uint64_t addr, bool wait) {
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  bool seen = false;
  while (!seen && poll(&pf, 1, wait ? 10000 : 0) == 1) {
    ssize_t k = recv(fd, rb + *rn, cap - *rn, MSG_DONTWAIT);
    if (k <= 0) break;
    *rn += (size_t)k;
    struct wire_hdr h;
    while (*rn >= WIRE_HDR_LEN && wire_parse_hdr(rb, &h) == WIRE_OK &&
           *rn >= WIRE_HDR_LEN + h.body_len + h.payload_len) {
      size_t n = WIRE_HDR_LEN + h.body_len + h.payload_len;
      seen |= h.type == WIRE_SHM_UNMAP_ACK && h.body_len >= 8 && be_get64(rb + WIRE_HDR_LEN) == addr;
      memmove(rb, rb + n, *rn - n);
      *rn -= n;
    }
  }
  return seen;
}

/* After SHM_MAP_ACK: f->churn regions handed over (a memfd each) and taken back
 * (SHM_UNMAP), one more handed over (FINAL_MAP), then an SHM_UNMAP of a range never
 * handed over; 'd' on f->ready once the engine answered that one (it read all before). */
static bool fake_churn(const struct fake *f, int fd, int uc) {
  static uint8_t rb[1 << 16];
  uint8_t buf[256];
  struct wire_wr w;
  size_t rn = 0;
  for (uint32_t i = 0; i <= f->churn + 1; i++) {
    uint64_t a = i < f->churn ? MAP_BASE - (uint64_t)(i + 1) * 8192 : i == f->churn ? FINAL_MAP : LAST_UNMAP;
    if (i <= f->churn) {
      int m = memfd_sealed(4096, F_SEAL_SHRINK, 0);
      wire_begin(&w, buf, sizeof(buf), WIRE_SHM_MAP);
      wire_put_u64(&w, a);
      wire_put_u64(&w, 4096);
      wire_put_u64(&w, 4096);
      size_t n = wire_end(&w, 0);
      bool ok = m >= 0 && send_fd(uc, buf + WIRE_HDR_LEN, WIRE_SHM_MAP_LEN, m) && raw_send_all(fd, buf, n);
      if (m >= 0) close(m);
      if (!ok) return false;
    }
    if (i == f->churn) continue; /* FINAL_MAP stays */
    wire_begin(&w, buf, sizeof(buf), WIRE_SHM_UNMAP);
    wire_put_u64(&w, a);
    wire_put_u64(&w, 4096);
    if (!raw_send_all(fd, buf, wire_end(&w, 0))) return false;
    (void)ack_seen(fd, rb, sizeof(rb), &rn, LAST_UNMAP, false); /* the answers drained as they come */
  }
  while (!ack_seen(fd, rb, sizeof(rb), &rn, LAST_UNMAP, true))
    if (rn == sizeof(rb)) return false;
  return tu_write_all(f->ready, "d", 1) == 0;
}

/* After SHM_MAP_ACK: f->flood SHM_UNMAPs of ranges never handed over (flood_mapped:
 * each of the region handed over first), as fast as the engine takes them, its answers
 * never read (its socket's buffers 4 KiB, set on the listener); on f->ready 'a' when
 * the engine took them all, 'c' when it cut the link first, 's' when it stopped
 * reading for 5 s. */
static void fake_flood(const struct fake *f, int fd) {
  static uint8_t out[1024 * (WIRE_HDR_LEN + WIRE_SHM_UNMAP_LEN)];
  struct wire_wr w;
  char r = 'a';
  for (uint32_t i = 0; i < f->flood && r == 'a'; i += 1024) {
    size_t n = 0;
    for (uint32_t k = 0; k < 1024; k++) {
      wire_begin(&w, out + n, sizeof(out) - n, WIRE_SHM_UNMAP);
      wire_put_u64(&w, f->flood_mapped ? MAP_BASE : LAST_UNMAP + (uint64_t)(i + k) * 4096);
      wire_put_u64(&w, f->flood_mapped ? f->map_len : 4096);
      n += wire_end(&w, 0);
    }
    for (size_t off = 0; off < n && r == 'a';) {
      struct pollfd pf = {.fd = fd, .events = POLLOUT};
      if (poll(&pf, 1, 5000) != 1) {
        r = 's';
        break;
      }
      ssize_t k = send(fd, out + off, n - off, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k < 0 && errno != EAGAIN && errno != EINTR) r = 'c';
      if (k > 0) off += (size_t)k;
    }
  }
  (void)tu_write_all(f->ready, &r, 1);
}

/* After SHM_MAP_ACK, once the test says Connect returned (a byte on f->done): an
 * SHM_UNMAP of the region handed over first, then the link reset (SO_LINGER 0) before
 * the engine reads it, so that its answer cannot be sent; 'd' on f->ready. */
static void fake_reset(const struct fake *f, int fd) {
  uint8_t buf[64];
  struct wire_wr w;
  struct linger lg = {.l_onoff = 1, .l_linger = 0};
  char go;
  while (read(f->done, &go, 1) < 0 && errno == EINTR) {
  }
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_UNMAP);
  wire_put_u64(&w, MAP_BASE);
  wire_put_u64(&w, f->map_len);
  if (raw_send_all(fd, buf, wire_end(&w, 0))) setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  close(fd);
  (void)tu_write_all(f->ready, "d", 1);
}

/* The fake target: HELLO_ACK listing f->reg, SHM_HELLO_ACK naming its own pid, its
 * unix socket and the probe; memory to map on SHM_MAP_HELLO (fake_map); then it drops
 * whatever comes until done or the link ends. */
static void fake_serve(const struct fake *f) {
  uint8_t buf[1024], body[1024];
  char sname[64];
  struct wire_wr w;
  struct wire_hdr h;
  struct wire_msg m;
  int ul = -1, uc = -1;
  int fd = accept(f->lfd, NULL, NULL);
  if (fd < 0) return;
  if (!raw_recv_frame(fd, &h, NULL, body, sizeof(body)) || h.type != WIRE_HELLO) goto out;
  wire_begin(&w, buf, sizeof(buf), WIRE_HELLO_ACK);
  wire_put_u32(&w, WIRE_HELLO_OK);
  wire_put_u32(&w, WIRE_CAP_TCP_DATA | WIRE_CAP_SHM);
  wire_put_u16(&w, 4);
  wire_put_bytes(&w, "fake", 4);
  wire_put_u32(&w, 1);
  wire_put_mem_entry(&w, f->reg, REG_LEN, 0, "");
  if (!raw_send_all(fd, buf, wire_end(&w, 0))) goto out;
  if (!raw_recv_frame(fd, &h, NULL, body, sizeof(body)) || h.type != WIRE_SHM_HELLO ||
      wire_decode(&h, body, &m) != WIRE_OK)
    goto out;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int n = snprintf(sname, sizeof(sname), "hixl-test-hostile-%ld", (long)getpid());
  memcpy(sa.sun_path + 1, sname, (size_t)n);
  ul = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (ul < 0 ||
      bind(ul, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) < 0 ||
      listen(ul, 4) < 0)
    goto out;
  uint8_t boot[CMA_BOOT_ID_LEN];
  uint32_t pid = f->ack == ACK_SELF ? m.u.shm.pid : f->ack == ACK_OTHER_PID ? 1u : (uint32_t)getpid();
  memcpy(boot, m.u.shm.boot_id, sizeof(boot));
  boot[0] ^= f->ack == ACK_BOOT ? 1 : 0;
  wire_begin(&w, buf, sizeof(buf), WIRE_SHM_HELLO_ACK);
  wire_put_u32(&w, f->ack == ACK_REFUSED ? WIRE_HELLO_REFUSED : WIRE_HELLO_OK);
  if (f->ack != ACK_SHORT) {
    wire_put_shm_id(&w, f->ack == ACK_LAYOUT0 ? 0 : WIRE_SHM_LAYOUT, boot, pid, (uint32_t)geteuid());
    wire_put_u64(&w, (uintptr_t)probe);
    wire_put_bytes(&w, probe, sizeof(probe));
    wire_put_u16(&w, f->ack == ACK_NO_SOCK ? 0 : (uint16_t)n);
    wire_put_bytes(&w, sname, f->ack == ACK_NO_SOCK ? 0 : (size_t)n);
  }
  if (!raw_send_all(fd, buf, wire_end(&w, 0))) goto out;
  for (;;) {
    struct pollfd pf[2] = {{.fd = fd, .events = POLLIN}, {.fd = f->done, .events = POLLIN}};
    if (poll(pf, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (pf[1].revents) break;
    if (!raw_recv_frame(fd, &h, NULL, body, sizeof(body))) break;
    if (h.type != WIRE_SHM_MAP_HELLO) continue;
    if (uc < 0) uc = accept(ul, NULL, NULL); /* it connected before it sent the frame */
    if (uc < 0 || !fake_map(f, fd, uc)) break;
    if (f->bad == BAD_REFUSE) { /* its side closed (which wakes a parked link); 'c' once the engine's is */
      shutdown(fd, SHUT_WR);
      while (raw_recv_frame(fd, &h, NULL, body, sizeof(body))) {
      }
      (void)tu_write_all(f->ready, "c", 1);
      break;
    }
    if (f->die && fork() != 0) _exit(0); /* the child goes on with the sockets */
    if (f->churn && !fake_churn(f, fd, uc)) break;
    if (f->flood) fake_flood(f, fd);
    if (f->reset) {
      fake_reset(f, fd);
      fd = -1;
      break;
    }
  }
out:
  if (uc >= 0) close(uc);
  if (ul >= 0) close(ul);
  if (fd >= 0) close(fd);
}

/* The fake's TCP listener on tu_ip():f->port; false on error. */
static bool fake_listen(struct fake *f) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(f->port)};
  int one = 1, small = 4096;
  f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  inet_pton(AF_INET, tu_ip(), &sa.sin_addr);
  setsockopt(f->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (f->flood) { /* the accepted socket's too */
    setsockopt(f->lfd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    setsockopt(f->lfd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  }
  return f->lfd >= 0 && bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(f->lfd, 4) == 0;
}

/* tu_child_start body: the fake in a child; the test closes ctl_fd to end it. */
static int fake_child(void *arg, int ready_fd, int ctl_fd) {
  struct fake *f = arg;
  f->done = ctl_fd;
  f->ready = ready_fd;
  if (!fake_listen(f) || tu_write_all(ready_fd, "r", 1) != 0) return 1;
  fake_serve(f);
  close(f->lfd);
  return 0;
}

/* The fake f, listing the registration at reg, in a child c, listening on a free port
 * (f->name) when this returns. */
static void fake_up(struct fake *f, uintptr_t reg, tu_child *c) {
  char b;
  f->reg = reg;
  f->port = tu_free_port();
  tu_addr(f->name, sizeof(f->name), f->port);
  CU_ASSERT_FATAL(tu_child_start(c, fake_child, f) == 0); /* before the test's engine */
  CU_ASSERT_FATAL(tu_child_read(c, &b, 1, READY_MS) == 0);
}

/* ---------------------------------------------------------------- pid reuse */

/* Exit codes of reuse_main (bits, 0: all well). */
#define REUSE_SKIP     77
#define REUSE_SETUP    2 /* something before the WRITE failed: see stderr */
#define REUSE_WROTE_OK 4 /* the WRITE to the dead fake's memory reported SUCCESS */
#define REUSE_TOUCHED  8 /* ... and the process that got its pid had its bytes changed */

static int reuse_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "  [pid reuse: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "]\n");
  va_end(ap);
  return REUSE_SETUP;
}

/* The heir of the fake's pid: it holds the bytes the fake listed (a fork of the same
 * process: same address, same pattern) until the pipe closes, then exits 0 if they
 * are intact. Only async-signal-safe calls: it is cloned from a process with threads. */
static void heir_main(const uint8_t *reg, int rfd) {
  char b;
  while (read(rfd, &b, 1) != 0 && errno == EINTR) {
  }
  _exit(tu_check_pattern(reg, REG_LEN, REG_SEED) < 0 ? 0 : 1);
}

/* pid 1 of a PID namespace of this test: the fake (a child) links, lists its memory
 * and writes its life word "alive", forks a child that keeps the link, and exits;
 * once it is reaped the heir gets its pid (clone3 set_tid), then a WRITE goes to the
 * memory the fake listed. */
static int reuse_main(void) {
  uint8_t *reg = tu_alloc_mem(REG_LEN, false), *src = tu_alloc_mem(REG_LEN, false);
  struct fake f = {.lfd = -1, .done = -1, .die = true};
  struct hixl_link_info li;
  int rp[2], hp[2], ws = 0;
  char b;
  if (!reg || !src || pipe(rp) != 0) return reuse_fail("no memory or pipes");
  tu_fill(reg, REG_LEN, REG_SEED);
  tu_fill(src, REG_LEN, SRC_SEED);
  f.reg = (uintptr_t)reg;
  f.port = tu_free_port();
  tu_addr(f.name, sizeof(f.name), f.port);
  pid_t t = fork(); /* before any engine: no threads yet */
  if (t == 0) {
    close(rp[0]);
    if (!fake_listen(&f) || write(rp[1], "r", 1) != 1) _exit(1);
    fake_serve(&f);
    _exit(0);
  }
  close(rp[1]);
  if (t < 0 || read(rp[0], &b, 1) != 1) return reuse_fail("the fake did not start");
  HixlEngine *e = tu_engine_start_with(tu_ip(), "shm");
  if (!e || !tu_register(e, src, REG_LEN)) return reuse_fail("no engine");
  HixlStatus st = HixlEngineConnect(e, f.name, CONNECT_MS);
  if (st != HIXL_SUCCESS) return reuse_fail("Connect: %s: %s", HixlStatusName(st), HixlGetLastErrorMessage());
  if (hixl_engine_link_info(e, f.name, &li) != HIXL_SUCCESS || strcmp(li.transport, "shm") != 0 ||
      li.peer_pid != (uint32_t)t || li.peer_life != FAKE_LIFE)
    return reuse_fail("the link is not shm to pid %d with life word 0x%x", (int)t, FAKE_LIFE);
  if (waitpid(t, &ws, 0) != t) return reuse_fail("the fake did not exit");
  /* Its pid is free: the heir takes it. */
  if (pipe(hp) != 0) return reuse_fail("no pipe");
  pid_t tid = t;
  struct clone_args ca = {.exit_signal = SIGCHLD, .set_tid = (uintptr_t)&tid, .set_tid_size = 1};
  long v = syscall(SYS_clone3, &ca, sizeof(ca));
  if (v == 0) {
    close(hp[1]);
    heir_main(reg, hp[0]);
  }
  close(hp[0]);
  if (v < 0) {
    fprintf(stderr, "  [pid reuse: clone3 cannot pick pid %d (%s): skipped]\n", (int)t, strerror(errno));
    HixlEngineDestroy(e);
    return REUSE_SKIP;
  }
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)src, .remote_addr = (uintptr_t)reg, .len = REG_LEN};
  st = HixlEngineTransferSync(e, f.name, HIXL_WRITE, &d, 1, 5000);
  fprintf(stderr, "  [pid reuse: the fake's pid %d now the heir's; WRITE to the fake's memory: %s: %s]\n",
          (int)t, HixlStatusName(st), st == HIXL_SUCCESS ? "" : HixlGetLastErrorMessage());
  close(hp[1]);
  int rc = st == HIXL_SUCCESS ? REUSE_WROTE_OK : 0;
  if (waitpid((pid_t)v, &ws, 0) != (pid_t)v || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) rc |= REUSE_TOUCHED;
  HixlEngineDestroy(e);
  return rc; /* as pid 1, its end ends the fake's child too */
}

/* tu_child_start body: a user namespace (this uid mapped to itself) and a PID
 * namespace whose pid 1 runs reuse_main; its exit code. */
static int ns_child(void *arg, int ready_fd, int ctl_fd) {
  char map[64];
  unsigned uid = (unsigned)geteuid(), gid = (unsigned)getegid();
  (void)arg, (void)ready_fd, (void)ctl_fd;
  if (unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0) {
    fprintf(stderr, "  [pid reuse: unshare(CLONE_NEWUSER | CLONE_NEWPID): %s: skipped]\n", strerror(errno));
    return REUSE_SKIP;
  }
  const char *files[] = {"/proc/self/uid_map", "/proc/self/setgroups", "/proc/self/gid_map"};
  for (int i = 0; i < 3; i++) {
    int fd = open(files[i], O_WRONLY | O_CLOEXEC);
    int n = i == 1 ? snprintf(map, sizeof(map), "deny")
                   : snprintf(map, sizeof(map), "%u %u 1", i ? gid : uid, i ? gid : uid);
    bool ok = fd >= 0 && write(fd, map, (size_t)n) == n;
    if (fd >= 0) close(fd);
    if (!ok) return reuse_fail("cannot write %s", files[i]);
  }
  pid_t p = fork();
  if (p == 0) _exit(reuse_main());
  int ws = 0;
  if (p < 0 || waitpid(p, &ws, 0) != p) return reuse_fail("no pid 1");
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : REUSE_SETUP;
}

static void test_pid_reuse(void) {
  tu_child c = {0};
  CU_ASSERT_FATAL(tu_child_start(&c, ns_child, NULL) == 0);
  int ws = tu_child_wait(&c, 60000);
  CU_ASSERT_FATAL(ws >= 0 && WIFEXITED(ws));
  int rc = WEXITSTATUS(ws);
  if (rc == REUSE_SKIP) return;
  CU_ASSERT_EQUAL(rc & REUSE_SETUP, 0);
  if (rc & REUSE_WROTE_OK)
    tu_fail(__FILE__, __LINE__, "a WRITE to a dead target whose life word says alive reported SUCCESS");
  if (rc & REUSE_TOUCHED)
    tu_fail(__FILE__, __LINE__, "the process that took the dead target's pid had its memory written");
}

/* ---------------------------------------------------------------- bounds */

/* The fake hands over maps memfds of map_len bytes: want of them mapped here, the
 * link up, and a WRITE to the memory it listed (process_vm_*) lands. */
static void bound_case(uint32_t maps, uint64_t map_len, uint32_t want) {
  uint8_t *reg = tu_alloc_mem(REG_LEN, true), *src = tu_alloc_mem(REG_LEN, false);
  struct fake f = {.lfd = -1, .maps = maps, .map_len = map_len};
  struct hixl_link_info li;
  tu_child c = {0};
  CU_ASSERT_FATAL(reg && src);
  tu_fill(src, REG_LEN, SRC_SEED);
  fake_up(&f, (uintptr_t)reg, &c);
  HixlEngine *e = tu_engine_start_with(tu_ip(), "shm");
  CU_ASSERT_FATAL(e && tu_register(e, src, REG_LEN));
  TU_ASSERT_OK(HixlEngineConnect(e, f.name, CONNECT_MS));
  TU_ASSERT_OK(hixl_engine_link_info(e, f.name, &li));
  CU_ASSERT_STRING_EQUAL(li.transport, "shm");
#if UNDER_TSAN
  /* ThreadSanitizer holds most of the address space: a TiB mapping fails there, and its
   * region goes by process_vm_* as any whose mapping fails. The bounds still hold. */
  CU_ASSERT(li.mapped <= want);
#else
  CU_ASSERT_EQUAL(li.mapped, want);
#endif
  CU_ASSERT(li.mapped_bytes <= ESHM_PEER_MAP_BYTES);
  printf("  [%u memfds of %llu bytes handed over: %u mapped, %llu bytes]\n", maps,
         (unsigned long long)map_len, li.mapped, (unsigned long long)li.mapped_bytes);
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)src, .remote_addr = (uintptr_t)reg, .len = REG_LEN};
  TU_ASSERT_OK(HixlEngineTransferSync(e, f.name, HIXL_WRITE, &d, 1, 5000));
  TU_ASSERT_PATTERN(reg, REG_LEN, SRC_SEED, "the fake's listed memory, written by process_vm_writev");
  HixlEngineDestroy(e);
  int ws = tu_child_stop(&c, 10000);
  CU_ASSERT(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  tu_free_mem(reg, REG_LEN);
  tu_free_mem(src, REG_LEN);
}

static void test_bound_count(void) { bound_case(ESHM_PEER_MAPS + 4, 4096, ESHM_PEER_MAPS); }

/* The fake hands over ESHM_PEER_MAPS + 100 regions, each taken back at once (a
 * tombstone each, while nothing else bounded them), then one more: that one is not
 * mapped, the table being full; the link stays up and data moves. */
static void test_bound_churn(void) {
  uint8_t *reg = tu_alloc_mem(REG_LEN, true), *src = tu_alloc_mem(REG_LEN, false);
  struct fake f = {.lfd = -1, .churn = ESHM_PEER_MAPS + 100};
  struct hixl_link_info li;
  tu_child c = {0};
  char b;
  CU_ASSERT_FATAL(reg && src);
  tu_fill(src, REG_LEN, SRC_SEED);
  fake_up(&f, (uintptr_t)reg, &c);
  HixlEngine *e = tu_engine_start_with(tu_ip(), "shm");
  CU_ASSERT_FATAL(e && tu_register(e, src, REG_LEN));
  TU_ASSERT_OK(HixlEngineConnect(e, f.name, CONNECT_MS));
  CU_ASSERT_FATAL(tu_child_read(&c, &b, 1, 60000) == 0 && b == 'd');
  TU_ASSERT_OK(hixl_engine_link_info(e, f.name, &li));
  CU_ASSERT_STRING_EQUAL(li.transport, "shm");
  CU_ASSERT_EQUAL(li.mapped, 0);
  printf("  [%u regions handed over and taken back, then one more: %u mapped]\n", f.churn, li.mapped);
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)src, .remote_addr = (uintptr_t)reg, .len = REG_LEN};
  TU_ASSERT_OK(HixlEngineTransferSync(e, f.name, HIXL_WRITE, &d, 1, 5000));
  TU_ASSERT_PATTERN(reg, REG_LEN, SRC_SEED, "the fake's listed memory, written by process_vm_writev");
  HixlEngineDestroy(e);
  int ws = tu_child_stop(&c, 10000);
  CU_ASSERT(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  tu_free_mem(reg, REG_LEN);
  tu_free_mem(src, REG_LEN);
}

static void test_bound_bytes(void) { bound_case(8, TiB, (uint32_t)(ESHM_PEER_MAP_BYTES / TiB)); }

/* The fake sends 2^19 SHM_UNMAPs (16 MiB of frames, an SHM_UNMAP_ACK owed for each) and
 * reads none of the answers: the engine cuts the link once ESHM_UNMAP_UNSENT of them
 * wait unsent (the socket's buffers full). Before, it read on and queued every answer
 * (a heap frame and a send item each, ~8 times the bytes that came in: this process
 * grew by ~120 MB), without bound. mapped: each asks back the one region it handed
 * over (mapped, then a tombstone), whose answer the link's cut took the peer's table
 * with, under the retiring entry (ASan: heap-use-after-free in eshm_map_retire). */
static void flood_case(bool mapped) {
  uint8_t *src = tu_alloc_mem(REG_LEN, false);
  struct fake f = {.lfd = -1, .flood = 1u << 19, .flood_mapped = mapped, .maps = mapped, .map_len = 4096};
  tu_child c = {0};
  char b;
  CU_ASSERT_FATAL(src != NULL);
  fake_up(&f, (uintptr_t)probe, &c);
  HixlEngine *e = tu_engine_start_with(tu_ip(), "shm");
  CU_ASSERT_FATAL(e && tu_register(e, src, REG_LEN));
  TU_ASSERT_OK(HixlEngineConnect(e, f.name, CONNECT_MS));
  CU_ASSERT_FATAL(tu_child_read(&c, &b, 1, 60000) == 0);
  printf("  [%u SHM_UNMAPs of %s sent, answers unread: %s]\n", f.flood,
         mapped ? "the region mapped" : "ranges never handed over",
         b == 'a'   ? "all taken, the link up"
         : b == 'c' ? "the link cut"
                    : "the engine stopped reading");
  CU_ASSERT(b == 'c' || b == 's');
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)src, .remote_addr = (uintptr_t)probe, .len = 16};
  if (b == 'c')
    TU_ASSERT_STATUS(HixlEngineTransferSync(e, f.name, HIXL_READ, &d, 1, 5000), HIXL_NOT_CONNECTED);
  HixlEngineDestroy(e);
  int ws = tu_child_stop(&c, 10000);
  CU_ASSERT(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  tu_free_mem(src, REG_LEN);
}

static void test_bound_unmap_flood(void) {
  flood_case(false);
  flood_case(true);
}

/* The fake asks its one mapped region back (SHM_UNMAP) and resets the link at once: the
 * engine's answer fails to send, which cuts the link, and the cut took the peer's table
 * (its last reference) with the entry being retired, written after (ASan:
 * heap-use-after-free in eshm_map_retire, 2 of 3 rounds: in the others the engine sent
 * the answer before the reset came). 4 rounds; the link just ends. */
static void test_unmap_then_reset(void) {
  uint8_t *src = tu_alloc_mem(REG_LEN, false);
  CU_ASSERT_FATAL(src != NULL);
  HixlEngine *e = tu_engine_start_with(tu_ip(), "shm");
  CU_ASSERT_FATAL(e && tu_register(e, src, REG_LEN));
  for (int round = 0; round < 4; round++) {
    struct fake f = {.lfd = -1, .reset = true, .maps = 1, .map_len = 4096};
    struct hixl_link_info li;
    tu_child c = {0};
    char b;
    fake_up(&f, (uintptr_t)probe, &c);
    TU_ASSERT_OK(HixlEngineConnect(e, f.name, CONNECT_MS));
    CU_ASSERT_FATAL(tu_child_write(&c, "g", 1) == 0 && tu_child_read(&c, &b, 1, 60000) == 0 && b == 'd');
    for (int i = 0; i < 1000 && hixl_engine_link_info(e, f.name, &li) == HIXL_SUCCESS; i++)
      usleep(10000); /* until the progress thread saw the reset */
    HixlTransferOpDesc d = {.local_addr = (uintptr_t)src, .remote_addr = (uintptr_t)probe, .len = 16};
    TU_ASSERT_STATUS(HixlEngineTransferSync(e, f.name, HIXL_READ, &d, 1, 5000), HIXL_NOT_CONNECTED);
    int ws = tu_child_stop(&c, 10000);
    CU_ASSERT(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  }
  HixlEngineDestroy(e);
  tu_free_mem(src, REG_LEN);
}

/* ---------------------------------------------------------------- bad descriptors */

/* The descriptors open in this process. */
static int open_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  for (struct dirent *de; d && (de = readdir(d));) n += de->d_name[0] != '.';
  if (d) closedir(d);
  return n - 1; /* d's own */
}

/* The fake's first SHM_MAP comes with bad in place of its memfd: Connect (Transport
 * shm) fails with a protocol error naming it, and nothing it sent stays open here. */
static void bad_case(enum bad bad, const char *need) {
  struct fake f = {.lfd = -1, .maps = bad == BAD_OVERLAP ? 2 : 1, .map_len = 64 * KiB, .bad = bad};
  tu_child c = {0};
  fake_up(&f, (uintptr_t)probe, &c);
  int before = open_fds();
  HixlEngine *e = tu_engine_start_with(tu_ip(), "shm");
  CU_ASSERT_FATAL(e != NULL);
  TU_ASSERT_STATUS(HixlEngineConnect(e, f.name, CONNECT_MS), HIXL_FAILED);
  TU_ASSERT_ERRMSG_HAS(need);
  printf("  [%s]\n", HixlGetLastErrorMessage());
  HixlEngineDestroy(e);
  CU_ASSERT_EQUAL(open_fds(), before);
  int ws = tu_child_stop(&c, 10000);
  CU_ASSERT(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

static void test_bad_fds(void) {
  bad_case(BAD_PIPE, "is not a regular file");
  bad_case(BAD_FILE, "is not sealed against shrinking");
  bad_case(BAD_UNSEALED, "is not sealed against shrinking");
  bad_case(BAD_SHORT, "is shorter than the region");
  bad_case(BAD_NO_FD, "without its descriptor");
  bad_case(BAD_TWO, "without its descriptor");
  bad_case(BAD_MANY, "without its descriptor");
  bad_case(BAD_DESC, "the descriptor on the unix socket is not the one SHM_MAP announced");
  bad_case(BAD_OVERLAP, "is overlapping a region already mapped");
  bad_case(BAD_PAGE, "the target's page is not a sealed memfd");
}

/* The fake refuses to map (SHM_MAP_ACK refused: the initiator closes its unix socket
 * and copies with process_vm_*), then sends an SHM_MAP all the same and closes its side
 * (a link refused mapping is parked: read again at a hang-up, or a drive that reads).
 * The engine ends the link saying why (a protocol error), maps nothing, keeps no
 * descriptor; a WRITE after it is NOT_CONNECTED and lands nothing. */
static void test_map_after_refusal(void) {
  uint8_t *reg = tu_alloc_mem(REG_LEN, true), *src = tu_alloc_mem(REG_LEN, false);
  struct fake f = {.lfd = -1, .maps = 1, .map_len = 64 * KiB, .bad = BAD_REFUSE};
  tu_child c = {0};
  char b, line[512];
  CU_ASSERT_FATAL(reg && src);
  tu_fill(reg, REG_LEN, REG_SEED);
  tu_fill(src, REG_LEN, SRC_SEED);
  fake_up(&f, (uintptr_t)reg, &c);
  int before = open_fds();
  HixlEngine *e = tu_engine_start_with(tu_ip(), "shm");
  CU_ASSERT_FATAL(e && tu_register(e, src, REG_LEN));
  tu_log_capture(HIXL_LOG_WARN, false);
  tu_log_watch("SHM_MAP on a link without a unix socket");
  TU_ASSERT_OK(HixlEngineConnect(e, f.name, CONNECT_MS));
  CU_ASSERT_FATAL(tu_child_read(&c, &b, 1, 60000) == 0 && b == 'c'); /* the engine ended the link */
  CU_ASSERT_TRUE(tu_log_seen(line, sizeof(line)));
  HixlSetLogCallback(NULL, NULL);
  HixlSetLogLevel(HIXL_LOG_ERROR);
  HixlTransferOpDesc d = {.local_addr = (uintptr_t)src, .remote_addr = (uintptr_t)reg, .len = REG_LEN};
  TU_ASSERT_STATUS(HixlEngineTransferSync(e, f.name, HIXL_WRITE, &d, 1, 5000), HIXL_NOT_CONNECTED);
  TU_ASSERT_PATTERN(reg, REG_LEN, REG_SEED, "the fake's listed memory after the link ended");
  HixlEngineDestroy(e);
  CU_ASSERT_EQUAL(open_fds(), before);
  int ws = tu_child_stop(&c, 10000);
  CU_ASSERT(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  tu_free_mem(reg, REG_LEN);
  tu_free_mem(src, REG_LEN);
}

/* ---------------------------------------------------------------- SHM_HELLO_ACK */

/* The fake's SHM_HELLO_ACK says ack: with Transport shm Connect fails naming why (need),
 * and no descriptor stays open here; with auto, a malformed answer (too short: the
 * frame; layout 0: the SHM_HELLO_ACK) fails Connect too,
 * any other leaves the link on tcp, data moving. */
static void ack_case(enum ack ack, bool shm, const char *need) {
  uint8_t *reg = tu_alloc_mem(REG_LEN, true), *src = tu_alloc_mem(REG_LEN, false);
  struct fake f = {.lfd = -1, .ack = ack};
  struct hixl_link_info li;
  tu_child c = {0};
  CU_ASSERT_FATAL(reg && src);
  tu_fill(reg, REG_LEN, REG_SEED);
  tu_fill(src, REG_LEN, SRC_SEED);
  fake_up(&f, (uintptr_t)reg, &c);
  int before = open_fds();
  HixlEngine *e = tu_engine_start_with(tu_ip(), shm ? "shm" : NULL);
  CU_ASSERT_FATAL(e && tu_register(e, src, REG_LEN));
  if (shm || ack == ACK_SHORT || ack == ACK_LAYOUT0) {
    TU_ASSERT_STATUS(HixlEngineConnect(e, f.name, CONNECT_MS), HIXL_FAILED);
    TU_ASSERT_ERRMSG_HAS(need);
    printf("  [%s]\n", HixlGetLastErrorMessage());
    TU_ASSERT_STATUS(hixl_engine_link_info(e, f.name, &li), HIXL_NOT_CONNECTED);
  } else {
    TU_ASSERT_OK(HixlEngineConnect(e, f.name, CONNECT_MS));
    TU_ASSERT_OK(hixl_engine_link_info(e, f.name, &li));
    CU_ASSERT_STRING_EQUAL(li.transport, "tcp");
    CU_ASSERT_EQUAL(li.mapped, 0);
  }
  HixlEngineDestroy(e);
  CU_ASSERT_EQUAL(open_fds(), before);
  TU_ASSERT_PATTERN(reg, REG_LEN, REG_SEED, "the fake's listed memory after a refused shm handshake");
  int ws = tu_child_stop(&c, 10000);
  CU_ASSERT(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  tu_free_mem(reg, REG_LEN);
  tu_free_mem(src, REG_LEN);
}

static void test_bad_hello_ack(void) {
  const struct {
    enum ack ack;
    const char *need;
  } cases[] = {{ACK_SHORT, "malformed frame: a SHM_HELLO_ACK header"},
               {ACK_LAYOUT0, "answered SHM_HELLO with a malformed SHM_HELLO_ACK"},
               {ACK_REFUSED, "does not offer same-host copies"},
               {ACK_BOOT, "runs on another host (its boot id differs)"},
               {ACK_NO_SOCK, "named no unix socket to prove its pid with"},
               {ACK_SELF, "named this very process"},
               {ACK_OTHER_PID, "named pid 1 (uid"}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    ack_case(cases[i].ack, true, cases[i].need);
    ack_case(cases[i].ack, false, cases[i].need);
  }
}

/* ---------------------------------------------------------------- SHM_MAP_HELLO refused */

/* An initiator that lies to its target (the engine here is the target): a raw one in a
 * child (its pid is not the target's), which says it connected to the link's unix
 * socket (SHM_MAP_HELLO) when it should not be handed memory. eshm_target_map_hello
 * refuses each: SHM_MAP_ACK refused with the reason, no region and no page handed
 * over, the unix socket closed (one try a link) but the TCP link left up: a WRITE on
 * it after lands byte for byte. */
enum lie {
  LIE_TWICE,      /* maps as it should, then sends SHM_MAP_HELLO again (LIE_REPEATS times) */
  LIE_NO_CONNECT, /* never connects to the unix socket */
  LIE_STRANGER,   /* a child of it connects (turned away: another pid), it does not */
  LIE_UNBOUND,    /* a keyed link: it connects, but never asks the binding */
  LIE_OTHER_UID,  /* it connects as another user (root dropped after its SHM_HELLO) */
  LIE_NOT_ASKED,  /* its SHM_HELLO did not ask to map memory (no WIRE_SHM_F_MAP) */
  LIE_HUNG_UP,    /* it connects and closes its end before the frame: its page cannot go */
  LIE_NO_HELLO,   /* no SHM_HELLO before it: the link has no shm state at all */
  LIE_NONE,       /* none: it maps as it should, from a target that has no page to hand over */
};
enum { LIE_REPEATS = 3 }; /* LIE_TWICE: SHM_MAP_HELLOs after the first */

#define LIE_OFF  8192u /* where in the target's region the WRITE after the refusal lands */
#define LIE_LEN  4096u
#define LIE_SEED 4303

struct lie_go {       /* the test to the raw initiator, once the target is up */
  uint64_t addr, len; /* the target's AllocMem region */
};

struct lie_result {
  uint32_t stage;      /* 0: it got through; else the step that failed (err says which) */
  uint32_t first;      /* LIE_TWICE: the first SHM_MAP_ACK's status ... */
  uint32_t first_maps; /* ... the SHM_MAPs before it ... */
  uint32_t first_fds;  /* ... and the descriptors on the unix socket (its page, a memfd) */
  uint32_t status;     /* the SHM_MAP_ACK of the lie: WIRE_HELLO_* */
  char reason[WIRE_SHM_REASON_MAX + 1];
  uint32_t maps;     /* SHM_MAP / SHM_DEV_MAP frames before that ACK (LIE_TWICE: every repeat's) */
  uint32_t fds;      /* descriptors that came on the unix socket after the first ACK (all: LIE_TWICE) */
  int32_t sock;      /* its unix socket after the ACK: 0 closed on it, 1 open (nothing waiting), -1 none */
  int32_t again;     /* errno of a connect to the socket's name after it (0: it connected; -1: no name) */
  uint32_t write_st; /* WRITE_ACK's status of a WRITE on the TCP link after it */
  char err[160];
};

struct lie_case {
  enum lie lie;
  uint16_t port; /* the target's */
  bool keyed;
};

/* A blocking socket to the target at tu_ip():port, 5 s timeouts; -1 on error. */
static int lie_dial(uint16_t port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  struct timeval tv = {.tv_sec = 5};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  inet_pton(AF_INET, tu_ip(), &sa.sin_addr);
  if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
                  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0 ||
                  connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)) {
    close(fd);
    fd = -1;
  }
  return fd;
}

/* A frame on the raw link (tagged on a keyed one). */
static bool lie_send(int fd, struct auth_frames *fr, uint8_t *frame, size_t len, const void *pl,
                     size_t plen) {
  if (fr->on) return raw_send_proven(fd, fr, frame, len, pl, plen);
  return raw_send_all(fd, frame, len) && (plen == 0 || raw_send_all(fd, pl, plen));
}

/* The next frame of type want (others dropped) into buf, decoded into *m. */
static bool lie_recv(int fd, struct auth_frames *fr, uint8_t *buf, size_t cap, uint8_t want,
                     struct wire_msg *m, uint32_t *maps) {
  struct wire_hdr h;
  for (;;) {
    bool ok = fr->on ? raw_recv_proven(fd, fr, &h, buf, buf + WIRE_HDR_LEN, cap - WIRE_HDR_LEN)
                     : raw_recv_frame(fd, &h, buf, buf + WIRE_HDR_LEN, cap - WIRE_HDR_LEN);
    if (!ok) return false;
    if (maps && (h.type == WIRE_SHM_MAP || h.type == WIRE_SHM_DEV_MAP)) (*maps)++;
    if (h.type == want) return wire_decode(&h, buf + WIRE_HDR_LEN, m) == WIRE_OK;
  }
}

/* Descriptors waiting on the unix socket u, taken (and closed); *sock: 0 once it ended,
 * 1 when it is open with nothing more. */
static uint32_t lie_drain(int u, int32_t *sock) {
  uint32_t n = 0;
  for (;;) {
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(8 * sizeof(int))];
    } cm;
    char data[64];
    struct iovec iov = {data, sizeof(data)};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf)};
    ssize_t k = recvmsg(u, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    for (struct cmsghdr *c = k >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < nfd; i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        close(fd);
        n++;
      }
    }
    if (k > 0) continue;
    *sock = k == 0 || errno == ECONNRESET ? 0 : 1;
    return n;
  }
}

/* A process other than the link's peer connects to its socket and waits until the
 * target turns it away (EOF); 0 when it did. */
static int lie_stranger(const char *sname) {
  pid_t p = fork();
  if (p == 0) {
    char b;
    int u = uds_connect(sname, strlen(sname), 5000);
    struct pollfd pf = {.fd = u, .events = POLLIN};
    _exit(u >= 0 && poll(&pf, 1, 10000) == 1 && recv(u, &b, 1, 0) == 0 ? 0 : 1);
  }
  int ws = 0;
  return p > 0 && waitpid(p, &ws, 0) == p && WIFEXITED(ws) && WEXITSTATUS(ws) == 0 ? 0 : -1;
}

#define LIE_FAIL(n, ...)                                                                                     \
  do {                                                                                                       \
    r->stage = (n);                                                                                          \
    snprintf(r->err, sizeof(r->err), __VA_ARGS__);                                                           \
    goto out;                                                                                                \
  } while (0)

/* The raw initiator's lie, told on r. */
static void lie_run(const struct lie_case *lc, const struct lie_go *go, struct lie_result *r) {
  static uint8_t buf[16384];
  uint8_t data[LIE_LEN];
  char sname[WIRE_SHM_SOCK_MAX + 1] = "";
  struct auth_frames fr = {0};
  struct raw_auth a = {.key_hex = lc->keyed ? TU_KEY_HEX : NULL, .name = "raw-liar", .frames = &fr};
  struct cma_self self;
  struct wire_wr w;
  struct wire_msg m;
  int u = -1;
  r->sock = -1;
  r->again = -1;
  r->write_st = UINT32_MAX;
  int fd = lie_dial(lc->port);
  if (fd < 0 || !raw_auth_hello(fd, &a, raw_send_all, raw_recv_all) || a.status != WIRE_HELLO_OK ||
      !(a.ack_caps & WIRE_CAP_SHM) || (lc->keyed && !fr.on))
    LIE_FAIL(1, "no link to the target (HELLO_ACK status %u caps 0x%x)", a.status, a.ack_caps);
  if (lc->lie != LIE_NO_HELLO) {
    if (cma_self_get(&self) != 0) LIE_FAIL(2, "no boot id");
    wire_begin(&w, buf, sizeof(buf), WIRE_SHM_HELLO);
    wire_put_shm_id(&w, WIRE_SHM_LAYOUT, self.boot_id, (uint32_t)getpid(), (uint32_t)geteuid());
    wire_put_u32(&w, lc->lie == LIE_NOT_ASKED ? 0 : WIRE_SHM_F_MAP);
    if (!lie_send(fd, &fr, buf, wire_end(&w, 0), NULL, 0) ||
        !lie_recv(fd, &fr, buf, sizeof(buf), WIRE_SHM_HELLO_ACK, &m, NULL))
      LIE_FAIL(3, "no SHM_HELLO_ACK");
    if (m.u.shm.status != WIRE_HELLO_OK || m.u.shm.sock_len == 0 || m.u.shm.sock_len > WIRE_SHM_SOCK_MAX)
      LIE_FAIL(4, "SHM_HELLO_ACK status %u, socket name of %u bytes", m.u.shm.status, m.u.shm.sock_len);
    memcpy(sname, m.u.shm.sock, m.u.shm.sock_len);
    sname[m.u.shm.sock_len] = '\0';
  }
  if (lc->lie == LIE_OTHER_UID && tu_become(USER_A, USER_A) != 0) LIE_FAIL(5, "cannot become uid %u", USER_A);
  if (lc->lie == LIE_STRANGER && lie_stranger(sname) != 0) LIE_FAIL(6, "the stranger was not turned away");
  if (sname[0] && lc->lie != LIE_NO_CONNECT && lc->lie != LIE_STRANGER &&
      (u = uds_connect(sname, strlen(sname), 5000)) < 0)
    LIE_FAIL(7, "cannot connect to the unix socket: %s", strerror(errno));
  if (lc->lie == LIE_HUNG_UP) {
    close(u);
    u = -1;
  }
  for (int k = lc->lie == LIE_TWICE ? 0 : 1; k < (lc->lie == LIE_TWICE ? 1 + LIE_REPEATS : 2); k++) {
    uint32_t maps = 0;
    wire_begin(&w, buf, sizeof(buf), WIRE_SHM_MAP_HELLO);
    wire_put_u32(&w, 0);
    if (!lie_send(fd, &fr, buf, wire_end(&w, 0), NULL, 0) ||
        !lie_recv(fd, &fr, buf, sizeof(buf), WIRE_SHM_MAP_ACK, &m, &maps))
      LIE_FAIL(8, "no SHM_MAP_ACK");
    /* What it handed over went on the unix socket before the frames: all there now. */
    uint32_t fds = u >= 0 ? lie_drain(u, &r->sock) : 0;
    if (k == 0) {
      r->first = m.u.map.status;
      r->first_maps = maps;
      r->first_fds = fds;
    } else {
      r->status = m.u.map.status; /* each the same: the last's kept */
      r->maps += maps;
      r->fds += fds;
      memcpy(r->reason, m.u.map.text, m.u.map.text_len);
      r->reason[m.u.map.text_len] = '\0';
    }
  }
  if (sname[0]) { /* one try a link: nobody gets onto the socket after */
    int v = uds_connect(sname, strlen(sname), 1000);
    r->again = v >= 0 ? 0 : errno;
    if (v >= 0) close(v);
  }
  /* The link is up: a WRITE over tcp lands. */
  tu_fill(data, sizeof(data), LIE_SEED);
  wire_begin(&w, buf, sizeof(buf), WIRE_WRITE_REQ);
  wire_put_u64(&w, 1);
  wire_put_u64(&w, go->addr + LIE_OFF);
  if (!lie_send(fd, &fr, buf, wire_end(&w, LIE_LEN), data, LIE_LEN) ||
      !lie_recv(fd, &fr, buf, sizeof(buf), WIRE_WRITE_ACK, &m, NULL) || m.u.ack.seq != 1)
    LIE_FAIL(9, "no WRITE_ACK");
  r->write_st = m.u.ack.status;
out:
  if (u >= 0) close(u);
  if (fd >= 0) close(fd);
  auth_frames_free(&fr);
}

/* tu_child_start body: the raw initiator; told the target's region on ctl_fd, it lies,
 * reports, and keeps nothing open until ctl_fd ends. */
static int lie_child(void *arg, int ready_fd, int ctl_fd) {
  struct lie_go go;
  struct lie_result r;
  char b;
  memset(&r, 0, sizeof(r));
  if (tu_write_all(ready_fd, "r", 1) != 0 || tu_read_all(ctl_fd, &go, sizeof(go)) != 0) return 1;
  lie_run(arg, &go, &r);
  if (tu_write_all(ready_fd, &r, sizeof(r)) != 0) return 1;
  while (read(ctl_fd, &b, 1) > 0) {
  }
  return 0;
}

/* What the raw initiator reports after lie: its SHM_MAP_ACK refused, its reason
 * holding need, as the target's warning does (line; seen: it came); nothing handed
 * over for it; the socket closed and taking no one after (where it had one); the link
 * up: its WRITE after the refusal answered SUCCESS. pid: the raw initiator's. */
static void lie_check(enum lie lie, const struct lie_result *r, const char *need, pid_t pid, bool seen,
                      const char *line) {
  char who[32];
  if (r->stage != 0)
    tu_fail(__FILE__, __LINE__, "the raw initiator stopped at step %u: %s", r->stage, r->err);
  printf("  [SHM_MAP_ACK %s: \"%s\"]\n", r->status == WIRE_HELLO_REFUSED ? "refused" : "OK", r->reason);
  if (lie == LIE_TWICE) { /* the first was answered as it should be */
    CU_ASSERT_EQUAL(r->first, WIRE_HELLO_OK);
    CU_ASSERT_EQUAL(r->first_maps, 1);
    CU_ASSERT_EQUAL(r->first_fds, 2); /* the page, the region's memfd */
  }
  CU_ASSERT_EQUAL(r->status, WIRE_HELLO_REFUSED);
  if (!strstr(r->reason, need))
    tu_fail(__FILE__, __LINE__, "the reason \"%s\" does not say \"%s\"", r->reason, need);
  if (!seen || !strstr(line, need))
    tu_fail(__FILE__, __LINE__, "the target's warning \"%s\" does not say \"%s\"", line, need);
  snprintf(who, sizeof(who), "pid %d", (int)pid); /* named by the refusals that name the peer */
  if ((lie == LIE_NO_CONNECT || lie == LIE_STRANGER || lie == LIE_OTHER_UID) && !strstr(r->reason, who))
    tu_fail(__FILE__, __LINE__, "the reason \"%s\" does not name the raw initiator, %s", r->reason, who);
  CU_ASSERT_EQUAL(r->maps, 0);
  CU_ASSERT_EQUAL(r->fds, 0);
  bool connected = lie != LIE_NO_CONNECT && lie != LIE_STRANGER && lie != LIE_NO_HELLO && lie != LIE_HUNG_UP;
  CU_ASSERT_EQUAL(r->sock, !connected ? -1 : lie == LIE_TWICE ? 1 : 0);
  CU_ASSERT_EQUAL(r->again, lie == LIE_NO_HELLO ? -1 : ECONNREFUSED);
  CU_ASSERT_EQUAL(r->write_st, HIXL_SUCCESS);
}

/* The target (this process, Transport shm, keyed or not, an AllocMem region) gets lie
 * from a raw initiator in a child: refused (lie_check); the region holds the WRITE
 * after the refusal, the rest as it was. */
static void lie_case(enum lie lie, bool keyed, const char *need) {
  static uint8_t want[REG_LEN];
  struct lie_case lc = {.lie = lie, .port = tu_free_port(), .keyed = keyed};
  struct lie_result r;
  struct lie_go go;
  tu_child c = {0};
  char name[TU_ADDR_LEN], line[512], b;
  void *p = NULL;
  HixlMemHandle h;
  const char *key = keyed ? tu_key_file() : NULL;
  HixlOption o = {"AuthKeyFile", key};
  CU_ASSERT_FATAL(!keyed || key);
  CU_ASSERT_FATAL(tu_child_start(&c, lie_child, &lc) == 0); /* before the engine */
  CU_ASSERT_FATAL(tu_child_read(&c, &b, 1, READY_MS) == 0);
  HixlEngine *t = tu_engine_start_opts(tu_addr(name, sizeof(name), lc.port), "shm", &o, keyed ? 1 : 0);
  CU_ASSERT_FATAL(t != NULL);
  TU_ASSERT_OK_FATAL(HixlEngineAllocMem(t, REG_LEN, &p, &h));
  tu_fill(p, REG_LEN, REG_SEED);
  tu_log_capture(HIXL_LOG_WARN, false);
  tu_log_watch("memory not mapped there");
  go = (struct lie_go){(uintptr_t)p, REG_LEN};
  CU_ASSERT_FATAL(tu_child_write(&c, &go, sizeof(go)) == 0);
  CU_ASSERT_FATAL(tu_child_read(&c, &r, sizeof(r), 30000) == 0);
  bool seen = tu_log_seen(line, sizeof(line));
  unsigned warned = tu_log_hits(); /* LIE_TWICE: the first repeat; the others at debug (no log flood) */
  if (warned != 1) tu_fail(__FILE__, __LINE__, "%u warnings of memory not mapped, want 1", warned);
  HixlSetLogCallback(NULL, NULL);
  HixlSetLogLevel(HIXL_LOG_ERROR);
  lie_check(lie, &r, need, c.pid, seen, line);
  tu_fill(want, REG_LEN, REG_SEED);
  tu_fill(want + LIE_OFF, LIE_LEN, LIE_SEED);
  TU_ASSERT_SAME(p, want, REG_LEN, "the target's region: the WRITE after the refusal, the rest as it was");
  int ws = tu_child_stop(&c, 10000);
  CU_ASSERT(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  HixlEngineDestroy(t);
}

/* memfd_create fails (ENOSYS) in this process from here on (a seccomp filter, as on a
 * kernel without memfds): an engine started after it has no page to hand over. 0, or
 * -1 with errno. */
static int no_memfds(void) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_memfd_create, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = (unsigned short)(sizeof(f) / sizeof(f[0])), .filter = f};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0
             ? 0
             : -1;
}

struct nopage_up { /* the target child's readiness */
  uint64_t addr;   /* its registered memory (REG_LEN bytes, REG_SEED), 0: it did not start */
  bool skip;       /* ... for want of seccomp filters */
  char err[120];
};

struct nopage_end { /* ... and its answer at the end */
  int64_t mismatch; /* the first byte of its memory that is not the WRITE or REG_SEED, -1: none */
  bool seen;        /* its warning came ... */
  char line[400];   /* ... this one */
};

/* tu_child_start body: a target without its page (no_memfds), Transport shm, on port
 * *arg, its memory registered (AllocMem needs a memfd too); on a byte on ctl_fd it
 * checks that memory and says what it logged, then waits for ctl_fd to end. */
static int nopage_target(void *arg, int ready_fd, int ctl_fd) {
  static uint8_t want[REG_LEN];
  struct nopage_up up = {0, false, ""};
  struct nopage_end end = {-1, false, ""};
  char name[TU_ADDR_LEN], b;
  uint8_t *mem = tu_alloc_mem(REG_LEN, false);
  HixlEngine *t = NULL;
  if (!mem) {
    snprintf(up.err, sizeof(up.err), "no memory");
  } else if (no_memfds() != 0) {
    up.skip = true;
    snprintf(up.err, sizeof(up.err), "no seccomp filter to refuse memfd_create with: %s", strerror(errno));
  } else if (!(t = tu_engine_start_with(tu_addr(name, sizeof(name), *(const uint16_t *)arg), "shm")) ||
             !tu_register(t, mem, REG_LEN)) {
    snprintf(up.err, sizeof(up.err), "no engine: %s", HixlGetLastErrorMessage());
  } else {
    tu_fill(mem, REG_LEN, REG_SEED);
    up.addr = (uintptr_t)mem;
    tu_log_capture(HIXL_LOG_WARN, false);
    tu_log_watch("memory not mapped there");
  }
  if (tu_write_all(ready_fd, &up, sizeof(up)) != 0 || !up.addr || tu_read_all(ctl_fd, &b, 1) != 0) return 1;
  end.seen = tu_log_seen(end.line, sizeof(end.line));
  tu_fill(want, REG_LEN, REG_SEED);
  tu_fill(want + LIE_OFF, LIE_LEN, LIE_SEED);
  end.mismatch = tu_mismatch(mem, want, REG_LEN);
  if (tu_write_all(ready_fd, &end, sizeof(end)) != 0) return 1;
  while (read(ctl_fd, &b, 1) > 0) {
  }
  HixlEngineDestroy(t);
  return 0;
}

/* A target that could not make its page (memfd_create refused, in a child) refuses an
 * initiator that asks as it should: this process, the raw initiator here. */
static void test_map_hello_no_page(void) {
  struct lie_case lc = {.lie = LIE_NONE, .port = tu_free_port()};
  struct nopage_up up;
  struct nopage_end end;
  struct lie_result r;
  tu_child c = {0};
  memset(&r, 0, sizeof(r));
  CU_ASSERT_FATAL(tu_child_start(&c, nopage_target, &lc.port) == 0);
  CU_ASSERT_FATAL(tu_child_read(&c, &up, sizeof(up), READY_MS) == 0);
  if (up.skip) {
    printf("  [skipped: %s]\n", up.err);
    tu_child_stop(&c, 10000);
    return;
  }
  if (!up.addr) {
    tu_fail(__FILE__, __LINE__, "the target without a page did not start: %s", up.err);
    tu_child_stop(&c, 10000);
    return;
  }
  struct lie_go go = {up.addr, REG_LEN};
  lie_run(&lc, &go, &r);
  CU_ASSERT_FATAL(tu_child_write(&c, "c", 1) == 0 && tu_child_read(&c, &end, sizeof(end), 10000) == 0);
  lie_check(LIE_NONE, &r, "this engine offers no memory to map (it could not make its page)", getpid(),
            end.seen, end.line);
  if (end.mismatch >= 0)
    tu_fail(__FILE__, __LINE__, "the target's memory differs at byte %lld from the WRITE after the refusal",
            (long long)end.mismatch);
  int ws = tu_child_stop(&c, 10000);
  CU_ASSERT(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

static void test_map_hello_twice(void) { lie_case(LIE_TWICE, false, "SHM_MAP_HELLO came twice"); }

static void test_map_hello_not_connected(void) {
  lie_case(LIE_NO_CONNECT, false, "this link's peer, did not connect to the unix socket");
  lie_case(LIE_STRANGER, false, "this link's peer, did not connect to the unix socket");
}

static void test_map_hello_unbound(void) {
  lie_case(LIE_UNBOUND, true, "the unix socket was not bound to this link first (the link has a key)");
}

static void test_map_hello_other_uid(void) {
  if (geteuid() != 0) {
    printf("  [skipped: an initiator of another user needs root to drop]\n");
    return;
  }
  lie_case(LIE_OTHER_UID, false, "connected as uid 65501; memory is mapped only into processes of uid 0");
}

static void test_map_hello_not_asked(void) {
  lie_case(LIE_NOT_ASKED, false, "the initiator's SHM_HELLO did not ask to map memory");
}

static void test_map_hello_hung_up(void) {
  lie_case(LIE_HUNG_UP, false, "cannot hand over its page on the unix socket");
}

static void test_map_hello_no_hello(void) {
  lie_case(LIE_NO_HELLO, false, "no unix socket is open on this link");
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
  int rc = tu_child_main(argc, argv);
  if (rc >= 0) return rc; /* a server child */
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  CU_pSuite s = CU_add_suite("shm: a target that lies to its initiator", NULL, NULL);
  CU_add_test(s, "it dies with its life word 'alive', its pid reused: WRITE FAILED, the heir untouched",
              test_pid_reuse);
  CU_add_test(s, "more memfds than a peer may map: mapped up to ESHM_PEER_MAPS, data moves",
              test_bound_count);
  CU_add_test(s, "8 sparse 1 TiB memfds: mapped up to ESHM_PEER_MAP_BYTES, data moves", test_bound_bytes);
  CU_add_test(s, "regions handed over and taken back: the table bounded too", test_bound_churn);
  CU_add_test(s, "SHM_UNMAPs flooding in, answers unread: the link cut, not queued without bound",
              test_bound_unmap_flood);
  CU_add_test(s, "an SHM_UNMAP of its mapped region, then a reset: the link ends, nothing freed in use",
              test_unmap_then_reset);
  CU_add_test(s,
              "a pipe, a file, unsealed, short, none, two, eight, another's, overlapping, a loose page: "
              "FAILED, none kept",
              test_bad_fds);
  CU_add_test(s, "an SHM_MAP after its own refusal to map: the link ends, nothing mapped or kept",
              test_map_after_refusal);
  CU_add_test(
      s, "SHM_HELLO_ACK short, layout 0, refused, another boot, no socket, this pid, pid 1: FAILED or tcp",
      test_bad_hello_ack);
  s = CU_add_suite("shm: an initiator that lies to its target (SHM_MAP_HELLO refused)", NULL, NULL);
  CU_add_test(s, "SHM_MAP_HELLO twice: the second refused, nothing more handed over, the link up",
              test_map_hello_twice);
  CU_add_test(s, "SHM_MAP_HELLO with the peer not connected (none, or a stranger instead): refused",
              test_map_hello_not_connected);
  CU_add_test(s, "SHM_MAP_HELLO on a keyed link, the socket never bound: refused", test_map_hello_unbound);
  CU_add_test(s, "SHM_MAP_HELLO from a connection of another uid: refused", test_map_hello_other_uid);
  CU_add_test(s, "SHM_MAP_HELLO when its SHM_HELLO did not ask to map: refused", test_map_hello_not_asked);
  CU_add_test(s, "SHM_MAP_HELLO after it closed its end of the socket: its page cannot go, refused",
              test_map_hello_hung_up);
  CU_add_test(s, "SHM_MAP_HELLO with no SHM_HELLO before it: refused", test_map_hello_no_hello);
  CU_add_test(s, "SHM_MAP_HELLO to a target that could not make its page: refused", test_map_hello_no_page);
  if (CU_get_error() != CUE_SUCCESS) {
    fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
    CU_cleanup_registry();
    return 1;
  }
  return tu_run_registry();
}
