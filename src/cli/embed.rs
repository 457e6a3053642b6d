//! `ragline embed`: texts in, vectors out.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use ragline::embed::npy::NpyWriter;
use ragline::embed::texts::embed_texts;
use ragline::indexers::parquet::{ParquetWriter, Row};
use serde_json::Value;

use std::sync::Arc;

use ragline::embed::tokenizer::TextTokenizer;
use ragline::embed::EmbeddingModel;
use ragline::remote::embed::{estimate_tokens, Input, RemoteEmbedder};
use rayon::prelude::*;

use super::model_args::{load_first, ModelArgs};
use super::remote_args::RemoteArgs;
use super::{EXIT_FAILURES, EXIT_OK};

/// Lines read and embedded together.
const READ_WINDOW: usize = 65_536;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Prompt {
    /// No prompt.
    None,
    /// The model's query prompt (or --query-prompt): sentence-transformers' `encode_query`.
    Query,
    /// The model's document prompt (or --document-prompt): `encode_document`.
    #[value(alias = "passage")]
    Document,
}

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

    #[command(flatten)]
    model: ModelArgs,

    #[command(flatten)]
    remote: RemoteArgs,
}

/// A text's vector, or why it has none.
type Vector = Result<Vec<f32>, String>;

/// What computes the vectors: the model here, or a service.
enum Engine {
    Local {
        model: Box<EmbeddingModel>,
        prompt: Vec<u32>,
        batch_tokens: usize,
    },
    Remote {
        remote: Arc<RemoteEmbedder>,
        tokenizer: Box<TextTokenizer>,
    },
}

impl Engine {
    fn dimension(&self) -> usize {
        match self {
            Engine::Local { model, .. } => model.dimension(),
            Engine::Remote { remote, .. } => remote.dimension().unwrap_or(0),
        }
    }

    /// One result per text, and the tokens embedded.
    fn embed(&self, texts: &[&str]) -> anyhow::Result<(Vec<Vector>, usize)> {
        match self {
            Engine::Local {
                model,
                prompt,
                batch_tokens,
            } => {
                let mut vectors = Vec::with_capacity(texts.len());
                let stats = embed_texts(model, texts, prompt, *batch_tokens, |_, v| {
                    vectors.push(Ok(v));
                    Ok(())
                })?;
                Ok((vectors, stats.tokens))
            }
            Engine::Remote { remote, tokenizer } => {
                let room = tokenizer.max_content_len();
                let sizes: Vec<usize> = texts
                    .par_iter()
                    .map(|t| {
                        tokenizer
                            .ids_for_embedding(t, &[])
                            .map_or_else(|_| estimate_tokens(t), |ids| ids.len().min(room) + 2)
                    })
                    .collect();
                let inputs: Vec<Input<'_>> = texts
                    .iter()
                    .zip(&sizes)
                    .map(|(&text, &tokens)| Input { text, tokens })
                    .collect();
                Ok((remote.embed(&inputs), sizes.iter().sum()))
            }
        }
    }
}

enum Sink {
    Npy(NpyWriter),
    Parquet(Box<ParquetWriter>),
    Jsonl(Box<dyn Write>),
}

