//! The publisher: the one place that knows when a run is done.
//!
//! Connectors publish documents through it: it stamps each with the run id and an instance
//! number, records it as pending, and puts it on the work queue. It then reads the event queue
//! (CREATE from workers, FINISH/FAIL/DROP from workers and indexers) until the run is complete
//! (see [`tracker`] for the exact rule).

pub mod tracker;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::document::{Document, RunId};
use crate::event::{Event, EventKind};
use crate::queue::wire::Wire;
use crate::queue::{push_until_stopped, Queue, Stopped, POLL};
use crate::signal::RunSignal;
pub use tracker::{Applied, Counts, Outcome, RunTracker};

/// The publishing side, shared by connectors (cheap to clone).
#[derive(Clone)]
pub struct Publisher {
    run_id: RunId,
    tracker: Arc<Mutex<RunTracker>>,
    work: Arc<dyn Queue<Document>>,
    signal: Arc<RunSignal>,
    /// How many documents the connectors announced they will publish (0: unknown).
    announced: Arc<AtomicU64>,
    /// The ids published, when the run needs them (to find documents gone from the source).
    ids: Option<Arc<Mutex<HashSet<String>>>>,
    /// What connectors that download (object stores) fetched.
    fetched: Arc<FetchCounters>,
    /// The ids the source said are gone (see [`Publisher::publish_gone`]).
    gone: Arc<Mutex<Vec<String>>>,
}

/// What connectors that download items (object stores) fetched, for the run's summary: a
/// re-run with nothing changed shows it downloaded nothing.
#[derive(Default)]
struct FetchCounters {
    /// A connector that fetches ran (the summary then shows the counts, zeros included).
    counted: std::sync::atomic::AtomicBool,
    items: AtomicU64,
    bytes: AtomicU64,
}

