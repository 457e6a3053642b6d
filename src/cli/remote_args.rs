//! Flags that make the embed stage call a service instead of a model in this process
//! (`ingest`, `enrich`, `embed`). Each overrides `[stages.embed.remote]` of ragline.toml. The
//! API key is never a flag: it is read from the variable `api_key_env` names
//! (OPENAI_API_KEY by default).

use clap::Args;
use ragline::pipeline::config::Parsed;
use ragline::pipeline::PipelineConfig;
use ragline::remote::embed::EmbedApi;

#[derive(Args, Clone, Debug, Default)]
pub struct RemoteArgs {
    /// Embed with a service at this base URL instead of in this process: an OpenAI-compatible
    /// server (OpenAI, vLLM, Infinity, Ollama, `ragline serve`) or Hugging Face TEI. --model
    /// still names the tokenizer that sizes the chunks; its weights are not loaded.
    #[arg(long, env = "RAGLINE_EMBED_URL", value_name = "URL")]
    pub embed_url: Option<String>,

    /// The service's API: openai (POST /v1/embeddings) or tei (POST /embed). [default: openai]
    #[arg(long, value_parser = Parsed::<EmbedApi>::parse, value_name = "API")]
    pub embed_api: Option<Parsed<EmbedApi>>,

    /// The model name sent to an OpenAI-compatible service (needed there; TEI ignores it).
    #[arg(long, value_name = "NAME")]
    pub embed_model: Option<String>,
}

impl RemoteArgs {
    /// The flags given, over `config`.
    pub fn apply(&self, config: &mut PipelineConfig) -> anyhow::Result<()> {
        let r = &mut config.stages.embed.remote;
        if let Some(url) = &self.embed_url {
            r.url = Some(url.clone());
        }
        if let Some(api) = &self.embed_api {
            r.api = api.value;
        }
        if let Some(m) = &self.embed_model {
            r.model = Some(m.clone());
        }
        if r.url.is_none() && (self.embed_api.is_some() || self.embed_model.is_some()) {
            anyhow::bail!("--embed-api and --embed-model need --embed-url (the service's URL)");
        }
        Ok(())
    }
}
