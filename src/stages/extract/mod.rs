//! The extract stage: turns a document's raw content (markdown, HTML, plain text,
//! reStructuredText, PDF, DOCX) into clean text plus its structure (headings, paragraphs, code
//! blocks, tables, pages) for the chunker. Front matter, `<title>` and document properties go
//! to the title and metadata.
//!
//! Binary formats are parsed under a budget ([`budget`]): a panic, a timeout or a broken file
//! fails that file with the reason, and the worker goes on.

pub mod budget;
#[cfg(feature = "docx")]
pub mod docx;
mod front_matter;
pub mod html;
pub mod markdown;
#[cfg(feature = "pdf")]
pub mod pdf;
pub mod text;
#[cfg(any(feature = "pdf", feature = "docx"))]
pub mod tidy;

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Stage, StageError};
use crate::document::{Block, Document};
use budget::Guarded;

/// Seconds one file may take to extract (`--max-file-seconds`).
pub const DEFAULT_MAX_FILE_SECONDS: u64 = 60;

/// What an extractor yields.
#[derive(Debug, Default)]
pub struct Extracted {
    pub text: String,
    pub blocks: Vec<Block>,
    pub title: Option<String>,
    pub metadata: BTreeMap<String, serde_json::Value>,
    /// Where each page starts in `text`, for paged formats.
    pub page_starts: Vec<usize>,
    /// What the run should hear about this document ("page 3 has no text layer: needs OCR").
    pub warnings: Vec<String>,
    /// Why there is no text, when there is none and the format knows why.
    pub empty_because: Option<String>,
}

/// The extract stage's settings.
#[derive(Clone, Copy, Debug)]
pub struct ExtractConfig {
    /// How long one binary file may take to parse.
    pub max_file_time: Duration,
}

impl Default for ExtractConfig {
    fn default() -> Self {
        ExtractConfig {
            max_file_time: Duration::from_secs(DEFAULT_MAX_FILE_SECONDS),
        }
    }
}

#[derive(Debug, Default)]
pub struct Extract {
    config: ExtractConfig,
}

impl Extract {
    pub fn new(config: ExtractConfig) -> Self {
        Extract { config }
    }

    /// Parse a binary format under the budget.
    fn binary(&self, format: &str, raw: Vec<u8>) -> Result<Extracted, StageError> {
        let limit = self.config.max_file_time;
        let result: Result<Extracted, Guarded> = match format {
            #[cfg(feature = "pdf")]
            "pdf" => budget::run(limit, move |b| pdf::extract(&raw, b)),
            #[cfg(feature = "docx")]
            "docx" | "doc" => budget::run(limit, move |b| docx::extract(&raw, b)),
            _ => {
                let _ = raw;
                let feature = if format == "doc" { "docx" } else { format };
                Err(Guarded::Failed(format!(
                    "this ragline was built without the `{feature}` feature; rebuild it with \
                     default features (or `--features {feature}`) to read .{format} files"
                )))
            }
        };
        result.map_err(|why| {
            StageError::BadDocument(match why {
                Guarded::Failed(message) => message,
                Guarded::Panicked(message) => format!(
                    "the {format} parser crashed on this file ({message}); the file is probably \
                     damaged: repair or re-export it"
                ),
                Guarded::TimedOut => format!(
                    "extraction took longer than --max-file-seconds={}; raise it if the file is \
                     just large, or check the file (it may be damaged or pathological)",
                    limit.as_secs()
                ),
            })
        })
    }
}

impl Stage for Extract {
    fn name(&self) -> &'static str {
        "extract"
    }

    fn process(&mut self, doc: &mut Document) -> Result<Vec<Document>, StageError> {
        let format = doc
            .fields
            .metadata
            .get("format")
            .and_then(|v| v.as_str())
            .unwrap_or("text")
            .to_string();
        let extracted = match doc.raw.take() {
            Some(raw) => self.binary(&format, raw)?,
            None => {
                let raw = std::mem::take(&mut doc.fields.text);
                match format.as_str() {
                    "markdown" => markdown::extract(&raw),
                    "html" => html::extract(&raw),
                    "rst" => text::extract_rst(&raw),
                    _ => text::extract_plain(&raw),
                }
            }
        };
        doc.fields.text = extracted.text;
        doc.blocks = extracted.blocks;
        doc.page_starts = extracted.page_starts;
        for (k, v) in extracted.metadata {
            doc.fields.metadata.entry(k).or_insert(v);
        }
        if doc.fields.title.is_none() {
            doc.fields.title = extracted.title.or_else(|| first_heading(&doc.blocks));
        }
        if doc.fields.text.trim().is_empty() {
            doc.drop_with(
                extracted.empty_because.unwrap_or_else(|| {
                    format!("no text left after extracting the {format} content")
                }),
            );
            return Ok(Vec::new());
        }
        if !extracted.warnings.is_empty() {
            doc.fields
                .metadata
                .insert("warnings".into(), extracted.warnings.clone().into());
            doc.warnings
                .extend(extracted.warnings.into_iter().map(|w| ("extract", w)));
        }
        Ok(Vec::new())
    }
}

fn first_heading(blocks: &[Block]) -> Option<String> {
    blocks.iter().find_map(|b| match &b.kind {
        crate::document::BlockKind::Heading { text, .. } if !text.is_empty() => Some(text.clone()),
        _ => None,
    })
}
