//! Setting up a remote embedder from the config (`[stages.embed.remote]`, `--embed-url`):
//! the endpoint, a probe that learns the dimension (and that the service answers at all),
//! the identity the index records, and the embedder pool that sends chunks to it.
//!
//! An index embedded by a service records the model as `API:MODEL` (`openai:text-embedding-
//! 3-small`, or `tei:URL` when TEI's model has no name in the config) and the URL as its
//! folder, so `ragline search` and `enrich` can reach the same service again.

use std::sync::Arc;
use std::time::Duration;

use super::config::RemoteEmbedConfig;
use super::{JobError, PipelineConfig};
use crate::embed::files::ModelFiles;
use crate::embed::pool::{BatchPolicy, Embedder, EmbedderPool};
use crate::embed::service::{tokenizer_fingerprint, RemoteEncoder};
use crate::embed::tokenizer::TextTokenizer;
use crate::http::embed::{EmbedApi, RemoteEmbedder};
use crate::http::Endpoint;
use crate::indexers::ModelIdentity;

/// The service's embedder, probed: its dimension is known when this returns.
pub fn remote_embedder(config: &RemoteEmbedConfig) -> Result<Arc<RemoteEmbedder>, JobError> {
    let endpoint = Endpoint::new(config.endpoint()?)?;
    let remote = Arc::new(RemoteEmbedder::new(endpoint, config.embed_settings()));
    let url = crate::secret::redact_url(config.url.as_deref().unwrap_or(""));
    let dimension = remote.probe().map_err(|e| {
        JobError::Setup(format!(
            "the embeddings service at {url} did not answer a probe: {e}; is it running, and \
             is --embed-api ({}) the API it speaks?",
            config.api.name()
        ))
    })?;
    tracing::info!(
        target: crate::NOTE,
        "embedding with {url} ({} API{}): {dimension} dimensions",
        config.api.name(),
        config
            .model
            .as_deref()
            .map(|m| format!(", model {m}"))
            .unwrap_or_default()
    );
    Ok(remote)
}

/// What the index records of a service's model. The URL is part of the fingerprint only
/// when no model name is (TEI serves one model without naming it): the same model behind
/// another address (a proxy, a load balancer) makes the same vectors.
pub fn remote_identity(
    config: &RemoteEmbedConfig,
    files: &ModelFiles,
    tokenizer: &TextTokenizer,
    dimension: usize,
) -> Result<ModelIdentity, JobError> {
    let mut h = blake3::Hasher::new();
    h.update(
        format!(
            "remote|{}|{}|{dimension}|{}",
            config.api.name(),
            config
                .model
                .as_deref()
                .unwrap_or(config.url.as_deref().unwrap_or("")),
            config.normalize
        )
        .as_bytes(),
    );
    Ok(ModelIdentity {
        name: config.model_name(),
        // The index keeps the address, never a password or key it may hold.
        dir: crate::secret::redact_url(config.url.as_deref().unwrap_or_default()),
        fingerprint: h.finalize().to_hex()[..16].to_string(),
        dimension,
        tokenizer: Some(tokenizer_fingerprint(files, tokenizer)?),
    })
}

/// One embedder thread sending windows of chunks to the service (which takes them in
/// requests within its limits, several at once).
pub fn remote_pool(
    remote: &Arc<RemoteEmbedder>,
    tokenizer: TextTokenizer,
    config: &PipelineConfig,
) -> EmbedderPool {
    let r = &config.stages.embed.remote;
    EmbedderPool::new(vec![Embedder {
        encoder: Box::new(RemoteEncoder::new(Arc::clone(remote), tokenizer)),
        label: crate::secret::redact_url(r.url.as_deref().unwrap_or_default()),
        policy: BatchPolicy {
            // Enough for every request slot to be busy.
            batch_tokens: r.max_tokens * r.concurrency.max(1),
            max_wait: Duration::from_millis(config.model.max_wait_ms),
        },
    }])
}

/// The remote settings an index built by a service names (`API:MODEL` and its URL), for a
/// command that was given none (`ragline search`, `enrich` on such an index).
pub fn config_of_index(model: &str, dir: &str) -> Option<RemoteEmbedConfig> {
    let (api, name) = model.split_once(':')?;
    let api: EmbedApi = api.parse().ok()?;
    if !(dir.starts_with("http://") || dir.starts_with("https://")) {
        return None;
    }
    Some(RemoteEmbedConfig {
        url: Some(dir.to_string()),
        api,
        model: (name != dir).then(|| name.to_string()),
        ..RemoteEmbedConfig::default()
    })
}

/// Tell the index's lifecycle when `endpoint`'s circuit opens and closes, as the state of
/// `stage` (`ragline status` shows it). The store is written from a thread of its own, never
/// from the endpoint's I/O runtime. Does nothing for an index without a lifecycle.
pub fn report_circuit(endpoint: &Endpoint, uri: &crate::indexers::IndexUri, stage: &str) {
    use crate::http::circuit::Change;
    if !uri.is_store() {
        return;
    }
    let (tx, rx) = crossbeam_channel::bounded::<Change>(64);
    let (uri, stage) = (uri.clone(), stage.to_string());
    let spawned = std::thread::Builder::new()
        .name("circuit".into())
        .spawn(move || {
            for change in rx {
                let open = match &change {
                    Change::Opened(reason) => Some(format!("{reason} (probing)")),
                    Change::Closed => None,
                };
                let written = crate::indexers::open_store(&uri)
                    .and_then(|mut s| s.set_circuit(&stage, open.as_deref()));
                if let Err(e) = written {
                    tracing::warn!("cannot record the circuit of `{stage}` in {uri}: {e}");
                }
            }
        });
    if spawned.is_ok() {
        endpoint.on_circuit(move |change| {
            let _ = tx.try_send(change.clone());
        });
    }
}

/// At the end of a run: if the circuit is closed, say so in the index (a close reported from
/// the endpoint's thread may not have been written yet when the run ends).
pub fn settle_circuit(endpoint: &Endpoint, uri: &crate::indexers::IndexUri, stage: &str) {
    use crate::http::circuit::CircuitState;
    if uri.is_store() && endpoint.circuit() == CircuitState::Closed {
        let _ = crate::indexers::open_store(uri).and_then(|mut s| s.set_circuit(stage, None));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_names_the_service_it_was_embedded_by() {
        let c = config_of_index("openai:all-MiniLM-L6-v2", "http://127.0.0.1:8080").unwrap();
        assert_eq!(c.api, EmbedApi::Openai);
        assert_eq!(c.model.as_deref(), Some("all-MiniLM-L6-v2"));
        assert_eq!(c.url.as_deref(), Some("http://127.0.0.1:8080"));
        let c = config_of_index("tei:http://h:80", "http://h:80").unwrap();
        assert_eq!((c.api, c.model), (EmbedApi::Tei, None));
        assert!(config_of_index("sentence-transformers/all-MiniLM-L6-v2", "/models/x").is_none());
        assert!(config_of_index("openai:x", "/models/x").is_none());
    }
}
