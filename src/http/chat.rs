//! Chat completions from an OpenAI-compatible `POST /v1/chat/completions` (OpenAI, vLLM,
//! Ollama, llama.cpp's server), for the LLM stages: one prompt in, the assistant's text out.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;

use super::{CallError, Endpoint};

/// How completions are asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatSettings {
    pub model: String,
    /// Instructions sent as the system message, if any.
    pub system: Option<String>,
    /// Tokens the answer may have, at most.
    pub max_answer_tokens: u32,
    pub temperature: f32,
}

pub struct ChatClient {
    endpoint: Arc<Endpoint>,
    settings: ChatSettings,
}

impl ChatClient {
    pub fn new(endpoint: Arc<Endpoint>, settings: ChatSettings) -> ChatClient {
        ChatClient { endpoint, settings }
    }

    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }

    /// The answer to `prompt`; `prompt_tokens` is its size for the limits (the answer's
    /// budget is added).
    pub fn complete(&self, prompt: &str, prompt_tokens: usize) -> Result<String, CallError> {
        self.endpoint
            .block_on(self.complete_async(prompt, prompt_tokens))
    }

    /// The answers to several prompts, asked at once (within the endpoint's bound on
    /// requests in flight and its limits), in order.
    pub fn complete_many(&self, prompts: &[(String, usize)]) -> Vec<Result<String, CallError>> {
        self.endpoint.block_on(futures::future::join_all(
            prompts.iter().map(|(p, t)| self.complete_async(p, *t)),
        ))
    }

    async fn complete_async(
        &self,
        prompt: &str,
        prompt_tokens: usize,
    ) -> Result<String, CallError> {
        let mut messages = Vec::new();
        if let Some(system) = &self.settings.system {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.push(json!({"role": "user", "content": prompt}));
        let body = json!({
            "model": self.settings.model,
            "messages": messages,
            "max_tokens": self.settings.max_answer_tokens,
            "temperature": self.settings.temperature,
        });
        let tokens = prompt_tokens as u64 + u64::from(self.settings.max_answer_tokens);
        self.endpoint
            .post("/v1/chat/completions", &body, tokens, parse)
            .await
    }
}

/// The assistant's text of an answer; an error is a malformed answer (retried).
pub fn parse(body: &[u8]) -> Result<String, super::Unanswered> {
    #[derive(Deserialize)]
    struct Message {
        content: Option<String>,
    }
    #[derive(Deserialize)]
    struct Choice {
        message: Message,
    }
    #[derive(Deserialize)]
    struct Answer {
        choices: Vec<Choice>,
    }
    let answer: Answer =
        serde_json::from_slice(body).map_err(|e| format!("not a chat completion: {e}"))?;
    answer
        .choices
        .into_iter()
        .next()
        .and_then(|c| c.message.content)
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| "a chat completion without text".into())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_first_choice_is_the_answer() {
        let body = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":" Hi. "}}]}"#;
        assert_eq!(super::parse(body).unwrap(), "Hi.");
        assert!(super::parse(br#"{"choices":[]}"#).is_err());
        assert!(super::parse(br#"{"choices":[{"message":{"content":null}}]}"#).is_err());
        assert!(super::parse(b"{").is_err());
    }
}
