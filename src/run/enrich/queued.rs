//! `ragline enrich --queue`: the lifecycle's work through a broker instead of claims on the
//! store, so any number of enrich processes on any number of machines share it the way the
//! roles of a distributed ingest share theirs.
//!
//! A feeder (one per process) claims runnable work from the store, highest priority first,
//! under one lease owner shared by the queue (`nats:<prefix>`), and publishes each document's
//! work on its stage's subject for its priority level; it keeps the broker a few claims deep,
//! no more, so what waits stays in the store where priority still applies. Workers fetch the
//! levels in order (`interactive`, `fresh`, `backfill`), do the work with the same stage code
//! as a store-fed worker, record the result in the store, and only then acknowledge the
//! message. A failed attempt is recorded with its error and negatively acknowledged with the
//! stage's backoff; the broker counts the attempts (`MaxDeliver` = the stage's retry limit), and
//! the last failed one is dead-lettered in the store and terminated. A message the broker gave
//! up on without an answer (its worker killed every time) comes back as an advisory that the
//! feeder dead-letters. Delivery is at least once; every write is idempotent, and a result is
//! recorded only while the queue still holds the work for the document's version.
//!
//! The store's lease on published work is long (it covers every delivery and backoff); if the
//! broker loses a message, the lease expires and the work is claimed and published again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::{
    claim_next, claim_requests, dispatch, housekeep, note_paused, EnrichOptions, EnrichWorker,
    SetModel, Shared,
};
use crate::document::InputKey;
use crate::embed::window::Recent;
use crate::lifecycle::backoff::{jitter_unit, retry_delay};
use crate::lifecycle::{
    now_ms, ChunkSparse, ChunkText, ChunkVector, Claim, ClaimRequest, DeliveryFailure,
    DocumentText, EnrichStore, LifecycleStore, Maintenance, Owner, PendingChunk, Priority,
    SparseModelRecord, StageSettings, Status, StoreError, WorkItem, WorkKey, EMBED,
};
use crate::queue::jetstream::lifecycle::{LifecycleDelivery, LifecycleQueue, Verdict};
use crate::queue::jetstream::BrokerError;

/// How long the end of a run waits for the advisories of work the server gave up on.
const SETTLE: Duration = Duration::from_secs(5);

/// How long an idle worker waits before fetching again.
const IDLE_FETCH: Duration = Duration::from_millis(50);

/// What the processes of one `enrich --queue` share.
pub struct QueuedRun {
    pub queue: LifecycleQueue,
    /// The lease owner of work handed to the broker.
    pub owner: Owner,
    /// The store's lease on published work: every delivery and backoff fits in it.
    pub lease: Duration,
    /// Set on SIGTERM: stop claiming, finish what is held, answer it, leave.
    pub stop: Arc<AtomicBool>,
    /// Set by the feeder when nothing is runnable and the broker holds no work (without
    /// --follow): the workers leave.
    drained: AtomicBool,
    /// Deliveries that were not the first (a worker failed, was killed or stalled).
    redelivered: AtomicU64,
    /// Publishes the feeder made.
    published: AtomicU64,
}

impl QueuedRun {
    pub fn new(queue: LifecycleQueue, lease: Duration, stop: Arc<AtomicBool>) -> QueuedRun {
        let owner = Owner::shared(&format!("nats:{}", queue.broker().config().prefix));
        QueuedRun {
            queue,
            owner,
            lease,
            stop,
            drained: AtomicBool::new(false),
            redelivered: AtomicU64::new(0),
            published: AtomicU64::new(0),
        }
    }

    fn stopping(&self, shared: &Shared<'_>) -> bool {
        self.stop.load(Ordering::Relaxed) || shared.signal.is_stopped()
    }

    /// Deliveries this process took that were not the first.
    /// What the broker gave up on (MaxDeliver reached), as it happens.
    pub(super) fn dead_letters(&self) -> Result<Receiver<(WorkItem, u32)>, BrokerError> {
        self.queue.dead_letters()
    }

    pub fn redeliveries(&self) -> u64 {
        self.redelivered.load(Ordering::Relaxed)
    }

    /// What the summary says about the broker.
    pub(super) fn note(&self) -> String {
        format!(
            "through the broker ({}): {} documents' work published by this process, {} \
             redeliveries taken (a worker failed, was killed or stalled)",
            self.queue.broker().config().describe(),
            self.published.load(Ordering::Relaxed),
            self.redelivered.load(Ordering::Relaxed)
        )
    }
}

