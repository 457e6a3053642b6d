//! `postgres://USER[:PASS]@HOST:PORT/DB[?schema=S&...]`: PostgreSQL with pgvector, the index
//! most RAG builders already run and several machines can share.
//!
//! - `target.rs`: the URI, the password, connecting, errors that say what to do.
//! - `schema.rs`: tables (documents, chunks with `vector(dim)` and a `tsvector`), metadata.
//! - `write.rs`: bulk upserts by binary COPY into a staging table, one transaction a batch.
//! - `reader.rs`: search (HNSW or exact vector, keyword, the rows).
//!
//! Client: the `postgres` crate (sfackler's rust-postgres, synchronous face of tokio-postgres):
//! the indexer threads are plain threads, it has binary COPY, and `pgvector` gives it the
//! vector type. sqlx was the other candidate; its async-only API would put a runtime in every
//! indexer thread for no gain, and its COPY support is raw bytes.
//!
//! The whole enrichment lifecycle lives here too, as in the SQLite index (`queue.rs`,
//! `admin.rs`, `settle.rs`, `sets.rs`): the tables are the durable work queue of
//! `ragline enrich`, claimed with `FOR UPDATE SKIP LOCKED` so that any number of processes on
//! any number of machines share it.

mod admin;
mod fts;
mod outputs;
mod queue;
mod reader;
pub mod schema;
mod sets;
mod settle;
pub mod target;
pub mod tls;
mod write;

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use postgres::error::SqlState;
use postgres::{Client, GenericClient};

pub use queue::PgStore;
pub use reader::PgReader;
pub use target::{PgTarget, VectorType};

use super::identity::HeldModel;
use super::{
    Backend, BackendError, BackendFactory, IndexIdentity, KnownDocument, KnownPage, ModelIdentity,
    SetState, StoredVectors, VectorSet,
};
use crate::document::InputKey;
use crate::lifecycle::{StoreError, CHUNK, EMBED};
use write::PgBackend;

/// What the index says about itself (`meta`).
#[derive(Clone, Debug, Default)]
pub struct PgMeta {
    pub schema_version: i64,
    pub model: Option<String>,
    pub model_dir: Option<String>,
    pub model_fingerprint: Option<String>,
    pub dimension: Option<usize>,
    pub vector_type: Option<VectorType>,
    pub sparse_model: Option<String>,
    pub sparse_model_dir: Option<String>,
    pub sparse_dimension: Option<usize>,
}

pub struct PostgresFactory {
    target: PgTarget,
    identity: IndexIdentity,
    /// How the index stores vectors (fixed when it is made).
    vector_type: VectorType,
}

impl PostgresFactory {
    /// Connect, check the server (pgvector) and the index (schema version, model), and create
    /// or migrate what is missing. A refused run changes nothing.
    pub fn open(target: &PgTarget, identity: IndexIdentity) -> Result<Self, BackendError> {
        let mut client = target.connect()?;
        ensure_pgvector(&mut client, target)?;
        let s = target.schema_sql();
        let err = |e: postgres::Error| pg_error(target, e);
        let mut tx = client.transaction().map_err(err)?;
        // Two runs setting up one schema at once take turns.
        lock_schema(&mut tx, target).map_err(err)?;
        let meta = read_meta(&mut tx, target)?;
        if let Some(meta) = &meta {
            check_model(target, meta, identity.model.as_ref())?;
        }
        let vector_type = meta
            .as_ref()
            .and_then(|m| m.vector_type)
            .unwrap_or(target.vector_type);
        schema::migrate(&mut tx, &s, meta.as_ref().map_or(0, |m| m.schema_version)).map_err(err)?;
        tx.execute(
            &format!(
                "INSERT INTO {s}.meta(key, value) VALUES ('vector_type', $1)
                 ON CONFLICT (key) DO NOTHING"
            ),
            &[&vector_type.name()],
        )
        .map_err(err)?;
        if let Some(model) = &identity.model {
            let now = server_now(&mut tx).map_err(err)?;
            match sets::active(&mut tx, &s).map_err(err)? {
                None => {
                    sets::create(&mut tx, &s, vector_type, model, SetState::Active, now)
                        .map_err(err)?;
                }
                Some(set) if set.tokenizer.is_none() => {
                    tx.execute(
                        &format!("UPDATE {s}.vector_sets SET tokenizer = $2 WHERE id = $1"),
                        &[&(set.id as i32), &model.tokenizer],
                    )
                    .map_err(err)?;
                }
                Some(_) => {}
            }
            if let Some(t) = &model.tokenizer {
                tx.execute(
                    &format!(
                        "INSERT INTO {s}.meta(key, value) VALUES ('chunk_tokenizer', $1)
                         ON CONFLICT (key) DO UPDATE SET value = excluded.value"
                    ),
                    &[t],
                )
                .map_err(err)?;
            }
        }
        tx.commit().map_err(err)?;
        Ok(PostgresFactory {
            target: target.clone(),
            identity,
            vector_type,
        })
    }

