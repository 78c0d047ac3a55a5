/* kv_int: the connector's state, shared by its files (never installed). */
#ifndef HIXL_KV_INT_H
#define HIXL_KV_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "hixl/hixl.h"
#include "hixl/hixl_kv_connector.h"
#include "kv_wire.h"
#include "util/opvec.h"
#include "wire/wire.h"

/* Bytes of a peer's name as its engine knows it (what its HELLO claimed, at most the
 * wire's WIRE_MAX_NAME): grants are made and revoked by that name, so it is kept whole,
 * never cut (kv_serve refuses a longer one). */
#define KV_PEER_NAME_MAX WIRE_MAX_NAME

struct kv_revoke;
struct hixl_transfer_req; /* engine_ext.h: a started call (hixl_call_t) */
struct kv_obs;

/* Allocation failures injected by tests, at these sites only. Built where
 * HIXL_KV_TEST_HOOKS is defined (hixl_kv_test, the plugin as a static library for
 * white-box tests; kv_test_hooks.c), never into the shipped plugin, where
 * KV_ALLOC(site, expr) is expr. */
enum kv_test_site {
  KV_TEST_PUSH,  /* the pusher's own allocations (kv_pusher.c) */
  KV_TEST_GRANT, /* grants and their revokes (kv_grant.c) */
  KV_TEST_BIND,  /* what a worker's bind keeps of an entry: a load's parts, a hold, an expected push */
  KV_TEST_SITES
};
/* Points a white-box test waits for, and parks a thread at (never with c->lock held
 * where it parks): KV_TEST_POINT(p) counts each pass and, while p is armed, waits
 * there until the test releases it. */
enum kv_test_point {
  KV_TEST_LOADER_NEXT,  /* a loader thread took the load it PINned ahead, the lock dropped, not yet run */
  KV_TEST_PREEMPT_WAIT, /* handle_preemptions marked its loads, about to wait (lock held: never armed) */
  KV_TEST_LOADER_AHEAD, /* a loader thread started the PIN of its next load, its own pull not yet run */
  KV_TEST_SETTLE_SHUT,  /* kv_call_settled: answered "not yet" after shutdown began, about to decide */
  KV_TEST_POINTS
};
#ifdef HIXL_KV_TEST_HOOKS
/* From now, the nth allocation at site fails (once; 0: none); how many it failed. */
void kv_test_fail_nth(enum kv_test_site site, unsigned nth);
unsigned kv_test_failed(enum kv_test_site site);
bool kv_test_alloc_fails(enum kv_test_site site);
#define KV_ALLOC(site, expr) (kv_test_alloc_fails(site) ? NULL : (expr))
void kv_test_point(enum kv_test_point p);
/* Arm p (threads that pass it park) or disarm it (those parked go on); reset: passes 0. */
void kv_test_park(enum kv_test_point p, bool armed);
void kv_test_point_reset(enum kv_test_point p);
/* Whether p was passed n times (parked ones included) within timeout_ms. */
bool kv_test_point_wait(enum kv_test_point p, unsigned n, int timeout_ms);
#define KV_TEST_POINT(p) kv_test_point(p)
#else
#define KV_ALLOC(site, expr) (expr)
#define KV_TEST_POINT(p)     ((void)0)
#endif

/* What the plugin reads of its configuration (config/, the JSON document). */
struct kv_cfg {
  char address[64];  /* "ip:port" of rank 0's engine; rank r listens on port + r */
  bool producer;     /* role producer or both */
  bool consumer;     /* role consumer or both */
  bool push;         /* mode push (else pull) */
  uint32_t lease_ms; /* a held request is freed when no consumer took it by then */
  bool recompute;    /* load_failure_policy recompute (else fail) */
  uint32_t max_inflight;
  uint32_t per_producer; /* loads_per_producer: pulls from one producer rank at once */
  bool pipelining;
  bool load_in_forward; /* pull consumer: loads are the runtime's sync loads (load_kv_async false) */
  bool hnd;             /* required_kv_layout HND: get_required_kvcache_layout asks for it */
  bool kv_device;       /* kv_memory device: the KV caches are registered as HIXL_MEM_DEVICE */
  int32_t connect_timeout_ms, transfer_timeout_ms, notify_timeout_ms;
  bool metrics;         /* histograms and failure counters (kv_obs.c) */
  uint32_t trace_ring;  /* finished traces kept for drain_traces; 0: none */
  char trace_file[256]; /* finished traces appended here too; "" none */
  HixlOption *opts;     /* engine options, every one with its effective value */
  size_t nopts;
  void *opts_owner; /* the HixlConfig they belong to: kv_config_free */
};
hixl_kv_status kv_config_load(const char *json, size_t len, struct kv_cfg *cfg, char *err, size_t cap);
void kv_config_free(struct kv_cfg *cfg);

/* ---- the KV layout (kv_layout.c) ---- */

#define KV_MAX_LAYERS     4096u        /* model layers */
#define KV_MAX_PLANES     2048u        /* planes of a connector, every group (a PIN answer holds them) */
#define KV_MAX_NUM_BLOCKS (1ull << 40) /* a group's blocks */
#define KV_LAYOUT_TEXT    1024u        /* the compatibility digest, as text */

/* One plane: block b is bytes at base + b * stride; heads > 0: heads pieces of
 * bytes / heads, head h at + h * head_stride. */
struct kv_plane {
  uint64_t base, stride, bytes, head_stride;
  uint32_t heads;
};

struct kv_group {
  uint32_t kind, flags, nlayers, ppl, nplanes, block_tokens, elem_size, window;
  uint32_t last_layer; /* the highest layer id: a cross-layer group moves with it */
  uint32_t kheads;     /* the model's KV heads over every rank (kv_tp.c); 0: MLA, or no head dimension */
  uint64_t num_blocks;
  uint64_t bytes_per_block; /* every plane's block: what a request moves per block of this group */
  uint32_t *layer_ids;      /* nlayers */
  struct kv_plane *planes;  /* nplanes: nlayers * ppl, layer by layer (cross-layer: ppl) */
  char layout[32];
};

struct kv_layout {
  struct kv_group *g;
  uint32_t ng;
  uint32_t nlayers; /* model layers: every id below it is in one group */
  uint32_t nplanes; /* every group's */
  struct {
    uint32_t group, index;
  } * map; /* per model layer */
  struct kv_plane_at {
    uint32_t group, plane;
  } * by_base; /* every plane, by its base: pieces made plane by plane in this order, each plane's
                * blocks ascending, come out ascending unless planes interleave (kv_grant, kv_ops_build) */
  char text[KV_LAYOUT_TEXT];
};

