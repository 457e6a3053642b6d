//! A run: connectors -> work queue -> workers -> (embed queue -> embedders) -> index queue ->
//! indexers, with every document tracked by the publisher through the event queue.
//!
//! No component calls another: each reads one bounded queue and writes the next. The
//! publisher's event loop runs on the calling thread and decides when the run is complete;
//! then every thread is told to stop and joined.

#[cfg(feature = "nats")]
pub mod distributed;
pub mod enrich;
pub mod progress;

pub mod summary;
pub mod worker;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::Scope;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::connectors::Connector;
use crate::document::{Document, RunId};
use crate::embed::pool::{EmbedQueues, EmbedderPool};
use crate::event::Event;
use crate::indexers::{Backend, BackendError, BackendFactory, BatchConfig, Indexer};
use crate::publisher::Publisher;
use crate::queue::memory::MemoryQueue;
use crate::queue::Queue;
use crate::signal::RunSignal;
use crate::stages::{Pipeline, PipelineFactory, StageError};
pub use crate::stats::RunStats;
pub use progress::{Observer, Snapshot};
pub use summary::RunSummary;
use worker::Routes;

/// Documents waiting for a worker, at most.
pub const DEFAULT_WORK_QUEUE: usize = 256;
/// Chunks waiting for the embedder, at most.
pub const DEFAULT_EMBED_QUEUE: usize = 4096;
/// Documents and chunks waiting for an indexer, at most.
pub const DEFAULT_INDEX_QUEUE: usize = 2048;
/// Events waiting for the publisher, at most.
pub const DEFAULT_EVENT_QUEUE: usize = 8192;

/// How a run is laid out.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// CPU worker threads.
    pub workers: usize,
    /// Indexer threads.
    pub indexers: usize,
    pub work_queue: usize,
    pub embed_queue: usize,
    pub index_queue: usize,
    pub event_queue: usize,
    pub batch: BatchConfig,
    /// How often the observer hears about progress.
    pub tick: Duration,
    /// Keep the ids of the published documents in the summary (to find documents gone from
    /// the source).
    pub track_ids: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            indexers: 1,
            work_queue: DEFAULT_WORK_QUEUE,
            embed_queue: DEFAULT_EMBED_QUEUE,
            index_queue: DEFAULT_INDEX_QUEUE,
            event_queue: DEFAULT_EVENT_QUEUE,
            batch: BatchConfig::default(),
            tick: Duration::from_millis(200),
            track_ids: false,
        }
    }
}

#[derive(Debug, Error)]
pub enum RunError {
    /// Something needed before the first document could not be set up (exit code 2).
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The run could not go on (a thread died, a queue broke).
    #[error("run aborted: {0}")]
    Aborted(String),
    /// The broker of a distributed run refused or failed a setup call (exit code 2).
    #[cfg(feature = "nats")]
    #[error(transparent)]
    Broker(#[from] crate::queue::jetstream::BrokerError),
}

impl From<StageError> for RunError {
    fn from(e: StageError) -> Self {
        RunError::Setup(e.to_string())
    }
}

/// Everything a run is made of.
pub struct RunParts<'a> {
    pub connectors: Vec<Box<dyn Connector>>,
    pub pipeline: &'a PipelineFactory,
    /// The embedder pool, when the run embeds chunks.
    pub embedder: Option<EmbedderPool>,
    pub backend: &'a dyn BackendFactory,
}

/// Run to completion and return the summary.
pub fn execute(
    parts: RunParts<'_>,
    options: &RunOptions,
    observer: &mut dyn Observer,
) -> Result<RunSummary, RunError> {
    let started = Instant::now();
    let run_id = RunId::generate();
    let wiring = Wiring::new(options, parts.embedder.is_some());
    let (signal, stats) = (&wiring.signal, &wiring.stats);
    let publisher = Publisher::new(
        run_id,
        Arc::clone(&wiring.work),
        Arc::clone(signal),
        options.track_ids,
    );

    // Set up everything that can fail before any thread starts.
    let pipelines = (0..options.workers.max(1))
        .map(|_| (parts.pipeline)())
        .collect::<Result<Vec<_>, _>>()?;
    let backends = (0..options.indexers.max(1))
        .map(|_| parts.backend.connect())
        .collect::<Result<Vec<_>, _>>()?;

    let complete = std::thread::scope(|scope| {
        wiring.spawn_connectors(scope, parts.connectors, publisher.clone());
        wiring.spawn_workers(scope, pipelines);
        wiring.spawn_embedders(scope, parts.embedder);
        wiring.spawn_indexers(scope, backends, &options.batch);

        let announced = || publisher.announced();
        let complete = publisher.follow_events(&wiring.events, options.tick, &mut |tracker| {
            observer.tick(&Snapshot {
                counts: tracker.counts(),
                pending: tracker.pending(),
                announced: announced(),
                elapsed: started.elapsed(),
                stats,
            });
        });
        signal.stop();
        complete
    });

    if let Some(reason) = signal.abort_reason() {
        return Err(RunError::Aborted(reason));
    }
    debug_assert!(complete, "the event loop ends complete unless aborted");
    let tracker = publisher.tracker();
    let mut summary = RunSummary::new(
        run_id,
        parts.backend.describe(),
        started.elapsed(),
        tracker.counts().clone(),
        tracker.failures().to_vec(),
        tracker.drops().to_vec(),
        stats,
    );
    drop(tracker);
    summary.published_ids = publisher.published_ids();
    summary.gone_ids = publisher.gone_ids();
    summary.fetched = publisher.fetched_counts();
    Ok(summary)
}

