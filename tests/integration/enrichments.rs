//! The entities and labels stages in the lifecycle, and the stage graph: random-weight NER
//! and classifier models (their outputs are arbitrary but deterministic), an LLM stage through
//! `scripts/chat-stub.py` whose prompt uses `{entities}`. On SQLite and, with a server,
//! Postgres.
//!
//! - a chain chunk -> entities -> summary: the summary is never claimed before the entities
//!   of its document are done (it waits, and `status` says so); a new NER model re-runs the
//!   entities and then only the summaries whose entities changed, nothing else; a cycle is
//!   refused by `ragline check` with its path;
//! - `enrich` killed while the entities stage runs resumes, and the index ends with the
//!   entities a fault-free run of the final texts finds (none of an older text);
//! - `search --where entity.TYPE=... / label=...` returns only documents that have them, k of
//!   them whenever k chunks match; `ragline entities` lists the facet and writes the edges;
//!   hits carry their document's entities and labels.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use ragline::embed::random_heads::{save_random_classifier, ClassifierTask, RandomClassifier};
use serde_json::Value;

use crate::backend::{backend_kinds, BackendKind, TestIndex};
use crate::lifecycle::sectioned_corpus;
use crate::llm::ChatStub;
use crate::util::{
    kill9, model_dir, ragline, random_model, read_jsonl, run, stdout_json, wait_for,
};

fn classifier(dir: &Path, task: ClassifierTask, seed: u64) -> PathBuf {
    let out = dir.join(format!("classifier-{task:?}-{seed}"));
    save_random_classifier(
        &model_dir(),
        &out,
        &RandomClassifier {
            family: "bert",
            task,
            hidden: 32,
            layers: 1,
            seed,
            max_len: 128,
            real_shape: false,
        },
    )
    .unwrap();
    out
}

