//! Stages: the CPU work done on each document by the worker pool. A stage turns one document
//! into zero or more documents: itself (possibly dropped) plus children.
//!
//! Each worker owns its own [`Pipeline`] of stage instances, so stages may keep compiled
//! patterns, tokenizers and buffers without locks.

pub mod chunk;
pub mod extract;
pub mod incremental;
pub mod noop;
pub mod pipeline;
pub mod reuse;

use thiserror::Error;

use crate::document::Document;
pub use pipeline::{Pipeline, PipelineOutput};

/// Why a stage could not process a document. The document fails; the run goes on.
#[derive(Debug, Error)]
pub enum StageError {
    /// The document itself is unusable; the message names the problem and the fix.
    #[error("{0}")]
    BadDocument(String),
    /// The stage's own machinery failed on this document (a model error, an I/O error).
    #[error("{0}")]
    Internal(String),
}

/// One step of the per-document work.
pub trait Stage: Send {
    /// The stage's name, as it appears in FAIL and DROP events.
    fn name(&self) -> &'static str;

    /// Process `doc` in place. To stop it here, call `doc.drop_with(reason)`. Children
    /// returned go through the stages after this one; make them with `doc.child(...)`.
    fn process(&mut self, doc: &mut Document) -> Result<Vec<Document>, StageError>;
}

/// Makes one pipeline per worker.
pub type PipelineFactory = dyn Fn() -> Result<Pipeline, StageError> + Send + Sync;
