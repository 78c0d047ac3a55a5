/* test_kv_loader: a pull consumer's loader threads (plugin/src/kv_loader.c) against
 * handle_preemptions, white-box: the plugin linked as hixl_kv_test (its ops table
 * taken from the entry point directly, its test points: KV_TEST_POINT), a producer and
 * a consumer instance in this process.
 *
 * A loader thread that pulls a request PINs the next one of that producer ahead and
 * goes on with it: it takes it off the queue, drops the lock, and runs it. The thread
 * is parked right there (KV_TEST_LOADER_NEXT), that request is preempted, the thread
 * released: no byte of the preempted request's blocks may change, the request ends
 * failed (received, its blocks in the load errors), the one before it landed byte for
 * byte, and the producer holds nothing once both are freed there. */
#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_ext.h"
#include "hixl/hixl_cache.h"
#include "hixl/hixl_kv_connector.h"
#include "kv_host.h"
#include "kv_hung.h"
#include "kv_int.h"
#include "test_util.h"

enum { LAYERS = 2, BLOCKS = 8, NB = 2, BLOCK_TOKENS = 4, ELEM = 2, BLOCK_BYTES = BLOCK_TOKENS * 8 * ELEM };
#define WAIT_MS 10000 /* a step's work ends well within this, or it never will */

/* The plugin's one entry point, here linked in rather than found by dlsym. */
hixl_kv_status hixl_kv_connector_entry(uint32_t abi_major, const hixl_kv_ops **ops, char *err,
                                       size_t err_cap);

static const hixl_kv_ops *ops;

#include "kv_inst.h"

static bool inst_up(struct inst *x, const char *role) {
  return inst_up_with(x, role,
                      "\"mode\": \"pull\", \"lease_ms\": 20000, \"loads_per_producer\": 1, "
                      "\"transfer_timeout_ms\": 5000, \"connect_timeout_ms\": 5000",
                      0xEE);
}

/* Step x until each of the n ids showed in its worker's finished sending (which 0) or
 * receiving (1), each once; false if one did not within WAIT_MS or one showed twice. */
static bool wait_finished(struct inst *x, const char *const *ids, int n, int which) {
  int seen[8] = {0};
  int64_t end = tu_now_ms() + WAIT_MS;
  for (;;) {
    hixl_kv_ids s = {0}, r = {0};
    step(x);
    if (ops->get_finished(x->worker, NULL, &s, &r) != HIXL_KV_SUCCESS) return false;
    const hixl_kv_ids *got = which ? &r : &s;
    for (size_t i = 0; i < got->count; i++)
      for (int k = 0; k < n; k++) seen[k] += strcmp(got->ids[i], ids[k]) == 0;
    ops->free_ids(&s);
    ops->free_ids(&r);
    bool all = true;
    for (int k = 0; k < n; k++) {
      if (seen[k] > 1) {
        tu_fail(__FILE__, __LINE__, "request %s was reported finished %d times", ids[k], seen[k]);
        return false;
      }
      all = all && seen[k] == 1;
    }
    if (all) return true;
    if (tu_now_ms() >= end) return false;
    struct timespec ts = {0, 1000000}; /* polling the host's op, as a host does between steps */
    nanosleep(&ts, NULL);
  }
}

static hixl_kv_request request(const char *id, const char *params) {
  return (hixl_kv_request){id, strlen(id), NB * BLOCK_TOKENS, params, params ? strlen(params) : 0, 0};
}

/* The producer finishes pid with its blocks pb (filled from seed) and holds them; the
 * consumer allocates db for its request id and queues its load from pid (bound at the
 * consumer's next step). */
