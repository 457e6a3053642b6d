//! `sqlite://PATH`: the embedded default. One SQLite file (WAL mode, so readers work while an
//! ingest writes) with documents, chunks, vectors (sqlite-vec, a table per vector set), a
//! full-text index (FTS5), and the enrichment lifecycle: the file is also the durable work
//! queue of `ragline enrich`.
//!
//! - `schema.rs`: tables and migrations. `sets.rs`: vector sets (model migration).
//! - `write.rs`: the indexer's bulk upserts. `settle.rs`: lifecycle rows from what the rows say.
//! - `queue.rs`: the leased work queue (`LifecycleStore`, `EnrichStore`).
//! - `admin.rs`: status, dead letters, pause/resume, promotion, backfill set-up.
//! - `reader.rs`: read-only queries for search. `sparse.rs`: sparse vectors (postings).

mod admin;
pub mod ann;
pub mod keyword;
mod outputs;
mod queue;
pub(crate) mod reader;
pub mod schema;
pub mod sets;
mod settle;
mod sparse;
mod write;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

pub use queue::SqliteStore;
pub use reader::SqliteReader;

use crate::indexers::IndexMeta;
pub use sets::{SetState, VectorSet};

use super::identity::HeldModel;
use super::{
    Backend, BackendError, BackendFactory, IndexIdentity, KnownDocument, KnownPage, ModelIdentity,
    StoredVectors,
};
use crate::document::InputKey;
use crate::lifecycle::{Priority, StoreError};
use write::SqliteBackend;

/// How long a writer waits for another writer's lock.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long opening an index goes on trying while other processes hold it.
const BUSY_RETRY_FOR: Duration = Duration::from_secs(300);

/// Why one try at opening an index failed: the file was busy (try again), or anything else.
enum OpenError {
    Busy(rusqlite::Error),
    Failed(BackendError),
}
use OpenError::{Busy, Failed};

/// Register sqlite-vec with every connection this process opens.
pub fn register_sqlite_vec() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: sqlite3_vec_init has the signature SQLite expects of an extension entry
        // point; registering it before any connection opens is what sqlite-vec documents.
        unsafe {
            #[allow(clippy::missing_transmute_annotations)]
            rusqlite::ffi::sqlite3_auto_extension(Some(std::mem::transmute(
                sqlite_vec::sqlite3_vec_init as *const (),
            )));
        }
    });
}

pub struct SqliteFactory {
    path: PathBuf,
    identity: IndexIdentity,
}

impl SqliteFactory {
    /// Open or create the index at `path` for a run with `identity`. Everything that can be
    /// wrong with the file (not SQLite, not a ragline index, a newer schema, another model or
    /// dimension) is found by reading only, so the file is untouched when the run is refused.
    ///
    /// Another process holding the file (a role starting beside others, an `enrich` at its
    /// commit) is waited for: each statement waits [`BUSY_TIMEOUT`] for a lock, and a set-up
    /// that still finds the file busy is tried again with backoff for [`BUSY_RETRY_FOR`].
    pub fn open(path: &Path, identity: IndexIdentity) -> Result<Self, BackendError> {
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            match Self::open_once(path, &identity) {
                Err(Busy(e)) if started.elapsed() < BUSY_RETRY_FOR => {
                    tracing::warn!(
                        "{}: another process holds the index ({e}); trying again in {} ms",
                        path.display(),
                        pause.as_millis()
                    );
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
                Err(Busy(e)) => return Err(index_error(path, e)),
                Err(Failed(e)) => return Err(e),
                Ok(()) => {
                    return Ok(SqliteFactory {
                        path: path.to_path_buf(),
                        identity,
                    })
                }
            }
        }
    }

