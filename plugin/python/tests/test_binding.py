"""The binding's errors: a plugin missing, without the entry symbol or of an older ABI
names the file tried and the ABI needed; a config typo names the key and its
line:column; a failing op raises HixlError carrying the plugin's last_error()."""

import os
import re
import shutil
import subprocess

import pytest

import fakevllm as fv
import pd_router
from hixl_vllm import HixlConfigError, HixlError, HixlKVConnector, HixlPluginError, load_plugin
from hixl_vllm._base import KVConnectorRole

OLD_PLUGIN_C = r"""
#include <stddef.h>
#include <stdint.h>
struct ops { uint32_t abi_version, size; void *slots[%d]; };
static const struct ops table = {(1u << 16) | %du, (uint32_t)sizeof(struct ops), {0}};
__attribute__((visibility("default"))) uint32_t %s(uint32_t major, const struct ops **out, char *err, size_t cap) {
  (void)major; (void)err; (void)cap; *out = &table; return 0;
}
"""


def build_stub(tmp_path, minor, slots, symbol="hixl_kv_connector_entry"):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler (build-essential) is needed to build the stand-in old plugin"
    src = tmp_path / f"old_{minor}.c"
    src.write_text(OLD_PLUGIN_C % (slots, minor, symbol))
    so = tmp_path / f"libold_{minor}_{symbol}.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    return str(so)


def vconfig(role="kv_consumer", port=None, **extra):
    e = {"address": f"127.0.0.1:{port or pd_router.free_port()}", "Transport": "tcp"}
    e.update(extra)
    return fv.VllmConfig(fv.KVTransferConfig(kv_connector="HixlKVConnector", kv_connector_module_path="hixl_vllm",
                                             kv_role=role, kv_connector_extra_config=e))


def test_missing_plugin(tmp_path):
    path = str(tmp_path / "nowhere" / "libhixl_kv_connector.so")
    with pytest.raises(HixlPluginError) as e:
        load_plugin(path)
    assert path in str(e.value) and "ABI 1.3" in str(e.value)


def test_missing_plugin_by_env(tmp_path, monkeypatch):
    path = str(tmp_path / "libmissing.so")
    monkeypatch.setenv("HIXL_KV_PLUGIN", path)
    with pytest.raises(HixlPluginError) as e:
        HixlKVConnector(vconfig(), KVConnectorRole.SCHEDULER, None)
    assert path in str(e.value)


def test_older_abi(tmp_path):
    so = build_stub(tmp_path, 2, 28)  # an ABI 1.2 table: 1.0's 22 ops ... get_event_fd
    with pytest.raises(HixlPluginError) as e:
        load_plugin(so)
    msg = str(e.value)
    assert so in msg and "ABI 1.2" in msg and "needs ABI 1.3" in msg


def test_no_entry_symbol(tmp_path):
    so = build_stub(tmp_path, 3, 40, symbol="something_else")
    with pytest.raises(HixlPluginError) as e:
        load_plugin(so)
    assert so in str(e.value) and "hixl_kv_connector_entry" in str(e.value)


def test_config_typo_names_key_and_place(plugin_path):
    with pytest.raises(HixlError) as e:
        HixlKVConnector(vconfig(adress="127.0.0.1:1"), KVConnectorRole.SCHEDULER, None)
    msg = str(e.value)
    assert e.value.status_name == "PARAM_INVALID"
    assert "adress" in msg and "address" in msg
    assert re.search(r"\b\d+:\d+\b", msg), msg  # line:column in the document passed to create


def test_adapter_key_typo():
    cfg = vconfig(hixl_vllm={"layuot": "packed"})
    with pytest.raises(HixlConfigError) as e:
        HixlKVConnector(cfg, KVConnectorRole.SCHEDULER, None)
    assert "layuot" in str(e.value) and "'layout'" in str(e.value)


@pytest.mark.parametrize("extra,key", [
    ({"hixl_vllm": []}, "hixl_vllm: expected an object"),  # [], 0 and "" were taken as {}
    ({"hixl_vllm": 0}, "hixl_vllm: expected an object"),
    ({"hixl_vllm": {"prefer_cross_layer_blocks": "false"}}, "prefer_cross_layer_blocks: expected true or false"),
    ({"trace_ring": "many"}, "trace_ring: expected an integer"),  # a bare ValueError from int() before
    ({"trace_ring": None}, "trace_ring: expected an integer"),
])
def test_adapter_value_types(extra, key):
    """Adapter values of the wrong type are refused naming the key, before the plugin is made."""
    with pytest.raises(HixlConfigError, match=key):
        HixlKVConnector(vconfig(**extra), KVConnectorRole.SCHEDULER, None)


