#!/usr/bin/env bash
# The CPU kernel paths and precisions, release build (BENCHMARKS.md, "CPU kernels"):
#   1. roofline: `ragline bench` (600 react-docs chunks) per kernel path and dtype this CPU
#      runs: tokens/s, the encoder's GFLOP/s and the measured FMA peak;
#   2. quality: the 230 parity texts' lowest and mean cosine to sentence-transformers per
#      dtype, and SciFact (BEIR, 5,183 documents, 300 queries) vector nDCG@10 per dtype;
#   3. `ragline ingest` of react-docs against `ragline embed` of the same chunks (tokens/s).
# The side-by-side ratios against sentence-transformers come from scripts/bench-peers.sh
# (DTYPE=bf16|int8 for the low precisions).
#
#   scripts/bench-cpu-kernels.sh [roofline|quality|ingest|all]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
R=$ROOT/target/release/ragline
MODEL=${MODEL:-$ROOT/models/all-MiniLM-L6-v2}
DATA=${RAGLINE_DATA_DIR:-$ROOT/../shared/data}
PYTHON=${PYTHON:-python3}
WHAT=${1:-all}
[ -x "$R" ] || cargo build --release --quiet
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
grep -m1 "model name" /proc/cpuinfo || true

paths() { for p in avx512 avx2 portable; do RAGLINE_CPU_KERNELS=$p "$R" bench --device cpu --model "$MODEL" --chunks 1 --json >/dev/null 2>&1 && echo $p; done; }

if [ "$WHAT" = roofline ] || [ "$WHAT" = all ]; then
  echo "== roofline (ragline bench, 600 chunks of its built-in page)"
  for p in $(paths); do
    for d in f32 bf16 int8; do
      out=$(RAGLINE_CPU_KERNELS=$p "$R" bench --device cpu --dtype $d --model "$MODEL" --chunks 600 --json 2>/dev/null) || continue
      echo "$out" | "$PYTHON" -c "import json,sys; r=json.load(sys.stdin); print(f\"{'$p':>9} {r['dtype']:>5}: {r['tokens_per_s']:7.0f} tokens/s, encoder {r.get('gflops',0):5.0f} GFLOP/s, FMA peak {r.get('peak_gflops') or float('nan'):5.0f} GFLOP/s\")"
    done
  done
fi

if [ "$WHAT" = quality ] || [ "$WHAT" = all ]; then
  echo "== parity (230 texts, cosine to sentence-transformers f32)"
  for d in f32 bf16 int8; do
    "$R" embed --device cpu --dtype $d --model "$MODEL" --input tests/fixtures/parity/texts.jsonl --output "$W/p-$d.npy" 2>/dev/null || { echo "$d: not on this CPU"; continue; }
    "$PYTHON" - "$W/p-$d.npy" tests/fixtures/parity/reference.npy $d <<'PY'
import sys, numpy as np
v, r = np.load(sys.argv[1]), np.load(sys.argv[2])
c = (v * r).sum(1) / np.linalg.norm(v, axis=1) / np.linalg.norm(r, axis=1)
print(f"{sys.argv[3]:>5}: lowest cosine {c.min():.6f}, mean {c.mean():.6f}")
PY
  done
  echo "== SciFact vector nDCG@10 (--truncate, as sentence-transformers embeds)"
  for d in f32 bf16 int8; do
    /usr/bin/time -f "%e s" -o "$W/t" "$R" eval --truncate --device cpu --dtype $d --modes vector --model "$MODEL" \
      --corpus "$DATA/scifact/corpus.jsonl" --queries "$DATA/scifact/queries.jsonl" \
      --qrels "$DATA/scifact/qrels/test.tsv" --index "sqlite://$W/s-$d.db" --json 2>/dev/null \
      | "$PYTHON" -c "import json,sys; r=json.load(sys.stdin)[0]; print(f\"{'$d':>5}: nDCG@10 {r['ndcg_at_10']:.5f}, recall@100 {r['recall_at_100']:.5f}\", end='')" || { echo "$d: not on this CPU"; continue; }
    echo " ($(cat "$W/t") with the ingest)"
  done
fi

if [ "$WHAT" = ingest ] || [ "$WHAT" = all ]; then
  echo "== ingest vs embed on react-docs"
  "$R" ingest "$DATA/react-docs" --device cpu --model "$MODEL" --index "sqlite://$W/i.db" 2>/dev/null | grep -E "chunks:"
  "$PYTHON" - "$W/i.db" "$W/chunks.jsonl" <<'PY'
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
cols = [r[1] for r in db.execute("pragma table_info(chunks)")]
with open(sys.argv[2], "w") as f:
    for (text,) in db.execute("select text from chunks where replaced_by is null" if "replaced_by" in cols else "select text from chunks"):
        f.write(json.dumps({"text": text}) + "\n")
PY
  "$R" embed --device cpu --model "$MODEL" --input "$W/chunks.jsonl" --output "$W/c.npy" 2>&1 | tail -1
fi
