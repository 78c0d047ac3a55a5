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


def test_decode_aborts(plugin_path):
    res = pd_router.run(requests=8, timeout=60, decode_args=["--fault", "decode-aborts", "--fault-at", "2"])
    assert res.prefill_rc == 0 and res.decode_rc == 0
    assert sorted(res.outcomes.values()) == ["aborted"] + ["verified"] * 7, res.whys
    check_clean(res)
