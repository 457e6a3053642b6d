//! What the search page shows of the enrichment stages: each hit's summary (an LLM stage
//! named `summary`), labels and top entities, the filters in force (each with a link that
//! removes it), and a facet column: the labels, entity types and entities of the result set
//! with how many of its documents have each, as links that add the filter.

use std::collections::{BTreeMap, BTreeSet};

use crate::search::Hit;

/// Entities shown under a hit, at most.
const HIT_ENTITIES: usize = 6;
/// Items per facet, at most.
const FACET_ITEMS: usize = 8;
/// Characters of a summary shown under a hit, at most.
const SUMMARY_CHARS: usize = 400;

/// A hit's summary, labels and top entities (nothing when its document has none).
pub(super) fn annotations(out: &mut String, h: &Hit) {
    let c = &h.chunk;
    if let Some(summary) = c.outputs.get("summary") {
        let cut: String = summary.chars().take(SUMMARY_CHARS).collect();
        let more = if cut.len() < summary.len() { "…" } else { "" };
        out.push_str(&format!("<p class=summary>{}{more}</p>", escape(&cut)));
    }
    if !c.labels.is_empty() {
        out.push_str("<p class=labels>");
        for l in &c.labels {
            out.push_str(&format!(
                "<span class=label data-label=\"{0}\">{0} <small>{1:.2}</small></span> ",
                escape(&l.label),
                l.score
            ));
        }
        out.push_str("</p>");
    }
    if !c.entities.is_empty() {
        out.push_str("<p class=entities>");
        for e in c.entities.iter().take(HIT_ENTITIES) {
            out.push_str(&format!(
                "<span class=entity data-type=\"{0}\"><small>{0}</small> {1}</span> ",
                escape(&e.kind),
                escape(&e.text)
            ));
        }
        out.push_str("</p>");
    }
}

/// The filters in force, each with a link to the search without it (`without(i)`).
pub(super) fn active_filters(
    out: &mut String,
    filters: &[String],
    without: &dyn Fn(usize) -> String,
) {
    if filters.is_empty() {
        return;
    }
    out.push_str("<p id=filters>Filtered by ");
    for (i, f) in filters.iter().enumerate() {
        out.push_str(&format!(
            "<span class=filter data-filter=\"{0}\">{0} <a href=\"{1}\" \
             aria-label=\"remove the filter {0}\">×</a></span> ",
            escape(f),
            escape(&without(i))
        ));
    }
    out.push_str("</p>");
}

/// A facet's item: the filter it adds, what it shows, the documents of the results that
/// have it.
type Item = (String, String, usize);

/// The labels, entity types and entities of a result set, each with its documents.
#[derive(Default)]
struct Tally<'a> {
    labels: BTreeMap<String, BTreeSet<&'a str>>,
    types: BTreeMap<String, BTreeSet<&'a str>>,
    entities: BTreeMap<(String, String), (String, BTreeSet<&'a str>)>,
}

impl<'a> Tally<'a> {
    fn of(hits: &'a [Hit]) -> Tally<'a> {
        let mut t = Tally::default();
        for h in hits {
            let doc = h.chunk.document_id.as_str();
            for l in &h.chunk.labels {
                t.labels.entry(l.label.clone()).or_default().insert(doc);
            }
            for e in &h.chunk.entities {
                t.types.entry(e.kind.clone()).or_default().insert(doc);
                t.entities
                    .entry((e.kind.clone(), e.norm.clone()))
                    .or_insert_with(|| (e.text.clone(), BTreeSet::new()))
                    .1
                    .insert(doc);
            }
        }
        t
    }

    /// The three facets' items, most documents first.
    fn facets(&self) -> [(&'static str, &'static str, Vec<Item>); 3] {
        let by_count = |mut v: Vec<Item>| {
            v.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.1.cmp(&b.1)));
            v
        };
        let labels = self
            .labels
            .iter()
            .map(|(l, d)| (format!("label={l}"), l.clone(), d.len()));
        let types = self
            .types
            .iter()
            .map(|(t, d)| (format!("entity.{t}=*"), t.clone(), d.len()));
        let entities = self.entities.iter().map(|((t, _), (text, d))| {
            (
                format!("entity.{t}={text}"),
                format!("{text} ({t})"),
                d.len(),
            )
        });
        [
            ("Labels", "labels", by_count(labels.collect())),
            ("Entity types", "types", by_count(types.collect())),
            ("Entities", "entities", by_count(entities.collect())),
        ]
    }
}

/// The facet column over `hits`; `with(filter)` is the search with one more filter.
/// Filters already in force are not offered again.
pub(super) fn facet_column(
    out: &mut String,
    hits: &[Hit],
    active: &[String],
    with: &dyn Fn(&str) -> String,
) {
    let tally = Tally::of(hits);
    if tally.labels.is_empty() && tally.entities.is_empty() {
        return;
    }
    out.push_str("<aside id=facets aria-label=\"refine the results\"><h2>Refine</h2>");
    for (title, id, items) in tally.facets() {
        let items: Vec<Item> = items
            .into_iter()
            .filter(|(filter, _, _)| !active.contains(filter))
            .take(FACET_ITEMS)
            .collect();
        if items.is_empty() {
            continue;
        }
        out.push_str(&format!("<section data-facet={id}><h3>{title}</h3><ul>"));
        for (filter, shown, n) in items {
            out.push_str(&format!(
                "<li><a href=\"{}\" data-filter=\"{}\">{}</a> <span class=count>{n}</span></li>",
                escape(&with(&filter)),
                escape(&filter),
                escape(&shown)
            ));
        }
        out.push_str("</ul></section>");
    }
    out.push_str("</aside>");
}

fn escape(s: &str) -> String {
    super::pages::escape(s)
}
