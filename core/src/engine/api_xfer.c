/* api_xfer: transfers: requests and their wait, a batch planned and submitted, sync, async, then a call. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/api_int.h"
#include "engine/stage.h"
#include "util/sock.h"
#include "util/status_int.h"

/* ---- transfers ---- */

/* Batches of at most this many ops plan on the stack (transfer_submit). */
#define SMALL_BATCH 16
/* A call's ops, each counted in ENGINE_TCP_CHUNK pieces rounded up, at most this many
 * (1 TiB): its chunks, staged units (a unit is 1 MiB or more) and their ranges are one
 * allocation each, counted from the lengths alone before anything is allocated. Else
 * one op of 2^50 bytes from memory registered on neither side (staged) would allocate
 * and fill ~47 GB of units. */
#define XFER_MAX_CHUNKS (1u << 20)

/* Whether a request timing out had to reset a link (RDMA work requests posted). */
static bool mods_req_timeout(HixlEngine *e, struct hixl_transfer_req *r) {
  bool reset = false;
  for (int i = 0; i < XPORT_MODS; i++) reset |= e->mods[i]->link.req_timeout(e, r);
  return reset;
}

struct hixl_transfer_req *api_req_new(HixlEngine *e, uint32_t nchunks, uint64_t deadline_ns) {
  /* The request and its chunks in one allocation (one calloc a TransferSync, not two). */
  size_t head = (sizeof(struct hixl_transfer_req) + _Alignof(struct chunk) - 1) / _Alignof(struct chunk) *
                _Alignof(struct chunk);
  if (nchunks > (SIZE_MAX - head) / sizeof(struct chunk)) return NULL;
  struct hixl_transfer_req *r = calloc(1, head + (size_t)nchunks * sizeof(struct chunk));
  if (!r) return NULL;
  r->chunks = (struct chunk *)((char *)r + head);
  r->eng = e;
  r->nchunks = r->outstanding = r->ndirect = nchunks;
  r->user_holds = true;
  r->deadline_ns = deadline_ns;
  return r;
}

/* At cancelled r's deadline: its device READs not answered yet give their pool buffer
 * back (a late answer is dropped), as stage_cancel does a socket unit's, and those still
 * waiting for one leave without it; one whose answer is landing or being copied to the
 * device keeps it until that ends. Else a peer that stops answering kept them, and with
 * a few such peers the pool, from every other. */
static void req_drop_bounces(struct hixl_transfer_req *r) {
  for (uint32_t i = 0; i < r->nchunks; i++) {
    struct chunk *ch = &r->chunks[i];
    if (ch->kind != CHUNK_READ) continue;
    if (ch->dj && ch->dj->kind == DJ_ASK && ch->dj->needs_buf) {
      /* Still waiting for a buffer: its frame goes without one (the answer is dropped),
       * rather than take one later for an answer nobody waits for. */
      struct conn *c = ch->dj->c;
      ch->tx.unready = false;
      link_devq_drop(r->eng, ch->dj);
      link_flush(c);
    } else if (ch->bounce && !ch->dj && !ch->landing) {
      link_devbuf_put(r->eng, ch->bounce);
      ch->bounce = NULL;
    }
  }
}

/* r is given up before it ended (its deadline passed, or the call failed after it
 * started), whatever the call reports: its staged units still waiting end (returns how
 * many), the rest are cancelled (late answers dropped), its pool and bounce buffers come
 * back, and a link holding its RDMA work requests is reset (*reset), so that nothing of
 * it touches the caller's memory, or holds a pool, after the call returns. Before, a
 * batch whose staged units starved (RESOURCE_EXHAUSTED) skipped the last two: its device
 * READs kept their bounce buffers until the peer answered, and an RDMA READ could land
 * in memory the caller had taken back. *left: its chunks still unanswered. Lock held. */
static uint32_t req_abandon(HixlEngine *e, struct hixl_transfer_req *r, uint32_t *left, bool *reset) {
  uint32_t starved = stage_cancel(r);
  *left = r->outstanding;
  r->cancelled = true;
  link_req_let_go(r);
  req_drop_bounces(r);
  *reset = mods_req_timeout(e, r);
  return starved;
}

