/* options: the engine's typed options, parsed from key/value strings by one table. */
#ifndef HIXL_OPTIONS_H
#define HIXL_OPTIONS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hixl/hixl_engine.h"

#define HIXL_RAILS_MAX   8 /* rails per peer, this engine's own included (WIRE_MAX_RAILS) */
#define HIXL_ALIASES_MAX 8 /* AuthAliases: addresses a peer may dial this engine by, besides its own */

enum hixl_transport { HIXL_TRANSPORT_AUTO, HIXL_TRANSPORT_TCP, HIXL_TRANSPORT_RDMA, HIXL_TRANSPORT_SHM };

/* StagingThreshold "auto", from the measurements in docs/performance*.md: packing
 * 1024-op batches wins below these sizes on this project's 2-core VM. */
#define STAGE_AUTO_TCP  4096u
#define STAGE_AUTO_RDMA 4096u

/* SocketBufferKiB "auto": each link's socket buffers fixed at this where the kernel lets
 * them be that large (docs/performance-pd.md: autotuned buffers gave each tcp link the
 * size its own history grew, 0.8 to 1.4 MB here, and its throughput with it). */
#define SOCKBUF_AUTO_KIB 2048u

struct hixl_options {
  uint32_t pool_num;     /* BufferPool: staging buffers */
  uint32_t pool_size_mb; /* BufferPool: MiB each */
  uint32_t rdma_tc;      /* RdmaTrafficClass */
  uint32_t rdma_sl;      /* RdmaServiceLevel */
  uint32_t rdma_timeout; /* RdmaTimeout: QP ack timeout, 4.096 us * 2^value */
  uint32_t rdma_retry;   /* RdmaRetryCount: QP retransmissions before a work request fails */
  enum hixl_transport transport;
  char rdma_device[64];      /* RdmaDevice: "" finds the device that owns the engine's IP */
  int32_t rdma_gid_index;    /* RdmaGidIndex: -1 picks the RoCE v2 GID of the engine's IP */
  uint32_t stage_threshold;  /* StagingThreshold: ops shorter than this are coalesced; 0 never */
  bool stage_threshold_auto; /* "auto": STAGE_AUTO_TCP on tcp links, STAGE_AUTO_RDMA on rdma links */
  bool stage_unregistered;   /* StagingUnregistered: peers' staged ops may reach unregistered memory */
  uint32_t answers_max;      /* LinkAnswersMax: answers a target link may owe before it stops reading */
  size_t answer_bytes_max;   /* LinkAnswerMiB, in bytes: ... and their bytes */
  uint32_t handshake_ms;     /* HandshakeTimeout: an accepted link not HELLO'd by then is closed */
  uint32_t max_links;        /* MaxLinks: links a target accepts at once */
  uint32_t max_links_addr;   /* MaxLinksPerAddress: ... from one IP address */
  char auth_key_file[1024];  /* AuthKeyFile: "" accepts anyone */
  uint32_t alias_n;          /* AuthAliases: other ip:port names peers dial this engine by */
  uint32_t alias_addr[HIXL_ALIASES_MAX]; /* ... their IPv4 addresses, network order */
  uint16_t alias_port[HIXL_ALIASES_MAX]; /* ... and ports, host order */
  bool auth_payload_tag;                 /* AuthPayloadTag: tcp payloads are tagged too, and must be */
  /* Rails: several links per peer, one per rail (engine/rails.c) */
  bool rails_on;                      /* "auto" or a list was given */
  bool rails_auto;                    /* "auto": every interface address that is up */
  uint32_t rails_n;                   /* the list's length */
  uint32_t rail_addr[HIXL_RAILS_MAX]; /* ... its IPv4 addresses, network order */
  uint32_t rail_stall_ms;             /* RailStallMs: a rail with work and no bytes moved this long is out */
  uint32_t rail_probe_ms;             /* RailProbeMs: how often a down rail is dialled again */
  uint32_t sockbuf_kib; /* SocketBufferKiB: SO_SNDBUF and SO_RCVBUF of every link's socket; 0 autotuned */
  bool sockbuf_auto;    /* "auto": SOCKBUF_AUTO_KIB where the kernel allows it, else 0 (hixl_engine init) */
  uint32_t poll_us;     /* PollUs: the progress thread polls this long after its last event; 0 sleeps */
};

/* One row per key: the same table drives parsing, validation and the docs. */
typedef HixlEngineOptionInfo hixl_option_info;

/* Parse options over defaults and env; PARAM_INVALID names key, value and range. */
HixlStatus hixl_options_parse(const HixlOption *opts, size_t n, struct hixl_options *out);
const char *hixl_transport_name(enum hixl_transport t);

#endif