/// The bounded queues between a run's threads, with the run's stop signal and counters.
struct Wiring {
    work: Arc<dyn Queue<Document>>,
    index: Arc<dyn Queue<Document>>,
    events: Arc<dyn Queue<Event>>,
    /// Only when the run embeds chunks.
    embed: Option<Arc<dyn Queue<Document>>>,
    signal: Arc<RunSignal>,
    stats: Arc<RunStats>,
}

impl Wiring {
    /// The queues sized by `options`, with an embed queue when the run `embeds`.
    fn new(options: &RunOptions, embeds: bool) -> Self {
        let signal = Arc::new(RunSignal::new());
        let stats = Arc::new(RunStats::default());
        let work: Arc<dyn Queue<Document>> = Arc::new(MemoryQueue::new("work", options.work_queue));
        let index: Arc<dyn Queue<Document>> =
            Arc::new(MemoryQueue::new("index", options.index_queue));
        let events: Arc<dyn Queue<Event>> =
            Arc::new(MemoryQueue::new("events", options.event_queue));
        let embed: Option<Arc<dyn Queue<Document>>> = embeds.then(|| {
            Arc::new(MemoryQueue::new("embed", options.embed_queue)) as Arc<dyn Queue<Document>>
        });
        Wiring {
            work,
            index,
            events,
            embed,
            signal,
            stats,
        }
    }

    /// Start the thread that runs the connectors one after another, then says they stopped.
    fn spawn_connectors<'scope>(
        &self,
        scope: &'scope Scope<'scope, '_>,
        mut connectors: Vec<Box<dyn Connector>>,
        p: Publisher,
    ) {
        spawn_guarded(scope, "connector", &self.signal, move || {
            for connector in connectors.iter_mut() {
                if let Err(err) = connector.run(&p) {
                    if !p.signal().is_stopped() {
                        p.signal()
                            .abort(format!("connector {}: {err}", connector.name()));
                    }
                    return;
                }
            }
            p.connectors_stopped();
        });
    }

    /// Start one worker thread per pipeline, reading the work queue.
    fn spawn_workers<'scope>(&self, scope: &'scope Scope<'scope, '_>, pipelines: Vec<Pipeline>) {
        let routes = Routes {
            index: Arc::clone(&self.index),
            embed: self.embed.clone(),
            events: Arc::clone(&self.events),
            stats: Arc::clone(&self.stats),
        };
        for (i, pipeline) in pipelines.into_iter().enumerate() {
            let (input, routes, sig) = (
                Arc::clone(&self.work),
                routes.clone(),
                Arc::clone(&self.signal),
            );
            spawn_guarded(scope, &format!("worker-{i}"), &self.signal, move || {
                worker::work(pipeline, input, routes, sig)
            });
        }
    }

    /// Start one thread per embedder of the pool, from the embed queue to the index queue.
    fn spawn_embedders<'scope>(
        &self,
        scope: &'scope Scope<'scope, '_>,
        embedder: Option<EmbedderPool>,
    ) {
        if let (Some(pool), Some(embed)) = (embedder, &self.embed) {
            for (i, embedder) in pool.into_embedders().into_iter().enumerate() {
                let queues = EmbedQueues {
                    input: Arc::clone(embed),
                    output: Arc::clone(&self.index),
                    events: Arc::clone(&self.events),
                };
                let (sig, stats) = (Arc::clone(&self.signal), Arc::clone(&self.stats));
                spawn_guarded(scope, &format!("embedder-{i}"), &self.signal, move || {
                    embedder.run(queues, sig, stats)
                });
            }
        }
    }

    /// Start one indexer thread per backend connection, reading the index queue.
    fn spawn_indexers<'scope>(
        &self,
        scope: &'scope Scope<'scope, '_>,
        backends: Vec<Box<dyn Backend>>,
        batch: &BatchConfig,
    ) {
        for (i, backend) in backends.into_iter().enumerate() {
            let indexer = Indexer {
                backend,
                config: batch.clone(),
                input: Arc::clone(&self.index),
                events: Arc::clone(&self.events),
                signal: Arc::clone(&self.signal),
            };
            spawn_guarded(scope, &format!("indexer-{i}"), &self.signal, move || {
                indexer.run()
            });
        }
    }
}

/// Spawn a thread of the run; if it panics, the run aborts with the panic's message instead of
/// waiting forever for documents the thread held.
fn spawn_guarded<'scope, F>(
    scope: &'scope Scope<'scope, '_>,
    name: &str,
    signal: &Arc<RunSignal>,
    body: F,
) where
    F: FnOnce() + Send + 'scope,
{
    let inner = Arc::clone(signal);
    let name = name.to_string();
    let builder = std::thread::Builder::new().name(name.clone());
    let spawned = builder.spawn_scoped(scope, move || {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(body)) {
            let msg = crate::panics::message(&*panic);
            inner.abort(format!("thread {name} panicked: {msg}"));
        }
    });
    if let Err(e) = spawned {
        signal.abort(format!("cannot start a thread: {e}"));
    }
}