def test_failing_op_carries_last_error(plugin_path):
    w = HixlKVConnector(vconfig(), KVConnectorRole.WORKER, None)
    try:
        from hixl_vllm import HixlConnectorMetadata
        with pytest.raises(HixlError) as e:
            w.bind_connector_metadata(HixlConnectorMetadata(b"garbage, not metadata"))
        assert e.value.op == "bind_connector_meta" and e.value.status_name == "PARAM_INVALID"
        assert e.value.detail and e.value.detail in str(e.value)
        with pytest.raises(HixlError) as e:
            w.get_num_new_matched_tokens(fv.Request("r1", 16), 0)  # a scheduler op on a worker
        assert "scheduler" in e.value.detail
    finally:
        w.shutdown()


def test_hook_after_shutdown(plugin_path):
    """A hook after shutdown is the plugin's PARAM_INVALID (a NULL connector), not a call
    into the connector destroy freed (before: the handle was left set)."""
    from hixl_vllm import HixlConnectorMetadata
    w = HixlKVConnector(vconfig(), KVConnectorRole.WORKER, None)
    w.shutdown()
    with pytest.raises(HixlError) as e:
        w.bind_connector_metadata(HixlConnectorMetadata(b"x"))
    assert e.value.status_name == "PARAM_INVALID" and "NULL" in e.value.detail
    w.shutdown()  # twice: nothing more


def test_scheduler_round(plugin_path):
    """A consumer scheduler: params in as a dict, tokens out, metadata bytes in the subclass."""
    s = HixlKVConnector(vconfig(), KVConnectorRole.SCHEDULER, None)
    try:
        r = fv.Request("r1", 40, {"do_remote_prefill": True, "remote_engine": "127.0.0.1:9",
                                  "remote_request_id": "p-r1", "remote_block_ids": [7, 8, 9],
                                  "remote_num_tokens": 40})
        assert s.get_num_new_matched_tokens(r, 0) == (40, True)
        assert s.get_num_new_matched_tokens(fv.Request("r2", 40), 0) == (0, False)
        s.update_state_after_alloc(r, fv.KVCacheBlocks([[1, 2, 3]]), 40)
        m = s.build_connector_meta(fv.SchedulerOutput())
        assert type(m).__name__ == "HixlConnectorMetadata" and len(m.data) > 0
        assert s.get_required_kvcache_layout(s._vllm_config) is None  # the plugin answers "": any
    finally:
        s.shutdown()


def test_waiting_request_hold_renewed(plugin_path):
    """on_new_request (ABI 1.6): a pull consumer's request that waits to be scheduled has
    its producer's hold renewed: after a third of lease_ms the metadata carries a renewal
    (a RENEW entry: longer than an empty one), none once it is scheduled, and none for a
    request the consumer takes no KV for; a plugin without the op: nothing, as before."""
    import time
    s = HixlKVConnector(vconfig(lease_ms=30), KVConnectorRole.SCHEDULER, None)
    try:
        empty = len(s.build_connector_meta(fv.SchedulerOutput()).data)
        params = {"do_remote_prefill": True, "remote_engine": "127.0.0.1:9", "remote_request_id": "p-w1",
                  "remote_block_ids": [7, 8, 9], "remote_num_tokens": 40}
        r = fv.Request("w1", 40, dict(params))
        s.on_new_request(r)
        s.on_new_request(fv.Request("w2", 40))  # no params: nothing to renew
        time.sleep(0.02)  # past a third of the 30 ms lease: the renewal is due (the lease is tested)
        assert len(s.build_connector_meta(fv.SchedulerOutput()).data) > empty
        s.update_state_after_alloc(r, fv.KVCacheBlocks([[1, 2, 3]]), 40)  # scheduled: the load keeps it
        s.build_connector_meta(fv.SchedulerOutput())
        time.sleep(0.02)
        assert len(s.build_connector_meta(fv.SchedulerOutput()).data) == empty
        s._plugin.has = lambda name: name != "on_new_request"  # an older plugin: not called
        s.on_new_request(fv.Request("w3", 40, dict(params, remote_request_id="p-w3")))
        time.sleep(0.02)
        assert len(s.build_connector_meta(fv.SchedulerOutput()).data) == empty
    finally:
        s.shutdown()


class _Resolved:
    name = "LBHNC"


