//! Runs across processes: the publishing side (`ragline ingest --queue`) and the roles
//! (`ragline worker`, `embedder`, `indexer`), all on one broker ([`Broker`]).
//!
//! The publishing process records the run (settings and state) in the broker, creates its
//! consumers, runs the connectors and the publisher, and follows the run's events until it is
//! complete, exactly as an in-process run does: the tracker's rule and counts are the same,
//! and duplicates from redelivery are ignored by it. Messages the broker gave up on
//! (MaxDeliver) become FAIL events for their documents. At the end it marks the run complete
//! and removes what is left of it on the broker.
//!
//! A role process waits for a run, sets itself up from the run's record (the caller's
//! `setup`, from the `pipeline` layer), and runs the same loops as the in-process engine
//! (`worker::work`, `Embedder::run`, `Indexer::run`) on the run's queues, until the run is
//! complete or the process is told to stop (SIGTERM: finish what it holds, acknowledge,
//! exit; what it pulled and did not start goes back to the broker at once).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::connectors::Connector;
use crate::document::{Document, RunId};
use crate::embed::pool::{EmbedQueues, EmbedderPool};
use crate::event::{Event, EventKind};
use crate::indexers::{BackendFactory, BatchConfig, Indexer};
use crate::publisher::Publisher;
use crate::queue::jetstream::{
    Broker, BrokerError, Lane, RoleNote, RoleState, RunRecord, RunState,
};
use crate::queue::wire::Wire;
use crate::queue::Queue;
use crate::signal::RunSignal;
use crate::stages::PipelineFactory;
use crate::stats::RunStats;

use super::progress::{Observer, Snapshot};
use super::worker::{self, Routes};
use super::{RunError, RunSummary};

/// Documents one worker process pulls ahead.
const WORK_PREFETCH: usize = 128;
/// How long a published run waits for a worker to join before saying so.
const JOIN_WARNING: Duration = Duration::from_secs(60);
/// Chunks one embedder pulls ahead of its window.
const EMBED_PREFETCH: usize = 256;

/// How the publishing side reports: the index's name for the summary, whether to keep the
/// published ids (for --prune), how often the observer hears about progress, and who hears
/// of messages the broker gave up on.
pub struct PublishOptions {
    pub backend_name: String,
    pub track_ids: bool,
    pub tick: Duration,
    /// Told of every message that reached MaxDeliver, after its document's FAIL is queued
    /// (the caller dead-letters it in the index). An error is reported and the run goes on.
    pub dead_letters: Option<DeadLetterSink>,
}

/// A message the broker stopped delivering after MaxDeliver deliveries.
#[derive(Debug)]
pub struct DeadMessage {
    pub lane: Lane,
    /// The document (or chunk) it carried.
    pub document: Document,
    /// The message as it was published (the wire form of `document`).
    pub payload: Bytes,
    pub deliveries: u32,
    /// What the run's summary says of it.
    pub reason: String,
}

/// Where a publishing process sends its dead messages.
pub type DeadLetterSink =
    Box<dyn FnMut(&DeadMessage) -> Result<(), crate::lifecycle::StoreError> + Send>;

/// Publish a run through the broker and follow it to completion.
pub fn publish(
    broker: &Broker,
    run_id: RunId,
    record: &RunRecord,
    connectors: Vec<Box<dyn Connector>>,
    options: PublishOptions,
    observer: &mut dyn Observer,
) -> Result<RunSummary, RunError> {
    let PublishOptions {
        backend_name,
        track_ids,
        tick,
        dead_letters: mut sink,
    } = options;
    let started = Instant::now();
    broker.create_consumers(run_id)?;
    broker.put_run(record)?;
    let signal = Arc::new(RunSignal::new());
    let stats = Arc::new(RunStats::default());
    let work: Arc<dyn Queue<Document>> =
        Arc::new(broker.queue::<Document>(Lane::Work, run_id, None));
    let events: Arc<dyn Queue<Event>> =
        Arc::new(broker.follower::<Event>(Lane::Events, run_id, 4096));
    let dead = broker.dead_letters(run_id)?;
    let publisher = Publisher::new(run_id, Arc::clone(&work), Arc::clone(&signal), track_ids);

    let complete = std::thread::scope(|scope| {
        let p = publisher.clone();
        let sig = Arc::clone(&signal);
        scope.spawn(move || publish_sources(&p, connectors, &sig));
        // Messages the broker stopped delivering become FAILs of their documents.
        let dead_letters = DeadLetters {
            events: Arc::new(broker.queue::<Event>(Lane::Events, run_id, None)),
            signal: Arc::clone(&signal),
            max_deliver: broker.config().max_deliver,
            run_id,
        };
        scope.spawn(move || dead_letters.forward(&dead, sink.as_mut()));
        // What the roles make of the run: refusals and departures said as they happen, and a
        // run no worker joined said after a minute.
        let (sig, run) = (Arc::clone(&signal), record.run.clone());
        scope.spawn(move || watch_roles(broker, &run, &sig, join_warning()));

        let announced = || publisher.announced();
        let complete = publisher.follow_events(&events, tick, &mut |tracker| {
            observer.tick(&Snapshot {
                counts: tracker.counts(),
                pending: tracker.pending(),
                announced: announced(),
                elapsed: started.elapsed(),
                stats: &stats,
            });
        });
        signal.stop();
        complete
    });
    let state = if complete {
        RunState::Complete
    } else {
        RunState::Aborted
    };
    let mut done = record.clone();
    done.state = state;
    broker.put_run(&done)?;
    drop(events);
    broker.remove_run(run_id)?;
    if let Some(reason) = signal.abort_reason() {
        return Err(RunError::Aborted(reason));
    }
    Ok(summary_of(
        &publisher,
        run_id,
        backend_name,
        started,
        &stats,
    ))
}

