//! The SQLite index schema and its migrations.
//!
//! Version 1:
//! - `meta`: schema version, the model (name, folder, fingerprint, dimension) of the active
//!   vector set.
//! - `documents`: one row per source document, with the content hash and the fingerprint of
//!   the chunker it was cut with, and how many chunks it has (`chunk_count`); `version`
//!   (hash + fingerprint) is also stamped on each of its chunks.
//! - `chunks`: text, heading path, byte offsets and token count, keyed by an integer rowid
//!   shared with the full-text and vector indexes, and by the chunk id (`parent#ordinal`).
//! - `chunk_fts`: FTS5 over chunk text and heading path (external content: `chunks`).
//! - `chunk_vectors`: sqlite-vec `vec0` table of the first vector set.
//!
//! Version 2:
//! - `chunks.input_key`: a hash of the chunk's token ids (`Chunk::input_key_of`), indexed, so
//!   a run can take the vector of an identical model input from the index instead of
//!   embedding it again. Rows written by version 1 have none and are never reused.
//!
//! Version 3 (the enrichment lifecycle):
//! - `chunks` rebuilt with `token_ids` (the chunker's ids of a chunk still waiting for its
//!   vector, so `enrich` never tokenizes again), `embedded` (a bit per vector set holding the
//!   chunk's vector: bit `1 << set id`), and `replaced_by`: a chunk whose text changed while
//!   its vector is not computed yet stays, out of the full-text index, with its old text and
//!   vector, so vector search serves the old version until the new one has vectors (then it
//!   is deleted). The chunk id is unique among current rows only.
//! - `enrichment`: per document, stage and vector set: status, priority, FIFO sequence,
//!   attempts, backoff deadline (`not_before`), lease (`lease_owner`, `lease_expires`), the
//!   stage fingerprint, the document version it is for, the work left (`todo_chunks`,
//!   `todo_tokens`), and when it was queued, claimed and done. `enrichment_errors` keeps every
//!   failed attempt (time, worker, message); `stage_control` pauses stages.
//! - `vector_sets`: the model, dimension and vec0 table of each set of vectors; one is
//!   `active` (searched), one may be filling by `backfill` (a model migration, with its
//!   `watermark`), older ones are `retired` until dropped.
//! - `counters`: the sequences behind FIFO order and claim order.
//!
//! Version 4:
//! - `chunks.page_start`, `chunks.page_end`: the pages of a paged document (PDF) a chunk
//!   spans, from 1; NULL for documents without pages.
//!
//! Version 5:
//! - `dead_documents`: a copy of each document a distributed run could not get into the index
//!   (the broker gave up on it after MaxDeliver deliveries; its `chunk` row is `dead`): the
//!   document as published (`payload`), its `source`, and the run's settings (`config`), so
//!   `ragline dlq requeue` can run it again. Removed once the document is in the index.
//! - `stage_control.circuit`, `circuit_since`: a stage whose service keeps failing has its
//!   circuit open (the reason, since when), for `ragline status`; NULL when closed.
//! - `stage_outputs`: what a document-level stage (an LLM stage: `summary`...) made of a
//!   document, one row per document and stage (replaced, never appended), with whether it is
//!   in the keyword index; `output_fts`: FTS5 over those outputs (rowid = the output's).
//!
//! Version 6:
//! - `ann`: per vector set, its approximate nearest-neighbour index (an HNSW file in
//!   `<index>.ann/`): state (`building`, `ready`), dtype, file, and `seq`, the last change of
//!   `ann_log` the file holds. `ann_log`: every insert and delete of a vector of a set with an
//!   ANN, in the writer's transaction, so a reader or the next writer replays what the file
//!   lacks (see `ann.rs`).
//!
//! Version 7:
//! - `chunks_by_input_key` becomes `chunks_embedded_by_input_key`, on `(input_key, embedded)`
//!   for embedded chunks only: the look-up of a vector to reuse skips the chunks waiting for
//!   theirs without reading their rows. A chunk repeated on thousands of pages (a "See also"
//!   section) made each look-up scan every earlier copy, and a deferred ingest of 6,000 MDN
//!   pages spent most of its time there.
//!
//! Version 8:
//! - `sparse_postings(term, chunk, weight)`: the sparse (SPLADE) vectors of chunks, one row
//!   per non-zero entry, keyed by term (WITHOUT ROWID) with an index by chunk; a trigger
//!   deletes a chunk's postings with its row. `meta` names the model they come from
//!   (`sparse_model`, `sparse_model_dir`, `sparse_fingerprint`, `sparse_dimension`).
//!
//! Version 9 (entities, labels, the stage graph):
//! - `document_entities(document_id, type, norm, text, mentions, score, spans)`: a document's
//!   entities (the `entities` stage), one row per type and normalised form, indexed by
//!   `(type, norm)` and by `norm`, so a filter or a facet is an index look-up.
//! - `document_labels(document_id, label, score)`: a document's labels (the `labels` stage),
//!   indexed by label.
//! - `stage_dependencies(stage, depends_on)`: the config's stage graph beyond `chunk`, read by
//!   the claim (work waits for its dependencies) and by a stage's write (its dependents are
//!   pending again).
//!
//! Version 10:
//! - `keyword_log(seq, chunk)`: every chunk whose full-text entry a write added or removed,
//!   once the index has a Tantivy index beside it (`meta.keyword_index`: `building`, `ready`;
//!   `meta.keyword_seq`: the last position its commit holds), in the writer's transaction; the
//!   next writer replays it into `<index>.keyword/` (see `keyword.rs`).

