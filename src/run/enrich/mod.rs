//! `ragline enrich`: workers that take their work from the lifecycle queue in the index
//! instead of from a connector. Each worker claims a batch (documents of one stage, and for
//! `embed` of one vector set, highest priority first, about one embedding window of tokens),
//! does it, and completes it in the transaction that writes the results; a failed document
//! is retried with backoff, then dead-lettered. A lease that expires (a killed worker) makes
//! the work claimable again; a worker that finds the leases of a dead process of its own host
//! takes that work at once.
//!
//! The run ends when nothing is claimable and no retry is waiting (or never, with `follow`).
//! Progress and the summary are the same as an ingest's: a claimed document is "published",
//! a completed one "indexed", its chunks "created" and, with their vectors, "indexed".

mod chunk_models;
mod embed;
mod llm;
#[cfg(feature = "nats")]
mod queued;
#[cfg(not(feature = "nats"))]
#[path = "queued_off.rs"]
mod queued;

pub use chunk_models::{gather_entities, prompt_text, weighted_mean, ChunkModel, ModelStage};
pub use llm::LlmStage;
pub use queued::QueuedRun;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::progress::{Observer, Snapshot};
use super::summary::RunSummary;
use super::RunError;
use crate::document::RunId;
use crate::embed::encoder::Encoder;
use crate::embed::window::Recent;
use crate::lifecycle::{
    now_ms, Claim, ClaimRequest, EnrichStore, LifecycleStore, Maintenance, Owner, StageSettings,
    Status, StoreError, WorkItem, WorkKey, EMBED, NOOP,
};
use crate::publisher::{Counts, Outcome};
use crate::signal::RunSignal;
use crate::stats::RunStats;

/// Documents per claim of a chunk-model stage (`sparse`, `entities`, `labels`): what one
/// worker computes well within a lease.
pub const MODEL_STAGE_CLAIM: usize = 32;

/// How often an idle worker looks for new work (and for a pause being lifted).
pub const IDLE_POLL: Duration = Duration::from_millis(250);

/// How an enrich run goes.
#[derive(Clone, Debug)]
pub struct EnrichOptions {
    /// Stages to work (`embed`; `noop` for measuring the queue).
    pub stages: Vec<String>,
    /// Keep waiting for new work instead of ending when nothing is runnable.
    pub follow: bool,
    pub settings: StageSettings,
    /// Documents per claim, at most.
    pub claim_items: usize,
    /// Work per claim (embed: tokens), at most; about one embedding window.
    pub claim_cost: u64,
    pub idle_poll: Duration,
    /// How often the observer hears about progress.
    pub tick: Duration,
    /// Documents runnable when the run starts (for the progress bar; 0: unknown).
    pub announced: u64,
    /// The document-level LLM stages among `stages`, with their clients.
    pub llm: Vec<Arc<LlmStage>>,
    /// The chunk-model stages among `stages` (sparse, entities, labels), with their models.
    pub models: Vec<Arc<ModelStage>>,
}

impl Default for EnrichOptions {
    fn default() -> Self {
        EnrichOptions {
            stages: vec![EMBED.to_string()],
            follow: false,
            settings: StageSettings::default(),
            claim_items: 256,
            claim_cost: 8192,
            idle_poll: IDLE_POLL,
            tick: Duration::from_millis(200),
            announced: 0,
            llm: Vec::new(),
            models: Vec::new(),
        }
    }
}

impl EnrichOptions {
    /// The chunk-model stages this run works.
    fn working_models(&self) -> impl Iterator<Item = &Arc<ModelStage>> {
        self.models
            .iter()
            .filter(|m| self.stages.iter().any(|s| s == m.name()))
    }
}

/// The model of one vector set, as a worker holds it.
pub struct SetModel {
    pub encoder: Box<dyn Encoder>,
    /// The device, for messages.
    pub label: String,
    /// Padded tokens per forward pass, at most.
    pub batch_tokens: usize,
}

/// Loads the model of a vector set (by id) the first time a worker needs it.
pub type ModelLoader = Box<dyn FnMut(i64) -> Result<SetModel, Unloadable> + Send>;

/// Why a vector set's model cannot be loaded: the message says what is missing and how to fix
/// it (fetch the model, name its folder, name the service that embedded the set).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unloadable(pub String);

/// One worker: its own connection to the store and its own models.
pub struct EnrichWorker<S> {
    pub store: S,
    pub loader: ModelLoader,
}

