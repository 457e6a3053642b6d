#!/usr/bin/env bash
# Peak memory and time of one long input (2,048, 4,096 and 8,192 tokens) through base-size
# models with random weights: XLM-RoBERTa-base's shape (the fused CPU engine) and
# ModernBERT-base's (the rotary encoder), both with MiniLM's vocabulary (a real XLM-RoBERTa
# adds its 250k x 768 embedding table, 730 MiB, to every row). Attention runs a block of
# query rows at a time, so memory grows with the length, not its square.
#
#   scripts/long-inputs.sh [FAMILIES...]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
RAGLINE=${RAGLINE:-$TARGET/release/ragline}
[ -x "$RAGLINE" ] || cargo build --release --features test-hooks --quiet
[ -x /usr/bin/time ] || { echo "needs GNU time (apt-get install time)" >&2; exit 2; }
FAMILIES=("$@")
[ ${#FAMILIES[@]} -gt 0 ] || FAMILIES=(xlm-roberta modernbert)
OUT=$TARGET/long-inputs
mkdir -p "$OUT"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) threads"
printf '%-12s %7s %10s %9s\n' family tokens "peak MiB" seconds
for family in "${FAMILIES[@]}"; do
  model=$OUT/$family
  [ -f "$model/model.safetensors" ] || "$RAGLINE" random-model --base models/all-MiniLM-L6-v2 \
    --out "$model" --family "$family" --real-shape --max-seq-length 8192 --seed 1 >/dev/null
  for tokens in 2048 4096 8192; do
    python3 -c "import json,sys; print(json.dumps({'text': ' '.join(['token'] * ($tokens - 2))}))" \
      > "$OUT/input.jsonl"
    /usr/bin/time -v "$RAGLINE" embed --device cpu --model "$model" --input "$OUT/input.jsonl" \
      --output "$OUT/out.npy" 2> "$OUT/time.txt" >/dev/null
    peak=$(awk -F': ' '/Maximum resident set size/ {print int($2 / 1024)}' "$OUT/time.txt")
    secs=$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; print s}' "$OUT/time.txt")
    printf '%-12s %7d %10d %9.1f\n' "$family" "$tokens" "$peak" "$secs"
  done
done
