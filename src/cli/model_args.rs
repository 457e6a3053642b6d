//! Flags shared by the commands that run the model. Each overrides the `[model]` section of
//! ragline.toml when given.

use clap::Args;
use ragline::embed::device::SelectedDevice;
use ragline::embed::{DTypeChoice, DeviceChoice, EmbeddingModel, ModelFiles};
use ragline::jobs::config::{ModelConfig, Parsed};
use ragline::jobs::{self, PipelineConfig};

#[derive(Args, Clone, Debug, Default)]
pub struct ModelArgs {
    /// The embedding model: a folder in the Hugging Face layout, or a hub id (downloaded
    /// through the Hugging Face cache; HF_HUB_OFFLINE=1 uses the cache only). A hub id is
    /// also looked for under ./models/ and $RAGLINE_MODELS, where scripts/fetch-model.sh
    /// puts it. [default: sentence-transformers/all-MiniLM-L6-v2]
    #[arg(long, env = "RAGLINE_MODEL")]
    pub model: Option<String>,

    /// Where the model runs: auto (CUDA, then Metal, then the CPU), cpu, cuda, cuda:N,
    /// cuda:0,1 (one embedder per GPU) or metal. [default: auto]
    #[arg(long, env = "RAGLINE_DEVICE", value_parser = Parsed::<DeviceChoice>::parse)]
    pub device: Option<Parsed<DeviceChoice>>,

    /// Number format of the model: auto (f32 on the CPU, f16 on a GPU), f32, f16, bf16, int8.
    /// On the CPU, bf16 needs AVX512-BF16 and int8 AVX512-VNNI (and the avx512 kernels);
    /// both are opt-in, lossy, and measured in BENCHMARKS.md.
    #[arg(long, value_parser = Parsed::<DTypeChoice>::parse)]
    pub dtype: Option<Parsed<DTypeChoice>>,

    /// Padded tokens per forward pass [default: 2048 on the CPU, 32768 on a GPU].
    #[arg(long)]
    pub batch_tokens: Option<usize>,

    /// How long, in milliseconds, the first chunk of a batch waits for more to arrive.
    /// [default: 50]
    #[arg(long)]
    pub max_wait_ms: Option<u64>,

    /// Text put before each query, overriding the model's own prompt ("query: " for E5); ""
    /// for none.
    #[arg(long)]
    pub query_prompt: Option<String>,

    /// Text put before each document (passage), overriding the model's own prompt
    /// ("passage: " for E5); "" for none.
    #[arg(long, visible_alias = "passage-prompt")]
    pub document_prompt: Option<String>,

    /// Cut vectors to their first N dimensions, re-normalised (Matryoshka models); at most
    /// the model's dimension. Recorded in the index's vector set.
    #[arg(long)]
    pub dimensions: Option<usize>,
}

impl ModelArgs {
    /// The flags given, over `config`.
    pub fn apply(&self, config: &mut ModelConfig) {
        if let Some(m) = &self.model {
            config.name = m.clone();
        }
        if let Some(d) = &self.device {
            config.device = d.clone();
        }
        if let Some(d) = &self.dtype {
            config.dtype = d.clone();
        }
        if self.batch_tokens.is_some() {
            config.batch_tokens = self.batch_tokens;
        }
        if let Some(w) = self.max_wait_ms {
            config.max_wait_ms = w;
        }
        if self.query_prompt.is_some() {
            config.query_prompt = self.query_prompt.clone();
        }
        if self.document_prompt.is_some() {
            config.passage_prompt = self.document_prompt.clone();
        }
        if self.dimensions.is_some() {
            config.dimensions = self.dimensions;
        }
    }

    /// The model settings: ragline.toml's `[model]` with these flags over it.
    pub fn resolve(&self, config: &PipelineConfig) -> ModelConfig {
        let mut m = config.model.clone();
        self.apply(&mut m);
        m
    }
}

/// The model's files, devices, and the model loaded on the first device.
pub fn load_first(
    config: &ModelConfig,
) -> anyhow::Result<(ModelFiles, Vec<SelectedDevice>, EmbeddingModel)> {
    let files = jobs::model_files(&config.name)?;
    let devices = jobs::devices(config)?;
    let model = jobs::load_model(&files, &devices[0], config)?;
    Ok((files, devices, model))
}
