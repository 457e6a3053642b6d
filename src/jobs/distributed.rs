//! Distributed runs from the config: `ingest --queue URL` publishes a run; `worker`,
//! `embedder` and `indexer` build their part of it from the run's record on the broker.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::config::ConfigError;
use super::ingest::{connectors, finish_ingest, ready, settle};
use super::model::embedder_pool;
use super::places::{adopt, Uses};
use super::{devices, load_model, model_files, prepare, Build, JobError, PipelineConfig, Scope};
use crate::document::RunId;
use crate::embed::device::DeviceChoice;
use crate::indexers::IndexUri;
use crate::indexers::{Burial, StoredCopy};
use crate::lifecycle::CHUNK;
use crate::queue::jetstream::Lane;
use crate::queue::jetstream::{Broker, BrokerConfig, RunRecord, RunState, WIRE_VERSION};
use crate::run::distributed::{self as engine, Role, RoleParts, RoleReport};
use crate::run::distributed::{DeadLetterSink, DeadMessage};
use crate::run::progress::Observer;
use crate::run::RunSummary;

/// How long a process waits for the broker at start.
pub const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// Connect to the broker a `--queue` URL names.
pub fn connect(url: &str) -> Result<Broker, JobError> {
    let config = BrokerConfig::parse(url)?;
    Ok(Broker::connect(config, CONNECT_WAIT)?)
}

/// The settings other processes read: paths made absolute, so a process started in another
/// folder of the same machine finds the same model and index. (On another machine, give the
/// role `--model` and `--index`.) A Postgres password is never in them.
fn shared_config(config: &PipelineConfig, model_dir: Option<&str>) -> PipelineConfig {
    let mut shared = config.clone();
    if let Some(dir) = model_dir {
        if Path::new(&config.model.name).exists() {
            shared.model.name = dir.to_string();
        }
    }
    if let IndexUri::Sqlite(path) = &config.index.uri.value {
        if let Ok(abs) = std::path::absolute(path) {
            let text = format!("sqlite://{}", abs.display());
            if let Ok(p) = super::config::Parsed::parse(&text) {
                shared.index.uri = p;
            }
        }
    }
    shared.source.paths.clear();
    shared
}

/// Publish a run on the broker and follow it to the end: the same summary as an ingest in
/// one process.
pub fn ingest(
    config: &PipelineConfig,
    url: &str,
    observer: &mut dyn Observer,
) -> Result<RunSummary, JobError> {
    config.validate()?;
    let connectors = connectors(config)?;
    ingest_from(config, connectors, Scope::WholeSource, url, observer)
}

