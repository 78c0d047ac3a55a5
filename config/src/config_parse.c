/* config_parse: a JSON document -> a configuration: checks, each member by its row, vLLM's shape, errors. */
/* json-c parses (strict, UTF-8 checked, depth bounded); jscan finds where each member
 * sits and which keys repeat. Errors are collected, not stopped at, so `hixl-config
 * check` can list them all; a document with any error yields no configuration. The
 * environment, then the default, fill each key the document does not set. */
#include "hixl/hixl_config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_int.h"
#include "jscan.h"

/* vLLM's KVTransferConfig fields, at the top of a --kv-transfer-config document. */
static const char *const vllm_keys[] = {"kv_connector",
                                        "engine_id",
                                        "kv_buffer_device",
                                        "kv_buffer_size",
                                        "kv_role",
                                        "kv_rank",
                                        "kv_parallel_size",
                                        "kv_ip",
                                        "kv_port",
                                        "kv_connector_extra_config",
                                        "kv_connector_module_path",
                                        "enable_permute_local_kv",
                                        "kv_load_failure_policy"};
#define N_VLLM_KEYS (sizeof(vllm_keys) / sizeof(vllm_keys[0]))

/* ---- errors ---- */

struct errs {
  HixlConfigError *e;
  size_t max, n;
  const char *text;
  size_t len;
  struct jscan_lines lines; /* the text's, for every place looked up */
};

static void __attribute__((format(printf, 4, 5)))
add_err(struct errs *er, size_t off, const char *path, const char *fmt, ...) {
  if (er->n < er->max) {
    HixlConfigError *e = &er->e[er->n];
    unsigned l = 0, c = 0;
    if (off != (size_t)-1) jscan_line_col(&er->lines, er->text, er->len, off, &l, &c);
    e->line = l;
    e->column = c;
    cfg_escape(e->path, sizeof(e->path), path ? path : ""); /* a key's text, as messages quote it */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
  }
  er->n++;
}

#define NOWHERE ((size_t)-1)

static size_t edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b), prev[64], cur[64];
  if (la >= 63 || lb >= 63) return 99;
  for (size_t j = 0; j <= lb; j++) prev[j] = j;
  for (size_t i = 1; i <= la; i++) {
    cur[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]), del = prev[j] + 1, ins = cur[j - 1] + 1;
      cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
    }
    memcpy(prev, cur, (lb + 1) * sizeof(size_t));
  }
  return prev[lb];
}

/* The nearest known key (case-insensitive match first), or NULL when none is close. */
static const char *nearest(const char *key, bool vllm_top) {
  const char *best = NULL;
  size_t bd = 99, n = vllm_top ? N_VLLM_KEYS : cfg_n_rows;
  for (size_t i = 0; i < n; i++) {
    const char *cand = vllm_top ? vllm_keys[i] : cfg_rows[i].info.name;
    size_t d = strcasecmp(cand, key) == 0 ? 0 : edit_distance(key, cand);
    if (d < bd) {
      bd = d;
      best = cand;
    }
  }
  size_t len = strlen(key);
  return bd <= (len < 6 ? 1 : len < 12 ? 2 : 3) ? best : NULL;
}

static const char *json_type_word(json_object *o) {
  switch (json_object_get_type(o)) {
  case json_type_null: return "null";
  case json_type_boolean: return "a boolean";
  case json_type_double: return "a fractional number";
  case json_type_int: return "an integer";
  case json_type_object: return "an object";
  case json_type_array: return "an array";
  case json_type_string: return "a string";
  }
  return "?";
}

/* ---- values ---- */

/* A document value as text for row r, or NULL (why says which JSON type it wanted, or
 * that an integer is past int64: quoted from lit, the integer as the document writes it). */