/// What every test starts from: the useEffect page in sections, a random embedder, a random
/// NER model and a random topic classifier.
struct Fixture {
    dir: tempfile::TempDir,
    corpus: PathBuf,
    embedder: PathBuf,
    ner: PathBuf,
    topics: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        Fixture {
            corpus: sectioned_corpus(dir.path()),
            embedder: random_model(dir.path(), 32, 3),
            ner: classifier(dir.path(), ClassifierTask::Token, 1),
            topics: classifier(dir.path(), ClassifierTask::Sequence, 4),
            dir,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `ingest` of the corpus with the embedder and `config`, plus `extra` flags.
    fn ingest(&self, config: &Path, ix: &TestIndex, extra: &[&str]) -> Output {
        let mut args = vec!["ingest", "--progress", "none", "--device", "cpu"];
        args.extend_from_slice(extra);
        ok(rag(config, ix, &args)
            .arg("--model")
            .arg(&self.embedder)
            .arg(&self.corpus))
    }
}

fn ok(cmd: &mut Command) -> Output {
    let o = run(cmd);
    assert_eq!(o.status.code(), Some(0), "the command failed");
    o
}

/// `ragline ARGS[0] --config CONFIG --index URI ARGS[1..]`
fn rag(config: &Path, ix: &TestIndex, args: &[&str]) -> Command {
    let mut cmd = ragline();
    cmd.arg("--config")
        .arg(config)
        .arg(args[0])
        .arg("--index")
        .arg(ix.uri())
        .args(&args[1..]);
    cmd
}

fn check(config: &Path) -> Command {
    let mut cmd = ragline();
    cmd.arg("--config").arg(config).arg("check");
    cmd
}

fn enrich(config: &Path, ix: &TestIndex, extra: &[&str]) -> Output {
    let mut args = vec!["enrich", "--progress", "none", "--device", "cpu"];
    args.extend_from_slice(extra);
    ok(&mut rag(config, ix, &args))
}

fn status(config: &Path, ix: &TestIndex) -> Value {
    stdout_json(&ok(&mut rag(config, ix, &["status", "--json"])))
}

/// A config with the entities stage (every mention kept) and, when `llm` is given, a summary
/// stage whose prompt uses `{entities}`.
fn write_config(path: &Path, ner: &Path, llm: Option<&str>, extra: &str) {
    let mut text = format!(
        "[stages.entities]\nmodel = \"{}\"\nmin_score = 0.0\n",
        ner.display()
    );
    if let Some(url) = llm {
        text.push_str(&format!(
            "[stages.summary]\nurl = \"{url}\"\nmodel = \"stub\"\n\
             prompt = \"E[{{entities}}]\\n\\n{{text}}\"\ndepends_on = [\"entities\"]\n"
        ));
    }
    text.push_str(extra);
    fs::write(path, text).unwrap();
}

/// (document, stage) -> (claimed_at, done_at) of done rows.
fn times(ix: &TestIndex) -> BTreeMap<(String, String), (i64, i64)> {
    let rows = ix.strings(
        "SELECT document_id || '|' || stage, COALESCE(claimed_at, 0) || '|' || done_at
         FROM enrichment WHERE status = 'done'",
        "SELECT document_id || '|' || stage, COALESCE(claimed_at, 0) || '|' || done_at
         FROM {s}.enrichment WHERE status = 'done'",
    );
    rows.into_iter()
        .map(|(k, v)| {
            let (d, s) = k.split_once('|').unwrap();
            let (c, t) = v.split_once('|').unwrap();
            (
                (d.to_string(), s.to_string()),
                (c.parse().unwrap_or(0), t.parse().unwrap()),
            )
        })
        .collect()
}

fn outputs(ix: &TestIndex, stage: &str) -> BTreeMap<String, String> {
    ix.strings(
        &format!("SELECT document_id, output FROM stage_outputs WHERE stage = '{stage}'"),
        &format!("SELECT document_id, output FROM {{s}}.stage_outputs WHERE stage = '{stage}'"),
    )
    .into_iter()
    .collect()
}

/// Every entity row: (document, type, norm, mentions).
fn entity_rows(ix: &TestIndex) -> BTreeSet<String> {
    ix.strings(
        "SELECT document_id, type || '|' || norm || '|' || mentions FROM document_entities",
        "SELECT document_id, type || '|' || norm || '|' || mentions FROM {s}.document_entities",
    )
    .into_iter()
    .map(|(d, e)| format!("{d}|{e}"))
    .collect()
}

#[test]
fn a_stage_waits_for_what_it_depends_on_and_reruns_when_its_input_changes() {
    for kind in backend_kinds() {
        chain_on(&kind);
    }
}

fn chain_on(kind: &BackendKind) {
    let f = Fixture::new();
    let dir = &f.dir;
    let (ner_a, ner_b) = (&f.ner, classifier(f.path(), ClassifierTask::Token, 2));
    let ix = kind.index(dir.path(), "chain");
    let stub = ChatStub::start();
    let config = dir.path().join("ragline.toml");
    write_config(&config, ner_a, Some(&stub.url), "");
    ok(&mut check(&config));

    // Documents and vectors now; entities deferred with embedding.
    f.ingest(&config, &ix, &["--defer", "embed"]);
    let docs = ix.count(
        "SELECT COUNT(*) FROM documents",
        "SELECT count(*) FROM {s}.documents",
    ) as u64;
    assert!(docs >= 8);

    // The summary alone: every document waits for its entities; nothing is asked.
    enrich(&config, &ix, &["--stage", "summary"]);
    assert_eq!(
        stub.calls(),
        0,
        "a summary was asked for before its entities"
    );
    let s = status(&config, &ix);
    assert_eq!(s["stages"]["summary"]["pending"], docs, "{s}");
    assert_eq!(s["stages"]["summary"]["waiting_on_dependency"], docs, "{s}");
    let shown = ok(&mut rag(&config, &ix, &["status"]));
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains(&format!(
            "{docs} of them wait for a stage `summary` depends on"
        )),
        "{}",
        String::from_utf8_lossy(&shown.stdout)
    );

