//! Command-line interface: one module per subcommand. Commands read ragline.toml (or
//! `--config FILE`), put their flags over it, and call the library's pipeline functions.

mod backfill;
mod bench;
mod check;
mod dlq;
mod embed;
mod enrich;
mod entities;
mod eval;
mod extract;
mod ingest;
mod labels;
mod model_args;
mod pause;
mod promote;
#[cfg(feature = "test-hooks")]
mod random_model;
mod remote_args;
mod rerank;
#[cfg(feature = "nats")]
mod role;
mod search;
#[cfg(feature = "serve")]
mod serve;
mod status;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ragline::jobs::{PipelineConfig, Progress};
use ragline::run::progress::{Bars, LogLines, Observer, Silent};

/// Every document reached the index (or was dropped with a reason).
pub const EXIT_OK: u8 = 0;
/// The run completed and some document failed.
pub const EXIT_FAILURES: u8 = 1;
/// Usage or setup error (bad flag, unwritable output, missing path or model), or a run that
/// could not complete.
pub const EXIT_SETUP: u8 = 2;

/// Turn document corpora into vector indexes for RAG.
#[derive(Parser)]
#[command(name = "ragline", version, about, max_term_width = 100)]
pub struct Cli {
    /// The pipeline file [default: ragline.toml in the working folder, when there is one].
    /// Flags override what it says.
    #[arg(long, global = true, env = "RAGLINE_CONFIG")]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Read documents, chunk them, embed the chunks and write them to an index.
    Ingest(Box<ingest::IngestArgs>),
    /// Work the index's queue: embed what a deferred or interrupted ingest left, retry what
    /// failed, fill a vector set being backfilled.
    Enrich(enrich::EnrichArgs),
    /// Move an index to another model without downtime: a second vector set, filled in the
    /// background; search switches to it when it is complete.
    Backfill(backfill::BackfillArgs),
    /// Where the index's documents stand in each stage, its vector sets and any backfill.
    Status(status::StatusArgs),
    /// The dead-letter queue: documents that failed as often as their stage allows.
    Dlq(dlq::DlqArgs),
    /// Stop workers from claiming a stage's work (they finish what they hold).
    Pause(pause::PauseArgs),
    /// Let workers claim a paused stage's work again.
    Resume(pause::PauseArgs),
    /// Embed these documents next (interactive priority).
    Promote(promote::PromoteArgs),
    /// Validate a pipeline file, open its index and load its model; print the resolved pipeline.
    Check(check::CheckArgs),
    /// Embed texts from a JSONL file into a .npy or JSONL file of vectors.
    Embed(embed::EmbedArgs),
    /// Show what ingest would extract from files (text, headings, pages, warnings), without
    /// a model or an index.
    Extract(extract::ExtractArgs),
    /// Search an index by meaning, keywords, or both.
    Search(search::SearchArgs),
    /// Score passages against a query with a cross-encoder (a reranker), best first.
    Rerank(rerank::RerankArgs),
    /// Named entities of the texts of a JSONL file (a token-classification model), as
    /// transformers' token-classification pipeline finds them.
    Ner(labels::NerArgs),
    /// Labels of the texts of a JSONL file (a sequence-classification model), as
    /// transformers' text-classification pipeline scores them.
    Classify(labels::ClassifyArgs),
    /// The entities of an index's documents with how many documents mention each (a facet;
    /// `--labels` for labels), or every (document, entity) edge for a knowledge graph.
    Entities(entities::EntitiesArgs),
    /// Measure retrieval quality on a BEIR dataset (nDCG@10, recall, MRR per mode).
    Eval(eval::EvalArgs),
    /// Measure embedding throughput on this host (tokens/s, padding, memory, chunker MB/s).
    Bench(bench::BenchArgs),
    /// An embeddings server: OpenAI's POST /v1/embeddings and TEI's POST /embed, batching
    /// requests from many clients together; GET /health, GET /metrics.
    #[cfg(feature = "serve")]
    Serve(serve::ServeArgs),
    /// Distributed runs: extract, chunk and tokenize the documents of the broker's runs.
    #[cfg(feature = "nats")]
    Worker(role::RoleArgs),
    /// Distributed runs: embed the chunks of the broker's runs on this host's devices.
    #[cfg(feature = "nats")]
    Embedder(role::EmbedderArgs),
    /// Distributed runs: write the broker's runs' documents and chunks to the index.
    #[cfg(feature = "nats")]
    Indexer(role::RoleArgs),
    /// Write a random-weight BERT in the Hugging Face layout (tests, speed measurements).
    #[cfg(feature = "test-hooks")]
    #[command(hide = true)]
    RandomModel(random_model::RandomModelArgs),
    /// The child process of `--isolate-extraction`: extracts the files its parent sends on
    /// standard input (not for direct use).
    #[command(hide = true, name = "extract-worker")]
    ExtractWorker,
}

