//! The end of a run: exact counts, every failure and drop, and rates.

use std::time::Duration;

use serde::Serialize;

use crate::document::RunId;
use crate::publisher::{Counts, Outcome};
use crate::stats::RunStats;

#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    pub run_id: String,
    pub index: String,
    pub elapsed_secs: f64,
    pub counts: Counts,
    pub chunks_embedded: u64,
    /// Chunks whose vector was not computed again: the index held one for the same model
    /// input, or an identical chunk of this run was embedded.
    pub chunks_reused: u64,
    pub tokens_embedded: u64,
    /// Share of the tokens computed by the model that were padding.
    pub padding_ratio: f64,
    pub documents_per_sec: f64,
    pub tokens_per_sec: f64,
    /// Every document that failed, with the stage and the reason.
    pub failures: Vec<Outcome>,
    /// Every document that was dropped, with the stage and the reason.
    pub dropped: Vec<Outcome>,
    /// Messages on the run's queues that no process could read, each dead-lettered with the
    /// reason (distributed runs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<Outcome>,
    /// Documents indexed with something to say (`page 3 has no text layer: needs OCR`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<Outcome>,
    /// Documents the index holds that the source no longer has (filled in by the caller).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing_from_source: Vec<String>,
    /// Of those, how many were deleted (`--prune`).
    pub pruned: u64,
    /// Which encoder and kernels embedded ("fused CPU encoder, f32 on the avx512 kernels").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoder: Option<String>,
    /// What the calls to a service (a remote embedder) came to: requests, retries, 429s...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<crate::http::RemoteCounts>,
    /// `enrich`: documents other workers still held under a lease when this run ended (the
    /// notes say whose, and until when).
    #[serde(skip_serializing_if = "is_zero")]
    pub held_by_others: u64,
    /// What connectors that download (object stores) fetched: a re-run with nothing changed
    /// fetches nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fetched: Option<crate::publisher::Fetched>,
    /// What else the run has to say (a migration switched, a stage is paused...).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The ids published, when the run tracked them.
    #[serde(skip)]
    pub published_ids: Option<std::collections::HashSet<String>>,
    /// The ids the source said are gone (a page answering 404, a broker's delete message).
    #[serde(skip)]
    pub gone_ids: Vec<String>,
}

impl RunSummary {
    pub fn new(
        run_id: RunId,
        index: String,
        elapsed: Duration,
        counts: Counts,
        failures: Vec<Outcome>,
        dropped: Vec<Outcome>,
        stats: &RunStats,
    ) -> Self {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let padded = stats.padded();
        RunSummary {
            run_id: run_id.to_string(),
            index,
            elapsed_secs: elapsed.as_secs_f64(),
            documents_per_sec: counts.published as f64 / secs,
            counts,
            chunks_embedded: stats.chunks(),
            chunks_reused: stats.reused(),
            tokens_embedded: stats.tokens(),
            padding_ratio: if padded == 0 {
                0.0
            } else {
                1.0 - stats.tokens() as f64 / padded as f64
            },
            tokens_per_sec: stats.tokens() as f64 / secs,
            failures,
            dropped,
            unreadable: Vec::new(),
            warnings: stats
                .warnings()
                .into_iter()
                .map(|w| Outcome {
                    id: w.id,
                    parent_id: None,
                    stage: w.stage.to_string(),
                    reason: w.message,
                })
                .collect(),
            missing_from_source: Vec::new(),
            pruned: 0,
            encoder: None,
            remote: None,
            held_by_others: 0,
            fetched: None,
            notes: Vec::new(),
            published_ids: None,
            gone_ids: Vec::new(),
        }
    }

    /// True when no document or chunk failed and every message of the run could be read.
    pub fn succeeded(&self) -> bool {
        self.counts.failed == 0 && self.counts.children_failed == 0 && self.counts.unreadable == 0
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