    // Everything: each summary claimed only after its document's entities were done, and
    // its prompt holds them.
    enrich(&config, &ix, &[]);
    let s = status(&config, &ix);
    for stage in ["embed", "entities", "summary"] {
        assert_eq!(s["stages"][stage]["done"], docs, "{stage}: {s}");
    }
    assert_eq!(s["stages"]["summary"]["waiting_on_dependency"], 0);
    assert_eq!(stub.calls(), docs);
    let first = times(&ix);
    for ((doc, stage), (claimed, _)) in &first {
        if stage == "summary" {
            let (_, entities_done) = first[&(doc.clone(), "entities".to_string())];
            assert!(
                *claimed >= entities_done,
                "{doc}: summary claimed at {claimed}, entities done at {entities_done}"
            );
        }
    }
    let entities_a = outputs(&ix, "entities");
    let summaries = outputs(&ix, "summary");
    assert_eq!(summaries.len() as u64, docs);
    assert!(
        entities_a.values().any(|e| !e.is_empty()),
        "the random NER model found no entity at all: {entities_a:?}"
    );
    for (doc, summary) in &summaries {
        // The stub answers with the prompt's first words: E[<the entities>] ...
        let expected: Vec<&str> = entities_a[doc].split_whitespace().take(3).collect();
        assert!(
            summary.contains(&format!("E[{}", expected.join(" "))),
            "{doc}: {summary} (entities: {})",
            entities_a[doc]
        );
    }

    // Unchanged: nothing runs again.
    enrich(&config, &ix, &[]);
    assert_eq!(stub.calls(), docs);
    assert_eq!(times(&ix), first);

    // Another NER model: every document's entities again, then the summaries whose entities
    // changed; embedding and the rest untouched.
    write_config(&config, &ner_b, Some(&stub.url), "");
    enrich(&config, &ix, &[]);
    let entities_b = outputs(&ix, "entities");
    let changed = entities_a
        .iter()
        .filter(|(d, e)| entities_b.get(*d) != Some(*e))
        .count() as u64;
    eprintln!("{changed} of {docs} documents have other entities with the second model");
    assert!(
        changed > 0,
        "the second model found the same entities everywhere"
    );
    assert_eq!(stub.calls(), docs + changed);
    // Queued again for the model alone (the texts unchanged): at backfill priority, behind
    // new documents.
    let priorities = ix.strings(
        "SELECT document_id, CAST(priority AS TEXT) FROM enrichment WHERE stage = 'entities'",
        "SELECT document_id, priority::text FROM {s}.enrichment WHERE stage = 'entities'",
    );
    assert!(priorities.iter().all(|(_, p)| p == "0"), "{priorities:?}");
    let second = times(&ix);
    for ((doc, stage), t) in &second {
        let before = first[&(doc.clone(), stage.clone())];
        match stage.as_str() {
            "entities" => assert!(t.1 > before.1, "{doc}: entities not run again"),
            "summary" if entities_a[doc] != entities_b[doc] => {
                assert!(t.1 > before.1 && t.0 >= second[&(doc.clone(), "entities".into())].1)
            }
            _ => assert_eq!(*t, before, "{doc}: {stage} ran again"),
        }
    }

    // A cycle is refused with its path; an unknown dependency by name.
    let cyclic = dir.path().join("cyclic.toml");
    write_config(&cyclic, ner_a, Some(&stub.url), "");
    let text = fs::read_to_string(&cyclic).unwrap().replace(
        "min_score = 0.0\n",
        "min_score = 0.0\ndepends_on = [\"summary\"]\n",
    );
    fs::write(&cyclic, text).unwrap();
    let o = run(&mut check(&cyclic));
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("entities -> summary -> entities"),
        "the cycle's path is not shown: {e}"
    );
    let unknown = dir.path().join("unknown.toml");
    write_config(
        &unknown,
        ner_a,
        None,
        "[stages.labels]\ndepends_on = [\"sumary\"]\nmodel = \"x\"\n",
    );
    let o = run(&mut check(&unknown));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("`sumary`"));
}

