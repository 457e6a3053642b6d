#!/usr/bin/env python3
"""Where does a query's expected answer rank, and could any chunking put it higher?

    python3 scripts/probe-query.py --index /tmp/react.db \
        --query "how do I run code after render" --expect useEffect [--top 3]

Reads the chunk texts and heading paths of a ragline SQLite index, embeds them with
sentence-transformers (the reference implementation, independently of ragline), and prints:

1. the top chunks for the query, and the rank of the first chunk whose heading path contains
   `--expect` as a word ("useEffect" matches "Fetching data with useEffect", not
   "useEffectEvent");
2. an upper bound for any chunking: the best score of any single sentence or heading under an
   expected heading, against the score a chunk must beat to enter the top `--top`.
   A chunk's embedding is close to the mean of its sentences', so a chunk seldom scores above
   its best sentence; when even that sentence is below the bar, no chunk size will do it.
3. the same with each text prefixed by its heading path ("contextual chunk headers").
"""
import argparse
import os
import re
import sqlite3

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--index", required=True, help="a ragline SQLite index file")
    ap.add_argument("--query", required=True)
    ap.add_argument("--expect", required=True, help="a heading the answer should be under")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "all-MiniLM-L6-v2"))
    args = ap.parse_args()
    import numpy as np
    from sentence_transformers import SentenceTransformer

    db = sqlite3.connect(f"file:{args.index}?mode=ro", uri=True)
    rows = db.execute(
        "SELECT c.heading_path, c.text, d.source FROM chunks c "
        "JOIN documents d ON d.id = c.document_id ORDER BY c.rowid"
    ).fetchall()
    model = SentenceTransformer(args.model, device="cpu")
    q = model.encode([args.query], normalize_embeddings=True)[0]
    word = re.compile(r"\b" + re.escape(args.expect) + r"\b")
    hit = lambda path: word.search(path) is not None

    def ranked(texts):
        vectors = model.encode(texts, batch_size=32, normalize_embeddings=True)
        scores = vectors @ q
        return scores, np.argsort(-scores)

    for label, texts in [
        ("chunk texts (what ragline embeds)", [t for _, t, _ in rows]),
        ("heading path + chunk text", [f"{p}\n\n{t}" for p, t, _ in rows]),
    ]:
        scores, order = ranked(texts)
        print(f"== {label}: {len(texts)} chunks")
        for r, i in enumerate(order[: max(args.top, 5)]):
            print(f"  {r + 1:>4}  {scores[i]:.4f}  {rows[i][0][:100]}")
        first = next((r for r, i in enumerate(order) if hit(rows[i][0])), None)
        if first is None:
            print(f"  no chunk under a '{args.expect}' heading")
            continue
        i = order[first]
        print(f"  first under '{args.expect}': rank {first + 1}, {scores[i]:.4f}, {rows[i][0][:90]}")
        bar = scores[order[args.top - 1]]
        under = [(p, t) for p, t, _ in rows if hit(p)]
        pieces = []
        for p, t in under:
            prefix = f"{p}\n\n" if "heading" in label else ""
            pieces += [prefix + x.strip() for x in re.split(r"(?<=[.!?])\s+|\n+", t)
                       if len(x.strip()) > 15]
            pieces.append(prefix + p.split(" > ")[-1])
        s2, o2 = ranked(pieces)
        best = o2[0]
        verdict = "above" if s2[best] > bar else "below"
        print(f"  best single sentence or heading under it ({len(under)} chunks): "
              f"{s2[best]:.4f} ({verdict} the top-{args.top} bar {bar:.4f}): "
              f"{pieces[best][:90]!r}")


if __name__ == "__main__":
    main()
