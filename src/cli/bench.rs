//! `ragline bench`: embedding throughput on this host; with `--write URI`, how fast an index
//! takes embedded chunks.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use ragline::document::Document;
use ragline::embed::EmbeddingModel;
use ragline::stages::chunk::{
    ChunkConfig, ChunkStage, DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_TOKENS,
};
use ragline::stages::extract::Extract;
use ragline::stages::Stage;
use rayon::prelude::*;
use serde::Serialize;

use ragline::jobs::bench::WriteBenchReport;

use super::model_args::{load_first, ModelArgs};

/// The page benchmarked when no --corpus is given (react.dev, CC BY 4.0).
const SAMPLE: &str = include_str!("../../tests/fixtures/react/useEffect.md");

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,

    /// A folder of .md/.html/.txt documents to chunk and embed [default: a built-in page].
    #[arg(long)]
    corpus: Option<PathBuf>,

    /// Chunks to embed [default: 2,000 on the CPU, 50,000 on a GPU].
    #[arg(long)]
    chunks: Option<usize>,

    /// Chunk size to aim for, in model tokens.
    #[arg(long, default_value_t = DEFAULT_CHUNK_TOKENS)]
    chunk_tokens: usize,

    /// Print the result as JSON.
    #[arg(long)]
    json: bool,

    /// Measure writing to this index instead of embedding: synthetic chunks of 90 words with
    /// unit vectors (no model), through --writers connections in indexer-sized batches. The
    /// index must be new or hold synthetic vectors of --dim dimensions.
    #[arg(long, value_name = "URI")]
    write: Option<String>,

    /// With --write: the vectors' dimension.
    #[arg(long, default_value_t = 384)]
    dim: usize,

    /// With --write: concurrent writers (the ingest's --indexers).
    #[arg(long, default_value_t = 2)]
    writers: usize,

    /// With --write: items per bulk write (the ingest's --batch-size). [default: 1024]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    batch_size: Option<u64>,

    /// With --write: afterwards, time this many vector and keyword searches (10 results
    /// each) and report p50/p99.
    #[arg(long, default_value_t = 0)]
    queries: usize,

    /// With --write: vary the rows (a second run with another seed rewrites every row).
    #[arg(long, default_value_t = 1)]
    seed: u64,

    /// With --write: draw each vector as a real one of this float32 .npy file (rows of --dim
    /// values, e.g. a corpus's MiniLM vectors) plus Gaussian noise, re-normalised; queries are
    /// drawn from held-out rows (every tenth). Without it: uniform random unit vectors.
    #[arg(long, value_name = "VECTORS.npy")]
    like: Option<PathBuf>,

    /// With --like: the noise, relative to a unit vector's spread per dimension.
    #[arg(long, default_value_t = 0.5)]
    noise: f32,

    /// With --write to sqlite://: the ANN to keep (auto, hnsw, none; see `ingest --ann`).
    /// With --queries, recall@10 against the exact scan is measured too.
    #[arg(long, value_name = "auto|hnsw|none")]
    ann: Option<ragline::indexers::ann::AnnMode>,

    /// With --queries: search only among the chunks this filter lets through (`search
    /// --where`; synthetic documents are `doc0`, `doc1`..., 10 chunks each, so
    /// `source=doc*00` lets 1% through). Repeatable, ANDed.
    #[arg(long = "where", value_name = "FILTER")]
    filters: Vec<String>,

    /// With --write to sqlite://: what the ANN stores (f16, int8, binary).
    #[arg(long, value_name = "f16|int8|binary")]
    ann_dtype: Option<ragline::indexers::ann::AnnDtype>,

    /// With --write to sqlite://: the recall@10 the ANN's ef is measured to reach.
    #[arg(long, value_name = "R", value_parser = ragline::indexers::ann::parse_recall)]
    ann_recall: Option<f64>,

    /// With --queries: time the vector queries again at each of these HNSW ef values
    /// (comma-separated, 16 to 4096), with recall@10 for each against the same exact answers:
    /// the index's recall/latency curve.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', value_parser = clap::value_parser!(u16).range(16..=4096))]
    ef: Vec<u16>,
}

