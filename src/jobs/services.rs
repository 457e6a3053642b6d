//! The parts of `ragline.toml` that name services: a remote embedder for the embed stage
//! (`[stages.embed.remote]`) and LLM stages (`[stages.summary]`, `[[stages.llm]]`), how
//! they are checked (`ragline check`: the URL, the API key's variable, the limits), and the
//! endpoint settings they become.
//!
//! ```toml
//! [stages.embed.remote]
//! url = "http://127.0.0.1:8080"   # ragline serve, TEI, vLLM, OpenAI...
//! api = "openai"                  # POST /v1/embeddings; or "tei": POST /embed
//! model = "text-embedding-3-small"
//! api_key_env = "OPENAI_API_KEY"  # the variable holding the key (never the key itself); no
//!                                 # key is sent unless this names one, and only over https
//!                                 # or to a loopback address
//! max_inputs = 64                 # inputs per request
//! max_tokens = 8192               # tokens per request (counted with --model's tokenizer)
//! tpm = 1000000                   # tokens per minute, 0: no limit
//!
//! [stages.summary]
//! url = "http://127.0.0.1:8000"
//! model = "gpt-4o-mini"
//! keyword_index = true            # summaries are found by keyword search too
//!
//! [[stages.llm]]
//! name = "keywords"
//! url = "http://127.0.0.1:8000"
//! model = "gpt-4o-mini"
//! prompt = "Five keywords for this page, comma-separated:\n\n{text}"
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::config::human_duration;
use super::ConfigError;
use crate::http::chat::ChatSettings;
use crate::http::embed::{EmbedApi, EmbedSettings};
use crate::http::EndpointSettings;
use crate::lifecycle::{Priority, StageSettings};

/// The prompt of the `summary` stage. `{title}`, `{text}`, `{source}` and `{id}` are
/// replaced by the document's.
pub const DEFAULT_SUMMARY_PROMPT: &str = "Summarise the following document in two or three \
sentences, for a search result snippet. Answer with the summary only.\n\nTitle: \
{title}\n\n{text}";

/// The embed stage calling a service instead of a model in this process.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RemoteEmbedConfig {
    /// The service's base URL; unset: embed in this process (`--embed-url`). Shown (and
    /// written to a run's record) without any password or key it holds.
    #[serde(serialize_with = "redacted_url")]
    pub url: Option<String>,
    /// `openai` (POST /v1/embeddings) or `tei` (POST /embed) (`--embed-api`).
    pub api: EmbedApi,
    /// The model name sent to an OpenAI-compatible API (`--embed-model`).
    pub model: Option<String>,
    /// The environment variable holding the API key, sent as a bearer token (only over
    /// https or to a loopback address). Unset: no key is sent.
    pub api_key_env: Option<String>,
    /// Inputs per request, at most.
    pub max_inputs: usize,
    /// Tokens per request, at most (counted with `--model`'s tokenizer).
    pub max_tokens: usize,
    /// Requests in flight at once, at most.
    pub concurrency: usize,
    /// Requests per minute, at most (0: no limit).
    pub rpm: u64,
    /// Tokens per minute, at most (0: no limit).
    pub tpm: u64,
    /// How long one request may take.
    #[serde(with = "human_duration")]
    pub timeout: Duration,
    /// Attempts per request for retryable failures (429, 5xx, timeouts, resets, malformed
    /// answers) while the endpoint is up.
    pub retries: u32,
    /// L2-normalise the vectors received (what sentence-transformers models do).
    pub normalize: bool,
}

impl Default for RemoteEmbedConfig {
    fn default() -> Self {
        RemoteEmbedConfig {
            url: None,
            api: EmbedApi::Openai,
            model: None,
            api_key_env: None,
            max_inputs: 64,
            max_tokens: 8192,
            concurrency: 4,
            rpm: 0,
            tpm: 0,
            timeout: Duration::from_secs(60),
            retries: 10,
            normalize: true,
        }
    }
}

impl RemoteEmbedConfig {
    pub fn enabled(&self) -> bool {
        self.url.is_some()
    }

