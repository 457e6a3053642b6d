//! Plain text and reStructuredText: paragraphs are blocks separated by blank lines; in RST,
//! underlined (and overlined) titles are headings and `::` introduces a literal (code) block.

use super::Extracted;
use crate::document::{Block, BlockKind};

pub fn extract_plain(raw: &str) -> Extracted {
    Extracted {
        text: raw.to_string(),
        blocks: paragraphs(raw),
        ..Extracted::default()
    }
}

/// Paragraphs: runs of non-blank lines.
pub fn paragraphs(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut start: Option<usize> = None;
    let mut end = 0;
    for (line_start, line) in lines(text) {
        if line.trim().is_empty() {
            if let Some(s) = start.take() {
                blocks.push(block(BlockKind::Paragraph, s, end));
            }
        } else {
            start.get_or_insert(line_start + (line.len() - line.trim_start().len()));
            end = line_start + line.trim_end().len();
        }
    }
    if let Some(s) = start {
        blocks.push(block(BlockKind::Paragraph, s, end));
    }
    blocks
}

/// A `.txt` file: reStructuredText when it reads as such (Sphinx projects, Django's
/// documentation among them, write reST in `.txt` files), else plain text. It reads as reST
/// when it opens with an adorned title, or has at least two: a plain text file rarely
/// underlines a line with a run of punctuation at least as long as the line.
pub fn extract_text(raw: &str) -> Extracted {
    let rst = extract_rst(raw);
    let headings = rst
        .blocks
        .iter()
        .filter(|b| matches!(b.kind, BlockKind::Heading { .. }))
        .count();
    let opens_with_title = rst
        .blocks
        .first()
        .is_some_and(|b| matches!(b.kind, BlockKind::Heading { .. }));
    if headings >= 2 || opens_with_title {
        rst
    } else {
        extract_plain(raw)
    }
}

pub fn extract_rst(raw: &str) -> Extracted {
    let all: Vec<(usize, &str)> = lines(raw).collect();
    let mut blocks = Vec::new();
    // Adornment styles in order of first appearance: their index is the heading level - 1.
    let mut styles: Vec<(char, bool)> = Vec::new();
    let mut para: Option<(usize, usize)> = None;
    let mut literal_next = false;
    let mut i = 0;
    while i < all.len() {
        let (at, line) = all[i];
        let trimmed = line.trim_end();
        if let Some((title, under_idx, style)) = rst_title(&all, i).filter(|_| para.is_none()) {
            let level = match styles.iter().position(|s| *s == style) {
                Some(p) => p + 1,
                None => {
                    styles.push(style);
                    styles.len()
                }
            };
            let end_line = all[under_idx];
            blocks.push(block(
                BlockKind::Heading {
                    level: level.min(6) as u8,
                    text: title.to_string(),
                },
                at,
                end_line.0 + end_line.1.trim_end().len(),
            ));
            i = under_idx + 1;
            continue;
        }
        if trimmed.trim().is_empty() {
            if let Some((s, e)) = para.take() {
                let kind = if literal_next {
                    BlockKind::Code
                } else {
                    BlockKind::Paragraph
                };
                literal_next = !literal_next && raw[s..e].ends_with("::");
                blocks.push(block(kind, s, e));
            }
        } else {
            let indent = line.len() - line.trim_start().len();
            // A literal block is the indented text after a paragraph ending in `::`.
            if para.is_none() && literal_next && indent == 0 {
                literal_next = false;
            }
            let s = para.map_or(at + indent, |p| p.0);
            para = Some((s, at + trimmed.len()));
        }
        i += 1;
    }
    if let Some((s, e)) = para {
        let kind = if literal_next {
            BlockKind::Code
        } else {
            BlockKind::Paragraph
        };
        blocks.push(block(kind, s, e));
    }
    Extracted {
        text: raw.to_string(),
        title: blocks.iter().find_map(|b| match &b.kind {
            BlockKind::Heading { text, .. } => Some(text.clone()),
            _ => None,
        }),
        blocks,
        ..Extracted::default()
    }
}

