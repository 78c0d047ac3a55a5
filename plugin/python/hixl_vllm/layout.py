"""KV tensors -> ABI 1.3's groups of planes (docs/plugin.md, "KV caches as groups of planes").

A tensor is described by its data_ptr(), shape, strides (elements) and element size, and
by what its axes mean, which vLLM does not attach to the tensor: the layout name says
it. Axis letters: B blocks, S K|V (2), N tokens of a block, H KV heads, C channels
(head_dim, or 2*head_dim where K|V are packed in C, or MLA's latent), L layers. A plane
is derived from the strides, not the order of the axes, so a permuted view (HND by
stride order) is described as it lies in memory.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _abi

# The axes of the tensor vLLM hands the connector per layer, for each layout name
# (register_kv_caches), and of the one cross-layer tensor (register_cross_layers_kv_cache).
LAYER_AXES = {
    "packed": "BHNC",  # (num_blocks, H, N, 2D): K|V packed in the last dim (vLLM PR 44455)
    "kv_first": "SBNHC",  # FlashAttention (2, num_blocks, N, H, D)
    "blocks_first": "BSNHC",  # FlashInfer (num_blocks, 2, N, H, D)
    "mla": "BNC",  # (num_blocks, N, D_latent)
    # vLLM's named layouts (PR 51718): one buffer for a group's layers, each layer the
    # view buffer.select(L, l), i.e. the name without L.
    "LBNHC": "BNHC",
    "LBHNC": "BHNC",
    "LHBNC": "HBNC",
    "BLNHC": "BNHC",
    "BLHNC": "BHNC",
    "BHLNC": "HBNC",
}
CROSS_LAYER_AXES = "BLSNHC"  # (num_blocks, L, 2, N, H, D), blocks outermost


class LayoutError(ValueError):
    """A tensor that cannot be described as planes, with what is wrong with which layer."""


@dataclass
class TensorInfo:
    """What the adapter reads from a tensor: no torch needed past this point."""

    data_ptr: int
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    elem_size: int
    storage_ptr: int  # the buffer the tensor is a view of
    storage_bytes: int
    device: str = "cpu"

    @classmethod
    def of(cls, t: Any) -> "TensorInfo":
        if hasattr(t, "untyped_storage"):  # torch >= 2.0
            s = t.untyped_storage()
            sp, sb = s.data_ptr(), s.nbytes()
        else:  # torch 1.13: TypedStorage
            s = t.storage()
            sp = s.data_ptr()
            sb = s.nbytes() if hasattr(s, "nbytes") else s.size() * t.element_size()
        return cls(int(t.data_ptr()), tuple(int(x) for x in t.shape), tuple(int(x) for x in t.stride()),
                   int(t.element_size()), int(sp), int(sb), str(t.device))


def layer_index(name: str) -> Optional[int]:
    """The model layer number in a vLLM layer name ("model.layers.12.self_attn.attn" -> 12)."""
    nums = re.findall(r"\d+", name)
    return int(nums[0]) if len(nums) == 1 else None


def planes_of(t: TensorInfo, axes: str, what: str) -> Tuple[List[Tuple[int, int, int, int, int]], int, int]:
    """The planes of one tensor whose axes are named by axes, as (base, block_stride,
    block_bytes, head_stride, num_heads); and its block count and tokens per block."""
    if len(axes) != len(t.shape):
        raise LayoutError(f"{what}: the layout names {len(axes)} axes ({axes}), the tensor has "
                          f"{len(t.shape)} (shape {t.shape})")
    if t.device != "cpu":
        raise LayoutError(f"{what}: the tensor is on {t.device}; hixl moves host memory only "
                          "(device memory is not built yet)")
    e = t.elem_size
    ib = axes.index("B")
    ic = axes.find("C")
    if ic >= 0 and t.stride[ic] != 1 and t.shape[ic] > 1:
        raise LayoutError(f"{what}: channels (axis C) are not contiguous (stride {t.stride[ic]})")
    order = sorted((i for i in range(len(axes)) if i != ib and t.shape[i] > 1), key=lambda i: t.stride[i])
    run, i_s, i_h, outer = 1, -1, -1, -1
    for a in order:
        if t.stride[a] == run:
            run *= t.shape[a]
            outer = a
        elif axes[a] == "S" and i_s < 0:
            i_s = a
        elif axes[a] == "H" and i_h < 0:
            i_h = a
        else:
            raise LayoutError(f"{what}: axis {axes[a]} (stride {t.stride[a]}) lies apart from the axes inside "
                              f"a block (contiguous for {run} elements); a plane splits only by K|V and by head")
    heads = t.shape[i_h] if i_h >= 0 else 0
    block = run * e * (heads or 1)
    head_stride = t.stride[i_h] * e if i_h >= 0 else 0
    if i_h < 0 and outer >= 0 and axes[outer] == "H":
        # Heads outermost of a contiguous block (HND: packed, LBHNC, BLHNC): each head's
        # tokens lie together, so a rank of another TP size can take its heads of it.
        heads, head_stride = t.shape[outer], t.stride[outer] * e
    nplanes = t.shape[i_s] if i_s >= 0 else 1
    planes = []
    for p in range(nplanes):
        base = t.data_ptr + (p * t.stride[i_s] * e if i_s >= 0 else 0)
        planes.append((base, t.stride[ib] * e, block, head_stride, heads))
    n = axes.find("N")
    return planes, t.shape[ib], t.shape[n] if n >= 0 else 1


@dataclass
class GroupDesc:
    kind: int
    flags: int
    layer_ids: List[int]  # dense model layer numbers (what save_kv_layer takes)
    planes_per_layer: int
    planes: List[Tuple[int, int, int, int, int]]
    num_blocks: int
    block_tokens: int
    elem_size: int
    window_tokens: int
    layout: str


@dataclass
class KVDescription:
    """Everything register_kv_groups is told, and how layer names map to its layer ids."""

    groups: List[GroupDesc] = field(default_factory=list)
    layer_ids: Dict[str, int] = field(default_factory=dict)  # name -> dense layer id
    aliases: Dict[str, str] = field(default_factory=dict)  # name -> the layer whose tensor it shares
    buffers: List[Tuple[int, int]] = field(default_factory=list)  # (storage ptr, bytes), each once
    total_kv_heads: int = 0  # the model's KV heads over every TP rank (0: the planes' heads x TP size)

    def to_c(self):
        """hixl_kv_group structs (and what keeps them alive) for register_kv_groups."""
        keep = []
        arr = (_abi.Group * len(self.groups))()
        for i, g in enumerate(self.groups):
            planes = (_abi.Plane * len(g.planes))(*[_abi.Plane(b, s, n, hs, h, 0) for b, s, n, hs, h in g.planes])
            ids = (ctypes.c_uint32 * len(g.layer_ids))(*g.layer_ids)
            name = g.layout.encode()
            keep += [planes, ids, name]
            # A group split by heads (not MLA, its planes with a head axis) says how many the
            # model has, so ranks of another TP size can take their heads of it (ABI 1.5).
            heads = self.total_kv_heads if g.kind != _abi.GROUP_MLA and any(p[4] for p in g.planes) else 0
            arr[i] = _abi.Group(ctypes.sizeof(_abi.Group), g.kind, g.flags, len(g.layer_ids),
                                ctypes.cast(ids, ctypes.POINTER(ctypes.c_uint32)), 0, g.planes_per_layer,
                                ctypes.cast(planes, ctypes.POINTER(_abi.Plane)), g.num_blocks, g.block_tokens,
                                g.elem_size, g.window_tokens, 0, name, len(name), heads, 0)
        return arr, len(self.groups), keep


def _spec_kind(spec: Any, layout: str) -> Tuple[int, int]:
    """A vLLM KVCacheSpec's group kind and sliding window (by class name: no vLLM import)."""
    name = type(spec).__name__ if spec is not None else ""
    if "Mamba" in name:
        return _abi.GROUP_MAMBA, 0
    if "SlidingWindow" in name:
        return _abi.GROUP_SLIDING_WINDOW, int(getattr(spec, "sliding_window", 0) or 0)
    if "MLA" in name or layout == "mla":
        return _abi.GROUP_MLA, 0
    return _abi.GROUP_FULL_ATTENTION, 0


