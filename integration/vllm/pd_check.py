#!/usr/bin/env python3
"""Drives run-pd.sh's instances: the same greedy prompts through one plain vLLM and
through the P/D pair (proxy.py in front of a producer and a consumer that load hixl's
connector, or with --connector vLLM's NixlConnector or MooncakeConnector), compares
every generated token id, and reports TTFT, hand-off, bytes moved and the blocks each
side holds at the end, as a table and as JSON.

    pd_check.py --plain URL --proxy URL --prefill URL --decode URL --model DIR
                [--requests 20] [--concurrency 4] [--max-tokens 16] [--json FILE]
                [--kill-producer PID] [--label hixl] [--connector hixl|nixl|mooncake]
                [--scenarios prefix,same,short,abort,burst|all] [--burst 24] [--logs DIR]

Bytes moved and loads come from the consumer's /metrics: hixl's vllm:hixl_* counters,
NIXL's vllm:nixl_bytes_transferred histogram and vllm:nixl_num_failed_transfers;
MooncakeConnector exports none to /metrics (its stats go to the log), so they are n/a.
The fault case counts hixl's failed loads and is hixl's only.

Prompts are token ids (the completions API takes a list of ints), lengths from 1 token
to past 8 blocks, seeded, so every run asks the same. --kill-producer PID ends the run
with the fault case: one more prompt is prefilled on the producer, the producer is
SIGKILLed once it answered (its KV held for decode and never read), and decode must
recompute (kv_load_failure_policy "recompute") and still give the plain instance's
tokens. Exit 0 only if every answer is identical, both sides hold 0 blocks at the end, no
hold ended at its lease, and, with the fault, decode counted the failed load.

--scenarios runs, after the prompts and before the fault, what vLLM's users do that
they do not (scenario() says each): a shared prefix (prefix-cache hits on both sides),
identical prompts at once, max_tokens 1 and short prompts, clients that hang up, a
burst past max_num_seqs. Each needs identical tokens, both sides back at 0, no failed
load, no hold ended at its lease, and no error in the logs of --logs DIR since it began.
"""

from __future__ import annotations

import argparse
import http.client as httpclient
import json
import os
import random
import re
import signal
import socket
import statistics
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

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


# ---- scenarios (--scenarios): what vLLM users do that the main run does not ----

SCENARIOS = ("prefix", "same", "short", "abort", "burst")
LOG_BAD = re.compile(r"Traceback|\bERROR\b|\[hixl E |^hixl: ")


class Logs:
    """The instances' logs, read from where the last look ended: what a scenario wrote."""

    def __init__(self, folder: str, names=("prefill", "decode")):
        self.paths = {n: os.path.join(folder, n + ".log") for n in names} if folder else {}
        self.at = {n: self._size(p) for n, p in self.paths.items()}

    @staticmethod
    def _size(p: str) -> int:
        try:
            return os.path.getsize(p)
        except OSError:
            return 0

    def bad_since(self) -> list:
        out = []
        for n, p in self.paths.items():
            try:
                with open(p, "rb") as f:
                    f.seek(self.at[n])
                    text = f.read().decode(errors="replace")
                    self.at[n] = f.tell()
            except OSError:
                continue
            out += [f"{n}: {line.strip()[:300]}" for line in text.splitlines() if LOG_BAD.search(line)]
        return out


def compare(plain: list, pd: list, max_tokens: int) -> tuple:
    """(identical count, the rows that are not)."""
    same, bad = 0, []
    for i, (x, y) in enumerate(zip(plain, pd)):
        ok = "error" not in x and "error" not in y and y["tokens"] == x["tokens"] and len(x["tokens"]) == max_tokens
        same += ok
        if not ok:
            bad.append({"i": i, "plain": x.get("tokens", x.get("error")), "pd": y.get("tokens", y.get("error"))})
    return same, bad


