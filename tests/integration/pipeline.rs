//! The pipeline builder as a library: what `ingest`, `eval`, `enrich` and `check` call.

use std::fs;
use std::path::Path;

use ragline::jobs::config::Parsed;
use ragline::jobs::{self, EnrichRequest, JobError, PipelineConfig};
use ragline::run::progress::Silent;

use crate::util::random_model;

fn config(model: &Path, db: &Path, corpus: &Path) -> PipelineConfig {
    let mut c = PipelineConfig::parse(&format!(
        "[source]\npaths = [\"{}\"]\n[model]\nname = \"{}\"\ndevice = \"cpu\"\n\
         [index]\nuri = \"sqlite://{}\"\n",
        corpus.display(),
        model.display(),
        db.display()
    ))
    .unwrap();
    c.run.workers = Some(2);
    c
}

fn corpus(dir: &Path) -> std::path::PathBuf {
    let c = dir.join("c");
    fs::create_dir_all(&c).unwrap();
    for i in 0..5 {
        fs::write(
            c.join(format!("p{i}.md")),
            format!("# Page {i}\n\nSome words about topic {i}, and more words after them.\n"),
        )
        .unwrap();
    }
    fs::write(c.join("empty.md"), "").unwrap();
    c
}

#[test]
fn ingest_deferred_then_enrich_through_the_builder() {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 9);
    let c = corpus(dir.path());
    let db = dir.path().join("b.db");
    let mut cfg = config(&model, &db, &c);
    cfg.stages.embed.defer = true;
    let s = jobs::ingest(&cfg, &mut Silent).unwrap();
    assert_eq!(
        (s.counts.published, s.counts.indexed, s.counts.dropped),
        (6, 5, 1)
    );
    assert_eq!(s.chunks_embedded, 0);
    assert_eq!(
        s.counts.children_indexed, 5,
        "chunks written without vectors"
    );
    let st = jobs::status(&cfg).unwrap();
    assert_eq!(st.stages["embed"].pending, 5);

    // A second deferred ingest finds everything there: nothing to do.
    let again = jobs::ingest(&cfg, &mut Silent).unwrap();
    assert_eq!(again.counts.unchanged, 5);
    // A plain ingest does not take "chunked but not embedded" for done: it embeds.
    cfg.stages.embed.defer = false;
    let plain = jobs::ingest(&cfg, &mut Silent).unwrap();
    assert_eq!((plain.counts.unchanged, plain.chunks_embedded), (0, 5));
    assert_eq!(jobs::status(&cfg).unwrap().stages["embed"].done, 5);

    // Enrich with nothing queued ends at once, with nothing claimed.
    let e = jobs::enrich(&cfg, &EnrichRequest::default(), &mut Silent).unwrap();
    assert_eq!(e.counts.published, 0);
}

#[test]
fn enrich_embeds_what_a_deferred_ingest_queued_at_the_configured_priority() {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 10);
    let c = corpus(dir.path());
    let db = dir.path().join("b.db");
    let mut cfg = config(&model, &db, &c);
    cfg.stages.embed.defer = true;
    cfg.stages.embed.priority = ragline::lifecycle::Priority::Backfill;
    jobs::ingest(&cfg, &mut Silent).unwrap();
    let store = ragline::indexers::sqlite::SqliteStore::open(&db).unwrap();
    let doc = store.document_lifecycle("p0.md").unwrap().unwrap();
    let embed = doc.stages.iter().find(|s| s.stage == "embed").unwrap();
    assert_eq!(embed.priority, "backfill");
    let e = jobs::enrich(&cfg, &EnrichRequest::default(), &mut Silent).unwrap();
    assert_eq!((e.counts.published, e.counts.indexed), (5, 5));
    assert_eq!(e.chunks_embedded + e.chunks_reused, 5);
    assert!(e.succeeded());
    let st = jobs::status(&cfg).unwrap();
    assert_eq!(st.stages["embed"].done, 5);
    assert_eq!(st.vector_sets[0].embedded, 5);
}

#[test]
fn setup_errors_name_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 11);
    let c = corpus(dir.path());
    let db = dir.path().join("b.db");
    let err = |cfg: &PipelineConfig| jobs::ingest(cfg, &mut Silent).unwrap_err().to_string();

    let mut cfg = config(&model, &db, &c);
    cfg.source.paths.clear();
    assert!(err(&cfg).contains("nothing to ingest"), "{}", err(&cfg));

    let mut cfg = config(&model, &db, &c);
    cfg.stages.embed.defer = true;
    cfg.index.uri = Parsed::parse("jsonl:/tmp/x.jsonl").unwrap();
    assert!(err(&cfg).contains("drop --defer"), "{}", err(&cfg));

    let mut cfg = config(&model, &db, &c);
    cfg.chunk.overlap = 500;
    let e = jobs::ingest(&cfg, &mut Silent).unwrap_err();
    assert!(matches!(e, JobError::Config(_)), "{e}");
    assert!(e.to_string().contains("chunk.overlap"));

    let mut cfg = config(&model, &db, &c);
    cfg.model.name = dir.path().join("missing").display().to_string();
    assert!(err(&cfg).contains("cannot find the model"), "{}", err(&cfg));

    // Enrich on an index that is not there, and on one without a model.
    let cfg = config(&model, &dir.path().join("none.db"), &c);
    let e = jobs::enrich(&cfg, &EnrichRequest::default(), &mut Silent).unwrap_err();
    assert!(e.to_string().contains("run `ragline ingest` first"), "{e}");
    let mut cfg = config(&model, &db, &c);
    cfg.chunk.enabled = false;
    jobs::ingest(&cfg, &mut Silent).unwrap();
    let e = jobs::enrich(&cfg, &EnrichRequest::default(), &mut Silent).unwrap_err();
    assert!(e.to_string().contains("has no model"), "{e}");
}
