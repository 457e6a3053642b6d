//! Sparse (SPLADE) vectors in the index: the `sparse` stage of the lifecycle (enrich gives an
//! existing index its vectors, a changed document gets new ones, a paused stage waits, another
//! model computes them all again) on SQLite and PostgreSQL; `search --mode sparse` against
//! the dot products of `ragline embed --sparse`'s vectors; `--mode hybrid --fuse
//! dense,sparse,keyword` against reciprocal rank fusion of the three rankings; `eval`'s
//! sparse and fused rows on a SciFact slice.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::backend::{backend_kinds, BackendKind, TestIndex};
use crate::rerankers::{fixtures, model_of};
use crate::serve::{get, Server};
use crate::util::{model_dir, ragline, read_jsonl, root, run, stdout_json};

/// The real tiny SPLADE (scripts/fetch-model.sh splade-tiny), or None (the test skips) where
/// it is not fetched and the data is not required.
fn splade_tiny() -> Option<PathBuf> {
    let tiny = root().join("models/splade-tiny");
    if tiny.join("model.safetensors").is_file() {
        return Some(tiny);
    }
    assert!(
        std::env::var("RAGLINE_REQUIRE_DATA").as_deref() != Ok("1"),
        "models/splade-tiny is absent: run scripts/fetch-model.sh splade-tiny"
    );
    eprintln!("SKIPPED: models/splade-tiny is absent; run scripts/fetch-model.sh splade-tiny");
    None
}

type Sparse = Vec<(u32, f32)>;

/// `ragline embed --sparse` of each text.
fn embed_sparse(model: &Path, texts: &[String], dir: &Path) -> Vec<Sparse> {
    let input = dir.join("sparse-in.jsonl");
    let output = dir.join("sparse-out.jsonl");
    let lines: Vec<String> = texts
        .iter()
        .map(|t| serde_json::json!({ "text": t }).to_string())
        .collect();
    fs::write(&input, lines.join("\n") + "\n").unwrap();
    let o = run(ragline()
        .args(["embed", "--sparse", "--device", "cpu", "--model"])
        .arg(model)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&output));
    assert_eq!(o.status.code(), Some(0));
    read_jsonl(&output)
        .iter()
        .map(|v| {
            v["indices"]
                .as_array()
                .unwrap()
                .iter()
                .zip(v["values"].as_array().unwrap())
                .map(|(i, w)| (i.as_u64().unwrap() as u32, w.as_f64().unwrap() as f32))
                .collect()
        })
        .collect()
}

fn dot(a: &Sparse, b: &Sparse) -> f64 {
    let b: HashMap<u32, f32> = b.iter().copied().collect();
    a.iter()
        .filter_map(|(t, w)| b.get(t).map(|x| *w as f64 * *x as f64))
        .sum()
}

/// The index's sparse vectors are the model's vectors of its chunks' texts.
fn assert_vectors_are(index: &TestIndex, model: &Path, dir: &Path, what: &str) {
    let chunks = index.chunks();
    let texts: Vec<String> = chunks.iter().map(|c| c.2.clone()).collect();
    let expected = embed_sparse(model, &texts, dir);
    let stored = index.sparse_vectors();
    assert_eq!(
        stored.len(),
        chunks.len(),
        "{} {what}: every chunk has a sparse vector",
        index.name()
    );
    for ((_, id, _), want) in chunks.iter().zip(&expected) {
        let got = &stored[id];
        let terms = |v: &Sparse| v.iter().map(|x| x.0).collect::<Vec<_>>();
        assert_eq!(
            terms(got),
            terms(want),
            "{} {what}: chunk {id}'s terms",
            index.name()
        );
        for (a, b) in got.iter().zip(want) {
            assert!(
                (a.1 - b.1).abs() <= 1e-6 * b.1.abs().max(1.0),
                "{} {what}: chunk {id}, term {}: {} stored, {} computed",
                index.name(),
                a.0,
                a.1,
                b.1
            );
        }
    }
}

fn ingest(index: &TestIndex, corpus: &Path, extra: &[&str]) {
    let o = run(ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(model_dir())
        .arg("--index")
        .arg(index.uri())
        .args(extra)
        .arg(corpus));
    assert_eq!(o.status.code(), Some(0), "ingest into {}", index.name());
}

