//! The pipeline builder: what `ingest`, `eval`, `enrich`, `backfill` and `check` run, assembled
//! from a [`PipelineConfig`] (the defaults, `ragline.toml`, then the flags). Commands parse
//! their flags into the config and call a function here; they assemble nothing themselves.

pub mod config;
pub mod distributed;
pub mod metrics;
pub mod places;
pub mod remote;
pub mod requeue;
pub mod services;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

pub use config::{ConfigError, PipelineConfig, Progress};

use crate::connectors::filesystem::{FilesystemConfig, FilesystemConnector};
use crate::connectors::jsonl::JsonlFields;
use crate::connectors::{Connector, ConnectorError};
use crate::embed::device::{self, SelectedDevice};
use crate::embed::pool::{
    BatchPolicy, Embedder, EmbedderPool, DEFAULT_BATCH_TOKENS_CPU, DEFAULT_BATCH_TOKENS_GPU,
    WINDOW_BATCHES,
};
use crate::embed::{EmbedError, EmbeddingModel, ModelFiles};
use crate::indexers::sqlite::SqliteReader;
use crate::indexers::{
    self, BackendError, BackendFactory, BatchConfig, IndexIdentity, IndexReader, IndexStore,
    IndexUri, ModelIdentity, VectorSet,
};
use crate::lifecycle::report::StatusReport;
use crate::lifecycle::{StoreError, EMBED};
use crate::run::enrich::{EnrichOptions, EnrichWorker, SetModel};
use crate::run::progress::Observer;
use crate::run::{self, RunError, RunOptions, RunParts, RunSummary};
use crate::stages::chunk::{chunk_fingerprint, ChunkConfig, ChunkStage, DEFAULT_CHUNK_TOKENS};
use crate::stages::extract::{Extract, ExtractConfig};
use crate::stages::incremental::Incremental;
use crate::stages::reuse::ReuseVectors;
use crate::stages::{Pipeline, Stage, StageError};

#[derive(Debug, Error)]
pub enum PipelineError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Something the run needs is missing or wrong (a path, the model, the index): the
    /// message says what and how to fix it.
    #[error("{0}")]
    Setup(String),
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
}

/// The model's files, with a message that names the fix.
pub fn model_files(name: &str) -> Result<ModelFiles, PipelineError> {
    ModelFiles::resolve(name)
        .map_err(|e| PipelineError::Setup(format!("cannot find the model `{name}`: {e}")))
}

/// The devices the config names.
pub fn devices(model: &config::ModelConfig) -> Result<Vec<SelectedDevice>, PipelineError> {
    device::select(&model.device.value)
        .map_err(|e| PipelineError::Setup(format!("cannot open the device: {e}")))
}

/// Padded tokens per forward pass on `device`.
pub fn batch_tokens(model: &config::ModelConfig, device: &SelectedDevice) -> usize {
    model.batch_tokens.unwrap_or(if device.device.is_cpu() {
        DEFAULT_BATCH_TOKENS_CPU
    } else {
        DEFAULT_BATCH_TOKENS_GPU
    })
}

/// Load the model on one device, with the config's prompt overrides.
pub fn load_model(
    files: &ModelFiles,
    device: &SelectedDevice,
    model: &config::ModelConfig,
) -> Result<EmbeddingModel, PipelineError> {
    let mut m =
        EmbeddingModel::load_for(files, &device.device, model.dtype.value).map_err(|e| {
            PipelineError::Setup(format!(
                "cannot load model `{}` on {}: {e}",
                files.name, device.label
            ))
        })?;
    m.tokenizer.set_prompts(
        model.query_prompt.as_deref(),
        model.passage_prompt.as_deref(),
    )?;
    m.set_dimensions(model.dimensions)
        .map_err(|e| PipelineError::Setup(e.to_string()))?;
    Ok(m)
}

/// What the index records of a model.
pub fn model_identity(
    files: &ModelFiles,
    model: &EmbeddingModel,
) -> Result<ModelIdentity, PipelineError> {
    Ok(ModelIdentity {
        name: files.name.clone(),
        dir: std::fs::canonicalize(&files.dir)
            .unwrap_or_else(|_| files.dir.clone())
            .display()
            .to_string(),
        fingerprint: model.fingerprint()?,
        dimension: model.dimension(),
        tokenizer: Some(model.tokenizer_fingerprint()?),
    })
}

