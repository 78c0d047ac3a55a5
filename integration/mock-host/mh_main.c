/* hixl-mock-host: the router. It loads the KV-connector plugin, starts a prefill and a
 * decode instance (each its own process), sends each request to prefill, takes the
 * kv_transfer_params request_finished returned and sends the request with them to
 * decode, as vLLM's disaggregated proxy does; then prints what moved, how fast, and
 * whether every byte arrived. See integration/mock-host/README.md. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <limits.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mh.h"

#ifndef MH_DEFAULT_PLUGIN
#define MH_DEFAULT_PLUGIN "libhixl_kv_connector.so"
#endif
#ifndef MH_CONFIG_MAIN
#define MH_CONFIG_MAIN ""
#endif
#ifndef MH_CONFIG_MOCK
#define MH_CONFIG_MOCK ""
#endif

/* ---- options ---- */

struct opts {
  const char *plugin, *config, *json, *transport, *policy, *model_name, *mode, *layout;
  const char *kv_memory; /* "hixl" (alloc_kv_caches) or "host" (the host's, register_kv_caches) */
  const char *prefill_addr, *decode_addr;
  struct mh_model model;
  uint64_t kv_mib;
  uint32_t requests, concurrency, compute_us;
  uint64_t min_prompt, max_prompt, seed;
  int64_t lease_ms;
  enum mh_fault fault;
  uint32_t fault_at;
  const char *set[16]; /* --set KEY=VALUE, in order */
  uint32_t nset;
  uint32_t timeout_s;
  bool progress, verbose;
};

static const char *const fault_names[] = {"none",           "decode-dies", "prefill-dies",  "mismatch-block",
                                          "mismatch-dtype", "link-cut",    "decode-aborts", "link-reset"};

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: hixl-mock-host [options]\n"
      "  A prefill and a decode instance (separate processes, each a scheduler and a worker KV\n"
      "  connector) and a router; every byte of KV that reaches decode is checked.\n"
      "  --plugin PATH            libhixl_kv_connector.so (default: the one built beside this host)\n"
      "  --config FILE            base connector config (JSON); address and role are set per instance\n"
      "  --model NAME             preset shape (default llama8b: 32 layers, 8 KV heads x 128 x 2 B,\n"
      "                           16-token blocks; tiny: 2 layers, 2 x 16 x 2 B, 4-token blocks, 64 blocks;\n"
      "                           mla: 4 layers, a latent of 576 x 2 B, 16-token blocks; hybrid: tiny's\n"
      "                           heads, 4 layers, the odd ones a sliding window of a quarter of the\n"
      "                           largest prompt)\n"
      "  --layout NAME            the KV tensors' layout: kv_first (default; ABI 1.0's\n"
      "                           register_kv_caches), or through ABI 1.3's register_kv_groups:\n"
      "                           blocks_first, packed, LBNHC, LBHNC, LHBNC, BLNHC, BLHNC, BHLNC,\n"
      "                           cross_layer\n"
      "  --layers N --kv-heads N --head-dim N --elem-size N --block-tokens N --num-blocks N\n"
      "  --kv-mib N               KV cache per instance, sets --num-blocks (llama8b default 512)\n"
      "  --kv-memory hixl|host    who allocates the KV caches: the plugin (alloc_kv_caches, or\n"
      "                           alloc_kv_memory: memory a same-host peer maps; default) or the host\n"
      "  --requests N             (default 16)       --concurrency N (default 4)\n"
      "  --min-prompt N --max-prompt N   prompt tokens, uniform (default 16 .. 4096, tiny 16 .. 64)\n"
      "  --seed N                 prompts and KV content (default 1)\n"
      "  --compute-us-per-token N prefill compute time per layer per token (default 0)\n"
      "  --transport NAME         sets the config's Transport (tcp, shm, rdma, auto)\n"
      "  --mode pull|push         sets the config's mode (push: decode allocates first, prefill\n"
      "                           writes each layer into it as soon as it is computed)\n"
      "  --lease-ms N             sets the config's lease_ms\n"
      "  --on-load-failure fail|recompute   sets the config's load_failure_policy\n"
      "  --prefill-addr IP:PORT --decode-addr IP:PORT   (default 127.0.0.1 and free ports)\n"
      "  --set KEY=VALUE          any other config key (VALUE is JSON, else a string); repeatable\n"
      "  --fault decode-dies|prefill-dies|mismatch-block|mismatch-dtype|link-cut|link-reset|\n"
      "          decode-aborts\n"
      "           --fault-at N    (link-cut: prefill is stopped, SIGSTOP, after the Nth hand-off until\n"
      "                           every load in flight has ended, then resumed; link-reset: at the Nth\n"
      "                           hand-off prefill shuts down every TCP connection it has, transfers in\n"
      "                           flight fail, later ones link again; decode-aborts: decode aborts its\n"
      "                           Nth load as it starts, as a client that went away)\n"
      "  --timeout S              give up after S seconds (default 120)\n"
      "  --json FILE              the summary as JSON\n"
      "  --no-progress --verbose --help\n"
      "Exit status: 0 when every request verified (with --fault: the fault was reported, no byte\n"
      "was wrong, and the surviving side holds zero blocks), 1 otherwise, 2 for bad options.\n");
}

static bool parse_u64(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || s[0] == '-') return false;
  *out = v;
  return true;
}

