//! `ragline status`: the lifecycle of an index at a glance.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use ragline::jobs;
use ragline::lifecycle::report::{StageCounts, StatusReport};
use ragline::lifecycle::SPARSE;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The index (sqlite://PATH or postgres://...). [default: sqlite://ragline.db]
    #[arg(long, env = "RAGLINE_INDEX")]
    index: Option<String>,

    /// Print the status as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: StatusArgs, config_file: Option<&Path>) -> anyhow::Result<ExitCode> {
    let mut config = super::load_config(config_file)?;
    super::apply_index(&mut config, &args.index)?;
    let report = jobs::status(&config)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        print(&mut out, &report)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print(out: &mut dyn Write, r: &StatusReport) -> anyhow::Result<()> {
    writeln!(
        out,
        "{}: {} documents, {} chunks",
        r.index, r.documents, r.chunks
    )?;
    writeln!(
        out,
        "{:<8} {:>9} {:>11} {:>8} {:>6} {:>9}  oldest pending",
        "stage", "pending", "in_progress", "failed", "dead", "done"
    )?;
    for (name, c) in &r.stages {
        row(out, name, c)?;
    }
    for s in &r.vector_sets {
        writeln!(
            out,
            "vectors  set {} `{}` ({} dims): {} of {} chunks embedded{}",
            s.id,
            s.model,
            s.dimension,
            s.embedded,
            s.total,
            match s.state.as_str() {
                "active" => "  [searched]",
                "backfill" => "  [backfilling]",
                _ => "  [retired: `ragline backfill --drop-old` drops it]",
            }
        )?;
        if let Some(a) = &s.ann {
            writeln!(
                out,
                "         ANN ({}, HNSW) {}: {} vectors, {} changes pending; search ef {} {}",
                a.dtype,
                a.state,
                a.vectors,
                a.changes_pending,
                a.ef,
                match a.recall {
                    Some(r) => format!("(recall@10 {r:.3} measured, target {})", a.recall_target),
                    None => format!("(not measured yet; target {})", a.recall_target),
                }
            )?;
        }
    }
    if let (Some(model), Some(c)) = (&r.sparse_model, r.stages.get(SPARSE)) {
        writeln!(
            out,
            "sparse   `{model}`: {} of {} documents done",
            c.done,
            c.pending + c.in_progress + c.failed + c.dead + c.done
        )?;
    }
    if let Some(b) = &r.backfill {
        writeln!(
            out,
            "backfill to `{}`: {} of {} documents queued ({}), {} done; {} of {} chunks \
             embedded ({:.1}%)",
            b.model,
            b.documents_queued,
            b.documents_total,
            if b.all_queued {
                "all".to_string()
            } else {
                format!("watermark {}", b.watermark.as_deref().unwrap_or("(start)"))
            },
            b.documents_done,
            b.chunks_embedded,
            b.chunks_total,
            100.0 * b.chunks_embedded as f64 / b.chunks_total.max(1) as f64
        )?;
        row(out, "backfill", &b.stage)?;
    }
    Ok(())
}

fn row(out: &mut dyn Write, name: &str, c: &StageCounts) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:<8} {:>9} {:>11} {:>8} {:>6} {:>9}  {}{}",
        name,
        c.pending,
        c.in_progress,
        c.failed,
        c.dead,
        c.done,
        c.oldest_pending_secs
            .map_or("-".to_string(), |s| format!("{s:.0}s")),
        if c.paused { "  PAUSED" } else { "" }
    )?;
    if c.waiting_on_dependency > 0 {
        writeln!(
            out,
            "{:<8} {} of them wait for a stage `{name}` depends on",
            "", c.waiting_on_dependency
        )?;
    }
    Ok(())
}