/// One embedder per device; `first` (already loaded on `devices[0]`) is the first.
fn embedder_pool(
    files: &ModelFiles,
    devices: &[SelectedDevice],
    first: EmbeddingModel,
    model: &config::ModelConfig,
) -> Result<EmbedderPool, PipelineError> {
    let policy = |d: &SelectedDevice| BatchPolicy {
        batch_tokens: batch_tokens(model, d),
        max_wait: Duration::from_millis(model.max_wait_ms),
    };
    let mut embedders = vec![Embedder {
        encoder: Box::new(first),
        label: devices[0].label.clone(),
        policy: policy(&devices[0]),
    }];
    for d in &devices[1..] {
        embedders.push(Embedder {
            encoder: Box::new(load_model(files, d, model)?),
            label: d.label.clone(),
            policy: policy(d),
        });
    }
    Ok(EmbedderPool::new(embedders))
}

/// Everything an ingest is made of, set up from the config: what a run in one process uses,
/// and what the processes of a distributed run each build their part from.
pub struct Prepared {
    pub backend: Arc<dyn BackendFactory>,
    /// Makes one worker's stages (incremental, extract, chunk, reuse).
    pub pipeline: Box<crate::stages::PipelineFactory>,
    /// The embedders, when asked for and the run embeds.
    pub pool: Option<EmbedderPool>,
    pub encoder: Option<String>,
    /// The model the run embeds with (none with --no-chunk).
    pub model: Option<ModelIdentity>,
    /// Chunks go through an embedder (not deferred, and there is a model).
    pub embeds: bool,
    /// The ids the index holds before the run (for --prune and missing documents).
    pub in_index: Option<std::collections::HashSet<String>>,
    pub options: RunOptions,
    /// The service that embeds, when one does (its counts go in the summary).
    pub remote: Option<Arc<crate::remote::embed::RemoteEmbedder>>,
}

/// Which parts of a run this process builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// All of them (an ingest in one process).
    Everything,
    /// No embedders (the publishing side of a distributed run, workers, indexers).
    NoEmbedders,
}