/// The run's exact counts, shared by the workers.
#[derive(Default)]
struct Tally {
    counts: Counts,
    /// The last outcome of each document this run worked: None when done, the reason when
    /// its last attempt failed.
    last: HashMap<WorkKey, Option<Outcome>>,
    notes: Vec<String>,
    /// Chunks cut to a vector set's model limit.
    truncated: u64,
    /// The work comes from a broker: a failed attempt is the broker's to retry (perhaps in
    /// another process), so only dead letters count as failures here.
    broker: bool,
    /// Failed attempts handed back to the broker.
    retries: u64,
    /// Documents other workers held under a lease when this run ended.
    held_by_others: u64,
}

impl Tally {
    fn claimed(&mut self, items: &[WorkItem]) {
        for item in items {
            if !self.last.contains_key(&item.key) {
                self.counts.published += 1;
            }
        }
    }

    fn done(&mut self, key: &WorkKey) {
        if let Some(Some(_)) = self.last.insert(key.clone(), None) {
            self.counts.failed -= 1;
        }
        self.counts.indexed += 1;
    }

    fn failed(&mut self, key: &WorkKey, reason: &str, status: Status) {
        if self.broker && status != Status::Dead {
            self.retries += 1;
            return;
        }
        let outcome = Outcome {
            id: key.document_id.clone(),
            parent_id: None,
            stage: key.stage.clone(),
            reason: match status {
                Status::Dead => format!(
                    "{reason} (dead-lettered: `ragline dlq show {}`)",
                    key.document_id
                ),
                _ => format!("{reason} (will retry)"),
            },
        };
        if !matches!(self.last.insert(key.clone(), Some(outcome)), Some(Some(_))) {
            self.counts.failed += 1;
        }
    }
}

/// What every worker shares.
struct Shared<'a> {
    options: &'a EnrichOptions,
    tally: &'a Mutex<Tally>,
    stats: &'a RunStats,
    signal: &'a RunSignal,
}

impl Shared<'_> {
    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Run the workers until nothing is runnable (or forever with `follow`); return the summary.
pub fn execute<S: EnrichStore + 'static>(
    workers: Vec<EnrichWorker<S>>,
    options: &EnrichOptions,
    index: String,
    observer: &mut dyn Observer,
) -> Result<RunSummary, RunError> {
    run_workers(workers, None, options, index, observer)
}

/// Run the workers on the broker's work (`enrich --queue`), with a feeder that claims from
/// `feeder` (a store connection of its own) and publishes; see [`queued`].
pub fn execute_on_broker<S: EnrichStore + 'static>(
    workers: Vec<EnrichWorker<S>>,
    feeder: S,
    run: &QueuedRun,
    options: &EnrichOptions,
    index: String,
    observer: &mut dyn Observer,
) -> Result<RunSummary, RunError> {
    let dead = run
        .dead_letters()
        .map_err(|e| RunError::Aborted(format!("broker: {e}")))?;
    let mut summary = run_workers(workers, Some((feeder, run, dead)), options, index, observer)?;
    summary.counts.redelivered = run.redeliveries();
    summary.notes.push(run.note());
    Ok(summary)
}

type Feeder<'r, S> = (
    S,
    &'r QueuedRun,
    crossbeam_channel::Receiver<(WorkItem, u32)>,
);

/// Run the workers (and the feeder, for a queued run) to the end, ticking `observer`, and
/// sum up what they did.
fn run_workers<S: EnrichStore + 'static>(
    workers: Vec<EnrichWorker<S>>,
    feeder: Option<Feeder<'_, S>>,
    options: &EnrichOptions,
    index: String,
    observer: &mut dyn Observer,
) -> Result<RunSummary, RunError> {
    let started = Instant::now();
    let signal = RunSignal::new();
    let stats = RunStats::default();
    let tally = Mutex::new(Tally {
        broker: feeder.is_some(),
        ..Tally::default()
    });
    let queued = feeder.as_ref().map(|f| f.1);
    let running = AtomicU64::new(workers.len() as u64 + u64::from(feeder.is_some()));
    let shared = Shared {
        options,
        tally: &tally,
        stats: &stats,
        signal: &signal,
    };
    std::thread::scope(|scope| {
        for (i, worker) in workers.into_iter().enumerate() {
            let shared = &shared;
            let body = move || match queued {
                Some(run) => queued::work(worker, shared, run),
                None => work(worker, shared),
            };
            let (name, who) = (format!("enrich-{i}"), format!("enrich worker {i}"));
            spawn_counted(scope, name, who, shared, &running, body);
        }
        if let Some((store, run, dead)) = feeder {
            let shared = &shared;
            let body = move || queued::feed(store, shared, run, dead);
            let (name, who) = ("enrich-feeder".into(), "enrich feeder".into());
            spawn_counted(scope, name, who, shared, &running, body);
        }
        watch(&running, &shared, started, observer);
    });
    if let Some(reason) = signal.abort_reason() {
        return Err(RunError::Aborted(reason));
    }
    let tally = tally.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(summarize(tally, index, started, &stats))
}

