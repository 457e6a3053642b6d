#!/usr/bin/env bash
# The Kafka source against a plain consumer of the same topic: N small JSON documents (default
# 100,000, ~12 words each) on a 6-partition topic of the broker scripts/kafka.sh runs, read
# (1) by a plain consumer, confluent-kafka (librdkafka's Python client) parsing each value with
# json.loads, and (2) by `ragline ingest kafka://... --index null: --no-chunk` (the connector,
# the publisher, the workers' stages and the indexer; no model), each from the start of the
# topic with a group of its own, alternately, ROUNDS times (default 3); then (3) the connector
# alone (benches/sources.rs: records to documents on a work queue a thread empties), and (4)
# the same documents from a JSONL file through the same run as (2): what the rest of a run
# carries. Prints each pass in documents/s, the medians and the ratios to the plain consumer.
#
#   scripts/bench-kafka.sh [N] [ROUNDS]
#
# The release binary (cargo build --release) is used; RAGLINE_BIN overrides it. Both run on
# the same machine as the broker, which takes its share of the cores.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
N=${1:-100000}
ROUNDS=${2:-3}
BIN=${RAGLINE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ragline}
[ -x "$BIN" ] || cargo build --release --quiet
B=$(scripts/kafka.sh start | tail -1)
PY=$(scripts/data-venv.sh)
T=bench-$(date +%s)-$$
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" scripts/kafka-records.py create "$B" "$T" 6
"$PY" scripts/kafka-records.py produce "$B" "$T" --count "$N"
plain=() ours=()
for r in $(seq 1 "$ROUNDS"); do
  p=$("$PY" scripts/kafka-records.py plain-consumer "$B" "$T" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["per_second"])')
  "$BIN" ingest "kafka://$B/$T?group=bench-$r-$$" --index null: --no-chunk --progress none \
    --report "$tmp/r.json" >/dev/null 2>&1
  o=$("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); c=r["counts"]; assert c["indexed"]==int(sys.argv[2]), c; print(round(r["documents_per_sec"],1))' "$tmp/r.json" "$N")
  echo "round $r: plain consumer $p docs/s, ragline ingest $o docs/s"
  plain+=("$p") ours+=("$o")
done
# (3) The connector alone, under criterion (the release profile's build).
RAGLINE_BENCH_KAFKA=$B RAGLINE_BENCH_KAFKA_TOPIC=$T RAGLINE_BENCH_KAFKA_RECORDS=$N \
  cargo bench --quiet --bench sources -- --noplot >"$tmp/criterion.txt" 2>&1 || { cat "$tmp/criterion.txt"; exit 1; }
alone=$("$PY" - "$tmp/criterion.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"thrpt:\s*\[\s*\S+ \S+\s+(\S+) (\S+)", text)
scale = {"elem/s": 1, "Kelem/s": 1e3, "Melem/s": 1e6}[m.group(2)]
print(round(float(m.group(1)) * scale, 1))
PY
)
echo "connector alone (criterion median): $alone docs/s"
# (4) The same documents from a JSONL file.
"$PY" - "$tmp/docs.jsonl" "$N" <<'PY'
import json, sys
sys.path.insert(0, "scripts")
from importlib import import_module
k = import_module("kafka-records")
with open(sys.argv[1], "w") as f:
    for n in range(int(sys.argv[2])):
        f.write(json.dumps({"id": f"doc-{n}", "text": k.text_of(n, 1, 12), "title": f"Doc {n}",
                            "n": n, "version": 1}) + "\n")
PY
files=()
for r in $(seq 1 "$ROUNDS"); do
  "$BIN" ingest "$tmp/docs.jsonl" --index null: --no-chunk --progress none --report "$tmp/f.json" >/dev/null 2>&1 || true
  files+=("$("$PY" -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["documents_per_sec"],1))' "$tmp/f.json")")
done
echo "jsonl file through the same run: ${files[*]} docs/s"
"$PY" - "${plain[*]}" "${ours[*]}" "$alone" "${files[*]}" <<'PY'
import statistics, sys
p, o, a, f = (statistics.median(map(float, x.split())) for x in sys.argv[1:5])
print(f"median docs/s: plain consumer {p:,.0f}; ragline connector alone {a:,.0f} ({a / p:.2f}x); "
      f"ragline ingest kafka -> null: {o:,.0f} ({o / p:.2f}x); the same from a JSONL file {f:,.0f} "
      f"({f / p:.2f}x)")
PY
