//! Kafka topics as a source and as a sink, against a real Apache Kafka 4 broker in KRaft mode
//! (`scripts/kafka.sh`, from Maven Central's jars; `RAGLINE_TEST_KAFKA` is its bootstrap
//! address, `RAGLINE_REQUIRE_KAFKA=1` makes its absence a failure). The records are produced
//! and read back by confluent-kafka (librdkafka's Python client) in the data venv.
//!
//! The bulk tests embed with a small random-weight model (what they check is counts and
//! offsets, not meaning); the sink's vectors are the real model's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{data_python, kill9, model_dir, ragline, random_model, read_jsonl, root, run};

/// The test broker's bootstrap address, or None (the test is skipped) when there is none.
fn broker() -> Option<String> {
    match std::env::var("RAGLINE_TEST_KAFKA") {
        Ok(b) if !b.is_empty() => Some(b),
        _ => {
            assert!(
                std::env::var("RAGLINE_REQUIRE_KAFKA").as_deref() != Ok("1"),
                "RAGLINE_TEST_KAFKA is not set and RAGLINE_REQUIRE_KAFKA=1: run \
                 `export RAGLINE_TEST_KAFKA=$(scripts/kafka.sh start)`"
            );
            eprintln!(
                "skipped: no Kafka broker (export RAGLINE_TEST_KAFKA=$(scripts/kafka.sh start))"
            );
            None
        }
    }
}

/// A topic name of its own for each test and run.
fn topic(name: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}-{}-{t}", std::process::id())
}

