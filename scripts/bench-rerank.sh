#!/usr/bin/env bash
# Reranking 50 candidates with a MiniLM-L6-shaped cross-encoder on the CPU: ragline serve's
# POST /rerank against sentence-transformers' CrossEncoder in the same run (latency p50/p99),
# then /rerank under CLIENTS clients (default 64). See scripts/bench-rerank.py.
#
#   scripts/bench-rerank.sh [CLIENTS] [SECONDS]
#
# Needs a release build (cargo build --release), the model (scripts/fetch-model.sh), the
# reference virtualenv (scripts/reference-venv.sh) and ../shared/data/scifact.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BIN=${RAGLINE:-${CARGO_TARGET_DIR:-target}/release/ragline}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
PY=$(scripts/reference-venv.sh)
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; $(date -u +%F)"
"$PY" scripts/bench-rerank.py --ragline "$BIN" --clients "${1:-64}" --seconds "${2:-20}"
