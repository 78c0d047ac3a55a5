/* harness: the parts every benchmark shares (harness.h). */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/utsname.h>

#include "harness.h"
#include "hixl/hixl_kv_connector.h"

const char *hb_prog = "hixl-bench";

static void vsay(const char *fmt, va_list ap) {
  fprintf(stderr, "%s: ", hb_prog);
  vfprintf(stderr, fmt, ap);
}

void hb_say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsay(fmt, ap);
  va_end(ap);
}

void hb_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsay(fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(1);
}

bool hb_fail(const char *what, HixlStatus st) {
  const char *why = HixlGetLastErrorMessage();
  hb_say("%s failed: %s%s%s\n", what, HixlStatusName(st), why && *why ? ": " : "", why ? why : "");
  return false;
}

bool hb_ok(HixlStatus st, const char *what) { return st == HIXL_SUCCESS || hb_fail(what, st); }

void hb_check(HixlStatus st, const char *fmt, ...) {
  char what[256];
  va_list ap;
  if (st == HIXL_SUCCESS) return;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  hb_fail(what, st);
  exit(1);
}

/* ------------------------------------------------------------- the option table */

void hb_usage(FILE *f, const struct hb_opt *t, const char *head) {
  fprintf(f, "usage: %s [options]\n%s", hb_prog, head ? head : "");
  for (; t->name; t++) {
    char flag[64];
    snprintf(flag, sizeof(flag), "%s%s%s", t->name, t->arg ? " " : "", t->arg ? t->arg : "");
    fprintf(f, "  %-24s ", flag);
    for (const char *d = t->doc; d && *d; d++)
      if (*d == '\n')
        fprintf(f, "\n%27s", "");
      else
        fputc(*d, f);
    fputc('\n', f);
  }
}

static bool in_range(const struct hb_opt *t, double v) {
  return t->hi <= t->lo || (v >= t->lo && v <= t->hi);
}

/* One value into the row's variable; false when it is not one. */
static bool opt_set(const struct hb_opt *t, const char *v) {
  uint64_t u = 0;
  char *end = NULL;
  switch (t->kind) {
  case HB_STR: *(const char **)t->p = v; return true;
  case HB_U32:
  case HB_U64:
  case HB_UNS:
    if (!bench_parse_u64(v, &u) || !in_range(t, (double)u)) return false;
    if (t->kind == HB_U64) *(uint64_t *)t->p = u;
    if (t->kind == HB_U32) *(uint32_t *)t->p = (uint32_t)u;
    if (t->kind == HB_UNS) *(unsigned *)t->p = (unsigned)u;
    return u <= UINT32_MAX || t->kind == HB_U64;
  case HB_INT: {
    long l = strtol(v, &end, 10);
    *(int *)t->p = (int)l;
    return end != v && *end == '\0' && in_range(t, (double)l);
  }
  case HB_SIZE: return bench_parse_size(v, (size_t *)t->p) && in_range(t, (double)*(size_t *)t->p);
  case HB_SIZES: { /* "4K,64K,4M": at most BENCH_MAX_LIST sizes, each > 0 */
    size_t *s = t->p, k = 0;
    for (const char *rest = NULL;; v = rest + 1) {
      if (k == BENCH_MAX_LIST || !bench_parse_size_prefix(v, &s[k], &rest) || s[k] == 0 ||
          !in_range(t, (double)s[k]))
        return false;
      k++;
      if (*rest == ',') continue;
      *(size_t *)t->aux = k;
      return *rest == '\0';
    }
  }
  case HB_DBL:
    *(double *)t->p = strtod(v, &end);
    return end != v && *end == '\0' && in_range(t, *(double *)t->p);
  case HB_CHOICE:
    for (const char *const *c = t->aux; *c; c++)
      if (strcmp(*c, v) == 0) return *(int *)t->p = (int)(c - (const char *const *)t->aux), true;
    return false;
  case HB_PIN: /* "I,T": two CPUs (the initiator's or sender's, the target's or receiver's) */
    for (int k = 0; k < 2; k++, v = end + 1) {
      long cpu = *v >= '0' && *v <= '9' ? strtol(v, &end, 10) : -1;
      if (cpu < 0 || cpu >= CPU_SETSIZE || *end != (k ? '\0' : ',')) return false;
      ((int *)t->p)[k] = (int)cpu;
    }
    return true;
  case HB_FN: return ((hb_opt_fn)t->aux)(t->p, v);
  default: return false;
  }
}

