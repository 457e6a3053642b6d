//! Word documents (`.docx`, and legacy `.doc`) through `office_oxide` (pure Rust): the
//! document model is written out as markdown, so the chunker gets the same structure as for
//! any markdown file: headings from Word's heading styles and outline levels, lists (nested),
//! tables as pipe tables (kept whole where they fit), footnotes and endnotes after the body.
//! Tracked changes read as accepted: inserted text is in, deleted text is out. Page headers
//! and footers, comments and images are left out.

use std::io::Cursor;

use office_oxide::ir::{Element, InlineContent, List, Table};
use office_oxide::limits::Limits;
use office_oxide::options::ParseOptions;
use office_oxide::{Document, DocumentFormat, OfficeError};

use super::budget::{Budget, ParseError};
use super::{markdown, tidy, Extracted};

/// The first bytes of an OLE compound file: a legacy `.doc`, or an encrypted OOXML package.
const OLE_MAGIC: &[u8] = &[0xD0, 0xCF, 0x11, 0xE0];

/// Extract `bytes` as a Word document.
pub fn extract(bytes: &[u8], budget: &Budget) -> Result<Extracted, ParseError> {
    let format = if bytes.starts_with(b"PK\x03\x04") {
        DocumentFormat::Docx
    } else if bytes.starts_with(OLE_MAGIC) {
        DocumentFormat::Doc
    } else {
        return Err(
            "not a Word document (neither a ZIP package nor a legacy .doc): the file \
                    is damaged or misnamed; check what it is"
                .into(),
        );
    };
    let doc = Document::from_reader_with(
        Cursor::new(bytes.to_vec()),
        format,
        &parse_options(budget.memory()),
    )
    .map_err(explain)?;
    budget
        .check()
        .map_err(|_| ParseError::OutOfBudget("after parsing".into()))?;
    let title = doc
        .as_docx()
        .and_then(|d| d.core_properties.as_ref())
        .and_then(|p| p.title.as_deref())
        .map(|t| tidy::normalise(t.trim()))
        .filter(|t| !tidy::placeholder_title(t));
    let ir = doc.to_ir();
    let mut out = Writer::default();
    let mut notes = Vec::new();
    for section in &ir.sections {
        for element in &section.elements {
            match element {
                Element::Footnote(_) | Element::Endnote(_) => notes.push(element),
                _ => out.element(element, 0),
            }
        }
    }
    for note in notes {
        match note {
            Element::Footnote(n) | Element::Endnote(n) if n.author.is_none() => {
                let marker = n.marker.clone().unwrap_or_else(|| n.id.to_string());
                let mut body = Writer::default();
                for e in &n.content {
                    body.element(e, 0);
                }
                let body = body.text.trim().to_string();
                if !body.is_empty() {
                    out.paragraph(&format!("[{marker}] {body}"));
                }
            }
            // Comments (notes with an author) are review talk, not content.
            _ => {}
        }
    }
    let text = tidy::normalise(out.text.trim_end());
    let blocks = markdown::blocks(&text);
    Ok(Extracted {
        text,
        blocks,
        title: title.or(out.title),
        ..Extracted::default()
    })
}

/// office_oxide's limits for one file, within the extraction's memory ceiling: one part of
/// the package may inflate to a quarter of it, the whole package to the ceiling, and what a
/// small file can multiply (pictures, padding) to half of it.
fn parse_options(memory: u64) -> ParseOptions {
    let mut limits = Limits::default();
    limits.part_bytes = limits.part_bytes.min(memory / 4);
    limits.package_bytes = limits.package_bytes.min(memory);
    limits.memory_bytes = limits.memory_bytes.min(memory / 2);
    let mut options = ParseOptions::default();
    options.limits = limits;
    options
}

/// A message that says what is wrong with the file and what to do.
fn explain(e: OfficeError) -> String {
    use office_oxide::core::Error as Core;
    let message = e.to_string();
    let core = match &e {
        OfficeError::Core(c) | OfficeError::Docx(office_oxide::docx::DocxError::Core(c)) => Some(c),
        _ => None,
    };
    let too_large = matches!(
        core,
        Some(Core::DecompressionLimit { .. } | Core::PackageLimit(_))
    );
    let encrypted = matches!(e, OfficeError::Doc(office_oxide::doc::DocError::Encrypted));
    if too_large {
        format!(
            "the package inflates past what --max-extract-mb allows ({message}); a document \
             this large is a decompression bomb or a very unusual file: check it, or raise \
             --max-extract-mb (a part may take a quarter of it)"
        )
    } else if encrypted {
        "encrypted: needs a password; save an unprotected copy from Word and ingest it".into()
    } else {
        format!("cannot read the Word document ({message}); the file is damaged: repair it or save it again from Word")
    }
}

