"""Tensors -> ABI 1.3's planes, as docs/plugin.md's table derives them."""

import ctypes

import pytest
import torch

from hixl_vllm import _abi, layout


def one(t, lay, axes=None):
    d = layout.describe_layers({"model.layers.0.attn": t}, lay, axes)
    assert len(d.groups) == 1
    return d.groups[0]


def test_packed():
    t = torch.zeros(10, 2, 16, 128, dtype=torch.float16)  # (B, H, N, 2D)
    g = one(t, "packed")
    e = 2
    # heads outermost in a block: each head's tokens together (what another TP size cuts)
    assert g.planes == [(t.data_ptr(), 2 * 16 * 128 * e, 2 * 16 * 128 * e, 16 * 128 * e, 2)]
    assert (g.num_blocks, g.block_tokens, g.elem_size, g.layout) == (10, 16, 2, "packed")


def test_kv_first_two_planes():
    t = torch.zeros(2, 10, 16, 2, 64, dtype=torch.float16)  # (2, B, N, H, D)
    g = one(t, "kv_first")
    blk = 16 * 2 * 64 * 2
    assert g.planes_per_layer == 2
    assert g.planes == [(t.data_ptr(), blk, blk, 0, 0), (t.data_ptr() + 10 * blk, blk, blk, 0, 0)]


def test_head_major_named_layout():
    whole = torch.zeros(3, 4, 10, 16, 128, dtype=torch.float16)  # LHBNC: (L, H, B, N, C)
    d = layout.describe_layers({f"model.layers.{l}.attn": whole[l] for l in range(3)}, "LHBNC")
    g = d.groups[0]
    e, run = 2, 16 * 128
    assert len(d.buffers) == 1  # views of one buffer: one buffer
    assert g.planes[1] == (whole.data_ptr() + 1 * 4 * 10 * run * e, run * e, 4 * run * e, 10 * run * e, 4)


def test_block_major_views_one_buffer():
    whole = torch.zeros(10, 3, 16, 2, 128, dtype=torch.float16)  # BLNHC
    d = layout.describe_layers({f"model.layers.{l}.attn": whole[:, l] for l in range(3)}, "BLNHC")
    g = d.groups[0]
    assert len(d.buffers) == 1 and g.layer_ids == [0, 1, 2]
    assert g.planes[2][:3] == (whole.data_ptr() + 2 * 16 * 2 * 128 * 2, 3 * 16 * 2 * 128 * 2, 16 * 2 * 128 * 2)


def test_shared_layer_is_an_alias_and_order_by_number():
    a, b = torch.zeros(4, 2, 16, 8, dtype=torch.float16), torch.zeros(4, 2, 16, 8, dtype=torch.float16)
    d = layout.describe_layers({"m.layers.10.attn": b, "m.layers.2.attn": a, "m.layers.11.attn": b}, "packed")
    assert d.layer_ids == {"m.layers.2.attn": 0, "m.layers.10.attn": 1}
    assert d.aliases == {"m.layers.11.attn": "m.layers.10.attn"}


def test_storage_fallback_torch_113():
    t = torch.zeros(4, 2, 16, 8, dtype=torch.float16)
    info = layout.TensorInfo.of(t[1:])
    assert info.storage_ptr == t.data_ptr() and info.storage_bytes == t.numel() * 2
    assert info.data_ptr == t.data_ptr() + 2 * 16 * 8 * 2


def test_bad_tensor_is_named():
    t = torch.zeros(10, 16, 2, 128, dtype=torch.float16)[:, ::2]  # tokens strided apart
    with pytest.raises(layout.LayoutError) as e:
        one(t, "BLNHC")
    assert "model.layers.0.attn" in str(e.value) and "axis N" in str(e.value)
    with pytest.raises(layout.LayoutError):
        one(torch.zeros(4, 4), "no-such-layout")



def test_overlapping_blocks_are_refused():
    """A view whose blocks share memory (as_strided, or a block axis expanded: stride 0)
    was described as planes whose blocks overlap, and the plugin takes them (it refuses
    stride 0 only): a load into one block wrote over its neighbours' KV. Now refused,
    naming the axis."""
    base = torch.zeros(1 << 15, dtype=torch.float16)
    t = base.as_strided((10, 2, 16, 64), (64, 16 * 64, 64, 1))  # (B, H, N, 2D): block b + 1 starts 64 in
    with pytest.raises(layout.LayoutError, match=r"model.layers.0.attn.*axis B .*overlaps"):
        one(t, "packed")
    with pytest.raises(layout.LayoutError, match=r"axis B \(stride 0\)"):
        one(torch.zeros(1, 2, 16, 64, dtype=torch.float16).expand(10, 2, 16, 64), "packed")
    k_in_v = base.as_strided((2, 10, 16, 2, 64), (1000, 2048, 128, 64, 1))  # (2, B, N, H, D): V inside K
    with pytest.raises(layout.LayoutError, match=r"axis S .*overlaps"):
        one(k_in_v, "kv_first")


