/* fuzz_kv_service: the plugin's KV service against arbitrary bytes, from both ends.
 *  - as the service: kv_serve (its request parser, then the op) on a pull producer and
 *    a push consumer worker, as the engine's progress thread calls it;
 *  - as its caller: kv_pin_answer (a consumer reads the producer's PIN answer) and
 *    kv_accept_answer (a producer reads the consumer's ACCEPT answer), against a
 *    worker's registered layout and a load's or a push's entry.
 * The first byte picks the target (its low two bits), the rest is the message. The
 * workers are the plugin linked in (hixl_kv_test) on loopback, set up once; worker 0
 * holds request "fz-held", worker 1 expects the push "fz-push" (each made again once
 * an input ended it). With bit 2 of the first byte set, a request's capability bytes
 * are replaced by that request's, so the ops get past the capability check; with bit
 * 3 set, an ACCEPT answer is read as an ACCEPT_W's (the landed bytes' address and
 * mark after it). Invariants abort(); LeakSanitizer (the libFuzzer build) catches what a refused
 * answer leaves allocated.
 *
 * FUZZ_KV_SERVICE_SEEDS=DIR: write one valid message of each op and each answer
 * there first (the committed corpus, tests/fuzz/kv_service_corpus, came from it). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_ext.h"
#include "hixl/hixl_kv_connector.h"
#include "kv_int.h"
#include "test_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
hixl_kv_status hixl_kv_connector_entry(uint32_t abi_major, const hixl_kv_ops **ops, char *err,
                                       size_t err_cap);

#define CHECK(cond)                                                                                          \
  do {                                                                                                       \
    if (!(cond)) {                                                                                           \
      fprintf(stderr, "fuzz_kv_service: %s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);          \
      abort();                                                                                               \
    }                                                                                                        \
  } while (0)

enum { LAYERS = 2, BLOCKS = 8, BLOCK_TOKENS = 4, ELEM = 2, BLOCK_BYTES = BLOCK_TOKENS * 8 * ELEM };

struct worker {
  hixl_kv_connector *sched, *w;
  uint8_t *mem;
  hixl_kv_layer layers[LAYERS];
};

static const hixl_kv_ops *ops;
static struct worker workers[2]; /* 0: pull producer, 1: push consumer */
static const char *const PEER = "fuzz-peer@127.0.0.1:1";
static const char *const HELD = "fz-held", *const PUSH = "fz-push";
static struct kv_cap caps[2]; /* HELD's on worker 0, PUSH's on worker 1 */
enum { NB = 2 };
static const uint64_t live_blocks[NB] = {3, 4};
/* The load (a consumer's: its blocks 5, 6 from the producer's 3, 4) and the push (a
 * producer's: its blocks 4, 5 into the consumer's 3, 4) whose answers are parsed. */
static uint64_t load_blocks[NB] = {5, 6}, push_blocks[NB] = {4, 5}, their_blocks[NB] = {3, 4};
static const struct kv_meta_entry load_e = {.type = KV_META_LOAD,
                                            .req = "req-1",
                                            .remote = "127.0.0.1:2",
                                            .rreq = "req-1",
                                            .rtp = 1,
                                            .blocks = load_blocks,
                                            .nblocks = NB,
                                            .rblocks = their_blocks,
                                            .nrblocks = NB,
                                            .ngroups = 1,
                                            .gn = {NB},
                                            .rgn = {NB}};
static const struct kv_meta_entry push_e = {.type = KV_META_PUSH,
                                            .req = "req-1",
                                            .remote = "127.0.0.1:2",
                                            .rreq = "req-1",
                                            .rtp = 1,
                                            .blocks = push_blocks,
                                            .nblocks = NB,
                                            .rblocks = their_blocks,
                                            .nrblocks = NB,
                                            .ngroups = 1,
                                            .gn = {NB},
                                            .rgn = {NB}};

/* The "cap" of kv_transfer_params (b, freed here) into cap. */
static void params_cap(hixl_kv_buffer *b, struct kv_cap *cap) {
  char *text = strndup((char *)b->data, b->len);
  ops->free_buffer(b);
  const char *h = text ? strstr(text, "\"cap\":\"") : NULL;
  CHECK(h && kv_cap_parse_hex(h + 7, 2 * KV_CAP_LEN, cap));
  free(text);
}