void hb_parse(int argc, char **argv, const struct hb_opt *tab, const char *head) {
  for (int i = 1; i < argc; i++) {
    /* "--name value", or "--name=value" (the value after the first '='); a flag takes none */
    const char *a = argv[i], *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
    const char *v = eq ? eq + 1 : i + 1 < argc ? argv[i + 1] : NULL;
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    const struct hb_opt *t = tab;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      hb_usage(stdout, tab, head);
      exit(0);
    }
    while (t->name && (strncmp(t->name, a, len) != 0 || t->name[len] != '\0')) t++;
    bool flag = t->name && (t->kind == HB_FLAG || t->kind == HB_NOFLAG);
    if (flag && !eq) *(bool *)t->p = t->kind == HB_FLAG;
    if (!t->name || (flag && eq) || (!flag && (v == NULL || !opt_set(t, v)))) {
      bool shown = t->name && v && !eq; /* the value, when it is the next argument */
      hb_say("bad option or value: %s%s%s\n", a, shown ? " " : "", shown ? v : "");
      hb_usage(stderr, tab, head);
      exit(2);
    }
    i += !flag && !eq;
  }
}

/* ------------------------------------------------------------ engines, memory */

HixlEngine *hb_engine(const char *addr, const char *transport, const HixlOption *opts, size_t n) {
  HixlOption all[40];
  HixlEngine *e = NULL;
  size_t k = 0;
  if (transport) all[k++] = (HixlOption){"Transport", transport};
  for (size_t i = 0; i < n && k < sizeof(all) / sizeof(all[0]); i++) all[k++] = opts[i];
  HixlStatus st = HixlEngineCreate(&e);
  if (st != HIXL_SUCCESS) return hb_fail("HixlEngineCreate", st), NULL;
  st = HixlEngineInitialize(e, addr, all, k);
  if (st == HIXL_SUCCESS) return e;
  char what[128];
  snprintf(what, sizeof(what), "HixlEngineInitialize(%s)", addr);
  hb_fail(what, st);
  HixlEngineDestroy(e);
  return NULL;
}

HixlStatus hb_reg(HixlEngine *e, const void *p, size_t len, HixlMemHandle *h) {
  HixlMemDesc d = {(uintptr_t)p, len};
  HixlStatus st = HixlEngineRegisterMem(e, &d, HIXL_MEM_HOST, h);
  if (st != HIXL_SUCCESS) hb_fail("HixlEngineRegisterMem", st);
  return st;
}

const char *hb_extra_get(const struct hb_extra *x, const char *key) {
  for (size_t i = 0; i < x->n; i++)
    if (strcmp(x->v[i].key, key) == 0) return x->v[i].value;
  return NULL;
}

bool hb_extra_add(void *p, const char *kv) {
  struct hb_extra *x = p;
  const char *eq = strchr(kv, '=');
  char *copy = x->kv[x->n < HB_EXTRA_MAX ? x->n : 0];
  if (x->n == HB_EXTRA_MAX || strlen(kv) >= sizeof(x->kv[0]) || !eq || eq == kv || strpbrk(kv, "\"\\ ")) {
    hb_say("--opt %s: expected KEY=VALUE (no spaces or quotes), at most %d of %zu bytes\n", kv, HB_EXTRA_MAX,
           sizeof(x->kv[0]) - 1);
    return false;
  }
  snprintf(copy, sizeof(x->kv[0]), "%s", kv);
  copy[eq - kv] = '\0';
  if (strcmp(copy, "Transport") == 0 || hb_extra_get(x, copy)) {
    hb_say("--opt %s: %s\n", kv,
           hb_extra_get(x, copy) ? "given twice" : "the transport has its own flag, --transport");
    return false;
  }
  x->v[x->n++] = (HixlOption){copy, copy + (eq - kv) + 1};
  return true;
}

