/* hixl cache manager: KV caches (per-layer K and V tensors, contiguous or paged in
 * blocks) moved between engines by key, the C form of LLM-DataDist's CacheManager.
 * Every function is safe from any thread. */
#ifndef HIXL_CACHE_H
#define HIXL_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "hixl/hixl_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HIXL_CACHE_MAX_DIMS          8    /* dimensions of a cache's shape */
#define HIXL_CACHE_MAX_ADDRS         2048 /* tensor addresses registered per manager, all caches (HIXL: 240) */
#define HIXL_CACHE_MAX_CONFIGS       64   /* transfer configs of one HixlCacheManagerTransferCacheAsync */
#define HIXL_CACHE_PREFIX_NONE       UINT64_MAX /* CacheKey.prefix_id when the key has no prefix */
#define HIXL_CACHE_TENSORS_PER_LAYER 2          /* default: K and V */

typedef struct HixlCacheManager HixlCacheManager; /* opaque */
typedef struct HixlCacheTask HixlCacheTask;       /* opaque, from TransferCacheAsync */

typedef enum { HIXL_CACHE_HOST = 0, HIXL_CACHE_DEVICE = 1 } HixlCachePlacement;

/* remote_accessible of the seed: DEFAULT is its default for the placement (host:
 * no; device: yes). A cache peers may reach is registered with the engine; one they
 * may not is only recorded, and the engine stages its bytes through its BufferPool. */
typedef enum {
  HIXL_CACHE_ACCESS_DEFAULT = 0,
  HIXL_CACHE_ACCESS_LOCAL = 1,
  HIXL_CACHE_ACCESS_REMOTE = 2
} HixlCacheAccess;

/* What a cache holds: num_tensors tensors (layer l's are l * tensors_per_layer ...,
 * K before V), each at its own address, each of elem_size * shape[0] * ... bytes.
 * shape[0] is the batch size of a contiguous cache, the number of blocks of a
 * blocks cache; a batch item or a block is a tensor's bytes / shape[0]. */
typedef struct {
  uint32_t num_tensors;
  uint32_t elem_size; /* bytes of one element (the data type's size) */
  uint32_t num_dims;  /* in [1, HIXL_CACHE_MAX_DIMS] */
  uint64_t shape[HIXL_CACHE_MAX_DIMS];
  /* HIXL_CACHE_DEVICE: the tensors are CUDA device memory (docs/device-memory.md),
   * registered as such, remotely accessible (the seed's default for device memory;
   * LOCAL is UNSUPPORTED, and so is allocating it: the runtime allocates device
   * memory). UNSUPPORTED with a sentence where no CUDA driver is found. */
  HixlCachePlacement placement;
} HixlCacheDesc;

/* Keys, as the seed defines them. cluster_id names the manager holding the cache. */
typedef struct {
  uint64_t cluster_id;
  uint64_t req_id;
  uint64_t model_id;  /* default 0 */
  uint64_t prefix_id; /* default HIXL_CACHE_PREFIX_NONE */
} HixlCacheKey;
#define HIXL_CACHE_KEY_INIT(cluster, req)                                                                    \
  { (cluster), (req), 0, HIXL_CACHE_PREFIX_NONE }

typedef struct {
  uint64_t cluster_id;
  uint64_t cache_id;
  uint32_t batch_index; /* default 0 */
} HixlCacheKeyByIdAndIndex;

typedef struct {
  uint64_t cluster_id;
  uint64_t model_id; /* default 0 */
} HixlBlocksCacheKey;

typedef enum { HIXL_CACHE_KEY_REQ = 0, HIXL_CACHE_KEY_ID = 1, HIXL_CACHE_KEY_BLOCKS = 2 } HixlCacheKeyKind;

/* Any of the three keys, where the seed takes a Union. */
typedef struct {
  HixlCacheKeyKind kind;
  union {
    HixlCacheKey req;
    HixlCacheKeyByIdAndIndex id;
    HixlBlocksCacheKey blocks;
  } u;
} HixlCacheAnyKey;

