/* xport_tcp: the data path every link has: frames on the link's own socket. */
#ifndef HIXL_XPORT_TCP_H
#define HIXL_XPORT_TCP_H

#include "engine/xport.h"

extern const struct xport_ops xport_tcp;

#endif
