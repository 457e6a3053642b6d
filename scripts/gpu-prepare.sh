#!/usr/bin/env bash
# Prepare what scripts/gpu-check.sh needs on a GPU machine, in .gpu/ (git-ignored, under the
# device tool's 64 MiB carry limit): the CUDA binary (stripped, xz; the lean feature set
# plus test-hooks, for random-weight models of every family), all-MiniLM-L6-v2 with f16
# weights (the f32 file alone is 90 MB; xz, unpacked there), and 10,000 passages (gpu-check.sh makes 100,000
# distinct texts of them there).
#
#   scripts/gpu-prepare.sh        # then: device run, carry .gpu, command scripts/gpu-check.sh
#
# The f16 conversion is plain Python (safetensors' format is simple enough to write by hand).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
G=.gpu
mkdir -p "$G/model/1_Pooling" "$G/model/2_Normalize"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/cuda}
RAGLINE_CUDA_FEATURES="--no-default-features --features cuda,test-hooks" scripts/build-cuda.sh
# xz, not gzip: the binary (candle's PTX inside) and the f16 weights must fit in the carry
# beside the repository (about 14 + 41 MB compressed, against 19 + 45 gzipped or raw).
gunzip -c "$CARGO_TARGET_DIR/ragline-cuda.gz" | xz -9 -T0 > "$G/ragline-cuda.xz"
M=models/all-MiniLM-L6-v2
[ -f "$M/model.safetensors" ] || scripts/fetch-model.sh
for f in config.json tokenizer.json tokenizer_config.json special_tokens_map.json vocab.txt \
         modules.json sentence_bert_config.json config_sentence_transformers.json \
         1_Pooling/config.json; do
  [ -f "$M/$f" ] && cp "$M/$f" "$G/model/$f"
done
python3 - "$M/model.safetensors" "$G/model.safetensors" <<'PY'
import array, json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
body = memoryview(raw)[8 + n:]
meta = header.pop("__metadata__", None)
out, blobs, offset = {}, [], 0
for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    a, b = t["data_offsets"]
    if t["dtype"] == "F32":
        x = array.array("f")
        x.frombytes(body[a:b])
        y, dtype = struct.pack(f"<{len(x)}e", *x), "F16"
    else:  # position ids and the like stay as they are
        y, dtype = bytes(body[a:b]), t["dtype"]
    out[name] = {"dtype": dtype, "shape": t["shape"], "data_offsets": [offset, offset + len(y)]}
    blobs.append(y)
    offset += len(y)
if meta:
    out["__metadata__"] = meta
h = json.dumps(out, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
xz -9 -T0 -f "$G/model.safetensors"
python3 scripts/bench-passages.py "$G/passages.jsonl" 10000
gzip -9 -f "$G/passages.jsonl"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
du -sh "$G" "$G"/*
