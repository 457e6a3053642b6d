//! The SQLite backend on synthetic documents and vectors (no model needed).

use super::*;
use crate::document::{Chunk, Document, InputKey};
use crate::indexers::ItemError;
use schema::SCHEMA_VERSION;

fn identity(fp: &str, dim: usize) -> IndexIdentity {
    IndexIdentity {
        model: Some(ModelIdentity {
            name: "test-model".into(),
            dir: "/nonexistent".into(),
            fingerprint: fp.into(),
            dimension: dim,
            tokenizer: Some("tok".into()),
        }),
        pipeline_fingerprint: format!("pipe-{fp}"),
        defer_embed: false,
        priority: crate::lifecycle::Priority::Fresh,
    }
}

/// What a `--no-chunk` run writes with: no model.
fn no_model() -> IndexIdentity {
    IndexIdentity {
        model: None,
        pipeline_fingerprint: "extract-v1".into(),
        defer_embed: false,
        priority: crate::lifecycle::Priority::Fresh,
    }
}

fn parent(id: &str, hash: &str, children: u32) -> Document {
    let mut d = Document::new(id, format!("text of {id}"));
    d.content_hash = Some(hash.into());
    d.children = children;
    d
}

fn chunk(parent: &Document, ordinal: u32, text: &str, v: Vec<f32>) -> Document {
    let mut c = parent.child(format!("{}#{ordinal}", parent.id), text);
    c.chunk = Some(Box::new(Chunk {
        ordinal,
        heading_path: vec!["Top".into(), "Sub".into()],
        start: 0,
        end: text.len(),
        token_count: 3,
        pages: None,
        token_ids: vec![],
        input_key: Some(key_of(text)),
        vector: Some(v),
    }));
    c
}

fn unit(i: usize, dim: usize) -> Vec<f32> {
    let mut v = vec![0.0; dim];
    v[i % dim] = 1.0;
    v
}

fn all_ok(r: Vec<Result<(), ItemError>>) {
    for (i, x) in r.iter().enumerate() {
        assert!(x.is_ok(), "item {i}: {x:?}");
    }
}

#[test]
fn upserts_are_idempotent_and_rechunking_removes_stale_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.db");
    let f = SqliteFactory::open(&path, identity("a", 4)).unwrap();
    let mut b = f.connect().unwrap();
    let p = parent("doc", "h1", 3);
    let batch = vec![
        p.clone(),
        chunk(&p, 0, "alpha one", unit(0, 4)),
        chunk(&p, 1, "beta two", unit(1, 4)),
        chunk(&p, 2, "gamma three", unit(2, 4)),
    ];
    all_ok(b.write(&batch));
    all_ok(b.write(&batch));
    let r = SqliteReader::open(&path).unwrap();
    assert_eq!(
        r.counts().unwrap(),
        (1, 3, 3),
        "writing twice duplicates nothing"
    );
    assert_eq!(f.known_documents().unwrap()["doc"].content_hash, "h1");

    // New content, two chunks: the third goes, with its vector and full-text entry.
    let p2 = parent("doc", "h2", 2);
    all_ok(b.write(&[
        p2.clone(),
        chunk(&p2, 0, "alpha again", unit(0, 4)),
        chunk(&p2, 1, "delta four", unit(3, 4)),
    ]));
    let r = SqliteReader::open(&path).unwrap();
    assert_eq!(r.counts().unwrap(), (1, 2, 2));
    assert!(
        r.keyword("gamma", 10).unwrap().is_empty(),
        "stale chunk left in FTS"
    );
    let hits = r.keyword("delta", 10).unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(r.chunk(hits[0].0).unwrap().unwrap().id, "doc#1");
    let near = r.nearest(&unit(3, 4), 1).unwrap();
    assert_eq!(r.chunk(near[0].0).unwrap().unwrap().text, "delta four");
    assert!(
        near[0].1.abs() < 1e-6,
        "cosine distance of identical vectors is 0"
    );
}

#[test]
fn a_document_with_missing_chunks_is_not_known() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.db");
    let f = SqliteFactory::open(&path, identity("a", 4)).unwrap();
    let mut b = f.connect().unwrap();
    let p = parent("doc", "h1", 2);
    // The run stopped after the document and one of its two chunks.
    all_ok(b.write(&[p.clone(), chunk(&p, 0, "only one", unit(0, 4))]));
    assert!(!f.known_documents().unwrap().contains_key("doc"));
    all_ok(b.write(&[chunk(&p, 1, "and two", unit(1, 4))]));
    assert!(f.known_documents().unwrap().contains_key("doc"));
}

