/* api_int: what the public engine API's files call of each other. */
/* They call only downward (no cycle, tests/check_layers.sh): api.c (the engine's life,
 * the module table, argument checks, the peer list) at the bottom; api_link.c on it;
 * api_xfer.c on those; api_mem.c and api_call.c at the top. */
#ifndef HIXL_API_INT_H
#define HIXL_API_INT_H
#include <netinet/in.h>
#include <stdint.h>

#include "engine/engine_ext.h"
#include "engine/engine_int.h"
#include "util/status_int.h"

#define CHECK_ARG(cond, ...)                                                                                 \
  do {                                                                                                       \
    if (!(cond)) return hixl_fail(HIXL_PARAM_INVALID, __VA_ARGS__);                                          \
  } while (0)

/* api.c */
HixlStatus api_enter(HixlEngine *e, const char *fn); /* lock e, initialized; on failure not locked */
/* PARAM_INVALID when this thread runs a service handler of e, which holds e's lock. */
HixlStatus api_not_serving(HixlEngine *e, const char *fn);
/* A call about to release the lock and go on using what Finalize frees (a module's state,
 * a registration): api_out before, api_back once it holds the lock again; Finalize waits
 * until no call is out. Lock held for both. */
void api_out(HixlEngine *e);
void api_back(HixlEngine *e);
HixlStatus api_check_timeout(int32_t timeout_ms, const char *fn);
HixlStatus api_check_remote(const char *remote, const char *fn, struct sockaddr_in *sa); /* "ip:port" */
struct peer *api_find_peer(HixlEngine *e, const char *name);
void api_peer_free(HixlEngine *e, struct peer *p); /* unlinked from e->peers and freed */
void api_peer_release(struct peer *p); /* its table, its session secret and itself (not in e->peers) */
void api_reg_release(HixlEngine *e, struct hixl_mem_reg *r); /* transports' holds, AllocMem's memory, r */

/* api_dial.c */
/* HELLO (and the proof of a key) on a fresh blocking socket, then the data path: a rail
 * is taken by tcp alone; Connect's link learns the peer's rails (p->n_rails). */
HixlStatus api_handshake(HixlEngine *e, int fd, const char *remote, uint64_t deadline, struct peer *p,
                         bool rail, const struct xport_ops **xp, void **link);
/* c, Connect's new link to p, becomes rail 0 and the others are dialled (lock held,
 * released while dialling: p may be gone after; the prober starts). */
void api_rails_up(HixlEngine *e, struct peer *p, struct conn *c, uint64_t deadline);

/* api_link.c */
/* The live link to remote, or NULL with the reason recorded. Lock held. */
struct conn *api_link_for(HixlEngine *e, const char *remote, const char *fn, HixlStatus *st);

/* api_xfer.c */
struct hixl_transfer_req *api_req_new(HixlEngine *e, uint32_t nchunks, uint64_t deadline_ns);
/* Wait for a request the caller holds, then let go of it. Lock held. */
HixlStatus api_req_wait(HixlEngine *e, struct conn *c, struct hixl_transfer_req *r, const char *fn,
                        const char *remote);
/* One SYNC round trip on c: then every MEM_ADD / MEM_DEL the peer sent before is applied. Lock held. */
HixlStatus api_link_sync(HixlEngine *e, struct conn *c, uint64_t deadline, const char *fn,
                         const char *remote);

#endif
