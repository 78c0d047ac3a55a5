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
    if t.device != "cpu" and not t.device.startswith("cuda"):
        raise LayoutError(f"{what}: the tensor is on {t.device}; hixl moves host memory and CUDA device "
                          "memory (docs/device-memory.md)")
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
    # The axes apart from the run must not fold back into it: block b's bytes would be
    # block b + 1's too (an as_strided view; an expanded one, stride 0), and a load into
    # one block would overwrite its neighbours' KV.
    extent = run * e
    for a in sorted((a for a in (ib, i_s, i_h) if a >= 0 and t.shape[a] > 1), key=lambda a: t.stride[a]):
        if t.stride[a] * e < extent:
            raise LayoutError(f"{what}: axis {axes[a]} (stride {t.stride[a]}) overlaps the {extent} bytes inside it: "
                              "its blocks would share memory")
        extent += t.stride[a] * e * (t.shape[a] - 1)
    heads = t.shape[i_h] if i_h >= 0 else 0
    block = run * e * (heads or 1)
    head_stride = t.stride[i_h] * e if i_h >= 0 else 0
    if i_h < 0 and outer >= 0 and axes[outer] == "H":
        # Heads outermost of a contiguous block (HND: packed, LBHNC, BLHNC): each head's
        # tokens lie together, so a rank of another TP size can take its heads of it.
        heads, head_stride = t.shape[outer], t.stride[outer] * e
    if not heads and "H" in axes and t.shape[axes.index("H")] == 1:
        # One head on this rank (TP at or past the model's KV heads): the block is that head,
        # so ranks of another TP size still pair heads with it (its axis has no stride here).
        heads, head_stride = 1, block
    nplanes = t.shape[i_s] if i_s >= 0 else 1
    planes = []
    for p in range(nplanes):
        base = t.data_ptr + (p * t.stride[i_s] * e if i_s >= 0 else 0)
        planes.append((base, t.stride[ib] * e, block, head_stride, heads))
    n = axes.find("N")
    return planes, t.shape[ib], t.shape[n] if n >= 0 else 1


# ---- the layout, as vLLM tells it ----
#
# vLLM hands the connector everything needed to read its KV tensors: each layer's KV
# cache spec (block size, KV heads, head size, MLA or not), the number of blocks, each
# layer's attention backend, and from vLLM 0.32 on the resolved named layout (every
# layer then a logical (B, H, N, C) view whose strides carry the layout). The adapter
# derives each tensor's axis letters from those; the "layout" option only overrides,
# and is checked against them.

# Axis letters of the old backends' get_kv_cache_shape, by name, for messages and the
# compatibility digest (both sides derive the same name from the same vLLM).
AXES_NAMES = {"BHNC": "packed", "SBNHC": "kv_first", "BSNHC": "blocks_first", "BNC": "mla",
              "SBHNC": "kv_first_hnd", "BSHNC": "blocks_first_hnd"}
# Shapes a KV tensor of one layer may have when no backend says which: tried in order,
# each checked against the spec's sizes; two that both fit are refused as ambiguous.
_TEMPLATES = ("BHNC", "SBNHC", "BSNHC", "SBHNC", "BSHNC", "BNC")


@dataclass
class LayerFacts:
    """What vLLM says of one layer's KV: sizes from its spec, its backend, the layout."""

    block_size: Optional[int] = None  # tokens per block (the spec's; a kernel block may be smaller)
    heads: Optional[int] = None  # KV heads (head slots) on this rank
    head_size: Optional[int] = None  # K's head size (MLA: the latent's)
    head_size_v: Optional[int] = None  # V's (0 for MLA)
    mla: bool = False
    num_blocks: Optional[int] = None  # kv_cache_config.num_blocks
    backend: Any = None  # the attention backend class (get_kv_cache_shape), if any
    named: Optional[str] = None  # vLLM >= 0.32: the resolved KVCacheLayout's name

    def sizes(self) -> Dict[str, Tuple[int, ...]]:
        """Each axis letter's allowed sizes (empty: unknown)."""
        out: Dict[str, Tuple[int, ...]] = {"S": (2,)}
        if self.block_size:
            out["N"] = (self.block_size,)
        if self.heads:
            out["H"] = (self.heads,)
        if self.head_size:
            hv = self.head_size if self.head_size_v is None else self.head_size_v
            out["C"] = (self.head_size,) if self.mla else (self.head_size, self.head_size + hv)
        return out


