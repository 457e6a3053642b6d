//! The indexes a backend test runs against: SQLite always, and PostgreSQL when
//! `RAGLINE_TEST_POSTGRES` names a server (`scripts/postgres.sh start` prints its URL; `.ci/run`
//! sets it, with `RAGLINE_REQUIRE_POSTGRES=1` so that a missing server fails instead of
//! skipping). One suite, parameterised by backend: each test loops over [`test_indexes`] and
//! reads what was written through [`TestIndex`], whatever the store.

use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard};

use ragline::indexers::{open_reader, IndexUri};

/// Tests that stop the server hold this for writing; every other Postgres test for reading.
static SERVER: RwLock<()> = RwLock::new(());

/// Whether the Postgres tests must run (`RAGLINE_REQUIRE_POSTGRES=1`, as CI sets): then a
/// missing server fails them instead of skipping them.
pub fn postgres_required() -> bool {
    std::env::var("RAGLINE_REQUIRE_POSTGRES").as_deref() == Ok("1")
}

/// The server's URL, or None (with a message) when the Postgres tests are not asked for.
pub fn postgres_url() -> Option<String> {
    match std::env::var("RAGLINE_TEST_POSTGRES") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                !postgres_required(),
                "RAGLINE_TEST_POSTGRES is not set and RAGLINE_REQUIRE_POSTGRES=1: run \
                 `export RAGLINE_TEST_POSTGRES=$(scripts/postgres.sh start)`"
            );
            eprintln!(
                "SKIPPED (postgres): RAGLINE_TEST_POSTGRES is not set; run \
                 `export RAGLINE_TEST_POSTGRES=$(scripts/postgres.sh start)` to include PostgreSQL"
            );
            None
        }
    }
}

pub fn server_shared() -> RwLockReadGuard<'static, ()> {
    SERVER.read().unwrap_or_else(|e| e.into_inner())
}

#[cfg(feature = "failpoints")]
pub fn server_exclusive() -> std::sync::RwLockWriteGuard<'static, ()> {
    SERVER.write().unwrap_or_else(|e| e.into_inner())
}

/// A kind of store the lifecycle tests run against: SQLite always, PostgreSQL when the tests
/// have a server.
#[derive(Clone, Debug)]
pub enum BackendKind {
    Sqlite,
    Postgres(String),
}

/// Every kind there is to test here.
pub fn backend_kinds() -> Vec<BackendKind> {
    let mut v = vec![BackendKind::Sqlite];
    if let Some(url) = postgres_url() {
        v.push(BackendKind::Postgres(url));
    }
    v
}

impl BackendKind {
    /// A fresh index of this kind, named `name` (a file in `dir`, or a schema).
    pub fn index(&self, dir: &Path, name: &str) -> TestIndex {
        match self {
            BackendKind::Sqlite => TestIndex::Sqlite(dir.join(format!("{name}.db"))),
            BackendKind::Postgres(url) => postgres_index(url, name),
        }
    }
}

pub enum TestIndex {
    Sqlite(PathBuf),
    Postgres {
        url: String,
        schema: String,
        _server: RwLockReadGuard<'static, ()>,
    },
}

/// The indexes a test named `name` writes into: a fresh SQLite file in `dir`, and a fresh
/// schema on the test server.
pub fn test_indexes(dir: &Path, name: &str) -> Vec<TestIndex> {
    let mut v = vec![TestIndex::Sqlite(dir.join(format!("{name}.db")))];
    if let Some(url) = postgres_url() {
        v.push(postgres_index(&url, name));
    }
    v
}

/// A fresh, empty schema for `name` on the server at `url`.
pub fn postgres_index(url: &str, name: &str) -> TestIndex {
    let guard = server_shared();
    let schema = format!("t_{name}_{}", std::process::id());
    let mut c =
        postgres::Client::connect(url, postgres::NoTls).expect("connect to the test server");
    c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .unwrap();
    TestIndex::Postgres {
        url: url.to_string(),
        schema,
        _server: guard,
    }
}

impl TestIndex {
    /// A schema a test has written already (dropped when the test passes).
    #[cfg(feature = "failpoints")]
    pub fn existing(url: &str, schema: &str) -> TestIndex {
        TestIndex::Postgres {
            url: url.to_string(),
            schema: schema.to_string(),
            _server: server_shared(),
        }
    }