#[test]
fn enrich_killed_while_entities_run_resumes_with_the_current_texts() {
    for kind in backend_kinds() {
        killed_on(&kind);
    }
}

fn killed_on(kind: &BackendKind) {
    let f = Fixture::new();
    let (dir, corpus) = (&f.dir, &f.corpus);
    let config = dir.path().join("ragline.toml");
    write_config(&config, &f.ner, None, "");
    let ingest = |ix: &TestIndex| f.ingest(&config, ix, &["--defer", "embed"]);
    let ix = kind.index(dir.path(), "killed_entities");
    ingest(&ix);
    // Three documents' entities written, then the fourth's model run never ends.
    let mut first = rag(
        &config,
        &ix,
        &[
            "enrich",
            "--progress",
            "none",
            "--device",
            "cpu",
            "--stage",
            "entities",
        ],
    )
    .env("FAILPOINTS", "enrich::chunk_model=3*off->sleep(600000)")
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    wait_for("entities of 3 documents", Duration::from_secs(300), || {
        status(&config, &ix)["stages"]["entities"]["done"].as_u64() == Some(3)
    });
    kill9(&mut first);
    let s = status(&config, &ix);
    assert!(
        s["stages"]["entities"]["in_progress"].as_u64().unwrap() > 0,
        "{s}"
    );

    // A document done before the kill changes; the next enrich takes over the dead
    // worker's documents and redoes the changed one.
    let done: Vec<(String, String)> = ix.strings(
        "SELECT document_id, stage FROM enrichment WHERE stage = 'entities' AND status = 'done'",
        "SELECT document_id, stage FROM {s}.enrichment
         WHERE stage = 'entities' AND status = 'done'",
    );
    let edited = corpus.join(Path::new(&done[0].0).file_name().unwrap());
    let mut text = fs::read_to_string(&edited).unwrap();
    text.push_str("\n\nGrace Hopper met Ada Lovelace at Acme Corporation in Zurich.\n");
    fs::write(&edited, text).unwrap();
    ingest(&ix);
    enrich(&config, &ix, &["--stage", "entities"]);
    let s = status(&config, &ix);
    let docs = s["documents"].as_u64().unwrap();
    assert_eq!(s["stages"]["entities"]["done"], docs, "{s}");
    let stale = ix.count(
        "SELECT COUNT(*) FROM enrichment e JOIN documents d ON d.id = e.document_id
         WHERE e.stage = 'entities' AND e.input_version != d.version",
        "SELECT count(*) FROM {s}.enrichment e JOIN {s}.documents d ON d.id = e.document_id
         WHERE e.stage = 'entities' AND e.input_version <> d.version",
    );
    assert_eq!(stale, 0);
    // The same entities as one run without a fault over the final texts.
    let fresh = kind.index(dir.path(), "fresh_entities");
    ingest(&fresh);
    enrich(&config, &fresh, &["--stage", "entities"]);
    let (got, want) = (entity_rows(&ix), entity_rows(&fresh));
    assert!(!want.is_empty());
    assert_eq!(
        got, want,
        "the resumed index's entities differ from a fault-free run's"
    );
}

/// `enrich --queue` on NATS JetStream: two processes share the entities and the summaries
/// through the broker; each summary is claimed after its document's entities are done, and
/// the entities equal an in-process run's.
#[test]
fn entities_and_a_dependent_stage_go_through_the_broker() {
    let Some(nats) = crate::distributed::Nats::start() else {
        return;
    };
    for (i, kind) in backend_kinds().iter().enumerate() {
        through_the_broker_on(kind, &format!("{}?prefix=en{i}", nats.url()));
    }
}

