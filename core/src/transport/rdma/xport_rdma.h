/* xport_rdma: links whose data moves by one-sided RDMA on an RC queue pair. */
#ifndef HIXL_XPORT_RDMA_H
#define HIXL_XPORT_RDMA_H

#include "engine/xport.h"

extern const struct xport_ops xport_rdma;

#endif