    fn open_once(path: &Path, identity: &IndexIdentity) -> Result<(), OpenError> {
        register_sqlite_vec();
        // A file another process has just created and not yet written (SQLite writes a new
        // file at its first commit) is a new index, not a foreign file.
        let written = std::fs::metadata(path).is_ok_and(|m| m.len() > 0);
        if written {
            let meta = SqliteReader::open(path).map_err(Failed)?.meta().clone();
            check_model(path, &meta, identity.model.as_ref()).map_err(Failed)?;
        }
        let conn = Connection::open(path).map_err(|e| {
            Failed(BackendError::Unwritable {
                path: path.to_path_buf(),
                source: std::io::Error::other(e.to_string()),
            })
        })?;
        let setup = || -> rusqlite::Result<()> {
            conn.busy_timeout(BUSY_TIMEOUT)?;
            // Larger pages suit rows of 1.5 KB vectors and chunk text: 16 KiB pages write
            // 56k chunks/s against 44k with 4 KiB (benches/index.rs). Only a new file takes it.
            conn.pragma_update(None, "page_size", 16384)?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", SYNCHRONOUS)?;
            // IMMEDIATE: the write lock taken (waiting for it) before the first read, so the
            // upgrade never has to turn a read into a write under another writer (SQLite's
            // SQLITE_BUSY without waiting).
            let tx = rusqlite::Transaction::new_unchecked(
                &conn,
                rusqlite::TransactionBehavior::Immediate,
            )?;
            upgrade(&tx)?;
            if let Some(model) = &identity.model {
                match sets::active(&tx)? {
                    None => {
                        sets::create(&tx, model, SetState::Active)?;
                    }
                    Some(set) if set.tokenizer.is_none() => {
                        tx.execute(
                            "UPDATE vector_sets SET tokenizer = ?2 WHERE id = ?1",
                            params![set.id, model.tokenizer],
                        )?;
                    }
                    Some(_) => {}
                }
                if !identity.ann.is_empty() {
                    ann::record(&tx, identity.ann.over(ann::recorded(&tx)?))?;
                }
                if let Some(t) = &model.tokenizer {
                    tx.execute(
                        "INSERT INTO meta(key, value) VALUES ('chunk_tokenizer', ?1)
                         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        [t],
                    )?;
                }
            }
            tx.commit()
        };
        setup().map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen) => {
                Failed(BackendError::Unwritable {
                    path: path.to_path_buf(),
                    source: std::io::Error::other(e.to_string()),
                })
            }
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                Busy(e)
            }
            _ => Failed(index_error(path, e)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Ids of every document in the index.
    pub fn all_document_ids(&self) -> Result<HashSet<String>, BackendError> {
        let conn = self.connection()?;
        let mut stmt = conn
            .prepare("SELECT id FROM documents")
            .map_err(|e| index_error(&self.path, e))?;
        let ids = stmt
            .query_map([], |r| r.get(0))
            .and_then(|rows| rows.collect::<rusqlite::Result<HashSet<String>>>())
            .map_err(|e| index_error(&self.path, e))?;
        Ok(ids)
    }

    /// Delete documents with all their chunks, vectors and queue entries, in one
    /// transaction. Returns how many went.
    pub fn delete(&self, ids: &[String]) -> Result<usize, BackendError> {
        let mut conn = self.connection()?;
        write::delete_documents(&mut conn, ids).map_err(|e| index_error(&self.path, e))
    }

    /// Drop the vector sets a finished migration retired; the models dropped.
    pub fn drop_retired_sets(&self) -> Result<Vec<String>, BackendError> {
        let mut conn = self.connection()?;
        let mut run = || -> rusqlite::Result<Vec<String>> {
            let tx = conn.transaction()?;
            let dropped = sets::drop_retired(&tx)?;
            tx.commit()?;
            Ok(dropped)
        };
        run().map_err(|e| index_error(&self.path, e))
    }

    fn connection(&self) -> Result<Connection, BackendError> {
        connect(&self.path).map_err(|e| index_error(&self.path, e))
    }
}

/// Every commit is on disk when it returns (the WAL is synced at each commit): an indexer
/// acknowledges a broker, and a lease is completed, only after its commit, so a power loss
/// must not take back what was acknowledged. `NORMAL` would sync only at checkpoints. The
/// cost on a plain ingest is in BENCHMARKS.md ("durable commits").
const SYNCHRONOUS: &str = "FULL";

/// A read-write connection with the settings every writer uses.
pub fn connect(path: &Path) -> rusqlite::Result<Connection> {
    register_sqlite_vec();
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "synchronous", SYNCHRONOUS)?;
    // 64 MiB of page cache: the B-tree pages a bulk write touches stay in memory.
    conn.pragma_update(None, "cache_size", -65536)?;
    Ok(conn)
}

