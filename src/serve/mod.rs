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
mod facets;
pub mod metrics;
pub mod pages;
mod predict;
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
use metrics::{EndpointLabels, ServeMetrics};
pub use predict::fuzz_bodies as fuzz_classifier_bodies;
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

/// Serve until SIGTERM/SIGINT or until `stop` resolves; `ready` hears the address bound.
pub fn serve(
    models: Vec<ModelThread>,
    tokenizer: TextTokenizer,
    dimension: usize,
    task_models: tasks::TaskModels,
    options: ServeOptions,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let batcher = Batcher::new(options.max_queued_tokens);
    let app = app(tokenizer, dimension, task_models, &batcher, &options)?;
    let cors = match &options.cors_origin {
        None => None,
        Some(origin) => Some(cors_layer(origin)?),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("serve-io")
        .enable_all()
        .build()
        .map_err(|e| ServeError::start("the server runtime", e))?;
    let listen = |source| ServeError::Listen {
        addr: options.addr.to_string(),
        source,
    };
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(options.addr))
        .map_err(listen)?;
    let bound = listener.local_addr().map_err(listen)?;
    std::thread::scope(|scope| -> Result<(), ServeError> {
        for m in models {
            spawn_model(scope, m, &batcher, &app.metrics, &options)?;
        }
        app.tasks
            .spawn(scope, &app.models, options.batch_tokens, options.max_wait)?;
        let router = routes(&app, cors);
        ready(bound);
        let app2 = Arc::clone(&app);
        rt.block_on(accept(listener, router, &options, async move {
            shutdown_signal().await;
            app2.stopping.store(true, Ordering::Relaxed);
            tracing::info!(target: crate::NOTE, "stopping: answering the requests in flight");
        }));
        // Every request is answered: let the model threads drain and stop.
        batcher.close();
        app.tasks.close();
        Ok(())
    })
}

/// What the handlers share: the queues, the models' tasks, the limits and the sessions.
fn app(
    tokenizer: TextTokenizer,
    dimension: usize,
    task_models: tasks::TaskModels,
    batcher: &Arc<Batcher>,
    options: &ServeOptions,
) -> Result<Arc<App>, ServeError> {
    let shared_models = tasks::SharedModels::from(task_models);
    let task_queues = tasks::TaskQueues::for_models(&shared_models, options.max_queued_tokens);
    let tokenize_pool = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("serve-tokenize-{i}"))
        .build()
        .map_err(|e| ServeError::start("the tokenizer threads", e))?;
    Ok(Arc::new(App {
        tokenizer,
        dimension,
        batcher: Arc::clone(batcher),
        metrics: ServeMetrics::new(),
        options: options.clone(),
        stopping: AtomicBool::new(false),
        requests: Arc::new(tokio::sync::Semaphore::new(
            options.max_concurrent_requests.max(1),
        )),
        tokenize_pool,
        search: options
            .index
            .clone()
            .map(|setup| Arc::new(pages::SearchService::new(setup))),
        tasks: task_queues,
        models: shared_models,
        hosts: auth::HostPolicy::new(options.addr.ip(), &options.allowed_hosts),
        sessions: auth::Sessions::default(),
        logins: auth::LoginThrottle::default(),
    }))
}

/// The thread of one embedding model: it takes windows of the batcher's queue until it closes.
fn spawn_model<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    m: ModelThread,
    batcher: &Arc<Batcher>,
    metrics: &ServeMetrics,
    options: &'scope ServeOptions,
) -> Result<(), ServeError> {
    let (batcher, metrics) = (Arc::clone(batcher), metrics.clone());
    std::thread::Builder::new()
        .name(format!("model-{}", m.label))
        .spawn_scoped(scope, move || {
            let report = |r: &WindowReport| observe_window(&metrics, r);
            batcher.run_model(
                m.encoder.as_ref(),
                &m.label,
                options.batch_tokens,
                options.batch_tokens * crate::embed::pool::WINDOW_BATCHES,
                options.max_wait,
                &report,
            );
        })
        .map(drop)
        .map_err(|e| ServeError::start("a model thread", e))
}

/// A model thread's window in the metrics: its requests' waits, the compute, its size.
fn observe_window(metrics: &ServeMetrics, r: &WindowReport) {
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
}