def test_cross_layer():
    t = torch.zeros(10, 3, 2, 16, 2, 64, dtype=torch.float16)  # (B, L, 2, N, H, D)
    d = layout.describe_cross_layer(t, [f"model.layers.{l}.attn" for l in range(3)])
    g = d.groups[0]
    blk = 3 * 2 * 16 * 2 * 64 * 2
    assert g.flags == 1 and g.planes == [(t.data_ptr(), blk, blk, 0, 0)] and g.layer_ids == [0, 1, 2]


def test_hybrid_groups_sharing_tensors_are_layers():
    # vLLM's hybrid allocator shares each KV tensor between one layer of each group (their
    # blocks come from one pool): those are layers of their own, not KV sharing; within
    # one group the same view is still an alias.
    from types import SimpleNamespace as NS
    a, b = torch.zeros(4, 2, 16, 8, dtype=torch.float16), torch.zeros(4, 2, 16, 8, dtype=torch.float16)
    names = [f"m.layers.{l}.attn" for l in range(5)]
    kcc = NS(kv_cache_groups=[NS(layer_names=[names[0], names[2], names[4]], kv_cache_spec=None),
                              NS(layer_names=[names[1], names[3]],
                                 kv_cache_spec=type("SlidingWindowSpec", (), {"sliding_window": 32})())])
    d = layout.describe_layers({names[0]: a, names[1]: a, names[2]: b, names[3]: b, names[4]: b}, "packed",
                               kv_cache_config=kcc)
    assert d.layer_ids == {names[0]: 0, names[1]: 1, names[2]: 2, names[3]: 3}
    assert d.aliases == {names[4]: names[2]}
    assert [g.layer_ids for g in d.groups] == [[0, 2], [1, 3]] and len(d.buffers) == 2
    assert [g.kind for g in d.groups] == [0, 1] and d.groups[1].window_tokens == 32
    assert d.groups[0].planes[0][0] == d.groups[1].planes[0][0] == a.data_ptr()


def test_window_blocks():
    from array import array
    from hixl_vllm.connector import window_blocks
    # 100 tokens in 16-token blocks (7 blocks), a 40-token window: 61 tokens (3 blocks) skipped.
    assert window_blocks(list(range(1, 8)), 40, 16, 100) == [4, 5, 6, 7]
    assert window_blocks([0, 0, 0, 5, 6, 7, 8], 40, 16, 100) == [5, 6, 7, 8]  # vLLM's null padding
    assert window_blocks(array("Q", [0, 0, 9]), 40, 16, 100) == array("Q", [9])  # padded further: stripped
    assert window_blocks([3, 4], 400, 16, 20) == [3, 4]  # the window holds it all


def test_total_kv_heads_abi15():
    """ABI 1.5: a group split by heads carries the model's KV heads (what a rank of another TP
    size takes its heads of); an MLA group and a layer without a head axis carry none."""
    t = torch.zeros(8, 4, 16, 2 * 8, dtype=torch.bfloat16)  # packed (B, H, N, 2D): 4 of the model's heads
    d = layout.describe_layers({"model.layers.0.attn": t}, "packed")
    d.total_kv_heads = 8
    arr, n, keep = d.to_c()
    assert n == 1 and arr[0].size == ctypes.sizeof(_abi.Group) and arr[0].total_kv_heads == 8
    assert arr[0].planes[0].num_heads == 4
    m = layout.describe_layers({"model.layers.0.attn": torch.zeros(8, 16, 576, dtype=torch.bfloat16)}, "mla")
    m.total_kv_heads = 8
    arr, n, keep = m.to_c()
    assert arr[0].total_kv_heads == 0


def test_one_head_per_rank():
    """A rank holding one KV head (TP at the model's heads, or past them) still says it has a
    head, so a rank of another TP size pairs heads with it (before: the size-1 axis was
    skipped, the group went without heads and the two sides' digests never matched)."""
    for shape, name in (((8, 1, 16, 2 * 8), "packed"), ((2, 8, 16, 1, 8), "kv_first")):
        t = torch.zeros(*shape, dtype=torch.bfloat16)
        d = layout.describe_layers({"model.layers.0.attn": t}, name)
        d.total_kv_heads = 8
        arr, n, keep = d.to_c()
        block = 16 * 8 * 2 * (2 if name == "packed" else 1)
        assert arr[0].planes[0].num_heads == 1 and arr[0].planes[0].block_bytes == block
        assert arr[0].planes[0].head_stride == block and arr[0].total_kv_heads == 8