#[derive(Serialize)]
struct Report {
    model: String,
    device: String,
    dtype: String,
    /// Which encoder and kernels ran ("fused CPU encoder, f32 on the avx512 kernels").
    encoder: String,
    /// The CPU kernel path (avx512, avx2, portable), when the fused CPU encoder ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_kernels: Option<String>,
    /// The CPU's model name, as the OS reports it.
    cpu: String,
    threads: usize,
    batch_tokens: usize,
    corpus_bytes: usize,
    chunker_mb_per_s: f64,
    chunker_mb_per_s_per_core: f64,
    chunks: usize,
    tokens: usize,
    padded_tokens: usize,
    padding_ratio: f64,
    batches: usize,
    mean_batch_size: f64,
    seconds: f64,
    tokens_per_s: f64,
    chunks_per_s: f64,
    peak_rss_mb: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_memory_used_mb: Option<f64>,
    /// The encoder's achieved GFLOP/s (fused CPU encoder only).
    #[serde(skip_serializing_if = "Option::is_none")]
    gflops: Option<f64>,
    /// This machine's f32 FMA peak on the kernel path's vector width, measured by a probe
    /// on every thread (the roofline's roof).
    #[serde(skip_serializing_if = "Option::is_none")]
    peak_gflops: Option<f64>,
}

