#!/usr/bin/env python3
"""hixl's P/D proxy for vLLM's OpenAI completions API (standard library only).

    proxy.py --port 8400 --prefill http://127.0.0.1:8410 --decode http://127.0.0.1:8420

POST /v1/completions: the request goes to prefill with max_tokens 1 and
kv_transfer_params {"do_remote_decode": true}; prefill's response carries the
kv_transfer_params decode needs (the producer's engine, its block ids, the capability),
and the same request goes with them to decode, streamed, so the proxy sees decode's
first token. The answer is decode's, assembled (token_ids always returned), with a
"hixl_timing" object beside it, in seconds on the proxy's monotonic clock:

  prefill_s    request in -> prefill's response (prefill computed, KV held for decode)
  handoff_s    decode's request out -> decode's first token (decode's scheduler takes
               the request, the connector pulls the KV, one forward step of the rest)
  ttft_s       request in -> decode's first token (what a streaming client waits)
  total_s      request in -> decode's last token

vLLM's MooncakeConnector (--mooncake-bootstrap URL, the producer's bootstrap server)
returns no kv_transfer_params from prefill: its requests are paired by a transfer id
the proxy makes. Prefill gets {"do_remote_decode": true, "transfer_id": T}; decode gets
{"do_remote_prefill": true, "transfer_id": T, "remote_engine_id": the producer's
engine id (from the bootstrap server's /query), "remote_bootstrap_addr": URL}. The
order (prefill answered, then decode) and the timing are the same as for the others.

A prefill or decode error is passed back with its HTTP status and body and names which
side failed. Other paths (GET /health, GET /metrics?side=prefill|decode) are forwarded.
This is the flow of vLLM's own toy proxy for its P/D connectors, written for hixl's tests.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Upstream:
    """One vLLM instance's base URL; a connection per call (keep-alive is not needed at
    the rates these tests run, and a dead instance then costs nothing to recover)."""

    def __init__(self, url: str, timeout: float):
        u = urllib.parse.urlparse(url)
        self.host, self.port, self.timeout = u.hostname or "127.0.0.1", u.port or 80, timeout
        self.url = url

    def conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)


class SideError(Exception):
    def __init__(self, side: str, status: int, body: bytes):
        super().__init__(f"{side} answered {status}")
        self.side, self.status, self.body = side, status, body


def post_json(up: Upstream, path: str, doc: dict, side: str) -> dict:
    c = up.conn()
    try:
        c.request("POST", path, body=json.dumps(doc), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise SideError(side, r.status, body)
        return json.loads(body)
    except (OSError, http.client.HTTPException) as e:
        raise SideError(side, 502, json.dumps({"error": f"{side} ({up.url}): {e}"}).encode()) from e
    finally:
        c.close()


def stream_completion(up: Upstream, doc: dict, side: str):
    """POST a streamed completion; yields each event's JSON (the 'data: ' lines)."""
    c = up.conn()
    try:
        c.request("POST", "/v1/completions", body=json.dumps(doc), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise SideError(side, r.status, r.read())
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            yield json.loads(data)
    except (OSError, http.client.HTTPException) as e:
        raise SideError(side, 502, json.dumps({"error": f"{side} ({up.url}): {e}"}).encode()) from e
    finally:
        c.close()


class Proxy:
    def __init__(self, prefill: Upstream, decode: Upstream, mooncake: Upstream | None = None):
        self.prefill, self.decode, self.mooncake = prefill, decode, mooncake
        self.lock = threading.Lock()
        self.served = 0
        self.mooncake_engine = None

    def mooncake_engine_id(self) -> str:
        """The producer's engine id, from its Mooncake bootstrap server (asked once)."""
        if self.mooncake_engine is None:
            c = self.mooncake.conn()
            try:
                c.request("GET", "/query")
                r = c.getresponse()
                body = r.read()
                entries = json.loads(body) if r.status == 200 else {}
            except (OSError, http.client.HTTPException, ValueError) as e:
                raise SideError("prefill", 502, json.dumps(
                    {"error": f"Mooncake bootstrap server {self.mooncake.url}: {e}"}).encode()) from e
            finally:
                c.close()
            if not entries:
                raise SideError("prefill", 502, json.dumps(
                    {"error": f"Mooncake bootstrap server {self.mooncake.url} has no producer registered"}).encode())
            self.mooncake_engine = entries[min(entries, key=int)]["engine_id"]
        return self.mooncake_engine

    def completion(self, req: dict) -> dict:
        t0 = time.monotonic()
        p = dict(req)
        ask = {"do_remote_decode": True}
        if self.mooncake:
            tid = uuid.uuid4().hex
            ask["transfer_id"] = tid
        p.update(max_tokens=1, stream=False, kv_transfer_params=ask)
        p.pop("stream_options", None)
        pre = post_json(self.prefill, "/v1/completions", p, "prefill")
        t1 = time.monotonic()
        params = pre.get("kv_transfer_params")
        if self.mooncake:
            params = {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": tid,
                      "remote_engine_id": self.mooncake_engine_id(), "remote_bootstrap_addr": self.mooncake.url}
            t1 = time.monotonic()
        if not params:
            raise SideError("prefill", 502, json.dumps(
                {"error": "prefill returned no kv_transfer_params: is it a kv_producer with a KV connector?"}).encode())
        d = dict(req)
        d.update(kv_transfer_params=params, stream=True, return_token_ids=True)
        d.pop("stream_options", None)
        first = None
        tokens, text, finish, rid, usage_prompt = [], [], None, None, None
        for ev in stream_completion(self.decode, d, "decode"):
            rid = ev.get("id", rid)
            for ch in ev.get("choices") or []:
                ids = ch.get("token_ids") or []
                if ids and first is None:
                    first = time.monotonic()
                tokens += ids
                text.append(ch.get("text") or "")
                finish = ch.get("finish_reason") or finish
                usage_prompt = ch.get("prompt_token_ids") or usage_prompt
        t3 = time.monotonic()
        first = first if first is not None else t3
        with self.lock:
            self.served += 1
        return {"id": rid, "object": "text_completion", "model": req.get("model"),
                "choices": [{"index": 0, "text": "".join(text), "token_ids": tokens, "finish_reason": finish,
                             "prompt_token_ids": usage_prompt}],
                "prefill_kv_transfer_params": params,
                "hixl_timing": {"prefill_s": t1 - t0, "handoff_s": first - t1, "ttft_s": first - t0,
                                "total_s": t3 - t0}}


def make_handler(proxy: Proxy):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet: the driver prints what matters
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/json"):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            u = urllib.parse.urlparse(self.path)
            if u.path == "/health":
                self._send(200, b"{}")
                return
            side = urllib.parse.parse_qs(u.query).get("side", ["decode"])[0]
            up = proxy.prefill if side == "prefill" else proxy.decode
            c = up.conn()
            try:
                c.request("GET", u.path)
                r = c.getresponse()
                self._send(r.status, r.read(), r.getheader("Content-Type", "text/plain"))
            except OSError as e:
                self._send(502, json.dumps({"error": f"{side}: {e}"}).encode())
            finally:
                c.close()

        def do_POST(self):
            n = int(self.headers.get("Content-Length", "0"))
            try:
                req = json.loads(self.rfile.read(n) or b"{}")
            except ValueError as e:
                self._send(400, json.dumps({"error": f"request is not JSON: {e}"}).encode())
                return
            if self.path != "/v1/completions" or req.get("stream"):
                self._send(400, json.dumps({"error": "the proxy serves POST /v1/completions, stream false"}).encode())
                return
            try:
                self._send(200, json.dumps(proxy.completion(req)).encode())
            except SideError as e:
                body = e.body if e.body.startswith(b"{") else json.dumps({"error": e.body.decode(errors="replace")}).encode()
                doc = json.loads(body)
                doc["hixl_side"] = e.side
                self._send(e.status, json.dumps(doc).encode())

    return Handler


class Server(ThreadingHTTPServer):
    # The listen backlog: socketserver's default, 5 connections not yet accepted,
    # overflowed under a burst of clients (pd_check.py's burst, 24 at once: a client's
    # connection was reset, as the kernel's SYN cookies do once the queue is full);
    # vLLM's own servers (uvicorn) take 2048.
    request_queue_size = 1024
    daemon_threads = True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prefill", required=True, help="prefill's base URL")
    ap.add_argument("--decode", required=True, help="decode's base URL")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per upstream call")
    ap.add_argument("--mooncake-bootstrap", default="",
                    help="the producer's Mooncake bootstrap server (http://host:port): pair by transfer id")
    a = ap.parse_args()
    mc = Upstream(a.mooncake_bootstrap, a.timeout) if a.mooncake_bootstrap else None
    proxy = Proxy(Upstream(a.prefill, a.timeout), Upstream(a.decode, a.timeout), mc)
    srv = Server((a.host, a.port), make_handler(proxy))
    print(f"proxy: {a.host}:{a.port} -> prefill {a.prefill}, decode {a.decode}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
