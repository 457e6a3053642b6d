#!/usr/bin/env bash
# A SQL table as a source, measured: the MDN pages (../shared/data/mdn) as rows of a SQLite
# table, ingested with embedding deferred (what the connector and the index cost, not the
# model), then ingested again with nothing changed, with and without `updated=` (a pass that
# reads ids and versions only, against one that reads and hashes every row's text), and the
# same pages as files for comparison. Prints one line per pass: seconds, rows/s, counts.
#
#   scripts/bench-tables.sh [ROWS]        (default: every MDN page)
#
# The release binary (cargo build --release) is used; RAGLINE_BIN overrides it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
ROWS=${1:-0}
DATA=${RAGLINE_DATA_DIR:-$ROOT/../shared/data}
BIN=${RAGLINE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ragline}
[ -x "$BIN" ] || cargo build --release --quiet
[ -f models/all-MiniLM-L6-v2/model.safetensors ] || scripts/fetch-model.sh >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/files"
python3 - "$DATA/mdn" "$tmp/pages.db" "$tmp/files" "$ROWS" <<'EOF'
import os, sqlite3, sys
src, db, files, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs if f.endswith(".md"))
if limit:
    paths = paths[:limit]
c = sqlite3.connect(db)
c.execute("CREATE TABLE pages (id integer PRIMARY KEY, path text, body text, updated_at integer)")
for i, p in enumerate(paths):
    body = open(p, encoding="utf-8", errors="replace").read()
    c.execute("INSERT INTO pages VALUES (?, ?, ?, 1)", (i, os.path.relpath(p, src), body))
    with open(os.path.join(files, f"{i}.md"), "w", encoding="utf-8") as out:
        out.write(body)
c.commit()
print(f"{len(paths)} pages, {os.path.getsize(db) >> 20} MB of SQLite", file=sys.stderr)
EOF
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores" >&2
pass() {
  local label=$1 index=$2 source=$3
  local start end
  start=$(date +%s.%N)
  "$BIN" ingest --progress none --device cpu --defer embed --model models/all-MiniLM-L6-v2 \
    --index "sqlite://$tmp/$index.db" --report "$tmp/r.json" "$source" >/dev/null 2>&1 || true
  end=$(date +%s.%N)
  python3 - "$label" "$start" "$end" "$tmp/r.json" <<'EOF'
import json, sys
label, start, end, report = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
r = json.load(open(report))
c = r["counts"]
secs = end - start
print(f"{label:<44} {secs:7.2f} s  {c['published'] / secs:8.0f} docs/s  "
      f"indexed {c['indexed']} (unchanged {c['unchanged']}), chunks {c['children_created']}")
EOF
}
table="sqlite://$tmp/pages.db?table=pages&text=body&title=path&format=markdown"
pass "table, first run" t1 "$table"
pass "table, nothing changed (every row read)" t1 "$table"
pass "table updated=, first run" t2 "$table&updated=updated_at"
pass "table updated=, nothing changed (versions)" t2 "$table&updated=updated_at"
pass "files, first run" f1 "$tmp/files"
pass "files, nothing changed" f1 "$tmp/files"
