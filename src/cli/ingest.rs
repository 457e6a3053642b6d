//! `ragline ingest PATH...`

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use ragline::connectors::filesystem::{FilesystemConfig, FilesystemConnector};
use ragline::connectors::jsonl::JsonlFields;
use ragline::connectors::Connector;
use ragline::indexers::{self, BatchConfig, IndexUri};
use ragline::run::progress::{Bars, LogLines, Observer, Silent};
use ragline::run::{self, RunOptions, RunParts, RunSummary};
use ragline::stages::chunk::{
    ChunkConfig, ChunkStage, DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_TOKENS,
};
use ragline::stages::extract::Extract;
use ragline::stages::{Pipeline, Stage, StageError};

use super::model_args::ModelArgs;
use super::{EXIT_FAILURES, EXIT_OK, EXIT_SETUP};

#[derive(Args, Debug)]
pub struct IngestArgs {
    /// Files and folders to ingest. Folders are walked for .md, .markdown, .mdx, .html,
    /// .htm, .txt, .rst and .jsonl files (one document per line).
    #[arg(required = true)]
    paths: Vec<PathBuf>,

    /// Where to write: jsonl:PATH (one JSON object per document or chunk), null: (discard).
    #[arg(long, env = "RAGLINE_INDEX", default_value = "jsonl:ragline.jsonl")]
    index: String,

    /// CPU worker threads (extract, chunk, tokenize) [default: the number of cores].
    #[arg(long)]
    workers: Option<usize>,

    /// Indexer threads writing to the index.
    #[arg(long, default_value_t = 1)]
    indexers: usize,

    /// Write the summary and every failure and drop (document, stage, reason) as JSON.
    #[arg(long)]
    report: Option<PathBuf>,

    /// Index whole documents: no chunking, no embedding, no model needed.
    #[arg(long)]
    no_chunk: bool,

    /// Chunk size to aim for, in model tokens (at most the model's limit).
    #[arg(long, default_value_t = DEFAULT_CHUNK_TOKENS)]
    chunk_tokens: usize,

    /// Tokens shared by consecutive chunks of a section.
    #[arg(long, default_value_t = DEFAULT_CHUNK_OVERLAP)]
    chunk_overlap: usize,

    #[command(flatten)]
    model: ModelArgs,

    /// File extensions to take from folders (comma-separated), instead of the default list.
    #[arg(long, value_delimiter = ',')]
    ext: Vec<String>,

    /// Globs (relative to each folder given) of files to take, instead of the extension list.
    #[arg(long)]
    include: Vec<String>,

    /// Globs (relative to each folder given) of files to leave out.
    #[arg(long)]
    exclude: Vec<String>,

    /// Files larger than this many bytes are reported as failed instead of read.
    #[arg(long, default_value_t = 100 << 20)]
    max_file_bytes: u64,

    /// JSONL: the field holding the document id [default: id, else _id, else FILE:LINE].
    #[arg(long)]
    id_field: Option<String>,

    /// JSONL: the field holding the text.
    #[arg(long, default_value = "text")]
    text_field: String,

    /// JSONL: the field holding the title.
    #[arg(long, default_value = "title")]
    title_field: String,

    /// Items per bulk write, at most.
    #[arg(long, default_value_t = indexers::batch::DEFAULT_MAX_ITEMS)]
    batch_size: usize,

    /// Bytes per bulk write, at most.
    #[arg(long, default_value_t = indexers::batch::DEFAULT_MAX_BYTES)]
    batch_bytes: usize,

    /// Milliseconds a partial bulk write waits for more items.
    #[arg(long, default_value_t = 100)]
    batch_timeout_ms: u64,

    /// Progress display: auto (bars on a terminal, log lines otherwise), bars, log, none.
    #[arg(long, default_value = "auto")]
    progress: String,
}

