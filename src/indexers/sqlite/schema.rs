//! The SQLite index schema and its migrations.
//!
//! Version 1:
//! - `meta`: schema version, the model (name, folder, fingerprint, dimension).
//! - `documents`: one row per source document, with the content hash and the pipeline
//!   fingerprint it was indexed with, and how many chunks it has (`chunk_count`); `version`
//!   (hash + fingerprint) is also stamped on each of its chunks, so a document is complete only
//!   when `chunk_count` chunks of its current version exist (an interrupted run redoes it).
//! - `chunks`: text, heading path, byte offsets and token count, keyed by an integer rowid
//!   shared with the two indexes below, and by the chunk id (`parent#ordinal`).
//! - `chunk_fts`: FTS5 over chunk text and heading path (external content: `chunks`).
//! - `chunk_vectors`: sqlite-vec `vec0` table of the vectors (created once the dimension is
//!   known).
//! - `enrichment`: per-document, per-stage state (status, attempts, last error, fingerprint),
//!   reserved for the enrichment state machine.
//!
//! Version 2:
//! - `chunks.input_key`: a hash of the chunk's token ids (`Chunk::input_key_of`), indexed, so
//!   a run can take the vector of an identical model input from the index instead of
//!   embedding it again (an edited page re-embeds only its changed chunks; a moved file none).
//!   Rows written by version 1 have none and are simply never reused.

use rusqlite::Connection;

pub const SCHEMA_VERSION: i64 = 2;

/// Create or migrate the schema. Runs in the caller's transaction.
pub fn migrate(conn: &Connection, from: i64) -> rusqlite::Result<()> {
    if from < 1 {
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta (
                 key TEXT PRIMARY KEY,
                 value TEXT NOT NULL
             );
             CREATE TABLE documents (
                 id TEXT PRIMARY KEY,
                 source TEXT,
                 title TEXT,
                 metadata TEXT NOT NULL DEFAULT '{}',
                 content_hash TEXT NOT NULL,
                 fingerprint TEXT NOT NULL,
                 version TEXT NOT NULL,
                 chunk_count INTEGER NOT NULL,
                 updated_at INTEGER NOT NULL
             );
             CREATE TABLE chunks (
                 rowid INTEGER PRIMARY KEY,
                 id TEXT NOT NULL UNIQUE,
                 document_id TEXT NOT NULL,
                 ordinal INTEGER NOT NULL,
                 version TEXT NOT NULL,
                 text TEXT NOT NULL,
                 heading_path TEXT NOT NULL,
                 start_byte INTEGER NOT NULL,
                 end_byte INTEGER NOT NULL,
                 token_count INTEGER NOT NULL
             );
             CREATE INDEX chunks_by_document ON chunks(document_id, ordinal);
             CREATE VIRTUAL TABLE chunk_fts USING fts5(
                 text, heading_path,
                 content='chunks', content_rowid='rowid',
                 tokenize='porter unicode61'
             );
             CREATE TABLE enrichment (
                 document_id TEXT NOT NULL,
                 stage TEXT NOT NULL,
                 status TEXT NOT NULL,
                 attempts INTEGER NOT NULL DEFAULT 0,
                 last_error TEXT,
                 fingerprint TEXT,
                 updated_at INTEGER NOT NULL,
                 PRIMARY KEY (document_id, stage)
             );",
        )?;
    }
    if from < 2 {
        conn.execute_batch(
            "ALTER TABLE chunks ADD COLUMN input_key BLOB;
             CREATE INDEX chunks_by_input_key ON chunks(input_key);",
        )?;
    }
    conn.execute(
        "INSERT INTO meta(key, value) VALUES ('schema_version', ?1)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        [SCHEMA_VERSION.to_string()],
    )?;
    Ok(())
}

/// Vectors per vec0 storage chunk. vec0 rewrites a chunk's bookkeeping on every insert, so
/// inserts slow down as chunks grow (measured: 85k/s at its default 1,024, 131k/s at 256,
/// 3k/s at 4,096) while a search scans the same vectors either way (about 40 ms for 100k).
pub const VEC_CHUNK_SIZE: usize = 256;

/// The vector table, for `dimension`-long vectors compared by cosine distance.
pub fn create_vectors(conn: &Connection, dimension: usize) -> rusqlite::Result<()> {
    conn.execute_batch(&format!(
        "CREATE VIRTUAL TABLE IF NOT EXISTS chunk_vectors USING vec0(
             embedding float[{dimension}] distance_metric=cosine,
             chunk_size={VEC_CHUNK_SIZE}
         );"
    ))
}
