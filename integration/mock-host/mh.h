/* hixl-mock-host: a serving runtime in miniature (a router, a prefill and a decode
 * instance, each with a scheduler and a worker KV connector) that drives
 * libhixl_kv_connector.so as vLLM drives a KV connector. It includes the plugin's ABI
 * header and nothing else of hixl. Internal to the mock host; never installed. */
#ifndef HIXL_MOCK_HOST_H
#define HIXL_MOCK_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "hixl/hixl_kv_connector.h"

/* ---- the fake model and its paged KV cache (mh_model.c, mh_layout.c) ---- */

/* What the model's layers hold: K and V per token, or one latent per token (MLA); a
 * hybrid model's even layers attend to every token and its odd layers to a sliding
 * window (a quarter of the largest prompt), each set a KV cache group with its own
 * block table. */
enum mh_kind { MH_MODEL_STANDARD, MH_MODEL_MLA, MH_MODEL_HYBRID };

/* How the KV tensors are laid out (mh_layout.c has each one's axes). */
enum mh_layout {
  MH_LAYOUT_KV_FIRST, /* per layer (2, B, N, H, D): ABI 1.0's register_kv_caches / alloc_kv_caches */
  MH_LAYOUT_BLOCKS_FIRST,
  MH_LAYOUT_PACKED,
  MH_LAYOUT_LBNHC,
  MH_LAYOUT_LBHNC,
  MH_LAYOUT_LHBNC,
  MH_LAYOUT_BLNHC,
  MH_LAYOUT_BLHNC,
  MH_LAYOUT_BHLNC,
  MH_LAYOUT_CROSS_LAYER,
  MH_LAYOUT_COUNT
};

struct mh_model {
  char name[32];
  uint32_t layers;
  uint32_t kv_heads;
  uint32_t head_dim; /* MLA: the latent's elements */
  uint32_t elem_size;
  uint32_t block_tokens;
  uint64_t num_blocks;
  uint32_t kind;          /* enum mh_kind */
  uint32_t layout;        /* enum mh_layout */
  uint32_t window_tokens; /* hybrid: the sliding group's window (HIXL_KV_GROUP_SLIDING_WINDOW) */
  /* Tensor parallelism: a rank's cache holds kv_heads of the model's total_heads, from
   * head0 on (0, 0: every head, as with one rank). */
  uint32_t total_heads;
  uint32_t head0;
  uint32_t tp; /* a TP run (either side has more than one rank): planes name their heads
                * (num_heads, head_stride) and groups total_kv_heads */
};

#define MH_MAX_TP 16 /* ranks of one instance */

/* The heads rank r of world holds of a model of total KV heads (vLLM's rule): total /
 * world of them when world <= total, else the one head r / (world / total), replicated
 * on world / total ranks. */
void mh_rank_heads(uint32_t total, uint32_t rank, uint32_t world, uint32_t *first, uint32_t *count);
/* The model as rank r of world holds it: its heads only. */
struct mh_model mh_rank_model(const struct mh_model *m, uint32_t rank, uint32_t world);

/* A preset's shape and its default largest prompt; -1 for an unknown name. */
int mh_model_preset(const char *name, struct mh_model *m, uint64_t *max_prompt);
/* A hybrid model's window: a quarter of the largest prompt, in whole blocks. */
void mh_model_window(struct mh_model *m, uint64_t max_prompt);
uint64_t mh_token_bytes(const struct mh_model *m); /* one token's K (or V, or latent) in one layer */
uint64_t mh_block_bytes(const struct mh_model *m); /* one block of K (or V) in one layer */
uint64_t mh_blocks_for(const struct mh_model *m, uint64_t tokens);
uint32_t mh_kv_parts(const struct mh_model *m);   /* 2 (K and V), MLA 1 (the latent) */
uint32_t mh_num_groups(const struct mh_model *m); /* KV cache groups: hybrid 2, else 1 */
uint32_t mh_layer_group(const struct mh_model *m, uint32_t layer);
/* Group g's blocks of a request of tokens: count of them at offset in the request's
 * block list, which holds every group's, group by group. A sliding group holds the
 * blocks of the request's last window_tokens only. */
