//! The model families against transformers + sentence-transformers: random-weight models of
//! each family (written by `ragline random-model --family`, the same bytes the reference saw),
//! and all-mpnet-base-v2 with its real weights. The reference vectors come from
//! scripts/reference-families.py (sentence-transformers' `encode`, `encode_query` and
//! `encode_document`), the STS-B figure from scripts/reference-sts.py.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::embedding::{cosine, kernel_paths, read_matrix};
use crate::util::{model_dir, ragline, read_jsonl, root, run, shared_data};

const FAMILIES: &[&str] = &[
    "bert",
    "xlm-roberta",
    "distilbert",
    "mpnet",
    "modernbert",
    "qwen3",
    "gemma3",
];

/// The families on candle ops on every device (the CPU kernel paths are the BERT-like
/// families' fused encoder: one run each is enough for these).
const ROTARY: &[&str] = &["modernbert", "qwen3", "gemma3"];

fn lowest_cosine(ours: &[Vec<f32>], theirs: &[Vec<f32>]) -> (f64, usize) {
    assert_eq!(ours.len(), theirs.len());
    let mut worst = (1.0f64, 0);
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert_eq!(a.len(), b.len(), "text {i}: dimension");
        let c = cosine(a, b);
        if c < worst.0 {
            worst = (c, i);
        }
    }
    worst
}

fn reference_dir(family: &str) -> PathBuf {
    root().join("tests/fixtures/families").join(family)
}

fn texts_file() -> PathBuf {
    root().join("tests/fixtures/parity/texts.jsonl")
}

/// The parity texts.
fn parity_texts() -> Vec<String> {
    read_jsonl(&texts_file())
        .iter()
        .map(|v| v["text"].as_str().unwrap().to_string())
        .collect()
}

/// Ingest the parity texts `picked` (one `dN.txt` file each) with `model` and `flags` into
/// a SQLite index in `dir`; returns its URI.
fn ingest_texts(dir: &Path, model: &Path, picked: &[usize], flags: &[&str]) -> String {
    let texts = parity_texts();
    let docs = dir.join("docs");
    fs::create_dir_all(&docs).unwrap();
    for &i in picked {
        fs::write(docs.join(format!("d{i}.txt")), &texts[i]).unwrap();
    }
    let index = format!("sqlite://{}", dir.join("i.db").display());
    let o = run(ragline()
        .args(["ingest", "--device", "cpu"])
        .args(flags)
        .arg("--model")
        .arg(model)
        .arg(&docs)
        .args(["--index", &index]));
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    index
}

/// `ragline search --mode vector --json`'s hits.
fn vector_search(index: &str, query: &str, k: usize) -> Vec<serde_json::Value> {
    let o = run(ragline()
        .args(["search", "--json", "--mode", "vector", "--index", index])
        .args(["-k", &k.to_string()])
        .arg(query));
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    crate::util::stdout_json(&o).as_array().unwrap().clone()
}

/// The parity text a search hit came from (its document is `dN.txt`).
fn hit_text(hit: &serde_json::Value) -> usize {
    let id = hit["document_id"].as_str().unwrap();
    id.trim_start_matches('d')
        .trim_end_matches(".txt")
        .parse()
        .unwrap()
}

