/* kv_config: the plugin's view of its JSON configuration, read through
 * libhixl-config (one key table for the plugin, hixl-config and docs/config.md). */
#include <stdio.h>
#include <string.h>

#include "hixl/hixl_config.h"
#include "kv_int.h"

static int64_t get_int(const HixlConfig *c, const char *key) {
  int64_t v = 0;
  HixlConfigGetInt(c, key, &v);
  return v;
}

static const char *get_str(const HixlConfig *c, const char *key) {
  const char *v = "";
  HixlConfigGetString(c, key, &v);
  return v;
}

hixl_kv_status kv_config_load(const char *json, size_t len, struct kv_cfg *cfg, char *err, size_t cap) {
  HixlConfigError e[1];
  size_t nerr = 0;
  HixlConfig *c = NULL;
  memset(cfg, 0, sizeof(*cfg));
  if (HixlConfigParse(json, len, &c, e, 1, &nerr) != HIXL_SUCCESS) {
    char where[48] = "";
    if (nerr == 0) { /* only an argument error leaves none */
      snprintf(err, cap, "the configuration could not be parsed");
      return HIXL_KV_PARAM_INVALID;
    }
    if (e[0].line) snprintf(where, sizeof(where), "%u:%u: ", e[0].line, e[0].column);
    snprintf(err, cap, "configuration %s%s%s%s%s", where, e[0].path, e[0].path[0] ? ": " : "", e[0].message,
             nerr > 1 ? " (and more: `hixl-config check` lists them all)" : "");
    return HIXL_KV_PARAM_INVALID;
  }
  int pipelining = 1, metrics = 1, in_forward = 0;
  HixlConfigGetBool(c, "layer_pipelining", &pipelining);
  HixlConfigGetBool(c, "load_in_forward", &in_forward);
  HixlConfigGetBool(c, "metrics", &metrics);
  cfg->metrics = metrics != 0;
  cfg->trace_ring = (uint32_t)get_int(c, "trace_ring");
  snprintf(cfg->trace_file, sizeof(cfg->trace_file), "%s", get_str(c, "trace_file"));
  snprintf(cfg->address, sizeof(cfg->address), "%s", get_str(c, "address"));
  const char *role = get_str(c, "role");
  cfg->producer = strcmp(role, "consumer") != 0;
  cfg->consumer = strcmp(role, "producer") != 0;
  cfg->push = strcmp(get_str(c, "mode"), "push") == 0;
  cfg->recompute = strcmp(get_str(c, "load_failure_policy"), "recompute") == 0;
  cfg->lease_ms = (uint32_t)get_int(c, "lease_ms");
  cfg->max_inflight = (uint32_t)get_int(c, "max_inflight_requests");
  cfg->per_producer = (uint32_t)get_int(c, "loads_per_producer");
  cfg->pipelining = pipelining != 0;
  cfg->load_in_forward = in_forward != 0;
  cfg->hnd = strcmp(get_str(c, "required_kv_layout"), "HND") == 0;
  cfg->kv_device = strcmp(get_str(c, "kv_memory"), "device") == 0;
  cfg->connect_timeout_ms = (int32_t)get_int(c, "connect_timeout_ms");
  cfg->transfer_timeout_ms = (int32_t)get_int(c, "transfer_timeout_ms");
  cfg->notify_timeout_ms = (int32_t)get_int(c, "notify_timeout_ms");
  if (cfg->push && cfg->load_in_forward) {
    HixlConfigFree(c);
    snprintf(err, cap,
             "configuration load_in_forward: for mode pull only (a push lands each layer while the "
             "forward pass runs already)");
    return HIXL_KV_PARAM_INVALID;
  }
  const HixlOption *opts = NULL;
  HixlConfigEngineOptions(c, &opts, &cfg->nopts);
  cfg->opts = (HixlOption *)opts;
  cfg->opts_owner = c;
  return HIXL_KV_SUCCESS;
}

void kv_config_free(struct kv_cfg *cfg) {
  HixlConfigFree(cfg->opts_owner);
  cfg->opts = NULL;
  cfg->opts_owner = NULL;
  cfg->nopts = 0;
}