    pub fn uri(&self) -> String {
        match self {
            TestIndex::Sqlite(p) => format!("sqlite://{}", p.display()),
            TestIndex::Postgres { url, schema, .. } => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}schema={schema}")
            }
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            TestIndex::Sqlite(_) => "sqlite",
            TestIndex::Postgres { .. } => "postgres",
        }
    }

    /// (documents, chunks, chunks with a vector), as search sees them.
    pub fn counts(&self) -> (u64, u64, u64) {
        let uri: IndexUri = self.uri().parse().unwrap();
        open_reader(&uri, true).unwrap().counts().unwrap()
    }

    fn pg(&self) -> Option<(postgres::Client, &str)> {
        match self {
            TestIndex::Postgres { url, schema, .. } => Some((
                postgres::Client::connect(url, postgres::NoTls).unwrap(),
                schema.as_str(),
            )),
            TestIndex::Sqlite(_) => None,
        }
    }

    /// (document id, chunk id, text) of every chunk, by chunk id.
    pub fn chunks(&self) -> Vec<(String, String, String)> {
        match self {
            TestIndex::Sqlite(db) => {
                let conn = rusqlite::Connection::open(db).unwrap();
                let mut s = conn
                    .prepare(
                        "SELECT document_id, id, text FROM chunks
                         WHERE replaced_by IS NULL ORDER BY id",
                    )
                    .unwrap();
                s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap()
            }
            TestIndex::Postgres { .. } => {
                let (mut c, s) = self.pg().unwrap();
                c.query(
                    &format!(
                        "SELECT document_id, id, text FROM {s}.chunks
                         WHERE replaced_by IS NULL ORDER BY id COLLATE \"C\""
                    ),
                    &[],
                )
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect()
            }
        }
    }

    /// The sparse vector of every current chunk that has one, by chunk id: (term, weight)
    /// pairs, terms ascending.
    pub fn sparse_vectors(&self) -> std::collections::BTreeMap<String, Vec<(u32, f32)>> {
        let mut out: std::collections::BTreeMap<String, Vec<(u32, f32)>> = Default::default();
        match self {
            TestIndex::Sqlite(db) => {
                let conn = rusqlite::Connection::open(db).unwrap();
                let mut s = conn
                    .prepare(
                        "SELECT c.id, p.term, p.weight FROM sparse_postings p
                         JOIN chunks c ON c.rowid = p.chunk
                         WHERE c.replaced_by IS NULL ORDER BY c.id, p.term",
                    )
                    .unwrap();
                let rows = s
                    .query_map([], |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, f64>(2)?,
                        ))
                    })
                    .unwrap();
                for row in rows {
                    let (id, term, weight) = row.unwrap();
                    out.entry(id)
                        .or_default()
                        .push((term as u32, weight as f32));
                }
            }
            TestIndex::Postgres { .. } => {
                let (mut c, s) = self.pg().unwrap();
                let rows = c
                    .query(
                        &format!(
                            "SELECT c.id, v.embedding FROM {s}.sparse_vectors v
                             JOIN {s}.chunks c ON c.rowid = v.chunk
                             WHERE c.replaced_by IS NULL"
                        ),
                        &[],
                    )
                    .unwrap();
                for r in rows {
                    let v: pgvector::SparseVector = r.get(1);
                    let pairs = v
                        .indices()
                        .iter()
                        .zip(v.values())
                        .map(|(i, w)| (*i as u32, *w))
                        .collect();
                    out.insert(r.get(0), pairs);
                }
            }
        }
        out
    }

    /// (document id, chunk text, vector) of every current chunk with a vector in the active
    /// set, by chunk id.
    pub fn vectors(&self) -> Vec<(String, String, Vec<f32>)> {
        self.vectors_with_ids()
            .into_iter()
            .map(|(doc, _, text, v)| (doc, text, v))
            .collect()
    }

    /// (document id, chunk id, chunk text, vector) of every current chunk with a vector in
    /// the active set, by chunk id.
    pub fn vectors_with_ids(&self) -> Vec<(String, String, String, Vec<f32>)> {
        match self {
            TestIndex::Sqlite(db) => {
                ragline::indexers::sqlite::register_sqlite_vec();
                let conn = rusqlite::Connection::open(db).unwrap();
                let table: String = conn
                    .query_row(
                        "SELECT vec_table FROM vector_sets WHERE state = 'active'",
                        [],
                        |r| r.get(0),
                    )
                    .unwrap();
                let mut s = conn
                    .prepare(&format!(
                        "SELECT c.document_id, c.id, c.text, v.embedding FROM chunks c
                         JOIN {table} v ON v.rowid = c.rowid
                         WHERE c.replaced_by IS NULL ORDER BY c.id"
                    ))
                    .unwrap();
                s.query_map([], |r| {
                    let bytes: Vec<u8> = r.get(3)?;
                    let v = bytes
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect();
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, v))
                })
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
            }
            TestIndex::Postgres { .. } => {
                let (mut c, s) = self.pg().unwrap();
                let table: String = c
                    .query_one(
                        &format!("SELECT vec_table FROM {s}.vector_sets WHERE state = 'active'"),
                        &[],
                    )
                    .unwrap()
                    .get(0);
                c.query(
                    &format!(
                        "SELECT c.document_id, c.id, c.text, v.embedding::vector
                         FROM {s}.chunks c JOIN {s}.{table} v ON v.rowid = c.rowid
                         WHERE c.replaced_by IS NULL ORDER BY c.id COLLATE \"C\""
                    ),
                    &[],
                )
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r.get(0),
                        r.get(1),
                        r.get(2),
                        r.get::<_, pgvector::Vector>(3).to_vec(),
                    )
                })
                .collect()
            }
        }
    }

    /// A number a query gives: `sqlite` on the file, `postgres` (with `{s}` for the schema)
    /// on the server.
    pub fn count(&self, sqlite: &str, postgres: &str) -> i64 {
        match self {
            TestIndex::Sqlite(db) => rusqlite::Connection::open(db)
                .unwrap()
                .query_row(sqlite, [], |r| r.get(0))
                .unwrap(),
            TestIndex::Postgres { .. } => {
                let (mut c, s) = self.pg().unwrap();
                c.query_one(&postgres.replace("{s}", s), &[])
                    .unwrap()
                    .get(0)
            }
        }
    }

    /// Two text columns of each row a query gives (as for [`TestIndex::count`]).
    pub fn strings(&self, sqlite: &str, postgres: &str) -> Vec<(String, String)> {
        match self {
            TestIndex::Sqlite(db) => {
                let conn = rusqlite::Connection::open(db).unwrap();
                let mut st = conn.prepare(sqlite).unwrap();
                st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap()
            }
            TestIndex::Postgres { .. } => {
                let (mut c, s) = self.pg().unwrap();
                c.query(&postgres.replace("{s}", s), &[])
                    .unwrap()
                    .iter()
                    .map(|r| (r.get(0), r.get(1)))
                    .collect()
            }
        }
    }

    /// (text, vector) of every chunk row with a vector in the active set, old versions kept
    /// for search included.
    #[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
    pub fn texts_and_vectors(&self) -> Vec<(String, Vec<f32>)> {
        match self {
            TestIndex::Sqlite(db) => {
                ragline::indexers::sqlite::register_sqlite_vec();
                let conn = rusqlite::Connection::open(db).unwrap();
                let table: String = conn
                    .query_row(
                        "SELECT vec_table FROM vector_sets WHERE state = 'active'",
                        [],
                        |r| r.get(0),
                    )
                    .unwrap();
                let mut st = conn
                    .prepare(&format!(
                        "SELECT c.text, v.embedding FROM chunks c JOIN {table} v
                         ON v.rowid = c.rowid"
                    ))
                    .unwrap();
                st.query_map([], |r| {
                    let b: Vec<u8> = r.get(1)?;
                    Ok((
                        r.get(0)?,
                        b.chunks_exact(4)
                            .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                            .collect(),
                    ))
                })
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
            }
            TestIndex::Postgres { .. } => {
                let (mut c, s) = self.pg().unwrap();
                let table: String = c
                    .query_one(
                        &format!("SELECT vec_table FROM {s}.vector_sets WHERE state = 'active'"),
                        &[],
                    )
                    .unwrap()
                    .get(0);
                c.query(
                    &format!(
                        "SELECT c.text, v.embedding::vector FROM {s}.chunks c
                         JOIN {s}.{table} v ON v.rowid = c.rowid"
                    ),
                    &[],
                )
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get::<_, pgvector::Vector>(1).to_vec()))
                .collect()
            }
        }
    }

    /// Distinct model inputs among the chunks.
    pub fn distinct_input_keys(&self) -> u64 {
        match self {
            TestIndex::Sqlite(db) => {
                let conn = rusqlite::Connection::open(db).unwrap();
                conn.query_row("SELECT COUNT(DISTINCT input_key) FROM chunks", [], |r| {
                    r.get(0)
                })
                .unwrap()
            }
            TestIndex::Postgres { .. } => {
                let (mut c, s) = self.pg().unwrap();
                let n: i64 = c
                    .query_one(
                        &format!("SELECT COUNT(DISTINCT input_key) FROM {s}.chunks"),
                        &[],
                    )
                    .unwrap()
                    .get(0);
                n as u64
            }
        }
    }
}

impl Drop for TestIndex {
    /// A passing test leaves nothing on the server.
    fn drop(&mut self) {
        if let TestIndex::Postgres { url, schema, .. } = self {
            if !std::thread::panicking() {
                if let Ok(mut c) = postgres::Client::connect(url, postgres::NoTls) {
                    let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
                }
            }
        }
    }
}