    fn client(&self) -> Result<Client, BackendError> {
        self.target.connect()
    }

    fn err(&self, e: postgres::Error) -> BackendError {
        pg_error(&self.target, e)
    }
}

impl BackendFactory for PostgresFactory {
    fn describe(&self) -> String {
        self.target.to_string()
    }

    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(PgBackend::connect(
            self.target.clone(),
            self.identity.pipeline_fingerprint.clone(),
            self.identity.priority,
            self.vector_type,
        )?))
    }

    /// Two: one writer alternates between preparing a batch and waiting for the server to
    /// take it, leaving each idle half the time (`ragline bench --write`: about 12k chunks/s
    /// with one writer, 23k with two on 2 cores).
    fn writers(&self) -> usize {
        2
    }

    /// Documents whose chunks of their current version are all there (and, unless the run
    /// defers embedding, all embedded in the active set).
    fn known_documents(&self) -> Result<HashMap<String, KnownDocument>, BackendError> {
        let mut client = self.client()?;
        let s = self.target.schema_sql();
        let active = sets::active(&mut client, &s).map_err(|e| self.err(e))?;
        let embedded_in: i32 = match (&active, self.identity.defer_embed) {
            (Some(set), false) => set.id as i32,
            _ => -1,
        };
        let rows = client
            .query(
                &format!(
                    "SELECT d.id, d.content_hash, d.fingerprint FROM {s}.documents d
                     JOIN {s}.enrichment c ON c.document_id = d.id AND c.stage = '{CHUNK}'
                          AND c.vector_set = 0 AND c.status = 'done'
                          AND c.input_version = d.version
                     WHERE $1::int < 0 OR EXISTS (
                         SELECT 1 FROM {s}.enrichment e
                         WHERE e.document_id = d.id AND e.stage = '{EMBED}'
                           AND e.vector_set = $1::int AND e.status = 'done'
                           AND e.input_version = d.version)"
                ),
                &[&embedded_in],
            )
            .map_err(|e| self.err(e))?;
        Ok(rows
            .into_iter()
            .map(|r| {
                (
                    r.get::<_, String>(0),
                    KnownDocument {
                        content_hash: r.get(1),
                        fingerprint: r.get(2),
                    },
                )
            })
            .collect())
    }

    fn known_pages(&self, source: &str) -> Result<Vec<KnownPage>, BackendError> {
        let mut client = self.client()?;
        let s = self.target.schema_sql();
        let rows = client
            .query(
                &format!(
                    "SELECT id, metadata->>'url', metadata->>'etag', metadata->>'last_modified',
                            CASE WHEN jsonb_typeof(metadata->'depth') = 'number'
                                 THEN (metadata->>'depth')::float8 END,
                            metadata->>'links', metadata->>'redirected_from'
                     FROM {s}.documents
                     WHERE source = $1 AND jsonb_typeof(metadata->'url') = 'string'"
                ),
                &[&source],
            )
            .map_err(|e| self.err(e))?;
        Ok(rows
            .into_iter()
            .map(|r| KnownPage {
                id: r.get(0),
                url: r.get(1),
                etag: r.get(2),
                last_modified: r.get(3),
                depth: r
                    .get::<_, Option<f64>>(4)
                    .filter(|d| (0.0..=f64::from(u32::MAX)).contains(d))
                    .map(|d| d as u32),
                links: r
                    .get::<_, Option<String>>(5)
                    .and_then(|l| serde_json::from_str(&l).ok()),
                redirected_from: r.get(6),
            })
            .collect())
    }

    fn stored_vectors(&self) -> Result<Option<Box<dyn StoredVectors>>, BackendError> {
        if self.identity.model.is_none() {
            return Ok(None);
        }
        let mut client = self.client()?;
        let active =
            sets::active(&mut client, &self.target.schema_sql()).map_err(|e| self.err(e))?;
        Ok(active.map(|set| {
            Box::new(PgVectors {
                client,
                target: self.target.clone(),
                set,
            }) as Box<dyn StoredVectors>
        }))
    }

    fn document_ids(&self) -> Result<Option<HashSet<String>>, BackendError> {
        let mut client = self.client()?;
        let rows = client
            .query(
                &format!("SELECT id FROM {}.documents", self.target.schema_sql()),
                &[],
            )
            .map_err(|e| self.err(e))?;
        Ok(Some(rows.into_iter().map(|r| r.get(0)).collect()))
    }

    /// Documents go with every chunk (old versions too), vector and lifecycle row, in one
    /// transaction.
    fn delete_documents(&self, ids: &[String]) -> Result<usize, BackendError> {
        let mut client = self.client()?;
        let s = self.target.schema_sql();
        let run = |client: &mut Client| -> Result<usize, postgres::Error> {
            let mut tx = client.transaction()?;
            let all = sets::all(&mut tx, &s)?;
            tx.query_one(
                &sets::delete_chunks(&s, &all, "", "c.document_id = ANY($1::text[])"),
                &[&ids],
            )?;
            let n = tx.execute(
                &format!("DELETE FROM {s}.documents WHERE id = ANY($1::text[])"),
                &[&ids],
            )?;
            let now = server_now(&mut tx)?;
            settle::settle(
                &mut tx,
                &s,
                ids,
                &all,
                crate::lifecycle::Priority::Fresh,
                now,
            )?;
            tx.commit()?;
            Ok(n as usize)
        };
        run(&mut client).map_err(|e| self.err(e))
    }

    /// Build the GIN and HNSW indexes if the run started without them: once over the
    /// bulk-loaded rows is much faster than maintaining them row by row during the load.
    fn finish(&self) -> Result<Vec<String>, BackendError> {
        let mut client = self.client()?;
        ensure_indexes(&mut client, &self.target, self.vector_type)
    }
}

