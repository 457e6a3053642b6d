//! Distributed runs on a real NATS JetStream server: separate `ragline` processes for each
//! role, a Postgres index when `RAGLINE_TEST_POSTGRES` names a server (else SQLite with its
//! single indexer). Each test starts its own nats-server (the binary `scripts/nats.sh bin`
//! installs, named by `RAGLINE_NATS_SERVER`) on a free port with its own storage, so a test
//! can kill it. Without the variable the tests skip with a message; with
//! `RAGLINE_REQUIRE_NATS=1` (CI) they fail instead.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::backend::{postgres_index, postgres_url, TestIndex};
use crate::util::{ragline, random_model, run, shared_data};

/// The model of these tests: a random-weight BERT with the default model's tokenizer (so the
/// chunks are the real ones) and 64 dimensions, fast enough on the CPU of a test build for
/// several runs of react-docs. What is tested is the pipeline across processes, which does not
/// depend on the weights; the real model's runs are elsewhere (and the distributed benchmark
/// in BENCHMARKS.md ran it).
fn test_model(dir: &Path) -> PathBuf {
    random_model(dir, 64, 11)
}

/// An ingest in one process, the reference a distributed run is compared with.
fn ingest_into(corpus: &Path, uri: &str, report: &Path, model: &Path) -> (Option<i32>, Value) {
    let o = run(ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(model)
        .args(["--index", uri, "--report"])
        .arg(report)
        .arg(corpus));
    let r = fs::read(report)
        .ok()
        .filter(|b| !b.is_empty())
        .map_or(Value::Null, |b| serde_json::from_slice(&b).unwrap());
    (o.status.code(), r)
}

/// A nats-server of the test's own.
pub struct Nats {
    bin: PathBuf,
    dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The nats-server binary, or None (with a message) when the tests are not asked for.
fn nats_bin() -> Option<PathBuf> {
    match std::env::var_os("RAGLINE_NATS_SERVER").filter(|b| !b.is_empty()) {
        Some(b) => Some(PathBuf::from(b)),
        None => {
            assert!(
                std::env::var("RAGLINE_REQUIRE_NATS").as_deref() != Ok("1"),
                "RAGLINE_NATS_SERVER is not set and RAGLINE_REQUIRE_NATS=1: run \
                     `export RAGLINE_NATS_SERVER=$(scripts/nats.sh bin)`"
            );
            eprintln!(
                "SKIPPED (nats): RAGLINE_NATS_SERVER is not set; run \
                     `export RAGLINE_NATS_SERVER=$(scripts/nats.sh bin)` to include the \
                     distributed tests"
            );
            None
        }
    }
}

/// The client port in the ports file nats-server writes into `dir` once it listens.
fn listening_port(dir: &Path) -> Option<u16> {
    listening(dir, "nats")
}

/// A port of `kind` (`nats`, `monitoring`) in the ports file nats-server writes into `dir`
/// once it listens.
fn listening(dir: &Path, kind: &str) -> Option<u16> {
    let file = fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .find(|e| e.path().extension().is_some_and(|x| x == "ports"))?;
    let ports: Value = serde_json::from_slice(&fs::read(file.path()).ok()?).ok()?;
    ports[kind][0].as_str()?.rsplit(':').next()?.parse().ok()
}

impl Nats {
    pub fn start() -> Option<Nats> {
        let bin = nats_bin()?;
        let mut n = Nats {
            bin,
            dir: tempfile::tempdir().unwrap(),
            // Chosen by the server itself at its first start (kept for restarts).
            port: 0,
            child: None,
        };
        n.launch();
        Some(n)
    }

