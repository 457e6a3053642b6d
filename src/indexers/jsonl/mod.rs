//! `jsonl:PATH`: one JSON object per document or chunk, for inspecting a run's output and for
//! batch-embedding users who want vectors in a file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::{Backend, BackendError, BackendFactory, ItemError};
use crate::document::Document;

/// One line of output.
#[derive(Serialize)]
pub struct Record<'a> {
    pub id: &'a str,
    /// "document" or "chunk".
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'a str>,
    pub text: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: &'a BTreeMap<String, serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordinal: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heading_path: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_count: Option<u32>,
    /// The pages a chunk spans (first, last; from 1), for paged formats: `[first, last]`, as
    /// `search --json` gives them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pages: Option<(u32, u32)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vector: Option<&'a [f32]>,
}

impl<'a> Record<'a> {
    pub fn of(doc: &'a Document) -> Self {
        let chunk = doc.chunk.as_deref();
        Record {
            id: &doc.id,
            kind: if chunk.is_some() { "chunk" } else { "document" },
            parent_id: doc.parent_id.as_deref(),
            title: doc.fields.title.as_deref(),
            source: doc.fields.source.as_deref(),
            text: &doc.fields.text,
            metadata: &doc.fields.metadata,
            ordinal: chunk.map(|c| c.ordinal),
            heading_path: chunk.map(|c| c.heading_path.as_slice()),
            start: chunk.map(|c| c.start),
            end: chunk.map(|c| c.end),
            token_count: chunk.map(|c| c.token_count),
            pages: chunk.and_then(|c| c.pages),
            vector: chunk.and_then(|c| c.vector.as_deref()),
        }
    }
}

/// The output file, shared by the indexer threads.
pub struct JsonlFactory {
    path: PathBuf,
    out: Arc<Mutex<BufWriter<File>>>,
}

impl JsonlFactory {
    /// Create (or truncate) the file now, so an unwritable path stops the run before it starts.
    pub fn create(path: &Path) -> Result<Self, BackendError> {
        let file = File::create(path).map_err(|source| BackendError::Unwritable {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(JsonlFactory {
            path: path.to_path_buf(),
            out: Arc::new(Mutex::new(BufWriter::with_capacity(1 << 20, file))),
        })
    }
}

impl BackendFactory for JsonlFactory {
    fn describe(&self) -> String {
        format!("jsonl:{}", self.path.display())
    }

    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(JsonlBackend {
            path: self.path.clone(),
            out: Arc::clone(&self.out),
            line: Vec::with_capacity(4096),
        }))
    }
}

struct JsonlBackend {
    path: PathBuf,
    out: Arc<Mutex<BufWriter<File>>>,
    line: Vec<u8>,
}

impl Backend for JsonlBackend {
    fn write(&mut self, batch: &[Document]) -> Vec<Result<(), ItemError>> {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let mut results: Vec<Result<(), ItemError>> = batch
            .iter()
            .map(|doc| {
                self.line.clear();
                serde_json::to_writer(&mut self.line, &Record::of(doc))
                    .map_err(|e| ItemError::permanent(format!("cannot encode as JSON: {e}")))?;
                self.line.push(b'\n');
                out.write_all(&self.line)
                    .map_err(|e| io_error(&self.path, e))
            })
            .collect();
        // The batch is accepted once it has reached the operating system.
        if let Err(e) = out.flush() {
            let err = io_error(&self.path, e);
            results.iter_mut().for_each(|r| *r = Err(err.clone()));
        }
        results
    }

    fn flush(&mut self) -> Result<(), BackendError> {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        out.flush()
            .and_then(|()| out.get_ref().sync_data())
            .map_err(|e| BackendError::Io(format!("{}: {e}", self.path.display())))
    }
}

fn io_error(path: &Path, e: std::io::Error) -> ItemError {
    let retryable = matches!(
        e.kind(),
        std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
    );
    ItemError {
        retryable,
        message: format!("writing {}: {e}", path.display()),
    }
}