/// The run's summary, from what its events said.
fn summary_of(
    publisher: &Publisher,
    run_id: RunId,
    backend_name: String,
    started: Instant,
    stats: &RunStats,
) -> RunSummary {
    let tracker = publisher.tracker();
    let mut summary = RunSummary::new(
        run_id,
        backend_name,
        started.elapsed(),
        tracker.counts().clone(),
        tracker.failures().to_vec(),
        tracker.drops().to_vec(),
        stats,
    );
    // The embedders are other processes: what they did is what the chunks' FINISHes say.
    let (chunks, tokens) = tracker.embedded();
    summary.unreadable = tracker.unreadable().to_vec();
    drop(tracker);
    summary.chunks_embedded = chunks;
    summary.tokens_embedded = tokens;
    summary.tokens_per_sec = tokens as f64 / started.elapsed().as_secs_f64().max(1e-9);
    summary.published_ids = publisher.published_ids();
    summary.gone_ids = publisher.gone_ids();
    summary.fetched = publisher.fetched_counts();
    summary
}

/// [`JOIN_WARNING`], or with the `test-hooks` feature `RAGLINE_TEST_JOIN_WARNING_SECS` (a test
/// need not wait a minute).
fn join_warning() -> Duration {
    let test = cfg!(feature = "test-hooks")
        .then(|| std::env::var("RAGLINE_TEST_JOIN_WARNING_SECS").ok())
        .flatten()
        .and_then(|s| s.parse().ok());
    test.map_or(JOIN_WARNING, Duration::from_secs)
}

/// Follow the roles' notes on `run` until the run stops: each refusal and departure is
/// warned of once, with its reason; when no worker has joined after `join_warning`, that is
/// said once (with the refusals so far, the likely reason).
fn watch_roles(broker: &Broker, run: &str, sig: &RunSignal, join_warning: Duration) {
    let started = Instant::now();
    let mut said: Vec<RoleNote> = Vec::new();
    let mut warned = false;
    let mut last = Instant::now() - Duration::from_secs(1);
    while !sig.is_stopped() {
        std::thread::sleep(Duration::from_millis(50));
        if last.elapsed() < Duration::from_millis(500) {
            continue;
        }
        last = Instant::now();
        let Ok(notes) = broker.role_notes(run) else {
            continue; // the broker is away: the next look
        };
        for note in &notes {
            if note.state == RoleState::Joined || said.contains(note) {
                continue;
            }
            let reason = note.reason.as_deref().unwrap_or("no reason given");
            match note.state {
                RoleState::Refused => tracing::warn!(
                    target: crate::NOTE,
                    "the {} at {} refused run {run}: {reason}",
                    note.role,
                    note.process
                ),
                RoleState::Left => tracing::warn!(
                    target: crate::NOTE,
                    "the {} at {} left run {run}: {reason}",
                    note.role,
                    note.process
                ),
                RoleState::Joined => {}
            }
            said.push(note.clone());
        }
        let joined = notes
            .iter()
            .any(|n| n.role == Role::Worker.name() && n.state == RoleState::Joined);
        if !warned && !joined && started.elapsed() >= join_warning {
            warned = true;
            let refused = notes
                .iter()
                .filter(|n| n.role == Role::Worker.name() && n.state == RoleState::Refused)
                .count();
            tracing::warn!(
                target: crate::NOTE,
                "no worker has joined run {run} in {} s{}: start `ragline worker --queue {}` \
                 (with the same --index), or look at the workers' logs",
                join_warning.as_secs(),
                if refused > 0 {
                    format!(" ({refused} refused it, said above)")
                } else {
                    String::new()
                },
                broker.config().describe()
            );
        }
    }
}

