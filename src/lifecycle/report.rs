//! What the lifecycle reports to operators, whatever the store: `ragline status`, the
//! dead-letter queue, a document's history. Plain data, serialised as the commands' JSON.

use std::collections::BTreeMap;

use serde::Serialize;

/// Documents of one stage by status.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StageCounts {
    pub pending: u64,
    pub in_progress: u64,
    pub failed: u64,
    pub dead: u64,
    pub done: u64,
    pub paused: bool,
    /// Seconds the oldest pending (or failed) document has waited since it was queued.
    pub oldest_pending_secs: Option<f64>,
    /// Of the pending and failed documents, those waiting for a stage this one depends on
    /// (`depends_on`) to be done for their current version.
    pub waiting_on_dependency: u64,
    /// The stage's service keeps failing: its circuit is open (why, and since when). Its
    /// workers wait and probe; nothing fails for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub circuit: Option<CircuitOpen>,
}

/// An open circuit, as `ragline status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CircuitOpen {
    pub reason: String,
    /// Milliseconds since the epoch.
    pub since: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VectorSetStatus {
    pub id: i64,
    pub model: String,
    pub dimension: usize,
    /// Current chunks with a vector in this set.
    pub embedded: u64,
    /// Current chunks.
    pub total: u64,
    /// The set search uses.
    pub active: bool,
    /// active, backfill or retired.
    pub state: String,
    /// Its approximate nearest-neighbour index, where the backend keeps one beside it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ann: Option<AnnStatus>,
}

/// A vector set's ANN as `status` shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AnnStatus {
    /// `building` or `ready`.
    pub state: String,
    /// f16, int8 or binary.
    pub dtype: String,
    /// Vectors in its file.
    pub vectors: u64,
    /// Changes since the file was saved (replayed by readers, applied by the next writer).
    pub changes_pending: u64,
    /// The search's ef: measured for `recall_target` (or the default where unmeasured).
    pub ef: u64,
    /// The recall@10 measured at that ef on held-out stored vectors (None: unmeasured).
    pub recall: Option<f64>,
    pub recall_target: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackfillProgress {
    pub vector_set: i64,
    pub model: String,
    /// The last document id queued: a killed backfill goes on after it.
    pub watermark: Option<String>,
    /// Every document has been queued.
    pub all_queued: bool,
    pub documents_total: u64,
    pub documents_queued: u64,
    pub documents_done: u64,
    pub chunks_embedded: u64,
    pub chunks_total: u64,
    /// Its documents by status.
    pub stage: StageCounts,
}

/// `ragline status --json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatusReport {
    pub index: String,
    pub documents: u64,
    pub chunks: u64,
    /// Per stage (`embed`: in the active vector set).
    pub stages: BTreeMap<String, StageCounts>,
    pub vector_sets: Vec<VectorSetStatus>,
    pub backfill: Option<BackfillProgress>,
    /// The last hour, per minute with any work: documents chunked and chunks embedded.
    pub activity: Vec<MinuteActivity>,
    /// The model of the index's sparse vectors, when it has them (as it was named).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sparse_model: Option<String>,
}

/// What a minute saw done.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MinuteActivity {
    /// The minute's start, ms since the epoch.
    pub minute: i64,
    pub documents: u64,
    pub chunks: u64,
}

/// A document in the dead-letter queue.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeadLetter {
    pub document_id: String,
    pub stage: String,
    pub vector_set: i64,
    pub attempts: u32,
    pub last_error: Option<String>,
    /// When it went dead (ms since the epoch).
    pub dead_since: i64,
}

/// One failed attempt.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AttemptError {
    pub attempt: u32,
    /// ms since the epoch.
    pub at: i64,
    pub worker: String,
    pub message: String,
}

/// A document's state in one stage, with every attempt's error.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageState {
    pub stage: String,
    pub vector_set: i64,
    pub status: String,
    pub priority: String,
    pub attempts: u32,
    pub not_before: Option<i64>,
    pub lease_owner: Option<String>,
    pub lease_expires: Option<i64>,
    pub enqueued_at: i64,
    pub claimed_at: Option<i64>,
    pub claim_seq: Option<i64>,
    pub done_at: Option<i64>,
    pub errors: Vec<AttemptError>,
}

/// `ragline dlq show DOC_ID`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DocumentLifecycle {
    pub document_id: String,
    pub source: Option<String>,
    pub title: Option<String>,
    pub chunks: u64,
    pub stages: Vec<StageState>,
}

/// A time in ms since the epoch, as UTC.
pub fn format_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms.rem_euclid(1000)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_print_as_utc() {
        assert_eq!(super::format_ms(0), "1970-01-01 00:00:00.000Z");
        assert_eq!(
            super::format_ms(1_796_083_200_123),
            "2026-12-01 00:00:00.123Z"
        );
    }
}