static const char *value_text(const struct row *r, json_object *o, const char *lit, bool lit_in_range,
                              char *buf, size_t cap, char *why, size_t wcap) {
  json_type t = json_object_get_type(o);
  const HixlConfigKeyInfo *k = &r->info;
  if (t == json_type_int && (k->type == HIXL_CONFIG_INT || (k->type == HIXL_CONFIG_ENGINE && r->json_int))) {
    int64_t n = json_object_get_int64(o);
    if (lit ? !lit_in_range : n == INT64_MAX || n == INT64_MIN) {
      snprintf(why, wcap, "%s is out of range: expected %s", lit ? lit : "the number", k->range);
      return NULL;
    }
  }
  switch (k->type) {
  case HIXL_CONFIG_STRING:
  case HIXL_CONFIG_ENUM:
    if (t == json_type_string) return json_object_get_string(o);
    snprintf(why, wcap, "expected a string (%s), got %s", k->range, json_type_word(o));
    return NULL;
  case HIXL_CONFIG_INT:
    if (t == json_type_int) {
      snprintf(buf, cap, "%" PRId64, json_object_get_int64(o));
      return buf;
    }
    snprintf(why, wcap, "expected an integer in %s, got %s", k->range, json_type_word(o));
    return NULL;
  case HIXL_CONFIG_BOOL:
    if (t == json_type_boolean) return json_object_get_boolean(o) ? "true" : "false";
    snprintf(why, wcap, "expected true or false, got %s", json_type_word(o));
    return NULL;
  case HIXL_CONFIG_ENGINE:
    if (t == json_type_string) return json_object_get_string(o);
    if (r->json_int && t == json_type_int) {
      int64_t n = json_object_get_int64(o);
      snprintf(buf, cap, "%" PRId64, n);
      return buf;
    }
    if (r->json_bool && t == json_type_boolean) return json_object_get_boolean(o) ? "on" : "off";
    snprintf(why, wcap, "expected %s (%s), got %s",
             r->json_int    ? "a string or an integer"
             : r->json_bool ? "a string or a boolean"
                            : "a string",
             k->range, json_type_word(o));
    return NULL;
  }
  return NULL;
}

/* ---- parsing ---- */

struct doc {
  const char *text;
  size_t len;
  struct jscan js;
  struct errs *er;
};

#define ROOT 0 /* jscan's number of the document's object */

/* Where key of object obj (jscan's number) sits: by its object and key, never by its
 * dotted path, which a key with a dot in it ("a.b") shares with the member b of "a". */
static size_t member_off(const struct doc *d, size_t obj, const char *key, bool value) {
  const struct jscan_member *m = jscan_member_of(&d->js, obj, key);
  return m ? (value ? m->val_off : m->key_off) : NOWHERE;
}

/* The JSON integer at off as the document writes it (json-c saturates one past int64 to
 * INT64_MAX or INT64_MIN, a number the document never holds); at most cap - 4 bytes of
 * it, then "...". *in_range: whether it is an int64. */
static const char *int_literal(const struct doc *d, size_t off, char *buf, size_t cap, bool *in_range) {
  size_t n = 0;
  *in_range = true;
  if (off == NOWHERE || cap < 8) return NULL;
  while (off + n < d->len && strchr("-0123456789", d->text[off + n]) && d->text[off + n]) n++;
  if (n == 0) return NULL;
  if (n < cap - 4) {
    memcpy(buf, d->text + off, n);
    buf[n] = '\0';
    errno = 0;
    (void)strtoll(buf, NULL, 10);
    *in_range = errno != ERANGE;
  } else {
    snprintf(buf, cap, "%.*s...", (int)(cap - 4), d->text + off);
    *in_range = false;
  }
  return buf;
}

/* Every repeated key is an error: json-c would keep the last one silently. */
static void check_duplicates(struct doc *d) {
  for (size_t k = 0; k < d->js.n; k++) {
    const struct jscan_member *m = &d->js.m[k];
    if (m->first == (size_t)-1) continue;
    unsigned l, c;
    jscan_line_col(&d->er->lines, d->text, d->len, d->js.m[m->first].key_off, &l, &c);
    add_err(d->er, m->key_off, m->path, "duplicate key (first at %u:%u); each key may appear once", l, c);
  }
}

/* An unknown key with a dot in it is one name, not a path: " (a key is one name, not a
 * path: ...)", naming the member the path names when the document has one (json-c sees
 * "a.b": 1 and "a": {"b": 2} as two members; neither takes the other's place). */
static const char *dotted_note(const struct doc *d, const struct jscan_member *m, char *buf, size_t cap) {
  buf[0] = '\0';
  if (!m || !strchr(m->key, '.')) return buf;
  for (size_t k = 0; k < d->js.n; k++) {
    const struct jscan_member *o = &d->js.m[k];
    if (o != m && o->obj != m->obj && strcmp(o->path, m->path) == 0) {
      unsigned l, c;
      jscan_line_col(&d->er->lines, d->text, d->len, o->key_off, &l, &c);
      snprintf(buf, cap, " (a key is one name, not a path: the member this path names is at %u:%u)", l, c);
      return buf;
    }
  }
  snprintf(buf, cap, " (a key is one name, not a dotted path)");
  return buf;
}