pub fn run(args: BenchArgs, config_file: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    if let Some(uri) = &args.write {
        return bench_write(&args, uri);
    }
    let model_config = args.model.resolve(&super::load_config(config_file)?);
    let (files, devices, model) = load_first(&model_config)?;
    let device = &devices[0];
    let batch_tokens = ragline::jobs::batch_tokens(&model_config, device);
    let target = args.chunks.unwrap_or(if device.device.is_cpu() {
        2_000
    } else {
        50_000
    });
    if !args.json {
        eprintln!("embedding on {} ({})", device.label, device.reason);
    }

    let (chunked, bytes, chunk_secs) = timed_chunks(&args, &model)?;
    if chunked.is_empty() {
        bail!("the corpus yielded no chunks");
    }
    let threads = rayon::current_num_threads();
    // Repeat the corpus's chunks until there are enough.
    let seqs: Vec<&[u32]> = chunked
        .iter()
        .cycle()
        .take(target)
        .map(Vec::as_slice)
        .collect();
    let prompt = model.tokenizer.passage_prompt_ids().to_vec();
    let specials = {
        let (a, b) = model.tokenizer.specials();
        a.len() + b.len() + prompt.len()
    };
    let lengths: Vec<usize> = seqs.iter().map(|s| s.len() + specials).collect();
    let plan = model.plan_batches(&lengths, batch_tokens);

    let (secs, padded) = time_embedding(&model, &seqs, &lengths, &plan, &prompt)?;
    let tokens: usize = lengths.iter().sum();
    let gflops = model.cpu_flops(&lengths).map(|f| f / secs / 1e9);
    let peak_gflops = model
        .cpu_kernels()
        .and_then(|(path, _)| ragline::embed::cpu::kernels::peak_flops(path, 1.0))
        .map(|f| f / 1e9);
    let report = Report {
        model: files.name.clone(),
        device: device.label.clone(),
        dtype: model.precision_name(),
        encoder: model.encoder_kind(),
        cpu_kernels: model.cpu_kernels().map(|(path, _)| path.name().to_string()),
        cpu: cpu_model(),
        threads,
        batch_tokens,
        corpus_bytes: bytes,
        chunker_mb_per_s: bytes as f64 / 1e6 / chunk_secs,
        chunker_mb_per_s_per_core: bytes as f64 / 1e6 / chunk_secs / threads as f64,
        chunks: seqs.len(),
        tokens,
        padded_tokens: padded,
        padding_ratio: 1.0 - tokens as f64 / padded as f64,
        batches: plan.len(),
        mean_batch_size: seqs.len() as f64 / plan.len() as f64,
        seconds: secs,
        tokens_per_s: tokens as f64 / secs,
        chunks_per_s: seqs.len() as f64 / secs,
        peak_rss_mb: ragline::jobs::bench::peak_rss_mb(),
        device_memory_used_mb: device_memory_mb(&device.device),
        gflops,
        peak_gflops,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(ExitCode::SUCCESS)
}

/// Chunk the corpus on every core, timed: the chunks' token ids, the corpus's bytes and the
/// seconds it took.
fn timed_chunks(
    args: &BenchArgs,
    model: &EmbeddingModel,
) -> anyhow::Result<(Vec<Vec<u32>>, usize, f64)> {
    let docs = read_corpus(args.corpus.as_deref())?;
    let bytes: usize = docs.iter().map(|d| d.fields.text.len()).sum();
    let started = Instant::now();
    let chunked = chunk_corpus(docs, model, args.chunk_tokens)?;
    Ok((chunked, bytes, started.elapsed().as_secs_f64()))
}

/// Embed every batch of `plan` after a warm-up batch: the seconds the batches took and the
/// tokens the model computed (padding included).
fn time_embedding(
    model: &EmbeddingModel,
    seqs: &[&[u32]],
    lengths: &[usize],
    plan: &[Vec<usize>],
    prompt: &[u32],
) -> anyhow::Result<(f64, usize)> {
    // Warm up (a GPU compiles its kernels on first use), then time.
    let warm: Vec<&[u32]> = plan[0].iter().map(|&i| seqs[i]).collect();
    model.embed_ids(&warm, prompt)?;
    let started = Instant::now();
    let mut padded = 0;
    for b in plan {
        let batch: Vec<&[u32]> = b.iter().map(|&i| seqs[i]).collect();
        // embed_ids returns host vectors, so the device is synchronised per batch.
        model.embed_ids(&batch, prompt)?;
        padded += model.computed_tokens(lengths, b);
    }
    Ok((started.elapsed().as_secs_f64(), padded))
}

/// The corpus cut into chunks on every core: each chunk's token ids.
fn chunk_corpus(
    docs: Vec<Document>,
    model: &EmbeddingModel,
    chunk_tokens: usize,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let limit = model.tokenizer.max_content_len() - model.tokenizer.passage_prompt_ids().len();
    let sizes = ChunkConfig {
        target: chunk_tokens,
        overlap: DEFAULT_CHUNK_OVERLAP,
    }
    .validate(limit, chunk_tokens != DEFAULT_CHUNK_TOKENS)?;
    let tokenizer = &model.tokenizer;
    Ok(docs
        .into_par_iter()
        .map_init(
            || {
                (
                    Extract::default(),
                    ChunkStage::new(tokenizer.clone(), sizes),
                )
            },
            |(extract, chunk), mut doc| {
                extract.process(&mut doc).ok();
                chunk
                    .process(&mut doc)
                    .map(|children| {
                        children
                            .into_iter()
                            .filter_map(|c| c.chunk.map(|c| c.token_ids))
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default()
            },
        )
        .flatten()
        .collect())
}

/// The report as text.
fn print_report(report: &Report) {
    println!(
        "model {} on {} ({}; {}), {} threads, batches of <= {} tokens\n\
         chunker: {:.1} MB/s ({:.1} MB/s per core) over {:.1} MB\n\
         embedder: {} chunks, {} tokens in {:.2}s: {:.0} tokens/s, {:.1} chunks/s\n\
         padding {:.1}%, {} batches of {:.1} chunks on average\n\
         peak RSS {:.0} MB{}{}",
        report.model,
        report.device,
        report.encoder,
        report.cpu,
        report.threads,
        report.batch_tokens,
        report.chunker_mb_per_s,
        report.chunker_mb_per_s_per_core,
        report.corpus_bytes as f64 / 1e6,
        report.chunks,
        report.tokens,
        report.seconds,
        report.tokens_per_s,
        report.chunks_per_s,
        report.padding_ratio * 100.0,
        report.batches,
        report.mean_batch_size,
        report.peak_rss_mb,
        report
            .device_memory_used_mb
            .map(|m| format!(", device memory in use {m:.0} MB"))
            .unwrap_or_default(),
        match (report.gflops, report.peak_gflops) {
            (Some(g), Some(p)) => format!(
                "\nroofline: encoder {g:.0} GFLOP/s of a {p:.0} GFLOP/s FMA peak ({:.0}%)",
                100.0 * g / p
            ),
            (Some(g), None) => format!("\nencoder {g:.0} GFLOP/s"),
            _ => String::new(),
        }
    );
}

/// `--write URI`: chunks/s into an index.
fn bench_write(args: &BenchArgs, uri: &str) -> anyhow::Result<ExitCode> {
    let report = ragline::jobs::bench::write(&ragline::jobs::bench::WriteBench {
        uri,
        chunks: args.chunks.unwrap_or(100_000),
        dim: args.dim,
        writers: args.writers,
        batch_size: args.batch_size.map(|n| n as usize),
        seed: args.seed,
        like: args.like.as_deref(),
        noise: args.noise,
        queries: args.queries,
        filters: &args.filters,
        ann: ragline::indexers::ann::AnnChoice {
            mode: args.ann,
            dtype: args.ann_dtype,
            recall: args.ann_recall,
        },
        efs: &args.ef.iter().map(|&e| usize::from(e)).collect::<Vec<_>>(),
    })?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&write_json(args, &report)?)?
        );
    } else {
        print_write(&report);
    }
    Ok(ExitCode::SUCCESS)
}

