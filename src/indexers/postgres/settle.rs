//! Settling documents' lifecycle rows from what the index holds, set-based: one statement per
//! stage (and vector set) for every document a write touched, in the write's transaction.
//! The rules are SQLite's (`indexers/sqlite/settle.rs`):
//!
//! - `chunk` is done when the document's `chunk_count` chunks of its current version exist.
//! - `embed` (one row per live vector set) is done when `chunk` is and each current chunk has
//!   a vector in the set. Otherwise it is queued (`pending`, at the priority given).
//! - A changed document (another version) is fresh work: `pending` (or done), attempts reset,
//!   a new place in the FIFO, its lease void. Earlier attempts' errors are kept.
//! - Same version: becoming done clears the lease and the backoff; a done document that lost
//!   a vector is queued again; otherwise only the work left changes (a dead document stays
//!   dead: `dlq requeue` brings it back).
//! - When a document's embed is done in the active set, the old versions of its chunks kept
//!   for vector search go.

use postgres::GenericClient;

use super::sets;
use crate::indexers::{SetState, VectorSet};
use crate::lifecycle::{Priority, CHUNK, EMBED};

/// The documents among `$1` that exist, with whether their current version's chunks are all
/// there (`chunked`).
fn documents(s: &str) -> String {
    format!(
        "(SELECT d.id, d.fingerprint, d.version,
                 (SELECT count(*) FROM {s}.chunks c
                  WHERE c.document_id = d.id AND c.version = d.version
                    AND c.replaced_by IS NULL) = d.chunk_count AS chunked
          FROM {s}.documents d WHERE d.id = ANY($1::text[]) ORDER BY d.id) d"
    )
}

/// The transition of an existing row (`e`) to what the rows say now (`excluded`).
fn transition() -> &'static str {
    "status = CASE WHEN e.input_version <> excluded.input_version THEN excluded.status
                   WHEN excluded.status = 'done' THEN 'done'
                   WHEN e.status = 'done' THEN 'pending'
                   ELSE e.status END,
     priority = CASE WHEN e.input_version <> excluded.input_version
                     THEN GREATEST(e.priority, excluded.priority) ELSE e.priority END,
     seq = CASE WHEN e.input_version <> excluded.input_version
                     OR (excluded.status <> 'done' AND e.status = 'done')
                THEN excluded.seq ELSE e.seq END,
     attempts = CASE WHEN e.input_version <> excluded.input_version
                          OR (excluded.status <> 'done' AND e.status = 'done')
                     THEN 0 ELSE e.attempts END,
     not_before = CASE WHEN e.input_version <> excluded.input_version
                            OR (excluded.status = 'done') <> (e.status = 'done')
                       THEN 0 ELSE e.not_before END,
     lease_owner = CASE WHEN e.input_version <> excluded.input_version
                             OR (excluded.status = 'done' AND e.status <> 'done')
                        THEN NULL ELSE e.lease_owner END,
     lease_expires = CASE WHEN e.input_version <> excluded.input_version
                               OR (excluded.status = 'done' AND e.status <> 'done')
                          THEN NULL ELSE e.lease_expires END,
     fingerprint = CASE WHEN e.input_version <> excluded.input_version
                             OR (excluded.status = 'done' AND e.status <> 'done')
                        THEN excluded.fingerprint ELSE e.fingerprint END,
     input_version = excluded.input_version,
     todo_chunks = excluded.todo_chunks,
     todo_tokens = excluded.todo_tokens,
     enqueued_at = CASE WHEN e.input_version <> excluded.input_version
                             OR (excluded.status <> 'done' AND e.status = 'done')
                        THEN excluded.enqueued_at ELSE e.enqueued_at END,
     claimed_at = CASE WHEN e.input_version <> excluded.input_version
                       THEN NULL ELSE e.claimed_at END,
     claim_seq = CASE WHEN e.input_version <> excluded.input_version
                      THEN NULL ELSE e.claim_seq END,
     done_at = CASE WHEN e.input_version <> excluded.input_version
                         OR (excluded.status = 'done' AND e.status <> 'done')
                    THEN excluded.done_at
                    WHEN excluded.status <> 'done' AND e.status = 'done' THEN NULL
                    ELSE e.done_at END,
     updated_at = CASE WHEN e.input_version <> excluded.input_version
                            OR (excluded.status = 'done') <> (e.status = 'done')
                       THEN excluded.updated_at ELSE e.updated_at END"
}

