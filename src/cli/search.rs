//! `ragline search "QUERY"`

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use ragline::embed::ModelFiles;
use ragline::indexers::IndexUri;
use ragline::search::{Mode, Searcher};

use super::model_args::ModelArgs;

#[derive(Args, Debug)]
pub struct SearchArgs {
    /// What to look for.
    query: String,

    /// The index to search (sqlite://PATH).
    #[arg(long, env = "RAGLINE_INDEX", default_value = "sqlite://ragline.db")]
    index: String,

    /// How many results.
    #[arg(short, long, default_value_t = 10)]
    k: usize,

    /// vector (meaning), keyword (BM25 over words), or hybrid (both, by reciprocal rank fusion).
    #[arg(long, default_value = "hybrid")]
    mode: Mode,

    /// Print the results as JSON.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    model: ModelArgs,
}

pub fn run(args: SearchArgs) -> anyhow::Result<ExitCode> {
    let path = match args.index.parse::<IndexUri>().context("bad --index")? {
        IndexUri::Sqlite(path) => path,
        other => anyhow::bail!("search reads sqlite:// indexes; {other:?} cannot be searched"),
    };
    let reader = Searcher::open(&path)?;
    // The query is embedded with the index's own model (not --model's default).
    let model = if args.mode == Mode::Keyword {
        None
    } else {
        let spec = Searcher::model_spec(&reader).context(
            "the index holds no vectors (it was built with --no-chunk); use --mode keyword",
        )?;
        let files = ModelFiles::resolve(&spec)
            .with_context(|| format!("cannot find the index's model `{spec}`"))?;
        let devices = args.model.devices()?;
        Some(args.model.load(&files, &devices[0])?)
    };
    let searcher = Searcher::new(reader, model);
    let hits = searcher.search(&args.query, args.mode, args.k)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &hits)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if hits.is_empty() {
        writeln!(out, "no results")?;
    }
    for h in &hits {
        let c = &h.chunk;
        writeln!(
            out,
            "{:>3}. {:.4}  {}  [{}]",
            h.rank,
            h.score,
            c.source.as_deref().unwrap_or(&c.document_id),
            c.heading_path
        )?;
        writeln!(out, "     {}", snippet(&c.text, &args.query, 220))?;
    }
    Ok(ExitCode::SUCCESS)
}

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
