#!/usr/bin/env bash
# The embedded index's ANN at N chunks, side by side: ragline's HNSW (each dtype; f16 with its
# recall/latency curve over ef), the sqlite-vec brute-force scan it replaces, and the peers from
# PyPI on the same vectors at matched recall@10 (BENCH_ANN_TARGET, default 0.98): FAISS HNSW
# (flat and 8-bit), hnswlib and usearch's own package, each in its own process; then the
# ratios. (BENCH_ANN_PG=1) adds pgvector HNSW on the test server. 1,000 queries each.
#
#   scripts/bench-ann.sh [N=1000000] [QUERIES=1000]
#
# The vectors are drawn `--like` real ones: MiniLM vectors of MDN paragraphs (made once with
# `ragline embed` and kept in .bench/ann/; BENCH_ANN_BASE paragraphs, default 30,000, about
# 12 minutes on 2 cores), each plus Gaussian noise and re-normalised; uniform random vectors
# are reported too, for what they are. Per engine: build seconds, files MB, peak RSS,
# p50/p99 ms and recall@10 against the exact scan. Needs the release binary
# (cargo build --release) and ../shared/data/mdn (RAGLINE_DATA_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}
Q=${2:-1000}
TARGET=${BENCH_ANN_TARGET:-0.98}
BIN=${RAGLINE_BIN:-${CARGO_TARGET_DIR:-target}/release/ragline}
DATA=${RAGLINE_DATA_DIR:-../shared/data}
WORK=.bench/ann
BASE=${BENCH_ANN_BASE:-30000}
mkdir -p "$WORK"

CACHE=${RAGLINE_CACHE:-$HOME/.cache/ragline}
VENV=$CACHE/venv-ann
PINS="faiss-cpu==1.15.1 numpy==2.4.6 hnswlib==0.8.0 usearch==2.26.6"
if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV" >&2; fi
if [ "$(cat "$VENV/.ragline-pins" 2>/dev/null || true)" != "$PINS" ]; then
  # shellcheck disable=SC2086  # PINS is a list of words
  "$VENV/bin/pip" install --quiet --disable-pip-version-check $PINS >&2
  echo "$PINS" >"$VENV/.ragline-pins"
fi
PY=$VENV/bin/python

LIKE=$WORK/mdn-minilm-$BASE.npy
if [ ! -s "$LIKE" ]; then
  echo "embedding $BASE MDN paragraphs for the base vectors (once)" >&2
  "$PY" - "$DATA/mdn" "$BASE" >"$WORK/paras.jsonl" <<'PYEOF'
import json, os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
paras = []
for dp, dn, fn in sorted(os.walk(root)):
    dn.sort()
    for f in sorted(fn):
        if f.endswith(".md"):
            for p in open(os.path.join(dp, f), encoding="utf-8", errors="replace").read().split("\n\n"):
                p = p.strip()
                if len(p) >= 200 and not p.startswith(("```", "|", "---", "{{")):
                    paras.append(p[:1500])
random.Random(1).shuffle(paras)
for p in paras[:n]:
    print(json.dumps({"text": p}))
PYEOF
  "$BIN" embed -i "$WORK/paras.jsonl" -o "$LIKE.tmp.npy" >&2
  mv "$LIKE.tmp.npy" "$LIKE"
fi

echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(grep -o -m1 'avx512f' /proc/cpuinfo || echo 'no avx512'); $(date -u +%F)"
echo "== $N chunks x 384 drawn like $LIKE, $Q queries; matched recall@10 >= $TARGET"
row() { "$PY" scripts/bench-ann.py row "$1"; }  # label; a bench --json report on stdin
SWEEP=16,24,32,48,64,96,128,192,256,384,512
last=""
for dtype in f16 int8 binary; do
  rm -rf "$WORK/ann.db" "$WORK/ann.db-"* "$WORK/ann.db.ann"
  sweep=""
  [ "$dtype" = f16 ] && sweep="--ef $SWEEP"
  # shellcheck disable=SC2086  # sweep is a flag and its value, or nothing
  out=$("$BIN" bench --write "sqlite://$WORK/ann.db" --chunks "$N" --like "$LIKE" --queries "$Q" \
        --ann hnsw --ann-dtype "$dtype" $sweep --json)
  echo "$out" | row "ragline ANN $dtype"
  if [ "$dtype" = f16 ]; then
    last=$out
    "$PY" scripts/bench-ann.py extract "$WORK/ann.db" "$LIKE" "$Q" "$WORK/peer" >/dev/null
  fi
done
# sqlite-vec brute force: the same rows without an ANN (recall 1 by definition).
rm -rf "$WORK/ann.db" "$WORK/ann.db-"* "$WORK/ann.db.ann"
"$BIN" bench --write "sqlite://$WORK/ann.db" --chunks "$N" --like "$LIKE" --queries "$((Q < 100 ? Q : 100))" \
  --ann none --json | row "sqlite-vec brute force"
rm -rf "$WORK/ann.db" "$WORK/ann.db-"* "$WORK/ann.db.ann"
# Uniform random vectors: no structure (the ANN's worst case), reported for what they are.
"$BIN" bench --write "sqlite://$WORK/ann.db" --chunks "$N" --queries "$Q" --ann hnsw --json \
  | row "ragline ANN f16, uniform"
rm -rf "$WORK/ann.db" "$WORK/ann.db-"* "$WORK/ann.db.ann"

# The peers, each in its own process (its own peak RSS), on the same vectors and queries.
echo "== peers at recall@10 >= $TARGET (build on 2 threads, one query at a time on 1 thread)"
echo "$last" >"$WORK/ragline.json"
: >"$WORK/peers.jsonl"
for engine in faiss_flat faiss_sq8 hnswlib usearch_f16 usearch_f32; do
  "$PY" scripts/bench-ann.py engine "$engine" "$WORK/peer" "$TARGET" | tee -a "$WORK/peers.jsonl" \
    | "$PY" scripts/bench-ann.py peer-row
done
"$PY" scripts/bench-ann.py ratios "$WORK/ragline.json" "$WORK/peers.jsonl" "$TARGET"

if [ "${BENCH_ANN_PG:-0}" = 1 ]; then
  URL=$(scripts/postgres.sh start)
  scripts/postgres.sh psql -qtAc "DROP SCHEMA IF EXISTS bench_ann CASCADE" >/dev/null
  "$BIN" bench --write "$URL?schema=bench_ann" --chunks "$N" --like "$LIKE" --queries "$Q" --json \
    | row "pgvector HNSW"
  scripts/postgres.sh psql -qtAc "DROP SCHEMA IF EXISTS bench_ann CASCADE" >/dev/null
fi
