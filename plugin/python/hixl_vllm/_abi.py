"""ctypes binding of plugin/include/hixl/hixl_kv_connector.h (ABI 1.3).

Only the C ABI crosses here: the structs as the header lays them out, the ops table
read up to the size the plugin reports, and one Python call per op. Every failing op
raises HixlError carrying the plugin's last_error() text. Block ids cross as
array('Q') buffers, never one ctypes call per id.
"""

from __future__ import annotations

import ctypes
import os
from array import array
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_int32, c_int64, c_size_t, c_uint8,
                    c_uint32, c_uint64, c_void_p)
from typing import Iterable, Optional, Sequence

ABI_MAJOR = 1
ABI_MINOR_NEEDED = 3  # register_kv_groups, get_stats_ex, the *_groups ops, handle_preemptions
ENTRY_SYMBOL = "hixl_kv_connector_entry"
LIBRARY_NAME = "libhixl_kv_connector.so"

# Status values (HixlStatus's), as the header names them.
SUCCESS = 0
STATUS_NAMES = {
    0: "SUCCESS",
    103900: "PARAM_INVALID",
    103901: "TIMEOUT",
    103902: "NOT_CONNECTED",
    103905: "UNSUPPORTED",
    103906: "NOT_FOUND",
    203900: "RESOURCE_EXHAUSTED",
    503900: "FAILED",
}
UNSUPPORTED = 103905

ROLE_SCHEDULER = 0
ROLE_WORKER = 1
MAX_ID = 256  # the most bytes of a request id the plugin takes (no NUL among them)
TOKENS_LATER = -1
REQ_ABORTED = 0x1

GROUP_FULL_ATTENTION = 0
GROUP_SLIDING_WINDOW = 1
GROUP_MLA = 2
GROUP_MAMBA = 3
GROUP_CROSS_LAYER = 0x1


class HixlError(RuntimeError):
    """An op of the plugin failed: which op, its status and the plugin's last_error()."""

    def __init__(self, op: str, status: int, detail: str):
        self.op = op
        self.status = status
        self.status_name = STATUS_NAMES.get(status, str(status))
        self.detail = detail
        super().__init__(f"hixl: {op} failed ({self.status_name}): {detail}")


class HixlPluginError(HixlError):
    """The plugin could not be loaded, or is too old: names the file tried and the ABI needed."""

    def __init__(self, path: str, detail: str):
        self.path = path
        RuntimeError.__init__(
            self, f"hixl: cannot use the KV connector plugin {path!r}: {detail} "
            f"(hixl_vllm needs ABI {ABI_MAJOR}.{ABI_MINOR_NEEDED} or later; set HIXL_KV_PLUGIN, "
            f"or kv_connector_extra_config.hixl_vllm.plugin, to a libhixl_kv_connector.so that has it)")
        self.op = "load"
        self.status = -1
        self.status_name = "LOAD"
        self.detail = detail


# ---- the structs, as the header lays them out ----


class Request(Structure):
    _fields_ = [("req_id", c_char_p), ("req_id_len", c_size_t), ("num_prompt_tokens", c_uint64),
                ("kv_transfer_params", c_char_p), ("kv_transfer_params_len", c_size_t), ("flags", c_uint32)]


class Buffer(Structure):
    _fields_ = [("data", POINTER(c_uint8)), ("len", c_size_t)]


class Ids(Structure):
    _fields_ = [("ids", POINTER(c_char_p)), ("count", c_size_t)]


class Blocks(Structure):
    _fields_ = [("ids", POINTER(c_uint64)), ("count", c_size_t), ("raw", Buffer)]


class Layer(Structure):
    _fields_ = [("name", c_char_p), ("name_len", c_size_t), ("base", ctypes.c_size_t), ("num_blocks", c_uint64),
                ("block_bytes", c_uint64), ("v_offset", c_uint64), ("layout", c_uint32), ("elem_size", c_uint32),
                ("block_tokens", c_uint32)]


class Stats(Structure):
    _fields_ = [(n, c_uint64) for n in ("blocks_held", "requests_held", "loads_done", "loads_failed",
                                        "lease_expired", "bytes_loaded", "engine_ops", "lookups",
                                        "pushes_done", "pushes_failed", "layers_pushed")]


