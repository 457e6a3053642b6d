//! Markdown (CommonMark with tables, and MDX as markdown): the text is the source itself
//! (front matter removed), so chunks keep their code fences and tables; the structure comes
//! from pulldown-cmark's offsets.

use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};

use super::{front_matter, Extracted};
use crate::document::{Block, BlockKind};

pub fn extract(raw: &str) -> Extracted {
    let (metadata, body_start) = front_matter::split(raw);
    let text = raw[body_start..].to_string();
    let blocks = blocks(&text);
    let title = metadata
        .get("title")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    Extracted {
        text,
        blocks,
        title,
        metadata,
    }
}

/// Top-level blocks of `text`, list items as blocks of their own.
pub fn blocks(text: &str) -> Vec<Block> {
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS;
    let mut blocks = Vec::new();
    let mut depth = 0usize;
    // Depth of the list whose items are blocks, when the list is top-level.
    let mut top_list = false;
    let mut heading: Option<(u8, String, usize)> = None;
    for (event, range) in Parser::new_ext(text, options).into_offset_iter() {
        match event {
            Event::Start(tag) => {
                if depth == 0 {
                    match &tag {
                        Tag::Heading { level, .. } => {
                            heading = Some((level_of(*level), String::new(), range.start));
                        }
                        Tag::List(_) => top_list = true,
                        _ => blocks.push(Block {
                            kind: kind_of(&tag),
                            start: range.start,
                            end: range.end,
                        }),
                    }
                } else if depth == 1 && top_list && matches!(tag, Tag::Item) {
                    blocks.push(Block {
                        kind: BlockKind::ListItem,
                        start: range.start,
                        end: range.end,
                    });
                }
                depth += 1;
            }
            Event::End(tag) => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    if let (TagEnd::Heading(_), Some((level, title, start))) = (tag, heading.take())
                    {
                        blocks.push(Block {
                            kind: BlockKind::Heading {
                                level,
                                text: clean_heading(&title),
                            },
                            start,
                            end: range.end,
                        });
                    }
                    if matches!(tag, TagEnd::List(_)) {
                        top_list = false;
                    }
                }
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some((_, title, _)) = heading.as_mut() {
                    title.push_str(&t);
                }
            }
            Event::InlineHtml(_) | Event::SoftBreak | Event::HardBreak => {
                if let Some((_, title, _)) = heading.as_mut() {
                    title.push(' ');
                }
            }
            Event::Html(_) | Event::Rule if depth == 0 => blocks.push(Block {
                kind: BlockKind::Other,
                start: range.start,
                end: range.end,
            }),
            _ => {}
        }
    }
    for b in &mut blocks {
        // Blocks end before their trailing newlines.
        while b.end > b.start && text.as_bytes()[b.end - 1].is_ascii_whitespace() {
            b.end -= 1;
        }
    }
    blocks.retain(|b| b.end > b.start);
    blocks
}

fn level_of(level: HeadingLevel) -> u8 {
    match level {
        HeadingLevel::H1 => 1,
        HeadingLevel::H2 => 2,
        HeadingLevel::H3 => 3,
        HeadingLevel::H4 => 4,
        HeadingLevel::H5 => 5,
        HeadingLevel::H6 => 6,
    }
}

fn kind_of(tag: &Tag<'_>) -> BlockKind {
    match tag {
        Tag::Paragraph => BlockKind::Paragraph,
        Tag::CodeBlock(_) => BlockKind::Code,
        Tag::Table(_) => BlockKind::Table,
        _ => BlockKind::Other,
    }
}

/// Heading text without MDX comments and anchors (`## Usage {/*usage*/}` -> `Usage`).
fn clean_heading(raw: &str) -> String {
    let mut s = raw.trim().to_string();
    while s.ends_with('}') {
        match s.rfind('{') {
            Some(i) => s.truncate(i),
            None => break,
        }
        s = s.trim_end().to_string();
    }
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_headings_code_tables_and_items() {
        let md = "# Hooks {/*hooks*/}\n\nIntro `text`.\n\n## useEffect\n\n```js\nuseEffect(() => {});\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n- one\n- two\n";
        let b = blocks(md);
        let kinds: Vec<String> = b
            .iter()
            .map(|b| match &b.kind {
                BlockKind::Heading { level, text } => format!("h{level}:{text}"),
                k => format!("{k:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                "h1:Hooks",
                "Paragraph",
                "h2:useEffect",
                "Code",
                "Table",
                "ListItem",
                "ListItem"
            ]
        );
        assert_eq!(
            &md[b[3].start..b[3].end],
            "```js\nuseEffect(() => {});\n```"
        );
        assert_eq!(&md[b[5].start..b[5].end], "- one");
    }

    #[test]
    fn front_matter_becomes_the_title() {
        let e = extract("---\ntitle: Caveats\n---\nBody text.\n");
        assert_eq!(e.title.as_deref(), Some("Caveats"));
        assert_eq!(e.text, "Body text.\n");
        assert_eq!(e.blocks.len(), 1);
    }
}
