/* engine_ext: what the HixlCS* layer and the cache manager need from the engine
 * beyond the public API. */
#ifndef HIXL_ENGINE_EXT_H
#define HIXL_ENGINE_EXT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hixl/hixl_engine.h"

/* RegisterMem with a tag (NULL or at most 255 bytes) advertised to peers. */
HixlStatus hixl_engine_register_tagged(HixlEngine *e, const HixlMemDesc *mem, HixlMemType type,
                                       const char *tag, HixlMemHandle *handle);

/* HixlEngineAllocMem with a tag (NULL or at most 255 bytes) advertised to peers. */
HixlStatus hixl_engine_alloc_tagged(HixlEngine *e, size_t len, const char *tag, void **addr,
                                    HixlMemHandle *handle);

/* Start listening on port of the engine's IP, for an engine initialized without one. */
HixlStatus hixl_engine_listen(HixlEngine *e, uint16_t port, int backlog);

struct hixl_remote_mem {
  uint64_t addr;
  uint64_t len;
  const char *tag; /* points into the same allocation */
  bool device;     /* the peer registered it as device memory */
};

/* The registrations remote advertised, brought up to date by one round trip. *out is
 * one allocation (free it); *count may be 0. */
HixlStatus hixl_engine_remote_mems(HixlEngine *e, const char *remote, int32_t timeout_ms,
                                   struct hixl_remote_mem **out, size_t *count);

/* How a link to remote moves data, for tests and diagnostics. */
struct hixl_link_info {
  int rdma;        /* 1: RDMA queue pair; 0: tcp or shm (see transport) */
  uint32_t qpn;    /* local QP number */
  char device[64]; /* RDMA device name */
  uint8_t tc_set;  /* traffic class and SL given to the QP */
  uint8_t sl_set;
  uint8_t tc_queried; /* as ibv_query_qp reports them (rxe reports SL 0: it drops it) */
  uint8_t sl_queried;
  uint8_t timeout_queried; /* ack timeout exponent and retry count, as ibv_query_qp reports them */
  uint8_t retry_queried;
  char transport[8];     /* "tcp", "rdma" or "shm" */
  uint32_t peer_pid;     /* shm: the target process copies go to and from */
  uint32_t mapped;       /* shm: the target's regions mapped here (its HixlEngineAllocMem memory) */
  uint64_t mapped_bytes; /* ... their bytes */
  uint64_t map_ops;      /* ... ops (pieces of large ones) moved by memcpy on them since Connect */
  uint64_t now_ops;      /* ... of them, those a sync call copied itself with no request (copy_now) */
  uint64_t peer_gen;     /* shm, a mapping link: the target's count of withdrawals and cut links, as
                          * its shared page says now (a transfer reads the socket when it moved) */
  uint32_t peer_life;    /* shm, a mapping link: the target's life word as read now (its life thread's
                          * id; FUTEX_OWNER_DIED once that ended); 0: none, its pidfd is asked */
  uint32_t windows;      /* rdma, a scoped target: the windows it opened to this engine on the link's QP */
  uint64_t win_ops;      /* ... and the chunks posted inside them since Connect */
  uint64_t tag_calls;    /* rdma: calls sent behind a transfer's WRITEs that the target served when the
                          * tag posted after them landed (CALL_TAG), since Connect */
};
HixlStatus hixl_engine_link_info(HixlEngine *e, const char *remote, struct hixl_link_info *info);

/* The rails to remote (Rails, docs/rails.md): *n of them (0 when the link has none),
 * the first cap written to out, rail 0 being the link Connect made. */
struct hixl_rail_info {
  char local[16];      /* this engine's address ("" when the kernel picks) */
  char remote[24];     /* the peer's, "ip:port" */
  char state[8];       /* "up" or "down" */
  uint64_t bytes;      /* bytes of the direct chunks it carried (answered) */
  uint64_t ops;        /* ... and how many */
  uint64_t failures;   /* times it went down */
  uint64_t retried;    /* chunks moved off it onto another rail when it went down */
  int control;         /* it carries the control frames (memory table, SYNC, NOTIFY, CALL, staging) */
  char last_down[128]; /* why it last went down, as logged ("" if never; cut at 127 bytes) */
};
HixlStatus hixl_engine_rails(HixlEngine *e, const char *remote, struct hixl_rail_info *out, size_t cap,
                             size_t *n);

