//! The indexer's bulk writes: each batch is sent with `COPY ... FROM STDIN (FORMAT BINARY)`
//! into temporary staging tables, then moved into place by a few set-based statements, all in
//! one transaction: old versions kept for search, chunk upserts with their vectors (active
//! set) or token ids (a deferred ingest), the removal of chunks a shorter new version no
//! longer has, and the lifecycle rows of every document the batch touched. A batch that fails
//! is written again item by item, so only the items PostgreSQL refuses fail; a broken
//! connection (a server restart) is re-established, waiting up to the URI's
//! `reconnect_seconds`, and the batch is written again (every write is an idempotent upsert).
//!
//! A chunk that arrives without a vector replacing one with a vector and another input is
//! not overwritten: the old row is kept (`replaced_by`, out of the keyword index) so vector
//! search serves the old version, never the new text with an old vector, until the new
//! chunk has its vector. A rewritten chunk keeps the vectors of its sets when its model
//! input (the input key) is unchanged.

use std::collections::{BTreeSet, HashMap};

use postgres::binary_copy::BinaryCopyInWriter;
use postgres::error::SqlState;
use postgres::types::{ToSql, Type};
use postgres::{Client, Transaction};

use super::fts::TsVector;
use super::target::{PgTarget, VectorType};
use super::{is_retryable, pg_error, server_now, sets, settle};
use crate::document::Document;
use crate::indexers::{Backend, BackendError, ItemError, SetState, VectorSet};
use crate::lifecycle::Priority;

pub(super) struct PgBackend {
    client: Client,
    target: PgTarget,
    /// The chunker's fingerprint this run's documents are made with.
    fingerprint: String,
    /// The priority new work is queued at.
    priority: Priority,
    /// How the index stores vectors.
    vector_type: VectorType,
    /// The `vector` type as this connection knows it (an extension type has no fixed OID).
    vector_oid: Type,
    /// Rows this connection has written, and at how many it next refreshes the planner's
    /// statistics (see `keep_statistics`).
    written: usize,
    analyze_at: usize,
    /// `chunks.rowid`'s sequence as a regclass literal, looked up once (see `copy_new_chunks`).
    rowid_sequence: Option<String>,
}

/// Rows a table has before its first refresh of the statistics (see `keep_statistics`).
const FIRST_ANALYZE: usize = 4096;
/// Rows a connection writes between two looks at whether a table needs new statistics.
const ANALYZE_CHECK: usize = 4096;

/// Columns of a staged chunk, in COPY order.
const STAGE_COLUMNS: &str = "id, document_id, ordinal, version, text, heading_path, \
                             start_byte, end_byte, token_count, input_key, page_start, \
                             page_end, fts, embedding, token_ids";
/// Columns of a chunk row taken from the stage.
const CHUNK_COLUMNS: &str = "id, document_id, ordinal, version, text, heading_path, \
                             start_byte, end_byte, token_count, input_key, page_start, page_end, \
                             fts";
const DOCUMENT_COLUMNS: &str =
    "id, source, title, metadata, content_hash, fingerprint, version, chunk_count";

impl PgBackend {
    pub(super) fn connect(
        target: PgTarget,
        fingerprint: String,
        priority: Priority,
        vector_type: VectorType,
    ) -> Result<Self, BackendError> {
        let mut client = target.connect()?;
        let vector_oid = prepare_session(&mut client).map_err(|e| pg_error(&target, e))?;
        Ok(PgBackend {
            client,
            target,
            fingerprint,
            priority,
            vector_type,
            vector_oid,
            written: 0,
            analyze_at: FIRST_ANALYZE,
            rowid_sequence: None,
        })
    }