pub fn run(args: EmbedArgs, config_file: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    let mut config = super::load_config(config_file)?;
    args.remote.apply(&mut config)?;
    let model_config = args.model.resolve(&config);
    let engine = if config.stages.embed.remote.enabled() {
        if args.prompt.is_some_and(|p| !matches!(p, Prompt::None)) || args.prompt_name.is_some() {
            anyhow::bail!(
                "--prompt with a remote embedder: the service applies its model's prompts \
                 itself; leave --prompt out"
            );
        }
        config.validate()?;
        let files = ragline::pipeline::model_files(&model_config.name)?;
        Engine::Remote {
            remote: ragline::pipeline::remote::remote_embedder(&config.stages.embed.remote)?,
            tokenizer: Box::new(ragline::embed::remote::load_tokenizer(&files)?),
        }
    } else {
        let (_, devices, model) = load_first(&model_config)?;
        let device = &devices[0];
        eprintln!("embedding on {} ({})", device.label, device.reason);
        eprintln!("encoder: {}", model.encoder_kind());
        let batch_tokens = ragline::pipeline::batch_tokens(&model_config, device);
        let named = args.prompt_name.clone().or_else(|| {
            args.prompt
                .is_none()
                .then(|| model.files.default_prompt_name.clone())?
        });
        let prompt: Vec<u32> = match (args.prompt, named) {
            (_, Some(name)) => model.tokenizer.prompt_ids(model.files.prompt(&name)?)?,
            (None | Some(Prompt::None), None) => Vec::new(),
            (Some(Prompt::Query), None) => model.tokenizer.query_prompt_ids().to_vec(),
            (Some(Prompt::Document), None) => model.tokenizer.passage_prompt_ids().to_vec(),
        };
        Engine::Local {
            model: Box::new(model),
            prompt,
            batch_tokens,
        }
    };

    let reader: Box<dyn BufRead> = if args.input.as_os_str() == "-" {
        Box::new(BufReader::new(std::io::stdin()))
    } else {
        Box::new(BufReader::new(File::open(&args.input).with_context(
            || format!("cannot read --input {}", args.input.display()),
        )?))
    };
    let out_name = args.output.to_string_lossy().to_string();
    let mut sink = if out_name.ends_with(".npy") {
        Sink::Npy(
            NpyWriter::create(&args.output, engine.dimension())
                .with_context(|| format!("cannot write --output {out_name}"))?,
        )
    } else if out_name.ends_with(".parquet") {
        Sink::Parquet(Box::new(
            ParquetWriter::create(&args.output, Some(engine.dimension()))
                .with_context(|| format!("cannot write --output {out_name}"))?,
        ))
    } else if out_name == "-" {
        Sink::Jsonl(Box::new(BufWriter::new(std::io::stdout())))
    } else {
        Sink::Jsonl(Box::new(BufWriter::new(
            File::create(&args.output)
                .with_context(|| format!("cannot write --output {out_name}"))?,
        )))
    };

    let bar = if std::io::stderr().is_terminal() {
        let b = ProgressBar::new_spinner();
        b.set_style(ProgressStyle::with_template(
            "{spinner} {pos} texts {per_sec} {elapsed}",
        )?);
        b
    } else {
        ProgressBar::hidden()
    };
    let started = std::time::Instant::now();
    let (mut total, mut bad, mut tokens) = (0usize, 0usize, 0usize);
    let mut lines = reader.lines().enumerate();
    loop {
        // One window: (line number, id, text or the reason it has none).
        let mut window: Vec<(usize, Option<Value>, Result<String, String>)> = Vec::new();
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
        tokens += window_tokens;
        for ((line, id, text), vector) in window.into_iter().zip(vectors) {
            total += 1;
            let (vector, error) = match (&text, vector) {
                (Err(reason), _) => (Vec::new(), Some(reason.clone())),
                (Ok(_), Ok(v)) => (v, None),
                (Ok(_), Err(reason)) => (Vec::new(), Some(reason)),
            };
            if let Some(reason) = &error {
                bad += 1;
                eprintln!("line {line}: {reason}");
            }
            match &mut sink {
                Sink::Npy(w) => {
                    let row = if error.is_some() {
                        vec![f32::NAN; engine.dimension()]
                    } else {
                        vector
                    };
                    w.write_row(&row)?;
                }
                Sink::Parquet(w) => {
                    let id = match &id {
                        Some(Value::String(s)) => s.clone(),
                        Some(v) => v.to_string(),
                        None => line.to_string(),
                    };
                    let row = Row {
                        id: &id,
                        kind: "text",
                        text: text.as_deref().ok(),
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
                    match error {
                        Some(reason) => obj.insert("error".into(), Value::String(reason)),
                        None => obj.insert("vector".into(), serde_json::to_value(vector)?),
                    };
                    serde_json::to_writer(&mut *w, &obj)?;
                    w.write_all(b"\n")?;
                }
            }
        }
        bar.set_position(total as u64);
    }
    match sink {
        Sink::Npy(w) => {
            w.finish().context("writing --output")?;
        }
        Sink::Parquet(w) => {
            w.finish().context("writing --output")?;
        }
        Sink::Jsonl(mut w) => w.flush().context("writing --output")?,
    }
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "embedded {} texts ({} tokens) in {secs:.1}s: {:.0} tokens/s; {bad} bad lines",
        total - bad,
        tokens,
        tokens as f64 / secs.max(1e-9)
    );
    if bad > 0 {
        eprintln!(
            "bad lines (and texts the service refused) got NaN rows (npy), a null vector and \
             an `error` (Parquet) or an `error` field (JSONL), so rows stay aligned"
        );
        return Ok(ExitCode::from(EXIT_FAILURES));
    }
    Ok(ExitCode::from(EXIT_OK))
}

fn parse(line: usize, raw: &str, field: &str) -> (usize, Option<Value>, Result<String, String>) {
    let value: Value = match serde_json::from_str(raw) {
        Ok(v) => v,
        Err(e) => {
            return (
                line,
                None,
                Err(format!("invalid JSON ({e}); one JSON object per line")),
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
                    Err(format!("no string field `{field}`; set --text-field")),
                ),
            }
        }
        _ => (line, None, Err("not a JSON object or string".into())),
    }
}
