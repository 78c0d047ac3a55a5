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
#include <string.h>

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

/* ---- text in messages ---- */

size_t cfg_utf8_len(const unsigned char *s, size_t avail) {
  unsigned c = avail ? s[0] : 0;
  size_t n;
  unsigned lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */
  if (avail == 0) return 0;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0; /* overlong */
    if (c == 0xED) hi = 0x9F; /* surrogates */
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90; /* overlong */
    if (c == 0xF4) hi = 0x8F; /* past U+10FFFF */
  } else {
    return 0; /* 0x80-0xC1 lead bytes, 0xF5-0xFF */
  }
  if (n > avail || s[1] < lo || s[1] > hi) return 0;
  for (size_t k = 2; k < n; k++)
    if (s[k] < 0x80 || s[k] > 0xBF) return 0;
  return n;
}

const char *cfg_escape(char *buf, size_t cap, const char *s) {
  static const char from[] = "\n\r\t\\\"", to[] = "nrt\\\"";
  const unsigned char *p = (const unsigned char *)s;
  size_t len = strlen(s), k = 0;
  if (cap < 4) {
    if (cap) buf[0] = '\0';
    return buf;
  }
  for (size_t i = 0, n; i < len; i += n) {
    char e[8];
    const char *add = e;
    size_t w = 0;
    const char *q;
    uint32_t cp = 0;
    n = cfg_utf8_len(p + i, len - i);
    if (n == 2) cp = (uint32_t)(p[i] & 0x1F) << 6 | (p[i + 1] & 0x3F);
    if (n == 3) cp = (uint32_t)(p[i] & 0x0F) << 12 | (uint32_t)(p[i + 1] & 0x3F) << 6 | (p[i + 2] & 0x3F);
    if (n == 0) { /* not UTF-8: the byte alone */
      n = 1;
      w = (size_t)snprintf(e, sizeof(e), "\\x%02x", p[i]);
    } else if (n == 1 && (q = strchr(from, p[i])) != NULL) {
      e[0] = '\\';
      e[1] = to[q - from];
      w = 2;
    } else if (n == 1 && (p[i] < 0x20 || p[i] == 0x7f)) {
      w = (size_t)snprintf(e, sizeof(e), "\\x%02x", p[i]);
    } else if ((cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029) {
      w = (size_t)snprintf(e, sizeof(e), "\\u%04x", (unsigned)cp);
    } else {
      add = s + i;
      w = n;
    }
    if (k + w > cap - 4) {
      memcpy(buf + k, "...", 4);
      return buf;
    }
    memcpy(buf + k, add, w);
    k += w;
  }
  buf[k] = '\0';
  return buf;
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
      char shown[4 * 1024 + 4]; /* escaped: a value from the environment cannot forge a line */
      fprintf(out, "%-22s %-24s (%s)\n", r->info.name,
              *v->text ? cfg_escape(shown, sizeof(shown), v->text) : "\"\"", from);
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
