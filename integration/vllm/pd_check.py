#!/usr/bin/env python3
"""Drives run-pd.sh's instances: the same greedy prompts through one plain vLLM and
through the P/D pair (proxy.py in front of a producer and a consumer that load hixl's
connector, or with --connector vLLM's NixlConnector or MooncakeConnector), compares
every generated token id, and reports TTFT, hand-off, bytes moved and the blocks each
side holds at the end, as a table and as JSON.

    pd_check.py --plain URL --proxy URL --prefill URL --decode URL --model DIR
                [--requests 20] [--concurrency 4] [--max-tokens 16] [--json FILE]
                [--kill-producer PID] [--label hixl] [--connector hixl|nixl|mooncake]

Bytes moved and loads come from the consumer's /metrics: hixl's vllm:hixl_* counters,
NIXL's vllm:nixl_bytes_transferred histogram and vllm:nixl_num_failed_transfers;
MooncakeConnector exports none to /metrics (its stats go to the log), so they are n/a.
The fault case counts hixl's failed loads and is hixl's only.

Prompts are token ids (the completions API takes a list of ints), lengths from 1 token
to past 8 blocks, seeded, so every run asks the same. --kill-producer PID ends the run
with the fault case: one more prompt is prefilled on the producer, the producer is
SIGKILLed once it answered (its KV held for decode and never read), and decode must
recompute (kv_load_failure_policy "recompute") and still give the plain instance's
tokens. Exit 0 only if every answer is identical, both sides hold 0 blocks at the end
and, with the fault, decode counted the failed load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

# Prompt lengths in tokens: 1 token, around block edges (32-token blocks), past 8 blocks.
LENGTHS = [1, 2, 7, 31, 32, 33, 63, 64, 65, 100, 127, 129, 200, 255, 257, 300, 333, 400, 480, 600]


def http(url: str, doc: dict = None, timeout: float = 300.0):
    data = json.dumps(doc).encode() if doc is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
            return r.status, body
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def prompts(n: int, vocab: int, seed: int) -> list:
    rnd = random.Random(seed)
    lens = [LENGTHS[i % len(LENGTHS)] + 7 * (i // len(LENGTHS)) for i in range(n)]
    # Ids past the specials (0..2); each prompt its own, so no prefix is shared.
    return [[rnd.randrange(3, vocab) for _ in range(n_)] for n_ in lens]


def ask(url: str, model: str, ids: list, max_tokens: int) -> dict:
    st, body = http(url + "/v1/completions", {"model": model, "prompt": ids, "max_tokens": max_tokens,
                                               "temperature": 0, "ignore_eos": True, "return_token_ids": True})
    if st != 200:
        return {"error": f"HTTP {st}: {body[:400].decode(errors='replace')}"}
    doc = json.loads(body)
    ch = doc["choices"][0]
    return {"tokens": ch.get("token_ids") or [], "timing": doc.get("hixl_timing"), "doc": doc}


METRIC = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfa]+)$')


def metrics(url: str) -> dict:
    """Prometheus text as {name: sum over label sets}."""
    st, body = http(url + "/metrics", timeout=30)
    out = {}
    if st != 200:
        return out
    for line in body.decode().splitlines():
        m = METRIC.match(line.strip())
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def counter(m: dict, name: str) -> float:
    """A counter of vLLM's /metrics (prometheus_client adds _total to a counter's name)."""
    return m.get(f"vllm:{name}_total", m.get(f"vllm:{name}", 0.0))


def loads(m: dict, connector: str) -> tuple:
    """(bytes loaded, loads done, loads failed) from the consumer's /metrics; None where
    the connector exports no such figure."""
    if connector.startswith("hixl"):
        return counter(m, "hixl_bytes_loaded"), counter(m, "hixl_loads_done"), counter(m, "hixl_loads_failed")
    if connector == "nixl":
        return (m.get("vllm:nixl_bytes_transferred_sum", 0.0), m.get("vllm:nixl_bytes_transferred_count", 0.0),
                counter(m, "nixl_num_failed_transfers"))
    return None, None, None


def na(x, fmt: str = ".0f") -> str:
    return "n/a" if x is None else format(x, fmt)


def held(url: str) -> dict:
    m = metrics(url)
    return {"hixl_blocks_held": m.get("vllm:hixl_blocks_held"), "kv_cache_usage_perc": m.get("vllm:kv_cache_usage_perc"),
            "running": m.get("vllm:num_requests_running"), "waiting": m.get("vllm:num_requests_waiting")}


def settled(h: dict) -> bool:
    return (h["kv_cache_usage_perc"] == 0.0 and not h["running"] and not h["waiting"]
            and (h["hixl_blocks_held"] in (None, 0.0)))


def wait_settled(urls: dict, seconds: float) -> dict:
    """The sides' holdings once every side holds nothing, or as they are at the deadline.
    vLLM frees a producer's blocks at the step after the consumer's FREE; an idle engine
    still steps while the connector holds requests, so this converges without traffic."""
    deadline = time.monotonic() + seconds
    while True:
        now = {k: held(u) for k, u in urls.items()}
        if all(settled(h) for h in now.values()) or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def kill_group(pgid: int) -> None:
    """SIGKILL a process group (a vLLM instance: server, engine core, worker) and return
    once none of its processes runs (zombies left to their parent count as gone)."""
    os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        alive = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        st = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(st[2]) == pgid and st[0] != "Z":
                    alive.append(d)
        if not alive:
            return
        time.sleep(0.05)
    raise RuntimeError(f"process group {pgid} still runs 30 s after SIGKILL")


def pct(xs: list, q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plain", required=True)
    ap.add_argument("--proxy", required=True)
    ap.add_argument("--prefill", required=True)
    ap.add_argument("--decode", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kill-producer", type=int, default=0)
    ap.add_argument("--label", default="hixl")
    ap.add_argument("--connector", default="hixl", choices=["hixl", "hixl-fwd", "nixl", "mooncake", "mooncake-stock"])
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    with open(os.path.join(a.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    ps = prompts(a.requests, vocab, a.seed)

    t0 = time.monotonic()
    with ThreadPoolExecutor(a.concurrency) as ex:
        plain = list(ex.map(lambda p: ask(a.plain, a.model, p, a.max_tokens), ps))
    bad = [i for i, r in enumerate(plain) if "error" in r]
    if bad:
        print(f"pd_check: the plain instance failed prompt {bad[0]}: {plain[bad[0]]['error']}", file=sys.stderr)
        return 1
    # The first quarter one at a time (nothing else in flight), the rest concurrently.
    k = max(1, a.requests // 4)
    pd = [ask(a.proxy, a.model, p, a.max_tokens) for p in ps[:k]]
    with ThreadPoolExecutor(a.concurrency) as ex:
        pd += list(ex.map(lambda p: ask(a.proxy, a.model, p, a.max_tokens), ps[k:]))
    wall = time.monotonic() - t0

    rows, same = [], 0
    for i, (p, x, y) in enumerate(zip(ps, plain, pd)):
        ok = "error" not in y and y["tokens"] == x["tokens"] and len(x["tokens"]) == a.max_tokens
        same += ok
        t = (y.get("timing") or {}) if "error" not in y else {}
        rows.append({"prompt_tokens": len(p), "identical": ok, "error": y.get("error"),
                     "ttft_ms": 1e3 * t.get("ttft_s", float("nan")), "handoff_ms": 1e3 * t.get("handoff_s", float("nan")),
                     "prefill_ms": 1e3 * t.get("prefill_s", float("nan")),
                     "remote_request_id": ((y.get("doc") or {}).get("prefill_kv_transfer_params") or {}).get(
                         "remote_request_id"), "plain": x["tokens"], "pd": y.get("tokens")})

    end = wait_settled({"prefill": a.prefill, "decode": a.decode}, 30)
    md = metrics(a.decode)
    fault = None
    if a.kill_producer and not a.connector.startswith("hixl"):
        ap.error("--kill-producer counts hixl's failed loads: hixl only")
    if a.kill_producer:
        p = prompts(a.requests + 1, vocab, a.seed + 1)[-1][:200]
        ref = ask(a.plain, a.model, p, a.max_tokens)
        st, body = http(a.prefill + "/v1/completions", {"model": a.model, "prompt": p, "max_tokens": 1,
                                                        "temperature": 0, "kv_transfer_params": {"do_remote_decode": True}})
        params = json.loads(body).get("kv_transfer_params") if st == 200 else None
        before = counter(metrics(a.decode), "hixl_loads_failed")
        kill_group(a.kill_producer)
        st2, body2 = http(a.decode + "/v1/completions", {"model": a.model, "prompt": p, "max_tokens": a.max_tokens,
                                                         "temperature": 0, "ignore_eos": True, "return_token_ids": True,
                                                         "kv_transfer_params": params})
        got = json.loads(body2)["choices"][0].get("token_ids") if st2 == 200 else None
        after = wait_settled({"decode": a.decode}, 30)["decode"]
        failed = counter(metrics(a.decode), "hixl_loads_failed") - before
        fault = {"case": "producer killed after prefill, before decode's load", "prompt_tokens": len(p),
                 "params_from_producer": params is not None, "decode_status": st2,
                 "identical": got == ref.get("tokens"), "loads_failed": failed, "decode_after": after,
                 "ok": params is not None and st2 == 200 and got == ref.get("tokens") and failed >= 1 and settled(after)}

    ttft = [r["ttft_ms"] for r in rows if r["error"] is None]
    hand = [r["handoff_ms"] for r in rows if r["error"] is None]
    bytes_loaded, loads_done, loads_failed = loads(md, a.connector)
    summary = {
        "label": a.label, "connector": a.connector, "requests": a.requests, "identical": same, "wall_s": wall,
        "ttft_ms_p50": pct(ttft, 0.5), "ttft_ms_p99": pct(ttft, 0.99),
        "handoff_ms_p50": pct(hand, 0.5), "handoff_ms_p99": pct(hand, 0.99),
        "bytes_loaded": bytes_loaded, "loads_done": loads_done, "loads_failed": loads_failed,
        "end": end, "fault": fault, "rows": rows,
    }
    # Every load of the main run must have been a real load: a failed one is recomputed
    # (tokens still identical) and would hide a hand-off bug.
    ok = same == a.requests and summary["loads_failed"] in (0, None) and all(settled(h) for h in end.values()) and (fault is None or fault["ok"])
    summary["ok"] = ok

    print(f"\n{'prompt tokens':>13} {'identical':>9} {'TTFT ms':>9} {'hand-off ms':>11} {'prefill ms':>10}")
    for r in rows:
        print(f"{r['prompt_tokens']:>13} {('yes' if r['identical'] else 'NO'):>9} {r['ttft_ms']:>9.1f} "
              f"{r['handoff_ms']:>11.1f} {r['prefill_ms']:>10.1f}" + (f"  {r['error']}" if r["error"] else ""))
    print(f"\n{a.label}: identical {same}/{a.requests}; TTFT p50 {summary['ttft_ms_p50']:.1f} ms p99 "
          f"{summary['ttft_ms_p99']:.1f} ms; hand-off p50 {summary['handoff_ms_p50']:.1f} ms p99 "
          f"{summary['handoff_ms_p99']:.1f} ms; bytes moved {na(bytes_loaded)}; loads {na(loads_done)}, failed "
          f"{na(loads_failed)}")
    for side, h in end.items():
        blocks = f"{h['hixl_blocks_held']} hixl blocks, " if a.connector.startswith("hixl") else ""
        print(f"{a.label}: {side} holds {blocks}KV cache usage {h['kv_cache_usage_perc']}, "
              f"running {h['running']}, waiting {h['waiting']}")
    if fault:
        print(f"{a.label}: fault ({fault['case']}): decode HTTP {fault['decode_status']}, identical "
              f"{fault['identical']}, failed loads counted {fault['loads_failed']:.0f}, "
              f"{'ok' if fault['ok'] else 'FAILED'}")
    for r in rows:
        if not r["identical"] and r["error"] is None:
            print(f"  {r['prompt_tokens']} tokens: plain {r['plain']}\n  {' ' * len(str(r['prompt_tokens']))} "
                  f"tokens: p/d   {r['pd']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(f"{a.label}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
