//! `ragline ingest PATH...`

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use ragline::jobs::{self, PipelineConfig, Progress};
use ragline::run::{Observer, RunSummary};

use super::model_args::ModelArgs;
use super::{EXIT_FAILURES, EXIT_OK};

#[derive(Args, Debug, Clone, Default)]
pub struct IngestArgs {
    /// Files and folders to ingest [default: `paths` under [source] in ragline.toml]. Folders
    /// are walked for .md, .markdown, .mdx, .html, .htm, .txt, .rst and .jsonl files (one
    /// document per line). A database table is a URL: 'sqlite://FILE?table=T&text=body' or
    /// 'postgres://user@host/db?table=T&id=id&text=title,body&updated=updated_at'; also
    /// s3://, gs://, az:// prefixes, http(s):// sites, sitemaps and feeds, and a NATS
    /// JetStream subject, 'nats://HOST:4222/docs.>' (README: Sources).
    pub(super) paths: Vec<PathBuf>,

    /// Where to write: sqlite://PATH (the embedded index: vectors, full text, incremental
    /// re-runs, the enrichment queue), jsonl:PATH (one JSON object per document or chunk),
    /// null: (discard). [default: sqlite://ragline.db]
    #[arg(long, env = "RAGLINE_INDEX")]
    pub(super) index: Option<String>,

    /// Leave a stage to `ragline enrich`: `--defer embed` writes documents and chunks
    /// (searchable by keyword at once) and queues their embedding.
    #[arg(long, value_name = "STAGE")]
    pub(super) defer: Option<String>,

    /// Also give every chunk a sparse (SPLADE) vector from this model (a folder, a name under
    /// models/, a hub id; `scripts/fetch-model.sh splade-tiny`), for `search --mode sparse`
    /// and `--fuse dense,sparse,keyword`: the `sparse` stage, worked after the chunks are
    /// written (queued for `ragline enrich` with --defer embed). The index records the model.
    #[arg(long, value_name = "MODEL")]
    pub(super) sparse_model: Option<String>,

    /// Also find the named entities of every document with this token-classification model
    /// (a `*ForTokenClassification` folder, name under models/ or hub id): the `entities`
    /// stage (`[stages.entities]`), for `search --where entity.ORG=...` and `ragline entities`.
    #[arg(long, value_name = "MODEL")]
    pub(super) ner_model: Option<String>,

    /// Also label every document with this sequence-classification model (a
    /// `*ForSequenceClassification` model): the `labels` stage (`[stages.labels]`), for
    /// `search --where label=...`.
    #[arg(long, value_name = "MODEL")]
    pub(super) classifier_model: Option<String>,

    /// Delete from the index the documents whose source is gone, and the vectors of a model a
    /// finished migration retired.
    #[arg(long)]
    pub(super) prune: bool,

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

    /// The approximate nearest-neighbour index of a sqlite:// index, kept by the indexers as
    /// they write: `auto` builds it once a vector set passes 50,000 chunks, `hnsw` always,
    /// `none` never (and drops one). Recorded in the index for later runs. [default: auto]
    #[arg(long, value_name = "auto|hnsw|none")]
    pub(super) ann: Option<ragline::indexers::ann::AnnMode>,

    /// What the ANN stores: f16 (2 bytes a dimension), int8 (1) or binary (1 bit); answers
    /// are re-scored against the f32 vectors either way. [default: f16]
    #[arg(long, value_name = "f16|int8|binary")]
    pub(super) ann_dtype: Option<ragline::indexers::ann::AnnDtype>,

    /// CPU worker threads (extract, chunk, tokenize) [default: the number of cores].
    #[arg(long)]
    pub(super) workers: Option<usize>,

    /// Indexer threads writing to the index. [default: 1; 2 for postgres://, where one
    /// writer leaves the server waiting on it]
    #[arg(long)]
    pub(super) indexers: Option<usize>,

    /// Write the summary and every failure and drop (document, stage, reason) as JSON.
    #[arg(long)]
    pub(super) report: Option<PathBuf>,

