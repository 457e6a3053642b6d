//! Chunking throughput per core: extract + token-aware chunking of real corpora with the
//! model's tokenizer, one thread. Needs the model (scripts/fetch-model.sh) and the shared data
//! (../shared/data, or `$RAGLINE_DATA_DIR` as the tests read it); a corpus that is absent is
//! skipped with a message.

use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ragline::document::Document;
use ragline::embed::files::ModelFiles;
use ragline::embed::tokenizer::TextTokenizer;
use ragline::stages::chunk::{ChunkConfig, ChunkStage};
use ragline::stages::extract::Extract;
use ragline::stages::Stage;

fn corpus(dir: &Path, limit_bytes: usize) -> Vec<Document> {
    let mut docs = Vec::new();
    let mut total = 0;
    for entry in walkdir::WalkDir::new(dir).sort_by_file_name() {
        let entry = entry.unwrap();
        let p = entry.path();
        if p.extension().is_some_and(|e| e == "md") {
            let text = std::fs::read_to_string(p).unwrap();
            total += text.len();
            let mut d = Document::new(p.display().to_string(), text);
            d.fields.metadata.insert("format".into(), "markdown".into());
            docs.push(d);
            if total >= limit_bytes {
                break;
            }
        }
    }
    docs
}

fn chunking(c: &mut Criterion) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let model = root.join("models/all-MiniLM-L6-v2");
    let Ok(files) = ModelFiles::from_dir("all-MiniLM-L6-v2", &model) else {
        eprintln!(
            "SKIPPED: no model in {} (run scripts/fetch-model.sh)",
            model.display()
        );
        return;
    };
    let tokenizer = TextTokenizer::load(&files, 256).unwrap();
    let sizes = ChunkConfig::default()
        .validate(tokenizer.max_content_len(), false)
        .unwrap();
    let mut group = c.benchmark_group("chunking");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    let data = std::env::var_os("RAGLINE_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("../shared/data"));
    for (name, dir, limit) in [
        ("react-docs", "react-docs", usize::MAX),
        ("mdn-8MB", "mdn", 8 << 20),
    ] {
        let dir = data.join(dir);
        if !dir.exists() {
            eprintln!("SKIPPED: {} is absent", dir.display());
            continue;
        }
        let docs = corpus(&dir, limit);
        let bytes: usize = docs.iter().map(|d| d.fields.text.len()).sum();
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function(name, |b| {
            let mut extract = Extract::default();
            let mut chunk = ChunkStage::new(tokenizer.clone(), sizes);
            b.iter(|| {
                let mut chunks = 0;
                for d in &docs {
                    let mut d = d.clone();
                    extract.process(&mut d).unwrap();
                    chunks += chunk.process(&mut d).unwrap().len();
                }
                chunks
            })
        });
    }
    group.finish();
}

criterion_group!(benches, chunking);
criterion_main!(benches);
