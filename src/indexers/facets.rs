//! Facets and graph edges of the entities and labels stages: which entities (and labels)
//! the documents of a search or a filter have, with how many documents each, and the
//! (document, entity) edges a knowledge graph is built from. Backends read them from
//! `document_entities` and `document_labels` by their indexes; the statements are made here
//! once, for both dialects.

use serde::Serialize;

use super::BackendError;

/// An entity of the facet: the documents that mention it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EntityFacet {
    #[serde(rename = "type")]
    pub kind: String,
    /// Its form in the document that mentions it most.
    pub text: String,
    pub norm: String,
    pub documents: u64,
    pub mentions: u64,
}

/// A label of the facet: the documents that have it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LabelFacet {
    pub label: String,
    pub documents: u64,
}

/// A (document, entity) edge: the document mentions the entity `count` times.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EntityEdge {
    pub document: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub entity: String,
    pub norm: String,
    pub count: u64,
}

/// The index has no entities table (made before the entities stage existed, or by a backend
/// without one).
pub(crate) fn no_entities(index: &str) -> BackendError {
    BackendError::Invalid(format!(
        "{index} has no entities or labels: run the entities and labels stages on a sqlite:// \
         or postgres:// index (`ragline enrich --ner-model M --classifier-model M`)"
    ))
}

/// Which SQL a statement is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres,
}

impl Dialect {
    fn mark(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Postgres => format!("${n}"),
        }
    }
}

/// The entity facet's statement over `cond` (a filter on `doc`, with `params` parameters):
/// then the type (or NULL) and the limit are the next two parameters. Columns: type, text,
/// norm, documents, mentions.
pub(crate) fn entity_facet_sql(d: Dialect, schema: &str, cond: &str, params: usize) -> String {
    let (kind, top) = (d.mark(params + 1), d.mark(params + 2));
    // The form of the document that mentions it most: SQLite takes the bare column of the
    // row of MAX(); Postgres orders an aggregate.
    let text = match d {
        Dialect::Sqlite => "e.text",
        Dialect::Postgres => "(array_agg(e.text ORDER BY e.mentions DESC, e.text))[1]",
    };
    let cast = match d {
        Dialect::Sqlite => "",
        Dialect::Postgres => "::text",
    };
    format!(
        "SELECT e.type, {text}, e.norm, COUNT(*) AS documents, SUM(e.mentions) AS mentions,
                MAX(e.mentions)
         FROM {schema}document_entities e JOIN {schema}documents doc ON doc.id = e.document_id
         WHERE {cond} AND ({kind}{cast} IS NULL OR e.type = {kind}{cast})
         GROUP BY e.type, e.norm
         ORDER BY documents DESC, mentions DESC, e.type, e.norm LIMIT {top}"
    )
}

/// The label facet's statement (then the limit is the next parameter). Columns: label,
/// documents.
pub(crate) fn label_facet_sql(d: Dialect, schema: &str, cond: &str, params: usize) -> String {
    let top = d.mark(params + 1);
    format!(
        "SELECT l.label, COUNT(*) AS documents
         FROM {schema}document_labels l JOIN {schema}documents doc ON doc.id = l.document_id
         WHERE {cond} GROUP BY l.label ORDER BY documents DESC, l.label LIMIT {top}"
    )
}

/// The edges' statement (then the type or NULL is the next parameter). Columns: document,
/// type, text, norm, mentions.
pub(crate) fn edges_sql(d: Dialect, schema: &str, cond: &str, params: usize) -> String {
    let kind = d.mark(params + 1);
    let cast = match d {
        Dialect::Sqlite => "",
        Dialect::Postgres => "::text",
    };
    format!(
        "SELECT e.document_id, e.type, e.text, e.norm, e.mentions
         FROM {schema}document_entities e JOIN {schema}documents doc ON doc.id = e.document_id
         WHERE {cond} AND ({kind}{cast} IS NULL OR e.type = {kind}{cast})
         ORDER BY e.document_id, e.type, e.norm"
    )
}
