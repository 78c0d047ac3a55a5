/* stage_int: what stage.c (the pool, the initiator side, the table) and
 * stage_target.c (the target side) share. Lock held. */
#ifndef HIXL_STAGE_INT_H
#define HIXL_STAGE_INT_H

#include "engine/stage.h"

struct conn;
struct wire_msg;

/* The target side's hooks in xport_stage. */
void stage_target_frame(struct conn *c, const struct wire_msg *m);
void stage_payload_done(struct conn *c);
void stage_target_release(struct conn *c); /* the link dies: let go of what it holds */
void stage_free(struct conn *c);           /* the dead link is freed: its staged state */

#endif
