"""The router of a two-process hand-off (vLLM's disaggregated-serving proxy in miniature):
starts a prefill and a decode pd_instance.py on 127.0.0.1, sends each request to
prefill, carries the kv_transfer_params prefill's request_finished returned to decode
(pull), or decode's push params to prefill (push), and collects each request's outcome
and each side's blocks and counters at exit. For the fault decode-dies-mid-push it kills
decode when prefill says it has pushed half a request's layers, then lets prefill go on."""

from __future__ import annotations

import json
import os
import random
import select
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable


_HELD = []  # sockets holding the ports free_port gave, open until this process exits


def free_port() -> int:
    """A port on 127.0.0.1 held for this process: bound with SO_REUSEADDR, never
    listening, so no parallel test's bind(:0) takes it before the engine (which sets
    SO_REUSEADDR too) listens there."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return s.getsockname()[1]


def kv_transfer_config(role: str, port: int, mode: str = "pull", layout: str = "packed", **extra) -> Dict[str, Any]:
    """vLLM's --kv-transfer-config for one side, as a user writes it."""
    e = {"address": f"127.0.0.1:{port}", "mode": mode, "lease_ms": 30000, "transfer_timeout_ms": 3000,
         "connect_timeout_ms": 1000, "Transport": "tcp", "hixl_vllm": {"layout": layout}}
    if layout == "cross_layer":  # pd_instance's cross-layer tensor packs K|V in C: (B, L, N, H, 2D)
        e["hixl_vllm"]["cross_layer_axes"] = "BLNHC"
    e.update(extra)
    return {"kv_connector": "HixlKVConnector", "kv_connector_module_path": "hixl_vllm",
            "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
            "kv_load_failure_policy": "recompute", "kv_connector_extra_config": e}


@dataclass
class Side:
    name: str
    proc: subprocess.Popen
    buf: bytes = b""
    ready: bool = False
    stats: Optional[Dict[str, Any]] = None
    fatal: Optional[str] = None
    dead: bool = False
    mourned: bool = False  # its requests were counted lost (or it died after the exit)
    logs: List[str] = field(default_factory=list)

    def send(self, msg) -> None:
        if self.dead:
            return
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.dead = True


@dataclass
class Result:
    outcomes: Dict[str, str]
    whys: Dict[str, str]
    blocks_checked: int
    prefill: Optional[Dict[str, Any]]
    decode: Optional[Dict[str, Any]]
    prefill_rc: Optional[int]
    decode_rc: Optional[int]
    logs: List[str]
    seconds: float
    bytes_checked: int = 0  # KV bytes of the verified requests, every one compared
    prompts: Dict[str, int] = field(default_factory=dict)  # request -> prompt tokens
    handoff_ns: Dict[str, int] = field(default_factory=dict)  # verified request -> last layer saved to KV held
    busy_seconds: float = 0.0  # from the first request sent to the last one ended
    # verified request -> (last layer saved, KV held, its KV bytes): hixl-py-host's GB/s over the hand-offs
    handoff_spans: Dict[str, tuple] = field(default_factory=dict)

    def summary(self) -> str:
        n = len(self.outcomes)
        v = sum(o == "verified" for o in self.outcomes.values())
        return f"verified {v}/{n} requests, {self.blocks_checked} blocks checked with torch.equal"


