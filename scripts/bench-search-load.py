#!/usr/bin/env python3
"""Load for `ragline serve --index`'s GET /v1/search: CLIENTS threads, each with its own
keep-alive connection, send queries (in turn from QUERIES, one per line) for SECONDS, in MODE.

    scripts/bench-search-load.py URL QUERIES.txt [--clients 16] [--seconds 20] [--mode hybrid] [--k 10]

Prints one JSON object: requests, errors, queries/s, client-side latency p50/p90/p99 (ms).
"""
import argparse
import http.client
import json
import threading
import time
import urllib.parse


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("queries")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--mode", default="hybrid")
    p.add_argument("--k", type=int, default=10)
    a = p.parse_args()
    queries = [q.strip() for q in open(a.queries, encoding="utf-8") if q.strip()]
    u = urllib.parse.urlsplit(a.url)
    lock = threading.Lock()
    latencies, errors, seq = [], [0], [0]
    deadline = time.perf_counter() + a.seconds

    def client():
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        while time.perf_counter() < deadline:
            with lock:
                seq[0] += 1
                q = queries[seq[0] % len(queries)]
            path = "/v1/search?" + urllib.parse.urlencode({"q": q, "k": a.k, "mode": a.mode})
            t = time.perf_counter()
            try:
                conn.request("GET", path)
                r = conn.getresponse()
                body = r.read()
                ok = r.status == 200 and body.startswith(b"[")
            except OSError:
                ok = False
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
            took = (time.perf_counter() - t) * 1000
            with lock:
                if ok:
                    latencies.append(took)
                else:
                    errors[0] += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    latencies.sort()
    q = lambda f: round(latencies[min(len(latencies) - 1, int(f * len(latencies)))], 1) if latencies else None
    print(json.dumps({
        "mode": a.mode, "clients": a.clients, "requests": len(latencies), "errors": errors[0],
        "queries_per_s": round(len(latencies) / wall, 1),
        "p50_ms": q(0.50), "p90_ms": q(0.90), "p99_ms": q(0.99),
    }))


if __name__ == "__main__":
    main()