void *hb_map(size_t len) {
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) hb_say("mmap of %zu bytes: %s\n", len, strerror(errno));
  return p == MAP_FAILED ? NULL : p;
}

/* ------------------------------------------------------------ the peer process */

void hb_spawn(struct hb_peer *p, int (*fn)(void *arg, int fd), void *arg) {
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0) hb_die("socketpair: %s", strerror(errno));
  signal(SIGPIPE, SIG_IGN);
  fflush(NULL);
  p->pid = fork();
  if (p->pid < 0) hb_die("fork: %s", strerror(errno));
  if (p->pid == 0) {
    close(sp[0]);
    int rc = fn(arg, sp[1]);
    fflush(NULL);
    _exit(rc);
  }
  close(sp[1]);
  p->fd = sp[0];
}

int hb_reap(struct hb_peer *p, int timeout_s) {
  uint64_t deadline = bench_now_ns() + (uint64_t)timeout_s * 1000000000ull;
  int wst = 0;
  if (p->fd >= 0) close(p->fd);
  p->fd = -1;
  for (;;) { /* polled: a child's exit has no descriptor */
    pid_t w = waitpid(p->pid, &wst, WNOHANG);
    if (w == p->pid) return WIFEXITED(wst) ? WEXITSTATUS(wst) : 128 + WTERMSIG(wst);
    if (w < 0) return 1;
    if (bench_now_ns() > deadline) {
      hb_say("the peer process %d did not exit within %d s; killed it\n", (int)p->pid, timeout_s);
      kill(p->pid, SIGKILL);
      waitpid(p->pid, &wst, 0);
      return 1;
    }
    poll(NULL, 0, 10);
  }
}

void hb_send(int fd, const char *fmt, ...) {
  char buf[1 << 16];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n > 0 && !hb_write_all(fd, buf, (size_t)n))
    hb_die("the other process went away (send: %s)", strerror(errno));
}

bool hb_write_all(int fd, const void *p, size_t len) {
  for (const char *s = p; len > 0;) {
    ssize_t k = send(fd, s, len, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    s += k, len -= (size_t)k;
  }
  return true;
}

char *hb_recv(int fd, char *buf, size_t cap) {
  if (bench_read_line(fd, buf, cap, 3600 * 1000) != 1) hb_die("the other process went away");
  return buf;
}

int hb_serve(int fd, const char *word, int timeout_ms) {
  char line[512];
  int r;
  while ((r = bench_read_line(fd, line, sizeof(line), timeout_ms)) == 1)
    if (strcmp(line, word) == 0) return 0;
  return r == 0 ? 0 : 1;
}

bool hb_ready(int fd, const uint64_t *v, size_t n) { return hb_write_all(fd, v, n * sizeof(*v)); }

void hb_wait_ready(int fd, uint64_t *v, size_t n) {
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  if (poll(&pfd, 1, 60000) != 1 || bench_read_full(fd, v, n * sizeof(*v)) != 0)
    hb_die("the server process did not start (its message, if any, is above)");
}

uint64_t hb_cpu_ns(pid_t pid) {
  clockid_t c = CLOCK_PROCESS_CPUTIME_ID;
  struct timespec ts;
  if ((pid && clock_getcpuclockid(pid, &c) != 0) || clock_gettime(c, &ts) != 0)
    hb_die("the CPU time of process %d: %s", (int)pid, strerror(errno));
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Bind ip:port (0: any free one) and close: the port it bound; 0 when it could not. */
static uint16_t port_bind(const char *ip, uint16_t port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  socklen_t l = sizeof(a);
  int fd = inet_pton(AF_INET, ip, &a.sin_addr) == 1 ? socket(AF_INET, SOCK_STREAM, 0) : -1;
  bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &l) == 0;
  if (fd >= 0) close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

uint16_t hb_ports(const char *ip, unsigned n) {
  for (int t = 0; t < 200; t++) {
    uint16_t base = port_bind(ip, 0);
    bool ok = base && base + n < 65000;
    for (unsigned i = 1; i < n && ok; i++) ok = port_bind(ip, (uint16_t)(base + i)) != 0;
    if (ok) return base;
  }
  hb_die("no %u free ports in a row on %s", n, ip);
}

/* ----------------------------------------------------------------- the reporter */

static bool in_out(enum hb_out how, const struct hb_field *x) {
  return how == HB_MD ? x->head != NULL : x->key != NULL;
}

void hb_head(FILE *f, enum hb_out how, const struct hb_field *r, size_t n) {
  for (size_t i = 0, k = 0; i < n; i++) {
    if (!in_out(how, &r[i])) continue;
    if (how == HB_MD)
      fprintf(f, "| %s ", r[i].head);
    else
      fprintf(f, "%s%s", k++ ? "," : "", r[i].key);
  }
  if (how == HB_MD) {
    fputs("|\n", f);
    for (size_t i = 0; i < n; i++)
      if (r[i].head) fputs("|---", f);
  }
  fputs(how == HB_MD ? "|\n" : "\n", f);
}

void hb_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++)
    fprintf(f, *s == '"' || *s == '\\' ? "\\%c" : (unsigned char)*s < 0x20 ? "\\u%04x" : "%c", *s);
  fputc('"', f);
}

