#!/usr/bin/env python3
"""An OpenAI-compatible chat completions endpoint that answers deterministic text, for the
tests of ragline's LLM stages. No language model can run on the test machines; what is tested
is ragline's side (prompts, rate limits, retries, where the output goes), so the answer only
has to be a pure function of the request.

    scripts/chat-stub.py [--port 0]

Prints `listening 127.0.0.1:PORT` first. `POST /v1/chat/completions` answers
`summary of <title>: <first words of the document> [<8 hex digits of a hash of the prompt>]`,
where the title is the first Markdown heading of the last user message (or its first line).
`GET /stats` answers the number of calls and of prompt characters, so a test can check that
an unchanged document makes no call.
"""

import argparse
import hashlib
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATS = {"calls": 0, "prompt_chars": 0}


def answer(messages):
    user = [m.get("content", "") for m in messages if m.get("role") == "user"]
    text = user[-1] if user else ""
    heading = re.search(r"^#+\s+(.+)$", text, re.M)
    title = heading.group(1).strip() if heading else (text.strip().splitlines() or [""])[0]
    body = re.sub(r"^#+.*$", "", text, flags=re.M)
    words = " ".join(body.split()[:12])
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:8]
    return f"summary of {title[:80]}: {words} [{digest}]"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/stats":
            with LOCK:
                self.reply(200, dict(STATS))
        else:
            self.reply(404, {"error": {"message": "not found"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError as e:
            self.reply(400, {"error": {"message": f"bad JSON: {e}"}})
            return
        if self.path != "/v1/chat/completions":
            self.reply(404, {"error": {"message": "not found"}})
            return
        messages = req.get("messages")
        if not isinstance(messages, list) or not messages:
            self.reply(400, {"error": {"message": "`messages` must be a non-empty list"}})
            return
        content = answer(messages)
        prompt_chars = sum(len(m.get("content", "")) for m in messages)
        with LOCK:
            STATS["calls"] += 1
            STATS["prompt_chars"] += prompt_chars
        self.reply(200, {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "model": req.get("model", "stub"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": prompt_chars // 4,
                      "completion_tokens": len(content) // 4,
                      "total_tokens": (prompt_chars + len(content)) // 4},
        })


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"listening {args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