/// Check the config and set up the index, the model and the stages.
pub fn prepare(config: &PipelineConfig, build: Build) -> Result<Prepared, PipelineError> {
    config.validate()?;
    let defer = config.stages.embed.defer;
    let uri = &config.index.uri.value;
    if defer && !matches!(uri, IndexUri::Sqlite(_) | IndexUri::Postgres(_)) {
        return Err(PipelineError::Setup(format!(
            "deferred embedding needs an index that keeps the work queue (sqlite:// or \
             postgres://); {} cannot: drop --defer",
            config.index.uri.value
        )));
    }

    // The model and the chunker, unless whole documents are indexed.
    let mut chunking = None;
    let mut pool = None;
    let mut encoder = None;
    let mut model_id = None;
    let mut fingerprint = "extract-v1".to_string();
    let embed_here = build == Build::Everything && !defer;
    let mut remote = None;
    if config.chunk.enabled && config.stages.embed.remote.enabled() {
        // A service embeds: the local model's tokenizer sizes the chunks, no weights load.
        let files = model_files(&config.model.name)?;
        let service = remote::remote_embedder(&config.stages.embed.remote)?;
        if embed_here {
            remote::report_circuit(service.endpoint(), uri, EMBED);
        }
        let mut tokenizer = crate::embed::remote::load_tokenizer(&files)
            .map_err(|e| PipelineError::Setup(format!("model `{}`: {e}", files.name)))?;
        tokenizer.set_prompts(
            config.model.query_prompt.as_deref(),
            config.model.passage_prompt.as_deref(),
        )?;
        let limit = tokenizer.max_content_len();
        let sizes = ChunkConfig {
            target: config.chunk.tokens,
            overlap: config.chunk.overlap,
        }
        .validate(limit, config.chunk.tokens != DEFAULT_CHUNK_TOKENS)
        .map_err(PipelineError::Setup)?;
        let dimension = service.dimension().expect("probed");
        let identity =
            remote::remote_identity(&config.stages.embed.remote, &files, &tokenizer, dimension)?;
        fingerprint = chunk_fingerprint(
            &sizes,
            config.chunk.truncate,
            identity.tokenizer.as_deref().unwrap_or(""),
        );
        model_id = Some(identity);
        if embed_here {
            pool = Some(remote::remote_pool(&service, tokenizer.clone(), config));
            encoder = Some(format!(
                "remote {} API at {}",
                config.stages.embed.remote.api.name(),
                config.stages.embed.remote.url.as_deref().unwrap_or("")
            ));
        }
        remote = Some(service);
        chunking = Some((tokenizer, sizes));
    } else if config.chunk.enabled {
        let files = model_files(&config.model.name)?;
        let devices = if embed_here {
            devices(&config.model)?
        } else {
            device::select(&device::DeviceChoice::Cpu)
                .map_err(|e| PipelineError::Setup(format!("cannot open the CPU: {e}")))?
        };
        if defer {
            eprintln!("embedding deferred: `ragline enrich` embeds the chunks");
        } else if embed_here {
            for d in &devices {
                eprintln!("embedding on {} ({})", d.label, d.reason);
            }
        }
        let first = load_model(&files, &devices[0], &config.model)?;
        if embed_here {
            eprintln!("encoder: {}", first.encoder_kind());
            encoder = Some(first.encoder_kind());
        }
        let tokenizer = first.tokenizer.clone();
        let limit = tokenizer.max_content_len() - tokenizer.passage_prompt_ids().len();
        let sizes = ChunkConfig {
            target: config.chunk.tokens,
            overlap: config.chunk.overlap,
        }
        .validate(limit, config.chunk.tokens != DEFAULT_CHUNK_TOKENS)
        .map_err(PipelineError::Setup)?;
        let identity = model_identity(&files, &first)?;
        fingerprint = chunk_fingerprint(
            &sizes,
            config.chunk.truncate,
            identity.tokenizer.as_deref().unwrap_or(""),
        );
        model_id = Some(identity);
        if embed_here {
            pool = Some(embedder_pool(&files, &devices, first, &config.model)?);
        }
        chunking = Some((tokenizer, sizes));
    }
    let embeds = chunking.is_some() && !defer;
    let identity = IndexIdentity {
        model: model_id.clone(),
        pipeline_fingerprint: fingerprint.clone(),
        defer_embed: defer,
        priority: config.stages.embed.priority,
    };
    let backend: Arc<dyn BackendFactory> = indexers::open(uri, identity)?.into();
    let known = Arc::new(backend.known_documents()?);
    let in_index = backend.document_ids()?;
    let fingerprint: Arc<str> = fingerprint.into();
    let truncate = config.chunk.truncate;
    let extract = ExtractConfig {
        max_file_time: Duration::from_secs(config.source.max_file_seconds),
        max_memory: config.source.max_extract_mb << 20,
    };
    let store = Arc::clone(&backend);
    let pipeline = move || -> Result<Pipeline, StageError> {
        let mut stages: Vec<Box<dyn Stage>> = vec![
            Box::new(Incremental::new(
                Arc::clone(&known),
                Arc::clone(&fingerprint),
            )),
            Box::new(Extract::new(extract)),
        ];
        if let Some((tokenizer, sizes)) = &chunking {
            stages.push(Box::new(if truncate {
                ChunkStage::truncating(tokenizer.clone(), *sizes)
            } else {
                ChunkStage::new(tokenizer.clone(), *sizes)
            }));
            let vectors = store
                .stored_vectors()
                .map_err(|e| StageError::Internal(e.to_string()))?;
            if let Some(vectors) = vectors {
                stages.push(Box::new(ReuseVectors::new(vectors)));
            }
        }
        Ok(Pipeline::new(stages))
    };

    let mut options = RunOptions::default();
    if let Some(w) = config.run.workers {
        options.workers = w;
    }
    options.indexers = config.index.indexers.unwrap_or_else(|| backend.writers());
    options.track_ids = in_index.is_some();
    options.batch = BatchConfig {
        max_items: config.index.batch_size,
        max_bytes: config.index.batch_bytes,
        timeout: Duration::from_millis(config.index.batch_timeout_ms),
        ..BatchConfig::default()
    };
    Ok(Prepared {
        backend,
        pipeline: Box::new(pipeline),
        pool,
        encoder,
        model: model_id,
        embeds,
        in_index,
        options,
        remote,
    })
}

/// The filesystem connector of the config's `[source]`.
fn connectors(config: &PipelineConfig) -> Result<Vec<Box<dyn Connector>>, PipelineError> {
    let src = &config.source;
    if src.paths.is_empty() {
        return Err(PipelineError::Setup(
            "nothing to ingest: give PATH... or `paths` under [source] in ragline.toml".into(),
        ));
    }
    let mut fs = FilesystemConfig::new(src.paths.clone());
    if !src.ext.is_empty() {
        fs.extensions = src.ext.clone();
    }
    fs.include = src.include.clone();
    fs.exclude = src.exclude.clone();
    fs.max_file_bytes = src.max_file_bytes;
    let fs = fs.validate(JsonlFields {
        id: src.id_field.clone(),
        text: src.text_field.clone(),
        title: src.title_field.clone(),
        title_in_text: src.title_in_text,
    })?;
    Ok(vec![Box::new(FilesystemConnector::new(fs))])
}