fn through_the_broker_on(kind: &BackendKind, queue: &str) {
    let f = Fixture::new();
    let stub = ChatStub::start();
    let config = f.path().join("ragline.toml");
    write_config(&config, &f.ner, Some(&stub.url), "");
    let ix = kind.index(f.path(), "broker_entities");
    f.ingest(&config, &ix, &["--defer", "embed"]);
    let docs = status(&config, &ix)["documents"].as_u64().unwrap();
    let spawn = |name: &str| {
        rag(
            &config,
            &ix,
            &[
                "enrich",
                "--progress",
                "none",
                "--device",
                "cpu",
                "--queue",
                queue,
            ],
        )
        .stdout(Stdio::null())
        .stderr(fs::File::create(f.path().join(format!("{name}.err"))).unwrap())
        .spawn()
        .unwrap()
    };
    let (mut a, mut b) = (spawn("a"), spawn("b"));
    for child in [&mut a, &mut b] {
        let code = child.wait().unwrap().code();
        assert_eq!(code, Some(0), "an enrich through the broker failed");
    }
    let s = status(&config, &ix);
    for stage in ["embed", "entities", "summary"] {
        assert_eq!(s["stages"][stage]["done"], docs, "{stage}: {s}");
    }
    assert_eq!(stub.calls(), docs, "one summary per document");
    let t = times(&ix);
    for ((doc, stage), (claimed, _)) in &t {
        if stage == "summary" {
            let entities_done = t[&(doc.clone(), "entities".to_string())].1;
            assert!(
                *claimed >= entities_done,
                "{doc}: summary before its entities"
            );
        }
    }
    let fresh = kind.index(f.path(), "broker_fresh");
    write_config(&config, &f.ner, None, "");
    f.ingest(&config, &fresh, &[]);
    assert_eq!(entity_rows(&ix), entity_rows(&fresh));
}

#[test]
fn entity_and_label_filters_return_only_matching_documents() {
    for kind in backend_kinds() {
        filters_on(&kind);
    }
}

