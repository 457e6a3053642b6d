//! The stages that run a model of this process over each document's chunks (`sparse`,
//! `entities`, `labels`): their models loaded on the config's first device, their
//! fingerprints (the model's files and the stage's settings), their work queued for the
//! documents whose results are missing or stale, and their run after an ingest.

use std::path::Path;
use std::sync::Arc;

use crate::embed::classify::{LabelChoice, SequenceClassifier};
use crate::embed::ner::{NerOptions, TokenClassifier};
use crate::lifecycle::{Priority, SparseModelRecord, ENTITIES, LABELS, SPARSE};
use crate::run::enrich::{ChunkModel, ModelStage};
use crate::run::progress::Observer;
use crate::run::RunSummary;

use super::config::ConfigError;
use super::enrich::{enrich, lifecycle_store, EnrichRequest};
use super::model::{devices, load_sparse, model_files};
use super::{JobError, PipelineConfig};

/// The chunk-model stages among `stages`, loaded, recorded and queued. Returns them and the
/// work waiting for them.
pub(super) fn model_stages(
    config: &PipelineConfig,
    stages: &[String],
    recorded_sparse: Option<SparseModelRecord>,
) -> Result<(Vec<Arc<ModelStage>>, u64), JobError> {
    let mut out = Vec::new();
    if stages.iter().any(|s| s == SPARSE) {
        out.push(sparse_stage(config, recorded_sparse)?);
    }
    if stages.iter().any(|s| s == ENTITIES) {
        out.push(entities_stage(config)?);
    }
    if stages.iter().any(|s| s == LABELS) {
        out.push(labels_stage(config)?);
    }
    let mut store = lifecycle_store(config)?;
    for m in &out {
        store.sync_stage(m.name(), &m.fingerprint, m.settings.priority)?;
    }
    let status = store.status()?;
    let waiting = out
        .iter()
        .filter_map(|m| status.stages.get(m.name()))
        .map(|s| s.pending + s.failed + s.in_progress)
        .sum();
    Ok((out.into_iter().map(Arc::new).collect(), waiting))
}

/// The chunk-model stages a config turns on (the sparse one also when the index records a
/// sparse model).
pub(super) fn configured(config: &PipelineConfig, sparse_recorded: bool) -> Vec<String> {
    let s = &config.stages;
    let mut v = Vec::new();
    if sparse_recorded || s.sparse.model.is_some() {
        v.push(SPARSE.to_string());
    }
    if s.entities.model.is_some() {
        v.push(ENTITIES.to_string());
    }
    if s.labels.model.is_some() {
        v.push(LABELS.to_string());
    }
    v
}

/// The sparse stage: the model the config names (`--sparse-model`), else the one the index
/// records; recorded in the index (another model than the recorded one makes every
/// document's sparse vectors stale: they are computed again, at backfill priority).
fn sparse_stage(
    config: &PipelineConfig,
    recorded: Option<SparseModelRecord>,
) -> Result<ModelStage, JobError> {
    let spec =
        match (&config.stages.sparse.model, &recorded) {
            (Some(name), _) => name.clone(),
            (None, Some(r)) if Path::new(&r.dir).is_dir() => r.dir.clone(),
            (None, Some(r)) => r.name.clone(),
            (None, None) => return Err(ConfigError::Value(
                "the sparse stage needs a SPLADE model: give --sparse-model MODEL (a folder, a \
                 name under models/, a hub id; `scripts/fetch-model.sh splade-tiny` fetches a \
                 small one)"
                    .into(),
            )
            .into()),
        };
    let model = load_sparse(&spec, &config.model)?;
    let fingerprint = model.fingerprint()?;
    let record = SparseModelRecord {
        name: match (&config.stages.sparse.model, &recorded) {
            (None, Some(r)) => r.name.clone(),
            _ => spec.clone(),
        },
        dir: std::fs::canonicalize(&model.files.dir)
            .unwrap_or_else(|_| model.files.dir.clone())
            .display()
            .to_string(),
        fingerprint: fingerprint.clone(),
        dimension: model.dimension(),
    };
    let mut settings = config.stages.embed.settings();
    if let Some(r) = recorded.as_ref().filter(|r| r.fingerprint != fingerprint) {
        tracing::info!(
            target: crate::NOTE,
            "sparse model changed from `{}` to `{spec}`: every document's sparse vectors are \
             computed again (until then, sparse search mixes the two models' vectors)",
            r.name
        );
        settings.priority = Priority::Backfill;
    }
    if recorded.as_ref() != Some(&record) {
        lifecycle_store(config)?.record_sparse_model(&record)?;
    }
    Ok(ModelStage {
        model: ChunkModel::Sparse(Arc::new(model)),
        fingerprint,
        settings,
    })
}

