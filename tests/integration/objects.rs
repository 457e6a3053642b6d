//! Object stores as a source, against a real S3 server: moto's, started by `scripts/s3.sh`
//! (`RAGLINE_TEST_S3` is its endpoint; `RAGLINE_REQUIRE_S3=1` makes its absence a failure).
//! A first run indexes every object under the prefix; a second with nothing changed downloads
//! and embeds nothing; one object changed, one added, one deleted: exactly those are
//! downloaded, re-embedded, added and (with `--prune`) removed. Bad objects fail or drop alone,
//! with their URLs.

use std::path::Path;

use bytes::Bytes;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::{path::Path as Key, ObjectStore, PutPayload};
use serde_json::{json, Value};

use crate::util::{model_dir, ragline, run};

fn s3_endpoint() -> Option<String> {
    match std::env::var("RAGLINE_TEST_S3") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("RAGLINE_REQUIRE_S3").as_deref() != Ok("1"),
                "RAGLINE_TEST_S3 is not set and RAGLINE_REQUIRE_S3=1: run \
                 `export RAGLINE_TEST_S3=$(scripts/s3.sh start)`"
            );
            eprintln!(
                "SKIPPED (s3): RAGLINE_TEST_S3 is not set; run \
                 `export RAGLINE_TEST_S3=$(scripts/s3.sh start)` to include object stores"
            );
            None
        }
    }
}

/// A bucket of the test server, written by the test.
struct Bucket {
    endpoint: String,
    name: String,
    store: AmazonS3,
    rt: tokio::runtime::Runtime,
}

impl Bucket {
    /// A new, empty bucket `NAME-PID` (moto keeps buckets in memory; names are global).
    fn create(endpoint: &str, name: &str) -> Bucket {
        let name = format!("{name}-{}", std::process::id());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // moto takes an unsigned CreateBucket.
        rt.block_on(async {
            let r = reqwest::Client::new()
                .put(format!("{endpoint}/{name}"))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "create bucket: {}", r.status());
        });
        let store = AmazonS3Builder::new()
            .with_endpoint(endpoint)
            .with_allow_http(true)
            .with_bucket_name(&name)
            .with_region("us-east-1")
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .build()
            .unwrap();
        Bucket {
            endpoint: endpoint.to_string(),
            name,
            store,
            rt,
        }
    }

    fn put(&self, key: &str, body: &[u8]) {
        let payload = PutPayload::from(Bytes::copy_from_slice(body));
        self.rt
            .block_on(self.store.put(&Key::from(key), payload))
            .unwrap();
    }

    fn delete(&self, key: &str) {
        self.rt
            .block_on(self.store.delete(&Key::from(key)))
            .unwrap();
    }

    /// The source URL of `prefix`.
    fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}?endpoint={}", self.name, self.endpoint)
    }

    /// `ragline ingest` of `prefix` into `index`: the exit code and the report.
    fn ingest(
        &self,
        prefix: &str,
        index: &str,
        report: &Path,
        extra: &[&str],
    ) -> (Option<i32>, Value) {
        let _ = std::fs::remove_file(report);
        let o = run(ingest_command(index)
            .arg("--report")
            .arg(report)
            .args(extra)
            .arg(self.url(prefix)));
        let r = std::fs::read(report)
            .ok()
            .filter(|b| !b.is_empty())
            .map_or(Value::Null, |b| serde_json::from_slice(&b).unwrap());
        (o.status.code(), r)
    }
}

/// `ragline ingest` into `index` with moto's credentials in the environment (and no profile
/// or endpoint of the caller's to find).
fn ingest_command(index: &str) -> std::process::Command {
    let mut cmd = ragline();
    cmd.env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_ENDPOINT_URL")
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(model_dir())
        .arg("--index")
        .arg(index);
    cmd
}