/* A peer's planes (every group's, in order) and its groups' block counts, from its
 * PIN or ACCEPT answer. */
struct kv_remote {
  struct kv_plane *planes;
  uint64_t num_blocks[KV_MAX_GROUPS];
};

/* One group's paired blocks of a request: local[j] moves to or from remote[j]. */
struct kv_pairs {
  const uint64_t *local, *remote;
  size_t n;
};

/* ---- tensor parallelism (kv_tp.c) ---- */

/* Which heads of a producer rank's blocks a consumer rank takes, in one group: n heads
 * from the producer's local head src into the consumer's local head dst, or the whole
 * block (every plane's bytes, the same on both). */
struct kv_tp_slice {
  bool whole;
  uint32_t src, dst, n;
};
/* Whether instances of np (producer) and nd (consumer) ranks can hand l's groups over;
 * why on failure, naming both sizes. */
bool kv_tp_check(const struct kv_layout *l, uint32_t np, uint32_t nd, char *why, size_t cap);
/* What producer rank p gives consumer rank d of group g; false: nothing. */
bool kv_tp_slice(const struct kv_group *g, uint32_t np, uint32_t p, uint32_t nd, uint32_t d,
                 struct kv_tp_slice *s);
bool kv_tp_reads(const struct kv_layout *l, uint32_t np, uint32_t p, uint32_t nd, uint32_t d); /* any group */
/* The consumer ranks that free producer rank p's copy of a request (pull): those that
 * read it, else rank p mod nd alone. */
uint64_t kv_tp_touchers(const struct kv_layout *l, uint32_t np, uint32_t p, uint32_t nd);
uint64_t kv_tp_sources(const struct kv_layout *l, uint32_t np, uint32_t nd, uint32_t d); /* p d reads */
uint64_t kv_tp_frees(const struct kv_layout *l, uint32_t np, uint32_t nd, uint32_t d);   /* p d frees */
/* The heads a rank of world holds of group g (0: g has no head dimension). */
uint32_t kv_tp_heads(const struct kv_group *g, uint32_t world);

/* Head ranges of a pair of ranks, per group, in local and remote terms (NULL in
 * kv_ops_build: whole blocks). */
struct kv_heads {
  bool whole;
  uint32_t local, remote, n;
};

/* Check and copy groups (need_base: every plane's base set); the digest text ends with
 * " tp=world". */
hixl_kv_status kv_layout_build(struct kv_layout *out, const hixl_kv_group *groups, size_t ng, uint32_t world,
                               bool need_base, const char *fn);
void kv_layout_free(struct kv_layout *l);
/* Register the planes' memory with c's engine (spans that overlap or touch as one;
 * none inside an alloc_kv_memory allocation): c->regs. */
hixl_kv_status kv_layout_register(hixl_kv_connector *c, const struct kv_layout *l, const char *fn);
void kv_layout_put_planes(struct kv_out *o, const struct kv_layout *l);
/* A peer's plane table, checked against l (same count; sizes and heads are l's, for a
 * peer of world ranks: a head-split plane holds that world's share of the heads). */
bool kv_layout_get_planes(struct kv_in *in, const struct kv_layout *l, uint32_t world, struct kv_remote *out);
/* Ops moving layers [first, first + count) of the pairs (one per group), each group's
 * heads hs[g] of a block (hs NULL: whole blocks); PARAM_INVALID for a block past its
 * group's count on either side. */
hixl_kv_status kv_ops_build(struct opvec *o, const struct kv_layout *l, const struct kv_remote *r,
                            uint32_t first, uint32_t count, const struct kv_pairs *pairs,
                            const struct kv_heads *hs, char *why, size_t cap);
/* A request's paired blocks, per group, as runs: n blocks from local here and from
 * remote there, adjacent on both sides, sorted by local block. Built once per request
 * (a push builds its layers' ops from them, kv_pusher.c). */
struct kv_run {
  uint64_t local, remote, n;
};
struct kv_runs {
  struct kv_run *v[KV_MAX_GROUPS];
  size_t n[KV_MAX_GROUPS];
};
/* The runs of pairs (one per group of l); PARAM_INVALID for a block past its group's
 * count on either side, RESOURCE_EXHAUSTED (why); kv_runs_free frees them (any time). */
hixl_kv_status kv_runs_build(struct kv_runs *out, const struct kv_layout *l, const struct kv_remote *r,
                             const struct kv_pairs *pairs, char *why, size_t cap);
void kv_runs_free(struct kv_runs *runs);
/* kv_ops_build from runs checked by kv_runs_build: RESOURCE_EXHAUSTED only. */
hixl_kv_status kv_ops_runs(struct opvec *o, const struct kv_layout *l, const struct kv_remote *r,
                           uint32_t first, uint32_t count, const struct kv_runs *runs,
                           const struct kv_heads *hs, char *why, size_t cap);
/* Bytes a request of gn[g] blocks per group moves (every plane). */
uint64_t kv_request_bytes(const hixl_kv_connector *c, const uint32_t *gn, uint32_t ngroups);
/* The digest text up to its " tp=" (what two sides of any world sizes must share), and
 * the world size after it (0 when there is none). */
size_t kv_layout_core_len(const char *text);
uint32_t kv_layout_world(const char *text);

/* The peers a request's blocks are given to (a PIN's consumer ranks, an ACCEPT's
 * producer ranks): each may be using them; grant: they are granted to it, and this is
 * its revoke, made when the grant was (kv_grant.c), so revoking allocates nothing. At
 * most KV_PEERS_MAX: the ranks of one peer instance; a PIN or ACCEPT from one more
 * name is refused (each would be granted the blocks, and kept in a list searched
 * linearly). */
#define KV_PEERS_MAX KV_TP_MAX
struct kv_peers {
  struct kv_peer_ref {
    char name[KV_PEER_NAME_MAX + 1];
    struct kv_revoke *grant;
    bool done; /* it is done with the request (kv_peers_done): no grant, not cut when it expires */
  } * v;
  uint32_t n;
};

/* A request a producer worker holds for a consumer. */
struct kv_held {
  char id[KV_MAX_ID + 1];
  uint64_t *blocks; /* every group's, one list after another */
  size_t n;
  uint32_t ngroups, gn[KV_MAX_GROUPS];
  uint64_t expires_ns;
  struct kv_peers peers; /* the consumer ranks that pinned it (they may be reading the blocks) */
  uint32_t ctp;          /* the consumer instance's world size, from its first PIN or FREE (0: none yet) */
  uint64_t need, freed;  /* the consumer ranks that free it here (kv_tp_touchers), and those that did */
  struct kv_cap cap;     /* what a PIN or FREE of it presents (kv_cap_make of id, with the bound key) */
};

