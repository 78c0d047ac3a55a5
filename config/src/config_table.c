/* config_table: the key table (the connector's keys, then the engine's options); values checked by it. */
/* One row per key names its type, default, environment variable, range and doc; the
 * same rows drive parsing (config_parse.c), HixlConfigPrint and the reference
 * (config.c). A value's text is checked here, whether it came from the document, the
 * environment or the default. */
#include "config_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the table ---- */

/* The connector's engine address: it listens there and hands it to peers (a request's
 * remote_engine), so it names one host: not 0.0.0.0, multicast or broadcast. The port
 * is 1 to 5 digits, nothing else (the engine's own parser takes no more). */
static bool check_address(const char *s, char *why, size_t cap) {
  char ip[INET_ADDRSTRLEN + 1], q[CFG_QUOTE_CAP];
  const char *colon = strchr(s, ':');
  size_t n = colon ? (size_t)(colon - s) : strlen(s);
  struct in_addr a;
  if (n == 0 || n >= sizeof(ip)) {
    snprintf(why, cap, "\"%s\" is not \"ip\" or \"ip:port\"", cfg_escape(q, sizeof(q), s));
    return false;
  }
  memcpy(ip, s, n);
  ip[n] = '\0';
  if (inet_pton(AF_INET, ip, &a) != 1) {
    snprintf(why, cap, "\"%s\" is not an IPv4 address", cfg_escape(q, sizeof(q), ip));
    return false;
  }
  uint32_t h = ntohl(a.s_addr);
  if (h == 0 || h == UINT32_MAX || (h >> 28) == 0xe) {
    snprintf(why, cap, "%s is not one host's address (a wildcard, broadcast or multicast one): peers dial it",
             ip);
    return false;
  }
  if (colon) {
    size_t digits = strspn(colon + 1, "0123456789");
    unsigned long port = digits && digits <= 5 ? strtoul(colon + 1, NULL, 10) : 65536;
    if (colon[1 + digits] || port > 65535) {
      snprintf(why, cap, "port \"%s\" is not in [0,65535]", cfg_escape(q, sizeof(q), colon + 1));
      return false;
    }
  }
  return true;
}

#define MS_MAX 86400000 /* one day */

static bool check_path(const char *s, char *why, size_t cap) {
  if (strlen(s) < 256) return true;
  snprintf(why, cap, "a path of %zu bytes; at most 255", strlen(s));
  return false;
}

