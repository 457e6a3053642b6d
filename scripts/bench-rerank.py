#!/usr/bin/env python3
"""Reranking latency and throughput: ragline serve's POST /rerank against sentence-transformers'
CrossEncoder, in one run, on one machine (run by scripts/bench-rerank.sh).

    $PY scripts/bench-rerank.py --ragline target/release/ragline [--queries 40] [--clients 64]

1. A MiniLM-L6-shaped cross-encoder (cross-encoder/ms-marco-MiniLM-L6-v2's architecture: the
   all-MiniLM-L6-v2 encoder under a BertForSequenceClassification head, the head seeded
   random; the hub's weights cannot be fetched here) saved in the Hugging Face layout.
2. Latency: per query, rerank 50 candidates (SciFact queries; abstracts cut to their first
   1,000 characters, about 220 tokens: a chunk's size): sentence-transformers'
   CrossEncoder.predict (one batch of 50, torch on every core) and one client of ragline
   serve --rerank-model (HTTP included). p50 and p99 (ms).
3. Throughput: CLIENTS clients at once, each sending 50-candidate requests for SECONDS
   (a 503 waits its Retry-After and is sent again, counted): requests/s, pairs/s and the
   p50/p99 of answered requests, the wait for 503s included.

Prints a JSON object; the shell script writes the table.
"""
import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ragline", required=True)
    ap.add_argument("--data", default=os.environ.get("RAGLINE_DATA_DIR", os.path.join(ROOT, "..", "shared", "data")))
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--candidates", type=int, default=50)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=int, default=20)
    args = ap.parse_args()
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(7)
    scifact = os.path.join(args.data, "scifact")
    corpus = [json.loads(l) for l in open(os.path.join(scifact, "corpus.jsonl"))]
    queries = [json.loads(l)["text"] for l in open(os.path.join(scifact, "queries.jsonl"))][: args.queries]
    rng = random.Random(3)
    requests = [(q, [(d.get("title", "") + " " + d["text"]).strip()[:1000] for d in rng.sample(corpus, args.candidates)]) for q in queries]

    out = {"candidates": args.candidates, "queries": len(requests), "torch_threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "ce-minilm")
        base = os.path.join(ROOT, "models", "all-MiniLM-L6-v2")
        model = BertForSequenceClassification.from_pretrained(base, num_labels=1)
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(base).save_pretrained(folder)
        ce = CrossEncoder(folder, device="cpu", max_length=512)
        ce.predict(requests[0][1][:4] and [(requests[0][0], t) for t in requests[0][1][:4]])
        lat = []
        for q, texts in requests:
            t = time.perf_counter()
            ce.predict([(q, x) for x in texts], batch_size=args.candidates)
            lat.append((time.perf_counter() - t) * 1000)
        out["sentence_transformers"] = {"p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "mean_ms": statistics.mean(lat)}
        print(f"sentence-transformers: p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms", file=sys.stderr)

        server = subprocess.Popen([args.ragline, "serve", "--port", "0", "--device", "cpu", "--model", base,
                                   "--rerank-model", folder, "--max-inputs", "4096", "--max-concurrent-requests", "512"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            line = server.stdout.readline().strip()
            host, port = line.rsplit("/", 1)[-1].split(":")

            refused = [0]

            def call(conn, q, texts):
                body = json.dumps({"query": q, "texts": texts})
                t = time.perf_counter()
                while True:
                    conn.request("POST", "/rerank", body, {"Content-Type": "application/json"})
                    r = conn.getresponse()
                    data = r.read()
                    if r.status == 503:
                        refused[0] += 1
                        time.sleep(float(r.getheader("Retry-After") or 1))
                        continue
                    if r.status != 200:
                        raise RuntimeError(f"{r.status}: {data[:200]}")
                    return (time.perf_counter() - t) * 1000, json.loads(data)

            conn = http.client.HTTPConnection(host, int(port), timeout=600)
            call(conn, *requests[0])
            lat = []
            agree = 0
            for q, texts in requests:
                ms, rows = call(conn, q, texts)
                lat.append(ms)
            # The two agree on the order (the same model, the same scores to 1e-4).
            q, texts = requests[0]
            theirs = ce.predict([(q, x) for x in texts])
            _, rows = call(conn, q, texts)
            ours = {r["index"]: r["score"] for r in rows}
            out["largest_score_difference"] = max(abs(ours[i] - float(theirs[i])) for i in range(len(texts)))
            out["ragline_serve_one_client"] = {"p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "mean_ms": statistics.mean(lat)}
            print(f"ragline serve, one client: p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms", file=sys.stderr)

            refused[0] = 0
            stop = time.time() + args.seconds
            lats, errors = [], [0]
            lock = threading.Lock()

            def client(i):
                c = http.client.HTTPConnection(host, int(port), timeout=600)
                k = i
                while time.time() < stop:
                    q, texts = requests[k % len(requests)]
                    k += args.clients
                    try:
                        ms, _ = call(c, q, texts)
                        with lock:
                            lats.append(ms)
                    except Exception:
                        with lock:
                            errors[0] += 1
                        c = http.client.HTTPConnection(host, int(port), timeout=600)

            started = time.time()
            threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            secs = time.time() - started
            out["ragline_serve_clients"] = {"clients": args.clients, "requests": len(lats), "errors": errors[0], "answered_503": refused[0],
                                            "requests_per_s": len(lats) / secs, "pairs_per_s": len(lats) * args.candidates / secs,
                                            "p50_ms": pct(lats, 50), "p99_ms": pct(lats, 99)}
            print(f"ragline serve, {args.clients} clients: {len(lats) / secs:.2f} requests/s, p50 {pct(lats, 50):.0f} ms, p99 {pct(lats, 99):.0f} ms", file=sys.stderr)
        finally:
            server.terminate()
            server.wait()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