void mh_group_span(const struct mh_model *m, uint32_t g, uint64_t tokens, uint64_t *offset, uint64_t *count);
uint64_t mh_request_blocks(const struct mh_model *m, uint64_t tokens); /* every group's */
uint64_t mh_pool_block_bytes(const struct mh_model *m); /* the KV memory one block id stands for */
uint64_t mh_request_kv_bytes(const struct mh_model *m, uint64_t tokens); /* what a request's check covers */

/* Layouts (mh_layout.c). */
int mh_layout_parse(const char *name, uint32_t *layout);
const char *mh_layout_name(uint32_t layout);
extern const char mh_layout_list[]; /* the names, for usage and errors */
/* A model and layout that go together, or false and why. */
bool mh_layout_check(const struct mh_model *m, char *err, size_t cap);
/* True for ABI 1.0's path: a standard model in kv_first (register_kv_caches). */
bool mh_layout_v10(const struct mh_model *m);
/* True when a block of the layout keeps each head's tokens together (head-major: a
 * head slice is one run of bytes), as tensor parallelism of different sizes needs. */
bool mh_layout_head_major(uint32_t layout);

/* Where a layer's K and V live: K (v = 0) or V (v = 1) of head h of the token at
 * position n of block b starts at base + b * block + v * kv + n * token + h * head, and
 * runs head_dim elements (bytes). */
struct mh_view {
  uintptr_t base;
  uint64_t block, kv, token, head;
};

#define MH_MAX_GROUPS 2

/* Where the KV caches live (mh_devmem.c): host memory, or device memory the plugin
 * registers as such (kv_memory device) while the host computes and checks a copy. */
enum mh_dev {
  MH_DEV_NONE, /* host memory */
  MH_DEV_SIM,  /* device-sim: a second host buffer, registered through HIXL_TEST_DEVMEM=host */
  MH_DEV_CUDA, /* cuda: cuMemAlloc'd, the CUDA driver loaded at run time */
};
/* Whether kind can be used here (cuda: a driver and device 0, tried in a child process,
 * so the caller may fork after); -1 with why. */
int mh_dev_probe(enum mh_dev kind, char *err, size_t cap);
uintptr_t mh_dev_alloc(enum mh_dev kind, size_t len, char *err, size_t cap); /* 0 with why */
void mh_dev_free(enum mh_dev kind, uintptr_t p);
/* n bytes between device memory at dev and host memory at host; -1 with why. */
int mh_dev_copy(enum mh_dev kind, uintptr_t dev, void *host, size_t n, bool to_device, char *err, size_t cap);

/* One instance's KV cache: the layers' memory and its description (ABI 1.0's layers,
 * or 1.3's groups of planes), a free list and each block's owner, as a runtime's
 * block manager keeps them. Block ids are one pool shared by every group. */
struct mh_cache {
  struct mh_model m;
  uint8_t *mem; /* the host's memory; NULL when the plugin allocated it */
  size_t len;
  hixl_kv_layer *layers; /* 1.0: m.layers entries, for register_kv_caches */
  char (*names)[16];
  struct mh_view *views; /* per layer, once attached */
  hixl_kv_group groups[MH_MAX_GROUPS];
  uint32_t ngroups;      /* 0 on the 1.0 path */
  hixl_kv_plane *planes; /* every group's, group by group */
  uint32_t *layer_ids;   /* the groups' layer_ids */
  uint64_t *free_list;
  uint64_t nfree;
  uint32_t *owner; /* per block: request index + 1, 0 when free */
  enum mh_dev dev; /* device memory: the plugin has dev_base, mem is the host's copy */
  uintptr_t dev_base;
};