/* What staging did for this engine since Initialize: as an initiator (the pool), and
 * as a target serving peers' staged frames. */
struct hixl_stage_stats {
  uint64_t units;            /* staged units sent: one pool buffer and one frame each */
  uint64_t ops;              /* ops, or pieces of ops larger than a unit, packed into them */
  uint64_t bytes;            /* bytes staged */
  uint64_t waits;            /* times a unit found every buffer busy and had to wait */
  uint64_t target_bufs;      /* target: data buffers allocated for peers' frames (a link's bounce
                              * buffer made or grown, a STAGE_READ's answer gathered) */
  uint64_t target_buf_bytes; /* ... their bytes */
  uint64_t target_regs;      /* target: bounce buffers registered with a transport (STAGE_PULL / PUSH) */
};
HixlStatus hixl_engine_stage_stats(HixlEngine *e, struct hixl_stage_stats *out);

/* A scoped engine's RDMA windows (docs/security.md, "Scoped memory over RDMA"): each
 * run of ranges granted to a peer linked over RDMA gets a type 2 memory window on each
 * of that peer's QPs (a range each for a peer without WIN_RUNS), over its registration's
 * MR or an MR of its own (own_mrs), closed at the revoke. All zero without RDMA. */
struct hixl_window_stats {
  uint64_t open;    /* windows bound now, over every link */
  uint64_t bound;   /* ... bound since Initialize */
  uint64_t closed;  /* ... closed since (revoked, or their link ended) */
  uint64_t refused; /* granted ranges that got no window (the device has no type 2 windows, it ran out,
                     * the range is not inside one registration, or is device memory with no MR): the
                     * peer's ops on them go as tcp frames on the link's socket, where this engine's
                     * CPU checks the grant */
  uint64_t split;   /* windows over a run of ranges split since, a range in them granted again (each
                     * left open until the first of its ranges is revoked) */
  uint64_t own_mrs; /* windows bound since over an MR of their own, registered with them (the device
                     * lets a window's key reach its whole MR, or could not tell: rdma_probe_mw_bounds);
                     * the others are bound over their registration's MR */
};
HixlStatus hixl_engine_window_stats(HixlEngine *e, struct hixl_window_stats *out);

/* The progress thread's rounds that found events, since Initialize: after it slept
 * (woken: the kernel woke it), or while it went on polling for PollUs after an event
 * (polled: no wake-up); and its PollUs windows that ended with nothing come (missed:
 * the CPU spent for nothing, after which the thread skips windows, docs/design.md). */
struct hixl_poll_stats {
  uint64_t woken;
  uint64_t polled;
  uint64_t missed;
  uint64_t contended; /* polling stopped: a yield gave the CPU to another task (then none for 100 ms) */
};
HixlStatus hixl_engine_poll_stats(HixlEngine *e, struct hixl_poll_stats *out);

/* ---- scoped memory (docs/security.md) ---- */

/* Off (the default), a peer that linked reaches every registration of this engine.
 * On, this engine as a target serves a peer's WRITE and READ over tcp and its staged
 * ops only inside ranges granted to that peer's name (the one it authenticated with);
 * anything else is answered FAILED with nothing touched, counted and logged. RDMA
 * (the peer's NIC holds rkeys) and same-host copies (the peer's own process_vm_* and
 * mappings) do not pass through this engine's CPU and are not scoped. */
HixlStatus hixl_engine_set_scoped(HixlEngine *e, bool on);
/* Device memory and same-host peers on a scoped engine. On (the default), a device
 * allocation goes to a same-host peer by IPC handle (which opens all of it) only once
 * that peer's grants cover all of it, and a revoke recalls it; the peer's other device
 * ops go as tcp frames this engine's CPU checks. Off: every device allocation the
 * provider exports goes to every same-host peer that opens device memory, whatever it
 * was granted, as host memory does (same-host copies are not scoped, docs/security.md:
 * such a peer can already reach all of this process); grants still scope tcp, RDMA and
 * staged ops. Chosen before registering memory (PARAM_INVALID after). */
