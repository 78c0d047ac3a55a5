/* hixl client/server API: HIXL's HixlCS* functions with their names and signatures
 * (seed 000). A server registers memory and listens; a client connects, learns the
 * server's registrations and moves data with batched one-sided put/get.
 * Every function is safe from any thread, Destroy included: a Destroy refuses new
 * calls on its handle (PARAM_INVALID) and waits for the calls already in flight on it
 * to return, each within its own timeout, before it frees anything. */
#ifndef HIXL_CS_H
#define HIXL_CS_H

#include <stdint.h>

#include "hixl/hixl_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void *HixlServerHandle;
typedef void *HixlClientHandle;
typedef void *CompleteHandle;
typedef void *MemHandle;

#define HIXL_CS_MAX_INFLIGHT_BATCHES 4096 /* uncompleted async batches per client */
#define HIXL_CS_MAX_TAG_LEN          255  /* mem_tag, without the NUL */

/* hixl's memory description (HIXL takes it from hcomm). */
typedef enum {
  HCCL_MEM_TYPE_DEVICE = 0, /* accelerator memory: a CUDA device pointer (docs/device-memory.md);
                               UNSUPPORTED, with a sentence, where no CUDA driver is found */
  HCCL_MEM_TYPE_HOST = 1,   /* host memory */
} HcommMemType;

typedef struct HcommMem {
  HcommMemType type;
  void *addr;
  uint64_t size; /* bytes, > 0 */
} HcommMem;

/* hixl's endpoint description (HIXL takes it from hcomm): which transport and which
 * local address or NIC carries the data. */
typedef enum {
  HIXL_EP_PROTOCOL_TCP = 0,  /* available */
  HIXL_EP_PROTOCOL_RDMA = 1, /* RDMA verbs: one-sided WRITE/READ over an RC queue pair */
  HIXL_EP_PROTOCOL_SHM = 2, /* same host: process_vm_readv / writev (a client's Connect fails if it cannot) */
} HixlEndpointProtocol;

typedef struct EndpointDesc {
  HixlEndpointProtocol protocol;
  const char *address; /* IPv4 address: the client's engine address (for rdma, one its device owns) */
  const char *device;  /* NIC name for rdma (e.g. "rxe0"); NULL: found from the address */
} EndpointDesc;

typedef struct HixlServerConfig {
  uint8_t reserved[128]; /* for future use; NULL config means defaults */
} HixlServerConfig;

typedef struct HixlClientConfig {
  uint8_t reserved[128]; /* for future use; NULL config means defaults */
} HixlClientConfig;

typedef struct HixlClientDesc {
  const char *server_ip;               /* server host IPv4 address */
  uint32_t server_port;                /* server port, 1..65535 */
  const EndpointDesc *local_endpoint;  /* protocol and address of this client; NULL: tcp, any address */
  const EndpointDesc *remote_endpoint; /* checked; the server is reached at server_ip */
} HixlClientDesc;

typedef struct HixlServerDesc {
  const char *server_ip;             /* address to listen on ("0.0.0.0" for all) */
  uint32_t server_port;              /* port to listen on, 1..65535 */
  const EndpointDesc *endpoint_list; /* transports offered (an rdma entry: rdma and tcp); none: tcp */
  uint32_t endpoint_list_num;
} HixlServerDesc;

typedef struct HixlOneSideOpDesc {
  void *remote_buf; /* inside memory the server registered */
  void *local_buf;  /* inside memory this client registered (else staged); NULL is PARAM_INVALID */
  uint64_t len;     /* bytes, > 0 */
} HixlOneSideOpDesc;

typedef enum HixlCompleteStatus {
  HIXL_COMPLETE_STATUS_WAITING,
  HIXL_COMPLETE_STATUS_COMPLETED,
  HIXL_COMPLETE_STATUS_TIMEOUT, /* the batch outlived its timeout (env HIXL_CS_BATCH_TIMEOUT_MS) */
  HIXL_COMPLETE_STATUS_FAILED,  /* the server refused a range, or the link broke */
} HixlCompleteStatus;

/** Create a server for server_ip:server_port; config may be NULL. */
HIXL_API HixlStatus HixlCSServerCreate(const HixlServerDesc *server_desc, const HixlServerConfig *config,
                                       HixlServerHandle *server_handle);
/** Register memory clients may read and write; mem_tag may be NULL. */
HIXL_API HixlStatus HixlCSServerRegMem(HixlServerHandle server_handle, const char *mem_tag,
                                       const HcommMem *mem, MemHandle *mem_handle);