fn filters_on(kind: &BackendKind) {
    let f = Fixture::new();
    let dir = &f.dir;
    let config = dir.path().join("ragline.toml");
    write_config(
        &config,
        &f.ner,
        None,
        &format!(
            "[stages.labels]\nmodel = \"{}\"\ntop_k = 1\nthreshold = 0.0\n",
            f.topics.display()
        ),
    );
    let ix = kind.index(dir.path(), "facets");
    // Entities and labels computed by the ingest itself.
    let o = f.ingest(&config, &ix, &[]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("entities, labels:"));
    let s = status(&config, &ix);
    let docs = s["documents"].as_u64().unwrap();
    assert_eq!(s["stages"]["entities"]["done"], docs, "{s}");
    assert_eq!(s["stages"]["labels"]["done"], docs, "{s}");

    // The facet: an entity several documents mention.
    let facets = stdout_json(&ok(&mut rag(
        &config,
        &ix,
        &["entities", "--json", "--top", "50"],
    )));
    let facets = facets.as_array().unwrap();
    let entity = facets
        .iter()
        .find(|f| f["documents"].as_u64().unwrap() >= 2)
        .unwrap_or(&facets[0]);
    let (kind_, text) = (
        entity["type"].as_str().unwrap(),
        entity["text"].as_str().unwrap(),
    );
    let norm = entity["norm"].as_str().unwrap();
    let having: BTreeSet<String> = ix
        .strings(
            &format!(
                "SELECT document_id, norm FROM document_entities
                 WHERE type = '{kind_}' AND norm = '{}'",
                norm.replace('\'', "''")
            ),
            &format!(
                "SELECT document_id, norm FROM {{s}}.document_entities
                 WHERE type = '{kind_}' AND norm = '{}'",
                norm.replace('\'', "''")
            ),
        )
        .into_iter()
        .map(|(d, _)| d)
        .collect();
    assert_eq!(having.len() as u64, entity["documents"].as_u64().unwrap());
    let chunks_of = |set: &BTreeSet<String>| -> usize {
        let all = ix.strings(
            "SELECT document_id, id FROM chunks WHERE replaced_by IS NULL",
            "SELECT document_id, id FROM {s}.chunks WHERE replaced_by IS NULL",
        );
        all.iter().filter(|(d, _)| set.contains(d)).count()
    };
    let clause = format!("entity.{kind_}={}", text.to_uppercase());
    check_filter(&config, &ix, &clause, &having, chunks_of(&having));

    // Labels: one per document (top_k = 1).
    let labels: Vec<(String, String)> = ix.strings(
        "SELECT document_id, label FROM document_labels",
        "SELECT document_id, label FROM {s}.document_labels",
    );
    assert_eq!(labels.len() as u64, docs);
    let label = &labels[0].1;
    let labelled: BTreeSet<String> = labels
        .iter()
        .filter(|(_, l)| l == label)
        .map(|(d, _)| d.clone())
        .collect();
    check_filter(
        &config,
        &ix,
        &format!("label={label}"),
        &labelled,
        chunks_of(&labelled),
    );
    let label_facet = stdout_json(&ok(&mut rag(
        &config,
        &ix,
        &["entities", "--labels", "--json"],
    )));
    let counted: u64 = label_facet
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["documents"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, docs);

    // Hits carry their document's entities and labels.
    let hits = stdout_json(&ok(&mut rag(
        &config,
        &ix,
        &[
            "search",
            "effect",
            "--json",
            "--mode",
            "keyword",
            "--no-promote",
        ],
    )));
    let hit = &hits.as_array().unwrap()[0];
    assert_eq!(hit["labels"].as_array().unwrap().len(), 1, "{hit}");
    assert!(
        hit.get("entities").is_some()
            || outputs(&ix, "entities")[hit["document_id"].as_str().unwrap()].is_empty()
    );

    // The edges: one per (document, entity), as JSONL and Parquet.
    let edges = dir.path().join("edges.jsonl");
    ok(rag(&config, &ix, &["entities", "--edges", "--output"]).arg(&edges));
    let rows = read_jsonl(&edges);
    assert_eq!(rows.len(), entity_rows(&ix).len());
    let mine: Vec<&Value> = rows
        .iter()
        .filter(|r| r["type"] == kind_ && r["norm"] == norm)
        .collect();
    assert_eq!(mine.len(), having.len());
    assert!(mine.iter().all(|r| r["count"].as_u64().unwrap() >= 1));
    let parquet = dir.path().join("edges.parquet");
    let o = ok(rag(&config, &ix, &["entities", "--edges", "--json", "--output"]).arg(&parquet));
    assert_eq!(
        stdout_json(&o)["edges"].as_u64().unwrap() as usize,
        rows.len()
    );
}

/// Every mode's hits for `clause` are chunks of `allowed` documents, k of them whenever k
/// chunks match.
fn check_filter(
    config: &Path,
    ix: &TestIndex,
    clause: &str,
    allowed: &BTreeSet<String>,
    matching: usize,
) {
    assert!(matching > 0);
    let k = matching.min(7);
    for mode in ["vector", "hybrid"] {
        let hits = stdout_json(&ok(&mut rag(
            config,
            ix,
            &[
                "search",
                "when does the effect run",
                "--json",
                "--no-promote",
                "--device",
                "cpu",
                "--mode",
                mode,
                "-k",
                &k.to_string(),
                "--where",
                clause,
            ],
        )));
        let hits = hits.as_array().unwrap();
        assert_eq!(hits.len(), k, "{mode} {clause}: {} of {k}", hits.len());
        for h in hits {
            let d = h["document_id"].as_str().unwrap();
            assert!(allowed.contains(d), "{mode} {clause}: {d} does not match");
        }
    }
}

