//! The run's bookkeeping: which documents are still pending, and the exact counts.
//!
//! A pure state machine, fed by the publisher (documents published) and by the event queue
//! (CREATE, FINISH, FAIL, DROP), so it can be property-tested against any interleaving.
//!
//! It tracks document *instances* (see [`crate::document::Document::instance`]), not ids: the
//! same id published twice is two instances and needs two terminal events (the pending "bag"
//! is a multiset of ids), and an event delivered twice names the same instance and is counted
//! once (at-least-once delivery keeps the counts exact).
//!
//! Invariants:
//! - An instance *arrives* when it is published or its CREATE is seen, and *departs* at its
//!   first terminal event. Either can come first: a terminal event before its CREATE is held
//!   in the ledger of early completions (`open` counts instances that have one of the two
//!   and not the other) and reconciled when the CREATE arrives.
//! - Each terminal event says how many children its document had; each CREATE names its
//!   parent instance. `expected` holds, per parent instance, children announced minus CREATEs
//!   seen, so a parent that finished before its children's CREATEs arrived cannot make the run
//!   look complete.
//! - The run is complete only when the connector has stopped, the event queue is drained,
//!   nothing is open and no child is expected. Any one of these alone is not enough.

use std::collections::HashMap;

use serde::Serialize;

use crate::document::RunId;
use crate::event::{Event, EventKind};

/// Exact counts of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Documents the connectors published (a file that could not be read counts: it was
    /// published and failed).
    pub published: u64,
    /// Parent documents that reached the index.
    pub indexed: u64,
    /// Parent documents the index already held unchanged (a subset of `indexed`).
    pub unchanged: u64,
    pub failed: u64,
    pub dropped: u64,
    /// Children (chunks) stages created.
    pub children_created: u64,
    pub children_indexed: u64,
    pub children_failed: u64,
    pub children_dropped: u64,
    /// Documents (parents and children) a broker delivered more than once on their way.
    pub redelivered: u64,
    /// Messages on the run's queues that no process could read (each dead-lettered, none a
    /// document of the run).
    pub unreadable: u64,
}

/// A document that failed or was dropped, with where and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    pub stage: String,
    pub reason: String,
}

/// What [`RunTracker::apply`] did with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The event was counted.
    Counted,
    /// The same event (same instance, same role) was seen before: ignored.
    Duplicate,
    /// The event belongs to another run: ignored.
    OtherRun,
}

const ARRIVED: u8 = 1;
const DEPARTED: u8 = 2;

#[derive(Debug)]
pub struct RunTracker {
    run_id: RunId,
    /// ARRIVED | DEPARTED bits per instance seen. Completed instances stay, so that a late
    /// duplicate is recognised instead of being taken for new work.
    states: HashMap<u64, u8>,
    /// Instances with exactly one of the two bits: pending (arrived) or early (departed).
    open: u64,
    /// Of `open`, those that departed before they arrived (the early-completion ledger).
    early: u64,
    expected: HashMap<u64, i64>,
    next_instance: u64,
    connector_stopped: bool,
    counts: Counts,
    failures: Vec<Outcome>,
    drops: Vec<Outcome>,
    /// Messages no process could read, by the message they name (counted once each).
    unreadable: Vec<Outcome>,
    /// Chunks whose FINISH says they were embedded in this run, and their model tokens.
    embedded: (u64, u64),
}

impl RunTracker {
    pub fn new(run_id: RunId) -> Self {
        RunTracker {
            run_id,
            states: HashMap::new(),
            open: 0,
            early: 0,
            expected: HashMap::new(),
            next_instance: 1,
            connector_stopped: false,
            counts: Counts::default(),
            failures: Vec::new(),
            drops: Vec::new(),
            unreadable: Vec::new(),
            embedded: (0, 0),
        }
    }

    /// Chunks embedded in this run and their model tokens, as their FINISH events say (what
    /// a distributed run's publisher knows of its embedders' work).
    pub fn embedded(&self) -> (u64, u64) {
        self.embedded
    }

    pub fn run_id(&self) -> RunId {
        self.run_id
    }

    /// A connector publishes a document: returns its instance number.
    pub fn publish(&mut self) -> u64 {
        let instance = self.next_instance;
        self.next_instance += 1;
        self.counts.published += 1;
        self.mark(instance, ARRIVED);
        instance
    }

