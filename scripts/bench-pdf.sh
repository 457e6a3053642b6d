#!/usr/bin/env bash
# ragline's PDF extraction beside pypdfium2 and pypdf on the same files, one core each: pages/s
# and word F1 of ragline's text against pypdfium2's, per file (a markdown table).
#
#   scripts/bench-pdf.sh [PATH...]       default: target/doc-corpus/pdf tests/fixtures/docs
#
# Fetch the corpus first with scripts/fetch-doc-corpus.sh. Builds ragline (release) unless
# RAGLINE names a binary. Results and dumps go to target/bench-pdf/.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
[ $# -gt 0 ] || set -- target/doc-corpus/pdf tests/fixtures/docs
OUT=target/bench-pdf
mkdir -p "$OUT"
if [ -z "${RAGLINE:-}" ]; then
  cargo build --release --quiet
  RAGLINE=${CARGO_TARGET_DIR:-target}/release/ragline
fi
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')" >&2
scripts/bench-pdf-peers.sh "$@" --json --dump "$OUT/pdfium" > "$OUT/peers.json"
# The same files, in the peers' order.
python3 -c 'import json,sys; [print(f["file"]) for f in json.load(open(sys.argv[1]))["files"]]' \
  "$OUT/peers.json" | tr '\n' '\0' | xargs -0 "$RAGLINE" extract --json > "$OUT/ragline.jsonl" || true
python3 scripts/bench-pdf.py --peers "$OUT/peers.json" --ragline "$OUT/ragline.jsonl" "${@:0:0}"
