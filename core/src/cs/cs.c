/* cs: the HixlCS* client/server API, a thin layer over the engine. A server is an
 * engine that listens; a client is a client-only engine linked to one server. Live
 * handles are tokens kept in a registry (util/handles.h: never an address, never given
 * twice), so a stale or bogus handle is PARAM_INVALID, even once its memory holds a new
 * server or client. */
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_ext.h"
#include "hixl/hixl_cs.h"
#include "hixl/hixl_engine.h"
#include "util/handles.h"
#include "util/log.h"
#include "util/status_int.h"

#define CS_DEFAULT_BATCH_TIMEOUT_MS 30000

/* A handle's first member: the calls in flight on it, under registry_lock. Destroy
 * takes the handle out of the registry (new calls are refused), then waits for them to
 * return (each within its own timeout) before it frees anything. */
struct cs_ref {
  unsigned calls;
};

struct cs_server {
  struct cs_ref ref; /* first */
  HixlEngine *eng;
  uint16_t port;
};

struct cs_client {
  struct cs_ref ref; /* first */
  HixlEngine *eng;
  char remote[64];          /* "server_ip:port" */
  int32_t batch_timeout_ms; /* async batches end TIMEOUT after this */
  pthread_mutex_t lock;     /* guards batches and the GetRemoteMem outputs */
  struct handles batches;   /* CompleteHandles not yet final -> their engine requests (NULL: starting,
                             * the lock released; it counts toward the limit) */
  HcommMem *rmem;           /* last GetRemoteMem output, owned here */
  char **rtags;
  struct hixl_remote_mem *rsnap;
};

/* Live handles, one set per kind: a server handle given to a client call (or the
 * reverse) is as unknown as a freed one. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t registry_cond = PTHREAD_COND_INITIALIZER; /* a handle's last call returned */
static struct handles servers, clients;

/* A call begins on the handle h: its struct cs_server or cs_client, NULL when h is not
 * live. */
static void *registry_enter(struct handles *set, void *h) {
  pthread_mutex_lock(&registry_lock);
  struct cs_ref *ref = handles_get(set, (uintptr_t)h);
  if (ref) ref->calls++;
  pthread_mutex_unlock(&registry_lock);
  return ref;
}

/* ... and returns st. */
static HixlStatus registry_leave(void *h, HixlStatus st) {
  pthread_mutex_lock(&registry_lock);
  if (--((struct cs_ref *)h)->calls == 0) pthread_cond_broadcast(&registry_cond);
  pthread_mutex_unlock(&registry_lock);
  return st;
}

/* obj's handle, or NULL when out of memory. */
static void *registry_add(struct handles *set, void *obj) {
  pthread_mutex_lock(&registry_lock);
  uintptr_t token = handles_add(set, obj);
  pthread_mutex_unlock(&registry_lock);
  return (void *)token;
}

/* Take the handle h out (no new call begins on it) and wait until its calls in flight
 * returned: its object, NULL when h is not live. */
static void *registry_del(struct handles *set, void *h) {
  pthread_mutex_lock(&registry_lock);
  struct cs_ref *ref = handles_del(set, (uintptr_t)h);
  if (set->count == 0) handles_free(set);
  while (ref && ref->calls > 0) pthread_cond_wait(&registry_cond, &registry_lock);
  pthread_mutex_unlock(&registry_lock);
  return ref;
}

#define CHECK_ARG(cond, ...)                                                                                 \
  do {                                                                                                       \
    if (!(cond)) return hixl_fail(HIXL_PARAM_INVALID, __VA_ARGS__);                                          \
  } while (0)

static HixlStatus check_ipv4(const char *ip, const char *what, const char *fn) {
  struct in_addr a;
  CHECK_ARG(ip && inet_pton(AF_INET, ip, &a) == 1, "%s: %s \"%s\" is not an IPv4 address", fn, what,
            ip ? ip : "(null)");
  return HIXL_SUCCESS;
}

