//! `ragline serve`: the embedder pool as an HTTP server.
//!
//! - `POST /v1/embeddings`: OpenAI's embeddings API (`input` a string or a list of strings,
//!   `encoding_format` float or base64, `dimensions` cuts and re-normalises, `prompt_name` picks a model prompt);
//! - `POST /embed`: TEI's (`inputs` a string or a list, `truncate`, `normalize`);
//! - `GET /health`, `GET /metrics` (Prometheus).
//!
//! Requests are tokenized off the I/O runtime (on a pool of the server's own, where a panic
//! fails that request only), then queued for the model threads, which batch inputs *across*
//! requests by a token budget ([`batcher`]). Bounded everywhere: connections
//! (`max_connections`), requests in flight (`max_concurrent_requests`, 503 past it), a
//! request's headers (read within `header_timeout`), its body (`max_body_bytes`, counted as it
//! is parsed: inputs past `max_inputs` stop the parse), its whole life (`request_timeout`,
//! 408), and the queue (`max_queued_tokens` tokens; 503 with `Retry-After` rather than more
//! memory). Inputs over the model's limit are truncated (as sentence-transformers does) or
//! refused with 413, as configured. A malformed body is a 400 that says what is wrong; a body
//! that is not `application/json` a 415 (a web page cannot post work without a CORS
//! preflight, which only `cors_origin` answers). With an API key every route but `/health`
//! needs `Authorization: Bearer KEY` (401 otherwise; compared in constant time). A model
//! thread that panics fails its window's requests and goes on; if none is left, queued
//! requests fail and `/health` says so. SIGTERM or SIGINT: stop accepting, answer every
//! request in flight, then exit.

pub mod auth;
pub mod batcher;
mod error;
mod facets;
mod guard;
mod handlers;
pub mod metrics;
pub mod pages;
mod predict;
mod request;
mod server;
pub mod tasks;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::embed::encoder::Encoder;
use crate::embed::tokenizer::TextTokenizer;
use crate::secret::Secret;
use batcher::{Admission, Batcher, Job, WindowReport};
use error::ApiError;
use guard::guard;
use handlers::{embed, health, metrics_text, observed, openai_embeddings, tei_embed};
use metrics::{EndpointLabels, ServeMetrics};
pub use predict::fuzz_bodies as fuzz_classifier_bodies;
pub use request::fuzz_request;
use request::{parse_request, TextsSeed};
pub use server::serve;
pub use tasks::TaskModels;

/// What to do with an input longer than the model's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LongInputs {
    /// Keep its first tokens (sentence-transformers' behaviour, and `ragline embed`'s).
    Truncate,
    /// Answer 413 naming the input.
    Refuse,
}

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub addr: SocketAddr,
    /// The model's name in answers (`model` of OpenAI's API).
    pub model_name: String,
    pub long_inputs: LongInputs,
    /// Inputs per request, at most.
    pub max_inputs: usize,
    /// Bytes per request body, at most.
    pub max_body_bytes: usize,
    /// Tokens waiting for the model, at most; past it requests get 503.
    pub max_queued_tokens: usize,
    /// Padded tokens per forward pass.
    pub batch_tokens: usize,
    /// How long a request waits for others to share its forward pass.
    pub max_wait: Duration,
    /// Ids put before every input (the model's passage or query prompt, or none).
    pub prompt: Vec<u32>,
    /// The model's prompts by name (sentence-transformers' names: `query`, `document`, ...),
    /// for a request's `prompt_name`.
    pub prompts: std::collections::BTreeMap<String, Vec<u32>>,
    /// The model normalises its vectors (TEI's `normalize: false` cannot be honoured then).
    pub normalized: bool,
    /// Every route but `/health` needs `Authorization: Bearer <this>`.
    pub api_key: Option<Secret>,
    /// Requests being answered at once, at most; past it 503 with Retry-After.
    pub max_concurrent_requests: usize,
    /// Open connections, at most; past it new ones are closed at once.
    pub max_connections: usize,
    /// The origin whose pages may call the API (CORS); none: no page may.
    pub cors_origin: Option<String>,
    /// How long a client may take to send its request headers.
    pub header_timeout: Duration,
    /// How long one request may take, its body included (408 past it).
    pub request_timeout: Duration,
    /// The index searched by `/v1/search` and shown by `/` and `/status` (`--index`).
    pub index: Option<Arc<pages::SearchSetup>>,
    /// Host names answered besides loopback ones and the address served on
    /// (`--allowed-host`); a request naming another gets 421 (DNS rebinding).
    pub allowed_hosts: Vec<String>,
}

impl ServeOptions {
    /// The defaults of the limits, for callers that set the rest.
    pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 128;
    pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
    pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
}

/// One model thread's encoder.
pub struct ModelThread {
    pub encoder: Box<dyn Encoder + Sync>,
    pub label: String,
}