/// The server's routes (the pages and `/v1/search` with an index), every request through
/// [`guard`], the body limit, and CORS for one origin when asked.
fn routes(app: &Arc<App>, cors: Option<tower_http::cors::CorsLayer>) -> Router {
    let mut router = Router::new()
        .route("/v1/embeddings", post(openai_embeddings))
        .route("/rerank", post(tasks::tei_rerank))
        .route("/v1/rerank", post(tasks::cohere_rerank))
        .route("/embed_sparse", post(tasks::tei_embed_sparse))
        .route("/predict", post(predict::tei_predict))
        .route("/ner", post(predict::ner))
        .route("/embed", post(tei_embed))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text));
    if app.search.is_some() {
        router = router
            .route("/", get(pages::search_page))
            .route("/status", get(pages::status_page))
            .route("/v1/search", get(pages::search_json))
            .route("/v1/status", get(pages::status_json))
            .route("/login", get(pages::login_page).post(pages::login))
            .route("/logout", post(pages::logout))
            .route("/admin/{action}", post(pages::admin));
    }
    let mut router = router
        .layer(DefaultBodyLimit::max(app.options.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(Arc::clone(app), guard))
        .with_state(Arc::clone(app));
    if let Some(cors) = cors {
        router = router.layer(cors);
    }
    router
}

/// Serve connections until `stop` resolves, then let every connection finish the request it
/// is answering (and close idle ones). At most `max_connections` at once; a client gets
/// `header_timeout` to send its headers.
async fn accept(
    listener: tokio::net::TcpListener,
    router: Router,
    options: &ServeOptions,
    stop: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    use tower::ServiceExt as _;
    let connections = Arc::new(tokio::sync::Semaphore::new(options.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_timeout);
    builder.http2().timer(TokioTimer::new());
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, remote) = match accepted {
                    Ok(accepted) => accepted,
                    // Out of file descriptors and the like: wait a moment, go on.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                    // Full: closed at once, the client retries elsewhere or later.
                    drop(stream);
                    continue;
                };
                // Where the request came in, for the Host check and the login throttle.
                let connection = auth::Connection {
                    local: stream.local_addr().map_or(remote.ip(), |a| a.ip()),
                    remote: remote.ip(),
                };
                let service = TowerToHyperService::new(router.clone().map_request(
                    move |mut r: axum::http::Request<hyper::body::Incoming>| {
                        r.extensions_mut().insert(connection);
                        r
                    },
                ));
                let connection = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    let _ = connection.await;
                    drop(permit);
                });
            }
            _ = &mut stop => break,
        }
    }
    drop(listener);
    // Requests in flight are answered; past their own deadline nothing is waited for.
    let _ = tokio::time::timeout(
        options.request_timeout + Duration::from_secs(5),
        graceful.shutdown(),
    )
    .await;
}

/// CORS for one origin: its pages may POST JSON with an Authorization header.
fn cors_layer(origin: &str) -> Result<tower_http::cors::CorsLayer, ServeError> {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let value = HeaderValue::from_str(origin.trim_end_matches('/')).map_err(|_| {
        ServeError::Setting(format!("--cors-origin `{origin}` is not a valid origin"))
    })?;
    if !(origin.starts_with("http://") || origin.starts_with("https://")) {
        return Err(ServeError::Setting(format!(
            "--cors-origin `{origin}` must be an origin such as https://app.example.com"
        )));
    }
    // Allowed only for that origin: another one's request gets no CORS headers at all.
    Ok(CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(move |o: &HeaderValue, _| {
            *o == value
        }))
        .allow_methods([axum::http::Method::GET, axum::http::Method::POST])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
        .max_age(Duration::from_secs(600)))
}

