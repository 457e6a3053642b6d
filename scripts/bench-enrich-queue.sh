#!/usr/bin/env bash
# `enrich` through the broker against `enrich` claiming from the index: a corpus ingested with
# --defer embed into fresh indexes, then embedded by (1) one `enrich`, (2) one `enrich --queue`,
# (3) two `enrich --queue` processes at once; chunks/s of each, and a check that every chunk has
# its vector and every document is done.
#
#   scripts/bench-enrich-queue.sh [CORPUS]      (default: ../shared/data/react-docs)
#
# PG=postgres://... puts the indexes in Postgres schemas (default: SQLite files). BIN= names the
# binary (default: the release build). Starts its own nats-server (scripts/nats.sh bin).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CORPUS=${1:-$ROOT/../shared/data/react-docs}
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ragline}
MODEL=$ROOT/models/all-MiniLM-L6-v2
[ -x "$BIN" ] || { echo "build first: cargo build --release (or BIN=...)" >&2; exit 2; }
NATS_BIN=$("$ROOT/scripts/nats.sh" bin)
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$NATS_BIN" -js -a 127.0.0.1 -p "$PORT" -sd "$TMP/nats" >/dev/null 2>&1 &
Q=nats://127.0.0.1:$PORT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && break; sleep 0.1; done

echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; corpus $CORPUS"
index() {
  if [ -n "${PG:-}" ]; then echo "$PG?schema=bench_enrich_$1_$$"; else echo "sqlite://$TMP/$1.db"; fi
}
prepare() {
  "$BIN" ingest "$CORPUS" --index "$(index "$1")" --model "$MODEL" --device cpu --defer embed \
    --progress none >/dev/null
}
check() {
  "$BIN" status --index "$(index "$1")" --json > "$TMP/status.json"
  python3 - "$TMP/status.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
e, v = s["stages"]["embed"], s["vector_sets"][0]
ok = e["done"] + e["dead"] == s["documents"] and e["dead"] == 0 and v["embedded"] == s["chunks"]
print("  %d documents, done %d; %d chunks, with a vector %d -> %s"
      % (s["documents"], e["done"], s["chunks"], v["embedded"], "ok" if ok else "INCOMPLETE"))
sys.exit(0 if ok else 1)
PY
}
chunks_per_s() {
  python3 - "$@" <<'PY'
import json, sys
elapsed, chunks = float(sys.argv[1]), 0
for f in sys.argv[2:]:
    r = json.load(open(f))
    chunks += r["counts"]["children_indexed"]
print(f"  {chunks} chunks in {elapsed:.1f} s: {chunks / elapsed:.0f} chunks/s")
PY
}
now() { date +%s.%N; }
since() { python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$1" "$(now)"; }

echo "== enrich (claims from the index)"
prepare store
t0=$(now)
"$BIN" enrich --index "$(index store)" --device cpu --progress none --report "$TMP/store.json" >/dev/null
chunks_per_s "$(since "$t0")" "$TMP/store.json"
check store

echo "== enrich --queue, one process"
prepare queue1
t0=$(now)
"$BIN" enrich --index "$(index queue1)" --queue "$Q?prefix=b1" --device cpu --progress none \
  --report "$TMP/q1.json" >/dev/null
chunks_per_s "$(since "$t0")" "$TMP/q1.json"
check queue1

echo "== enrich --queue, two processes"
prepare queue2
t0=$(now)
"$BIN" enrich --index "$(index queue2)" --queue "$Q?prefix=b2" --device cpu --progress none \
  --report "$TMP/q2a.json" >/dev/null &
a=$!
"$BIN" enrich --index "$(index queue2)" --queue "$Q?prefix=b2" --device cpu --progress none \
  --report "$TMP/q2b.json" >/dev/null &
b=$!
wait $a $b
chunks_per_s "$(since "$t0")" "$TMP/q2a.json" "$TMP/q2b.json"
check queue2