    /// A bulk load makes the index's tables grow far faster than autovacuum analyses them
    /// (a minute at best): with statistics of a table a tenth of its size, the planner joins
    /// each batch against the whole table, and every batch costs more than the one before.
    /// So a table that has doubled since its statistics were made is analysed by the writer
    /// that sees it: a few times in a load of any size, a fraction of a second each. The
    /// table's size and the rows its statistics counted are the server's (`n_live_tup`,
    /// `reltuples`), so writers share one schedule (each counting its own rows, four writers
    /// analysed four times as often), and a try-lock makes one of them do it, the others go
    /// on writing. Only the columns the writes and the queue join and filter on: the chunks'
    /// text, lexemes and vectors are most of an ANALYZE's work (perf: sorting texts,
    /// decoding vectors) and no plan here depends on them. (A column list leaves the
    /// table's change count alone, so autovacuum still makes the full statistics later;
    /// without the right to, PostgreSQL skips with a warning.)
    fn keep_statistics(&mut self, rows: usize) {
        self.written += rows;
        if self.written < self.analyze_at {
            return;
        }
        self.analyze_at = self.written + ANALYZE_CHECK;
        let s = self.target.schema_sql();
        let mut columns: HashMap<String, &str> = HashMap::from([
            (
                "chunks".to_string(),
                " (rowid, id, document_id, replaced_by, ordinal, input_key)",
            ),
            ("documents".to_string(), " (id)"),
            ("enrichment".to_string(), ""),
        ]);
        if let Ok(all) = sets::all(&mut self.client, &s) {
            columns.extend(all.into_iter().map(|x| (x.vec_table, " (rowid)")));
        }
        let names: Vec<&String> = columns.keys().collect();
        let Ok(rows) = self.client.query(
            "SELECT c.relname::text FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
             JOIN pg_stat_user_tables t ON t.relid = c.oid
             WHERE n.nspname = $1 AND c.relname = ANY($2)
               AND t.n_live_tup >= GREATEST($3::bigint, 2 * c.reltuples::bigint)",
            &[&self.target.schema, &names, &(FIRST_ANALYZE as i64)],
        ) else {
            return;
        };
        let stale: Vec<String> = rows
            .iter()
            .map(|r| {
                let t: String = r.get(0);
                format!("{s}.{t}{}", columns[&t])
            })
            .collect();
        if stale.is_empty() {
            return;
        }
        let Ok(mut tx) = self.client.transaction() else {
            return;
        };
        let mine = tx
            .query_one(
                "SELECT pg_try_advisory_xact_lock(hashtext($1))",
                &[&format!("ragline-analyze:{}", self.target.schema)],
            )
            .is_ok_and(|r| r.get::<_, bool>(0));
        if mine
            && tx
                .batch_execute(&format!("ANALYZE {}", stale.join(", ")))
                .is_ok()
        {
            let _ = tx.commit();
        }
    }

    /// After a connection error: connect again (waiting for a restarting server).
    fn reconnect(&mut self) -> Result<(), BackendError> {
        tracing::warn!(
            "{}: connection lost; reconnecting (waiting up to {}s for the server)",
            self.target,
            self.target.reconnect.as_secs()
        );
        self.client = self.target.connect_patiently()?;
        tracing::info!(target: crate::NOTE, "{}: reconnected; writing the batch again", self.target);
        self.vector_oid =
            prepare_session(&mut self.client).map_err(|e| pg_error(&self.target, e))?;
        Ok(())
    }