/// `ragline enrich` with `args`; its report.
fn enrich(index: &TestIndex, args: &[&str], dir: &Path) -> Value {
    let report = dir.join("enrich.json");
    let o = run(ragline()
        .args(["enrich", "--progress", "none", "--device", "cpu", "--index"])
        .arg(index.uri())
        .arg("--report")
        .arg(&report)
        .args(args));
    assert_eq!(
        o.status.code(),
        Some(0),
        "enrich {args:?} on {}",
        index.name()
    );
    serde_json::from_slice(&fs::read(&report).unwrap()).unwrap()
}

fn sparse_status(index: &TestIndex) -> Value {
    let o = run(ragline()
        .args(["status", "--json", "--index"])
        .arg(index.uri()));
    assert_eq!(o.status.code(), Some(0));
    stdout_json(&o)["stages"]["sparse"].clone()
}

fn search(uri: &str, query: &str, mode: &[&str], k: usize) -> Vec<Value> {
    let o = run(ragline()
        .args(["search", "--json", "--device", "cpu", "--no-promote", "-k"])
        .arg(k.to_string())
        .arg("--index")
        .arg(uri)
        .arg("--mode")
        .args(mode)
        .arg(query));
    assert_eq!(o.status.code(), Some(0), "search --mode {mode:?}");
    stdout_json(&o).as_array().unwrap().clone()
}

/// An index gains sparse vectors with `enrich --stage sparse`; a changed document gets new
/// ones (and only it is worked), a paused stage waits, another model computes them all again;
/// sparse search ranks by the dot product. On SQLite (postings) and PostgreSQL (`sparsevec`).
#[test]
fn sparse_vectors_are_a_stage_of_the_index() {
    let Some(tiny) = splade_tiny() else { return };
    let dir = tempfile::tempdir().unwrap();
    let random = model_of(&fixtures("sparse/random"), &dir.path().join("random"), None);
    let texts: Vec<String> = read_jsonl(&root().join("tests/fixtures/parity/texts.jsonl"))
        .iter()
        .filter(|v| v["kind"] != "sts")
        .take(8)
        .map(|v| v["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(texts.len(), 8);
    let corpus = dir.path().join("corpus");
    fs::create_dir_all(&corpus).unwrap();
    let write = |i: usize, text: &str| {
        fs::write(
            corpus.join(format!("d{i}.md")),
            format!("# Doc {i}\n\n{text}\n"),
        )
        .unwrap();
    };
    for kind in backend_kinds() {
        for (i, t) in texts.iter().enumerate() {
            write(i, t);
        }
        let index = kind.index(dir.path(), "sparse_stage");
        ingest(&index, &corpus, &[]);

        // No sparse vectors yet: sparse search and a model-less stage say what to do.
        let o = run(ragline()
            .args(["search", "--mode", "sparse", "--device", "cpu", "--index"])
            .arg(index.uri())
            .arg("anything"));
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("enrich --stage sparse"), "{err}");
        let o = run(ragline()
            .args([
                "enrich",
                "--stage",
                "sparse",
                "--progress",
                "none",
                "--index",
            ])
            .arg(index.uri()));
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("--sparse-model"), "{err}");

        // enrich gives the existing index its sparse vectors.
        let tiny_arg = tiny.to_str().unwrap();
        let r = enrich(
            &index,
            &["--stage", "sparse", "--sparse-model", tiny_arg],
            dir.path(),
        );
        assert_eq!(r["counts"]["indexed"], 8, "{r}");
        assert_eq!(sparse_status(&index)["done"], 8);
        let o = run(ragline().args(["status", "--index"]).arg(index.uri()));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains(&format!("sparse   `{tiny_arg}`: 8 of 8 documents done")),
            "{out}"
        );
        assert_vectors_are(&index, &tiny, dir.path(), "after enrich");

        // A changed document: ingest gives it new vectors (the index remembers the model),
        // and only it is worked.
        write(
            3,
            "Sparse retrieval weighs each vocabulary term of a passage.",
        );
        let o = run(ragline()
            .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
            .arg(model_dir())
            .arg("--index")
            .arg(index.uri())
            .arg(&corpus));
        assert_eq!(o.status.code(), Some(0));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("sparse vectors: 1 documents done"), "{out}");
        assert_vectors_are(&index, &tiny, dir.path(), "after a change");

        // A paused stage waits (ingest leaves its work queued); resumed, enrich does it.
        let pause = |verb: &str| {
            let o = run(ragline().args([verb, "sparse", "--index"]).arg(index.uri()));
            assert_eq!(o.status.code(), Some(0), "{verb}");
        };
        pause("pause");
        write(4, "A paused stage keeps its work until it is resumed.");
        ingest(&index, &corpus, &[]);
        let r = enrich(&index, &[], dir.path());
        assert_eq!(r["counts"]["indexed"], 0, "{r}");
        assert_eq!(sparse_status(&index)["pending"], 1);
        pause("resume");
        let r = enrich(&index, &[], dir.path());
        assert_eq!(r["counts"]["indexed"], 1, "{r}");
        assert_vectors_are(&index, &tiny, dir.path(), "after the pause");

        // Another model (`backfill --stage sparse`): every document's vectors are computed
        // again.
        let report = dir.path().join("backfill.json");
        let o = run(ragline()
            .args([
                "backfill",
                "--stage",
                "sparse",
                "--progress",
                "none",
                "--device",
                "cpu",
            ])
            .arg("--model")
            .arg(&random)
            .arg("--index")
            .arg(index.uri())
            .arg("--report")
            .arg(&report));
        assert_eq!(o.status.code(), Some(0));
        let r: Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
        assert_eq!(r["counts"]["indexed"], 8, "{r}");
        assert_vectors_are(&index, &random, dir.path(), "after a model change");

        // Sparse search: the dot products of the query's vector with the chunks', best first.
        let chunks = index.chunks();
        let chunk_texts: Vec<String> = chunks.iter().map(|c| c.2.clone()).collect();
        let vectors = embed_sparse(&random, &chunk_texts, dir.path());
        for query in [texts[5].as_str(), "the weight of a vocabulary term"] {
            let q = embed_sparse(&random, &[query.to_string()], dir.path()).remove(0);
            let mut expected: Vec<(String, f64)> = chunks
                .iter()
                .zip(&vectors)
                .map(|(c, v)| (c.1.clone(), dot(&q, v)))
                .filter(|(_, s)| *s > 0.0)
                .collect();
            expected.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            expected.truncate(3);
            let hits = search(&index.uri(), query, &["sparse"], 3);
            assert_eq!(hits.len(), expected.len(), "{} {query}", index.name());
            for (h, (id, score)) in hits.iter().zip(&expected) {
                let got = h["score"].as_f64().unwrap();
                assert!(
                    (got - score).abs() <= 1e-4 * score.abs().max(1.0),
                    "{} `{query}`: {} scored {got}, {id} {score} expected",
                    index.name(),
                    h["id"]
                );
            }
            // The best is the best (ties aside).
            assert!(
                hits[0]["id"] == expected[0].0.as_str()
                    || (hits[0]["score"].as_f64().unwrap() - expected[0].1).abs() < 1e-6,
                "{} `{query}`: {} first, {} expected",
                index.name(),
                hits[0]["id"],
                expected[0].0
            );
        }
        if let BackendKind::Postgres(_) = kind {
            eprintln!("postgres: sparse stage and search checked");
        }
    }
}

