/* hixl KV connector: the ABI between a serving runtime (the host) and
 * libhixl_kv_connector.so, which the host dlopens. Plain C, nothing else included
 * from hixl: a host needs this header only.
 *
 * The plugin exports one symbol, HIXL_KV_ENTRY_SYMBOL, of type hixl_kv_entry_fn. It
 * returns the ops table for the ABI major version the host asks for. The table
 * starts with its version and size and only grows at its end: a host built against
 * an older (smaller) table simply never reads past it, and a host calls an op only
 * when HIXL_KV_HAS_OP(ops, op) holds. No op is NULL; an op the plugin does not
 * implement returns HIXL_KV_UNSUPPORTED.
 *
 * Conventions: every op returns a status (the values are HixlStatus's); strings
 * and arrays cross as pointer and length, and need not be NUL-terminated; outputs
 * come last and are written only on success; memory the plugin returns is released
 * by ops->free_buffer or ops->free_ids. Every op is safe from any thread.
 *
 * Structs: one the plugin fills that may grow starts with a size the host sets
 * (hixl_kv_stats_ex); hixl_kv_buffer, hixl_kv_ids, hixl_kv_blocks and hixl_kv_stats
 * are frozen as they are and never grow. */
#ifndef HIXL_KV_CONNECTOR_H
#define HIXL_KV_CONNECTOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HIXL_KV_ABI_MAJOR    1u
#define HIXL_KV_ABI_MINOR    6u
#define HIXL_KV_ABI_VERSION  ((HIXL_KV_ABI_MAJOR << 16) | HIXL_KV_ABI_MINOR)
#define HIXL_KV_ENTRY_SYMBOL "hixl_kv_connector_entry"

/* Status values (HixlStatus's, so logs agree with the rest of hixl). */
#define HIXL_KV_SUCCESS            0
#define HIXL_KV_PARAM_INVALID      103900
#define HIXL_KV_TIMEOUT            103901
#define HIXL_KV_NOT_CONNECTED      103902
#define HIXL_KV_UNSUPPORTED        103905
#define HIXL_KV_NOT_FOUND          103906
#define HIXL_KV_RESOURCE_EXHAUSTED 203900
#define HIXL_KV_FAILED             503900
typedef uint32_t hixl_kv_status;

/* The connector's two roles, as vLLM's KVConnectorRole. */
#define HIXL_KV_ROLE_SCHEDULER 0
#define HIXL_KV_ROLE_WORKER    1

/* get_num_new_matched_tokens: no answer yet, ask again in a later step. */
#define HIXL_KV_TOKENS_LATER (-1)

typedef struct hixl_kv_connector hixl_kv_connector; /* opaque */

/* hixl_kv_request.flags */
#define HIXL_KV_REQ_ABORTED 0x1u /* request_finished: the request was aborted, not completed */

/* A request as the runtime knows it. */
typedef struct {
  const char *req_id;
  size_t req_id_len;
  uint64_t num_prompt_tokens;
  const char *kv_transfer_params; /* JSON the other side's request_finished produced; NULL: none */
  size_t kv_transfer_params_len;
  uint32_t flags; /* HIXL_KV_REQ_* */
} hixl_kv_request;

/* Bytes the plugin owns; release with ops->free_buffer. */
typedef struct {
  uint8_t *data;
  size_t len;
} hixl_kv_buffer;

/* Request ids the plugin owns (count strings, each NUL-terminated); release with
 * ops->free_ids. */
typedef struct {
  const char *const *ids;
  size_t count;
} hixl_kv_ids;

/* Block ids the plugin owns; release with ops->free_buffer on .raw. */
typedef struct {
  const uint64_t *ids;
  size_t count;
  hixl_kv_buffer raw;
} hixl_kv_blocks;

/* Paged KV layouts of one layer. */
#define HIXL_KV_LAYOUT_KV_FIRST 0 /* shape (2, num_blocks, ...): K blocks at base, V at base + v_offset */
#define HIXL_KV_LAYOUT_BLOCKS_FIRST                                                                          \
  1 /* shape (num_blocks, 2, ...): block b's K then V at base + 2 * b * block_bytes */

