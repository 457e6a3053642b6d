//! The real model: parity with sentence-transformers, and STS Benchmark through `ragline embed`.

use std::fs;
use std::path::Path;

use candle_core::Tensor;

use crate::util::{model_dir, root, run, shared_data};

pub(crate) fn read_matrix(path: &Path) -> Vec<Vec<f32>> {
    Tensor::read_npy(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .to_vec2::<f32>()
        .unwrap()
}

pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// The CPU kernel paths this machine runs (`RAGLINE_CPU_KERNELS` values), best first.
pub(crate) fn kernel_paths() -> Vec<&'static str> {
    use ragline::embed::cpu::kernels::KernelPath;
    [KernelPath::Avx512, KernelPath::Avx2, KernelPath::Portable]
        .into_iter()
        .filter(|p| p.supported())
        .map(|p| p.name())
        .collect()
}

/// `ragline embed` of `input` on the CPU with the kernel path and dtype given, and AMX
/// allowed or not (`RAGLINE_CPU_AMX`; it only matters for bf16 and int8 on CPUs with AMX).
fn embed(input: &Path, out: &Path, kernels: &str, dtype: &str, amx: bool) -> std::process::Output {
    run(crate::util::ragline()
        .env("RAGLINE_CPU_KERNELS", kernels)
        .env("RAGLINE_CPU_AMX", if amx { "on" } else { "off" })
        .args(["embed", "--device", "cpu", "--dtype", dtype, "--model"])
        .arg(model_dir())
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(out))
}

/// The lowest cosine of the parity texts embedded with this path and dtype to
/// sentence-transformers' vectors, with the text that has it. `amx`: the bf16 or int8 GEMMs
/// run on AMX tiles (the caller checked the CPU has them), else AMX is turned off.
fn parity(kernels: &str, dtype: &str, amx: bool) -> (f64, String) {
    let fixtures = root().join("tests/fixtures/parity");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.npy");
    let o = embed(&fixtures.join("texts.jsonl"), &out, kernels, dtype, amx);
    assert_eq!(o.status.code(), Some(0), "{kernels} {dtype}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(&format!("{dtype} on the {kernels} kernels")),
        "the run names its kernels: {stderr}"
    );
    assert_eq!(
        stderr.contains("(AMX tiles)"),
        amx,
        "the run says whether AMX ran: {stderr}"
    );
    let ours = read_matrix(&out);
    let reference = read_matrix(&fixtures.join("reference.npy"));
    let texts: Vec<serde_json::Value> = crate::util::read_jsonl(&fixtures.join("texts.jsonl"));
    assert!(texts.len() >= 200);
    assert_eq!(ours.len(), reference.len());
    let mut worst = (1.0f64, 0usize);
    for (i, (a, b)) in ours.iter().zip(&reference).enumerate() {
        assert_eq!(a.len(), 384);
        let c = cosine(a, b);
        if c < worst.0 {
            worst = (c, i);
        }
    }
    let what = format!(
        "{} ({:?})",
        texts[worst.1]["id"],
        texts[worst.1]["text"]
            .as_str()
            .map(|t| &t[..t.len().min(80)])
    );
    eprintln!(
        "{kernels} {dtype} (AMX {amx}): lowest cosine {} for {what}",
        worst.0
    );
    (worst.0, what)
}

/// Every fixture text (short, long past 256 tokens, code, non-English, emoji, edge cases)
/// embeds to within cosine 0.9999 of sentence-transformers' vector, on every CPU kernel path
/// this machine supports (each forced with RAGLINE_CPU_KERNELS).
#[test]
fn vectors_match_sentence_transformers() {
    let paths = kernel_paths();
    assert!(paths.contains(&"portable"));
    for kernels in paths {
        let (worst, text) = parity(kernels, "f32", false);
        assert!(
            worst >= 0.9999,
            "{kernels}: text {text} has cosine {worst} to the reference"
        );
    }
}

/// `--dtype bf16` and `--dtype int8` on the CPU: within cosine 0.999 and 0.995 of
/// sentence-transformers' f32 vectors where the CPU has AVX512-BF16 / AVX512-VNNI, on the
/// AVX-512 kernels and, where the CPU has AMX, on its tiles too; where it has not, a clear
/// refusal that names the missing feature and the fix, not a slow emulation.
#[test]
fn low_precision_holds_its_bar_or_is_refused() {
    use ragline::embed::cpu::kernels::{features, KernelPath};
    let f = features();
    for (dtype, floor, has, amx, needs) in [
        ("bf16", 0.999, f.avx512_bf16, f.amx_bf16, "AVX512-BF16"),
        ("int8", 0.995, f.avx512_vnni, f.amx_int8, "AVX512-VNNI"),
    ] {
        for on_tiles in [false, true] {
            if !has || (on_tiles && !amx) {
                continue;
            }
            let (worst, text) = parity("avx512", dtype, on_tiles);
            assert!(
                worst >= floor,
                "{dtype} (AMX {on_tiles}): text {text} has cosine {worst} to the reference"
            );
        }
        // On a path without the instructions (every CPU has the portable one), it is refused.
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("t.jsonl");
        fs::write(&input, "{\"text\": \"hello\"}\n").unwrap();
        let o = embed(
            &input,
            &dir.path().join("v.npy"),
            KernelPath::Portable.name(),
            dtype,
            true,
        );
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_ne!(o.status.code(), Some(0), "{dtype} on portable kernels");
        assert!(
            stderr.contains(needs) && stderr.contains("--dtype f32"),
            "{dtype}: {stderr}"
        );
    }
}

