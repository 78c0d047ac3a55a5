/* thread: names for hixl's threads, so `top -H`, `ps -L`, perf and gdb tell them
 * apart: "hixl-progress" (an engine's progress thread), "hixl-kv-load" (a connector's
 * loader), ... (docs/design.md, "Threads"). Named by the thread that created it, right
 * after pthread_create, so the name is there when the call that started it returns.
 * At most 15 characters (the kernel's limit); where the platform has no names,
 * nothing. */
#ifndef HIXL_THREAD_H
#define HIXL_THREAD_H
#include <pthread.h>

static inline void thread_name(pthread_t t, const char *name) {
#if defined(__linux__) && defined(_GNU_SOURCE)
  (void)pthread_setname_np(t, name);
#else
  (void)t, (void)name;
#endif
}

#endif
