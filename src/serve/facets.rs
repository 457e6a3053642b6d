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

/// The facet column over `hits`; `with(filter)` is the search with one more filter.
/// Filters already in force are not offered again.
pub(super) fn facet_column(
    out: &mut String,
    hits: &[Hit],
    active: &[String],
    with: &dyn Fn(&str) -> String,
) {
    // Per facet item: the documents of the result set that have it, and its label.
    let mut labels: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    let mut types: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    let mut entities: BTreeMap<(String, String), (String, BTreeSet<&str>)> = BTreeMap::new();
    for h in hits {
        let doc = h.chunk.document_id.as_str();
        for l in &h.chunk.labels {
            labels.entry(l.label.clone()).or_default().insert(doc);
        }
        for e in &h.chunk.entities {
            types.entry(e.kind.clone()).or_default().insert(doc);
            entities
                .entry((e.kind.clone(), e.norm.clone()))
                .or_insert_with(|| (e.text.clone(), BTreeSet::new()))
                .1
                .insert(doc);
        }
    }
    if labels.is_empty() && entities.is_empty() {
        return;
    }
    let section = |title: &str, id: &str, items: Vec<(String, String, usize)>| -> String {
        let items: Vec<_> = items
            .into_iter()
            .filter(|(filter, _, _)| !active.contains(filter))
            .take(FACET_ITEMS)
            .collect();
        if items.is_empty() {
            return String::new();
        }
        let mut s = format!("<section data-facet={id}><h3>{title}</h3><ul>");
        for (filter, shown, n) in items {
            s.push_str(&format!(
                "<li><a href=\"{}\" data-filter=\"{}\">{}</a> <span class=count>{n}</span></li>",
                escape(&with(&filter)),
                escape(&filter),
                escape(&shown)
            ));
        }
        s.push_str("</ul></section>");
        s
    };
    let by_count = |mut v: Vec<(String, String, usize)>| {
        v.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.1.cmp(&b.1)));
        v
    };
    out.push_str("<aside id=facets aria-label=\"refine the results\"><h2>Refine</h2>");
    out.push_str(&section(
        "Labels",
        "labels",
        by_count(
            labels
                .iter()
                .map(|(l, d)| (format!("label={l}"), l.clone(), d.len()))
                .collect(),
        ),
    ));
    out.push_str(&section(
        "Entity types",
        "types",
        by_count(
            types
                .iter()
                .map(|(t, d)| (format!("entity.{t}=*"), t.clone(), d.len()))
                .collect(),
        ),
    ));
    out.push_str(&section(
        "Entities",
        "entities",
        by_count(
            entities
                .iter()
                .map(|((t, _), (text, d))| {
                    (
                        format!("entity.{t}={text}"),
                        format!("{text} ({t})"),
                        d.len(),
                    )
                })
                .collect(),
        ),
    ));
    out.push_str("</aside>");
}

fn escape(s: &str) -> String {
    super::pages::escape(s)
}
