/* The sample program of HIXL's CS API reference (seed 000), written in C against hixl:
 * a server process registers memory and listens; a client process registers its own,
 * connects, finds the server buffer by tag, puts blocks of varying size with
 * BatchPutAsync, polls until COMPLETED, reads them back with BatchGetAsync and checks
 * every byte. The two processes signal each other over a pipe ("TCP signalling" in
 * the seed). Usage: hixl-cs-sample [PORT]   (default: a free port on 127.0.0.1) */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <hixl/hixl.h>
#include "bench_util.h"
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SIZE (16u << 20)

#define CHECK(call)                                                                                          \
  do {                                                                                                       \
    HixlStatus st_ = (call);                                                                                 \
    if (st_ != HIXL_SUCCESS) {                                                                               \
      fprintf(stderr, "%s: %s: %s\n", #call, HixlStatusName(st_), HixlGetLastErrorMessage());                \
      exit(1);                                                                                               \
    }                                                                                                        \
  } while (0)

/* A port on 127.0.0.1 held until this program exits: its socket stays bound (with
 * SO_REUSEADDR, never listening), so no other program takes the port before the
 * server (SO_REUSEADDR too) listens there. */
static uint16_t free_port(void) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(sa);
  int one = 1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
      bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || getsockname(fd, (struct sockaddr *)&sa, &len))
    exit(1);
  return ntohs(sa.sin_port);
}

/* Wait for one byte from fd, at most ms milliseconds. */
static int wait_byte(int fd, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  char b;
  return poll(&p, 1, ms) == 1 && read(fd, &b, 1) == 1 ? b : -1;
}

static int server(uint16_t port, int ready_fd, int done_fd) {
  EndpointDesc endpoint = {HIXL_EP_PROTOCOL_TCP, "127.0.0.1", NULL};
  HixlServerDesc sdesc = {"127.0.0.1", port, &endpoint, 1};
  HixlServerHandle server = NULL;
  CHECK(HixlCSServerCreate(&sdesc, NULL, &server));
  void *server_buf = calloc(1, SIZE);
  HcommMem server_mem = {.type = HCCL_MEM_TYPE_HOST, .addr = server_buf, .size = SIZE};
  MemHandle server_mem_h = NULL;
  CHECK(HixlCSServerRegMem(server, "server_mem", &server_mem, &server_mem_h));
  CHECK(HixlCSServerListen(server, 1024));
  if (write(ready_fd, "r", 1) != 1) return 1;
  /* Wait for the client to finish its transfers (it says so on the pipe). */
  if (wait_byte(done_fd, 60000) != 'd') return 1;
  CHECK(HixlCSServerUnregMem(server, server_mem_h));
  CHECK(HixlCSServerDestroy(server));
  free(server_buf);
  return 0;
}

