"""FAISS HNSW on the vectors of a ragline index, at the recall ragline's ANN reached: the peer
half of scripts/bench-ann.sh.

    python bench-ann.py INDEX.db LIKE.npy QUERIES TARGET_RECALL
    python bench-ann.py row LABEL < report.json     # one line of the script's table

Reads the vectors ragline wrote (sqlite-vec's storage tables, with plain SQLite), builds
faiss.IndexHNSWFlat (M=16, efConstruction=128: ragline's graph settings) and
IndexHNSWSQ (8-bit scalar quantizer, near ragline's int8), draws QUERIES queries the way
`ragline bench --like` does (a held-out row, every tenth, plus Gaussian noise of 0.5/sqrt(d),
re-normalised), finds the exact top 10 by brute force, then raises efSearch until recall@10
reaches TARGET_RECALL and reports single-thread QPS, p50/p99 there. Prints one JSON line.
"""
import json
import resource
import sqlite3
import sys
import time

import faiss
import numpy as np


def row(label):
    """One line of the table from a `ragline bench --write --json` report on stdin."""
    r = json.load(sys.stdin)
    s = r.get("search", {})
    rec = r.get("recall_at_10")
    rec = "n/a" if rec is None else f"{rec:.4f}"
    print(f"{label:<28} build {r['finish_seconds']:7.1f}s  files {r.get('files_mb') or 0:8.1f} MB  "
          f"peak RSS {r['peak_rss_mb']:6.0f} MB  p50 {s['vector_p50_ms']:7.2f} ms  "
          f"p99 {s['vector_p99_ms']:7.2f} ms  recall@10 {rec}  exact p50 {s.get('exact_p50_ms') or 0:.1f} ms")


def main():
    if sys.argv[1] == "row":
        return row(sys.argv[2])
    db, like, nq, target = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    table, d = con.execute(
        "SELECT vec_table, dimension FROM vector_sets WHERE state = 'active'").fetchone()
    # sqlite-vec's storage, read with plain SQLite (this Python may not load extensions):
    # vectors in blobs of 256, each row's (blob, offset) in the rowids table.
    blobs = {cid: np.frombuffer(v, dtype=np.float32).reshape(-1, d)
             for cid, v in con.execute(f"SELECT rowid, vectors FROM {table}_vector_chunks00")}
    x = np.stack([blobs[c][o] for c, o in con.execute(
        f"SELECT chunk_id, chunk_offset FROM {table}_rowids ORDER BY rowid")]).astype(np.float32)
    n = len(x)
    base = np.load(like).astype(np.float32)
    held = base[9::10]
    held /= np.linalg.norm(held, axis=1, keepdims=True)
    rng = np.random.default_rng(99)
    q = held[rng.integers(0, len(held), nq)] + rng.normal(0, 0.5 / np.sqrt(d), (nq, d)).astype(np.float32)
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    # Exact top 10 (inner product = cosine on unit vectors), in blocks.
    truth = np.empty((nq, 10), dtype=np.int64)
    for i in range(0, nq, 100):
        s = q[i:i + 100] @ x.T
        truth[i:i + 100] = np.argsort(-s, axis=1)[:, :10]
    out = {"peer": "faiss-cpu " + faiss.__version__, "vectors": n, "dim": d, "queries": nq,
           "target_recall": target}
    faiss.omp_set_num_threads(2)
    for name, make in [("hnsw_flat", lambda: faiss.IndexHNSWFlat(d, 16, faiss.METRIC_INNER_PRODUCT)),
                       ("hnsw_sq8", lambda: faiss.IndexHNSWSQ(d, faiss.ScalarQuantizer.QT_8bit, 16,
                                                              faiss.METRIC_INNER_PRODUCT))]:
        index = make()
        index.hnsw.efConstruction = 128
        t = time.perf_counter()
        if name == "hnsw_sq8":
            index.train(x[:min(n, 100_000)])
        index.add(x)
        build = time.perf_counter() - t
        faiss.omp_set_num_threads(1)
        best = None
        for ef in [16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]:
            index.hnsw.efSearch = ef
            lat = []
            found = np.empty((nq, 10), dtype=np.int64)
            for i in range(nq):
                t = time.perf_counter()
                _, ids = index.search(q[i:i + 1], 10)
                lat.append((time.perf_counter() - t) * 1e3)
                found[i] = ids[0]
            recall = np.mean([len(set(found[i]) & set(truth[i])) / 10 for i in range(nq)])
            best = {"ef_search": ef, "recall_at_10": round(float(recall), 4),
                    "p50_ms": round(float(np.percentile(lat, 50)), 3),
                    "p99_ms": round(float(np.percentile(lat, 99)), 3),
                    "qps_1_thread": round(1e3 / float(np.mean(lat)), 1)}
            if recall >= target:
                break
        faiss.omp_set_num_threads(2)
        out[name] = {"build_s": round(build, 1), **best}
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
