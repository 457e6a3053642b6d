//! The one dispatch on the index URI: which backend `sqlite://`, `postgres://`, `parquet:`,
//! `jsonl:`, `kafka://` and `null:` name, and what each opens (a run's writer, a reader for search, the
//! lifecycle store). The only file of `indexers/` that names every backend; the backends name
//! none but themselves.

use std::path::Path;
use std::time::Duration;

use super::store::IndexStore;
use super::{BackendError, BackendFactory, IndexIdentity, IndexReader, IndexUri};
use crate::lifecycle::StoreError;

/// What a backend opens. An output file (jsonl, parquet, null) is written and nothing else:
/// the defaults refuse the rest, naming the indexes that can.
trait Backend {
    /// The writer of a run with `identity`, checked usable before the run starts.
    fn writer(&self, identity: IndexIdentity) -> Result<Box<dyn BackendFactory>, BackendError>;

    /// A reader for search. `exact`: vector search compares with every vector, not an
    /// approximate index.
    fn reader(&self, uri: &IndexUri, exact: bool) -> Result<Box<dyn IndexReader>, BackendError> {
        let _ = exact;
        Err(BackendError::Invalid(format!(
            "{uri} is an output file, not a searchable index: search sqlite:// or postgres://"
        )))
    }

    /// The bytes of the index's files on disk, for an index that is files of its own.
    fn files_bytes(&self) -> Option<u64> {
        None
    }

    /// The lifecycle store of an existing index.
    fn store(&self, uri: &IndexUri) -> Result<Box<dyn IndexStore>, StoreError> {
        Err(StoreError::Invalid(format!(
            "{uri} keeps no lifecycle: enrich, backfill, status, dlq, pause and promote work on \
             sqlite:// and postgres:// indexes"
        )))
    }
}

/// The backend `uri` names: the one match on the URI.
fn backend(uri: &IndexUri) -> Box<dyn Backend + '_> {
    match uri {
        IndexUri::Sqlite(path) => Box::new(Sqlite(path)),
        #[cfg(feature = "postgres")]
        IndexUri::Postgres(target) => Box::new(Postgres(target)),
        #[cfg(feature = "parquet")]
        IndexUri::Parquet(path) => Box::new(Parquet(path)),
        IndexUri::Jsonl(path) => Box::new(Jsonl(path)),
        #[cfg(feature = "kafka")]
        IndexUri::Kafka(target) => Box::new(Kafka(target)),
        IndexUri::Null { delay } => Box::new(Null(*delay)),
    }
}

/// Open the backend a URI names for a run with `identity`, checking it is usable before the
/// run starts.
pub fn open(
    uri: &IndexUri,
    identity: IndexIdentity,
) -> Result<Box<dyn BackendFactory>, BackendError> {
    backend(uri).writer(identity)
}

/// Open an index for search. `exact`: vector search compares with every vector, not an
/// approximate index (the ANN of sqlite://, HNSW of postgres://).
pub fn open_reader(uri: &IndexUri, exact: bool) -> Result<Box<dyn IndexReader>, BackendError> {
    backend(uri).reader(uri, exact)
}

/// The bytes of the index's files on disk (the database, its journal, its ANN files), for
/// an embedded index; None for a server or an output file.
pub fn files_bytes(uri: &IndexUri) -> Option<u64> {
    backend(uri).files_bytes()
}

/// Open the lifecycle store of an existing index.
pub fn open_store(uri: &IndexUri) -> Result<Box<dyn IndexStore>, StoreError> {
    backend(uri).store(uri)
}

struct Sqlite<'a>(&'a Path);

impl Backend for Sqlite<'_> {
    fn writer(&self, identity: IndexIdentity) -> Result<Box<dyn BackendFactory>, BackendError> {
        Ok(Box::new(super::sqlite::SqliteFactory::open(
            self.0, identity,
        )?))
    }

    fn reader(&self, _uri: &IndexUri, exact: bool) -> Result<Box<dyn IndexReader>, BackendError> {
        Ok(Box::new(
            super::sqlite::SqliteReader::open(self.0)?.with_exact(exact),
        ))
    }

    fn store(&self, _uri: &IndexUri) -> Result<Box<dyn IndexStore>, StoreError> {
        if !self.0.is_file() {
            return Err(StoreError::Invalid(format!(
                "no index at `{}`: run `ragline ingest` first, or give --index",
                self.0.display()
            )));
        }
        Ok(Box::new(super::sqlite::SqliteStore::open(self.0)?))
    }

    fn files_bytes(&self) -> Option<u64> {
        Some(super::sqlite::files_bytes(self.0))
    }
}

#[cfg(feature = "postgres")]
struct Postgres<'a>(&'a super::postgres::PgTarget);

#[cfg(feature = "postgres")]
impl Backend for Postgres<'_> {
    fn writer(&self, identity: IndexIdentity) -> Result<Box<dyn BackendFactory>, BackendError> {
        Ok(Box::new(super::postgres::PostgresFactory::open(
            self.0, identity,
        )?))
    }

    fn reader(&self, _uri: &IndexUri, exact: bool) -> Result<Box<dyn IndexReader>, BackendError> {
        Ok(Box::new(super::postgres::PgReader::open(self.0, exact)?))
    }

    fn store(&self, _uri: &IndexUri) -> Result<Box<dyn IndexStore>, StoreError> {
        Ok(Box::new(super::postgres::PgStore::open(self.0)?))
    }
}

#[cfg(feature = "parquet")]
struct Parquet<'a>(&'a Path);

#[cfg(feature = "parquet")]
impl Backend for Parquet<'_> {
    fn writer(&self, identity: IndexIdentity) -> Result<Box<dyn BackendFactory>, BackendError> {
        Ok(Box::new(super::parquet::ParquetFactory::create(
            self.0,
            identity.model.as_ref().map(|m| m.dimension),
        )?))
    }
}

#[cfg(feature = "kafka")]
struct Kafka<'a>(&'a super::kafka::KafkaTarget);

#[cfg(feature = "kafka")]
impl Backend for Kafka<'_> {
    fn writer(&self, identity: IndexIdentity) -> Result<Box<dyn BackendFactory>, BackendError> {
        Ok(Box::new(super::kafka::KafkaFactory::open(
            self.0, identity,
        )?))
    }
}

struct Jsonl<'a>(&'a Path);

impl Backend for Jsonl<'_> {
    fn writer(&self, _identity: IndexIdentity) -> Result<Box<dyn BackendFactory>, BackendError> {
        Ok(Box::new(super::jsonl::JsonlFactory::create(self.0)?))
    }
}

struct Null(Duration);

impl Backend for Null {
    fn writer(&self, _identity: IndexIdentity) -> Result<Box<dyn BackendFactory>, BackendError> {
        Ok(Box::new(super::null::NullFactory { delay: self.0 }))
    }
}
