//! An encoder that is a service: the chunks' texts go to an embeddings endpoint
//! ([`crate::http::embed`]) instead of through a model in this process. The local model's
//! tokenizer (`--model`) still sizes the chunks and counts the tokens the service's limits
//! are in; its weights are never loaded.

use std::sync::Arc;

use super::encoder::Encoder;
use super::files::ModelFiles;
use super::tokenizer::TextTokenizer;
use super::EmbedError;
use crate::http::embed::{Input, RemoteEmbedder};

/// The tokenizer of a model folder, without its weights: the length limit from
/// sentence-transformers' `max_seq_length` (or config.json's `max_position_embeddings`).
pub fn load_tokenizer(files: &ModelFiles) -> Result<TextTokenizer, EmbedError> {
    let raw = std::fs::read(&files.config).map_err(|e| EmbedError::ModelFile {
        path: files.config.clone(),
        reason: e.to_string(),
    })?;
    let config: serde_json::Value =
        serde_json::from_slice(&raw).map_err(|e| EmbedError::ModelFile {
            path: files.config.clone(),
            reason: format!("not JSON: {e}"),
        })?;
    let positions = config["max_position_embeddings"].as_u64().unwrap_or(512) as usize;
    let max_len = files.max_seq_length.unwrap_or(positions).min(positions);
    TextTokenizer::load(files, max_len)
}

/// A fingerprint of a tokenizer (the bytes of tokenizer.json, its length limit and passage
/// prompt), as [`super::EmbeddingModel::tokenizer_fingerprint`] computes it for a loaded
/// model: both agree for the same folder.
pub fn tokenizer_fingerprint(
    files: &ModelFiles,
    tokenizer: &TextTokenizer,
) -> Result<String, EmbedError> {
    let bytes = std::fs::read(&files.tokenizer).map_err(|e| EmbedError::ModelFile {
        path: files.tokenizer.clone(),
        reason: e.to_string(),
    })?;
    let mut h = blake3::Hasher::new();
    h.update(&bytes);
    h.update(
        format!(
            "|{}|{:?}",
            tokenizer.max_len(),
            tokenizer.passage_prompt_ids()
        )
        .as_bytes(),
    );
    Ok(h.finalize().to_hex()[..16].to_string())
}

/// Chunks embedded by a service.
pub struct RemoteEncoder {
    remote: Arc<RemoteEmbedder>,
    tokenizer: TextTokenizer,
}

impl RemoteEncoder {
    pub fn new(remote: Arc<RemoteEmbedder>, tokenizer: TextTokenizer) -> Self {
        RemoteEncoder { remote, tokenizer }
    }

    pub fn remote(&self) -> &Arc<RemoteEmbedder> {
        &self.remote
    }
}

impl Encoder for RemoteEncoder {
    fn max_content_len(&self) -> usize {
        self.tokenizer.max_content_len()
    }

    /// The service applies its model's prompts (if any) itself: none are sent.
    fn passage_prompt_ids(&self) -> &[u32] {
        &[]
    }

    /// In order, up to `budget` tokens a batch (a longer input alone): the service pads for
    /// itself, so sorting buys nothing here; the endpoint cuts batches further by its limits.
    fn plan_batches(&self, lengths: &[usize], budget: usize) -> Vec<Vec<usize>> {
        let mut batches = Vec::new();
        let mut batch = Vec::new();
        let mut tokens = 0;
        for (i, &n) in lengths.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if !batch.is_empty() && tokens + n > budget {
                batches.push(std::mem::take(&mut batch));
                tokens = 0;
            }
            batch.push(i);
            tokens += n;
        }
        if !batch.is_empty() {
            batches.push(batch);
        }
        batches
    }

    fn computed_tokens(&self, lengths: &[usize], batch: &[usize]) -> usize {
        batch.iter().map(|&i| lengths[i]).sum()
    }

    fn embed_ids(&self, _seqs: &[&[u32]], _prompt: &[u32]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Err(EmbedError::Unsupported(
            "a remote embedder embeds texts, not token ids: a bug".into(),
        ))
    }

    fn content_ids(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        self.tokenizer.content_ids(text)
    }

    fn embeds_text(&self) -> bool {
        true
    }

    fn embed_texts(
        &self,
        texts: &[&str],
        tokens: &[usize],
    ) -> Vec<Result<Vec<f32>, crate::http::Unanswered>> {
        let inputs: Vec<Input<'_>> = texts
            .iter()
            .zip(tokens)
            .map(|(&text, &tokens)| Input { text, tokens })
            .collect();
        self.remote.embed(&inputs)
    }
}
