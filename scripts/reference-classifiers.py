#!/usr/bin/env python3
"""Reference entities and labels for ragline's token and sequence classifiers, from
transformers' own pipelines (`token-classification`, `text-classification`) on random-weight
models that `ragline random-model --task ner|classify|classify-multi` writes.

    PY=$(scripts/reference-venv.sh)
    $PY scripts/reference-classifiers.py [--ragline target/debug/ragline]

Writes, under tests/fixtures/classifiers/:

    texts.jsonl              the 200 texts: 196 of the parity texts (tests/fixtures/parity/
                             texts.jsonl: non-ASCII, and many past the models' 128 tokens)
                             and four with no entity to find (empty, blank, short)
    ner-FAMILY/entities.json.gz  for each aggregation strategy (none, simple, first, average,
                             max), the pipeline's entities of every text, read in windows of
                             the model's 128 tokens that share --stride tokens (the pipeline's
                             `stride`). The pipeline refuses a stride with "none"; for it the
                             pipeline's own preprocess/forward/postprocess run with the same
                             windows (checked equal to the plain call on texts of one window)
    classify-FAMILY/labels.json  text-classification(top_k=None, truncation=True) of every
                             text; classify-multi-bert is a multi-label model (sigmoid)
    */reference.json         versions, the command that made the model, the sha256 of its
                             weights

No weights are kept.
"""
import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NER = {"bert": 401, "xlm-roberta": 402, "distilbert": 403, "modernbert": 404}
CLASSIFY = {"bert": 411, "xlm-roberta": 412, "distilbert": 413, "mpnet": 414, "modernbert": 415, "qwen3": 416, "gemma3": 417}
MULTI = {"bert": 421}
HIDDEN, LAYERS, MAX_LEN, STRIDE = 32, 2, 128, 32
STRATEGIES = ["none", "simple", "first", "average", "max"]
EXTRA = ["", "   ", "ok", "Ünïcödé — 東京 ☃"]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def plain(entities):
    return [{k: (float(v) if k == "score" else int(v) if k in ("start", "end", "index") else v) for k, v in e.items()} for e in entities]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ragline", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "debug", "ragline"))
    ap.add_argument("--base", default=os.path.join(ROOT, "models", "all-MiniLM-L6-v2"))
    ap.add_argument("--only", action="append", default=[],
                    help="make only these fixtures (ner-bert, classify-gemma3...); default: all")
    args = ap.parse_args()
    import torch
    import transformers
    from transformers import pipeline
    from transformers.pipelines.token_classification import AggregationStrategy

    torch.set_num_threads(os.cpu_count() or 1)
    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    parity = [json.loads(l)["text"] for l in open(os.path.join(ROOT, "tests", "fixtures", "parity", "texts.jsonl"), encoding="utf-8")]
    texts = parity[:196] + EXTRA
    out = os.path.join(ROOT, "tests", "fixtures", "classifiers")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "texts.jsonl"), "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n")

    def write_model(folder, task, family, seed):
        command = ["random-model", "--task", task, "--base", "models/all-MiniLM-L6-v2", "--out", "DIR", "--family", family,
                   "--hidden", str(HIDDEN), "--layers", str(LAYERS), "--seed", str(seed), "--max-len", str(MAX_LEN)]
        real = [args.ragline] + [args.base if c == "models/all-MiniLM-L6-v2" else folder if c == "DIR" else c for c in command]
        subprocess.run(real, check=True, stdout=subprocess.DEVNULL)
        return {"command": "ragline " + " ".join(command), "weights_sha256": sha256(os.path.join(folder, "model.safetensors")), **versions}

    def none_in_windows(pipe, text):
        inputs = pipe.preprocess(text, tokenizer_params={"return_overflowing_tokens": True, "padding": True, "stride": STRIDE},
                                 is_split_into_words=False)
        with torch.inference_mode():
            outputs = [pipe._forward(x) for x in inputs]
        return pipe.postprocess(outputs, aggregation_strategy=AggregationStrategy.NONE)

    with tempfile.TemporaryDirectory() as tmp:
        for family, seed in NER.items():
            if args.only and "ner-" + family not in args.only:
                continue
            folder = os.path.join(tmp, "ner-" + family)
            meta = write_model(folder, "ner", family, seed)
            pipe = pipeline("token-classification", model=folder, device="cpu")
            result = {}
            for strategy in STRATEGIES:
                rows = []
                for t in texts:
                    if strategy == "none":
                        found = none_in_windows(pipe, t)
                        if len(pipe.tokenizer(t)["input_ids"]) <= MAX_LEN:
                            assert plain(found) == plain(pipe(t, aggregation_strategy="none")), t[:80]
                    else:
                        found = pipe(t, aggregation_strategy=strategy, stride=STRIDE)
                    rows.append(plain(found))
                result[strategy] = rows
                print(f"ner {family} {strategy}: {sum(len(r) for r in rows)} entities, {sum(1 for r in rows if not r)} texts without one", file=sys.stderr)
            dest = os.path.join(out, "ner-" + family)
            os.makedirs(dest, exist_ok=True)
            # mtime=0: the same entities make the same bytes.
            with open(os.path.join(dest, "entities.json.gz"), "wb") as raw:
                with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
                    f.write(json.dumps({"stride": STRIDE, "entities": result}, ensure_ascii=False).encode("utf-8"))
            json.dump({**meta, "max_len": MAX_LEN, "stride": STRIDE, "texts": len(texts)}, open(os.path.join(dest, "reference.json"), "w"), indent=2)

        for task, models in (("classify", CLASSIFY), ("classify-multi", MULTI)):
            for family, seed in models.items():
                if args.only and task + "-" + family not in args.only:
                    continue
                folder = os.path.join(tmp, task + "-" + family)
                meta = write_model(folder, task, family, seed)
                pipe = pipeline("text-classification", model=folder, device="cpu", top_k=None, truncation=True)
                with torch.inference_mode():
                    labels = pipe(texts, batch_size=16)
                rows = [[{"label": x["label"], "score": float(x["score"])} for x in r] for r in labels]
                dest = os.path.join(out, task + "-" + family)
                os.makedirs(dest, exist_ok=True)
                json.dump({"labels": rows}, open(os.path.join(dest, "labels.json"), "w"))
                json.dump({**meta, "max_len": MAX_LEN, "texts": len(texts)}, open(os.path.join(dest, "reference.json"), "w"), indent=2)
                print(f"{task} {family}: top labels {sorted(set(r[0]['label'] for r in rows))}", file=sys.stderr)


if __name__ == "__main__":
    main()
