//! `ingest`: the index, the model and the stages set up from the config ([`prepare`]), then
//! the run, and what follows it (documents gone from the source, `--prune`).

use std::sync::Arc;
use std::time::Duration;

use crate::connectors::filesystem::{FilesystemConfig, FilesystemConnector};
use crate::connectors::jsonl::JsonlFields;
use crate::connectors::sql::{is_database_url, is_table_source, TableConnector};
use crate::connectors::web::{is_web_url, WebConnector, WebSettings};
use crate::connectors::{
    is_kafka_url, is_nats_url, is_object_url, Connector, KnownIndex, Settlement,
};
use crate::embed::device;
use crate::embed::pool::EmbedderPool;
use crate::embed::tokenizer::TextTokenizer;
use crate::indexers::{self, BackendFactory, BatchConfig, IndexIdentity, ModelIdentity};
use crate::lifecycle::EMBED;
use crate::run::progress::Observer;
use crate::run::{self, RunOptions, RunParts, RunSummary};
use crate::stages::chunk::{
    chunk_fingerprint, ChunkConfig, ChunkStage, Sizes, DEFAULT_CHUNK_TOKENS,
};
use crate::stages::extract::{Extract, ExtractConfig};
use crate::stages::incremental::Incremental;
use crate::stages::reuse::ReuseVectors;
use crate::stages::{Pipeline, Stage, StageError};

use super::config::ConfigError;
use super::model::{devices, embedder_pool, load_model, model_files, model_identity};
use super::{service_embedder, JobError, PipelineConfig};

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
    pub remote: Option<Arc<crate::http::embed::RemoteEmbedder>>,
    /// What the index holds before the run, which connectors are told.
    pub known: KnownIndex,
    /// A connector's source deletes what it says is gone (a Kafka tombstone), `--prune` or not.
    pub delete_gone: bool,
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
pub fn prepare(config: &PipelineConfig, build: Build) -> Result<Prepared, JobError> {
    config.validate()?;
    let defer = config.stages.embed.defer;
    let uri = &config.index.uri.value;
    if defer && !uri.is_store() {
        return Err(ConfigError::Value(format!(
            "deferred embedding needs an index that keeps the work queue (sqlite:// or \
             postgres://); {} cannot: drop --defer",
            config.index.uri.value
        ))
        .into());
    }
    // The model and the chunker, unless whole documents are indexed.
    let embed_here = build == Build::Everything && !defer;
    let setup = if !config.chunk.enabled {
        ModelSetup::default()
    } else if config.stages.embed.remote.enabled() {
        service_setup(config, embed_here)?
    } else {
        local_setup(config, embed_here)?
    };
    let embeds = setup.chunking.is_some() && !defer;
    let identity = IndexIdentity {
        model: setup.model.clone(),
        pipeline_fingerprint: setup.fingerprint.clone(),
        defer_embed: defer,
        priority: config.stages.embed.priority,
        ann: indexers::ann::AnnChoice {
            mode: config.index.ann,
            dtype: config.index.ann_dtype,
            recall: config.index.ann_recall,
        },
    };
    let backend: Arc<dyn BackendFactory> = indexers::open(uri, identity)?.into();
    let in_index = backend.document_ids()?;
    let known = KnownIndex {
        documents: Arc::new(backend.known_documents()?),
        fingerprint: setup.fingerprint.into(),
        pages: Some(known_pages(&backend)),
    };
    let pipeline = stage_factory(config, &backend, known.clone(), setup.chunking)?;
    let options = run_options(config, backend.as_ref(), in_index.is_some());
    Ok(Prepared {
        backend,
        pipeline,
        pool: setup.pool,
        encoder: setup.encoder,
        model: setup.model,
        embeds,
        in_index,
        options,
        remote: setup.remote,
        known,
        delete_gone: false,
    })
}

/// What chunks documents and what embeds them.
struct ModelSetup {
    /// The tokenizer and chunk sizes (none: whole documents are indexed).
    chunking: Option<(TextTokenizer, Sizes)>,
    pool: Option<EmbedderPool>,
    encoder: Option<String>,
    model: Option<ModelIdentity>,
    /// The chunker's fingerprint (settings and tokenizer).
    fingerprint: String,
    remote: Option<Arc<crate::http::embed::RemoteEmbedder>>,
}

