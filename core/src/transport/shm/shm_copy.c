/* shm_copy: the data path: copies to and from the peer process, by memcpy or process_vm_*. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transport/shm/shm_int.h"
#include "util/log.h"
#include "util/sock.h"

/* Whether err means the peer process can no longer be reached at all. */
static bool fatal_errno(int err) { return err == ESRCH || err == EPERM || err == EACCES; }

/* The mapping holding all of [addr, addr + len) of the target, or NULL. */
static struct shm_map *map_of(struct shm_peer *s, uint64_t addr, uint64_t len) {
  return s->maps.count ? (struct shm_map *)memtab_hot(&s->maps, addr, len) : NULL;
}

/* The copy of one op where device memory is on either side, mp mapped here: by the
 * provider, device to device (both), or between device memory and the host memory on
 * the other side. */
static struct devmem_copy dev_desc(const struct shm_map *mp, const struct chunk *ch, const uint8_t *remote,
                                   bool write) {
  uint64_t rem = (uint64_t)(uintptr_t)remote, loc = (uint64_t)(uintptr_t)ch->laddr;
  int rdev = mp->dev ? mp->ipc->device : -1, ldev = ch->lreg->type == HIXL_MEM_DEVICE ? ch->lreg->device : -1;
  return write ? (struct devmem_copy){.dst = rem, .src = loc, .n = ch->len, .ddev = rdev, .sdev = ldev}
               : (struct devmem_copy){.dst = loc, .src = rem, .n = ch->len, .ddev = ldev, .sdev = rdev};
}

/* Device copies map_copy starts together, then waits for once (copy_many): ops next
 * to each other on both sides (an op split into chunks, runs of blocks that follow
 * each other) as one copy. Up to MAP_DEV_BATCH a wait, in arrays allocated for a run
 * of more than MAP_DEV_STACK ops (each wait costs a GPU tens of us, as much as copying
 * a few MiB), else (or out of memory) on the stack. */
#define MAP_DEV_BATCH 1024
#define MAP_DEV_STACK 64
struct dev_batch {
  struct devmem_copy *c;
  size_t *at; /* each one's first op */
  size_t n, cap;
  struct devmem_copy sc[MAP_DEV_STACK];
  size_t sat[MAP_DEV_STACK];
  const struct devmem_ops *dm;
  uint64_t ops, bytes; /* copied */
  uint32_t waits, batched, gathered;
};

/* c added to b: onto its last copy where c continues it on both sides. */
static void dev_add(struct dev_batch *b, struct devmem_copy c, size_t k) {
  struct devmem_copy *p = b->n ? &b->c[b->n - 1] : NULL;
  if (p && p->ddev == c.ddev && p->sdev == c.sdev && p->dst + p->n == c.dst && p->src + p->n == c.src) {
    p->n += c.n;
    return;
  }
  b->c[b->n] = c;
  b->at[b->n++] = k;
}

/* Copy b's ops; the first that failed (*bad, its status *fst, why), else *bad stays. */
static void dev_flush(struct dev_batch *b, size_t *bad, HixlStatus *fst, char *why, size_t cap) {
  size_t first = b->n;
  struct devmem_many ms = {0, 0, 0};
  HixlStatus st = HIXL_SUCCESS;
  if (b->n == 0) return;
  if (!b->dm) b->dm = devmem_get(why, cap);
  if (!b->dm)
    first = 0, st = HIXL_UNSUPPORTED;
  else
    st = devmem_copy_many(b->dm, b->c, b->n, &first, &ms, why, cap);
  b->waits += ms.waits;
  b->batched += ms.batched;
  b->gathered += ms.gathered;
  for (size_t i = 0; i < first; i++) b->bytes += b->c[i].n;
  b->ops += first;
  if (first < b->n && b->at[first] < *bad) {
    *bad = b->at[first];
    *fst = st;
  }
  b->n = 0;
}

