//! The Postgres index as a durable work queue shared by any number of `enrich` processes on
//! any number of machines: a claim locks its rows with `FOR UPDATE SKIP LOCKED` (two workers
//! never wait for each other, and never get the same work unless a lease expired) and leases
//! them in the same transaction; results are written with the status change in one
//! transaction; failures retry with backoff, then go dead. Times are the server's.

use std::collections::BTreeSet;
use std::time::Duration;

use postgres::{Client, GenericClient, Transaction};

use super::target::{PgTarget, VectorType};
use super::{read_meta, server_now, sets, settle, store_error};
use crate::document::InputKey;
use crate::indexers::store::{maintain, BackfillSql};
use crate::indexers::{SetState, VectorSet};
use crate::lifecycle::rules::{self, Candidate, QueueSql};
use crate::lifecycle::store::HeldLease;
use crate::lifecycle::{
    ChunkSparse, ChunkText, ChunkVector, Claim, ClaimRequest, DeliveryFailure, DocumentText,
    EnrichStore, LifecycleStore, Maintenance, PendingChunk, Priority, SparseModelRecord,
    StageSettings, Status, StoreError, WorkKey, CHUNK, EMBED,
};

/// A connection to a Postgres index, for the lifecycle.
pub struct PgStore {
    pub(super) client: Client,
    pub(super) target: PgTarget,
    /// The schema, quoted for SQL.
    pub(super) s: String,
    pub(super) vector_type: VectorType,
}

/// An error inside a write transaction: PostgreSQL's, or the store's own refusal.
pub(super) type TxError = crate::indexers::store::TxError<postgres::Error>;

impl From<postgres::Error> for TxError {
    fn from(e: postgres::Error) -> Self {
        TxError::Sql(e)
    }
}

impl PgStore {
    /// Open an existing index (migrating an older schema).
    pub fn open(target: &PgTarget) -> Result<Self, StoreError> {
        let invalid = |e: crate::indexers::BackendError| StoreError::Invalid(e.to_string());
        let mut client = target.connect().map_err(invalid)?;
        let s = target.schema_sql();
        let Some(meta) = read_meta(&mut client, target).map_err(invalid)? else {
            return Err(StoreError::Invalid(format!(
                "no ragline index in schema `{}` of {target}: run `ragline ingest --index ...` \
                 first, or give the right ?schema=",
                target.schema
            )));
        };
        if meta.schema_version < super::schema::SCHEMA_VERSION {
            let run = |client: &mut Client| -> Result<(), postgres::Error> {
                let mut tx = client.transaction()?;
                super::lock_schema(&mut tx, target)?;
                super::schema::migrate(&mut tx, &s, meta.schema_version)?;
                tx.commit()
            };
            run(&mut client).map_err(|e| store_error(target, e))?;
        }
        Ok(PgStore {
            client,
            target: target.clone(),
            s,
            vector_type: meta.vector_type.unwrap_or(VectorType::Vector),
        })
    }

    pub(super) fn err(&self, e: postgres::Error) -> StoreError {
        store_error(&self.target, e)
    }

