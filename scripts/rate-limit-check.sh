#!/usr/bin/env bash
# Does a remote embedder keep to its tokens-per-minute limit? An ingest of react-docs with the
# embedder pointed at `ragline serve` and `tpm` set, for SECONDS; the server's own count of
# tokens (ragline_tokens_total at /metrics) is sampled every second, and the most tokens seen
# in any 60-second span is compared with the limit.
#
#   scripts/rate-limit-check.sh [TPM] [SECONDS]     (default 60000 180)
#
# Needs a release build and the model. The server counts a request when it answers it, the
# limiter when it sends it: a span's count can differ by what was in flight at its edges.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
TPM=${1:-60000}
SECS=${2:-180}
BIN=${RAGLINE:-${CARGO_TARGET_DIR:-target}/release/ragline}
MODEL=${MODEL:-$ROOT/models/all-MiniLM-L6-v2}
DOCS=${DOCS:-$ROOT/../shared/data/react-docs}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT

"$BIN" serve --model "$MODEL" --device cpu --port 0 >"$TMP/serve.out" 2>"$TMP/serve.log" &
for _ in $(seq 1 300); do grep -q listening "$TMP/serve.out" 2>/dev/null && break; sleep 0.1; done
URL=$(sed -n 's/^listening on //p' "$TMP/serve.out")
cat >"$TMP/ragline.toml" <<TOML
[stages.embed.remote]
url = "$URL"
api = "openai"
model = "all-MiniLM-L6-v2"
tpm = $TPM
max_tokens = 4096
TOML
"$BIN" --config "$TMP/ragline.toml" ingest --model "$MODEL" --progress none \
  --index "sqlite://$TMP/rl.db" "$DOCS" >"$TMP/ingest.out" 2>"$TMP/ingest.log" &
python3 - "$URL" "$TPM" "$SECS" <<'PY'
import sys, time, urllib.request
url, tpm, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def tokens():
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith("ragline_tokens_total"))
samples = []
t0 = time.monotonic()
while time.monotonic() - t0 < secs:
    samples.append((time.monotonic() - t0, tokens()))
    time.sleep(1.0)
samples.append((time.monotonic() - t0, tokens()))
# The most tokens in any span of 60 s (between two samples at most 60 s apart).
worst = 0.0
for i, (ti, ni) in enumerate(samples):
    for tj, nj in samples[i + 1:]:
        if tj - ti > 60.0:
            break
        worst = max(worst, nj - ni)
minutes = []
for m in range(int(secs // 60)):
    a = min(samples, key=lambda s: abs(s[0] - 60 * m))
    b = min(samples, key=lambda s: abs(s[0] - 60 * (m + 1)))
    minutes.append(int(b[1] - a[1]))
print(f"tpm limit {tpm}: tokens the server embedded per minute {minutes}; most in any 60 s "
      f"span {int(worst)} ({worst / tpm:.3f} of the limit); total {int(samples[-1][1])} in "
      f"{samples[-1][0]:.0f} s")
print("within the limit" if worst <= tpm else "OVER THE LIMIT")
PY
