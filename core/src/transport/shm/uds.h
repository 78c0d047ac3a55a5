/* uds: unix domain sockets in the abstract namespace, for handing memfd descriptors
 * from a target engine to an initiator on the same host (SCM_RIGHTS), with the
 * kernel's word on who is at the other end (SO_PEERCRED). */
#ifndef HIXL_UDS_H
#define HIXL_UDS_H

#include <stddef.h>
#include <stdint.h>

#define UDS_NAME_MAX 100 /* bytes of a name, without the abstract namespace's leading NUL */

/* A listening SOCK_SEQPACKET socket (non-blocking, close-on-exec) under a new random
 * name "hixl-<pid>-<16 hex digits>", written to name (NUL-terminated, cap >= 40);
 * -1 with errno. */
int uds_listen(char *name, size_t cap);

/* Connect to name (len bytes, no NUL); blocking, close-on-exec. -1 with errno. */
int uds_connect(const char *name, size_t len);

/* Send len bytes with descriptor fd attached, without blocking; 0, or -1 with errno. */
int uds_send_fd(int sock, const void *data, size_t len, int fd);

/* Receive one message of exactly len bytes and the one descriptor with it (close-on-
 * exec), waiting at most timeout_ms (0: only what is there now). 0, or -1 with errno
 * (EPROTO: the message had another length or no descriptor or more than one). */
int uds_recv_fd(int sock, void *data, size_t len, int *fd, int timeout_ms);

/* The pid and effective uid of the process at the other end of sock, as the kernel
 * recorded them at connect(2). 0, or -1 with errno. */
int uds_peer(int sock, uint32_t *pid, uint32_t *uid);

#endif