    /// Run `f` in a transaction (with the server's time) and commit it.
    pub(super) fn write<T>(
        &mut self,
        f: impl FnOnce(&mut Transaction<'_>, &str, i64) -> Result<T, TxError>,
    ) -> Result<T, StoreError> {
        let s = self.s.clone();
        let run = |client: &mut Client| -> Result<T, TxError> {
            let mut tx = client.transaction()?;
            let now = server_now(&mut tx)?;
            let out = f(&mut tx, &s, now)?;
            tx.commit()?;
            Ok(out)
        };
        run(&mut self.client).map_err(|e| match e {
            TxError::Sql(e) => store_error(&self.target, e),
            TxError::Store(e) => e,
        })
    }

    pub fn sets(&mut self) -> Result<Vec<VectorSet>, StoreError> {
        let s = self.s.clone();
        sets::all(&mut self.client, &s).map_err(|e| self.err(e))
    }

    fn vector_set(&mut self, id: i64) -> Result<VectorSet, StoreError> {
        self.sets()?
            .into_iter()
            .find(|x| x.id == id)
            .ok_or_else(|| StoreError::Invalid(format!("the index has no vector set {id}")))
    }

    /// Whether chunk token ids and input keys mean the same input to `set`'s model.
    fn same_tokenizer(&mut self, set: &VectorSet) -> Result<bool, StoreError> {
        let chunker: Option<String> = self
            .client
            .query_opt(
                &format!(
                    "SELECT value FROM {}.meta WHERE key = 'chunk_tokenizer'",
                    self.s
                ),
                &[],
            )
            .map_err(|e| store_error(&self.target, e))?
            .map(|r| r.get(0));
        Ok(set.tokenizer.is_some() && set.tokenizer == chunker)
    }
}

/// The lifecycle's statements on Postgres ([`rules`] decides), in the schema `s`. Claims
/// lock their rows (`FOR UPDATE SKIP LOCKED`): many workers on many machines claim at once.
pub(super) struct Sql<'a, C: GenericClient> {
    pub(super) c: &'a mut C,
    pub(super) s: &'a str,
}