    /// Write these items (already checked, no two with one id) in one transaction.
    fn write_items(&mut self, items: &[&Document]) -> Result<(), postgres::Error> {
        match self.write_items_by(items, true) {
            // Another writer added one of these chunks first: upsert.
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                self.write_items_by(items, false)
            }
            r => r,
        }
    }

    /// `write_items`, by COPY straight into the tables where that is possible (`fast`).
    fn write_items_by(&mut self, items: &[&Document], fast: bool) -> Result<(), postgres::Error> {
        let s = self.target.schema_sql();
        let fingerprint = self.fingerprint.clone();
        let version_of = |doc: &Document| {
            crate::indexers::content_version(doc.content_hash.as_deref(), &fingerprint)
        };
        let (chunks, parents): (Vec<&Document>, Vec<&Document>) =
            items.iter().partition(|d| d.chunk.is_some());
        let sequence = match &self.rowid_sequence {
            Some(q) => q.clone(),
            None => {
                let name: String = self
                    .client
                    .query_one(
                        "SELECT pg_get_serial_sequence($1, 'rowid')",
                        &[&format!("{s}.chunks")],
                    )?
                    .get(0);
                let q = format!("'{}'::regclass", name.replace('\'', "''"));
                self.rowid_sequence = Some(q.clone());
                q
            }
        };
        let mut tx = self.client.transaction()?;
        // Every statement below is driven by the staged rows (one batch) and touches a few
        // rows of the index per staged row, by index: nested loops are the right plan at any
        // size. The planner cannot see it: a temporary table has no statistics, so it takes
        // the stage for several times its size and would hash-join it against whole tables.
        tx.batch_execute(
            "SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off;
             SET LOCAL enable_seqscan = off",
        )?;
        let touched: BTreeSet<String> = items
            .iter()
            .map(|d| d.parent_id.clone().unwrap_or_else(|| d.id.clone()))
            .collect();
        let touched: Vec<String> = touched.into_iter().collect();
        lock_documents(&mut tx, &self.target.schema, &touched)?;
        let now = server_now(&mut tx)?;
        let all = sets::all(&mut tx, &s)?;
        let active = all.iter().find(|x| x.state == SetState::Active).cloned();
        if !chunks.is_empty() {
            let active = active.as_ref().expect(
                "chunks are refused before writing when the index has no vectors; this is a bug",
            );
            if fast && self.vector_type == VectorType::Vector && all_new(&mut tx, &s, &chunks)? {
                let to = NewChunks {
                    s: &s,
                    sequence: &sequence,
                    vector_oid: &self.vector_oid,
                    active,
                };
                copy_new_chunks(&mut tx, &to, &chunks, &version_of)?;
            } else {
                copy_chunks(&mut tx, &self.vector_oid, &chunks, &version_of)?;
                write_chunks(&mut tx, &s, &all, active, self.vector_type)?;
            }
        }
        if !parents.is_empty() {
            copy_documents(&mut tx, &parents, &self.fingerprint, &version_of)?;
            write_documents(&mut tx, &s, &all, active.as_ref())?;
        }
        settle::settle(&mut tx, &s, &touched, &all, self.priority, now)?;
        tx.commit()
    }
}

/// One writer at a time per document, until commit: a document's parent and chunks can be
/// in batches of two writers at once, and each transaction's settling sees only what is
/// committed and its own rows, so two writers settling one document at once would each miss
/// the other's chunks and leave its `chunk` stage pending for good. Taken first, before any
/// row is written (so a writer waiting here holds no row another needs), in the order of the
/// keys (so two writers never wait on each other); a transaction lock, in its own key
/// space (two keys: the schema's and the document's hash). Writers of different documents
/// never wait; a hash collision only makes two of them take turns.
fn lock_documents(
    tx: &mut Transaction<'_>,
    schema: &str,
    ids: &[String],
) -> Result<(), postgres::Error> {
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext($1), k)
         FROM (SELECT DISTINCT hashtext(x) AS k FROM unnest($2::text[]) x ORDER BY 1) t",
        &[&schema, &ids],
    )?;
    Ok(())
}

/// The staging tables (temporary: this connection's own, emptied at each commit); returns
/// the OID of `vector` on this connection.
fn prepare_session(client: &mut Client) -> Result<Type, postgres::Error> {
    client.batch_execute(
        "CREATE TEMP TABLE IF NOT EXISTS rl_stage_documents (
             id text, source text, title text, metadata text, content_hash text,
             fingerprint text, version text, chunk_count integer) ON COMMIT DELETE ROWS;
         CREATE TEMP TABLE IF NOT EXISTS rl_stage_chunks (
             id text, document_id text, ordinal integer, version text, text text,
             heading_path text, start_byte bigint, end_byte bigint, token_count integer,
             input_key bytea, page_start integer, page_end integer, fts tsvector,
             embedding vector, token_ids bytea) ON COMMIT DELETE ROWS;
         CREATE INDEX IF NOT EXISTS rl_stage_chunks_id ON rl_stage_chunks (id);",
    )?;
    let stmt = client.prepare("SELECT $1::vector")?;
    Ok(stmt.params()[0].clone())
}

/// A chunk's column values, as both COPYs send them.
struct ChunkRow<'a> {
    id: &'a str,
    parent: &'a str,
    ordinal: i32,
    version: String,
    text: &'a str,
    heading_path: String,
    start: i64,
    end: i64,
    token_count: i32,
    key: Option<&'a [u8]>,
    page_start: Option<i32>,
    page_end: Option<i32>,
    /// The keyword index's lexemes of the heading path and text.
    fts: TsVector,
    vector: Option<pgvector::Vector>,
    /// The chunker's ids travel only with a chunk that still needs its vector.
    token_ids: Option<Vec<u8>>,
}

