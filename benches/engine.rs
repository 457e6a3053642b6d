//! Engine overhead: documents per second through connector -> work queue -> workers (no-op
//! stages) -> index queue -> indexer (null backend) -> events -> publisher. Nothing here does
//! real work, so this is the most the engine can carry.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ragline::connectors::{Connector, ConnectorError};
use ragline::document::Document;
use ragline::indexers::null::NullFactory;
use ragline::publisher::Publisher;
use ragline::run::progress::Silent;
use ragline::run::{execute, RunOptions, RunParts};
use ragline::stages::noop::Noop;
use ragline::stages::{Pipeline, Stage, StageError};

/// Publishes `n` small documents from memory.
struct Synthetic {
    n: usize,
}

impl Connector for Synthetic {
    fn name(&self) -> &'static str {
        "synthetic"
    }

    fn run(&mut self, publisher: &Publisher) -> Result<(), ConnectorError> {
        for i in 0..self.n {
            publisher.publish(Document::new(format!("doc-{i}"), "a short document body"))?;
        }
        Ok(())
    }
}

fn engine(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    for workers in [1usize, 2] {
        let n = 200_000;
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(
            BenchmarkId::new("noop-null", workers),
            &workers,
            |b, &workers| {
                b.iter(|| {
                    let backend = NullFactory {
                        delay: Duration::ZERO,
                    };
                    let pipeline = || -> Result<Pipeline, StageError> {
                        let stages: Vec<Box<dyn Stage>> = vec![Box::new(Noop), Box::new(Noop)];
                        Ok(Pipeline::new(stages))
                    };
                    let options = RunOptions {
                        workers,
                        ..RunOptions::default()
                    };
                    let parts = RunParts {
                        connectors: vec![Box::new(Synthetic { n })],
                        pipeline: &pipeline,
                        embedder: None,
                        backend: &backend,
                    };
                    let summary = execute(parts, &options, &mut Silent).expect("run");
                    assert_eq!(summary.counts.indexed, n as u64);
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, engine);
criterion_main!(benches);