fn sha256(path: &Path) -> String {
    let o = run(Command::new("sha256sum").arg(path));
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// The family's random model, written as the reference script had ragline write it (the
/// command recorded in reference.json), and checked to be the same bytes.
fn family_model(dir: &Path, family: &str) -> PathBuf {
    let meta: serde_json::Value =
        serde_json::from_slice(&fs::read(reference_dir(family).join("reference.json")).unwrap())
            .unwrap();
    let command = meta["command"].as_str().unwrap();
    let words: Vec<&str> = command.split_whitespace().collect();
    let arg = |flag: &str| -> usize {
        let at = words.iter().position(|w| *w == flag).unwrap();
        words[at + 1].parse().unwrap()
    };
    let out = dir.join(family);
    ragline::embed::random::save_random_family(
        &model_dir(),
        &out,
        family,
        arg("--hidden"),
        arg("--layers"),
        arg("--seed") as u64,
    )
    .unwrap();
    assert_eq!(
        sha256(&out.join("model.safetensors")),
        meta["weights_sha256"].as_str().unwrap(),
        "{family}: ragline no longer writes the weights the reference was computed on; \
         rerun scripts/reference-families.py"
    );
    out
}

/// `ragline embed` of the parity texts with `extra` flags, on a kernel path.
fn embed(model: &Path, kernels: &str, extra: &[&str], out: &Path) -> Vec<Vec<f32>> {
    let o = run(ragline()
        .env("RAGLINE_CPU_KERNELS", kernels)
        .args(["embed", "--device", "cpu", "--model"])
        .arg(model)
        .arg("--input")
        .arg(texts_file())
        .arg("--output")
        .arg(out)
        .args(extra));
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    read_matrix(out)
}

/// Every family, every CPU kernel path, and each of sentence-transformers' entry points
/// (`encode` with the model's default prompt, `encode_query`, `encode_document`): a cosine
/// of at least 0.9999 to the reference on the 230 parity texts. The folders exercise both
/// layouts of the pooling config, CLS/mean/last-token pooling, one and two Dense layers,
/// Normalize and its absence, prompts, `default_prompt_name`, `include_prompt: false`, local
/// attention windows, grouped key/value heads, and a decoder's tokenizer (end token appended,
/// left padding).
#[test]
fn every_family_matches_sentence_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.npy");
    for family in FAMILIES {
        let model = family_model(dir.path(), family);
        for (name, flags) in [
            ("encode", &[][..]),
            ("query", &["--prompt", "query"][..]),
            ("document", &["--prompt", "document"][..]),
        ] {
            let reference = read_matrix(&reference_dir(family).join(format!("{name}.npy")));
            // The rotary families' projections run on the kernel path too (portable: on
            // candle's matmul); their prompts are checked on the first path alone.
            let mut paths = kernel_paths();
            if ROTARY.contains(family) && name != "encode" {
                paths.truncate(1);
            }
            for kernels in paths {
                let ours = embed(&model, kernels, flags, &out);
                let (worst, at) = lowest_cosine(&ours, &reference);
                eprintln!("{family} {name} {kernels}: lowest cosine {worst:.6} (text {at})");
                assert!(
                    worst >= 0.9999,
                    "{family} {name} on {kernels}: text {at} has cosine {worst}"
                );
            }
        }
    }
    // The prompts matter: MPNet's folder names a default prompt; without it the vectors are
    // not sentence-transformers' `encode` (the comparison above can tell).
    let model = family_model(dir.path(), "mpnet");
    let ours = embed(&model, "portable", &["--prompt", "none"], &out);
    let reference = read_matrix(&reference_dir("mpnet").join("encode.npy"));
    let (worst, _) = lowest_cosine(&ours, &reference);
    assert!(worst < 0.9999, "no prompt, yet cosine {worst}");
}

/// The candle encoder (what CUDA and Metal run: padded batches, masks, the relative position
/// bias as a tensor) matches the same references on the CPU in f32.
#[test]
fn every_family_matches_on_the_gpu_code_path() {
    use candle_core::{DType, Device};
    use ragline::embed::texts::embed_texts;
    use ragline::embed::{EmbeddingModel, ModelFiles};

    let dir = tempfile::tempdir().unwrap();
    let texts = parity_texts();
    let sample: Vec<&str> = texts.iter().step_by(3).map(String::as_str).collect();
    for family in FAMILIES {
        let model = family_model(dir.path(), family);
        let files = ModelFiles::from_dir(family, &model).unwrap();
        let m = EmbeddingModel::load_candle(&files, &Device::Cpu, DType::F32).unwrap();
        assert!(m.pads());
        let reference = read_matrix(&reference_dir(family).join("document.npy"));
        let prompt = m.tokenizer.passage_prompt_ids().to_vec();
        let mut worst = 1.0f64;
        embed_texts(&m, &sample, &prompt, 2048, |i, v| {
            worst = worst.min(cosine(&v, &reference[i * 3]));
            Ok(())
        })
        .unwrap();
        eprintln!("{family} candle f32: lowest cosine {worst:.6}");
        assert!(worst >= 0.9999, "{family}: lowest cosine {worst}");
    }
}

