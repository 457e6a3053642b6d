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
use crate::indexers::{SetState, VectorSet};
use crate::lifecycle::backoff::{jitter_unit, retry_delay};
use crate::lifecycle::owner::is_dead_here;
use crate::lifecycle::store::HeldLease;
use crate::lifecycle::{
    ChunkVector, Claim, ClaimRequest, DeliveryFailure, DocumentText, EnrichStore, LifecycleStore,
    Maintenance, PendingChunk, Priority, StageSettings, Status, StoreError, WorkItem, WorkKey,
    CHUNK, EMBED,
};

/// Documents queued per backfill page.
pub const BACKFILL_PAGE: usize = 512;

/// A connection to a Postgres index, for the lifecycle.
pub struct PgStore {
    pub(super) client: Client,
    pub(super) target: PgTarget,
    /// The schema, quoted for SQL.
    pub(super) s: String,
    pub(super) vector_type: VectorType,
}

/// An error inside a write transaction: PostgreSQL's, or the store's own refusal.
pub(super) enum TxError {
    Sql(postgres::Error),
    Store(StoreError),
}

impl From<postgres::Error> for TxError {
    fn from(e: postgres::Error) -> Self {
        TxError::Sql(e)
    }
}

impl TxError {
    pub(super) fn invalid(message: String) -> Self {
        TxError::Store(StoreError::Invalid(message))
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

    /// Queue the next page of a backfill, or switch search to a backfilled set once every
    /// chunk has its vector (building its HNSW index first, in the same transaction).
    fn maintain_sets(&mut self) -> Result<Maintenance, StoreError> {
        let (target, ty) = (self.target.clone(), self.vector_type);
        self.write(|tx, s, now| {
            super::lock_schema(tx, &target)?;
            let all = sets::all(tx, s)?;
            let Some(set) = all.iter().find(|x| x.state == SetState::Backfill).cloned() else {
                return Ok(Maintenance::Nothing);
            };
            if !set.backfill_done {
                let ids: Vec<String> = tx
                    .query(
                        &format!("SELECT id FROM {s}.documents WHERE id > $1 ORDER BY id LIMIT $2"),
                        &[
                            &set.watermark.clone().unwrap_or_default(),
                            &(BACKFILL_PAGE as i64),
                        ],
                    )?
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                settle::settle(tx, s, &ids, &all, Priority::Backfill, now)?;
                tx.execute(
                    &format!(
                        "UPDATE {s}.vector_sets SET watermark = COALESCE($2, watermark),
                             backfill_done = $3 WHERE id = $1"
                    ),
                    &[&(set.id as i32), &ids.last(), &(ids.len() < BACKFILL_PAGE)],
                )?;
                return Ok(Maintenance::Queued {
                    set: set.id,
                    documents: ids.len(),
                });
            }
            let missing: i64 = tx
                .query_one(
                    &format!(
                        "SELECT count(*) FROM {s}.chunks c
                         WHERE c.replaced_by IS NULL AND NOT {}",
                        sets::has_vector(s, &set)
                    ),
                    &[],
                )?
                .get(0);
            let open: Vec<(String, i64)> = tx
                .query(
                    &format!(
                        "SELECT status, count(*) FROM {s}.enrichment
                         WHERE stage = '{EMBED}' AND vector_set = $1 AND status <> 'done'
                         GROUP BY status"
                    ),
                    &[&(set.id as i32)],
                )?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            if missing == 0 && open.is_empty() {
                super::build_hnsw(tx, &target, ty, &set)?;
                sets::switch_to(tx, s, &set, now)?;
                return Ok(Maintenance::Switched {
                    set: set.id,
                    model: set.model,
                });
            }
            let dead = open
                .iter()
                .find(|(st, _)| st == "dead")
                .map_or(0, |(_, n)| *n as u64);
            if open.iter().all(|(st, _)| st == "dead") && dead > 0 {
                return Ok(Maintenance::Blocked { set: set.id, dead });
            }
            Ok(Maintenance::Nothing)
        })
    }

    fn claim_once(&mut self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        self.write(|tx, s, now| {
            let wanted: Vec<String> = if req.stages.is_empty() {
                vec![EMBED.to_string()]
            } else {
                req.stages.clone()
            };
            let paused: Vec<String> = tx
                .query(
                    &format!("SELECT stage FROM {s}.stage_control WHERE paused"),
                    &[],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let sets_wanted: Vec<i32> = req.vector_sets.iter().map(|&v| v as i32).collect();
            let mut best: Vec<Candidate> = Vec::new();
            let mut any_paused = false;
            for stage in &wanted {
                if paused.contains(stage) {
                    any_paused = true;
                    continue;
                }
                let rows =
                    candidates(tx, s, stage, now, &sets_wanted, req.max_items.max(1), false)?;
                let better = match (best.first(), rows.first()) {
                    (_, None) => false,
                    (None, Some(_)) => true,
                    (Some(b), Some(r)) => (r.priority, -r.seq) > (b.priority, -b.seq),
                };
                if better {
                    best = rows;
                }
            }
            let Some(first) = best.first() else {
                let next_due: Option<i64> = tx
                    .query_one(
                        &format!(
                            "SELECT MIN(not_before) FROM {s}.enrichment
                             WHERE status = 'failed' AND not_before > $1"
                        ),
                        &[&now],
                    )?
                    .get(0);
                let paused_with_work = any_paused
                    && tx
                        .query_one(
                            &format!(
                                "SELECT EXISTS(SELECT 1 FROM {s}.enrichment e
                                     JOIN {s}.stage_control c ON c.stage = e.stage AND c.paused
                                 WHERE e.status IN ('pending', 'failed', 'in_progress'))"
                            ),
                            &[],
                        )?
                        .get::<_, bool>(0);
                return Ok(Claim::Idle {
                    paused: paused_with_work,
                    next_due,
                });
            };
            let group = (first.key.stage.clone(), first.key.vector_set);
            let wanted = pick(best, &group, req).len();
            // Lock what a claim of this size takes, skipping rows another claim is taking
            // right now (read without locks above, so that a claim locks no more than it
            // takes and a second worker finds the rest).
            let locked = candidates(tx, s, &group.0, now, &[group.1 as i32], wanted, true)?;
            if locked.is_empty() {
                return Ok(Claim::Items(Vec::new()));
            }
            let picked = pick(locked, &group, req);
            let mut claimed = Vec::with_capacity(picked.len());
            for c in picked {
                if let Some(holder) = &c.expired_owner {
                    record_error(
                        tx,
                        s,
                        &c.key,
                        c.attempts,
                        holder,
                        &format!(
                            "lease of {holder} expired before it finished (worker killed or \
                             stalled)"
                        ),
                        now,
                    )?;
                }
                if c.attempts >= req.retry_limit {
                    // It was claimed as often as the stage allows and never finished.
                    set_dead(tx, s, c.id, now)?;
                    continue;
                }
                claimed.push(c);
            }
            if claimed.is_empty() {
                return Ok(Claim::Items(Vec::new()));
            }
            // Claim order: one number per item, in the order they were picked.
            let seqs: Vec<i64> = tx
                .query(
                    &format!("SELECT nextval('{s}.claim_seq') FROM generate_series(1, $1)"),
                    &[&(claimed.len() as i32)],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let ids: Vec<i64> = claimed.iter().map(|c| c.id).collect();
            let expires = now + req.lease.as_millis() as i64;
            tx.execute(
                &format!(
                    "UPDATE {s}.enrichment e SET status = 'in_progress',
                         attempts = e.attempts + 1, lease_owner = $3, lease_expires = $4,
                         claimed_at = $5, claim_seq = x.seq, updated_at = $5
                     FROM unnest($1::bigint[], $2::bigint[]) AS x(id, seq) WHERE e.id = x.id"
                ),
                &[&ids, &seqs, &req.owner, &expires, &now],
            )?;
            Ok(Claim::Items(
                claimed
                    .into_iter()
                    .zip(seqs)
                    .map(|(c, claim_seq)| WorkItem {
                        key: c.key,
                        attempts: c.attempts + 1,
                        priority: Priority::from_level(c.priority),
                        input_version: c.input_version,
                        claim_seq,
                        cost: c.cost,
                    })
                    .collect(),
            ))
        })
    }
}

/// The first candidates of `group` that fit a claim: the first whatever its cost, then as many
/// as `max_cost` and `max_items` allow.
fn pick(rows: Vec<Candidate>, group: &(String, i64), req: &ClaimRequest) -> Vec<Candidate> {
    let mut picked: Vec<Candidate> = Vec::new();
    let mut cost = 0u64;
    for c in rows {
        if (&c.key.stage, c.key.vector_set) != (&group.0, group.1) {
            continue;
        }
        if !picked.is_empty() && cost + c.cost > req.max_cost {
            break;
        }
        cost += c.cost;
        picked.push(c);
        if picked.len() >= req.max_items {
            break;
        }
    }
    picked
}

struct Candidate {
    id: i64,
    key: WorkKey,
    attempts: u32,
    priority: i64,
    seq: i64,
    input_version: String,
    cost: u64,
    /// Set when the item's lease expired: whose it was.
    expired_owner: Option<String>,
}

/// Claimable rows of `stage`, best first; with `lock`, locked, skipping rows another
/// transaction holds.
fn candidates(
    tx: &mut Transaction<'_>,
    s: &str,
    stage: &str,
    now: i64,
    sets_wanted: &[i32],
    limit: usize,
    lock: bool,
) -> Result<Vec<Candidate>, postgres::Error> {
    let lock = if lock {
        "FOR UPDATE OF e SKIP LOCKED"
    } else {
        ""
    };
    let rows = tx.query(
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
             ORDER BY e.priority DESC, e.seq
             LIMIT $4 {lock}"
        ),
        &[&stage, &now, &sets_wanted, &(limit as i64)],
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

pub(super) fn record_error(
    tx: &mut impl GenericClient,
    s: &str,
    key: &WorkKey,
    attempt: u32,
    worker: &str,
    message: &str,
    now: i64,
) -> Result<(), postgres::Error> {
    tx.execute(
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

fn set_dead(
    tx: &mut impl GenericClient,
    s: &str,
    id: i64,
    now: i64,
) -> Result<(), postgres::Error> {
    tx.execute(
        &format!(
            "UPDATE {s}.enrichment SET status = 'dead', lease_owner = NULL, lease_expires = NULL,
                 not_before = 0, updated_at = $2
             WHERE id = $1"
        ),
        &[&id, &now],
    )?;
    Ok(())
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
        crate::lifecycle::store::claim_with_retries(|| self.claim_once(req))
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
            let mut out = Vec::with_capacity(failures.len());
            for (key, message) in failures {
                let held = tx.query_opt(
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
                let Some(row) = held else {
                    // The lease was lost (expired and taken, or the document changed): the
                    // attempt's result is void, and so is its failure.
                    out.push(Status::InProgress);
                    continue;
                };
                let (id, attempts): (i64, i32) = (row.get(0), row.get(1));
                let attempts = attempts.max(0) as u32;
                record_error(tx, s, key, attempts, owner, message, now)?;
                if attempts >= settings.retry_limit {
                    set_dead(tx, s, id, now)?;
                    out.push(Status::Dead);
                } else {
                    let wait = retry_delay(
                        attempts,
                        settings.backoff,
                        settings.max_backoff,
                        jitter_unit(&key.document_id),
                    );
                    tx.execute(
                        &format!(
                            "UPDATE {s}.enrichment SET status = 'failed', not_before = $2,
                                 lease_owner = NULL, lease_expires = NULL, updated_at = $3
                             WHERE id = $1"
                        ),
                        &[&id, &(now + wait.as_millis() as i64), &now],
                    )?;
                    out.push(Status::Failed);
                }
            }
            Ok(out)
        })
    }

    fn fail_deliveries(
        &mut self,
        owner: &str,
        failures: &[DeliveryFailure],
        lease: Duration,
    ) -> Result<Vec<Status>, StoreError> {
        self.write(|tx, s, now| {
            let mut out = Vec::with_capacity(failures.len());
            for f in failures {
                let held = tx.query_opt(
                    &format!(
                        "SELECT id FROM {s}.enrichment
                         WHERE document_id = $1 AND stage = $2 AND vector_set = $3
                           AND status = 'in_progress' AND lease_owner = $4
                         FOR UPDATE"
                    ),
                    &[
                        &f.key.document_id,
                        &f.key.stage,
                        &(f.key.vector_set as i32),
                        &owner,
                    ],
                )?;
                let Some(row) = held else {
                    out.push(Status::InProgress);
                    continue;
                };
                let id: i64 = row.get(0);
                record_error(tx, s, &f.key, f.attempt, &f.worker, &f.message, now)?;
                tx.execute(
                    &format!(
                        "UPDATE {s}.enrichment SET attempts = GREATEST(attempts, $2),
                             lease_expires = $3, updated_at = $4
                         WHERE id = $1"
                    ),
                    &[
                        &id,
                        &(f.attempt as i32),
                        &(now + lease.as_millis() as i64),
                        &now,
                    ],
                )?;
                if f.dead {
                    set_dead(tx, s, id, now)?;
                    out.push(Status::Dead);
                } else {
                    out.push(Status::Failed);
                }
            }
            Ok(out)
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
        self.maintain_sets()
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
        let owners: Vec<String> = self
            .client
            .query(
                &format!(
                    "SELECT DISTINCT lease_owner FROM {s}.enrichment
                     WHERE status = 'in_progress' AND lease_owner IS NOT NULL"
                ),
                &[],
            )
            .map_err(|e| store_error(&self.target, e))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let dead: Vec<String> = owners.into_iter().filter(|o| is_dead_here(o)).collect();
        if dead.is_empty() {
            return Ok(0);
        }
        self.write(|tx, s, now| {
            let mut n = 0;
            for owner in &dead {
                let held: Vec<(i64, WorkKey, u32)> = tx
                    .query(
                        &format!(
                            "SELECT id, document_id, stage, vector_set, attempts
                             FROM {s}.enrichment
                             WHERE status = 'in_progress' AND lease_owner = $1 FOR UPDATE"
                        ),
                        &[owner],
                    )?
                    .iter()
                    .map(|r| {
                        (
                            r.get(0),
                            WorkKey {
                                document_id: r.get(1),
                                stage: r.get(2),
                                vector_set: r.get::<_, i32>(3) as i64,
                            },
                            r.get::<_, i32>(4).max(0) as u32,
                        )
                    })
                    .collect();
                for (id, key, attempts) in held {
                    record_error(
                        tx,
                        s,
                        &key,
                        attempts,
                        owner,
                        "the worker's process ended before it finished (killed or crashed)",
                        now,
                    )?;
                    // Due at once, the attempt counted: a document that kills its worker every
                    // time still ends in the dead-letter queue.
                    tx.execute(
                        &format!(
                            "UPDATE {s}.enrichment SET status = 'failed', not_before = 0,
                                 lease_owner = NULL, lease_expires = NULL, updated_at = $2
                             WHERE id = $1"
                        ),
                        &[&id, &now],
                    )?;
                    n += 1;
                }
            }
            Ok(n)
        })
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
            let set = all
                .iter()
                .find(|x| x.id == vector_set)
                .cloned()
                .ok_or_else(|| {
                    TxError::invalid(format!("the index has no vector set {vector_set}"))
                })?;
            if let Some(v) = vectors.iter().find(|v| v.vector.len() != set.dimension) {
                return Err(TxError::invalid(format!(
                    "a vector of {} dimensions for vector set {} of {}: this is a bug",
                    v.vector.len(),
                    set.id,
                    set.dimension
                )));
            }
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
            let written: Vec<(i64, String, String)> = tx
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
                .collect();
            let done: Vec<i64> = written.iter().map(|w| w.0).collect();
            // Token ids go once every live set has the chunk's vector (this one counts: its
            // rows are visible to the next statement).
            tx.execute(
                &format!(
                    "DELETE FROM {s}.chunk_tokens t USING {s}.chunks c
                     WHERE t.rowid = c.rowid AND c.rowid = ANY($1::bigint[]) AND {}",
                    sets::in_every_live_set(s, &all)
                ),
                &[&done],
            )?;
            if set.state == SetState::Active && !written.is_empty() {
                let docs: Vec<&str> = written.iter().map(|w| w.1.as_str()).collect();
                let ids: Vec<&str> = written.iter().map(|w| w.2.as_str()).collect();
                tx.query_one(
                    &sets::delete_chunks(
                        s,
                        &all,
                        "unnest($1::text[], $2::text[]) AS w(document_id, id)",
                        "c.document_id = w.document_id AND c.replaced_by = w.id",
                    ),
                    &[&docs, &ids],
                )?;
            }
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
}
