//! `enrich`, `backfill` and `status`: the index's lifecycle queue worked by this process's
//! workers (or through a broker), with the models of its vector sets and the LLM stages.

use std::path::Path;
use std::sync::Arc;

use crate::embed::device::SelectedDevice;
use crate::embed::pool::WINDOW_BATCHES;
use crate::embed::ModelFiles;
use crate::indexers::{self, IndexStore, IndexUri, VectorSet};
use crate::lifecycle::report::StatusReport;
use crate::lifecycle::{EMBED, ENTITIES, LABELS, SPARSE};
use crate::run::enrich::Unloadable;
use crate::run::enrich::{EnrichOptions, EnrichWorker, LlmStage, SetModel};
use crate::run::progress::Observer;
use crate::run::{self, RunSummary};

use super::config::ConfigError;
#[cfg(feature = "nats")]
use super::distributed;
use super::model::{batch_tokens, devices, load_model, model_files, model_identity};
use super::{config, metrics, service_embedder, JobError, PipelineConfig};

/// The lifecycle store of the index a command works on (sqlite:// or postgres://).
pub fn lifecycle_store(config: &PipelineConfig) -> Result<Box<dyn IndexStore>, JobError> {
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
) -> Result<RunSummary, JobError> {
    config.validate()?;
    let uri = &config.index.uri.value;
    let mut store = lifecycle_store(config)?;
    let status = store.status()?;
    let sets = store.sets()?;
    let recorded_sparse = store.sparse_model()?;
    drop(store);
    let graph = config
        .stages
        .graph()
        .map_err(|e| ConfigError::Value(format!("stages: {e}")))?;
    lifecycle_store(config)?.record_dependencies(&graph.edges())?;
    let chunk_models = super::model_stages::configured(config, recorded_sparse.is_some());
    let stages = enrich_stages(config, request, &sets, &chunk_models)?;
    let embeds = stages.iter().any(|s| s == EMBED);
    let llm = llm_stages(config, &stages)?;
    if let Some(m) = &request.metrics {
        for l in &llm {
            m.endpoint(&l.name, l.client.endpoint());
        }
    }
    let service = if embeds {
        embed_service(config, request, &sets)?
    } else {
        None
    };
    let devices = devices(&config.model)?;
    let settings = config.stages.embed.settings();
    let list = workers(
        config,
        request,
        &devices,
        &service,
        settings.concurrency.max(1),
    )?;
    let (models, model_work) = super::model_stages::model_stages(config, &stages, recorded_sparse)?;
    let announced =
        queue_llm_work(config, &llm)? + if embeds { embed_work(&status) } else { 0 } + model_work;
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
        models,
        ..EnrichOptions::default()
    };
    let result = match &request.queue {
        None => run::enrich::execute(list, &options, uri.to_string(), observer),
        #[cfg(feature = "nats")]
        Some(url) => {
            let run = queued_run(url, &options)?;
            let feeder = lifecycle_store(config)?;
            run::enrich::execute_on_broker(list, feeder, &run, &options, uri.to_string(), observer)
        }
        #[cfg(not(feature = "nats"))]
        Some(_) => Err(JobError::NotBuilt {
            what: "enrich --queue".into(),
            feature: "nats",
        })?,
    };
    observer.finish();
    let mut summary = result?;
    settle_services(&mut summary, service.as_ref(), &llm, uri);
    summary.notes.extend(lifecycle_store(config)?.finish_run()?);
    Ok(summary)
}

/// The service that embeds, when one does (the config names one, or the index was embedded
/// by one); else the model override is checked against the index's.
fn embed_service(
    config: &PipelineConfig,
    request: &EnrichRequest,
    sets: &[VectorSet],
) -> Result<Option<RemoteSet>, JobError> {
    // A service embeds (the config names one, or the index was embedded by one): --model
    // names the tokenizer that counts its tokens.
    let mut c = config.clone();
    if let Some(name) = &request.model_override {
        c.model.name = name.clone();
    }
    let service = remote_set(&c, sets)?;
    if service.is_none() {
        check_override(config, request, sets)?;
    }
    if let (Some(m), Some(s)) = (&request.metrics, &service) {
        m.endpoint(EMBED, s.embedder.endpoint());
    }
    Ok(service)
}

