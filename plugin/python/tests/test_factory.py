"""config/examples/vllm-kv-transfer-config.json names a class vLLM's factory can load:
importlib.import_module(kv_connector_module_path), then getattr(kv_connector), as
KVConnectorFactory does for a class it has not registered; and the plugin accepts the
document."""

import importlib
import json
import os

import fakevllm as fv
from conftest import TOP
from hixl_vllm import HixlKVConnector
from hixl_vllm._base import KVConnectorRole

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