/// Vectors the active set holds, by model input, for chunk reuse (old versions of chunks
/// kept for search count: a vector depends only on the model input).
struct PgVectors {
    client: Client,
    target: PgTarget,
    set: VectorSet,
}

impl StoredVectors for PgVectors {
    /// A connection lost to a server restart is made again (waiting for the server).
    fn vector_for(&mut self, key: &InputKey) -> Result<Option<Vec<f32>>, StoreError> {
        let s = self.target.schema_sql();
        match stored_vector(&mut self.client, &s, &self.set, key) {
            Err(e) if e.is_closed() => {
                self.client = self
                    .target
                    .connect_patiently()
                    .map_err(|e| StoreError::Io(e.to_string()))?;
                stored_vector(&mut self.client, &s, &self.set, key)
            }
            other => other,
        }
        .map_err(|e| store_error(&self.target, e))
    }
}

/// How many chunks with the same model input a reuse look-up checks for a vector.
const REUSE_CANDIDATES: i64 = 64;

/// The vector `set` holds for an identical model input, looked for among the first
/// [`REUSE_CANDIDATES`] chunks with that input: a chunk repeated on thousands of pages (a
/// "See also" section) would otherwise have every look-up probe every earlier copy, most of
/// them still waiting for a vector (quadratic in a deferred ingest). An input whose first
/// copies all lack a vector while a later one has it is embedded again: a lost saving only.
pub(crate) fn stored_vector(
    c: &mut impl GenericClient,
    s: &str,
    set: &VectorSet,
    key: &InputKey,
) -> Result<Option<Vec<f32>>, postgres::Error> {
    let row = c.query_opt(
        &format!(
            "SELECT v.embedding::vector
             FROM (SELECT rowid FROM {s}.chunks WHERE input_key = $1 LIMIT $2) c
             JOIN {s}.{} v ON v.rowid = c.rowid LIMIT 1",
            set.vec_table
        ),
        &[&key.as_slice(), &REUSE_CANDIDATES],
    )?;
    Ok(row
        .map(|r| r.get::<_, pgvector::Vector>(0).to_vec())
        .filter(|v| v.len() == set.dimension))
}

