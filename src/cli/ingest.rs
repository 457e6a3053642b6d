//! `ragline ingest PATH...`

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use ragline::connectors::filesystem::{FilesystemConfig, FilesystemConnector};
use ragline::connectors::jsonl::JsonlFields;
use ragline::connectors::Connector;
use ragline::indexers::sqlite::{IndexIdentity, ModelIdentity};
use ragline::indexers::{self, BackendFactory, BatchConfig, IndexUri};
use ragline::run::progress::{Bars, LogLines, Observer, Silent};
use ragline::run::{self, RunOptions, RunParts, RunSummary};
use ragline::stages::chunk::{
    ChunkConfig, ChunkStage, DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_TOKENS,
};
use ragline::stages::extract::Extract;
use ragline::stages::incremental::Incremental;
use ragline::stages::reuse::ReuseVectors;
use ragline::stages::{Pipeline, Stage, StageError};

use super::model_args::ModelArgs;
use super::{EXIT_FAILURES, EXIT_OK, EXIT_SETUP};

#[derive(Args, Debug, Clone)]
pub struct IngestArgs {
    /// Files and folders to ingest. Folders are walked for .md, .markdown, .mdx, .html,
    /// .htm, .txt, .rst and .jsonl files (one document per line).
    #[arg(required = true)]
    pub(super) paths: Vec<PathBuf>,

    /// Where to write: sqlite://PATH (the embedded index: vectors, full text, incremental
    /// re-runs), jsonl:PATH (one JSON object per document or chunk), null: (discard).
    #[arg(long, env = "RAGLINE_INDEX", default_value = "sqlite://ragline.db")]
    pub(super) index: String,

    /// Delete from the index the documents whose source is gone.
    #[arg(long)]
    pub(super) prune: bool,

    /// CPU worker threads (extract, chunk, tokenize) [default: the number of cores].
    #[arg(long)]
    pub(super) workers: Option<usize>,

    /// Indexer threads writing to the index.
    #[arg(long, default_value_t = 1)]
    pub(super) indexers: usize,

    /// Write the summary and every failure and drop (document, stage, reason) as JSON.
    #[arg(long)]
    pub(super) report: Option<PathBuf>,

    /// Index whole documents: no chunking, no embedding, no model needed.
    #[arg(long)]
    pub(super) no_chunk: bool,

    /// Chunk size to aim for, in model tokens (at most the model's limit).
    #[arg(long, default_value_t = DEFAULT_CHUNK_TOKENS)]
    pub(super) chunk_tokens: usize,

    /// Tokens shared by consecutive chunks of a section.
    #[arg(long, default_value_t = DEFAULT_CHUNK_OVERLAP)]
    pub(super) chunk_overlap: usize,

    /// One chunk per document, its first tokens up to the model's limit; the rest is not
    /// indexed (what sentence-transformers' encode does with long texts).
    #[arg(long)]
    pub(super) truncate: bool,

    #[command(flatten)]
    pub(super) model: ModelArgs,

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
    #[arg(long, default_value_t = 100 << 20)]
    pub(super) max_file_bytes: u64,

    /// JSONL: the field holding the document id [default: id, else _id, else FILE:LINE].
    #[arg(long)]
    pub(super) id_field: Option<String>,

    /// JSONL: the field holding the text.
    #[arg(long, default_value = "text")]
    pub(super) text_field: String,

    /// JSONL: the field holding the title.
    #[arg(long, default_value = "title")]
    pub(super) title_field: String,

    /// JSONL: put the title at the head of the text, so it is chunked and embedded with it.
    #[arg(long)]
    pub(super) title_in_text: bool,

    /// Items per bulk write, at most.
    #[arg(long, default_value_t = indexers::batch::DEFAULT_MAX_ITEMS)]
    pub(super) batch_size: usize,

    /// Bytes per bulk write, at most.
    #[arg(long, default_value_t = indexers::batch::DEFAULT_MAX_BYTES)]
    pub(super) batch_bytes: usize,

    /// Milliseconds a partial bulk write waits for more items.
    #[arg(long, default_value_t = 100)]
    pub(super) batch_timeout_ms: u64,

    /// Progress display: auto (bars on a terminal, log lines otherwise), bars, log, none.
    #[arg(long, default_value = "auto")]
    pub(super) progress: String,
}

