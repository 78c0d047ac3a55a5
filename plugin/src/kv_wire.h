/* kv_wire: the plugin's own messages, big-endian, versioned, parsed whole before use:
 *  - connector metadata, built by the scheduler each step and bound by the workers;
 *  - the KV service's requests and answers between workers (engine CALL frames). */
#ifndef HIXL_KV_WIRE_H
#define HIXL_KV_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KV_META_MAGIC 0x48584b4du /* "HXKM" */
/* 2: HOLD and LOAD carry the hold's epoch and number, every entry with blocks its groups'
 * counts; 3: the scheduler's capability key follows the version, and LOAD, FREE and PUSH
 * carry the capability of the peer's request (rcap); 4: ... and the peer instance's
 * tensor-parallel size (rtp) after it */
#define KV_META_VERSION 4u
#define KV_MAX_ID       256u       /* request ids */
#define KV_MAX_ENGINE   63u        /* "ip:port" */
#define KV_MAX_BLOCKS   (1u << 20) /* block ids in one entry */
#define KV_MAX_ENTRIES  65536u
#define KV_MAX_GROUPS   8u  /* KV cache groups; a request's blocks are one list per group */
#define KV_CAP_LEN      16u /* a request's capability (kv_cap.c) */
#define KV_CAP_KEY_LEN  32u /* the scheduler's key its requests' capabilities derive from */
#define KV_TP_MAX       64u /* tensor-parallel ranks of an instance (a rank set is a u64 mask) */

/* Growable output buffer; a failed allocation is sticky (bad). */
struct kv_out {
  uint8_t *p;
  size_t len, cap;
  bool bad;
};
void kv_put_u8(struct kv_out *o, uint8_t v);
void kv_put_u32(struct kv_out *o, uint32_t v);
void kv_put_u64(struct kv_out *o, uint64_t v);
void kv_put_str(struct kv_out *o, const char *s, size_t n);        /* u16 length, bytes */
void kv_put_blocks(struct kv_out *o, const uint64_t *v, size_t n); /* u32 count, u64 each */
void kv_put_raw(struct kv_out *o, const uint8_t *p, size_t n);

/* Reader over a received buffer; any overrun sets bad and reads zeros. */
struct kv_in {
  const uint8_t *p;
  size_t len, off;
  bool bad;
};
uint8_t kv_get_u8(struct kv_in *i);
uint32_t kv_get_u32(struct kv_in *i);
uint64_t kv_get_u64(struct kv_in *i);
/* A string of at most max bytes, copied NUL-terminated into out (max + 1 bytes). */
bool kv_get_str(struct kv_in *i, char *out, size_t max);
/* count u32 then count u64s, at most KV_MAX_BLOCKS; *v is malloc'ed (NULL when 0). */
bool kv_get_blocks(struct kv_in *i, uint64_t **v, size_t *n);
/* FNV-1a over the ids in order: a PIN or ACCEPT answer names a list of any length in
 * 12 bytes (a request of tens of thousands of blocks fits a service answer). */
uint64_t kv_blocks_digest(const uint64_t *v, size_t n);
/* ... and over the groups' counts after the ids. */
uint64_t kv_groups_digest(const uint64_t *v, size_t n, const uint32_t *gn, uint32_t ngroups);
/* One group's counts: u8 ngroups (1 to KV_MAX_GROUPS), u32 each; false when malformed
 * or they do not add up to total. */
void kv_put_groups(struct kv_out *o, const uint32_t *gn, uint32_t ngroups);
bool kv_get_groups(struct kv_in *i, uint32_t *gn, uint32_t *ngroups, size_t total);

/* A request's capability: what a KV service call on it must present. On the wire (and
 * in the metadata): u8 len, 0 (none given) or KV_CAP_LEN, then len bytes. */
struct kv_cap {
  uint8_t len; /* 0 or KV_CAP_LEN */
  uint8_t b[KV_CAP_LEN];
};
void kv_put_cap(struct kv_out *o, const struct kv_cap *c);
bool kv_get_cap(struct kv_in *i, struct kv_cap *c); /* another length: bad */

/* Metadata entries. */
enum kv_meta_type {
  KV_META_LOAD = 1,   /* consumer: pull remote blocks into local ones */
  KV_META_HOLD = 2,   /* producer: keep blocks for a consumer until freed or the lease ends */
  KV_META_FREE = 3,   /* consumer: tell the producer to free a request it holds (abort) */
  KV_META_PUSH = 4,   /* producer, push mode: write blocks into the consumer's, layer by layer */
  KV_META_EXPECT = 5, /* consumer, push mode: a producer will write these blocks */
  KV_META_RENEW = 6,  /* consumer, pull: renew a producer's hold of a request not scheduled yet */
};

