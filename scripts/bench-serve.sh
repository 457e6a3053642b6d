#!/usr/bin/env bash
# `ragline serve` under load, against `ragline embed` on the same texts (and, when a Python with
# sentence-transformers is given, against sentence-transformers behind a minimal HTTP server,
# under the same load), in one run:
#
#   [PYTHON_ST=/path/to/venv/bin/python] scripts/bench-serve.sh [CLIENTS] [SECONDS]
#
# 1. `ragline embed` on the 2,000 benchmark passages (scripts/bench-passages.py): tokens/s.
# 2. `ragline serve`, CLIENTS clients (default 64) for SECONDS (default 60), each sending one
#    text or a batch of 8-64 (scripts/bench-serve-load.py): tokens/s by the server's count,
#    latency p50/p99, the server's peak RSS; the ratio to `ragline embed`.
# 3. Overload: 4x the clients on a queue limited to 8 forward passes: how many 503s, and the
#    peak RSS (bounded: the queue refuses instead of growing).
# 4. With PYTHON_ST: scripts/st-server.py under the load of step 2.
#
# Needs a release build (cargo build --release) and the model (scripts/fetch-model.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CLIENTS=${1:-64}
SECONDS_=${2:-60}
BIN=${RAGLINE:-${CARGO_TARGET_DIR:-target}/release/ragline}
MODEL=${MODEL:-$ROOT/models/all-MiniLM-L6-v2}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
OUT=$ROOT/target/bench-serve
mkdir -p "$OUT"
TEXTS=$ROOT/target/bench-peers/passages.jsonl
mkdir -p "$(dirname "$TEXTS")"
[ -s "$TEXTS" ] || python3 scripts/bench-passages.py "$TEXTS"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; $(date -u +%F)"
"$BIN" embed --model "$MODEL" --device cpu --input "$TEXTS" --output "$OUT/embed.npy" \
  2>"$OUT/embed.log" >/dev/null
EMBED=$(sed -n 's/.* \([0-9]*\) tokens\/s.*/\1/p' "$OUT/embed.log" | tail -1)
echo "ragline embed: $EMBED tokens/s ($(tail -1 "$OUT/embed.log"))"

peak() { sed -n 's/^VmHWM: *//p' "/proc/$1/status"; }

serve() { # serve PORT EXTRA... ; prints the pid
  local port=$1; shift
  "$BIN" serve --model "$MODEL" --device cpu --port "$port" "$@" >"$OUT/serve-$port.out" \
    2>"$OUT/serve-$port.log" &
  local pid=$!
  for _ in $(seq 1 300); do
    grep -q listening "$OUT/serve-$port.out" 2>/dev/null && break
    sleep 0.1
  done
  echo "$pid"
}

PORT=18181
PID=$(serve $PORT)
python3 scripts/bench-serve-load.py "http://127.0.0.1:$PORT" "$TEXTS" --clients 4 --seconds 5 \
  >/dev/null # warm-up
python3 scripts/bench-serve-load.py "http://127.0.0.1:$PORT" "$TEXTS" --clients "$CLIENTS" \
  --seconds "$SECONDS_" >"$OUT/serve.json"
RSS=$(peak "$PID")
kill "$PID"; wait "$PID" 2>/dev/null || true
python3 - "$OUT/serve.json" "$EMBED" "$RSS" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); embed = float(sys.argv[2])
print(f"ragline serve, {r['clients']} clients, {r['seconds']}s: {r['tokens_per_sec']} tokens/s "
      f"({r['tokens_per_sec'] / embed:.2f}x ragline embed), {r['requests']} requests, "
      f"{r['inputs_per_sec']} inputs/s, p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
      f"{r['overloaded']} x 503, {r['errors']} errors; peak RSS {sys.argv[3]}")
PY

PORT=18182
PID=$(serve $PORT --max-queued-tokens 16384)
python3 scripts/bench-serve-load.py "http://127.0.0.1:$PORT" "$TEXTS" \
  --clients $((CLIENTS * 4)) --seconds 20 >"$OUT/overload.json"
RSS=$(peak "$PID")
kill "$PID"; wait "$PID" 2>/dev/null || true
python3 - "$OUT/overload.json" "$RSS" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"overload ({r['clients']} clients, queue of 16,384 tokens): {r['overloaded']} x 503 with "
      f"Retry-After, {r['requests']} answered, {r['errors']} errors, p99 {r['p99_ms']} ms; "
      f"peak RSS {sys.argv[2]}")
PY

if [ -n "${PYTHON_ST:-}" ]; then
  "$PYTHON_ST" scripts/st-server.py "$MODEL" --port 18183 >"$OUT/st.out" 2>"$OUT/st.log" &
  SPID=$!
  for _ in $(seq 1 600); do grep -q listening "$OUT/st.out" 2>/dev/null && break; sleep 0.1; done
  python3 scripts/bench-serve-load.py "http://127.0.0.1:18183" "$TEXTS" --clients 4 \
    --seconds 5 >/dev/null
  python3 scripts/bench-serve-load.py "http://127.0.0.1:18183" "$TEXTS" --clients "$CLIENTS" \
    --seconds "$SECONDS_" >"$OUT/st.json"
  RSS=$(peak "$SPID")
  kill "$SPID"; wait "$SPID" 2>/dev/null || true
  python3 - "$OUT/st.json" "$OUT/serve.json" "$RSS" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); s = json.load(open(sys.argv[2]))
print(f"sentence-transformers behind a minimal HTTP server, same load: {r['tokens_per_sec']} "
      f"tokens/s, p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, {r['errors']} errors; peak RSS "
      f"{sys.argv[3]}; ragline serve / it: {s['tokens_per_sec'] / max(r['tokens_per_sec'], 1):.2f}x")
PY
fi