/* One step of x: its scheduler's metadata bound to its worker. */
static void step(struct worker *x) {
  hixl_kv_buffer m = {0};
  CHECK(ops->build_connector_meta(x->sched, &m) == HIXL_KV_SUCCESS);
  CHECK(ops->bind_connector_meta(x->w, m.data, m.len) == HIXL_KV_SUCCESS);
  ops->free_buffer(&m);
  CHECK(ops->start_load_kv(x->w) == HIXL_KV_SUCCESS);
}

/* Drain what the workers finished (an input may have ended a request). */
static void drain(struct worker *x) {
  hixl_kv_ids sent = {0}, recv = {0};
  CHECK(ops->get_finished(x->w, NULL, &sent, &recv) == HIXL_KV_SUCCESS);
  CHECK(ops->update_connector_output(x->sched, &sent, &recv, NULL) == HIXL_KV_SUCCESS);
  ops->free_ids(&sent);
  ops->free_ids(&recv);
  hixl_kv_blocks errs = {0};
  CHECK(ops->get_block_ids_with_load_errors(x->w, &errs) == HIXL_KV_SUCCESS);
  ops->free_buffer(&errs.raw);
}

/* Worker 0 holds HELD, worker 1 expects PUSH: made again when an input ended them. */
static void live(void) {
  hixl_kv_connector *c = workers[0].w;
  pthread_mutex_lock(&c->lock);
  bool held = kv_held_find(c, HELD) != NULL;
  pthread_mutex_unlock(&c->lock);
  if (!held) {
    drain(&workers[0]);
    hixl_kv_request r = {HELD, strlen(HELD), NB * BLOCK_TOKENS, NULL, 0, 0};
    hixl_kv_buffer params = {0};
    int32_t delay = 0;
    /* Refused while the worker has not reported the last one finished: next time. */
    if (ops->request_finished(workers[0].sched, &r, live_blocks, NB, &delay, &params) == HIXL_KV_SUCCESS) {
      params_cap(&params, &caps[0]);
      step(&workers[0]);
    }
  }
  c = workers[1].w;
  pthread_mutex_lock(&c->lock);
  bool expected = kv_expect_find(c, PUSH) != NULL;
  pthread_mutex_unlock(&c->lock);
  if (!expected) {
    drain(&workers[1]);
    const char *want = "{\"do_remote_prefill\": true}";
    hixl_kv_request r = {PUSH, strlen(PUSH), NB * BLOCK_TOKENS, want, strlen(want), 0};
    int64_t tokens = 0;
    int32_t async = 0;
    CHECK(ops->get_num_new_matched_tokens(workers[1].sched, &r, 0, &tokens, &async) == HIXL_KV_SUCCESS);
    CHECK(ops->update_state_after_alloc(workers[1].sched, &r, live_blocks, NB, (uint64_t)tokens) ==
          HIXL_KV_SUCCESS);
    hixl_kv_buffer params = {0};
    CHECK(ops->get_push_params(workers[1].sched, PUSH, strlen(PUSH), &params) == HIXL_KV_SUCCESS);
    params_cap(&params, &caps[1]);
    step(&workers[1]);
  }
}

/* The capability bytes of request msg (proto, op, u16 id length, id, u8 cap length)
 * replaced by cap, where it has them. */
static void cap_patch(uint8_t *msg, size_t len, const struct kv_cap *cap) {
  if (len < 4) return;
  size_t at = 4 + ((size_t)msg[2] << 8 | msg[3]);
  if (at + 1 + KV_CAP_LEN <= len && msg[at] == KV_CAP_LEN) memcpy(msg + at + 1, cap->b, KV_CAP_LEN);
}

static void worker_up(struct worker *x, const char *role, const char *mode) {
  char cfg[512], err[256] = "";
  snprintf(cfg, sizeof(cfg),
           "{\"address\": \"%s:%u\", \"role\": \"%s\", \"mode\": \"%s\", \"Transport\": \"tcp\", "
           "\"lease_ms\": 20000}\n",
           tu_ip(), (unsigned)tu_free_port(), role, mode);
  x->mem = calloc(1, LAYERS * 2 * BLOCKS * BLOCK_BYTES);
  CHECK(x->mem != NULL);
  for (int l = 0; l < LAYERS; l++)
    x->layers[l] = (hixl_kv_layer){"layer",
                                   5,
                                   (uintptr_t)(x->mem + l * 2 * BLOCKS * BLOCK_BYTES),
                                   BLOCKS,
                                   BLOCK_BYTES,
                                   BLOCKS * BLOCK_BYTES,
                                   HIXL_KV_LAYOUT_KV_FIRST,
                                   ELEM,
                                   BLOCK_TOKENS};
  if (ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, &x->sched, err, sizeof(err)) !=
          HIXL_KV_SUCCESS ||
      ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, 0, 1, &x->w, err, sizeof(err)) != HIXL_KV_SUCCESS ||
      ops->register_kv_caches(x->w, x->layers, LAYERS) != HIXL_KV_SUCCESS) {
    fprintf(stderr, "fuzz_kv_service: a %s worker: %s%s\n", role, err, ops->last_error());
    abort();
  }
}

