//! The SQLite index's ANN under `kill -9`: during an ingest that updates and deletes, during a
//! build, during a save. After each, search through the ANN equals the exact scan (the log
//! replayed), no deleted chunk comes back, and the next run repairs the file by itself.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ragline::indexers::sqlite::SqliteReader;
use ragline::indexers::synthetic::{Rng, WORDS};

use crate::util::{kill9, model_dir, ragline, run, wait_for};

/// `n` markdown documents of three sections; `version` varies the words. Version 0 and 1
/// documents have the same number of sections, `short` ones one section (re-chunked into
/// fewer chunks: the rest are deleted).
fn write_doc(dir: &Path, i: usize, version: u64, short: bool) {
    let mut rng = Rng((i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (version + 1) | 1);
    let mut word = || WORDS[(rng.next_u64() % WORDS.len() as u64) as usize];
    let mut text = format!("# Document {i}\n\n");
    for s in 0..if short { 1 } else { 3 } {
        text.push_str(&format!("## Section {s}\n\n"));
        let words: Vec<&str> = (0..70).map(|_| word()).collect();
        text.push_str(&words.join(" "));
        text.push_str(".\n\n");
    }
    fs::write(dir.join(format!("doc{i:03}.md")), text).unwrap();
}

fn ingest(db: &Path, corpus: &Path, extra: &[&str]) -> Command {
    let mut cmd = ragline();
    cmd.args([
        "ingest",
        "--progress",
        "none",
        "--device",
        "cpu",
        "--chunk-tokens",
        "64",
    ])
    .args(["--chunk-overlap", "8"])
    .arg("--index")
    .arg(format!("sqlite://{}", db.display()))
    .arg("--model")
    .arg(model_dir())
    .args(extra)
    .arg(corpus);
    cmd
}

fn ok(cmd: &mut Command) {
    let o = run(cmd);
    assert_eq!(o.status.code(), Some(0), "the command failed");
}

fn sql_i64(db: &Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// 100 queries: unit vectors, half of them near chunks' own vectors (taken through the exact
/// scan), so the answers are clustered like real ones.
fn queries(db: &Path) -> Vec<Vec<f32>> {
    let exact = SqliteReader::open(db).unwrap().with_exact(true);
    let mut rng = Rng(12345);
    let mut unit = || rng.unit(384);
    (0..100)
        .map(|_| unit())
        .inspect(|q| assert!(!exact.nearest(q, 1).unwrap().is_empty()))
        .collect()
}

/// Search through the ANN equals the exact scan: recall@10 >= 0.95 over `queries`, every
/// answer a chunk the index holds now with its exact distance. Returns the dirty count seen.
fn ann_equals_exact(db: &Path, queries: &[Vec<f32>]) -> usize {
    // Uniformly random 384-d queries are far from every chunk, where any HNSW needs a wider
    // walk than the ef measured for a corpus's questions gives (0.90-0.94 at it): a wide ef
    // leaves the replay, not the graph's approximation, to these checks.
    let fast = SqliteReader::open(db).unwrap().with_ef(Some(512));
    let exact = SqliteReader::open(db).unwrap().with_exact(true);
    let live: HashSet<i64> = {
        let conn = rusqlite::Connection::open(db).unwrap();
        let mut s = conn
            .prepare("SELECT rowid FROM chunks WHERE embedded != 0")
            .unwrap();
        s.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let (mut hits, mut dirty) = (0, 0);
    for q in queries {
        let (found, stats) = fast
            .nearest_ann(q, 10, None)
            .unwrap()
            .expect("the ANN is usable");
        dirty = stats.dirty;
        let truth = exact.nearest(q, 10).unwrap();
        assert_eq!(found.len(), truth.len());
        let top: HashSet<i64> = truth.iter().map(|t| t.0).collect();
        for (id, _) in &found {
            assert!(
                live.contains(id),
                "chunk {id} is deleted or has no vector, yet returned"
            );
        }
        hits += found.iter().filter(|f| top.contains(&f.0)).count();
    }
    let recall = hits as f64 / (10 * queries.len()) as f64;
    eprintln!("recall@10 {recall:.4} with {dirty} chunks replayed from the log");
    assert!(recall >= 0.95, "recall@10 {recall}");
    dirty
}

/// A folder of 240 documents and where their index goes (the folder lives as long as the
/// returned directory).
fn corpus_of_240() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus");
    fs::create_dir(&corpus).unwrap();
    for i in 0..240 {
        write_doc(&corpus, i, 0, false);
    }
    let db = dir.path().join("rag.db");
    (dir, corpus, db)
}

#[test]
fn kill_9_during_an_ingest_a_build_or_a_save_never_leaves_search_wrong() {
    let (dir, corpus, db) = corpus_of_240();
    // Uniformly random 384-d queries are far from every chunk, where any HNSW needs a wider
    // walk than for a corpus's questions: the graph is tuned for recall 0.99 on held-out
    // vectors, so that it is the replay these checks test, not the default target's margin
    // on the worst-case queries (0.90 at 0.95's ef).
    ok(&mut ingest(
        &db,
        &corpus,
        &["--ann", "hnsw", "--ann-recall", "0.99"],
    ));
    assert_eq!(
        sql_i64(&db, "SELECT COUNT(*) FROM ann WHERE state = 'ready'"),
        1
    );
    let qs = queries(&db);
    assert_eq!(ann_equals_exact(&db, &qs), 0);

    // 1. Killed during an ingest that rewrites 20 documents (10 of them re-chunked shorter:
    // their other chunks are deleted): it commits every batch of 16 items and is held after
    // the eighteenth (288 of its ~330 items, the 220 unchanged documents among them), before
    // its end (where it would have saved the ANN). Documents have 6 chunks here.
    for i in 0..20 {
        write_doc(&corpus, i, 1, i % 2 == 0);
    }
    let log = dir.path().join("ingest.log");
    let mut child = ingest(&db, &corpus, &["--batch-size", "16"])
        .env("FAILPOINTS", "index::batch=18*off->sleep(600000)")
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_for("eighteen batches", Duration::from_secs(600), || {
        sql_i64(&db, "SELECT COUNT(DISTINCT chunk) FROM ann_log") >= 16
    });
    kill9(&mut child);
    let dirty = ann_equals_exact(&db, &qs);
    assert!(
        dirty >= 16,
        "the log holds the killed run's changes: {dirty}"
    );

    // 2. The next run completes the changes and deletes 10 documents (--prune), then its
    // rebuild (another dtype) is killed half-way: readers keep the old file and the log.
    for i in 200..210 {
        fs::remove_file(corpus.join(format!("doc{i:03}.md"))).unwrap();
    }
    let log = dir.path().join("build.log");
    let mut child = ingest(&db, &corpus, &["--prune", "--ann-dtype", "int8"])
        .env("FAILPOINTS", "ann::build-batch=sleep(600000)")
        .env("RAGLINE_LOG", "ragline::indexers::sqlite::ann=info")
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_for("the rebuild", Duration::from_secs(600), || {
        fs::read_to_string(&log).is_ok_and(|l| l.contains("building the ANN (int8)"))
    });
    std::thread::sleep(Duration::from_millis(300));
    kill9(&mut child);
    let documents = sql_i64(&db, "SELECT COUNT(*) FROM documents");
    assert_eq!(documents, 230, "the run pruned before it was killed");
    let dirty = ann_equals_exact(&db, &qs);
    assert!(dirty > 0);

    // 3. The next run (nothing changed) builds it; killed after writing the new file and
    // before recording it: the old file and the log still answer, the orphan goes later.
    let mut child = ingest(&db, &corpus, &[])
        .env("FAILPOINTS", "ann::saved-unrecorded=sleep(600000)")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ann_dir = ragline::indexers::sqlite::ann::dir_of(&db);
    // Graph files (each has its `.vectors` file beside it).
    let files = || {
        fs::read_dir(&ann_dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".usearch"))
                    .count()
            })
            .unwrap_or(0)
    };
    wait_for("the new file", Duration::from_secs(600), || files() >= 2);
    kill9(&mut child);
    ann_equals_exact(&db, &qs);

    // 4. A run with nothing to do repairs everything: one file, int8, an empty log.
    ok(&mut ingest(&db, &corpus, &[]));
    assert_eq!(files(), 1, "the orphan file is gone");
    assert_eq!(sql_i64(&db, "SELECT COUNT(*) FROM ann_log"), 0);
    assert_eq!(
        sql_i64(
            &db,
            "SELECT COUNT(*) FROM ann WHERE state = 'ready' AND dtype = 'int8'"
        ),
        1
    );
    assert_eq!(ann_equals_exact(&db, &qs), 0);
}

