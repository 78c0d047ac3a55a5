/* xport_shm: links to a peer on this host, whose data moves in one copy between the
 * two processes (process_vm_readv / process_vm_writev). */
#ifndef HIXL_XPORT_SHM_H
#define HIXL_XPORT_SHM_H

#include "engine/xport.h"

extern const struct xport_ops xport_shm;

#endif