/// The feeder: claims from the store, publishes to the broker, dead-letters what the broker
/// gave up on, keeps the store's housekeeping going, and says when the run is over.
pub(super) fn feed<S: EnrichStore>(
    mut store: S,
    shared: &Shared<'_>,
    run: &QueuedRun,
    dead: Receiver<(WorkItem, u32)>,
) -> Result<(), StoreError> {
    let options = shared.options;
    let requests = claim_requests(options, run.owner.as_str(), Some(run.lease));
    // A few claims' worth waiting in the broker: enough that no worker waits for the
    // feeder, few enough that newly urgent work is not stuck behind a long backlog.
    let deep = (options.claim_items as u64) * 4;
    let mut turn = 0usize;
    let mut last_sync = Instant::now();
    let mut said_paused = false;
    let mut empty_since: Option<Instant> = None;
    let me = Owner::this_process("enrich-feeder");
    let mut last_warning: Option<Instant> = None;
    while !run.stopping(shared) {
        bury_given_up(&mut store, shared, run, &dead, &me)?;
        let (waiting, held) = match run.queue.depth() {
            Ok(depth) => depth,
            Err(e) => {
                unreachable_broker(&mut last_warning, &e);
                continue;
            }
        };
        if waiting >= deep {
            std::thread::sleep(IDLE_FETCH);
            continue;
        }
        match claim_next(&mut store, &requests, &mut turn)? {
            Claim::Items(items) => {
                said_paused = false;
                publish(run, &items)?;
            }
            Claim::Idle { paused, next_due } => {
                if housekeep(&mut store, shared, &mut last_sync)? {
                    continue;
                }
                if paused && !said_paused {
                    said_paused = true;
                    note_paused(shared);
                }
                let waiting_retry = next_due.filter(|d| *d > 0);
                let broker_empty = waiting == 0 && held == 0;
                if !options.follow && (paused || waiting_retry.is_none()) && broker_empty {
                    // Nothing runnable and nothing in the broker: look once more (work may
                    // have settled between the two reads), then say the run is over.
                    if broker_settled(run, &dead, &mut empty_since, &mut last_warning) {
                        if let Claim::Items(items) = claim_next(&mut store, &requests, &mut turn)? {
                            publish(run, &items)?;
                            continue;
                        }
                        run.drained.store(true, Ordering::Release);
                        return Ok(());
                    }
                } else {
                    empty_since = None;
                }
                let wait = match waiting_retry {
                    Some(due) => Duration::from_millis((due - now_ms()).clamp(1, 250) as u64),
                    None => options.idle_poll.min(Duration::from_millis(100)),
                };
                std::thread::sleep(wait);
            }
        }
    }
    Ok(())
}

/// Dead-letter in the store the work the broker gave up on (its advisories on `dead`),
/// counting what this settles as failed.
fn bury_given_up<S: EnrichStore>(
    store: &mut S,
    shared: &Shared<'_>,
    run: &QueuedRun,
    dead: &Receiver<(WorkItem, u32)>,
    me: &Owner,
) -> Result<(), StoreError> {
    while let Ok((item, deliveries)) = dead.try_recv() {
        let reason = format!(
            "delivered {deliveries} times (the stage's retry limit) without an answer: its \
             worker was killed or stalled every time"
        );
        let failure = DeliveryFailure {
            key: item.key.clone(),
            attempt: deliveries,
            message: reason.clone(),
            dead: true,
            worker: me.to_string(),
        };
        let status = store.fail_deliveries(run.owner.as_str(), &[failure], run.lease)?;
        if status.first() == Some(&Status::Dead) {
            let mut t = shared.tally();
            t.claimed(std::slice::from_ref(&item));
            t.failed(&item.key, &reason, Status::Dead);
        }
    }
    Ok(())
}

