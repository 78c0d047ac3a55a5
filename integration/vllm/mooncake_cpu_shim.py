"""vLLM's MooncakeConnector on a machine with no accelerator, for compare.sh only.

vLLM 0.32's MooncakeConnectorWorker.__init__ asks torch for the current accelerator
(`torch.accelerator.current_device_index()`); a CPU-only torch raises "Cannot access
accelerator device when none is available." and the engine does not start. Nothing
else in the connector needs a device: the index is only handed back to
`current_platform.set_device`, which on the CPU platform is torch.cpu.set_device.
This subclass answers 0 for that one call while the worker is built and changes
nothing else: the transfer path is Mooncake's own (Transfer Engine, protocol tcp).

Loaded as {"kv_connector": "CpuMooncakeConnector", "kv_connector_module_path":
"mooncake_cpu_shim"} with this folder on PYTHONPATH (pd-lib.sh does both).
"""

from __future__ import annotations

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector import MooncakeConnector


class CpuMooncakeConnector(MooncakeConnector):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        if torch.accelerator.current_accelerator() is not None:
            super().__init__(vllm_config, role, kv_cache_config)
            return
        real = torch.accelerator.current_device_index
        torch.accelerator.current_device_index = lambda: 0  # the CPU is device 0
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        finally:
            torch.accelerator.current_device_index = real
