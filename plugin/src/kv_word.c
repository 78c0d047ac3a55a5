/* kv_word: push over shm, the landed bytes (docs/plugin.md, "Push: the landed bytes").
 *
 * A layer's landed notice (LAYER) is served by the consumer's progress thread and
 * answered to the producer's: two wake-ups per layer, on CPUs the forward passes share.
 * Where the producer's link copies by CPU (shm), the copy has landed when the pusher's
 * call returns, and the consumer's memory is the producer's to write: the producer then
 * writes one byte per layer into a row the consumer gave it (ACCEPT_W), right after the
 * layer's data, and the consumer's forward pass (wait_for_layer_load) reads the byte; one
 * LAYERS notice of every layer still ends the push (its bookkeeping: bytes loaded,
 * grants, finished_recving). Each row has a mark (1 to 255, the next one each time the
 * row is taken), so a byte left in a reused row by its earlier taker (a push that failed
 * gives its row back before its producer is cut) is not taken for this one's; and the
 * free rows are a queue, so a row given back is taken again only after every other free
 * row: one row's mark comes round after 255 x 1,024 takes, not 255. A byte is written
 * whole or not at all: no tearing to guard against.
 * Over tcp or rdma the notice follows the data on the same link already (CALL_AFTER,
 * CALL_TAG), so no rows are asked for there; a producer that asks anyway writes into
 * memory its grants do not cover, and is refused (docs/security.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_ext.h"
#include "kv_int.h"
#include "util/log.h"

void kv_words_setup(hixl_kv_connector *c) {
  if (!c->cfg.push || !c->eng || c->layers == 0) return;
  size_t layers = c->layers;
  void *p = NULL;
  HixlMemHandle h = NULL;
  if (c->cfg.consumer) {
    uint32_t *fr = malloc(KV_WORD_ROWS * sizeof(*fr));
    uint8_t *marks = calloc(KV_WORD_ROWS, sizeof(*marks));
    if (!fr || !marks || HixlEngineAllocMem(c->eng, KV_WORD_ROWS * layers, &p, &h) != HIXL_SUCCESS) {
      log_warn("hixl-kv: no landed bytes for pushes into this worker (%s): every layer waits for its "
               "notice",
               fr && marks ? HixlGetLastErrorMessage() : "out of memory");
      free(fr);
      free(marks);
    } else {
      memset(p, 0, KV_WORD_ROWS * layers);
      for (uint32_t i = 0; i < KV_WORD_ROWS; i++) fr[i] = i; /* row 0 first */
      pthread_mutex_lock(&c->lock);
      c->words.rows = p;
      c->words.rh = h;
      c->words.free_rows = fr;
      c->words.marks = marks;
      c->words.head = 0;
      c->words.nfree = KV_WORD_ROWS;
      pthread_mutex_unlock(&c->lock);
    }
  }
  if (c->cfg.producer) {
    if (HixlEngineAllocMem(c->eng, layers, &p, &h) != HIXL_SUCCESS) {
      log_warn("hixl-kv: no landed bytes for this worker's pushes (%s): every layer sends its notice",
               HixlGetLastErrorMessage());
    } else {
      c->words.src = p; /* before any push: set before the first bind_connector_meta */
      c->words.sh = h;
    }
  }
}

void kv_words_free(hixl_kv_connector *c) {
  if (c->words.rows) HixlEngineFreeMem(c->eng, c->words.rh);
  if (c->words.src) HixlEngineFreeMem(c->eng, c->words.sh);
  free(c->words.free_rows);
  free(c->words.marks);
  memset(&c->words, 0, sizeof(c->words));
}

uint64_t kv_word_take(hixl_kv_connector *c, struct kv_expect *x, uint32_t rank) {
  if (!c->words.rows || rank >= KV_TP_MAX) return 0;
  if (!x->row[rank]) {
    if (c->words.nfree == 0) return 0; /* that rank's layers go by notices */
    uint32_t row = c->words.free_rows[c->words.head];
    c->words.head = (c->words.head + 1) % KV_WORD_ROWS;
    c->words.nfree--;
    memset(c->words.rows + (size_t)row * c->layers, 0, c->layers);
    x->row[rank] = (uint16_t)(row + 1);
    x->wranks |= UINT64_C(1) << rank;
    x->mark[rank] = c->words.marks[row] = (uint8_t)(c->words.marks[row] % 255u + 1u);
  }
  return (uint64_t)(uintptr_t)(c->words.rows + (size_t)(x->row[rank] - 1) * c->layers);
}

void kv_word_give(hixl_kv_connector *c, struct kv_expect *x) {
  for (uint32_t r = 0; x->wranks && r < KV_TP_MAX; r++)
    if (x->row[r]) {
      c->words.free_rows[(c->words.head + c->words.nfree++) % KV_WORD_ROWS] = x->row[r] - 1u;
      x->row[r] = 0;
    }
  x->wranks = 0;
}

bool kv_word_landed(const hixl_kv_connector *c, const struct kv_expect *x, uint32_t layer, uint32_t rank) {
  if (rank >= KV_TP_MAX || !x->row[rank] || layer >= c->layers) return false;
  const uint8_t *b = c->words.rows + (size_t)(x->row[rank] - 1) * c->layers + layer;
  /* The data before it: the copy returned first. */
  return __atomic_load_n(b, __ATOMIC_ACQUIRE) == x->mark[rank];
}

bool kv_word_wanted(hixl_kv_connector *c, const char *remote) {
  struct hixl_link_info li;
  return c->words.src && hixl_engine_link_info(c->eng, remote, &li) == HIXL_SUCCESS &&
         strcmp(li.transport, "shm") == 0;
}