/* What a request's parts share: a consumer rank reads it from several producer ranks
 * (kv_tp.c), or a producer rank pushes it to several consumer ranks; it ends once its
 * last part has. */
struct kv_whole {
  uint32_t left; /* parts not ended */
  bool failed;
  bool in_forward; /* load_in_forward: the step's forward pass waits for it (kv_wait_layer), and
                    * it is not reported by get_finished (the runtime never waited for it there) */
};

/* A load a consumer worker owes: a request from one producer rank (its part: the
 * request's whole is the shared record; a FREE: only told). */
struct kv_load {
  struct kv_meta_entry e; /* owns its block lists; remote: that producer rank's engine */
  uint32_t src;           /* the producer rank */
  struct kv_whole *whole; /* NULL: a FREE */
  bool pin_first;         /* a FREE of a producer rank no consumer rank reads: PIN it first (it may
                           * not hold the request yet, and a FREE before the hold is refused or lost) */
  uint32_t ahead_by;      /* queued: the loader thread (slot + 1) that PINned it ahead and runs it
                           * next; 0: none (kv_loader.c; under the lock) */
  bool preempted;         /* running: handle_preemptions named it; it ends failed without touching its
                           * blocks if it has not started pulling (under the lock) */
  struct kv_load *next;
};

/* Push mode, consumer worker: a request a producer will write into blocks. */
struct kv_expect {
  char id[KV_MAX_ID + 1];
  uint64_t *blocks; /* every group's, one list after another */
  size_t n;
  uint32_t ngroups, gn[KV_MAX_GROUPS];
  uint32_t pgn[KV_MAX_GROUPS]; /* the blocks per group the producer that accepted writes */
  uint32_t ptp;                /* the producer instance's world size, from its first ACCEPT (0: none yet) */
  uint64_t want;               /* the producer ranks that write into it (kv_tp_sources) */
  uint64_t *landed;            /* per layer: the producer ranks whose copy of it landed */
  uint32_t nlanded;            /* layers every producer rank of want landed */
  uint64_t deadline_ns;        /* no producer finished by then: the load fails */
  uint64_t step;               /* the step that bound it: its wait_for_layer_load waits for it */
  struct kv_peers peers;       /* the producer ranks that accepted it (they may write into the blocks) */
  struct kv_cap cap;           /* what an ACCEPT, LAYER(S) or ABORT of it presents */
  uint64_t wranks;             /* the producer ranks given a row of landed bytes (ACCEPT_W, kv_word.c) */
  uint16_t row[KV_TP_MAX];     /* ... each one's row + 1 */
  uint8_t mark[KV_TP_MAX];     /* ... and what each writes there for a layer landed (its row's mark) */
};

/* Push mode, producer worker: a request to write into a consumer rank's blocks (one
 * part of it: the shared record ends it). */
struct kv_push {
  struct kv_meta_entry e; /* owns its block lists; remote: that consumer rank's engine */
  uint32_t dst;           /* the consumer rank */
  struct kv_whole *whole;
  uint64_t bytes;                    /* written so far */
  struct kv_remote r;                /* the consumer's planes, from its ACCEPT answer */
  struct kv_runs runs;               /* its block pairs as runs, built at the ACCEPT: each layer's ops */
  struct kv_heads hs[KV_MAX_GROUPS]; /* ... and the heads it moves per group (kv_tp.c) */
  uint64_t step;                     /* the step whose save_kv_layer calls release its layers */
  uint64_t bound_ns;
  uint64_t waddr; /* the consumer's landed bytes for it (ACCEPT_W, kv_word.c); 0: none */
  uint8_t wmark;  /* ... and what it writes there for a layer landed */
  struct kv_push *next;
};

/* Push mode, consumer scheduler: blocks allocated for a request, for get_push_params. */
struct kv_alloc {
  char id[KV_MAX_ID + 1];
  uint64_t *blocks; /* every group's, one list after another */
  size_t n;
  uint32_t ngroups, gn[KV_MAX_GROUPS];
};

/* A list of request ids, growing. */
struct kv_idset {
  char **v;
  size_t n, cap;
};

/* Request ids (or peers) hashed, in the order they were added, each with a value; at
 * a bound the caller gives, the oldest is forgotten first. An id added twice is there
 * twice (kv_gone_add counts each ending). All zero is an empty set (kv_util.c). */
struct kv_idnode;
struct kv_idhash {
  struct kv_idnode **b;              /* nb buckets, a power of 2 (none until the first add) */
  size_t nb, n;                      /* buckets (doubled at one entry each, halved below one per 8, at
                                      * least 16), entries */
  struct kv_idnode *oldest, *newest; /* the order added */
  uint64_t seed;                     /* random, per set: where an id lands is not the peer's choice */
  uint64_t evicted;                  /* entries forgotten at the bound, ever */
};

/* The bounds of the lists a peer or a host can grow; past each the oldest entry is
 * forgotten (docs/plugin.md, "Bounds"). */
#define KV_GONE_MAX    4096u /* worker: ids that ended lately, so a late PIN fails at once */
#define KV_FAILED_MAX  4096u /* consumer scheduler: failed loads of requests not finished */
#define KV_UNREACH_MAX 1024u /* worker: peers whose last Link failed */
#define KV_ALLOCS_MAX  4096u /* push consumer scheduler: allocations get_push_params has not taken */
#define KV_DELAYED_MAX 4096u /* push producer scheduler: requests finished (delay_free 1), not pushed yet */
#define KV_WAITING_MAX 4096u /* pull consumer scheduler: requests not scheduled yet whose holds it renews */

/* Pull consumer scheduler: a request on_new_request saw, not scheduled yet: its
 * producer's hold is renewed (a RENEW entry) every third of lease_ms (kv_sched.c). */
struct kv_waiting {
  struct kv_meta_entry e; /* the RENEW: the producer, its request, capability, TP size and hold */
  uint64_t next_ns;       /* when the next renewal is due */
};

