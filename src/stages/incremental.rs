//! The incremental stage: hashes each document's content (or takes the version its connector
//! set) and, when the index already holds that exact content made with the same pipeline
//! (chunker and model fingerprint), marks it unchanged so no chunking or embedding is done
//! again.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Stage, StageError};
use crate::document::Document;
use crate::lifecycle::KnownDocument;

pub struct Incremental {
    known: Arc<HashMap<String, KnownDocument>>,
    fingerprint: Arc<str>,
}

impl Incremental {
    /// `known`: what the index holds (complete documents only); `fingerprint`: this run's
    /// pipeline fingerprint.
    pub fn new(known: Arc<HashMap<String, KnownDocument>>, fingerprint: Arc<str>) -> Self {
        Incremental { known, fingerprint }
    }
}

/// The content hash stored in the index.
pub fn content_hash(text: &str) -> String {
    bytes_hash(text.as_bytes())
}

/// The content hash of content read as bytes (PDF, DOCX).
pub fn bytes_hash(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex()[..32].to_string()
}

impl Stage for Incremental {
    fn name(&self) -> &'static str {
        "incremental"
    }

    fn process(&mut self, doc: &mut Document) -> Result<Vec<Document>, StageError> {
        if doc.is_child() {
            return Ok(Vec::new());
        }
        // A connector that knows a cheaper version of the content (a table's `updated=`
        // column) sets it as the hash; otherwise the content is hashed.
        let hash = match (&doc.content_hash, &doc.raw) {
            (Some(preset), _) => preset.clone(),
            (None, Some(raw)) => bytes_hash(raw),
            (None, None) => content_hash(&doc.fields.text),
        };
        doc.unchanged = self
            .known
            .get(&doc.id)
            .is_some_and(|k| k.content_hash == hash && *k.fingerprint == *self.fingerprint);
        doc.content_hash = Some(hash);
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_only_identical_content_under_the_same_fingerprint() {
        let mut known = HashMap::new();
        known.insert(
            "a".to_string(),
            KnownDocument {
                content_hash: content_hash("same"),
                fingerprint: "fp1".into(),
            },
        );
        let known = Arc::new(known);
        let mut stage = Incremental::new(Arc::clone(&known), "fp1".into());
        let mut same = Document::new("a", "same");
        stage.process(&mut same).unwrap();
        assert!(same.unchanged);
        let mut edited = Document::new("a", "edited");
        stage.process(&mut edited).unwrap();
        assert!(!edited.unchanged);
        let mut other_model = Document::new("a", "same");
        Incremental::new(known, "fp2".into())
            .process(&mut other_model)
            .unwrap();
        assert!(!other_model.unchanged);
        assert_eq!(
            other_model.content_hash.as_deref(),
            Some(content_hash("same").as_str())
        );
    }

    #[test]
    fn a_version_the_connector_set_is_compared_instead_of_the_text() {
        let mut known = HashMap::new();
        known.insert(
            "t/1".to_string(),
            KnownDocument {
                content_hash: "version-7".into(),
                fingerprint: "fp".into(),
            },
        );
        let mut stage = Incremental::new(Arc::new(known), "fp".into());
        // Published without its text: the version alone says it is unchanged.
        let mut same = Document::new("t/1", "");
        same.content_hash = Some("version-7".into());
        stage.process(&mut same).unwrap();
        assert!(same.unchanged);
        let mut newer = Document::new("t/1", "same text");
        newer.content_hash = Some("version-8".into());
        stage.process(&mut newer).unwrap();
        assert!(!newer.unchanged);
        assert_eq!(newer.content_hash.as_deref(), Some("version-8"));
    }
}
