#!/usr/bin/env python3
"""ragline ner / classify against transformers' pipelines on the same texts (see
scripts/bench-classifiers.sh), each in f32 and in bf16 (ragline's fused encoder with bf16
dense layers, AMX where the CPU has it; transformers with torch_dtype=bfloat16). Both are
timed with their model loaded: transformers' pipeline call, and ragline's own figure for the
work after loading (the `ner`/`classify` command prints its time with the model loaded:
`... in N.NNs`). Tokens are the windows' tokens (special tokens included) as the pipeline's
tokenizer makes them, the same count for both. For bf16, how far its answers are from
ragline's f32 ones: the texts whose entities (spans and types) or top label differ."""
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
        rates = {}
        outputs = {}
        for dtype in ("f32", "bf16"):
            kwargs = {"device": "cpu"}
            if dtype == "bf16":
                kwargs["dtype"] = torch.bfloat16
            out = os.path.join(tmp, f"{task}-{dtype}.jsonl")
            if task == "ner":
                pipe = pipeline("token-classification", model=folder, **kwargs)
                tok = pipe.tokenizer
                tokens = sum(len(ids) for t in texts for ids in tok(t, truncation=True, stride=STRIDE, return_overflowing_tokens=True)["input_ids"])
                call = lambda: pipe(texts, aggregation_strategy="simple", stride=STRIDE, batch_size=args.batch)
                cmd = [args.ragline, "ner", "--device", "cpu", "--dtype", dtype, "--stride", str(STRIDE), "--model", folder, "--input", inp, "--output", out]
            else:
                pipe = pipeline("text-classification", model=folder, top_k=None, truncation=True, **kwargs)
                tok = pipe.tokenizer
                tokens = sum(len(tok(t, truncation=True)["input_ids"]) for t in texts)
                call = lambda: pipe(texts, batch_size=args.batch)
                cmd = [args.ragline, "classify", "--device", "cpu", "--dtype", dtype, "--model", folder, "--input", inp, "--output", out]
            best = {"transformers": float("inf"), "ragline": float("inf")}
            for _ in range(args.runs):
                with torch.inference_mode():
                    t0 = time.perf_counter()
                    call()
                    best["transformers"] = min(best["transformers"], time.perf_counter() - t0)
                p = subprocess.run(cmd, capture_output=True, text=True, check=True)
                m = re.search(r" in ([0-9.]+)s", p.stderr)
                best["ragline"] = min(best["ragline"], float(m.group(1)))
            for k, v in best.items():
                rates[(k, dtype)] = tokens / v
            outputs[dtype] = [json.loads(l) for l in open(out, encoding="utf-8")]
            del pipe
        key = "entities" if task == "ner" else "labels"
        def shape(row):
            if task == "ner":
                return [(e["entity_group"], e["start"], e["end"]) for e in row[key]]
            return row[key][0]["label"]
        differ = sum(1 for a, b in zip(outputs["f32"], outputs["bf16"]) if shape(a) != shape(b))
        print(f"{task}: {tokens} tokens a run")
        for dtype in ("f32", "bf16"):
            t, r = rates[("transformers", dtype)], rates[("ragline", dtype)]
            print(f"  {dtype}: transformers {t:,.0f} tokens/s, ragline {r:,.0f} tokens/s: {r / t:.2f}x")
        print(f"  ragline bf16 against f32: {differ} of {len(texts)} texts differ ({'entity spans or types' if task == 'ner' else 'top label'})")
        print(f"  ragline bf16 / transformers f32: {rates[('ragline', 'bf16')] / rates[('transformers', 'f32')]:.2f}x")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
