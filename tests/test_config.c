/* test_config: libhixl-config. Every key's default, valid and invalid values, both
 * document shapes, document > environment > default with the source of each value,
 * every error the parser reports with its line:column and path, files, and the round
 * trip to the engine: the options a configuration yields are what
 * HixlEngineInitialize takes. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hixl/hixl_config.h"
#include "jscan.h"
#include "test_util.h"

#define MAXE 32

static HixlConfigError errs[MAXE];
static size_t nerr;

/* Parse text (NUL-terminated here); *config NULL on failure. */
static HixlStatus parse(const char *text, HixlConfig **c) {
  memset(errs, 0, sizeof(errs));
  nerr = 99;
  return HixlConfigParse(text, strlen(text), c, errs, MAXE, &nerr);
}

/* Exactly one error, at line:col (0:0 = no place), on path, saying what. */
#define ONE_ERROR(text, l, col, p, what)                                                                     \
  do {                                                                                                       \
    HixlConfig *c_ = (HixlConfig *)1;                                                                        \
    CU_ASSERT_EQUAL(parse(text, &c_), HIXL_PARAM_INVALID);                                                   \
    CU_ASSERT_PTR_NULL(c_);                                                                                  \
    CU_ASSERT_EQUAL(nerr, 1);                                                                                \
    if (nerr != 1) {                                                                                         \
      for (size_t i_ = 0; i_ < nerr && i_ < MAXE; i_++)                                                      \
        fprintf(stderr, "  %u:%u %s: %s\n", errs[i_].line, errs[i_].column, errs[i_].path,                   \
                errs[i_].message);                                                                           \
    }                                                                                                        \
    CU_ASSERT_EQUAL(errs[0].line, (l));                                                                      \
    CU_ASSERT_EQUAL(errs[0].column, (col));                                                                  \
    CU_ASSERT_STRING_EQUAL(errs[0].path, (p));                                                               \
    if (!strstr(errs[0].message, (what))) {                                                                  \
      fprintf(stderr, "  message \"%s\" does not say \"%s\"\n", errs[0].message, (what));                    \
      CU_FAIL("message");                                                                                    \
    }                                                                                                        \
  } while (0)

static const char *str_of(const HixlConfig *c, const char *key) {
  const char *v = NULL;
  CU_ASSERT_EQUAL(HixlConfigGetString(c, key, &v), HIXL_SUCCESS);
  return v ? v : "(null)";
}

static HixlConfigSource src_of(const HixlConfig *c, const char *key, const char **env) {
  HixlConfigSource s = (HixlConfigSource)99;
  CU_ASSERT_EQUAL(HixlConfigGetSource(c, key, &s, env), HIXL_SUCCESS);
  return s;
}

/* ---- defaults and the table ---- */