/* The peer process was found gone after a copy: its link dies, msg says so. Lock held. */
static void peer_died(struct shm_peer *s, char *msg, size_t cap) {
  char why[64];
  snprintf(why, sizeof(why), "the peer process (pid %u) has exited", s->pid);
  if (s->conn) link_conn_kill(s->conn, HIXL_FAILED, why);
  snprintf(msg, cap, "link to %s: %s", s->name, why);
}

/* A copy inside mp begins: the mapping held, the lock released (Finalize waits for the
 * copies to end). Lock held on entry. */
static void map_begin(struct HixlEngine *e, struct shm_map *mp) {
  mp->refs++;
  eng_of(e)->copying++;
  engine_unlock(e);
}

/* ... and ends: the lock taken back, the mapping let go. Returns whether the peer
 * process is found gone afterwards (its pages outlive it: nothing faulted, but nobody
 * is there to read them); then its link is killed and msg says so. */
static bool map_end(struct HixlEngine *e, struct shm_peer *s, struct shm_map *mp, char *msg, size_t cap) {
  struct eshm_engine *x = eng_of(e);
  bool gone = eshm_peer_gone(s); /* after: a peer that died meanwhile read nothing */
  engine_lock(e);
  if (--x->copying == 0) engine_signal(e);
  eshm_map_put(s, mp);
  if (gone) peer_died(s, msg, cap);
  return gone;
}

/* memcpy v[0..n), all inside mp, with the lock released (device memory on either side:
 * the provider copies); the chunks end SUCCESS, or FAILED when the peer process is
 * found gone afterwards (map_end), or a device copy failed. Lock held on entry and
 * return. */
static void map_copy(struct HixlEngine *e, struct shm_peer *s, struct shm_map *mp, struct chunk *const *v,
                     const struct cma_seg *segs, size_t n, bool write) {
  HixlStatus fst = HIXL_SUCCESS;
  char dwhy[256]; /* these three: their first byte only (zeroing them took 8% of a 4 KiB op) */
  dwhy[0] = '\0';
  size_t bad = n; /* the first op whose device copy failed: it and those after it fail */
  struct dev_batch b;
  b.n = 0, b.dm = NULL, b.ops = b.bytes = 0, b.waits = b.batched = b.gathered = 0;
  b.c = b.sc, b.at = b.sat, b.cap = MAP_DEV_STACK;
  if (n > MAP_DEV_STACK && (mp->dev || v[0]->lreg->type == HIXL_MEM_DEVICE)) {
    size_t cap = n < MAP_DEV_BATCH ? n : MAP_DEV_BATCH;
    struct devmem_copy *c = malloc(cap * sizeof(*c));
    size_t *at = malloc(cap * sizeof(*at));
    if (c && at)
      b.c = c, b.at = at, b.cap = cap;
    else
      free(c), free(at);
  }
  map_begin(e, mp);
  for (size_t k = 0; k < n && bad == n; k++) {
    uint8_t *remote = mp->base + (segs[k].remote - mp->range.addr);
    if (mp->dev || v[k]->lreg->type == HIXL_MEM_DEVICE) {
      if (b.n == b.cap) dev_flush(&b, &bad, &fst, dwhy, sizeof(dwhy));
      if (bad == n) dev_add(&b, dev_desc(mp, v[k], remote, write), k);
    } else if (write) {
      memcpy(remote, segs[k].local, segs[k].len);
    } else {
      memcpy(segs[k].local, remote, segs[k].len);
    }
  }
  if (bad == n) dev_flush(&b, &bad, &fst, dwhy, sizeof(dwhy));
  if (b.c != b.sc) {
    free(b.c);
    free(b.at);
  }
  char msg[64 + sizeof(s->name) + 16];
  msg[0] = '\0';
  bool gone = map_end(e, s, mp, msg, sizeof(msg));
  if (!gone) {
    s->map_ops += bad;
    if (mp->dev) {
      struct hixl_devmem_stats *ds = engine_dev_stats(e);
      ds->ipc_bytes += b.bytes;
      ds->ipc_ops += b.ops;
      ds->ipc_waits += b.waits;
      ds->ipc_batched += b.batched;
      ds->ipc_gathered += b.gathered;
    }
  }
  char dmsg[sizeof(dwhy) + sizeof(s->name) + 96];
  dmsg[0] = '\0';
  if (!gone && bad < n) {
    snprintf(dmsg, sizeof(dmsg), "link to %s: device copy of [0x%llx, +%u) %s the peer: %s", s->name,
             (unsigned long long)segs[bad].remote, v[bad]->len, write ? "to" : "from", dwhy);
    log_warn("%s", dmsg);
  }
  for (size_t k = 0; k < n; k++) {
    if (gone)
      link_chunk_end(v[k], HIXL_FAILED, msg);
    else if (k >= bad) /* the one that failed, and those after it (not all tried) */
      link_chunk_end(v[k], k == bad ? fst : HIXL_FAILED, dmsg);
    else
      link_chunk_end(v[k], HIXL_SUCCESS, "");
  }
}

