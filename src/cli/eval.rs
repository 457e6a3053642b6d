//! `ragline eval`: retrieval quality on a BEIR-format dataset, per search mode.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use ragline::embed::ModelFiles;
use ragline::eval::{evaluate, read_qrels, read_queries, Scores};
use ragline::indexers::IndexUri;
use ragline::search::{Mode, Searcher};
use ragline::stages::chunk::{DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_TOKENS};

use super::ingest::{ingest, print_summary, IngestArgs};
use super::model_args::ModelArgs;

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// The corpus: JSONL with `_id`, `title` and `text` (BEIR). Titles are embedded with
    /// the text, as BEIR does.
    #[arg(long)]
    corpus: PathBuf,

    /// The queries: JSONL with `_id` and `text`.
    #[arg(long)]
    queries: PathBuf,

    /// Relevance judgements: TSV `query-id  corpus-id  score` with a header line.
    #[arg(long)]
    qrels: PathBuf,

    /// The index to evaluate [default: sqlite://<dataset>-<corpus>.eval.db]. The corpus is
    /// ingested into it first (incrementally: a second run reuses it).
    #[arg(long)]
    index: Option<String>,

    /// Evaluate the index as it is, without ingesting the corpus.
    #[arg(long)]
    no_ingest: bool,

    /// Modes to evaluate (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "vector,keyword,hybrid")]
    modes: Vec<Mode>,

    /// Chunk size to aim for, in model tokens.
    #[arg(long, default_value_t = DEFAULT_CHUNK_TOKENS)]
    chunk_tokens: usize,

    /// Tokens shared by consecutive chunks of a section.
    #[arg(long, default_value_t = DEFAULT_CHUNK_OVERLAP)]
    chunk_overlap: usize,

    /// Index each document's first tokens only, as sentence-transformers encodes a long text
    /// (for comparing with references computed that way).
    #[arg(long)]
    truncate: bool,

    /// Print the scores as JSON instead of a table.
    #[arg(long)]
    json: bool,

    /// Also write the scores as JSON to this file.
    #[arg(long)]
    report: Option<PathBuf>,

    #[command(flatten)]
    model: ModelArgs,
}

pub fn run(args: EvalArgs) -> anyhow::Result<ExitCode> {
    let qrels = read_qrels(&args.qrels).map_err(anyhow::Error::msg)?;
    let queries = read_queries(&args.queries).map_err(anyhow::Error::msg)?;
    if qrels.is_empty() {
        bail!("{} holds no positive judgement", args.qrels.display());
    }
    let index = args.index.clone().unwrap_or_else(|| {
        let stem = args
            .corpus
            .file_stem()
            .map_or("corpus".into(), |s| s.to_string_lossy());
        let set = args
            .corpus
            .parent()
            .and_then(|p| p.file_name())
            .map_or("dataset".into(), |s| s.to_string_lossy());
        let mode = if args.truncate { "-truncated" } else { "" };
        format!("sqlite://{set}-{stem}{mode}.eval.db")
    });
    let IndexUri::Sqlite(path) = index.parse::<IndexUri>().context("bad --index")? else {
        bail!("eval needs a sqlite:// index");
    };
    if !args.no_ingest {
        let ingest_args = IngestArgs {
            paths: vec![args.corpus.clone()],
            index: index.clone(),
            prune: true,
            workers: None,
            indexers: 1,
            report: None,
            no_chunk: false,
            chunk_tokens: args.chunk_tokens,
            chunk_overlap: args.chunk_overlap,
            truncate: args.truncate,
            model: args.model.clone(),
            ext: Vec::new(),
            include: Vec::new(),
            exclude: Vec::new(),
            max_file_bytes: 1 << 40,
            id_field: Some("_id".into()),
            text_field: "text".into(),
            title_field: "title".into(),
            title_in_text: true,
            batch_size: ragline::indexers::batch::DEFAULT_MAX_ITEMS,
            batch_bytes: ragline::indexers::batch::DEFAULT_MAX_BYTES,
            batch_timeout_ms: 100,
            progress: "auto".into(),
        };
        let Some(summary) = ingest(&ingest_args)? else {
            return Ok(ExitCode::from(super::EXIT_SETUP));
        };
        let mut err = std::io::stderr().lock();
        writeln!(err, "corpus ingested:")?;
        drop(err);
        print_summary(&summary, true)?;
        if !summary.succeeded() {
            bail!("some corpus documents failed to ingest; the scores would be wrong");
        }
    }

    let reader = Searcher::open(&path)?;
    let needs_model = args.modes.iter().any(|m| *m != Mode::Keyword);
    let model = if needs_model {
        let spec = Searcher::model_spec(&reader).context("the index holds no vectors")?;
        let files = ModelFiles::resolve(&spec)?;
        let devices = args.model.devices()?;
        Some(args.model.load(&files, &devices[0])?)
    } else {
        None
    };
    let searcher = Searcher::new(reader, model);
    let started = std::time::Instant::now();
    let scores = evaluate(&searcher, &queries, &qrels, &args.modes)?;
    let secs = started.elapsed().as_secs_f64();
    let json = serde_json::to_string_pretty(&scores)?;
    if let Some(report) = &args.report {
        std::fs::write(report, &json).with_context(|| format!("writing {}", report.display()))?;
    }
    if args.json {
        println!("{json}");
    } else {
        print_table(&scores, secs)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(scores: &[Scores], secs: f64) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<8} {:>8} {:>9} {:>10} {:>11} {:>8}",
        "mode", "queries", "nDCG@10", "recall@10", "recall@100", "MRR@10"
    )?;
    for s in scores {
        writeln!(
            out,
            "{:<8} {:>8} {:>9.4} {:>10.4} {:>11.4} {:>8.4}",
            s.mode, s.queries, s.ndcg_at_10, s.recall_at_10, s.recall_at_100, s.mrr_at_10
        )?;
    }
    writeln!(out, "({secs:.1}s of searching)")?;
    Ok(())
}
