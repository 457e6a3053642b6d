#!/usr/bin/env bash
# Bulk writes into PostgreSQL + pgvector, side by side on one server: ragline's indexer path
# (`ragline bench --write`: binary COPY into a staging table, then INSERT ... ON CONFLICT, one
# transaction per batch of 1,024, the tsvector made by ragline) against psycopg's binary COPY
# straight into the table (scripts/bench-postgres.py: the tsvector made by the server, and a
# floor without full text), same rows, same table layout, no HNSW index during the load.
# Then search latency with HNSW at the sizes given.
#
#   scripts/bench-postgres.sh [CHUNKS=200000] [SEARCH_SIZES="100000 1000000"]
#
# Needs the release binary (cargo build --release) and starts the test server
# (scripts/postgres.sh). Prints the figures and the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}
SIZES=${2:-"100000 1000000"}
BIN=${RAGLINE_BIN:-${CARGO_TARGET_DIR:-target}/release/ragline}
URL=$(scripts/postgres.sh start)
PY=$(scripts/data-venv.sh)
psql() { PGOPTIONS="-c client_min_messages=warning" scripts/postgres.sh psql -qtAc "$1" >/dev/null; }

echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
psql "DROP SCHEMA IF EXISTS bench_like CASCADE; DROP SCHEMA IF EXISTS bench_ragline CASCADE"
# An empty table of ragline's layout for the reference to copy.
"$BIN" bench --write "$URL?schema=bench_like" --chunks 10 --json >/dev/null

ref=$("$PY" scripts/bench-postgres.py "$URL" bench_like "$N" server)
echo "psycopg binary COPY, tsvector by the server:  $ref"
floor=$("$PY" scripts/bench-postgres.py "$URL" bench_like "$N" none)
echo "psycopg binary COPY, no full text (floor):    $floor"
best=0
for w in 1 2; do
  psql "DROP SCHEMA IF EXISTS bench_ragline CASCADE"
  out=$("$BIN" bench --write "$URL?schema=bench_ragline" --chunks "$N" --writers "$w" --json)
  # The load (HNSW and GIN indexes built after it), the GIN build, and the two together.
  summary=$(echo "$out" | "$PY" -c '
import json, re, sys
r = json.load(sys.stdin)
gin = next((float(m.group(1)) for n in r["notes"] for m in [re.search(r"keyword \(GIN\) index in ([0-9.]+)s", n)] if m), 0.0)
hnsw = next((float(m.group(1)) for n in r["notes"] for m in [re.search(r"HNSW index over [0-9]+ vectors in ([0-9.]+)s", n)] if m), 0.0)
print(round(r["chunks_per_s"]), json.dumps({"chunks_per_s": round(r["chunks_per_s"]), "gin_build_s": gin,
      "chunks_per_s_with_gin": round(r["chunks"] / (r["seconds"] + gin)), "hnsw_build_s": hnsw}))')
  rate=${summary%% *}
  echo "ragline, $w writer(s):                         ${summary#* }"
  best=$(( rate > best ? rate : best ))
done
refrate=$(echo "$ref" | "$PY" -c 'import json,sys; print(round(json.load(sys.stdin)["chunks_per_s"]))')
"$PY" -c "print(f'ratio ragline / psycopg: {$best / $refrate:.2f}x ($best vs $refrate chunks/s)')"
psql "DROP SCHEMA IF EXISTS bench_ragline CASCADE; DROP SCHEMA IF EXISTS bench_like CASCADE"

for n in $SIZES; do
  psql "DROP SCHEMA IF EXISTS bench_search CASCADE"
  out=$("$BIN" bench --write "$URL?schema=bench_search" --chunks "$n" --queries 1000 --json)
  echo "search at $n chunks: $(echo "$out" | "$PY" -c 'import json,sys; r=json.load(sys.stdin); s=r["search"]; print(json.dumps({"load_chunks_per_s": round(r["chunks_per_s"]), "hnsw_build_s": round(r["finish_seconds"],1), **{k: round(v,2) for k,v in s.items() if k.endswith("ms")}}))')"
done
psql "DROP SCHEMA IF EXISTS bench_search CASCADE"