STATS_EX_COUNTERS = ("blocks_held", "requests_held", "loads_done", "loads_failed", "lease_expired",
                     "bytes_loaded", "engine_ops", "lookups", "pushes_done", "pushes_failed", "layers_pushed",
                     "bytes_pushed", "cap_refused")  # cap_refused: ABI 1.4 (an older plugin leaves it 0)


class StatsEx(Structure):
    _fields_ = [("size", c_uint32), ("reserved", c_uint32)] + [(n, c_uint64) for n in STATS_EX_COUNTERS]


class Plane(Structure):
    _fields_ = [("base", c_size_t), ("block_stride", c_uint64), ("block_bytes", c_uint64),
                ("head_stride", c_uint64), ("num_heads", c_uint32), ("reserved", c_uint32)]


class Group(Structure):
    _fields_ = [("size", c_uint32), ("kind", c_uint32), ("flags", c_uint32), ("num_layers", c_uint32),
                ("layer_ids", POINTER(c_uint32)), ("first_layer", c_uint32), ("planes_per_layer", c_uint32),
                ("planes", POINTER(Plane)), ("num_blocks", c_uint64), ("block_tokens", c_uint32),
                ("elem_size", c_uint32), ("window_tokens", c_uint32), ("reserved", c_uint32),
                ("layout", c_char_p), ("layout_len", c_size_t),
                # 1.5: the model's KV heads over every TP rank (a 1.3 / 1.4 plugin reads the size
                # and takes the group without them)
                ("total_kv_heads", c_uint32), ("reserved2", c_uint32)]


# A 1.3 / 1.4 plugin's hixl_kv_group: it steps through an array by this size.
GROUP_SIZE_1_3 = Group.total_kv_heads.offset


class BlockIds(Structure):
    _fields_ = [("ids", POINTER(c_uint64)), ("count", c_size_t)]


