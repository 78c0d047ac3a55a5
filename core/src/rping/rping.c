/* rping: the HccnRping* API. A context per local device holds the responder, the
 * target list and at most one active batch. Contexts live in a registry and callers
 * hold a handle number, never a pointer, so a stale or bogus handle (Deinit twice, a
 * call after Deinit) is HCCN_E_PARA and a freed context is never touched. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "util/log.h"
#include "rping/rping_int.h"
#include "util/sock.h"
#include "util/status_int.h"
#include "util/thread.h"

#define RP_ADD_TIMEOUT_ENV "HIXL_RPING_ADD_TIMEOUT_MS"
#define RP_MAX_NPU         65536
#define RP_MAX_INTERVAL_MS 10000
#define RP_MAX_TIMEOUT_MS  60000
#define RP_MAX_LIST_IN_MSG 4 /* targets named in one error message */

/* ---- results ---- */

const char *HccnResultName(HccnResult result) {
  switch (result) {
#define X(name, value, text)                                                                                 \
  case name: return #name;
    HCCN_RESULT_MAP(X)
#undef X
  default: return "HCCN_UNKNOWN_RESULT";
  }
}

const char *HccnResultString(HccnResult result) {
  switch (result) {
#define X(name, value, text)                                                                                 \
  case name: return text;
    HCCN_RESULT_MAP(X)
#undef X
  default: return "unknown result";
  }
}

#define CHECK_PARA(cond, ...)                                                                                \
  do {                                                                                                       \
    if (!(cond)) return rp_fail(HCCN_E_PARA, __VA_ARGS__);                                                   \
  } while (0)

/* ---- registry ---- */

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t reg_cond = PTHREAD_COND_INITIALIZER; /* a context's refs reached 0 */
static struct rp_ctx *reg_head;
static uintptr_t reg_next_handle;

/* Take a reference on the live, ready context behind h. */
static HccnResult ctx_get(HccnRpingCtx h, const char *fn, struct rp_ctx **out) {
  struct rp_ctx *c = NULL;
  pthread_mutex_lock(&reg_lock);
  for (c = reg_head; c; c = c->next)
    if (c->handle == (uintptr_t)h && c->ready && !c->closing) break;
  if (c) c->refs++;
  pthread_mutex_unlock(&reg_lock);
  if (!c)
    return rp_fail(HCCN_E_PARA, "%s: rpingCtx %p is not a live context (never initialized, or deinitialized)",
                   fn, h);
  *out = c;
  return HCCN_SUCCESS;
}

static void ctx_put(struct rp_ctx *c) {
  pthread_mutex_lock(&reg_lock);
  if (--c->refs == 0 && c->closing) pthread_cond_broadcast(&reg_cond);
  pthread_mutex_unlock(&reg_lock);
}

static void reg_unlink(struct rp_ctx *c) {
  struct rp_ctx **pp;
  for (pp = &reg_head; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      return;
    }
}

/* ---- Init / Deinit ---- */

static HccnResult parse_add_timeout(uint32_t *out) {
  const char *v = getenv(RP_ADD_TIMEOUT_ENV);
  char *end;
  unsigned long ms;
  if (!v || !*v) {
    *out = HCCN_RPING_ADD_TIMEOUT_MS;
    return HCCN_SUCCESS;
  }
  errno = 0;
  ms = strtoul(v, &end, 10);
  CHECK_PARA(*v >= '0' && *v <= '9' && !errno && !*end && ms >= 1 && ms <= HCCN_RPING_ADD_TIMEOUT_MAX,
             "HccnRpingInit: env %s=\"%s\" is not a number of milliseconds in [1,%u]", RP_ADD_TIMEOUT_ENV, v,
             HCCN_RPING_ADD_TIMEOUT_MAX);
  *out = (uint32_t)ms;
  return HCCN_SUCCESS;
}

static bool usable_unicast(struct in_addr a) {
  uint32_t h = ntohl(a.s_addr);
  return h != 0 && h < 0xe0000000u; /* not 0.0.0.0, multicast, reserved or broadcast */
}

/* The device's address: an IPv4 address, or a NIC name resolved with getifaddrs;
 * attr_ip (when set) must agree with it. */