/* Whether s's process has exited, by its pidfd, before a copy by pid: the life word is
 * the target's own to write, and one that dies leaving it "alive" would make the copy
 * reach whichever process gets its pid next. The poll is a syscall (~0.4 us, a fifth of
 * a 4 KiB process_vm_readv), so it is asked at most once per tick of the coarse clock
 * (1-4 ms): a pid is given again only once it was waited for and the kernel went
 * through every other one, or by clone3's set_tid, which needs CAP_SYS_ADMIN over
 * this process's PID namespace (and with it this process). Any thread, unlocked. */
static bool pid_exited(struct shm_peer *s) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  uint64_t tick = (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
  if (__atomic_load_n(&s->pid_asked, __ATOMIC_RELAXED) == tick) return false;
  if (cma_pid_exited(s->pidfd)) return true;
  __atomic_store_n(&s->pid_asked, tick, __ATOMIC_RELAXED);
  return false;
}

/* Copy v[0..n) (chunks of one kind) to or from s's process with the lock released,
 * then end each chunk: by memcpy where the target's range is mapped here, else by
 * process_vm_*. A range the kernel refuses (EFAULT: unmapped on either side) fails
 * alone; a peer that is gone breaks the link and fails the rest. Lock held on entry
 * and on return; v's chunks must not be on any queue. */
