//! What operators ask of the lifecycle: `ragline status`, the dead-letter queue
//! (`ragline dlq list|show|requeue`), `pause`/`resume`, `promote`, and setting up a backfill.

use rusqlite::{params, OptionalExtension};

use super::queue::{Sql, SqliteStore};
use super::schema::{advance, next_in};
use super::sets::{self, SetState, VectorSet};
use crate::indexers::admin::{self, AdminSql};
use crate::indexers::store::{status_report, StatusSql};
use crate::indexers::{Burial, ModelIdentity, StoredCopy};
use crate::lifecycle::report::{
    AttemptError, DeadLetter, DocumentLifecycle, StageState, StatusReport,
};
use crate::lifecycle::rules::StatusGroup;
use crate::lifecycle::{now_ms, Priority, StoreError};

impl SqliteStore {
    /// Everything `ragline status` shows.
    pub fn status(&self) -> Result<StatusReport, StoreError> {
        let index = format!("sqlite://{}", self.path.display());
        let mut report =
            status_report(&mut Sql(&self.conn), index, now_ms()).map_err(|e| self.err(e))?;
        for set in &mut report.vector_sets {
            set.ann = super::ann::status(&self.conn, set.id).map_err(|e| self.err(e))?;
        }
        Ok(report)
    }

    /// Chunks of the active set still without a vector, and all current chunks.
    pub fn unembedded(&self) -> Result<(u64, u64), StoreError> {
        super::reader::unembedded(&self.conn).map_err(|e| self.err(e))
    }

    /// The dead-letter queue, oldest first.
    pub fn dead_letters(&self, stage: Option<&str>) -> Result<Vec<DeadLetter>, StoreError> {
        self.conn
            .prepare(
                "SELECT e.document_id, e.stage, e.vector_set, e.attempts, e.updated_at,
                        (SELECT message FROM enrichment_errors x
                         WHERE x.document_id = e.document_id AND x.stage = e.stage
                           AND x.vector_set = e.vector_set
                         ORDER BY x.at DESC, x.rowid DESC LIMIT 1)
                 FROM enrichment e
                 WHERE e.status = 'dead' AND (?1 IS NULL OR e.stage = ?1)
                 ORDER BY e.updated_at, e.document_id",
            )
            .and_then(|mut s| {
                s.query_map([stage], |r| {
                    Ok(DeadLetter {
                        document_id: r.get(0)?,
                        stage: r.get(1)?,
                        vector_set: r.get(2)?,
                        attempts: r.get(3)?,
                        dead_since: r.get(4)?,
                        last_error: r.get(5)?,
                    })
                })?
                .collect()
            })
            .map_err(|e| self.err(e))
    }

    /// A document's lifecycle: every stage with every attempt's error. None when the index
    /// has no such document.
    pub fn document_lifecycle(&self, id: &str) -> Result<Option<DocumentLifecycle>, StoreError> {
        admin::document_lifecycle(&mut Sql(&self.conn), id).map_err(|e| self.err(e))
    }

    /// Put dead documents back in the queue (attempts reset, errors kept): those of `ids`,
    /// or all when `ids` is None; of `stage` only when given. Returns how many.
    pub fn requeue(
        &mut self,
        stage: Option<&str>,
        ids: Option<&[String]>,
    ) -> Result<u64, StoreError> {
        let ids = ids.map(json_array);
        self.write(|tx| {
            let base = next_in(tx, "enrichment_seq")?;
            let n = tx.execute(
                "UPDATE enrichment SET status = 'pending', attempts = 0, not_before = 0,
                     seq = ?3 + d.n, enqueued_at = ?4, updated_at = ?4
                 FROM (SELECT id, ROW_NUMBER() OVER (ORDER BY updated_at, id) AS n
                       FROM enrichment
                       WHERE status = 'dead' AND (?1 IS NULL OR stage = ?1)
                         AND (?2 IS NULL OR document_id IN (SELECT value FROM json_each(?2)))) d
                 WHERE enrichment.id = d.id",
                params![stage, ids, base, now_ms()],
            )? as i64;
            advance(tx, "enrichment_seq", n)?;
            Ok(n as u64)
        })
    }

    /// Dead-letter documents a run could not get into the index (see [`Burial`]).
    pub fn bury(&mut self, burials: &[Burial]) -> Result<(), StoreError> {
        self.write(|tx| Ok(admin::bury(&mut Sql(tx), burials, now_ms())?))
    }

