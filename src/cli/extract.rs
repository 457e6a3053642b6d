//! `ragline extract`: what the extract stage makes of files (text, headings, pages, title,
//! warnings), without a model or an index. For checking a corpus before ingesting it, and for
//! measuring extraction against other tools.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use ragline::connectors::filesystem::{read_document, Unusable};
use ragline::document::{BlockKind, Document};
use ragline::stages::extract::{
    Extract, ExtractConfig, DEFAULT_MAX_EXTRACT_MB, DEFAULT_MAX_FILE_SECONDS,
};
use ragline::stages::{Stage, StageError};
use serde::Serialize;

use super::{EXIT_FAILURES, EXIT_OK};

#[derive(Args, Debug)]
pub struct ExtractArgs {
    /// Files to extract (any format `ingest` reads, JSONL aside).
    #[arg(required = true)]
    files: Vec<PathBuf>,

    /// One JSON object per file on standard output (JSON Lines): id, status, reason, title,
    /// pages, page_starts, headings, warnings, seconds, text.
    #[arg(long)]
    json: bool,

    /// Seconds one file may take to extract; past it the file fails.
    #[arg(long, default_value_t = DEFAULT_MAX_FILE_SECONDS)]
    max_file_seconds: u64,

    /// MiB one file's extraction may hold; past it the file fails.
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_MAX_EXTRACT_MB)]
    max_extract_mb: u64,

    /// Files larger than this many bytes fail instead of being read.
    #[arg(long, default_value_t = 100 << 20)]
    max_file_bytes: u64,

    /// Extract in a child process, so a crash inside a parser (a stack overflow, an abort)
    /// fails that file alone.
    #[arg(long)]
    isolate_extraction: bool,
}

/// One file's extraction, as `--json` prints it.
#[derive(Serialize)]
struct Report {
    id: String,
    /// `indexed` (it would be), `failed` or `dropped`.
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    title: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pages: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    page_starts: Vec<usize>,
    headings: Vec<Heading>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    seconds: f64,
    text: String,
}

#[derive(Serialize)]
struct Heading {
    level: u8,
    text: String,
}

pub fn run(args: ExtractArgs) -> anyhow::Result<ExitCode> {
    if args.max_file_seconds == 0 {
        anyhow::bail!("--max-file-seconds must be at least 1");
    }
    let mut stage = Extract::new(ExtractConfig {
        max_file_time: Duration::from_secs(args.max_file_seconds),
        max_memory: args.max_extract_mb.max(16) << 20,
        isolate: if args.isolate_extraction {
            Some(ragline::jobs::ingest::extraction_program()?)
        } else {
            None
        },
    });
    let mut out = std::io::stdout().lock();
    let mut failed = false;
    for path in &args.files {
        let id = path.display().to_string();
        let started = Instant::now();
        let report = match read_document(path, id.clone(), args.max_file_bytes) {
            Ok(mut doc) => {
                let result = stage.process(&mut doc);
                report(id, doc, result, started.elapsed())
            }
            Err(Unusable::Failed(reason)) => failure(id, "failed", reason, started.elapsed()),
            Err(Unusable::Dropped(reason)) => failure(id, "dropped", reason, started.elapsed()),
        };
        failed |= report.status == "failed";
        if args.json {
            serde_json::to_writer(&mut out, &report)?;
            writeln!(out)?;
            continue;
        }
        let what = match (&report.reason, report.pages) {
            (Some(reason), _) => format!("{}: {reason}", report.status),
            (None, Some(n)) => format!("{n} pages, {:.3}s", report.seconds),
            (None, None) => format!("{:.3}s", report.seconds),
        };
        writeln!(out, "==> {} ({what})", report.id)?;
        if let Some(title) = &report.title {
            writeln!(out, "title: {title}")?;
        }
        for w in &report.warnings {
            writeln!(out, "warning: {w}")?;
        }
        if !report.text.is_empty() {
            writeln!(out, "{}", report.text)?;
        }
    }
    Ok(ExitCode::from(if failed { EXIT_FAILURES } else { EXIT_OK }))
}

fn report(
    id: String,
    doc: Document,
    result: Result<Vec<Document>, StageError>,
    took: Duration,
) -> Report {
    if let Err(e) = result {
        return failure(id, "failed", e.to_string(), took);
    }
    if let Some(reason) = doc.dropped {
        return failure(id, "dropped", reason, took);
    }
    let headings = doc
        .blocks
        .iter()
        .filter_map(|b| match &b.kind {
            BlockKind::Heading { level, text } => Some(Heading {
                level: *level,
                text: text.clone(),
            }),
            _ => None,
        })
        .collect();
    Report {
        id,
        status: "indexed",
        reason: None,
        title: doc.fields.title,
        pages: doc.fields.metadata.get("pages").and_then(|v| v.as_u64()),
        page_starts: doc.page_starts,
        headings,
        warnings: doc.warnings.into_iter().map(|(_, w)| w).collect(),
        seconds: took.as_secs_f64(),
        text: doc.fields.text,
    }
}

fn failure(id: String, status: &'static str, reason: String, took: Duration) -> Report {
    Report {
        id,
        status,
        reason: Some(reason),
        title: None,
        pages: None,
        page_starts: Vec::new(),
        headings: Vec::new(),
        warnings: Vec::new(),
        seconds: took.as_secs_f64(),
        text: String::new(),
    }
}
