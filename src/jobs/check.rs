//! `check`: a job validated without running it.

use std::path::Path;

#[cfg(feature = "postgres")]
use crate::indexers::BackendError;
use crate::indexers::{self, IndexReader, IndexUri};

use super::config::ConfigError;
use super::model::{devices, load_model, model_files};
use super::{service_embedder, JobError, PipelineConfig};

/// What `ragline check` found.
pub struct CheckReport {
    pub config_file: Option<std::path::PathBuf>,
    pub index: String,
    pub model: Option<String>,
    pub resolved: String,
}

/// Validate a pipeline without running it: the file, the index (opened read-only) and the
/// model (loaded).
pub fn check(config: &PipelineConfig) -> Result<CheckReport, JobError> {
    config.validate()?;
    let index = check_index(config)?;
    let model = if config.chunk.enabled && config.stages.embed.remote.enabled() {
        Some(check_service(config)?)
    } else if config.chunk.enabled {
        Some(check_model(config)?)
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

/// What the index holds (opened read-only), or that the first ingest will create it.
fn check_index(config: &PipelineConfig) -> Result<String, JobError> {
    Ok(match &config.index.uri.value {
        IndexUri::Sqlite(path) if path.exists() => described(
            &config.index.uri.value,
            &*indexers::open_reader(&config.index.uri.value, true)?,
        )?,
        IndexUri::Sqlite(path) => {
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if !dir.is_dir() {
                return Err(JobError::Config(ConfigError::Value(format!(
                    "index {}: folder `{}` does not exist",
                    config.index.uri.value,
                    dir.display()
                ))));
            }
            format!(
                "{}: new (created by the first ingest)",
                config.index.uri.value
            )
        }
        #[cfg(feature = "postgres")]
        IndexUri::Postgres(target) => {
            // Connects, and reads the index if the schema holds one (nothing is created).
            match indexers::open_reader(&config.index.uri.value, true) {
                Ok(reader) => described(target, &*reader)?,
                Err(BackendError::NoIndex(_)) => {
                    format!("{target}: reachable; new (created by the first ingest)")
                }
                Err(e) => return Err(e.into()),
            }
        }
        _ => config.index.uri.value.to_string(),
    })
}

/// An existing index in a line: its counts and model.
fn described(name: &dyn std::fmt::Display, reader: &dyn IndexReader) -> Result<String, JobError> {
    let (docs, chunks, vectors) = reader.counts()?;
    Ok(format!(
        "{name}: {docs} documents, {chunks} chunks, {vectors} embedded{}",
        reader
            .meta()
            .model
            .as_ref()
            .map(|m| format!(", model `{m}`"))
            .unwrap_or_default()
    ))
}

/// The embedding service answers (one probe), and the tokenizer that sizes chunks loads.
fn check_service(config: &PipelineConfig) -> Result<String, JobError> {
    let r = &config.stages.embed.remote;
    let files = model_files(&config.model.name)?;
    let tokenizer = crate::embed::service::load_tokenizer(&files)
        .map_err(|e| JobError::Model(format!("model `{}`: {e}", files.name)))?;
    let service = service_embedder::remote_embedder(r)?;
    Ok(format!(
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
}

/// The model loads on the first device it would run on.
fn check_model(config: &PipelineConfig) -> Result<String, JobError> {
    let files = model_files(&config.model.name)?;
    let devices = devices(&config.model)?;
    let m = load_model(&files, &devices[0], &config.model)?;
    Ok(format!(
        "`{}` from {} on {}: {} dimensions, {} tokens at most, fingerprint {}",
        files.name,
        files.dir.display(),
        devices[0].label,
        m.dimension(),
        m.tokenizer.max_len(),
        m.fingerprint()?
    ))
}
