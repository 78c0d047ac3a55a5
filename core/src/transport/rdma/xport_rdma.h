/* xport_rdma: links whose data moves by one-sided RDMA on an RC queue pair. */
#ifndef HIXL_XPORT_RDMA_H
#define HIXL_XPORT_RDMA_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/xport.h"
#include "transport/rdma/rdma.h"

extern const struct xport_ops xport_rdma;

/* For the staging pool, which rides on rdma links (lock held throughout): */
struct rdma_dev *erdma_dev(const struct HixlEngine *e); /* the engine's device, or NULL without RDMA */
bool erdma_has_qp(const struct conn *c);                /* c's data can go by RDMA */
uint32_t erdma_qpn(const struct conn *c);               /* for messages; 0 without a QP */
/* Post one signaled work request on a target link's QP; done runs at its completion
 * (ok false: the QP broke, status says why). Returns 0 or an errno (the link is
 * then killed by the caller). */
int erdma_post_own(struct conn *c, bool write, void *buf, uint32_t len, struct ibv_mr *mr, uint64_t raddr,
                   uint32_t rkey, void (*done)(struct conn *c, bool ok, const char *status));

#endif
