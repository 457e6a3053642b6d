#!/usr/bin/env bash
# Prepare what scripts/gpu-check.sh needs on a GPU machine, in .gpu/ (git-ignored, under the
# device tool's 64 MiB carry limit): the CUDA binary (stripped, gzipped), the model with f16
# weights (the f32 file alone is 90 MB), and the passages for the throughput run.
#
#   PYTHON=/path/to/venv/bin/python scripts/gpu-prepare.sh
#
# PYTHON needs safetensors and torch (for the f16 conversion); the CUDA binary comes from
# scripts/build-cuda.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
G=.gpu
mkdir -p "$G/model/1_Pooling"
[ -f target/cuda/ragline-cuda.gz ] || scripts/build-cuda.sh
cp target/cuda/ragline-cuda.gz "$G/"
M=models/all-MiniLM-L6-v2
[ -f "$M/model.safetensors" ] || scripts/fetch-model.sh
for f in config.json tokenizer.json modules.json sentence_bert_config.json \
         config_sentence_transformers.json 1_Pooling/config.json; do
  [ -f "$M/$f" ] && cp "$M/$f" "$G/model/$f"
done
"$PYTHON" - "$M/model.safetensors" "$G/model/model.safetensors" <<'PY'
import sys, torch
from safetensors.torch import load_file, save_file
t = load_file(sys.argv[1])
save_file({k: v.to(torch.float16).contiguous() for k, v in t.items()}, sys.argv[2])
PY
# Throughput texts: the peer benchmark's passages, repeated to 100,000 (about 11M tokens).
[ -s target/bench-peers/passages.jsonl ] || { echo "run scripts/bench-peers.sh once first" >&2; exit 1; }
for i in $(seq 50); do cat target/bench-peers/passages.jsonl; done | gzip -1 > "$G/passages.jsonl.gz"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
du -sh "$G"
