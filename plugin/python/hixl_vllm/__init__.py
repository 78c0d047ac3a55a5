"""hixl as a vLLM KV connector: a ctypes binding of libhixl_kv_connector.so's C ABI
(plugin/include/hixl/hixl_kv_connector.h) and HixlKVConnector, vLLM's KVConnectorBase_V1
and SupportsHMA over it. Load it with

    --kv-transfer-config '{"kv_connector": "HixlKVConnector",
                           "kv_connector_module_path": "hixl_vllm", ...}'

docs/vllm.md has the flags and what each base-class method does here."""

from ._abi import ABI_MAJOR, ABI_MINOR_NEEDED, HixlError, HixlPluginError, Plugin, load_plugin
from ._base import USING_VLLM
from .connector import (HixlConfigError, HixlConnectorMetadata, HixlKVConnector, HixlKVConnectorStats,
                        HixlPromMetrics, split_config)

__version__ = "0.1.0"
__all__ = ["ABI_MAJOR", "ABI_MINOR_NEEDED", "HixlConfigError", "HixlConnectorMetadata", "HixlError",
           "HixlKVConnector", "HixlKVConnectorStats", "HixlPluginError", "HixlPromMetrics", "Plugin", "USING_VLLM",
           "load_plugin", "split_config"]