/* tcp, rdma and shm (the same-host transport) are available. */
static HixlStatus check_endpoint(const EndpointDesc *ep, const char *what, const char *fn) {
  HixlStatus st;
  if (!ep) return HIXL_SUCCESS;
  size_t dev_len = ep->device ? strnlen(ep->device, 64) : 0; /* it may lack a NUL */
  CHECK_ARG(!ep->device || (dev_len > 0 && dev_len < 64), "%s: %s device name is empty or too long", fn,
            what);
  CHECK_ARG(ep->protocol == HIXL_EP_PROTOCOL_TCP || ep->protocol == HIXL_EP_PROTOCOL_RDMA ||
                ep->protocol == HIXL_EP_PROTOCOL_SHM,
            "%s: %s protocol %d is unknown", fn, what, (int)ep->protocol);
  if (ep->address && (st = check_ipv4(ep->address, "endpoint address", fn)) != HIXL_SUCCESS) return st;
  return HIXL_SUCCESS;
}

/* An engine for local with the endpoint's transport: tcp, or rdma on ep->device (or
 * the device that owns local). A server offering rdma takes "auto" so clients that
 * ask for tcp are still served over tcp. */
static HixlStatus engine_new(const char *local, const char *transport, const char *device, HixlEngine **out) {
  HixlOption opts[2] = {{"Transport", transport}, {"RdmaDevice", device}};
  HixlEngine *e;
  HixlStatus st = HixlEngineCreate(&e);
  if (st != HIXL_SUCCESS) return st;
  st = HixlEngineInitialize(e, local, opts, device ? 2 : 1);
  if (st != HIXL_SUCCESS) {
    HixlEngineDestroy(e);
    return st;
  }
  *out = e;
  return HIXL_SUCCESS;
}

/* Server and client RegMem alike: mem registered with eng under tag, host memory or
 * device memory (a CUDA device pointer: the engine's provider finds its device, and
 * refuses it UNSUPPORTED with a sentence where there is none); fn names the public
 * call in errors. */
static HixlStatus reg_mem(HixlEngine *eng, const char *tag, const HcommMem *mem, const char *fn,
                          MemHandle *mem_handle) {
  HixlMemHandle h;
  CHECK_ARG(mem_handle, "%s: mem_handle is NULL", fn);
  CHECK_ARG(mem, "%s: mem is NULL", fn);
  CHECK_ARG(!tag || strnlen(tag, HIXL_CS_MAX_TAG_LEN + 1) <= HIXL_CS_MAX_TAG_LEN,
            "%s: mem_tag is longer than %d bytes", fn, HIXL_CS_MAX_TAG_LEN);
  CHECK_ARG(mem->type == HCCL_MEM_TYPE_HOST || mem->type == HCCL_MEM_TYPE_DEVICE,
            "%s: memory type %d is unknown", fn, (int)mem->type);
  HixlMemDesc d = {.addr = (uintptr_t)mem->addr, .len = (size_t)mem->size};
  HixlStatus st = hixl_engine_register_tagged(
      eng, &d, mem->type == HCCL_MEM_TYPE_DEVICE ? HIXL_MEM_DEVICE : HIXL_MEM_HOST, tag, &h);
  if (st == HIXL_SUCCESS) *mem_handle = h;
  return st;
}

/* ---- server ---- */

HixlStatus HixlCSServerCreate(const HixlServerDesc *desc, const HixlServerConfig *config,
                              HixlServerHandle *server_handle) {
  const char *fn = "HixlCSServerCreate";
  HixlStatus st;
  (void)config; /* reserved */
  CHECK_ARG(desc && server_handle, "%s: server_desc or server_handle is NULL", fn);
  if ((st = check_ipv4(desc->server_ip, "server_ip", fn)) != HIXL_SUCCESS) return st;
  CHECK_ARG(desc->server_port >= 1 && desc->server_port <= 65535, "%s: server_port %u is not in [1,65535]",
            fn, desc->server_port);
  CHECK_ARG(desc->endpoint_list_num == 0 || desc->endpoint_list, "%s: endpoint_list is NULL but num is %u",
            fn, desc->endpoint_list_num);
  for (uint32_t i = 0; i < desc->endpoint_list_num; i++)
    if ((st = check_endpoint(&desc->endpoint_list[i], "endpoint", fn)) != HIXL_SUCCESS) return st;
  struct cs_server *s = calloc(1, sizeof(*s));
  if (!s) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  s->port = (uint16_t)desc->server_port;
  /* Offering rdma or shm: auto, which serves those and tcp alike. */
  const char *transport = "tcp", *device = NULL;
  for (uint32_t i = 0; i < desc->endpoint_list_num; i++) {
    if (desc->endpoint_list[i].protocol == HIXL_EP_PROTOCOL_RDMA) device = desc->endpoint_list[i].device;
    if (desc->endpoint_list[i].protocol != HIXL_EP_PROTOCOL_TCP) transport = "auto";
  }
  if ((st = engine_new(desc->server_ip, transport, device, &s->eng)) != HIXL_SUCCESS) goto free_server;
  if (!(*server_handle = registry_add(&servers, s))) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
    goto destroy_engine;
  }
  return HIXL_SUCCESS;