/* The block allocator and the layers' shapes; no memory yet (mh_cache_attach). */
int mh_cache_init(struct mh_cache *c, const struct mh_model *m);
void mh_cache_fini(struct mh_cache *c);
/* Give the worker its KV cache, as a runtime does at start: ABI 1.0's path
 * (alloc_kv_caches, else the host's memory and register_kv_caches) or 1.3's
 * (alloc_kv_memory, else the host's, then register_kv_groups); host_memory skips the
 * plugin's allocation. 0, or -1 with why in err. */
int mh_cache_attach(struct mh_cache *c, const hixl_kv_ops *ops, hixl_kv_connector *worker, bool host_memory,
                    enum mh_dev dev, const char *who, char *err, size_t cap);
/* Device memory: a request's blocks of layers [first, first + n), from the host's copy
 * to the device (after computing them) or back (before checking them); 0 without
 * device memory; -1 with why. */
int mh_cache_mirror(const struct mh_cache *c, const uint64_t *blocks, uint64_t tokens, uint32_t first,
                    uint32_t n, bool to_device, char *err, size_t cap);
/* What mh_cache_attach registered, on stderr (--verbose). */
void mh_cache_describe(const struct mh_cache *c, const char *who);
/* Where K (v = 0) or V of head h of the token at position n of block b of layer l
 * starts: head_dim elements, contiguous. */
static inline uint8_t *mh_kv_at(const struct mh_cache *c, uint32_t l, int v, uint64_t b, uint64_t n,
                                uint32_t h) {
  const struct mh_view *w = &c->views[l];
  return (uint8_t *)(w->base + b * w->block + (uint64_t)v * w->kv + n * w->token + (uint64_t)h * w->head);
}
/* n blocks for owner into out, or false (nothing taken) when fewer are free. */
bool mh_alloc(struct mh_cache *c, uint64_t n, uint32_t owner, uint64_t *out);
void mh_free(struct mh_cache *c, const uint64_t *blocks, uint64_t n);
/* "Compute" one layer of a request (blocks: its block list, every group's): K and V
 * of each token the layer's group holds, into its blocks. */
void mh_compute_layer(const struct mh_cache *c, uint64_t seed, uint32_t layer, const uint64_t *blocks,
                      uint64_t tokens);
/* Bytes of the request's KV in layers [first_layer, first_layer + nlayers) that differ
 * from the function (0: every byte its groups hold checked and right); the first bad
 * one is described in where, if where is still "". */
uint64_t mh_verify(const struct mh_cache *c, uint64_t seed, const uint64_t *blocks, uint64_t tokens,
                   uint32_t first_layer, uint32_t nlayers, char *where, size_t cap);

/* ---- the framed protocol between the router and the instances (mh_wire.c) ----
 * A frame is a 12-byte header (magic "HXMH", version, type, 2 reserved bytes, payload
 * length, all big-endian) and a payload of big-endian fields; strings are a u32 length
 * and bytes. */