_C = c_void_p  # hixl_kv_connector *
_st = c_uint32
_OPS = [
    # ---- 1.0 ----
    ("create", CFUNCTYPE(_st, c_char_p, c_size_t, c_int32, c_uint32, c_uint32, POINTER(c_void_p), POINTER(c_char),
                         c_size_t)),
    ("destroy", CFUNCTYPE(_st, _C)),
    ("shutdown", CFUNCTYPE(_st, _C)),
    ("last_error", CFUNCTYPE(c_char_p)),
    ("free_buffer", CFUNCTYPE(None, POINTER(Buffer))),
    ("free_ids", CFUNCTYPE(None, POINTER(Ids))),
    ("get_num_new_matched_tokens", CFUNCTYPE(_st, _C, POINTER(Request), c_uint64, POINTER(c_int64),
                                             POINTER(c_int32))),
    ("update_state_after_alloc", CFUNCTYPE(_st, _C, POINTER(Request), POINTER(c_uint64), c_size_t, c_uint64)),
    ("build_connector_meta", CFUNCTYPE(_st, _C, POINTER(Buffer))),
    ("request_finished", CFUNCTYPE(_st, _C, POINTER(Request), POINTER(c_uint64), c_size_t, POINTER(c_int32),
                                   POINTER(Buffer))),
    ("update_connector_output", CFUNCTYPE(_st, _C, POINTER(Ids), POINTER(Ids), POINTER(Ids))),
    ("set_handshake_metadata", CFUNCTYPE(_st, _C, c_char_p, c_size_t)),
    ("register_kv_caches", CFUNCTYPE(_st, _C, POINTER(Layer), c_size_t)),
    ("bind_connector_meta", CFUNCTYPE(_st, _C, c_char_p, c_size_t)),
    ("clear_connector_meta", CFUNCTYPE(_st, _C)),
    ("start_load_kv", CFUNCTYPE(_st, _C)),
    ("wait_for_layer_load", CFUNCTYPE(_st, _C, c_uint32)),
    ("save_kv_layer", CFUNCTYPE(_st, _C, c_uint32)),
    ("wait_for_save", CFUNCTYPE(_st, _C)),
    ("get_finished", CFUNCTYPE(_st, _C, POINTER(Ids), POINTER(Ids), POINTER(Ids))),
    ("get_block_ids_with_load_errors", CFUNCTYPE(_st, _C, POINTER(Blocks))),
    ("get_handshake_metadata", CFUNCTYPE(_st, _C, POINTER(Buffer))),
    ("get_stats", CFUNCTYPE(_st, _C, POINTER(Stats))),
    ("get_push_params", CFUNCTYPE(_st, _C, c_char_p, c_size_t, POINTER(Buffer))),
    # ---- 1.1 ----
    ("alloc_kv_caches", CFUNCTYPE(_st, _C, POINTER(Layer), c_size_t)),
    # ---- 1.2 ----
    ("get_event_fd", CFUNCTYPE(_st, _C, POINTER(c_int32))),
    # ---- 1.3 ----
    ("get_stats_ex", CFUNCTYPE(_st, _C, POINTER(StatsEx))),
    ("register_kv_groups", CFUNCTYPE(_st, _C, POINTER(Group), c_size_t)),
    ("alloc_kv_memory", CFUNCTYPE(_st, _C, c_uint64, POINTER(c_size_t))),
    ("update_state_after_alloc_groups", CFUNCTYPE(_st, _C, POINTER(Request), POINTER(BlockIds), c_size_t,
                                                  c_uint64)),
    ("request_finished_groups", CFUNCTYPE(_st, _C, POINTER(Request), POINTER(BlockIds), c_size_t,
                                          POINTER(c_int32), POINTER(Buffer))),
    ("handle_preemptions", CFUNCTYPE(_st, _C, POINTER(Ids))),
    ("get_required_kvcache_layout", CFUNCTYPE(_st, _C, POINTER(Buffer))),
    ("build_connector_worker_meta", CFUNCTYPE(_st, _C, POINTER(Buffer))),
    # ---- 1.5 (optional here: used when the table has them) ----
    ("render_metrics", CFUNCTYPE(_st, _C, POINTER(Buffer))),
    ("drain_traces", CFUNCTYPE(_st, _C, POINTER(Buffer))),
    # ---- 1.6 (optional here) ----
    ("on_new_request", CFUNCTYPE(_st, _C, POINTER(Request))),
]
# The last op the adapter needs: a table that ends before it is too old.
_LAST_NEEDED = "build_connector_worker_meta"


class Ops(Structure):
    _fields_ = [("abi_version", c_uint32), ("size", c_uint32)] + _OPS


_ENTRY = CFUNCTYPE(_st, c_uint32, POINTER(POINTER(Ops)), POINTER(c_char), c_size_t)


def _op_end(name: str) -> int:
    f = getattr(Ops, name)
    return f.offset + f.size


# ---- finding and loading the plugin ----


def candidate_paths(explicit: Optional[str] = None) -> list:
    """Where the plugin is looked for, in order: the path the config names, $HIXL_KV_PLUGIN,
    the library installed next to this package, then the loader's path (bare name)."""
    if explicit:
        return [explicit]
    env = os.environ.get("HIXL_KV_PLUGIN")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    out = [p for p in (os.path.join(here, LIBRARY_NAME), os.path.join(here, "lib", LIBRARY_NAME))
           if os.path.exists(p)]
    return out + [LIBRARY_NAME]


