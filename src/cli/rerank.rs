//! `ragline rerank`: score passages against a query with a cross-encoder.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use ragline::embed::cross_encoder::{CrossEncoder, DEFAULT_BATCH_TOKENS};
use ragline::embed::{device, DTypeChoice, DeviceChoice};
use ragline::jobs::config::Parsed;
use serde_json::Value;

#[derive(Args, Debug)]
pub struct RerankArgs {
    /// The query (without --input).
    #[arg(required_unless_present = "input")]
    query: Option<String>,

    /// The passages to score against the query, printed best first.
    texts: Vec<String>,

    /// The cross-encoder: a folder in the Hugging Face layout, a name under models/, or a hub
    /// id (BERT, XLM-RoBERTa or ModernBERT sequence classification with one label).
    #[arg(long)]
    model: String,

    /// JSONL of pairs, `-` for standard input: each line {"query": ..., "text": ...}; prints
    /// one JSON line per pair, in order: {"index", "score", "raw_score"}.
    #[arg(long, short, conflicts_with_all = ["query", "texts"])]
    input: Option<PathBuf>,

    /// Where the model runs: auto, cpu, cuda, cuda:N or metal.
    #[arg(long, default_value = "auto", value_parser = Parsed::<DeviceChoice>::parse)]
    device: Parsed<DeviceChoice>,

    /// Number format: auto (f32 on the CPU, f16 on a GPU), f32, f16, bf16.
    #[arg(long, default_value = "auto", value_parser = Parsed::<DTypeChoice>::parse)]
    dtype: Parsed<DTypeChoice>,

    /// Tokens per forward pass.
    #[arg(long, default_value_t = DEFAULT_BATCH_TOKENS)]
    batch_tokens: usize,

    /// Print the scores as JSON: [{"index", "score", "raw_score"}], best first.
    #[arg(long)]
    json: bool,
}

pub fn run(args: RerankArgs) -> anyhow::Result<ExitCode> {
    let devices = device::select(&args.device.value).context("cannot open the device")?;
    let model = CrossEncoder::load(&args.model, &devices[0].device, args.dtype.value)
        .with_context(|| format!("cannot load the reranker `{}`", args.model))?;
    tracing::info!(target: ragline::NOTE, "reranking on {} ({})", devices[0].label, model.encoder_kind());
    let mut out = std::io::stdout().lock();
    if let Some(path) = &args.input {
        let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
            Box::new(BufReader::new(std::io::stdin()))
        } else {
            Box::new(BufReader::new(
                std::fs::File::open(path)
                    .with_context(|| format!("cannot open {}", path.display()))?,
            ))
        };
        let mut pairs = Vec::new();
        for (n, line) in reader.lines().enumerate() {
            let line = line.with_context(|| format!("reading {}", path.display()))?;
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(&line)
                .with_context(|| format!("{} line {}: not JSON", path.display(), n + 1))?;
            let field = |k: &str| {
                v.get(k)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .with_context(|| {
                        format!("{} line {}: no string field `{k}`", path.display(), n + 1)
                    })
            };
            pairs.push(model.encode_pair(&field("query")?, &field("text")?)?);
        }
        let scores = model.score_pairs(&pairs, args.batch_tokens)?;
        for (i, s) in scores.iter().enumerate() {
            serde_json::to_writer(
                &mut out,
                &serde_json::json!({"index": i, "score": s.score, "raw_score": s.raw}),
            )?;
            writeln!(out)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let query = args.query.as_deref().unwrap_or_default();
    let texts: Vec<&str> = args.texts.iter().map(String::as_str).collect();
    let scores = model.rerank(query, &texts, args.batch_tokens)?;
    let mut order: Vec<usize> = (0..texts.len()).collect();
    order.sort_by(|&a, &b| scores[b].raw.total_cmp(&scores[a].raw).then(a.cmp(&b)));
    if args.json {
        let rows: Vec<Value> = order
            .iter()
            .map(|&i| serde_json::json!({"index": i, "score": scores[i].score, "raw_score": scores[i].raw}))
            .collect();
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
    } else {
        for &i in &order {
            writeln!(out, "{:.4}  [{i}] {}", scores[i].score, texts[i])?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