/// Publish claimed `items` to the broker and count them.
fn publish(run: &QueuedRun, items: &[WorkItem]) -> Result<(), StoreError> {
    run.queue
        .publish(items)
        .map_err(|e| StoreError::Io(format!("broker: {e}")))?;
    run.published
        .fetch_add(items.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// Whether the broker, seen empty, still is and holds nothing stored or given up on (what it
/// gave up on is waited for [`SETTLE`] at most, timed from `empty_since`).
fn broker_settled(
    run: &QueuedRun,
    dead: &Receiver<(WorkItem, u32)>,
    empty_since: &mut Option<Instant>,
    last_warning: &mut Option<Instant>,
) -> bool {
    match (run.queue.depth(), run.queue.stored()) {
        (Ok((w, h)), Ok(stored)) => {
            // Work the server gave up on stays stored until its advisory is
            // handled (by this process or another): give that a moment, not
            // for ever (an advisory no process heard is lost; the store's
            // lease then expires).
            let settled =
                stored == 0 || empty_since.get_or_insert_with(Instant::now).elapsed() > SETTLE;
            w == 0 && h == 0 && dead.is_empty() && settled
        }
        (Err(e), _) | (_, Err(e)) => {
            unreachable_broker(last_warning, &e);
            false
        }
    }
}

/// The broker did not answer: say so (every 10 s at most) and wait a moment; the client
/// reconnects by itself.
fn unreachable_broker(last: &mut Option<Instant>, error: &BrokerError) {
    if last.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
        *last = Some(Instant::now());
        tracing::warn!("{error} (waiting for the broker)");
    }
    std::thread::sleep(Duration::from_millis(500));
}

/// A worker of the broker's work: fetch, do it with the stage's code, answer each message
/// after its result is in the store.
pub(super) fn work<S: EnrichStore>(
    w: EnrichWorker<S>,
    shared: &Shared<'_>,
    run: &QueuedRun,
) -> Result<(), StoreError> {
    let options = shared.options;
    let mut w = EnrichWorker {
        store: QueueStore {
            inner: w.store,
            run,
            me: Owner::this_process("enrich"),
            held: HashMap::new(),
            deliveries: Vec::new(),
        },
        loader: w.loader,
    };
    let mut models: HashMap<i64, (SetModel, Recent)> = HashMap::new();
    // Documents per fetch: for embed about a claim's tokens (from the work's own measure).
    let mut cost_per_doc: Option<u64> = None;
    let mut last_warning: Option<Instant> = None;
    while !run.stopping(shared) {
        let size = |stage: &str| fetch_size(options, cost_per_doc, stage);
        let batch = match run.queue.fetch(size) {
            Ok(batch) => lose_for_tests(batch),
            Err(e) => {
                // The client reconnects by itself (a broker restart): wait for it.
                unreachable_broker(&mut last_warning, &e);
                continue;
            }
        };
        if batch.is_empty() {
            if run.drained.load(Ordering::Acquire) {
                break;
            }
            std::thread::sleep(IDLE_FETCH);
            continue;
        }
        let again = batch.iter().filter(|d| d.item.attempts > 1).count();
        run.redelivered.fetch_add(again as u64, Ordering::Relaxed);
        for group in group_by_set(batch, &mut cost_per_doc) {
            work_group(&mut w, &mut models, group, shared, run)?;
        }
    }
    Ok(())
}

/// Documents to fetch of `stage`: for embed, a claim's cost at `cost_per_doc` (8 before it is
/// known); for an LLM stage, four per request in flight; else a claim's items.
fn fetch_size(options: &EnrichOptions, cost_per_doc: Option<u64>, stage: &str) -> usize {
    if stage == EMBED {
        match cost_per_doc {
            Some(c) => {
                (options.claim_cost / c.max(1)).clamp(1, options.claim_items as u64) as usize
            }
            None => 8,
        }
    } else if let Some(l) = options.llm.iter().find(|l| l.name == stage) {
        l.settings.concurrency.max(1) * 4
    } else if options.models.iter().any(|m| m.name() == stage) {
        super::MODEL_STAGE_CLAIM
    } else {
        options.claim_items
    }
}

/// Split a fetch by vector set, updating the running `cost_per_doc` of embed work.
fn group_by_set(
    batch: Vec<LifecycleDelivery>,
    cost_per_doc: &mut Option<u64>,
) -> Vec<Vec<LifecycleDelivery>> {
    // One stage per fetch; embed work of several vector sets is done set by set.
    let mut groups: Vec<Vec<LifecycleDelivery>> = Vec::new();
    for d in batch {
        if d.item.key.stage == EMBED {
            let c = d.item.cost.max(1);
            *cost_per_doc = Some(cost_per_doc.map_or(c, |old| (old * 7 + c) / 8));
        }
        match groups
            .iter_mut()
            .find(|g| g[0].item.key.vector_set == d.item.key.vector_set)
        {
            Some(g) => g.push(d),
            None => groups.push(vec![d]),
        }
    }
    groups
}

/// Do one group's work with the stage's code, then answer each of its messages.
fn work_group<S: EnrichStore>(
    w: &mut EnrichWorker<QueueStore<'_, S>>,
    models: &mut HashMap<i64, (SetModel, Recent)>,
    group: Vec<LifecycleDelivery>,
    shared: &Shared<'_>,
    run: &QueuedRun,
) -> Result<(), StoreError> {
    let items: Vec<WorkItem> = group.iter().map(|d| d.item.clone()).collect();
    w.store.begin(group);
    let owner = run.owner.clone();
    let result = dispatch(w, models, &owner, items, shared);
    let (deliveries, verdicts) = w.store.finish();
    let answers: Vec<(&LifecycleDelivery, Verdict)> = deliveries
        .iter()
        .map(|d| {
            let v = match &result {
                // Not the work's fault (the store or the model cannot be used): give
                // it back at once for another worker.
                Err(_) => Verdict::Retry(Duration::ZERO),
                Ok(()) => verdicts.get(&d.item.key).copied().unwrap_or(Verdict::Ack),
            };
            (d, v)
        })
        .collect();
    run.queue.settle(&answers);
    result
}

/// Fault injection for tests (feature `failpoints`): with `FAILPOINTS='enrich::lose=return(M)'`
/// a worker drops, unanswered, the work of every document whose id contains M, as a worker
/// killed while holding it would.
#[cfg(feature = "failpoints")]
fn lose_for_tests(batch: Vec<LifecycleDelivery>) -> Vec<LifecycleDelivery> {
    let marker: Option<String> = (|| {
        fail::fail_point!("enrich::lose", |m: Option<String>| m);
        None
    })();
    match marker.filter(|m| !m.is_empty()) {
        Some(m) => batch
            .into_iter()
            .filter(|d| !d.item.key.document_id.contains(&m))
            .collect(),
        None => batch,
    }
}

#[cfg(not(feature = "failpoints"))]
fn lose_for_tests(batch: Vec<LifecycleDelivery>) -> Vec<LifecycleDelivery> {
    batch
}

/// The store as a worker of the broker's work sees it: failures are recorded against the
/// delivery (the broker retries them), renewals also keep the messages alive, and what each
/// message's answer will be is collected.
struct QueueStore<'r, S> {
    inner: S,
    run: &'r QueuedRun,
    /// This worker, for the errors' record.
    me: Owner,
    /// The batch's work: its delivery number, the stage's MaxDeliver, the answer so far.
    held: HashMap<WorkKey, (u32, u32, Verdict)>,
    deliveries: Vec<LifecycleDelivery>,
}

