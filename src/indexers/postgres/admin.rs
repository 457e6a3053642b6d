//! What operators ask of a Postgres index's lifecycle: `ragline status`, the dead-letter queue
//! (`ragline dlq list|show|requeue`), `pause`/`resume`, `promote`, setting up a backfill, and
//! the HNSW index after an enrich run. The same answers as the SQLite index's.

use postgres::GenericClient;

use super::queue::{PgStore, Sql};
use super::{sets, store_error};
use crate::indexers::admin::{self, AdminSql};
use crate::indexers::store::{status_report, StatusSql};
use crate::indexers::{Burial, IndexStore, ModelIdentity, SetState, StoredCopy, VectorSet};
use crate::lifecycle::report::{
    AttemptError, DeadLetter, DocumentLifecycle, StageState, StatusReport,
};
use crate::lifecycle::rules::StatusGroup;
use crate::lifecycle::{Priority, StoreError, EMBED};

impl IndexStore for PgStore {
    fn describe(&self) -> String {
        self.target.to_string()
    }

    fn sets(&mut self) -> Result<Vec<VectorSet>, StoreError> {
        PgStore::sets(self)
    }

    fn status(&mut self) -> Result<StatusReport, StoreError> {
        let s = self.s.clone();
        let index = self.target.to_string();
        let run = |client: &mut postgres::Client| {
            let now = super::server_now(client)?;
            status_report(&mut Sql { c: client, s: &s }, index, now)
        };
        run(&mut self.client).map_err(|e| store_error(&self.target, e))
    }

    fn dead_letters(&mut self, stage: Option<&str>) -> Result<Vec<DeadLetter>, StoreError> {
        let s = self.s.clone();
        let rows = self
            .client
            .query(
                &format!(
                    "SELECT e.document_id, e.stage, e.vector_set, e.attempts, e.updated_at,
                            (SELECT message FROM {s}.enrichment_errors x
                             WHERE x.document_id = e.document_id AND x.stage = e.stage
                               AND x.vector_set = e.vector_set
                             ORDER BY x.at DESC, x.id DESC LIMIT 1)
                     FROM {s}.enrichment e
                     WHERE e.status = 'dead' AND ($1::text IS NULL OR e.stage = $1)
                     ORDER BY e.updated_at, e.document_id"
                ),
                &[&stage],
            )
            .map_err(|e| self.err(e))?;
        Ok(rows
            .iter()
            .map(|r| DeadLetter {
                document_id: r.get(0),
                stage: r.get(1),
                vector_set: r.get::<_, i32>(2) as i64,
                attempts: r.get::<_, i32>(3).max(0) as u32,
                dead_since: r.get(4),
                last_error: r.get(5),
            })
            .collect())
    }

    fn document_lifecycle(&mut self, id: &str) -> Result<Option<DocumentLifecycle>, StoreError> {
        let s = self.s.clone();
        let mut q = Sql {
            c: &mut self.client,
            s: &s,
        };
        admin::document_lifecycle(&mut q, id).map_err(|e| self.err(e))
    }

    fn requeue(&mut self, stage: Option<&str>, ids: Option<&[String]>) -> Result<u64, StoreError> {
        self.write(|tx, s, now| {
            let n = tx.execute(
                &format!(
                    "UPDATE {s}.enrichment SET status = 'pending', attempts = 0, not_before = 0,
                         seq = nextval('{s}.enrichment_seq'), enqueued_at = $3, updated_at = $3
                     WHERE status = 'dead' AND ($1::text IS NULL OR stage = $1)
                       AND ($2::text[] IS NULL OR document_id = ANY($2))"
                ),
                &[&stage, &ids, &now],
            )?;
            Ok(n)
        })
    }

    fn bury(&mut self, burials: &[Burial]) -> Result<(), StoreError> {
        self.write(|tx, s, now| Ok(admin::bury(&mut Sql { c: tx, s }, burials, now)?))
    }

    fn buried(&mut self, ids: &[String]) -> Result<Vec<StoredCopy>, StoreError> {
        let s = self.s.clone();
        let rows = self
            .client
            .query(
                &format!(
                    "SELECT document_id, payload, source, config FROM {s}.dead_documents
                     WHERE document_id = ANY($1::text[]) ORDER BY document_id"
                ),
                &[&ids],
            )
            .map_err(|e| self.err(e))?;
        Ok(rows
            .iter()
            .map(|r| StoredCopy {
                document_id: r.get(0),
                payload: r.get(1),
                source: r.get(2),
                config: r.get(3),
            })
            .collect())
    }