/// Run an ingest: read the sources, chunk, embed (unless deferred) and index.
pub fn ingest(
    config: &PipelineConfig,
    observer: &mut dyn Observer,
) -> Result<RunSummary, PipelineError> {
    config.validate()?;
    let connectors = connectors(config)?;
    ingest_from(config, connectors, Scope::WholeSource, observer)
}

/// What the connectors of a run read: the whole source (documents the index holds that it
/// did not publish are gone from the source), or some documents of it (a requeue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    WholeSource,
    SomeDocuments,
}

/// An ingest of what `connectors` publish.
pub(crate) fn ingest_from(
    config: &PipelineConfig,
    connectors: Vec<Box<dyn Connector>>,
    scope: Scope,
    observer: &mut dyn Observer,
) -> Result<RunSummary, PipelineError> {
    let mut prepared = prepare(config, Build::Everything)?;
    if scope == Scope::SomeDocuments {
        prepared.options.track_ids = false;
        prepared.in_index = None;
    }
    let parts = RunParts {
        connectors,
        pipeline: prepared.pipeline.as_ref(),
        embedder: prepared.pool,
        backend: prepared.backend.as_ref(),
    };
    let result = run::execute(parts, &prepared.options, observer);
    observer.finish();
    let mut summary = result?;
    summary.encoder = prepared.encoder;
    if let Some(r) = &prepared.remote {
        summary.remote = Some(r.endpoint().stats().snapshot());
        remote::settle_circuit(r.endpoint(), &config.index.uri.value, EMBED);
    }
    finish_ingest(config, &prepared.backend, &prepared.in_index, &mut summary)?;
    Ok(summary)
}

/// After the run: the backend's last work (an HNSW index), documents gone from the source,
/// --prune.
fn finish_ingest(
    config: &PipelineConfig,
    backend: &Arc<dyn BackendFactory>,
    in_index: &Option<std::collections::HashSet<String>>,
    summary: &mut RunSummary,
) -> Result<(), PipelineError> {
    let uri = &config.index.uri.value;
    summary.notes.extend(backend.finish()?);
    // Documents the index holds that this run's source no longer has.
    if let (Some(before), Some(seen)) = (in_index, &summary.published_ids) {
        let mut missing: Vec<String> = before.difference(seen).cloned().collect();
        missing.sort();
        if config.index.prune && !missing.is_empty() {
            summary.pruned = backend.delete_documents(&missing)? as u64;
        }
        summary.missing_from_source = missing;
    } else if config.index.prune {
        eprintln!("warning: --prune does nothing with {}", backend.describe());
    }
    if config.index.prune && matches!(uri, IndexUri::Sqlite(_) | IndexUri::Postgres(_)) {
        let dropped = indexers::open_store(uri)?.drop_retired()?;
        for model in dropped {
            summary
                .notes
                .push(format!("dropped the vectors of retired model `{model}`"));
        }
    }
    Ok(())
}

/// The lifecycle store of the index a command works on (sqlite:// or postgres://).
pub fn lifecycle_store(config: &PipelineConfig) -> Result<Box<dyn IndexStore>, PipelineError> {
    Ok(indexers::open_store(&config.index.uri.value)?)
}

/// What `enrich` and `backfill` are asked for beyond the config.
#[derive(Clone, Debug, Default)]
pub struct EnrichRequest {
    /// Stages to work (default: embed).
    pub stages: Vec<String>,
    /// Keep running and pick up new work as it arrives.
    pub follow: bool,
    /// Load the index's model from here instead of where the index says (it must be the
    /// same model).
    pub model_override: Option<String>,
    /// Where the calls to services are counted for `/metrics` (`--metrics-addr`).
    pub metrics: Option<Arc<metrics::EnrichMetrics>>,
    /// Take the work through this broker (`--queue nats://...`) instead of claiming it.
    pub queue: Option<String>,
}

