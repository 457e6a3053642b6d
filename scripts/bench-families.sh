#!/usr/bin/env bash
# ragline against sentence-transformers per model family, in the published models' shapes
# with random weights (the weights of most families cannot be fetched here; speed does not
# depend on their values): BERT-base for bert/xlm-roberta/mpnet, 6 layers for distilbert,
# ModernBERT-base, Qwen3-Embedding-0.6B, EmbeddingGemma-300m. Each with scripts/bench-peers.sh
# (same texts, threads, max length; f32), on the first PASSAGES passages (fewer for Qwen3).
#
#   PYTHON=$(scripts/reference-venv.sh) scripts/bench-families.sh [THREADS] [RUNS] [FAMILIES...]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
THREADS=${1:-$(nproc)}
RUNS=${2:-1}
shift $(( $# > 2 ? 2 : $# ))
FAMILIES=("$@")
[ ${#FAMILIES[@]} -gt 0 ] || FAMILIES=(bert xlm-roberta distilbert mpnet modernbert gemma3 qwen3)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
export RAGLINE=${RAGLINE:-$TARGET/release/ragline}
[ -x "$RAGLINE" ] || cargo build --release --features test-hooks --quiet
[ -f models/all-MiniLM-L6-v2/model.safetensors ] || scripts/fetch-model.sh
OUT=$TARGET/bench-families
mkdir -p "$OUT"
for family in "${FAMILIES[@]}"; do
  model=$OUT/$family
  [ -f "$model/model.safetensors" ] || "$RAGLINE" random-model --base models/all-MiniLM-L6-v2 \
    --out "$model" --family "$family" --real-shape --seed 1 >/dev/null
  case $family in
    qwen3) passages=${PASSAGES_LARGE:-60} ;;
    *) passages=${PASSAGES:-200} ;;
  esac
  echo "== $family (real shape, random weights; $passages passages)"
  MODEL=$model PASSAGES=$passages scripts/bench-peers.sh "$THREADS" "$RUNS" cpu | tail -6
done
