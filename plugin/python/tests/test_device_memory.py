"""Where the KV caches live (docs/device-memory.md): a CUDA run's connector asks the
plugin for device memory (kv_memory "device") unless the config names it; a KV tensor
on another device than kv_memory says is refused with the key to set, before the
plugin is told anything."""

import json
from types import SimpleNamespace

import pytest

import fakevllm as fv
from hixl_vllm import HixlKVConnector
from hixl_vllm._base import KVConnectorRole
from hixl_vllm.connector import HixlConfigError


def config(device, extra=None):
    ktc = fv.KVTransferConfig(kv_connector="HixlKVConnector", kv_role="kv_both",
                              kv_connector_extra_config=dict(extra or {}))
    vc = fv.VllmConfig(ktc)
    if device:
        vc.device_config = SimpleNamespace(device_type=device)
    return vc


def doc_of(c):
    return json.loads(c._text)["kv_connector_extra_config"]


@pytest.mark.parametrize("device,extra,want", [
    ("cuda", None, "device"),             # a CUDA run: device memory
    ("cpu", None, None),                  # the CPU backend: host memory (the default)
    (None, None, None),                   # vLLM does not say: host
    ("cuda", {"kv_memory": "host"}, "host"),  # named: kept
])
def test_kv_memory_from_the_device(plugin_path, device, extra, want):
    c = HixlKVConnector(config(device, extra), KVConnectorRole.SCHEDULER, None)
    try:
        assert doc_of(c).get("kv_memory") == want
    finally:
        c.shutdown()


class FakeTensor(SimpleNamespace):
    pass


def test_tensor_on_another_device_refused(plugin_path):
    import socket
    with socket.socket() as s:  # a free port for the worker's engine
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = HixlKVConnector(config("cpu", {"address": f"127.0.0.1:{port}"}), KVConnectorRole.WORKER, None)
    try:
        with pytest.raises(HixlConfigError, match="kv_memory"):
            c.register_kv_caches({"layer.0": FakeTensor(is_cuda=True, device="cuda:0")})
    finally:
        c.shutdown()