use rusqlite::Connection;

pub const SCHEMA_VERSION: i64 = 10;

/// Create or migrate the schema up to [`SCHEMA_VERSION`]. Runs in the caller's transaction.
/// Version 3's data steps (vector set of an existing index, lifecycle rows of existing
/// documents) are done by the caller, which knows the model.
pub fn migrate(conn: &Connection, from: i64) -> rusqlite::Result<()> {
    migrate_to(conn, from, SCHEMA_VERSION)
}

/// Version 1: documents, chunks, their keyword index, the reserved `enrichment` table.
const V1: &str = "CREATE TABLE IF NOT EXISTS meta (
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
             );";

/// Version 2: chunks keyed by their model input.
const V2: &str = "ALTER TABLE chunks ADD COLUMN input_key BLOB;
             CREATE INDEX chunks_by_input_key ON chunks(input_key);";

/// Version 3: the lifecycle (the reserved `enrichment` table of versions 1 and 2 was never
/// written), vector sets, chunks that know their tokens, vectors and replacement.
const V3: &str = "CREATE TABLE chunks_v3 (
                 rowid INTEGER PRIMARY KEY,
                 id TEXT NOT NULL,
                 document_id TEXT NOT NULL,
                 ordinal INTEGER NOT NULL,
                 version TEXT NOT NULL,
                 text TEXT NOT NULL,
                 heading_path TEXT NOT NULL,
                 start_byte INTEGER NOT NULL,
                 end_byte INTEGER NOT NULL,
                 token_count INTEGER NOT NULL,
                 input_key BLOB,
                 token_ids BLOB,
                 embedded INTEGER NOT NULL DEFAULT 0,
                 replaced_by TEXT
             );
             INSERT INTO chunks_v3(rowid, id, document_id, ordinal, version, text, heading_path,
                                   start_byte, end_byte, token_count, input_key)
                 SELECT rowid, id, document_id, ordinal, version, text, heading_path,
                        start_byte, end_byte, token_count, input_key FROM chunks;
             DROP TABLE chunks;
             ALTER TABLE chunks_v3 RENAME TO chunks;
             CREATE UNIQUE INDEX chunks_by_id ON chunks(id) WHERE replaced_by IS NULL;
             CREATE INDEX chunks_by_document ON chunks(document_id, ordinal);
             CREATE INDEX chunks_by_input_key ON chunks(input_key);
             CREATE INDEX chunks_replaced ON chunks(document_id, replaced_by)
                 WHERE replaced_by IS NOT NULL;
             DROP TABLE enrichment;
             CREATE TABLE enrichment (
                 id INTEGER PRIMARY KEY,
                 document_id TEXT NOT NULL,
                 stage TEXT NOT NULL,
                 vector_set INTEGER NOT NULL DEFAULT 0,
                 status TEXT NOT NULL,
                 priority INTEGER NOT NULL,
                 seq INTEGER NOT NULL,
                 attempts INTEGER NOT NULL DEFAULT 0,
                 not_before INTEGER NOT NULL DEFAULT 0,
                 lease_owner TEXT,
                 lease_expires INTEGER,
                 fingerprint TEXT,
                 input_version TEXT NOT NULL,
                 todo_chunks INTEGER NOT NULL DEFAULT 0,
                 todo_tokens INTEGER NOT NULL DEFAULT 0,
                 enqueued_at INTEGER NOT NULL,
                 claimed_at INTEGER,
                 claim_seq INTEGER,
                 done_at INTEGER,
                 updated_at INTEGER NOT NULL,
                 UNIQUE (document_id, stage, vector_set)
             );
             CREATE INDEX enrichment_ready ON enrichment(stage, priority DESC, seq)
                 WHERE status IN ('pending', 'failed', 'in_progress');
             CREATE INDEX enrichment_by_status ON enrichment(stage, vector_set, status);
             CREATE TABLE enrichment_errors (
                 document_id TEXT NOT NULL,
                 stage TEXT NOT NULL,
                 vector_set INTEGER NOT NULL,
                 attempt INTEGER NOT NULL,
                 at INTEGER NOT NULL,
                 worker TEXT NOT NULL,
                 message TEXT NOT NULL
             );
             CREATE INDEX enrichment_errors_by_document
                 ON enrichment_errors(document_id, stage, vector_set);
             CREATE TABLE stage_control (
                 stage TEXT PRIMARY KEY,
                 paused INTEGER NOT NULL,
                 changed_at INTEGER NOT NULL
             );
             CREATE TABLE vector_sets (
                 id INTEGER PRIMARY KEY,
                 model TEXT NOT NULL,
                 model_dir TEXT NOT NULL,
                 fingerprint TEXT NOT NULL,
                 tokenizer TEXT,
                 dimension INTEGER NOT NULL,
                 vec_table TEXT NOT NULL,
                 state TEXT NOT NULL,
                 watermark TEXT,
                 backfill_done INTEGER NOT NULL DEFAULT 0,
                 created_at INTEGER NOT NULL,
                 switched_at INTEGER
             );
             CREATE TABLE counters (
                 name TEXT PRIMARY KEY,
                 value INTEGER NOT NULL
             );";

