//! The extract stage: turns a document's raw content (markdown, HTML, plain text,
//! reStructuredText, PDF, DOCX) into clean text plus its structure (headings, paragraphs, code
//! blocks, tables, pages) for the chunker. Front matter, `<title>` and document properties go
//! to the title and metadata.
//!
//! Every format is parsed under a budget ([`budget`]: a thread of its own, a deadline, a
//! memory ceiling): a panic, a timeout, a ceiling passed or a broken file fails that file with
//! the reason, and the worker goes on.

pub mod budget;
#[cfg(feature = "docx")]
pub mod docx;
mod front_matter;
pub mod html;
pub mod isolate;
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
/// MiB one file's extraction may hold (`--max-extract-mb`).
pub const DEFAULT_MAX_EXTRACT_MB: u64 = 1024;

/// What an extractor yields (serialized between a `--isolate-extraction` child and its
/// parent).
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
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
#[derive(Clone, Debug)]
pub struct ExtractConfig {
    /// How long one file may take to parse.
    pub max_file_time: Duration,
    /// Bytes one file's parser may hold.
    pub max_memory: u64,
    /// `--isolate-extraction`: parse in a child process of this program (the ragline
    /// binary), so a crash no thread can contain fails the file alone ([`isolate`]).
    pub isolate: Option<std::path::PathBuf>,
}

impl Default for ExtractConfig {
    fn default() -> Self {
        ExtractConfig {
            max_file_time: Duration::from_secs(DEFAULT_MAX_FILE_SECONDS),
            max_memory: DEFAULT_MAX_EXTRACT_MB << 20,
            isolate: None,
        }
    }
}

#[derive(Debug, Default)]
pub struct Extract {
    config: ExtractConfig,
    /// The thread this stage's parses run on (kept from one file to the next).
    runner: budget::Runner,
    /// The child process the parses run in, with `--isolate-extraction`.
    isolated: Option<isolate::Isolated>,
}

impl Extract {
    pub fn new(config: ExtractConfig) -> Self {
        Extract {
            isolated: config.isolate.clone().map(isolate::Isolated::new),
            config,
            runner: budget::Runner::default(),
        }
    }

    /// Parse `content` as `format` under the budget (in the child process when isolated).
    fn parse(&mut self, format: &str, content: Content) -> Result<Extracted, StageError> {
        let limits = budget::Limits {
            time: self.config.max_file_time,
            memory: self.config.max_memory,
        };
        let result = match &mut self.isolated {
            Some(child) => child.run(format, content, limits),
            None => self.parse_here(format, content, limits),
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
                    limits.time.as_secs()
                ),
                Guarded::OverMemory(bytes) => format!(
                    "extraction held more than --max-extract-mb={} MiB ({} MiB when it was \
                     stopped); raise it if the file is just large, or check the file (a \
                     decompression bomb, or damaged)",
                    limits.memory >> 20,
                    bytes >> 20
                ),
                Guarded::Busy(stuck) => format!(
                    "{stuck} files that ran out of time or memory earlier are still being \
                     parsed in the background, and none ended within --max-file-seconds={}: \
                     not parsing another; look at this run's files that failed for time or \
                     memory, and run again without them",
                    limits.time.as_secs()
                ),
            })
        })
    }

    /// Parse `content` as `format` in this process, on the stage's budgeted thread.
    fn parse_here(
        &mut self,
        format: &str,
        content: Content,
        limits: budget::Limits,
    ) -> Result<Extracted, Guarded> {
        match (format, content) {
            #[cfg(feature = "pdf")]
            ("pdf", Content::Bytes(raw)) => self.runner.run(limits, move |b| pdf::extract(&raw, b)),
            #[cfg(feature = "docx")]
            ("docx" | "doc", Content::Bytes(raw)) => {
                self.runner.run(limits, move |b| docx::extract(&raw, b))
            }
            (_, Content::Bytes(_)) => {
                let feature = if format == "doc" { "docx" } else { format };
                Err(Guarded::Failed(format!(
                    "this ragline was built without the `{feature}` feature; rebuild it with \
                     default features (or `--features {feature}`) to read .{format} files"
                )))
            }
            ("markdown", Content::Text(raw)) => self
                .runner
                .run(limits, move |_| Ok(markdown::extract(&raw))),
            ("html", Content::Text(raw)) => {
                self.runner.run(limits, move |b| html::extract(&raw, b))
            }
            ("rst", Content::Text(raw)) => self
                .runner
                .run(limits, move |_| Ok(text::extract_rst(&raw))),
            ("text", Content::Text(raw)) => self
                .runner
                .run(limits, move |_| Ok(text::extract_text(&raw))),
            (_, Content::Text(raw)) => self
                .runner
                .run(limits, move |_| Ok(text::extract_plain(&raw))),
        }
    }
}

/// A document's content before extraction.
enum Content {
    Text(String),
    #[cfg_attr(not(any(feature = "pdf", feature = "docx")), allow(dead_code))]
    Bytes(Vec<u8>),
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
        let content = match doc.raw.take() {
            Some(raw) => Content::Bytes(raw),
            None => Content::Text(std::mem::take(&mut doc.fields.text)),
        };
        let extracted = self.parse(&format, content)?;
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