/// scripts/kafka-records.py ARGS in the data venv: its standard output.
fn records(args: &[&str]) -> String {
    let o = Command::new(data_python())
        .arg(root().join("scripts/kafka-records.py"))
        .args(args)
        .output()
        .expect("run scripts/kafka-records.py");
    assert!(
        o.status.success(),
        "kafka-records.py {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// `ragline ingest URL --index INDEX --model MODEL EXTRA...`: the exit code and the report.
fn ingest(
    url: &str,
    index: &str,
    model: &Path,
    dir: &Path,
    extra: &[&str],
) -> (Option<i32>, Value) {
    ingest_env(url, index, model, dir, extra, "")
}

/// [`ingest`] with the Kafka password in `RAGLINE_KAFKA_PASSWORD`.
fn ingest_env(
    url: &str,
    index: &str,
    model: &Path,
    dir: &Path,
    extra: &[&str],
    password: &str,
) -> (Option<i32>, Value) {
    let report = dir.join("report.json");
    let _ = std::fs::remove_file(&report);
    let o = run(ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(model)
        .arg("--index")
        .arg(index)
        .arg("--report")
        .arg(&report)
        .args(extra)
        .arg(url)
        .env("RAGLINE_KAFKA_PASSWORD", password));
    let r = std::fs::read(&report)
        .ok()
        .filter(|b| !b.is_empty())
        .map_or(Value::Null, |b| serde_json::from_slice(&b).unwrap());
    assert!(
        r != Value::Null,
        "no report: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code(), r)
}

fn count(report: &Value, what: &str) -> u64 {
    report["counts"][what].as_u64().unwrap()
}

/// Rows of `sql` in the SQLite file at `db`, through ragline's own dependency (rusqlite).
fn query_one(db: &Path, sql: &str) -> i64 {
    let c = rusqlite::Connection::open(db).unwrap();
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[test]
fn a_topic_of_100k_documents_is_indexed_once_and_then_exactly_its_changes() {
    let Some(b) = broker() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 7);
    let t = topic("bulk");
    records(&["create", &b, &t, "6"]);
    records(&["produce", &b, &t, "--count", "100000", "--words", "6"]);
    records(&["produce", &b, &t, "--count", "0", "--bad", "2"]);
    let url = format!("kafka://{b}/{t}?group=bulk");
    let db = dir.path().join("k.db");
    let index = format!("sqlite://{}", db.display());

    let (code, r) = ingest(&url, &index, &model, dir.path(), &[]);
    assert_eq!(code, Some(1), "two bad records fail: {r}");
    assert_eq!(count(&r, "indexed"), 100_000, "{r}");
    assert_eq!(count(&r, "failed"), 2, "{r}");
    let failures = r["failures"].to_string();
    assert!(
        failures.contains("bad-0") && failures.contains("not valid JSON"),
        "{failures}"
    );
    assert_eq!(r["chunks_embedded"], 100_000);
    assert_eq!(query_one(&db, "SELECT count(*) FROM documents"), 100_000);
    assert!(
        r["notes"]
            .to_string()
            .contains("offsets of 6 partitions committed"),
        "{r}"
    );

    // Nothing new: nothing read, nothing embedded.
    let (code, r) = ingest(&url, &index, &model, dir.path(), &[]);
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(
        (count(&r, "published"), r["chunks_embedded"].as_u64()),
        (0, Some(0)),
        "{r}"
    );

    // 1,000 updates and 100 tombstones: exactly those.
    records(&[
        "produce",
        &b,
        &t,
        "--count",
        "1000",
        "--version",
        "2",
        "--words",
        "6",
    ]);
    records(&[
        "produce",
        &b,
        &t,
        "--count",
        "100",
        "--start",
        "5000",
        "--tombstones",
        "100",
    ]);
    let (code, r) = ingest(&url, &index, &model, dir.path(), &[]);
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(count(&r, "indexed"), 1000, "{r}");
    assert_eq!(
        r["chunks_embedded"], 1000,
        "only the updated documents are embedded: {r}"
    );
    assert_eq!(r["pruned"], 100, "tombstones delete: {r}");
    assert_eq!(query_one(&db, "SELECT count(*) FROM documents"), 99_900);
    assert_eq!(
        query_one(&db, "SELECT count(*) FROM chunks WHERE text LIKE '% v2.'"),
        1000
    );
    assert_eq!(
        query_one(&db, "SELECT count(*) FROM documents WHERE id = 'doc-5050'"),
        0
    );
}

#[test]
fn kill_9_during_follow_loses_nothing_and_duplicates_nothing() {
    let Some(b) = broker() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 8);
    let t = topic("follow");
    records(&["create", &b, &t, "6"]);
    let url = format!("kafka://{b}/{t}?group=follow");
    let db = dir.path().join("f.db");
    let index = format!("sqlite://{}", db.display());
    let follow = |log: &Path| {
        ragline()
            .args([
                "ingest",
                "--progress",
                "none",
                "--device",
                "cpu",
                "--follow",
            ])
            .args(["--poll-interval", "1", "--metrics-addr", "127.0.0.1:0"])
            .arg("--model")
            .arg(&model)
            .arg("--index")
            .arg(&index)
            .arg(&url)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap()
    };
    // Records arrive while the follower runs and is killed three times.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15 ^ std::process::id() as u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..4u64 {
        let log = dir.path().join(format!("follow-{round}.log"));
        let mut child = follow(&log);
        let start = (round * 5000).to_string();
        records(&[
            "produce", &b, &t, "--count", "5000", "--start", &start, "--words", "6",
        ]);
        if round < 3 {
            std::thread::sleep(Duration::from_millis(500 + next() % 4000));
            kill9(&mut child);
        } else {
            let done = Instant::now();
            while count_docs(&db) < 20_000 {
                assert!(
                    done.elapsed() < Duration::from_secs(300),
                    "not every record indexed after the kills: {} of 20000; log:\n{}",
                    count_docs(&db),
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(250));
            }
            // Caught up: the metrics say the group's lag is 0.
            let text = std::fs::read_to_string(&log).unwrap();
            let addr = text
                .lines()
                .find_map(|l| l.strip_prefix("metrics on http://"))
                .and_then(|l| l.strip_suffix("/metrics"))
                .unwrap_or_else(|| panic!("no metrics address in the log:\n{text}"))
                .to_string();
            let want = format!("ragline_source_lag_records{{source=\"kafka://{b}/{t}\"}} 0");
            let waited = Instant::now();
            let mut metrics = String::new();
            while !metrics.contains(&want) {
                assert!(
                    waited.elapsed() < Duration::from_secs(60),
                    "no `{want}` in the metrics:\n{metrics}"
                );
                std::thread::sleep(Duration::from_millis(250));
                metrics = http_get(&addr, "/metrics");
            }
            assert!(
                metrics.contains("ragline_follow_passes_total "),
                "{metrics}"
            );
            kill9(&mut child);
        }
    }
    assert_eq!(count_docs(&db), 20_000);
    assert_eq!(
        query_one(&db, "SELECT count(*) FROM chunks"),
        20_000,
        "no chunk twice"
    );
    // Once accounted for, a last run finds nothing left to read.
    let (_, r) = ingest(&url, &index, &model, dir.path(), &[]);
    assert_eq!(count(&r, "indexed"), 0, "{r}");
}

/// The body of `GET PATH` from `addr` (HTTP/1.0, the connection closed by the server).
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = write!(c, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    out.split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string())
}

