//! The lifecycle queue in the SQLite index: work items per second through `enrich` (claim
//! with a lease, complete in one transaction) with a stage that does nothing, so that only
//! the queue is measured. Goal: 20,000 items/s.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use ragline::document::Document;
use ragline::indexers::sqlite::{SqliteFactory, SqliteStore};
use ragline::indexers::BackendFactory;
use ragline::indexers::IndexIdentity;
use ragline::lifecycle::{Priority, NOOP};
use ragline::run::enrich::{self, EnrichOptions, EnrichWorker};
use ragline::run::progress::Silent;

fn index(path: &std::path::Path, n: usize) {
    let f = SqliteFactory::open(
        path,
        IndexIdentity {
            model: None,
            pipeline_fingerprint: "bench".into(),
            defer_embed: false,
            priority: ragline::lifecycle::Priority::Fresh,
            ann: Default::default(),
        },
    )
    .unwrap();
    let mut backend = f.connect().unwrap();
    let docs: Vec<Document> = (0..n)
        .map(|i| {
            let mut d = Document::new(format!("doc{i:07}"), "");
            d.content_hash = Some(format!("h{i}"));
            d
        })
        .collect();
    for batch in docs.chunks(1024) {
        for r in backend.write(batch) {
            r.expect("write");
        }
    }
}

fn noop_throughput(c: &mut Criterion) {
    let mut group = c.benchmark_group("lifecycle");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    let n = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    index(&path, n);
    group.throughput(Throughput::Elements(n as u64));
    for workers in [1usize, 2] {
        group.bench_function(BenchmarkId::new("noop-items", workers), |b| {
            b.iter_batched(
                || {
                    let mut store = SqliteStore::open(&path).unwrap();
                    assert_eq!(store.enqueue_all(NOOP, Priority::Fresh).unwrap(), n as u64);
                    (0..workers)
                        .map(|_| EnrichWorker {
                            store: SqliteStore::open(&path).unwrap(),
                            loader: Box::new(|_| {
                                Err(ragline::run::enrich::Unloadable(
                                    "no model: the noop stage needs none".into(),
                                ))
                            }),
                        })
                        .collect::<Vec<_>>()
                },
                |list| {
                    let options = EnrichOptions {
                        stages: vec![NOOP.to_string()],
                        claim_items: 1024,
                        claim_cost: u64::MAX,
                        ..EnrichOptions::default()
                    };
                    let s = enrich::execute(list, &options, "bench".into(), &mut Silent).unwrap();
                    assert_eq!(s.counts.indexed, n as u64);
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, noop_throughput);
criterion_main!(benches);
