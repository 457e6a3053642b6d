//! Counters the stages update while a run goes, for progress and the summary.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct RunStats {
    pub chunks_embedded: AtomicU64,
    /// Chunks that took the vector of an identical input (from the index, or embedded earlier
    /// in this run) instead of being embedded.
    pub chunks_reused: AtomicU64,
    /// Real (non-padding) tokens through the model.
    pub tokens_embedded: AtomicU64,
    /// Tokens computed including padding.
    pub tokens_padded: AtomicU64,
    pub batches: AtomicU64,
    /// What stages had to say about documents they processed all the same (`page 3 has no
    /// text layer: needs OCR`), in the order they were said.
    pub warnings: Mutex<Vec<Warning>>,
}

/// A stage's warning about one document that went on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    pub id: String,
    pub stage: &'static str,
    pub message: String,
}

impl RunStats {
    pub fn add_batch(&self, chunks: u64, tokens: u64, padded: u64) {
        self.chunks_embedded.fetch_add(chunks, Ordering::Relaxed);
        self.tokens_embedded.fetch_add(tokens, Ordering::Relaxed);
        self.tokens_padded.fetch_add(padded, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    pub fn warn(&self, id: &str, stage: &'static str, message: &str) {
        let warning = Warning {
            id: id.to_string(),
            stage,
            message: message.to_string(),
        };
        let mut warnings = self.warnings.lock().unwrap_or_else(|e| e.into_inner());
        // A document delivered twice warns once.
        if !warnings.contains(&warning) {
            warnings.push(warning);
        }
    }

    pub fn warnings(&self) -> Vec<Warning> {
        self.warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn chunks(&self) -> u64 {
        self.chunks_embedded.load(Ordering::Relaxed)
    }

    pub fn reused(&self) -> u64 {
        self.chunks_reused.load(Ordering::Relaxed)
    }

    pub fn tokens(&self) -> u64 {
        self.tokens_embedded.load(Ordering::Relaxed)
    }

    pub fn padded(&self) -> u64 {
        self.tokens_padded.load(Ordering::Relaxed)
    }
}
