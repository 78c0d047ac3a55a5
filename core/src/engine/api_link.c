/* api_link: links to peers: Connect and its HELLO handshake, Disconnect, a link's lookup, info and drop. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/api_int.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/status_int.h"

/* ---- links ---- */

/* Connect's dial, handshake and attach, the engine's lock released (api_out: Finalize
 * waits for it, and cuts d's socket). Returns without the lock. */
static HixlStatus connect_out(HixlEngine *e, const char *remote, const struct sockaddr_in *sa,
                              uint64_t deadline, struct api_dial *d) {
  HixlStatus st;
  struct peer *old;
  struct peer *p = calloc(1, sizeof(*p));
  if (!p) return hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineConnect: out of memory");
  snprintf(p->name, sizeof(p->name), "%s", remote);
  int fd = sock_connect(sa, deadline, &st);
  if (fd < 0) goto free_peer;
  if ((st = api_enter(e, "HixlEngineConnect")) != HIXL_SUCCESS) { /* finalized while it dialled */
    close(fd);
    goto free_peer;
  }
  d->fd = fd;
  pthread_mutex_unlock(&e->lock);
  sock_set_buffers(fd, (size_t)e->opts.sockbuf_kib << 10);
  const struct xport_ops *xp = NULL;
  void *link = NULL;
  st = api_handshake(e, fd, remote, deadline, p, false, &xp, &link);
  if (st != HIXL_SUCCESS) goto close_fd;

  if ((st = api_enter(e, "HixlEngineConnect")) != HIXL_SUCCESS) goto close_fd;
  old = api_find_peer(e, remote);
  if (old && old->conn) {
    pthread_mutex_unlock(&e->lock);
    st = hixl_fail(HIXL_ALREADY_CONNECTED, "HixlEngineConnect: already connected to %s", remote);
    goto close_fd;
  }
  if (old) api_peer_free(e, old); /* a link that broke earlier: replaced */
  struct conn *c = link_conn_new(e, fd, CONN_INITIATOR);
  if (c) c->rx = RX_PARKED; /* nothing is owed yet; a hang-up still wakes the thread */
  if (!c || link_conn_watch(c) < 0) {
    pthread_mutex_unlock(&e->lock);
    if (c) {
      free(c->rxbuf);
      free(c);
    }
    st = hixl_fail(HIXL_RESOURCE_EXHAUSTED, "HixlEngineConnect: cannot set up the link to %s", remote);
    goto close_fd;
  }
  xp->link.attach(c, link); /* c->xp: xp */
  xp = NULL;
  auth_frames_move(&c->proof, &p->proof); /* the link counts its frames on from the handshake's */
  snprintf(c->remote_name, sizeof(c->remote_name), "%s", p->remote_name[0] ? p->remote_name : remote);
  c->peer = p;
  p->conn = c;
  p->next = e->peers;
  p->id = ++e->peer_ids;
  e->peers = p;
  log_info("connected to %s (%zu remote registrations%s)", remote, p->rtab.count,
           p->n_rails > 1 ? ", rails follow" : "");
  api_rails_up(e, p, c, deadline);
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
close_fd:
  if (xp) xp->link.discard(link);
  close(fd);
free_peer:
  api_peer_release(p);
  return st;
}