static HccnResult resolve_device(const char *device, const char *attr_ip, struct in_addr *out) {
  const char *fn = "HccnRpingInit";
  bool has_dev = device && *device, has_ip = attr_ip && *attr_ip;
  struct in_addr ip = {0}, a;
  struct ifaddrs *ifs, *i;
  bool nic_seen = false, found = false;

  CHECK_PARA(has_dev || has_ip, "%s: name the device: device (NIC name or IPv4 address) or attr->ipAddr", fn);
  CHECK_PARA(!has_ip || inet_pton(AF_INET, attr_ip, &ip) == 1,
             "%s: attr->ipAddr \"%s\" is not an IPv4 address", fn, attr_ip);
  if (!has_dev || inet_pton(AF_INET, device, &a) == 1) {
    if (has_dev && has_ip && a.s_addr != ip.s_addr)
      return rp_fail(HCCN_E_PARA, "%s: attr->ipAddr %s is not device %s", fn, attr_ip, device);
    if (has_dev) ip = a;
    CHECK_PARA(usable_unicast(ip), "%s: device address %s is not a unicast address", fn,
               has_dev ? device : attr_ip);
    *out = ip;
    return HCCN_SUCCESS;
  }
  if (getifaddrs(&ifs) < 0) return rp_fail(HCCN_E_FAIL, "%s: getifaddrs: %s", fn, strerror(errno));
  for (i = ifs; i && !found; i = i->ifa_next) {
    if (strcmp(i->ifa_name, device) != 0) continue;
    nic_seen = true;
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    a = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr;
    if (!has_ip || a.s_addr == ip.s_addr) {
      found = true;
      ip = a;
    }
  }
  freeifaddrs(ifs);
  if (!found && !nic_seen && if_nametoindex(device) == 0)
    return rp_fail(HCCN_E_PARA, "%s: device \"%s\" is neither an IPv4 address nor a local NIC", fn, device);
  if (!found && has_ip)
    return rp_fail(HCCN_E_PARA, "%s: attr->ipAddr %s is not an address of NIC %s", fn, attr_ip, device);
  if (!found) return rp_fail(HCCN_E_PARA, "%s: NIC %s has no IPv4 address", fn, device);
  *out = ip;
  return HCCN_SUCCESS;
}

static HccnResult check_attr(const HccnRpingInitAttr *attr) {
  const char *fn = "HccnRpingInit";
  CHECK_PARA(attr->mode == HCCN_RPING_MODE_UDP || attr->mode == HCCN_RPING_MODE_ROCE,
             "%s: attr->mode %d is unknown (HCCN_RPING_MODE_ROCE is %d, HCCN_RPING_MODE_UDP %d)", fn,
             (int)attr->mode, (int)HCCN_RPING_MODE_ROCE, (int)HCCN_RPING_MODE_UDP);
  CHECK_PARA(attr->port >= 1 && attr->port <= 65535, "%s: attr->port %u is not in [1,65535]", fn, attr->port);
  CHECK_PARA(attr->npuNum >= 1 && attr->npuNum <= RP_MAX_NPU, "%s: attr->npuNum %u is not in [1,%u]", fn,
             attr->npuNum, RP_MAX_NPU);
  CHECK_PARA(attr->bufferSize > 0 && attr->bufferSize % HCCN_RPING_BUFFER_ALIGN == 0,
             "%s: attr->bufferSize %u is not a positive multiple of %u", fn, attr->bufferSize,
             HCCN_RPING_BUFFER_ALIGN);
  CHECK_PARA(attr->sl <= 7, "%s: attr->sl %u is not in [0,7]", fn, attr->sl);
  CHECK_PARA(attr->tc <= 255, "%s: attr->tc %u is not in [0,255]", fn, attr->tc);
  return HCCN_SUCCESS;
}