    /// The stored copies of buried documents among `ids`.
    pub fn buried(&self, ids: &[String]) -> Result<Vec<StoredCopy>, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT document_id, payload, source, config FROM dead_documents
                 WHERE document_id IN (SELECT value FROM json_each(?1)) ORDER BY document_id",
            )
            .and_then(|mut stmt| {
                stmt.query_map([json_array(ids)], |r| {
                    Ok(StoredCopy {
                        document_id: r.get(0)?,
                        payload: r.get(1)?,
                        source: r.get(2)?,
                        config: r.get(3)?,
                    })
                })?
                .collect()
            })
            .map_err(|e| self.err(e))
    }

    /// Forget the stored copies of `ids`.
    pub fn unbury(&mut self, ids: &[String]) -> Result<(), StoreError> {
        self.write(|tx| {
            tx.execute(
                "DELETE FROM dead_documents WHERE document_id IN (SELECT value FROM json_each(?1))",
                [json_array(ids)],
            )?;
            Ok(())
        })
    }

    /// Record a stage's circuit as open (with why) or closed.
    pub fn set_circuit(&mut self, stage: &str, open: Option<&str>) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO stage_control(stage, paused, changed_at, circuit, circuit_since)
                 VALUES (?1, 0, ?3, ?2, CASE WHEN ?2 IS NULL THEN NULL ELSE ?3 END)
                 ON CONFLICT(stage) DO UPDATE SET circuit = excluded.circuit,
                     circuit_since = excluded.circuit_since",
                params![stage, open, now_ms()],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Pause or resume a stage: workers stop claiming its work within a poll, finish what
    /// they hold, and go on when it is resumed.
    pub fn set_paused(&mut self, stage: &str, paused: bool) -> Result<(), StoreError> {
        admin::check_pausable(stage)?;
        self.conn
            .execute(
                "INSERT INTO stage_control(stage, paused, changed_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT(stage) DO UPDATE SET paused = excluded.paused,
                     changed_at = excluded.changed_at",
                params![stage, paused, now_ms()],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Move the pending embed work of `ids` to interactive priority: what searches are
    /// looking for is embedded first. Returns how many documents moved.
    pub fn promote(&mut self, ids: &[String]) -> Result<u64, StoreError> {
        self.write(|tx| {
            let n = tx.execute(
                "UPDATE enrichment SET priority = ?2
                 WHERE document_id IN (SELECT value FROM json_each(?1)) AND stage = 'embed'
                   AND priority < ?2 AND status IN ('pending', 'failed')",
                params![json_array(ids), Priority::Interactive.level()],
            )?;
            Ok(n as u64)
        })
    }

    /// Start (or resume) filling a vector set for `model`. The backfill's documents are
    /// queued a page at a time as workers run dry (`maintain`).
    pub fn start_backfill(&mut self, model: &ModelIdentity) -> Result<VectorSet, StoreError> {
        self.write(|tx| match admin::backfill_start(&sets::all(tx)?, model)? {
            Some(set) => Ok(set),
            None => Ok(sets::create(tx, model, SetState::Backfill)?),
        })
    }

    /// Queue every document for `stage` (a stage without a vector set, such as `noop`) at
    /// `priority`: new rows pending, existing rows pending again. Returns how many.
    pub fn enqueue_all(&mut self, stage: &str, priority: Priority) -> Result<u64, StoreError> {
        admin::check_queue_all(stage)?;
        self.write(|tx| {
            let now = now_ms();
            let base = next_in(tx, "enrichment_seq")?;
            let n = tx.execute(
                "INSERT INTO enrichment(document_id, stage, vector_set, status, priority, seq,
                                            input_version, enqueued_at, updated_at)
                     SELECT id, ?1, 0, 'pending', ?2, ?3 + ROW_NUMBER() OVER (ORDER BY id),
                            version, ?4, ?4
                     FROM documents WHERE true
                     ON CONFLICT(document_id, stage, vector_set) DO UPDATE SET
                         status = 'pending', priority = excluded.priority, seq = excluded.seq,
                         attempts = 0, not_before = 0, lease_owner = NULL, lease_expires = NULL,
                         input_version = excluded.input_version, claimed_at = NULL,
                         claim_seq = NULL, done_at = NULL, enqueued_at = excluded.enqueued_at,
                         updated_at = excluded.updated_at",
                params![stage, priority.level(), base, now],
            )? as i64;
            advance(tx, "enrichment_seq", n)?;
            Ok(n as u64)
        })
    }

    /// Drop the vector sets a finished migration retired; the models dropped.
    pub fn drop_retired(&mut self) -> Result<Vec<String>, StoreError> {
        self.write(|tx| Ok(sets::drop_retired(tx)?))
    }
}

/// `ids` as a JSON array, for SQL that reads it with `json_each` (as Postgres takes an array).
fn json_array(ids: &[String]) -> String {
    serde_json::to_string(ids).expect("a list of strings serializes")
}

