#!/usr/bin/env python3
"""ragline ner / classify against transformers' pipelines on the same texts (see
scripts/bench-classifiers.sh). Both are timed with their model loaded: transformers' pipeline
call, and ragline's own figure for the work after loading (the `ner`/`classify` command
prints its time with the model loaded: `... in N.NNs`). Tokens are the windows' tokens
(special tokens included) as the pipeline's tokenizer makes them, the same count for both."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRIDE = 64


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ragline", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--family", default="bert")
    ap.add_argument("--texts", type=int, default=400)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    import torch
    import transformers
    from transformers import pipeline

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    parity = [json.loads(l)["text"] for l in open(os.path.join(ROOT, "tests", "fixtures", "parity", "texts.jsonl"), encoding="utf-8")]
    texts = [t for t in parity if t.strip()]
    texts = (texts * (args.texts // len(texts) + 1))[: args.texts]
    tmp = tempfile.mkdtemp()
    inp = os.path.join(tmp, "texts.jsonl")
    with open(inp, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n")
    print(f"{len(texts)} texts, {threads} threads, torch {torch.__version__}, transformers {transformers.__version__}, batch {args.batch}")
    for task in ("ner", "classify"):
        folder = os.path.join(args.models, f"{task}-{args.family}")
        if task == "ner":
            pipe = pipeline("token-classification", model=folder, device="cpu")
            tok = pipe.tokenizer
            tokens = sum(len(ids) for t in texts for ids in tok(t, truncation=True, stride=STRIDE, return_overflowing_tokens=True)["input_ids"])
            call = lambda: pipe(texts, aggregation_strategy="simple", stride=STRIDE, batch_size=args.batch)
            cmd = [args.ragline, "ner", "--device", "cpu", "--stride", str(STRIDE), "--model", folder, "--input", inp, "--output", os.devnull]
        else:
            pipe = pipeline("text-classification", model=folder, device="cpu", top_k=None, truncation=True)
            tok = pipe.tokenizer
            tokens = sum(len(tok(t, truncation=True)["input_ids"]) for t in texts)
            call = lambda: pipe(texts, batch_size=args.batch)
            cmd = [args.ragline, "classify", "--device", "cpu", "--model", folder, "--input", inp, "--output", os.devnull]
        best = {"transformers": float("inf"), "ragline": float("inf")}
        for _ in range(args.runs):
            with torch.inference_mode():
                t0 = time.perf_counter()
                call()
                best["transformers"] = min(best["transformers"], time.perf_counter() - t0)
            p = subprocess.run(cmd, capture_output=True, text=True, check=True)
            m = re.search(r" in ([0-9.]+)s", p.stderr)
            best["ragline"] = min(best["ragline"], float(m.group(1)))
        rate = {k: tokens / v for k, v in best.items()}
        print(f"{task}: {tokens} tokens; transformers {rate['transformers']:,.0f} tokens/s, ragline {rate['ragline']:,.0f} tokens/s: "
              f"{rate['ragline'] / rate['transformers']:.2f}x")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
