//! `ragline serve`: the embedder pool as an HTTP server.
//!
//! - `POST /v1/embeddings`: OpenAI's embeddings API (`input` a string or a list of strings,
//!   `encoding_format` float or base64, `dimensions` refused unless it is the model's own);
//! - `POST /embed`: TEI's (`inputs` a string or a list, `truncate`, `normalize`);
//! - `GET /health`, `GET /metrics` (Prometheus).
//!
//! Requests are tokenized off the I/O runtime (on the rayon pool), then queued for the model
//! threads, which batch inputs *across* requests by a token budget ([`batcher`]). Bounded
//! everywhere: a request body is at most `max_body_bytes`, a request at most `max_inputs`
//! inputs, and the queue at most `max_queued_tokens` tokens; past that the answer is 503 with
//! `Retry-After` rather than more memory. Inputs over the model's limit are truncated (as
//! sentence-transformers does) or refused with 413, as configured. A malformed body is a 400
//! that says what is wrong. SIGTERM or SIGINT: stop accepting, answer every request in
//! flight, then exit.

pub mod batcher;
pub mod metrics;

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
use serde::Deserialize;
use serde_json::{json, Value};

use crate::embed::encoder::Encoder;
use crate::embed::tokenizer::TextTokenizer;
use batcher::{Admission, Batcher, Job, WindowReport};
use metrics::{EndpointLabels, ServeMetrics};

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
    /// The model normalises its vectors (TEI's `normalize: false` cannot be honoured then).
    pub normalized: bool,
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
}

/// Serve until SIGTERM/SIGINT or until `stop` resolves; `ready` hears the address bound.
pub fn serve(
    models: Vec<ModelThread>,
    tokenizer: TextTokenizer,
    dimension: usize,
    options: ServeOptions,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), String> {
    let batcher = Batcher::new(options.max_queued_tokens);
    let metrics = ServeMetrics::new();
    let app = Arc::new(App {
        tokenizer,
        dimension,
        batcher: Arc::clone(&batcher),
        metrics: metrics.clone(),
        options: options.clone(),
        stopping: AtomicBool::new(false),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("serve-io")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the server runtime: {e}"))?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(options.addr))
        .map_err(|e| format!("cannot listen on {}: {e}", options.addr))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {}: {e}", options.addr))?;
    std::thread::scope(|scope| -> Result<(), String> {
        for m in models {
            let (batcher, metrics, options) = (Arc::clone(&batcher), metrics.clone(), &options);
            std::thread::Builder::new()
                .name(format!("model-{}", m.label))
                .spawn_scoped(scope, move || {
                    let report = |r: &WindowReport| {
                        for w in &r.queue_waits {
                            metrics.queue_seconds.observe(w.as_secs_f64());
                        }
                        metrics.compute_seconds.observe(r.compute.as_secs_f64());
                        metrics.window_requests.observe(r.requests as f64);
                        metrics.batch_tokens.observe(r.tokens as f64);
                        if r.batches > 0 {
                            metrics
                                .batch_inputs
                                .observe(r.inputs as f64 / r.batches as f64);
                        }
                    };
                    batcher.run_model(
                        m.encoder.as_ref(),
                        &m.label,
                        options.batch_tokens,
                        options.batch_tokens * crate::embed::pool::WINDOW_BATCHES,
                        options.max_wait,
                        &report,
                    );
                })
                .map_err(|e| format!("cannot start a model thread: {e}"))?;
        }
        let router = Router::new()
            .route("/v1/embeddings", post(openai_embeddings))
            .route("/embed", post(tei_embed))
            .route("/health", get(health))
            .route("/metrics", get(metrics_text))
            .layer(DefaultBodyLimit::max(options.max_body_bytes))
            .with_state(Arc::clone(&app));
        ready(bound);
        let app2 = Arc::clone(&app);
        let served = rt.block_on(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    shutdown_signal().await;
                    app2.stopping.store(true, Ordering::Relaxed);
                    eprintln!("stopping: answering the requests in flight");
                })
                .await
        });
        // Every request is answered: let the model threads drain and stop.
        batcher.close();
        served.map_err(|e| format!("the server failed: {e}"))
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// An error answer in OpenAI's shape (TEI clients read `error` too).
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    retry_after: Option<u64>,
}

impl ApiError {
    fn bad(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "bad_request",
            message: message.into(),
            retry_after: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": match self.status.as_u16() {
                    400 | 413 | 422 => "invalid_request_error",
                    503 => "overloaded",
                    _ => "server_error",
                },
                "code": self.kind,
            }
        });
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_str(&s.to_string()).expect("digits"),
            );
        }
        r
    }
}

