//! The lifecycle store behind an index URI: what `enrich`, `backfill`, `status`, `dlq`,
//! `pause` and `promote` work on, whichever backend holds it. `sqlite://` and `postgres://`
//! indexes are stores (the work queue lives beside the documents); output files are not.

use std::collections::BTreeMap;

use super::ModelIdentity;
use crate::lifecycle::report::{
    BackfillProgress, CircuitOpen, DeadLetter, DocumentLifecycle, MinuteActivity, StageCounts,
    StatusReport, VectorSetStatus,
};
use crate::lifecycle::rules::{self, QueueSql, StatusGroup};
use crate::lifecycle::{EnrichStore, Maintenance, Priority, StoreError, CHUNK, EMBED};

/// Documents queued per backfill page.
pub const BACKFILL_PAGE: usize = 512;

/// Where a vector set stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetState {
    /// What search reads and what `ingest` writes.
    Active,
    /// Being filled by `backfill` (a model migration).
    Backfill,
    /// Replaced by a migration; dropped by `backfill --drop-old` or `ingest --prune`.
    Retired,
}

impl SetState {
    pub fn as_str(self) -> &'static str {
        match self {
            SetState::Active => "active",
            SetState::Backfill => "backfill",
            SetState::Retired => "retired",
        }
    }

    pub fn parse(s: &str) -> SetState {
        match s {
            "active" => SetState::Active,
            "backfill" => SetState::Backfill,
            _ => SetState::Retired,
        }
    }
}

/// One model's vectors in an index: each set has a table of its own.
#[derive(Clone, Debug, PartialEq)]
pub struct VectorSet {
    pub id: i64,
    pub model: String,
    pub model_dir: String,
    pub fingerprint: String,
    /// The fingerprint of the model's tokenizer (None for sets of indexes made before it was
    /// recorded, until a run with the same model fills it in).
    pub tokenizer: Option<String>,
    pub dimension: usize,
    /// The table holding the set's vectors (unqualified).
    pub vec_table: String,
    pub state: SetState,
    /// Backfill: the last document id queued.
    pub watermark: Option<String>,
    /// Backfill: every document has been queued.
    pub backfill_done: bool,
}

impl VectorSet {
    /// The set's bit in SQLite's `chunks.embedded`.
    pub fn bit(&self) -> i64 {
        1i64 << self.id
    }

    /// Sets that need a vector for every chunk (active and filling).
    pub fn is_live(&self) -> bool {
        self.state != SetState::Retired
    }

    pub fn identity(&self) -> ModelIdentity {
        ModelIdentity {
            name: self.model.clone(),
            dir: self.model_dir.clone(),
            fingerprint: self.fingerprint.clone(),
            dimension: self.dimension,
            tokenizer: self.tokenizer.clone(),
        }
    }
}

/// A document a run could not get into the index (the broker gave up on one of its messages
/// after MaxDeliver deliveries): dead-lettered in `stage` with what a requeue needs to run it
/// again.
#[derive(Clone, Debug, PartialEq)]
pub struct Burial {
    pub document_id: String,
    /// The stage it is dead in (`chunk`: it never got through ingest).
    pub stage: String,
    /// Deliveries made.
    pub attempts: u32,
    /// Who gave up on it (the error's worker).
    pub worker: String,
    pub error: String,
    /// What to run again: the document as the run published it.
    pub copy: Option<StoredCopy>,
}

/// What a requeue runs a buried document from.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredCopy {
    pub document_id: String,
    /// The document as published (`queue::wire` form), when the message that died was the
    /// document itself (not one of its chunks).
    pub payload: Option<Vec<u8>>,
    /// Where it came from (a file path), read again when there is no payload.
    pub source: Option<String>,
    /// The run's settings (`ragline.toml` form), so a requeue cuts and embeds it the same way.
    pub config: Option<String>,
}

/// An index's lifecycle: the leased work queue ([`EnrichStore`]) and what operators ask of
/// it.
pub trait IndexStore: EnrichStore {
    /// The index, for messages (no password).
    fn describe(&self) -> String;

    /// Every vector set, by id.
    fn sets(&mut self) -> Result<Vec<VectorSet>, StoreError>;

