//! `ragline embed`: texts in, vectors out.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use ragline::connectors::BadRecord;
use ragline::embed::npy::NpyWriter;
#[cfg(feature = "parquet")]
use ragline::indexers::parquet::{ParquetWriter, Row};
use ragline::jobs::embed::{EmbedRequest, Engine, Output, Prompt};
use serde_json::Value;

use super::model_args::ModelArgs;
use super::remote_args::RemoteArgs;
use super::{EXIT_FAILURES, EXIT_OK};

/// Lines read and embedded together.
const READ_WINDOW: usize = 65_536;

#[derive(Args, Debug)]
pub struct EmbedArgs {
    /// JSONL input, `-` for standard input: each line a JSON object with a text field (its
    /// `id`, when present, is copied to the output) or a JSON string.
    #[arg(long, short)]
    input: PathBuf,

    /// Output: FILE.npy (float32, one row per input line), FILE.parquet (id, text and the
    /// vector as a fixed-size float32 list; zstd), FILE.jsonl, or `-` for JSONL on standard
    /// output.
    #[arg(long, short)]
    output: PathBuf,

    /// The field holding the text.
    #[arg(long, default_value = "text")]
    text_field: String,

    /// Which prompt goes before each text. Without it (and without --prompt-name) the
    /// model's default prompt, else none, as sentence-transformers' `encode` does.
    #[arg(long, value_enum, conflicts_with = "prompt_name")]
    prompt: Option<Prompt>,

    /// The model's prompt of this name (config_sentence_transformers.json `prompts`), as
    /// sentence-transformers' `encode(prompt_name=...)`.
    #[arg(long)]
    prompt_name: Option<String>,

    /// --model is a sparse (SPLADE) model: each text's vector is its non-zero vocabulary
    /// entries, written as JSONL `{"indices": [...], "values": [...]}` (with `id` when the
    /// input has one), as sentence-transformers' `SparseEncoder.encode` computes them.
    #[arg(long, conflicts_with_all = ["prompt", "prompt_name"])]
    sparse: bool,

    #[command(flatten)]
    model: ModelArgs,

    #[command(flatten)]
    remote: RemoteArgs,
}

enum Sink {
    Npy(NpyWriter),
    #[cfg(feature = "parquet")]
    Parquet(Box<ParquetWriter>),
    Jsonl(Box<dyn Write>),
}

impl Sink {
    /// The writer `--output` names by its extension (`-`: JSONL on stdout).
    fn open(output: &std::path::Path, dimension: usize, sparse: bool) -> anyhow::Result<Sink> {
        let name = output.to_string_lossy().to_string();
        let cannot = || format!("cannot write --output {name}");
        if sparse && (name.ends_with(".npy") || name.ends_with(".parquet")) {
            anyhow::bail!(
                "--sparse writes JSONL ({{\"indices\", \"values\"}} per text): give --output \
                 FILE.jsonl or -, not {name}"
            );
        }
        Ok(if name.ends_with(".npy") {
            Sink::Npy(NpyWriter::create(output, dimension).with_context(cannot)?)
        } else if name.ends_with(".parquet") {
            #[cfg(feature = "parquet")]
            let sink = Sink::Parquet(Box::new(
                ParquetWriter::create(output, Some(dimension)).with_context(cannot)?,
            ));
            #[cfg(not(feature = "parquet"))]
            let sink = Err(ragline::jobs::JobError::NotBuilt {
                what: "--output FILE.parquet".into(),
                feature: "parquet",
            })?;
            sink
        } else if name == "-" {
            Sink::Jsonl(Box::new(BufWriter::new(std::io::stdout())))
        } else {
            Sink::Jsonl(Box::new(BufWriter::new(
                File::create(output).with_context(cannot)?,
            )))
        })
    }

    /// One input line's row: its vector, or its error (a NaN row in npy, a null vector in
    /// Parquet, an `error` field in JSONL), so rows stay aligned with the input.
    #[cfg_attr(not(feature = "parquet"), allow(unused_variables))]
    fn write(
        &mut self,
        line: usize,
        id: Option<Value>,
        text: Option<&str>,
        vector: Option<Output>,
        error: Option<String>,
        dimension: usize,
    ) -> anyhow::Result<()> {
        let (vector, sparse) = match vector {
            Some(Output::Dense(v)) => (v, None),
            Some(Output::Sparse(v)) => (Vec::new(), Some(v)),
            None => (Vec::new(), None),
        };
        match self {
            Sink::Npy(w) => {
                let row = if error.is_some() {
                    vec![f32::NAN; dimension]
                } else {
                    vector
                };
                w.write_row(&row)?;
            }
            #[cfg(feature = "parquet")]
            Sink::Parquet(w) => {
                let id = match &id {
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => v.to_string(),
                    None => line.to_string(),
                };
                let row = Row {
                    id: &id,
                    kind: "text",
                    text,
                    error: error.as_deref(),
                    vector: error.is_none().then_some(vector.as_slice()),
                    ..Row::default()
                };
                w.push(&row).map_err(anyhow::Error::msg)?;
            }
            Sink::Jsonl(w) => {
                let mut obj = serde_json::Map::new();
                if let Some(id) = id {
                    obj.insert("id".into(), id);
                }
                match (error, sparse) {
                    (Some(reason), _) => {
                        obj.insert("error".into(), Value::String(reason));
                    }
                    (None, Some(v)) => {
                        obj.insert("indices".into(), serde_json::to_value(v.indices)?);
                        obj.insert("values".into(), serde_json::to_value(v.values)?);
                    }
                    (None, None) => {
                        obj.insert("vector".into(), serde_json::to_value(vector)?);
                    }
                }
                serde_json::to_writer(&mut *w, &obj)?;
                w.write_all(b"\n")?;
            }
        }
        Ok(())
    }