/* The optional arguments of pull and push (NULL: all defaults). A layer range is
 * [start, start + count) with step 1; count 0 means every layer. With every layer on
 * both sides (both counts 0) every tensor moves, tensor i to tensor i (equal counts),
 * and tensor_num_per_layer is not used: the seed asks it to divide only with a range. */
typedef struct {
  int64_t size; /* bytes per tensor; -1: a whole batch item (pull_cache, push_cache) */
  uint32_t src_layer_start, src_layer_count;
  uint32_t dst_layer_start, dst_layer_count;
  uint32_t tensor_num_per_layer; /* with a range: in [1, num_tensors], dividing it; 0: the default 2 */
  int32_t timeout_ms;            /* the whole call: its lookup and its transfer; 0: HIXL_DEFAULT_TIMEOUT_MS */
} HixlCacheTransferArgs;
#define HIXL_CACHE_TRANSFER_ARGS_INIT                                                                        \
  { -1, 0, 0, 0, 0, HIXL_CACHE_TENSORS_PER_LAYER, 0 }

/** Make a manager for engine (initialized, and listening if peers pull from it or
 *  push to it) under cluster_id. One manager per engine. */
HIXL_API HixlStatus HixlCacheManagerCreate(HixlEngine *engine, uint64_t cluster_id, HixlCacheManager **mgr);

/** Unregister every cache, unlink every cluster and free the manager (the engine
 *  stays the caller's). FAILED, and nothing freed, while an async task exists or
 *  another call on the manager is under way (new calls, GetStats too, are refused once
 *  Destroy has begun; none may begin once it may have returned: the handle is freed
 *  then). FAILED too when the engine refuses a cache's deregistration (a transfer of
 *  the caller's own in flight on its memory): that cache, the ones after it and the
 *  manager stay, usable, for Destroy again; the caches before it are gone. After the
 *  engine's Finalize (its registrations released) Destroy frees everything. */
HIXL_API HixlStatus HixlCacheManagerDestroy(HixlCacheManager *mgr);

/** Link remote_cluster_id to the manager at remote_engine ("ip:port"): connects
 *  the engine when it is not yet, and checks that the peer's manager is that
 *  cluster (PARAM_INVALID naming both ids if not). Linked already: ALREADY_CONNECTED,
 *  unless the engine link to it was lost (the peer closed or cut it): then it connects
 *  again to the address linked first and checks the cluster again (SUCCESS; caches
 *  looked up there stay known unless the peer's manager restarted). */
HIXL_API HixlStatus HixlCacheManagerLink(HixlCacheManager *mgr, uint64_t remote_cluster_id,
                                         const char *remote_engine, int32_t timeout_ms);

/** Forget remote_cluster_id and what was looked up there; disconnects the engine
 *  link if Link made it. */
HIXL_API HixlStatus HixlCacheManagerUnlink(HixlCacheManager *mgr, uint64_t remote_cluster_id,
                                           int32_t timeout_ms);

/** Register a contiguous cache: addrs[i] is tensor i (num_addrs == desc->num_tensors).
 *  keys[b] (optional, num_keys <= batch size) names batch item b. *cache_id is
 *  never reused by this manager. */
HIXL_API HixlStatus HixlCacheManagerRegisterCache(HixlCacheManager *mgr, const HixlCacheDesc *desc,
                                                  const uintptr_t *addrs, size_t num_addrs,
                                                  const HixlCacheKey *keys, size_t num_keys,
                                                  HixlCacheAccess remote_accessible, uint64_t *cache_id);

/** Register a blocks (paged) cache; key is optional (NULL). */
HIXL_API HixlStatus HixlCacheManagerRegisterBlocksCache(HixlCacheManager *mgr, const HixlCacheDesc *desc,
                                                        const uintptr_t *addrs, size_t num_addrs,
                                                        const HixlBlocksCacheKey *key,
                                                        HixlCacheAccess remote_accessible,
                                                        uint64_t *cache_id);