/// Bring the schema to the current version, in the caller's transaction. Version 3's data
/// steps: the vectors an older index holds become its first (active) vector set, and every
/// document gets its lifecycle rows from what the index holds.
fn upgrade(tx: &Connection) -> rusqlite::Result<()> {
    // A new file has no tables yet: version 0.
    let version: i64 = if reader::has_table(tx, "meta")? {
        tx.query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get::<_, String>(0),
        )
        .optional()?
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
    } else {
        0
    };
    if version >= schema::SCHEMA_VERSION {
        return Ok(());
    }
    schema::migrate(tx, version)?;
    if version == 0 {
        return Ok(());
    }
    if version < 3 {
        let meta: HashMap<String, String> = tx
            .prepare("SELECT key, value FROM meta")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let has_vectors = tx
            .prepare("SELECT 1 FROM sqlite_master WHERE name = 'chunk_vectors'")?
            .exists([])?;
        if let (true, Some(model), Some(dim)) = (
            has_vectors,
            meta.get("model"),
            meta.get("dimension").and_then(|d| d.parse::<i64>().ok()),
        ) {
            tx.execute(
                "INSERT INTO vector_sets(id, model, model_dir, fingerprint, tokenizer,
                                         dimension, vec_table, state, created_at)
                 VALUES (1, ?1, ?2, ?3, NULL, ?4, 'chunk_vectors', 'active', ?5)",
                params![
                    model,
                    meta.get("model_dir").cloned().unwrap_or_default(),
                    meta.get("model_fingerprint").cloned().unwrap_or_default(),
                    dim,
                    crate::lifecycle::now_ms()
                ],
            )?;
            tx.execute(
                "UPDATE chunks SET embedded = 2 WHERE rowid IN (SELECT rowid FROM chunk_vectors)",
                [],
            )?;
        }
        let all = sets::all(tx)?;
        let ids: Vec<String> = tx
            .prepare("SELECT id FROM documents")?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        for id in ids {
            settle::settle(tx, &id, &all, Priority::Fresh)?;
        }
    }
    Ok(())
}

fn check_model(
    path: &Path,
    meta: &IndexMeta,
    model: Option<&ModelIdentity>,
) -> Result<(), BackendError> {
    let held = meta.model.as_deref().map(|name| HeldModel {
        name,
        fingerprint: meta.model_fingerprint.as_deref(),
        dimension: meta.dimension,
    });
    let index = format!("`{}`", path.display());
    super::identity::check_model(&index, "another --index", held, model)
}

pub(crate) fn index_error(path: &Path, e: rusqlite::Error) -> BackendError {
    BackendError::Io(format!("{}: {e}", path.display()))
}

pub(crate) fn store_error(path: &Path, e: rusqlite::Error) -> StoreError {
    StoreError::Io(format!("{}: {e}", path.display()))
}

