/* harness: what every hixl benchmark shares, so that each bench is only its workload:
 * one option table that parses argv and prints the usage, messages and exits, the
 * engine and its registrations, waits on its requests, buffers, the peer process (fork,
 * one socketpair) and the lines it speaks, free ports, the reporter, the KV plugin's
 * entry and a KV host's step. The statistics (every median) and the data pattern are in
 * bench_util.h (the demo and the examples use them too). */
#ifndef HIXL_BENCH_HARNESS_H
#define HIXL_BENCH_HARNESS_H

#include <sys/mman.h>

#include "bench_util.h"
#include "hixl/hixl.h"

extern const char *hb_prog; /* message prefix: set by main */

void hb_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void hb_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* "prog: what failed: STATUS: the engine's message"; false, for `return hb_fail(...)`. */
bool hb_fail(const char *what, HixlStatus st);
/* True when st is HIXL_SUCCESS; else hb_fail(what, st). */
bool hb_ok(HixlStatus st, const char *what);
/* Nothing when st is HIXL_SUCCESS; else says "what failed: STATUS: message" and exits 1. */
void hb_check(HixlStatus st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- the option table: one row per flag; parses argv and prints the usage ---- */
enum hb_kind {
  HB_FLAG,   /* bool = true */
  HB_NOFLAG, /* bool = false */
  HB_STR,    /* const char * (argv's) */
  HB_U32,    /* uint32_t, in [lo, hi] when hi > 0 */
  HB_U64,    /* uint64_t, likewise */
  HB_UNS,    /* unsigned, likewise */
  HB_INT,    /* int (may be negative), likewise */
  HB_SIZE,   /* size_t: 4096, 4K, 1M, 1G; likewise */
  HB_SIZES,  /* size_t[BENCH_MAX_LIST] "4K,64K"; aux: its size_t count */
  HB_DBL,    /* double, likewise */
  HB_CHOICE, /* int: the index of the value in aux, a NULL-ended list of names */
  HB_PIN,    /* int[2]: "--pin A,B" */
  HB_FN,     /* aux: bool fn(void *p, const char *value) */
};
struct hb_opt {
  const char *name; /* "--iters" */
  enum hb_kind kind;
  void *p;
  const char *arg; /* the value's name in the usage ("N"), NULL for flags */
  const char *doc; /* '\n' continues on the next usage line */
  double lo, hi;
  const void *aux;
};
typedef bool (*hb_opt_fn)(void *p, const char *value);

/* Fill the table's variables from argv, each value the next argument or after '='
 * ("--iters 5", "--iters=5"). --help prints head and the table and exits 0; a bad flag
 * or value is said, with the usage, and exits 2. */
void hb_parse(int argc, char **argv, const struct hb_opt *t, const char *head);
void hb_usage(FILE *f, const struct hb_opt *t, const char *head);

/* ---- engines ---- */
/* An engine at addr (ip, or ip:port to listen): Transport first when given, then
 * opts[n]; NULL after saying why. */
HixlEngine *hb_engine(const char *addr, const char *transport, const HixlOption *opts, size_t n);
/* Register [p, p + len) host memory: the status, said when it failed. */
HixlStatus hb_reg(HixlEngine *e, const void *p, size_t len, HixlMemHandle *h);

/* --opt KEY=VALUE, repeatable: engine options with their storage. */
#define HB_EXTRA_MAX 16
struct hb_extra {
  HixlOption v[HB_EXTRA_MAX];
  char kv[HB_EXTRA_MAX][128]; /* "KEY\0VALUE" */
  size_t n;
};
/* An HB_FN: "KEY=VALUE" into the struct hb_extra at p; refuses spaces, quotes, a key
 * given twice and Transport (its own flag), saying why. */
bool hb_extra_add(void *p, const char *kv);
/* The value given for key, or NULL. */
const char *hb_extra_get(const struct hb_extra *x, const char *key);

/* len bytes of private memory, populated; NULL on failure (said). */
void *hb_map(size_t len);

/* ---- the peer process: fork before any engine exists; one socketpair ---- */
struct hb_peer {
  pid_t pid;
  int fd; /* the parent's end; the child gets the other */
};
/* Run fn(arg, fd) in a child process, which exits with its result. Dies on failure. */
void hb_spawn(struct hb_peer *p, int (*fn)(void *arg, int fd), void *arg);
/* Close the channel and wait up to timeout_s for the child: its exit code (128 + the signal's
 * number when one ended it); past timeout_s it is killed, which is said, and 1. */
int hb_reap(struct hb_peer *p, int timeout_s);
/* All len bytes to a socket (EINTR retried, no SIGPIPE): false when it failed. */
bool hb_write_all(int fd, const void *p, size_t len);
/* A line (or any bytes) to the peer, all of it; dies when the peer is gone. */
void hb_send(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A '\n'-ended line from the peer, without it; dies when the peer is gone. */
char *hb_recv(int fd, char *buf, size_t cap);
/* Serve (the engines' threads do) until the peer sends the line word or closes: 0; 1 when
 * no such line came within timeout_ms. */
int hb_serve(int fd, const char *word, int timeout_ms);

/* The server's start: n 64-bit words (addresses, lengths) to the client; false when the
 * client is gone. */
bool hb_ready(int fd, const uint64_t *v, size_t n);
/* The client's wait for them, at most 60 s; dies when the server failed to start (it says
 * why itself) or went away. */
void hb_wait_ready(int fd, uint64_t *v, size_t n);

/* ---- hixl-perf: one binary, each test a row of perf.c's table (ucx_perftest's shape).
 * `hixl-perf NAME [options]`, or the test's own program name (a link to hixl-perf): its
 * options parsed into its parameters, its setup run, its server forked (before any
 * engine; the fork hands it the parameters), its client run, the server reaped. ---- */
struct hb_test {
  const char *name;                 /* hixl-perf NAME */
  const char *prog;                 /* its program name (a link) and its messages' prefix */
  const char *doc;                  /* a line of hixl-perf's list */
  const char *head;                 /* the usage's lines above the options */
  const struct hb_opt *opts;        /* its options, a NULL name last */
  int (*setup)(void);               /* after parsing, before the fork: 0, or the exit status */
  int (*server)(int fd);            /* the peer process; NULL: the test runs in one */
  int (*client)(struct hb_peer *p); /* the measurement (p NULL without a server): the exit status */
};

/* The CPU time, user + system, of every thread of process pid (0: this one) so far, in
 * ns: its process CPU-time clock (clock_getcpuclockid), which reads another process
 * too, at the scheduler's resolution (getrusage's of a child waits for its exit). */
uint64_t hb_cpu_ns(pid_t pid);

/* n TCP ports in a row free on ip now; dies when there are none. */
uint16_t hb_ports(const char *ip, unsigned n);

/* ---- the reporter: a result record's fields, each described once, written as a
 * markdown table row, a CSV line or a JSON object ---- */
struct hb_field {
  const char *key;  /* JSON key and CSV column; NULL: the table's alone */
  const char *head; /* the table's column; NULL: not in the table */
  const char *fmt;  /* a double's format in JSON and CSV ("%.4f"); NULL: u or s */
  const char *tfmt; /* its format in the table; NULL: fmt */
  uint64_t u;
  double d;
  const char *s; /* a string (quoted in JSON), when not NULL */
  bool raw;      /* s is a JSON literal (true, [1, 2]): not quoted */
};
#define HB_FU(key, head, v)                                                                                  \
  { key, head, NULL, NULL, (uint64_t)(v), 0, NULL, false }
#define HB_FD(key, head, fmt, tfmt, v)                                                                       \
  { key, head, fmt, tfmt, 0, (double)(v), NULL, false }
#define HB_FS(key, head, v)                                                                                  \
  { key, head, NULL, NULL, 0, 0, (v), false }
#define HB_FR(key, head, v)                                                                                  \
  { key, head, NULL, NULL, 0, 0, (v), true }
#define HB_NF(rec) (sizeof(rec) / sizeof((rec)[0]))
enum hb_out { HB_MD, HB_CSV, HB_JSON };
/* The header of a markdown table (its two lines) or of a CSV file (its line). */
void hb_head(FILE *f, enum hb_out how, const struct hb_field *r, size_t n);
/* s as a JSON string: quoted, with '"', '\\' and control characters escaped. */
void hb_json_str(FILE *f, const char *s);
/* One record: "| a | b |", "a,b" or {"k": a, "k2": b}, without a newline; a string
 * field is escaped in JSON (hb_json_str). */
void hb_row(FILE *f, enum hb_out how, const struct hb_field *r, size_t n);
/* Item i of n of a JSON array: "    {...}" and ",\n", or "\n" after the last. */
void hb_json_item(FILE *f, size_t i, size_t n, const struct hb_field *r, size_t nf);
/* A CSV file opened for appending, its header written when new or empty; NULL after
 * saying why (it cannot be opened, or it starts with another header). */
FILE *hb_csv(const char *path, const char *header);
/* A JSON file opened for writing, begun with what every bench records: "{\n  "tool",
 * "hixl_version", "time", "kernel", "cpus" (each a line, with its comma); dies on failure. */
FILE *hb_json_open(const char *path, const char *tool);

/* Poll request r until it is no longer WAITING (a request has no descriptor): the
 * status of the last poll, its state into *ts. */
HixlStatus hb_wait_xfer(HixlEngine *e, HixlTransferReq r, HixlTransferStatus *ts);

/* ---- a KV-connector host (hixl_kv_connector.h): what a runtime does each step ---- */
struct hixl_kv_ops;
struct hixl_kv_connector;
/* A KV connector plugin's ops table (dlopen, its one entry); dies when unusable. */
const struct hixl_kv_ops *hb_plugin(const char *path);
/* A step: the scheduler's metadata bound to each of the n workers, their loads started;
 * dies on failure. */
void hb_kv_step(const struct hixl_kv_ops *ops, struct hixl_kv_connector *sched,
                struct hixl_kv_connector *const *w, size_t n);
/* One get_finished of worker: how many requests finished sending and receiving into
 * *sent and *recvd (when not NULL), and whether id (when not NULL) is among those of
 * `which` (0 sending, 1 receiving); with sched, the scheduler learns them
 * (update_connector_output, as a runtime's does). Dies when a block failed to load. */
bool hb_kv_poll(const struct hixl_kv_ops *ops, struct hixl_kv_connector *sched,
                struct hixl_kv_connector *worker, const char *id, int which, size_t *sent, size_t *recvd);

/* ---- one writer for every record a bench prints or keeps ---- */
/* Record i of n to each output given (NULL: none): md, a markdown table (its head before
 * record 0; a row a line); json, an item of hb_json_open's array; csv, a line. */
void hb_emit(FILE *md, FILE *json, FILE *csv, size_t i, size_t n, const struct hb_field *r, size_t nf);
/* Close the array a JSON file ends with and the file: false after saying why. */
bool hb_json_end(FILE *f, const char *path);
/* Whether path can take rows under header (hb_csv), checked before measuring. */
bool hb_csv_ready(const char *path, const char *header);

#endif /* HIXL_BENCH_HARNESS_H */
