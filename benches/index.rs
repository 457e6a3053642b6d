//! The SQLite index: bulk upsert throughput (chunks/s with 384-d vectors, in indexer-sized
//! batches) and search latency (p50/p99, vector and keyword) at 10k and 100k chunks.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use ragline::document::{Chunk, Document};
use ragline::indexers::sqlite::{IndexIdentity, ModelIdentity, SqliteFactory, SqliteReader};
use ragline::indexers::{Backend, BackendFactory};

const DIM: usize = 384;
const BATCH: usize = ragline::indexers::batch::DEFAULT_MAX_ITEMS;

/// Deterministic pseudo-random numbers (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> Vec<f32> {
        let v: Vec<f32> = (0..DIM)
            .map(|_| (self.next() % 2000) as f32 / 1000.0 - 1.0)
            .collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect()
    }
}

const WORDS: &[&str] = &[
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

fn docs(n: usize, seed: u64) -> Vec<Document> {
    let mut rng = Rng(seed | 1);
    let mut out = Vec::with_capacity(n + n / 10);
    let per_doc = 10;
    for d in 0..n.div_ceil(per_doc) {
        let mut parent = Document::new(format!("doc{d}"), "");
        parent.content_hash = Some(format!("h{d}"));
        parent.children = per_doc as u32;
        out.push(parent.clone());
        for i in 0..per_doc {
            let text: Vec<&str> = (0..90)
                .map(|_| WORDS[(rng.next() % WORDS.len() as u64) as usize])
                .collect();
            let mut c = parent.child(format!("doc{d}#{i}"), text.join(" "));
            c.chunk = Some(Box::new(Chunk {
                ordinal: i as u32,
                heading_path: vec!["Guide".into(), format!("Section {i}")],
                start: 0,
                end: 600,
                token_count: 120,
                pages: None,
                token_ids: Vec::new(),
                input_key: Some(Chunk::input_key_of(&[d as u32, i as u32])),
                vector: Some(rng.unit()),
            }));
            out.push(c);
        }
    }
    out
}

fn identity() -> IndexIdentity {
    IndexIdentity {
        model: Some(ModelIdentity {
            name: "bench".into(),
            dir: "/nonexistent".into(),
            fingerprint: "bench".into(),
            dimension: DIM,
            tokenizer: Some("bench".into()),
        }),
        pipeline_fingerprint: "bench".into(),
        defer_embed: false,
        priority: ragline::lifecycle::Priority::Fresh,
    }
}

fn write_all(backend: &mut dyn Backend, docs: &[Document]) {
    for batch in docs.chunks(BATCH) {
        for r in backend.write(batch) {
            r.expect("write");
        }
    }
}

fn upsert(c: &mut Criterion) {
    let mut group = c.benchmark_group("index/upsert");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(15));
    let n = 10_000;
    let batch = docs(n, 7);
    let chunks = batch.iter().filter(|d| d.chunk.is_some()).count();
    group.throughput(Throughput::Elements(chunks as u64));
    group.bench_function(BenchmarkId::new("chunks-384d", n), |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().unwrap();
                let f = SqliteFactory::open(&dir.path().join("b.db"), identity()).unwrap();
                let backend = f.connect().unwrap();
                (dir, f, backend)
            },
            |(_dir, _f, mut backend)| write_all(backend.as_mut(), &batch),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn search(c: &mut Criterion) {
    let mut group = c.benchmark_group("index/search");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(10));
    for n in [10_000usize, 100_000] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let f = SqliteFactory::open(&path, identity()).unwrap();
        write_all(f.connect().unwrap().as_mut(), &docs(n, 11));
        let reader = SqliteReader::open(&path).unwrap();
        let mut rng = Rng(99);
        let queries: Vec<Vec<f32>> = (0..200).map(|_| rng.unit()).collect();
        // p50 / p99 over 200 queries, printed beside criterion's own statistics.
        for (mode, run) in [
            (
                "vector",
                Box::new(|i: usize| reader.nearest(&queries[i], 10).unwrap().len())
                    as Box<dyn Fn(usize) -> usize>,
            ),
            (
                "keyword",
                Box::new(|i: usize| {
                    reader
                        .keyword(&format!("{} {}", WORDS[i % 27], WORDS[(i * 7) % 27]), 10)
                        .unwrap()
                        .len()
                }),
            ),
        ] {
            let mut times: Vec<Duration> = (0..queries.len())
                .map(|i| {
                    let t = Instant::now();
                    assert!(run(i) > 0);
                    t.elapsed()
                })
                .collect();
            times.sort();
            println!(
                "index/search/{mode}/{n}: p50 {:.2} ms, p99 {:.2} ms over {} queries",
                percentile(&times, 0.5).as_secs_f64() * 1e3,
                percentile(&times, 0.99).as_secs_f64() * 1e3,
                times.len()
            );
            let mut i = 0;
            group.bench_function(BenchmarkId::new(mode, n), |b| {
                b.iter(|| {
                    i = (i + 1) % queries.len();
                    run(i)
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, upsert, search);
criterion_main!(benches);