/// The indexes a first bulk load goes without (see `ensure_fts` and `ensure_hnsw`), built
/// now if missing; a note for the summary for each one built.
pub(crate) fn ensure_indexes(
    client: &mut Client,
    target: &PgTarget,
    ty: VectorType,
) -> Result<Vec<String>, BackendError> {
    let mut notes: Vec<String> = ensure_fts(client, target)?.into_iter().collect();
    notes.extend(ensure_hnsw(client, target, ty)?);
    Ok(notes)
}

/// Build the chunks' GIN index (keyword search) if there is none and there are chunks: an
/// index made empty leaves it out until its first load is in. Until then keyword search
/// scans the table: slower, the same results.
fn ensure_fts(client: &mut Client, target: &PgTarget) -> Result<Option<String>, BackendError> {
    let err = |e: postgres::Error| pg_error(target, e);
    let s = target.schema_sql();
    let mut tx = client.transaction().map_err(err)?;
    lock_schema(&mut tx, target).map_err(err)?;
    if schema::has_index(&mut tx, &target.schema, schema::FTS_INDEX).map_err(err)? {
        return Ok(None);
    }
    let any = tx
        .query_opt(&format!("SELECT 1 FROM {s}.chunks LIMIT 1"), &[])
        .map_err(err)?;
    if any.is_none() {
        return Ok(None);
    }
    let started = Instant::now();
    tx.batch_execute(&format!(
        "CREATE INDEX IF NOT EXISTS {} ON {s}.chunks USING gin (fts)",
        schema::FTS_INDEX
    ))
    .map_err(err)?;
    tx.commit().map_err(err)?;
    Ok(Some(format!(
        "built the keyword (GIN) index in {:.1}s",
        started.elapsed().as_secs_f64()
    )))
}

/// Build the HNSW index of the active set if it has none yet and holds vectors. Returns a
/// note for the summary when it did.
fn ensure_hnsw(
    client: &mut Client,
    target: &PgTarget,
    ty: VectorType,
) -> Result<Option<String>, BackendError> {
    let err = |e: postgres::Error| pg_error(target, e);
    let s = target.schema_sql();
    let Some(set) = sets::active(client, &s).map_err(err)? else {
        return Ok(None);
    };
    let mut tx = client.transaction().map_err(err)?;
    // Two runs ending at once build it once.
    lock_schema(&mut tx, target).map_err(err)?;
    if schema::has_hnsw(&mut tx, &target.schema, &set.vec_table).map_err(err)? {
        return Ok(None);
    }
    let n: i64 = tx
        .query_one(&format!("SELECT count(*) FROM {s}.{}", set.vec_table), &[])
        .map_err(err)?
        .get(0);
    if n == 0 {
        return Ok(None);
    }
    let started = Instant::now();
    build_hnsw(&mut tx, target, ty, &set).map_err(err)?;
    tx.commit().map_err(err)?;
    Ok(Some(format!(
        "built the HNSW index over {n} vectors in {:.1}s (m={}, ef_construction={})",
        started.elapsed().as_secs_f64(),
        target.hnsw_m,
        target.ef_construction
    )))
}