impl crate::indexers::IndexStore for SqliteStore {
    fn describe(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    fn sets(&mut self) -> Result<Vec<VectorSet>, StoreError> {
        SqliteStore::sets(self)
    }

    fn status(&mut self) -> Result<StatusReport, StoreError> {
        SqliteStore::status(self)
    }

    fn dead_letters(&mut self, stage: Option<&str>) -> Result<Vec<DeadLetter>, StoreError> {
        SqliteStore::dead_letters(self, stage)
    }

    fn document_lifecycle(&mut self, id: &str) -> Result<Option<DocumentLifecycle>, StoreError> {
        SqliteStore::document_lifecycle(self, id)
    }

    fn requeue(&mut self, stage: Option<&str>, ids: Option<&[String]>) -> Result<u64, StoreError> {
        SqliteStore::requeue(self, stage, ids)
    }

    fn bury(&mut self, burials: &[Burial]) -> Result<(), StoreError> {
        SqliteStore::bury(self, burials)
    }

    fn buried(&mut self, ids: &[String]) -> Result<Vec<StoredCopy>, StoreError> {
        SqliteStore::buried(self, ids)
    }

    fn unbury(&mut self, ids: &[String]) -> Result<(), StoreError> {
        SqliteStore::unbury(self, ids)
    }

    fn set_paused(&mut self, stage: &str, paused: bool) -> Result<(), StoreError> {
        SqliteStore::set_paused(self, stage, paused)
    }

    fn set_circuit(&mut self, stage: &str, open: Option<&str>) -> Result<(), StoreError> {
        SqliteStore::set_circuit(self, stage, open)
    }

    fn promote(&mut self, ids: &[String]) -> Result<u64, StoreError> {
        SqliteStore::promote(self, ids)
    }

    fn start_backfill(&mut self, model: &ModelIdentity) -> Result<VectorSet, StoreError> {
        SqliteStore::start_backfill(self, model)
    }

    fn enqueue_all(&mut self, stage: &str, priority: Priority) -> Result<u64, StoreError> {
        SqliteStore::enqueue_all(self, stage, priority)
    }

    fn drop_retired(&mut self) -> Result<Vec<String>, StoreError> {
        SqliteStore::drop_retired(self)
    }

    fn unembedded(&mut self) -> Result<(u64, u64), StoreError> {
        SqliteStore::unembedded(self)
    }

    /// Bring the ANN of each live vector set up to date with what the run wrote (a backfill's
    /// new set gets its own).
    fn finish_run(&mut self) -> Result<Vec<String>, StoreError> {
        let mut notes = super::ann::maintain(&self.path, &mut self.conn)
            .map_err(|e| StoreError::Io(e.to_string()))?;
        notes.extend(super::keyword::maintain_noted(&self.path, &mut self.conn));
        Ok(notes)
    }
}

impl StatusSql for Sql<'_> {
    fn documents(&mut self) -> rusqlite::Result<u64> {
        self.0
            .query_row("SELECT COUNT(*) FROM documents", [], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
    }

    fn chunks(&mut self) -> rusqlite::Result<u64> {
        self.0
            .query_row(
                "SELECT COUNT(*) FROM chunks WHERE replaced_by IS NULL",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
    }

    fn vector_sets(&mut self) -> rusqlite::Result<Vec<VectorSet>> {
        sets::all(self.0)
    }

    fn embedded_in(&mut self, set: &VectorSet) -> rusqlite::Result<u64> {
        self.0
            .query_row(
                "SELECT COUNT(*) FROM chunks WHERE replaced_by IS NULL AND embedded & ?1 != 0",
                [set.bit()],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
    }

    fn stage_groups(
        &mut self,
        stage: &str,
        vector_set: i64,
        now: i64,
    ) -> rusqlite::Result<Vec<StatusGroup>> {
        self.0
            .prepare_cached(
                "SELECT status, status = 'in_progress' AND lease_expires < ?3, COUNT(*),
                        MIN(enqueued_at)
                 FROM enrichment WHERE stage = ?1 AND vector_set = ?2
                 GROUP BY 1, 2",
            )?
            .query_map(params![stage, vector_set, now], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect()
    }

    fn document_stages(&mut self) -> rusqlite::Result<Vec<String>> {
        self.0
            .prepare(
                "SELECT DISTINCT stage FROM enrichment WHERE stage NOT IN ('chunk', 'embed')
                 ORDER BY stage",
            )?
            .query_map([], |r| r.get(0))?
            .collect()
    }

    fn waiting_on_dependency(&mut self, stage: &str) -> rusqlite::Result<u64> {
        let sql = format!(
            "SELECT COUNT(*) FROM enrichment e WHERE e.stage = ?1 AND {}",
            crate::indexers::store::waiting_sql("enrichment", "stage_dependencies")
        );
        self.0
            .query_row(&sql, [stage], |r| r.get::<_, i64>(0).map(|n| n as u64))
    }

    fn circuits(&mut self) -> rusqlite::Result<Vec<(String, String, i64)>> {
        self.0
            .prepare(
                "SELECT stage, circuit, COALESCE(circuit_since, 0) FROM stage_control
                 WHERE circuit IS NOT NULL",
            )?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect()
    }

    fn activity(&mut self, since: i64) -> rusqlite::Result<Vec<(i64, u64, u64)>> {
        self.0
            .prepare(&crate::indexers::store::activity_sql(
                "documents",
                "enrichment",
                "?1",
            ))?
            .query_map([since], |r| {
                Ok((
                    r.get(0)?,
                    r.get::<_, i64>(1)?.max(0) as u64,
                    r.get::<_, i64>(2)?.max(0) as u64,
                ))
            })?
            .collect()
    }
}

impl AdminSql for Sql<'_> {
    fn document(&mut self, id: &str) -> rusqlite::Result<Option<(Option<String>, Option<String>)>> {
        self.0
            .query_row(
                "SELECT source, title FROM documents WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
    }

    fn buried_source(&mut self, id: &str) -> rusqlite::Result<Option<Option<String>>> {
        self.0
            .query_row(
                "SELECT source FROM dead_documents WHERE document_id = ?1",
                [id],
                |r| r.get(0),
            )
            .optional()
    }

    fn current_chunks(&mut self, id: &str) -> rusqlite::Result<u64> {
        self.0
            .query_row(
                "SELECT COUNT(*) FROM chunks WHERE document_id = ?1 AND replaced_by IS NULL",
                [id],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
    }

    fn stage_states(&mut self, id: &str) -> rusqlite::Result<Vec<StageState>> {
        self.0
            .prepare(
                "SELECT stage, vector_set, status, priority, attempts, not_before, lease_owner,
                        lease_expires, enqueued_at, claimed_at, claim_seq, done_at
                 FROM enrichment WHERE document_id = ?1 ORDER BY stage = 'embed', stage,
                      vector_set",
            )?
            .query_map([id], |r| {
                Ok(StageState {
                    stage: r.get(0)?,
                    vector_set: r.get(1)?,
                    status: r.get(2)?,
                    priority: Priority::from_level(r.get(3)?).to_string(),
                    attempts: r.get(4)?,
                    not_before: r.get::<_, i64>(5).map(|t| (t > 0).then_some(t))?,
                    lease_owner: r.get(6)?,
                    lease_expires: r.get(7)?,
                    enqueued_at: r.get(8)?,
                    claimed_at: r.get(9)?,
                    claim_seq: r.get(10)?,
                    done_at: r.get(11)?,
                    errors: Vec::new(),
                })
            })?
            .collect()
    }

    fn attempt_errors(
        &mut self,
        id: &str,
        stage: &str,
        vector_set: i64,
    ) -> rusqlite::Result<Vec<AttemptError>> {
        self.0
            .prepare_cached(
                "SELECT attempt, at, worker, message FROM enrichment_errors
                 WHERE document_id = ?1 AND stage = ?2 AND vector_set = ?3
                 ORDER BY at, rowid",
            )?
            .query_map(params![id, stage, vector_set], |r| {
                Ok(AttemptError {
                    attempt: r.get(0)?,
                    at: r.get(1)?,
                    worker: r.get(2)?,
                    message: r.get(3)?,
                })
            })?
            .collect()
    }

    fn set_buried(&mut self, b: &Burial, now: i64) -> rusqlite::Result<()> {
        let seq = next_in(self.0, "enrichment_seq")?;
        self.0
            .prepare_cached(
                "INSERT INTO enrichment(document_id, stage, vector_set, status, priority, seq,
                                        attempts, input_version, enqueued_at, updated_at)
                 VALUES (?1, ?2, 0, 'dead', ?3, ?4, ?5, '', ?6, ?6)
                 ON CONFLICT(document_id, stage, vector_set) DO UPDATE SET
                     status = 'dead', attempts = excluded.attempts, lease_owner = NULL,
                     lease_expires = NULL, not_before = 0, updated_at = excluded.updated_at",
            )?
            .execute(params![
                b.document_id,
                b.stage,
                Priority::Fresh.level(),
                seq,
                b.attempts,
                now
            ])?;
        Ok(())
    }

    fn keep_copy(&mut self, c: &StoredCopy, now: i64) -> rusqlite::Result<()> {
        self.0
            .prepare_cached(
                "INSERT INTO dead_documents(document_id, payload, source, config, buried_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(document_id) DO UPDATE SET payload = excluded.payload,
                     source = excluded.source, config = excluded.config,
                     buried_at = excluded.buried_at",
            )?
            .execute(params![c.document_id, c.payload, c.source, c.config, now])?;
        Ok(())
    }
}