impl<'a> ChunkRow<'a> {
    fn of(doc: &'a Document, version_of: &dyn Fn(&Document) -> String) -> ChunkRow<'a> {
        let c = doc
            .chunk
            .as_deref()
            .expect("partitioned on chunk; this is a bug");
        let (page_start, page_end) = match c.pages {
            Some((a, b)) => (Some(a as i32), Some(b as i32)),
            None => (None, None),
        };
        let heading_path = c.heading_path.join(" > ");
        ChunkRow {
            fts: TsVector::of(&[&heading_path, &doc.fields.text]),
            id: &doc.id,
            parent: doc.parent_id.as_deref().unwrap_or(""),
            ordinal: c.ordinal as i32,
            version: version_of(doc),
            text: &doc.fields.text,
            heading_path,
            start: c.start as i64,
            end: c.end as i64,
            token_count: c.token_count as i32,
            key: c.input_key.as_ref().map(|k| k.as_slice()),
            page_start,
            page_end,
            vector: c.vector.as_ref().map(|v| pgvector::Vector::from(v.clone())),
            token_ids: c
                .vector
                .is_none()
                .then(|| crate::tokens::ids_to_bytes(&c.token_ids)),
        }
    }

    /// The values of `CHUNK_COLUMNS`.
    fn columns(&self) -> [&(dyn ToSql + Sync); 13] {
        [
            &self.id,
            &self.parent,
            &self.ordinal,
            &self.version,
            &self.text,
            &self.heading_path,
            &self.start,
            &self.end,
            &self.token_count,
            &self.key,
            &self.page_start,
            &self.page_end,
            &self.fts,
        ]
    }
}

/// The types of `CHUNK_COLUMNS`.
const CHUNK_TYPES: [Type; 13] = [
    Type::TEXT,
    Type::TEXT,
    Type::INT4,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::INT8,
    Type::INT4,
    Type::BYTEA,
    Type::INT4,
    Type::INT4,
    Type::TS_VECTOR,
];

fn copy_chunks(
    tx: &mut Transaction<'_>,
    vector_oid: &Type,
    chunks: &[&Document],
    version_of: &dyn Fn(&Document) -> String,
) -> Result<(), postgres::Error> {
    let mut types = CHUNK_TYPES.to_vec();
    types.extend([vector_oid.clone(), Type::BYTEA]);
    let sink = tx.copy_in(&format!(
        "COPY rl_stage_chunks ({STAGE_COLUMNS}) FROM STDIN (FORMAT BINARY)"
    ))?;
    let mut w = BinaryCopyInWriter::new(sink, &types);
    for doc in chunks {
        let r = ChunkRow::of(doc, version_of);
        let mut row: Vec<&(dyn ToSql + Sync)> = r.columns().to_vec();
        row.extend([&r.vector as &(dyn ToSql + Sync), &r.token_ids]);
        w.write(&row)?;
    }
    w.finish()?;
    Ok(())
}

/// Whether none of these chunks' documents has a chunk in the index yet (a first load):
/// then there is nothing to upsert, replace or keep, and the chunks can go in by COPY.
fn all_new(
    tx: &mut Transaction<'_>,
    s: &str,
    chunks: &[&Document],
) -> Result<bool, postgres::Error> {
    let parents: BTreeSet<&str> = chunks
        .iter()
        .filter_map(|d| d.parent_id.as_deref())
        .collect();
    let parents: Vec<&str> = parents.into_iter().collect();
    let row = tx.query_one(
        &format!("SELECT NOT EXISTS (SELECT 1 FROM {s}.chunks WHERE document_id = ANY($1))"),
        &[&parents],
    )?;
    Ok(row.get(0))
}

/// Chunks of documents new to the index, straight into their tables by binary COPY (what
/// PostgreSQL loads fastest): rowids reserved from the table's identity, the rows, their
/// vectors in the active set, the token ids of those still to embed. Two writers racing to
/// add one chunk meet at the unique index; the loser writes its batch again as upserts.
/// Where `copy_new_chunks` writes: the schema, `chunks.rowid`'s sequence (a regclass
/// literal: a constant, where a name looked up in the query would be looked up per row), the
/// `vector` type's OID on this connection, the active set.
struct NewChunks<'a> {
    s: &'a str,
    sequence: &'a str,
    vector_oid: &'a Type,
    active: &'a VectorSet,
}

