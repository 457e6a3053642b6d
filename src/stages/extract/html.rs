//! HTML: the visible text of the page, one block per paragraph, heading, list item, table
//! and `<pre>`, in reading order. Scripts, styles, navigation and other chrome are left out.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use ego_tree::{NodeId, NodeRef};
use html5ever::tendril::{StrTendril, TendrilSink};
use html5ever::tree_builder::{ElementFlags, NodeOrText, QuirksMode, TreeSink};
use html5ever::{parse_document, Attribute, QualName};
use scraper::{Html, HtmlTreeSink, Node};

use super::budget::{Budget, ParseError};
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

/// How deep elements may nest. Real pages stay well under 100; past this a page is generated
/// or hostile, and html5ever's tree building slows with depth (its scope checks walk the
/// stack of open elements: 100,000 nested `<div>`s are quadratic).
pub const MAX_DEPTH: u32 = 512;

/// Input is parsed this many bytes at a time, with the depth and the budget checked between
/// (small: a chunk of `<div>`s parsed past the limit costs its square).
const CHUNK_BYTES: usize = 2 << 10;

/// Extract `raw` as HTML, checking `budget` and the nesting depth as it parses.
pub fn extract(raw: &str, budget: &Budget) -> Result<Extracted, ParseError> {
    let mut parser = parse_document(DepthSink::new(), Default::default());
    let mut at = 0;
    while at < raw.len() {
        let mut end = (at + CHUNK_BYTES).min(raw.len());
        while !raw.is_char_boundary(end) {
            end += 1;
        }
        parser.process(StrTendril::from_slice(&raw[at..end]));
        at = end;
        let deepest = parser.tokenizer.sink.sink.deepest.get();
        if deepest > MAX_DEPTH {
            return Err(ParseError::Invalid(format!(
                "HTML nested more than {MAX_DEPTH} elements deep (by byte {at} of {}): no page \
                 a reader sees nests so deep, so the file is generated or hostile; fix the \
                 markup (close its elements) or leave the file out",
                raw.len()
            )));
        }
        budget
            .check()
            .map_err(|_| ParseError::OutOfBudget(format!("at byte {at} of {}", raw.len())))?;
    }
    let doc = parser.finish();
    let title = doc
        .select(&scraper::Selector::parse("title").expect("static selector"))
        .next()
        .map(|t| collapse(&t.text().collect::<String>()))
        .filter(|t| !t.is_empty());
    let mut w = Writer::default();
    w.walk(doc.tree.root());
    w.flush(BlockKind::Paragraph);
    Ok(Extracted {
        text: w.text,
        blocks: w.blocks,
        title,
        metadata: Default::default(),
        ..Extracted::default()
    })
}

/// scraper's tree sink, recording how deep each node sits (the parse stops past
/// [`MAX_DEPTH`]).
struct DepthSink {
    inner: HtmlTreeSink,
    depth: RefCell<HashMap<NodeId, u32>>,
    deepest: Cell<u32>,
}

impl DepthSink {
    fn new() -> Self {
        DepthSink {
            inner: HtmlTreeSink::new(Html::new_document()),
            depth: RefCell::new(HashMap::new()),
            deepest: Cell::new(0),
        }
    }

    fn depth_of(&self, node: &NodeId) -> u32 {
        self.depth.borrow().get(node).copied().unwrap_or(0)
    }

    fn placed(&self, node: &NodeOrText<NodeId>, depth: u32) {
        if let NodeOrText::AppendNode(id) = node {
            self.depth.borrow_mut().insert(*id, depth);
            if depth > self.deepest.get() {
                self.deepest.set(depth);
            }
        }
    }
}

impl TreeSink for DepthSink {
    type Handle = NodeId;
    type Output = Html;
    type ElemName<'a> = <HtmlTreeSink as TreeSink>::ElemName<'a>;

