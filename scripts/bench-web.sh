#!/usr/bin/env bash
# A web site as a source, measured against `wget --mirror` of the same site: the MDN pages
# (../shared/data/mdn) as HTML pages under /docs/ of a local HTTP server (Python's threading
# http.server), each page linking to its neighbours, an index linking to every page; crawled by
# ragline with embedding deferred (requests, link extraction, HTML extraction, chunking and the
# index; not the model), then again with nothing changed; and mirrored by wget, twice (the
# second with its timestamping, -N, as --mirror does). Both send one request at a time. Prints
# one line per pass and the ratios.
#
#   scripts/bench-web.sh [PAGES]     (default 2000)
#
# The release binary (cargo build --release) is used; RAGLINE_BIN overrides it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
N=${1:-2000}
DATA=${RAGLINE_DATA_DIR:-$ROOT/../shared/data}
BIN=${RAGLINE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ragline}
[ -x "$BIN" ] || cargo build --release --quiet
[ -f models/all-MiniLM-L6-v2/model.safetensors ] || scripts/fetch-model.sh >&2
command -v wget >/dev/null || { echo "wget is needed (apt-get install wget)" >&2; exit 1; }
tmp=$(mktemp -d)
server=""
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$tmp"' EXIT
python3 - "$DATA/mdn" "$tmp/site/docs" "$N" <<'EOF'
import html, os, sys
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs if f.endswith(".md"))[:n]
os.makedirs(out, exist_ok=True)
def name(i): return f"p{i}.html"
size = 0
for i, p in enumerate(paths):
    text = open(p, encoding="utf-8", errors="replace").read()
    paras = "".join(f"<p>{html.escape(b.strip())}</p>" for b in text.split("\n\n") if b.strip())
    near = "".join(f'<a href="{name(j)}">page {j}</a> ' for j in (i - 1, i + 1, i + 7) if 0 <= j < len(paths))
    page = (f"<!doctype html><html><head><title>{html.escape(os.path.relpath(p, src))}</title></head>"
            f"<body><nav>{near}</nav><main>{paras}</main></body></html>")
    with open(os.path.join(out, name(i)), "w", encoding="utf-8") as f:
        f.write(page)
    size += len(page.encode())
links = "".join(f'<li><a href="{name(i)}">{i}</a></li>' for i in range(len(paths)))
with open(os.path.join(out, "index.html"), "w") as f:
    f.write(f"<!doctype html><html><body><ul>{links}</ul></body></html>")
print(f"{len(paths)} pages, {size / 1e6:.1f} MB of HTML", file=sys.stderr)
EOF
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$tmp/site" && exec python3 -m http.server "$PORT" --bind 127.0.0.1 >/dev/null 2>&1) &
server=$!
for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$PORT/docs/index.html" >/dev/null && break; sleep 0.1; done
PAGES=$((N + 1))
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores" >&2

declare -A SECS
timed() {
  local label=$1 start end
  shift
  start=$(date +%s.%N)
  "$@"
  end=$(date +%s.%N)
  SECS[$label]=$(echo "$end - $start" | bc)
}
line() {
  printf '%-44s %7.2f s  %7.0f pages/s  %s\n' "$1" "${SECS[$1]}" \
    "$(echo "$PAGES / ${SECS[$1]}" | bc -l)" "$2"
}
crawl() {
  "$BIN" ingest --progress none --device cpu --defer embed --model models/all-MiniLM-L6-v2 \
    --index "sqlite://$tmp/index.db" --report "$tmp/r.json" --crawl-rps 100000 \
    --crawl-depth 3 --crawl-max-pages 1000000 ${RAGLINE_CRAWL_ARGS:-} "http://127.0.0.1:$PORT/docs/index.html" \
    >/dev/null 2>&1 || true
}
counts() {
  python3 -c "import json; r = json.load(open('$tmp/r.json')); c = r['counts']; f = r.get('fetched', {}); print(f\"indexed {c['indexed']} (unchanged {c['unchanged']}), downloaded {f.get('items')}, chunks made {c['children_created']}\")"
}
mirror() {
  (cd "$tmp" && wget --mirror --no-parent -q -e robots=on "http://127.0.0.1:$PORT/docs/index.html") || true
}
timed "ragline crawl --defer embed, first run" crawl
line "ragline crawl --defer embed, first run" "$(counts)"
timed "ragline crawl, nothing changed" crawl
line "ragline crawl, nothing changed" "$(counts)"
timed "wget --mirror, first run" mirror
line "wget --mirror, first run" "$(find "$tmp/127.0.0.1:$PORT" -type f | wc -l) files"
timed "wget --mirror, nothing changed" mirror
line "wget --mirror, nothing changed" "$(find "$tmp/127.0.0.1:$PORT" -type f | wc -l) files"
printf 'ratio, first run (wget time / ragline time): %.2fx\n' \
  "$(echo "${SECS[wget --mirror, first run]} / ${SECS[ragline crawl --defer embed, first run]}" | bc -l)"
printf 'ratio, nothing changed: %.2fx\n' \
  "$(echo "${SECS[wget --mirror, nothing changed]} / ${SECS[ragline crawl, nothing changed]}" | bc -l)"