destroy_engine:
  HixlEngineDestroy(s->eng);
free_server:
  free(s);
  return st;
}

#define SERVER(h, fn)                                                                                        \
  struct cs_server *s = registry_enter(&servers, (h));                                                       \
  if (!s) return hixl_fail(HIXL_PARAM_INVALID, "%s: server handle %p is unknown or destroyed", fn, (h))

HixlStatus HixlCSServerRegMem(HixlServerHandle server_handle, const char *mem_tag, const HcommMem *mem,
                              MemHandle *mem_handle) {
  SERVER(server_handle, "HixlCSServerRegMem");
  return registry_leave(s, reg_mem(s->eng, mem_tag, mem, "HixlCSServerRegMem", mem_handle));
}

HixlStatus HixlCSServerListen(HixlServerHandle server_handle, uint32_t backlog) {
  CHECK_ARG(backlog <= 65535, "HixlCSServerListen: backlog %u is larger than 65535", backlog);
  SERVER(server_handle, "HixlCSServerListen");
  return registry_leave(s, hixl_engine_listen(s->eng, s->port, (int)backlog));
}

HixlStatus HixlCSServerUnregMem(HixlServerHandle server_handle, MemHandle mem_handle) {
  SERVER(server_handle, "HixlCSServerUnregMem");
  return registry_leave(s, HixlEngineDeregisterMem(s->eng, mem_handle));
}

HixlStatus HixlCSServerDestroy(HixlServerHandle server_handle) {
  struct cs_server *s = registry_del(&servers, server_handle);
  if (!s)
    return hixl_fail(HIXL_PARAM_INVALID, "HixlCSServerDestroy: server handle %p is unknown or destroyed",
                     server_handle);
  HixlEngineDestroy(s->eng); /* closes client links: their batches end FAILED */
  free(s);
  return HIXL_SUCCESS;
}

/* ---- client ---- */

HixlStatus HixlCSClientCreate(const HixlClientDesc *desc, const HixlClientConfig *config,
                              HixlClientHandle *client_handle) {
  const char *fn = "HixlCSClientCreate";
  HixlStatus st;
  (void)config; /* reserved */
  CHECK_ARG(desc && client_handle, "%s: client_desc or client_handle is NULL", fn);
  if ((st = check_ipv4(desc->server_ip, "server_ip", fn)) != HIXL_SUCCESS) return st;
  CHECK_ARG(desc->server_port >= 1 && desc->server_port <= 65535, "%s: server_port %u is not in [1,65535]",
            fn, desc->server_port);
  if ((st = check_endpoint(desc->local_endpoint, "local_endpoint", fn)) != HIXL_SUCCESS) return st;
  if ((st = check_endpoint(desc->remote_endpoint, "remote_endpoint", fn)) != HIXL_SUCCESS) return st;
  struct cs_client *c = calloc(1, sizeof(*c));
  if (!c) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  snprintf(c->remote, sizeof(c->remote), "%s:%u", desc->server_ip, desc->server_port);
  c->batch_timeout_ms = CS_DEFAULT_BATCH_TIMEOUT_MS;
  const char *env = getenv("HIXL_CS_BATCH_TIMEOUT_MS");
  if (env) {
    char *end;
    long v = strtol(env, &end, 10);
    if (*end || v <= 0 || v > INT32_MAX) {
      free(c);
      return hixl_fail(HIXL_PARAM_INVALID, "%s: HIXL_CS_BATCH_TIMEOUT_MS \"%s\" is not in [1,%d]", fn, env,
                       INT32_MAX);
    }
    c->batch_timeout_ms = (int32_t)v;
  }
  pthread_mutex_init(&c->lock, NULL);
  const char *local =
      desc->local_endpoint && desc->local_endpoint->address ? desc->local_endpoint->address : "0.0.0.0";
  HixlEndpointProtocol proto = desc->local_endpoint ? desc->local_endpoint->protocol : HIXL_EP_PROTOCOL_TCP;
  bool rdma = proto == HIXL_EP_PROTOCOL_RDMA;
  const char *transport = rdma ? "rdma" : proto == HIXL_EP_PROTOCOL_SHM ? "shm" : "tcp";
  if ((st = engine_new(local, transport, rdma ? desc->local_endpoint->device : NULL, &c->eng)) !=
      HIXL_SUCCESS)
    goto free_client;
  if (!(*client_handle = registry_add(&clients, c))) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
    goto destroy_engine;
  }
  return HIXL_SUCCESS;
