//! `ragline serve` and the stages that call services: parity of the server's vectors with
//! `ragline embed` (and through the official `openai` Python client), its refusals and
//! overload answers, a graceful stop; ingest and enrich with the remote embedder pointed at
//! the server, directly and through `scripts/fault-proxy.py` (429s with Retry-After, 500s,
//! resets, malformed JSON, a poisoned input, an outage).
//!
//! The real model where the acceptance is about vectors (parity); elsewhere a random-weight
//! BERT with the default model's tokenizer (the chunks are the real ones), fast enough in a
//! test build for react-docs several times over.

use std::collections::HashSet;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::backend::TestIndex;
use crate::distributed::{assert_same_index, cosine, react_slice};
use crate::util::{data_python, model_dir, ragline, random_model, read_jsonl, root, run};

/// A `ragline serve` of the test's own, on a free port.
pub struct Server {
    child: Child,
    pub url: String,
    log: PathBuf,
}

impl Server {
    pub fn start(model: &Path, extra: &[&str], logs: &Path, name: &str) -> Server {
        Server::start_with_env(model, extra, &[], logs, name)
    }

    pub fn start_with_env(
        model: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
        logs: &Path,
        name: &str,
    ) -> Server {
        let mut args = vec!["--model", model.to_str().unwrap()];
        args.extend_from_slice(extra);
        Server::start_args(&args, env, logs, name)
    }

    /// `ragline serve --port 0 --device cpu ARGS...` (no model unless ARGS name one).
    pub fn start_args(args: &[&str], env: &[(&str, &str)], logs: &Path, name: &str) -> Server {
        let log = logs.join(format!("{name}.log"));
        let mut child = ragline()
            .args(["serve", "--port", "0", "--device", "cpu"])
            .args(args)
            // A backtrace of a panic the test provokes would load the test build's debug
            // information (hundreds of MB) and swamp the memory measured.
            .env("RUST_BACKTRACE", "0")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("start ragline serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "serve did not say where it listens: {line:?}\n{}",
                    fs::read_to_string(&log).unwrap_or_default()
                )
            })
            .to_string();
        Server { child, url, log }
    }

    /// SIGTERM, then the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The server's peak resident memory so far, in MiB (VmHWM).
    #[cfg(feature = "failpoints")]
    pub fn peak_rss_mb(&self) -> u64 {
        fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb / 1024)
    }

    /// Is the process still running?
    #[cfg(feature = "failpoints")]
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// What /metrics says of one series (the sum of its lines).
    pub fn metric(&self, name: &str) -> f64 {
        let text = get(&format!("{}/metrics", self.url)).1;
        text.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- serve log\n{}", self.log());
        }
    }
}

/// `scripts/fault-proxy.py` in front of `upstream`.
pub struct Proxy {
    child: Child,
    pub url: String,
}

impl Proxy {
    pub fn start(upstream: &str, args: &[&str]) -> Proxy {
        let mut child = Command::new("python3")
            .arg(root().join("scripts/fault-proxy.py"))
            .args(["--upstream", upstream])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start scripts/fault-proxy.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .expect("proxy address");
        Proxy {
            child,
            url: format!("http://{addr}"),
        }
    }

    /// Change the proxy's settings at run time.
    pub fn set(&self, change: Value) {
        let (status, _) = post(&format!("{}/_proxy/config", self.url), &change);
        assert_eq!(status, 200);
    }

