#!/usr/bin/python3
"""adapter_step.py [--tree DIR] [--blocks N] [--layers N] [--steps N] [--json FILE]

The adapter's own CPU per step (this thread's, time.thread_time_ns: another process taking the CPU does not inflate
it), 64 requests in flight, through hixl_vllm into the plugin without a peer or KV moving (the plugin answers from
its own state), so what is measured is the adapter, ctypes and the plugin's bookkeeping: a producer's and a
consumer's scheduler step and a worker step (every layer), each the hooks vLLM calls in it.

Medians over --steps steps, with the plugin's C ops' share (ctypes' call included); main() lists the hooks,
docs/vllm.md the figures. --tree takes hixl_vllm from another checkout (A/B). Needs torch only for the worker's
tensors (64 blocks of 4 tokens per layer).
"""

import argparse
import contextlib
import json
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CTimer:
    """The plugin's ops table with this thread's CPU time of each C call added up."""

    def __init__(self, ops):
        self._ops, self.ns = ops, 0

    def __getattr__(self, name):
        f = getattr(self._ops, name)
        if not callable(f):
            return f

        def timed(*args):
            t = time.thread_time_ns()
            try:
                return f(*args)
            finally:
                self.ns += time.thread_time_ns() - t
        return timed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    p.add_argument("--tree", default=os.path.dirname(os.path.dirname(HERE)), help="the source tree (default: this)")
    p.add_argument("--blocks", type=int, default=256, help="blocks per request (default 256: 4096 tokens of 16)")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--json")
    a = p.parse_args()
    sys.path[:0] = [os.path.join(a.tree, "plugin", "python"), os.path.join(a.tree, "plugin", "python", "tests")]
    import torch
    import fakevllm as fv
    from hixl_vllm import HixlKVConnector
    from hixl_vllm._base import KVConnectorRole

    def config(role: str):
        return fv.VllmConfig(fv.KVTransferConfig.from_dict({
            "kv_connector": "HixlKVConnector", "kv_connector_module_path": "hixl_vllm",
            "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
            "kv_connector_extra_config": {"address": f"127.0.0.1:{free_port()}", "mode": "pull",
                                          "Transport": "tcp", "lease_ms": 600000}}))

    names = [f"model.layers.{l}.self_attn.attn" for l in range(a.layers)]
    kcc = fv.KVCacheConfig(64 * a.blocks, [fv.KVCacheGroupSpec(names, fv.FullAttentionSpec(block_size=16))])

    def connector(vc, role, kc=kcc):
        c = HixlKVConnector(vc, role, kc)
        c._plugin.ops = t = CTimer(c._plugin.ops)
        if hasattr(c, "_bind_ops"):
            c._bind_ops()
        return c, t

    P, pt = connector(config("prefill"), KVConnectorRole.SCHEDULER)
    D, dt = connector(config("decode"), KVConnectorRole.SCHEDULER)
    # The worker's own cache: 64 blocks of 4 tokens, 2 heads of 16 (vLLM's CPU shape, K
    # rows then V rows), told to it as vLLM tells a worker, so it derives the layout.
    wkcc = fv.KVCacheConfig(64, [fv.KVCacheGroupSpec(names, fv.FullAttentionSpec(
        block_size=4, num_kv_heads=2, head_size=16, head_size_v=16))])
    W, wt = connector(config("decode"), KVConnectorRole.WORKER, wkcc)
    W.register_kv_caches({n: torch.zeros(64, 2, 4, 32, dtype=torch.float16) for n in names})
    blocks = [list(range(i * a.blocks, (i + 1) * a.blocks)) for i in range(64)]
    out = {"producer scheduler": [], "consumer scheduler": [], "worker": []}

    @contextlib.contextmanager
    def timed(key, timer):  # this thread's CPU time in the block, and of it the plugin's C calls
        c0, t0 = timer.ns, time.thread_time_ns()
        yield
        out[key].append((time.thread_time_ns() - t0, timer.ns - c0))

    for k in range(a.steps + 5):
        reqs = [fv.Request(f"s{k}-{i}", a.blocks * 16) for i in range(64)]
        params = {}
        with timed("producer scheduler", pt):
            for r, b in zip(reqs, blocks):
                P.update_state_after_alloc(r, fv.KVCacheBlocks([b]), 0)
            for r, b in zip(reqs, blocks):
                r.status = fv.RequestStatus.FINISHED_LENGTH_CAPPED
                params[r.request_id] = P.request_finished(r, b)[1]
            P.build_connector_meta(fv.SchedulerOutput())
            P.update_connector_output(fv.KVConnectorOutput(finished_sending={r.request_id for r in reqs}))
        dreqs = [fv.Request(r.request_id, a.blocks * 16, params[r.request_id]) for r in reqs]
        with timed("consumer scheduler", dt):
            for r, b in zip(dreqs, blocks):
                n, _ = D.get_num_new_matched_tokens(r, 0)
                D.update_state_after_alloc(r, fv.KVCacheBlocks([b]), n)
            D.build_connector_meta(fv.SchedulerOutput())
            D.update_connector_output(fv.KVConnectorOutput(finished_recving={r.request_id for r in dreqs}))
            for r, b in zip(dreqs, blocks):
                D.update_state_after_alloc(r, fv.KVCacheBlocks([b]), 0)
                r.status = fv.RequestStatus.FINISHED_LENGTH_CAPPED
                D.request_finished(r, b)
        meta = D.build_connector_meta(fv.SchedulerOutput())  # (not timed: the scheduler's)
        with timed("worker", wt):
            W.bind_connector_metadata(meta)
            W.start_load_kv(fv.ForwardContext(attn_metadata={}))
            for n in names:
                W.wait_for_layer_load(n)
                W.save_kv_layer(n, None, None)
            W.wait_for_save()
            W.get_finished(set())
            W.get_block_ids_with_load_errors()
            W.clear_connector_metadata()
    med = lambda v, i: statistics.median(x[i] for x in v[5:]) / 1e3  # the first 5 steps warm up
    res = {key: {"us": med(v, 0), "c_us": med(v, 1), "steps": len(v) - 5} for key, v in out.items()}
    for c in (P, D, W):
        c.shutdown()
    print(f"adapter_step: 64 requests in flight, {a.blocks} blocks each, {a.layers} layers; CPU µs per step "
          f"(median of {a.steps}), of it in the plugin's C ops; hixl_vllm from {a.tree}")
    for key, r in res.items():
        print(f"  {key:<20} {r['us']:8.0f} us (C {r['c_us']:6.0f}, Python {r['us'] - r['c_us']:6.0f}), "
              f"{r['us'] / (1 if key == 'worker' else 64):7.1f} us per {'step' if key == 'worker' else 'request'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"requests_in_flight": 64, "blocks_per_request": a.blocks, "layers": a.layers,
                       "steps": a.steps, "per_step": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