static void hold_and_load(struct inst *p, struct inst *d, const char *pid, const char *id,
                          const uint64_t pb[NB], const uint64_t db[NB], uint64_t seed) {
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (int b = 0; b < NB; b++) tu_fill(block(p, l, v, pb[b]), BLOCK_BYTES, seed_of(seed, l, v, b));
  hixl_kv_request r = request(pid, NULL);
  hixl_kv_buffer params = {0};
  int32_t delay = 0;
  ST_IS(ops->request_finished(p->sched, &r, pb, NB, &delay, &params), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(delay, 1);
  char *text = strndup((char *)params.data, params.len);
  ops->free_buffer(&params);
  CU_ASSERT_PTR_NOT_NULL_FATAL(text);
  r = request(id, text);
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d->sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  CU_ASSERT(tokens == NB * BLOCK_TOKENS && async == 1);
  ST_IS(ops->update_state_after_alloc(d->sched, &r, db, NB, (uint64_t)tokens), HIXL_KV_SUCCESS);
  free(text);
}

struct preempter {
  struct inst *d;
  const char *id;
  hixl_kv_status st;
};

static void *preempt_main(void *arg) {
  struct preempter *pr = arg;
  const char *ids[1] = {pr->id};
  pr->st = ops->handle_preemptions(pr->d->worker, &(hixl_kv_ids){ids, 1});
  return NULL;
}

/* Two loads of one producer, one loader thread: the second is PINned ahead while the
 * first is pulled; the thread is parked after it took the second, and that one is
 * preempted there. */
static void test_preempt_load_taken_ahead(void) {
  struct inst p, d;
  bool up = inst_up(&p, "producer") && inst_up(&d, "consumer");
  CU_ASSERT_FATAL(up);
  static const uint64_t pa[NB] = {1, 2}, pb[NB] = {3, 4}, da[NB] = {1, 2}, db[NB] = {5, 6};
  const char *a = "ahead-a", *b = "ahead-b";
  hold_and_load(&p, &d, a, a, pa, da, 100);
  hold_and_load(&p, &d, b, b, pb, db, 200);
  step(&p); /* the producer's worker holds both */

  kv_test_point_reset(KV_TEST_LOADER_NEXT);
  kv_test_point_reset(KV_TEST_PREEMPT_WAIT);
  kv_test_park(KV_TEST_LOADER_NEXT, true);
  step(&d); /* one loader thread: a, then b (PINned ahead while a is pulled) */
  bool parked = kv_test_point_wait(KV_TEST_LOADER_NEXT, 1, WAIT_MS);
  CU_ASSERT(parked); /* the thread took b and dropped the lock; it has not run b yet */
  struct preempter pr = {&d, b, HIXL_KV_FAILED};
  pthread_t t;
  bool started = parked && pthread_create(&t, NULL, preempt_main, &pr) == 0;
  CU_ASSERT(!parked || started);
  /* handle_preemptions has taken and marked what it saw of b, and now waits (or, not
   * seeing b, returns): only then does the loader thread go on. */
  if (started) CU_ASSERT(kv_test_point_wait(KV_TEST_PREEMPT_WAIT, 1, WAIT_MS));
  kv_test_park(KV_TEST_LOADER_NEXT, false);
  if (started) {
    pthread_join(t, NULL);
    ST_IS(pr.st, HIXL_KV_SUCCESS);
  }

  /* Both end once on the consumer: a landed, b failed, and no byte of b's blocks moved. */
  const char *both[2] = {a, b};
  CU_ASSERT(wait_finished(&d, both, 2, 1));
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (int k = 0; k < NB; k++) {
        TU_ASSERT_PATTERN(block(&d, l, v, da[k]), BLOCK_BYTES, seed_of(100, l, v, k), "a block of ahead-a");
        CU_ASSERT_EQUAL(tu_check_byte(block(&d, l, v, db[k]), BLOCK_BYTES, 0xEE),
                        -1); /* ahead-b's: untouched */
      }
  CU_ASSERT_EQUAL(tu_check_byte(block(&d, 0, 0, 0), BLOCK_BYTES, 0xEE), -1); /* and one no load names */
  hixl_kv_blocks errs = {0};
  ST_IS(ops->get_block_ids_with_load_errors(d.worker, &errs), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(errs.count, NB);
  for (size_t i = 0; i < errs.count && errs.ids; i++) CU_ASSERT(errs.ids[i] == db[0] || errs.ids[i] == db[1]);
  ops->free_buffer(&errs.raw);
  hixl_kv_stats sd;
  ST_IS(ops->get_stats(d.worker, &sd), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(sd.loads_done, 1);
  CU_ASSERT_EQUAL(sd.loads_failed, 1);
  CU_ASSERT_EQUAL(sd.bytes_loaded, (uint64_t)LAYERS * 2 * NB * BLOCK_BYTES);

  /* The producer was told of both (FREE): it reports both sent and holds nothing. */
  CU_ASSERT(wait_finished(&p, both, 2, 0));
  hixl_kv_stats sp;
  ST_IS(ops->get_stats(p.worker, &sp), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(sp.requests_held, 0);
  CU_ASSERT_EQUAL(sp.blocks_held, 0);
  CU_ASSERT_EQUAL(sp.lease_expired, 0);
  kv_test_park(KV_TEST_LOADER_NEXT, false);
  inst_down(&d);
  inst_down(&p);
}

/* Two loads of one producer, one loader thread: the second (b) is PINned ahead while the
 * first is pulled, and the thread is parked right after it sent that PIN; b is preempted
 * in the queue (a FREE to the producer), then allocated again and loaded under the same
 * id from another of the producer's requests, on other blocks. The PIN sent ahead was answered for the
 * first b (its blocks, held then): the second b must ask its own, and land. */
static void test_stale_pin_ahead(void) {
  struct inst p, d;
  bool up = inst_up(&p, "producer") && inst_up(&d, "consumer");
  CU_ASSERT_FATAL(up);
  static const uint64_t pa[NB] = {1, 2}, pb[NB] = {3, 4}, pb2[NB] = {5, 6};
  static const uint64_t da[NB] = {1, 2}, db[NB] = {5, 6}, db2[NB] = {3, 4};
  const char *a = "stale-a", *b = "stale-b";
  hold_and_load(&p, &d, a, a, pa, da, 100);
  hold_and_load(&p, &d, b, b, pb, db, 200);
  step(&p); /* the producer's worker holds both */

  kv_test_point_reset(KV_TEST_LOADER_AHEAD);
  kv_test_park(KV_TEST_LOADER_AHEAD, true);
  step(&d); /* one loader thread: a, with b's PIN sent ahead */
  bool parked = kv_test_point_wait(KV_TEST_LOADER_AHEAD, 1, WAIT_MS);
  CU_ASSERT(parked);
  const char *ids[1] = {b};
  ST_IS(ops->handle_preemptions(d.worker, &(hixl_kv_ids){ids, 1}), HIXL_KV_SUCCESS); /* b queued: FREEd */
  hold_and_load(&p, &d, "stale-b2", b, pb2, db2, 300); /* b again, from another of P's requests */
  step(&p);
  step(&d); /* the second b queued behind a */
  kv_test_park(KV_TEST_LOADER_AHEAD, false);

  /* a lands; b ends twice: the first failed (preempted), the second landed. */
  int seen_a = 0, seen_b = 0;
  for (int64_t end = tu_now_ms() + WAIT_MS; (seen_a < 1 || seen_b < 2) && tu_now_ms() < end;) {
    hixl_kv_ids sd = {0}, rv = {0};
    step(&d);
    if (ops->get_finished(d.worker, NULL, &sd, &rv) == HIXL_KV_SUCCESS)
      for (size_t i = 0; i < rv.count; i++) {
        seen_a += strcmp(rv.ids[i], a) == 0;
        seen_b += strcmp(rv.ids[i], b) == 0;
      }
    ops->free_ids(&sd);
    ops->free_ids(&rv);
    struct timespec ts = {0, 1000000}; /* polling the host's op, as a host does between steps */
    nanosleep(&ts, NULL);
  }
  CU_ASSERT_EQUAL(seen_a, 1);
  CU_ASSERT_EQUAL(seen_b, 2);
  for (int l = 0; l < LAYERS; l++)
    for (int v = 0; v < 2; v++)
      for (int k = 0; k < NB; k++) {
        TU_ASSERT_PATTERN(block(&d, l, v, da[k]), BLOCK_BYTES, seed_of(100, l, v, k), "a block of stale-a");
        TU_ASSERT_PATTERN(block(&d, l, v, db2[k]), BLOCK_BYTES, seed_of(300, l, v, k), "the second stale-b");
        CU_ASSERT_EQUAL(tu_check_byte(block(&d, l, v, db[k]), BLOCK_BYTES, 0xEE), -1); /* the first b's */
      }
  hixl_kv_stats sd;
  ST_IS(ops->get_stats(d.worker, &sd), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(sd.loads_done, 2);
  CU_ASSERT_EQUAL(sd.loads_failed, 1);
  /* The producer was told of all three of its requests: it holds nothing. */
  const char *all[3] = {a, b, "stale-b2"};
  CU_ASSERT(wait_finished(&p, all, 3, 0));
  hixl_kv_stats sp;
  ST_IS(ops->get_stats(p.worker, &sp), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(sp.requests_held, 0);
  CU_ASSERT_EQUAL(sp.blocks_held, 0);
  kv_test_park(KV_TEST_LOADER_AHEAD, false);
  inst_down(&d);
  inst_down(&p);
}

/* The producer P finishes id with block pb and hands back its params (P's worker binds
 * its hold at P's next step). */
static char *finish_one(struct inst *p, const char *id, uint64_t pb) {
  hixl_kv_request r = request(id, NULL);
  r.num_prompt_tokens = BLOCK_TOKENS;
  hixl_kv_buffer params = {0};
  int32_t delay = 0;
  ST_IS(ops->request_finished(p->sched, &r, &pb, 1, &delay, &params), HIXL_KV_SUCCESS);
  char *text = strndup((char *)params.data, params.len);
  ops->free_buffer(&params);
  return text;
}

/* The consumer d queues id's load from params into its block db. */
static void load_one(struct inst *d, const char *id, const char *params, uint64_t db) {
  hixl_kv_request r = request(id, params);
  r.num_prompt_tokens = BLOCK_TOKENS;
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d->sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  ST_IS(ops->update_state_after_alloc(d->sched, &r, &db, 1, (uint64_t)tokens), HIXL_KV_SUCCESS);
}

/* A producer H that answers every PIN late (1.5 s, "not yet"), with four loads
 * of the consumer pulling from it, beside a healthy producer P (leases of 600 ms): P's
 * L1, held, waits behind P's L0 (one loader thread a producer), which P never binds, so
 * L1 lives on the renewer's PINs until L0 times out. The renewer's round waits for H's
 * PINs a quarter lease, all at once: L1 is renewed in time and loads (before: H's PINs
 * one after another, 1.5 s each; L1's lease ran out and it failed). */
static void test_hung_producer_delays_no_renewal(void) {
  struct inst p, d;
  bool up = inst_up_with(&p, "producer", "\"mode\": \"pull\", \"lease_ms\": 600", 0x11) &&
            inst_up_with(&d, "consumer",
                         "\"mode\": \"pull\", \"lease_ms\": 600, \"loads_per_producer\": 1, "
                         "\"transfer_timeout_ms\": 4000, \"connect_timeout_ms\": 5000",
                         0xEE);
  CU_ASSERT_FATAL(up);
  char params[512];
  struct hung_peer h;
  CU_ASSERT_FATAL(hung_peer_up(&h));
  char *l1 = finish_one(&p, "L1", 1);
  step(&p);                           /* L1 held */
  char *l0 = finish_one(&p, "L0", 2); /* never bound: its PINs answer "not yet" */
  CU_ASSERT_FATAL(l1 && l0);
  for (int i = 0; i < 4; i++) {
    char id[8];
    snprintf(id, sizeof(id), "H%d", i);
    snprintf(params, sizeof(params),
             "{\"do_remote_prefill\": true, \"remote_engine\": \"%s\", \"remote_request_id\": \"%s\", "
             "\"remote_block_ids\": [1], \"remote_num_tokens\": %d, \"tp_size\": 1, "
             "\"cap\": \"00112233445566778899aabbccddeeff\"}",
             h.addr, id, BLOCK_TOKENS);
    load_one(&d, id, params, (uint64_t)(4 + i));
  }
  load_one(&d, "L0", l0, 2);
  load_one(&d, "L1", l1, 3);
  step(&d);
  bool l1_ended = false;
  for (int64_t end = tu_now_ms() + 12000; !l1_ended && tu_now_ms() < end;) {
    hixl_kv_ids sd = {0}, rv = {0};
    if (ops->get_finished(d.worker, NULL, &sd, &rv) == HIXL_KV_SUCCESS)
      for (size_t i = 0; i < rv.count; i++) l1_ended = l1_ended || strcmp(rv.ids[i], "L1") == 0;
    ops->free_ids(&sd);
    ops->free_ids(&rv);
    if (ops->get_finished(p.worker, NULL, &sd, &rv) == HIXL_KV_SUCCESS) { /* P's leases are looked at here */
      ops->free_ids(&sd);
      ops->free_ids(&rv);
    }
    struct timespec ts = {0, 20000000}; /* a host's step, not a synchronization: the lease is tested */
    nanosleep(&ts, NULL);
  }
  CU_ASSERT_TRUE(l1_ended);
  hixl_kv_stats sp;
  ST_IS(ops->get_stats(p.worker, &sp), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(sp.lease_expired, 0);
  CU_ASSERT_EQUAL(tu_check_byte(block(&d, 0, 0, 3), BLOCK_BYTES, 0x11), -1); /* loaded: P's cache is 0x11 */
  free(l1);
  free(l0);
  inst_down(&d);
  inst_down(&p);
  hung_peer_down(&h);
}

/* A pull consumer's request that waits to be scheduled for 2.5 of its producer's leases
 * (600 ms; the consumer stepping as a host does meanwhile) keeps the hold when its host
 * called on_new_request as it arrived: the scheduler's metadata renews it every third
 * of a lease (RENEW: the lease runs again, nothing granted), and its load, bound after,
 * pulls every byte. The same wait without on_new_request loses the hold (its lease
 * expires at the producer) and the load fails with its block in the load errors, as
 * every such load did before. */
static void test_waiting_request_renewed(void) {
  struct inst p, d;
  bool up = inst_up_with(&p, "producer", "\"mode\": \"pull\", \"lease_ms\": 600", 0x11) &&
            inst_up_with(&d, "consumer",
                         "\"mode\": \"pull\", \"lease_ms\": 600, \"transfer_timeout_ms\": 4000, "
                         "\"connect_timeout_ms\": 5000",
                         0xEE);
  CU_ASSERT_FATAL(up);
  for (int renew = 1; renew >= 0; renew--) {
    const char *id = renew ? "waited-renewed" : "waited-not-renewed";
    uint64_t pb = renew ? 1 : 2, db = renew ? 3 : 4;
    char *params = finish_one(&p, id, pb);
    CU_ASSERT_PTR_NOT_NULL_FATAL(params);
    step(&p); /* held: its lease runs from here */
    hixl_kv_request r = request(id, params);
    r.num_prompt_tokens = BLOCK_TOKENS;
    if (renew) ST_IS(ops->on_new_request(d.sched, &r), HIXL_KV_SUCCESS);
    for (int64_t end = tu_now_ms() + 1500; tu_now_ms() < end;) { /* not scheduled yet */
      step(&d); /* the consumer's steps: its metadata carries the renewals */
      hixl_kv_ids sd = {0}, rv = {0};
      if (ops->get_finished(p.worker, NULL, &sd, &rv) == HIXL_KV_SUCCESS) { /* the producer's leases */
        ops->free_ids(&sd);
        ops->free_ids(&rv);
      }
      struct timespec ts = {0, 20000000}; /* a host's step, not a synchronization: the lease is tested */
      nanosleep(&ts, NULL);
    }
    load_one(&d, id, params, db);
    CU_ASSERT(inst_wait_stepped(&d, id, 1, 8000));
    if (renew) {
      hixl_kv_blocks errs = {0};
      ST_IS(ops->get_block_ids_with_load_errors(d.worker, &errs), HIXL_KV_SUCCESS);
      CU_ASSERT_EQUAL(errs.count, 0);
      ops->free_buffer(&errs.raw);
      for (int l = 0; l < LAYERS; l++)
        for (int v = 0; v < 2; v++)
          CU_ASSERT_EQUAL(tu_check_byte(block(&d, l, v, db), BLOCK_BYTES, 0x11), -1); /* P's cache is 0x11 */
    } else {
      inst_assert_unloaded(&d, &db, 1, 0xEE, "a load whose hold expired while it waited");
    }
    free(params);
  }
  hixl_kv_stats sp;
  ST_IS(ops->get_stats(p.worker, &sp), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(sp.lease_expired, 1); /* the one not renewed */
  CU_ASSERT_EQUAL(sp.requests_held, 0);
  pthread_mutex_lock(&p.worker->lock);
  CU_ASSERT(p.worker->hold.renewed >= 3); /* about one a 200 ms of the 1.5 s */
  pthread_mutex_unlock(&p.worker->lock);
  inst_down(&d);
  inst_down(&p);
}

/* A listener on tu_ip() that never accepts: the kernel completes each connection, nobody
 * answers HELLO. Returns its fd (-1 on error) and writes "ip:port" into addr. */
static int mute_listener(char *addr, size_t cap) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t sl = sizeof(sa);
  if (fd < 0 || inet_pton(AF_INET, tu_ip(), &sa.sin_addr) != 1 || bind(fd, (struct sockaddr *)&sa, sl) != 0 ||
      listen(fd, 64) != 0 || getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  tu_addr(addr, cap, ntohs(sa.sin_port));
  return fd;
}

/* The connections waiting at a mute listener, taken (and closed) now. */
static int mute_taken(int fd) {
  int n = 0, c;
  while ((c = accept(fd, NULL, NULL)) >= 0) close(c), n++;
  return n;
}

/* Step d until fd has a connection waiting (or ms pass): whether one came. */
static bool step_until_dialled(struct inst *d, int fd, int ms) {
  for (int64_t end = tu_now_ms() + ms; tu_now_ms() < end;) {
    step(d); /* the consumer's steps carry the renewals */
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, 20) == 1) return true; /* the event itself, not a nap */
  }
  return false;
}

/* Renewals of requests waiting for a producer that cannot be reached: the first one
 * links and fails, and from then no renewal for that producer links again (a dead one
 * costs the renewer one connect_timeout_ms, not one a request): a later request of the
 * same producer is passed over, and the renewer goes on to the next producer. */
static void test_renew_skips_unreachable(void) {
  char dead[TU_ADDR_LEN], next[TU_ADDR_LEN];
  int fx = mute_listener(dead, sizeof(dead)), fy = mute_listener(next, sizeof(next));
  CU_ASSERT_FATAL(fx >= 0 && fy >= 0);
  struct inst d;
  CU_ASSERT_FATAL(inst_up_with(&d, "consumer",
                               "\"mode\": \"pull\", \"lease_ms\": 300, \"connect_timeout_ms\": 300", 0xEE));
  const char *ids[3] = {"unreach-a", "unreach-b", "unreach-c"};
  char params[3][512];
  for (int k = 0; k < 3; k++)
    snprintf(params[k], sizeof(params[k]),
             "{\"do_remote_prefill\": true, \"remote_engine\": \"%s\", \"remote_request_id\": \"%s\", "
             "\"remote_block_ids\": [1], \"hixl_abi\": 1, \"tp_size\": 1, "
             "\"cap\": \"00112233445566778899aabbccddeeff\"}",
             k < 2 ? dead : next, ids[k]);
  hixl_kv_request r = request(ids[0], params[0]);
  r.num_prompt_tokens = BLOCK_TOKENS;
  ST_IS(ops->on_new_request(d.sched, &r), HIXL_KV_SUCCESS);
  CU_ASSERT_FATAL(step_until_dialled(&d, fx, 5000)); /* a's renewal links */
  bool noted = false;
  for (int64_t end = tu_now_ms() + 5000; !noted && tu_now_ms() < end;) { /* ... and fails */
    step(&d);
    pthread_mutex_lock(&d.worker->lock);
    noted = kv_idhash_has(&d.worker->unreach, dead);
    pthread_mutex_unlock(&d.worker->lock);
    struct timespec ts = {0, 10000000}; /* a host's step */
    nanosleep(&ts, NULL);
  }
  CU_ASSERT_FATAL(noted);
  for (int k = 1; k < 3; k++) { /* b (older) then c: b's renewal comes first */
    r = request(ids[k], params[k]);
    r.num_prompt_tokens = BLOCK_TOKENS;
    ST_IS(ops->on_new_request(d.sched, &r), HIXL_KV_SUCCESS);
  }
  CU_ASSERT_TRUE(step_until_dialled(&d, fy, 5000)); /* c's renewal links: b's was before it */
  CU_ASSERT_EQUAL(mute_taken(fx), 1);               /* a's first renewal only */
  close(fx);
  close(fy);
  inst_down(&d);
}

/* RENEWs no_renew_kv refused (its handler runs on the producer's progress thread). */
static atomic_uint renews_refused;

/* The producer's KV service as a plugin from before RENEW answers it: malformed. */
static HixlStatus no_renew_kv(void *ctx, const char *peer, const uint8_t *req, size_t len, uint8_t *resp,
                              size_t cap, size_t *resp_len) {
  if (len >= 2 && req[1] == KV_SVC_RENEW) {
    atomic_fetch_add(&renews_refused, 1);
    int n = snprintf((char *)resp, cap, "malformed KV service request from %s", peer);
    *resp_len = n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
    return HIXL_PARAM_INVALID;
  }
  return kv_serve(ctx, peer, req, len, resp, cap, resp_len);
}

/* A producer whose plugin predates RENEW refuses it as malformed: the consumer says so
 * once, naming the producer, and its request still loads when scheduled in time (as
 * before on_new_request). */
static void test_renew_refused_by_older_producer(void) {
  struct inst p, d;
  bool up = inst_up_with(&p, "producer", "\"mode\": \"pull\", \"lease_ms\": 20000", 0x11) &&
            inst_up_with(&d, "consumer", "\"mode\": \"pull\", \"lease_ms\": 150", 0xEE);
  CU_ASSERT_FATAL(up);
  TU_ASSERT_OK(hixl_engine_set_service(p.worker->eng, HIXL_SERVICE_KV, NULL, NULL));
  TU_ASSERT_OK(hixl_engine_set_service(p.worker->eng, HIXL_SERVICE_KV, no_renew_kv, p.worker));
  tu_log_capture(HIXL_LOG_WARN, true);
  char *params = finish_one(&p, "old-renew", 1);
  CU_ASSERT_PTR_NOT_NULL_FATAL(params);
  step(&p);
  hixl_kv_request r = request("old-renew", params);
  r.num_prompt_tokens = BLOCK_TOKENS;
  tu_log_watch("does not renew a hold");
  ST_IS(ops->on_new_request(d.sched, &r), HIXL_KV_SUCCESS);
  char line[512] = "";
  bool said = false;
  for (int64_t end = tu_now_ms() + 5000; !said && tu_now_ms() < end;) {
    step(&d); /* renewals every 50 ms */
    said = tu_log_seen(line, sizeof(line));
    if (!said) tu_log_watch("does not renew a hold");
    struct timespec ts = {0, 10000000}; /* a host's step */
    nanosleep(&ts, NULL);
  }
  CU_ASSERT_TRUE(said);
  CU_ASSERT_PTR_NOT_NULL(strstr(line, "127.0.0.1:"));
  load_one(&d, "old-renew", params, 3);
  CU_ASSERT(inst_wait_stepped(&d, "old-renew", 1, 8000));
  for (int l = 0; l < LAYERS; l++) CU_ASSERT_EQUAL(tu_check_byte(block(&d, l, 0, 3), BLOCK_BYTES, 0x11), -1);
  HixlSetLogLevel(HIXL_LOG_ERROR);
  TU_ASSERT_OK(hixl_engine_set_service(p.worker->eng, HIXL_SERVICE_KV, NULL, NULL));
  TU_ASSERT_OK(hixl_engine_set_service(p.worker->eng, HIXL_SERVICE_KV, kv_serve, p.worker));
  free(params);
  inst_down(&d);
  inst_down(&p);
}

/* The RENEWs a producer of this build has served. */
static uint64_t renewed(struct inst *p) {
  pthread_mutex_lock(&p->worker->lock);
  uint64_t n = p->worker->hold.renewed;
  pthread_mutex_unlock(&p->worker->lock);
  return n;
}

/* Step d (a host's 10 ms steps) until q has served n RENEWs (its renewals every third of
 * d's lease run in the same rounds as the other producer's): false after 5 s. */
static bool step_until_renewed(struct inst *d, struct inst *q, uint64_t n) {
  for (int64_t end = tu_now_ms() + 5000; renewed(q) < n;) {
    if (tu_now_ms() >= end) return false;
    step(d);
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  return true;
}

/* A producer that refused RENEW as an operation it does not know is not asked again
 * (docs/plugin.md, the op table: "the consumer stops asking them") while another
 * producer's holds are renewed round after round, until it is linked anew (a producer
 * restarted at that address may have been upgraded): then it is asked once more. Before,
 * every round asked it again for every waiting request, each refused. */
static void test_renew_not_asked_again(void) {
  struct inst p, q, d;
  bool up = inst_up_with(&p, "producer", "\"mode\": \"pull\", \"lease_ms\": 20000", 0x11) &&
            inst_up_with(&q, "producer", "\"mode\": \"pull\", \"lease_ms\": 20000", 0x22) &&
            inst_up_with(&d, "consumer", "\"mode\": \"pull\", \"lease_ms\": 150", 0xEE);
  CU_ASSERT_FATAL(up);
  TU_ASSERT_OK(hixl_engine_set_service(p.worker->eng, HIXL_SERVICE_KV, NULL, NULL));
  TU_ASSERT_OK(hixl_engine_set_service(p.worker->eng, HIXL_SERVICE_KV, no_renew_kv, p.worker));
  char *pp = finish_one(&p, "old-p", 1), *qp = finish_one(&q, "new-q", 2);
  CU_ASSERT_PTR_NOT_NULL_FATAL(pp);
  CU_ASSERT_PTR_NOT_NULL_FATAL(qp);
  step(&p);
  step(&q);
  atomic_store(&renews_refused, 0);
  hixl_kv_request r = request("old-p", pp), s = request("new-q", qp);
  r.num_prompt_tokens = s.num_prompt_tokens = BLOCK_TOKENS;
  ST_IS(ops->on_new_request(d.sched, &r), HIXL_KV_SUCCESS);
  ST_IS(ops->on_new_request(d.sched, &s), HIXL_KV_SUCCESS);
  CU_ASSERT_TRUE(step_until_renewed(&d, &q, 6)); /* six rounds for q */
  CU_ASSERT_EQUAL(atomic_load(&renews_refused), 1);
  /* Linked anew: asked once more, and then no more. */
  TU_ASSERT_OK(HixlEngineDisconnect(d.worker->eng, p.worker->cfg.address, 1000));
  uint64_t now = renewed(&q);
  CU_ASSERT_TRUE(step_until_renewed(&d, &q, now + 6));
  CU_ASSERT_EQUAL(atomic_load(&renews_refused), 2);
  HixlSetLogLevel(HIXL_LOG_ERROR);
  TU_ASSERT_OK(hixl_engine_set_service(p.worker->eng, HIXL_SERVICE_KV, NULL, NULL));
  TU_ASSERT_OK(hixl_engine_set_service(p.worker->eng, HIXL_SERVICE_KV, kv_serve, p.worker));
  free(pp);
  free(qp);
  inst_down(&d);
  inst_down(&q);
  inst_down(&p);
}

/* A load whose producer answers its PIN "not yet" (it never binds it), with a
 * transfer_timeout_ms of 30 s: shutdown, once that PIN is being asked again, returns
 * within a few seconds, not when the PIN times out (before: the loader asked on until
 * transfer_timeout_ms and shutdown joined it, 30 s). The load ends failed. */
static void test_shutdown_stops_pin_not_yet(void) {
  struct inst d;
  CU_ASSERT_FATAL(inst_up_with(&d, "consumer",
                               "\"mode\": \"pull\", \"lease_ms\": 20000, \"loads_per_producer\": 1, "
                               "\"transfer_timeout_ms\": 30000, \"connect_timeout_ms\": 5000",
                               0xEE));
  struct hung_peer h;
  CU_ASSERT_FATAL(never_peer_up(&h));
  char params[512];
  snprintf(params, sizeof(params),
           "{\"do_remote_prefill\": true, \"remote_engine\": \"%s\", \"remote_request_id\": \"N0\", "
           "\"remote_block_ids\": [1], \"remote_num_tokens\": %d, \"tp_size\": 1, "
           "\"cap\": \"00112233445566778899aabbccddeeff\"}",
           h.addr, BLOCK_TOKENS);
  load_one(&d, "N0", params, 1);
  step(&d);
  CU_ASSERT_FATAL(hung_peer_asked(&h, 3, WAIT_MS)); /* and asked again */
  int64_t t0 = tu_now_ms();
  ST_IS(ops->shutdown(d.worker), HIXL_KV_SUCCESS);
  int64_t took = tu_now_ms() - t0;
  if (took >= 5000) tu_fail(__FILE__, __LINE__, "shutdown took %lld ms (a PIN asked on)", (long long)took);
  hixl_kv_stats sd;
  ST_IS(ops->get_stats(d.worker, &sd), HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(sd.loads_failed, 1);
  inst_down(&d);
  hung_peer_down(&h);
}

/* ---- a producer rank the consumer reads nothing of (TP; MLA: every rank the same latent) ---- */

enum { LATENT = BLOCK_TOKENS * 576 * ELEM }; /* one block of the latent */

struct mla_side {
  hixl_kv_connector *sched, *w[2];
  uint8_t *mem[2];
  uint32_t world;
};

/* s as role: world ranks of an MLA model, each LAYERS layers of BLOCKS latent blocks
 * filled with 0xEE, rank r on port + r of tu_ip() (held here). */
static bool mla_up(struct mla_side *s, const char *role, uint32_t world) {
  memset(s, 0, sizeof(*s));
  s->world = world;
  uint16_t port = hold_run(tu_ip(), world);
  char cfg[640], err[256] = "";
  snprintf(cfg, sizeof(cfg),
           "{\"address\": \"%s:%u\", \"role\": \"%s\", \"Transport\": \"%s\", \"mode\": \"pull\", "
           "\"lease_ms\": 20000, \"transfer_timeout_ms\": 5000, \"connect_timeout_ms\": 5000, "
           "\"notify_timeout_ms\": 5000}\n",
           tu_ip(), (unsigned)port, role, tu_transport() ? tu_transport() : "auto");
  bool ok = port && ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, world, &s->sched, err,
                                sizeof(err)) == HIXL_KV_SUCCESS;
  for (uint32_t i = 0; i < world && ok; i++) {
    s->mem[i] = malloc((size_t)LAYERS * BLOCKS * LATENT);
    ok = s->mem[i] != NULL;
    if (!ok) break;
    memset(s->mem[i], 0xEE, (size_t)LAYERS * BLOCKS * LATENT);
    hixl_kv_plane planes[LAYERS];
    for (int l = 0; l < LAYERS; l++)
      planes[l] = (hixl_kv_plane){.base = (uintptr_t)(s->mem[i] + (size_t)l * BLOCKS * LATENT),
                                  .block_stride = LATENT,
                                  .block_bytes = LATENT};
    hixl_kv_group g = {.size = sizeof(g),
                       .kind = HIXL_KV_GROUP_MLA,
                       .num_layers = LAYERS,
                       .planes_per_layer = 1,
                       .planes = planes,
                       .num_blocks = BLOCKS,
                       .block_tokens = BLOCK_TOKENS,
                       .elem_size = ELEM,
                       .layout = "mla",
                       .layout_len = 3};
    ok = ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_WORKER, i, world, &s->w[i], err, sizeof(err)) ==
             HIXL_KV_SUCCESS &&
         ops->register_kv_groups(s->w[i], &g, 1) == HIXL_KV_SUCCESS;
  }
  if (!ok) tu_fail(__FILE__, __LINE__, "an MLA %s of %u ranks: %s%s", role, world, err, ops->last_error());
  return ok;
}

static void mla_down(struct mla_side *s) {
  for (uint32_t i = 0; i < s->world; i++) {
    if (s->w[i]) ST_IS(ops->destroy(s->w[i]), HIXL_KV_SUCCESS);
    free(s->mem[i]);
  }
  if (s->sched) ST_IS(ops->destroy(s->sched), HIXL_KV_SUCCESS);
}

/* Rank i of s as an instance of one rank (inst_wait_stepped steps it alone). */
static struct inst mla_rank(const struct mla_side *s, uint32_t i) {
  return (struct inst){.sched = s->sched, .worker = s->w[i], .mem = s->mem[i]};
}

static void *shutdown_main(void *arg) {
  ST_IS(ops->shutdown(arg), HIXL_KV_SUCCESS);
  return NULL;
}

/* MLA, producer TP 2, consumer TP 1: the consumer reads rank 0 and RELEASEs rank 1,
 * which it reads nothing of, once rank 1 holds the request. A host may shut the consumer
 * down as soon as the request's reads ended (vLLM at its end; the mock host), before
 * rank 1 bound its hold: here rank 1 binds it only after the shutdown began, the loader
 * parked where it heard "not yet" then (KV_TEST_SETTLE_SHUT). The RELEASE is asked on
 * (notify_timeout_ms at most), so rank 1 frees the request at once, not at its 20 s
 * lease. Before: shutdown ended the RELEASE at that "not yet", and rank 1 held the
 * blocks until the lease ran out (mock_host_tp_4_1_mla_pull failed so, now and then). */
static void test_release_settled_at_shutdown(void) {
  static const uint64_t pb[NB] = {3, 5}, db[NB] = {1, 6};
  const char *id = "rel-shut";
  struct mla_side p, d;
  bool up = mla_up(&p, "producer", 2) && mla_up(&d, "consumer", 1);
  CU_ASSERT_FATAL(up);
  for (uint32_t i = 0; i < p.world; i++)
    for (int l = 0; l < LAYERS; l++)
      for (int b = 0; b < NB; b++)
        tu_fill(p.mem[i] + ((size_t)l * BLOCKS + pb[b]) * LATENT, LATENT, seed_of(300, l, 0, b));
  hixl_kv_request r = request(id, NULL);
  hixl_kv_buffer params = {0}, m = {0};
  int32_t delay = 0;
  ST_IS(ops->request_finished(p.sched, &r, pb, NB, &delay, &params), HIXL_KV_SUCCESS);
  char *text = strndup((char *)params.data, params.len);
  ops->free_buffer(&params);
  CU_ASSERT_PTR_NOT_NULL_FATAL(text);
  ST_IS(ops->build_connector_meta(p.sched, &m), HIXL_KV_SUCCESS);
  ST_IS(ops->bind_connector_meta(p.w[0], m.data, m.len), HIXL_KV_SUCCESS); /* rank 0 holds it; 1 not yet */
  r = request(id, text);
  int64_t tokens = 0;
  int32_t async = 0;
  ST_IS(ops->get_num_new_matched_tokens(d.sched, &r, 0, &tokens, &async), HIXL_KV_SUCCESS);
  ST_IS(ops->update_state_after_alloc(d.sched, &r, db, NB, (uint64_t)tokens), HIXL_KV_SUCCESS);
  struct inst d0 = mla_rank(&d, 0), p0 = mla_rank(&p, 0), p1 = mla_rank(&p, 1);
  CU_ASSERT_FATAL(inst_wait_stepped(&d0, id, 1, WAIT_MS));
  for (int l = 0; l < LAYERS; l++)
    for (int b = 0; b < NB; b++)
      TU_ASSERT_PATTERN(d.mem[0] + ((size_t)l * BLOCKS + db[b]) * LATENT, LATENT, seed_of(300, l, 0, b),
                        "latent");

  kv_test_point_reset(KV_TEST_SETTLE_SHUT);
  kv_test_park(KV_TEST_SETTLE_SHUT, true);
  pthread_t t;
  CU_ASSERT_FATAL(pthread_create(&t, NULL, shutdown_main, d.w[0]) == 0);
  CU_ASSERT(kv_test_point_wait(KV_TEST_SETTLE_SHUT, 1, WAIT_MS)); /* "not yet" after the shutdown began */
  ST_IS(ops->bind_connector_meta(p.w[1], m.data, m.len), HIXL_KV_SUCCESS); /* rank 1 holds it now */
  kv_test_park(KV_TEST_SETTLE_SHUT, false);
  pthread_join(t, NULL);
  ops->free_buffer(&m);
  CU_ASSERT(inst_wait_stepped(&p0, id, 0, WAIT_MS)); /* well within the 20 s lease */
  CU_ASSERT(inst_wait_stepped(&p1, id, 0, WAIT_MS));
  for (uint32_t i = 0; i < p.world; i++) {
    hixl_kv_stats_ex x = {.size = sizeof(x)};
    ST_IS(ops->get_stats_ex(p.w[i], &x), HIXL_KV_SUCCESS);
    CU_ASSERT(x.blocks_held == 0 && x.lease_expired == 0);
  }
  free(text);
  mla_down(&d);
  mla_down(&p);
}

/* x's step whose bind runs out of memory at its nth allocation of the bind site
 * (KV_ALLOC, KV_TEST_BIND): the bind's status; the injection is off after. */
static hixl_kv_status step_short(struct inst *x, unsigned nth) {
  hixl_kv_buffer m = {0};
  ST_IS(ops->build_connector_meta(x->sched, &m), HIXL_KV_SUCCESS);
  kv_test_fail_nth(KV_TEST_BIND, nth);
  hixl_kv_status st = ops->bind_connector_meta(x->worker, m.data, m.len);
  kv_test_fail_nth(KV_TEST_BIND, 0);
  ops->free_buffer(&m);
  ST_IS(ops->start_load_kv(x->worker), HIXL_KV_SUCCESS);
  return st;
}

/* A bind that runs out of memory: the consumer's LOAD at each of its allocations (the
 * request's, its part's), then the producer's HOLD. Each time the bind says
 * RESOURCE_EXHAUSTED and the request still ends on both sides: the consumer reports it
 * finished receiving with its two blocks in the load errors and none of them written,
 * the producer finished sending (a HOLD refused at once; a hold nobody pulls, when its
 * lease ends), and the producer holds nothing after. Before, the bind returned the
 * error and kept nothing: the host waited for the request for ever. */
static void test_bind_out_of_memory(void) {
  static const uint64_t pb[NB] = {4, 5}, db[NB] = {1, 2};
  struct inst p, d;
  bool up =
      inst_up_with(&p, "producer", "\"mode\": \"pull\", \"lease_ms\": 400", 0x11) && inst_up(&d, "consumer");
  CU_ASSERT_FATAL(up);
  for (unsigned k = 0; k < 3; k++) { /* k 0, 1: the LOAD's first and second allocation; 2: the HOLD's */
    char pid[16], id[16];
    snprintf(pid, sizeof(pid), "oom-p%u", k);
    snprintf(id, sizeof(id), "oom-d%u", k);
    hold_and_load(&p, &d, pid, id, pb, db, 100 + k);
    unsigned failed0 = kv_test_failed(KV_TEST_BIND);
    if (k == 2) {
      CU_ASSERT_EQUAL(step_short(&p, 1), HIXL_KV_RESOURCE_EXHAUSTED);
    } else {
      step(&p);
      CU_ASSERT_EQUAL(step_short(&d, k + 1), HIXL_KV_RESOURCE_EXHAUSTED);
    }
    CU_ASSERT_EQUAL(kv_test_failed(KV_TEST_BIND), failed0 + 1);
    const char *dids[] = {id}, *pids[] = {pid};
    CU_ASSERT_TRUE(wait_finished(&d, dids, 1, 1));
    CU_ASSERT_TRUE(wait_finished(&p, pids, 1, 0));
    inst_assert_unloaded(&d, db, NB, 0xEE, "a block not loaded"); /* 0xEE: as inst_up left it */
    hixl_kv_stats s;
    ST_IS(ops->get_stats(p.worker, &s), HIXL_KV_SUCCESS);
    CU_ASSERT_EQUAL(s.requests_held, 0);
    CU_ASSERT_EQUAL(s.blocks_held, 0);
  }
  inst_down(&d);
  inst_down(&p);
}

int main(void) {
  char err[256] = "";
  if (hixl_kv_connector_entry(HIXL_KV_ABI_MAJOR, &ops, err, sizeof(err)) != HIXL_KV_SUCCESS) {
    fprintf(stderr, "test_kv_loader: %s\n", err);
    return 1;
  }
  CU_TestInfo tests[] = {
      {"a load taken ahead, preempted before it runs: none of its blocks written",
       test_preempt_load_taken_ahead},
      {"a PIN sent ahead for a load preempted in the queue: the same id loaded again asks anew",
       test_stale_pin_ahead},
      {"a producer that answers no PIN delays no other's lease renewal",
       test_hung_producer_delays_no_renewal},
      {"renewals of a producer that cannot be reached: linked once, then passed over",
       test_renew_skips_unreachable},
      {"a request waiting to be scheduled past its producer's lease: renewed since on_new_request, loaded",
       test_waiting_request_renewed},
      {"RENEW refused by a producer from before it: said once, the load unharmed",
       test_renew_refused_by_older_producer},
      {"a producer that refused RENEW is not asked again until it is linked anew",
       test_renew_not_asked_again},
      {"shutdown while a PIN is answered \"not yet\": no wait for transfer_timeout_ms",
       test_shutdown_stops_pin_not_yet},
      {"a RELEASE answered \"not yet\" after shutdown began: asked on, the producer rank frees at once",
       test_release_settled_at_shutdown},
      {"a bind out of memory (the consumer's LOAD, the producer's HOLD): the request still ends",
       test_bind_out_of_memory},
      CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"kv_loader", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_kv_loader", suites);
}
