"""The vLLM objects a connector is handed, as small stand-ins with the fields hixl_vllm
reads (vLLM itself is not installed here): the configs, Request, KVCacheBlocks,
SchedulerOutput, KVConnectorOutput and the forward context."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Dict, List, Optional


@dataclass
class KVTransferConfig:
    kv_connector: Optional[str] = None
    kv_connector_module_path: Optional[str] = None
    kv_role: Optional[str] = None
    kv_load_failure_policy: Optional[str] = None
    kv_connector_extra_config: Dict[str, Any] = field(default_factory=dict)
    engine_id: str = "engine-0"
    kv_buffer_size: float = 1e9
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "KVTransferConfig":
        return cls(**d)


@dataclass
class VllmConfig:
    kv_transfer_config: KVTransferConfig
    parallel_config: Any = field(default_factory=lambda: SimpleNamespace(tensor_parallel_size=1))
    cache_config: Any = field(default_factory=lambda: SimpleNamespace(block_size=16, kv_cache_layout=None))


class FullAttentionSpec(SimpleNamespace):
    pass


class MLAAttentionSpec(SimpleNamespace):
    pass


class SlidingWindowSpec(SimpleNamespace):
    pass


@dataclass
class KVCacheGroupSpec:
    layer_names: List[str]
    kv_cache_spec: Any


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_groups: List[KVCacheGroupSpec]


class RequestStatus(enum.Enum):
    WAITING = 1
    WAITING_FOR_REMOTE_KVS = 2
    RUNNING = 3
    PREEMPTED = 4
    FINISHED_STOPPED = 5
    FINISHED_LENGTH_CAPPED = 6
    FINISHED_ABORTED = 7


@dataclass
class Request:
    request_id: str
    num_prompt_tokens: int
    kv_transfer_params: Optional[Dict[str, Any]] = None
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0


class KVCacheBlocks:
    """vLLM's per-request block lists, one per KV cache group (no prefix cache here)."""

    def __init__(self, groups):
        self.groups = tuple(list(g) for g in groups)

    def get_block_ids(self):
        return self.groups

    def get_unhashed_block_ids(self):
        assert len(self.groups) == 1
        return self.groups[0]


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list = field(default_factory=list)
    num_scheduled_tokens: Dict[str, int] = field(default_factory=dict)
    finished_req_ids: set = field(default_factory=set)
    preempted_req_ids: set = field(default_factory=set)


@dataclass
class KVConnectorOutput:
    finished_sending: Optional[set] = None
    finished_recving: Optional[set] = None
    kv_connector_stats: Any = None
    invalid_block_ids: set = field(default_factory=set)


class ForwardContext(SimpleNamespace):
    pass