static int parse_opts(int argc, char **argv, struct opts *o) {
  enum {
    O_PLUGIN = 256,
    O_CONFIG,
    O_MODEL,
    O_LAYERS,
    O_HEADS,
    O_DIM,
    O_ELEM,
    O_BT,
    O_NB,
    O_MIB,
    O_REQ,
    O_CONC,
    O_MINP,
    O_MAXP,
    O_SEED,
    O_CUS,
    O_TRANSPORT,
    O_LEASE,
    O_POLICY,
    O_PADDR,
    O_DADDR,
    O_FAULT,
    O_FAT,
    O_TIMEOUT,
    O_JSON,
    O_NOPROG,
    O_VERBOSE,
    O_MODE,
    O_SET,
    O_KVMEM,
    O_LAYOUT,
    O_HELP
  };
  static const struct option lo[] = {{"plugin", 1, 0, O_PLUGIN},
                                     {"config", 1, 0, O_CONFIG},
                                     {"model", 1, 0, O_MODEL},
                                     {"layers", 1, 0, O_LAYERS},
                                     {"kv-heads", 1, 0, O_HEADS},
                                     {"head-dim", 1, 0, O_DIM},
                                     {"elem-size", 1, 0, O_ELEM},
                                     {"block-tokens", 1, 0, O_BT},
                                     {"num-blocks", 1, 0, O_NB},
                                     {"kv-mib", 1, 0, O_MIB},
                                     {"requests", 1, 0, O_REQ},
                                     {"concurrency", 1, 0, O_CONC},
                                     {"min-prompt", 1, 0, O_MINP},
                                     {"max-prompt", 1, 0, O_MAXP},
                                     {"seed", 1, 0, O_SEED},
                                     {"compute-us-per-token", 1, 0, O_CUS},
                                     {"transport", 1, 0, O_TRANSPORT},
                                     {"lease-ms", 1, 0, O_LEASE},
                                     {"on-load-failure", 1, 0, O_POLICY},
                                     {"prefill-addr", 1, 0, O_PADDR},
                                     {"decode-addr", 1, 0, O_DADDR},
                                     {"fault", 1, 0, O_FAULT},
                                     {"fault-at", 1, 0, O_FAT},
                                     {"timeout", 1, 0, O_TIMEOUT},
                                     {"json", 1, 0, O_JSON},
                                     {"no-progress", 0, 0, O_NOPROG},
                                     {"verbose", 0, 0, O_VERBOSE},
                                     {"mode", 1, 0, O_MODE},
                                     {"set", 1, 0, O_SET},
                                     {"kv-memory", 1, 0, O_KVMEM},
                                     {"layout", 1, 0, O_LAYOUT},
                                     {"help", 0, 0, O_HELP},
                                     {0, 0, 0, 0}};
  uint64_t set[O_HELP + 1] = {0}, v = 0;
  bool given[O_HELP + 1] = {0};
  int c;
  *o = (struct opts){.requests = 16,
                     .concurrency = 4,
                     .seed = 1,
                     .lease_ms = -1,
                     .timeout_s = 120,
                     .progress = true,
                     .model_name = "llama8b",
                     .kv_memory = "hixl",
                     .kv_mib = 512};
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    if (c == '?') return 2;
    given[c] = true;
    switch (c) {
    case O_PLUGIN: o->plugin = optarg; break;
    case O_CONFIG: o->config = optarg; break;
    case O_MODEL: o->model_name = optarg; break;
    case O_TRANSPORT: o->transport = optarg; break;
    case O_POLICY: o->policy = optarg; break;
    case O_PADDR: o->prefill_addr = optarg; break;
    case O_DADDR: o->decode_addr = optarg; break;
    case O_JSON: o->json = optarg; break;
    case O_MODE: o->mode = optarg; break;
    case O_LAYOUT: o->layout = optarg; break;
    case O_KVMEM:
      if (strcmp(optarg, "hixl") != 0 && strcmp(optarg, "host") != 0) {
        fprintf(stderr, "hixl-mock-host: --kv-memory %s: want hixl or host\n", optarg);
        return 2;
      }
      o->kv_memory = optarg;
      break;
    case O_SET:
      if (!strchr(optarg, '=') || optarg[0] == '=' || o->nset == sizeof(o->set) / sizeof(o->set[0])) {
        fprintf(stderr, "hixl-mock-host: --set %s: want KEY=VALUE (at most 16)\n", optarg);
        return 2;
      }
      o->set[o->nset++] = optarg;
      break;
    case O_NOPROG: o->progress = false; break;
    case O_VERBOSE: o->verbose = true; break;
    case O_HELP: usage(stdout); exit(0);
    case O_FAULT: {
      size_t k = 0;
      while (k < sizeof(fault_names) / sizeof(fault_names[0]) && strcmp(optarg, fault_names[k]) != 0) k++;
      if (k == sizeof(fault_names) / sizeof(fault_names[0])) {
        fprintf(stderr,
                "hixl-mock-host: --fault %s is unknown (decode-dies, prefill-dies, mismatch-block, "
                "mismatch-dtype, link-cut, decode-aborts)\n",
                optarg);
        return 2;
      }
      o->fault = (enum mh_fault)k;
      break;
    }
    default:
      if (!parse_u64(optarg, &v) || (c != O_SEED && c != O_CUS && v == 0) ||
          (c != O_SEED && c != O_MIB && c != O_NB && c != O_LEASE && v > UINT32_MAX)) {
        fprintf(stderr, "hixl-mock-host: --%s %s: want a positive integer\n", lo[c - O_PLUGIN].name, optarg);
        return 2;
      }
      set[c] = v;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "hixl-mock-host: unexpected argument \"%s\" (see --help)\n", argv[optind]);
    return 2;
  }
  struct mh_model *m = &o->model;
  uint64_t max_prompt = 0;
  char why[256];
  if (mh_model_preset(o->model_name, m, &max_prompt) < 0) {
    fprintf(stderr, "hixl-mock-host: --model %s is unknown (tiny, llama8b, mla, hybrid)\n", o->model_name);
    return 2;
  }
  if (o->layout && mh_layout_parse(o->layout, &m->layout) < 0) {
    fprintf(stderr, "hixl-mock-host: --layout %s is unknown (%s)\n", o->layout, mh_layout_list);
    return 2;
  }
  if (given[O_LAYERS]) m->layers = (uint32_t)set[O_LAYERS];
  if (given[O_HEADS]) m->kv_heads = (uint32_t)set[O_HEADS];
  if (given[O_DIM]) m->head_dim = (uint32_t)set[O_DIM];
  if (given[O_ELEM]) m->elem_size = (uint32_t)set[O_ELEM];
  if (given[O_BT]) m->block_tokens = (uint32_t)set[O_BT];
  if (given[O_MIB]) o->kv_mib = set[O_MIB];
  if (given[O_NB])
    m->num_blocks = set[O_NB];
  else if (m->num_blocks == 0 || given[O_MIB])
    m->num_blocks = (o->kv_mib << 20) / mh_pool_block_bytes(m);
  if (given[O_REQ]) o->requests = (uint32_t)set[O_REQ];
  if (given[O_CONC]) o->concurrency = (uint32_t)set[O_CONC];
  if (given[O_SEED]) o->seed = set[O_SEED];
  if (given[O_CUS]) o->compute_us = (uint32_t)set[O_CUS];
  if (given[O_LEASE]) o->lease_ms = (int64_t)set[O_LEASE];
  if (given[O_TIMEOUT]) o->timeout_s = (uint32_t)set[O_TIMEOUT];
  o->min_prompt = given[O_MINP] ? set[O_MINP] : 16;
  o->max_prompt = given[O_MAXP] ? set[O_MAXP] : max_prompt;
  mh_model_window(m, o->max_prompt);
  if (!mh_layout_check(m, why, sizeof(why))) {
    fprintf(stderr, "hixl-mock-host: --model %s --layout %s: %s\n", o->model_name, mh_layout_name(m->layout),
            why);
    return 2;
  }
  o->fault_at = given[O_FAT] ? (uint32_t)set[O_FAT] : (o->requests / 4 > 2 ? o->requests / 4 : 2);
  if (o->min_prompt > o->max_prompt) {
    fprintf(stderr, "hixl-mock-host: --min-prompt %" PRIu64 " is above --max-prompt %" PRIu64 "\n",
            o->min_prompt, o->max_prompt);
    return 2;
  }
  if (m->num_blocks == 0 || mh_request_blocks(m, o->max_prompt) > m->num_blocks) {
    fprintf(stderr,
            "hixl-mock-host: a prompt of %" PRIu64 " tokens needs %" PRIu64
            " blocks of %u tokens; the KV cache has %" PRIu64 " (%" PRIu64
            " KiB): raise --kv-mib or --num-blocks, or lower --max-prompt\n",
            o->max_prompt, mh_request_blocks(m, o->max_prompt), m->block_tokens, m->num_blocks,
            (m->num_blocks * mh_pool_block_bytes(m)) >> 10);
    return 2;
  }
  if (o->mode && strcmp(o->mode, "pull") != 0 && strcmp(o->mode, "push") != 0) {
    fprintf(stderr, "hixl-mock-host: --mode %s: want pull or push\n", o->mode);
    return 2;
  }
  if (o->policy && strcmp(o->policy, "fail") != 0 && strcmp(o->policy, "recompute") != 0) {
    fprintf(stderr, "hixl-mock-host: --on-load-failure %s: want fail or recompute\n", o->policy);
    return 2;
  }
  return 0;
}

