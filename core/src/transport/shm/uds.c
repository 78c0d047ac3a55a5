/* uds: abstract unix sockets passing one descriptor per message; see uds.h. */
#include "transport/shm/uds.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

static socklen_t uds_addr(struct sockaddr_un *sa, const char *name, size_t len) {
  memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  memcpy(sa->sun_path + 1, name, len); /* sun_path[0] = 0: the abstract namespace */
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
}

int uds_listen(char *name, size_t cap) {
  uint64_t r;
  struct sockaddr_un sa;
  if (cap < 40 || getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
    errno = cap < 40 ? EINVAL : errno;
    return -1;
  }
  int n = snprintf(name, cap, "hixl-%ld-%016" PRIx64, (long)getpid(), r);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (bind(fd, (struct sockaddr *)&sa, uds_addr(&sa, name, (size_t)n)) < 0 || listen(fd, 4) < 0) {
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

int uds_connect(const char *name, size_t len, int timeout_ms) {
  struct sockaddr_un sa;
  /* A full backlog makes connect(2) wait, as long as the send timeout allows. */
  struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
  if (len == 0 || len > UDS_NAME_MAX || timeout_ms <= 0) {
    errno = timeout_ms <= 0 ? ETIMEDOUT : EINVAL;
    return -1;
  }
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  socklen_t sl = uds_addr(&sa, name, len);
  int rc = setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  while (rc == 0 && (rc = connect(fd, (struct sockaddr *)&sa, sl)) < 0 && errno == EINTR) {
  }
  if (rc < 0) {
    int saved = errno == EAGAIN ? ETIMEDOUT : errno;
    close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

int uds_send(int sock, const void *data, size_t len) {
  ssize_t k;
  while ((k = send(sock, data, len, MSG_DONTWAIT | MSG_NOSIGNAL)) < 0 && errno == EINTR) {
  }
  if (k < 0) return -1;
  if ((size_t)k != len) {
    errno = EPROTO;
    return -1;
  }
  return 0;
}

int uds_send_fd(int sock, const void *data, size_t len, int fd) {
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } u;
  struct iovec iov = {(void *)data, len};
  struct msghdr mh = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
  memset(&u, 0, sizeof(u));
  struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int));
  ssize_t k;
  while ((k = sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL)) < 0 && errno == EINTR) {
  }
  if (k < 0) return -1;
  if ((size_t)k != len) { /* a SOCK_SEQPACKET message goes whole or not at all */
    errno = EPROTO;
    return -1;
  }
  return 0;
}

/* One message of exactly len bytes, with one descriptor (fd not NULL) or none. */
static int recv_msg(int sock, void *data, size_t len, int *fd, int timeout_ms) {
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(4 * sizeof(int))];
  } u;
  struct iovec iov = {data, len};
  struct msghdr mh = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
  struct pollfd p = {.fd = sock, .events = POLLIN};
  int mine = -1, *out = fd ? fd : &mine;
  *out = -1;
  int n;
  while ((n = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
  }
  if (n < 0) return -1;
  if (n == 0) {
    errno = ETIMEDOUT;
    return -1;
  }
  ssize_t k;
  while ((k = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
  }
  if (k < 0) {
    if (errno == EAGAIN) errno = ETIMEDOUT;
    return -1;
  }
  /* Take every descriptor that came, so none leaks, then judge the message. */
  int got = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < nfd; i++) {
      int f;
      memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (got++ == 0)
        *out = f;
      else
        close(f);
    }
  }
  if (k == 0 && got == 0) {
    errno = ECONNRESET; /* the peer closed its end */
    return -1;
  }
  if ((size_t)k != len || got != (fd ? 1 : 0) || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
    if (*out >= 0) close(*out);
    *out = -1;
    errno = EPROTO;
    return -1;
  }
  return 0;
}

int uds_recv_fd(int sock, void *data, size_t len, int *fd, int timeout_ms) {
  return recv_msg(sock, data, len, fd, timeout_ms);
}

int uds_recv(int sock, void *data, size_t len, int timeout_ms) {
  return recv_msg(sock, data, len, NULL, timeout_ms);
}

int uds_peer(int sock, uint32_t *pid, uint32_t *uid) {
  struct ucred cr;
  socklen_t l = sizeof(cr);
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &l) < 0) return -1;
  *pid = (uint32_t)cr.pid;
  *uid = (uint32_t)cr.uid;
  return 0;
}