/// The `ragline` command with these arguments (the first is the program's name), as the
/// binary runs it: diagnostics to stderr, output to stdout, the command's exit code. The
/// Python package's `ragline` console script calls it in process.
pub fn main<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    init_logging();
    ragline::stages::extract::budget::quiet_extraction_panics();
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and exit 0; usage errors exit 2.
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {err:#}");
            ExitCode::from(EXIT_SETUP)
        }
    }
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = cli.config.as_deref();
    match cli.command {
        Command::Ingest(args) => ingest::run(*args, config),
        Command::Enrich(args) => enrich::run(args, config),
        Command::Backfill(args) => backfill::run(args, config),
        Command::Status(args) => status::run(args, config),
        Command::Dlq(args) => dlq::run(args, config),
        Command::Pause(args) => pause::run(args, config, true),
        Command::Resume(args) => pause::run(args, config, false),
        Command::Promote(args) => promote::run(args, config),
        Command::Check(args) => check::run(args, config),
        Command::Embed(args) => embed::run(args, config),
        Command::Bench(args) => bench::run(args, config),
        #[cfg(feature = "serve")]
        Command::Serve(args) => serve::run(args, config),
        Command::Extract(args) => extract::run(args),
        Command::Search(args) => search::run(args, config),
        Command::Entities(args) => entities::run(args, config),
        Command::Rerank(args) => rerank::run(args),
        Command::Ner(args) => labels::run_ner(args),
        Command::Classify(args) => labels::run_classify(args),
        Command::Eval(args) => eval::run(args, config),
        #[cfg(feature = "nats")]
        Command::Worker(args) => {
            role::run(ragline::run::distributed::Role::Worker, args, None, config)
        }
        #[cfg(feature = "nats")]
        Command::Embedder(args) => role::run_embedder(args, config),
        #[cfg(feature = "nats")]
        Command::Indexer(args) => {
            role::run(ragline::run::distributed::Role::Indexer, args, None, config)
        }
        #[cfg(feature = "test-hooks")]
        Command::RandomModel(args) => random_model::run(args),
        Command::ExtractWorker => {
            ragline::stages::extract::isolate::serve(
                std::io::stdin().lock(),
                std::io::stdout().lock(),
            )?;
            Ok(ExitCode::from(EXIT_OK))
        }
    }
}

/// ragline.toml (or `--config`), or the defaults.
pub(crate) fn load_config(path: Option<&std::path::Path>) -> anyhow::Result<PipelineConfig> {
    Ok(PipelineConfig::load(path)?.0)
}

/// Put `--index` over the config.
pub(crate) fn apply_index(
    config: &mut PipelineConfig,
    index: &Option<String>,
) -> anyhow::Result<()> {
    if let Some(uri) = index {
        config.set_index(uri)?;
    }
    Ok(())
}

/// The progress display asked for. Log lines come every 5 s, or every
/// `RAGLINE_PROGRESS_EVERY_MS`.
/// Serve `render()` as Prometheus metrics at http://ADDR/metrics (`what` is the flag, for
/// the message of a build without the `serve` feature); says where on stderr.
pub(super) fn metrics_server(
    addr: std::net::SocketAddr,
    render: std::sync::Arc<dyn Fn() -> String + Send + Sync>,
    what: &str,
) -> anyhow::Result<()> {
    #[cfg(feature = "serve")]
    let bound = ragline::serve::metrics::serve_metrics(addr, render)?;
    #[cfg(not(feature = "serve"))]
    let bound: std::net::SocketAddr = {
        let _ = (render, addr);
        Err(ragline::jobs::JobError::NotBuilt {
            what: what.into(),
            feature: "serve",
        })?
    };
    #[cfg(feature = "serve")]
    let _ = what;
    eprintln!("metrics on http://{bound}/metrics");
    Ok(())
}

pub fn observer(choice: Progress) -> Box<dyn Observer> {
    let every = std::env::var("RAGLINE_PROGRESS_EVERY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(5), Duration::from_millis);
    match choice {
        Progress::Auto if std::io::stderr().is_terminal() => Box::new(Bars::new()),
        Progress::Auto | Progress::Log => Box::new(LogLines::new(every)),
        Progress::Bars => Box::new(Bars::new()),
        Progress::None => Box::new(Silent),
    }
}

/// ragline's diagnostics (`tracing`) go to stderr, as the CLI shows them: the library's notes
/// (target `ragline::note`: where the run embeds, a reconnection, a circuit) as plain lines,
/// warnings as `warning: ...`. RAGLINE_LOG (or RUST_LOG) takes tracing's directives instead
/// (`debug`, `ragline=debug`, `ragline::indexers=trace,info`); a bare level applies to the
/// libraries ragline uses too (their messages repeat what ragline reports, so they are off
/// otherwise).
fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(install_subscriber);
}

fn install_subscriber() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let asked = ["RAGLINE_LOG", "RUST_LOG"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .and_then(|l| l.parse::<Targets>().ok());
    let filter = asked.unwrap_or_else(|| {
        Targets::new()
            .with_target("ragline", LevelFilter::WARN)
            .with_target(ragline::NOTE, LevelFilter::INFO)
    });
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .event_format(Plain);
    // A host process (Python) may have installed its own subscriber: keep it.
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(filter)
        .try_init();
}

/// One line an event: its message and fields, after `warning: ` or `error: ` by level.
struct Plain;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Plain
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let prefix = match *event.metadata().level() {
            tracing::Level::ERROR => "error: ",
            tracing::Level::WARN => "warning: ",
            tracing::Level::INFO => "",
            _ => "debug: ",
        };
        writer.write_str(prefix)?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