HccnResult HccnRpingInit(const char *device, const HccnRpingInitAttr *attr, HccnRpingCtx *rpingCtx) {
  const char *fn = "HccnRpingInit";
  struct rp_ctx *c, *o;
  struct in_addr addr;
  uint32_t add_timeout = 0;
  HccnResult r;
  int rc;

  hixl_log_init();
  CHECK_PARA(attr && rpingCtx, "%s: attr or rpingCtx is NULL", fn);
  if ((r = check_attr(attr)) != HCCN_SUCCESS) return r;
  if ((r = parse_add_timeout(&add_timeout)) != HCCN_SUCCESS) return r;
  if ((r = resolve_device(device, attr->ipAddr, &addr)) != HCCN_SUCCESS) return r;

  c = calloc(1, sizeof(*c));
  if (!c) return rp_fail(HCCN_E_MEM, "%s: out of memory", fn);
  c->addr = addr;
  inet_ntop(AF_INET, &addr, c->addr_str, sizeof(c->addr_str));
  c->port = (uint16_t)attr->port;
  c->npu_num = attr->npuNum;
  c->buffer_size = attr->bufferSize;
  c->sl = attr->sl;
  c->tc = attr->tc;
  c->add_timeout_ms = add_timeout;
  c->roce = attr->mode == HCCN_RPING_MODE_ROCE;
  c->resp_fd = c->close_efd = -1;

  /* Claim the device first, so a second Init on it fails for that reason. */
  pthread_mutex_lock(&reg_lock);
  for (o = reg_head; o; o = o->next)
    if (o->addr.s_addr == addr.s_addr) break;
  if (!o) {
    c->handle = ++reg_next_handle;
    c->next = reg_head;
    reg_head = c;
  }
  pthread_mutex_unlock(&reg_lock);
  if (o) {
    r = rp_fail(HCCN_E_FAIL,
                "%s: device %s already has a context in this process (one HccnRpingInit per device)", fn,
                c->addr_str);
    goto free_ctx;
  }
  if ((rc = pthread_mutex_init(&c->lock, NULL)) != 0) {
    r = rp_fail(HCCN_E_FAIL, "%s: pthread_mutex_init: %s", fn, strerror(rc));
    goto unclaim;
  }
  if ((rc = pthread_mutex_init(&c->run_lock, NULL)) != 0) {
    r = rp_fail(HCCN_E_FAIL, "%s: pthread_mutex_init: %s", fn, strerror(rc));
    goto destroy_lock;
  }
  c->next_batch_id = (uint32_t)(hixl_now_ns() >> 10) | 1u;
  c->close_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (c->close_efd < 0) {
    r = rp_fail(HCCN_E_FAIL, "%s: eventfd: %s", fn, strerror(errno));
    goto destroy_run_lock;
  }
  c->resp_fd = rp_udp_socket(addr, c->port, "HccnRpingInit: responder");
  if (c->resp_fd < 0) {
    r = HCCN_E_FAIL;
    goto close_efd;
  }
  if (c->roce && (r = rp_roce_open(c)) != HCCN_SUCCESS) goto close_resp;
  if ((rc = pthread_create(&c->resp_thread, NULL, rp_responder_main, c)) == 0)
    thread_name(c->resp_thread, "hixl-rping-resp");
  else {
    r = rp_fail(HCCN_E_FAIL, "%s: cannot start the responder thread: %s", fn, strerror(rc));
    goto close_roce;
  }
  pthread_mutex_lock(&reg_lock);
  c->ready = true;
  pthread_mutex_unlock(&reg_lock);
  log_info("rping: context on %s (mode %s), responder on UDP port %u", c->addr_str, c->roce ? "ROCE" : "UDP",
           (unsigned)c->port);
  *rpingCtx = (HccnRpingCtx)c->handle;
  return HCCN_SUCCESS;

close_roce:
  if (c->roce) rp_roce_close(c);
close_resp:
  close(c->resp_fd);
close_efd:
  close(c->close_efd);
destroy_run_lock:
  pthread_mutex_destroy(&c->run_lock);
destroy_lock:
  pthread_mutex_destroy(&c->lock);
unclaim:
  pthread_mutex_lock(&reg_lock);
  reg_unlink(c);
  pthread_mutex_unlock(&reg_lock);
free_ctx:
  free(c);
  return r;
}

HccnResult HccnRpingDeinit(HccnRpingCtx rpingCtx) {
  struct rp_ctx *c = NULL;
  uint64_t one = 1;

  pthread_mutex_lock(&reg_lock);
  for (c = reg_head; c; c = c->next)
    if (c->handle == (uintptr_t)rpingCtx && c->ready && !c->closing) break;
  if (!c) {
    pthread_mutex_unlock(&reg_lock);
    return rp_fail(HCCN_E_PARA, "HccnRpingDeinit: rpingCtx %p is not a live context (already deinitialized?)",
                   rpingCtx);
  }
  c->closing = true;
  /* Wakes the responder and any AddTarget waiting on this context. */
  if (write(c->close_efd, &one, sizeof(one)) < 0)
    log_error("rping %s: cannot signal the responder: %s", c->addr_str, strerror(errno));
  while (c->refs > 0) pthread_cond_wait(&reg_cond, &reg_lock);
  pthread_mutex_unlock(&reg_lock);

  rp_batch_free(c->batch); /* its QP, AHs, CQ and channel */
  pthread_join(c->resp_thread, NULL);
  if (c->roce) rp_roce_close(c); /* the responder's QP and AHs, the MR, CQ, channel, PD, device */
  close(c->resp_fd);
  close(c->close_efd);
  pthread_mutex_destroy(&c->run_lock);
  pthread_mutex_destroy(&c->lock);
  free(c->targets);
  pthread_mutex_lock(&reg_lock);
  reg_unlink(c); /* only now: the device stays claimed until its port is closed */
  pthread_mutex_unlock(&reg_lock);
  log_info("rping: context on %s closed", c->addr_str);
  free(c);
  return HCCN_SUCCESS;
}