/** Start accepting clients; backlog 0 means the default (512). */
HIXL_API HixlStatus HixlCSServerListen(HixlServerHandle server_handle, uint32_t backlog);
/** Deregister. A client's transfer still moving data in it ends FAILED there (its link
 *  is cut), as HixlEngineDeregisterMem says. */
HIXL_API HixlStatus HixlCSServerUnregMem(HixlServerHandle server_handle, MemHandle mem_handle);
/** Refuse new calls, wait for those in flight on this handle, close every client link
 *  (their batches end FAILED) and free the server. */
HIXL_API HixlStatus HixlCSServerDestroy(HixlServerHandle server_handle);

/** Create a client for the server in client_desc; config may be NULL. */
HIXL_API HixlStatus HixlCSClientCreate(const HixlClientDesc *client_desc, const HixlClientConfig *config,
                                       HixlClientHandle *client_handle);
/** Link to the server, retrying until timeout_ms (0: 1000 ms) while it does not listen yet.
 *  After a failure or a lost link, Connect may simply be called again; on a live link
 *  it is HIXL_SUCCESS (with a warning, as HIXL answers) and the link stays. */
HIXL_API HixlStatus HixlCSClientConnect(HixlClientHandle client_handle, uint32_t timeout_ms);
/** The server's registrations and their tags, as of now (one round trip of at most
 *  timeout_ms, 0: 1000 ms). The arrays belong to the
 *  client and stay valid until the next call or HixlCSClientDestroy: the next call from
 *  any thread, so threads that share a client and read these arrays must take turns
 *  (the one exception to "safe from any thread": the seed hands the arrays out so). */
HIXL_API HixlStatus HixlCSClientGetRemoteMem(HixlClientHandle client_handle, HcommMem **remote_mem_list,
                                             char ***mem_tag_list, uint32_t *list_num, uint32_t timeout_ms);
/** Register local memory for put/get; mem_tag may be NULL. */
HIXL_API HixlStatus HixlCSClientRegMem(HixlClientHandle client_handle, const char *mem_tag,
                                       const HcommMem *mem, MemHandle *mem_handle);
HIXL_API HixlStatus HixlCSClientUnregMem(HixlClientHandle client_handle, MemHandle mem_handle);
/** Start writing local_buf to remote_buf for each op; poll complete_handle.
 *  An op whose remote range the server has not registered is refused here, with
 *  HIXL_FAILED and a message naming the range: nothing is sent and no handle made. */
HIXL_API HixlStatus HixlCSClientBatchPutAsync(HixlClientHandle client_handle, uint32_t list_num,
                                              const HixlOneSideOpDesc *desc_list,
                                              CompleteHandle *complete_handle);
/** Start reading remote_buf into local_buf for each op; poll complete_handle.
 *  Refuses unregistered remote ranges as BatchPutAsync does. */
HIXL_API HixlStatus HixlCSClientBatchGetAsync(HixlClientHandle client_handle, uint32_t list_num,
                                              const HixlOneSideOpDesc *desc_list,
                                              CompleteHandle *complete_handle);
/** Where a batch stands. A final status (COMPLETED, TIMEOUT, FAILED) releases the
 *  handle: querying it again is PARAM_INVALID. */
HIXL_API HixlStatus HixlCSClientQueryCompleteStatus(HixlClientHandle client_handle,
                                                    CompleteHandle complete_handle,
                                                    HixlCompleteStatus *complete_status);
/** Put and wait, up to timeout_ms (0: 1000 ms). */
HIXL_API HixlStatus HixlCSClientBatchPutSync(HixlClientHandle client_handle, uint32_t list_num,
                                             const HixlOneSideOpDesc *desc_list, uint32_t timeout_ms);
/** Get and wait, up to timeout_ms (0: 1000 ms). */
HIXL_API HixlStatus HixlCSClientBatchGetSync(HixlClientHandle client_handle, uint32_t list_num,
                                             const HixlOneSideOpDesc *desc_list, uint32_t timeout_ms);
/** Refuse new calls, wait for those in flight on this handle (a sync batch up to its
 *  timeout), close the link (async batches still in flight end FAILED), free the client. */
HIXL_API HixlStatus HixlCSClientDestroy(HixlClientHandle client_handle);

#ifdef __cplusplus
}
#endif
#endif /* HIXL_CS_H */
