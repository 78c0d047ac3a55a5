/* options: table-driven parsing and validation of engine options. */
#include "engine/options.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "util/status_int.h"

#define BAD_VALUE_SHOWN 64u /* bytes of a refused value quoted in the message */

typedef bool (*opt_parse_fn)(const char *value, struct hixl_options *o);

static bool parse_u32(const char *s, uint32_t min, uint32_t max, uint32_t *out) {
  if (!s || *s < '0' || *s > '9') return false; /* strtoull would skip whitespace and take a sign */
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v < min || v > max) return false;
  *out = (uint32_t)v;
  return true;
}

static bool parse_pool(const char *s, struct hixl_options *o) {
  const char *colon = s ? strchr(s, ':') : NULL;
  char num[16];
  uint32_t n, mb;
  if (!colon || (size_t)(colon - s) >= sizeof(num)) return false;
  memcpy(num, s, (size_t)(colon - s));
  num[colon - s] = '\0';
  if (!parse_u32(num, 0, 1024, &n) || !parse_u32(colon + 1, 0, 4096, &mb)) return false;
  if ((n == 0) != (mb == 0)) return false; /* "0:0" is off; "0:8" or "4:0" mean nothing */
  o->pool_num = n;
  o->pool_size_mb = mb;
  return true;
}

static bool parse_tc(const char *s, struct hixl_options *o) {
  uint32_t v;
  if (!parse_u32(s, 0, 255, &v) || v % 4 != 0) return false;
  o->rdma_tc = v;
  return true;
}

static bool parse_sl(const char *s, struct hixl_options *o) { return parse_u32(s, 0, 7, &o->rdma_sl); }

static bool parse_timeout(const char *s, struct hixl_options *o) {
  return parse_u32(s, 5, 20, &o->rdma_timeout);
}

static bool parse_retry(const char *s, struct hixl_options *o) { return parse_u32(s, 1, 7, &o->rdma_retry); }

static bool parse_device(const char *s, struct hixl_options *o) {
  if (!s || strlen(s) >= sizeof(o->rdma_device) || strpbrk(s, " /")) return false;
  strcpy(o->rdma_device, s);
  return true;
}

static bool parse_gid_index(const char *s, struct hixl_options *o) {
  uint32_t v;
  if (s && strcmp(s, "auto") == 0) {
    o->rdma_gid_index = -1;
    return true;
  }
  if (!parse_u32(s, 0, 255, &v)) return false;
  o->rdma_gid_index = (int32_t)v;
  return true;
}

static bool parse_threshold(const char *s, struct hixl_options *o) {
  o->stage_threshold_auto = s && strcmp(s, "auto") == 0;
  return o->stage_threshold_auto || parse_u32(s, 0, 1u << 20, &o->stage_threshold);
}

static bool parse_unregistered(const char *s, struct hixl_options *o) {
  if (!s || (strcmp(s, "on") != 0 && strcmp(s, "off") != 0)) return false;
  o->stage_unregistered = strcmp(s, "on") == 0;
  return true;
}

static bool parse_payload_tag(const char *s, struct hixl_options *o) {
  if (!s || (strcmp(s, "on") != 0 && strcmp(s, "off") != 0)) return false;
  o->auth_payload_tag = strcmp(s, "on") == 0;
  return true;
}

static bool parse_answers_max(const char *s, struct hixl_options *o) {
  return parse_u32(s, 16, 1u << 20, &o->answers_max);
}

static bool parse_answer_mib(const char *s, struct hixl_options *o) {
  uint32_t v;
  if (!parse_u32(s, 1, 65536, &v)) return false;
  o->answer_bytes_max = (size_t)v << 20;
  return true;
}

static bool parse_handshake(const char *s, struct hixl_options *o) {
  return parse_u32(s, 100, 3600000, &o->handshake_ms);
}

static bool parse_max_links(const char *s, struct hixl_options *o) {
  return parse_u32(s, 1, 1u << 20, &o->max_links);
}