static void shm_copy(struct HixlEngine *e, struct shm_peer *s, struct chunk *const *v, size_t n,
                     struct cma_seg *segs) {
  struct eshm_engine *x = eng_of(e);
  bool write = v[0]->kind == CHUNK_WRITE;
  const char *call = write ? "process_vm_writev" : "process_vm_readv";
  size_t pos = 0;
  for (size_t k = 0; k < n; k++) segs[k] = (struct cma_seg){v[k]->laddr, v[k]->raddr, v[k]->len};
  s->refs++;
  while (pos < n) {
    int err = 0;
    size_t bytes = 0;
    if (!s->conn) { /* the link died: Disconnect, Finalize, or the peer went away */
      while (pos < n) link_chunk_end(v[pos++], HIXL_FAILED, s->why);
      break;
    }
    /* A run of ops inside one mapping, or a run of ops outside every mapping. */
    struct shm_map *mp = map_of(s, segs[pos].remote, segs[pos].len);
    size_t end = pos + 1;
    while (end < n &&
           (mp ? memtab_find_near(&s->maps, &mp->range, segs[end].remote, segs[end].len) == &mp->range
               : map_of(s, segs[end].remote, segs[end].len) == NULL) &&
           (mp || v[end]->lreg->type != HIXL_MEM_DEVICE))
      end++;
    if (mp && mp->revoked) {
      char why[384];
      snprintf(why, sizeof(why), "%s freed [0x%llx, +%llu) (SHM_UNMAP): ops into it fail", s->name,
               (unsigned long long)mp->range.addr, (unsigned long long)mp->range.len);
      while (pos < end) link_chunk_end(v[pos++], HIXL_FAILED, why);
      continue;
    }
    if (mp) {
      map_copy(e, s, mp, v + pos, segs + pos, end - pos, write);
      pos = end;
      continue;
    }
    if (v[pos]->lreg->type == HIXL_MEM_DEVICE) { /* process_vm_* cannot reach device memory */
      char why[384];
      snprintf(why, sizeof(why),
               "%s's [0x%llx, +%u) is not mapped here: device memory moves only into mappings", s->name,
               (unsigned long long)v[pos]->raddr, v[pos]->len);
      link_chunk_end(v[pos++], HIXL_FAILED, why); /* a run of one: device chunks end runs */
      continue;
    }
    x->copying++;
    engine_unlock(e);
    if (eshm_peer_gone(s) || pid_exited(s))
      err = ESRCH;
    else
      bytes = cma_copy(s->pid, write, segs + pos, end - pos, &err);
    engine_lock(e);
    if (--x->copying == 0) engine_signal(e);
    for (; pos < end && bytes >= segs[pos].len; pos++) {
      bytes -= segs[pos].len;
      link_chunk_end(v[pos], HIXL_SUCCESS, "");
    }
    if (pos == end) continue;
    char why[384];
    if (!fatal_errno(err)) { /* this range only; the next ones may well work */
      snprintf(why, sizeof(why),
               "%s with pid %u failed on remote [0x%llx, +%u) / local %p: %s (memory unmapped on one side "
               "while registered?)",
               call, s->pid, (unsigned long long)v[pos]->raddr, v[pos]->len, (void *)v[pos]->laddr,
               strerror(err));
      log_warn("link to %s: %s", s->name, why);
      link_chunk_end(v[pos++], HIXL_FAILED, why);
      continue;
    }
    char msg[sizeof(why) + sizeof(s->name) + 16];
    if (err == ESRCH)
      snprintf(why, sizeof(why), "the peer process (pid %u) has exited (%s: no such process)", s->pid, call);
    else
      snprintf(why, sizeof(why), "%s on pid %u is no longer permitted: %s", call, s->pid, strerror(err));
    if (s->conn) link_conn_kill(s->conn, HIXL_FAILED, why);
    snprintf(msg, sizeof(msg), "link to %s: %s", s->name, why);
    while (pos < n) link_chunk_end(v[pos++], HIXL_FAILED, msg);
  }
  eshm_peer_put(s);
}

/* What ch counts for against a step's ESHM_STEP bytes. */
static size_t step_cost(const struct chunk *ch) {
  return ch->lreg && ch->lreg->type == HIXL_MEM_DEVICE ? ch->len / ESHM_DEV_WEIGHT : ch->len;
}

/* A sync request on an shm link: its caller copies it, step by step. Lock held. */
static void eshm_run_sync(struct conn *c, struct hixl_transfer_req *r) {
  struct HixlEngine *e = link_engine(c);
  struct shm_peer *s = link_of(c)->peer; /* c may die while a copy runs: only s from here on */
  struct chunk *vbuf[16], **v = vbuf;
  struct cma_seg sbuf[16], *segs = sbuf;
  uint32_t nd;
  struct chunk *chunks = link_req_direct(r, &nd); /* staged units go on the socket */
  size_t n = nd, i = 0;
  if (n > 16) {
    v = malloc(n * sizeof(*v));
    segs = malloc(n * sizeof(*segs));
    if (!v || !segs) {
      free(v);
      free(segs);
      for (size_t k = 0; k < n; k++) link_chunk_end(&chunks[k], HIXL_RESOURCE_EXHAUSTED, "out of memory");
      return;
    }
  }
  s->refs++;
  while (i < n) {
    size_t j = i, bytes = 0;
    /* Not before the first step: the caller set the deadline (>= 1 ms ahead) just now. */
    if (i > 0 && hixl_now_ns() >= link_req_deadline(r)) {
      while (i < n) link_chunk_end(&chunks[i++], HIXL_TIMEOUT, "request timed out before it was copied");
      break;
    }
    for (; j < n && (j == i || bytes + step_cost(&chunks[j]) <= ESHM_STEP); j++) {
      v[j - i] = &chunks[j];
      bytes += step_cost(&chunks[j]);
    }
    shm_copy(e, s, v, j - i, segs);
    i = j;
  }
  eshm_peer_put(s);
  if (v != vbuf) {
    free(v);
    free(segs);
  }
}

