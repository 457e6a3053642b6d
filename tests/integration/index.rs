//! Indexes through the CLI, with the real model: incremental re-runs, edits, pruning, vector
//! reuse and search on every backend that stores (SQLite, and PostgreSQL with
//! `RAGLINE_TEST_POSTGRES`; `backend.rs`), and SQLite's refusals and readers.

use std::fs;
use std::path::Path;

use ragline::indexers::sqlite::SqliteReader;
use serde_json::Value;

use crate::backend::{test_indexes, TestIndex};
use crate::util::{model_dir, ragline, root, run, stdout_json};

fn ingest(corpus: &Path, db: &Path, extra: &[&str]) -> (Option<i32>, Value) {
    ingest_into(
        corpus,
        &format!("sqlite://{}", db.display()),
        &db.with_extension("report.json"),
        extra,
    )
}

/// `ragline ingest` into any index; (exit code, the JSON report).
pub fn ingest_into(
    corpus: &Path,
    uri: &str,
    report: &Path,
    extra: &[&str],
) -> (Option<i32>, Value) {
    let _ = fs::remove_file(report);
    let o = run(ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(model_dir())
        .arg("--index")
        .arg(uri)
        .arg("--report")
        .arg(report)
        .args(extra)
        .arg(corpus));
    let r = fs::read(report)
        .ok()
        .filter(|b| !b.is_empty())
        .map_or(Value::Null, |b| serde_json::from_slice(&b).unwrap());
    (o.status.code(), r)
}

fn corpus(dir: &Path) -> std::path::PathBuf {
    let c = dir.join("corpus");
    fs::create_dir_all(&c).unwrap();
    fs::copy(
        root().join("tests/fixtures/react/useEffect.md"),
        c.join("useEffect.md"),
    )
    .unwrap();
    fs::write(
        c.join("state.md"),
        "---\ntitle: useState\n---\n\n## Usage\n\nuseState lets a component remember values \
         between renders, like the text in an input.\n\n## Caveats\n\nThe set function only \
         changes the value for the next render.\n",
    )
    .unwrap();
    fs::write(
        c.join("routing.md"),
        "# Routing\n\nA router maps URLs to pages.\n",
    )
    .unwrap();
    fs::write(
        c.join("gone.md"),
        "# Gone soon\n\nThis page will be deleted.\n",
    )
    .unwrap();
    c
}

#[test]
fn reruns_are_incremental_edits_redo_one_document_and_prune_deletes() {
    let dir = tempfile::tempdir().unwrap();
    for index in test_indexes(dir.path(), "reruns") {
        eprintln!("=== {}", index.name());
        reruns_on(dir.path(), &index);
    }
}

fn reruns_on(dir: &Path, index: &TestIndex) {
    let c = corpus(&dir.join(index.name()));
    let uri = index.uri();
    let report = dir.join("report.json");
    let ingest = |c: &Path, extra: &[&str]| ingest_into(c, &uri, &report, extra);

    let (code, first) = ingest(&c, &[]);
    assert_eq!(code, Some(0));
    assert_eq!(first["counts"]["indexed"], 4);
    let made = first["counts"]["children_created"].as_u64().unwrap();
    assert!(made > 20);
    assert_eq!(first["chunks_embedded"], made);
    assert_eq!(index.counts(), (4, made, made));
    let before = index.chunks();

    // Unchanged: nothing chunked or embedded, nothing rewritten.
    let (code, second) = ingest(&c, &[]);
    assert_eq!(code, Some(0));
    assert_eq!(second["counts"]["unchanged"], 4);
    assert_eq!(second["counts"]["children_created"], 0);
    assert_eq!(second["chunks_embedded"], 0);
    assert_eq!(index.chunks(), before);

    // One file edited: only its chunks change.
    fs::write(
        c.join("routing.md"),
        "# Routing\n\nA router maps URLs to pages and back.\n",
    )
    .unwrap();
    let (code, third) = ingest(&c, &[]);
    assert_eq!(code, Some(0));
    assert_eq!(third["counts"]["unchanged"], 3);
    assert_eq!(third["counts"]["children_created"], 1);
    let after = index.chunks();
    let others = |v: &[(String, String, String)]| -> Vec<(String, String, String)> {
        v.iter().filter(|c| c.0 != "routing.md").cloned().collect()
    };
    assert_eq!(others(&after), others(&before));
    let routing: Vec<&str> = after
        .iter()
        .filter(|c| c.0 == "routing.md")
        .map(|c| c.2.as_str())
        .collect();
    assert_eq!(
        routing,
        vec!["# Routing\n\nA router maps URLs to pages and back."]
    );

    // A file deleted: reported, and removed only with --prune.
    fs::remove_file(c.join("gone.md")).unwrap();
    let (_, fourth) = ingest(&c, &[]);
    assert_eq!(
        fourth["missing_from_source"],
        serde_json::json!(["gone.md"])
    );
    assert_eq!(fourth["pruned"], 0);
    assert!(index.chunks().iter().any(|c| c.0 == "gone.md"));
    let (_, fifth) = ingest(&c, &["--prune"]);
    assert_eq!(fifth["pruned"], 1);
    assert!(index.chunks().iter().all(|c| c.0 != "gone.md"));
    assert_eq!(index.counts().0, 3);

    // Search by meaning, by keyword and both.
    for mode in ["vector", "keyword", "hybrid"] {
        let o = run(ragline()
            .args([
                "search",
                "remember a value between renders",
                "-k",
                "3",
                "--json",
                "--mode",
                mode,
            ])
            .arg("--index")
            .arg(&uri));
        assert_eq!(o.status.code(), Some(0), "{mode}");
        let hits: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(hits.len(), 3, "{mode}");
        assert_eq!(hits[0]["document_id"], "state.md", "{mode}: {:?}", hits[0]);
        assert_eq!(hits[0]["heading_path"], "useState > Usage", "{mode}");
    }
}

