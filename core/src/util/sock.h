/* sock: address parsing and TCP socket helpers for the control plane. */
#ifndef HIXL_SOCK_H
#define HIXL_SOCK_H
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "hixl/hixl_status.h"

/* Parse "ip" or "ip:port" (IPv4 dotted quad, port 0-65535; a port of 0 or below, down
 * to INT32_MIN, is none: *has_port false, as with no port). */
HixlStatus sock_parse_endpoint(const char *text, const char *what, struct sockaddr_in *sa, bool *has_port);
/* A non-blocking listening socket on sa; returns fd or -1 with the error recorded. */
int sock_listen(const struct sockaddr_in *sa, int backlog, HixlStatus *st);
/* Connect within deadline_ns (CLOCK_MONOTONIC), retrying while nothing listens.
 * Returns a blocking, TCP_NODELAY fd, or -1 with *st TIMEOUT or FAILED. */
int sock_connect(const struct sockaddr_in *sa, uint64_t deadline_ns, HixlStatus *st);
/* ... from a local address (port 0: any), or from anywhere when from is NULL. */
int sock_connect_from(const struct sockaddr_in *sa, const struct sockaddr_in *from, uint64_t deadline_ns,
                      HixlStatus *st);
/* Send or receive exactly n bytes on a blocking fd before deadline_ns. */
HixlStatus sock_send_all(int fd, const void *buf, size_t n, uint64_t deadline_ns);
HixlStatus sock_recv_all(int fd, void *buf, size_t n, uint64_t deadline_ns);
void sock_tune(int fd); /* TCP_NODELAY, keepalive */
/* The largest send and receive buffer a socket may ask for: the smaller of
 * net.core.wmem_max and rmem_max, in bytes; 0 when they cannot be read. */
size_t sock_buf_cap(void);
/* Fix fd's send and receive buffers at bytes each (0: leave them to the kernel's
 * autotuning). The kernel caps them at sock_buf_cap(). */
void sock_set_buffers(int fd, size_t bytes);
/* A rail's socket (after sock_tune): data unacknowledged for stall_ms closes it
 * (TCP_USER_TIMEOUT), and keepalive probes an idle one after about stall_ms. */
void sock_tune_rail(int fd, uint32_t stall_ms);
/* Whether segments sent on fd have gone unacknowledged for stall_ms (the path, not
 * the peer, is gone: a peer that is merely slow still has its kernel acknowledge). */
bool sock_path_dead(int fd, uint32_t stall_ms, uint32_t *unacked);
int sock_set_nonblock(int fd, bool on);
/* The IPv4 addresses (network order) of the interfaces that are up, at most cap into
 * out: loopback ones only when loopback is true, others only when it is false (Rails
 * auto). Their count, or -1 with errno when getifaddrs fails. */
int sock_if_addrs(uint32_t *out, size_t cap, bool loopback);

/* sendmsg; under ThreadSanitizer the payload's reads are recorded and the
 * connection released *before* the bytes can reach the peer (TSan's own sendmsg
 * records them after the call, when the peer may have acted on them already). */
struct msghdr;
ssize_t sock_sendmsg(int fd, const struct msghdr *mh, int flags);
/* ThreadSanitizer cannot see that bytes received on a TCP connection were sent
 * before: tell it (a send releases the connection, a receive acquires it). Nothing
 * in a build without TSan. */
void sock_hb_sent(int fd);
void sock_hb_received(int fd);
/* A message from another process by another way (a test's pipe) may follow from
 * anything this process sent on any connection. */
void sock_hb_received_any(void);
/* ... and a message this process sends by another way may lead to anything a peer
 * then sends it on any connection. */
void sock_hb_sent_any(void);

uint64_t hixl_now_ns(void); /* CLOCK_MONOTONIC */
uint64_t hixl_deadline_ns(int32_t timeout_ms);

#endif
