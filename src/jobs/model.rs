//! The model a job embeds with: its files, the devices, loading it with the config's
//! prompts and dimensions, what the index records of it, and the pool of embedders.

use std::time::Duration;

use crate::embed::device::{self, SelectedDevice};
use crate::embed::pool::{
    BatchPolicy, Embedder, EmbedderPool, DEFAULT_BATCH_TOKENS_CPU, DEFAULT_BATCH_TOKENS_GPU,
};
use crate::embed::{EmbeddingModel, ModelFiles};
use crate::indexers::ModelIdentity;

use super::{config, JobError};

/// The model's files, with a message that names the fix.
pub fn model_files(name: &str) -> Result<ModelFiles, JobError> {
    ModelFiles::resolve(name)
        .map_err(|e| JobError::Model(format!("cannot find the model `{name}`: {e}")))
}

/// The devices the config names.
pub fn devices(model: &config::ModelConfig) -> Result<Vec<SelectedDevice>, JobError> {
    crate::embed::kernel_choice::choose(&model.kernels);
    device::select(&model.device.value)
        .map_err(|e| JobError::Model(format!("cannot open the device: {e}")))
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
) -> Result<EmbeddingModel, JobError> {
    crate::embed::kernel_choice::choose(&model.kernels);
    let mut m =
        EmbeddingModel::load_for(files, &device.device, model.dtype.value).map_err(|e| {
            JobError::Model(format!(
                "cannot load model `{}` on {}: {e}",
                files.name, device.label
            ))
        })?;
    m.tokenizer.set_prompts(
        model.query_prompt.as_deref(),
        model.passage_prompt.as_deref(),
    )?;
    m.set_dimensions(model.dimensions)
        .map_err(|e| super::ConfigError::Value(e.to_string()))?;
    Ok(m)
}

/// Load the cross-encoder `spec` names (a folder, a name under models/, a hub id) on the
/// first device `model` names, in its dtype.
pub fn load_reranker(
    spec: &str,
    model: &config::ModelConfig,
) -> Result<crate::embed::cross_encoder::CrossEncoder, JobError> {
    let files = model_files(spec)?;
    let devices = devices(model)?;
    let device = &devices[0];
    crate::embed::cross_encoder::CrossEncoder::load_files(files, &device.device, model.dtype.value)
        .map_err(|e| {
            JobError::Model(format!(
                "cannot load the reranker `{spec}` on {}: {e}",
                device.label
            ))
        })
}

/// Load the sparse (SPLADE) model `spec` names on the first device `model` names, in its
/// dtype.
pub fn load_sparse(
    spec: &str,
    model: &config::ModelConfig,
) -> Result<crate::embed::splade::SparseModel, JobError> {
    let files = model_files(spec)?;
    let devices = devices(model)?;
    let device = &devices[0];
    crate::embed::splade::SparseModel::load_files(files, &device.device, model.dtype.value).map_err(
        |e| {
            JobError::Model(format!(
                "cannot load the sparse model `{spec}` on {}: {e}",
                device.label
            ))
        },
    )
}

/// The index `config` names, opened for searching in `mode`: vector and hybrid search load
/// the index's own model (on `model`'s device, with its dtype and query prompt). What
/// `ragline search` and the Python package's `ragline.Index` search with.
pub fn open_searcher(
    config: &config::PipelineConfig,
    model: &config::ModelConfig,
    exact: bool,
    mode: crate::search::Mode,
) -> Result<crate::search::Searcher, JobError> {
    let reader = crate::search::Searcher::open(&config.index.uri.value, exact)?;
    // The query is embedded with the index's own models (not --model's default).
    searcher(reader, model, mode.needs_dense(), mode.needs_sparse())
}

/// A searcher over `reader` with what `dense` and `sparse` search need: the index's own dense
/// model (fitted to its `--dimensions`) and its sparse model, each loaded on `model`'s first
/// device in its dtype (not `model`'s name: a query is encoded as the index's chunks were).
pub fn searcher(
    reader: Box<dyn crate::indexers::IndexReader>,
    model: &config::ModelConfig,
    dense: bool,
    sparse: bool,
) -> Result<crate::search::Searcher, JobError> {
    use crate::search::Searcher;
    let embedder = if dense {
        let spec = Searcher::model_spec(reader.as_ref()).ok_or_else(|| {
            super::ConfigError::Value(
                "the index holds no vectors (it was built with --no-chunk); use --mode keyword"
                    .into(),
            )
        })?;
        let files = model_files(&spec)
            .map_err(|e| JobError::Model(format!("cannot find the index's model `{spec}`: {e}")))?;
        let devices = devices(model)?;
        let mut m = load_model(&files, &devices[0], model)?;
        Searcher::fit_model(reader.as_ref(), &mut m)?;
        Some(m)
    } else {
        None
    };
    let splade = if sparse {
        let spec = Searcher::sparse_model_spec(reader.as_ref()).ok_or_else(|| {
            super::ConfigError::Value(format!(
                "{} has no sparse vectors: add them with `ragline enrich --stage sparse \
                 --sparse-model MODEL` (or ingest with --sparse-model), or search another --mode",
                reader.describe()
            ))
        })?;
        Some(load_sparse(&spec, model)?)
    } else {
        None
    };
    Ok(Searcher::new(reader, embedder).with_sparse(splade))
}

/// What the index records of a model.
pub fn model_identity(
    files: &ModelFiles,
    model: &EmbeddingModel,
) -> Result<ModelIdentity, JobError> {
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
pub(crate) fn embedder_pool(
    files: &ModelFiles,
    devices: &[SelectedDevice],
    first: EmbeddingModel,
    model: &config::ModelConfig,
) -> Result<EmbedderPool, JobError> {
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

/// Tell where the job embeds (the CLI shows these notes as they come).
pub(crate) fn note_devices(devices: &[SelectedDevice]) {
    for d in devices {
        tracing::info!(target: crate::NOTE, "embedding on {} ({})", d.label, d.reason);
    }
}

/// Tell which encoder a loaded model runs on.
pub(crate) fn note_encoder(model: &EmbeddingModel) {
    tracing::info!(target: crate::NOTE, "encoder: {}", model.encoder_kind());
}
