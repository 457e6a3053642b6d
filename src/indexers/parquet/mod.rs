//! `parquet:PATH`: one row per document or chunk, in the format data tools read (pandas,
//! Polars, DuckDB, Spark, Ray, Hugging Face datasets). `ragline embed --output FILE.parquet`
//! writes the same columns.
//!
//! Columns: `id`, `kind` (document, chunk or text), `parent_id`, `ordinal`, `text`,
//! `heading_path` (" > "-joined), `title`, `source`, `metadata` (a JSON string),
//! `token_count`, `error` (embed's unusable input lines), `page_start` and `page_end` (the
//! pages of a paged document a chunk spans, from 1) and `vector`, a fixed-size list of
//! float32 (absent when the run has no model). zstd-compressed.
//!
//! Memory stays bounded at any size: rows are handed to the writer in batches of
//! [`BATCH_ROWS`], and a row group is closed once it holds [`ROW_GROUP_BYTES`]. The file is
//! written under `PATH.partial` and renamed to `PATH` only when complete, so a killed run never
//! leaves a file that looks finished.

pub mod edges;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow_array::builder::{FixedSizeListBuilder, Float32Builder, Int32Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use super::{Backend, BackendError, BackendFactory, ItemError};
use crate::document::Document;

/// Rows turned into one Arrow batch at a time.
pub const BATCH_ROWS: usize = 4096;
/// A row group is closed at about this size (encoded), which bounds the writer's memory.
pub const ROW_GROUP_BYTES: usize = 64 << 20;

/// One row.
#[derive(Debug, Default)]
pub struct Row<'a> {
    pub id: &'a str,
    pub kind: &'a str,
    pub parent_id: Option<&'a str>,
    pub ordinal: Option<u32>,
    pub text: Option<&'a str>,
    pub heading_path: Option<String>,
    pub title: Option<&'a str>,
    pub source: Option<&'a str>,
    pub metadata: Option<String>,
    pub token_count: Option<u32>,
    pub error: Option<&'a str>,
    /// The pages a chunk spans (first, last; from 1), for paged formats.
    pub pages: Option<(u32, u32)>,
    pub vector: Option<&'a [f32]>,
}

impl<'a> Row<'a> {
    /// A document or chunk of a run.
    pub fn of(doc: &'a Document) -> Self {
        let chunk = doc.chunk.as_deref();
        Row {
            id: &doc.id,
            kind: if chunk.is_some() { "chunk" } else { "document" },
            parent_id: doc.parent_id.as_deref(),
            ordinal: chunk.map(|c| c.ordinal),
            text: Some(&doc.fields.text),
            heading_path: chunk.map(|c| c.heading_path.join(" > ")),
            title: doc.fields.title.as_deref(),
            source: doc.fields.source.as_deref(),
            metadata: (!doc.fields.metadata.is_empty())
                .then(|| serde_json::to_string(&doc.fields.metadata).unwrap_or_default()),
            token_count: chunk.map(|c| c.token_count),
            error: None,
            pages: chunk.and_then(|c| c.pages),
            vector: chunk.and_then(|c| c.vector.as_deref()),
        }
    }
}

/// Column builders for the rows not yet handed to the writer.
struct Columns {
    id: StringBuilder,
    kind: StringBuilder,
    parent_id: StringBuilder,
    ordinal: Int32Builder,
    text: StringBuilder,
    heading_path: StringBuilder,
    title: StringBuilder,
    source: StringBuilder,
    metadata: StringBuilder,
    token_count: Int32Builder,
    error: StringBuilder,
    page_start: Int32Builder,
    page_end: Int32Builder,
    vector: Option<FixedSizeListBuilder<Float32Builder>>,
    rows: usize,
}

