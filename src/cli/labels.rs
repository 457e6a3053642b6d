//! `ragline ner` and `ragline classify`: named entities and labels of the texts of a JSONL
//! file, one JSON line out per line in, in order (a bad line gets an `error` field, is
//! counted, and the run goes on).

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use ragline::connectors::BadRecord;
use ragline::embed::classify::{LabelChoice, ScoreFunction, SequenceClassifier};
use ragline::embed::ner::aggregate::Aggregation;
use ragline::embed::ner::{NerOptions, TokenClassifier};
use ragline::embed::{device, DTypeChoice, DeviceChoice};
use ragline::jobs::config::Parsed;
use serde_json::Value;

use super::{EXIT_FAILURES, EXIT_OK};

/// Texts read and classified at a time.
const READ_WINDOW: usize = 4096;

/// What both commands read and where they run.
#[derive(Args, Debug)]
pub struct TaskIo {
    /// JSONL input, `-` for standard input: each line a JSON object with a text field (its
    /// `id`, when present, is copied to the output) or a JSON string.
    #[arg(long, short)]
    input: PathBuf,

    /// JSONL output, `-` for standard output: one line per input line, in order.
    #[arg(long, short)]
    output: PathBuf,

    /// The field holding the text.
    #[arg(long, default_value = "text")]
    text_field: String,

    /// Where the model runs: auto, cpu, cuda, cuda:N or metal.
    #[arg(long, default_value = "auto", value_parser = Parsed::<DeviceChoice>::parse)]
    device: Parsed<DeviceChoice>,

    /// Number format: auto (f32 on the CPU, f16 on a GPU), f32, f16, bf16, int8. On the CPU,
    /// bf16 and int8 run the fused encoder's dense layers in that precision (BERT-like
    /// families; AMX makes bf16 about 3x f32 where the CPU has it), as embedders do.
    #[arg(long, default_value = "auto", value_parser = Parsed::<DTypeChoice>::parse)]
    dtype: Parsed<DTypeChoice>,

    /// Tokens per forward pass.
    #[arg(long, default_value_t = 16_384)]
    batch_tokens: usize,
}

#[derive(Args, Debug)]
pub struct NerArgs {
    /// The token classifier: a folder in the Hugging Face layout, a name under models/, or a
    /// hub id (BERT, XLM-RoBERTa, RoBERTa, DistilBERT, MPNet or ModernBERT
    /// `*ForTokenClassification`; tags from config.json's id2label).
    #[arg(long)]
    model: String,

    #[command(flatten)]
    io: TaskIo,

    /// How tokens become entities, as transformers' pipeline's aggregation_strategy: none
    /// (every token), simple (adjacent tokens of a type), first, average or max (a word's
    /// tokens agree first).
    #[arg(long, default_value = "simple", value_parser = Parsed::<Aggregation>::parse)]
    aggregation: Parsed<Aggregation>,

    /// Tokens consecutive windows of a long text share (default: 64, or a quarter of the
    /// model's length where that is less).
    #[arg(long)]
    stride: Option<usize>,

    /// Labels to leave out (comma-separated).
    #[arg(long, default_value = "O", value_delimiter = ',')]
    ignore_labels: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ClassifyArgs {
    /// The classifier: a folder in the Hugging Face layout, a name under models/, or a hub id
    /// (`*ForSequenceClassification` of BERT, XLM-RoBERTa, RoBERTa, DistilBERT, MPNet or
    /// ModernBERT; labels from config.json's id2label).
    #[arg(long)]
    model: String,

    #[command(flatten)]
    io: TaskIo,

    /// Labels per text, best first (default: all).
    #[arg(long)]
    top_k: Option<usize>,

    /// Only labels scoring at least this.
    #[arg(long)]
    threshold: Option<f32>,

    /// How logits become scores: the model's (softmax, or sigmoid for multi-label models and
    /// one-label ones), softmax, sigmoid, or none (the logits).
    #[arg(long, value_parser = ["softmax", "sigmoid", "none"])]
    function: Option<String>,
}

/// The input's lines in windows, and the output.
struct Lines {
    lines: std::iter::Enumerate<std::io::Lines<Box<dyn BufRead>>>,
    field: String,
}

impl Lines {
    fn open(io: &TaskIo) -> anyhow::Result<Self> {
        let reader: Box<dyn BufRead> = if io.input.as_os_str() == "-" {
            Box::new(BufReader::new(std::io::stdin()))
        } else {
            Box::new(BufReader::new(File::open(&io.input).with_context(
                || format!("cannot read --input {}", io.input.display()),
            )?))
        };
        Ok(Lines {
            lines: reader.lines().enumerate(),
            field: io.text_field.clone(),
        })
    }