fn copy_new_chunks(
    tx: &mut Transaction<'_>,
    to: &NewChunks<'_>,
    chunks: &[&Document],
    version_of: &dyn Fn(&Document) -> String,
) -> Result<(), postgres::Error> {
    let NewChunks {
        s,
        sequence,
        vector_oid,
        active,
    } = to;
    let rowids: Vec<i64> = tx
        .query_one(
            &format!("SELECT array_agg(nextval({sequence})) FROM generate_series(1, $1)"),
            &[&(chunks.len() as i32)],
        )?
        .get(0);
    let rows: Vec<ChunkRow> = chunks.iter().map(|d| ChunkRow::of(d, version_of)).collect();
    let mut types = vec![Type::INT8];
    types.extend(CHUNK_TYPES);
    let sink = tx.copy_in(&format!(
        "COPY {s}.chunks (rowid, {CHUNK_COLUMNS}) FROM STDIN (FORMAT BINARY)"
    ))?;
    let mut w = BinaryCopyInWriter::new(sink, &types);
    for (r, rowid) in rows.iter().zip(&rowids) {
        let mut row: Vec<&(dyn ToSql + Sync)> = vec![rowid];
        row.extend(r.columns());
        w.write(&row)?;
    }
    w.finish()?;
    if rows.iter().any(|r| r.vector.is_some()) {
        let sink = tx.copy_in(&format!(
            "COPY {s}.{} (rowid, embedding) FROM STDIN (FORMAT BINARY)",
            active.vec_table
        ))?;
        let mut w = BinaryCopyInWriter::new(sink, &[Type::INT8, (*vector_oid).clone()]);
        for (r, rowid) in rows.iter().zip(&rowids) {
            if let Some(v) = &r.vector {
                w.write(&[rowid, v])?;
            }
        }
        w.finish()?;
    }
    if rows.iter().any(|r| r.token_ids.is_some()) {
        let sink = tx.copy_in(&format!(
            "COPY {s}.chunk_tokens (rowid, token_ids) FROM STDIN (FORMAT BINARY)"
        ))?;
        let mut w = BinaryCopyInWriter::new(sink, &[Type::INT8, Type::BYTEA]);
        for (r, rowid) in rows.iter().zip(&rowids) {
            if let Some(t) = &r.token_ids {
                w.write(&[rowid, t])?;
            }
        }
        w.finish()?;
    }
    Ok(())
}

/// Staged chunks into place.
fn write_chunks(
    tx: &mut Transaction<'_>,
    s: &str,
    all: &[VectorSet],
    active: &VectorSet,
    ty: VectorType,
) -> Result<(), postgres::Error> {
    set_aside_changed(tx, s, all, active)?;
    upsert_staged(tx, s, all, active, ty)?;
    // A chunk that has its vector now: its old versions kept for search go.
    tx.query_one(
        &sets::delete_chunks(
            s,
            all,
            "rl_stage_chunks st",
            "c.document_id = st.document_id AND c.replaced_by = st.id \
             AND st.embedding IS NOT NULL",
        ),
        &[],
    )?;
    Ok(())
}

/// Before the staged chunks land: keep the old versions of chunks whose input changed and
/// that have no new vector, and drop the vectors that no longer describe their chunk.
fn set_aside_changed(
    tx: &mut Transaction<'_>,
    s: &str,
    all: &[VectorSet],
    active: &VectorSet,
) -> Result<(), postgres::Error> {
    let current = "c.id = st.id AND c.replaced_by IS NULL";
    // A chunk without a vector whose text (input) changed keeps its old version, with its
    // vector, for search.
    tx.execute(
        &format!(
            "WITH kept AS (
                 UPDATE {s}.chunks c SET replaced_by = c.id, fts = NULL FROM rl_stage_chunks st
                 WHERE {current} AND st.embedding IS NULL
                   AND c.input_key IS DISTINCT FROM st.input_key AND {has}
                 RETURNING c.rowid)
             DELETE FROM {s}.chunk_tokens WHERE rowid IN (SELECT rowid FROM kept)",
            has = sets::has_vector(s, active)
        ),
        &[],
    )?;
    // Vectors of another input than the new one's no longer describe the chunk.
    for set in all {
        tx.execute(
            &format!(
                "DELETE FROM {s}.{table} v USING {s}.chunks c, rl_stage_chunks st
                 WHERE {current} AND v.rowid = c.rowid
                   AND (c.input_key IS NULL OR c.input_key IS DISTINCT FROM st.input_key)",
                table = set.vec_table
            ),
            &[],
        )?;
    }
    Ok(())
}