/* Wait for a request the caller holds, then let go of it. Lock held. */
HixlStatus api_req_wait(HixlEngine *e, struct conn *c, struct hixl_transfer_req *r, const char *fn,
                        const char *remote) {
  HixlStatus st = HIXL_SUCCESS;
  /* Receive our own answers when nobody else is; an async request's data was handed to
   * its transport already (shm would copy it twice). */
  if (c && !r->is_async && !r->railed) link_drive(c, r);
  if (c && r->railed && !c->dead) link_unpark(c); /* the progress thread reads every rail */
  while (r->outstanding > 0)
    if (engine_cond_wait(e, r->deadline_ns) == ETIMEDOUT) break;
  uint32_t starved = 0, left = 0;
  bool reset = false;
  if (r->outstanding > 0) starved = req_abandon(e, r, &left, &reset);
  if (starved > 0) {
    st = stage_exhausted(e, fn, starved, remote, reset);
    link_then_cancel(r, st, "the transfer before it found no staging buffer");
  } else if (left > 0) {
    st = hixl_fail(HIXL_TIMEOUT, "%s: %u of %u chunks to %s unanswered at the deadline%s", fn, left,
                   r->nchunks + (r->then ? 1u : 0u), remote,
                   reset ? "; RDMA work requests were still posted, so the link was reset (Connect again)"
                         : "");
    link_then_cancel(r, HIXL_TIMEOUT, "the transfer before it timed out");
  } else if (r->status != HIXL_SUCCESS) {
    st = hixl_fail(r->status, "%s: %s", fn, r->err);
  }
  r->user_holds = false;
  link_req_maybe_free(r);
  return st;
}

/* Index of the first op whose remote range the peer has not advertised, or count. */
/* Look every op's remote range up in the peer's table (rms[i], NULL when it is not
 * inside one advertised registration); returns how many missed. */
static size_t remote_lookup(struct conn *c, const HixlTransferOpDesc *descs, size_t count,
                            const struct remote_mem **rms) {
  size_t miss = 0;
  struct memtab *t = link_rtab(c); /* c's own table (each rail's link has one): its keys */
  for (size_t i = 0; i < count; i++) {
    if (i == 0) /* the first op tries where the call before's fell */
      rms[i] = (const struct remote_mem *)memtab_hot(t, descs[i].remote_addr, descs[i].len);
    else
      rms[i] = (const struct remote_mem *)memtab_find_near(t, rms[i - 1] ? &rms[i - 1]->range : NULL,
                                                           descs[i].remote_addr, descs[i].len);
    miss += !rms[i];
  }
  return miss;
}

/* One SYNC round trip on c: when it returns, every MEM_ADD / MEM_DEL the peer queued
 * before answering has been applied. Lock held; released while waiting. */
HixlStatus api_link_sync(HixlEngine *e, struct conn *c, uint64_t deadline, const char *fn,
                         const char *remote) {
  struct hixl_transfer_req *r = api_req_new(e, 1, deadline);
  if (!r) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  struct chunk *ch = r->chunks;
  ch->req = r;
  ch->kind = CHUNK_SYNC;
  ch->seq = c->next_seq++;
  ch->tx.chunk = ch;
  ch->tx.hdr_len = (uint32_t)wire_put_sync(ch->tx.hdr, ch->seq);
  link_enqueue(c, &ch->tx);
  link_flush(c);
  return api_req_wait(e, c, r, fn, remote);
}

/* How a batch moves: ops straight between registrations (direct, split into chunks of
 * ENGINE_TCP_CHUNK) and staged ops packed into units (stage.c). */
struct xfer_plan {
  uint64_t ndirect; /* chunks */
  uint64_t nsock;   /* chunks of device memory on the socket of a link whose transport does not move it */
  struct stage_plan stage;
};

/* Whether an op touches device memory (here, or at the peer). */
static bool op_device(const struct hixl_mem_reg *lreg, const struct remote_mem *rm) {
  return (lreg && lreg->type == HIXL_MEM_DEVICE) || (rm && rm->kind == WIRE_MEM_DEVICE);
}

/* Whether a direct op goes as tcp frames on c's socket, whatever moves c's other data:
 * device memory on a link whose transport neither moves it through host buffers nor
 * copies it itself (shm: mapped by IPC handle), or a range c's transport cannot reach
 * by itself (a scoped peer's memory outside the windows it opened). */