    pub fn endpoint(&self) -> Result<EndpointSettings, ConfigError> {
        endpoint(
            "stages.embed.remote",
            self.url.as_deref().unwrap_or(""),
            self.api_key_env.as_deref(),
            Limits {
                concurrency: self.concurrency,
                rpm: self.rpm,
                tpm: self.tpm,
                timeout: self.timeout,
                retries: self.retries,
            },
        )
    }

    pub fn embed_settings(&self) -> EmbedSettings {
        EmbedSettings {
            api: self.api,
            model: self.model.clone(),
            max_inputs: self.max_inputs,
            max_tokens: self.max_tokens,
            normalize: self.normalize,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled() {
            return Ok(());
        }
        self.endpoint()?;
        if self.max_inputs == 0 || self.max_tokens == 0 {
            return Err(ConfigError::Value(
                "stages.embed.remote.max_inputs and max_tokens must be at least 1".into(),
            ));
        }
        if self.api == EmbedApi::Openai && self.model.is_none() {
            return Err(ConfigError::Value(
                "stages.embed.remote.model (--embed-model) is needed with the openai API: the \
                 name of the model the service embeds with"
                    .into(),
            ));
        }
        Ok(())
    }

    /// What the index records as the model: the service and the model it names (or its
    /// address, without secrets).
    pub fn model_name(&self) -> String {
        match &self.model {
            Some(m) => format!("{}:{m}", self.api.name()),
            None => format!(
                "{}:{}",
                self.api.name(),
                crate::secret::redact_url(self.url.as_deref().unwrap_or(""))
            ),
        }
    }
}

/// An LLM stage: a prompt per document to an OpenAI-compatible chat endpoint, its answer kept
/// in the document's metadata under the stage's name.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LlmStageConfig {
    /// The stage's name: its row in `ragline status`, the metadata key of its answer
    /// (`summary` for `[stages.summary]`).
    pub name: String,
    /// The chat endpoint's base URL (POST /v1/chat/completions); unset: the stage is off.
    /// Shown without any password or key it holds.
    #[serde(serialize_with = "redacted_url")]
    pub url: Option<String>,
    /// The model name sent.
    pub model: String,
    /// The environment variable holding the API key (only over https or to a loopback
    /// address). Unset: no key is sent.
    pub api_key_env: Option<String>,
    /// The user message; `{title}`, `{text}`, `{source}` and `{id}` are the document's.
    pub prompt: String,
    /// A system message, if any.
    pub system: Option<String>,
    /// The document's text is cut to about this many tokens before it goes in the prompt.
    pub max_input_tokens: usize,
    /// Tokens an answer may have.
    pub max_answer_tokens: u32,
    /// Put the answer in the keyword index too (it is always in the metadata and shown by
    /// `ragline search`).
    pub keyword_index: bool,
    /// Requests in flight at once, at most.
    pub concurrency: usize,
    /// Requests per minute, at most (0: no limit).
    pub rpm: u64,
    /// Tokens per minute (prompt + answer budget), at most (0: no limit).
    pub tpm: u64,
    /// How long one request may take.
    #[serde(with = "human_duration")]
    pub timeout: Duration,
    /// Attempts per request for retryable failures while the endpoint is up.
    pub retries: u32,
    /// Attempts (each with its request's retries) before a document is dead-lettered.
    pub retry_limit: u32,
    /// Wait before the first retry of a document ("2s"); doubled each attempt, with jitter.
    #[serde(with = "human_duration")]
    pub backoff: Duration,
    #[serde(with = "human_duration")]
    pub max_backoff: Duration,
    /// The priority its work is queued at.
    pub priority: Priority,
    /// Stages whose output it waits for (beyond `chunk`) and may use in its prompt
    /// (`{entities}`, `{labels}`, `{summary}`...): `["entities"]`.
    pub depends_on: Vec<String>,
}

