//! `ragline check [--config FILE]`: validate a pipeline without running it.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use ragline::jobs::{self, PipelineConfig};

use super::{EXIT_OK, EXIT_SETUP};

#[derive(Args, Debug)]
pub struct CheckArgs {}

pub fn run(_args: CheckArgs, config_file: Option<&Path>) -> anyhow::Result<ExitCode> {
    let (config, file) = match PipelineConfig::load(config_file) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(EXIT_SETUP));
        }
    };
    let source = file.as_ref().map_or_else(
        || "no ragline.toml here: the defaults".to_string(),
        |f| f.display().to_string(),
    );
    match jobs::check(&config) {
        Ok(report) => {
            println!("# pipeline from {source}: OK");
            println!("# index: {}", report.index);
            match &report.model {
                Some(m) => println!("# model: {m}"),
                None => println!("# model: none (chunk.enabled = false)"),
            }
            print!("{}", report.resolved);
            Ok(ExitCode::from(EXIT_OK))
        }
        Err(e) => {
            eprintln!("error: {source}: {e}");
            Ok(ExitCode::from(EXIT_SETUP))
        }
    }
}