/* Role scheduler. */
struct kv_sched {
  struct kv_out meta; /* entries for the next build_connector_meta */
  uint32_t meta_count;
  struct kv_idhash failed;  /* consumer: requests whose load failed (recompute: 0 tokens), till finished */
  struct kv_idhash allocs;  /* push consumer: a struct kv_alloc per request, for get_push_params */
  struct kv_idhash pushing; /* push producer: requests whose blocks stay until pushed, at most max_inflight */
  struct kv_idhash delayed; /* push producer: requests whose request_finished answered delay_free 1, until
                               their finished_sending (a second request_finished of one is refused) */
  struct kv_idhash holding; /* pull producer: requests held for a consumer, until finished_sending (at most
                               max_inflight_requests, hashed) */
  struct kv_idhash waiting; /* pull consumer: id -> struct kv_waiting, the next renewal due first (each
                               made the newest as it is renewed; at most KV_WAITING_MAX) */
  struct kv_idhash ended;   /* pull producer: requests held whose finished_sending came back, the last
                               KV_GONE_MAX: request_finished of one again is a reused id, refused */
  uint64_t reused;          /* ... request_finished calls refused so (the first is logged) */
  uint64_t not_held;        /* producer: requests not held (pull) or not pushed (push) at max_inflight */
  uint64_t params_refused;  /* kv_transfer_params meant for it that did not parse (the first logged) */
  uint64_t epoch;           /* pull producer: this scheduler's, random (below 2^52: exact in any JSON) */
  uint64_t hold_seq;        /* ... and the number of the last hold it queued */
  uint8_t cap_key[KV_CAP_KEY_LEN]; /* random: its requests' capabilities derive from it (kv_cap.c); each
                                    * metadata carries it to the workers */
};

/* Worker, pull producer: the requests held for consumers (kv_service.c), at most
 * max_inflight_requests; one more is refused (kv_held_bind). */
struct kv_holder {
  struct kv_idhash held;     /* id -> struct kv_held, in the order their leases end: each lease is set to
                              * now + lease_ms under the lock, and the request then made the newest */
  uint64_t epoch, bound_seq; /* the scheduler's epoch, and the last hold of it bound */
  uint64_t refused;          /* holds refused at the bound (the first is logged) */
  uint64_t reused;           /* holds refused for an id that ended here lately (the first is logged) */
  uint64_t again;            /* holds of an id held here already, not held again (the first is logged) */
  uint64_t renewed;          /* RENEWs served for a held request (its consumer's request not scheduled yet) */
  char full_why[128];        /* what a PIN of a refused one hears (GONE), naming the bound */
};

/* Worker, pull consumer: what one loader thread has in flight besides its pull
 * (kv_loader.c): the PIN of the next load of the producer it serves, started while the
 * one before is pulled, and the FREE of the load it pulled last, answered meanwhile.
 * Only its thread touches it. */
struct kv_loader_slot {
  struct kv_meta_entry ahead;           /* the load PINned ahead (no block lists): its request and producer */
  struct hixl_transfer_req *ahead_call; /* ... its PIN (a hixl_call_t), or NULL */
  uint8_t *ahead_ans;                   /* HIXL_CALL_MAX bytes for its answer (allocated at the first) */
  uint32_t ahead_len;
  bool ahead_stale;                    /* its load preempted while queued: the answer is no one's (lock) */
  struct kv_meta_entry freed;          /* the load FREEd last (no block lists) */
  struct hixl_transfer_req *free_call; /* ... its FREE (a hixl_call_t), or NULL */
  uint8_t free_ans[64];
  uint32_t free_len;
};

/* Worker, pull consumer: the loads (kv_loader.c). */
/* Loader threads; each serves one producer at a time, at most loads_per_producer of them
 * the same one. */
#define KV_LOADERS_MAX 16
struct kv_loader {
  struct kv_load *bound, *bound_tail;      /* bound, not yet started */
  struct kv_load *queue, *queue_tail;      /* started, waiting for a loader thread */
  struct kv_idset busy;                    /* producers the loader threads serve now, once per thread */
  struct kv_load *running[KV_LOADERS_MAX]; /* per thread: the load (or FREE) it runs, set in the critical
                                            * section that takes it off the queue: handle_preemptions finds
                                            * every load bound, queued or here */
  uint32_t nthreads, idle;                 /* loader threads, and those waiting for a load */
  pthread_t threads[KV_LOADERS_MAX];
  struct kv_loader_arg {
    hixl_kv_connector *c;
    uint32_t slot;
  } args[KV_LOADERS_MAX];
  struct kv_loader_slot slots[KV_LOADERS_MAX];
  struct kv_load *pulling[KV_LOADERS_MAX]; /* per thread: the load it pulls now (pinned), or NULL */
  uint32_t npulling;
  pthread_cond_t cond;  /* a load queued, a producer no longer busy, or shut: idle loader threads wait
                         * (CLOCK_MONOTONIC) */
  pthread_cond_t ended; /* a load ended: handle_preemptions and kv_wait_layer wait (CLOCK_MONOTONIC) */
  uint32_t in_forward;  /* load_in_forward: requests bound and not ended; the forward pass waits for 0 */
  struct kv_idset forward_done; /* ... those ended, for their traces (kv_obs_reported, without the lock) */
  pthread_t renewer;            /* pins the loads being pulled again every half lease */
  bool renewer_on;
  bool renewer_idle;            /* it waits for a load to be queued or pulled */
  pthread_cond_t renew;         /* loads queued, a pull started while it was idle, renewals bound, or shut
                                 * (CLOCK_MONOTONIC) */
  struct kv_meta_entry *renews; /* RENEWs bound (one per producer rank this rank renews), for the renewer */
  size_t nrenews, renews_cap;
  uint64_t renews_dropped;  /* ... past KV_WAITING_MAX at once (the first is logged) */
  bool renew_old_said;      /* a producer that does not take RENEW was named */
  struct kv_idhash norenew; /* producers that refused RENEW as unknown: not asked again until linked anew
                             * (kv_link), at most KV_UNREACH_MAX */
};

/* Worker, push producer: the pushes (kv_pusher.c). */
#define KV_PUSH_GONE 16 /* consumers a pusher remembers a failed Link to (the oldest ends first) */
struct kv_pusher {
  uint64_t *saved_step; /* per layer: the step of its last save_kv_layer */
  struct kv_push *pushes, *tail;
  struct kv_idset active; /* requests of the step the pusher is pushing now */
  pthread_cond_t cond;    /* pushes queued, or shut (CLOCK_MONOTONIC) */
  pthread_cond_t saved;   /* a layer was saved (the pusher waits; CLOCK_MONOTONIC) */
  bool on;
  pthread_t thread;
  struct kv_idhash noword; /* consumers that refused ACCEPT_W as unknown (older): ACCEPT until linked anew
                            * (kv_link), at most KV_UNREACH_MAX */
  struct {                 /* consumers a Link failed to lately (the pusher thread's alone): */
    char remote[KV_MAX_ENGINE + 1];
    uint64_t until_ns; /* ... not dialled again before this (the failure + connect_timeout_ms) */
  } gone[KV_PUSH_GONE];
};