/* ---- targets ---- */

static HccnResult parse_dst(const HccnRpingTargetInfo *t, const char *fn, uint32_t i, struct in_addr *dst) {
  CHECK_PARA(t->dstIp && inet_pton(AF_INET, t->dstIp, dst) == 1,
             "%s: target[%u].dstIp \"%s\" is not an IPv4 address", fn, i, t->dstIp ? t->dstIp : "(null)");
  CHECK_PARA(usable_unicast(*dst), "%s: target[%u].dstIp %s is not a unicast address", fn, i, t->dstIp);
  return HCCN_SUCCESS;
}

/* The dstIp of each of target[0..n) into *dst, an array the caller frees. */
static HccnResult parse_dsts(const HccnRpingTargetInfo *target, uint32_t n, const char *fn,
                             struct in_addr **dst) {
  struct in_addr *a = calloc(n, sizeof(*a));
  HccnResult r = HCCN_SUCCESS;
  if (!a) return rp_fail(HCCN_E_MEM, "%s: out of memory", fn);
  for (uint32_t i = 0; i < n && r == HCCN_SUCCESS; i++) r = parse_dst(&target[i], fn, i, &a[i]);
  if (r != HCCN_SUCCESS) {
    free(a);
    return r;
  }
  *dst = a;
  return HCCN_SUCCESS;
}

/* Check target i of an AddTarget call and copy it into out. */
static HccnResult check_target(const struct rp_ctx *c, const HccnRpingTargetInfo *t, uint32_t i,
                               struct rp_target *out) {
  const char *fn = "HccnRpingAddTarget";
  struct in_addr src;
  HccnResult r;

  if ((r = parse_dst(t, fn, i, &out->dst)) != HCCN_SUCCESS) return r;
  if (t->srcIp && *t->srcIp) {
    CHECK_PARA(inet_pton(AF_INET, t->srcIp, &src) == 1, "%s: target[%u].srcIp \"%s\" is not an IPv4 address",
               fn, i, t->srcIp);
    CHECK_PARA(src.s_addr == c->addr.s_addr, "%s: target[%u].srcIp %s is not this context's device %s", fn, i,
               t->srcIp, c->addr_str);
  }
  CHECK_PARA(t->reserved == 0,
             "%s: target[%u].reserved is %u; it must be 0 (EID addresses are not supported)", fn, i,
             t->reserved);
  CHECK_PARA(t->port >= 1 && t->port <= 65535, "%s: target[%u].port %u is not in [1,65535]", fn, i, t->port);
  CHECK_PARA(t->srcPort <= 65535, "%s: target[%u].srcPort %u is not in [0,65535]", fn, i, t->srcPort);
  CHECK_PARA(t->srcPort != c->port, "%s: target[%u].srcPort %u is this context's responder port", fn, i,
             t->srcPort);
  CHECK_PARA(!c->roce || t->srcPort == 0,
             "%s: target[%u].srcPort %u: in mode HCCN_RPING_MODE_ROCE probes leave from the device's RoCE v2 "
             "port and the source port is not chosen; leave it 0",
             fn, i, t->srcPort);
  CHECK_PARA(t->sl <= 7, "%s: target[%u].sl %u is not in [0,7]", fn, i, t->sl);
  CHECK_PARA(t->tc <= 255, "%s: target[%u].tc %u is not in [0,255]", fn, i, t->tc);
  CHECK_PARA(t->payloadLen <= HCCN_RPING_PAYLOAD_LEN_MAX, "%s: target[%u].payloadLen %u is more than %u", fn,
             i, t->payloadLen, HCCN_RPING_PAYLOAD_LEN_MAX);
  CHECK_PARA(!c->roce || t->payloadLen <= rp_roce_max_payload(c),
             "%s: target[%u].payloadLen %u is more than the %u bytes a RoCE probe carries on %s (MTU %u less "
             "the %u-byte header)",
             fn, i, t->payloadLen, c->roce ? rp_roce_max_payload(c) : 0, c->dev.name,
             c->roce ? rdma_mtu_bytes(&c->dev) : 0, RP_HDR_LEN);
  out->port = (uint16_t)t->port;
  out->src_port = (uint16_t)t->srcPort;
  out->tc = (uint8_t)t->tc;
  out->sl = (uint8_t)t->sl;
  out->payload_len = (uint16_t)t->payloadLen;
  memcpy(out->payload, t->payload, t->payloadLen);
  snprintf(out->name, sizeof(out->name), "%s:%u", t->dstIp, t->port);
  return HCCN_SUCCESS;
}