impl<S> QueueStore<'_, S> {
    fn begin(&mut self, deliveries: Vec<LifecycleDelivery>) {
        self.held = deliveries
            .iter()
            .map(|d| {
                (
                    d.item.key.clone(),
                    (d.item.attempts, d.max_deliver, Verdict::Ack),
                )
            })
            .collect();
        self.deliveries = deliveries;
    }

    fn finish(&mut self) -> (Vec<LifecycleDelivery>, HashMap<WorkKey, Verdict>) {
        let verdicts = std::mem::take(&mut self.held)
            .into_iter()
            .map(|(k, (_, _, v))| (k, v))
            .collect();
        (std::mem::take(&mut self.deliveries), verdicts)
    }
}

impl<S: EnrichStore> LifecycleStore for QueueStore<'_, S> {
    fn claim(&mut self, _req: &ClaimRequest) -> Result<Claim, StoreError> {
        Err(StoreError::Invalid(
            "a worker of the broker's work claims nothing from the store: a bug".into(),
        ))
    }

    fn renew(&mut self, owner: &str, keys: &[WorkKey], _lease: Duration) -> Result<(), StoreError> {
        let held: Vec<&LifecycleDelivery> = self
            .deliveries
            .iter()
            .filter(|d| keys.contains(&d.item.key))
            .collect();
        self.run.queue.in_progress(&held);
        self.inner.renew(owner, keys, self.run.lease)
    }

    fn fail(
        &mut self,
        owner: &str,
        failures: &[(WorkKey, String)],
        settings: &StageSettings,
    ) -> Result<Vec<Status>, StoreError> {
        let list: Vec<DeliveryFailure> = failures
            .iter()
            .map(|(key, message)| {
                let (attempt, max, _) = self.held.get(key).copied().unwrap_or((1, 1, Verdict::Ack));
                DeliveryFailure {
                    key: key.clone(),
                    attempt,
                    message: message.clone(),
                    dead: attempt >= max,
                    worker: self.me.to_string(),
                }
            })
            .collect();
        let statuses = self.inner.fail_deliveries(owner, &list, self.run.lease)?;
        for (f, status) in list.iter().zip(&statuses) {
            let verdict = match status {
                Status::Failed => Verdict::Retry(retry_delay(
                    f.attempt,
                    settings.backoff,
                    settings.max_backoff,
                    jitter_unit(&f.key.document_id),
                )),
                Status::Dead => Verdict::Term,
                _ => Verdict::Ack,
            };
            if let Some(h) = self.held.get_mut(&f.key) {
                h.2 = verdict;
            }
        }
        Ok(statuses)
    }

    fn fail_deliveries(
        &mut self,
        owner: &str,
        failures: &[DeliveryFailure],
        lease: Duration,
    ) -> Result<Vec<Status>, StoreError> {
        self.inner.fail_deliveries(owner, failures, lease)
    }

    fn complete(&mut self, owner: &str, keys: &[WorkKey]) -> Result<(), StoreError> {
        self.inner.complete(owner, keys)
    }

    fn release(&mut self, _owner: &str, keys: &[WorkKey]) -> Result<(), StoreError> {
        // The broker still holds the work: give the messages back instead.
        for k in keys {
            if let Some(h) = self.held.get_mut(k) {
                h.2 = Verdict::Retry(Duration::ZERO);
            }
        }
        Ok(())
    }

    fn held_leases(&mut self) -> Result<Vec<crate::lifecycle::store::HeldLease>, StoreError> {
        self.inner.held_leases()
    }

    fn reap_dead_owners(&mut self) -> Result<usize, StoreError> {
        self.inner.reap_dead_owners()
    }

    fn maintain(&mut self) -> Result<Maintenance, StoreError> {
        self.inner.maintain()
    }

    fn sync_stage(
        &mut self,
        stage: &str,
        fingerprint: &str,
        priority: Priority,
    ) -> Result<u64, StoreError> {
        self.inner.sync_stage(stage, fingerprint, priority)
    }
}

