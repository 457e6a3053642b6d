//! The enrichment lifecycle through the CLI: deferred embedding, enrich killed and resumed,
//! two enrich processes at once, retries and the dead-letter queue, priority, pause/resume,
//! edits, a model migration, and `ragline check`. The real model where the acceptance is
//! about embedding; small random-weight models where it is about the queue (they make the
//! same calls, only faster).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::backend::{backend_kinds, TestIndex};
use crate::util::{kill9, model_dir, ragline, random_model, root, run, stdout_json, wait_for};

/// `ragline COMMAND --index URI ARGS...`.
fn rag(ix: &TestIndex, args: &[&str]) -> Command {
    rag_uri(&ix.uri(), args)
}

fn rag_uri(uri: &str, args: &[&str]) -> Command {
    let mut cmd = ragline();
    cmd.arg(args[0]).arg("--index").arg(uri).args(&args[1..]);
    cmd
}

fn ok(cmd: &mut Command) -> Output {
    let o = run(cmd);
    assert_eq!(o.status.code(), Some(0), "the command failed");
    o
}

fn status(db: &TestIndex) -> Value {
    stdout_json(&ok(&mut rag(db, &["status", "--json"])))
}

fn report(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

fn ingest_args<'a>(model: &'a Path, extra: &[&'a str]) -> Vec<String> {
    let mut a: Vec<String> = ["ingest", "--progress", "none", "--device", "cpu", "--model"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.push(model.display().to_string());
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn ingest(db: &TestIndex, model: &Path, corpus: &Path, extra: &[&str]) -> Output {
    let args = ingest_args(model, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(rag(db, &args).arg(corpus))
}

/// The useEffect page cut into one file per `##` section: ~100 chunks in 8+ documents.
pub(crate) fn sectioned_corpus(dir: &Path) -> PathBuf {
    let c = dir.join("corpus");
    fs::create_dir_all(&c).unwrap();
    let page = fs::read_to_string(root().join("tests/fixtures/react/useEffect.md")).unwrap();
    let mut n = 0;
    for (i, part) in page.split("\n## ").enumerate() {
        let text = if i == 0 {
            part.to_string()
        } else {
            format!("## {part}")
        };
        // Long sections in halves, so that no document is much bigger than a claim.
        let half = text.len() / 2;
        let cut = text[half..].find("\n\n").map_or(text.len(), |p| half + p);
        for piece in [&text[..cut], &text[cut..]] {
            if piece.trim().len() > 40 {
                fs::write(c.join(format!("part{n:02}.md")), piece).unwrap();
                n += 1;
            }
        }
    }
    assert!(n >= 8, "{n} parts");
    c
}

/// `n` documents of `paragraphs` paragraphs each, every word unique to its document;
/// documents in `marked` also hold `marker`.
fn synthetic_corpus(
    dir: &Path,
    n: usize,
    paragraphs: usize,
    marked: &[usize],
    marker: &str,
) -> PathBuf {
    let c = dir.join("synthetic");
    fs::create_dir_all(&c).unwrap();
    for d in 0..n {
        let mut text = format!("# Document {d}\n\n");
        for p in 0..paragraphs {
            text.push_str(&format!(
                "Paragraph {p} of document {d} talks about item{d}x{p} and thing{d}y{p} at \
                 length, so that it fills a small chunk of its own with words.\n\n"
            ));
        }
        if marked.contains(&d) {
            text.push_str(&format!("This one mentions {marker}.\n"));
        }
        fs::write(c.join(format!("doc{d:03}.md")), text).unwrap();
    }
    c
}

/// Every (chunk id -> vector) of the active set.
fn vectors(db: &TestIndex) -> HashMap<String, Vec<f32>> {
    db.vectors_with_ids()
        .into_iter()
        .map(|(_, id, _, v)| (id, v))
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (n(a) * n(b)).max(1e-12)
}

/// The `k` best chunk ids of a vector search.
fn top(db: &TestIndex, query: &str, k: usize) -> Vec<(String, f64)> {
    let o = ok(rag(
        db,
        &[
            "search", query, "--mode", "vector", "--json", "--device", "cpu",
        ],
    )
    .args(["-k", &k.to_string()]));
    stdout_json(&o)
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["id"].as_str().unwrap().to_string(),
                h["score"].as_f64().unwrap(),
            )
        })
        .collect()
}

const QUERIES: [&str; 3] = [
    "how do I run code after render",
    "cleanup function when the component unmounts",
    "fetching data in an effect",
];

/// `FAILPOINTS` for an `enrich` or `backfill` to kill part way: it commits after every batch and
/// stops for good (until killed) right after the first commit that finishes a document.
const HOLD_AFTER_A_DOCUMENT: &str = "enrich::commit-each=return;enrich::done=sleep(600000)";

/// Crash and resume: a deferred ingest, then `enrich` killed with SIGKILL part way; status
/// shows the split and vector search covers what is embedded; a second `enrich` completes it
/// with little work done twice. The result searches like a plain ingest of the corpus.
#[test]
fn enrich_killed_part_way_is_completed_by_the_next_enrich() {
    for kind in backend_kinds() {
        enrich_killed_part_way_on(&kind);
    }
}

fn enrich_killed_part_way_on(kind: &crate::backend::BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let corpus = sectioned_corpus(dir.path());
    let (plain, db) = (
        kind.index(dir.path(), "killed_plain"),
        kind.index(dir.path(), "killed_deferred"),
    );
    let model = model_dir();
    ingest(&plain, &model, &corpus, &[]);
    let o = ingest(&db, &model, &corpus, &["--defer", "embed"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("0 embedded"));
    let s = status(&db);
    let (docs, chunks) = (
        s["documents"].as_u64().unwrap(),
        s["chunks"].as_u64().unwrap(),
    );
    assert_eq!(s["stages"]["embed"]["pending"], docs);
    assert_eq!(s["vector_sets"][0]["embedded"], 0);
    // Keyword search works at once.
    let o = ok(&mut rag(
        &db,
        &[
            "search",
            "cleanup",
            "--mode",
            "keyword",
            "--json",
            "--no-promote",
        ],
    ));
    assert!(!stdout_json(&o).as_array().unwrap().is_empty());

    let log = dir.path().join("first.log");
    // Committing after every batch, and held for good after the first commit that finishes a
    // document: the kill comes part way on any machine (the last batch, the longest chunks,
    // holds fewer chunks than the corpus has documents, so some finish before it).
    let mut first = rag(&db, &["enrich", "--progress", "log", "--device", "cpu"])
        .env("RAGLINE_PROGRESS_EVERY_MS", "100")
        .env("FAILPOINTS", HOLD_AFTER_A_DOCUMENT)
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let embedded = |s: &Value| s["vector_sets"][0]["embedded"].as_u64().unwrap();
    wait_for("a document embedded", Duration::from_secs(600), || {
        status(&db)["stages"]["embed"]["done"].as_u64().unwrap() >= 1
    });
    kill9(&mut first);
    let s = status(&db);
    let at_kill = embedded(&s);
    let e = &s["stages"]["embed"];
    eprintln!("at the kill: {at_kill} of {chunks} chunks embedded; embed = {e}");
    assert!(at_kill < chunks, "killed too late to show a split");
    assert!(e["done"].as_u64().unwrap() >= 1);
    assert!(e["pending"].as_u64().unwrap() + e["in_progress"].as_u64().unwrap() >= 1);
    // A partly enriched index: vector search answers from what is embedded, and says so.
    let o = ok(&mut rag(
        &db,
        &[
            "search",
            QUERIES[0],
            "--mode",
            "vector",
            "--device",
            "cpu",
            "--no-promote",
        ],
    ));
    let note = String::from_utf8_lossy(&o.stderr);
    assert!(
        note.contains(&format!(
            "{} of {chunks} chunks not embedded yet",
            chunks - at_kill
        )),
        "{note}"
    );
    // What the first run had embedded when it was killed (its last progress line).
    let first_embedded: u64 = fs::read_to_string(&log)
        .unwrap()
        .lines()
        .rev()
        .find_map(|l| {
            let (before, _) = l.split_once(" embedded ")?;
            before.rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or(0);

    let rep = dir.path().join("second.json");
    let o = ok(rag(
        &db,
        &[
            "enrich",
            "--progress",
            "none",
            "--device",
            "cpu",
            "--report",
        ],
    )
    .arg(&rep));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("took over")
            || String::from_utf8_lossy(&o.stdout).contains("enriched")
    );
    let second = report(&rep);
    let s = status(&db);
    assert_eq!(embedded(&s), chunks, "every chunk has its vector");
    assert_eq!(s["stages"]["embed"]["done"], docs);
    assert_eq!(vectors(&db).len() as u64, chunks);
    // Work done twice: what the first run computed and never committed. One commit's worth
    // at most (a second of embedding and a batch): a few percent of this small corpus, under
    // 2% of react-docs (BENCHMARKS.md).
    let both = first_embedded
        + second["chunks_embedded"].as_u64().unwrap()
        + second["chunks_reused"].as_u64().unwrap();
    eprintln!(
        "first run embedded >= {first_embedded}, second {} (+{} reused), chunks {chunks}",
        second["chunks_embedded"], second["chunks_reused"]
    );
    assert!(both >= chunks - at_kill.min(chunks));
    assert!(
        both <= chunks + chunks / 50 + 30,
        "{both} chunks embedded for {chunks}: more than a commit's worth done twice"
    );
    // Search results equal a plain ingest's.
    let reference = vectors(&plain);
    for (id, v) in vectors(&db) {
        let c = cosine(&v, &reference[&id]);
        assert!(c > 0.99999, "{id}: cosine {c}");
    }
    for q in QUERIES {
        let (a, b) = (top(&db, q, 5), top(&plain, q, 5));
        let ids = |x: &[(String, f64)]| x.iter().map(|h| h.0.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&a), ids(&b), "{q}");
        for (x, y) in a.iter().zip(&b) {
            assert!((x.1 - y.1).abs() < 1e-4, "{q}: {x:?} vs {y:?}");
        }
    }
}

/// Two `enrich` processes on one index share the work: both make progress, no chunk is
/// embedded twice, and the vectors are those of a single run.
#[test]
fn two_enrich_processes_share_the_work_without_doing_any_twice() {
    for kind in backend_kinds() {
        two_enrich_processes_on(&kind);
    }
}

fn two_enrich_processes_on(kind: &crate::backend::BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let corpus = sectioned_corpus(dir.path());
    let (db, single) = (
        kind.index(dir.path(), "two_enrich"),
        kind.index(dir.path(), "one_enrich"),
    );
    let model = model_dir();
    ingest(&db, &model, &corpus, &["--defer", "embed"]);
    ingest(&single, &model, &corpus, &["--defer", "embed"]);
    let chunks = status(&db)["chunks"].as_u64().unwrap();
    let docs = status(&db)["documents"].as_u64().unwrap();

    let spawn = |name: &str| {
        let rep = dir.path().join(format!("{name}.json"));
        let child = rag(
            &db,
            &[
                "enrich",
                "--progress",
                "none",
                "--device",
                "cpu",
                "--report",
            ],
        )
        .arg(&rep)
        .stdout(Stdio::null())
        .stderr(fs::File::create(dir.path().join(format!("{name}.err"))).unwrap())
        .spawn()
        .unwrap();
        (child, rep)
    };
    let (mut a, ra) = spawn("a");
    let (mut b, rb) = spawn("b");
    let (sa, sb) = (a.wait().unwrap(), b.wait().unwrap());
    for name in ["a", "b"] {
        eprintln!(
            "--- {name}: {}",
            fs::read_to_string(dir.path().join(format!("{name}.err"))).unwrap()
        );
    }
    assert!(sa.success() && sb.success(), "{sa:?} {sb:?}");
    let (ra, rb) = (report(&ra), report(&rb));
    for r in [&ra, &rb] {
        assert!(
            r["counts"]["indexed"].as_u64().unwrap() >= 1,
            "each process made progress: {r}"
        );
    }
    let sum = |k: &str| ra[k].as_u64().unwrap() + rb[k].as_u64().unwrap();
    let written = ra["counts"]["children_indexed"].as_u64().unwrap()
        + rb["counts"]["children_indexed"].as_u64().unwrap();
    eprintln!(
        "a: {} docs, {} embedded; b: {} docs, {} embedded; {chunks} chunks",
        ra["counts"]["indexed"],
        ra["chunks_embedded"],
        rb["counts"]["indexed"],
        rb["chunks_embedded"]
    );
    assert_eq!(
        sum("chunks_embedded") + sum("chunks_reused"),
        chunks,
        "every chunk got one vector, computed or copied, once"
    );
    assert_eq!(written, chunks, "every vector written once");
    assert_eq!(
        ra["counts"]["indexed"].as_u64().unwrap() + rb["counts"]["indexed"].as_u64().unwrap(),
        docs,
        "no document was claimed by both"
    );
    ok(&mut rag(
        &single,
        &["enrich", "--progress", "none", "--device", "cpu"],
    ));
    let (two, one) = (vectors(&db), vectors(&single));
    assert_eq!(two.len() as u64, chunks);
    for (id, v) in &two {
        let c = cosine(v, &one[id]);
        assert!(c > 0.99999, "{id}: cosine {c}");
    }
}

/// The `embed` stage of a document's lifecycle, as `ragline dlq show DOC --json` reports it.
fn embed_lifecycle(config: &Path, db: &TestIndex, doc: &str) -> Value {
    let shown = stdout_json(&ok(&mut with_config(
        config,
        db,
        &["dlq", "show", doc, "--json"],
    )));
    shown["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == "embed")
        .unwrap()
        .clone()
}

/// A pipeline file for the fast lifecycle tests: the random model, quick retries.
fn quick_config(dir: &Path, model: &Path, extra: &str) -> PathBuf {
    let path = dir.join("ragline.toml");
    fs::write(
        &path,
        format!(
            "[model]\nname = \"{}\"\ndevice = \"cpu\"\n\n[run]\nprogress = \"none\"\n\n\
             [stages.embed]\nretry_limit = 3\nbackoff = \"50ms\"\nmax_backoff = \"100ms\"\n{extra}",
            model.display()
        ),
    )
    .unwrap();
    path
}

/// `ragline --config FILE COMMAND --index URI ARGS...`.
fn with_config(config: &Path, db: &TestIndex, args: &[&str]) -> Command {
    let mut cmd = ragline();
    cmd.arg("--config")
        .arg(config)
        .arg(args[0])
        .arg("--index")
        .arg(db.uri())
        .args(&args[1..]);
    cmd
}

/// Poison documents: three documents whose embedding always fails retry with backoff, then
/// go dead with every attempt's error; the rest are done. With the fault gone, `dlq requeue
/// --all` and `enrich` complete them. (Needs the `failpoints` build: scripts/test.sh.)
#[cfg(feature = "failpoints")]
#[test]
fn poison_documents_retry_with_backoff_go_dead_and_come_back_when_requeued() {
    for kind in backend_kinds() {
        poison_documents_on(&kind);
    }
}

#[cfg(feature = "failpoints")]
fn poison_documents_on(kind: &crate::backend::BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 1);
    let config = quick_config(dir.path(), &model, "");
    let corpus = synthetic_corpus(dir.path(), 12, 3, &[2, 5, 7], "xyzzy");
    let db = kind.index(dir.path(), "poison");
    ok(with_config(&config, &db, &["ingest", "--defer", "embed"]).arg(&corpus));
    let rep = dir.path().join("r.json");
    let o = run(with_config(&config, &db, &["enrich", "--report"])
        .arg(&rep)
        .env("FAILPOINTS", "embed::document=return(xyzzy)"));
    assert_eq!(o.status.code(), Some(1), "failures exit 1");
    let r = report(&rep);
    let failed: Vec<&str> = r["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    assert_eq!(failed, ["doc002.md", "doc005.md", "doc007.md"]);
    assert!(r["failures"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("dead-lettered"));
    let s = status(&db);
    assert_eq!(s["stages"]["embed"]["dead"], 3);
    assert_eq!(s["stages"]["embed"]["done"], 9);
    let dlq = stdout_json(&ok(&mut with_config(
        &config,
        &db,
        &["dlq", "list", "--json"],
    )));
    assert_eq!(dlq.as_array().unwrap().len(), 3);
    let embed = embed_lifecycle(&config, &db, "doc005.md");
    assert_eq!(embed["status"], "dead");
    let errors = embed["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 3, "every attempt's error");
    for (i, e) in errors.iter().enumerate() {
        assert_eq!(e["attempt"], i as u64 + 1);
        assert!(e["message"].as_str().unwrap().contains("injected failure"));
    }
    // Retried after a backoff: at least half the configured delay between attempts.
    let at: Vec<i64> = errors.iter().map(|e| e["at"].as_i64().unwrap()).collect();
    assert!(at[1] - at[0] >= 25 && at[2] - at[1] >= 25, "{at:?}");
    let text = String::from_utf8_lossy(
        &ok(&mut with_config(
            &config,
            &db,
            &["dlq", "show", "doc005.md"],
        ))
        .stdout,
    )
    .to_string();
    assert!(
        text.contains("attempt 3") && text.contains("injected failure"),
        "{text}"
    );

    // The fault is fixed: requeue and enrich.
    let o = ok(&mut with_config(&config, &db, &["dlq", "requeue", "--all"]));
    assert!(String::from_utf8_lossy(&o.stdout).contains("3 documents queued again"));
    ok(&mut with_config(&config, &db, &["enrich"]));
    let s = status(&db);
    assert_eq!(
        (
            s["stages"]["embed"]["dead"].as_u64(),
            s["stages"]["embed"]["done"].as_u64()
        ),
        (Some(0), Some(12))
    );
    assert_eq!(s["vector_sets"][0]["embedded"], s["chunks"]);
}

/// Priority: with about 2,000 chunks pending, the documents a keyword search hits while
/// their embedding is pending are embedded first.
#[test]
fn documents_a_search_hits_while_pending_are_embedded_first() {
    for kind in backend_kinds() {
        documents_a_search_hits_on(&kind);
    }
}

fn documents_a_search_hits_on(kind: &crate::backend::BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 2);
    let config = quick_config(dir.path(), &model, "");
    let corpus = synthetic_corpus(dir.path(), 100, 20, &[71, 83, 95], "zebraquartz");
    let db = kind.index(dir.path(), "priority");
    ok(with_config(
        &config,
        &db,
        &[
            "ingest",
            "--defer",
            "embed",
            "--chunk-tokens",
            "32",
            "--chunk-overlap",
            "4",
        ],
    )
    .arg(&corpus));
    let pending = status(&db)["chunks"].as_u64().unwrap();
    assert!(pending >= 2000, "{pending} chunks");
    let o = ok(&mut with_config(
        &config,
        &db,
        &["search", "zebraquartz", "--mode", "keyword"],
    ));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("3 matching documents not embedded yet"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    ok(&mut with_config(&config, &db, &["enrich"]));
    // The claim order, from the documents' lifecycle (`ragline dlq show` prints it too).
    let show = |doc: &str| -> (i64, i64, String) {
        let e = embed_lifecycle(&config, &db, doc);
        (
            e["claim_seq"].as_i64().unwrap(),
            e["claimed_at"].as_i64().unwrap(),
            e["priority"].as_str().unwrap().to_string(),
        )
    };
    let promoted: Vec<(i64, i64, String)> = ["doc071.md", "doc083.md", "doc095.md"]
        .iter()
        .map(|d| show(d))
        .collect();
    for p in &promoted {
        assert_eq!(p.2, "interactive");
    }
    let others = "FROM enrichment
         WHERE stage = 'embed' AND document_id NOT IN ('doc071.md', 'doc083.md', 'doc095.md')";
    let first_other_seq = db.count(
        &format!("SELECT MIN(claim_seq) {others}"),
        &format!(
            "SELECT MIN(claim_seq) {}",
            others.replace("FROM ", "FROM {s}.")
        ),
    );
    let first_other_at = db.count(
        &format!("SELECT MIN(claimed_at) {others}"),
        &format!(
            "SELECT MIN(claimed_at) {}",
            others.replace("FROM ", "FROM {s}.")
        ),
    );
    eprintln!(
        "promoted: {promoted:?}; first other claim: seq {first_other_seq} at {first_other_at}"
    );
    for p in &promoted {
        assert!(
            p.0 < first_other_seq,
            "{p:?} claimed after seq {first_other_seq}"
        );
        assert!(p.1 <= first_other_at);
    }
}

/// Pause/resume with `enrich --follow` running: nothing is claimed while paused; work goes
/// on after; new documents arriving are picked up; every chunk is embedded exactly once.
#[test]
fn a_paused_stage_is_not_claimed_by_a_following_worker_until_resumed() {
    for kind in backend_kinds() {
        a_paused_stage_on(&kind);
    }
}

fn a_paused_stage_on(kind: &crate::backend::BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 3);
    let config = quick_config(dir.path(), &model, "");
    let first = synthetic_corpus(&dir.path().join("a"), 10, 4, &[], "");
    let db = kind.index(dir.path(), "paused");
    ok(with_config(&config, &db, &["ingest", "--defer", "embed"]).arg(&first));
    ok(&mut with_config(&config, &db, &["pause", "embed"]));
    assert_eq!(status(&db)["stages"]["embed"]["paused"], true);
    let rep = dir.path().join("follow.json");
    let log = dir.path().join("follow.log");
    let mut follow = with_config(&config, &db, &["enrich", "--follow", "--report"])
        .arg(&rep)
        .env("RAGLINE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // The worker has asked for work and been told the stage is paused (it logs that once it
    // has): had it claimed, the claim would be in the store by now.
    wait_for(
        "the worker to find the stage paused",
        Duration::from_secs(120),
        || fs::read_to_string(&log).is_ok_and(|l| l.contains("a stage is paused")),
    );
    let claimed = |db: &TestIndex| -> i64 {
        db.count(
            "SELECT COUNT(*) FROM enrichment WHERE stage = 'embed' AND claimed_at IS NOT NULL",
            "SELECT count(*) FROM {s}.enrichment WHERE stage = 'embed' AND claimed_at IS NOT NULL",
        )
    };
    assert_eq!(claimed(&db), 0, "claimed while paused");
    let s = status(&db);
    assert_eq!(s["stages"]["embed"]["pending"], 10);
    ok(&mut with_config(&config, &db, &["resume", "embed"]));
    wait_for(
        "the first corpus embedded",
        Duration::from_secs(120),
        || status(&db)["stages"]["embed"]["done"] == 10,
    );
    // New work arriving while it follows (ids `synthetic/docNNN.md`: other documents).
    synthetic_corpus(&dir.path().join("b"), 5, 5, &[], "");
    ok(with_config(&config, &db, &["ingest", "--defer", "embed"]).arg(dir.path().join("b")));
    wait_for(
        "the second corpus embedded",
        Duration::from_secs(120),
        || status(&db)["stages"]["embed"]["done"] == 15,
    );
    kill9(&mut follow);
    let s = status(&db);
    assert_eq!(s["vector_sets"][0]["embedded"], s["chunks"]);
    let twice = db.count(
        "SELECT COUNT(*) FROM enrichment WHERE stage = 'embed' AND attempts != 1",
        "SELECT count(*) FROM {s}.enrichment WHERE stage = 'embed' AND attempts <> 1",
    );
    assert_eq!(twice, 0, "every document claimed once");
}

/// Embed `texts` with `model` (`ragline embed`).
#[cfg(feature = "failpoints")]
fn embed_texts(dir: &Path, model: &Path, texts: &[String]) -> Vec<Vec<f32>> {
    let input = dir.join("texts.jsonl");
    let out = dir.join("vectors.jsonl");
    fs::write(
        &input,
        texts
            .iter()
            .map(|t| serde_json::to_string(t).unwrap() + "\n")
            .collect::<String>(),
    )
    .unwrap();
    ok(ragline()
        .args(["embed", "--device", "cpu", "--model"])
        .arg(model)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&out));
    crate::util::read_jsonl(&out)
        .iter()
        .map(|v| {
            v["vector"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

/// Every chunk row that has a vector (old versions kept for search included) carries the
/// vector of its own text.
#[cfg(feature = "failpoints")]
fn assert_vectors_match_texts(dir: &Path, db: &TestIndex, model: &Path) -> usize {
    let rows = db.texts_and_vectors();
    let texts: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let expected = embed_texts(dir, model, &texts);
    for ((text, got), want) in rows.iter().zip(&expected) {
        let c = cosine(got, want);
        assert!(
            c > 0.9999,
            "the vector of {text:.60} is not its text's: cosine {c}"
        );
    }
    rows.len()
}

/// Edits: a document edited while its embedding is pending is embedded for its new text; one
/// edited while dead is fresh work again; one edited after it was embedded keeps its old
/// version searchable until the new one is embedded. No vector ever stands for other text.
#[cfg(feature = "failpoints")]
#[test]
fn edits_requeue_the_right_work_and_no_vector_serves_other_text() {
    for kind in backend_kinds() {
        edits_requeue_on(&kind);
    }
}

#[cfg(feature = "failpoints")]
fn edits_requeue_on(kind: &crate::backend::BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 4);
    let config = quick_config(dir.path(), &model, "");
    let corpus = synthetic_corpus(dir.path(), 6, 3, &[4], "poisonpill");
    let db = kind.index(dir.path(), "edits");
    let defer =
        |db: &TestIndex| ok(with_config(&config, db, &["ingest", "--defer", "embed"]).arg(&corpus));
    let edit = |doc: &str, from: &str, to: &str| {
        let p = corpus.join(doc);
        let t = fs::read_to_string(&p).unwrap();
        assert!(t.contains(from));
        fs::write(&p, t.replace(from, to)).unwrap();
    };
    // doc000 embedded first (plain), the rest deferred.
    defer(&db);
    edit(
        "doc001.md",
        "Paragraph 1 of document 1",
        "Rewritten paragraph of document 1",
    );
    defer(&db);
    let s = status(&db);
    assert_eq!(
        s["stages"]["embed"]["pending"], 6,
        "edited while pending: still one piece of work"
    );
    let o = run(with_config(&config, &db, &["enrich"])
        .env("FAILPOINTS", "embed::document=return(poisonpill)"));
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(status(&db)["stages"]["embed"]["dead"], 1);
    assert_vectors_match_texts(dir.path(), &db, &model);

    // Edited while dead: queued again as fresh work, and it succeeds now.
    edit("doc004.md", "poisonpill", "a cure");
    defer(&db);
    let s = status(&db);
    assert_eq!(
        (
            s["stages"]["embed"]["dead"].as_u64(),
            s["stages"]["embed"]["pending"].as_u64()
        ),
        (Some(0), Some(1))
    );
    let embed = embed_lifecycle(&config, &db, "doc004.md");
    assert_eq!(
        (
            embed["attempts"].as_u64(),
            embed["errors"].as_array().unwrap().len()
        ),
        (Some(0), 3),
        "attempts reset, history kept"
    );
    ok(with_config(&config, &db, &["enrich"])
        .env("FAILPOINTS", "embed::document=return(poisonpill)"));
    assert_eq!(status(&db)["stages"]["embed"]["done"], 6);

    // Edited after it was embedded, re-ingested deferred: the old text stays vector-
    // searchable (with its own vector) until the new text is embedded.
    edit(
        "doc002.md",
        "Paragraph 2 of document 2",
        "Completely new closing words for document 2",
    );
    defer(&db);
    let o = ok(&mut with_config(
        &config,
        &db,
        &[
            "search",
            "thing2y2 item2x2",
            "--mode",
            "vector",
            "--json",
            "-k",
            "50",
            "--no-promote",
        ],
    ));
    let hits = stdout_json(&o);
    let old: Vec<&Value> = hits
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["superseded"] == true)
        .collect();
    assert!(!old.is_empty(), "the old version is still searchable");
    assert!(old.iter().all(|h| h["text"]
        .as_str()
        .unwrap()
        .contains("Paragraph 2 of document 2")));
    let kw = stdout_json(&ok(&mut with_config(
        &config,
        &db,
        &["search", "Completely", "--mode", "keyword", "--json"],
    )));
    assert!(
        !kw.as_array().unwrap().is_empty(),
        "the new text is keyword-searchable at once"
    );
    assert_vectors_match_texts(dir.path(), &db, &model);
    ok(&mut with_config(&config, &db, &["enrich"]));
    assert_vectors_match_texts(dir.path(), &db, &model);
    let kept = db.count(
        "SELECT COUNT(*) FROM chunks WHERE replaced_by IS NOT NULL",
        "SELECT count(*) FROM {s}.chunks WHERE replaced_by IS NOT NULL",
    );
    assert_eq!(kept, 0);
}

/// Model migration on react-docs to a model of another dimension: search answers at every
/// moment; the backfill survives SIGKILL and resumes from its watermark; at the end every
/// vector is the new model's. (Random-weight models on both sides keep it fast; the same run
/// from all-MiniLM-L6-v2 is in BENCHMARKS.md.)
#[cfg(feature = "failpoints")]
#[test]
fn a_model_migration_never_stops_search_and_survives_a_kill() {
    let Some(docs) = crate::util::shared_data("react-docs") else {
        return;
    };
    for kind in backend_kinds() {
        a_model_migration_on(&kind, &docs);
    }
}

#[cfg(feature = "failpoints")]
fn a_model_migration_on(kind: &crate::backend::BackendKind, docs: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let old = random_model(dir.path(), 32, 5);
    let new = random_model(dir.path(), 48, 6);
    let db = kind.index(dir.path(), "migration");
    ingest(&db, &old, docs, &[]);
    let chunks = status(&db)["chunks"].as_u64().unwrap();
    let total_docs = status(&db)["documents"].as_u64().unwrap();

    // A searcher that never stops, checking every answer.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let searcher = {
        let (stop, uri) = (stop.clone(), db.uri());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let o = rag_uri(
                    &uri,
                    &[
                        "search",
                        "cleanup after an effect",
                        "--mode",
                        "hybrid",
                        "--json",
                        "--device",
                        "cpu",
                    ],
                )
                .output()
                .unwrap();
                assert!(
                    o.status.success(),
                    "a search failed during the migration: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                let hits: Value = serde_json::from_slice(&o.stdout).unwrap();
                assert!(
                    !hits.as_array().unwrap().is_empty(),
                    "a search came back empty"
                );
                n += 1;
            }
            n
        })
    };
    let backfill = |db: &TestIndex| {
        let mut cmd = rag(
            db,
            &[
                "backfill",
                "--stage",
                "embed",
                "--progress",
                "none",
                "--device",
                "cpu",
                "--model",
            ],
        );
        cmd.arg(&new);
        cmd
    };
    // Held for good after its first commit that finishes a document, so that it is killed in
    // the middle whatever the machine's speed.
    let mut first = backfill(&db)
        .env("FAILPOINTS", HOLD_AFTER_A_DOCUMENT)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let progress = |db: &TestIndex| -> Value { status(db)["backfill"].clone() };
    wait_for(
        "the backfill's first document",
        Duration::from_secs(600),
        || {
            let b = progress(&db);
            !b.is_null() && b["documents_done"].as_u64().unwrap() >= 1 && b["watermark"].is_string()
        },
    );
    kill9(&mut first);
    let b = progress(&db);
    eprintln!("killed at {b}");
    let done_at_kill = b["documents_done"].as_u64().unwrap();
    assert!(
        b["chunks_embedded"].as_u64().unwrap() < chunks,
        "killed too late"
    );
    assert!(b["watermark"].is_string(), "a watermark was persisted");
    // Search still answers from the old model.
    assert_eq!(status(&db)["vector_sets"][0]["active"], true);

    let rep = dir.path().join("resume.json");
    let o = ok(backfill(&db).arg("--report").arg(&rep));
    assert!(String::from_utf8_lossy(&o.stdout).contains("search now uses it"));
    let r = report(&rep);
    assert!(
        r["counts"]["published"].as_u64().unwrap() <= total_docs - done_at_kill,
        "the resumed backfill redid finished documents: {r}"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let searches = searcher
        .join()
        .expect("every search during the migration answered");
    eprintln!("{searches} searches during the migration");
    assert!(searches > 0);

    let s = status(&db);
    assert!(s["backfill"].is_null());
    let active: Vec<&Value> = s["vector_sets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["active"] == true)
        .collect();
    assert_eq!(active.len(), 1);
    assert_eq!(active[0]["dimension"], 48);
    assert_eq!(active[0]["embedded"], chunks);
    // Every vector is the new model's: a sample checked against `ragline embed`.
    let v = vectors(&db);
    assert_eq!(v.len() as u64, chunks);
    let sample = db.strings(
        "SELECT id, text FROM chunks WHERE replaced_by IS NULL ORDER BY rowid LIMIT 40",
        "SELECT id, text FROM {s}.chunks WHERE replaced_by IS NULL ORDER BY rowid LIMIT 40",
    );
    let texts: Vec<String> = sample.iter().map(|s| s.1.clone()).collect();
    for ((id, _), want) in sample.iter().zip(embed_texts(dir.path(), &new, &texts)) {
        assert_eq!(v[id].len(), 48);
        assert!(cosine(&v[id], &want) > 0.9999, "{id}");
    }
    // --drop-old removes the old set.
    let o = ok(&mut rag(&db, &["backfill", "--drop-old"]));
    assert!(String::from_utf8_lossy(&o.stdout).contains("dropped the vectors"));
    assert_eq!(status(&db)["vector_sets"].as_array().unwrap().len(), 1);
}

/// `ragline check`: a good file exits 0 and prints the resolved pipeline; an unknown key, a
/// wrong type and a missing model exit 2 with the right message.
#[test]
fn check_validates_the_file_the_index_and_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| {
        let p = dir.path().join(name);
        fs::write(&p, text).unwrap();
        p
    };
    let good = write(
        "good.toml",
        format!(
            "[model]\nname = \"{}\"\ndevice = \"cpu\"\n\n[chunk]\ntokens = 200\n\n[index]\n\
             uri = \"sqlite://{}\"\n\n[stages.embed]\ndefer = true\n",
            model_dir().display(),
            dir.path().join("x.db").display()
        ),
    );
    let o = run(ragline().args(["check", "--config"]).arg(&good));
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("OK") && out.contains("384 dimensions"),
        "{out}"
    );
    assert!(
        out.contains("tokens = 200") && out.contains("defer = true"),
        "{out}"
    );
    let resolved = out
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    ragline::jobs::PipelineConfig::parse(&resolved).expect("the resolved pipeline parses");

    for (name, text, expect) in [
        (
            "unknown.toml",
            "[chunk]\ntokens = 200\nsize = 3\n".to_string(),
            vec!["line 3", "unknown field `size`"],
        ),
        (
            "type.toml",
            "[index]\nbatch_size = \"big\"\n".to_string(),
            vec!["line 2", "invalid type"],
        ),
        (
            "model.toml",
            "[model]\nname = \"/no/such/model\"\ndevice = \"cpu\"\n".to_string(),
            vec!["cannot find the model `/no/such/model`"],
        ),
        // The services' sections: the URL, the API key's variable, the limits.
        (
            "remote_url.toml",
            "[stages.embed.remote]\nurl = \"ftp://x\"\n".to_string(),
            vec!["stages.embed.remote.url", "not an http:// or https:// URL"],
        ),
        (
            "remote_key.toml",
            "[stages.embed.remote]\nurl = \"https://api.example.com\"\napi = \"tei\"\n\
             api_key_env = \"RAGLINE_TEST_NO_SUCH_KEY\"\n"
                .to_string(),
            vec!["RAGLINE_TEST_NO_SUCH_KEY", "is not set"],
        ),
        (
            "remote_limits.toml",
            "[stages.embed.remote]\nurl = \"http://127.0.0.1:9\"\napi = \"tei\"\n\
             concurrency = 0\n"
                .to_string(),
            vec!["stages.embed.remote", "concurrency"],
        ),
        (
            "remote_down.toml",
            format!(
                "[model]\nname = \"{}\"\n\n[stages.embed.remote]\nurl = \
                 \"http://127.0.0.1:9\"\napi = \"tei\"\ntimeout = \"1s\"\nretries = 1\n",
                model_dir().display()
            ),
            vec!["did not answer a probe", "is it running"],
        ),
        (
            "summary.toml",
            "[stages.summary]\nurl = \"http://127.0.0.1:9\"\n".to_string(),
            vec!["stages.summary.model"],
        ),
        (
            "llm_prompt.toml",
            "[[stages.llm]]\nname = \"tags\"\nurl = \"http://127.0.0.1:9\"\nmodel = \"m\"\n\
             prompt = \"Say hi\"\n"
                .to_string(),
            vec!["stages.tags.prompt", "{text}"],
        ),
    ] {
        let p = write(name, text);
        let o = run(ragline().args(["check", "--config"]).arg(&p));
        assert_eq!(o.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&o.stderr);
        for e in expect {
            assert!(err.contains(e), "{name}: `{e}` not in {err}");
        }
    }
    // A flag overrides the file.
    let o = run(ragline()
        .args(["ingest", "--config"])
        .arg(&good)
        .args(["--chunk-tokens", "100000", "--progress", "none"])
        .arg(dir.path()));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--chunk-tokens=100000"));
}

/// A plain ingest records the same lifecycle as a deferred one finishes with.
#[test]
fn a_plain_ingest_records_every_stage_done() {
    for kind in backend_kinds() {
        a_plain_ingest_on(&kind);
    }
}

fn a_plain_ingest_on(kind: &crate::backend::BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c");
    fs::create_dir(&c).unwrap();
    fs::write(c.join("a.md"), "# A\n\nAn effect runs after render.\n").unwrap();
    fs::write(c.join("b.md"), "# B\n\nState is kept between renders.\n").unwrap();
    let db = kind.index(dir.path(), "plain_stages");
    ingest(&db, &model_dir(), &c, &[]);
    let s = status(&db);
    assert_eq!(s["documents"], 2);
    assert_eq!(s["stages"]["chunk"]["done"], 2);
    assert_eq!(s["stages"]["embed"]["done"], 2);
    assert_eq!(s["stages"]["embed"]["pending"], 0);
    assert_eq!(s["vector_sets"][0]["embedded"], s["chunks"]);
    // Nothing for enrich to do.
    let o = ok(&mut rag(&db, &["enrich", "--progress", "none"]));
    assert!(String::from_utf8_lossy(&o.stdout).contains("0 documents claimed"));
}

/// `enrich --queue`: the lifecycle's work through NATS JetStream. Two enrich processes share
/// it (every document done once, every vector written once); three poison documents are
/// retried by the broker with backoff and dead-lettered after MaxDeliver (the stage's retry
/// limit) with every attempt's error; two documents whose work is lost by its worker every
/// time (as by a killed one) are dead-lettered from the server's MaxDeliver advisory.
/// Requeued, all five are completed through the broker.
#[cfg(feature = "failpoints")]
#[test]
fn enrich_through_the_broker_shares_the_work_and_dead_letters_after_max_deliver() {
    let Some(nats) = crate::distributed::Nats::start() else {
        return;
    };
    for (i, kind) in backend_kinds().iter().enumerate() {
        enrich_through_the_broker_on(kind, &format!("{}?prefix=lc{i}", nats.url()));
    }
}

#[cfg(feature = "failpoints")]
fn enrich_through_the_broker_on(kind: &crate::backend::BackendKind, queue: &str) {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 5);
    // AckWait = the visibility timeout: lost work comes back after a second.
    let config = quick_config(dir.path(), &model, "visibility_timeout = \"1s\"\n");
    let corpus = synthetic_corpus(dir.path(), 60, 4, &[4, 11, 19], "xyzzy");
    for lost in ["doc030.md", "doc041.md"] {
        fs::rename(corpus.join(lost), corpus.join(lost.replace("doc", "lost"))).unwrap();
    }
    let db = kind.index(dir.path(), "enrich_queue");
    ok(with_config(&config, &db, &["ingest", "--defer", "embed"]).arg(&corpus));
    let chunks = status(&db)["chunks"].as_u64().unwrap();
    let spawn = |name: &str| {
        let rep = dir.path().join(format!("{name}.json"));
        let child = with_config(&config, &db, &["enrich", "--queue", queue, "--report"])
            .arg(&rep)
            .env(
                "FAILPOINTS",
                "embed::document=return(xyzzy);enrich::lose=return(lost)",
            )
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.path().join(format!("{name}.err"))).unwrap())
            .spawn()
            .unwrap();
        (child, rep)
    };
    let (mut a, ra) = spawn("a");
    let (mut b, rb) = spawn("b");
    let mut codes = Vec::new();
    for child in [&mut a, &mut b] {
        let start = Instant::now();
        let code = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s.code();
            }
            if start.elapsed() > Duration::from_secs(180) {
                kill9(child);
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        codes.push(code);
    }
    for name in ["a", "b"] {
        eprintln!(
            "--- {name}: {}",
            fs::read_to_string(dir.path().join(format!("{name}.err"))).unwrap()
        );
    }
    assert!(
        codes.iter().all(|c| matches!(c, Some(0) | Some(1))) && codes.contains(&Some(1)),
        "both end by themselves, the dead letters make one exit 1: {codes:?}"
    );
    let (ra, rb) = (report(&ra), report(&rb));
    eprintln!("a: {}\nb: {}", ra["counts"], rb["counts"]);
    let sum = |k: &str| ra["counts"][k].as_u64().unwrap() + rb["counts"][k].as_u64().unwrap();
    assert_eq!(sum("indexed"), 55, "every good document done once");
    assert_eq!(sum("failed"), 5);
    assert!(
        sum("redelivered") >= 6,
        "the poisoned three were delivered three times each (the lost ones are dropped \
         before they are counted, as by a killed worker), and the redeliveries reported"
    );
    let mut failed: Vec<String> = [&ra, &rb]
        .iter()
        .flat_map(|r| r["failures"].as_array().unwrap().clone())
        .map(|f| {
            let reason = f["reason"].as_str().unwrap();
            assert!(reason.contains("dead-lettered"), "{reason}");
            f["id"].as_str().unwrap().to_string()
        })
        .collect();
    failed.sort();
    assert_eq!(
        failed,
        [
            "doc004.md",
            "doc011.md",
            "doc019.md",
            "lost030.md",
            "lost041.md"
        ]
    );
    for r in [&ra, &rb] {
        let notes = r["notes"].to_string();
        assert!(notes.contains("through the broker"), "{notes}");
    }
    let s = status(&db);
    assert_eq!(s["stages"]["embed"]["done"], 55);
    assert_eq!(s["stages"]["embed"]["dead"], 5);
    let written = vectors(&db).len() as u64;
    assert_eq!(
        sum("children_indexed"),
        written,
        "every vector written once"
    );
    assert!(written < chunks);

    // The broker's attempts, each with its error and the backoff between them.
    let errors = |doc: &str| -> Vec<Value> {
        let embed = embed_lifecycle(&config, &db, doc);
        assert_eq!(embed["status"], "dead");
        embed["errors"].as_array().unwrap().clone()
    };
    let poisoned = errors("doc011.md");
    assert_eq!(poisoned.len(), 3, "every delivery's error: {poisoned:?}");
    for (i, e) in poisoned.iter().enumerate() {
        assert_eq!(e["attempt"], i as u64 + 1);
        assert!(e["message"].as_str().unwrap().contains("injected failure"));
        let worker = e["worker"].as_str().unwrap();
        assert!(
            worker.contains(":enrich-"),
            "the process that tried: {worker}"
        );
    }
    let at: Vec<i64> = poisoned.iter().map(|e| e["at"].as_i64().unwrap()).collect();
    assert!(at[1] - at[0] >= 25 && at[2] - at[1] >= 25, "{at:?}");
    let lost = errors("lost030.md");
    assert!(
        lost.iter()
            .any(|e| e["attempt"] == 3 && e["message"].as_str().unwrap().contains("killed")),
        "{lost:?}"
    );
    let dlq = stdout_json(&ok(&mut with_config(
        &config,
        &db,
        &["dlq", "list", "--json"],
    )));
    assert_eq!(dlq.as_array().unwrap().len(), 5);

    // The faults are gone: requeue, and the broker path completes them.
    ok(&mut with_config(&config, &db, &["dlq", "requeue", "--all"]));
    let rep = dir.path().join("again.json");
    ok(with_config(&config, &db, &["enrich", "--queue", queue, "--report"]).arg(&rep));
    let r = report(&rep);
    assert_eq!(r["counts"]["indexed"], 5, "{r}");
    let s = status(&db);
    assert_eq!(s["stages"]["embed"]["done"], 60);
    assert_eq!(s["stages"]["embed"]["dead"], 0);
    assert_eq!(vectors(&db).len() as u64, chunks);
}

