/* jscan: member positions and repeated keys in a JSON text (see jscan.h).
 *
 * The text has passed json-c's strict parser, but jscan still never reads past
 * len and never recurses deeper than max_depth, so a text json-c would refuse
 * cannot hurt it either (the fuzzer feeds it both). */
#include "jscan.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct scan {
  const char *s;
  size_t len, i;
  int max_depth;
  struct jscan *out;
  size_t cap, objs, max_members, max_path;
  int oom; /* 1: out of memory, 2: more members than max_members, 3: a path past max_path (the scan stops) */
};

static void skip_ws(struct scan *sc) {
  while (sc->i < sc->len && strchr(" \t\r\n", sc->s[sc->i]) && sc->s[sc->i]) sc->i++;
}

static int hex4(const char *p, size_t avail, uint32_t *out) {
  uint32_t v = 0;
  if (avail < 4) return -1;
  for (int k = 0; k < 4; k++) {
    char c = p[k];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= (uint32_t)(c - '0');
    else if (c >= 'a' && c <= 'f')
      v |= (uint32_t)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      v |= (uint32_t)(c - 'A' + 10);
    else
      return -1;
  }
  *out = v;
  return 0;
}

static size_t put_utf8(char *d, uint32_t cp) {
  if (cp < 0x80) {
    d[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    d[0] = (char)(0xC0 | (cp >> 6));
    d[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    d[0] = (char)(0xE0 | (cp >> 12));
    d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  d[0] = (char)(0xF0 | (cp >> 18));
  d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  d[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  d[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* At a '"': decode the string (as json-c does: the key ends at a NUL it encodes)
 * into a new C string, and step past the closing quote. */
static char *scan_string(struct scan *sc) {
  size_t start = ++sc->i, end = start;
  while (end < sc->len && sc->s[end] != '"') end += sc->s[end] == '\\' ? 2 : 1;
  char *d = malloc(end - start + 1), *p = d;
  if (!d) {
    sc->oom = 1;
    sc->i = sc->len;
    return NULL;
  }
  for (size_t i = start; i < end && i < sc->len;) {
    char c = sc->s[i++];
    if (c != '\\' || i >= sc->len) {
      *p++ = c;
      continue;
    }
    c = sc->s[i++];
    uint32_t cp, lo;
    switch (c) {
    case 'b': *p++ = '\b'; break;
    case 'f': *p++ = '\f'; break;
    case 'n': *p++ = '\n'; break;
    case 'r': *p++ = '\r'; break;
    case 't': *p++ = '\t'; break;
    case 'u':
      if (hex4(sc->s + i, sc->len - i, &cp) != 0) break;
      i += 4;
      if (cp >= 0xD800 && cp < 0xDC00 && i + 6 <= sc->len && sc->s[i] == '\\' && sc->s[i + 1] == 'u' &&
          hex4(sc->s + i + 2, sc->len - i - 2, &lo) == 0 && lo >= 0xDC00 && lo < 0xE000) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        i += 6;
      } else if (cp >= 0xD800 && cp < 0xE000) {
        cp = 0xFFFD; /* a lone surrogate: json-c writes the replacement character */
      }
      /* 6 bytes of escape never become more than 4 of UTF-8: d is big enough */
      p += put_utf8(p, cp);
      break;
    default: *p++ = c; break; /* \" \\ \/ */
    }
  }
  *p = '\0';
  sc->i = end < sc->len ? end + 1 : sc->len;
  return d;
}

static char *join(const char *prefix, const char *key, long index) {
  size_t n = (prefix ? strlen(prefix) : 0) + (key ? strlen(key) : 0) + 24;
  char *p = malloc(n);
  if (!p) return NULL;
  if (key)
    snprintf(p, n, "%s%s%s", prefix && *prefix ? prefix : "", prefix && *prefix ? "." : "", key);
  else
    snprintf(p, n, "%s[%ld]", prefix ? prefix : "", index);
  return p;
}

static int add_member(struct scan *sc, char *path, size_t key_len, size_t key_off, size_t val_off,
                      size_t first, size_t obj) {
  struct jscan *o = sc->out;
  if (o->n == sc->max_members) return -2;
  if (o->n == sc->cap) {
    size_t cap = sc->cap ? sc->cap * 2 : 16;
    struct jscan_member *m = realloc(o->m, cap * sizeof(*m));
    if (!m) return -1;
    o->m = m;
    sc->cap = cap;
  }
  size_t child = sc->i < sc->len && sc->s[sc->i] == '{' ? sc->objs : (size_t)-1; /* numbered next */
  o->m[o->n++] =
      (struct jscan_member){path, path + strlen(path) - key_len, key_off, val_off, first, obj, child};
  return 0;
}

static void scan_value(struct scan *sc, const char *path, int depth) {
  skip_ws(sc);
  if (sc->i >= sc->len || sc->oom) return;
  char c = sc->s[sc->i];
  if ((c == '{' || c == '[') && depth >= sc->max_depth) {
    sc->i = sc->len; /* json-c refused this text; nothing more to find */
    return;
  }
  if (c == '{') {
    size_t mine = sc->out->n, obj = sc->objs++; /* its members are recorded from here on */
    sc->i++;
    for (;;) {
      skip_ws(sc);
      if (sc->i >= sc->len) return;
      if (sc->s[sc->i] == '}') {
        sc->i++;
        return;
      }
      if (sc->s[sc->i] == ',') {
        sc->i++;
        continue;
      }
      if (sc->s[sc->i] != '"') { /* not JSON: stop */
        sc->i = sc->len;
        return;
      }
      size_t key_off = sc->i;
      char *key = scan_string(sc);
      if (!key) return;
      skip_ws(sc);
      if (sc->i < sc->len && sc->s[sc->i] == ':') sc->i++;
      skip_ws(sc);
      char *p = join(path, key, 0);
      size_t key_len = strlen(key);
      free(key);
      if (!p) {
        sc->oom = 1;
        return;
      }
      size_t plen = strlen(p);
      if (plen > sc->max_path) { /* every member below holds this path: refused, not copied on */
        free(p);
        sc->oom = 3;
        return;
      }
      /* this object's own member with this key: by the key, the object's prefix is the same */
      size_t first = (size_t)-1;
      for (size_t k = mine; k < sc->out->n; k++)
        if (sc->out->m[k].obj == obj && sc->out->m[k].first == (size_t)-1 &&
            strcmp(sc->out->m[k].key, p + plen - key_len) == 0) {
          first = k;
          break;
        }
      int rc = add_member(sc, p, key_len, key_off, sc->i, first, obj);
      if (rc != 0) {
        free(p);
        sc->oom = rc == -2 ? 2 : 1;
        return;
      }
      scan_value(sc, p, depth + 1);
    }
  }
  if (c == '[') {
    long idx = 0;
    sc->i++;
    for (;;) {
      skip_ws(sc);
      if (sc->i >= sc->len) return;
      if (sc->s[sc->i] == ']') {
        sc->i++;
        return;
      }
      if (sc->s[sc->i] == ',') {
        sc->i++;
        continue;
      }
      char *p = join(path, NULL, idx++);
      if (!p) {
        sc->oom = 1;
        return;
      }
      size_t before = sc->i;
      scan_value(sc, p, depth + 1);
      free(p);
      if (sc->i == before) sc->i++; /* never loop on a byte that is not JSON */
    }
  }
  if (c == '"') {
    free(scan_string(sc));
    return;
  }
  while (sc->i < sc->len && !strchr(",]} \t\r\n", sc->s[sc->i]) && sc->s[sc->i]) sc->i++;
}

int jscan_run(const char *text, size_t len, int max_depth, size_t max_members, size_t max_path,
              struct jscan *out) {
  struct scan sc = {text, len, 0, max_depth, out, 0, 0, max_members, max_path, 0};
  out->m = NULL;
  out->n = 0;
  scan_value(&sc, "", 0);
  if (sc.oom) {
    jscan_free(out);
    return -sc.oom;
  }
  return 0;
}

const struct jscan_member *jscan_member_of(const struct jscan *js, size_t obj, const char *key) {
  for (size_t k = js->n; k-- > 0;)
    if (js->m[k].obj == obj && strcmp(js->m[k].key, key) == 0) return &js->m[k];
  return NULL;
}

void jscan_free(struct jscan *js) {
  for (size_t k = 0; k < js->n; k++) free(js->m[k].path);
  free(js->m);
  js->m = NULL;
  js->n = 0;
}

_Thread_local size_t jscan_line_steps;

/* Where the text's newlines are: one pass, the array doubled as it fills. */
static void lines_build(struct jscan_lines *li, const char *text, size_t len) {
  size_t cap = 0;
  li->built = true;
  if (len > UINT32_MAX) return; /* never (a document is at most 1 MiB): the walk */
  jscan_line_steps += len;
  for (const char *p = text, *end = text + len; (p = memchr(p, '\n', (size_t)(end - p))) != NULL; p++) {
    if (li->n == cap) {
      cap = cap ? 2 * cap : 64;
      uint32_t *e = realloc(li->eol, cap * sizeof(*e));
      if (!e) { /* out of memory: the walk */
        jscan_lines_free(li);
        li->built = true;
        return;
      }
      li->eol = e;
    }
    li->eol[li->n++] = (uint32_t)(p - text);
  }
  if (!li->eol) li->eol = malloc(sizeof(*li->eol)); /* no newline: one line, still searched */
}

void jscan_line_col(struct jscan_lines *li, const char *text, size_t len, size_t off, unsigned *line,
                    unsigned *col) {
  if (off > len) off = len;
  if (li && !li->built) lines_build(li, text, len);
  if (li && li->eol) { /* the newlines before off: eol[0, lo) */
    size_t lo = 0, hi = li->n;
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      jscan_line_steps++;
      if (li->eol[mid] < off)
        lo = mid + 1;
      else
        hi = mid;
    }
    *line = (unsigned)(lo + 1);
    *col = (unsigned)(off - (lo ? li->eol[lo - 1] + 1 : 0) + 1);
    return;
  }
  unsigned l = 1;
  size_t bol = 0;
  jscan_line_steps += off;
  for (size_t i = 0; i < off; i++)
    if (text[i] == '\n') {
      l++;
      bol = i + 1;
    }
  *line = l;
  *col = (unsigned)(off - bol + 1);
}

void jscan_lines_free(struct jscan_lines *li) {
  free(li->eol);
  li->eol = NULL;
  li->n = 0;
  li->built = false;
}