/* One attention layer's KV cache. Every layer of a connector has the same shape. */
typedef struct {
  const char *name;
  size_t name_len;
  uintptr_t base;
  uint64_t num_blocks;
  uint64_t block_bytes; /* one block of K (or of V) */
  uint64_t v_offset;    /* HIXL_KV_LAYOUT_KV_FIRST: where V starts, from base */
  uint32_t layout;      /* HIXL_KV_LAYOUT_* */
  uint32_t elem_size;   /* bytes of the data type */
  uint32_t block_tokens;
} hixl_kv_layer;

/* The counters a connector keeps, by role and mode (a counter that does not apply
 * stays 0): pull producer worker: blocks_held, requests_held, lease_expired; pull
 * consumer worker: loads_done, loads_failed, bytes_loaded, engine_ops, lookups; push
 * producer worker: blocks_held, requests_held, pushes_done, pushes_failed,
 * layers_pushed, bytes_pushed, engine_ops, lookups; push consumer worker: loads_done,
 * loads_failed, bytes_loaded; any worker: cap_refused (1.4). A scheduler keeps none. Frozen at 1.0's fields:
 * get_stats_ex returns them and what later versions add. */
typedef struct {
  uint64_t blocks_held;   /* producer: blocks kept for consumers now (pull: held, push: until pushed) */
  uint64_t requests_held; /* ... and their requests */
  uint64_t loads_done;    /* consumer: requests loaded (push: every layer landed) */
  uint64_t loads_failed;  /* ... and failed */
  uint64_t lease_expired; /* pull producer: requests freed because their lease ran out */
  uint64_t bytes_loaded;  /* consumer: bytes of the requests loaded (pull: read, push: landed) */
  uint64_t engine_ops;    /* pull consumer, push producer: engine op descriptors issued (adjacent
                           * blocks coalesce) */
  uint64_t lookups;       /* ... remote cache lookups (round trips) */
  uint64_t pushes_done;   /* push producer: requests written to a consumer */
  uint64_t pushes_failed; /* ... and not */
  uint64_t layers_pushed; /* ... layers sent as soon as save_kv_layer released them */
} hixl_kv_stats;

/* get_stats_ex's counters: hixl_kv_stats's, then those later versions add, at the
 * end only. The host sets size to sizeof(hixl_kv_stats_ex) as it was built; the
 * plugin writes the whole fields that fit in both its struct and the host's, never a
 * byte past size, and sets size to the bytes it wrote (a host built against a later
 * header sees which fields it got). */
typedef struct {
  uint32_t size;     /* in: the host's sizeof(hixl_kv_stats_ex); out: bytes the plugin wrote */
  uint32_t reserved; /* 0 */
  uint64_t blocks_held, requests_held, loads_done, loads_failed, lease_expired, bytes_loaded, engine_ops,
      lookups, pushes_done, pushes_failed, layers_pushed; /* as hixl_kv_stats's */
  /* ---- version 1.3 ---- */
  uint64_t bytes_pushed; /* push producer: bytes of the requests pushed */
  /* ---- version 1.4 ---- */
  uint64_t cap_refused; /* pull producer, push consumer: KV service calls of peers refused because they
                         * presented no capability, or not the request's (docs/plugin.md) */
} hixl_kv_stats_ex;
/* The smallest size get_stats_ex takes: size and reserved. */
#define HIXL_KV_STATS_EX_MIN_SIZE offsetof(hixl_kv_stats_ex, blocks_held)

/* ---- 1.3: a KV cache as groups of planes (register_kv_groups) ----
 *
 * A plane is one strided view of a KV tensor: num_blocks blocks, block b being
 * block_bytes at base + b * block_stride. Any layout is a set of planes: KV-first
 * (2, B, ...) is a K and a V plane per layer (stride = bytes); blocks-first (B, 2, ...)
 * one plane per layer; vLLM's named layouts (LBNHC, LBHNC, LHBNC, BLNHC, BLHNC, BHLNC)
 * one plane per layer whose stride skips the other layers where blocks come first;
 * MLA one latent plane per layer; cross-layer blocks one plane for every layer. When
 * the head dimension is given (num_heads > 0), block b of the plane is num_heads
 * pieces of block_bytes / num_heads bytes, head h at base + b * block_stride +
 * h * head_stride: a head-major tensor (LHBNC's heads lie num_blocks apart), and what
 * a head slice is cut from. docs/plugin.md fills one from a tensor's shape, strides
 * and element size, per layout. Frozen: never grows. */