struct App {
    tokenizer: TextTokenizer,
    dimension: usize,
    batcher: Arc<Batcher>,
    metrics: ServeMetrics,
    options: ServeOptions,
    stopping: AtomicBool,
    /// Requests being answered (the embedding routes).
    requests: Arc<tokio::sync::Semaphore>,
    /// Tokenization, off the I/O runtime; a panic in it fails one request.
    tokenize_pool: rayon::ThreadPool,
    /// The index, when the server searches one.
    search: Option<Arc<pages::SearchService>>,
    /// The task models' queues (reranker, sparse model, classifiers), when the server runs
    /// them, and the models.
    tasks: tasks::TaskQueues,
    models: tasks::SharedModels,
    /// The Host names and addresses answered.
    hosts: auth::HostPolicy,
    /// Browser sessions opened by the login page.
    sessions: auth::Sessions,
    /// Wrong keys tried at the login page.
    logins: auth::LoginThrottle,
}

/// Why the server could not start. Once it serves, a request's failure is that request's
/// answer, never the server's end.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A setting that cannot work: the message names the flag and the fix.
    #[error("{0}")]
    Setting(String),
    /// A thread or the runtime could not start (the process is out of threads or memory).
    #[error("cannot start {what}: {reason}")]
    Start { what: String, reason: String },
    /// The address cannot be listened on (in use, not this machine's, a port below 1024).
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

impl ServeError {
    fn start(what: impl Into<String>, reason: impl std::fmt::Display) -> ServeError {
        ServeError::Start {
            what: what.into(),
            reason: reason.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::guard::{authorized, is_json};
    use super::*;

    #[test]
    fn inputs_are_a_string_or_a_list_of_strings_counted_as_they_are_read() {
        let texts = |body: &str, max| parse_request(body.as_bytes(), "input", max).map(|r| r.texts);
        assert_eq!(texts(r#"{"input": "a"}"#, 10).unwrap(), ["a"]);
        assert_eq!(
            texts(
                r#"{"model": "m", "input": ["a", "b"], "user": {"x": [1]}}"#,
                10
            )
            .unwrap(),
            ["a", "b"]
        );
        for (body, says) in [
            (r#"{"model": "m"}"#, "`input` is missing"),
            (r#"{"input": null}"#, "`input` is missing"),
            (r#"{"input": []}"#, "empty list"),
            (r#"{"input": 3}"#, "not a number"),
            (r#"{"input": ["a", 3]}"#, "`input[1]` must be a string"),
            (r#"{"input": [[101, 102]]}"#, "token-id inputs"),
            (r#"{"input": ["a", "b", "c"]}"#, "more than 2 inputs"),
            (r#"{"input": "a"} trailing"#, "not valid"),
            ("[1]", "not valid"),
        ] {
            let e = texts(body, 2).unwrap_err();
            assert!(e.message.contains(says), "{body}: {}", e.message);
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
        // A list far over the limit stops at the first input past it: a body of a million
        // inputs is refused having held two.
        let huge = format!(r#"{{"input": [{}"a"]}}"#, r#""a","#.repeat(1_000_000));
        let e = texts(&huge, 2).unwrap_err();
        assert!(e.message.contains("more than 2 inputs"), "{}", e.message);
        let r = parse_request(
            br#"{"inputs": ["x"], "truncate": true, "normalize": false}"#,
            "inputs",
            4,
        )
        .unwrap();
        assert_eq!((r.truncate, r.normalize), (Some(true), Some(false)));
    }

    #[test]
    fn the_key_is_a_bearer_token_and_bodies_are_json() {
        let key = Secret::new("k3y");
        let sessions = auth::Sessions::default();
        let mut h = axum::http::HeaderMap::new();
        assert!(!authorized(&sessions, &h, &key));
        h.insert(header::AUTHORIZATION, "Bearer k3y".parse().unwrap());
        assert!(authorized(&sessions, &h, &key));
        h.insert(header::AUTHORIZATION, "Bearer k3y ".parse().unwrap());
        assert!(!authorized(&sessions, &h, &key));
        h.insert(header::AUTHORIZATION, "Basic k3y".parse().unwrap());
        assert!(!authorized(&sessions, &h, &key));
        // A browser: a live session's cookie, not any other.
        let mut h = axum::http::HeaderMap::new();
        let id = sessions.open();
        h.insert(
            header::COOKIE,
            format!("a=b; ragline_session={id}").parse().unwrap(),
        );
        assert!(authorized(&sessions, &h, &key));
        h.insert(header::COOKIE, "ragline_session=0123".parse().unwrap());
        assert!(!authorized(&sessions, &h, &key));
        let mut h = axum::http::HeaderMap::new();
        assert!(!is_json(&h));
        for (ct, json) in [
            ("application/json", true),
            ("application/json; charset=utf-8", true),
            ("Application/JSON", true),
            ("application/vnd.api+json", true),
            ("text/plain", false),
            ("application/x-www-form-urlencoded", false),
            ("multipart/form-data; boundary=x", false),
        ] {
            h.insert(header::CONTENT_TYPE, ct.parse().unwrap());
            assert_eq!(is_json(&h), json, "{ct}");
        }
    }
}
