#!/usr/bin/env bash
# The lifecycle on a real corpus with the real model, release build (BENCHMARKS.md):
#   1. plain ingest, this binary against a baseline binary (the status bookkeeping's cost),
#      alternating, ROUNDS times each;
#   2. ingest --defer embed, then enrich killed with SIGKILL about half way, then enrich
#      again: the split, the work done twice, enrich's tokens/s, and search results against
#      the plain ingest's;
#   3. a model migration (backfill to a random 48-d BERT) under constant search, killed
#      and resumed.
#
#   scripts/bench-lifecycle.sh [CORPUS] [BASELINE_BINARY] [ROUNDS]
#
# CORPUS defaults to ../shared/data/react-docs; without BASELINE_BINARY step 1 times this
# binary alone. Work files go to $WORK (default: a temporary folder).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CORPUS=${1:-$ROOT/../shared/data/react-docs}
BASE=${2:-}
ROUNDS=${3:-2}
R=$ROOT/target/release/ragline
MODEL=$ROOT/models/all-MiniLM-L6-v2
WORK=${WORK:-$(mktemp -d)}
cd "$WORK"
[ -x "$R" ] || (cd "$ROOT" && cargo build --release --features test-hooks --quiet)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs"
echo "corpus: $CORPUS; work: $WORK"

secs() { /usr/bin/time -f %e "$@" 2>&1 >/dev/null | tail -1; }

echo "== 1. plain ingest"
for round in $(seq "$ROUNDS"); do
  for bin in ${BASE:+$BASE} "$R"; do
    rm -f plain.db*
    t=$(secs "$bin" ingest "$CORPUS" --index sqlite://plain.db --model "$MODEL" --device cpu --progress none)
    echo "round $round $(basename "$bin"): $t s"
  done
done
"$R" status --index sqlite://plain.db

echo "== 2. deferred ingest, enrich killed half way, enrich again"
rm -f deferred.db*
t=$(secs "$R" ingest "$CORPUS" --index sqlite://deferred.db --model "$MODEL" --device cpu --defer embed --progress none)
echo "ingest --defer embed: $t s"
chunks=$("$R" status --index sqlite://deferred.db --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["chunks"])')
RAGLINE_PROGRESS_EVERY_MS=200 "$R" enrich --index sqlite://deferred.db --device cpu --progress log 2> first.log &
pid=$!
while :; do
  sleep 2
  done_=$("$R" status --index sqlite://deferred.db --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["vector_sets"][0]["embedded"])')
  [ $((done_ * 2)) -ge "$chunks" ] && break
done
kill -9 $pid; wait $pid 2>/dev/null || true
echo "killed at $done_ of $chunks chunks embedded"
"$R" status --index sqlite://deferred.db
last=$(grep ' embedded ' first.log | tail -1)
first=$(echo "$last" | grep -o '[0-9]* embedded' | cut -d' ' -f1)
first_reused=$(echo "$last" | grep -o '[0-9]* reused' | cut -d' ' -f1)
"$R" enrich --index sqlite://deferred.db --device cpu --progress none --report second.json
python3 - "$first" "$first_reused" "$chunks" <<'PY'
import json, sys
first, first_reused, chunks = (int(x) for x in sys.argv[1:4])
r = json.load(open("second.json"))
second, second_reused = r["chunks_embedded"], r["chunks_reused"]
both = first + first_reused + second + second_reused
print(f"killed run (its last progress line): {first} embedded + {first_reused} reused; "
      f"second run: {second} embedded + {second_reused} reused; chunks: {chunks}")
print(f"vectors computed or copied by both runs: {both} = chunk count + {both - chunks} "
      f"({100 * (both - chunks) / chunks:.2f}% done twice); model computations: {first + second}")
print(f"second enrich: {r['tokens_per_sec']:.0f} tokens/s over {r['elapsed_secs']:.1f} s")
PY
for q in "how do I run code after render" "cleanup function when the component unmounts" "fetching data in an effect"; do
  a=$("$R" search "$q" --index sqlite://deferred.db --mode vector --json -k 5 --device cpu | python3 -c 'import json,sys; print([(h["id"], round(h["score"], 5)) for h in json.load(sys.stdin)])')
  b=$("$R" search "$q" --index sqlite://plain.db --mode vector --json -k 5 --device cpu | python3 -c 'import json,sys; print([(h["id"], round(h["score"], 5)) for h in json.load(sys.stdin)])')
  [ "$a" = "$b" ] && echo "same top 5: $q" || { echo "DIFFERENT: $q"; echo " deferred $a"; echo " plain    $b"; }
done

echo "== 3. migration to a random 48-d BERT under constant search"
cp plain.db mig.db
"$R" random-model --base "$MODEL" --out "$WORK/random-48" --hidden 48 --layers 2 >/dev/null
( n=0; bad=0
  while [ ! -f stop ]; do
    out=$("$R" search "cleanup after an effect" --index sqlite://mig.db --mode hybrid --json -k 5 --device cpu 2>/dev/null) || bad=$((bad+1))
    [ "$(echo "$out" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))' 2>/dev/null)" = 5 ] || bad=$((bad+1))
    n=$((n+1))
  done
  echo "$n searches during the migration, $bad errors or empty answers" > searches.txt ) &
searcher=$!
"$R" backfill --index sqlite://mig.db --stage embed --model "$WORK/random-48" --device cpu --progress none > /dev/null 2>&1 &
pid=$!
while :; do
  sleep 1
  emb=$("$R" status --index sqlite://mig.db --json | python3 -c 'import json,sys; b=json.load(sys.stdin)["backfill"]; print(b["chunks_embedded"] if b else 0)')
  [ $((emb * 3)) -ge "$chunks" ] && break
done
kill -9 $pid; wait $pid 2>/dev/null || true
echo "backfill killed at $emb of $chunks chunks:"
"$R" status --index sqlite://mig.db
t=$(secs "$R" backfill --index sqlite://mig.db --stage embed --model "$WORK/random-48" --device cpu --progress none)
echo "resumed backfill: $t s"
touch stop; wait $searcher
cat searches.txt
"$R" status --index sqlite://mig.db