/// `serve --index --admin`: a dead document requeued from the status page (a form POST with
/// the page's CSRF token) is embedded by a running `enrich --follow`; a stage paused from the
/// page shows paused; a POST without the token, or from another origin, is refused; without
/// `--admin` there are no actions.
#[cfg(feature = "failpoints")]
#[test]
fn a_dead_document_requeued_from_the_status_page_is_embedded_by_a_running_enrich() {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 1);
    let config = quick_config(dir.path(), &model, "");
    let corpus = synthetic_corpus(dir.path(), 6, 3, &[2], "xyzzy");
    let db = crate::backend::BackendKind::Sqlite.index(dir.path(), "admin");
    ok(with_config(&config, &db, &["ingest", "--defer", "embed"]).arg(&corpus));
    let o =
        run(with_config(&config, &db, &["enrich"])
            .env("FAILPOINTS", "embed::document=return(xyzzy)"));
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(status(&db)["stages"]["embed"]["dead"], 1);

    let server = crate::serve::Server::start_args(
        &["--index", &db.uri(), "--admin"],
        &[],
        dir.path(),
        "admin",
    );
    let page = crate::serve::get(&format!("{}/status", server.url)).1;
    assert!(
        page.contains("data-document=\"doc002.md\"") && page.contains("injected failure"),
        "{page}"
    );
    let token = page
        .split("name=csrf value=\"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .expect("a CSRF token in the admin forms")
        .to_string();
    let post = |path: &str, form: &str, origin: Option<&str>| -> (u16, String) {
        let agent = ureq::AgentBuilder::new().redirects(0).build();
        let mut req = agent
            .post(&format!("{}{path}", server.url))
            .set("Content-Type", "application/x-www-form-urlencoded");
        if let Some(o) = origin {
            req = req.set("Origin", o);
        }
        match req.send_string(form) {
            Ok(r) | Err(ureq::Error::Status(_, r)) => {
                (r.status(), r.header("location").unwrap_or("").to_string())
            }
            Err(e) => panic!("POST {path}: {e}"),
        }
    };
    // Refused: no token, a wrong one, another origin.
    assert_eq!(post("/admin/requeue", "doc=doc002.md", None).0, 403);
    assert_eq!(
        post("/admin/requeue", "doc=doc002.md&csrf=forged", None).0,
        403
    );
    let form = format!("doc=doc002.md&csrf={token}");
    assert_eq!(
        post("/admin/requeue", &form, Some("http://evil.example")).0,
        403
    );
    assert_eq!(status(&db)["stages"]["embed"]["dead"], 1);

    // Pause and resume from the page.
    let (code, to) = post("/admin/pause", &format!("stage=embed&csrf={token}"), None);
    assert_eq!((code, to.as_str()), (303, "/status?done=embed+paused"));
    assert_eq!(status(&db)["stages"]["embed"]["paused"], true);
    assert_eq!(
        post("/admin/resume", &format!("stage=embed&csrf={token}"), None).0,
        303
    );
    assert_eq!(status(&db)["stages"]["embed"]["paused"], false);

    // A running enrich (the fault gone) embeds the document requeued from the page.
    let mut enrich = with_config(&config, &db, &["enrich", "--follow"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let own_origin = server.url.clone();
    let (code, to) = post("/admin/requeue", &form, Some(&own_origin));
    assert_eq!(
        (code, to.as_str()),
        (303, "/status?done=1+documents+queued+again")
    );
    let done = || {
        let s = status(&db);
        s["stages"]["embed"]["dead"] == 0 && s["stages"]["embed"]["done"] == 6
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let finished = done();
    kill9(&mut enrich);
    assert!(finished, "{}", status(&db));
    let page = crate::serve::get(&format!(
        "{}/status?done=1+documents+queued+again",
        server.url
    ))
    .1;
    assert!(
        page.contains("<span id=dead-total>0</span>") && page.contains("1 documents queued again"),
        "{page}"
    );

    // Read-only without --admin: no forms, no actions.
    let plain = crate::serve::Server::start_args(&["--index", &db.uri()], &[], dir.path(), "plain");
    let page = crate::serve::get(&format!("{}/status", plain.url)).1;
    assert!(!page.contains("name=csrf"), "{page}");
    let agent = ureq::AgentBuilder::new().redirects(0).build();
    let code = match agent
        .post(&format!("{}/admin/requeue", plain.url))
        .set("Content-Type", "application/x-www-form-urlencoded")
        .send_string(&form)
    {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r.status(),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(code, 404);
}
