//! `ragline ingest PATH...`

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use ragline::jobs::{self, IngestRequest, PipelineConfig};
use ragline::run::RunSummary;

use super::{EXIT_FAILURES, EXIT_OK};

/// `ragline ingest`: the request the library runs, and the CLI's own way of repeating it.
#[derive(Args, Debug, Clone, Default)]
pub struct IngestArgs {
    #[command(flatten)]
    pub(super) request: IngestRequest,

    /// Keep the index in sync: after the run, ingest again every --poll-interval seconds
    /// (each pass is incremental: unchanged documents cost a look-up; with --prune, what left
    /// the source leaves the index) until the process is stopped. A pass that fails after
    /// the first is reported and tried again at the next interval.
    #[arg(long, conflicts_with = "queue")]
    pub(super) follow: bool,

    /// Seconds between the passes of --follow.
    #[arg(long, value_name = "SECS", default_value_t = 30, requires = "follow",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) poll_interval: u64,

    /// With --follow, serve Prometheus metrics at http://ADDR/metrics: the passes, the
    /// documents they indexed and failed, and each Kafka topic's consumer lag (the records
    /// after its group's committed offsets, `ragline_source_lag_records`). Port 0 picks one.
    #[arg(long, value_name = "ADDR", requires = "follow")]
    pub(super) metrics_addr: Option<std::net::SocketAddr>,
}

pub fn run(args: IngestArgs, config_file: Option<&Path>) -> anyhow::Result<ExitCode> {
    let config = args.request.config(config_file)?;
    args.request.check_report()?;
    // Listening before the first pass: a change made during it is not missed.
    let mut changes = args.follow.then(|| Changes::open(&config));
    if let (Some(changes), Some(addr)) = (changes.as_mut(), args.metrics_addr) {
        changes.metrics = Some(FollowMetrics::serve(addr)?);
    }
    let mut observer = super::observer(config.run.progress);
    let summary = jobs::request::ingest(&args.request, &config, observer.as_mut())?;
    print_summary(&mut std::io::stdout().lock(), &summary, config.index.prune)?;
    if let Some(changes) = changes {
        if let Some(m) = &changes.metrics {
            m.pass(&summary);
        }
        follow(&args, &config, changes);
    }
    Ok(exit_code(&summary))
}

/// `--follow`: a pass every `--poll-interval` seconds, for as long as the process runs, or as
/// soon as a PostgreSQL table with `notify=CHANNEL` gets a notification on it. A failed pass
/// (the database away a moment) is reported and the next one tried.
fn follow(args: &IngestArgs, config: &PipelineConfig, mut changes: Changes) {
    let every = std::time::Duration::from_secs(args.poll_interval);
    loop {
        changes.wait(config, every);
        let mut observer = super::observer(config.run.progress);
        match jobs::request::ingest(&args.request, config, observer.as_mut()) {
            Ok(summary) => {
                if let Some(m) = &changes.metrics {
                    m.pass(&summary);
                }
                let _ = print_summary(&mut std::io::stdout().lock(), &summary, config.index.prune);
            }
            Err(e) => tracing::warn!(
                "--follow: this pass failed ({e:#}); the next one starts in {} s",
                args.poll_interval
            ),
        }
    }
}

/// What `--follow` waits on between passes: the LISTEN connections of the tables with
/// `notify=`, opened again after a failure; the consumers of broker subjects (a pass starts
/// as soon as one has messages waiting); else the poll interval alone.
#[derive(Default)]
struct Changes {
    #[cfg(feature = "postgres")]
    listeners: Option<Vec<ragline::connectors::sql::postgres::Listener>>,
    #[cfg(feature = "nats")]
    subjects: Option<Vec<ragline::connectors::nats::Waiter>>,
    #[cfg(feature = "kafka")]
    topics: Option<Vec<ragline::connectors::kafka::Waiter>>,
    /// `--metrics-addr`'s numbers.
    metrics: Option<std::sync::Arc<FollowMetrics>>,
}

