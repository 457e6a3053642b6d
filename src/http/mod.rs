//! Calling services over HTTP: embeddings endpoints (OpenAI-compatible `/v1/embeddings`,
//! Hugging Face TEI `/embed`: [`embed`]) and chat completions for the LLM stages ([`chat`]).
//! These calls are slow, rate-limited and flaky, so every request goes through one
//! [`Endpoint`]:
//!
//! - limits the service states: at most N requests and T tokens per minute ([`limit`]), and a
//!   bound on requests in flight; when the budget is spent callers wait, nothing fails;
//! - 429 and 503 honour `Retry-After` (every caller of the endpoint waits it out); other 5xx,
//!   timeouts, connection resets and malformed answers are retried with exponential backoff
//!   and jitter up to `retries` attempts; a 4xx is the input's fault and is never retried
//!   (the embeddings client bisects a batch so only the bad input fails);
//! - a circuit breaker ([`circuit`]): an endpoint that keeps failing is left alone, probed
//!   every few seconds, and used again when a probe succeeds. While it is open callers wait
//!   and their attempts are not spent, so a run outlives an outage of any length. Whoever
//!   registered with [`Endpoint::on_circuit`] hears when it opens and closes.
//!
//! The I/O runs on a small tokio runtime owned by the endpoint; callers are plain threads
//! (an embedder, an enrich worker) that block on it. API keys come from an environment
//! variable named in the operator's config or flags, never from the command line, and are
//! never printed; a key goes only over https or to a loopback address. Answers are untrusted:
//! a body is read up to [`MAX_ANSWER_BYTES`], `Retry-After` is capped at
//! [`MAX_RETRY_AFTER`], and redirects are never followed (a 307 would send the document text
//! to wherever the service points).

pub mod chat;
pub mod circuit;
pub mod embed;
pub mod fetch;
pub mod limit;
pub mod robots;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use thiserror::Error;

use crate::lifecycle::backoff::{jitter_unit, retry_delay};

/// The longest answer read from a service; a longer one is refused (an input of a batch that
/// is answered with more than this is bisected like a refused one).
pub const MAX_ANSWER_BYTES: usize = 64 << 20;
/// The longest `Retry-After` honoured, whatever the service asks (seconds or a date).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);
use circuit::{Change, Circuit, CircuitState, Permit};
use limit::RateLimiter;

/// How one endpoint is called.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointSettings {
    /// The service's base URL (`http://127.0.0.1:8080`, `https://api.openai.com`).
    pub url: String,
    /// Sent as a bearer token when set (only over https, or to a loopback address).
    pub api_key: Option<crate::secret::Secret>,
    /// One request's deadline.
    pub timeout: Duration,
    /// Attempts per request for retryable failures (while the circuit is closed).
    pub retries: u32,
    /// Requests in flight at once, at most.
    pub concurrency: usize,
    /// Requests per minute, at most.
    pub rpm: Option<u64>,
    /// Tokens per minute, at most.
    pub tpm: Option<u64>,
    /// Wait before the first retry (doubled each attempt, with jitter), and the longest wait.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Failures in a row that open the circuit, and how often an open circuit is probed.
    pub circuit_threshold: u32,
    pub circuit_cooldown: Duration,
}

impl Default for EndpointSettings {
    fn default() -> Self {
        EndpointSettings {
            url: String::new(),
            api_key: None,
            timeout: Duration::from_secs(60),
            retries: 10,
            concurrency: 4,
            rpm: None,
            tpm: None,
            backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(20),
            circuit_threshold: circuit::DEFAULT_THRESHOLD,
            circuit_cooldown: circuit::DEFAULT_COOLDOWN,
        }
    }
}

/// Settings an endpoint cannot be made from, or a client that cannot start.
#[derive(Debug, Error)]
pub enum EndpointError {
    /// The URL does not parse, or it would carry a key in the clear: the message says what to
    /// use instead.
    #[error("{0}")]
    Settings(String),
    /// The HTTP client (its runtime or TLS) could not start.
    #[error("cannot start the HTTP client: {0}")]
    Client(String),
}

