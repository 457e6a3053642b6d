//! Markdown (CommonMark with tables, and MDX as markdown): the text is the source itself
//! (front matter removed), so chunks keep their code fences and tables; the structure comes
//! from pulldown-cmark's offsets.

use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};

use super::{front_matter, Extracted};
use crate::document::{Block, BlockKind};

pub fn extract(raw: &str) -> Extracted {
    let (metadata, body_start) = front_matter::split(raw);
    let text = strip_markup(&raw[body_start..]);
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
        ..Extracted::default()
    }
}

/// Remove what is markup and not content, outside code: HTML and JSX tags (their inner text
/// stays: `<CodeStep step={1}>setup</CodeStep>` becomes `setup`) and MDX comments
/// (`{/*usage*/}`). Lines left empty by it go too. Chunks then hold what a reader reads, which
/// embeds better; code blocks and inline code are left exactly as written.
pub fn strip_markup(text: &str) -> String {
    let options =
        Options::ENABLE_TABLES | Options::ENABLE_FOOTNOTES | Options::ENABLE_STRIKETHROUGH;
    let mut cut: Vec<(usize, usize)> = Vec::new();
    let mut code: Vec<(usize, usize)> = Vec::new();
    let mut in_code_block = false;
    for (event, range) in Parser::new_ext(text, options).into_offset_iter() {
        match event {
            Event::Start(Tag::CodeBlock(_)) => {
                in_code_block = true;
                code.push((range.start, range.end));
            }
            Event::End(TagEnd::CodeBlock) => in_code_block = false,
            Event::Code(_) => code.push((range.start, range.end)),
            Event::InlineHtml(_) if !in_code_block => cut.push((range.start, range.end)),
            Event::Html(_) if !in_code_block => tags_in(text, range.start, range.end, &mut cut),
            _ => {}
        }
    }
    // MDX comments span several markdown events (`*` reads as emphasis): find them in the
    // text itself, outside code.
    let mut from = 0;
    while let Some(p) = text[from..].find("{/*") {
        let a = from + p;
        let Some(q) = text[a..].find("*/}") else {
            break;
        };
        let b = a + q + 3;
        if !code.iter().any(|&(c0, c1)| a < c1 && b > c0) {
            let a = if a > 0 && text.as_bytes()[a - 1] == b' ' {
                a - 1
            } else {
                a
            };
            cut.push((a, b));
        }
        from = b;
    }
    if cut.is_empty() {
        return text.to_string();
    }
    cut.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (a, b) in cut {
        if a >= at {
            out.push_str(&text[at..a]);
            at = b;
        } else if b > at {
            at = b;
        }
    }
    out.push_str(&text[at..]);
    // Drop lines that held nothing but markup; keep blank lines between blocks single.
    let mut cleaned = String::with_capacity(out.len());
    let mut blank = false;
    for line in out.split_inclusive('\n') {
        let empty = line.trim().is_empty();
        if empty && blank {
            continue;
        }
        blank = empty;
        cleaned.push_str(if empty { "\n" } else { line });
    }
    cleaned
}

/// Ranges of `<tag ...>` and `</tag>` in `text[start..end]` (an HTML block: its text stays).
fn tags_in(text: &str, start: usize, end: usize, cut: &mut Vec<(usize, usize)>) {
    let bytes = text.as_bytes();
    let mut i = start;
    while i < end {
        if bytes[i] == b'<' {
            let name_at = i + 1 + usize::from(bytes.get(i + 1) == Some(&b'/'));
            let starts_tag = bytes.get(name_at).is_some_and(|b| b.is_ascii_alphabetic());
            let comment = text[i..end].starts_with("<!--");
            let close = if comment {
                text[i..end].find("-->").map(|p| i + p + 3)
            } else if starts_tag {
                text[i..end].find('>').map(|p| i + p + 1)
            } else {
                None
            };
            if let Some(c) = close {
                cut.push((i, c));
                i = c;
                continue;
            }
        }
        i += 1;
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
        let kinds: Vec<String> = b.iter().map(|b| b.kind.to_string()).collect();
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
    fn strips_jsx_tags_and_mdx_comments_but_not_code() {
        let md = "## Usage {/*usage*/}\n\n<Intro>\n\nThe <CodeStep step={1}>setup code</CodeStep> runs.\n\n</Intro>\n\n```js\n<div>{/*keep*/}</div>\n```\n\nUse `<App />` here.\n";
        assert_eq!(
            strip_markup(md),
            "## Usage\n\nThe setup code runs.\n\n```js\n<div>{/*keep*/}</div>\n```\n\nUse `<App />` here.\n"
        );
    }

    #[test]
    fn front_matter_becomes_the_title() {
        let e = extract("---\ntitle: Caveats\n---\nBody text.\n");
        assert_eq!(e.title.as_deref(), Some("Caveats"));
        assert_eq!(e.text, "Body text.\n");
        assert_eq!(e.blocks.len(), 1);
    }
}
