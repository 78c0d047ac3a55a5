/* test_plugin_jsonc: the plugin calls its own json-c, never a host's that is in the global scope. */

#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "hixl/hixl_kv_connector.h"
#include "kv_host.h"

#ifndef HIXL_KV_PLUGIN_PATH
#define HIXL_KV_PLUGIN_PATH "libhixl_kv_connector.so"
#endif

/* ---- the host's json-c: exported (ENABLE_EXPORTS), every call counted and failing ---- */

#define HOST_EXPORT __attribute__((visibility("default")))

struct json_tokener;
struct json_object;

static unsigned n_tokener_new_ex, n_tokener_new, n_parse_ex, n_new_object, n_new_array, n_to_string;

HOST_EXPORT struct json_tokener *json_tokener_new_ex(int depth);
HOST_EXPORT struct json_tokener *json_tokener_new(void);
HOST_EXPORT struct json_object *json_tokener_parse_ex(struct json_tokener *tok, const char *str, int len);
HOST_EXPORT struct json_object *json_object_new_object(void);
HOST_EXPORT struct json_object *json_object_new_array(void);
HOST_EXPORT const char *json_object_to_json_string_ext(struct json_object *o, int flags);

struct json_tokener *json_tokener_new_ex(int depth) {
  (void)depth;
  n_tokener_new_ex++;
  return NULL;
}

struct json_tokener *json_tokener_new(void) {
  n_tokener_new++;
  return NULL;
}

struct json_object *json_tokener_parse_ex(struct json_tokener *tok, const char *str, int len) {
  (void)tok, (void)str, (void)len;
  n_parse_ex++;
  return NULL;
}

struct json_object *json_object_new_object(void) {
  n_new_object++;
  return NULL;
}

struct json_object *json_object_new_array(void) {
  n_new_array++;
  return NULL;
}

const char *json_object_to_json_string_ext(struct json_object *o, int flags) {
  (void)o, (void)flags;
  n_to_string++;
  return NULL;
}

static void check_no_poison(void) {
  CU_ASSERT_EQUAL(n_tokener_new_ex, 0);
  CU_ASSERT_EQUAL(n_tokener_new, 0);
  CU_ASSERT_EQUAL(n_parse_ex, 0);
  CU_ASSERT_EQUAL(n_new_object, 0);
  CU_ASSERT_EQUAL(n_new_array, 0);
  CU_ASSERT_EQUAL(n_to_string, 0);
}

/* ---- the plugin ---- */

static void *so;
static const hixl_kv_ops *ops;
static char producer_params[1024]; /* the producer's kv_transfer_params, for the consumer */

static hixl_kv_status create(const char *role, hixl_kv_connector **c) {
  char cfg[512], err[256] = "";
  snprintf(
      cfg, sizeof(cfg),
      "{\"address\": \"127.0.0.1:7700\", \"role\": \"%s\", \"mode\": \"pull\", \"lease_ms\": 30000,\n"
      " \"load_failure_policy\": \"fail\", \"transfer_timeout_ms\": 2000, \"connect_timeout_ms\": 2000,\n"
      " \"Transport\": \"auto\"}\n",
      role);
  hixl_kv_status st = ops->create(cfg, strlen(cfg), HIXL_KV_ROLE_SCHEDULER, 0, 1, c, err, sizeof(err));
  if (st != HIXL_KV_SUCCESS) fprintf(stderr, "create %s: %u: %s\n", role, st, err);
  return st;
}

/* A producer's scheduler builds kv_transfer_params with its json-c. */
static void test_producer_builds(void) {
  hixl_kv_connector *c = NULL;
  hixl_kv_status st = create("producer", &c);
  check_no_poison();
  CU_ASSERT_EQUAL_FATAL(st, HIXL_KV_SUCCESS);
  const char *p = "{\"do_remote_decode\": true}";
  hixl_kv_request r = {.req_id = "j-1",
                       .req_id_len = 3,
                       .num_prompt_tokens = 10,
                       .kv_transfer_params = p,
                       .kv_transfer_params_len = strlen(p)};
  uint64_t blocks[3] = {5, 6, 7};
  int32_t delay = -1;
  hixl_kv_buffer out = {0};
  st = ops->request_finished(c, &r, blocks, 3, &delay, &out);
  if (st != HIXL_KV_SUCCESS) fprintf(stderr, "request_finished: %u: %s\n", st, ops->last_error());
  check_no_poison();
  CU_ASSERT_EQUAL(st, HIXL_KV_SUCCESS);
  CU_ASSERT_EQUAL(delay, 1);
  if (st == HIXL_KV_SUCCESS)
    snprintf(producer_params, sizeof(producer_params), "%.*s", (int)out.len, (const char *)out.data);
  CU_ASSERT_PTR_NOT_NULL(strstr(producer_params, "\"remote_block_ids\""));
  ops->free_buffer(&out);
  CU_ASSERT_EQUAL(ops->destroy(c), HIXL_KV_SUCCESS);
}

/* A consumer's scheduler parses them with its json-c: 8 tokens to load. */
static void test_consumer_parses(void) {
  hixl_kv_connector *c = NULL;
  hixl_kv_status st = create("consumer", &c);
  check_no_poison();
  CU_ASSERT_EQUAL_FATAL(st, HIXL_KV_SUCCESS);
  hixl_kv_request r = {.req_id = "j-2",
                       .req_id_len = 3,
                       .num_prompt_tokens = 10,
                       .kv_transfer_params = producer_params,
                       .kv_transfer_params_len = strlen(producer_params)};
  int64_t tokens = -1;
  int32_t load_async = -1;
  CU_ASSERT_EQUAL(ops->get_num_new_matched_tokens(c, &r, 2, &tokens, &load_async), HIXL_KV_SUCCESS);
  check_no_poison();
  CU_ASSERT_EQUAL(tokens, 8);
  CU_ASSERT_EQUAL(load_async, 1);
  CU_ASSERT_EQUAL(ops->destroy(c), HIXL_KV_SUCCESS);
}

static CU_TestInfo tests[] = {
    {"a producer builds kv_transfer_params", test_producer_builds},
    {"a consumer parses them", test_consumer_parses},
    CU_TEST_INFO_NULL,
};
static CU_SuiteInfo suites[] = {
    {.pName = "plugin json-c beside a host's", .pTests = tests},
    CU_SUITE_INFO_NULL,
};

int main(void) {
  /* Else the poison is not in the global scope and the test proves nothing. */
  if (dlsym(RTLD_DEFAULT, "json_tokener_new_ex") != (void *)json_tokener_new_ex) {
    fprintf(stderr, "test_plugin_jsonc: the host's json_tokener_new_ex is not exported\n");
    return 1;
  }
  if (!(so = kv_host_open("test_plugin_jsonc", HIXL_KV_PLUGIN_PATH, &ops))) return 1;
  return kv_host_run("test_plugin_jsonc", suites, so);
}
