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
//! variable named in the config, never from the command line, and are never printed.

pub mod chat;
pub mod circuit;
pub mod embed;
pub mod limit;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use thiserror::Error;

use crate::lifecycle::backoff::{jitter_unit, retry_delay};
use circuit::{Change, Circuit, CircuitState, Permit};
use limit::RateLimiter;

/// How one endpoint is called.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointSettings {
    /// The service's base URL (`http://127.0.0.1:8080`, `https://api.openai.com`).
    pub url: String,
    /// Sent as a bearer token when set.
    pub api_key: Option<String>,
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

impl Endpoint {
    pub fn new(settings: EndpointSettings) -> Result<Arc<Endpoint>, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("remote")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the HTTP client: {e}"))?;
        let client = reqwest::Client::builder()
            .user_agent(concat!("ragline/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(5).min(settings.timeout))
            .timeout(settings.timeout)
            .pool_max_idle_per_host(settings.concurrency.max(1))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
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
                eprintln!(
                    "warning: {} keeps failing ({reason}): circuit open; requests wait and a \
                     probe goes every {}s until it answers",
                    self.settings.url,
                    self.settings.circuit_cooldown.as_secs_f64()
                );
            }
            Change::Closed => eprintln!("{} answers again: circuit closed", self.settings.url),
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

    /// POST `body` (JSON) to `path`, costing `tokens` against the limits, and parse the
    /// answer with `parse` (an error from it is a malformed answer: retried). Retries,
    /// limits and the circuit as the module says.
    pub async fn post<T>(
        &self,
        path: &str,
        body: &serde_json::Value,
        tokens: u64,
        parse: impl Fn(&[u8]) -> Result<T, String>,
    ) -> Result<T, CallError> {
        let url = self.url(path);
        let body = serde_json::to_vec(body).expect("a JSON value serialises");
        let mut attempts = 0u32;
        loop {
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
                        attempts = attempts.saturating_sub(1);
                    } else if attempts >= self.settings.retries.max(1) {
                        return Err(CallError::GaveUp {
                            attempts,
                            last: reason,
                        });
                    }
                    add(&self.stats.retries, 1);
                    let delay = after.unwrap_or_else(|| {
                        retry_delay(
                            attempts.max(1),
                            self.settings.backoff,
                            self.settings.max_backoff,
                            jitter_unit(&reason),
                        )
                    });
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    async fn attempt<T>(
        &self,
        url: &str,
        body: &[u8],
        parse: &impl Fn(&[u8]) -> Result<T, String>,
    ) -> Verdict<T> {
        let mut req = self
            .client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        if let Some(key) = &self.settings.api_key {
            req = req.bearer_auth(key);
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
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => {
                add(&self.stats.transport_errors, 1);
                return Verdict::Retry {
                    reason: format!("answer cut off: {}", transport_reason(&e)),
                    after: None,
                    endpoint: true,
                };
            }
        };
        match status {
            200..=299 => match parse(&bytes) {
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
                    reason: format!("HTTP {status}: {}", error_message(&bytes)),
                    after,
                    endpoint: true,
                }
            }
            401 | 403 => Verdict::Stop(CallError::Fatal(format!(
                "{url} refused the API key (HTTP {status}: {}): set the variable named by \
                 `api_key_env` (OPENAI_API_KEY by default) to a valid key",
                error_message(&bytes)
            ))),
            404 | 405 => Verdict::Stop(CallError::Fatal(format!(
                "{url} has no such API (HTTP {status}): check the URL and the API kind \
                 (--embed-api openai serves POST /v1/embeddings, tei POST /embed)"
            ))),
            _ => Verdict::Stop(CallError::Rejected {
                status,
                message: error_message(&bytes),
            }),
        }
    }
}

/// A transport error, said plainly.
fn transport_reason(e: &reqwest::Error) -> String {
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

/// `Retry-After`: seconds, or an HTTP date.
pub fn retry_after(headers: &reqwest::header::HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0)
            .then(|| Duration::from_secs_f64(secs.min(3600.0)));
    }
    let at = httpdate(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
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
    let (day, year): (i64, i64) = (day.parse().ok()?, year.parse().ok()?);
    let hms: Vec<i64> = time.split(':').filter_map(|x| x.parse().ok()).collect();
    let [h, m, sec] = hms.as_slice() else {
        return None;
    };
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
