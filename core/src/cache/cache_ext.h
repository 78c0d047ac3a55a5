/* cache_ext: what the KV connector plugin needs from the cache manager beyond the
 * public API (hixl_cache.h). */
#ifndef HIXL_CACHE_EXT_H
#define HIXL_CACHE_EXT_H
#include <stddef.h>
#include <stdint.h>

#include "engine/engine_ext.h"
#include "hixl/hixl_cache.h"

/* HixlCacheManagerPushBlocks, started rather than waited for, with a call of service
 * behind the data (hixl_engine_transfer_then_call: it leaves once every op landed,
 * and not if one failed). Returns once the transfer has started (checks, lookups and
 * any batch before the last are done then); *call is waited for with
 * hixl_engine_call_wait on the engine the destination's cluster is linked to. On
 * SUCCESS the local cache stays pinned (UnregisterCache refuses) until
 * hixl_cache_unpin, which the caller calls once the call has been waited for. Its
 * bytes count in HixlCacheManagerGetStats when it starts. */
HixlStatus hixl_cache_push_blocks_then_call(HixlCacheManager *mgr, const HixlBlocksCacheKey *dst_key,
                                            uint64_t src_cache_id, const uint64_t *src_blocks, size_t nsrc,
                                            const uint64_t *dst_blocks, size_t ndst,
                                            const HixlCacheTransferArgs *args, uint16_t service,
                                            const void *req, size_t len, void *resp, size_t cap,
                                            uint32_t *resp_len, hixl_call_t *call);

/* Let go of the pin hixl_cache_push_blocks_then_call left on cache_id (one per call;
 * nothing when none is left: a task's or a transfer's pin is theirs). A call as the
 * others: nothing on a NULL manager or one being destroyed. */
void hixl_cache_unpin(HixlCacheManager *mgr, uint64_t cache_id);

#endif
