//! What every index backend returns, whatever it stores in: the index's metadata, a chunk
//! as a search returns it, and the statements and parsing both SQL backends share for them.
//! Neutral: no backend is named here, and every backend imports it.

/// What the index says about itself.
#[derive(Clone, Debug, Default)]
pub struct IndexMeta {
    pub schema_version: i64,
    pub model: Option<String>,
    pub model_dir: Option<String>,
    pub model_fingerprint: Option<String>,
    pub dimension: Option<usize>,
    /// The vec0 table of the active vector set.
    pub vec_table: String,
    /// The active set's bit in `chunks.embedded` (schema 3 on).
    pub active_bit: i64,
    /// The sparse (SPLADE) model of the index's sparse vectors: as named, and its folder.
    pub sparse_model: Option<String>,
    pub sparse_model_dir: Option<String>,
    /// Their dimension (the model's vocabulary).
    pub sparse_dimension: Option<usize>,
}

/// A chunk as stored, with its document's source and title.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ChunkRow {
    #[serde(skip)]
    pub rowid: i64,
    pub id: String,
    pub document_id: String,
    pub source: Option<String>,
    pub title: Option<String>,
    pub heading_path: String,
    pub ordinal: i64,
    pub text: String,
    /// An old version of the chunk, served by vector search until its document's new
    /// version has vectors (the new text is already in the keyword index).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub superseded: bool,
    /// The pages of the document the chunk spans (first, last; from 1), for paged formats.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pages: Option<(u32, u32)>,
    /// What document-level stages (LLM stages) made of the chunk's document, by stage:
    /// `{"summary": "..."}`.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub outputs: std::collections::BTreeMap<String, String>,
    /// The document's entities (the `entities` stage), most mentioned first, at most
    /// [`HIT_ENTITIES`] (their mentions left out).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub entities: Vec<crate::lifecycle::DocumentEntity>,
    /// The document's labels (the `labels` stage), best first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<crate::lifecycle::DocumentLabel>,
    /// The document's metadata (front matter, JSONL fields, PDF properties, the connector's).
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// Entities a search hit carries, at most.
pub const HIT_ENTITIES: usize = 20;

/// The statements that read a document's entities and labels for a hit (`?1`/`$1`: the
/// document), over a backend's tables.
pub fn annotation_sql(entities: &str, labels: &str) -> (String, String) {
    (
        format!(
            "SELECT type, text, norm, mentions, score FROM {entities} WHERE document_id = ?1
             ORDER BY mentions DESC, score DESC, type, norm LIMIT {HIT_ENTITIES}"
        ),
        format!(
            "SELECT label, score FROM {labels} WHERE document_id = ?1 ORDER BY score DESC, label"
        ),
    )
}

/// A document's stored metadata (a JSON object); anything else reads as none.
pub fn metadata_of(json: Option<&str>) -> serde_json::Map<String, serde_json::Value> {
    json.and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_default()
}
