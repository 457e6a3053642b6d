//! Connectors read documents from a source and publish them, each on its own thread.
//!
//! A connector never stops the run for one bad item: an unreadable file, invalid UTF-8 or a
//! malformed JSONL line is published as a failed document (or a dropped one, for empty and
//! binary files) with its id and the reason, and the connector carries on.

pub mod feed;
pub mod filesystem;
pub mod jsonl;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "object-store")]
pub mod object;
pub mod requeue;
pub mod sql;
pub mod web;

/// Is `s` an object store URL (`s3://`, `gs://`, `az://`)? Recognised with or without the
/// `object-store` feature, so a build without it says why instead of looking for a folder.
pub fn is_object_url(s: &str) -> bool {
    ["s3://", "gs://", "az://"].iter().any(|p| s.starts_with(p))
}

/// Is `s` a Kafka topic URL (`kafka://HOST:PORT/TOPIC`)? Recognised with or without the
/// `kafka` feature, so a build without it says why.
pub fn is_kafka_url(s: &str) -> bool {
    s.starts_with("kafka://")
}

/// Is `s` a broker subject URL (`nats://HOST:PORT/SUBJECT`)? Recognised with or without the
/// `nats` feature, so a build without it says why.
pub fn is_nats_url(s: &str) -> bool {
    s.starts_with("nats://")
}

/// Run a connector's asynchronous I/O (downloads) to its end on a small runtime of its own
/// (`threads` named `name`), from the connector's thread.
pub fn block_on_io<F>(name: &str, work: F) -> Result<(), ConnectorError>
where
    F: std::future::Future<Output = Result<(), ConnectorError>>,
{
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| ConnectorError::Source(format!("cannot start the I/O runtime: {e}")))?
        .block_on(work)
}

/// How many items a connector that downloads (an object store) fetches at once by default.
pub const DEFAULT_FETCH_CONCURRENCY: usize = 16;

use std::collections::HashMap;
use std::sync::Arc;

use thiserror::Error;

use crate::lifecycle::KnownDocument;
use crate::publisher::Publisher;
use crate::queue::Stopped;

#[derive(Debug, Error)]
pub enum ConnectorError {
    /// A problem with the connector's configuration, found before anything ran.
    #[error("{0}")]
    Config(String),
    /// The run stopped while the connector was publishing.
    #[error(transparent)]
    Stopped(#[from] Stopped),
    /// The source as a whole failed (not one item of it).
    #[error("{0}")]
    Source(String),
}

/// Why one record (a JSONL line, a table's cell) cannot be a document: the reason, for the
/// record's FAIL. The run goes on.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct BadRecord(pub String);

/// A source of documents.
pub trait Connector: Send {
    /// The connector's name, for messages.
    fn name(&self) -> &'static str;

    /// Publish every document, then return. Per-item problems are published as failures or
    /// drops; an error means the source as a whole could not be read.
    fn run(&mut self, publisher: &Publisher) -> Result<(), ConnectorError>;

    /// Told before `run` what the index holds: a connector that can tell an unchanged item
    /// without reading it (a table's `updated=` column) uses it; the others ignore it.
    fn know(&mut self, _index: &KnownIndex) {}

    /// Whether each run publishes the whole source (a folder, a bucket, a table), so that a
    /// document the index holds and the run did not publish is gone from it. A stream of
    /// changes (a broker subject) publishes what is new and says what is gone.
    fn whole_source(&self) -> bool {
        true
    }

    /// Whether what the source says is gone (a Kafka tombstone) is deleted from the index
    /// without `--prune`: the source's own delete, not a guess from what a run did not read.
    fn deletes_gone(&self) -> bool {
        false
    }

