//! The requeue connector: publishes again documents a run could not get into the index, from
//! the copies the index kept of them (`ragline dlq requeue`). A copy is the document as it was
//! published (its raw content included), or failing that its source file, read again.

use std::path::Path;

use super::filesystem::{read_document, Unusable};
use super::{Connector, ConnectorError};
use crate::document::Document;
use crate::publisher::Publisher;
use crate::queue::wire::Wire;

/// One document to run again.
#[derive(Clone, Debug, PartialEq)]
pub struct Requeued {
    pub id: String,
    /// The document as published (`queue::wire` form).
    pub payload: Option<Vec<u8>>,
    /// Its source file, read again when there is no payload.
    pub source: Option<String>,
}

pub struct RequeueConnector {
    documents: Vec<Requeued>,
    max_file_bytes: u64,
}

impl RequeueConnector {
    pub fn new(documents: Vec<Requeued>, max_file_bytes: u64) -> Self {
        RequeueConnector {
            documents,
            max_file_bytes,
        }
    }
}

/// The document of a copy, or why there is none.
fn restore(r: &Requeued, max_file_bytes: u64) -> Result<Document, Unusable> {
    if let Some(payload) = &r.payload {
        return Document::decode(payload)
            .map(|mut doc| {
                doc.id = r.id.clone();
                doc
            })
            .map_err(|e| {
                Unusable::Failed(format!(
                    "the copy the index kept is unreadable ({e}): run `ragline ingest` on its \
                     source again"
                ))
            });
    }
    match &r.source {
        Some(source) if Path::new(source).is_file() => {
            read_document(Path::new(source), r.id.clone(), max_file_bytes)
        }
        Some(source) => Err(Unusable::Failed(format!(
            "its source `{source}` is not a file this process can read: run `ragline ingest` \
             on it again where it is"
        ))),
        None => Err(Unusable::Failed(
            "the index kept no copy of it and knows no source: run `ragline ingest` on its \
             source again"
                .into(),
        )),
    }
}

impl Connector for RequeueConnector {
    fn name(&self) -> &'static str {
        "requeue"
    }

    fn run(&mut self, publisher: &Publisher) -> Result<(), ConnectorError> {
        publisher.announce(self.documents.len() as u64);
        for r in &self.documents {
            match restore(r, self.max_file_bytes) {
                Ok(doc) => publisher.publish(doc)?,
                Err(why) => why.publish(publisher, &r.id, r.source.as_deref(), "requeue"),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_the_published_document_or_its_source_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut doc = Document::new("a.md", "# A\n\nText.");
        doc.fields.source = Some("/gone/a.md".into());
        let from_payload = restore(
            &Requeued {
                id: "a.md".into(),
                payload: Some(doc.encode()),
                source: None,
            },
            1 << 20,
        )
        .unwrap();
        assert_eq!(from_payload.fields.text, "# A\n\nText.");
        assert_eq!(from_payload.fields.source.as_deref(), Some("/gone/a.md"));

        let file = dir.path().join("b.md");
        std::fs::write(&file, "# B\n\nMore.").unwrap();
        let from_source = restore(
            &Requeued {
                id: "b.md".into(),
                payload: None,
                source: Some(file.display().to_string()),
            },
            1 << 20,
        )
        .unwrap();
        assert_eq!(from_source.id, "b.md");
        assert_eq!(from_source.fields.text, "# B\n\nMore.");

        for (r, says) in [
            (
                Requeued {
                    id: "c".into(),
                    payload: Some(b"not msgpack".to_vec()),
                    source: None,
                },
                "unreadable",
            ),
            (
                Requeued {
                    id: "d".into(),
                    payload: None,
                    source: Some("/no/such/file.md".into()),
                },
                "not a file",
            ),
            (
                Requeued {
                    id: "e".into(),
                    payload: None,
                    source: None,
                },
                "no copy",
            ),
        ] {
            match restore(&r, 1 << 20) {
                Err(Unusable::Failed(reason)) => assert!(reason.contains(says), "{reason}"),
                other => panic!("{}: {other:?}", r.id),
            }
        }
    }
}