/// The texts of `input`/`inputs`: a string or a list of strings.
fn texts_of(v: &Value, field: &str, max: usize) -> Result<Vec<String>, ApiError> {
    let texts = match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::String(s) => Ok(s.clone()),
                Value::Array(_) => Err(ApiError::bad(format!(
                    "`{field}[{i}]` is a list: token-id inputs are not supported here; send \
                     the text"
                ))),
                other => Err(ApiError::bad(format!(
                    "`{field}[{i}]` must be a string, not {}",
                    json_kind(other)
                ))),
            })
            .collect::<Result<_, _>>()?,
        Value::Null => return Err(ApiError::bad(format!("`{field}` is missing"))),
        other => {
            return Err(ApiError::bad(format!(
                "`{field}` must be a string or a list of strings, not {}",
                json_kind(other)
            )))
        }
    };
    if texts.is_empty() {
        return Err(ApiError::bad(format!("`{field}` is an empty list")));
    }
    if texts.len() > max {
        return Err(ApiError::bad(format!(
            "`{field}` has {} inputs; at most {max} per request (split the request)",
            texts.len()
        )));
    }
    Ok(texts)
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A JSON body, or a 400 that says why not.
fn parse_body<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("the body is not valid: {e}")))
}

/// Tokenize (on the rayon pool), queue, wait for the vectors. Returns them with the tokens.
async fn embed(
    app: &Arc<App>,
    endpoint: &'static str,
    texts: Vec<String>,
    truncate: bool,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    if app.stopping.load(Ordering::Relaxed) {
        app.metrics.error("shutting_down");
        return Err(ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "shutting_down",
            message: "the server is stopping".into(),
            retry_after: Some(1),
        });
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let app2 = Arc::clone(app);
    rayon::spawn(move || {
        let prompt = &app2.options.prompt;
        let room = app2
            .tokenizer
            .max_content_len()
            .saturating_sub(prompt.len());
        let ids: Result<Vec<Vec<u32>>, ApiError> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if truncate {
                    app2.tokenizer
                        .ids_for_embedding(t, prompt)
                        .map_err(|e| ApiError::bad(format!("input {i}: {e}")))
                } else {
                    let ids = app2
                        .tokenizer
                        .content_ids(t)
                        .map_err(|e| ApiError::bad(format!("input {i}: {e}")))?;
                    if ids.len() > room {
                        return Err(ApiError {
                            status: StatusCode::PAYLOAD_TOO_LARGE,
                            kind: "too_long",
                            message: format!(
                                "input {i} has {} tokens, over the model's limit of {room}; \
                                 send shorter texts, or ask to truncate (TEI: \"truncate\": \
                                 true; the server: --long-inputs truncate)",
                                ids.len()
                            ),
                            retry_after: None,
                        });
                    }
                    Ok(ids)
                }
            })
            .collect();
        let _ = tx.send(ids);
    });
    let ids = rx
        .await
        .map_err(|_| ApiError::bad("tokenization failed"))??;
    let tokens: usize = ids
        .iter()
        .map(|i| i.len() + app.options.prompt.len() + 2)
        .sum();
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = Job {
        inputs: ids,
        prompt: app.options.prompt.clone(),
        enqueued: Instant::now(),
        reply,
    };
    match app.batcher.submit(job).0 {
        Admission::Queued => {}
        Admission::Full { tokens: queued } => {
            app.metrics.error("overloaded");
            return Err(ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: "overloaded",
                message: format!(
                    "the queue holds {queued} tokens, its limit: retry after a moment"
                ),
                retry_after: Some(1),
            });
        }
        Admission::Closed => {
            app.metrics.error("shutting_down");
            return Err(ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: "shutting_down",
                message: "the server is stopping".into(),
                retry_after: Some(1),
            });
        }
    }
    app.metrics
        .queue_tokens
        .set(app.batcher.queued_tokens() as i64);
    app.metrics
        .queue_requests
        .set(app.batcher.queued_jobs() as i64);
    let vectors = answer
        .await
        .map_err(|_| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "model",
            message: "the model thread stopped".into(),
            retry_after: None,
        })?
        .map_err(|e| {
            app.metrics.error("model");
            ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                kind: "model",
                message: e,
                retry_after: None,
            }
        })?;
    let labels = EndpointLabels {
        endpoint: endpoint.to_string(),
    };
    app.metrics
        .inputs
        .get_or_create(&labels)
        .inc_by(vectors.len() as u64);
    app.metrics
        .tokens
        .get_or_create(&labels)
        .inc_by(tokens as u64);
    app.metrics
        .queue_tokens
        .set(app.batcher.queued_tokens() as i64);
    app.metrics
        .queue_requests
        .set(app.batcher.queued_jobs() as i64);
    Ok((vectors, tokens))
}