struct kv_meta_entry {
  uint8_t type;
  char req[KV_MAX_ID + 1];        /* this side's request id */
  char remote[KV_MAX_ENGINE + 1]; /* LOAD, FREE, RENEW: the producer's engine, "ip:port" */
  uint64_t cluster;               /* LOAD, FREE: the producer's cluster id */
  char rreq[KV_MAX_ID + 1];       /* LOAD, FREE: the producer's request id */
  struct kv_cap rcap; /* LOAD, FREE, PUSH: rreq's capability, from its kv_transfer_params (len 0: none) */
  uint32_t rtp;       /* LOAD, FREE, PUSH: the peer instance's tensor-parallel size (its params' tp_size) */
  uint64_t *blocks;   /* LOAD: local blocks; HOLD: held blocks */
  size_t nblocks;
  uint64_t *rblocks; /* LOAD: the producer's blocks; PUSH: the consumer's; as many as blocks */
  size_t nrblocks;
  uint64_t epoch, seq; /* HOLD: the producer scheduler's epoch and this hold's number (from 1); LOAD:
                        * those of the hold it loads, from its kv_transfer_params (0: not given) */
  uint32_t ngroups;    /* blocks and rblocks are one list per group, one after another: */
  uint32_t gn[KV_MAX_GROUPS], rgn[KV_MAX_GROUPS]; /* group g's counts (sums: nblocks, nrblocks) */
};

/* Append one entry (header first: kv_meta_begin, with the scheduler's capability key). */
void kv_meta_begin(struct kv_out *o, const uint8_t key[KV_CAP_KEY_LEN], uint32_t count);
void kv_meta_put(struct kv_out *o, const struct kv_meta_entry *e);
/* Parse metadata whole; on success key holds the scheduler's capability key and
 * *entries (count of them) is one array whose block lists are freed by kv_meta_free. */
bool kv_meta_parse(const uint8_t *p, size_t len, uint8_t key[KV_CAP_KEY_LEN], struct kv_meta_entry **entries,
                   size_t *count);
void kv_meta_free(struct kv_meta_entry *entries, size_t count);

/* The KV service (engine CALL, service HIXL_SERVICE_KV). A request: u8 proto, u8 op,
 * the request id (kv_put_str), its capability (kv_put_cap), the caller's u32 world size
 * and u32 rank, then what the op takes.
 * Protocol 3: PIN and ACCEPT answer the groups' counts and the plane table; 4: every
 * request carries its request's capability after the id; 5: and the caller's world size
 * and rank after it (tensor parallelism: which heads it reads or writes). */
#define KV_SVC_PROTO       5u
#define KV_SVC_PROTO_NOCAP 3u /* the protocol before capabilities: refused as carrying none */
enum kv_svc_op {
  KV_SVC_PIN = 1,      /* req id, cap [, u64 epoch, u64 seq of its hold] -> state, layout text, block count
                        * and digest (extends the lease) */
  KV_SVC_FREE = 2,     /* req id, cap -> the producer frees it */
  KV_SVC_ACCEPT = 3,   /* push: req id, cap [, the producer's blocks per group (kv_put_groups)] -> as PIN's
                        * answer, of the consumer's blocks */
  KV_SVC_LAYER = 4,    /* push: req id, cap, layer u32 -> that layer has landed */
  KV_SVC_ABORT = 5,    /* push: req id, cap, reason -> the push failed; the consumer reports it */
  KV_SVC_LAYERS = 6,   /* push: req id, cap, first u32, count u32 (>= 2) -> those layers have landed */
  KV_SVC_RELEASE = 7,  /* req id, cap [, u64 epoch, u64 seq] -> state: HELD (this rank's share freed now),
                        * NOT_YET (nothing done, nothing remembered: ask again) or GONE. A consumer rank
                        * that reads nothing of that producer rank frees it in one call (a FREE that
                        * came before the hold would not free it); older producers answer UNSUPPORTED */
  KV_SVC_ACCEPT_W = 8, /* push, a producer whose link copies by CPU (shm): as ACCEPT -> as its answer, and
                        * when HELD, then u64 the address of this rank's landed bytes (one a layer; 0:
                        * none) and u8 their mark (kv_word.c); older consumers refuse it as malformed
                        * (PARAM_INVALID): the producer asks again with ACCEPT */
  KV_SVC_RENEW = 9,    /* req id, cap [, u64 epoch, u64 seq] -> state: HELD (its lease runs again; nothing
                        * granted, no consumer recorded: its load's PIN does that), NOT_YET or GONE and
                        * why. A request waiting to be scheduled keeps its hold; older producers answer
                        * UNSUPPORTED or "malformed": the consumer stops asking that producer */
};
#define KV_SVC_OP_LAST KV_SVC_RENEW
enum kv_pin_state {
  KV_PIN_HELD = 0,    /* then: layout text, u32 block count, u64 kv_groups_digest, the groups' counts
                       * (kv_put_groups), the plane table (kv_layout_put_planes) */
  KV_PIN_NOT_YET = 1, /* the producer has not bound the request yet: ask again */
  KV_PIN_GONE = 2,    /* freed, expired or aborted; then: the reason text */
};

#endif