def spec_facts(spec: Any, num_blocks: Optional[int], mla: bool = False) -> LayerFacts:
    """A vLLM KVCacheSpec's sizes (by attribute: no vLLM import)."""
    f = LayerFacts(num_blocks=num_blocks)
    if spec is None:
        return f
    f.block_size = _int(getattr(spec, "block_size", None))
    heads = None
    try:
        heads = getattr(spec, "num_heads", None)  # 0.32: head slots; raises on specs without heads
    except Exception:
        heads = None
    f.heads = _int(heads if isinstance(heads, int) else getattr(spec, "num_kv_heads", None))
    f.head_size = _int(getattr(spec, "head_size", None))
    hv = getattr(spec, "head_size_v", None)
    f.head_size_v = int(hv) if isinstance(hv, int) else None
    f.mla = mla or "MLA" in type(spec).__name__
    return f


def _int(v: Any) -> Optional[int]:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _fits(axes: str, shape: Sequence[int], f: LayerFacts) -> Optional[str]:
    """Why shape does not fit axes with f's sizes (None: it fits)."""
    if len(axes) != len(shape):
        return f"{len(shape)} axes, not {len(axes)}"
    sizes = f.sizes()
    if "S" not in axes and "C" in sizes and not f.mla and f.head_size:
        # K and V in one axis: C holds both (packed), or MLA's latent alone.
        sizes["C"] = (f.head_size + (f.head_size if f.head_size_v is None else f.head_size_v),)
    if "S" in axes and "C" in sizes:
        sizes["C"] = (f.head_size,)
    if f.mla and "H" in axes and "H" not in sizes:
        sizes["H"] = (1,)
    dims = dict(zip(axes, shape))
    for a, n in zip(axes, shape):
        if a == "B":
            if f.num_blocks and (n < f.num_blocks or n % f.num_blocks):
                return f"B is {n}, not a multiple of the {f.num_blocks} blocks"
        elif a == "N" and "N" in sizes:
            bs = sizes["N"][0]
            # A kernel block may split vLLM's block: then B counts the kernel blocks.
            split = n < bs and bs % n == 0 and f.num_blocks and dims.get("B") == f.num_blocks * (bs // n)
            if n != bs and not split:
                return f"N is {n}, vLLM's blocks hold {bs} tokens"
        elif a in sizes and n not in sizes[a]:
            return f"{a} is {n}, the spec says {' or '.join(map(str, sizes[a]))}"
    return None


def backend_axes(backend: Any, f: LayerFacts) -> Optional[str]:
    """The axis letters of backend.get_kv_cache_shape, found by asking it: each size
    changed alone shows which axis it is; what stays 2 is K|V, the rest channels.
    None when the backend has no get_kv_cache_shape (vLLM >= 0.32) or refuses the
    sizes asked."""
    fn = getattr(backend, "get_kv_cache_shape", None)
    if fn is None or not f.block_size or not f.head_size:
        return None
    heads = f.heads or 1
    try:
        base = tuple(fn(1009, f.block_size, heads, f.head_size))
        by_b = tuple(fn(1013, f.block_size, heads, f.head_size))
        by_h = tuple(fn(1009, f.block_size, heads + 1, f.head_size)) if not f.mla else base
        by_n = tuple(fn(1009, 2 * f.block_size, heads, f.head_size))
    except Exception:  # sizes the backend asserts against: no answer from it
        return None
    if not (len(base) == len(by_b) == len(by_h) == len(by_n)):
        return None
    axes = []
    for i, n in enumerate(base):
        if by_b[i] != n:
            axes.append("B")
        elif by_h[i] != n:
            axes.append("H")
        elif by_n[i] != n:
            axes.append("N")
        elif n == 2 and "S" not in axes:
            axes.append("S")
        else:
            axes.append("C")
    a = "".join(axes)
    return a if a.count("C") == 1 and a.count("B") == 1 else None


def backend_name(backend: Any) -> str:
    try:
        return str(backend.get_name())
    except Exception:
        return getattr(backend, "__name__", type(backend).__name__)


def derive_axes(t: "TensorInfo", f: LayerFacts, what: str) -> Tuple[Optional[str], str]:
    """The axis letters of one layer's tensor from what vLLM says, and where they came
    from (for messages); (None, why) when vLLM's facts do not decide them."""
    shape = t.shape
    if f.named:
        # vLLM >= 0.32: every layer a logical (B, H, N, C) view, the layout in its strides.
        why = _fits("BHNC", shape, f)
        if why:
            raise LayoutError(f"{what}: vLLM's {f.named} layout gives each layer a (B, H, N, C) view; this "
                              f"tensor (shape {shape}) does not fit it: {why}")
        return "BHNC", f"vLLM's resolved KV cache layout {f.named}"
    if f.backend is not None:
        a = backend_axes(f.backend, f)
        if a is not None:
            why = _fits(a, shape, f)
            if why:
                raise LayoutError(f"{what}: the {backend_name(f.backend)} backend's get_kv_cache_shape reads as "
                                  f"{a}; this tensor (shape {shape}) does not fit it: {why}")
            return a, f"the {backend_name(f.backend)} backend's get_kv_cache_shape ({a})"
    known = f.sizes()
    if not ("N" in known and "C" in known and ("H" in known or f.mla)):
        return None, "vLLM gave no KV cache spec with its sizes (block size, KV heads, head size)"
    fit = [a for a in _TEMPLATES if _fits(a, shape, f) is None and (f.mla or a != "BNC")]
    if f.mla:
        fit = [a for a in fit if "S" not in a] or fit
    if len(fit) == 1:
        return fit[0], f"its KV cache spec's sizes ({fit[0]})"
    if not fit:
        return None, f"its shape {shape} fits none of {', '.join(_TEMPLATES)} with the spec's sizes"
    return None, f"its shape {shape} fits {' and '.join(fit)} alike with the spec's sizes"


def layout_of_override(layout: str, axes: Optional[str], t: "TensorInfo", f: LayerFacts,
                       derived: Optional[str], source: str, what: str) -> str:
    """The axes an explicit layout (and axes) option gives this tensor, refused when
    vLLM's facts say otherwise, naming both."""
    if f.named and layout in LAYER_AXES and layout.isupper():
        # A named layout under vLLM >= 0.32: the same name is the same (B, H, N, C) views.
        if layout != f.named:
            raise LayoutError(f"{what}: hixl_vllm.layout says {layout}, vLLM resolved the KV cache layout to "
                              f"{f.named}; drop the option (the adapter reads vLLM's) or make them agree")
        return "BHNC"
    mine = axes or LAYER_AXES.get(layout)
    if not mine:
        raise LayoutError(f"layout {layout!r} is unknown: give kv_connector_extra_config.hixl_vllm.axes "
                          f"(axis letters of each layer's tensor), or one of {', '.join(LAYER_AXES)}")
    if derived is not None and derived != mine:
        raise LayoutError(f"{what}: hixl_vllm.layout {layout!r} reads the tensor (shape {t.shape}) as {mine}, "
                          f"{source} says {derived}; drop the option (the adapter reads vLLM's) or make them agree")
    why = _fits(mine, t.shape, f)
    if why:
        raise LayoutError(f"{what}: hixl_vllm.layout {layout!r} reads the tensor (shape {t.shape}) as {mine}, "
                          f"which the KV cache spec contradicts: {why}")
    return mine


def layout_name(axes: str, f: LayerFacts) -> str:
    """The layout name the plugin's compatibility digest carries for derived axes."""
    if f.named:
        return f.named
    if f.mla and axes in ("BNC", "BHNC"):
        return "mla"
    return AXES_NAMES.get(axes, "axes:" + axes)


def _manager_blocks(planes: List[Tuple[int, int, int, int, int]], nb: int, tokens: int, num_blocks: Optional[int],
                    what: str) -> Tuple[List[Tuple[int, int, int, int, int]], int, int]:
    """vLLM's blocks where the tensor counts kernel blocks (a backend whose kernels take
    smaller blocks: B = num_blocks x r, N = block_size / r, r kernel blocks dense in a
    block). Heads then lie apart inside a block, so no head split is offered."""
    if not num_blocks or nb == num_blocks:
        return planes, nb, tokens
    r = nb // num_blocks
    out = []
    for base, stride, blk, hs, h in planes:
        if stride != blk:
            raise LayoutError(f"{what}: {nb} kernel blocks for vLLM's {num_blocks} blocks, but they are not dense "
                              f"(stride {stride} B, {blk} B each): a block is not one range")
        out.append((base, stride * r, blk * r, 0, 0))
    return out, num_blocks, tokens * r


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

    def to_c(self, group_size: int = ctypes.sizeof(_abi.Group)):
        """hixl_kv_group structs (and what keeps them alive) for register_kv_groups; group_size
        smaller than this build's (_abi.GROUP_SIZE_1_3, for a 1.3 or 1.4 plugin, which steps
        through the array by its own struct's size): records that many bytes apart."""
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
        if group_size < ctypes.sizeof(_abi.Group):
            raw = ctypes.create_string_buffer(group_size * len(self.groups))
            for i in range(len(self.groups)):
                arr[i].size = group_size
                ctypes.memmove(ctypes.addressof(raw) + i * group_size, ctypes.addressof(arr[i]), group_size)
            keep.append(raw)
            arr = ctypes.cast(raw, ctypes.POINTER(_abi.Group))
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


def describe_layers(kv_caches: Dict[str, Any], layout: Optional[str] = None, axes: Optional[str] = None,
                    kv_cache_config: Any = None, facts: Optional[Dict[str, LayerFacts]] = None) -> KVDescription:
    """register_kv_caches's tensors (layer name -> tensor or TensorInfo) as groups of planes.
    Each tensor's axes come from what vLLM says (facts: per layer, else the group's spec
    in kv_cache_config); layout / axes override, checked against it. A layer whose
    tensor is the same view as an earlier layer's of the same KV cache group (vLLM's KV
    sharing) is an alias, not a layer of its own; layers of different groups that share
    a tensor (vLLM's hybrid allocator: each KV cache tensor is shared by one layer of
    every group, the groups' blocks come from one pool) are layers of their own. Views
    of one buffer share one entry in buffers."""
    if layout is not None and not axes and layout not in LAYER_AXES:
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
    num_blocks = _int(getattr(kv_cache_config, "num_blocks", None))
    for members, spec in _groups_of_config(kv_cache_config, distinct):
        planes, ppl, nb, bt, es, name, mla = [], None, None, None, None, None, False
        for n in members:
            what = f"layer {n!r}"
            f = (facts or {}).get(n) or spec_facts(spec, num_blocks)
            derived, source = derive_axes(infos[n], f, what)
            if layout is not None or axes:
                a = layout_of_override(layout or "axes", axes, infos[n], f, derived, source, what)
                lname = layout or "axes:" + a
            elif derived is not None:
                a, lname = derived, layout_name(derived, f)
            else:
                raise LayoutError(f"{what}: the KV layout of this tensor (shape {infos[n].shape}) cannot be told: "
                                  f"{source}; name it with kv_connector_extra_config.hixl_vllm.layout")
            p, blocks, tokens = planes_of(infos[n], a, f"{what} ({lname})")
            p, blocks, tokens = _manager_blocks(p, blocks, tokens, f.num_blocks, what)
            if ppl is None:
                ppl, nb, bt, es, name, mla = len(p), blocks, tokens, infos[n].elem_size, lname, f.mla
            elif (len(p), blocks, tokens, infos[n].elem_size) != (ppl, nb, bt, es):
                raise LayoutError(f"layer {n!r}: {len(p)} planes, {blocks} blocks of {tokens} tokens, element "
                                  f"{infos[n].elem_size} B; the group's first layer {members[0]!r} has "
                                  f"{ppl}, {nb}, {bt}, {es}")
            planes += p
        kind, window = _spec_kind(spec, "mla" if mla else (name or ""))
        d.groups.append(GroupDesc(kind, 0, [d.layer_ids[n] for n in members], ppl, planes, nb, bt, es, window,
                                  name))
    return d


def cross_layer_axes(t: "TensorInfo", num_layers: int, f: LayerFacts) -> Tuple[Optional[str], str]:
    """The cross-layer tensor's axis letters from its attention backend: vLLM lays it out
    as (num_layers, *get_kv_cache_shape(...)), physically ordered by
    get_kv_cache_stride_order(include_num_layers_dimension=True); the tensor handed over
    is either that logical view or the physical one. (None, why) when undecided."""
    if f.backend is None:
        return None, "no attention backend was handed with it"
    a = backend_axes(f.backend, f)
    if a is None:
        return None, f"the {backend_name(f.backend)} backend's get_kv_cache_shape did not answer"
    letters = "L" + a
    if not f.num_blocks:
        return None, "kv_cache_config gave no block count"
    try:
        logical = (num_layers,) + tuple(f.backend.get_kv_cache_shape(f.num_blocks, f.block_size, f.heads or 1,
                                                                     f.head_size))
    except Exception as e:
        return None, f"the {backend_name(f.backend)} backend's get_kv_cache_shape failed: {e}"
    if tuple(t.shape) == logical:
        return letters, f"the {backend_name(f.backend)} backend ({letters}, logical)"
    try:
        perm = tuple(f.backend.get_kv_cache_stride_order(include_num_layers_dimension=True))
    except Exception:
        perm = ()
    if sorted(perm) == list(range(len(letters))) and tuple(t.shape) == tuple(logical[i] for i in perm):
        phys = "".join(letters[i] for i in perm)
        return phys, f"the {backend_name(f.backend)} backend ({phys}, its stride order)"
    raise LayoutError(f"cross-layer tensor: shape {t.shape} is neither the {backend_name(f.backend)} backend's "
                      f"(layers, *get_kv_cache_shape) = {logical} ({letters}) nor that in its stride order {perm}")


def describe_cross_layer(kv_cache: Any, layer_names: Sequence[str], layout: str = "cross_layer",
                         axes: Optional[str] = None, kind: int = _abi.GROUP_FULL_ATTENTION,
                         facts: Optional[LayerFacts] = None) -> KVDescription:
    """register_cross_layers_kv_cache's one tensor: one group whose planes hold every layer
    of a block (HIXL_KV_GROUP_CROSS_LAYER). Its axes come from the attention backend
    handed with it (facts.backend); axes overrides, checked against the backend."""
    t = kv_cache if isinstance(kv_cache, TensorInfo) else TensorInfo.of(kv_cache)
    f = facts or LayerFacts()
    derived, source = cross_layer_axes(t, len(layer_names), f)
    if axes and derived and axes != derived:
        raise LayoutError(f"cross-layer tensor (shape {t.shape}): hixl_vllm.cross_layer_axes reads it as {axes}, "
                          f"{source} says {derived}; drop the option or make them agree")
    axes = axes or derived or CROSS_LAYER_AXES
    if "L" not in axes:
        raise LayoutError(f"cross-layer axes {axes!r} name no layer axis L")
    if len(axes) != len(t.shape):
        raise LayoutError(f"cross-layer tensor: shape {t.shape} has {len(t.shape)} axes, {axes} names {len(axes)}"
                          + ("" if derived else f" ({source}; give hixl_vllm.cross_layer_axes)"))
    num_layers = t.shape[axes.index("L")]
    if len(layer_names) != num_layers:
        raise LayoutError(f"cross-layer tensor holds {num_layers} layers (shape {t.shape}, axes {axes}); "
                          f"{len(layer_names)} layer names were given")
    why = _fits(axes.replace("L", ""), tuple(n for a, n in zip(axes, t.shape) if a != "L"), f)
    if why:
        raise LayoutError(f"cross-layer tensor (shape {t.shape}, axes {axes}): the KV cache spec contradicts it: {why}")
    if f.mla and kind == _abi.GROUP_FULL_ATTENTION:
        kind = _abi.GROUP_MLA
    planes, nb, bt = _cross_planes(t, axes)
    planes, nb, bt = _manager_blocks(planes, nb, bt, f.num_blocks, "cross-layer tensor")
    d = KVDescription(buffers=[(t.storage_ptr, t.storage_bytes)])
    d.layer_ids = {n: i for i, n in enumerate(layer_names)}
    d.groups.append(GroupDesc(kind, _abi.GROUP_CROSS_LAYER, list(range(num_layers)), len(planes), planes, nb, bt,
                              t.elem_size, 0, layout))
    return d


def _cross_planes(t: TensorInfo, axes: str):
    """A cross-layer tensor's planes: the layer axis lies inside a block like any other."""
    # Treat L as one more axis inside the block: rename it so planes_of's rules apply.
    return planes_of(t, axes.replace("L", "X"), "cross-layer tensor")
