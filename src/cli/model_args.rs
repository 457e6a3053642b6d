//! Flags shared by the commands that run the model.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ragline::embed::device::{self, SelectedDevice};
use ragline::embed::pool::{
    BatchPolicy, Embedder, EmbedderPool, DEFAULT_BATCH_TOKENS_CPU, DEFAULT_BATCH_TOKENS_GPU,
};
use ragline::embed::{DTypeChoice, DeviceChoice, EmbeddingModel, ModelFiles, DEFAULT_MODEL};

#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// The embedding model: a folder in the Hugging Face layout, or a hub id (downloaded
    /// through the Hugging Face cache; HF_HUB_OFFLINE=1 uses the cache only). A hub id is
    /// also looked for under ./models/ and $RAGLINE_MODELS, where scripts/fetch-model.sh
    /// puts it.
    #[arg(long, env = "RAGLINE_MODEL", default_value = DEFAULT_MODEL)]
    pub model: String,

    /// Where the model runs: auto (CUDA, then Metal, then the CPU), cpu, cuda, cuda:N,
    /// cuda:0,1 (one embedder per GPU) or metal.
    #[arg(long, env = "RAGLINE_DEVICE", default_value = "auto")]
    pub device: DeviceChoice,

    /// Number format of the model: auto (f32 on the CPU, f16 on a GPU), f32, f16, bf16.
    #[arg(long, default_value = "auto")]
    pub dtype: DTypeChoice,

    /// Padded tokens per forward pass [default: 2048 on the CPU, 32768 on a GPU].
    #[arg(long)]
    pub batch_tokens: Option<usize>,

    /// How long, in milliseconds, the first chunk of a batch waits for more to arrive.
    #[arg(long, default_value_t = 50)]
    pub max_wait_ms: u64,

    /// Text put before each query, overriding the model's own prompt ("query: " for E5).
    #[arg(long)]
    pub query_prompt: Option<String>,

    /// Text put before each passage, overriding the model's own prompt ("passage: " for E5).
    #[arg(long)]
    pub passage_prompt: Option<String>,
}

impl ModelArgs {
    pub fn files(&self) -> anyhow::Result<ModelFiles> {
        ModelFiles::resolve(&self.model).context("cannot find the model")
    }

    pub fn devices(&self) -> anyhow::Result<Vec<SelectedDevice>> {
        device::select(&self.device).context("cannot open the device")
    }

    pub fn batch_tokens(&self, device: &SelectedDevice) -> usize {
        self.batch_tokens.unwrap_or(if device.device.is_cpu() {
            DEFAULT_BATCH_TOKENS_CPU
        } else {
            DEFAULT_BATCH_TOKENS_GPU
        })
    }

    /// Load the model on one device, with the prompt overrides applied.
    pub fn load(
        &self,
        files: &ModelFiles,
        device: &SelectedDevice,
    ) -> anyhow::Result<EmbeddingModel> {
        let dtype = self.dtype.resolve(&device.device);
        let mut model = EmbeddingModel::load(files, &device.device, dtype)
            .with_context(|| format!("cannot load model `{}` on {}", files.name, device.label))?;
        model
            .tokenizer
            .set_prompts(self.query_prompt.as_deref(), self.passage_prompt.as_deref())?;
        Ok(model)
    }

    /// One embedder per device.
    pub fn pool(
        &self,
        files: &ModelFiles,
        devices: &[SelectedDevice],
    ) -> anyhow::Result<EmbedderPool> {
        let embedders = devices
            .iter()
            .map(|d| {
                Ok(Embedder {
                    model: self.load(files, d)?,
                    label: d.label.clone(),
                    policy: BatchPolicy {
                        batch_tokens: self.batch_tokens(d),
                        max_wait: Duration::from_millis(self.max_wait_ms),
                    },
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(EmbedderPool::new(embedders))
    }
}
