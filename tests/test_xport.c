/* test_xport: engine/xport.h's tables. Every module's table has every slot filled
 * (xport_check passes on each); a table with any one slot emptied is refused with
 * PARAM_INVALID naming the module and that slot; the stubs answer as xport.h says. */
#include "engine/stage.h"
#include "engine/xport.h"
#include "transport/rdma/xport_rdma.h"
#include "transport/shm/xport_shm.h"
#include "transport/tcp/xport_tcp.h"

#include "test_util.h"

#include <CUnit/Basic.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

static const struct xport_ops *const mods[] = {&xport_shm, &xport_rdma, &xport_tcp, &xport_stage};

static void test_every_table_full(void) {
  for (size_t i = 0; i < sizeof(mods) / sizeof(mods[0]); i++) {
    CU_ASSERT_EQUAL(xport_check(mods[i]), HIXL_SUCCESS);
    CU_ASSERT_EQUAL((int)mods[i]->id, (int)i); /* engine_mods[] and Connect's order */
  }
}

/* Empty each slot of a copy of tcp's table in turn: each is refused by name. */
static void test_empty_slot_refused(void) {
  int n = 0;
#define EMPTY_ONE(slot)                                                                                      \
  {                                                                                                          \
    struct xport_ops t = xport_tcp;                                                                          \
    t.slot = NULL;                                                                                           \
    CU_ASSERT_EQUAL(xport_check(&t), HIXL_PARAM_INVALID);                                                    \
    const char *msg = HixlGetLastErrorMessage();                                                             \
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "module tcp"));                                                       \
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "slot " #slot " "));                                                  \
    n++;                                                                                                     \
  }
  XPORT_SLOTS(EMPTY_ONE)
#undef EMPTY_ONE
  CU_ASSERT_EQUAL(n, 41);
  /* The check's own list covers the struct: its size is 41 function pointers past the
   * header fields, so a slot added to xport.h but not to the check fails here. */
  CU_ASSERT_EQUAL(sizeof(struct xport_iface_ops) + sizeof(struct xport_mem_ops) +
                      sizeof(struct xport_link_ops),
                  41 * sizeof(void (*)(void)));
  CU_ASSERT_EQUAL(xport_check(NULL), HIXL_PARAM_INVALID);
  struct xport_ops unnamed = xport_tcp;
  unnamed.name = NULL;
  CU_ASSERT_EQUAL(xport_check(&unnamed), HIXL_PARAM_INVALID);
}

static void test_stubs(void) {
  bool taken = true;
  void *link = &taken;
  CU_ASSERT_EQUAL(xport_no_connect(NULL, -1, 0, "x", NULL, &taken, &link), HIXL_SUCCESS);
  CU_ASSERT_FALSE(taken); /* passes the link on */
  CU_ASSERT_PTR_NULL(link);
  errno = 0;
  CU_ASSERT_EQUAL(xport_no_post_own(NULL, true, NULL, 0, NULL, 0, 0, NULL), -1);
  CU_ASSERT_EQUAL(errno, ENOSYS);
  char err[8] = "x";
  CU_ASSERT_PTR_NULL(xport_no_bounce_reg(NULL, NULL, 0, err, sizeof(err)));
  CU_ASSERT_STRING_EQUAL(err, ""); /* nothing to register with, not an error */
  CU_ASSERT_EQUAL(xport_no_event_fd(NULL), -1);
  CU_ASSERT_EQUAL(xport_no_caps(NULL), 0u);
  CU_ASSERT_FALSE(xport_no_progress(NULL));
  CU_ASSERT_FALSE(xport_no_table_current(NULL));
  CU_ASSERT_FALSE(xport_no_answer(NULL, NULL, NULL));
  CU_ASSERT_EQUAL(xport_no_reg(NULL, NULL), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(xport_no_key(NULL, NULL), 0u);
  HixlStatus st = HIXL_TIMEOUT;
  CU_ASSERT_FALSE(xport_no_copy_now(NULL, HIXL_READ, NULL, 0, NULL, &st, err, sizeof(err)));
  CU_ASSERT_EQUAL(st, HIXL_TIMEOUT);                     /* nothing done, nothing said */
  CU_ASSERT_EQUAL(xport_no_post_tag(NULL, NULL, 1), -1); /* no tags: the call waits for the data's answers */
}

static CU_TestInfo xport_tests[] = {
    {"every module's table is full", test_every_table_full},
    {"an empty slot is refused by name", test_empty_slot_refused},
    {"the stubs", test_stubs},
    CU_TEST_INFO_NULL,
};
static CU_SuiteInfo suites[] = {
    {.pName = "xport", .pTests = xport_tests},
    CU_SUITE_INFO_NULL,
};

int main(void) { return tu_run_suites("test_xport", suites); }
