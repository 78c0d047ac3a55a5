"""HixlKVConnector: vLLM's KVConnectorBase_V1 + SupportsHMA over libhixl_kv_connector.so.

One connector object is one C connector (create with the scheduler or worker role).
The scheduler side turns vLLM's Request into hixl_kv_request (kv_transfer_params as
JSON), block lists into uint64 buffers, and the metadata bytes into HixlConnectorMetadata;
the worker side turns layer names into the model layer numbers save_kv_layer takes and
the KV tensors into ABI 1.3's groups of planes (layout.py). docs/vllm.md lists every
base-class method and what it does here.
"""

from __future__ import annotations

import ctypes
import difflib
import itertools
import json
import logging
from array import array
from typing import Any, Dict, Iterable, Optional, Tuple

from . import _abi, layout
from ._base import (USING_VLLM, KVCacheAccess, KVConnectorBase_V1, KVConnectorMetadata, KVConnectorPromMetrics,
                    KVConnectorRole, KVConnectorStats, KVConnectorTransferResults, SupportsHMA)

logger = logging.getLogger("hixl_vllm")

# kv_connector_extra_config.hixl_vllm: the adapter's own keys (never passed to the plugin,
# whose configuration refuses keys it does not know).
ADAPTER_KEYS = {
    "plugin": "path of libhixl_kv_connector.so (else $HIXL_KV_PLUGIN, else beside the package, else the loader's path)",
    "layout": "override of the KV layout the adapter reads from vLLM (checked against it): packed, kv_first, "
              "blocks_first, mla, LBNHC, LBHNC, LHBNC, BLNHC, BLHNC, BHLNC, cross_layer",
    "axes": "axis letters of each layer's tensor, when they differ from the layout's usual ones",
    "cross_layer_axes": "axis letters of the cross-layer tensor (default BLSNHC)",
    "prefer_cross_layer_blocks": "answer vLLM's prefer_cross_layer_blocks (default false)",
    "rank": "the worker's rank when vLLM's parallel state is not there (tests); default 0",
    "kv_heads": "the model's KV heads over every TP rank when vLLM's model config is not there (tests); default: "
                "model_config.get_total_num_kv_heads(), else each rank's heads x TP size",
}
# vLLM's KVTransferConfig fields the plugin is given (the rest are vLLM's alone).
_PASSED_FIELDS = ("kv_connector", "kv_connector_module_path", "kv_role", "kv_load_failure_policy")
# get_stats_ex's counters that only grow (the rest are levels now).
_MONOTONIC = ("loads_done", "loads_failed", "lease_expired", "bytes_loaded", "engine_ops", "lookups", "pushes_done",
              "pushes_failed", "layers_pushed", "bytes_pushed", "cap_refused")
_LEVELS = ("blocks_held", "requests_held")


class HixlConfigError(ValueError):
    """A key of kv_connector_extra_config.hixl_vllm that the adapter does not know, or a bad value."""


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _stream_sync(t: Any):
    """A call that waits until the work queued so far on the current CUDA stream of t's
    device has run (the layer's KV written), or None where torch has no CUDA (stand-in
    tensors). The forward pass's CPU thread waits for its GPU there: correct, not free;
    a push that waits on an event in the plugin's own stream instead is not built."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        dev = t.device
    except (ImportError, AttributeError):
        return None
    return lambda: torch.cuda.current_stream(dev).synchronize()


def _device_type(vllm_config: Any) -> str:
    """vLLM's device type ("cuda", "cpu", ...), or "" when it does not say."""
    dc = getattr(vllm_config, "device_config", None)
    t = getattr(dc, "device_type", None) or getattr(getattr(dc, "device", None), "type", None)
    return str(t) if t else ""


