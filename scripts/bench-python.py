#!/usr/bin/env python3
"""ragline's Python package against sentence-transformers and against the `ragline` command,
on the same passages in one process (run by scripts/bench-python.sh).

    bench-python.py PASSAGES.jsonl MODEL_DIR

Prints one JSON object: texts/s of `Embedder.embed` and of sentence-transformers' `encode`
(the median of REPEATS runs each, after a warm-up) and their ratio; the wall time of loading
the model and embedding every passage through the package and through `ragline embed` (the
binding's overhead); the worst cosine between the two libraries' vectors; and whether the GIL
is released while ragline embeds (a Python thread counting meanwhile) and what two threads
embedding at once take against one after the other (on a quarter of the passages).
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

passages, model_dir = sys.argv[1], sys.argv[2]
repeats = int(os.environ.get("REPEATS", "3"))
texts = [json.loads(line)["text"] for line in open(passages, encoding="utf-8")]


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def median_time(fn):
    runs = [timed(fn)[0] for _ in range(repeats)]
    return statistics.median(runs), runs


import ragline  # noqa: E402

os.environ.setdefault("RAGLINE_MODELS", os.path.dirname(model_dir))
load_secs, emb = timed(lambda: ragline.Embedder(model_dir, device="cpu"))
emb.embed(texts[:64])
rag_runs = []
for _ in range(repeats):
    took, rag_vecs = timed(lambda: emb.embed(texts))
    rag_runs.append(took)
rag_secs = statistics.median(rag_runs)

# The binding's overhead: load + embed everything, in the package and by the command (its
# JSONL in, .npy out), each a fresh start.
def package_end_to_end():
    e = ragline.Embedder(model_dir, device="cpu")
    return e.embed(texts)


tmp = tempfile.mkdtemp()
cli = shutil.which("ragline")
out = os.path.join(tmp, "cli.npy")
cli_cmd = [cli, "embed", "-i", passages, "-o", out, "--device", "cpu", "--model", model_dir]
pkg_e2e, _ = median_time(package_end_to_end)
cli_e2e, _ = median_time(lambda: subprocess.run(cli_cmd, check=True, capture_output=True))
cli_vecs = np.load(out)

# The GIL: a Python thread counts while ragline embeds, then while nothing runs.
def count_for(stop):
    n = 0
    while not stop.is_set():
        n += 1
    return n


def counting_during(work, seconds=None):
    stop = threading.Event()
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("n", count_for(stop)))
    t.start()
    t0 = time.perf_counter()
    if work is None:
        time.sleep(seconds)
    else:
        work()
    took = time.perf_counter() - t0
    stop.set()
    t.join()
    return result["n"] / took


# A quarter of the passages for these (the counting thread takes a core of its own).
part = texts[: len(texts) // 4]
idle_rate = counting_during(None, 2.0)
busy_rate = counting_during(lambda: emb.embed(part))

half = len(part) // 2
serial, _ = timed(lambda: (emb.embed(part[:half]), emb.embed(part[half:])))
threads = [threading.Thread(target=emb.embed, args=(p,)) for p in (part[:half], part[half:])]
t0 = time.perf_counter()
for t in threads:
    t.start()
for t in threads:
    t.join()
parallel = time.perf_counter() - t0

from sentence_transformers import SentenceTransformer  # noqa: E402
import torch  # noqa: E402
import sentence_transformers  # noqa: E402

st = SentenceTransformer(model_dir, device="cpu")
st.encode(texts[:64], batch_size=32)
st_runs = []
for _ in range(repeats):
    took, st_vecs = timed(lambda: st.encode(texts, batch_size=32))
    st_runs.append(took)
st_secs = statistics.median(st_runs)

cos = np.sum(rag_vecs * st_vecs, axis=1) / (
    np.linalg.norm(rag_vecs, axis=1) * np.linalg.norm(st_vecs, axis=1))

print(json.dumps({
    "texts": len(texts),
    "repeats": repeats,
    "ragline_version": ragline.__version__,
    "encoder": emb.encoder,
    "sentence_transformers": sentence_transformers.__version__,
    "torch": torch.__version__,
    "torch_threads": torch.get_num_threads(),
    "ragline_embed_secs": round(rag_secs, 3),
    "ragline_texts_per_sec": round(len(texts) / rag_secs, 1),
    "st_encode_secs": round(st_secs, 3),
    "st_texts_per_sec": round(len(texts) / st_secs, 1),
    "ratio_ragline_over_st": round(st_secs / rag_secs, 2),
    "min_cosine_vs_st": round(float(cos.min()), 6),
    "max_abs_diff_vs_cli": float(np.abs(cli_vecs - rag_vecs).max()),
    "model_load_secs": round(load_secs, 3),
    "package_load_and_embed_secs": round(pkg_e2e, 3),
    "cli_embed_secs": round(cli_e2e, 3),
    "binding_overhead_pct": round(100 * (pkg_e2e - cli_e2e) / cli_e2e, 1),
    "python_counter_rate_while_embedding_vs_idle": round(busy_rate / idle_rate, 3),
    "two_threads_secs": round(parallel, 3),
    "one_after_the_other_secs": round(serial, 3),
    "runs": {"ragline": [round(r, 3) for r in rag_runs], "st": [round(r, 3) for r in st_runs]},
}, indent=2))
