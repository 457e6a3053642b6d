//! The document model. Parents come from connectors; children (chunks) are made by stages and
//! are first-class documents with their own id, events and index records.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Identifies one run. Events stamped with another run id are ignored by the publisher.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunId(pub u64);

impl RunId {
    /// A fresh id from the clock and the process id: unique enough to tell runs apart.
    pub fn generate() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        RunId(nanos ^ (u64::from(std::process::id()) << 48))
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The content and description of a document.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Fields {
    /// The text: raw content from the connector, extracted text after the extract stage, the
    /// chunk's text for a child.
    pub text: String,
    /// A title, from front matter, `<title>`, the first heading or the connector.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Where the document came from (a file path, `file.jsonl:17`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Everything else: front matter keys, JSONL extra fields, the detected format.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, serde_json::Value>,
}

/// Why a chunk's vector with NaN or infinite values is refused, by the embedder and by every
/// index (no distance is defined for it).
pub const NON_FINITE_VECTOR: &str = "the vector has NaN or infinite values: the model's output \
                                     overflowed (try --dtype f32, or check the model's weights)";

/// What a chunk carries beyond its text: where it sits in its parent and what the model sees.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    /// Position among the parent's chunks, from 0.
    pub ordinal: u32,
    /// Headings above the chunk, outermost first ("Hooks", "useEffect", "Caveats").
    pub heading_path: Vec<String>,
    /// Byte range of the chunk in the parent's extracted text.
    pub start: usize,
    pub end: usize,
    /// Number of model tokens, special tokens excluded.
    pub token_count: u32,
    /// The pages of the parent the chunk spans (first, last; from 1), for paged formats.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pages: Option<(u32, u32)>,
    /// The model's token ids for the chunk, special tokens excluded: computed once by the
    /// chunker and reused by the embedder. Not written to the index.
    #[serde(skip)]
    pub token_ids: Vec<u32>,
    /// What the model's input hashes to ([`Chunk::input_key_of`]): chunks with equal keys
    /// have equal vectors under one model, so an index can hand back a vector it already
    /// holds instead of the embedder computing it again.
    #[serde(skip)]
    pub input_key: Option<InputKey>,
    /// The embedding, once the embedder has run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vector: Option<Vec<f32>>,
}

/// A hash of a chunk's token ids (16 bytes of BLAKE3).
pub type InputKey = [u8; 16];

impl Chunk {
    /// The key of a model input: its token ids, without special tokens or prompt (both are
    /// fixed for a model, and an index holds one model's vectors).
    pub fn input_key_of(token_ids: &[u32]) -> InputKey {
        let mut hasher = blake3::Hasher::new();
        for id in token_ids {
            hasher.update(&id.to_le_bytes());
        }
        let mut key = [0u8; 16];
        key.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
        key
    }
}

/// A document in flight.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Document {
    pub id: String,
    pub run_id: RunId,
    /// This instance of the document in this run: the publisher numbers what it publishes;
    /// a child's instance is derived from its parent's instance and its own id, so a parent
    /// processed twice (at-least-once delivery) yields the same child instances and the
    /// publisher can tell duplicates from new work. Two documents with the same id published
    /// twice are two instances, each needing its own terminal event.
    #[serde(skip)]
    pub instance: u64,
    /// Set on children: the id of the document they were made from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// The parent's instance, on children.
    #[serde(skip)]
    pub parent_instance: Option<u64>,
    pub fields: Fields,
    /// Set by a stage that decides the document goes no further, with the reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped: Option<String>,
    /// How many children stages made from this document. Stamped by the worker and carried on
    /// the document's terminal event, so the publisher knows how many CREATEs to expect.
    #[serde(skip)]
    pub children: u32,
    /// Chunk data, on children made by the chunker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunk: Option<Box<Chunk>>,
    /// Set by the incremental stage when the index already holds this exact document: the
    /// remaining stages are skipped and the indexer only confirms it.
    #[serde(skip)]
    pub unchanged: bool,
    /// blake3 of the content as read (before extraction), set by the incremental stage;
    /// children inherit it, so every chunk records which version of its parent it came from.
    #[serde(skip)]
    pub content_hash: Option<String>,
    /// The structure of `fields.text` found by the extract stage (headings, paragraphs,
    /// code blocks, tables), for the chunker. Empty before extraction.
    #[serde(skip)]
    pub blocks: Vec<Block>,
    /// The content as read, for formats that are not text (PDF, DOCX): the connector puts the
    /// file's bytes here and leaves `fields.text` empty; the extract stage consumes them.
    #[serde(skip)]
    pub raw: Option<Vec<u8>>,
    /// Where each page starts in `fields.text` (byte offsets, ascending; page `i + 1` starts
    /// at `page_starts[i]`), for paged formats. Empty for the others.
    #[serde(skip)]
    pub page_starts: Vec<usize>,
    /// What a stage noticed about the document without stopping it ("page 3 has no text
    /// layer: needs OCR"), with the stage's name; reported in the run's summary.
    #[serde(skip)]
    pub warnings: Vec<(&'static str, String)>,
    /// A broker delivered this document (or the document it was made from) more than once:
    /// a process died or timed out holding it. Carried to its terminal event, for the run's
    /// count of redeliveries.
    #[serde(skip)]
    pub redelivered: bool,
    /// Model tokens the embedder computed this chunk's vector from (0: not embedded in this
    /// run, or reused). Carried to its FINISH, so a distributed run's publisher can count
    /// what its embedders did.
    #[serde(skip)]
    pub embedded_tokens: u32,
}

