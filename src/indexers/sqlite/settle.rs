//! Settling a document's lifecycle rows from what the index holds: the one place that decides
//! a document's `chunk` and `embed` status after a write. Called in the transaction of every
//! write that touches a document (ingest batches, `enrich` results, backfill pages), so the
//! status always says what the rows say.
//!
//! - `chunk` is done when the document's `chunk_count` chunks of its current version exist.
//! - `embed` (one row per live vector set) is done when `chunk` is and each of those chunks
//!   has a vector in the set. Otherwise it is queued (a new row is `pending` at the priority
//!   given; `enrich` claims it only once `chunk` is done).
//! - A changed document (another version) is fresh work: status `pending`, attempts reset,
//!   a new place in the FIFO, its lease void (a worker still holding it cannot complete it).
//!   Earlier attempts' errors are kept.
//! - When a document's embed is done in the active set, the old versions of its chunks that
//!   were kept for vector search until then are deleted.

use rusqlite::{params, Connection, OptionalExtension};

use super::schema::next_in;
use super::sets::{SetState, VectorSet};
use super::write::delete_chunk_row;
use crate::lifecycle::{now_ms, Priority, Status, CHUNK, EMBED};

/// Settle `document`'s rows; new rows get `priority`. A document no longer in the index
/// loses its rows.
pub fn settle(
    conn: &Connection,
    document: &str,
    sets: &[VectorSet],
    priority: Priority,
) -> rusqlite::Result<()> {
    let doc: Option<(String, i64, String)> = conn
        .prepare_cached("SELECT version, chunk_count, fingerprint FROM documents WHERE id = ?1")?
        .query_row([document], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let Some((version, chunk_count, fingerprint)) = doc else {
        forget(conn, document)?;
        return Ok(());
    };
    let present: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM chunks
             WHERE document_id = ?1 AND version = ?2 AND replaced_by IS NULL",
        )?
        .query_row(params![document, version], |r| r.get(0))?;
    let chunked = present == chunk_count;
    let now = now_ms();
    upsert(
        conn,
        &Row {
            document,
            stage: CHUNK,
            vector_set: 0,
            version: &version,
            fingerprint: &fingerprint,
            done: chunked,
            todo: (0, 0),
            priority,
            now,
        },
    )?;
    for set in sets.iter().filter(|s| s.is_live()) {
        let todo: (i64, i64) = conn
            .prepare_cached(
                "SELECT COUNT(*), COALESCE(SUM(token_count), 0) FROM chunks
                 WHERE document_id = ?1 AND replaced_by IS NULL AND embedded & ?2 = 0",
            )?
            .query_row(params![document, set.bit()], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let done = chunked && todo.0 == 0;
        upsert(
            conn,
            &Row {
                document,
                stage: EMBED,
                vector_set: set.id,
                version: &version,
                fingerprint: &set.fingerprint,
                done,
                todo,
                priority,
                now,
            },
        )?;
        if done && set.state == SetState::Active {
            drop_old_versions(conn, document, sets)?;
        }
    }
    Ok(())
}

struct Row<'a> {
    document: &'a str,
    stage: &'a str,
    vector_set: i64,
    version: &'a str,
    fingerprint: &'a str,
    done: bool,
    todo: (i64, i64),
    priority: Priority,
    now: i64,
}

/// Record `r`: a new row, fresh work for another version, or the same work settled.
fn upsert(conn: &Connection, r: &Row<'_>) -> rusqlite::Result<()> {
    let existing: Option<(i64, String, String, i64)> = conn
        .prepare_cached(
            "SELECT id, status, input_version, priority FROM enrichment
             WHERE document_id = ?1 AND stage = ?2 AND vector_set = ?3",
        )?
        .query_row(params![r.document, r.stage, r.vector_set], |x| {
            Ok((x.get(0)?, x.get(1)?, x.get(2)?, x.get(3)?))
        })
        .optional()?;
    let Some((id, old_status, old_version, old_priority)) = existing else {
        return r.insert(conn);
    };
    if old_version != r.version {
        return r.renew(conn, id, old_priority);
    }
    let old: Status = old_status.parse().unwrap_or(Status::Pending);
    r.update(conn, id, old)
}