enum mh_type {
  MH_READY = 1,  /* instance -> router: up; u32 num_blocks */
  MH_REQ,        /* router -> prefill: u32 idx, u64 seed, u64 prompt, str kv_transfer_params (push) */
  MH_PARAMS,     /* prefill -> router: u32 idx, u64 t_saved_ns, str kv_transfer_params */
  MH_LOAD,       /* router -> decode: u32 idx, u64 seed, u64 prompt, str kv_transfer_params */
  MH_DONE,       /* decode -> router: u32 idx, u8 outcome, u64 t_held_ns, u64 bytes, str reason */
  MH_FAIL,       /* instance -> router: u32 idx (UINT32_MAX: the instance), str reason */
  MH_EXIT,       /* router -> instance: drain, report, exit */
  MH_STATS,      /* instance -> router: see mh_put_side */
  MH_PUSHPARAMS, /* push mode, decode -> router: u32 idx, str get_push_params's params */
  /* ---- between an instance (its scheduler) and its worker ranks' processes (TP > 1):
   * every request has exactly one answer ---- */
  MH_RK_READY,    /* rank -> instance: its worker is up and its KV cache registered; u8 1: its
                   * get_event_fd rides along (SCM_RIGHTS), for the instance to poll */
  MH_RK_META,     /* instance -> rank: str metadata, u8 die (fault: SIGKILL after start_load_kv) */
  MH_RK_FORWARD,  /* instance -> rank: u32 n, n x work (see mh_put_work): compute, save each layer */
  MH_RK_FINISHED, /* instance -> rank: get_finished and get_block_ids_with_load_errors */
  MH_RK_VERIFY,   /* instance -> rank: work, u32 first layer, u32 layers, u8 compute first */
  MH_RK_CLEAR,    /* instance -> rank: clear_connector_meta */
  MH_RK_EXIT,     /* instance -> rank: its stats, then exit */
  MH_RK_OK,       /* rank -> instance: done (META, CLEAR); FORWARD: u64 t_saved_ns */
  MH_RK_REPORT,   /* rank -> instance: u32 n, n x str sent; u32 n, n x str received; u32 n, n x u64 blocks */
  MH_RK_VERIFIED, /* rank -> instance: u64 bytes wrong, str where the first is */
  MH_RK_STATS,    /* rank -> instance: u8 stats_ok, the worker's hixl_kv_stats (mh_put_stats) */
  MH_TRACE,       /* instance -> router: str JSON lines of drain_traces (whole lines) */
  MH_METRICS,     /* instance -> router: str render_metrics's text (the latest replaces the one before) */
  MH_TYPE_MAX
};

enum mh_outcome { MH_VERIFIED = 1, MH_RECOMPUTED, MH_FAILED, MH_CORRUPT };

#define MH_HDR_LEN    12u
#define MH_FRAME_MAX  (64u << 20) /* a step of a rank: every block id of the batch, and the metadata */
#define MH_NO_REQUEST UINT32_MAX

struct mh_out {
  uint8_t *p;
  size_t len, cap;
  bool bad; /* out of memory: the frame is not sent */
};
void mh_put_u8(struct mh_out *o, uint8_t v);
void mh_put_u32(struct mh_out *o, uint32_t v);
void mh_put_u64(struct mh_out *o, uint64_t v);
void mh_put_str(struct mh_out *o, const void *s, size_t n);

struct mh_in {
  const uint8_t *p;
  size_t len, off;
  bool bad; /* read past the end or a bad length: reject the frame */
};
uint8_t mh_get_u8(struct mh_in *in);
uint32_t mh_get_u32(struct mh_in *in);
uint64_t mh_get_u64(struct mh_in *in);
/* A string as pointer and length into the frame (not NUL-terminated). */
const char *mh_get_str(struct mh_in *in, size_t *n);
/* True when the whole payload was read and nothing was bad. */
bool mh_in_done(const struct mh_in *in);

/* Send one frame (blocking); -1 when the peer is gone. Frees o's buffer. */
int mh_send(int fd, uint8_t type, struct mh_out *o);
/* ... with a descriptor passed along (SCM_RIGHTS; a unix socket), unless pass < 0. */
int mh_send_fd(int fd, uint8_t type, struct mh_out *o, int pass);

struct mh_conn {
  int fd;
  uint8_t *buf;
  size_t start, len, cap;
  bool eof;
};
void mh_conn_init(struct mh_conn *c, int fd);
void mh_conn_fini(struct mh_conn *c);
/* Read what the socket has now (non-blocking); sets eof when the peer closed. */
int mh_conn_fill(struct mh_conn *c);
/* ... taking into *got (when it is -1) a descriptor that came with the bytes. */
int mh_conn_fill_fd(struct mh_conn *c, int *got);
/* The next whole frame: 1 and its type and payload, 0 none yet, -1 malformed. The
 * payload stays valid until the next call. */
int mh_conn_next(struct mh_conn *c, uint8_t *type, struct mh_in *payload);

/* What a worker rank reports at exit. */
struct mh_side_rank {
  uint8_t alive;    /* it answered until the end */
  uint8_t stats_ok; /* its get_stats succeeded */
  hixl_kv_stats ks;
};

