"""The peers of ragline's ANN on the vectors of a ragline index: the peer half of
scripts/bench-ann.sh.

    python bench-ann.py extract INDEX.db LIKE.npy QUERIES OUT/   # vectors, queries, truth
    python bench-ann.py engine NAME OUT/ TARGET_RECALL           # one engine, one JSON line
    python bench-ann.py row LABEL < report.json                  # a `ragline bench` line

`extract` reads the vectors ragline wrote (sqlite-vec's storage tables, with plain SQLite), draws
QUERIES queries the way `ragline bench --like` does (a held-out row, every tenth, plus Gaussian
noise of 0.5/sqrt(d), re-normalised) and finds their exact top 10 by brute force.

`engine` runs in a process of its own, so that its peak RSS is its own: it loads the vectors,
builds the engine's HNSW graph at ragline's settings (M 16, efConstruction 128) on 2 threads,
then searches one query at a time on one thread at growing ef until recall@10 reaches
TARGET_RECALL, and prints the build time, the curve and the first point at the target.
Engines: faiss_flat (IndexHNSWFlat), faiss_sq8 (IndexHNSWSQ, 8-bit), hnswlib (cosine),
usearch_f16 and usearch_f32 (usearch's own Python package, cosine).
"""
import json
import os
import resource
import sqlite3
import sys
import time

import numpy as np

LADDER = [16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048]


def row(label):
    """One line of the table from a `ragline bench --write --json` report on stdin."""
    r = json.load(sys.stdin)
    s = r.get("search", {})
    rec = r.get("recall_at_10")
    rec = "n/a" if rec is None else f"{rec:.4f}"
    print(f"{label:<28} build {r['finish_seconds']:7.1f}s  files {r.get('files_mb') or 0:8.1f} MB  "
          f"peak RSS {r['peak_rss_mb']:6.0f} MB  p50 {s['vector_p50_ms']:7.3f} ms  "
          f"p99 {s['vector_p99_ms']:7.3f} ms  recall@10 {rec}  exact p50 {s.get('exact_p50_ms') or 0:.1f} ms")
    for p in s.get("ef_sweep", []):
        print(f"{'':<28}   ef {p['ef']:>4}: p50 {p['p50_ms']:7.3f} ms  p99 {p['p99_ms']:7.3f} ms  "
              f"recall@10 {p.get('recall_at_10', 0):.4f}")


def extract(db, like, nq, out):
    os.makedirs(out, exist_ok=True)
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    table, d = con.execute(
        "SELECT vec_table, dimension FROM vector_sets WHERE state = 'active'").fetchone()
    # sqlite-vec's storage, read with plain SQLite (this Python may not load extensions):
    # vectors in blobs of 256, each row's (blob, offset) in the rowids table.
    blobs = {cid: np.frombuffer(v, dtype=np.float32).reshape(-1, d)
             for cid, v in con.execute(f"SELECT rowid, vectors FROM {table}_vector_chunks00")}
    x = np.stack([blobs[c][o] for c, o in con.execute(
        f"SELECT chunk_id, chunk_offset FROM {table}_rowids ORDER BY rowid")]).astype(np.float32)
    del blobs
    base = np.load(like).astype(np.float32)
    held = base[9::10]
    held /= np.linalg.norm(held, axis=1, keepdims=True)
    rng = np.random.default_rng(99)
    q = held[rng.integers(0, len(held), nq)] + rng.normal(0, 0.5 / np.sqrt(d), (nq, d)).astype(np.float32)
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    # Exact top 10 by cosine, in blocks.
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    truth = np.empty((nq, 10), dtype=np.int64)
    for i in range(0, nq, 100):
        s = q[i:i + 100] @ xn.T
        truth[i:i + 100] = np.argsort(-s, axis=1)[:, :10]
    np.save(os.path.join(out, "x.npy"), x)
    np.save(os.path.join(out, "q.npy"), q)
    np.save(os.path.join(out, "truth.npy"), truth)
    print(json.dumps({"vectors": len(x), "dim": d, "queries": nq}))