/// `CREATE INDEX` of a set's HNSW index (cosine), in the caller's transaction.
pub(crate) fn build_hnsw(
    c: &mut impl GenericClient,
    target: &PgTarget,
    ty: VectorType,
    set: &VectorSet,
) -> Result<(), postgres::Error> {
    c.batch_execute(&format!(
        "CREATE INDEX IF NOT EXISTS {} ON {}.{} USING hnsw (embedding {})
         WITH (m = {}, ef_construction = {})",
        schema::hnsw_index(&set.vec_table),
        target.schema_sql(),
        set.vec_table,
        ty.cosine_ops(),
        target.hnsw_m,
        target.ef_construction
    ))
}

/// Serialise set-up and index builds on one schema, for the caller's transaction.
fn lock_schema(tx: &mut impl GenericClient, target: &PgTarget) -> Result<(), postgres::Error> {
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext($1))",
        &[&format!("ragline:{}", target.schema)],
    )?;
    Ok(())
}

/// The server's clock, in milliseconds since the epoch: what lifecycle times are in, so that
/// every machine sharing the queue agrees on them.
pub(crate) fn server_now(c: &mut impl GenericClient) -> Result<i64, postgres::Error> {
    Ok(c.query_one(
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
        &[],
    )?
    .get(0))
}

pub(crate) fn store_error(target: &PgTarget, e: postgres::Error) -> StoreError {
    match pg_error(target, e) {
        BackendError::Invalid(m) => StoreError::Invalid(m),
        other => StoreError::Io(other.to_string().trim_start_matches("index error: ").into()),
    }
}

/// pgvector is installed in the database, or is created now; else a message that says how.
fn ensure_pgvector(client: &mut Client, target: &PgTarget) -> Result<(), BackendError> {
    let have = client
        .query_opt("SELECT 1 FROM pg_extension WHERE extname = 'vector'", &[])
        .map_err(|e| pg_error(target, e))?;
    if have.is_some() {
        return Ok(());
    }
    match client.batch_execute("CREATE EXTENSION IF NOT EXISTS vector") {
        Ok(()) => Ok(()),
        Err(e) => {
            let db = client
                .query_one("SELECT current_database()", &[])
                .map(|r| r.get::<_, String>(0))
                .unwrap_or_default();
            let why = e
                .as_db_error()
                .map_or(e.to_string(), |d| d.message().to_string());
            Err(BackendError::Invalid(match e.code() {
                Some(c) if c == &SqlState::INSUFFICIENT_PRIVILEGE => format!(
                    "pgvector is not enabled in database `{db}` on {target}, and this user may \
                     not enable it ({why}): run `CREATE EXTENSION vector;` in `{db}` as a \
                     superuser"
                ),
                _ => format!(
                    "{target} cannot enable pgvector ({why}): install the pgvector extension on \
                     the server (https://github.com/pgvector/pgvector#installation), then run \
                     `CREATE EXTENSION vector;` in `{db}`"
                ),
            }))
        }
    }
}

/// The index's metadata, or None when the schema holds no ragline index yet.
/// A sparse vector as pgvector takes it (indices from 0 in its binary form).
pub(crate) fn sparse_vector(
    terms: &[u32],
    weights: &[f32],
    dimension: usize,
) -> pgvector::SparseVector {
    let pairs: Vec<(i32, f32)> = terms
        .iter()
        .zip(weights)
        .filter(|(t, w)| (**t as usize) < dimension && w.is_finite())
        .map(|(t, w)| (*t as i32, *w))
        .collect();
    pgvector::SparseVector::from_map(pairs.iter().map(|(t, w)| (t, w)), dimension as i32)
}