static bool parse_max_links_addr(const char *s, struct hixl_options *o) {
  return parse_u32(s, 1, 1u << 20, &o->max_links_addr);
}

static bool parse_key_file(const char *s, struct hixl_options *o) {
  if (!s || strlen(s) >= sizeof(o->auth_key_file)) return false;
  strcpy(o->auth_key_file, s);
  return true;
}

/* A comma-separated list has no empty item (strtok_r would skip it): none first, last or
 * between two commas. */
static bool list_items_ok(const char *s) {
  return s[0] != ',' && s[strlen(s) - 1] != ',' && !strstr(s, ",,");
}

/* AuthAliases: "" or 1 to HIXL_ALIASES_MAX distinct "ip:port", comma-separated (port 1-65535). */
static bool parse_aliases(const char *s, struct hixl_options *o) {
  o->alias_n = 0;
  if (!s || strlen(s) > 255) return false;
  if (!*s) return true;
  char buf[256], *save = NULL;
  strcpy(buf, s);
  if (!list_items_ok(buf)) return false;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *colon = strrchr(tok, ':'), *end = NULL;
    struct in_addr a;
    if (o->alias_n == HIXL_ALIASES_MAX || !colon) return false;
    *colon = '\0';
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (inet_pton(AF_INET, tok, &a) != 1 || colon[1] < '0' || colon[1] > '9' || *end || port == 0 ||
        port > 65535)
      return false;
    for (uint32_t i = 0; i < o->alias_n; i++)
      if (o->alias_addr[i] == a.s_addr && o->alias_port[i] == port) return false;
    o->alias_addr[o->alias_n] = a.s_addr;
    o->alias_port[o->alias_n++] = (uint16_t)port;
  }
  return true;
}

/* Rails: "" (one link per peer), "auto", or 1 to HIXL_RAILS_MAX distinct IPv4 addresses, comma-separated. */
static bool parse_rails(const char *s, struct hixl_options *o) {
  o->rails_on = o->rails_auto = false;
  o->rails_n = 0;
  if (!s || strlen(s) > 255) return false;
  if (!*s) return true;
  if (strcmp(s, "auto") == 0) return o->rails_on = o->rails_auto = true;
  char buf[256], *save = NULL;
  strcpy(buf, s);
  if (!list_items_ok(buf)) return false;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    struct in_addr a;
    if (o->rails_n == HIXL_RAILS_MAX || inet_pton(AF_INET, tok, &a) != 1 || a.s_addr == htonl(INADDR_ANY))
      return false;
    for (uint32_t i = 0; i < o->rails_n; i++)
      if (o->rail_addr[i] == a.s_addr) return false;
    o->rail_addr[o->rails_n++] = a.s_addr;
  }
  return o->rails_on = o->rails_n > 0;
}

static bool parse_rail_stall(const char *s, struct hixl_options *o) {
  return parse_u32(s, 100, 600000, &o->rail_stall_ms);
}

static bool parse_rail_probe(const char *s, struct hixl_options *o) {
  return parse_u32(s, 50, 600000, &o->rail_probe_ms);
}

static bool parse_sockbuf(const char *s, struct hixl_options *o) {
  uint32_t v;
  o->sockbuf_auto = s && strcmp(s, "auto") == 0;
  if (o->sockbuf_auto) {
    o->sockbuf_kib = SOCKBUF_AUTO_KIB;
    return true;
  }
  if (!parse_u32(s, 0, 65536, &v) || (v > 0 && v < 64)) return false;
  o->sockbuf_kib = v;
  return true;
}

static bool parse_poll(const char *s, struct hixl_options *o) {
  return parse_u32(s, 0, 1000000, &o->poll_us);
}

static const char *const transport_names[] = {"auto", "tcp", "rdma", "shm"};

