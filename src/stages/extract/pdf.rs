//! PDF: text per page in reading order, with headings, through `pdf_oxide` (pure Rust, no
//! system library). Each page's text comes from `extract_text` (columns read one after the
//! other, words hyphenated at line ends joined; measured against its markdown converter, which
//! merged headings into paragraphs and interleaved columns on our fixtures). Headings come from
//! the layout: lines set larger than the body text (or bold at body size, alone on their
//! line), ranked by size across the whole document. Pages are cleaned ([`super::tidy`]:
//! ligatures, hyphenation, running headers and footers) and joined with their start offsets
//! recorded, so every chunk knows the pages it spans.
//!
//! Encrypted files are opened with the empty user password when it works; otherwise the file
//! fails with "encrypted: needs a password". A page without a text layer is reported; a file
//! without any text is dropped with the reason. Never an empty success.

use std::collections::HashMap;

use pdf_oxide::layout::TextSpan;
use pdf_oxide::PdfDocument;

use super::budget::{Budget, ParseError};
use super::{markdown, tidy, Extracted};

/// Extract `bytes` as a PDF, checking `budget` between pages.
pub fn extract(bytes: &[u8], budget: &Budget) -> Result<Extracted, ParseError> {
    let doc = open(bytes)?;
    let count = doc.page_count().map_err(|e| {
        format!("cannot read the page tree ({e}); the file is damaged: repair or re-export it")
    })?;
    let ReadPages {
        pages,
        lines,
        mut warnings,
        failed_pages,
    } = read_pages(&doc, count, bytes.len(), budget)?;
    let pages = tidy::clean_pages(pages);
    let pages = mark_headings(pages, &lines);
    let mut no_text = Vec::new();
    for (i, page) in pages.iter().enumerate() {
        if page.trim().is_empty() && !failed_pages.contains(&(i + 1)) {
            no_text.push(i + 1);
        }
    }
    if no_text.len() + failed_pages.len() == count {
        return nothing_readable(&doc, count, &failed_pages);
    }
    for page in &no_text {
        warnings.push(format!("page {page} has no text layer: needs OCR"));
    }
    let (text, page_starts) = tidy::join_pages(&pages);
    let blocks = markdown::blocks(&text);
    let mut metadata = std::collections::BTreeMap::new();
    metadata.insert("pages".into(), (count as u64).into());
    let title = info_title(&doc);
    Ok(Extracted {
        text,
        blocks,
        title,
        metadata,
        page_starts,
        warnings,
        empty_because: None,
    })
}

/// Open `bytes` as a PDF: refused when there is no `%PDF` header, the file is damaged, or it
/// needs a password.
fn open(bytes: &[u8]) -> Result<PdfDocument, ParseError> {
    if !bytes.starts_with(b"%PDF")
        && !bytes[..bytes.len().min(1024)]
            .windows(4)
            .any(|w| w == b"%PDF")
    {
        return Err(
            "not a PDF (no `%PDF` header): the file is damaged or misnamed; check what it is"
                .into(),
        );
    }
    let doc = PdfDocument::from_bytes(bytes.to_vec()).map_err(|e| {
        format!("cannot open the PDF ({e}); the file is damaged: repair or re-export it")
    })?;
    if doc.is_encrypted() && !doc.is_authenticated() {
        return Err(
            "encrypted: needs a password; decrypt the file (e.g. `qpdf --decrypt \
                    --password=... in.pdf out.pdf`) and ingest the copy"
                .into(),
        );
    }
    Ok(doc)
}

/// Every page's text and layout lines, before cleaning; an unreadable page is empty.
struct ReadPages {
    pages: Vec<String>,
    lines: Vec<Vec<Line>>,
    warnings: Vec<String>,
    /// 1-based numbers of the pages that could not be read.
    failed_pages: Vec<usize>,
}

/// Read the `count` pages of `doc` (a file of `len` bytes), checking `budget` between pages.
fn read_pages(
    doc: &PdfDocument,
    count: usize,
    len: usize,
    budget: &Budget,
) -> Result<ReadPages, ParseError> {
    // The count comes from the file: preallocate no more than its bytes could describe.
    let room = count.min(len / 64 + 1);
    let mut pages = Vec::with_capacity(room);
    let mut lines: Vec<Vec<Line>> = Vec::with_capacity(room);
    let mut warnings = Vec::new();
    let mut failed_pages = Vec::new();
    for index in 0..count {
        budget
            .check()
            .map_err(|_| ParseError::OutOfBudget(format!("at page {} of {count}", index + 1)))?;
        let got = doc.extract_text(index);
        match got {
            Ok(page) => {
                pages.push(page);
                // The spans are cached by the text extraction: this is cheap.
                lines.push(
                    doc.extract_spans(index)
                        .map(|s| layout_lines(&s))
                        .unwrap_or_default(),
                );
            }
            Err(e) => {
                failed_pages.push(index + 1);
                warnings.push(format!(
                    "page {} cannot be read ({e}); it is left out",
                    index + 1
                ));
                pages.push(String::new());
                lines.push(Vec::new());
            }
        }
    }
    Ok(ReadPages {
        pages,
        lines,
        warnings,
        failed_pages,
    })
}

