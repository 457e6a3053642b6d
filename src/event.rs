//! The events through which a run tracks every document: CREATE for a child, and one terminal
//! event (FINISH, FAIL or DROP) for every document, parent or child.

use serde::{Deserialize, Serialize};

use crate::document::{Document, RunId};

/// What happened to a document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EventKind {
    /// A stage made a child document: one more document to wait for.
    Create,
    /// The document reached the index (or was already there, unchanged).
    Finish {
        /// True when the index already held this exact document and no work was done.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        unchanged: bool,
    },
    /// The document failed at `stage`.
    Fail { stage: String, reason: String },
    /// A stage decided the document goes no further (empty, binary, filtered...).
    Drop { stage: String, reason: String },
    /// A message on the run's queue `lane` that no process could read (corrupt, or not
    /// ragline's): it names no document, so it is no document's event. The message was taken
    /// off its queue; the run reports it (the event's `doc_id` names the message).
    Unreadable { lane: String, reason: String },
}

impl EventKind {
    /// FINISH, FAIL and DROP: the end of a document.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            EventKind::Finish { .. } | EventKind::Fail { .. } | EventKind::Drop { .. }
        )
    }
}

/// One event on the event queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub run_id: RunId,
    /// The document instance (see [`Document::instance`]): what the publisher tracks.
    pub instance: u64,
    pub doc_id: String,
    /// For a child: its parent's instance and id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_instance: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// On a terminal event: how many children stages made from this document. The publisher
    /// expects that many CREATEs naming it as parent, whatever order they arrive in.
    #[serde(default)]
    pub children: u32,
    pub kind: EventKind,
    /// On a terminal event: the document was delivered more than once on its way (a broker
    /// redelivered it after a process died or timed out).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redelivered: bool,
    /// On a chunk's FINISH: the model tokens its vector was computed from in this run.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Event {
    /// The CREATE event for a child document.
    pub fn create(child: &Document) -> Self {
        Event {
            run_id: child.run_id,
            instance: child.instance,
            doc_id: child.id.clone(),
            parent_instance: child.parent_instance,
            parent_id: child.parent_id.clone(),
            children: 0,
            kind: EventKind::Create,
            redelivered: false,
            tokens: 0,
        }
    }

    /// A terminal event for `doc`.
    pub fn terminal(doc: &Document, kind: EventKind) -> Self {
        debug_assert!(kind.is_terminal());
        Event {
            run_id: doc.run_id,
            instance: doc.instance,
            doc_id: doc.id.clone(),
            parent_instance: doc.parent_instance,
            parent_id: doc.parent_id.clone(),
            children: doc.children,
            kind,
            redelivered: doc.redelivered,
            tokens: doc.embedded_tokens,
        }
    }

    pub fn finish(doc: &Document) -> Self {
        Self::terminal(
            doc,
            EventKind::Finish {
                unchanged: doc.unchanged,
            },
        )
    }

    pub fn fail(doc: &Document, stage: &str, reason: impl Into<String>) -> Self {
        Self::terminal(
            doc,
            EventKind::Fail {
                stage: stage.to_string(),
                reason: reason.into(),
            },
        )
    }

    pub fn drop(doc: &Document, stage: &str, reason: impl Into<String>) -> Self {
        Self::terminal(
            doc,
            EventKind::Drop {
                stage: stage.to_string(),
                reason: reason.into(),
            },
        )
    }
}