/// Work the lifecycle queue of the index until nothing is runnable (or forever with
/// `follow`).
pub fn enrich(
    config: &PipelineConfig,
    request: &EnrichRequest,
    observer: &mut dyn Observer,
) -> Result<RunSummary, PipelineError> {
    config.validate()?;
    let uri = &config.index.uri.value;
    let mut store = lifecycle_store(config)?;
    let status = store.status()?;
    let sets = store.sets()?;
    drop(store);
    let configured = config.stages.llm_stages();
    let stages = if request.stages.is_empty() {
        // Every stage there is: embedding (when the index has a model) and the LLM stages.
        let mut v: Vec<String> = Vec::new();
        if !sets.is_empty() || configured.is_empty() {
            v.push(EMBED.to_string());
        }
        v.extend(configured.iter().map(|c| c.name.clone()));
        v
    } else {
        request.stages.clone()
    };
    for s in &stages {
        if !crate::lifecycle::is_enrichable(s) {
            return Err(PipelineError::Setup(format!(
                "`enrich --stage {s}`: enrich runs the stage `{EMBED}` and the LLM stages of \
                 ragline.toml (chunking is done by `ragline ingest`)"
            )));
        }
        if !matches!(s.as_str(), EMBED | crate::lifecycle::NOOP)
            && !configured.iter().any(|c| &c.name == s)
        {
            return Err(PipelineError::Setup(format!(
                "`enrich --stage {s}`: no such stage in ragline.toml; an LLM stage needs a \
                 section with its url and model ([stages.summary], or [[stages.llm]] with \
                 name = \"{s}\")"
            )));
        }
    }
    let embeds = stages.iter().any(|s| s == EMBED);
    if embeds && sets.is_empty() {
        return Err(PipelineError::Setup(format!(
            "index {uri} has no model: ingest with a model first (not --no-chunk)"
        )));
    }
    let llm = llm_stages(config, &stages)?;
    if let Some(m) = &request.metrics {
        for l in &llm {
            m.endpoint(&l.name, l.client.endpoint());
        }
    }
    // A service embeds (the config names one, or the index was embedded by one): --model
    // names the tokenizer that counts its tokens.
    let service = if embeds {
        let mut c = config.clone();
        if let Some(name) = &request.model_override {
            c.model.name = name.clone();
        }
        remote_set(&c, &sets)?
    } else {
        None
    };
    // Check the override names one of the index's models before anything runs.
    if let Some(name) = request
        .model_override
        .as_ref()
        .filter(|_| service.is_none() && embeds)
    {
        let files = model_files(name)?;
        let devices = devices(&config.model)?;
        let model = load_model(&files, &devices[0], &config.model)?;
        let fp = model.fingerprint()?;
        if !sets.iter().any(|s| s.fingerprint == fp) {
            return Err(PipelineError::Setup(format!(
                "--model {name} (fingerprint {fp}) is not a model of this index ({}); to move \
                 the index to it, run `ragline backfill --stage embed --model {name}`",
                sets.iter()
                    .map(|s| format!("`{}` {}", s.model, s.fingerprint))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    if let (Some(m), Some(s)) = (&request.metrics, &service) {
        m.endpoint(EMBED, s.embedder.endpoint());
    }
    let devices = devices(&config.model)?;
    let settings = config.stages.embed.settings();
    let workers = settings.concurrency.max(1);
    let mut list = Vec::with_capacity(workers);
    for i in 0..workers {
        let device = devices[i % devices.len()].clone();
        list.push(EnrichWorker {
            store: lifecycle_store(config)?,
            loader: set_loader(
                uri.clone(),
                config.model.clone(),
                device,
                request.model_override.clone(),
                service.clone(),
            ),
        });
    }
    // Queue what the LLM stages have not answered for the documents as they are now.
    if !llm.is_empty() {
        let mut store = lifecycle_store(config)?;
        for l in &llm {
            store.sync_stage(&l.name, &l.fingerprint, l.settings.priority)?;
        }
    }
    let llm_waiting: u64 = lifecycle_store(config)?
        .status()?
        .stages
        .iter()
        .filter(|(name, _)| llm.iter().any(|l| &l.name == *name))
        .map(|(_, s)| s.pending + s.failed + s.in_progress)
        .sum();
    let announced = llm_waiting
        + if embeds {
            status
                .stages
                .get(EMBED)
                .map_or(0, |s| s.pending + s.failed + s.in_progress)
                + status.backfill.as_ref().map_or(0, |b| {
                    b.stage.pending + b.stage.failed + b.stage.in_progress
                })
        } else {
            0
        };
    let claim_tokens = match &service {
        Some(s) => s.batch_tokens,
        None => batch_tokens(&config.model, &devices[0]) * WINDOW_BATCHES,
    };
    let options = EnrichOptions {
        stages,
        follow: request.follow,
        settings,
        claim_cost: claim_tokens as u64,
        announced,
        llm: llm.clone(),
        ..EnrichOptions::default()
    };
    let result = match &request.queue {
        None => run::enrich::execute(list, &options, uri.to_string(), observer),
        Some(url) => {
            let run = queued_run(url, &options)?;
            let feeder = lifecycle_store(config)?;
            run::enrich::execute_on_broker(list, feeder, &run, &options, uri.to_string(), observer)
        }
    };
    observer.finish();
    let mut summary = result?;
    if let Some(s) = &service {
        summary.remote = Some(s.embedder.endpoint().stats().snapshot());
        remote::settle_circuit(s.embedder.endpoint(), uri, EMBED);
    }
    for l in &llm {
        let endpoint = l.client.endpoint();
        remote::settle_circuit(endpoint, uri, &l.name);
        let c = endpoint.stats().snapshot();
        if c.requests > 0 {
            summary.notes.push(format!(
                "{}: {} requests to {} ({} retried: {} rate-limited, {} server errors, {} \
                 without an answer, {} malformed; {} refused)",
                l.name,
                c.requests,
                endpoint.settings().url,
                c.retries,
                c.throttled,
                c.server_errors,
                c.transport_errors,
                c.malformed,
                c.rejected
            ));
        }
    }
    summary.notes.extend(lifecycle_store(config)?.finish_run()?);
    Ok(summary)
}

/// The broker side of `enrich --queue`: its stages' consumers (AckWait = the stage's
/// visibility timeout, MaxDeliver = its retry limit), SIGTERM handling, and the store's lease
/// on published work, long enough for every delivery and backoff of the longest stage.
fn queued_run(
    url: &str,
    options: &run::enrich::EnrichOptions,
) -> Result<run::enrich::QueuedRun, PipelineError> {
    use crate::queue::jetstream::lifecycle::{LifecycleQueue, StageQueue};
    let broker = distributed::connect(url)?;
    let stages: Vec<(String, crate::lifecycle::StageSettings)> = options
        .stages
        .iter()
        .map(|s| {
            let settings = options
                .llm
                .iter()
                .find(|l| &l.name == s)
                .map_or_else(|| options.settings.clone(), |l| l.settings.clone());
            (s.clone(), settings)
        })
        .collect();
    let lease = stages
        .iter()
        .map(|(_, st)| {
            st.visibility_timeout * (st.retry_limit + 1) + st.max_backoff * st.retry_limit
        })
        .max()
        .unwrap_or_default()
        .max(std::time::Duration::from_secs(600));
    let queue = LifecycleQueue::open(
        &broker,
        stages
            .iter()
            .map(|(name, st)| StageQueue {
                stage: name.clone(),
                ack_wait: st.visibility_timeout,
                max_deliver: st.retry_limit.max(1),
            })
            .collect(),
    )
    .map_err(PipelineError::Setup)?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    broker.stop_on_signals(Arc::clone(&stop));
    Ok(run::enrich::QueuedRun::new(queue, lease, stop))
}

/// The LLM stages among `stages`, with their clients (one endpoint each, shared by every
/// worker, so its limits are the process's).
fn llm_stages(
    config: &PipelineConfig,
    stages: &[String],
) -> Result<Vec<Arc<crate::run::enrich::LlmStage>>, PipelineError> {
    let mut out = Vec::new();
    for c in config.stages.llm_stages() {
        if !stages.contains(&c.name) {
            continue;
        }
        let endpoint = crate::remote::Endpoint::new(c.endpoint()?).map_err(PipelineError::Setup)?;
        remote::report_circuit(&endpoint, &config.index.uri.value, &c.name);
        out.push(Arc::new(crate::run::enrich::LlmStage {
            name: c.name.clone(),
            client: Arc::new(crate::remote::chat::ChatClient::new(
                endpoint,
                c.chat_settings(),
            )),
            prompt: c.prompt.clone(),
            max_input_tokens: c.max_input_tokens,
            keyword_index: c.keyword_index,
            settings: c.settings(),
            fingerprint: c.fingerprint(),
        }));
    }
    Ok(out)
}

/// A service that embeds a vector set of the index, shared by every enrich worker of the
/// process (so its rate limits are the process's).
#[derive(Clone)]
struct RemoteSet {
    embedder: Arc<crate::remote::embed::RemoteEmbedder>,
    tokenizer: crate::embed::tokenizer::TextTokenizer,
    /// The vector set fingerprint it makes.
    fingerprint: String,
    batch_tokens: usize,
}

/// The service enrich embeds with: the config's (`--embed-url`). None when a model in this
/// process embeds. The service an index records is never called on the index's word alone
/// (a received index could name any host): a set it embedded waits for `--embed-url`.
fn remote_set(
    config: &PipelineConfig,
    _sets: &[VectorSet],
) -> Result<Option<RemoteSet>, PipelineError> {
    if !config.stages.embed.remote.enabled() {
        return Ok(None);
    }
    let rc = config.stages.embed.remote.clone();
    rc.validate()?;
    let embedder = remote::remote_embedder(&rc)?;
    remote::report_circuit(embedder.endpoint(), &config.index.uri.value, EMBED);
    let files = model_files(&config.model.name)?;
    let tokenizer = crate::embed::remote::load_tokenizer(&files)
        .map_err(|e| PipelineError::Setup(format!("model `{}`: {e}", files.name)))?;
    let dimension = embedder.dimension().expect("probed");
    let identity = remote::remote_identity(&rc, &files, &tokenizer, dimension)?;
    Ok(Some(RemoteSet {
        embedder,
        tokenizer,
        fingerprint: identity.fingerprint,
        batch_tokens: rc.max_tokens * rc.concurrency.max(1),
    }))
}

/// Loads the model of a vector set for an enrich worker on `device`: the service when it
/// makes that set's vectors; else from the override when it is that model, else from the
/// folder the index recorded, else by the recorded name; it must have the fingerprint the
/// set was made with.
fn set_loader(
    uri: IndexUri,
    model: config::ModelConfig,
    device: SelectedDevice,
    override_name: Option<String>,
    service: Option<RemoteSet>,
) -> crate::run::enrich::ModelLoader {
    Box::new(move |set_id: i64| -> Result<SetModel, String> {
        let set = find_set(&uri, set_id)?;
        if let Some(s) = service
            .as_ref()
            .filter(|s| s.fingerprint == set.fingerprint)
        {
            return Ok(SetModel {
                batch_tokens: s.batch_tokens,
                label: s.embedder.endpoint().shown_url(""),
                encoder: Box::new(crate::embed::remote::RemoteEncoder::new(
                    Arc::clone(&s.embedder),
                    s.tokenizer.clone(),
                )),
            });
        }
        if let Some(rc) = remote::config_of_index(&set.model, &set.model_dir) {
            return Err(format!(
                "vector set {} was embedded by the service at {} (`{}`); ragline sends \
                 documents only to a service you name: give --embed-url with that URL (and \
                 --embed-api {}{}) to embed with it",
                set.id,
                crate::secret::redact_url(&set.model_dir),
                set.model,
                rc.api.name(),
                rc.model
                    .as_deref()
                    .map(|m| format!(", --embed-model {m}"))
                    .unwrap_or_default()
            ));
        }
        let mut tried = Vec::new();
        let mut candidates: Vec<String> = override_name.iter().cloned().collect();
        if Path::new(&set.model_dir).is_dir() {
            candidates.push(set.model_dir.clone());
        }
        candidates.push(set.model.clone());
        for name in candidates {
            let files = match ModelFiles::resolve(&name) {
                Ok(f) => f,
                Err(e) => {
                    tried.push(format!("`{name}`: {e}"));
                    continue;
                }
            };
            let loaded = load_model(&files, &device, &model).map_err(|e| e.to_string())?;
            let fp = loaded.fingerprint().map_err(|e| e.to_string())?;
            if fp != set.fingerprint {
                tried.push(format!(
                    "`{name}` has fingerprint {fp}, the set was made with {}",
                    set.fingerprint
                ));
                continue;
            }
            return Ok(SetModel {
                batch_tokens: batch_tokens(&model, &device),
                label: device.label.clone(),
                encoder: Box::new(loaded),
            });
        }
        Err(format!(
            "cannot load the model of vector set {} (`{}`): {}; make it available \
             (scripts/fetch-model.sh) or name its folder with --model",
            set.id,
            set.model,
            tried.join("; ")
        ))
    })
}

fn find_set(uri: &IndexUri, id: i64) -> Result<VectorSet, String> {
    indexers::open_store(uri)
        .map_err(|e| e.to_string())?
        .sets()
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|s| s.id == id)
        .ok_or_else(|| format!("the index has no vector set {id}"))
}

/// What a backfill did.
pub struct BackfillOutcome {
    pub summary: Option<RunSummary>,
    pub dropped: Vec<String>,
}

/// Move the index to another model: a second vector set filled at backfill priority, search
/// switching to it when complete. With `drop_old`, retired sets are dropped after (or, with
/// no model, at once).
pub fn backfill(
    config: &PipelineConfig,
    model: Option<&str>,
    request: &EnrichRequest,
    drop_old: bool,
    observer: &mut dyn Observer,
) -> Result<BackfillOutcome, PipelineError> {
    config.validate()?;
    let mut summary = None;
    if let Some(name) = model {
        let files = model_files(name)?;
        let devices = devices(&config.model)?;
        let loaded = load_model(&files, &devices[0], &config.model)?;
        let identity = model_identity(&files, &loaded)?;
        drop(loaded);
        let set = lifecycle_store(config)?.start_backfill(&identity)?;
        eprintln!(
            "backfill of vector set {} with `{}` ({} dimensions)",
            set.id, set.model, set.dimension
        );
        let mut req = request.clone();
        req.model_override = Some(name.to_string());
        // The override must be a model of the index: it is now.
        summary = Some(enrich(config, &req, observer)?);
    }
    let dropped = if drop_old {
        lifecycle_store(config)?.drop_retired()?
    } else {
        Vec::new()
    };
    Ok(BackfillOutcome { summary, dropped })
}

/// The lifecycle status of the index.
pub fn status(config: &PipelineConfig) -> Result<StatusReport, PipelineError> {
    Ok(lifecycle_store(config)?.status()?)
}

/// What `ragline check` found.
pub struct CheckReport {
    pub config_file: Option<std::path::PathBuf>,
    pub index: String,
    pub model: Option<String>,
    pub resolved: String,
}

/// Validate a pipeline without running it: the file, the index (opened read-only) and the
/// model (loaded).
pub fn check(config: &PipelineConfig) -> Result<CheckReport, PipelineError> {
    config.validate()?;
    let index = match &config.index.uri.value {
        IndexUri::Sqlite(path) if path.exists() => {
            let reader = SqliteReader::open(path)?;
            let (docs, chunks, vectors) = reader.counts()?;
            format!(
                "{}: {docs} documents, {chunks} chunks, {vectors} embedded{}",
                config.index.uri.value,
                reader
                    .meta()
                    .model
                    .as_ref()
                    .map(|m| format!(", model `{m}`"))
                    .unwrap_or_default()
            )
        }
        IndexUri::Sqlite(path) => {
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if !dir.is_dir() {
                return Err(PipelineError::Setup(format!(
                    "index {}: folder `{}` does not exist",
                    config.index.uri.value,
                    dir.display()
                )));
            }
            format!(
                "{}: new (created by the first ingest)",
                config.index.uri.value
            )
        }
        IndexUri::Postgres(target) => {
            // Connects, and reads the index if the schema holds one (nothing is created).
            match indexers::postgres::PgReader::open(target, true) {
                Ok(reader) => {
                    let (docs, chunks, vectors) = reader.counts()?;
                    format!(
                        "{target}: {docs} documents, {chunks} chunks, {vectors} embedded{}",
                        reader
                            .meta()
                            .model
                            .as_ref()
                            .map(|m| format!(", model `{m}`"))
                            .unwrap_or_default()
                    )
                }
                Err(BackendError::Invalid(msg)) if msg.starts_with("no ragline index") => {
                    format!("{target}: reachable; new (created by the first ingest)")
                }
                Err(e) => return Err(e.into()),
            }
        }
        _ => config.index.uri.value.to_string(),
    };
    let model = if config.chunk.enabled && config.stages.embed.remote.enabled() {
        // The service answers (one probe), and the tokenizer that sizes chunks loads.
        let r = &config.stages.embed.remote;
        let files = model_files(&config.model.name)?;
        let tokenizer = crate::embed::remote::load_tokenizer(&files)
            .map_err(|e| PipelineError::Setup(format!("model `{}`: {e}", files.name)))?;
        let service = remote::remote_embedder(r)?;
        Some(format!(
            "the {} API at {}{}: {} dimensions; chunks sized by the tokenizer of `{}` ({} \
             tokens at most)",
            r.api.name(),
            r.url.as_deref().unwrap_or(""),
            r.model
                .as_deref()
                .map(|m| format!(", model `{m}`"))
                .unwrap_or_default(),
            service.dimension().unwrap_or(0),
            files.name,
            tokenizer.max_len()
        ))
    } else if config.chunk.enabled {
        let files = model_files(&config.model.name)?;
        let devices = devices(&config.model)?;
        let m = load_model(&files, &devices[0], &config.model)?;
        Some(format!(
            "`{}` from {} on {}: {} dimensions, {} tokens at most, fingerprint {}",
            files.name,
            files.dir.display(),
            devices[0].label,
            m.dimension(),
            m.tokenizer.max_len(),
            m.fingerprint()?
        ))
    } else {
        None
    };
    Ok(CheckReport {
        config_file: None,
        index,
        model,
        resolved: config.to_toml(),
    })
}