/// Every request: a Host this server answers to (all but `/health`: 421), the API key (all
/// but `/health`), JSON bodies only (415), room among the requests in flight for the routes
/// that run a model or a search (503), and the request's deadline (408).
async fn guard(
    State(app): State<Arc<App>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path().to_string();
    if path != "/health" {
        if let Some(refused) = misdirected(&app, &request) {
            return refused;
        }
    }
    if let Some(refused) = unauthorized(&app, &request, &path) {
        return refused;
    }
    let embeds = request.method() == axum::http::Method::POST
        && path != "/login"
        && path != "/logout"
        && !path.starts_with("/admin/");
    // The search page and the search API embed the query and search: they take a permit too.
    let searches = request.method() == axum::http::Method::GET
        && app.search.is_some()
        && (path == "/" || path == "/v1/search");
    if embeds && !is_json(request.headers()) {
        app.metrics.error("unsupported_media_type");
        return ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            kind: "unsupported_media_type",
            message: "send the body as JSON, with `Content-Type: application/json`".into(),
            retry_after: None,
        }
        .into_response();
    }
    let _permit = if embeds || searches {
        match Arc::clone(&app.requests).try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                app.metrics.error("overloaded");
                return ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    kind: "overloaded",
                    message: format!(
                        "{} requests are being answered, the limit \
                         (--max-concurrent-requests): retry after a moment",
                        app.options.max_concurrent_requests
                    ),
                    retry_after: Some(1),
                }
                .into_response();
            }
        }
    } else {
        None
    };
    match tokio::time::timeout(app.options.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            app.metrics.error("timeout");
            ApiError {
                status: StatusCode::REQUEST_TIMEOUT,
                kind: "timeout",
                message: format!(
                    "the request took longer than {}s (its body arrived too slowly, or the \
                     model is overloaded); retry",
                    app.options.request_timeout.as_secs()
                ),
                retry_after: None,
            }
            .into_response()
        }
    }
}

/// With an API key: 401 for a request without it (a page: to the login form). `/health`,
/// and the login and logout of the search pages, are open.
fn unauthorized(app: &App, request: &axum::extract::Request, path: &str) -> Option<Response> {
    let key = app.options.api_key.as_ref()?;
    let open =
        path == "/health" || (app.search.is_some() && (path == "/login" || path == "/logout"));
    if open || authorized(&app.sessions, request.headers(), key) {
        return None;
    }
    if app.search.is_some() && pages::is_page(path) {
        // A browser: to the login form.
        return Some(pages::to_login());
    }
    app.metrics.error("unauthorized");
    let mut r = ApiError {
        status: StatusCode::UNAUTHORIZED,
        kind: "unauthorized",
        message: "this server needs an API key: send `Authorization: Bearer KEY`".into(),
        retry_after: None,
    }
    .into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(r)
}

/// 421 for a request whose Host (or HTTP/2 authority) this server does not answer to.
fn misdirected(app: &App, request: &axum::extract::Request) -> Option<Response> {
    let host = request
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{0}"))
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    let local = request
        .extensions()
        .get::<auth::Connection>()
        .map(|c| c.local);
    if app.hosts.allows(host, local) {
        return None;
    }
    app.metrics.error("misdirected");
    let refused = ApiError {
        status: StatusCode::MISDIRECTED_REQUEST,
        kind: "misdirected",
        message: "this server does not answer to that Host name (a page reaching it through \
                  DNS rebinding?): use its address, or start it with --allowed-host NAME"
            .into(),
        retry_after: None,
    };
    Some(refused.into_response())
}

/// `Authorization: Bearer KEY` with the server's key (compared in constant time), or the
/// cookie of a live session the login page opened (a browser).
fn authorized(sessions: &auth::Sessions, headers: &axum::http::HeaderMap, key: &Secret) -> bool {
    use subtle::ConstantTimeEq;
    if let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
    {
        return bool::from(given.ct_eq(key.expose().as_bytes()));
    }
    pages::session_ids(headers).any(|id| sessions.valid(id))
}

/// `Content-Type: application/json` (or a `+json` type), parameters allowed.
fn is_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            let mime = v
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            mime == "application/json"
                || (mime.starts_with("application/") && mime.ends_with("+json"))
        })
        .unwrap_or(false)
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

    /// 500: the tokenizer panicked on this request (the server goes on).
    fn tokenizer_panic(panic: &(dyn std::any::Any + Send)) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "tokenizer",
            message: format!(
                "the tokenizer failed on this request ({}); the server goes on",
                crate::panics::message(panic)
            ),
            retry_after: None,
        }
    }

    /// 413: an input over the model's limit, and truncation not asked for.
    fn too_long(message: String) -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            kind: "too_long",
            message,
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

/// One request's fields, parsed as the body streams by: `input` (OpenAI) or `inputs` (TEI)
/// is counted as it is read, so a body of a million inputs stops at the first one past the
/// limit instead of being held whole; fields this server does not use are skipped unread.
#[derive(Debug, Default, PartialEq)]
struct Request {
    texts: Vec<String>,
    model: Option<String>,
    encoding_format: Option<String>,
    dimensions: Option<usize>,
    truncate: Option<bool>,
    normalize: Option<bool>,
    prompt_name: Option<String>,
}