/// (document id, chunk texts joined) of every document the SQLite index `db` holds, by id.
pub fn documents(db: &Path) -> Vec<(String, String)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut s = conn
        .prepare(
            "SELECT d.id, group_concat(c.text, ' | ') FROM documents d
             JOIN chunks c ON c.document_id = d.id GROUP BY d.id ORDER BY d.id",
        )
        .unwrap();
    s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn a_bucket_is_indexed_incrementally_by_etag() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let bucket = Bucket::create(&endpoint, "reruns");
    bucket.put(
        "docs/hooks.md",
        b"# Hooks\n\nHooks let you use state without writing a class.\n",
    );
    bucket.put(
        "docs/guide/routing.html",
        b"<html><head><title>Routing</title></head><body><h1>Routing</h1>\
          <p>A router maps URLs to pages.</p></body></html>",
    );
    bucket.put(
        "docs/effects.txt",
        b"Effects synchronise a component with an outside system.",
    );
    bucket.put(
        "docs/logo.png",
        b"\x89PNG not taken: not a document extension",
    );
    bucket.put(
        "elsewhere/outside.md",
        b"# Outside\n\nNot under the prefix.",
    );

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("index.db");
    let uri = format!("sqlite://{}", db.display());
    let report = dir.path().join("report.json");
    let name = &bucket.name;
    let id = |key: &str| format!("s3://{name}/docs/{key}");

    // First run: the three documents under the prefix, each downloaded once.
    let (code, first) = bucket.ingest("docs/", &uri, &report, &[]);
    assert_eq!(code, Some(0), "{first}");
    let c = &first["counts"];
    assert_eq!(
        (&c["published"], &c["indexed"], &first["chunks_embedded"]),
        (&json!(3), &json!(3), &json!(3)),
        "{first}"
    );
    assert_eq!(first["fetched"]["items"], 3, "{first}");
    let ids: Vec<String> = documents(&db).into_iter().map(|d| d.0).collect();
    assert_eq!(
        ids,
        [id("effects.txt"), id("guide/routing.html"), id("hooks.md")]
    );
    // HTML was extracted (no tags), by the object's extension.
    let routing = &documents(&db)[1].1;
    assert!(
        routing.contains("A router maps URLs to pages.") && !routing.contains("<p>"),
        "{routing}"
    );

    // Nothing changed: the listing's ETags say so; nothing downloaded, chunked or embedded.
    let (_, second) = bucket.ingest("docs/", &uri, &report, &[]);
    assert_eq!(second["counts"]["unchanged"], 3, "{second}");
    assert_eq!(
        second["fetched"],
        json!({"items": 0, "bytes": 0}),
        "{second}"
    );
    assert_eq!(second["counts"]["children_created"], 0);
    assert_eq!(second["chunks_embedded"], 0);

    // One object changed, one added, one deleted.
    bucket.put(
        "docs/hooks.md",
        b"# Hooks\n\nHooks let function components hold state.\n",
    );
    bucket.put(
        "docs/context.md",
        b"# Context\n\nContext passes data deep down the tree.\n",
    );
    bucket.delete("docs/effects.txt");
    let (_, third) = bucket.ingest("docs/", &uri, &report, &["--prune"]);
    let c = &third["counts"];
    assert_eq!(
        (&c["indexed"], &c["unchanged"], &third["chunks_embedded"]),
        (&json!(3), &json!(1), &json!(2)),
        "{third}"
    );
    assert_eq!(third["fetched"]["items"], 2, "{third}");
    assert_eq!(third["pruned"], 1);
    let docs = documents(&db);
    let ids: Vec<&str> = docs.iter().map(|d| d.0.as_str()).collect();
    assert_eq!(
        ids,
        [id("context.md"), id("guide/routing.html"), id("hooks.md")]
    );
    assert!(docs[2].1.contains("function components hold state"));

    // Search finds objects, with their URL and ETag as metadata.
    let o = run(ragline()
        .args(["search", "which URL shows which page", "-k", "1", "--json"])
        .arg("--index")
        .arg(&uri));
    let hits: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(hits[0]["document_id"], id("guide/routing.html"));
    assert_eq!(hits[0]["metadata"]["url"], id("guide/routing.html"));
    assert!(hits[0]["metadata"]["etag"]
        .as_str()
        .is_some_and(|e| !e.is_empty()));
    assert_eq!(hits[0]["metadata"]["format"], "html");
}