/* Index of the target with dst in c's list (under c->lock), or -1. */
static ptrdiff_t find_target(const struct rp_ctx *c, struct in_addr dst) {
  for (size_t i = 0; i < c->ntargets; i++)
    if (c->targets[i].dst.s_addr == dst.s_addr) return (ptrdiff_t)i;
  return -1;
}

/* AddTarget with a wait of timeout_ms (0: the context's). */
static HccnResult add_targets(HccnRpingCtx h, uint32_t n, const HccnRpingTargetInfo *in, uint32_t timeout_ms,
                              const char *fn) {
  struct rp_target *pend = NULL;
  bool *ok = NULL;
  int *err = NULL;
  size_t npend = 0, nfail = 0, nfull = 0;
  char failed[RP_MAX_LIST_IN_MSG * (RP_NAME_LEN + 80) + 16] = "";
  struct rp_ctx *c = NULL;
  HccnResult r;

  if ((r = ctx_get(h, fn, &c)) != HCCN_SUCCESS) return r;
  if (timeout_ms == 0) timeout_ms = c->add_timeout_ms;
  if (n < 1 || n > HCCN_RPING_MAX_ADD_TARGETS || !in) {
    r = rp_fail(HCCN_E_PARA, "%s: targetNum %u is not in [1,%d] or target is NULL", fn, n,
                HCCN_RPING_MAX_ADD_TARGETS);
    goto put_ctx;
  }
  pend = calloc(n, sizeof(*pend));
  ok = calloc(n, sizeof(*ok));
  err = calloc(n, sizeof(*err));
  if (!pend || !ok || !err) {
    r = rp_fail(HCCN_E_MEM, "%s: out of memory", fn);
    goto free_pend;
  }
  /* Check every target before adding any; keep the first of each dstIp. */
  pthread_mutex_lock(&c->lock);
  for (uint32_t i = 0; i < n; i++) {
    size_t k;
    if ((r = check_target(c, &in[i], i, &pend[npend])) != HCCN_SUCCESS) break;
    for (k = 0; k < npend; k++)
      if (pend[k].dst.s_addr == pend[npend].dst.s_addr) break;
    if (k == npend && find_target(c, pend[npend].dst) < 0) npend++;
  }
  if (r == HCCN_SUCCESS && c->ntargets + npend > c->npu_num)
    r = rp_fail(HCCN_E_PARA, "%s: the context holds %zu targets; %zu more would exceed attr->npuNum %u", fn,
                c->ntargets, npend, c->npu_num);
  pthread_mutex_unlock(&c->lock);
  if (r != HCCN_SUCCESS || npend == 0) goto free_pend;

  /* Without the lock: the handshake may wait for targets that start later. */
  r = rp_handshake(c, pend, npend, hixl_now_ns() + (uint64_t)timeout_ms * 1000000u, ok, err);
  if (r != HCCN_SUCCESS) goto free_pend;

  pthread_mutex_lock(&c->lock);
  for (size_t k = 0; k < npend; k++) {
    if (!ok[k] || find_target(c, pend[k].dst) >= 0) continue; /* failed, or added meanwhile */
    if (c->ntargets == c->npu_num) {
      ok[k] = false; /* a concurrent AddTarget filled the context: it answered all the same */
      err[k] = RP_ADD_FULL;
      continue;
    }
    if (c->ntargets == c->cap) {
      size_t cap = c->cap ? c->cap * 2 : 16;
      struct rp_target *t = realloc(c->targets, cap * sizeof(*t));
      if (!t) {
        r = rp_fail(HCCN_E_MEM, "%s: out of memory adding %s", fn, pend[k].name);
        break;
      }
      c->targets = t;
      c->cap = cap;
    }
    c->targets[c->ntargets++] = pend[k];
  }
  pthread_mutex_unlock(&c->lock);
  if (r != HCCN_SUCCESS) goto free_pend;
  for (size_t k = 0; k < npend; k++) {
    if (ok[k]) continue;
    size_t used = strlen(failed);
    char gid[INET6_ADDRSTRLEN];
    if (err[k] == RP_ADD_FULL) nfull++;
    if (nfail < RP_MAX_LIST_IN_MSG && err[k] == RP_ADD_FULL)
      snprintf(failed + used, sizeof(failed) - used, "%s%s (answered; the context was full)",
               nfail ? ", " : "", pend[k].name);
    else if (nfail < RP_MAX_LIST_IN_MSG && err[k] == RP_HS_BAD_GID)
      snprintf(failed + used, sizeof(failed) - used, "%s%s (its RoCE endpoint names GID %s, not its address)",
               nfail ? ", " : "", pend[k].name, inet_ntop(AF_INET6, pend[k].ep.gid, gid, sizeof(gid)));
    else if (nfail < RP_MAX_LIST_IN_MSG && err[k] == RP_HS_NOT_ROCE)
      snprintf(failed + used, sizeof(failed) - used, "%s%s (answers, but in mode UDP: no RoCE endpoint)",
               nfail ? ", " : "", pend[k].name);
    else if (nfail < RP_MAX_LIST_IN_MSG && err[k] == RP_HS_SMALL_MTU)
      snprintf(failed + used, sizeof(failed) - used, "%s%s (its RoCE MTU %u cannot carry %u payload bytes)",
               nfail ? ", " : "", pend[k].name, pend[k].ep.mtu, (unsigned)pend[k].payload_len);
    else if (nfail < RP_MAX_LIST_IN_MSG)
      snprintf(failed + used, sizeof(failed) - used, "%s%s%s%s%s", nfail ? ", " : "", pend[k].name,
               err[k] ? " (sending: " : "", err[k] ? strerror(err[k]) : "", err[k] ? ")" : "");
    else if (nfail == RP_MAX_LIST_IN_MSG)
      snprintf(failed + used, sizeof(failed) - used, ", ...");
    nfail++;
  }
  if (nfail > 0 && nfull == nfail) /* each answered: the npuNum rule, as if checked before */
    r = rp_fail(HCCN_E_PARA,
                "%s: %zu of %zu targets answered but were not added: %s. A concurrent AddTarget filled the "
                "context to attr->npuNum %u.%s",
                fn, nfull, npend, failed, c->npu_num, nfull < npend ? " The others were added." : "");
  else if (nfail > 0)
    r = rp_fail(
        HCCN_E_FAIL,
        "%s: %zu of %zu targets did not answer%s within %u ms: %s. Has each run HccnRpingInit%s on that "
        "address and port?%s",
        fn, nfail, npend, c->roce ? " as RoCE responders" : "", timeout_ms, failed,
        c->roce ? " in mode HCCN_RPING_MODE_ROCE" : "", nfail < npend ? " The others were added." : "");

free_pend:
  free(err);
  free(ok);
  free(pend);
put_ctx:
  ctx_put(c);
  return r;
}

