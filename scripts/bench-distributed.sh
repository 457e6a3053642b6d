#!/usr/bin/env bash
# Documents/s through the broker path against the in-process engine: whole documents
# (--no-chunk: no model, no chunker), a null index, N tiny JSONL documents; the in-process
# run, then 1 ingest + W worker processes + 1 indexer process on a fresh JetStream server,
# for each W. Prints docs/s and the ratio to the in-process run, and each role's peak RSS.
#
#   scripts/bench-distributed.sh [DOCS] [WORKERS...]    (default: 100000 1 2 4)
#
# INDEX=URI replaces the null index (`{run}` in it becomes the run's name: local, w1, w2...),
# e.g. INDEX='postgres://ragline:ragline@127.0.0.1:54329/ragline?schema=bench_{run}' for an
# indexer slower than the connector (peak RSS under backpressure); QUEUE_OPTS='limit=200&...'
# adds settings to the queue URL.
#
# Needs a release build (cargo build --release) and scripts/nats.sh (installs nats-server).
set -euo pipefail
cd "$(dirname "$0")/.."
DOCS=${1:-100000}
shift || true
WORKERS=("$@")
[ ${#WORKERS[@]} -gt 0 ] || WORKERS=(1 2 4)
BIN=${CARGO_TARGET_DIR:-target}/release/ragline
INDEX=${INDEX:-null:}
index_for() { echo "${INDEX//\{run\}/$1}"; }
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
NATS_BIN=$(scripts/nats.sh bin)
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT

python3 - "$DOCS" > "$TMP/docs.jsonl" <<'EOF'
import sys
for i in range(int(sys.argv[1])):
    print('{"id": "d%d", "text": "document number %d, a short text"}' % (i, i))
EOF

echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; $DOCS documents"

rate() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"{r['counts']['indexed']/r['elapsed_secs']:.0f}\")" "$1"; }
peak() { sed -n 's/.*Maximum resident set size (kbytes): //p' "$1" | awk '{printf "%.0f MB", $1/1024}'; }

/usr/bin/time -v "$BIN" ingest --progress none --no-chunk --index "$(index_for local)" --report "$TMP/local.json" \
  "$TMP/docs.jsonl" >/dev/null 2>"$TMP/local.time"
LOCAL=$(rate "$TMP/local.json")
echo "in-process: $LOCAL docs/s (peak RSS $(peak "$TMP/local.time"))"

for w in "${WORKERS[@]}"; do
  port=$((43000 + w))
  rm -rf "$TMP/nats"
  "$NATS_BIN" -js -a 127.0.0.1 -p "$port" -sd "$TMP/nats" >/dev/null 2>&1 &
  npid=$!
  for _ in $(seq 1 100); do (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
  url="nats://127.0.0.1:$port${QUEUE_OPTS:+?$QUEUE_OPTS}"
  pids=()
  # The index's URI with its password (the run's settings in the stream never hold one).
  with_index=()
  [ "$INDEX" = null: ] || with_index=(--index "$(index_for "w$w")")
  for i in $(seq 1 "$w"); do
    /usr/bin/time -v "$BIN" worker --queue "$url" --once --threads 1 "${with_index[@]}" 2>"$TMP/worker-$i.time" &
    pids+=($!)
  done
  /usr/bin/time -v "$BIN" indexer --queue "$url" --once "${with_index[@]}" 2>"$TMP/indexer.time" &
  pids+=($!)
  /usr/bin/time -v "$BIN" ingest --progress none --no-chunk --index "$(index_for "w$w")" --queue "$url" \
    --report "$TMP/d$w.json" "$TMP/docs.jsonl" >/dev/null 2>"$TMP/ingest.time"
  wait "${pids[@]}" || true
  R=$(rate "$TMP/d$w.json")
  printf '%d workers: %s docs/s (%.2fx in-process); peak RSS ingest %s, worker %s, indexer %s\n' \
    "$w" "$R" "$(python3 -c "print($R/$LOCAL)")" "$(peak "$TMP/ingest.time")" \
    "$(peak "$TMP/worker-1.time")" "$(peak "$TMP/indexer.time")"
  kill "$npid"; wait "$npid" 2>/dev/null || true
done
