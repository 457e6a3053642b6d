//! Indexers: threads that take finished documents from the index queue, write them to a
//! backend in bulk, and report FINISH or FAIL per document.
//!
//! A backend is chosen by a URI (`sqlite://rag.db`, `postgres://...`, `parquet:out.parquet`,
//! `jsonl:out.jsonl`, `null:`). Its bulk
//! write returns one result per item: only failed items are retried, only for retryable
//! causes, with backoff; a document's terminal event and its queue acknowledgement come only
//! after the backend has accepted it.

mod admin;
pub mod ann;
pub mod batch;
pub mod facets;
pub mod filter;
mod identity;
pub mod jsonl;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod meta;
pub mod null;
mod open;
#[cfg(feature = "parquet")]
pub mod parquet;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod sqlite;
pub mod store;
pub mod synthetic;
pub mod uri;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use thiserror::Error;

use crate::document::Document;
pub use crate::lifecycle::{KnownDocument, KnownPage, StoredVectors};
pub use batch::{BatchConfig, Indexer};
pub use identity::{IndexIdentity, ModelIdentity};
pub use meta::{ChunkRow, IndexMeta};
pub use open::{files_bytes, open, open_reader, open_store};
pub use store::{Burial, IndexStore, SetState, StoredCopy, VectorSet};
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

/// What no index can take, whatever its database says (every writer checks each item with
/// this before writing): a chunk in an index opened without a model (its vector could never
/// be computed), a vector of another dimension than the index's, a vector with NaN or
/// infinite values (no distance is defined for it: pgvector refuses it, sqlite-vec would store
/// it and rank it anywhere).
pub(crate) fn check_item(doc: &Document, dimension: Option<usize>) -> Result<(), ItemError> {
    let Some(chunk) = doc.chunk.as_deref() else {
        return Ok(());
    };
    if doc.unchanged {
        return Ok(());
    }
    let Some(d) = dimension else {
        return Err(ItemError::permanent(
            "this index was opened without a model; its chunks could never get vectors: \
             run with a model (not --no-chunk)",
        ));
    };
    match chunk.vector.as_deref() {
        None => Ok(()),
        Some(v) if v.len() != d => Err(ItemError::permanent(format!(
            "vector of {} dimensions in an index of {d}",
            v.len()
        ))),
        Some(v) if v.iter().any(|x| !x.is_finite()) => {
            Err(ItemError::permanent(crate::document::NON_FINITE_VECTOR))
        }
        Some(_) => Ok(()),
    }
}