void hb_row(FILE *f, enum hb_out how, const struct hb_field *r, size_t n) {
  const char *sep = how == HB_MD ? "| " : how == HB_CSV ? "" : "{";
  for (size_t i = 0; i < n; i++) {
    const struct hb_field *x = &r[i];
    if (!in_out(how, x)) continue;
    fputs(sep, f);
    if (how == HB_JSON) fprintf(f, "\"%s\": ", x->key);
    if (x->s && how == HB_JSON && !x->raw)
      hb_json_str(f, x->s);
    else if (x->s)
      fputs(x->s, f);
    else if (x->fmt)
      fprintf(f, how == HB_MD && x->tfmt ? x->tfmt : x->fmt, x->d);
    else
      fprintf(f, "%" PRIu64, x->u);
    sep = how == HB_MD ? " | " : how == HB_CSV ? "," : ", ";
  }
  fputs(how == HB_MD ? " |" : how == HB_CSV ? "" : "}", f);
}

void hb_json_item(FILE *f, size_t i, size_t n, const struct hb_field *r, size_t nf) {
  fputs("    ", f);
  hb_row(f, HB_JSON, r, nf);
  fputs(i + 1 < n ? ",\n" : "\n", f);
}

FILE *hb_csv(const char *path, const char *header) {
  char first[1024] = "";
  struct stat st;
  FILE *f = fopen(path, "a+");
  if (f == NULL) return hb_say("cannot append to %s: %s\n", path, strerror(errno)), NULL;
  bool empty = fstat(fileno(f), &st) == 0 && st.st_size == 0;
  if (!empty && fgets(first, sizeof(first), f) == NULL) first[0] = '\0';
  first[strcspn(first, "\r\n")] = '\0';
  if (!empty && strcmp(first, header) != 0) { /* rows under it would land in the wrong columns */
    fclose(f);
    hb_say("cannot append to %s: it starts with another header (another tool's or an older one's); use a "
           "new file\n",
           path);
    return NULL;
  }
  fseek(f, 0, SEEK_END); /* a read must not be followed by a write without a seek */
  if (empty) fprintf(f, "%s\n", header);
  return f;
}

FILE *hb_json_open(const char *path, const char *tool) {
  struct utsname u;
  FILE *f = fopen(path, "w");
  if (f == NULL) hb_die("--json %s: %s", path, strerror(errno));
  if (uname(&u) != 0) snprintf(u.release, sizeof(u.release), "?");
  fprintf(f,
          "{\n  \"tool\": \"%s\",\n  \"hixl_version\": \"%s\",\n  \"time\": %lld,\n  \"kernel\": \"%s\",\n  "
          "\"cpus\": %ld,\n",
          tool, HixlVersionString(), (long long)time(NULL), u.release, sysconf(_SC_NPROCESSORS_ONLN));
  return f;
}