    fn unbury(&mut self, ids: &[String]) -> Result<(), StoreError> {
        self.write(|tx, s, _| {
            tx.execute(
                &format!("DELETE FROM {s}.dead_documents WHERE document_id = ANY($1::text[])"),
                &[&ids],
            )?;
            Ok(())
        })
    }

    fn set_circuit(&mut self, stage: &str, open: Option<&str>) -> Result<(), StoreError> {
        self.write(|tx, s, now| {
            tx.execute(
                &format!(
                    "INSERT INTO {s}.stage_control(stage, paused, changed_at, circuit,
                         circuit_since)
                     VALUES ($1, false, $3, $2, CASE WHEN $2::text IS NULL THEN NULL ELSE $3 END)
                     ON CONFLICT (stage) DO UPDATE SET circuit = excluded.circuit,
                         circuit_since = excluded.circuit_since"
                ),
                &[&stage, &open, &now],
            )?;
            Ok(())
        })
    }

    fn set_paused(&mut self, stage: &str, paused: bool) -> Result<(), StoreError> {
        admin::check_pausable(stage)?;
        self.write(|tx, s, now| {
            tx.execute(
                &format!(
                    "INSERT INTO {s}.stage_control(stage, paused, changed_at) VALUES ($1, $2, $3)
                     ON CONFLICT (stage) DO UPDATE SET paused = excluded.paused,
                         changed_at = excluded.changed_at"
                ),
                &[&stage, &paused, &now],
            )?;
            Ok(())
        })
    }

    fn promote(&mut self, ids: &[String]) -> Result<u64, StoreError> {
        self.write(|tx, s, _| {
            let n = tx.execute(
                &format!(
                    "UPDATE {s}.enrichment SET priority = $2
                     WHERE document_id = ANY($1::text[]) AND stage = '{EMBED}'
                       AND priority < $2 AND status IN ('pending', 'failed')"
                ),
                &[&ids, &(Priority::Interactive.level() as i32)],
            )?;
            Ok(n)
        })
    }

    fn start_backfill(&mut self, model: &ModelIdentity) -> Result<VectorSet, StoreError> {
        let ty = self.vector_type;
        let target = self.target.clone();
        self.write(|tx, s, now| {
            super::lock_schema(tx, &target)?;
            match admin::backfill_start(&sets::all(tx, s)?, model)? {
                Some(set) => Ok(set),
                None => Ok(sets::create(tx, s, ty, model, SetState::Backfill, now)?),
            }
        })
    }

    fn enqueue_all(&mut self, stage: &str, priority: Priority) -> Result<u64, StoreError> {
        admin::check_queue_all(stage)?;
        self.write(|tx, s, now| {
            let n = tx.execute(
                &format!(
                    "INSERT INTO {s}.enrichment AS e (document_id, stage, vector_set, status,
                                 priority, seq, input_version, enqueued_at, updated_at)
                     SELECT id, $1, 0, 'pending', $2, nextval('{s}.enrichment_seq'), version,
                            $3, $3
                     FROM (SELECT id, version FROM {s}.documents ORDER BY id) d
                     ON CONFLICT (document_id, stage, vector_set) DO UPDATE SET
                         status = 'pending', priority = excluded.priority, seq = excluded.seq,
                         attempts = 0, not_before = 0, lease_owner = NULL,
                         lease_expires = NULL, input_version = excluded.input_version,
                         claimed_at = NULL, claim_seq = NULL, done_at = NULL,
                         enqueued_at = excluded.enqueued_at, updated_at = excluded.updated_at"
                ),
                &[&stage, &(priority.level() as i32), &now],
            )?;
            Ok(n)
        })
    }

    fn drop_retired(&mut self) -> Result<Vec<String>, StoreError> {
        self.write(|tx, s, _| Ok(sets::drop_retired(tx, s)?))
    }

    fn unembedded(&mut self) -> Result<(u64, u64), StoreError> {
        let s = self.s.clone();
        unembedded(&mut self.client, &s).map_err(|e| store_error(&self.target, e))
    }

    fn finish_run(&mut self) -> Result<Vec<String>, StoreError> {
        let ty = self.vector_type;
        super::ensure_indexes(&mut self.client, &self.target, ty)
            .map_err(|e| StoreError::Io(e.to_string()))
    }
}

