//! What documents and events look like on a broker: MessagePack of everything a later stage
//! needs, including what the JSONL output leaves out (instances, token ids, input keys, the
//! raw bytes of a binary file). Not carried: the extracted blocks (the chunker runs in the
//! same worker as the extractor) and stage warnings (the worker reports them where it is).

use serde::{Deserialize, Serialize};

use crate::document::{Chunk, Document, Fields, InputKey, RunId};
use crate::event::Event;

/// Bytes from a broker that are not an item ragline sent: the MessagePack decoder's reason
/// (a truncated or mistyped field, nesting past [`MAX_DEPTH`]).
#[derive(Debug, thiserror::Error)]
#[error("not a message ragline sent: {0}")]
pub struct WireError(#[from] rmp_serde::decode::Error);

/// An item a broker can carry.
pub trait Wire: Sized + Send {
    fn encode(&self) -> Vec<u8>;
    fn decode(bytes: &[u8]) -> Result<Self, WireError>;
    /// The run the item belongs to (its subject on the broker).
    fn run_id(&self) -> RunId;
    /// The broker delivered it more than once.
    fn mark_redelivered(&mut self) {}
}

/// How deep MessagePack from a broker may nest (a document's metadata is JSON-like); deeper
/// is refused instead of recursing (rmp-serde's own limit, 1024, is more stack than a worker
/// thread has for serde_json values).
const MAX_DEPTH: usize = 64;

/// Decode bytes from a broker (untrusted): nesting bounded by [`MAX_DEPTH`]; every length in
/// them is checked against the bytes there, and sequences are preallocated only as far as
/// serde's cautious size hint allows, so nothing is allocated beyond what the bytes justify.
fn decode_bounded<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    let mut d = rmp_serde::Deserializer::from_read_ref(bytes);
    d.set_max_depth(MAX_DEPTH);
    Ok(T::deserialize(&mut d)?)
}

#[derive(Serialize)]
struct DocOut<'a> {
    id: &'a str,
    run: u64,
    instance: u64,
    parent_id: Option<&'a str>,
    parent_instance: Option<u64>,
    fields: &'a Fields,
    dropped: Option<&'a str>,
    children: u32,
    chunk: Option<ChunkOut<'a>>,
    unchanged: bool,
    content_hash: Option<&'a str>,
    #[serde(with = "serde_bytes")]
    raw: Option<&'a [u8]>,
    page_starts: &'a [usize],
    redelivered: bool,
    embedded_tokens: u32,
}

#[derive(Serialize)]
struct ChunkOut<'a> {
    ordinal: u32,
    heading_path: &'a [String],
    start: usize,
    end: usize,
    token_count: u32,
    pages: Option<(u32, u32)>,
    token_ids: &'a [u32],
    input_key: Option<InputKey>,
    vector: Option<&'a [f32]>,
}

#[derive(Deserialize)]
struct DocIn {
    id: String,
    run: u64,
    instance: u64,
    parent_id: Option<String>,
    parent_instance: Option<u64>,
    fields: Fields,
    dropped: Option<String>,
    children: u32,
    chunk: Option<ChunkIn>,
    unchanged: bool,
    content_hash: Option<String>,
    #[serde(with = "serde_bytes")]
    raw: Option<Vec<u8>>,
    page_starts: Vec<usize>,
    redelivered: bool,
    embedded_tokens: u32,
}

#[derive(Deserialize)]
struct ChunkIn {
    ordinal: u32,
    heading_path: Vec<String>,
    start: usize,
    end: usize,
    token_count: u32,
    pages: Option<(u32, u32)>,
    token_ids: Vec<u32>,
    input_key: Option<InputKey>,
    vector: Option<Vec<f32>>,
}