/// Why a service's answer (or one input of a call) gave no result: the message names the
/// service and what it answered (a malformed body, a vector of the wrong size, an input it
/// refused).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{0}")]
pub struct Unanswered(pub String);

impl From<String> for Unanswered {
    fn from(reason: String) -> Self {
        Unanswered(reason)
    }
}

impl From<&str> for Unanswered {
    fn from(reason: &str) -> Self {
        Unanswered(reason.to_string())
    }
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum CallError {
    /// The service refused the input (a 4xx other than 408/429): retrying cannot help.
    #[error("rejected with HTTP {status}: {message}")]
    Rejected { status: u16, message: String },
    /// Nothing sent to this endpoint can work (wrong URL, key refused): the message says what
    /// to fix.
    #[error("{0}")]
    Fatal(String),
    /// Retryable failures every time, `attempts` times.
    #[error("gave up after {attempts} attempts; last: {last}")]
    GaveUp { attempts: u32, last: String },
}

/// What an endpoint did, for the run's report and the metrics.
#[derive(Debug, Default)]
pub struct RemoteStats {
    pub requests: AtomicU64,
    /// Attempts made again after a retryable failure.
    pub retries: AtomicU64,
    /// 429s (and 503s with Retry-After).
    pub throttled: AtomicU64,
    /// 5xx without Retry-After.
    pub server_errors: AtomicU64,
    /// No answer: refused, reset, timed out.
    pub transport_errors: AtomicU64,
    /// A 2xx whose body was not what the API promises.
    pub malformed: AtomicU64,
    /// 4xx for an input.
    pub rejected: AtomicU64,
    /// Tokens in the requests sent (by the limiter's count).
    pub tokens_sent: AtomicU64,
    pub circuit_opened: AtomicU64,
    /// Milliseconds callers spent waiting for the rate limits.
    pub throttle_wait_ms: AtomicU64,
}

/// [`RemoteStats`] at one moment, as the report shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RemoteCounts {
    pub requests: u64,
    pub retries: u64,
    pub throttled: u64,
    pub server_errors: u64,
    pub transport_errors: u64,
    pub malformed: u64,
    pub rejected: u64,
    pub tokens_sent: u64,
    pub circuit_opened: u64,
    pub throttle_wait_secs: f64,
}

impl RemoteStats {
    pub fn snapshot(&self) -> RemoteCounts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RemoteCounts {
            requests: g(&self.requests),
            retries: g(&self.retries),
            throttled: g(&self.throttled),
            server_errors: g(&self.server_errors),
            transport_errors: g(&self.transport_errors),
            malformed: g(&self.malformed),
            rejected: g(&self.rejected),
            tokens_sent: g(&self.tokens_sent),
            circuit_opened: g(&self.circuit_opened),
            throttle_wait_secs: g(&self.throttle_wait_ms) as f64 / 1000.0,
        }
    }
}

fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

type CircuitWatcher = Box<dyn Fn(&Change) + Send + Sync>;

/// One service endpoint: its HTTP client, limits, circuit and counts, shared (in an `Arc`) by
/// every caller in the process.
pub struct Endpoint {
    settings: EndpointSettings,
    client: reqwest::Client,
    limiter: RateLimiter,
    circuit: Circuit,
    in_flight: tokio::sync::Semaphore,
    stats: RemoteStats,
    watchers: Mutex<Vec<CircuitWatcher>>,
    rt: tokio::runtime::Runtime,
}

/// What one attempt came to.
enum Verdict<T> {
    Done(T),
    Retry {
        reason: String,
        after: Option<Duration>,
        /// The endpoint's fault (counts toward opening the circuit).
        endpoint: bool,
    },
    Stop(CallError),
}