def test_worker_reads_the_layout_from_vllm(plugin_path):
    """No layout option: the worker connector takes vLLM 0.32's resolved layout and the
    spec's sizes (as vLLM hands them: cache_config, kv_cache_config, model_config); a
    layout option that contradicts them is refused naming both."""
    import torch
    from types import SimpleNamespace
    spec = fv.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, head_size_v=64)
    kcc = fv.KVCacheConfig(10, [fv.KVCacheGroupSpec(["model.layers.0.attn", "model.layers.1.attn"], spec)])
    kv = {f"model.layers.{i}.attn": torch.zeros(10, 2, 16, 128) for i in range(2)}

    def cfg(**extra):
        c = vconfig("kv_producer", **extra)
        c.cache_config = SimpleNamespace(block_size=16, kv_cache_layout="LBHNC", get_resolved_kv_cache_layout=_Resolved)
        c.model_config = SimpleNamespace(use_mla=False, get_total_num_kv_heads=lambda: 2)
        return c

    w = HixlKVConnector(cfg(), KVConnectorRole.WORKER, kcc)
    try:
        w.register_kv_caches(kv)
        g = w._kv.groups[0]
        assert (g.layout, g.num_blocks, g.block_tokens, g.layer_ids) == ("LBHNC", 10, 16, [0, 1])
    finally:
        w.shutdown()
    w = HixlKVConnector(cfg(hixl_vllm={"layout": "BLNHC"}), KVConnectorRole.WORKER, kcc)
    try:
        from hixl_vllm.layout import LayoutError
        with pytest.raises(LayoutError, match=r"BLNHC.*resolved.*LBHNC"):
            w.register_kv_caches(kv)
    finally:
        w.shutdown()


def test_params_that_cannot_fill_the_blocks_are_computed_here(plugin_path):
    """A producer's params for another prompt length, or from an instance of another block
    size, are refused before vLLM waits for a load (0 tokens: computed here), not at
    update_state_after_alloc, where a refusal would stop vLLM's scheduler."""
    s = HixlKVConnector(vconfig(), KVConnectorRole.SCHEDULER, None)  # 16-token blocks
    try:
        base = {"do_remote_prefill": True, "remote_engine": "127.0.0.1:9", "remote_request_id": "p-r1"}
        ok = fv.Request("r1", 40, dict(base, remote_block_ids=[7, 8, 9], remote_num_tokens=40))
        assert s.get_num_new_matched_tokens(ok, 0) == (40, True)
        other_len = fv.Request("r2", 40, dict(base, remote_block_ids=[7, 8, 9], remote_num_tokens=33))
        assert s.get_num_new_matched_tokens(other_len, 0) == (0, False)
        other_bs = fv.Request("r3", 40, dict(base, remote_block_ids=[7, 8], remote_num_tokens=40))  # 32-token blocks
        assert s.get_num_new_matched_tokens(other_bs, 0) == (0, False)
        # vLLM then allocates and calls update_state_after_alloc with 0: a FREE for the producer
        s.update_state_after_alloc(other_bs, fv.KVCacheBlocks([[1, 2, 3]]), 0)
        assert len(s.build_connector_meta(fv.SchedulerOutput()).data) > 0
    finally:
        s.shutdown()


def test_hybrid_load_failure_is_reported_per_request(plugin_path):
    """A model of two KV cache groups (full attention and a sliding window): vLLM 0.32
    stops on block-level load failures there (a block id names no request), so a failed
    load must come back in get_transfer_results' failed_recving, and
    get_block_ids_with_load_errors reports none. The producer here is a closed port."""
    import select
    import torch
    full = fv.FullAttentionSpec(block_size=16)
    sw = fv.SlidingWindowSpec(block_size=16, sliding_window=64)
    names = ["model.layers.0.attn", "model.layers.1.attn"]
    kcc = fv.KVCacheConfig(16, [fv.KVCacheGroupSpec([names[0]], full), fv.KVCacheGroupSpec([names[1]], sw)])
    cfg = vconfig(hixl_vllm={"layout": "packed"}, transfer_timeout_ms=2000, connect_timeout_ms=500)
    s = HixlKVConnector(cfg, KVConnectorRole.SCHEDULER, kcc)
    w = HixlKVConnector(cfg, KVConnectorRole.WORKER, kcc)
    try:
        kv = torch.zeros(16, 2, 16, 128)  # one tensor shared by a layer of each group, as vLLM's allocator does
        w.register_kv_caches({n: kv for n in names})
        dead = pd_router.free_port()  # nothing listens there
        r = fv.Request("h1", 40, {"do_remote_prefill": True, "remote_engine": f"127.0.0.1:{dead}",
                                  "remote_request_id": "p-h1", "remote_block_ids": [[7, 8, 9], [8, 9]],
                                  "remote_num_tokens": 40, "cap": "00" * 16, "tp_size": 1})
        assert s.get_num_new_matched_tokens(r, 0) == (40, True)
        s.update_state_after_alloc(r, fv.KVCacheBlocks([[1, 2, 3], [2, 3]]), 40)
        w.bind_connector_metadata(s.build_connector_meta(fv.SchedulerOutput()))
        w.start_load_kv(None)
        w.clear_connector_metadata()
        fd, res, deadline = w.event_fd(), None, 10.0
        import time
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            res = w.get_transfer_results(set())
            if res.finished_recving:
                break
            select.select([fd], [], [], max(0.0, end - time.monotonic()))
        assert res is not None and res.finished_recving == {"h1"}, res
        assert res.failed_recving == {"h1"}
        assert w.get_block_ids_with_load_errors() == set()
    finally:
        w.shutdown()
        s.shutdown()


