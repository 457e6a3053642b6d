#!/usr/bin/env bash
# An object store as a source, measured against `aws s3 sync` of the same bucket: the MDN
# pages (../shared/data/mdn) as objects of a bucket on the moto S3 server (scripts/s3.sh),
# ingested with embedding deferred (listing, downloads, extraction, chunking and the index, not
# the model), then again with nothing changed; and `aws s3 sync` (awscli, installed into the
# server's virtualenv) of the same prefix into a folder, twice. Prints one line per pass and
# the ratios.
#
#   scripts/bench-objects.sh [OBJECTS]     (default: every MDN page)
#
# The release binary (cargo build --release) is used; RAGLINE_BIN overrides it. moto is a
# Python server: it bounds both tools alike, so the ratios say more than the rates.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
N=${1:-0}
DATA=${RAGLINE_DATA_DIR:-$ROOT/../shared/data}
BIN=${RAGLINE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ragline}
[ -x "$BIN" ] || cargo build --release --quiet
[ -f models/all-MiniLM-L6-v2/model.safetensors ] || scripts/fetch-model.sh >&2
EP=$(scripts/s3.sh start)
PY=$(scripts/s3.sh python)
VENV_BIN=$(dirname "$PY")
[ -x "$VENV_BIN/aws" ] || "$VENV_BIN/pip" install -q --disable-pip-version-check "awscli==1.44.18" >&2 \
  || "$VENV_BIN/pip" install -q --disable-pip-version-check awscli >&2
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1
export AWS_DEFAULT_REGION=us-east-1
BUCKET=bench-objects-$$
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" - "$EP" "$BUCKET" "$DATA/mdn" "$N" <<'EOF'
import os, sys, boto3
from concurrent.futures import ThreadPoolExecutor
ep, bucket, src, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
s3 = boto3.client("s3", endpoint_url=ep)
s3.create_bucket(Bucket=bucket)
paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs if f.endswith(".md"))
if limit:
    paths = paths[:limit]
def put(p):
    with open(p, "rb") as f:
        s3.put_object(Bucket=bucket, Key="mdn/" + os.path.relpath(p, src), Body=f.read(),
                      ContentType="text/markdown")
with ThreadPoolExecutor(16) as pool:
    list(pool.map(put, paths))
size = sum(os.path.getsize(p) for p in paths)
print(f"{len(paths)} objects, {size / 1e6:.1f} MB uploaded to s3://{bucket}/mdn/", file=sys.stderr)
EOF
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores" >&2
OBJECTS=$("$PY" -c "import boto3,sys; p=boto3.client('s3',endpoint_url='$EP').get_paginator('list_objects_v2'); print(sum(len(x.get('Contents',[])) for x in p.paginate(Bucket='$BUCKET')))")

declare -A SECS
timed() {
  local label=$1
  shift
  local start end
  start=$(date +%s.%N)
  "$@"
  end=$(date +%s.%N)
  SECS[$label]=$(echo "$end - $start" | bc)
}
line() {
  printf '%-46s %7.2f s  %7.0f objects/s  %s\n' "$1" "${SECS[$1]}" "$(echo "$OBJECTS / ${SECS[$1]}" | bc -l)" "$2"
}
ingest() {
  "$BIN" ingest --progress none --device cpu --defer embed --model models/all-MiniLM-L6-v2 \
    --index "sqlite://$tmp/index.db" --report "$tmp/r.json" \
    "s3://$BUCKET/mdn/?endpoint=$EP" >/dev/null 2>&1 || true
}
counts() {
  python3 -c "import json; r = json.load(open('$tmp/r.json')); c = r['counts']; f = r.get('fetched', {}); print(f\"indexed {c['indexed']} (unchanged {c['unchanged']}), downloaded {f.get('items')}\")"
}
sync() {
  "$VENV_BIN/aws" --endpoint-url "$EP" s3 sync --only-show-errors "s3://$BUCKET/mdn/" "$tmp/mirror/"
}
timed "ragline ingest --defer embed, first run" ingest
line "ragline ingest --defer embed, first run" "$(counts)"
timed "ragline ingest, nothing changed" ingest
line "ragline ingest, nothing changed" "$(counts)"
timed "aws s3 sync, first run" sync
line "aws s3 sync, first run" "$(find "$tmp/mirror" -type f | wc -l) files"
timed "aws s3 sync, nothing changed" sync
line "aws s3 sync, nothing changed" "$(find "$tmp/mirror" -type f | wc -l) files"
printf 'ratio, first run (aws s3 sync time / ragline time): %.2fx\n' \
  "$(echo "${SECS[aws s3 sync, first run]} / ${SECS[ragline ingest --defer embed, first run]}" | bc -l)"
printf 'ratio, nothing changed: %.2fx\n' \
  "$(echo "${SECS[aws s3 sync, nothing changed]} / ${SECS[ragline ingest, nothing changed]}" | bc -l)"
"$PY" -c "import boto3; b=boto3.resource('s3',endpoint_url='$EP').Bucket('$BUCKET'); b.objects.all().delete(); b.delete()"
