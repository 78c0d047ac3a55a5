/* config: a configuration's life, its values read back, and printing it (HixlConfigPrint, the reference). */
/* The module turns a JSON document into hixl's typed configuration, by one table of
 * keys (config_table.c: key_rows, then one row per engine option from
 * HixlEngineOptionTable). The table drives parsing (config_parse.c), validation,
 * defaults, environment variables, HixlConfigPrint and the reference. */
#include "hixl/hixl_config.h"

#include <inttypes.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "config_int.h"

/* ---- the configuration ---- */

void HixlConfigFree(HixlConfig *c) {
  if (!c) return;
  for (size_t i = 0; i < c->n; i++) free(c->v[i].text);
  free(c);
}

/* ---- reading it ---- */

static const struct val *val_of(const HixlConfig *c, const char *key, const struct row **r, HixlStatus *st) {
  size_t idx;
  *st = HIXL_PARAM_INVALID;
  if (!c || !key) return NULL;
  if (!(*r = cfg_row_find(key, &idx))) {
    *st = HIXL_NOT_FOUND;
    return NULL;
  }
  *st = HIXL_SUCCESS;
  return &c->v[idx];
}

HixlStatus HixlConfigGetString(const HixlConfig *c, const char *key, const char **value) {
  const struct row *r;
  HixlStatus st;
  const struct val *v = val_of(c, key, &r, &st);
  if (!v || !value) return v ? HIXL_PARAM_INVALID : st;
  *value = v->text;
  return HIXL_SUCCESS;
}

HixlStatus HixlConfigGetInt(const HixlConfig *c, const char *key, int64_t *value) {
  const struct row *r;
  HixlStatus st;
  const struct val *v = val_of(c, key, &r, &st);
  if (!v || !value || r->info.type != HIXL_CONFIG_INT) return v ? HIXL_PARAM_INVALID : st;
  *value = v->num;
  return HIXL_SUCCESS;
}

HixlStatus HixlConfigGetBool(const HixlConfig *c, const char *key, int *value) {
  const struct row *r;
  HixlStatus st;
  const struct val *v = val_of(c, key, &r, &st);
  if (!v || !value || r->info.type != HIXL_CONFIG_BOOL) return v ? HIXL_PARAM_INVALID : st;
  *value = (int)v->num;
  return HIXL_SUCCESS;
}

HixlStatus HixlConfigGetSource(const HixlConfig *c, const char *key, HixlConfigSource *source,
                               const char **env) {
  const struct row *r;
  HixlStatus st;
  const struct val *v = val_of(c, key, &r, &st);
  if (!v || !source) return v ? HIXL_PARAM_INVALID : st;
  *source = v->src;
  if (env) *env = v->src == HIXL_CONFIG_FROM_ENV ? r->info.env : NULL;
  return HIXL_SUCCESS;
}

HixlStatus HixlConfigEngineOptions(const HixlConfig *c, const HixlOption **options, size_t *num_options) {
  if (!c || !options || !num_options) return HIXL_PARAM_INVALID;
  *options = c->opts;
  *num_options = c->nopts;
  return HIXL_SUCCESS;
}

/* ---- printing ---- */

static void json_str(FILE *out, const char *s) {
  json_object *o = json_object_new_string(s);
  fputs(o ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)
          : "\"\"",
        out);
  json_object_put(o);
}

void HixlConfigPrint(const HixlConfig *c, FILE *out, int as_json) {
  if (!c || !out) return;
  if (as_json)
    fprintf(out, "{\n  \"shape\": \"%s\",\n  \"keys\": {", c->vllm ? "vllm" : "hixl");
  else
    fprintf(out, "# shape: %s\n",
            c->vllm ? "vLLM --kv-transfer-config (hixl keys in " EXTRA ")" : "hixl document");
  for (size_t i = 0; i < c->n; i++) {
    const struct row *r = &cfg_rows[i];
    const struct val *v = &c->v[i];
    char from[96];
    if (v->src == HIXL_CONFIG_FROM_DOCUMENT)
      snprintf(from, sizeof(from), "document %u:%u", v->line, v->col);
    else if (v->src == HIXL_CONFIG_FROM_ENV)
      snprintf(from, sizeof(from), "env %s", r->info.env);
    else
      snprintf(from, sizeof(from), "default");
    if (as_json) {
      fprintf(out, "%s\n    ", i ? "," : "");
      json_str(out, r->info.name);
      fputs(": {\"value\": ", out);
      if (r->info.type == HIXL_CONFIG_INT)
        fprintf(out, "%" PRId64, v->num);
      else if (r->info.type == HIXL_CONFIG_BOOL)
        fputs(v->num ? "true" : "false", out);
      else
        json_str(out, v->text);
      fputs(", \"source\": ", out);
      json_str(out, from);
      fputs("}", out);
    } else {
      char shown[4 * 256 + 3]; /* control bytes as \xNN: a value from the environment cannot forge a line */
      size_t k = 0;
      for (const char *p = *v->text ? v->text : "\"\""; *p && k + 5 < sizeof(shown); p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
          k += (size_t)snprintf(shown + k, sizeof(shown) - k, "\\x%02x", (unsigned char)*p);
        else
          shown[k++] = *p;
      }
      shown[k] = '\0';
      fprintf(out, "%-22s %-24s (%s)\n", r->info.name, shown, from);
    }
  }
  if (as_json) fputs("\n  }\n}\n", out);
}

static void md_cell(FILE *out, const char *s) {
  for (; s && *s; s++) {
    if (*s == '|') fputc('\\', out);
    fputc(*s, out);
  }
}

void HixlConfigPrintReference(FILE *out) {
  static const char *const type_words[] = {"string", "integer", "boolean", "enum", "engine option"};
  pthread_once(&cfg_rows_once, cfg_rows_init);
  if (!out) return;
  fputs("| Key | Type | Default | Environment | Allowed | What it sets |\n", out);
  fputs("|---|---|---|---|---|---|\n", out);
  for (size_t i = 0; i < cfg_n_rows; i++) {
    const HixlConfigKeyInfo *k = &cfg_rows[i].info;
    fprintf(out, "| `%s` | %s | ", k->name, type_words[k->type]);
    if (*k->def) {
      fputc('`', out);
      md_cell(out, k->def);
      fputc('`', out);
    } else {
      fputs("`\"\"`", out);
    }
    fputs(" | ", out);
    if (k->env) fprintf(out, "`%s`", k->env);
    fputs(" | ", out);
    md_cell(out, k->range);
    if (k->type == HIXL_CONFIG_ENGINE) {
      if (cfg_rows[i].json_int) fputs(" (a string or a JSON integer)", out);
      if (cfg_rows[i].json_bool) fputs(" (or true / false)", out);
    }
    fputs(" | ", out);
    md_cell(out, k->doc);
    fputs(" |\n", out);
  }
}