/// `ragline serve` with each family: /v1/embeddings and /embed answer sentence-transformers'
/// vectors for `encode` (no `prompt_name`: the model's default prompt), `prompt_name` `query`
/// and `document` (`encode_query`, `encode_document`), and `dimensions` cuts them as
/// sentence-transformers' `truncate_dim` does (re-normalised only where the model has a
/// Normalize module: MPNet's folder has none).
#[test]
fn serve_answers_each_family_with_its_prompts_and_dimensions() {
    use crate::serve::{post, Server};
    use serde_json::json;

    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let dir = tempfile::tempdir().unwrap();
    let texts = parity_texts();
    let picked: Vec<usize> = (0..texts.len()).step_by(5).collect();
    let batch: Vec<&str> = picked.iter().map(|&i| texts[i].as_str()).collect();
    for family in FAMILIES {
        let model = family_model(dir.path(), family);
        let server = Server::start(&model, &[], dir.path(), family);
        for (name, body) in [
            ("encode", json!({"input": batch})),
            ("query", json!({"input": batch, "prompt_name": "query"})),
            (
                "document",
                json!({"input": batch, "prompt_name": "document", "dimensions": 16}),
            ),
        ] {
            let reference = read_matrix(&reference_dir(family).join(format!("{name}.npy")));
            let (status, answer) = post(&format!("{}/v1/embeddings", server.url), &body);
            assert_eq!(status, 200, "{family} {name}: {answer}");
            let served: Vec<Vec<f32>> = answer["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| serde_json::from_value(d["embedding"].clone()).unwrap())
                .collect();
            let mut tei_body = body.clone();
            tei_body["inputs"] = tei_body["input"].take();
            let (status, tei) = post(&format!("{}/embed", server.url), &tei_body);
            assert_eq!(status, 200, "{family} {name} /embed: {tei}");
            let tei: Vec<Vec<f32>> = serde_json::from_value(tei).unwrap();
            assert_eq!(
                tei, served,
                "{family} {name}: /embed and /v1/embeddings differ"
            );
            let cut = body.get("dimensions").and_then(|d| d.as_u64());
            let expected: Vec<Vec<f32>> = picked
                .iter()
                .map(|&i| {
                    let full = &reference[i];
                    let mut v = full[..cut.map_or(full.len(), |d| d as usize)].to_vec();
                    if (norm(full) - 1.0).abs() < 1e-4 {
                        let n = norm(&v) as f32;
                        v.iter_mut().for_each(|x| *x /= n);
                    }
                    v
                })
                .collect();
            let (worst, at) = lowest_cosine(&served, &expected);
            assert!(
                worst >= 0.9999,
                "{family} {name} served: text {at} has cosine {worst}"
            );
            for (i, (s, e)) in served.iter().zip(&expected).enumerate() {
                let ratio = norm(s) / norm(e);
                assert!(
                    (ratio - 1.0).abs() < 1e-3,
                    "{family} {name}: text {i} has norm {} where sentence-transformers' is {}",
                    norm(s),
                    norm(e)
                );
            }
        }
    }
}

/// A model saved in shards (as transformers splits Qwen3-Embedding-4B and -8B:
/// `model.safetensors.index.json` naming `model-0000N-of-0000M.safetensors`) embeds exactly as
/// the same weights in one file, on the fused engine (xlm-roberta) and the rotary encoder
/// (qwen3); a shard the index names but the folder lacks is refused naming it.
#[test]
fn a_sharded_model_embeds_as_its_single_file() {
    use std::collections::HashMap;

    let dir = tempfile::tempdir().unwrap();
    for family in ["xlm-roberta", "qwen3"] {
        let model = family_model(dir.path(), family);
        let whole = embed(&model, "portable", &[], &dir.path().join("whole.npy"));
        let reference = read_matrix(&reference_dir(family).join("encode.npy"));

        let tensors = candle_core::safetensors::load(
            model.join("model.safetensors"),
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let mut names: Vec<&String> = tensors.keys().collect();
        names.sort();
        let shards = 3;
        let mut weight_map = serde_json::Map::new();
        for s in 0..shards {
            let file = format!("model-{:05}-of-{shards:05}.safetensors", s + 1);
            let part: HashMap<String, candle_core::Tensor> = names
                .iter()
                .enumerate()
                .filter(|(i, _)| i % shards == s)
                .map(|(_, n)| ((*n).clone(), tensors[*n].clone()))
                .collect();
            for n in part.keys() {
                weight_map.insert(n.clone(), file.clone().into());
            }
            candle_core::safetensors::save(&part, model.join(&file)).unwrap();
        }
        fs::remove_file(model.join("model.safetensors")).unwrap();
        let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
        fs::write(
            model.join("model.safetensors.index.json"),
            serde_json::to_vec(&index).unwrap(),
        )
        .unwrap();

        let sharded = embed(&model, "portable", &[], &dir.path().join("sharded.npy"));
        assert_eq!(
            sharded, whole,
            "{family}: sharded vectors differ from the single file's"
        );
        let (worst, at) = lowest_cosine(&sharded, &reference);
        assert!(
            worst >= 0.9999,
            "{family} sharded: text {at} has cosine {worst}"
        );

        fs::remove_file(model.join("model-00002-of-00003.safetensors")).unwrap();
        let o = run(ragline()
            .args(["embed", "--device", "cpu", "--model"])
            .arg(&model)
            .arg("--input")
            .arg(texts_file())
            .arg("--output")
            .arg(dir.path().join("none.npy")));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_ne!(o.status.code(), Some(0));
        assert!(
            err.contains("model-00002-of-00003.safetensors") && err.contains("missing"),
            "{err}"
        );
        fs::remove_dir_all(&model).unwrap();
    }
}

/// `--dimensions N`: the vectors are the full ones cut to N and re-normalised; more than the
/// model has is refused with exit 2; the cut is part of the vector set's identity.
#[test]
fn dimensions_cut_and_renormalise() {
    let dir = tempfile::tempdir().unwrap();
    let model = family_model(dir.path(), "xlm-roberta");
    let out = dir.path().join("v.npy");
    let ours = embed(&model, "portable", &["--dimensions", "16"], &out);
    let full = read_matrix(&reference_dir("xlm-roberta").join("encode.npy"));
    for (i, (v, f)) in ours.iter().zip(&full).enumerate() {
        assert_eq!(v.len(), 16);
        let norm: f64 = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "text {i}: norm {norm}");
        let c = cosine(v, &f[..16]);
        assert!(c >= 0.9999, "text {i}: cosine {c} to the cut reference");
    }
    let o = run(ragline()
        .args(["embed", "--device", "cpu", "--dimensions", "33", "--model"])
        .arg(&model)
        .arg("--input")
        .arg(texts_file())
        .arg("--output")
        .arg(&out));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--dimensions 33 is more than"), "{stderr}");
}

/// An unknown `model_type` exits 2 and names the supported ones.
#[test]
fn an_unknown_family_is_refused_naming_the_supported_ones() {
    let dir = tempfile::tempdir().unwrap();
    let model = family_model(dir.path(), "bert");
    let config = model.join("config.json");
    let text = fs::read_to_string(&config)
        .unwrap()
        .replace("\"bert\"", "\"gpt2\"");
    fs::write(&config, text).unwrap();
    let o = run(ragline()
        .args(["embed", "--device", "cpu", "--model"])
        .arg(&model)
        .arg("--input")
        .arg(texts_file())
        .arg("--output")
        .arg(dir.path().join("v.npy")));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("model_type `gpt2` is not supported")
            && stderr.contains("mpnet")
            && stderr.contains("xlm-roberta"),
        "{stderr}"
    );
}

