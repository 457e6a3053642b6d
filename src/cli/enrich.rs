//! `ragline enrich`: work the index's lifecycle queue.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use ragline::jobs::{self, EnrichRequest, PipelineConfig, Progress};
use ragline::run::RunSummary;

use super::ingest::write_report;
use super::model_args::ModelArgs;
use super::{EXIT_FAILURES, EXIT_OK};

#[derive(Args, Debug)]
pub struct EnrichArgs {
    /// The index whose queue to work (sqlite://PATH or postgres://...). [default: sqlite://ragline.db]
    #[arg(long, env = "RAGLINE_INDEX")]
    pub(super) index: Option<String>,

    /// The stage to work: embed, sparse, or an LLM stage of ragline.toml. [default: every
    /// stage the index has: embed, and sparse once it has a sparse model]
    #[arg(long)]
    pub(super) stage: Option<String>,

    /// Keep running: pick up new work as it arrives, until stopped.
    #[arg(long)]
    pub(super) follow: bool,

    /// Write the summary and every failure as JSON (the fields of ingest's report).
    #[arg(long)]
    pub(super) report: Option<PathBuf>,

    /// Progress display: auto (bars on a terminal, log lines otherwise), bars, log, none.
    #[arg(long)]
    pub(super) progress: Option<Progress>,

    /// The sparse stage's SPLADE model (a folder, a name under models/, a hub id): the
    /// first time, to give an index sparse vectors (`--stage sparse`); later, another model
    /// computes every document's sparse vectors again. [default: the one the index records]
    #[arg(long, value_name = "MODEL")]
    pub(super) sparse_model: Option<String>,

    /// The entities stage's token-classification model ([stages.entities] model); another
    /// model than the last finds every document's entities again.
    #[arg(long, value_name = "MODEL")]
    pub(super) ner_model: Option<String>,

    /// The labels stage's sequence-classification model ([stages.labels] model); another
    /// model than the last labels every document again.
    #[arg(long, value_name = "MODEL")]
    pub(super) classifier_model: Option<String>,

    /// Worker threads (one per device for several GPUs). [default: 1]
    #[arg(long)]
    pub(super) concurrency: Option<usize>,

    /// The model comes from the index; --model names where to load it from when the folder
    /// the index recorded is gone (it must be the same model). Device and batch flags apply.
    #[command(flatten)]
    pub(super) model: ModelArgs,

    /// Embed with a service (an index embedded by one uses it again without these flags).
    #[command(flatten)]
    pub(super) remote: super::remote_args::RemoteArgs,

    /// Serve Prometheus metrics at http://ADDR/metrics while enrich runs (with --follow, for
    /// as long as it follows): documents per stage and status (the queue's depth, the dead
    /// letters), paused stages and open circuits, what this process did, and the calls to
    /// services (requests, retries, 429s, errors, tokens). Port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    pub(super) metrics_addr: Option<std::net::SocketAddr>,

    /// Take the work through a NATS JetStream broker instead of claiming it from the index:
    /// each enrich process (on any machine, same URL and index) feeds the broker from the
    /// index's queue, highest priority first, and works what the broker hands it; a subject
    /// per stage and priority level (`<prefix>.lifecycle.<stage>.<interactive|fresh|backfill>`),
    /// AckWait = the stage's visibility timeout, MaxDeliver = its retry limit.
    /// nats://HOST:PORT[,nats://...][?prefix=NAME&replicas=N&max_pending=N&limit=N&limit_mb=N].
    #[arg(long, value_name = "URL")]
    pub(super) queue: Option<String>,
}

impl EnrichArgs {
    pub(super) fn apply(&self, config: &mut PipelineConfig) -> anyhow::Result<EnrichRequest> {
        super::apply_index(config, &self.index)?;
        let mut model = self.model.clone();
        let name = model.model.take();
        model.apply(&mut config.model);
        self.remote.apply(config)?;
        if let Some(p) = self.progress {
            config.run.progress = p;
        }
        if let Some(n) = self.concurrency {
            config.stages.embed.concurrency = n;
        }
        if let Some(m) = &self.sparse_model {
            config.stages.sparse.model = Some(m.clone());
        }
        if let Some(m) = &self.ner_model {
            config.stages.entities.model = Some(m.clone());
        }
        if let Some(m) = &self.classifier_model {
            config.stages.labels.model = Some(m.clone());
        }
        Ok(EnrichRequest {
            stages: self.stage.iter().cloned().collect(),
            follow: self.follow,
            model_override: name,
            metrics: None,
            queue: self.queue.clone(),
        })
    }
}

pub fn run(args: EnrichArgs, config_file: Option<&Path>) -> anyhow::Result<ExitCode> {
    let mut config = super::load_config(config_file)?;
    let request = args.apply(&mut config)?;
    if let Some(report) = &args.report {
        std::fs::File::create(report)
            .with_context(|| format!("cannot write --report {}", report.display()))?;
    }
    let mut request = request;
    let mut observer = super::observer(config.run.progress);
    if let Some(addr) = args.metrics_addr {
        let metrics = jobs::metrics::EnrichMetrics::new(config.index.uri.value.clone());
        let render = {
            let m = std::sync::Arc::clone(&metrics);
            std::sync::Arc::new(move || m.render())
        };
        super::metrics_server(addr, render, "enrich --metrics-addr")?;
        observer = Box::new(jobs::metrics::Both(observer, metrics.observer()));
        request.metrics = Some(metrics);
    }
    let summary = jobs::enrich(&config, &request, observer.as_mut())?;
    print_enrich_summary(&mut std::io::stdout().lock(), &summary)?;
    write_report(args.report.as_deref(), &summary)?;
    Ok(enrich_exit_code(&summary))
}

/// 0 when every document this run worked ended done; 1 when any ended failed or dead (a
/// document that failed once and then succeeded counts as done).
pub(super) fn enrich_exit_code(summary: &RunSummary) -> ExitCode {
    ExitCode::from(if summary.counts.failed == 0 {
        EXIT_OK
    } else {
        EXIT_FAILURES
    })
}

/// The end of an enrich (or backfill) run.
pub(super) fn print_enrich_summary(out: &mut dyn Write, s: &RunSummary) -> anyhow::Result<()> {
    let c = &s.counts;
    writeln!(
        out,
        "enriched {} in {:.1}s: {} documents claimed, {} done, {} failed",
        s.index, s.elapsed_secs, c.published, c.indexed, c.failed
    )?;
    writeln!(
        out,
        "chunks: {} embedded, {} reused, {} vectors written, {} failed; {} tokens embedded \
         ({:.0} tokens/s, {:.1}% padding)",
        s.chunks_embedded,
        s.chunks_reused,
        c.children_indexed,
        c.children_failed,
        s.tokens_embedded,
        s.tokens_per_sec,
        s.padding_ratio * 100.0
    )?;
    for note in &s.notes {
        writeln!(out, "note: {note}")?;
    }
    const SHOWN: usize = 20;
    for o in s.failures.iter().take(SHOWN) {
        writeln!(out, "  failed: {} [{}] {}", o.id, o.stage, o.reason)?;
    }
    if s.failures.len() > SHOWN {
        writeln!(
            out,
            "  ... and {} more failed (see --report, `ragline dlq list`)",
            s.failures.len() - SHOWN
        )?;
    }
    Ok(())
}