/* ---- the plugin ---- */

static int plugin_load(const char *path, const hixl_kv_ops **out) {
  void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!so) {
    fprintf(stderr,
            "hixl-mock-host: cannot load the plugin: %s (build target hixl_kv_connector, or --plugin)\n",
            dlerror());
    return -1;
  }
  hixl_kv_entry_fn entry = (hixl_kv_entry_fn)dlsym(so, HIXL_KV_ENTRY_SYMBOL);
  if (!entry) {
    fprintf(stderr, "hixl-mock-host: %s exports no %s: not a hixl KV connector\n", path,
            HIXL_KV_ENTRY_SYMBOL);
    return -1;
  }
  const hixl_kv_ops *ops = NULL;
  char err[512] = "";
  hixl_kv_status st = entry(HIXL_KV_ABI_MAJOR, &ops, err, sizeof(err));
  if (st != HIXL_KV_SUCCESS || !ops) {
    fprintf(stderr, "hixl-mock-host: %s(%u) failed (%s): %s\n", HIXL_KV_ENTRY_SYMBOL, HIXL_KV_ABI_MAJOR,
            mh_status_name(st), err);
    return -1;
  }
  if (ops->abi_version >> 16 != HIXL_KV_ABI_MAJOR) {
    fprintf(stderr, "hixl-mock-host: the plugin's ops table is ABI %u.%u; this host needs major %u\n",
            ops->abi_version >> 16, ops->abi_version & 0xffff, HIXL_KV_ABI_MAJOR);
    return -1;
  }
  /* The ops this host cannot run without (update_connector_output, clear_connector_meta
   * and get_stats are optional; get_push_params is checked for push mode). */
#define NEED(op)                                                                                             \
  { offsetof(hixl_kv_ops, op) + sizeof(((hixl_kv_ops *)0)->op), #op }
  static const struct {
    size_t end;
    const char *name;
  } need[] = {NEED(create),
              NEED(destroy),
              NEED(last_error),
              NEED(free_buffer),
              NEED(free_ids),
              NEED(get_num_new_matched_tokens),
              NEED(update_state_after_alloc),
              NEED(build_connector_meta),
              NEED(request_finished),
              NEED(register_kv_caches),
              NEED(bind_connector_meta),
              NEED(start_load_kv),
              NEED(wait_for_layer_load),
              NEED(save_kv_layer),
              NEED(wait_for_save),
              NEED(get_finished),
              NEED(get_block_ids_with_load_errors)};
#undef NEED
  for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++)
    if (ops->size < need[i].end) {
      fprintf(stderr, "hixl-mock-host: the plugin's ops table (%u bytes) has no %s\n", ops->size,
              need[i].name);
      return -1;
    }
  *out = ops;
  return 0;
}

static bool file_exists(const char *p) {
  struct stat st;
  return p && *p && stat(p, &st) == 0;
}

/* --plugin, else $HIXL_KV_PLUGIN, else the one CMake built, else beside this binary. */
static const char *plugin_path(const char *given, char *buf, size_t cap) {
  if (given) return given;
  const char *env = getenv("HIXL_KV_PLUGIN");
  if (env && *env) return env;
  if (file_exists(MH_DEFAULT_PLUGIN)) return MH_DEFAULT_PLUGIN;
  ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
  if (n > 0) {
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash && (size_t)(slash - buf) + 32 < cap) {
      strcpy(slash + 1, "libhixl_kv_connector.so");
      if (file_exists(buf)) return buf;
    }
  }
  return MH_DEFAULT_PLUGIN;
}

/* ---- per-instance configuration ---- */

static uint16_t free_port(void) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t sl = sizeof(sa);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  uint16_t port = 0;
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
      getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
    port = ntohs(sa.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

/* The base document with this instance's address and role (and the flags' overrides). */
static char *instance_config(const struct opts *o, const char *path, bool prefill, int64_t *lease_ms,
                             bool *push) {
  json_object *doc = json_object_from_file(path);
  if (!doc || !json_object_is_type(doc, json_type_object)) {
    fprintf(stderr, "hixl-mock-host: --config %s: %s\n", path,
            doc ? "not a JSON object" : json_util_get_last_err());
    json_object_put(doc);
    return NULL;
  }
  char addr[64];
  const char *given = prefill ? o->prefill_addr : o->decode_addr;
  if (given)
    snprintf(addr, sizeof(addr), "%s", given);
  else
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)free_port());
  json_object_object_add(doc, "address", json_object_new_string(addr));
  json_object_object_add(doc, "role", json_object_new_string(prefill ? "producer" : "consumer"));
  if (o->transport) json_object_object_add(doc, "Transport", json_object_new_string(o->transport));
  if (o->lease_ms >= 0) json_object_object_add(doc, "lease_ms", json_object_new_int64(o->lease_ms));
  if (o->policy) json_object_object_add(doc, "load_failure_policy", json_object_new_string(o->policy));
  if (o->mode) json_object_object_add(doc, "mode", json_object_new_string(o->mode));
  for (uint32_t i = 0; i < o->nset; i++) {
    const char *eq = strchr(o->set[i], '=');
    char key[128];
    snprintf(key, sizeof(key), "%.*s", (int)(eq - o->set[i]), o->set[i]);
    json_object *val = json_tokener_parse(eq + 1);
    json_object_object_add(doc, key, val ? val : json_object_new_string(eq + 1));
  }
  json_object *v;
  *push = json_object_object_get_ex(doc, "mode", &v) && json_object_is_type(v, json_type_string) &&
          strcmp(json_object_get_string(v), "push") == 0;
  *lease_ms = json_object_object_get_ex(doc, "lease_ms", &v) ? json_object_get_int64(v) : 30000;
  char *text = strdup(json_object_to_json_string_ext(doc, JSON_C_TO_STRING_PLAIN));
  json_object_put(doc);
  return text;
}