static void teardown(void) {
  for (int i = 0; i < 2; i++) {
    if (workers[i].w) ops->destroy(workers[i].w);
    if (workers[i].sched) ops->destroy(workers[i].sched);
    free(workers[i].mem);
  }
}

static void seed_write(const char *dir, const char *name, uint8_t target, const struct kv_out *o) {
  char path[1024];
  if (!dir) return;
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL && !o->bad);
  fputc(target, f);
  fwrite(o->p, 1, o->len, f);
  fclose(f);
}

/* One valid message of each op, and a HELD and a GONE answer of each side, into dir
 * (NULL: none). */
static void seeds(const char *dir) {
  hixl_kv_connector *c = workers[0].w;
  struct kv_cap cap = {KV_CAP_LEN, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};
  uint32_t gn[1] = {NB};
  static const struct {
    const char *name;
    uint8_t op;
  } v[] = {{"pin", KV_SVC_PIN},         {"free", KV_SVC_FREE},        {"accept", KV_SVC_ACCEPT},
           {"layer", KV_SVC_LAYER},     {"abort", KV_SVC_ABORT},      {"layers", KV_SVC_LAYERS},
           {"release", KV_SVC_RELEASE}, {"accept_w", KV_SVC_ACCEPT_W}};
  for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
    struct kv_out o = {0};
    bool accept = v[i].op == KV_SVC_ACCEPT || v[i].op == KV_SVC_ACCEPT_W;
    bool push = accept || v[i].op == KV_SVC_LAYER || v[i].op == KV_SVC_LAYERS || v[i].op == KV_SVC_ABORT;
    kv_msg(c, &o, v[i].op, push ? PUSH : HELD, &cap, 1, "a reason");
    if (v[i].op == KV_SVC_LAYERS) kv_put_u32(&o, 2);
    if (accept) kv_put_groups(&o, gn, 1);
    if (v[i].op == KV_SVC_PIN || v[i].op == KV_SVC_RELEASE) {
      kv_put_u64(&o, 7);
      kv_put_u64(&o, 1);
    }
    char name[64];
    snprintf(name, sizeof(name), "req-%s", v[i].name);
    seed_write(dir, name, push ? 5 : 4, &o); /* bit 2: with the live request's capability */
    free(o.p);
  }
  for (uint8_t t = 2; t <= 11; t += t == 3 ? 8 : 1) { /* HELD answers, of the blocks the entries name */
    struct kv_out o = {0};
    kv_put_u8(&o, KV_PIN_HELD);
    kv_put_str(&o, c->lay.text, strlen(c->lay.text));
    kv_put_u32(&o, NB);
    kv_put_u64(&o, kv_groups_digest(their_blocks, NB, gn, 1));
    kv_put_groups(&o, gn, 1);
    kv_layout_put_planes(&o, &c->lay);
    if (t == 11) { /* an ACCEPT_W's: the landed bytes' address and mark after it (bit 3) */
      kv_put_u64(&o, 0x10000);
      kv_put_u8(&o, 7);
    }
    seed_write(dir, t == 2 ? "ans-pin-held" : t == 3 ? "ans-accept-held" : "ans-acceptw-held", t, &o);
    struct kv_peer_held h = {.word = t == 11}; /* and they parse */
    char why[512] = "";
    bool again = true;
    HixlStatus st = t == 2 ? kv_pin_answer(workers[1].w, &load_e, o.p, o.len, &h, &again, why, sizeof(why))
                           : kv_accept_answer(workers[0].w, &push_e, o.p, o.len, &h, why, sizeof(why));
    if (st != HIXL_SUCCESS) fprintf(stderr, "fuzz_kv_service: a valid answer: %s\n", why);
    CHECK(st == HIXL_SUCCESS && (t != 2 || !again) && h.waddr == (t == 11 ? 0x10000u : 0) &&
          h.wmark == (t == 11 ? 7 : 0));
    free(h.r.planes);
    free(o.p);
    if (t == 11) continue;
    o = (struct kv_out){0}; /* GONE, and why */
    kv_put_u8(&o, KV_PIN_GONE);
    kv_put_str(&o, "it was freed", 12);
    seed_write(dir, t == 2 ? "ans-pin-gone" : "ans-accept-gone", t, &o);
    free(o.p);
  }
}

