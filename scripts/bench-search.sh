#!/usr/bin/env bash
# `ragline serve --index` under search load: the react-docs corpus (../shared/data/react-docs)
# indexed once, then CLIENTS clients (default 16) for SECONDS (default 20) per mode sending
# GET /v1/search (the queries: the corpus's page titles), client-side latency p50/p90/p99 and
# queries/s per mode (scripts/bench-search-load.py).
#
#   [RAGLINE_BIN=target/release/ragline] scripts/bench-search.sh [CLIENTS] [SECONDS]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CLIENTS=${1:-16}
SECS=${2:-20}
DATA=${RAGLINE_DATA_DIR:-$ROOT/../shared/data}
BIN=${RAGLINE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ragline}
[ -x "$BIN" ] || cargo build --release --quiet
[ -f models/all-MiniLM-L6-v2/model.safetensors ] || scripts/fetch-model.sh >&2
OUT=${CARGO_TARGET_DIR:-$ROOT/target}/bench-search
mkdir -p "$OUT"
if [ ! -s "$OUT/react.db" ]; then
  "$BIN" ingest --progress none --model models/all-MiniLM-L6-v2 --index "sqlite://$OUT/react.db" \
    "$DATA/react-docs" >&2
fi
grep -rh -m1 '^title:' "$DATA/react-docs" | sed 's/^title: *//; s/^"//; s/"$//' | sort -u > "$OUT/queries.txt"
echo "$(wc -l < "$OUT/queries.txt") queries; cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores" >&2
"$BIN" serve --port 0 --index "sqlite://$OUT/react.db" > "$OUT/serve.out" 2> "$OUT/serve.log" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do grep -q '^listening on' "$OUT/serve.out" 2>/dev/null && break; sleep 0.1; done
URL=$(sed -n 's/^listening on //p' "$OUT/serve.out" | head -1)
for mode in keyword vector hybrid; do
  python3 scripts/bench-search-load.py "$URL" "$OUT/queries.txt" --clients "$CLIENTS" --seconds "$SECS" --mode "$mode"
done
