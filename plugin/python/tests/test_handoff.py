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