    /// Start the server: on a port it picks itself the first time (`-p -1`: no other
    /// process can take the port between its choice and its use), read back from the ports
    /// file it writes once it listens; on the same port after that.
    fn launch(&mut self) {
        let ports = self.dir.path().join("ports");
        let _ = fs::remove_dir_all(&ports);
        fs::create_dir_all(&ports).unwrap();
        let port = if self.port == 0 {
            "-1".to_string()
        } else {
            self.port.to_string()
        };
        let mut cmd = Command::new(&self.bin);
        cmd.args(["-js", "-a", "127.0.0.1", "-p", &port, "--ports_file_dir"])
            .arg(&ports)
            .arg("-sd")
            .arg(self.dir.path().join("js"));
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        self.port = loop {
            if let Some(port) = listening_port(&ports) {
                break port;
            }
            assert!(Instant::now() < deadline, "nats-server wrote no ports file");
            std::thread::sleep(Duration::from_millis(20));
        };
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGKILL: a crash.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same storage and port.
    pub fn restart(&mut self) {
        self.kill9();
        self.launch();
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A role process (worker, embedder, indexer), killed when dropped.
pub struct RoleProcess {
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl RoleProcess {
    pub fn start(role: &str, queue: &str, extra: &[&str], logs: &Path, n: usize) -> RoleProcess {
        Self::start_with(role, queue, extra, logs, n, &[])
    }

    pub fn start_with(
        role: &str,
        queue: &str,
        extra: &[&str],
        logs: &Path,
        n: usize,
        env: &[(&str, &str)],
    ) -> RoleProcess {
        let log = logs.join(format!("{role}-{n}.log"));
        let f = fs::File::create(&log).unwrap();
        let child = ragline()
            .arg(role)
            .args(["--queue", queue, "--once"])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .expect("start a role");
        RoleProcess {
            name: format!("{role}-{n}"),
            child,
            log,
        }
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Wait for the process to leave by itself (after its run, with --once).
    pub fn wait(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > deadline {
                self.kill9();
                panic!(
                    "{} did not leave after its run; its log:\n{}",
                    self.name,
                    fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for RoleProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- {} log\n{}", self.name, self.log());
        }
    }
}

/// The index the distributed tests write: Postgres when there is a server, else SQLite.
fn test_index(dir: &Path, name: &str) -> TestIndex {
    match postgres_url() {
        Some(url) => postgres_index(&url, name),
        None => TestIndex::Sqlite(dir.join(format!("{name}.db"))),
    }
}

/// Start `workers` workers, one embedder and one indexer on `queue`, all CPU. The workers
/// and the indexer get the index's URI with its password (the run's settings never hold one).
fn roles(
    queue: &str,
    workers: usize,
    logs: &Path,
    model: &Path,
    index: &TestIndex,
) -> Vec<RoleProcess> {
    roles_with(queue, workers, logs, model, index, &[])
}

/// [`roles`], the indexer holding its second batch for 2 seconds (under the tests' 3-second
/// AckWait): the first batch in the index says the run is under way, and the run cannot end
/// while the second is held, on any machine, so a test acts part way through.
fn roles_held(
    queue: &str,
    workers: usize,
    logs: &Path,
    model: &Path,
    index: &TestIndex,
) -> Vec<RoleProcess> {
    roles_with(
        queue,
        workers,
        logs,
        model,
        index,
        &[("FAILPOINTS", "index::batch=1*off->1*sleep(2000)")],
    )
}

fn roles_with(
    queue: &str,
    workers: usize,
    logs: &Path,
    model: &Path,
    index: &TestIndex,
    indexer_env: &[(&str, &str)],
) -> Vec<RoleProcess> {
    let model = model.display().to_string();
    let uri = index.uri();
    let mut v = Vec::new();
    for i in 0..workers {
        v.push(RoleProcess::start(
            "worker",
            queue,
            &["--threads", "1", "--index", &uri],
            logs,
            i,
        ));
    }
    v.push(RoleProcess::start(
        "embedder",
        queue,
        &["--device", "cpu", "--model", &model],
        logs,
        0,
    ));
    v.push(RoleProcess::start_with(
        "indexer",
        queue,
        &["--index", &uri],
        logs,
        0,
        indexer_env,
    ));
    v
}

/// A distributed ingest of `corpus` into `uri`; returns the child to wait on.
fn distributed_ingest(corpus: &Path, uri: &str, queue: &str, report: &Path, model: &Path) -> Child {
    distributed_ingest_with(corpus, uri, queue, report, model, &[])
}

/// [`distributed_ingest`] with index writes of 32 items at most: a 60-document corpus is then
/// many batches, so an indexer holding its second one ([`roles_held`]) holds the run.
fn distributed_ingest_in_batches(
    corpus: &Path,
    uri: &str,
    queue: &str,
    report: &Path,
    model: &Path,
) -> Child {
    distributed_ingest_with(corpus, uri, queue, report, model, &["--batch-size", "32"])
}

fn distributed_ingest_with(
    corpus: &Path,
    uri: &str,
    queue: &str,
    report: &Path,
    model: &Path,
    extra: &[&str],
) -> Child {
    ragline()
        .args(["ingest", "--progress", "log", "--device", "cpu", "--model"])
        .arg(model)
        .args(extra)
        .args(["--index", uri, "--queue", queue, "--report"])
        .arg(report)
        .arg(corpus)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ingest")
}

fn finish(child: Child, report: &Path) -> (Option<i32>, Value) {
    let out = child.wait_with_output().unwrap();
    eprintln!(
        "--- distributed ingest: {:?}\n{}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r = fs::read(report)
        .ok()
        .filter(|b| !b.is_empty())
        .map_or(Value::Null, |b| serde_json::from_slice(&b).unwrap());
    (out.status.code(), r)
}

/// The first `n` react-docs pages (sorted), copied into `dir`.
pub fn react_slice(dir: &Path, n: usize) -> Option<PathBuf> {
    let src = shared_data("react-docs")?;
    let mut files: Vec<PathBuf> = walk(&src);
    files.sort();
    let out = dir.join("react");
    for f in files.into_iter().take(n) {
        let rel = f.strip_prefix(&src).unwrap();
        let to = out.join(rel);
        fs::create_dir_all(to.parent().unwrap()).unwrap();
        fs::copy(&f, &to).unwrap();
    }
    Some(out)
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            v.extend(walk(&p));
        } else {
            v.push(p);
        }
    }
    v
}

/// chunk id -> (document id, text, vector) as the index holds them.
pub fn index_map(index: &TestIndex) -> HashMap<String, (String, String, Vec<f32>)> {
    let chunks = index.chunks();
    let ids: Vec<&String> = chunks.iter().map(|c| &c.1).collect();
    let unique: HashSet<&String> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "a chunk is in the index twice");
    let vectors: HashMap<String, Vec<f32>> = index
        .vectors_with_ids()
        .into_iter()
        .map(|(_, id, _, v)| (id, v))
        .collect();
    chunks
        .into_iter()
        .map(|(doc, id, text)| {
            let v = vectors.get(&id).cloned().unwrap_or_default();
            (id, (doc, text, v))
        })
        .collect()
}

pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (na * nb).max(1e-12)
}

pub fn assert_same_index(got: &TestIndex, want: &TestIndex) {
    let (g, w) = (index_map(got), index_map(want));
    assert_eq!(
        g.keys().collect::<HashSet<_>>(),
        w.keys().collect::<HashSet<_>>(),
        "the distributed run's chunks differ from the in-process run's"
    );
    for (id, (doc, text, v)) in &w {
        let (gdoc, gtext, gv) = &g[id];
        assert_eq!((gdoc, gtext), (doc, text), "chunk {id}");
        assert_eq!(
            gv.len(),
            v.len(),
            "chunk {id}: vector missing or of another size"
        );
        let c = cosine(gv, v);
        assert!(
            c >= 0.9999,
            "chunk {id}: cosine {c} to the in-process vector"
        );
    }
    assert_eq!(got.counts(), want.counts());
}

fn counts(report: &Value) -> &Value {
    &report["counts"]
}

#[test]
fn react_docs_through_separate_processes_equal_an_in_process_run() {
    let Some(mut nats) = Nats::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let model = test_model(dir.path());
    let Some(corpus) = react_slice(dir.path(), usize::MAX) else {
        return;
    };
    let local = test_index(dir.path(), "local");
    let (code, want) = ingest_into(&corpus, &local.uri(), &dir.path().join("l.json"), &model);
    assert_eq!(code, Some(0));

    let spread = test_index(dir.path(), "spread");
    let url = nats.url();
    let mut procs = roles(&url, 3, dir.path(), &model, &spread);
    let report = dir.path().join("d.json");
    let ingest = distributed_ingest(&corpus, &spread.uri(), &url, &report, &model);
    let (code, got) = finish(ingest, &report);
    assert_eq!(code, Some(0), "{got}");
    for p in procs.iter_mut() {
        assert_eq!(p.wait(Duration::from_secs(30)), Some(0), "{}", p.log());
    }
    // The same counts as the in-process run, nothing redelivered.
    let mut c = counts(&got).clone();
    assert!(c["published"].as_u64().unwrap() > 200, "{c}");
    assert_eq!(c["redelivered"], 0);
    c["redelivered"] = counts(&want)["redelivered"].clone();
    assert_eq!(&c, counts(&want));
    assert_same_index(&spread, &local);
    nats.kill9();
}

/// Kill a worker and the embedder in the middle of a run; start another embedder.
#[test]
fn a_killed_worker_and_embedder_lose_nothing_and_double_nothing() {
    let Some(nats) = Nats::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = test_model(dir.path());
    let Some(corpus) = react_slice(dir.path(), 60) else {
        return;
    };
    let local = test_index(dir.path(), "klocal");
    let (code, want) = ingest_into(&corpus, &local.uri(), &dir.path().join("l.json"), &model);
    assert_eq!(code, Some(0));

    let spread = test_index(dir.path(), "kspread");
    // A short AckWait, so what the killed processes held comes back quickly.
    let url = format!("{}?ack_wait=3", nats.url());
    let mut procs = roles_held(&url, 2, dir.path(), &model, &spread);
    let report = dir.path().join("d.json");
    let mut ingest = distributed_ingest_in_batches(&corpus, &spread.uri(), &url, &report, &model);
    // Once chunks reach the index, the run is under way: kill a worker and the embedder.
    let deadline = Instant::now() + Duration::from_secs(120);
    while spread_chunks(&spread) == 0 {
        assert!(Instant::now() < deadline, "nothing reached the index");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        ingest.try_wait().unwrap().is_none(),
        "the run ended while the indexer held a batch: it wrote everything in one"
    );
    procs[0].kill9();
    procs[2].kill9();
    procs.push(RoleProcess::start(
        "embedder",
        &url,
        &["--device", "cpu", "--model", model.to_str().unwrap()],
        dir.path(),
        1,
    ));
    let (code, got) = finish(ingest, &report);
    assert_eq!(code, Some(0), "{got}");
    for (i, p) in procs.iter_mut().enumerate() {
        if i != 0 && i != 2 {
            assert_eq!(p.wait(Duration::from_secs(30)), Some(0), "{}", p.log());
        }
    }
    let c = counts(&got);
    assert!(
        c["redelivered"].as_u64().unwrap() > 0,
        "the killed embedder held chunks: they must have been redelivered: {c}"
    );
    let mut c = c.clone();
    c["redelivered"] = counts(&want)["redelivered"].clone();
    assert_eq!(&c, counts(&want));
    assert_same_index(&spread, &local);
}

fn spread_chunks(index: &TestIndex) -> u64 {
    match index {
        TestIndex::Sqlite(p) if !p.exists() => 0,
        _ => std::panic::catch_unwind(|| index.counts().1).unwrap_or(0),
    }
}

/// Kill nats-server in the middle of a run and start it again on the same storage.
#[test]
fn a_broker_crash_in_the_middle_of_a_run_loses_nothing() {
    let Some(mut nats) = Nats::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let model = test_model(dir.path());
    let Some(corpus) = react_slice(dir.path(), 60) else {
        return;
    };
    let local = test_index(dir.path(), "blocal");
    let (code, want) = ingest_into(&corpus, &local.uri(), &dir.path().join("l.json"), &model);
    assert_eq!(code, Some(0));

    let spread = test_index(dir.path(), "bspread");
    let url = format!("{}?ack_wait=3", nats.url());
    let mut procs = roles_held(&url, 2, dir.path(), &model, &spread);
    let report = dir.path().join("d.json");
    let mut ingest = distributed_ingest_in_batches(&corpus, &spread.uri(), &url, &report, &model);
    let deadline = Instant::now() + Duration::from_secs(120);
    while spread_chunks(&spread) == 0 {
        assert!(Instant::now() < deadline, "nothing reached the index");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        ingest.try_wait().unwrap().is_none(),
        "the run ended while the indexer held a batch: it wrote everything in one"
    );
    nats.kill9();
    std::thread::sleep(Duration::from_secs(2));
    nats.restart();
    let (code, got) = finish(ingest, &report);
    assert_eq!(code, Some(0), "{got}");
    for p in procs.iter_mut() {
        assert_eq!(p.wait(Duration::from_secs(60)), Some(0), "{}", p.log());
    }
    let mut c = counts(&got).clone();
    c["redelivered"] = counts(&want)["redelivered"].clone();
    assert_eq!(&c, counts(&want));
    assert_same_index(&spread, &local);
}

/// A role given another model than the run's refuses the run and says what to do.
#[test]
fn an_embedder_with_another_model_refuses_the_run() {
    let Some(nats) = Nats::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c");
    fs::create_dir_all(&c).unwrap();
    fs::write(c.join("a.md"), "# A\n\nSome text about effects.\n").unwrap();
    let model = test_model(dir.path());
    let other = random_model(dir.path(), 64, 3);
    let index = TestIndex::Sqlite(dir.path().join("r.db"));
    let url = nats.url();
    let report = dir.path().join("d.json");
    let mut ingest = distributed_ingest(&c, &index.uri(), &url, &report, &model);
    let mut embedder = RoleProcess::start(
        "embedder",
        &url,
        &["--device", "cpu", "--model", other.to_str().unwrap()],
        dir.path(),
        0,
    );
    let code = embedder.wait(Duration::from_secs(60));
    assert_eq!(code, Some(2), "{}", embedder.log());
    let log = embedder.log();
    assert!(
        log.contains("fingerprint") && log.contains("--model"),
        "the refusal says why and what to do: {log}"
    );
    let _ = ingest.kill();
    let _ = ingest.wait();
}

/// Streams so small that every lane is full most of the time (20 messages, 1 MiB): the
/// connector waits on the workers, which wait on the indexer, which waits for the publisher to
/// take its events. The publisher's acknowledgements of events must not wait behind its own
/// publishes of work (which wait for room only those acknowledgements make): the run
/// completes, every document indexed once.
#[test]
fn full_streams_slow_the_connector_and_never_close_a_circle() {
    let Some(nats) = Nats::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c");
    fs::create_dir_all(&c).unwrap();
    let n = 400;
    for i in 0..n {
        let body = format!("# Doc {i}\n\nParagraph one of {i}.\n\nParagraph two of {i}.\n");
        fs::write(c.join(format!("d{i:03}.md")), body).unwrap();
    }
    let model = test_model(dir.path());
    let index = TestIndex::Sqlite(dir.path().join("full.db"));
    let url = format!("{}?limit=20&limit_mb=1", nats.url());
    let mut procs = roles(&url, 2, dir.path(), &model, &index);
    let report = dir.path().join("d.json");
    let mut ingest = distributed_ingest(&c, &index.uri(), &url, &report, &model);
    let deadline = Instant::now() + Duration::from_secs(180);
    while ingest.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = ingest.kill();
            for p in procs.iter_mut() {
                p.kill9();
            }
            panic!("the run is stuck with full streams");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, got) = finish(ingest, &report);
    assert_eq!(code, Some(0), "{got}");
    assert_eq!(counts(&got)["published"], n);
    assert_eq!(counts(&got)["indexed"], n);
    for p in procs.iter_mut() {
        assert_eq!(p.wait(Duration::from_secs(30)), Some(0), "{}", p.log());
    }
    assert_eq!(index.counts().0, n);
}

/// A document larger than the broker's largest message (1 MiB by default) cannot be queued:
/// it fails at once with the fix in its reason, instead of being sent again forever, and the
/// run completes with the others indexed.
#[test]
fn a_document_over_the_brokers_largest_message_fails_with_the_fix() {
    let Some(nats) = Nats::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c");
    fs::create_dir_all(&c).unwrap();
    fs::write(c.join("a.md"), "# A\n\nSome text about effects.\n").unwrap();
    fs::write(c.join("b.md"), "# B\n\nSome text about state.\n").unwrap();
    let big = format!("# Big\n\n{}\n", "many words ".repeat(200_000));
    fs::write(c.join("big.md"), big).unwrap();
    let model = test_model(dir.path());
    let index = TestIndex::Sqlite(dir.path().join("big.db"));
    let url = nats.url();
    let mut procs = roles(&url, 1, dir.path(), &model, &index);
    let report = dir.path().join("d.json");
    let ingest = distributed_ingest(&c, &index.uri(), &url, &report, &model);
    let (code, got) = finish(ingest, &report);
    assert_eq!(code, Some(1), "a document failed: {got}");
    let counts = counts(&got);
    assert_eq!(counts["published"], 3, "{got}");
    assert_eq!(counts["failed"], 1, "{got}");
    assert_eq!(counts["indexed"], 2, "{got}");
    let failures = got["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0]["id"], "big.md");
    let reason = failures[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("max_payload"),
        "the reason says what to do: {reason}"
    );
    for p in procs.iter_mut() {
        assert_eq!(p.wait(Duration::from_secs(30)), Some(0), "{}", p.log());
    }
    assert_eq!(index.counts().0, 2);
}

/// Workers that lose three documents every time (as if they died on them): after MaxDeliver
/// the run counts them failed, says why, and completes; the others are indexed. The three are
/// in the index's dead-letter queue with their error; a requeue on the broker (with workers
/// that no longer lose them) and one in a process of its own put them in the index.
#[cfg(feature = "failpoints")]
#[test]
fn documents_that_kill_their_worker_every_time_fail_after_max_deliver() {
    let Some(nats) = Nats::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c");
    fs::create_dir_all(&c).unwrap();
    for i in 0..6 {
        fs::write(
            c.join(format!("good-{i}.md")),
            format!("# Good {i}\n\nFine text.\n"),
        )
        .unwrap();
    }
    for i in 0..3 {
        fs::write(
            c.join(format!("bad-{i}.md")),
            format!("# Bad {i}\n\nPoison.\n"),
        )
        .unwrap();
    }
    let index = test_index(dir.path(), "maxdeliver");
    let uri = index.uri();
    let url = format!("{}?ack_wait=1&max_deliver=3&max_hold=1", nats.url());
    let mut worker = ragline()
        .args([
            "worker",
            "--queue",
            &url,
            "--once",
            "--threads",
            "2",
            "--index",
            &uri,
        ])
        .env("FAILPOINTS", "worker::lose=return(bad)")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let logs = dir.path();
    let model = test_model(dir.path());
    let mut others = [
        RoleProcess::start(
            "embedder",
            &url,
            &["--device", "cpu", "--model", model.to_str().unwrap()],
            logs,
            0,
        ),
        RoleProcess::start("indexer", &url, &["--index", &uri], logs, 0),
    ];
    let report = dir.path().join("d.json");
    let ingest = distributed_ingest(&c, &index.uri(), &url, &report, &model);
    let (code, got) = finish(ingest, &report);
    let _ = worker.kill();
    let _ = worker.wait();
    assert_eq!(code, Some(1), "some documents failed: {got}");
    let counts = counts(&got);
    assert_eq!(counts["published"], 9);
    assert_eq!(counts["indexed"], 6);
    assert_eq!(counts["failed"], 3);
    let failures = got["failures"].as_array().unwrap();
    let mut failed: Vec<&str> = failures.iter().map(|f| f["id"].as_str().unwrap()).collect();
    failed.sort();
    assert_eq!(failed, ["bad-0.md", "bad-1.md", "bad-2.md"]);
    for f in failures {
        let reason = f["reason"].as_str().unwrap();
        assert!(
            reason.contains("MaxDeliver") && reason.contains("worker"),
            "{reason}"
        );
        assert_eq!(f["stage"], "work");
    }
    for p in others.iter_mut() {
        assert_eq!(p.wait(Duration::from_secs(30)), Some(0), "{}", p.log());
    }
    assert_eq!(index.counts().0, 6);

    // In the index's dead-letter queue, dead in `chunk` after 3 deliveries, with the reason.
    let dlq = |uri: &str| -> Vec<Value> {
        let o = run(ragline().args(["dlq", "list", "--json", "--index", uri]));
        assert!(o.status.success());
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        v.as_array().unwrap().clone()
    };
    let dead = dlq(&uri);
    let mut ids: Vec<&str> = dead
        .iter()
        .map(|d| d["document_id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["bad-0.md", "bad-1.md", "bad-2.md"]);
    for d in &dead {
        assert_eq!(d["stage"], "chunk", "{d}");
        assert_eq!(d["attempts"], 3, "{d}");
        let error = d["last_error"].as_str().unwrap();
        assert!(
            error.contains("MaxDeliver") && error.contains("worker"),
            "{error}"
        );
    }
    let o = run(ragline().args(["dlq", "show", "bad-0.md", "--index", &uri]));
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && shown.contains("chunk: dead"),
        "{shown}"
    );

    // Requeued on the broker, to workers that do not lose it: indexed, out of the queue.
    let mut again = [
        RoleProcess::start("worker", &url, &["--index", &uri], logs, 1),
        RoleProcess::start(
            "embedder",
            &url,
            &["--device", "cpu", "--model", model.to_str().unwrap()],
            logs,
            1,
        ),
        RoleProcess::start("indexer", &url, &["--index", &uri], logs, 1),
    ];
    let o = run(ragline().args([
        "dlq", "requeue", "bad-0.md", "--index", &uri, "--queue", &url,
    ]));
    let said = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{said}");
    assert!(said.contains("1 now in the index, 0 dead again"), "{said}");
    for p in again.iter_mut() {
        assert_eq!(p.wait(Duration::from_secs(30)), Some(0), "{}", p.log());
    }
    assert_eq!(index.counts().0, 7);
    // The others in this process.
    let o = run(ragline().args(["dlq", "requeue", "--all", "--index", &uri]));
    let said = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{said}");
    assert!(said.contains("2 now in the index, 0 dead again"), "{said}");
    assert_eq!(index.counts().0, 9);
    assert!(dlq(&uri).is_empty());
    let o = run(ragline().args(["status", "--json", "--index", &uri]));
    let status: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(status["stages"]["chunk"]["done"], 9, "{status}");
    assert_eq!(status["stages"]["chunk"]["dead"], 0, "{status}");
}

/// Three nats-servers in one cluster, each with its own storage. Each picks its client and
/// monitoring ports itself (read back from its ports file); the route ports are chosen before
/// (a JetStream cluster node refuses to start without its routes configured).
struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    ports: Vec<u16>,
    routes: Vec<u16>,
    monitors: Vec<u16>,
    children: Vec<Option<Child>>,
}

impl Cluster {
    fn start() -> Option<Cluster> {
        let bin = nats_bin()?;
        let mut c = Cluster {
            bin,
            dir: tempfile::tempdir().unwrap(),
            ports: vec![0; 3],
            routes: (0..3).map(|_| free_port()).collect(),
            monitors: vec![0; 3],
            children: vec![None, None, None],
        };
        for i in 0..3 {
            c.launch(i);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for i in 0..3 {
            let dir = c.dir.path().join(format!("ports{i}"));
            loop {
                if let (Some(p), Some(m)) = (listening_port(&dir), listening(&dir, "monitoring")) {
                    (c.ports[i], c.monitors[i]) = (p, m);
                    break;
                }
                assert!(Instant::now() < deadline, "node {i} did not start");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Ready when every node sees a meta leader of all three: streams with three replicas
        // cannot be placed before ("no suitable peers for placement").
        let deadline = Instant::now() + Duration::from_secs(60);
        let formed = |port: u16| {
            http_get(port, "/jsz")
                .and_then(|b| serde_json::from_str::<Value>(&b).ok())
                .is_some_and(|v| {
                    v["meta_cluster"]["leader"]
                        .as_str()
                        .is_some_and(|l| !l.is_empty())
                        && v["meta_cluster"]["cluster_size"] == 3
                })
        };
        for i in 0..3 {
            while !formed(c.monitors[i]) {
                assert!(Instant::now() < deadline, "the cluster did not form");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Some(c)
    }

    fn launch(&mut self, i: usize) {
        let routes: Vec<String> = (0..3)
            .filter(|&j| j != i)
            .map(|j| format!("nats-route://127.0.0.1:{}", self.routes[j]))
            .collect();
        let store = self.dir.path().join(format!("n{i}"));
        let ports = self.dir.path().join(format!("ports{i}"));
        fs::create_dir_all(&ports).unwrap();
        let child = Command::new(&self.bin)
            .args(["-js", "-a", "127.0.0.1", "-p", "-1", "-m", "-1"])
            .args(["-n", &format!("n{i}"), "--ports_file_dir"])
            .arg(&ports)
            .args(["--cluster_name", "t", "--cluster"])
            .arg(format!("nats://127.0.0.1:{}", self.routes[i]))
            .arg("--routes")
            .arg(routes.join(","))
            .arg("-sd")
            .arg(store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        self.children[i] = Some(child);
    }

    fn url(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The node leading `stream`, by the monitoring endpoint.
    fn leader_of(&self, stream: &str) -> Option<usize> {
        for i in 0..3 {
            if self.children[i].is_none() {
                continue;
            }
            let Some(body) = http_get(self.monitors[i], "/jsz?streams=true") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(&body) else {
                continue;
            };
            for account in v["account_details"].as_array().into_iter().flatten() {
                for s in account["stream_detail"].as_array().into_iter().flatten() {
                    if s["name"] == stream {
                        if let Some(leader) = s["cluster"]["leader"].as_str() {
                            return leader.strip_prefix('n').and_then(|n| n.parse().ok());
                        }
                    }
                }
            }
        }
        None
    }

    fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..3 {
            self.kill9(i);
        }
    }
}

/// A plain HTTP GET on 127.0.0.1 (the monitoring endpoint), the body.
fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// With three replicas of every stream, killing the leader of the work stream in the middle of
/// a run: the run completes on the other two, nothing restarted, nothing lost or doubled.
#[test]
fn killing_the_stream_leader_of_a_three_node_cluster_loses_nothing() {
    let Some(mut cluster) = Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let model = test_model(dir.path());
    let Some(corpus) = react_slice(dir.path(), 60) else {
        return;
    };
    let local = test_index(dir.path(), "clocal");
    let (code, want) = ingest_into(&corpus, &local.uri(), &dir.path().join("l.json"), &model);
    assert_eq!(code, Some(0));

    let spread = test_index(dir.path(), "cspread");
    let url = format!("{}?replicas=3&ack_wait=3", cluster.url());
    let mut procs = roles_held(&url, 2, dir.path(), &model, &spread);
    let report = dir.path().join("d.json");
    let mut ingest = distributed_ingest_in_batches(&corpus, &spread.uri(), &url, &report, &model);
    let deadline = Instant::now() + Duration::from_secs(120);
    while spread_chunks(&spread) == 0 {
        assert!(Instant::now() < deadline, "nothing reached the index");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        ingest.try_wait().unwrap().is_none(),
        "the run ended while the indexer held a batch: it wrote everything in one"
    );
    let leader = cluster
        .leader_of("RAGLINE_EMBED")
        .expect("the embed stream has a leader");
    eprintln!("killing n{leader}, the leader of RAGLINE_EMBED");
    cluster.kill9(leader);
    let (code, got) = finish(ingest, &report);
    assert_eq!(code, Some(0), "{got}");
    for p in procs.iter_mut() {
        assert_eq!(p.wait(Duration::from_secs(60)), Some(0), "{}", p.log());
    }
    let mut c = counts(&got).clone();
    c["redelivered"] = counts(&want)["redelivered"].clone();
    assert_eq!(&c, counts(&want));
    assert_same_index(&spread, &local);
}

/// The lifecycle's work on the broker (`enrich --queue`'s queues): a subject per priority
/// level, taken highest first whatever the order of publishing, FIFO within a level; a
/// negative acknowledgement with a delay brings the work back after it as its next delivery;
/// a terminated one never comes back.
#[test]
fn lifecycle_work_on_the_broker_is_taken_highest_priority_first() {
    use ragline::lifecycle::{Priority, WorkItem, WorkKey};
    use ragline::queue::jetstream::lifecycle::{LifecycleQueue, StageQueue, Verdict};
    use ragline::queue::jetstream::{Broker, BrokerConfig};

    let Some(nats) = Nats::start() else { return };
    let config = BrokerConfig::parse(&format!("{}?prefix=prio", nats.url())).unwrap();
    let broker = Broker::connect(config, Duration::from_secs(10)).unwrap();
    let queue = LifecycleQueue::open(
        &broker,
        vec![StageQueue {
            stage: "noop".into(),
            ack_wait: Duration::from_secs(30),
            max_deliver: 3,
        }],
    )
    .unwrap();
    let item = |n: i64, priority: Priority| WorkItem {
        key: WorkKey {
            document_id: format!("doc{n:03}"),
            stage: "noop".into(),
            vector_set: 0,
        },
        attempts: 1,
        priority,
        input_version: "v".into(),
        claim_seq: n,
        cost: 1,
    };
    // Backfill first, then fresh, then interactive: the reverse of how they must come out.
    let mut n = 0;
    for level in [Priority::Backfill, Priority::Fresh, Priority::Interactive] {
        let items: Vec<WorkItem> = (0..7)
            .map(|_| {
                n += 1;
                item(n, level)
            })
            .collect();
        queue.publish(&items).unwrap();
    }
    // Published twice (a feeder retrying a publish whose acknowledgement it lost): stored once.
    queue.publish(&[item(1, Priority::Backfill)]).unwrap();
    assert_eq!(queue.depth().unwrap(), (21, 0));
    let mut order: Vec<(Priority, i64)> = Vec::new();
    // Until all 21 came (an empty no-wait fetch on a loaded machine is not the end).
    let start = Instant::now();
    while order.len() < 21 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "only {} of 21 came: {order:?}",
            order.len()
        );
        let batch = queue.fetch(|_| 4).unwrap();
        if batch.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        assert!(batch.len() <= 4);
        for d in &batch {
            assert_eq!(d.item.attempts, 1);
            order.push((d.item.priority, d.item.claim_seq));
        }
        let answers: Vec<_> = batch.iter().map(|d| (d, Verdict::Ack)).collect();
        queue.settle(&answers);
    }
    let levels: Vec<Priority> = order.iter().map(|o| o.0).collect();
    assert_eq!(order.len(), 21, "{order:?}");
    assert!(
        queue.fetch(|_| 4).unwrap().is_empty(),
        "more than 21 delivered"
    );
    assert!(
        levels.windows(2).all(|w| w[0] >= w[1]),
        "highest level first: {levels:?}"
    );
    for level in [Priority::Backfill, Priority::Fresh, Priority::Interactive] {
        let seqs: Vec<i64> = order.iter().filter(|o| o.0 == level).map(|o| o.1).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "FIFO: {seqs:?}");
    }
    assert_eq!(queue.depth().unwrap(), (0, 0));

    // A retry after a delay, as the second delivery; then terminated for good. Each step
    // waits for the state it expects (a no-wait fetch right after a publish may find nothing
    // yet on a loaded machine); only lower bounds on time are asserted, which load cannot
    // break.
    let fetch_one = |what: &str| {
        let start = Instant::now();
        loop {
            let b = queue.fetch(|_| 4).unwrap();
            if !b.is_empty() {
                assert_eq!(b.len(), 1, "{what}: {} deliveries", b.len());
                break b;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{what}: never came"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    queue.publish(&[item(100, Priority::Fresh)]).unwrap();
    let first = fetch_one("the published item");
    assert_eq!(first[0].item.attempts, 1);
    let delay = Duration::from_millis(700);
    let retried = Instant::now();
    queue.settle(&[(&first[0], Verdict::Retry(delay))]);
    let again = fetch_one("the retry");
    assert!(
        retried.elapsed() >= delay,
        "back after {:?}, before its delay of {delay:?}",
        retried.elapsed()
    );
    assert_eq!(again[0].item.key.document_id, "doc100");
    assert_eq!(again[0].item.attempts, 2);
    assert!(!again[0].is_last());
    queue.settle(&[(&again[0], Verdict::Term)]);
    // Terminated work leaves the stream; once it has, nothing is delivered.
    let start = Instant::now();
    while queue.stored().unwrap() != 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "answered work leaves the stream"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(queue.fetch(|_| 4).unwrap().is_empty());
    assert_eq!(queue.depth().unwrap(), (0, 0));
}

/// The runs a broker holds, through ragline's own client.
fn broker_runs(url: &str) -> Vec<ragline::queue::jetstream::RunRecord> {
    use ragline::queue::jetstream::{Broker, BrokerConfig};
    let broker = Broker::connect(BrokerConfig::parse(url).unwrap(), Duration::from_secs(10))
        .expect("connect to the test broker");
    broker.list_runs().unwrap()
}

/// Publish raw bytes to `subject` (stored by JetStream), as anyone who can publish could.
fn publish_raw(url: &str, subject: &str, payload: &'static [u8]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = async_nats::connect(url).await.unwrap();
        let js = async_nats::jetstream::new(client);
        js.publish(subject.to_string(), payload.into())
            .await
            .unwrap()
            .await
            .unwrap();
    });
}

/// Messages no process can read, published into a live run (the 6-byte envelope that asks
/// for 137 GB, MessagePack that is no document, garbage on the events lane): every process
/// lives, the run completes with every document indexed, and each message is dead-lettered
/// with the reason in the run's report (which then exits 1).
#[test]
fn unreadable_messages_in_a_live_run_are_dead_lettered_and_kill_nothing() {
    let Some(nats) = Nats::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = test_model(dir.path());
    let Some(corpus) = react_slice(dir.path(), 10) else {
        return;
    };
    let index = test_index(dir.path(), "unreadable");
    let url = nats.url();
    let report = dir.path().join("d.json");
    let ingest = distributed_ingest(&corpus, &index.uri(), &url, &report, &model);
    // The run is published and waits for its roles: put the messages in before they start.
    let deadline = Instant::now() + Duration::from_secs(60);
    let run = loop {
        if let Some(r) = broker_runs(&url).into_iter().next() {
            break r.run;
        }
        assert!(Instant::now() < deadline, "the run never appeared");
        std::thread::sleep(Duration::from_millis(100));
    };
    publish_raw(
        &url,
        &format!("ragline.work.{run}"),
        &[0xC1, 0x00, 0xFF, 0xFF, 0xFF, 0xFF],
    );
    publish_raw(&url, &format!("ragline.work.{run}"), b"\x92\x01\x02");
    publish_raw(&url, &format!("ragline.events.{run}"), b"garbage");
    let mut procs = roles(&url, 1, dir.path(), &model, &index);
    let (code, got) = finish(ingest, &report);
    for p in procs.iter_mut() {
        assert_eq!(p.wait(Duration::from_secs(60)), Some(0), "{}", p.log());
    }
    assert_eq!(
        code,
        Some(1),
        "unreadable messages make the run exit 1: {got}"
    );
    let c = counts(&got);
    assert_eq!(c["unreadable"], 3, "{got}");
    assert!(c["published"].as_u64().unwrap() >= 9, "{got}");
    assert_eq!(
        c["indexed"], c["published"],
        "every document got through: {got}"
    );
    assert_eq!(c["failed"], 0, "{got}");
    let dead = got["unreadable"].as_array().unwrap();
    assert_eq!(dead.len(), 3);
    assert!(dead
        .iter()
        .all(|d| d["reason"].as_str().unwrap().contains("unreadable message")));
    assert!(
        dead.iter()
            .any(|d| d["reason"].as_str().unwrap().contains("room for at most 0")),
        "{dead:?}"
    );
}

/// A run record on the broker that names places the roles were not given (a service URL
/// with the key variable AWS_SECRET_ACCESS_KEY, another index): no request reaches them, and
/// each role refuses the run with the difference.
#[test]
fn a_hostile_run_record_steers_no_role() {
    use ragline::queue::jetstream::{Broker, BrokerConfig, RunRecord, RunState, WIRE_VERSION};
    let Some(nats) = Nats::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = test_model(dir.path());
    // Two listeners that count whoever connects.
    let listen = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let h = std::sync::Arc::clone(&hits);
        std::thread::spawn(move || loop {
            if l.accept().is_ok() {
                h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_millis(5));
        });
        (port, hits)
    };
    let (service, service_hits) = listen();
    let (db, db_hits) = listen();
    let url = nats.url();
    let broker =
        Broker::connect(BrokerConfig::parse(&url).unwrap(), Duration::from_secs(10)).unwrap();
    let config = format!(
        "[model]\nname = \"{}\"\n\n[index]\nuri = \"postgres://u@127.0.0.1:{db}/db\"\n\n\
         [stages.embed.remote]\nurl = \"http://127.0.0.1:{service}\"\napi = \"tei\"\n\
         api_key_env = \"AWS_SECRET_ACCESS_KEY\"\n",
        model.display()
    );
    broker
        .put_run(&RunRecord {
            run: "00000000000000ab".into(),
            wire: WIRE_VERSION,
            version: env!("CARGO_PKG_VERSION").into(),
            state: RunState::Running,
            config,
            model_fingerprint: Some("f".into()),
            dimension: Some(64),
            embeds: true,
            started: 1,
        })
        .unwrap();
    let own = format!("sqlite://{}", dir.path().join("own.db").display());
    for (role, extra) in [
        ("worker", vec!["--index", own.as_str()]),
        ("indexer", vec!["--index", own.as_str()]),
        (
            "embedder",
            vec!["--device", "cpu", "--model", model.to_str().unwrap()],
        ),
    ] {
        let o = run(ragline()
            .arg(role)
            .args(["--queue", &url, "--once"])
            .args(&extra)
            .env("AWS_SECRET_ACCESS_KEY", "s3cr3t-value"));
        assert_eq!(o.status.code(), Some(2), "{role} refused the run");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("refusing settings that name places"),
            "{role}: {err}"
        );
        assert!(
            err.contains(&format!(
                "stages.embed.remote.url: the run names `http://127.0.0.1:{service}`"
            )),
            "{role}: {err}"
        );
        assert!(err.contains("AWS_SECRET_ACCESS_KEY"), "{role}: {err}");
        if role != "embedder" {
            assert!(
                err.contains(&format!(
                    "index.uri: the run names `postgres://u@127.0.0.1:{db}/db`"
                )),
                "{role}: {err}"
            );
        }
        assert!(!err.contains("s3cr3t-value"), "{err}");
    }
    std::thread::sleep(Duration::from_millis(200));
    let hits = |h: &std::sync::atomic::AtomicUsize| h.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(hits(&service_hits), 0, "a request reached the service");
    assert_eq!(hits(&db_hits), 0, "a connection reached the database");
}

/// The test certificates (scripts/certs.sh, openssl) in `dir`.
fn certs(dir: &Path) -> PathBuf {
    let out = dir.join("certs");
    let o = run(Command::new(crate::util::root().join("scripts/certs.sh")).arg(&out));
    assert!(o.status.success(), "scripts/certs.sh failed");
    out
}

/// A nats-server started by `scripts/nats.sh start ARGS` on a port and folder of its own
/// (`RAGLINE_NATS_SERVER`'s binary), stopped when dropped.
struct ScriptNats {
    dir: tempfile::TempDir,
    port: u16,
    url: String,
}

impl ScriptNats {
    fn start(args: &[&str]) -> ScriptNats {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let o = run(Command::new(crate::util::root().join("scripts/nats.sh"))
            .arg("start")
            .args(args)
            .env("RAGLINE_NATS_DIR", dir.path())
            .env("RAGLINE_NATS_PORT", port.to_string()));
        assert!(o.status.success(), "scripts/nats.sh start {args:?}");
        let url = String::from_utf8_lossy(&o.stdout)
            .lines()
            .last()
            .unwrap()
            .to_string();
        ScriptNats { dir, port, url }
    }

    /// The folder of its test certificates (`--tls`, `--tls-verify`).
    fn certs(&self) -> PathBuf {
        self.dir.path().join("tls")
    }
}

impl Drop for ScriptNats {
    fn drop(&mut self) {
        let _ = Command::new(crate::util::root().join("scripts/nats.sh"))
            .args(["stop", "--kill"])
            .env("RAGLINE_NATS_DIR", self.dir.path())
            .env("RAGLINE_NATS_PORT", self.port.to_string())
            .status();
    }
}

/// A broker with a user and password, with a token, and with TLS that checks the clients'
/// certificates too, each started by `scripts/nats.sh`: a distributed run works against each
/// and equals an in-process run; no password or token shows in anything the processes print
/// or write; a wrong password, a wrong token and a CA that did not sign the server's
/// certificate fail at start with a clear error.
#[test]
fn distributed_runs_work_on_secured_brokers_and_never_show_their_secrets() {
    let Some(_) = nats_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = test_model(dir.path());
    let Some(corpus) = react_slice(dir.path(), 12) else {
        return;
    };
    let local = test_index(dir.path(), "slocal");
    let (code, want) = ingest_into(&corpus, &local.uri(), &dir.path().join("l.json"), &model);
    assert_eq!(code, Some(0));
    for (name, args, secret) in [
        ("user", vec!["--user", "ragline:pa55word"], "pa55word"),
        ("token", vec!["--token", "t0ken-s3cret"], "t0ken-s3cret"),
        ("tls", vec!["--tls-verify"], "PRIVATE KEY"),
    ] {
        let nats = ScriptNats::start(&args);
        let url = nats.url.clone();
        if name == "tls" {
            assert!(
                url.starts_with("tls://") && url.contains("tls_cert="),
                "{url}"
            );
        } else {
            assert!(
                url.contains(secret),
                "the script's URL carries the credentials"
            );
        }
        let logs = dir.path().join(name);
        fs::create_dir_all(&logs).unwrap();
        let spread = test_index(&logs, &format!("s{name}"));
        let mut procs = roles(&url, 1, &logs, &model, &spread);
        let report = logs.join("d.json");
        let ingest = distributed_ingest(&corpus, &spread.uri(), &url, &report, &model);
        let out = ingest.wait_with_output().unwrap();
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("--- {name}: {printed}");
        assert_eq!(out.status.code(), Some(0), "{name}: {printed}");
        let got: Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
        for p in procs.iter_mut() {
            assert_eq!(p.wait(Duration::from_secs(60)), Some(0), "{}", p.log());
            assert!(
                !p.log().contains(secret),
                "{name}: a role printed the secret"
            );
        }
        assert!(
            !printed.contains(secret),
            "{name}: the ingest printed the secret"
        );
        assert!(
            !got.to_string().contains(secret),
            "{name}: the report holds it"
        );
        for r in broker_runs(&url) {
            assert!(
                !r.config.contains(secret),
                "{name}: the run record holds it"
            );
        }
        let mut c = counts(&got).clone();
        c["redelivered"] = counts(&want)["redelivered"].clone();
        assert_eq!(&c, counts(&want), "{name}");
        assert_same_index(&spread, &local);

        // The wrong secret, or a CA that did not sign the server's certificate: refused at
        // start, said plainly.
        let (bad, says) = match name {
            "user" => (
                format!("nats://ragline:wrong@127.0.0.1:{}", nats.port),
                "refused this process's credentials",
            ),
            "token" => (
                format!("nats://wrong@127.0.0.1:{}", nats.port),
                "refused this process's credentials",
            ),
            _ => {
                let other = certs(&logs);
                let mine = nats.certs();
                (
                    format!(
                        "tls://127.0.0.1:{}?tls_ca={}&tls_cert={}&tls_key={}",
                        nats.port,
                        other.join("ca.crt").display(),
                        mine.join("client.crt").display(),
                        mine.join("client.key").display()
                    ),
                    "TLS with the NATS server",
                )
            }
        };
        let o = run(ragline().args(["worker", "--queue", &bad, "--once"]));
        assert_eq!(o.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{name}: {err}");
        assert!(!err.contains("wrong@"), "{name}: {err}");
    }
}