impl Default for ModelSetup {
    fn default() -> Self {
        ModelSetup {
            chunking: None,
            pool: None,
            encoder: None,
            model: None,
            fingerprint: "extract-v1".to_string(),
            remote: None,
        }
    }
}

/// The chunk sizes the config asks for, checked against the model's limit.
fn chunk_sizes(config: &PipelineConfig, limit: usize) -> Result<Sizes, JobError> {
    ChunkConfig {
        target: config.chunk.tokens,
        overlap: config.chunk.overlap,
    }
    .validate(limit, config.chunk.tokens != DEFAULT_CHUNK_TOKENS)
    .map_err(|e| ConfigError::Value(e.to_string()).into())
}

/// A service embeds: the local model's tokenizer sizes the chunks, no weights load.
fn service_setup(config: &PipelineConfig, embed_here: bool) -> Result<ModelSetup, JobError> {
    let uri = &config.index.uri.value;
    let files = model_files(&config.model.name)?;
    let service = service_embedder::remote_embedder(&config.stages.embed.remote)?;
    if embed_here {
        service_embedder::report_circuit(service.endpoint(), uri, EMBED);
    }
    let mut tokenizer = crate::embed::service::load_tokenizer(&files)
        .map_err(|e| JobError::Model(format!("model `{}`: {e}", files.name)))?;
    tokenizer.set_prompts(
        config.model.query_prompt.as_deref(),
        config.model.passage_prompt.as_deref(),
    )?;
    let sizes = chunk_sizes(config, tokenizer.max_content_len())?;
    let dimension = service.dimension().expect("probed");
    let remote = &config.stages.embed.remote;
    let identity = service_embedder::remote_identity(remote, &files, &tokenizer, dimension)?;
    let fingerprint = chunk_fingerprint(
        &sizes,
        config.chunk.truncate,
        identity.tokenizer.as_deref().unwrap_or(""),
    );
    let (pool, encoder) = if embed_here {
        let pool = service_embedder::remote_pool(&service, tokenizer.clone(), config);
        let encoder = format!(
            "remote {} API at {}",
            remote.api.name(),
            remote.url.as_deref().unwrap_or("")
        );
        (Some(pool), Some(encoder))
    } else {
        (None, None)
    };
    Ok(ModelSetup {
        chunking: Some((tokenizer, sizes)),
        pool,
        encoder,
        model: Some(identity),
        fingerprint,
        remote: Some(service),
    })
}

/// The model in this process: loaded on the devices the config names (on the CPU for its
/// tokenizer alone when another process embeds or embedding is deferred).
fn local_setup(config: &PipelineConfig, embed_here: bool) -> Result<ModelSetup, JobError> {
    let files = model_files(&config.model.name)?;
    let devices = if embed_here {
        devices(&config.model)?
    } else {
        device::select(&device::DeviceChoice::Cpu)
            .map_err(|e| JobError::Model(format!("cannot open the CPU: {e}")))?
    };
    if config.stages.embed.defer {
        tracing::info!(target: crate::NOTE, "embedding deferred: `ragline enrich` embeds the chunks");
    } else if embed_here {
        super::model::note_devices(&devices);
    }
    let first = load_model(&files, &devices[0], &config.model)?;
    let mut encoder = None;
    if embed_here {
        super::model::note_encoder(&first);
        encoder = Some(first.encoder_kind());
    }
    let tokenizer = first.tokenizer.clone();
    let sizes = chunk_sizes(
        config,
        tokenizer.max_content_len() - tokenizer.passage_prompt_ids().len(),
    )?;
    let identity = model_identity(&files, &first)?;
    let fingerprint = chunk_fingerprint(
        &sizes,
        config.chunk.truncate,
        identity.tokenizer.as_deref().unwrap_or(""),
    );
    let pool = if embed_here {
        Some(embedder_pool(&files, &devices, first, &config.model)?)
    } else {
        None
    };
    Ok(ModelSetup {
        chunking: Some((tokenizer, sizes)),
        pool,
        encoder,
        model: Some(identity),
        fingerprint,
        remote: None,
    })
}