/// A distributed ingest of what `connectors` publish.
pub(crate) fn ingest_from(
    config: &PipelineConfig,
    connectors: Vec<Box<dyn crate::connectors::Connector>>,
    scope: Scope,
    url: &str,
    observer: &mut dyn Observer,
) -> Result<RunSummary, JobError> {
    let mut prepared = prepare(config, Build::NoEmbedders)?;
    let mut connectors = connectors;
    let settlements = ready(&mut connectors, &mut prepared, scope);
    let broker = connect(url)?;
    let run_id = RunId::generate();
    let shared = shared_config(config, prepared.model.as_ref().map(|m| m.dir.as_str()));
    let record = RunRecord {
        run: run_id.to_string(),
        wire: WIRE_VERSION,
        version: env!("CARGO_PKG_VERSION").to_string(),
        state: RunState::Running,
        config: shared.to_toml(),
        model_fingerprint: prepared.model.as_ref().map(|m| m.fingerprint.clone()),
        dimension: prepared.model.as_ref().map(|m| m.dimension),
        embeds: prepared.embeds,
        started: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    tracing::info!(
        target: crate::NOTE,
        "run {run_id} on {}: start `ragline worker`, `ragline embedder` and `ragline indexer` \
         with --queue {} (and the same --index and services)",
        broker.config().describe(),
        crate::secret::redact_url(url)
    );
    let result = engine::publish(
        &broker,
        run_id,
        &record,
        connectors,
        engine::PublishOptions {
            backend_name: prepared.backend.describe(),
            track_ids: prepared.options.track_ids,
            tick: prepared.options.tick,
            dead_letters: dead_letter_sink(config, &record.config)?,
        },
        observer,
    );
    observer.finish();
    let outcome = (|| {
        let mut summary = result?;
        let before = super::ingest::Before {
            backend: &prepared.backend,
            in_index: &prepared.in_index,
            delete_gone: prepared.delete_gone,
        };
        finish_ingest(config, before, &mut summary)?;
        Ok(summary)
    })();
    settle(settlements, outcome)
}

/// Where the publishing process dead-letters the messages the broker gave up on: the
/// index's lifecycle (`ragline dlq`), when the index keeps one. The document is dead in
/// `chunk` (it never got through ingest) with the reason, and the index keeps a copy to run
/// it again from: the document as published when the message was the document itself, else
/// (a chunk, or the parent's index record) its source file. None for output files.
fn dead_letter_sink(
    config: &PipelineConfig,
    settings: &str,
) -> Result<Option<DeadLetterSink>, JobError> {
    let uri = &config.index.uri.value;
    if !uri.is_store() {
        return Ok(None);
    }
    let mut store = crate::indexers::open_store(uri)?;
    let settings = settings.to_string();
    Ok(Some(Box::new(move |dead: &DeadMessage| {
        let doc = &dead.document;
        let root = doc.parent_id.clone().unwrap_or_else(|| doc.id.clone());
        let source = doc
            .fields
            .source
            .as_ref()
            .map(|s| std::path::absolute(s).map_or(s.clone(), |p| p.display().to_string()));
        let burial = Burial {
            document_id: root.clone(),
            stage: CHUNK.to_string(),
            attempts: dead.deliveries,
            worker: format!("broker ({} lane)", dead.lane.name()),
            error: match &doc.parent_id {
                Some(_) => format!("chunk {}: {}", doc.id, dead.reason),
                None => dead.reason.clone(),
            },
            copy: Some(StoredCopy {
                document_id: root,
                payload: (dead.lane == Lane::Work).then(|| dead.payload.to_vec()),
                source,
                config: Some(settings.clone()),
            }),
        };
        store.bury(&[burial])
    })))
}

/// What a role process is told by its operator: its command line and its own
/// `ragline.toml`. The run's record on the broker gives everything else, but never a place
/// (see [`super::places`]).
#[derive(Clone, Debug, Default)]
pub struct RoleRequest {
    /// This process's own settings (`--config` or ./ragline.toml, `--index` applied): the
    /// index and the services it may reach. A run naming other places is refused.
    pub own: PipelineConfig,
    /// Where this process finds the run's model (it must be the same model).
    pub model: Option<String>,
    /// `embedder`: the devices (cpu, cuda:0...).
    pub device: Option<String>,
    /// Threads (workers) or connections (indexers).
    pub threads: Option<usize>,
    /// Leave after one run.
    pub once: bool,
}

/// Serve runs from the broker as `role` until SIGTERM (or one run, with `once`).
pub fn serve(
    role: Role,
    url: &str,
    request: &RoleRequest,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<RoleReport>, JobError> {
    let broker = connect(url)?;
    broker.stop_on_signals(Arc::clone(stop));
    // The run engine sits below the jobs: a role that cannot be set up is its Setup error.
    let mut setup = |record: &RunRecord| -> Result<RoleParts, crate::run::RunError> {
        role_parts(role, record, request).map_err(|e| crate::run::RunError::Setup(e.to_string()))
    };
    let mut log = |line: &str| tracing::info!(target: crate::NOTE, "{line}");
    Ok(engine::serve(
        &broker,
        role,
        request.once,
        stop,
        &mut setup,
        &mut log,
    )?)
}

fn role_parts(
    role: Role,
    record: &RunRecord,
    request: &RoleRequest,
) -> Result<RoleParts, JobError> {
    let mut config = run_config(role, record, request)?;
    let refuse = |found: &str| {
        JobError::WrongRun(format!(
            "run {} embeds with model `{}` (fingerprint {}), but this {} loaded `{}` \
             (fingerprint {found}): start it with --model naming the run's model, or without \
             --model where the run's model folder is at the same path",
            record.run,
            config.model.name,
            record.model_fingerprint.as_deref().unwrap_or("none"),
            role.name(),
            config.model.name,
        ))
    };
    match role {
        Role::Embedder => {
            if !record.embeds {
                return Err(JobError::WrongRun(format!(
                    "run {} does not embed (no model, or embedding deferred): it needs no \
                     embedder",
                    record.run
                )));
            }
            if let Some(device) = &request.device {
                config.model.device = super::config::Parsed::parse(device)
                    .map_err(|e| ConfigError::Value(format!("bad --device: {e}")))?;
            }
            let files = model_files(&config.model.name)?;
            let devices = devices(&config.model)?;
            super::model::note_devices(&devices);
            let first = load_model(&files, &devices[0], &config.model)?;
            let fingerprint = first.fingerprint()?;
            if record.model_fingerprint.as_deref() != Some(fingerprint.as_str()) {
                return Err(refuse(&fingerprint));
            }
            super::model::note_encoder(&first);
            let pool = embedder_pool(&files, &devices, first, &config.model)?;
            Ok(RoleParts::Embedder { pool })
        }
        Role::Worker | Role::Indexer => {
            config.model.device = super::config::Parsed::new("cpu", DeviceChoice::Cpu);
            let prepared = prepare(&config, Build::NoEmbedders)?;
            let found = prepared.model.as_ref().map(|m| m.fingerprint.clone());
            if found != record.model_fingerprint {
                return Err(refuse(found.as_deref().unwrap_or("none")));
            }
            if role == Role::Worker {
                Ok(RoleParts::Worker {
                    pipeline: prepared.pipeline,
                    threads: request.threads.unwrap_or(prepared.options.workers),
                    embeds: record.embeds,
                })
            } else {
                Ok(RoleParts::Indexer {
                    backend: prepared.backend,
                    threads: request.threads.unwrap_or(prepared.options.indexers),
                    batch: prepared.options.batch,
                })
            }
        }
    }
}

/// The settings of the run `record` publishes, with this process's own (its index, its
/// services, `--model`) where the role takes them; refused when the publisher ran another
/// message format.
fn run_config(
    role: Role,
    record: &RunRecord,
    request: &RoleRequest,
) -> Result<PipelineConfig, JobError> {
    if record.wire != WIRE_VERSION {
        return Err(JobError::WrongRun(format!(
            "run {} was published by ragline {} with message format {}; this is ragline {} \
             with format {WIRE_VERSION}: run the same ragline version in every process",
            record.run,
            record.version,
            record.wire,
            env!("CARGO_PKG_VERSION")
        )));
    }
    let theirs = PipelineConfig::parse(&record.config).map_err(|e| {
        JobError::WrongRun(format!(
            "run {}: its settings do not parse: {e}",
            record.run
        ))
    })?;
    let uses = match role {
        Role::Embedder => Uses::ServicesOnly,
        Role::Worker | Role::Indexer => Uses::IndexAndServices,
    };
    let mut config = adopt(theirs, &request.own, uses, &format!("this {}", role.name()))
        .map_err(|e| JobError::WrongRun(format!("run {}: {e}", record.run)))?;
    if let Some(model) = &request.model {
        config.model.name = model.clone();
    }
    Ok(config)
}
