//! Flags that make the embed stage call a service instead of a model in this process
//! (`ingest`, `enrich`, `embed`). Each overrides `[stages.embed.remote]` of ragline.toml. The
//! API key is never a flag: it is read from the variable `--embed-api-key-env` (or
//! `api_key_env`) names, and no key is sent unless one is named.

use clap::Args;
use ragline::http::embed::EmbedApi;
use ragline::jobs::config::Parsed;
use ragline::jobs::PipelineConfig;

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

    /// The environment variable holding the service's API key (e.g. OPENAI_API_KEY), sent as
    /// a bearer token, only over https or to a loopback address. Without it no key is sent.
    #[arg(long, value_name = "VAR")]
    pub embed_api_key_env: Option<String>,
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
        if let Some(v) = &self.embed_api_key_env {
            r.api_key_env = Some(v.clone());
        }
        if r.url.is_none()
            && (self.embed_api.is_some()
                || self.embed_model.is_some()
                || self.embed_api_key_env.is_some())
        {
            anyhow::bail!(
                "--embed-api, --embed-model and --embed-api-key-env need --embed-url (the \
                 service's URL, from you: a key is never sent to a URL read from an index)"
            );
        }
        Ok(())
    }
}