    /// Everything `ragline status` shows.
    fn status(&mut self) -> Result<StatusReport, StoreError>;

    /// The dead-letter queue, oldest first (of `stage` only, when given).
    fn dead_letters(&mut self, stage: Option<&str>) -> Result<Vec<DeadLetter>, StoreError>;

    /// A document's lifecycle: every stage with every attempt's error. None when the index
    /// has no such document.
    fn document_lifecycle(&mut self, id: &str) -> Result<Option<DocumentLifecycle>, StoreError>;

    /// Put dead documents back in the queue (attempts reset, errors kept): those of `ids`,
    /// or all when `ids` is None; of `stage` only when given. Returns how many.
    fn requeue(&mut self, stage: Option<&str>, ids: Option<&[String]>) -> Result<u64, StoreError>;

    /// Dead-letter documents a run could not get into the index, with their errors and a
    /// copy to run them again from (replacing an earlier copy).
    fn bury(&mut self, burials: &[Burial]) -> Result<(), StoreError>;

    /// The stored copies of buried documents among `ids`.
    fn buried(&mut self, ids: &[String]) -> Result<Vec<StoredCopy>, StoreError>;

    /// Forget the stored copies of `ids` (they are in the index now).
    fn unbury(&mut self, ids: &[String]) -> Result<(), StoreError>;

    /// Pause or resume a stage: workers stop claiming its work within a poll, finish what
    /// they hold, and go on when it is resumed.
    fn set_paused(&mut self, stage: &str, paused: bool) -> Result<(), StoreError>;

    /// Record that a stage's service circuit opened (with why) or closed (None), for
    /// `ragline status`. Workers are not paused by it: they wait on the circuit themselves.
    fn set_circuit(&mut self, stage: &str, open: Option<&str>) -> Result<(), StoreError>;

    /// Move the pending embed work of `ids` to interactive priority. Returns how many
    /// documents moved.
    fn promote(&mut self, ids: &[String]) -> Result<u64, StoreError>;

    /// Start (or resume) filling a vector set for `model`; its documents are queued a page at
    /// a time as workers run dry ([`crate::lifecycle::LifecycleStore::maintain`]).
    fn start_backfill(&mut self, model: &ModelIdentity) -> Result<VectorSet, StoreError>;

    /// Queue every document for `stage` (a stage without a vector set, such as `noop`) at
    /// `priority`. Returns how many.
    fn enqueue_all(&mut self, stage: &str, priority: Priority) -> Result<u64, StoreError>;

    /// Drop the vector sets a finished migration retired; the models dropped.
    fn drop_retired(&mut self) -> Result<Vec<String>, StoreError>;

    /// Chunks of the active set still without a vector, and all current chunks.
    fn unembedded(&mut self) -> Result<(u64, u64), StoreError>;

    /// An enrich run is over: finish what waits for the end (an approximate-search index
    /// over the vectors written). Returns notes for the summary.
    fn finish_run(&mut self) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }
}

/// An error inside a backend's write transaction: its driver's (`E`), or the store's own
/// refusal.
pub(crate) enum TxError<E> {
    Sql(E),
    Store(StoreError),
}

impl<E> TxError<E> {
    pub(crate) fn invalid(message: String) -> Self {
        TxError::Store(StoreError::Invalid(message))
    }
}

impl<E> From<StoreError> for TxError<E> {
    fn from(e: StoreError) -> Self {
        TxError::Store(e)
    }
}

/// The reads `ragline status` makes of an index, each a statement of its backend.
pub(crate) trait StatusSql: QueueSql {
    /// Documents in the index.
    fn documents(&mut self) -> Result<u64, Self::Error>;

    /// Current chunks (not replaced).
    fn chunks(&mut self) -> Result<u64, Self::Error>;

    /// Every vector set, by id.
    fn vector_sets(&mut self) -> Result<Vec<VectorSet>, Self::Error>;

    /// Current chunks with a vector in `set`.
    fn embedded_in(&mut self, set: &VectorSet) -> Result<u64, Self::Error>;

    /// The rows of `stage` in `vector_set` grouped by status ([`rules::stage_counts`]).
    fn stage_groups(
        &mut self,
        stage: &str,
        vector_set: i64,
        now: i64,
    ) -> Result<Vec<StatusGroup>, Self::Error>;

