#!/usr/bin/env python3
"""Reference vectors for ragline's model families, from transformers + sentence-transformers.

    PY=$(scripts/reference-venv.sh)
    $PY scripts/reference-families.py [--ragline target/debug/ragline]

For each family of `ragline random-model --family` (bert, xlm-roberta, distilbert, mpnet,
modernbert, qwen3, gemma3), the
script has ragline write a small random-weight model in the Hugging Face and
sentence-transformers layout (32 dimensions, 2 layers, MiniLM's tokenizer; each family's folder
exercises another part of the layout: prompts, Dense, the new pooling config, include_prompt),
loads it with sentence-transformers (the independent reference: transformers' own modelling
code) and writes, under tests/fixtures/families/FAMILY/:

    encode.npy     SentenceTransformer.encode(texts)            (the model's default prompt)
    query.npy      SentenceTransformer.encode_query(texts)
    document.npy   SentenceTransformer.encode_document(texts)
    reference.json versions, the command that made the model, and the sha256 of its weights
                   (the test checks ragline still writes the same weights)

on the 230 parity texts (tests/fixtures/parity/texts.jsonl). With --mpnet DIR it also writes
tests/fixtures/families/all-mpnet-base-v2/encode.npy for the real model. No weights are kept.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "families")
FAMILIES = {"bert": 101, "xlm-roberta": 102, "distilbert": 103, "mpnet": 104, "modernbert": 105, "qwen3": 106, "gemma3": 107}
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
    ap.add_argument("--mpnet", default=None, help="the real all-mpnet-base-v2 folder")
    args = ap.parse_args()
    import numpy as np
    import sentence_transformers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    texts = [json.loads(l)["text"] for l in open(os.path.join(ROOT, "tests", "fixtures", "parity", "texts.jsonl"), encoding="utf-8")]
    versions = {"sentence_transformers": sentence_transformers.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        for family, seed in FAMILIES.items():
            folder = os.path.join(tmp, family)
            command = ["random-model", "--base", "models/all-MiniLM-L6-v2", "--out", "DIR", "--family", family,
                       "--hidden", str(HIDDEN), "--layers", str(LAYERS), "--seed", str(seed)]
            real = [args.ragline] + [args.base if c == "models/all-MiniLM-L6-v2" else folder if c == "DIR" else c for c in command[0:]]
            subprocess.run(real, check=True, stdout=subprocess.DEVNULL)
            model = SentenceTransformer(folder, device="cpu")
            model.eval()
            dest = os.path.join(OUT, family)
            os.makedirs(dest, exist_ok=True)
            with torch.inference_mode():
                outputs = {
                    "encode": model.encode(texts, batch_size=32, convert_to_numpy=True),
                    "query": model.encode_query(texts, batch_size=32, convert_to_numpy=True),
                    "document": model.encode_document(texts, batch_size=32, convert_to_numpy=True),
                }
            for name, m in outputs.items():
                np.save(os.path.join(dest, f"{name}.npy"), m.astype(np.float32))
            meta = {
                "command": "ragline " + " ".join(command),
                "weights_sha256": sha256(os.path.join(folder, "model.safetensors")),
                "modules": [type(m).__name__ for m in model],
                "dimension": int(outputs["encode"].shape[1]),
                "texts": len(texts),
                **versions,
            }
            json.dump(meta, open(os.path.join(dest, "reference.json"), "w"), indent=2)
            print(f"{family}: {meta['modules']} dimension {meta['dimension']}", file=sys.stderr)
    if args.mpnet:
        model = SentenceTransformer(args.mpnet, device="cpu")
        dest = os.path.join(OUT, "all-mpnet-base-v2")
        os.makedirs(dest, exist_ok=True)
        with torch.inference_mode():
            m = model.encode(texts, batch_size=16, convert_to_numpy=True)
        np.save(os.path.join(dest, "encode.npy"), m.astype(np.float32))
        json.dump({"model": "sentence-transformers/all-mpnet-base-v2", "weights_sha256": sha256(os.path.join(args.mpnet, "model.safetensors")), "texts": len(texts), **versions},
                  open(os.path.join(dest, "reference.json"), "w"), indent=2)
        print("all-mpnet-base-v2 done", file=sys.stderr)


if __name__ == "__main__":
    main()