/* Take the hixl keys of obj, jscan's object number obj_no (the document, or its
 * kv_connector_extra_config). */
static void take_members(struct doc *d, json_object *obj, size_t obj_no, const char *prefix, HixlConfig *c,
                         bool *given) {
  json_object_object_foreach(obj, key, val) {
    const struct jscan_member *m = jscan_member_of(&d->js, obj_no, key);
    char pbuf[sizeof(((HixlConfigError *)0)->path)];
    const char *path = m ? m->path : pbuf; /* pbuf: never, unless jscan and json-c disagree */
    snprintf(pbuf, sizeof(pbuf), "%s%s", prefix, key);
    size_t idx, key_at = m ? m->key_off : NOWHERE, val_at = m ? m->val_off : NOWHERE;
    const struct row *r = cfg_row_find(key, &idx);
    if (!r) {
      const char *near = nearest(key, false);
      char note[128], q[CFG_QUOTE_CAP];
      dotted_note(d, m, note, sizeof(note));
      cfg_escape(q, sizeof(q), key);
      if (near)
        add_err(d->er, key_at, path, "unknown key \"%s\"; did you mean \"%s\"?%s", q, near, note);
      else
        add_err(d->er, key_at, path, "unknown key \"%s\" (`hixl-config reference` lists the keys)%s", q,
                note);
      continue;
    }
    char buf[32], lit[48], why[320];
    bool in_range = true;
    const char *l = int_literal(d, val_at, lit, sizeof(lit), &in_range);
    const char *text = value_text(r, val, l, in_range, buf, sizeof(buf), why, sizeof(why));
    struct val v = {0};
    if (!text || !cfg_take_text(r, text, &v, why, sizeof(why))) {
      add_err(d->er, val_at, path, "%s", why);
      continue;
    }
    v.src = HIXL_CONFIG_FROM_DOCUMENT;
    jscan_line_col(&d->er->lines, d->text, d->len, val_at, &v.line, &v.col);
    free(c->v[idx].text);
    c->v[idx] = v;
    given[idx] = true;
  }
}

/* A vLLM key that maps onto a hixl key (kv_role -> role): the same rules, and the
 * two may not disagree. */
static void take_vllm_alias(struct doc *d, json_object *root, const char *vkey, const char *hkey,
                            const char *const map[][2], size_t nmap, HixlConfig *c, bool *given) {
  json_object *o;
  if (!json_object_object_get_ex(root, vkey, &o)) return;
  size_t off = member_off(d, ROOT, vkey, true), idx = 0;
  const struct row *r = cfg_row_find(hkey, &idx);
  if (!json_object_is_type(o, json_type_string)) {
    add_err(d->er, off, vkey, "expected a string, got %s", json_type_word(o));
    return;
  }
  const char *s = json_object_get_string(o), *mapped = NULL;
  char allowed[128] = "";
  for (size_t i = 0; i < nmap; i++) {
    if (strcmp(s, map[i][0]) == 0) mapped = map[i][1];
    snprintf(allowed + strlen(allowed), sizeof(allowed) - strlen(allowed), "%s%s", i ? " | " : "", map[i][0]);
  }
  if (!mapped) {
    char q[CFG_QUOTE_CAP];
    add_err(d->er, off, vkey, "\"%s\" is not one of: %s", cfg_escape(q, sizeof(q), s), allowed);
    return;
  }
  if (given[idx]) {
    if (strcmp(c->v[idx].text, mapped) != 0)
      add_err(d->er, off, vkey, "%s \"%s\" means %s \"%s\", but %s.%s says \"%s\"", vkey, s, hkey, mapped,
              EXTRA, hkey, c->v[idx].text);
    return;
  }
  struct val v = {0};
  char why[320];
  if (!cfg_take_text(r, mapped, &v, why, sizeof(why))) {
    add_err(d->er, off, vkey, "%s", why);
    return;
  }
  v.src = HIXL_CONFIG_FROM_DOCUMENT;
  jscan_line_col(&d->er->lines, d->text, d->len, off, &v.line, &v.col);
  free(c->v[idx].text);
  c->v[idx] = v;
  given[idx] = true;
}

