/* api_call: notifications and service calls (hixl_engine_transfer_then_call is in api_xfer.c). */
#include <stdlib.h>
#include <string.h>

#include "engine/api_int.h"
#include "util/sock.h"
#include "util/status_int.h"

/* ---- notifications ---- */

HixlStatus HixlEngineSendNotify(HixlEngine *e, const char *remote, const HixlNotifyDesc *n,
                                int32_t timeout_ms) {
  struct sockaddr_in sa;
  HixlStatus st;
  if ((st = api_check_remote(remote, "HixlEngineSendNotify", &sa)) != HIXL_SUCCESS) return st;
  CHECK_ARG(n && n->name && n->msg, "HixlEngineSendNotify: notify, name or msg is NULL");
  size_t nl = strnlen(n->name, HIXL_MAX_NOTIFY_LEN + 1), ml = strnlen(n->msg, HIXL_MAX_NOTIFY_LEN + 1);
  CHECK_ARG(nl <= HIXL_MAX_NOTIFY_LEN && ml <= HIXL_MAX_NOTIFY_LEN,
            "HixlEngineSendNotify: name and msg are limited to %d bytes each", HIXL_MAX_NOTIFY_LEN);
  if ((st = api_check_timeout(timeout_ms, "HixlEngineSendNotify")) != HIXL_SUCCESS) return st;
  size_t cap = WIRE_HDR_LEN + 12 + nl + ml;
  uint8_t *frame = malloc(cap);
  if (!frame) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineSendNotify: out of memory");
  if ((st = api_enter(e, "HixlEngineSendNotify")) != HIXL_SUCCESS) {
    free(frame);
    return st;
  }
  struct conn *c = api_link_for(e, remote, "HixlEngineSendNotify", &st);
  struct hixl_transfer_req *r = c ? api_req_new(e, 1, hixl_deadline_ns(timeout_ms)) : NULL;
  if (!r) {
    if (c) st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineSendNotify: out of memory");
    free(frame);
    pthread_mutex_unlock(&e->lock);
    return st;
  }
  struct chunk *ch = r->chunks;
  struct wire_wr w;
  ch->req = r;
  ch->kind = CHUNK_NOTIFY;
  ch->seq = c->next_seq++;
  wire_begin(&w, frame, cap, WIRE_NOTIFY);
  wire_put_u64(&w, ch->seq);
  wire_put_u16(&w, (uint16_t)nl);
  wire_put_u16(&w, (uint16_t)ml);
  wire_put_bytes(&w, n->name, nl);
  wire_put_bytes(&w, n->msg, ml);
  ch->tx.heap = frame;
  ch->tx.heap_len = wire_end(&w, 0);
  ch->tx.chunk = ch;
  link_enqueue(c, &ch->tx);
  link_flush(c);
  st = api_req_wait(e, c, r, "HixlEngineSendNotify", remote);
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus HixlEngineGetNotifies(HixlEngine *e, HixlNotifyDesc **notifies, size_t *count) {
  CHECK_ARG(notifies && count, "HixlEngineGetNotifies: notifies or count output is NULL");
  HixlStatus st = api_enter(e, "HixlEngineGetNotifies");
  if (st != HIXL_SUCCESS) return st;
  size_t n = e->n_notifies, bytes = n * sizeof(HixlNotifyDesc);
  for (size_t i = 0; i < n; i++)
    bytes += strlen(e->notifies[i].name) + strlen(e->notifies[i].msg) + strlen(e->notifies[i].remote) + 3;
  HixlNotifyDesc *out = NULL;
  if (n > 0 && !(out = malloc(bytes))) {
    pthread_mutex_unlock(&e->lock);
    return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineGetNotifies: out of memory");
  }
  char *s = out ? (char *)(out + n) : NULL; /* no notifies: out is NULL, and NULL + 0 is undefined */
  for (size_t i = 0; i < n; i++) {
    char *const parts[3] = {e->notifies[i].name, e->notifies[i].msg, e->notifies[i].remote};
    const char **dst[3] = {&out[i].name, &out[i].msg, &out[i].remote_engine};
    for (int k = 0; k < 3; k++) {
      size_t l = strlen(parts[k]) + 1;
      memcpy(s, parts[k], l);
      *dst[k] = s;
      s += l;
      free(parts[k]);
    }
  }
  e->n_notifies = 0;
  e->notify_gen += n > 0; /* every link's undrained count is 0 again */
  pthread_mutex_unlock(&e->lock);
  *notifies = out;
  *count = n;
  return HIXL_SUCCESS;
}

void HixlEngineFreeNotifies(HixlNotifyDesc *notifies) { free(notifies); }

/* ---- services (engine_ext.h) ---- */

HixlStatus hixl_engine_set_service(HixlEngine *e, uint16_t service, hixl_call_fn fn, void *ctx) {
  CHECK_ARG(service > 0 && service < ENGINE_SERVICES, "hixl_engine_set_service: service %u is not in [1, %d)",
            (unsigned)service, ENGINE_SERVICES);
  HixlStatus st = HIXL_SUCCESS;
  if (!fn && e) { /* taking a handler away works on a finalized engine too: its owner is going */
    if ((st = api_not_serving(e, "hixl_engine_set_service")) != HIXL_SUCCESS) return st;
    engine_lock_caller(e);
  } else if ((st = api_enter(e, "hixl_engine_set_service")) != HIXL_SUCCESS) {
    return st;
  }
  struct engine_service *s = &e->services[service];
  if (fn && s->fn)
    st = hixl_fail(HIXL_PARAM_INVALID, "hixl_engine_set_service: service %u of %s already has a handler",
                   (unsigned)service, e->local_name);
  else
    *s = (struct engine_service){fn, fn ? ctx : NULL};
  pthread_mutex_unlock(&e->lock);
  return st;
}

/* Start a CALL on remote's link: the frame leaves now; *out is the request, held for
 * the caller. Lock held on return when *out is set, released otherwise. */
static HixlStatus call_send(HixlEngine *e, const char *remote, uint16_t service, const void *req, size_t len,
                            void *resp, size_t cap, uint32_t *resp_len, int32_t timeout_ms, const char *fn,
                            struct conn **cout, struct hixl_transfer_req **out) {
  struct sockaddr_in sa;
  HixlStatus st;
  *out = NULL;
  if ((st = api_check_remote(remote, fn, &sa)) != HIXL_SUCCESS) return st;
  CHECK_ARG((req || len == 0) && len <= HIXL_CALL_MAX && resp && cap > 0 && resp_len,
            "%s: request (%zu bytes, at most %u), answer buffer or length output is invalid", fn, len,
            HIXL_CALL_MAX);
  if ((st = api_check_timeout(timeout_ms, fn)) != HIXL_SUCCESS) return st;
  uint8_t *frame = malloc(WIRE_CALL_REQ_AT + len);
  if (!frame) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  if ((st = api_enter(e, fn)) != HIXL_SUCCESS) {
    free(frame);
    return st;
  }
  struct conn *c = api_link_for(e, remote, fn, &st);
  struct hixl_transfer_req *r = NULL;
  if (c && !(c->peer->caps & WIRE_CAP_CALL))
    st = hixl_fail(HIXL_UNSUPPORTED, "%s: %s speaks an older protocol without service calls", fn, remote);
  else if (c && !(r = api_req_new(e, 1, hixl_deadline_ns(timeout_ms))))
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  if (!r) {
    free(frame);
    pthread_mutex_unlock(&e->lock);
    return st;
  }
  struct chunk *ch = r->chunks;
  ch->req = r;
  ch->kind = CHUNK_CALL;
  ch->seq = c->next_seq++;
  ch->laddr = resp;
  ch->len = cap > HIXL_CALL_MAX ? HIXL_CALL_MAX : (uint32_t)cap;
  ch->call_len = resp_len;
  if (len) memcpy(frame + WIRE_CALL_REQ_AT, req, len);
  ch->tx.heap = frame;
  ch->tx.heap_len = wire_put_call(frame, WIRE_CALL, ch->seq, service, (uint32_t)len);
  ch->tx.chunk = ch;
  link_enqueue(c, &ch->tx);
  link_flush(c);
  *cout = c;
  *out = r;
  return HIXL_SUCCESS;
}

HixlStatus hixl_engine_call(HixlEngine *e, const char *remote, uint16_t service, const void *req, size_t len,
                            void *resp, size_t cap, size_t *resp_len, int32_t timeout_ms) {
  const char *fn = "hixl_engine_call";
  uint32_t got = 0;
  struct conn *c;
  struct hixl_transfer_req *r;
  HixlStatus st =
      call_send(e, remote, service, req, len, resp, cap, resp_len ? &got : NULL, timeout_ms, fn, &c, &r);
  if (!r) return st;
  st = api_req_wait(e, c, r, fn, remote);
  pthread_mutex_unlock(&e->lock);
  if (st == HIXL_SUCCESS) *resp_len = got;
  return st;
}

HixlStatus hixl_engine_call_start(HixlEngine *e, const char *remote, uint16_t service, const void *req,
                                  size_t len, void *resp, size_t cap, uint32_t *resp_len, int32_t timeout_ms,
                                  hixl_call_t *call) {
  const char *fn = "hixl_engine_call_start";
  CHECK_ARG(call, "%s: call output is NULL", fn);
  struct conn *c;
  struct hixl_transfer_req *r;
  HixlStatus st = call_send(e, remote, service, req, len, resp, cap, resp_len, timeout_ms, fn, &c, &r);
  if (!r) return st;
  link_unpark(c); /* nobody drives the link for it: the progress thread reads the answer */
  pthread_mutex_unlock(&e->lock);
  *call = r;
  return HIXL_SUCCESS;
}

HixlStatus hixl_engine_call_wait(HixlEngine *e, const char *remote, hixl_call_t call) {
  const char *fn = "hixl_engine_call_wait";
  CHECK_ARG(e && call && remote, "%s: engine, call or remote is NULL", fn);
  HixlStatus st = api_not_serving(e, fn);
  if (st != HIXL_SUCCESS) return st;
  pthread_mutex_lock(&e->lock); /* not api_enter: a call started is waited for even while finalizing */
  struct peer *p = api_find_peer(e, remote);
  struct conn *c = p ? p->conn : NULL; /* NULL: the link died, and ended the call */
  st = api_req_wait(e, c, call, fn, remote);
  pthread_mutex_unlock(&e->lock);
  return st;
}
