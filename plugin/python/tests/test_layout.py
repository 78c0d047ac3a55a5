"""Tensors -> ABI 1.3's planes, as docs/plugin.md's table derives them."""

import pytest
import torch

from hixl_vllm import layout


def one(t, lay, axes=None):
    d = layout.describe_layers({"model.layers.0.attn": t}, lay, axes)
    assert len(d.groups) == 1
    return d.groups[0]


def test_packed():
    t = torch.zeros(10, 2, 16, 128, dtype=torch.float16)  # (B, H, N, 2D)
    g = one(t, "packed")
    e = 2
    assert g.planes == [(t.data_ptr(), 2 * 16 * 128 * e, 2 * 16 * 128 * e, 0, 0)]
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


def test_cross_layer():
    t = torch.zeros(10, 3, 2, 16, 2, 64, dtype=torch.float16)  # (B, L, 2, N, H, D)
    d = layout.describe_cross_layer(t, [f"model.layers.{l}.attn" for l in range(3)])
    g = d.groups[0]
    blk = 3 * 2 * 16 * 2 * 64 * 2
    assert g.flags == 1 and g.planes == [(t.data_ptr(), blk, blk, 0, 0)] and g.layer_ids == [0, 1, 2]