impl Default for LlmStageConfig {
    fn default() -> Self {
        LlmStageConfig {
            name: "summary".into(),
            url: None,
            model: String::new(),
            api_key_env: None,
            prompt: DEFAULT_SUMMARY_PROMPT.into(),
            system: None,
            max_input_tokens: 3000,
            max_answer_tokens: 200,
            keyword_index: true,
            concurrency: 4,
            rpm: 0,
            tpm: 0,
            timeout: Duration::from_secs(120),
            retries: 6,
            retry_limit: 5,
            backoff: Duration::from_secs(2),
            max_backoff: Duration::from_secs(300),
            priority: Priority::Fresh,
            depends_on: Vec::new(),
        }
    }
}

/// The `{name}` slots of a prompt.
pub fn prompt_slots(prompt: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = prompt;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        match after.find('}') {
            Some(close) => {
                let name = &after[..close];
                if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    out.push(name);
                }
                rest = &after[close + 1..];
            }
            None => break,
        }
    }
    out
}

impl LlmStageConfig {
    pub fn enabled(&self) -> bool {
        self.url.is_some()
    }

    fn key(&self) -> String {
        format!("stages.{}", self.name)
    }

    pub fn endpoint(&self) -> Result<EndpointSettings, ConfigError> {
        endpoint(
            &self.key(),
            self.url.as_deref().unwrap_or(""),
            self.api_key_env.as_deref(),
            Limits {
                concurrency: self.concurrency,
                rpm: self.rpm,
                tpm: self.tpm,
                timeout: self.timeout,
                retries: self.retries,
            },
        )
    }

    pub fn chat_settings(&self) -> ChatSettings {
        ChatSettings {
            model: self.model.clone(),
            system: self.system.clone(),
            max_answer_tokens: self.max_answer_tokens,
            temperature: 0.0,
        }
    }

    pub fn settings(&self) -> StageSettings {
        StageSettings {
            retry_limit: self.retry_limit,
            backoff: self.backoff,
            max_backoff: self.max_backoff,
            visibility_timeout: self.timeout * 2 + Duration::from_secs(60),
            concurrency: self.concurrency,
            priority: self.priority,
        }
    }

    /// What changes the stage's answers: when it changes, every document's answer is stale.
    pub fn fingerprint(&self) -> String {
        let mut h = blake3::Hasher::new();
        h.update(
            format!(
                "{}|{}|{}|{:?}|{}|{}",
                self.name,
                self.model,
                self.prompt,
                self.system,
                self.max_input_tokens,
                self.max_answer_tokens
            )
            .as_bytes(),
        );
        h.finalize().to_hex()[..16].to_string()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let key = self.key();
        if !crate::lifecycle::is_stage_name(&self.name) {
            return Err(ConfigError::Value(format!(
                "{key}: a stage name is lowercase letters, digits and _ (not chunk or embed): \
                 `{}`",
                self.name
            )));
        }
        if !self.enabled() {
            return Ok(());
        }
        self.endpoint()?;
        if self.model.is_empty() {
            return Err(ConfigError::Value(format!(
                "{key}.model is needed: the chat model's name"
            )));
        }
        let uses = |slot: &str| self.prompt.contains(&format!("{{{slot}}}"));
        if !uses("text") && !uses("title") && !self.depends_on.iter().any(|d| uses(d)) {
            return Err(ConfigError::Value(format!(
                "{key}.prompt uses neither {{text}} nor {{title}} nor a stage it depends on: \
                 every document would get the same answer"
            )));
        }
        if self.retry_limit == 0 || self.max_input_tokens == 0 || self.max_answer_tokens == 0 {
            return Err(ConfigError::Value(format!(
                "{key}: retry_limit, max_input_tokens and max_answer_tokens must be at least 1"
            )));
        }
        Ok(())
    }
}

/// A URL as settings show it: without its secrets.
fn redacted_url<S: serde::Serializer>(url: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match url {
        Some(u) => s.serialize_some(&crate::secret::redact_url(u)),
        None => s.serialize_none(),
    }
}

struct Limits {
    concurrency: usize,
    rpm: u64,
    tpm: u64,
    timeout: Duration,
    retries: u32,
}