/// The real all-mpnet-base-v2 (scripts/fetch-model.sh sentence-transformers/all-mpnet-base-v2):
/// cosine >= 0.9999 to sentence-transformers on the parity texts on every kernel path, and
/// STS-B Spearman equal to sentence-transformers' to 4 decimals (x100: 0.01).
#[test]
fn all_mpnet_base_v2_matches_sentence_transformers() {
    let model = root().join("models/all-mpnet-base-v2");
    if !model.join("model.safetensors").is_file() {
        assert!(
            std::env::var("RAGLINE_REQUIRE_DATA").as_deref() != Ok("1"),
            "models/all-mpnet-base-v2 is missing and RAGLINE_REQUIRE_DATA=1: run \
             scripts/fetch-model.sh sentence-transformers/all-mpnet-base-v2"
        );
        eprintln!("skipped: models/all-mpnet-base-v2 is missing (scripts/fetch-model.sh)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.npy");
    let reference = read_matrix(&reference_dir("all-mpnet-base-v2").join("encode.npy"));
    // The best path on every text; the others (the portable one runs at 25 tokens/s in a
    // test build) on every 23rd (10 texts, long ones among them).
    let lines: Vec<String> = fs::read_to_string(texts_file())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let sample = dir.path().join("sample.jsonl");
    fs::write(
        &sample,
        lines
            .iter()
            .step_by(23)
            .map(|l| format!("{l}\n"))
            .collect::<String>(),
    )
    .unwrap();
    let sampled: Vec<Vec<f32>> = reference.iter().step_by(23).cloned().collect();
    for (n, kernels) in kernel_paths().into_iter().enumerate() {
        let (input, theirs) = if n == 0 {
            (texts_file(), &reference)
        } else {
            (sample.clone(), &sampled)
        };
        let o = run(ragline()
            .env("RAGLINE_CPU_KERNELS", kernels)
            .args(["embed", "--device", "cpu", "--model"])
            .arg(&model)
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(&out));
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let ours = read_matrix(&out);
        let (worst, at) = lowest_cosine(&ours, theirs);
        eprintln!(
            "all-mpnet-base-v2 {kernels}: lowest cosine {worst:.6} over {} texts",
            ours.len()
        );
        assert!(worst >= 0.9999, "{kernels}: text {at} has cosine {worst}");
    }

    let Some(sts) = shared_data("stsb/sts-test.tsv") else {
        return;
    };
    let expected: serde_json::Value = serde_json::from_slice(
        &fs::read(root().join("tests/fixtures/stsb-reference-mpnet.json")).unwrap(),
    )
    .unwrap();
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
    let o = run(ragline()
        .args(["embed", "--device", "cpu", "--model"])
        .arg(&model)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&out));
    assert_eq!(o.status.code(), Some(0));
    let v = read_matrix(&out);
    let cos: Vec<f64> = v.chunks(2).map(|p| cosine(&p[0], &p[1])).collect();
    let ours = crate::embedding::spearman(&cos, &gold) * 100.0;
    let theirs = expected["spearman_x100"].as_f64().unwrap();
    eprintln!("all-mpnet-base-v2 STS-B Spearman x100: ragline {ours:.4}, sentence-transformers {theirs:.4}");
    assert!(
        (ours - theirs).abs() < 0.01,
        "ragline {ours:.4} vs sentence-transformers {theirs:.4}"
    );
}