/// (chunks of the active set without a vector, current chunks), from the lifecycle rows.
pub(super) fn unembedded(
    c: &mut impl GenericClient,
    s: &str,
) -> Result<(u64, u64), postgres::Error> {
    let missing: i64 = c
        .query_one(
            &format!(
                "SELECT COALESCE(sum(e.todo_chunks), 0)::bigint FROM {s}.enrichment e
                 JOIN {s}.vector_sets v ON v.id = e.vector_set AND v.state = 'active'
                 WHERE e.stage = '{EMBED}' AND e.status <> 'done'"
            ),
            &[],
        )?
        .get(0);
    if missing == 0 {
        return Ok((0, 0));
    }
    let total: i64 = c
        .query_one(
            &format!("SELECT count(*) FROM {s}.chunks WHERE replaced_by IS NULL"),
            &[],
        )?
        .get(0);
    Ok((missing as u64, total as u64))
}

impl<C: GenericClient> StatusSql for Sql<'_, C> {
    fn documents(&mut self) -> Result<u64, postgres::Error> {
        let s = self.s;
        let sql = format!("SELECT count(*) FROM {s}.documents");
        Ok(self.c.query_one(&sql, &[])?.get::<_, i64>(0) as u64)
    }

    fn chunks(&mut self) -> Result<u64, postgres::Error> {
        let s = self.s;
        let sql = format!("SELECT count(*) FROM {s}.chunks WHERE replaced_by IS NULL");
        Ok(self.c.query_one(&sql, &[])?.get::<_, i64>(0) as u64)
    }

    fn vector_sets(&mut self) -> Result<Vec<VectorSet>, postgres::Error> {
        sets::all(self.c, self.s)
    }

    fn embedded_in(&mut self, set: &VectorSet) -> Result<u64, postgres::Error> {
        let s = self.s;
        let sql = format!(
            "SELECT count(*) FROM {s}.chunks c JOIN {s}.{} v ON v.rowid = c.rowid
             WHERE c.replaced_by IS NULL",
            set.vec_table
        );
        Ok(self.c.query_one(&sql, &[])?.get::<_, i64>(0) as u64)
    }

    fn stage_groups(
        &mut self,
        stage: &str,
        vector_set: i64,
        now: i64,
    ) -> Result<Vec<StatusGroup>, postgres::Error> {
        let s = self.s;
        let rows = self.c.query(
            &format!(
                "SELECT status, status = 'in_progress' AND lease_expires < $3, count(*),
                        MIN(enqueued_at)
                 FROM {s}.enrichment WHERE stage = $1 AND vector_set = $2
                 GROUP BY 1, 2"
            ),
            &[&stage, &(vector_set as i32), &now],
        )?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect())
    }

    fn document_stages(&mut self) -> Result<Vec<String>, postgres::Error> {
        let s = self.s;
        let rows = self.c.query(
            &format!(
                "SELECT DISTINCT stage FROM {s}.enrichment
                 WHERE stage NOT IN ('chunk', 'embed') ORDER BY stage"
            ),
            &[],
        )?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    fn waiting_on_dependency(&mut self, stage: &str) -> Result<u64, postgres::Error> {
        let s = self.s;
        let sql = format!(
            "SELECT COUNT(*) FROM {s}.enrichment e WHERE e.stage = $1 AND {}",
            crate::indexers::store::waiting_sql(
                &format!("{s}.enrichment"),
                &format!("{s}.stage_dependencies")
            )
        );
        Ok(self.c.query_one(&sql, &[&stage])?.get::<_, i64>(0).max(0) as u64)
    }

    fn circuits(&mut self) -> Result<Vec<(String, String, i64)>, postgres::Error> {
        let s = self.s;
        let rows = self.c.query(
            &format!(
                "SELECT stage, circuit, COALESCE(circuit_since, 0) FROM {s}.stage_control
                 WHERE circuit IS NOT NULL"
            ),
            &[],
        )?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
    }

    fn activity(&mut self, since: i64) -> Result<Vec<(i64, u64, u64)>, postgres::Error> {
        let s = self.s;
        let sql = crate::indexers::store::activity_sql(
            &format!("{s}.documents"),
            &format!("{s}.enrichment"),
            "$1",
        );
        // SUM of integers is numeric in PostgreSQL: read as bigint.
        let sql = sql
            .replace(
                "SUM(CASE WHEN e.stage = 'chunk' THEN 1 ELSE 0 END)",
                "SUM(CASE WHEN e.stage = 'chunk' THEN 1 ELSE 0 END)::bigint",
            )
            .replace(
                "SUM(CASE WHEN e.stage = 'embed' THEN d.chunk_count ELSE 0 END)",
                "SUM(CASE WHEN e.stage = 'embed' THEN d.chunk_count ELSE 0 END)::bigint",
            );
        let rows = self.c.query(&sql, &[&since])?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get::<_, i64>(0),
                    r.get::<_, i64>(1).max(0) as u64,
                    r.get::<_, i64>(2).max(0) as u64,
                )
            })
            .collect())
    }
}

