//! The SQLite index: bulk upsert throughput (chunks/s with 384-d vectors, in indexer-sized
//! batches) and search latency (p50/p99, vector and keyword) at 10k and 100k chunks.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use ragline::document::Document;
use ragline::indexers::sqlite::{SqliteFactory, SqliteReader};
use ragline::indexers::synthetic::{self, Rng, WORDS};
use ragline::indexers::{Backend, BackendFactory};

const DIM: usize = 384;
const BATCH: usize = synthetic::BATCH;

fn docs(n: usize, seed: u64) -> Vec<Document> {
    synthetic::documents(n, DIM, seed)
}

fn identity() -> ragline::indexers::IndexIdentity {
    synthetic::identity(DIM)
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
        let queries: Vec<Vec<f32>> = (0..200).map(|_| rng.unit(DIM)).collect();
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
