//! `ragline backfill --stage embed --model NEW`: migrate an index to another model;
//! `--stage sparse --model NEW`: compute every document's sparse vectors with another SPLADE
//! model.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use ragline::jobs::{self, Progress};

use super::enrich::{enrich_exit_code, print_enrich_summary};
use super::ingest::write_report;
use super::model_args::ModelArgs;
use super::EXIT_OK;

#[derive(Args, Debug)]
pub struct BackfillArgs {
    /// The index to migrate (sqlite://PATH or postgres://...). [default: sqlite://ragline.db]
    #[arg(long, env = "RAGLINE_INDEX")]
    index: Option<String>,

    /// The stage to backfill: embed (a new vector set, searched once complete) or sparse
    /// (every document's sparse vectors computed again with --model, at backfill priority).
    #[arg(long, default_value = "embed")]
    stage: String,

    /// Drop the vectors of models a finished migration retired (after this backfill, when
    /// --model is given).
    #[arg(long)]
    drop_old: bool,

    /// Keep running after the backfill, working new work as it arrives.
    #[arg(long)]
    follow: bool,

    /// Write the summary and every failure as JSON.
    #[arg(long)]
    report: Option<PathBuf>,

    /// Progress display: auto, bars, log, none.
    #[arg(long)]
    progress: Option<Progress>,

    /// --model is the model to migrate to (any dimension); device and batch flags apply.
    #[command(flatten)]
    model: ModelArgs,
}

pub fn run(args: BackfillArgs, config_file: Option<&Path>) -> anyhow::Result<ExitCode> {
    if args.stage == "sparse" {
        return sparse(args, config_file);
    }
    if args.stage != "embed" {
        bail!(
            "--stage {}: only the embed and sparse stages have models to backfill",
            args.stage
        );
    }
    let mut config = super::load_config(config_file)?;
    super::apply_index(&mut config, &args.index)?;
    let mut model = args.model.clone();
    let target = model.model.take();
    model.apply(&mut config.model);
    if let Some(p) = args.progress {
        config.run.progress = p;
    }
    if target.is_none() && !args.drop_old {
        bail!(
            "name the model to migrate to with --model (or drop retired vectors with --drop-old)"
        );
    }
    if let Some(report) = &args.report {
        std::fs::File::create(report)
            .with_context(|| format!("cannot write --report {}", report.display()))?;
    }
    let request = jobs::EnrichRequest {
        stages: vec![args.stage.clone()],
        follow: args.follow,
        model_override: None,
        metrics: None,
        queue: None,
    };
    let mut observer = super::observer(config.run.progress);
    let outcome = jobs::backfill(
        &config,
        target.as_deref(),
        &request,
        args.drop_old,
        observer.as_mut(),
    )?;
    for model in &outcome.dropped {
        println!("dropped the vectors of retired model `{model}`");
    }
    if args.drop_old && outcome.dropped.is_empty() {
        println!("no retired vector set to drop");
    }
    let Some(summary) = outcome.summary else {
        return Ok(ExitCode::from(EXIT_OK));
    };
    print_enrich_summary(&mut std::io::stdout().lock(), &summary)?;
    write_report(args.report.as_deref(), &summary)?;
    let status = jobs::status(&config)?;
    if let Some(b) = &status.backfill {
        println!(
            "backfill of `{}` not finished: {} of {} chunks embedded (run `ragline backfill \
             --model {}` again, or `ragline enrich`, to go on)",
            b.model, b.chunks_embedded, b.chunks_total, b.model
        );
    }
    Ok(enrich_exit_code(&summary))
}

/// `backfill --stage sparse --model NEW`: the sparse stage with another model (the index
/// records it; every document is queued again at backfill priority).
fn sparse(args: BackfillArgs, config_file: Option<&Path>) -> anyhow::Result<ExitCode> {
    if args.drop_old {
        bail!("--drop-old: sparse vectors are replaced document by document, nothing to drop");
    }
    let mut config = super::load_config(config_file)?;
    super::apply_index(&mut config, &args.index)?;
    let mut model = args.model.clone();
    let Some(target) = model.model.take() else {
        bail!("name the SPLADE model to move the sparse vectors to with --model");
    };
    model.apply(&mut config.model);
    if let Some(p) = args.progress {
        config.run.progress = p;
    }
    if let Some(report) = &args.report {
        std::fs::File::create(report)
            .with_context(|| format!("cannot write --report {}", report.display()))?;
    }
    config.stages.sparse.model = Some(target);
    let request = jobs::EnrichRequest {
        stages: vec![args.stage.clone()],
        follow: args.follow,
        ..jobs::EnrichRequest::default()
    };
    let mut observer = super::observer(config.run.progress);
    let summary = jobs::enrich(&config, &request, observer.as_mut())?;
    print_enrich_summary(&mut std::io::stdout().lock(), &summary)?;
    write_report(args.report.as_deref(), &summary)?;
    Ok(enrich_exit_code(&summary))
}
