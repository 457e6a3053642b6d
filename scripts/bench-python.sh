#!/usr/bin/env bash
# The Python package's benchmark: `Embedder.embed` against sentence-transformers' `encode` on
# the same 2,000 passages in one script (their ratio), against `ragline embed` (the binding's
# overhead, goal < 5%), and whether two Python threads embedding at once serialise on the GIL.
#
#   scripts/bench-python.sh [COUNT]
#
# Installs ./python (the release build `pip install ./python` makes) into the reference
# virtualenv (scripts/reference-venv.sh: sentence-transformers and torch), so both libraries
# run in one interpreter; prints the JSON of scripts/bench-python.py and the CPU model.
# REPEATS=N (default 3): timed runs of each, the median reported.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
COUNT=${1:-2000}
PY=$(scripts/reference-venv.sh)
VENV=$(dirname "$(dirname "$PY")")
[ -f models/all-MiniLM-L6-v2/model.safetensors ] || scripts/fetch-model.sh >&2
started=$SECONDS
"$VENV/bin/pip" install --quiet --disable-pip-version-check ./python >&2
echo "pip install ./python (release): $((SECONDS - started))s" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" scripts/bench-passages.py "$tmp/passages.jsonl" "$COUNT"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores" >&2
PATH="$VENV/bin:$PATH" HF_HUB_OFFLINE=1 "$PY" scripts/bench-python.py "$tmp/passages.jsonl" \
  "$ROOT/models/all-MiniLM-L6-v2"