pub fn run(args: IngestArgs) -> anyhow::Result<ExitCode> {
    let uri: IndexUri = args.index.parse().context("bad --index")?;
    let mut fs_config = FilesystemConfig::new(args.paths.clone());
    if !args.ext.is_empty() {
        fs_config.extensions = args.ext.clone();
    }
    fs_config.include = args.include.clone();
    fs_config.exclude = args.exclude.clone();
    fs_config.max_file_bytes = args.max_file_bytes;
    let fields = JsonlFields {
        id: args.id_field.clone(),
        text: args.text_field.clone(),
        title: args.title_field.clone(),
    };
    let fs_config = fs_config.validate(fields)?;
    let mut observer = observer(&args.progress)?;
    // Fail on an unwritable report before doing any work.
    if let Some(report) = &args.report {
        std::fs::File::create(report)
            .with_context(|| format!("cannot write --report {}", report.display()))?;
    }
    let backend = indexers::open(&uri)?;

    let (pipeline, embedder): (
        Box<dyn Fn() -> Result<Pipeline, StageError> + Send + Sync>,
        _,
    ) = if args.no_chunk {
        (
            Box::new(|| Ok(Pipeline::new(vec![Box::new(Extract)]))),
            None,
        )
    } else {
        let files = args.model.files()?;
        let devices = args.model.devices()?;
        for d in &devices {
            eprintln!("embedding on {} ({})", d.label, d.reason);
        }
        let pool = args.model.pool(&files, &devices)?;
        let first = &pool_model_tokenizer(&pool);
        let tokenizer = first.0.clone();
        let limit = first.1;
        let explicit = args.chunk_tokens != DEFAULT_CHUNK_TOKENS;
        let sizes = ChunkConfig {
            target: args.chunk_tokens,
            overlap: args.chunk_overlap,
        }
        .validate(limit, explicit)
        .map_err(anyhow::Error::msg)?;
        let factory = move || {
            let stages: Vec<Box<dyn Stage>> = vec![
                Box::new(Extract),
                Box::new(ChunkStage::new(tokenizer.clone(), sizes)),
            ];
            Ok(Pipeline::new(stages))
        };
        (Box::new(factory), Some(pool))
    };

    let mut options = RunOptions::default();
    if let Some(w) = args.workers {
        if w == 0 {
            bail!("--workers must be at least 1");
        }
        options.workers = w;
    }
    options.indexers = args.indexers.max(1);
    options.batch = BatchConfig {
        max_items: args.batch_size.max(1),
        max_bytes: args.batch_bytes.max(1),
        timeout: Duration::from_millis(args.batch_timeout_ms),
        ..BatchConfig::default()
    };
    let connectors: Vec<Box<dyn Connector>> = vec![Box::new(FilesystemConnector::new(fs_config))];
    let parts = RunParts {
        connectors,
        pipeline: pipeline.as_ref(),
        embedder,
        backend: backend.as_ref(),
    };
    let result = run::execute(parts, &options, observer.as_mut());
    observer.finish();
    let summary = match result {
        Ok(summary) => summary,
        Err(err) => {
            eprintln!("error: {err:#}");
            return Ok(ExitCode::from(EXIT_SETUP));
        }
    };
    print_summary(&summary)?;
    if let Some(report) = &args.report {
        let json = serde_json::to_vec_pretty(&summary)?;
        std::fs::write(report, json)
            .with_context(|| format!("cannot write --report {}", report.display()))?;
    }
    Ok(ExitCode::from(if summary.succeeded() {
        EXIT_OK
    } else {
        EXIT_FAILURES
    }))
}

/// The tokenizer (and its chunk limit: content tokens minus the passage prompt) of the pool's
/// model; every embedder runs the same model.
fn pool_model_tokenizer(
    pool: &ragline::embed::pool::EmbedderPool,
) -> (ragline::embed::tokenizer::TextTokenizer, usize) {
    let model = &pool.embedders()[0].model;
    let t = model.tokenizer.clone();
    let limit = t.max_content_len() - t.passage_prompt_ids().len();
    (t, limit)
}

fn observer(choice: &str) -> anyhow::Result<Box<dyn Observer>> {
    Ok(match choice {
        "auto" if std::io::stderr().is_terminal() => Box::new(Bars::new()),
        "auto" | "log" => Box::new(LogLines::new(Duration::from_secs(5))),
        "bars" => Box::new(Bars::new()),
        "none" => Box::new(Silent),
        other => bail!("unknown --progress `{other}`: use auto, bars, log or none"),
    })
}

fn print_summary(s: &RunSummary) -> anyhow::Result<()> {
    let c = &s.counts;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "ingested into {} in {:.1}s: {} documents published, {} indexed ({} unchanged), \
         {} failed, {} dropped",
        s.index, s.elapsed_secs, c.published, c.indexed, c.unchanged, c.failed, c.dropped
    )?;
    if c.children_created > 0 {
        writeln!(
            out,
            "chunks: {} created, {} embedded, {} indexed, {} failed, {} dropped; \
             {} tokens embedded ({:.0} tokens/s, {:.1}% padding)",
            c.children_created,
            s.chunks_embedded,
            c.children_indexed,
            c.children_failed,
            c.children_dropped,
            s.tokens_embedded,
            s.tokens_per_sec,
            s.padding_ratio * 100.0
        )?;
    }
    const SHOWN: usize = 20;
    for (label, list) in [("failed", &s.failures), ("dropped", &s.dropped)] {
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
