//! Synthetic embedded documents, and the write benchmark over any backend
//! (`ragline bench --write URI`, `benches/index.rs`): how fast an index takes chunks with
//! their vectors, apart from the model.
//!
//! A document is a parent and [`CHUNKS_PER_DOCUMENT`] chunks of 90 words (about 600 bytes)
//! with unit vectors, all derived from the document's number, so any thread can make any
//! range and every run writes the same rows (scripts/bench-postgres.py makes rows of the
//! same shape for the psycopg reference).

use std::collections::HashSet;
use std::time::Instant;

use serde::Serialize;

use super::{BackendError, BackendFactory};
use super::{IndexIdentity, ModelIdentity};
use crate::document::{Chunk, Document};

pub const CHUNKS_PER_DOCUMENT: usize = 10;
/// Items per bulk write (the indexer's default batch).
pub const BATCH: usize = super::batch::DEFAULT_MAX_ITEMS;

pub const WORDS: &[&str] = &[
    "render",
    "effect",
    "state",
    "component",
    "server",
    "cache",
    "memo",
    "ref",
    "context",
    "reducer",
    "transition",
    "suspense",
    "hydrate",
    "portal",
    "event",
    "handler",
    "layout",
    "stream",
    "action",
    "form",
    "input",
    "value",
    "props",
    "children",
    "key",
    "list",
    "index",
];

/// Deterministic pseudo-random numbers (xorshift64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A standard normal number (Box-Muller).
    pub fn gaussian(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }

    /// A unit vector of `dim` dimensions.
    pub fn unit(&mut self, dim: usize) -> Vec<f32> {
        let v: Vec<f32> = (0..dim)
            .map(|_| (self.next_u64() % 2000) as f32 / 1000.0 - 1.0)
            .collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect()
    }
}

/// Document `d`: its parent first, then its chunks. `seed` varies the text and vectors.
pub fn document(d: usize, dim: usize, seed: u64) -> Vec<Document> {
    document_like(d, dim, seed, None)
}

/// Vectors drawn like real ones (`bench --write --like VECTORS.npy`): each a real vector of
/// the file plus Gaussian noise, re-normalised. Uniformly random vectors have none of a
/// corpus's structure (every ANN is at its worst on them); these keep its clusters.
pub struct Like {
    /// Row-major, `dim` per row: the rows documents draw from.
    corpus: Vec<f32>,
    /// Rows held out for queries (none of the documents' vectors is drawn from them).
    queries: Vec<f32>,
    dim: usize,
    /// Standard deviation of the noise per dimension, relative to a unit vector's spread
    /// (1/sqrt(dim)): 0.5 puts a drawn vector at cosine ~0.9 to its real one.
    noise: f32,
}