destroy_engine:
  HixlEngineDestroy(c->eng);
free_client:
  pthread_mutex_destroy(&c->lock);
  free(c);
  return st;
}

#define CLIENT(h, fn)                                                                                        \
  struct cs_client *c = registry_enter(&clients, (h));                                                       \
  if (!c) return hixl_fail(HIXL_PARAM_INVALID, "%s: client handle %p is unknown or destroyed", fn, (h))

static int32_t timeout_arg(uint32_t timeout_ms) {
  return timeout_ms > (uint32_t)INT32_MAX ? INT32_MAX : (int32_t)timeout_ms;
}

HixlStatus HixlCSClientConnect(HixlClientHandle client_handle, uint32_t timeout_ms) {
  CLIENT(client_handle, "HixlCSClientConnect");
  HixlStatus st = HixlEngineConnect(c->eng, c->remote, timeout_arg(timeout_ms));
  if (st == HIXL_ALREADY_CONNECTED) { /* connected, as the seed's SUCCESS says; HIXL warns and succeeds */
    log_warn("HixlCSClientConnect: client %p is connected to %s already; the link is kept", client_handle,
             c->remote);
    st = HIXL_SUCCESS;
  }
  return registry_leave(c, st);
}

static void free_remote_outputs(struct cs_client *c) {
  free(c->rmem);
  free(c->rtags);
  free(c->rsnap);
  c->rmem = NULL;
  c->rtags = NULL;
  c->rsnap = NULL;
}

static HixlStatus get_remote_mem(struct cs_client *c, HcommMem **remote_mem_list, char ***mem_tag_list,
                                 uint32_t *list_num, uint32_t timeout_ms) {
  struct hixl_remote_mem *snap;
  size_t n;
  CHECK_ARG(remote_mem_list && mem_tag_list && list_num,
            "HixlCSClientGetRemoteMem: remote_mem_list, mem_tag_list or list_num is NULL");
  HixlStatus st = hixl_engine_remote_mems(c->eng, c->remote, timeout_arg(timeout_ms), &snap, &n);
  if (st != HIXL_SUCCESS) return st;
  HcommMem *mems = calloc(n ? n : 1, sizeof(*mems));
  char **tags = calloc(n ? n : 1, sizeof(*tags));
  if (!mems || !tags) {
    free(mems);
    free(tags);
    free(snap);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlCSClientGetRemoteMem: out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    mems[i].type = snap[i].device ? HCCL_MEM_TYPE_DEVICE : HCCL_MEM_TYPE_HOST;
    mems[i].addr = (void *)(uintptr_t)snap[i].addr;
    mems[i].size = snap[i].len;
    tags[i] = (char *)snap[i].tag;
  }
  pthread_mutex_lock(&c->lock);
  free_remote_outputs(c); /* the previous call's output, as the seed says */
  c->rmem = mems;
  c->rtags = tags;
  c->rsnap = snap;
  pthread_mutex_unlock(&c->lock);
  *remote_mem_list = mems;
  *mem_tag_list = tags;
  *list_num = (uint32_t)n;
  return HIXL_SUCCESS;
}

HixlStatus HixlCSClientGetRemoteMem(HixlClientHandle client_handle, HcommMem **remote_mem_list,
                                    char ***mem_tag_list, uint32_t *list_num, uint32_t timeout_ms) {
  CLIENT(client_handle, "HixlCSClientGetRemoteMem");
  return registry_leave(c, get_remote_mem(c, remote_mem_list, mem_tag_list, list_num, timeout_ms));
}

HixlStatus HixlCSClientRegMem(HixlClientHandle client_handle, const char *mem_tag, const HcommMem *mem,
                              MemHandle *mem_handle) {
  CLIENT(client_handle, "HixlCSClientRegMem");
  return registry_leave(c, reg_mem(c->eng, mem_tag, mem, "HixlCSClientRegMem", mem_handle));
}

