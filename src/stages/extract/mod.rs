//! The extract stage: turns a document's raw content (markdown, HTML, plain text,
//! reStructuredText) into clean text plus its structure (headings, paragraphs, code blocks,
//! tables) for the chunker. Front matter and `<title>` go to the title and metadata.

mod front_matter;
pub mod html;
pub mod markdown;
pub mod text;

use std::collections::BTreeMap;

use super::{Stage, StageError};
use crate::document::{Block, Document};

/// What an extractor yields.
#[derive(Debug, Default)]
pub struct Extracted {
    pub text: String,
    pub blocks: Vec<Block>,
    pub title: Option<String>,
    pub metadata: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default)]
pub struct Extract;

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
        let raw = std::mem::take(&mut doc.fields.text);
        let extracted = match format.as_str() {
            "markdown" => markdown::extract(&raw),
            "html" => html::extract(&raw),
            "rst" => text::extract_rst(&raw),
            _ => text::extract_plain(&raw),
        };
        doc.fields.text = extracted.text;
        doc.blocks = extracted.blocks;
        for (k, v) in extracted.metadata {
            doc.fields.metadata.entry(k).or_insert(v);
        }
        if doc.fields.title.is_none() {
            doc.fields.title = extracted.title.or_else(|| first_heading(&doc.blocks));
        }
        if doc.fields.text.trim().is_empty() {
            doc.drop_with(format!(
                "no text left after extracting the {format} content"
            ));
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
