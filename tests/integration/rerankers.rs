//! Cross-encoders (rerankers) and SPLADE models against sentence-transformers' `CrossEncoder`
//! and `SparseEncoder`: random-weight models of each family (written by `ragline random-model
//! --task rerank|sparse`, the same bytes the reference saw; tests/fixtures/rerankers,
//! tests/fixtures/sparse, made by scripts/reference-rerankers.py) and the real tiny SPLADE
//! (scripts/fetch-model.sh splade-tiny); then reranking inside `ragline search`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{DType, Device};
use ragline::embed::cross_encoder::CrossEncoder;
use ragline::embed::ModelFiles;

use crate::embedding::kernel_paths;
use crate::util::{model_dir, ragline, read_jsonl, root, run, stdout_json};

const FAMILIES: [&str; 3] = ["bert", "xlm-roberta", "modernbert"];

pub(crate) fn fixtures(sub: &str) -> PathBuf {
    root().join("tests/fixtures").join(sub)
}

fn sha256(path: &Path) -> String {
    let o = run(Command::new("sha256sum").arg(path));
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// The integer after `flag` in a recorded `ragline random-model ...` command.
fn flag(command: &str, flag: &str) -> usize {
    let words: Vec<&str> = command.split_whitespace().collect();
    let at = words.iter().position(|w| *w == flag).unwrap();
    words[at + 1].parse().unwrap()
}

/// Write the model a reference.json's command made, and check it is the same bytes.
pub(crate) fn model_of(reference: &Path, out: &Path, family: Option<&str>) -> PathBuf {
    let meta: serde_json::Value =
        serde_json::from_slice(&fs::read(reference.join("reference.json")).unwrap()).unwrap();
    let command = meta["command"].as_str().unwrap();
    let (hidden, layers, seed) = (
        flag(command, "--hidden"),
        flag(command, "--layers"),
        flag(command, "--seed") as u64,
    );
    match family {
        Some(f) => ragline::embed::random_heads::save_random_reranker(
            &model_dir(),
            out,
            f,
            hidden,
            layers,
            seed,
        ),
        None => ragline::embed::random_heads::save_random_splade(
            &model_dir(),
            out,
            hidden,
            layers,
            seed,
        ),
    }
    .unwrap();
    assert_eq!(
        sha256(&out.join("model.safetensors")),
        meta["weights_sha256"].as_str().unwrap(),
        "{}: ragline no longer writes the weights the reference was computed on; rerun \
         scripts/reference-rerankers.py",
        reference.display()
    );
    out.to_path_buf()
}

/// The reference's (scores, raw scores).
fn reference_scores(family: &str) -> (Vec<f64>, Vec<f64>) {
    let v: serde_json::Value = serde_json::from_slice(
        &fs::read(fixtures("rerankers").join(family).join("scores.json")).unwrap(),
    )
    .unwrap();
    let list = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    (list("scores"), list("raw"))
}

/// The largest difference between ours and theirs, and where.
fn worst(ours: &[f64], theirs: &[f64]) -> (f64, usize) {
    assert_eq!(ours.len(), theirs.len());
    ours.iter()
        .zip(theirs)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold(
            (0.0, 0),
            |(w, at), (i, d)| if d > w { (d, i) } else { (w, at) },
        )
}

/// Every reranker family, on every CPU kernel path (the fused engine for BERT and
/// XLM-RoBERTa; candle for ModernBERT), scores the 200 held pairs within 1e-4 of
/// `CrossEncoder.predict`, both its activated score and its logit. The families exercise
/// token types (BERT), RoBERTa's pair template with one token type, the activation recorded
/// in each of sentence-transformers' three places (Sigmoid, Identity), a ModernBERT head
/// with mean pooling, and truncation of pairs longer than 512 tokens.
#[test]
fn every_reranker_family_matches_cross_encoder() {
    let dir = tempfile::tempdir().unwrap();
    let pairs = fixtures("rerankers/pairs.jsonl");
    for family in FAMILIES {
        let model = model_of(
            &fixtures("rerankers").join(family),
            &dir.path().join(family),
            Some(family),
        );
        let (scores, raw) = reference_scores(family);
        let mut paths = kernel_paths();
        if family == "modernbert" {
            paths.truncate(1);
        }
        for kernels in paths {
            let o = run(ragline()
                .env("RAGLINE_CPU_KERNELS", kernels)
                .args(["rerank", "--device", "cpu", "--model"])
                .arg(&model)
                .arg("--input")
                .arg(&pairs));
            assert_eq!(o.status.code(), Some(0));
            let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(lines.len(), 200);
            for (i, l) in lines.iter().enumerate() {
                assert_eq!(l["index"].as_u64(), Some(i as u64));
            }
            let ours: Vec<f64> = lines.iter().map(|l| l["score"].as_f64().unwrap()).collect();
            let ours_raw: Vec<f64> = lines
                .iter()
                .map(|l| l["raw_score"].as_f64().unwrap())
                .collect();
            let (d, at) = worst(&ours, &scores);
            let (dr, atr) = worst(&ours_raw, &raw);
            eprintln!("{family} {kernels}: largest difference {d:.2e} (pair {at}), logit {dr:.2e} (pair {atr})");
            assert!(d <= 1e-4, "{family} on {kernels}: pair {at} differs by {d}");
            assert!(
                dr <= 1e-4,
                "{family} on {kernels}: pair {atr}'s logit differs by {dr}"
            );
        }
    }
}

/// The candle encoder (what a GPU runs) with token types, on the CPU in f32: the same
/// scores as sentence-transformers.
#[test]
fn the_candle_reranker_path_matches_cross_encoder() {
    let dir = tempfile::tempdir().unwrap();
    let pairs: Vec<(String, String)> = read_jsonl(&fixtures("rerankers/pairs.jsonl"))
        .into_iter()
        .map(|v| {
            (
                v["query"].as_str().unwrap().to_string(),
                v["text"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for family in ["bert", "xlm-roberta"] {
        let model = model_of(
            &fixtures("rerankers").join(family),
            &dir.path().join(family),
            Some(family),
        );
        let files = ModelFiles::from_dir(family, &model).unwrap();
        let encoder = CrossEncoder::load_candle(files, &Device::Cpu, DType::F32).unwrap();
        assert!(
            encoder.encoder_kind().starts_with("candle"),
            "{}",
            encoder.encoder_kind()
        );
        let ids: Vec<_> = pairs
            .iter()
            .map(|(q, t)| encoder.encode_pair(q, t).unwrap())
            .collect();
        assert!(
            ids.iter().any(|p| p.ids.len() == 512),
            "some pair is truncated to 512 tokens"
        );
        let ours: Vec<f64> = encoder
            .score_pairs(&ids, 8192)
            .unwrap()
            .iter()
            .map(|s| f64::from(s.score))
            .collect();
        let (d, at) = worst(&ours, &reference_scores(family).0);
        eprintln!("{family} candle: largest difference {d:.2e} (pair {at})");
        assert!(d <= 1e-4, "{family} (candle): pair {at} differs by {d}");
    }
}

/// The reference's sparse vectors of the parity texts.
fn reference_vectors(name: &str) -> Vec<(Vec<u64>, Vec<f64>)> {
    read_jsonl(&fixtures("sparse").join(name).join("vectors.jsonl"))
        .into_iter()
        .map(|v| {
            (
                v["indices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap())
                    .collect(),
                v["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect(),
            )
        })
        .collect()
}

/// SPLADE: the random-weight model and the real tiny one, on every CPU kernel path, give
/// each parity text the same non-zero vocabulary entries as `SparseEncoder.encode`, with
/// values within 1e-4.
#[test]
fn sparse_vectors_match_sparse_encoder() {
    let dir = tempfile::tempdir().unwrap();
    let mut models = vec![(
        "random",
        model_of(&fixtures("sparse/random"), &dir.path().join("splade"), None),
    )];
    let tiny = root().join("models/splade-tiny");
    if tiny.join("model.safetensors").is_file() {
        models.push(("splade-tiny", tiny));
    } else {
        assert!(
            std::env::var("RAGLINE_REQUIRE_DATA").as_deref() != Ok("1"),
            "models/splade-tiny is absent: run scripts/fetch-model.sh splade-tiny"
        );
        eprintln!("SKIPPED splade-tiny: run scripts/fetch-model.sh splade-tiny");
    }
    let out = dir.path().join("v.jsonl");
    for (name, model) in models {
        let reference = reference_vectors(name);
        for kernels in kernel_paths() {
            let o = run(ragline()
                .env("RAGLINE_CPU_KERNELS", kernels)
                .args(["embed", "--sparse", "--device", "cpu", "--model"])
                .arg(&model)
                .arg("--input")
                .arg(root().join("tests/fixtures/parity/texts.jsonl"))
                .arg("--output")
                .arg(&out));
            assert_eq!(o.status.code(), Some(0));
            let ours = read_jsonl(&out);
            assert_eq!(ours.len(), reference.len());
            let mut largest: f64 = 0.0;
            for (i, (v, (idx, vals))) in ours.iter().zip(&reference).enumerate() {
                let got: Vec<u64> = v["indices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap())
                    .collect();
                assert_eq!(
                    &got, idx,
                    "{name} on {kernels}: text {i}'s non-zero entries differ"
                );
                for (a, b) in v["values"].as_array().unwrap().iter().zip(vals) {
                    largest = largest.max((a.as_f64().unwrap() - b).abs());
                }
            }
            eprintln!("{name} {kernels}: same entries, largest difference {largest:.2e}");
            assert!(
                largest <= 1e-4,
                "{name} on {kernels}: a value differs by {largest}"
            );
        }
    }
}

/// `search --rerank`: the first stage's candidates re-scored by the cross-encoder, best
/// first, each with its first-stage rank and score; the scores are the ones `ragline rerank`
/// gives the same texts, and the candidates are the first stage's top ones.
#[test]
fn search_reranks_the_first_stage_candidates() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus");
    fs::create_dir_all(&corpus).unwrap();
    for (i, v) in read_jsonl(&root().join("tests/fixtures/parity/texts.jsonl"))
        .iter()
        .take(60)
        .enumerate()
    {
        fs::write(
            corpus.join(format!("d{i:03}.txt")),
            v["text"].as_str().unwrap(),
        )
        .unwrap();
    }
    let index = format!("sqlite://{}", dir.path().join("rag.db").display());
    let o = run(ragline()
        .args(["ingest"])
        .arg(&corpus)
        .args(["--index", &index, "--model"])
        .arg(model_dir()));
    assert_eq!(o.status.code(), Some(0));
    let reranker = model_of(
        &fixtures("rerankers/bert"),
        &dir.path().join("ce"),
        Some("bert"),
    );
    let query = "a man is playing a guitar";
    let search = |extra: &[&str]| {
        let o = run(ragline()
            .args([
                "search", query, "--index", &index, "--json", "--mode", "vector",
            ])
            .args(extra));
        assert_eq!(o.status.code(), Some(0));
        stdout_json(&o).as_array().unwrap().clone()
    };
    let first = search(&["-k", "12"]);
    let reranker_arg = reranker.display().to_string();
    let hits = search(&[
        "-k",
        "5",
        "--rerank",
        &reranker_arg,
        "--rerank-candidates",
        "12",
    ]);
    assert_eq!(hits.len(), 5);
    let texts: Vec<String> = hits
        .iter()
        .map(|h| h["text"].as_str().unwrap().to_string())
        .collect();
    let mut cmd = ragline();
    cmd.args(["rerank", "--json", "--model", &reranker_arg, query])
        .args(&texts);
    let direct = stdout_json(&run(&mut cmd));
    let mut previous = f64::INFINITY;
    for (i, h) in hits.iter().enumerate() {
        assert_eq!(h["rank"].as_u64(), Some(i as u64 + 1));
        let score = h["score"].as_f64().unwrap();
        assert!(score <= previous, "hits are not best first: {hits:?}");
        previous = score;
        let own = direct
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["index"].as_u64() == Some(i as u64))
            .unwrap();
        assert!((own["score"].as_f64().unwrap() - score).abs() < 1e-5);
        assert!(
            (own["raw_score"].as_f64().unwrap() - h["raw_score"].as_f64().unwrap()).abs() < 1e-5
        );
        let was = h["first_stage_rank"].as_u64().unwrap() as usize;
        assert!((1..=12).contains(&was));
        assert_eq!(
            first[was - 1]["id"],
            h["id"],
            "hit {i} was not the first stage's {was}"
        );
        assert!(
            (first[was - 1]["score"].as_f64().unwrap() - h["first_stage_score"].as_f64().unwrap())
                .abs()
                < 1e-9
        );
    }
    // Reranking changed the order (a random cross-encoder disagrees with MiniLM).
    let ranks: Vec<u64> = hits
        .iter()
        .map(|h| h["first_stage_rank"].as_u64().unwrap())
        .collect();
    assert_ne!(
        ranks,
        vec![1, 2, 3, 4, 5],
        "the reranker kept the first stage's order"
    );
    // An embedding model given as a reranker is refused, naming the fix.
    let o = run(ragline()
        .args(["search", query, "--index", &index, "--rerank"])
        .arg(model_dir()));
    assert_eq!(o.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a cross-encoder"));
}

/// `serve --rerank-model --sparse-model`: TEI's `/rerank` and the Cohere/Jina `/v1/rerank`
/// answer with the scores `CrossEncoder.predict` gives (the reference), best first;
/// `/embed_sparse` with the vectors `SparseEncoder.encode` gives; 16 clients at once are
/// batched together and each gets its own answer; a server without the model says so (404).
#[test]
fn serve_reranks_and_embeds_sparse_vectors() {
    use crate::serve::{post, Server};
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let reranker = model_of(
        &fixtures("rerankers/bert"),
        &dir.path().join("ce"),
        Some("bert"),
    );
    let splade = model_of(&fixtures("sparse/random"), &dir.path().join("splade"), None);
    let server = Server::start(
        &model_dir(),
        &[
            "--rerank-model",
            reranker.to_str().unwrap(),
            "--sparse-model",
            splade.to_str().unwrap(),
        ],
        dir.path(),
        "tasks",
    );
    let pairs = read_jsonl(&fixtures("rerankers/pairs.jsonl"));
    let (scores, raw) = reference_scores("bert");
    // One query against many texts: the held pairs 0..8 share no query, so each client asks
    // about one pair's query with that pair's text and seven others.
    let ask = |i: usize| -> (u16, serde_json::Value) {
        let texts: Vec<&str> = (0..8)
            .map(|j| pairs[(i + j) % 8]["text"].as_str().unwrap())
            .collect();
        post(
            &format!("{}/rerank", server.url),
            &json!({"query": pairs[i]["query"], "texts": texts, "raw_scores": false, "return_text": true}),
        )
    };
    let answers: Vec<(u16, serde_json::Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16).map(|c| s.spawn(move || ask(c % 8))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (c, (status, body)) in answers.iter().enumerate() {
        assert_eq!(*status, 200, "{body}");
        let rows = body.as_array().unwrap();
        assert_eq!(rows.len(), 8);
        let i = c % 8;
        // The text that is pair i's own sits at index 0: its score is the reference's.
        let own = rows.iter().find(|r| r["index"] == 0).unwrap();
        assert!(
            (own["score"].as_f64().unwrap() - scores[i]).abs() <= 1e-4,
            "{own} vs {}",
            scores[i]
        );
        assert_eq!(own["text"], pairs[i]["text"]);
        let s: Vec<f64> = rows.iter().map(|r| r["score"].as_f64().unwrap()).collect();
        assert!(s.windows(2).all(|w| w[0] >= w[1]), "best first: {s:?}");
    }
    let (status, body) = post(
        &format!("{}/rerank", server.url),
        &json!({"query": pairs[3]["query"], "texts": [pairs[3]["text"]], "raw_scores": true}),
    );
    assert_eq!(status, 200);
    assert!(
        (body[0]["score"].as_f64().unwrap() - raw[3]).abs() <= 1e-4,
        "{body}"
    );
    let docs: Vec<serde_json::Value> = (0..5)
        .map(|j| {
            if j % 2 == 0 {
                pairs[5 + j]["text"].clone()
            } else {
                json!({"text": pairs[5 + j]["text"]})
            }
        })
        .collect();
    let (status, body) = post(
        &format!("{}/v1/rerank", server.url),
        &json!({"model": "mine", "query": pairs[5]["query"], "documents": docs, "top_n": 3, "return_documents": true}),
    );
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(body["model"], "mine");
    if let Some(own) = results.iter().find(|r| r["index"] == 0) {
        assert!((own["relevance_score"].as_f64().unwrap() - scores[5]).abs() <= 1e-4);
        assert_eq!(own["document"]["text"], pairs[5]["text"]);
    }
    let texts = read_jsonl(&root().join("tests/fixtures/parity/texts.jsonl"));
    let reference = reference_vectors("random");
    let (status, body) = post(
        &format!("{}/embed_sparse", server.url),
        &json!({"inputs": [texts[0]["text"], texts[1]["text"]]}),
    );
    assert_eq!(status, 200, "{body}");
    for (i, v) in body.as_array().unwrap().iter().enumerate() {
        let got: Vec<u64> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["index"].as_u64().unwrap())
            .collect();
        assert_eq!(got, reference[i].0, "text {i}");
        for (e, want) in v.as_array().unwrap().iter().zip(&reference[i].1) {
            assert!((e["value"].as_f64().unwrap() - want).abs() <= 1e-4);
        }
    }
    // Bad requests: no texts, a body of the wrong shape.
    let (status, _) = post(
        &format!("{}/rerank", server.url),
        &json!({"query": "q", "texts": []}),
    );
    assert_eq!(status, 400);
    let (status, _) = post(&format!("{}/v1/rerank", server.url), &json!({"query": "q"}));
    assert_eq!(status, 400);
    drop(server);
    let plain = Server::start(&model_dir(), &[], dir.path(), "plain");
    let (status, body) = post(
        &format!("{}/rerank", plain.url),
        &json!({"query": "q", "texts": ["t"]}),
    );
    assert_eq!(status, 404);
    assert!(body.to_string().contains("--rerank-model"), "{body}");
    let (status, _) = post(
        &format!("{}/embed_sparse", plain.url),
        &json!({"inputs": ["t"]}),
    );
    assert_eq!(status, 404);
}

/// `eval --rerank`: each mode twice, from the same first-stage results: reranking a single
/// candidate changes nothing (the rows are equal), reranking 50 with a random cross-encoder
/// changes the top of the ranking (the rows differ).
#[test]
fn eval_reports_each_mode_with_and_without_reranking() {
    let dir = tempfile::tempdir().unwrap();
    let reranker = model_of(
        &fixtures("rerankers/bert"),
        &dir.path().join("ce"),
        Some("bert"),
    );
    let db = dir.path().join("e.db");
    let eval = |extra: &[&str]| -> Vec<serde_json::Value> {
        let o = run(crate::index::eval_scifact_mini_with(&model_dir(), &db)
            .args(["--modes", "vector,keyword", "--rerank"])
            .arg(&reranker)
            .args(extra));
        assert_eq!(o.status.code(), Some(0));
        stdout_json(&o).as_array().unwrap().clone()
    };
    let metrics = ["ndcg_at_10", "recall_at_10", "recall_at_100", "mrr_at_10"];
    let one = eval(&["--rerank-candidates", "1"]);
    let rows: Vec<(String, bool)> = one
        .iter()
        .map(|s| {
            (
                s["mode"].as_str().unwrap().to_string(),
                s["reranked"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("vector".into(), false),
            ("vector".into(), true),
            ("keyword".into(), false),
            ("keyword".into(), true)
        ]
    );
    for pair in one.chunks(2) {
        for m in metrics {
            assert_eq!(
                pair[0][m], pair[1][m],
                "{m}: one candidate reranked changes nothing"
            );
        }
    }
    let fifty = eval(&["--no-ingest", "--rerank-candidates", "50"]);
    for (pair, before) in fifty.chunks(2).zip(one.chunks(2)) {
        assert_eq!(
            pair[0]["ndcg_at_10"], before[0]["ndcg_at_10"],
            "the first stage is the same"
        );
        assert_ne!(
            pair[0]["ndcg_at_10"], pair[1]["ndcg_at_10"],
            "{}: reranking changed nothing",
            pair[0]["mode"]
        );
        eprintln!(
            "{}: nDCG@10 {} -> {} reranked (a random cross-encoder)",
            pair[0]["mode"], pair[0]["ndcg_at_10"], pair[1]["ndcg_at_10"]
        );
    }
}