HixlStatus HixlCSClientUnregMem(HixlClientHandle client_handle, MemHandle mem_handle) {
  CLIENT(client_handle, "HixlCSClientUnregMem");
  return registry_leave(c, HixlEngineDeregisterMem(c->eng, mem_handle));
}

/* HixlOneSideOpDesc[] -> HixlTransferOpDesc[] (the caller frees *out). */
static HixlStatus to_ops(uint32_t n, const HixlOneSideOpDesc *list, const char *fn,
                         HixlTransferOpDesc **out) {
  CHECK_ARG(list && n > 0, "%s: need list_num > 0 and a desc_list", fn);
  /* Before reading the list or allocating for it. */
  CHECK_ARG(n <= HIXL_MAX_BATCH, "%s: list_num %u is more than %d ops", fn, n, HIXL_MAX_BATCH);
  HixlTransferOpDesc *ops = malloc(n * sizeof(*ops));
  if (!ops) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  for (uint32_t i = 0; i < n; i++) {
    if (list[i].len > SIZE_MAX) {
      free(ops);
      return hixl_fail(HIXL_PARAM_INVALID, "%s: op %u length does not fit in memory", fn, i);
    }
    /* Refused here: the engine reads a NULL destination as "discard" (a get would end
     * COMPLETED with its bytes dropped) and a put from it resets the link. */
    if (!list[i].local_buf) {
      free(ops);
      return hixl_fail(HIXL_PARAM_INVALID, "%s: op %u local_buf is NULL; nothing was sent", fn, i);
    }
    ops[i].local_addr = (uintptr_t)list[i].local_buf;
    ops[i].remote_addr = (uintptr_t)list[i].remote_buf;
    ops[i].len = (size_t)list[i].len;
  }
  *out = ops;
  return HIXL_SUCCESS;
}

static HixlStatus batch_async(struct cs_client *c, HixlTransferOp op, uint32_t n,
                              const HixlOneSideOpDesc *list, CompleteHandle *complete_handle,
                              const char *fn) {
  HixlTransferOpDesc *ops = NULL;
  HixlTransferReq req;
  CHECK_ARG(complete_handle, "%s: complete_handle is NULL", fn);
  HixlStatus st = to_ops(n, list, fn, &ops);
  if (st != HIXL_SUCCESS) return st;
  /* The batch's handle first (a place toward the limit, and its memory), so that once
   * the transfer has started nothing can fail. */
  uintptr_t token = 0;
  pthread_mutex_lock(&c->lock);
  bool full = c->batches.count >= HIXL_CS_MAX_INFLIGHT_BATCHES;
  if (!full) token = handles_add(&c->batches, NULL);
  pthread_mutex_unlock(&c->lock);
  if (full) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED,
                   "%s: %d batches are not completed yet (the limit); query them with "
                   "HixlCSClientQueryCompleteStatus first",
                   fn, HIXL_CS_MAX_INFLIGHT_BATCHES);
  } else if (!token) {
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  } else {
    /* Without the client's lock: the engine may wait for the server's table first (a
     * range it has not heard of yet), up to the batch's timeout, and the client's other
     * calls go on meanwhile. */
    st = HixlEngineTransferAsync(c->eng, c->remote, op, ops, n, c->batch_timeout_ms, NULL, &req);
    pthread_mutex_lock(&c->lock);
    if (st == HIXL_SUCCESS)
      handles_set(&c->batches, token, req);
    else
      handles_del(&c->batches, token);
    pthread_mutex_unlock(&c->lock);
  }
  free(ops);
  if (st == HIXL_SUCCESS) *complete_handle = (CompleteHandle)token;
  return st;
}

HixlStatus HixlCSClientBatchPutAsync(HixlClientHandle client_handle, uint32_t list_num,
                                     const HixlOneSideOpDesc *desc_list, CompleteHandle *complete_handle) {
  CLIENT(client_handle, "HixlCSClientBatchPutAsync");
  return registry_leave(
      c, batch_async(c, HIXL_WRITE, list_num, desc_list, complete_handle, "HixlCSClientBatchPutAsync"));
}

