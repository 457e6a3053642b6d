//! The backend suite: the same tests of writes, incremental runs, pruning, vector reuse and
//! the whole lifecycle, run against every store: SQLite always, PostgreSQL when
//! `RAGLINE_TEST_POSTGRES` names a server (`scripts/postgres.sh start` prints its URL;
//! `scripts/test.sh` and `.ci/run` set it). Synthetic documents and vectors, no model.

mod lifecycle;

use crate::document::{Chunk, Document, InputKey};
use crate::indexers::{
    self, BackendFactory, IndexIdentity, IndexReader, IndexStore, IndexUri, ItemError,
    ModelIdentity,
};

pub(crate) fn identity(fp: &str, dim: usize) -> IndexIdentity {
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
        ann: Default::default(),
    }
}

/// What a `--no-chunk` run writes with: no model.
pub(crate) fn no_model() -> IndexIdentity {
    IndexIdentity {
        model: None,
        pipeline_fingerprint: "extract-v1".into(),
        defer_embed: false,
        priority: crate::lifecycle::Priority::Fresh,
        ann: Default::default(),
    }
}

pub(crate) fn parent(id: &str, hash: &str, children: u32) -> Document {
    let mut d = Document::new(id, format!("text of {id}"));
    d.content_hash = Some(hash.into());
    d.children = children;
    d
}