static const struct row key_rows[] = {
    {{"address", HIXL_CONFIG_STRING, "", NULL, "\"ip\" or \"ip:port\" (IPv4, port in [0,65535]); \"\" unset",
      "the engine's address; the connector's rank r listens on port + r"},
     0,
     0,
     check_address,
     false,
     false},
    {{"role", HIXL_CONFIG_ENUM, "both", NULL, "producer | consumer | both",
      "the connector's part: a prefill instance produces KV cache, a decode instance consumes it"},
     0,
     0,
     NULL,
     false,
     false},
    {{"mode", HIXL_CONFIG_ENUM, "pull", NULL, "pull | push",
      "pull: the consumer reads the producer's blocks; push: the producer writes them layer by layer"},
     0,
     0,
     NULL,
     false,
     false},
    {{"lease_ms", HIXL_CONFIG_INT, "30000", NULL, "[1,86400000]",
      "a producer frees blocks no consumer took within this time"},
     1,
     MS_MAX,
     NULL,
     false,
     false},
    {{"load_failure_policy", HIXL_CONFIG_ENUM, "fail", NULL, "fail | recompute",
      "a load that fails fails its request, or reports 0 tokens so the runtime recomputes them"},
     0,
     0,
     NULL,
     false,
     false},
    {{"max_inflight_requests", HIXL_CONFIG_INT, "1024", NULL, "[1,1048576]",
      "a producer holds at most this many requests for consumers, and a worker holds (pull) or "
      "expects (push) at most as many; beyond that a finished request's blocks are freed at once, "
      "or a push is refused, and its consumer recomputes"},
     1,
     1048576,
     NULL,
     false,
     false},
    {{"loads_per_producer", HIXL_CONFIG_INT, "1", NULL, "[1,8]",
      "pull mode: a consumer rank pulls at most this many requests from one producer rank at once; "
      "more overlap one's PIN and FREE with another's data, but share the link: each request takes "
      "longer"},
     1,
     8,
     NULL,
     false,
     false},
    {{"layer_pipelining", HIXL_CONFIG_BOOL, "true", NULL, "true | false",
      "push mode: send each layer as it is saved (true) or all layers after the last (false)"},
     0,
     0,
     NULL,
     false,
     false},
    {{"load_in_forward", HIXL_CONFIG_BOOL, "false", NULL, "true | false",
      "pull mode: a consumer loads each request in the forward pass that computes it (the runtime's "
      "synchronous load): the request runs in the step that loads it, not steps after the load ends, "
      "while that forward pass, and every request in it, waits for the transfer (docs/vllm.md)"},
     0,
     0,
     NULL,
     false,
     false},
    {{"required_kv_layout", HIXL_CONFIG_ENUM, "any", NULL, "any | HND",
      "what get_required_kvcache_layout asks of the runtime: HND (each head's tokens together) lets "
      "instances of different tensor-parallel sizes hand KV over (docs/plugin.md)"},
     0,
     0,
     NULL,
     false,
     false},
    {{"kv_memory", HIXL_CONFIG_ENUM, "host", NULL, "host | device",
      "what the KV caches handed to register_kv_caches / register_kv_groups are: host memory, or device "
      "memory (CUDA; moved through host buffers: docs/device-memory.md); alloc_kv_caches and "
      "alloc_kv_memory give host memory only"},
     0,
     0,
     NULL,
     false,
     false},
    {{"connect_timeout_ms", HIXL_CONFIG_INT, "1000", NULL, "[1,86400000]", "linking to a peer engine"},
     1,
     MS_MAX,
     NULL,
     false,
     false},
    {{"transfer_timeout_ms", HIXL_CONFIG_INT, "1000", NULL, "[1,86400000]",
      "one request's transfer, from its first ask to its last byte (push: each layer with its landed "
      "notice)"},
     1,
     MS_MAX,
     NULL,
     false,
     false},
    {{"notify_timeout_ms", HIXL_CONFIG_INT, "1000", NULL, "[1,86400000]",
      "one control message to a peer (pin, free, accept, abort)"},
     1,
     MS_MAX,
     NULL,
     false,
     false},
    {{"metrics", HIXL_CONFIG_BOOL, "true", NULL, "true | false",
      "worker: keep histograms and failure counters (render_metrics, docs/observability.md)"},
     0,
     0,
     NULL,
     false,
     false},
    {{"trace_ring", HIXL_CONFIG_INT, "1024", NULL, "[0,1048576]",
      "worker: finished per-request traces kept for drain_traces (the oldest dropped beyond); 0: none "
      "kept (trace_file still gets them)"},
     0,
     1048576,
     NULL,
     false,
     false},
    {{"trace_file", HIXL_CONFIG_STRING, "", "HIXL_KV_TRACE_FILE", "a path; \"\" none",
      "worker: finished traces are also appended to this file, one JSON line each (trace_ring 0 too); "
      "created 0600; a file of another user's, writable by others or a link is refused; several processes "
      "may share it"},
     0,
     0,
     check_path,
     false,
     false},
};
#define N_KEY_ROWS (sizeof(key_rows) / sizeof(key_rows[0]))

/* Which engine options take a JSON number or boolean, from their range in the engine's
 * table (a list of them here fell behind it: nine numeric options refused numbers): a
 * number where the range is a bracketed number range ("[0,7]", "auto, or [0,255]"; not
 * a quoted text form such as BufferPool's "NUM:SIZE_MB"), a boolean where it is "on | off". */
static bool engine_takes_int(const char *range) {
  const char *b = strchr(range, '[');
  return range[0] != '"' && b && b[1] >= '0' && b[1] <= '9';
}

static bool engine_takes_bool(const char *range) { return strcmp(range, "on | off") == 0; }

struct row cfg_rows[MAX_ROWS];
size_t cfg_n_rows;
pthread_once_t cfg_rows_once = PTHREAD_ONCE_INIT;

bool cfg_in_list(const char *s, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(s, list[i]) == 0) return true;
  return false;
}

