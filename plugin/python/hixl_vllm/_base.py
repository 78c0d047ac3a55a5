"""vLLM's KV connector base classes when vLLM is importable, else hixl_vllm._standin's."""

from __future__ import annotations

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1, KVConnectorHandshakeMetadata, KVConnectorMetadata, KVConnectorRole, SupportsHMA)
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # type: ignore
        KVConnectorPromMetrics, KVConnectorStats)
    try:  # vLLM >= 0.32: failed receives reported per request
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults  # type: ignore
    except ImportError:
        from ._standin import KVConnectorTransferResults  # noqa: F401
    try:  # vLLM >= 0.34: how the workers reach the device KV cache (kv_cache_access)
        from vllm.config.kv_transfer import KVCacheAccess  # type: ignore
    except ImportError:
        from ._standin import KVCacheAccess  # noqa: F401
    USING_VLLM = True
except ImportError:  # vLLM absent: the stand-ins, with the same names and signatures
    from ._standin import (KVCacheAccess, KVConnectorBase_V1, KVConnectorHandshakeMetadata,  # noqa: F401
                           KVConnectorMetadata, KVConnectorPromMetrics, KVConnectorRole, KVConnectorStats,
                           KVConnectorTransferResults, SupportsHMA)
    USING_VLLM = False

__all__ = ["KVCacheAccess", "KVConnectorBase_V1", "KVConnectorHandshakeMetadata", "KVConnectorMetadata",
           "KVConnectorPromMetrics", "KVConnectorRole", "KVConnectorStats", "KVConnectorTransferResults", "SupportsHMA",
           "USING_VLLM"]