/** Allocate a contiguous cache's tensors and register them as RegisterCache does,
 *  remotely accessible: addrs[i] (num_addrs == desc->num_tensors) receives tensor
 *  i's address, each at a page boundary, all zeroed. The memory comes from
 *  HixlEngineAllocMem, so a peer engine on the same host maps it and copies with
 *  memcpy (Transport shm); UnregisterCache (or Destroy) frees it. */
HIXL_API HixlStatus HixlCacheManagerAllocateCache(HixlCacheManager *mgr, const HixlCacheDesc *desc,
                                                  const HixlCacheKey *keys, size_t num_keys, uintptr_t *addrs,
                                                  size_t num_addrs, uint64_t *cache_id);

/** Allocate a blocks (paged) cache, as AllocateCache; key is optional (NULL). */
HIXL_API HixlStatus HixlCacheManagerAllocateBlocksCache(HixlCacheManager *mgr, const HixlCacheDesc *desc,
                                                        const HixlBlocksCacheKey *key, uintptr_t *addrs,
                                                        size_t num_addrs, uint64_t *cache_id);

/** Unregister a cache of this manager; peers can no longer find it. FAILED (and
 *  still registered) while a transfer uses it. */
HIXL_API HixlStatus HixlCacheManagerUnregisterCache(HixlCacheManager *mgr, uint64_t cache_id);

/** Copy a remote contiguous cache's batch item (the key's) into local cache_id's
 *  batch_index: args->size bytes of each tensor (-1: the local item's size). */
HIXL_API HixlStatus HixlCacheManagerPullCache(HixlCacheManager *mgr, const HixlCacheAnyKey *key,
                                              uint64_t cache_id, uint32_t batch_index,
                                              const HixlCacheTransferArgs *args);

/** Copy remote blocks into local blocks cache dst_cache_id: src_blocks[j] to
 *  dst_blocks[j] when src_key is a BlocksCacheKey; otherwise src_blocks is empty and
 *  the remote batch item fills dst_blocks in order, one block's bytes each. A block
 *  twice in dst_blocks (two sources into one block), or more dst_blocks than the
 *  cache has blocks: PARAM_INVALID, nothing moved. */
HIXL_API HixlStatus HixlCacheManagerPullBlocks(HixlCacheManager *mgr, const HixlCacheAnyKey *src_key,
                                               uint64_t dst_cache_id, const uint64_t *src_blocks,
                                               size_t num_src_blocks, const uint64_t *dst_blocks,
                                               size_t num_dst_blocks, const HixlCacheTransferArgs *args);

/** Copy local contiguous cache src_cache_id's item src_batch_index into a remote
 *  cache's item (dst_key->batch_index). Source and destination layer ranges must
 *  be equal, as the seed requires. */
HIXL_API HixlStatus HixlCacheManagerPushCache(HixlCacheManager *mgr, const HixlCacheKeyByIdAndIndex *dst_key,
                                              uint64_t src_cache_id, uint32_t src_batch_index,
                                              const HixlCacheTransferArgs *args);

/** Copy local blocks into a remote blocks cache: src_blocks[j] to dst_blocks[j]
 *  (a contiguous local cache: src_blocks empty, its item 0 cut into blocks).
 *  dst_blocks as PullBlocks: each block once, no more than the remote cache has. */
HIXL_API HixlStatus HixlCacheManagerPushBlocks(HixlCacheManager *mgr, const HixlBlocksCacheKey *dst_key,
                                               uint64_t src_cache_id, const uint64_t *src_blocks,
                                               size_t num_src_blocks, const uint64_t *dst_blocks,
                                               size_t num_dst_blocks, const HixlCacheTransferArgs *args);

/* Asked before layer is sent: return 1 once the layer's KV is ready, 0 if it is not
 * within timeout_ms (the task then fails naming the layer; any other value fails it
 * too, naming the value). Called from the task's own thread. It must return within
 * about timeout_ms: hixl cannot stop a thread inside the caller's function, so one that
 * never returns holds the task, HixlCacheTaskDestroy (it waits for the thread) and the
 * manager's Destroy (refused while the task exists) for ever. */
