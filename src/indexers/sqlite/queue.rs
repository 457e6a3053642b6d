//! The index as a durable work queue: claims with leases in one transaction, results written
//! with the status change in one transaction, retries with backoff, dead letters. Several
//! `enrich` processes share one file: SQLite serialises the claim transactions, so no two
//! workers hold the same work (unless a lease expired).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::sets::{self, SetState, VectorSet};
use super::settle::settle;
use super::write::{delete_vector, drop_replaced, insert_vector};
use super::{connect, store_error, upgrade, vector_from_bytes, SqliteReader};
use crate::document::InputKey;
use crate::indexers::store::{maintain, BackfillSql};
use crate::lifecycle::rules::{self, Candidate, QueueSql};
use crate::lifecycle::store::HeldLease;
use crate::lifecycle::{
    now_ms, ChunkSparse, ChunkText, ChunkVector, Claim, ClaimRequest, DeliveryFailure,
    DocumentText, EnrichStore, LifecycleStore, Maintenance, PendingChunk, Priority,
    SparseModelRecord, StageSettings, Status, StoreError, WorkKey,
};
use crate::tokens::ids_from_bytes;

/// A read-write connection to an index, for the lifecycle.
pub struct SqliteStore {
    pub(super) conn: Connection,
    pub(super) path: PathBuf,
}

impl SqliteStore {
    /// A backfilled set gets its ANN before search switches to it, as Postgres builds its
    /// HNSW index first: once the switch is due, the graph is built here, outside any write
    /// transaction (writers go on; what they change meanwhile is logged and replayed). False
    /// while another worker of this run is building it: the switch waits for it. A failed
    /// build does not hold the switch (search scans exactly until a writer builds it).
    fn ann_before_switch(&mut self) -> Result<bool, StoreError> {
        let path = self.path.clone();
        let err = |e| store_error(&path, e);
        let Some(set) = sets::backfilling(&self.conn).map_err(err)? else {
            return Ok(true);
        };
        let mut q = Sql(&self.conn);
        if !set.backfill_done
            || q.unembedded_in(&set).map_err(err)? > 0
            || !q.open_work(set.id).map_err(err)?.is_empty()
        {
            return Ok(true);
        }
        match super::ann::maintain_set_exclusive(&self.path, &mut self.conn, &set) {
            Ok(Some(done)) => {
                tracing::info!("vector set {}'s ANN before the switch: {done:?}", set.id);
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(e) => {
                tracing::warn!(
                    "building the ANN of vector set {} before the switch: {e}; search scans \
                     exactly until a writer builds it",
                    set.id
                );
                Ok(true)
            }
        }
    }
}

/// An error inside a write transaction: SQLite's, or the store's own refusal.
pub(super) type TxError = crate::indexers::store::TxError<rusqlite::Error>;

impl From<rusqlite::Error> for TxError {
    fn from(e: rusqlite::Error) -> Self {
        TxError::Sql(e)
    }
}

impl SqliteStore {
    /// Run `f` in a write transaction and commit it. IMMEDIATE: the write lock is taken at
    /// the start, so two workers never fail upgrading a read to a write; the other waits.
    pub(super) fn write<T>(
        &mut self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, TxError>,
    ) -> Result<T, StoreError> {
        let run = |conn: &mut Connection| -> Result<T, TxError> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        };
        run(&mut self.conn).map_err(|e| match e {
            TxError::Sql(e) => store_error(&self.path, e),
            TxError::Store(e) => e,
        })
    }

    /// Open an existing index (migrating an older schema).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let reader = SqliteReader::open(path).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let mut conn = connect(path).map_err(|e| store_error(path, e))?;
        if reader.meta().schema_version < super::schema::SCHEMA_VERSION {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(|e| store_error(path, e))?;
            upgrade(&tx).map_err(|e| store_error(path, e))?;
            tx.commit().map_err(|e| store_error(path, e))?;
        }
        Ok(SqliteStore {
            conn,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(super) fn err(&self, e: rusqlite::Error) -> StoreError {
        store_error(&self.path, e)
    }

    pub fn sets(&self) -> Result<Vec<VectorSet>, StoreError> {
        sets::all(&self.conn).map_err(|e| self.err(e))
    }

    fn vector_set(&self, id: i64) -> Result<VectorSet, StoreError> {
        sets::by_id(&self.conn, id)
            .map_err(|e| self.err(e))?
            .ok_or_else(|| StoreError::Invalid(format!("the index has no vector set {id}")))
    }

    /// Whether chunk token ids and input keys mean the same input to `set`'s model.
    fn same_tokenizer(&self, set: &VectorSet) -> Result<bool, StoreError> {
        let chunker: Option<String> = self
            .conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'chunk_tokenizer'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        Ok(set.tokenizer.is_some() && set.tokenizer == chunker)
    }
}

/// The lifecycle's statements on SQLite ([`rules`] decides). Claims run in an IMMEDIATE
/// write transaction, which no other writer shares, so they need no row locks.
pub(super) struct Sql<'a>(pub(super) &'a Connection);

impl QueueSql for Sql<'_> {
    type Error = rusqlite::Error;
    const ROW_LOCKS: bool = false;