fn count_docs(db: &Path) -> i64 {
    if !db.exists() {
        return 0;
    }
    rusqlite::Connection::open(db)
        .and_then(|c| c.query_row("SELECT count(*) FROM documents", [], |r| r.get(0)))
        .unwrap_or(0)
}

#[test]
fn the_sink_topic_carries_every_chunk_with_its_vector() {
    let Some(b) = broker() else { return };
    let dir = tempfile::tempdir().unwrap();
    let src = topic("sinksrc");
    let out = topic("sinkout");
    records(&["create", &b, &src, "3"]);
    records(&["produce", &b, &src, "--count", "60", "--words", "40"]);
    let model = model_dir();
    // The same records through the sink and into a JSONL file (another group each).
    let (code, r) = ingest(
        &format!("kafka://{b}/{src}?group=to-kafka"),
        &format!("kafka://{b}/{out}?vector=base64"),
        &model,
        dir.path(),
        &[],
    );
    assert_eq!(code, Some(0), "{r}");
    let jsonl: PathBuf = dir.path().join("chunks.jsonl");
    let (code, r) = ingest(
        &format!("kafka://{b}/{src}?group=to-jsonl"),
        &format!("jsonl:{}", jsonl.display()),
        &model,
        dir.path(),
        &[],
    );
    assert_eq!(code, Some(0), "{r}");
    let expected: std::collections::HashMap<String, Vec<f32>> = read_jsonl(&jsonl)
        .into_iter()
        .filter(|l| l["kind"] == "chunk")
        .map(|l| {
            let v = l["vector"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32);
            (l["id"].as_str().unwrap().to_string(), v.collect())
        })
        .collect();
    assert_eq!(expected.len(), 60);
    let got: Vec<Value> = records(&["consume", &b, &out])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(got.len(), 60, "one record per chunk");
    for rec in &got {
        let v = &rec["value"];
        assert_eq!(rec["key"], v["chunk_id"], "keyed by chunk id");
        assert!(v["document_id"].as_str().unwrap().starts_with("doc-"));
        assert!(v["text"].as_str().unwrap().contains(" v1."));
        assert!(v["model"].as_str().unwrap().contains("all-MiniLM-L6-v2"));
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v["vector"].as_str().unwrap())
            .unwrap();
        let vector: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let want = &expected[v["chunk_id"].as_str().unwrap()];
        let dot: f32 = vector.iter().zip(want).map(|(a, b)| a * b).sum();
        let norms: f32 = vector.iter().map(|a| a * a).sum::<f32>().sqrt()
            * want.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((dot / norms - 1.0).abs() < 1e-6, "cosine {}", dot / norms);
    }
    // A re-run writes nothing; a tombstone in the source is a tombstone in the sink.
    records(&[
        "produce",
        &b,
        &src,
        "--count",
        "1",
        "--start",
        "7",
        "--tombstones",
        "1",
    ]);
    let (code, r) = ingest(
        &format!("kafka://{b}/{src}?group=to-kafka"),
        &format!("kafka://{b}/{out}?vector=base64"),
        &model,
        dir.path(),
        &[],
    );
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(r["chunks_embedded"], 0, "{r}");
    let after: Vec<Value> = records(&["consume", &b, &out])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(after.len(), 61, "only the tombstone is new");
    assert!(after
        .iter()
        .any(|r| r["key"] == "doc-7#0" && r["value"].is_null()));
}