impl Like {
    /// From a .npy file of float32 rows (`numpy.save(path, vectors.astype("float32"))`).
    /// Every tenth row is held out for queries.
    pub fn from_npy(path: &std::path::Path, noise: f32) -> Result<Like, BackendError> {
        let bytes = std::fs::read(path)
            .map_err(|e| BackendError::Invalid(format!("--like `{}`: {e}", path.display())))?;
        let (rows, dim, data) = npy_f32(&bytes).map_err(|why| {
            BackendError::Invalid(format!(
                "--like `{}`: {why}; give a 2-D float32 .npy file (numpy.save)",
                path.display()
            ))
        })?;
        if rows < 20 {
            return Err(BackendError::Invalid(format!(
                "--like `{}` holds {rows} vectors; give at least 20",
                path.display()
            )));
        }
        let mut corpus = Vec::with_capacity(data.len());
        let mut queries = Vec::with_capacity(data.len() / 10 + dim);
        for (i, row) in data.chunks_exact(dim).enumerate() {
            if i % 10 == 9 {
                queries.extend_from_slice(row);
            } else {
                corpus.extend_from_slice(row);
            }
        }
        Ok(Like {
            corpus,
            queries,
            dim,
            noise,
        })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    fn draw_from(&self, rows: &[f32], rng: &mut Rng) -> Vec<f32> {
        let n = rows.len() / self.dim;
        let i = (rng.next_u64() % n as u64) as usize;
        let sigma = self.noise / (self.dim as f32).sqrt();
        let base = &rows[i * self.dim..(i + 1) * self.dim];
        let bn = base.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        let v: Vec<f32> = base
            .iter()
            .map(|x| x / bn + sigma * rng.gaussian())
            .collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        v.into_iter().map(|x| x / n).collect()
    }

    /// A document chunk's vector.
    pub fn draw(&self, rng: &mut Rng) -> Vec<f32> {
        self.draw_from(&self.corpus, rng)
    }

    /// A query vector, from the held-out rows.
    pub fn query(&self, rng: &mut Rng) -> Vec<f32> {
        self.draw_from(&self.queries, rng)
    }
}

/// Why bytes are not a 2-D float32 .npy file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct NpyError(String);

/// A 2-D little-endian float32 .npy file: (rows, columns, values). Bounded by the file: the
/// header is at most 64 KiB and the shape must match the bytes that follow it.
fn npy_f32(b: &[u8]) -> Result<(usize, usize, Vec<f32>), NpyError> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err(NpyError("not a .npy file".into()));
    }
    let (header_len, start) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        v => return Err(NpyError(format!(".npy version {v} is not supported"))),
    };
    if header_len > 65536 || start + header_len > b.len() {
        return Err(NpyError("its header is cut short".into()));
    }
    let header = std::str::from_utf8(&b[start..start + header_len])
        .map_err(|_| NpyError("its header is not text".into()))?;
    if !header.contains("'descr': '<f4'") {
        return Err(NpyError(
            "its values are not little-endian float32 ('<f4')".into(),
        ));
    }
    if header.contains("'fortran_order': True") {
        return Err(NpyError("it is in Fortran order".into()));
    }
    let shape = header
        .split("'shape':")
        .nth(1)
        .and_then(|s| s.split('(').nth(1))
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| NpyError("its header has no shape".into()))?;
    let dims: Vec<usize> = shape
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| NpyError(format!("bad shape `{shape}`")))
        })
        .collect::<Result<_, _>>()?;
    let [rows, cols] = dims[..] else {
        return Err(NpyError(format!("its shape ({shape}) is not 2-D")));
    };
    let body = &b[start + header_len..];
    let want = rows
        .checked_mul(cols)
        .and_then(|n| n.checked_mul(4))
        .ok_or_else(|| NpyError("its shape overflows".into()))?;
    if cols == 0 || body.len() != want {
        return Err(NpyError(format!(
            "its shape ({rows}, {cols}) needs {want} bytes of values, it has {}",
            body.len()
        )));
    }
    let values = body
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((rows, cols, values))
}