/// Start the thread `name`; an error or a panic in `body` aborts the run, naming `who`, and
/// `running` counts down when it ends (or when it cannot start).
fn spawn_counted<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    name: String,
    who: String,
    shared: &'scope Shared<'_>,
    running: &'scope AtomicU64,
    body: impl FnOnce() -> Result<(), StoreError> + Send + 'scope,
) {
    let spawned = std::thread::Builder::new()
        .name(name)
        .spawn_scoped(scope, move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
            match result {
                Ok(Ok(())) => {}
                Ok(Err(e)) => shared.signal.abort(format!("{who}: {e}")),
                Err(_) => shared.signal.abort(format!("{who} panicked")),
            }
            running.fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(e) = spawned {
        shared.signal.abort(format!("cannot start a thread: {e}"));
        running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Tick `observer` with the tally until no thread is `running`, and once more after.
fn watch(running: &AtomicU64, shared: &Shared<'_>, started: Instant, observer: &mut dyn Observer) {
    let options = shared.options;
    loop {
        let done = running.load(Ordering::Acquire) == 0;
        {
            let t = shared.tally();
            let counts = t.counts.clone();
            drop(t);
            let finished = counts.indexed + counts.failed;
            observer.tick(&Snapshot {
                counts: &counts,
                pending: counts.published.saturating_sub(finished),
                announced: options.announced,
                elapsed: started.elapsed(),
                stats: shared.stats,
            });
        }
        if done {
            break;
        }
        std::thread::sleep(options.tick.min(Duration::from_millis(100)));
    }
}

/// The run's summary from the workers' final tally.
fn summarize(tally: Tally, index: String, started: Instant, stats: &RunStats) -> RunSummary {
    let mut failures: Vec<Outcome> = tally.last.into_values().flatten().collect();
    failures.sort_by(|a, b| a.id.cmp(&b.id));
    let mut summary = RunSummary::new(
        RunId::generate(),
        index,
        started.elapsed(),
        tally.counts,
        failures,
        Vec::new(),
        stats,
    );
    summary.notes = tally.notes;
    summary.held_by_others = tally.held_by_others;
    if tally.retries > 0 {
        summary.notes.push(format!(
            "{} failed attempts went back to the broker to be retried after their backoff",
            tally.retries
        ));
    }
    summary
}

/// Do claimed work (one stage; for embed, one vector set) and record the results.
fn dispatch<S: EnrichStore>(
    w: &mut EnrichWorker<S>,
    models: &mut HashMap<i64, (SetModel, Recent)>,
    owner: &Owner,
    items: Vec<WorkItem>,
    shared: &Shared<'_>,
) -> Result<(), StoreError> {
    shared.tally().claimed(&items);
    let stage = items[0].key.stage.clone();
    match stage.as_str() {
        EMBED => embed::process(w, models, owner, items, shared),
        NOOP => {
            let keys: Vec<WorkKey> = items.into_iter().map(|i| i.key).collect();
            w.store.complete(owner.as_str(), &keys)?;
            let mut t = shared.tally();
            keys.iter().for_each(|k| t.done(k));
            Ok(())
        }
        other => {
            let options = shared.options;
            if let Some(m) = options.models.iter().find(|m| m.name() == other) {
                return chunk_models::process(w, m, owner, items, shared);
            }
            match options.llm.iter().find(|l| l.name == other) {
                Some(l) => llm::process(w, l, owner, items, shared),
                None => Err(StoreError::Invalid(format!(
                    "claimed work of stage `{other}`, which enrich cannot do: a bug"
                ))),
            }
        }
    }
}

/// Record failed attempts (`failed` with a backoff, or `dead` past `settings`' retry limit)
/// and count them.
fn record_failures<S: EnrichStore>(
    w: &mut EnrichWorker<S>,
    owner: &Owner,
    failures: &[(WorkKey, String)],
    settings: &StageSettings,
    shared: &Shared<'_>,
) -> Result<(), StoreError> {
    if failures.is_empty() {
        return Ok(());
    }
    let statuses = w.store.fail(owner.as_str(), failures, settings)?;
    let mut t = shared.tally();
    for ((key, reason), status) in failures.iter().zip(statuses) {
        t.failed(key, reason, status);
    }
    Ok(())
}

/// What is done when nothing is claimable: queue new or changed documents for the LLM stages
/// (with --follow, as they come), the next page of a backfill, or switch search to a
/// completed one. True when it queued work (claim again at once).
fn housekeep<S: EnrichStore>(
    store: &mut S,
    shared: &Shared<'_>,
    last_sync: &mut Instant,
) -> Result<bool, StoreError> {
    let options = shared.options;
    if options.follow && last_sync.elapsed() > Duration::from_secs(2) {
        *last_sync = Instant::now();
        let mut queued = 0;
        for l in options
            .llm
            .iter()
            .filter(|l| options.stages.contains(&l.name))
        {
            queued += store.sync_stage(&l.name, &l.fingerprint, l.settings.priority)?;
        }
        for m in options.working_models() {
            queued += store.sync_stage(m.name(), &m.fingerprint, m.settings.priority)?;
        }
        if queued > 0 {
            return Ok(true);
        }
    }
    match store.maintain()? {
        Maintenance::Queued { .. } => return Ok(true),
        Maintenance::Switched { set, model } => {
            shared.tally().notes.push(format!(
                "every chunk has a vector of `{model}` (vector set {set}): search now uses it"
            ));
            return Ok(true);
        }
        Maintenance::Blocked { set, dead } if !options.follow => {
            let note = format!(
                "the backfill of vector set {set} cannot finish: {dead} documents are \
                 dead-lettered (`ragline dlq list`)"
            );
            let mut t = shared.tally();
            if !t.notes.contains(&note) {
                t.notes.push(note);
            }
        }
        Maintenance::Blocked { .. } | Maintenance::Nothing => {}
    }
    Ok(false)
}

/// Say what other workers still hold when this run ends: the run is not everything.
fn note_held<S: LifecycleStore>(
    store: &mut S,
    shared: &Shared<'_>,
    me: &Owner,
) -> Result<(), StoreError> {
    // This process's own workers may still be finishing theirs.
    let mine = |o: &str| o.split(':').take(2).eq(me.as_str().split(':').take(2));
    let held: Vec<_> = store
        .held_leases()?
        .into_iter()
        .filter(|h| !mine(&h.owner))
        .collect();
    let mut t = shared.tally();
    t.held_by_others = t.held_by_others.max(held.iter().map(|h| h.items).sum());
    for h in held {
        let until = crate::lifecycle::report::format_ms(h.until_ms);
        let note = format!(
            "{} documents are in progress under the lease of another worker ({}) until {until}; \
             they are not lost: run enrich again after that (or use --follow), or stop that \
             worker",
            h.items, h.owner
        );
        if !t.notes.contains(&note) {
            t.notes.push(note);
        }
    }
    Ok(())
}

fn note_paused(shared: &Shared<'_>) {
    let note = "a stage is paused: its work waits for `ragline resume`";
    tracing::info!("{note}");
    let mut t = shared.tally();
    if !t.notes.iter().any(|n| n == note) {
        t.notes.push(note.to_string());
    }
}

/// What a worker asks the store for: one claim for the model's stages, one per LLM stage
/// (its own lease, retry limit and batch size: a claim is about what its requests in flight
/// can answer within a lease). `lease`: instead of the stages' visibility timeouts.
fn claim_requests(
    options: &EnrichOptions,
    owner: &str,
    lease: Option<Duration>,
) -> Vec<ClaimRequest> {
    let llm_names: Vec<&str> = options.llm.iter().map(|l| l.name.as_str()).collect();
    let chunk_models: Vec<&str> = options.models.iter().map(|m| m.name()).collect();
    let model_stages: Vec<String> = options
        .stages
        .iter()
        .filter(|s| !llm_names.contains(&s.as_str()) && !chunk_models.contains(&s.as_str()))
        .cloned()
        .collect();
    let mut requests = Vec::new();
    if !model_stages.is_empty() {
        requests.push(ClaimRequest {
            owner: owner.to_string(),
            stages: model_stages,
            vector_sets: Vec::new(),
            max_items: options.claim_items,
            max_cost: options.claim_cost,
            lease: lease.unwrap_or(options.settings.visibility_timeout),
            retry_limit: options.settings.retry_limit,
        });
    }
    for m in options.working_models() {
        requests.push(ClaimRequest {
            owner: owner.to_string(),
            stages: vec![m.name().to_string()],
            vector_sets: Vec::new(),
            max_items: MODEL_STAGE_CLAIM,
            max_cost: u64::MAX,
            lease: lease.unwrap_or(m.settings.visibility_timeout),
            retry_limit: m.settings.retry_limit,
        });
    }
    for l in options
        .llm
        .iter()
        .filter(|l| options.stages.contains(&l.name))
    {
        requests.push(ClaimRequest {
            owner: owner.to_string(),
            stages: vec![l.name.clone()],
            vector_sets: Vec::new(),
            max_items: l.settings.concurrency.max(1) * 4,
            max_cost: u64::MAX,
            lease: lease.unwrap_or(l.settings.visibility_timeout),
            retry_limit: l.settings.retry_limit,
        });
    }
    requests
}

/// Claim with each request in turn, starting after the last that got work (so no stage
/// starves another); Idle with what every request said when none got any.
fn claim_next<S: LifecycleStore>(
    store: &mut S,
    requests: &[ClaimRequest],
    turn: &mut usize,
) -> Result<Claim, StoreError> {
    let (mut paused, mut next_due) = (false, None::<i64>);
    for k in 0..requests.len() {
        let i = (*turn + k) % requests.len();
        match store.claim(&requests[i])? {
            Claim::Items(items) => {
                *turn = i + 1;
                return Ok(Claim::Items(items));
            }
            Claim::Idle {
                paused: p,
                next_due: d,
            } => {
                paused |= p;
                next_due = match (next_due, d) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
    }
    Ok(Claim::Idle { paused, next_due })
}

/// One worker's loop.
fn work<S: EnrichStore>(mut w: EnrichWorker<S>, shared: &Shared<'_>) -> Result<(), StoreError> {
    let options = shared.options;
    let owner = Owner::this_process("enrich");
    let reaped = w.store.reap_dead_owners()?;
    if reaped > 0 {
        shared.tally().notes.push(format!(
            "took over {reaped} documents from workers whose process is gone"
        ));
    }
    let requests = claim_requests(options, owner.as_str(), None);
    let mut models: HashMap<i64, (SetModel, Recent)> = HashMap::new();
    let mut last_reap = Instant::now();
    let mut last_sync = Instant::now();
    let mut said_paused = false;
    let mut turn = 0usize;
    while !shared.signal.is_stopped() && !requests.is_empty() {
        let claim = claim_next(&mut w.store, &requests, &mut turn)?;
        match claim {
            Claim::Items(items) => {
                said_paused = false;
                // Tests: hold a claim (a worker killed or stuck right after claiming).
                #[cfg(feature = "failpoints")]
                fail::fail_point!("enrich::claimed");
                dispatch(&mut w, &mut models, &owner, items, shared)?;
            }
            Claim::Idle { paused, next_due } => {
                if housekeep(&mut w.store, shared, &mut last_sync)? {
                    continue;
                }
                if paused && !said_paused {
                    said_paused = true;
                    note_paused(shared);
                }
                // Without --follow: wait only for retries that are due soon, never for a
                // paused stage.
                let waiting_retry = next_due.filter(|d| *d > 0);
                if !options.follow && (paused || waiting_retry.is_none()) {
                    // Before leaving, take over once more what processes that died since the
                    // start still hold; what live ones hold is said, with its owner and end.
                    if w.store.reap_dead_owners()? > 0 {
                        continue;
                    }
                    note_held(&mut w.store, shared, &owner)?;
                    return Ok(());
                }
                let wait = match waiting_retry {
                    Some(due) if !options.follow => {
                        Duration::from_millis((due - now_ms()).clamp(1, 1000) as u64)
                    }
                    _ => options.idle_poll,
                };
                std::thread::sleep(wait);
                if last_reap.elapsed() > Duration::from_secs(5) {
                    last_reap = Instant::now();
                    w.store.reap_dead_owners()?;
                }
            }
        }
    }
    Ok(())
}
