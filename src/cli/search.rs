//! `ragline search "QUERY"`

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use ragline::indexers::IndexUri;
use ragline::jobs;
use ragline::search::{Fuse, Mode, Searcher};

use super::model_args::ModelArgs;

#[derive(Args, Debug)]
pub struct SearchArgs {
    /// What to look for.
    query: String,

    /// The index to search (sqlite://PATH or postgres://...). [default: sqlite://ragline.db]
    #[arg(long, env = "RAGLINE_INDEX")]
    index: Option<String>,

    /// How many results (1 to 10000).
    #[arg(short, long, default_value_t = 10, value_parser = k_in_range)]
    k: usize,

    /// vector (dense vectors: meaning), keyword (BM25 over words), sparse (SPLADE vectors:
    /// learned term weights; the index needs them: `enrich --stage sparse`), or hybrid (the
    /// rankings --fuse names, by reciprocal rank fusion).
    #[arg(long, default_value = "hybrid")]
    mode: Mode,

    /// The rankings a hybrid search fuses: two or three of dense, sparse, keyword.
    /// [default: dense,keyword]
    #[arg(long, value_name = "dense,sparse,keyword")]
    fuse: Option<Fuse>,

    /// Print the results as JSON.
    #[arg(long)]
    json: bool,

    /// Vector search compares the query with every vector instead of using the approximate
    /// nearest-neighbour index (sqlite://'s ANN file, postgres://'s HNSW): exact, slower.
    #[arg(long)]
    exact: bool,

    /// The approximate index's candidate list (HNSW ef, 16 to 4096) for this search, over the
    /// one the index measured for its recall target (`ragline status` shows it): larger
    /// finds more of the true nearest, slower.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(16..=4096))]
    ef: Option<u16>,

    /// Say how the vector search was answered: the approximate index or every vector, a
    /// graph walk or a scan of what the filter lets through, and why. With --json the output
    /// becomes `{"hits": [...], "plan": {...}}`.
    #[arg(long)]
    explain: bool,

    /// Do not move documents that match but are not embedded yet to the front of the
    /// embedding queue.
    #[arg(long)]
    no_promote: bool,

    /// Only chunks of documents that match: `source=GLOB` on the document id (its path or
    /// URL: `source=docs/api/*`), `KEY=VALUE` on its metadata (front matter, JSONL fields;
    /// the value may be a glob; a list matches when it holds the value),
    /// `entity.TYPE=NAME` (the entities stage found it; `entity=NAME` of any type,
    /// `entity.TYPE=*` any of the type), `label=LABEL` (the labels stage gave it). Repeat to
    /// AND them. Applied inside the search: k results whenever k chunks match.
    #[arg(long = "where", value_name = "CLAUSE")]
    filters: Vec<String>,

    /// Re-score the first stage's candidates with this cross-encoder (a reranker: a folder,
    /// a name under models/, a hub id; BERT, XLM-RoBERTa or ModernBERT sequence
    /// classification with one label) and order them by its score. --json then shows
    /// `score` (the reranker's), `raw_score` (its logit), `first_stage_rank` and
    /// `first_stage_score`. Runs on --device in --dtype.
    #[arg(long, value_name = "MODEL")]
    rerank: Option<String>,

    /// First-stage candidates the reranker scores (at least k, at most 10000).
    #[arg(long, default_value_t = ragline::search::rerank::DEFAULT_CANDIDATES, requires = "rerank", value_parser = k_in_range)]
    rerank_candidates: usize,

    #[command(flatten)]
    model: ModelArgs,
}