static int client(uint16_t port) {
  EndpointDesc local_ep = {HIXL_EP_PROTOCOL_TCP, "127.0.0.1", NULL};
  EndpointDesc remote_ep = {HIXL_EP_PROTOCOL_TCP, "127.0.0.1", NULL};
  HixlClientDesc cdesc = {"127.0.0.1", port, &local_ep, &remote_ep};
  HixlClientHandle client = NULL;
  CHECK(HixlCSClientCreate(&cdesc, NULL, &client));
  unsigned char *client_buf = malloc(2 * SIZE);
  HcommMem client_mem = {.type = HCCL_MEM_TYPE_HOST, .addr = client_buf, .size = 2 * SIZE};
  MemHandle client_mem_h = NULL;
  CHECK(HixlCSClientRegMem(client, "client_mem", &client_mem, &client_mem_h));
  CHECK(HixlCSClientConnect(client, 5000));

  HcommMem *remote_list = NULL;
  char **tags = NULL;
  uint32_t num = 0;
  CHECK(HixlCSClientGetRemoteMem(client, &remote_list, &tags, &num, 2000));
  unsigned char *remote = NULL;
  for (uint32_t i = 0; i < num; i++)
    if (strcmp(tags[i], "server_mem") == 0 && remote_list[i].size >= SIZE) remote = remote_list[i].addr;
  if (!remote) {
    fprintf(stderr, "server_mem not among the %u remote memories\n", num);
    return 1;
  }

  /* Blocks of varying size, packed one after another. */
  static const uint64_t sizes[] = {1, 4096, 65536 + 3, 1 << 20, 3 << 20, 7};
  HixlOneSideOpDesc ops[64];
  uint32_t n = 0;
  uint64_t off = 0;
  for (uint32_t k = 0; off + sizes[k % 6] <= SIZE && n < 64; k++) {
    ops[n++] = (HixlOneSideOpDesc){remote + off, client_buf + off, sizes[k % 6]};
    off += sizes[k % 6];
  }
  srand(1);
  for (uint64_t i = 0; i < off; i++) client_buf[i] = (unsigned char)rand();

  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CompleteHandle ch;
  HixlCompleteStatus st;
  CHECK(HixlCSClientBatchPutAsync(client, n, ops, &ch));
  do {
    CHECK(HixlCSClientQueryCompleteStatus(client, ch, &st));
  } while (st == HIXL_COMPLETE_STATUS_WAITING);
  if (st != HIXL_COMPLETE_STATUS_COMPLETED) {
    fprintf(stderr, "put ended with status %d: %s\n", (int)st, HixlGetLastErrorMessage());
    return 1;
  }
  for (uint32_t i = 0; i < n; i++) ops[i].local_buf = (unsigned char *)ops[i].local_buf + SIZE;
  CHECK(HixlCSClientBatchGetAsync(client, n, ops, &ch));
  do {
    CHECK(HixlCSClientQueryCompleteStatus(client, ch, &st));
  } while (st == HIXL_COMPLETE_STATUS_WAITING);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (st != HIXL_COMPLETE_STATUS_COMPLETED) {
    fprintf(stderr, "get ended with status %d: %s\n", (int)st, HixlGetLastErrorMessage());
    return 1;
  }
  if (memcmp(client_buf, client_buf + SIZE, off) != 0) {
    fprintf(stderr, "data read back differs from data put\n");
    return 1;
  }
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("hixl-cs-sample: put and got back %u blocks (%llu bytes, 1 B to 3 MiB) in %.1f ms: verified\n", n,
         (unsigned long long)off, s * 1e3);
  CHECK(HixlCSClientUnregMem(client, client_mem_h));
  CHECK(HixlCSClientDestroy(client));
  free(client_buf);
  return 0;
}

/* Both processes prove the same key when they link (AuthKeyFile, read from
 * HIXL_AUTH_KEY_FILE by every engine). A deployment gives each host the same key file
 * (mode 0600, e.g. from `openssl rand -hex 32`); when none is set, the sample makes
 * one for its two processes and removes it at the end. */
static char key_path[128];

static int key_setup(void) {
  if (getenv("HIXL_AUTH_KEY_FILE")) return 0;
  if (bench_key_file(key_path, sizeof(key_path), "hixl-cs-sample") != 0) return -1;
  return setenv("HIXL_AUTH_KEY_FILE", key_path, 1);
}

int main(int argc, char **argv) {
  uint16_t port = argc > 1 ? (uint16_t)atoi(argv[1]) : free_port();
  int ready[2], done[2];
  if (key_setup() < 0) {
    perror("hixl-cs-sample: a key for the two processes");
    return 1;
  }
  if (pipe(ready) || pipe(done)) return 1;
  pid_t pid = fork();
  if (pid == 0) _exit(server(port, ready[1], done[0]));
  int rc = wait_byte(ready[0], 10000) == 'r' ? client(port) : 1;
  if (write(done[1], "d", 1) != 1) rc = 1;
  int ws;
  if (waitpid(pid, &ws, 0) != pid || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    fprintf(stderr, "server process failed\n");
    rc = 1;
  }
  if (key_path[0]) unlink(key_path);
  return rc;
}