HixlStatus hixl_engine_set_devmap_scoped(HixlEngine *e, bool on);
/* What this engine moved on device memory by same-host IPC since Initialize. */
struct hixl_devmem_stats {
  uint64_t ipc_bytes;    /* bytes of ops on a same-host peer's device memory opened here by IPC handle
                          * (SHM_DEV_MAP), moved by the device-memory provider: device to device, or to
                          * and from host memory here */
  uint64_t rdma_bytes;   /* bytes of ops on device memory (here or at the peer) that RDMA moved directly
                          * (GPUDirect: an MR over the memory's dma-buf on both sides), as they completed */
  uint32_t rdma_regs;    /* device registrations here with such an MR on every RDMA device, now */
  uint32_t rdma_refused; /* device registrations that got none since Initialize (the provider, the GPU,
                          * the NIC or the kernel could not): their ops go as tcp frames */
  uint32_t rdma_peermem; /* device registrations since Initialize whose MRs were made by the memory's
                          * address through a peer-memory client (nvidia-peermem), where no dma-buf
                          * MR could be made: GPUDirect all the same */
  uint64_t ipc_ops;      /* the copies of ipc_bytes (ops next to each other on both sides, and the
                          * chunks of one op, are one copy) ... */
  uint64_t ipc_waits;    /* ... and the waits for the device they took: one per run of up to 1024 of
                          * them inside one mapping where the provider starts many copies at once
                          * (copy_many), one each otherwise ... */
  uint64_t ipc_batched;  /* ... and those of them the driver started many to a call (cuda:
                          * cuMemcpyBatchAsync, CUDA 13), not a call each ... */
  uint64_t ipc_gathered; /* ... or a copy kernel many to a launch (cuda: gather.cu) */
};
HixlStatus hixl_engine_devmem_stats(HixlEngine *e, struct hixl_devmem_stats *out);
/* Grant peer the n ranges {addr, len}, or revoke them. Grants count, byte by byte: ranges
 * may overlap each other and what the peer holds, and a byte stays granted while a grant
 * holding it is not revoked (a range granted twice needs two revokes). A revoke names
 * ranges granted before, each counted down once: one that does not start and end where
 * grants did, or spans a byte no grant holds (part of a grant, a gap), is PARAM_INVALID
 * and changes nothing (the others are revoked; the engine keeps counts, not who granted
 * what, so two adjacent grants may go as one range). Callable from a service handler
 * (on the progress thread, the lock held: they see it is theirs). A revoke that takes
 * back a same-host peer's device mapping (hixl_engine_set_devmap_scoped on) returns
 * once the peer closed it, its copies running ended (up to HIXL_DEFAULT_TIMEOUT_MS,
 * lock released; a peer that does not answer is cut off); from a service handler it
 * cannot wait (the progress thread reads the answer): the recall is sent, the peer
 * starts no copy there once it has read it, and one already running may still end. */
HixlStatus hixl_engine_grant(HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n);
HixlStatus hixl_engine_revoke(HixlEngine *e, const char *peer, const uint64_t (*ranges)[2], size_t n);
/* The disjoint pieces peer's grants hold now (cut where any grant starts or ends), and ops
 * refused for want of a grant since Initialize. */
HixlStatus hixl_engine_grant_stats(HixlEngine *e, const char *peer, size_t *granted, uint64_t *refused);
/* How many peer names hold at least one range now (a name whose last range was revoked
 * leaves nothing behind). */
HixlStatus hixl_engine_grant_peers(HixlEngine *e, size_t *peers);

/* ---- services: one request, one answer, on a link's control socket ---- */

/* Service numbers (CALL frames); a peer without a handler answers UNSUPPORTED. */
#define HIXL_SERVICE_CACHE 1 /* the cache manager's lookups (cache.c) */
#define HIXL_SERVICE_KV    2 /* the KV connector plugin's pin and free (plugin/) */

/* Answers one CALL from peer: req/len is the request; write at most cap bytes of the
 * answer to resp and set *resp_len. A status other than SUCCESS goes back with resp
 * as its reason, in text. Runs on the progress thread with the engine lock held: it
 * must not call the engine (but to grant and revoke; any other call of its engine is
 * refused with PARAM_INVALID), and any lock it takes must never be held while calling it.
 * It must not block either (wait for a peer, a device, another thread): while it runs,
 * no link of the engine moves, and every call of the engine that takes its lock (all but
 * polling a request in flight), from any thread, waits for it without bound: timeout_ms
 * bounds the wait for peers, not for the lock. The peers' calls time out at their side. */
