/* hixl_config: hixl's JSON configuration (libhixl-config, on json-c).
 *
 * One document configures an engine and the KV connector: either a bare hixl
 * document ({"address": "10.0.0.1:16000", "role": "producer", "BufferPool": "4:8"})
 * or vLLM's whole --kv-transfer-config document, whose kv_connector_extra_config
 * holds the hixl keys (kv_role maps to role, kv_load_failure_policy to
 * load_failure_policy). Every key is named by one table (HixlConfigKeyAt); for
 * each, the document wins, then the key's environment variable, then its default.
 *
 * A failed parse returns no configuration and every error it found, each with the
 * key path, the line and column in the document, and what is allowed. */
#ifndef HIXL_CONFIG_H
#define HIXL_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "hixl/hixl_engine.h"
#include "hixl/hixl_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HIXL_CONFIG_MAX_BYTES (1u << 20) /* a larger document is refused */
#define HIXL_CONFIG_MAX_DEPTH 16         /* nesting deeper than this is refused */
#define HIXL_CONFIG_MAX_KEYS  4096       /* a document with more object members is refused */
#define HIXL_CONFIG_MAX_PATH  1024       /* a key whose path ("a.b") is longer is refused */

typedef struct HixlConfig HixlConfig;

/* A key or value the document (or the environment) holds is quoted escaped, so the
 * error stays one line of text whatever it holds: \n, \r, \t, \\, \", \xNN for any other
 * control byte, DEL or byte that is not UTF-8, \uNNNN for a C1 control, U+2028 and
 * U+2029; and cut, with "...", past 64 bytes (a path past its field), so what is
 * allowed always fits in message. */
typedef struct {
  uint32_t line;     /* 1-based; 0 when the error has no place in the document */
  uint32_t column;   /* 1-based, in bytes */
  char path[128];    /* "lease_ms", "kv_connector_extra_config.role"; "" for the document */
  char message[384]; /* what is wrong and what is allowed */
} HixlConfigError;

typedef enum {
  HIXL_CONFIG_FROM_DEFAULT = 0,
  HIXL_CONFIG_FROM_ENV = 1,
  HIXL_CONFIG_FROM_DOCUMENT = 2,
} HixlConfigSource;

typedef enum {
  HIXL_CONFIG_STRING = 0,
  HIXL_CONFIG_INT = 1,
  HIXL_CONFIG_BOOL = 2,
  HIXL_CONFIG_ENUM = 3,
  HIXL_CONFIG_ENGINE = 4, /* an option HixlEngineInitialize takes, checked by the engine */
} HixlConfigType;

typedef struct {
  const char *name; /* the key, as written in the document */
  HixlConfigType type;
  const char *def;   /* default, as text */
  const char *env;   /* environment variable read when the document has no value, or NULL */
  const char *range; /* the allowed values in words */
  const char *doc;   /* one line */
} HixlConfigKeyInfo;

/** The key table: row i, or NULL past the last row. */
HIXL_API const HixlConfigKeyInfo *HixlConfigKeyAt(size_t i);

/** Parse and validate a document of len bytes (it need not end in NUL). On success
 *  *config is set and must be freed with HixlConfigFree. On failure *config is NULL,
 *  the first min(max_errors, total) errors are written to errors (which may be NULL
 *  when max_errors is 0), *num_errors (optional) gets the total, and the status is
 *  PARAM_INVALID. */
HIXL_API HixlStatus HixlConfigParse(const char *text, size_t len, HixlConfig **config,
                                    HixlConfigError *errors, size_t max_errors, size_t *num_errors);

/** HixlConfigParse on a file's contents. A file that cannot be read, an empty file
 *  and one over HIXL_CONFIG_MAX_BYTES are errors with line 0 that say why. */
HIXL_API HixlStatus HixlConfigParseFile(const char *path, HixlConfig **config, HixlConfigError *errors,
                                        size_t max_errors, size_t *num_errors);

HIXL_API void HixlConfigFree(HixlConfig *config);

/** The effective value of key as text (every key has one); NOT_FOUND for a name
 *  that is not in the table. */
HIXL_API HixlStatus HixlConfigGetString(const HixlConfig *config, const char *key, const char **value);
/** An INT key's value; PARAM_INVALID for a key of another type. */
HIXL_API HixlStatus HixlConfigGetInt(const HixlConfig *config, const char *key, int64_t *value);
/** A BOOL key's value (0 or 1); PARAM_INVALID for a key of another type. */
HIXL_API HixlStatus HixlConfigGetBool(const HixlConfig *config, const char *key, int *value);
/** Where key's value came from; env (optional) names the variable for FROM_ENV. */
HIXL_API HixlStatus HixlConfigGetSource(const HixlConfig *config, const char *key, HixlConfigSource *source,
                                        const char **env);

/** The engine options of the configuration, every one with its effective value, as
 *  HixlEngineInitialize takes them. The array belongs to config. */
HIXL_API HixlStatus HixlConfigEngineOptions(const HixlConfig *config, const HixlOption **options,
                                            size_t *num_options);

/** Print the effective configuration, one key per line with its source, or as one
 *  JSON object ({"shape": "hixl|vllm", "keys": {"key": {"value": ..., "source":
 *  "document LINE:COL|env NAME|default"}}}). */
HIXL_API void HixlConfigPrint(const HixlConfig *config, FILE *out, int as_json);

/** Print the key table as Markdown (docs/config.md's reference section). */
HIXL_API void HixlConfigPrintReference(FILE *out);

#ifdef __cplusplus
}
#endif
#endif /* HIXL_CONFIG_H */
