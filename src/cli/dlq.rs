//! `ragline dlq list|show|requeue`: the dead-letter queue.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, Subcommand};

use ragline::lifecycle::report::{DeadLetter, DocumentLifecycle};
use ragline::lifecycle::CHUNK;

use super::{EXIT_FAILURES, EXIT_OK};

#[derive(Args, Debug)]
pub struct DlqArgs {
    /// The index (sqlite://PATH or postgres://...). [default: sqlite://ragline.db]
    #[arg(long, env = "RAGLINE_INDEX", global = true)]
    index: Option<String>,

    #[command(subcommand)]
    command: DlqCommand,
}

#[derive(Subcommand, Debug)]
enum DlqCommand {
    /// The dead documents, oldest first, with their last error.
    List {
        /// Only this stage's.
        #[arg(long)]
        stage: Option<String>,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A document's state in every stage, with every attempt's error.
    Show {
        doc_id: String,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Queue dead documents again (attempts reset, their errors kept). `enrich` picks up
    /// their embedding; documents that never reached the index (a distributed run's broker
    /// gave up on them) are run through an ingest at once, from the copy the index kept,
    /// with the settings of the run that dead-lettered them.
    Requeue {
        /// Only this stage's.
        #[arg(long)]
        stage: Option<String>,
        /// Every dead document.
        #[arg(long, conflicts_with = "doc_ids")]
        all: bool,
        /// Run the documents that never reached the index on this broker (workers,
        /// embedders and indexers started with the same URL do the work) instead of in this
        /// process.
        #[arg(long, env = "RAGLINE_QUEUE", value_name = "URL")]
        queue: Option<String>,
        /// Write the summary of that ingest as JSON.
        #[arg(long)]
        report: Option<std::path::PathBuf>,
        /// The documents to requeue.
        doc_ids: Vec<String>,
    },
}

pub fn run(args: DlqArgs, config_file: Option<&Path>) -> anyhow::Result<ExitCode> {
    let mut config = super::load_config(config_file)?;
    super::apply_index(&mut config, &args.index)?;
    let mut store = ragline::jobs::lifecycle_store(&config)?;
    let mut out = std::io::stdout().lock();
    match args.command {
        DlqCommand::List { stage, json } => {
            let dead = store.dead_letters(stage.as_deref())?;
            list(&mut out, &dead, json)?;
            Ok(ExitCode::from(EXIT_OK))
        }
        DlqCommand::Show { doc_id, json } => {
            let Some(doc) = store.document_lifecycle(&doc_id)? else {
                eprintln!("no document `{doc_id}` in {}", store.describe());
                return Ok(ExitCode::from(EXIT_FAILURES));
            };
            show(&mut out, &doc, json)?;
            Ok(ExitCode::from(EXIT_OK))
        }
        DlqCommand::Requeue {
            stage,
            all,
            queue,
            report,
            doc_ids,
        } => {
            if !all && doc_ids.is_empty() {
                bail!("name the documents to requeue, or give --all");
            }
            let ids = (!all).then_some(doc_ids.as_slice());
            // Documents dead before they reached the index: an ingest runs them now.
            let never_indexed: Vec<String> = store
                .dead_letters(stage.as_deref())?
                .into_iter()
                .filter(|d| d.stage == CHUNK && ids.is_none_or(|ids| ids.contains(&d.document_id)))
                .map(|d| d.document_id)
                .collect();
            let n = store.requeue(stage.as_deref(), ids)?;
            writeln!(out, "{n} documents queued again")?;
            drop(store);
            if never_indexed.is_empty() {
                return Ok(ExitCode::from(EXIT_OK));
            }
            ingest_buried(&mut out, &config, &never_indexed, queue.as_deref(), report)
        }
    }
}

/// `dlq list`: one line a dead document (or the JSON array).
fn list(out: &mut impl Write, dead: &[DeadLetter], json: bool) -> anyhow::Result<()> {
    if json {
        serde_json::to_writer_pretty(&mut *out, dead)?;
        writeln!(out)?;
        return Ok(());
    }
    if dead.is_empty() {
        writeln!(out, "the dead-letter queue is empty")?;
        return Ok(());
    }
    for d in dead {
        writeln!(
            out,
            "{}  [{}{}] {} attempts: {}",
            d.document_id,
            d.stage,
            if d.vector_set > 1 {
                format!(" set {}", d.vector_set)
            } else {
                String::new()
            },
            d.attempts,
            d.last_error.as_deref().unwrap_or("(no error recorded)")
        )?;
    }
    writeln!(
        out,
        "{} dead; `ragline dlq show DOC_ID` for every attempt, `ragline dlq requeue --all` to \
         try again",
        dead.len()
    )?;
    Ok(())
}

/// `dlq show`: a document's stages, each with every attempt's error.
fn show(out: &mut impl Write, doc: &DocumentLifecycle, json: bool) -> anyhow::Result<()> {
    if json {
        serde_json::to_writer_pretty(&mut *out, doc)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "{} ({}), {} chunks",
        doc.document_id,
        doc.source.as_deref().unwrap_or("no source"),
        doc.chunks
    )?;
    for s in &doc.stages {
        writeln!(
            out,
            "  {}{}: {} (priority {}, {} attempts)",
            s.stage,
            if s.vector_set > 0 {
                format!(" [set {}]", s.vector_set)
            } else {
                String::new()
            },
            s.status,
            s.priority,
            s.attempts
        )?;
        for e in &s.errors {
            writeln!(
                out,
                "    attempt {} at {} by {}: {}",
                e.attempt,
                time(e.at),
                e.worker,
                e.message
            )?;
        }
    }
    Ok(())
}

/// `dlq requeue` of documents that never reached the index: an ingest of the copies the
/// index kept (on the broker with `queue`).
fn ingest_buried(
    out: &mut impl Write,
    config: &ragline::jobs::PipelineConfig,
    never_indexed: &[String],
    queue: Option<&str>,
    report: Option<std::path::PathBuf>,
) -> anyhow::Result<ExitCode> {
    writeln!(
        out,
        "{} of them never reached the index: running them through an ingest{}",
        never_indexed.len(),
        queue.map(|q| format!(" on {q}")).unwrap_or_default()
    )?;
    let mut observer = super::observer(config.run.progress);
    let runs = ragline::jobs::requeue::run_buried(config, never_indexed, queue, observer.as_mut())?;
    for summary in &runs.summaries {
        super::ingest::print_summary(out, summary, false)?;
    }
    if let Some(summary) = runs.summaries.first() {
        super::ingest::write_report(report.as_deref(), summary)?;
    }
    for id in &runs.without_copy {
        writeln!(
            out,
            "  {id}: the index kept no copy of it: run `ragline ingest` on its source again"
        )?;
    }
    writeln!(
        out,
        "{} now in the index, {} dead again{}",
        runs.recovered.len(),
        runs.failed_again.len(),
        if runs.failed_again.is_empty() {
            String::new()
        } else {
            format!(": {}", runs.failed_again.join(", "))
        }
    )?;
    if !runs.failed_again.is_empty() || !runs.without_copy.is_empty() {
        return Ok(ExitCode::from(EXIT_FAILURES));
    }
    Ok(ExitCode::from(EXIT_OK))
}

/// A time in ms since the epoch, as UTC.
fn time(ms: i64) -> String {
    ragline::lifecycle::report::format_ms(ms)
}
