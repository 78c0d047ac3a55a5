/* uds: unix domain sockets in the abstract namespace, between a target engine and an
 * initiator on the same host: the kernel's word on who is at the other end
 * (SO_PEERCRED), the binding of the socket to a link, and memfd descriptors
 * (SCM_RIGHTS). */
#ifndef HIXL_UDS_H
#define HIXL_UDS_H

#include <stddef.h>
#include <stdint.h>

#define UDS_NAME_MAX 100 /* bytes of a name, without the abstract namespace's leading NUL */

/* A listening SOCK_SEQPACKET socket (non-blocking, close-on-exec) under a new random
 * name "hixl-<pid>-<16 hex digits>", written to name (NUL-terminated, cap >= 40);
 * -1 with errno. */
int uds_listen(char *name, size_t cap);

/* Connect to name (len bytes, no NUL); blocking, close-on-exec, waiting at most
 * timeout_ms (> 0) for room in the listener's backlog. -1 with errno. */
int uds_connect(const char *name, size_t len, int timeout_ms);

/* Send one message of len bytes without a descriptor, without blocking; 0, or -1
 * with errno. */
int uds_send(int sock, const void *data, size_t len);

/* Receive one message of exactly len bytes without a descriptor (any that came is
 * closed), waiting at most timeout_ms (0: only what is there now). 0, or -1 with
 * errno (ETIMEDOUT: none yet; ECONNRESET: the peer closed its end; EPROTO: another
 * length, or a descriptor). */
int uds_recv(int sock, void *data, size_t len, int timeout_ms);

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