/// `count` workers, each with its own store connection and a model loader on its device
/// (the devices taken in turn).
fn workers(
    config: &PipelineConfig,
    request: &EnrichRequest,
    devices: &[SelectedDevice],
    service: &Option<RemoteSet>,
    count: usize,
) -> Result<Vec<EnrichWorker<Box<dyn IndexStore>>>, JobError> {
    let uri = &config.index.uri.value;
    let mut list = Vec::with_capacity(count);
    for i in 0..count {
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
    Ok(list)
}

/// After the run: the embedding service's counts in the summary, each service's circuit
/// settled, and a note of each LLM stage's calls.
fn settle_services(
    summary: &mut RunSummary,
    service: Option<&RemoteSet>,
    llm: &[Arc<LlmStage>],
    uri: &IndexUri,
) {
    if let Some(s) = service {
        summary.remote = Some(s.embedder.endpoint().stats().snapshot());
        service_embedder::settle_circuit(s.embedder.endpoint(), uri, EMBED);
    }
    for l in llm {
        service_embedder::settle_circuit(l.client.endpoint(), uri, &l.name);
        summary
            .notes
            .extend(calls_note(&l.name, l.client.endpoint()));
    }
}

/// The stages an enrich works: those asked for, else every stage there is (embedding, when
/// the index has a model, and the LLM stages of the config); each checked.
fn enrich_stages(
    config: &PipelineConfig,
    request: &EnrichRequest,
    sets: &[VectorSet],
    chunk_models: &[String],
) -> Result<Vec<String>, JobError> {
    let configured = config.stages.llm_stages();
    let stages = if request.stages.is_empty() {
        let mut v: Vec<String> = Vec::new();
        if !sets.is_empty() || (configured.is_empty() && chunk_models.is_empty()) {
            v.push(EMBED.to_string());
        }
        v.extend(chunk_models.iter().cloned());
        v.extend(configured.iter().map(|c| c.name.clone()));
        v
    } else {
        request.stages.clone()
    };
    for s in &stages {
        if !crate::lifecycle::is_enrichable(s) {
            return Err(ConfigError::Value(format!(
                "`enrich --stage {s}`: enrich runs the stages `{EMBED}`, `{SPARSE}`, \
                 `{ENTITIES}`, `{LABELS}` and the LLM stages of ragline.toml (chunking is done \
                 by `ragline ingest`)"
            ))
            .into());
        }
        // `noop` (claims and finishes work, nothing else) is a hook for tests and benchmarks.
        let hook = cfg!(feature = "test-hooks") && s == crate::lifecycle::NOOP;
        let model_stage = [SPARSE, ENTITIES, LABELS].contains(&s.as_str());
        if s != EMBED && !model_stage && !hook && !configured.iter().any(|c| &c.name == s) {
            return Err(ConfigError::Value(format!(
                "`enrich --stage {s}`: no such stage in ragline.toml; an LLM stage needs a \
                 section with its url and model ([stages.summary], or [[stages.llm]] with \
                 name = \"{s}\")"
            ))
            .into());
        }
    }
    if stages.iter().any(|s| s == EMBED) && sets.is_empty() {
        return Err(JobError::Config(ConfigError::Value(format!(
            "index {} has no model: ingest with a model first (not --no-chunk)",
            config.index.uri.value
        ))));
    }
    Ok(stages)
}

/// `--model`, when given, must be a model of the index: checked before anything runs.
fn check_override(
    config: &PipelineConfig,
    request: &EnrichRequest,
    sets: &[VectorSet],
) -> Result<(), JobError> {
    let Some(name) = &request.model_override else {
        return Ok(());
    };
    let files = model_files(name)?;
    let devices = devices(&config.model)?;
    let model = load_model(&files, &devices[0], &config.model)?;
    let fp = model.fingerprint()?;
    if sets.iter().any(|s| s.fingerprint == fp) {
        return Ok(());
    }
    Err(JobError::Config(ConfigError::Value(format!(
        "--model {name} (fingerprint {fp}) is not a model of this index ({}); to move the \
         index to it, run `ragline backfill --stage embed --model {name}`",
        sets.iter()
            .map(|s| format!("`{}` {}", s.model, s.fingerprint))
            .collect::<Vec<_>>()
            .join(", ")
    ))))
}

/// Queue what the LLM stages have not answered for the documents as they are now. Returns
/// the work waiting for them.
fn queue_llm_work(config: &PipelineConfig, llm: &[Arc<LlmStage>]) -> Result<u64, JobError> {
    if llm.is_empty() {
        return Ok(0);
    }
    let mut store = lifecycle_store(config)?;
    for l in llm {
        store.sync_stage(&l.name, &l.fingerprint, l.settings.priority)?;
    }
    Ok(store
        .status()?
        .stages
        .iter()
        .filter(|(name, _)| llm.iter().any(|l| &l.name == *name))
        .map(|(_, s)| s.pending + s.failed + s.in_progress)
        .sum())
}

/// The embed work waiting in the active set and in a backfill.
fn embed_work(status: &StatusReport) -> u64 {
    let active = status
        .stages
        .get(EMBED)
        .map_or(0, |s| s.pending + s.failed + s.in_progress);
    let backfill = status.backfill.as_ref().map_or(0, |b| {
        b.stage.pending + b.stage.failed + b.stage.in_progress
    });
    active + backfill
}

/// The summary's line about a stage's calls to its service (none when it made none).
fn calls_note(stage: &str, endpoint: &crate::http::Endpoint) -> Option<String> {
    let c = endpoint.stats().snapshot();
    (c.requests > 0).then(|| {
        format!(
            "{stage}: {} requests to {} ({} retried: {} rate-limited, {} server errors, {} \
             without an answer, {} malformed; {} refused)",
            c.requests,
            endpoint.settings().url,
            c.retries,
            c.throttled,
            c.server_errors,
            c.transport_errors,
            c.malformed,
            c.rejected
        )
    })
}

/// The broker side of `enrich --queue`: its stages' consumers (AckWait = the stage's
/// visibility timeout, MaxDeliver = its retry limit), SIGTERM handling, and the store's lease
/// on published work, long enough for every delivery and backoff of the longest stage.
#[cfg(feature = "nats")]
fn queued_run(
    url: &str,
    options: &run::enrich::EnrichOptions,
) -> Result<run::enrich::QueuedRun, JobError> {
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
    )?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    broker.stop_on_signals(Arc::clone(&stop));
    Ok(run::enrich::QueuedRun::new(queue, lease, stop))
}

