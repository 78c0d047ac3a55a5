/* kv_int: the connector's state, shared by its files (never installed). */
#ifndef HIXL_KV_INT_H
#define HIXL_KV_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "hixl/hixl.h"
#include "hixl/hixl_kv_connector.h"
#include "kv_wire.h"

/* What the plugin reads of its configuration (config/, the JSON document). */
struct kv_cfg {
  char address[64];  /* "ip:port" of rank 0's engine; rank r listens on port + r */
  bool producer;     /* role producer or both */
  bool consumer;     /* role consumer or both */
  bool push;         /* mode push (else pull) */
  uint32_t lease_ms; /* a held request is freed when no consumer took it by then */
  bool recompute;    /* load_failure_policy recompute (else fail) */
  uint32_t max_inflight;
  bool pipelining;
  int32_t connect_timeout_ms, transfer_timeout_ms, notify_timeout_ms;
  HixlOption *opts; /* engine options, every one with its effective value */
  size_t nopts;
  void *opts_owner; /* the HixlConfig they belong to: kv_config_free */
};
hixl_kv_status kv_config_load(const char *json, size_t len, struct kv_cfg *cfg, char *err, size_t cap);
void kv_config_free(struct kv_cfg *cfg);

/* A request a producer worker holds for a consumer. */
struct kv_held {
  char id[KV_MAX_ID + 1];
  uint64_t *blocks;
  size_t n;
  uint64_t expires_ns;
  char consumer[80]; /* the engine that pinned it last (it may be reading the blocks), or "" */
  struct kv_held *next;
};

/* A load a consumer worker owes. */
struct kv_load {
  struct kv_meta_entry e; /* owns its block lists */
  struct kv_load *next;
};

/* Push mode, consumer worker: a request a producer will write into blocks. */
struct kv_expect {
  char id[KV_MAX_ID + 1];
  uint64_t *blocks;
  size_t n;
  uint8_t *landed; /* per layer */
  uint32_t nlanded;
  uint64_t deadline_ns; /* no producer finished by then: the load fails */
  uint64_t step;        /* the step that bound it: its wait_for_layer_load waits for it */
  char producer[80];    /* the engine that accepted it (it may write into blocks) */
  struct kv_expect *next;
};

/* Push mode, producer worker: a request to write into a consumer's blocks. */
struct kv_push {
  struct kv_meta_entry e; /* owns its block lists */
  uint64_t step;          /* the step whose save_kv_layer calls release its layers */
  uint64_t bound_ns;
  struct kv_push *next;
};

/* Push mode, consumer scheduler: blocks allocated for a request, for get_push_params. */
struct kv_alloc {
  char id[KV_MAX_ID + 1];
  uint64_t *blocks;
  size_t n;
  struct kv_alloc *next;
};

/* A list of request ids, growing. */
struct kv_idset {
  char **v;
  size_t n, cap;
};

struct hixl_kv_connector {
  int32_t role;
  uint32_t rank, world;
  struct kv_cfg cfg;
  pthread_mutex_t lock;  /* a leaf: never held across a hixl call */
  pthread_cond_t cond;   /* loads or pushes queued, or shut (loader, pusher; CLOCK_MONOTONIC) */
  pthread_cond_t saved;  /* push producer: a layer was saved (the pusher waits; CLOCK_MONOTONIC) */
  pthread_cond_t landed; /* push consumer: a layer landed or an expected push ended (the forward
                          * pass waits in wait_for_layer_load; CLOCK_MONOTONIC) */
  bool shut;

  /* scheduler */
  struct kv_out meta; /* entries for the next build_connector_meta */
  uint32_t meta_count;
  struct kv_idset failed;  /* consumer: requests whose load failed (recompute: 0 tokens) */
  struct kv_alloc *allocs; /* push consumer: for get_push_params */
  struct kv_idset pushing; /* push producer: requests whose blocks stay until pushed */
  struct kv_idset holding; /* pull producer: requests held for a consumer, until finished_sending */
  uint64_t not_held;       /* pull producer: finished requests refused at max_inflight_requests */

  /* worker */
  HixlEngine *eng;
  HixlCacheManager *mgr;
  char engine_addr[64];
  uint64_t cluster;
  uint64_t cache_id; /* 0 until register_kv_caches */
  uint32_t layers, tensors_per_layer;
  char layout_text[256]; /* the compatibility digest, as text */
  struct kv_held *held;  /* producer */
  struct kv_idset gone;  /* producer: ids freed or expired lately (PIN answers GONE) */
  struct kv_idset sending_done;
  struct kv_load *loads, *loads_tail; /* consumer: bound, not yet started */
  struct kv_load *queue, *queue_tail; /* started, for the loader */
  uint32_t loading;
  struct kv_idset recving_done;
  struct kv_idset unreach; /* worker: peers the last Link to failed (kv_tell links again only to others) */
  struct kv_idset drop;    /* peers to cut before reporting: producers whose expected push expired, consumers
                              that pinned a request whose lease expired */
  uint64_t *err_blocks;
  size_t nerr, caperr;
  int efd; /* get_event_fd's eventfd, made at its first call; -1 until then */
  bool loader_on;
  pthread_t loader;
  /* push mode */
  uint64_t step;        /* binds so far: each step binds once */
  uint64_t *saved_step; /* per layer: the step of its last save_kv_layer */
  struct kv_push *pushes, *pushes_tail;
  struct kv_expect *expects;
  bool pusher_on;
  pthread_t pusher;
  hixl_kv_stats stats;
};

/* Status with the reason kept for last_error (per thread). */
hixl_kv_status kv_fail(hixl_kv_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
