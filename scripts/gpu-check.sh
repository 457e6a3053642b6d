#!/usr/bin/env bash
# The one prepared script for a GPU machine (run from the repository root, with .gpu/ made by
# scripts/gpu-prepare.sh carried along):
#   1. parity: f16 and bf16 vectors of the parity texts against sentence-transformers' f32
#      reference (tests/fixtures/parity), cosine >= 0.999 each;
#   2. throughput, text in to vectors out, of ragline and of sentence-transformers (fp16) on
#      the same 100,000 passages, in the same run.
# Results go to $OUT (or /tmp/gpu-check) as gpu-check.json and the logs. Exits 1 when a parity
# check fails (after writing everything it measured), 2 when something could not run.
set -euo pipefail
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
G=.gpu
PY=${PYTHON:-$(ls /opt/torch/.venv/bin/python 2>/dev/null || echo python3)}
NV=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia 2>/dev/null || true)
if [ -n "$NV" ]; then
  if [ -d "$NV/cu13/lib" ]; then
    export LD_LIBRARY_PATH=$NV/cu13/lib:${LD_LIBRARY_PATH:-}
  else
    export LD_LIBRARY_PATH=$(ls -d "$NV"/*/lib | paste -sd:):${LD_LIBRARY_PATH:-}
  fi
fi
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
gunzip -c "$G/ragline-cuda.gz" > /tmp/ragline
chmod +x /tmp/ragline
if ldd /tmp/ragline | grep 'not found'; then echo "missing libraries" >&2; exit 1; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
gunzip -c "$G/passages.jsonl.gz" > /tmp/passages.jsonl

# 1. Parity.
for dt in f16 bf16; do
  /tmp/ragline embed --device cuda --dtype "$dt" --model "$G/model" \
    --input tests/fixtures/parity/texts.jsonl --output "$OUT/parity-$dt.npy" 2>&1 | tail -2
done

# 2. Throughput: ragline (end to end, one process), then sentence-transformers, twice each.
for i in 1 2; do
  /usr/bin/time -f "%e s wall, %M kB peak RSS" /tmp/ragline embed --device cuda --dtype f16 \
    --model "$G/model" --input /tmp/passages.jsonl --output /tmp/v.npy 2>&1 | tail -2 \
    | tee -a "$OUT/ragline-throughput.log"
done
/tmp/ragline bench --device cuda --dtype f16 --model "$G/model" --chunks 50000 --json \
  > "$OUT/ragline-bench.json" 2>&1 || true

"$PY" - "$OUT" "$G/model" <<'PY'
import json, sys, time, re
import numpy as np
out, model_dir = sys.argv[1], sys.argv[2]
ref = np.load("tests/fixtures/parity/reference.npy")
result = {}
for dt in ("f16", "bf16"):
    v = np.load(f"{out}/parity-{dt}.npy").astype(np.float64)
    cos = (v * ref).sum(1) / np.linalg.norm(v, axis=1) / np.linalg.norm(ref, axis=1)
    result[f"parity_{dt}_min_cosine"] = float(cos.min())
    result[f"parity_{dt}_ok"] = bool(cos.min() >= 0.999)
texts = [json.loads(l)["text"] for l in open("/tmp/passages.jsonl", encoding="utf-8")]
import torch
from sentence_transformers import SentenceTransformer
st = SentenceTransformer(model_dir, device="cuda").half()
tokens = sum(len(x) for x in st.tokenizer(texts, truncation=True, max_length=st.max_seq_length)["input_ids"])
result["texts"], result["tokens"] = len(texts), tokens
st.encode(texts[:2048], batch_size=512)
times = []
for _ in range(2):
    torch.cuda.synchronize(); t = time.perf_counter()
    st.encode(texts, batch_size=512, convert_to_numpy=True)
    torch.cuda.synchronize(); times.append(time.perf_counter() - t)
result["st_fp16_tokens_per_s"] = tokens / min(times)
walls = [float(m.group(1)) for m in re.finditer(r"([0-9.]+) s wall", open(f"{out}/ragline-throughput.log").read())]
result["ragline_f16_tokens_per_s"] = tokens / min(walls)
result["ratio"] = result["ragline_f16_tokens_per_s"] / result["st_fp16_tokens_per_s"]
json.dump(result, open(f"{out}/gpu-check.json", "w"), indent=2)
print(json.dumps(result, indent=2))
failed = [dt for dt in ("f16", "bf16") if not result[f"parity_{dt}_ok"]]
if failed:
    print(f"PARITY FAILED for {', '.join(failed)}: min cosine "
          + ", ".join(f"{result[f'parity_{dt}_min_cosine']:.5f}" for dt in failed)
          + " < 0.999", file=sys.stderr)
    sys.exit(1)
PY