impl BackendFactory for SqliteFactory {
    fn describe(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(SqliteBackend {
            conn: self.connection()?,
            path: self.path.clone(),
            fingerprint: self.identity.pipeline_fingerprint.clone(),
            priority: self.identity.priority,
        }))
    }

    fn document_ids(&self) -> Result<Option<HashSet<String>>, BackendError> {
        self.all_document_ids().map(Some)
    }

    fn stored_vectors(&self) -> Result<Option<Box<dyn StoredVectors>>, BackendError> {
        if self.identity.model.is_none() {
            return Ok(None);
        }
        let conn = Connection::open_with_flags(&self.path, read_only_flags())
            .and_then(|c| c.busy_timeout(BUSY_TIMEOUT).map(|()| c))
            .map_err(|e| index_error(&self.path, e))?;
        let active = sets::active(&conn).map_err(|e| index_error(&self.path, e))?;
        Ok(active.map(|set| {
            Box::new(SqliteVectors {
                conn,
                path: self.path.clone(),
                set,
            }) as Box<dyn StoredVectors>
        }))
    }

    fn delete_documents(&self, ids: &[String]) -> Result<usize, BackendError> {
        self.delete(ids)
    }

    /// Bring each vector set's ANN up to date: build it (`hnsw`, or `auto` past its
    /// threshold), apply what the run changed, drop it (`none`).
    fn finish(&self) -> Result<Vec<String>, BackendError> {
        let mut conn = self.connection()?;
        let mut notes =
            ann::maintain(&self.path, &mut conn).map_err(|e| BackendError::Io(e.to_string()))?;
        notes.extend(keyword::maintain_noted(&self.path, &mut conn));
        Ok(notes)
    }

    /// Documents whose chunks of their current version are all there (and, unless the run
    /// defers embedding, all embedded in the active set).
    fn known_documents(&self) -> Result<HashMap<String, KnownDocument>, BackendError> {
        let conn = self.connection()?;
        let active = sets::active(&conn).map_err(|e| index_error(&self.path, e))?;
        let embedded_in = match (&active, self.identity.defer_embed) {
            (Some(set), false) => set.id,
            _ => -1,
        };
        let mut stmt = conn
            .prepare(
                "SELECT d.id, d.content_hash, d.fingerprint
                 FROM documents d
                 JOIN enrichment c ON c.document_id = d.id AND c.stage = 'chunk'
                      AND c.status = 'done' AND c.input_version = d.version
                 WHERE ?1 < 0 OR EXISTS (
                     SELECT 1 FROM enrichment e
                     WHERE e.document_id = d.id AND e.stage = 'embed' AND e.vector_set = ?1
                       AND e.status = 'done' AND e.input_version = d.version)",
            )
            .map_err(|e| index_error(&self.path, e))?;
        let rows = stmt
            .query_map([embedded_in], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    KnownDocument {
                        content_hash: r.get(1)?,
                        fingerprint: r.get(2)?,
                    },
                ))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<HashMap<_, _>>>())
            .map_err(|e| index_error(&self.path, e))?;
        Ok(rows)
    }

    fn known_pages(&self, source: &str) -> Result<Vec<KnownPage>, BackendError> {
        let conn = self.connection()?;
        let mut stmt = conn
            .prepare(
                "SELECT id, json_extract(metadata, '$.url'), json_extract(metadata, '$.etag'),
                        json_extract(metadata, '$.last_modified'), json_extract(metadata, '$.depth'),
                        json_extract(metadata, '$.links'),
                        json_extract(metadata, '$.redirected_from')
                 FROM documents
                 WHERE source = ?1 AND json_valid(metadata)
                   AND json_type(metadata, '$.url') = 'text'",
            )
            .map_err(|e| index_error(&self.path, e))?;
        let rows = stmt
            .query_map([source], |r| {
                Ok(KnownPage {
                    id: r.get(0)?,
                    url: r.get(1)?,
                    etag: r.get::<_, Option<String>>(2).ok().flatten(),
                    last_modified: r.get::<_, Option<String>>(3).ok().flatten(),
                    depth: r
                        .get::<_, Option<i64>>(4)
                        .ok()
                        .flatten()
                        .and_then(|d| u32::try_from(d).ok()),
                    links: r
                        .get::<_, Option<String>>(5)
                        .ok()
                        .flatten()
                        .and_then(|l| serde_json::from_str(&l).ok()),
                    redirected_from: r.get::<_, Option<String>>(6).ok().flatten(),
                })
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| index_error(&self.path, e))?;
        Ok(rows)
    }
}

/// Vectors of the active set by input key, read through a read-only connection of its own
/// (WAL: it never waits for the indexers). Old versions of chunks kept for search count: a
/// vector depends only on the model input.
struct SqliteVectors {
    conn: Connection,
    path: PathBuf,
    set: VectorSet,
}

impl StoredVectors for SqliteVectors {
    fn vector_for(&mut self, key: &InputKey) -> Result<Option<Vec<f32>>, StoreError> {
        queue::stored_vector(&self.conn, &self.set, key).map_err(|e| store_error(&self.path, e))
    }
}

use super::content_version as version;

/// The bytes of the index at `path` on disk: the database, its WAL and shared memory, and
/// the ANN's files.
pub fn files_bytes(path: &Path) -> u64 {
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mut total = size(path);
    for suffix in ["-wal", "-shm"] {
        let mut p = path.as_os_str().to_os_string();
        p.push(suffix);
        total += size(Path::new(&p));
    }
    if let Ok(dir) = std::fs::read_dir(ann::dir_of(path)) {
        total += dir.flatten().map(|e| size(&e.path())).sum::<u64>();
    }
    total
}

pub fn vector_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(crate) fn vector_from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
        .collect()
}

pub(crate) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

pub(crate) fn item_error(e: &rusqlite::Error) -> super::ItemError {
    super::ItemError {
        retryable: is_busy(e),
        message: format!("sqlite: {e}"),
    }
}

/// Open flags for readers.
pub(crate) fn read_only_flags() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI
}

#[cfg(test)]
mod tests;