pub fn run(args: SearchArgs, config_file: Option<&Path>) -> anyhow::Result<ExitCode> {
    let mut config = super::load_config(config_file)?;
    super::apply_index(&mut config, &args.index)?;
    let filter = ragline::search::Where::parse(&args.filters).map_err(anyhow::Error::msg)?;
    let model_config = args.model.resolve(&config);
    let mut args = args;
    args.mode = with_fuse(args.mode, args.fuse)?;
    let searcher = jobs::open_searcher(&config, &model_config, args.exact, args.mode)?
        .with_ef(args.ef.map(usize::from));
    let hits = match &args.rerank {
        None => searcher.search_where(&args.query, args.mode, args.k, &filter)?,
        Some(spec) => {
            let reranker = jobs::load_reranker(spec, &model_config)?;
            let depth = args.rerank_candidates.max(args.k);
            let candidates = searcher.search_where(&args.query, args.mode, depth, &filter)?;
            ragline::search::rerank::rerank_hits(&reranker, &args.query, candidates, args.k)
                .with_context(|| format!("reranking with `{spec}`"))?
        }
    };
    // A partly enriched index: say what vector search cannot see yet, and embed what this
    // search is looking for first.
    let (missing, total) = searcher.reader().unembedded()?;
    if missing > 0 {
        if args.mode.needs_dense() {
            eprintln!(
                "note: {missing} of {total} chunks not embedded yet (vector search covers the rest; `ragline enrich` embeds them)"
            );
        }
        if !args.no_promote && config.index.uri.value.is_store() {
            promote_matches(&searcher, &config.index.uri.value, &args.query)?;
        }
    }
    let mut out = std::io::stdout().lock();
    let plan = searcher.reader().last_plan();
    if args.json {
        if args.explain {
            let both = serde_json::json!({ "hits": hits, "plan": plan });
            serde_json::to_writer_pretty(&mut out, &both)?;
        } else {
            serde_json::to_writer_pretty(&mut out, &hits)?;
        }
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.explain {
        match &plan {
            Some(p) => writeln!(out, "{}", explain(p))?,
            None if args.mode.needs_dense() => {
                writeln!(out, "plan: this backend does not say how it searched")?
            }
            None => writeln!(out, "plan: no vector search (--mode {})", args.mode)?,
        }
    }
    if hits.is_empty() {
        writeln!(out, "no results")?;
    }
    for h in &hits {
        let c = &h.chunk;
        writeln!(
            out,
            "{:>3}. {:.4}{}  {}{}  [{}]{}",
            h.rank,
            h.score,
            match h.first_stage_rank {
                Some(r) => format!(" (was {r})"),
                None => String::new(),
            },
            c.source.as_deref().unwrap_or(&c.document_id),
            match c.pages {
                Some((a, b)) if a == b => format!("  p. {a}"),
                Some((a, b)) => format!("  pp. {a}-{b}"),
                None => String::new(),
            },
            c.heading_path,
            if c.superseded {
                "  (previous version; the new one is not embedded yet)"
            } else {
                ""
            }
        )?;
        writeln!(out, "     {}", snippet(&c.text, &args.query, 220))?;
        for (stage, output) in &c.outputs {
            writeln!(out, "     {stage}: {}", snippet(output, &args.query, 220))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--mode hybrid --fuse ...`: the mode with what it fuses; --fuse with another mode is
/// refused.
pub(super) fn with_fuse(mode: Mode, fuse: Option<Fuse>) -> anyhow::Result<Mode> {
    match (mode, fuse) {
        (m, None) => Ok(m),
        (Mode::Hybrid(_), Some(f)) => Ok(Mode::Hybrid(f)),
        (m, Some(_)) => anyhow::bail!("--fuse goes with --mode hybrid (not --mode {m})"),
    }
}

/// Documents whose chunks match the query by keyword and whose embedding is still pending
/// move to interactive priority. Best effort: a read-only index is searched all the same.
/// `plan: ann, graph at ef 96; 20 candidates re-scored from the vectors file (no filter: ...)`
fn explain(p: &ragline::indexers::ann::VectorPlan) -> String {
    let mut line = format!("plan: {}, {}", p.index, p.path);
    if let Some(ef) = p.ef {
        line.push_str(&format!(" at ef {ef}"));
    }
    if let Some(n) = p.filtered_to {
        line.push_str(&format!("; the filter lets {n} chunks through"));
    }
    if p.index == "ann" {
        line.push_str(&format!(
            "; {} candidates re-scored from the {}",
            p.candidates,
            if p.rescored_from == "vectors-file" {
                "vectors file"
            } else {
                "index"
            }
        ));
        if p.changed_since_saved > 0 {
            line.push_str(&format!(
                ", {} chunks changed since the ANN was saved",
                p.changed_since_saved
            ));
        }
    }
    line.push_str(&format!("\n  why: {}", p.why));
    line
}

fn promote_matches(searcher: &Searcher, uri: &IndexUri, query: &str) -> anyhow::Result<()> {
    let reader = searcher.reader();
    let mut ids: Vec<String> = Vec::new();
    for (rowid, _) in reader.keyword(query, PROMOTE_DEPTH)? {
        if let Some(doc) = reader.document_of(rowid)? {
            if !ids.contains(&doc) {
                ids.push(doc);
            }
        }
    }
    let pending = reader.unembedded_documents(&ids)?;
    if pending.is_empty() {
        return Ok(());
    }
    match ragline::indexers::open_store(uri).and_then(|mut s| s.promote(&pending)) {
        Ok(n) if n > 0 => {
            eprintln!("note: {n} matching documents not embedded yet go to the front of the queue")
        }
        Ok(_) => {}
        Err(e) => eprintln!("note: cannot promote matching documents ({e})"),
    }
    Ok(())
}

/// A count of results that is not one: not a number, or outside 1..=[`ragline::search::MAX_K`].
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a number of results from 1 to {max}", max = ragline::search::MAX_K)]
struct BadCount(String);

/// A count of results: 1 to [`ragline::search::MAX_K`].
fn k_in_range(s: &str) -> Result<usize, BadCount> {
    s.parse::<usize>()
        .ok()
        .filter(|k| (1..=ragline::search::MAX_K).contains(k))
        .ok_or_else(|| BadCount(s.to_string()))
}

/// Keyword hits looked at for promotion.
const PROMOTE_DEPTH: usize = 50;

/// About `width` characters of `text` around the first query word found in it, on one line.
fn snippet(text: &str, query: &str, width: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let lower = flat.to_lowercase();
    let at = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 3)
        .filter_map(|w| lower.find(&w.to_lowercase()))
        .min()
        .unwrap_or(0);
    let mut start = at.saturating_sub(width / 3);
    while !flat.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = (start + width).min(flat.len());
    while !flat.is_char_boundary(end) {
        end += 1;
    }
    format!(
        "{}{}{}",
        if start > 0 { "..." } else { "" },
        &flat[start..end],
        if end < flat.len() { "..." } else { "" }
    )
}