typedef struct {
  uintptr_t base;
  uint64_t block_stride; /* bytes from block b to block b + 1 */
  uint64_t block_bytes;  /* bytes of one block of this plane (every head) */
  uint64_t head_stride;  /* num_heads > 0: bytes from head h to head h + 1 within a block */
  uint32_t num_heads;    /* 0: a block is one run of block_bytes */
  uint32_t reserved;     /* 0 */
} hixl_kv_plane;

/* hixl_kv_group.kind: what a group's blocks hold (vLLM's KV cache specs). */
#define HIXL_KV_GROUP_FULL_ATTENTION 0u
#define HIXL_KV_GROUP_SLIDING_WINDOW 1u /* a request holds blocks for its last window_tokens only */
#define HIXL_KV_GROUP_MLA            2u /* one latent plane per layer, the same bytes on every TP rank */
#define HIXL_KV_GROUP_MAMBA          3u /* state blocks */

/* hixl_kv_group.flags */
#define HIXL_KV_GROUP_CROSS_LAYER                                                                            \
  0x1u /* each block holds every layer of the group (vLLM's cross-layer                                      \
        * blocks): planes_per_layer planes for all layers, moved per                                         \
        * block, never a layer at a time */

/* A KV cache group (vLLM's KVCacheGroupSpec): layers that share one block table. A
 * connector has one or more; a request then has one block-id list per group, in the
 * order the groups were registered (update_state_after_alloc_groups). */
typedef struct {
  uint32_t size;             /* sizeof(hixl_kv_group) as the host was built */
  uint32_t kind;             /* HIXL_KV_GROUP_* */
  uint32_t flags;            /* HIXL_KV_GROUP_CROSS_LAYER */
  uint32_t num_layers;       /* the model's layers in this group */
  const uint32_t *layer_ids; /* each one's model layer number (save_kv_layer's, wait_for_layer_load's);
                              * NULL: first_layer, first_layer + 1, ... */
  uint32_t first_layer;
  uint32_t planes_per_layer;   /* planes of one layer; cross-layer: of the whole group */
  const hixl_kv_plane *planes; /* num_layers * planes_per_layer, layer by layer (cross-layer:
                                * planes_per_layer) */
  uint64_t num_blocks;
  uint32_t block_tokens;
  uint32_t elem_size;     /* bytes of the data type */
  uint32_t window_tokens; /* HIXL_KV_GROUP_SLIDING_WINDOW: the window; else 0 */
  uint32_t reserved;      /* 0 */
  const char *layout;     /* its name, in the compatibility digest ("LBNHC", "kv_first", "mla",
                           * ...); NULL: none */
  size_t layout_len;
  /* ---- version 1.5 (a host built before sets size to offsetof(hixl_kv_group, total_kv_heads)) ---- */
  uint32_t total_kv_heads; /* the model's KV heads over every tensor-parallel rank (vLLM's
                            * get_total_num_kv_heads); 0: the planes' num_heads times the world
                            * size. This rank holds heads [rank * n, rank * n + n) of them, n =
                            * total / world; with more ranks than heads, head rank / (world /
                            * total), one head replicated on world / total ranks (vLLM's rule).
                            * MLA groups: 0 (every rank holds the same latent). docs/plugin.md,
                            * "Tensor parallelism", says which ranks read which heads. */
  uint32_t reserved2;      /* 0 */
} hixl_kv_group;
/* The size of a 1.3 / 1.4 host's hixl_kv_group: register_kv_groups takes it too, an array of
 * them that many bytes apart (every group of one call the same size). */
#define HIXL_KV_GROUP_SIZE_1_3 offsetof(hixl_kv_group, total_kv_heads)

/* One group's block ids of a request (a pair, frozen). */
typedef struct {
  const uint64_t *ids;
  size_t count;
} hixl_kv_block_ids;

typedef struct hixl_kv_ops hixl_kv_ops;
struct hixl_kv_ops {
  uint32_t abi_version; /* HIXL_KV_ABI_VERSION the plugin implements */
  uint32_t size;        /* sizeof(hixl_kv_ops) as the plugin was built */

  /* ---- version 1.0 ---- */

