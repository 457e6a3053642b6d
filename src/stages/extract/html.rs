//! HTML: the visible text of the page, one block per paragraph, heading, list item, table
//! and `<pre>`, in reading order. Scripts, styles, navigation and other chrome are left out.

use ego_tree::NodeRef;
use scraper::{Html, Node};

use super::Extracted;
use crate::document::{Block, BlockKind};

/// Elements whose content is never text for the reader.
const SKIP: &[&str] = &[
    "script", "style", "noscript", "template", "svg", "head", "nav", "iframe", "object", "canvas",
    "button", "select", "form",
];

/// Elements that start and end a block.
const BLOCKS: &[&str] = &[
    "p",
    "div",
    "section",
    "article",
    "main",
    "header",
    "footer",
    "aside",
    "blockquote",
    "ul",
    "ol",
    "dl",
    "dt",
    "dd",
    "figure",
    "figcaption",
    "details",
    "summary",
    "address",
    "hr",
    "body",
    "html",
];

pub fn extract(raw: &str) -> Extracted {
    let doc = Html::parse_document(raw);
    let title = doc
        .select(&scraper::Selector::parse("title").expect("static selector"))
        .next()
        .map(|t| collapse(&t.text().collect::<String>()))
        .filter(|t| !t.is_empty());
    let mut w = Writer::default();
    w.walk(doc.tree.root());
    w.flush(BlockKind::Paragraph);
    Extracted {
        text: w.text,
        blocks: w.blocks,
        title,
        metadata: Default::default(),
        ..Extracted::default()
    }
}

#[derive(Default)]
struct Writer {
    text: String,
    blocks: Vec<Block>,
    /// Inline text of the block being built, whitespace collapsed.
    line: String,
}

impl Writer {
    fn walk(&mut self, node: NodeRef<'_, Node>) {
        for child in node.children() {
            match child.value() {
                Node::Text(t) => push_collapsed(&mut self.line, t),
                Node::Element(e) => {
                    let name = e.name();
                    if SKIP.contains(&name) {
                        continue;
                    }
                    match name {
                        "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => {
                            self.flush(BlockKind::Paragraph);
                            let level = name.as_bytes()[1] - b'0';
                            self.walk(child);
                            let text = collapse(&self.line);
                            self.flush(BlockKind::Heading { level, text });
                        }
                        "pre" => {
                            self.flush(BlockKind::Paragraph);
                            let code: String = text_of(child);
                            self.emit(code.trim_matches('\n'), BlockKind::Code);
                        }
                        "table" => {
                            self.flush(BlockKind::Paragraph);
                            let table = table_text(child);
                            self.emit(&table, BlockKind::Table);
                        }
                        "li" => {
                            self.flush(BlockKind::Paragraph);
                            self.walk(child);
                            self.flush(BlockKind::ListItem);
                        }
                        "br" => self.line.push('\n'),
                        "img" => {
                            if let Some(alt) = e.attr("alt").filter(|a| !a.trim().is_empty()) {
                                push_collapsed(&mut self.line, alt);
                            }
                        }
                        _ if BLOCKS.contains(&name) => {
                            self.flush(BlockKind::Paragraph);
                            self.walk(child);
                            self.flush(BlockKind::Paragraph);
                        }
                        _ => self.walk(child),
                    }
                }
                _ => {}
            }
        }
    }

    /// End the inline block being built, if it has text.
    fn flush(&mut self, kind: BlockKind) {
        let line = std::mem::take(&mut self.line);
        let trimmed = line
            .split('\n')
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        self.emit(&trimmed, kind);
    }

    fn emit(&mut self, content: &str, kind: BlockKind) {
        if content.trim().is_empty() {
            return;
        }
        if !self.text.is_empty() {
            self.text.push_str("\n\n");
        }
        let start = self.text.len();
        self.text.push_str(content);
        self.blocks.push(Block {
            kind,
            start,
            end: self.text.len(),
        });
    }
}

/// All text below `node`, as is (for `<pre>`).
fn text_of(node: NodeRef<'_, Node>) -> String {
    let mut out = String::new();
    for d in node.descendants() {
        if let Node::Text(t) = d.value() {
            out.push_str(t);
        }
    }
    out
}

/// A table as lines of cells separated by " | ".
fn table_text(table: NodeRef<'_, Node>) -> String {
    let mut rows = Vec::new();
    for d in table.descendants() {
        if let Node::Element(e) = d.value() {
            if e.name() == "tr" {
                let cells: Vec<String> = d
                    .children()
                    .filter(|c| {
                        matches!(c.value(), Node::Element(e) if e.name() == "td" || e.name() == "th")
                    })
                    .map(|c| collapse(&text_of(c)))
                    .collect();
                if cells.iter().any(|c| !c.is_empty()) {
                    rows.push(cells.join(" | "));
                }
            }
        }
    }
    rows.join("\n")
}

fn push_collapsed(out: &mut String, text: &str) {
    for (i, word) in text.split_whitespace().enumerate() {
        let joins = i == 0 && !text.starts_with(char::is_whitespace);
        if !out.is_empty() && !out.ends_with(['\n', ' ']) && !joins {
            out.push(' ');
        }
        out.push_str(word);
    }
    if text.ends_with(char::is_whitespace) && !out.is_empty() && !out.ends_with(['\n', ' ']) {
        out.push(' ');
    }
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_visible_text_with_structure() {
        let html = "<html><head><title>T</title><style>x{}</style></head><body>\
            <nav>menu</nav><h1>Intro</h1><p>Hello <b>big</b>\n world.</p>\
            <pre>fn main() {\n    go();\n}</pre><ul><li>one</li><li>two</li></ul>\
            <table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr></table>\
            <script>alert(1)</script></body></html>";
        let e = extract(html);
        assert_eq!(e.title.as_deref(), Some("T"));
        assert_eq!(
            e.text,
            "Intro\n\nHello big world.\n\nfn main() {\n    go();\n}\n\none\n\ntwo\n\na | b\n1 | 2"
        );
        let kinds: Vec<&BlockKind> = e.blocks.iter().map(|b| &b.kind).collect();
        assert_eq!(
            kinds,
            vec![
                &BlockKind::Heading {
                    level: 1,
                    text: "Intro".into()
                },
                &BlockKind::Paragraph,
                &BlockKind::Code,
                &BlockKind::ListItem,
                &BlockKind::ListItem,
                &BlockKind::Table,
            ]
        );
    }
}