/// Endpoint settings from a config section: the URL checked, the key read from the variable
/// the section names (none unless it names one).
fn endpoint(
    key: &str,
    url: &str,
    key_env: Option<&str>,
    l: Limits,
) -> Result<EndpointSettings, ConfigError> {
    let bad = |m: String| Err(ConfigError::Value(m));
    let shown = crate::secret::redact_url(url);
    if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 10 {
        return bad(format!(
            "{key}.url = `{shown}` is not an http:// or https:// URL (e.g. \
             http://127.0.0.1:8080)"
        ));
    }
    if reqwest::Url::parse(url).is_err() {
        return bad(format!("{key}.url = `{shown}` does not parse as a URL"));
    }
    let api_key = match key_env {
        None => None,
        Some(var) => match std::env::var(var) {
            Ok(k) if !k.is_empty() => Some(crate::secret::Secret::new(k)),
            _ => {
                return bad(format!(
                    "{key}: the API key variable `{var}` (api_key_env) is not set; export it, \
                     or leave api_key_env out to send no key"
                ))
            }
        },
    };
    if let Err(e) = crate::http::check_key_transport(url, api_key.is_some()) {
        return bad(format!(
            "{key}: {e} (the key is in `{}`)",
            key_env.unwrap_or("")
        ));
    }
    if l.concurrency == 0 || l.retries == 0 {
        return bad(format!("{key}: concurrency and retries must be at least 1"));
    }
    if l.timeout < Duration::from_millis(100) {
        return bad(format!("{key}.timeout is too short: use at least 100ms"));
    }
    Ok(EndpointSettings {
        url: url.trim_end_matches('/').to_string(),
        api_key,
        timeout: l.timeout,
        retries: l.retries,
        concurrency: l.concurrency,
        rpm: (l.rpm > 0).then_some(l.rpm),
        tpm: (l.tpm > 0).then_some(l.tpm),
        ..EndpointSettings::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_sections_are_checked_with_their_key() {
        let mut r = RemoteEmbedConfig {
            url: Some("ftp://x".into()),
            ..Default::default()
        };
        let e = r.validate().unwrap_err().to_string();
        assert!(e.contains("stages.embed.remote.url"), "{e}");
        r.url = Some("http://127.0.0.1:8080/".into());
        let e = r.validate().unwrap_err().to_string();
        assert!(e.contains("--embed-model"), "{e}");
        r.api = EmbedApi::Tei;
        r.validate().unwrap();
        assert_eq!(r.endpoint().unwrap().url, "http://127.0.0.1:8080");
        r.url = Some("https://api.example.com".into());
        r.validate().unwrap();
        assert_eq!(
            r.endpoint().unwrap().api_key,
            None,
            "no key unless one is named"
        );
        r.api_key_env = Some("RAGLINE_TEST_SURELY_UNSET_KEY".into());
        let e = r.validate().unwrap_err().to_string();
        assert!(e.contains("RAGLINE_TEST_SURELY_UNSET_KEY"), "{e}");
        // A key never goes over plain http to another machine.
        r.api_key_env = Some("PATH".into());
        r.url = Some("http://embeddings.example.com".into());
        let e = r.validate().unwrap_err().to_string();
        assert!(e.contains("refusing to send an API key"), "{e}");
        r.url = Some("http://127.0.0.1:8080".into());
        assert!(r.endpoint().unwrap().api_key.is_some());

        let mut l = LlmStageConfig {
            url: Some("http://127.0.0.1:8000".into()),
            ..Default::default()
        };
        let e = l.validate().unwrap_err().to_string();
        assert!(e.contains("stages.summary.model"), "{e}");
        l.model = "m".into();
        l.validate().unwrap();
        l.prompt = "Say hi".into();
        assert!(l.validate().unwrap_err().to_string().contains("{text}"));
        l.prompt = DEFAULT_SUMMARY_PROMPT.into();
        l.name = "Embed!".into();
        assert!(l.validate().unwrap_err().to_string().contains("stage name"));
        // The fingerprint follows what changes answers.
        let a = LlmStageConfig::default();
        let mut b = a.clone();
        assert_eq!(a.fingerprint(), b.fingerprint());
        b.prompt.push('!');
        assert_ne!(a.fingerprint(), b.fingerprint());
    }
}