HccnResult HccnRpingAddTarget(HccnRpingCtx rpingCtx, uint32_t targetNum, HccnRpingTargetInfo *target) {
  return add_targets(rpingCtx, targetNum, target, 0, "HccnRpingAddTarget");
}

HccnResult HccnRpingAddTargetWithCfg(HccnRpingCtx rpingCtx, uint32_t targetNum, HccnRpingTargetInfo *target,
                                     HccnRpingAddTargetConfig *config) {
  const char *fn = "HccnRpingAddTargetWithCfg";
  if (!config) return HccnRpingAddTarget(rpingCtx, targetNum, target);
  CHECK_PARA(config->connectTimeout >= 1 && config->connectTimeout <= HCCN_RPING_ADD_TIMEOUT_MAX,
             "%s: config->connectTimeout %u is not in [1,%u] ms", fn, config->connectTimeout,
             HCCN_RPING_ADD_TIMEOUT_MAX);
  return add_targets(rpingCtx, targetNum, target, config->connectTimeout, fn);
}

HccnResult HccnRpingRemoveTarget(HccnRpingCtx rpingCtx, uint32_t targetNum, HccnRpingTargetInfo *target) {
  const char *fn = "HccnRpingRemoveTarget";
  struct in_addr *dst = NULL;
  struct rp_ctx *c = NULL;
  HccnResult r;

  if ((r = ctx_get(rpingCtx, fn, &c)) != HCCN_SUCCESS) return r;
  if (targetNum < 1 || !target) {
    r = rp_fail(HCCN_E_PARA, "%s: targetNum is 0 or target is NULL", fn);
    goto put_ctx;
  }
  if ((r = parse_dsts(target, targetNum, fn, &dst)) != HCCN_SUCCESS) goto put_ctx;

  pthread_mutex_lock(&c->lock);
  if (c->batch)
    r = rp_fail(HCCN_E_FAIL, "%s: a batch is active; call HccnRpingBatchPingStop first", fn);
  else if (c->ntargets == 0)
    r = rp_fail(HCCN_E_FAIL, "%s: no targets are added (none yet, or every one removed)", fn);
  for (uint32_t i = 0; i < targetNum && r == HCCN_SUCCESS; i++)
    if (find_target(c, dst[i]) < 0)
      r = rp_fail(HCCN_E_PARA,
                  "%s: target[%u].dstIp %s was never added (or is removed already); nothing removed", fn, i,
                  target[i].dstIp);
  for (uint32_t i = 0; i < targetNum && r == HCCN_SUCCESS; i++) {
    ptrdiff_t k = find_target(c, dst[i]); /* -1 for a repeat in the list */
    if (k < 0) continue;
    memmove(&c->targets[k], &c->targets[k + 1], (c->ntargets - (size_t)k - 1) * sizeof(c->targets[0]));
    c->ntargets--;
  }
  pthread_mutex_unlock(&c->lock);
  free(dst);
put_ctx:
  ctx_put(c);
  return r;
}

