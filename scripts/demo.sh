#!/usr/bin/env bash
# The main job on the embedded default: fetch the model if needed, build, ingest a corpus into
# ragline.db (SQLite with vectors and full text), and search it.
#
#   scripts/demo.sh [CORPUS] [QUERY]
#
# CORPUS defaults to ../shared/data/react-docs, else the small sample in tests/fixtures.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CORPUS=${1:-../shared/data/react-docs}
[ -d "$CORPUS" ] || CORPUS=tests/fixtures/react
QUERY=${2:-how do I run code after render}
[ -f models/all-MiniLM-L6-v2/model.safetensors ] || scripts/fetch-model.sh
scripts/build-deps.sh
cargo build --release --quiet
./target/release/ragline ingest "$CORPUS" --index sqlite://ragline.db
echo
echo "search: $QUERY"
./target/release/ragline search "$QUERY" --index sqlite://ragline.db -k 5