/* At most this many ops a sync call copies with no request (eshm_copy_now). */
#define ESHM_NOW_OPS 16u
/* At most this many bytes it copies with the lock held: releasing and taking it back,
 * with the mapping and registrations held across, cost about as much as a 4 KiB
 * memcpy (15-20% of a 4 KiB op); a copy this short holds up other threads less. */
#define ESHM_NOW_LOCKED (16u << 10)

/* A sync call's ops (each at most ENGINE_TCP_CHUNK, host memory here) copied right here,
 * with no request, chunk or clock, when they all lie inside one live mapping of the
 * peer's host memory: a memcpy each, with the lock released as map_copy's unless they
 * are ESHM_NOW_LOCKED bytes or fewer. Else false and nothing done (process_vm_*, device
 * memory, a revoked mapping, several mappings: the request path, which splits them into
 * runs). Lock held. */
bool eshm_copy_now(struct conn *c, HixlTransferOp op, const HixlTransferOpDesc *descs, size_t n,
                   struct hixl_mem_reg *const *lregs, HixlStatus *st, char *why, size_t cap) {
  struct eshm_link *l = link_of(c);
  struct shm_peer *s = l ? l->peer : NULL;
  if (n > ESHM_NOW_OPS || !s || !s->conn || link_dead(c)) return false;
  struct shm_map *mp = map_of(s, descs[0].remote_addr, descs[0].len);
  if (!mp || mp->revoked || mp->dev) return false;
  for (size_t i = 0; i < n; i++)
    if (lregs[i]->type == HIXL_MEM_DEVICE ||
        (i > 0 && memtab_find_near(&s->maps, &mp->range, descs[i].remote_addr, descs[i].len) != &mp->range))
      return false;
  struct HixlEngine *e = link_engine(c);
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; i++) bytes += descs[i].len;
  bool held = bytes <= ESHM_NOW_LOCKED; /* nothing can be deregistered or unmapped meanwhile */
  s->refs++;
  if (!held) {
    for (size_t i = 0; i < n; i++) lregs[i]->inflight++; /* not deregistered meanwhile */
    map_begin(e, mp);
  }
  for (size_t i = 0; i < n; i++) {
    uint8_t *remote = mp->base + (descs[i].remote_addr - mp->range.addr);
    void *local = (void *)(uintptr_t)descs[i].local_addr;
    if (op == HIXL_WRITE)
      memcpy(remote, local, descs[i].len);
    else
      memcpy(local, remote, descs[i].len);
  }
  bool gone;
  if (held) {
    if ((gone = eshm_peer_gone(s))) peer_died(s, why, cap);
  } else {
    gone = map_end(e, s, mp, why, cap);
    for (size_t i = 0; i < n; i++) lregs[i]->inflight--;
  }
  if (!gone) s->map_ops += n, s->now_ops += n;
  eshm_peer_put(s);
  *st = gone ? HIXL_FAILED : HIXL_SUCCESS;
  return true;
}

/* An async request on an shm link: copied here when small and nothing waits before
 * it, else queued for the progress thread. Lock held; c is not used after a copy. */
