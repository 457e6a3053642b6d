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
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::connectors::Connector;
use crate::document::{Document, RunId};
use crate::embed::pool::{EmbedQueues, EmbedderPool};
use crate::event::Event;
use crate::indexers::{BackendError, BackendFactory, BatchConfig, Indexer};
use crate::publisher::Publisher;
use crate::queue::memory::MemoryQueue;
use crate::queue::Queue;
use crate::signal::RunSignal;
use crate::stages::{PipelineFactory, StageError};
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
    let signal = Arc::new(RunSignal::new());
    let stats = Arc::new(RunStats::default());
    let work: Arc<dyn Queue<Document>> = Arc::new(MemoryQueue::new("work", options.work_queue));
    let index: Arc<dyn Queue<Document>> = Arc::new(MemoryQueue::new("index", options.index_queue));
    let events: Arc<dyn Queue<Event>> = Arc::new(MemoryQueue::new("events", options.event_queue));
    let embed: Option<Arc<dyn Queue<Document>>> = parts.embedder.as_ref().map(|_| {
        Arc::new(MemoryQueue::new("embed", options.embed_queue)) as Arc<dyn Queue<Document>>
    });
    let publisher = Publisher::new(
        run_id,
        Arc::clone(&work),
        Arc::clone(&signal),
        options.track_ids,
    );

    // Set up everything that can fail before any thread starts.
    let pipelines = (0..options.workers.max(1))
        .map(|_| (parts.pipeline)())
        .collect::<Result<Vec<_>, _>>()?;
    let backends = (0..options.indexers.max(1))
        .map(|_| parts.backend.connect())
        .collect::<Result<Vec<_>, _>>()?;
    let routes = Routes {
        index: Arc::clone(&index),
        embed: embed.clone(),
        events: Arc::clone(&events),
        stats: Arc::clone(&stats),
    };

    let complete = std::thread::scope(|scope| {
        let mut connectors = parts.connectors;
        let p = publisher.clone();
        spawn_guarded(scope, "connector", &signal, move || {
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
        for (i, pipeline) in pipelines.into_iter().enumerate() {
            let (input, routes, sig) = (Arc::clone(&work), routes.clone(), Arc::clone(&signal));
            spawn_guarded(scope, &format!("worker-{i}"), &signal, move || {
                worker::work(pipeline, input, routes, sig)
            });
        }
        if let (Some(pool), Some(embed)) = (parts.embedder, &embed) {
            for (i, embedder) in pool.into_embedders().into_iter().enumerate() {
                let queues = EmbedQueues {
                    input: Arc::clone(embed),
                    output: Arc::clone(&index),
                    events: Arc::clone(&events),
                };
                let (sig, stats) = (Arc::clone(&signal), Arc::clone(&stats));
                spawn_guarded(scope, &format!("embedder-{i}"), &signal, move || {
                    embedder.run(queues, sig, stats)
                });
            }
        }
        for (i, backend) in backends.into_iter().enumerate() {
            let indexer = Indexer {
                backend,
                config: options.batch.clone(),
                input: Arc::clone(&index),
                events: Arc::clone(&events),
                signal: Arc::clone(&signal),
            };
            spawn_guarded(scope, &format!("indexer-{i}"), &signal, move || {
                indexer.run()
            });
        }

        let announced = || publisher.announced();
        let complete = publisher.follow_events(&events, options.tick, &mut |tracker| {
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
        &stats,
    );
    drop(tracker);
    summary.published_ids = publisher.published_ids();
    Ok(summary)
}

/// Spawn a thread of the run; if it panics, the run aborts with the panic's message instead of
/// waiting forever for documents the thread held.
fn spawn_guarded<'scope, F>(
    scope: &'scope std::thread::Scope<'scope, '_>,
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