/* What an instance reports at exit. */
struct mh_side {
  uint64_t blocks_total;
  uint64_t blocks_free;
  uint32_t requests_left; /* requests it still tracked */
  uint8_t stats_ok;       /* get_stats succeeded on every rank alive */
  hixl_kv_stats ks;       /* the worker connectors', summed over the ranks alive */
  uint32_t tp;            /* its ranks */
  uint32_t twice;         /* reports of a request finished by a rank that had reported it already */
  struct mh_side_rank rk[MH_MAX_TP];
  uint64_t ipc_bytes;  /* TP 1: bytes its worker moved on peers' device memory opened by IPC handle
                        * (render_metrics' hixl_kv_device_ipc_bytes_total) */
  uint64_t rdma_bytes; /* TP 1: bytes of device memory its worker moved by RDMA directly (GPUDirect;
                        * hixl_kv_device_rdma_bytes_total) */
};
void mh_put_stats(struct mh_out *o, const hixl_kv_stats *s);
void mh_get_stats(struct mh_in *in, hixl_kv_stats *s);
void mh_put_side(struct mh_out *o, const struct mh_side *s);
void mh_get_side(struct mh_in *in, struct mh_side *s);

/* ---- an instance process (mh_instance.c) ---- */

enum mh_fault {
  MH_FAULT_NONE,
  MH_FAULT_DECODE_DIES,
  MH_FAULT_PREFILL_DIES,
  MH_FAULT_MISMATCH_BLOCK,
  MH_FAULT_MISMATCH_DTYPE,
  MH_FAULT_LINK_CUT,
  MH_FAULT_DECODE_ABORTS,
  MH_FAULT_LINK_RESET,
  MH_FAULT_INTRUDER,         /* a process without the key attacks both engines all through the run */
  MH_FAULT_DECODE_RANK_DIES, /* decode's last worker rank SIGKILLs itself as its Nth load starts */
  MH_FAULT_MISMATCH_HEADS /* decode's rank r checks the heads rank TP - 1 - r holds: every byte check fails */
};

struct mh_inst_args {
  const hixl_kv_ops *ops;
  int fd;       /* the router's socket */
  bool prefill; /* else decode */
  bool push;    /* the config's mode is push: decode allocates first */
  const char *config;
  struct mh_model model;
  uint32_t compute_us_per_token;
  enum mh_fault fault;
  uint32_t fault_at; /* the request (count, from 1) at which this instance dies */
  uint32_t drain_ms; /* after MH_EXIT, how long to wait for held requests */
  bool host_memory;  /* the host allocates the KV caches (register_kv_caches); else alloc_kv_caches */
  enum mh_dev dev;   /* ... in device memory (--kv-memory cuda | device-sim) */
  bool metrics;      /* send render_metrics's text to the router (--metrics-port) */
  bool verbose;
  uint32_t tp;       /* this instance's worker ranks (tensor-parallel size) */
  uint32_t queue_ms; /* decode: on_new_request as a request arrives, scheduled queue_ms later (0: at once,
                      * and no on_new_request) */
};

/* Run an instance until the router says exit or goes away; the process exit code. */
int mh_instance_main(const struct mh_inst_args *a);

/* ---- a worker rank (mh_rank.c): its connector, its KV memory (its heads) and what
 * it does in a step; in the instance's process when TP is 1, else in its own ---- */

/* What a rank computes or checks of one request. */
struct mh_work {
  uint64_t seed, prompt;
  const uint64_t *blocks; /* its block table, every group's */
  uint64_t nblocks;
};
void mh_put_work(struct mh_out *o, const struct mh_work *w);
/* A work item from a frame (blocks point into a buffer the caller frees), or false. */
bool mh_get_work(struct mh_in *in, struct mh_work *w, uint64_t **blocks);

/* What a rank's get_finished and get_block_ids_with_load_errors gave in one step. */
struct mh_rank_report {
  char **sent, **recv;
  size_t nsent, nrecv;
  uint64_t *err;
  size_t nerr;
};
void mh_rank_report_free(struct mh_rank_report *r);