/// Version 4: the pages a chunk spans.
const V4: &str = "ALTER TABLE chunks ADD COLUMN page_start INTEGER;
             ALTER TABLE chunks ADD COLUMN page_end INTEGER;";

/// Version 5: dead-lettered documents' copies, circuits, LLM stage outputs.
const V5: &str = "CREATE TABLE dead_documents (
                 document_id TEXT PRIMARY KEY,
                 payload BLOB,
                 source TEXT,
                 config TEXT,
                 buried_at INTEGER NOT NULL
             );
             ALTER TABLE stage_control ADD COLUMN circuit TEXT;
             ALTER TABLE stage_control ADD COLUMN circuit_since INTEGER;
             CREATE TABLE stage_outputs (
                 rowid INTEGER PRIMARY KEY,
                 document_id TEXT NOT NULL,
                 stage TEXT NOT NULL,
                 output TEXT NOT NULL,
                 keyword INTEGER NOT NULL,
                 at INTEGER NOT NULL,
                 UNIQUE (document_id, stage)
             );
             CREATE VIRTUAL TABLE output_fts USING fts5(
                 output, tokenize='porter unicode61'
             );";

/// Version 6: the approximate nearest-neighbour index of each vector set (`ann`) and the
/// log of vector changes it has yet to take in (`ann_log`); see `ann.rs`.
const V6: &str = "CREATE TABLE ann (
                 vector_set INTEGER PRIMARY KEY,
                 state TEXT NOT NULL,
                 dtype TEXT NOT NULL,
                 file TEXT,
                 seq INTEGER NOT NULL DEFAULT 0,
                 size INTEGER NOT NULL DEFAULT 0,
                 updated_at INTEGER NOT NULL
             );
             CREATE TABLE ann_log (
                 seq INTEGER PRIMARY KEY AUTOINCREMENT,
                 vector_set INTEGER NOT NULL,
                 chunk INTEGER NOT NULL
             );
             CREATE INDEX ann_log_by_set ON ann_log(vector_set, seq);";

/// Version 7: reuse look-ups go through the embedded chunks only.
const V7: &str = "DROP INDEX IF EXISTS chunks_by_input_key;
             CREATE INDEX chunks_embedded_by_input_key ON chunks(input_key, embedded)
                 WHERE embedded != 0;";