impl<S: EnrichStore> EnrichStore for QueueStore<'_, S> {
    fn pending_chunks(&mut self, key: &WorkKey) -> Result<Vec<PendingChunk>, StoreError> {
        self.inner.pending_chunks(key)
    }

    fn vector_for(
        &mut self,
        vector_set: i64,
        key: &InputKey,
    ) -> Result<Option<Vec<f32>>, StoreError> {
        self.inner.vector_for(vector_set, key)
    }

    fn write_vectors(
        &mut self,
        vector_set: i64,
        vectors: &[ChunkVector],
        documents: &[String],
    ) -> Result<usize, StoreError> {
        self.inner.write_vectors(vector_set, vectors, documents)
    }

    fn document_text(&mut self, id: &str) -> Result<Option<DocumentText>, StoreError> {
        self.inner.document_text(id)
    }

    fn write_output(
        &mut self,
        owner: &str,
        key: &WorkKey,
        output: &str,
        keyword: bool,
    ) -> Result<bool, StoreError> {
        self.inner.write_output(owner, key, output, keyword)
    }

    fn current_chunks(&mut self, id: &str) -> Result<Option<Vec<ChunkText>>, StoreError> {
        self.inner.current_chunks(id)
    }

    fn write_sparse(
        &mut self,
        owner: &str,
        key: &WorkKey,
        chunks: &[ChunkSparse],
    ) -> Result<bool, StoreError> {
        self.inner.write_sparse(owner, key, chunks)
    }

    fn write_annotations(
        &mut self,
        owner: &str,
        key: &WorkKey,
        annotations: &crate::lifecycle::Annotations,
        prompt_text: &str,
    ) -> Result<bool, StoreError> {
        self.inner
            .write_annotations(owner, key, annotations, prompt_text)
    }

    fn record_dependencies(&mut self, edges: &[(String, String)]) -> Result<(), StoreError> {
        self.inner.record_dependencies(edges)
    }

    fn sparse_model(&mut self) -> Result<Option<SparseModelRecord>, StoreError> {
        self.inner.sparse_model()
    }

    fn record_sparse_model(&mut self, model: &SparseModelRecord) -> Result<(), StoreError> {
        self.inner.record_sparse_model(model)
    }
}