static bool parse_transport(const char *s, struct hixl_options *o) {
  for (size_t i = 0; i < sizeof(transport_names) / sizeof(transport_names[0]); i++)
    if (s && strcmp(s, transport_names[i]) == 0) {
      o->transport = (enum hixl_transport)i;
      return true;
    }
  return false;
}

const char *hixl_transport_name(enum hixl_transport t) { return (unsigned)t < 4 ? transport_names[t] : "?"; }

/* The one table of options: name, default, environment variable, range, meaning,
 * parser. Parsing, validation, HixlEngineOptionTable and config/'s rows come from it. */
#define HIXL_OPTIONS(X)                                                                                      \
  X("BufferPool", "4:8", NULL, "\"NUM:SIZE_MB\", NUM in [0,1024], SIZE_MB in [0,4096], \"0:0\" off",         \
    "staging buffers: NUM buffers of SIZE_MB MiB each", parse_pool)                                          \
  X("RdmaTrafficClass", "132", "HCCL_RDMA_TC", "[0,255], a multiple of 4",                                   \
    "RDMA traffic class (GRH traffic_class) of every QP", parse_tc)                                          \
  X("RdmaServiceLevel", "4", "HCCL_RDMA_SL", "[0,7]", "RDMA service level of every QP", parse_sl)            \
  X("Transport", "auto", NULL, "auto | tcp | rdma | shm",                                                    \
    "data transport; auto picks the best both peers support", parse_transport)                               \
  X("RdmaDevice", "", NULL,                                                                                  \
    "an RDMA device name such as rxe0 or mlx5_0; \"\" finds the device that owns the IP",                    \
    "RDMA device to use", parse_device)                                                                      \
  X("RdmaGidIndex", "auto", NULL, "auto, or [0,255]",                                                        \
    "GID index; auto picks the RoCE v2 GID of the engine's IP", parse_gid_index)                             \
  X("StagingThreshold", "auto", NULL, "auto, or [0,1048576] bytes; 0 never packs",                           \
    "ops shorter than this, on tcp and rdma links, are packed through the staging pool; auto: 4096 "         \
    "on tcp links, 4096 on rdma links",                                                                      \
    parse_threshold)                                                                                         \
  X("StagingUnregistered", "off", NULL, "on | off",                                                          \
    "as a target: let peers' staged ops reach host memory this engine did not register", parse_unregistered) \
  X("RdmaTimeout", "20", "HCCL_RDMA_TIMEOUT", "[5,20]",                                                      \
    "RDMA ack timeout of every QP: 4.096 us * 2^value before a retransmission (20: 4.3 s)", parse_timeout)   \
  X("RdmaRetryCount", "7", "HCCL_RDMA_RETRY_CNT", "[1,7]",                                                   \
    "RDMA retransmissions of every QP before its work request fails", parse_retry)                           \
  X("LinkAnswersMax", "16384", NULL, "[16,1048576]",                                                         \
    "as a target: answers one link may owe its peer (queued, not yet sent) before this engine stops "        \
    "reading that link's requests; it reads on once they are down to half",                                  \
    parse_answers_max)                                                                                       \
  X("LinkAnswerMiB", "256", NULL, "[1,65536]",                                                               \
    "as a target: MiB of answers one link may owe its peer before this engine stops reading that link's "    \
    "requests; it reads on once they are down to half",                                                      \
    parse_answer_mib)                                                                                        \
  X("HandshakeTimeout", "10000", NULL, "[100,3600000] ms",                                                   \
    "as a target: a connection that has not said HELLO this long after it was accepted is closed",           \
    parse_handshake)                                                                                         \
  X("MaxLinks", "4096", NULL, "[1,1048576]",                                                                 \
    "as a target: links accepted at once; beyond, the oldest connection without HELLO is closed for a "      \
    "newcomer, else the newcomer is",                                                                        \
    parse_max_links)                                                                                         \
  X("MaxLinksPerAddress", "512", NULL, "[1,1048576]",                                                        \
    "as a target: links accepted at once from one IP address; a connection beyond is closed as it is "       \
    "accepted",                                                                                              \
    parse_max_links_addr)                                                                                    \
  X("AuthKeyFile", "", "HIXL_AUTH_KEY_FILE",                                                                 \
    "a path (< 1024 bytes) to a file of one or two keys of 32-128 hex digits, no group or other access, "    \
    "owned by this user or root; \"\" none",                                                                 \
    "pre-shared keys: every link proves one both ends hold (HMAC-SHA256 challenge-response) before "         \
    "anything else; \"\" accepts links from anyone (docs/security.md)",                                      \
    parse_key_file)                                                                                          \
  X("AuthAliases", "", NULL, "\"\" | 1 to 8 \"ip:port\", comma-separated",                                   \
    "with AuthKeyFile: other addresses peers dial this engine by (NAT, a service address, a TCP proxy); "    \
    "a keyed link is served only when the address its initiator dialled is this engine's own, a rail's, "    \
    "or one of these (docs/security.md)",                                                                    \
    parse_aliases)                                                                                           \
  X("AuthPayloadTag", "off", "HIXL_AUTH_PAYLOAD_TAG", "on | off",                                            \
    "with AuthKeyFile: tag the data of every tcp payload too (GMAC over it, a pass over the bytes on both "  \
    "ends) and require the peer's payloads tagged; off: only frame headers and bodies are "                  \
    "(docs/security.md)",                                                                                    \
    parse_payload_tag)                                                                                       \
  X("Rails", "", NULL, "\"\" | auto | 1 to 8 IPv4 addresses of this engine, comma-separated",                \
    "several NICs: one link per rail to each peer that has rails too (tcp or rdma: a QP on each rail's "     \
    "device), large transfers striped "                                                                      \
    "over them, a failed rail's ops retried on the others; the engine also accepts links on each address; "  \
    "auto: every IPv4 address of an interface that is up (docs/rails.md)",                                   \
    parse_rails)                                                                                             \
  X("RailStallMs", "1000", NULL, "[100,600000] ms",                                                          \
    "with Rails: a rail whose sent data stays unacknowledged this long (its path is gone, not its peer "     \
    "slow) is taken out, its ops retried on the other rails",                                                \
    parse_rail_stall)                                                                                        \
  X("RailProbeMs", "500", NULL, "[50,600000] ms",                                                            \
    "with Rails: how often a rail that is down is dialled again; it carries traffic once it answers",        \
    parse_rail_probe)                                                                                        \
  X("SocketBufferKiB", "auto", NULL, "auto, 0, or [64,65536] KiB",                                           \
    "send and receive buffer of every link's TCP socket, fixed (SO_SNDBUF, SO_RCVBUF); 0: the kernel "       \
    "autotunes each; auto: 2048 where net.core.rmem_max and wmem_max allow it, else 0 (a path of long "      \
    "round trips, beyond a data centre, may want 0)",                                                        \
    parse_sockbuf)                                                                                           \
  X("PollUs", "0", "HIXL_POLL_US", "[0,1000000] us",                                                         \
    "the progress thread goes on polling its sockets (no wait, the CPU yielded between polls) this long "    \
    "after its last event before it sleeps, and a sync caller this long for its answer: what comes "         \
    "meanwhile is taken without a wake-up. A window that catches nothing makes the next ones rarer (1, 3, "  \
    "7, ... 64 skipped), so sparse traffic costs little CPU; a caller does not poll while its engine's "     \
    "copies run, and none polls for 100 ms after a yield that another task held the CPU through (1 ms "      \
    "or more). 0 (the default): both sleep at once. For hosts with a CPU to spare for it, as UCX's and "     \
    "NIXL's polling progress threads take one: beside a CPU-bound task it can be slower (docs/design.md)",   \
    parse_poll)