/// The search page in a real browser (headless Chromium): each hit shows its document's
/// summary, labels and entities; the facet column lists the result set's labels, entity types
/// and entities; following an entity facet narrows the results to documents with it.
#[test]
fn the_search_page_shows_summaries_labels_and_entity_facets_that_narrow_the_results() {
    let Some(chromium) = crate::pages::chromium() else {
        return;
    };
    let f = Fixture::new();
    let dir = &f.dir;
    let stub = ChatStub::start();
    let config = dir.path().join("ragline.toml");
    fs::write(
        &config,
        format!(
            "[stages.entities]\nmodel = \"{}\"\nmin_score = 0.0\n\
             [stages.labels]\nmodel = \"{}\"\ntop_k = 2\nthreshold = 0.0\n\
             [stages.summary]\nurl = \"{}\"\nmodel = \"stub\"\n",
            f.ner.display(),
            f.topics.display(),
            stub.url
        ),
    )
    .unwrap();
    let ix = BackendKind::Sqlite.index(dir.path(), "page");
    f.ingest(&config, &ix, &[]);
    enrich(&config, &ix, &["--stage", "summary"]);
    let summaries = outputs(&ix, "summary");
    let query = "effect cleanup";

    let server =
        crate::serve::Server::start_args(&["--index", &ix.uri()], &[], dir.path(), "facets");
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots-facets");
    fs::create_dir_all(&shots).unwrap();
    let python = Command::new(crate::util::root().join("scripts/browser-venv.sh"))
        .output()
        .expect("scripts/browser-venv.sh");
    assert!(python.status.success());
    let python = String::from_utf8_lossy(&python.stdout).trim().to_string();
    let o = run(Command::new(python)
        .arg(crate::util::root().join("scripts/browser-check.py"))
        .arg(&server.url)
        .arg(query)
        .arg(&shots)
        .arg("--chromium")
        .arg(&chromium)
        .arg("--facets"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let seen: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(seen["phone_overflow"], false, "{seen}");
    let f = &seen["facets"];
    let hits = f["hits"].as_array().unwrap();
    assert!(!hits.is_empty(), "{seen}");
    let labels: BTreeMap<String, BTreeSet<String>> = labels_of(&ix);
    for h in hits {
        let doc = h["document"].as_str().unwrap();
        // The summary the stage wrote (shown whole: the stub's are short).
        assert_eq!(
            h["summary"][0].as_str(),
            Some(summaries[doc].as_str()),
            "{doc}: {h}"
        );
        let shown: BTreeSet<String> = h["labels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_str().unwrap().to_string())
            .collect();
        assert_eq!(shown, labels[doc], "{doc}");
    }
    assert!(hits
        .iter()
        .any(|h| !h["entities"].as_array().unwrap().is_empty()));
    for facet in ["labels", "types", "entities"] {
        assert!(
            !f["links"][facet].as_array().is_none_or(|v| v.is_empty()),
            "no {facet} facet: {seen}"
        );
    }
    // Following the first entity facet: its filter in force, every hit a document with it.
    let filter = f["links"]["entities"][0]["filter"].as_str().unwrap();
    assert_eq!(f["active_filters"][0].as_str(), Some(filter), "{seen}");
    assert!(f["narrowed_url"]
        .as_str()
        .unwrap()
        .contains("where=entity."));
    let (key, name) = filter.split_once('=').unwrap();
    let kind_ = key.trim_start_matches("entity.");
    let norm = ragline::lifecycle::DocumentEntity::normalize(name);
    let having: BTreeSet<String> = entity_rows(&ix)
        .into_iter()
        .filter_map(|row| {
            let parts: Vec<&str> = row.split('|').collect();
            (parts[1] == kind_ && parts[2] == norm).then(|| parts[0].to_string())
        })
        .collect();
    let narrowed = f["narrowed"].as_array().unwrap();
    assert!(!narrowed.is_empty());
    for h in narrowed {
        let d = h["document"].as_str().unwrap();
        assert!(having.contains(d), "{d} does not mention {filter}");
    }
}

/// Each document's labels.
fn labels_of(ix: &TestIndex) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (d, l) in ix.strings(
        "SELECT document_id, label FROM document_labels",
        "SELECT document_id, label FROM {s}.document_labels",
    ) {
        out.entry(d).or_default().insert(l);
    }
    out
}
