#!/usr/bin/env bash
# ragline vs sentence-transformers on the same texts, same model, same max length, same
# thread count, run side by side in one go (alternating, median of RUNS each), text in to
# vectors out. Prints tokens/s of each and the ratio.
#
#   PYTHON=/path/to/venv/bin/python scripts/bench-peers.sh [THREADS] [RUNS] [DEVICE]
#
# PYTHON must have sentence-transformers (pip install sentence-transformers). The texts are
# 2,000 passages cut from ../shared/data (react-docs and MDN paragraphs), built once into
# target/bench-peers/passages.jsonl. DEVICE is cpu (default) or cuda.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
THREADS=${1:-$(nproc)}
RUNS=${2:-3}
DEVICE=${3:-cpu}
PYTHON=${PYTHON:-python3}
MODEL=${MODEL:-$ROOT/models/all-MiniLM-L6-v2}
RAGLINE=${RAGLINE:-$ROOT/target/release/ragline}
OUT=$ROOT/target/bench-peers
mkdir -p "$OUT"
[ -x "$RAGLINE" ] || cargo build --release --quiet
[ -f "$MODEL/model.safetensors" ] || scripts/fetch-model.sh

if [ ! -s "$OUT/passages.jsonl" ]; then
  "$PYTHON" - "$OUT/passages.jsonl" <<'PY'
import json, os, random, re, sys
data = os.path.join(os.getcwd(), "..", "shared", "data")
paras = []
for sub in ("react-docs", "mdn"):
    for d, _, names in sorted(os.walk(os.path.join(data, sub))):
        for n in sorted(names):
            if n.endswith(".md"):
                text = open(os.path.join(d, n), encoding="utf-8").read()
                for p in re.split(r"\n\s*\n", text):
                    p = p.strip()
                    if 200 <= len(p) <= 2500 and not p.startswith(("---", "<", "|")):
                        paras.append(p)
random.Random(7).shuffle(paras)
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for p in paras[:2000]:
        f.write(json.dumps({"text": p}, ensure_ascii=False) + "\n")
PY
fi

export RAYON_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
"$PYTHON" - "$OUT/passages.jsonl" "$MODEL" "$RAGLINE" "$THREADS" "$RUNS" "$DEVICE" <<'PY'
import json, platform, statistics, subprocess, sys, time
path, model_dir, ragline, threads, runs, device = sys.argv[1:7]
threads, runs = int(threads), int(runs)
import torch
from sentence_transformers import SentenceTransformer
torch.set_num_threads(threads)
texts = [json.loads(l)["text"] for l in open(path, encoding="utf-8")]
st = SentenceTransformer(model_dir, device=device)
if device == "cuda":
    st = st.half()
tok = st.tokenizer
tokens = sum(len(x) for x in tok(texts, truncation=True, max_length=st.max_seq_length)["input_ids"])

def run_st():
    t = time.perf_counter()
    st.encode(texts, batch_size=32 if device == "cpu" else 512, convert_to_numpy=True)
    return time.perf_counter() - t

def run_ragline():
    t = time.perf_counter()
    subprocess.run([ragline, "embed", "--model", model_dir, "--device", device,
                    "--input", path, "--output", "/tmp/bench-peers-ragline.npy"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t

run_st()  # warm-up: torch's first call allocates and plans
times = {"sentence-transformers": [], "ragline": []}
for i in range(runs):
    order = [("ragline", run_ragline), ("sentence-transformers", run_st)]
    if i % 2:
        order.reverse()
    for name, fn in order:
        times[name].append(fn())
print(f"{len(texts)} passages, {tokens} tokens (truncated at {st.max_seq_length}), "
      f"{threads} threads, device {device}, {platform.processor() or platform.machine()}")
rate = {}
for name, ts in times.items():
    med = statistics.median(ts)
    rate[name] = tokens / med
    print(f"{name:>22}: {rate[name]:10.0f} tokens/s  (median of {runs}: {med:.2f}s; runs {', '.join(f'{t:.2f}' for t in ts)})")
print(f"{'ratio':>22}: {rate['ragline'] / rate['sentence-transformers']:.2f}x (ragline / sentence-transformers)")
PY
