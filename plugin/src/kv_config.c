/* kv_config: the plugin's view of its JSON configuration. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_int.h"

static const char *const engine_keys[] = {"BufferPool",       "RdmaTrafficClass",   "RdmaServiceLevel",
                                          "Transport",        "RdmaDevice",         "RdmaGidIndex",
                                          "StagingThreshold", "StagingUnregistered"};
#define N_ENGINE_KEYS (sizeof(engine_keys) / sizeof(engine_keys[0]))

hixl_kv_status kv_config_load(const char *json, size_t len, struct kv_cfg *cfg, char *err, size_t cap) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->producer = cfg->consumer = true;
  cfg->lease_ms = 30000;
  cfg->max_inflight = 64;
  cfg->pipelining = true;
  cfg->connect_timeout_ms = cfg->transfer_timeout_ms = cfg->notify_timeout_ms = 1000;
  struct json_tokener *tok = json_tokener_new();
  json_object *o = tok ? json_tokener_parse_ex(tok, json, (int)len) : NULL;
  if (!o || json_tokener_get_error(tok) != json_tokener_success ||
      !json_object_is_type(o, json_type_object)) {
    snprintf(err, cap, "the configuration is not a whole JSON object");
    json_object_put(o);
    if (tok) json_tokener_free(tok);
    return HIXL_KV_PARAM_INVALID;
  }
  json_tokener_free(tok);
  HixlOption *opts = calloc(N_ENGINE_KEYS, sizeof(*opts));
  char **vals = calloc(N_ENGINE_KEYS, sizeof(*vals));
  hixl_kv_status st = HIXL_KV_SUCCESS;
  json_object_object_foreach(o, key, val) {
    const char *s = json_object_get_string(val);
    int64_t n = json_object_get_int64(val);
    size_t k = 0;
    while (k < N_ENGINE_KEYS && strcmp(key, engine_keys[k]) != 0) k++;
    if (k < N_ENGINE_KEYS) {
      vals[cfg->nopts] = strdup(s);
      opts[cfg->nopts] = (HixlOption){engine_keys[k], vals[cfg->nopts]};
      cfg->nopts++;
    } else if (strcmp(key, "address") == 0) {
      snprintf(cfg->address, sizeof(cfg->address), "%s", s);
    } else if (strcmp(key, "role") == 0) {
      cfg->producer = strcmp(s, "producer") == 0 || strcmp(s, "both") == 0;
      cfg->consumer = strcmp(s, "consumer") == 0 || strcmp(s, "both") == 0;
    } else if (strcmp(key, "mode") == 0) {
      cfg->push = strcmp(s, "push") == 0;
    } else if (strcmp(key, "lease_ms") == 0) {
      cfg->lease_ms = (uint32_t)n;
    } else if (strcmp(key, "load_failure_policy") == 0) {
      cfg->recompute = strcmp(s, "recompute") == 0;
    } else if (strcmp(key, "transfer_timeout_ms") == 0) {
      cfg->transfer_timeout_ms = (int32_t)n;
    } else if (strcmp(key, "connect_timeout_ms") == 0) {
      cfg->connect_timeout_ms = (int32_t)n;
    } else if (strcmp(key, "notify_timeout_ms") == 0) {
      cfg->notify_timeout_ms = (int32_t)n;
    } else {
      snprintf(err, cap, "unknown key \"%s\"", key);
      st = HIXL_KV_PARAM_INVALID;
    }
  }
  json_object_put(o);
  cfg->opts = opts;
  cfg->opts_owner = vals;
  if (st != HIXL_KV_SUCCESS) kv_config_free(cfg);
  return st;
}

void kv_config_free(struct kv_cfg *cfg) {
  char **vals = cfg->opts_owner;
  for (size_t i = 0; vals && i < cfg->nopts; i++) free(vals[i]);
  free(vals);
  free(cfg->opts);
  cfg->opts = NULL;
  cfg->opts_owner = NULL;
  cfg->nopts = 0;
}