/// The connectors' thread of a published run: each connector in turn, then the end of the
/// sources; a connector's error or panic aborts the run.
fn publish_sources(p: &Publisher, mut connectors: Vec<Box<dyn Connector>>, sig: &RunSignal) {
    let result = catch_unwind(AssertUnwindSafe(|| {
        for connector in connectors.iter_mut() {
            if let Err(err) = connector.run(p) {
                if !p.signal().is_stopped() {
                    p.signal()
                        .abort(format!("connector {}: {err}", connector.name()));
                }
                return;
            }
        }
        p.connectors_stopped();
    }));
    if result.is_err() {
        sig.abort("the connector panicked");
    }
}

/// Turns the messages the broker stopped delivering (MaxDeliver) into events: the FAIL of
/// the document a message carried (then the sink dead-letters it in the index), or an
/// unreadable message when it carried no document at all.
struct DeadLetters {
    events: Arc<dyn Queue<Event>>,
    signal: Arc<RunSignal>,
    max_deliver: i64,
    run_id: RunId,
}

impl DeadLetters {
    fn forward(
        &self,
        dead: &crossbeam_channel::Receiver<(Lane, Bytes)>,
        mut sink: Option<&mut DeadLetterSink>,
    ) {
        let max = self.max_deliver;
        while !self.signal.is_stopped() {
            let Ok((lane, payload)) = dead.recv_timeout(Duration::from_millis(100)) else {
                continue;
            };
            let doc = match Document::decode(&payload) {
                Ok(doc) => doc,
                Err(e) => {
                    if self.push(self.unreadable(lane, &e.to_string())).is_err() {
                        return;
                    }
                    continue;
                }
            };
            let reason = format!(
                "delivered {max} times (MaxDeliver) without being finished: the {} process \
                 handling it died or timed out every time; look for a crash on this document \
                 in that role's log",
                role_of(lane)
            );
            let fail = EventKind::Fail {
                stage: lane.name().to_string(),
                reason: reason.clone(),
            };
            let event = Event {
                redelivered: true,
                ..Event::terminal(&doc, fail)
            };
            if self.push(event).is_err() {
                return;
            }
            if let Some(sink) = sink.as_mut() {
                let dead = DeadMessage {
                    lane,
                    document: doc,
                    payload,
                    deliveries: max.max(1) as u32,
                    reason,
                };
                if let Err(e) = sink(&dead) {
                    tracing::warn!(
                        "{}: could not dead-letter it in the index: {e}",
                        dead.document.id
                    );
                }
            }
        }
    }

    /// The event of a message that is not a document at all.
    fn unreadable(&self, lane: Lane, error: &str) -> Event {
        Event {
            run_id: self.run_id,
            instance: 0,
            doc_id: format!("message on {} (MaxDeliver)", lane.name()),
            parent_instance: None,
            parent_id: None,
            children: 0,
            kind: EventKind::Unreadable {
                lane: lane.name().to_string(),
                reason: format!("unreadable message ({error}): dead-lettered"),
            },
            redelivered: false,
            tokens: 0,
        }
    }

    fn push(&self, event: Event) -> Result<(), ()> {
        crate::queue::push_until_stopped(&self.events, event, &self.signal).map_err(|_| ())
    }
}

fn role_of(lane: Lane) -> &'static str {
    match lane {
        Lane::Work => "worker",
        Lane::Embed => "embedder",
        Lane::Index => "indexer",
        Lane::Events => "ingest",
    }
}

/// Which role a process plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Worker,
    Embedder,
    Indexer,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Embedder => "embedder",
            Role::Indexer => "indexer",
        }
    }
}

/// What a role process runs for one run, made by the caller from the run's record.
pub enum RoleParts {
    Worker {
        pipeline: Box<PipelineFactory>,
        threads: usize,
        /// Chunks go to the embedders (false: straight to the indexers).
        embeds: bool,
    },
    Embedder {
        pool: EmbedderPool,
    },
    Indexer {
        backend: Arc<dyn BackendFactory>,
        threads: usize,
        batch: BatchConfig,
    },
}