    fn finish(self) -> Html {
        self.inner.finish()
    }
    fn parse_error(&self, msg: Cow<'static, str>) {
        self.inner.parse_error(msg)
    }
    fn get_document(&self) -> NodeId {
        self.inner.get_document()
    }
    fn elem_name<'a>(&'a self, target: &'a NodeId) -> Self::ElemName<'a> {
        self.inner.elem_name(target)
    }
    fn create_element(&self, name: QualName, attrs: Vec<Attribute>, flags: ElementFlags) -> NodeId {
        self.inner.create_element(name, attrs, flags)
    }
    fn create_comment(&self, text: StrTendril) -> NodeId {
        self.inner.create_comment(text)
    }
    fn create_pi(&self, target: StrTendril, data: StrTendril) -> NodeId {
        self.inner.create_pi(target, data)
    }
    fn append(&self, parent: &NodeId, child: NodeOrText<NodeId>) {
        self.placed(&child, self.depth_of(parent) + 1);
        self.inner.append(parent, child)
    }
    fn append_based_on_parent_node(
        &self,
        element: &NodeId,
        prev_element: &NodeId,
        child: NodeOrText<NodeId>,
    ) {
        let depth = self.depth_of(element).max(self.depth_of(prev_element) + 1);
        self.placed(&child, depth);
        self.inner
            .append_based_on_parent_node(element, prev_element, child)
    }
    fn append_doctype_to_document(&self, name: StrTendril, public: StrTendril, system: StrTendril) {
        self.inner.append_doctype_to_document(name, public, system)
    }
    fn mark_script_already_started(&self, node: &NodeId) {
        self.inner.mark_script_already_started(node)
    }
    fn pop(&self, node: &NodeId) {
        self.inner.pop(node)
    }
    fn get_template_contents(&self, target: &NodeId) -> NodeId {
        self.inner.get_template_contents(target)
    }
    fn same_node(&self, x: &NodeId, y: &NodeId) -> bool {
        self.inner.same_node(x, y)
    }
    fn set_quirks_mode(&self, mode: QuirksMode) {
        self.inner.set_quirks_mode(mode)
    }
    fn append_before_sibling(&self, sibling: &NodeId, new_node: NodeOrText<NodeId>) {
        self.placed(&new_node, self.depth_of(sibling));
        self.inner.append_before_sibling(sibling, new_node)
    }
    fn add_attrs_if_missing(&self, target: &NodeId, attrs: Vec<Attribute>) {
        self.inner.add_attrs_if_missing(target, attrs)
    }
    fn associate_with_form(
        &self,
        target: &NodeId,
        form: &NodeId,
        nodes: (&NodeId, Option<&NodeId>),
    ) {
        self.inner.associate_with_form(target, form, nodes)
    }
    fn remove_from_parent(&self, target: &NodeId) {
        self.inner.remove_from_parent(target)
    }
    fn reparent_children(&self, node: &NodeId, new_parent: &NodeId) {
        self.inner.reparent_children(node, new_parent)
    }
    fn is_mathml_annotation_xml_integration_point(&self, handle: &NodeId) -> bool {
        self.inner
            .is_mathml_annotation_xml_integration_point(handle)
    }
    fn set_current_line(&self, line: u64) {
        self.inner.set_current_line(line)
    }
    fn allow_declarative_shadow_roots(&self, intended_parent: &NodeId) -> bool {
        self.inner.allow_declarative_shadow_roots(intended_parent)
    }
    fn attach_declarative_shadow(
        &self,
        location: &NodeId,
        template: &NodeId,
        attrs: &[Attribute],
    ) -> bool {
        self.inner
            .attach_declarative_shadow(location, template, attrs)
    }
}

#[derive(Default)]
struct Writer {
    text: String,
    blocks: Vec<Block>,
    /// Inline text of the block being built, whitespace collapsed.
    line: String,
}

/// A step of the walk: a node to enter, or what to do after an element's children.
enum Step<'a> {
    Enter(NodeRef<'a, Node>),
    Heading(u8),
    ListItem,
    Block,
}

impl Writer {
    /// The text below `root` in document order, without recursion (a deep tree cannot
    /// overflow the stack).
    fn walk(&mut self, root: NodeRef<'_, Node>) {
        let mut steps: Vec<Step<'_>> = root.children().rev().map(Step::Enter).collect();
        while let Some(step) = steps.pop() {
            let child = match step {
                Step::Enter(child) => child,
                Step::Heading(level) => {
                    let text = collapse(&self.line);
                    self.flush(BlockKind::Heading { level, text });
                    continue;
                }
                Step::ListItem => {
                    self.flush(BlockKind::ListItem);
                    continue;
                }
                Step::Block => {
                    self.flush(BlockKind::Paragraph);
                    continue;
                }
            };
            let after = match child.value() {
                Node::Text(t) => {
                    push_collapsed(&mut self.line, t);
                    continue;
                }
                Node::Element(e) => {
                    let name = e.name();
                    if SKIP.contains(&name) {
                        continue;
                    }
                    match name {
                        "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => {
                            self.flush(BlockKind::Paragraph);
                            Some(Step::Heading(name.as_bytes()[1] - b'0'))
                        }
                        "pre" => {
                            self.flush(BlockKind::Paragraph);
                            let code: String = text_of(child);
                            self.emit(code.trim_matches('\n'), BlockKind::Code);
                            continue;
                        }
                        "table" => {
                            self.flush(BlockKind::Paragraph);
                            let table = table_text(child);
                            self.emit(&table, BlockKind::Table);
                            continue;
                        }
                        "li" => {
                            self.flush(BlockKind::Paragraph);
                            Some(Step::ListItem)
                        }
                        "br" => {
                            self.line.push('\n');
                            continue;
                        }
                        "img" => {
                            if let Some(alt) = e.attr("alt").filter(|a| !a.trim().is_empty()) {
                                push_collapsed(&mut self.line, alt);
                            }
                            continue;
                        }
                        _ if BLOCKS.contains(&name) => {
                            self.flush(BlockKind::Paragraph);
                            Some(Step::Block)
                        }
                        _ => None,
                    }
                }
                _ => continue,
            };
            steps.extend(after);
            steps.extend(child.children().rev().map(Step::Enter));
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
        let e = extract(html, &Budget::unlimited()).unwrap();
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

    #[test]
    fn deep_nesting_fails_with_the_reason_instead_of_overflowing_or_crawling() {
        // 100,000 nested elements: the old recursive walk overflowed a worker's stack, and
        // html5ever's tree building is quadratic in the depth.
        let deep = "<div>".repeat(100_000);
        let e = extract(&deep, &Budget::unlimited())
            .unwrap_err()
            .to_string();
        assert!(e.contains("nested more than 512"), "{e}");
        // It stopped within the first chunks, not after the whole quadratic parse.
        let at: usize = e
            .split("by byte ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(at <= 4 * CHUNK_BYTES, "{e}");
        // Just under the limit parses, and the walk needs no recursion.
        let ok = format!("{}text{}", "<div>".repeat(500), "</div>".repeat(500));
        let e = extract(&ok, &Budget::unlimited()).unwrap();
        assert_eq!(e.text, "text");
        // Deep inline nesting (no block elements) as well.
        let inline = format!("{}deep{}", "<span>".repeat(500), "</span>".repeat(500));
        assert_eq!(extract(&inline, &Budget::unlimited()).unwrap().text, "deep");
    }
}