typedef int (*HixlLayerSynchronizeFn)(void *ctx, uint32_t layer, int32_t timeout_ms);

typedef struct {
  HixlLayerSynchronizeFn synchronize_layer;
  void *ctx;
  int32_t timeout_ms; /* per layer; 0: HIXL_DEFAULT_TIMEOUT_MS */
} HixlLayerSynchronizer;

/* Where one copy of the source goes. dst_addrs[i] receives transferred tensor i
 * (layers of the range, tensors_per_layer each, in order): a contiguous source's
 * batch item at dst_addrs[i], or block src_block_indices[j] at dst_addrs[i] +
 * dst_block_indices[j] * dst_block_memory_size. */
typedef struct {
  uint64_t dst_cluster_id; /* linked */
  const uintptr_t *dst_addrs;
  size_t num_dst_addrs;
  uint32_t src_layer_start, src_layer_count; /* count 0: every layer */
  uint32_t src_batch_index;                  /* contiguous source */
} HixlCacheTransferConfig;

typedef struct {
  const uint64_t *src_block_indices; /* blocks source: which blocks */
  size_t num_src_blocks;
  const uint64_t *dst_block_indices; /* blocks destination: where, each once (NULL: contiguous destination) */
  size_t num_dst_blocks;
  uint64_t dst_block_memory_size; /* 0: the source's block size; not 0: only with dst_block_indices */
  uint32_t tensor_num_per_layer;  /* 0: 2 */
  int32_t timeout_ms;             /* the whole task; 0: HIXL_DEFAULT_TIMEOUT_MS */
} HixlCacheAsyncArgs;

/** Send src_cache_id layer by layer to every config: each layer leaves as soon as the
 *  synchronizer releases it, while earlier layers are still in flight. */
HIXL_API HixlStatus HixlCacheManagerTransferCacheAsync(HixlCacheManager *mgr, uint64_t src_cache_id,
                                                       const HixlLayerSynchronizer *sync,
                                                       const HixlCacheTransferConfig *configs,
                                                       size_t num_configs, const HixlCacheAsyncArgs *args,
                                                       HixlCacheTask **task);

/** Wait until the task ends (SUCCESS, or its first failure) or timeout_ms passes
 *  (TIMEOUT; the task goes on). Returns at once once it has ended. */
HIXL_API HixlStatus HixlCacheTaskSynchronize(HixlCacheTask *task, int32_t timeout_ms);

/** One status per config, once the task has ended (else PARAM_INVALID). */
HIXL_API HixlStatus HixlCacheTaskGetResults(HixlCacheTask *task, HixlStatus *results, size_t num_results);

/** Free an ended task; a task still running is stopped first (its layers not yet
 *  sent are not sent; those in flight end or time out). A synchronizer call under way
 *  is waited for: one that never returns holds Destroy for ever. PARAM_INVALID, and
 *  nothing done, on the task's own thread (from its synchronizer). */
HIXL_API HixlStatus HixlCacheTaskDestroy(HixlCacheTask *task);
/* A task handle is a token, not an address: one destroyed is PARAM_INVALID to every
 * call; a Synchronize or GetResults under way in it returns before Destroy frees it. */

/** Reserved by the seed: always UNSUPPORTED. */
HIXL_API HixlStatus HixlCacheManagerRemapRegisteredMemory(HixlCacheManager *mgr, const HixlMemDesc *mems,
                                                          size_t num_mems);

typedef struct {
  uint64_t lookups;     /* control round trips to find a remote cache */
  uint64_t lookup_hits; /* lookups answered from what was remembered */
  uint64_t transfers;   /* pull, push and async layer batches handed to the engine */
  uint64_t engine_ops;  /* op descriptors in them, after coalescing adjacent blocks */
  uint64_t bytes;
} HixlCacheStats;

/** Counters since Create. A call as the others: PARAM_INVALID once Destroy has begun. */
HIXL_API HixlStatus HixlCacheManagerGetStats(HixlCacheManager *mgr, HixlCacheStats *stats);

#ifdef __cplusplus
}
#endif
#endif /* HIXL_CACHE_H */