impl Row<'_> {
    /// Done when nothing is left to do, else pending.
    fn status(&self) -> Status {
        if self.done {
            Status::Done
        } else {
            Status::Pending
        }
    }

    /// The first row of this document's work for the stage and vector set.
    fn insert(&self, conn: &Connection) -> rusqlite::Result<()> {
        let r = self;
        let seq = next_in(conn, "enrichment_seq")?;
        conn.prepare_cached(
            "INSERT INTO enrichment(document_id, stage, vector_set, status, priority, seq,
                                    fingerprint, input_version, todo_chunks, todo_tokens,
                                    enqueued_at, done_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?11)",
        )?
        .execute(params![
            r.document,
            r.stage,
            r.vector_set,
            self.status().as_str(),
            r.priority.level(),
            seq,
            r.fingerprint,
            r.version,
            r.todo.0,
            r.todo.1,
            r.now,
            r.done.then_some(r.now),
        ])?;
        Ok(())
    }

    /// Row `id` held another version of the document: its work starts afresh, at the higher
    /// of the two priorities.
    fn renew(&self, conn: &Connection, id: i64, old_priority: i64) -> rusqlite::Result<()> {
        let r = self;
        // Another version of the document: fresh work, whatever state the old one was in.
        let seq = next_in(conn, "enrichment_seq")?;
        conn.prepare_cached(
            "UPDATE enrichment SET status = ?2, priority = ?3, seq = ?4, attempts = 0,
                 not_before = 0, lease_owner = NULL, lease_expires = NULL, fingerprint = ?5,
                 input_version = ?6, todo_chunks = ?7, todo_tokens = ?8, enqueued_at = ?9,
                 claimed_at = NULL, claim_seq = NULL, done_at = ?10, updated_at = ?9
             WHERE id = ?1",
        )?
        .execute(params![
            id,
            self.status().as_str(),
            r.priority.level().max(old_priority),
            seq,
            r.fingerprint,
            r.version,
            r.todo.0,
            r.todo.1,
            r.now,
            r.done.then_some(r.now),
        ])?;
        Ok(())
    }

    /// Row `id` (status `old`) holds this version: mark it done, queue it again, or update
    /// the work left.
    fn update(&self, conn: &Connection, id: i64, old: Status) -> rusqlite::Result<()> {
        let r = self;
        match (r.done, old) {
            (true, Status::Done)
            | (false, Status::Pending | Status::InProgress | Status::Failed | Status::Dead) => {
                // Still where it was (a dead document stays dead for the same content: `dlq
                // requeue` brings it back); only the work left may have changed.
                conn.prepare_cached(
                    "UPDATE enrichment SET todo_chunks = ?2, todo_tokens = ?3 WHERE id = ?1",
                )?
                .execute(params![id, r.todo.0, r.todo.1])?;
            }
            (true, _) => {
                conn.prepare_cached(
                    "UPDATE enrichment SET status = 'done', lease_owner = NULL,
                         lease_expires = NULL, not_before = 0, fingerprint = ?2, todo_chunks = 0,
                         todo_tokens = 0, done_at = ?3, updated_at = ?3
                     WHERE id = ?1",
                )?
                .execute(params![id, r.fingerprint, r.now])?;
            }
            (false, Status::Done) => {
                // Done, but a chunk lost its vector (rewritten): queued again.
                let seq = next_in(conn, "enrichment_seq")?;
                conn.prepare_cached(
                    "UPDATE enrichment SET status = 'pending', seq = ?2, attempts = 0,
                         not_before = 0, todo_chunks = ?3, todo_tokens = ?4, enqueued_at = ?5,
                         done_at = NULL, updated_at = ?5
                     WHERE id = ?1",
                )?
                .execute(params![id, seq, r.todo.0, r.todo.1, r.now])?;
            }
        }
        Ok(())
    }
}

/// Delete the chunks of older versions kept for search while the new ones were embedded.
fn drop_old_versions(
    conn: &Connection,
    document: &str,
    sets: &[VectorSet],
) -> rusqlite::Result<()> {
    let rows: Vec<(i64, i64)> = conn
        .prepare_cached(
            "SELECT rowid, embedded FROM chunks
             WHERE document_id = ?1 AND replaced_by IS NOT NULL",
        )?
        .query_map([document], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (rowid, embedded) in rows {
        delete_chunk_row(conn, rowid, embedded, false, sets)?;
    }
    Ok(())
}

/// A document gone from the index: its lifecycle goes with it.
pub fn forget(conn: &Connection, document: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("DELETE FROM enrichment WHERE document_id = ?1")?
        .execute([document])?;
    conn.prepare_cached("DELETE FROM enrichment_errors WHERE document_id = ?1")?
        .execute([document])?;
    super::outputs::forget_outputs(conn, document)?;
    Ok(())
}
