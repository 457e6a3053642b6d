//! The run engine: bad input, failing stages, backpressure, exit codes.

use std::fs;
use std::io::Write;
use std::os::unix::fs::symlink;

use ragline::connectors::filesystem::{FilesystemConfig, FilesystemConnector};
use ragline::connectors::jsonl::JsonlFields;
use ragline::document::Document;
use ragline::indexers::jsonl::JsonlFactory;
use ragline::run::progress::Silent;
use ragline::run::{execute, RunOptions, RunParts};
use ragline::stages::extract::Extract;
use ragline::stages::{Pipeline, Stage, StageError};
use serde_json::Value;

use crate::util::{read_jsonl, run};

/// Every kind of bad input in one folder: the run completes, each bad item is reported with
/// its id and reason, nothing else is lost, and the exit code says some failed.
#[test]
fn bad_input_is_reported_and_never_stops_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("corpus");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("good.md"), "# Good\n\nA fine document.\n").unwrap();
    symlink(d.join("nowhere.md"), d.join("dangling.md")).unwrap();
    symlink("/etc/hostname", d.join("outside.txt")).unwrap();
    fs::write(d.join("latin1.txt"), b"caf\xe9 au lait\n").unwrap();
    fs::write(d.join("empty.md"), "").unwrap();
    fs::write(d.join("blob.txt"), b"\x7fELF\x02\x01\x01\x00\x00\x00binary").unwrap();
    // 50 MB on one line.
    let mut big = fs::File::create(d.join("huge.txt")).unwrap();
    let word = b"lorem ipsum dolor sit amet ";
    for _ in 0..(50 << 20) / word.len() {
        big.write_all(word).unwrap();
    }
    drop(big);
    fs::write(
        d.join("data.jsonl"),
        "{\"id\":\"j1\",\"text\":\"first\"}\n{\"id\":\"j2\",\"text\":\n{\"id\":\"j3\",\"text\":\"third\"}\n",
    )
    .unwrap();
    let out = dir.path().join("out.jsonl");
    let report = dir.path().join("report.json");

    let o = run(crate::util::ragline()
        .args(["ingest", "--no-chunk", "--progress", "none", "--index"])
        .arg(format!("jsonl:{}", out.display()))
        .arg("--report")
        .arg(&report)
        .arg(&d));
    assert_eq!(
        o.status.code(),
        Some(1),
        "some documents failed: exit code 1"
    );

    let r: Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    let reasons = |key: &str| -> Vec<(String, String, String)> {
        let mut v: Vec<_> = r[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["id"].as_str().unwrap().to_string(),
                    f["stage"].as_str().unwrap().to_string(),
                    f["reason"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let failures = reasons("failures");
    let ids: Vec<&str> = failures.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(ids, vec!["dangling.md", "data.jsonl:2", "latin1.txt"]);
    assert!(
        failures[0].2.contains("dangling symbolic link"),
        "{:?}",
        failures[0]
    );
    assert!(
        failures[1].2.contains("line 2") && failures[1].2.contains("invalid JSON"),
        "{:?}",
        failures[1]
    );
    assert!(
        failures[2].2.contains("invalid UTF-8 at byte 3") && failures[2].2.contains("iconv"),
        "{:?}",
        failures[2]
    );
    let drops = reasons("dropped");
    let dropped: Vec<&str> = drops.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(dropped, vec!["blob.txt", "empty.md", "outside.txt"]);
    assert!(drops[0].2.contains("binary"));
    assert!(drops[1].2.contains("empty"));
    assert!(drops[2].2.contains("outside the root"));

    let c = &r["counts"];
    assert_eq!(c["published"], 10);
    assert_eq!(c["failed"], 3);
    assert_eq!(c["dropped"], 3);
    assert_eq!(c["indexed"], 4);

    // Everything good is in the output, once.
    let records = read_jsonl(&out);
    let mut ids: Vec<&str> = records.iter().map(|r| r["id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, vec!["good.md", "huge.txt", "j1", "j3"]);
    let huge = records.iter().find(|r| r["id"] == "huge.txt").unwrap();
    assert_eq!(
        huge["text"].as_str().unwrap().len(),
        (50 << 20) / word.len() * word.len()
    );
}

#[test]
fn a_clean_corpus_exits_zero_and_bad_usage_exits_two() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.md"), "# A\n\ntext\n").unwrap();
    let out = dir.path().join("o.jsonl");
    let ok = run(crate::util::ragline()
        .args(["ingest", "--no-chunk", "--progress", "none", "--index"])
        .arg(format!("jsonl:{}", out.display()))
        .arg(dir.path()));
    assert_eq!(ok.status.code(), Some(0));
    assert_eq!(read_jsonl(&out).len(), 1);

    let missing = run(crate::util::ragline()
        .args(["ingest", "--no-chunk", "/nonexistent/path", "--index"])
        .arg(format!("jsonl:{}", out.display())));
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/path"));

    let unwritable = run(crate::util::ragline()
        .args([
            "ingest",
            "--no-chunk",
            "--index",
            "jsonl:/nonexistent/dir/o.jsonl",
        ])
        .arg(dir.path()));
    assert_eq!(unwritable.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unwritable.stderr).contains("choose a writable location"));

    let flag = run(crate::util::ragline()
        .args(["ingest", "--no-such-flag"])
        .arg(dir.path()));
    assert_eq!(flag.status.code(), Some(2));
}

/// Panics on one document, by id.
struct PanicOn(&'static str);

impl Stage for PanicOn {
    fn name(&self) -> &'static str {
        "fragile"
    }

    fn process(&mut self, doc: &mut Document) -> Result<Vec<Document>, StageError> {
        if doc.id == self.0 {
            panic!("cannot handle {}", doc.id);
        }
        Ok(Vec::new())
    }
}

#[test]
fn a_stage_that_panics_fails_that_document_only() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c");
    fs::create_dir(&corpus).unwrap();
    for i in 0..50 {
        fs::write(
            corpus.join(format!("doc{i:02}.md")),
            format!("# Doc {i}\n\nBody.\n"),
        )
        .unwrap();
    }
    let out = dir.path().join("out.jsonl");
    let config = FilesystemConfig::new(vec![corpus])
        .validate(JsonlFields::default())
        .unwrap();
    let backend = JsonlFactory::create(&out).unwrap();
    let pipeline = || -> Result<Pipeline, StageError> {
        let stages: Vec<Box<dyn Stage>> =
            vec![Box::new(Extract::default()), Box::new(PanicOn("doc17.md"))];
        Ok(Pipeline::new(stages))
    };
    let parts = RunParts {
        connectors: vec![Box::new(FilesystemConnector::new(config))],
        pipeline: &pipeline,
        embedder: None,
        backend: &backend,
    };
    let options = RunOptions {
        workers: 3,
        ..RunOptions::default()
    };
    let summary = execute(parts, &options, &mut Silent).unwrap();
    assert_eq!(summary.counts.published, 50);
    assert_eq!(summary.counts.indexed, 49);
    assert_eq!(summary.counts.failed, 1);
    assert_eq!(summary.failures.len(), 1);
    let f = &summary.failures[0];
    assert_eq!(f.id, "doc17.md");
    assert_eq!(f.stage, "fragile");
    assert!(
        f.reason.contains("panicked") && f.reason.contains("cannot handle doc17.md"),
        "{}",
        f.reason
    );
    let records = read_jsonl(&out);
    assert_eq!(records.len(), 49);
    assert!(records.iter().all(|r| r["id"] != "doc17.md"));
}

/// The peak RSS GNU `time -v` printed on a command's standard error, in kB.
fn peak_rss_kb(stderr: &[u8]) -> u64 {
    String::from_utf8_lossy(stderr)
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Maximum resident set size (kbytes): ")
        })
        .expect("GNU time prints the peak RSS")
        .parse()
        .unwrap()
}