static bool op_on_socket(struct conn *c, const struct hixl_mem_reg *lreg, const struct remote_mem *rm,
                         const HixlTransferOpDesc *d) {
  if (op_device(lreg, rm))
    return !(c->xp->flags & XPORT_DEVMEM) && !c->xp->link.dev_reach(c, lreg, rm, d->remote_addr, d->len);
  return !c->xp->link.reach(c, rm, d->remote_addr, d->len);
}

/* Decide every op, fill lregs (NULL: staged) and the plan; nothing is sent. rms[i]:
 * the peer's registration holding op i's remote range, or NULL. An op is
 * staged when its local or remote range is not registered, or when it is short
 * enough to pack (StagingThreshold) on a link whose transport packs. Lock held. */
static HixlStatus plan_ops(HixlEngine *e, struct conn *c, const HixlTransferOpDesc *descs, size_t count,
                           const char *fn, const char *remote, const struct remote_mem *const *rms,
                           struct hixl_mem_reg **lregs, struct xfer_plan *plan) {
  bool pack = stage_packs(c);
  uint32_t threshold = stage_threshold(c);
  HixlStatus st;
  memset(plan, 0, sizeof(*plan));
  for (size_t i = 0; i < count; i++) {
    const HixlTransferOpDesc *d = &descs[i];
    if (i == 0) /* where the call before's fell, first */
      lregs[i] = (struct hixl_mem_reg *)memtab_hot(&e->regs, d->local_addr, d->len);
    else
      lregs[i] = (struct hixl_mem_reg *)memtab_find_near(&e->regs, lregs[i - 1] ? &lregs[i - 1]->range : NULL,
                                                         d->local_addr, d->len);
    bool rreg = rms[i] != NULL;
    if (op_device(lregs[i], rms[i])) {
      /* Device memory moves only directly: through host buffers by the link's transport
       * when it does that (tcp), by the transport's own copies where it reaches the range
       * (shm: mapped by IPC handle), else as tcp frames on the link's socket. */
      if (!lregs[i] || !rreg)
        return hixl_fail(
            HIXL_PARAM_INVALID,
            "%s: op %zu touches device memory, which moves only between registered ranges (its %s "
            "range is not inside one)",
            fn, i, lregs[i] ? "remote" : "local");
      uint64_t n = (d->len + ENGINE_TCP_CHUNK - 1) / ENGINE_TCP_CHUNK;
      *(op_on_socket(c, lregs[i], rms[i], d) ? &plan->nsock : &plan->ndirect) += n;
      continue;
    }
    if (lregs[i] && rreg && !(pack && d->len < threshold)) {
      uint64_t n = (d->len + ENGINE_TCP_CHUNK - 1) / ENGINE_TCP_CHUNK;
      *(op_on_socket(c, lregs[i], rms[i], d) ? &plan->nsock : &plan->ndirect) += n;
      continue;
    }
    if ((st = stage_plan_op(c, &plan->stage, d, i, lregs[i] != NULL, rreg, fn, remote)) != HIXL_SUCCESS)
      return st;
    lregs[i] = NULL;
  }
  /* Bounded by transfer_submit's count already (a unit is 1 MiB or more); kept as the
   * allocation's own guard. */
  if (plan->ndirect + plan->nsock + plan->stage.nunits > XFER_MAX_CHUNKS ||
      plan->stage.nsegs > XFER_MAX_CHUNKS)
    return hixl_fail(HIXL_PARAM_INVALID, "%s: batch is too large", fn);
  return HIXL_SUCCESS;
}

/* ch becomes the chunk of op d from off on (at most ENGINE_TCP_CHUNK bytes), holding
 * its registration; returns its length. */
static size_t chunk_init(struct chunk *ch, struct hixl_transfer_req *r, HixlTransferOp op,
                         struct hixl_mem_reg *lreg, const HixlTransferOpDesc *d, size_t off) {
  size_t len = d->len - off < ENGINE_TCP_CHUNK ? d->len - off : ENGINE_TCP_CHUNK;
  ch->req = r;
  ch->lreg = lreg;
  ch->lreg->inflight++;
  ch->laddr = (uint8_t *)(d->local_addr + off);
  ch->raddr = d->remote_addr + off;
  ch->len = (uint32_t)len;
  ch->kind = op == HIXL_READ ? CHUNK_READ : CHUNK_WRITE;
  ch->tx.chunk = ch;
  return len;
}

/* Check, plan and start a batch: *out its request, *out_conn the link it went on; for a
 * sync call (sync) whose transport copied it at once (copy_now) *out is NULL and it is
 * over. On success the lock is still held. */
