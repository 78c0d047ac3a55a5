/* stage: the staging pool ("BufferPool") and staged transfers (stage.c). It plugs into
 * links through the transport interface (xport_stage) and rides on their transports;
 * the engine API calls it for planning, submitting and cancelling. Lock held. */
#ifndef HIXL_STAGE_H
#define HIXL_STAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/xport.h"

extern const struct xport_ops xport_stage;

/* Whether small ops on c are worth packing into units, and below which length. */
bool stage_packs(const struct conn *c);
uint32_t stage_threshold(const struct conn *c);
void stage_submit(struct hixl_transfer_req *r);     /* queue r's units for buffers, start what can */
uint32_t stage_cancel(struct hixl_transfer_req *r); /* end units still waiting; returns how many */
HixlStatus stage_exhausted(struct HixlEngine *e, const char *fn, uint32_t units, const char *remote);

#endif