/// The outcome when no page of the `count` has text: an encrypted file that did not decrypt
/// fails, any other is empty with the reason.
fn nothing_readable(
    doc: &PdfDocument,
    count: usize,
    failed_pages: &[usize],
) -> Result<Extracted, ParseError> {
    if doc.is_encrypted() && count > 0 {
        // Opened with the empty password, yet nothing reads: the decryption did not work.
        return Err(
            "encrypted: no text could be decrypted with the empty password (the \
                    file needs a password, or uses an encryption this reader cannot \
                    undo); decrypt it (e.g. `qpdf --decrypt --password=... in.pdf \
                    out.pdf`) and ingest the copy"
                .into(),
        );
    }
    Ok(Extracted {
        empty_because: Some(if count == 0 {
            "the PDF has no pages".into()
        } else if failed_pages.is_empty() {
            format!(
                "no text layer on any of its {count} pages (a scan?): needs OCR before \
                 it can be indexed"
            )
        } else {
            format!(
                "no readable text on any of its {count} pages ({} could not be read; the \
                 others have no text layer: a scan? needs OCR)",
                failed_pages.len()
            )
        }),
        ..Extracted::default()
    })
}

/// The title in the document information dictionary, when it says something.
fn info_title(doc: &PdfDocument) -> Option<String> {
    let trailer = doc.trailer();
    let info = doc.resolve_object(trailer.as_dict()?.get("Info")?).ok()?;
    let title = doc.resolve_object(info.as_dict()?.get("Title")?).ok()?;
    let title = pdf_oxide::optional_content::decode_pdf_text_string(title.as_string()?);
    let title = tidy::normalise(title.trim());
    // Producers write placeholders and file names; those are not titles.
    (!tidy::placeholder_title(&title)).then_some(title)
}

/// A line of a page's layout: its text without spaces (to find it in the extracted text), its
/// font size and whether it is bold throughout.
#[derive(Debug)]
struct Line {
    key: String,
    chars: usize,
    size: f32,
    bold: bool,
}

/// Lines set larger than this times the body size are headings.
const HEADING_SCALE: f32 = 1.15;
/// Headings are short.
const HEADING_MAX_CHARS: usize = 150;

/// Group a page's spans into lines: consecutive spans on the same baseline.
fn layout_lines(spans: &[TextSpan]) -> Vec<Line> {
    let mut lines: Vec<Line> = Vec::new();
    let mut last_y: Option<f32> = None;
    for span in spans {
        let text: String = span.text.chars().filter(|c| !c.is_whitespace()).collect();
        if text.is_empty() {
            continue;
        }
        let chars = text.chars().count();
        let same_line = last_y.is_some_and(|y| (y - span.bbox.y).abs() < span.font_size * 0.5);
        match lines.last_mut() {
            Some(line) if same_line => {
                line.key.push_str(&text);
                line.chars += chars;
                line.size = line.size.max(span.font_size);
                line.bold &= span.font_weight.is_bold();
            }
            _ => lines.push(Line {
                key: text,
                chars,
                size: span.font_size,
                bold: span.font_weight.is_bold(),
            }),
        }
        last_y = Some(span.bbox.y);
    }
    lines
}

/// The key a line of extracted text is matched to layout lines by.
fn line_key(line: &str) -> String {
    tidy::normalise(line)
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect()
}

/// Mark heading lines with markdown `#`s. The body size is the size most characters of the
/// document are set in; heading styles (size, bold) rank by size, bold first, into levels.
fn mark_headings(pages: Vec<String>, lines: &[Vec<Line>]) -> Vec<String> {
    let mut by_size: HashMap<i32, usize> = HashMap::new();
    for line in lines.iter().flatten() {
        *by_size.entry((line.size * 2.0).round() as i32).or_default() += line.chars;
    }
    let Some(body) = by_size
        .iter()
        .max_by_key(|(size, n)| (**n, -**size))
        .map(|(size, _)| *size as f32 / 2.0)
    else {
        return pages;
    };
    let is_heading = |l: &Line| {
        l.chars <= HEADING_MAX_CHARS
            && l.key.chars().any(char::is_alphabetic)
            && (l.size >= body * HEADING_SCALE || (l.bold && l.size >= body * 0.95))
    };
    // Styles, largest first; bold before regular at the same size.
    let mut styles: Vec<(i32, bool)> = lines
        .iter()
        .flatten()
        .filter(|l| is_heading(l))
        .map(|l| ((l.size * 2.0).round() as i32, l.bold))
        .collect();
    styles.sort_unstable_by(|a, b| b.cmp(a));
    styles.dedup();
    pages
        .into_iter()
        .zip(lines)
        .map(|(page, layout)| {
            let headings: HashMap<String, usize> = layout
                .iter()
                .filter(|l| is_heading(l))
                .map(|l| {
                    let style = ((l.size * 2.0).round() as i32, l.bold);
                    let rank = styles.iter().position(|s| *s == style).unwrap_or(0);
                    (tidy::normalise(&l.key), (rank + 1).min(6))
                })
                .collect();
            if headings.is_empty() {
                return page;
            }
            let mut out = String::with_capacity(page.len() + 64);
            for line in page.lines() {
                match headings.get(&line_key(line)) {
                    Some(&level) => {
                        if !out.is_empty() && !out.ends_with("\n\n") {
                            out.push('\n');
                        }
                        out.push_str(&"#".repeat(level));
                        out.push(' ');
                        out.push_str(line.trim());
                        out.push_str("\n\n");
                    }
                    None => {
                        out.push_str(line);
                        out.push('\n');
                    }
                }
            }
            out
        })
        .collect()
}
