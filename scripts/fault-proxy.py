#!/usr/bin/env python3
"""A fault-injecting HTTP proxy for tests: it sits in front of a real server (`ragline serve`,
TEI, an OpenAI-compatible endpoint) and, at configured rates, answers in the ways services
fail in practice, instead of passing the request on.

    scripts/fault-proxy.py --upstream http://127.0.0.1:8080 [--port 0] [--seed 1]
        [--rate-429 0.2] [--retry-after 1] [--rate-500 0.05] [--rate-reset 0.02]
        [--rate-malformed 0.01] [--rate-slow 0.0] [--slow-seconds 2]
        [--poison TEXT] [--down]

The port it listens on is printed as the first line on stdout (`listening 127.0.0.1:PORT`).

- 429 with `Retry-After: N` (a rate limit), 500 (a server error), a reset (the connection
  closed without an answer), malformed JSON (a 200 whose body is cut short), a slow answer
  (the request is held `--slow-seconds`, then passed on).
- `--poison TEXT`: a request whose body contains TEXT answers 400 with an OpenAI-style error
  naming the input, as a service does for one bad input of a batch (only that request, not its
  neighbours: a client that bisects a batch isolates the input).
- `--down`: every request answers 503 (an endpoint that is down).

Faults are drawn per request from a seeded generator. `GET /_proxy/stats` answers counts (by
outcome, and requests passed through); `POST /_proxy/config` with a JSON object changes any
setting above at run time (`{"down": true}`, `{"poison": null}`, `{"rate_429": 0}`), so a
test can take the endpoint down for a while or stop poisoning.
"""

import argparse
import http.client
import json
import random
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
              "proxy-authorization", "proxy-authenticate", "host", "content-length"}


class State:
    def __init__(self, args):
        self.lock = threading.Lock()
        self.rng = random.Random(args.seed)
        self.settings = {
            "rate_429": args.rate_429,
            "retry_after": args.retry_after,
            "rate_500": args.rate_500,
            "rate_reset": args.rate_reset,
            "rate_malformed": args.rate_malformed,
            "rate_slow": args.rate_slow,
            "slow_seconds": args.slow_seconds,
            "poison": args.poison,
            "down": args.down,
        }
        self.counts = {}

    def count(self, what):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def draw(self, body):
        """The fault for one request, or None to pass it on."""
        with self.lock:
            s = dict(self.settings)
            roll = self.rng.random()
        if s["down"]:
            return "down", s
        if s["poison"] and s["poison"].encode() in body:
            return "poison", s
        edge = 0.0
        for fault in ("429", "500", "reset", "malformed", "slow"):
            edge += s["rate_" + fault]
            if roll < edge:
                return fault, s
        return None, s


def make_handler(state, upstream):
    target = urllib.parse.urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def reply(self, status, body, headers=()):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/_proxy/stats":
                with state.lock:
                    self.reply(200, {"counts": state.counts, "settings": state.settings})
                return
            self.forward(b"")

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if self.path == "/_proxy/config":
                change = json.loads(body or b"{}")
                with state.lock:
                    for k, v in change.items():
                        if k not in state.settings:
                            self.reply(400, {"error": f"unknown setting {k}"})
                            return
                        state.settings[k] = v
                    self.reply(200, state.settings)
                return
            self.forward(body)

        def forward(self, body):
            fault, s = state.draw(body)
            if fault == "down":
                state.count("503")
                self.reply(503, {"error": {"message": "service unavailable (proxy: down)"}})
                return
            if fault == "poison":
                state.count("400")
                self.reply(400, {"error": {
                    "message": "input rejected (proxy: poisoned input)",
                    "type": "invalid_request_error"}})
                return
            if fault == "429":
                state.count("429")
                self.reply(429, {"error": {"message": "rate limited (proxy)"}},
                           [("Retry-After", str(s["retry_after"]))])
                return
            if fault == "500":
                state.count("500")
                self.reply(500, {"error": {"message": "internal error (proxy)"}})
                return
            if fault == "reset":
                state.count("reset")
                # Close without an answer; SO_LINGER 0 makes it a TCP reset.
                try:
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               b"\x01\x00\x00\x00\x00\x00\x00\x00")
                except OSError:
                    pass
                self.close_connection = True
                self.connection.close()
                return
            if fault == "slow":
                state.count("slow")
                time.sleep(s["slow_seconds"])
            status, headers, data = self.upstream(body)
            if fault == "malformed" and status == 200:
                state.count("malformed")
                data = data[: max(1, len(data) // 2)]
                self.reply(200, data)
                return
            state.count("passed")
            self.send_response(status)
            for k, v in headers:
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def upstream(self, body):
            conn = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=300)
            try:
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in HOP_BY_HOP}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                r = conn.getresponse()
                return r.status, r.getheaders(), r.read()
            except OSError as e:
                state.count("upstream_error")
                return 502, [], json.dumps({"error": {"message": f"proxy: upstream: {e}"}}).encode()
            finally:
                conn.close()

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rate-429", type=float, default=0.0)
    p.add_argument("--retry-after", type=int, default=1)
    p.add_argument("--rate-500", type=float, default=0.0)
    p.add_argument("--rate-reset", type=float, default=0.0)
    p.add_argument("--rate-malformed", type=float, default=0.0)
    p.add_argument("--rate-slow", type=float, default=0.0)
    p.add_argument("--slow-seconds", type=float, default=2.0)
    p.add_argument("--poison", default=None)
    p.add_argument("--down", action="store_true")
    args = p.parse_args()
    state = State(args)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state, args.upstream))
    server.daemon_threads = True
    print(f"listening {args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
