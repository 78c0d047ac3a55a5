/* hixl-mock-host: main. It loads the KV-connector plugin, makes each instance's
 * config, runs the router (mh_router.c) and prints what moved, how fast, and whether
 * every byte arrived (mh_report.c); the options are mh_args.c's. See
 * integration/mock-host/README.md. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
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

/* The instances' address (--ip): where free ports are found and held. */
static const char *inst_ip = "127.0.0.1";

/* A socket bound to inst_ip:port (0: one the kernel picks), and the port; -1 when it is
 * taken. */
static int bind_port(uint16_t port, uint16_t *got) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  socklen_t sl = sizeof(sa);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  inet_pton(AF_INET, inst_ip, &sa.sin_addr);
  if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
      getsockname(fd, (struct sockaddr *)&sa, &sl) == 0) {
    *got = ntohs(sa.sin_port);
    return fd;
  }
  if (fd >= 0) close(fd);
  return -1;
}

/* Holds inst_ip:port for the rest of this process: a socket bound there with
 * SO_REUSEADDR that never listens and is never closed, so no other bind(:0) or connect()
 * on the machine takes the port before the instance's engine (SO_REUSEADDR too)
 * listens there; a port found free and closed could go to a parallel job first. */
static void hold_port(uint16_t port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  int one = 1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  inet_pton(AF_INET, inst_ip, &sa.sin_addr);
  if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
      bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
    return; /* kept open: the hold */
  if (fd >= 0) close(fd);
}

/* A port to start a run of n at: at random below the kernel's ephemeral range, where no
 * port-0 bind or outgoing connection takes one and no closed connection of theirs
 * lingers in TIME_WAIT (a bind without SO_REUSEADDR refuses such a port: after a few
 * thousand runs on one machine most runs of 4 ephemeral ports held one, and TP runs
 * found none); 0 (the kernel's pick) where that range is too small. */
static uint16_t below_ephemeral(uint32_t n) {
  unsigned low = 32768, r = 0;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%u", &low) != 1) low = 32768;
    fclose(f);
  }
  if (low > 65536 || low < 10000 + n + 64 || getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r)) return 0;
  return (uint16_t)(10000 + r % (low - n - 10000));
}

/* For each instance a run of n[k] free ports from base[k] (rank r's engine listens on
 * base + r), the two runs apart: the sockets that found them stay bound until both are
 * found, and each is then held for good (hold_port). Tried below the ephemeral range
 * first, then where the kernel picks; 0 when no run was found (the kernel's pick then,
 * as before). */
static void free_ports(const uint32_t n[2], uint16_t base[2]) {
  int held[2 * MH_MAX_TP];
  uint32_t nh = 0;
  for (int k = 0; k < 2; k++) {
    base[k] = 0;
    for (int attempt = 0; attempt < 64 && !base[k]; attempt++) {
      uint32_t first = nh, i = 1;
      uint16_t p = 0, q = 0;
      int fd = bind_port(attempt < 48 ? below_ephemeral(n[k]) : 0, &p);
      if (fd < 0 && attempt < 48) continue; /* taken: another */
      if (fd < 0) break;
      held[nh++] = fd;
      for (; i < n[k] && p + i <= 65535 && (fd = bind_port((uint16_t)(p + i), &q)) >= 0; i++) held[nh++] = fd;
      if (i == n[k]) {
        base[k] = p;
        break;
      }
      while (nh > first) close(held[--nh]); /* a port of the run is taken: another run */
    }
  }
  while (nh) close(held[--nh]);
  for (int k = 0; k < 2; k++)
    for (uint32_t i = 0; base[k] && i < n[k]; i++) hold_port((uint16_t)(base[k] + i));
}