/// What was downloaded during a run (see [`Publisher::count_fetches`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Fetched {
    /// Items downloaded (objects, pages).
    pub items: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl Publisher {
    pub fn new(
        run_id: RunId,
        work: Arc<dyn Queue<Document>>,
        signal: Arc<RunSignal>,
        track_ids: bool,
    ) -> Self {
        Publisher {
            run_id,
            tracker: Arc::new(Mutex::new(RunTracker::new(run_id))),
            work,
            signal,
            announced: Arc::new(AtomicU64::new(0)),
            ids: track_ids.then(|| Arc::new(Mutex::new(HashSet::new()))),
            fetched: Arc::default(),
            gone: Arc::default(),
        }
    }

    /// A connector that downloads says so before it starts: the run's summary then shows what
    /// was fetched (zero included).
    pub fn count_fetches(&self) {
        self.fetched.counted.store(true, Ordering::Relaxed);
    }

    /// One item downloaded, `bytes` long.
    pub fn fetched(&self, bytes: u64) {
        self.fetched.items.fetch_add(1, Ordering::Relaxed);
        self.fetched.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// What was downloaded, when a connector that downloads ran.
    pub fn fetched_counts(&self) -> Option<Fetched> {
        self.fetched
            .counted
            .load(Ordering::Relaxed)
            .then(|| Fetched {
                items: self.fetched.items.load(Ordering::Relaxed),
                bytes: self.fetched.bytes.load(Ordering::Relaxed),
            })
    }

    fn remember(&self, id: &str) {
        if let Some(ids) = &self.ids {
            ids.lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id.to_string());
        }
    }

    /// The ids published so far, when tracked.
    pub fn published_ids(&self) -> Option<HashSet<String>> {
        self.ids
            .as_ref()
            .map(|ids| ids.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// The ids the source said are gone during the run.
    pub fn gone_ids(&self) -> Vec<String> {
        self.gone.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn run_id(&self) -> RunId {
        self.run_id
    }

    pub fn signal(&self) -> &Arc<RunSignal> {
        &self.signal
    }

    /// Stamp the document, count it as pending, and queue it for the workers. Waits while the
    /// work queue is full (backpressure); fails only when the run is stopped meanwhile.
    pub fn publish(&self, mut doc: Document) -> Result<(), Stopped> {
        if let Some(reason) = self.too_large(&doc) {
            let source = doc.fields.source.clone();
            self.publish_failed(&doc.id, source.as_deref(), "queue", &reason);
            return Ok(());
        }
        doc.run_id = self.run_id;
        doc.instance = self.tracker().publish();
        self.remember(&doc.id);
        push_until_stopped(&self.work, doc, &self.signal)
    }

    /// Why the work queue cannot carry the document (a broker's largest message), if so.
    fn too_large(&self, doc: &Document) -> Option<String> {
        let limit = self.work.max_item_bytes()?;
        let rough = doc.fields.text.len() + doc.raw.as_ref().map_or(0, Vec::len);
        if rough < limit / 2 {
            return None;
        }
        let size = Wire::encode(doc).len();
        (size > limit).then(|| {
            format!(
                "the document is {size} bytes on the wire, more than the broker's largest \
                 message ({limit} bytes): raise `max_payload` in the nats-server configuration \
                 (up to 64 MB), or ingest this file without --queue"
            )
        })
    }

    /// A document the connector found but could not make (unreadable, not UTF-8...): it is
    /// counted as published and failed at `stage`, with the reason.
    pub fn publish_failed(&self, id: &str, source: Option<&str>, stage: &str, reason: &str) {
        self.publish_terminal(
            id,
            source,
            EventKind::Fail {
                stage: stage.to_string(),
                reason: reason.to_string(),
            },
        );
    }

    /// A document the connector found and decided not to process (empty, binary...): counted
    /// as published and dropped at `stage`, with the reason.
    pub fn publish_dropped(&self, id: &str, source: Option<&str>, stage: &str, reason: &str) {
        self.publish_terminal(
            id,
            source,
            EventKind::Drop {
                stage: stage.to_string(),
                reason: reason.to_string(),
            },
        );
    }

    /// An item the source says is gone (a page answering 404 or 410, a broker's delete
    /// message): counted as dropped with the reason, not seen by the run, and listed as gone,
    /// so `--prune` removes what the index holds of it.
    pub fn publish_gone(&self, id: &str, source: Option<&str>, stage: &str, reason: &str) {
        self.gone
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id.to_string());
        self.publish_event(
            id,
            source,
            EventKind::Drop {
                stage: stage.to_string(),
                reason: reason.to_string(),
            },
        );
    }

    fn publish_terminal(&self, id: &str, source: Option<&str>, kind: EventKind) {
        self.remember(id);
        self.publish_event(id, source, kind);
    }

    fn publish_event(&self, id: &str, source: Option<&str>, kind: EventKind) {
        let mut doc = Document::new(id, String::new());
        doc.run_id = self.run_id;
        doc.fields.source = source.map(str::to_string);
        let mut tracker = self.tracker();
        doc.instance = tracker.publish();
        tracker.apply(&Event::terminal(&doc, kind));
    }

    /// Connectors may announce how many documents they will publish, for the progress ETA.
    pub fn announce(&self, documents: u64) {
        self.announced.fetch_add(documents, Ordering::Relaxed);
    }

    pub fn announced(&self) -> u64 {
        self.announced.load(Ordering::Relaxed)
    }

    /// Every connector has stopped: from now on the run can complete.
    pub fn connectors_stopped(&self) {
        self.tracker().connector_stopped();
    }

    /// The tracker, for progress snapshots and the final summary.
    pub fn tracker(&self) -> MutexGuard<'_, RunTracker> {
        // A panic while holding this lock would be a bug in the tracker itself; its state is
        // still the best account of the run, so keep using it.
        self.tracker.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Read events until the run is complete or stopped. `tick` is called at least every
    /// `tick_every` with the tracker, for progress display. Returns true when the run is
    /// complete, false when it was stopped (aborted) first.
    pub fn follow_events(
        &self,
        events: &Arc<dyn Queue<Event>>,
        tick_every: Duration,
        tick: &mut dyn FnMut(&RunTracker),
    ) -> bool {
        const BATCH: usize = 512;
        let mut last_tick = Instant::now();
        loop {
            if self.signal.is_stopped() {
                return false;
            }
            let first = match events.pop(POLL) {
                Ok(first) => first,
                Err(err) => {
                    self.signal.abort(format!("event queue failed: {err}"));
                    return false;
                }
            };
            let mut tracker = self.tracker();
            if let Some(delivery) = first {
                tracker.apply(&delivery.item);
                let _ = events.ack(delivery.tag);
                // Apply what is already queued under the same lock.
                for _ in 1..BATCH {
                    match events.pop(Duration::ZERO) {
                        Ok(Some(delivery)) => {
                            tracker.apply(&delivery.item);
                            let _ = events.ack(delivery.tag);
                        }
                        _ => break,
                    }
                }
            }
            if tracker.is_complete(events.is_empty()) {
                tick(&tracker);
                self.signal.stop();
                return true;
            }
            if last_tick.elapsed() >= tick_every {
                tick(&tracker);
                last_tick = Instant::now();
            }
        }
    }
}

#[cfg(test)]
mod tests;