/* ---- batches ---- */

HccnResult HccnRpingBatchPingStart(HccnRpingCtx rpingCtx, uint32_t pktNum, uint32_t interval,
                                   uint32_t timeout) {
  const char *fn = "HccnRpingBatchPingStart";
  struct rp_batch *b = NULL;
  struct rp_ctx *c = NULL;
  uint64_t need;
  HccnResult r;

  if ((r = ctx_get(rpingCtx, fn, &c)) != HCCN_SUCCESS) return r;
  if (pktNum < 1 || interval > RP_MAX_INTERVAL_MS || timeout < 1 || timeout > RP_MAX_TIMEOUT_MS) {
    r = rp_fail(HCCN_E_PARA, "%s: pktNum %u must be >= 1, interval %u in [0,%u] ms, timeout %u in [1,%u] ms",
                fn, pktNum, interval, RP_MAX_INTERVAL_MS, timeout, RP_MAX_TIMEOUT_MS);
    goto put_ctx;
  }
  pthread_mutex_lock(&c->run_lock); /* a Stop that is still tearing down its batch finishes first */
  pthread_mutex_lock(&c->lock);
  if (c->batch) {
    r = rp_fail(HCCN_E_FAIL, "%s: a batch is active already; call HccnRpingBatchPingStop first", fn);
    goto unlock;
  }
  if (c->ntargets == 0) {
    r = rp_fail(HCCN_E_FAIL, "%s: no targets; call HccnRpingAddTarget first", fn);
    goto unlock;
  }
  need = (uint64_t)pktNum * HCCN_RPING_BUFFER_PER_PACKET * c->ntargets;
  if (c->buffer_size <= need) {
    r = rp_fail(
        HCCN_E_PARA,
        "%s: attr->bufferSize %u must be larger than pktNum %u x %u x %zu targets = %llu; raise bufferSize "
        "at HccnRpingInit or send fewer packets",
        fn, c->buffer_size, pktNum, HCCN_RPING_BUFFER_PER_PACKET, c->ntargets, (unsigned long long)need);
    goto unlock;
  }
  b = calloc(1, sizeof(*b));
  if (!b) goto no_mem;
  b->ctx = c;
  b->stop_efd = -1;
  b->id = c->next_batch_id++;
  b->pkt_num = pktNum;
  b->interval_ms = interval;
  b->timeout_ms = timeout;
  b->n = c->ntargets;
  b->t = malloc(b->n * sizeof(*b->t));
  b->tally = calloc(b->n, sizeof(*b->tally));
  b->sent_ns = calloc(b->n * pktNum, sizeof(*b->sent_ns));
  b->sock_of = calloc(b->n, sizeof(*b->sock_of));
  b->socks = calloc(b->n, sizeof(*b->socks));
  if (!b->t || !b->tally || !b->sent_ns || !b->sock_of || !b->socks) goto no_mem;
  memcpy(b->t, c->targets, b->n * sizeof(*b->t));
  if ((r = rp_batch_run(b)) != HCCN_SUCCESS) goto free_batch;
  c->batch = b;
  pthread_mutex_unlock(&c->lock);
  pthread_mutex_unlock(&c->run_lock);
  ctx_put(c);
  return HCCN_SUCCESS;

no_mem:
  r = rp_fail(HCCN_E_MEM, "%s: out of memory for %zu targets x %u packets", fn, c->ntargets, pktNum);
free_batch:
  rp_batch_release(b);
unlock:
  pthread_mutex_unlock(&c->lock);
  pthread_mutex_unlock(&c->run_lock);
put_ctx:
  ctx_put(c);
  return r;
}