/* The base document with this instance's address and role (and the flags' overrides). */
static char *instance_config(const struct mh_opts *o, const char *path, const char *key_file, bool prefill,
                             uint16_t port, int64_t *lease_ms, bool *push) {
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
    snprintf(addr, sizeof(addr), "%s:%u", inst_ip, (unsigned)port);
  json_object_object_add(doc, "address", json_object_new_string(addr));
  json_object_object_add(doc, "role", json_object_new_string(prefill ? "producer" : "consumer"));
  if (o->transport) json_object_object_add(doc, "Transport", json_object_new_string(o->transport));
  if (o->lease_ms >= 0) json_object_object_add(doc, "lease_ms", json_object_new_int64(o->lease_ms));
  if (o->policy) json_object_object_add(doc, "load_failure_policy", json_object_new_string(o->policy));
  if (o->mode) json_object_object_add(doc, "mode", json_object_new_string(o->mode));
  if (key_file) json_object_object_add(doc, "AuthKeyFile", json_object_new_string(key_file));
  for (uint32_t i = 0; i < o->nset; i++) {
    if (o->set_who[i] != 0 && o->set_who[i] != (prefill ? 1 : 2)) continue; /* the other instance's */
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

/* The key both instances prove to each other: --auth-key FILE as given; none, no key;
 * by default a fresh 32-byte key in a directory only this user can enter (mode 0700,
 * the file 0600), removed when the run ends. */
static const char *key_setup(const struct mh_opts *o, char dir[64], char path[96]) {
  if (o->auth_key) return strcmp(o->auth_key, "none") == 0 ? NULL : o->auth_key;
  uint8_t key[32];
  char hex[2 * sizeof(key) + 2];
  snprintf(dir, 64, "/tmp/hixl-mock-host-XXXXXX");
  if (!mkdtemp(dir) || getrandom(key, sizeof(key), 0) != (ssize_t)sizeof(key)) {
    fprintf(stderr, "hixl-mock-host: cannot make a key for the run: %m\n");
    dir[0] = '\0';
    return "";
  }
  for (size_t i = 0; i < sizeof(key); i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
  hex[2 * sizeof(key)] = '\n';
  hex[2 * sizeof(key) + 1] = '\0';
  snprintf(path, 96, "%s/auth.key", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  bool ok = fd >= 0 && write(fd, hex, strlen(hex)) == (ssize_t)strlen(hex);
  if (fd >= 0) close(fd);
  explicit_bzero(key, sizeof(key));
  explicit_bzero(hex, sizeof(hex));
  if (!ok) {
    fprintf(stderr, "hixl-mock-host: cannot write %s: %m\n", path);
    return "";
  }
  return path;
}

static void key_remove(const char *dir, const char *path) {
  if (!dir[0]) return;
  unlink(path);
  rmdir(dir);
}

/* The "address" of an instance's config text (json-c), into out. */
static const char *config_address(const char *text, char *out, size_t cap) {
  json_object *doc = json_tokener_parse(text), *v;
  out[0] = '\0';
  if (doc && json_object_object_get_ex(doc, "address", &v))
    snprintf(out, cap, "%s", json_object_get_string(v));
  json_object_put(doc);
  return out;
}

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Each request's seed and prompt length, from --seed. */
static struct mh_rreq *requests_new(const struct mh_opts *o) {
  struct mh_rreq *r = calloc(o->requests, sizeof(*r));
  uint64_t rng = o->seed;
  for (uint32_t i = 0; r && i < o->requests; i++) {
    r[i].seed = splitmix(&rng);
    r[i].prompt = o->min_prompt + splitmix(&rng) % (o->max_prompt - o->min_prompt + 1);
  }
  return r;
}

/* Decode's model: prefill's, or one whose cache differs from it (the mismatch faults). */
static struct mh_model decode_model(const struct mh_opts *o) {
  struct mh_model md = o->model;
  if (o->fault == MH_FAULT_MISMATCH_BLOCK) {
    md.block_tokens *= 2;
    md.num_blocks = (md.num_blocks + 1) / 2;
  } else if (o->fault == MH_FAULT_MISMATCH_DTYPE) {
    md.elem_size *= 2;
  }
  return md;
}

int main(int argc, char **argv) {
  struct mh_opts o;
  int rc = mh_parse_opts(argc, argv, &o);
  if (rc) return rc;
  signal(SIGPIPE, SIG_IGN);
  char dev_why[256] = "";
  if (mh_dev_probe(mh_opts_dev(&o), dev_why, sizeof(dev_why)) < 0) {
    fprintf(stderr, "hixl-mock-host: --kv-memory %s: %s: skipped\n", o.kv_memory, dev_why);
    return 77; /* CTest's skip */
  }
  char pbuf[PATH_MAX];
  const char *plugin = plugin_path(o.plugin, pbuf, sizeof(pbuf));
  /* Each instance's plugin: --prefill-plugin / --decode-plugin, else the one above (loaded
   * once when both are the same path). */
  const char *side_plugin[2];
  const hixl_kv_ops *ops[2];
  for (int k = 0; k < 2; k++) {
    side_plugin[k] = o.side_plugin[k] ? o.side_plugin[k] : plugin;
    if (k == 1 && strcmp(side_plugin[1], side_plugin[0]) == 0)
      ops[1] = ops[0];
    else if (plugin_load(side_plugin[k], &ops[k]) < 0)
      return 1;
  }
  const char *cfg_path = o.config ? o.config : file_exists(MH_CONFIG_MAIN) ? MH_CONFIG_MAIN : MH_CONFIG_MOCK;
  int64_t lease_p = 0, lease_d = 0;
  bool push = false;
  struct mh_model md = decode_model(&o);
  struct mh_router rt = {.o = &o};
  char key_dir[64] = "", key_path[96] = "", addr_p[64], addr_d[64];
  const char *key = key_setup(&o, key_dir, key_path);
  if (key && !*key) return 1;
  rt.key_file = key;
  for (int k = 0; k < 2 && ops[1] != ops[0]; k++) {
    rt.plugin[k] = side_plugin[k];
    rt.abi[k] = ops[k]->abi_version;
  }
  uint16_t ports[2];
  if (o.ip) inst_ip = o.ip;
  free_ports(o.tp, ports);
  char *cfg_p = instance_config(&o, cfg_path, key, true, ports[0], &lease_p, &push);
  char *cfg_d = cfg_p ? instance_config(&o, cfg_path, key, false, ports[1], &lease_d, &push) : NULL;
  rc = 2;
  if (!cfg_d) goto free_cfg;
  rt.addr[0] = config_address(cfg_p, addr_p, sizeof(addr_p));
  rt.addr[1] = config_address(cfg_d, addr_d, sizeof(addr_d));
  rc = 1;
  if (push && !HIXL_KV_HAS_OP(ops[1], get_push_params)) { /* decode's scheduler asks it */
    fprintf(stderr, "hixl-mock-host: mode push needs get_push_params, which %s's ops table lacks\n",
            side_plugin[1]);
    goto free_cfg;
  }
  if (o.verbose && ops[1] == ops[0])
    fprintf(stderr, "hixl-mock-host: plugin %s\n  prefill config %s\n  decode config %s\n", plugin, cfg_p,
            cfg_d);
  else if (o.verbose)
    fprintf(stderr,
            "hixl-mock-host: prefill plugin %s (ABI %u.%u)\n  decode plugin %s (ABI %u.%u)\n"
            "  prefill config %s\n  decode config %s\n",
            side_plugin[0], ops[0]->abi_version >> 16, ops[0]->abi_version & 0xffff, side_plugin[1],
            ops[1]->abi_version >> 16, ops[1]->abi_version & 0xffff, cfg_p, cfg_d);

  rt.push = push;
  if (!(rt.r = requests_new(&o))) goto free_cfg;
  rt.side[0].name = "prefill";
  rt.side[1].name = "decode";
  if (mh_obs_start(&rt) < 0) goto free_router;
  if (mh_run(&rt, ops, cfg_p, cfg_d, &md, (uint32_t)(lease_p + 3000)) < 0) goto free_router;
  mh_reap(&rt);
  rc = mh_verdict(&rt) ? 0 : 1;
  if (mh_report(&rt, &md, rc == 0) < 0) rc = 1;
  mh_obs_finish(&rt);
free_router:
  mh_obs_finish(&rt);
  mh_conn_fini(&rt.side[0].conn);
  mh_conn_fini(&rt.side[1].conn);
  free(rt.r);
free_cfg:
  free(cfg_p);
  free(cfg_d);
  key_remove(key_dir, key_path);
  return rc;
}
