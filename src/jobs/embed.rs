//! What `ragline embed` runs: texts in, vectors out, from the model in this process (dense,
//! with the prompt asked for), a sparse (SPLADE) model, or an embeddings service. The CLI
//! reads the input and writes the output; this computes the vectors.

use std::sync::Arc;

use rayon::prelude::*;

use super::config::{ConfigError, ModelConfig};
use super::{JobError, PipelineConfig};
use crate::embed::splade::{SparseModel, SparseVector};
use crate::embed::texts::embed_texts;
use crate::embed::tokenizer::TextTokenizer;
use crate::embed::EmbeddingModel;
use crate::http::embed::{estimate_tokens, Input, RemoteEmbedder};
use crate::http::Unanswered;

/// Which prompt goes before each text (`ragline embed --prompt`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Prompt {
    /// No prompt.
    None,
    /// The model's query prompt (or --query-prompt): sentence-transformers' `encode_query`.
    Query,
    /// The model's document prompt (or --document-prompt): `encode_document`.
    #[value(alias = "passage")]
    Document,
}

/// What `ragline embed` asks of its engine.
#[derive(Clone, Debug, Default)]
pub struct EmbedRequest {
    /// The model is a sparse (SPLADE) model.
    pub sparse: bool,
    /// Which prompt goes before each text (none given: the model's default prompt, as
    /// sentence-transformers' `encode`).
    pub prompt: Option<Prompt>,
    /// The model's prompt of this name.
    pub prompt_name: Option<String>,
}

/// A text's vector, or why it has none.
pub type Vector = Result<Output, Unanswered>;

/// A text's vector: dense, or the non-zero entries of a sparse one.
pub enum Output {
    Dense(Vec<f32>),
    Sparse(SparseVector),
}

/// What computes the vectors: the model here, or a service.
pub enum Engine {
    Local {
        model: Box<EmbeddingModel>,
        prompt: Vec<u32>,
        batch_tokens: usize,
    },
    Remote {
        remote: Arc<RemoteEmbedder>,
        tokenizer: Box<TextTokenizer>,
    },
    Sparse {
        model: Box<SparseModel>,
        batch_tokens: usize,
    },
}

impl Engine {
    pub fn dimension(&self) -> usize {
        match self {
            Engine::Local { model, .. } => model.dimension(),
            Engine::Remote { remote, .. } => remote.dimension().unwrap_or(0),
            Engine::Sparse { model, .. } => model.dimension(),
        }
    }

    /// One result per text, and the tokens embedded.
    pub fn embed(&self, texts: &[&str]) -> Result<(Vec<Vector>, usize), JobError> {
        match self {
            Engine::Local {
                model,
                prompt,
                batch_tokens,
            } => {
                let mut vectors = Vec::with_capacity(texts.len());
                let stats = embed_texts(model, texts, prompt, *batch_tokens, |_, v| {
                    vectors.push(Ok(Output::Dense(v)));
                    Ok(())
                })?;
                Ok((vectors, stats.tokens))
            }
            Engine::Sparse {
                model,
                batch_tokens,
            } => {
                let ids: Vec<Vec<u32>> = texts
                    .par_iter()
                    .map(|t| model.tokenizer.ids_for_embedding(t, &[]))
                    .collect::<Result<_, _>>()?;
                let specials = model.tokenizer.max_len() - model.tokenizer.max_content_len();
                let lengths: Vec<usize> = ids.iter().map(|i| i.len() + specials).collect();
                let mut vectors: Vec<Vector> = texts
                    .iter()
                    .map(|_| Err(Unanswered("not embedded: a bug".into())))
                    .collect();
                for batch in ragline::embed::batch::plan_unpadded(&lengths, *batch_tokens) {
                    let seqs: Vec<&[u32]> = batch.iter().map(|&i| ids[i].as_slice()).collect();
                    let out = model.embed_ids(&seqs)?;
                    for (&i, v) in batch.iter().zip(out) {
                        vectors[i] = Ok(Output::Sparse(v));
                    }
                }
                Ok((vectors, lengths.iter().sum()))
            }
            Engine::Remote { remote, tokenizer } => {
                let room = tokenizer.max_content_len();
                let sizes: Vec<usize> = texts
                    .par_iter()
                    .map(|t| {
                        tokenizer
                            .ids_for_embedding(t, &[])
                            .map_or_else(|_| estimate_tokens(t), |ids| ids.len().min(room) + 2)
                    })
                    .collect();
                let inputs: Vec<Input<'_>> = texts
                    .iter()
                    .zip(&sizes)
                    .map(|(&text, &tokens)| Input { text, tokens })
                    .collect();
                let vectors = remote
                    .embed(&inputs)
                    .into_iter()
                    .map(|v| v.map(Output::Dense))
                    .collect();
                Ok((vectors, sizes.iter().sum()))
            }
        }
    }
}

