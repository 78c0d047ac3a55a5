/* jscan: where each object member of a JSON text sits, and which keys repeat.
 *
 * json-c parses the values but keeps no positions and keeps the last of two equal
 * keys silently; jscan walks the same text (which json-c has already accepted) and
 * records, for every member of every object, its key, its dotted path and the byte
 * offsets of its key and its value. A member is found by its object and its key, never
 * by its path: a key may hold a dot ("a.b"), so two members can share one path. */
#ifndef HIXL_JSCAN_H
#define HIXL_JSCAN_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct jscan_member {
  char *path;      /* "a.b", "a[2].c": for messages; not unique (a key may hold a dot) */
  const char *key; /* the key as json-c decodes it (a lone surrogate escape is U+FFFD): in path */
  size_t key_off;  /* the key's opening quote */
  size_t val_off;  /* the value's first byte */
  size_t first;    /* a repeated key: index of the member it repeats, else (size_t)-1 */
  size_t obj;      /* which object it belongs to (objects are numbered as met; the root is 0) */
  size_t child;    /* the object its value is, else (size_t)-1 */
};

struct jscan {
  struct jscan_member *m;
  size_t n;
};

/* Scan text (valid JSON), recording at most max_members members, each with a path of
 * at most max_path bytes (every member holds its whole path: a long key above many
 * members cost their number times its length, in memory and in the search for a
 * repeated key); 0, -1 when out of memory, -2 when the text has more members, -3 when
 * a member's path is longer. */
int jscan_run(const char *text, size_t len, int max_depth, size_t max_members, size_t max_path,
              struct jscan *out);
/* The last member of object obj with this key (the one whose value json-c keeps), or NULL. */
const struct jscan_member *jscan_member_of(const struct jscan *js, size_t obj, const char *key);
void jscan_free(struct jscan *js);
/* Where a text's lines start, for jscan_line_col: zeroed before the first lookup in a
 * text, jscan_lines_free after the last. */
struct jscan_lines {
  uint32_t *eol; /* offsets of the text's newlines, found at the first lookup */
  size_t n;
  bool built;
};

/* 1-based line and column (in bytes) of a byte offset of text: with lines, one pass over
 * the text at the first lookup, then a binary search each (a walk from the start per
 * lookup cost the text's length for every repeated key); without (NULL), or out of
 * memory, that walk. */
void jscan_line_col(struct jscan_lines *lines, const char *text, size_t len, size_t off, unsigned *line,
                    unsigned *col);
void jscan_lines_free(struct jscan_lines *lines);
/* Steps this thread's line:column lookups took (bytes walked, search steps): for a test. */
extern _Thread_local size_t jscan_line_steps;

#endif
