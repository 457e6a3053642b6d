//! `ragline eval`: retrieval quality on a BEIR-format dataset, per search mode.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use ragline::eval::{ann_recall, evaluate_reranked, read_qrels, read_queries, Rerank, Scores};
use ragline::indexers::IndexUri;
use ragline::jobs::{self, config::SourceConfig, PipelineConfig};
use ragline::search::{Mode, Searcher};
use ragline::stages::chunk::{DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_TOKENS};

use super::ingest::print_summary;
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

    /// The index to evaluate (sqlite:// or postgres://) [default:
    /// sqlite://<dataset>-<corpus>.eval.db]. The corpus is
    /// ingested into it first (incrementally: a second run reuses it).
    #[arg(long)]
    index: Option<String>,

    /// Evaluate the index as it is, without ingesting the corpus.
    #[arg(long)]
    no_ingest: bool,

    /// Modes to evaluate (comma-separated): vector, keyword, sparse, hybrid (dense and
    /// keyword fused, or what --fuse names), and hybrid:A+B[+C] for any other fusion of
    /// dense, sparse and keyword (`hybrid:dense+sparse+keyword`), each a row.
    #[arg(long, value_delimiter = ',', default_value = "vector,keyword,hybrid")]
    modes: Vec<Mode>,

    /// What `hybrid` fuses: two or three of dense, sparse, keyword. [default: dense,keyword]
    #[arg(long, value_name = "dense,sparse,keyword")]
    fuse: Option<ragline::search::Fuse>,

    /// Give the corpus's chunks sparse vectors from this SPLADE model when it is ingested
    /// (for the sparse modes; see `ingest --sparse-model`). [default: the index's, if any]
    #[arg(long, value_name = "MODEL")]
    sparse_model: Option<String>,

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

    /// Vector search compares each query with every vector instead of using the approximate
    /// index (sqlite://'s ANN file, postgres://'s HNSW).
    #[arg(long)]
    exact: bool,

    /// The ingest keeps a sqlite:// index's ANN: auto (past 50,000 chunks), hnsw (always),
    /// none (see `ingest --ann`). [default: what the index records; auto]
    #[arg(long, value_name = "auto|hnsw|none")]
    ann: Option<ragline::indexers::ann::AnnMode>,

    /// Print the scores as JSON instead of a table.
    #[arg(long)]
    json: bool,

    /// Also write the scores as JSON to this file.
    #[arg(long)]
    report: Option<PathBuf>,

    /// Also evaluate each mode with its first-stage candidates re-scored by this
    /// cross-encoder (a folder, a name under models/, a hub id): a second row per mode
    /// ("reranked": true in JSON), from the same first-stage results.
    #[arg(long, value_name = "MODEL")]
    rerank: Option<String>,

    /// Chunks per query the reranker scores.
    #[arg(long, default_value_t = ragline::search::rerank::DEFAULT_CANDIDATES, requires = "rerank")]
    rerank_candidates: usize,

    #[command(flatten)]
    model: ModelArgs,
}

