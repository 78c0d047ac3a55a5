#!/usr/bin/env python3
"""Drives compare.sh's instances: hand-off and TTFT through hixl, NixlConnector and
MooncakeConnector, the same prompts in interleaved rounds, with the A/A spread.

    compare.py --topology FILE --model DIR [--rounds 3] [--lengths "32 256 1024"]
               [--per-length 5] [--max-tokens 8] [--json FILE]

The topology (written by compare.sh) names the plain instance and, per connector, its
producer, consumer and proxy URLs and the process groups of the three.

- Prompts: token ids, per-length prompts per length per round, seeded by (round,
  length, index): the connectors of a round get the same prompts, and a round's are
  new, so no prefix cache serves them. The plain instance answers every prompt first.
- Warm-up: one prompt per length through each pair (handshakes, first allocations),
  kept out of the figures but checked like the rest.
- Rounds: connector order rotates each round (round r starts with the r-th), so no
  connector always runs first or last after another. While a pair runs, every other
  instance is stopped (SIGSTOP of its process group; NIXL's UCX progress threads spin
  even when idle and would take the two cores from whoever runs). Requests go one at a
  time, grouped by length; the consumer's /metrics are read before and after each
  group (transfer time: vllm:hixl_transfer_seconds, vllm:nixl_xfer_time_seconds;
  MooncakeConnector exports none) and the pair must hold nothing before it is stopped.
  The first answer after a pair is resumed is not counted (nor the floor's).
- Floor: in each round the plain instance also answers the round's prompts, streamed,
  with each prompt already in its prefix cache (it answered them first): request to
  first token with no connector, vLLM computing only the tokens past the last full
  block below the prompt's end (at most a block). Hand-off minus this floor is what a
  connector adds: its transfer and the scheduler steps of an asynchronous load.
- Figures per connector and length: TTFT and hand-off p50 over all rounds; each
  round's hand-off p50; A/A spread = each round's p50 over the median of that
  connector's other rounds (median, min, max); hixl / peer = hixl's p50 over the peer's,
  pooled and per round (same round, same prompts).
Exit 0 only if every answer equals the plain instance's and every pair ends holding
nothing (KV cache usage 0, no request running or waiting).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_check import ask, counter, http, metrics, settled, wait_settled  # noqa: E402
from proxy import Upstream, stream_completion  # noqa: E402

# The consumer's transfer-time histogram of each connector (seconds) and its counter of
# failed loads (a failed load is recomputed: the tokens stay right, the figure not).
XFER = {"hixl": "vllm:hixl_transfer_seconds", "hixl-fwd": "vllm:hixl_transfer_seconds", "nixl": "vllm:nixl_xfer_time_seconds"}
FAILED = {"hixl": "hixl_loads_failed", "hixl-fwd": "hixl_loads_failed", "nixl": "nixl_num_failed_transfers"}


def prompt(vocab: int, rnd_key: str, n: int) -> list:
    rnd = random.Random(rnd_key)
    return [rnd.randrange(3, vocab) for _ in range(n)]


def signal_groups(pgids: list, sig: int) -> None:
    for g in pgids:
        try:
            os.killpg(g, sig)
        except ProcessLookupError:
            pass


def wait_healthy(urls: list, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for u in urls:
        while True:
            try:
                st, _ = http(u + "/health", timeout=5)
                if st == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{u} not healthy {seconds:.0f} s after SIGCONT")
            time.sleep(0.1)


def xfer(m: dict, connector: str) -> tuple:
    """(transfer seconds, transfers, failed loads) so far; None where not exported."""
    name = XFER.get(connector)
    if not name:
        return None, None, None
    return m.get(name + "_sum", 0.0), m.get(name + "_count", 0.0), counter(m, FAILED[connector])


def median(xs: list) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(per_round: list) -> dict:
    """A/A: each round's p50 over the median of the same connector's other rounds."""
    rs = []
    for i, x in enumerate(per_round):
        others = [y for j, y in enumerate(per_round) if j != i]
        if others and median(others) > 0:
            rs.append(x / median(others))
    if not rs:
        return {"median": None, "min": None, "max": None}
    return {"median": median(rs), "min": min(rs), "max": max(rs)}


def fmt(x, f=".1f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and x != x) else format(x, f)


def first_token_ms(url: str, model: str, ids: list, max_tokens: int) -> tuple:
    """(request to first token in ms, token ids) of a streamed completion."""
    t0 = time.monotonic()
    first, toks = None, []
    doc = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
           "stream": True, "return_token_ids": True}
    for ev in stream_completion(Upstream(url, 300.0), doc, "plain"):
        for ch in ev.get("choices") or []:
            got = ch.get("token_ids") or []
            if got and first is None:
                first = time.monotonic()
            toks += got
    return 1e3 * ((first or time.monotonic()) - t0), toks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lengths", default="32 256 1024")
    ap.add_argument("--per-length", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    with open(a.topology) as f:
        topo = json.load(f)
    with open(os.path.join(a.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    lengths = [int(x) for x in a.lengths.split()]
    conns = list(topo["pairs"])
    plain = topo["plain"]
    all_groups = [plain["pgid"]] + [g for c in conns for g in topo["pairs"][c]["pgids"]]
    load = {"start": os.getloadavg(), "cpus": os.cpu_count()}

    warm = {L: prompt(vocab, f"{a.seed}-warm-{L}", L) for L in lengths}
    rounds = [{L: [prompt(vocab, f"{a.seed}-{r}-{L}-{i}", L) for i in range(a.per_length)] for L in lengths}
              for r in range(a.rounds)]
    every = list(warm.values()) + [p for rd in rounds for L in lengths for p in rd[L]]
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as ex:
        refs = list(ex.map(lambda p: ask(plain["url"], a.model, p, a.max_tokens), every))
    bad = [r for r in refs if "error" in r]
    if bad:
        print(f"compare: the plain instance failed: {bad[0]['error']}", file=sys.stderr)
        return 1
    ref = {tuple(p): r["tokens"] for p, r in zip(every, refs)}
    print(f"compare: plain answered {len(every)} prompts in {time.monotonic() - t0:.0f} s", flush=True)

    samples = {c: {L: [] for L in lengths} for c in conns}   # (round, ttft_ms, handoff_ms)
    xfers = {c: {L: [0.0, 0.0, 0.0] for L in lengths} for c in conns}  # transfer seconds, count, failed
    wrong, errors, ends = [], [], {}

    def run_pair(c: str, plan: list, r: int) -> None:
        """plan: [(length, [prompts])]; r < 0 for the warm-up."""
        pair = topo["pairs"][c]
        signal_groups([g for g in all_groups if g not in pair["pgids"]], signal.SIGSTOP)
        signal_groups(pair["pgids"], signal.SIGCONT)
        wait_healthy([pair["prefill"], pair["decode"], pair["proxy"]], 120)
        if r >= 0:  # one answer after the resume, not counted (as the floor's)
            ask(pair["proxy"], a.model, warm[lengths[0]], a.max_tokens)
        for L, ps in plan:
            before = xfer(metrics(pair["decode"]), c)
            for p in ps:
                y = ask(pair["proxy"], a.model, p, a.max_tokens)
                if "error" in y:
                    errors.append({"connector": c, "round": r, "prompt_tokens": L, "error": y["error"]})
                    continue
                if y["tokens"] != ref[tuple(p)]:
                    wrong.append({"connector": c, "round": r, "prompt_tokens": L,
                                  "plain": ref[tuple(p)], "pd": y["tokens"]})
                if r >= 0:
                    t = y["timing"]
                    samples[c][L].append((r, 1e3 * t["ttft_s"], 1e3 * t["handoff_s"]))
            after = xfer(metrics(pair["decode"]), c)
            if r >= 0 and before[0] is not None:
                xfers[c][L][0] += after[0] - before[0]
                xfers[c][L][1] += after[1] - before[1]
                xfers[c][L][2] += after[2] - before[2]
        ends[c] = wait_settled({"prefill": pair["prefill"], "decode": pair["decode"]}, 30)

    floor = {L: [] for L in lengths}  # (round, first token ms)

    def run_floor(r: int) -> None:
        signal_groups([g for g in all_groups if g != plain["pgid"]], signal.SIGSTOP)
        signal_groups([plain["pgid"]], signal.SIGCONT)
        wait_healthy([plain["url"]], 120)
        first_token_ms(plain["url"], a.model, warm[lengths[0]], a.max_tokens)
        for L in lengths:
            for p in rounds[r][L]:
                ms, toks = first_token_ms(plain["url"], a.model, p, a.max_tokens)
                if toks != ref[tuple(p)]:
                    wrong.append({"connector": "plain (floor)", "round": r, "prompt_tokens": L,
                                  "plain": ref[tuple(p)], "pd": toks})
                floor[L].append((r, ms))

    try:
        for c in conns:
            run_pair(c, [(L, [warm[L]]) for L in lengths], -1)
            print(f"compare: {c} warmed up", flush=True)
        for r in range(a.rounds):
            every_one = conns + ["floor"]
            order = every_one[r % len(every_one):] + every_one[:r % len(every_one)]
            for c in order:
                t1 = time.monotonic()
                if c == "floor":
                    run_floor(r)
                else:
                    run_pair(c, [(L, rounds[r][L]) for L in lengths], r)
                print(f"compare: round {r + 1}/{a.rounds} {c}: {time.monotonic() - t1:.1f} s", flush=True)
    finally:
        signal_groups(all_groups, signal.SIGCONT)
    # The end state of every pair, all running again.
    for c in conns:
        pair = topo["pairs"][c]
        ends[c] = {"after_its_last_round": ends.get(c),
                   "at_the_end": wait_settled({"prefill": pair["prefill"], "decode": pair["decode"]}, 30)}
    load["end"] = os.getloadavg()

    res = {}
    for c in conns:
        res[c] = {}
        for L in lengths:
            s = samples[c][L]
            per_round = [median([h for (rr, _, h) in s if rr == r]) for r in range(a.rounds)]
            per_round_ttft = [median([t for (rr, t, _) in s if rr == r]) for r in range(a.rounds)]
            xs, xn, xf = xfers[c][L]
            res[c][L] = {"n": len(s), "ttft_ms_p50": median([t for (_, t, _) in s]),
                         "handoff_ms_p50": median([h for (_, _, h) in s]),
                         "handoff_ms_min": min((h for (_, _, h) in s), default=None),
                         "handoff_ms_max": max((h for (_, _, h) in s), default=None),
                         "handoff_ms_p50_per_round": per_round, "ttft_ms_p50_per_round": per_round_ttft,
                         "aa_handoff": spread(per_round), "aa_ttft": spread(per_round_ttft),
                         "transfer_ms_mean": (1e3 * xs / xn) if xn else None, "transfers": xn if c in XFER else None,
                         "loads_failed": xf if c in XFER else None}
    res_floor = {L: {"n": len(floor[L]), "first_token_ms_p50": median([m for (_, m) in floor[L]]),
                     "first_token_ms_p50_per_round": [median([m for (rr, m) in floor[L] if rr == r])
                                                      for r in range(a.rounds)]} for L in lengths}
    for L in lengths:
        res_floor[L]["aa"] = spread(res_floor[L]["first_token_ms_p50_per_round"])
        for c in conns:
            res[c][L]["handoff_minus_floor_ms"] = res[c][L]["handoff_ms_p50"] - res_floor[L]["first_token_ms_p50"]
    ratios = {}
    # Each hixl variant (hixl, hixl-fwd: load_in_forward) over each peer, and hixl over its variants.
    for mine in [c for c in conns if c.startswith("hixl")]:
        for peer in conns:
            if peer == mine or (peer.startswith("hixl") and mine != "hixl"):
                continue
            ratios[f"{mine}/{peer}"] = {}
            for L in lengths:
                h, p = res[mine][L], res[peer][L]
                paired = [x / y for x, y in zip(h["handoff_ms_p50_per_round"], p["handoff_ms_p50_per_round"]) if y > 0]
                ratios[f"{mine}/{peer}"][L] = {
                    "handoff_p50": h["handoff_ms_p50"] / p["handoff_ms_p50"] if p["handoff_ms_p50"] > 0 else None,
                    "ttft_p50": h["ttft_ms_p50"] / p["ttft_ms_p50"] if p["ttft_ms_p50"] > 0 else None,
                    "handoff_per_round": paired,
                    "goal_le_1_0": None if not p["handoff_ms_p50"] else h["handoff_ms_p50"] <= p["handoff_ms_p50"],
                    "moonshot_le_0_8": None if not p["handoff_ms_p50"] else h["handoff_ms_p50"] <= 0.8 * p["handoff_ms_p50"]}
    held_nothing = all(settled(h) for c in conns for h in ends[c]["at_the_end"].values())
    n_all = sum(len(samples[c][L]) for c in conns for L in lengths)
    failed = sum(res[c][L]["loads_failed"] or 0 for c in conns for L in lengths)
    ok = not wrong and not errors and held_nothing and failed == 0
    print(f"\n{a.rounds} rounds x {len(lengths)} lengths x {a.per_length} prompts per connector, "
          f"{a.max_tokens} tokens each; {os.cpu_count()} CPUs, load average {load['start'][0]:.1f} at the start, "
          f"{load['end'][0]:.1f} at the end")
    print(f"\nms; floor = the plain instance's first token with the prompt in its prefix cache; A/A = each "
          f"round's p50 over the other rounds' median")
    print(f"{'prompt':>6} {'connector':>9} {'TTFT p50':>9} {'hand-off p50':>12} {'min':>7} {'max':>8} "
          f"{'- floor':>8} {'transfer mean':>13} {'A/A hand-off median [min, max]':>31} {'A/A TTFT':>8}")
    for L in lengths:
        for c in conns:
            x = res[c][L]
            aa, at = x["aa_handoff"], x["aa_ttft"]
            print(f"{L:>6} {c:>9} {fmt(x['ttft_ms_p50']):>9} {fmt(x['handoff_ms_p50']):>12} "
                  f"{fmt(x['handoff_ms_min']):>7} {fmt(x['handoff_ms_max']):>8} {fmt(x['handoff_minus_floor_ms']):>8} "
                  f"{fmt(x['transfer_ms_mean'], '.2f'):>13} "
                  f"{fmt(aa['median'], '.2f') + ' [' + fmt(aa['min'], '.2f') + ', ' + fmt(aa['max'], '.2f') + ']':>31} "
                  f"{fmt(at['median'], '.2f'):>8}")
        f_ = res_floor[L]
        aa = f_["aa"]
        print(f"{L:>6} {'floor':>9} {'':>9} {fmt(f_['first_token_ms_p50']):>12} {'':>7} {'':>8} {'':>8} {'':>13} "
              f"{fmt(aa['median'], '.2f') + ' [' + fmt(aa['min'], '.2f') + ', ' + fmt(aa['max'], '.2f') + ']':>31}")
    for k, v in ratios.items():
        print(f"\n{k}: hand-off p50 ratio per prompt length (goal <= 1.0, moonshot <= 0.8); per round in brackets")
        for L in lengths:
            q = v[L]
            print(f"{L:>6}: hand-off {fmt(q['handoff_p50'], '.2f')} "
                  f"[{', '.join(fmt(x, '.2f') for x in q['handoff_per_round'])}], TTFT {fmt(q['ttft_p50'], '.2f')}"
                  f" -> {'meets' if q['goal_le_1_0'] else 'misses'} 1.0x"
                  f"{', meets 0.8x' if q['moonshot_le_0_8'] else ''}")
    for c in conns:
        for when, hs in ends[c].items():
            if hs is None:
                continue
            print(f"{c}: {when.replace('_', ' ')}: " + "; ".join(
                f"{side} KV cache usage {h['kv_cache_usage_perc']}, running {h['running']}, waiting {h['waiting']}"
                for side, h in hs.items()))
    for w in wrong[:5]:
        print(f"compare: {w['connector']} round {w['round']}: {w['prompt_tokens']} tokens differ: "
              f"plain {w['plain']} p/d {w['pd']}")
    for e in errors[:5]:
        print(f"compare: {e['connector']} round {e['round']}: {e['prompt_tokens']} tokens: {e['error']}")
    print(f"compare: {n_all} measured answers and {len(conns) * len(lengths)} warm-ups, {len(wrong)} differ from "
          f"the plain instance's, {len(errors)} failed, {failed:.0f} loads failed and were recomputed; "
          f"every pair holds nothing at the end: {held_nothing}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rounds": a.rounds, "lengths": lengths, "per_length": a.per_length, "max_tokens": a.max_tokens,
                       "connectors": conns, "load": load, "results": res, "floor": res_floor, "ratios": ratios, "ends": ends,
                       "samples": samples, "floor_samples": floor, "wrong": wrong, "errors": errors, "ok": ok}, f, indent=1)
    print(f"compare: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
