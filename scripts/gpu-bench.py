#!/usr/bin/env python3
"""The measurements of scripts/gpu-check.sh on a GPU machine, in one process that also samples the
GPU (utilisation and memory, every 100 ms through NVML) and runs sentence-transformers beside
ragline on the same texts.

    python3 scripts/gpu-bench.py --ragline /tmp/ragline --model .gpu/model \
        --passages /tmp/passages.jsonl --out $OUT [--deadline SECONDS] [--only STEP,...]

Steps, in order (each bounded by a timeout; once --deadline seconds have passed the rest are
skipped and say so):
  parity    f16 and bf16 vectors of the parity texts (tests/fixtures/parity) against
            sentence-transformers' f32 reference: min cosine per dtype (>= 0.999 to pass);
  minilm    `ragline embed` text in to vectors out on all passages at token budgets 32k, 128k,
            512k; `ragline bench`; the per-part timing (RAGLINE_PROFILE_PARTS) of a slice;
            sentence-transformers fp16 on the same passages;
  ingest    `ragline ingest` of the passages (JSONL, one document each) into SQLite on the GPU,
            its tokens/s beside `ragline embed`'s;
  families  random-weight models in the published shapes (`ragline random-model --real-shape`:
            BERT-base, XLM-R base, DistilBERT, MPNet base, ModernBERT-base, EmbeddingGemma-300m,
            Qwen3-Embedding-0.6B): f16 parity against sentence-transformers f32 on the GPU,
            ragline and sentence-transformers fp16 throughput, the per-part timing for BERT-base.
Writes $OUT/gpu-check.json (everything measured), $OUT/logs.tar.gz (every command's output from
/tmp/gpu-logs, the GPU samples) and prints a table last.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time

import numpy as np

T0 = time.time()
PHASES = []
SAMPLES = []
RESULT = {"steps": {}, "skipped": []}
RATE = re.compile(r"embedded (\d+) texts \((\d+) tokens\) in ([0-9.]+)s: (\d+) tokens/s")
LOGS = "/tmp/gpu-logs"
# A dry run of the script's logic on a machine without a GPU: GPU_BENCH_DEVICE=cpu, --scale 0.01.
DEVICE = os.environ.get("GPU_BENCH_DEVICE", "cuda")
DTYPE = os.environ.get("GPU_BENCH_DTYPE", "f16")
SCALE = float(os.environ.get("GPU_BENCH_SCALE", "1"))


def scaled(n):
    return max(8, int(n * SCALE))


def sync():
    if DEVICE == "cuda":
        import torch
        torch.cuda.synchronize()
r_stdout = [""]  # the last command's stdout alone (bench --json)
PARTS = re.compile(r"parts b=(\d+) len=(\d+) tokens=(\d+) (.*) total=([0-9.]+)")
LAUNCH = re.compile(r"launch b=(\d+) len=(\d+) tokens=(\d+) enqueue=([0-9.]+) wait=([0-9.]+)")


def sampler(stop):
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception as e:  # noqa: BLE001 - the rest still runs without samples
        RESULT["sampler_error"] = str(e)
        return
    while not stop.is_set():
        try:
            u = pynvml.nvmlDeviceGetUtilizationRates(h)
            m = pynvml.nvmlDeviceGetMemoryInfo(h)
            SAMPLES.append((time.time(), u.gpu, m.used / 2**20))
        except Exception:  # noqa: BLE001
            pass
        time.sleep(0.1)


class Phase:
    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.t0 = time.time()
        print(f"[{self.t0 - T0:6.1f}s] {self.name}", flush=True)
        return self

    def __exit__(self, *exc):
        PHASES.append((self.name, self.t0, time.time()))
        return False


def gpu_during(t0, t1):
    s = [x for x in SAMPLES if t0 <= x[0] <= t1]
    if not s:
        return {}
    return {"util_mean": round(sum(x[1] for x in s) / len(s), 1),
            "util_busy_share": round(sum(1 for x in s if x[1] > 0) / len(s), 3),
            "mem_peak_mib": round(max(x[2] for x in s))}


def run(args, name, argv, timeout, env=None):
    """A ragline command; its output in logs/NAME.log; its rate line and the GPU meanwhile."""
    log = os.path.join(LOGS, name + ".log")
    e = dict(os.environ, **(env or {}))
    t0 = time.time()
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                           timeout=timeout, text=True, errors="replace")
        stdout, out, rc = p.stdout, p.stderr + p.stdout, p.returncode
    except subprocess.TimeoutExpired as ex:
        text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        stdout, out, rc = "", text(ex.stderr) + text(ex.stdout), "timeout"
    t1 = time.time()
    r_stdout[0] = stdout
    open(log, "w").write(" ".join(argv) + "\n" + out)
    r = {"rc": rc, "wall_s": round(t1 - t0, 2)}
    m = RATE.search(out)
    if m:
        r.update(texts=int(m[1]), tokens=int(m[2]), secs=float(m[3]), tokens_per_s=int(m[4]))
    r.update(gpu_during(t0, t1))
    if rc != 0:
        r["tail"] = out[-600:]
    return r, out


def parts_of(out):
    """Sum the per-part lines of a profiled run: ms per part, and their share."""
    total, n, tokens = {}, 0, 0
    for m in PARTS.finditer(out):
        n += 1
        tokens += int(m[3])
        for kv in m[4].split():
            k, v = kv.split("=")
            total[k] = total.get(k, 0.0) + float(v)
    whole = sum(total.values()) or 1.0
    return {"batches": n, "tokens": tokens,
            "ms": {k: round(v, 2) for k, v in total.items()},
            "share": {k: round(v / whole, 3) for k, v in total.items() if v > 0},
            "tokens_per_s_synchronized": round(tokens / whole * 1e3)}


def launch_of(out):
    """Sum the `launch` lines: host time enqueueing batches against time waiting for them."""
    n, tokens, enq, wait = 0, 0, 0.0, 0.0
    for m in LAUNCH.finditer(out):
        n, tokens = n + 1, tokens + int(m[3])
        enq, wait = enq + float(m[4]), wait + float(m[5])
    return {"batches": n, "tokens": tokens, "enqueue_ms": round(enq, 1),
            "wait_ms": round(wait, 1),
            "tokens_per_s_in_batches": round(tokens / max(enq + wait, 1e-9) * 1e3)}


def profiled(args, name, model, inp, budget=None):
    """The per-part timing and the launch/wait split of `inp`; the parts with cuBLASLt too."""
    r = {}
    for key, mode, fn, extra in (("parts", "1", parts_of, {}), ("launch", "launch", launch_of, {}),
                                 ("parts_cublaslt", "1", parts_of, LT)):
        run_r, out = embed(args, f"{name}-{key}", model, inp, budget=budget, timeout=120,
                           env=dict(extra, RAGLINE_PROFILE_PARTS=mode,
                                    RAGLINE_LOG="ragline::embed::profile=info"))
        r[key] = dict(fn(out), rc=run_r["rc"])
    return r


def embed(args, name, model, inp, dtype=None, budget=None, env=None, timeout=120, output=None):
    argv = [args.ragline, "embed", "--device", DEVICE, "--dtype", dtype or DTYPE, "--model", model,
            "--input", inp, "--output", output or "/tmp/v.npy"]
    if budget:
        argv += ["--batch-tokens", str(budget)]
    return run(args, name, argv, timeout, env)


def head(path, n, out):
    with open(path, encoding="utf-8") as f, open(out, "w", encoding="utf-8") as g:
        for i, line in enumerate(f):
            if i == n:
                break
            g.write(line)
    return out


def cosines(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def st_model(path, half=True):
    import torch
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(path, device=DEVICE)
    return st.half() if half else st.to(torch.float32)


def st_throughput(path, texts, batch_size=512):
    """sentence-transformers fp16, end to end (its tokenization included), one warm pass."""
    import torch
    st = st_model(path)
    tokens = sum(len(x) for x in st.tokenizer(texts, truncation=True,
                                              max_length=st.max_seq_length)["input_ids"])
    st.encode(texts[:1024], batch_size=batch_size)
    sync()
    t0 = time.time()
    st.encode(texts, batch_size=batch_size, convert_to_numpy=True)
    sync()
    t1 = time.time()
    peak = torch.cuda.max_memory_allocated() / 2**20 if DEVICE == "cuda" else 0
    del st
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    r = {"texts": len(texts), "tokens": tokens, "secs": round(t1 - t0, 3),
         "tokens_per_s": round(tokens / (t1 - t0)), "torch_peak_mib": round(peak)}
    r.update(gpu_during(t0, t1))
    return r


def texts_of(path):
    return [json.loads(l)["text"] for l in open(path, encoding="utf-8")]


LT = {"RAGLINE_CUBLASLT": "1"}
PIPE = {"RAGLINE_PIPELINE": "1"}
VARIANTS = (("pipeline", PIPE), ("cublaslt", LT), ("cublaslt+pipeline", dict(LT, **PIPE)))


def step_parity(args):
    ref = np.load("tests/fixtures/parity/reference.npy")
    r = {}
    for dt, env in (("f16", None), ("bf16", None), ("f16-cublaslt", LT)):
        out = os.path.join("/tmp", f"parity-{dt}.npy")
        run_r, _ = embed(args, f"parity-{dt}", args.model, "tests/fixtures/parity/texts.jsonl",
                         dtype=dt.split("-")[0], output=out, timeout=180, env=env)
        if run_r["rc"] != 0:
            r[dt] = run_r
            continue
        c = cosines(np.load(out), ref)
        r[dt] = {"min_cosine": round(float(c.min()), 6), "mean_cosine": round(float(c.mean()), 6),
                 "ok": bool(c.min() >= 0.999), "wall_s": run_r["wall_s"]}
    return r


def step_minilm(args):
    r = {"embed": {}}
    for budget in (32768, 131072, 524288):
        r["embed"][str(budget)], _ = embed(args, f"minilm-embed-{budget}", args.model,
                                           args.passages, budget=budget, timeout=150)
    r["variants_131072"] = {}
    for name, env in VARIANTS:
        r["variants_131072"][name], _ = embed(args, f"minilm-{name}-131072", args.model,
                                              args.passages, budget=131072, env=env,
                                              timeout=150)
    r["bench"], out = run(args, "minilm-bench",
                          [args.ragline, "bench", "--device", DEVICE, "--dtype", DTYPE,
                           "--model", args.model, "--chunks", str(scaled(20000)), "--json"], 120)
    try:
        r["bench"]["json"] = json.loads(r_stdout[0])
    except ValueError:
        pass
    slice_ = head(args.passages, scaled(10000), "/tmp/passages-10k.jsonl")
    r["parts"] = {str(b): profiled(args, f"minilm-parts-{b}", args.model, slice_, budget=b)
                  for b in (32768, 131072)}
    with Phase("minilm: sentence-transformers fp16"):
        r["st_fp16"] = st_throughput(args.model, texts_of(args.passages))
    return r


def step_ingest(args):
    db = "/tmp/ingest.db"
    for f in (db, db + "-wal", db + "-shm"):
        if os.path.exists(f):
            os.remove(f)
    report = os.path.join(LOGS, "ingest-report.json")
    run_r, _ = run(args, "ingest", [args.ragline, "ingest", args.passages, "--index",
                                    f"sqlite://{db}", "--device", DEVICE, "--dtype", "f16",
                                    "--model", args.model, "--report", report], 240)
    try:
        run_r["report"] = json.load(open(report))
    except (OSError, ValueError):
        pass
    return run_r


FAMILIES = [("bert", 20000), ("xlm-roberta", 10000), ("distilbert", 10000), ("mpnet", 10000),
            ("modernbert", 10000), ("gemma3", 5000), ("qwen3", 3000)]


def step_families(args):
    import torch
    r = {}
    texts_parity = texts_of("tests/fixtures/parity/texts.jsonl")
    only = os.environ.get("GPU_BENCH_FAMILIES")
    for fam, n in FAMILIES:
        if only and fam not in only.split(","):
            continue
        if time.time() - T0 > args.deadline:
            RESULT["skipped"].append(f"family {fam}")
            continue
        with Phase(f"family {fam}"):
            d = f"/tmp/families/{fam}"
            f = {}
            if not os.path.exists(os.path.join(d, "model.safetensors")):
                gen, _ = run(args, f"random-{fam}", [args.ragline, "random-model", "--base",
                             args.model, "--out", d, "--family", fam, "--real-shape",
                             "--seed", "1"], 120)
                if gen["rc"] != 0:
                    r[fam] = {"random_model": gen}
                    continue
            out = f"/tmp/{fam}-parity.npy"
            p16, _ = embed(args, f"{fam}-parity", d, "tests/fixtures/parity/texts.jsonl",
                           output=out, timeout=120)
            try:
                ref = st_model(d, half=False).encode(texts_parity, batch_size=64)
                st16 = st_model(d, half=True).encode(texts_parity, batch_size=64)
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
                c = cosines(np.load(out), ref)
                c16 = cosines(st16.astype(np.float32), ref)
                # Random weights in a deep model amplify rounding: sentence-transformers' own
                # fp16 against its f32 says how much of the gap is the format's.
                f["parity_f16_vs_st_f32"] = {"min_cosine": round(float(c.min()), 6),
                                             "mean_cosine": round(float(c.mean()), 6),
                                             "st_f16_min_cosine": round(float(c16.min()), 6)}
            except Exception as e:  # noqa: BLE001 - record and go on
                f["parity_f16_vs_st_f32"] = {"error": str(e)[-400:], "ragline": p16}
            n = scaled(n)
            inp = head(args.passages, n, f"/tmp/passages-{n}.jsonl")
            f["ragline_f16"], _ = embed(args, f"{fam}-embed", d, inp, timeout=150)
            if fam == "bert":
                f["ragline_f16_131072"], _ = embed(args, f"{fam}-embed-131072", d, inp,
                                                   budget=131072, timeout=150)
                for name, env in VARIANTS:
                    f[f"ragline_f16_{name}"], _ = embed(args, f"{fam}-{name}-131072", d, inp,
                                                        budget=131072, env=env, timeout=150)
                slice_ = head(args.passages, scaled(3000), "/tmp/passages-3k.jsonl")
                f["parts"] = profiled(args, f"{fam}-parts", d, slice_)
            try:
                f["st_fp16"] = st_throughput(d, texts_of(inp), batch_size=256)
            except Exception as e:  # noqa: BLE001
                f["st_fp16"] = {"error": str(e)[-400:]}
            r[fam] = f
    return r


STEPS = {"parity": step_parity, "minilm": step_minilm, "ingest": step_ingest,
         "families": step_families}


def table():
    rows = []
    s = RESULT["steps"]
    p = s.get("parity", {})
    for dt in ("f16", "bf16", "f16-cublaslt"):
        if dt in p:
            rows.append(f"parity {dt}: min cosine {p[dt].get('min_cosine')} ok={p[dt].get('ok')}")
    m = s.get("minilm", {})
    st = m.get("st_fp16", {}).get("tokens_per_s")
    for b, e in m.get("embed", {}).items():
        rows.append(f"minilm embed budget {b}: {e.get('tokens_per_s')} tok/s (ST fp16 {st}) "
                    f"util {e.get('util_mean')} mem {e.get('mem_peak_mib')} MiB rc {e.get('rc')}")
    for b, e in m.get("variants_131072", {}).items():
        rows.append(f"minilm embed {b} at 131072: {e.get('tokens_per_s')} tok/s "
                    f"util {e.get('util_mean')} mem {e.get('mem_peak_mib')} rc {e.get('rc')}")
    if "bench" in m:
        rows.append(f"minilm bench: {json.dumps(m['bench'].get('json'))[:300]}")
    for b, pr in m.get("parts", {}).items():
        p, l = pr.get("parts", {}), pr.get("launch", {})
        rows.append(f"minilm parts {b}: {p.get('share')} sync-rate {p.get('tokens_per_s_synchronized')}")
        if "parts_cublaslt" in pr:
            q = pr["parts_cublaslt"]
            rows.append(f"minilm parts+lt {b}: {q.get('share')} sync-rate {q.get('tokens_per_s_synchronized')}")
        rows.append(f"minilm launch {b}: enqueue {l.get('enqueue_ms')} ms wait {l.get('wait_ms')} ms "
                    f"in-batch rate {l.get('tokens_per_s_in_batches')}")
    ing = s.get("ingest", {})
    if ing:
        rep = ing.get("report", {})
        rows.append(f"ingest: {rep.get('tokens_per_sec')} tok/s rc {ing.get('rc')} util {ing.get('util_mean')}")
    for fam, f in s.get("families", {}).items():
        e, st = f.get("ragline_f16", {}), f.get("st_fp16", {})
        rows.append(f"{fam}: ragline {e.get('tokens_per_s')} ST {st.get('tokens_per_s')} "
                    f"parity {f.get('parity_f16_vs_st_f32', {}).get('min_cosine')} "
                    f"(ST f16 {f.get('parity_f16_vs_st_f32', {}).get('st_f16_min_cosine')}) "
                    f"util {e.get('util_mean')} rc {e.get('rc')}")
        for k in ["ragline_f16_131072"] + [f"ragline_f16_{n}" for n, _ in VARIANTS]:
            if k in f:
                rows.append(f"  {fam} {k}: {f[k].get('tokens_per_s')} util {f[k].get('util_mean')}")
        if "parts" in f:
            p, l = f["parts"].get("parts", {}), f["parts"].get("launch", {})
            rows.append(f"  {fam} parts: {p.get('share')} sync-rate {p.get('tokens_per_s_synchronized')}")
            q = f["parts"].get("parts_cublaslt", {})
            rows.append(f"  {fam} parts+lt: {q.get('share')} sync-rate {q.get('tokens_per_s_synchronized')}")
            rows.append(f"  {fam} launch: enqueue {l.get('enqueue_ms')} ms wait {l.get('wait_ms')} ms")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ragline", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--passages", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline", type=float, default=300)
    ap.add_argument("--only", default=",".join(STEPS))
    args = ap.parse_args()
    os.makedirs(LOGS, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    stop = threading.Event()
    threading.Thread(target=sampler, args=(stop,), daemon=True).start()
    failed_parity = False
    for name in args.only.split(","):
        if time.time() - T0 > args.deadline:
            RESULT["skipped"].append(name)
            continue
        with Phase(name):
            try:
                RESULT["steps"][name] = STEPS[name](args)
            except Exception as e:  # noqa: BLE001 - one step's failure must not lose the rest
                RESULT["steps"][name] = {"error": repr(e)[-800:]}
        if name == "parity":
            failed_parity = not all(v.get("ok") for v in RESULT["steps"][name].values())
        json.dump(RESULT, open(os.path.join(args.out, "gpu-check.json"), "w"), indent=1)
    stop.set()
    RESULT["phases"] = [(n, round(a - T0, 1), round(b - T0, 1), gpu_during(a, b))
                        for n, a, b in PHASES]
    RESULT["elapsed_s"] = round(time.time() - T0, 1)
    json.dump(RESULT, open(os.path.join(args.out, "gpu-check.json"), "w"), indent=1)
    with open(os.path.join(LOGS, "samples.tsv"), "w") as f:
        for t, u, mem in SAMPLES:
            f.write(f"{t - T0:.2f}\t{u}\t{mem:.0f}\n")
    with tarfile.open(os.path.join(args.out, "logs.tar.gz"), "w:gz") as t:
        t.add(LOGS, arcname="logs")
    print(table())
    print(f"elapsed {RESULT['elapsed_s']} s; skipped: {RESULT['skipped']}")
    sys.exit(1 if failed_parity else 0)


if __name__ == "__main__":
    main()
