//! Prometheus metrics, with the `prometheus-client` crate (the Prometheus project's Rust
//! client): what `ragline serve` exposes at `GET /metrics`, and what `ragline enrich --follow
//! --metrics-addr` exposes about the lifecycle. Served in the text exposition format
//! (OpenMetrics 1.0, which Prometheus scrapes natively).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

/// What `ragline serve` counts.
#[derive(Clone)]
pub struct ServeMetrics {
    registry: Arc<Mutex<Registry>>,
    pub requests: Family<RequestLabels, Counter>,
    pub inputs: Family<EndpointLabels, Counter>,
    pub tokens: Family<EndpointLabels, Counter>,
    pub errors: Family<KindLabels, Counter>,
    pub request_seconds: Family<EndpointLabels, Histogram>,
    pub queue_seconds: Histogram,
    pub compute_seconds: Histogram,
    pub batch_inputs: Histogram,
    pub batch_tokens: Histogram,
    pub window_requests: Histogram,
    pub queue_tokens: Gauge,
    pub queue_requests: Gauge,
    pub in_flight: Gauge,
}

fn seconds() -> Histogram {
    // 1 ms to about 65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

impl ServeMetrics {
    pub fn new() -> ServeMetrics {
        let mut r = Registry::with_prefix("ragline");
        let m = ServeMetrics {
            registry: Arc::new(Mutex::new(Registry::default())),
            requests: Family::default(),
            inputs: Family::default(),
            tokens: Family::default(),
            errors: Family::default(),
            request_seconds: Family::new_with_constructor(seconds),
            queue_seconds: seconds(),
            compute_seconds: seconds(),
            batch_inputs: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            batch_tokens: Histogram::new(exponential_buckets(16.0, 2.0, 16)),
            window_requests: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            queue_tokens: Gauge::default(),
            queue_requests: Gauge::default(),
            in_flight: Gauge::default(),
        };
        m.register_requests(&mut r);
        m.register_batching(&mut r);
        *m.registry.lock().unwrap_or_else(|e| e.into_inner()) = r;
        m
    }

    /// Register in `r` what is counted per request: requests, inputs, tokens, errors and
    /// their durations.
    fn register_requests(&self, r: &mut Registry) {
        r.register(
            "requests",
            "HTTP requests by endpoint and status code",
            self.requests.clone(),
        );
        r.register("inputs", "Texts embedded, by endpoint", self.inputs.clone());
        r.register(
            "tokens",
            "Tokens embedded (special tokens included), by endpoint",
            self.tokens.clone(),
        );
        r.register(
            "errors",
            "Requests answered with an error, by kind (bad_request, overloaded, too_long, \
             model, shutting_down)",
            self.errors.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from a request's arrival to its answer",
            self.request_seconds.clone(),
        );
    }

    /// Register in `r` how requests wait and are batched: queue and window durations and
    /// sizes, and what waits or is in flight.
    fn register_batching(&self, r: &mut Registry) {
        r.register(
            "queue_duration_seconds",
            "Time a request waited for a model thread",
            self.queue_seconds.clone(),
        );
        r.register(
            "window_duration_seconds",
            "Time a model thread spent on one window of requests",
            self.compute_seconds.clone(),
        );
        r.register(
            "batch_inputs",
            "Inputs per forward pass",
            self.batch_inputs.clone(),
        );
        r.register(
            "window_tokens",
            "Tokens per window (the requests embedded together)",
            self.batch_tokens.clone(),
        );
        r.register(
            "window_requests",
            "Requests embedded together in one window",
            self.window_requests.clone(),
        );
        r.register(
            "queue_tokens",
            "Tokens waiting for a model thread",
            self.queue_tokens.clone(),
        );
        r.register(
            "queue_requests",
            "Requests waiting for a model thread",
            self.queue_requests.clone(),
        );
        r.register(
            "in_flight_requests",
            "Requests being handled",
            self.in_flight.clone(),
        );
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        encode(&mut out, &r).expect("writing to a String cannot fail");
        out
    }

    pub fn observe_request(&self, endpoint: &str, status: u16, took: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.to_string(),
                status: status.to_string(),
            })
            .inc();
        self.request_seconds
            .get_or_create(&EndpointLabels {
                endpoint: endpoint.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&KindLabels {
                kind: kind.to_string(),
            })
            .inc();
    }
}

impl Default for ServeMetrics {
    fn default() -> Self {
        ServeMetrics::new()
    }
}

/// Serve `render()` at `GET /metrics` on `addr` from a thread of its own, for a process that
/// is not a server otherwise (`ragline enrich --follow --metrics-addr`). Returns the address
/// bound (port 0 picks one).
pub fn serve_metrics(
    addr: SocketAddr,
    render: Arc<dyn Fn() -> String + Send + Sync>,
) -> Result<SocketAddr, super::ServeError> {
    use super::ServeError;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ServeError::start("the metrics server", e))?;
    let listen = |source| ServeError::Listen {
        addr: format!("--metrics-addr {addr}"),
        source,
    };
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .map_err(listen)?;
    let bound = listener.local_addr().map_err(listen)?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            let app = axum::Router::new().route(
                "/metrics",
                axum::routing::get(move || {
                    let render = Arc::clone(&render);
                    async move {
                        // Rendering reads the index: off the runtime's thread.
                        let body = tokio::task::spawn_blocking(move || render())
                            .await
                            .unwrap_or_else(|e| format!("# metrics failed: {e}\n"));
                        ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], body)
                    }
                }),
            );
            let _ = rt.block_on(async move { axum::serve(listener, app).await });
        })
        .map_err(|e| ServeError::start("the metrics thread", e))?;
    Ok(bound)
}
