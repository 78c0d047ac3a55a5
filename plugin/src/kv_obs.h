/* kv_obs: what a connector observes of its hand-offs (ABI 1.5, docs/observability.md):
 * log2 histograms and failure counters (atomics, no lock), a trace per request (its
 * phases' times, bytes, ops, peer, transport, outcome) kept in a table while it runs and
 * moved, once the host heard it finished, to a bounded ring of JSON lines (and the
 * trace_file), and the Prometheus text of all of it.
 *
 * The connector's files mark phases with one call each where they happen; every call
 * is a no-op when the connector observes nothing (metrics false, trace_ring 0, no
 * trace_file: c->obs is NULL). The calls take the table's own mutex, a leaf below
 * c->lock (they may be called with c->lock held), a few times per request, never per op. */
#ifndef HIXL_KV_OBS_H
#define HIXL_KV_OBS_H

#include <stdint.h>

#include "kv_int.h"

/* The histograms a connector keeps. */
enum kv_hist_id {
  KV_H_TRANSFER, /* s: a request's first op posted to its last byte (the mover's side) */
  KV_H_POST,     /* s: building a request's op list and handing it to the engine (push: per range) */
  KV_H_BYTES,    /* bytes of a request moved */
  KV_H_OPS,      /* engine ops of a request moved */
  KV_H_PIN,      /* s: PIN (pull) or ACCEPT (push) round trip, asked again while "not yet" included */
  KV_H_TAIL,     /* s: push producer: the step's last layer saved to its last landed notice answered */
  KV_H_COUNT
};

/* Why a request failed (hixl_kv_failures_total{cause}). */
enum kv_cause {
  KV_CAUSE_TIMEOUT,   /* a transfer or a PIN / ACCEPT ran out of transfer_timeout_ms */
  KV_CAUSE_PEER_GONE, /* the link to the peer failed or was cut */
  KV_CAUSE_LAYOUT,    /* the peer's KV layout or blocks differ */
  KV_CAUSE_LEASE,     /* a lease (pull producer) or an expected push's deadline ran out */
  KV_CAUSE_REFUSED,   /* a KV service call refused for its capability */
  KV_CAUSE_NOT_HELD,  /* the producer no longer held the request (freed, expired, aborted) */
  KV_CAUSE_ABORTED,   /* aborted: by the peer, or preempted */
  KV_CAUSE_OTHER,
  KV_CAUSE_COUNT
};

/* A request's phases, each stamped once (the first time). */
enum kv_phase {
  KV_PH_BOUND,  /* bind_connector_meta: held (pull producer), expected (push consumer), load or push bound */
  KV_PH_PIN,    /* the mover asks: PIN (pull consumer) or ACCEPT (push producer) sent */
  KV_PH_PINNED, /* ... answered (mover), or served (the other side) */
  KV_PH_POSTED, /* first op posted */
  KV_PH_LAST_BYTE, /* pull: the read returned; push: every layer landed (consumer) or answered (producer) */
  KV_PH_FREE,      /* pull: FREE sent (consumer) or served (producer) */
  KV_PH_DONE,      /* the plugin put it in get_finished's lists */
  KV_PH_REPORTED,  /* get_finished handed it to the host */
  KV_PH_COUNT
};

struct kv_obs;

/* The connector's observer from its config (cfg->metrics, trace_ring, trace_file: a
 * worker's, with trace_ring 0 too); NULL in *out when it observes nothing. PARAM_INVALID
 * with why when trace_file cannot be opened or is refused (not a regular file of this
 * user's, only it may write, of one name). */
hixl_kv_status kv_obs_new(const struct kv_cfg *cfg, int32_t role, uint32_t rank, struct kv_obs **out,
                          char *why, size_t cap);
void kv_obs_free(struct kv_obs *o);

/* A histogram sample (lock-free). */
void kv_obs_hist(hixl_kv_connector *c, enum kv_hist_id h, uint64_t v);
/* Request id's phase ph, now (set once; peer, when not NULL, names its peer); returns
 * now (CLOCK_MONOTONIC), for kv_obs_span. BOUND starts the request's trace. */
uint64_t kv_obs_phase(hixl_kv_connector *c, const char *id, enum kv_phase ph, const char *peer);
/* Phase ph now, and histogram h of the time since t0; PINNED (the mover's): also the
 * transport of the link to the trace's peer (no lock may be held: it asks the engine). */
void kv_obs_span(hixl_kv_connector *c, const char *id, enum kv_phase ph, enum kv_hist_id h, uint64_t t0);
/* Layers [layer, layer + count) of id landed now (push). */
void kv_obs_layer(hixl_kv_connector *c, const char *id, uint32_t layer, uint32_t count);
/* id moved bytes in ops more (added up; the histograms take the totals at LAST_BYTE). */
void kv_obs_moved(hixl_kv_connector *c, const char *id, uint64_t bytes, uint64_t ops);
/* id's data (or one part of it) is there, on the side that moved it: LAST_BYTE now (the
 * last part's); the transport of the link to peer, if its pin did not give it and the link
 * is still up (no lock may be held: it asks the engine). */
void kv_obs_landed(hixl_kv_connector *c, const char *id, const char *peer);
/* id failed: counted once per request, under the cause set first (kv_obs_cause_set) or this one. */
void kv_obs_failed(hixl_kv_connector *c, const char *id, enum kv_cause cause, const char *why);
/* The cause id's failure will be counted under, when it comes. */
void kv_obs_cause_set(hixl_kv_connector *c, const char *id, enum kv_cause cause);
/* A failure that belongs to no request of this connector (a refused call). */
void kv_obs_count(hixl_kv_connector *c, enum kv_cause cause);
/* A load or an expected push that ends before it began (refused, out of memory): counted
 * under cause, its blocks to the load errors, finished receiving. Lock held. */
void kv_recv_refused(hixl_kv_connector *c, const struct kv_meta_entry *e, enum kv_cause cause);
/* The cause a failed status (and its reason) stands for. */
enum kv_cause kv_obs_cause(HixlStatus st, const char *why);
/* get_finished handed these to the host: their traces end (to the ring and the file); a
 * request this side moved whole (POSTED to LAST_BYTE, not failed) goes into the TRANSFER,
 * BYTES and OPS histograms, once. No lock may be held. */
void kv_obs_reported(hixl_kv_connector *c, const hixl_kv_ids *ids);

/* The ops (ABI 1.5). */
hixl_kv_status kv_render_metrics(hixl_kv_connector *c, hixl_kv_buffer *text);
hixl_kv_status kv_drain_traces(hixl_kv_connector *c, hixl_kv_buffer *lines);

#endif
