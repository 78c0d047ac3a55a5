/* handles: the tokens the public API gives out for its objects (CS servers, clients and
 * batches, an engine's async requests and memory registrations), and a map from a token
 * back to its object. A token is not the object's address and is given out once in the
 * process's life: a handle kept after its object was freed stays unknown, even when a new
 * object is allocated at the same address (with addresses as handles, a stale handle
 * named the new object). Tokens are odd, so never NULL and never an aligned pointer: a
 * pointer passed where a token belongs is unknown too. (A 64-bit count: it does not wrap
 * in a process's life; where uintptr_t has 32 bits it wraps after 2^31 tokens.) */
#ifndef HIXL_HANDLES_H
#define HIXL_HANDLES_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A new token, never given out before. */
uintptr_t handle_token(void);

struct handle_slot {
  uintptr_t token; /* 0: empty */
  void *obj;
};

struct handles {
  struct handle_slot *slots;
  size_t cap; /* power of two, or 0 */
  size_t count;
};

/* Map a new token to obj (NULL: not yet whole, see handles_set): the token, or 0 (errno ENOMEM) when out of
 * memory. */
uintptr_t handles_add(struct handles *s, void *obj);
/* The object behind token, or NULL when it is not in s. */
void *handles_get(const struct handles *s, uintptr_t token);
/* Map token, which s holds, to obj instead (a handle given out before its object is whole). */
void handles_set(struct handles *s, uintptr_t token, void *obj);
/* Take token out of s: its object, or NULL when it was not in s. */
void *handles_del(struct handles *s, uintptr_t token);
void handles_free(struct handles *s);

#endif