struct mh_rank {
  const struct mh_inst_args *a;
  const hixl_kv_ops *ops;
  hixl_kv_connector *worker;
  struct mh_cache cache; /* its heads' memory (its allocator is unused: the scheduler allocates) */
  uint32_t rank;
  char who[32];
};
/* Create rank's worker connector (rank of a->tp) and give it its KV cache: 0, or -1
 * with why in err. */
int mh_rank_open(struct mh_rank *k, const struct mh_inst_args *a, uint32_t rank, char *err, size_t cap);
void mh_rank_close(struct mh_rank *k);
void mh_rank_meta(struct mh_rank *k, const uint8_t *meta,
                  size_t len); /* bind_connector_meta, start_load_kv */
/* The forward pass over the batch: each layer waited for, computed, saved; then
 * wait_for_save. When the last layer was saved. */
uint64_t mh_rank_forward(struct mh_rank *k, const struct mh_work *w, size_t n);
int mh_rank_finished(struct mh_rank *k, struct mh_rank_report *rep); /* 0, or -1 (said) */
/* Bytes of its heads of layers [first, first + nlayers) that are wrong (compute: the
 * runtime computes them first, as a recompute). */
uint64_t mh_rank_verify(struct mh_rank *k, const struct mh_work *w, uint32_t first, uint32_t nlayers,
                        bool compute, char *where, size_t cap);
void mh_rank_clear(struct mh_rank *k);
bool mh_rank_stats(struct mh_rank *k, hixl_kv_stats *s);
/* A rank's own process: serve the instance on fd until it says exit or goes away. */
int mh_rank_main(const struct mh_inst_args *a, uint32_t rank, int fd);

/* ---- the router: its options (mh_args.c), its loop (mh_router.c), its summary
 * (mh_report.c); main (mh_main.c) loads the plugin and ties them together ---- */

/* The command line, every default filled in. */
struct mh_opts {
  const char *side_plugin[2]; /* --prefill-plugin, --decode-plugin: that instance's, else --plugin's */
  const char *plugin, *config, *json, *transport, *policy, *model_name, *mode, *layout;
  const char *kv_memory; /* "hixl" (alloc_kv_caches), "host" (the host's, register_kv_caches), "cuda" or
                          * "device-sim" (device memory, mh_devmem.c) */
  const char *prefill_addr, *decode_addr;
  const char *netns[2]; /* --prefill-netns, --decode-netns: the instance's network namespace, or NULL */
  const char *auth_key; /* --auth-key: a key file, "none", or NULL: one made for the run */
  struct mh_model model;
  uint64_t kv_mib;
  uint32_t requests, concurrency, compute_us;
  uint64_t min_prompt, max_prompt, seed;
  int64_t lease_ms;
  enum mh_fault fault;
  uint32_t fault_at;
  const char *set[16]; /* --set KEY=VALUE, in order */
  uint8_t set_who[16]; /* ... for both instances (0), or --prefill-set (1) / --decode-set (2) */
  uint32_t nset;
  uint32_t timeout_s;
  uint32_t queue_ms;       /* --queue-ms: decode schedules a request that long after it arrived; 0 at once */
  const char *trace;       /* --trace FILE: every trace line, and one hand-off line per request */
  uint16_t metrics_port;   /* --metrics-port N: /metrics on 127.0.0.1:N; 0 none */
  uint32_t metrics_linger; /* --metrics-linger S: serve S s more after the summary (SIGTERM ends it) */
  bool progress, verbose;
  bool expect_ipc;  /* --expect-device-ipc */
  bool expect_rdma; /* --expect-device-rdma */
  const char *ip;   /* --ip: the instances' address when --prefill-addr / --decode-addr are not given */
  uint32_t tp[2];   /* --prefill-tp, --decode-tp */
};

/* The options into o, the model's shape settled: 0, or the exit status for bad options
 * (2; said on stderr). --help prints the usage and exits 0. */