#[test]
fn bad_objects_fail_or_drop_alone_and_a_missing_bucket_stops_the_run() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let bucket = Bucket::create(&endpoint, "bad");
    bucket.put("fine.md", b"# Fine\n\nA good document.\n");
    bucket.put("latin1.txt", b"caf\xe9 cr\xe8me");
    bucket.put("blank.md", b"  \n\n ");
    bucket.put("big.md", &vec![b'a'; 5000]);
    bucket.put(
        "lines.jsonl",
        b"{\"id\": \"one\", \"text\": \"The first line.\"}\nnot json\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("sqlite://{}", dir.path().join("bad.db").display());
    let report = dir.path().join("bad.json");
    let (code, r) = bucket.ingest("", &uri, &report, &["--max-file-bytes", "4096"]);
    // 1: documents failed; the run went on.
    assert_eq!(code, Some(1), "{r}");
    let c = &r["counts"];
    assert_eq!(
        (&c["indexed"], &c["failed"], &c["dropped"]),
        (&json!(2), &json!(3), &json!(1)),
        "{r}"
    );
    let url = |k: &str| format!("s3://{}/{k}", bucket.name);
    let reason = |id: &str| -> String {
        r["failures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"].as_str().is_some_and(|i| i.starts_with(id)))
            .unwrap_or_else(|| panic!("no failure for {id}: {r}"))["reason"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(reason(&url("latin1.txt")).contains("invalid UTF-8 at byte 3"));
    assert!(reason(&url("big.md")).contains("over --max-file-bytes=4096"));
    assert!(reason(&url("lines.jsonl")).contains("line 2"));
    assert_eq!(r["dropped"][0]["id"], url("blank.md"));
    // The object over the limit was never downloaded.
    assert_eq!(r["fetched"]["items"], 4, "{r}");

    // A bucket that does not exist: the listing fails, the run stops saying so.
    let o = run(ingest_command(&uri).arg(format!(
        "s3://no-such-bucket-{}/?endpoint={endpoint}",
        std::process::id()
    )));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("listing s3://no-such-bucket-"), "{err}");
}

/// PUT `body` at `key` exactly as written (no `..` resolved: a raw request; moto takes it
/// unsigned).
fn put_raw_key(endpoint: &str, bucket: &str, key: &str, body: &[u8]) {
    use std::io::{Read, Write};
    let addr = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "PUT /{bucket}/{key} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\
         Content-Type: text/markdown\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "PUT {key}: {answer}");
}

/// Anyone who may write to the bucket can name an object `docs/../x.md`: that object fails
/// alone, with the reason, and the listing goes on past it (it once stopped the source).
#[test]
fn an_object_key_the_client_cannot_address_fails_alone() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let bucket = Bucket::create(&endpoint, "keys");
    bucket.put("docs/a.md", b"# A\n\nThe first document.\n");
    put_raw_key(
        &endpoint,
        &bucket.name,
        "docs/../evil.md",
        b"# Evil\n\ntext\n",
    );
    put_raw_key(
        &endpoint,
        &bucket.name,
        "docs//double.md",
        b"# Double\n\ntext\n",
    );
    bucket.put("docs/z.md", b"# Z\n\nThe last document.\n");
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("sqlite://{}", dir.path().join("keys.db").display());
    let (code, r) = bucket.ingest("docs", &uri, &dir.path().join("keys.json"), &[]);
    assert_eq!(code, Some(1), "{r}");
    assert_eq!(r["counts"]["indexed"], json!(2), "{r}");
    assert_eq!(r["counts"]["failed"], json!(2), "{r}");
    let url = |k: &str| format!("s3://{}/{k}", bucket.name);
    for bad in ["docs/../evil.md", "docs//double.md"] {
        let f = r["failures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"] == url(bad))
            .unwrap_or_else(|| panic!("no failure for {bad}: {r}"));
        assert!(
            f["reason"].as_str().unwrap().contains("rename the object"),
            "{f}"
        );
    }
    let ids: Vec<String> = documents(&dir.path().join("keys.db"))
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, [url("docs/a.md"), url("docs/z.md")]);
}