static void take_vllm(struct doc *d, json_object *root, HixlConfig *c, bool *given) {
  json_object_object_foreach(root, key, val) {
    (void)val;
    if (cfg_in_list(key, vllm_keys, N_VLLM_KEYS)) continue;
    const char *near = nearest(key, true);
    const struct jscan_member *m = jscan_member_of(&d->js, ROOT, key);
    size_t at = m ? m->key_off : NOWHERE;
    char note[128], q[CFG_QUOTE_CAP];
    dotted_note(d, m, note, sizeof(note));
    cfg_escape(q, sizeof(q), key);
    if (cfg_row_find(key, NULL))
      add_err(d->er, at, key,
              "\"%s\" is a hixl key: in a vLLM --kv-transfer-config document it goes inside %s", q, EXTRA);
    else if (near)
      add_err(d->er, at, key, "unknown key \"%s\" of vLLM's --kv-transfer-config; did you mean \"%s\"?%s", q,
              near, note);
    else
      add_err(d->er, at, key, "unknown key \"%s\" of vLLM's --kv-transfer-config%s", q, note);
  }
  json_object *o;
  if (json_object_object_get_ex(root, "kv_connector", &o) && !json_object_is_type(o, json_type_string))
    add_err(d->er, member_off(d, ROOT, "kv_connector", true), "kv_connector", "expected a string, got %s",
            json_type_word(o));
  if (json_object_object_get_ex(root, EXTRA, &o)) {
    const struct jscan_member *m = jscan_member_of(&d->js, ROOT, EXTRA);
    if (json_object_is_type(o, json_type_object))
      take_members(d, o, m ? m->child : NOWHERE, EXTRA ".", c, given);
    else if (!json_object_is_type(o, json_type_null))
      add_err(d->er, m ? m->val_off : NOWHERE, EXTRA, "expected an object of hixl keys, got %s",
              json_type_word(o));
  }
  static const char *const roles[][2] = {
      {"kv_producer", "producer"}, {"kv_consumer", "consumer"}, {"kv_both", "both"}};
  static const char *const policies[][2] = {{"fail", "fail"}, {"recompute", "recompute"}};
  take_vllm_alias(d, root, "kv_role", "role", roles, 3, c, given);
  take_vllm_alias(d, root, "kv_load_failure_policy", "load_failure_policy", policies, 2, c, given);
}

static bool is_vllm(json_object *root) {
  for (size_t i = 0; i < N_VLLM_KEYS; i++)
    if (json_object_object_get_ex(root, vllm_keys[i], NULL)) return true;
  return false;
}

/* Offset of the first byte that is not well-formed UTF-8 (RFC 3629), or NOWHERE.
 * json-c's own check lets overlong forms through. */
static size_t utf8_invalid(const char *text, size_t len) {
  const unsigned char *s = (const unsigned char *)text;
  for (size_t i = 0, n; i < len; i += n)
    if ((n = cfg_utf8_len(s + i, len - i)) == 0) return i;
  return NOWHERE;
}

/* The offset, in a string of the document, of a control character (JSON allows none
 * raw) or of an escaped NUL (\u0000: the value or key, a C string, would end there and
 * the rest be dropped: "push\u0000x" taken as "push"); NOWHERE when there is none. */
static size_t bad_in_string(const char *t, size_t len) {
  bool in = false;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)t[i];
    if (!in)
      in = c == '"';
    else if (c == '"')
      in = false;
    else if (c < 0x20)
      return i;
    else if (c == '\\' && i + 1 < len) {
      if (t[i + 1] == 'u' && i + 6 <= len && memcmp(t + i + 2, "0000", 4) == 0) return i;
      i++; /* the escaped character: a quote or backslash there ends nothing */
    }
  }
  return NOWHERE;
}