/* ---- the router ---- */

/* pull: NEW -> PREFILL -> DECODE -> DONE; push: NEW -> ALLOC (decode allocates) -> PUSH
 * (prefill computes and writes into decode's blocks) -> DONE. */
enum { R_NEW, R_PREFILL, R_DECODE, R_ALLOC, R_PUSH, R_DONE };

struct rreq {
  uint64_t seed, prompt;
  uint8_t state, outcome;
  bool after_cut; /* link-cut: started once prefill had resumed; link-reset: ... once it had reset */
  uint64_t t_saved, t_held, bytes;
  char why[768];
  char prefill_why[384]; /* push: prefill gave up; decode still ends the request */
};

struct side {
  const char *name;
  pid_t pid;
  struct mh_conn conn;
  bool ready, dead, stats_in, exit_sent;
  bool reaped; /* its exit status is in wstatus already */
  int wstatus;
  struct mh_side s;
};

struct router {
  const struct opts *o;
  struct rreq *r;
  uint32_t next, inflight, ndone, nfail, nverified, nrecomputed, ncorrupt;
  struct side side[2]; /* 0 prefill, 1 decode */
  bool fatal, push;
  bool cut;    /* link-cut: prefill is stopped */
  bool healed; /* link-cut: ... and resumed since */
  uint32_t nafter_cut, nverified_after_cut;
  uint32_t nreset;     /* link-reset: TCP connections prefill shut down */
  uint32_t handed_off; /* kv_transfer_params forwarded so far */
  uint64_t t_start, t_end, bytes;
};

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void req_end(struct router *rt, uint32_t i, uint8_t outcome, uint64_t t_held, uint64_t bytes,
                    const char *why, size_t why_len) {
  struct rreq *r = &rt->r[i];
  if (r->state == R_DONE) return;
  if (r->state != R_NEW) rt->inflight--;
  r->state = R_DONE;
  r->outcome = outcome;
  r->t_held = t_held;
  r->bytes = bytes;
  if (r->prefill_why[0])
    snprintf(r->why, sizeof(r->why), "%s; then decode: %.*s", r->prefill_why, (int)why_len, why);
  else
    snprintf(r->why, sizeof(r->why), "%.*s", (int)why_len, why);
  rt->ndone++;
  rt->t_end = mh_now_ns();
  if (outcome == MH_VERIFIED) rt->nverified++, rt->bytes += bytes;
  if (outcome == MH_VERIFIED && r->after_cut) rt->nverified_after_cut++;
  if (outcome == MH_RECOMPUTED) rt->nrecomputed++;
  if (outcome == MH_FAILED) rt->nfail++;
  if (outcome == MH_CORRUPT) rt->ncorrupt++;
  if (rt->fatal && !rt->o->verbose) return; /* one line says why nothing was served */
  if (outcome != MH_VERIFIED && !rt->o->verbose && rt->nfail + rt->nrecomputed == 6)
    fprintf(stderr,
            "hixl-mock-host: (further failed or recomputed requests are not listed; --verbose lists them)\n");
  if (outcome != MH_VERIFIED && (rt->o->verbose || outcome == MH_CORRUPT || rt->nfail + rt->nrecomputed <= 5))
    fprintf(stderr, "%shixl-mock-host: req-%u (%" PRIu64 " tokens) %s: %s\n",
            rt->o->progress && isatty(2) ? "\r\033[K" : "", i, r->prompt,
            outcome == MH_RECOMPUTED ? "recomputed"
            : outcome == MH_CORRUPT  ? "CORRUPT"
                                     : "failed",
            r->why);
}

static void fail_where(struct router *rt, int state, const char *why) {
  for (uint32_t i = 0; i < rt->o->requests; i++)
    if (rt->r[i].state == state) req_end(rt, i, MH_FAILED, 0, 0, why, strlen(why));
}

static void side_gone(struct router *rt, int k) {
  struct side *s = &rt->side[k];
  if (s->dead) return;
  s->dead = true;
  close(s->conn.fd);
  if (!s->reaped && waitpid(s->pid, &s->wstatus, 0) != s->pid) s->wstatus = 0;
  s->reaped = true;
  if (s->stats_in) return; /* it reported and exited, as asked */
  char why[256];
  if (WIFSIGNALED(s->wstatus))
    snprintf(why, sizeof(why), "the %s instance (pid %d) died: killed by signal %d (%s)", s->name,
             (int)s->pid, WTERMSIG(s->wstatus), strsignal(WTERMSIG(s->wstatus)));
  else
    snprintf(why, sizeof(why), "the %s instance (pid %d) exited with status %d", s->name, (int)s->pid,
             WIFEXITED(s->wstatus) ? WEXITSTATUS(s->wstatus) : -1);
  fprintf(stderr, "%shixl-mock-host: %s\n", rt->o->progress && isatty(2) ? "\r\033[K" : "", why);
  char msg[512];
  snprintf(msg, sizeof(msg), "%s before it %s this request", why,
           k == 0 ? "finished prefilling" : "finished loading");
  fail_where(rt, k == 0 ? R_PREFILL : R_DECODE, msg);
  /* Push: decode reports what prefill left unwritten (its lease); if decode died, no one will. */
  if (k == 1) fail_where(rt, R_ALLOC, msg), fail_where(rt, R_PUSH, msg);
  snprintf(msg, sizeof(msg), "not served: %s", why);
  fail_where(rt, R_NEW, msg);
}

/* link-cut: at the Nth hand-off prefill stops answering (SIGSTOP: no FIN, no RST, as a
 * partition looks to its peer) until every transfer in flight has ended. In pull mode it
 * is stopped before decode is told to load (a stop sent after could land only once decode
 * had pinned and read: the router may be preempted between the two); in push mode after
 * prefill is told to push. The router waits until the stop has taken effect. */
static void cut_maybe(struct router *rt) {
  struct side *s = &rt->side[0];
  if (rt->o->fault != MH_FAULT_LINK_CUT || ++rt->handed_off != rt->o->fault_at || s->dead) return;
  fprintf(stderr,
          "%shixl-mock-host: fault link-cut: prefill (pid %d) stopped at hand-off %u; resumed when every "
          "transfer in flight has ended\n",
          rt->o->progress && isatty(2) ? "\r\033[K" : "", (int)s->pid, rt->handed_off);
  kill(s->pid, SIGSTOP);
  int st;
  pid_t got;
  while ((got = waitpid(s->pid, &st, WUNTRACED)) < 0 && errno == EINTR) {
  }
  if (got == s->pid && !WIFSTOPPED(st)) { /* it died meanwhile: its socket's end says so */
    s->wstatus = st;
    s->reaped = true;
  }
  rt->cut = true;
}