    /// The next window: (line number, id, text or the reason it has none).
    #[allow(clippy::type_complexity)]
    fn next_window(
        &mut self,
    ) -> anyhow::Result<Vec<(usize, Option<Value>, Result<String, BadRecord>)>> {
        let mut window = Vec::new();
        for (i, line) in self.lines.by_ref() {
            let line = line.context("reading --input")?;
            window.push(super::embed::parse(i + 1, &line, &self.field));
            if window.len() == READ_WINDOW {
                break;
            }
        }
        Ok(window)
    }
}

fn output(path: &Path) -> anyhow::Result<Box<dyn Write>> {
    Ok(if path.as_os_str() == "-" {
        Box::new(BufWriter::new(std::io::stdout()))
    } else {
        Box::new(BufWriter::new(File::create(path).with_context(|| {
            format!("cannot write --output {}", path.display())
        })?))
    })
}

/// Run `each` over the input's windows of good texts and write one line per input line:
/// `field` holds what `each` gave, or `error` says why a line has none.
fn run_lines(
    io: &TaskIo,
    field: &str,
    verb: &str,
    mut each: impl FnMut(&[&str]) -> anyhow::Result<Vec<Value>>,
) -> anyhow::Result<ExitCode> {
    let mut lines = Lines::open(io)?;
    let mut out = output(&io.output)?;
    let bar = super::embed::spinner()?;
    let started = std::time::Instant::now();
    let (mut total, mut bad) = (0usize, 0usize);
    loop {
        let window = lines.next_window()?;
        if window.is_empty() {
            break;
        }
        let texts: Vec<&str> = window
            .iter()
            .filter_map(|(_, _, t)| t.as_deref().ok())
            .collect();
        let mut results = each(&texts)?.into_iter();
        for (line, id, text) in window {
            total += 1;
            let mut row = serde_json::Map::new();
            if let Some(id) = id {
                row.insert("id".into(), id);
            }
            match text {
                Ok(_) => {
                    let r = results.next().expect("a result for every good text");
                    row.insert(field.into(), r);
                }
                Err(reason) => {
                    bad += 1;
                    eprintln!("line {line}: {reason}");
                    row.insert("error".into(), reason.0.into());
                }
            }
            serde_json::to_writer(&mut out, &row)?;
            out.write_all(b"\n")?;
        }
        bar.set_position(total as u64);
    }
    out.flush()?;
    bar.finish_and_clear();
    eprintln!(
        "{verb} {} texts in {:.2}s; {bad} bad lines",
        total - bad,
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::from(if bad > 0 {
        EXIT_FAILURES
    } else {
        EXIT_OK
    }))
}

pub fn run_ner(args: NerArgs) -> anyhow::Result<ExitCode> {
    let devices = device::select(&args.io.device.value).context("cannot open the device")?;
    let model = TokenClassifier::load(
        &args.model,
        &devices[0].device,
        args.io.dtype.value,
        args.stride,
    )
    .with_context(|| format!("cannot load the token classifier `{}`", args.model))?;
    tracing::info!(
        target: ragline::NOTE,
        "finding entities on {} ({}; windows of {} tokens sharing {})",
        devices[0].label,
        model.encoder_kind(),
        model.max_len(),
        model.stride()
    );
    let options = NerOptions {
        aggregation: args.aggregation.value,
        ignore: args.ignore_labels.clone(),
    };
    run_lines(&args.io, "entities", "found the entities of", |texts| {
        let found = model.entities(texts, &options, args.io.batch_tokens)?;
        Ok(found
            .into_iter()
            .map(|e| serde_json::to_value(e).expect("entities are JSON"))
            .collect())
    })
}

pub fn run_classify(args: ClassifyArgs) -> anyhow::Result<ExitCode> {
    let devices = device::select(&args.io.device.value).context("cannot open the device")?;
    let model = SequenceClassifier::load(&args.model, &devices[0].device, args.io.dtype.value)
        .with_context(|| format!("cannot load the classifier `{}`", args.model))?;
    tracing::info!(
        target: ragline::NOTE,
        "classifying on {} ({}; {} labels)",
        devices[0].label,
        model.encoder_kind(),
        model.labels().len()
    );
    let function = args.function.as_deref().map(|f| match f {
        "softmax" => ScoreFunction::Softmax,
        "sigmoid" => ScoreFunction::Sigmoid,
        _ => ScoreFunction::None,
    });
    let choice = LabelChoice {
        top_k: args.top_k,
        threshold: args.threshold,
    };
    run_lines(&args.io, "labels", "classified", |texts| {
        let labels = model.classify(texts, choice, function, args.io.batch_tokens)?;
        Ok(labels
            .into_iter()
            .map(|l| serde_json::to_value(l).expect("labels are JSON"))
            .collect())
    })
}