/// Document `d` with vectors drawn [`Like`] real ones (uniform unit vectors without).
pub fn document_like(d: usize, dim: usize, seed: u64, like: Option<&Like>) -> Vec<Document> {
    let mut rng = Rng((d as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed | 1);
    let mut parent = Document::new(format!("doc{d}"), "");
    parent.content_hash = Some(format!("h{d}-{seed}"));
    parent.children = CHUNKS_PER_DOCUMENT as u32;
    let mut out = Vec::with_capacity(CHUNKS_PER_DOCUMENT + 1);
    out.push(parent.clone());
    for i in 0..CHUNKS_PER_DOCUMENT {
        let text: Vec<&str> = (0..90)
            .map(|_| WORDS[(rng.next_u64() % WORDS.len() as u64) as usize])
            .collect();
        let mut c = parent.child(format!("doc{d}#{i}"), text.join(" "));
        c.content_hash = parent.content_hash.clone();
        c.chunk = Some(Box::new(Chunk {
            ordinal: i as u32,
            heading_path: vec!["Guide".into(), format!("Section {i}")],
            start: 0,
            end: 600,
            token_count: 120,
            pages: None,
            token_ids: Vec::new(),
            input_key: Some(Chunk::input_key_of(&[d as u32, i as u32, seed as u32])),
            vector: Some(match like {
                Some(like) => like.draw(&mut rng),
                None => rng.unit(dim),
            }),
        }));
        out.push(c);
    }
    out
}

/// About `chunks` chunks with their parents.
pub fn documents(chunks: usize, dim: usize, seed: u64) -> Vec<Document> {
    (0..chunks.div_ceil(CHUNKS_PER_DOCUMENT))
        .flat_map(|d| document(d, dim, seed))
        .collect()
}

/// The identity of a run writing synthetic vectors of `dim` dimensions.
pub fn identity(dim: usize) -> IndexIdentity {
    IndexIdentity {
        model: Some(ModelIdentity {
            name: format!("synthetic-{dim}"),
            dir: "/nonexistent".into(),
            fingerprint: format!("synthetic-{dim}"),
            dimension: dim,
            tokenizer: Some("synthetic".into()),
        }),
        pipeline_fingerprint: "synthetic".into(),
        defer_embed: false,
        priority: crate::lifecycle::Priority::Fresh,
        ann: Default::default(),
    }
}

/// What a write benchmark measured.
#[derive(Clone, Debug, Serialize)]
pub struct WriteReport {
    pub index: String,
    pub documents: usize,
    pub chunks: usize,
    pub dimension: usize,
    pub writers: usize,
    pub batch: usize,
    /// Writing every row (committed), index building at the end excluded.
    pub seconds: f64,
    pub chunks_per_s: f64,
    /// The backend's end-of-run work (Postgres: building the HNSW index).
    pub finish_seconds: f64,
    pub notes: Vec<String>,
}

/// Write `documents` synthetic documents (10 chunks each) through `writers` connections of
/// `factory` in batches of `batch` items, then finish; every item must be accepted.
pub fn write_throughput(
    factory: &dyn BackendFactory,
    documents: usize,
    dim: usize,
    writers: usize,
    batch: usize,
    seed: u64,
    like: Option<&Like>,
) -> Result<WriteReport, BackendError> {
    let writers = writers.max(1);
    let backends = (0..writers)
        .map(|_| factory.connect())
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    std::thread::scope(|s| -> Result<(), BackendError> {
        let handles: Vec<_> = backends
            .into_iter()
            .enumerate()
            .map(|(w, mut backend)| {
                let range = (documents * w / writers)..(documents * (w + 1) / writers);
                s.spawn(move || -> Result<(), BackendError> {
                    // Made as they go (memory stays one batch at any size): a few percent of
                    // the time, against the psycopg reference's rows made beforehand.
                    let mut pending: Vec<Document> = Vec::with_capacity(batch + 16);
                    for d in range {
                        pending.extend(document_like(d, dim, seed, like));
                        if pending.len() >= batch {
                            write(backend.as_mut(), &pending)?;
                            pending.clear();
                        }
                    }
                    write(backend.as_mut(), &pending)?;
                    backend.flush()
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a writer thread panicked; this is a bug")?;
        }
        Ok(())
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let finishing = Instant::now();
    let notes = factory.finish()?;
    let chunks = documents * CHUNKS_PER_DOCUMENT;
    Ok(WriteReport {
        index: factory.describe(),
        documents,
        chunks,
        dimension: dim,
        writers,
        batch,
        seconds,
        chunks_per_s: chunks as f64 / seconds.max(1e-9),
        finish_seconds: finishing.elapsed().as_secs_f64(),
        notes,
    })
}

/// Query latency percentiles, in milliseconds.
#[derive(Clone, Debug, Serialize)]
pub struct SearchLatency {
    pub queries: usize,
    pub k: usize,
    /// Vector queries answered with fewer than k chunks (a filter matching fewer than k).
    pub short_answers: usize,
    /// The share of the exact scan's top k that the search returned (measured when asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recall_at_10: Option<f64>,
    /// The exact scan's median latency, beside it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exact_p50_ms: Option<f64>,
    pub vector_p50_ms: f64,
    pub vector_p99_ms: f64,
    pub keyword_p50_ms: f64,
    pub keyword_p99_ms: f64,
    /// The same vector and keyword queries as one hybrid search (dense and keyword ranked to
    /// the hybrid depth and fused), measured by the caller through the searcher.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hybrid_p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hybrid_p99_ms: Option<f64>,
    /// The same vector queries again at each ef asked for (`bench --ef`), against the same
    /// exact answers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ef_sweep: Vec<EfPoint>,
}

/// Vector search at one ef.
#[derive(Clone, Debug, Serialize)]
pub struct EfPoint {
    pub ef: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recall_at_10: Option<f64>,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Run `queries` vector queries (random, or drawn [`Like`] the documents' vectors) and as
/// many two-word keyword queries against an index of synthetic rows, `k` results each, among
/// the chunks `filter` lets through; every query must find something. With `exact`, the
/// recall@k of `reader`'s answers against its exact scan (under the same filter).
#[allow(clippy::too_many_arguments)]
pub fn search_latency(
    reader: &mut dyn super::IndexReader,
    exact: Option<&dyn super::IndexReader>,
    queries: usize,
    k: usize,
    dim: usize,
    like: Option<&Like>,
    filter: &super::filter::Where,
    efs: &[usize],
) -> Result<SearchLatency, BackendError> {
    let qs = bench_queries(queries, dim, like);
    // Each kind of query in its own loop, as a service answering a stream of them would run
    // (and as the peers' scripts time theirs): the exact scan between two ANN queries would
    // leave the graph out of every cache.
    let mut vector = Vec::with_capacity(queries);
    let mut answers = Vec::with_capacity(queries);
    let mut short = 0;
    for (i, q) in qs.iter().enumerate() {
        let t = Instant::now();
        let answer = reader.nearest_where(q, k, filter)?;
        vector.push(t.elapsed().as_secs_f64() * 1e3);
        short += (answer.len() < k) as usize;
        if answer.is_empty() {
            return Err(nothing_found(i, reader));
        }
        answers.push(answer);
    }
    let mut keyword = keyword_latency(reader, queries, k, filter)?;
    let mut exact_ms = Vec::new();
    let mut truths = Vec::new();
    if let Some(exact) = exact {
        for q in &qs {
            let t = Instant::now();
            let truth = exact.nearest_where(q, k, filter)?;
            exact_ms.push(t.elapsed().as_secs_f64() * 1e3);
            truths.push(truth.iter().map(|t| t.0).collect::<HashSet<i64>>());
        }
    }
    let recall = |answers: &[Vec<(i64, f64)>]| recall_against(answers, &truths);
    let mut ef_sweep = Vec::with_capacity(efs.len());
    for &ef in efs {
        reader.set_ef(Some(ef));
        let mut ms = Vec::with_capacity(queries);
        let mut found = Vec::with_capacity(queries);
        for q in &qs {
            let t = Instant::now();
            found.push(reader.nearest_where(q, k, filter)?);
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        ef_sweep.push(EfPoint {
            ef,
            recall_at_10: recall(&found),
            p50_ms: percentile(&mut ms, 0.5),
            p99_ms: percentile(&mut ms, 0.99),
        });
    }
    reader.set_ef(None);
    let exact_p50_ms = (!exact_ms.is_empty()).then(|| percentile(&mut exact_ms, 0.5));
    Ok(SearchLatency {
        queries,
        k,
        short_answers: short,
        recall_at_10: recall(&answers),
        exact_p50_ms,
        vector_p50_ms: percentile(&mut vector, 0.5),
        vector_p99_ms: percentile(&mut vector, 0.99),
        keyword_p50_ms: percentile(&mut keyword, 0.5),
        keyword_p99_ms: percentile(&mut keyword, 0.99),
        hybrid_p50_ms: None,
        hybrid_p99_ms: None,
        ef_sweep,
    })
}

/// The bench's vector queries: drawn [`Like`] real ones, or uniform unit vectors.
pub fn bench_queries(queries: usize, dim: usize, like: Option<&Like>) -> Vec<Vec<f32>> {
    let mut rng = Rng(99);
    (0..queries)
        .map(|_| match like {
            Some(like) => like.query(&mut rng),
            None => rng.unit(dim),
        })
        .collect()
}

/// The bench's `i`th keyword query: two words of [`WORDS`].
pub fn bench_words(i: usize) -> String {
    format!(
        "{} {}",
        WORDS[i % WORDS.len()],
        WORDS[(i * 7 + 3) % WORDS.len()]
    )
}

/// Milliseconds at the 50th and 99th percentiles of `v` (sorted in place; not empty).
pub fn p50_p99(v: &mut [f64]) -> (f64, f64) {
    (percentile(v, 0.5), percentile(v, 0.99))
}

/// `queries` two-word keyword queries, each timed in milliseconds; each must find something.
fn keyword_latency(
    reader: &dyn super::IndexReader,
    queries: usize,
    k: usize,
    filter: &super::filter::Where,
) -> Result<Vec<f64>, BackendError> {
    let mut keyword = Vec::with_capacity(queries);
    for i in 0..queries {
        let words = bench_words(i);
        let t = Instant::now();
        let found_words = reader.keyword_where(&words, k, filter)?.len();
        keyword.push(t.elapsed().as_secs_f64() * 1e3);
        if found_words == 0 {
            return Err(nothing_found(i, reader));
        }
    }
    Ok(keyword)
}

/// The share of `truths` (one set per query) that `answers` found; `None` without truths.
fn recall_against(answers: &[Vec<(i64, f64)>], truths: &[HashSet<i64>]) -> Option<f64> {
    let wanted: usize = truths.iter().map(|t| t.len()).sum();
    let hits: usize = answers
        .iter()
        .zip(truths)
        .map(|(a, t)| a.iter().filter(|x| t.contains(&x.0)).count())
        .sum();
    (wanted > 0).then(|| hits as f64 / wanted as f64)
}

/// The `p` quantile of `v` (sorted in place; not empty).
fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn nothing_found(i: usize, reader: &dyn super::IndexReader) -> BackendError {
    BackendError::Io(format!(
        "query {i} found nothing in {}; is the index empty?",
        reader.describe()
    ))
}

fn write(backend: &mut dyn super::Backend, docs: &[Document]) -> Result<(), BackendError> {
    if docs.is_empty() {
        return Ok(());
    }
    for (doc, r) in docs.iter().zip(backend.write(docs)) {
        if let Err(e) = r {
            return Err(BackendError::Io(format!("{} was refused: {e}", doc.id)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(shape: &str, values: &[f32]) -> Vec<u8> {
        let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    #[test]
    fn npy_files_are_read_within_their_own_bytes() {
        let values: Vec<f32> = (0..6).map(|i| i as f32).collect();
        assert_eq!(
            npy_f32(&npy("(2, 3)", &values)).unwrap(),
            (2, 3, values.clone())
        );
        for (bytes, why) in [
            (npy("(3, 3)", &values), "needs 36 bytes"),
            (npy("(6,)", &values), "not 2-D"),
            (npy("(2, 3)", &values)[..20].to_vec(), "cut short"),
            (b"PK\x03\x04 a zip".to_vec(), "not a .npy"),
            (npy("(99999999999999999999, 3)", &values), "bad shape"),
            (npy("(4611686018427387904, 4)", &values), "overflows"),
        ] {
            let e = npy_f32(&bytes).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn vectors_drawn_like_real_ones_stay_near_them_and_queries_come_from_held_out_rows() {
        let dim = 16;
        let mut rng = Rng(3);
        let rows: Vec<f32> = (0..40).flat_map(|_| rng.unit(dim)).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.npy");
        std::fs::write(&path, npy("(40, 16)", &rows)).unwrap();
        let like = Like::from_npy(&path, 0.5).unwrap();
        let held: Vec<&[f32]> = rows.chunks(dim).skip(9).step_by(10).collect();
        let cos = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        for _ in 0..50 {
            let q = like.query(&mut rng);
            let best = held.iter().map(|h| cos(&q, h)).fold(f32::MIN, f32::max);
            assert!(best > 0.6, "a query is near a held-out row: {best}");
            let v = like.draw(&mut rng);
            assert!((cos(&v, &v) - 1.0).abs() < 1e-4);
        }
        assert!(Like::from_npy(&dir.path().join("none.npy"), 0.5).is_err());
    }
}