void cfg_rows_init(void) {
  size_t ne = 0;
  const HixlEngineOptionInfo *eo = HixlEngineOptionTable(&ne);
  memcpy(cfg_rows, key_rows, sizeof(key_rows));
  cfg_n_rows = N_KEY_ROWS;
  for (size_t i = 0; i < ne && cfg_n_rows < MAX_ROWS; i++, cfg_n_rows++) {
    cfg_rows[cfg_n_rows] =
        (struct row){{eo[i].name, HIXL_CONFIG_ENGINE, eo[i].def, eo[i].env, eo[i].range, eo[i].doc},
                     0,
                     0,
                     NULL,
                     engine_takes_int(eo[i].range),
                     engine_takes_bool(eo[i].range)};
  }
}

const struct row *cfg_row_find(const char *name, size_t *index) {
  pthread_once(&cfg_rows_once, cfg_rows_init);
  for (size_t i = 0; i < cfg_n_rows; i++)
    if (strcmp(cfg_rows[i].info.name, name) == 0) {
      if (index) *index = i;
      return &cfg_rows[i];
    }
  return NULL;
}

const HixlConfigKeyInfo *HixlConfigKeyAt(size_t i) {
  pthread_once(&cfg_rows_once, cfg_rows_init);
  return i < cfg_n_rows ? &cfg_rows[i].info : NULL;
}

/* ---- values ---- */

static bool enum_has(const char *range, const char *s) {
  size_t n = strlen(s);
  for (const char *p = range; *p;) {
    while (*p == ' ' || *p == '|') p++;
    const char *e = p;
    while (*e && *e != ' ' && *e != '|') e++;
    if ((size_t)(e - p) == n && n > 0 && strncmp(p, s, n) == 0) return true;
    p = e;
  }
  return false;
}

/* Validate text for row r (text came from src: a document value or an env var).
 * On success set v. */
bool cfg_take_text(const struct row *r, const char *text, struct val *v, char *why, size_t cap) {
  const HixlConfigKeyInfo *k = &r->info;
  char q[CFG_QUOTE_CAP]; /* text, as a message quotes it */
  switch (k->type) {
  case HIXL_CONFIG_STRING:
    if (r->check && *text && !r->check(text, why, cap)) return false;
    break;
  case HIXL_CONFIG_ENUM:
    if (!enum_has(k->range, text)) {
      snprintf(why, cap, "\"%s\" is not one of: %s", cfg_escape(q, sizeof(q), text), k->range);
      return false;
    }
    break;
  case HIXL_CONFIG_INT: {
    char *end;
    errno = 0;
    long long n = strtoll(text, &end, 10);
    if (!*text || *end || errno || *text == ' ' || *text == '+') {
      snprintf(why, cap, "\"%s\" is not an integer: expected %s", cfg_escape(q, sizeof(q), text), k->range);
      return false;
    }
    if (n < r->min || n > r->max) {
      snprintf(why, cap, "%lld is out of range: expected %s", n, k->range);
      return false;
    }
    v->num = n;
    break;
  }
  case HIXL_CONFIG_BOOL:
    if (strcmp(text, "true") != 0 && strcmp(text, "false") != 0) {
      snprintf(why, cap, "\"%s\" is not true or false", cfg_escape(q, sizeof(q), text));
      return false;
    }
    v->num = strcmp(text, "true") == 0;
    break;
  case HIXL_CONFIG_ENGINE:
    if (HixlEngineCheckOption(k->name, text) != HIXL_SUCCESS) {
      char *end;
      long n = strtol(text, &end, 10);
      if (strcmp(k->name, "RdmaTrafficClass") == 0 && *text && !*end && n >= 0 && n <= 255 && n % 4)
        snprintf(why, cap,
                 "%ld is not a multiple of 4 (the low 2 bits of the traffic class are ECN): expected %s", n,
                 k->range);
      else
        snprintf(why, cap, "\"%s\" is not valid: expected %s", cfg_escape(q, sizeof(q), text), k->range);
      return false;
    }
    break;
  }
  v->text = strdup(text);
  if (!v->text) {
    snprintf(why, cap, "out of memory");
    return false;
  }
  return true;
}
