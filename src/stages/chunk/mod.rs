//! The chunk stage: tokenizes a document once with the model's tokenizer, cuts it into chunks
//! by token counts (see [`split`]), and makes each chunk a child document carrying its
//! heading path, byte offsets, token count and token ids (which the embedder reuses).

pub mod split;

use super::{Stage, StageError};
use crate::document::{Chunk, Document};
use crate::tokens::Tokenize;
pub use split::{Sizes, Span};

/// Tokens per chunk, aimed for (`--chunk-tokens`); never more than the model's limit.
pub const DEFAULT_CHUNK_TOKENS: usize = 256;
/// Tokens shared by consecutive chunks of a section (`--chunk-overlap`).
pub const DEFAULT_CHUNK_OVERLAP: usize = 32;

/// The chunker's settings as given; [`ChunkConfig::validate`] checks them against the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkConfig {
    pub target: usize,
    pub overlap: usize,
}

impl Default for ChunkConfig {
    fn default() -> Self {
        ChunkConfig {
            target: DEFAULT_CHUNK_TOKENS,
            overlap: DEFAULT_CHUNK_OVERLAP,
        }
    }
}

impl ChunkConfig {
    /// Check against the model's limit (content tokens, prompt excluded). A target above the
    /// limit is an error only when `explicit` (the user asked for it); the default is clamped.
    pub fn validate(self, limit: usize, explicit: bool) -> Result<Sizes, SizeError> {
        if explicit && self.target > limit {
            return Err(SizeError::OverLimit {
                target: self.target,
                limit,
            });
        }
        let target = self.target.min(limit);
        if target == 0 {
            return Err(SizeError::Zero);
        }
        if self.overlap * 2 >= target {
            return Err(SizeError::Overlap {
                overlap: self.overlap,
                target,
            });
        }
        Ok(Sizes {
            target,
            overlap: self.overlap,
            limit,
        })
    }
}

/// Chunk sizes that cannot work: each message names the flag and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error(
        "--chunk-tokens={target} exceeds the model's limit of {limit} tokens per chunk; lower \
         it to at most {limit}"
    )]
    OverLimit { target: usize, limit: usize },
    #[error("--chunk-tokens must be at least 1")]
    Zero,
    #[error(
        "--chunk-overlap={overlap} must be less than half of the chunk size ({target}); lower it"
    )]
    Overlap { overlap: usize, target: usize },
}

/// The fingerprint of what the chunker makes: its settings and the tokenizer it counts in
/// (not the model: another model with the same tokenizer cuts the same chunks, so a model
/// migration does not re-chunk).
pub fn chunk_fingerprint(sizes: &Sizes, truncate: bool, tokenizer: &str) -> String {
    format!(
        "chunk-v3:{}:{}:{}:{}:{tokenizer}",
        sizes.target,
        sizes.overlap,
        sizes.limit,
        if truncate { "truncate" } else { "split" }
    )
}

/// The formats [`chunk_text`] reads.
pub const TEXT_FORMATS: [&str; 4] = ["markdown", "html", "text", "rst"];

/// One text cut as `ingest` cuts a document of `format` (markdown, html, text, rst): extracted
/// (markup, front matter and navigation stripped; headings kept for the heading paths), then
/// chunked. Returns the extracted text and its chunks (child documents whose `chunk` holds
/// the heading path, the byte range in the extracted text and the token ids); no chunks when
/// nothing of the text is left. The Python package's `ragline.chunk`.
pub fn chunk_text<T: Tokenize>(
    text: &str,
    format: &str,
    tokenizer: T,
    sizes: Sizes,
) -> Result<(String, Vec<Document>), StageError> {
    if !TEXT_FORMATS.contains(&format) {
        return Err(StageError::BadDocument(format!(
            "format `{format}`: use one of {}",
            TEXT_FORMATS.join(", ")
        )));
    }
    let mut doc = Document::new("text", text);
    doc.fields
        .metadata
        .insert("format".into(), serde_json::Value::from(format));
    super::extract::Extract::default().process(&mut doc)?;
    if doc.dropped.is_some() {
        return Ok((doc.fields.text, Vec::new()));
    }
    let chunks = ChunkStage::new(tokenizer, sizes).process(&mut doc)?;
    Ok((doc.fields.text, chunks))
}

pub struct ChunkStage<T> {
    tokenizer: T,
    sizes: Sizes,
    truncate: bool,
}

impl<T: Tokenize> ChunkStage<T> {
    pub fn new(tokenizer: T, sizes: Sizes) -> Self {
        ChunkStage {
            tokenizer,
            sizes,
            truncate: false,
        }
    }

    /// One chunk per document: its first `sizes.limit` tokens, the rest ignored. This is what
    /// sentence-transformers' `encode` does with a long text (`--truncate`).
    pub fn truncating(tokenizer: T, sizes: Sizes) -> Self {
        ChunkStage {
            tokenizer,
            sizes,
            truncate: true,
        }
    }
}

impl<T: Tokenize> Stage for ChunkStage<T> {
    fn name(&self) -> &'static str {
        "chunk"
    }

    fn process(&mut self, doc: &mut Document) -> Result<Vec<Document>, StageError> {
        if doc.is_child() {
            return Ok(Vec::new());
        }
        let text = &doc.fields.text;
        let tokens = self
            .tokenizer
            .tokenize(text)
            .map_err(|e| StageError::Internal(e.to_string()))?;
        if tokens.ids.is_empty() {
            doc.drop_with("no tokens: the text holds nothing the model's tokenizer keeps");
            return Ok(Vec::new());
        }
        let blocks = std::mem::take(&mut doc.blocks);
        let mut spans = if self.truncate {
            let end = tokens.ids.len().min(self.sizes.limit);
            vec![Span {
                tokens: (0, end),
                bytes: split::byte_range(text, &tokens.offsets, 0, end),
                heading_path: Vec::new(),
                section: 0,
            }]
        } else {
            split::split(text, &blocks, &tokens.offsets, self.sizes)
        };
        // The document's title roots every heading path ("useEffect > Usage > ..."), unless
        // the text's own first heading already says it.
        if let Some(title) = doc.fields.title.as_ref().filter(|t| !t.is_empty()) {
            for span in &mut spans {
                if span.heading_path.first() != Some(title) {
                    span.heading_path.insert(0, title.clone());
                }
            }
        }
        let children = spans
            .into_iter()
            .enumerate()
            .map(|(ordinal, span)| {
                let (b0, b1) = span.bytes;
                let mut child = doc.child(format!("{}#{ordinal}", doc.id), &text[b0..b1]);
                let ids = tokens.ids[span.tokens.0..span.tokens.1].to_vec();
                child.chunk = Some(Box::new(Chunk {
                    ordinal: ordinal as u32,
                    heading_path: span.heading_path,
                    start: b0,
                    end: b1,
                    token_count: ids.len() as u32,
                    pages: doc.pages_of(b0, b1),
                    input_key: Some(Chunk::input_key_of(&ids)),
                    token_ids: ids,
                    vector: None,
                }));
                child
            })
            .collect();
        Ok(children)
    }
}

#[cfg(test)]
mod tests;