/// What a role did for one run.
#[derive(Debug, Default)]
pub struct RoleReport {
    pub run: String,
    pub elapsed: Duration,
    pub warnings: usize,
    pub chunks_embedded: u64,
}

/// Serve runs as `role` until `stop` is set (SIGTERM) or, with `once`, after one run.
/// `setup` makes the role's parts from a run's record; an error from it refuses the run (the
/// process exits with it). `log` hears what the role is doing.
pub fn serve(
    broker: &Broker,
    role: Role,
    once: bool,
    stop: &Arc<AtomicBool>,
    setup: &mut dyn FnMut(&RunRecord) -> Result<RoleParts, RunError>,
    log: &mut dyn FnMut(&str),
) -> Result<Vec<RoleReport>, RunError> {
    let mut reports = Vec::new();
    let mut announced_wait = false;
    while !stop.load(Ordering::Relaxed) {
        let runs = broker.list_runs()?;
        let Some(record) = runs.into_iter().find(|r| r.state == RunState::Running) else {
            if !announced_wait {
                log(&format!(
                    "{}: waiting for a run on {}",
                    role.name(),
                    broker.config().describe()
                ));
                announced_wait = true;
            }
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        announced_wait = false;
        let run_id = parse_run(&record.run)?;
        log(&format!("{}: joining run {}", role.name(), record.run));
        let note = |state: RoleState, reason: Option<String>| {
            let note = RoleNote {
                run: record.run.clone(),
                role: role.name().to_string(),
                process: crate::lifecycle::owner::process_name(),
                state,
                reason,
            };
            // Best effort: the run goes on (or the error is returned) either way.
            if let Err(e) = broker.put_role_note(&note) {
                tracing::warn!(
                    "cannot tell the publisher what this {} did: {e}",
                    role.name()
                );
            }
        };
        let parts = match setup(&record) {
            Ok(parts) => parts,
            Err(e) => {
                note(RoleState::Refused, Some(e.to_string()));
                return Err(e);
            }
        };
        note(RoleState::Joined, None);
        let report = match serve_run(broker, run_id, &record.run, parts, stop) {
            Ok(report) => report,
            Err(e) => {
                note(RoleState::Left, Some(e.to_string()));
                return Err(e);
            }
        };
        log(&format!(
            "{}: run {} is over after {:.1}s",
            role.name(),
            report.run,
            report.elapsed.as_secs_f64()
        ));
        reports.push(report);
        if once {
            break;
        }
    }
    Ok(reports)
}

fn parse_run(s: &str) -> Result<RunId, BrokerError> {
    u64::from_str_radix(s, 16).map(RunId).map_err(|_| {
        BrokerError::Message(format!("the broker holds a run record with a bad id `{s}`"))
    })
}

/// Stop this process's part of a run when the run's record says it is over (checked every
/// 300 ms), or on SIGTERM (`stop`).
fn watch_run(broker: &Broker, run: &str, sig: &RunSignal, stop: &AtomicBool) {
    let mut last_check = Instant::now();
    while !sig.is_stopped() {
        if stop.load(Ordering::Relaxed) {
            sig.stop();
            break;
        }
        if last_check.elapsed() >= Duration::from_millis(300) {
            last_check = Instant::now();
            match broker.get_run(run) {
                Ok(Some(r)) if r.state == RunState::Running => {}
                Ok(_) => sig.stop(),
                Err(_) => {} // broker away: keep going, the client reconnects
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run one role's loops on one run until the run is no longer running or `stop` is set.
fn serve_run(
    broker: &Broker,
    run_id: RunId,
    run: &str,
    parts: RoleParts,
    stop: &Arc<AtomicBool>,
) -> Result<RoleReport, RunError> {
    let started = Instant::now();
    let lanes = RunLanes {
        broker,
        run_id,
        signal: Arc::new(RunSignal::new()),
        stats: Arc::new(RunStats::default()),
        events: Arc::new(broker.queue::<Event>(Lane::Events, run_id, None)),
        index_out: Arc::new(broker.queue::<Document>(Lane::Index, run_id, None)),
    };
    std::thread::scope(|scope| -> Result<(), RunError> {
        // The run ends for this process when its record says so, or on SIGTERM.
        let (sig, stop2) = (Arc::clone(&lanes.signal), Arc::clone(stop));
        let watcher = scope.spawn(move || watch_run(broker, run, &sig, &stop2));
        let done = match parts {
            RoleParts::Worker {
                pipeline,
                threads,
                embeds,
            } => lanes.work(&pipeline, threads, embeds),
            RoleParts::Embedder { pool } => {
                lanes.embed(pool);
                Ok(())
            }
            RoleParts::Indexer {
                backend,
                threads,
                batch,
            } => lanes.index(backend.as_ref(), threads, &batch),
        };
        lanes.signal.stop();
        let _ = watcher.join();
        done
    })?;
    // Everything this process pushed is stored before it says it is done.
    broker.flush(Duration::from_secs(30));
    if let Some(reason) = lanes.signal.abort_reason() {
        return Err(RunError::Aborted(reason));
    }
    for w in lanes.stats.warnings() {
        tracing::warn!("{}: {}: {}", w.id, w.stage, w.message);
    }
    Ok(RoleReport {
        run: run.to_string(),
        elapsed: started.elapsed(),
        warnings: lanes.stats.warnings().len(),
        chunks_embedded: lanes.stats.chunks(),
    })
}

/// What one role's threads of a run share: the run's lanes on the broker, its signal and its
/// counts.
struct RunLanes<'b> {
    broker: &'b Broker,
    run_id: RunId,
    signal: Arc<RunSignal>,
    stats: Arc<RunStats>,
    events: Arc<dyn Queue<Event>>,
    index_out: Arc<dyn Queue<Document>>,
}

impl RunLanes<'_> {
    /// The run's documents on `lane`, `prefetch` held at once (None: the lane's default).
    fn documents(&self, lane: Lane, prefetch: Option<usize>) -> Arc<dyn Queue<Document>> {
        Arc::new(self.broker.queue::<Document>(lane, self.run_id, prefetch))
    }

    /// Workers: extract, chunk and tokenize, `threads` at once, until the run stops.
    fn work(
        &self,
        pipeline: &PipelineFactory,
        threads: usize,
        embeds: bool,
    ) -> Result<(), RunError> {
        let input = self.documents(Lane::Work, Some(WORK_PREFETCH.max(threads * 4)));
        let routes = Routes {
            index: Arc::clone(&self.index_out),
            embed: embeds.then(|| self.documents(Lane::Embed, None)),
            events: Arc::clone(&self.events),
            stats: Arc::clone(&self.stats),
        };
        std::thread::scope(|scope| {
            let mut handles = Vec::new();
            for _ in 0..threads.max(1) {
                let p = pipeline().map_err(|e| RunError::Setup(e.to_string()))?;
                let (input, routes, sig) =
                    (Arc::clone(&input), routes.clone(), Arc::clone(&self.signal));
                handles.push(scope.spawn(move || worker::work(p, input, routes, sig)));
            }
            for h in handles {
                let _ = h.join();
            }
            Ok(())
        })
    }

    /// Embedders: one thread per device of the pool, until the run stops.
    fn embed(&self, pool: EmbedderPool) {
        let input = self.documents(Lane::Embed, Some(EMBED_PREFETCH));
        std::thread::scope(|scope| {
            let mut handles = Vec::new();
            for embedder in pool.into_embedders() {
                let queues = EmbedQueues {
                    input: Arc::clone(&input),
                    output: Arc::clone(&self.index_out),
                    events: Arc::clone(&self.events),
                };
                let (sig, stats) = (Arc::clone(&self.signal), Arc::clone(&self.stats));
                handles.push(scope.spawn(move || embedder.run(queues, sig, stats)));
            }
            for h in handles {
                let _ = h.join();
            }
        });
    }

    /// Indexers: `threads` connections writing batches, until the run stops.
    fn index(
        &self,
        backend: &dyn BackendFactory,
        threads: usize,
        batch: &BatchConfig,
    ) -> Result<(), RunError> {
        let prefetch = batch.max_items.max(1) * threads.max(1);
        let input = self.documents(Lane::Index, Some(prefetch));
        std::thread::scope(|scope| {
            let mut handles = Vec::new();
            for _ in 0..threads.max(1) {
                let indexer = Indexer {
                    backend: backend
                        .connect()
                        .map_err(|e| RunError::Setup(e.to_string()))?,
                    config: batch.clone(),
                    input: Arc::clone(&input),
                    events: Arc::clone(&self.events),
                    signal: Arc::clone(&self.signal),
                };
                handles.push(scope.spawn(move || indexer.run()));
            }
            for h in handles {
                let _ = h.join();
            }
            Ok(())
        })
    }
}