/// Ranks with ties given their average rank.
fn ranks(xs: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..xs.len()).collect();
    idx.sort_by(|&a, &b| xs[a].total_cmp(&xs[b]));
    let mut r = vec![0.0; xs.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && xs[idx[j + 1]] == xs[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for k in i..=j {
            r[idx[k]] = avg;
        }
        i = j + 1;
    }
    r
}

pub(crate) fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = ra.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = rb.iter().map(|y| (y - mb).powi(2)).sum();
    cov / (va * vb).sqrt()
}

#[test]
fn spearman_handles_ties() {
    assert!((spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]) - 1.0).abs() < 1e-12);
    assert!((spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
    assert_eq!(ranks(&[5.0, 1.0, 5.0, 2.0]), vec![3.5, 1.0, 3.5, 2.0]);
}

/// STS Benchmark through `ragline embed`, on every CPU kernel path: Spearman within 0.001
/// (x100: 0.1) of what sentence-transformers gives (scripts/reference-sts.py, recorded in the
/// fixture).
#[test]
fn sts_benchmark_matches_sentence_transformers() {
    let Some(sts) = shared_data("stsb/sts-test.tsv") else {
        return;
    };
    let reference: serde_json::Value = serde_json::from_slice(
        &fs::read(root().join("tests/fixtures/stsb-reference.json")).unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("s.jsonl");
    let mut gold = Vec::new();
    let mut lines = String::new();
    for line in fs::read_to_string(&sts).unwrap().lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        gold.push(f[0].parse::<f64>().unwrap());
        for s in &f[1..3] {
            lines.push_str(&serde_json::json!({ "text": s }).to_string());
            lines.push('\n');
        }
    }
    fs::write(&input, lines).unwrap();
    let out = dir.path().join("v.npy");
    for kernels in kernel_paths() {
        let o = embed(&input, &out, kernels, "f32", false);
        assert_eq!(o.status.code(), Some(0));
        let v = read_matrix(&out);
        let cos: Vec<f64> = v.chunks(2).map(|p| cosine(&p[0], &p[1])).collect();
        let ours = spearman(&cos, &gold) * 100.0;
        let theirs = reference["spearman_x100"].as_f64().unwrap();
        eprintln!(
            "STS-B Spearman x100 on {kernels}: ragline {ours:.4}, sentence-transformers \
             {theirs:.4}"
        );
        assert!(
            (ours - theirs).abs() <= 0.1,
            "{kernels}: ragline {ours} vs sentence-transformers {theirs}"
        );
    }
}

/// The candle encoder (the path GPUs take: padded batches, masks, candle kernels) run on the
/// CPU: f32 matches sentence-transformers like the fused path, and f16/bf16 (GPU number
/// formats) stay within cosine 0.999 on a sample of the texts.
#[test]
fn the_gpu_code_path_matches_on_the_cpu() {
    use candle_core::{DType, Device};
    use ragline::embed::texts::embed_texts;
    use ragline::embed::{EmbeddingModel, ModelFiles};

    let files = ModelFiles::from_dir("all-MiniLM-L6-v2", &model_dir()).unwrap();
    let fixtures = root().join("tests/fixtures/parity");
    let texts: Vec<String> = crate::util::read_jsonl(&fixtures.join("texts.jsonl"))
        .iter()
        .map(|v| v["text"].as_str().unwrap().to_string())
        .collect();
    let reference = read_matrix(&fixtures.join("reference.npy"));
    for (dtype, stride, floor) in [
        (DType::F32, 1, 0.9999),
        (DType::F16, 6, 0.999),
        (DType::BF16, 6, 0.999),
    ] {
        let model = EmbeddingModel::load_candle(&files, &Device::Cpu, dtype).unwrap();
        assert!(model.pads(), "the candle encoder computes padded batches");
        let picked: Vec<usize> = (0..texts.len()).step_by(stride).collect();
        let sample: Vec<&str> = picked.iter().map(|&i| texts[i].as_str()).collect();
        let mut worst = 1.0f64;
        embed_texts(&model, &sample, &[], 2048, |i, v| {
            worst = worst.min(cosine(&v, &reference[picked[i]]));
            Ok(())
        })
        .unwrap();
        eprintln!(
            "{dtype:?}: lowest cosine {worst} over {} texts",
            sample.len()
        );
        assert!(worst >= floor, "{dtype:?}: lowest cosine {worst}");
    }
}
