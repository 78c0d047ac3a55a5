/* sock: blocking helpers with deadlines (handshakes) and socket setup. */
#include "util/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "hixl/hixl_engine.h"
#include "util/log.h"
#include "util/status_int.h"

uint64_t hixl_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t hixl_deadline_ns(int32_t timeout_ms) {
  if (timeout_ms == 0) timeout_ms = HIXL_DEFAULT_TIMEOUT_MS;
  return hixl_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

/* Milliseconds left before deadline, rounded up, 0 when past. */
static int ms_left(uint64_t deadline_ns) {
  uint64_t now = hixl_now_ns();
  if (now >= deadline_ns) return 0;
  uint64_t ms = (deadline_ns - now + 999999) / 1000000;
  return ms > 60000000 ? 60000000 : (int)ms;
}

HixlStatus sock_parse_endpoint(const char *text, const char *what, struct sockaddr_in *sa, bool *has_port) {
  char ip[64];
  const char *colon;
  size_t iplen;
  if (!text || !*text)
    return hixl_fail(HIXL_PARAM_INVALID, "%s is empty; expected \"ip\" or \"ip:port\"", what);
  colon = strchr(text, ':');
  iplen = colon ? (size_t)(colon - text) : strlen(text);
  if (iplen == 0 || iplen >= sizeof(ip))
    return hixl_fail(HIXL_PARAM_INVALID, "%s \"%s\": expected \"ip\" or \"ip:port\"", what, text);
  memcpy(ip, text, iplen);
  ip[iplen] = '\0';
  memset(sa, 0, sizeof(*sa));
  sa->sin_family = AF_INET;
  if (inet_pton(AF_INET, ip, &sa->sin_addr) != 1)
    return hixl_fail(HIXL_PARAM_INVALID, "%s \"%s\": \"%s\" is not an IPv4 address", what, text, ip);
  *has_port = false;
  if (colon) {
    char *end;
    const char *p = colon + 1;
    /* A port <= 0 (an int32_t, as HIXL reads it) means none: seed 001's client. */
    bool neg = *p == '-';
    p += neg;
    if (*p < '0' || *p > '9')
      return hixl_fail(HIXL_PARAM_INVALID,
                       "%s \"%s\": port must be a number in [0,65535] (or negative: none)", what, text);
    errno = 0;
    unsigned long port = strtoul(p, &end, 10);
    if (errno || *end || port > (neg ? (unsigned long)INT32_MAX + 1 : 65535ul))
      return hixl_fail(HIXL_PARAM_INVALID,
                       "%s \"%s\": port must be a number in [0,65535] (or negative: none)", what, text);
    if (!neg) sa->sin_port = htons((uint16_t)port);
    *has_port = !neg && port > 0;
  }
  return HIXL_SUCCESS;
}

int sock_set_nonblock(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -1;
  return fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

void sock_tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle = 5, intvl = 2, cnt = 3; /* a vanished host shows within ~11 s */
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

static size_t read_sysctl(const char *path) {
  char buf[32] = "";
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  bool ok = fgets(buf, sizeof(buf), f) != NULL;
  fclose(f);
  return ok ? (size_t)strtoull(buf, NULL, 10) : 0;
}

size_t sock_buf_cap(void) {
  size_t r = read_sysctl("/proc/sys/net/core/rmem_max"), w = read_sysctl("/proc/sys/net/core/wmem_max");
  return r < w ? r : w;
}

void sock_set_buffers(int fd, size_t bytes) {
  int b = bytes > INT_MAX ? INT_MAX : (int)bytes;
  if (b <= 0) return;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof(b));
}

void sock_tune_rail(int fd, uint32_t stall_ms) {
  int idle = (int)((stall_ms + 999) / 1000), intvl = 1, cnt = 3, user = (int)stall_ms;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof(user));
}

bool sock_path_dead(int fd, uint32_t stall_ms, uint32_t *unacked) {
  struct tcp_info ti;
  socklen_t len = sizeof(ti);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0) return false;
  *unacked = ti.tcpi_unacked;
  return ti.tcpi_unacked > 0 && ti.tcpi_last_ack_recv >= stall_ms;
}

