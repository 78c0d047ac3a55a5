"""config/examples/vllm-kv-transfer-config.json names a class vLLM's factory can load:
importlib.import_module(kv_connector_module_path), then getattr(kv_connector), as
KVConnectorFactory does for a class it has not registered; and the plugin accepts the
document."""

import importlib
import json
import os

import fakevllm as fv
import pytest
from conftest import TOP
from hixl_vllm import HixlKVConnector
from hixl_vllm._abi import UNSUPPORTED, HixlError
from hixl_vllm._base import KVCacheAccess, KVConnectorRole

EXAMPLE = os.path.join(TOP, "config", "examples", "vllm-kv-transfer-config.json")


def load_class(cfg):
    module = importlib.import_module(cfg["kv_connector_module_path"])
    return getattr(module, cfg["kv_connector"])


def test_example_names_the_connector(plugin_path):
    with open(EXAMPLE) as f:
        cfg = json.load(f)
    cls = load_class(cfg)
    assert cls is HixlKVConnector
    # The scheduler connector takes the example whole (the plugin validates it).
    c = cls(fv.VllmConfig(fv.KVTransferConfig.from_dict(cfg)), KVConnectorRole.SCHEDULER, None)
    try:
        assert c.role == KVConnectorRole.SCHEDULER
    finally:
        c.shutdown()


def test_device_cache_access_and_sleep_mode(plugin_path):
    """vLLM >= 0.34 asks a connector class how its workers reach the device KV cache, and
    whether it follows sleep mode. hixl registers the cache with its engine (RDMA) and
    shares device memory on one host through legacy CUDA IPC: one plain allocation (the
    default, IN_PROCESS, let vLLM map the cache itself, which neither can take). It keeps
    the registration for the connector's life: no sleep mode (the default said yes), and
    a call to drop the registration is refused before vLLM frees the memory (the default
    did nothing)."""
    with open(EXAMPLE) as f:
        cfg = fv.KVTransferConfig.from_dict(json.load(f))
    access = HixlKVConnector.kv_cache_access(cfg)
    assert access == KVCacheAccess.REGISTERS | KVCacheAccess.LEGACY_IPC
    assert access.needs_single_chunk()
    assert HixlKVConnector.supports_sleep_mode(cfg) is False
    c = HixlKVConnector(fv.VllmConfig(cfg), KVConnectorRole.SCHEDULER, None)
    try:
        with pytest.raises(HixlError) as e:
            c.unregister_kv_caches()
        assert e.value.status == UNSUPPORTED and "sleep mode" in str(e.value)
        assert c.restore_kv_caches() is None
    finally:
        c.shutdown()


@pytest.mark.parametrize("keys,want", [({}, True), ({"load_in_forward": True}, False), ({"mode": "push"}, True)],
                         ids=["pull", "load_in_forward", "push"])
def test_may_load_async(plugin_path, keys, want):
    """vLLM >= 0.34 asks may_load_async as a request enters its waiting queues: a yes puts
    it in the queue of async loads (--max-num-inflight-kv-loads), which starts loads while
    the running batch is full and stops at a request whose load turns out synchronous.
    vLLM's default says yes for any do_remote_prefill, also with load_in_forward, where
    every hixl load is synchronous; and for an id the plugin refuses, which loads
    nothing."""
    with open(EXAMPLE) as f:
        d = json.load(f)
    d["kv_connector_extra_config"].update(keys)
    c = HixlKVConnector(fv.VllmConfig(fv.KVTransferConfig.from_dict(d)), KVConnectorRole.SCHEDULER, None)
    try:
        assert c.may_load_async(fv.Request("r1", 40, {"do_remote_prefill": True})) is want
        assert c.may_load_async(fv.Request("r\0nul", 40, {"do_remote_prefill": True})) is False
        assert c.may_load_async(fv.Request("r2", 40, {"do_remote_prefill": False})) is False
        assert c.may_load_async(fv.Request("r3", 40, {"do_remote_decode": True})) is False
        assert c.may_load_async(fv.Request("r4", 40, None)) is False
    finally:
        c.shutdown()