/// Reciprocal rank fusion as `search` computes it (k = 60), by chunk id.
fn rrf(lists: &[Vec<Value>]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for list in lists {
        for (rank, hit) in list.iter().enumerate() {
            *out.entry(hit["id"].as_str().unwrap().to_string())
                .or_insert(0.0) += 1.0 / (60.0 + rank as f64 + 1.0);
        }
    }
    out
}

/// `eval` reports the sparse and the fused modes beside today's, on an index ingested with
/// the tiny SPLADE; on that index, `search --mode sparse` ranks every chunk by its dot product
/// with the query (checked against all of them), and `--mode hybrid --fuse
/// dense,sparse,keyword` is the reciprocal rank fusion of the three rankings.
#[test]
fn eval_and_search_fuse_sparse_with_dense_and_keyword() {
    let Some(tiny) = splade_tiny() else { return };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("e.db");
    let o = run(crate::index::eval_scifact_mini_with(&model_dir(), &db)
        .args([
            "--modes",
            "vector,keyword,hybrid,sparse,hybrid:dense+sparse+keyword",
            "--sparse-model",
        ])
        .arg(&tiny));
    assert_eq!(o.status.code(), Some(0));
    let rows = stdout_json(&o);
    let names: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["mode"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "vector",
            "keyword",
            "hybrid",
            "sparse",
            "hybrid:dense+sparse+keyword"
        ]
    );
    for r in rows.as_array().unwrap() {
        for m in ["ndcg_at_10", "recall_at_10", "recall_at_100", "mrr_at_10"] {
            let x = r[m].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&x), "{r}");
        }
        eprintln!("{}: nDCG@10 {}", r["mode"], r["ndcg_at_10"]);
    }
    assert!(
        rows[3]["ndcg_at_10"].as_f64().unwrap() > 0.0,
        "the tiny SPLADE finds nothing relevant: {}",
        rows[3]
    );

    let index = TestIndex::Sqlite(db.clone());
    let uri = index.uri();
    let chunks = index.chunks();
    let texts: Vec<String> = chunks.iter().map(|c| c.2.clone()).collect();
    let vectors = embed_sparse(&tiny, &texts, dir.path());
    let queries: Vec<String> =
        read_jsonl(&root().join("tests/fixtures/scifact-mini/queries.jsonl"))
            .iter()
            .take(3)
            .map(|q| q["text"].as_str().unwrap().to_string())
            .collect();
    for query in &queries {
        let q = embed_sparse(&tiny, std::slice::from_ref(query), dir.path()).remove(0);
        let mut all: Vec<f64> = vectors.iter().map(|v| dot(&q, v)).collect();
        all.sort_by(|a, b| b.total_cmp(a));
        let hits = search(&uri, query, &["sparse"], 10);
        assert_eq!(hits.len(), 10);
        for (h, best) in hits.iter().zip(&all) {
            let got = h["score"].as_f64().unwrap();
            assert!(
                (got - best).abs() <= 1e-4 * best.abs().max(1.0),
                "`{query}`: rank {} scored {got}, the {}th best chunk scores {best}",
                h["rank"],
                h["rank"]
            );
        }

        let lists: Vec<Vec<Value>> = ["vector", "sparse", "keyword"]
            .iter()
            .map(|m| search(&uri, query, &[m], 100))
            .collect();
        let fused = rrf(&lists);
        let mut best: Vec<f64> = fused.values().copied().collect();
        best.sort_by(|a, b| b.total_cmp(a));
        let hybrid = search(
            &uri,
            query,
            &["hybrid", "--fuse", "dense,sparse,keyword"],
            10,
        );
        assert_eq!(hybrid.len(), 10);
        for (h, b) in hybrid.iter().zip(&best) {
            let id = h["id"].as_str().unwrap();
            let score = h["score"].as_f64().unwrap();
            assert!((score - fused[id]).abs() < 1e-12, "`{query}`: {id}");
            assert!(
                (score - b).abs() < 1e-12,
                "`{query}`: {id} is not among the best"
            );
        }
        // Fusing the sparse ranking changed something (else --fuse would not be working).
        let plain = search(&uri, query, &["hybrid"], 10);
        let ids = |v: &[Value]| v.iter().map(|h| h["id"].clone()).collect::<Vec<_>>();
        let scores = |v: &[Value]| v.iter().map(|h| h["score"].clone()).collect::<Vec<_>>();
        assert!(ids(&plain) != ids(&hybrid) || scores(&plain) != scores(&hybrid));
    }

    // `serve --index` loads the index's sparse model: its sparse and fused searches answer
    // what `ragline search` does.
    let server = Server::start_args(&["--index", &uri], &[], dir.path(), "sparse-serve");
    let query = &queries[0];
    for (mode, args) in [
        ("sparse", vec!["sparse"]),
        (
            "hybrid:dense%2Bsparse%2Bkeyword",
            vec!["hybrid", "--fuse", "dense,sparse,keyword"],
        ),
    ] {
        let want = search(&uri, query, &args, 10);
        let (status, body) = get(&format!(
            "{}/v1/search?q={}&k=10&mode={mode}",
            server.url,
            url_words(query)
        ));
        assert_eq!(status, 200, "{mode}: {body}");
        let got: Vec<Value> = serde_json::from_str(&body).unwrap();
        assert_eq!(got.len(), want.len(), "{mode}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g["id"], w["id"], "{mode}: {body}");
            let (gs, ws) = (g["score"].as_f64().unwrap(), w["score"].as_f64().unwrap());
            assert!(
                (gs - ws).abs() <= 1e-5 * ws.abs().max(1.0),
                "{mode}: {gs} vs {ws}"
            );
        }
    }
    // The search page offers the sparse modes.
    let (status, page) = get(&format!("{}/?q=x&mode=sparse", server.url));
    assert_eq!(status, 200);
    assert!(page.contains("<option selected>sparse</option>"), "{page}");
    assert!(
        page.contains("<option>hybrid:dense+sparse+keyword</option>"),
        "{page}"
    );
}

/// A query's words for a URL: what is not a letter or digit percent-encoded.
fn url_words(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