def test_groups_for_an_abi13_plugin():
    """A 1.3 / 1.4 plugin steps through the groups by its own 80-byte struct: each record is
    GROUP_SIZE_1_3 bytes, says so, and holds its group (before: 88 bytes apart, so such a
    plugin read the second group from the first one's tail)."""
    t = torch.zeros(8, 4, 16, 2 * 8, dtype=torch.bfloat16)
    d = layout.describe_layers({"model.layers.0.attn": t, "model.layers.1.attn": t.clone()}, "packed")
    d.groups.append(d.groups[0])  # two groups (the same one twice is enough to see the stride)
    full, n, keep = d.to_c()
    arr, n, keep2 = d.to_c(_abi.GROUP_SIZE_1_3)
    assert _abi.GROUP_SIZE_1_3 == 80 and n == 2
    raw = ctypes.string_at(arr, 2 * _abi.GROUP_SIZE_1_3)
    for i in range(2):
        g = _abi.Group.from_buffer_copy(raw[i * 80:(i + 1) * 80] + bytes(ctypes.sizeof(_abi.Group) - 80))
        assert g.size == 80 and g.total_kv_heads == 0  # what a 1.3 plugin does not read
        for f in ("kind", "flags", "num_layers", "planes_per_layer", "num_blocks", "block_tokens", "elem_size",
                  "layout_len"):
            assert getattr(g, f) == getattr(full[i], f), f
        assert g.planes[0].block_bytes == full[i].planes[0].block_bytes and g.layer_ids[0] == full[i].layer_ids[0]


# ---- the layout read from what vLLM says (no layout option) ----

class FlashAttn:
    """An attention backend as vLLM <= 0.31 declares one: (2, B, N, H, D), NHD."""

    @staticmethod
    def get_name():
        return "FLASH_ATTN"

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):
        assert block_size % 16 == 0
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension=False):
        # cross-layer: blocks outermost, (B, L, 2, N, H, D)
        return (2, 0, 1, 3, 4, 5) if include_num_layers_dimension else (0, 1, 2, 3, 4)


class OldCpuAttn:
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):
        return (2, num_blocks, num_kv_heads, block_size, head_size)


class MlaAttn:
    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):
        return (num_blocks, block_size, head_size)


def facts(**kw):
    f = dict(block_size=16, heads=2, head_size=64, num_blocks=10)
    f.update(kw)
    return layout.LayerFacts(**f)


def derived(tensors, f, lay=None, axes=None):
    return layout.describe_layers(tensors, lay, axes, None, {n: f for n in tensors})


def test_vllm_032_named_layout_is_read_from_vllm():
    # vLLM 0.32: every layer a logical (B, H, N, C) view, C = K|V; the CPU backend's LBHNC.
    t = torch.zeros(10, 2, 16, 128)
    g = derived({"model.layers.0.attn": t}, facts(named="LBHNC")).groups[0]
    assert (g.layout, g.num_blocks, g.block_tokens, g.planes_per_layer) == ("LBHNC", 10, 16, 1)
    assert g.planes == [(t.data_ptr(), 2 * 16 * 128 * 4, 2 * 16 * 128 * 4, 16 * 128 * 4, 2)]
    # LBNHC: the same logical view, tokens outside heads in memory (strides say so)
    phys = torch.zeros(10, 16, 2, 128)
    g = derived({"model.layers.0.attn": phys.permute(0, 2, 1, 3)}, facts(named="LBNHC")).groups[0]
    assert g.layout == "LBNHC" and g.planes == [(phys.data_ptr(), 16 * 256 * 4, 16 * 256 * 4, 0, 0)]


def test_flash_attention_from_its_backend():
    t = torch.zeros(2, 10, 16, 2, 64, dtype=torch.float16)
    g = derived({"model.layers.0.attn": t}, facts(backend=FlashAttn)).groups[0]
    blk = 16 * 2 * 64 * 2
    assert g.layout == "kv_first" and g.planes_per_layer == 2
    assert g.planes == [(t.data_ptr(), blk, blk, 0, 0), (t.data_ptr() + 10 * blk, blk, blk, 0, 0)]


def test_old_cpu_backend_hnd():
    t = torch.zeros(2, 10, 2, 16, 64)
    g = derived({"model.layers.0.attn": t}, facts(backend=OldCpuAttn)).groups[0]
    assert g.layout == "kv_first_hnd" and g.planes_per_layer == 2
    assert g.planes[0] == (t.data_ptr(), 2 * 16 * 64 * 4, 2 * 16 * 64 * 4, 16 * 64 * 4, 2)