/// Writes the document model as markdown.
#[derive(Default)]
struct Writer {
    text: String,
    /// The text of the first paragraph styled `Title`.
    title: Option<String>,
}

impl Writer {
    fn paragraph(&mut self, line: &str) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        if !self.text.is_empty() {
            self.text.push_str("\n\n");
        }
        self.text.push_str(line);
    }

    fn element(&mut self, element: &Element, depth: usize) {
        match element {
            Element::Heading(h) => {
                let text = one_line(&inline_text(&h.content));
                if !text.is_empty() {
                    let hashes = "#".repeat(usize::from(h.clamped_level()));
                    self.paragraph(&format!("{hashes} {text}"));
                }
            }
            Element::Paragraph(p) => {
                let text = inline_text(&p.content);
                if p.style.as_deref() == Some("Title") && self.title.is_none() {
                    self.title = Some(one_line(&text));
                }
                self.paragraph(&escape_block_start(&text));
            }
            Element::List(list) => self.list(list, depth),
            Element::Table(table) => self.table(table),
            Element::CodeBlock(code) => {
                self.paragraph(&format!("```\n{}\n```", code.content.trim_end()));
            }
            Element::TextBox(b) => {
                for e in &b.content {
                    self.element(e, depth);
                }
            }
            // Notes are written after the body; images, shapes and breaks hold no text.
            _ => {}
        }
    }

    fn list(&mut self, list: &List, depth: usize) {
        let indent = "  ".repeat(depth);
        let mut lines = Vec::new();
        let mut number = list.start_number.unwrap_or(1);
        for item in &list.items {
            let mut body = Writer::default();
            for e in &item.content {
                body.element(e, 0);
            }
            let marker = if list.ordered {
                let m = format!("{number}.");
                number += 1;
                m
            } else {
                "-".to_string()
            };
            let body = one_line(&body.text);
            if !body.is_empty() {
                lines.push(format!("{indent}{marker} {body}"));
            }
            if let Some(nested) = &item.nested {
                let mut sub = Writer::default();
                sub.list(nested, depth + 1);
                if !sub.text.is_empty() {
                    lines.push(sub.text);
                }
            }
        }
        if !lines.is_empty() {
            if depth > 0 {
                // A nested list continues its parent's block.
                self.text.push_str(&lines.join("\n"));
            } else {
                self.paragraph(&lines.join("\n"));
            }
        }
    }

    fn table(&mut self, table: &Table) {
        let rows: Vec<Vec<String>> = table
            .rows
            .iter()
            .map(|row| {
                row.cells
                    .iter()
                    .map(|cell| {
                        let mut w = Writer::default();
                        for e in &cell.content {
                            w.element(e, 0);
                        }
                        one_line(&w.text).replace('|', "\\|")
                    })
                    .collect()
            })
            .filter(|cells: &Vec<String>| cells.iter().any(|c| !c.is_empty()))
            .collect();
        let width = rows.iter().map(Vec::len).max().unwrap_or(0);
        if width == 0 {
            return;
        }
        let mut lines = Vec::with_capacity(rows.len() + 1);
        for (i, row) in rows.iter().enumerate() {
            let mut cells = row.clone();
            cells.resize(width, String::new());
            lines.push(format!("| {} |", cells.join(" | ")));
            if i == 0 {
                lines.push(format!("|{}", " --- |".repeat(width)));
            }
        }
        self.paragraph(&lines.join("\n"));
    }
}

/// A run's text, line breaks kept; note reference marks left out.
fn inline_text(content: &[InlineContent]) -> String {
    office_oxide::ir::inline_to_text(content)
}

/// Text on one line: for headings, list items and table cells.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A paragraph that starts like markdown structure (`# `, `> `, `- `, `1. `) is text, not
/// structure: escape its first character.
fn escape_block_start(text: &str) -> String {
    let t = text.trim_start();
    let structural = t.starts_with('#')
        || t.starts_with('>')
        || t.starts_with("- ")
        || t.starts_with("* ")
        || t.starts_with("+ ")
        || t.starts_with("```")
        || {
            let digits = t.chars().take_while(char::is_ascii_digit).count();
            digits > 0 && t[digits..].starts_with(". ")
        };
    if structural {
        format!("\\{t}")
    } else {
        t.to_string()
    }
}