class Plugin:
    """One loaded libhixl_kv_connector.so and its ops table (ABI 1.3 or later)."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            raise HixlPluginError(path, f"dlopen failed: {e}") from None
        try:
            entry = _ENTRY((ENTRY_SYMBOL, self._lib))
        except AttributeError:
            raise HixlPluginError(path, f"it does not export {ENTRY_SYMBOL}") from None
        err = ctypes.create_string_buffer(512)
        ops = POINTER(Ops)()
        st = entry(ABI_MAJOR, ctypes.byref(ops), err, len(err))
        if st != SUCCESS or not ops:
            raise HixlPluginError(path, f"{ENTRY_SYMBOL}({ABI_MAJOR}) answered "
                                  f"{STATUS_NAMES.get(st, st)}: {err.value.decode(errors='replace')}")
        head = ops.contents
        self.abi_version = head.abi_version
        self.abi_major, self.abi_minor = head.abi_version >> 16, head.abi_version & 0xFFFF
        self.size = head.size
        if self.abi_major != ABI_MAJOR or self.abi_minor < ABI_MINOR_NEEDED or self.size < _op_end(_LAST_NEEDED):
            raise HixlPluginError(path, f"it implements ABI {self.abi_major}.{self.abi_minor} "
                                  f"(ops table of {self.size} bytes; {_op_end(_LAST_NEEDED)} needed)")
        self.ops = head
        self._last_error = head.last_error
        self._free_buffer = head.free_buffer
        self._free_ids = head.free_ids

    def has(self, name: str) -> bool:
        return self.size >= _op_end(name)

    def last_error(self) -> str:
        s = self._last_error()
        return s.decode(errors="replace") if s else ""

    def check(self, op: str, st: int) -> None:
        if st != SUCCESS:
            raise HixlError(op, st, self.last_error())

    # Memory the plugin returns, copied out and released at once.
    def take_buffer(self, b: Buffer) -> bytes:
        try:
            return ctypes.string_at(b.data, b.len) if b.len else b""
        finally:
            self._free_buffer(ctypes.byref(b))

    def take_ids(self, ids: Ids) -> set:
        try:
            return {ids.ids[i].decode() for i in range(ids.count)}
        finally:
            self._free_ids(ctypes.byref(ids))

    def take_blocks(self, b: Blocks) -> array:
        out = array("Q")
        try:
            if b.count:
                out.frombytes(ctypes.string_at(b.ids, b.count * 8))
        finally:
            self._free_buffer(ctypes.byref(b.raw))
        return out


def load_plugin(explicit: Optional[str] = None) -> Plugin:
    """The plugin from the first candidate that loads; the error of the last one tried."""
    last = None
    for path in candidate_paths(explicit):
        try:
            return Plugin(path)
        except HixlPluginError as e:
            last = e
            if path != LIBRARY_NAME and os.path.exists(path):
                raise  # a file that is there but unusable: say so, do not look further
    assert last is not None
    raise last


# ---- helpers for arguments ----


def id_bytes(s: str) -> Optional[bytes]:
    """A request id as the plugin takes it (UTF-8, 1 to MAX_ID bytes, no NUL), or None
    for one it refuses: vLLM's ids are the client's (a request's request_id field, its
    X-Request-Id header), so any str can come."""
    try:
        b = str(s).encode()
    except UnicodeEncodeError:  # a lone surrogate
        return None
    return b if 0 < len(b) <= MAX_ID and b"\0" not in b else None


def ids_in(strings: Optional[Iterable[str]]):
    """A hixl_kv_ids for strings (kept alive by the returned tuple), or None. Ids the
    plugin refuses (id_bytes) are left out: it never held them, so they name nothing of
    its (and one cut at a NUL would name another request)."""
    if strings is None:
        return None, None
    enc = [b for b in map(id_bytes, strings) if b is not None]
    arr = (c_char_p * max(1, len(enc)))(*enc)
    return Ids(arr, len(enc)), arr


def u64_buffer(ids) -> tuple:
    """A pointer to ids as uint64 (array('Q') is used in place; anything else is copied into
    one, a C-level copy), its count, and the object that keeps it alive."""
    if not isinstance(ids, array) or ids.typecode != "Q":
        ids = array("Q", ids)
    n = len(ids)
    if n == 0:
        return None, 0, ids
    return (c_uint64 * n).from_buffer(ids), n, ids


def block_groups(groups: Sequence) -> tuple:
    """hixl_kv_block_ids per group, and what keeps them alive."""
    keep = []
    arr = (BlockIds * max(1, len(groups)))()
    for i, g in enumerate(groups):
        p, n, a = u64_buffer(g)
        keep.append((p, a))
        arr[i].ids = ctypes.cast(p, POINTER(c_uint64)) if p is not None else None
        arr[i].count = n
    return arr, len(groups), keep
