/* hixl-mock-host: a serving runtime in miniature (a router, a prefill and a decode
 * instance, each with a scheduler and a worker KV connector) that drives
 * libhixl_kv_connector.so as vLLM drives a KV connector. It includes the plugin's ABI
 * header and nothing else of hixl. Internal to the mock host; never installed. */
#ifndef HIXL_MOCK_HOST_H
#define HIXL_MOCK_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hixl/hixl_kv_connector.h"

/* ---- the fake model and its paged KV cache (mh_model.c) ---- */

struct mh_model {
  char name[32];
  uint32_t layers;
  uint32_t kv_heads;
  uint32_t head_dim;
  uint32_t elem_size;
  uint32_t block_tokens;
  uint64_t num_blocks;
};

uint64_t mh_token_bytes(const struct mh_model *m); /* one token's K (or V) in one layer */
uint64_t mh_block_bytes(const struct mh_model *m); /* one block of K (or V) in one layer */
uint64_t mh_blocks_for(const struct mh_model *m, uint64_t tokens);

/* One instance's KV cache: per layer one KV-first region (K blocks, then V blocks), a
 * free list and each block's owner, as a runtime's block manager keeps them. */
struct mh_cache {
  struct mh_model m;
  uint8_t *mem; /* NULL when the plugin allocated the caches */
  size_t len;
  hixl_kv_layer *layers; /* m.layers entries, for register_kv_caches */
  char (*names)[16];
  uint64_t *free_list;
  uint64_t nfree;
  uint32_t *owner; /* per block: request index + 1, 0 when free */
};

/* The block allocator and the layers' shapes; with own_memory also the memory (else
 * the layers' base and v_offset are set by the plugin's alloc_kv_caches). */
int mh_cache_init(struct mh_cache *c, const struct mh_model *m, bool own_memory);
void mh_cache_fini(struct mh_cache *c);
/* n blocks for owner into out, or false (nothing taken) when fewer are free. */
bool mh_alloc(struct mh_cache *c, uint64_t n, uint32_t owner, uint64_t *out);
void mh_free(struct mh_cache *c, const uint64_t *blocks, uint64_t n);
/* "Compute" one layer of a request: K and V of each of its tokens into its blocks. */
void mh_compute_layer(const struct mh_cache *c, uint64_t seed, uint32_t layer, const uint64_t *blocks,
                      uint64_t tokens);
/* Bytes of the request's KV in layers [first_layer, first_layer + nlayers) that differ
 * from the function (0: every byte checked and right); the first bad one is described in
 * where, if where is still "". */
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
  MH_TYPE_MAX
};

enum mh_outcome { MH_VERIFIED = 1, MH_RECOMPUTED, MH_FAILED, MH_CORRUPT };

#define MH_HDR_LEN    12u
#define MH_FRAME_MAX  (1u << 20)
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
/* The next whole frame: 1 and its type and payload, 0 none yet, -1 malformed. The
 * payload stays valid until the next call. */
int mh_conn_next(struct mh_conn *c, uint8_t *type, struct mh_in *payload);

/* What an instance reports at exit. */
struct mh_side {
  uint64_t blocks_total;
  uint64_t blocks_free;
  uint32_t requests_left; /* requests it still tracked */
  uint8_t stats_ok;       /* get_stats succeeded */
  hixl_kv_stats ks;       /* the worker connector's */
};
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
  MH_FAULT_LINK_RESET
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
  bool verbose;
};

/* Run an instance until the router says exit or goes away; the process exit code. */
int mh_instance_main(const struct mh_inst_args *a);

uint64_t mh_now_ns(void);
const char *mh_status_name(hixl_kv_status st);

#endif
