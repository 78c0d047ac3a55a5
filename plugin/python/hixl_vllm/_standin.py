"""Stand-ins for vLLM's KV connector base classes, used only when vLLM is not importable.

They carry the method names, parameters and defaults of vllm/distributed/kv_transfer/
kv_connector/v1/base.py and metrics.py (read in 2026, written here from scratch), so the
adapter runs and is tested without vLLM. When vLLM is importable, hixl_vllm subclasses
vLLM's own classes instead and this module is never imported. The signature test
(tests/test_signatures.py) checks HixlKVConnector against these, and against vLLM's
classes when it is installed.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional


class KVCacheAccess(enum.IntFlag):
    """How a connector's workers reach the device KV cache (vLLM >= 0.34): flags of what
    they need of its allocation."""
    IN_PROCESS = 0  # torch ops and copy kernels only: any allocation
    REGISTERS = enum.auto()  # registered with UCX or RDMA: one physical allocation a segment
    EXPORTS_FD = enum.auto()  # imported by another process through POSIX file descriptors
    EXPORTS_FABRIC = enum.auto()  # imported through FABRIC handles
    LEGACY_IPC = enum.auto()  # shared through legacy CUDA IPC: no extensible KV cache

    def needs_single_chunk(self) -> bool:
        return bool(self & (KVCacheAccess.REGISTERS | KVCacheAccess.EXPORTS_FD | KVCacheAccess.EXPORTS_FABRIC))


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0  # in the scheduler process
    WORKER = 1  # in each worker process


class KVConnectorMetadata(ABC):  # noqa: B024
    """Scheduler connector -> worker connectors, once per step."""


class KVConnectorHandshakeMetadata(ABC):  # noqa: B024
    """Out-of-band handshake data between P/D workers."""


class KVConnectorWorkerMetadata(ABC):
    """Worker connectors -> scheduler connector, aggregated over workers."""

    @abstractmethod
    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        ...


@dataclass
class KVConnectorStats:
    """Serializable connector telemetry, sent from workers to the logger process."""

    data: dict = field(default_factory=dict)

    def reset(self):
        raise NotImplementedError

    def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
        raise NotImplementedError

    def reduce(self) -> dict:
        raise NotImplementedError

    def is_empty(self) -> bool:
        raise NotImplementedError


@dataclass
class KVConnectorTransferResults:
    """vLLM 0.32's transfer completions of one worker step: failed receives are also in
    finished_recving."""

    finished_sending: set = field(default_factory=set)
    finished_recving: set = field(default_factory=set)
    failed_recving: set = field(default_factory=set)


class KVConnectorPromMetrics:
    """Per-connector Prometheus metrics: registered at construction, fed by observe()."""

    def __init__(self, vllm_config: Any, metric_types: dict, labelnames: list,
                 per_engine_labelvalues: dict):
        self._kv_transfer_config = getattr(vllm_config, "kv_transfer_config", None)
        self._metric_types = metric_types  # {prometheus class: the class to build it with}
        self._labelnames = labelnames
        self.per_engine_labelvalues = per_engine_labelvalues

    def observe(self, transfer_stats_data: dict, engine_idx: int = 0):
        raise NotImplementedError


class SupportsHMA(ABC):
    """A connector that works with the hybrid memory allocator (one block list per group)."""

    @abstractmethod
    def request_finished_all_groups(self, request: Any, block_ids: tuple) -> tuple:
        raise NotImplementedError


class KVConnectorBase_V1(ABC):
    """The v1 KV connector interface: scheduler-side and worker-side methods."""

    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return False

    @property
    def supports_eagle_prefix_cache_hashing(self) -> bool:
        return False

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return False

    @property
    def requires_kv_delivery(self) -> bool:
        return bool(getattr(self._kv_transfer_config, "is_kv_producer", False))

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        self._connector_metadata: Optional[KVConnectorMetadata] = None
        self._vllm_config = vllm_config
        if getattr(vllm_config, "kv_transfer_config", None) is None:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role
        self.use_eagle_prefix_cache_hashing = False

    def set_eagle_prefix_cache_hashing(self, enabled: bool) -> None:
        self.use_eagle_prefix_cache_hashing = enabled

    @property
    def role(self) -> KVConnectorRole:
        return self._role

    # ---- worker side ----

    def get_mem_pool_context(self) -> Optional[Any]:
        return None

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches: dict):
        return

    def register_cross_layers_kv_cache(self, kv_cache: Any, attn_backend: Any):
        return

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config: Any) -> bool:
        return False

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: Any) -> KVCacheAccess:
        return KVCacheAccess.IN_PROCESS

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        return True

    def unregister_kv_caches(self) -> None:
        return

    def restore_kv_caches(self) -> None:
        return

    def set_host_xfer_buffer_ops(self, copy_operation: Any):
        return

    def finish_forward(self) -> None:
        return

    def reset_capture_state(self) -> None:
        return

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata):
        return

    @abstractmethod
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        ...

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None:
        ...

    @abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        ...

    @abstractmethod
    def wait_for_save(self):
        ...

    def get_finished(self, finished_req_ids: set) -> tuple:
        return None, None

    def get_transfer_results(self, finished_req_ids: set) -> KVConnectorTransferResults:
        s, r = self.get_finished(finished_req_ids)
        return KVConnectorTransferResults(set(s or ()), set(r or ()))

    def get_block_ids_with_load_errors(self) -> set:
        return set()

    def shutdown(self):
        return None

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        return None

    def get_kv_connector_kv_cache_events(self) -> Any:
        return None

    def get_handshake_metadata(self) -> Optional[KVConnectorHandshakeMetadata]:
        return None

    def build_connector_worker_meta(self) -> Optional[KVConnectorWorkerMetadata]:
        return None

    # ---- scheduler side ----

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        self._kv_cache_manager = kv_cache_manager
        self.bind_gpu_block_pool(getattr(kv_cache_manager, "block_pool", None))

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        return

    def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple:
        return tuple(getattr(self._kv_cache_config, "prefix_cacheable_group_ids", None) or ())

    @abstractmethod
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple:
        ...

    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int) -> dict:
        return {"external_unspecified": num_external_tokens} if num_external_tokens else {}

    @abstractmethod
    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        ...

    def on_new_request(self, request: Any) -> None:
        return

    def may_load_async(self, request: Any) -> bool:
        params = getattr(request, "kv_transfer_params", None)
        return bool(params and params.get("do_remote_prefill"))

    def update_connector_output(self, connector_output: Any):
        return

    def request_finished(self, request: Any, block_ids: list) -> tuple:
        return False, None

    def register_finished_partial_tail(self, request: Any, block_ids: tuple, partial_tail_offloads: list) -> bool:
        return False

    def take_events(self) -> Iterable:
        return ()

    def has_pending_block_frees(self) -> bool:
        return False

    def has_pending_push_work(self) -> bool:
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
        if cls is KVConnectorBase_V1:
            raise TypeError("get_required_kvcache_layout should not be called on the abstract base class")
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict) -> bool:
        return False

    def get_finished_count(self) -> Optional[int]:
        return None

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[dict] = None) -> Optional[KVConnectorStats]:
        return None

    def set_xfer_handshake_metadata(self, metadata: dict) -> None:
        return None

    def set_xfer_handshake_metadata_pp_aware(self, metadata: dict) -> None:
        if any(pp_rank != 0 for pp_rank, _ in metadata):
            raise ValueError(f"{type(self).__name__} received pp_rank > 0 handshake metadata "
                             "but does not support PP-disaggregated KV transfer.")
        self.set_xfer_handshake_metadata({tp: m for (_, tp), m in metadata.items()})

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: dict, labelnames: list,
                           per_engine_labelvalues: dict) -> Optional[KVConnectorPromMetrics]:
        return None

    def reset_cache(self) -> Optional[bool]:
        return None