typedef HixlStatus (*hixl_call_fn)(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                                   size_t cap, size_t *resp_len);

/* Install (fn) or remove (NULL) the handler of service; PARAM_INVALID when another
 * handler holds it. fn must return without blocking (hixl_call_fn). Removing works on a
 * finalized engine too (its owner is going, and a peer must not reach it once the engine
 * is initialized again); once it returns, the handler runs no more. */
HixlStatus hixl_engine_set_service(HixlEngine *e, uint16_t service, hixl_call_fn fn, void *ctx);

/* Ask remote's service and wait for the answer (at most cap bytes into resp, its
 * length in *resp_len). A failing answer's status comes back with the peer's reason
 * in HixlGetLastErrorMessage. */
HixlStatus hixl_engine_call(HixlEngine *e, const char *remote, uint16_t service, const void *req, size_t len,
                            void *resp, size_t cap, size_t *resp_len, int32_t timeout_ms);
#define HIXL_CALL_MAX (64u << 10) /* bytes of a request or an answer */

/* A call started and not yet waited for. */
typedef struct hixl_transfer_req *hixl_call_t;

/* Start the same call without waiting: it leaves now, and its answer (at most cap
 * bytes) lands in resp, its length in *resp_len; both must stay valid until
 * hixl_engine_call_wait returns for it. Calls reach the peer in the order they were
 * started, behind every frame queued before them on the link (tcp data among them);
 * RDMA or shm data started before a call may land after it is served (for a call that
 * must follow its data: hixl_engine_transfer_then_call). */
HixlStatus hixl_engine_call_start(HixlEngine *e, const char *remote, uint16_t service, const void *req,
                                  size_t len, void *resp, size_t cap, uint32_t *resp_len, int32_t timeout_ms,
                                  hixl_call_t *call);

/* A one-sided transfer (as HixlEngineTransferAsync) and a call that the peer serves
 * only once every op of the transfer has landed; if one failed or timed out first,
 * the call is not served and ends with that failure. Over tcp, a WRITE whose frames
 * all queue at once takes the call right behind them on the stream (CALL_AFTER: the
 * peer refuses it if it refused one of them) instead of sending it when their answers
 * are back, a round trip later; such a call, once it left, is served even if the
 * caller's wait then gives up. One handle for both, waited for with
 * hixl_engine_call_wait: SUCCESS means the data landed and the call was answered.
 * The caller need not wait between transfers: each starts at once, so a next one
 * queues behind this one's data while its call waits for it. */
HixlStatus hixl_engine_transfer_then_call(HixlEngine *e, const char *remote, HixlTransferOp op,
                                          const HixlTransferOpDesc *descs, size_t count, uint16_t service,
                                          const void *req, size_t len, void *resp, size_t cap,
                                          uint32_t *resp_len, int32_t timeout_ms, hixl_call_t *call);

/* Wait until a started call ends (at most until its deadline) and release it: its
 * status, as hixl_engine_call's. Every started call is waited for, before Finalize. */
HixlStatus hixl_engine_call_wait(HixlEngine *e, const char *remote, hixl_call_t call);

/* SUCCESS when remote's table, as this engine knows it now (no round trip), holds
 * for each of the n addresses a registration covering [addrs[k], addrs[k] + len)
 * whose tag is tag; PARAM_INVALID naming the first that is not. One lock for all. */
HixlStatus hixl_engine_remote_has(HixlEngine *e, const char *remote, const uint64_t *addrs, size_t n,
                                  uint64_t len, const char *tag);

/* Close every link, either way, with the engine that calls itself remote_name (as a
 * service handler's peer names it): what it queued or sent and this engine has not
 * taken yet is dropped, so nothing more of it lands in this engine's memory over tcp
 * or rdma. A same-host peer that mapped this engine's memory unmaps it first, once
 * its copies running end (up to HIXL_DEFAULT_TIMEOUT_MS; lock released meanwhile); a
 * process_vm_* copy already running finishes. *dropped (optional) counts the links.
 * For a side giving up on a peer before the blocks it shares are reused. */
HixlStatus hixl_engine_drop_peer(HixlEngine *e, const char *remote_name, const char *why, size_t *dropped);

#endif