/// Version 8: sparse vectors, as postings.
pub(super) const V8: &str = "CREATE TABLE sparse_postings (
                 term INTEGER NOT NULL,
                 chunk INTEGER NOT NULL,
                 weight REAL NOT NULL,
                 PRIMARY KEY (term, chunk)
             ) WITHOUT ROWID;
             CREATE INDEX sparse_postings_by_chunk ON sparse_postings(chunk);
             CREATE TRIGGER chunks_lose_their_postings AFTER DELETE ON chunks BEGIN
                 DELETE FROM sparse_postings WHERE chunk = old.rowid;
             END;";

/// The schema's steps: version N is reached by running `STEPS[N - 1]`.
pub(super) const V9: &str = "CREATE TABLE document_entities (
                 document_id TEXT NOT NULL,
                 type TEXT NOT NULL,
                 norm TEXT NOT NULL,
                 text TEXT NOT NULL,
                 mentions INTEGER NOT NULL,
                 score REAL NOT NULL,
                 spans TEXT NOT NULL,
                 PRIMARY KEY (document_id, type, norm)
             ) WITHOUT ROWID;
             CREATE INDEX document_entities_by_entity ON document_entities(type, norm);
             CREATE INDEX document_entities_by_norm ON document_entities(norm);
             CREATE TABLE document_labels (
                 document_id TEXT NOT NULL,
                 label TEXT NOT NULL,
                 score REAL NOT NULL,
                 PRIMARY KEY (document_id, label)
             ) WITHOUT ROWID;
             CREATE INDEX document_labels_by_label ON document_labels(label);
             CREATE TABLE stage_dependencies (
                 stage TEXT NOT NULL,
                 depends_on TEXT NOT NULL,
                 PRIMARY KEY (stage, depends_on)
             ) WITHOUT ROWID;
             CREATE INDEX stage_dependencies_by_dependency ON stage_dependencies(depends_on);";

/// Version 10: the log of full-text changes the Tantivy index beside the file has yet to take
/// in (`keyword.rs`).
const V10: &str = "CREATE TABLE keyword_log (
                 seq INTEGER PRIMARY KEY AUTOINCREMENT,
                 chunk INTEGER NOT NULL
             );";

const STEPS: [&str; SCHEMA_VERSION as usize] = [V1, V2, V3, V4, V5, V6, V7, V8, V9, V10];

/// Migrate from version `from` to `to` (tests build old versions with it).
pub fn migrate_to(conn: &Connection, from: i64, to: i64) -> rusqlite::Result<()> {
    for (version, sql) in (1i64..).zip(STEPS) {
        if from < version && to >= version {
            conn.execute_batch(sql)?;
        }
    }
    conn.execute(
        "INSERT INTO meta(key, value) VALUES ('schema_version', ?1)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        [to.to_string()],
    )?;
    Ok(())
}

/// Vectors per vec0 storage chunk. vec0 rewrites a chunk's bookkeeping on every insert, so
/// inserts slow down as chunks grow (measured: 85k/s at its default 1,024, 131k/s at 256,
/// 3k/s at 4,096) while a search scans the same vectors either way (about 40 ms for 100k).
pub const VEC_CHUNK_SIZE: usize = 256;

/// A vector table `name` for `dimension`-long vectors compared by cosine distance.
pub fn create_vectors(conn: &Connection, name: &str, dimension: usize) -> rusqlite::Result<()> {
    conn.execute_batch(&format!(
        "CREATE VIRTUAL TABLE IF NOT EXISTS {name} USING vec0(
             embedding float[{dimension}] distance_metric=cosine,
             chunk_size={VEC_CHUNK_SIZE}
         );"
    ))
}

/// The next value of a sequence (1, 2, ...).
/// Move a counter past the `n` values a statement numbered from [`next_in`]'s value
/// (`base + ROW_NUMBER() OVER ...`).
pub fn advance(conn: &Connection, counter: &str, n: i64) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE counters SET value = value + ?2 WHERE name = ?1")?
        .execute(rusqlite::params![counter, n])?;
    Ok(())
}

pub fn next_in(conn: &Connection, counter: &str) -> rusqlite::Result<i64> {
    conn.prepare_cached(
        "INSERT INTO counters(name, value) VALUES (?1, 1)
         ON CONFLICT(name) DO UPDATE SET value = value + 1
         RETURNING value",
    )?
    .query_row([counter], |r| r.get(0))
}
