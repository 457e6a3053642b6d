#!/usr/bin/env bash
# The one prepared script for a GPU machine, run from the repository root with .gpu/ (made by
# scripts/gpu-prepare.sh) carried along:
#
#   device run: carry [".gpu"], command "bash scripts/gpu-check.sh", timeout leaving a rerun
#
# It puts the CUDA 13 libraries of the machine's PyTorch on the library path, checks the binary
# links, makes 100,000 distinct passages of the 10,000 carried, and runs scripts/gpu-bench.py:
# f16/bf16 parity, ragline against sentence-transformers fp16 text in to vectors out for
# all-MiniLM-L6-v2 and every family in the published shapes, budgets 32k to 512k, the per-part
# timing, ingest against embed, GPU utilisation and memory sampled throughout. Results:
# $OUT/gpu-check.json and $OUT/logs.tar.gz; a table last. Exits 1 when parity fails.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
G=.gpu
PY=${PYTHON:-$(ls /opt/torch/.venv/bin/python 2>/dev/null || echo python3)}
NV=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia 2>/dev/null || true)
if [ -n "$NV" ]; then
  if [ -d "$NV/cu13/lib" ]; then
    export LD_LIBRARY_PATH=$NV/cu13/lib:${LD_LIBRARY_PATH:-}
  else
    LD_LIBRARY_PATH=$(ls -d "$NV"/*/lib | paste -sd:):${LD_LIBRARY_PATH:-}
    export LD_LIBRARY_PATH
  fi
fi
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
unxz() { "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"; }
unxz "$G/ragline-cuda.xz" /tmp/ragline && chmod +x /tmp/ragline
[ -f "$G/model/model.safetensors" ] || unxz "$G/model.safetensors.xz" "$G/model/model.safetensors"
if ldd /tmp/ragline | grep 'not found'; then echo "missing libraries" >&2; exit 2; fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
nproc >> "$OUT/gpu.txt"
"$PY" - "$G/passages.jsonl.gz" /tmp/passages.jsonl <<'PY'
import gzip, json, sys
texts = [json.loads(l)["text"] for l in gzip.open(sys.argv[1], "rt", encoding="utf-8")]
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for rep in range(100_000 // len(texts)):
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": f"p{rep}-{i}", "text": t if rep == 0 else f"({rep}) {t}"}) + "\n")
PY
export PYTHONUNBUFFERED=1
exec "$PY" scripts/gpu-bench.py --ragline /tmp/ragline --model "$G/model" \
  --passages /tmp/passages.jsonl --out "$OUT" ${GPU_BENCH_ARGS:-}