  /* Life. config is a JSON document (hixl's, or vLLM's --kv-transfer-config); err
   * receives the reason when create fails (NUL-terminated, cut at err_cap). */
  hixl_kv_status (*create)(const char *config_json, size_t config_len, int32_t role, uint32_t rank,
                           uint32_t world_size, hixl_kv_connector **out, char *err, size_t err_cap);
  hixl_kv_status (*destroy)(hixl_kv_connector *c);
  hixl_kv_status (*shutdown)(hixl_kv_connector *c); /* stop moving data; destroy still needed */
  /* Why the calling thread's last failing op failed ("" if none). */
  const char *(*last_error)(void);
  void (*free_buffer)(hixl_kv_buffer *b);
  void (*free_ids)(hixl_kv_ids *ids);

  /* Scheduler side. */
  hixl_kv_status (*get_num_new_matched_tokens)(hixl_kv_connector *c, const hixl_kv_request *req,
                                               uint64_t num_computed_tokens, int64_t *num_tokens,
                                               int32_t *load_async);
  hixl_kv_status (*update_state_after_alloc)(hixl_kv_connector *c, const hixl_kv_request *req,
                                             const uint64_t *block_ids, size_t num_blocks,
                                             uint64_t num_external_tokens);
  hixl_kv_status (*build_connector_meta)(hixl_kv_connector *c, hixl_kv_buffer *meta);
  /* A request aborted while its KV still loads (load_async): the host keeps its blocks
   * until a worker's get_finished reports it received, as vLLM does for requests in
   * WAITING_FOR_REMOTE_KVS; the pull (or the expected push) writes into them until then.
   * Once a request: a second call while the first keeps its blocks (held for a consumer,
   * or not pushed yet) is PARAM_INVALID. A request id is used once per run (a capability
   * binds the id): a producer refuses one it held that ended lately (PARAM_INVALID,
   * nothing held; the host frees the blocks). */
  hixl_kv_status (*request_finished)(hixl_kv_connector *c, const hixl_kv_request *req,
                                     const uint64_t *block_ids, size_t num_blocks, int32_t *delay_free,
                                     hixl_kv_buffer *kv_transfer_params);
  /* What the workers reported this step (from their get_finished and
   * get_block_ids_with_load_errors), for requests the scheduler tracks; any of the
   * three may be NULL. Within a step either order with request_finished works, and
   * each request's blocks are freed once: a request in finished_sending whose
   * request_finished answered delay_free 1 is freed now; one not finished yet frees
   * nothing now, and its request_finished answers delay_free 0 (push mode: the push
   * ended before the request finished here). vLLM calls request_finished first. */
  hixl_kv_status (*update_connector_output)(hixl_kv_connector *c, const hixl_kv_ids *finished_sending,
                                            const hixl_kv_ids *finished_recving,
                                            const hixl_kv_ids *load_failed);
  hixl_kv_status (*set_handshake_metadata)(hixl_kv_connector *c, const uint8_t *meta, size_t len);

  /* Worker side. */
  hixl_kv_status (*register_kv_caches)(hixl_kv_connector *c, const hixl_kv_layer *layers, size_t num_layers);
  hixl_kv_status (*bind_connector_meta)(hixl_kv_connector *c, const uint8_t *meta, size_t len);
  hixl_kv_status (*clear_connector_meta)(hixl_kv_connector *c);
  hixl_kv_status (*start_load_kv)(hixl_kv_connector *c);
  hixl_kv_status (*wait_for_layer_load)(hixl_kv_connector *c, uint32_t layer);
  hixl_kv_status (*save_kv_layer)(hixl_kv_connector *c, uint32_t layer);
  hixl_kv_status (*wait_for_save)(hixl_kv_connector *c);
  /* The requests that finished sending (a producer's held or pushed blocks are free)
   * and receiving (a consumer's loaded, or failed: see get_block_ids_with_load_errors)
   * since the last call; release both with free_ids. finished_req_ids: the requests
   * the scheduler finished since the last step, as vLLM passes them, or NULL; hixl
   * does not need them and reads neither. */
  hixl_kv_status (*get_finished)(hixl_kv_connector *c, const hixl_kv_ids *finished_req_ids,
                                 hixl_kv_ids *sending_done, hixl_kv_ids *recving_done);
  hixl_kv_status (*get_block_ids_with_load_errors)(hixl_kv_connector *c, hixl_kv_blocks *blocks);
  hixl_kv_status (*get_handshake_metadata)(hixl_kv_connector *c, hixl_kv_buffer *meta);
  hixl_kv_status (*get_stats)(hixl_kv_connector *c, hixl_kv_stats *stats);
  /* Push mode, consumer scheduler: after update_state_after_alloc, the
   * kv_transfer_params the producer needs to write this request's KV into the blocks
   * just allocated; the host's router sends them with the request to the producer. */
  hixl_kv_status (*get_push_params)(hixl_kv_connector *c, const char *req_id, size_t req_id_len,
                                    hixl_kv_buffer *kv_transfer_params);
  /* ---- end of version 1.0 ---- */