/* link-reset: shut down every TCP connection process pid has (listeners excepted), as
 * a reset of the network between the instances does: each peer reads the end of its
 * stream, and pid's engine finds its own sockets ended. From outside the process, on
 * its own sockets (pidfd_getfd shares them), while its threads go on; shutdown, not
 * close, so the descriptors stay the engine's until it closes them. Returns how many. */
static unsigned shut_tcp_connections(pid_t pid) {
  char path[64];
  unsigned n = 0;
  int pfd = pidfd_open(pid, 0);
  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  DIR *d = pfd >= 0 ? opendir(path) : NULL;
  if (!d) {
    fprintf(stderr, "hixl-mock-host: fault link-reset: cannot reach the sockets of pid %d: %m\n", (int)pid);
    if (pfd >= 0) close(pfd);
    return 0;
  }
  int refused = 0; /* why pidfd_getfd failed, other than a descriptor closed meanwhile */
  for (struct dirent *de; (de = readdir(d));) {
    char *end;
    long target = strtol(de->d_name, &end, 10);
    if (*end || end == de->d_name) continue;
    int fd = pidfd_getfd(pfd, (int)target, 0);
    if (fd < 0 && errno != EBADF) refused = errno;
    if (fd < 0) continue;
    struct stat st;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss), il = sizeof(int), ll = sizeof(int);
    int type = 0, listening = 1;
    if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &il) == 0 &&
        type == SOCK_STREAM && getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ll) == 0 &&
        !listening && getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
        (ss.ss_family == AF_INET || ss.ss_family == AF_INET6) && shutdown(fd, SHUT_RDWR) == 0)
      n++;
    close(fd);
  }
  closedir(d);
  close(pfd);
  if (n == 0 && refused)
    fprintf(stderr, "hixl-mock-host: fault link-reset: pidfd_getfd on pid %d: %s\n", (int)pid,
            strerror(refused));
  return n;
}

/* link-reset: at the Nth hand-off (before decode is told to load, or prefill to push)
 * the router shuts down prefill's TCP connections; requests started after that count
 * as after the fault. */
static void reset_maybe(struct router *rt) {
  struct side *s = &rt->side[0];
  if (rt->o->fault != MH_FAULT_LINK_RESET || ++rt->handed_off != rt->o->fault_at || s->dead) return;
  rt->nreset = shut_tcp_connections(s->pid);
  fprintf(stderr,
          "%shixl-mock-host: fault link-reset: shut down %u TCP connection(s) of prefill (pid %d) at "
          "hand-off %u\n",
          rt->o->progress && isatty(2) ? "\r\033[K" : "", rt->nreset, (int)s->pid, rt->handed_off);
  rt->healed = true;
}

static void cut_heal(struct router *rt) {
  for (uint32_t i = 0; i < rt->o->requests; i++)
    if (rt->r[i].state == R_DECODE || rt->r[i].state == R_ALLOC || rt->r[i].state == R_PUSH) return;
  fprintf(stderr, "%shixl-mock-host: fault link-cut: every transfer in flight has ended; prefill resumed\n",
          rt->o->progress && isatty(2) ? "\r\033[K" : "");
  kill(rt->side[0].pid, SIGCONT);
  rt->cut = false;
  rt->healed = true;
}

static void handle(struct router *rt, int k, uint8_t type, struct mh_in *in) {
  struct side *s = &rt->side[k];
  uint32_t idx = 0;
  size_t n = 0;
  const char *str;
  if (type == MH_READY) {
    mh_get_u32(in);
    if (mh_in_done(in)) s->ready = true;
    return;
  }
  if (type == MH_STATS) {
    mh_get_side(in, &s->s);
    s->stats_in = mh_in_done(in);
    return;
  }
  if (type == MH_FAIL) {
    idx = mh_get_u32(in);
    str = mh_get_str(in, &n);
    if (!mh_in_done(in)) goto bad;
    if (idx == MH_NO_REQUEST) {
      fprintf(stderr, "hixl-mock-host: %.*s\n", (int)n, str);
      if (!rt->fatal) fprintf(stderr, "hixl-mock-host: no request is served: an instance did not start\n");
      rt->fatal = true;
      fail_where(rt, R_NEW, "not served: an instance did not start");
      return;
    }
    if (idx >= rt->o->requests) return;
    /* Push: decode holds blocks for it and ends it (failed or recomputed) when nothing comes. */
    if (rt->r[idx].state == R_PUSH && !rt->side[1].dead)
      snprintf(rt->r[idx].prefill_why, sizeof(rt->r[idx].prefill_why), "%.*s", (int)n, str);
    else
      req_end(rt, idx, MH_FAILED, 0, 0, str, n);
    return;
  }
  if (type == MH_PARAMS && k == 0) {
    idx = mh_get_u32(in);
    uint64_t t_saved = mh_get_u64(in);
    str = mh_get_str(in, &n);
    if (!mh_in_done(in) || idx >= rt->o->requests) goto bad;
    struct rreq *r = &rt->r[idx];
    if (rt->push) { /* computed and on its way (or landed already): decode reports it */
      r->t_saved = t_saved;
      return;
    }
    if (r->state != R_PREFILL) return;
    r->t_saved = t_saved;
    if (rt->side[1].dead) {
      const char *why = "decode instance is gone: the KV prefill holds is left to its lease";
      req_end(rt, idx, MH_FAILED, 0, 0, why, strlen(why));
      return;
    }
    struct mh_out o = {0};
    mh_put_u32(&o, idx);
    mh_put_u64(&o, r->seed);
    mh_put_u64(&o, r->prompt);
    mh_put_str(&o, str, n); /* the kv_transfer_params, as the proxy forwards them */
    r->state = R_DECODE;
    cut_maybe(rt);
    reset_maybe(rt);
    mh_send(rt->side[1].conn.fd, MH_LOAD, &o);
    return;
  }
  if (type == MH_PUSHPARAMS && k == 1) {
    idx = mh_get_u32(in);
    str = mh_get_str(in, &n);
    if (!mh_in_done(in) || idx >= rt->o->requests) goto bad;
    struct rreq *r = &rt->r[idx];
    if (r->state != R_ALLOC) return;
    if (rt->side[0].dead) return; /* decode fails it when its lease ends */
    struct mh_out o = {0};
    mh_put_u32(&o, idx);
    mh_put_u64(&o, r->seed);
    mh_put_u64(&o, r->prompt);
    mh_put_str(&o, str, n); /* where to write: decode's blocks */
    r->state = R_PUSH;
    reset_maybe(rt);
    mh_send(rt->side[0].conn.fd, MH_REQ, &o);
    cut_maybe(rt);
    return;
  }
  if (type == MH_DONE && k == 1) {
    idx = mh_get_u32(in);
    uint8_t outcome = mh_get_u8(in);
    uint64_t t_held = mh_get_u64(in), bytes = mh_get_u64(in);
    str = mh_get_str(in, &n);
    if (!mh_in_done(in) || idx >= rt->o->requests || outcome < MH_VERIFIED || outcome > MH_CORRUPT) goto bad;
    req_end(rt, idx, outcome, t_held, bytes, str, n);
    return;
  }
bad:
  fprintf(stderr, "hixl-mock-host: malformed frame type %u from %s; stopping it\n", type, s->name);
  kill(s->pid, SIGKILL);
}

