/* cma: cross-memory attach between two processes on one host (process_vm_readv /
 * process_vm_writev), and the identity that tells two engines they share a host.
 * The kernel decides who may copy: the same user and a dumpable target, or
 * CAP_SYS_PTRACE, and Yama's ptrace_scope on top. */
#ifndef HIXL_UTIL_CMA_H
#define HIXL_UTIL_CMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CMA_BOOT_ID_LEN 16   /* /proc/sys/kernel/random/boot_id as 16 bytes */
#define CMA_NONCE_LEN   16   /* probe bytes a target shows an initiator */
#define CMA_IOV_MAX     1024 /* iovecs per call on each side (UIO_MAXIOV) */

/* Who this process is: the boot it runs in, its pid and its effective uid. */
struct cma_self {
  uint8_t boot_id[CMA_BOOT_ID_LEN];
  uint32_t pid;
  uint32_t uid;
};

/* One range to copy: len bytes between local memory and remote in the peer. */
struct cma_seg {
  uint8_t *local;
  uint64_t remote;
  size_t len;
};

/* Fill *self; -1 with errno when the boot id cannot be read or parsed. */
int cma_self_get(struct cma_self *self);

/* Whether [addr, addr + len) lies whole in mappings of this process that are readable
 * and writable (/proc/self/maps), as one-sided peers will read and write it; false with
 * the first byte that is not, and why, in why. True when /proc/self/maps cannot be read
 * (the check is then not made). */
bool cma_range_rw(uint64_t addr, uint64_t len, char *why, size_t cap);

/* A pidfd for pid (pidfd_open), or -1 with errno (ENOSYS on kernels before 5.3). */
int cma_pidfd_open(uint32_t pid);

/* Whether the process behind pidfd has exited; false when pidfd is -1. */
bool cma_pid_exited(int pidfd);

/* Copy segs[0..n) in order, to pid's memory (write) or from it, with as few calls as
 * the iovec limit allows: adjacent ranges on each side become one iovec, and a call
 * the kernel ends early is resumed where it stopped. Returns the bytes copied from
 * the start of the list; when that is short of the total, *err holds the errno of
 * the range it stopped in (EFAULT when the kernel copied nothing and said nothing). */
size_t cma_copy(uint32_t pid, bool write, const struct cma_seg *segs, size_t n, int *err);

/* Why the kernel refuses process_vm_* between these two processes, and what lifts
 * it, in one sentence for a log line or an error message (err is the errno). */
void cma_explain(int err, uint32_t peer_pid, uint32_t peer_uid, char *buf, size_t len);

#endif