HccnResult HccnRpingBatchPingStop(HccnRpingCtx rpingCtx) {
  const char *fn = "HccnRpingBatchPingStop";
  struct rp_batch *b;
  struct rp_ctx *c = NULL;
  HccnResult r;

  if ((r = ctx_get(rpingCtx, fn, &c)) != HCCN_SUCCESS) return r;
  pthread_mutex_lock(&c->run_lock);
  pthread_mutex_lock(&c->lock);
  b = c->batch;
  c->batch = NULL;
  pthread_mutex_unlock(&c->lock);
  if (b)
    rp_batch_free(b); /* without the lock: the prober takes it to finish */
  else
    r = rp_fail(HCCN_E_FAIL, "%s: no batch is active", fn);
  pthread_mutex_unlock(&c->run_lock);
  ctx_put(c);
  return r;
}

static uint32_t ns_to_us(uint64_t ns) {
  uint64_t us = (ns + 500) / 1000;
  return us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

HccnResult HccnRpingGetResult(HccnRpingCtx rpingCtx, uint32_t targetNum, HccnRpingTargetInfo *target,
                              HccnRpingResultInfo *result) {
  const char *fn = "HccnRpingGetResult";
  struct in_addr *dst = NULL;
  struct rp_batch *b;
  struct rp_ctx *c = NULL;
  HccnResult r;

  if ((r = ctx_get(rpingCtx, fn, &c)) != HCCN_SUCCESS) return r;
  if (targetNum < 1 || !target || !result) {
    r = rp_fail(HCCN_E_PARA, "%s: targetNum is 0, or target or result is NULL", fn);
    goto put_ctx;
  }
  if ((r = parse_dsts(target, targetNum, fn, &dst)) != HCCN_SUCCESS) goto put_ctx;

  pthread_mutex_lock(&c->lock);
  b = c->batch;
  if (!b) {
    r = rp_fail(HCCN_E_FAIL, "%s: no batch is active; call HccnRpingBatchPingStart first", fn);
  } else if (!b->done) {
    r = HCCN_E_AGAIN; /* not a failure: the last error message is left alone */
  } else {
    for (uint32_t i = 0; i < targetNum; i++) {
      HccnRpingResultInfo *o = &result[i];
      size_t k;
      memset(o, 0, sizeof(*o));
      o->state = HCCN_RPING_RESULT_STATE_NOT_FOUND;
      if (find_target(c, dst[i]) < 0) continue;
      o->state = HCCN_RPING_RESULT_STATE_INVALID;
      for (k = 0; k < b->n; k++)
        if (b->t[k].dst.s_addr == dst[i].s_addr) break;
      if (k == b->n) continue; /* added after the batch started */
      const struct rp_tally *t = &b->tally[k];
      o->txPkt = t->tx;
      o->rxPkt = t->rx;
      if (t->rx > 0) {
        o->minRTT = ns_to_us(t->rtt_min);
        o->maxRTT = ns_to_us(t->rtt_max);
        o->avgRTT = ns_to_us(t->rtt_sum / t->rx);
      }
      if (t->tx > 0) o->state = HCCN_RPING_RESULT_STATE_VALID;
    }
  }
  pthread_mutex_unlock(&c->lock);
  free(dst);
put_ctx:
  ctx_put(c);
  return r;
}

HccnResult rp_debug_qos(HccnRpingCtx h, const char *dst_ip, struct rp_qos_seen *out) {
  const char *fn = "rp_debug_qos";
  struct in_addr dst;
  struct rp_ctx *c = NULL;
  HccnResult r;

  if ((r = ctx_get(h, fn, &c)) != HCCN_SUCCESS) return r;
  if (!dst_ip || inet_pton(AF_INET, dst_ip, &dst) != 1) {
    ctx_put(c);
    return rp_fail(HCCN_E_PARA, "%s: \"%s\" is not an IPv4 address", fn, dst_ip ? dst_ip : "(null)");
  }
  pthread_mutex_lock(&c->lock);
  r = HCCN_E_PARA;
  if (c->batch && !c->batch->done) r = HCCN_E_AGAIN;
  for (size_t k = 0; r == HCCN_E_PARA && c->batch && k < c->batch->n; k++) {
    const struct rp_tally *t = &c->batch->tally[k];
    if (c->batch->t[k].dst.s_addr != dst.s_addr) continue;
    *out = (struct rp_qos_seen){.roce = c->roce,
                                .set_tc = t->set_tc,
                                .set_sl = t->set_sl,
                                .echo_tc = t->echo_tc,
                                .here_tc = t->here_tc,
                                .rx = t->rx,
                                .echo_bad = t->echo_bad,
                                .here_bad = t->here_bad};
    r = HCCN_SUCCESS;
  }
  pthread_mutex_unlock(&c->lock);
  ctx_put(c);
  if (r == HCCN_E_PARA) rp_fail(r, "%s: %s is not in an active batch", fn, dst_ip);
  return r;
}