#define OPTION_INFO(name, def, env, range, doc, parse)  {name, def, env, range, doc},
#define OPTION_PARSE(name, def, env, range, doc, parse) parse,
static const hixl_option_info option_info[] = {HIXL_OPTIONS(OPTION_INFO)};
static const opt_parse_fn option_parse[] = {HIXL_OPTIONS(OPTION_PARSE)};
#define N_OPTIONS (sizeof(option_info) / sizeof(option_info[0]))

static HixlStatus unknown_key(const char *key) {
  char known[1024];
  size_t len = 0;
  known[0] = '\0';
  for (size_t k = 0; k < N_OPTIONS && len < sizeof(known); k++)
    len += (size_t)snprintf(known + len, sizeof(known) - len, "%s%s", k ? ", " : "", option_info[k].name);
  return hixl_fail(HIXL_PARAM_INVALID, "unknown option \"%s\" (known: %s)", key, known);
}

/* The value is quoted escaped (one from the environment cannot forge a line of a log)
 * and cut, so that the reason after it always fits the message. */
static HixlStatus bad_value(const hixl_option_info *info, const char *value, const char *from) {
  char shown[4 * BAD_VALUE_SHOWN + 1];
  size_t n = value ? strlen(value) : 0;
  log_escape(shown, sizeof(shown), value ? value : "(null)",
             value ? (n > BAD_VALUE_SHOWN ? BAD_VALUE_SHOWN : n) : 6);
  return hixl_fail(HIXL_PARAM_INVALID, "%s \"%s\"%s (from %s) is invalid: expected %s", info->name, shown,
                   n > BAD_VALUE_SHOWN ? "..." : "", from, info->range);
}