    /// What to do once the run is over (a broker's messages acknowledged), taken before it
    /// starts.
    fn settlement(&mut self) -> Option<Box<dyn Settlement>> {
        None
    }
}

/// A connector's last step, after the run: [`Settlement::settle`] is told whether every
/// document the run published was accounted for (indexed, failed or dropped, and the index
/// finished) or the run stopped first.
pub trait Settlement: Send {
    /// Settle; what comes back are notes for the run's summary.
    fn settle(self: Box<Self>, accounted: bool) -> Vec<String>;
}

/// What the index holds: its complete documents and the pipeline fingerprint of this run
/// (a document made with another pipeline is not unchanged).
#[derive(Clone)]
pub struct KnownIndex {
    pub documents: Arc<HashMap<String, KnownDocument>>,
    pub fingerprint: Arc<str>,
    /// The web pages the index holds from a source (a crawl's start URL), with their
    /// validators and links, asked of the index when a connector needs them (a failure to read
    /// them is logged by the index's side, and reads as none).
    pub pages: Option<KnownPages>,
}

/// See [`KnownIndex::pages`].
pub type KnownPages = Arc<dyn Fn(&str) -> Vec<crate::lifecycle::KnownPage> + Send + Sync>;

impl KnownIndex {
    /// Whether the index holds document `id` at version `key` (what it stores as the content
    /// hash), made with this run's pipeline.
    pub fn holds(&self, id: &str, key: &str) -> bool {
        self.documents
            .get(id)
            .is_some_and(|d| d.content_hash == key && *d.fingerprint == *self.fingerprint)
    }

    /// The version the index holds of document `id`, when it holds it completely, made with
    /// this run's pipeline.
    pub fn version_of(&self, id: &str) -> Option<&str> {
        self.documents
            .get(id)
            .filter(|d| *d.fingerprint == *self.fingerprint)
            .map(|d| d.content_hash.as_str())
    }

    /// The web pages the index holds from `source` (a crawl's start URL) that it holds
    /// completely; none when the index cannot tell (the crawl then reads every page).
    pub fn pages(&self, source: &str) -> Vec<crate::lifecycle::KnownPage> {
        let Some(pages) = &self.pages else {
            return Vec::new();
        };
        pages(source)
            .into_iter()
            .filter(|p| self.version_of(&p.id).is_some())
            .collect()
    }
}

/// A document the connector knows unchanged without reading it (the index holds its version
/// `key`): published without its text, stopped by the incremental stage before anything
/// reads it, counted as unchanged.
pub fn known_unchanged(id: String, source: String, key: String) -> crate::document::Document {
    let mut doc = crate::document::Document::new(id, String::new());
    doc.fields.source = Some(source);
    doc.content_hash = Some(key);
    doc
}

/// A version key: what a connector that knows an item's version without its content (a row's
/// `updated` column, an object's ETag) stores as the content hash, the length of the
/// incremental stage's hashes (32 hex digits). `parts` name the item and everything that
/// changes what is made of it.
pub fn version_key(parts: &[&str]) -> String {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update(b"\0");
    }
    h.finalize().to_hex()[..32].to_string()
}

/// How the bytes of a file turned out.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    Text(String),
    /// Nothing but whitespace.
    Empty,
    /// NUL bytes near the start: not a text document.
    Binary,
    /// Not UTF-8: the reason, with where and how to fix it.
    Invalid(String),
}

/// Decide what a file's bytes are: UTF-8 text (BOM removed), empty, binary, or invalid.
pub fn decode(bytes: Vec<u8>) -> Decoded {
    if bytes.starts_with(&[0xFF, 0xFE]) || bytes.starts_with(&[0xFE, 0xFF]) {
        return Decoded::Invalid(
            "UTF-16 text; convert it to UTF-8 (e.g. `iconv -f UTF-16 -t UTF-8`)".into(),
        );
    }
    let head = &bytes[..bytes.len().min(8192)];
    if head.contains(&0) {
        return Decoded::Binary;
    }
    let mut bytes = bytes;
    if bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
        bytes.drain(..3);
    }
    match String::from_utf8(bytes) {
        Ok(text) if text.trim().is_empty() => Decoded::Empty,
        Ok(text) => Decoded::Text(text),
        Err(err) => {
            let at = err.utf8_error().valid_up_to();
            let line = 1 + err.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count();
            Decoded::Invalid(format!(
                "invalid UTF-8 at byte {at} (line {line}); convert the file to UTF-8 \
                 (e.g. `iconv -f latin1 -t utf-8`)"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_text_empty_binary_and_invalid() {
        assert_eq!(
            decode(b"\xEF\xBB\xBFhi".to_vec()),
            Decoded::Text("hi".into())
        );
        assert_eq!(decode(b" \n\t".to_vec()), Decoded::Empty);
        assert_eq!(decode(b"\x7fELF\x00\x01".to_vec()), Decoded::Binary);
        match decode(b"ok\nfa\xE7ade".to_vec()) {
            Decoded::Invalid(msg) => assert!(msg.contains("byte 5 (line 2)"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }
}