def _groups_of_config(kv_cache_config: Any, names: Sequence[str]) -> List[Tuple[List[str], Any]]:
    """vLLM's KV cache groups as (layer names, spec), restricted to the layers given; one
    group of every layer when the config has none."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
    out = []
    for g in groups:
        members = [n for n in getattr(g, "layer_names", []) if n in names]
        if members:
            out.append((members, getattr(g, "kv_cache_spec", None)))
    covered = {n for m, _ in out for n in m}
    if not out or covered != set(names):
        return [(list(names), out[0][1] if len(out) == 1 else None)]
    return out


def describe_layers(kv_caches: Dict[str, Any], layout: str, axes: Optional[str] = None,
                    kv_cache_config: Any = None) -> KVDescription:
    """register_kv_caches's tensors (layer name -> tensor or TensorInfo) as groups of planes.
    A layer whose tensor is the same view as an earlier layer's of the same KV cache group
    (vLLM's KV sharing) is an alias, not a layer of its own; layers of different groups
    that share a tensor (vLLM's hybrid allocator: each KV cache tensor is shared by one
    layer of every group, the groups' blocks come from one pool) are layers of their own.
    Views of one buffer share one entry in buffers."""
    axes = axes or LAYER_AXES.get(layout)
    if not axes:
        raise LayoutError(f"layout {layout!r} is unknown: give kv_connector_extra_config.hixl_vllm.axes "
                          f"(axis letters of each layer's tensor), or one of {', '.join(LAYER_AXES)}")
    infos = {n: (t if isinstance(t, TensorInfo) else TensorInfo.of(t)) for n, t in kv_caches.items()}
    d = KVDescription()
    seen: Dict[Tuple, List[Tuple[str, Optional[int]]]] = {}
    order = list(infos)
    idx = {n: layer_index(n) for n in order}
    if all(v is not None for v in idx.values()) and len(set(idx.values())) == len(order):
        order.sort(key=lambda n: idx[n])
    group_of = {n: i for i, g in enumerate(getattr(kv_cache_config, "kv_cache_groups", None) or [])
                for n in getattr(g, "layer_names", [])}
    distinct = []
    for n in order:
        t = infos[n]
        key, g = (t.data_ptr, t.shape, t.stride), group_of.get(n)
        same = [m for m, mg in seen.get(key, ()) if g is None or mg == g]
        if same:
            d.aliases[n] = same[0]
            continue
        seen.setdefault(key, []).append((n, g))
        distinct.append(n)
        span = (t.storage_ptr, t.storage_bytes)
        if span not in d.buffers:
            d.buffers.append(span)
    d.layer_ids = {n: i for i, n in enumerate(distinct)}
    for members, spec in _groups_of_config(kv_cache_config, distinct):
        kind, window = _spec_kind(spec, layout)
        planes, ppl, nb, bt, es = [], None, None, None, None
        for n in members:
            p, blocks, tokens = planes_of(infos[n], axes, f"layer {n!r} ({layout})")
            if ppl is None:
                ppl, nb, bt, es = len(p), blocks, tokens, infos[n].elem_size
            elif (len(p), blocks, tokens, infos[n].elem_size) != (ppl, nb, bt, es):
                raise LayoutError(f"layer {n!r}: {len(p)} planes, {blocks} blocks of {tokens} tokens, element "
                                  f"{infos[n].elem_size} B; the group's first layer {members[0]!r} has "
                                  f"{ppl}, {nb}, {bt}, {es}")
            planes += p
        d.groups.append(GroupDesc(kind, 0, [d.layer_ids[n] for n in members], ppl, planes, nb, bt, es, window,
                                  layout))
    return d


def describe_cross_layer(kv_cache: Any, layer_names: Sequence[str], layout: str = "cross_layer",
                         axes: Optional[str] = None, kind: int = _abi.GROUP_FULL_ATTENTION) -> KVDescription:
    """register_cross_layers_kv_cache's one tensor: one group whose planes hold every layer
    of a block (HIXL_KV_GROUP_CROSS_LAYER)."""
    axes = axes or CROSS_LAYER_AXES
    t = kv_cache if isinstance(kv_cache, TensorInfo) else TensorInfo.of(kv_cache)
    if "L" not in axes:
        raise LayoutError(f"cross-layer axes {axes!r} name no layer axis L")
    num_layers = t.shape[axes.index("L")]
    if len(layer_names) != num_layers:
        raise LayoutError(f"cross-layer tensor holds {num_layers} layers (shape {t.shape}, axes {axes}); "
                          f"{len(layer_names)} layer names were given")
    planes, nb, bt = _cross_planes(t, axes)
    d = KVDescription(buffers=[(t.storage_ptr, t.storage_bytes)])
    d.layer_ids = {n: i for i, n in enumerate(layer_names)}
    d.groups.append(GroupDesc(kind, _abi.GROUP_CROSS_LAYER, list(range(num_layers)), len(planes), planes, nb, bt,
                              t.elem_size, 0, layout))
    return d


def _cross_planes(t: TensorInfo, axes: str):
    """A cross-layer tensor's planes: the layer axis lies inside a block like any other."""
    # Treat L as one more axis inside the block: rename it so planes_of's rules apply.
    return planes_of(t, axes.replace("L", "X"), "cross-layer tensor")
