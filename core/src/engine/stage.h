/* stage: the staging pool ("BufferPool") and staged transfers (stage.c). It plugs into
 * links through the transport interface (xport_stage) and rides on their transports;
 * the engine API calls it for planning, submitting and cancelling. Lock held. */
#ifndef HIXL_STAGE_H
#define HIXL_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/xport.h"

extern const struct xport_ops xport_stage;

/* A staged unit (CHUNK_SWRITE / CHUNK_SREAD): ranges packed through one pool buffer,
 * sent as one STAGE_WRITE / STAGE_READ on the link's socket, or as STAGE_PULL /
 * STAGE_PUSH for the target to move by its transport's own posts. ch->unit. */
struct stage_unit {
  struct stage_seg *segs; /* into the request's array */
  uint32_t nsegs;
  bool waiting;       /* in the pool's queue, no buffer yet */
  bool srdma;         /* sent as STAGE_PULL / STAGE_PUSH: the target moves the data by RDMA */
  uint8_t *sbuf;      /* the pool buffer, once it has one */
  struct conn *sconn; /* the link it goes on, while it waits */
  struct chunk *next_wait;
  /* The registrations its local ranges lie in, each held (inflight) until the unit ends
   * or its request is given up, so DeregisterMem refuses meanwhile (into the request's
   * allocation). */
  struct hixl_mem_reg **regs;
  uint32_t nregs;
};

/* How a batch's staged ops pack into units: counted op by op (stage_plan_op), then
 * allocated and filled in the same order (stage_plan_fill). */
struct stage_plan {
  uint64_t nunits, nsegs;
  uint64_t ubytes, useg; /* the last unit's so far */
};
/* Op i (d) cannot move directly (lreg / rreg: whether its local / remote range is
 * registered) or is short enough to pack: check it may be staged to c's peer and
 * count its pieces. PARAM_INVALID or FAILED, naming op i, when it may not. */
HixlStatus stage_plan_op(const struct conn *c, struct stage_plan *sp, const HixlTransferOpDesc *d, size_t i,
                         bool lreg, bool rreg, const char *fn, const char *remote);
/* Allocate r's units as sp counted them and fill them from the staged ops (lregs[i]
 * NULL), as chunks [r->ndirect, r->nchunks) bound for c; nothing is sent. -1: out of
 * memory. */
int stage_plan_fill(struct hixl_transfer_req *r, const struct stage_plan *sp, struct conn *c,
                    HixlTransferOp op, const HixlTransferOpDesc *descs, size_t count,
                    struct hixl_mem_reg *const *lregs);

/* Whether small ops on c are worth packing into units, and below which length. */
bool stage_packs(const struct conn *c);
uint32_t stage_threshold(const struct conn *c);
void stage_submit(struct hixl_transfer_req *r); /* queue r's units for buffers, start what can */
/* At r's deadline: end its units still waiting (returns how many) and take back the
 * buffers of those unanswered on the socket. */
uint32_t stage_cancel(struct hixl_transfer_req *r);
/* RESOURCE_EXHAUSTED for fn, whose units to remote never got a buffer; reset: a link of
 * the batch was reset (its RDMA work requests were still posted), said too. */
HixlStatus stage_exhausted(struct HixlEngine *e, const char *fn, uint32_t units, const char *remote,
                           bool reset);

#endif