/// The fuzz target's view of a request body: parsed in both shapes.
#[doc(hidden)]
pub fn fuzz_request(body: &[u8]) {
    for field in ["input", "inputs"] {
        if let Ok(r) = parse_request(body, field, 16) {
            assert!(!r.texts.is_empty() && r.texts.len() <= 16);
        }
    }
}

/// Parse a request body whose inputs are in `field`, at most `max` of them.
fn parse_request(body: &[u8], field: &'static str, max: usize) -> Result<Request, ApiError> {
    use serde::de::DeserializeSeed;
    let mut d = serde_json::Deserializer::from_slice(body);
    let request = RequestSeed { field, max }
        .deserialize(&mut d)
        .and_then(|r| d.end().map(|()| r))
        .map_err(|e| ApiError::bad(format!("the body is not valid: {e}")))?;
    if request.texts.is_empty() {
        return Err(ApiError::bad(format!("`{field}` is an empty list")));
    }
    Ok(request)
}

struct RequestSeed {
    field: &'static str,
    max: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for RequestSeed {
    type Value = Request;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Request, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for RequestSeed {
    type Value = Request;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a JSON object with `{}`", self.field)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Request, A::Error> {
        use serde::de::{Error, IgnoredAny};
        let mut r = Request::default();
        let mut seen = false;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                k if k == self.field => {
                    r.texts = map.next_value_seed(TextsSeed {
                        field: self.field,
                        max: self.max,
                        objects: false,
                    })?;
                    seen = true;
                }
                "model" => r.model = map.next_value()?,
                "encoding_format" => r.encoding_format = map.next_value()?,
                "dimensions" => r.dimensions = map.next_value()?,
                "truncate" => r.truncate = map.next_value()?,
                "normalize" => r.normalize = map.next_value()?,
                "prompt_name" => r.prompt_name = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !seen {
            return Err(A::Error::custom(format!("`{}` is missing", self.field)));
        }
        Ok(r)
    }
}

/// `input`: a string, or a list of strings of at most `max` (with `objects`, a list item may
/// also be `{"text": STRING}`, the Cohere/Jina documents' shape).
struct TextsSeed {
    field: &'static str,
    max: usize,
    objects: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for TextsSeed {
    type Value = Vec<String>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Vec<String>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for TextsSeed {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` as a string or a list of strings", self.field)
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Vec<String>, E> {
        Ok(vec![s.to_string()])
    }

    fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Vec<String>, E> {
        Ok(vec![s])
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
        use serde::de::Error;
        let mut texts = Vec::new();
        let mut i = 0;
        while let Some(text) = seq.next_element_seed(TextSeed {
            field: self.field,
            index: i,
            objects: self.objects,
        })? {
            if texts.len() == self.max {
                return Err(A::Error::custom(format!(
                    "`{}` has more than {} inputs; at most {} per request (split the request)",
                    self.field, self.max, self.max
                )));
            }
            texts.push(text);
            i += 1;
        }
        Ok(texts)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Vec<String>, E> {
        Err(E::custom(format!("`{}` is missing", self.field)))
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Vec<String>, E> {
        Err(self.wrong("a boolean"))
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Vec<String>, E> {
        Err(self.wrong("a number"))
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Vec<String>, E> {
        Err(self.wrong("a number"))
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Vec<String>, E> {
        Err(self.wrong("a number"))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<Vec<String>, A::Error> {
        Err(self.wrong("an object"))
    }
}

impl TextsSeed {
    fn wrong<E: serde::de::Error>(&self, kind: &str) -> E {
        E::custom(format!(
            "`{}` must be a string or a list of strings, not {kind}",
            self.field
        ))
    }
}

/// One input of the list: a string (or, with `objects`, `{"text": STRING}`).
struct TextSeed {
    field: &'static str,
    index: usize,
    objects: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for TextSeed {
    type Value = String;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for TextSeed {
    type Value = String;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}[{}]` as a string", self.field, self.index)
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<String, E> {
        Ok(s.to_string())
    }
    fn visit_string<E: serde::de::Error>(self, s: String) -> Result<String, E> {
        Ok(s)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<String, A::Error> {
        use serde::de::Error;
        Err(A::Error::custom(format!(
            "`{}[{}]` is a list: token-id inputs are not supported here; send the text",
            self.field, self.index
        )))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<String, E> {
        Err(self.wrong("null"))
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<String, E> {
        Err(self.wrong("a boolean"))
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<String, E> {
        Err(self.wrong("a number"))
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<String, E> {
        Err(self.wrong("a number"))
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<String, E> {
        Err(self.wrong("a number"))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        use serde::de::{Error, IgnoredAny};
        if !self.objects {
            return Err(A::Error::custom(format!(
                "`{}[{}]` must be a string, not an object",
                self.field, self.index
            )));
        }
        let mut text = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == "text" {
                text = Some(map.next_value_seed(TextSeed {
                    objects: false,
                    ..self
                })?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        text.ok_or_else(|| {
            A::Error::custom(format!(
                "`{}[{}]` has no `text`: give a string or {{\"text\": STRING}}",
                self.field, self.index
            ))
        })
    }
}

impl TextSeed {
    fn wrong<E: serde::de::Error>(&self, kind: &str) -> E {
        E::custom(format!(
            "`{}[{}]` must be a string, not {kind}",
            self.field, self.index
        ))
    }
}

/// The prompt a request asks for by `prompt_name`, else the server's.
fn request_prompt(app: &App, name: Option<&str>) -> Result<Vec<u32>, ApiError> {
    match name {
        None => Ok(app.options.prompt.clone()),
        Some(n) => app.options.prompts.get(n).cloned().ok_or_else(|| {
            ApiError::bad(format!(
                "`prompt_name` `{n}` is not one of the model's prompts ({})",
                if app.options.prompts.is_empty() {
                    "it has none".to_string()
                } else {
                    app.options
                        .prompts
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ))
        }),
    }
}

/// Cut vectors to `dimensions` (re-normalised when the model normalises); more than the
/// model makes is refused.
fn cut(app: &App, vectors: &mut [Vec<f32>], dimensions: Option<usize>) -> Result<(), ApiError> {
    let Some(d) = dimensions else {
        return Ok(());
    };
    if d == 0 || d > app.dimension {
        return Err(ApiError::bad(format!(
            "`dimensions` = {d}: this model makes {}-dimensional vectors; ask for 1 to {}",
            app.dimension, app.dimension
        )));
    }
    for v in vectors {
        v.truncate(d);
        if app.options.normalized {
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            v.iter_mut().for_each(|x| *x /= norm);
        }
    }
    Ok(())
}

/// Tokenize (on the server's pool), queue, wait for the vectors. Returns them with the tokens.
async fn embed(
    app: &Arc<App>,
    endpoint: &'static str,
    texts: Vec<String>,
    truncate: bool,
    prompt: Vec<u32>,
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
    let prompt2 = prompt.clone();
    app.tokenize_pool.spawn(move || {
        // A panic in the tokenizer fails this request, never the server.
        let tokenized = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tokenize(&app2, &texts, truncate, &prompt2)
        }));
        let _ = tx.send(tokenized.unwrap_or_else(|panic| Err(ApiError::tokenizer_panic(&*panic))));
    });
    let ids = rx
        .await
        .map_err(|_| ApiError::bad("tokenization failed"))??;
    let tokens: usize = ids.iter().map(|i| i.len() + prompt.len() + 2).sum();
    queue_and_wait(app, endpoint, ids, tokens, prompt).await
}

/// Each text's ids, truncated or refused (413) when over the model's limit.
fn tokenize(
    app: &App,
    texts: &[String],
    truncate: bool,
    prompt: &[u32],
) -> Result<Vec<Vec<u32>>, ApiError> {
    #[cfg(feature = "failpoints")]
    fail::fail_point!("serve-tokenize");
    let room = app.tokenizer.max_content_len().saturating_sub(prompt.len());
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if truncate {
                app.tokenizer
                    .ids_for_embedding(t, prompt)
                    .map_err(|e| ApiError::bad(format!("input {i}: {e}")))
            } else {
                let ids = app
                    .tokenizer
                    .content_ids(t)
                    .map_err(|e| ApiError::bad(format!("input {i}: {e}")))?;
                if ids.len() > room {
                    return Err(ApiError::too_long(format!(
                        "input {i} has {} tokens, over the model's limit of {room}; send \
                         shorter texts, or ask to truncate (TEI: \"truncate\": true; the \
                         server: --long-inputs truncate)",
                        ids.len()
                    )));
                }
                Ok(ids)
            }
        })
        .collect()
}

/// Queue tokenized inputs for the model threads and wait for their vectors.
async fn queue_and_wait(
    app: &Arc<App>,
    endpoint: &'static str,
    ids: Vec<Vec<u32>>,
    tokens: usize,
    prompt: Vec<u32>,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = Job {
        inputs: ids,
        prompt,
        enqueued: Instant::now(),
        // A search query: someone is waiting for the page.
        interactive: endpoint == "search",
        reply,
    };
    refused(app, app.batcher.submit(job).0)?;
    observe_queue(app);
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
                message: e.0,
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
    observe_queue(app);
    Ok((vectors, tokens))
}

/// The batcher's queue, in the metrics.
fn observe_queue(app: &App) {
    app.metrics
        .queue_tokens
        .set(app.batcher.queued_tokens() as i64);
    app.metrics
        .queue_requests
        .set(app.batcher.queued_jobs() as i64);
}

/// The answer to a job the batcher did not queue (503), counted.
fn refused(app: &App, admission: Admission) -> Result<(), ApiError> {
    let (kind, message, retry_after) = match admission {
        Admission::Queued => return Ok(()),
        Admission::Full { tokens: queued } => (
            "overloaded",
            format!("the queue holds {queued} tokens, its limit: retry after a moment"),
            Some(1),
        ),
        Admission::Closed => ("shutting_down", "the server is stopping".into(), Some(1)),
        Admission::NoModel => (
            "model",
            "no model thread is running (they failed; see the server's log): restart the \
             server"
                .into(),
            None,
        ),
    };
    app.metrics.error(kind);
    Err(ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind,
        message,
        retry_after,
    })
}

/// Time and count a request, whatever its answer.
async fn observed(
    app: &Arc<App>,
    endpoint: &'static str,
    handle: impl std::future::Future<Output = Result<Response, ApiError>>,
) -> Response {
    let started = Instant::now();
    // Decremented however the request ends: a client that disconnects drops this future.
    struct InFlight<'a>(&'a ServeMetrics);
    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            self.0.in_flight.dec();
        }
    }
    app.metrics.in_flight.inc();
    let in_flight = InFlight(&app.metrics);
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
    drop(in_flight);
    app.metrics
        .observe_request(endpoint, response.status().as_u16(), started.elapsed());
    response
}

async fn openai_embeddings(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
    let app2 = Arc::clone(&app);
    observed(&app, "/v1/embeddings", async move {
        let req = parse_request(&body, "input", app2.options.max_inputs)?;
        let base64 = match req.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => {
                return Err(ApiError::bad(format!(
                    "`encoding_format` `{other}` is not supported: use float or base64"
                )))
            }
        };
        let prompt = request_prompt(&app2, req.prompt_name.as_deref())?;
        cut(&app2, &mut [], req.dimensions)?;
        let texts = req.texts;
        let truncate = app2.options.long_inputs == LongInputs::Truncate;
        let (mut vectors, tokens) = embed(&app2, "/v1/embeddings", texts, truncate, prompt).await?;
        cut(&app2, &mut vectors, req.dimensions)?;
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

async fn tei_embed(State(app): State<Arc<App>>, body: axum::body::Bytes) -> Response {
    let app2 = Arc::clone(&app);
    observed(&app, "/embed", async move {
        let req = parse_request(&body, "inputs", app2.options.max_inputs)?;
        if req.normalize == Some(false) && app2.options.normalized {
            return Err(ApiError::bad(
                "`normalize: false`: this model's configuration normalises its vectors, and \
                 the server returns them as the model makes them; leave it out",
            ));
        }
        let prompt = request_prompt(&app2, req.prompt_name.as_deref())?;
        cut(&app2, &mut [], req.dimensions)?;
        let texts = req.texts;
        let truncate = req
            .truncate
            .unwrap_or(app2.options.long_inputs == LongInputs::Truncate);
        let (mut vectors, _) = embed(&app2, "/embed", texts, truncate, prompt).await?;
        cut(&app2, &mut vectors, req.dimensions)?;
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
    if app.batcher.models_gone() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "model_down"})),
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