int sock_listen(const struct sockaddr_in *sa, int backlog, HixlStatus *st) {
  char ip[INET_ADDRSTRLEN];
  int one = 1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof(ip));
  if (fd < 0) {
    *st = hixl_fail(HIXL_FAILED, "socket(): %s", strerror(errno));
    return -1;
  }
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, (const struct sockaddr *)sa, sizeof(*sa)) < 0 || listen(fd, backlog > 0 ? backlog : 512) < 0) {
    *st = hixl_fail(HIXL_FAILED, "cannot listen on %s:%u: %s", ip, ntohs(sa->sin_port), strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

int sock_connect(const struct sockaddr_in *sa, uint64_t deadline_ns, HixlStatus *st) {
  return sock_connect_from(sa, NULL, deadline_ns, st);
}

int sock_connect_from(const struct sockaddr_in *sa, const struct sockaddr_in *from, uint64_t deadline_ns,
                      HixlStatus *st) {
  char ip[INET_ADDRSTRLEN];
  int last_err = 0;
  inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof(ip));
  do {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      *st = hixl_fail(HIXL_FAILED, "socket(): %s", strerror(errno));
      return -1;
    }
    if (from && bind(fd, (const struct sockaddr *)from, sizeof(*from)) < 0) {
      char fip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &from->sin_addr, fip, sizeof(fip));
      *st = hixl_fail(HIXL_FAILED, "cannot bind a connection to %s's rail address %s: %s", ip, fip,
                      strerror(errno));
      close(fd);
      return -1;
    }
    int rc = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
    if (rc < 0 && errno == EINPROGRESS) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      rc = poll(&p, 1, ms_left(deadline_ns));
      if (rc == 1) {
        socklen_t sl = sizeof(last_err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &last_err, &sl);
        rc = last_err ? -1 : 0;
        errno = last_err;
      } else {
        last_err = rc == 0 ? ETIMEDOUT : errno;
        rc = -1;
      }
    } else if (rc < 0) {
      last_err = errno;
    }
    if (rc == 0 && sock_set_nonblock(fd, false) == 0) {
      sock_tune(fd);
      return fd;
    }
    close(fd);
    if (last_err != ECONNREFUSED && last_err != ETIMEDOUT && last_err != EINTR && last_err != EAGAIN &&
        last_err != ECONNRESET)
      break;
    /* Nothing listens yet: try again shortly, never past the deadline. */
    if (last_err == ECONNREFUSED && ms_left(deadline_ns) > 0) {
      struct pollfd none;
      poll(&none, 0, ms_left(deadline_ns) < 10 ? ms_left(deadline_ns) : 10);
    }
  } while (ms_left(deadline_ns) > 0);
  if (last_err == ECONNREFUSED || last_err == ETIMEDOUT || ms_left(deadline_ns) == 0)
    *st = hixl_fail(HIXL_TIMEOUT, "connect to %s:%u timed out (last error: %s)", ip, ntohs(sa->sin_port),
                    strerror(last_err ? last_err : ETIMEDOUT));
  else
    *st = hixl_fail(HIXL_FAILED, "connect to %s:%u failed: %s", ip, ntohs(sa->sin_port), strerror(last_err));
  return -1;
}

#if defined(__SANITIZE_THREAD__)
#define SOCK_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SOCK_TSAN 1
#endif
#endif

#ifdef SOCK_TSAN
#include <sanitizer/tsan_interface.h>
#include <sys/syscall.h>
void __tsan_read_range(void *addr, unsigned long size); /* libtsan's, not in its header */

ssize_t sock_sendmsg(int fd, const struct msghdr *mh, int flags) {
  for (size_t i = 0; i < mh->msg_iovlen; i++)
    __tsan_read_range(mh->msg_iov[i].iov_base, mh->msg_iov[i].iov_len);
  sock_hb_sent(fd);
  return syscall(SYS_sendmsg, fd, mh, flags); /* not TSan's sendmsg: it records the reads after */
}