    /// The document-level stages a config added (not `chunk` or `embed`), by name.
    fn document_stages(&mut self) -> Result<Vec<String>, Self::Error>;

    /// Pending and failed rows of `stage` waiting for a stage it depends on.
    fn waiting_on_dependency(&mut self, stage: &str) -> Result<u64, Self::Error>;

    /// Open circuits: (stage, reason, since).
    fn circuits(&mut self) -> Result<Vec<(String, String, i64)>, Self::Error>;

    /// Per minute since `since` (ms), the minutes with any: (minute since the epoch,
    /// documents chunked, chunks embedded).
    fn activity(&mut self, since: i64) -> Result<Vec<(i64, u64, u64)>, Self::Error>;
}

/// The statement of [`StatusSql::activity`], for a backend's documents and enrichment tables
/// (`$1`/`?1`: since, in ms).
pub(crate) fn activity_sql(documents: &str, enrichment: &str, since: &str) -> String {
    format!(
        "SELECT e.done_at / 60000 AS minute,
                SUM(CASE WHEN e.stage = 'chunk' THEN 1 ELSE 0 END),
                SUM(CASE WHEN e.stage = 'embed' THEN d.chunk_count ELSE 0 END)
         FROM {enrichment} e JOIN {documents} d ON d.id = e.document_id
         WHERE e.status = 'done' AND e.done_at >= {since} AND e.stage IN ('chunk', 'embed')
         GROUP BY minute ORDER BY minute"
    )
}

/// The condition of [`StatusSql::waiting_on_dependency`] over a row `e`, for a backend's
/// tables.
pub(crate) fn waiting_sql(enrichment: &str, dependencies: &str) -> String {
    format!(
        "e.status IN ('pending', 'failed') AND e.vector_set = 0
         AND EXISTS (SELECT 1 FROM {dependencies} sd
                     WHERE sd.stage = e.stage
                       AND NOT EXISTS (SELECT 1 FROM {enrichment} c
                                       WHERE c.document_id = e.document_id
                                         AND c.stage = sd.depends_on AND c.status = 'done'
                                         AND c.input_version = e.input_version))"
    )
}

/// Everything `ragline status` shows of `index`, at `now`: the same report from every backend.
pub(crate) fn status_report<Q: StatusSql>(
    q: &mut Q,
    index: String,
    now: i64,
) -> Result<StatusReport, Q::Error> {
    let documents = q.documents()?;
    let chunks = q.chunks()?;
    let all = q.vector_sets()?;
    let paused = q.paused_stages()?;
    let counts = |q: &mut Q, stage: &str, set: i64| -> Result<_, Q::Error> {
        let groups = q.stage_groups(stage, set, now)?;
        Ok(rules::stage_counts(
            groups,
            paused.iter().any(|p| p == stage),
            now,
        ))
    };
    let mut stages = BTreeMap::new();
    stages.insert(CHUNK.to_string(), counts(q, CHUNK, 0)?);
    if let Some(set) = all.iter().find(|s| s.state == SetState::Active) {
        stages.insert(EMBED.to_string(), counts(q, EMBED, set.id)?);
    }
    for stage in q.document_stages()? {
        let mut c = counts(q, &stage, 0)?;
        c.waiting_on_dependency = q.waiting_on_dependency(&stage)?;
        stages.insert(stage, c);
    }
    for (stage, reason, since) in q.circuits()? {
        stages.entry(stage).or_default().circuit = Some(CircuitOpen { reason, since });
    }
    let mut vector_sets = Vec::with_capacity(all.len());
    let mut backfill = None;
    for set in &all {
        let embedded = q.embedded_in(set)?;
        vector_sets.push(VectorSetStatus {
            id: set.id,
            model: set.model.clone(),
            dimension: set.dimension,
            embedded,
            total: chunks,
            active: set.state == SetState::Active,
            state: set.state.as_str().to_string(),
            ann: None,
        });
        if set.state == SetState::Backfill && backfill.is_none() {
            let stage = counts(q, EMBED, set.id)?;
            backfill = Some(backfill_progress(set, stage, documents, embedded, chunks));
        }
    }
    let activity = q
        .activity(now - 3_600_000)?
        .into_iter()
        .map(|(minute, documents, chunks)| MinuteActivity {
            minute: minute * 60_000,
            documents,
            chunks,
        })
        .collect();
    Ok(StatusReport {
        index,
        documents,
        chunks,
        stages,
        vector_sets,
        backfill,
        activity,
        sparse_model: None,
    })
}