/// The LLM stages among `stages`, with their clients (one endpoint each, shared by every
/// worker, so its limits are the process's).
fn llm_stages(
    config: &PipelineConfig,
    stages: &[String],
) -> Result<Vec<Arc<crate::run::enrich::LlmStage>>, JobError> {
    let mut out = Vec::new();
    for c in config.stages.llm_stages() {
        if !stages.contains(&c.name) {
            continue;
        }
        let endpoint = crate::http::Endpoint::new(c.endpoint()?)?;
        service_embedder::report_circuit(&endpoint, &config.index.uri.value, &c.name);
        out.push(Arc::new(crate::run::enrich::LlmStage {
            name: c.name.clone(),
            client: Arc::new(crate::http::chat::ChatClient::new(
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
    embedder: Arc<crate::http::embed::RemoteEmbedder>,
    tokenizer: crate::embed::tokenizer::TextTokenizer,
    /// The vector set fingerprint it makes.
    fingerprint: String,
    batch_tokens: usize,
}

/// The service enrich embeds with: the config's (`--embed-url`). None when a model in this
/// process embeds. The service an index records is never called on the index's word alone
/// (a received index could name any host): a set it embedded waits for `--embed-url`.
fn remote_set(config: &PipelineConfig, _sets: &[VectorSet]) -> Result<Option<RemoteSet>, JobError> {
    if !config.stages.embed.remote.enabled() {
        return Ok(None);
    }
    let rc = config.stages.embed.remote.clone();
    rc.validate()?;
    let embedder = service_embedder::remote_embedder(&rc)?;
    service_embedder::report_circuit(embedder.endpoint(), &config.index.uri.value, EMBED);
    let files = model_files(&config.model.name)?;
    let tokenizer = crate::embed::service::load_tokenizer(&files)
        .map_err(|e| JobError::Model(format!("model `{}`: {e}", files.name)))?;
    let dimension = embedder.dimension().expect("probed");
    let identity = service_embedder::remote_identity(&rc, &files, &tokenizer, dimension)?;
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
    Box::new(move |set_id: i64| -> Result<SetModel, Unloadable> {
        let set = find_set(&uri, set_id)?;
        if let Some(s) = service
            .as_ref()
            .filter(|s| s.fingerprint == set.fingerprint)
        {
            return Ok(SetModel {
                batch_tokens: s.batch_tokens,
                label: s.embedder.endpoint().shown_url(""),
                encoder: Box::new(crate::embed::service::RemoteEncoder::new(
                    Arc::clone(&s.embedder),
                    s.tokenizer.clone(),
                )),
            });
        }
        if let Some(rc) = service_embedder::config_of_index(&set.model, &set.model_dir) {
            return Err(Unloadable(format!(
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
            )));
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
            let loaded =
                load_model(&files, &device, &model).map_err(|e| Unloadable(e.to_string()))?;
            let fp = loaded
                .fingerprint()
                .map_err(|e| Unloadable(e.to_string()))?;
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
        Err(Unloadable(format!(
            "cannot load the model of vector set {} (`{}`): {}; make it available \
             (scripts/fetch-model.sh) or name its folder with --model",
            set.id,
            set.model,
            tried.join("; ")
        )))
    })
}

fn find_set(uri: &IndexUri, id: i64) -> Result<VectorSet, Unloadable> {
    indexers::open_store(uri)
        .and_then(|mut s| s.sets())
        .map_err(|e| Unloadable(e.to_string()))?
        .into_iter()
        .find(|s| s.id == id)
        .ok_or_else(|| Unloadable(format!("the index has no vector set {id}")))
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
) -> Result<BackfillOutcome, JobError> {
    config.validate()?;
    let mut summary = None;
    if let Some(name) = model {
        let files = model_files(name)?;
        let devices = devices(&config.model)?;
        let loaded = load_model(&files, &devices[0], &config.model)?;
        let identity = model_identity(&files, &loaded)?;
        drop(loaded);
        let set = lifecycle_store(config)?.start_backfill(&identity)?;
        tracing::info!(
            target: crate::NOTE,
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
pub fn status(config: &PipelineConfig) -> Result<StatusReport, JobError> {
    let mut store = lifecycle_store(config)?;
    let mut report = store.status()?;
    report.sparse_model = store.sparse_model()?.map(|m| m.name);
    Ok(report)
}
