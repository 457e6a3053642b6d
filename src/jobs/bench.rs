//! What `ragline bench --write` runs: synthetic chunks written into an index at full speed,
//! then (when asked) query latency and recall against the exact scan. The CLI prints the
//! report.

use std::path::Path;

use super::config::ConfigError;
use super::JobError;
use crate::indexers::ann::AnnChoice;
use crate::indexers::synthetic::{self, SearchLatency, WriteReport, CHUNKS_PER_DOCUMENT};
use crate::indexers::{self, IndexUri};
use crate::search::Where;

/// A write benchmark.
#[derive(Clone, Debug)]
pub struct WriteBench<'a> {
    /// The index to write (new, or holding synthetic vectors of `dim` dimensions).
    pub uri: &'a str,
    pub chunks: usize,
    pub dim: usize,
    /// Concurrent writers (the ingest's --indexers).
    pub writers: usize,
    /// Items per bulk write [default: the indexers' batch].
    pub batch_size: Option<usize>,
    pub seed: u64,
    /// Draw the vectors like the rows of this float32 .npy file, plus `noise`.
    pub like: Option<&'a Path>,
    pub noise: f32,
    /// Vector and keyword queries timed after the write (0: none).
    pub queries: usize,
    /// `--where` clauses the queries search under.
    pub filters: &'a [String],
    pub ann: AnnChoice,
    /// Time the vector queries again at each of these HNSW ef values (recall for each).
    pub efs: &'a [usize],
}

/// What a write benchmark measured.
#[derive(Clone, Debug)]
pub struct WriteBenchReport {
    pub write: WriteReport,
    pub search: Option<SearchLatency>,
    /// The process's peak resident memory, in MB.
    pub peak_rss_mb: f64,
    /// The index's files on disk, in MB, for an index that is files.
    pub files_mb: Option<f64>,
}

/// Run `bench`: write, then time the queries.
pub fn write(bench: &WriteBench<'_>) -> Result<WriteBenchReport, JobError> {
    let uri: IndexUri = bench.uri.parse()?;
    let filter =
        Where::parse(bench.filters).map_err(|e| ConfigError::Value(format!("bad --where: {e}")))?;
    let like = match bench.like {
        Some(path) => Some(like_of(path, bench.noise, bench.dim)?),
        None => None,
    };
    let mut identity = synthetic::identity(bench.dim);
    identity.ann = bench.ann;
    let factory = indexers::open(&uri, identity)?;
    let write = synthetic::write_throughput(
        factory.as_ref(),
        bench.chunks.div_ceil(CHUNKS_PER_DOCUMENT),
        bench.dim,
        bench.writers,
        bench.batch_size.unwrap_or(synthetic::BATCH),
        bench.seed,
        like.as_ref(),
    )?;
    let search = if bench.queries > 0 {
        let mut reader = indexers::open_reader(&uri, false)?;
        // Recall needs the exact answers beside the approximate ones.
        let exact = if uri.is_store() {
            Some(indexers::open_reader(&uri, true)?)
        } else {
            None
        };
        let mut latency = synthetic::search_latency(
            reader.as_mut(),
            exact.as_deref(),
            bench.queries,
            10,
            bench.dim,
            like.as_ref(),
            &filter,
            bench.efs,
        )?;
        let (p50, p99) = hybrid_latency(reader, bench, like.as_ref(), &filter)?;
        latency.hybrid_p50_ms = Some(p50);
        latency.hybrid_p99_ms = Some(p99);
        Some(latency)
    } else {
        None
    };
    Ok(WriteBenchReport {
        write,
        search,
        peak_rss_mb: peak_rss_mb(),
        files_mb: indexers::files_bytes(&uri).map(|b| b as f64 / 1e6),
    })
}

/// The bench's vector and keyword queries as hybrid searches through the searcher (the
/// vector given, as a server that embedded it would): p50 and p99 in milliseconds.
fn hybrid_latency(
    reader: Box<dyn indexers::IndexReader>,
    bench: &WriteBench<'_>,
    like: Option<&synthetic::Like>,
    filter: &indexers::filter::Where,
) -> Result<(f64, f64), JobError> {
    use crate::search::{Fuse, Mode, QueryVectors, Searcher};
    let searcher = Searcher::new(reader, None);
    let mut ms = Vec::with_capacity(bench.queries);
    for (i, q) in synthetic::bench_queries(bench.queries, bench.dim, like)
        .into_iter()
        .enumerate()
    {
        let given = QueryVectors {
            dense: Some(q),
            sparse: None,
        };
        let t = std::time::Instant::now();
        searcher
            .ranked_with(
                &synthetic::bench_words(i),
                given,
                Mode::Hybrid(Fuse::DEFAULT),
                10,
                filter,
            )
            .map_err(|e| crate::indexers::BackendError::Io(e.to_string()))?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(synthetic::p50_p99(&mut ms))
}

/// The `--like` vectors, of the benchmark's dimension.
fn like_of(path: &Path, noise: f32, dim: usize) -> Result<synthetic::Like, JobError> {
    let like = synthetic::Like::from_npy(path, noise)?;
    if like.dim() != dim {
        return Err(ConfigError::Value(format!(
            "--like {} holds vectors of {} dimensions; give --dim {}",
            path.display(),
            like.dim(),
            like.dim()
        ))
        .into());
    }
    Ok(like)
}

/// The process's peak resident memory (VmHWM), in MB; 0 where /proc does not tell.
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