/// The stage rows of those of `ids` no longer in the index.
fn forget_gone(c: &mut impl GenericClient, s: &str, ids: &[String]) -> Result<(), postgres::Error> {
    for table in [
        "enrichment",
        "enrichment_errors",
        "stage_outputs",
        "document_entities",
        "document_labels",
    ] {
        c.execute(
            &format!(
                "DELETE FROM {s}.{table} x WHERE x.document_id = ANY($1)
                   AND NOT EXISTS (SELECT 1 FROM {s}.documents d WHERE d.id = x.document_id)"
            ),
            &[&ids],
        )?;
    }
    Ok(())
}

/// Settle the rows of `ids` (distinct); new rows get `priority`. Documents no longer in the
/// index lose their rows.
pub fn settle(
    c: &mut impl GenericClient,
    s: &str,
    ids: &[String],
    all: &[VectorSet],
    priority: Priority,
    now: i64,
) -> Result<(), postgres::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    let level = priority.level() as i32;
    forget_gone(c, s, ids)?;
    let insert = "(document_id, stage, vector_set, status, priority, seq, fingerprint, \
                  input_version, todo_chunks, todo_tokens, enqueued_at, done_at, updated_at)";
    c.execute(
        &format!(
            "INSERT INTO {s}.enrichment AS e {insert}
             SELECT d.id, '{CHUNK}', 0, CASE WHEN d.chunked THEN 'done' ELSE 'pending' END,
                    $2::int, nextval('{s}.enrichment_seq'), d.fingerprint, d.version, 0, 0,
                    $3::bigint, CASE WHEN d.chunked THEN $3::bigint END, $3::bigint
             FROM {docs}
             ON CONFLICT (document_id, stage, vector_set) DO UPDATE SET {transition}",
            docs = documents(s),
            transition = transition()
        ),
        &[&ids, &level, &now],
    )?;
    for set in all.iter().filter(|x| x.is_live()) {
        c.execute(
            &format!(
                "INSERT INTO {s}.enrichment AS e {insert}
                 SELECT d.id, '{EMBED}', $4::int,
                        CASE WHEN d.chunked AND t.n = 0 THEN 'done' ELSE 'pending' END,
                        $2::int, nextval('{s}.enrichment_seq'), $5::text, d.version, t.n,
                        t.tokens, $3::bigint, CASE WHEN d.chunked AND t.n = 0 THEN $3::bigint END,
                        $3::bigint
                 FROM {docs}
                 CROSS JOIN LATERAL (
                     SELECT count(*) AS n, COALESCE(sum(c.token_count), 0)::bigint AS tokens
                     FROM {s}.chunks c
                     WHERE c.document_id = d.id AND c.replaced_by IS NULL
                       AND NOT {has}) t
                 ON CONFLICT (document_id, stage, vector_set) DO UPDATE SET {transition}",
                docs = documents(s),
                has = sets::has_vector(s, set),
                transition = transition()
            ),
            &[&ids, &level, &now, &(set.id as i32), &set.fingerprint],
        )?;
        if set.state == SetState::Active {
            // Embedded in the active set: the old versions kept for search go.
            c.query_one(
                &sets::delete_chunks(
                    s,
                    all,
                    &format!("{s}.enrichment e"),
                    &format!(
                        "e.document_id = ANY($1::text[]) AND e.stage = '{EMBED}'
                         AND e.vector_set = $2::int
                         AND e.status = 'done' AND c.document_id = e.document_id
                         AND c.replaced_by IS NOT NULL"
                    ),
                ),
                &[&ids, &(set.id as i32)],
            )?;
        }
    }
    Ok(())
}