def engine(name, out, target):
    x = np.load(os.path.join(out, "x.npy"))
    q = np.load(os.path.join(out, "q.npy"))
    truth = np.load(os.path.join(out, "truth.npy"))
    n, d = x.shape
    t = time.perf_counter()
    if name.startswith("faiss"):
        import faiss
        version = "faiss-cpu " + faiss.__version__
        faiss.omp_set_num_threads(2)
        xn = x / np.linalg.norm(x, axis=1, keepdims=True)
        if name == "faiss_flat":
            index = faiss.IndexHNSWFlat(d, 16, faiss.METRIC_INNER_PRODUCT)
        else:
            index = faiss.IndexHNSWSQ(d, faiss.ScalarQuantizer.QT_8bit, 16, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 128
        if name == "faiss_sq8":
            index.train(xn[:min(n, 100_000)])
        index.add(xn)
        build = time.perf_counter() - t
        faiss.omp_set_num_threads(1)

        def set_ef(ef):
            index.hnsw.efSearch = ef

        def search(v):
            return index.search(v[None, :], 10)[1][0]
    elif name == "hnswlib":
        import hnswlib
        version = "hnswlib " + getattr(hnswlib, "__version__", "0.8.0")
        index = hnswlib.Index(space="cosine", dim=d)
        index.init_index(max_elements=n, M=16, ef_construction=128)
        index.add_items(x, np.arange(n), num_threads=2)
        build = time.perf_counter() - t
        index.set_num_threads(1)

        def set_ef(ef):
            index.set_ef(ef)

        def search(v):
            return index.knn_query(v[None, :], k=10, num_threads=1)[0][0]
    elif name.startswith("usearch"):
        import usearch
        from usearch.index import Index
        version = "usearch " + usearch.__version__
        dtype = "f16" if name == "usearch_f16" else "f32"
        index = Index(ndim=d, metric="cos", dtype=dtype, connectivity=16, expansion_add=128)
        index.add(np.arange(n), x, threads=2)
        build = time.perf_counter() - t

        def set_ef(ef):
            index.expansion_search = ef

        def search(v):
            return index.search(v, 10, threads=1).keys
    else:
        raise SystemExit(f"unknown engine {name}")
    curve, best = [], None
    for ef in LADDER:
        set_ef(ef)
        lat, found = [], []
        for i in range(len(q)):
            t = time.perf_counter()
            ids = search(q[i])
            lat.append((time.perf_counter() - t) * 1e3)
            found.append(ids)
        recall = float(np.mean([len(set(map(int, f)) & set(map(int, truth[i]))) / 10
                                for i, f in enumerate(found)]))
        point = {"ef": ef, "recall_at_10": round(recall, 4),
                 "p50_ms": round(float(np.percentile(lat, 50)), 4),
                 "p99_ms": round(float(np.percentile(lat, 99)), 4)}
        curve.append(point)
        if recall >= target:
            best = point
            break
    print(json.dumps({"engine": name, "version": version, "vectors": n, "build_s": round(build, 1),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                      "target": target, "at_target": best, "curve": curve}))


def peer_row():
    """One line of the table from an `engine` JSON line on stdin."""
    r = json.load(sys.stdin)
    b = r["at_target"] or r["curve"][-1]
    miss = "" if r["at_target"] else "  (short of the target at the largest ef)"
    print(f"{r['version']:<28} build {r['build_s']:7.1f}s  peak RSS {r['peak_rss_mb']:6.0f} MB  "
          f"ef {b['ef']:>4}  p50 {b['p50_ms']:7.3f} ms  p99 {b['p99_ms']:7.3f} ms  "
          f"recall@10 {b['recall_at_10']:.4f}{miss}")


def ratios(ragline, peers, target):
    """ragline's first ef of its sweep at the target against each peer's."""
    r = json.load(open(ragline))
    sweep = r["search"].get("ef_sweep", [])
    mine = next((p for p in sweep if (p.get("recall_at_10") or 0) >= target), None)
    if mine is None:
        print(f"ragline did not reach recall@10 {target} on its sweep")
        return
    print(f"== at recall@10 >= {target}: ragline ANN f16 at ef {mine['ef']}: p50 {mine['p50_ms']:.3f} ms "
          f"(recall {mine['recall_at_10']:.4f}), build {r['finish_seconds']:.1f}s, peak RSS {r['peak_rss_mb']:.0f} MB")
    print("   peer p50 / ragline p50, build / ragline's, peak RSS / ragline's (> 1: ragline is faster, smaller)")
    for line in open(peers):
        if not line.strip():
            continue
        p = json.loads(line)
        b = p["at_target"]
        if b is None:
            print(f"   {p['engine']:<12} did not reach {target}")
            continue
        print(f"   {p['engine']:<12} p50 {b['p50_ms'] / mine['p50_ms']:5.2f}x  build {p['build_s'] / r['finish_seconds']:5.2f}x  "
              f"peak RSS {p['peak_rss_mb'] / r['peak_rss_mb']:5.2f}x")


def main():
    cmd = sys.argv[1]
    if cmd == "row":
        return row(sys.argv[2])
    if cmd == "peer-row":
        return peer_row()
    if cmd == "ratios":
        return ratios(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    if cmd == "extract":
        return extract(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    if cmd == "engine":
        return engine(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
