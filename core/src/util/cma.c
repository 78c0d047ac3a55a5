/* cma: process_vm_readv / process_vm_writev with batched iovecs; see cma.h. */
#include "util/cma.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define CMA_CALL_MAX ((size_t)1 << 30) /* bytes per call: well under the kernel's MAX_RW_COUNT */

static int hex_val(int ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

int cma_self_get(struct cma_self *self) {
  char text[64];
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t k = read(fd, text, sizeof(text) - 1);
  int saved = errno;
  close(fd);
  if (k <= 0) {
    errno = k < 0 ? saved : EINVAL;
    return -1;
  }
  text[k] = '\0';
  /* A UUID: 32 hex digits with dashes between groups. */
  size_t nib = 0;
  for (const char *p = text; *p && *p != '\n'; p++) {
    if (*p == '-') continue;
    int v = hex_val((unsigned char)*p);
    if (v < 0 || nib >= 2 * CMA_BOOT_ID_LEN) {
      errno = EINVAL;
      return -1;
    }
    if (nib % 2 == 0)
      self->boot_id[nib / 2] = (uint8_t)(v << 4);
    else
      self->boot_id[nib / 2] |= (uint8_t)v;
    nib++;
  }
  if (nib != 2 * CMA_BOOT_ID_LEN) {
    errno = EINVAL;
    return -1;
  }
  self->pid = (uint32_t)getpid();
  self->uid = (uint32_t)geteuid();
  return 0;
}

bool cma_range_rw(uint64_t addr, uint64_t len, char *why, size_t cap) {
  FILE *f = fopen("/proc/self/maps", "re");
  if (!f) return true;
  char line[512];
  uint64_t at = addr, end = addr + len; /* at: the first byte not yet found in a mapping */
  while (at < end && fgets(line, sizeof(line), f)) {
    unsigned long lo, hi;
    char perms[8];
    bool whole = strchr(line, '\n') != NULL;
    int ok = sscanf(line, "%lx-%lx %7s", &lo, &hi, perms);
    while (!whole && fgets(line, sizeof(line), f)) whole = strchr(line, '\n') != NULL; /* a long path */
    if (ok != 3 || hi <= at) continue; /* the lines come in address order */
    if (lo > at) break;                /* a hole at at */
    if (perms[0] != 'r' || perms[1] != 'w') {
      snprintf(why, cap, "0x%llx is mapped %s, not readable and writable: peers read and write it",
               (unsigned long long)at, perms);
      fclose(f);
      return false;
    }
    at = hi;
  }
  fclose(f);
  if (at >= end) return true;
  snprintf(why, cap, "0x%llx is not mapped in this process", (unsigned long long)at);
  return false;
}

int cma_pidfd_open(uint32_t pid) {
#ifdef SYS_pidfd_open
  return (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

bool cma_pid_exited(int pidfd) {
  struct pollfd p = {.fd = pidfd, .events = POLLIN};
  return pidfd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
}

/* Append [p, p + len) to v (count *n), merged into the last entry when adjacent.
 * Returns false, changing nothing, when a new entry is needed and v is full. */
static bool iov_add(struct iovec *v, size_t *n, uint8_t *p, size_t len) {
  if (*n > 0 && (uint8_t *)v[*n - 1].iov_base + v[*n - 1].iov_len == p) {
    v[*n - 1].iov_len += len;
    return true;
  }
  if (*n == CMA_IOV_MAX) return false;
  v[*n].iov_base = p;
  v[*n].iov_len = len;
  (*n)++;
  return true;
}

size_t cma_copy(uint32_t pid, bool write, const struct cma_seg *segs, size_t n, int *err) {
  struct iovec liov[CMA_IOV_MAX], riov[CMA_IOV_MAX];
  size_t i = 0, off = 0, done = 0; /* position: segment i, off bytes into it */
  *err = 0;
  while (i < n) {
    size_t nl = 0, nr = 0, bytes = 0;
    /* One call: as many ranges as fit, from the current position on. */
    for (size_t j = i, o = off; j < n && bytes < CMA_CALL_MAX; j++, o = 0) {
      size_t len = segs[j].len - o;
      if (len > CMA_CALL_MAX - bytes) len = CMA_CALL_MAX - bytes;
      size_t nl0 = nl;
      if (!iov_add(liov, &nl, segs[j].local + o, len)) break;
      if (!iov_add(riov, &nr, (uint8_t *)(uintptr_t)(segs[j].remote + o), len)) {
        if (nl > nl0)
          nl = nl0; /* undo the new local entry */
        else
          liov[nl - 1].iov_len -= len; /* undo the merge */
        break;
      }
      bytes += len;
    }
    ssize_t k = write ? process_vm_writev((pid_t)pid, liov, nl, riov, nr, 0)
                      : process_vm_readv((pid_t)pid, liov, nl, riov, nr, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      *err = k < 0 ? errno : EFAULT;
      return done;
    }
    done += (size_t)k;
    /* Advance over what the kernel copied; a short call resumes mid-range. */
    for (size_t left = (size_t)k; left > 0;) {
      size_t rem = segs[i].len - off;
      if (left < rem) {
        off += left;
        break;
      }
      left -= rem;
      i++;
      off = 0;
    }
  }
  return done;
}

void cma_explain(int err, uint32_t peer_pid, uint32_t peer_uid, char *buf, size_t len) {
  uint32_t uid = (uint32_t)geteuid();
  char scope[16] = "";
  int fd = open("/proc/sys/kernel/yama/ptrace_scope", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t k = read(fd, scope, sizeof(scope) - 1);
    scope[k > 0 ? k : 0] = '\0';
    scope[strcspn(scope, "\n")] = '\0';
    close(fd);
  }
  if (err == EPERM || err == EACCES) {
    if (peer_uid != uid)
      snprintf(buf, len,
               "the kernel refuses process_vm_readv of pid %u (%s): it runs as uid %u and this process "
               "as uid %u; copying between users needs CAP_SYS_PTRACE",
               peer_pid, strerror(err), peer_uid, uid);
    else if (scope[0] && strcmp(scope, "0") != 0)
      snprintf(buf, len,
               "the kernel refuses process_vm_readv of pid %u (%s): Yama ptrace_scope is %s and this "
               "process is not its ancestor; write 0 to /proc/sys/kernel/yama/ptrace_scope, have the "
               "target call prctl(PR_SET_PTRACER, this pid or PR_SET_PTRACER_ANY), or give this process "
               "CAP_SYS_PTRACE",
               peer_pid, strerror(err), scope);
    else
      snprintf(buf, len,
               "the kernel refuses process_vm_readv of pid %u (%s): same uid %u, so the target is not "
               "dumpable (prctl PR_SET_DUMPABLE 0, or it changed credentials); CAP_SYS_PTRACE lifts it",
               peer_pid, strerror(err), uid);
    return;
  }
  if (err == ESRCH) {
    snprintf(buf, len, "pid %u is not visible from here (another PID namespace) or has exited", peer_pid);
    return;
  }
  snprintf(buf, len, "process_vm_readv of pid %u failed: %s", peer_pid, strerror(err));
}