/// `ragline status` shows the ef the build measured for the recall target, and `search
/// --explain` says how each search was answered: the graph at that ef (or `--ef`'s), a scan
/// of what a selective filter lets through, or every vector with `--exact`.
#[test]
fn status_shows_the_measured_ef_and_search_explains_its_plan() {
    let (_dir, corpus, db) = corpus_of_240();
    ok(&mut ingest(
        &db,
        &corpus,
        &["--ann", "hnsw", "--ann-recall", "0.9"],
    ));
    let index = format!("sqlite://{}", db.display());
    let json = |args: &[&str]| -> serde_json::Value {
        let o = run(ragline().args(args).args(["--index", &index]));
        assert_eq!(o.status.code(), Some(0));
        serde_json::from_slice(&o.stdout).expect("JSON alone on stdout")
    };
    let status = json(&["status", "--json"]);
    let ann = &status["vector_sets"][0]["ann"];
    assert_eq!(ann["state"], "ready", "{status}");
    assert_eq!(ann["recall_target"], 0.9);
    let ef = ann["ef"].as_u64().unwrap();
    let recall = ann["recall"].as_f64().expect("measured at build");
    assert!(recall >= 0.9, "{ann}");
    assert!((16..=4096).contains(&ef), "{ann}");
    let search = |extra: &[&str]| {
        let mut args = vec![
            "search",
            "effect state render",
            "--mode",
            "vector",
            "--device",
            "cpu",
            "--explain",
            "--json",
        ];
        args.extend_from_slice(extra);
        json(&args)
    };
    let plain = search(&[]);
    let plan = &plain["plan"];
    assert_eq!(plan["index"], "ann", "{plain}");
    assert_eq!(plan["path"], "graph");
    assert_eq!(
        plan["ef"].as_u64(),
        Some(ef),
        "the measured ef is the one searched with"
    );
    assert_eq!(plan["rescored_from"], "vectors-file");
    assert_eq!(plain["hits"].as_array().unwrap().len(), 10);
    assert_eq!(search(&["--ef", "200"])["plan"]["ef"], 200);
    // One document of 240: scoring its chunks beats any walk.
    let one = search(&["--where", "source=*doc007.md"]);
    assert_eq!(one["plan"]["path"], "filter-scan", "{one}");
    assert!(one["plan"]["filtered_to"].as_u64().unwrap() >= 3);
    let exact = search(&["--exact"]);
    assert_eq!(exact["plan"]["index"], "exact");
    // The same hits either way here (a small index searched well past its recall target).
    let ids = |v: &serde_json::Value| -> Vec<String> {
        v["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["id"].as_str().unwrap().to_string())
            .collect()
    };
    let wide = search(&["--ef", "512"]);
    assert_eq!(ids(&wide), ids(&exact));
    // Without --json, the plan is a line of its own.
    let o = run(ragline().args([
        "search",
        "effect state render",
        "--mode",
        "vector",
        "--device",
        "cpu",
        "--explain",
        "--index",
        &index,
    ]));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!("plan: ann, graph at ef {ef}")),
        "{text}"
    );
    // A bad --ef is refused by clap, naming the range.
    let o = run(ragline().args(["search", "x", "--ef", "5", "--index", &index]));
    assert_eq!(o.status.code(), Some(2));
}