static bool parse_json(struct doc *d, json_object **root) {
  const char *t = d->text;
  size_t len = d->len, i = 0;
  while (i < len && strchr(" \t\r\n", t[i]) && t[i]) i++;
  if (i == len) {
    add_err(d->er, NOWHERE, "", "the document is empty: expected a JSON object");
    return false;
  }
  const char *nul = memchr(t, '\0', len);
  if (nul) {
    add_err(d->er, (size_t)(nul - t), "", "a NUL byte: a JSON document is text");
    return false;
  }
  if (len >= 3 && memcmp(t, "\xEF\xBB\xBF", 3) == 0) { /* valid UTF-8, but no JSON text may start so */
    add_err(d->er, 0, "", "a UTF-8 byte order mark: JSON has none (RFC 8259); save the file without it");
    return false;
  }
  size_t bad = utf8_invalid(t, len);
  if (bad != NOWHERE) {
    add_err(d->er, bad, "",
            "invalid UTF-8 (RFC 3629: no overlong forms, surrogates or code points past U+10FFFF)");
    return false;
  }
  if ((bad = bad_in_string(t, len)) != NOWHERE) {
    add_err(d->er, bad, "",
            t[bad] == '\\'
                ? "\\u0000 in a string: a NUL would end the text there (what follows dropped)"
                : "a control character in a string (JSON allows none unescaped: use \\n, \\t, ...)");
    return false;
  }
  struct json_tokener *tok = json_tokener_new_ex(HIXL_CONFIG_MAX_DEPTH + 1); /* it holds one level fewer */
  if (!tok) {
    add_err(d->er, NOWHERE, "", "out of memory");
    return false;
  }
  json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_ALLOW_TRAILING_CHARS |
                                  JSON_TOKENER_VALIDATE_UTF8);
  json_object *o = json_tokener_parse_ex(tok, t, (int)len);
  enum json_tokener_error je = json_tokener_get_error(tok);
  size_t end = json_tokener_get_parse_end(tok);
  if (!o && je == json_tokener_continue) { /* a number at the very end may still grow: end it */
    o = json_tokener_parse_ex(tok, " ", 1);
    je = json_tokener_get_error(tok);
    end = len;
  }
  json_tokener_free(tok);
  if (!o || je != json_tokener_success) {
    json_object_put(o);
    if (je == json_tokener_continue)
      add_err(d->er, len, "", "the document ends early: an object, array or string is not closed");
    else if (je == json_tokener_error_depth)
      add_err(d->er, end, "", "nesting deeper than %d levels", HIXL_CONFIG_MAX_DEPTH);
    else if (je == json_tokener_error_parse_utf8_string)
      add_err(d->er, end, "", "invalid UTF-8");
    else
      add_err(d->er, end, "", "not JSON: %s", json_tokener_error_desc(je));
    return false;
  }
  while (end < len && strchr(" \t\r\n", t[end]) && t[end]) end++;
  if (end < len) {
    json_object_put(o);
    add_err(d->er, end, "", "trailing text after the document: one JSON object, nothing after it");
    return false;
  }
  if (!json_object_is_type(o, json_type_object)) {
    add_err(d->er, i, "", "the document is %s: expected a JSON object", json_type_word(o));
    json_object_put(o);
    return false;
  }
  *root = o;
  return true;
}

static int err_cmp(const void *a, const void *b) {
  const HixlConfigError *x = a, *y = b;
  if (x->line != y->line) return x->line < y->line ? -1 : 1;
  return x->column < y->column ? -1 : x->column > y->column;
}

