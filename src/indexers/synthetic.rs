//! Synthetic embedded documents, and the write benchmark over any backend
//! (`ragline bench --write URI`, `benches/index.rs`): how fast an index takes chunks with
//! their vectors, apart from the model.
//!
//! A document is a parent and [`CHUNKS_PER_DOCUMENT`] chunks of 90 words (about 600 bytes)
//! with unit vectors, all derived from the document's number, so any thread can make any
//! range and every run writes the same rows (scripts/bench-postgres.py makes rows of the
//! same shape for the psycopg reference).

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
            vector: Some(rng.unit(dim)),
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
                        pending.extend(document(d, dim, seed));
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
    pub vector_p50_ms: f64,
    pub vector_p99_ms: f64,
    pub keyword_p50_ms: f64,
    pub keyword_p99_ms: f64,
}

/// Run `queries` random vector queries and as many two-word keyword queries against an index
/// of synthetic rows, `k` results each; every query must find something.
pub fn search_latency(
    reader: &dyn super::IndexReader,
    queries: usize,
    k: usize,
    dim: usize,
) -> Result<SearchLatency, BackendError> {
    let mut rng = Rng(99);
    let mut vector = Vec::with_capacity(queries);
    let mut keyword = Vec::with_capacity(queries);
    for i in 0..queries {
        let q = rng.unit(dim);
        let t = Instant::now();
        let found = reader.nearest(&q, k)?.len();
        vector.push(t.elapsed().as_secs_f64() * 1e3);
        let words = format!(
            "{} {}",
            WORDS[i % WORDS.len()],
            WORDS[(i * 7 + 3) % WORDS.len()]
        );
        let t = Instant::now();
        let found_words = reader.keyword(&words, k)?.len();
        keyword.push(t.elapsed().as_secs_f64() * 1e3);
        if found == 0 || found_words == 0 {
            return Err(BackendError::Io(format!(
                "query {i} found nothing in {}; is the index empty?",
                reader.describe()
            )));
        }
    }
    let pct = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * p).round() as usize]
    };
    Ok(SearchLatency {
        queries,
        k,
        vector_p50_ms: pct(&mut vector, 0.5),
        vector_p99_ms: pct(&mut vector, 0.99),
        keyword_p50_ms: pct(&mut keyword, 0.5),
        keyword_p99_ms: pct(&mut keyword, 0.99),
    })
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