/// Time and count a request, whatever its answer.
async fn observed(
    app: &Arc<App>,
    endpoint: &'static str,
    handle: impl std::future::Future<Output = Result<Response, ApiError>>,
) -> Response {
    let started = Instant::now();
    app.metrics.in_flight.inc();
    let response = match handle.await {
        Ok(r) => r,
        Err(e) => {
            if e.kind == "bad_request" {
                app.metrics.error("bad_request");
            } else if e.kind == "too_long" {
                app.metrics.error("too_long");
            }
            e.into_response()
        }
    };
    app.metrics.in_flight.dec();
    app.metrics
        .observe_request(endpoint, response.status().as_u16(), started.elapsed());
    response
}

#[derive(Deserialize)]
struct OpenAiRequest {
    #[serde(default)]
    input: Value,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
}

async fn openai_embeddings(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
    let app2 = Arc::clone(&app);
    observed(&app, "/v1/embeddings", async move {
        let req: OpenAiRequest = parse_body(&body)?;
        let base64 = match req.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => {
                return Err(ApiError::bad(format!(
                    "`encoding_format` `{other}` is not supported: use float or base64"
                )))
            }
        };
        if let Some(d) = req.dimensions {
            if d != app2.dimension {
                return Err(ApiError::bad(format!(
                    "`dimensions` = {d}: this model makes {}-dimensional vectors and cannot be \
                     shortened (it was not trained for it); leave `dimensions` out",
                    app2.dimension
                )));
            }
        }
        let texts = texts_of(&req.input, "input", app2.options.max_inputs)?;
        let truncate = app2.options.long_inputs == LongInputs::Truncate;
        let (vectors, tokens) = embed(&app2, "/v1/embeddings", texts, truncate).await?;
        let data: Vec<Value> = vectors
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let embedding = if base64 {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                } else {
                    json!(v)
                };
                json!({"object": "embedding", "index": i, "embedding": embedding})
            })
            .collect();
        Ok(axum::Json(json!({
            "object": "list",
            "data": data,
            "model": req.model.unwrap_or_else(|| app2.options.model_name.clone()),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }))
        .into_response())
    })
    .await
}

#[derive(Deserialize)]
struct TeiRequest {
    #[serde(default)]
    inputs: Value,
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    normalize: Option<bool>,
}

async fn tei_embed(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
    let app2 = Arc::clone(&app);
    observed(&app, "/embed", async move {
        let req: TeiRequest = parse_body(&body)?;
        if req.normalize == Some(false) && app2.options.normalized {
            return Err(ApiError::bad(
                "`normalize: false`: this model's configuration normalises its vectors, and \
                 the server returns them as the model makes them; leave it out",
            ));
        }
        let texts = texts_of(&req.inputs, "inputs", app2.options.max_inputs)?;
        let truncate = req
            .truncate
            .unwrap_or(app2.options.long_inputs == LongInputs::Truncate);
        let (vectors, _) = embed(&app2, "/embed", texts, truncate).await?;
        Ok(axum::Json(vectors).into_response())
    })
    .await
}

async fn health(State(app): State<Arc<App>>) -> Response {
    if app.stopping.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "stopping"})),
        )
            .into_response();
    }
    axum::Json(json!({
        "status": "ok",
        "model": app.options.model_name,
        "dimension": app.dimension,
        "max_input_tokens": app.tokenizer.max_content_len(),
        "queued_tokens": app.batcher.queued_tokens(),
    }))
    .into_response()
}

async fn metrics_text(State(app): State<Arc<App>>) -> Response {
    app.metrics
        .queue_tokens
        .set(app.batcher.queued_tokens() as i64);
    app.metrics
        .queue_requests
        .set(app.batcher.queued_jobs() as i64);
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        app.metrics.encode(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_a_string_or_a_list_of_strings() {
        assert_eq!(texts_of(&json!("a"), "input", 10).unwrap(), ["a"]);
        assert_eq!(
            texts_of(&json!(["a", "b"]), "input", 10).unwrap(),
            ["a", "b"]
        );
        for (v, says) in [
            (json!(null), "missing"),
            (json!([]), "empty list"),
            (json!(3), "not a number"),
            (json!(["a", 3]), "`input[1]` must be a string"),
            (json!([[101, 102]]), "token-id inputs"),
            (json!(["a", "b", "c"]), "at most 2"),
        ] {
            let e = texts_of(&v, "input", 2).unwrap_err();
            assert!(e.message.contains(says), "{v}: {}", e.message);
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
    }
}
