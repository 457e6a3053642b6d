//! Indexers: threads that take finished documents from the index queue, write them to a
//! backend in bulk, and report FINISH or FAIL per document.
//!
//! A backend is chosen by a URI (`jsonl:out.jsonl`, `null:`, `sqlite://rag.db`). Its bulk
//! write returns one result per item: only failed items are retried, only for retryable
//! causes, with backoff; a document's terminal event and its queue acknowledgement come only
//! after the backend has accepted it.

pub mod batch;
pub mod jsonl;
pub mod null;
pub mod sqlite;
pub mod uri;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use thiserror::Error;

use crate::document::Document;
pub use crate::lifecycle::{KnownDocument, StoredVectors};
pub use batch::{BatchConfig, Indexer};
pub use uri::IndexUri;

/// Why one item of a bulk write failed.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("{message}")]
pub struct ItemError {
    /// True for causes worth retrying (busy, timeout, a 429 or 5xx); false for the item itself
    /// being unacceptable, which a retry cannot fix.
    pub retryable: bool,
    pub message: String,
}

impl ItemError {
    pub fn retryable(message: impl Into<String>) -> Self {
        ItemError {
            retryable: true,
            message: message.into(),
        }
    }

    pub fn permanent(message: impl Into<String>) -> Self {
        ItemError {
            retryable: false,
            message: message.into(),
        }
    }
}

/// A backend that cannot be opened or used at all: the run cannot start (exit code 2).
#[derive(Debug, Error)]
pub enum BackendError {
    #[error("unknown index URI `{0}`: use sqlite://PATH, jsonl:PATH or null:")]
    UnknownScheme(String),
    #[error("cannot write `{path}`: {source}; choose a writable location with --index")]
    Unwritable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("index error: {0}")]
    Io(String),
}

/// One indexer thread's connection to the backend.
pub trait Backend: Send {
    /// Write a batch; one result per item, in order.
    fn write(&mut self, batch: &[Document]) -> Vec<Result<(), ItemError>>;

    /// Make everything written so far durable.
    fn flush(&mut self) -> Result<(), BackendError>;
}

/// A backend's shared side: opened once per run, hands out one [`Backend`] per indexer thread.
pub trait BackendFactory: Send + Sync {
    /// The URI, for messages.
    fn describe(&self) -> String;

    fn connect(&self) -> Result<Box<dyn Backend>, BackendError>;

    /// What the index holds completely, by document id (empty for backends that cannot
    /// tell): the incremental stage skips these when their content is unchanged.
    fn known_documents(&self) -> Result<HashMap<String, KnownDocument>, BackendError> {
        Ok(HashMap::new())
    }

    /// A reader of the vectors the index holds, for backends that can look them up by input
    /// (None for the others: their chunks are always embedded).
    fn stored_vectors(&self) -> Result<Option<Box<dyn StoredVectors>>, BackendError> {
        Ok(None)
    }

    /// Every document id in the index, or None for backends that cannot tell (files).
    fn document_ids(&self) -> Result<Option<HashSet<String>>, BackendError> {
        Ok(None)
    }

    /// Delete documents and their chunks; how many were deleted.
    fn delete_documents(&self, ids: &[String]) -> Result<usize, BackendError> {
        let _ = ids;
        Err(BackendError::Invalid(format!(
            "{} cannot delete documents",
            self.describe()
        )))
    }
}

/// Open the backend a URI names for a run with `identity`, checking it is usable before the
/// run starts.
pub fn open(
    uri: &IndexUri,
    identity: sqlite::IndexIdentity,
) -> Result<Box<dyn BackendFactory>, BackendError> {
    match uri {
        IndexUri::Jsonl(path) => Ok(Box::new(jsonl::JsonlFactory::create(path)?)),
        IndexUri::Null { delay } => Ok(Box::new(null::NullFactory { delay: *delay })),
        IndexUri::Sqlite(path) => Ok(Box::new(sqlite::SqliteFactory::open(path, identity)?)),
    }
}
