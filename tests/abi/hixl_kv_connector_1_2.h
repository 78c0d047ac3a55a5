/* Frozen for test_plugin_abi12 (a 1.2 host): b4f4b8d:plugin/include/hixl/hixl_kv_connector.h verbatim */
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
 * by ops->free_buffer or ops->free_ids. Every op is safe from any thread. */
#ifndef HIXL_KV_CONNECTOR_H
#define HIXL_KV_CONNECTOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HIXL_KV_ABI_MAJOR    1u
#define HIXL_KV_ABI_MINOR    2u
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

typedef struct {
  uint64_t blocks_held;   /* worker, producer: blocks kept for peers (delay_free), now */
  uint64_t requests_held; /* ... and their requests */
  uint64_t loads_done;    /* worker, consumer: requests loaded */
  uint64_t loads_failed;  /* ... and failed */
  uint64_t lease_expired; /* worker, producer: requests freed because their lease ran out */
  uint64_t bytes_loaded;
  uint64_t engine_ops;    /* engine op descriptors issued (adjacent blocks coalesce) */
  uint64_t lookups;       /* remote cache lookups (round trips) */
  uint64_t pushes_done;   /* worker, producer in push mode: requests written to a consumer */
  uint64_t pushes_failed; /* ... and not */
  uint64_t layers_pushed; /* ... layers sent as soon as save_kv_layer released them */
} hixl_kv_stats;

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
   * WAITING_FOR_REMOTE_KVS; the pull (or the expected push) writes into them until then. */
  hixl_kv_status (*request_finished)(hixl_kv_connector *c, const hixl_kv_request *req,
                                     const uint64_t *block_ids, size_t num_blocks, int32_t *delay_free,
                                     hixl_kv_buffer *kv_transfer_params);
  /* What the workers reported this step (from their get_finished and
   * get_block_ids_with_load_errors), for requests the scheduler tracks. */
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
  /* ---- end of version 1.2: later versions append here ---- */
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