impl<C: GenericClient> QueueSql for Sql<'_, C> {
    type Error = postgres::Error;
    const ROW_LOCKS: bool = true;

    fn paused_stages(&mut self) -> Result<Vec<String>, postgres::Error> {
        let s = self.s;
        let rows = self.c.query(
            &format!("SELECT stage FROM {s}.stage_control WHERE paused"),
            &[],
        )?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    fn candidates(
        &mut self,
        stage: &str,
        now: i64,
        sets: &[i64],
        limit: usize,
        lock: bool,
    ) -> Result<Vec<Candidate>, postgres::Error> {
        let s = self.s;
        let lock = if lock {
            "FOR UPDATE OF e SKIP LOCKED"
        } else {
            ""
        };
        let sets: Vec<i32> = sets.iter().map(|&v| v as i32).collect();
        let rows = self.c.query(
            &format!(
                "SELECT e.id, e.document_id, e.vector_set, e.attempts, e.priority, e.seq,
                        e.input_version, e.todo_tokens, e.status, e.lease_owner
                 FROM {s}.enrichment e
                 WHERE e.stage = $1 AND e.status IN ('pending', 'failed', 'in_progress')
                   AND ((e.status <> 'in_progress' AND e.not_before <= $2)
                        OR (e.status = 'in_progress' AND e.lease_expires < $2))
                   AND (cardinality($3::int[]) = 0 OR e.vector_set = ANY($3::int[]))
                   AND EXISTS (SELECT 1 FROM {s}.enrichment c
                               WHERE c.document_id = e.document_id AND c.stage = '{CHUNK}'
                                 AND c.vector_set = 0 AND c.status = 'done'
                                 AND c.input_version = e.input_version)
                   AND NOT EXISTS (SELECT 1 FROM {s}.stage_dependencies sd
                                   WHERE sd.stage = e.stage
                                     AND NOT EXISTS (
                                         SELECT 1 FROM {s}.enrichment c
                                         WHERE c.document_id = e.document_id
                                           AND c.stage = sd.depends_on AND c.status = 'done'
                                           AND c.input_version = e.input_version))
                 ORDER BY e.priority DESC, e.seq
                 LIMIT $4 {lock}"
            ),
            &[&stage, &now, &sets, &(limit as i64)],
        )?;
        Ok(rows
            .iter()
            .map(|r| {
                let status: String = r.get(8);
                Candidate {
                    id: r.get(0),
                    key: WorkKey {
                        document_id: r.get(1),
                        stage: stage.to_string(),
                        vector_set: r.get::<_, i32>(2) as i64,
                    },
                    attempts: r.get::<_, i32>(3).max(0) as u32,
                    priority: r.get::<_, i32>(4) as i64,
                    seq: r.get(5),
                    input_version: r.get(6),
                    cost: r.get::<_, i64>(7).max(0) as u64,
                    expired_owner: (status == "in_progress")
                        .then(|| r.get::<_, Option<String>>(9).unwrap_or_default()),
                }
            })
            .collect())
    }

    fn next_due(&mut self, now: i64) -> Result<Option<i64>, postgres::Error> {
        let s = self.s;
        Ok(self
            .c
            .query_one(
                &format!(
                    "SELECT MIN(not_before) FROM {s}.enrichment
                     WHERE status = 'failed' AND not_before > $1"
                ),
                &[&now],
            )?
            .get(0))
    }

    fn paused_with_work(&mut self) -> Result<bool, postgres::Error> {
        let s = self.s;
        Ok(self
            .c
            .query_one(
                &format!(
                    "SELECT EXISTS(SELECT 1 FROM {s}.enrichment e
                         JOIN {s}.stage_control c ON c.stage = e.stage AND c.paused
                     WHERE e.status IN ('pending', 'failed', 'in_progress'))"
                ),
                &[],
            )?
            .get(0))
    }

    fn claim_seqs(&mut self, n: usize) -> Result<Vec<i64>, postgres::Error> {
        let s = self.s;
        let rows = self.c.query(
            &format!("SELECT nextval('{s}.claim_seq') FROM generate_series(1, $1)"),
            &[&(n as i32)],
        )?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    fn lease(
        &mut self,
        rows: &[(i64, i64)],
        owner: &str,
        expires: i64,
        now: i64,
    ) -> Result<(), postgres::Error> {
        let s = self.s;
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let seqs: Vec<i64> = rows.iter().map(|r| r.1).collect();
        self.c.execute(
            &format!(
                "UPDATE {s}.enrichment e SET status = 'in_progress',
                     attempts = e.attempts + 1, lease_owner = $3, lease_expires = $4,
                     claimed_at = $5, claim_seq = x.seq, updated_at = $5
                 FROM unnest($1::bigint[], $2::bigint[]) AS x(id, seq) WHERE e.id = x.id"
            ),
            &[&ids, &seqs, &owner, &expires, &now],
        )?;
        Ok(())
    }

    fn held(&mut self, owner: &str, key: &WorkKey) -> Result<Option<(i64, u32)>, postgres::Error> {
        let s = self.s;
        let row = self.c.query_opt(
            &format!(
                "SELECT id, attempts FROM {s}.enrichment
                 WHERE document_id = $1 AND stage = $2 AND vector_set = $3
                   AND status = 'in_progress' AND lease_owner = $4
                 FOR UPDATE"
            ),
            &[
                &key.document_id,
                &key.stage,
                &(key.vector_set as i32),
                &owner,
            ],
        )?;
        Ok(row.map(|r| (r.get(0), r.get::<_, i32>(1).max(0) as u32)))
    }

    fn record_error(
        &mut self,
        key: &WorkKey,
        attempt: u32,
        worker: &str,
        message: &str,
        now: i64,
    ) -> Result<(), postgres::Error> {
        let s = self.s;
        self.c.execute(
            &format!(
                "INSERT INTO {s}.enrichment_errors(document_id, stage, vector_set, attempt, at,
                                                   worker, message)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)"
            ),
            &[
                &key.document_id,
                &key.stage,
                &(key.vector_set as i32),
                &(attempt as i32),
                &now,
                &worker,
                &message,
            ],
        )?;
        Ok(())
    }

    fn set_dead(&mut self, id: i64, now: i64) -> Result<(), postgres::Error> {
        let s = self.s;
        self.c.execute(
            &format!(
                "UPDATE {s}.enrichment SET status = 'dead', lease_owner = NULL,
                     lease_expires = NULL, not_before = 0, updated_at = $2
                 WHERE id = $1"
            ),
            &[&id, &now],
        )?;
        Ok(())
    }

    fn set_failed(&mut self, id: i64, not_before: i64, now: i64) -> Result<(), postgres::Error> {
        let s = self.s;
        self.c.execute(
            &format!(
                "UPDATE {s}.enrichment SET status = 'failed', not_before = $2,
                     lease_owner = NULL, lease_expires = NULL, updated_at = $3
                 WHERE id = $1"
            ),
            &[&id, &not_before, &now],
        )?;
        Ok(())
    }

    fn note_delivery(
        &mut self,
        id: i64,
        attempt: u32,
        lease_expires: i64,
        now: i64,
    ) -> Result<(), postgres::Error> {
        let s = self.s;
        self.c.execute(
            &format!(
                "UPDATE {s}.enrichment SET attempts = GREATEST(attempts, $2),
                     lease_expires = $3, updated_at = $4
                 WHERE id = $1"
            ),
            &[&id, &(attempt as i32), &lease_expires, &now],
        )?;
        Ok(())
    }

    fn lease_owners(&mut self) -> Result<Vec<String>, postgres::Error> {
        let s = self.s;
        let rows = self.c.query(
            &format!(
                "SELECT DISTINCT lease_owner FROM {s}.enrichment
                 WHERE status = 'in_progress' AND lease_owner IS NOT NULL"
            ),
            &[],
        )?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    fn leases_of(&mut self, owner: &str) -> Result<Vec<(i64, WorkKey, u32)>, postgres::Error> {
        let s = self.s;
        let rows = self.c.query(
            &format!(
                "SELECT id, document_id, stage, vector_set, attempts FROM {s}.enrichment
                 WHERE status = 'in_progress' AND lease_owner = $1 FOR UPDATE"
            ),
            &[&owner],
        )?;
        Ok(rows
            .iter()
            .map(|r| {
                let key = WorkKey {
                    document_id: r.get(1),
                    stage: r.get(2),
                    vector_set: r.get::<_, i32>(3) as i64,
                };
                (r.get(0), key, r.get::<_, i32>(4).max(0) as u32)
            })
            .collect())
    }
}