/* Worker, push consumer: the pushes expected (kv_service.c), at most
 * max_inflight_requests; one more is refused (kv_expect_bind). */
struct kv_expecter {
  struct kv_idhash expects; /* id -> struct kv_expect, in the order bound: so by step, and by deadline
                             * (bind's now + lease_ms, never moved) */
  pthread_cond_t landed;    /* a layer landed or an expected push ended (the forward pass waits in
                             * wait_for_layer_load; CLOCK_MONOTONIC) */
  uint64_t refused;         /* expected pushes refused at the bound (the first is logged) */
  uint64_t reused;          /* ... refused for an id expected here that ended lately (the first is logged) */
  char full_why[128];       /* what an ACCEPT of a refused one hears (GONE), naming the bound */
};

/* Push over shm, the landed bytes (kv_word.c). A consumer worker's rows, one byte a
 * layer, KV_WORD_ROWS of them in memory its engine allocated (a same-host peer maps it):
 * an expected push's producer rank that asks (ACCEPT_W) gets a row and writes each
 * layer's byte right after the layer's data; the forward pass reads it. A producer's
 * bytes to write from. Under the connector's lock, but src (the pusher's alone). */
#define KV_WORD_ROWS 1024u
struct kv_words {
  uint8_t *rows; /* consumer: KV_WORD_ROWS x layers bytes; NULL: none */
  HixlMemHandle rh;
  uint32_t *free_rows;  /* the rows not given, a queue: nfree of them from head, round */
  uint32_t head, nfree; /* (a row given back is taken after every other free row) */
  uint8_t *marks;       /* each row's last mark, 1 to 255 round: its next taker gets the next */
  uint8_t *src;         /* producer: layers bytes; NULL: none */
  HixlMemHandle sh;
};

struct hixl_kv_connector {
  int32_t role;
  uint32_t rank, world;
  struct kv_cfg cfg;
  pthread_mutex_t lock; /* a leaf: never held across a hixl call */
  bool shut;
  uint64_t shut_ns; /* when shutdown began: a cleanup call asks on notify_timeout_ms past it at most */
  uint8_t joined;   /* the threads: 0 running, 1 a shutdown joins them (others wait on load.cond), 2 joined */

  struct kv_sched sched; /* role scheduler */

  /* role worker, every mode */
  HixlEngine *eng;
  HixlCacheManager *mgr;
  char engine_addr[64];
  uint64_t cluster;
  struct kv_layout lay; /* the KV caches, once registered (lay.ng > 0) */
  uint32_t layers;      /* lay.nlayers */
  struct kv_mem {       /* alloc_kv_memory's (and alloc_kv_caches') allocations */
    uint64_t base, len;
    HixlMemHandle h;
  } * mems;
  size_t nmems;
  bool registering;    /* register_kv_groups (or caches) under way */
  HixlMemHandle *regs; /* the planes' memory registered with the engine */
  size_t nregs;
  uint64_t step;                   /* binds so far: each step binds once */
  struct kv_idhash gone;           /* ids freed, loaded or expired lately (PIN and ACCEPT answer GONE) */
  uint8_t cap_key[KV_CAP_KEY_LEN]; /* worker: its scheduler's capability key, from the last metadata bound */
  bool cap_key_set;                /* ... once one was */
  struct kv_idset sending_done;
  struct kv_idset recving_done;
  struct kv_idhash unreach; /* peers the last Link to failed (kv_tell links again only to others) */
  struct kv_idhash drop;    /* peers to cut before reporting: producers whose expected push expired, consumers
                             * that pinned a request whose lease expired; one entry a name, none forgotten (a
                             * peer not cut might touch blocks the host reuses): at most KV_PEERS_MAX a request
                             * held or expected, emptied by each get_finished */
  struct kv_revoke *revq;   /* grants to revoke without the lock, a list (kv_grant.c) */
  uint32_t revoking;        /* kv_revoke_flush calls revoking a list they took, now (without the lock) */
  pthread_cond_t revoked;   /* ... the last of them ended (kv_revoke_settle waits) */
  uint64_t *err_blocks;
  size_t nerr, caperr;
  int efd;                /* get_event_fd's eventfd, made at its first call; -1 until then */
  hixl_kv_stats_ex stats; /* size unused */
  struct kv_obs *obs;     /* histograms and traces (kv_obs.c); NULL: observes nothing */
  uint64_t peers_refused; /* PINs and ACCEPTs refused at a request's KV_PEERS_MAX (the first is logged) */

  struct kv_holder hold;  /* pull producer */
  struct kv_loader load;  /* pull consumer */
  struct kv_pusher push;  /* push producer */
  struct kv_expecter exp; /* push consumer */
  struct kv_words words;  /* push, a worker: the landed bytes (kv_word.c) */
};

/* ---- kv_util.c ---- */