def through_both(a, ps: list, max_tokens: int, concurrency: int, sequential: int = 0) -> tuple:
    """ps through the plain instance and the proxy (the first `sequential` one at a time,
    the rest `concurrency` at a time); (identical, n, mismatches)."""
    with ThreadPoolExecutor(max(1, concurrency)) as ex:
        plain = list(ex.map(lambda p: ask(a.plain, a.model, p, max_tokens), ps))
    pd = [ask(a.proxy, a.model, p, max_tokens) for p in ps[:sequential]]
    with ThreadPoolExecutor(max(1, concurrency)) as ex:
        pd += list(ex.map(lambda p: ask(a.proxy, a.model, p, max_tokens), ps[sequential:]))
    same, bad = compare(plain, pd, max_tokens)
    return same, len(ps), bad


def prefilled(a, p: list) -> Optional[dict]:
    """p prefilled on the producer (as the proxy does): the params decode needs."""
    st, body = http(a.prefill + "/v1/completions", {"model": a.model, "prompt": p, "max_tokens": 1,
                                                    "temperature": 0, "kv_transfer_params": {"do_remote_decode": True}})
    return json.loads(body).get("kv_transfer_params") if st == 200 else None


def hang_up(url: str, doc: dict, after_s: float, first_event: bool = False) -> str:
    """POST a streamed completion and close the connection: after_s seconds after the
    request is sent, or once the first event came (first_event). What was seen."""
    u = urllib.parse.urlparse(url)
    c = httpclient.HTTPConnection(u.hostname, u.port, timeout=60)
    body = json.dumps(dict(doc, stream=True)).encode()
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    seen = "sent"
    if first_event:
        r = c.getresponse()
        for raw in r:
            if raw.strip().startswith(b"data:"):
                seen = "first event"
                break
    elif after_s > 0:
        time.sleep(after_s)
    try:
        c.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    c.close()
    return seen