/// The keys as three parallel arrays, for `unnest`.
fn key_arrays(keys: &[WorkKey]) -> (Vec<&str>, Vec<&str>, Vec<i32>) {
    (
        keys.iter().map(|k| k.document_id.as_str()).collect(),
        keys.iter().map(|k| k.stage.as_str()).collect(),
        keys.iter().map(|k| k.vector_set as i32).collect(),
    )
}

/// Rows of `keys` whose lease `$4` holds (SQL over `enrichment e`, after `SET ...`).
const HELD: &str =
    "FROM unnest($1::text[], $2::text[], $3::int[]) AS k(document_id, stage, vector_set)
     WHERE e.document_id = k.document_id AND e.stage = k.stage AND e.vector_set = k.vector_set
       AND e.status = 'in_progress' AND e.lease_owner = $4";

impl LifecycleStore for PgStore {
    fn claim(&mut self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        crate::lifecycle::store::claim_with_retries(|| {
            self.write(|tx, s, now| {
                rules::claim(&mut Sql { c: tx, s }, req, now).map_err(Into::into)
            })
        })
    }

    fn renew(&mut self, owner: &str, keys: &[WorkKey], lease: Duration) -> Result<(), StoreError> {
        let (docs, stages, vsets) = key_arrays(keys);
        self.write(|tx, s, now| {
            let expires = now + lease.as_millis() as i64;
            tx.execute(
                &format!("UPDATE {s}.enrichment e SET lease_expires = $5 {HELD}"),
                &[&docs, &stages, &vsets, &owner, &expires],
            )?;
            Ok(())
        })
    }

    fn fail(
        &mut self,
        owner: &str,
        failures: &[(WorkKey, String)],
        settings: &StageSettings,
    ) -> Result<Vec<Status>, StoreError> {
        self.write(|tx, s, now| {
            rules::fail(&mut Sql { c: tx, s }, owner, failures, settings, now).map_err(Into::into)
        })
    }

    fn fail_deliveries(
        &mut self,
        owner: &str,
        failures: &[DeliveryFailure],
        lease: Duration,
    ) -> Result<Vec<Status>, StoreError> {
        let lease_ms = lease.as_millis() as i64;
        self.write(|tx, s, now| {
            rules::fail_deliveries(&mut Sql { c: tx, s }, owner, failures, lease_ms, now)
                .map_err(Into::into)
        })
    }

