/* mh_wire: the router's framed protocol: length-prefixed frames of big-endian fields,
 * parsed whole before anything acts on them. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mh.h"

#define MH_MAGIC   0x48584d48u /* "HXMH" */
#define MH_VERSION 1u

uint64_t mh_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts); /* system-wide: comparable across the processes */
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *mh_status_name(hixl_kv_status st) {
  switch (st) {
  case HIXL_KV_SUCCESS: return "SUCCESS";
  case HIXL_KV_PARAM_INVALID: return "PARAM_INVALID";
  case HIXL_KV_TIMEOUT: return "TIMEOUT";
  case HIXL_KV_NOT_CONNECTED: return "NOT_CONNECTED";
  case HIXL_KV_UNSUPPORTED: return "UNSUPPORTED";
  case HIXL_KV_NOT_FOUND: return "NOT_FOUND";
  case HIXL_KV_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
  case HIXL_KV_FAILED: return "FAILED";
  default: return "UNKNOWN";
  }
}

static void put_raw(struct mh_out *o, const void *p, size_t n) {
  if (o->bad) return;
  if (o->len + n > o->cap) {
    size_t cap = o->cap ? o->cap : 64;
    while (cap < o->len + n) cap *= 2;
    uint8_t *q = realloc(o->p, cap);
    if (!q) {
      o->bad = true;
      return;
    }
    o->p = q;
    o->cap = cap;
  }
  if (n) memcpy(o->p + o->len, p, n);
  o->len += n;
}

void mh_put_u8(struct mh_out *o, uint8_t v) { put_raw(o, &v, 1); }

void mh_put_u32(struct mh_out *o, uint32_t v) {
  uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
  put_raw(o, b, 4);
}

void mh_put_u64(struct mh_out *o, uint64_t v) {
  mh_put_u32(o, (uint32_t)(v >> 32));
  mh_put_u32(o, (uint32_t)v);
}

void mh_put_str(struct mh_out *o, const void *s, size_t n) {
  mh_put_u32(o, (uint32_t)n);
  put_raw(o, s, n);
}

static const uint8_t *get_raw(struct mh_in *in, size_t n) {
  if (in->bad || in->len - in->off < n) {
    in->bad = true;
    return NULL;
  }
  const uint8_t *p = in->p + in->off;
  in->off += n;
  return p;
}

uint8_t mh_get_u8(struct mh_in *in) {
  const uint8_t *p = get_raw(in, 1);
  return p ? p[0] : 0;
}

uint32_t mh_get_u32(struct mh_in *in) {
  const uint8_t *p = get_raw(in, 4);
  return p ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3] : 0;
}

uint64_t mh_get_u64(struct mh_in *in) {
  uint64_t hi = mh_get_u32(in);
  return hi << 32 | mh_get_u32(in);
}

const char *mh_get_str(struct mh_in *in, size_t *n) {
  uint32_t len = mh_get_u32(in);
  const uint8_t *p = get_raw(in, len);
  *n = p ? len : 0;
  return p ? (const char *)p : "";
}

bool mh_in_done(const struct mh_in *in) { return !in->bad && in->off == in->len; }

int mh_send(int fd, uint8_t type, struct mh_out *o) { return mh_send_fd(fd, type, o, -1); }

int mh_send_fd(int fd, uint8_t type, struct mh_out *o, int pass) {
  struct mh_out f = {0};
  mh_put_u32(&f, MH_MAGIC);
  mh_put_u8(&f, MH_VERSION);
  mh_put_u8(&f, type);
  mh_put_u8(&f, 0);
  mh_put_u8(&f, 0);
  mh_put_u32(&f, (uint32_t)o->len);
  put_raw(&f, o->p, o->len);
  int rc = 0;
  if (f.bad || o->bad || o->len > MH_FRAME_MAX) {
    fprintf(stderr, "mock-host: frame type %u of %zu bytes not sent (out of memory or too large)\n", type,
            o->len);
    rc = -1;
  }
  for (size_t off = 0; rc == 0 && off < f.len;) {
    ssize_t n;
    if (off == 0 && pass >= 0) { /* the descriptor rides with the frame's first bytes */
      union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
      } ctl = {0};
      struct iovec iov = {f.p, f.len};
      struct msghdr mh = {
          .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
      struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(cm), &pass, sizeof(int));
      n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    } else {
      n = write(fd, f.p + off, f.len - off);
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) { /* the peer reads slowly: wait, not forever */
      struct pollfd pfd = {fd, POLLOUT, 0};
      if (poll(&pfd, 1, 30000) > 0) continue;
      fprintf(stderr, "mock-host: the peer has not read for 30 s; frame type %u dropped\n", type);
    }
    if (n <= 0) {
      rc = -1; /* EPIPE: the peer is gone; the caller notices at its next read */
      break;
    }
    off += (size_t)n;
  }
  free(f.p);
  free(o->p);
  memset(o, 0, sizeof(*o));
  return rc;
}

