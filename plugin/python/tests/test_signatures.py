"""The adapter's classes have every method name and parameter of the base classes they
implement: the stand-ins always, vLLM's own when vLLM is installed."""

import inspect

import pytest

import hixl_vllm
from hixl_vllm import _standin, connector

# vLLM's KVConnectorBase_V1 methods and properties in 2026 (docs/vllm.md lists them);
# the stand-in must carry each, so a vLLM change shows up here when the list is updated.
VLLM_BASE_API = """prefer_cross_layer_blocks supports_eagle_prefix_cache_hashing requires_kv_delivery
set_eagle_prefix_cache_hashing role bind_connector_metadata clear_connector_metadata has_connector_metadata
register_kv_caches register_cross_layers_kv_cache set_host_xfer_buffer_ops handle_preemptions start_load_kv
wait_for_layer_load save_kv_layer wait_for_save get_finished get_block_ids_with_load_errors shutdown
get_kv_connector_stats get_kv_connector_kv_cache_events get_handshake_metadata build_connector_worker_meta
bind_gpu_block_pool get_num_new_matched_tokens update_state_after_alloc build_connector_meta on_new_request
update_connector_output request_finished take_events has_pending_push_work get_required_kvcache_layout
requires_piecewise_for_cudagraph get_finished_count build_kv_connector_stats set_xfer_handshake_metadata
set_xfer_handshake_metadata_pp_aware build_prom_metrics reset_cache get_transfer_results
supports_lookahead_block_hashes kv_cache_access supports_sleep_mode unregister_kv_caches restore_kv_caches
may_load_async
supports_divergent_local_hybrid_hits get_mem_pool_context finish_forward reset_capture_state bind_kv_cache_manager
get_loaded_kv_cache_group_ids get_external_cache_hit_sources register_finished_partial_tail
has_pending_block_frees""".split()  # the line before the last: vLLM 0.34's; the last: 0.32's and 0.34's


def public_members(cls):
    out = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        for name, v in vars(klass).items():
            if not name.startswith("_") or name == "__init__":
                out[name] = v
    return out


def params(fn):
    if isinstance(fn, (classmethod, staticmethod)):
        fn = fn.__func__
    if isinstance(fn, property):
        return "property"
    if not callable(fn):
        return None
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def check_against(adapter, base):
    missing, differ = [], []
    for name, v in public_members(base).items():
        if not hasattr(adapter, name):
            missing.append(name)
            continue
        want = params(v)
        got = params(inspect.getattr_static(adapter, name))
        if want is not None and got != want:
            differ.append(f"{name}: {got} != {want}")
    assert not missing, f"{adapter.__name__} lacks {missing} of {base.__name__}"
    assert not differ, f"{adapter.__name__} differs from {base.__name__}: " + "; ".join(differ)


PAIRS = [
    (connector.HixlKVConnector, "KVConnectorBase_V1"),
    (connector.HixlKVConnector, "SupportsHMA"),
    (connector.HixlConnectorMetadata, "KVConnectorMetadata"),
    (connector.HixlKVConnectorStats, "KVConnectorStats"),
    (connector.HixlPromMetrics, "KVConnectorPromMetrics"),
]


@pytest.mark.parametrize("adapter,base", PAIRS, ids=[f"{a.__name__}-{b}" for a, b in PAIRS])
def test_matches_standin(adapter, base):
    if hixl_vllm.USING_VLLM:
        pytest.skip("vLLM is installed: the adapter derives from vLLM's classes, checked against them "
                    "(test_matches_vllm_when_installed)")
    check_against(adapter, getattr(_standin, base))


def test_standin_carries_vllm_api():
    have = set(public_members(_standin.KVConnectorBase_V1))
    assert not [n for n in VLLM_BASE_API if n not in have]
    assert "request_finished_all_groups" in public_members(_standin.SupportsHMA)


def test_list_has_every_vllm_hook_when_installed():
    """Each public method and property of the installed vLLM's KVConnectorBase_V1 is in
    VLLM_BASE_API (so in the stand-ins): a vLLM that adds a hook fails here until the
    stand-ins carry it and docs/vllm.md says what it does for hixl. The list may hold
    hooks an older vLLM had."""
    if not hixl_vllm.USING_VLLM:
        pytest.skip("vLLM is not installed here")
    from vllm.distributed.kv_transfer.kv_connector.v1 import base
    assert not [n for n in public_members(base.KVConnectorBase_V1) if n != "__init__" and n not in VLLM_BASE_API]


def test_nothing_abstract_left():
    assert not getattr(connector.HixlKVConnector, "__abstractmethods__", frozenset())
    assert issubclass(connector.HixlKVConnector, hixl_vllm._base.SupportsHMA)
    assert issubclass(connector.HixlKVConnector, hixl_vllm._base.KVConnectorBase_V1)


def test_matches_vllm_when_installed():
    if not hixl_vllm.USING_VLLM:
        pytest.skip("vLLM is not installed here: checked against the stand-ins (test_matches_standin)")
    from vllm.distributed.kv_transfer.kv_connector.v1 import base, metrics
    for adapter, name in PAIRS:
        check_against(adapter, getattr(base, name, None) or getattr(metrics, name))