const hixl_kv_ops *hb_plugin(const char *path) {
  const hixl_kv_ops *ops = NULL;
  char err[256] = "";
  void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  hixl_kv_entry_fn entry = so ? (hixl_kv_entry_fn)dlsym(so, HIXL_KV_ENTRY_SYMBOL) : NULL;
  if (!entry || entry(HIXL_KV_ABI_MAJOR, &ops, err, sizeof(err)) != HIXL_KV_SUCCESS)
    hb_die("%s: no usable %s (%s%s)", path, HIXL_KV_ENTRY_SYMBOL, so ? "" : dlerror(), err);
  return ops;
}

void hb_kv_step(const hixl_kv_ops *ops, hixl_kv_connector *sched, hixl_kv_connector *const *w, size_t n) {
  hixl_kv_buffer m = {0};
  if (ops->build_connector_meta(sched, &m) != HIXL_KV_SUCCESS)
    hb_die("build_connector_meta: %s", ops->last_error());
  for (size_t i = 0; i < n; i++)
    if (ops->bind_connector_meta(w[i], m.data, m.len) != HIXL_KV_SUCCESS ||
        ops->start_load_kv(w[i]) != HIXL_KV_SUCCESS)
      hb_die("bind_connector_meta / start_load_kv of worker %zu: %s", i, ops->last_error());
  ops->free_buffer(&m);
}

bool hb_kv_poll(const hixl_kv_ops *ops, hixl_kv_connector *sched, hixl_kv_connector *worker, const char *id,
                int which, size_t *sent, size_t *recvd) {
  hixl_kv_ids s = {0}, r = {0};
  hixl_kv_blocks eb = {0};
  bool got = false;
  if (ops->get_finished(worker, NULL, &s, &r) != HIXL_KV_SUCCESS)
    hb_die("get_finished: %s", ops->last_error());
  const hixl_kv_ids *ids = which ? &r : &s;
  for (size_t i = 0; id && i < ids->count; i++) got |= strcmp(ids->ids[i], id) == 0;
  if (sched && (s.count || r.count) && ops->update_connector_output(sched, &s, &r, NULL) != HIXL_KV_SUCCESS)
    hb_die("update_connector_output: %s", ops->last_error());
  if (sent) *sent = s.count;
  if (recvd) *recvd = r.count;
  ops->free_ids(&s);
  ops->free_ids(&r);
  ops->get_block_ids_with_load_errors(worker, &eb);
  size_t nerr = eb.count;
  ops->free_buffer(&eb.raw);
  if (nerr) hb_die("%zu blocks failed to load (see the plugin's message above)", nerr);
  return got;
}

HixlStatus hb_wait_xfer(HixlEngine *e, HixlTransferReq r, HixlTransferStatus *ts) {
  struct timespec d = {0, 20000};
  HixlStatus st;
  while ((st = HixlEngineGetTransferStatus(e, r, ts)) == HIXL_SUCCESS && *ts == HIXL_TRANSFER_WAITING)
    nanosleep(&d, NULL);
  return st;
}

/* ---- one writer for every record a bench prints or keeps ---- */

void hb_emit(FILE *md, FILE *json, FILE *csv, size_t i, size_t n, const struct hb_field *r, size_t nf) {
  if (md && i == 0) hb_head(md, HB_MD, r, nf);
  if (md) {
    hb_row(md, HB_MD, r, nf);
    fputc('\n', md);
  }
  if (json) hb_json_item(json, i, n, r, nf);
  if (csv) {
    hb_row(csv, HB_CSV, r, nf);
    fputc('\n', csv);
  }
}

bool hb_json_end(FILE *f, const char *path) {
  fputs("  ]\n}\n", f);
  if (fclose(f) == 0) return true;
  hb_say("--json %s: %s\n", path, strerror(errno));
  return false;
}

bool hb_csv_ready(const char *path, const char *header) {
  FILE *f = hb_csv(path, header);
  return f && fclose(f) == 0;
}
