//! A connector on its own: records read from a Kafka topic and published as documents onto a
//! work queue that a thread empties (no stages, no index), in documents per second. What
//! `scripts/bench-kafka.sh` sets beside a plain consumer of the same topic: whether the
//! connector could be the bottleneck of a run.
//!
//! Needs a broker and a topic of JSON documents (scripts/bench-kafka.sh makes both):
//! `RAGLINE_BENCH_KAFKA=HOST:PORT RAGLINE_BENCH_KAFKA_TOPIC=T RAGLINE_BENCH_KAFKA_RECORDS=N
//! cargo bench --bench sources`; without them it does nothing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ragline::connectors::kafka::KafkaConnector;
use ragline::connectors::Connector;
use ragline::document::{Document, RunId};
use ragline::publisher::Publisher;
use ragline::queue::memory::MemoryQueue;
use ragline::queue::Queue;
use ragline::signal::RunSignal;

/// The binary's allocator (src/main.rs), so the connector is measured as it runs.
#[global_allocator]
static ALLOCATOR: ragline::memory::Counting<mimalloc::MiMalloc> =
    ragline::memory::Counting::new(mimalloc::MiMalloc);

fn kafka(c: &mut Criterion) {
    let (Ok(broker), Ok(topic), Ok(records)) = (
        std::env::var("RAGLINE_BENCH_KAFKA"),
        std::env::var("RAGLINE_BENCH_KAFKA_TOPIC"),
        std::env::var("RAGLINE_BENCH_KAFKA_RECORDS"),
    ) else {
        eprintln!("sources/kafka: skipped (set RAGLINE_BENCH_KAFKA, _TOPIC and _RECORDS)");
        return;
    };
    let records: u64 = records
        .parse()
        .expect("RAGLINE_BENCH_KAFKA_RECORDS is a number");
    let mut group = c.benchmark_group("sources");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .throughput(Throughput::Elements(records));
    let pass = AtomicU64::new(0);
    group.bench_function("kafka", |b| {
        b.iter(|| {
            // A group of its own each pass: the whole topic from its start.
            let n = pass.fetch_add(1, Ordering::Relaxed);
            let url = format!(
                "kafka://{broker}/{topic}?group=bench-{}-{n}",
                std::process::id()
            );
            let mut connector = KafkaConnector::new(&url, "bench", 1 << 20).unwrap();
            let queue: Arc<MemoryQueue<Document>> = Arc::new(MemoryQueue::new("work", 4096));
            let done = Arc::new(AtomicBool::new(false));
            let drain = {
                let (queue, done) = (Arc::clone(&queue), Arc::clone(&done));
                std::thread::spawn(move || {
                    let mut got = 0u64;
                    loop {
                        match queue.pop(Duration::from_millis(20)) {
                            Ok(Some(d)) => {
                                got += 1;
                                let _ = queue.ack(d.tag);
                            }
                            _ if done.load(Ordering::Relaxed) => return got,
                            _ => {}
                        }
                    }
                })
            };
            let signal = Arc::new(RunSignal::new());
            let publisher = Publisher::new(RunId::generate(), queue, signal, false);
            connector.run(&publisher).unwrap();
            done.store(true, Ordering::Relaxed);
            let got = drain.join().unwrap();
            assert_eq!(got, records, "every record published");
        })
    });
    group.finish();
}

criterion_group!(benches, kafka);
criterion_main!(benches);
