/* hixl-mock-host: the router's options: the usage text and the command line's
 * parsing, with each option's check and default. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mh.h"

static const char *const fault_names[] = {
    "none",          "decode-dies", "prefill-dies", "mismatch-block",   "mismatch-dtype", "link-cut",
    "decode-aborts", "link-reset",  "intruder",     "decode-rank-dies", "mismatch-heads"};

const char *mh_fault_name(enum mh_fault f) { return fault_names[f]; }

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: hixl-mock-host [options]\n"
      "  A prefill and a decode instance (separate processes, each a scheduler and a worker KV\n"
      "  connector) and a router; every byte of KV that reaches decode is checked.\n"
      "  --plugin PATH            libhixl_kv_connector.so (default: the one built beside this host)\n"
      "  --prefill-plugin PATH --decode-plugin PATH   that instance's plugin (default --plugin's):\n"
      "                           peers of different builds, as in an upgrade one instance at a time\n"
      "  --config FILE            base connector config (JSON); address and role are set per instance\n"
      "  --model NAME             preset shape (default llama8b: 32 layers, 8 KV heads x 128 x 2 B,\n"
      "                           16-token blocks; tiny: 2 layers, 2 x 16 x 2 B, 4-token blocks, 64 blocks;\n"
      "                           mla: 4 layers, a latent of 576 x 2 B, 16-token blocks; hybrid: tiny's\n"
      "                           heads, 4 layers, the odd ones a sliding window of a quarter of the\n"
      "                           largest prompt; gqa8: 2 layers, 8 KV heads x 16 x 2 B, 4-token\n"
      "                           blocks, packed layout, tensor parallelism's test shape)\n"
      "  --layout NAME            the KV tensors' layout: kv_first (default; ABI 1.0's\n"
      "                           register_kv_caches), or through ABI 1.3's register_kv_groups:\n"
      "                           blocks_first, packed, LBNHC, LBHNC, LHBNC, BLNHC, BLHNC, BHLNC,\n"
      "                           cross_layer\n"
      "  --layers N --kv-heads N --head-dim N --elem-size N --block-tokens N --num-blocks N\n"
      "  --kv-mib N               KV cache per instance, sets --num-blocks (llama8b default 512)\n"
      "  --kv-memory hixl|host|cuda|device-sim  who allocates the KV caches: the plugin\n"
      "                           (alloc_kv_caches, or alloc_kv_memory: memory a same-host peer maps;\n"
      "                           default), the host, or the host in device memory (kv_memory device):\n"
      "                           cuda (cuMemAlloc; exits 77 where no driver or device is found) or\n"
      "                           device-sim (a memfd mapped shared, run with HIXL_TEST_DEVMEM=host);\n"
      "                           the host computes and checks a copy, moved to and from the device\n"
      "  --expect-device-ipc      pass only if the side that moves the KV (pull: decode, push: prefill)\n"
      "                           moved all of it on the peer's device memory opened by IPC handle\n"
      "                           (same host: --transport shm or auto), the other side none\n"
      "  --expect-device-rdma     the same, moved by RDMA directly (GPUDirect: --transport rdma)\n"
      "  --requests N             (default 16)       --concurrency N (default 4)\n"
      "  --min-prompt N --max-prompt N   prompt tokens, uniform (default 16 .. 4096, tiny 16 .. 64)\n"
      "  --seed N                 prompts and KV content (default 1)\n"
      "  --compute-us-per-token N prefill compute time per layer per token (default 0)\n"
      "  --transport NAME         sets the config's Transport (tcp, shm, rdma, auto)\n"
      "  --mode pull|push         sets the config's mode (push: decode allocates first, prefill\n"
      "                           writes each layer into it as soon as it is computed)\n"
      "  --lease-ms N             sets the config's lease_ms\n"
      "  --queue-ms N             (pull) decode calls on_new_request (ABI 1.6) as a request arrives\n"
      "                           and schedules it N ms later, as a request waiting in vLLM's queues:\n"
      "                           past a third of prefill's lease its hold is renewed (RENEW)\n"
      "  --on-load-failure fail|recompute   sets the config's load_failure_policy\n"
      "  --prefill-addr IP:PORT --decode-addr IP:PORT   (default --ip and free ports)\n"
      "  --ip IP                  the instances' address (default 127.0.0.1)\n"
      "  --prefill-netns NAME --decode-netns NAME   run the instance (and its ranks) in the network\n"
      "                           namespace NAME (ip netns; root): two hosts on one machine, e.g.\n"
      "                           integration/rails/bed.sh's; give the addresses inside them too\n"
      "  --set KEY=VALUE          any other config key (VALUE is JSON, else a string); repeatable\n"
      "  --prefill-set KEY=VALUE --decode-set KEY=VALUE   the same for one instance (e.g. its Rails)\n"
      "  --prefill-tp N --decode-tp N   each instance's tensor-parallel size (default 1): one worker\n"
      "                           process per rank, each its engine on the address's port + rank and\n"
      "                           the KV of its heads (KV heads / N; more ranks than heads replicate\n"
      "                           them); one scheduler per instance waits for every rank\n"
      "  --fault decode-dies|prefill-dies|mismatch-block|mismatch-dtype|link-cut|link-reset|\n"
      "          decode-aborts|intruder|decode-rank-dies|mismatch-heads\n"
      "           --fault-at N    (link-cut: prefill is stopped, SIGSTOP, after the Nth hand-off until\n"
      "                           every load in flight has ended, then resumed; link-reset: at the Nth\n"
      "                           hand-off prefill shuts down every TCP connection it has, transfers in\n"
      "                           flight fail, later ones link again; decode-aborts: decode aborts its\n"
      "                           Nth load as it starts, as a client that went away; intruder: a\n"
      "                           process without the key attacks both engines all through the run;\n"
      "                           decode-rank-dies: decode's last rank dies as its Nth load starts;\n"
      "                           mismatch-heads: decode's rank r checks the heads of rank TP-1-r)\n"
      "  --auth-key FILE|none     the instances' AuthKeyFile (default: a fresh key made for the run,\n"
      "                           in a private directory; none: no key, links from anyone)\n"
      "  --timeout S              give up after S seconds (default 120)\n"
      "  --json FILE              the summary as JSON\n"
      "  --trace FILE             the plugin's per-request traces (JSON lines, both instances) and one\n"
      "                           hand-off line per request (integration/scripts/trace-plot.sh draws them)\n"
      "  --metrics-port N         serve both instances' metrics (Prometheus text) on\n"
      "                           http://127.0.0.1:N/metrics while the run lasts\n"
      "  --metrics-linger S       ... and S seconds after the summary (SIGTERM or SIGINT ends it)\n"
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

int mh_parse_opts(int argc, char **argv, struct mh_opts *o) {
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
    O_PNETNS,
    O_DNETNS,
    O_AUTHKEY,
    O_FAULT,
    O_FAT,
    O_TIMEOUT,
    O_JSON,
    O_NOPROG,
    O_VERBOSE,
    O_MODE,
    O_SET,
    O_PSET,
    O_DSET,
    O_KVMEM,
    O_LAYOUT,
    O_PTP,
    O_DTP,
    O_TRACE,
    O_MPORT,
    O_MLINGER,
    O_EXPIPC,
    O_EXPRDMA,
    O_IP,
    O_PPLUGIN,
    O_DPLUGIN,
    O_QUEUE,
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
                                     {"prefill-netns", 1, 0, O_PNETNS},
                                     {"decode-netns", 1, 0, O_DNETNS},
                                     {"fault", 1, 0, O_FAULT},
                                     {"fault-at", 1, 0, O_FAT},
                                     {"auth-key", 1, 0, O_AUTHKEY},
                                     {"timeout", 1, 0, O_TIMEOUT},
                                     {"json", 1, 0, O_JSON},
                                     {"no-progress", 0, 0, O_NOPROG},
                                     {"verbose", 0, 0, O_VERBOSE},
                                     {"mode", 1, 0, O_MODE},
                                     {"set", 1, 0, O_SET},
                                     {"prefill-set", 1, 0, O_PSET},
                                     {"decode-set", 1, 0, O_DSET},
                                     {"kv-memory", 1, 0, O_KVMEM},
                                     {"layout", 1, 0, O_LAYOUT},
                                     {"prefill-tp", 1, 0, O_PTP},
                                     {"decode-tp", 1, 0, O_DTP},
                                     {"trace", 1, 0, O_TRACE},
                                     {"metrics-port", 1, 0, O_MPORT},
                                     {"metrics-linger", 1, 0, O_MLINGER},
                                     {"expect-device-ipc", 0, 0, O_EXPIPC},
                                     {"expect-device-rdma", 0, 0, O_EXPRDMA},
                                     {"ip", 1, 0, O_IP},
                                     {"prefill-plugin", 1, 0, O_PPLUGIN},
                                     {"decode-plugin", 1, 0, O_DPLUGIN},
                                     {"queue-ms", 1, 0, O_QUEUE},
                                     {"help", 0, 0, O_HELP},
                                     {0, 0, 0, 0}};
  uint64_t set[O_HELP + 1] = {0}, v = 0;
  bool given[O_HELP + 1] = {0};
  int c;
  *o = (struct mh_opts){.requests = 16,
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
    case O_PPLUGIN: o->side_plugin[0] = optarg; break;
    case O_DPLUGIN: o->side_plugin[1] = optarg; break;
    case O_CONFIG: o->config = optarg; break;
    case O_MODEL: o->model_name = optarg; break;
    case O_TRANSPORT: o->transport = optarg; break;
    case O_POLICY: o->policy = optarg; break;
    case O_PADDR: o->prefill_addr = optarg; break;
    case O_DADDR: o->decode_addr = optarg; break;
    case O_PNETNS: o->netns[0] = optarg; break;
    case O_DNETNS: o->netns[1] = optarg; break;
    case O_AUTHKEY: o->auth_key = optarg; break;
    case O_JSON: o->json = optarg; break;
    case O_MODE: o->mode = optarg; break;
    case O_LAYOUT: o->layout = optarg; break;
    case O_TRACE: o->trace = optarg; break;
    case O_KVMEM:
      if (strcmp(optarg, "hixl") != 0 && strcmp(optarg, "host") != 0 && strcmp(optarg, "cuda") != 0 &&
          strcmp(optarg, "device-sim") != 0) {
        fprintf(stderr, "hixl-mock-host: --kv-memory %s: want hixl, host, cuda or device-sim\n", optarg);
        return 2;
      }
      o->kv_memory = optarg;
      break;
    case O_SET:
    case O_PSET:
    case O_DSET:
      if (!strchr(optarg, '=') || optarg[0] == '=' || o->nset == sizeof(o->set) / sizeof(o->set[0])) {
        fprintf(stderr, "hixl-mock-host: --%s %s: want KEY=VALUE (at most 16 in all)\n",
                c == O_SET    ? "set"
                : c == O_PSET ? "prefill-set"
                              : "decode-set",
                optarg);
        return 2;
      }
      o->set_who[o->nset] = c == O_SET ? 0 : c == O_PSET ? 1 : 2;
      o->set[o->nset++] = optarg;
      break;
    case O_NOPROG: o->progress = false; break;
    case O_VERBOSE: o->verbose = true; break;
    case O_EXPIPC: o->expect_ipc = true; break;
    case O_EXPRDMA: o->expect_rdma = true; break;
    case O_IP: o->ip = optarg; break;
    case O_HELP: usage(stdout); exit(0);
    case O_FAULT: {
      size_t k = 0;
      while (k < sizeof(fault_names) / sizeof(fault_names[0]) && strcmp(optarg, fault_names[k]) != 0) k++;
      if (k == sizeof(fault_names) / sizeof(fault_names[0])) {
        fprintf(stderr,
                "hixl-mock-host: --fault %s is unknown (decode-dies, prefill-dies, mismatch-block, "
                "mismatch-dtype, link-cut, decode-aborts, link-reset, intruder, decode-rank-dies, "
                "mismatch-heads)\n",
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
    fprintf(stderr, "hixl-mock-host: --model %s is unknown (tiny, llama8b, mla, hybrid, gqa8)\n",
            o->model_name);
    return 2;
  }
  o->tp[0] = given[O_PTP] ? (uint32_t)set[O_PTP] : 1;
  o->tp[1] = given[O_DTP] ? (uint32_t)set[O_DTP] : 1;
  if (o->tp[0] > MH_MAX_TP || o->tp[1] > MH_MAX_TP) {
    fprintf(stderr, "hixl-mock-host: --prefill-tp %u --decode-tp %u: at most %u ranks an instance\n",
            o->tp[0], o->tp[1], MH_MAX_TP);
    return 2;
  }
  m->tp = o->tp[0] > 1 || o->tp[1] > 1;
  /* A TP run keeps a head's tokens together by default (a head slice is one run). */
  if (m->tp && !o->layout && m->kind == MH_MODEL_STANDARD && m->layout == MH_LAYOUT_KV_FIRST)
    m->layout = MH_LAYOUT_PACKED;
  if (o->layout && mh_layout_parse(o->layout, &m->layout) < 0) {
    fprintf(stderr, "hixl-mock-host: --layout %s is unknown (%s)\n", o->layout, mh_layout_list);
    return 2;
  }
  if (given[O_LAYERS]) m->layers = (uint32_t)set[O_LAYERS];
  if (given[O_HEADS]) m->kv_heads = (uint32_t)set[O_HEADS];
  for (int k = 0; k < 2 && m->kind != MH_MODEL_MLA; k++) {
    uint32_t t = o->tp[k], h = m->kv_heads;
    if ((t <= h && h % t) || (t > h && t % h)) {
      fprintf(stderr,
              "hixl-mock-host: --%s-tp %u and %u KV heads: one must divide the other (each rank holds KV "
              "heads / TP of them, or one head on TP / KV heads ranks)\n",
              k ? "decode" : "prefill", t, h);
      return 2;
    }
  }
  if (o->tp[0] != o->tp[1] && m->kind != MH_MODEL_MLA && !mh_layout_head_major(m->layout)) {
    fprintf(
        stderr,
        "hixl-mock-host: --prefill-tp %u --decode-tp %u with layout %s: prefill and decode of different "
        "TP sizes move head slices, and a %s block interleaves its heads token by token; use a head-major "
        "layout (packed, LBHNC, LHBNC, BLHNC, BHLNC)\n",
        o->tp[0], o->tp[1], mh_layout_name(m->layout), mh_layout_name(m->layout));
    return 2;
  }
  if ((o->fault == MH_FAULT_DECODE_RANK_DIES || o->fault == MH_FAULT_MISMATCH_HEADS) && o->tp[1] < 2) {
    fprintf(stderr, "hixl-mock-host: --fault %s needs --decode-tp 2 or more\n", mh_fault_name(o->fault));
    return 2;
  }
  if (o->fault == MH_FAULT_MISMATCH_HEADS && (m->kind == MH_MODEL_MLA || o->tp[1] > m->kv_heads)) {
    fprintf(stderr, "hixl-mock-host: --fault mismatch-heads needs decode ranks that hold different heads\n");
    return 2;
  }
  if ((o->fault == MH_FAULT_LINK_CUT || o->fault == MH_FAULT_LINK_RESET) && o->tp[0] > 1) {
    fprintf(stderr,
            "hixl-mock-host: --fault %s acts on the prefill instance's process, which holds no engine with "
            "--prefill-tp %u (each rank's process does); use --prefill-tp 1\n",
            mh_fault_name(o->fault), o->tp[0]);
    return 2;
  }
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
  if (given[O_QUEUE]) o->queue_ms = (uint32_t)set[O_QUEUE];
  if (given[O_MPORT] && set[O_MPORT] > 65535) {
    fprintf(stderr, "hixl-mock-host: --metrics-port %" PRIu64 ": want 1 to 65535\n", set[O_MPORT]);
    return 2;
  }
  o->metrics_port = (uint16_t)set[O_MPORT];
  o->metrics_linger = (uint32_t)set[O_MLINGER];
  if (o->metrics_linger && !o->metrics_port) {
    fprintf(stderr, "hixl-mock-host: --metrics-linger needs --metrics-port\n");
    return 2;
  }
  struct in_addr ip;
  if (o->ip && inet_pton(AF_INET, o->ip, &ip) != 1) {
    fprintf(stderr, "hixl-mock-host: --ip %s: not an IPv4 address\n", o->ip);
    return 2;
  }
  const char *exp = o->expect_ipc ? "--expect-device-ipc" : "--expect-device-rdma";
  if (o->expect_ipc && o->expect_rdma) {
    fprintf(stderr, "hixl-mock-host: --expect-device-ipc and --expect-device-rdma: one of them\n");
    return 2;
  }
  if ((o->expect_ipc || o->expect_rdma) && o->fault != MH_FAULT_NONE) {
    fprintf(stderr, "hixl-mock-host: %s is checked on a run without --fault\n", exp);
    return 2;
  }
  if ((o->expect_ipc || o->expect_rdma) &&
      (o->tp[0] > 1 || o->tp[1] > 1 ||
       (strcmp(o->kv_memory, "cuda") != 0 && strcmp(o->kv_memory, "device-sim") != 0))) {
    fprintf(stderr,
            "hixl-mock-host: %s needs --kv-memory cuda or device-sim, and one rank a "
            "side (the ranks' counters are gathered from an instance's one worker)\n",
            exp);
    return 2;
  }
  if ((o->metrics_port || o->trace) && (o->tp[0] > 1 || o->tp[1] > 1)) {
    fprintf(stderr, "hixl-mock-host: --metrics-port and --trace gather an instance's one worker; with "
                    "--prefill-tp / --decode-tp above 1 the ranks' processes hold the workers, and gathering "
                    "from them is not built\n");
    return 2;
  }
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
  if (mh_opts_dev(o) != MH_DEV_NONE) {
    if (!mh_layout_v10(m)) {
      fprintf(stderr, "hixl-mock-host: --kv-memory %s: layout kv_first only\n", o->kv_memory);
      return 2;
    }
    if (o->nset == sizeof(o->set) / sizeof(o->set[0])) {
      fprintf(stderr, "hixl-mock-host: --kv-memory %s sets kv_memory=device: at most 15 --set then\n",
              o->kv_memory);
      return 2;
    }
    o->set_who[o->nset] = 0; /* both instances register device memory */
    o->set[o->nset++] = "kv_memory=device";
  }
  return 0;
}

enum mh_dev mh_opts_dev(const struct mh_opts *o) {
  return strcmp(o->kv_memory, "cuda") == 0         ? MH_DEV_CUDA
         : strcmp(o->kv_memory, "device-sim") == 0 ? MH_DEV_SIM
                                                   : MH_DEV_NONE;
}