    /// Index whole documents: no chunking, no embedding, no model needed.
    #[arg(long)]
    pub(super) no_chunk: bool,

    /// Chunk size to aim for, in model tokens (at most the model's limit). [default: 256]
    #[arg(long)]
    pub(super) chunk_tokens: Option<usize>,

    /// Tokens shared by consecutive chunks of a section. [default: 32]
    #[arg(long)]
    pub(super) chunk_overlap: Option<usize>,

    /// One chunk per document, its first tokens up to the model's limit; the rest is not
    /// indexed (what sentence-transformers' encode does with long texts).
    #[arg(long)]
    pub(super) truncate: bool,

    #[command(flatten)]
    pub(super) model: ModelArgs,

    #[command(flatten)]
    pub(super) remote: super::remote_args::RemoteArgs,

    /// File extensions to take from folders (comma-separated), instead of the default list.
    #[arg(long, value_delimiter = ',')]
    pub(super) ext: Vec<String>,

    /// Globs (relative to each folder given) of files to take, instead of the extension list.
    #[arg(long)]
    pub(super) include: Vec<String>,

    /// Globs (relative to each folder given) of files to leave out.
    #[arg(long)]
    pub(super) exclude: Vec<String>,

    /// Files larger than this many bytes are reported as failed instead of read.
    /// [default: 104857600]
    #[arg(long)]
    pub(super) max_file_bytes: Option<u64>,

    /// Feeds (http:// and https:// URLs): index the page each entry links to (on the feed's
    /// own host) instead of the entry's content.
    #[arg(long)]
    pub(super) follow_links: bool,

    /// Web crawls (an http:// or https:// URL of an HTML page): how many links from the start
    /// page are followed (0: the start page only). [default: 5]
    #[arg(long, value_name = "N")]
    pub(super) crawl_depth: Option<u32>,

    /// Web crawls and sitemaps: read at most this many pages. [default: 10000]
    #[arg(long, value_name = "N")]
    pub(super) crawl_max_pages: Option<usize>,

    /// Web crawls and sitemaps: requests per second to the site (robots.txt's Crawl-delay
    /// slows it further). [default: 8]
    #[arg(long, value_name = "R")]
    pub(super) crawl_rps: Option<f64>,

    /// Web sources: seconds one GET may take; a page past it fails. [default: 30]
    #[arg(long, value_name = "SECS")]
    pub(super) fetch_timeout: Option<f64>,

    /// Web sources: also connect to private, loopback and link-local addresses (an intranet
    /// site by its name). Without it they are read only when the source's own URL names one
    /// (http://127.0.0.1:8080/, http://10.0.0.7/wiki/); a public name that resolves to one (DNS
    /// rebinding, a cloud's metadata service) is refused.
    #[arg(long)]
    pub(super) allow_private_addresses: bool,

    /// Extract each file in a child process, so a crash inside a third-party parser that no
    /// thread can contain (a stack overflow, an abort) fails that file alone instead of the
    /// run. Costs a copy of each file's bytes and text through a pipe (BENCHMARKS.md).
    #[arg(long)]
    pub(super) isolate_extraction: bool,

    /// Object stores (s3://, gs://, az://) and feeds with --follow-links: how many objects or
    /// pages are downloaded at once. [default: 16]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub(super) fetch_concurrency: Option<u16>,

    /// Seconds one file may take to extract; past it the file fails with the reason and the
    /// run goes on. [default: 60]
    #[arg(long)]
    pub(super) max_file_seconds: Option<u64>,

    /// MiB one file's extraction may hold (what its parser allocated and still holds); past
    /// it the file fails with the reason and the run goes on. [default: 1024]
    #[arg(long, value_name = "MIB")]
    pub(super) max_extract_mb: Option<u64>,

    /// JSONL: the field holding the document id [default: id, else _id, else FILE:LINE].
    #[arg(long)]
    pub(super) id_field: Option<String>,

    /// JSONL: the field holding the text. [default: text]
    #[arg(long)]
    pub(super) text_field: Option<String>,

    /// JSONL: the field holding the title. [default: title]
    #[arg(long)]
    pub(super) title_field: Option<String>,

