"""One serving instance (prefill or decode) in its own process, driving HixlKVConnector
exactly as vLLM's scheduler and GPU model runner do each step:

  scheduler: get_num_new_matched_tokens -> update_state_after_alloc -> build_connector_meta
  worker:    bind_connector_metadata -> start_load_kv(forward context) -> per layer
             wait_for_layer_load(name), [compute], save_kv_layer(name, kv_layer, attn_metadata)
             -> wait_for_save -> get_finished(finished_req_ids) -> get_block_ids_with_load_errors
             -> clear_connector_metadata
  scheduler: request_finished (or request_finished_all_groups) -> update_connector_output

KV tensors are CPU torch tensors in vLLM's shapes; every token's K|V is a function of
(request seed, layer, token), so decode checks every block with torch.equal.
The router (pd_router.py) talks to it with one JSON object per line on stdin/stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fakevllm as fv  # noqa: E402
from hixl_vllm import HixlError, HixlKVConnector  # noqa: E402
from hixl_vllm._base import KVConnectorRole  # noqa: E402

DTYPE = torch.float16


def send(msg):
    os.write(1, (json.dumps(msg) + "\n").encode())


class Model:
    """The KV cache of an L-layer model in one of vLLM's layouts, and canonical
    (B, N, H, C) views of each layer for writing and checking."""

    def __init__(self, layout, layers, heads, block_tokens, head_dim, num_blocks):
        self.layout, self.L, self.H, self.N, self.D, self.B = layout, layers, heads, block_tokens, head_dim, num_blocks
        self.names = [f"model.layers.{l}.self_attn.attn" for l in range(layers)]
        C = head_dim if layout == "mla" else 2 * head_dim
        self.C = C
        self.kv, self.canon = {}, []
        if layout == "packed":  # per layer (B, H, N, 2D)
            for n in self.names:
                t = torch.zeros(num_blocks, heads, block_tokens, C, dtype=DTYPE)
                self.kv[n] = t
                self.canon.append(t.permute(0, 2, 1, 3))
        elif layout == "mla":  # per layer (B, N, D_latent)
            for n in self.names:
                t = torch.zeros(num_blocks, block_tokens, C, dtype=DTYPE)
                self.kv[n] = t
                self.canon.append(t.unsqueeze(2))
        elif layout in ("LBNHC", "BLNHC"):  # one buffer, each layer a strided view (B, N, H, C)
            if layout == "LBNHC":
                whole = torch.zeros(layers, num_blocks, block_tokens, heads, C, dtype=DTYPE)
                views = [whole[l] for l in range(layers)]
            else:
                whole = torch.zeros(num_blocks, layers, block_tokens, heads, C, dtype=DTYPE)
                views = [whole[:, l] for l in range(layers)]
            self.whole = whole
            for n, v in zip(self.names, views):
                self.kv[n] = v
                self.canon.append(v)
        elif layout == "cross_layer":  # (B, L, N, H, C) registered whole: K|V packed in C
            whole = torch.zeros(num_blocks, layers, block_tokens, heads, C, dtype=DTYPE)
            self.whole = whole
            for l, n in enumerate(self.names):
                self.kv[n] = whole[:, l]
                self.canon.append(whole[:, l])
        else:
            raise SystemExit(f"unknown layout {layout}")

    def heads_of_canon(self):
        return 1 if self.layout == "mla" else self.H

    def values(self, seed, layer, tokens):
        g = torch.Generator().manual_seed(seed * 1009 + layer)
        return torch.randint(-1024, 1024, (tokens, self.heads_of_canon(), self.C), generator=g).to(DTYPE)

    def compute(self, seed, blocks, tokens, layer):
        t = torch.arange(tokens)
        bidx = torch.tensor(blocks, dtype=torch.long)[t // self.N]
        self.canon[layer][bidx, t % self.N] = self.values(seed, layer, tokens)

    def verify(self, seed, blocks, tokens):
        """(blocks checked, first mismatch or None): torch.equal on every block of every layer."""
        checked = 0
        for l in range(self.L):
            v = self.values(seed, l, tokens)
            for i, b in enumerate(blocks):
                n = min(self.N, tokens - i * self.N)
                if not torch.equal(self.canon[l][b, :n], v[i * self.N:i * self.N + n]):
                    return checked, f"layer {l} block {b} (request block {i}) differs"
                checked += 1
        return checked, None


class Instance:
    def __init__(self, a):
        self.a = a
        self.prefill = a.role == "prefill"
        cfg = json.loads(a.config)
        self.push = cfg["kv_connector_extra_config"].get("mode") == "push"
        self.m = Model(a.layout, a.layers, a.heads, a.block_tokens, a.head_dim, a.num_blocks)
        vc = fv.VllmConfig(fv.KVTransferConfig.from_dict(cfg))
        spec = fv.MLAAttentionSpec(block_size=a.block_tokens) if a.layout == "mla" else \
            fv.FullAttentionSpec(block_size=a.block_tokens)
        kcc = fv.KVCacheConfig(a.num_blocks, [fv.KVCacheGroupSpec(list(self.m.names), spec)])
        self.sched = HixlKVConnector(vc, KVConnectorRole.SCHEDULER, kcc)
        self.worker = HixlKVConnector(vc, KVConnectorRole.WORKER, kcc)
        if a.layout == "cross_layer":
            self.worker.register_cross_layers_kv_cache(self.m.whole, None)
        else:
            self.worker.register_kv_caches(self.m.kv)
        self.free = list(range(a.num_blocks))
        self.reqs = {}  # id -> Request (with .seed, .blocks, state fields)
        self.order = []
        self.held = {}  # prefill: id -> blocks kept for the consumer (delay_free)
        self.finished_ids = set()  # vLLM's scheduler_output.finished_req_ids for the next step
        self.ready = []  # decode: received, checked in the next step
        self.exiting = False
        self.drain_end = 0.0
        self.count = 0
        self.buf = b""

    # ---- blocks ----
    def alloc(self, n):
        if len(self.free) < n:
            return None
        out, self.free = self.free[:n], self.free[n:]
        return out

    def release(self, r):
        if getattr(r, "blocks", None):
            self.free.extend(r.blocks)
            r.blocks = None

    def blocks_for(self, tokens):
        return (tokens + self.m.N - 1) // self.m.N

    # ---- the step ----
    def forward(self, meta, batch):
        """The model runner's execute_model around the connector (kv_connector_no_forward
        when batch is empty)."""
        w = self.worker
        w.bind_connector_metadata(meta)
        w.start_load_kv(fv.ForwardContext(attn_metadata={}))
        if batch:
            for l, name in enumerate(self.m.names):
                w.wait_for_layer_load(name)
                for r in batch:
                    if r.compute:
                        self.m.compute(r.seed, r.blocks, r.num_prompt_tokens, l)
                w.save_kv_layer(name, self.m.kv[name], attn_metadata=None)
        w.wait_for_save()
        sending, recving = w.get_finished(self.finished_ids)
        self.finished_ids = set()
        errors = w.get_block_ids_with_load_errors()
        w.clear_connector_metadata()
        return fv.KVConnectorOutput(finished_sending=sending, finished_recving=recving, invalid_block_ids=errors)

    def step(self):
        (self.prefill_step if self.prefill else self.decode_step)()

    def prefill_step(self):
        s = self.sched
        so = fv.SchedulerOutput()
        batch = []
        for rid in list(self.order):
            r = self.reqs[rid]
            if r.status != fv.RequestStatus.WAITING:
                continue
            n, is_async = s.get_num_new_matched_tokens(r, 0)
            if n is None:
                continue
            blocks = self.alloc(self.blocks_for(r.num_prompt_tokens))
            if blocks is None:
                break
            r.blocks, r.compute, r.status = blocks, True, fv.RequestStatus.RUNNING
            s.update_state_after_alloc(r, fv.KVCacheBlocks([blocks]), n or 0)
            so.scheduled_new_reqs.append(r)
            so.num_scheduled_tokens[rid] = r.num_prompt_tokens
            batch.append(r)
        meta = s.build_connector_meta(so)
        out = self.forward(meta, batch)
        # update_from_output: a prefill request ends after its prompt (max_tokens 1).
        for r in batch:
            r.status = fv.RequestStatus.FINISHED_LENGTH_CAPPED
            delay, params = s.request_finished(r, list(r.blocks))
            self.finished_ids.add(r.request_id)
            self.order.remove(r.request_id)
            send({"op": "params", "id": r.request_id, "params": params, "delay": delay})
            self.count += 1
            if self.a.fault == "prefill-dies" and self.count == self.a.fault_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if delay:
                self.held[r.request_id] = r
            else:
                self.release(r)
                del self.reqs[r.request_id]
        s.update_connector_output(out)
        for rid in out.finished_sending or ():
            r = self.held.pop(rid, None)
            if r is None:
                send({"op": "log", "msg": f"get_finished reported {rid} sent, which prefill does not hold"})
                continue
            self.release(r)
            self.reqs.pop(rid, None)

    def decode_step(self):
        s = self.sched
        so = fv.SchedulerOutput()
        batch = []
        # Requests received last step: scheduled now (vLLM calls update_state_after_alloc
        # again with 0 external tokens), checked, and finished.
        for r in self.ready:
            s.update_state_after_alloc(r, fv.KVCacheBlocks([r.blocks]), 0)
            checked, bad = self.m.verify(r.seed, r.blocks, r.num_prompt_tokens)
            self.finish(r, "corrupt" if bad else r.outcome, bad or f"{checked} blocks equal", checked)
        self.ready = []
        for rid in list(self.order):
            r = self.reqs[rid]
            if r.status != fv.RequestStatus.WAITING:
                continue
            try:
                n, is_async = s.get_num_new_matched_tokens(r, 0)
            except HixlError as e:
                self.finish(r, "failed", str(e), 0)
                continue
            if n is None:
                continue
            blocks = self.alloc(self.blocks_for(r.num_prompt_tokens))
            if blocks is None:
                break
            r.blocks = blocks
            if n == 0:  # nothing to load: the runtime computes the prompt itself
                r.compute, r.status, r.outcome = True, fv.RequestStatus.RUNNING, "recomputed"
                s.update_state_after_alloc(r, fv.KVCacheBlocks([blocks]), 0)
                batch.append(r)
                continue
            s.update_state_after_alloc(r, fv.KVCacheBlocks([blocks]), n)
            r.compute, r.outcome = False, "verified"
            r.status = fv.RequestStatus.WAITING_FOR_REMOTE_KVS if is_async else fv.RequestStatus.RUNNING
            if self.push:
                send({"op": "pushparams", "id": rid, "params": s.get_push_params(rid)})
            self.count += 1
            if self.a.fault == "decode-aborts" and self.count == self.a.fault_at:
                r.status = fv.RequestStatus.FINISHED_ABORTED  # the client went away while it loads
                s.request_finished(r, list(blocks))
                r.aborted = True
        meta = s.build_connector_meta(so)
        if self.a.fault == "decode-dies" and self.count >= self.a.fault_at and any(
                x.status == fv.RequestStatus.WAITING_FOR_REMOTE_KVS for x in self.reqs.values()):
            os.kill(os.getpid(), signal.SIGKILL)
        out = self.forward(meta, batch)
        for r in batch:  # computed here (recompute): checked next step like a received one
            self.ready.append(r)
        s.update_connector_output(out)
        errors = out.invalid_block_ids or set()
        for rid in out.finished_recving or ():
            r = self.reqs.get(rid)
            if r is None or r.status not in (fv.RequestStatus.WAITING_FOR_REMOTE_KVS, fv.RequestStatus.FINISHED_ABORTED):
                send({"op": "log", "msg": f"get_finished reported {rid} received, which decode is not loading"})
                continue
            if getattr(r, "aborted", False):
                self.finish(r, "aborted", "aborted while its KV loaded", 0, finished_already=True)
                continue
            bad = errors & set(r.blocks)
            if bad:  # vLLM: the blocks are invalid; ask the connector again (policy)
                r.status = fv.RequestStatus.WAITING
                r.why = f"{len(bad)} of {len(r.blocks)} blocks failed to load"
                self.release(r)
                try:
                    n, _ = s.get_num_new_matched_tokens(r, 0)
                except HixlError as e:
                    self.finish(r, "failed", f"{r.why}; {e}", 0)
                    continue
                if n != 0:
                    self.finish(r, "failed", f"{r.why}; then matched {n} tokens again", 0)
                continue
            r.status = fv.RequestStatus.RUNNING
            self.ready.append(r)

    def finish(self, r, outcome, why, checked, finished_already=False):
        if not finished_already and r.blocks:
            if r.status != fv.RequestStatus.FINISHED_ABORTED:
                r.status = fv.RequestStatus.FINISHED_LENGTH_CAPPED
            delay, params = self.sched.request_finished(r, list(r.blocks))
            if delay:
                send({"op": "log", "msg": f"request_finished({r.request_id}) on decode answered delay_free"})
        self.finished_ids.add(r.request_id)
        self.release(r)
        self.reqs.pop(r.request_id, None)
        if r.request_id in self.order:
            self.order.remove(r.request_id)
        send({"op": "done", "id": r.request_id, "outcome": outcome, "why": why, "blocks_checked": checked})

    # ---- the process ----
    def handle(self, msg):
        op = msg["op"]
        if op == "exit":
            self.exiting = True
            self.drain_end = time.monotonic() + self.a.drain_s
        elif op in ("req", "load"):
            r = fv.Request(msg["id"], msg["prompt"], msg.get("params"))
            r.seed, r.blocks, r.compute, r.outcome = msg["seed"], None, False, None
            self.reqs[r.request_id] = r
            self.order.append(r.request_id)
        else:
            raise SystemExit(f"unknown message {msg}")

    def read(self, timeout):
        rl, _, _ = select.select([0], [], [], timeout)
        if not rl:
            return True
        data = os.read(0, 1 << 16)
        if not data:
            return False
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            if line.strip():
                self.handle(json.loads(line))
        return True

    def run(self):
        send({"op": "ready", "blocks": self.a.num_blocks})
        while True:
            if not self.read(0.001 if self.reqs or self.held or self.exiting else 0.01):
                break
            self.step()
            if self.exiting and ((not self.reqs and not self.held and not self.ready)
                                 or time.monotonic() >= self.drain_end):
                break
        st = self.worker.plugin_stats()
        adapter = self.worker.get_kv_connector_stats()
        send({"op": "stats", "blocks_total": self.a.num_blocks, "blocks_free": len(self.free),
              "requests_left": len(self.reqs), "held": len(self.held), "plugin": st, "adapter": adapter.data})
        self.worker.shutdown()
        self.sched.shutdown()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--role", choices=["prefill", "decode"], required=True)
    p.add_argument("--config", required=True, help="the --kv-transfer-config JSON")
    p.add_argument("--layout", default="packed")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--num-blocks", type=int, default=256)
    p.add_argument("--drain-s", type=float, default=10.0)
    p.add_argument("--fault", default="none")
    p.add_argument("--fault-at", type=int, default=0)
    a = p.parse_args()
    try:
        Instance(a).run()
    except Exception:
        send({"op": "fatal", "why": traceback.format_exc()})
        raise


if __name__ == "__main__":
    main()