    fn complete(&mut self, owner: &str, keys: &[WorkKey]) -> Result<(), StoreError> {
        let (docs, stages, vsets) = key_arrays(keys);
        self.write(|tx, s, now| {
            tx.execute(
                &format!(
                    "UPDATE {s}.enrichment e SET status = 'done', lease_owner = NULL,
                         lease_expires = NULL, done_at = $5, updated_at = $5 {HELD}"
                ),
                &[&docs, &stages, &vsets, &owner, &now],
            )?;
            Ok(())
        })
    }

    fn release(&mut self, owner: &str, keys: &[WorkKey]) -> Result<(), StoreError> {
        let (docs, stages, vsets) = key_arrays(keys);
        self.write(|tx, s, _| {
            tx.execute(
                &format!(
                    "UPDATE {s}.enrichment e SET status = 'pending',
                         attempts = GREATEST(e.attempts - 1, 0), lease_owner = NULL,
                         lease_expires = NULL {HELD}"
                ),
                &[&docs, &stages, &vsets, &owner],
            )?;
            Ok(())
        })
    }

    fn maintain(&mut self) -> Result<Maintenance, StoreError> {
        let (target, ty) = (self.target.clone(), self.vector_type);
        self.write(|tx, s, now| {
            let mut q = Backfill {
                sql: Sql { c: tx, s },
                target: &target,
                ty,
            };
            maintain(&mut q, now).map_err(Into::into)
        })
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
        let s = self.s.clone();
        Ok(self
            .client
            .query(
                &format!(
                    "SELECT lease_owner, COUNT(*), MAX(lease_expires) FROM {s}.enrichment
                     WHERE status = 'in_progress' AND lease_owner IS NOT NULL
                     GROUP BY lease_owner ORDER BY lease_owner"
                ),
                &[],
            )
            .map_err(|e| store_error(&self.target, e))?
            .iter()
            .map(|r| HeldLease {
                owner: r.get(0),
                items: r.get::<_, i64>(1).max(0) as u64,
                until_ms: r.get::<_, Option<i64>>(2).unwrap_or(0),
            })
            .collect())
    }

    fn reap_dead_owners(&mut self) -> Result<usize, StoreError> {
        let s = self.s.clone();
        let dead = rules::dead_owners(&mut Sql {
            c: &mut self.client,
            s: &s,
        })
        .map_err(|e| store_error(&self.target, e))?;
        if dead.is_empty() {
            return Ok(0);
        }
        self.write(|tx, s, now| rules::reap(&mut Sql { c: tx, s }, &dead, now).map_err(Into::into))
    }
}

impl EnrichStore for PgStore {
    fn pending_chunks(&mut self, key: &WorkKey) -> Result<Vec<PendingChunk>, StoreError> {
        let set = self.vector_set(key.vector_set)?;
        let ids_usable = self.same_tokenizer(&set)?;
        let s = self.s.clone();
        let rows = self
            .client
            .query(
                &format!(
                    "SELECT c.rowid, c.id, c.input_key, t.token_ids, c.text
                     FROM {s}.chunks c LEFT JOIN {s}.chunk_tokens t ON t.rowid = c.rowid
                     WHERE c.document_id = $1 AND c.replaced_by IS NULL AND NOT {}
                     ORDER BY c.ordinal",
                    sets::has_vector(&s, &set)
                ),
                &[&key.document_id],
            )
            .map_err(|e| store_error(&self.target, e))?;
        Ok(rows
            .iter()
            .map(|r| {
                let input_key: Option<Vec<u8>> = r.get(2);
                let ids: Option<Vec<u8>> = r.get(3);
                PendingChunk {
                    rowid: r.get(0),
                    chunk_id: r.get(1),
                    document_id: key.document_id.clone(),
                    input_key: input_key.and_then(|k| k.try_into().ok()),
                    token_ids: ids
                        .filter(|_| ids_usable)
                        .map(|b| crate::tokens::ids_from_bytes(&b)),
                    text: r.get(4),
                }
            })
            .collect())
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
        let s = self.s.clone();
        super::stored_vector(&mut self.client, &s, &set, key)
            .map_err(|e| store_error(&self.target, e))
    }