/// An index built with an e5-style model (the xlm-roberta folder's prompts "query: " and
/// "passage: ", and the qwen3 and gemma3 folders' own): chunks are embedded with the document prompt and `search` embeds the query
/// with the query prompt. Each vector-search score equals the cosine of sentence-transformers'
/// `encode_query` and `encode_document` vectors; without the prompts it would not.
#[test]
fn search_embeds_queries_and_documents_with_their_prompts() {
    // e5's prompts; Qwen3-Embedding's instruction (and an empty document prompt) on a
    // last-token decoder; EmbeddingGemma's prompts with its two Dense layers.
    for family in ["xlm-roberta", "qwen3", "gemma3"] {
        search_with_prompts(family);
    }
}

fn search_with_prompts(family: &str) {
    let dir = tempfile::tempdir().unwrap();
    let model = family_model(dir.path(), family);
    let texts = parity_texts();
    let picked: Vec<usize> = (40..48).collect();
    let index = ingest_texts(dir.path(), &model, &picked, &[]);
    let query = read_matrix(&reference_dir(family).join("query.npy"));
    let document = read_matrix(&reference_dir(family).join("document.npy"));
    let plain = read_matrix(&reference_dir(family).join("encode.npy"));
    let dot = |a: &[f32], b: &[f32]| -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum()
    };
    let mut differs = 0;
    for q in [41usize, 45] {
        let hits = vector_search(&index, &texts[q], 8);
        assert_eq!(hits.len(), picked.len());
        for h in &hits {
            let d = hit_text(h);
            let score = h["score"].as_f64().unwrap();
            let expected = dot(&query[q], &document[d]);
            assert!(
                (score - expected).abs() < 1e-4,
                "{family}: query {q}, text {d}: score {score}, sentence-transformers {expected}"
            );
            if (dot(&plain[q], &plain[d]) - expected).abs() > 1e-3 {
                differs += 1;
            }
        }
    }
    assert!(
        differs > 8,
        "{family}: the prompts changed only {differs} of 16 scores"
    );
}