/// A backend that cannot be opened or used at all: the run cannot start (exit code 2).
#[derive(Debug, Error)]
pub enum BackendError {
    #[error(
        "unknown index URI `{0}`: use sqlite://PATH, postgres://USER@HOST:PORT/DB, \
         parquet:PATH, jsonl:PATH or null:"
    )]
    UnknownScheme(String),
    #[error("cannot write `{path}`: {source}; choose a writable location with --index")]
    Unwritable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    /// The place holds no ragline index (yet): the message says how to make one.
    #[error("{0}")]
    NoIndex(String),
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

    /// How many writers a run connects when it is not told: one (a file has one writer);
    /// a database server takes writes on several connections at once.
    fn writers(&self) -> usize {
        1
    }

    /// What the index holds completely, by document id (empty for backends that cannot
    /// tell): the incremental stage skips these when their content is unchanged.
    fn known_documents(&self) -> Result<HashMap<String, KnownDocument>, BackendError> {
        Ok(HashMap::new())
    }

    /// The web pages the index holds from `source` (a crawl's start URL), with their URL,
    /// validators and depth from their metadata (empty for backends that cannot tell).
    fn known_pages(&self, _source: &str) -> Result<Vec<KnownPage>, BackendError> {
        Ok(Vec::new())
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

    /// The run's writes are all in: finish what waits for the end (build an index, close a
    /// file). Returns notes for the summary.
    fn finish(&self) -> Result<Vec<String>, BackendError> {
        Ok(Vec::new())
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

/// What search reads of an index.
pub trait IndexReader: Send {
    fn meta(&self) -> &IndexMeta;

    /// The index, for messages (no password).
    fn describe(&self) -> String;

    /// (documents, chunks, chunks with a vector) in the index.
    fn counts(&self) -> Result<(u64, u64, u64), BackendError>;

    /// (chunks without a vector yet, all chunks): what vector search cannot see yet.
    fn unembedded(&self) -> Result<(u64, u64), BackendError> {
        Ok((0, 0))
    }

    /// Documents among `ids` whose embedding is still to do.
    fn unembedded_documents(&self, ids: &[String]) -> Result<Vec<String>, BackendError> {
        let _ = ids;
        Ok(Vec::new())
    }

    /// The `k` chunks nearest to `query` by cosine distance: (rowid, distance), nearest first.
    fn nearest(&self, query: &[f32], k: usize) -> Result<Vec<(i64, f64)>, BackendError>;

    /// The `k` best chunks for the words of `query`: (rowid, score), best first.
    fn keyword(&self, query: &str, k: usize) -> Result<Vec<(i64, f64)>, BackendError>;

    /// [`IndexReader::nearest`] among the chunks `filter` lets through: k results whenever k
    /// chunks match.
    fn nearest_where(
        &self,
        query: &[f32],
        k: usize,
        filter: &filter::Where,
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        if filter.is_empty() {
            return self.nearest(query, k);
        }
        Err(no_filters(&self.describe()))
    }

    /// [`IndexReader::keyword`] among the chunks `filter` lets through.
    fn keyword_where(
        &self,
        query: &str,
        k: usize,
        filter: &filter::Where,
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        if filter.is_empty() {
            return self.keyword(query, k);
        }
        Err(no_filters(&self.describe()))
    }

    /// The `k` documents whose stage outputs in the keyword index (LLM summaries...) best
    /// match `query`, as the rowid of each one's first chunk: (rowid, score), best first.
    fn keyword_outputs(&self, query: &str, k: usize) -> Result<Vec<(i64, f64)>, BackendError> {
        let _ = (query, k);
        Ok(Vec::new())
    }

    fn chunk(&self, rowid: i64) -> Result<Option<ChunkRow>, BackendError>;

    /// The facet of entities over the documents `filter` lets through: each entity (of type
    /// `kind` when given) with the documents that mention it, most documents first, at most
    /// `top`.
    fn entity_facets(
        &self,
        filter: &filter::Where,
        kind: Option<&str>,
        top: usize,
    ) -> Result<Vec<facets::EntityFacet>, BackendError> {
        let _ = (filter, kind, top);
        Err(facets::no_entities(&self.describe()))
    }

    /// The facet of labels over the documents `filter` lets through, most documents first.
    fn label_facets(
        &self,
        filter: &filter::Where,
        top: usize,
    ) -> Result<Vec<facets::LabelFacet>, BackendError> {
        let _ = (filter, top);
        Err(facets::no_entities(&self.describe()))
    }

    /// Every (document, entity) edge of the documents `filter` lets through (of type `kind`
    /// when given), by document, to `each`.
    fn entity_edges(
        &self,
        filter: &filter::Where,
        kind: Option<&str>,
        each: &mut dyn FnMut(facets::EntityEdge) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let _ = (filter, kind, each);
        Err(facets::no_entities(&self.describe()))
    }

    /// The `k` chunks whose sparse vectors have the largest dot product with the query's
    /// (vocabulary ids `terms`, their `weights`), among those `filter` lets through:
    /// (rowid, score), best first.
    fn sparse_where(
        &self,
        terms: &[u32],
        weights: &[f32],
        k: usize,
        filter: &filter::Where,
    ) -> Result<Vec<(i64, f64)>, BackendError> {
        let _ = (terms, weights, k, filter);
        Err(no_sparse(&self.describe()))
    }

    /// The document a chunk belongs to.
    fn document_of(&self, rowid: i64) -> Result<Option<String>, BackendError>;

    /// The approximate index's candidate list (HNSW ef) for the vector searches that follow
    /// (`search --ef`), over the one the index chose; ignored by a backend without one.
    fn set_ef(&mut self, ef: Option<usize>) {
        let _ = ef;
    }

    /// How the last vector search was answered (`search --explain`); None where the backend
    /// does not say.
    fn last_plan(&self) -> Option<ann::VectorPlan> {
        None
    }

    /// The documents of many chunks, in their order (a server index answers in one query).
    fn documents_of(&self, rowids: &[i64]) -> Result<Vec<Option<String>>, BackendError> {
        rowids.iter().map(|&r| self.document_of(r)).collect()
    }
}

/// An index without sparse vectors, asked for them.
pub(crate) fn no_sparse(index: &str) -> BackendError {
    BackendError::Invalid(format!(
        "{index} has no sparse vectors: add them with `ragline enrich --stage sparse \
         --sparse-model MODEL` (or ingest with --sparse-model), or search another --mode"
    ))
}

pub(crate) fn no_filters(index: &str) -> BackendError {
    BackendError::Invalid(format!(
        "--where is not supported by {index} yet; filter a sqlite:// index, or search without it"
    ))
}

/// The version stamp shared by a document and the chunks made from that content with that
/// pipeline.
pub(crate) fn content_version(content_hash: Option<&str>, fingerprint: &str) -> String {
    let text = format!("{}|{fingerprint}", content_hash.unwrap_or(""));
    blake3::hash(text.as_bytes()).to_hex()[..16].to_string()
}
#[cfg(test)]
mod tests;