  /* ---- version 1.1 ---- */

  /* Worker side, instead of register_kv_caches: allocate every layer's KV cache in
   * memory of the connector's engine and register it. layers[i] gives the shape
   * (name, num_blocks, block_bytes, layout, elem_size, block_tokens; base and
   * v_offset are ignored); on success the plugin writes base, and v_offset for
   * HIXL_KV_LAYOUT_KV_FIRST, into each. The memory is zeroed and page-aligned; a peer
   * engine on the same host maps it and copies with memcpy instead of
   * process_vm_readv. destroy frees it. */
  hixl_kv_status (*alloc_kv_caches)(hixl_kv_connector *c, hixl_kv_layer *layers, size_t num_layers);
  /* ---- end of version 1.1 ---- */

  /* ---- version 1.2 ---- */

  /* Worker side: a file descriptor that polls readable (POLLIN, level) once
   * get_finished has something to report (a request finished sending or receiving; a
   * failed load is among them, its blocks in get_block_ids_with_load_errors), and
   * quiet again once get_finished took everything. A host with nothing else to do
   * waits on it (poll, epoll, its event loop) instead of stepping, and wakes when the
   * KV has landed. Wait with a timeout all the same: lease and deadline expiry is
   * noticed when get_finished runs. The fd belongs to the connector: only poll it
   * (never read or close it); destroy closes it. Every call returns the same fd. */
  hixl_kv_status (*get_event_fd)(hixl_kv_connector *c, int32_t *fd);
  /* ---- end of version 1.2 ---- */

  /* ---- version 1.3 ---- */

  /* Any role: the counters, into a struct whose size the host set (see
   * hixl_kv_stats_ex); PARAM_INVALID when size is below HIXL_KV_STATS_EX_MIN_SIZE. */
  hixl_kv_status (*get_stats_ex)(hixl_kv_connector *c, hixl_kv_stats_ex *stats);

  /* Worker side, instead of register_kv_caches: the KV caches as groups of planes
   * (hixl_kv_group). Every plane lies in memory the host owns or that alloc_kv_memory
   * gave; planes may interleave (a block-major layout's layers). Peers must describe
   * the same groups (the compatibility digest: kinds, layers, planes' sizes and heads,
   * block tokens, element size, layout names); their bases and strides may differ. */
  hixl_kv_status (*register_kv_groups)(hixl_kv_connector *c, const hixl_kv_group *groups, size_t num_groups);
  /* Worker side: bytes of zeroed, page-aligned memory of the connector's engine, for
   * the host to lay planes out in before register_kv_groups (a same-host peer maps it
   * and copies with memcpy); destroy frees it. */
  hixl_kv_status (*alloc_kv_memory)(hixl_kv_connector *c, uint64_t bytes, uintptr_t *base);
  /* Scheduler side, as update_state_after_alloc and request_finished, with one
   * block-id list per group (vLLM's request_finished_all_groups, SupportsHMA). A
   * group whose list is shorter than another's (a sliding window) moves the blocks it
   * lists: the last ones of the producer's list for that group. */
  hixl_kv_status (*update_state_after_alloc_groups)(hixl_kv_connector *c, const hixl_kv_request *req,
                                                    const hixl_kv_block_ids *groups, size_t num_groups,
                                                    uint64_t num_external_tokens);
  hixl_kv_status (*request_finished_groups)(hixl_kv_connector *c, const hixl_kv_request *req,
                                            const hixl_kv_block_ids *groups, size_t num_groups,
                                            int32_t *delay_free, hixl_kv_buffer *kv_transfer_params);
  /* Worker side, before the forward pass of a step whose scheduler preempted
   * requests: their blocks are about to be reused. Loads into them (pull) and pushes
   * expected into them (push consumer) or out of them (push producer) are stopped or
   * waited for before this returns; each is then reported by get_finished (a stopped
   * load as failed, its blocks in get_block_ids_with_load_errors). */
  hixl_kv_status (*handle_preemptions)(hixl_kv_connector *c, const hixl_kv_ids *req_ids);
  /* The KV cache layout this connector needs from the runtime, as vLLM's
   * get_required_kvcache_layout: "" when any works (hixl moves any layout register_kv_groups
   * describes); see docs/plugin.md for the one it moves with the fewest descriptors. */
  hixl_kv_status (*get_required_kvcache_layout)(hixl_kv_connector *c, hixl_kv_buffer *layout);
  /* Worker side: metadata for the scheduler (vLLM's build_connector_worker_meta).
   * UNSUPPORTED: get_finished and get_block_ids_with_load_errors carry all hixl's
   * scheduler needs. */
  hixl_kv_status (*build_connector_worker_meta)(hixl_kv_connector *c, hixl_kv_buffer *meta);
  /* ---- end of version 1.3 (1.4 adds no op, only hixl_kv_stats_ex.cap_refused) ---- */