    fn finish(self) -> anyhow::Result<()> {
        match self {
            Sink::Npy(w) => {
                w.finish().context("writing --output")?;
            }
            #[cfg(feature = "parquet")]
            Sink::Parquet(w) => {
                w.finish().context("writing --output")?;
            }
            Sink::Jsonl(mut w) => w.flush().context("writing --output")?,
        }
        Ok(())
    }
}

/// What `embed` did: texts read, bad lines, tokens embedded.
#[derive(Default)]
struct Totals {
    total: usize,
    bad: usize,
    tokens: usize,
}

pub fn run(args: EmbedArgs, config_file: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    let mut config = super::load_config(config_file)?;
    args.remote.apply(&mut config)?;
    let model_config = args.model.resolve(&config);
    let request = EmbedRequest {
        sparse: args.sparse,
        prompt: args.prompt,
        prompt_name: args.prompt_name.clone(),
    };
    let engine = Engine::new(&request, &config, &model_config)?;
    let reader: Box<dyn BufRead> = if args.input.as_os_str() == "-" {
        Box::new(BufReader::new(std::io::stdin()))
    } else {
        Box::new(BufReader::new(File::open(&args.input).with_context(
            || format!("cannot read --input {}", args.input.display()),
        )?))
    };
    let mut sink = Sink::open(&args.output, engine.dimension(), args.sparse)?;
    let bar = spinner()?;
    let started = std::time::Instant::now();
    let mut n = Totals::default();
    let mut lines = reader.lines().enumerate();
    loop {
        // One window: (line number, id, text or the reason it has none).
        let mut window: Vec<(usize, Option<Value>, Result<String, BadRecord>)> = Vec::new();
        for (i, line) in lines.by_ref() {
            let line = line.context("reading --input")?;
            window.push(parse(i + 1, &line, &args.text_field));
            if window.len() == READ_WINDOW {
                break;
            }
        }
        if window.is_empty() {
            break;
        }
        let texts: Vec<&str> = window
            .iter()
            .map(|(_, _, t)| t.as_deref().unwrap_or(""))
            .collect();
        let (vectors, window_tokens) = engine.embed(&texts)?;
        n.tokens += window_tokens;
        for ((line, id, text), vector) in window.into_iter().zip(vectors) {
            n.total += 1;
            let (vector, error) = match (&text, vector) {
                (Err(reason), _) => (None, Some(reason.0.clone())),
                (Ok(_), Ok(v)) => (Some(v), None),
                (Ok(_), Err(reason)) => (None, Some(reason.0)),
            };
            if let Some(reason) = &error {
                n.bad += 1;
                eprintln!("line {line}: {reason}");
            }
            let text = text.as_deref().ok();
            sink.write(line, id, text, vector, error, engine.dimension())?;
        }
        bar.set_position(n.total as u64);
    }
    sink.finish()?;
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "embedded {} texts ({} tokens) in {secs:.2}s: {:.0} tokens/s; {} bad lines",
        n.total - n.bad,
        n.tokens,
        n.tokens as f64 / secs.max(1e-9),
        n.bad
    );
    if n.bad > 0 {
        eprintln!(
            "bad lines (and texts the service refused) got NaN rows (npy), a null vector and \
             an `error` (Parquet) or an `error` field (JSONL), so rows stay aligned"
        );
        return Ok(ExitCode::from(EXIT_FAILURES));
    }
    Ok(ExitCode::from(EXIT_OK))
}

/// A spinner counting texts on a terminal; hidden otherwise.
pub(super) fn spinner() -> anyhow::Result<ProgressBar> {
    Ok(if std::io::stderr().is_terminal() {
        let b = ProgressBar::new_spinner();
        b.set_style(ProgressStyle::with_template(
            "{spinner} {pos} texts {per_sec} {elapsed}",
        )?);
        b
    } else {
        ProgressBar::hidden()
    })
}

pub(super) fn parse(
    line: usize,
    raw: &str,
    field: &str,
) -> (usize, Option<Value>, Result<String, BadRecord>) {
    let value: Value = match serde_json::from_str(raw) {
        Ok(v) => v,
        Err(e) => {
            return (
                line,
                None,
                Err(BadRecord(format!(
                    "invalid JSON ({e}); one JSON object per line"
                ))),
            )
        }
    };
    match value {
        Value::String(s) => (line, None, Ok(s)),
        Value::Object(mut m) => {
            let id = m.remove("id");
            match m.remove(field) {
                Some(Value::String(s)) => (line, id, Ok(s)),
                _ => (
                    line,
                    id,
                    Err(BadRecord(format!(
                        "no string field `{field}`; set --text-field"
                    ))),
                ),
            }
        }
        _ => (
            line,
            None,
            Err(BadRecord("not a JSON object or string".into())),
        ),
    }
}