HixlStatus hixl_options_parse(const HixlOption *opts, size_t n, struct hixl_options *out) {
  struct hixl_options o;
  bool given[N_OPTIONS] = {false};
  if (n > 0 && !opts) return hixl_fail(HIXL_PARAM_INVALID, "options is NULL but num_options is %zu", n);
  for (size_t k = 0; k < N_OPTIONS; k++) option_parse[k](option_info[k].def, &o);
  for (size_t i = 0; i < n; i++) {
    size_t k = 0;
    if (!opts[i].key) return hixl_fail(HIXL_PARAM_INVALID, "option %zu has a NULL key", i);
    while (k < N_OPTIONS && strcmp(opts[i].key, option_info[k].name) != 0) k++;
    if (k == N_OPTIONS) return unknown_key(opts[i].key);
    if (given[k]) return hixl_fail(HIXL_PARAM_INVALID, "option %s given twice", opts[i].key);
    if (!option_parse[k](opts[i].value, &o)) return bad_value(&option_info[k], opts[i].value, "option");
    given[k] = true;
  }
  /* Precedence as HIXL: option, then environment, then default. */
  for (size_t k = 0; k < N_OPTIONS; k++) {
    const char *env = option_info[k].env ? getenv(option_info[k].env) : NULL;
    if (!given[k] && env && !option_parse[k](env, &o))
      return bad_value(&option_info[k], env, option_info[k].env);
  }
  *out = o;
  return HIXL_SUCCESS;
}

const HixlEngineOptionInfo *HixlEngineOptionTable(size_t *count) {
  size_t n = N_OPTIONS;
  if (count) *count = n;
  return option_info;
}

HixlStatus HixlEngineCheckOption(const char *key, const char *value) {
  struct hixl_options o;
  size_t k = 0;
  if (!key || !value) return hixl_fail(HIXL_PARAM_INVALID, "key or value is NULL");
  while (k < N_OPTIONS && strcmp(key, option_info[k].name) != 0) k++;
  if (k == N_OPTIONS) return unknown_key(key);
  for (size_t i = 0; i < N_OPTIONS; i++) option_parse[i](option_info[i].def, &o);
  if (!option_parse[k](value, &o)) return bad_value(&option_info[k], value, "option");
  return HIXL_SUCCESS;
}