/// Whether `url` (http or https) names this machine: `localhost`, a loopback IP.
pub fn is_loopback(url: &reqwest::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// Refuse settings that would send a key in the clear: a key goes only over https, or to a
/// loopback address (where nothing crosses the network).
pub fn check_key_transport(url: &str, has_key: bool) -> Result<(), EndpointError> {
    let parsed = reqwest::Url::parse(url).map_err(|e| {
        EndpointError::Settings(format!(
            "`{}` is not a URL: {e}",
            crate::secret::redact_url(url)
        ))
    })?;
    if has_key && parsed.scheme() != "https" && !is_loopback(&parsed) {
        return Err(EndpointError::Settings(format!(
            "refusing to send an API key to {} over plain {}: use https://, or a loopback \
             address for a service on this machine",
            crate::secret::redact_url(url),
            parsed.scheme()
        )));
    }
    Ok(())
}

impl Endpoint {
    pub fn new(settings: EndpointSettings) -> Result<Arc<Endpoint>, EndpointError> {
        check_key_transport(&settings.url, settings.api_key.is_some())?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("remote")
            .enable_all()
            .build()
            .map_err(|e| EndpointError::Client(e.to_string()))?;
        let client = reqwest::Client::builder()
            .user_agent(concat!("ragline/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(5).min(settings.timeout))
            .timeout(settings.timeout)
            .pool_max_idle_per_host(settings.concurrency.max(1))
            // A redirect would re-send the request (document text, and for 307/308 the whole
            // body) wherever the service points: never followed.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| EndpointError::Client(e.to_string()))?;
        Ok(Arc::new(Endpoint {
            limiter: RateLimiter::new(settings.rpm, settings.tpm),
            circuit: Circuit::new(settings.circuit_threshold, settings.circuit_cooldown),
            in_flight: tokio::sync::Semaphore::new(settings.concurrency.max(1)),
            stats: RemoteStats::default(),
            watchers: Mutex::new(Vec::new()),
            client,
            rt,
            settings,
        }))
    }

    pub fn settings(&self) -> &EndpointSettings {
        &self.settings
    }

    pub fn stats(&self) -> &RemoteStats {
        &self.stats
    }

    pub fn circuit(&self) -> CircuitState {
        self.circuit.state()
    }

    /// Be told when the circuit opens and closes (from the thread whose request changed it).
    pub fn on_circuit(&self, watcher: impl Fn(&Change) + Send + Sync + 'static) {
        self.watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::new(watcher));
    }

    fn changed(&self, change: Option<Change>) {
        let Some(change) = change else { return };
        match &change {
            Change::Opened(reason) => {
                add(&self.stats.circuit_opened, 1);
                tracing::warn!(
                    "{} keeps failing ({reason}): circuit open; requests wait and a \
                     probe goes every {}s until it answers",
                    self.shown_url(""),
                    self.settings.circuit_cooldown.as_secs_f64()
                );
            }
            Change::Closed => tracing::info!(
                target: crate::NOTE,
                "{} answers again: circuit closed",
                self.shown_url("")
            ),
        }
        for w in self
            .watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            w(&change);
        }
    }

    /// Run `f` on the endpoint's runtime, blocking this thread (never call from async code).
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// `url + path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.settings.url.trim_end_matches('/'))
    }

    /// `url + path` as messages show it: without the secrets a URL may hold.
    pub fn shown_url(&self, path: &str) -> String {
        crate::secret::redact_url(&self.url(path))
    }

    /// POST `body` (JSON) to `path`, costing `tokens` against the limits, and parse the
    /// answer with `parse` (an error from it is a malformed answer: retried). Retries,
    /// limits and the circuit as the module says.
    pub async fn post<T>(
        &self,
        path: &str,
        body: &serde_json::Value,
        tokens: u64,
        parse: impl Fn(&[u8]) -> Result<T, Unanswered>,
    ) -> Result<T, CallError> {
        let url = self.url(path);
        let body = serde_json::to_vec(body).expect("a JSON value serialises");
        let mut attempts = 0u32;
        loop {
            self.wait_turn(tokens).await;
            attempts += 1;
            add(&self.stats.requests, 1);
            add(&self.stats.tokens_sent, tokens);
            let verdict = {
                let _slot = self.in_flight.acquire().await.expect("never closed");
                self.attempt(&url, &body, &parse).await
            };
            match verdict {
                Verdict::Done(v) => {
                    self.changed(self.circuit.success());
                    return Ok(v);
                }
                Verdict::Stop(e) => {
                    self.changed(self.circuit.success());
                    if matches!(e, CallError::Rejected { .. }) {
                        add(&self.stats.rejected, 1);
                    }
                    return Err(e);
                }
                Verdict::Retry {
                    reason,
                    after,
                    endpoint,
                } => {
                    let delay = self.retry_after_failure(reason, after, endpoint, &mut attempts)?;
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Wait until the circuit and the rate limits let a request costing `tokens` go.
    async fn wait_turn(&self, tokens: u64) {
        // An open circuit: wait for the probe's turn; attempts are not spent meanwhile.
        loop {
            match self.circuit.permit(Instant::now()) {
                Permit::Go | Permit::Probe => break,
                Permit::Wait(d) => tokio::time::sleep(d).await,
            }
        }
        let waited = Instant::now();
        loop {
            match self.limiter.try_acquire(tokens, Instant::now()) {
                Ok(()) => break,
                Err(d) => tokio::time::sleep(d).await,
            }
        }
        add(
            &self.stats.throttle_wait_ms,
            waited.elapsed().as_millis() as u64,
        );
    }

    /// Record a retryable failure with the circuit and the limits, and say how long to wait
    /// before the next attempt, or give up once `attempts` reach the retries allowed.
    fn retry_after_failure(
        &self,
        reason: String,
        after: Option<Duration>,
        endpoint: bool,
        attempts: &mut u32,
    ) -> Result<Duration, CallError> {
        if endpoint {
            self.changed(self.circuit.failure(&reason, Instant::now()));
        } else {
            self.changed(self.circuit.success());
        }
        if let Some(after) = after {
            self.limiter.pause_until(Instant::now() + after);
        }
        let open = matches!(self.circuit.state(), CircuitState::Open { .. });
        if open {
            // The outage is the endpoint's, not this request's: wait it out.
            *attempts = attempts.saturating_sub(1);
        } else if *attempts >= self.settings.retries.max(1) {
            return Err(CallError::GaveUp {
                attempts: *attempts,
                last: reason,
            });
        }
        add(&self.stats.retries, 1);
        Ok(after.unwrap_or_else(|| {
            retry_delay(
                (*attempts).max(1),
                self.settings.backoff,
                self.settings.max_backoff,
                jitter_unit(&reason),
            )
        }))
    }

    /// One request: send it, read the answer within bounds, and judge it.
    async fn attempt<T>(
        &self,
        url: &str,
        body: &[u8],
        parse: &impl Fn(&[u8]) -> Result<T, Unanswered>,
    ) -> Verdict<T> {
        let mut req = self
            .client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        if let Some(key) = &self.settings.api_key {
            req = req.bearer_auth(key.expose());
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                add(&self.stats.transport_errors, 1);
                return Verdict::Retry {
                    reason: transport_reason(&e),
                    after: None,
                    endpoint: true,
                };
            }
        };
        let status = resp.status().as_u16();
        let after = retry_after(resp.headers(), SystemTime::now());
        if (300..400).contains(&status) {
            return Verdict::Stop(redirected(url, status, &resp));
        }
        let bytes = match self.read_answer(resp, status).await {
            Ok(b) => b,
            Err(stop) => return stop,
        };
        self.judge(url, status, after, &bytes, parse)
    }

    /// The answer's body, at most [`MAX_ANSWER_BYTES`]; too large stops, cut off retries.
    async fn read_answer<T>(
        &self,
        resp: reqwest::Response,
        status: u16,
    ) -> Result<Vec<u8>, Verdict<T>> {
        match read_bounded(resp, MAX_ANSWER_BYTES).await {
            Ok(b) => Ok(b),
            Err(Body::TooLarge(n)) => {
                add(&self.stats.malformed, 1);
                Err(Verdict::Stop(CallError::Rejected {
                    status,
                    message: format!(
                        "the answer is over {} MiB ({n} bytes read): send fewer inputs per \
                         request",
                        MAX_ANSWER_BYTES >> 20
                    ),
                }))
            }
            Err(Body::Failed(e)) => {
                add(&self.stats.transport_errors, 1);
                Err(Verdict::Retry {
                    reason: format!("answer cut off: {}", transport_reason(&e)),
                    after: None,
                    endpoint: true,
                })
            }
        }
    }

    /// What an answer with `status` and body `bytes` means: parsed, retried or stopped.
    fn judge<T>(
        &self,
        url: &str,
        status: u16,
        after: Option<Duration>,
        bytes: &[u8],
        parse: &impl Fn(&[u8]) -> Result<T, Unanswered>,
    ) -> Verdict<T> {
        match status {
            200..=299 => match parse(bytes) {
                Ok(v) => Verdict::Done(v),
                Err(e) => {
                    add(&self.stats.malformed, 1);
                    Verdict::Retry {
                        reason: format!("malformed answer: {e}"),
                        after: None,
                        endpoint: false,
                    }
                }
            },
            429 => {
                add(&self.stats.throttled, 1);
                Verdict::Retry {
                    reason: "HTTP 429 (rate limited)".into(),
                    after: Some(after.unwrap_or(Duration::from_secs(1))),
                    endpoint: false,
                }
            }
            503 if after.is_some() => {
                add(&self.stats.throttled, 1);
                Verdict::Retry {
                    reason: "HTTP 503 (overloaded)".into(),
                    after,
                    endpoint: false,
                }
            }
            408 | 500..=599 => {
                add(&self.stats.server_errors, 1);
                Verdict::Retry {
                    reason: format!("HTTP {status}: {}", error_message(bytes)),
                    after,
                    endpoint: true,
                }
            }
            _ => Verdict::Stop(refused(url, status, bytes)),
        }
    }
}

/// Why a redirect stops the request: ragline does not follow one with document text.
fn redirected(url: &str, status: u16, resp: &reqwest::Response) -> CallError {
    let to = resp
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|l| l.to_str().ok())
        .map(crate::secret::redact_url)
        .unwrap_or_else(|| "nowhere said".into());
    CallError::Fatal(format!(
        "{} answered with a redirect (HTTP {status} to {to}); ragline does not follow \
         redirects with document text: set the URL to the address it points to",
        crate::secret::redact_url(url)
    ))
}

/// The error for a 4xx that no retry can help: a key or URL to fix, or a rejected input.
fn refused(url: &str, status: u16, bytes: &[u8]) -> CallError {
    match status {
        401 | 403 => CallError::Fatal(format!(
            "{} refused the request (HTTP {status}: {}): it needs an API key: name the \
             variable holding it with `api_key_env` (--embed-api-key-env), and check the \
             key",
            crate::secret::redact_url(url),
            error_message(bytes)
        )),
        404 | 405 => CallError::Fatal(format!(
            "{} has no such API (HTTP {status}): check the URL and the API kind \
             (--embed-api openai serves POST /v1/embeddings, tei POST /embed)",
            crate::secret::redact_url(url)
        )),
        _ => CallError::Rejected {
            status,
            message: error_message(bytes),
        },
    }
}

/// Why a body was not read whole.
pub(crate) enum Body {
    TooLarge(usize),
    Failed(reqwest::Error),
}

/// The body of `resp`, refused once it passes `max` bytes (whatever Content-Length says).
pub(crate) async fn read_bounded(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, Body> {
    if let Some(n) = resp.content_length() {
        if n > max as u64 {
            return Err(Body::TooLarge(n as usize));
        }
    }
    let mut out = Vec::with_capacity(resp.content_length().unwrap_or(0) as usize);
    while let Some(chunk) = resp.chunk().await.map_err(Body::Failed)? {
        if out.len() + chunk.len() > max {
            return Err(Body::TooLarge(out.len() + chunk.len()));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A transport error, said plainly.
pub(crate) fn transport_reason(e: &reqwest::Error) -> String {
    // A name the fetcher's resolver refused says why itself.
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = source {
        if let Some(refused) = s.downcast_ref::<fetch::RefusedAddress>() {
            return refused.to_string();
        }
        source = s.source();
    }
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "cannot connect (refused or unreachable)".into()
    } else {
        // The innermost cause says most ("connection reset by peer").
        let mut source: &dyn std::error::Error = e;
        while let Some(s) = source.source() {
            source = s;
        }
        format!("no answer: {source}")
    }
}

/// The message of an error answer: OpenAI's `{"error": {"message"}}`, TEI's `{"error"}`, or
/// the start of the body.
pub fn error_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        if let Some(m) = v["error"]["message"].as_str() {
            return m.to_string();
        }
        if let Some(m) = v["error"].as_str() {
            return m.to_string();
        }
        if let Some(m) = v["message"].as_str() {
            return m.to_string();
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        "(empty body)".into()
    } else {
        text.chars().take(200).collect()
    }
}

/// `Retry-After`: seconds, or an HTTP date; at most [`MAX_RETRY_AFTER`] either way.
pub fn retry_after(headers: &reqwest::header::HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0)
            .then(|| Duration::from_secs_f64(secs.min(MAX_RETRY_AFTER.as_secs_f64())));
    }
    let at = httpdate(value)?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    )
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form HTTP dates are sent in.
fn httpdate(s: &str) -> Option<SystemTime> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| m == month)? as i64
        + 1;
    // Bounded fields: the arithmetic below cannot overflow on any input.
    let day: i64 = day.parse().ok().filter(|d| (1..=31).contains(d))?;
    let year: i64 = year.parse().ok().filter(|y| (1970..=9999).contains(y))?;
    let hms: Vec<i64> = time.split(':').filter_map(|x| x.parse().ok()).collect();
    let [h, m, sec] = hms.as_slice() else {
        return None;
    };
    if !((0..24).contains(h) && (0..60).contains(m) && (0..=60).contains(sec)) {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + m * 60 + sec;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let mut h = reqwest::header::HeaderMap::new();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(retry_after(&h, now), None);
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(2)));
        h.insert("retry-after", "0.5".parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(500)));
        // RFC 9110's example date is 784111777 s after the epoch.
        h.insert(
            "retry-after",
            "Sun, 06 Nov 1994 08:49:47 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(10)));
        h.insert("retry-after", "soon".parse().unwrap());
        assert_eq!(retry_after(&h, now), None);
        // A date far ahead, or a huge number of seconds, is capped (it stalled every caller
        // for ever; a year of 20 digits overflowed the arithmetic).
        h.insert(
            "retry-after",
            "Fri, 31 Dec 9999 23:59:59 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h, now), Some(MAX_RETRY_AFTER));
        h.insert("retry-after", "1e300".parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(MAX_RETRY_AFTER));
        for bad in [
            "Sun, 06 Nov 99999999999999999 08:49:47 GMT",
            "Sun, 06 Nov 1994 99:49:47 GMT",
            "Sun, 99 Nov 1994 08:49:47 GMT",
            "Sun, 06 Nov -5 08:49:47 GMT",
        ] {
            h.insert("retry-after", bad.parse().unwrap());
            assert_eq!(retry_after(&h, now), None, "{bad}");
        }
    }

    /// A server on a free port answering every request with `respond`; counts requests.
    fn canned(
        respond: impl Fn(&mut std::net::TcpStream) + Send + 'static,
    ) -> (String, Arc<AtomicU64>) {
        use std::io::{BufRead, BufReader, Read};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let hits = Arc::new(AtomicU64::new(0));
        let h = Arc::clone(&hits);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                h.fetch_add(1, Ordering::SeqCst);
                // The request's head and body.
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                respond(&mut stream);
            }
        });
        (url, hits)
    }

    fn endpoint(url: &str) -> Arc<Endpoint> {
        Endpoint::new(EndpointSettings {
            url: url.to_string(),
            retries: 2,
            timeout: Duration::from_secs(30),
            ..EndpointSettings::default()
        })
        .unwrap()
    }

    #[test]
    fn a_redirect_is_never_followed_and_a_huge_answer_never_read_whole() {
        use std::io::Write;
        let (url, hits) = canned(|s| {
            let _ = s.write_all(
                b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://elsewhere.example/steal\r\n\
                  Content-Length: 0\r\n\r\n",
            );
        });
        let e = endpoint(&url);
        let got = e.block_on(e.post(
            "/v1/embeddings",
            &serde_json::json!({"input": "x"}),
            1,
            |b| Ok(b.len()),
        ));
        match got {
            Err(CallError::Fatal(m)) => {
                assert!(
                    m.contains("redirect") && m.contains("elsewhere.example"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(hits.load(Ordering::SeqCst), 1, "asked once, never followed");

        // An answer that never ends: read up to the bound, then refused (not retried).
        let (url, hits) = canned(|s| {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
            let chunk = vec![b'7'; 1 << 20];
            loop {
                let head = format!("{:x}\r\n", chunk.len());
                if s.write_all(head.as_bytes()).is_err()
                    || s.write_all(&chunk).is_err()
                    || s.write_all(b"\r\n").is_err()
                {
                    return;
                }
            }
        });
        let e = endpoint(&url);
        let got = e.block_on(
            e.post("/embed", &serde_json::json!({"inputs": "x"}), 1, |b| {
                Ok(b.len())
            }),
        );
        match got {
            Err(CallError::Rejected { message, .. }) => {
                assert!(message.contains("over 64 MiB"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(hits.load(Ordering::SeqCst), 1);
        // One that says so up front is refused without reading it.
        let (url, _) = canned(|s| {
            let _ = s.write_all(
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", 1u64 << 40).as_bytes(),
            );
        });
        let e = endpoint(&url);
        let got = e.block_on(
            e.post("/embed", &serde_json::json!({"inputs": "x"}), 1, |b| {
                Ok(b.len())
            }),
        );
        assert!(matches!(got, Err(CallError::Rejected { .. })), "{got:?}");
    }

    #[test]
    fn keys_go_only_over_https_or_to_this_machine() {
        assert!(check_key_transport("https://api.example.com", true).is_ok());
        assert!(check_key_transport("http://127.0.0.1:8080", true).is_ok());
        assert!(check_key_transport("http://localhost:8080", true).is_ok());
        assert!(check_key_transport("http://[::1]:8080", true).is_ok());
        assert!(check_key_transport("http://example.com", false).is_ok());
        let e = check_key_transport("http://user:hunter2@example.com/v1", true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("refusing to send an API key"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        assert!(check_key_transport("http://10.0.0.8:8080", true).is_err());
    }

    #[test]
    fn error_messages_come_from_either_api() {
        assert_eq!(
            error_message(br#"{"error": {"message": "too long", "type": "x"}}"#),
            "too long"
        );
        assert_eq!(
            error_message(br#"{"error": "Input validation error"}"#),
            "Input validation error"
        );
        assert_eq!(error_message(b""), "(empty body)");
        assert_eq!(
            error_message(b"<html>bad gateway</html>"),
            "<html>bad gateway</html>"
        );
    }
}