/* Status with the reason kept for last_error (per thread). */
hixl_kv_status kv_fail(hixl_kv_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *kv_last_error(void);
#define CHECK_ARG(cond, ...)                                                                                 \
  do {                                                                                                       \
    if (!(cond)) return kv_fail(HIXL_KV_PARAM_INVALID, __VA_ARGS__);                                         \
  } while (0)
uint64_t kv_now_ns(void);               /* CLOCK_MONOTONIC */
int32_t kv_ms_until(uint64_t deadline); /* ms left, rounded up; 0 once passed */
bool kv_idset_has(const struct kv_idset *s, const char *id);
size_t kv_idset_count(const struct kv_idset *s, const char *id); /* an id added n times, deleted less */
int kv_idset_add(struct kv_idset *s, const char *id);            /* -1: out of memory */
void kv_idset_del(struct kv_idset *s, const char *id);
void kv_idset_clear(struct kv_idset *s);
int kv_idset_take(struct kv_idset *s, hixl_kv_ids *out); /* hand to the host, emptying s; -1: no memory */
/* kv_idhash: has, add (max: the bound; at it the oldest entry goes first, its value in
 * *old when old is not NULL; 1 when one went, 0 when not, -1 out of memory: nothing
 * changed), get (the newest entry of id's value in *val; false: none), touch (id's
 * newest entry becomes the newest of all; false: none), del (the newest entry of id,
 * its value in *val; false: none), clear (each value given to free_val, unless NULL).
 * A walk, newest to oldest: x = s->newest, then kv_idnode_older(x), each
 * kv_idnode_val(x) and kv_idnode_id(x); the oldest entry's value: kv_idnode_val(s->oldest). */
bool kv_idhash_has(const struct kv_idhash *s, const char *id);
int kv_idhash_add(struct kv_idhash *s, const char *id, void *val, size_t max, void **old);
bool kv_idhash_get(const struct kv_idhash *s, const char *id, void **val);
bool kv_idhash_touch(struct kv_idhash *s, const char *id);
bool kv_idhash_del(struct kv_idhash *s, const char *id, void **val);
void kv_idhash_clear(struct kv_idhash *s, void (*free_val)(void *));
const struct kv_idnode *kv_idnode_older(const struct kv_idnode *x);
void *kv_idnode_val(const struct kv_idnode *x);
const char *kv_idnode_id(const struct kv_idnode *x);
/* Where id lands: bucket kv_idhash_hash & (nb - 1). */
uint64_t kv_idhash_hash(const struct kv_idhash *s, const char *id);
void kv_free_ids(hixl_kv_ids *ids);
void kv_free_buffer(hixl_kv_buffer *b);
bool kv_copy_id(char *dst, const char *src, size_t n); /* 1 to KV_MAX_ID bytes of text, NUL-terminated */
/* "ip:port" + rank -> this worker's engine address and its cluster id. */
hixl_kv_status kv_worker_address(const char *base, uint32_t rank, char *out, size_t cap, uint64_t *cluster);
/* Lock held for these. */
void kv_efd_signal(hixl_kv_connector *c);
/* id is finished sending (c->sending_done) or receiving (c->recving_done): the host
 * learns it at its next get_finished, one waiting on the event fd wakes now, and its
 * trace ends (in kv_obs.c, which kv_util.c does not call). */
void kv_finished_add(hixl_kv_connector *c, struct kv_idset *set, const char *id);
void kv_gone_add(hixl_kv_connector *c, const char *id);
/* ... and what a PIN or ACCEPT of it hears (why: text that lives as long as c; NULL: the
 * ending's usual words). */
void kv_gone_add_why(hixl_kv_connector *c, const char *id, const char *why);
/* peer's last Link failed (reached false) or succeeded: c->unreach, at most KV_UNREACH_MAX. */
void kv_unreach_note(hixl_kv_connector *c, const char *peer, bool reached);
void kv_err_blocks_add(hixl_kv_connector *c, const uint64_t *b, size_t n);

/* ---- kv_cap.c: request capabilities ---- */

#define KV_CAP_HEX (2 * KV_CAP_LEN + 1) /* as text in kv_transfer_params ("cap"), NUL included */
hixl_kv_status kv_cap_key_new(uint8_t key[KV_CAP_KEY_LEN]); /* getrandom */
/* id's capability under key: HMAC-SHA256(key, id) cut to KV_CAP_LEN bytes (len 0 if it failed). */
void kv_cap_make(const uint8_t key[KV_CAP_KEY_LEN], const char *id, struct kv_cap *out);
/* Whether got is want, both KV_CAP_LEN bytes long; in constant time. */
bool kv_cap_equal(const struct kv_cap *want, const struct kv_cap *got);
void kv_cap_hex(const struct kv_cap *c, char out[KV_CAP_HEX]);
bool kv_cap_parse_hex(const char *s, size_t n, struct kv_cap *out); /* exactly 2 * KV_CAP_LEN hex digits */
void kv_cap_wipe(void *p, size_t n); /* zeroes p in a way the compiler does not drop */

/* ---- kv_parts.c: a request's parts, one per peer rank ---- */

/* Peer lists (lock held). */
bool kv_peers_has(const struct kv_peers *s, const char *name);
/* The entry of name in s, added if new; NULL: no memory, a name longer than KV_PEER_NAME_MAX,
 * or s holds KV_PEERS_MAX others. */
struct kv_peer_ref *kv_peers_add(struct kv_peers *s, const char *name);
void kv_peers_free(struct kv_peers *s);
/* Each of s's peers into c->drop (cut before the host reuses the blocks), once; not one
 * done with the request (kv_peers_done): it reaches the blocks no more. */
void kv_peers_drop(hixl_kv_connector *c, const struct kv_peers *s);
/* peer is done with the request whose peers are s (pull: a consumer rank's FREE or
 * RELEASE; push: every layer of a producer rank landed), while other ranks are not:
 * its grant revoked now (kv_revoke_later), and it is not cut when the request's lease
 * runs out or another rank aborts it. A PIN or ACCEPT after it grants again. Lock held. */
void kv_peers_done(hixl_kv_connector *c, struct kv_peers *s, const char *peer);
/* The request's blocks go to peer (a PIN's consumer rank, an ACCEPT's producer rank):
 * granted once to it, as to each other rank of its instance that moves them (a grant
 * that fails is logged: the peer's transfers are refused); false when kv_peers_add
 * is (no memory, a name too long). Lock held, in kv_serve (the engine lets its
 * handler grant). */
bool kv_peers_grant(hixl_kv_connector *c, struct kv_peers *s, const char *peer, const uint64_t *blocks,
                    const uint32_t *gn, uint32_t ngroups);
/* Revoke what s's peers were granted (kv_revoke_later). */
void kv_peers_revoke(hixl_kv_connector *c, struct kv_peers *s);
/* bind: e (LOAD or FREE, a consumer's) as its parts, one per producer rank it reads or
 * frees, queued at c->load.bound; e's lists are taken. Lock held. */
hixl_kv_status kv_load_parts(hixl_kv_connector *c, struct kv_meta_entry *e);
/* A load's part ended (st, why): the request ends with its last part (recving_done; failed:
 * its blocks reported). Lock held. */
void kv_load_part_end(hixl_kv_connector *c, struct kv_load *l, HixlStatus st, const char *why);
/* bind: e (PUSH, a producer's) as its parts, one per consumer rank it writes, queued for
 * the pusher (none: finished now). Lock held. */
hixl_kv_status kv_push_parts(hixl_kv_connector *c, struct kv_meta_entry *e, uint64_t now);
/* A push's part ended; the request ends with its last (sending_done, counted). Lock held. */
void kv_push_part_end(hixl_kv_connector *c, struct kv_push *p, bool ok);
/* The heads of each group p moves (pull: this consumer rank from its producer rank src;
 * push: this producer rank to consumer rank dst), in local and remote terms. */
void kv_load_heads(const hixl_kv_connector *c, const struct kv_load *l, struct kv_heads *hs);
void kv_push_heads(const hixl_kv_connector *c, const struct kv_push *p, struct kv_heads *hs);

/* ---- kv_service.c: what this worker answers ---- */

HixlStatus kv_serve(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp, size_t cap,
                    size_t *resp_len);
/* Lock held for these. */
struct kv_held *kv_held_find(hixl_kv_connector *c, const char *id);
/* bind: a HOLD entry (its blocks taken): held, or refused at max_inflight_requests
 * (reported finished-sending at once, its PIN answers GONE naming the bound);
 * RESOURCE_EXHAUSTED: out of memory. */
hixl_kv_status kv_held_bind(hixl_kv_connector *c, struct kv_meta_entry *e);
void kv_held_free(void *h); /* a struct kv_held never released (destroy) */
void kv_leases_expire(hixl_kv_connector *c);
struct kv_expect *kv_expect_find(hixl_kv_connector *c, const char *id);
/* bind: an EXPECT entry (its blocks taken) bound at now: expected, or refused at
 * max_inflight_requests or as a reused id (one that ended here lately, not preempted)
 * (its load fails at once: reported received, its blocks with load errors; its
 * producer's ACCEPT answers GONE naming why); RESOURCE_EXHAUSTED: out of memory. */
hixl_kv_status kv_expect_bind(hixl_kv_connector *c, struct kv_meta_entry *e, uint64_t now);
void kv_expect_free(void *x); /* a struct kv_expect never ended (destroy) */
void kv_expects_expire(hixl_kv_connector *c);
/* x ends: landed whole (why NULL) or failed: reported by get_finished (and its blocks
 * by get_block_ids_with_load_errors). */
void kv_expect_end(hixl_kv_connector *c, struct kv_expect *x, const char *why);
/* x ends preempted (handle_preemptions), its producers cut first: the host allocates
 * the request again, and its EXPECT then is expected anew (not a reused id). */
void kv_expect_preempt(hixl_kv_connector *c, struct kv_expect *x);

/* kv_grant.c: scoped memory. kv_grant: inside kv_serve only (the engine lets its
 * handler grant); the grant's revoke, made now so that revoking never fails for want
 * of memory, or NULL when nothing was granted. kv_revoke_later: lock held, takes v and
 * queues it, allocating nothing; made by kv_revoke_flush, called without the lock
 * (kv_serve's end, drop_peers' callers). kv_revoke_free: a revoke never queued (the
 * engine goes, and its grants with it). */
struct kv_revoke *kv_grant(hixl_kv_connector *c, const char *peer, const uint64_t *blocks, const uint32_t *gn,
                           uint32_t ngroups);
void kv_revoke_later(hixl_kv_connector *c, struct kv_revoke *v);
void kv_revoke_free(struct kv_revoke *v);
void kv_revoke_flush(hixl_kv_connector *c);
/* kv_revoke_flush, then wait for the revokes other threads took from the queue before:
 * once it returns, every grant queued before the call is revoked. Without the lock;
 * before the host hears that blocks are free (get_finished, load errors). */
void kv_revoke_settle(hixl_kv_connector *c);
void kv_revq_free(hixl_kv_connector *c);

/* ---- kv_peer.c: calls to a peer's KV service ---- */

/* A KV service request: op on request id, presenting cap (LAYER: which layer; ABORT: why). */
bool kv_msg(const hixl_kv_connector *c, struct kv_out *o, uint8_t op, const char *id,
            const struct kv_cap *cap, uint32_t layer, const char *reason);
/* Send o (a KV service request; freed here), wait for the answer within timeout_ms. */
int kv_call_msg(hixl_kv_connector *c, const char *remote, struct kv_out *o, uint8_t *ans, size_t cap,
                size_t *n, int32_t timeout_ms, HixlStatus *st);
/* Send o (a PIN, RELEASE or ACCEPT; freed here) again while the peer answers "not yet"
 * (KV_PIN_NOT_YET: it binds the request at its next step), a little apart, until
 * deadline or this connector shuts down (shutdown joins the caller). cleanup (a
 * RELEASE, or the PIN before a FREE: what frees a peer's hold) is asked on after
 * shutdown began, up to notify_timeout_ms past that: else the peer holds until its
 * lease. SUCCESS: the answer (n bytes in ans), "not yet" only once the deadline passed
 * or it shut down; else the status of the call that failed. */
HixlStatus kv_call_settled(hixl_kv_connector *c, const char *remote, struct kv_out *o, uint64_t deadline,
                           uint8_t *ans, size_t cap, size_t *n, bool cleanup);
int kv_call_ex(hixl_kv_connector *c, const char *remote, uint8_t op, const char *id,
               const struct kv_cap *rcap, uint32_t layer, const char *reason, uint8_t *ans, size_t cap,
               size_t *n, int32_t timeout_ms, HixlStatus *st);
int kv_call(hixl_kv_connector *c, const char *remote, uint8_t op, const char *id, const struct kv_cap *rcap,
            uint8_t *ans, size_t cap, size_t *n, int32_t timeout_ms, HixlStatus *st);
HixlStatus kv_link(hixl_kv_connector *c, const struct kv_meta_entry *e, int32_t timeout_ms);
/* Whether a KV service call that ended st was refused as an operation the peer does not
 * know (its plugin is older): UNSUPPORTED, or an older worker's "malformed" (read from
 * the engine's last error, in the thread that waited for the call). */
bool kv_op_unknown(HixlStatus st);
/* Peers that refused an op as unknown (c->load.norenew, c->push.noword): whether peer is
 * among them, and note it (at most KV_UNREACH_MAX, the oldest forgotten); kv_link
 * forgets a peer it links anew. Take c->lock. */
bool kv_peer_older(hixl_kv_connector *c, struct kv_idhash *set, const char *peer);
void kv_peer_older_note(hixl_kv_connector *c, struct kv_idhash *set, const char *peer);
HixlStatus kv_tell(hixl_kv_connector *c, const struct kv_meta_entry *e, uint8_t op, const char *reason,
                   uint8_t *ans, size_t cap, size_t *n);
/* What a peer's PIN or ACCEPT answer says it holds (or expects). */
struct kv_peer_held {
  char layout[KV_LAYOUT_TEXT];
  size_t n; /* blocks, every group's */
  uint64_t digest;
  uint32_t ngroups, gn[KV_MAX_GROUPS];
  uint32_t world;     /* its instance's tensor-parallel size */
  struct kv_remote r; /* its planes (r.planes malloc'ed) */
  bool word;          /* in: the call was an ACCEPT_W (its answer ends with the two below) */
  uint64_t waddr;     /* out: the landed bytes' address (0: none) */
  uint8_t wmark;      /* ... and their mark */
};
/* Parse a HELD answer after its state byte (in): malformed is FAILED, another layout or
 * world sizes that cannot map PARAM_INVALID; why names peer_kind peer and request req. */
HixlStatus kv_held_parse(hixl_kv_connector *c, struct kv_in *in, const char *peer_kind, const char *peer,
                         const char *req, struct kv_peer_held *h, char *why, size_t cap);
HixlStatus kv_layout_mismatch(const char *peer_kind, const char *peer, const char *theirs, const char *mine,
                              const char *me, char *why, size_t cap);
/* What a PIN answer (n bytes at ans, kv_loader.c) says of e's request: HELD (SUCCESS, what
 * it holds into h), GONE (NOT_FOUND), or not bound yet (*again, SUCCESS); why on failure. */
HixlStatus kv_pin_answer(hixl_kv_connector *c, const struct kv_meta_entry *e, const uint8_t *ans, size_t n,
                         struct kv_peer_held *h, bool *again, char *why, size_t cap);
/* What an ACCEPT answer (n bytes at ans, kv_pusher.c) says of push e: SUCCESS when the
 * consumer expects it, as push_counts_ok asks, its planes into h; else why. h->r.planes
 * is the caller's to free either way. */
HixlStatus kv_accept_answer(hixl_kv_connector *c, const struct kv_meta_entry *e, const uint8_t *ans, size_t n,
                            struct kv_peer_held *h, char *why, size_t cap);

/* ---- the landed bytes: kv_word.c ---- */
/* After registration (not under the lock): a push worker allocates its rows (consumer)
 * or its bytes to write from (producer); without them it goes by notices (logged). */
void kv_words_setup(hixl_kv_connector *c);
/* At destroy, the engine still up. */
void kv_words_free(hixl_kv_connector *c);
/* Push consumer, an ACCEPT_W of x by producer rank rank: the address of its row (0:
 * none free, or none here); x->mark[rank] set. Lock held. */
uint64_t kv_word_take(hixl_kv_connector *c, struct kv_expect *x, uint32_t rank);
/* x ends: its rows are free again. Lock held. */
void kv_word_give(hixl_kv_connector *c, struct kv_expect *x);
/* Whether producer rank rank wrote layer's byte of x. Lock held. */
bool kv_word_landed(const hixl_kv_connector *c, const struct kv_expect *x, uint32_t layer, uint32_t rank);
/* Push producer: whether to ask remote for landed bytes (this worker has bytes to write
 * from, and its link to remote copies by CPU: shm). */
bool kv_word_wanted(hixl_kv_connector *c, const char *remote);

/* ---- the threads: kv_loader.c, kv_pusher.c ---- */

/* start_load_kv: the bound loads go to the loader threads, started as needed. Lock held. */
/* A RENEW bound (a pull consumer's request not scheduled yet): the producer ranks this
 * rank renews, queued for the renewer (kv_loader.c). Lock held. */
void kv_renew_bind(hixl_kv_connector *c, const struct kv_meta_entry *e);
hixl_kv_status kv_loader_submit(hixl_kv_connector *c);
void kv_loader_join(hixl_kv_connector *c); /* after shut */
void *kv_pusher_main(void *arg);

/* ---- the ops (kv_life.c, kv_sched.c, kv_worker.c) ---- */

hixl_kv_status kv_create(const char *json, size_t len, int32_t role, uint32_t rank, uint32_t world,
                         hixl_kv_connector **out, char *err, size_t err_cap);
hixl_kv_status kv_destroy(hixl_kv_connector *c);
hixl_kv_status kv_shutdown(hixl_kv_connector *c);
hixl_kv_status kv_new_request(hixl_kv_connector *c, const hixl_kv_request *r);
hixl_kv_status kv_matched(hixl_kv_connector *c, const hixl_kv_request *r, uint64_t computed, int64_t *tokens,
                          int32_t *load_async);
hixl_kv_status kv_after_alloc(hixl_kv_connector *c, const hixl_kv_request *r, const uint64_t *blocks,
                              size_t nblocks, uint64_t external);
hixl_kv_status kv_build_meta(hixl_kv_connector *c, hixl_kv_buffer *meta);
hixl_kv_status kv_finished(hixl_kv_connector *c, const hixl_kv_request *r, const uint64_t *blocks,
                           size_t nblocks, int32_t *delay_free, hixl_kv_buffer *params);
hixl_kv_status kv_update_output(hixl_kv_connector *c, const hixl_kv_ids *sending, const hixl_kv_ids *recving,
                                const hixl_kv_ids *failed);
hixl_kv_status kv_set_handshake(hixl_kv_connector *c, const uint8_t *meta, size_t len);
hixl_kv_status kv_push_params(hixl_kv_connector *c, const char *req_id, size_t len, hixl_kv_buffer *out);
void kv_alloc_free(void *a); /* a struct kv_alloc */
hixl_kv_status kv_register(hixl_kv_connector *c, const hixl_kv_layer *ly, size_t n);
hixl_kv_status kv_alloc_caches(hixl_kv_connector *c, hixl_kv_layer *ly, size_t n);
hixl_kv_status kv_bind(hixl_kv_connector *c, const uint8_t *meta, size_t len);
hixl_kv_status kv_clear(hixl_kv_connector *c);
hixl_kv_status kv_start_load(hixl_kv_connector *c);
hixl_kv_status kv_wait_layer(hixl_kv_connector *c, uint32_t layer);
hixl_kv_status kv_save_layer(hixl_kv_connector *c, uint32_t layer);
hixl_kv_status kv_wait_save(hixl_kv_connector *c);
hixl_kv_status kv_get_finished(hixl_kv_connector *c, const hixl_kv_ids *finished, hixl_kv_ids *sending,
                               hixl_kv_ids *recving);
hixl_kv_status kv_load_errors(hixl_kv_connector *c, hixl_kv_blocks *out);
hixl_kv_status kv_get_handshake(hixl_kv_connector *c, hixl_kv_buffer *meta);
hixl_kv_status kv_stats(hixl_kv_connector *c, hixl_kv_stats *out);
hixl_kv_status kv_stats_ex(hixl_kv_connector *c, hixl_kv_stats_ex *out);
hixl_kv_status kv_register_groups(hixl_kv_connector *c, const hixl_kv_group *g, size_t n);
hixl_kv_status kv_alloc_memory(hixl_kv_connector *c, uint64_t bytes, uintptr_t *base);
hixl_kv_status kv_after_alloc_groups(hixl_kv_connector *c, const hixl_kv_request *r,
                                     const hixl_kv_block_ids *g, size_t n, uint64_t external);
hixl_kv_status kv_finished_groups(hixl_kv_connector *c, const hixl_kv_request *r, const hixl_kv_block_ids *g,
                                  size_t n, int32_t *delay_free, hixl_kv_buffer *params);
hixl_kv_status kv_preemptions(hixl_kv_connector *c, const hixl_kv_ids *ids);
hixl_kv_status kv_event_fd(hixl_kv_connector *c, int32_t *fd);

#endif