    fn paused_stages(&mut self) -> rusqlite::Result<Vec<String>> {
        self.0
            .prepare_cached("SELECT stage FROM stage_control WHERE paused = 1")?
            .query_map([], |r| r.get(0))?
            .collect()
    }

    fn candidates(
        &mut self,
        stage: &str,
        now: i64,
        sets: &[i64],
        limit: usize,
        _lock: bool,
    ) -> rusqlite::Result<Vec<Candidate>> {
        // The vector sets as a JSON array (NULL: any), read with json_each.
        let sets = (!sets.is_empty()).then(|| {
            let ids: Vec<String> = sets.iter().map(i64::to_string).collect();
            format!("[{}]", ids.join(","))
        });
        self.0
            .prepare_cached(
                "SELECT e.id, e.document_id, e.vector_set, e.attempts, e.priority, e.seq,
                        e.input_version, e.todo_tokens, e.status, e.lease_owner
                 FROM enrichment e
                 WHERE e.stage = ?1 AND e.status IN ('pending', 'failed', 'in_progress')
                   AND ((e.status != 'in_progress' AND e.not_before <= ?2)
                        OR (e.status = 'in_progress' AND e.lease_expires < ?2))
                   AND (?4 IS NULL OR e.vector_set IN (SELECT value FROM json_each(?4)))
                   AND EXISTS (SELECT 1 FROM enrichment c
                               WHERE c.document_id = e.document_id AND c.stage = 'chunk'
                                 AND c.vector_set = 0 AND c.status = 'done'
                                 AND c.input_version = e.input_version)
                   AND NOT EXISTS (SELECT 1 FROM stage_dependencies sd
                                   WHERE sd.stage = e.stage
                                     AND NOT EXISTS (
                                         SELECT 1 FROM enrichment c
                                         WHERE c.document_id = e.document_id
                                           AND c.stage = sd.depends_on AND c.status = 'done'
                                           AND c.input_version = e.input_version))
                 ORDER BY e.priority DESC, e.seq
                 LIMIT ?3",
            )?
            .query_map(params![stage, now, limit as i64, sets], |r| {
                let status: String = r.get(8)?;
                Ok(Candidate {
                    id: r.get(0)?,
                    key: WorkKey {
                        document_id: r.get(1)?,
                        stage: stage.to_string(),
                        vector_set: r.get(2)?,
                    },
                    attempts: r.get(3)?,
                    priority: r.get(4)?,
                    seq: r.get(5)?,
                    input_version: r.get(6)?,
                    cost: r.get::<_, i64>(7)?.max(0) as u64,
                    expired_owner: if status == "in_progress" {
                        Some(r.get::<_, Option<String>>(9)?.unwrap_or_default())
                    } else {
                        None
                    },
                })
            })?
            .collect()
    }

    fn next_due(&mut self, now: i64) -> rusqlite::Result<Option<i64>> {
        self.0.query_row(
            "SELECT MIN(not_before) FROM enrichment WHERE status = 'failed' AND not_before > ?1",
            [now],
            |r| r.get(0),
        )
    }

