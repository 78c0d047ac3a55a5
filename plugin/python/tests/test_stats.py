"""KVConnectorStats from the plugin's counters: aggregatable, reducible, and mapped to
Prometheus metrics (vllm:hixl_*) per engine."""

from types import SimpleNamespace

import hixl_vllm
from hixl_vllm import HixlKVConnector, HixlKVConnectorStats


def test_aggregate_reduce():
    a = HixlKVConnector.build_kv_connector_stats({"loads_done": 2, "bytes_loaded": 100, "blocks_held": 1})
    b = HixlKVConnectorStats({"loads_done": 3, "bytes_loaded": 50})
    assert not a.is_empty()
    r = a.aggregate(b).reduce()
    assert r["loads_done"] == 5 and r["bytes_loaded"] == 150 and r["blocks_held"] == 1
    a.reset()
    assert a.is_empty()


def test_transfer_times_join_and_reduce():
    a = HixlKVConnectorStats({"loads_done": 1, "transfer_s": [0.003]})
    a.aggregate(HixlKVConnectorStats({"loads_done": 2, "transfer_s": [0.001, 0.002]}))
    assert a.data["transfer_s"] == [0.003, 0.001, 0.002]
    r = a.reduce()
    assert r["transfers"] == 3 and r["transfer_ms_p50"] == 2.0 and r["transfer_ms_max"] == 3.0
    assert not HixlKVConnectorStats({"transfer_s": [0.5]}).is_empty()


MADE = {}


class FakeMetric:
    def __init__(self, name, documentation, labelnames, buckets=None):
        self.name, self.values, self.buckets = name, {}, buckets
        MADE[name] = self

    def labels(self, *values):
        m = self

        class Child:
            def inc(self, v=1):
                m.values[values] = m.values.get(values, 0) + v

            def set(self, v):
                m.values[values] = v

            def observe(self, v):
                m.values.setdefault(values, []).append(v)
        return Child()


class Counter(FakeMetric):
    pass


class Gauge(FakeMetric):
    pass


class Histogram(FakeMetric):
    pass


def test_prom_metrics():
    # Keyed as vLLM keys them: by prometheus_client's classes when vLLM is installed (its
    # base class looks them up so), by the stand-ins' otherwise; the values are the fakes.
    keys = (Counter, Gauge, Histogram)
    if hixl_vllm.USING_VLLM:
        import prometheus_client
        keys = (prometheus_client.Counter, prometheus_client.Gauge, prometheus_client.Histogram)
    types = dict(zip(keys, (Counter, Gauge, Histogram)))
    config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector="HixlKVConnector"))
    p = HixlKVConnector.build_prom_metrics(config, types, ["model_name", "engine"], {0: ["m", "0"], 1: ["m", "1"]})
    p.observe({"loads_done": 4, "blocks_held": 7}, engine_idx=1)
    p.observe({"loads_done": 1, "blocks_held": 2}, engine_idx=1)
    assert isinstance(MADE["vllm:hixl_loads_done"], Counter) and isinstance(MADE["vllm:hixl_blocks_held"], Gauge)
    assert MADE["vllm:hixl_loads_done"].values == {("m", "1"): 5}
    assert MADE["vllm:hixl_blocks_held"].values == {("m", "1"): 2}
    # each request's transfer time, observed into a histogram with NIXL-like buckets
    p.observe({"transfer_s": [0.002, 0.0004]}, engine_idx=0)
    h = MADE["vllm:hixl_transfer_seconds"]
    assert isinstance(h, Histogram) and h.values == {("m", "0"): [0.002, 0.0004]} and h.buckets[0] == 0.0005