impl Engine {
    /// The engine `request` asks for: the sparse model, the service the config names, or the
    /// model on its first device with the prompt asked for (the model's default prompt, as
    /// sentence-transformers' `encode`, when none is). Where it runs is said in the log.
    pub fn new(
        request: &EmbedRequest,
        config: &PipelineConfig,
        model_config: &ModelConfig,
    ) -> Result<Engine, JobError> {
        if request.sparse {
            return Self::sparse(model_config);
        }
        if config.stages.embed.remote.enabled() {
            if request.prompt.is_some_and(|p| p != Prompt::None) || request.prompt_name.is_some() {
                return Err(ConfigError::Value(
                    "--prompt with a remote embedder: the service applies its model's prompts \
                     itself; leave --prompt out"
                        .into(),
                )
                .into());
            }
            config.validate()?;
            let files = super::model_files(&model_config.name)?;
            return Ok(Engine::Remote {
                remote: super::service_embedder::remote_embedder(&config.stages.embed.remote)?,
                tokenizer: Box::new(crate::embed::service::load_tokenizer(&files)?),
            });
        }
        let files = super::model_files(&model_config.name)?;
        let devices = super::devices(model_config)?;
        let device = &devices[0];
        let model = super::load_model(&files, device, model_config)?;
        super::model::note_devices(std::slice::from_ref(device));
        super::model::note_encoder(&model);
        let batch_tokens = super::batch_tokens(model_config, device);
        let prompt = prompt_ids(&model, request)?;
        Ok(Engine::Local {
            model: Box::new(model),
            prompt,
            batch_tokens,
        })
    }

    fn sparse(model_config: &ModelConfig) -> Result<Engine, JobError> {
        let devices = super::devices(model_config)?;
        let device = &devices[0];
        let model = SparseModel::load(&model_config.name, &device.device, model_config.dtype.value)
            .map_err(|e| {
                JobError::Model(format!(
                    "cannot load the sparse model `{}`: {e}",
                    model_config.name
                ))
            })?;
        super::model::note_devices(std::slice::from_ref(device));
        tracing::info!(target: crate::NOTE, "encoder: {} (sparse)", model.encoder_kind());
        Ok(Engine::Sparse {
            model: Box::new(model),
            batch_tokens: super::batch_tokens(model_config, device),
        })
    }
}

/// The ids of the prompt `request` asks for: a prompt by name, else the query or document
/// prompt, else the model's default prompt when no prompt is asked for at all.
fn prompt_ids(model: &EmbeddingModel, request: &EmbedRequest) -> Result<Vec<u32>, JobError> {
    let named = request.prompt_name.clone().or_else(|| {
        request
            .prompt
            .is_none()
            .then(|| model.files.default_prompt_name.clone())?
    });
    Ok(match (request.prompt, named) {
        (_, Some(name)) => model.tokenizer.prompt_ids(model.files.prompt(&name)?)?,
        (None | Some(Prompt::None), None) => Vec::new(),
        (Some(Prompt::Query), None) => model.tokenizer.query_prompt_ids().to_vec(),
        (Some(Prompt::Document), None) => model.tokenizer.passage_prompt_ids().to_vec(),
    })
}