/// A slow backend pushes back on the connector: peak memory stays far below the corpus size.
/// Peak RSS is read from `/usr/bin/time -v` (GNU time; CI installs it).
#[test]
fn a_slow_backend_keeps_memory_bounded() {
    let time = std::path::Path::new("/usr/bin/time");
    if !time.exists() {
        eprintln!("SKIPPED: /usr/bin/time (GNU time) is not installed: apt-get install time");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    let mut f = std::io::BufWriter::new(fs::File::create(&corpus).unwrap());
    let body = "x".repeat(2000);
    let docs = 100_000;
    for i in 0..docs {
        writeln!(f, "{{\"id\":\"d{i}\",\"text\":\"{i} {body}\"}}").unwrap();
    }
    drop(f);
    let corpus_bytes = fs::metadata(&corpus).unwrap().len();
    let report = dir.path().join("r.json");
    let o = run(std::process::Command::new(time)
        .arg("-v")
        .arg(env!("CARGO_BIN_EXE_ragline"))
        .args([
            "ingest",
            "--no-chunk",
            "--progress",
            "none",
            "--batch-size",
            "64",
        ])
        .args(["--index", "null:?delay=5ms", "--report"])
        .arg(&report)
        .arg(&corpus));
    assert_eq!(o.status.code(), Some(0));
    let r: Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["counts"]["indexed"], docs);
    let peak_kb = peak_rss_kb(&o.stderr);
    // What the process holds before it reads anything (the binary and the libraries it maps,
    // OpenSSL's among them), measured the same way: the run's growth is what a queue holds.
    let idle_kb = peak_rss_kb(
        &run(std::process::Command::new(time)
            .arg("-v")
            .arg(env!("CARGO_BIN_EXE_ragline"))
            .arg("--version"))
        .stderr,
    );
    eprintln!(
        "peak RSS {} MB ({} MB for `ragline --version`) for a corpus of {} MB",
        peak_kb / 1024,
        idle_kb / 1024,
        corpus_bytes >> 20
    );
    assert!(
        peak_kb.saturating_sub(idle_kb) * 1024 < corpus_bytes / 4,
        "peak RSS {peak_kb} kB ({idle_kb} kB idle) is not far below the {corpus_bytes}-byte \
         corpus: is a queue unbounded?"
    );
}
