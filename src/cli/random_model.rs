//! `ragline random-model` (hidden): write a random-weight BERT in the Hugging Face layout, with
//! a real model's tokenizer, for tests and speed measurements (a second model to migrate to,
//! a BERT-base-shaped model to time).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use ragline::embed::random::{save_random_family_with, RandomOptions};
use ragline::embed::random_heads::{
    save_random_classifier, save_random_reranker, save_random_splade, ClassifierTask,
    RandomClassifier,
};

#[derive(Args, Debug)]
pub struct RandomModelArgs {
    /// The model folder whose tokenizer and sentence-transformers settings are copied.
    #[arg(long)]
    base: PathBuf,
    /// Where to write the model.
    #[arg(long)]
    out: PathBuf,
    /// Hidden size (the vectors' dimension).
    #[arg(long, default_value_t = 48)]
    hidden: usize,
    /// Encoder layers.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// The architecture: bert, xlm-roberta, distilbert, mpnet, modernbert, qwen3 or gemma3
    /// (each with its own sentence-transformers settings: see
    /// `ragline::embed::random::save_random_family`).
    #[arg(long, default_value = "bert")]
    family: String,
    /// Seed of the weights.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// sentence_bert_config.json's max_seq_length (long-input models), with the positions
    /// for it.
    #[arg(long)]
    max_seq_length: Option<usize>,
    /// The published model's shape (modernbert: ModernBERT-base; qwen3:
    /// Qwen3-Embedding-0.6B; gemma3: EmbeddingGemma-300m), not --hidden and --layers.
    #[arg(long)]
    real_shape: bool,
    /// What the model does: embed (a sentence-transformers embedding model), rerank (a
    /// one-label cross-encoder: bert, xlm-roberta or modernbert), sparse (a SPLADE model:
    /// BERT with its masked-language-model head), ner (token classification, CoNLL's tags),
    /// classify (sequence classification, four labels) or classify-multi (multi-label).
    #[arg(long, default_value = "embed",
          value_parser = ["embed", "rerank", "sparse", "ner", "classify", "classify-multi"])]
    task: String,
    /// The tokenizer's model_max_length for ner and classify models (their windows and
    /// truncation).
    #[arg(long, default_value_t = 128)]
    max_len: usize,
}

pub fn run(args: RandomModelArgs) -> anyhow::Result<ExitCode> {
    let written = match args.task.as_str() {
        "rerank" => save_random_reranker(
            &args.base,
            &args.out,
            &args.family,
            args.hidden,
            args.layers,
            args.seed,
        ),
        "sparse" => save_random_splade(&args.base, &args.out, args.hidden, args.layers, args.seed),
        "ner" | "classify" | "classify-multi" => save_random_classifier(
            &args.base,
            &args.out,
            &RandomClassifier {
                family: &args.family,
                task: match args.task.as_str() {
                    "ner" => ClassifierTask::Token,
                    "classify" => ClassifierTask::Sequence,
                    _ => ClassifierTask::MultiLabel,
                },
                hidden: args.hidden,
                layers: args.layers,
                seed: args.seed,
                max_len: args.max_len,
                real_shape: args.real_shape,
            },
        ),
        _ => save_random_family_with(
            &args.base,
            &args.out,
            &args.family,
            args.hidden,
            args.layers,
            args.seed,
            RandomOptions {
                max_seq_length: args.max_seq_length,
                real_shape: args.real_shape,
            },
        ),
    };
    written.with_context(|| format!("cannot write a model into {}", args.out.display()))?;
    println!(
        "random {} {} ({} dimensions, {} layers) written to {}",
        args.family,
        args.task,
        args.hidden,
        args.layers,
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
