//! Command-line interface: one module per subcommand.

mod bench;
mod embed;
mod eval;
mod ingest;
mod model_args;
mod search;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Read documents, chunk them, embed the chunks and write them to an index.
    Ingest(ingest::IngestArgs),
    /// Embed texts from a JSONL file into a .npy or JSONL file of vectors.
    Embed(embed::EmbedArgs),
    /// Search an index by meaning, keywords, or both.
    Search(search::SearchArgs),
    /// Measure retrieval quality on a BEIR dataset (nDCG@10, recall, MRR per mode).
    Eval(eval::EvalArgs),
    /// Measure embedding throughput on this host (tokens/s, padding, memory, chunker MB/s).
    Bench(bench::BenchArgs),
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Ingest(args) => ingest::run(args),
        Command::Embed(args) => embed::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Search(args) => search::run(args),
        Command::Eval(args) => eval::run(args),
    }
}
