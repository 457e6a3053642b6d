//! `sqlite://PATH`: the embedded default. One SQLite file (WAL mode, so readers work while an
//! ingest writes) with documents, chunks, vectors (sqlite-vec) and a full-text index (FTS5).
//!
//! Writes are idempotent upserts keyed by the document id and the chunk id (`parent#ordinal`);
//! each indexer batch is one transaction, each item a savepoint in it, so one bad item fails
//! alone. When a document is re-chunked into fewer chunks, its surplus chunks are deleted in
//! the transaction that writes the document.

mod reader;
pub mod schema;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Transaction};

pub use reader::{ChunkRow, IndexMeta, SqliteReader};

use super::{Backend, BackendError, BackendFactory, ItemError, KnownDocument, StoredVectors};
use crate::document::{Document, InputKey};

/// What a run writes into the index: the model whose vectors it adds, and the fingerprint of
/// the pipeline (chunker settings and model) its documents are made with.
#[derive(Clone, Debug)]
pub struct IndexIdentity {
    pub model: Option<ModelIdentity>,
    pub pipeline_fingerprint: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelIdentity {
    /// As the user named it (a hub id or a folder).
    pub name: String,
    /// The folder it was loaded from, so `ragline search` can find it again.
    pub dir: String,
    pub fingerprint: String,
    pub dimension: usize,
}

/// How long a writer waits for another writer's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

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
    pub fn open(path: &Path, identity: IndexIdentity) -> Result<Self, BackendError> {
        register_sqlite_vec();
        if path.exists() {
            let meta = SqliteReader::open(path)?.meta().clone();
            check_model(path, &meta, identity.model.as_ref())?;
        }
        let conn = Connection::open(path).map_err(|e| BackendError::Unwritable {
            path: path.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let io = |e: rusqlite::Error| index_error(path, e);
        let setup = || -> rusqlite::Result<()> {
            conn.busy_timeout(BUSY_TIMEOUT)?;
            // Larger pages suit rows of 1.5 KB vectors and chunk text: 16 KiB pages write
            // 56k chunks/s against 44k with 4 KiB (benches/index.rs). Only a new file takes it.
            conn.pragma_update(None, "page_size", 16384)?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            let tx = conn.unchecked_transaction()?;
            let version: i64 = tx
                .query_row(
                    "SELECT value FROM meta WHERE key = 'schema_version'",
                    [],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .or_else(|e| match e {
                    rusqlite::Error::SqliteFailure(_, Some(ref m))
                        if m.contains("no such table") =>
                    {
                        Ok(None)
                    }
                    e => Err(e),
                })?
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            schema::migrate(&tx, version)?;
            if let Some(model) = &identity.model {
                schema::create_vectors(&tx, model.dimension)?;
                for (k, v) in [
                    ("model", model.name.clone()),
                    ("model_dir", model.dir.clone()),
                    ("model_fingerprint", model.fingerprint.clone()),
                    ("dimension", model.dimension.to_string()),
                ] {
                    tx.execute(
                        "INSERT INTO meta(key, value) VALUES (?1, ?2)
                         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        params![k, v],
                    )?;
                }
            }
            tx.commit()
        };
        setup().map_err(|e| {
            let msg = e.to_string();
            if msg.contains("readonly") || msg.contains("unable to open") {
                BackendError::Unwritable {
                    path: path.to_path_buf(),
                    source: std::io::Error::other(msg),
                }
            } else {
                io(e)
            }
        })?;
        Ok(SqliteFactory {
            path: path.to_path_buf(),
            identity,
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

    /// Delete documents and all their chunks, in one transaction. Returns how many went.
    pub fn delete(&self, ids: &[String]) -> Result<usize, BackendError> {
        let mut conn = self.connection()?;
        let mut run = || -> rusqlite::Result<usize> {
            let tx = conn.transaction()?;
            let mut n = 0;
            for id in ids {
                delete_chunks_from(&tx, id, 0)?;
                n += tx.execute("DELETE FROM documents WHERE id = ?1", [id])?;
            }
            tx.commit()?;
            Ok(n)
        };
        run().map_err(|e| index_error(&self.path, e))
    }

    fn connection(&self) -> Result<Connection, BackendError> {
        let conn = Connection::open(&self.path).map_err(|e| index_error(&self.path, e))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .and_then(|()| conn.pragma_update(None, "synchronous", "NORMAL"))
            // 64 MiB of page cache: the B-tree pages a bulk write touches stay in memory.
            .and_then(|()| conn.pragma_update(None, "cache_size", -65536))
            .map_err(|e| index_error(&self.path, e))?;
        Ok(conn)
    }
}

fn check_model(
    path: &Path,
    meta: &IndexMeta,
    model: Option<&ModelIdentity>,
) -> Result<(), BackendError> {
    let (Some(model), Some(have)) = (model, meta.model.as_ref()) else {
        return Ok(());
    };
    let dim = meta.dimension.unwrap_or(0);
    if meta.model_fingerprint.as_deref() != Some(model.fingerprint.as_str())
        || dim != model.dimension
    {
        return Err(BackendError::Invalid(format!(
            "index `{}` holds vectors of model `{have}` ({dim} dimensions, fingerprint {}); \
             this run embeds with `{}` ({} dimensions, fingerprint {}). Vectors of two models \
             cannot be searched together: use another --index, or --model {have}",
            path.display(),
            meta.model_fingerprint.as_deref().unwrap_or("?"),
            model.name,
            model.dimension,
            model.fingerprint
        )));
    }
    Ok(())
}

fn index_error(path: &Path, e: rusqlite::Error) -> BackendError {
    BackendError::Io(format!("{}: {e}", path.display()))
}

impl BackendFactory for SqliteFactory {
    fn describe(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        let conn = self.connection()?;
        let dimension = self.identity.model.as_ref().map(|m| m.dimension);
        Ok(Box::new(SqliteBackend {
            conn,
            path: self.path.clone(),
            fingerprint: self.identity.pipeline_fingerprint.clone(),
            dimension,
        }))
    }

    fn document_ids(&self) -> Result<Option<HashSet<String>>, BackendError> {
        self.all_document_ids().map(Some)
    }

    fn stored_vectors(&self) -> Result<Option<Box<dyn StoredVectors>>, BackendError> {
        let Some(model) = &self.identity.model else {
            return Ok(None);
        };
        let conn = Connection::open_with_flags(&self.path, read_only_flags())
            .map_err(|e| index_error(&self.path, e))?;
        Ok(Some(Box::new(SqliteVectors {
            conn,
            path: self.path.clone(),
            dimension: model.dimension,
        })))
    }

    fn delete_documents(&self, ids: &[String]) -> Result<usize, BackendError> {
        self.delete(ids)
    }

    fn known_documents(&self) -> Result<HashMap<String, KnownDocument>, BackendError> {
        let conn = self.connection()?;
        let mut stmt = conn
            .prepare(
                "SELECT d.id, d.content_hash, d.fingerprint
                 FROM documents d
                 LEFT JOIN (SELECT document_id, version, COUNT(*) AS n
                            FROM chunks GROUP BY document_id, version) c
                   ON c.document_id = d.id AND c.version = d.version
                 WHERE d.chunk_count = COALESCE(c.n, 0)",
            )
            .map_err(|e| index_error(&self.path, e))?;
        let rows = stmt
            .query_map([], |r| {
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
}

/// Vectors by input key, read through a read-only connection of its own (WAL: it never waits
/// for the indexers).
struct SqliteVectors {
    conn: Connection,
    path: PathBuf,
    dimension: usize,
}

impl StoredVectors for SqliteVectors {
    fn vector_for(&mut self, key: &InputKey) -> Result<Option<Vec<f32>>, BackendError> {
        let bytes: Option<Vec<u8>> = self
            .conn
            .prepare_cached(
                "SELECT v.embedding FROM chunks c JOIN chunk_vectors v ON v.rowid = c.rowid
                 WHERE c.input_key = ?1 LIMIT 1",
            )
            .and_then(|mut s| s.query_row([key.as_slice()], |r| r.get(0)).optional())
            .map_err(|e| index_error(&self.path, e))?;
        Ok(bytes.filter(|b| b.len() == self.dimension * 4).map(|b| {
            b.chunks_exact(4)
                .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                .collect()
        }))
    }
}

struct SqliteBackend {
    conn: Connection,
    path: PathBuf,
    fingerprint: String,
    dimension: Option<usize>,
}

/// The version stamp shared by a document and the chunks made from that content with that
/// pipeline.
fn version(content_hash: Option<&str>, fingerprint: &str) -> String {
    let text = format!("{}|{fingerprint}", content_hash.unwrap_or(""));
    blake3::hash(text.as_bytes()).to_hex()[..16].to_string()
}

impl Backend for SqliteBackend {
    /// The whole batch in one transaction. Items the index cannot take (no vector, a wrong
    /// dimension) are refused before any write; if SQLite itself fails on an item, the batch
    /// is rolled back and written again with each item in its own savepoint, so only that
    /// item fails.
    fn write(&mut self, batch: &[Document]) -> Vec<Result<(), ItemError>> {
        let mut results: Vec<Result<(), ItemError>> =
            batch.iter().map(|d| check(d, self.dimension)).collect();
        let fast = (|| -> rusqlite::Result<()> {
            let tx = self
                .conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            for (doc, r) in batch.iter().zip(&results) {
                if r.is_ok() {
                    write_one(&tx, doc, &self.fingerprint)?;
                }
            }
            tx.commit()
        })();
        match fast {
            Ok(()) => results,
            Err(e) if is_busy(&e) => vec![Err(item_error(&e)); batch.len()],
            Err(_) => {
                self.write_one_by_one(batch, &mut results);
                results
            }
        }
    }

    fn flush(&mut self) -> Result<(), BackendError> {
        // Each batch is committed; fold the WAL into the main file so the index is compact
        // for readers that come later.
        self.conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .map_err(|e| index_error(&self.path, e))
    }
}

impl SqliteBackend {
    /// The slow path: each item in a savepoint, so a failing one fails alone.
    fn write_one_by_one(&mut self, batch: &[Document], results: &mut [Result<(), ItemError>]) {
        let mut run = || -> rusqlite::Result<()> {
            let tx = self
                .conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            for (doc, r) in batch.iter().zip(results.iter_mut()) {
                if r.is_err() {
                    continue;
                }
                tx.execute_batch("SAVEPOINT item")?;
                match write_one(&tx, doc, &self.fingerprint) {
                    Ok(()) => tx.execute_batch("RELEASE item")?,
                    Err(e) => {
                        tx.execute_batch("ROLLBACK TO item; RELEASE item")?;
                        *r = Err(item_error(&e));
                    }
                }
            }
            tx.commit()
        };
        if let Err(e) = run() {
            let err = item_error(&e);
            results.iter_mut().for_each(|r| *r = Err(err.clone()));
        }
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// What the index cannot take, whatever SQLite says: a chunk without a vector, or with a
/// vector of another dimension.
fn check(doc: &Document, dimension: Option<usize>) -> Result<(), ItemError> {
    let Some(chunk) = doc.chunk.as_deref() else {
        return Ok(());
    };
    if doc.unchanged {
        return Ok(());
    }
    let Some(vector) = chunk.vector.as_deref() else {
        return Err(ItemError::permanent(
            "chunk has no vector: run with a model (not --no-chunk) to index chunks",
        ));
    };
    match dimension {
        Some(d) if d == vector.len() => Ok(()),
        Some(d) => Err(ItemError::permanent(format!(
            "vector of {} dimensions in an index of {d}",
            vector.len()
        ))),
        None => Err(ItemError::permanent(
            "this index was opened without a model; its vectors have no table",
        )),
    }
}

/// Write one document or chunk (already checked).
fn write_one(tx: &Transaction<'_>, doc: &Document, fingerprint: &str) -> rusqlite::Result<()> {
    if doc.unchanged {
        return Ok(());
    }
    let version = version(doc.content_hash.as_deref(), fingerprint);
    let Some(chunk) = doc.chunk.as_deref() else {
        let metadata = serde_json::to_string(&doc.fields.metadata).unwrap_or_else(|_| "{}".into());
        tx.prepare_cached(
            "INSERT INTO documents(id, source, title, metadata, content_hash, fingerprint,
                                   version, chunk_count, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, unixepoch())
             ON CONFLICT(id) DO UPDATE SET
                 source = excluded.source, title = excluded.title,
                 metadata = excluded.metadata, content_hash = excluded.content_hash,
                 fingerprint = excluded.fingerprint, version = excluded.version,
                 chunk_count = excluded.chunk_count, updated_at = excluded.updated_at",
        )?
        .execute(params![
            doc.id,
            doc.fields.source,
            doc.fields.title,
            metadata,
            doc.content_hash.as_deref().unwrap_or(""),
            fingerprint,
            version,
            doc.children,
        ])?;
        // Chunks past the new count belong to an older version of the document.
        delete_chunks_from(tx, &doc.id, doc.children)?;
        return Ok(());
    };
    let vector = chunk.vector.as_deref().unwrap_or_default();
    let parent = doc.parent_id.as_deref().unwrap_or("");
    let heading_path = chunk.heading_path.join(" > ");
    // An existing chunk is replaced under its rowid (so its vector and full-text entries are
    // replaced too); a new one gets the next rowid. (Folding the lookup into the insert with
    // `ON CONFLICT DO NOTHING RETURNING rowid` measured 45% slower.)
    let existing: Option<i64> = tx
        .prepare_cached("SELECT rowid FROM chunks WHERE id = ?1")?
        .query_row([&doc.id], |r| r.get(0))
        .optional()?;
    if let Some(rowid) = existing {
        unindex_chunk(tx, rowid)?;
        tx.prepare_cached("DELETE FROM chunks WHERE rowid = ?1")?
            .execute([rowid])?;
    }
    tx.prepare_cached(
        "INSERT INTO chunks(rowid, id, document_id, ordinal, version, text, heading_path,
                            start_byte, end_byte, token_count, input_key)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        existing,
        doc.id,
        parent,
        chunk.ordinal,
        version,
        doc.fields.text,
        heading_path,
        chunk.start as i64,
        chunk.end as i64,
        chunk.token_count,
        chunk.input_key.as_ref().map(|k| k.as_slice()),
    ])?;
    let rowid = existing.unwrap_or_else(|| tx.last_insert_rowid());
    tx.prepare_cached("INSERT INTO chunk_fts(rowid, text, heading_path) VALUES (?1, ?2, ?3)")?
        .execute(params![rowid, doc.fields.text, heading_path])?;
    tx.prepare_cached("INSERT INTO chunk_vectors(rowid, embedding) VALUES (?1, ?2)")?
        .execute(params![rowid, vector_bytes(vector)])?;
    Ok(())
}

/// Remove a chunk's entries from the full-text and vector indexes (the row stays).
fn unindex_chunk(tx: &Connection, rowid: i64) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO chunk_fts(chunk_fts, rowid, text, heading_path)
         SELECT 'delete', rowid, text, heading_path FROM chunks WHERE rowid = ?1",
    )?
    .execute([rowid])?;
    if has_vectors(tx)? {
        tx.prepare_cached("DELETE FROM chunk_vectors WHERE rowid = ?1")?
            .execute([rowid])?;
    }
    Ok(())
}

fn has_vectors(conn: &Connection) -> rusqlite::Result<bool> {
    conn.prepare_cached("SELECT 1 FROM sqlite_master WHERE name = 'chunk_vectors'")?
        .exists([])
}

/// Delete a document's chunks with ordinal >= `from`, with their index entries.
fn delete_chunks_from(tx: &Connection, document: &str, from: u32) -> rusqlite::Result<()> {
    let rowids: Vec<i64> = tx
        .prepare_cached("SELECT rowid FROM chunks WHERE document_id = ?1 AND ordinal >= ?2")?
        .query_map(params![document, from], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for rowid in rowids {
        unindex_chunk(tx, rowid)?;
        tx.prepare_cached("DELETE FROM chunks WHERE rowid = ?1")?
            .execute([rowid])?;
    }
    Ok(())
}

pub fn vector_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn item_error(e: &rusqlite::Error) -> ItemError {
    ItemError {
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