/* One sync object per TCP connection, named by its two endpoints in an order both
 * ends agree on, so the sender's release and the receiver's acquire meet; a hash
 * collision only adds order. */
static char sock_hb_table[4096];

static void *sock_hb_obj(int fd) {
  struct sockaddr_in a, b;
  socklen_t la = sizeof(a), lb = sizeof(b);
  if (getsockname(fd, (struct sockaddr *)&a, &la) != 0 || getpeername(fd, (struct sockaddr *)&b, &lb) != 0 ||
      a.sin_family != AF_INET || b.sin_family != AF_INET)
    return NULL;
  uint64_t x = ((uint64_t)a.sin_addr.s_addr << 16) | a.sin_port,
           y = ((uint64_t)b.sin_addr.s_addr << 16) | b.sin_port;
  uint64_t lo = x < y ? x : y, hi = x < y ? y : x,
           h = (lo * 0x9E3779B97F4A7C15ull) ^ (hi + 0x632BE59BD9B4E019ull);
  return &sock_hb_table[(h ^ (h >> 29)) % sizeof(sock_hb_table)];
}

void sock_hb_sent(int fd) {
  void *o = sock_hb_obj(fd);
  if (o) __tsan_release(o);
}

void sock_hb_received(int fd) {
  void *o = sock_hb_obj(fd);
  if (o) __tsan_acquire(o);
}

void sock_hb_received_any(void) {
  for (size_t i = 0; i < sizeof(sock_hb_table); i++) __tsan_acquire(&sock_hb_table[i]);
}

void sock_hb_sent_any(void) {
  for (size_t i = 0; i < sizeof(sock_hb_table); i++) __tsan_release(&sock_hb_table[i]);
}
#else
ssize_t sock_sendmsg(int fd, const struct msghdr *mh, int flags) { return sendmsg(fd, mh, flags); }
void sock_hb_sent(int fd) { (void)fd; }
void sock_hb_received(int fd) { (void)fd; }
void sock_hb_received_any(void) {}
void sock_hb_sent_any(void) {}
#endif

static HixlStatus sock_io_all(int fd, void *buf, size_t n, uint64_t deadline_ns, bool out) {
  uint8_t *p = buf;
  while (n > 0) {
    struct pollfd pfd = {.fd = fd, .events = out ? POLLOUT : POLLIN};
    int left = ms_left(deadline_ns);
    if (left == 0) return hixl_fail(HIXL_TIMEOUT, "peer did not answer in time");
    int rc = poll(&pfd, 1, left);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return hixl_fail(HIXL_FAILED, "poll: %s", strerror(errno));
    if (rc == 0) continue;
    struct iovec iov = {p, n};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    ssize_t k = out ? sock_sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, n, MSG_DONTWAIT);
    if (!out && k > 0) sock_hb_received(fd);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (k < 0) return hixl_fail(HIXL_FAILED, "%s: %s", out ? "send" : "recv", strerror(errno));
    if (k == 0) return hixl_fail(HIXL_FAILED, "peer closed the connection");
    p += k;
    n -= (size_t)k;
  }
  return HIXL_SUCCESS;
}

HixlStatus sock_send_all(int fd, const void *buf, size_t n, uint64_t deadline_ns) {
  return sock_io_all(fd, (void *)buf, n, deadline_ns, true);
}

HixlStatus sock_recv_all(int fd, void *buf, size_t n, uint64_t deadline_ns) {
  return sock_io_all(fd, buf, n, deadline_ns, false);
}

int sock_if_addrs(uint32_t *out, size_t cap, bool loopback) {
  struct ifaddrs *ifs;
  size_t n = 0;
  if (getifaddrs(&ifs) < 0) return -1;
  for (struct ifaddrs *i = ifs; i && n < cap; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
        !(i->ifa_flags & IFF_LOOPBACK) != loopback)
      out[n++] = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
  freeifaddrs(ifs);
  return (int)n;
}
