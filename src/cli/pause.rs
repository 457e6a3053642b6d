//! `ragline pause STAGE` / `ragline resume STAGE`.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

#[derive(Args, Debug)]
pub struct PauseArgs {
    /// The stage (embed).
    stage: String,

    /// The index (sqlite://PATH or postgres://...). [default: sqlite://ragline.db]
    #[arg(long, env = "RAGLINE_INDEX")]
    index: Option<String>,
}

pub fn run(args: PauseArgs, config_file: Option<&Path>, pause: bool) -> anyhow::Result<ExitCode> {
    let mut config = super::load_config(config_file)?;
    super::apply_index(&mut config, &args.index)?;
    ragline::jobs::lifecycle_store(&config)?.set_paused(&args.stage, pause)?;
    if pause {
        println!(
            "{} paused: workers claim none of its work (what they hold, they finish); \
             `ragline resume {}` lets them go on",
            args.stage, args.stage
        );
    } else {
        println!("{} resumed", args.stage);
    }
    Ok(ExitCode::SUCCESS)
}
