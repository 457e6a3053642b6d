#!/usr/bin/env bash
# ragline ner / ragline classify against transformers' token-classification and
# text-classification pipelines, on BERT-base-shaped classifiers with random weights (speed
# does not depend on their values): the same texts, threads, max length (512) and stride,
# batched, f32 on the CPU. Prints tokens/s of each and the ratio. See
# scripts/bench-classifiers.py.
#
#   scripts/bench-classifiers.sh [TEXTS=120] [RUNS=1] [FAMILY=bert]
#
# Needs a release build with test-hooks (built when missing), the model
# (scripts/fetch-model.sh) and the reference virtualenv (scripts/reference-venv.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
export RAGLINE=${RAGLINE:-$TARGET/release/ragline}
[ -x "$RAGLINE" ] || cargo build --release --features test-hooks --quiet
[ -f models/all-MiniLM-L6-v2/model.safetensors ] || scripts/fetch-model.sh
PY=$(scripts/reference-venv.sh)
FAMILY=${3:-bert}
OUT=$TARGET/bench-classifiers
mkdir -p "$OUT"
for task in ner classify; do
  model=$OUT/$task-$FAMILY
  [ -f "$model/model.safetensors" ] || "$RAGLINE" random-model --base models/all-MiniLM-L6-v2 \
    --out "$model" --family "$FAMILY" --task "$task" --real-shape --max-len 512 --seed 1 >/dev/null
done
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; $(date -u +%F)"
"$PY" scripts/bench-classifiers.py --ragline "$RAGLINE" --models "$OUT" --family "$FAMILY" \
  --texts "${1:-120}" --runs "${2:-1}"
