/* hixl RPing: network probing between hosts with the HccnRping* names of HIXL's
 * hcomm (seed 002). Every host that takes part runs HccnRpingInit; that starts a
 * responder answering probes on attr->port. A client adds targets (each verified with
 * a handshake to its responder), runs a batch of probes and reads per-target counts
 * and round-trip times. Probes go over UDP (mode UDP) or as RoCE UD messages carrying
 * each target's traffic class and service level (mode ROCE). docs/rping.md describes
 * the flow, the rules and the packets.
 *
 * Failures return an HccnResult; HixlGetLastErrorMessage() (hixl_status.h) says why
 * the calling thread's last failing call failed, for HccnRping* calls too.
 * Every function is safe from any thread; calls on a context that was deinitialized
 * (or never existed) return HCCN_E_PARA instead of touching freed memory. */
#ifndef HCCN_RPING_H
#define HCCN_RPING_H

#include <stdint.h>

#include "hixl/hixl_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void *HccnRpingCtx; /* opaque, from HccnRpingInit */

#define HCCN_RPING_PAYLOAD_LEN_MAX   1500   /* bytes of user payload per probe */
#define HCCN_RPING_MAX_ADD_TARGETS   16     /* targets per HccnRpingAddTarget call */
#define HCCN_RPING_BUFFER_ALIGN      4096   /* attr->bufferSize is a multiple of this */
#define HCCN_RPING_BUFFER_PER_PACKET 2048   /* bufferSize > pkt_num * this * targets */
#define HCCN_RPING_ADD_TIMEOUT_MS    120000 /* AddTarget's wait, unless configured */
#define HCCN_RPING_ADD_TIMEOUT_MAX   3600000

/* One list drives the values, the names and the strings (hcomm's values kept). */
#define HCCN_RESULT_MAP(X)                                                                                   \
  X(HCCN_SUCCESS, 0, "success")                                                                              \
  X(HCCN_E_AGAIN, 1, "not ready yet, try again")                                                             \
  X(HCCN_E_FAIL, 2, "failed")                                                                                \
  X(HCCN_E_PARA, 3, "invalid parameter")                                                                     \
  X(HCCN_E_MEM, 4, "out of memory")

#define HCCN_RESULT_ENUM_(name, value, text) name = value,
typedef enum {
  HCCN_RESULT_MAP(HCCN_RESULT_ENUM_) HCCN_E_RESERVED /* never returned */
} HccnResult;
#undef HCCN_RESULT_ENUM_

typedef enum {
  HCCN_RPING_MODE_ROCE = 0, /* probes are RoCE UD SENDs with the target's tc (GRH) and sl; needs the
                             * RDMA device that owns the context's address (else Init: HCCN_E_FAIL) */
  HCCN_RPING_MODE_UDP = 16, /* hixl: probes over UDP with the IP TOS byte set from tc */
} HccnRpingMode;

typedef enum {
  HCCN_RPING_RESULT_STATE_NOT_FOUND = 0, /* no such target in the context */
  HCCN_RPING_RESULT_STATE_INVALID = 1,   /* the target took no part in the batch, or no probe left */
  HCCN_RPING_RESULT_STATE_VALID = 2,     /* the counts and times were measured */
  HCCN_RPING_RESULT_STATE_RESERVED
} HccnRpingResultState;

typedef struct HccnRpingInitAttr {
  HccnRpingMode mode;  /* HCCN_RPING_MODE_UDP or HCCN_RPING_MODE_ROCE */
  uint32_t port;       /* UDP port the responder listens on (ROCE: for the handshake), 1..65535 */
  uint32_t npuNum;     /* most targets this context may hold, >= 1 */
  uint32_t bufferSize; /* multiple of 4096; must exceed pkt_num * 2048 * targets (ROCE: registered,
                        * it holds a batch's probe and answer slots) */
  uint32_t sl;         /* service level 0..7 (checked and kept; probes use each target's) */
  uint32_t tc;         /* traffic class 0..255 (checked and kept; probes use each target's) */
  char *ipAddr;        /* IPv4 address of this device; NULL: the device's first one */
} HccnRpingInitAttr;