HixlStatus HixlCSClientBatchGetAsync(HixlClientHandle client_handle, uint32_t list_num,
                                     const HixlOneSideOpDesc *desc_list, CompleteHandle *complete_handle) {
  CLIENT(client_handle, "HixlCSClientBatchGetAsync");
  return registry_leave(
      c, batch_async(c, HIXL_READ, list_num, desc_list, complete_handle, "HixlCSClientBatchGetAsync"));
}

static HixlStatus query_status(struct cs_client *c, CompleteHandle complete_handle,
                               HixlCompleteStatus *complete_status) {
  HixlTransferStatus ts;
  CHECK_ARG(complete_status, "HixlCSClientQueryCompleteStatus: complete_status is NULL");
  pthread_mutex_lock(&c->lock);
  HixlTransferReq req = handles_get(&c->batches, (uintptr_t)complete_handle);
  if (!req) { /* unknown, final already, or still starting (its handle not given out yet) */
    pthread_mutex_unlock(&c->lock);
    return hixl_fail(HIXL_PARAM_INVALID,
                     "HixlCSClientQueryCompleteStatus: complete_handle %p is unknown or was already released "
                     "by a final status",
                     complete_handle);
  }
  HixlStatus st = HixlEngineGetTransferStatus(c->eng, req, &ts);
  if (st == HIXL_SUCCESS && ts != HIXL_TRANSFER_WAITING) handles_del(&c->batches, (uintptr_t)complete_handle);
  pthread_mutex_unlock(&c->lock);
  if (st != HIXL_SUCCESS) return st;
  static const HixlCompleteStatus map[] = {
      [HIXL_TRANSFER_WAITING] = HIXL_COMPLETE_STATUS_WAITING,
      [HIXL_TRANSFER_COMPLETED] = HIXL_COMPLETE_STATUS_COMPLETED,
      [HIXL_TRANSFER_TIMEOUT] = HIXL_COMPLETE_STATUS_TIMEOUT,
      [HIXL_TRANSFER_FAILED] = HIXL_COMPLETE_STATUS_FAILED,
  };
  *complete_status = map[ts];
  return HIXL_SUCCESS;
}

HixlStatus HixlCSClientQueryCompleteStatus(HixlClientHandle client_handle, CompleteHandle complete_handle,
                                           HixlCompleteStatus *complete_status) {
  CLIENT(client_handle, "HixlCSClientQueryCompleteStatus");
  return registry_leave(c, query_status(c, complete_handle, complete_status));
}

static HixlStatus batch_sync(struct cs_client *c, HixlTransferOp op, uint32_t n,
                             const HixlOneSideOpDesc *list, uint32_t timeout_ms, const char *fn) {
  HixlTransferOpDesc *ops = NULL;
  HixlStatus st = to_ops(n, list, fn, &ops);
  if (st != HIXL_SUCCESS) return st;
  st = HixlEngineTransferSync(c->eng, c->remote, op, ops, n, timeout_arg(timeout_ms));
  free(ops);
  return st;
}

HixlStatus HixlCSClientBatchPutSync(HixlClientHandle client_handle, uint32_t list_num,
                                    const HixlOneSideOpDesc *desc_list, uint32_t timeout_ms) {
  CLIENT(client_handle, "HixlCSClientBatchPutSync");
  return registry_leave(
      c, batch_sync(c, HIXL_WRITE, list_num, desc_list, timeout_ms, "HixlCSClientBatchPutSync"));
}

HixlStatus HixlCSClientBatchGetSync(HixlClientHandle client_handle, uint32_t list_num,
                                    const HixlOneSideOpDesc *desc_list, uint32_t timeout_ms) {
  CLIENT(client_handle, "HixlCSClientBatchGetSync");
  return registry_leave(
      c, batch_sync(c, HIXL_READ, list_num, desc_list, timeout_ms, "HixlCSClientBatchGetSync"));
}

HixlStatus HixlCSClientDestroy(HixlClientHandle client_handle) {
  struct cs_client *c = registry_del(&clients, client_handle);
  if (!c)
    return hixl_fail(HIXL_PARAM_INVALID, "HixlCSClientDestroy: client handle %p is unknown or destroyed",
                     client_handle);
  HixlEngineDestroy(c->eng); /* batches in flight end FAILED; the engine frees them */
  handles_free(&c->batches);
  free_remote_outputs(c);
  pthread_mutex_destroy(&c->lock);
  free(c);
  return HIXL_SUCCESS;
}
