#!/usr/bin/env python3
"""STS Benchmark with sentence-transformers: the reference ragline's STS test compares to.

    python3 scripts/reference-sts.py [--model models/all-MiniLM-L6-v2] [--out FILE]

Spearman correlation (x100) between the cosine similarity of each pair and the gold score, on
../shared/data/stsb/sts-test.tsv, written to tests/fixtures/stsb-reference.json.
"""
import argparse
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "all-MiniLM-L6-v2"))
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "stsb", "sts-test.tsv"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "stsb-reference.json"))
    args = ap.parse_args()
    import numpy as np
    import sentence_transformers
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer

    gold, s1, s2 = [], [], []
    with open(args.data, encoding="utf-8") as f:
        next(f)
        for line in f:
            score, a, b = line.rstrip("\n").split("\t")[:3]
            gold.append(float(score))
            s1.append(a)
            s2.append(b)
    model = SentenceTransformer(args.model, device="cpu")
    e1 = model.encode(s1, batch_size=64, convert_to_numpy=True)
    e2 = model.encode(s2, batch_size=64, convert_to_numpy=True)
    cos = (e1 * e2).sum(1) / np.linalg.norm(e1, axis=1) / np.linalg.norm(e2, axis=1)
    rho = spearmanr(cos, gold).correlation * 100
    out = {
        "model": os.path.basename(os.path.normpath(args.model)),
        "pairs": len(gold),
        "spearman_x100": round(float(rho), 4),
        "sentence_transformers": sentence_transformers.__version__,
    }
    path = args.out
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