static const char *human_bytes(uint64_t b, char *buf, size_t cap) {
  if (b >= (1ull << 30))
    snprintf(buf, cap, "%.3f GiB", (double)b / (1ull << 30));
  else if (b >= (1ull << 20))
    snprintf(buf, cap, "%.3f MiB", (double)b / (1ull << 20));
  else
    snprintf(buf, cap, "%.3f KiB", (double)b / 1024);
  return buf;
}

static void progress(const struct router *rt, bool last) {
  if (!rt->o->progress || !isatty(2)) return;
  const int w = 30;
  uint32_t n = rt->o->requests;
  int fill = (int)((uint64_t)rt->ndone * w / (n ? n : 1));
  char hb[32];
  fprintf(stderr, "\r\033[K[%.*s%*s] %u/%u  verified %u  failed %u  %s  %.1f s", fill,
          "##############################", w - fill, "", rt->ndone, n, rt->nverified,
          rt->nfail + rt->ncorrupt, human_bytes(rt->bytes, hb, sizeof(hb)),
          (double)(mh_now_ns() - rt->t_start) / 1e9);
  if (last) fprintf(stderr, "\r\033[K");
}

static int start_instance(struct router *rt, int k, const hixl_kv_ops *ops, const char *config,
                          const struct mh_model *m, uint32_t drain_ms) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    fprintf(stderr, "hixl-mock-host: socketpair: %m\n");
    return -1;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "hixl-mock-host: fork: %m\n");
    close(sv[0]);
    close(sv[1]);
    return -1;
  }
  if (pid == 0) {
    close(sv[0]);
    for (int j = 0; j < k; j++) close(rt->side[j].conn.fd);
    const struct opts *o = rt->o;
    struct mh_inst_args a = {.ops = ops,
                             .fd = sv[1],
                             .prefill = k == 0,
                             .push = rt->push,
                             .config = config,
                             .model = *m,
                             .compute_us_per_token = o->compute_us,
                             .fault = o->fault,
                             .fault_at = o->fault_at,
                             .drain_ms = drain_ms,
                             .host_memory = strcmp(o->kv_memory, "host") == 0,
                             .verbose = o->verbose};
    exit(mh_instance_main(&a)); /* exit, not _exit: a sanitizer build checks the instance for leaks */
  }
  close(sv[1]);
  fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
  rt->side[k].pid = pid;
  mh_conn_init(&rt->side[k].conn, sv[0]);
  return 0;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  struct opts o;
  int rc = parse_opts(argc, argv, &o);
  if (rc) return rc;
  signal(SIGPIPE, SIG_IGN);
  char pbuf[PATH_MAX];
  const char *plugin = plugin_path(o.plugin, pbuf, sizeof(pbuf));
  const hixl_kv_ops *ops;
  if (plugin_load(plugin, &ops) < 0) return 1;
  const char *cfg_path = o.config ? o.config : file_exists(MH_CONFIG_MAIN) ? MH_CONFIG_MAIN : MH_CONFIG_MOCK;
  int64_t lease_p = 0, lease_d = 0;
  bool push = false;
  char *cfg_p = instance_config(&o, cfg_path, true, &lease_p, &push);
  char *cfg_d = cfg_p ? instance_config(&o, cfg_path, false, &lease_d, &push) : NULL;
  if (!cfg_d) {
    free(cfg_p);
    return 2;
  }
  if (push && !HIXL_KV_HAS_OP(ops, get_push_params)) {
    fprintf(stderr, "hixl-mock-host: mode push needs get_push_params, which this plugin's ops table lacks\n");
    free(cfg_p);
    free(cfg_d);
    return 1;
  }
  /* A decode whose cache differs from prefill's (the mismatch faults). */
  struct mh_model md = o.model;
  if (o.fault == MH_FAULT_MISMATCH_BLOCK) {
    md.block_tokens *= 2;
    md.num_blocks = (md.num_blocks + 1) / 2;
  } else if (o.fault == MH_FAULT_MISMATCH_DTYPE) {
    md.elem_size *= 2;
  }
  if (o.verbose)
    fprintf(stderr, "hixl-mock-host: plugin %s\n  prefill config %s\n  decode config %s\n", plugin, cfg_p,
            cfg_d);

  struct router rt = {.o = &o, .push = push};
  rt.r = calloc(o.requests, sizeof(*rt.r));
  if (!rt.r) return 1;
  uint64_t rng = o.seed;
  for (uint32_t i = 0; i < o.requests; i++) {
    rt.r[i].seed = splitmix(&rng);
    rt.r[i].prompt = o.min_prompt + splitmix(&rng) % (o.max_prompt - o.min_prompt + 1);
  }
  rt.side[0].name = "prefill";
  rt.side[1].name = "decode";
  uint32_t drain_ms = (uint32_t)(lease_p + 3000);
  rt.t_start = mh_now_ns();
  if (start_instance(&rt, 0, ops, cfg_p, &o.model, drain_ms) < 0) return 1;
  if (start_instance(&rt, 1, ops, cfg_d, &md, drain_ms) < 0) {
    kill(rt.side[0].pid, SIGKILL);
    waitpid(rt.side[0].pid, NULL, 0);
    return 1;
  }
  uint64_t deadline = rt.t_start + (uint64_t)o.timeout_s * 1000000000ull, last_bar = 0;
  bool timed_out = false, started = false;
  for (;;) {
    if (rt.cut) cut_heal(&rt);
    bool up =
        rt.side[0].ready && rt.side[1].ready && !rt.side[0].dead && !rt.side[1].dead && !rt.fatal && !rt.cut;
    if (up && !started) {
      started = true;
      rt.t_start = mh_now_ns(); /* the figures count from the first request */
    }
    while (up && rt.inflight < o.concurrency && rt.next < o.requests) {
      struct rreq *r = &rt.r[rt.next];
      struct mh_out f = {0};
      mh_put_u32(&f, rt.next);
      mh_put_u64(&f, r->seed);
      mh_put_u64(&f, r->prompt);
      rt.inflight++;
      rt.next++;
      r->after_cut = rt.healed;
      rt.nafter_cut += rt.healed;
      if (push) { /* decode allocates first; the mark says its KV comes from a prefill */
        static const char mark[] = "{\"do_remote_prefill\": true}";
        mh_put_str(&f, mark, sizeof(mark) - 1);
        r->state = R_ALLOC;
        mh_send(rt.side[1].conn.fd, MH_LOAD, &f);
      } else {
        mh_put_str(&f, "", 0);
        r->state = R_PREFILL;
        mh_send(rt.side[0].conn.fd, MH_REQ, &f);
      }
    }
    if (rt.ndone == o.requests || rt.fatal)
      for (int k = 0; k < 2; k++)
        if (!rt.side[k].dead && !rt.side[k].exit_sent) {
          struct mh_out f = {0};
          mh_send(rt.side[k].conn.fd, MH_EXIT, &f);
          rt.side[k].exit_sent = true;
        }
    if ((rt.side[0].dead || rt.side[0].stats_in) && (rt.side[1].dead || rt.side[1].stats_in)) break;
    if (mh_now_ns() >= deadline) {
      timed_out = true;
      if (rt.cut) kill(rt.side[0].pid, SIGCONT);
      break;
    }
    struct pollfd pfd[2];
    for (int k = 0; k < 2; k++)
      pfd[k] = (struct pollfd){rt.side[k].dead ? -1 : rt.side[k].conn.fd, POLLIN, 0};
    poll(pfd, 2, 50);
    for (int k = 0; k < 2; k++) {
      struct side *s = &rt.side[k];
      if (s->dead || !(pfd[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      mh_conn_fill(&s->conn);
      uint8_t type;
      struct mh_in in;
      int got;
      while ((got = mh_conn_next(&s->conn, &type, &in)) > 0) handle(&rt, k, type, &in);
      if (got < 0) kill(s->pid, SIGKILL);
      if (s->conn.eof || got < 0) side_gone(&rt, k);
    }
    if (mh_now_ns() - last_bar > 100000000ull) {
      progress(&rt, false);
      last_bar = mh_now_ns();
    }
  }
  progress(&rt, true);
  if (timed_out) {
    fprintf(
        stderr,
        "hixl-mock-host: timed out after %u s with %u of %u requests unfinished; stopping the instances\n",
        o.timeout_s, o.requests - rt.ndone, o.requests);
  }
  for (int k = 0; k < 2; k++) {
    struct side *s = &rt.side[k];
    if (s->dead) continue;
    /* It reported: give it 5 s to destroy its connectors, then make sure. */
    bool reaped = s->reaped;
    for (int t = 0; t < 100 && !reaped && !(reaped = waitpid(s->pid, &s->wstatus, WNOHANG) == s->pid); t++)
      usleep(50000);
    if (!reaped) {
      if (s->stats_in)
        fprintf(stderr, "hixl-mock-host: the %s instance did not exit within 5 s of its report; killing it\n",
                s->name);
      kill(s->pid, SIGKILL);
      waitpid(s->pid, &s->wstatus, 0);
    }
    close(s->conn.fd);
  }
  if (!rt.t_end) rt.t_end = mh_now_ns();
  /* An instance that reported must also exit cleanly (a sanitizer's finding shows here). */
  bool exits_clean = true;
  for (int k = 0; k < 2; k++) {
    const struct side *s = &rt.side[k];
    if (s->stats_in && !(WIFEXITED(s->wstatus) && WEXITSTATUS(s->wstatus) == 0)) {
      fprintf(stderr, "hixl-mock-host: the %s instance (pid %d) reported, then %s %d\n", s->name, (int)s->pid,
              WIFSIGNALED(s->wstatus) ? "was killed by signal" : "exited with status",
              WIFSIGNALED(s->wstatus) ? WTERMSIG(s->wstatus) : WEXITSTATUS(s->wstatus));
      exits_clean = false;
    }
  }

  /* ---- the figures ---- */
  uint64_t tokens = 0, *lat = calloc(o.requests ? o.requests : 1, sizeof(*lat));
  size_t nlat = 0;
  for (uint32_t i = 0; i < o.requests; i++) {
    if (rt.r[i].state == R_DONE) tokens += rt.r[i].prompt;
    if (lat && rt.r[i].outcome == MH_VERIFIED && rt.r[i].t_saved && rt.r[i].t_held > rt.r[i].t_saved)
      lat[nlat++] = rt.r[i].t_held - rt.r[i].t_saved;
  }
  if (lat) qsort(lat, nlat, sizeof(*lat), cmp_u64);
  double p50 = nlat ? (double)lat[(nlat - 1) / 2] / 1e6 : 0,
         p99 = nlat ? (double)lat[(nlat * 99 + 99) / 100 - 1] / 1e6 : 0;
  free(lat);
  double secs = (double)(rt.t_end - rt.t_start) / 1e9;
  double gbps = secs > 0 ? (double)rt.bytes / secs / 1e9 : 0;
  const struct side *P = &rt.side[0], *D = &rt.side[1];
  /* Engine ops are issued by whoever moves the data: decode's loader (pull) or prefill's pusher. */
  double ops_per_req = 0;
  if (!push && D->stats_in && D->s.stats_ok && D->s.ks.loads_done)
    ops_per_req = (double)D->s.ks.engine_ops / (double)D->s.ks.loads_done;
  if (push && P->stats_in && P->s.stats_ok && P->s.ks.pushes_done)
    ops_per_req = (double)P->s.ks.engine_ops / (double)P->s.ks.pushes_done;
  bool p_clean = P->stats_in && P->s.blocks_free == P->s.blocks_total && P->s.requests_left == 0 &&
                 (!P->s.stats_ok || P->s.ks.blocks_held == 0);
  bool d_clean = D->stats_in && D->s.blocks_free == D->s.blocks_total && D->s.requests_left == 0;
  bool pass;
  const char *fault = fault_names[o.fault];
  bool base = !timed_out && !rt.fatal && exits_clean;
  if (o.fault == MH_FAULT_NONE)
    pass = base && rt.nverified == o.requests && p_clean && d_clean;
  else if (o.fault == MH_FAULT_DECODE_DIES)
    pass =
        base && D->dead && !D->stats_in && rt.nfail > 0 && !rt.ncorrupt && p_clean && rt.ndone == o.requests;
  else if (o.fault == MH_FAULT_PREFILL_DIES)
    pass = base && P->dead && !P->stats_in && rt.nfail + rt.nrecomputed > 0 && !rt.ncorrupt && d_clean &&
           rt.ndone == o.requests;
  else if (o.fault == MH_FAULT_DECODE_ABORTS) /* that one request, and only it */
    pass = base && rt.nfail == 1 && !rt.nrecomputed && !rt.ncorrupt && p_clean && d_clean &&
           rt.nverified == o.requests - 1;
  else if (o.fault == MH_FAULT_LINK_CUT)
    pass = base && rt.nfail + rt.nrecomputed > 0 && !rt.ncorrupt && p_clean && d_clean &&
           rt.ndone == o.requests && rt.nverified_after_cut > 0; /* the link comes back */
  else if (o.fault == MH_FAULT_LINK_RESET) /* the link comes back; in pull mode, every failed load */
    pass = base && rt.nreset > 0 && !rt.ncorrupt && p_clean && d_clean && rt.ndone == o.requests &&
           rt.nverified_after_cut > 0 && (push || (P->s.stats_ok && P->s.ks.lease_expired == 0)); /* freed */
  else
    pass = base && rt.nfail + rt.nrecomputed == o.requests && !rt.ncorrupt && p_clean && d_clean;

  const struct mh_model *m = &o.model;
  printf("hixl-mock-host: %s model (%u layers, %s, %u KV heads x %u x %u B, %u-token blocks), %s layout, %s "
         "mode, KV in %s memory\n",
         m->name, m->layers, mh_kv_parts(m) == 1 ? "a latent" : "K and V", m->kv_heads, m->head_dim,
         m->elem_size, m->block_tokens, mh_layout_name(m->layout), push ? "push" : "pull",
         strcmp(o.kv_memory, "host") == 0 ? "the host's" : "hixl's");
  printf("  prefill %" PRIu64 " blocks, decode %" PRIu64 " blocks%s%s, %u requests of %" PRIu64 "..%" PRIu64
         " tokens, concurrency %u\n",
         m->num_blocks, md.num_blocks, o.fault ? ", fault " : "", o.fault ? fault : "", o.requests,
         o.min_prompt, o.max_prompt, o.concurrency);
  printf("  %-28s %u\n", "requests", o.requests);
  printf("  %-28s %" PRIu64 "\n", "prompt tokens", tokens);
  char hb[32];
  printf("  %-28s %s\n", "KV bytes verified", human_bytes(rt.bytes, hb, sizeof(hb)));
  printf("  %-28s %.2f GB/s (%.2f s)\n", "GB/s (verified KV / wall)", gbps, secs);
  if (nlat)
    printf("  %-28s %.2f ms / %.2f ms (%zu requests)\n", "hand-off p50 / p99", p50, p99, nlat);
  else
    printf("  %-28s n/a (no request loaded)\n", "hand-off p50 / p99");
  if (ops_per_req > 0)
    printf("  %-28s %.1f (%s)\n", "engine ops per request", ops_per_req,
           push ? "prefill engine_ops / pushes_done" : "decode engine_ops / loads_done");
  else
    printf("  %-28s n/a\n", "engine ops per request");
  for (int k = 0; k < 2; k++) {
    const struct side *s = &rt.side[k];
    char line[160];
    if (s->stats_in)
      snprintf(line, sizeof(line), "%" PRIu64 " of %" PRIu64 " held, plugin blocks_held %" PRIu64 "%s",
               s->s.blocks_total - s->s.blocks_free, s->s.blocks_total, s->s.ks.blocks_held,
               k == 0 && s->s.ks.lease_expired ? " (some freed by lease expiry)" : "");
    else
      snprintf(line, sizeof(line), "%s", s->dead ? "died (no report)" : "no report");
    printf("  %-28s %s\n", k == 0 ? "prefill blocks at exit" : "decode blocks at exit", line);
  }
  if (rt.nfail || rt.nrecomputed || rt.ncorrupt)
    printf("  %-28s failed %u, recomputed %u, corrupt %u\n", "not verified", rt.nfail, rt.nrecomputed,
           rt.ncorrupt);
  if (o.fault == MH_FAULT_LINK_CUT)
    printf("  %-28s %u of %u verified\n", "started once prefill resumed", rt.nverified_after_cut,
           rt.nafter_cut);
  if (o.fault == MH_FAULT_LINK_RESET) {
    printf("  %-28s %u TCP connection(s) of prefill\n", "shut down", rt.nreset);
    printf("  %-28s %u of %u verified\n", "started after the reset", rt.nverified_after_cut, rt.nafter_cut);
    if (!push)
      printf("  %-28s %" PRIu64 " (0: every failed load freed its request over a new link)\n",
             "prefill leases expired", P->s.ks.lease_expired);
  }
  if (o.fault)
    printf("  fault %s: %s\n", fault,
           pass ? "reported, no byte wrong, the surviving side holds zero blocks"
                : "NOT handled as expected");
  printf("  %-28s %u/%u requests, every byte checked%s\n", "verified", rt.nverified, o.requests,
         pass ? "" : "  FAIL");

  if (o.json) {
    FILE *f = fopen(o.json, "w");
    if (!f) {
      fprintf(stderr, "hixl-mock-host: --json %s: %m\n", o.json);
      pass = false;
    } else {
      fprintf(f,
              "{\"model\": \"%s\", \"layout\": \"%s\", \"mode\": \"%s\", \"layers\": %u, \"kv_heads\": %u, "
              "\"head_dim\": %u, "
              "\"elem_size\": %u, "
              "\"block_tokens\": %u,\n \"fault\": \"%s\", \"requests\": %u, \"concurrency\": %u, "
              "\"prompt_tokens\": %" PRIu64 ",\n"
              " \"verified\": %u, \"recomputed\": %u, \"failed\": %u, \"corrupt\": %u, "
              "\"kv_bytes_verified\": %" PRIu64 ",\n"
              " \"seconds\": %.6f, \"gb_per_s\": %.4f, \"handoff_ms_p50\": %.4f, \"handoff_ms_p99\": %.4f, "
              "\"engine_ops_per_request\": %.2f,\n",
              m->name, mh_layout_name(m->layout), push ? "push" : "pull", m->layers, m->kv_heads, m->head_dim,
              m->elem_size, m->block_tokens, fault, o.requests, o.concurrency, tokens, rt.nverified,
              rt.nrecomputed, rt.nfail, rt.ncorrupt, rt.bytes, secs, gbps, p50, p99, ops_per_req);
      for (int k = 0; k < 2; k++) {
        const struct side *s = &rt.side[k];
        fprintf(f,
                " \"%s\": {\"reported\": %s, \"blocks_total\": %" PRIu64 ", \"blocks_free\": %" PRIu64
                ", \"blocks_held\": %" PRIu64 ", \"loads_done\": %" PRIu64 ", \"loads_failed\": %" PRIu64
                ", \"lease_expired\": %" PRIu64 ", \"bytes_loaded\": %" PRIu64 ", \"engine_ops\": %" PRIu64
                "},\n",
                s->name, s->stats_in ? "true" : "false", s->s.blocks_total, s->s.blocks_free,
                s->s.ks.blocks_held, s->s.ks.loads_done, s->s.ks.loads_failed, s->s.ks.lease_expired,
                s->s.ks.bytes_loaded, s->s.ks.engine_ops);
      }
      fprintf(f, " \"pass\": %s}\n", pass ? "true" : "false");
      fclose(f);
    }
  }
  free(rt.r);
  free(cfg_p);
  free(cfg_d);
  mh_conn_fini(&rt.side[0].conn);
  mh_conn_fini(&rt.side[1].conn);
  return pass ? 0 : 1;
}