/// Insert or update the staged chunks, with their vectors in `active` (as `ty`) and their
/// token ids while a live set still lacks their vector.
fn upsert_staged(
    tx: &mut Transaction<'_>,
    s: &str,
    all: &[VectorSet],
    active: &VectorSet,
    ty: VectorType,
) -> Result<(), postgres::Error> {
    let updates = CHUNK_COLUMNS
        .split(", ")
        .filter(|c| *c != "id")
        .map(|c| format!("{c} = excluded.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let cast = match ty {
        VectorType::Halfvec => format!("::halfvec({})", active.dimension),
        VectorType::Vector => String::new(),
    };
    tx.execute(
        &format!(
            "WITH up AS (
                 INSERT INTO {s}.chunks ({CHUNK_COLUMNS})
                 SELECT {CHUNK_COLUMNS} FROM rl_stage_chunks ORDER BY id
                 ON CONFLICT (id) WHERE replaced_by IS NULL DO UPDATE SET {updates}
                 RETURNING rowid, id),
             vectors AS (
                 INSERT INTO {s}.{table} (rowid, embedding)
                 SELECT up.rowid, st.embedding{cast} FROM up JOIN rl_stage_chunks st USING (id)
                 WHERE st.embedding IS NOT NULL
                 ON CONFLICT (rowid) DO UPDATE SET embedding = excluded.embedding),
             stale AS (
                 DELETE FROM {s}.chunk_tokens t USING up c JOIN rl_stage_chunks st USING (id)
                 WHERE t.rowid = c.rowid AND (st.token_ids IS NULL OR {everywhere}))
             INSERT INTO {s}.chunk_tokens (rowid, token_ids)
             SELECT c.rowid, st.token_ids FROM up c JOIN rl_stage_chunks st USING (id)
             WHERE st.token_ids IS NOT NULL AND NOT {everywhere}
             ON CONFLICT (rowid) DO UPDATE SET token_ids = excluded.token_ids",
            table = active.vec_table,
            everywhere = format!("({})", sets::in_every_live_set(s, all)),
        ),
        &[],
    )?;
    Ok(())
}

fn copy_documents(
    tx: &mut Transaction<'_>,
    parents: &[&Document],
    fingerprint: &str,
    version_of: &dyn Fn(&Document) -> String,
) -> Result<(), postgres::Error> {
    let types = [
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::INT4,
    ];
    let sink = tx.copy_in(&format!(
        "COPY rl_stage_documents ({DOCUMENT_COLUMNS}) FROM STDIN (FORMAT BINARY)"
    ))?;
    let mut w = BinaryCopyInWriter::new(sink, &types);
    for doc in parents {
        let metadata = serde_json::to_string(&doc.fields.metadata).unwrap_or_else(|_| "{}".into());
        let row: [&(dyn ToSql + Sync); 8] = [
            &doc.id,
            &doc.fields.source,
            &doc.fields.title,
            &metadata,
            &doc.content_hash.as_deref().unwrap_or(""),
            &fingerprint,
            &version_of(doc),
            &(doc.children as i32),
        ];
        w.write(&row)?;
    }
    w.finish()?;
    Ok(())
}

