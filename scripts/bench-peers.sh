#!/usr/bin/env bash
# ragline vs sentence-transformers on the same texts, same model, same max length, same
# thread count, run side by side in one go (alternating, median of RUNS each), text in to
# vectors out. Prints tokens/s of each and two ratios: ragline's whole process (its start and
# model load included) against st.encode of a model loaded and warmed up; and both with the
# model loaded (ragline's own time from after its load, which `ragline embed` prints).
#
#   PYTHON=/path/to/venv/bin/python scripts/bench-peers.sh [THREADS] [RUNS] [DEVICE]
#
# PYTHON must have sentence-transformers (pip install sentence-transformers). The texts are
# 2,000 passages cut from ../shared/data (react-docs and MDN paragraphs), built once into
# target/bench-peers/passages.jsonl. DEVICE is cpu (default) or cuda. DTYPE=bf16|int8 runs
# ragline in that precision (sentence-transformers stays f32 on the CPU); RAGLINE_CPU_KERNELS
# forces ragline's CPU kernel path (avx512, avx2, portable). ST_DTYPE=bf16 runs
# sentence-transformers in bf16 too (torch's oneDNN then uses AMX where the CPU has it: the
# fair peer of ragline's --dtype bf16). PASSAGES=N takes the first N passages only (the big
# models: scripts/bench-families.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
THREADS=${1:-$(nproc)}
RUNS=${2:-3}
DEVICE=${3:-cpu}
PYTHON=${PYTHON:-python3}
MODEL=${MODEL:-$ROOT/models/all-MiniLM-L6-v2}
RAGLINE=${RAGLINE:-$ROOT/target/release/ragline}
OUT=$ROOT/target/bench-peers
mkdir -p "$OUT"
[ -x "$RAGLINE" ] || cargo build --release --quiet
[ -f "$MODEL/model.safetensors" ] || scripts/fetch-model.sh

[ -s "$OUT/passages.jsonl" ] || python3 scripts/bench-passages.py "$OUT/passages.jsonl"

export RAYON_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
INPUT=$OUT/passages.jsonl
if [ -n "${PASSAGES:-}" ]; then
  INPUT=$OUT/passages-$PASSAGES.jsonl
  head -n "$PASSAGES" "$OUT/passages.jsonl" > "$INPUT"
fi
"$PYTHON" - "$INPUT" "$MODEL" "$RAGLINE" "$THREADS" "$RUNS" "$DEVICE" "${DTYPE:-auto}" "${ST_DTYPE:-f32}" <<'PY'
import json, os, platform, re, statistics, subprocess, sys, time
path, model_dir, ragline, threads, runs, device, dtype, st_dtype = sys.argv[1:9]
threads, runs = int(threads), int(runs)
import torch
from sentence_transformers import SentenceTransformer
torch.set_num_threads(threads)
texts = [json.loads(l)["text"] for l in open(path, encoding="utf-8")]
st = SentenceTransformer(model_dir, device=device)
if device == "cuda":
    st = st.half()
elif st_dtype == "bf16":
    st = st.to(torch.bfloat16)
tok = st.tokenizer
tokens = sum(len(x) for x in tok(texts, truncation=True, max_length=st.max_seq_length)["input_ids"])

def run_st():
    t = time.perf_counter()
    st.encode(texts, batch_size=32 if device == "cpu" else 512, convert_to_numpy=True)
    return time.perf_counter() - t

loaded = []  # ragline's own time after its model is loaded, per run

def run_ragline():
    t = time.perf_counter()
    done = subprocess.run([ragline, "embed", "--model", model_dir, "--device", device,
                           "--dtype", dtype,
                           "--input", path, "--output", "/tmp/bench-peers-ragline.npy"],
                          check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    wall = time.perf_counter() - t
    # "embedded N texts (T tokens) in S s: ..." times reading, tokenising, embedding and
    # writing, from after the model is loaded: what st.encode times of a loaded model.
    m = re.search(r"embedded \d+ texts \((\d+) tokens\) in ([0-9.]+)s", done.stderr)
    if m is None:
        sys.exit(f"ragline embed printed no summary:\n{done.stderr}")
    if int(m.group(1)) != tokens:
        print(f"note: ragline counted {m.group(1)} tokens, sentence-transformers {tokens}")
    loaded.append(float(m.group(2)))
    return wall

st.encode(texts[:64], batch_size=32)  # warm-up: torch's first call allocates and plans
times = {"sentence-transformers": [], "ragline": []}
for i in range(runs):
    order = [("ragline", run_ragline), ("sentence-transformers", run_st)]
    if i % 2:
        order.reverse()
    for name, fn in order:
        times[name].append(fn())
def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

flags = set()
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
except OSError:
    pass
simd = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16") if f in flags]
kernels = os.environ.get("RAGLINE_CPU_KERNELS", "auto")
print(f"{len(texts)} passages, {tokens} tokens (truncated at {st.max_seq_length}), "
      f"{threads} threads, device {device}, CPU {cpu_model()} ({' '.join(simd) or 'no AVX'}), "
      f"ragline dtype {dtype}, kernels {kernels}, sentence-transformers {st_dtype}; torch {torch.__version__} "
      f"({torch.backends.cpu.get_cpu_capability()})")
rate = {}
for name, ts in times.items():
    med = statistics.median(ts)
    rate[name] = tokens / med
    print(f"{name:>22}: {rate[name]:10.0f} tokens/s  (median of {runs}: {med:.2f}s; runs {', '.join(f'{t:.2f}' for t in ts)})")
med = statistics.median(loaded)
rate["loaded"] = tokens / med
print(f"{'ragline, model loaded':>22}: {rate['loaded']:10.0f} tokens/s  (median of {runs}: {med:.2f}s; runs {', '.join(f'{t:.2f}' for t in loaded)})")
print(f"{'ratio':>22}: {rate['ragline'] / rate['sentence-transformers']:.2f}x (ragline / sentence-transformers; ragline's whole process, start and model load included)")
print(f"{'ratio, model loaded':>22}: {rate['loaded'] / rate['sentence-transformers']:.2f}x (both timed with the model loaded, as st.encode is)")
PY