HixlStatus HixlEngineConnect(HixlEngine *e, const char *remote, int32_t timeout_ms) {
  struct sockaddr_in sa;
  HixlStatus st;
  if ((st = api_check_remote(remote, "HixlEngineConnect", &sa)) != HIXL_SUCCESS) return st;
  if ((st = api_check_timeout(timeout_ms, "HixlEngineConnect")) != HIXL_SUCCESS) return st;
  uint64_t deadline = hixl_deadline_ns(timeout_ms);
  if ((st = api_enter(e, "HixlEngineConnect")) != HIXL_SUCCESS) return st;
  struct peer *old = api_find_peer(e, remote);
  if (old && old->conn && link_alive(old->conn)) {
    pthread_mutex_unlock(&e->lock);
    return hixl_fail(HIXL_ALREADY_CONNECTED, "HixlEngineConnect: already connected to %s", remote);
  }
  struct api_dial d = {-1, e->dials};
  e->dials = &d;
  api_out(e);
  pthread_mutex_unlock(&e->lock);
  st = connect_out(e, remote, &sa, deadline, &d);
  pthread_mutex_lock(&e->lock);
  struct api_dial **at = &e->dials;
  while (*at != &d) at = &(*at)->next;
  *at = d.next;
  api_back(e);
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus HixlEngineDisconnect(HixlEngine *e, const char *remote, int32_t timeout_ms) {
  struct sockaddr_in sa;
  HixlStatus st;
  if ((st = api_check_remote(remote, "HixlEngineDisconnect", &sa)) != HIXL_SUCCESS) return st;
  if ((st = api_check_timeout(timeout_ms, "HixlEngineDisconnect")) != HIXL_SUCCESS) return st;
  if ((st = api_enter(e, "HixlEngineDisconnect")) != HIXL_SUCCESS) return st;
  struct peer *p = api_find_peer(e, remote);
  if (!p) {
    st = hixl_fail(HIXL_NOT_CONNECTED, "HixlEngineDisconnect: not connected to %s", remote);
  } else {
    p->closing = true; /* no rail takes over */
    if (p->conn) link_conn_kill(p->conn, HIXL_FAILED, "disconnected by the local engine");
    api_peer_free(e, p);
  }
  pthread_mutex_unlock(&e->lock);
  return st;
}

/* The live link to remote, or NULL with the reason recorded. Lock held. */
struct conn *api_link_for(HixlEngine *e, const char *remote, const char *fn, HixlStatus *st) {
  struct peer *p = api_find_peer(e, remote);
  if (!p && strnlen(remote, ENGINE_NAME_MAX) >= ENGINE_NAME_MAX) { /* said before it is printed */
    *st = hixl_fail(HIXL_PARAM_INVALID, "%s: remote_engine is too long", fn);
    return NULL;
  }
  if (!p) {
    *st = hixl_fail(HIXL_NOT_CONNECTED, "%s: not connected to %s; call HixlEngineConnect first", fn, remote);
    return NULL;
  }
  if (!p->conn) {
    *st = hixl_fail(HIXL_NOT_CONNECTED, "%s: the link to %s was lost (%s); call HixlEngineConnect again", fn,
                    remote, p->broken_why);
    return NULL;
  }
  return p->conn;
}

/* ---- for the HixlCS* layer (engine_ext.h) ---- */

HixlStatus hixl_engine_poll_stats(HixlEngine *e, struct hixl_poll_stats *out) {
  if (!out) return hixl_fail(HIXL_PARAM_INVALID, "hixl_engine_poll_stats: out is NULL");
  HixlStatus st = api_enter(e, "hixl_engine_poll_stats");
  if (st != HIXL_SUCCESS) return st;
  *out = e->pstats;
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}

HixlStatus hixl_engine_window_stats(HixlEngine *e, struct hixl_window_stats *out) {
  if (!out) return hixl_fail(HIXL_PARAM_INVALID, "hixl_engine_window_stats: out is NULL");
  HixlStatus st = api_enter(e, "hixl_engine_window_stats");
  if (st != HIXL_SUCCESS) return st;
  *out = e->wstats;
  pthread_mutex_unlock(&e->lock);
  return HIXL_SUCCESS;
}

HixlStatus hixl_engine_link_info(HixlEngine *e, const char *remote, struct hixl_link_info *info) {
  CHECK_ARG(info, "hixl_engine_link_info: info is NULL");
  HixlStatus st = api_check_remote(remote, "hixl_engine_link_info", &(struct sockaddr_in){0});
  if (st != HIXL_SUCCESS) return st;
  st = api_enter(e, "hixl_engine_link_info");
  if (st != HIXL_SUCCESS) return st;
  struct conn *c = api_link_for(e, remote, "hixl_engine_link_info", &st);
  if (c) {
    memset(info, 0, sizeof(*info));
    snprintf(info->transport, sizeof(info->transport), "%s", c->xp->name);
    info->tag_calls = c->tag_calls;
    st = c->xp->link.info(c, info);
  }
  pthread_mutex_unlock(&e->lock);
  return st;
}

HixlStatus hixl_engine_drop_peer(HixlEngine *e, const char *remote_name, const char *why, size_t *dropped) {
  CHECK_ARG(remote_name && *remote_name, "hixl_engine_drop_peer: remote_name is NULL or empty");
  HixlStatus st = api_enter(e, "hixl_engine_drop_peer");
  if (st != HIXL_SUCCESS) return st;
  uint64_t deadline = hixl_now_ns() + (uint64_t)HIXL_DEFAULT_TIMEOUT_MS * 1000000u;
  for (int k = 0; k < XPORT_MODS; k++) /* the peer lets go of mapped memory first */
    e->mods[k]->mem.peer_drop(e, remote_name, deadline);
  size_t n = 0;
  uint32_t walk = ++e->walks;
  for (struct conn *c; (c = link_next(e, walk));) {
    bool his = strcmp(c->remote_name, remote_name) == 0 ||
               (c->peer && strcmp(c->peer->remote_name, remote_name) == 0);
    if (c->dead || !his) continue;
    link_conn_kill(c, HIXL_FAILED, why ? why : "dropped by this engine's user");
    n++;
  }
  pthread_mutex_unlock(&e->lock);
  if (dropped) *dropped = n;
  return HIXL_SUCCESS;
}