/// An index built with `--dimensions 16`: the vector set records the cut, and `search`
/// (without the flag) cuts the query the same way: scores are the cosines of the cut
/// sentence-transformers vectors.
#[test]
fn an_index_built_with_dimensions_is_searched_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let model = family_model(dir.path(), "xlm-roberta");
    let texts = parity_texts();
    let picked: Vec<usize> = (50..54).collect();
    let index = ingest_texts(dir.path(), &model, &picked, &["--dimensions", "16"]);
    let o = run(ragline().args(["status", "--json", "--index", &index]));
    let status = String::from_utf8_lossy(&o.stdout);
    assert!(status.contains("\"dimension\": 16"), "{status}");
    let hits = vector_search(&index, &texts[51], 4);
    let query = read_matrix(&reference_dir("xlm-roberta").join("query.npy"));
    let document = read_matrix(&reference_dir("xlm-roberta").join("document.npy"));
    for h in &hits {
        let d = hit_text(h);
        let expected = cosine(&query[51][..16], &document[d][..16]);
        let score = h["score"].as_f64().unwrap();
        assert!(
            (score - expected).abs() < 1e-4,
            "text {d}: {score} vs {expected}"
        );
    }
}

/// Peak resident memory of a command, in MiB (GNU time's report).
fn peak_rss_mb(cmd: &mut Command) -> u64 {
    let o = run(cmd);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let kb = stderr
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Maximum resident set size (kbytes): ")
        })
        .unwrap_or_else(|| panic!("no peak RSS from /usr/bin/time: {stderr}"));
    kb.trim().parse::<u64>().unwrap() / 1024
}

/// A ModernBERT-shaped and an XLM-RoBERTa-shaped model (random weights, 4 heads; base sizes
/// in BENCHMARKS.md by scripts/long-inputs.sh) embed one input of 2,048, 4,096 and 8,192
/// tokens, whole (no truncation below the model's limit). Attention memory that grew with the
/// square of the length would add 4 heads x (8192^2 - 4096^2) x 4 bytes = 768 MiB from 4k
/// to 8k; blockwise attention adds what the activations take (a few MiB here).
#[test]
fn long_inputs_take_memory_that_grows_with_their_length_not_its_square() {
    assert!(
        Path::new("/usr/bin/time").is_file(),
        "GNU time is needed (apt-get install time; .ci/run installs it)"
    );
    let dir = tempfile::tempdir().unwrap();
    for family in ["modernbert", "xlm-roberta"] {
        let model = dir.path().join(family);
        ragline::embed::random::save_random_family_with(
            &model_dir(),
            &model,
            family,
            64,
            2,
            21,
            ragline::embed::random::RandomOptions {
                max_seq_length: Some(8192),
                real_shape: false,
            },
        )
        .unwrap();
        let mut peaks = Vec::new();
        for tokens in [2048usize, 4096, 8192] {
            let input = dir.path().join(format!("{family}-{tokens}.jsonl"));
            // "token" is one word piece; the specials make up the rest.
            let text = vec!["token"; tokens - 2].join(" ");
            fs::write(
                &input,
                serde_json::json!({ "text": text }).to_string() + "\n",
            )
            .unwrap();
            let out = dir.path().join(format!("{family}-{tokens}-out.jsonl"));
            let mb = peak_rss_mb(
                Command::new("/usr/bin/time")
                    .arg("-v")
                    .arg(env!("CARGO_BIN_EXE_ragline"))
                    .args(["embed", "--device", "cpu", "--model"])
                    .arg(&model)
                    .arg("--input")
                    .arg(&input)
                    .arg("--output")
                    .arg(&out),
            );
            let report = fs::read_to_string(&out).unwrap();
            let row: serde_json::Value =
                serde_json::from_str(report.lines().next().unwrap()).unwrap();
            let v = row["vector"].as_array().unwrap();
            assert_eq!(v.len(), 64);
            assert!(v.iter().all(|x| x.as_f64().unwrap().is_finite()));
            eprintln!("{family}: {tokens} tokens, peak RSS {mb} MiB");
            peaks.push(mb);
        }
        assert!(
            peaks[2] < peaks[1] + 128,
            "{family}: peak RSS {peaks:?} MiB at 2k/4k/8k tokens grows like the square"
        );
    }
}

