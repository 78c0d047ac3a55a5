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
With --window W the model is hybrid as vLLM's hybrid allocator lays it out (Gemma-3,
gpt-oss): even layers a full-attention KV cache group, odd layers a sliding-window group
of W tokens, each KV tensor shared by one layer of each group, the groups' blocks from
one pool whose block 0 is the null block; a request has one block list per group
(KVCacheBlocks.get_block_ids()), the sliding-window list padded with the null block
where the window skips blocks; the scheduler calls request_finished_all_groups.
The router (pd_router.py) talks to it with one JSON object per line on stdin/stdout.
Every connector call is timed (Timed: time.perf_counter_ns and thread CPU time around
the hook, and around the plugin's C ops within it); the steps with requests in flight
are reported with the stats at exit (integration/py-host/hixl-py-host prints them).
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
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fakevllm as fv  # noqa: E402
from hixl_vllm import HixlError, HixlKVConnector  # noqa: E402
from hixl_vllm._base import KVConnectorRole  # noqa: E402

DTYPE = torch.float16
VERIFY_BYTES_PER_STEP = 64 << 20  # decode checks about this much KV a step (the C mock host's budget)
IDLE_S = 0.02  # the longest wait for the router or the event fd when no step has work (the C host's)


def send(msg):
    os.write(1, (json.dumps(msg) + "\n").encode())


SPREAD = 1 << 20  # where a (seed, layer)'s values start in the table: one of SPREAD / 4 places


def bits(t):
    """A tensor's bytes as integers, for a bitwise torch.equal (float16's equal is both
    slower and looser: -0 == 0, NaN != NaN): int64 where the rows allow, else int16."""
    t = t.view(torch.int16)
    return t.view(torch.int64) if t.shape[-1] % 4 == 0 and t.is_contiguous() else t


class Model:
    """The KV cache of an L-layer model in one of vLLM's layouts, and canonical
    (B, N, H, C) views of each layer for writing and checking.

    Every token's K|V is a function of (request seed, layer, token, head, element): a
    window of one random table both sides build alike, starting at a place given by
    (seed, layer) (distinct for every layer of a request). Writing a layer and checking
    it are then one copy and one bitwise compare per layer, not a generator per token."""

    def __init__(self, layout, layers, heads, block_tokens, head_dim, num_blocks, max_tokens=0, window=0,
                 device="cpu"):
        self.layout, self.L, self.H, self.N, self.D, self.B = layout, layers, heads, block_tokens, head_dim, num_blocks
        self.device = device  # "cuda": the KV cache and the table in device memory, as on a GPU
        self.names = [f"model.layers.{l}.self_attn.attn" for l in range(layers)]
        # Hybrid (window > 0): layer l is in group l % 2 (1: the sliding window), and layers
        # 2j and 2j+1 share one tensor, as vLLM's hybrid allocator shares each KV cache
        # tensor between one layer of each group.
        self.window = window
        self.group_of = [l % 2 if window else 0 for l in range(layers)]
        if window and (layout != "packed" or layers % 2):
            raise SystemExit("--window: the hybrid model wants the packed layout and an even layer count")
        C = head_dim if layout == "mla" else 2 * head_dim
        self.C = C
        self.kv, canon = {}, []
        if layout == "packed":  # per layer (B, H, N, 2D)
            for l, n in enumerate(self.names):
                t = self.kv[self.names[l - 1]] if window and l % 2 else \
                    torch.zeros(num_blocks, heads, block_tokens, C, dtype=DTYPE, device=device)
                self.kv[n] = t
                canon.append(t.permute(0, 2, 1, 3))
        elif layout == "mla":  # per layer (B, N, D_latent)
            for n in self.names:
                t = torch.zeros(num_blocks, block_tokens, C, dtype=DTYPE, device=device)
                self.kv[n] = t
                canon.append(t.unsqueeze(2))
        elif layout in ("LBNHC", "BLNHC"):  # one buffer, each layer a strided view (B, N, H, C)
            if layout == "LBNHC":
                whole = torch.zeros(layers, num_blocks, block_tokens, heads, C, dtype=DTYPE, device=device)
                views = [whole[l] for l in range(layers)]
            else:
                whole = torch.zeros(num_blocks, layers, block_tokens, heads, C, dtype=DTYPE, device=device)
                views = [whole[:, l] for l in range(layers)]
            self.whole = whole
            for n, v in zip(self.names, views):
                self.kv[n] = v
                canon.append(v)
        elif layout == "cross_layer":  # (B, L, N, H, C) registered whole: K|V packed in C
            whole = torch.zeros(num_blocks, layers, block_tokens, heads, C, dtype=DTYPE, device=device)
            self.whole = whole
            for l, n in enumerate(self.names):
                self.kv[n] = whole[:, l]
                canon.append(whole[:, l])
        else:
            raise SystemExit(f"unknown layout {layout}")
        self.canon = [c.view(torch.int16) for c in canon]  # copies and compares move bits, never floats
        cap = -(-(max_tokens or num_blocks * block_tokens) // block_tokens) * block_tokens
        g = torch.Generator().manual_seed(0x6869786C)
        self.table = torch.randint(-32768, 32768, (cap * self.heads_of_canon() * C + SPREAD,), generator=g,
                                   dtype=torch.int16).to(device)

    def heads_of_canon(self):
        return 1 if self.layout == "mla" else self.H

    def token_bytes(self):
        """KV bytes of one token in one layer."""
        return self.heads_of_canon() * self.C * torch.finfo(DTYPE).bits // 8

    def values(self, seed, layer, tokens):
        """(tokens, H, C) int16: the bits of each token's K|V (a view of the table)."""
        hc = self.heads_of_canon()
        off = 4 * ((seed * 1000003 + layer * 7919) % (SPREAD // 4))  # 7919 is odd: every layer differs
        return self.table[off:off + tokens * hc * self.C].view(tokens, hc, self.C)

    def window_blocks(self, tokens):
        """The blocks a sliding window of self.window tokens keeps after tokens tokens, as
        vLLM's SlidingWindowManager counts them: it skips max(0, tokens - window + 1) tokens."""
        nb = (tokens + self.N - 1) // self.N
        return nb - max(0, tokens - self.window + 1) // self.N

    def held(self, groups, layer, tokens):
        """Layer's blocks of a request (its group's list without the null block) and the
        first token they hold: a sliding window's are the request's last blocks."""
        blocks = [b for b in groups[self.group_of[layer]] if b] if self.window else groups[self.group_of[layer]]
        nb = (tokens + self.N - 1) // self.N
        return blocks, (nb - len(blocks)) * self.N

    def compute(self, seed, groups, tokens, layer):
        """The forward pass of one layer: the request's blocks of the layer's group, whole,
        get their values."""
        blocks, first = self.held(groups, layer, tokens)
        nb = len(blocks)
        v = self.values(seed, layer, first + nb * self.N)[first:].view(nb, self.N, self.heads_of_canon(), self.C)
        self.canon[layer].index_copy_(0, torch.tensor(blocks, dtype=torch.long, device=self.device), v)

    def layer_bytes(self, groups, layer, tokens):
        return (tokens - self.held(groups, layer, tokens)[1]) * self.token_bytes()

    def verify(self, seed, groups, tokens, layers=None):
        """(blocks checked, bytes checked, first mismatch or None): torch.equal on the bytes
        of every block of every layer given (default all) that the layer's group holds (the
        request's tokens of its last block)."""
        checked = nbytes = 0
        for l in (range(self.L) if layers is None else layers):
            blocks, first = self.held(groups, l, tokens)
            nb = len(blocks)
            idx = torch.tensor(blocks, dtype=torch.long, device=self.device)
            got = self.canon[l].index_select(0, idx).view(nb * self.N, self.heads_of_canon(), self.C)[:tokens - first]
            want = self.values(seed, l, tokens)[first:]
            if not torch.equal(bits(got), bits(want)):
                for i, b in enumerate(blocks):
                    lo, hi = i * self.N, min(tokens - first, (i + 1) * self.N)
                    if not torch.equal(got[lo:hi], want[lo:hi]):
                        return checked, nbytes, f"layer {l} block {b} (request block {i} of its group's) differs"
                return checked, nbytes, f"layer {l} differs"
            checked += nb
            nbytes += (tokens - first) * self.token_bytes()
        return checked, nbytes, None

    def null_block_zero(self):
        """The null block (0) of every layer still all zeros: nothing was moved into it."""
        return all(not bool(c[0].any()) for c in self.canon)


class TimedOps:
    """The adapter's ops table (its private _plugin.ops) with the nanoseconds of each
    C call, ctypes' marshalling included, added to owner.c_ns (wall) and owner.c_cpu
    (this thread's CPU): the plugin's share of a hook's time. Instrumentation of this
    driver only."""

    def __init__(self, ops, owner):
        self._ops, self._owner = ops, owner

    def __getattr__(self, name):
        f = getattr(self._ops, name)
        if not callable(f):
            return f
        owner = self._owner

        def timed(*args):
            t, c = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return f(*args)
            finally:
                owner.c_cpu += time.thread_time_ns() - c
                owner.c_ns += time.perf_counter_ns() - t
        return timed


class Timed:
    """A connector whose hooks add the nanoseconds they take (time.perf_counter_ns
    around the call alone) to .ns, and the part of it inside the plugin's C ops to
    .c_ns: the step's time in the connector, and in the plugin. .cpu and .c_cpu are the
    same in this thread's CPU time (time.thread_time_ns), which a busy machine taking
    the CPU away mid-hook does not inflate."""

    def __init__(self, conn):
        self.conn, self.ns, self.c_ns, self.cpu, self.c_cpu = conn, 0, 0, 0, 0
        plugin = getattr(conn, "_plugin", None)
        if plugin is not None:
            plugin.ops = TimedOps(plugin.ops, self)
            conn._bind_ops()  # the per-layer ops it looked up once: the timed ones

    def __getattr__(self, name):
        f = getattr(self.conn, name)
        if not callable(f):
            return f

        def timed(*args, **kwargs):
            t, c = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return f(*args, **kwargs)
            finally:
                self.cpu += time.thread_time_ns() - c
                self.ns += time.perf_counter_ns() - t
        return timed


class Instance:
    def __init__(self, a):
        self.a = a
        self.prefill = a.role == "prefill"
        cfg = json.loads(a.config)
        self.push = cfg["kv_connector_extra_config"].get("mode") == "push"
        self.m = Model(a.layout, a.layers, a.heads, a.block_tokens, a.head_dim, a.num_blocks, a.max_prompt, a.window,
                       a.device)
        vc = fv.VllmConfig(fv.KVTransferConfig.from_dict(cfg))
        vc.device_config = SimpleNamespace(device_type=a.device)  # the adapter's kv_memory follows it
        spec = fv.MLAAttentionSpec(block_size=a.block_tokens) if a.layout == "mla" else \
            fv.FullAttentionSpec(block_size=a.block_tokens)
        if a.window:  # hybrid: vLLM's KV cache groups, full attention and sliding window
            sw = fv.SlidingWindowSpec(block_size=a.block_tokens, sliding_window=a.window)
            kcc = fv.KVCacheConfig(a.num_blocks, [
                fv.KVCacheGroupSpec([n for n, g in zip(self.m.names, self.m.group_of) if g == k], sp)
                for k, sp in ((0, spec), (1, sw))])
        else:
            kcc = fv.KVCacheConfig(a.num_blocks, [fv.KVCacheGroupSpec(list(self.m.names), spec)])
        self.sched = Timed(HixlKVConnector(vc, KVConnectorRole.SCHEDULER, kcc))
        self.worker = Timed(HixlKVConnector(vc, KVConnectorRole.WORKER, kcc))
        if a.layout == "cross_layer":
            self.worker.register_cross_layers_kv_cache(self.m.whole, None)
        else:
            self.worker.register_kv_caches(self.m.kv)
        # vLLM's block pool: block 0 is the null block (kept out of the pool) in a hybrid model.
        self.free = list(range(1 if a.window else 0, a.num_blocks))
        self.blocks_total = len(self.free)
        self.reqs = {}  # id -> Request (with .seed, .blocks, state fields)
        self.order = []
        self.held = {}  # prefill: id -> blocks kept for the consumer (delay_free)
        self.finished_ids = set()  # vLLM's scheduler_output.finished_req_ids for the next step
        self.ready = []  # decode: received, scheduled in the next step
        self.verifying = []  # decode: being checked, a few layers a step
        self.exiting = False
        self.go = False  # fault decode-dies-mid-push: the router killed decode
        self.drain_end = 0.0
        self.count = 0
        self.buf = b""
        self.t_saved = 0  # prefill: when the last forward pass saved its last layer (the hand-off starts)
        # Steps with requests in flight: [requests, ns in the scheduler's hooks, in the worker's, of
        # those inside the plugin's C ops: the scheduler's, the worker's; the same four in CPU ns].
        self.steps = []
        self.event_fd = self.worker.event_fd()  # readable once get_finished has something

    # ---- blocks ----
    def alloc(self, n):
        if len(self.free) < n:
            return None
        out, self.free = self.free[:n], self.free[n:]
        return out

    def release(self, r):
        if getattr(r, "blocks", None):
            self.free.extend(b for g in r.blocks for b in g if b or not self.m.window)
            r.blocks = None

    def blocks_for(self, tokens):
        return (tokens + self.m.N - 1) // self.m.N

    def alloc_groups(self, tokens, external):
        """A request's blocks, one list per KV cache group (KVCacheBlocks.get_block_ids()),
        or None. Sliding-window group: a prefill computed in one step gets every block, a
        load of external tokens only the window's, the skipped ones padded with the null
        block (0), as vLLM's SlidingWindowManager does."""
        nb = self.blocks_for(tokens)
        if not self.m.window:
            b = self.alloc(nb)
            return None if b is None else (b,)
        k = self.m.window_blocks(tokens) if external else nb
        b = self.alloc(nb + k)
        return None if b is None else (b[:nb], [0] * (nb - k) + b[nb:])

    def all_blocks(self, r):
        return {b for g in r.blocks for b in g if b or not self.m.window}

    def finished(self, r):
        """The scheduler's request_finished: request_finished_all_groups with several KV
        cache groups (vLLM's hybrid allocator and a SupportsHMA connector), else
        request_finished with the one group's list."""
        if len(r.blocks) > 1:
            return self.sched.request_finished_all_groups(r, tuple(list(g) for g in r.blocks))
        return self.sched.request_finished(r, list(r.blocks[0]))

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
                if l == self.m.L - 1:  # the last layer is computed and saved: the hand-off starts
                    self.t_saved = time.monotonic_ns()  # (where the C mock host takes it)
                if self.a.fault == "prefill-dies-mid-push" and l == self.m.L // 2 and \
                        self.count + len(batch) >= self.a.fault_at:  # half the layers are being pushed
                    os.kill(os.getpid(), signal.SIGKILL)
                if self.a.fault == "decode-dies-mid-push" and l == self.m.L // 2 and not self.go and \
                        self.count + len(batch) >= self.a.fault_at:
                    send({"op": "midpush"})  # the router kills decode, then says go
                    while not self.go and self.read(1.0, wake_on_fd=False):
                        pass
        w.wait_for_save()
        sending, recving = w.get_finished(self.finished_ids)
        self.finished_ids = set()
        errors = w.get_block_ids_with_load_errors()
        w.clear_connector_metadata()
        if batch and self.m.device != "cpu":
            torch.cuda.synchronize()  # the step's end: vLLM waits for its sampled tokens
        return fv.KVConnectorOutput(finished_sending=sending, finished_recving=recving, invalid_block_ids=errors)

    def step(self):
        busy = len(self.reqs)
        s, w = self.sched, self.worker
        before = (s.ns, w.ns, s.c_ns, w.c_ns, s.cpu, w.cpu, s.c_cpu, w.c_cpu)
        (self.prefill_step if self.prefill else self.decode_step)()
        if busy and len(self.steps) < 200000:
            after = (s.ns, w.ns, s.c_ns, w.c_ns, s.cpu, w.cpu, s.c_cpu, w.c_cpu)
            self.steps.append([busy] + [x - y for x, y in zip(after, before)])

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
            blocks = self.alloc_groups(r.num_prompt_tokens, False)
            if blocks is None:
                break
            r.blocks, r.compute, r.status = blocks, True, fv.RequestStatus.RUNNING
            s.update_state_after_alloc(r, fv.KVCacheBlocks(blocks), n or 0)
            so.scheduled_new_reqs.append(r)
            so.num_scheduled_tokens[rid] = r.num_prompt_tokens
            batch.append(r)
        meta = s.build_connector_meta(so)
        out = self.forward(meta, batch)
        # update_from_output: a prefill request ends after its prompt (max_tokens 1).
        for r in batch:
            r.status = fv.RequestStatus.FINISHED_LENGTH_CAPPED
            delay, params = self.finished(r)
            self.finished_ids.add(r.request_id)
            self.order.remove(r.request_id)
            send({"op": "params", "id": r.request_id, "params": params, "delay": delay, "t_saved": self.t_saved})
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
        # again with 0 external tokens), then checked a few layers a step (verify_some).
        for r in self.ready:
            s.update_state_after_alloc(r, fv.KVCacheBlocks(r.blocks), 0)
            r.vlayer, r.vchecked, r.vbytes, r.vbad = 0, 0, 0, None
            self.verifying.append(r)
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
            blocks = self.alloc_groups(r.num_prompt_tokens, n > 0)
            if blocks is None:
                break
            r.blocks = blocks
            if n == 0:  # nothing to load: the runtime computes the prompt itself
                r.compute, r.status, r.outcome = True, fv.RequestStatus.RUNNING, "recomputed"
                s.update_state_after_alloc(r, fv.KVCacheBlocks(blocks), 0)
                batch.append(r)
                continue
            s.update_state_after_alloc(r, fv.KVCacheBlocks(blocks), n)
            r.compute, r.outcome = False, "verified"
            r.status = fv.RequestStatus.WAITING_FOR_REMOTE_KVS if is_async else fv.RequestStatus.RUNNING
            if self.push:
                send({"op": "pushparams", "id": rid, "params": s.get_push_params(rid)})
            self.count += 1
            if self.a.fault == "decode-aborts" and self.count == self.a.fault_at:
                r.status = fv.RequestStatus.FINISHED_ABORTED  # the client went away while it loads
                self.finished(r)
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
            mine = self.all_blocks(r)
            bad = errors & mine
            if bad:  # vLLM: the blocks are invalid; ask the connector again (policy)
                r.status = fv.RequestStatus.WAITING
                r.why = f"{len(bad)} of {len(mine)} blocks failed to load"
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
            r.t_held = time.monotonic_ns()
            self.ready.append(r)
        self.verify_some(VERIFY_BYTES_PER_STEP)

    def verify_some(self, budget):
        """Checks received requests' KV, about budget bytes a step, layer by layer, as the C
        mock host does: a 4096-token request of a 32-layer model is 512 MiB, and checked in
        one step it kept get_finished from being called for half a second, which every
        request landing meanwhile counted in its hand-off."""
        while self.verifying and budget > 0:
            r = self.verifying[0]
            while r.vlayer < self.m.L and r.vbad is None and budget > 0:
                checked, nbytes, r.vbad = self.m.verify(r.seed, r.blocks, r.num_prompt_tokens, [r.vlayer])
                budget -= self.m.layer_bytes(r.blocks, r.vlayer, r.num_prompt_tokens)
                r.vlayer, r.vchecked, r.vbytes = r.vlayer + 1, r.vchecked + checked, r.vbytes + nbytes
            if r.vlayer < self.m.L and r.vbad is None:
                break
            self.verifying.pop(0)
            self.finish(r, "corrupt" if r.vbad else r.outcome, r.vbad or f"{r.vchecked} blocks equal", r.vchecked,
                        nbytes=0 if r.vbad else r.vbytes)

    def finish(self, r, outcome, why, checked, finished_already=False, nbytes=0):
        if not finished_already and r.blocks:
            if r.status != fv.RequestStatus.FINISHED_ABORTED:
                r.status = fv.RequestStatus.FINISHED_LENGTH_CAPPED
            delay, params = self.finished(r)
            if delay:
                send({"op": "log", "msg": f"request_finished({r.request_id}) on decode answered delay_free"})
        self.finished_ids.add(r.request_id)
        self.release(r)
        self.reqs.pop(r.request_id, None)
        if r.request_id in self.order:
            self.order.remove(r.request_id)
        send({"op": "done", "id": r.request_id, "outcome": outcome, "why": why, "blocks_checked": checked,
              "bytes_checked": nbytes, "t_held": getattr(r, "t_held", 0)})

    # ---- the process ----
    def handle(self, msg):
        op = msg["op"]
        if op == "go":
            self.go = True
        elif op == "exit":
            self.exiting = True
            self.drain_end = time.monotonic() + self.a.drain_s
        elif op in ("req", "load"):
            r = fv.Request(msg["id"], msg["prompt"], msg.get("params"))
            r.seed, r.blocks, r.compute, r.outcome = msg["seed"], None, False, None
            self.reqs[r.request_id] = r
            self.order.append(r.request_id)
            self.sched.on_new_request(r)  # as vLLM's scheduler does as a request arrives
        else:
            raise SystemExit(f"unknown message {msg}")

    def wait_s(self):
        """How long the loop may wait before the next step: not at all while received KV
        waits to be checked; 1 ms while a request waits for blocks or for the connector to
        be asked again ("ask later"), which nothing signals, or while exiting; else until
        the router writes or the worker's event fd says get_finished has something (a load
        landed, a push or a hold ended), at most IDLE_S. A step polling every millisecond
        when nothing can have changed cost each Python process about a quarter of a CPU
        (a few hundred µs of Python a step), taken from the plugin's threads moving the KV
        on a 2-CPU machine."""
        if self.ready or self.verifying:
            return 0.0
        if self.exiting or any(self.reqs[rid].status == fv.RequestStatus.WAITING for rid in self.order):
            return 0.001
        return IDLE_S

    def read(self, timeout, wake_on_fd=True):
        """Waits up to timeout for the router's messages, or for the worker's event fd
        (readable once get_finished has something), and handles the messages."""
        fds = [0, self.event_fd] if wake_on_fd and self.event_fd >= 0 else [0]
        rl, _, _ = select.select(fds, [], [], timeout)
        if 0 not in rl:
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
            if not self.read(self.wait_s()):
                break
            self.step()
            if self.exiting and ((not self.reqs and not self.held and not self.ready)
                                 or time.monotonic() >= self.drain_end):
                break
        st = self.worker.plugin_stats()
        adapter = self.worker.get_kv_connector_stats()
        send({"op": "stats", "blocks_total": self.blocks_total, "blocks_free": len(self.free),
              "null_block_zero": self.m.null_block_zero() if self.m.window else None,
              "requests_left": len(self.reqs), "held": len(self.held), "plugin": st, "adapter": adapter.data,
              "steps": self.steps})
        self.worker.shutdown()
        self.sched.shutdown()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--role", choices=["prefill", "decode"], required=True)
    p.add_argument("--config", required=True, help="the --kv-transfer-config JSON")
    p.add_argument("--layout", default="packed")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the KV cache lives")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--num-blocks", type=int, default=256)
    p.add_argument("--max-prompt", type=int, default=0, help="the longest prompt (default: the whole cache)")
    p.add_argument("--window", type=int, default=0, help="a hybrid model: odd layers a sliding window of this "
                   "many tokens (its own KV cache group), even layers full attention (default 0: one group)")
    p.add_argument("--drain-s", type=float, default=10.0)
    p.add_argument("--fault", default="none", help="decode-dies, prefill-dies, decode-aborts; push mode: "
                   "prefill-dies-mid-push, decode-dies-mid-push (the router kills decode)")
    p.add_argument("--fault-at", type=int, default=0)
    a = p.parse_args()
    try:
        Instance(a).run()
    except Exception:
        send({"op": "fatal", "why": traceback.format_exc()})
        raise


if __name__ == "__main__":
    main()