void mh_conn_init(struct mh_conn *c, int fd) {
  memset(c, 0, sizeof(*c));
  c->fd = fd;
}

void mh_conn_fini(struct mh_conn *c) {
  free(c->buf);
  memset(c, 0, sizeof(*c));
  c->fd = -1;
}

int mh_conn_fill(struct mh_conn *c) { return mh_conn_fill_fd(c, NULL); }

/* One read: read(2), or with got recvmsg(2), taking a descriptor that came with the
 * bytes (one at most: a second is closed). */
static ssize_t read_some(struct mh_conn *c, int *got) {
  if (!got) return read(c->fd, c->buf + c->len, c->cap - c->len);
  union {
    struct cmsghdr h;
    char b[CMSG_SPACE(sizeof(int))];
  } ctl;
  struct iovec iov = {c->buf + c->len, c->cap - c->len};
  struct msghdr mh = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
  ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
  for (struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; cm; cm = CMSG_NXTHDR(&mh, cm)) {
    int fd;
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS || cm->cmsg_len != CMSG_LEN(sizeof(int)))
      continue;
    memcpy(&fd, CMSG_DATA(cm), sizeof(int));
    if (*got < 0)
      *got = fd;
    else
      close(fd);
  }
  return n;
}

int mh_conn_fill_fd(struct mh_conn *c, int *got) {
  for (;;) {
    if (c->start > 0 && c->start == c->len) c->start = c->len = 0;
    if (c->cap - c->len < 4096) {
      if (c->start > 0) { /* compact before growing */
        memmove(c->buf, c->buf + c->start, c->len - c->start);
        c->len -= c->start;
        c->start = 0;
      }
      if (c->cap - c->len < 4096) {
        size_t cap = c->cap ? c->cap * 2 : 16384;
        uint8_t *b = realloc(c->buf, cap);
        if (!b) return -1;
        c->buf = b;
        c->cap = cap;
      }
    }
    ssize_t n = read_some(c, got);
    if (n > 0) {
      c->len += (size_t)n;
      continue;
    }
    if (n == 0) {
      c->eof = true;
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    c->eof = true;
    return -1;
  }
}

int mh_conn_next(struct mh_conn *c, uint8_t *type, struct mh_in *payload) {
  size_t avail = c->len - c->start;
  if (avail < MH_HDR_LEN) return 0;
  struct mh_in h = {c->buf + c->start, MH_HDR_LEN, 0, false};
  uint32_t magic = mh_get_u32(&h);
  uint8_t version = mh_get_u8(&h), t = mh_get_u8(&h), r0 = mh_get_u8(&h), r1 = mh_get_u8(&h);
  uint32_t len = mh_get_u32(&h);
  if (magic != MH_MAGIC || version != MH_VERSION || t == 0 || t >= MH_TYPE_MAX || r0 || r1 ||
      len > MH_FRAME_MAX) {
    fprintf(stderr, "mock-host: malformed frame (magic 0x%08x version %u type %u length %u)\n", magic,
            version, t, len);
    return -1;
  }
  if (avail < MH_HDR_LEN + len) return 0;
  *type = t;
  *payload = (struct mh_in){c->buf + c->start + MH_HDR_LEN, len, 0, false};
  c->start += MH_HDR_LEN + len;
  return 1;
}

void mh_put_stats(struct mh_out *o, const hixl_kv_stats *s) {
  mh_put_u64(o, s->blocks_held);
  mh_put_u64(o, s->requests_held);
  mh_put_u64(o, s->loads_done);
  mh_put_u64(o, s->loads_failed);
  mh_put_u64(o, s->lease_expired);
  mh_put_u64(o, s->bytes_loaded);
  mh_put_u64(o, s->engine_ops);
  mh_put_u64(o, s->lookups);
  mh_put_u64(o, s->pushes_done);
  mh_put_u64(o, s->pushes_failed);
  mh_put_u64(o, s->layers_pushed);
}

void mh_get_stats(struct mh_in *in, hixl_kv_stats *s) {
  s->blocks_held = mh_get_u64(in);
  s->requests_held = mh_get_u64(in);
  s->loads_done = mh_get_u64(in);
  s->loads_failed = mh_get_u64(in);
  s->lease_expired = mh_get_u64(in);
  s->bytes_loaded = mh_get_u64(in);
  s->engine_ops = mh_get_u64(in);
  s->lookups = mh_get_u64(in);
  s->pushes_done = mh_get_u64(in);
  s->pushes_failed = mh_get_u64(in);
  s->layers_pushed = mh_get_u64(in);
}

void mh_put_side(struct mh_out *o, const struct mh_side *s) {
  mh_put_u64(o, s->blocks_total);
  mh_put_u64(o, s->blocks_free);
  mh_put_u32(o, s->requests_left);
  mh_put_u8(o, s->stats_ok);
  mh_put_stats(o, &s->ks);
  mh_put_u32(o, s->tp);
  mh_put_u32(o, s->twice);
  for (uint32_t r = 0; r < s->tp && r < MH_MAX_TP; r++) {
    mh_put_u8(o, s->rk[r].alive);
    mh_put_u8(o, s->rk[r].stats_ok);
    mh_put_stats(o, &s->rk[r].ks);
  }
  mh_put_u64(o, s->ipc_bytes);
  mh_put_u64(o, s->rdma_bytes);
}

void mh_get_side(struct mh_in *in, struct mh_side *s) {
  memset(s, 0, sizeof(*s));
  s->blocks_total = mh_get_u64(in);
  s->blocks_free = mh_get_u64(in);
  s->requests_left = mh_get_u32(in);
  s->stats_ok = mh_get_u8(in);
  mh_get_stats(in, &s->ks);
  s->tp = mh_get_u32(in);
  s->twice = mh_get_u32(in);
  if (s->tp == 0 || s->tp > MH_MAX_TP) {
    in->bad = true;
    return;
  }
  for (uint32_t r = 0; r < s->tp; r++) {
    s->rk[r].alive = mh_get_u8(in);
    s->rk[r].stats_ok = mh_get_u8(in);
    mh_get_stats(in, &s->rk[r].ks);
  }
  s->ipc_bytes = mh_get_u64(in);
  s->rdma_bytes = mh_get_u64(in);
}

void mh_put_work(struct mh_out *o, const struct mh_work *w) {
  mh_put_u64(o, w->seed);
  mh_put_u64(o, w->prompt);
  mh_put_u32(o, (uint32_t)w->nblocks);
  for (uint64_t i = 0; i < w->nblocks; i++) mh_put_u64(o, w->blocks[i]);
}

bool mh_get_work(struct mh_in *in, struct mh_work *w, uint64_t **blocks) {
  w->seed = mh_get_u64(in);
  w->prompt = mh_get_u64(in);
  w->nblocks = mh_get_u32(in);
  *blocks = NULL;
  if (in->bad || w->nblocks > (in->len - in->off) / 8) { /* more than the frame holds */
    in->bad = true;
    return false;
  }
  if (!(*blocks = malloc((w->nblocks ? w->nblocks : 1) * sizeof(**blocks)))) {
    in->bad = true;
    return false;
  }
  for (uint64_t i = 0; i < w->nblocks; i++) (*blocks)[i] = mh_get_u64(in);
  w->blocks = *blocks;
  return !in->bad;
}