  /* ---- version 1.5: tensor parallelism of different sizes on the two sides
   * (hixl_kv_group.total_kv_heads, docs/plugin.md), and what the connector observes
   * (docs/observability.md) ---- */

  /* Any role: every metric of the connector (the counters of get_stats_ex, failures by
   * cause, log2 histograms of transfer time, post time, bytes and ops per request, PIN /
   * ACCEPT round trip and push tail; per-peer requests and bytes) in the Prometheus text
   * exposition format 0.0.4, names hixl_kv_*, labels role, rank, mode (and peer,
   * transport, cause, le where they apply); release with free_buffer. A host serving
   * several connectors merges their families (each family's samples together). */
  hixl_kv_status (*render_metrics)(hixl_kv_connector *c, hixl_kv_buffer *text);
  /* Worker: the traces of the requests that finished since the last call (their ids
   * handed to the host by get_finished), oldest first, one JSON object per line (each
   * phase's time in CLOCK_REALTIME ns, its bytes, ops, peer, transport, outcome and the
   * failure's cause); at most the config's trace_ring of them, the oldest dropped
   * beyond. An empty buffer (len 0) when none, or traces are off (trace_ring 0); release
   * with free_buffer. */
  hixl_kv_status (*drain_traces)(hixl_kv_connector *c, hixl_kv_buffer *lines);
  /* ---- end of version 1.5 ---- */

  /* ---- version 1.6 ---- */

  /* Scheduler side, as a request arrives (vLLM's on_new_request), before it is
   * scheduled. A pull consumer's request whose kv_transfer_params name a producer's hold
   * has that hold renewed while it waits: every third of this connector's lease_ms a
   * build_connector_meta tells the workers to renew it (RENEW), until
   * update_state_after_alloc (its load then keeps it held, as before),
   * request_finished, or its finished_recving. Without it a request that waits longer
   * than the producer's lease loses the hold and is recomputed. Any other request, or a
   * push or producer connector: nothing. Params that do not parse: nothing (as
   * get_num_new_matched_tokens finds them later). */
  hixl_kv_status (*on_new_request)(hixl_kv_connector *c, const hixl_kv_request *req);
  /* ---- end of version 1.6: later versions append here ---- */
};

/* True when the table the plugin gave is large enough to hold op. */
#define HIXL_KV_HAS_OP(ops, op) ((ops)->size >= offsetof(hixl_kv_ops, op) + sizeof((ops)->op))

/* The entry point: the table for ABI major version abi_major, or a status and the
 * reason in err (e.g. an unknown major version). */
typedef hixl_kv_status (*hixl_kv_entry_fn)(uint32_t abi_major, const hixl_kv_ops **ops, char *err,
                                           size_t err_cap);

#ifdef __cplusplus
}
#endif
#endif /* HIXL_KV_CONNECTOR_H */
