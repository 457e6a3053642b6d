#!/usr/bin/env python3
"""sentence-transformers behind a minimal HTTP server: OpenAI's POST /v1/embeddings (string or
list `input`, float or base64 vectors), one request at a time through `encode` (no batching
across requests: what a minimal server does), for scripts/bench-serve.sh to load side by side
with `ragline serve`. Not part of ragline.

    PYTHON_ST/bin/python scripts/st-server.py MODEL_DIR [--port 8090] [--threads N]
"""
import argparse
import base64
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import torch
from sentence_transformers import SentenceTransformer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--port", type=int, default=8090)
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = SentenceTransformer(args.model, device="cpu")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            with lock:
                tokens = sum(len(x) for x in model.tokenizer(
                    texts, truncation=True, max_length=model.max_seq_length)["input_ids"])
                vecs = model.encode(texts, batch_size=32, convert_to_numpy=True,
                                    normalize_embeddings=False)
            b64 = body.get("encoding_format") == "base64"
            data = [{"object": "embedding", "index": i,
                     "embedding": base64.b64encode(v.astype(np.float32).tobytes()).decode()
                     if b64 else v.tolist()} for i, v in enumerate(vecs)]
            out = json.dumps({"object": "list", "data": data, "model": "st",
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"listening 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