impl Columns {
    fn new(dim: Option<usize>) -> Self {
        Columns {
            id: StringBuilder::new(),
            kind: StringBuilder::new(),
            parent_id: StringBuilder::new(),
            ordinal: Int32Builder::new(),
            text: StringBuilder::new(),
            heading_path: StringBuilder::new(),
            title: StringBuilder::new(),
            source: StringBuilder::new(),
            metadata: StringBuilder::new(),
            token_count: Int32Builder::new(),
            error: StringBuilder::new(),
            page_start: Int32Builder::new(),
            page_end: Int32Builder::new(),
            vector: dim.map(|d| {
                FixedSizeListBuilder::with_capacity(
                    Float32Builder::with_capacity(BATCH_ROWS * d),
                    d as i32,
                    BATCH_ROWS,
                )
                .with_field(Field::new("item", DataType::Float32, false))
            }),
            rows: 0,
        }
    }

    fn finish(&mut self, schema: &SchemaRef) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(self.id.finish()),
            Arc::new(self.kind.finish()),
            Arc::new(self.parent_id.finish()),
            Arc::new(self.ordinal.finish()),
            Arc::new(self.text.finish()),
            Arc::new(self.heading_path.finish()),
            Arc::new(self.title.finish()),
            Arc::new(self.source.finish()),
            Arc::new(self.metadata.finish()),
            Arc::new(self.token_count.finish()),
            Arc::new(self.error.finish()),
            Arc::new(self.page_start.finish()),
            Arc::new(self.page_end.finish()),
        ];
        if let Some(v) = &mut self.vector {
            cols.push(Arc::new(v.finish()));
        }
        self.rows = 0;
        RecordBatch::try_new(Arc::clone(schema), cols)
    }
}

/// A Parquet file being written.
pub struct ParquetWriter {
    path: PathBuf,
    partial: PathBuf,
    dim: Option<usize>,
    schema: SchemaRef,
    writer: ArrowWriter<File>,
    columns: Columns,
    rows: u64,
}