#[test]
fn bad_items_fail_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.db");
    let f = SqliteFactory::open(&path, identity("a", 4)).unwrap();
    let mut b = f.connect().unwrap();
    let p = parent("doc", "h", 2);
    let mut no_vector = chunk(&p, 1, "no vector yet", unit(0, 4));
    no_vector.chunk.as_mut().unwrap().vector = None;
    let r = b.write(&[
        p.clone(),
        chunk(&p, 0, "wrong dimension", vec![1.0; 8]),
        no_vector,
        parent("other", "h", 0),
    ]);
    assert!(r[0].is_ok() && r[3].is_ok());
    let e1 = r[1].clone().unwrap_err();
    assert!(
        !e1.retryable && e1.message.contains("8 dimensions in an index of 4"),
        "{e1}"
    );
    // A chunk without a vector is a chunk whose embedding is pending (a deferred ingest).
    assert!(r[2].is_ok(), "{:?}", r[2]);
    let reader = SqliteReader::open(&path).unwrap();
    assert_eq!(reader.counts().unwrap(), (2, 1, 0));
    assert_eq!(reader.unembedded().unwrap(), (1, 1));

    // An index without a model takes no chunk at all: its vectors could never be computed.
    let plain = SqliteFactory::open(&dir.path().join("plain.db"), no_model()).unwrap();
    let r = plain
        .connect()
        .unwrap()
        .write(&[chunk(&p, 0, "x", unit(0, 4))]);
    assert!(r[0]
        .clone()
        .unwrap_err()
        .message
        .contains("without a model"));
}

#[test]
fn another_model_or_a_foreign_file_is_refused_without_touching_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.db");
    drop(SqliteFactory::open(&path, identity("a", 4)).unwrap());
    let before = std::fs::read(&path).unwrap();
    let err = SqliteFactory::open(&path, identity("b", 4))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("holds vectors of model `test-model`") && err.contains("another --index"),
        "{err}"
    );
    let err = SqliteFactory::open(&path, identity("a", 8))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("4 dimensions"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), before);

    let junk = dir.path().join("junk.db");
    std::fs::write(
        &junk,
        b"this is not a database, just text that is long enough to matter",
    )
    .unwrap();
    let err = SqliteFactory::open(&junk, identity("a", 4))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("not a ragline index") && err.contains("not an SQLite database"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&junk).unwrap(),
        b"this is not a database, just text that is long enough to matter"
    );

    let other = dir.path().join("other.db");
    rusqlite::Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE t(x)")
        .unwrap();
    let err = SqliteFactory::open(&other, identity("a", 4))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("without ragline's tables"), "{err}");
}

#[test]
fn pruning_deletes_documents_and_their_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.db");
    let f = SqliteFactory::open(&path, identity("a", 4)).unwrap();
    let mut b = f.connect().unwrap();
    let p = parent("gone", "h", 1);
    let q = parent("kept", "h", 1);
    all_ok(b.write(&[
        p.clone(),
        chunk(&p, 0, "bye", unit(0, 4)),
        q.clone(),
        chunk(&q, 0, "hi", unit(1, 4)),
    ]));
    assert_eq!(f.delete(&["gone".to_string()]).unwrap(), 1);
    let r = SqliteReader::open(&path).unwrap();
    assert_eq!(r.counts().unwrap(), (1, 1, 1));
    assert!(r.keyword("bye", 5).unwrap().is_empty());
    assert_eq!(
        f.all_document_ids()
            .unwrap()
            .into_iter()
            .collect::<Vec<_>>(),
        vec!["kept".to_string()]
    );
}

#[test]
fn an_item_sqlite_rejects_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.db");
    let f = SqliteFactory::open(&path, identity("a", 4)).unwrap();
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER poison BEFORE INSERT ON documents WHEN NEW.id = 'poison'
             BEGIN SELECT RAISE(ABORT, 'poisoned row'); END;",
        )
        .unwrap();
    let mut b = f.connect().unwrap();
    let p = parent("good", "h", 1);
    let r = b.write(&[
        p.clone(),
        parent("poison", "h", 0),
        chunk(&p, 0, "fine", unit(0, 4)),
    ]);
    assert!(r[0].is_ok() && r[2].is_ok(), "{r:?}");
    let e = r[1].clone().unwrap_err();
    assert!(e.message.contains("poisoned row") && !e.retryable, "{e}");
    assert_eq!(
        SqliteReader::open(&path).unwrap().counts().unwrap(),
        (1, 1, 1)
    );
}

fn key_of(text: &str) -> InputKey {
    Chunk::input_key_of(&text.bytes().map(u32::from).collect::<Vec<_>>())
}

#[test]
fn stored_vectors_are_found_by_input_key_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.db");
    let f = SqliteFactory::open(&path, identity("a", 4)).unwrap();
    let mut b = f.connect().unwrap();
    let p = parent("doc", "h1", 2);
    let v = vec![0.5, 0.5, 0.5, 0.5];
    all_ok(b.write(&[
        p.clone(),
        chunk(&p, 0, "alpha one", v.clone()),
        chunk(&p, 1, "beta two", unit(1, 4)),
    ]));
    let mut stored = f
        .stored_vectors()
        .unwrap()
        .expect("sqlite can look vectors up");
    assert_eq!(stored.vector_for(&key_of("alpha one")).unwrap(), Some(v));
    assert_eq!(
        stored.vector_for(&key_of("beta two")).unwrap(),
        Some(unit(1, 4))
    );
    assert_eq!(stored.vector_for(&key_of("alpha two")).unwrap(), None);

    // Gone with its document.
    f.delete(&["doc".to_string()]).unwrap();
    assert_eq!(stored.vector_for(&key_of("alpha one")).unwrap(), None);

    // An index opened without a model has no vectors to give.
    let f = SqliteFactory::open(&dir.path().join("plain.db"), no_model()).unwrap();
    assert!(f.stored_vectors().unwrap().is_none());
}

mod lifecycle;
mod migration;
