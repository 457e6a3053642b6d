//! What `ragline enrich --metrics-addr ADDR` exposes at `GET /metrics` (Prometheus), so a
//! long-running enrichment can be watched: per stage, the documents in each status (the
//! queue's depth, the dead letters), whether it is paused or its service's circuit is open;
//! what this process did (documents done and failed, chunks and tokens embedded); and, per
//! service, requests, retries, 429s, errors and tokens sent.

use std::sync::{Arc, Mutex};

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::http::Endpoint;
use crate::indexers::IndexUri;
use crate::run::progress::{Observer, Snapshot};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageStatus {
    stage: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Call {
    stage: String,
    kind: String,
}

/// This process's numbers, as the last progress tick had them.
#[derive(Clone, Debug, Default)]
struct Progress {
    claimed: u64,
    done: u64,
    failed: u64,
    vectors: u64,
    chunks_embedded: u64,
    tokens_embedded: u64,
}

/// The state behind an enrich process's `/metrics`.
pub struct EnrichMetrics {
    uri: IndexUri,
    progress: Mutex<Progress>,
    endpoints: Mutex<Vec<(String, Arc<Endpoint>)>>,
}

impl EnrichMetrics {
    pub fn new(uri: IndexUri) -> Arc<EnrichMetrics> {
        Arc::new(EnrichMetrics {
            uri,
            progress: Mutex::default(),
            endpoints: Mutex::default(),
        })
    }

    /// Count the calls of a stage's service.
    pub fn endpoint(&self, stage: &str, endpoint: &Arc<Endpoint>) {
        self.endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((stage.to_string(), Arc::clone(endpoint)));
    }

    /// An observer that keeps the numbers of each progress tick.
    pub fn observer(self: &Arc<Self>) -> Box<dyn Observer> {
        Box::new(Tick(Arc::clone(self)))
    }

    /// The exposition: the index's lifecycle as it is now, and this process's numbers.
    pub fn render(&self) -> String {
        let mut r = Registry::with_prefix("ragline");
        self.register_index(&mut r);
        self.register_progress(&mut r);
        self.register_calls(&mut r);
        let mut out = String::new();
        encode(&mut out, &r).expect("writing to a String cannot fail");
        out
    }

    /// The index's lifecycle, read at this scrape: documents by stage and status, paused
    /// stages, open circuits, the oldest waiting document, and whether the index answered.
    fn register_index(&self, r: &mut Registry) {
        let documents = Family::<StageStatus, Gauge>::default();
        let paused = Family::<StageLabel, Gauge>::default();
        let circuit = Family::<StageLabel, Gauge>::default();
        let oldest = Family::<StageLabel, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let waiting = Family::<StageLabel, Gauge>::default();
        let up = Gauge::<i64>::default();
        match crate::indexers::open_store(&self.uri).and_then(|mut s| s.status()) {
            Ok(status) => {
                up.set(1);
                for (stage, c) in &status.stages {
                    for (name, n) in [
                        ("pending", c.pending),
                        ("in_progress", c.in_progress),
                        ("failed", c.failed),
                        ("dead", c.dead),
                        ("done", c.done),
                    ] {
                        documents
                            .get_or_create(&StageStatus {
                                stage: stage.clone(),
                                status: name.into(),
                            })
                            .set(n as i64);
                    }
                    let label = StageLabel {
                        stage: stage.clone(),
                    };
                    paused.get_or_create(&label).set(i64::from(c.paused));
                    circuit
                        .get_or_create(&label)
                        .set(i64::from(c.circuit.is_some()));
                    oldest
                        .get_or_create(&label)
                        .set(c.oldest_pending_secs.unwrap_or(0.0));
                    waiting
                        .get_or_create(&label)
                        .set(c.waiting_on_dependency as i64);
                }
            }
            Err(e) => {
                up.set(0);
                tracing::warn!("/metrics cannot read {}: {e}", self.uri);
            }
        }
        r.register(
            "stage_documents",
            "Documents of the index by stage and status (pending + failed + in_progress is the \
             queue; dead is the dead-letter queue)",
            documents,
        );
        r.register("stage_paused", "1 while a stage is paused", paused);
        r.register(
            "stage_circuit_open",
            "1 while the circuit of a stage's service is open",
            circuit,
        );
        r.register(
            "stage_oldest_pending_seconds",
            "How long the oldest waiting document of a stage has waited",
            oldest,
        );
        r.register(
            "stage_waiting_on_dependency",
            "Waiting documents of a stage whose dependencies (depends_on) are not done yet",
            waiting,
        );
        r.register("index_up", "1 when the index answered this scrape", up);
    }

    /// What this process has done: documents claimed, done and failed; chunks, vectors and
    /// tokens.
    fn register_progress(&self, r: &mut Registry) {
        let p = self
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let outcomes = Family::<Outcome, Counter>::default();
        for (name, n) in [
            ("claimed", p.claimed),
            ("done", p.done),
            ("failed", p.failed),
        ] {
            outcomes
                .get_or_create(&Outcome {
                    outcome: name.into(),
                })
                .inc_by(n);
        }
        r.register(
            "enrich_documents",
            "Documents this process claimed, finished and failed (failures retry)",
            outcomes,
        );
        for (name, help, n) in [
            (
                "enrich_chunks_embedded",
                "Chunks this process embedded",
                p.chunks_embedded,
            ),
            (
                "enrich_vectors_written",
                "Vectors this process wrote (embedded or reused)",
                p.vectors,
            ),
            (
                "enrich_tokens_embedded",
                "Tokens this process embedded",
                p.tokens_embedded,
            ),
        ] {
            let counter = Counter::<u64>::default();
            counter.inc_by(n);
            r.register(name, help, counter);
        }
    }

    /// Calls to services by stage and kind.
    fn register_calls(&self, r: &mut Registry) {
        let calls = Family::<Call, Counter>::default();
        for (stage, e) in self
            .endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let c = e.stats().snapshot();
            for (kind, n) in [
                ("request", c.requests),
                ("retry", c.retries),
                ("throttled", c.throttled),
                ("server_error", c.server_errors),
                ("no_answer", c.transport_errors),
                ("malformed", c.malformed),
                ("rejected", c.rejected),
                ("token", c.tokens_sent),
                ("circuit_opened", c.circuit_opened),
            ] {
                calls
                    .get_or_create(&Call {
                        stage: stage.clone(),
                        kind: kind.into(),
                    })
                    .inc_by(n);
            }
        }
        r.register(
            "service_calls",
            "Calls to services by stage and kind: requests, retries, 429s (throttled), 5xx, \
             requests without an answer, malformed answers, refused inputs, tokens sent, \
             circuit openings",
            calls,
        );
    }
}

impl std::fmt::Debug for EnrichMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnrichMetrics")
            .field("index", &self.uri.to_string())
            .finish_non_exhaustive()
    }
}

struct Tick(Arc<EnrichMetrics>);

impl Observer for Tick {
    fn tick(&mut self, s: &Snapshot<'_>) {
        let mut p = self.0.progress.lock().unwrap_or_else(|e| e.into_inner());
        *p = Progress {
            claimed: s.counts.published,
            done: s.counts.indexed,
            failed: s.counts.failed,
            vectors: s.counts.children_indexed,
            chunks_embedded: s.stats.chunks(),
            tokens_embedded: s.stats.tokens(),
        };
    }
}

/// Two observers as one (the progress display and the metrics).
pub struct Both(pub Box<dyn Observer>, pub Box<dyn Observer>);

impl Observer for Both {
    fn tick(&mut self, s: &Snapshot<'_>) {
        self.0.tick(s);
        self.1.tick(s);
    }

    fn finish(&mut self) {
        self.0.finish();
        self.1.finish();
    }
}
