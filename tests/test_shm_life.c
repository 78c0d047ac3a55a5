/* test_shm_life: the shm target's life word (core/src/transport/shm/shm_life.c), how
 * an initiator tells that a same-host target is still there without a syscall:
 *  - a child process starts the word's thread on a sealed page: the word holds the id
 *    of the child's thread named hixl-shm-life, and the initiator's check reads it
 *    alive; a reader of the page cannot map it writable (F_SEAL_FUTURE_WRITE);
 *  - the child killed (SIGKILL) and reaped: the kernel set FUTEX_OWNER_DIED, and the
 *    check says gone with no pidfd to ask;
 *  - in this process, started then stopped (Finalize's path): the word back to 0, and
 *    the check asks the pidfd instead (this very process: alive);
 *  - a page without F_SEAL_FUTURE_WRITE gets no thread and its word stays 0.
 * On a live link the word is what hixl_link_info's peer_life shows (test_shm_map). */
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "transport/shm/shm_int.h"
#include "test_util.h"

/* A target's page as eshm_open makes it: mapped writable, then sealed (future writes
 * too where sealed is true). */
static bool page_up(struct eshm_engine *x, bool sealed) {
  memset(x, 0, sizeof(*x));
  x->gen_fd = memfd_create("test-life", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (x->gen_fd < 0 || ftruncate(x->gen_fd, ESHM_GEN_LEN) != 0) return false;
  void *p = mmap(NULL, ESHM_GEN_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, x->gen_fd, 0);
  if (p == MAP_FAILED) return false;
  x->gen = p;
  int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | (sealed ? F_SEAL_FUTURE_WRITE : 0);
  x->gen_sealed = fcntl(x->gen_fd, F_ADD_SEALS, seals) == 0 && sealed;
  return true;
}

static void page_down(struct eshm_engine *x) {
  if (x->gen) munmap(x->gen, ESHM_GEN_LEN);
  if (x->gen_fd >= 0) close(x->gen_fd);
}

static uint32_t word_of(const struct eshm_engine *x) {
  return __atomic_load_n((const uint32_t *)((const char *)x->gen + ESHM_LIFE_OFF), __ATOMIC_ACQUIRE);
}

/* The child: the word's thread started, its answer (1 or 0) on ready_fd, then it waits. */
static int life_child(void *arg, int ready_fd, int ctl_fd) {
  char ok = eshm_life_start(arg) ? 1 : 0, b;
  if (write(ready_fd, &ok, 1) != 1) return 2;
  while (read(ctl_fd, &b, 1) > 0) {
  }
  return 0;
}

static void test_child_killed(void) {
  struct eshm_engine x;
  tu_child c = {0};
  char ok = 0, path[64], comm[32] = "";
  if (!page_up(&x, true)) {
    CU_FAIL("cannot make the page");
    return;
  }
  if (!x.gen_sealed) { /* a kernel before 5.1 */
    printf("  [skipped: no F_SEAL_FUTURE_WRITE here]\n");
    page_down(&x);
    CU_PASS("skipped");
    return;
  }
  CU_ASSERT_FATAL(tu_child_start(&c, life_child, &x) == 0);
  CU_ASSERT_FATAL(tu_child_read(&c, &ok, 1, 10000) == 0);
  CU_ASSERT_EQUAL(ok, 1);
  /* What an initiator maps: the page read-only; it cannot make it writable. */
  void *ro = mmap(NULL, ESHM_GEN_LEN, PROT_READ, MAP_SHARED, x.gen_fd, 0);
  CU_ASSERT_FATAL(ro != MAP_FAILED);
  CU_ASSERT(mmap(NULL, ESHM_GEN_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, x.gen_fd, 0) == MAP_FAILED);
  CU_ASSERT(mprotect(ro, ESHM_GEN_LEN, PROT_READ | PROT_WRITE) != 0);
  struct shm_peer s = {.pidfd = -1, .life = (const uint32_t *)((const char *)ro + ESHM_LIFE_OFF)};
  uint32_t w = word_of(&x);
  CU_ASSERT((w & FUTEX_OWNER_DIED) == 0);
  CU_ASSERT_FALSE(eshm_peer_gone(&s));
  snprintf(path, sizeof(path), "/proc/%d/task/%u/comm", (int)c.pid, w & FUTEX_TID_MASK);
  FILE *f = fopen(path, "r");
  CU_ASSERT_PTR_NOT_NULL(f);
  if (f) {
    CU_ASSERT_PTR_NOT_NULL(fgets(comm, sizeof(comm), f));
    fclose(f);
  }
  CU_ASSERT_STRING_EQUAL(comm, "hixl-shm-life\n");
  tu_child_kill(&c, SIGKILL);
  tu_child_wait(&c, 10000); /* reaped: its threads' robust lists were walked before */
  w = word_of(&x);
  printf("  [the word after the kill: 0x%08x]\n", w);
  CU_ASSERT((w & FUTEX_OWNER_DIED) != 0);
  CU_ASSERT(eshm_peer_gone(&s));
  munmap(ro, ESHM_GEN_LEN);
  page_down(&x);
}

static void test_stopped_here(void) {
  struct eshm_engine x;
  char path[64];
  if (!page_up(&x, true) || !x.gen_sealed) {
    page_down(&x);
    CU_PASS("skipped: no F_SEAL_FUTURE_WRITE here");
    return;
  }
  CU_ASSERT_TRUE(eshm_life_start(&x));
  CU_ASSERT_TRUE(eshm_life_start(&x)); /* the second peer: the same thread */
  uint32_t w = word_of(&x);
  snprintf(path, sizeof(path), "/proc/self/task/%u", w & FUTEX_TID_MASK);
  CU_ASSERT(w != 0 && (w & FUTEX_OWNER_DIED) == 0);
  CU_ASSERT_EQUAL(access(path, F_OK), 0);
  struct shm_peer s = {.pidfd = cma_pidfd_open((uint32_t)getpid()),
                       .life = (const uint32_t *)((const char *)x.gen + ESHM_LIFE_OFF)};
  CU_ASSERT_FALSE(eshm_peer_gone(&s));
  eshm_life_stop(&x);
  CU_ASSERT_PTR_NULL(x.life);
  CU_ASSERT_EQUAL(word_of(&x), 0);     /* not OWNER_DIED: the engine ended, not the process */
  CU_ASSERT_FALSE(eshm_peer_gone(&s)); /* the pidfd's answer */
  if (s.pidfd >= 0) close(s.pidfd);
  page_down(&x);
}

static void test_unsealed(void) {
  struct eshm_engine x;
  CU_ASSERT_FATAL(page_up(&x, false));
  CU_ASSERT_FALSE(x.gen_sealed);
  CU_ASSERT_FALSE(eshm_life_start(&x));
  CU_ASSERT_PTR_NULL(x.life);
  CU_ASSERT_EQUAL(word_of(&x), 0);
  eshm_life_stop(&x); /* nothing to stop */
  page_down(&x);
}

int main(void) {
  static CU_TestInfo tests[] = {
      {"killed child: its word says OWNER_DIED", test_child_killed},
      {"stopped here: word 0, the pidfd asked", test_stopped_here},
      {"unsealed page: no word", test_unsealed},
      CU_TEST_INFO_NULL,
  };
  CU_SuiteInfo suites[] = {{"shm life word", NULL, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
  return tu_run_suites("test_shm_life", suites);
}