    fn paused_with_work(&mut self) -> rusqlite::Result<bool> {
        self.0.query_row(
            "SELECT EXISTS(SELECT 1 FROM enrichment e JOIN stage_control s
                 ON s.stage = e.stage AND s.paused = 1
             WHERE e.status IN ('pending', 'failed', 'in_progress'))",
            [],
            |r| r.get(0),
        )
    }

    fn claim_seqs(&mut self, n: usize) -> rusqlite::Result<Vec<i64>> {
        let first = super::schema::next_in(self.0, "claim_seq")?;
        // One number per item: take a block.
        super::schema::advance(self.0, "claim_seq", n as i64)?;
        Ok((first..first + n as i64).collect())
    }

    fn lease(
        &mut self,
        rows: &[(i64, i64)],
        owner: &str,
        expires: i64,
        now: i64,
    ) -> rusqlite::Result<()> {
        let mut update = self.0.prepare_cached(
            "UPDATE enrichment SET status = 'in_progress', attempts = attempts + 1,
                 lease_owner = ?2, lease_expires = ?3, claimed_at = ?4, claim_seq = ?5,
                 updated_at = ?4
             WHERE id = ?1",
        )?;
        for (id, seq) in rows {
            update.execute(params![id, owner, expires, now, seq])?;
        }
        Ok(())
    }

    fn held(&mut self, owner: &str, key: &WorkKey) -> rusqlite::Result<Option<(i64, u32)>> {
        self.0
            .prepare_cached(
                "SELECT id, attempts FROM enrichment
                 WHERE document_id = ?1 AND stage = ?2 AND vector_set = ?3
                   AND status = 'in_progress' AND lease_owner = ?4",
            )?
            .query_row(
                params![key.document_id, key.stage, key.vector_set, owner],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
    }

    fn record_error(
        &mut self,
        key: &WorkKey,
        attempt: u32,
        worker: &str,
        message: &str,
        now: i64,
    ) -> rusqlite::Result<()> {
        self.0
            .prepare_cached(
                "INSERT INTO enrichment_errors(document_id, stage, vector_set, attempt, at,
                                               worker, message)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                key.document_id,
                key.stage,
                key.vector_set,
                attempt,
                now,
                worker,
                message
            ])?;
        Ok(())
    }

    fn set_dead(&mut self, id: i64, now: i64) -> rusqlite::Result<()> {
        self.0
            .prepare_cached(
                "UPDATE enrichment SET status = 'dead', lease_owner = NULL,
                     lease_expires = NULL, not_before = 0, updated_at = ?2
                 WHERE id = ?1",
            )?
            .execute(params![id, now])?;
        Ok(())
    }

    fn set_failed(&mut self, id: i64, not_before: i64, now: i64) -> rusqlite::Result<()> {
        self.0
            .prepare_cached(
                "UPDATE enrichment SET status = 'failed', not_before = ?2, lease_owner = NULL,
                     lease_expires = NULL, updated_at = ?3
                 WHERE id = ?1",
            )?
            .execute(params![id, not_before, now])?;
        Ok(())
    }

    fn note_delivery(
        &mut self,
        id: i64,
        attempt: u32,
        lease_expires: i64,
        now: i64,
    ) -> rusqlite::Result<()> {
        self.0
            .prepare_cached(
                "UPDATE enrichment SET attempts = MAX(attempts, ?2), lease_expires = ?3,
                     updated_at = ?4
                 WHERE id = ?1",
            )?
            .execute(params![id, attempt, lease_expires, now])?;
        Ok(())
    }

    fn lease_owners(&mut self) -> rusqlite::Result<Vec<String>> {
        self.0
            .prepare(
                "SELECT DISTINCT lease_owner FROM enrichment
                 WHERE status = 'in_progress' AND lease_owner IS NOT NULL",
            )?
            .query_map([], |r| r.get(0))?
            .collect()
    }

    fn leases_of(&mut self, owner: &str) -> rusqlite::Result<Vec<(i64, WorkKey, u32)>> {
        self.0
            .prepare(
                "SELECT id, document_id, stage, vector_set, attempts FROM enrichment
                 WHERE status = 'in_progress' AND lease_owner = ?1",
            )?
            .query_map([owner], |r| {
                let key = WorkKey {
                    document_id: r.get(1)?,
                    stage: r.get(2)?,
                    vector_set: r.get(3)?,
                };
                Ok((r.get(0)?, key, r.get(4)?))
            })?
            .collect()
    }
}

impl LifecycleStore for SqliteStore {
    fn claim(&mut self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        crate::lifecycle::store::claim_with_retries(|| {
            let now = now_ms();
            self.write(|tx| rules::claim(&mut Sql(tx), req, now).map_err(Into::into))
        })
    }

