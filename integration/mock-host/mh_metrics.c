/* mh_metrics: the router's /metrics (libmicrohttpd, its own thread, 127.0.0.1 only).
 * Each instance sends its worker's render_metrics text every 250 ms and once more as
 * it exits (mh_obs_tick); a scrape merges the latest of both (their samples differ by
 * the role label), so one target shows the whole hand-off. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mh.h"

struct mh_metrics {
  struct MHD_Daemon *d;
  pthread_mutex_t lock; /* texts */
  char *text[2];
};

/* A family: its name (from "# HELP name" or "# TYPE name"), its header and sample lines. */
struct fam {
  char name[128];
  char *head, *body;
  size_t nhead, nbody;
  size_t src; /* the text its header came from (+ 1; 0: none yet) */
};

static void append(char **dst, size_t *len, const char *s, size_t n) {
  char *p = realloc(*dst, *len + n + 1);
  if (!p) return;
  memcpy(p + *len, s, n);
  *len += n;
  p[*len] = '\0';
  *dst = p;
}

/* The metric name a line belongs to: a comment's third word, a sample's name with a
 * histogram's _bucket / _sum / _count suffix only when the family has none (the
 * families carry their names from their headers). */
static struct fam *fam_of(struct fam **v, size_t *n, const char *name, size_t len) {
  for (size_t i = 0; i < *n; i++)
    if (strlen((*v)[i].name) == len && strncmp((*v)[i].name, name, len) == 0) return &(*v)[i];
  struct fam *w = realloc(*v, (*n + 1) * sizeof(**v));
  if (!w) return NULL;
  *v = w;
  struct fam *f = &w[(*n)++];
  memset(f, 0, sizeof(*f));
  snprintf(f->name, sizeof(f->name), "%.*s", (int)(len < sizeof(f->name) ? len : sizeof(f->name) - 1), name);
  return f;
}

char *mh_metrics_merge(const char *const *texts, size_t n) {
  struct fam *v = NULL;
  size_t nf = 0;
  for (size_t t = 0; t < n; t++) {
    struct fam *cur = NULL;
    for (const char *s = texts[t]; s && *s;) {
      const char *nl = strchr(s, '\n');
      size_t len = nl ? (size_t)(nl - s) + 1 : strlen(s);
      if (strncmp(s, "# HELP ", 7) == 0 || strncmp(s, "# TYPE ", 7) == 0) {
        const char *name = s + 7;
        size_t nlen = strcspn(name, " \n");
        cur = fam_of(&v, &nf, name, nlen);
        if (cur && !cur->src) cur->src = t + 1; /* the header once: the first text's that has it */
        if (cur && cur->src == t + 1) append(&cur->head, &cur->nhead, s, len);
      } else if (*s != '#' && *s != '\n' && cur) {
        append(&cur->body, &cur->nbody, s, len);
      }
      s += len;
    }
  }
  char *out = NULL;
  size_t len = 0;
  append(&out, &len, "", 0);
  for (size_t i = 0; i < nf; i++) {
    if (v[i].head) append(&out, &len, v[i].head, v[i].nhead);
    if (v[i].body) append(&out, &len, v[i].body, v[i].nbody);
    free(v[i].head);
    free(v[i].body);
  }
  free(v);
  return out;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_len, void **state) {
  (void)version;
  (void)upload;
  (void)upload_len;
  (void)state;
  struct mh_metrics *m = cls;
  struct MHD_Response *r;
  enum MHD_Result ret;
  unsigned code = MHD_HTTP_OK;
  if (strcmp(method, "GET") != 0 || strcmp(url, "/metrics") != 0) {
    static const char msg[] = "only GET /metrics\n";
    code = strcmp(method, "GET") != 0 ? MHD_HTTP_METHOD_NOT_ALLOWED : MHD_HTTP_NOT_FOUND;
    r = MHD_create_response_from_buffer(sizeof(msg) - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
  } else {
    pthread_mutex_lock(&m->lock);
    const char *t[2] = {m->text[0], m->text[1]};
    char *body = mh_metrics_merge(t, 2);
    pthread_mutex_unlock(&m->lock);
    if (!body) return MHD_NO;
    r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (r)
      MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    else
      free(body);
  }
  if (!r) return MHD_NO;
  ret = MHD_queue_response(conn, code, r);
  MHD_destroy_response(r);
  return ret;
}

struct mh_metrics *mh_metrics_start(uint16_t port, char *err, size_t cap) {
  struct mh_metrics *m = calloc(1, sizeof(*m));
  if (!m) {
    snprintf(err, cap, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&m->lock, NULL);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  m->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, port, NULL, NULL, answer, m, MHD_OPTION_SOCK_ADDR,
                          (struct sockaddr *)&sa, MHD_OPTION_END);
  if (!m->d) {
    snprintf(err, cap, "libmicrohttpd could not listen on 127.0.0.1:%u (in use?)", port);
    pthread_mutex_destroy(&m->lock);
    free(m);
    return NULL;
  }
  return m;
}

void mh_metrics_set(struct mh_metrics *m, int k, const char *text, size_t len) {
  char *p = malloc(len + 1);
  if (!p) return;
  memcpy(p, text, len);
  p[len] = '\0';
  pthread_mutex_lock(&m->lock);
  free(m->text[k]);
  m->text[k] = p;
  pthread_mutex_unlock(&m->lock);
}

void mh_metrics_stop(struct mh_metrics *m) {
  MHD_stop_daemon(m->d);
  free(m->text[0]);
  free(m->text[1]);
  pthread_mutex_destroy(&m->lock);
  free(m);
}