int mh_parse_opts(int argc, char **argv, struct mh_opts *o);
/* Where --kv-memory puts the KV caches (MH_DEV_NONE: host memory, the plugin's or the host's). */
enum mh_dev mh_opts_dev(const struct mh_opts *o);
const char *mh_fault_name(enum mh_fault f); /* as --fault spells it */

/* ---- the plugin's traces and metrics (mh_obs.c, mh_metrics.c) ---- */

/* The phases of a plugin trace the host reads (its "t" object's keys). */
enum mh_tphase {
  MH_TP_BOUND,
  MH_TP_PIN,
  MH_TP_PINNED,
  MH_TP_POSTED,
  MH_TP_LAST_BYTE,
  MH_TP_FREE,
  MH_TP_DONE,
  MH_TP_REPORTED,
  MH_TP_COUNT
};

/* Instance: drain the worker's traces and send them (MH_TRACE); with metrics, its
 * render_metrics text every 250 ms (MH_METRICS); final: both now. */
void mh_obs_tick(const hixl_kv_ops *ops, hixl_kv_connector *worker, int fd, bool metrics, bool final);
/* The worker's counter family (its name and "{", e.g. "hixl_kv_device_ipc_bytes_total{"),
 * summed over its samples (0 without render_metrics or the line). */
uint64_t mh_obs_counter(const hixl_kv_ops *ops, hixl_kv_connector *worker, const char *family);

/* pull: NEW -> PREFILL -> DECODE -> DONE; push: NEW -> ALLOC (decode allocates) -> PUSH
 * (prefill computes and writes into decode's blocks) -> DONE. */
enum mh_rstate { MH_R_NEW, MH_R_PREFILL, MH_R_DECODE, MH_R_ALLOC, MH_R_PUSH, MH_R_DONE };

/* A request, as the router tracks it. */
struct mh_rreq {
  uint64_t seed, prompt;
  uint8_t state, outcome;
  bool after_cut; /* link-cut: started once prefill had resumed; link-reset: ... once it had reset */
  uint64_t t_saved, t_held, bytes;
  char why[768];
  char prefill_why[384];                     /* push: prefill gave up; decode still ends the request */
  uint64_t tp[MH_TP_COUNT], tc[MH_TP_COUNT]; /* the producer's and consumer's trace (CLOCK_MONOTONIC ns) */
  uint64_t moved;                            /* bytes the mover's trace says it moved */
  bool failed_trace;                         /* a trace of it says failed */
};

/* An instance process, as the router sees it. */
struct mh_child {
  const char *name;
  pid_t pid;
  struct mh_conn conn;
  bool ready, dead, stats_in, exit_sent;
  bool reaped; /* its exit status is in wstatus already */
  int wstatus;
  struct mh_side s;
};

/* The router: the requests, the two instances and the counts the summary gives. */
/* --fault intruder (mh_intruder.c): what the intruder tried and how it fared. */
struct mh_intrusion {
  uint64_t attempts;     /* connections it made */
  uint64_t refused;      /* ... that ended in a bare refusal or a close, as they must */
  uint64_t admitted;     /* ... that got anything more: the run fails */
  uint64_t entries_seen; /* memory-table entries it was sent (must stay 0) */
};
/* The intruder's process: attack addr[0] and addr[1]; after a minimum of rounds write
 * 'R' to report_fd, go on until stop_fd is readable or closed, then write its struct
 * mh_intrusion to report_fd; the exit code. */
int mh_intruder_main(const char *const addr[2], int stop_fd, int report_fd);