impl<C: GenericClient> AdminSql for Sql<'_, C> {
    fn document(
        &mut self,
        id: &str,
    ) -> Result<Option<(Option<String>, Option<String>)>, postgres::Error> {
        let s = self.s;
        let sql = format!("SELECT source, title FROM {s}.documents WHERE id = $1");
        Ok(self
            .c
            .query_opt(&sql, &[&id])?
            .map(|r| (r.get(0), r.get(1))))
    }

    fn buried_source(&mut self, id: &str) -> Result<Option<Option<String>>, postgres::Error> {
        let s = self.s;
        let sql = format!("SELECT source FROM {s}.dead_documents WHERE document_id = $1");
        Ok(self.c.query_opt(&sql, &[&id])?.map(|r| r.get(0)))
    }

    fn current_chunks(&mut self, id: &str) -> Result<u64, postgres::Error> {
        let s = self.s;
        let sql = format!(
            "SELECT count(*) FROM {s}.chunks WHERE document_id = $1 AND replaced_by IS NULL"
        );
        Ok(self.c.query_one(&sql, &[&id])?.get::<_, i64>(0) as u64)
    }

    fn stage_states(&mut self, id: &str) -> Result<Vec<StageState>, postgres::Error> {
        let s = self.s;
        let rows = self.c.query(
            &format!(
                "SELECT stage, vector_set, status, priority, attempts, not_before,
                        lease_owner, lease_expires, enqueued_at, claimed_at, claim_seq,
                        done_at
                 FROM {s}.enrichment WHERE document_id = $1
                 ORDER BY stage = 'embed', stage, vector_set"
            ),
            &[&id],
        )?;
        Ok(rows
            .iter()
            .map(|r| StageState {
                stage: r.get(0),
                vector_set: r.get::<_, i32>(1) as i64,
                status: r.get(2),
                priority: Priority::from_level(r.get::<_, i32>(3) as i64).to_string(),
                attempts: r.get::<_, i32>(4).max(0) as u32,
                not_before: Some(r.get::<_, i64>(5)).filter(|t| *t > 0),
                lease_owner: r.get(6),
                lease_expires: r.get(7),
                enqueued_at: r.get(8),
                claimed_at: r.get(9),
                claim_seq: r.get(10),
                done_at: r.get(11),
                errors: Vec::new(),
            })
            .collect())
    }

    fn attempt_errors(
        &mut self,
        id: &str,
        stage: &str,
        vector_set: i64,
    ) -> Result<Vec<AttemptError>, postgres::Error> {
        let s = self.s;
        let rows = self.c.query(
            &format!(
                "SELECT attempt, at, worker, message FROM {s}.enrichment_errors
                 WHERE document_id = $1 AND stage = $2 AND vector_set = $3
                 ORDER BY at, id"
            ),
            &[&id, &stage, &(vector_set as i32)],
        )?;
        Ok(rows
            .iter()
            .map(|r| AttemptError {
                attempt: r.get::<_, i32>(0).max(0) as u32,
                at: r.get(1),
                worker: r.get(2),
                message: r.get(3),
            })
            .collect())
    }

    fn set_buried(&mut self, b: &Burial, now: i64) -> Result<(), postgres::Error> {
        let s = self.s;
        self.c.execute(
            &format!(
                "INSERT INTO {s}.enrichment(document_id, stage, vector_set, status,
                     priority, seq, attempts, input_version, enqueued_at, updated_at)
                 VALUES ($1, $2, 0, 'dead', $3, nextval('{s}.enrichment_seq'), $4, '', $5, $5)
                 ON CONFLICT (document_id, stage, vector_set) DO UPDATE SET
                     status = 'dead', attempts = excluded.attempts, lease_owner = NULL,
                     lease_expires = NULL, not_before = 0, updated_at = excluded.updated_at"
            ),
            &[
                &b.document_id,
                &b.stage,
                &(Priority::Fresh.level() as i32),
                &(b.attempts as i32),
                &now,
            ],
        )?;
        Ok(())
    }

    fn keep_copy(&mut self, c: &StoredCopy, now: i64) -> Result<(), postgres::Error> {
        let s = self.s;
        self.c.execute(
            &format!(
                "INSERT INTO {s}.dead_documents(document_id, payload, source, config, buried_at)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (document_id) DO UPDATE SET
                     payload = excluded.payload, source = excluded.source,
                     config = excluded.config, buried_at = excluded.buried_at"
            ),
            &[&c.document_id, &c.payload, &c.source, &c.config, &now],
        )?;
        Ok(())
    }
}