static HixlStatus transfer_submit(HixlEngine *e, const char *remote, HixlTransferOp op,
                                  const HixlTransferOpDesc *descs, size_t count, int32_t timeout_ms,
                                  bool sync, const char *fn, struct hixl_transfer_req **out,
                                  struct conn **out_conn) {
  HixlStatus st;
  /* The name is measured and parsed only when no peer has it (api_link_for, below): a
   * peer's name was checked at HixlEngineConnect, and strcmp against it reads no
   * further into the caller's string than that name's length. */
  CHECK_ARG(remote, "%s: remote_engine is NULL", fn);
  CHECK_ARG(op == HIXL_READ || op == HIXL_WRITE, "%s: op %d is neither HIXL_READ nor HIXL_WRITE", fn,
            (int)op);
  CHECK_ARG(descs && count > 0 && count <= HIXL_MAX_BATCH, "%s: need 1 to %d op descriptors, got %zu%s", fn,
            HIXL_MAX_BATCH, count, descs ? "" : " (descs is NULL)");
  if ((st = api_check_timeout(timeout_ms, fn)) != HIXL_SUCCESS) return st;
  uint64_t nchunks = 0;
  for (size_t i = 0; i < count; i++) {
    CHECK_ARG(descs[i].len > 0, "%s: op %zu has length 0", fn, i);
    /* Inside, 0 is the discard sink of a read whose caller gave up: never the caller's. */
    CHECK_ARG(descs[i].local_addr != 0, "%s: op %zu local_addr is 0 (NULL); nothing was sent", fn, i);
    /* No peer registers 0 (RegisterMem refuses it); HIXL refuses it here too. */
    CHECK_ARG(descs[i].remote_addr != 0, "%s: op %zu remote_addr is 0 (NULL); nothing was sent", fn, i);
    CHECK_ARG(descs[i].local_addr + descs[i].len > descs[i].local_addr &&
                  descs[i].remote_addr + descs[i].len > descs[i].remote_addr,
              "%s: op %zu range wraps around the address space", fn, i);
    /* Rounded up without adding first: a length near SIZE_MAX would wrap to 0 chunks. */
    nchunks += descs[i].len / ENGINE_TCP_CHUNK + (descs[i].len % ENGINE_TCP_CHUNK != 0);
  }
  CHECK_ARG(nchunks <= XFER_MAX_CHUNKS,
            "%s: batch is too large: its ops come to %llu pieces of 1 MiB, a call moves at most %u (1 TiB)",
            fn, (unsigned long long)nchunks, XFER_MAX_CHUNKS);
  /* The deadline counts from when the call holds the engine, read when first needed: a
   * call its transport copies at once (copy_now: a memcpy, which cannot wait) reads no
   * clock at all (~10% of a 4 KiB same-host op). */
  uint64_t deadline = 0;
  if ((st = api_enter(e, fn)) != HIXL_SUCCESS) return st;
  struct conn *c = api_link_for(e, remote, fn, &st);
  struct hixl_mem_reg **lregs = NULL, *small[2 * SMALL_BATCH];
  struct hixl_transfer_req *r = NULL;
  if (!c) {
    /* A malformed name says so (one too long said so already). */
    HixlStatus bad = st == HIXL_PARAM_INVALID ? st : api_check_remote(remote, fn, &(struct sockaddr_in){0});
    if (bad != HIXL_SUCCESS) st = bad;
    goto unlock;
  }
  /* An op moves directly only when its remote range lies in one registration the
   * peer advertised; otherwise it is staged (the peer checks it) or refused whole
   * before anything is sent (plan_ops). On a miss, one SYNC round trip first brings
   * the table up to date (the peer may have registered it a moment ago). */
  if ((c->xp->flags & XPORT_ONE_SIDED) && !c->xp->link.table_current(c)) {
    /* The table must be current before anything is posted or copied: the frames
     * waiting on the socket are applied now, unless the transport knows nothing was
     * withdrawn since (shm: a counter the peer shares; the poll would cost ~5% of a
     * 256 KiB memcpy). Reading them may have ended the link: look it up again. */
    link_take_pending(c);
    if (!(c = api_link_for(e, remote, fn, &st))) goto unlock;
    /* Each rail's chunks carry its own table's key: its withdrawals are applied too. */
    for (uint32_t k = 0; c->rail >= 0 && k < c->peer->n_rails; k++) {
      struct conn *rail = c->peer->rails[k].conn;
      if (rail && rail != c && !rail->dead) link_take_pending(rail);
    }
  }
  /* Small batches (a TransferSync of one op, the common case) keep these on the stack. */
  lregs = count <= SMALL_BATCH ? small : malloc(count * (sizeof(*lregs) + sizeof(struct remote_mem *)));
  if (!lregs) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
    goto unlock;
  }
  const struct remote_mem **rms = (const struct remote_mem **)(lregs + count);
  if (remote_lookup(c, descs, count, rms) > 0) {
    deadline = hixl_deadline_ns(timeout_ms);
    if ((st = api_link_sync(e, c, deadline, fn, remote)) != HIXL_SUCCESS) goto unlock;
    if (!(c = api_link_for(e, remote, fn, &st))) goto unlock;
    remote_lookup(c, descs, count, rms);
  }
  struct xfer_plan plan;
  if ((st = plan_ops(e, c, descs, count, fn, remote, rms, lregs, &plan)) != HIXL_SUCCESS) goto unlock;
  struct peer *p = c->peer;
  bool rails = p && p->n_rails > 1 && c->rail >= 0;
  if (sync && !rails && plan.ndirect == count && plan.nsock == 0 && plan.stage.nunits == 0) {
    /* Every op moves directly, in one piece: the transport may copy them right here. */
    char why[sizeof(((struct hixl_transfer_req *)0)->err)]; /* what a request would have said */
    HixlStatus cst;
    if (c->xp->link.copy_now(c, op, descs, count, lregs, &cst, why, sizeof(why))) {
      if (cst != HIXL_SUCCESS) st = hixl_fail(cst, "%s: %s", fn, why);
      *out = NULL;
      *out_conn = NULL;
      goto unlock;
    }
  }
  if (!deadline) deadline = hixl_deadline_ns(timeout_ms);
  r = api_req_new(e, plan.ndirect + plan.nsock + plan.stage.nunits, deadline);
  if (r) {
    r->ndirect = plan.ndirect;
    r->nsock = plan.nsock;
    if (stage_plan_fill(r, &plan.stage, c, op, descs, count, lregs) < 0) {
      r->user_holds = false;
      r->outstanding = 0;
      link_req_maybe_free(r);
      r = NULL;
    }
  }
  if (!r) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory for %llu chunks", fn,
                   (unsigned long long)(plan.ndirect + plan.nsock + plan.stage.nunits));
    goto unlock;
  }
  struct chunk *ch = r->chunks;
  /* Rails: each chunk goes on the least loaded rail (ties: c, which a sync caller reads
   * itself); a request that went on others too is read by the progress thread. */
  bool used[HIXL_RAILS_MAX] = {false};
  struct chunk *sch = r->chunks + r->ndirect; /* the next socket chunk (device memory) */
  const struct xport_ops *tcp = e->mods[XPORT_TCP];
  for (size_t i = 0; i < count; i++) {
    if (!lregs[i]) continue;              /* staged */
    const struct remote_mem *rm = rms[i]; /* a direct op's: its key is there too */
    if (r->nsock && op_on_socket(c, lregs[i], rm, &descs[i])) {
      for (size_t off = 0; off < descs[i].len; off += ENGINE_TCP_CHUNK, sch++) {
        chunk_init(sch, r, op, lregs[i], &descs[i], off);
        sch->seq = c->next_seq++;
        tcp->link.post(c, sch); /* a tcp frame on this link's socket, whatever moves its other data */
      }
      continue;
    }
    for (size_t off = 0; off < descs[i].len; off += ENGINE_TCP_CHUNK, ch++) {
      size_t len = chunk_init(ch, r, op, lregs[i], &descs[i], off);
      ch->rkey = rm->rkey;
      ch->dev = op_device(lregs[i], rm);
      struct conn *to = rails ? link_rail_pick(p, NULL, rm) : c;
      /* A scoped peer's windows (rdma, no key) are each QP's own: another rail takes the
       * chunk only where the peer opened windows over it on that rail too. */
      if (to && to != c && rm->rkey == 0 && !to->xp->link.reach(to, rm, ch->raddr, len)) to = c;
      if (to && to != c) {
        r->railed = true;
        used[to->rail] = true;
        link_rail_post(to, ch, rm);
        continue;
      }
      if (rails) {
        ch->rkey = link_rail_rkey(c, rm);
        link_rail_charge(c, (uint32_t)len);
      }
      ch->seq = c->next_seq++;
      c->xp->link.post(c, ch); /* a frame (tcp), a work request (rdma), or nothing yet (shm) */
    }
  }
  if (r->nsock > 0 && !c->dead) { /* the socket chunks' first bytes leave now; the progress thread reads */
    tcp->link.start(c, r);
    link_unpark(c);
  }
  if (plan.stage.nunits > 0) stage_submit(r); /* units with a free buffer go now, the rest wait in order */
  for (uint32_t k = 0; rails && k < p->n_rails; k++) {
    struct conn *to = p->rails[k].conn;
    if (used[k] && to && to != c && !to->dead) to->xp->link.start(to, r); /* the first bytes leave now */
  }
  if (c->dead) {
    /* A send above found the link reset (the peer closed it): what was queued on it
     * has ended with it. A copying transport's direct chunks wait in r alone until
     * driven: they end here. */
    if (c->xp->flags & XPORT_CPU_COPY)
      for (uint32_t k = 0; k < plan.ndirect; k++)
        link_chunk_end(&r->chunks[k], HIXL_FAILED, "the link was lost as the transfer started");
  } else {
    /* shm: a sync caller copies in link_drive; an async request goes to its async hook. */
    c->xp->link.start(c, r);
  }
  *out = r;
  *out_conn = c;