pub fn run(args: IngestArgs) -> anyhow::Result<ExitCode> {
    let Some(summary) = ingest(&args)? else {
        return Ok(ExitCode::from(EXIT_SETUP));
    };
    print_summary(&summary, args.prune)?;
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

/// Run an ingest; None when the run could not complete (the error is printed).
pub(super) fn ingest(args: &IngestArgs) -> anyhow::Result<Option<RunSummary>> {
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
        title_in_text: args.title_in_text,
    };
    let fs_config = fs_config.validate(fields)?;
    let mut observer = observer(&args.progress)?;
    // Fail on an unwritable report before doing any work.
    if let Some(report) = &args.report {
        std::fs::File::create(report)
            .with_context(|| format!("cannot write --report {}", report.display()))?;
    }

    // The model and the chunker, unless whole documents are indexed.
    let embedding = if args.no_chunk {
        None
    } else {
        let files = args.model.files()?;
        let devices = args.model.devices()?;
        for d in &devices {
            eprintln!("embedding on {} ({})", d.label, d.reason);
        }
        let pool = args.model.pool(&files, &devices)?;
        let model = &pool.embedders()[0].model;
        let tokenizer = model.tokenizer.clone();
        let limit = tokenizer.max_content_len() - tokenizer.passage_prompt_ids().len();
        let explicit = args.chunk_tokens != DEFAULT_CHUNK_TOKENS;
        let sizes = ChunkConfig {
            target: args.chunk_tokens,
            overlap: args.chunk_overlap,
        }
        .validate(limit, explicit)
        .map_err(anyhow::Error::msg)?;
        let identity = ModelIdentity {
            name: files.name.clone(),
            dir: std::fs::canonicalize(&files.dir)
                .unwrap_or_else(|_| files.dir.clone())
                .display()
                .to_string(),
            fingerprint: model.fingerprint()?,
            dimension: model.dimension(),
        };
        Some((pool, tokenizer, sizes, identity))
    };
    let pipeline_fingerprint = match &embedding {
        Some((_, _, sizes, identity)) => {
            format!(
                "{}|{}",
                ChunkStage::fingerprint(sizes, args.truncate),
                identity.fingerprint
            )
        }
        None => "extract-v1".to_string(),
    };
    let identity = IndexIdentity {
        model: embedding.as_ref().map(|e| e.3.clone()),
        pipeline_fingerprint: pipeline_fingerprint.clone(),
    };
    let backend: Arc<dyn BackendFactory> = indexers::open(&uri, identity)?.into();
    let known = Arc::new(backend.known_documents()?);
    let in_index = backend.document_ids()?;
    let fingerprint: Arc<str> = pipeline_fingerprint.into();

    let (chunking, pool) = match embedding {
        Some((pool, tokenizer, sizes, _)) => (Some((tokenizer, sizes)), Some(pool)),
        None => (None, None),
    };
    let truncate = args.truncate;
    let store = Arc::clone(&backend);
    let pipeline = move || -> Result<Pipeline, StageError> {
        let mut stages: Vec<Box<dyn Stage>> = vec![
            Box::new(Incremental::new(
                Arc::clone(&known),
                Arc::clone(&fingerprint),
            )),
            Box::new(Extract),
        ];
        if let Some((tokenizer, sizes)) = &chunking {
            stages.push(Box::new(if truncate {
                ChunkStage::truncating(tokenizer.clone(), *sizes)
            } else {
                ChunkStage::new(tokenizer.clone(), *sizes)
            }));
            let vectors = store
                .stored_vectors()
                .map_err(|e| StageError::Internal(e.to_string()))?;
            if let Some(vectors) = vectors {
                stages.push(Box::new(ReuseVectors::new(vectors)));
            }
        }
        Ok(Pipeline::new(stages))
    };

    let mut options = RunOptions::default();
    if let Some(w) = args.workers {
        if w == 0 {
            bail!("--workers must be at least 1");
        }
        options.workers = w;
    }
    options.indexers = args.indexers.max(1);
    options.track_ids = in_index.is_some();
    options.batch = BatchConfig {
        max_items: args.batch_size.max(1),
        max_bytes: args.batch_bytes.max(1),
        timeout: Duration::from_millis(args.batch_timeout_ms),
        ..BatchConfig::default()
    };
    let connectors: Vec<Box<dyn Connector>> = vec![Box::new(FilesystemConnector::new(fs_config))];
    let parts = RunParts {
        connectors,
        pipeline: &pipeline,
        embedder: pool,
        backend: backend.as_ref(),
    };
    let result = run::execute(parts, &options, observer.as_mut());
    observer.finish();
    let mut summary = match result {
        Ok(summary) => summary,
        Err(err) => {
            eprintln!("error: {err:#}");
            return Ok(None);
        }
    };
    // Documents the index holds that this run's source no longer has.
    if let (Some(before), Some(seen)) = (&in_index, &summary.published_ids) {
        let mut missing: Vec<String> = before.difference(seen).cloned().collect();
        missing.sort();
        if args.prune && !missing.is_empty() {
            summary.pruned = backend.delete_documents(&missing)? as u64;
        }
        summary.missing_from_source = missing;
    } else if args.prune {
        eprintln!("warning: --prune does nothing with {}", backend.describe());
    }
    Ok(Some(summary))
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

pub(super) fn print_summary(s: &RunSummary, pruned: bool) -> anyhow::Result<()> {
    let c = &s.counts;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "ingested into {} in {:.1}s: {} documents published, {} indexed ({} unchanged), \
         {} failed, {} dropped",
        s.index, s.elapsed_secs, c.published, c.indexed, c.unchanged, c.failed, c.dropped
    )?;
    if c.children_created > 0 || c.unchanged > 0 {
        writeln!(
            out,
            "chunks: {} created, {} embedded, {} reused, {} indexed, {} failed, {} dropped; \
             {} tokens embedded ({:.0} tokens/s, {:.1}% padding)",
            c.children_created,
            s.chunks_embedded,
            s.chunks_reused,
            c.children_indexed,
            c.children_failed,
            c.children_dropped,
            s.tokens_embedded,
            s.tokens_per_sec,
            s.padding_ratio * 100.0
        )?;
    }
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