    /// Every connector has stopped publishing.
    pub fn connector_stopped(&mut self) {
        self.connector_stopped = true;
    }

    pub fn apply(&mut self, event: &Event) -> Applied {
        if event.run_id != self.run_id {
            return Applied::OtherRun;
        }
        let child = event.parent_instance.is_some();
        if let EventKind::Unreadable { lane, reason } = &event.kind {
            // Not a document: nothing is pending on it. The same message reported twice
            // (redelivered before it was taken off) counts once.
            if self.unreadable.iter().any(|o| o.id == event.doc_id) {
                return Applied::Duplicate;
            }
            self.counts.unreadable += 1;
            self.unreadable.push(outcome(event, lane, reason));
            return Applied::Counted;
        }
        if event.kind == EventKind::Create {
            if !self.mark(event.instance, ARRIVED) {
                return Applied::Duplicate;
            }
            self.counts.children_created += 1;
            if let Some(parent) = event.parent_instance {
                add(&mut self.expected, parent, -1);
            }
            return Applied::Counted;
        }
        if !self.mark(event.instance, DEPARTED) {
            return Applied::Duplicate;
        }
        self.counts.redelivered += u64::from(event.redelivered);
        if event.tokens > 0 {
            self.embedded.0 += 1;
            self.embedded.1 += u64::from(event.tokens);
        }
        if event.children > 0 {
            add(
                &mut self.expected,
                event.instance,
                i64::from(event.children),
            );
        }
        match &event.kind {
            EventKind::Create | EventKind::Unreadable { .. } => unreachable!("handled above"),
            EventKind::Finish { unchanged } => {
                if child {
                    self.counts.children_indexed += 1;
                } else {
                    self.counts.indexed += 1;
                    self.counts.unchanged += u64::from(*unchanged);
                }
            }
            EventKind::Fail { stage, reason } => {
                if child {
                    self.counts.children_failed += 1;
                } else {
                    self.counts.failed += 1;
                }
                self.failures.push(outcome(event, stage, reason));
            }
            EventKind::Drop { stage, reason } => {
                if child {
                    self.counts.children_dropped += 1;
                } else {
                    self.counts.dropped += 1;
                }
                self.drops.push(outcome(event, stage, reason));
            }
        }
        Applied::Counted
    }

    /// Complete when the connector has stopped, the event queue is drained, and nothing is
    /// pending, early or expected.
    pub fn is_complete(&self, event_queue_empty: bool) -> bool {
        self.connector_stopped && event_queue_empty && self.open == 0 && self.expected.is_empty()
    }

    /// Documents published or created and not yet terminal.
    pub fn pending(&self) -> u64 {
        self.open - self.early
    }

    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    pub fn failures(&self) -> &[Outcome] {
        &self.failures
    }

    pub fn drops(&self) -> &[Outcome] {
        &self.drops
    }

    /// Messages no process could read: the message, the queue and why.
    pub fn unreadable(&self) -> &[Outcome] {
        &self.unreadable
    }

    pub fn into_outcomes(self) -> (Counts, Vec<Outcome>, Vec<Outcome>) {
        (self.counts, self.failures, self.drops)
    }

    /// Set `bit` on `instance`; false when it was already set (a duplicate).
    fn mark(&mut self, instance: u64, bit: u8) -> bool {
        let state = self.states.entry(instance).or_insert(0);
        if *state & bit != 0 {
            return false;
        }
        *state |= bit;
        if *state == ARRIVED | DEPARTED {
            self.open -= 1;
            if bit == ARRIVED {
                self.early -= 1;
            }
        } else {
            self.open += 1;
            if bit == DEPARTED {
                self.early += 1;
            }
        }
        true
    }
}

fn add(map: &mut HashMap<u64, i64>, instance: u64, delta: i64) {
    let n = map.entry(instance).or_insert(0);
    *n += delta;
    if *n == 0 {
        map.remove(&instance);
    }
}

fn outcome(event: &Event, stage: &str, reason: &str) -> Outcome {
    Outcome {
        id: event.doc_id.clone(),
        parent_id: event.parent_id.clone(),
        stage: stage.to_string(),
        reason: reason.to_string(),
    }
}