    fn renew(&mut self, owner: &str, keys: &[WorkKey], lease: Duration) -> Result<(), StoreError> {
        self.write(|tx| {
            let expires = now_ms() + lease.as_millis() as i64;
            for k in keys {
                tx.prepare_cached(
                    "UPDATE enrichment SET lease_expires = ?5
                     WHERE document_id = ?1 AND stage = ?2 AND vector_set = ?3
                       AND status = 'in_progress' AND lease_owner = ?4",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        k.document_id,
                        k.stage,
                        k.vector_set,
                        owner,
                        expires
                    ])
                })?;
            }
            Ok(())
        })
    }

    fn fail(
        &mut self,
        owner: &str,
        failures: &[(WorkKey, String)],
        settings: &StageSettings,
    ) -> Result<Vec<Status>, StoreError> {
        self.write(|tx| {
            rules::fail(&mut Sql(tx), owner, failures, settings, now_ms()).map_err(Into::into)
        })
    }

    fn fail_deliveries(
        &mut self,
        owner: &str,
        failures: &[DeliveryFailure],
        lease: Duration,
    ) -> Result<Vec<Status>, StoreError> {
        let lease_ms = lease.as_millis() as i64;
        self.write(|tx| {
            rules::fail_deliveries(&mut Sql(tx), owner, failures, lease_ms, now_ms())
                .map_err(Into::into)
        })
    }

    fn complete(&mut self, owner: &str, keys: &[WorkKey]) -> Result<(), StoreError> {
        self.write(|tx| {
            let now = now_ms();
            for key in keys {
                tx.prepare_cached(
                    "UPDATE enrichment SET status = 'done', lease_owner = NULL,
                         lease_expires = NULL, done_at = ?5, updated_at = ?5
                     WHERE document_id = ?1 AND stage = ?2 AND vector_set = ?3
                       AND status = 'in_progress' AND lease_owner = ?4",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        key.document_id,
                        key.stage,
                        key.vector_set,
                        owner,
                        now
                    ])
                })?;
            }
            Ok(())
        })
    }

    fn release(&mut self, owner: &str, keys: &[WorkKey]) -> Result<(), StoreError> {
        self.write(|tx| {
            for key in keys {
                tx.prepare_cached(
                    "UPDATE enrichment SET status = 'pending', attempts = MAX(attempts - 1, 0),
                         lease_owner = NULL, lease_expires = NULL
                     WHERE document_id = ?1 AND stage = ?2 AND vector_set = ?3
                       AND status = 'in_progress' AND lease_owner = ?4",
                )
                .and_then(|mut s| {
                    s.execute(params![key.document_id, key.stage, key.vector_set, owner])
                })?;
            }
            Ok(())
        })
    }

    fn maintain(&mut self) -> Result<Maintenance, StoreError> {
        if !self.ann_before_switch()? {
            return Ok(Maintenance::Nothing);
        }
        let done = self.write(|tx| maintain(&mut Sql(tx), now_ms()).map_err(Into::into))?;
        if done == Maintenance::Nothing {
            // Idle: keep the graphs close to SQLite, so readers need not scan.
            if let Err(e) = super::ann::apply_due(&self.path, &mut self.conn) {
                tracing::warn!("applying the ANN's change log: {e}; the next run retries");
            }
            if let Err(e) = super::keyword::maintain(&self.path, &mut self.conn, None) {
                tracing::warn!("applying the keyword index's log: {e}; the next run retries");
            }
        }
        Ok(done)
    }

    fn sync_stage(
        &mut self,
        stage: &str,
        fingerprint: &str,
        priority: Priority,
    ) -> Result<u64, StoreError> {
        self.sync_stage_rows(stage, fingerprint, priority)
    }

    fn held_leases(&mut self) -> Result<Vec<HeldLease>, StoreError> {
        self.conn
            .prepare(
                "SELECT lease_owner, COUNT(*), MAX(lease_expires) FROM enrichment
                 WHERE status = 'in_progress' AND lease_owner IS NOT NULL
                 GROUP BY lease_owner ORDER BY lease_owner",
            )
            .and_then(|mut s| {
                s.query_map([], |r| {
                    Ok(HeldLease {
                        owner: r.get(0)?,
                        items: r.get::<_, i64>(1)? as u64,
                        until_ms: r.get::<_, Option<i64>>(2)?.unwrap_or(0),
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|e| self.err(e))
    }

    fn reap_dead_owners(&mut self) -> Result<usize, StoreError> {
        let dead = rules::dead_owners(&mut Sql(&self.conn)).map_err(|e| self.err(e))?;
        if dead.is_empty() {
            return Ok(0);
        }
        self.write(|tx| rules::reap(&mut Sql(tx), &dead, now_ms()).map_err(Into::into))
    }
}

/// A chunk row as `write_vectors` checks it: input key, embedded bits, replaced_by, document
/// id, chunk id.
type ChunkState = (Option<Vec<u8>>, i64, Option<String>, String, String);

/// The vector `set` holds for an identical input (old versions of chunks count). The
/// `embedded != 0` term lets SQLite use `chunks_embedded_by_input_key`, which holds only
/// chunks with a vector.
pub(super) fn stored_vector(
    conn: &Connection,
    set: &VectorSet,
    key: &InputKey,
) -> rusqlite::Result<Option<Vec<f32>>> {
    let bytes: Option<Vec<u8>> = conn
        .prepare_cached(&format!(
            "SELECT v.embedding FROM chunks c JOIN {} v ON v.rowid = c.rowid
             WHERE c.input_key = ?1 AND c.embedded != 0 AND c.embedded & ?2 != 0 LIMIT 1",
            set.vec_table
        ))?
        .query_row(params![key.as_slice(), set.bit()], |r| r.get(0))
        .optional()?;
    Ok(bytes
        .filter(|b| b.len() == set.dimension * 4)
        .map(|b| vector_from_bytes(&b)))
}

impl EnrichStore for SqliteStore {
    fn pending_chunks(&mut self, key: &WorkKey) -> Result<Vec<PendingChunk>, StoreError> {
        let set = self.vector_set(key.vector_set)?;
        let ids_usable = self.same_tokenizer(&set)?;
        self.conn
            .prepare_cached(
                "SELECT rowid, id, input_key, token_ids, text FROM chunks
                 WHERE document_id = ?1 AND replaced_by IS NULL AND embedded & ?2 = 0
                 ORDER BY ordinal",
            )
            .and_then(|mut s| {
                s.query_map(params![key.document_id, set.bit()], |r| {
                    let input_key: Option<Vec<u8>> = r.get(2)?;
                    let ids: Option<Vec<u8>> = r.get(3)?;
                    Ok(PendingChunk {
                        rowid: r.get(0)?,
                        chunk_id: r.get(1)?,
                        document_id: key.document_id.clone(),
                        input_key: input_key.and_then(|k| k.try_into().ok()),
                        token_ids: ids.filter(|_| ids_usable).map(|b| ids_from_bytes(&b)),
                        text: r.get(4)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|e| self.err(e))
    }

    fn vector_for(
        &mut self,
        vector_set: i64,
        key: &InputKey,
    ) -> Result<Option<Vec<f32>>, StoreError> {
        let set = self.vector_set(vector_set)?;
        if !self.same_tokenizer(&set)? {
            return Ok(None);
        }
        stored_vector(&self.conn, &set, key).map_err(|e| self.err(e))
    }

    fn write_vectors(
        &mut self,
        vector_set: i64,
        vectors: &[ChunkVector],
        documents: &[String],
    ) -> Result<usize, StoreError> {
        self.write(|tx| {
            let all = sets::all(tx)?;
            let set = all
                .iter()
                .find(|s| s.id == vector_set)
                .cloned()
                .ok_or_else(|| {
                    StoreError::Invalid(format!("the index has no vector set {vector_set}"))
                })?;
            let live_mask: i64 = all.iter().filter(|s| s.is_live()).map(VectorSet::bit).sum();
            let mut written = 0;
            // Every document a vector lands in is settled: its work left shrinks, and it is done
            // when its last chunk has a vector.
            let mut touched: std::collections::BTreeSet<String> =
                documents.iter().cloned().collect();
            for v in vectors {
                if v.vector.len() != set.dimension {
                    return Err(TxError::invalid(format!(
                        "a vector of {} dimensions for vector set {} of {}: this is a bug",
                        v.vector.len(),
                        set.id,
                        set.dimension
                    )));
                }
                let row: Option<ChunkState> = tx
                    .prepare_cached(
                        "SELECT input_key, embedded, replaced_by, document_id, id FROM chunks
                         WHERE rowid = ?1",
                    )
                    .and_then(|mut s| {
                        s.query_row([v.rowid], |r| {
                            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                        })
                        .optional()
                    })?;
                let Some((key, embedded, replaced_by, document, id)) = row else {
                    continue; // deleted meanwhile
                };
                let same_input = key.as_deref() == v.guard.as_ref().map(|k| k.as_slice());
                if replaced_by.is_some() || !same_input {
                    continue; // replaced by other text meanwhile: this vector is not its
                }
                if embedded & set.bit() != 0 {
                    delete_vector(tx, &set.vec_table, v.rowid)?;
                }
                insert_vector(tx, &set.vec_table, v.rowid, &v.vector)?;
                let now_embedded = embedded | set.bit();
                tx.prepare_cached(
                    "UPDATE chunks SET embedded = ?2,
                         token_ids = CASE WHEN ?2 & ?3 = ?3 THEN NULL ELSE token_ids END
                     WHERE rowid = ?1",
                )
                .and_then(|mut s| s.execute(params![v.rowid, now_embedded, live_mask]))?;
                if set.state == SetState::Active {
                    drop_replaced(tx, &document, &id, &all)?;
                }
                touched.insert(document);
                written += 1;
            }
            for doc in &touched {
                settle(tx, doc, &all, Priority::Fresh)?;
            }
            Ok(written)
        })
    }

    fn document_text(&mut self, id: &str) -> Result<Option<DocumentText>, StoreError> {
        self.read_document_text(id)
    }

    fn write_output(
        &mut self,
        owner: &str,
        key: &WorkKey,
        output: &str,
        keyword: bool,
    ) -> Result<bool, StoreError> {
        self.write_stage_output(owner, key, output, keyword)
    }

    fn current_chunks(&mut self, id: &str) -> Result<Option<Vec<ChunkText>>, StoreError> {
        self.read_current_chunks(id)
    }

    fn write_sparse(
        &mut self,
        owner: &str,
        key: &WorkKey,
        chunks: &[ChunkSparse],
    ) -> Result<bool, StoreError> {
        self.write_sparse_vectors(owner, key, chunks)
    }

    fn write_annotations(
        &mut self,
        owner: &str,
        key: &WorkKey,
        annotations: &crate::lifecycle::Annotations,
        prompt_text: &str,
    ) -> Result<bool, StoreError> {
        self.write_stage_annotations(owner, key, annotations, prompt_text)
    }

    fn record_dependencies(&mut self, edges: &[(String, String)]) -> Result<(), StoreError> {
        self.write_dependencies(edges)
    }

    fn sparse_model(&mut self) -> Result<Option<SparseModelRecord>, StoreError> {
        self.read_sparse_model()
    }

    fn record_sparse_model(&mut self, model: &SparseModelRecord) -> Result<(), StoreError> {
        self.put_sparse_model(model)
    }
}

impl BackfillSql for Sql<'_> {
    type Error = rusqlite::Error;

    fn sets_locked(&mut self) -> rusqlite::Result<Vec<VectorSet>> {
        // A write transaction holds the file's lock already.
        sets::all(self.0)
    }

    fn documents_after(&mut self, after: &str, n: usize) -> rusqlite::Result<Vec<String>> {
        self.0
            .prepare_cached("SELECT id FROM documents WHERE id > ?1 ORDER BY id LIMIT ?2")?
            .query_map(params![after, n as i64], |r| r.get(0))?
            .collect()
    }

    fn queue(
        &mut self,
        ids: &[String],
        all: &[VectorSet],
        priority: Priority,
        _now: i64,
    ) -> rusqlite::Result<()> {
        for id in ids {
            settle(self.0, id, all, priority)?;
        }
        Ok(())
    }

    fn set_watermark(&mut self, set: i64, last: Option<&str>, done: bool) -> rusqlite::Result<()> {
        self.0.execute(
            "UPDATE vector_sets SET watermark = COALESCE(?2, watermark), backfill_done = ?3
             WHERE id = ?1",
            params![set, last, done],
        )?;
        Ok(())
    }

    fn unembedded_in(&mut self, set: &VectorSet) -> rusqlite::Result<u64> {
        self.0
            .query_row(
                "SELECT COUNT(*) FROM chunks WHERE replaced_by IS NULL AND embedded & ?1 = 0",
                [set.bit()],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
    }

    fn open_work(&mut self, set: i64) -> rusqlite::Result<Vec<(String, i64)>> {
        self.0
            .prepare(
                "SELECT status, COUNT(*) FROM enrichment
                 WHERE stage = 'embed' AND vector_set = ?1 AND status != 'done' GROUP BY status",
            )?
            .query_map([set], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
    }

    fn switch_to(&mut self, set: &VectorSet, _now: i64) -> rusqlite::Result<()> {
        sets::switch_to(self.0, set)
    }
}