typedef struct HccnRpingTargetInfo {
  uint32_t srcPort;                         /* UDP source port of the probes; 0: any (ROCE: 0) */
  uint32_t reserved;                        /* 0 */
  uint32_t sl;                              /* service level 0..7 (ROCE: the probes' AH) */
  uint32_t tc;                              /* 0..255: IP TOS byte (ROCE: GRH traffic class) */
  uint32_t port;                            /* the target's responder port, 1..65535 */
  uint32_t payloadLen;                      /* bytes of payload, <= 1500 (ROCE: <= MTU - 32) */
  char payload[HCCN_RPING_PAYLOAD_LEN_MAX]; /* carried by every probe and echoed back */
  char *srcIp;                              /* this context's address, or NULL */
  char *dstIp;                              /* the target's IPv4 address: its key */
} HccnRpingTargetInfo;

typedef struct HccnRpingResultInfo {
  uint32_t txPkt;             /* probes sent */
  uint32_t rxPkt;             /* answers received in time */
  uint32_t minRTT;            /* round-trip times in microseconds (CLOCK_MONOTONIC); */
  uint32_t maxRTT;            /*   0 when nothing came back */
  uint32_t avgRTT;            /*   */
  HccnRpingResultState state; /* VALID when the figures above were measured */
  uint32_t reserved[5];
} HccnRpingResultInfo;

typedef struct HccnRpingAddTargetConfig {
  uint32_t connectTimeout; /* ms to wait for targets' responders, 1..3600000 */
  uint8_t reserve[32];
} HccnRpingAddTargetConfig;

/** Name of a result ("HCCN_E_PARA"); "HCCN_UNKNOWN_RESULT" for other values. */
HIXL_API const char *HccnResultName(HccnResult result);
/** Short English text of a result. */
HIXL_API const char *HccnResultString(HccnResult result);

/** Start RPing on a local device and its responder (one context per device per process);
 *  mode ROCE also opens the RDMA device that owns the address, a UD queue pair and
 *  the registered bufferSize.
 *  @param device   a NIC name ("eth0", resolved to its IPv4 address) or an IPv4 address;
 *                  NULL or "": attr->ipAddr names the device
 *  @param attr     mode, responder port, limits; attr->ipAddr must agree with device
 *  @param rpingCtx receives the context on success */
HIXL_API HccnResult HccnRpingInit(const char *device, const HccnRpingInitAttr *attr, HccnRpingCtx *rpingCtx);

/** Stop any batch, stop the responder and free the context. A second call returns
 *  HCCN_E_PARA. */
HIXL_API HccnResult HccnRpingDeinit(HccnRpingCtx rpingCtx);

/** Add up to 16 targets; each must answer a handshake from its responder within the
 *  wait (env HIXL_RPING_ADD_TIMEOUT_MS read at Init, default 120000 ms). Duplicates by
 *  dstIp keep the first. Arguments are checked for all targets before any is added;
 *  targets that answered stay added even when others did not (HCCN_E_FAIL names them),
 *  so calling again with the same list waits only for the missing ones. */
HIXL_API HccnResult HccnRpingAddTarget(HccnRpingCtx rpingCtx, uint32_t targetNum,
                                       HccnRpingTargetInfo *target);

/** HccnRpingAddTarget with the wait from config->connectTimeout (NULL: the default). */
HIXL_API HccnResult HccnRpingAddTargetWithCfg(HccnRpingCtx rpingCtx, uint32_t targetNum,
                                              HccnRpingTargetInfo *target, HccnRpingAddTargetConfig *config);

/** Remove targets by dstIp; every one must be present, and no batch may be active. */
HIXL_API HccnResult HccnRpingRemoveTarget(HccnRpingCtx rpingCtx, uint32_t targetNum,
                                          HccnRpingTargetInfo *target);

/** Start a batch: pktNum probes to every target, interval ms apart (0..10000); an
 *  answer counts when it comes within timeout ms (1..60000) of its probe. The batch
 *  stays active until HccnRpingBatchPingStop, even after it finished. */
HIXL_API HccnResult HccnRpingBatchPingStart(HccnRpingCtx rpingCtx, uint32_t pktNum, uint32_t interval,
                                            uint32_t timeout);

/** End the active batch (stopping its probes if it still runs) and drop its results. */
HIXL_API HccnResult HccnRpingBatchPingStop(HccnRpingCtx rpingCtx);

/** Results of the active batch for targetNum targets (found by dstIp): HCCN_E_AGAIN
 *  while it runs; result[] is written only when HCCN_SUCCESS is returned. */
HIXL_API HccnResult HccnRpingGetResult(HccnRpingCtx rpingCtx, uint32_t targetNum, HccnRpingTargetInfo *target,
                                       HccnRpingResultInfo *result);

#ifdef __cplusplus
}
#endif
#endif /* HCCN_RPING_H */
