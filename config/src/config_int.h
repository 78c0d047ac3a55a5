/* config_int: shared by config.c, config_table.c, config_parse.c (and hixl-config): the key table's rows, a
 * configuration, the escaping of quoted text. */
#ifndef HIXL_CONFIG_INT_H
#define HIXL_CONFIG_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hixl/hixl_config.h"

/* ---- the table (config_table.c) ---- */

typedef bool (*check_fn)(const char *text, char *why, size_t cap);

struct row {
  HixlConfigKeyInfo info;
  int64_t min, max; /* INT */
  check_fn check;   /* STRING: extra validation, or NULL */
  bool json_int;    /* ENGINE: a JSON integer is taken as its decimal text */
  bool json_bool;   /* ENGINE: true / false are taken as "on" / "off" */
};

#define MAX_ROWS 64
#define EXTRA    "kv_connector_extra_config"

/* The rows: key_rows, then one per engine option; filled once, by cfg_rows_init. */
extern struct row cfg_rows[MAX_ROWS];
extern size_t cfg_n_rows;
extern pthread_once_t cfg_rows_once;

/* ---- the configuration (config.c) ---- */

struct val {
  char *text;
  int64_t num; /* INT, BOOL */
  HixlConfigSource src;
  unsigned line, col; /* FROM_DOCUMENT */
};

struct HixlConfig {
  struct val v[MAX_ROWS];
  size_t n;
  HixlOption opts[MAX_ROWS];
  size_t nopts;
  bool vllm;
};

/* ---- text from a document or the environment, in messages (config.c) ---- */

#define CFG_QUOTE_MAX 64                  /* a key or value quoted in a message: at most this many bytes */
#define CFG_QUOTE_CAP (CFG_QUOTE_MAX + 4) /* its buffer: room for "..." and the NUL */

/* The length of the well-formed UTF-8 sequence (RFC 3629: no overlong forms, surrogates
 * or code points past U+10FFFF) at s, of at most avail bytes; 0 when there is none. */
size_t cfg_utf8_len(const unsigned char *s, size_t avail);
/* s, escaped into buf (cap >= 4 bytes) to stay one line of plain text in a message, a
 * terminal or a log whatever it holds: \n, \r, \t, \\ and \"; \xNN for any other control
 * byte, DEL and a byte that is not UTF-8; \uNNNN for a C1 control and U+2028 / U+2029
 * (line breaks to some readers). At most cap - 4 bytes of that, never an escape or a
 * character split, then "..." when s goes on. Returns buf. */
const char *cfg_escape(char *buf, size_t cap, const char *s);

/* ---- config_table.c's functions, for config.c and config_parse.c ---- */

/* Whether s is one of list[0..n). */
bool cfg_in_list(const char *s, const char *const *list, size_t n);
/* Fill rows and cfg_n_rows; run it through pthread_once(&cfg_rows_once, cfg_rows_init). */
void cfg_rows_init(void);
/* The row of key name (its index in *index, when index is not NULL), or NULL. */
const struct row *cfg_row_find(const char *name, size_t *index);
/* Validate text for row r (text came from src: a document value or an env var).
 * On success set v; else why says what is wrong. */
bool cfg_take_text(const struct row *r, const char *text, struct val *v, char *why, size_t cap);

#endif