/// Staged documents into place; their chunks past the new count belong to an older
/// version: those with a vector in the active set stay for vector search until the new
/// version is embedded, the others go.
fn write_documents(
    tx: &mut Transaction<'_>,
    s: &str,
    all: &[VectorSet],
    active: Option<&VectorSet>,
) -> Result<(), postgres::Error> {
    let updates = DOCUMENT_COLUMNS
        .split(", ")
        .filter(|c| *c != "id")
        .map(|c| format!("{c} = excluded.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let select = DOCUMENT_COLUMNS.replace("metadata", "metadata::jsonb");
    tx.execute(
        &format!(
            "INSERT INTO {s}.documents ({DOCUMENT_COLUMNS})
             SELECT {select} FROM rl_stage_documents ORDER BY id
             ON CONFLICT (id) DO UPDATE SET {updates}, updated_at = now()"
        ),
        &[],
    )?;
    let tail = "c.document_id = d.id AND c.ordinal >= d.chunk_count AND c.replaced_by IS NULL";
    if let Some(active) = active {
        tx.execute(
            &format!(
                "WITH kept AS (
                     UPDATE {s}.chunks c SET replaced_by = '', fts = NULL FROM rl_stage_documents d
                     WHERE {tail} AND {has} RETURNING c.rowid)
                 DELETE FROM {s}.chunk_tokens WHERE rowid IN (SELECT rowid FROM kept)",
                has = sets::has_vector(s, active)
            ),
            &[],
        )?;
    }
    tx.query_one(
        &sets::delete_chunks(s, all, "rl_stage_documents d", tail),
        &[],
    )?;
    Ok(())
}

impl Backend for PgBackend {
    fn write(&mut self, batch: &[Document]) -> Vec<Result<(), ItemError>> {
        let dim = match self.active_dimension() {
            Ok(d) => d,
            Err(e) => return vec![Err(item_error(&self.target, &e)); batch.len()],
        };
        let mut results: Vec<Result<(), ItemError>> = batch
            .iter()
            .map(|d| crate::indexers::check_item(d, dim))
            .collect();
        // One row per id: a later item of the batch replaces an earlier one with its id.
        let mut last: HashMap<&str, usize> = HashMap::new();
        for (i, d) in batch.iter().enumerate() {
            if results[i].is_ok() && !d.unchanged {
                last.insert(&d.id, i);
            }
        }
        let mut todo: Vec<usize> = last.into_values().collect();
        todo.sort_unstable();
        if todo.is_empty() {
            return results;
        }
        let items: Vec<&Document> = todo.iter().map(|&i| &batch[i]).collect();
        let mut outcome = self.write_items(&items);
        if matches!(&outcome, Err(e) if is_retryable(e)) && self.client.is_closed() {
            // The server went away (a restart, a failover): wait for it, then write again.
            match self.reconnect() {
                Ok(()) => outcome = self.write_items(&items),
                Err(e) => {
                    let err = ItemError::retryable(e.to_string());
                    todo.iter().for_each(|&i| results[i] = Err(err.clone()));
                    return results;
                }
            }
        }
        match outcome {
            Ok(()) => {
                self.keep_statistics(items.len());
                results
            }
            Err(e) if is_retryable(&e) => {
                let err = item_error(&self.target, &e);
                todo.iter().for_each(|&i| results[i] = Err(err.clone()));
                results
            }
            Err(_) => {
                // Something in the batch is refused: each item on its own, so only it fails.
                for &i in &todo {
                    if let Err(e) = self.write_items(&[&batch[i]]) {
                        results[i] = Err(item_error(&self.target, &e));
                    }
                }
                results
            }
        }
    }

    fn flush(&mut self) -> Result<(), BackendError> {
        // Every batch is committed (durable per the server's synchronous_commit).
        Ok(())
    }
}

impl PgBackend {
    /// The dimension of the active set now (a migration may switch it during a run).
    fn active_dimension(&mut self) -> Result<Option<usize>, postgres::Error> {
        let s = self.target.schema_sql();
        let row = self.client.query_opt(
            &format!("SELECT dimension FROM {s}.vector_sets WHERE state = 'active'"),
            &[],
        );
        match row {
            Ok(r) => Ok(r.map(|r| r.get::<_, i32>(0) as usize)),
            Err(e) if e.is_closed() => {
                // Found out below, where the batch is written again after reconnecting.
                self.reconnect()
                    .map_err(|_| e)
                    .and_then(|()| self.active_dimension())
            }
            Err(e) => Err(e),
        }
    }
}

fn item_error(target: &PgTarget, e: &postgres::Error) -> ItemError {
    let why = match e.as_db_error() {
        Some(d) => format!("{} ({})", d.message(), d.code().code()),
        None => super::target::root_cause(e),
    };
    ItemError {
        retryable: is_retryable(e),
        message: format!("{target}: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use crate::indexers::synthetic;

    /// A document whose parent and chunks two writers write at the same moment (as two
    /// indexers taking batches from one queue do) ends with its `chunk` stage done: neither
    /// writer's settling may miss the other's rows (skipped without `RAGLINE_TEST_POSTGRES`).
    #[test]
    fn a_document_split_between_two_writers_at_once_is_settled_done() {
        let Some(mut c) = crate::indexers::postgres::test_server() else {
            return;
        };
        let url = std::env::var("RAGLINE_TEST_POSTGRES").unwrap();
        let schema = format!("u_split_{}", std::process::id());
        c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .unwrap();
        let uri = format!("{url}?schema={schema}").parse().unwrap();
        let factory = crate::indexers::open(&uri, synthetic::identity(8)).unwrap();
        const DOCUMENTS: usize = 100;
        let docs: Vec<Vec<crate::document::Document>> = (0..DOCUMENTS)
            .map(|d| synthetic::document(d, 8, 1))
            .collect();
        let together = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            for half in 0..2 {
                let (docs, together) = (&docs, &together);
                let mut writer = factory.connect().unwrap();
                s.spawn(move || {
                    for doc in docs {
                        // The parent and half the chunks, or the other half.
                        let part = if half == 0 { &doc[..6] } else { &doc[6..] };
                        together.wait();
                        assert!(writer.write(part).iter().all(|r| r.is_ok()));
                    }
                });
            }
        });
        let stuck: i64 = c
            .query_one(
                &format!(
                    "SELECT count(*) FILTER (WHERE status <> 'done') FROM {schema}.enrichment
                     WHERE stage = 'chunk' HAVING count(*) = $1"
                ),
                &[&(DOCUMENTS as i64)],
            )
            .unwrap()
            .get(0);
        assert_eq!(stuck, 0, "documents whose chunk stage stayed pending");
        c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .unwrap();
    }

    /// Two writers loading one index (skipped without `RAGLINE_TEST_POSTGRES`) refresh the
    /// statistics of the tables as they grow, on the server's count of their rows, and only
    /// of the columns plans depend on: the chunks' text and the vectors are left to
    /// autovacuum (turned off here, so what is analysed is the writers' doing). The tables
    /// of documents and lifecycle rows (1,200 each) are under the first threshold.
    #[test]
    fn writers_analyse_growing_tables_on_the_columns_plans_use() {
        let Some(mut c) = crate::indexers::postgres::test_server() else {
            return;
        };
        let url = std::env::var("RAGLINE_TEST_POSTGRES").unwrap();
        let schema = format!("u_analyse_{}", std::process::id());
        c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .unwrap();
        let uri = format!("{url}?schema={schema}").parse().unwrap();
        let factory = crate::indexers::open(&uri, synthetic::identity(8)).unwrap();
        for table in ["chunks", "documents", "enrichment", "vectors_1"] {
            c.batch_execute(&format!(
                "ALTER TABLE {schema}.{table} SET (autovacuum_enabled = false)"
            ))
            .unwrap();
        }
        let mut writers = [factory.connect().unwrap(), factory.connect().unwrap()];
        // 12,000 chunks in 6 rounds of a batch (1,000 chunks) per writer. Each writer looks
        // after its 4,096th row, in round 5; a pause before round 4 lets the server's row
        // counts (each connection sends its own at most once a second) catch up.
        let docs = synthetic::documents(12_000, 8, 1);
        let batches: Vec<&[crate::document::Document]> = docs.chunks(1100).collect();
        for (round, pair) in batches.chunks(2).enumerate() {
            if round == 3 {
                std::thread::sleep(std::time::Duration::from_millis(1500));
            }
            for (w, batch) in writers.iter_mut().zip(pair) {
                assert!(w.write(batch).iter().all(|r| r.is_ok()));
            }
        }
        let analysed = |table: &str, c: &mut postgres::Client| -> Vec<String> {
            c.query(
                "SELECT attname::text FROM pg_stats WHERE schemaname = $1 AND tablename = $2
                 ORDER BY 1",
                &[&schema, &table],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
        };
        assert_eq!(
            analysed("chunks", &mut c),
            [
                "document_id",
                "id",
                "input_key",
                "ordinal",
                "replaced_by",
                "rowid"
            ]
        );
        assert_eq!(analysed("vectors_1", &mut c), ["rowid"]);
        let tuples: f32 = c
            .query_one(
                &format!("SELECT reltuples FROM pg_class WHERE oid = '{schema}.chunks'::regclass"),
                &[],
            )
            .unwrap()
            .get(0);
        assert!(
            tuples >= 4096.0,
            "the statistics count {tuples} chunks of {}",
            docs.len()
        );
        drop(writers);
        c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .unwrap();
    }
}
