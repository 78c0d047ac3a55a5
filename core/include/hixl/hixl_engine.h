/* hixl engine: one-sided READ/WRITE between registered memory of two engines
 * (the C form of HIXL's Hixl class). Every function is safe from any thread. */
#ifndef HIXL_ENGINE_H
#define HIXL_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "hixl/hixl_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HIXL_DEFAULT_TIMEOUT_MS  1000  /* used when a timeout_ms argument is 0 */
#define HIXL_MAX_NOTIFY_LEN      1024  /* name and message, each, without the NUL */
#define HIXL_MAX_NOTIFY_QUEUE    4096  /* undrained notifications an engine keeps, from all links together */
#define HIXL_MAX_NOTIFY_PER_LINK 1024  /* ... of them from one link: one peer cannot fill the queue */
#define HIXL_MAX_REGISTRATIONS   4096  /* registered memories per engine */
#define HIXL_MAX_BATCH           65536 /* op descriptors per transfer call */

typedef struct HixlEngine HixlEngine;              /* opaque */
typedef struct hixl_mem_reg *HixlMemHandle;        /* opaque, from RegisterMem */
typedef struct hixl_transfer_req *HixlTransferReq; /* opaque, from TransferAsync */

typedef enum { HIXL_MEM_HOST = 0, HIXL_MEM_DEVICE = 1 } HixlMemType;
typedef enum { HIXL_READ = 0, HIXL_WRITE = 1 } HixlTransferOp;

typedef enum {
  HIXL_TRANSFER_WAITING = 0,
  HIXL_TRANSFER_COMPLETED = 1,
  HIXL_TRANSFER_TIMEOUT = 2,
  HIXL_TRANSFER_FAILED = 3,
} HixlTransferStatus;

typedef struct {
  uintptr_t addr; /* start of the range */
  size_t len;     /* bytes, > 0 */
} HixlMemDesc;

typedef struct {
  uintptr_t local_addr;  /* inside memory registered with this engine (else staged); 0 is PARAM_INVALID */
  uintptr_t remote_addr; /* inside memory registered with the remote engine; 0 is PARAM_INVALID */
  size_t len;            /* bytes, > 0 */
} HixlTransferOpDesc;

typedef struct {
  const char *key;   /* option name, e.g. "BufferPool" */
  const char *value; /* option value as text, e.g. "4:8" */
} HixlOption;

typedef struct {
  const char *name;          /* at most HIXL_MAX_NOTIFY_LEN bytes */
  const char *msg;           /* at most HIXL_MAX_NOTIFY_LEN bytes */
  const char *remote_engine; /* GetNotifies: who sent it; ignored by SendNotify */
} HixlNotifyDesc;

/** Allocate an engine; it does nothing until HixlEngineInitialize. */
HIXL_API HixlStatus HixlEngineCreate(HixlEngine **engine);

/** Start the engine as local_engine ("ip" or "ip:port"; port > 0 listens on it,
 *  no port or a port <= 0 makes a client-only engine, as in HIXL). options may be NULL when
 *  num_options is 0; an unknown key or bad value is PARAM_INVALID. */
HIXL_API HixlStatus HixlEngineInitialize(HixlEngine *engine, const char *local_engine,
                                         const HixlOption *options, size_t num_options);

/** hixl's own: one row per option HixlEngineInitialize takes (name, default as
 *  text, the environment variable read when the option is not given (options NULL or
 *  without it; a given option with a NULL value is PARAM_INVALID), the
 *  allowed values in words, a one-line doc), for tools that describe or check them. */
typedef struct {
  const char *name;
  const char *def;
  const char *env;
  const char *range;
  const char *doc;
} HixlEngineOptionInfo;

/** The option table; *count rows. The table is static: never freed. */
HIXL_API const HixlEngineOptionInfo *HixlEngineOptionTable(size_t *count);

/** HIXL_SUCCESS when value is valid for option key as HixlEngineInitialize would
 *  take it; PARAM_INVALID otherwise, with the reason in HixlGetLastErrorMessage. */
HIXL_API HixlStatus HixlEngineCheckOption(const char *key, const char *value);

/** Stop the engine: close every link, fail transfers in flight, drop registrations. */
HIXL_API HixlStatus HixlEngineFinalize(HixlEngine *engine);

/** Finalize if needed and free the engine. */
HIXL_API HixlStatus HixlEngineDestroy(HixlEngine *engine);

/** Register [mem->addr, mem->addr + mem->len) for transfers; ranges must not overlap
 *  an existing registration. HIXL_MEM_HOST must lie whole in readable and writable
 *  mappings of this process (PARAM_INVALID names the first byte that does not), as an
 *  RDMA registration must: peers read and write it. HIXL_MEM_DEVICE takes a CUDA device pointer (the range
 *  inside one allocation; its device found from it) and moves it over tcp links
 *  through host buffers; it is UNSUPPORTED, saying why, where no CUDA driver is found
 *  (docs/device-memory.md). Memory registered after Connect is usable by connected
 *  peers at once. */
