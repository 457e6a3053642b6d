#!/usr/bin/env python3
"""Load for an embeddings server speaking OpenAI's POST /v1/embeddings: CLIENTS threads,
each with its own keep-alive connection, send for SECONDS either one text or a batch of 8-64
(half and half, from a seeded generator), asking for base64 vectors (what the official
client asks for). A 503 is counted and retried after its Retry-After. Every text sent is
unique (a request number goes before it), so a server that remembers vectors (ragline serve
does, by input) computes every one, as it would for a corpus without repeats.

    scripts/bench-serve-load.py URL TEXTS.jsonl [--clients 64] [--seconds 60]

Prints one JSON object: requests, inputs, 503s, errors, client-side latency p50/p90/p99 of
answered requests (ms), inputs/s, and tokens/s by the server's own count
(ragline_tokens_total from /metrics) when it has one, else by `usage.total_tokens`.
"""
import argparse
import http.client
import json
import random
import threading
import time
import urllib.parse


def tokens_from_metrics(url):
    u = urllib.parse.urlsplit(url)
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
    except OSError:
        return None
    total = None
    for line in text.splitlines():
        if line.startswith("ragline_tokens_total"):
            total = (total or 0) + float(line.rsplit(" ", 1)[1])
    return total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("texts")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--model", default="all-MiniLM-L6-v2")
    args = p.parse_args()
    texts = [json.loads(l)["text"] for l in open(args.texts, encoding="utf-8")]
    u = urllib.parse.urlsplit(args.url)
    lock = threading.Lock()
    stats = {"requests": 0, "inputs": 0, "overloaded": 0, "errors": 0, "usage_tokens": 0}
    latencies = []
    seq = [0]

    def stats_seq():
        with lock:
            seq[0] += 1
            return seq[0]

    start_tokens = tokens_from_metrics(args.url)
    t0 = time.perf_counter()
    deadline = t0 + args.seconds

    def client(seed):
        rng = random.Random(seed)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
        while time.perf_counter() < deadline:
            n = 1 if rng.random() < 0.5 else rng.randint(8, 64)
            at = rng.randrange(len(texts))
            sent_n = seed * 1_000_000 + stats_seq()
            batch = [f"{sent_n}.{i} {texts[(at + i) % len(texts)]}" for i in range(n)]
            body = json.dumps({"input": batch, "model": args.model, "encoding_format": "base64"})
            sent = time.perf_counter()
            try:
                conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
            except OSError:
                with lock:
                    stats["errors"] += 1
                conn.close()
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
                continue
            took = time.perf_counter() - sent
            if r.status == 503:
                with lock:
                    stats["overloaded"] += 1
                time.sleep(float(r.getheader("Retry-After") or 1))
                continue
            if r.status != 200:
                with lock:
                    stats["errors"] += 1
                continue
            answer = json.loads(data)
            with lock:
                stats["requests"] += 1
                stats["inputs"] += len(answer["data"])
                stats["usage_tokens"] += answer.get("usage", {}).get("total_tokens", 0)
                latencies.append(took)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    end_tokens = tokens_from_metrics(args.url)
    tokens = (end_tokens - start_tokens) if start_tokens is not None and end_tokens is not None \
        else stats["usage_tokens"]
    latencies.sort()

    def pct(q):
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1) \
            if latencies else None

    print(json.dumps({
        **stats,
        "clients": args.clients,
        "seconds": round(elapsed, 1),
        "tokens": int(tokens),
        "tokens_per_sec": round(tokens / elapsed),
        "inputs_per_sec": round(stats["inputs"] / elapsed, 1),
        "p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99),
    }))


if __name__ == "__main__":
    main()