# Request ids the plugin refuses (more than 256 bytes, a NUL, a lone surrogate): vLLM's ids
# are the client's (the request_id field of a completion request, its X-Request-Id header).
BAD_IDS = ["x" * 257, "\u00e9" * 129, "a\0b", "r-\udcff"]


@pytest.mark.parametrize("rid", BAD_IDS, ids=["long", "long-utf8", "nul", "surrogate"])
def test_request_id_the_plugin_refuses_does_not_stop_the_scheduler(plugin_path, rid):
    """Before: every scheduler hook raised (HixlError PARAM_INVALID, or UnicodeEncodeError)
    for such an id, with or without kv_transfer_params, which ends vLLM's engine: one
    client request took the instance down. Now hixl moves nothing of that request (0
    tokens, nothing held) and the other requests go on."""
    params = {"do_remote_prefill": True, "remote_engine": "127.0.0.1:9", "remote_request_id": "p-r1",
              "remote_block_ids": [7, 8, 9], "remote_num_tokens": 40}
    for role in ("kv_consumer", "kv_producer"):
        s = HixlKVConnector(vconfig(role), KVConnectorRole.SCHEDULER, None)
        try:
            for p in (None, dict(params)):
                r = fv.Request(rid, 40, p)
                assert s.get_num_new_matched_tokens(r, 0) == (0, False)
                s.update_state_after_alloc(r, fv.KVCacheBlocks([[1, 2, 3]]), 0)
                r.status = fv.RequestStatus.FINISHED_STOPPED
                assert s.request_finished(r, [1, 2, 3]) == (False, None)
            ok = fv.Request("r1", 40, dict(params) if role == "kv_consumer" else None)
            assert s.get_num_new_matched_tokens(ok, 0) == ((40, True) if role == "kv_consumer" else (0, False))
        finally:
            s.shutdown()
    w = HixlKVConnector(vconfig(), KVConnectorRole.WORKER, None)
    try:
        from hixl_vllm import HixlConnectorMetadata
        w.handle_preemptions(HixlConnectorMetadata(b"", [rid, "r1"]))  # never the plugin's: left out
        assert w.get_finished({rid}) == (None, None)
    finally:
        w.shutdown()


def test_request_id_reused_while_held_does_not_stop_the_scheduler(plugin_path):
    """A producer holds a finished request's blocks until its consumer reads them; a client
    that sends another request with the same request_id meanwhile (a retry) made
    request_finished raise (PARAM_INVALID "held already"), which ends vLLM's engine.
    Now the second is not held (its consumer computes it); the first stays held. Once it
    is released the id is refused still (the plugin remembers the ids it held lately: a
    request's capability binds its id, not one run of it), again without raising."""
    s = HixlKVConnector(vconfig("kv_producer"), KVConnectorRole.SCHEDULER, None)
    try:
        def finish():
            r = fv.Request("same", 40, {"do_remote_decode": True})
            assert s.get_num_new_matched_tokens(r, 0) == (0, False)
            s.update_state_after_alloc(r, fv.KVCacheBlocks([[1, 2, 3]]), 0)
            r.status = fv.RequestStatus.FINISHED_STOPPED
            return s.request_finished(r, [1, 2, 3])
        delay, params = finish()
        assert delay is True and params["remote_request_id"] == "same"
        assert finish() == (False, None)
        s.update_connector_output(fv.KVConnectorOutput(finished_sending={"same"}))  # the consumer read it
        assert finish() == (False, None)
    finally:
        s.shutdown()