def run(mode: str = "pull", layout: str = "packed", requests: int = 8, min_prompt: int = 16, max_prompt: int = 300,
        seed: int = 1, timeout: float = 90.0, prefill_args=(), decode_args=(), extra=None, concurrency: int = 4,
        stop_after_fault: bool = False, on_done: Optional[Callable[[str, str], None]] = None,
        device: str = "cpu") -> Result:
    """Runs the hand-off of `requests` requests (prompts uniform in min_prompt..max_prompt
    tokens, seeded) with at most `concurrency` in flight; on_done(request, outcome) is
    called as each ends."""
    env = dict(os.environ)
    pp, dp = free_port(), free_port()
    extra = extra or {}
    sides = {}
    for name, port, args in (("prefill", pp, prefill_args), ("decode", dp, decode_args)):
        cfg = kv_transfer_config(name, port, mode, layout, **extra.get(name, {}))
        cmd = [PY, os.path.join(HERE, "pd_instance.py"), "--role", name, "--config", json.dumps(cfg),
               "--layout", layout, "--device", device, *args]
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        sides[name] = Side(name, p)
    rng = random.Random(seed)
    todo = [(f"req-{i}", rng.randrange(1 << 30), rng.randint(min_prompt, max_prompt)) for i in range(requests)]
    info = {rid: (s, n) for rid, s, n in todo}
    outcomes: Dict[str, str] = {}
    whys: Dict[str, str] = {}
    checked = 0
    nbytes = 0
    inflight = 0
    t_saved: Dict[str, int] = {}  # prefill's last layer saved (push: its params may come after decode's done)
    t_held: Dict[str, int] = {}  # decode's get_finished reported the KV received
    vbytes: Dict[str, int] = {}  # a verified request's KV bytes
    t_first = t_last = 0.0
    logs: List[str] = []
    t0 = time.monotonic()
    exit_sent = False
    where: Dict[str, str] = {}  # a request in flight: the side that has it now

    def handle(side: Side, msg) -> None:
        nonlocal checked, nbytes, inflight, t_last
        op = msg["op"]
        if op == "ready":
            side.ready = True
        elif op == "params":  # pull: prefill's request_finished -> decode
            rid = msg["id"]
            t_saved[rid] = msg.get("t_saved", 0)
            if mode == "pull":
                if msg["params"] and msg["delay"]:
                    s, n = info[rid]
                    where[rid] = "decode"
                    sides["decode"].send({"op": "load", "id": rid, "seed": s, "prompt": n, "params": msg["params"]})
                else:
                    outcomes[rid], whys[rid] = "failed", f"prefill gave no params: {msg}"
                    inflight -= 1
        elif op == "pushparams":  # push: decode allocated -> prefill writes into its blocks
            rid = msg["id"]
            s, n = info[rid]
            sides["prefill"].send({"op": "req", "id": rid, "seed": s, "prompt": n, "params": msg["params"]})
        elif op == "midpush":  # fault decode-dies-mid-push: prefill has pushed half the layers, waiting
            d = sides["decode"]
            d.proc.kill()
            d.proc.wait()
            logs.append("router: killed decode (SIGKILL) with prefill's push half done")
            side.send({"op": "go"})  # prefill pushes the rest into a dead peer
        elif op == "done":
            rid = msg["id"]
            outcomes[rid], whys[rid] = msg["outcome"], msg["why"]
            checked += msg["blocks_checked"]
            if msg["outcome"] == "verified":
                nbytes += msg.get("bytes_checked", 0)
                t_held[rid] = msg.get("t_held", 0)
                vbytes[rid] = msg.get("bytes_checked", 0)
            where.pop(rid, None)
            inflight -= 1
            t_last = time.monotonic()
            if on_done:
                on_done(rid, msg["outcome"])
        elif op == "stats":
            side.stats = msg
        elif op == "fatal":
            side.fatal = msg["why"]
            logs.append(f"{side.name}: fatal: {msg['why']}")
        elif op == "log":
            logs.append(f"{side.name}: {msg['msg']}")

    def mourn(side: Side) -> None:
        """A side died (EOF on its stdout, or a write to it failed): the requests it had
        die with it, and no new ones start."""
        nonlocal inflight
        if side.mourned:
            return
        side.mourned = True
        if not exit_sent:
            for rid, w in list(where.items()):
                if w == side.name or side.name == "decode":
                    outcomes[rid], whys[rid] = "lost", f"{side.name} died"
                    del where[rid]
                    inflight -= 1
            todo.clear()

    while time.monotonic() - t0 < timeout:
        live = [s for s in sides.values() if not s.dead]
        if all(s.ready for s in sides.values()):
            while todo and inflight < concurrency:
                rid, s, n = todo.pop(0)
                inflight += 1
                t_first = t_first or time.monotonic()
                if mode == "pull":
                    where[rid] = "prefill"
                    sides["prefill"].send({"op": "req", "id": rid, "seed": s, "prompt": n, "params": None})
                else:  # push: decode has it from now on (it ends it, loaded or not, while it lives)
                    where[rid] = "decode"
                    sides["decode"].send({"op": "load", "id": rid, "seed": s, "prompt": n,
                                          "params": {"do_remote_prefill": True}})
        for s in sides.values():  # before the exit: a write to a dead side fails before its EOF is read
            if s.dead:
                mourn(s)
        dead_any = any(s.dead for s in sides.values())
        if not exit_sent and ((not todo and inflight == 0) or (dead_any and stop_after_fault)):
            for s in sides.values():
                s.send({"op": "exit"})
            exit_sent = True
        if exit_sent and all(s.stats is not None or s.dead for s in sides.values()):
            break
        fds = {s.proc.stdout.fileno(): s for s in live}
        if not fds:
            break
        rl, _, _ = select.select(list(fds), [], [], 0.05)
        for fd in rl:
            side = fds[fd]
            data = os.read(fd, 1 << 16)
            if not data:
                side.dead = True
                mourn(side)
                continue
            side.buf += data
            while b"\n" in side.buf:
                line, side.buf = side.buf.split(b"\n", 1)
                if line.strip():
                    handle(side, json.loads(line))
        for s in sides.values():
            if s.fatal and not exit_sent:
                todo.clear()
                inflight = 0
    handoff = {rid: t - t_saved[rid] for rid, t in t_held.items() if t > t_saved.get(rid, 0) > 0}
    spans = {rid: (t_saved[rid], t_held[rid], vbytes[rid]) for rid in handoff}
    rcs = {}
    for name, s in sides.items():
        try:
            rcs[name] = s.proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            s.proc.kill()
            rcs[name] = s.proc.wait()
            logs.append(f"{name}: killed at the timeout")
    return Result(outcomes, whys, checked, sides["prefill"].stats, sides["decode"].stats, rcs["prefill"],
                  rcs["decode"], logs, time.monotonic() - t0, nbytes, {rid: n for rid, (_, n) in info.items()},
                  handoff, max(0.0, t_last - t_first), spans)