HIXL_API HixlStatus HixlEngineRegisterMem(HixlEngine *engine, const HixlMemDesc *mem, HixlMemType type,
                                          HixlMemHandle *handle);

/** Deregister. A peer's ops still moving data in the range (over tcp: a WRITE's data
 *  landing, READ answers queued) end FAILED there: its links are cut, as an RDMA
 *  peer's ops fail once the MR is gone. FAILED, with nothing released, while this
 *  engine's own transfers that use the range are in flight. */
HIXL_API HixlStatus HixlEngineDeregisterMem(HixlEngine *engine, HixlMemHandle handle);

/** Allocate at least len bytes of host memory and register it as RegisterMem does
 *  (every transport reaches it). The memory is a shared mapping of a sealed memfd:
 *  huge pages when the system has enough free, otherwise normal pages advised to
 *  transparent huge pages; it is zeroed. *addr gets its address, *handle its
 *  registration. An engine on the same host linked to this one (Transport shm) is
 *  handed the memfd, if it runs as the same user, maps it and moves its ops with
 *  memcpy instead of process_vm_readv / writev. Release it with HixlEngineFreeMem
 *  (DeregisterMem refuses it); Finalize frees what is left. */
HIXL_API HixlStatus HixlEngineAllocMem(HixlEngine *engine, size_t len, void **addr, HixlMemHandle *handle);

/** Deregister and unmap memory from HixlEngineAllocMem; peers' ops moving data in it
 *  are cut as DeregisterMem cuts them; FAILED while this engine's own transfers that
 *  use it are in flight (nothing is released then). Every peer that mapped it unmaps
 *  it before this returns (a round trip, once its copies running end); a peer that
 *  does not answer within HIXL_DEFAULT_TIMEOUT_MS is disconnected (logged). */
HIXL_API HixlStatus HixlEngineFreeMem(HixlEngine *engine, HixlMemHandle handle);

/** Link to remote_engine ("ip:port"), exchanging memory tables; retried until
 *  timeout_ms (0: default) when nothing listens yet, then TIMEOUT. */
HIXL_API HixlStatus HixlEngineConnect(HixlEngine *engine, const char *remote_engine, int32_t timeout_ms);

/** Close the link; transfers still in flight on it end FAILED. */
HIXL_API HixlStatus HixlEngineDisconnect(HixlEngine *engine, const char *remote_engine, int32_t timeout_ms);

/** Run a batch of ops and wait: READ copies remote to local, WRITE local to remote.
 *  A batch moves at most 1 TiB, each op's length counted in 1 MiB pieces rounded up
 *  (2^20 pieces); a longer one is PARAM_INVALID before anything is allocated or sent.
 *  TIMEOUT, or RESOURCE_EXHAUSTED when staged ops found no staging buffer by the
 *  deadline: the rest of the batch is cancelled alike (design.md, "Requests"). */
HIXL_API HixlStatus HixlEngineTransferSync(HixlEngine *engine, const char *remote_engine, HixlTransferOp op,
                                           const HixlTransferOpDesc *descs, size_t count, int32_t timeout_ms);

/** Start a batch of ops (bounded as TransferSync's); poll HixlEngineGetTransferStatus
 *  on *req. The timeout (0: default) runs from this call; user_data is kept with the
 *  request. */
HIXL_API HixlStatus HixlEngineTransferAsync(HixlEngine *engine, const char *remote_engine, HixlTransferOp op,
                                            const HixlTransferOpDesc *descs, size_t count, int32_t timeout_ms,
                                            void *user_data, HixlTransferReq *req);

/** Where an async request stands. Once it reports COMPLETED, TIMEOUT or FAILED the
 *  request is released; querying it again is PARAM_INVALID. Past its deadline it ends
 *  TIMEOUT, or FAILED when staged ops found no staging buffer, cancelled alike. */
HIXL_API HixlStatus HixlEngineGetTransferStatus(HixlEngine *engine, HixlTransferReq req,
                                                HixlTransferStatus *status);

/** The user_data given to TransferAsync, while the request is not yet released. */
HIXL_API HixlStatus HixlEngineGetTransferUserData(HixlEngine *engine, HixlTransferReq req, void **user_data);

/** Deliver {name, msg} to a connected remote engine and wait for its receipt: NOTIFY_FAILED
 *  when it holds HIXL_MAX_NOTIFY_QUEUE undrained ones already, from any of its links, or
 *  HIXL_MAX_NOTIFY_PER_LINK from this link. */
HIXL_API HixlStatus HixlEngineSendNotify(HixlEngine *engine, const char *remote_engine,
                                         const HixlNotifyDesc *notify, int32_t timeout_ms);

/** Take every notification received so far. *notifies (NULL when *count is 0) is one
 *  allocation; release it with HixlEngineFreeNotifies. */
HIXL_API HixlStatus HixlEngineGetNotifies(HixlEngine *engine, HixlNotifyDesc **notifies, size_t *count);

/** Release what HixlEngineGetNotifies returned (NULL is fine). */
HIXL_API void HixlEngineFreeNotifies(HixlNotifyDesc *notifies);

#ifdef __cplusplus
}
#endif
#endif /* HIXL_ENGINE_H */