pub(crate) fn chunk(parent: &Document, ordinal: u32, text: &str, v: Vec<f32>) -> Document {
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

pub(crate) fn unit(i: usize, dim: usize) -> Vec<f32> {
    let mut v = vec![0.0; dim];
    v[i % dim] = 1.0;
    v
}

pub(crate) fn all_ok(r: Vec<Result<(), ItemError>>) {
    for (i, x) in r.iter().enumerate() {
        assert!(x.is_ok(), "item {i}: {x:?}");
    }
}

pub(crate) fn key_of(text: &str) -> InputKey {
    Chunk::input_key_of(&text.bytes().map(u32::from).collect::<Vec<_>>())
}

/// A fresh, empty index of one backend for one test.
pub(crate) struct TestIndex {
    pub uri: IndexUri,
    /// The Postgres server and schema (dropped when the test passes).
    pg: Option<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

/// The indexes a test named `name` runs against: a fresh SQLite file, and a fresh schema on
/// the Postgres test server when there is one.
pub(crate) fn backends(name: &str) -> Vec<TestIndex> {
    backends_with(name, "")
}

/// [`backends`], with `pg_options` (`&key=value...`) added to the Postgres URI.
pub(crate) fn backends_with(name: &str, pg_options: &str) -> Vec<TestIndex> {
    let dir = tempfile::tempdir().unwrap();
    let mut v = vec![TestIndex {
        uri: IndexUri::Sqlite(dir.path().join("i.db")),
        pg: None,
        _dir: Some(dir),
    }];
    match std::env::var("RAGLINE_TEST_POSTGRES") {
        Ok(url) if !url.is_empty() && cfg!(feature = "postgres") => {
            let schema = format!("u_{name}_{}", std::process::id());
            pg_execute(&url, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
            let sep = if url.contains('?') { '&' } else { '?' };
            v.push(TestIndex {
                uri: format!("{url}{sep}schema={schema}{pg_options}")
                    .parse()
                    .unwrap(),
                pg: Some((url, schema)),
                _dir: None,
            });
        }
        Ok(url) if !url.is_empty() => {
            eprintln!("SKIPPED (postgres): this build leaves the `postgres` feature out")
        }
        _ => eprintln!(
            "SKIPPED (postgres): RAGLINE_TEST_POSTGRES is not set; run \
             `export RAGLINE_TEST_POSTGRES=$(scripts/postgres.sh start)` to include PostgreSQL"
        ),
    }
    v
}

impl TestIndex {
    pub fn name(&self) -> &'static str {
        if self.pg.is_some() {
            "postgres"
        } else {
            "sqlite"
        }
    }

    /// Open it for a run with `identity` (creating it the first time).
    pub fn open(&self, identity: IndexIdentity) -> Box<dyn BackendFactory> {
        self.try_open(identity).unwrap()
    }

    pub fn try_open(
        &self,
        identity: IndexIdentity,
    ) -> Result<Box<dyn BackendFactory>, indexers::BackendError> {
        indexers::open(&self.uri, identity)
    }

    pub fn store(&self) -> Box<dyn IndexStore> {
        indexers::open_store(&self.uri).unwrap()
    }

    /// A reader (exact vector search).
    pub fn reader(&self) -> Box<dyn IndexReader> {
        indexers::open_reader(&self.uri, true).unwrap()
    }

    /// Run SQL: `sqlite` on the SQLite file, `postgres` (with `{s}` for the schema) on the
    /// server.
    pub fn execute(&self, sqlite: &str, postgres: &str) {
        match (&self.uri, &self.pg) {
            (_, Some((url, schema))) => pg_execute(url, &postgres.replace("{s}", schema)),
            (IndexUri::Sqlite(path), None) => rusqlite::Connection::open(path)
                .unwrap()
                .execute_batch(sqlite)
                .unwrap(),
            _ => unreachable!("test indexes are sqlite or postgres"),
        }
    }

    /// A number a query gives (as for [`TestIndex::execute`]).
    pub fn count(&self, sqlite: &str, postgres: &str) -> i64 {
        match (&self.uri, &self.pg) {
            (_, Some((url, schema))) => pg_count(url, &postgres.replace("{s}", schema)),
            (IndexUri::Sqlite(path), None) => rusqlite::Connection::open(path)
                .unwrap()
                .query_row(sqlite, [], |r| r.get(0))
                .unwrap(),
            _ => unreachable!("test indexes are sqlite or postgres"),
        }
    }
}

impl Drop for TestIndex {
    /// A passing test leaves nothing on the server.
    fn drop(&mut self) {
        if let Some((url, schema)) = &self.pg {
            if !std::thread::panicking() {
                pg_execute(url, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
            }
        }
    }
}

/// Run SQL on the Postgres test server.
#[cfg(feature = "postgres")]
fn pg_execute(url: &str, sql: &str) {
    let mut c = postgres::Client::connect(url, postgres::NoTls)
        .expect("connect to the RAGLINE_TEST_POSTGRES server");
    c.batch_execute(sql).unwrap();
}

/// The number a query on the Postgres test server gives.
#[cfg(feature = "postgres")]
fn pg_count(url: &str, sql: &str) -> i64 {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    c.query_one(sql, &[]).unwrap().get(0)
}

#[cfg(not(feature = "postgres"))]
fn pg_execute(_: &str, _: &str) {
    unreachable!("a build without postgres has no Postgres test index")
}

#[cfg(not(feature = "postgres"))]
fn pg_count(_: &str, _: &str) -> i64 {
    unreachable!("a build without postgres has no Postgres test index")
}

#[test]
fn upserts_are_idempotent_and_rechunking_removes_stale_chunks() {
    for ix in backends("upserts") {
        let f = ix.open(identity("a", 4));
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
        let r = ix.reader();
        assert_eq!(
            r.counts().unwrap(),
            (1, 3, 3),
            "{}: writing twice duplicates nothing",
            ix.name()
        );
        assert_eq!(f.known_documents().unwrap()["doc"].content_hash, "h1");

        // New content, two chunks: the third goes, with its vector and full-text entry.
        let p2 = parent("doc", "h2", 2);
        all_ok(b.write(&[
            p2.clone(),
            chunk(&p2, 0, "alpha again", unit(0, 4)),
            chunk(&p2, 1, "delta four", unit(3, 4)),
        ]));
        let r = ix.reader();
        assert_eq!(r.counts().unwrap(), (1, 2, 2), "{}", ix.name());
        assert!(
            r.keyword("gamma", 10).unwrap().is_empty(),
            "{}: stale chunk left in the keyword index",
            ix.name()
        );
        let hits = r.keyword("delta", 10).unwrap();
        assert_eq!(hits.len(), 1, "{}", ix.name());
        assert_eq!(r.chunk(hits[0].0).unwrap().unwrap().id, "doc#1");
        let near = r.nearest(&unit(3, 4), 1).unwrap();
        assert_eq!(r.chunk(near[0].0).unwrap().unwrap().text, "delta four");
        assert!(
            near[0].1.abs() < 1e-6,
            "{}: cosine distance of identical vectors is 0",
            ix.name()
        );
        assert_eq!(
            ix.count(
                "SELECT COUNT(*) FROM chunk_vectors",
                "SELECT count(*) FROM {s}.vectors_1"
            ),
            2,
            "{}: the stale chunk's vector went with it",
            ix.name()
        );
    }
}

#[test]
fn a_document_with_missing_chunks_is_not_known() {
    for ix in backends("missing") {
        let f = ix.open(identity("a", 4));
        let mut b = f.connect().unwrap();
        let p = parent("doc", "h1", 2);
        // The run stopped after the document and one of its two chunks.
        all_ok(b.write(&[p.clone(), chunk(&p, 0, "only one", unit(0, 4))]));
        assert!(
            !f.known_documents().unwrap().contains_key("doc"),
            "{}",
            ix.name()
        );
        all_ok(b.write(&[chunk(&p, 1, "and two", unit(1, 4))]));
        assert!(
            f.known_documents().unwrap().contains_key("doc"),
            "{}",
            ix.name()
        );
    }
}

#[test]
fn bad_items_fail_alone() {
    for ix in backends("bad_items") {
        let f = ix.open(identity("a", 4));
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
        assert!(r[0].is_ok() && r[3].is_ok(), "{}: {r:?}", ix.name());
        let e1 = r[1].clone().unwrap_err();
        assert!(
            !e1.retryable && e1.message.contains("8 dimensions in an index of 4"),
            "{e1}"
        );
        // A chunk without a vector is a chunk whose embedding is pending (a deferred ingest).
        assert!(r[2].is_ok(), "{}: {:?}", ix.name(), r[2]);
        let reader = ix.reader();
        assert_eq!(reader.counts().unwrap(), (2, 1, 0), "{}", ix.name());
        assert_eq!(reader.unembedded().unwrap(), (1, 1), "{}", ix.name());
    }
    // An index without a model takes no chunk at all: its vectors could never be computed.
    for ix in backends("no_model") {
        let plain = ix.open(no_model());
        let p = parent("doc", "h", 1);
        let r = plain
            .connect()
            .unwrap()
            .write(&[chunk(&p, 0, "x", unit(0, 4))]);
        assert!(
            r[0].clone()
                .unwrap_err()
                .message
                .contains("without a model"),
            "{}: {r:?}",
            ix.name()
        );
    }
}

/// A vector with NaN or infinite values fails alone, with the same reason on every backend
/// (only Postgres refused one before; SQLite stored it, and vector search ranked it anywhere).
#[test]
fn non_finite_vectors_fail_alone_on_every_backend() {
    for ix in backends("non_finite") {
        let f = ix.open(identity("a", 4));
        let mut b = f.connect().unwrap();
        let p = parent("doc", "h", 3);
        let r = b.write(&[
            p.clone(),
            chunk(&p, 0, "not a number", vec![f32::NAN, 0.0, 0.0, 1.0]),
            chunk(&p, 1, "infinite", vec![0.0, f32::INFINITY, 0.0, 0.0]),
            chunk(&p, 2, "fine", unit(2, 4)),
        ]);
        assert!(r[0].is_ok() && r[3].is_ok(), "{}: {r:?}", ix.name());
        for e in [&r[1], &r[2]] {
            let e = e.clone().unwrap_err();
            assert!(
                !e.retryable && e.message.contains("NaN or infinite"),
                "{}: {e}",
                ix.name()
            );
        }
        let reader = ix.reader();
        assert_eq!(reader.counts().unwrap(), (1, 1, 1), "{}", ix.name());
        let near = reader.nearest(&unit(2, 4), 5).unwrap();
        assert_eq!(near.len(), 1, "{}: {near:?}", ix.name());
    }
}

#[test]
fn another_model_is_refused_without_touching_the_index() {
    for ix in backends("another_model") {
        let f = ix.open(identity("a", 4));
        let p = parent("doc", "h", 1);
        all_ok(
            f.connect()
                .unwrap()
                .write(&[p.clone(), chunk(&p, 0, "alpha", unit(0, 4))]),
        );
        drop(f);
        let err = ix.try_open(identity("b", 4)).err().unwrap().to_string();
        assert!(
            err.contains("holds vectors of model `test-model`") && err.contains("another --index"),
            "{}: {err}",
            ix.name()
        );
        let err = ix.try_open(identity("a", 8)).err().unwrap().to_string();
        assert!(err.contains("4 dimensions"), "{}: {err}", ix.name());
        assert_eq!(ix.reader().counts().unwrap(), (1, 1, 1), "{}", ix.name());
        assert_eq!(ix.store().sets().unwrap().len(), 1, "{}", ix.name());
    }
}

#[test]
fn pruning_deletes_documents_and_their_chunks() {
    for ix in backends("pruning") {
        let f = ix.open(identity("a", 4));
        let mut b = f.connect().unwrap();
        let p = parent("gone", "h", 1);
        let q = parent("kept", "h", 1);
        all_ok(b.write(&[
            p.clone(),
            chunk(&p, 0, "bye", unit(0, 4)),
            q.clone(),
            chunk(&q, 0, "hi", unit(1, 4)),
        ]));
        assert_eq!(f.delete_documents(&["gone".to_string()]).unwrap(), 1);
        let r = ix.reader();
        assert_eq!(r.counts().unwrap(), (1, 1, 1), "{}", ix.name());
        assert!(r.keyword("bye", 5).unwrap().is_empty(), "{}", ix.name());
        assert_eq!(
            f.document_ids()
                .unwrap()
                .unwrap()
                .into_iter()
                .collect::<Vec<_>>(),
            vec!["kept".to_string()]
        );
        assert_eq!(
            r.nearest(&unit(0, 4), 5).unwrap().len(),
            1,
            "{}: the vector went too",
            ix.name()
        );
    }
}

#[test]
fn an_item_the_database_rejects_fails_alone() {
    for ix in backends("rejects") {
        let f = ix.open(identity("a", 4));
        ix.execute(
            "CREATE TRIGGER poison BEFORE INSERT ON documents WHEN NEW.id = 'poison'
             BEGIN SELECT RAISE(ABORT, 'poisoned row'); END;",
            "CREATE FUNCTION {s}.poison() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.id = 'poison' THEN RAISE EXCEPTION 'poisoned row'; END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER poison BEFORE INSERT ON {s}.documents
                 FOR EACH ROW EXECUTE FUNCTION {s}.poison();",
        );
        let mut b = f.connect().unwrap();
        let p = parent("good", "h", 1);
        let r = b.write(&[
            p.clone(),
            parent("poison", "h", 0),
            chunk(&p, 0, "fine", unit(0, 4)),
        ]);
        assert!(r[0].is_ok() && r[2].is_ok(), "{}: {r:?}", ix.name());
        let e = r[1].clone().unwrap_err();
        assert!(
            e.message.contains("poisoned row") && !e.retryable,
            "{}: {e}",
            ix.name()
        );
        assert_eq!(ix.reader().counts().unwrap(), (1, 1, 1), "{}", ix.name());
    }
}

#[test]
fn stored_vectors_are_found_by_input_key_only() {
    for ix in backends("stored") {
        let f = ix.open(identity("a", 4));
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
            .expect("the index can look vectors up");
        assert_eq!(stored.vector_for(&key_of("alpha one")).unwrap(), Some(v));
        assert_eq!(
            stored.vector_for(&key_of("beta two")).unwrap(),
            Some(unit(1, 4))
        );
        assert_eq!(stored.vector_for(&key_of("alpha two")).unwrap(), None);

        // Gone with its document.
        f.delete_documents(&["doc".to_string()]).unwrap();
        assert_eq!(
            stored.vector_for(&key_of("alpha one")).unwrap(),
            None,
            "{}",
            ix.name()
        );
    }
    // An index opened without a model has no vectors to give.
    for ix in backends("stored_plain") {
        assert!(ix.open(no_model()).stored_vectors().unwrap().is_none());
    }
}

#[test]
fn halfvec_indexes_keep_float16_vectors_through_writes_search_and_enrich() {
    for ix in backends_with("halfvec", "&vector=halfvec")
        .into_iter()
        .filter(|ix| ix.pg.is_some())
    {
        let f = ix.open(identity("a", 4));
        let mut b = f.connect().unwrap();
        let p = parent("doc", "h1", 2);
        let mut pending = chunk(&p, 1, "later", unit(0, 4));
        pending.chunk.as_mut().unwrap().vector = None;
        all_ok(b.write(&[
            p.clone(),
            chunk(&p, 0, "now", vec![0.6, 0.8, 0.0, 0.0]),
            pending,
        ]));
        assert_eq!(
            ix.count(
                "",
                "SELECT count(*) FROM information_schema.columns WHERE table_schema = '{s}'
                   AND table_name = 'vectors_1' AND udt_name = 'halfvec'"
            ),
            1,
            "the vectors are stored as halfvec"
        );
        let r = ix.reader();
        let near = r.nearest(&[0.6, 0.8, 0.0, 0.0], 1).unwrap();
        assert!(near[0].1.abs() < 1e-3, "{near:?}");
        let mut stored = f.stored_vectors().unwrap().unwrap();
        let v = stored.vector_for(&key_of("now")).unwrap().unwrap();
        assert!(
            (v[0] - 0.6).abs() < 1e-3 && (v[1] - 0.8).abs() < 1e-3,
            "{v:?}"
        );
        // The pending chunk gets its vector through the lifecycle, as float16 too.
        let mut store = ix.store();
        let crate::lifecycle::Claim::Items(got) = store
            .claim(&crate::lifecycle::ClaimRequest {
                owner: "w".into(),
                stages: vec![],
                vector_sets: vec![],
                max_items: 10,
                max_cost: u64::MAX,
                lease: std::time::Duration::from_secs(60),
                retry_limit: 3,
            })
            .unwrap()
        else {
            panic!("the pending chunk's document is claimable")
        };
        let todo = store.pending_chunks(&got[0].key).unwrap();
        let v = vec![crate::lifecycle::ChunkVector {
            rowid: todo[0].rowid,
            guard: todo[0].input_key,
            vector: unit(2, 4),
        }];
        assert_eq!(store.write_vectors(1, &v, &["doc".into()]).unwrap(), 1);
        assert_eq!(ix.reader().counts().unwrap(), (1, 2, 2));
        assert_eq!(store.status().unwrap().stages["embed"].done, 1);
    }
}

/// Two writers adding the same new documents at once (a redelivered batch): on Postgres
/// both may see the documents as new and COPY the same chunks; the one the unique index
/// stops writes its batch again as upserts. Every write succeeds and nothing is doubled.
#[test]
fn two_writers_adding_the_same_new_documents_at_once_double_nothing() {
    for ix in backends("same_new") {
        let f = ix.open(identity("a", 4));
        let docs = 12;
        let batch = |d: usize| {
            let p = parent(&format!("doc{d}"), "h1", 3);
            let mut b = vec![p.clone()];
            b.extend((0..3).map(|i| chunk(&p, i, &format!("text {d} {i}"), unit(i as usize, 4))));
            b
        };
        let barrier = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            for _ in 0..2 {
                let mut b = f.connect().unwrap();
                let barrier = &barrier;
                s.spawn(move || {
                    for d in 0..docs {
                        let batch = batch(d);
                        barrier.wait();
                        all_ok(b.write(&batch));
                    }
                });
            }
        });
        assert_eq!(
            ix.reader().counts().unwrap(),
            (docs as u64, 3 * docs as u64, 3 * docs as u64),
            "{}",
            ix.name()
        );
        assert_eq!(
            ix.store().status().unwrap().stages["embed"].done,
            docs as u64
        );
    }
}