pub fn read_meta(
    client: &mut impl GenericClient,
    target: &PgTarget,
) -> Result<Option<PgMeta>, BackendError> {
    let table = format!("{}.meta", target.schema_sql());
    let exists: Option<String> = client
        .query_one("SELECT to_regclass($1)::text", &[&table])
        .map_err(|e| pg_error(target, e))?
        .get(0);
    if exists.is_none() {
        return Ok(None);
    }
    let rows = client
        .query(&format!("SELECT key, value FROM {table}"), &[])
        .map_err(|e| pg_error(target, e))?;
    let mut meta = PgMeta::default();
    for r in rows {
        let (k, v): (String, String) = (r.get(0), r.get(1));
        match k.as_str() {
            "schema_version" => meta.schema_version = v.parse().unwrap_or(0),
            "model" => meta.model = Some(v),
            "model_dir" => meta.model_dir = Some(v),
            "model_fingerprint" => meta.model_fingerprint = Some(v),
            "dimension" => meta.dimension = v.parse().ok(),
            "sparse_model" => meta.sparse_model = Some(v),
            "sparse_model_dir" => meta.sparse_model_dir = Some(v),
            "sparse_dimension" => meta.sparse_dimension = v.parse().ok(),
            "vector_type" => {
                meta.vector_type = match v.as_str() {
                    "halfvec" => Some(VectorType::Halfvec),
                    _ => Some(VectorType::Vector),
                }
            }
            _ => {}
        }
    }
    if meta.schema_version > schema::SCHEMA_VERSION {
        return Err(BackendError::Invalid(format!(
            "index {target} has schema version {}, newer than this ragline understands ({}); \
             upgrade ragline",
            meta.schema_version,
            schema::SCHEMA_VERSION
        )));
    }
    Ok(Some(meta))
}

fn check_model(
    target: &PgTarget,
    meta: &PgMeta,
    model: Option<&ModelIdentity>,
) -> Result<(), BackendError> {
    let held = meta.model.as_deref().map(|name| HeldModel {
        name,
        fingerprint: meta.model_fingerprint.as_deref(),
        dimension: meta.dimension,
    });
    let elsewhere = "another --index (or ?schema=)";
    super::identity::check_model(&target.to_string(), elsewhere, held, model)
}

/// A failure of a working connection (the run stops: exit code 2).
pub(crate) fn pg_error(target: &PgTarget, e: postgres::Error) -> BackendError {
    let why = match e.as_db_error() {
        Some(d) => format!("{}: {}", d.code().code(), d.message()),
        None => target::root_cause(&e),
    };
    BackendError::Io(format!("{target}: {why}"))
}

/// Whether a failed statement may succeed when tried again: the connection broke, the
/// server restarts, a serialization failure or deadlock, resources ran short.
pub(crate) fn is_retryable(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        None => true,
        Some(c) => {
            let code = c.code();
            code.starts_with("08")
                || code.starts_with("53")
                || code.starts_with("57P")
                || code == "40001"
                || code == "40P01"
                || code == "55P03"
        }
    }
}

/// Helper for tests and tools: run SQL against the index's schema.
pub fn execute(target: &PgTarget, sql: &str) -> Result<(), BackendError> {
    let mut client = target.connect()?;
    client.batch_execute(sql).map_err(|e| pg_error(target, e))
}

/// A connection to the test server `RAGLINE_TEST_POSTGRES` names; `None`, with a message,
/// when it names none (the test skips; with `RAGLINE_REQUIRE_POSTGRES=1` it fails).
#[cfg(test)]
pub(crate) fn test_server() -> Option<Client> {
    match std::env::var("RAGLINE_TEST_POSTGRES") {
        Ok(url) if !url.is_empty() => Some(Client::connect(&url, postgres::NoTls).unwrap()),
        _ => {
            assert!(
                std::env::var("RAGLINE_REQUIRE_POSTGRES").as_deref() != Ok("1"),
                "RAGLINE_TEST_POSTGRES is not set and RAGLINE_REQUIRE_POSTGRES=1: run \
                 `export RAGLINE_TEST_POSTGRES=$(scripts/postgres.sh start)`"
            );
            eprintln!("SKIPPED (postgres): RAGLINE_TEST_POSTGRES is not set");
            None
        }
    }
}