    /// How many requests ended each way (`429`, `500`, `reset`, `malformed`, `passed`...).
    pub fn counts(&self) -> Value {
        let (_, body) = get(&format!("{}/_proxy/stats", self.url));
        serde_json::from_str::<Value>(&body).unwrap()["counts"].clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// POST JSON; the status and the body (error answers included).
pub fn post(url: &str, body: &Value) -> (u16, Value) {
    let r = ureq::post(url)
        .set("Content-Type", "application/json")
        .send_string(&body.to_string());
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST {url}: {e}"),
    };
    let status = resp.status();
    let text = resp.into_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn post_raw(url: &str, body: &str) -> (u16, Option<String>, Value) {
    post_with(url, body, &[("Content-Type", "application/json")])
}

/// POST `body` with these headers; the status, Retry-After and the body.
fn post_with(url: &str, body: &str, headers: &[(&str, &str)]) -> (u16, Option<String>, Value) {
    let mut req = ureq::post(url);
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let resp = match req.send_string(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST {url}: {e}"),
    };
    let status = resp.status();
    let retry = resp.header("Retry-After").map(str::to_string);
    let text = resp.into_string().unwrap();
    (
        status,
        retry,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

pub fn get(url: &str) -> (u16, String) {
    match ureq::get(url).call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(s, r)) => (s, r.into_string().unwrap()),
        Err(e) => panic!("GET {url}: {e}"),
    }
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// The parity texts and `ragline embed`'s vectors of them.
fn embedded_by_ragline_embed(dir: &Path) -> (Vec<String>, Vec<Vec<f32>>) {
    let input = root().join("tests/fixtures/parity/texts.jsonl");
    let texts: Vec<String> = read_jsonl(&input)
        .iter()
        .map(|v| v["text"].as_str().unwrap().to_string())
        .collect();
    let out = dir.join("embed.jsonl");
    let o = run(ragline()
        .args(["embed", "--device", "cpu", "--input"])
        .arg(&input)
        .arg("--output")
        .arg(&out));
    assert!(o.status.success());
    let vectors = read_jsonl(&out)
        .iter()
        .map(|v| floats(&v["vector"]))
        .collect();
    (texts, vectors)
}

fn assert_parity(name: &str, got: &[Vec<f32>], want: &[Vec<f32>]) {
    assert_eq!(got.len(), want.len(), "{name}: one vector per text");
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| {
            assert_eq!(g.len(), w.len(), "{name}: dimension");
            cosine(g, w)
        })
        .fold(1.0f32, f32::min);
    eprintln!("{name}: lowest cosine to `ragline embed` {worst:.6}");
    assert!(worst >= 0.9999, "{name}: lowest cosine {worst}");
}

/// The 230 parity texts through /v1/embeddings (float and base64), /embed and the `openai`
/// Python client: the vectors `ragline embed` computes.
#[test]
fn serve_answers_with_the_vectors_ragline_embed_computes() {
    let dir = tempfile::tempdir().unwrap();
    let (texts, want) = embedded_by_ragline_embed(dir.path());
    assert_eq!(texts.len(), 230);
    let server = Server::start(&model_dir(), &[], dir.path(), "serve");

    let mut openai = Vec::new();
    let mut base64 = Vec::new();
    let mut tei = Vec::new();
    for batch in texts.chunks(64) {
        let (status, body) = post(
            &format!("{}/v1/embeddings", server.url),
            &json!({"input": batch, "model": "all-MiniLM-L6-v2"}),
        );
        assert_eq!(status, 200, "{body}");
        let data = body["data"].as_array().unwrap();
        for (i, item) in data.iter().enumerate() {
            assert_eq!(item["index"], i);
            openai.push(floats(&item["embedding"]));
        }
        assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
        let (status, body) = post(
            &format!("{}/v1/embeddings", server.url),
            &json!({"input": batch, "model": "m", "encoding_format": "base64"}),
        );
        assert_eq!(status, 200, "{body}");
        for item in body["data"].as_array().unwrap() {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(item["embedding"].as_str().unwrap())
                .unwrap();
            base64.push(
                bytes
                    .chunks(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
            );
        }
        let (status, body) = post(&format!("{}/embed", server.url), &json!({"inputs": batch}));
        assert_eq!(status, 200, "{body}");
        tei.extend(body.as_array().unwrap().iter().map(floats));
    }
    assert_parity("/v1/embeddings", &openai, &want);
    assert_parity("/v1/embeddings base64", &base64, &want);
    assert_parity("/embed", &tei, &want);

    // The official client, from PyPI.
    let texts_file = dir.path().join("texts.json");
    fs::write(&texts_file, serde_json::to_vec(&texts).unwrap()).unwrap();
    let o = run(Command::new(data_python()).args([
        "-c",
        "import json, sys\n\
         from openai import OpenAI\n\
         c = OpenAI(base_url=sys.argv[1] + '/v1', api_key='unused')\n\
         texts = json.load(open(sys.argv[2]))\n\
         out = []\n\
         for i in range(0, len(texts), 50):\n\
         \x20   r = c.embeddings.create(model='all-MiniLM-L6-v2', input=texts[i:i + 50])\n\
         \x20   out += [d.embedding for d in r.data]\n\
         print(json.dumps(out))\n",
        &server.url,
        texts_file.to_str().unwrap(),
    ]));
    assert!(o.status.success(), "the openai client failed");
    let by_client: Vec<Vec<f32>> = serde_json::from_slice::<Vec<Vec<f32>>>(&o.stdout).unwrap();
    assert_parity("openai client", &by_client, &want);
    assert_eq!(
        server.metric("ragline_inputs_total"),
        (230 * 3 + 230) as f64
    );
}

/// Bad requests get a 400 that says what is wrong; long inputs 413 when refused; a full
/// queue 503 with Retry-After (never a crash, never unbounded memory); SIGTERM answers what
/// is in flight before the process exits.
#[test]
fn serve_refuses_what_it_cannot_do_and_stops_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 64, 3);
    let mut server = Server::start(
        &model,
        &["--long-inputs", "refuse", "--max-queued-tokens", "64"],
        dir.path(),
        "serve",
    );
    let url = &server.url;
    let openai = format!("{url}/v1/embeddings");
    for (body, status, says) in [
        ("{not json", 400, "not valid"),
        (r#"{"input": 3}"#, 400, "string or a list of strings"),
        (r#"{"input": []}"#, 400, "empty list"),
        (r#"{"input": [[101, 102]]}"#, 400, "token-id inputs"),
        (
            r#"{"input": "x", "dimensions": 65}"#,
            400,
            "ask for 1 to 64",
        ),
        (
            r#"{"input": "x", "prompt_name": "nope"}"#,
            400,
            "is not one of the model's prompts",
        ),
        (
            r#"{"input": "x", "encoding_format": "int8"}"#,
            400,
            "encoding_format",
        ),
    ] {
        let (got, _, answer) = post_raw(&openai, body);
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(got, status, "{body}: {answer}");
        assert!(message.contains(says), "{body}: {message}");
    }
    let long = "word ".repeat(2000);
    let (got, _, answer) = post_raw(&openai, &json!({"input": ["ok", long]}).to_string());
    assert_eq!(got, 413, "{answer}");
    assert!(answer["error"]["message"]
        .as_str()
        .unwrap()
        .contains("input 1 has"));
    // `dimensions` cuts and re-normalises (OpenAI's field and TEI's), equal to the full
    // vector's first values, scaled.
    let (got, _, full) = post_raw(&openai, r#"{"input": "a short text"}"#);
    assert_eq!(got, 200, "{full}");
    let full: Vec<f64> = serde_json::from_value(full["data"][0]["embedding"].clone()).unwrap();
    for (endpoint, body) in [
        (
            openai.clone(),
            r#"{"input": "a short text", "dimensions": 8}"#,
        ),
        (
            format!("{url}/embed"),
            r#"{"inputs": "a short text", "dimensions": 8}"#,
        ),
    ] {
        let (got, _, answer) = post_raw(&endpoint, body);
        assert_eq!(got, 200, "{answer}");
        let v = if answer.is_array() {
            &answer[0]
        } else {
            &answer["data"][0]["embedding"]
        };
        let v: Vec<f64> = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(v.len(), 8, "{endpoint}");
        let norm = full[..8].iter().map(|x| x * x).sum::<f64>().sqrt();
        for (a, b) in v.iter().zip(&full[..8]) {
            assert!((a - b / norm).abs() < 1e-5, "{endpoint}: {v:?} vs {full:?}");
        }
    }
    // TEI's per-request `truncate` wins over the server's policy.
    let (got, _, answer) = post_raw(
        &format!("{url}/embed"),
        &json!({"inputs": [long], "truncate": true}).to_string(),
    );
    assert_eq!(got, 200, "{answer}");
    assert_eq!(answer[0].as_array().unwrap().len(), 64);
    let (status, health) = get(&format!("{url}/health"));
    assert_eq!(status, 200);
    assert!(health.contains("\"status\":\"ok\""), "{health}");

    // Many clients at once on a queue of 64 tokens: some are told to come back, the others
    // are answered in full.
    let batch: Vec<String> = (0..200)
        .map(|i| format!("text number {i} of a batch"))
        .collect();
    let answers: Vec<(u16, Option<String>, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|_| {
                let body = json!({"input": batch}).to_string();
                let openai = &openai;
                s.spawn(move || post_raw(openai, &body))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let overloaded = answers.iter().filter(|a| a.0 == 503).count();
    assert!(
        overloaded > 0,
        "no request was refused with a queue of 64 tokens"
    );
    for (status, retry, body) in &answers {
        match status {
            503 => assert_eq!(retry.as_deref(), Some("1"), "{body}"),
            200 => assert_eq!(body["data"].as_array().unwrap().len(), 200),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(server.metric("ragline_errors_total{kind=\"overloaded\"}") >= overloaded as f64);

    // SIGTERM while a large request is in flight: it is answered, then the process exits 0.
    let big: Vec<String> = (0..2000)
        .map(|i| format!("sentence {i} to embed"))
        .collect();
    let in_flight = std::thread::spawn({
        let openai = openai.clone();
        move || post_raw(&openai, &json!({"input": big}).to_string())
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.metric("ragline_in_flight_requests") < 1.0 {
        assert!(Instant::now() < deadline, "the request never arrived");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(server.terminate(), Some(0), "{}", server.log());
    let (status, _, body) = in_flight.join().unwrap();
    assert_eq!(
        status, 200,
        "the request in flight was not answered: {body}"
    );
    assert_eq!(body["data"].as_array().unwrap().len(), 2000);
}

/// An ingest with the embedder pointed at `url`, as a report.
fn remote_ingest(
    corpus: &Path,
    index: &TestIndex,
    model: &Path,
    url: &str,
    report: &Path,
) -> (Option<i32>, Value) {
    let o = run(ragline()
        .args(["ingest", "--progress", "none", "--model"])
        .arg(model)
        .args([
            "--index",
            &index.uri(),
            "--embed-url",
            url,
            "--embed-model",
            "m",
        ])
        .arg("--report")
        .arg(report)
        .arg(corpus));
    let r = serde_json::from_slice(&fs::read(report).unwrap_or_default()).unwrap_or(Value::Null);
    (o.status.code(), r)
}

fn local_ingest(corpus: &Path, index: &TestIndex, model: &Path, report: &Path) -> Value {
    let o = run(ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(model)
        .args(["--index", &index.uri(), "--report"])
        .arg(report)
        .arg(corpus));
    assert!(o.status.success());
    serde_json::from_slice(&fs::read(report).unwrap()).unwrap()
}

/// react-docs with the remote embedder pointed at `ragline serve`, directly and through the
/// fault proxy (20% 429 with Retry-After 1 s, 5% 500, 2% resets, 1% malformed JSON): the
/// index equals the in-process run's, counts exact, the retries in the report.
#[test]
fn ingest_through_serve_equals_an_in_process_ingest_even_through_faults() {
    let dir = tempfile::tempdir().unwrap();
    let Some(corpus) = react_slice(dir.path(), 225) else {
        return;
    };
    let model = random_model(dir.path(), 64, 11);
    let want = TestIndex::Sqlite(dir.path().join("local.db"));
    let local = local_ingest(&corpus, &want, &model, &dir.path().join("local.json"));
    let server = Server::start(&model, &[], dir.path(), "serve");

    let direct = TestIndex::Sqlite(dir.path().join("direct.db"));
    let (code, report) = remote_ingest(
        &corpus,
        &direct,
        &model,
        &server.url,
        &dir.path().join("direct.json"),
    );
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["counts"], local["counts"]);
    assert_same_index(&direct, &want);

    let proxy = Proxy::start(
        &server.url,
        &[
            "--rate-429",
            "0.2",
            "--retry-after",
            "1",
            "--rate-500",
            "0.05",
            "--rate-reset",
            "0.02",
            "--rate-malformed",
            "0.01",
            "--seed",
            "7",
        ],
    );
    let faulty = TestIndex::Sqlite(dir.path().join("faulty.db"));
    let (code, report) = remote_ingest(
        &corpus,
        &faulty,
        &model,
        &proxy.url,
        &dir.path().join("faulty.json"),
    );
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(
        report["counts"], local["counts"],
        "counts exact through faults"
    );
    assert_same_index(&faulty, &want);
    let faults = proxy.counts();
    eprintln!("proxy: {faults}\nragline: {}", report["remote"]);
    let remote = &report["remote"];
    for kind in ["429", "500"] {
        assert!(
            faults[kind].as_u64().unwrap_or(0) > 0,
            "no {kind} was injected: {faults}"
        );
    }
    assert_eq!(remote["throttled"], faults["429"], "every 429 counted");
    let injected: u64 = ["429", "500", "reset", "malformed"]
        .iter()
        .map(|k| faults[*k].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        remote["retries"].as_u64().unwrap(),
        injected,
        "one retry per injected fault"
    );
}

/// One input the service refuses (the proxy answers 400 for the request holding it): the
/// batch is bisected, so exactly that chunk fails; its document goes dead after its retries
/// while every other chunk gets its vector; a requeue after the proxy stops refusing it
/// completes it.
#[test]
fn a_poisoned_input_fails_alone_and_a_requeue_completes_it() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c");
    fs::create_dir_all(&corpus).unwrap();
    for i in 0..8 {
        let mut text = format!("# Page {i}\n\n");
        for j in 0..8 {
            let marker = if (i, j) == (5, 3) { " POISONPILL" } else { "" };
            text.push_str(&format!(
                "## Part {j}\n\nParagraph {j} of page {i}{marker}, with a few words.\n\n"
            ));
        }
        fs::write(corpus.join(format!("p{i}.md")), text).unwrap();
    }
    let model = random_model(dir.path(), 64, 5);
    let server = Server::start(&model, &[], dir.path(), "serve");
    let proxy = Proxy::start(&server.url, &["--poison", "POISONPILL"]);
    let config = dir.path().join("ragline.toml");
    fs::write(
        &config,
        "[stages.embed]\nretry_limit = 3\nbackoff = \"100ms\"\nmax_backoff = \"200ms\"\n",
    )
    .unwrap();
    let index = TestIndex::Sqlite(dir.path().join("p.db"));
    let uri = index.uri();
    let o = run(ragline()
        .arg("--config")
        .arg(&config)
        .args([
            "ingest",
            "--progress",
            "none",
            "--chunk-tokens",
            "16",
            "--chunk-overlap",
            "2",
        ])
        .args(["--defer", "embed", "--index", &uri, "--model"])
        .arg(&model)
        .args(["--embed-url", &proxy.url, "--embed-model", "m"])
        .arg(&corpus));
    assert!(o.status.success());
    let (_, chunks, _) = index.counts();
    assert!(chunks >= 32, "{chunks} chunks");
    // The index records the service; enrich never calls it (nor sends it a key) on the
    // index's word alone.
    let asked = |c: &Value| -> u64 {
        c.as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
    };
    let before = asked(&proxy.counts());
    let o = run(ragline()
        .args(["enrich", "--progress", "none", "--index", &uri])
        .env("OPENAI_API_KEY", "sk-should-never-travel"));
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("give --embed-url"), "{err}");
    assert_eq!(
        asked(&proxy.counts()),
        before,
        "a request reached the service"
    );
    let enrich = |url: &str| {
        run(ragline()
            .arg("--config")
            .arg(&config)
            .args(["enrich", "--progress", "none", "--index", &uri, "--model"])
            .arg(&model)
            .args(["--embed-url", url, "--embed-model", "m", "--report"])
            .arg(dir.path().join("enrich.json")))
    };
    let o = enrich(&proxy.url);
    assert_eq!(o.status.code(), Some(1), "one document failed");
    let report: Value =
        serde_json::from_slice(&fs::read(dir.path().join("enrich.json")).unwrap()).unwrap();
    assert_eq!(report["counts"]["failed"], 1, "{report}");
    assert_eq!(report["failures"][0]["id"], "p5.md");
    // Every chunk but the poisoned one has its vector.
    let with_vectors = index.vectors().len() as u64;
    assert_eq!(with_vectors, chunks - 1);
    let poisoned: Vec<String> = index
        .chunks()
        .into_iter()
        .filter(|c| c.2.contains("POISONPILL"))
        .map(|c| c.1)
        .collect();
    assert_eq!(poisoned.len(), 1);
    let embedded: HashSet<String> = index.vectors().into_iter().map(|v| v.1).collect();
    assert!(!embedded.contains(&poisoned[0]));
    // Dead after its retries, with the service's message.
    let o = run(ragline().args(["dlq", "list", "--json", "--index", &uri]));
    let dead: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(dead.as_array().unwrap().len(), 1, "{dead}");
    assert_eq!(dead[0]["document_id"], "p5.md");
    assert_eq!(dead[0]["attempts"], 3);
    assert!(
        dead[0]["last_error"].as_str().unwrap().contains("HTTP 400"),
        "{dead}"
    );
    assert!(proxy.counts()["400"].as_u64().unwrap() >= 3);

    proxy.set(json!({"poison": null}));
    let o = run(ragline().args(["dlq", "requeue", "--all", "--index", &uri]));
    assert!(o.status.success());
    let o = enrich(&proxy.url);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(index.vectors().len() as u64, chunks);
    let o = run(ragline().args(["dlq", "list", "--json", "--index", &uri]));
    assert_eq!(
        serde_json::from_slice::<Value>(&o.stdout).unwrap(),
        json!([])
    );
}

/// The embeddings endpoint down for 30 s in the middle of an ingest: the circuit opens,
/// `ragline status` says so, and the run completes once the endpoint is back, nothing lost.
#[test]
fn an_outage_opens_the_circuit_and_the_run_completes_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let Some(corpus) = react_slice(dir.path(), 120) else {
        return;
    };
    let model = random_model(dir.path(), 64, 11);
    let want = TestIndex::Sqlite(dir.path().join("local.db"));
    let local = local_ingest(&corpus, &want, &model, &dir.path().join("local.json"));
    let server = Server::start(&model, &["--max-wait-ms", "1"], dir.path(), "serve");
    // Slow answers, so the run is still going when the outage starts.
    let proxy = Proxy::start(
        &server.url,
        &["--rate-slow", "1.0", "--slow-seconds", "0.3"],
    );
    let index = TestIndex::Sqlite(dir.path().join("out.db"));
    let report = dir.path().join("out.json");
    let mut ingest = ragline()
        .args(["ingest", "--progress", "none", "--model"])
        .arg(&model)
        .args([
            "--index",
            &index.uri(),
            "--embed-url",
            &proxy.url,
            "--embed-model",
            "m",
        ])
        .args(["--report"])
        .arg(&report)
        .arg(&corpus)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Down once the first vectors are in.
    let deadline = Instant::now() + Duration::from_secs(120);
    while server.metric("ragline_inputs_total") < 100.0 {
        assert!(
            Instant::now() < deadline,
            "the ingest never reached the server"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    proxy.set(json!({"down": true}));
    let down_at = Instant::now();
    let status = |uri: &str| -> Value {
        let o = run(ragline().args(["status", "--json", "--index", uri]));
        serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
    };
    let mut said = Value::Null;
    while down_at.elapsed() < Duration::from_secs(30) {
        let s = status(&index.uri());
        if s["stages"]["embed"]["circuit"].is_object() {
            said = s["stages"]["embed"]["circuit"].clone();
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        said["reason"].as_str().unwrap_or("").contains("503"),
        "status never said the circuit was open: {said}"
    );
    assert!(
        ingest.try_wait().unwrap().is_none(),
        "the run ended during the outage"
    );
    proxy.set(json!({"down": false}));
    let out = ingest.wait_with_output().unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    let got: Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(got["counts"], local["counts"]);
    assert!(got["remote"]["circuit_opened"].as_u64().unwrap() >= 1);
    assert_same_index(&index, &want);
    // Closed again: status no longer says it is open.
    assert!(status(&index.uri())["stages"]["embed"]["circuit"].is_null());
}

/// `enrich --follow --metrics-addr`: Prometheus sees the queue drain, the dead letters (none),
/// and the calls to the embeddings service; new documents are picked up while it follows.
#[test]
fn enrich_follow_exposes_its_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c");
    fs::create_dir_all(&corpus).unwrap();
    for i in 0..6 {
        fs::write(
            corpus.join(format!("p{i}.md")),
            format!("# Page {i}\n\nSome words about page {i}.\n"),
        )
        .unwrap();
    }
    let model = random_model(dir.path(), 64, 9);
    let server = Server::start(&model, &[], dir.path(), "serve");
    let index = TestIndex::Sqlite(dir.path().join("m.db"));
    let uri = index.uri();
    let ingest = || {
        let o = run(ragline()
            .args([
                "ingest",
                "--progress",
                "none",
                "--defer",
                "embed",
                "--model",
            ])
            .arg(&model)
            .args([
                "--index",
                &uri,
                "--embed-url",
                &server.url,
                "--embed-model",
                "m",
            ])
            .arg(&corpus));
        assert!(o.status.success());
    };
    ingest();
    // The service is named (the index's record of it is never taken on its word alone).
    let mut enrich = ragline()
        .args(["enrich", "--follow", "--progress", "none", "--index", &uri])
        .args(["--embed-url", &server.url, "--embed-model", "m"])
        .args(["--metrics-addr", "127.0.0.1:0", "--model"])
        .arg(&model)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut err = BufReader::new(enrich.stderr.take().unwrap());
    while !line.contains("metrics on ") {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "enrich said no address"
        );
    }
    let url = line.trim().rsplit(' ').next().unwrap().to_string();
    let value = |text: &str, series: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(-1.0)
    };
    let wait_done = |n: f64| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = get(&url).1;
            if value(
                &text,
                "ragline_stage_documents{stage=\"embed\",status=\"done\"}",
            ) == n
            {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "embed never reached {n} done:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let text = wait_done(6.0);
    assert_eq!(
        value(
            &text,
            "ragline_stage_documents{stage=\"embed\",status=\"dead\"}"
        ),
        0.0
    );
    assert!(
        value(
            &text,
            "ragline_service_calls_total{stage=\"embed\",kind=\"request\"}"
        ) >= 1.0
    );
    assert_eq!(value(&text, "ragline_index_up"), 1.0);
    // A new document while it follows.
    fs::write(corpus.join("p6.md"), "# Page 6\n\nA late page.\n").unwrap();
    ingest();
    wait_done(7.0);
    // What this process did (its counters follow its progress ticks).
    let deadline = Instant::now() + Duration::from_secs(10);
    while value(
        &get(&url).1,
        "ragline_enrich_documents_total{outcome=\"done\"}",
    ) != 7.0
    {
        assert!(Instant::now() < deadline, "{}", get(&url).1);
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = enrich.kill();
    let _ = enrich.wait();
}

/// A raw HTTP/1.1 exchange: write `request`, then read whatever comes back until the server
/// closes or `wait` passes.
fn raw_exchange(url: &str, request: &[u8], wait: Duration) -> String {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// A tokenizer that panics and a model thread that panics fail their request only (500 with
/// the reason), and the server goes on; 8 clients at once each sending a 16 MiB body of
/// four million inputs are answered without the server's memory growing past 1 GB; a body
/// that is not JSON is a 415; a body that arrives too slowly is a 408; a client that hangs
/// up mid-request leaves no request counted in flight.
#[cfg(feature = "failpoints")]
#[test]
fn serve_survives_hostile_clients_and_its_own_panics() {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 64, 3);
    let mut server = Server::start_with_env(
        &model,
        &["--request-timeout", "3"],
        &[("FAILPOINTS", "serve-tokenize=1*panic;serve-model=1*panic")],
        dir.path(),
        "serve",
    );
    let openai = format!("{}/v1/embeddings", server.url);
    let body = json!({"input": ["a sentence", "another"]}).to_string();
    // The tokenizer panics once, then the model thread once; then all is well.
    let (status, _, answer) = post_raw(&openai, &body);
    assert_eq!(status, 500, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tokenizer failed"),
        "{answer}"
    );
    let (status, _, answer) = post_raw(&openai, &body);
    assert_eq!(status, 500, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("model failed"),
        "{answer}"
    );
    let (status, _, answer) = post_raw(&openai, &body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["data"].as_array().unwrap().len(), 2);
    let (status, health) = get(&format!("{}/health", server.url));
    assert_eq!(status, 200, "{health}");

    eprintln!(
        "PEAK RSS of serve before the large bodies: {} MB",
        server.peak_rss_mb()
    );
    // 16 MiB of ["a","a",...] from 8 clients at once.
    let huge = format!("{{\"input\": [{}\"a\"]}}", "\"a\",".repeat(4_190_000));
    assert!(huge.len() < 16 << 20);
    let answers: Vec<(u16, Option<String>, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| post_raw(&openai, &huge)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (status, _, body) in &answers {
        assert!(
            [400, 408, 503].contains(status),
            "every request is answered: {status} {body}"
        );
    }
    let peak = server.peak_rss_mb();
    eprintln!("PEAK RSS of serve under 8 x 16 MiB bodies: {peak} MB");
    assert!(peak > 0 && peak < 1024, "peak RSS {peak} MB");
    assert!(server.alive());

    // Not JSON: a form a web page could post without asking.
    let (status, _, answer) = post_with(&openai, &body, &[("Content-Type", "text/plain")]);
    assert_eq!(status, 415, "{answer}");

    // A body that never arrives: 408 once the request's time is up.
    let slow =
        "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{\"input\":";
    let answer = raw_exchange(&server.url, slow.as_bytes(), Duration::from_secs(20));
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    assert_eq!(server.terminate(), Some(0), "{}", server.log());

    // A client that hangs up while its request is being answered (the model is slowed, so
    // the request is surely in flight when it does); while it is, the one request allowed is
    // taken, and another is told to come back.
    let server = Server::start_with_env(
        &model,
        &["--max-concurrent-requests", "1"],
        &[("FAILPOINTS", "serve-model=sleep(3000)")],
        dir.path(),
        "slow",
    );
    let request = json!({ "input": ["one", "two"] }).to_string();
    {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(server.url.trim_start_matches("http://")).unwrap();
        write!(
            s,
            "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{request}",
            request.len()
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.metric("ragline_in_flight_requests") < 1.0 {
            assert!(Instant::now() < deadline, "the request never arrived");
            std::thread::sleep(Duration::from_millis(5));
        }
        let (status, retry, answer) = post_raw(&format!("{}/v1/embeddings", server.url), &body);
        assert_eq!(status, 503, "{answer}");
        assert_eq!(retry.as_deref(), Some("1"));
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("--max-concurrent-requests"),
            "{answer}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.metric("ragline_in_flight_requests") > 0.0 {
        assert!(
            Instant::now() < deadline,
            "a request whose client left is still counted in flight"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// With --api-key-env every route but /health needs the key; with --cors-origin that origin's
/// pages (and only those) may call it; without it, no page may.
#[test]
fn serve_with_a_key_and_an_origin() {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(dir.path(), 64, 3);
    let o = run(ragline()
        .args(["serve", "--port", "0", "--device", "cpu", "--model"])
        .arg(&model)
        .args(["--api-key-env", "RAGLINE_TEST_NO_SUCH_VARIABLE"]));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("RAGLINE_TEST_NO_SUCH_VARIABLE"));

    let server = Server::start_with_env(
        &model,
        &[
            "--api-key-env",
            "RAGLINE_TEST_SERVE_KEY",
            "--cors-origin",
            "https://app.example.com",
        ],
        &[("RAGLINE_TEST_SERVE_KEY", "k3y-k3y")],
        dir.path(),
        "keyed",
    );
    let openai = format!("{}/v1/embeddings", server.url);
    let body = json!({"input": "hello"}).to_string();
    let json_ct = ("Content-Type", "application/json");
    for (auth, want) in [
        (None, 401),
        (Some("Bearer nope"), 401),
        (Some("k3y-k3y"), 401),
        (Some("Bearer k3y-k3y"), 200),
    ] {
        let mut headers = vec![json_ct];
        if let Some(a) = auth {
            headers.push(("Authorization", a));
        }
        let (status, _, answer) = post_with(&openai, &body, &headers);
        assert_eq!(status, want, "{auth:?}: {answer}");
        assert!(!answer.to_string().contains("k3y-k3y"));
    }
    assert_eq!(get(&format!("{}/health", server.url)).0, 200);
    assert_eq!(get(&format!("{}/metrics", server.url)).0, 401);
    // The origin's preflight is answered; another origin's is not allowed.
    let preflight = |origin: &str| {
        raw_exchange(
            &server.url,
            format!(
                "OPTIONS /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: {origin}\r\n\
                 Access-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: authorization, content-type\r\n\
                 Connection: close\r\n\r\n"
            )
            .as_bytes(),
            Duration::from_secs(10),
        )
        .to_ascii_lowercase()
    };
    let ok = preflight("https://app.example.com");
    assert!(
        ok.contains("access-control-allow-origin: https://app.example.com"),
        "{ok}"
    );
    let other = preflight("https://evil.example");
    assert!(!other.contains("access-control-allow-origin"), "{other}");

    // The first server had no --cors-origin: a page's call gets no permission.
    let plain = Server::start(&model, &[], dir.path(), "plain");
    let answer = raw_exchange(
        &plain.url,
        b"OPTIONS /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://app.example.com\r\n\
          Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n",
        Duration::from_secs(10),
    );
    assert!(
        !answer
            .to_ascii_lowercase()
            .contains("access-control-allow-origin"),
        "{answer}"
    );
}