impl ParquetWriter {
    /// Start `path` (written as `path.partial` until [`ParquetWriter::finish`]). `dim`: the
    /// vectors' dimension (None: no vector column).
    pub fn create(path: &Path, dim: Option<usize>) -> Result<Self, BackendError> {
        let mut name = path.as_os_str().to_owned();
        name.push(".partial");
        let partial = PathBuf::from(name);
        let file = File::create(&partial).map_err(|source| BackendError::Unwritable {
            path: path.to_path_buf(),
            source,
        })?;
        let text = |name: &str, nullable: bool| Field::new(name, DataType::Utf8, nullable);
        let mut fields = vec![
            text("id", false),
            text("kind", false),
            text("parent_id", true),
            Field::new("ordinal", DataType::Int32, true),
            text("text", true),
            text("heading_path", true),
            text("title", true),
            text("source", true),
            text("metadata", true),
            Field::new("token_count", DataType::Int32, true),
            text("error", true),
            Field::new("page_start", DataType::Int32, true),
            Field::new("page_end", DataType::Int32, true),
        ];
        if let Some(d) = dim {
            fields.push(Field::new(
                "vector",
                DataType::FixedSizeList(
                    Arc::new(Field::new("item", DataType::Float32, false)),
                    d as i32,
                ),
                true,
            ));
        }
        let schema: SchemaRef = Arc::new(Schema::new(fields));
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(
                ZstdLevel::try_new(3).expect("3 is a valid zstd level; this is a bug"),
            ))
            .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
            .build();
        let writer = ArrowWriter::try_new(file, Arc::clone(&schema), Some(props))
            .map_err(|e| BackendError::Io(format!("{}: {e}", path.display())))?;
        Ok(ParquetWriter {
            path: path.to_path_buf(),
            partial,
            dim,
            schema,
            writer,
            columns: Columns::new(dim),
            rows: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Add a row. A vector of another dimension than the file's is refused.
    pub fn push(&mut self, row: &Row<'_>) -> Result<(), ItemError> {
        match (row.vector, self.dim) {
            (Some(v), Some(d)) if v.len() != d => {
                return Err(ItemError::permanent(format!(
                    "vector of {} dimensions in a file of {d}",
                    v.len()
                )))
            }
            (Some(_), None) => {
                return Err(ItemError::permanent(
                    "a vector in a file opened without a model; this is a bug",
                ))
            }
            _ => {}
        }
        let c = &mut self.columns;
        c.id.append_value(row.id);
        c.kind.append_value(row.kind);
        c.parent_id.append_option(row.parent_id);
        c.ordinal.append_option(row.ordinal.map(|o| o as i32));
        c.text.append_option(row.text);
        c.heading_path.append_option(row.heading_path.as_deref());
        c.title.append_option(row.title);
        c.source.append_option(row.source);
        c.metadata.append_option(row.metadata.as_deref());
        c.token_count
            .append_option(row.token_count.map(|t| t as i32));
        c.error.append_option(row.error);
        c.page_start
            .append_option(row.pages.map(|(first, _)| first as i32));
        c.page_end
            .append_option(row.pages.map(|(_, last)| last as i32));
        if let (Some(b), Some(d)) = (&mut c.vector, self.dim) {
            match row.vector {
                Some(v) => {
                    b.values().append_slice(v);
                    b.append(true);
                }
                None => {
                    b.values().append_slice(&vec![0.0; d]);
                    b.append(false);
                }
            }
        }
        c.rows += 1;
        self.rows += 1;
        if c.rows >= BATCH_ROWS {
            self.write_batch()
                .map_err(|e| ItemError::permanent(e.to_string()))?;
        }
        Ok(())
    }

    fn write_batch(&mut self) -> Result<(), BackendError> {
        if self.columns.rows == 0 {
            return Ok(());
        }
        let err = |e: String| BackendError::Io(format!("{}: {e}", self.path.display()));
        let batch = self
            .columns
            .finish(&self.schema)
            .map_err(|e| err(e.to_string()))?;
        self.writer.write(&batch).map_err(|e| err(e.to_string()))?;
        if self.writer.in_progress_size() >= ROW_GROUP_BYTES {
            self.writer.flush().map_err(|e| err(e.to_string()))?;
        }
        Ok(())
    }

    /// Write the footer, make the file durable and give it its name. Returns the rows written.
    pub fn finish(mut self) -> Result<u64, BackendError> {
        self.write_batch()?;
        let err = |e: String| BackendError::Io(format!("{}: {e}", self.path.display()));
        let file = self.writer.into_inner().map_err(|e| err(e.to_string()))?;
        file.sync_all().map_err(|e| err(e.to_string()))?;
        std::fs::rename(&self.partial, &self.path).map_err(|e| err(e.to_string()))?;
        if let Some(dir) = self.path.parent().filter(|p| !p.as_os_str().is_empty()) {
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(self.rows)
    }
}

/// The output file, shared by the indexer threads; completed by [`BackendFactory::finish`].
pub struct ParquetFactory {
    path: PathBuf,
    out: Arc<Mutex<Option<ParquetWriter>>>,
}

impl ParquetFactory {
    pub fn create(path: &Path, dim: Option<usize>) -> Result<Self, BackendError> {
        Ok(ParquetFactory {
            path: path.to_path_buf(),
            out: Arc::new(Mutex::new(Some(ParquetWriter::create(path, dim)?))),
        })
    }
}

impl BackendFactory for ParquetFactory {
    fn describe(&self) -> String {
        format!("parquet:{}", self.path.display())
    }

    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(ParquetBackend {
            out: Arc::clone(&self.out),
        }))
    }

    fn finish(&self) -> Result<Vec<String>, BackendError> {
        let writer = self.out.lock().unwrap_or_else(|e| e.into_inner()).take();
        match writer {
            Some(w) => {
                let rows = w.finish()?;
                Ok(vec![format!(
                    "wrote {rows} rows to {}",
                    self.path.display()
                )])
            }
            None => Ok(Vec::new()),
        }
    }
}

struct ParquetBackend {
    out: Arc<Mutex<Option<ParquetWriter>>>,
}

impl Backend for ParquetBackend {
    fn write(&mut self, batch: &[Document]) -> Vec<Result<(), ItemError>> {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let Some(writer) = out.as_mut() else {
            return vec![
                Err(ItemError::permanent("the Parquet file is already closed"));
                batch.len()
            ];
        };
        batch.iter().map(|d| writer.push(&Row::of(d))).collect()
    }

    fn flush(&mut self) -> Result<(), BackendError> {
        // The file is complete (and durable) only when the run finishes it.
        Ok(())
    }
}