void eshm_async(struct conn *c, struct hixl_transfer_req *r) {
  struct eshm_link *l = link_of(c);
  uint64_t bytes = 0;
  uint32_t nd;
  if (link_dead(c)) return;               /* died as r started: transfer_submit ended its chunks */
  if (link_req_staged(r)) link_unpark(c); /* staged units: their answers need a reader */
  struct chunk *chunks = link_req_direct(r, &nd);
  for (uint32_t k = 0; k < nd; k++) bytes += chunks[k].len;
  if (nd == 0) return; /* all staged: they go on the socket */
  if (!l->sq_head && bytes <= ESHM_CALLER_COPY && nd <= 16) {
    eshm_run_sync(c, r);
    return;
  }
  for (uint32_t k = 0; k < nd; k++) {
    struct chunk *ch = &chunks[k];
    ch->next_pending = NULL;
    if (l->sq_tail)
      l->sq_tail->next_pending = ch;
    else
      l->sq_head = ch;
    l->sq_tail = ch;
  }
  eng_of(link_engine(c))->queued += nd;
  link_wake(link_engine(c));
}

/* A sync caller copies its request itself; staged units' answers come on the socket. */
void eshm_drive(struct conn *c, struct hixl_transfer_req *r) {
  uint32_t nd;
  if (link_dead(c)) return; /* died as r started: transfer_submit ended its chunks */
  if (link_req_staged(r)) link_unpark(c);
  link_req_direct(r, &nd);
  if (nd > 0) eshm_run_sync(c, r); /* c may be gone afterwards */
}

/* Progress thread, between event batches: one step for each link with queued work.
 * Returns whether work is left (the thread then polls instead of sleeping). Lock
 * held; released during each copy. */
bool eshm_progress(struct HixlEngine *e) {
  struct chunk *v[ESHM_STEP_CHUNKS];
  struct cma_seg segs[ESHM_STEP_CHUNKS];
  struct eshm_engine *x = eng_of(e);
  if (!x || x->queued == 0) return false;
  uint64_t round = ++x->round;
  for (;;) {
    /* Links die and come while a copy runs (lock released): look again from the head
     * every time; a link this round served is marked. */
    struct eshm_link *l = x->links;
    while (l && (!l->sq_head || l->turn == round)) l = l->next;
    if (!l) break;
    l->turn = round;
    size_t n = 0, bytes = 0;
    uint64_t now = hixl_now_ns();
    while (l->sq_head && n < ESHM_STEP_CHUNKS && bytes < ESHM_STEP) {
      struct chunk *ch = l->sq_head;
      if (n > 0 && ch->kind != v[0]->kind) break;
      if (!(l->sq_head = ch->next_pending)) l->sq_tail = NULL;
      x->queued--;
      if (link_req_cancelled(ch->req) || now >= link_req_deadline(ch->req)) {
        link_chunk_end(ch, HIXL_TIMEOUT, "request timed out before it was copied");
        continue;
      }
      v[n++] = ch;
      bytes += step_cost(ch);
    }
    if (n > 0) shm_copy(e, l->peer, v, n, segs);
  }
  return x->queued > 0;
}

void eshm_post(struct conn *c, struct chunk *ch) {
  (void)c, (void)ch; /* copied from the request's chunks by drive or async: no frame, no queue yet */
}

bool eshm_dev_reach(struct conn *c, const struct hixl_mem_reg *lreg, const struct remote_mem *rm,
                    uint64_t raddr, uint64_t len) {
  struct eshm_link *l = link_of(c);
  struct shm_map *mp = l && l->peer ? map_of(l->peer, raddr, len) : NULL;
  /* The peer's range mapped here: its device memory by IPC handle (any local side), or its
   * memfd with device memory on this side. */
  if (mp && !mp->revoked && (mp->dev || (lreg && lreg->type == HIXL_MEM_DEVICE))) return true;
  if (l && !l->dev_told) {
    l->dev_told = true;
    log_info("link to %s: device ops on [0x%llx, +%llu) go as tcp frames on its socket: %s", link_remote(c),
             (unsigned long long)raddr, (unsigned long long)len,
             rm && rm->kind == WIRE_MEM_DEVICE ? "the peer did not hand that device memory over by IPC handle"
                                               : "the peer's host memory there is not mapped here");
  }
  return false;
}