def test_mla_from_spec_and_backend():
    t = torch.zeros(10, 16, 576, dtype=torch.bfloat16)
    f = facts(backend=MlaAttn, mla=True, heads=1, head_size=576, head_size_v=0)
    g = derived({"model.layers.0.attn": t}, f).groups[0]
    assert (g.kind, g.layout, g.planes_per_layer) == (_abi.GROUP_MLA, "mla", 1)
    # without the backend, the spec's sizes alone decide it too
    g = derived({"model.layers.0.attn": t}, facts(mla=True, heads=1, head_size=576, head_size_v=0)).groups[0]
    assert (g.kind, g.layout) == (_abi.GROUP_MLA, "mla")


def test_packed_from_spec_sizes_alone():
    t = torch.zeros(10, 2, 16, 128)
    g = derived({"model.layers.0.attn": t}, facts()).groups[0]
    assert g.layout == "packed" and g.planes[0][4] == 2


def test_override_contradicting_vllm_is_refused_naming_both():
    t = torch.zeros(2, 10, 16, 2, 64)
    with pytest.raises(layout.LayoutError, match=r"'blocks_first'.*BSNHC.*FLASH_ATTN.*SBNHC"):
        derived({"model.layers.0.attn": t}, facts(backend=FlashAttn), "blocks_first")
    # the same override with no backend: the spec's sizes say SBNHC (read as blocks_first
    # the tensor would be 2 blocks)
    with pytest.raises(layout.LayoutError, match=r"'blocks_first'.*BSNHC.*spec's sizes.*SBNHC"):
        derived({"model.layers.0.attn": t}, facts(), "blocks_first")
    # and with sizes that decide nothing (heads 2 = K|V 2), the block count still refuses it
    with pytest.raises(layout.LayoutError, match=r"B is 2, not a multiple of the 10 blocks"):
        derived({"model.layers.0.attn": t}, facts(head_size=None), "blocks_first")
    # an override that agrees is taken, under its own name
    g = derived({"model.layers.0.attn": t}, facts(backend=FlashAttn), "kv_first").groups[0]
    assert g.layout == "kv_first" and g.planes_per_layer == 2


def test_named_override_must_match_vllms_resolved_layout():
    t = torch.zeros(10, 2, 16, 128)
    with pytest.raises(layout.LayoutError, match=r"LBNHC.*resolved.*LBHNC"):
        derived({"model.layers.0.attn": t}, facts(named="LBHNC"), "LBNHC")
    assert derived({"model.layers.0.attn": t}, facts(named="LBHNC"), "LBHNC").groups[0].layout == "LBHNC"
    # "packed" names the same bytes as vLLM 0.32's per-layer view
    assert derived({"model.layers.0.attn": t}, facts(named="LBHNC"), "packed").groups[0].layout == "packed"


def test_nothing_known_asks_for_the_layout():
    with pytest.raises(layout.LayoutError, match=r"cannot be told.*hixl_vllm.layout"):
        layout.describe_layers({"model.layers.0.attn": torch.zeros(10, 2, 16, 128)})


def test_kernel_blocks_make_vllm_blocks():
    # a backend whose kernels take 16-token blocks under vLLM's 32-token blocks: B counts
    # kernel blocks (2 per block), dense, so a vLLM block is one range of 2 pages
    t = torch.zeros(20, 2, 16, 128)
    g = derived({"model.layers.0.attn": t}, facts(named="LBHNC", block_size=32)).groups[0]
    page = 2 * 16 * 128 * 4
    assert (g.num_blocks, g.block_tokens) == (10, 32)
    assert g.planes == [(t.data_ptr(), 2 * page, 2 * page, 0, 0)]


def test_cross_layer_from_its_backend():
    L = 3
    phys = torch.zeros(10, L, 2, 16, 2, 64)  # FlashAttn's stride order with layers: (B, L, 2, N, H, D)
    f = facts(backend=FlashAttn)
    names = [f"model.layers.{i}.attn" for i in range(L)]
    g = layout.describe_cross_layer(phys, names, facts=f).groups[0]
    blk = L * 2 * 16 * 2 * 64 * 4
    assert g.planes == [(phys.data_ptr(), blk, blk, 0, 0)] and g.num_blocks == 10
    # the logical view (L, 2, B, N, H, D) over the same memory reads the same
    logical = phys.permute(1, 2, 0, 3, 4, 5)
    assert layout.describe_cross_layer(logical, names, facts=f).groups[0].planes == g.planes
    with pytest.raises(layout.LayoutError, match=r"cross_layer_axes reads it as BLNHC.*says BLSNHC"):
        layout.describe_cross_layer(phys, names, axes="BLNHC", facts=f)