pub fn run(args: EvalArgs, config_file: Option<&Path>) -> anyhow::Result<ExitCode> {
    let qrels = read_qrels(&args.qrels)?;
    let queries = read_queries(&args.queries)?;
    if qrels.is_empty() {
        bail!("{} holds no positive judgement", args.qrels.display());
    }
    let index = args.index.clone().unwrap_or_else(|| default_index(&args));
    let uri = index.parse::<IndexUri>().context("bad --index")?;
    if !uri.is_store() {
        bail!("eval needs a searchable index: sqlite:// or postgres://");
    }
    let mut config = super::load_config(config_file)?;
    let model_config = args.model.resolve(&config);
    let mut args = args;
    for m in &mut args.modes {
        if *m == Mode::Hybrid(ragline::search::Fuse::DEFAULT) {
            *m = super::search::with_fuse(*m, args.fuse)?;
        }
    }
    if !args.no_ingest {
        config.model = model_config.clone();
        config.stages.sparse.model = args.sparse_model.clone();
        ingest_corpus(&args, &mut config, &index)?;
    }
    let reader = Searcher::open(&uri, args.exact)?;
    let searcher = jobs::searcher(
        reader,
        &model_config,
        args.modes.iter().any(|m| m.needs_dense()),
        args.modes.iter().any(|m| m.needs_sparse()),
    )?;
    let reranker = match &args.rerank {
        Some(spec) => Some(jobs::load_reranker(spec, &model_config)?),
        None => None,
    };
    let started = std::time::Instant::now();
    let mut scores = evaluate_reranked(
        &searcher,
        &queries,
        &qrels,
        &args.modes,
        reranker.as_ref().map(|model| Rerank {
            model,
            candidates: args.rerank_candidates,
        }),
    )?;
    // An approximate index: how much of the exact answer it finds.
    if uri.is_store() && !args.exact {
        if let Some(s) = scores
            .iter_mut()
            .find(|s| s.mode == Mode::Vector.name() && !s.reranked)
        {
            let exact = Searcher::open(&uri, true)?;
            s.ann_recall_at_10 = Some(ann_recall(&searcher, exact.as_ref(), &queries, &qrels, 10)?);
        }
    }
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

/// The index eval makes when none is given: a SQLite file named after the data set, the
/// corpus and whether chunks are truncated.
fn default_index(args: &EvalArgs) -> String {
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
}

/// Ingest the BEIR corpus into `index` with `config` (its model already set), and fail when a
/// document did not make it.
fn ingest_corpus(args: &EvalArgs, config: &mut PipelineConfig, index: &str) -> anyhow::Result<()> {
    // The corpus is a BEIR JSONL file: `_id`, with the title embedded with the text.
    config.source = SourceConfig {
        paths: vec![args.corpus.clone()],
        max_file_bytes: 1 << 40,
        id_field: Some("_id".into()),
        title_in_text: true,
        ..SourceConfig::default()
    };
    config.chunk.enabled = true;
    config.chunk.tokens = args.chunk_tokens;
    config.chunk.overlap = args.chunk_overlap;
    config.chunk.truncate = args.truncate;
    config.index.prune = true;
    config.stages.embed.defer = false;
    if args.ann.is_some() {
        config.index.ann = args.ann;
    }
    super::apply_index(config, &Some(index.to_string()))?;
    let mut observer = super::observer(config.run.progress);
    let mut summary = jobs::ingest(config, observer.as_mut())?;
    jobs::model_stages::after_ingest(config, &mut summary, observer.as_mut())?;
    // Standard error: with --json, standard output holds the scores alone.
    let mut err = std::io::stderr().lock();
    writeln!(err, "corpus ingested:")?;
    print_summary(&mut err, &summary, true)?;
    if !summary.succeeded() {
        bail!("some corpus documents failed to ingest; the scores would be wrong");
    }
    Ok(())
}

fn print_table(scores: &[Scores], secs: f64) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<28} {:>8} {:>9} {:>10} {:>11} {:>8}",
        "mode", "queries", "nDCG@10", "recall@10", "recall@100", "MRR@10"
    )?;
    for s in scores {
        let mode = if s.reranked {
            format!("{} +rerank", s.mode)
        } else {
            s.mode.to_string()
        };
        writeln!(
            out,
            "{:<28} {:>8} {:>9.4} {:>10.4} {:>11.4} {:>8.4}",
            mode, s.queries, s.ndcg_at_10, s.recall_at_10, s.recall_at_100, s.mrr_at_10
        )?;
    }
    for s in scores {
        if let Some(r) = s.ann_recall_at_10 {
            writeln!(
                out,
                "{}: the approximate (HNSW) index finds {r:.4} of the exact 10 nearest chunks \
                 (--exact scans)",
                s.mode
            )?;
        }
    }
    writeln!(out, "({secs:.1}s of searching)")?;
    Ok(())
}