/// A backfill from MiniLM (384-d) to the real all-mpnet-base-v2 (768-d) while searches run:
/// every search answers during it, and afterwards search uses MPNet, its scores the cosines
/// of sentence-transformers' MPNet vectors.
#[test]
fn a_backfill_from_minilm_to_mpnet_keeps_search_up() {
    let mpnet = root().join("models/all-mpnet-base-v2");
    if !mpnet.join("model.safetensors").is_file() {
        assert!(
            std::env::var("RAGLINE_REQUIRE_DATA").as_deref() != Ok("1"),
            "models/all-mpnet-base-v2 is missing and RAGLINE_REQUIRE_DATA=1"
        );
        eprintln!("skipped: models/all-mpnet-base-v2 is missing (scripts/fetch-model.sh)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let texts = parity_texts();
    // Short texts: each is one chunk, embedded whole as the reference was.
    let picked: Vec<usize> = (36..48).collect();
    let index = ingest_texts(dir.path(), &model_dir(), &picked, &[]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let searcher = {
        let (stop, index, query) = (stop.clone(), index.clone(), texts[39].clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || n == 0 {
                let hits = vector_search(&index, &query, 3);
                assert!(!hits.is_empty(), "a search came back empty");
                n += 1;
            }
            n
        })
    };
    let o = run(ragline()
        .args([
            "backfill",
            "--stage",
            "embed",
            "--progress",
            "none",
            "--device",
            "cpu",
        ])
        .args(["--index", &index, "--model"])
        .arg(&mpnet));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let searches = searcher.join().expect("every search answered");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!("{searches} searches during the backfill");
    let o = run(ragline().args(["status", "--json", "--index", &index]));
    let status = crate::util::stdout_json(&o);
    let active: Vec<&serde_json::Value> = status["vector_sets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["active"] == true)
        .collect();
    assert_eq!(active.len(), 1, "{status}");
    assert_eq!(active[0]["dimension"], 768, "{status}");
    let reference = read_matrix(&reference_dir("all-mpnet-base-v2").join("encode.npy"));
    let hits = vector_search(&index, &texts[39], 12);
    assert_eq!(hits.len(), picked.len());
    for h in &hits {
        let d = hit_text(h);
        let expected = cosine(&reference[39], &reference[d]);
        let score = h["score"].as_f64().unwrap();
        assert!(
            (score - expected).abs() < 1e-4,
            "text {d}: score {score}, sentence-transformers {expected}"
        );
    }
}

/// `bench` and `eval` with each rotary family (ingest, search, embed and serve are driven by
/// the tests above and in serve.rs through the same `EmbeddingModel`): the bench report names
/// the family's encoder, and eval scores the SciFact slice in every mode.
#[test]
fn bench_and_eval_run_the_rotary_families() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus");
    fs::create_dir_all(&corpus).unwrap();
    for (i, t) in parity_texts().iter().enumerate().take(80) {
        fs::write(corpus.join(format!("d{i}.md")), t).unwrap();
    }
    for family in ROTARY {
        let model = family_model(dir.path(), family);
        let o = run(ragline()
            .args([
                "bench", "--json", "--device", "cpu", "--chunks", "60", "--model",
            ])
            .arg(&model)
            .arg("--corpus")
            .arg(&corpus));
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let report = crate::util::stdout_json(&o);
        let model_type = if *family == "gemma3" {
            "gemma3_text"
        } else {
            family
        };
        assert!(
            report["encoder"].as_str().unwrap().contains(model_type),
            "{family}: {report}"
        );
        assert!(report["tokens_per_s"].as_f64().unwrap() > 0.0, "{report}");
        let o = run(&mut crate::index::eval_scifact_mini_with(
            &model,
            &dir.path().join(format!("{family}.db")),
        ));
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let scores = crate::util::stdout_json(&o);
        let scores = scores.as_array().unwrap();
        assert_eq!(scores.len(), 3, "{family}: {scores:?}");
        for s in scores {
            assert_eq!(s["queries"], 25, "{family}: {s}");
            let n = s["ndcg_at_10"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&n), "{family}: {s}");
        }
    }
}
