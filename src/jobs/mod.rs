//! The jobs ragline runs: what `ingest`, `eval`, `enrich`, `backfill` and `check` run, assembled
//! from a [`PipelineConfig`] (the defaults, `ragline.toml`, then the flags). Commands parse
//! their flags into the config and call a function here; they assemble nothing themselves.

pub mod bench;
pub mod check;
pub mod config;
#[cfg(feature = "nats")]
pub mod distributed;
pub mod embed;
pub mod enrich;
pub mod ingest;
pub mod metrics;
pub mod model;
pub mod model_stages;
pub mod places;
pub mod request;
pub mod requeue;
pub mod service_embedder;
pub mod services;

pub use check::{check, CheckReport};
pub use config::{ConfigError, PipelineConfig, Progress};
pub use enrich::{backfill, enrich, lifecycle_store, status, BackfillOutcome, EnrichRequest};
pub use ingest::{ingest, prepare, Build, Prepared};
pub(crate) use ingest::{ingest_from, Scope};
pub use model::{
    batch_tokens, devices, load_model, load_reranker, load_sparse, model_files, model_identity,
    open_searcher, searcher,
};
pub use request::{IngestRequest, ModelRequest, RemoteRequest};

use thiserror::Error;

use crate::connectors::ConnectorError;
use crate::embed::EmbedError;
use crate::indexers::BackendError;
use crate::lifecycle::StoreError;
use crate::run::RunError;

/// Why a job could not be set up or run.
#[derive(Debug, Error)]
pub enum JobError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Something the process needs from where it runs is missing (its own binary, a
    /// service that does not answer): the message says what and how to fix it.
    #[error("{0}")]
    Setup(String),
    /// A model that cannot be found, read or loaded on its device: the message names the
    /// model, the device and the fix.
    #[error("{0}")]
    Model(String),
    /// A distributed run this process cannot take part in (published by another ragline
    /// version, with another model, or needing no such role): it is left to the processes
    /// that can.
    #[error("{0}")]
    WrongRun(String),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Embed(#[from] EmbedError),
    #[error(transparent)]
    Connector(#[from] ConnectorError),
    /// The run started and could not go on.
    #[error(transparent)]
    Run(#[from] RunError),
    /// What was asked needs a part this build leaves out (a cargo feature that is off).
    #[error(
        "{what} needs the `{feature}` feature, which this build of ragline leaves out: build \
         it with `--features {feature}` (the default build has it)"
    )]
    NotBuilt { what: String, feature: &'static str },
    /// Settings from a broker or an index that name places this process was not given.
    #[error(transparent)]
    Refused(#[from] places::Refused),
    /// A file the job was asked to write (`--report`) cannot be written.
    #[error("cannot write {what} {}: {source}", path.display())]
    Write {
        what: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A service's endpoint that cannot be made (its URL, a key over plain http).
    #[error(transparent)]
    Endpoint(#[from] crate::http::EndpointError),
    /// The broker of a distributed run or `--queue` (unreachable, refused, a bad URL).
    #[cfg(feature = "nats")]
    #[error(transparent)]
    Broker(#[from] crate::queue::jetstream::BrokerError),
}