static void setup(void) {
  char err[256];
  CHECK(hixl_kv_connector_entry(HIXL_KV_ABI_MAJOR, &ops, err, sizeof(err)) == HIXL_KV_SUCCESS);
  worker_up(&workers[0], "producer", "pull");
  worker_up(&workers[1], "consumer", "push");
  atexit(teardown);
  live();
  seeds(getenv("FUZZ_KV_SERVICE_SEEDS")); /* checks that the valid answers parse, whether written or not */
}

/* A request to worker x (0 or 1); once it holds or expects nothing, the caller is
 * granted nothing there. */
static void serve_one(int x, const uint8_t *req, size_t len) {
  static uint8_t resp[HIXL_CALL_MAX];
  hixl_kv_connector *c = workers[x].w;
  size_t n = (size_t)-1;
  HixlStatus st = kv_serve(c, PEER, req, len, resp, sizeof(resp), &n);
  CHECK(n <= sizeof(resp));
  /* An answer is a state and what follows it; anything else is a refusal's text. */
  if (st == HIXL_SUCCESS && n > 0) CHECK(resp[0] <= KV_PIN_GONE);
  pthread_mutex_lock(&c->lock);
  bool live_here = x == 0 ? kv_held_find(c, HELD) != NULL : kv_expect_find(c, PUSH) != NULL;
  pthread_mutex_unlock(&c->lock);
  size_t granted = 1;
  CHECK(hixl_engine_grant_stats(c->eng, PEER, &granted, NULL) == HIXL_SUCCESS);
  CHECK(live_here || granted == 0);
}

/* A PIN answer (pin) or an ACCEPT answer read by c: what it says, or why not; what it
 * leaves is freed. */
static void answer_one(hixl_kv_connector *c, bool pin, bool word, const uint8_t *ans, size_t len) {
  struct kv_peer_held *h = calloc(1, sizeof(*h));
  if (h) h->word = word; /* an ACCEPT_W's answer */
  char why[512] = "";
  bool again = false;
  CHECK(h != NULL);
  const struct kv_meta_entry *e = pin ? &load_e : &push_e;
  HixlStatus st = pin ? kv_pin_answer(c, e, ans, len, h, &again, why, sizeof(why))
                      : kv_accept_answer(c, e, ans, len, h, why, sizeof(why));
  if (st == HIXL_SUCCESS && !again) { /* HELD, and as the entry asks */
    size_t sum = 0;
    CHECK(h->r.planes != NULL && h->ngroups == c->lay.ng && h->world == e->rtp);
    for (uint32_t g = 0; g < h->ngroups; g++) {
      sum += h->gn[g];
      CHECK(h->gn[g] >= (pin ? e->rgn[g] : e->gn[g]));
      CHECK(h->r.num_blocks[g] > 0 && h->r.num_blocks[g] <= KV_MAX_NUM_BLOCKS);
    }
    CHECK(sum == h->n);
  } else if (st == HIXL_SUCCESS) { /* not yet */
    CHECK(pin && len > 0 && ans[0] == KV_PIN_NOT_YET && h->r.planes == NULL);
  } else {
    CHECK(why[0] != '\0');
  }
  free(h->r.planes);
  free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool up;
  if (!up) {
    setup();
    up = true;
  }
  if (size == 0) return 0;
  uint8_t *copy = malloc(size > 1 ? size - 1 : 1); /* exactly the bytes: the sanitizer sees over-reads */
  CHECK(copy != NULL);
  memcpy(copy, data + 1, size - 1);
  if (data[0] & 4) {
    live();
    cap_patch(copy, size - 1, &caps[data[0] & 1]);
  }
  switch (data[0] & 3) {
  case 0: serve_one(0, copy, size - 1); break;
  case 1: serve_one(1, copy, size - 1); break;
  case 2: answer_one(workers[1].w, true, false, copy, size - 1); break;
  case 3: answer_one(workers[0].w, false, (data[0] & 8) != 0, copy, size - 1); break;
  }
  free(copy);
  return 0;
}
