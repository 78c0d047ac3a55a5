/* hixl-mock-host: the router's loop. It starts the prefill and the decode instance
 * (each its own process), sends each request to prefill, takes the kv_transfer_params
 * request_finished returned and sends the request with them to decode (push mode: to
 * decode first, then decode's push params to prefill), as vLLM's disaggregated proxy
 * does; it injects the faults that are the router's to make, and reaps the instances. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mh.h"

static void req_end(struct mh_router *rt, uint32_t i, uint8_t outcome, uint64_t t_held, uint64_t bytes,
                    const char *why, size_t why_len) {
  struct mh_rreq *r = &rt->r[i];
  if (r->state == MH_R_DONE) return;
  if (r->state != MH_R_NEW) rt->inflight--;
  r->state = MH_R_DONE;
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

static void fail_where(struct mh_router *rt, int state, const char *why) {
  for (uint32_t i = 0; i < rt->o->requests; i++)
    if (rt->r[i].state == state) req_end(rt, i, MH_FAILED, 0, 0, why, strlen(why));
}

static void side_gone(struct mh_router *rt, int k) {
  struct mh_child *s = &rt->side[k];
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
  fail_where(rt, k == 0 ? MH_R_PREFILL : MH_R_DECODE, msg);
  /* Push: decode reports what prefill left unwritten (its lease); if decode died, no one will. */
  if (k == 1) fail_where(rt, MH_R_ALLOC, msg), fail_where(rt, MH_R_PUSH, msg);
  snprintf(msg, sizeof(msg), "not served: %s", why);
  fail_where(rt, MH_R_NEW, msg);
}

/* link-cut: at the Nth hand-off prefill stops answering (SIGSTOP: no FIN, no RST, as a
 * partition looks to its peer) until every transfer in flight has ended. It is stopped
 * before decode is told to load (pull) or prefill to push (push): a stop sent after could
 * land only once the transfer had ended, the router preempted between the two (seen in
 * push mode under TSan: every request verified, the fault acted on nothing). The router
 * waits until the stop has taken effect. */
static void cut_maybe(struct mh_router *rt) {
  struct mh_child *s = &rt->side[0];
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
static void reset_maybe(struct mh_router *rt) {
  struct mh_child *s = &rt->side[0];
  if (rt->o->fault != MH_FAULT_LINK_RESET || ++rt->handed_off != rt->o->fault_at || s->dead) return;
  rt->nreset = shut_tcp_connections(s->pid);
  fprintf(stderr,
          "%shixl-mock-host: fault link-reset: shut down %u TCP connection(s) of prefill (pid %d) at "
          "hand-off %u\n",
          rt->o->progress && isatty(2) ? "\r\033[K" : "", rt->nreset, (int)s->pid, rt->handed_off);
  rt->healed = true;
}

static void cut_heal(struct mh_router *rt) {
  for (uint32_t i = 0; i < rt->o->requests; i++)
    if (rt->r[i].state == MH_R_DECODE || rt->r[i].state == MH_R_ALLOC || rt->r[i].state == MH_R_PUSH) return;
  fprintf(stderr, "%shixl-mock-host: fault link-cut: every transfer in flight has ended; prefill resumed\n",
          rt->o->progress && isatty(2) ? "\r\033[K" : "");
  kill(rt->side[0].pid, SIGCONT);
  rt->cut = false;
  rt->healed = true;
}

static void handle(struct mh_router *rt, int k, uint8_t type, struct mh_in *in) {
  struct mh_child *s = &rt->side[k];
  uint32_t idx = 0;
  size_t n = 0;
  const char *str;
  if (type == MH_READY) {
    mh_get_u32(in);
    if (mh_in_done(in)) s->ready = true;
    return;
  }
  if (type == MH_TRACE || type == MH_METRICS) {
    if (mh_obs_frame(rt, k, type, in) < 0) goto bad;
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
      fail_where(rt, MH_R_NEW, "not served: an instance did not start");
      return;
    }
    if (idx >= rt->o->requests) return;
    /* Push: decode holds blocks for it and ends it (failed or recomputed) when nothing comes. */
    if (rt->r[idx].state == MH_R_PUSH && !rt->side[1].dead)
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
    struct mh_rreq *r = &rt->r[idx];
    if (rt->push) { /* computed and on its way (or landed already): decode reports it */
      r->t_saved = t_saved;
      return;
    }
    if (r->state != MH_R_PREFILL) return;
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
    r->state = MH_R_DECODE;
    cut_maybe(rt);
    reset_maybe(rt);
    mh_send(rt->side[1].conn.fd, MH_LOAD, &o);
    return;
  }
  if (type == MH_PUSHPARAMS && k == 1) {
    idx = mh_get_u32(in);
    str = mh_get_str(in, &n);
    if (!mh_in_done(in) || idx >= rt->o->requests) goto bad;
    struct mh_rreq *r = &rt->r[idx];
    if (r->state != MH_R_ALLOC) return;
    if (rt->side[0].dead) return; /* decode fails it when its lease ends */
    struct mh_out o = {0};
    mh_put_u32(&o, idx);
    mh_put_u64(&o, r->seed);
    mh_put_u64(&o, r->prompt);
    mh_put_str(&o, str, n); /* where to write: decode's blocks */
    r->state = MH_R_PUSH;
    reset_maybe(rt);
    cut_maybe(rt); /* before: it reads the request once resumed */
    mh_send(rt->side[0].conn.fd, MH_REQ, &o);
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

/* Move the calling process into the network namespace ip netns calls name; 0 or -1 (said). */
static int enter_netns(const char *name) {
  char path[256];
  snprintf(path, sizeof(path), "/run/netns/%s", name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) {
    fprintf(stderr, "hixl-mock-host: entering network namespace %s (%s): %m\n", name, path);
    if (fd >= 0) close(fd);
    return -1;
  }
  close(fd);
  return 0;
}

static int start_instance(struct mh_router *rt, int k, const hixl_kv_ops *ops, const char *config,
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
    const struct mh_opts *o = rt->o;
    if (o->netns[k] && enter_netns(o->netns[k]) < 0) exit(1); /* before any engine or socket */
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
                             .dev = mh_opts_dev(o),
                             .metrics = o->metrics_port != 0,
                             .verbose = o->verbose,
                             .tp = o->tp[k],
                             .queue_ms = o->queue_ms};
    exit(mh_instance_main(&a)); /* exit, not _exit: a sanitizer build checks the instance for leaks */
  }
  close(sv[1]);
  fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
  rt->side[k].pid = pid;
  mh_conn_init(&rt->side[k].conn, sv[0]);
  return 0;
}