/// `bench --write --json`: the write report's fields, the search's beside them.
fn write_json(args: &BenchArgs, r: &WriteBenchReport) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(&r.write)?;
    if let Some(l) = &r.search {
        v["search"] = serde_json::to_value(l)?;
        v["recall_at_10"] = serde_json::to_value(l.recall_at_10)?;
        v["search_p50_ms"] = serde_json::to_value(l.vector_p50_ms)?;
        v["search_p99_ms"] = serde_json::to_value(l.vector_p99_ms)?;
        if !args.filters.is_empty() {
            v["where"] = serde_json::to_value(&args.filters)?;
        }
    }
    v["peak_rss_mb"] = serde_json::to_value(r.peak_rss_mb)?;
    v["files_mb"] = serde_json::to_value(r.files_mb)?;
    Ok(v)
}

fn print_write(r: &WriteBenchReport) {
    if let Some(l) = &r.search {
        println!(
            "search over {} queries: vector p50 {:.2} ms, p99 {:.2} ms; keyword p50 {:.2} ms, p99 {:.2} ms",
            l.queries, l.vector_p50_ms, l.vector_p99_ms, l.keyword_p50_ms, l.keyword_p99_ms
        );
        if let (Some(p50), Some(p99)) = (l.hybrid_p50_ms, l.hybrid_p99_ms) {
            println!("hybrid (dense + keyword, fused) p50 {p50:.2} ms, p99 {p99:.2} ms");
        }
        if let (Some(recall), Some(e)) = (l.recall_at_10, l.exact_p50_ms) {
            println!("recall@10 against the exact scan {recall:.4} (exact scan p50 {e:.2} ms)");
        }
        for p in &l.ef_sweep {
            println!(
                "  ef {:>4}: vector p50 {:.3} ms, p99 {:.3} ms{}",
                p.ef,
                p.p50_ms,
                p.p99_ms,
                p.recall_at_10
                    .map(|r| format!(", recall@10 {r:.4}"))
                    .unwrap_or_default()
            );
        }
    }
    if let Some(mb) = r.files_mb {
        println!("index files {mb:.1} MB");
    }
    println!("peak RSS {:.0} MB", r.peak_rss_mb);
    let w = &r.write;
    println!(
        "{}: {} chunks ({} dimensions) in {:.2}s: {:.0} chunks/s with {} writers; \
         finishing {:.1}s",
        w.index, w.chunks, w.dimension, w.seconds, w.chunks_per_s, w.writers, w.finish_seconds
    );
    for n in &w.notes {
        println!("  {n}");
    }
}

fn read_corpus(dir: Option<&std::path::Path>) -> anyhow::Result<Vec<Document>> {
    let Some(dir) = dir else {
        let mut d = Document::new("useEffect.md", SAMPLE);
        d.fields.metadata.insert("format".into(), "markdown".into());
        return Ok(vec![d]);
    };
    let mut docs = Vec::new();
    for e in walkdir::WalkDir::new(dir).sort_by_file_name() {
        let e = e.with_context(|| format!("reading --corpus {}", dir.display()))?;
        let format = ragline::connectors::filesystem::format_of(e.path());
        let ext_ok = e
            .path()
            .extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| ["md", "markdown", "mdx", "html", "htm", "txt", "rst"].contains(&x));
        if !e.file_type().is_file() || !ext_ok {
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(e.path()) {
            let mut d = Document::new(e.path().display().to_string(), text);
            d.fields.metadata.insert("format".into(), format.into());
            docs.push(d);
        }
    }
    if docs.is_empty() {
        bail!(
            "--corpus {} holds no .md, .html, .txt or .rst files",
            dir.display()
        );
    }
    Ok(docs)
}

/// Peak resident memory of this process, from /proc (0 where there is none).
#[cfg(feature = "cuda")]
fn device_memory_mb(device: &candle_core::Device) -> Option<f64> {
    if !device.is_cuda() {
        return None;
    }
    let (free, total) = candle_core::cuda::cudarc::driver::result::mem_get_info().ok()?;
    Some((total - free) as f64 / 1e6)
}

#[cfg(not(feature = "cuda"))]
fn device_memory_mb(_device: &candle_core::Device) -> Option<f64> {
    None
}

/// The CPU's model name ("Intel(R) Xeon(R) Processor"), from /proc/cpuinfo where there is one.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}
