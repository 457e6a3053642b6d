//! The enrichment lifecycle: per-document, per-stage state, and the pure rules over it.
//!
//! Each document carries a status per stage (`chunk`, `embed`, ...): pending, in progress,
//! done, failed (will retry) or dead (in the dead-letter queue), with a priority, the attempts
//! made, a backoff deadline, a lease (owner and expiry), the fingerprint of the stage's
//! settings, and every attempt's error. The store keeps it beside the document ([`store`]
//! says what a store must do; `indexers/sqlite` does it), and on one machine the store is the
//! durable work queue: a worker claims a batch with a lease in one transaction and completes
//! it in the transaction that writes the results.
//!
//! This module holds what does not depend on a store: stage names and their dependencies,
//! statuses and priorities, per-stage settings, backoff, and lease owners.

pub mod backoff;
pub mod graph;
pub mod owner;
pub mod report;
pub mod rules;
pub mod store;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use graph::{GraphError, StageGraph};
pub use owner::Owner;
pub use store::{
    Annotations, ChunkSparse, ChunkText, ChunkVector, Claim, ClaimRequest, DeliveryFailure,
    DocumentEntity, DocumentLabel, DocumentText, EnrichStore, EntityMention, KnownDocument,
    KnownPage, LifecycleStore, Maintenance, PendingChunk, SparseModelRecord, StoreError,
    StoredVectors, WorkItem, WorkKey,
};

/// The chunk stage: done by `ingest` (extract, chunk, write documents and chunks).
pub const CHUNK: &str = "chunk";
/// The embed stage: every chunk of the document has a vector in a vector set.
pub const EMBED: &str = "embed";
/// The sparse stage: every chunk of the document has its sparse (SPLADE) vector in the
/// index's postings, from the index's sparse model. A document-level stage: one row per
/// document, queued like the LLM stages (a new version of the document, or another sparse
/// model, makes it stale).
pub const SPARSE: &str = "sparse";
/// The entities stage: named entities of the document's chunks (a token-classification
/// model), gathered per document. Document-level, queued like `sparse`.
pub const ENTITIES: &str = "entities";
/// The labels stage: the document's labels (a sequence-classification model over its chunks,
/// their scores averaged weighted by tokens). Document-level, queued like `sparse`.
pub const LABELS: &str = "labels";
/// A stage that does nothing, for measuring the queue itself (benches/lifecycle.rs).
pub const NOOP: &str = "noop";

/// Stages `enrich` can work, in the order `ragline status` lists them.
pub const STAGES: &[&str] = &[CHUNK, EMBED, SPARSE, ENTITIES, LABELS];

/// Whether `enrich` can work a stage (chunking needs the source, so only `ingest` does it):
/// `embed`, `sparse`, `noop` and the document-level stages a config names (LLM stages).
pub fn is_enrichable(stage: &str) -> bool {
    matches!(stage, EMBED | SPARSE | ENTITIES | LABELS | NOOP) || is_stage_name(stage)
}

/// Whether `name` can name a document-level stage of a config (an LLM stage): lowercase
/// letters, digits and `_`, starting with a letter, and not a built-in stage.
pub fn is_stage_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !matches!(name, CHUNK | EMBED | SPARSE | ENTITIES | LABELS | NOOP)
        && name.len() <= 40
}

/// Where a document stands in one stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting to be claimed.
    Pending,
    /// Claimed by a worker whose lease has not expired.
    InProgress,
    Done,
    /// The last attempt failed; it will be retried after its backoff.
    Failed,
    /// Failed as many times as the stage allows: in the dead-letter queue.
    Dead,
}

impl Status {
    pub const ALL: [Status; 5] = [
        Status::Pending,
        Status::InProgress,
        Status::Failed,
        Status::Dead,
        Status::Done,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::InProgress => "in_progress",
            Status::Done => "done",
            Status::Failed => "failed",
            Status::Dead => "dead",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Status::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| format!("unknown status `{s}`"))
    }
}

/// Which work goes first: interactive (documents a search hit while unembedded) over fresh
/// (new and changed documents) over backfill (a model migration). FIFO within a level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Backfill = 0,
    Fresh = 1,
    Interactive = 2,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Backfill => "backfill",
            Priority::Fresh => "fresh",
            Priority::Interactive => "interactive",
        }
    }

    pub fn level(self) -> i64 {
        self as i64
    }

    pub fn from_level(level: i64) -> Priority {
        match level {
            i64::MIN..=0 => Priority::Backfill,
            1 => Priority::Fresh,
            _ => Priority::Interactive,
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Priority {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "backfill" => Ok(Priority::Backfill),
            "fresh" => Ok(Priority::Fresh),
            "interactive" => Ok(Priority::Interactive),
            _ => Err(format!(
                "unknown priority `{s}`: use interactive, fresh or backfill"
            )),
        }
    }
}

/// Attempts a stage gets before its work is dead-lettered.
pub const DEFAULT_RETRY_LIMIT: u32 = 5;
/// Wait before the first retry; doubled each attempt, with jitter.
pub const DEFAULT_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between retries.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(300);
/// How long a claim holds its work before another worker may take it (renewed while a long
/// batch runs).
pub const DEFAULT_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(300);

/// How a stage's work is retried, leased and prioritised.
#[derive(Clone, Debug, PartialEq)]
pub struct StageSettings {
    pub retry_limit: u32,
    pub backoff: Duration,
    pub max_backoff: Duration,
    pub visibility_timeout: Duration,
    /// Worker threads of this stage in one `enrich` process.
    pub concurrency: usize,
    /// The priority new work of this stage is queued at.
    pub priority: Priority,
}

impl Default for StageSettings {
    fn default() -> Self {
        StageSettings {
            retry_limit: DEFAULT_RETRY_LIMIT,
            backoff: DEFAULT_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            visibility_timeout: DEFAULT_VISIBILITY_TIMEOUT,
            concurrency: 1,
            priority: Priority::Fresh,
        }
    }
}

/// Milliseconds since the Unix epoch: how the store records times.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_priorities_order() {
        for s in Status::ALL {
            assert_eq!(s.as_str().parse::<Status>().unwrap(), s);
        }
        assert!(Priority::Interactive > Priority::Fresh && Priority::Fresh > Priority::Backfill);
        for p in [Priority::Backfill, Priority::Fresh, Priority::Interactive] {
            assert_eq!(Priority::from_level(p.level()), p);
            assert_eq!(p.as_str().parse::<Priority>().unwrap(), p);
        }
        assert!(!is_enrichable(CHUNK) && is_enrichable(EMBED) && is_enrichable("summary"));
        assert!(!is_stage_name("Summary") && !is_stage_name("embed") && !is_stage_name(""));
        assert!(is_enrichable(SPARSE) && !is_stage_name(SPARSE));
        assert!(is_enrichable(ENTITIES) && is_enrichable(LABELS) && !is_stage_name(LABELS));
    }
}