/* Send new requests while fewer than --concurrency are in flight: to prefill, or in
 * push mode to decode first. */
static void dispatch(struct mh_router *rt) {
  const struct mh_opts *o = rt->o;
  while (rt->inflight < o->concurrency && rt->next < o->requests) {
    struct mh_rreq *r = &rt->r[rt->next];
    struct mh_out f = {0};
    mh_put_u32(&f, rt->next);
    mh_put_u64(&f, r->seed);
    mh_put_u64(&f, r->prompt);
    rt->inflight++;
    rt->next++;
    r->after_cut = rt->healed;
    rt->nafter_cut += rt->healed;
    if (rt->push) { /* decode allocates first; the mark says its KV comes from a prefill */
      static const char mark[] = "{\"do_remote_prefill\": true}";
      mh_put_str(&f, mark, sizeof(mark) - 1);
      r->state = MH_R_ALLOC;
      mh_send(rt->side[1].conn.fd, MH_LOAD, &f);
    } else {
      mh_put_str(&f, "", 0);
      r->state = MH_R_PREFILL;
      mh_send(rt->side[0].conn.fd, MH_REQ, &f);
    }
  }
}

/* --fault intruder: its process starts once both instances are up. */
static void intruder_start(struct mh_router *rt) {
  int stop[2], report[2];
  if (pipe2(stop, O_CLOEXEC) < 0) return;
  if (pipe2(report, O_CLOEXEC) < 0) {
    close(stop[0]);
    close(stop[1]);
    return;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(stop[1]);
    close(report[0]);
    for (int k = 0; k < 2; k++) close(rt->side[k].conn.fd);
    _exit(mh_intruder_main(rt->addr, stop[0], report[1]));
  }
  close(stop[0]);
  close(report[1]);
  if (pid < 0) {
    fprintf(stderr, "hixl-mock-host: fork: %m\n");
    close(stop[1]);
    close(report[0]);
    return;
  }
  rt->intruder = pid;
  rt->intruder_stop = stop[1];
  rt->intruder_report = report[0];
}

/* Whether the run may end: no intruder, or it made its minimum of attempts. */
static bool intruder_done(struct mh_router *rt) {
  char r;
  struct pollfd p = {rt->intruder_report, POLLIN, 0};
  if (!rt->intruder || rt->intruder_ready) return true;
  if (poll(&p, 1, 0) == 1) rt->intruder_ready = read(rt->intruder_report, &r, 1) == 1 && r == 'R';
  if (p.revents & (POLLHUP | POLLERR) && !rt->intruder_ready) rt->intruder_ready = true; /* it died */
  return rt->intruder_ready;
}