/// A section title at line `i` of `all`: the title, the line of its underline, and its
/// adornment style (the character, and whether the title is overlined too).
fn rst_title<'a>(all: &[(usize, &'a str)], i: usize) -> Option<(&'a str, usize, (char, bool))> {
    let trimmed = all[i].1.trim_end();
    // Title: text line followed by an adornment line at least as long (optionally also
    // preceded by one).
    let over = adornment(trimmed);
    let (title_idx, under_idx) =
        if over.is_some() && i + 2 < all.len() && adornment(all[i + 2].1.trim_end()) == over {
            (i + 1, i + 2)
        } else {
            (i, i + 1)
        };
    if under_idx >= all.len() || title_idx >= all.len() {
        return None;
    }
    let title = all[title_idx].1.trim();
    let under = adornment(all[under_idx].1.trim_end());
    let is_title = !title.is_empty()
        && adornment(title).is_none()
        && under.is_some_and(|(_, n)| n >= title.chars().count())
        && (title_idx == i || over.map(|o| o.0) == under.map(|u| u.0));
    if !is_title {
        return None;
    }
    let (ch, _) = under.expect("checked");
    Some((title, under_idx, (ch, title_idx != i)))
}

/// `(char, length)` when the line is an RST adornment (one punctuation character repeated).
fn adornment(line: &str) -> Option<(char, usize)> {
    let mut chars = line.chars();
    let first = chars.next()?;
    if !"=-`:'\"~^_*+#<>".contains(first) {
        return None;
    }
    let n = line.chars().count();
    (n >= 3 && line.chars().all(|c| c == first)).then_some((first, n))
}

fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut pos = 0;
    text.split_inclusive('\n').map(move |l| {
        let at = pos;
        pos += l.len();
        (at, l.trim_end_matches(['\n', '\r']))
    })
}

fn block(kind: BlockKind, start: usize, end: usize) -> Block {
    Block { kind, start, end }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rst_in_a_txt_file_is_read_as_rst_and_plain_text_stays_plain() {
        let sphinx = "==========\nModels\n==========\n\nA model is the source.\n\n\
                      Fields\n======\n\nSome text.\n";
        let got = extract_text(sphinx);
        let headings: Vec<_> = got
            .blocks
            .iter()
            .filter_map(|b| match &b.kind {
                BlockKind::Heading { level, text } => Some((*level, text.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(headings, [(1, "Models"), (2, "Fields")]);
        assert_eq!(got.title.as_deref(), Some("Models"));

        let plain = "Dear team,\n\nthe build is green.\nScore: 10 - 2\n\nRegards\n";
        let got = extract_text(plain);
        assert!(got
            .blocks
            .iter()
            .all(|b| matches!(b.kind, BlockKind::Paragraph)));
        assert_eq!(got.blocks.len(), 3);
        assert_eq!(got.title, None);
    }

    use super::*;

    #[test]
    fn plain_paragraphs() {
        let t = "one\ntwo\n\n\n  three  \n";
        let b = paragraphs(t);
        assert_eq!(b.len(), 2);
        assert_eq!(&t[b[0].start..b[0].end], "one\ntwo");
        assert_eq!(&t[b[1].start..b[1].end], "three");
    }

    #[test]
    fn rst_titles_and_literal_blocks() {
        let t = "=====\nGuide\n=====\n\nIntro::\n\n    code here\n\nSection\n-------\n\nText.\n";
        let e = extract_rst(t);
        let kinds: Vec<String> = e.blocks.iter().map(|b| b.kind.to_string()).collect();
        assert_eq!(
            kinds,
            vec!["h1:Guide", "Paragraph", "Code", "h2:Section", "Paragraph"]
        );
        assert_eq!(e.title.as_deref(), Some("Guide"));
    }
}