impl Wire for Document {
    fn encode(&self) -> Vec<u8> {
        let out = DocOut {
            id: &self.id,
            run: self.run_id.0,
            instance: self.instance,
            parent_id: self.parent_id.as_deref(),
            parent_instance: self.parent_instance,
            fields: &self.fields,
            dropped: self.dropped.as_deref(),
            children: self.children,
            chunk: self.chunk.as_deref().map(|c| ChunkOut {
                ordinal: c.ordinal,
                heading_path: &c.heading_path,
                start: c.start,
                end: c.end,
                token_count: c.token_count,
                pages: c.pages,
                token_ids: &c.token_ids,
                input_key: c.input_key,
                vector: c.vector.as_deref(),
            }),
            unchanged: self.unchanged,
            content_hash: self.content_hash.as_deref(),
            raw: self.raw.as_deref(),
            page_starts: &self.page_starts,
            redelivered: self.redelivered,
            embedded_tokens: self.embedded_tokens,
        };
        rmp_serde::to_vec_named(&out).expect("a document always encodes")
    }

    fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let d: DocIn = decode_bounded(bytes)?;
        let mut doc = Document::new(d.id, String::new());
        doc.run_id = RunId(d.run);
        doc.instance = d.instance;
        doc.parent_id = d.parent_id;
        doc.parent_instance = d.parent_instance;
        doc.fields = d.fields;
        doc.dropped = d.dropped;
        doc.children = d.children;
        doc.chunk = d.chunk.map(|c| {
            Box::new(Chunk {
                ordinal: c.ordinal,
                heading_path: c.heading_path,
                start: c.start,
                end: c.end,
                token_count: c.token_count,
                pages: c.pages,
                token_ids: c.token_ids,
                input_key: c.input_key,
                vector: c.vector,
            })
        });
        doc.unchanged = d.unchanged;
        doc.content_hash = d.content_hash;
        doc.raw = d.raw;
        doc.page_starts = d.page_starts;
        doc.redelivered = d.redelivered;
        doc.embedded_tokens = d.embedded_tokens;
        Ok(doc)
    }

    fn run_id(&self) -> RunId {
        self.run_id
    }

    fn mark_redelivered(&mut self) {
        self.redelivered = true;
    }
}

impl Wire for Event {
    fn encode(&self) -> Vec<u8> {
        rmp_serde::to_vec_named(self).expect("an event always encodes")
    }

    fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        decode_bounded(bytes)
    }

    fn run_id(&self) -> RunId {
        self.run_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;

    #[test]
    fn a_chunk_crosses_the_wire_with_everything_the_next_stage_needs() {
        let mut doc = Document::new("guide.md#3", "the chunk's text");
        doc.run_id = RunId(0xfeed);
        doc.instance = 77;
        doc.parent_id = Some("guide.md".into());
        doc.parent_instance = Some(12);
        doc.fields.title = Some("Guide".into());
        doc.fields
            .metadata
            .insert("tags".into(), serde_json::json!(["a", {"b": 1.5}]));
        doc.children = 0;
        doc.unchanged = false;
        doc.content_hash = Some("abc".into());
        doc.raw = Some(vec![0, 255, 7]);
        doc.page_starts = vec![0, 40];
        doc.chunk = Some(Box::new(Chunk {
            ordinal: 3,
            heading_path: vec!["Hooks".into(), "useEffect".into()],
            start: 10,
            end: 26,
            token_count: 4,
            pages: Some((1, 2)),
            token_ids: vec![101, 2023, 4, 9999],
            input_key: Some([9; 16]),
            vector: Some(vec![0.25, -1.0, f32::MIN_POSITIVE]),
        }));
        let back = Document::decode(&doc.encode()).unwrap();
        assert_eq!(back, doc);
        // Fields the JSONL form skips must survive too (PartialEq covers them, but be plain).
        assert_eq!(back.instance, 77);
        assert_eq!(back.chunk.as_ref().unwrap().token_ids, [101, 2023, 4, 9999]);
        assert_eq!(back.chunk.as_ref().unwrap().input_key, Some([9; 16]));
    }

    #[test]
    fn events_cross_the_wire_and_garbage_is_an_error() {
        let mut doc = Document::new("a.md", "");
        doc.run_id = RunId(5);
        doc.instance = 2;
        doc.children = 4;
        let event = Event::terminal(
            &doc,
            EventKind::Fail {
                stage: "extract".into(),
                reason: "not UTF-8".into(),
            },
        );
        assert_eq!(Event::decode(&event.encode()).unwrap(), event);
        assert!(Event::decode(b"\xc1 not msgpack").is_err());
        assert!(Document::decode(&event.encode()).is_err());
    }
}
