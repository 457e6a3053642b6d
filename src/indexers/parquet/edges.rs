//! Entity edges as a Parquet file (`ragline entities --edges --output edges.parquet`): one
//! row per (document, entity) with its type, form, normalised form and count, written in
//! row groups as they come.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::indexers::facets::EntityEdge;
use crate::indexers::BackendError;

/// Rows per record batch.
const BATCH_ROWS: usize = 65_536;

pub struct EdgeWriter {
    path: std::path::PathBuf,
    schema: SchemaRef,
    writer: ArrowWriter<File>,
    rows: Vec<EntityEdge>,
    written: u64,
}

impl EdgeWriter {
    pub fn create(path: &Path) -> Result<EdgeWriter, BackendError> {
        let io = |e: &dyn std::fmt::Display| BackendError::Io(format!("{}: {e}", path.display()));
        let file = File::create(path).map_err(|e| io(&e))?;
        let text = |name: &str| Field::new(name, DataType::Utf8, false);
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            text("document"),
            text("type"),
            text("entity"),
            text("norm"),
            Field::new("count", DataType::UInt64, false),
        ]));
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(
                ZstdLevel::try_new(3).expect("3 is a valid zstd level; this is a bug"),
            ))
            .build();
        let writer =
            ArrowWriter::try_new(file, Arc::clone(&schema), Some(props)).map_err(|e| io(&e))?;
        Ok(EdgeWriter {
            path: path.to_path_buf(),
            schema,
            writer,
            rows: Vec::new(),
            written: 0,
        })
    }

    pub fn push(&mut self, edge: EntityEdge) -> Result<(), BackendError> {
        self.rows.push(edge);
        if self.rows.len() >= BATCH_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), BackendError> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let rows = std::mem::take(&mut self.rows);
        let col = |f: fn(&EntityEdge) -> &str| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(rows.iter().map(f)))
        };
        let columns = vec![
            col(|e| &e.document),
            col(|e| &e.kind),
            col(|e| &e.entity),
            col(|e| &e.norm),
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|e| e.count))) as ArrayRef,
        ];
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), columns)
            .map_err(|e| BackendError::Io(format!("{}: {e}", self.path.display())))?;
        self.writer
            .write(&batch)
            .map_err(|e| BackendError::Io(format!("{}: {e}", self.path.display())))?;
        self.written += rows.len() as u64;
        Ok(())
    }

    /// Write what is left and the file's footer; returns the rows written.
    pub fn finish(mut self) -> Result<u64, BackendError> {
        self.flush()?;
        self.writer
            .close()
            .map_err(|e| BackendError::Io(format!("{}: {e}", self.path.display())))?;
        Ok(self.written)
    }
}