#[test]
fn a_broken_index_path_or_another_model_exits_2_and_leaves_the_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c");
    fs::create_dir(&c).unwrap();
    fs::write(c.join("a.md"), "# A\n\nSome text.\n").unwrap();

    let junk = dir.path().join("junk.db");
    fs::write(&junk, "plain text, not SQLite").unwrap();
    let (code, _) = ingest(&c, &junk, &[]);
    assert_eq!(code, Some(2));
    assert_eq!(fs::read_to_string(&junk).unwrap(), "plain text, not SQLite");

    let (code, _) = ingest(&c, Path::new("/proc/ragline-test.db"), &[]);
    assert_eq!(code, Some(2), "a read-only location");

    // Same index, a model that embeds differently (max_seq_length 128): refused.
    let db = dir.path().join("rag.db");
    assert_eq!(ingest(&c, &db, &[]).0, Some(0));
    let before = fs::read(&db).unwrap();
    let other = dir.path().join("other-model");
    fs::create_dir(&other).unwrap();
    for e in fs::read_dir(model_dir()).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            fs::copy(e.path(), other.join(e.file_name())).unwrap();
        }
    }
    fs::create_dir(other.join("1_Pooling")).unwrap();
    fs::copy(
        model_dir().join("1_Pooling/config.json"),
        other.join("1_Pooling/config.json"),
    )
    .unwrap();
    fs::write(
        other.join("sentence_bert_config.json"),
        "{\"max_seq_length\": 128}",
    )
    .unwrap();
    let o = run(ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(&other)
        .arg("--index")
        .arg(format!("sqlite://{}", db.display()))
        .arg(&c));
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("holds vectors of model") && err.contains("use another --index"),
        "{err}"
    );
    assert_eq!(fs::read(&db).unwrap(), before);
}

/// `ragline bench --write` writes in the batches it is told (`--batch-size`, the ingest's
/// flag), every chunk lands, and a batch of 0 is refused as bad usage.
#[test]
fn bench_write_takes_the_batch_size_and_writes_every_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bench.db");
    let bench = |batch: &str| {
        run(ragline()
            .args(["bench", "--json", "--chunks", "2000", "--writers", "1"])
            .args(["--batch-size", batch, "--write"])
            .arg(format!("sqlite://{}", db.display())))
    };
    let o = bench("300");
    assert_eq!(o.status.code(), Some(0));
    let report = stdout_json(&o);
    assert_eq!(report["batch"], 300, "{report}");
    assert_eq!(report["chunks"], 2000, "{report}");
    let rows: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT count(*) FROM chunks", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 2000);
    assert_eq!(bench("0").status.code(), Some(2));
    // Searched through an ANN under a filter (doc1, doc10..doc19, doc100..doc199: 111 of
    // the 200 documents): k results each time, recall against the filtered exact scan.
    let o = run(ragline()
        .args(["bench", "--json", "--chunks", "0", "--queries", "20"])
        .args(["--ann", "hnsw", "--where", "source=doc1*", "--write"])
        .arg(format!("sqlite://{}", db.display())));
    assert_eq!(o.status.code(), Some(0));
    let report = stdout_json(&o);
    assert_eq!(report["where"][0], "source=doc1*", "{report}");
    assert_eq!(report["search"]["short_answers"], 0, "{report}");
    assert!(report["recall_at_10"].as_f64().unwrap() >= 0.95, "{report}");
    assert!(dir.path().join("bench.db.ann").is_dir());
    let bad = run(ragline()
        .args([
            "bench",
            "--chunks",
            "0",
            "--queries",
            "1",
            "--where",
            "nokey",
            "--write",
        ])
        .arg(format!("sqlite://{}", db.display())));
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--where `nokey`"));
}

