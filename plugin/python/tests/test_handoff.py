"""Two processes on 127.0.0.1, prefill and decode, each driving HixlKVConnector as vLLM's
scheduler and model runner do (pd_instance.py); torch.equal on every block of every
layer; both sides hold 0 blocks after, and prefill's plugin holds none."""

import pytest

import pd_router

LAYERS = 4


def check_clean(res, sides=("prefill", "decode")):
    for name in sides:
        s = getattr(res, name)
        assert s is not None, f"{name} did not report: {res.logs}"
        assert s["blocks_free"] == s["blocks_total"], f"{name} holds {s['blocks_total'] - s['blocks_free']} blocks"
        assert s["requests_left"] == 0 and s["held"] == 0
        assert s["plugin"]["blocks_held"] == 0 and s["plugin"]["requests_held"] == 0


@pytest.mark.parametrize("mode,layout", [("pull", "packed"), ("push", "packed"), ("pull", "BLNHC"),
                                         ("push", "LBNHC"), ("pull", "mla"), ("pull", "cross_layer"),
                                         ("push", "cross_layer")])
def test_handoff(plugin_path, mode, layout):
    res = pd_router.run(mode=mode, layout=layout, requests=8, timeout=90)
    print(f"{mode} {layout}: {res.summary()} in {res.seconds:.1f} s")
    assert res.prefill_rc == 0 and res.decode_rc == 0, res.logs
    assert len(res.outcomes) == 8 and set(res.outcomes.values()) == {"verified"}, res.whys
    blocks = sum(-(-n // 16) for n in pd_router_prompts(8))
    assert res.blocks_checked == blocks * LAYERS
    check_clean(res)
    d = res.decode["plugin"]
    assert d["loads_done"] == 8 and d["loads_failed"] == 0
    if mode == "push":
        assert res.prefill["plugin"]["pushes_done"] == 8
    assert res.decode["adapter"]["loads_done"] == 8  # get_kv_connector_stats's increments


def pd_router_prompts(n, seed=1, lo=16, hi=300):
    import random
    rng = random.Random(seed)
    return [(rng.randrange(1 << 30), rng.randint(lo, hi))[1] for _ in range(n)]


def test_decode_dies(plugin_path):
    res = pd_router.run(requests=8, timeout=60, decode_args=["--fault", "decode-dies", "--fault-at", "3"],
                        extra={"prefill": {"lease_ms": 1500}}, stop_after_fault=True)
    assert res.decode_rc == -9 and res.prefill_rc == 0
    assert "lost" in res.outcomes.values() and "corrupt" not in res.outcomes.values()
    check_clean(res, ("prefill",))
    assert res.prefill["plugin"]["lease_expired"] >= 1  # the held requests freed at their lease


def test_prefill_dies(plugin_path):
    res = pd_router.run(requests=8, timeout=60, prefill_args=["--fault", "prefill-dies", "--fault-at", "3"])
    assert res.prefill_rc == -9 and res.decode_rc == 0
    out = set(res.outcomes.values())
    assert out <= {"verified", "recomputed", "lost"} and "corrupt" not in out, res.whys
    check_clean(res, ("decode",))


def test_push_decode_dies_mid_push(plugin_path):
    # Prefill has pushed half the layers of its 3rd request when the router SIGKILLs decode;
    # it then pushes the rest into the dead peer: those pushes fail, and prefill frees
    # every block it held for them.
    res = pd_router.run(mode="push", requests=8, timeout=60,
                        prefill_args=["--fault", "decode-dies-mid-push", "--fault-at", "3"],
                        extra={"prefill": {"lease_ms": 1500}}, stop_after_fault=True)
    assert any("killed decode" in line for line in res.logs), res.logs
    assert res.decode_rc == -9 and res.prefill_rc == 0, res.logs
    out = set(res.outcomes.values())
    assert "lost" in out and out <= {"verified", "lost"}, res.whys
    check_clean(res, ("prefill",))
    p = res.prefill["plugin"]
    assert p["pushes_failed"] >= 1 and p["pushes_done"] + p["pushes_failed"] >= 3, p


def test_push_prefill_dies_mid_push(plugin_path):
    # Prefill SIGKILLs itself after saving half the layers of the batch holding its 3rd
    # request: decode's requests waiting for those layers fail to load when their lease
    # ends and are recomputed (and checked); none is corrupt, decode holds 0 blocks.
    res = pd_router.run(mode="push", requests=8, timeout=60,
                        prefill_args=["--fault", "prefill-dies-mid-push", "--fault-at", "3"],
                        extra={"decode": {"lease_ms": 1500}})
    assert res.prefill_rc == -9 and res.decode_rc == 0, res.logs
    out = list(res.outcomes.values())
    assert set(out) <= {"verified", "recomputed"} and "recomputed" in out, res.whys
    assert len(out) >= 4, res.whys  # the 4 in flight when prefill died (concurrency 4) all ended
    check_clean(res, ("decode",))
    assert res.decode["plugin"]["loads_failed"] == out.count("recomputed")


def test_decode_aborts(plugin_path):
    res = pd_router.run(requests=8, timeout=60, decode_args=["--fault", "decode-aborts", "--fault-at", "2"])
    assert res.prefill_rc == 0 and res.decode_rc == 0
    assert sorted(res.outcomes.values()) == ["aborted"] + ["verified"] * 7, res.whys
    check_clean(res)


WINDOW = 64  # tokens: prompts of 16-300 tokens in 16-token blocks, so most are cut


def window_blocks(tokens, window=WINDOW, block_tokens=16):
    """vLLM's SlidingWindowManager: after `tokens` tokens the window skips
    max(0, tokens - window + 1) tokens; it keeps the blocks from the first unskipped one."""
    return -(-tokens // block_tokens) - max(0, tokens - window + 1) // block_tokens


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_handoff_hybrid(plugin_path, mode):
    # A hybrid model (SupportsHMA) as vLLM's hybrid allocator lays it out: layers 0, 2 a
    # full-attention KV cache group, layers 1, 3 a sliding-window group of 64 tokens, each
    # KV tensor shared by one layer of each group, one block pool whose block 0 is the
    # null block. Decode allocates the window's blocks only (null-padded lists), prefill
    # every block; the adapter hands the plugin exactly the window's blocks. Every block
    # that must move is compared: all of the full-attention group's, the window's of the
    # sliding one; decode's null block stays zero; both sides hold 0 blocks after.
    window = ["--window", str(WINDOW)]
    res = pd_router.run(mode=mode, requests=8, timeout=90, prefill_args=window, decode_args=window)
    print(f"{mode} hybrid: {res.summary()} in {res.seconds:.1f} s")
    assert res.prefill_rc == 0 and res.decode_rc == 0, res.logs
    assert len(res.outcomes) == 8 and set(res.outcomes.values()) == {"verified"}, res.whys
    prompts = pd_router_prompts(8)
    full = sum(-(-n // 16) for n in prompts)
    windowed = sum(window_blocks(n) for n in prompts)
    assert windowed < full  # the window cuts some requests short: their other blocks do not move
    assert res.blocks_checked == 2 * full + 2 * windowed
    token_bytes = 2 * 128 * 2  # 2 KV heads x K|V of 64 x float16
    assert res.bytes_checked == sum(2 * n + 2 * (n - (-(-n // 16) - window_blocks(n)) * 16)
                                    for n in prompts) * token_bytes
    check_clean(res)
    assert res.decode["null_block_zero"] is True and res.prefill["null_block_zero"] is True
    d = res.decode["plugin"]
    assert d["loads_done"] == 8 and d["loads_failed"] == 0
    moved = res.prefill["plugin"]["bytes_pushed"] if mode == "push" else d["bytes_loaded"]
    assert moved == res.blocks_checked * 16 * token_bytes  # whole blocks: the window's, not the skipped ones
    if mode == "push":
        assert res.prefill["plugin"]["pushes_done"] == 8


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_handoff_cuda(plugin_path, mode):
    """The KV caches in CUDA memory in both processes (torch tensors on cuda:0, so the
    adapter registers them as device memory and, pushing, waits for each layer's kernels
    before saving it), the hand-off as above over tcp (through each engine's pinned pool,
    as between hosts), every block checked on the GPU. Skipped where torch sees no GPU;
    run on a lent one as docs/device-memory.md says."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU here")
    res = pd_router.run(mode=mode, layout="packed", requests=8, timeout=120, device="cuda")
    print(f"cuda {mode}: {res.summary()} in {res.seconds:.1f} s")
    assert res.prefill_rc == 0 and res.decode_rc == 0, res.logs
    assert len(res.outcomes) == 8 and set(res.outcomes.values()) == {"verified"}, res.whys
    assert res.blocks_checked == sum(-(-n // 16) for n in pd_router_prompts(8)) * LAYERS
    check_clean(res)
    assert res.decode["plugin"]["loads_done"] == 8 and res.decode["plugin"]["loads_failed"] == 0