struct mh_router {
  const struct mh_opts *o;
  struct mh_rreq *r;
  uint32_t next, inflight, ndone, nfail, nverified, nrecomputed, ncorrupt;
  struct mh_child side[2]; /* 0 prefill, 1 decode */
  bool fatal, push;
  bool cut;    /* link-cut: prefill is stopped */
  bool healed; /* link-cut: ... and resumed since */
  uint32_t nafter_cut, nverified_after_cut;
  uint32_t nreset;     /* link-reset: TCP connections prefill shut down */
  uint32_t handed_off; /* kv_transfer_params forwarded so far */
  uint64_t t_start, t_end, bytes;
  bool timed_out;        /* mh_run gave up at --timeout */
  bool exits_clean;      /* mh_reap: every instance that reported exited with status 0 */
  const char *addr[2];   /* each instance's engine address */
  const char *key_file;  /* the AuthKeyFile both instances use; NULL: none */
  const char *plugin[2]; /* each instance's plugin (--prefill-plugin, --decode-plugin) when they differ */
  uint32_t abi[2];       /* ... and its ops table's abi_version */
  pid_t intruder;        /* --fault intruder: its process, 0 before it starts */
  int intruder_stop;     /* closing it tells the intruder to stop */
  int intruder_report;   /* ... and it writes its figures here */
  bool intruder_ready;   /* it made its minimum of attempts: the run may end */
  bool intruder_in;      /* its figures came */
  struct mh_intrusion intrusion;
  struct mh_obs *obs; /* traces and metrics the instances sent (mh_obs.c) */
};

struct mh_obs;
/* The router's: open --trace's file; -1 (said) on failure. */
int mh_obs_start(struct mh_router *rt);
/* Start --metrics-port's server (its thread), once the instances are forked; -1 (said). */
int mh_obs_serve(struct mh_router *rt);
/* An MH_TRACE or MH_METRICS frame from side k; -1 malformed. */
int mh_obs_frame(struct mh_router *rt, int k, uint8_t type, struct mh_in *in);
/* After the run: one hand-off line per request into --trace's file; serve /metrics
 * --metrics-linger s more; stop the server, close the file. */
void mh_obs_finish(struct mh_router *rt);
/* The hand-off's phases from the traces: p50 and p99 (ms) of each, requests timed. */
#define MH_NPHASES 5
struct mh_phases {
  size_t n;
  double p50[MH_NPHASES], p99[MH_NPHASES];
  double xfer_gbps;     /* bytes moved / time with a transfer in flight */
  double xfer_gbps_p50; /* per request: its bytes / its transfer time */
};
extern const char *const mh_phase_names[MH_NPHASES];
void mh_obs_phases(const struct mh_router *rt, struct mh_phases *ph);

/* mh_metrics.c: texts of the Prometheus format merged into one, each family's header once
 * and its samples together (malloc'ed; NULL out of memory). */
char *mh_metrics_merge(const char *const *texts, size_t n);
struct mh_metrics;
struct mh_metrics *mh_metrics_start(uint16_t port, char *err, size_t cap);
void mh_metrics_set(struct mh_metrics *m, int k, const char *text, size_t len); /* side k's latest */
void mh_metrics_stop(struct mh_metrics *m);

/* Start the instances (prefill with plugin ops[0], config cfg_p and model o->model,
 * decode with ops[1], cfg_d and md) and route every request until both reported, or --timeout
 * (rt->timed_out); -1 when an instance could not be started. */
int mh_run(struct mh_router *rt, const hixl_kv_ops *const ops[2], const char *cfg_p, const char *cfg_d,
           const struct mh_model *md, uint32_t drain_ms);
/* Wait for the instances to exit (killing those that do not) and check how they did
 * (rt->exits_clean). */
void mh_reap(struct mh_router *rt);

/* The progress bar on stderr (a terminal's, unless --no-progress); last clears it. */
void mh_progress(const struct mh_router *rt, bool last);
/* Whether the run passed: every request verified, or the fault handled as expected. */
bool mh_verdict(const struct mh_router *rt);
/* The summary on stdout and, with --json, in that file; -1 when the file cannot be
 * written (the run fails). md: decode's model. */
int mh_report(const struct mh_router *rt, const struct mh_model *md, bool pass);

uint64_t mh_now_ns(void);
const char *mh_status_name(hixl_kv_status st);

#endif