/// What kind of block of text.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum BlockKind {
    /// A heading of `level` (1 = top) with its plain text.
    Heading {
        level: u8,
        text: String,
    },
    Paragraph,
    /// A fenced or indented code block, or `<pre>`: kept whole where it fits.
    Code,
    /// A table: kept whole where it fits.
    Table,
    ListItem,
    /// Anything else (HTML blocks, quotes, rules).
    Other,
}

impl fmt::Display for BlockKind {
    /// `h2:Usage` for a heading, the kind's name otherwise.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockKind::Heading { level, text } => write!(f, "h{level}:{text}"),
            other => write!(f, "{other:?}"),
        }
    }
}

/// A block of the extracted text: `text[start..end]`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Block {
    pub kind: BlockKind,
    pub start: usize,
    pub end: usize,
}

impl Block {
    pub fn is_heading(&self) -> bool {
        matches!(self.kind, BlockKind::Heading { .. })
    }

    /// Code and tables are split only when they alone exceed the chunk limit.
    pub fn keep_whole(&self) -> bool {
        matches!(self.kind, BlockKind::Code | BlockKind::Table)
    }
}

impl Document {
    /// A parent document as a connector makes it; the publisher stamps the run id.
    pub fn new(id: impl Into<String>, text: impl Into<String>) -> Self {
        Document {
            id: id.into(),
            run_id: RunId(0),
            instance: 0,
            parent_id: None,
            parent_instance: None,
            fields: Fields {
                text: text.into(),
                ..Fields::default()
            },
            dropped: None,
            children: 0,
            chunk: None,
            unchanged: false,
            content_hash: None,
            blocks: Vec::new(),
            raw: None,
            page_starts: Vec::new(),
            redelivered: false,
            embedded_tokens: 0,
            warnings: Vec::new(),
        }
    }

    /// A parent document whose content is bytes in a format that is not text (PDF, DOCX);
    /// the extract stage turns them into text.
    pub fn from_bytes(id: impl Into<String>, raw: Vec<u8>) -> Self {
        let mut doc = Document::new(id, String::new());
        doc.raw = Some(raw);
        doc
    }

    /// The pages `start..end` of the extracted text spans, 1-based and inclusive, when the
    /// document has pages.
    pub fn pages_of(&self, start: usize, end: usize) -> Option<(u32, u32)> {
        if self.page_starts.is_empty() {
            return None;
        }
        let page_at = |at: usize| self.page_starts.partition_point(|&s| s <= at).max(1) as u32;
        let last = end.saturating_sub(1).max(start);
        Some((page_at(start), page_at(last)))
    }

    /// A child of this document, with the run id and source carried over.
    pub fn child(&self, id: impl Into<String>, text: impl Into<String>) -> Self {
        let id = id.into();
        Document {
            instance: child_instance(self.instance, &id),
            id,
            run_id: self.run_id,
            parent_id: Some(self.id.clone()),
            parent_instance: Some(self.instance),
            fields: Fields {
                text: text.into(),
                title: self.fields.title.clone(),
                source: self.fields.source.clone(),
                metadata: BTreeMap::new(),
            },
            dropped: None,
            children: 0,
            chunk: None,
            unchanged: false,
            content_hash: self.content_hash.clone(),
            blocks: Vec::new(),
            raw: None,
            page_starts: Vec::new(),
            warnings: Vec::new(),
            redelivered: self.redelivered,
            embedded_tokens: 0,
        }
    }

    pub fn is_child(&self) -> bool {
        self.parent_id.is_some()
    }

    /// Mark the document dropped: it goes no further and ends with a DROP event.
    pub fn drop_with(&mut self, reason: impl Into<String>) {
        self.dropped = Some(reason.into());
    }

    /// A rough size in bytes, for batching by bytes.
    pub fn approx_bytes(&self) -> usize {
        let chunk = self.chunk.as_ref().map_or(0, |c| {
            c.vector.as_ref().map_or(0, |v| v.len() * 4) + c.token_ids.len() * 4 + 64
        });
        self.id.len()
            + self.fields.text.len()
            + self.raw.as_ref().map_or(0, Vec::len)
            + self.fields.title.as_ref().map_or(0, String::len)
            + self.fields.source.as_ref().map_or(0, String::len)
            + self.fields.metadata.len() * 32
            + chunk
            + 64
    }
}

/// The instance number of the child `id` of parent instance `parent`: deterministic, so that
/// reprocessing a parent names the same children.
pub fn child_instance(parent: u64, id: &str) -> u64 {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&parent.to_le_bytes());
    hasher.update(id.as_bytes());
    let bytes = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes.as_bytes()[..8]);
    // 0 is never an instance: the publisher counts from 1.
    u64::from_le_bytes(first).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_of_maps_byte_ranges_to_page_spans() {
        let mut doc = Document::new("a.pdf", "one\ntwo\nthree");
        assert_eq!(doc.pages_of(0, 3), None, "no pages: no page span");
        doc.page_starts = vec![0, 4, 8];
        assert_eq!(doc.pages_of(0, 3), Some((1, 1)));
        assert_eq!(doc.pages_of(0, 5), Some((1, 2)));
        assert_eq!(doc.pages_of(4, 8), Some((2, 2)), "the end is exclusive");
        assert_eq!(doc.pages_of(5, 13), Some((2, 3)));
        assert_eq!(
            doc.pages_of(8, 8),
            Some((3, 3)),
            "an empty range is on its page"
        );
    }
}