/// The entities stage with the config's token-classification model.
fn entities_stage(config: &PipelineConfig) -> Result<ModelStage, JobError> {
    let c = &config.stages.entities;
    let spec = c.model.clone().ok_or_else(|| {
        ConfigError::Value(
            "the entities stage needs a token-classification model: give --ner-model MODEL or \
             [stages.entities] model = ..."
                .into(),
        )
    })?;
    let devices = devices(&config.model)?;
    let device = &devices[0];
    let model = TokenClassifier::load_files(
        model_files(&spec)?,
        &device.device,
        config.model.dtype.value,
        None,
    )
    .map_err(|e| {
        JobError::Model(format!(
            "cannot load the NER model `{spec}` on {}: {e}",
            device.label
        ))
    })?;
    let aggregation = c
        .aggregation
        .parse()
        .map_err(|e| ConfigError::Value(format!("stages.entities.aggregation: {e}")))?;
    let fingerprint = stage_fingerprint(
        &model.fingerprint()?,
        &format!("{ENTITIES}|{}|{}", c.aggregation, c.min_score),
    );
    Ok(ModelStage {
        model: ChunkModel::Entities {
            model: Arc::new(model),
            options: NerOptions {
                aggregation,
                ..NerOptions::default()
            },
            min_score: c.min_score,
        },
        fingerprint,
        settings: config.stages.embed.settings(),
    })
}

/// The labels stage with the config's sequence-classification model.
fn labels_stage(config: &PipelineConfig) -> Result<ModelStage, JobError> {
    let c = &config.stages.labels;
    let spec = c.model.clone().ok_or_else(|| {
        ConfigError::Value(
            "the labels stage needs a sequence-classification model: give --classifier-model \
             MODEL or [stages.labels] model = ..."
                .into(),
        )
    })?;
    let devices = devices(&config.model)?;
    let device = &devices[0];
    let model = SequenceClassifier::load_files(
        model_files(&spec)?,
        &device.device,
        config.model.dtype.value,
    )
    .map_err(|e| {
        JobError::Model(format!(
            "cannot load the classifier `{spec}` on {}: {e}",
            device.label
        ))
    })?;
    let fingerprint = stage_fingerprint(
        &model.fingerprint()?,
        &format!("{LABELS}|{}|{}", c.top_k, c.threshold),
    );
    Ok(ModelStage {
        model: ChunkModel::Labels {
            model: Arc::new(model),
            choice: LabelChoice {
                top_k: Some(c.top_k),
                threshold: Some(c.threshold),
            },
        },
        fingerprint,
        settings: config.stages.embed.settings(),
    })
}

/// A stage's fingerprint: its model's and its settings'.
fn stage_fingerprint(model: &str, settings: &str) -> String {
    let mut h = blake3::Hasher::new();
    h.update(model.as_bytes());
    h.update(b"|");
    h.update(settings.as_bytes());
    h.finalize().to_hex()[..16].to_string()
}

/// After an ingest: the chunk-model stages the config turns on (and `sparse` when the index
/// has sparse vectors) worked to the end by this process, or, when embedding is deferred,
/// queued for `ragline enrich`. Their failures and notes join `summary` (a document whose
/// stage failed fails the run; `ragline dlq` has it).
pub fn after_ingest(
    config: &PipelineConfig,
    summary: &mut RunSummary,
    observer: &mut dyn Observer,
) -> Result<(), JobError> {
    if !config.index.uri.value.is_store() {
        return Ok(());
    }
    let mut store = lifecycle_store(config)?;
    // An index that has sparse vectors keeps them current without the flag.
    let recorded = store.sparse_model()?;
    let stages = configured(config, recorded.is_some());
    if stages.is_empty() {
        return Ok(());
    }
    let graph = config
        .stages
        .graph()
        .map_err(|e| ConfigError::Value(format!("stages: {e}")))?;
    store.record_dependencies(&graph.edges())?;
    drop(store);
    // What the summary calls them ("sparse vectors", as before the other stages existed).
    let shown: Vec<&str> = stages
        .iter()
        .map(|s| {
            if s == SPARSE {
                "sparse vectors"
            } else {
                s.as_str()
            }
        })
        .collect();
    let shown = shown.join(", ");
    if config.stages.embed.defer {
        let (_, waiting) = model_stages(config, &stages, recorded)?;
        summary.notes.push(format!(
            "{shown} deferred: {waiting} documents queued for `ragline enrich`"
        ));
        return Ok(());
    }
    let request = EnrichRequest {
        stages: stages.clone(),
        ..EnrichRequest::default()
    };
    let done = enrich(config, &request, observer)?;
    summary.notes.push(format!(
        "{shown}: {} documents done, {} failed ({:.1}s)",
        done.counts.indexed, done.counts.failed, done.elapsed_secs
    ));
    summary.counts.failed += done.counts.failed;
    summary.failures.extend(done.failures);
    summary.notes.extend(done.notes);
    Ok(())
}
