//! `ragline promote DOC_ID...`: embed these documents next.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

#[derive(Args, Debug)]
pub struct PromoteArgs {
    /// Documents whose pending embedding goes to the front of the queue.
    #[arg(required = true)]
    doc_ids: Vec<String>,

    /// The index (sqlite://PATH or postgres://...). [default: sqlite://ragline.db]
    #[arg(long, env = "RAGLINE_INDEX")]
    index: Option<String>,
}

pub fn run(args: PromoteArgs, config_file: Option<&Path>) -> anyhow::Result<ExitCode> {
    let mut config = super::load_config(config_file)?;
    super::apply_index(&mut config, &args.index)?;
    let n = ragline::jobs::lifecycle_store(&config)?.promote(&args.doc_ids)?;
    println!(
        "{n} of {} documents moved to interactive priority (the others have nothing pending)",
        args.doc_ids.len()
    );
    Ok(ExitCode::SUCCESS)
}
