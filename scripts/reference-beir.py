#!/usr/bin/env python3
"""Dense retrieval with sentence-transformers on a BEIR dataset: the reference for
`ragline eval`'s vector mode.

    python3 scripts/reference-beir.py [--data ../shared/data/scifact] [--split test]
                                      [--model models/all-MiniLM-L6-v2]

Embeds every document as `title + " " + text` (BEIR's convention, truncated at the model's
max_seq_length), ranks documents by cosine similarity to each query, and computes nDCG@10
(linear gains, as trec_eval), recall@10, recall@100 and MRR@10 over the judged queries.
Writes tests/fixtures/<dataset>-reference.json.
"""
import argparse
import json
import math
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ndcg(ranking, rel, k=10):
    dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranking[:k]))
    ideal = sorted(rel.values(), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall(ranking, rel, k):
    return sum(1 for d in ranking[:k] if d in rel) / len(rel) if rel else 0.0


def mrr(ranking, rel, k=10):
    for i, d in enumerate(ranking[:k]):
        if d in rel:
            return 1.0 / (i + 1)
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "scifact"))
    ap.add_argument("--split", default="test")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "all-MiniLM-L6-v2"))
    args = ap.parse_args()
    import numpy as np
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    corpus = [json.loads(l) for l in open(os.path.join(args.data, "corpus.jsonl"), encoding="utf-8")]
    queries = {}
    for l in open(os.path.join(args.data, "queries.jsonl"), encoding="utf-8"):
        q = json.loads(l)
        queries[str(q["_id"])] = q["text"]
    qrels = {}
    with open(os.path.join(args.data, "qrels", f"{args.split}.tsv")) as f:
        next(f)
        for line in f:
            q, d, s = line.rstrip("\n").split("\t")
            if int(s) > 0:
                qrels.setdefault(q, {})[d] = int(s)
    judged = [q for q in qrels if q in queries]

    model = SentenceTransformer(args.model, device="cpu")
    t = time.time()
    doc_texts = [(d.get("title", "") + " " + d["text"]).strip() for d in corpus]
    doc_ids = [str(d["_id"]) for d in corpus]
    dv = model.encode(doc_texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True)
    qv = model.encode([queries[q] for q in judged], batch_size=64, convert_to_numpy=True,
                      normalize_embeddings=True)
    sims = qv @ dv.T
    scores = {"ndcg_at_10": 0.0, "recall_at_10": 0.0, "recall_at_100": 0.0, "mrr_at_10": 0.0}
    for i, q in enumerate(judged):
        top = np.argsort(-sims[i])[:100]
        ranking = [doc_ids[j] for j in top]
        rel = qrels[q]
        scores["ndcg_at_10"] += ndcg(ranking, rel)
        scores["recall_at_10"] += recall(ranking, rel, 10)
        scores["recall_at_100"] += recall(ranking, rel, 100)
        scores["mrr_at_10"] += mrr(ranking, rel)
    for k in scores:
        scores[k] = round(scores[k] / len(judged), 5)
    name = os.path.basename(os.path.normpath(args.data))
    out = {
        "dataset": name,
        "split": args.split,
        "model": os.path.basename(os.path.normpath(args.model)),
        "queries": len(judged),
        "documents": len(corpus),
        "sentence_transformers": sentence_transformers.__version__,
        "seconds": round(time.time() - t, 1),
        **scores,
    }
    path = os.path.join(ROOT, "tests", "fixtures", f"{name}-reference.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
