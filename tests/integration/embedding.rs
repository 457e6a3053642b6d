//! The real model: parity with sentence-transformers, and STS Benchmark through `ragline embed`.

use std::fs;
use std::path::Path;

use candle_core::Tensor;

use crate::util::{model_dir, root, run, shared_data};

fn read_matrix(path: &Path) -> Vec<Vec<f32>> {
    Tensor::read_npy(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .to_vec2::<f32>()
        .unwrap()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Every fixture text (short, long past 256 tokens, code, non-English, emoji, edge cases)
/// embeds to within cosine 0.9999 of sentence-transformers' vector.
#[test]
fn vectors_match_sentence_transformers() {
    let model = model_dir();
    let fixtures = root().join("tests/fixtures/parity");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.npy");
    let o = run(crate::util::ragline()
        .args(["embed", "--device", "cpu", "--model"])
        .arg(&model)
        .arg("--input")
        .arg(fixtures.join("texts.jsonl"))
        .arg("--output")
        .arg(&out));
    assert_eq!(o.status.code(), Some(0));
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
    eprintln!("lowest cosine {} for {}", worst.0, texts[worst.1]["id"]);
    assert!(
        worst.0 >= 0.9999,
        "text {} ({:?}) has cosine {} to the reference",
        texts[worst.1]["id"],
        texts[worst.1]["text"]
            .as_str()
            .map(|t| &t[..t.len().min(80)]),
        worst.0
    );
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

fn spearman(a: &[f64], b: &[f64]) -> f64 {
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

/// STS Benchmark through `ragline embed`: Spearman within 0.001 (x100: 0.1) of what
/// sentence-transformers gives (scripts/reference-sts.py, recorded in the fixture).
#[test]
fn sts_benchmark_matches_sentence_transformers() {
    let Some(sts) = shared_data("stsb/sts-test.tsv") else {
        return;
    };
    let model = model_dir();
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
    let o = run(crate::util::ragline()
        .args(["embed", "--device", "cpu", "--model"])
        .arg(&model)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&out));
    assert_eq!(o.status.code(), Some(0));
    let v = read_matrix(&out);
    let cos: Vec<f64> = v.chunks(2).map(|p| cosine(&p[0], &p[1])).collect();
    let ours = spearman(&cos, &gold) * 100.0;
    let theirs = reference["spearman_x100"].as_f64().unwrap();
    eprintln!("STS-B Spearman x100: ragline {ours:.4}, sentence-transformers {theirs:.4}");
    assert!(
        (ours - theirs).abs() <= 0.1,
        "ragline {ours} vs sentence-transformers {theirs}"
    );
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