/// The web pages the index holds from a source, for a crawl (a failure is logged, and the
/// crawl then reads every page).
fn known_pages(backend: &Arc<dyn BackendFactory>) -> crate::connectors::KnownPages {
    let backend = Arc::clone(backend);
    Arc::new(move |source: &str| {
        backend.known_pages(source).unwrap_or_else(|e| {
            tracing::warn!("the pages the index holds from {source} cannot be read: {e}");
            Vec::new()
        })
    })
}

/// What makes one worker's stages: incremental (against what the index holds), extract,
/// then chunk and reuse (vectors the index holds for identical inputs) when chunking.
fn stage_factory(
    config: &PipelineConfig,
    backend: &Arc<dyn BackendFactory>,
    known: KnownIndex,
    chunking: Option<(TextTokenizer, Sizes)>,
) -> Result<Box<crate::stages::PipelineFactory>, JobError> {
    let KnownIndex {
        documents: known,
        fingerprint,
        ..
    } = known;
    let truncate = config.chunk.truncate;
    let extract = ExtractConfig {
        max_file_time: Duration::from_secs(config.source.max_file_seconds),
        max_memory: config.source.max_extract_mb << 20,
        isolate: if config.source.isolate_extraction {
            Some(extraction_program()?)
        } else {
            None
        },
    };
    let store = Arc::clone(backend);
    Ok(Box::new(move || -> Result<Pipeline, StageError> {
        let mut stages: Vec<Box<dyn Stage>> = vec![
            Box::new(Incremental::new(
                Arc::clone(&known),
                Arc::clone(&fingerprint),
            )),
            Box::new(Extract::new(extract.clone())),
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
    }))
}

/// The run's workers, indexers and write batches, from the config (the backend's own number
/// of writers unless the config names one).
fn run_options(
    config: &PipelineConfig,
    backend: &dyn BackendFactory,
    track_ids: bool,
) -> RunOptions {
    let mut options = RunOptions::default();
    if let Some(w) = config.run.workers {
        options.workers = w;
    }
    options.indexers = config.index.indexers.unwrap_or_else(|| backend.writers());
    options.track_ids = track_ids;
    options.batch = BatchConfig {
        max_items: config.index.batch_size,
        max_bytes: config.index.batch_bytes,
        timeout: Duration::from_millis(config.index.batch_timeout_ms),
        ..BatchConfig::default()
    };
    options
}

/// The connectors of the config's `[source]`: a table for each `sqlite://` or `postgres://`
/// URL with `?table=`, the filesystem connector for the files and folders.
pub(crate) fn connectors(config: &PipelineConfig) -> Result<Vec<Box<dyn Connector>>, JobError> {
    let src = &config.source;
    if src.paths.is_empty() {
        return Err(ConfigError::Value(
            "nothing to ingest: give PATH... or `paths` under [source] in ragline.toml".into(),
        )
        .into());
    }
    let mut out: Vec<Box<dyn Connector>> = Vec::new();
    let mut files = Vec::new();
    let jsonl = JsonlFields {
        id: src.id_field.clone(),
        text: src.text_field.clone(),
        title: src.title_field.clone(),
        title_in_text: src.title_in_text,
    };
    for path in &src.paths {
        if let Some(url) = path.to_str().filter(|p| is_object_url(p)) {
            out.push(object_connector(url, src, jsonl.clone())?);
            continue;
        }
        if let Some(url) = path.to_str().filter(|p| is_web_url(p)) {
            let settings = WebSettings {
                follow_links: src.follow_links,
                max_bytes: src.max_file_bytes,
                concurrency: src.fetch_concurrency,
                crawl_depth: src.crawl_depth,
                crawl_max_pages: src.crawl_max_pages,
                crawl_rps: src.crawl_rps,
                timeout: fetch_timeout(src.fetch_timeout)?,
                allow_private: src.allow_private_addresses,
            };
            out.push(Box::new(WebConnector::new(url, settings)?));
            continue;
        }
        if let Some(url) = path.to_str().filter(|p| is_nats_url(p)) {
            out.push(subject_connector(url, config)?);
            continue;
        }
        if let Some(url) = path.to_str().filter(|p| is_kafka_url(p)) {
            out.push(topic_connector(url, config)?);
            continue;
        }
        match path.to_str().filter(|p| is_database_url(p)) {
            Some(url) if is_table_source(url) => {
                out.push(table_connector(url, src.max_file_bytes)?)
            }
            Some(url) => {
                return Err(ConfigError::Value(format!(
                    "{}: a database source needs the table: add `?table=NAME` (and `text=`, \
                     `id=`, `title=`, `updated=` for its columns)",
                    crate::secret::redact_url(url)
                ))
                .into())
            }
            None => files.push(path.clone()),
        }
    }
    if files.is_empty() {
        return Ok(out);
    }
    let mut fs = FilesystemConfig::new(files);
    if !src.ext.is_empty() {
        fs.extensions = src.ext.clone();
    }
    fs.include = src.include.clone();
    fs.exclude = src.exclude.clone();
    fs.max_file_bytes = src.max_file_bytes;
    let fs = fs.validate(jsonl)?;
    out.push(Box::new(FilesystemConnector::new(fs)));
    Ok(out)
}

/// The connector of an object store URL, with the source's selection and limits.
fn object_connector(
    url: &str,
    src: &crate::jobs::config::SourceConfig,
    jsonl: JsonlFields,
) -> Result<Box<dyn Connector>, JobError> {
    #[cfg(feature = "object-store")]
    {
        use crate::connectors::filesystem::{Selection, DEFAULT_EXTENSIONS};
        let default: Vec<String>;
        let ext = if src.ext.is_empty() {
            default = DEFAULT_EXTENSIONS.iter().map(|s| s.to_string()).collect();
            &default
        } else {
            &src.ext
        };
        let selection = Selection::new(ext, &src.include, &src.exclude)?;
        Ok(Box::new(crate::connectors::object::ObjectConnector::new(
            url,
            selection,
            jsonl,
            src.max_file_bytes,
            src.fetch_concurrency,
        )?))
    }
    #[cfg(not(feature = "object-store"))]
    {
        let _ = (src, jsonl);
        Err(JobError::NotBuilt {
            what: crate::secret::redact_url(url),
            feature: "object-store",
        })
    }
}

/// The index a broker subject feeds, as its durable consumer is named after it: a file's
/// absolute path, so the same index read from another folder resumes the same consumer.
fn index_key(config: &PipelineConfig) -> String {
    match &config.index.uri.value {
        indexers::IndexUri::Sqlite(p) => std::path::absolute(p)
            .map_or_else(|_| p.display().to_string(), |a| a.display().to_string()),
        other => other.to_string(),
    }
}

/// The connector of a broker subject URL (`nats://HOST:PORT/SUBJECT`).
fn subject_connector(url: &str, config: &PipelineConfig) -> Result<Box<dyn Connector>, JobError> {
    #[cfg(feature = "nats")]
    {
        let src = &config.source;
        let fetch = crate::connectors::nats::FetchSettings {
            max_bytes: src.max_file_bytes,
            timeout: fetch_timeout(src.fetch_timeout)?,
            concurrency: src.fetch_concurrency,
        };
        Ok(Box::new(crate::connectors::nats::NatsConnector::new(
            url,
            &index_key(config),
            fetch,
        )?))
    }
    #[cfg(not(feature = "nats"))]
    {
        let _ = (config, index_key);
        Err(JobError::NotBuilt {
            what: crate::secret::redact_url(url),
            feature: "nats",
        })
    }
}

/// The connector of a Kafka topic URL (`kafka://HOST:PORT/TOPIC`).
fn topic_connector(url: &str, config: &PipelineConfig) -> Result<Box<dyn Connector>, JobError> {
    #[cfg(feature = "kafka")]
    {
        Ok(Box::new(crate::connectors::kafka::KafkaConnector::new(
            url,
            &index_key(config),
            config.source.max_file_bytes,
        )?))
    }
    #[cfg(not(feature = "kafka"))]
    {
        let _ = config;
        Err(JobError::NotBuilt {
            what: crate::secret::redact_url(url),
            feature: "kafka",
        })
    }
}

/// What `ingest --follow` asks about the config's Kafka topics: each one's group lag.
#[cfg(feature = "kafka")]
pub fn topic_waiters(
    config: &PipelineConfig,
) -> Result<Vec<crate::connectors::kafka::Waiter>, JobError> {
    let key = index_key(config);
    config
        .source
        .paths
        .iter()
        .filter_map(|p| p.to_str().filter(|p| is_kafka_url(p)))
        .map(|url| Ok(crate::connectors::kafka::Waiter::open(url, &key)?))
        .collect()
}

/// What `ingest --follow` waits on for the config's broker subjects: each one's consumer.
#[cfg(feature = "nats")]
pub fn subject_waiters(
    config: &PipelineConfig,
) -> Result<Vec<crate::connectors::nats::Waiter>, JobError> {
    let key = index_key(config);
    config
        .source
        .paths
        .iter()
        .filter_map(|p| p.to_str().filter(|p| is_nats_url(p)))
        .map(|url| Ok(crate::connectors::nats::Waiter::open(url, &key)?))
        .collect()
}

/// `--fetch-timeout` as a duration.
/// The program `--isolate-extraction` runs as its child: `RAGLINE_BIN`, else this process's
/// own executable when it is the ragline binary (not, say, a Python interpreter that loaded
/// the library).
pub fn extraction_program() -> Result<std::path::PathBuf, JobError> {
    if let Some(bin) = std::env::var_os("RAGLINE_BIN").filter(|b| !b.is_empty()) {
        return Ok(bin.into());
    }
    let exe = std::env::current_exe()
        .map_err(|e| JobError::Setup(format!("--isolate-extraction: {e}")))?;
    let name = exe.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if !name.starts_with("ragline") {
        return Err(JobError::Setup(format!(
            "--isolate-extraction runs the ragline binary in a child process, and this process \
             is {}: set RAGLINE_BIN to the ragline binary's path",
            exe.display()
        )));
    }
    Ok(exe)
}

fn fetch_timeout(seconds: f64) -> Result<Duration, JobError> {
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or_else(|| {
            ConfigError::Value("--fetch-timeout must be a number of seconds above 0".into()).into()
        })
}

/// The listeners of the config's PostgreSQL tables with `notify=CHANNEL`: what
/// `ingest --follow` waits on between passes.
#[cfg(feature = "postgres")]
pub fn change_listeners(
    config: &PipelineConfig,
) -> Result<Vec<crate::connectors::sql::postgres::Listener>, JobError> {
    use crate::connectors::sql::TableSpec;
    use crate::indexers::postgres::target::PgTarget;
    let mut out = Vec::new();
    for path in &config.source.paths {
        let Some(url) = path.to_str().filter(|p| p.starts_with("postgres")) else {
            continue;
        };
        if !is_table_source(url) {
            continue;
        }
        let (spec, rest) = TableSpec::parse(url)?;
        let Some(channel) = spec.notify else {
            continue;
        };
        let target = PgTarget::parse(&rest).map_err(|e| ConfigError::Value(e.to_string()))?;
        let connect = Box::new(move || {
            target
                .connect()
                .map_err(|e| crate::connectors::ConnectorError::Source(e.to_string()))
        });
        out.push(crate::connectors::sql::postgres::Listener::new(
            connect, &channel,
        )?);
    }
    Ok(out)
}

/// The connector of a table URL (`sqlite://FILE?table=...`, `postgres://...?table=...`).
fn table_connector(url: &str, max_row_bytes: u64) -> Result<Box<dyn Connector>, JobError> {
    if url.starts_with("sqlite://") {
        return Ok(Box::new(TableConnector::sqlite(url, max_row_bytes)?));
    }
    #[cfg(feature = "postgres")]
    {
        use crate::connectors::sql::TableSpec;
        use crate::indexers::postgres::target::PgTarget;
        let (spec, rest) = TableSpec::parse(url)?;
        // The index's URL rules: TLS (`sslmode`, `sslrootcert`...), the password kept inside.
        let target = PgTarget::parse(&rest).map_err(|e| ConfigError::Value(e.to_string()))?;
        let connect = Box::new(move || {
            target
                .connect()
                .map_err(|e| crate::connectors::ConnectorError::Source(e.to_string()))
        });
        Ok(Box::new(TableConnector::postgres(
            spec,
            connect,
            max_row_bytes,
        )?))
    }
    #[cfg(not(feature = "postgres"))]
    Err(JobError::NotBuilt {
        what: crate::secret::redact_url(url),
        feature: "postgres",
    })
}

/// Run an ingest: read the sources, chunk, embed (unless deferred) and index.
pub fn ingest(
    config: &PipelineConfig,
    observer: &mut dyn Observer,
) -> Result<RunSummary, JobError> {
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
) -> Result<RunSummary, JobError> {
    let mut prepared = prepare(config, Build::Everything)?;
    let mut connectors = connectors;
    let settlements = ready(&mut connectors, &mut prepared, scope);
    let parts = RunParts {
        connectors,
        pipeline: prepared.pipeline.as_ref(),
        embedder: prepared.pool,
        backend: prepared.backend.as_ref(),
    };
    let result = run::execute(parts, &prepared.options, observer);
    observer.finish();
    let before = Before {
        backend: &prepared.backend,
        in_index: &prepared.in_index,
        delete_gone: prepared.delete_gone,
    };
    let outcome = (|| {
        let mut summary = result?;
        summary.encoder = prepared.encoder;
        if let Some(r) = &prepared.remote {
            summary.remote = Some(r.endpoint().stats().snapshot());
            service_embedder::settle_circuit(r.endpoint(), &config.index.uri.value, EMBED);
        }
        finish_ingest(config, before, &mut summary)?;
        Ok(summary)
    })();
    settle(settlements, outcome)
}

/// Before a run: the connectors learn what the index holds and hand over their settlements.
/// A run of some documents (a requeue) or of a stream of changes (a broker subject) finds no
/// gone documents by what it did not publish: only those its source says are gone.
pub(crate) fn ready(
    connectors: &mut [Box<dyn Connector>],
    prepared: &mut Prepared,
    scope: Scope,
) -> Vec<Box<dyn Settlement>> {
    for c in connectors.iter_mut() {
        c.know(&prepared.known);
    }
    prepared.delete_gone = connectors.iter().any(|c| c.deletes_gone());
    if scope == Scope::SomeDocuments {
        prepared.options.track_ids = false;
        prepared.in_index = None;
    } else if connectors.iter().any(|c| !c.whole_source()) {
        prepared.options.track_ids = false;
    }
    connectors
        .iter_mut()
        .filter_map(|c| c.settlement())
        .collect()
}

/// After a run: the connectors' settlements, told whether the run was accounted for (it
/// came to its summary, pruning included), their notes added to the summary.
pub(crate) fn settle(
    settlements: Vec<Box<dyn Settlement>>,
    outcome: Result<RunSummary, JobError>,
) -> Result<RunSummary, JobError> {
    let accounted = outcome.is_ok();
    let notes: Vec<String> = settlements
        .into_iter()
        .flat_map(|s| s.settle(accounted))
        .collect();
    outcome.map(|mut summary| {
        summary.notes.extend(notes);
        summary
    })
}

/// What [`finish_ingest`] takes of a run's [`Prepared`].
pub(crate) struct Before<'a> {
    pub backend: &'a Arc<dyn BackendFactory>,
    pub in_index: &'a Option<std::collections::HashSet<String>>,
    pub delete_gone: bool,
}