#[test]
fn scram_over_tls_works_and_a_wrong_password_fails_at_start_without_the_secret() {
    let Some(b) = broker() else { return };
    let kafka = root().join("scripts/kafka.sh");
    let secure = String::from_utf8(
        Command::new(&kafka)
            .arg("secure-url")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    let password = String::from_utf8(
        Command::new(&kafka)
            .arg("password")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 9);
    let t = topic("secure");
    records(&["create", &b, &t, "2"]);
    records(&["produce", &b, &t, "--count", "50"]);
    let (hosts, query) = secure.split_once('?').unwrap();
    let url = format!("kafka://{hosts}/{t}?{query}&group=secure");
    let index = format!("sqlite://{}", dir.path().join("s.db").display());
    let (code, r) = ingest_env(&url, &index, &model, dir.path(), &[], &password);
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(count(&r, "indexed"), 50, "{r}");

    let wrong = "not-the-password-5e1f";
    let o = run(ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(&model)
        .arg("--index")
        .arg(&index)
        .arg(&url)
        .env("RAGLINE_KAFKA_PASSWORD", wrong));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_ne!(o.status.code(), Some(0), "{all}");
    assert!(
        all.contains("uthentication") || all.contains("SASL"),
        "the reason is the credentials: {all}"
    );
    assert!(
        !all.contains(wrong) && !all.contains(&password),
        "a secret printed: {all}"
    );
}

/// A three-node cluster of its own (scripts/kafka.sh in another folder and ports), stopped and
/// wiped when dropped.
struct Cluster {
    dir: PathBuf,
}

impl Cluster {
    const PORT: u16 = 49392;

    fn script(&self) -> Command {
        let mut c = Command::new(root().join("scripts/kafka.sh"));
        c.env("RAGLINE_KAFKA_DIR", &self.dir)
            .env("RAGLINE_KAFKA_PORT", Self::PORT.to_string())
            .env("RAGLINE_KAFKA_HEAP", "384m");
        c
    }

    fn start() -> (Cluster, String) {
        let cluster = Cluster {
            dir: std::env::temp_dir().join(format!("ragline-kafka-3-{}", std::process::id())),
        };
        let o = cluster
            .script()
            .args(["start", "--cluster", "3"])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "a three-node cluster: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let url = String::from_utf8(o.stdout)
            .unwrap()
            .trim()
            .lines()
            .last()
            .unwrap()
            .to_string();
        (cluster, url)
    }

    fn kill(&self, node: u32) {
        let o = self
            .script()
            .args(["kill", &node.to_string()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.script().args(["stop", "--kill", "--wipe"]).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_broker_killed_in_a_three_node_cluster_does_not_stop_the_run() {
    if broker().is_none() {
        return;
    }
    let (cluster, b) = Cluster::start();
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 10);
    let t = topic("replicated");
    records(&["create", &b, &t, "6", "3"]);
    records(&["produce", &b, &t, "--count", "20000", "--words", "6"]);
    let db = dir.path().join("c.db");
    let report = dir.path().join("report.json");
    let child = ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(&model)
        .arg("--index")
        .arg(format!("sqlite://{}", db.display()))
        .arg("--report")
        .arg(&report)
        .arg(format!("kafka://{b}/{t}?group=replicated"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-run: some documents in, not all.
    let start = Instant::now();
    while count_docs(&db) < 2000 && start.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let at_kill = count_docs(&db);
    cluster.kill(2);
    let out = child.wait_with_output().unwrap();
    assert!(
        at_kill < 20_000,
        "the node was killed after the run: {at_kill} documents in"
    );
    eprintln!("node 2 killed with {at_kill} of 20000 documents indexed");
    let r: Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap_or_default()).unwrap_or(Value::Null);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{r}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(count(&r, "indexed"), 20_000, "{r}");
    assert!(r["notes"].to_string().contains("committed"), "{r}");
    assert_eq!(count_docs(&db), 20_000);
}

#[test]
fn a_record_over_the_size_limit_fails_alone_with_the_reason() {
    let Some(b) = broker() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 32, 11);
    let t = topic("sizes");
    records(&["create", &b, &t, "2"]);
    records(&["produce", &b, &t, "--count", "5", "--words", "6"]);
    records(&[
        "produce", &b, &t, "--count", "1", "--start", "5", "--words", "400",
    ]);
    let index = format!("sqlite://{}", dir.path().join("z.db").display());
    let url = format!("kafka://{b}/{t}?group=sizes");
    let (code, r) = ingest(
        &url,
        &index,
        &model,
        dir.path(),
        &["--max-file-bytes", "2000"],
    );
    assert_eq!(code, Some(1), "{r}");
    assert_eq!((count(&r, "indexed"), count(&r, "failed")), (5, 1), "{r}");
    let failure = r["failures"][0].to_string();
    assert!(
        failure.contains("doc-5") && failure.contains("over --max-file-bytes"),
        "{failure}"
    );
}