    /// JSONL: put the title at the head of the text, so it is chunked and embedded with it.
    #[arg(long)]
    pub(super) title_in_text: bool,

    /// Items per bulk write, at most. [default: 1024]
    #[arg(long)]
    pub(super) batch_size: Option<usize>,

    /// Bytes per bulk write, at most. [default: 8388608]
    #[arg(long)]
    pub(super) batch_bytes: Option<usize>,

    /// Milliseconds a partial bulk write waits for more items. [default: 100]
    #[arg(long)]
    pub(super) batch_timeout_ms: Option<u64>,

    /// Progress display: auto (bars on a terminal, log lines otherwise), bars, log, none.
    #[arg(long)]
    pub(super) progress: Option<Progress>,

    /// Run distributed through a NATS JetStream broker: this process reads the sources and
    /// follows the run to its end; `ragline worker`, `embedder` and `indexer` processes
    /// started with the same URL (on any machine) do the work. nats://HOST:PORT[,nats://...]
    /// with optional ?prefix=NAME&replicas=N&ack_wait=SECS&max_deliver=N&max_pending=N&limit=N.
    #[arg(long, env = "RAGLINE_QUEUE", value_name = "URL")]
    pub(super) queue: Option<String>,
}

impl IngestArgs {
    /// The flags given, over `config`.
    pub(super) fn apply(&self, config: &mut PipelineConfig) -> anyhow::Result<()> {
        super::apply_index(config, &self.index)?;
        let src = &mut config.source;
        if !self.paths.is_empty() {
            src.paths = self.paths.clone();
        }
        if !self.ext.is_empty() {
            src.ext = self.ext.clone();
        }
        if !self.include.is_empty() {
            src.include = self.include.clone();
        }
        if !self.exclude.is_empty() {
            src.exclude = self.exclude.clone();
        }
        if let Some(n) = self.max_file_bytes {
            src.max_file_bytes = n;
        }
        if let Some(n) = self.max_file_seconds {
            src.max_file_seconds = n;
        }
        if let Some(n) = self.fetch_concurrency {
            src.fetch_concurrency = n.into();
        }
        if self.follow_links {
            src.follow_links = true;
        }
        if let Some(n) = self.crawl_depth {
            src.crawl_depth = n;
        }
        if let Some(n) = self.crawl_max_pages {
            src.crawl_max_pages = n;
        }
        if let Some(r) = self.crawl_rps {
            src.crawl_rps = r;
        }
        if let Some(t) = self.fetch_timeout {
            src.fetch_timeout = t;
        }
        if self.allow_private_addresses {
            src.allow_private_addresses = true;
        }
        if self.isolate_extraction {
            src.isolate_extraction = true;
        }
        if let Some(n) = self.max_extract_mb {
            src.max_extract_mb = n;
        }
        if self.id_field.is_some() {
            src.id_field = self.id_field.clone();
        }
        if let Some(f) = &self.text_field {
            src.text_field = f.clone();
        }
        if let Some(f) = &self.title_field {
            src.title_field = f.clone();
        }
        src.title_in_text |= self.title_in_text;
        self.model.apply(&mut config.model);
        self.remote.apply(config)?;
        let chunk = &mut config.chunk;
        if self.no_chunk {
            chunk.enabled = false;
        }
        if let Some(n) = self.chunk_tokens {
            chunk.tokens = n;
        }
        if let Some(n) = self.chunk_overlap {
            chunk.overlap = n;
        }
        chunk.truncate |= self.truncate;
        let index = &mut config.index;
        index.prune |= self.prune;
        if self.ann.is_some() {
            index.ann = self.ann;
        }
        if self.ann_dtype.is_some() {
            index.ann_dtype = self.ann_dtype;
        }
        if let Some(n) = self.indexers {
            index.indexers = Some(n);
        }
        if let Some(n) = self.batch_size {
            index.batch_size = n;
        }
        if let Some(n) = self.batch_bytes {
            index.batch_bytes = n;
        }
        if let Some(n) = self.batch_timeout_ms {
            index.batch_timeout_ms = n;
        }
        if self.workers.is_some() {
            config.run.workers = self.workers;
        }
        if let Some(p) = self.progress {
            config.run.progress = p;
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
        match self.defer.as_deref() {
            None => {}
            Some("embed") => config.stages.embed.defer = true,
            Some(other) => bail!(
                "--defer {other}: only `embed` can be deferred (chunking is what ingest does)"
            ),
        }
        Ok(())
    }
}

pub fn run(args: IngestArgs, config_file: Option<&Path>) -> anyhow::Result<ExitCode> {
    let mut config = super::load_config(config_file)?;
    args.apply(&mut config)?;
    // Fail on an unwritable report before doing any work.
    if let Some(report) = &args.report {
        std::fs::File::create(report)
            .with_context(|| format!("cannot write --report {}", report.display()))?;
    }
    // Listening before the first pass: a change made during it is not missed.
    let changes = args.follow.then(|| Changes::open(&config));
    let mut observer = super::observer(config.run.progress);
    let summary = execute(&args, &config, observer.as_mut())?;
    print_summary(&mut std::io::stdout().lock(), &summary, config.index.prune)?;
    write_report(args.report.as_deref(), &summary)?;
    if let Some(changes) = changes {
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
        match execute(args, config, observer.as_mut()) {
            Ok(summary) => {
                let _ = print_summary(&mut std::io::stdout().lock(), &summary, config.index.prune);
                if let Err(e) = write_report(args.report.as_deref(), &summary) {
                    tracing::warn!("{e:#}");
                }
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
}

/// How often `--follow` asks a broker subject's consumer whether messages wait.
#[cfg(feature = "nats")]
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
        #[cfg(feature = "nats")]
        {
            if self.subjects.is_none() {
                match ragline::jobs::ingest::subject_waiters(config) {
                    Ok(w) => self.subjects = Some(w),
                    Err(e) => tracing::warn!("--follow: {e}; polling instead"),
                }
            }
            if self.subjects.as_ref().is_some_and(|w| !w.is_empty()) {
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

    /// Whether a broker subject's consumer has messages waiting (a consumer that cannot be
    /// asked is opened again at the next wait).
    #[cfg(feature = "nats")]
    fn messages_waiting(&mut self) -> bool {
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

/// `ragline ingest` as a library call: `argv` is a whole command line (`ragline [--config
/// FILE] ingest PATH... [FLAGS]`), progress goes to `observer`, and the run's summary (what
/// `--report` writes) comes back instead of being printed. The Python package's
/// `ragline.ingest`.
pub fn summary<I, T>(argv: I, observer: &mut dyn Observer) -> anyhow::Result<RunSummary>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = <super::Cli as clap::Parser>::try_parse_from(argv)
        .map_err(|e| anyhow::anyhow!("{}", e.render().to_string().trim_end()))?;
    let super::Command::Ingest(args) = cli.command else {
        bail!("not an ingest command line");
    };
    if args.follow {
        bail!("--follow never returns: run `ragline ingest --follow` as a process, or call ingest in a loop");
    }
    let mut config = super::load_config(cli.config.as_deref())?;
    args.apply(&mut config)?;
    let summary = execute(&args, &config, observer)?;
    write_report(args.report.as_deref(), &summary)?;
    Ok(summary)
}

/// The run, on a broker when `--queue` names one.
fn execute(
    args: &IngestArgs,
    config: &PipelineConfig,
    observer: &mut dyn Observer,
) -> anyhow::Result<RunSummary> {
    Ok(match &args.queue {
        #[cfg(feature = "nats")]
        Some(url) => jobs::distributed::ingest(config, url, observer)?,
        #[cfg(not(feature = "nats"))]
        Some(_) => Err(jobs::JobError::NotBuilt {
            what: "ingest --queue".into(),
            feature: "nats",
        })?,
        None => {
            let mut summary = jobs::ingest(config, observer)?;
            jobs::model_stages::after_ingest(config, &mut summary, observer)?;
            summary
        }
    })
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
        let what = if pruned {
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