unlock:
  if (lregs != small) free(lregs);
  if (st != HIXL_SUCCESS) pthread_mutex_unlock(&e->lock);
  return st; /* on success the lock is still held */
}

HixlStatus HixlEngineTransferSync(HixlEngine *e, const char *remote, HixlTransferOp op,
                                  const HixlTransferOpDesc *descs, size_t count, int32_t timeout_ms) {
  struct hixl_transfer_req *r;
  struct conn *c;
  HixlStatus st =
      transfer_submit(e, remote, op, descs, count, timeout_ms, true, "HixlEngineTransferSync", &r, &c);
  if (st != HIXL_SUCCESS) return st;
  if (r) st = api_req_wait(e, c, r, "HixlEngineTransferSync", remote); /* NULL: copied already */
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus HixlEngineTransferAsync(HixlEngine *e, const char *remote, HixlTransferOp op,
                                   const HixlTransferOpDesc *descs, size_t count, int32_t timeout_ms,
                                   void *user_data, HixlTransferReq *req) {
  struct hixl_transfer_req *r;
  CHECK_ARG(req, "HixlEngineTransferAsync: req output is NULL");
  struct conn *c;
  HixlStatus st =
      transfer_submit(e, remote, op, descs, count, timeout_ms, false, "HixlEngineTransferAsync", &r, &c);
  if (st != HIXL_SUCCESS) return st;
  r->is_async = true;
  r->user_data = user_data;
  c->xp->link.async(c, r); /* nobody waits in a call; shm: copied now or queued, c may be gone after */
  pthread_mutex_lock(&e->req_lock);
  uintptr_t token = handles_add(&e->reqs, r);
  pthread_mutex_unlock(&e->req_lock);
  if (!token) {
    uint32_t left;
    bool reset;
    (void)req_abandon(e, r, &left, &reset); /* the caller never sees r: nothing of it may go on */
    r->user_holds = false;
    link_req_maybe_free(r);
    pthread_mutex_unlock(&e->lock);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineTransferAsync: out of memory");
  }
  *req = (HixlTransferReq)token; /* a token (util/handles.h), not r's address */
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}

/* Find a request the caller still holds (*out); returns with req_lock held on success. */
static HixlStatus req_enter(HixlEngine *e, HixlTransferReq req, const char *fn,
                            struct hixl_transfer_req **out) {
  if (!e) return hixl_fail(HIXL_PARAM_INVALID, "%s: engine is NULL", fn);
  pthread_mutex_lock(&e->req_lock);
  if (!(*out = handles_get(&e->reqs, (uintptr_t)req))) {
    pthread_mutex_unlock(&e->req_lock);
    return hixl_fail(HIXL_PARAM_INVALID, "%s: request %p is unknown or was already released", fn,
                     (void *)req);
  }
  return HIXL_SUCCESS;
}

HixlStatus HixlEngineGetTransferStatus(HixlEngine *e, HixlTransferReq req, HixlTransferStatus *status) {
  CHECK_ARG(status, "HixlEngineGetTransferStatus: status output is NULL");
  struct hixl_transfer_req *r;
  HixlStatus st;
  /* A request that ended is settled under the engine lock, which a handler holds. */
  if (e && (st = api_not_serving(e, "HixlEngineGetTransferStatus")) != HIXL_SUCCESS) return st;
  if ((st = req_enter(e, req, "HixlEngineGetTransferStatus", &r)) != HIXL_SUCCESS) return st;
  HixlTransferStatus s = HIXL_TRANSFER_WAITING;
  hixl_error_clear();
  /* Polling a request in flight must not contend with the progress thread. */
  if (__atomic_load_n(&r->outstanding, __ATOMIC_ACQUIRE) > 0 && hixl_now_ns() < r->deadline_ns) {
    pthread_mutex_unlock(&e->req_lock);
    *status = HIXL_TRANSFER_WAITING;
    return HIXL_SUCCESS;
  }
  /* Final: settle it under the engine lock (lock order: lock, then req_lock). */
  pthread_mutex_unlock(&e->req_lock);
  pthread_mutex_lock(&e->lock);
  pthread_mutex_lock(&e->req_lock);
  if (handles_get(&e->reqs, (uintptr_t)req) != r) { /* another thread settled it meanwhile */
    pthread_mutex_unlock(&e->req_lock);
    pthread_mutex_unlock(&e->lock);
    return hixl_fail(HIXL_PARAM_INVALID, "HixlEngineGetTransferStatus: request %p was already released",
                     (void *)req);
  }
  if (r->outstanding == 0) {
    s = r->status == HIXL_SUCCESS   ? HIXL_TRANSFER_COMPLETED
        : r->status == HIXL_TIMEOUT ? HIXL_TRANSFER_TIMEOUT
                                    : HIXL_TRANSFER_FAILED;
    if (s != HIXL_TRANSFER_COMPLETED) hixl_fail(r->status, "transfer failed: %s", r->err);
  } else if (hixl_now_ns() >= r->deadline_ns) {
    uint32_t left;
    bool reset;
    uint32_t starved = req_abandon(e, r, &left, &reset);
    if (starved > 0) {
      s = HIXL_TRANSFER_FAILED;
      stage_exhausted(e, "HixlEngineGetTransferStatus", starved, "the peer", reset);
    } else {
      s = HIXL_TRANSFER_TIMEOUT;
      hixl_fail(HIXL_TIMEOUT, "transfer: %u of %u chunks unanswered at the deadline%s", left, r->nchunks,
                reset ? "; RDMA work requests were still posted, so the link was reset (Connect again)" : "");
    }
  }
  if (s != HIXL_TRANSFER_WAITING) {
    handles_del(&e->reqs, (uintptr_t)req);
    r->user_holds = false;
    link_req_maybe_free(r);
  }
  pthread_mutex_unlock(&e->req_lock);
  *status = s;
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}

HixlStatus HixlEngineGetTransferUserData(HixlEngine *e, HixlTransferReq req, void **user_data) {
  CHECK_ARG(user_data, "HixlEngineGetTransferUserData: user_data output is NULL");
  struct hixl_transfer_req *r;
  HixlStatus st = req_enter(e, req, "HixlEngineGetTransferUserData", &r);
  if (st != HIXL_SUCCESS) return st;
  *user_data = r->user_data;
  pthread_mutex_unlock(&e->req_lock);
  return HIXL_SUCCESS;
}

/* ---- a transfer, then a call (engine_ext.h) ---- */

HixlStatus hixl_engine_transfer_then_call(HixlEngine *e, const char *remote, HixlTransferOp op,
                                          const HixlTransferOpDesc *descs, size_t count, uint16_t service,
                                          const void *req, size_t len, void *resp, size_t cap,
                                          uint32_t *resp_len, int32_t timeout_ms, hixl_call_t *call) {
  const char *fn = "hixl_engine_transfer_then_call";
  CHECK_ARG(call && (req || len == 0) && len <= HIXL_CALL_MAX && resp && cap > 0 && resp_len,
            "%s: call output, request (%zu bytes, at most %u), answer buffer or length output is invalid", fn,
            len, HIXL_CALL_MAX);
  /* Everything the CALL needs is taken before the transfer starts: once it has, the
   * CALL can no longer fail alone. */
  struct chunk *th = calloc(1, sizeof(*th));
  uint8_t *frame = th ? malloc(WIRE_CALL_AFTER_AT + len) : NULL; /* room for either frame */
  if (!frame) {
    free(th);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  }
  if (len) memcpy(frame + WIRE_CALL_REQ_AT, req, len);
  th->laddr = resp;
  th->len = cap > HIXL_CALL_MAX ? HIXL_CALL_MAX : (uint32_t)cap;
  th->call_len = resp_len;
  th->tx.heap = frame;
  struct hixl_transfer_req *r;
  struct conn *c;
  HixlStatus st = transfer_submit(e, remote, op, descs, count, timeout_ms, false, fn, &r, &c);
  /* The start's own send may have found the link reset (the peer closed it): c is dead,
   * every chunk has ended with it, and so will the call attached below. (A dead link
   * has let go of its peer: it takes the last branch, which ends the call.) */
  bool calls = st == HIXL_SUCCESS && !c->dead && (c->peer->caps & WIRE_CAP_CALL);
  /* Where the call can leave now and the target serve it behind the data, waiting for
   * the data's answers or completions first would add a trip back and the call's own
   * way: over tcp every WRITE is a frame queued on the link's stream already, and the
   * call follows them (CALL_AFTER: served once they all landed, unless one was
   * refused); over rdma every WRITE is a work request on the link's QP, and a tag rides
   * behind them (CALL_TAG: served when the tag, an RDMA WRITE with immediate data,
   * lands). */
  uint8_t behind = 0;
  if (calls && op == HIXL_WRITE && !r->railed && r->ndirect == r->nchunks) {
    if ((c->xp->flags & XPORT_IN_STREAM) && (c->peer->caps & WIRE_CAP_CALL_AFTER))
      behind = WIRE_CALL_AFTER;
    else if ((c->xp->flags & XPORT_TAGS) && (c->peer->caps & WIRE_CAP_CALL_TAG) &&
             c->xp->link.post_tag(c, r, c->tags_sent + 1) == 0)
      behind = WIRE_CALL_TAG;
  }
  if (st == HIXL_SUCCESS && !c->dead && !calls) {
    /* Not before transfer_submit: it may bring the link up. The transfer goes on; its
     * end is waited for here, as nobody else would. */
    (void)api_req_wait(e, c, r, fn, remote);
    pthread_mutex_unlock(&e->lock);
    st = hixl_fail(HIXL_UNSUPPORTED, "%s: %s speaks an older protocol without service calls", fn, remote);
  } else if (behind) {
    uint64_t after = r->chunks[0].seq; /* CALL_AFTER: the first WRITE it follows */
    if (behind == WIRE_CALL_TAG) {
      after = ++c->tags_sent;
      c->tag_calls++;
    }
    r->is_async = true;
    memmove(frame + (behind == WIRE_CALL_TAG ? WIRE_CALL_TAG_AT : WIRE_CALL_AFTER_AT),
            frame + WIRE_CALL_REQ_AT, len);
    link_then_behind(r, c, th, service, (uint32_t)len, behind, after);
    th = NULL;
    frame = NULL;
    c->xp->link.async(c, r); /* the progress thread reads the answers */
    pthread_mutex_unlock(&e->lock);
    *call = r;
  } else if (st == HIXL_SUCCESS) {
    r->is_async = true; /* its transport moves it; the wait only waits */
    link_then_attach(r, c, th, service, (uint32_t)len);
    th = NULL;
    frame = NULL;
    if (c->dead) {
      /* nothing left to move: the call ended failed when attached */
    } else if (c->xp->flags & XPORT_CPU_COPY) {
      /* A copy: this thread makes it now (handing it to the progress thread would cost
       * a wake-up and gain nothing), then sends the call its end released, before the
       * progress thread is woken for the answer: woken first, it would run ahead of this
       * thread where the two share a CPU (about 6 us a call over shm). */
      r->then_caller = true;
      c->xp->link.drive(c, r); /* c may be gone afterwards */
      link_then_flush(r);
    } else {
      c->xp->link.async(c, r); /* nobody waits in a call yet: the progress thread ends it */
    }
    pthread_mutex_unlock(&e->lock);
    *call = r;
  }
  free(frame);
  free(th);
  return st;
}