/// How far the backfill into `set` is: its embed stage's counts over the index's documents.
fn backfill_progress(
    set: &VectorSet,
    stage: StageCounts,
    documents: u64,
    embedded: u64,
    chunks: u64,
) -> BackfillProgress {
    BackfillProgress {
        vector_set: set.id,
        model: set.model.clone(),
        watermark: set.watermark.clone(),
        all_queued: set.backfill_done,
        documents_total: documents,
        documents_queued: stage.pending
            + stage.in_progress
            + stage.failed
            + stage.dead
            + stage.done,
        documents_done: stage.done,
        chunks_embedded: embedded,
        chunks_total: chunks,
        stage,
    }
}

/// The statements of a backfill (a model migration), run in one write transaction of the
/// backend.
pub(crate) trait BackfillSql {
    type Error;

    /// Every vector set, by id, read under the lock that keeps two workers from switching
    /// sets at once (where the backend's transactions run side by side).
    fn sets_locked(&mut self) -> Result<Vec<VectorSet>, Self::Error>;

    /// Up to `n` document ids after `after`, in order.
    fn documents_after(&mut self, after: &str, n: usize) -> Result<Vec<String>, Self::Error>;

    /// Queue the work `ids` lack in the live sets of `all`, at `priority`.
    fn queue(
        &mut self,
        ids: &[String],
        all: &[VectorSet],
        priority: Priority,
        now: i64,
    ) -> Result<(), Self::Error>;

    /// Record how far the backfill of `set` has queued, and whether it queued everything.
    fn set_watermark(
        &mut self,
        set: i64,
        last: Option<&str>,
        done: bool,
    ) -> Result<(), Self::Error>;

    /// Current chunks without a vector in `set`.
    fn unembedded_in(&mut self, set: &VectorSet) -> Result<u64, Self::Error>;

    /// The embed work of `set` not done yet, counted by status.
    fn open_work(&mut self, set: i64) -> Result<Vec<(String, i64)>, Self::Error>;

    /// Make `set` the one search reads (what the backend builds for it first included).
    fn switch_to(&mut self, set: &VectorSet, now: i64) -> Result<(), Self::Error>;
}

/// Housekeeping when no work is claimable: queue the next page of a backfill, or switch
/// search to the backfilled set once every chunk has its vector and no work is open; a
/// backfill whose only open work is dead is blocked.
pub(crate) fn maintain<Q: BackfillSql>(q: &mut Q, now: i64) -> Result<Maintenance, Q::Error> {
    let all = q.sets_locked()?;
    let Some(set) = all.iter().find(|x| x.state == SetState::Backfill).cloned() else {
        return Ok(Maintenance::Nothing);
    };
    if !set.backfill_done {
        let after = set.watermark.as_deref().unwrap_or("");
        let ids = q.documents_after(after, BACKFILL_PAGE)?;
        q.queue(&ids, &all, Priority::Backfill, now)?;
        let done = ids.len() < BACKFILL_PAGE;
        q.set_watermark(set.id, ids.last().map(String::as_str), done)?;
        return Ok(Maintenance::Queued {
            set: set.id,
            documents: ids.len(),
        });
    }
    let missing = q.unembedded_in(&set)?;
    let open = q.open_work(set.id)?;
    if missing == 0 && open.is_empty() {
        q.switch_to(&set, now)?;
        return Ok(Maintenance::Switched {
            set: set.id,
            model: set.model,
        });
    }
    let dead = open
        .iter()
        .find(|(s, _)| s == "dead")
        .map_or(0, |(_, n)| *n as u64);
    if open.iter().all(|(s, _)| s == "dead") && dead > 0 {
        return Ok(Maintenance::Blocked { set: set.id, dead });
    }
    Ok(Maintenance::Nothing)
}