/// After the run: the backend's last work (an HNSW index), documents gone from the source,
/// --prune.
pub(crate) fn finish_ingest(
    config: &PipelineConfig,
    index: Before<'_>,
    summary: &mut RunSummary,
) -> Result<(), JobError> {
    let (backend, in_index) = (index.backend, index.in_index);
    let uri = &config.index.uri.value;
    // Documents the index holds that this run's source no longer has: those it did not
    // publish when it read the whole source, else those it said are gone.
    let missing: Option<Vec<String>> = match (in_index, &summary.published_ids) {
        (Some(before), Some(seen)) => Some(before.difference(seen).cloned().collect()),
        (Some(before), None) => Some(
            summary
                .gone_ids
                .iter()
                .filter(|id| before.contains(*id))
                .cloned()
                .collect(),
        ),
        _ => None,
    };
    if let Some(mut missing) = missing {
        missing.sort();
        missing.dedup();
        if (config.index.prune || index.delete_gone) && !missing.is_empty() {
            summary.pruned = backend.delete_documents(&missing)? as u64;
        }
        summary.missing_from_source = missing;
    } else if config.index.prune {
        tracing::warn!("--prune does nothing with {}", backend.describe());
    }
    if config.index.prune && uri.is_store() {
        let dropped = indexers::open_store(uri)?.drop_retired()?;
        for model in dropped {
            summary
                .notes
                .push(format!("dropped the vectors of retired model `{model}`"));
        }
    }
    // Last, so what pruning changed is in it too.
    summary.notes.extend(backend.finish()?);
    Ok(())
}