static void test_defaults(void) {
  HixlConfig *c = NULL;
  CU_ASSERT_EQUAL_FATAL(parse("{}", &c), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(nerr, 0);
  size_t n = 0;
  for (const HixlConfigKeyInfo *k; (k = HixlConfigKeyAt(n)) != NULL; n++) {
    CU_ASSERT_PTR_NOT_NULL(k->doc);
    CU_ASSERT(k->doc && *k->doc);
    CU_ASSERT_PTR_NOT_NULL(k->range);
    if (k->env && getenv(k->env)) continue; /* the environment of this run decides it */
    CU_ASSERT_STRING_EQUAL(str_of(c, k->name), k->def);
    CU_ASSERT_EQUAL(src_of(c, k->name, NULL), HIXL_CONFIG_FROM_DEFAULT);
  }
  CU_ASSERT(n >= 18); /* 10 connector keys and the engine's 8 options */
  int64_t v = 0;
  int b = 0;
  CU_ASSERT_EQUAL(HixlConfigGetInt(c, "lease_ms", &v), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(v, 30000);
  CU_ASSERT_EQUAL(HixlConfigGetBool(c, "layer_pipelining", &b), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(b, 1);
  CU_ASSERT_STRING_EQUAL(str_of(c, "role"), "both");
  CU_ASSERT_STRING_EQUAL(str_of(c, "BufferPool"), "4:8");
  HixlConfigFree(c);
}

/* Every engine option is a key, with the engine's default, env and range. */
static void test_engine_rows(void) {
  size_t ne = 0;
  const HixlEngineOptionInfo *eo = HixlEngineOptionTable(&ne);
  CU_ASSERT_FATAL(ne >= 8);
  for (size_t i = 0; i < ne; i++) {
    const HixlConfigKeyInfo *k = NULL;
    for (size_t j = 0; (k = HixlConfigKeyAt(j)) != NULL; j++)
      if (strcmp(k->name, eo[i].name) == 0) break;
    CU_ASSERT_PTR_NOT_NULL_FATAL(k);
    CU_ASSERT_EQUAL(k->type, HIXL_CONFIG_ENGINE);
    CU_ASSERT_STRING_EQUAL(k->def, eo[i].def);
    CU_ASSERT_STRING_EQUAL(k->range, eo[i].range);
    CU_ASSERT((k->env == NULL) == (eo[i].env == NULL));
  }
}

/* ---- values ---- */

/* The observer's keys (issue 30): defaults, values read back, ranges. */
static void test_obs_keys(void) {
  HixlConfig *c = NULL;
  int64_t v = 0;
  int b = 0;
  CU_ASSERT_EQUAL_FATAL(parse("{}", &c), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(HixlConfigGetBool(c, "metrics", &b), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(b, 1);
  CU_ASSERT_EQUAL(HixlConfigGetInt(c, "trace_ring", &v), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(v, 1024);
  CU_ASSERT_STRING_EQUAL(str_of(c, "trace_file"), "");
  HixlConfigFree(c);
  c = NULL;
  CU_ASSERT_EQUAL_FATAL(
      parse("{\"metrics\": false, \"trace_ring\": 0, \"trace_file\": \"/tmp/t.jsonl\"}", &c), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(HixlConfigGetBool(c, "metrics", &b), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(b, 0);
  CU_ASSERT_EQUAL(HixlConfigGetInt(c, "trace_ring", &v), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(v, 0);
  CU_ASSERT_STRING_EQUAL(str_of(c, "trace_file"), "/tmp/t.jsonl");
  HixlConfigFree(c);
  ONE_ERROR("{\"trace_ring\": 1048577}", 1, 16, "trace_ring", "[0,1048576]");
  ONE_ERROR("{\"metrics\": 1}", 1, 13, "metrics", "expected true or false");
  char doc[400];
  snprintf(doc, sizeof(doc), "{\"trace_file\": \"/%0300d\"}", 0);
  ONE_ERROR(doc, 1, 16, "trace_file", "at most 255");
  /* HIXL_KV_TRACE_FILE turns a host's traces on without its document: below the document. */
  const char *env = NULL;
  CU_ASSERT_EQUAL_FATAL(setenv("HIXL_KV_TRACE_FILE", "/tmp/env-traces.jsonl", 1), 0);
  c = NULL;
  CU_ASSERT_EQUAL_FATAL(parse("{\"role\": \"consumer\"}", &c), HIXL_SUCCESS);
  CU_ASSERT_STRING_EQUAL(str_of(c, "trace_file"), "/tmp/env-traces.jsonl");
  CU_ASSERT_EQUAL(src_of(c, "trace_file", &env), HIXL_CONFIG_FROM_ENV);
  CU_ASSERT_STRING_EQUAL(env ? env : "", "HIXL_KV_TRACE_FILE");
  HixlConfigFree(c);
  c = NULL;
  CU_ASSERT_EQUAL_FATAL(parse("{\"trace_file\": \"/tmp/doc.jsonl\"}", &c), HIXL_SUCCESS);
  CU_ASSERT_STRING_EQUAL(str_of(c, "trace_file"), "/tmp/doc.jsonl");
  CU_ASSERT_EQUAL(src_of(c, "trace_file", NULL), HIXL_CONFIG_FROM_DOCUMENT);
  HixlConfigFree(c);
  snprintf(doc, sizeof(doc), "/%0300d", 0);
  CU_ASSERT_EQUAL_FATAL(setenv("HIXL_KV_TRACE_FILE", doc, 1), 0);
  ONE_ERROR("{}", 0, 0, "trace_file", "environment HIXL_KV_TRACE_FILE=");
  unsetenv("HIXL_KV_TRACE_FILE");
}

static void test_values(void) {
  HixlConfig *c = NULL;
  const char *doc =
      "{\"address\": \"10.1.2.3:16000\", \"role\": \"producer\", \"mode\": \"push\",\n"
      " \"lease_ms\": 1, \"load_failure_policy\": \"recompute\", \"max_inflight_requests\": 1048576,\n"
      " \"layer_pipelining\": false, \"connect_timeout_ms\": 86400000, \"transfer_timeout_ms\": 5,\n"
      " \"notify_timeout_ms\": 7, \"BufferPool\": \"0:0\", \"RdmaTrafficClass\": 104,\n"
      " \"RdmaServiceLevel\": \"7\", \"Transport\": \"rdma\", \"RdmaDevice\": \"mlx5_0\",\n"
      " \"RdmaGidIndex\": 3, \"StagingThreshold\": \"auto\", \"StagingUnregistered\": true}";
  CU_ASSERT_EQUAL_FATAL(parse(doc, &c), HIXL_SUCCESS);
  int64_t v = 0;
  int b = 1;
  CU_ASSERT_STRING_EQUAL(str_of(c, "address"), "10.1.2.3:16000");
  CU_ASSERT_STRING_EQUAL(str_of(c, "role"), "producer");
  CU_ASSERT_STRING_EQUAL(str_of(c, "mode"), "push");
  CU_ASSERT_EQUAL(HixlConfigGetInt(c, "lease_ms", &v), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(v, 1);
  CU_ASSERT_EQUAL(HixlConfigGetInt(c, "max_inflight_requests", &v), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(v, 1048576);
  CU_ASSERT_EQUAL(HixlConfigGetInt(c, "connect_timeout_ms", &v), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(v, 86400000);
  CU_ASSERT_EQUAL(HixlConfigGetBool(c, "layer_pipelining", &b), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(b, 0);
  CU_ASSERT_STRING_EQUAL(str_of(c, "RdmaTrafficClass"), "104"); /* a JSON number, as the engine's text */
  CU_ASSERT_STRING_EQUAL(str_of(c, "RdmaServiceLevel"), "7");
  CU_ASSERT_STRING_EQUAL(str_of(c, "RdmaGidIndex"), "3");
  CU_ASSERT_STRING_EQUAL(str_of(c, "StagingUnregistered"), "on"); /* true */
  CU_ASSERT_EQUAL(src_of(c, "RdmaTrafficClass", NULL), HIXL_CONFIG_FROM_DOCUMENT);
  /* Types are kept apart. */
  CU_ASSERT_EQUAL(HixlConfigGetInt(c, "role", &v), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(HixlConfigGetBool(c, "lease_ms", &b), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(HixlConfigGetString(c, "no_such_key", NULL), HIXL_NOT_FOUND);
  const char *s = NULL;
  CU_ASSERT_EQUAL(HixlConfigGetString(c, "no_such_key", &s), HIXL_NOT_FOUND);
  CU_ASSERT_EQUAL(HixlConfigGetString(c, NULL, &s), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(HixlConfigGetString(NULL, "role", &s), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(HixlConfigGetSource(c, "role", NULL, NULL), HIXL_PARAM_INVALID);
  HixlConfigFree(c);
  HixlConfigFree(NULL);
}

/* One invalid value per key: each error names the key and where it is. */
static void test_bad_values(void) {
  ONE_ERROR("{\"lease_ms\": -5}", 1, 14, "lease_ms", "-5 is out of range: expected [1,86400000]");
  ONE_ERROR("{\"lease_ms\": 0}", 1, 14, "lease_ms", "out of range");
  ONE_ERROR("{\"lease_ms\": 86400001}", 1, 14, "lease_ms", "out of range");
  ONE_ERROR("{\"lease_ms\": 1.5}", 1, 14, "lease_ms",
            "expected an integer in [1,86400000], got a fractional");
  ONE_ERROR("{\"lease_ms\": \"30000\"}", 1, 14, "lease_ms", "got a string");
  ONE_ERROR("{\"max_inflight_requests\": 0}", 1, 27, "max_inflight_requests", "out of range");
  ONE_ERROR("{\"loads_per_producer\": 0}", 1, 24, "loads_per_producer", "out of range");
  ONE_ERROR("{\"loads_per_producer\": 9}", 1, 24, "loads_per_producer", "out of range");
  ONE_ERROR("{\"connect_timeout_ms\": null}", 1, 24, "connect_timeout_ms", "got null");
  ONE_ERROR("{\"role\": \"prefill\"}", 1, 10, "role",
            "\"prefill\" is not one of: producer | consumer | both");
  ONE_ERROR("{\"role\": 1}", 1, 10, "role", "expected a string");
  ONE_ERROR("{\"mode\": \"pul\"}", 1, 10, "mode", "pull | push");
  ONE_ERROR("{\"load_failure_policy\": \"retry\"}", 1, 25, "load_failure_policy", "fail | recompute");
  ONE_ERROR("{\"layer_pipelining\": \"yes\"}", 1, 22, "layer_pipelining", "expected true or false");
  ONE_ERROR("{\"address\": \"localhost:1\"}", 1, 13, "address", "not an IPv4 address");
  ONE_ERROR("{\"address\": \"1.2.3:4\"}", 1, 13, "address", "not an IPv4 address");
  ONE_ERROR("{\"address\": \"127.0.0.1:65536\"}", 1, 13, "address", "not in [0,65535]");
  ONE_ERROR("{\"address\": \":5\"}", 1, 13, "address", "is not \"ip\" or \"ip:port\"");
  /* Peers dial it: one host, and a port the engine reads as written (a 64-byte padded port
   * was cut to 4123 when the plugin copied it; whitespace or a sign the engine refuses). */
  ONE_ERROR("{\"address\": \"0.0.0.0:16000\"}", 1, 13, "address", "not one host's address");
  ONE_ERROR("{\"address\": \"255.255.255.255\"}", 1, 13, "address", "not one host's address");
  ONE_ERROR("{\"address\": \"239.1.2.3:5\"}", 1, 13, "address", "not one host's address");
  ONE_ERROR("{\"address\": \"127.0.0.1:0000000000000000000000000000000000000000000000000041235\"}", 1, 13,
            "address", "not in [0,65535]");
  ONE_ERROR("{\"address\": \"127.0.0.1: 80\"}", 1, 13, "address", "not in [0,65535]");
  ONE_ERROR("{\"address\": \"127.0.0.1:+80\"}", 1, 13, "address", "not in [0,65535]");
  ONE_ERROR("{\"RdmaTrafficClass\": 130}", 1, 22, "RdmaTrafficClass", "130 is not a multiple of 4");
  ONE_ERROR("{\"RdmaTrafficClass\": \"130\"}", 1, 22, "RdmaTrafficClass", "not a multiple of 4");
  ONE_ERROR("{\"RdmaTrafficClass\": 256}", 1, 22, "RdmaTrafficClass", "expected [0,255], a multiple of 4");
  ONE_ERROR("{\"RdmaTrafficClass\": -4}", 1, 22, "RdmaTrafficClass", "is not valid");
  ONE_ERROR("{\"RdmaTrafficClass\": true}", 1, 22, "RdmaTrafficClass", "expected a string or an integer");
  ONE_ERROR("{\"RdmaServiceLevel\": 8}", 1, 22, "RdmaServiceLevel", "expected [0,7]");
  ONE_ERROR("{\"BufferPool\": \"4x8\"}", 1, 16, "BufferPool", "\"NUM:SIZE_MB\"");
  ONE_ERROR("{\"BufferPool\": \"0:8\"}", 1, 16, "BufferPool", "is not valid");
  ONE_ERROR("{\"BufferPool\": 4}", 1, 16, "BufferPool", "expected a string");
  ONE_ERROR("{\"Transport\": \"udp\"}", 1, 15, "Transport", "auto | tcp | rdma | shm");
  ONE_ERROR("{\"RdmaGidIndex\": 256}", 1, 18, "RdmaGidIndex", "auto, or [0,255]");
  ONE_ERROR("{\"StagingThreshold\": 1048577}", 1, 22, "StagingThreshold", "[0,1048576]");
  ONE_ERROR("{\"StagingUnregistered\": \"maybe\"}", 1, 25, "StagingUnregistered", "on | off");
  ONE_ERROR("{\"RdmaDevice\": \"a/b\"}", 1, 16, "RdmaDevice", "is not valid");
  /* Valid edges. */
  const char *ok[] = {
      "{\"address\": \"127.0.0.1\"}", "{\"address\": \"127.0.0.1:0\"}", "{\"address\": \"127.0.0.1:65535\"}",
      "{\"address\": \"\"}", "{\"RdmaTrafficClass\": 0}", "{\"RdmaTrafficClass\": 252}",
      "{\"RdmaServiceLevel\": 0}", "{\"StagingThreshold\": 0}", "{\"BufferPool\": \"1024:4096\"}",
      "{\"StagingUnregistered\": \"off\"}",
      /* every numeric engine option takes a JSON number (nine refused one) */
      "{\"PollUs\": 50}", "{\"MaxLinks\": 100}", "{\"LinkAnswerMiB\": 16}", "{\"SocketBufferKiB\": 0}",
      "{\"HandshakeTimeout\": 5000}", "{\"AuthPayloadTag\": false}"};
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    HixlConfig *c = NULL;
    CU_ASSERT_EQUAL(parse(ok[i], &c), HIXL_SUCCESS);
    if (nerr) fprintf(stderr, "  %s: %s\n", ok[i], errs[0].message);
    HixlConfigFree(c);
  }
}

/* ---- the document itself ---- */

static void test_bad_documents(void) {
  ONE_ERROR("", 0, 0, "", "the document is empty");
  ONE_ERROR(" \n\t ", 0, 0, "", "the document is empty");
  ONE_ERROR("[]", 1, 1, "", "the document is an array: expected a JSON object");
  ONE_ERROR("  5", 1, 3, "", "is an integer: expected a JSON object");
  ONE_ERROR("\"x\"", 1, 1, "", "is a string");
  ONE_ERROR("{\"role\": \"both\"} {}", 1, 18, "", "trailing text after the document");
  ONE_ERROR("{\"role\": \"both\"}\n\nx", 3, 1, "", "trailing text");
  ONE_ERROR("{\"role\":\n \"both\",\n \"lease_ms\": 5", 3, 15, "", "the document ends early");
  ONE_ERROR("{\"role\": \"both\",, }", 1, 17, "", "not JSON");
  ONE_ERROR("{'role': 'both'}", 1, 10, "", "not JSON"); /* json-c tells where it gave up */
  ONE_ERROR("{\"role\": \"both\" /* c */}", 1, 17, "", "not JSON");
  ONE_ERROR("{\"a\":[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]}", 1, 22, "", "nesting deeper than 16");
  /* 16 levels (the object and 15 arrays) are read, 17 refused: json-c holds one level
   * fewer than its depth, and 16 were refused as "deeper than 16". */
  ONE_ERROR("{\"a\":[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]}", 1, 2, "a", "unknown key \"a\"");
  ONE_ERROR("{\"a\":[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}", 1, 22, "", "nesting deeper than 16");
  ONE_ERROR("{\"role\": \"\xff\"}", 1, 11, "", "invalid UTF-8");
  ONE_ERROR("\xef\xbb\xbf{\"role\": \"both\"}", 1, 1, "",
            "a UTF-8 byte order mark");                                         /* was "invalid UTF-8" */
  ONE_ERROR("{\"role\": \"\xc0\xaf\"}", 1, 11, "", "invalid UTF-8");            /* overlong '/' */
  ONE_ERROR("{\"role\": \"\xed\xa0\x80\"}", 1, 11, "", "invalid UTF-8");        /* a surrogate, encoded */
  ONE_ERROR("{\"address\": \"\xf4\x90\x80\x80\"}", 1, 14, "", "invalid UTF-8"); /* past U+10FFFF */
  ONE_ERROR("{\"address\": \"\xe2\x82\"}", 1, 14, "", "invalid UTF-8");         /* cut short */
  /* An escaped NUL, in a value or a key: the C string would end there, the rest dropped
   * ("producer\u0000junk" was taken as producer). A raw control character: JSON allows none. */
  ONE_ERROR("{\"role\": \"producer\\u0000junk\"}", 1, 19, "", "\\u0000 in a string");
  ONE_ERROR("{\"role\\u0000typo\": \"consumer\"}", 1, 7, "", "\\u0000 in a string");
  ONE_ERROR("{\"trace_file\": \"/tmp/a\nrole consumer\"}", 1, 23, "", "a control character in a string");
  HixlConfig *esc = NULL; /* an escaped backslash before u0000 is text, not a NUL */
  CU_ASSERT_EQUAL(parse("{\"trace_file\": \"/tmp/a\\\\u0000\"}", &esc), HIXL_SUCCESS);
  HixlConfigFree(esc);
  /* A NUL byte: the length says where the document ends, not the NUL. */
  const char nul[] = "{\"role\": \"both\"\0}";
  HixlConfig *c = (HixlConfig *)1;
  CU_ASSERT_EQUAL(HixlConfigParse(nul, sizeof(nul) - 1, &c, errs, MAXE, &nerr), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(c);
  CU_ASSERT_EQUAL(nerr, 1);
  CU_ASSERT_EQUAL(errs[0].column, 16);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "NUL byte"));
  /* Over 1 MiB: refused before it is parsed. */
  size_t big = HIXL_CONFIG_MAX_BYTES + 1;
  char *b = malloc(big);
  CU_ASSERT_PTR_NOT_NULL_FATAL(b);
  memset(b, ' ', big);
  b[0] = '{';
  b[big - 1] = '}';
  c = (HixlConfig *)1;
  CU_ASSERT_EQUAL(HixlConfigParse(b, big, &c, errs, MAXE, &nerr), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(c);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "at most 1048576"));
  CU_ASSERT_EQUAL(HixlConfigParse(b, big - 1, &c, errs, MAXE, &nerr), HIXL_PARAM_INVALID); /* '{' + spaces */
  b[big - 2] = '}';
  CU_ASSERT_EQUAL(HixlConfigParse(b, big - 1, &c, errs, MAXE, &nerr), HIXL_SUCCESS); /* exactly 1 MiB */
  HixlConfigFree(c);
  free(b);
}

/* A repeated key is an error at the second, naming the first; json-c alone would
 * keep the last silently. An escaped spelling is the same key. */
static void test_duplicates(void) {
  ONE_ERROR("{\n  \"lease_ms\": 5,\n  \"role\": \"both\",\n  \"lease_ms\": 6\n}", 4, 3, "lease_ms",
            "duplicate key (first at 2:3)");
  ONE_ERROR("{\"role\": \"both\", \"r\\u006fle\": \"both\"}", 1, 18, "role", "first at 1:2");
  ONE_ERROR(
      "{\"kv_connector\": \"H\", \"kv_connector_extra_config\": {\"mode\": \"pull\", \"mode\": \"push\"}}", 1,
      69, "kv_connector_extra_config.mode", "duplicate key (first at 1:53)");
  /* The same name in two different objects is not a repetition. */
  HixlConfig *c = NULL;
  CU_ASSERT_EQUAL(parse("{\"kv_role\": \"kv_both\", \"kv_connector_extra_config\": {\"kv_role\": 1}}", &c),
                  HIXL_PARAM_INVALID); /* kv_role is not a hixl key: one error, not two */
  CU_ASSERT_EQUAL(nerr, 1);
  CU_ASSERT_STRING_EQUAL(errs[0].path, "kv_connector_extra_config.kv_role");
}

static void test_unknown_keys(void) {
  ONE_ERROR("{\"adress\": \"127.0.0.1:1\"}", 1, 2, "adress",
            "unknown key \"adress\"; did you mean \"address\"?");
  ONE_ERROR("{\"bufferpool\": \"4:8\"}", 1, 2, "bufferpool", "did you mean \"BufferPool\"?");
  ONE_ERROR("{\"lease\": 5}", 1, 2, "lease", "unknown key \"lease\"");
  ONE_ERROR("{\"zzzzzzzz\": 5}", 1, 2, "zzzzzzzz", "hixl-config reference");
}

/* An unknown key is placed however long it is (a path cut at 159 bytes found no member)
 * and whatever its escapes (jscan wrote a lone surrogate as CESU bytes, json-c as U+FFFD:
 * the keys differed, and the error had line 0). */
static void test_unknown_key_places(void) {
  char key[201], doc[512], path[128];
  memset(key, 'k', 200);
  key[200] = '\0';
  memcpy(path, key, sizeof(path) - 4); /* the error's path is cut to its field, with "..." */
  memcpy(path + sizeof(path) - 4, "...", 4);
  snprintf(doc, sizeof(doc), "{\"role\": \"producer\",\n \"%s\": 1}", key);
  ONE_ERROR(doc, 2, 2, path, "unknown key \"kkkk");
  snprintf(doc, sizeof(doc), "{\"kv_connector\": \"x\",\n \"kv_connector_extra_config\": {\"%.140s\": 1}}",
           key);
  memcpy(path, "kv_connector_extra_config.", 26);
  memcpy(path + 26, key, sizeof(path) - 30);
  memcpy(path + sizeof(path) - 4, "...", 4);
  ONE_ERROR(doc, 2, 32, path, "unknown key \"kkkk");
  /* Each lone or paired surrogate escape, decoded as json-c decodes it. */
  static const char *const keys[] = {
      "lease\\ud800",       "lease\\udc00",        "lease\\ud800\\ud800",
      "lease\\ud800\\n",    "lease\\ud800\\u0041", "lease\\udbff\\udfff",
      "lease\\ud800x",      "\\uDC00\\uD800",      "lease\\ud800\\ud83d\\ude00",
      "lease\\ud800\\u00e9"};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
    HixlConfig *c = NULL;
    snprintf(doc, sizeof(doc), "{\"role\": \"producer\",\n \"%s\": 1}", keys[i]);
    CU_ASSERT_EQUAL(parse(doc, &c), HIXL_PARAM_INVALID);
    CU_ASSERT_EQUAL(nerr, 1);
    CU_ASSERT(errs[0].line == 2 && errs[0].column == 2);
    if (errs[0].line != 2) fprintf(stderr, "  key %s: at %u:%u\n", keys[i], errs[0].line, errs[0].column);
  }
}

/* A key with a dot is one name, never a path: "a.b" beside "a": {"b": ..} is its own
 * (unknown) key, and neither takes the other's place. Before, both shared the path
 * "a.b" and every error of either was placed at the last of the two. */
static void test_dotted_keys(void) {
  HixlConfig *c = (HixlConfig *)1;
  const char *d1 = "{\"kv_connector\": \"x\", \"kv_connector_extra_config\": {\"role\": \"bogus\"},\n"
                   " \"kv_connector_extra_config.role\": \"producer\"}";
  CU_ASSERT_EQUAL(parse(d1, &c), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(c);
  CU_ASSERT_EQUAL_FATAL(nerr, 2);
  CU_ASSERT(errs[0].line == 1 && errs[0].column == 61); /* at "bogus", not at the dotted key's value */
  CU_ASSERT_STRING_EQUAL(errs[0].path, "kv_connector_extra_config.role");
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "\"bogus\" is not one of"));
  CU_ASSERT(errs[1].line == 2 && errs[1].column == 2);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[1].message, "unknown key \"kv_connector_extra_config.role\""));
  CU_ASSERT_PTR_NOT_NULL(
      strstr(errs[1].message, "a key is one name, not a path: the member this path names is at 1:53"));
  /* The dotted key first: the nested member's error is still at its own value. */
  const char *d2 = "{\"kv_connector\": \"x\", \"kv_connector_extra_config.role\": 1,\n"
                   " \"kv_connector_extra_config\": {\"role\": \"bogus\"}}";
  CU_ASSERT_EQUAL(parse(d2, &c), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL_FATAL(nerr, 2);
  CU_ASSERT(errs[0].line == 1 && errs[0].column == 23);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "the member this path names is at 2:32"));
  CU_ASSERT(errs[1].line == 2 && errs[1].column == 40);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[1].message, "\"bogus\""));
  /* Inside kv_connector_extra_config: "role.x" beside "role": {"x": ..}. */
  const char *d3 = "{\"kv_connector\": \"x\", \"kv_connector_extra_config\": {\"role\": {\"x\": 1},\n"
                   " \"role.x\": 2}}";
  CU_ASSERT_EQUAL(parse(d3, &c), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL_FATAL(nerr, 2);
  CU_ASSERT(errs[0].line == 1 && errs[0].column == 61);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "expected a string"));
  CU_ASSERT(errs[1].line == 2 && errs[1].column == 2);
  CU_ASSERT_STRING_EQUAL(errs[1].path, "kv_connector_extra_config.role.x");
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[1].message, "the member this path names is at 1:62"));
  /* Alone, a dotted key is said to be one name too. */
  ONE_ERROR("{\"kv_connector\": \"x\", \"kv_connector_extra_config.role\": \"producer\"}", 1, 23,
            "kv_connector_extra_config.role", "(a key is one name, not a dotted path)");
}

/* ---- document text in messages ---- */

/* The one error of text (NUL-terminated) is exactly on path, saying msg. */
static void exact_error(const char *text, const char *path, const char *msg) {
  HixlConfig *c = (HixlConfig *)1;
  CU_ASSERT_EQUAL(parse(text, &c), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(c);
  CU_ASSERT_EQUAL(nerr, 1);
  CU_ASSERT_STRING_EQUAL(errs[0].path, path);
  CU_ASSERT_STRING_EQUAL(errs[0].message, msg);
  if (nerr != 1 || strcmp(errs[0].path, path) != 0 || strcmp(errs[0].message, msg) != 0)
    fprintf(stderr,
            "  %zu errors; the first: path \"%s\", message \"%s\"\n  wanted: path \"%s\", message \"%s\"\n",
            nerr, errs[0].path, errs[0].message, path, msg);
}

/* No error of the last parse holds a byte below 0x20 or DEL, in its path or message. */
static void no_control_bytes(void) {
  for (size_t i = 0; i < nerr && i < MAXE; i++)
    for (const char *p = errs[i].path; *p; p++) CU_ASSERT(*p >= 0x20 && *p != 0x7f);
  for (size_t i = 0; i < nerr && i < MAXE; i++)
    for (const char *p = errs[i].message; *p; p++) CU_ASSERT(*p >= 0x20 && *p != 0x7f);
}

/* A key or value the document writes is quoted escaped: a newline in it (an escape that
 * json-c decodes) came out raw, in hixl-config check's output and in the message the
 * plugin hands the host's log, where it forged a line. */
static void test_quoted_escaped(void) {
  exact_error("{\"role\": \"producer\",\n \"a\\nb: forged\": 1}", "a\\nb: forged",
              "unknown key \"a\\nb: forged\" (`hixl-config reference` lists the keys)");
  exact_error("{\"rol\\te\": \"both\"}", "rol\\te", "unknown key \"rol\\te\"; did you mean \"role\"?");
  exact_error("{\"mode\": \"pu\\u001bll\\r\\t\"}", "mode", "\"pu\\x1bll\\r\\t\" is not one of: pull | push");
  /* a quote or a backslash cannot end the quote or fake an escape; DEL, a C1 control and
   * the line separators are escaped too */
  exact_error("{\"role\": \"a\\\"b\\\\n\\u007f\\u0085\\u2028\\u2029\\u00e9\"}", "role",
              "\"a\\\"b\\\\n\\x7f\\u0085\\u2028\\u2029\xc3\xa9\" is not one of: producer | consumer | both");
  exact_error("{\"Transport\": \"tcp\\n\"}", "Transport",
              "\"tcp\\n\" is not valid: expected auto | tcp | rdma | shm");
  exact_error("{\"address\": \"1\\n2:3\"}", "address", "\"1\\n2\" is not an IPv4 address");
  exact_error("{\"address\": \"127.0.0.1:8\\n\"}", "address", "port \"8\\n\" is not in [0,65535]");
  exact_error("{\"address\": \":1\\n\"}", "address", "\":1\\n\" is not \"ip\" or \"ip:port\"");
  /* vLLM's shape: its own keys and values, and the path of a hixl key inside */
  exact_error("{\"kv_connector\": \"H\", \"kv_role\": \"kv_both\\n\"}", "kv_role",
              "\"kv_both\\n\" is not one of: kv_producer | kv_consumer | kv_both");
  exact_error("{\"kv_connector\": \"H\", \"x\\u2028y\": 1}", "x\\u2028y",
              "unknown key \"x\\u2028y\" of vLLM's --kv-transfer-config");
  exact_error("{\"kv_connector\": \"H\", \"kv_connector_extra_config\": {\"mode\\n\": \"pull\"}}",
              "kv_connector_extra_config.mode\\n", "unknown key \"mode\\n\"; did you mean \"mode\"?");
  /* a repeated key (unknown too: two errors at its place): its path */
  HixlConfig *c = NULL;
  CU_ASSERT_EQUAL(parse("{\"a\\nb\": 1, \"a\\nb\": 2}", &c), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL_FATAL(nerr, 2);
  CU_ASSERT_STRING_EQUAL(errs[0].path, "a\\nb");
  CU_ASSERT_STRING_EQUAL(errs[1].path, "a\\nb");
  size_t dup = strncmp(errs[0].message, "duplicate", 9) == 0 ? 0 : 1;
  CU_ASSERT_STRING_EQUAL(errs[dup].message, "duplicate key (first at 1:2); each key may appear once");
  CU_ASSERT_STRING_EQUAL(errs[1 - dup].message,
                         "unknown key \"a\\nb\" (`hixl-config reference` lists the keys)");
  no_control_bytes();
  /* a file's name, in the message that it cannot be opened */
  CU_ASSERT_EQUAL(HixlConfigParseFile("/nonexistent/a\nb.json", &c, errs, MAXE, &nerr), HIXL_FAILED);
  CU_ASSERT_STRING_EQUAL(errs[0].message, "cannot open /nonexistent/a\\nb.json: No such file or directory");
  /* the environment: a value of any bytes, UTF-8 or not */
  setenv("HCCL_RDMA_TC", "1\n2\xff", 1);
  exact_error("{}", "RdmaTrafficClass",
              "environment HCCL_RDMA_TC=\"1\\n2\\xff\": \"1\\n2\\xff\" is not valid: expected [0,255], a "
              "multiple of 4");
  unsetenv("HCCL_RDMA_TC");
}

/* A long key or value is quoted cut, its first 64 bytes and "...", so what is wrong and
 * what is allowed still fit in the message: a bad value of 1,000 bytes was quoted whole,
 * and the allowed values were cut off. */
static void test_quoted_cut(void) {
  char v[1001], doc[2048], want[384], q[128];
  memset(v, 'v', 1000);
  v[1000] = '\0';
  snprintf(q, sizeof(q), "\"%.64s...\"", v);
  snprintf(doc, sizeof(doc), "{\"mode\": \"%s\"}", v);
  snprintf(want, sizeof(want), "%s is not one of: pull | push", q);
  exact_error(doc, "mode", want);
  snprintf(doc, sizeof(doc), "{\"Transport\": \"%s\"}", v);
  snprintf(want, sizeof(want), "%s is not valid: expected auto | tcp | rdma | shm", q);
  exact_error(doc, "Transport", want);
  snprintf(doc, sizeof(doc), "{\"kv_connector\": \"H\", \"kv_role\": \"%s\"}", v);
  snprintf(want, sizeof(want), "%s is not one of: kv_producer | kv_consumer | kv_both", q);
  exact_error(doc, "kv_role", want);
  snprintf(doc, sizeof(doc), "{\"address\": \"%s\"}", v);
  snprintf(want, sizeof(want), "%s is not \"ip\" or \"ip:port\"", q);
  exact_error(doc, "address", want);
  snprintf(doc, sizeof(doc), "{\"address\": \"127.0.0.1:%s\"}", v);
  snprintf(want, sizeof(want), "port %s is not in [0,65535]", q);
  exact_error(doc, "address", want);
  /* a key: in the message at 64 bytes, in the path at its field */
  char path[128];
  snprintf(doc, sizeof(doc), "{\"%.300s\": 1}", v);
  snprintf(want, sizeof(want), "unknown key %s (`hixl-config reference` lists the keys)", q);
  snprintf(path, sizeof(path), "%.124s...", v);
  exact_error(doc, path, want);
  /* 64 bytes are quoted whole */
  snprintf(doc, sizeof(doc), "{\"mode\": \"%.64s\"}", v);
  snprintf(want, sizeof(want), "\"%.64s\" is not one of: pull | push", v);
  exact_error(doc, "mode", want);
  /* 64 bytes of escaped text at most: escapes count, and none is split, nor a character */
  snprintf(doc, sizeof(doc), "{\"mode\": \"");
  for (int i = 0; i < 100; i++) strcat(doc, "\\u0001");
  strcat(doc, "\"}");
  exact_error(
      doc, "mode",
      "\"\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01...\" is not "
      "one of: pull | push");
  snprintf(doc, sizeof(doc), "{\"mode\": \"%.63s\\nx\"}", v);
  snprintf(want, sizeof(want), "\"%.63s...\" is not one of: pull | push", v);
  exact_error(doc, "mode", want);
  snprintf(doc, sizeof(doc), "{\"mode\": \"%.63s\\u00e9\"}", v);
  exact_error(doc, "mode", want);
  /* the environment's value, quoted twice, leaves what is allowed in the message */
  char e[1001];
  memset(e, '9', 1000);
  e[1000] = '\0';
  setenv("HCCL_RDMA_TC", e, 1);
  snprintf(
      want, sizeof(want),
      "environment HCCL_RDMA_TC=\"%.64s...\": \"%.64s...\" is not valid: expected [0,255], a multiple of 4",
      e, e);
  exact_error("{}", "RdmaTrafficClass", want);
  unsetenv("HCCL_RDMA_TC");
}

/* An integer past int64 is quoted as the document writes it: json-c saturates it to
 * 9223372036854775807 (or its negative), which the messages quoted, and a negative one
 * was called too large. */
static void test_big_integers(void) {
  ONE_ERROR("{\"RdmaTimeout\": 99999999999999999999}", 1, 17, "RdmaTimeout",
            "99999999999999999999 is out of range: expected [5,20]");
  ONE_ERROR("{\"RdmaTimeout\": 18446744073709551616}", 1, 17, "RdmaTimeout", "18446744073709551616 is out");
  ONE_ERROR("{\"RdmaTimeout\": 18446744073709551615}", 1, 17, "RdmaTimeout", "18446744073709551615 is out");
  ONE_ERROR("{\"RdmaTimeout\": -99999999999999999999}", 1, 17, "RdmaTimeout", "-99999999999999999999 is out");
  ONE_ERROR("{\"lease_ms\": 99999999999999999999}", 1, 14, "lease_ms",
            "99999999999999999999 is out of range: expected [1,86400000]");
  ONE_ERROR("{\"lease_ms\": -99999999999999999999}", 1, 14, "lease_ms",
            "-99999999999999999999 is out of range");
  ONE_ERROR("{\"lease_ms\": 9223372036854775808}", 1, 14, "lease_ms", "9223372036854775808 is out of range");
  ONE_ERROR("{\"lease_ms\": 9223372036854775807}", 1, 14, "lease_ms", "9223372036854775807 is out of range");
  ONE_ERROR("{\"lease_ms\": -9223372036854775808}", 1, 14, "lease_ms",
            "-9223372036854775808 is out of range");
  char doc[256], digits[101];
  memset(digits, '7', 100);
  digits[100] = '\0';
  snprintf(doc, sizeof(doc), "{\"lease_ms\": %s}", digits); /* quoted cut, never saturated */
  ONE_ERROR(doc, 1, 14, "lease_ms", "7777777777... is out of range");
  for (size_t i = 0; i < nerr && i < MAXE; i++) {
    CU_ASSERT_PTR_NULL(strstr(errs[i].message, "9223372036854775807"));
    CU_ASSERT_PTR_NULL(strstr(errs[i].message, "too large"));
  }
  HixlConfig *c = NULL; /* in range: as before */
  CU_ASSERT_EQUAL(parse("{\"RdmaTimeout\": 14, \"lease_ms\": -0}", &c), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(nerr, 1);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "0 is out of range"));
  CU_ASSERT_EQUAL(parse("{\"RdmaTimeout\": 14, \"lease_ms\": 86400000}", &c), HIXL_SUCCESS);
  CU_ASSERT_STRING_EQUAL(str_of(c, "RdmaTimeout"), "14");
  HixlConfigFree(c);
}

/* Every independent error of a document in one parse, in document order; the total
 * even when fewer fit. */
static void test_all_errors(void) {
  const char *doc = "{\n"
                    "  \"role\": \"producr\",\n"
                    "  \"lease_ms\": -5,\n"
                    "  \"RdmaTrafficClass\": 130,\n"
                    "  \"adress\": \"x\",\n"
                    "  \"layer_pipelining\": \"yes\"\n"
                    "}\n";
  HixlConfig *c = (HixlConfig *)1;
  CU_ASSERT_EQUAL(parse(doc, &c), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(c);
  CU_ASSERT_EQUAL_FATAL(nerr, 5);
  const char *paths[5] = {"role", "lease_ms", "RdmaTrafficClass", "adress", "layer_pipelining"};
  for (unsigned i = 0; i < 5; i++) {
    CU_ASSERT_EQUAL(errs[i].line, i + 2);
    CU_ASSERT_STRING_EQUAL(errs[i].path, paths[i]);
  }
  HixlConfigError two[2];
  size_t n = 0;
  CU_ASSERT_EQUAL(HixlConfigParse(doc, strlen(doc), &c, two, 2, &n), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(n, 5);
  CU_ASSERT_EQUAL(HixlConfigParse(doc, strlen(doc), &c, NULL, 0, &n), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(n, 5);
  CU_ASSERT_EQUAL(HixlConfigParse(doc, strlen(doc), &c, NULL, 0, NULL), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(c);
}

static void test_args(void) {
  HixlConfig *c = (HixlConfig *)1;
  CU_ASSERT_EQUAL(HixlConfigParse("{}", 2, NULL, errs, MAXE, &nerr), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(HixlConfigParse(NULL, 5, &c, errs, MAXE, &nerr), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(c);
  CU_ASSERT_EQUAL(HixlConfigParseFile(NULL, &c, errs, MAXE, &nerr), HIXL_PARAM_INVALID);
  CU_ASSERT_EQUAL(HixlConfigParseFile("/x", NULL, errs, MAXE, &nerr), HIXL_PARAM_INVALID);
  const HixlOption *o;
  size_t n;
  CU_ASSERT_EQUAL(HixlConfigEngineOptions(NULL, &o, &n), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(HixlConfigKeyAt(1000));
}

/* ---- vLLM's shape ---- */

static void test_vllm_shape(void) {
  HixlConfig *c = NULL;
  const char *doc =
      "{\"kv_connector\": \"HixlConnector\", \"kv_role\": \"kv_producer\", \"kv_rank\": 0,\n"
      " \"kv_parallel_size\": 2, \"kv_load_failure_policy\": \"recompute\", \"engine_id\": \"e1\",\n"
      " \"kv_connector_extra_config\": {\"address\": \"10.0.0.1:16000\", \"lease_ms\": 60000,\n"
      "   \"RdmaTrafficClass\": \"104\"}}";
  CU_ASSERT_EQUAL_FATAL(parse(doc, &c), HIXL_SUCCESS);
  int64_t v = 0;
  CU_ASSERT_STRING_EQUAL(str_of(c, "role"), "producer");
  CU_ASSERT_STRING_EQUAL(str_of(c, "load_failure_policy"), "recompute");
  CU_ASSERT_STRING_EQUAL(str_of(c, "address"), "10.0.0.1:16000");
  CU_ASSERT_EQUAL(HixlConfigGetInt(c, "lease_ms", &v), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(v, 60000);
  CU_ASSERT_EQUAL(src_of(c, "role", NULL), HIXL_CONFIG_FROM_DOCUMENT);
  HixlConfigFree(c);
  /* Errors inside carry the full path and their own place. */
  ONE_ERROR("{\"kv_connector\": \"H\",\n \"kv_connector_extra_config\": {\n  \"lease_ms\": -1}}", 3, 15,
            "kv_connector_extra_config.lease_ms", "out of range");
  ONE_ERROR("{\"kv_role\": \"kv_consumer\", \"kv_connector_extra_config\": {\"role\": \"producer\"}}", 1, 13,
            "kv_role",
            "kv_role \"kv_consumer\" means role \"consumer\", but kv_connector_extra_config.role says");
  ONE_ERROR("{\"kv_role\": \"consumer\"}", 1, 13, "kv_role", "kv_producer | kv_consumer | kv_both");
  ONE_ERROR("{\"kv_connector\": \"H\", \"lease_ms\": 5}", 1, 23, "lease_ms",
            "goes inside kv_connector_extra_config");
  ONE_ERROR("{\"kv_connector\": \"H\", \"kv_rol\": \"kv_both\"}", 1, 23, "kv_rol",
            "did you mean \"kv_role\"?");
  ONE_ERROR("{\"kv_connector\": \"H\", \"kv_connector_extra_config\": [1]}", 1, 52,
            "kv_connector_extra_config", "expected an object");
  ONE_ERROR("{\"kv_connector\": 5}", 1, 18, "kv_connector", "expected a string");
  /* Agreeing twice is fine. */
  c = NULL;
  CU_ASSERT_EQUAL(
      parse("{\"kv_role\": \"kv_both\", \"kv_connector_extra_config\": {\"role\": \"both\"}}", &c),
      HIXL_SUCCESS);
  HixlConfigFree(c);
}

/* ---- environment ---- */

static void test_env(void) {
  HixlConfig *c = NULL;
  const char *env = NULL;
  setenv("HCCL_RDMA_TC", "104", 1);
  setenv("HCCL_RDMA_SL", "2", 1);
  CU_ASSERT_EQUAL_FATAL(parse("{\"RdmaServiceLevel\": 5}", &c), HIXL_SUCCESS);
  CU_ASSERT_STRING_EQUAL(str_of(c, "RdmaTrafficClass"), "104"); /* env over default */
  CU_ASSERT_EQUAL(src_of(c, "RdmaTrafficClass", &env), HIXL_CONFIG_FROM_ENV);
  CU_ASSERT_STRING_EQUAL(env ? env : "", "HCCL_RDMA_TC");
  CU_ASSERT_STRING_EQUAL(str_of(c, "RdmaServiceLevel"), "5"); /* document over env */
  CU_ASSERT_EQUAL(src_of(c, "RdmaServiceLevel", &env), HIXL_CONFIG_FROM_DOCUMENT);
  CU_ASSERT_PTR_NULL(env);
  HixlConfigFree(c);
  setenv("HCCL_RDMA_TC", "abc", 1);
  ONE_ERROR("{}", 0, 0, "RdmaTrafficClass", "environment HCCL_RDMA_TC=\"abc\"");
  setenv("HCCL_RDMA_TC", "130", 1);
  ONE_ERROR("{\"role\": \"both\"}", 0, 0, "RdmaTrafficClass", "not a multiple of 4");
  c = NULL; /* a bad env value does not matter when the document sets the key */
  CU_ASSERT_EQUAL(parse("{\"RdmaTrafficClass\": 8}", &c), HIXL_SUCCESS);
  HixlConfigFree(c);
  unsetenv("HCCL_RDMA_TC");
  unsetenv("HCCL_RDMA_SL");
  c = NULL;
  CU_ASSERT_EQUAL_FATAL(parse("{}", &c), HIXL_SUCCESS);
  CU_ASSERT_STRING_EQUAL(str_of(c, "RdmaTrafficClass"), "132");
  CU_ASSERT_EQUAL(src_of(c, "RdmaTrafficClass", NULL), HIXL_CONFIG_FROM_DEFAULT);
  HixlConfigFree(c);
}

/* ---- the round trip to the engine ---- */

static void test_engine_options(void) {
  HixlConfig *c = NULL;
  /* StagingUnregistered on needs a key: both documents take it from the environment. */
  CU_ASSERT_FATAL(tu_key_file() && setenv("HIXL_AUTH_KEY_FILE", tu_key_file(), 1) == 0);
  CU_ASSERT_EQUAL_FATAL(
      parse("{\"address\": \"127.0.0.1\", \"Transport\": \"tcp\", \"RdmaTrafficClass\": 104,"
            " \"BufferPool\": \"2:1\", \"StagingUnregistered\": true}",
            &c),
      HIXL_SUCCESS);
  const HixlOption *o = NULL;
  size_t n = 0, ne = 0;
  HixlEngineOptionTable(&ne);
  CU_ASSERT_EQUAL(HixlConfigEngineOptions(c, &o, &n), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(n, ne); /* every engine option, each explicit */
  bool tc = false, pool = false;
  for (size_t i = 0; i < n; i++) {
    CU_ASSERT_EQUAL(HixlEngineCheckOption(o[i].key, o[i].value), HIXL_SUCCESS);
    tc |= strcmp(o[i].key, "RdmaTrafficClass") == 0 && strcmp(o[i].value, "104") == 0;
    pool |= strcmp(o[i].key, "BufferPool") == 0 && strcmp(o[i].value, "2:1") == 0;
  }
  CU_ASSERT_TRUE(tc);
  CU_ASSERT_TRUE(pool);
  /* An engine takes them, and behaves as one given the same options: it moves bytes
   * to a second engine configured from a document too. */
  HixlEngine *a = NULL, *b = NULL;
  char addr[TU_ADDR_LEN], doc[256];
  tu_addr(addr, sizeof(addr), tu_free_port());
  snprintf(doc, sizeof(doc), "{\"address\": \"%s\", \"Transport\": \"tcp\"}", addr);
  HixlConfig *cb = NULL;
  CU_ASSERT_EQUAL_FATAL(parse(doc, &cb), HIXL_SUCCESS);
  const HixlOption *ob;
  size_t nb;
  HixlConfigEngineOptions(cb, &ob, &nb);
  CU_ASSERT_EQUAL_FATAL(HixlEngineCreate(&a), HIXL_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(HixlEngineCreate(&b), HIXL_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(HixlEngineInitialize(a, str_of(c, "address"), o, n), HIXL_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(HixlEngineInitialize(b, str_of(cb, "address"), ob, nb), HIXL_SUCCESS);
  static unsigned char src[4096], dst[4096];
  tu_fill(src, sizeof(src), 7);
  memset(dst, 0, sizeof(dst));
  HixlMemHandle ha, hb;
  HixlMemDesc ma = {(uintptr_t)src, sizeof(src)}, mb = {(uintptr_t)dst, sizeof(dst)};
  CU_ASSERT_EQUAL(HixlEngineRegisterMem(a, &ma, HIXL_MEM_HOST, &ha), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(HixlEngineRegisterMem(b, &mb, HIXL_MEM_HOST, &hb), HIXL_SUCCESS);
  CU_ASSERT_EQUAL_FATAL(HixlEngineConnect(a, addr, 5000), HIXL_SUCCESS);
  HixlTransferOpDesc op = {(uintptr_t)src, (uintptr_t)dst, sizeof(src)};
  CU_ASSERT_EQUAL(HixlEngineTransferSync(a, addr, HIXL_WRITE, &op, 1, 5000), HIXL_SUCCESS);
  CU_ASSERT_EQUAL(tu_check_pattern(dst, sizeof(dst), 7), -1);
  HixlEngineDestroy(a);
  HixlEngineDestroy(b);
  HixlConfigFree(c);
  HixlConfigFree(cb);
  unsetenv("HIXL_AUTH_KEY_FILE");
}

/* ---- files ---- */

/* A document of unknown keys, as many as HIXL_CONFIG_MAX_KEYS, gets its errors (each with
 * a suggestion search); one more key is refused whole (issue 28: 90,000 keys took 25 s,
 * the search for a repeated key and each error's place being linear per key). */
static void test_many_keys(void) {
  size_t cap = (size_t)HIXL_CONFIG_MAX_KEYS * 16 + 64, len = 0;
  char *doc = malloc(cap);
  CU_ASSERT_FATAL(doc != NULL);
  HixlConfig *c = NULL;
  for (int extra = 0; extra < 2; extra++) {
    len = 0;
    doc[len++] = '{';
    for (unsigned i = 0; i < HIXL_CONFIG_MAX_KEYS + (unsigned)extra; i++)
      len += (size_t)snprintf(doc + len, cap - len, "%s\"k%u\": 1", i ? "," : "", i);
    doc[len++] = '}';
    CU_ASSERT_EQUAL(HixlConfigParse(doc, len, &c, errs, MAXE, &nerr), HIXL_PARAM_INVALID);
    CU_ASSERT_PTR_NULL(c);
    if (extra) {
      CU_ASSERT_EQUAL(nerr, 1);
      CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "more than 4096 keys"));
    } else {
      CU_ASSERT_EQUAL(nerr, HIXL_CONFIG_MAX_KEYS); /* every one counted, MAXE of them said */
      CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "unknown key"));
    }
  }
  free(doc);
}

/* Every error's line:column comes from one pass over the text, then a search per place
 * (steps counted by jscan_line_steps, not timed): each place was a walk from the text's
 * start, and a 1 MiB document of newlines, then a key repeated 4,000 times took 2 s
 * (about 8,000 walks of 1 MiB: the repeated key's first place was looked up for every
 * repetition, whatever max_errors). The places stay right past a million lines. */
static void test_places_linear(void) {
  size_t cap = (size_t)HIXL_CONFIG_MAX_BYTES, len = 0, pad = 0;
  char *doc = malloc(cap);
  CU_ASSERT_FATAL(doc != NULL);
  const char *head = "{\"a\": {\"b\": 1}", *rep = ",\n\"lease_ms\": 1, \"a.b\": 1";
  unsigned n = 2000;
  pad = cap - strlen(head) - n * strlen(rep) - 2;
  doc[len++] = '{';
  memset(doc + len, '\n', pad);
  len += pad;
  len += (size_t)snprintf(doc + len, cap - len, "%s", head + 1);
  for (unsigned i = 0; i < n; i++) len += (size_t)snprintf(doc + len, cap - len, "%s", rep);
  doc[len++] = '}';
  CU_ASSERT_FATAL(len <= cap);
  HixlConfig *c = (HixlConfig *)1;
  jscan_line_steps = 0;
  CU_ASSERT_EQUAL(HixlConfigParse(doc, len, &c, errs, MAXE, &nerr), HIXL_PARAM_INVALID);
  size_t steps = jscan_line_steps;
  CU_ASSERT_PTR_NULL(c);
  CU_ASSERT_EQUAL(nerr, 2 * (n - 1) + 2); /* each repetition; "a" and "a.b" unknown */
  CU_ASSERT_TRUE(steps <= 2 * len);
  if (steps > 2 * len) fprintf(stderr, "  %zu steps for a text of %zu bytes\n", steps, len);
  /* The first MAXE errors found, in document order: the repetitions on line pad + 3 (the
   * text after the newlines is on line pad + 1, the first repetition's first on pad + 2). */
  char first[64];
  CU_ASSERT_EQUAL(errs[0].line, pad + 3);
  CU_ASSERT_EQUAL(errs[0].column, 1);
  CU_ASSERT_STRING_EQUAL(errs[0].path, "lease_ms");
  snprintf(first, sizeof(first), "first at %zu:1)", pad + 2);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, first));
  CU_ASSERT_EQUAL(errs[1].line, pad + 3);
  CU_ASSERT_EQUAL(errs[1].column, 16);
  CU_ASSERT_STRING_EQUAL(errs[1].path, "a.b");
  snprintf(first, sizeof(first), "first at %zu:16)", pad + 2);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[1].message, first));
  free(doc);
}

/* A key whose path is HIXL_CONFIG_MAX_PATH bytes is an unknown key, placed; one byte more
 * is refused whole. Each member below a key held that key in its path, and the search for
 * a repeated key compared whole paths: a 16 kB key above 4,095 members took seconds, a
 * 40 kB one 26 s (160 MB), a key of most of 1 MiB minutes and gigabytes. */
static void test_long_paths(void) {
  size_t klen = 16 * 1024, cap = klen + (size_t)HIXL_CONFIG_MAX_KEYS * 16 + 64, len = 0;
  char *doc = malloc(cap), *key = malloc(klen + 1);
  CU_ASSERT_FATAL(doc != NULL && key != NULL);
  memset(key, 'k', klen);
  key[klen] = '\0';
  HixlConfig *c = (HixlConfig *)1;
  for (int extra = 0; extra < 2; extra++) {
    /* at the top, and inside kv_connector_extra_config (its path: "kv_connector_extra_config.") */
    snprintf(doc, cap, "{\"%.*s\": 1}", HIXL_CONFIG_MAX_PATH + extra, key);
    CU_ASSERT_EQUAL(parse(doc, &c), HIXL_PARAM_INVALID);
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_EQUAL(nerr, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, extra ? "longer than 1024 bytes" : "unknown key \"kkkk"));
    CU_ASSERT_EQUAL(errs[0].line, extra ? 0 : 1);
    snprintf(doc, cap, "{\"kv_connector\": \"x\", \"kv_connector_extra_config\": {\"%.*s\": 1}}",
             HIXL_CONFIG_MAX_PATH - 26 + extra, key);
    CU_ASSERT_EQUAL(parse(doc, &c), HIXL_PARAM_INVALID);
    CU_ASSERT_EQUAL(nerr, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, extra ? "longer than 1024 bytes" : "unknown key \"kkkk"));
    CU_ASSERT_EQUAL(errs[0].column, extra ? 0 : 53);
  }
  /* a long key above as many members as allowed: refused at once, one error */
  len = (size_t)snprintf(doc, cap, "{\"%s\": {", key);
  for (unsigned i = 0; i + 1 < HIXL_CONFIG_MAX_KEYS; i++)
    len += (size_t)snprintf(doc + len, cap - len, "%s\"%x\": 1", i ? "," : "", i);
  len += (size_t)snprintf(doc + len, cap - len, "}}");
  CU_ASSERT_EQUAL(HixlConfigParse(doc, len, &c, errs, MAXE, &nerr), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NULL(c);
  CU_ASSERT_EQUAL(nerr, 1);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "longer than 1024 bytes"));
  free(key);
  free(doc);
}

static void test_files(void) {
  char dir[] = "/tmp/hixl-config-XXXXXX", path[128];
  HixlConfig *c = (HixlConfig *)1;
  CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/missing.json", dir);
  CU_ASSERT_EQUAL(HixlConfigParseFile(path, &c, errs, MAXE, &nerr), HIXL_FAILED);
  CU_ASSERT_PTR_NULL(c);
  CU_ASSERT_EQUAL(nerr, 1);
  CU_ASSERT_EQUAL(errs[0].line, 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "No such file"));
  CU_ASSERT_EQUAL(HixlConfigParseFile(dir, &c, errs, MAXE, &nerr), HIXL_FAILED);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "not a regular file"));
  /* empty */
  snprintf(path, sizeof(path), "%s/empty.json", dir);
  int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
  CU_ASSERT_FATAL(fd >= 0);
  close(fd);
  CU_ASSERT_EQUAL(HixlConfigParseFile(path, &c, errs, MAXE, &nerr), HIXL_PARAM_INVALID);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "empty"));
  /* unreadable (as root, permissions do not stop reading: checked only as another user) */
  if (geteuid() != 0) {
    chmod(path, 0);
    CU_ASSERT_EQUAL(HixlConfigParseFile(path, &c, errs, MAXE, &nerr), HIXL_FAILED);
    CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "Permission denied"));
  }
  unlink(path);
  /* over 1 MiB */
  snprintf(path, sizeof(path), "%s/big.json", dir);
  FILE *f = fopen(path, "w");
  CU_ASSERT_PTR_NOT_NULL_FATAL(f);
  fputc('{', f);
  for (size_t i = 0; i < HIXL_CONFIG_MAX_BYTES; i++) fputc(' ', f);
  fputc('}', f);
  fclose(f);
  CU_ASSERT_EQUAL(HixlConfigParseFile(path, &c, errs, MAXE, &nerr), HIXL_FAILED);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "at most 1048576"));
  unlink(path);
  /* a FIFO nobody writes: refused at once (it waited for a writer forever, issue 28) */
  snprintf(path, sizeof(path), "%s/fifo.json", dir);
  CU_ASSERT_FATAL(mkfifo(path, 0600) == 0);
  CU_ASSERT_EQUAL(HixlConfigParseFile(path, &c, errs, MAXE, &nerr), HIXL_FAILED);
  CU_ASSERT_PTR_NOT_NULL(strstr(errs[0].message, "not a regular file"));
  unlink(path);
  /* a good one, with its errors' places in lines */
  snprintf(path, sizeof(path), "%s/ok.json", dir);
  f = fopen(path, "w");
  CU_ASSERT_PTR_NOT_NULL_FATAL(f);
  fputs("{\n  \"role\": \"consumer\",\n  \"lease_ms\": 100\n}\n", f);
  fclose(f);
  CU_ASSERT_EQUAL(HixlConfigParseFile(path, &c, errs, MAXE, &nerr), HIXL_SUCCESS);
  CU_ASSERT_STRING_EQUAL(str_of(c, "role"), "consumer");
  HixlConfigFree(c);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  unsetenv("HCCL_RDMA_TC");
  unsetenv("HCCL_RDMA_SL");
  CU_TestInfo table[] = {
      {"every key has a valid default", test_defaults},
      {"every engine option is a key", test_engine_rows},
      {"valid values read back typed", test_values},
      {"the observer's keys", test_obs_keys},
      {"each invalid value: path, line:column, what is allowed", test_bad_values},
      {"bad documents", test_bad_documents},
      {"duplicate keys", test_duplicates},
      {"unknown keys and suggestions", test_unknown_keys},
      {"an unknown key's place: however long, whatever its escapes", test_unknown_key_places},
      {"a dotted key is one name: each member keeps its place", test_dotted_keys},
      {"an integer past int64 quoted as written", test_big_integers},
      {"a key or value in a message: escaped", test_quoted_escaped},
      {"a long key or value in a message: cut, what is allowed kept", test_quoted_cut},
      {"every error of a document at once", test_all_errors},
      {"arguments", test_args},
      {"vLLM's --kv-transfer-config shape", test_vllm_shape},
      {"document, then environment, then default", test_env},
      {"engine options an engine takes", test_engine_options},
      {"files", test_files},
      {"as many keys as allowed, then one more", test_many_keys},
      {"a key path as long as allowed, then one byte more", test_long_paths},
      {"errors' places: one pass over the text, not one per place", test_places_linear},
      CU_TEST_INFO_NULL};
  CU_SuiteInfo suites[] = {{"config", NULL, NULL, NULL, NULL, table}, CU_SUITE_INFO_NULL};
  if (CU_initialize_registry() != CUE_SUCCESS || CU_register_suites(suites) != CUE_SUCCESS) return 1;
  return tu_run_registry();
}