/// `ragline eval --truncate --json` of the SciFact slice on the CPU, into an index in `dir`.
fn eval_scifact_mini(dir: &Path) -> std::process::Command {
    eval_scifact_mini_with(&model_dir(), &dir.join("e.db"))
}

/// [`eval_scifact_mini`] with `model`, into the SQLite file `db`.
pub(crate) fn eval_scifact_mini_with(model: &Path, db: &Path) -> std::process::Command {
    let data = root().join("tests/fixtures/scifact-mini");
    let mut cmd = ragline();
    cmd.args(["eval", "--truncate", "--device", "cpu", "--json", "--model"])
        .arg(model)
        .arg("--corpus")
        .arg(data.join("corpus.jsonl"))
        .arg("--queries")
        .arg(data.join("queries.jsonl"))
        .arg("--qrels")
        .arg(data.join("qrels/test.tsv"))
        .arg("--index")
        .arg(format!("sqlite://{}", db.display()));
    cmd
}

/// `ragline eval` on a SciFact slice: with --truncate (each document embedded as
/// sentence-transformers embeds it), vector nDCG@10 within 0.01 of sentence-transformers'
/// (scripts/reference-beir.py); every mode reports all four metrics.
#[test]
fn eval_matches_the_sentence_transformers_reference() {
    let reference: Value = serde_json::from_slice(
        &fs::read(root().join("tests/fixtures/scifact-mini-reference.json")).unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("eval.json");
    let o = run(eval_scifact_mini(dir.path()).arg("--report").arg(&report));
    assert_eq!(o.status.code(), Some(0));
    let scores: Vec<Value> = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    // It ingested the corpus first, and still printed the scores alone on stdout.
    assert!(String::from_utf8_lossy(&o.stderr).contains("corpus ingested"));
    assert_eq!(stdout_json(&o), Value::Array(scores.clone()));
    let modes: Vec<&str> = scores.iter().map(|s| s["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, vec!["vector", "keyword", "hybrid"]);
    for s in &scores {
        assert_eq!(s["queries"], 25);
        for m in ["ndcg_at_10", "recall_at_10", "recall_at_100", "mrr_at_10"] {
            let v = s[m].as_f64().unwrap();
            assert!(v > 0.3 && v <= 1.0, "{}: {m} = {v}", s["mode"]);
        }
    }
    let ours = scores[0]["ndcg_at_10"].as_f64().unwrap();
    let theirs = reference["ndcg_at_10"].as_f64().unwrap();
    eprintln!("vector nDCG@10: ragline {ours:.4}, sentence-transformers {theirs:.4}");
    assert!(
        (ours - theirs).abs() <= 0.01,
        "ragline {ours} vs sentence-transformers {theirs}"
    );
}

/// The same SciFact slice with the CPU's bf16 and int8 dense layers (where the CPU has
/// AVX512-BF16 / VNNI): vector nDCG@10 within 0.01 of sentence-transformers' f32 (the full
/// SciFact figures, within 0.005, are in BENCHMARKS.md: on 25 queries one swapped rank moves
/// nDCG by more than that).
#[test]
fn eval_in_bf16_and_int8_stays_near_f32() {
    use ragline::embed::cpu::kernels::features;
    let reference: Value = serde_json::from_slice(
        &fs::read(root().join("tests/fixtures/scifact-mini-reference.json")).unwrap(),
    )
    .unwrap();
    let theirs = reference["ndcg_at_10"].as_f64().unwrap();
    let f = features();
    let mut ran = 0;
    for (dtype, has) in [("bf16", f.avx512_bf16), ("int8", f.avx512_vnni)] {
        if !has {
            eprintln!(
                "skipped {dtype}: this CPU lacks the instructions (refusal tested in embedding.rs)"
            );
            continue;
        }
        ran += 1;
        let dir = tempfile::tempdir().unwrap();
        let o = run(eval_scifact_mini(dir.path()).args(["--modes", "vector", "--dtype", dtype]));
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let scores = stdout_json(&o);
        let ours = scores[0]["ndcg_at_10"].as_f64().unwrap();
        eprintln!(
            "{dtype} vector nDCG@10: ragline {ours:.4}, sentence-transformers f32 {theirs:.4}"
        );
        assert!(
            (ours - theirs).abs() <= 0.01,
            "{dtype}: ragline {ours} vs {theirs}"
        );
    }
    eprintln!("{ran} low precisions evaluated");
}

/// Readers work while an ingest writes (WAL): a reader holds one read transaction open for
/// the whole of a second ingest (so the ingest certainly writes while it reads, whatever the
/// speed of the machine); its reads succeed and see a stable snapshot, and the ingest is not
/// blocked. After, a new read sees everything.
#[test]
fn readers_work_while_an_ingest_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    fs::create_dir(&first).unwrap();
    fs::create_dir(&second).unwrap();
    let page = fs::read_to_string(root().join("tests/fixtures/react/useEffect.md")).unwrap();
    fs::write(
        first.join("a.md"),
        "# First\n\nAn effect runs after render.\n",
    )
    .unwrap();
    for i in 0..2 {
        fs::write(
            second.join(format!("copy{i}.md")),
            format!("{page}\n\nCopy {i}.\n"),
        )
        .unwrap();
    }
    let db = dir.path().join("rag.db");
    let ingest = |path: &Path| {
        let mut cmd = ragline();
        cmd.args([
            "ingest",
            "--progress",
            "none",
            "--device",
            "cpu",
            "--batch-size",
            "16",
        ])
        .arg("--model")
        .arg(model_dir())
        .arg("--index")
        .arg(format!("sqlite://{}", db.display()))
        .arg(path);
        cmd
    };
    assert!(run(&mut ingest(&first)).status.success());

    let reader = SqliteReader::open(&db).unwrap();
    let conn =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    conn.execute_batch("BEGIN").unwrap();
    let count = || -> i64 {
        conn.query_row("SELECT COUNT(*) FROM chunks", [], |r| r.get(0))
            .expect("a read during the ingest failed")
    };
    let before = count();
    let mut child = ingest(&second)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut reads = 0;
    loop {
        assert_eq!(count(), before, "a read transaction sees one snapshot");
        reader
            .keyword("effect", 5)
            .expect("a search during the ingest failed");
        reads += 1;
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        child.wait().unwrap().success(),
        "the ingest finished while a reader held its snapshot"
    );
    assert_eq!(
        count(),
        before,
        "still the snapshot, after the ingest committed"
    );
    conn.execute_batch("COMMIT").unwrap();
    let (_, chunks, vectors) = SqliteReader::open(&db).unwrap().counts().unwrap();
    assert!(chunks > before as u64 && chunks == vectors);
    eprintln!("{reads} reads during the ingest; {before} chunks before, {chunks} after");
}

#[test]
fn edits_and_moves_reuse_the_vectors_of_unchanged_chunks() {
    let dir = tempfile::tempdir().unwrap();
    for index in test_indexes(dir.path(), "reuse") {
        eprintln!("=== {}", index.name());
        reuse_on(dir.path(), &index);
    }
}

fn reuse_on(dir: &Path, index: &TestIndex) {
    let uri = index.uri();
    let report = dir.join("report.json");
    let ingest = |c: &Path, extra: &[&str]| ingest_into(c, &uri, &report, extra);
    let c = dir.join(index.name()).join("corpus");
    fs::create_dir_all(&c).unwrap();
    let page = fs::read_to_string(root().join("tests/fixtures/react/useEffect.md")).unwrap();
    fs::write(c.join("useEffect.md"), &page).unwrap();
    let (code, first) = ingest(&c, &[]);
    assert_eq!(code, Some(0));
    let made = first["counts"]["children_created"].as_u64().unwrap();
    assert!(made > 20);
    assert_eq!(first["chunks_embedded"], made);
    assert_eq!(first["chunks_reused"], 0);
    let before = index.vectors();

    // Edit one section: only the chunks whose text changed are embedded; the others take
    // their vectors from the index.
    let heading = "### My Effect runs twice when the component mounts";
    assert!(page.contains(heading));
    let edited = page.replacen(heading, &format!("{heading} in development"), 1);
    fs::write(c.join("useEffect.md"), edited).unwrap();
    let (code, second) = ingest(&c, &[]);
    assert_eq!(code, Some(0));
    let after = index.vectors();
    let old_texts: std::collections::HashSet<&str> = before.iter().map(|v| v.1.as_str()).collect();
    let new_texts = after
        .iter()
        .filter(|v| !old_texts.contains(v.1.as_str()))
        .count() as u64;
    let created = second["counts"]["children_created"].as_u64().unwrap();
    assert!(
        (1..created).contains(&new_texts),
        "{new_texts} of {created}"
    );
    assert_eq!(second["chunks_embedded"], new_texts);
    assert_eq!(second["chunks_reused"], created - new_texts);
    // A reused vector is the one the index held for that text.
    let old_vector: std::collections::HashMap<&str, &Vec<f32>> =
        before.iter().map(|v| (v.1.as_str(), &v.2)).collect();
    for (_, text, vector) in &after {
        if let Some(old) = old_vector.get(text.as_str()) {
            assert_eq!(*old, vector, "{text:.60}");
        }
    }

    // Move the file: a new document, nothing embedded, the same vectors.
    fs::rename(c.join("useEffect.md"), c.join("effects.md")).unwrap();
    let (code, third) = ingest(&c, &["--prune"]);
    assert_eq!(code, Some(0));
    assert_eq!(third["pruned"], 1);
    assert_eq!(third["chunks_embedded"], 0);
    assert_eq!(third["chunks_reused"], third["counts"]["children_created"]);
    let moved = index.vectors();
    assert!(moved.iter().all(|v| v.0 == "effects.md"));
    let strip = |v: &[(String, String, Vec<f32>)]| -> Vec<(String, Vec<u32>)> {
        let mut x: Vec<_> = v
            .iter()
            .map(|v| (v.1.clone(), v.2.iter().map(|f| f.to_bits()).collect()))
            .collect();
        x.sort();
        x
    };
    assert_eq!(strip(&moved), strip(&after));
}

#[test]
fn identical_chunks_are_embedded_once_per_run() {
    let dir = tempfile::tempdir().unwrap();
    for index in test_indexes(dir.path(), "identical") {
        eprintln!("=== {}", index.name());
        identical_on(dir.path(), &index);
    }
}

fn identical_on(dir: &Path, index: &TestIndex) {
    let c = dir.join(index.name()).join("corpus");
    fs::create_dir_all(&c).unwrap();
    // Two copies of a page, and a page that repeats one section three times.
    let page = fs::read_to_string(root().join("tests/fixtures/react/useEffect.md")).unwrap();
    fs::write(c.join("a.md"), &page).unwrap();
    fs::write(c.join("b.md"), &page).unwrap();
    let section = "## Sandbox\n\nThe same example, shown again: press Play to start the \
                   video, press Pause to stop it. The Effect keeps the player in sync.\n\n";
    fs::write(
        c.join("repeats.md"),
        format!("# Repeats\n\n{}", section.repeat(3)),
    )
    .unwrap();
    let (code, report) = ingest_into(&c, &index.uri(), &dir.join("report.json"), &[]);
    assert_eq!(code, Some(0));

    let rows = index.vectors();
    let created = report["counts"]["children_created"].as_u64().unwrap();
    assert_eq!(rows.len() as u64, created);
    let distinct = index.distinct_input_keys();
    // b.md repeats all of a.md, and two of the three sections of repeats.md are alike.
    assert!(distinct <= created / 2 + 1, "{distinct} of {created}");
    assert_eq!(report["chunks_embedded"], distinct);
    assert_eq!(report["chunks_reused"], created - distinct);
    // Every copy carries the vector of its original.
    let mut by_text: std::collections::HashMap<&str, &Vec<f32>> = Default::default();
    for (_, text, vector) in &rows {
        assert_eq!(*by_text.entry(text.as_str()).or_insert(vector), vector);
    }
}