def scenario(a, name: str, vocab: int) -> dict:
    """One scenario: what ran, identical n/n, and what the sides hold after it."""
    rnd = random.Random(f"{a.seed}-{name}")
    tok = lambda n: [rnd.randrange(3, vocab) for _ in range(n)]
    logs = Logs(a.logs)
    m0 = {"prefill": metrics(a.prefill), "decode": metrics(a.decode)}
    t0 = time.monotonic()
    info, same, n, bad = {}, 0, 0, []
    mt = a.max_tokens
    if name == "prefix":
        # A long shared prefix: decode (and prefill) find its blocks in their own prefix
        # caches, so a load fills only the blocks after the local hit (num_computed_tokens
        # > 0 in get_num_new_matched_tokens); a prompt that is a block-multiple prefix of
        # an earlier one, one that is exactly the prefix, and concurrent variants.
        base = tok(300)
        ps = [base + tok(40), base + tok(70), base[:64], base, base + tok(1), base[:95] + tok(200)]
        ps += [base + tok(rnd.randrange(1, 80)) for _ in range(4)]
        same, n, bad = through_both(a, ps, mt, 4, sequential=6)
    elif name == "same":
        # The same prompt at once (one prefix hash on both sides, requests racing for it),
        # then again one at a time (the whole prompt cached on decode but its last token).
        p = tok(150)
        q = tok(64)
        same, n, bad = through_both(a, [p] * 4 + [q] * 4 + [p, q], mt, 4, sequential=0)
        s2, n2, b2 = through_both(a, [p, q], mt, 1, sequential=2)
        same, n, bad = same + s2, n + n2, bad + b2
    elif name == "short":
        # max_tokens 1 and 2 (decode samples the token the last prompt token gives),
        # prompts under one block and exact block multiples.
        lens = [1, 3, 31, 32, 64, 96]
        for k in (1, 2):
            s_, n_, b_ = through_both(a, [tok(x) for x in lens], k, 3, sequential=2)
            same, n, bad = same + s_, n + n_, bad + b_
    elif name == "abort":
        # Clients that hang up. A: decode's requests closed 0.3 s after they were sent,
        # while decode runs max_num_seqs requests (through the proxy), so they wait in its
        # queue: their producer's hold must be freed (request_finished's FREE), not left
        # to its lease; and prefills closed while they run (600 tokens and 63 more to go:
        # never ended and held before the hang-up lands). Neither side may keep a block.
        seen = []

        def prefill_one() -> Optional[dict]:
            p = tok(rnd.choice([40, 200, 500]))
            params = prefilled(a, p)
            if params is None:
                bad.append({"i": len(seen), "pd": "prefill gave no kv_transfer_params"})
                return None
            return {"model": a.model, "prompt": p, "max_tokens": 64, "temperature": 0, "ignore_eos": True,
                    "kv_transfer_params": params}

        def hang_decode(doc: Optional[dict], after: float, first_event: bool = False) -> None:
            if doc is not None:
                seen.append(f"decode {after}: " + hang_up(a.decode, doc, after, first_event=first_event))

        queued = [prefill_one() for _ in range(4)]
        loads0 = counter(metrics(a.decode), "hixl_loads_done")
        busy = ThreadPoolExecutor(1).submit(through_both, a, [tok(300) for _ in range(8)], 200, 8)
        deadline = time.monotonic() + 30
        while (held(a.decode)["running"] or 0) < 8 and time.monotonic() < deadline and not busy.done():
            time.sleep(0.05)
        info["decode_running"] = held(a.decode)["running"]
        with ThreadPoolExecutor(4) as ex:
            list(ex.map(lambda d: hang_decode(d, 0.3), queued))
        for after in (0.0, 0.05, None):
            doc = {"model": a.model, "prompt": tok(600), "max_tokens": 64, "temperature": 0, "ignore_eos": True,
                   "kv_transfer_params": {"do_remote_decode": True}}
            seen.append(f"prefill {after}: " + hang_up(a.prefill, doc, after or 0.0, first_event=after is None))
        same, n, bad = busy.result()
        info["queued_loaded"] = counter(metrics(a.decode), "hixl_loads_done") - loads0 - 8  # 0: all freed queued
        wait_settled({"prefill": a.prefill, "decode": a.decode}, 45)
        info["queued_lease_expired"] = (counter(metrics(a.prefill), "hixl_lease_expired")
                                        - counter(m0["prefill"], "hixl_lease_expired"))
        # B: decode idle, closed 5 to 200 ms after they were sent or after the first token:
        # queued, loading or running. One closed before vLLM's server handed it to its
        # engine never reached the connector, and its producer's hold ends at its lease
        # (as designed; up to one per hang-up within 20 ms allowed).
        early = 0
        for after in (0.005, 0.02, 0.05, 0.2, None):
            early += after is not None and after <= 0.02
            hang_decode(prefill_one(), after or 0.0, first_event=after is None)
        info["hung_up"] = seen
        info["lease_allowed"] = early
        wait_settled({"prefill": a.prefill, "decode": a.decode}, 45)
        info["settled_s"] = round(time.monotonic() - t0, 1)
        s_, n_, b_ = through_both(a, [tok(x) for x in (40, 200, 500, 33)], mt, 2, sequential=1)
        same, n, bad = same + s_, n + n_, bad + b_
    elif name == "burst":
        # More requests at once than max_num_seqs, long enough to grow past a small decode
        # KV cache (run-pd.sh --decode-blocks): decode queues them and preempts.
        ps = [tok(rnd.randrange(150, 500)) for _ in range(a.burst)]
        same, n, bad = through_both(a, ps, 48, a.burst, sequential=0)
    else:
        raise ValueError(name)
    wall = time.monotonic() - t0
    end = wait_settled({"prefill": a.prefill, "decode": a.decode}, 45)
    m1 = {"prefill": metrics(a.prefill), "decode": metrics(a.decode)}
    d = lambda side, k: counter(m1[side], k) - counter(m0[side], k)
    info.update({"decode_prefix_hit_tokens": d("decode", "prefix_cache_hits"),
                 "prefill_prefix_hit_tokens": d("prefill", "prefix_cache_hits"),
                 "decode_preemptions": d("decode", "num_preemptions"),
                 "loads_done": d("decode", "hixl_loads_done"), "loads_failed": d("decode", "hixl_loads_failed"),
                 "bytes_loaded": d("decode", "hixl_bytes_loaded"),
                 "lease_expired": d("prefill", "hixl_lease_expired") + d("decode", "hixl_lease_expired")})
    log_bad = logs.bad_since()
    ok = (same == n and all(settled(h) for h in end.values()) and not info["loads_failed"]
          and info["lease_expired"] <= info.get("lease_allowed", 0) and not info.get("queued_lease_expired")
          and not log_bad)
    return {"scenario": name, "identical": same, "n": n, "wall_s": round(wall, 1), "ok": ok, "info": info,
            "end": end, "mismatch": bad[:4], "log_errors": log_bad[:20]}


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
    ap.add_argument("--scenarios", default="", help="comma list of: " + ", ".join(SCENARIOS) + " (or all)")
    ap.add_argument("--burst", type=int, default=24, help="requests at once in the burst scenario")
    ap.add_argument("--logs", default="", help="the folder of prefill.log and decode.log (scenarios check them)")
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
    # Holds that ended at their lease, not freed by a load: none in a run that loaded all.
    expired = counter(metrics(a.prefill), "hixl_lease_expired") + counter(md, "hixl_lease_expired")
    names = [x for x in a.scenarios.split(",") if x]
    names = list(SCENARIOS) if names == ["all"] else names
    for x in names:
        if x not in SCENARIOS:
            ap.error(f"--scenarios: unknown {x!r} (known: {', '.join(SCENARIOS)})")
    scen = []
    for x in names:
        r = scenario(a, x, vocab)
        scen.append(r)
        print(f"{a.label}: scenario {x}: identical {r['identical']}/{r['n']}, {r['wall_s']} s, "
              f"{'ok' if r['ok'] else 'FAILED'}; {json.dumps(r['info'])}; end "
              + "; ".join(f"{k} {h['hixl_blocks_held']} blocks, usage {h['kv_cache_usage_perc']}, running "
                          f"{h['running']}, waiting {h['waiting']}" for k, h in r["end"].items()), flush=True)
        for b in r["mismatch"]:
            print(f"  request {b['i']}: plain {b.get('plain')}\n  {' ' * len(str(b['i']))}          p/d   {b['pd']}")
        for line in r["log_errors"]:
            print(f"  log: {line}")
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
        "lease_expired": expired, "end": end, "fault": fault, "scenarios": scen, "rows": rows,
    }
    # Every load of the main run must have been a real load: a failed one is recomputed
    # (tokens still identical) and would hide a hand-off bug.
    ok = same == a.requests and summary["loads_failed"] in (0, None) and not expired and all(settled(h) for h in end.values()) and (fault is None or fault["ok"]) and all(r["ok"] for r in scen)
    summary["ok"] = ok

    print(f"\n{'prompt tokens':>13} {'identical':>9} {'TTFT ms':>9} {'hand-off ms':>11} {'prefill ms':>10}")
    for r in rows:
        print(f"{r['prompt_tokens']:>13} {('yes' if r['identical'] else 'NO'):>9} {r['ttft_ms']:>9.1f} "
              f"{r['handoff_ms']:>11.1f} {r['prefill_ms']:>10.1f}" + (f"  {r['error']}" if r["error"] else ""))
    print(f"\n{a.label}: identical {same}/{a.requests}; TTFT p50 {summary['ttft_ms_p50']:.1f} ms p99 "
          f"{summary['ttft_ms_p99']:.1f} ms; hand-off p50 {summary['handoff_ms_p50']:.1f} ms p99 "
          f"{summary['handoff_ms_p99']:.1f} ms; bytes moved {na(bytes_loaded)}; loads {na(loads_done)}, failed "
          f"{na(loads_failed)}; holds ended at their lease {expired:.0f}")
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