    fn write_vectors(
        &mut self,
        vector_set: i64,
        vectors: &[ChunkVector],
        documents: &[String],
    ) -> Result<usize, StoreError> {
        let ty = self.vector_type;
        self.write(|tx, s, now| {
            let all = sets::all(tx, s)?;
            let set = checked_set(&all, vector_set, vectors)?;
            let written = insert_vectors(tx, s, &set, ty, vectors)?;
            forget_embedded(tx, s, &all, &set, &written)?;
            // Every document a vector lands in is settled: its work left shrinks, and it is
            // done when its last chunk has a vector.
            let touched: BTreeSet<String> = documents
                .iter()
                .cloned()
                .chain(written.iter().map(|w| w.1.clone()))
                .collect();
            let touched: Vec<String> = touched.into_iter().collect();
            settle::settle(tx, s, &touched, &all, Priority::Fresh, now)?;
            Ok(written.len())
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

/// The vector set `vector_set` of `all`, which every one of `vectors` must fit.
fn checked_set(
    all: &[VectorSet],
    vector_set: i64,
    vectors: &[ChunkVector],
) -> Result<VectorSet, TxError> {
    let set = all
        .iter()
        .find(|x| x.id == vector_set)
        .cloned()
        .ok_or_else(|| TxError::invalid(format!("the index has no vector set {vector_set}")))?;
    if let Some(v) = vectors.iter().find(|v| v.vector.len() != set.dimension) {
        return Err(TxError::invalid(format!(
            "a vector of {} dimensions for vector set {} of {}: this is a bug",
            v.vector.len(),
            set.id,
            set.dimension
        )));
    }
    Ok(set)
}

/// Store `vectors` in `set`'s table (as `ty`), and return the chunks written: rowid,
/// document id, chunk id.
fn insert_vectors(
    tx: &mut Transaction<'_>,
    s: &str,
    set: &VectorSet,
    ty: VectorType,
    vectors: &[ChunkVector],
) -> Result<Vec<(i64, String, String)>, TxError> {
    let rowids: Vec<i64> = vectors.iter().map(|v| v.rowid).collect();
    let guards: Vec<Option<&[u8]>> = vectors
        .iter()
        .map(|v| v.guard.as_ref().map(|k| k.as_slice()))
        .collect();
    let values: Vec<pgvector::Vector> = vectors
        .iter()
        .map(|v| pgvector::Vector::from(v.vector.clone()))
        .collect();
    let cast = match ty {
        VectorType::Halfvec => format!("::halfvec({})", set.dimension),
        VectorType::Vector => String::new(),
    };
    // Only for chunks that still have the input the vector was computed from (not
    // replaced by other text meanwhile).
    Ok(tx
        .query(
            &format!(
                "WITH w AS (
                     INSERT INTO {s}.{table} (rowid, embedding)
                     SELECT c.rowid, x.embedding{cast}
                     FROM unnest($1::bigint[], $2::vector[], $3::bytea[])
                          AS x(rowid, embedding, guard)
                     JOIN {s}.chunks c ON c.rowid = x.rowid
                     WHERE c.replaced_by IS NULL
                       AND c.input_key IS NOT DISTINCT FROM x.guard
                     ORDER BY c.rowid
                     ON CONFLICT (rowid) DO UPDATE SET embedding = excluded.embedding
                     RETURNING rowid)
                 SELECT c.rowid, c.document_id, c.id
                 FROM w JOIN {s}.chunks c ON c.rowid = w.rowid",
                table = set.vec_table
            ),
            &[&rowids, &values, &guards],
        )?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// After `written` landed in `set`: drop the token ids no live set needs any more, and, when
/// `set` is active, the chunks the written ones replace.
fn forget_embedded(
    tx: &mut Transaction<'_>,
    s: &str,
    all: &[VectorSet],
    set: &VectorSet,
    written: &[(i64, String, String)],
) -> Result<(), TxError> {
    let done: Vec<i64> = written.iter().map(|w| w.0).collect();
    // Token ids go once every live set has the chunk's vector (this one counts: its
    // rows are visible to the next statement).
    tx.execute(
        &format!(
            "DELETE FROM {s}.chunk_tokens t USING {s}.chunks c
             WHERE t.rowid = c.rowid AND c.rowid = ANY($1::bigint[]) AND {}",
            sets::in_every_live_set(s, all)
        ),
        &[&done],
    )?;
    if set.state == SetState::Active && !written.is_empty() {
        let docs: Vec<&str> = written.iter().map(|w| w.1.as_str()).collect();
        let ids: Vec<&str> = written.iter().map(|w| w.2.as_str()).collect();
        tx.query_one(
            &sets::delete_chunks(
                s,
                all,
                "unnest($1::text[], $2::text[]) AS w(document_id, id)",
                "c.document_id = w.document_id AND c.replaced_by = w.id",
            ),
            &[&docs, &ids],
        )?;
    }
    Ok(())
}

/// A backfill's statements on Postgres: the schema lock first (two workers never switch at
/// once), and a set's HNSW index built before search switches to it, in the same transaction.
struct Backfill<'a, C: GenericClient> {
    sql: Sql<'a, C>,
    target: &'a PgTarget,
    ty: VectorType,
}

impl<C: GenericClient> BackfillSql for Backfill<'_, C> {
    type Error = postgres::Error;

    fn sets_locked(&mut self) -> Result<Vec<VectorSet>, postgres::Error> {
        super::lock_schema(self.sql.c, self.target)?;
        sets::all(self.sql.c, self.sql.s)
    }

    fn documents_after(&mut self, after: &str, n: usize) -> Result<Vec<String>, postgres::Error> {
        let s = self.sql.s;
        let rows = self.sql.c.query(
            &format!("SELECT id FROM {s}.documents WHERE id > $1 ORDER BY id LIMIT $2"),
            &[&after, &(n as i64)],
        )?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    fn queue(
        &mut self,
        ids: &[String],
        all: &[VectorSet],
        priority: Priority,
        now: i64,
    ) -> Result<(), postgres::Error> {
        settle::settle(self.sql.c, self.sql.s, ids, all, priority, now)
    }

    fn set_watermark(
        &mut self,
        set: i64,
        last: Option<&str>,
        done: bool,
    ) -> Result<(), postgres::Error> {
        let s = self.sql.s;
        self.sql.c.execute(
            &format!(
                "UPDATE {s}.vector_sets SET watermark = COALESCE($2, watermark),
                     backfill_done = $3 WHERE id = $1"
            ),
            &[&(set as i32), &last, &done],
        )?;
        Ok(())
    }

    fn unembedded_in(&mut self, set: &VectorSet) -> Result<u64, postgres::Error> {
        let s = self.sql.s;
        let n: i64 = self
            .sql
            .c
            .query_one(
                &format!(
                    "SELECT count(*) FROM {s}.chunks c WHERE c.replaced_by IS NULL AND NOT {}",
                    sets::has_vector(s, set)
                ),
                &[],
            )?
            .get(0);
        Ok(n as u64)
    }

    fn open_work(&mut self, set: i64) -> Result<Vec<(String, i64)>, postgres::Error> {
        let s = self.sql.s;
        let rows = self.sql.c.query(
            &format!(
                "SELECT status, count(*) FROM {s}.enrichment
                 WHERE stage = '{EMBED}' AND vector_set = $1 AND status <> 'done'
                 GROUP BY status"
            ),
            &[&(set as i32)],
        )?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    fn switch_to(&mut self, set: &VectorSet, now: i64) -> Result<(), postgres::Error> {
        super::build_hnsw(self.sql.c, self.target, self.ty, set)?;
        sets::switch_to(self.sql.c, self.sql.s, set, now)
    }
}
