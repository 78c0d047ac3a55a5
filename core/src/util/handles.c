/* handles: linear probing with backward-shift deletion (no tombstones). */
#include "util/handles.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

static atomic_uint_fast64_t next_token;

uintptr_t handle_token(void) { return (uintptr_t)((atomic_fetch_add(&next_token, 1) + 1) << 1 | 1u); }

static size_t slot_of(const struct handles *s, uintptr_t token) {
  uint64_t x = token;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)x & (s->cap - 1);
}

static void put(struct handles *s, uintptr_t token, void *obj) {
  size_t i = slot_of(s, token);
  while (s->slots[i].token) i = (i + 1) & (s->cap - 1);
  s->slots[i] = (struct handle_slot){token, obj};
  s->count++;
}

static int grow(struct handles *s) {
  size_t cap = s->cap ? s->cap * 2 : 64;
  struct handles n = {calloc(cap, sizeof(*n.slots)), cap, 0};
  if (!n.slots) return -1;
  for (size_t i = 0; i < s->cap; i++)
    if (s->slots[i].token) put(&n, s->slots[i].token, s->slots[i].obj);
  free(s->slots);
  *s = n;
  return 0;
}

uintptr_t handles_add(struct handles *s, void *obj) {
  if ((s->count + 1) * 2 > s->cap && grow(s) < 0) {
    errno = ENOMEM;
    return 0;
  }
  uintptr_t token = handle_token();
  put(s, token, obj);
  return token;
}

static size_t find(const struct handles *s, uintptr_t token) {
  if (!s->cap || !token) return SIZE_MAX;
  for (size_t i = slot_of(s, token); s->slots[i].token; i = (i + 1) & (s->cap - 1))
    if (s->slots[i].token == token) return i;
  return SIZE_MAX;
}

void *handles_get(const struct handles *s, uintptr_t token) {
  size_t i = find(s, token);
  return i == SIZE_MAX ? NULL : s->slots[i].obj;
}

void handles_set(struct handles *s, uintptr_t token, void *obj) {
  size_t i = find(s, token);
  if (i != SIZE_MAX) s->slots[i].obj = obj;
}

void *handles_del(struct handles *s, uintptr_t token) {
  size_t i = find(s, token);
  if (i == SIZE_MAX) return NULL;
  void *obj = s->slots[i].obj;
  s->slots[i] = (struct handle_slot){0, NULL};
  s->count--;
  /* Pull later entries of the probe run back over the hole. */
  for (size_t j = (i + 1) & (s->cap - 1); s->slots[j].token; j = (j + 1) & (s->cap - 1)) {
    size_t home = slot_of(s, s->slots[j].token);
    if (((j - home) & (s->cap - 1)) >= ((j - i) & (s->cap - 1))) {
      s->slots[i] = s->slots[j];
      s->slots[j] = (struct handle_slot){0, NULL};
      i = j;
    }
  }
  return obj;
}

void handles_free(struct handles *s) {
  free(s->slots);
  s->slots = NULL;
  s->cap = s->count = 0;
}