/// What `ingest --follow --metrics-addr` serves.
#[derive(Default)]
struct FollowMetrics {
    passes: std::sync::atomic::AtomicU64,
    indexed: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicU64,
    /// Each Kafka topic's lag as last asked, by its URL.
    lag: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl FollowMetrics {
    /// Serve the metrics on `addr` (says where on stderr).
    fn serve(addr: std::net::SocketAddr) -> anyhow::Result<std::sync::Arc<FollowMetrics>> {
        let metrics = std::sync::Arc::new(FollowMetrics::default());
        let render = {
            let m = std::sync::Arc::clone(&metrics);
            std::sync::Arc::new(move || m.render())
        };
        super::metrics_server(addr, render, "ingest --metrics-addr")?;
        Ok(metrics)
    }

    fn pass(&self, summary: &RunSummary) {
        use std::sync::atomic::Ordering::Relaxed;
        self.passes.fetch_add(1, Relaxed);
        self.indexed.fetch_add(summary.counts.indexed, Relaxed);
        self.failed.fetch_add(summary.counts.failed, Relaxed);
    }

    #[cfg(feature = "kafka")]
    fn set_lag(&self, source: &str, lag: u64) {
        self.lag
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(source.to_string(), lag);
    }

    /// Prometheus's text format.
    fn render(&self) -> String {
        use std::fmt::Write as _;
        use std::sync::atomic::Ordering::Relaxed;
        let mut out = String::new();
        for (name, help, value) in [
            (
                "ragline_follow_passes_total",
                "Passes of ingest --follow.",
                &self.passes,
            ),
            (
                "ragline_follow_documents_indexed_total",
                "Documents the passes indexed.",
                &self.indexed,
            ),
            (
                "ragline_follow_documents_failed_total",
                "Documents the passes failed.",
                &self.failed,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", value.load(Relaxed));
        }
        let lag = self.lag.lock().unwrap_or_else(|e| e.into_inner());
        if !lag.is_empty() {
            out.push_str(
                "# HELP ragline_source_lag_records Records after the consumer group's committed \
                 offsets.\n# TYPE ragline_source_lag_records gauge\n",
            );
            for (source, n) in lag.iter() {
                let source = source.replace('\\', "\\\\").replace('"', "\\\"");
                let _ = writeln!(out, "ragline_source_lag_records{{source=\"{source}\"}} {n}");
            }
        }
        out
    }
}

/// How often `--follow` asks a broker subject's consumer whether messages wait.
#[cfg(any(feature = "nats", feature = "kafka"))]
const SUBJECT_CHECK: std::time::Duration = std::time::Duration::from_millis(250);

impl Changes {
    fn open(config: &PipelineConfig) -> Changes {
        let mut changes = Changes::default();
        changes.listen(config);
        changes
    }

    /// Wait for a change or `every`: with broker subjects, in short steps, asking their
    /// consumers between them.
    fn wait(&mut self, config: &PipelineConfig, every: std::time::Duration) {
        #[cfg(any(feature = "nats", feature = "kafka"))]
        {
            if self.open_streams(config) {
                let deadline = std::time::Instant::now() + every;
                loop {
                    if self.messages_waiting() {
                        return;
                    }
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return;
                    }
                    if self.wait_tables(config, left.min(SUBJECT_CHECK)) {
                        return;
                    }
                }
            }
        }
        self.wait_tables(config, every);
    }

    /// Open what the passes wait on of broker subjects and Kafka topics: whether there are any.
    #[cfg(any(feature = "nats", feature = "kafka"))]
    fn open_streams(&mut self, config: &PipelineConfig) -> bool {
        let mut any = false;
        #[cfg(feature = "nats")]
        {
            if self.subjects.is_none() {
                match ragline::jobs::ingest::subject_waiters(config) {
                    Ok(w) => self.subjects = Some(w),
                    Err(e) => tracing::warn!("--follow: {e}; polling instead"),
                }
            }
            any |= self.subjects.as_ref().is_some_and(|w| !w.is_empty());
        }
        #[cfg(feature = "kafka")]
        {
            if self.topics.is_none() {
                match ragline::jobs::ingest::topic_waiters(config) {
                    Ok(w) => self.topics = Some(w),
                    Err(e) => tracing::warn!("--follow: {e}; polling instead"),
                }
            }
            any |= self.topics.as_ref().is_some_and(|w| !w.is_empty());
        }
        any
    }

    /// Whether a broker subject's consumer has messages waiting, or a Kafka topic's group
    /// records to read (its lag, logged); one that cannot be asked is opened again at the
    /// next wait.
    #[cfg(any(feature = "nats", feature = "kafka"))]
    fn messages_waiting(&mut self) -> bool {
        #[cfg(feature = "kafka")]
        if let Some(waiters) = self.topics.as_mut() {
            let mut waiting = false;
            for w in waiters.iter_mut() {
                match w.lag() {
                    Ok(lag) => {
                        if let Some(m) = &self.metrics {
                            m.set_lag(w.shown(), lag);
                        }
                        if lag > 0 {
                            tracing::info!("--follow: {}: lag {lag} records", w.shown());
                            waiting = true;
                        }
                    }
                    Err(e) => {
                        tracing::warn!("--follow: {e}; asking again");
                        self.topics = None;
                        return false;
                    }
                }
            }
            if waiting {
                return true;
            }
        }
        #[cfg(feature = "nats")]
        return self.subjects_waiting();
        #[cfg(not(feature = "nats"))]
        false
    }

    /// Whether a broker subject's consumer has messages waiting.
    #[cfg(feature = "nats")]
    fn subjects_waiting(&mut self) -> bool {
        let Some(waiters) = self.subjects.as_mut() else {
            return false;
        };
        for w in waiters.iter_mut() {
            match w.pending() {
                Ok(0) => {}
                Ok(_) => return true,
                Err(e) => {
                    tracing::warn!("--follow: {e}; asking again");
                    self.subjects = None;
                    return false;
                }
            }
        }
        false
    }

    #[cfg(feature = "postgres")]
    fn listen(&mut self, config: &PipelineConfig) {
        if self.listeners.is_none() {
            match ragline::jobs::ingest::change_listeners(config) {
                Ok(l) => self.listeners = Some(l),
                Err(e) => tracing::warn!("--follow: cannot listen ({e}); polling instead"),
            }
        }
    }

    #[cfg(not(feature = "postgres"))]
    fn listen(&mut self, _config: &PipelineConfig) {}

    /// Wait up to `every` for a table's notification: true when one came.
    #[cfg(feature = "postgres")]
    fn wait_tables(&mut self, config: &PipelineConfig, every: std::time::Duration) -> bool {
        self.listen(config);
        let Some(listeners) = self.listeners.as_mut().filter(|l| !l.is_empty()) else {
            std::thread::sleep(every);
            return false;
        };
        // The first table's channel is waited on; the others' notifications are taken
        // without waiting (any of them starts the pass).
        let (first, others) = listeners.split_at_mut(1);
        let mut outcome = first[0].wait(every);
        for l in others {
            outcome = match (outcome, l.wait(std::time::Duration::ZERO)) {
                (Ok(a), Ok(b)) => Ok(a || b),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        match outcome {
            Ok(notified) => notified,
            Err(e) => {
                tracing::warn!("--follow: {e}; listening again after the next pass");
                self.listeners = None;
                true
            }
        }
    }

    #[cfg(not(feature = "postgres"))]
    fn wait_tables(&mut self, _config: &PipelineConfig, every: std::time::Duration) -> bool {
        std::thread::sleep(every);
        false
    }
}

/// 0 when every document got through, 1 when any failed.
pub(super) fn exit_code(summary: &RunSummary) -> ExitCode {
    ExitCode::from(if summary.succeeded() {
        EXIT_OK
    } else {
        EXIT_FAILURES
    })
}

pub(super) fn write_report(path: Option<&Path>, summary: &RunSummary) -> anyhow::Result<()> {
    if let Some(report) = path {
        let json = serde_json::to_vec_pretty(summary)?;
        std::fs::write(report, json)
            .with_context(|| format!("cannot write --report {}", report.display()))?;
    }
    Ok(())
}

pub(super) fn print_summary(
    out: &mut dyn Write,
    s: &RunSummary,
    pruned: bool,
) -> anyhow::Result<()> {
    let c = &s.counts;
    writeln!(
        out,
        "ingested into {} in {:.1}s: {} documents published, {} indexed ({} unchanged), \
         {} failed, {} dropped",
        s.index, s.elapsed_secs, c.published, c.indexed, c.unchanged, c.failed, c.dropped
    )?;
    if c.redelivered > 0 {
        writeln!(
            out,
            "redelivered: {} documents and chunks were delivered again after a process died \
             or timed out holding them (counted once each)",
            c.redelivered
        )?;
    }
    if c.children_created > 0 || c.unchanged > 0 {
        writeln!(
            out,
            "chunks: {} created, {} embedded, {} reused, {} indexed, {} failed, {} dropped; \
             {} tokens embedded ({:.0} tokens/s, {:.1}% padding{})",
            c.children_created,
            s.chunks_embedded,
            s.chunks_reused,
            c.children_indexed,
            c.children_failed,
            c.children_dropped,
            s.tokens_embedded,
            s.tokens_per_sec,
            s.padding_ratio * 100.0,
            s.encoder
                .as_deref()
                .map(|e| format!("; {e}"))
                .unwrap_or_default()
        )?;
    }
    if let Some(f) = &s.fetched {
        writeln!(
            out,
            "downloaded: {} items, {:.1} MB (unchanged items are known by their version and \
             not downloaded)",
            f.items,
            f.bytes as f64 / 1e6
        )?;
    }
    print_missing(out, s, pruned)?;
    for note in &s.notes {
        writeln!(out, "note: {note}")?;
    }
    print_outcomes(out, s)
}

/// The documents gone from the source (the first five), pruned or still in the index.
fn print_missing(out: &mut dyn Write, s: &RunSummary, pruned: bool) -> anyhow::Result<()> {
    if !s.missing_from_source.is_empty() {
        // A source that deletes (a Kafka tombstone) prunes without --prune.
        let what = if pruned || s.pruned > 0 {
            format!("{} pruned from the index", s.pruned)
        } else {
            "still in the index (--prune deletes them)".to_string()
        };
        writeln!(
            out,
            "{} documents are no longer in the source, {what}: {}{}",
            s.missing_from_source.len(),
            s.missing_from_source
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            if s.missing_from_source.len() > 5 {
                ", ..."
            } else {
                ""
            }
        )?;
    }
    Ok(())
}

/// Outcomes of each kind the summary lists.
const SHOWN: usize = 20;

/// The failed, dropped, unreadable and warned documents, the first [`SHOWN`] of each.
fn print_outcomes(out: &mut dyn Write, s: &RunSummary) -> anyhow::Result<()> {
    for (label, list) in [
        ("failed", &s.failures),
        ("dropped", &s.dropped),
        ("unreadable", &s.unreadable),
        ("warning", &s.warnings),
    ] {
        for o in list.iter().take(SHOWN) {
            writeln!(out, "  {label}: {} [{}] {}", o.id, o.stage, o.reason)?;
        }
        if list.len() > SHOWN {
            writeln!(
                out,
                "  ... and {} more {label} (see --report)",
                list.len() - SHOWN
            )?;
        }
    }
    Ok(())
}