/* ... and stops when the run ends: its figures, then its exit. */
static void intruder_stop(struct mh_router *rt) {
  if (!rt->intruder) return;
  close(rt->intruder_stop);
  struct pollfd p = {rt->intruder_report, POLLIN, 0};
  if (poll(&p, 1, 10000) == 1 &&
      read(rt->intruder_report, &rt->intrusion, sizeof(rt->intrusion)) == (ssize_t)sizeof(rt->intrusion))
    rt->intruder_in = true;
  close(rt->intruder_report);
  if (!rt->intruder_in) kill(rt->intruder, SIGKILL);
  waitpid(rt->intruder, NULL, 0);
  rt->intruder = 0;
}

int mh_run(struct mh_router *rt, const hixl_kv_ops *const ops[2], const char *cfg_p, const char *cfg_d,
           const struct mh_model *md, uint32_t drain_ms) {
  const struct mh_opts *o = rt->o;
  rt->t_start = mh_now_ns();
  if (start_instance(rt, 0, ops[0], cfg_p, &o->model, drain_ms) < 0) return -1;
  if (start_instance(rt, 1, ops[1], cfg_d, md, drain_ms) < 0 || mh_obs_serve(rt) < 0) {
    for (int k = 0; k < 2; k++)
      if (rt->side[k].pid > 0) {
        kill(rt->side[k].pid, SIGKILL);
        waitpid(rt->side[k].pid, NULL, 0);
      }
    return -1;
  }
  uint64_t deadline = rt->t_start + (uint64_t)o->timeout_s * 1000000000ull, last_bar = 0;
  bool started = false;
  for (;;) {
    if (rt->cut) cut_heal(rt);
    bool up = rt->side[0].ready && rt->side[1].ready && !rt->side[0].dead && !rt->side[1].dead &&
              !rt->fatal && !rt->cut;
    if (up && !started) {
      started = true;
      rt->t_start = mh_now_ns(); /* the figures count from the first request */
      if (o->fault == MH_FAULT_INTRUDER) intruder_start(rt);
    }
    if (up) dispatch(rt);
    if ((rt->ndone == o->requests && intruder_done(rt)) || rt->fatal) {
      intruder_stop(rt); /* before the instances go: it attacks live engines only */
      for (int k = 0; k < 2; k++)
        if (!rt->side[k].dead && !rt->side[k].exit_sent) {
          struct mh_out f = {0};
          mh_send(rt->side[k].conn.fd, MH_EXIT, &f);
          rt->side[k].exit_sent = true;
        }
    }
    if ((rt->side[0].dead || rt->side[0].stats_in) && (rt->side[1].dead || rt->side[1].stats_in)) break;
    if (mh_now_ns() >= deadline) {
      rt->timed_out = true;
      if (rt->cut) kill(rt->side[0].pid, SIGCONT);
      break;
    }
    struct pollfd pfd[2];
    for (int k = 0; k < 2; k++)
      pfd[k] = (struct pollfd){rt->side[k].dead ? -1 : rt->side[k].conn.fd, POLLIN, 0};
    poll(pfd, 2, 50);
    for (int k = 0; k < 2; k++) {
      struct mh_child *s = &rt->side[k];
      if (s->dead || !(pfd[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      mh_conn_fill(&s->conn);
      uint8_t type;
      struct mh_in in;
      int got;
      while ((got = mh_conn_next(&s->conn, &type, &in)) > 0) handle(rt, k, type, &in);
      if (got < 0) kill(s->pid, SIGKILL);
      if (s->conn.eof || got < 0) side_gone(rt, k);
    }
    if (mh_now_ns() - last_bar > 100000000ull) {
      mh_progress(rt, false);
      last_bar = mh_now_ns();
    }
  }
  intruder_stop(rt);
  mh_progress(rt, true);
  if (rt->timed_out) {
    fprintf(
        stderr,
        "hixl-mock-host: timed out after %u s with %u of %u requests unfinished; stopping the instances\n",
        o->timeout_s, o->requests - rt->ndone, o->requests);
  }
  return 0;
}

void mh_reap(struct mh_router *rt) {
  for (int k = 0; k < 2; k++) {
    struct mh_child *s = &rt->side[k];
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
  if (!rt->t_end) rt->t_end = mh_now_ns();
  /* An instance that reported must also exit cleanly (a sanitizer's finding shows here). */
  rt->exits_clean = true;
  for (int k = 0; k < 2; k++) {
    const struct mh_child *s = &rt->side[k];
    if (s->stats_in && !(WIFEXITED(s->wstatus) && WEXITSTATUS(s->wstatus) == 0)) {
      fprintf(stderr, "hixl-mock-host: the %s instance (pid %d) reported, then %s %d\n", s->name, (int)s->pid,
              WIFSIGNALED(s->wstatus) ? "was killed by signal" : "exited with status",
              WIFSIGNALED(s->wstatus) ? WTERMSIG(s->wstatus) : WEXITSTATUS(s->wstatus));
      rt->exits_clean = false;
    }
  }
}
