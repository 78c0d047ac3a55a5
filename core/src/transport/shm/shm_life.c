/* shm_life: whether a same-host target process is still there, read from memory.
 *
 * An initiator checks after every run of copies that the target is alive: a memcpy
 * into a dead target's mapped pages succeeds with nobody to read them, and a pid in
 * process_vm_* may by then name another process. A poll of the target's pidfd was a
 * syscall per run of copies, a third of a 4 KiB op's time.
 *
 * Instead the target keeps a robust futex word in its withdrawal page (offset
 * ESHM_LIFE_OFF), which every mapping initiator already maps read-only: a thread of
 * the target ("hixl-shm-life", started when the first peer maps) registers the word
 * on its own robust list (set_robust_list) and stores its thread id in it. When that
 * thread ends, the process's death included, the kernel sets FUTEX_OWNER_DIED in the
 * word before the pid can be waited for or reused, and so before the pidfd would
 * have said so. The initiator reads the word: its thread id, alive; FUTEX_OWNER_DIED,
 * gone; 0 (no thread, or its engine ended), the pidfd as before. The page is sealed
 * against writes by anyone but the target (F_SEAL_FUTURE_WRITE), so another peer
 * cannot make a dead target look alive; an initiator that finds the seal missing
 * ignores the word. The target itself can: it writes the word, and may die leaving
 * it "alive". Its mapped pages are harmless then, but a pid is not, so copies by
 * process_vm_* ask the pidfd as well (shm_copy.c, at most once per coarse clock tick).
 * The thread replaces only its own robust list, which glibc keeps for robust
 * mutexes that this thread never takes. */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "transport/shm/shm_int.h"
#include "util/log.h"
#include "util/thread.h"

struct eshm_life {
  pthread_t t;
  pid_t pid;                    /* the process that started it (a forked child has no such thread) */
  int stop[2];                  /* a pipe: closing its write end ends the thread */
  sem_t ready;                  /* posted once the word holds the thread id, or could not */
  bool ok;                      /* the list is registered and the word set */
  uint32_t *word;               /* in the page */
  struct robust_list_head head; /* the thread's robust list ... */
  struct robust_list ent;       /* ... of one entry, the word at head.futex_offset from it */
};

static void *life_main(void *arg) {
  struct eshm_life *L = arg;
  L->ent.next = &L->head.list;
  L->head.list.next = &L->ent;
  L->head.futex_offset = (long)((char *)L->word - (char *)&L->ent);
  L->head.list_op_pending = NULL;
  L->ok = syscall(SYS_set_robust_list, &L->head, sizeof(L->head)) == 0;
  if (L->ok) __atomic_store_n(L->word, (uint32_t)syscall(SYS_gettid) & FUTEX_TID_MASK, __ATOMIC_RELEASE);
  sem_post(&L->ready);
  char b;
  while (read(L->stop[0], &b, 1) < 0 && errno == EINTR) {
  }
  return NULL;
}

bool eshm_life_start(struct eshm_engine *x) {
  if (x->life) return x->life->ok;
  if (!x->gen || !x->gen_sealed) return false;
  struct eshm_life *L = calloc(1, sizeof(*L));
  if (!L) return false;
  L->word = (uint32_t *)((char *)x->gen + ESHM_LIFE_OFF);
  L->pid = getpid();
  if (pipe2(L->stop, O_CLOEXEC) != 0) {
    free(L);
    return false;
  }
  sem_init(&L->ready, 0, 0);
  int err = pthread_create(&L->t, NULL, life_main, L);
  if (err != 0) {
    log_warn("shm: no life word for same-host peers (pthread_create: %s); they poll this process's pidfd",
             strerror(err));
    close(L->stop[0]);
    close(L->stop[1]);
    sem_destroy(&L->ready);
    free(L);
    return false;
  }
  thread_name(L->t, "hixl-shm-life");
  while (sem_wait(&L->ready) != 0 && errno == EINTR) {
  }
  if (!L->ok)
    log_warn("shm: no life word for same-host peers (set_robust_list refused); they poll the pidfd");
  x->life = L;
  return L->ok;
}

void eshm_life_stop(struct eshm_engine *x) {
  struct eshm_life *L = x->life;
  if (!L) return;
  if (L->pid == getpid()) {
    /* 0, not FUTEX_OWNER_DIED: a live process whose engine ended is told by its link */
    __atomic_store_n(L->word, 0u, __ATOMIC_RELEASE);
    close(L->stop[1]);
    pthread_join(L->t, NULL); /* the kernel leaves the word: it no longer holds this id */
    sem_destroy(&L->ready);
    close(L->stop[0]);
    free(L);
  }
  x->life = NULL;
}

bool eshm_peer_gone(const struct shm_peer *s) {
  uint32_t v = s->life ? __atomic_load_n(s->life, __ATOMIC_ACQUIRE) : 0;
  if (v != 0) return (v & FUTEX_OWNER_DIED) != 0;
  return cma_pid_exited(s->pidfd);
}
