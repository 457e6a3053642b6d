//! `ragline entities`: the facet of the entities stage (each entity with the documents that
//! mention it, most first; `--labels` for the labels stage's), and `--edges`: the (document,
//! entity) edges a knowledge graph is built from, as JSONL or Parquet.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use ragline::indexers::facets::EntityEdge;
use ragline::search::{Searcher, Where};

#[derive(Args, Debug)]
pub struct EntitiesArgs {
    /// The index (sqlite://PATH or postgres://...). [default: sqlite://ragline.db]
    #[arg(long, env = "RAGLINE_INDEX")]
    index: Option<String>,

    /// Only entities of this type (`ORG`, `PER`, as the model's labels name them).
    #[arg(long = "type", value_name = "TYPE")]
    kind: Option<String>,

    /// How many entities (or labels) to list, most documents first.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    top: u64,

    /// Only documents that match (as `search --where`: source=GLOB, KEY=VALUE,
    /// entity.TYPE=NAME, label=LABEL). Repeat to AND them.
    #[arg(long = "where", value_name = "CLAUSE")]
    filters: Vec<String>,

    /// List the labels of the labels stage instead of entities.
    #[arg(long, conflicts_with_all = ["kind", "edges"])]
    labels: bool,

    /// Write every (document, type, entity, count) edge to --output instead of the facet.
    #[arg(long, requires = "output")]
    edges: bool,

    /// Where --edges go: FILE.jsonl or FILE.parquet.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,

    /// Print JSON alone on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(args: EntitiesArgs, config_file: Option<&Path>) -> anyhow::Result<ExitCode> {
    let mut config = super::load_config(config_file)?;
    super::apply_index(&mut config, &args.index)?;
    let filter = Where::parse(&args.filters).map_err(anyhow::Error::msg)?;
    let reader = Searcher::open(&config.index.uri.value, false)?;
    let mut out = std::io::stdout().lock();
    if args.edges {
        let path = args
            .output
            .as_deref()
            .expect("clap requires --output; this is a bug");
        let written = write_edges(reader.as_ref(), &filter, args.kind.as_deref(), path)?;
        if args.json {
            serde_json::to_writer(
                &mut out,
                &serde_json::json!({
                    "edges": written,
                    "output": path.display().to_string(),
                }),
            )?;
            writeln!(out)?;
        } else {
            eprintln!("{written} edges written to {}", path.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    if args.labels {
        let labels = reader.label_facets(&filter, args.top as usize)?;
        if args.json {
            serde_json::to_writer_pretty(&mut out, &labels)?;
            writeln!(out)?;
        } else {
            for l in &labels {
                writeln!(out, "{:>7}  {}", l.documents, l.label)?;
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let facets = reader.entity_facets(&filter, args.kind.as_deref(), args.top as usize)?;
    if args.json {
        serde_json::to_writer_pretty(&mut out, &facets)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if facets.is_empty() {
        writeln!(out, "no entities")?;
    }
    writeln!(
        out,
        "{:>9} {:>9}  {:<8} entity",
        "documents", "mentions", "type"
    )?;
    for f in &facets {
        writeln!(
            out,
            "{:>9} {:>9}  {:<8} {}",
            f.documents, f.mentions, f.kind, f.text
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Write the edges to `path` (by its extension); returns how many.
fn write_edges(
    reader: &dyn ragline::indexers::IndexReader,
    filter: &Where,
    kind: Option<&str>,
    path: &Path,
) -> anyhow::Result<u64> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    match ext {
        "jsonl" => {
            let file = std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            let mut w = std::io::BufWriter::new(file);
            let mut n = 0u64;
            reader.entity_edges(filter, kind, &mut |e: EntityEdge| {
                serde_json::to_writer(&mut w, &e)
                    .map_err(|e| ragline::indexers::BackendError::Io(e.to_string()))?;
                w.write_all(b"\n")
                    .map_err(|e| ragline::indexers::BackendError::Io(e.to_string()))?;
                n += 1;
                Ok(())
            })?;
            w.flush()?;
            Ok(n)
        }
        #[cfg(feature = "parquet")]
        "parquet" => {
            let mut w = ragline::indexers::parquet::edges::EdgeWriter::create(path)?;
            reader.entity_edges(filter, kind, &mut |e| w.push(e))?;
            Ok(w.finish()?)
        }
        _ => bail!(
            "--output {}: give a .jsonl or .parquet file",
            path.display()
        ),
    }
}