def split_config(kv_transfer_config: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """vLLM's kv_transfer_config as (the document for the plugin's create, the adapter's
    options). The adapter's keys live in kv_connector_extra_config.hixl_vllm."""
    extra = dict(_field(kv_transfer_config, "kv_connector_extra_config", None) or {})
    opts = extra.pop("hixl_vllm", {})
    if not isinstance(opts, dict):  # [], 0 or "" too: they were taken as {}
        raise HixlConfigError("kv_connector_extra_config.hixl_vllm: expected an object")
    for k in opts:
        if k not in ADAPTER_KEYS:
            near = difflib.get_close_matches(k, ADAPTER_KEYS, n=1)
            raise HixlConfigError(f"kv_connector_extra_config.hixl_vllm: unknown key {k!r}"
                                  + (f"; did you mean {near[0]!r}?" if near else
                                     f" (known: {', '.join(ADAPTER_KEYS)})"))
    if not isinstance(opts.get("prefer_cross_layer_blocks", False), bool):  # bool("false") is True
        raise HixlConfigError("kv_connector_extra_config.hixl_vllm.prefer_cross_layer_blocks: expected true or "
                              f"false, got {opts['prefer_cross_layer_blocks']!r}")
    doc: Dict[str, Any] = {}
    for f in _PASSED_FIELDS:
        v = _field(kv_transfer_config, f)
        if v is None or (f == "kv_load_failure_policy" and "load_failure_policy" in extra
                         and not isinstance(kv_transfer_config, dict)):
            continue  # vLLM's default policy yields to the one the extra config names
        doc[f] = v
    doc["kv_connector_extra_config"] = extra
    return doc, dict(opts)


class HixlConnectorMetadata(KVConnectorMetadata):
    """The bytes build_connector_meta produced, for the workers' bind_connector_metadata;
    and the requests the scheduler preempted this step (handle_preemptions)."""

    def __init__(self, data: bytes, preempted_req_ids: Iterable[str] = ()):
        self.data = bytes(data)
        self.preempted_req_ids = list(preempted_req_ids)

    def __repr__(self) -> str:
        return f"HixlConnectorMetadata({len(self.data)} bytes, {len(self.preempted_req_ids)} preempted)"


class HixlKVConnectorStats(KVConnectorStats):
    """The plugin's counters over an interval (get_stats_ex): counts that only grow as
    increments since the last report, blocks_held / requests_held as levels; and the
    transfer time of each request moved in the interval (seconds, from the plugin's
    per-request traces: its first op posted to its last byte). Aggregating sums the
    counts (workers of one engine hold disjoint blocks) and joins the times."""

    COUNTERS = _abi.STATS_EX_COUNTERS
    TIMES = "transfer_s"

    def __init__(self, data: Optional[Dict[str, Any]] = None):
        d = data or {}
        full: Dict[str, Any] = {k: int(d.get(k, 0)) for k in self.COUNTERS}
        full[self.TIMES] = [float(x) for x in d.get(self.TIMES, ())]
        super().__init__(data=full)

    def reset(self):
        self.data = {k: 0 for k in self.COUNTERS}
        self.data[self.TIMES] = []

    def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
        for k, v in (other.data or {}).items():
            if k == self.TIMES:
                self.data.setdefault(k, []).extend(float(x) for x in v)
            else:
                self.data[k] = self.data.get(k, 0) + int(v)
        return self

    def reduce(self) -> Dict[str, Any]:
        out = {k: v for k, v in self.data.items() if k != self.TIMES}
        xs = sorted(self.data.get(self.TIMES) or ())
        out["transfers"] = len(xs)
        if xs:
            out["transfer_ms_p50"] = round(1e3 * xs[len(xs) // 2], 3)
            out["transfer_ms_max"] = round(1e3 * xs[-1], 3)
        return out

    def is_empty(self) -> bool:
        return not any(self.data.values())


class HixlPromMetrics(KVConnectorPromMetrics):
    """Prometheus metrics from HixlKVConnectorStats: a counter per growing count
    (vllm:hixl_<name>) and a gauge per level, labelled per engine as vLLM's are."""

    DOC = {
        "loads_done": "requests whose KV was loaded (pull: read, push: every layer landed)",
        "loads_failed": "KV loads that failed",
        "lease_expired": "held requests freed because their lease ran out",
        "bytes_loaded": "bytes of KV loaded",
        "engine_ops": "engine op descriptors issued",
        "lookups": "remote cache lookups (round trips)",
        "pushes_done": "requests pushed to a consumer",
        "pushes_failed": "pushes that failed",
        "layers_pushed": "layers sent as soon as they were saved",
        "bytes_pushed": "bytes of KV pushed",
        "cap_refused": "KV service calls of peers refused for a missing or wrong request capability",
        "blocks_held": "blocks held for consumers now",
        "requests_held": "requests held for consumers now",
    }
    # One request's transfer on the worker that moves it, as NixlConnector's
    # vllm:nixl_xfer_time_seconds: 0.5 ms to 10 s.
    BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

    def __init__(self, vllm_config: Any, metric_types: dict, labelnames: list, per_engine_labelvalues: dict):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        by_name = {getattr(k, "__name__", str(k)): v for k, v in metric_types.items()}
        counter, gauge, hist = by_name["Counter"], by_name["Gauge"], by_name.get("Histogram")
        self.counters, self.gauges, self.hist = {}, {}, {}
        if hist is not None:
            m = hist(name="vllm:hixl_transfer_seconds", documentation="one request's KV transfer on the worker that "
                     "moves it (pull: the consumer's first op posted to its read's return; push: the producer's first "
                     "layer posted to its last landed notice)", labelnames=labelnames, buckets=list(self.BUCKETS))
            self.hist = {i: m.labels(*v) for i, v in per_engine_labelvalues.items()}
        for k in _MONOTONIC:
            m = counter(name=f"vllm:hixl_{k}", documentation=self.DOC[k], labelnames=labelnames)
            self.counters[k] = {i: m.labels(*v) for i, v in per_engine_labelvalues.items()}
        for k in _LEVELS:
            m = gauge(name=f"vllm:hixl_{k}", documentation=self.DOC[k], labelnames=labelnames)
            self.gauges[k] = {i: m.labels(*v) for i, v in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict, engine_idx: int = 0):
        for k, per in self.counters.items():
            v = int(transfer_stats_data.get(k, 0))
            if v:
                per[engine_idx].inc(v)
        for k, per in self.gauges.items():
            per[engine_idx].set(int(transfer_stats_data.get(k, 0)))
        if self.hist:
            for x in transfer_stats_data.get(HixlKVConnectorStats.TIMES) or ():
                self.hist[engine_idx].observe(float(x))


def _role_of(role: Any) -> int:
    name = getattr(role, "name", str(role)).upper()
    if name.endswith("SCHEDULER"):
        return _abi.ROLE_SCHEDULER
    if name.endswith("WORKER"):
        return _abi.ROLE_WORKER
    raise ValueError(f"role {role!r} is neither SCHEDULER nor WORKER")


def _block_groups(blocks: Any, unhashed: bool) -> Tuple[list, ...]:
    """vLLM's KVCacheBlocks (or a list of ids, or one list per group) as one id list per
    group. unhashed: only the blocks not cached locally (the ones a load fills)."""
    if unhashed and hasattr(blocks, "get_unhashed_block_ids_all_groups"):
        return tuple(blocks.get_unhashed_block_ids_all_groups())
    if hasattr(blocks, "get_block_ids"):
        if unhashed and hasattr(blocks, "get_unhashed_block_ids"):
            g = blocks.get_block_ids()
            if len(g) == 1:
                return (blocks.get_unhashed_block_ids(),)
            return tuple(g)
        return tuple(blocks.get_block_ids())
    if isinstance(blocks, tuple):
        return blocks
    blocks = list(blocks) if not isinstance(blocks, array) else blocks
    if blocks and isinstance(blocks[0], (list, tuple, array)):
        return tuple(blocks)
    return (blocks,)


def _windows_of(kv_cache_config: Any, block_size: int) -> Dict[int, Tuple[int, int]]:
    """The sliding-window groups of vLLM's kv_cache_config: group index -> (window tokens,
    tokens per block)."""
    out = {}
    for i, g in enumerate(getattr(kv_cache_config, "kv_cache_groups", None) or []):
        spec = getattr(g, "kv_cache_spec", None)
        kind, window = layout._spec_kind(spec, "")
        if kind == _abi.GROUP_SLIDING_WINDOW and window > 0:
            out[i] = (window, int(getattr(spec, "block_size", 0) or block_size or 0))
    return out


def window_blocks(ids: Any, window: int, block_tokens: int, tokens: int) -> Any:
    """A sliding-window group's block list as the plugin takes it: exactly the blocks the
    window keeps after `tokens` tokens. vLLM's list may still hold the blocks before the
    window (a prefill computed in one step) or pad them with its null block (id 0, the
    block pool's first, never a request's): a request's blocks are in token order, so the
    window's are the last cdiv(tokens, block_tokens) - (tokens - window + 1) // block_tokens
    (vLLM's SlidingWindowManager skips max(0, tokens - window + 1) tokens). Slices only:
    no per-id Python work."""
    if tokens > 0 and block_tokens > 0:
        keep = -(-tokens // block_tokens) - max(0, tokens - window + 1) // block_tokens
        if len(ids) > keep:
            ids = ids[len(ids) - keep:]
    i = 0
    while i < len(ids) and ids[i] == 0:  # null padding the cut above left (a shorter list)
        i += 1
    return ids[i:] if i else ids


class HixlKVConnector(KVConnectorBase_V1, SupportsHMA):
    """hixl as a vLLM KV connector (pull or push, per kv_connector_extra_config.mode)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        self._vllm_config = vllm_config
        self._model_config = getattr(vllm_config, "model_config", None)
        self._doc, self._opts = split_config(ktc)
        # Where the KV caches live: a CUDA run hands CUDA tensors, which the plugin
        # registers as device memory (docs/device-memory.md); an explicit kv_memory stays.
        extra0 = self._doc["kv_connector_extra_config"]
        if "kv_memory" not in extra0 and _device_type(vllm_config) == "cuda":
            extra0["kv_memory"] = "device"
        self._kv_device = extra0.get("kv_memory") == "device"
        # Push from CUDA tensors: what save_kv_layer calls first, so that the layer's KV,
        # written by kernels still queued on the forward pass's stream, is there before the
        # plugin starts moving it (_check_memory sets it; None: nothing to wait for).
        self._layer_sync = None
        self._text = json.dumps(self._doc, indent=2)
        # None: the layout is read from vLLM (register_kv_caches); a name only overrides.
        self._layout = str(self._opts["layout"]) if "layout" in self._opts else None
        extra = self._doc["kv_connector_extra_config"]
        self._push = extra.get("mode") == "push"
        # kv_both (one instance both sides, vLLM's usual role for a P/D pair): in pull mode
        # only a request marked do_remote_decode is held for a consumer (_finished).
        side = extra.get("role") or {"kv_producer": "producer", "kv_consumer": "consumer"}.get(
            self._doc.get("kv_role"), "both")
        self._both = side == "both" and not self._push
        # What can refuse the configuration is checked before create: past it, a refusal
        # would leave the connector's engine and threads behind.
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        self._multi_group = len(groups) > 1
        # load_in_forward: vLLM's synchronous loads (the request runs in the step that loads
        # it). Their failures come back as block ids only, which name no request once there
        # are several KV cache groups (each numbers its own blocks).
        self._in_forward = extra.get("load_in_forward") is True
        if self._in_forward and self._multi_group:
            raise HixlConfigError("load_in_forward: this model has %d KV cache groups; a load in the forward "
                                  "pass reports its failures as block ids, which name no request across "
                                  "groups: leave load_in_forward out for hybrid models" % len(groups))
        ring = extra.get("trace_ring", 1)
        if isinstance(ring, bool) or not isinstance(ring, int):  # the plugin's check names it too, later
            raise HixlConfigError(f"kv_connector_extra_config.trace_ring: expected an integer, got {ring!r}")
        self._traces_off = ring == 0
        self._plugin = _abi.load_plugin(self._opts.get("plugin"))
        self._crole = _role_of(role)
        self._rank, self._world = self._parallel(vllm_config)
        self._c = ctypes.c_void_p()
        err = ctypes.create_string_buffer(1024)
        raw = self._text.encode()
        st = self._plugin.ops.create(raw, len(raw), self._crole, self._rank, self._world, ctypes.byref(self._c), err,
                                     len(err))
        if st != _abi.SUCCESS:
            raise _abi.HixlError(f"create({'scheduler' if self._crole == 0 else 'worker'}, rank {self._rank} "
                                 f"of {self._world})", st, err.value.decode(errors="replace")
                                 + "\n(line:column refer to the document the adapter passed to create:\n"
                                 + self._text + ")")
        # Scheduler: requests a LOAD was queued for (vLLM calls update_state_after_alloc again,
        # with 0 tokens, once the load is done: not a FREE), the blocks each loads into (to
        # turn KVConnectorOutput.invalid_block_ids into failed requests), push requests whose
        # blocks wait for the push, and invalid blocks not matched to a request yet.
        self._loading: Dict[str, tuple] = {}
        self._load_queued: set = set()
        self._pushing: set = set()
        self._invalid: set = set()
        # Sliding-window groups (hybrid models): their lists are cut to the window's blocks.
        cc = getattr(vllm_config, "cache_config", None)
        self._block_size = int(getattr(cc, "block_size", 0) or 0)
        self._windows = _windows_of(kv_cache_config, self._block_size)
        # The tokens of one of this instance's blocks as the KV cache spec has them (the
        # scheduler's block, which kernel blocks may split), for checking a producer's.
        spec_bs = getattr(getattr(groups[0], "kv_cache_spec", None), "block_size", None) if len(groups) == 1 else None
        self._spec_block_size = int(spec_bs) if isinstance(spec_bs, int) and spec_bs > 0 else (
            self._block_size if not groups else 0)
        self._mismatched: set = set()  # requests whose producer's params were refused (logged once)
        self._bad_ids: set = set()  # requests whose ids the plugin refuses (logged once)
        # Worker: from the plugin's traces, transfer times not yet in the stats and failed
        # loads not yet reported; several KV cache groups report failures per request.
        self._times: list = []
        self._failed: set = set()
        self._local_hit: Dict[str, int] = {}  # load_in_forward: request -> tokens cached here (block-aligned)
        # Worker: layer names -> layer ids, the description registered, the last counters.
        self._kv: Optional[layout.KVDescription] = None
        self._last_stats: Dict[str, int] = {}
        self._lids: Dict[str, Optional[int]] = {}  # layer name -> layer id (None: an alias)
        # Scheduler: each request's kv_transfer_params as the JSON bytes last encoded, with
        # the dict they came from (encoded again only if vLLM puts another object there).
        self._enc: Dict[str, Tuple[Any, bytes]] = {}
        self._closed = False
        self._bind_ops()

    # ---- plumbing ----

    def _parallel(self, vllm_config: Any) -> Tuple[int, int]:
        pc = getattr(vllm_config, "parallel_config", None)
        world = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        rank = int(self._opts.get("rank", 0))
        if self._crole == _abi.ROLE_WORKER and USING_VLLM and "rank" not in self._opts:
            try:
                from vllm.distributed.parallel_state import get_tensor_model_parallel_rank  # type: ignore
                rank = int(get_tensor_model_parallel_rank())
            except Exception:  # parallel state not initialized: rank 0 of world
                rank = 0
        return rank, world

    def _call(self, name: str, *args) -> None:
        self._plugin.check(name, getattr(self._plugin.ops, name)(self._c, *args))

    def _bind_ops(self) -> None:
        """The ops a worker calls once per layer per step, looked up once (an ops-table field
        read builds a new ctypes function object each time)."""
        ops = self._plugin.ops
        self._f_wait_layer = ops.wait_for_layer_load
        self._f_save_layer = ops.save_kv_layer

    def _params_of(self, request: Any) -> Optional[bytes]:
        """kv_transfer_params as JSON bytes. vLLM sets a request's dict once and the
        scheduler hooks see the same one several times (get_num_new_matched_tokens each
        step until it is scheduled, update_state_after_alloc, request_finished): with a
        producer's remote_block_ids it is thousands of numbers, so the bytes are kept per
        request while the same object is there with the same do_remote_prefill and
        do_remote_decode, and dropped at request_finished. Connectors change those two
        flags in place (this one and vLLM's clear do_remote_prefill once a load is set
        up), so they are compared each time; nothing changes the rest of the dict."""
        p = getattr(request, "kv_transfer_params", None)
        if p is None:
            return None
        if isinstance(p, (str, bytes)):
            return p.encode() if isinstance(p, str) else p
        rid = request.request_id
        flags = (p.get("do_remote_prefill"), p.get("do_remote_decode")) if isinstance(p, dict) else None
        hit = self._enc.get(rid)
        if hit is not None and hit[0][0] is p and hit[0][1] == flags:
            return hit[1]
        raw = json.dumps(p, separators=(",", ":")).encode()
        if len(self._enc) >= 1 << 16:  # requests vLLM never finished here: forget the lot
            self._enc.clear()
        self._enc[rid] = ((p, flags), raw)
        return raw

    def _refused(self, request: Any) -> bool:
        """A request whose id the plugin refuses (_abi.id_bytes: longer than MAX_ID bytes, a
        NUL, a lone surrogate). The id is the client's, so it must not stop vLLM's
        scheduler (an exception from a hook ends the engine): hixl moves nothing of it and
        vLLM computes its prompt here. Said once per request."""
        rid = request.request_id
        if _abi.id_bytes(rid) is not None:
            return False
        if rid not in self._bad_ids:
            if len(self._bad_ids) >= 1 << 16:  # requests vLLM never finished here: forget the lot
                self._bad_ids.clear()
            self._bad_ids.add(rid)
            logger.warning("hixl: request %r: its id is not 1 to %d bytes of UTF-8 without NUL, so hixl moves none "
                           "of its KV (computed here; a producer's hold of it ends at its lease)",
                           str(rid)[:64], _abi.MAX_ID)
        return True

    def _req(self, request: Any, flags: int = 0) -> Tuple[_abi.Request, tuple]:
        rid = _abi.id_bytes(request.request_id)
        if rid is None:  # the hooks check _refused first
            raise ValueError(f"hixl: request id {str(request.request_id)[:64]!r} is not one the plugin takes")
        params = self._params_of(request)
        r = _abi.Request(rid, len(rid), int(getattr(request, "num_prompt_tokens", 0)), params,
                         len(params) if params else 0, flags)
        return r, (rid, params)

    def _windowed(self, groups: tuple, request: Any) -> tuple:
        """groups with each sliding-window group's list cut to the window's blocks."""
        if not self._windows:
            return groups
        tokens = int(getattr(request, "num_prompt_tokens", 0) or 0)
        return tuple(window_blocks(g, *self._windows[i], tokens) if i in self._windows else g
                     for i, g in enumerate(groups))

    @staticmethod
    def _aborted(request: Any) -> bool:
        st = getattr(request, "status", None)
        return "ABORTED" in getattr(st, "name", str(st) if st is not None else "").upper()

    def _layer(self, layer_name: str) -> Optional[int]:
        """The layer id save_kv_layer / wait_for_layer_load take, None for an alias (it
        shares an earlier layer's KV: that layer moves it)."""
        if self._kv is None:
            raise RuntimeError(f"hixl: layer {layer_name!r}: no KV caches registered on this worker yet")
        if layer_name in self._kv.aliases:
            return None
        lid = self._kv.layer_ids.get(layer_name)
        if lid is None:
            raise KeyError(f"hixl: layer {layer_name!r} was not registered (known: {len(self._kv.layer_ids)} "
                           "layers)")
        return lid

    # ---- properties ----

    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return self._opts.get("prefer_cross_layer_blocks", False)  # a bool: split_config checked it

    # ---- worker side ----

    def _check_memory(self, tensors) -> None:
        """The tensors live where kv_memory says (a CUDA tensor registered as host memory
        would be read by the CPU at its device address)."""
        for t in tensors:
            cuda = getattr(t, "is_cuda", False) is True
            if cuda != self._kv_device:
                raise HixlConfigError(
                    f"register_kv_caches: a KV tensor is on {getattr(t, 'device', '?')} but kv_memory is "
                    f"{'device' if self._kv_device else 'host'}: set kv_connector_extra_config.kv_memory to "
                    f"{'device' if cuda else 'host'}")
            if cuda and self._push and self._layer_sync is None:
                self._layer_sync = _stream_sync(t)

    def register_kv_caches(self, kv_caches: Dict[str, Any]):
        # The layout comes from what vLLM says (specs, backends, its resolved layout, the
        # tensors); hixl_vllm.layout / axes only override, checked against it.
        self._check_memory(list(kv_caches.values()))
        d = layout.describe_layers(kv_caches, self._layout, self._opts.get("axes"), self._kv_cache_config,
                                   self._layer_facts(kv_caches))
        self._register(d)

    def register_cross_layers_kv_cache(self, kv_cache: Any, attn_backend: Any):
        self._check_memory([kv_cache])
        names = self._layer_names_of_config()
        facts = self._layer_facts({n: None for n in names}).get(names[0]) or layout.LayerFacts()
        facts.backend = attn_backend if attn_backend is not None else facts.backend
        kind = _abi.GROUP_MLA if self._layout == "mla" or facts.mla else _abi.GROUP_FULL_ATTENTION
        d = layout.describe_cross_layer(kv_cache, names, self._layout or "cross_layer",
                                        self._opts.get("cross_layer_axes"), kind, facts)
        self._register(d)

    def _layer_facts(self, kv_caches: Dict[str, Any]) -> Dict[str, "layout.LayerFacts"]:
        """What vLLM says of each layer's KV: its spec's sizes (kv_cache_config, per layer
        where a group holds several spec types), vLLM's block count, the model's use_mla,
        each layer's attention backend (the compilation config's forward context), and
        from vLLM 0.32 on the resolved named layout."""
        kcc = self._kv_cache_config
        num_blocks = getattr(kcc, "num_blocks", None)
        mla = bool(getattr(self._model_config, "use_mla", False)) if self._model_config is not None else False
        named = None
        cc = getattr(self._vllm_config, "cache_config", None)
        get = getattr(cc, "get_resolved_kv_cache_layout", None)
        if get is not None and getattr(cc, "kv_cache_layout", None) is not None:
            try:
                named = get().name
            except Exception:  # not resolved (a config built outside the engine): no layout from it
                named = None
        ctx = getattr(getattr(self._vllm_config, "compilation_config", None), "static_forward_context", None) or {}
        out: Dict[str, layout.LayerFacts] = {}
        for g in getattr(kcc, "kv_cache_groups", None) or []:
            spec = getattr(g, "kv_cache_spec", None)
            per = getattr(spec, "kv_cache_specs", None) or {}  # UniformTypeKVCacheSpecs
            for n in getattr(g, "layer_names", []):
                if n not in kv_caches:
                    continue
                f = layout.spec_facts(per.get(n, spec), num_blocks, mla)
                f.named = named
                mod = ctx.get(n)
                if mod is not None:
                    gb = getattr(mod, "get_attn_backend", None)
                    try:
                        f.backend = gb() if gb is not None else getattr(mod, "attn_backend", None)
                    except Exception:
                        f.backend = getattr(mod, "attn_backend", None)
                out[n] = f
        return out

    def _layer_names_of_config(self) -> list:
        names = [n for g in (getattr(self._kv_cache_config, "kv_cache_groups", None) or [])
                 for n in getattr(g, "layer_names", [])]
        if not names:
            raise layout.LayoutError("register_cross_layers_kv_cache: kv_cache_config names no layers, so the "
                                     "layer names save_kv_layer will use are unknown")
        idx = [layout.layer_index(n) for n in names]
        if all(i is not None for i in idx):
            names = [n for _, n in sorted(zip(idx, names))]
        return names

    def _total_kv_heads(self) -> int:
        """The model's KV heads over every TP rank (vLLM's get_total_num_kv_heads), 0 when
        unknown: the plugin then takes each rank's heads times the TP size."""
        if "kv_heads" in self._opts:
            return int(self._opts["kv_heads"])
        mc = self._model_config
        try:
            return int(mc.get_total_num_kv_heads()) if mc is not None else 0
        except Exception:  # a model config without it (MLA models answer 1): the plugin's default
            return 0

    def _register(self, d: layout.KVDescription) -> None:
        d.total_kv_heads = self._total_kv_heads()
        arr, n, keep = d.to_c(ctypes.sizeof(_abi.Group) if self._plugin.abi_minor >= 5 else _abi.GROUP_SIZE_1_3)
        self._call("register_kv_groups", arr, n)
        del keep
        self._kv = d
        self._lids = dict(d.layer_ids)
        self._lids.update((a, None) for a in d.aliases)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        data = connector_metadata.data
        self._call("bind_connector_meta", data, len(data))

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        self._call("clear_connector_meta")

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata):
        ids = getattr(kv_connector_metadata, "preempted_req_ids", None)
        if not ids:
            return
        c_ids, keep = _abi.ids_in(ids)
        self._call("handle_preemptions", ctypes.byref(c_ids))
        del keep

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._call("start_load_kv")

    # Called once per layer per step: one dict lookup and the op, nothing more.
    def wait_for_layer_load(self, layer_name: str) -> None:
        lid = self._lids[layer_name] if layer_name in self._lids else self._layer(layer_name)
        if lid is not None:
            st = self._f_wait_layer(self._c, lid)
            if st:
                self._plugin.check("wait_for_layer_load", st)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        lid = self._lids[layer_name] if layer_name in self._lids else self._layer(layer_name)
        if lid is not None:
            if self._layer_sync is not None:
                self._layer_sync()
            st = self._f_save_layer(self._c, lid)
            if st:
                self._plugin.check("save_kv_layer", st)

    def wait_for_save(self):
        self._call("wait_for_save")

    def get_finished(self, finished_req_ids: set) -> Tuple[Optional[set], Optional[set]]:
        c_in, keep = _abi.ids_in(finished_req_ids)
        s, r = _abi.Ids(), _abi.Ids()
        self._call("get_finished", ctypes.byref(c_in) if c_in is not None else None, ctypes.byref(s),
                   ctypes.byref(r))
        del keep
        sending, recving = self._plugin.take_ids(s), self._plugin.take_ids(r)
        return sending or None, recving or None

    def get_transfer_results(self, finished_req_ids: set) -> KVConnectorTransferResults:
        """vLLM >= 0.32: get_finished's sets, and the received requests whose load failed.
        With several KV cache groups a block id names no request (each group numbers its
        own), so vLLM takes failures per request only: the failed ones come from the
        plugin's traces of the requests just reported (outcome "failed"), and
        get_block_ids_with_load_errors then reports none. With one group the failed
        blocks are reported as before (vLLM recomputes from the first failed block)."""
        sending, recving = self.get_finished(finished_req_ids)
        failed: set = set()
        if recving and self._multi_group:
            self._drain()
            failed = self._failed & recving
            self._failed -= failed
        return KVConnectorTransferResults(finished_sending=set(sending or ()), finished_recving=set(recving or ()),
                                          failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set:
        b = _abi.Blocks()
        self._call("get_block_ids_with_load_errors", ctypes.byref(b))
        blocks = set(self._plugin.take_blocks(b))
        if blocks and self._multi_group:
            if not self._plugin.has("drain_traces") or self._traces_off:
                logger.error("hixl: %d blocks failed to load in a model of several KV cache groups, and without "
                             "the plugin's traces (trace_ring 0 or a plugin older than ABI 1.5) their requests are "
                             "unknown: vLLM stops on block-level failures here; keep trace_ring > 0", len(blocks))
                return blocks
            return set()  # reported per request, in get_transfer_results
        return blocks

    def get_block_ids_with_load_errors_array(self) -> array:
        """The same as array('Q'), for a host that wants no per-id Python objects."""
        b = _abi.Blocks()
        self._call("get_block_ids_with_load_errors", ctypes.byref(b))
        return self._plugin.take_blocks(b)

    def shutdown(self):
        if self._closed:
            return None
        self._closed = True
        try:
            self._call("shutdown")
        finally:
            self._plugin.ops.destroy(self._c)
            self._c = ctypes.c_void_p()  # NULL: a hook after this is PARAM_INVALID, not a freed connector
        return None

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        if self._crole != _abi.ROLE_WORKER:
            return None  # a scheduler connector keeps no counters
        now = self.plugin_stats()
        delta = {k: now[k] - self._last_stats.get(k, 0) for k in _MONOTONIC}
        delta.update({k: now[k] for k in _LEVELS})
        delta[HixlKVConnectorStats.TIMES] = self.transfer_times()
        self._last_stats = now
        return HixlKVConnectorStats(delta)

    def transfer_times(self) -> list:
        """The transfer time (seconds) of each request this worker moved since the last
        call: posted to last_byte of the plugin's traces (ABI 1.5's drain_traces; empty
        with an older plugin or traces off). The traces go to whoever drains them first:
        a host that drains them itself should not also read these stats."""
        self._drain()
        out, self._times = self._times, []
        return out

    def _drain(self) -> None:
        """The plugin's finished traces into the transfer times and the failed loads."""
        if not self._plugin.has("drain_traces"):
            return
        b = _abi.Buffer()
        self._call("drain_traces", ctypes.byref(b))
        for line in self._plugin.take_buffer(b).splitlines():
            try:
                t = json.loads(line)
                ph = t.get("t") or {}
                if t.get("outcome") == "ok" and "posted" in ph and "last_byte" in ph:
                    self._times.append(max(0, ph["last_byte"] - ph["posted"]) / 1e9)
                elif t.get("outcome") == "failed" and t.get("req"):
                    self._failed.add(str(t["req"]))
            except (ValueError, TypeError, AttributeError):
                continue  # a line the plugin wrote is JSON; anything else is not a trace
        if len(self._times) > 1 << 16:  # nobody reads the stats: keep the newest
            del self._times[: len(self._times) - (1 << 16)]
        if len(self._failed) > 1 << 16:
            self._failed.clear()

    def plugin_stats(self) -> Dict[str, int]:
        """The plugin's counters as they are now (get_stats_ex), since create."""
        s = _abi.StatsEx()
        s.size = ctypes.sizeof(_abi.StatsEx)
        self._call("get_stats_ex", ctypes.byref(s))
        got = s.size
        return {k: int(getattr(s, k)) if getattr(_abi.StatsEx, k).offset + 8 <= got else 0
                for k in _abi.STATS_EX_COUNTERS}

    def event_fd(self) -> int:
        """ABI 1.2's fd that polls readable once get_finished has something (hixl extension)."""
        fd = ctypes.c_int32(-1)
        self._call("get_event_fd", ctypes.byref(fd))
        return fd.value

    # ---- scheduler side ----

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        if self._refused(request):
            return 0, False
        r, keep = self._req(request)
        n, is_async = ctypes.c_int64(), ctypes.c_int32()
        self._call("get_num_new_matched_tokens", ctypes.byref(r), int(num_computed_tokens), ctypes.byref(n),
                   ctypes.byref(is_async))
        del keep
        if n.value == _abi.TOKENS_LATER:
            return None, False
        if n.value > 0 and self._remote_mismatch(request):
            return 0, False  # computed here; update_state_after_alloc with 0 frees the producer's hold
        if self._in_forward and n.value > 0:
            self._local_hit[str(request.request_id)] = int(num_computed_tokens)
        return int(n.value), bool(is_async.value) and n.value > 0

    def on_new_request(self, request: Any) -> None:
        """vLLM, as a request arrives (scheduler side): a pull consumer's request has its
        producer's hold renewed until it is scheduled, so a request that waits in vLLM's
        queues longer than the producer's lease still loads (ABI 1.6; an older plugin: as
        before, renewed only once scheduled). Best effort: a failure is logged, never
        raised into vLLM's scheduler."""
        if not self._plugin.has("on_new_request") or self._refused(request):
            return
        r, keep = self._req(request)
        try:
            self._call("on_new_request", ctypes.byref(r))
        except _abi.HixlError as e:
            logger.warning("hixl: request %r: its producer's hold is not renewed while it waits: %s",
                           str(request.request_id)[:64], e)
        del keep

    def _remote_mismatch(self, request: Any) -> bool:
        """A producer's params that cannot fill this request's blocks: another prompt length,
        or another block size (its block count for its tokens). Once the load is queued vLLM
        waits for it, so a refusal then would leave the request waiting (or stop the
        scheduler); refused here, vLLM computes the prompt itself. Said once per request."""
        p = getattr(request, "kv_transfer_params", None)
        if not isinstance(p, dict):
            return False
        mine = int(getattr(request, "num_prompt_tokens", 0) or 0)
        theirs = p.get("remote_num_tokens")
        blocks = p.get("remote_block_ids")
        bs = self._spec_block_size
        why = None
        if isinstance(theirs, int) and mine and theirs != mine:
            why = f"the producer prefilled {theirs} tokens, this request has {mine}"
        elif (isinstance(theirs, int) and bs and isinstance(blocks, list) and blocks and isinstance(blocks[0], int)
              and not self._windows and len(blocks) != -(-theirs // bs)):
            why = (f"the producer holds {len(blocks)} blocks for {theirs} tokens, {-(-theirs // bs)} of this "
                   f"instance's {bs}-token blocks: the two sides' block sizes differ")
        if why is None:
            return False
        rid = str(request.request_id)
        if rid not in self._mismatched:
            self._mismatched.add(rid)
            logger.error("hixl: request %s: not loading the producer's KV (%s); computing it here", rid, why)
        return True

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        if self._refused(request):
            return  # get_num_new_matched_tokens answered 0: nothing to load, nothing the plugin holds
        rid = str(request.request_id)
        if num_external_tokens == 0 and rid in self._load_queued:
            # vLLM's second call, once the load is done (or failed and is recomputed): the
            # load already freed the producer's blocks, so no FREE either.
            return
        if self._in_forward and num_external_tokens > 0:
            # vLLM caches (hashes) a synchronous load's full blocks as it allocates them, so
            # "unhashed" would leave them out: the load fills every block after the local hit.
            skip = self._local_hit.pop(rid, 0) // (self._spec_block_size or self._block_size or 1)
            groups = tuple(list(g)[skip:] for g in _block_groups(blocks, unhashed=False))
        else:
            groups = _block_groups(blocks, unhashed=num_external_tokens > 0)
        groups = self._windowed(groups, request)
        r, keep = self._req(request)
        if len(groups) == 1:
            p, n, a = _abi.u64_buffer(groups[0])
            self._call("update_state_after_alloc", ctypes.byref(r), p, n, int(num_external_tokens))
        else:
            arr, n, k2 = _abi.block_groups(groups)
            self._call("update_state_after_alloc_groups", ctypes.byref(r), arr, n, int(num_external_tokens))
        del keep
        if num_external_tokens > 0 and not self._in_forward:  # a load in the forward pass: vLLM's own
            self._loading[rid] = groups  # looked into only when vLLM reports invalid blocks
            self._load_queued.add(rid)
        params = getattr(request, "kv_transfer_params", None)
        if isinstance(params, dict) and params.get("do_remote_prefill"):
            # The hand-off is set up (a LOAD or EXPECT, or a FREE when nothing is to be
            # loaded): once per request, as vLLM's own connectors do. A request preempted
            # later starts again at 0 tokens, and get_num_new_matched_tokens must not send
            # it to the producer a second time (which freed its blocks once they were read).
            params["do_remote_prefill"] = False

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        b = _abi.Buffer()
        self._call("build_connector_meta", ctypes.byref(b))
        preempted = getattr(scheduler_output, "preempted_req_ids", None) or ()
        return HixlConnectorMetadata(self._plugin.take_buffer(b), preempted)

    def _finished(self, request: Any, groups: tuple) -> Tuple[bool, Optional[dict]]:
        rid = str(request.request_id)
        if self._refused(request):
            self._bad_ids.discard(request.request_id)
            return False, None  # nothing held: vLLM frees the blocks, a consumer computes the prompt
        groups = self._windowed(groups, request)
        params = getattr(request, "kv_transfer_params", None)
        if self._both and not (isinstance(params, dict) and params.get("do_remote_decode") is True):
            # kv_both: a request no proxy marked do_remote_decode (decode's own, once loaded,
            # or one served here) is no consumer's to load, so nothing is held: its blocks
            # go back now, as vLLM's connectors do it, not at the lease (every request
            # decode finished was held lease_ms). No blocks: the plugin holds none, and
            # still ends the request's consumer side (an abort's FREE included).
            groups = tuple(() for _ in groups)
        # Only a request that ran to its end hands its KV on, as with vLLM's connectors;
        # any other end (aborted, FINISHED_ERROR, FINISHED_IGNORED) is passed as an abort:
        # a producer holds nothing, a consumer that never set up its load frees the
        # producer's hold at once instead of at the lease.
        st = getattr(getattr(request, "status", None), "name", "")
        ended = st in ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_REPETITION")
        aborted = self._aborted(request) or (st.startswith("FINISHED_") and not ended)
        r, keep = self._req(request, _abi.REQ_ABORTED if aborted else 0)
        delay, out = ctypes.c_int32(0), _abi.Buffer()
        try:
            if len(groups) == 1:
                p, n, a = _abi.u64_buffer(groups[0])
                self._call("request_finished", ctypes.byref(r), p, n, ctypes.byref(delay), ctypes.byref(out))
            else:
                arr, n, k2 = _abi.block_groups(groups)
                self._call("request_finished_groups", ctypes.byref(r), arr, n, ctypes.byref(delay),
                           ctypes.byref(out))
        except _abi.HixlError as e:
            # One request the plugin refuses (a client reused the id of a request still held
            # for its consumer, or held lately) must not stop vLLM's scheduler, which an exception from this
            # hook does: nothing is held for it (outputs are written only on success), vLLM
            # frees its blocks and a consumer computes its prompt.
            logger.error("hixl: request %s: its KV is not kept for a consumer: %s", rid, e)
        del keep
        params = self._plugin.take_buffer(out)
        self._enc.pop(rid, None)
        self._mismatched.discard(rid)
        self._load_queued.discard(rid)
        self._local_hit.pop(rid, None)
        # A load still under way (the request aborted, or failed by vLLM on invalid blocks)
        # keeps its entry: vLLM holds its blocks until finished_recving, which drops it.
        if self._push and delay.value:
            self._pushing.add(rid)
        return bool(delay.value), (json.loads(params) if params else None)

    def request_finished(self, request: Any, block_ids: list) -> Tuple[bool, Optional[dict]]:
        return self._finished(request, (block_ids,))

    def request_finished_all_groups(self, request: Any, block_ids: tuple) -> Tuple[bool, Optional[dict]]:
        return self._finished(request, tuple(block_ids))

    def may_load_async(self, request: Any) -> bool:
        """vLLM >= 0.34, as a request enters the waiting queues: whether
        get_num_new_matched_tokens may answer load_async True for it. With
        --max-num-inflight-kv-loads such requests wait in a queue of their own, whose
        loads start while the running batch is full; one that then answers a synchronous
        load (or none) stops that queue until a running slot is free, holding back the
        async loads behind it (another connector's, under MultiConnector). A consumer's
        params (do_remote_prefill), as vLLM's default, but never with load_in_forward
        (every load synchronous) nor for an id the plugin refuses (nothing is loaded).
        Called often: no plugin call, no log."""
        if self._in_forward:
            return False
        params = getattr(request, "kv_transfer_params", None)
        if not (isinstance(params, dict) and params.get("do_remote_prefill")):
            return False
        return _abi.id_bytes(request.request_id) is not None

    def update_connector_output(self, connector_output: Any):
        sending = getattr(connector_output, "finished_sending", None) or set()
        if self._push and not sending <= self._pushing:
            # A push that ended before its request did (the request goes on generating):
            # vLLM frees a request's blocks on finished_sending, and asserts it finished.
            # Taken out of vLLM's set; the plugin hears of it below, so the request's
            # request_finished answers delay_free False and vLLM frees the blocks then.
            early = sending - self._pushing
            connector_output.finished_sending = sending - early
        recving = getattr(connector_output, "finished_recving", None) or set()
        self._invalid |= set(getattr(connector_output, "invalid_block_ids", None) or ())
        failed = []
        for rid in recving:
            groups = self._loading.pop(rid, ())
            if self._invalid and groups and not self._invalid.isdisjoint(itertools.chain.from_iterable(groups)):
                failed.append(rid)
                self._invalid.difference_update(itertools.chain.from_iterable(groups))
        if self._invalid:  # keep only the blocks of loads still under way: the rest match no load
            self._invalid.intersection_update(
                itertools.chain.from_iterable(itertools.chain.from_iterable(self._loading.values())))
        self._pushing -= set(sending)
        if not sending and not recving:
            return
        s, k1 = _abi.ids_in(sending)
        r, k2 = _abi.ids_in(recving)
        f, k3 = _abi.ids_in(failed)
        self._call("update_connector_output", ctypes.byref(s), ctypes.byref(r), ctypes.byref(f))

    def has_pending_push_work(self) -> bool:
        return self._push and bool(self._pushing)

    def get_push_params(self, request_id: str) -> dict:
        """Push mode, consumer scheduler, after update_state_after_alloc: the params the
        producer needs to write this request's KV into the blocks just allocated (hixl
        extension: a proxy carries them to prefill)."""
        rid = str(request_id).encode()
        out = _abi.Buffer()
        self._call("get_push_params", rid, len(rid), ctypes.byref(out))
        return json.loads(self._plugin.take_buffer(out))

    # ---- class-level hooks ----

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
        """Asks the plugin (a scheduler connector made for the question): "" is any layout."""
        doc, opts = split_config(vllm_config.kv_transfer_config)
        plugin = _abi.load_plugin(opts.get("plugin"))
        text = json.dumps(doc).encode()
        c, err = ctypes.c_void_p(), ctypes.create_string_buffer(1024)
        st = plugin.ops.create(text, len(text), _abi.ROLE_SCHEDULER, 0, 1, ctypes.byref(c), err, len(err))
        if st != _abi.SUCCESS:
            raise _abi.HixlError("create(scheduler) for get_required_kvcache_layout", st,
                                 err.value.decode(errors="replace"))
        try:
            b = _abi.Buffer()
            plugin.check("get_required_kvcache_layout", plugin.ops.get_required_kvcache_layout(c, ctypes.byref(b)))
            answer = plugin.take_buffer(b).decode()
        finally:
            plugin.ops.destroy(c)
        return answer or None

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: Any) -> KVCacheAccess:
        """vLLM >= 0.34: hixl registers the KV cache with its engine (RDMA: memory regions
        over it) and, between processes on one host, shares device memory through legacy
        CUDA IPC (cuIpcGetMemHandle), which cannot export memory vLLM maps itself: so one
        plain allocation, vLLM's extensible KV cache off (an explicit
        --enable-extensible-kv-cache is refused by vLLM, naming legacy CUDA IPC). vLLM
        reads this only for a device KV cache; the same answer on the CPU."""
        return KVCacheAccess.REGISTERS | KVCacheAccess.LEGACY_IPC

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        """vLLM >= 0.34: no. The worker's engine keeps the KV cache registered, and its
        peers hold grants to it, for the connector's life; sleep mode gives the cache's
        memory back and maps new memory on wake-up, under a registration that would then
        name freed memory. vLLM refuses enable_sleep_mode with this connector, saying so."""
        return False

    def unregister_kv_caches(self) -> None:
        """vLLM >= 0.34 calls this before it gives the KV cache's memory back (sleep mode,
        a discard, a weight update's release of an extensible cache); none of them is
        supported (supports_sleep_mode, kv_cache_access), so a call is refused before any
        memory goes: the default did nothing, and the memory would have gone with peers
        still able to reach it."""
        raise _abi.HixlError(
            "unregister_kv_caches", _abi.UNSUPPORTED,
            "hixl keeps the KV cache registered for the connector's life: releasing its memory "
            "(sleep mode, discard, a weight update's release) is not supported")

    def restore_kv_caches(self) -> None:
        """vLLM >= 0.34, after a wake-up: nothing to redo (unregister_kv_caches is refused)."""
        return

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict) -> bool:
        # Push mode acts in wait_for_layer_load / save_kv_layer (layer by layer); pull
        # does nothing there (its loads run between steps).
        return (extra_config or {}).get("mode") == "push"

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[dict] = None) -> Optional[KVConnectorStats]:
        return HixlKVConnectorStats(data)

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: dict, labelnames: list,
                           per_engine_labelvalues: dict) -> Optional[KVConnectorPromMetrics]:
        return HixlPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