HixlStatus HixlConfigParse(const char *text, size_t len, HixlConfig **config, HixlConfigError *errors,
                           size_t max_errors, size_t *num_errors) {
  struct errs er = {errors, errors ? max_errors : 0, 0, text, len, {NULL, 0, false}};
  if (num_errors) *num_errors = 0;
  if (!config) return HIXL_PARAM_INVALID;
  *config = NULL;
  if (!text && len > 0) return HIXL_PARAM_INVALID;
  pthread_once(&cfg_rows_once, cfg_rows_init);
  struct doc d = {text ? text : "", len, {NULL, 0}, &er};
  json_object *root = NULL;
  HixlConfig *c = NULL;
  bool given[MAX_ROWS] = {false};
  if (len > HIXL_CONFIG_MAX_BYTES) {
    add_err(&er, NOWHERE, "", "the document is %zu bytes: at most %u are read", len, HIXL_CONFIG_MAX_BYTES);
    goto out;
  }
  if (!parse_json(&d, &root)) goto out;
  int rc =
      jscan_run(d.text, d.len, HIXL_CONFIG_MAX_DEPTH + 1, HIXL_CONFIG_MAX_KEYS, HIXL_CONFIG_MAX_PATH, &d.js);
  if (rc == -2) {
    add_err(&er, NOWHERE, "", "the document has more than %u keys: a configuration has a few dozen",
            HIXL_CONFIG_MAX_KEYS);
    goto out;
  }
  if (rc == -3) { /* each member below a key holds its path: a long one cost their number times its length */
    add_err(&er, NOWHERE, "", "a key whose path is longer than %u bytes: a configuration's keys are short",
            HIXL_CONFIG_MAX_PATH);
    goto out;
  }
  if (rc != 0 || !(c = calloc(1, sizeof(*c)))) {
    add_err(&er, NOWHERE, "", "out of memory");
    goto out;
  }
  c->n = cfg_n_rows;
  check_duplicates(&d);
  c->vllm = is_vllm(root);
  if (c->vllm)
    take_vllm(&d, root, c, given);
  else
    take_members(&d, root, ROOT, "", c, given);
  /* Then the environment, then the default. */
  for (size_t i = 0; i < cfg_n_rows; i++) {
    if (given[i]) continue;
    const char *env = cfg_rows[i].info.env ? getenv(cfg_rows[i].info.env) : NULL;
    char why[320];
    struct val v = {0};
    if (env) {
      char q[CFG_QUOTE_CAP];
      if (!cfg_take_text(&cfg_rows[i], env, &v, why, sizeof(why)))
        add_err(&er, NOWHERE, cfg_rows[i].info.name, "environment %s=\"%s\": %s", cfg_rows[i].info.env,
                cfg_escape(q, sizeof(q), env), why);
      v.src = HIXL_CONFIG_FROM_ENV;
    } else if (!cfg_take_text(&cfg_rows[i], cfg_rows[i].info.def, &v, why, sizeof(why))) {
      add_err(&er, NOWHERE, cfg_rows[i].info.name, "the default is invalid: %s",
              why); /* a bug: the test finds it */
    }
    c->v[i] = v;
  }
  for (size_t i = 0; i < cfg_n_rows; i++)
    if (cfg_rows[i].info.type == HIXL_CONFIG_ENGINE && c->v[i].text)
      c->opts[c->nopts++] = (HixlOption){cfg_rows[i].info.name, c->v[i].text};
out:
  if (errors) /* in document order: errors with no place (environment) first */
    qsort(errors, er.n < er.max ? er.n : er.max, sizeof(*errors), err_cmp);
  jscan_free(&d.js);
  jscan_lines_free(&er.lines);
  json_object_put(root);
  if (num_errors) *num_errors = er.n;
  if (er.n > 0) {
    HixlConfigFree(c);
    return HIXL_PARAM_INVALID;
  }
  *config = c;
  return HIXL_SUCCESS;
}

HixlStatus HixlConfigParseFile(const char *path, HixlConfig **config, HixlConfigError *errors,
                               size_t max_errors, size_t *num_errors) {
  struct errs er = {errors, errors ? max_errors : 0, 0, "", 0, {NULL, 0, false}};
  if (num_errors) *num_errors = 0;
  if (!config) return HIXL_PARAM_INVALID;
  *config = NULL;
  if (!path) return HIXL_PARAM_INVALID;
  char shown[256]; /* the path, as messages quote text: cut, so the reason stays */
  cfg_escape(shown, sizeof(shown), path);
  /* Opened without blocking, and checked to be a regular file before anything is read:
   * fopen of a FIFO waits for a writer forever. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
  struct stat sb;
  if (fd >= 0 && !f) close(fd);
  if (!f) {
    add_err(&er, NOWHERE, "", "cannot open %s: %s", shown, strerror(errno));
  } else if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    add_err(&er, NOWHERE, "", "%s is not a regular file", shown);
  } else if (sb.st_size > (off_t)HIXL_CONFIG_MAX_BYTES) {
    add_err(&er, NOWHERE, "", "%s is %lld bytes: at most %u are read", shown, (long long)sb.st_size,
            HIXL_CONFIG_MAX_BYTES);
  } else {
    char *buf = malloc(HIXL_CONFIG_MAX_BYTES + 1);
    size_t n = buf ? fread(buf, 1, HIXL_CONFIG_MAX_BYTES + 1, f) : 0;
    if (!buf) {
      add_err(&er, NOWHERE, "", "out of memory");
    } else if (ferror(f)) {
      add_err(&er, NOWHERE, "", "cannot read %s: %s", shown, strerror(errno));
    } else if (n > HIXL_CONFIG_MAX_BYTES) { /* it grew since fstat */
      add_err(&er, NOWHERE, "", "%s is over %u bytes", shown, HIXL_CONFIG_MAX_BYTES);
    } else {
      fclose(f);
      HixlStatus st = HixlConfigParse(buf, n, config, errors, max_errors, num_errors);
      free(buf);
      return st;
    }
    free(buf);
  }
  if (f) fclose(f);
  if (num_errors) *num_errors = er.n;
  return er.n ? HIXL_FAILED : HIXL_SUCCESS;
}
